"""Control flow beside :func:`~geon.op_graph.control.scan`: :func:`cond` and
:func:`while_loop`.

Both build their Python functions once, on stand-in placeholders, with the machinery of
``scan`` (:func:`~geon.op_graph.control._close`: every op the functions read that does
not depend on the stand-ins becomes an explicit input, a *closure*). What they built is
kept as :class:`Subgraph` objects over the same stand-ins:

- :class:`Cond` holds two (the true and the false branch). Its args are the predicate,
  the operands and the closures of both branches. Its reverse derivative is a ``Cond``
  whose branches are the branches' vector-Jacobian products, its forward derivative a
  ``Cond`` whose branches are their Jacobian-vector products.
- :class:`WhileLoop` holds two (the predicate and the body, sharing stand-ins and
  closures). Its forward derivative is a ``WhileLoop`` over (carry, tangent of carry).
  Its reverse derivative needs ``max_steps``: the loop is then the same as a
  :class:`~geon.op_graph.control.Scan` of ``max_steps`` *masked* steps (a step after the
  predicate first fails keeps the carry), and the derivative is that scan's derivative.
"""

from typing import Any, Callable, Optional

import numpy as np

from geon.errors import ArgumentError, AxisMismatchError
from geon.op_graph.autodiff import deriv
from geon.op_graph.axes import Axes, Axis
from geon.op_graph.control import (Scan, ScanBody, _as_tuple, _close, _common_dtype,
                                   _fit_carry, _float, _laid_out, _zeros, fit_layout)
from geon.op_graph.core import Constant, Placeholder, _fmt, as_op
from geon.op_graph.core_ops import MultiOutput, Sum
from geon.op_graph.derivatives import direction_axes
from geon.op_graph.elementwise import Add
from geon.op_graph.forward import propagate
from geon.op_graph.nn_ops import Select
from geon.op_graph.nodes import user_location
from geon.op_graph.reference import evaluate
from geon.op_graph.serialize import register_codec
from geon.op_graph.serialize_bodies import BODY_ATTRS, read_body, write_body
from geon.op_graph.tables import ADJOINTS, adjoint_rule, evaluator, forward_rule

__all__ = ["Cond", "Subgraph", "WhileLoop", "cond", "while_loop"]


class Subgraph:
    """``results`` (ops) computed from the stand-in placeholders ``inputs`` and
    constants only: a branch of a :class:`Cond`, the predicate or the body of a
    :class:`WhileLoop`. Calling it on arrays (one per input) evaluates it with the
    reference evaluator and returns the list of the results' values."""

    def __init__(self, inputs, results):
        self.inputs, self.results = tuple(inputs), tuple(results)

    def __call__(self, *values):
        return evaluate(list(self.results), feeds=dict(zip(self.inputs, values)))

    def __repr__(self):
        return f"<subgraph: {len(self.inputs)} inputs, {len(self.results)} results>"


def _read_subgraph(dec, data, where):
    inputs, results, _ = read_body(dec, data, where)
    return Subgraph(inputs, results)


# written as its nested graph (geon.op_graph.serialize_bodies)
register_codec(Subgraph, "subgraph", lambda enc, g, where: write_body(
    enc, g.inputs, g.results, where), _read_subgraph)


def _cast(t, dtype):
    """``t`` converted to ``dtype`` (``t + -0.0``: exact for every float)."""
    return t if t.dtype == dtype else Add(t, -0.0, dtype=np.dtype(dtype))


def _stand_ins(ops, prefix):
    return [Placeholder(o.axes, dtype=o.dtype, name=f"{prefix}{k}")
            for k, o in enumerate(ops)]


def _check_inputs(op, args, stand_ins):
    for a, s in zip(args, stand_ins):
        if a.axes != s.axes or a.dtype != s.dtype:
            raise AxisMismatchError(
                f"{type(op).__name__} {op.name}: arg {a.name} ({_fmt(a.axes)}) {a.dtype} "
                f"does not match its stand-in ({_fmt(s.axes)}) {s.dtype} (built at "
                f"{op.file_info})")


def _check_bodies(op, bodies, want):
    """Each of ``bodies`` (:class:`Subgraph` objects) has ``op``'s stand-ins and results
    of the ``(axes, dtype)`` of ``want``: what the builders make, checked again for a
    loaded op."""
    for name, b in bodies.items():
        if len(b.inputs) != len(bodies[next(iter(bodies))].inputs):
            raise ArgumentError(f"{type(op).__name__} {op.name}: the {name} has "
                                f"{len(b.inputs)} stand-ins, not as many as the others")
        got = [(r.axes, r.dtype) for r in b.results]
        if len(got) != len(want) or any(
                g[0].names != w[0].names or g[0].lengths != w[0].lengths or g[1] != w[1]
                for g, w in zip(got, want)):
            raise AxisMismatchError(
                f"{type(op).__name__} {op.name}: the {name}'s results are "
                f"{'; '.join(f'({_fmt(a)}) {d}' for a, d in got)}, not "
                f"{'; '.join(f'({_fmt(a)}) {d}' for a, d in want)} (built at "
                f"{op.file_info})")


def _check_predicate(p, what, fn):
    p = as_op(p)
    if p.axes:
        raise AxisMismatchError(f"{fn}: {what} ({type(p).__name__} {p.name}, built at "
                                f"{p.file_info}) has axes ({_fmt(p.axes)}); a predicate "
                                f"is a scalar (no axes) ({fn} called at {user_location()})")
    return p


def _vjp_results(results, inputs, cts):
    """The derivatives of ``sum_k sum(results[k] * cts[k])`` (``cts``: ``{k: ct}``)
    with respect to the float ``inputs``, laid out and typed as them (``None`` for the
    others)."""
    s = None
    for k, ct in cts.items():
        prod = results[k] * ct
        term = Sum(prod, reduction_axes=prod.axes)
        s = term if s is None else s + term
    wrt = [p for p in inputs if _float(p)]
    grads = iter([_zeros(w.axes, w.dtype) for w in wrt] if s is None else deriv(s, wrt))
    return [_cast(_laid_out(next(grads), p.axes), p.dtype) if _float(p) else None
            for p in inputs]


def _tangents_of(ts, args):
    """``(directions, tangents)``: the direction axes of the first tangent given, and
    the tangents of the float args (``None`` elsewhere)."""
    directions = Axes()
    for t, a in zip(ts, args):
        if t is not None:
            directions = direction_axes(as_op(t), a)
            break
    return directions, [None if t is None or not _float(a) else as_op(t)
                        for t, a in zip(ts, args)]


def _jvp_seeds(inputs, ts, directions):
    """``(seeds, placeholders, positions)``: a tangent stand-in per input with a
    tangent."""
    pos = [k for k, t in enumerate(ts) if t is not None]
    t_in = [Placeholder(inputs[k].axes + directions, dtype=ts[k].dtype,
                        name=f"t_{inputs[k].name}") for k in pos]
    return dict(zip([inputs[k] for k in pos], t_in)), t_in, pos


def _tangent_results(results, seeds, directions, dtypes):
    """The tangents of ``results`` (those with a dtype in ``dtypes``: ``{k: dtype}``)
    under ``seeds``, zeros where a result does not depend on them."""
    found = propagate(list(results), seeds, directions) if seeds else {}
    out = []
    for k, dt in dtypes.items():
        r = results[k]
        t = found.get(r)
        out.append(_zeros(r.axes + directions, dt) if t is None
                   else _cast(_laid_out(t, r.axes + directions), dt))
    return out


# --- cond ------------------------------------------------------------------------------

class Cond(MultiOutput):
    """``branches[0](*args[1:])`` if the scalar ``args[0]`` is nonzero, else
    ``branches[1](*args[1:])``: the args after the predicate are the operands and the
    closures, as both branches (:class:`Subgraph` objects over the same stand-ins) list
    their inputs. One output per result; both branches' results have the same axes and
    dtypes. Build it with :func:`cond`."""

    attrs = ("branches",)

    def __init__(self, pred: Any, *args: Any, branches: tuple, **kwargs: Any) -> None:
        self.branches = tuple(branches)
        super().__init__(pred, *args, **kwargs)
        if len(self.args) != len(self.branches[0].inputs) + 1:
            raise ArgumentError(f"Cond {self.name}: {len(self.branches[0].inputs) + 1} "
                                f"args expected (the predicate, the operands, the "
                                f"closures), got {len(self.args)}")
        _check_inputs(self, self.args[1:], self.branches[0].inputs)
        _check_bodies(self, {f"branch {k}": b for k, b in enumerate(self.branches)},
                      self._output_types())

    def _output_types(self):
        return [(r.axes, r.dtype) for r in self.branches[0].results]


def _branch(fn, name, stand_ins):
    out = fn(*stand_ins)
    if out is None:
        raise ArgumentError(f"cond: the {name} branch returned None; a branch returns a "
                            f"tensor or a tuple of tensors (cond called at "
                            f"{user_location()})")
    return _as_tuple(out, f"the {name} branch's result", "cond")


def cond(pred: Any, true_fn: Callable, false_fn: Callable, *operands: Any) -> Any:
    """``true_fn(*operands)`` if the scalar ``pred`` is nonzero, else
    ``false_fn(*operands)``, as one op that computes only the branch taken.

    Args:
        pred: a scalar (no axes) tensor; nonzero (or NaN) selects ``true_fn``.
        true_fn, false_fn: called once each, on stand-ins of the operands (with their
            axes and dtypes); each returns a tensor or a tuple of tensors, the two with
            the same structure, and each result with the same axes (in any order) and
            dtype in both.
        operands: the tensors the branches take. A branch may read any other tensor
            too: each op it reads that does not depend on the operands is computed
            before the choice, as an input of the op.

    Returns the results of the branch taken, in its structure.
    """
    pred = _check_predicate(pred, "the predicate", "cond")
    ops = [as_op(o) for o in operands]
    ins = _stand_ins(ops, "operand")
    true_out, one_t = _branch(true_fn, "true", ins)
    false_out, one_f = _branch(false_fn, "false", ins)
    if len(true_out) != len(false_out) or one_t != one_f:
        raise ArgumentError(f"cond: the true branch returned {len(true_out)} results and "
                            f"the false branch {len(false_out)}; both return the same "
                            f"structure (cond called at {user_location()})")
    false_out = [fit_layout(f, t, f"the false branch's result {k}",
                            f"the true branch's result {k}",
                            "both branches' results have the same {kind}", "cond")
                 for k, (f, t) in enumerate(zip(false_out, true_out))]
    n = len(true_out)
    closures, k_in, results, deps = _close(ins, list(true_out) + false_out, "cond")
    inputs = ins + k_in
    op = Cond(pred, *ops, *closures, branches=(Subgraph(inputs, results[:n]),
                                               Subgraph(inputs, results[n:])),
              follows=deps)
    return op.outputs[0] if one_t else tuple(op.outputs)


@evaluator(Cond)
def _cond_value(op, pred, *values):
    branch = op.branches[0 if np.asarray(pred) != 0 else 1]
    return [np.asarray(v) for v in branch(*values)]


@adjoint_rule(Cond)
def _cond_adjoint(op, deltas):
    """A cond of the branches' vector-Jacobian products, over the same operands and
    closures and the cotangents of the results."""
    deltas = list(deltas) + [None] * (len(op.outputs) - len(deltas))
    inputs = op.branches[0].inputs
    given = [k for k, (o, d) in enumerate(zip(op.outputs, deltas))
             if d is not None and _float(o)]
    d_ops = [_laid_out(as_op(deltas[k]), op.outputs[k].axes) for k in given]
    cts = {k: Placeholder(d.axes, dtype=d.dtype, name=f"ct{k}")
           for k, d in zip(given, d_ops)}
    grads = [_vjp_results(b.results, inputs, cts) for b in op.branches]
    wrt = [j for j, p in enumerate(inputs) if _float(p)]
    if not wrt:
        return [None] * len(op.args)
    new_in = list(inputs) + list(cts.values())
    adj = Cond(op.args[0], *op.args[1:], *d_ops,
               branches=tuple(Subgraph(new_in, [g[j] for j in wrt]) for g in grads))
    out: list = [None] * len(op.args)
    for i, j in enumerate(wrt):
        out[1 + j] = adj.outputs[i]
    return out


@forward_rule(Cond)
def _cond_tangent(op, ts):
    """A cond of the branches' Jacobian-vector products: each branch computes its
    results and their tangents."""
    directions, ts = _tangents_of(ts[1:], op.args[1:])
    if all(t is None for t in ts):
        return None
    inputs = op.branches[0].inputs
    ts = [None if t is None else _laid_out(t, a.axes + directions)
          for t, a in zip(ts, op.args[1:])]
    seeds, t_in, pos = _jvp_seeds(inputs, ts, directions)
    outs = op.outputs
    dtypes = {k: _common_dtype([o] + [ts[j] for j in pos]) for k, o in enumerate(outs)
              if _float(o)}
    branches = tuple(Subgraph(list(inputs) + t_in, list(b.results) + _tangent_results(
        b.results, seeds, directions, dtypes)) for b in op.branches)
    new = Cond(op.args[0], *op.args[1:], *[ts[j] for j in pos], branches=branches)
    out: list = [None] * len(outs)
    for i, k in enumerate(dtypes):
        out[k] = new.outputs[len(outs) + i]
    return tuple(out)


# --- while_loop --------------------------------------------------------------------------

class WhileLoop(MultiOutput):
    """``while pred(carries): carries = body(carries)``, at most ``max_steps`` times
    (``None``: no bound). Args: the initial carries, then the closures, as ``pred`` and
    ``body`` (:class:`Subgraph` objects over the same stand-ins) list their inputs.
    Outputs: the final carries. Build it with :func:`while_loop`."""

    attrs = ("pred", "body", "max_steps")

    def __init__(self, *args: Any, pred: Subgraph, body: Subgraph,
                 max_steps: Optional[int] = None, **kwargs: Any) -> None:
        self.pred, self.body = pred, body
        self.max_steps = None if max_steps is None else int(max_steps)
        super().__init__(*args, **kwargs)
        if len(self.args) != len(body.inputs):
            raise ArgumentError(f"WhileLoop {self.name}: {len(body.inputs)} args expected "
                                f"(carries, closures), got {len(self.args)}")
        _check_inputs(self, self.args, body.inputs)
        if len(body.results) > len(body.inputs):
            raise ArgumentError(f"WhileLoop {self.name}: {len(body.results)} carries but "
                                f"{len(body.inputs)} stand-ins")
        _check_bodies(self, {"body": body}, self._output_types())
        if len(pred.inputs) != len(body.inputs) or len(pred.results) != 1 or \
                pred.results[0].axes:
            raise ArgumentError(f"WhileLoop {self.name}: the predicate takes the body's "
                                f"stand-ins and computes one scalar")

    def _output_types(self):
        return [(c.axes, c.dtype) for c in self.body.inputs[:len(self.body.results)]]

    @property
    def n_carries(self) -> int:
        return len(self.body.results)


# (a body read anywhere else is refused)
BODY_ATTRS.update({Cond: ("branches",), WhileLoop: ("pred", "body")})


def while_loop(cond_fn: Callable, body_fn: Callable, init: Any,
               max_steps: Optional[int] = None) -> Any:
    """``carry = init; while cond_fn(carry): carry = body_fn(carry)``, as one op.

    Args:
        cond_fn: ``cond_fn(carry) -> scalar tensor`` (nonzero: go on), called once on
            stand-ins with the structure, axes and dtypes of ``init``.
        body_fn: ``body_fn(carry) -> new_carry``, called once on the same stand-ins;
            ``new_carry`` keeps each carry's axes (in any order) and dtype.
        init: the initial carry: a tensor or a tuple of tensors.
        max_steps: at most this many steps are run (the loop stops then even if
            ``cond_fn`` still holds); ``None`` for no bound. The reverse derivative
            (``be.deriv``) needs it.

    Returns the final carry, in the structure of ``init``. Any op the functions read
    that does not depend on ``carry`` is an input of the loop (computed once, before).
    """
    if max_steps is not None and (int(max_steps) != max_steps or max_steps < 1):
        raise ArgumentError(f"while_loop: max_steps is {max_steps!r}; give a positive "
                            f"integer or None (at {user_location()})")
    carries, one = _as_tuple(init, "init", "while_loop")
    c_in = _stand_ins(carries, "carry")
    arg = c_in[0] if one else tuple(c_in)
    pred = _check_predicate(cond_fn(arg), "cond_fn's result", "while_loop")
    new, one_new = _as_tuple(body_fn(arg), "the body's new carry", "while_loop")
    if len(new) != len(carries) or one_new != one:
        raise ArgumentError(f"while_loop: the body returned {len(new)} carries for "
                            f"{len(carries)} (the structure of init must be kept; "
                            f"while_loop called at {user_location()})")
    new = [_fit_carry(k, n, c, "while_loop")
           for k, (n, c) in enumerate(zip(new, c_in))]
    closures, k_in, results, deps = _close(c_in, [pred] + new, "while_loop")
    inputs = c_in + k_in
    op = WhileLoop(*carries, *closures, pred=Subgraph(inputs, results[:1]),
                   body=Subgraph(inputs, results[1:]), max_steps=max_steps, follows=deps)
    return op.outputs[0] if one else tuple(op.outputs)


@evaluator(WhileLoop)
def _while_value(op, *values):
    nc = op.n_carries
    carries, closures = [np.asarray(v) for v in values[:nc]], list(values[nc:])
    steps = 0
    while (op.max_steps is None or steps < op.max_steps) and \
            np.asarray(op.pred(*carries, *closures)[0]) != 0:
        carries = [np.asarray(v) for v in op.body(*carries, *closures)]
        steps += 1
    return carries


def masked_scan(op: WhileLoop) -> Scan:
    """The loop as a :class:`Scan` of ``op.max_steps`` steps over an axis of its own,
    with one more carry, ``active`` (int32, 1 at first): each step computes ``go =
    active and pred(carry)``, and the carry becomes ``body(carry)`` where ``go``, else
    stays (a ``where``, so a value the body computes past the loop's end, infinite or
    NaN, does no harm). Its final carries are the loop's."""
    nc = op.n_carries
    c_in, k_in = op.body.inputs[:nc], op.body.inputs[nc:]
    active = Placeholder(Axes(), dtype=np.int32, name="active")
    go = Select(op.pred.results[0], active, 0)
    new = [Select(go, b, c) for b, c in zip(op.body.results, c_in)]
    body = ScanBody(list(c_in) + [active], (), k_in,
                    [_laid_out(n, c.axes) for n, c in zip(new, c_in)] + [go], ())
    steps = Axis(op.max_steps, f"{op.name}_step")
    return Scan(*op.args[:nc], Constant(1, dtype=np.int32), *op.args[nc:], body=body,
                axis=steps)


@adjoint_rule(WhileLoop)
def _while_adjoint(op, deltas):
    """The reverse derivative of :func:`masked_scan` (which stores the carries entering
    each of the ``max_steps`` steps); ``max_steps=None`` is an error."""
    if op.max_steps is None:
        raise ArgumentError(
            f"WhileLoop {op.name} (built at {op.file_info}): the reverse derivative of a "
            f"while_loop needs max_steps (the carries of every step are stored, in a "
            f"buffer of max_steps steps); give while_loop(..., max_steps=N), or use "
            f"be.jvp (forward mode needs no bound)")
    nc = op.n_carries
    scan = masked_scan(op)
    deltas = list(deltas) + [None] * (nc - len(deltas))
    d = ADJOINTS.find(scan)(scan, deltas[:nc] + [None])
    return list(d[:nc]) + list(d[nc + 1:])


@forward_rule(WhileLoop)
def _while_tangent(op, ts):
    """A while loop over (carry, tangent of carry): the predicate reads the carries, the
    body computes the new carries and their tangents (the body's Jacobian-vector
    product)."""
    nc = op.n_carries
    directions, ts = _tangents_of(ts, op.args)
    if all(t is None for t in ts):
        return None
    args, inputs = op.args, op.body.inputs
    fc = [k for k in range(nc) if _float(args[k])]
    dt = {k: _common_dtype([args[k], ts[k]]) for k in fc}
    ts = [None if t is None else _laid_out(t, a.axes + directions)
          for t, a in zip(ts, args)]
    for k in fc:  # every float carry has a tangent carry (zeros when none is given)
        ts[k] = _zeros(args[k].axes + directions, dt[k]) if ts[k] is None else \
            _cast(ts[k], dt[k])
    seeds, t_in, pos = _jvp_seeds(inputs, ts, directions)
    n_tc = sum(1 for j in pos if j < nc)
    new_in = list(inputs[:nc]) + t_in[:n_tc] + list(inputs[nc:]) + t_in[n_tc:]
    tangents = _tangent_results(op.body.results, seeds, directions, dt)
    new = WhileLoop(*args[:nc], *[ts[j] for j in pos[:n_tc]], *args[nc:],
                    *[ts[j] for j in pos[n_tc:]],
                    pred=Subgraph(new_in, op.pred.results),
                    body=Subgraph(new_in, list(op.body.results) + tangents),
                    max_steps=op.max_steps)
    out: list = [None] * nc
    for i, k in enumerate(fc):
        out[k] = new.outputs[nc + i]
    return tuple(out)
