"""The NumPy family's operands and ways to make tensors (``constant``, ``zeros``,
``placeholder``, ...): the base that :mod:`geon.op_graph.np_ops` and
:mod:`geon.op_graph.np_shapes` build on. ``geon.np`` (``np_ops``) re-exports it."""

import numbers
from typing import Any, Optional, Sequence, Union

import numpy as np

from geon.errors import ArgumentError, AxisMismatchError
from geon.op_graph import op_graph as og
from geon.op_graph.axes import Axes
from geon.op_graph.symbols import Sym
from geon.op_graph.coercion import (AXES, PositionalAxis, canonical_axes, family,
                                    family_error, numpy_constant, positional_shape,
                                    split_axes)

_builtin_sum, _builtin_max = sum, max  # before the NumPy names shadow them

#: An operand of a NumPy-family function: an op, a number, or anything
#: :func:`numpy.asarray` takes (made a constant).
ArrayLike = Union[og.TensorOp, int, float, np.generic, np.ndarray, Sequence[Any]]
#: A shape: one length or a sequence of lengths.
Shape = Union[int, Sequence[int]]
#: An ``axis=`` argument: one position, several, or ``None`` (all).
AxisArg = Union[int, Sequence[int], None]


# --- operands ------------------------------------------------------------------------------

def _shape(shape) -> tuple[Any, ...]:
    """``shape`` as a tuple of lengths: ints >= 0, or symbolic lengths (a ``Sym``,
    bound when a computation is called)."""
    if isinstance(shape, (numbers.Integral, np.integer, Sym)):
        shape = (shape,)
    shape = tuple(shape)
    for n in shape:
        if isinstance(n, Sym):
            continue
        if isinstance(n, bool) or not isinstance(n, (numbers.Integral, np.integer)) or n < 0:
            raise ArgumentError(f"a shape holds integers >= 0 (or symbolic lengths), not "
                                f"{shape!r}")
    return tuple(n if isinstance(n, Sym) else int(n) for n in shape)


def _arg(x):
    """An elementwise operand: ops and Python numbers as they are, arrays as constants."""
    if isinstance(x, (og.Op, numbers.Number)) and not isinstance(x, np.generic):
        return x
    return constant(x)


def _tensor(x, what) -> og.TensorOp:
    """``x`` as a tensor op of the NumPy or Simple-Axes family (or a scalar)."""
    if not isinstance(x, og.Op):
        return constant(x)
    if not isinstance(x, og.TensorOp):
        raise ArgumentError(f"{what}: {x!r} has no value")
    if family(x) == AXES:
        raise family_error(what, [x], "a NumPy-family function needs a positional tensor")
    return x


def _front(x):
    """``x`` with its named (sample, recurrent) axes first: the order of the family."""
    special, pos = split_axes(x)
    order = special + pos
    if [a.name for a in order] != list(x.axes.names):
        return og.AxesWithOrder(x, Axes(order))
    return x


def cast_through_reorder(x, axes, cls=og.CastAxes):
    """``cls(x, axes)`` (a renaming), built below the reorderings ``x`` is made of: a
    rename of a transposed view would need a copy when lowered, a transposed view of a
    rename does not."""
    axes = Axes(axes)
    if not isinstance(x, og.AxesWithOrder):
        return cls(x, axes)
    y = x.args[0]
    new_of = {old.name: new for old, new in zip(x.axes, axes)}
    return og.AxesWithOrder(cast_through_reorder(y, [new_of[a.name] for a in y.axes], cls),
                            axes)


def _rename(x, names):
    """``x`` with its positional axes renamed, in order, to ``names``."""
    special, pos = split_axes(x)
    if [a.name for a in pos] == list(names):
        return x
    it = iter(names)
    new = [a if not isinstance(a, PositionalAxis) else PositionalAxis(a.length, next(it))
           for a in x.axes]
    return cast_through_reorder(x, new)


def _named_union(xs, what):
    """The named (sample, recurrent) axes of ``xs``, in order of appearance."""
    seen = {}
    for x in xs:
        for a in split_axes(x)[0]:
            old = seen.setdefault(a.name, a)
            if old.length != a.length:
                raise AxisMismatchError(f"{what}: axis {a.name} has lengths {old.length} "
                                        f"and {a.length}")
    return list(seen.values())


def _with_pos(x, shape):
    """The axes of ``x``'s named axes followed by canonical axes of ``shape``."""
    special, _ = split_axes(x)
    return Axes(special + list(canonical_axes(shape)))


def _normalize_axis(axis, n, what):
    if isinstance(axis, bool) or not isinstance(axis, (numbers.Integral, np.integer)):
        raise ArgumentError(f"{what}: an axis is an integer, not {axis!r}")
    if not -n <= axis < n:
        raise AxisMismatchError(f"{what}: axis {axis} is out of bounds for array of "
                                f"dimension {n}")
    return int(axis) % n


def _axis_list(axis, n, what):
    if axis is None:
        return list(range(n))
    items = axis if isinstance(axis, (tuple, list)) else (axis,)
    out = []
    for ax in items:
        ax = _normalize_axis(ax, n, what)
        if ax in out:
            raise ArgumentError(f"{what}: duplicate value in 'axis'")
        out.append(ax)
    return sorted(out)


# --- making tensors -----------------------------------------------------------------------

def placeholder(shape: Shape, dtype: og.DTypeLike = None,
                name: Optional[str] = None) -> og.Placeholder:
    """A NumPy-family tensor of ``shape`` fed when a computation is called (float32
    unless ``dtype`` says otherwise)."""
    return og.Placeholder(canonical_axes(_shape(shape)), dtype=dtype, name=name)


def variable(initial_value: Any = 0.0, shape: Optional[Shape] = None,
             dtype: og.DTypeLike = None, name: Optional[str] = None,
             trainable: bool = True, persistent: bool = True) -> og.Variable:
    """A NumPy-family Variable. ``initial_value`` is an array (its shape and, for an
    ndarray, its dtype are the variable's), a number filling ``shape``, or a function
    ``f(shape) -> array`` (``shape`` is then required). The dtype defaults to float32."""
    if shape is None:
        if callable(initial_value):
            raise ArgumentError("variable: an initial value given by a function needs shape=")
        shape = np.shape(initial_value)
    if dtype is None and isinstance(initial_value, np.ndarray):
        dtype = initial_value.dtype
    return og.Variable(canonical_axes(_shape(shape)), initial_value=initial_value,
                       dtype=dtype, name=name, trainable=trainable, persistent=persistent)


def constant(value: Any, dtype: og.DTypeLike = None,
             name: Optional[str] = None) -> og.Constant:
    """A NumPy-family constant holding ``value`` (an array-like; its dtype unless
    ``dtype`` is given)."""
    return numpy_constant(value, dtype=dtype, name=name)


def asarray(a: ArrayLike, dtype: og.DTypeLike = None) -> og.TensorOp:
    """``a`` as a NumPy-family tensor: NumPy-family ops as they are, arrays as constants.
    An Axes-family tensor raises :class:`FamilyError` (see :func:`positional`)."""
    if isinstance(a, og.Op):
        a = _tensor(a, "asarray")
        if dtype is not None and np.dtype(dtype) != a.dtype:
            raise ArgumentError(f"asarray: {a.name} has dtype {a.dtype}; geon has no cast op")
        return a
    return constant(a, dtype=dtype)


def full(shape: Shape, fill_value: Union[int, float], dtype: og.DTypeLike = None,
         name: Optional[str] = None) -> og.Constant:
    """A constant of ``shape`` filled with ``fill_value`` (float32 by default)."""
    return og.Constant(fill_value, axes=canonical_axes(_shape(shape)),
                       dtype=dtype or og.DEFAULT_DTYPE, name=name)


def zeros(shape: Shape, dtype: og.DTypeLike = None,
          name: Optional[str] = None) -> og.Constant:
    """A constant of zeros (float32 by default)."""
    return full(shape, 0, dtype, name)


def ones(shape: Shape, dtype: og.DTypeLike = None,
         name: Optional[str] = None) -> og.Constant:
    """A constant of ones (float32 by default)."""
    return full(shape, 1, dtype, name)


def shape(a: ArrayLike) -> tuple[int, ...]:
    """The NumPy shape of ``a`` (its positional dimensions)."""
    return positional_shape(_tensor(a, "shape"))


def ndim(a: ArrayLike) -> int:
    """The number of positional dimensions of ``a``."""
    return len(shape(a))
