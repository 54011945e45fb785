"""Reverse-mode derivatives: ``deriv(c, w)`` and the table of adjoint rules.

A rule receives the op and the adjoint ``delta`` of its value (an op with the op's axes,
in the op's order) and returns one delta per arg (``None`` where no derivative flows).
A returned delta may have axes the arg lacks (summed away) or lack axes the arg has
(broadcast); :func:`_fit` does that, in this one place, as it accumulates.

This module is the engine only: every op module registers its rules into
:data:`ADJOINTS` (``geon.op_graph.tables``) where it defines its classes, and this
module imports none of them (it builds only the core's ops).
"""

from typing import Optional, Union, overload

from geon.errors import ArgumentError, AxisMismatchError, GeonError
from geon.op_graph.core import (AssignableTensorOp, Constant, Placeholder, TensorLike,
                                TensorOp, Variable, _fmt, as_op, snap, toposort)
from geon.op_graph.core_ops import AxesWithOrder, Broadcast, MultiOutput, StopGradient, Sum
from geon.op_graph.nodes import no_gc, rewriting, user_location
from geon.op_graph.tables import ADJOINTS, OpTable, adjoint_rule

__all__ = ["ADJOINTS", "adjoint_rule", "adjoints", "deriv", "find_rule", "gradients"]


def find_rule(table, op):
    """The rule for ``type(op)`` or its nearest registered base class, or ``None``."""
    return OpTable.find(table, op)


def _fit(d, arg):
    """``d`` summed over axes ``arg`` lacks, broadcast to axes it lacks, in arg's order."""
    extra = d.axes - arg.axes
    if len(extra):
        d = Sum(d, reduction_axes=extra)
    if len(arg.axes - d.axes):
        return Broadcast(d, arg.axes)
    if d.axes.names != arg.axes.names:
        return AxesWithOrder(d, arg.axes)
    return d


def _needs_grad(order, source=None):
    """Ops whose value depends on some non-constant storage or on ``source`` (through
    args)."""
    needs = set()
    for op in order:
        if op is source:
            needs.add(op)
        elif isinstance(op, AssignableTensorOp):
            if not op.is_constant:
                needs.add(op)
        elif not isinstance(op, StopGradient) and any(a in needs for a in op.args):
            needs.add(op)
    return needs


def adjoints(c, error=None, source=None):
    """``{op: d c / d op}`` for every op ``c`` depends on through variables or
    placeholders (and through ``source``, an op whose value depends on neither, such as
    a :class:`~geon.op_graph.op_graph.Constant`, if given); built once per ``(c, error,
    source)`` and cached on ``c``."""
    c = snap(as_op(c))
    cache = c.__dict__.setdefault("_adjoint_cache", {})
    key = None if error is None else id(error)
    if source is not None:
        key = (key, source)
    hit = cache.get(key)
    if hit is not None and hit[0] is error:
        return hit[1]
    if error is None:
        if len(c.axes):
            raise ArgumentError(
                f"deriv: {type(c).__name__} {c.name} (built at {c.file_info}) has axes "
                f"({_fmt(c.axes)}); a non-scalar cost needs error= (an op with the same "
                f"axes) (deriv called at {user_location()})")
        delta = Constant(1.0, dtype=c.dtype)
    else:
        delta = as_op(error)
        if not delta.axes.same_set(c.axes):
            raise AxisMismatchError(
                f"deriv: error= {type(delta).__name__} {delta.name} has axes "
                f"({_fmt(delta.axes)}) but the cost {type(c).__name__} {c.name} (built "
                f"at {c.file_info}) has ({_fmt(c.axes)}); they must be the same axes, "
                f"in any order (deriv called at {user_location()})")
        delta = _fit(delta, c)
    with no_gc():
        adj = _reverse_walk(c, delta, source)
    cache[key] = (error, adj)
    return adj


def _reverse_walk(c, delta, source=None):
    order = toposort([c], deps=False)
    needs = _needs_grad(order, source)
    adj = {c: delta}
    for op in reversed(order):
        d = adj.get(op)
        if d is None or op not in needs or isinstance(op, AssignableTensorOp):
            continue
        rule = find_rule(ADJOINTS, op)
        if rule is None:
            raise GeonError(f"deriv: no derivative rule for {type(op).__name__} {op.name} "
                            f"(built at {op.file_info})")
        # The adjoint ops read what ``op`` read, when ``op`` read it: they take its
        # other_deps (not the user_deps of assignments built since) and its location.
        with rewriting(op, by_pass=False):
            _accumulate(adj, op, rule(op, d), needs)
    return adj


def _accumulate(adj, op, deltas, needs):
    for arg, da in zip(op.args, deltas):
        if da is None or arg not in needs:
            continue
        if isinstance(arg, MultiOutput):
            # A multi-output op's adjoint is a list: one entry per output.
            out = arg.outputs[op.index]
            parts = adj.setdefault(arg, [None] * len(arg.outputs))
            da = _fit(da, out)
            parts[op.index] = da if parts[op.index] is None else parts[op.index] + da
            continue
        da = _fit(da, arg)
        prev = adj.get(arg)
        adj[arg] = da if prev is None else prev + da


#: What :func:`deriv` takes for several variables: a list or a tuple of ops. (Lists
#: are invariant, so the usual kinds of list are named: ``list[Variable]``, from
#: ``TensorOp.variables()``, is no ``list[TensorOp]``.)
SeveralOps = Union[list[TensorOp], list[Variable], list[Placeholder],
                   tuple[TensorOp, ...]]


@overload
def deriv(c: TensorOp, w: TensorOp,
          error: Optional[TensorLike] = None) -> TensorOp: ...
@overload
def deriv(c: TensorOp, w: SeveralOps,
          error: Optional[TensorLike] = None) -> list[TensorOp]: ...


def deriv(c: TensorOp, w: Union[TensorOp, SeveralOps],
          error: Optional[TensorLike] = None) -> Union[TensorOp, list[TensorOp]]:
    """The derivative of ``c`` with respect to ``w``, an op with ``w``'s axes.

    ``c`` must be a scalar unless ``error`` (an op with ``c``'s axes, the adjoint to
    propagate) is given. If ``c`` does not depend on ``w`` the result is zeros. For a
    list (or tuple) ``w`` the result is a list, one derivative per entry, all from one
    reverse pass.
    """
    if isinstance(w, (list, tuple)):
        return [deriv(c, wi, error) for wi in w]
    w = as_op(w)
    s = snap(w)
    d = adjoints(c, error).get(s)
    if d is None and not (isinstance(s, AssignableTensorOp) and not s.is_constant):
        # ``w`` may depend on constants only (a Constant, an op of constants): the walk
        # above skipped it; walk again from it.
        d = adjoints(c, error, source=s).get(s)
    if d is None:
        return Constant(0.0, axes=w.axes, dtype=snap(as_op(c)).dtype)
    return d


def gradients(c: TensorOp,
              error: Optional[TensorLike] = None) -> dict[Variable, TensorOp]:
    """``{variable: deriv(c, variable)}`` over ``c.variables()`` (the trainable
    variables ``c`` depends on, in graph order)."""
    c = snap(as_op(c))
    return {v: deriv(c, v, error) for v in c.variables()}
