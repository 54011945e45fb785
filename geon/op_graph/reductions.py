"""Contractions and reductions over named axes: :class:`Dot` (sums over the axes its
operands share), the reductions beyond :class:`~geon.op_graph.core_ops.Sum`
(``prod``, ``max``, ``min``, ``argmax``, ``argmin``, ``mean``, ``variance``),
:class:`TensorSize` and :class:`MaxArgMax`, with their derivatives and reference
values."""

from typing import Any, Optional

import numpy as np

from geon.errors import ArgumentError, AxisMismatchError
from geon.op_graph import nodes
from geon.op_graph.axes import NO_AXES, AxesLike, as_axes, check_lengths
from geon.op_graph.core import (DEFAULT_DTYPE, FAMILY_HOOKS, ComputationOp, TensorLike, TensorOp,
                                _fmt, _mismatch, as_op)
from geon.op_graph.core_ops import (REDUCERS, Broadcast, MultiOutput, Reduction, Sum,
                                    reduce_layout, reduction_split)
from geon.op_graph.derivatives import terms, zero_adjoint, zero_tangent
from geon.op_graph.elementwise import Divide, Equal
from geon.op_graph.keywords import _DOT_HINTS, _REDUCE_HINTS, keywords
from geon.op_graph.tables import adjoint_rule, evaluator, forward_rule

#: The names :mod:`geon.op_graph.op_graph` re-exports (``og.X``), private helpers that
#: other modules use as ``og._x`` among them.
__all__ = [
    "ArgMax", "argmax", "ArgMin", "argmin", "Dot", "dot", "_DOT_SPLIT_HINT", "Max",
    "max", "max_argmax", "MaxArgMax", "mean", "Min", "min", "Prod", "prod", "sum",
    "tensor_size", "TensorSize", "variance",
]


class Dot(ComputationOp):
    """Sum of products over the axes ``a`` and ``b`` share, except ``batch_axes``.

    The result has ``a``'s axes that are not summed over (its batch axes among them,
    in ``a``'s order) followed by ``b``'s axes that ``a`` lacks. Each batch axis must be
    an axis of both operands: the product is then taken separately for each index along
    it (a batched matrix product), where without ``batch_axes`` the shared axis would be
    summed over."""

    attrs = ("batch_axes", "dtype")

    def __init__(self, a, b, batch_axes=NO_AXES, **kwargs):
        hook = FAMILY_HOOKS.get("dot")
        if hook is not None:  # operands of other op families are refused
            hook(a, b)
        self.batch_axes = as_axes(batch_axes)
        super().__init__(a, b, **kwargs)

    def _infer_axes(self):
        a, b = self.args
        check_lengths([(a.name, a.axes), (b.name, b.axes)], f"Dot {self.name}", self._where())
        shared = a.axes & b.axes
        missing = self.batch_axes - shared
        if len(missing):
            raise _mismatch(self, f"batch_axes ({_fmt(missing)}) must be axes of both "
                                  f"operands", [a, b])
        check_lengths([("batch_axes", self.batch_axes), (a.name, a.axes)],
                      f"Dot {self.name}", self._where())
        # the batch axes in a's order: how they appear in the result
        self.batch_axes = a.axes & self.batch_axes
        return (a.axes - (shared - self.batch_axes)) + (b.axes - shared)

    @property
    def reduction_axes(self):
        """The axes summed over: those the operands share, less the batch axes."""
        return (self.args[0].axes & self.args[1].axes) - self.batch_axes


_DOT_SPLIT_HINT = "give batch_axes= (the shared axes to keep) or reduction_axes= (the " \
                  "shared axes to sum over), not both"


@keywords(_DOT_HINTS)
def dot(a: TensorLike, b: TensorLike, batch_axes: Optional[AxesLike] = None,
        reduction_axes: Optional[AxesLike] = None, **kwargs: Any) -> TensorOp:
    """Contract ``a`` and ``b`` over their shared axes (see ``Dot``).

    ``batch_axes=`` names shared axes to keep instead: the result has one product per
    index along them (a batched matrix product, ``np.matmul``'s leading dimensions).
    ``reduction_axes=`` says the same from the other side: the shared axes to sum over,
    every other shared axis being kept as a batch axis."""
    if reduction_axes is not None:
        if batch_axes is not None:
            raise ArgumentError(f"be.dot: {_DOT_SPLIT_HINT}")
        a, b = as_op(a), as_op(b)
        red = as_axes(reduction_axes)
        shared = a.axes & b.axes
        if len(red - shared):
            raise AxisMismatchError(
                f"Dot: reduction_axes ({_fmt(red - shared)}) must be axes of both "
                f"operands; operands: {a.name} ({_fmt(a.axes)}); {b.name} "
                f"({_fmt(b.axes)}) (built at {nodes.user_location()})")
        batch_axes = shared - red
    return Dot(a, b, batch_axes=NO_AXES if batch_axes is None else batch_axes, **kwargs)


@adjoint_rule(Dot)
def _dot_adjoint(op, d):  # batched products too: the batch axes stay batch axes
    a, b = op.args
    s = op.batch_axes
    return Dot(d, b, batch_axes=s), Dot(a, d, batch_axes=s)


@forward_rule(Dot)
def _dot_tangent(op, ts):
    a, b = op.args
    s = op.batch_axes
    return terms((ts[0], lambda t: Dot(t, b, batch_axes=s)),
                 (ts[1], lambda t: Dot(a, t, batch_axes=s)))


@evaluator(Dot)
def _dot_value(op, a, b):
    letters = {}
    for n in op.args[0].axes.names + op.args[1].axes.names:
        letters.setdefault(n, chr(ord("a") + len(letters)) if len(letters) < 26
                           else chr(ord("A") + len(letters) - 26))
    spec = "".join(letters[n] for n in op.args[0].axes.names) + "," + \
        "".join(letters[n] for n in op.args[1].axes.names) + "->" + \
        "".join(letters[n] for n in op.axes.names)
    return np.einsum(spec, a, b).astype(op.dtype)


# --- reductions ------------------------------------------------------------------------

class Prod(Reduction): """Product over the reduction axes."""
class Max(Reduction): """Maximum over the reduction axes."""
class Min(Reduction): """Minimum over the reduction axes."""


class ArgMax(Reduction):
    """Index (row-major over the reduction axes) of the maximum; int64."""

    def _infer_dtype(self):
        return np.dtype(np.int64)


class ArgMin(ArgMax):
    """Index (row-major over the reduction axes) of the minimum; int64."""


@keywords(_REDUCE_HINTS)
def sum(x: TensorLike,  # noqa: A001 - the public name
        reduction_axes: Optional[AxesLike] = None, out_axes: Optional[AxesLike] = None,
        **kw: Any) -> TensorOp:
    """Sum (see ``Reduction`` for the axes rule)."""
    return Sum(x, reduction_axes, out_axes, **kw)


@keywords(_REDUCE_HINTS)
def prod(x: TensorLike, reduction_axes: Optional[AxesLike] = None,
         out_axes: Optional[AxesLike] = None, **kw: Any) -> TensorOp:
    """Product (see ``Reduction``)."""
    return Prod(x, reduction_axes, out_axes, **kw)


@keywords(_REDUCE_HINTS)
def max(x: TensorLike, reduction_axes: Optional[AxesLike] = None,
        out_axes: Optional[AxesLike] = None, **kw: Any) -> TensorOp:  # noqa: A001
    """Maximum (see ``Reduction``)."""
    return Max(x, reduction_axes, out_axes, **kw)


@keywords(_REDUCE_HINTS)
def min(x: TensorLike, reduction_axes: Optional[AxesLike] = None,
        out_axes: Optional[AxesLike] = None, **kw: Any) -> TensorOp:  # noqa: A001
    """Minimum (see ``Reduction``)."""
    return Min(x, reduction_axes, out_axes, **kw)


@keywords(_REDUCE_HINTS)
def argmax(x: TensorLike, reduction_axes: Optional[AxesLike] = None,
           out_axes: Optional[AxesLike] = None, **kw: Any) -> TensorOp:
    """Index of the maximum (see ``Reduction``)."""
    return ArgMax(x, reduction_axes, out_axes, **kw)


@keywords(_REDUCE_HINTS)
def argmin(x: TensorLike, reduction_axes: Optional[AxesLike] = None,
           out_axes: Optional[AxesLike] = None, **kw: Any) -> TensorOp:
    """Index of the minimum (see ``Reduction``)."""
    return ArgMin(x, reduction_axes, out_axes, **kw)


@keywords(_REDUCE_HINTS)
def tensor_size(x: TensorLike, reduction_axes: Optional[AxesLike] = None,
                out_axes: Optional[AxesLike] = None) -> TensorOp:
    """The number of elements a reduction of ``x`` with these axes combines, as an op."""
    return TensorSize(x, reduction_axes, out_axes)


@keywords(_REDUCE_HINTS)
def mean(x: TensorLike, reduction_axes: Optional[AxesLike] = None,
         out_axes: Optional[AxesLike] = None, **kw: Any) -> TensorOp:
    """Mean (see ``Reduction``)."""
    s = Sum(x, reduction_axes, out_axes)
    return Divide(s, TensorSize(x, s.reduction_axes, None), **kw)  # kw name the mean


@keywords(_REDUCE_HINTS)
def variance(x: TensorLike, reduction_axes: Optional[AxesLike] = None,
             out_axes: Optional[AxesLike] = None, **kw: Any) -> TensorOp:
    """Population variance, ``mean((x - mean(x))**2)`` (see ``Reduction``)."""
    m = mean(x, reduction_axes, out_axes)
    d = x - m
    return mean(d * d, m.args[0].reduction_axes, m.axes, **kw)


class TensorSize(ComputationOp):
    """The element count of ``x`` over its reduction axes (a scalar, folded to a
    constant when the graph is transformed)."""

    attrs = ("reduction_axes", "dtype")

    def __init__(self, x, reduction_axes=None, out_axes=None, **kwargs):
        super().__init__(x, axes=(), **kwargs)
        x = self.args[0]  # by default the size of all of x
        self.reduction_axes, _ = reduction_split(x, reduction_axes, out_axes, self,
                                                 default=x.axes)

    def _infer_dtype(self):
        return DEFAULT_DTYPE


class MaxArgMax(MultiOutput):
    """The maximum over the reduction axes and where it is (row-major index over them),
    from one pass over ``x`` (see ``Reduction`` for the axes rule)."""

    attrs = ("reduction_axes", "out_axes")

    def __init__(self, x, reduction_axes=None, out_axes=None, **kwargs):
        self._spec = (reduction_axes, out_axes)
        super().__init__(x, **kwargs)

    def _output_types(self):
        x = self.args[0]
        self.reduction_axes, self.out_axes = reduction_split(x, *self._spec, self)
        return [(self.out_axes, x.dtype), (self.out_axes, np.dtype(np.int64))]


@keywords(_REDUCE_HINTS)
def max_argmax(x: TensorLike, reduction_axes: Optional[AxesLike] = None,
               out_axes: Optional[AxesLike] = None) -> tuple[TensorOp, ...]:
    """``(max, argmax)`` of ``x`` over the reduction axes, computed together."""
    return MaxArgMax(x, reduction_axes, out_axes).outputs


REDUCERS.update({Prod: np.prod, Max: np.max, Min: np.min, ArgMax: np.argmax,
                 ArgMin: np.argmin})


def others_product(x, total, product, expand):
    """For each element of ``x``, the product of the other elements of the product it
    takes part in (its derivative); ``total`` and ``product`` reduce like the product
    op, ``expand`` broadcasts a reduced value back to ``x``'s shape. ``op / x`` would be
    NaN where ``x`` is 0, so it is ``p / x`` where no element is 0 (``p``: the product
    of the nonzero elements), ``p`` at the zero where exactly one is, and 0 everywhere
    else."""
    zero = Equal(x, 0.0)
    nonzero = x + zero  # the zeros replaced by ones
    others_zero = expand(total(zero)) - zero  # zeros among the others
    return Equal(others_zero, 0.0) * expand(product(nonzero)) / nonzero


def prod_of_others(op):
    """:func:`others_product` for the :class:`Prod` ``op``."""
    x, red = op.args[0], op.reduction_axes
    return others_product(x, lambda v: Sum(v, reduction_axes=red),
                          lambda v: Prod(v, reduction_axes=red),
                          lambda v: Broadcast(v, x.axes))


def tied_mean(hit, t, red):
    """The mean of tangent ``t`` over the positions ``hit`` marks along ``red`` (the
    tied extremes of a max or min)."""
    return Sum(hit * t, reduction_axes=red) / Sum(hit, reduction_axes=red)


@adjoint_rule(Prod)
def _prod_adjoint(op, d): return (d * prod_of_others(op),)
@forward_rule(Prod)
def _prod_tangent(op, ts):  # d prod(x) = sum(prod(others) * dx)
    return Sum(ts[0] * prod_of_others(op), reduction_axes=op.reduction_axes)
@adjoint_rule(Max, Min)
def _maxmin_adjoint(op, d):
    hit = Equal(op.args[0], op)  # tied extremes share the derivative equally
    return (hit * (d / Sum(hit, reduction_axes=op.reduction_axes)),)
@forward_rule(Max, Min)
def _maxmin_tangent(op, ts):  # the mean tangent of the tied extremes
    return tied_mean(Equal(op.args[0], op), ts[0], op.reduction_axes)


adjoint_rule(ArgMax, TensorSize)(zero_adjoint)
forward_rule(ArgMax, TensorSize)(zero_tangent)


@evaluator(TensorSize)
def _tensor_size_value(op, x):
    return np.asarray(op.reduction_axes.size if len(op.reduction_axes) else 1,
                      dtype=op.dtype)


@adjoint_rule(MaxArgMax)
def _max_argmax_adjoint(op, d):
    if d[0] is None:
        return (None,)
    hit = Equal(op.args[0], op.outputs[0])  # tied maxima share the derivative
    return (hit * (d[0] / Sum(hit, reduction_axes=op.reduction_axes)),)


@forward_rule(MaxArgMax)
def _max_argmax_tangent(op, ts):
    hit = Equal(op.args[0], op.outputs[0])
    return (tied_mean(hit, ts[0], op.reduction_axes), None)


@evaluator(MaxArgMax)
def _max_argmax_value(op, x):
    flat = reduce_layout(op.args[0].axes, op.reduction_axes, op.out_axes, x)
    return np.max(flat, axis=-1), np.argmax(flat, axis=-1).astype(np.int64)
