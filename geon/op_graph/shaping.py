"""Ops that change how a tensor's elements are laid out over axes: flattening groups
of axes into one and back, slicing along an
axis, one-hot encoding, splitting into parts, and :func:`value_of`; with their
derivatives and reference values. (Broadcasts, reorders and renames, which the
engines build, are in :mod:`~geon.op_graph.core_ops`; the reverse rules of :class:`Slice` and
:class:`Split` build the primitive ``Unslice`` and are registered in
:mod:`~geon.op_graph.primitives`.)"""

import builtins
import operator
from typing import Optional, Sequence, Union

import numpy as np

from geon.errors import ArgumentError, AxisIndexError, AxisMismatchError
from geon.op_graph.axes import Axes, AxesLike, Axis, FlattenedAxis, as_axes
from geon.op_graph.core import (DEFAULT_DTYPE, AssignableTensorOp, DTypeLike, TensorLike,
                                TensorOp, _fmt, _mismatch, as_op)
from geon.op_graph.nodes import user_location
from geon.op_graph.core_ops import AxesWithOrder, CastAxes, MultiOutput, cast_axes  # noqa: F401
from geon.op_graph.derivatives import direction_axes, zero_adjoint, zero_tangent
from geon.op_graph.keywords import keywords
from geon.op_graph.symbols import Sym, cut, key_text
from geon.op_graph.tables import adjoint_rule, evaluator, forward_rule

#: The names :mod:`geon.op_graph.op_graph` re-exports (``og.X``), private helpers that
#: other modules use as ``og._x`` among them.
__all__ = [
    "Flatten", "flatten", "one_hot", "OneHot", "Slice", "slice_along_axis", "Split",
    "split", "Unflatten", "unflatten", "value_of",
]


class Flatten(TensorOp):
    """``x`` with consecutive axes merged into :class:`FlattenedAxis` es."""

    attrs = ("axes",)

    def __init__(self, x, axes, **kwargs):
        super().__init__(x, axes=as_axes(axes), **kwargs)
        x = self.args[0]
        parts = []
        for a in self.axes:
            parts.extend(a.axes if isinstance(a, FlattenedAxis) else (a,))
        if tuple(p.name for p in parts) != x.axes.names:
            raise _mismatch(self, f"({_fmt(self.axes)}) does not flatten the input's axes "
                                  f"in order", [x])

    def _infer_dtype(self):
        return self.args[0].dtype


@keywords()
def flatten(x: TensorLike, groups: Optional[Sequence[AxesLike]] = None) -> TensorOp:
    """Merge axes of ``x``. ``groups`` lists, in order, Axes (merged into one
    :class:`FlattenedAxis`) or single axes; by default all axes become one."""
    x = as_op(x)
    if groups is None:
        groups = [x.axes]
    out = []
    for g in groups:
        out.append(g if isinstance(g, Axis) else
                   (FlattenedAxis(g) if len(as_axes(g)) != 1 else as_axes(g)[0]))
    return Flatten(x, Axes(out))


class Unflatten(TensorOp):
    """Undo :func:`flatten`: every :class:`FlattenedAxis` becomes its parts again."""

    def __init__(self, x, **kwargs):
        super().__init__(x, **kwargs)

    def _infer_axes(self):
        parts = []
        for a in self.args[0].axes:
            parts.extend(a.axes if isinstance(a, FlattenedAxis) else (a,))
        return Axes(parts)

    def _infer_dtype(self):
        return self.args[0].dtype


@keywords()
def unflatten(x: TensorLike) -> TensorOp:
    """Split every flattened axis of ``x`` back into its parts."""
    return Unflatten(x)


class Slice(TensorOp):
    """``x`` restricted along ``axis`` by a Python slice or an index.

    An index removes the axis; a slice replaces it with a new axis named
    ``new_axis`` (default ``"<name>[start:stop:step]"``) of the sliced length.
    """

    attrs = ("axis", "key", "new_axis")

    def __init__(self, x, axis, key, new_axis=None, **kwargs):
        x = as_op(x)
        if axis not in x.axes:
            raise AxisMismatchError(f"Slice: axis {axis!r} is not in {x.name} "
                                    f"({_fmt(x.axes)}) (at {user_location()})")
        pos = x.axes.index(axis)
        axis = x.axes[pos]
        needs: tuple = ()
        given = key
        bounds = (key.start, key.stop, key.step) if isinstance(key, slice) else (key,)
        symbolic = isinstance(axis.length, Sym) or any(isinstance(v, Sym) for v in bounds)
        if symbolic and key != slice(None):
            try:  # bounds as positions; what a call must check (symbols.cut)
                key, n, needs = cut(key if isinstance(key, (slice, Sym)) else int(key),
                                    axis.length)
            except ValueError as e:
                raise AxisIndexError(f"Slice: {key} is out of range for axis {axis!r} of "
                                     f"{x.name} ({_fmt(x.axes)}): {e} (at "
                                     f"{user_location()})") from None
        if isinstance(key, slice):
            if not symbolic:
                n = len(range(*key.indices(axis.length)))
            elif key == slice(None):
                n = axis.length
            if new_axis is None:
                s = ":".join("" if v is None else str(v)
                             for v in (given.start, given.stop, given.step))
                new_axis = Axis(n, f"{axis.name}[{s}]", axis.batch, axis.recurrent)
            elif new_axis.length is None:
                new_axis.length = n
            elif new_axis.length != n:
                raise AxisMismatchError(f"Slice: new axis {new_axis!r} but the slice of "
                                        f"{x.name} ({_fmt(x.axes)}) has {n} entries (at "
                                        f"{user_location()})")
            out = Axes(tuple(x.axes)[:pos] + (new_axis,) + tuple(x.axes)[pos + 1:])
        elif symbolic:
            out = x.axes - Axes(axis)
            new_axis = None
        else:
            key = int(key)
            if not -axis.length <= key < axis.length:
                raise AxisIndexError(f"Slice: index {key} is out of range for axis "
                                     f"{axis!r} of {x.name} ({_fmt(x.axes)}) (at "
                                     f"{user_location()})")
            key %= axis.length
            out = x.axes - Axes(axis)
            new_axis = None
        self.axis_pos, self.key = pos, key
        self.axis, self.new_axis = axis, new_axis
        self.needs = tuple((e, f"{key_text(key)} of axis {axis.name} (length "
                                f"{axis.length!r})") for e in needs)
        super().__init__(x, axes=out, **kwargs)

    def _infer_dtype(self):
        return self.args[0].dtype


@keywords()
def slice_along_axis(x: TensorLike, axis: Axis, key: Union[int, slice],
                     new_axis: Optional[Axis] = None) -> TensorOp:
    """Take ``key`` (a slice or an int) of ``x`` along ``axis`` (see ``Slice``)."""
    return Slice(x, axis, key, new_axis)


class OneHot(TensorOp):
    """``one_hot(x, axis)``: 1.0 where ``axis``'s index equals the value of ``x``."""

    attrs = ("axis", "dtype")

    def __init__(self, x, axis, dtype=None, **kwargs):
        self.axis = axis
        super().__init__(x, dtype=dtype or DEFAULT_DTYPE, **kwargs)

    def _infer_axes(self):
        x = self.args[0]
        if self.axis in x.axes:
            raise _mismatch(self, f"axis {self.axis!r} is already in the input", [x])
        return Axes(self.axis) + x.axes


@keywords()
def one_hot(x: TensorLike, axis: Axis, dtype: DTypeLike = None) -> TensorOp:
    """One-hot encode integer labels ``x`` along the new axis ``axis`` (first)."""
    return OneHot(x, axis, dtype=dtype)


class Split(MultiOutput):
    """``x`` cut along ``axis`` into consecutive parts of the given lengths; part ``i``
    has the axis replaced by ``"<axis>[start:stop]"``."""

    attrs = ("axis", "lengths")

    def __init__(self, x, axis, lengths, **kwargs):
        x = as_op(x)
        if axis not in x.axes:
            raise AxisMismatchError(f"split: axis {axis!r} is not in {x.name} "
                                    f"({_fmt(x.axes)}) (at {user_location()})")
        self.axis_pos = x.axes.index(axis)
        full = self.axis = x.axes[self.axis_pos]
        self.lengths = lengths = tuple(operator.index(n) for n in lengths)
        if any(n <= 0 for n in lengths) or builtins.sum(lengths) != full.length:
            raise AxisMismatchError(f"split: parts {lengths} do not add up to axis "
                                    f"{full!r} of {x.name} (at {user_location()})")
        self.keys, start = [], 0
        for n in lengths:
            self.keys.append(slice(start, start + n))
            start += n
        super().__init__(x, **kwargs)

    def _output_types(self):
        x = self.args[0]
        full = x.axes[self.axis_pos]
        types = []
        for k in self.keys:
            part = Axis(k.stop - k.start, f"{full.name}[{k.start}:{k.stop}]", full.batch,
                        full.recurrent)
            axes = tuple(x.axes)
            types.append((Axes(axes[:self.axis_pos] + (part,) + axes[self.axis_pos + 1:]),
                          x.dtype))
        return types


@keywords()
def split(x: TensorLike, axis: Axis,
          parts: Union[int, Sequence[int]]) -> tuple[TensorOp, ...]:
    """Cut ``x`` along ``axis`` into ``parts`` equal parts (an int) or parts of the given
    lengths (a list); returns a tuple of tensors (one ``Split`` op computes them)."""
    x = as_op(x)
    n = x.axes[x.axes.index(axis)].length
    if isinstance(parts, int):
        if parts <= 0 or n % parts:
            raise AxisMismatchError(f"split: axis {axis!r} of length {n} does not split "
                                    f"into {parts} equal parts (at {user_location()})")
        parts = [n // parts] * parts
    return Split(x, axis, parts).outputs


def value_of(tensor: TensorOp) -> TensorOp:
    """The value stored in ``tensor`` (a Variable or placeholder), read without the
    ordering after earlier assignments that reading ``tensor`` itself gets.

    An op built after ``SetItem(w, ...)`` that reads ``w`` runs after the assignment,
    so a computation of it runs the assignment too. An op that reads
    ``be.value_of(w)`` instead does not: in a computation without the assignment it
    reads what is stored (what the last call that assigned left there); in one with
    it, it reads the value from before the assignment, like an op built before it.
    Derivatives flow through it as through ``w``.
    """
    if not isinstance(tensor, AssignableTensorOp) or tensor.is_constant:
        raise ArgumentError(f"value_of needs a Variable or placeholder, not {tensor!r} "
                            f"(at {user_location()})")
    # A reordering that keeps the order: a view of the storage (it lowers to nothing)
    # that, unlike every op built with ``tensor`` as an arg, does not take the
    # tensor's user_deps.
    view = AxesWithOrder(tensor, tensor.axes, name=f"{tensor.name}_stored")
    for d in tensor.user_deps:
        view.other_deps.discard(d)
        d._dep_users.discard(view)
    return view


@adjoint_rule(Flatten)
def _flatten_adjoint(op, d): return (Unflatten(d),)
@forward_rule(Flatten)
def _flatten_tangent(op, ts):
    t = ts[0]
    return Flatten(t, op.axes + direction_axes(t, op.args[0]))
@adjoint_rule(Unflatten)
def _unflatten_adjoint(op, d): return (Flatten(d, op.args[0].axes),)
@forward_rule(Unflatten)
def _unflatten_tangent(op, ts): return Unflatten(ts[0])


@evaluator(Flatten, Unflatten)
def _reshape_value(op, x): return np.reshape(x, op.axes.shape)


@forward_rule(Slice)
def _slice_tangent(op, ts):
    x = op.args[0]
    new = op.axes[op.axis_pos] if isinstance(op.key, slice) else None
    return Slice(ts[0], x.axes[op.axis_pos], op.key, new_axis=new)


@evaluator(Slice)
def _slice_value(op, x):
    key = [slice(None)] * len(op.args[0].axes)
    key[op.axis_pos] = op.key
    return x[tuple(key)]


adjoint_rule(OneHot)(zero_adjoint)
forward_rule(OneHot)(zero_tangent)


@evaluator(OneHot)
def _one_hot_value(op, x):
    idx = np.arange(op.axis.length).reshape((-1,) + (1,) * np.ndim(x))
    return (idx == np.asarray(x)[None]).astype(op.dtype)


@forward_rule(Split)
def _split_tangent(op, ts):
    t, x = ts[0], op.args[0]
    axis = x.axes[op.axis_pos]
    return tuple(Slice(t, axis, k, new_axis=out.axes[op.axis_pos])
                 for k, out in zip(op.keys, op.outputs))


@evaluator(Split)
def _split_value(op, x):
    outs = []
    for k in op.keys:
        key = [slice(None)] * x.ndim
        key[op.axis_pos] = k
        outs.append(x[tuple(key)])
    return tuple(outs)
