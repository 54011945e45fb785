"""Forward-mode derivatives: ``jvp`` and the table of forward (tangent) rules.

:data:`FORWARD` maps an op class to ``fn(op, tangents) -> tangent``. ``tangents`` holds
one entry per arg of ``op``: an op, or ``None`` where the arg's tangent is zero (the arg
does not depend on the inputs). The rule returns the tangent of ``op``'s value, or
``None`` for zero. It sits next to the op's reverse rule in
:data:`geon.op_graph.autodiff.ADJOINTS`: every class there has an entry here too.

Tangents may carry *direction axes*: :func:`geon.op_graph.jacobian.jacobian` pushes many
directions at once by giving the input a tangent with extra axes (one direction per
index of the extra axes). The tangent of every op then has the op's axes followed by
those extra axes, in that order; :func:`fit_tangent` brings a rule's result to that
layout in one place (broadcasting by name where the result lacks axes, reordering
where it has them in another order). Rules built from ops that match operands by name
(elementwise ops, ``dot``, reductions) handle direction axes without any care; rules
that read operands by position use :func:`direction_axes` to keep them trailing.

This module is the engine only: every op module registers its rules into
:data:`FORWARD` (``geon.op_graph.tables``) where it defines its classes, and this
module imports none of them (it builds only the core's ops).
"""

from typing import Any, Sequence, Union

import numpy as np

from geon.errors import ArgumentError, AxisMismatchError, GeonError
from geon.op_graph.core import (DEFAULT_DTYPE, AssignableTensorOp, Constant, Op, TensorOp,
                                _fmt, as_op, snap, toposort)
from geon.op_graph.core_ops import AxesWithOrder, Broadcast, MultiOutput, StopGradient, Sum
from geon.op_graph.autodiff import deriv, find_rule
from geon.op_graph.derivatives import direction_axes, terms  # noqa: F401 (for rules)
from geon.op_graph.axes import Axes
from geon.op_graph.nodes import user_location
from geon.op_graph.tables import FORWARD, forward_rule

__all__ = ["FORWARD", "LinearizationPoint", "direction_axes", "fit_tangent",
           "forward_from_reverse", "forward_rule", "hvp", "jvp", "propagate", "terms"]


def fit_tangent(t, op, directions=Axes()):
    """``t`` laid out as ``op.axes + directions`` (broadcast by name, reordered).

    A tangent with axes that the op lacks is a bug in a forward rule: it raises.
    """
    target = op.axes + directions
    if t.axes.names == target.names:
        return t
    stray = t.axes - target
    if len(stray):
        raise GeonError(f"forward rule of {type(op).__name__} {op.name} returned a "
                        f"tangent with axes {stray!r} that the op ({op.axes!r}) lacks "
                        f"(built at {op.file_info})")
    if t.axes.same_set(target):
        return AxesWithOrder(t, target)
    return Broadcast(t, target)


def _float_dtype(op):
    return op.dtype if op.dtype.kind == "f" else DEFAULT_DTYPE


def propagate(outputs, seeds, directions=Axes()):
    """``{op: tangent}`` for the ops ``outputs`` depend on, pushing ``seeds``
    (``{input op: tangent laid out as input.axes + directions}``) forward in
    topological order. Ops without an entry have a zero tangent."""
    order = toposort(outputs, deps=False)
    tangents = {}
    for op in order:
        if op in seeds:
            tangents[op] = seeds[op]
            continue
        if isinstance(op, (AssignableTensorOp, StopGradient)) or not op.args:
            continue
        ts = [tangents.get(a) for a in op.args]
        if all(t is None for t in ts):
            continue
        rule = find_rule(FORWARD, op)
        if rule is None:
            raise GeonError(f"jvp: no forward rule for {type(op).__name__} {op.name} "
                            f"(built at {op.file_info})")
        t = rule(op, ts)
        if t is None:
            continue
        if isinstance(op, MultiOutput):  # one tangent per output (None: zero)
            tangents[op] = tuple(None if ti is None else
                                 fit_tangent(as_op(ti), out, directions)
                                 for ti, out in zip(t, op.outputs))
        else:
            tangents[op] = fit_tangent(as_op(t), op, directions)
    return tangents


def _as_list(x):
    if isinstance(x, (list, tuple)):
        return list(x), False
    return [x], True


def _seed(x, t):
    """The tangent ``t`` given for input ``x`` as an op with ``x``'s axes in order."""
    if not isinstance(t, Op):
        arr = np.asarray(t, dtype=_float_dtype(x))
        t = Constant(arr, axes=x.axes if arr.ndim else None, dtype=arr.dtype)
    if len(t.axes - x.axes):
        raise AxisMismatchError(f"jvp: tangent {t.name} ({_fmt(t.axes)}) has axes that "
                                f"input {x.name} ({_fmt(x.axes)}) lacks (at "
                                f"{user_location()})")
    return fit_tangent(t, x)


def jvp(outputs: Union[TensorOp, Sequence[TensorOp]],
        inputs: Union[TensorOp, Sequence[TensorOp]], tangents: Any) -> Any:
    """Jacobian-vector products (forward mode).

    Builds ops for ``sum_i d outputs / d inputs[i] . tangents[i]``: how each output
    changes when every input moves along its tangent.

    Args:
        outputs: an op or a list of ops (any axes).
        inputs: an op or a list of ops (usually variables or placeholders; any op
            may be used, its own dependencies are then ignored).
        tangents: one per input: an op with the input's axes (or fewer; it is
            broadcast), an array of the input's shape, or a number.

    Returns an op with the output's axes (a list for a list of outputs); an output
    that does not depend on the inputs gets zeros. ``stop_gradient`` blocks
    tangents as it blocks :func:`geon.deriv`.
    """
    outs, single = _as_list(outputs)
    ins, one_in = _as_list(inputs)
    ts = [tangents] if one_in else _as_list(tangents)[0]
    if len(ts) != len(ins):
        raise ArgumentError(f"jvp: {len(ins)} input(s) but {len(ts)} tangent(s) (at "
                            f"{user_location()})")
    outs = [snap(as_op(o)) for o in outs]
    seeds = {}
    for x, t in zip(ins, ts):
        x = snap(as_op(x))
        seeds[x] = _seed(x, t)
    found = propagate(outs, seeds)
    result = [found.get(o) if found.get(o) is not None
              else Constant(0.0, axes=o.axes, dtype=_float_dtype(o)) for o in outs]
    return result[0] if single else result


def hvp(c: TensorOp, wrt: Union[TensorOp, Sequence[TensorOp]],
        vectors: Any) -> Any:
    """Hessian-vector products of the scalar ``c``: forward mode over reverse mode.

    ``hvp(c, w, v)`` is ``jvp(deriv(c, w), w, v)``: the derivative of the gradient of
    ``c`` along ``v``, an op with ``w``'s axes. With lists ``wrt = [w1, w2]`` and
    ``vectors = [v1, v2]`` it returns a list: entry ``i`` is
    ``sum_j d^2 c / dwi dwj . vj``.
    """
    ws, single = _as_list(wrt)
    vs = [vectors] if single else list(vectors)
    grads = [deriv(c, w) for w in ws]
    out = jvp(grads, ws, vs)
    return out[0] if single else out


# --- forward rules derived from reverse rules ------------------------------------------------
class LinearizationPoint(Constant):
    """Zeros that derivatives flow through (a constant for evaluation, not for
    ``deriv``): the point at which a linear map built by a
    reverse rule is differentiated to obtain its transpose."""

    is_constant = False


def forward_from_reverse(reverse):
    """A forward rule computed from the reverse rule ``reverse(op, delta) -> deltas``.

    A reverse rule is the linear map ``delta -> J^T delta``. For a zero ``u`` with the
    op's axes (plus any direction axes), ``s = sum_i <J_i^T u, t_i>`` is linear in ``u``
    and ``d s / d u = sum_i J_i t_i``, the tangent. This needs reverse rules for the ops
    the reverse rule builds, and, for tangents with direction axes (Jacobians), a
    reverse rule that matches its delta by name (elementwise ones do).
    """
    def rule(op, ts):
        extra = Axes()
        for t, a in zip(ts, op.args):
            if t is not None:
                extra = direction_axes(t, a)
                break
        u = LinearizationPoint(0.0, axes=op.axes + extra, dtype=_float_dtype(op))
        deltas = reverse(op, u)
        s = None
        for t, a, d in zip(ts, op.args, deltas):
            if t is None or d is None:
                continue
            d = fit_tangent(_sum_extra(as_op(d), a, extra), a, extra)
            prod = d * t
            term = Sum(prod, reduction_axes=prod.axes)
            s = term if s is None else s + term
        return None if s is None else deriv(s, u)
    name = getattr(reverse, "__name__", "a reverse rule")
    rule.__doc__ = f"Forward rule derived from {name}."
    return rule


def _sum_extra(d, arg, extra):
    """``d`` summed over axes that neither ``arg`` nor the direction axes have."""
    stray = d.axes - (arg.axes + extra)
    return Sum(d, reduction_axes=stray) if len(stray) else d
