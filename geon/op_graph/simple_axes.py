"""The Simple-Axes family: positional feature dimensions plus a named sample axis.

Use it as ``be.simple``. A frontend that knows only which axis indexes samples (and,
for RNNs, which indexes time steps) builds tensors with named *sample* and
*recurrent* axes and positional *feature* dimensions::

    N = be.simple.sample_axis(32)
    x = be.simple.placeholder((784,), sample=N)      # 32 samples of 784 features
    w = be.simple.variable(np.zeros((784, 10)))       # parameters have no sample axis
    h = be.np.tanh(x @ w)                             # (N, 10): matmul per sample

Every :mod:`geon.np` function works on the feature dimensions (``axis=`` counts them
only) and carries the sample and recurrent axes along by name; reductions with
``axis=None`` keep them. :func:`sample_sum` and :func:`sample_mean` reduce over them.

The frontend never says where the sample axis lies in memory: values are fed and
returned sample axis first (then the recurrent axis, then the features), and a
transformer that prefers the sample axis first or last (``sample_axis="first"`` or
``"last"``) lays out every value it computes that way with its ``layout`` pass
(:class:`geon.transformers.passes.layout.LayoutPass`). Results are the same either way.
"""

from typing import Optional, Sequence, Union

from geon.errors import AxisMismatchError
from geon.op_graph import op_graph as og
from geon.op_graph.axes import AxesLike, Axes, Axis
from geon.op_graph.coercion import (AXES, SAMPLE, ToPositional, canonical_axes, describe,
                                    family, positional_shape, split_axes, with_axes)
from geon.op_graph.np_base import _shape, constant, variable

__all__ = ["constant", "feature_shape", "from_axes", "placeholder", "recurrent_axis",
           "sample_axes", "sample_axis", "sample_mean", "sample_sum", "variable",
           "with_axes"]


def sample_axis(length: int, name: str = "N") -> Axis:
    """A sample (batch) axis: kept by reductions, laid out as the transformer prefers."""
    return Axis(length, name, batch=True)


def recurrent_axis(length: int, name: str = "T") -> Axis:
    """A recurrent (time-step) axis, laid out next to the sample axis."""
    return Axis(length, name, recurrent=True)


def _named(axis, what, kind):
    if not isinstance(axis, Axis) or not getattr(axis, kind):
        raise AxisMismatchError(f"placeholder: {what} must be an axis made by "
                                f"be.simple.{what}_axis(...), not {axis!r}")
    return axis


def placeholder(shape: Union[int, Sequence[int]], sample: Axis,
                recurrent: Optional[Axis] = None, dtype: og.DTypeLike = None,
                name: Optional[str] = None) -> og.Placeholder:
    """A tensor with the sample axis ``sample`` (optionally the recurrent axis
    ``recurrent``) and feature dimensions ``shape``. It is fed as an array of shape
    ``(samples, [steps,] *shape)``."""
    axes = [_named(sample, "sample", "batch")]
    if recurrent is not None:
        axes.append(_named(recurrent, "recurrent", "recurrent"))
    return og.Placeholder(Axes(axes + list(canonical_axes(_shape(shape)))), dtype=dtype,
                          name=name)


def sample_axes(x: og.TensorOp) -> Axes:
    """The sample and recurrent axes of ``x``."""
    return Axes(split_axes(og.as_op(x))[0])


def feature_shape(x: og.TensorOp) -> tuple[int, ...]:
    """The shape of the feature (positional) dimensions of ``x``."""
    return positional_shape(og.as_op(x))


def sample_sum(x: og.TensorOp) -> og.TensorOp:
    """``x`` summed over its sample and recurrent axes."""
    x = og.as_op(x)
    return og.Sum(x, reduction_axes=sample_axes(x))


def sample_mean(x: og.TensorOp) -> og.TensorOp:
    """``x`` averaged over its sample and recurrent axes."""
    x = og.as_op(x)
    red = sample_axes(x)
    return og.Sum(x, reduction_axes=red) / float(red.size if len(red) else 1)


def from_axes(x: og.TensorOp,
              order: Optional[Sequence[Union[Axis, str]]] = None) -> og.TensorOp:
    """An Axes-family tensor as a Simple-Axes one: its sample and recurrent axes stay
    named (and go first), the others become feature dimensions in the order ``order``
    gives (default: ``x``'s)."""
    x = og.as_op(x)
    if family(x) not in (AXES, SAMPLE):
        raise AxisMismatchError(f"from_axes: {describe(x)} does not have named axes")
    named = [a for a in x.axes if a.batch or a.recurrent]
    rest: list = [a for a in x.axes if not (a.batch or a.recurrent)] if order is None else \
        [x.axes.find(a.name if isinstance(a, Axis) else a) for a in order]
    if None in rest or sorted(a.name for a in rest + named) != sorted(x.axes.names):
        raise AxisMismatchError(f"from_axes: {order!r} does not order the feature axes "
                                f"of {describe(x)}")
    target = Axes(named + rest)
    if target.names != x.axes.names:
        x = og.AxesWithOrder(x, target)
    return ToPositional(x, Axes(named + list(canonical_axes([a.length for a in rest]))))

