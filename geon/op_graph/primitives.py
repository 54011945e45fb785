"""Semi-primitive ops: the base set transformers implement.

They work on low-dimensional row-major tensors and read their operands by position:

========================  ============================================================
op                        meaning
========================  ============================================================
storage                   :class:`Placeholder`, :class:`Variable`, :class:`Constant`
                          (a constant may be one number filling its shape)
elementwise               any :class:`ElementWise` op whose args all have the op's axes
                          in the op's order (so position and name agree)
:class:`Gemm`             matrix product ``a @ b``: 2-D, or batched (equal leading
                          batch dimensions; a broadcast batch is a stride-0 view)
``Reduce*``               sum / prod / max / min / argmax / argmin over one axis of a
                          tensor of at most 2 dimensions
:class:`Dimshuffle`       transpose view
:class:`Reshape`          row-major reinterpretation with other axes (same size)
:class:`Expand`           broadcast view: new axes of stride 0, the rest in order
:class:`SliceView`        basic slicing view, one slice or index per dimension
:class:`Unslice`          zeros with the arg written into a slice (slicing's adjoint)
:class:`Copy`             a contiguous copy
:class:`Assign`           write a value into storage (void)
:class:`ReduceMaxArgMax`  maximum and its index over one position (two outputs)
:class:`Take`             ``x[:, idx]`` for ``x`` (O, N, ...) and integer ``idx`` (M,)
:class:`PutAdd`           zeros (O, N, ...) with ``d[:, j]`` added at ``[:, idx[j]]``
:class:`PrefixSum`        running sums along dimension 1 of (O, N, ...)
:class:`SortPrim`         stable ascending sort along dimension 1 of (O, N, ...): values
                          and int64 positions (two outputs)
:class:`Output`           one value of a multi-output op
========================  ============================================================

Each keeps an ``axes`` describing its result so that graphs stay printable and
differentiable after lowering; backends only use the shapes.
"""

import operator

from geon.errors import ArgumentError, AxisMismatchError
from geon.op_graph.axes import Axes, as_axes
from geon.op_graph import op_graph as og
from geon.op_graph.op_graph import (AssignableTensorOp, ComputationOp, TensorOp, VoidOp,
                                    _fmt)
import numpy as np


class Gemm(ComputationOp):
    """``a @ b``, row-major: ``a`` (M, K) @ ``b`` (K, N) -> (M, N), or batched,
    ``a`` (B..., M, K) @ ``b`` (B..., K, N) -> (B..., M, N), one product per batch
    index (what ``np.matmul`` computes). Both operands have the same batch lengths: a
    batch that one operand shares with all (broadcast) is an :class:`Expand` view of
    stride 0, which no backend copies. The result's batch axes are ``a``'s."""

    arity = 2

    @property
    def batch_rank(self) -> int:
        """The number of leading batch dimensions (0: a plain 2-D product)."""
        return len(self.axes) - 2

    def _infer_axes(self):
        a, b = self.args
        la, lb = a.axes.lengths, b.axes.lengths
        if len(la) < 2 or len(la) != len(lb) or la[-1] != lb[-2] or la[:-2] != lb[:-2]:
            raise AxisMismatchError(f"Gemm {self.name}: needs (B..., M, K) @ (B..., K, N) "
                                    f"with equal batch lengths, got ({_fmt(a.axes)}) @ "
                                    f"({_fmt(b.axes)})")
        return Axes(tuple(a.axes)[:-1] + (b.axes[-1],))


class ReducePrim(ComputationOp):
    """Reduce one dimension, ``axis`` (a position), of a tensor of at most 2 dimensions."""

    attrs = ("axis", "dtype")

    def __init__(self, x, axis, **kwargs):
        self.axis = operator.index(axis)
        super().__init__(x, **kwargs)

    def _infer_axes(self):
        x = self.args[0]
        if not (0 <= self.axis < len(x.axes) <= 2):
            raise AxisMismatchError(f"{type(self).__name__}: cannot reduce position "
                                    f"{self.axis} of ({_fmt(x.axes)})")
        return x.axes - Axes(x.axes[self.axis])

    def _infer_dtype(self):
        return self.args[0].dtype


class ReduceSum(ReducePrim): """Sum over one position."""
class ReduceProd(ReducePrim): """Product over one position."""
class ReduceMax(ReducePrim): """Maximum over one position."""
class ReduceMin(ReducePrim): """Minimum over one position."""


class ReduceArgMax(ReducePrim):
    """Index of the maximum over one position (int64)."""

    def _infer_dtype(self):
        return np.dtype(np.int64)


class ReduceArgMin(ReduceArgMax):
    """Index of the minimum over one position (int64)."""


class ViewOp(TensorOp):
    """A new description of the arg's elements; no computation."""

    def _infer_dtype(self):
        return self.args[0].dtype


class Dimshuffle(ViewOp):
    """Transpose view: result dimension ``i`` is the arg's dimension ``perm[i]``."""

    attrs = ("perm",)

    def __init__(self, x, perm, **kwargs):
        self.perm = tuple(operator.index(p) for p in perm)
        super().__init__(x, **kwargs)

    def _infer_axes(self):
        x = self.args[0]
        if sorted(self.perm) != list(range(len(x.axes))):
            raise AxisMismatchError(f"Dimshuffle: {self.perm} is not a permutation of "
                                    f"({_fmt(x.axes)})")
        return Axes(x.axes[p] for p in self.perm)


class Reshape(ViewOp):
    """The arg's elements in row-major order, described by ``axes`` (same size)."""

    attrs = ("axes",)

    def __init__(self, x, axes, **kwargs):
        super().__init__(x, axes=as_axes(axes), **kwargs)
        x = self.args[0]
        if self.axes.lengths_known and x.axes.lengths_known and self.axes.size != x.axes.size:
            raise AxisMismatchError(f"Reshape: ({_fmt(x.axes)}) has {x.axes.size} elements, "
                                    f"({_fmt(self.axes)}) {self.axes.size}")


class Expand(ViewOp):
    """Broadcast view. ``dim_map[i]`` is the arg dimension that result dimension ``i``
    reads, or ``None`` for a new (stride 0) dimension; arg dimensions keep their order."""

    attrs = ("axes", "dim_map")

    def __init__(self, x, axes, dim_map, **kwargs):
        self.dim_map = tuple(None if d is None else operator.index(d) for d in dim_map)
        super().__init__(x, axes=as_axes(axes), **kwargs)
        x = self.args[0]
        used = [d for d in self.dim_map if d is not None]
        if used != list(range(len(x.axes))) or len(self.dim_map) != len(self.axes) or any(
                d is not None and None not in (a.length, x.axes[d].length)
                and a.length != x.axes[d].length for a, d in zip(self.axes, self.dim_map)):
            raise AxisMismatchError(f"Expand: bad dimension map {self.dim_map} from "
                                    f"({_fmt(x.axes)}) to ({_fmt(self.axes)})")


class SliceView(ViewOp):
    """Basic slicing: ``key`` holds one ``slice`` or ``int`` per arg dimension."""

    attrs = ("key", "axes")

    def __init__(self, x, key, axes, **kwargs):
        self.key = tuple(key)
        super().__init__(x, axes=as_axes(axes), **kwargs)
        _check_key(self, self.key, self.args[0].axes, self.axes)


class Unslice(ComputationOp):
    """Zeros with ``axes``, except that ``arg`` is written at ``key`` (the adjoint of
    slicing; ``key`` holds one ``slice`` or ``int`` per result dimension)."""

    attrs = ("axes", "key")

    def __init__(self, x, axes, key, **kwargs):
        self.key = tuple(key)
        super().__init__(x, axes=as_axes(axes), **kwargs)
        _check_key(self, self.key, self.axes, self.args[0].axes)

    def _infer_dtype(self):
        return self.args[0].dtype


class Copy(ComputationOp):
    """A contiguous copy of the arg."""

    attrs = ()
    arity = 1

    def _infer_axes(self):
        return self.args[0].axes

    def _infer_dtype(self):
        return self.args[0].dtype


class Assign(VoidOp):
    """Write ``value`` (same shape, position by position) into the storage ``tensor``."""

    def __init__(self, tensor, value, **kwargs):
        super().__init__(tensor, value, **kwargs)
        if not isinstance(tensor, AssignableTensorOp):
            raise ArgumentError(f"Assign needs storage, not {tensor!r}")
        if tensor.axes.lengths != self.args[1].axes.lengths:
            raise AxisMismatchError(f"Assign: value ({_fmt(self.args[1].axes)}) does not "
                                    f"fit tensor {tensor.name} ({_fmt(tensor.axes)})")

    @property
    def tensor(self):
        return self.args[0]


_INT = (int, np.integer)


def _check_key(op, key, full, part):
    """``key`` (one slice or int per dimension of ``full``) must cut ``full`` to ``part``."""
    if len(key) != len(full) or not all(
            isinstance(k, slice) and all(v is None or isinstance(v, _INT) for v in
                                         (k.start, k.stop, k.step))
            or isinstance(k, _INT) for k in key):
        raise AxisMismatchError(f"{type(op).__name__} {op.name}: key {key} needs one slice "
                                f"or int per dimension of ({_fmt(full)})")
    if full.lengths_known and part.lengths_known:
        got = np.broadcast_to(np.zeros((), np.int8), full.shape)[key].shape
        if got != part.shape:
            raise AxisMismatchError(f"{type(op).__name__} {op.name}: key {key} cuts "
                                    f"({_fmt(full)}) to shape {got}, not ({_fmt(part)})")


VIEW_OPS = (Dimshuffle, Reshape, Expand, SliceView)
REDUCE_PRIMS = (ReduceSum, ReduceProd, ReduceMax, ReduceMin, ReduceArgMax, ReduceArgMin)


class ReduceMaxArgMax(og.MultiOutput):
    """The maximum over one position ``axis`` of a tensor of at most 2 dimensions and its
    index there, as two outputs (value, int64 index)."""

    attrs = ("axis",)

    def __init__(self, x, axis, **kwargs):
        self.axis = operator.index(axis)
        super().__init__(x, **kwargs)

    def _output_types(self):
        x = self.args[0]
        if not (0 <= self.axis < len(x.axes) <= 2):
            raise AxisMismatchError(f"ReduceMaxArgMax: cannot reduce position {self.axis} "
                                    f"of ({_fmt(x.axes)})")
        axes = x.axes - Axes(x.axes[self.axis])
        return [(axes, x.dtype), (axes, np.dtype(np.int64))]


# --- indexing by an integer tensor -----------------------------------------------------

def _check_index_arg(op, idx):
    if idx.dtype.kind not in "iu" or len(idx.axes) != 1:
        raise AxisMismatchError(f"{type(op).__name__}: indices must be a 1-D integer "
                                f"tensor, not {idx.dtype} ({_fmt(idx.axes)})")


class Take(ComputationOp):
    """``x[:, idx]``: ``x`` has at least 2 dimensions (O, N, ...), ``idx`` is a 1-D
    integer tensor (M,) of positions along dimension 1 (negative ones count from the
    end); the result is (O, M, ...). A semi-primitive: the data-dependent read of
    ``gather``."""

    attrs = ()

    def _infer_axes(self):
        x, idx = self.args
        _check_index_arg(self, idx)
        if len(x.axes) < 2:
            raise AxisMismatchError(f"Take: needs (O, N, ...), got ({_fmt(x.axes)})")
        return Axes((x.axes[0], idx.axes[0]) + tuple(x.axes)[2:])

    def _infer_dtype(self):
        return self.args[0].dtype


class PutAdd(ComputationOp):
    """Zeros with ``axes`` (O, N, ...), then ``d[:, j]`` added at ``[:, idx[j]]`` for
    every ``j`` (repeated indices accumulate): the adjoint of :class:`Take`. ``d`` is
    (O, M, ...), ``idx`` a 1-D integer tensor (M,)."""

    attrs = ("axes",)

    def __init__(self, d, idx, axes, **kwargs):
        super().__init__(d, idx, axes=as_axes(axes), **kwargs)
        d, idx = self.args
        _check_index_arg(self, idx)
        if len(d.axes) != len(self.axes) or len(d.axes) < 2 or \
                d.axes.lengths[0] != self.axes.lengths[0] or \
                d.axes.lengths[1] != idx.axes.lengths[0] or \
                d.axes.lengths[2:] != self.axes.lengths[2:]:
            raise AxisMismatchError(f"PutAdd: cannot add ({_fmt(d.axes)}) at indices "
                                    f"({_fmt(idx.axes)}) into ({_fmt(self.axes)})")

    def _infer_dtype(self):
        return self.args[0].dtype


# --- scans and sorts along dimension 1 -------------------------------------------------

class PrefixSum(ComputationOp):
    """Inclusive running sums along dimension 1 of ``x`` (O, N, ...): ``cumsum``'s
    semi-primitive (no composite of the others is linear in N)."""

    attrs = ()

    def _infer_axes(self):
        x = self.args[0]
        if len(x.axes) < 2:
            raise AxisMismatchError(f"PrefixSum: needs (O, N, ...), got ({_fmt(x.axes)})")
        return x.axes

    def _infer_dtype(self):
        return self.args[0].dtype


class SortPrim(og.MultiOutput):
    """A stable ascending sort along dimension 1 of ``x`` (O, N, ...): the sorted values
    and the int64 positions they came from (equal values keep their order)."""

    attrs = ()

    def _output_types(self):
        x = self.args[0]
        if len(x.axes) < 2:
            raise AxisMismatchError(f"SortPrim: needs (O, N, ...), got ({_fmt(x.axes)})")
        return [(x.axes, x.dtype), (x.axes, np.dtype(np.int64))]
