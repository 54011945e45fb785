"""The core's ops: the few Axes ops that the engines themselves build. Reverse mode
sums a delta over the axes its arg lacks and broadcasts or reorders it to the arg's
axes (:class:`Sum`, :class:`Broadcast`, :class:`AxesWithOrder`, and :class:`CastAxes`
to rename axes); every engine stops at
:class:`StopGradient` and reads the values of a :class:`MultiOutput` op through its
:class:`Output` ops. Each op's derivatives and reference value are registered beside
it; the other reductions (:mod:`~geon.op_graph.reductions`) extend :class:`Reduction`.
"""

from typing import Any

import numpy as np

from geon.op_graph.axes import AxesLike, as_axes, check_lengths
from geon.op_graph.core import (OPERATORS, ComputationOp, DTypeLike, Op, TensorLike, TensorOp,
                                _fmt, _mismatch, primitive)
from geon.op_graph.derivatives import direction_axes, same_adjoint, same_tangent, zero_tangent
from geon.op_graph.keywords import keywords
from geon.op_graph.special import align
from geon.op_graph.tables import adjoint_rule, evaluator, forward_rule

#: The names :mod:`geon.op_graph.op_graph` re-exports (``og.X``), private helpers that
#: other modules use as ``og._x`` among them.
__all__ = [
    "axes_with_order", "AxesWithOrder", "Broadcast", "broadcast", "cast_axes",
    "CastAxes", "MultiOutput", "Output", "Reduction", "reduction_split",
    "stop_gradient", "StopGradient", "Sum",
]


# --- reductions ------------------------------------------------------------------------

class Reduction(ComputationOp):
    """Reduce ``x`` over ``reduction_axes``. By default every axis but the batch and
    recurrent ones is reduced; ``out_axes=`` (or ``axes=``, the result's axes) names the
    axes to keep (in that order)."""

    attrs = ("reduction_axes", "axes", "dtype")

    def __init__(self, x, reduction_axes=None, out_axes=None, axes=None, **kwargs):
        if axes is not None and out_axes is not None:
            raise TypeError(f"{type(self).__name__}: give out_axes or axes, not both")
        self._red_spec = reduction_axes
        self._out_spec = out_axes if axes is None else axes
        super().__init__(x, **kwargs)

    def _infer_axes(self):
        self.reduction_axes, out = reduction_split(
            self.args[0], self._red_spec, self._out_spec, self)
        del self._red_spec, self._out_spec
        return out


def reduction_split(x, red, out, op, default=None):
    """``(reduction axes in x's order, result axes)`` for reducing ``x`` with the given
    ``red`` / ``out`` (either may be ``None``; ``default`` is the reduction axes when both
    are: all but batch and recurrent axes unless given). Errors name ``op``."""
    if red is not None and out is not None:
        red, out = as_axes(red), as_axes(out)
        if not (red + out).same_set(x.axes):
            raise _mismatch(op, f"reduction_axes ({_fmt(red)}) and out_axes "
                                f"({_fmt(out)}) must split the input's axes", [x])
    elif red is not None:
        red = as_axes(red)
        out = x.axes - red
    elif out is not None:
        out = as_axes(out)
        red = x.axes - out
    else:
        red = x.axes.sample_axes() if default is None else as_axes(default)
        out = x.axes - red
    missing = (red | out) - x.axes
    if len(missing):
        raise _mismatch(op, f"axes {_fmt(missing)} are not in the input", [x])
    check_lengths([("input", x.axes), ("reduction/out axes", red + out)],
                  f"{type(op).__name__} {op.name}", op._where())
    return x.axes & red, out


class Sum(Reduction): """Sum over the reduction axes."""


def reduce_layout(in_axes, red, out_axes, x):
    """``x`` (laid out by ``in_axes``) reshaped to (``out_axes``..., product of ``red``)."""
    keep = [in_axes.index(a) for a in out_axes]
    rpos = [in_axes.index(a) for a in red]
    x = np.transpose(x, keep + rpos)
    # the reduced length explicitly: -1 is ambiguous when some kept axis has length 0
    return x.reshape(out_axes.shape + (int(np.prod([a.length for a in red])),))


#: The NumPy reduction of each Reduction class (the reductions module adds its own).
REDUCERS: dict[type, Any] = {Sum: np.sum}


@evaluator(Reduction)
def _reduction_value(op, x):
    y = REDUCERS[type(op)](reduce_layout(op.args[0].axes, op.reduction_axes, op.axes, x),
                           axis=-1)
    return np.asarray(y).astype(op.dtype)


@adjoint_rule(Sum)
def _sum_adjoint(op, d): return (d,)  # the engine broadcasts it over the reduced axes
@forward_rule(Sum)
def _sum_tangent(op, ts): return Sum(ts[0], reduction_axes=op.reduction_axes)


class Broadcast(TensorOp):
    """``x`` repeated along ``axes`` it lacks; the result has exactly ``axes``."""

    attrs = ("axes",)

    def __init__(self, x, axes, **kwargs):
        super().__init__(x, axes=as_axes(axes), **kwargs)
        x = self.args[0]
        if len(x.axes - self.axes):
            raise _mismatch(self, f"cannot broadcast to ({_fmt(self.axes)})", [x])
        check_lengths([("input", x.axes), ("target", self.axes)], f"Broadcast {self.name}",
                      self._where())

    def _infer_dtype(self):
        return self.args[0].dtype


@keywords()
def broadcast(x: TensorLike, axes: AxesLike) -> TensorOp:
    """Repeat ``x`` along the axes of ``axes`` it lacks, in the order ``axes`` gives."""
    return Broadcast(x, axes)


class AxesWithOrder(TensorOp):
    """``x`` with its axes put in the order ``axes`` gives (a transpose)."""

    attrs = ("axes",)

    def __init__(self, x, axes, **kwargs):
        super().__init__(x, axes=as_axes(axes), **kwargs)
        x = self.args[0]
        if not self.axes.same_set(x.axes):
            raise _mismatch(self, f"({_fmt(self.axes)}) is not a reordering of the input", [x])

    def _infer_dtype(self):
        return self.args[0].dtype


@keywords()
def axes_with_order(x: TensorLike, axes: AxesLike) -> TensorOp:
    """Reorder the axes of ``x`` (the same set of axes in a new order)."""
    return AxesWithOrder(x, axes)


OPERATORS["axes_with_order"] = axes_with_order
adjoint_rule(Broadcast, AxesWithOrder)(same_adjoint)
forward_rule(Broadcast, AxesWithOrder)(same_tangent)


@evaluator(Broadcast)
def _broadcast_value(op, x):
    return np.broadcast_to(align(x, op.args[0].axes, op.axes), op.axes.shape)


@evaluator(AxesWithOrder)
def _reorder_value(op, x):
    names = op.args[0].axes.names
    return np.transpose(x, [names.index(n) for n in op.axes.names])


class CastAxes(TensorOp):
    """``x`` with its axes renamed, position by position; lengths must match."""

    attrs = ("axes",)

    def __init__(self, x, axes, **kwargs):
        super().__init__(x, axes=as_axes(axes), **kwargs)
        x = self.args[0]
        if len(self.axes) != len(x.axes) or (
                self.axes.lengths_known and x.axes.lengths_known
                and self.axes.lengths != x.axes.lengths):
            raise _mismatch(self, f"cannot cast to ({_fmt(self.axes)}): lengths differ", [x])

    def _infer_dtype(self):
        return self.args[0].dtype


@keywords()
def cast_axes(x: TensorLike, axes: AxesLike) -> TensorOp:
    """Give the axes of ``x`` new names (``axes`` position by position)."""
    return CastAxes(x, axes)


@adjoint_rule(CastAxes)
def _cast_adjoint(op, d): return (CastAxes(d, op.args[0].axes),)
@forward_rule(CastAxes)
def _cast_tangent(op, ts):
    t = ts[0]
    return CastAxes(t, op.axes + direction_axes(t, op.args[0]))


@evaluator(CastAxes)
def _cast_value(op, x): return np.array(x)


class StopGradient(TensorOp):
    """The value of ``x``; derivatives do not flow through it."""

    arity = 1

    def _infer_axes(self):
        return self.args[0].axes

    def _infer_dtype(self):
        return self.args[0].dtype


@keywords()
def stop_gradient(x: TensorLike) -> TensorOp:
    """``x``'s value, treated as a constant by :func:`deriv`."""
    return StopGradient(x)


@adjoint_rule(StopGradient)
def _stop_adjoint(op, d): return (None,)
forward_rule(StopGradient)(zero_tangent)


@evaluator(StopGradient)
def _stop_value(op, x): return np.array(x)


# --- ops with several results ----------------------------------------------------------

class MultiOutput(Op):
    """An op that computes several values at once.

    It has no value of its own: ``outputs`` holds one :class:`Output` op per value, each a
    tensor usable like any other. Subclasses implement ``_output_types()`` returning
    ``[(axes, dtype), ...]``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.outputs = tuple(Output(self, i, axes=axes, dtype=dtype)
                             for i, (axes, dtype) in enumerate(self._output_types()))

    def _output_types(self):
        raise NotImplementedError


@primitive
class Output(TensorOp):
    """Value number ``index`` of the :class:`MultiOutput` op that is its only arg."""

    attrs = ("index", "axes", "dtype")

    def __init__(self, op: MultiOutput, index: int, axes: AxesLike, dtype: DTypeLike,
                 **kwargs: Any) -> None:
        self.index = index
        super().__init__(op, axes=axes, dtype=dtype, **kwargs)

    @property
    def source(self) -> MultiOutput:
        return self.args[0]


# A multi-output op's adjoint (and tangent) is a list: one entry per output.
@adjoint_rule(Output)
def _output_adjoint(op, d): return (d,)
@forward_rule(Output)
def _output_tangent(op, ts): return ts[0][op.index]
@evaluator(Output)
def _output_value(op, values): return np.asarray(values[op.index]).astype(op.dtype)
