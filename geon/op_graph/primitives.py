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

import numpy as np

from geon.errors import ArgumentError, AxisMismatchError
from geon.op_graph import op_graph as og
from geon.op_graph import special
from geon.op_graph.axes import Axes, Axis, as_axes
from geon.op_graph.derivatives import (direction_axes, same_adjoint, same_tangent, terms,
                                       zero_adjoint, zero_tangent)
from geon.op_graph.op_graph import (AssignableTensorOp, ComputationOp, TensorOp, VoidOp,
                                    _fmt)
from geon.op_graph.reductions import others_product, tied_mean
from geon.op_graph.symbols import Sym, cut, key_text
from geon.op_graph.tables import adjoint_rule, evaluator, forward_rule


@og.primitive
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


@og.primitive
class ReduceSum(ReducePrim): """Sum over one position."""
@og.primitive
class ReduceProd(ReducePrim): """Product over one position."""
@og.primitive
class ReduceMax(ReducePrim): """Maximum over one position."""
@og.primitive
class ReduceMin(ReducePrim): """Minimum over one position."""


@og.primitive
class ReduceArgMax(ReducePrim):
    """Index of the maximum over one position (int64)."""

    def _infer_dtype(self):
        return np.dtype(np.int64)


@og.primitive
class ReduceArgMin(ReduceArgMax):
    """Index of the minimum over one position (int64)."""


class ViewOp(TensorOp):
    """A new description of the arg's elements; no computation."""

    def _infer_dtype(self):
        return self.args[0].dtype


@og.primitive
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


@og.primitive
class Reshape(ViewOp):
    """The arg's elements in row-major order, described by ``axes`` (same size)."""

    attrs = ("axes",)

    def __init__(self, x, axes, **kwargs):
        super().__init__(x, axes=as_axes(axes), **kwargs)
        x = self.args[0]
        if self.axes.lengths_known and x.axes.lengths_known and self.axes.size != x.axes.size:
            raise AxisMismatchError(f"Reshape: ({_fmt(x.axes)}) has {x.axes.size} elements, "
                                    f"({_fmt(self.axes)}) {self.axes.size}")


@og.primitive
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


@og.primitive
class SliceView(ViewOp):
    """Basic slicing: ``key`` holds one ``slice`` or ``int`` per arg dimension."""

    attrs = ("key", "axes")

    def __init__(self, x, key, axes, **kwargs):
        self.key = tuple(key)
        super().__init__(x, axes=as_axes(axes), **kwargs)
        _check_key(self, self.key, self.args[0].axes, self.axes)


@og.primitive
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


class UnsliceAdd(ComputationOp):
    """``x`` with ``a`` added at ``key`` (one ``slice`` or ``int`` per dimension of
    ``x``): ``x + Unslice(a, x.axes, key)`` without the Unslice's zeros. Not a
    primitive: the NumPy transformer's ``unslice_add`` pass makes it from such sums
    (the adjoint of several slices of one value, a concatenation), and its code
    writes over ``x`` where ``x`` dies there (``in_place``)."""

    attrs = ("key", "axes")
    #: the memory plan may give the result ``x``'s buffer (the code then adds ``a``
    #: into it, at ``key``)
    in_place = True

    def __init__(self, x, a, key, axes=None, **kwargs):
        self.key = tuple(key)
        super().__init__(x, a, axes=as_axes(x.axes if axes is None else axes), **kwargs)
        if self.args[0].axes.lengths != self.axes.lengths:
            raise AxisMismatchError(f"UnsliceAdd {self.name}: x of ({_fmt(x.axes)}) for "
                                    f"a result of ({_fmt(self.axes)})")
        _check_key(self, self.key, self.axes, self.args[1].axes)

    def _infer_dtype(self):
        return self.args[0].dtype


@og.primitive
class Copy(ComputationOp):
    """A contiguous copy of the arg."""

    attrs = ()
    arity = 1

    def _infer_axes(self):
        return self.args[0].axes

    def _infer_dtype(self):
        return self.args[0].dtype


class LengthValue(ComputationOp):
    """The value of a symbolic length (a :class:`~geon.op_graph.symbols.Sym`, such as
    the element count ``N*4`` that a mean divides by), a scalar of ``dtype`` computed
    when the computation is called, from its binding. Lowering makes it only where a
    length is symbolic (a fixed length is a :class:`Constant`); the NumPy transformer
    and the PyTorch export have it in their base sets (the transformers that bind
    symbolic lengths so far)."""

    attrs = ("value", "dtype")
    arity = 0

    def __init__(self, value, dtype=None, **kwargs):
        self.value = value
        super().__init__(axes=(), dtype=dtype or og.DEFAULT_DTYPE, **kwargs)


@og.primitive
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


def plain_key(key):
    """Whether ``key`` (one slice or int per dimension) holds Python ints only (no
    symbolic bounds)."""
    return all(isinstance(k, int) or isinstance(k, slice) and all(
        v is None or isinstance(v, int) for v in (k.start, k.stop, k.step)) for k in key)


def _check_key(op, key, full, part):
    """``key`` (one slice or int per dimension of ``full``) must cut ``full`` to ``part``.
    Where a length or a bound is symbolic, ``op.needs`` keeps what a call must check
    (see :func:`~geon.op_graph.symbols.cut`)."""
    if len(key) != len(full) or not all(
            isinstance(k, slice) and all(v is None or isinstance(v, _INT + (Sym,)) for v in
                                         (k.start, k.stop, k.step))
            and not isinstance(k.step, Sym) or isinstance(k, _INT + (Sym,)) for k in key):
        raise AxisMismatchError(f"{type(op).__name__} {op.name}: key {key} needs one slice "
                                f"or int per dimension of ({_fmt(full)})")
    if not (full.lengths_known and part.lengths_known):
        return
    got, needs = [], []
    for k, n in zip(key, full.lengths):
        bounds = (k.start, k.stop) if isinstance(k, slice) else (k,)
        if k == slice(None):
            got.append(n)
        elif isinstance(n, Sym) or any(isinstance(v, Sym) for v in bounds):
            try:
                _, length, need = cut(k, n)
            except ValueError as e:
                raise AxisMismatchError(f"{type(op).__name__} {op.name}: {k} is out of "
                                        f"range for a dimension of {n!r} in ({_fmt(full)}): "
                                        f"{e}") from None
            needs += [(e, f"{key_text(k)} of a dimension of length {n!r}") for e in need]
            if length is not None:
                got.append(length)
        elif not isinstance(k, slice):
            if not -n <= k < n:
                raise AxisMismatchError(f"{type(op).__name__} {op.name}: index {k} is out "
                                        f"of range for a dimension of {n} in ({_fmt(full)})")
        else:
            got.append(len(range(n)[k]))
    if tuple(got) != tuple(part.lengths):
        raise AxisMismatchError(f"{type(op).__name__} {op.name}: key {key} cuts "
                                f"({_fmt(full)}) to lengths {tuple(got)}, not ({_fmt(part)})")
    op.needs = tuple(needs)


VIEW_OPS = (Dimshuffle, Reshape, Expand, SliceView)
REDUCE_PRIMS = (ReduceSum, ReduceProd, ReduceMax, ReduceMin, ReduceArgMax, ReduceArgMin)


@og.primitive
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


@og.primitive
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


@og.primitive
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

@og.primitive
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


@og.primitive
class SortPrim(og.MultiOutput):
    """A stable ascending sort along dimension 1 of ``x`` (O, N, ...): the sorted values
    and the int64 positions they came from (equal values keep their order)."""

    attrs = ()

    def _output_types(self):
        x = self.args[0]
        if len(x.axes) < 2:
            raise AxisMismatchError(f"SortPrim: needs (O, N, ...), got ({_fmt(x.axes)})")
        return [(x.axes, x.dtype), (x.axes, np.dtype(np.int64))]


# --- derivatives and reference values ----------------------------------------------------
# Rules read operands by position, so that lowered graphs stay differentiable. Forward
# rules keep direction axes trailing: keys and dimension maps extend by whole trailing
# dimensions. The rules of the core's Slice and Split sit here too: their adjoint is an
# Unslice.

def expand_back(op, v):
    """``v`` (axes of the ReducePrim or ReduceMaxArgMax ``op``) broadcast back to the
    input's shape."""
    x = op.args[0]
    dim_map, k = [], 0
    for i in range(len(x.axes)):
        if i == op.axis:
            dim_map.append(None)
        else:
            dim_map.append(k)
            k += 1
    return Expand(v, x.axes, dim_map)


def reduced_axes(op):
    """The axes the one-position reduction ``op`` removes."""
    return Axes(op.args[0].axes[op.axis])


def prod_of_others(op):
    """:func:`~geon.op_graph.autodiff.others_product` for the ReduceProd ``op``."""
    return others_product(op.args[0], lambda v: ReduceSum(v, op.axis),
                          lambda v: ReduceProd(v, op.axis), lambda v: expand_back(op, v))


def _transpose_last(n):
    return tuple(range(n - 2)) + (n - 1, n - 2)


@adjoint_rule(Gemm)
def _gemm_adjoint(op, d):  # da = d @ b^T, db = a^T @ d, batch by batch
    a, b = op.args
    swap = _transpose_last(len(op.axes))
    return (Reshape(Gemm(d, Dimshuffle(b, swap)), a.axes),
            Reshape(Gemm(Dimshuffle(a, swap), d), b.axes))


@forward_rule(Gemm)
def _gemm_tangent(op, ts):  # d(a @ b) = da @ b + a @ db, as a dot over fresh axes
    a, b = op.args
    if op.batch_rank == 0:
        k = Axis(a.axes[1].length)

        def as_a(x): return og.CastAxes(x, Axes(a.axes[0], k) + direction_axes(x, a))
        def as_b(x): return og.CastAxes(x, Axes(k, b.axes[1]) + direction_axes(x, b))
        return terms((ts[0], lambda t: og.Dot(as_a(t), as_b(b))),
                     (ts[1], lambda t: og.Dot(as_a(a), as_b(t))))
    # batched: fresh batch, row, inner and column axes (the operands' batch axes may
    # be named differently), a dot keeping the batch axes, then the result's names
    *batch, m, k, n = (Axis(x) for x in a.axes.lengths + b.axes.lengths[-1:])
    batch = Axes(batch)

    def left(x): return og.CastAxes(x, batch + Axes(m, k) + direction_axes(x, a))
    def right(x): return og.CastAxes(x, batch + Axes(k, n) + direction_axes(x, b))

    def named(y):
        extra = y.axes - (batch + Axes(m, n))
        return og.CastAxes(og.AxesWithOrder(y, batch + Axes(m, n) + extra),
                           op.axes + extra)
    return terms((ts[0], lambda t: named(og.Dot(left(t), right(b), batch_axes=batch))),
                 (ts[1], lambda t: named(og.Dot(left(a), right(t), batch_axes=batch))))


@evaluator(Gemm)
def _gemm_value(op, a, b):
    return np.matmul(a, b).astype(op.dtype)


@adjoint_rule(ReduceSum)
def _rsum_adjoint(op, d): return (expand_back(op, d),)
@forward_rule(ReduceSum)
def _rsum_tangent(op, ts): return og.Sum(ts[0], reduction_axes=reduced_axes(op))
@adjoint_rule(ReduceProd)
def _rprod_adjoint(op, d): return (expand_back(op, d) * prod_of_others(op),)
@forward_rule(ReduceProd)
def _rprod_tangent(op, ts):
    return og.Sum(prod_of_others(op) * ts[0], reduction_axes=reduced_axes(op))
@adjoint_rule(ReduceMax, ReduceMin)
def _rmax_adjoint(op, d):  # tied extremes share the derivative
    hit = og.Equal(op.args[0], expand_back(op, op))
    return (expand_back(op, d / ReduceSum(hit, op.axis)) * hit,)
@forward_rule(ReduceMax, ReduceMin)
def _rmax_tangent(op, ts):
    hit = og.Equal(op.args[0], expand_back(op, op))
    return tied_mean(hit, ts[0], reduced_axes(op))
adjoint_rule(ReduceArgMax)(zero_adjoint)
forward_rule(ReduceArgMax)(zero_tangent)

_REDUCERS = {ReduceSum: np.sum, ReduceProd: np.prod, ReduceMax: np.max, ReduceMin: np.min,
             ReduceArgMax: np.argmax, ReduceArgMin: np.argmin}


@evaluator(ReducePrim)
def _reduce_value(op, x):
    return np.asarray(_REDUCERS[type(op)](x, axis=op.axis)).astype(op.dtype)


@adjoint_rule(ReduceMaxArgMax)
def _reduce_max_argmax_adjoint(op, d):
    if d[0] is None:
        return (None,)
    hit = og.Equal(op.args[0], expand_back(op, op.outputs[0]))
    return (expand_back(op, d[0] / ReduceSum(hit, op.axis)) * hit,)


@forward_rule(ReduceMaxArgMax)
def _reduce_max_argmax_tangent(op, ts):
    hit = og.Equal(op.args[0], expand_back(op, op.outputs[0]))
    return (tied_mean(hit, ts[0], reduced_axes(op)), None)


@evaluator(ReduceMaxArgMax)
def _reduce_max_argmax_value(op, x):
    return np.max(x, axis=op.axis), np.argmax(x, axis=op.axis).astype(np.int64)


@adjoint_rule(Dimshuffle)
def _dimshuffle_adjoint(op, d):
    inverse = [0] * len(op.perm)
    for i, p in enumerate(op.perm):
        inverse[p] = i
    return (Dimshuffle(d, inverse),)
forward_rule(Dimshuffle)(same_tangent)  # Dimshuffle keeps the names
@evaluator(Dimshuffle)
def _dimshuffle_value(op, x): return np.transpose(x, op.perm)


@adjoint_rule(Reshape)
def _reshape_adjoint(op, d): return (Reshape(d, op.args[0].axes),)
@forward_rule(Reshape)
def _reshape_tangent(op, ts):
    t = ts[0]
    return Reshape(t, op.axes + direction_axes(t, op.args[0]))
@evaluator(Reshape)
def _reshape_value(op, x): return np.reshape(x, op.axes.shape)


@adjoint_rule(Expand)
def _expand_adjoint(op, d):
    new = Axes(a for a, m in zip(op.axes, op.dim_map) if m is None)
    return (og.Sum(d, reduction_axes=new) if len(new) else d,)
@forward_rule(Expand)
def _expand_tangent(op, ts):
    t = ts[0]
    extra = direction_axes(t, op.args[0])
    n = len(op.args[0].axes)
    return Expand(t, op.axes + extra, op.dim_map + tuple(range(n, n + len(extra))))
@evaluator(Expand)
def _expand_value(op, x):
    shape = [1 if m is None else x.shape[m] for m in op.dim_map]
    return np.broadcast_to(np.reshape(x, shape), op.axes.shape)


@adjoint_rule(SliceView)
def _sliceview_adjoint(op, d): return (Unslice(d, op.args[0].axes, op.key),)
@forward_rule(SliceView)
def _sliceview_tangent(op, ts):
    t = ts[0]
    extra = direction_axes(t, op.args[0])
    return SliceView(t, op.key + (slice(None),) * len(extra), op.axes + extra)
@evaluator(SliceView)
def _sliceview_value(op, x): return x[op.key]


@adjoint_rule(Unslice)
def _unslice_adjoint(op, d): return (SliceView(d, op.key, op.args[0].axes),)
@forward_rule(Unslice)
def _unslice_tangent(op, ts):
    t = ts[0]
    extra = direction_axes(t, op.args[0])
    return Unslice(t, op.axes + extra, op.key + (slice(None),) * len(extra))
@evaluator(Unslice)
def _unslice_value(op, x):
    out = np.zeros(op.axes.shape, op.dtype)
    out[op.key] = x
    return out


@adjoint_rule(UnsliceAdd)
def _unslice_add_adjoint(op, d): return (d, SliceView(d, op.key, op.args[1].axes))
@forward_rule(UnsliceAdd)
def _unslice_add_tangent(op, ts):
    tx, ta = ts
    if ta is None:
        return tx
    extra = direction_axes(ta, op.args[1])
    key = op.key + (slice(None),) * len(extra)
    if tx is None:
        return Unslice(ta, op.axes + extra, key)
    return UnsliceAdd(tx, ta, key, op.axes + extra)
@evaluator(UnsliceAdd)
def _unslice_add_value(op, x, a):
    out = np.array(x, dtype=op.dtype)
    out[op.key] += a
    return out


adjoint_rule(Copy)(same_adjoint)
forward_rule(Copy)(same_tangent)
@evaluator(Copy)
def _copy_value(op, x): return np.array(x)


@adjoint_rule(Take)
def _take_adjoint(op, d): return PutAdd(d, op.args[1], op.args[0].axes), None
@forward_rule(Take)
def _take_tangent(op, ts): return Take(ts[0], op.args[1])  # direction axes trail
@evaluator(Take)
def _take_value(op, x, idx): return special.take(x, idx, special.op_site(op))


@adjoint_rule(PutAdd)
def _put_add_adjoint(op, d): return Take(d, op.args[1]), None
@forward_rule(PutAdd)
def _put_add_tangent(op, ts):
    t = ts[0]
    return PutAdd(t, op.args[1], op.axes + direction_axes(t, op.args[0]))
@evaluator(PutAdd)
def _put_add_value(op, d, idx):
    return special.put_add(d, idx, np.empty(op.axes.shape, op.dtype), special.op_site(op))


@adjoint_rule(PrefixSum)
def _prefix_sum_adjoint(op, d):  # the running sum from the other end: flip, sum, flip
    flip = (slice(None), slice(None, None, -1)) + (slice(None),) * (len(op.axes) - 2)
    return (SliceView(PrefixSum(SliceView(d, flip, d.axes)), flip, op.axes),)
@forward_rule(PrefixSum)
def _prefix_sum_tangent(op, ts): return PrefixSum(ts[0])
@evaluator(PrefixSum)
def _prefix_sum_value(op, x): return np.cumsum(x, axis=1, dtype=op.dtype)


# SortPrim's derivatives are those of nn_ops.Sort (registered there); its value:
@evaluator(SortPrim)
def _sort_prim_value(op, x): return special.sort_along(x, 1, False)


@adjoint_rule(og.Slice)
def _slice_adjoint(op, d):
    x = op.args[0]
    key = [slice(None)] * len(x.axes)
    key[op.axis_pos] = op.key
    return (Unslice(d, x.axes, key),)


@adjoint_rule(og.Split)
def _split_adjoint(op, d):  # d: one delta per output (None where none flows)
    x = op.args[0]
    total = None
    for k, dk in zip(op.keys, d):
        if dk is None:
            continue
        key = [slice(None)] * len(x.axes)
        key[op.axis_pos] = k
        part = Unslice(dk, x.axes, key)
        total = part if total is None else total + part
    return (total,)
