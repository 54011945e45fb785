"""Control flow: :func:`scan`, a loop over a named axis as one differentiable op.

``scan(body, init, xs, axis)`` calls the Python function ``body(carry, x_t) ->
(new_carry, y_t)`` once, on stand-in placeholders, and keeps the ops it built as a
:class:`ScanBody`: a subgraph over its own stand-ins (the carries, the slices of the
sequences at one index of ``axis``, and one placeholder per *closure*: each op the body
reads that does not depend on the stand-ins, such as a weight). The outer graph holds
one :class:`Scan` op whose args are the initial carries, the sequences and the closed-over
ops, so it stays a DAG; every engine reaches the body through the op's ``body``.

The op has three groups of outputs: the final carries, the stacked ``y_t`` (the scanned
axis first) and the stacked carries *entering* each step (the history its reverse
derivative reads). Its reverse derivative is a reverse scan over the history whose
body is the body's vector-Jacobian product; its forward derivative is a scan over
(carry, tangent of carry) whose body is the body's Jacobian-vector product. Both are
:class:`Scan` ops, so they can be differentiated again. Under ``remat="checkpoints"``
the reverse derivative reads no history: it stores the carries entering every
``ceil(sqrt(T))``-th step (a forward scan over segments) and rebuilds each segment's
history from its checkpoint inside a reverse scan over the segments.
"""

import math
from typing import Any, Callable, Union

import numpy as np

from geon.errors import ArgumentError, AxisMismatchError, SerializationError
from geon.op_graph.autodiff import deriv
from geon.op_graph.axes import Axes, Axis, FlattenedAxis
from geon.op_graph.core import (AssignableTensorOp, Constant, Placeholder, TensorOp,
                                VoidOp, _fmt, as_op, toposort)
from geon.op_graph.core_ops import AxesWithOrder, CastAxes, MultiOutput, Sum, cast_axes
from geon.op_graph.derivatives import direction_axes
from geon.op_graph.forward import propagate
from geon.op_graph.nn_ops import concat
from geon.op_graph.nodes import user_location
from geon.op_graph.params import clone_graph
from geon.op_graph.reductions import Dot
from geon.op_graph.reference import evaluate
from geon.op_graph.serialize import register_codec
from geon.op_graph.serialize_bodies import BODY_ATTRS, read_body, write_body
from geon.op_graph.symbols import is_symbolic
from geon.op_graph.shaping import flatten, slice_along_axis, unflatten
from geon.op_graph.tables import adjoint_rule, evaluator, forward_rule

__all__ = ["Scan", "ScanBody", "scan"]


class ScanBody:
    """The body of a :class:`Scan`: ``carries_out`` and ``ys_out`` (ops) computed from
    the stand-in placeholders ``carries_in``, ``xs_in`` (one index of each sequence) and
    ``closures_in`` (one per closed-over op). It reads nothing else but constants.

    Calling it on arrays (one per input, in that order) evaluates one step with the
    reference evaluator and returns the list of ``carries_out + ys_out`` values."""

    def __init__(self, carries_in, xs_in, closures_in, carries_out, ys_out):
        self.carries_in, self.xs_in = tuple(carries_in), tuple(xs_in)
        self.closures_in = tuple(closures_in)
        self.carries_out, self.ys_out = tuple(carries_out), tuple(ys_out)

    @property
    def inputs(self) -> tuple:
        """The stand-ins, in the order of the op's args."""
        return self.carries_in + self.xs_in + self.closures_in

    @property
    def results(self) -> tuple:
        """The ops of one step: the new carries, then the ``y_t``."""
        return self.carries_out + self.ys_out

    def __call__(self, *values):
        return evaluate(list(self.results), feeds=dict(zip(self.inputs, values)))

    def __repr__(self):
        return (f"<scan body: {len(self.carries_in)} carries, {len(self.xs_in)} "
                f"sequences, {len(self.closures_in)} closures, {len(self.ys_out)} outputs>")


_COUNTS = ("carries", "sequences", "closures")


def _write_scan_body(enc, body, where):
    """``{"carries", "sequences", "closures"}`` (how the stand-ins divide) and the
    body's nested graph (:func:`~geon.op_graph.serialize_bodies.write_body`)."""
    counts = (len(body.carries_in), len(body.xs_in), len(body.closures_in))
    return {**dict(zip(_COUNTS, counts)),
            **write_body(enc, body.inputs, body.results, where)}


def _read_scan_body(dec, data, where):
    inputs, results, (nc, nx, nk) = read_body(dec, data, where, _COUNTS)
    if nc + nx + nk != len(inputs):
        raise SerializationError(f"{where}: {nc} carries, {nx} sequences and {nk} "
                                 f"closures, but {len(inputs)} stand-ins")
    if len(results) < nc:
        raise SerializationError(f"{where}: {len(results)} results, fewer than the "
                                 f"{nc} carries")
    for k, (r, c) in enumerate(zip(results, inputs[:nc])):
        if r.axes.names != c.axes.names or r.axes.lengths != c.axes.lengths \
                or r.dtype != c.dtype:
            raise SerializationError(f"{where}: result {k} ({_fmt(r.axes)}) {r.dtype} is "
                                     f"not laid out as carry {k} ({_fmt(c.axes)}) {c.dtype}")
    return ScanBody(inputs[:nc], inputs[nc:nc + nx], inputs[nc + nx:], results[:nc],
                    results[nc:])


register_codec(ScanBody, "scan_body", _write_scan_body, _read_scan_body)


class Scan(MultiOutput):
    """A loop over ``axis``: args are the initial carries, the sequences (each with
    ``axis``) and the closed-over ops, as ``body`` (a :class:`ScanBody`) lists their
    stand-ins. Outputs: the final carries, the stacked ``y_t`` (axes ``axis`` then
    ``y_t``'s) and the stacked carries entering each step (``axis`` then the carry's).
    ``reverse``: from the last index to the first (outputs still indexed by position).
    ``remat``: how the reverse derivative gets the carries entering each step
    (:func:`remat_segment`): ``"step"`` reads the history and recomputes each step's
    forward; ``"none"`` reads the history and the step's stored intermediates;
    ``"checkpoints"`` (or
    ``"checkpoints:N"``) stores only every ``N``-th (default ``ceil(sqrt(T))``) and
    recomputes each segment's from it. Build it with :func:`scan`."""

    attrs = ("body", "axis", "reverse", "remat")
    optional_attrs = ("remat",)  # (a document without it: "step")

    def __init__(self, *args: Any, body: ScanBody, axis: Axis, reverse: bool = False,
                 remat: str = "step", **kwargs: Any) -> None:
        self.body, self.axis, self.reverse = body, axis, bool(reverse)
        self.remat = "step" if remat is None else remat
        remat_segment(self.remat, axis.length)  # (checks it)
        super().__init__(*args, **kwargs)
        if len(self.args) != len(body.inputs):
            raise ArgumentError(f"Scan {self.name}: {len(body.inputs)} args expected "
                                f"(carries, sequences, closures), got {len(self.args)}")
        nc, nx = len(body.carries_in), len(body.xs_in)
        for k, (a, s) in enumerate(zip(self.args, body.inputs)):
            want = s.axes
            if nc <= k < nc + nx:
                if axis.name not in a.axes.names:
                    raise _arg_error(self, a, f"lacks the scanned axis {axis!r}")
                want = _without(a.axes, axis)
            if want != s.axes or a.dtype != s.dtype:
                raise _arg_error(self, a, f"does not match its stand-in "
                                          f"({_fmt(s.axes)}) {s.dtype}")

    def _output_types(self):
        b, A = self.body, Axes(self.axis)
        return ([(c.axes, c.dtype) for c in b.carries_in]
                + [(A + y.axes, y.dtype) for y in b.ys_out]
                + [(A + c.axes, c.dtype) for c in b.carries_in])

    @property
    def counts(self) -> tuple:
        """``(carries, sequences, closures, ys)``."""
        b = self.body
        return len(b.carries_in), len(b.xs_in), len(b.closures_in), len(b.ys_out)

    @property
    def final_carries(self) -> tuple:
        nc = self.counts[0]
        return self.outputs[:nc]

    @property
    def ys(self) -> tuple:
        nc, _, _, ny = self.counts
        return self.outputs[nc:nc + ny]

    @property
    def history(self) -> tuple:
        """The stacked carries entering each step (what the reverse derivative reads)."""
        nc, _, _, ny = self.counts
        return self.outputs[nc + ny:]


BODY_ATTRS[Scan] = ("body",)  # (a body read anywhere else is refused)

REMAT_POLICIES = ("step", "none", "checkpoints")


def remat_segment(remat: Any, steps: Any) -> Any:
    """The segment length of the policy ``remat`` over ``steps`` steps: ``None`` for
    ``"step"`` and ``"none"``; ``ceil(sqrt(steps))`` for ``"checkpoints"``; ``N`` for
    ``"checkpoints:N"`` (``N >= 1``). Anything else is an :class:`ArgumentError`, and
    so are checkpoints over a symbolic number of steps."""
    if remat in ("step", "none"):
        return None
    named = remat == "checkpoints" or isinstance(remat, str) \
        and remat.startswith("checkpoints:") and remat[12:].isdigit() and int(remat[12:]) >= 1
    if not named:
        raise ArgumentError(f"scan: remat={remat!r}: expected one of {REMAT_POLICIES} or "
                            f"'checkpoints:N' (a segment of N >= 1 steps)")
    if is_symbolic(steps):
        raise ArgumentError(f"scan: remat={remat!r} over an axis of symbolic length "
                            f"{steps!r}: checkpoints split the axis into segments when the "
                            f"graph is built, so they need a fixed length; over a "
                            f"symbolic length, remat is 'none' or 'step'")
    if remat == "checkpoints":
        return math.isqrt(steps - 1) + 1 if steps > 1 else 1  # ceil(sqrt(steps))
    return int(remat[12:])


def _arg_error(op, a, what):
    return AxisMismatchError(f"Scan {op.name}: arg {a.name} ({_fmt(a.axes)}) {a.dtype} "
                             f"{what} (built at {op.file_info})")


def _without(axes, axis):
    return Axes(*[a for a in axes if a.name != axis.name])


# --- building ---------------------------------------------------------------------------

def _as_tuple(v, what, fn="scan"):
    """``(ops, single)``: ``v`` (a tensor or a tuple / list of them) as a tuple of ops,
    and whether it was one tensor. ``fn`` names the building function in errors."""
    if isinstance(v, (tuple, list)):
        return tuple(as_op(x) for x in v), False
    if v is None:
        raise ArgumentError(f"{fn}: {what} is None (at {user_location()})")
    return (as_op(v),), True


def _scan_axis(axis, seqs):
    if isinstance(axis, Axis):
        return axis
    for s in seqs:
        for a in s.axes:
            if a.name == axis:
                return a
    raise ArgumentError(f"scan: no sequence has an axis named {axis!r} (at "
                        f"{user_location()})")


def _check_sequences(seqs, axis):
    for k, s in enumerate(seqs):
        found = [a for a in s.axes if a.name == axis.name]
        if not found or found[0].length != axis.length:
            raise AxisMismatchError(
                f"scan: sequence {k} ({type(s).__name__} {s.name}, axes "
                f"({_fmt(s.axes)}), built at {s.file_info}) does not have the scanned "
                f"axis {axis.name}:{axis.length} (at {user_location()})")


def fit_layout(new, old, what, than, rule, fn="scan"):
    """``new`` laid out as ``old`` (the same axes in any order, the same dtype), or an
    error: ``"{fn}: {what} (op, built at ...) has axes (...) but {than} has (...);
    {rule} ({fn} called at <the user's line>)"`` (dtypes alike; ``{kind}`` in ``rule``
    is ``axes`` or ``dtype``)."""
    new = as_op(new)
    ours = f"{what} ({type(new).__name__} {new.name}, built at {new.file_info})"
    if not new.axes.same_set(old.axes) or any(
            a.length != old.axes[old.axes.index(a.name)].length for a in new.axes):
        raise AxisMismatchError(
            f"{fn}: {ours} has axes ({_fmt(new.axes)}) but {than} has "
            f"({_fmt(old.axes)}); {rule.format(kind='axes')} ({fn} called at "
            f"{user_location()})")
    if new.dtype != old.dtype:
        raise ArgumentError(
            f"{fn}: {ours} has dtype {new.dtype} but {than} has {old.dtype}; "
            f"{rule.format(kind='dtype')} ({fn} called at {user_location()})")
    return new if new.axes == old.axes else AxesWithOrder(new, old.axes)


def _fit_carry(k, new, old, fn="scan"):
    """The body's new carry ``k`` laid out as the carry it replaces, or an error."""
    return fit_layout(new, old, f"the body's carry {k}", "the carry it replaces",
                      "a carry keeps its {kind}", fn)


def _inner_ops(stand_ins, results):
    """The ops the body built that ``results`` need and that depend on the stand-ins
    (found by walking users forward from the stand-ins), in dependency order."""
    depends, stack = set(stand_ins), list(stand_ins)
    while stack:
        for u in list(stack.pop().users):
            if u not in depends:
                depends.add(u)
                stack.append(u)
    kids = {}

    def children(op):
        found = kids.get(op)
        if found is None:
            found = kids[op] = tuple(a for a in op.args if a in depends)
        return found
    roots = [r for r in results if r in depends]
    return toposort(roots, children=children), depends


def _close(stand_ins, results, fn="scan"):
    """Make the body a subgraph over its own stand-ins: each op it reads that does not
    depend on them (a weight, a placeholder, an op of those) becomes a closure, read
    through a new placeholder. Returns ``(closures, their placeholders, results, deps)``
    where ``deps`` are the ops the body ran after (the Scan op runs after them)."""
    order, depends = _inner_ops(stand_ins, results)
    closures: dict = {}

    def closed(a):
        if a in depends or isinstance(a, AssignableTensorOp) and a.is_constant \
                and not isinstance(a, Placeholder):
            return a
        p = closures.get(a)
        if p is None:
            p = closures[a] = Placeholder(a.axes, dtype=a.dtype, name=f"closure_{a.name}")
        return p

    deps = []
    for op in order:
        if isinstance(op, VoidOp):
            raise ArgumentError(f"{fn}: the body assigns ({type(op).__name__} {op.name}, "
                                f"built at {op.file_info}); assignments inside a "
                                f"{fn} body are not supported")
        for d in list(op.other_deps):
            if d not in depends:
                deps.append(d)
                op.other_deps.discard(d)
                d._dep_users.discard(op)
        for a in dict.fromkeys(op.args):
            p = closed(a)
            if p is not a:
                op.replace_arg(a, p)
    results = [closed(r) for r in results]
    return list(closures), [closures[c] for c in closures], results, deps


def scan(body: Callable, init: Any, xs: Any, axis: Union[Axis, str],
         reverse: bool = False, remat: str = "step") -> tuple:
    """Loop ``body`` over the named ``axis`` of the sequences ``xs``.

    Args:
        body: ``body(carry, x_t) -> (new_carry, y_t)``, called once on stand-ins:
            ``carry`` has the structure of ``init`` (a tensor or a tuple of tensors),
            ``x_t`` that of ``xs``, each a slice without ``axis``. ``new_carry`` must
            keep each carry's axes (in any order) and dtype; ``y_t`` is a tensor, a tuple
            of tensors, or ``None``.
        init: the initial carry: a tensor or a tuple of tensors.
        xs: the sequences: a tensor or a tuple of tensors (``()`` for none), each with
            ``axis``.
        axis: the scanned axis (an :class:`Axis`, or the name of a sequence's axis).
        reverse: scan from the last index to the first.
        remat: what the reverse derivative stores: ``"step"`` (the carry entering
            every step; each backward step recomputes its step's forward from it),
            ``"none"`` (also every intermediate value of each step that the backward
            step reads: nothing is recomputed, at the cost of their memory) or
            ``"checkpoints"`` (the carry entering every ``ceil(sqrt(T))``-th step only,
            ``"checkpoints:N"`` every ``N``-th: each segment's carries are recomputed
            from its checkpoint before its backward steps run). The values and
            derivatives are the same.

    Returns ``(final_carry, ys)``: the carry after the last step, and each ``y_t``
    stacked along ``axis`` (first, then ``y_t``'s axes; position ``t`` holds step
    ``t``'s value also when ``reverse``), with the structures of ``init`` and ``y_t``.
    Any op the body reads that does not depend on ``carry`` or ``x_t`` is an input of
    the scan (computed once, outside the loop).
    """
    carries, one_carry = _as_tuple(init, "init")
    seqs, one_x = _as_tuple(xs, "xs") if xs is not None else ((), False)
    axis = _scan_axis(axis, seqs)
    _check_sequences(seqs, axis)
    c_in = [Placeholder(c.axes, dtype=c.dtype, name=f"carry{k}")
            for k, c in enumerate(carries)]
    x_in = [Placeholder(_without(s.axes, axis), dtype=s.dtype, name=f"x{k}")
            for k, s in enumerate(seqs)]
    out = body(c_in[0] if one_carry else tuple(c_in), x_in[0] if one_x else tuple(x_in))
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise ArgumentError(f"scan: the body must return (new_carry, y), got "
                            f"{type(out).__name__} (scan called at {user_location()})")
    new, one_new = _as_tuple(out[0], "the body's new carry")
    if len(new) != len(carries) or one_new != one_carry:
        raise ArgumentError(f"scan: the body returned {len(new)} carries for "
                            f"{len(carries)} (the structure of init must be kept; scan "
                            f"called at {user_location()})")
    new = [_fit_carry(k, n, c) for k, (n, c) in enumerate(zip(new, c_in))]
    ys, one_y = ((), False) if out[1] is None else _as_tuple(out[1], "y")
    for k, y in enumerate(ys):
        if axis.name in y.axes.names:
            raise AxisMismatchError(f"scan: the body's output {k} ({_fmt(y.axes)}) has "
                                    f"the scanned axis {axis!r} (at {user_location()})")
    closures, k_in, results, deps = _close(c_in + x_in, new + list(ys))
    b = ScanBody(c_in, x_in, k_in, results[:len(new)], results[len(new):])
    op = Scan(*carries, *seqs, *closures, body=b, axis=axis, reverse=reverse,
              remat=remat, follows=deps)
    final = op.final_carries[0] if one_carry else tuple(op.final_carries)
    stacked = None if out[1] is None else op.ys[0] if one_y else tuple(op.ys)
    return final, stacked


# --- the reference value -------------------------------------------------------------------

@evaluator(Scan)
def _scan_value(op, *values):
    nc, nx, _, ny = op.counts
    b, T = op.body, op.axis.length
    carries = [np.asarray(v) for v in values[:nc]]
    seqs = [np.moveaxis(np.asarray(v), a.axes.index(op.axis.name), 0)
            for v, a in zip(values[nc:nc + nx], op.args[nc:nc + nx])]
    closures = list(values[nc + nx:])
    outs = [np.empty(o.axes.shape, o.dtype) for o in op.outputs[nc:]]
    ys, hist = outs[:ny], outs[ny:]
    for t in (range(T - 1, -1, -1) if op.reverse else range(T)):
        for h, c in zip(hist, carries):
            h[t] = c
        step = b(*carries, *[s[t] for s in seqs], *closures)
        carries = [np.asarray(v) for v in step[:nc]]
        for y, v in zip(ys, step[nc:]):
            y[t] = v
    return carries + outs


# --- derivatives ---------------------------------------------------------------------------

def _zeros(axes, dtype):
    return Constant(0.0, axes=axes, dtype=dtype)


def _float(op):
    return op.dtype.kind in "fc"


def _laid_out(t, axes):
    return t if t.axes == axes else AxesWithOrder(t, axes)


def _as_dtype(t, dtype, what):
    """``t`` in ``dtype``: itself, or times a one of ``dtype`` where that promotes it."""
    if t.dtype == dtype:
        return t
    if np.promote_types(t.dtype, dtype) != dtype:
        raise ArgumentError(f"scan: {what} is {t.dtype}, wider than {dtype}; mixed "
                            f"dtypes of this kind are not supported in scan derivatives")
    return t * Constant(1.0, dtype=dtype)


def _common_dtype(ops):
    ds = [o.dtype for o in ops if o is not None and _float(o)]
    return np.result_type(*ds) if ds else np.dtype(np.float64)


#: A closure's share of a step that is a product ``dot(u_t, v_t)`` (a weight's:
#: ``h_t^T @ dgates_t``) is stacked (``u_t``, ``v_t`` as ys of the adjoint scan) and
#: taken as one product over the steps after the loop, where the stacks hold at most
#: this many elements: one GEMM, not a thin one and a sum over the weight a step (zoo
#: LSTM's backward step: 23.6 -> 18.6 us).
STACKED_PRODUCT_ELEMENTS = 1 << 24


def _stacked_product(g, axis):
    """Whether closure share ``g`` is a product (no batch axes, operands without the
    scanned ``axis``) to take after the loop (:data:`STACKED_PRODUCT_ELEMENTS`)."""
    steps = getattr(axis, "length", None)
    if type(g) is not Dot or g.batch_axes or not isinstance(steps, int) \
            or any(axis.name in a.axes.names for a in g.args):
        return False
    sizes = [a.axes.size for a in g.args]
    return all(isinstance(n, int) for n in sizes) \
        and steps * sum(sizes) <= STACKED_PRODUCT_ELEMENTS


def _vjp_body(b, dt, d_ys, d_hist, axis=None):
    """The body of the adjoint scan and which inputs it differentiates: carries
    (cotangents of the float carries, in ``dt``, then accumulators of the float
    closures), sequences (the carries entering the step, the sequences' slices, the
    given cotangents of the ys and of the history), closures (the forward body's).
    A closure whose share of a step is a product has no accumulator: its operands are
    ys after the slices' cotangents (``products``, :data:`STACKED_PRODUCT_ELEMENTS`)."""
    cs = [k for k, c in enumerate(b.carries_in) if _float(c)]
    xs = [k for k, x in enumerate(b.xs_in) if _float(x)]
    ks = [k for k, x in enumerate(b.closures_in) if _float(x)]
    lam = [Placeholder(b.carries_in[k].axes, dtype=dt, name="ct_carry") for k in cs]
    acc = [Placeholder(b.closures_in[k].axes,
                       dtype=np.promote_types(dt, b.closures_in[k].dtype), name="ct_acc")
           for k in ks]
    dy = {j: Placeholder(y.axes, dtype=d.dtype, name="ct_y")
          for j, (y, d) in enumerate(zip(b.ys_out, d_ys)) if d is not None and _float(y)}
    dh = {k: Placeholder(b.carries_in[k].axes, dtype=d_hist[k].dtype, name="ct_h")
          for k in cs if d_hist[k] is not None}
    pairs = [(b.carries_out[k], ct) for k, ct in zip(cs, lam)]
    pairs += [(b.ys_out[j], ct) for j, ct in dy.items()]
    s = None
    for out, ct in pairs:
        prod = out * ct
        term = Sum(prod, reduction_axes=prod.axes)
        s = term if s is None else s + term
    wrt = [b.carries_in[k] for k in cs] + [b.xs_in[k] for k in xs] \
        + [b.closures_in[k] for k in ks]
    grads = [_zeros(w.axes, dt) for w in wrt] if s is None else deriv(s, wrt)
    nc, nx = len(cs), len(xs)
    g_c, g_x, g_k = grads[:nc], grads[nc:nc + nx], grads[nc + nx:]
    new_lam = [_as_dtype(_laid_out(g + dh[k] if k in dh else g, b.carries_in[k].axes),
                         dt, f"the adjoint of carry {k}") for k, g in zip(cs, g_c)]
    products = {i: g for i, g in enumerate(g_k) if _stacked_product(g, axis)}
    new_acc = [_as_dtype(_laid_out(a + g, a.axes), a.dtype, f"the adjoint of closure {k}")
               for i, (a, g, k) in enumerate(zip(acc, g_k, ks)) if i not in products]
    body = ScanBody(lam + [a for i, a in enumerate(acc) if i not in products],
                    list(b.carries_in) + list(b.xs_in) + list(dy.values())
                    + list(dh.values()), b.closures_in, new_lam + new_acc,
                    [_laid_out(g, b.xs_in[k].axes) for k, g in zip(xs, g_x)]
                    + [a for g in products.values() for a in g.args])
    return body, (cs, xs, ks, list(dy), list(dh), products)


@adjoint_rule(Scan)
def _scan_adjoint(op, deltas):
    """The policy ``op.remat``'s reverse derivative (:func:`_step_adjoint`,
    :func:`_checkpoint_adjoint`)."""
    seg = remat_segment(op.remat, op.axis.length)
    if seg is None or op.axis.length // seg == 0:
        return _step_adjoint(op, deltas)
    return _checkpoint_adjoint(op, deltas, seg)


def _step_adjoint(op, deltas, acc=None):
    """A reverse scan over the history: each step maps the cotangent of the carry
    leaving it (and of its ``y_t``) to that of the carry entering it, of ``x_t``, and
    adds the closures' share to their accumulators (starting at ``acc``, one per float
    closure, or zeros)."""
    nc, nx, nk, ny = op.counts
    deltas = list(deltas) + [None] * (len(op.outputs) - len(deltas))
    d_final, d_ys, d_hist = deltas[:nc], deltas[nc:nc + ny], deltas[nc + ny:]
    b = op.body
    carries, seqs = op.args[:nc], op.args[nc:nc + nx]
    closures = op.args[nc + nx:]
    dt = _common_dtype([c for c in carries] + [as_op(d) for d in deltas if d is not None])
    body, (cs, xs, ks, dys, dhs, products) = _vjp_body(b, dt, d_ys, d_hist, op.axis)
    init = [_zeros(carries[k].axes, dt) if d_final[k] is None else _as_dtype(
        _laid_out(as_op(d_final[k]), carries[k].axes), dt, "a carry's adjoint")
        for k in cs]
    acc = acc or [None] * len(ks)
    init += [_zeros(a.axes, a.dtype) if v is None else _as_dtype(
        _laid_out(as_op(v), a.axes), a.dtype, "an accumulator")
        for a, v in zip(body.carries_in[len(cs):],
                        [v for i, v in enumerate(acc) if i not in products])]
    hist, stored = list(op.history), []
    if op.remat == "none":
        body, fwd, stored = _reading_stored(op, body)
        hist = list(fwd.history)
    d_seq = [_laid_out(as_op(d_ys[j]), op.ys[j].axes) for j in dys]
    d_seq += [_laid_out(as_op(d_hist[k]), op.history[k].axes) for k in dhs]
    adj = Scan(*init, *hist, *seqs, *d_seq, *stored, *closures, body=body, axis=op.axis,
               reverse=not op.reverse)
    out: list = [None] * len(op.args)
    for i, k in enumerate(cs):
        out[k] = adj.outputs[i]
    for i, k in enumerate(xs):
        out[nc + k] = adj.ys[i]
    kept, stacks = len(cs), iter(adj.ys[len(xs):])
    for i, k in enumerate(ks):
        if i not in products:
            out[nc + nx + k] = adj.outputs[kept]
            kept += 1
            continue
        # the steps' products as one: the stacks share the scanned axis, a summed one
        share = Dot(next(stacks), next(stacks))
        closure = op.args[nc + nx + k]
        dtype = np.promote_types(dt, closure.dtype)
        total = share if acc[i] is None else _laid_out(as_op(acc[i]), share.axes) + share
        out[nc + nx + k] = _as_dtype(_laid_out(total, closure.axes), dtype,
                                     f"the adjoint of closure {k}")
    return out


#: ops that only view their arg (no arithmetic): never stored under ``"none"``
_VIEWS = (CastAxes, AxesWithOrder)


def _stored_values(b, vjp):
    """The ops of the forward body ``b`` that depend on a step's carries or slices and
    that the adjoint body ``vjp`` reads from ops of its own (or returns), in the forward
    body's order: what the policy ``"none"`` stores per step."""
    order, _ = _inner_ops(list(b.carries_in) + list(b.xs_in), b.results)
    stand_ins = set(b.inputs)
    # Views of the stand-ins (a carry renamed, reordered) cost nothing to make again:
    # the adjoint body rebuilds them from the stand-ins instead of reading a stack.
    views = set()
    for o in order:
        if isinstance(o, _VIEWS) and all(a in stand_ins or a in views for a in o.args):
            views.add(o)
    forward = {o for o in order if o not in stand_ins and o not in views}
    read = {r for r in vjp.results if r in forward}
    for v in toposort(list(vjp.results)):
        if v not in forward and v not in stand_ins:
            read.update(a for a in v.args if a in forward)
    return [o for o in order if o in read]


def _reading_stored(op, vjp):
    """The policy ``"none"``: ``(body, fwd, stacks)`` where ``fwd`` is a scan of
    ``op``'s body that also stacks the forward values the adjoint body ``vjp`` reads
    (``op`` itself when its ys hold them all already: a document saved after such a
    derivative), ``stacks`` are those stacked values, and ``body`` is ``vjp`` reading
    them through stand-ins appended to its sequences instead of recomputing them.
    ``fwd`` computes what ``op`` does: the transformers' CSE merges the two scans
    (:func:`geon.transformers.passes.cse.merge_scans`)."""
    b = op.body
    # (a value over the scanned axis itself, a closed-over constant's view, say, cannot
    # be stacked along it: the adjoint body recomputes it)
    values = [v for v in _stored_values(b, vjp) if isinstance(v, TensorOp)
              and op.axis.name not in v.axes.names]
    if not values:
        return vjp, op, []
    ys = list(b.ys_out) + [v for v in values if v not in b.ys_out]
    fwd = op
    if len(ys) > len(b.ys_out):
        fwd = Scan(*op.args, body=ScanBody(b.carries_in, b.xs_in, b.closures_in,
                                           b.carries_out, ys),
                   axis=op.axis, reverse=op.reverse, remat=op.remat,
                   follows=list(op.other_deps))
    stand_ins = {v: Placeholder(v.axes, dtype=v.dtype, name=f"stored_{v.name}")
                 for v in values}
    copy = clone_graph(list(vjp.results), replace=stand_ins)
    body = ScanBody(vjp.carries_in, list(vjp.xs_in) + list(stand_ins.values()),
                    vjp.closures_in, [copy[r] for r in vjp.carries_out],
                    [copy[r] for r in vjp.ys_out])
    return body, fwd, [fwd.ys[ys.index(v)] for v in values]


class _Segments:
    """How a checkpointed scan of ``T`` steps divides: ``K = T // N`` full segments of
    ``N`` steps (axes ``seg`` of ``K`` and ``inner`` of ``N``), run first, then a tail
    of ``T % N`` steps (axis ``tail``), run last (positions ``K*N ..`` forward, ``0 ..``
    in reverse). Splits a per-step sequence into those parts and joins them back."""

    def __init__(self, axis, seg_len, reverse):
        T, n = axis.length, axis.name
        K, r = T // seg_len, T % seg_len
        self.axis, self.r = axis, r
        self.seg, self.inner = Axis(K, f"{n}_seg{K}"), Axis(seg_len, f"{n}_in{seg_len}")
        self.full = Axis(K * seg_len, f"{n}_full{K * seg_len}")
        self.tail = Axis(r, f"{n}_tail{r}") if r else None
        self.lo = r if reverse else 0            # where the full segments start
        self.tail_lo = 0 if reverse else K * seg_len

    def segments(self, s):
        """``s`` (with ``axis``) restricted to the full segments, ``axis`` split into
        (``seg``, ``inner``) in its place."""
        full = slice_along_axis(s, self.axis, slice(self.lo, self.lo + self.full.length),
                                new_axis=self.full)
        split = FlattenedAxis([self.seg, self.inner])
        return unflatten(cast_axes(full, [split if a.name == self.full.name else a
                                          for a in full.axes]))

    def tail_of(self, s):
        return slice_along_axis(s, self.axis, slice(self.tail_lo, self.tail_lo + self.r),
                                new_axis=self.tail)

    def join(self, full, tail, axes):
        """The per-step values ``full`` (``seg``, ``inner``, the rest) and ``tail``
        (``tail``, the rest; or None) as one tensor laid out as ``axes``."""
        rest = [a for a in full.axes if a.name not in (self.seg.name, self.inner.name)]
        flat = flatten(_laid_out(full, Axes(self.seg, self.inner, *rest)),
                       [Axes(self.seg, self.inner)] + rest)
        parts = [cast_axes(flat, [self.full] + rest)]
        if tail is not None:
            parts.append(_laid_out(tail, Axes(self.tail, *rest)))
            if self.lo:                              # reverse: the tail comes first
                parts.reverse()
            parts = [concat(parts, [p.axes[0] for p in parts], out_axis=self.axis)]
        else:
            parts = [cast_axes(parts[0], [self.axis] + rest)]
        return _laid_out(parts[0], axes)


def _segment_scan(op, axis, carries, seqs):
    """``op``'s loop over ``axis`` (a segment of its steps), from ``carries`` over the
    sequences ``seqs``, reading ``op``'s closures: a :class:`Scan` stepping by the
    policy ``"step"``."""
    nc, nx, _, _ = op.counts
    return Scan(*carries, *seqs, *op.args[nc + nx:], body=op.body, axis=axis,
                reverse=op.reverse)


def _checkpoint_adjoint(op, deltas, seg_len):
    """The reverse derivative under ``"checkpoints"``: a forward scan over the full
    segments (each step an inner scan over one segment) whose history are the
    checkpoints; the tail's derivative by the policy ``"step"``; then a reverse scan
    over the segments whose step rebuilds the segment's history from its checkpoint
    (an inner forward scan) and runs the segment's reverse derivative over it."""
    nc, nx, nk, ny = op.counts
    deltas = list(deltas) + [None] * (len(op.outputs) - len(deltas))
    d_final, d_ys, d_hist = deltas[:nc], deltas[nc:nc + ny], deltas[nc + ny:]
    carries, seqs = op.args[:nc], op.args[nc:nc + nx]
    sg = _Segments(op.axis, seg_len, op.reverse)
    dys = [j for j, d in enumerate(d_ys) if d is not None]
    dhs = [k for k, d in enumerate(d_hist) if d is not None]
    per_step = list(seqs) + [_laid_out(as_op(d_ys[j]), op.ys[j].axes) for j in dys] \
        + [_laid_out(as_op(d_hist[k]), op.history[k].axes) for k in dhs]
    full = [sg.segments(s) for s in per_step]
    cs = [k for k, c in enumerate(carries) if _float(c)]
    xs = [k for k, s in enumerate(seqs) if _float(s)]
    ks = [k for k, c in enumerate(op.args[nc + nx:]) if _float(c)]

    def advance(c, x_k):
        return tuple(_segment_scan(op, sg.inner, c, x_k).final_carries), None
    mid, _ = scan(advance, tuple(carries), tuple(full[:nx]), sg.seg, reverse=op.reverse)
    checkpoints = mid[0].args[0].history

    def adjoint_of(seg_op, lam, d_seq, acc):
        """``_step_adjoint`` of a segment's scan: the carry cotangents ``lam`` (of the
        float carries) leave it, ``d_seq`` (the given ys' then history's) its steps."""
        d = [None] * len(seg_op.outputs)
        for i, k in enumerate(cs):
            d[k] = lam[i]
        for v, j in zip(d_seq[:len(dys)], dys):
            d[nc + j] = v
        for v, k in zip(d_seq[len(dys):], dhs):
            d[nc + ny + k] = v
        g = _step_adjoint(seg_op, d, acc)
        return [g[k] for k in cs], [g[nc + k] for k in xs], [g[nc + nx + k] for k in ks]

    dt = _common_dtype(list(carries) + [as_op(d) for d in deltas if d is not None])
    lam = [_zeros(carries[k].axes, dt) if d_final[k] is None else _as_dtype(
        _laid_out(as_op(d_final[k]), carries[k].axes), dt, "a carry's adjoint") for k in cs]
    acc = [_zeros(op.args[nc + nx + k].axes, np.promote_types(dt, op.args[nc + nx + k].dtype))
           for k in ks]
    tail_dx = [None] * len(xs)
    if sg.tail is not None:
        tail = [sg.tail_of(s) for s in per_step]
        lam, tail_dx, acc = adjoint_of(_segment_scan(op, sg.tail, mid, tail[:nx]), lam,
                                       tail[nx:], acc)

    def back(c, x_k):
        lam, acc = c[:len(cs)], c[len(cs):]
        seg_op = _segment_scan(op, sg.inner, x_k[:nc], x_k[nc:nc + nx])
        new_lam, dx, new_acc = adjoint_of(seg_op, lam, x_k[nc + nx:], acc)
        return tuple(new_lam) + tuple(new_acc), tuple(dx)
    res, dxs = scan(back, tuple(lam) + tuple(acc), tuple(checkpoints) + tuple(full),
                    sg.seg, reverse=not op.reverse)
    out: list = [None] * len(op.args)
    for i, k in enumerate(cs):
        out[k] = res[i]
    for i, k in enumerate(xs):
        out[nc + k] = sg.join(dxs[i], tail_dx[i], seqs[k].axes)
    for i, k in enumerate(ks):
        out[nc + nx + k] = res[len(cs) + i]
    return out


def _jvp_body(b, ts, directions, dt):
    """The body of the tangent scan: the forward body's inputs and results followed by
    their tangents (``ts``: the args' tangents, None for none; the carries' tangents
    in ``dt``)."""
    has = [t is not None and _float(p) for t, p in zip(ts, b.inputs)]
    nc, nx = len(b.carries_in), len(b.xs_in)
    cs = [k for k, c in enumerate(b.carries_in) if _float(c)]
    xs = [k for k in range(nx) if has[nc + k]]
    ks = [k for k in range(len(b.closures_in)) if has[nc + nx + k]]

    def tangent_of(p, dtype):
        return Placeholder(p.axes + directions, dtype=dtype, name=f"t_{p.name}")
    t_c = [tangent_of(b.carries_in[k], dt) for k in cs]
    t_x = [tangent_of(b.xs_in[k], ts[nc + k].dtype) for k in xs]
    t_k = [tangent_of(b.closures_in[k], ts[nc + nx + k].dtype) for k in ks]
    seeds = dict(zip([b.carries_in[k] for k in cs] + [b.xs_in[k] for k in xs]
                     + [b.closures_in[k] for k in ks], t_c + t_x + t_k))
    found = propagate(list(b.results), seeds, directions)

    def tangent(o):
        t = found.get(o)
        dt = o.dtype if _float(o) else np.dtype(np.float64)
        return _zeros(o.axes + directions, dt) if t is None else t
    ys = [j for j, y in enumerate(b.ys_out) if _float(y)]
    body = ScanBody(list(b.carries_in) + t_c, list(b.xs_in) + t_x,
                    list(b.closures_in) + t_k,
                    list(b.carries_out) + [_as_dtype(tangent(b.carries_out[k]), dt,
                                                     f"the tangent of carry {k}")
                                           for k in cs],
                    list(b.ys_out) + [tangent(b.ys_out[j]) for j in ys])
    return body, cs, xs, ks, ys


@forward_rule(Scan)
def _scan_tangent(op, ts):
    """A scan over (carry, tangent of carry) whose body is the body's Jacobian-vector
    product; tangents may carry direction axes (after each value's own)."""
    nc, nx, nk, ny = op.counts
    directions = Axes()
    for t, a in zip(ts, op.args):
        if t is not None:
            directions = direction_axes(t, a)
            break
    ts = [None if t is None or not _float(a) else as_op(t) for t, a in zip(ts, op.args)]
    carries, seqs, closures = op.args[:nc], op.args[nc:nc + nx], op.args[nc + nx:]
    dt = _common_dtype(list(carries) + ts[:nc])
    body, cs, xs, ks, ys = _jvp_body(op.body, ts, directions, dt)
    t_c = [_zeros(carries[k].axes + directions, dt) if ts[k] is None else _as_dtype(
        _laid_out(ts[k], carries[k].axes + directions), dt, "a carry's tangent")
        for k in cs]
    t_x = [_laid_out(as_op(ts[nc + k]), seqs[k].axes + directions) for k in xs]
    t_k = [_laid_out(as_op(ts[nc + nx + k]), closures[k].axes + directions) for k in ks]
    s = Scan(*carries, *t_c, *seqs, *t_x, *closures, *t_k, body=body, axis=op.axis,
             reverse=op.reverse, remat=op.remat)
    ncs, nys = nc + len(cs), ny + len(ys)
    out: list = [None] * len(op.outputs)
    for i, k in enumerate(cs):
        out[k] = s.outputs[nc + i]                       # the final carry's tangent
        out[nc + ny + k] = s.outputs[ncs + nys + nc + i]  # the history's
    for i, j in enumerate(ys):
        out[nc + j] = s.outputs[ncs + ny + i]
    return tuple(out)
