"""Lowering of Axes ops to the semi-primitive base set (:mod:`geon.op_graph.primitives`).

After this pass every op reads its operands by position: elementwise args have the op's
axes in the op's order, ``dot`` is a ``Gemm`` (2-D, or batched over the axes a batched
dot keeps) between views and reshapes, reductions reduce
one dimension of a tensor of at most two, and renaming / reordering / broadcasting /
slicing are explicit views. Named axes are not consulted after this pass.
"""

import numpy as np

from geon.op_graph import collectives as coll
from geon.op_graph import conv as cv
from geon.op_graph import nn_ops as nn
from geon.op_graph import op_graph as og
from geon.op_graph import primitives as pr
from geon.op_graph.axes import Axes, Axis, FlattenedAxis
from geon.op_graph.symbols import Sym
from geon.transformers.passes import RewritePass

_REDUCE = {og.Sum: pr.ReduceSum, og.Prod: pr.ReduceProd, og.Max: pr.ReduceMax,
           og.Min: pr.ReduceMin, og.ArgMax: pr.ReduceArgMax, og.ArgMin: pr.ReduceArgMin}


def view_as(x, axes):
    """``x`` as a positional view with exactly ``axes`` (x's axes must be a subset)."""
    if x.axes == axes:
        return x
    if isinstance(x, og.Constant) and x.scalar is not None:
        return og.Constant(x.scalar, axes=axes, dtype=x.dtype)
    names = x.axes.names
    present = [n for n in axes.names if n in names]
    if present != list(names):
        x = pr.Dimshuffle(x, [names.index(n) for n in present])
    if len(present) != len(axes):
        x = pr.Expand(x, axes, [present.index(n) if n in present else None
                                for n in axes.names])
    elif x.axes != axes:
        x = pr.Reshape(x, axes)
    return x


def _group(axes, unit_name):
    """One axis standing for ``axes``: the axis itself, a flattened axis, or unit."""
    if len(axes) == 1:
        return axes[0]
    if len(axes) == 0:
        return Axis(1, unit_name)
    return FlattenedAxis(axes)


def as_matrix(x, rows, cols, unit):
    """``x`` arranged as a 2-D (rows, cols) view; ``rows``/``cols`` are Axes groups.
    Where ``x`` is laid out (cols, rows) and a group has several axes, the transposed
    view of its (cols, rows) reshape: a reshape of the transposed layout would be a
    copy (a weight's gradient summed over the steps of a loop, ``h`` stacked (T, B, H)
    read as (H, T*B))."""
    shape = Axes(_group(rows, unit + "_r"), _group(cols, unit + "_c"))
    if len(rows) and len(cols) and max(len(rows), len(cols)) > 1 \
            and x.axes == cols + rows:
        flipped = Axes(shape[1], shape[0])
        return pr.Dimshuffle(x if x.axes == flipped else pr.Reshape(x, flipped), (1, 0))
    x = view_as(x, rows + cols)
    return x if x.axes == shape else pr.Reshape(x, shape)


def _scalar(a):
    return not len(a.axes) and isinstance(a, og.Constant)


def lower_elementwise(op):  # f(a, b) -> f(view(a), view(b)) with equal layouts
    # Scalar constants stay as they are: every backend broadcasts a number.
    if all(a.axes == op.axes or _scalar(a) for a in op.args):
        return None
    return type(op)(*[a if _scalar(a) else view_as(a, op.axes) for a in op.args],
                    dtype=op.dtype)


def as_batched(x, batch, rows, cols, unit):
    """``x`` as a (batch..., rows, cols) view for a batched :class:`~pr.Gemm`: ``rows``
    and ``cols`` are Axes groups of ``x``, each made one axis (a reshape where a group
    has several axes). Batch axes that ``x`` lacks (stride-0 broadcasts) and empty
    groups (unit axes) are added last, by one broadcast view, so that no reshape reads
    through a broadcast (which would need a copy)."""
    present = Axes(a for a in batch if a in x.axes)
    x = view_as(x, present + rows + cols)
    groups = [_group(g, unit + s) for g, s in ((rows, "_r"), (cols, "_c"))]
    merged = present + Axes(g for g, axes in zip(groups, (rows, cols)) if len(axes))
    if x.axes != merged:
        x = pr.Reshape(x, merged)
    full = batch + Axes(groups)
    if x.axes != full:
        x = pr.Expand(x, full, [merged.index(a) if a in merged else None for a in full])
    return x


def _product_layout(op):
    """``(batch, rows, cols)``, groups of ``op``'s result axes: the batched product
    computes (batch..., rows, cols) with ``rows`` from ``a`` alone and ``cols`` from
    ``b`` alone. Preferably the result's own order (no transposed result): its longest
    tail of a-only axes then b-only axes is (rows, cols), the rest the batch, where
    ``b`` is broadcast over a-only axes before the last batch axis. Where that leaves no
    rows, the batch is the batch axes alone and the result a transposed view."""
    a, b = op.args
    out = op.axes
    a_only, b_only = a.axes - b.axes, b.axes - a.axes
    i = len(out)
    while i and out[i - 1] in b_only:
        i -= 1
    j = i
    while j and out[j - 1] in a_only:
        j -= 1
    if j == i and len(a_only):  # (batch..., 1, K) products: one matrix-vector each
        return op.batch_axes, out & a_only, out & b_only
    return Axes(tuple(out)[:j]), Axes(tuple(out)[j:i]), Axes(tuple(out)[i:])


def lower_dot(op):  # dot(a, b) -> reshape(gemm(a as (B.., M, K), b as (B.., K, N)))
    a, b = op.args
    red = op.reduction_axes
    if not len(red):  # an outer product (batched or not) is a broadcast multiply
        return og.Multiply(a, b, dtype=op.dtype)
    batch, m, n = _product_layout(op)
    if not len(batch):
        g = pr.Gemm(as_matrix(a, m, red, "_dot_m"), as_matrix(b, red, n, "_dot_n"),
                    dtype=op.dtype)
        return g if g.axes == op.axes else pr.Reshape(g, op.axes)
    g = pr.Gemm(as_batched(a, batch, m, red, "_dot_m"), as_batched(b, batch, red, n, "_dot_n"),
                dtype=op.dtype)
    full = batch + m + n
    if g.axes != full:
        g = pr.Reshape(g, full)
    return g if full == op.axes else pr.Dimshuffle(g, [full.index(x) for x in op.axes])


def lower_reduction(op):  # reduce(x, axes) -> reshape(reduce1(x as (kept, reduced)))
    x = op.args[0]
    red = op.reduction_axes
    if not len(red):
        if isinstance(op, og.ArgMax):
            return og.Constant(0, axes=op.axes, dtype=op.dtype)
        return view_as(x, op.axes)
    if len(op.axes):
        xm = as_matrix(x, op.axes, red, "_red")
        r = _REDUCE[type(op)](xm, 1, dtype=op.dtype)
    else:
        flat = view_as(x, red)
        if len(red) > 1:
            flat = pr.Reshape(flat, Axes(FlattenedAxis(red)))
        r = _REDUCE[type(op)](flat, 0, dtype=op.dtype)
    return r if r.axes == op.axes else pr.Reshape(r, op.axes)


def lower_view(op):  # broadcast / reorder -> Dimshuffle + Expand
    return view_as(op.args[0], op.axes)


def lower_rename(op):  # cast_axes / flatten / unflatten -> Reshape
    return pr.Reshape(op.args[0], op.axes)


def lower_slice(op):  # slice along an axis -> SliceView
    x = op.args[0]
    key = [slice(None)] * len(x.axes)
    key[op.axis_pos] = op.key
    return pr.SliceView(x, key, op.axes)


def lower_one_hot(op):  # one_hot(x, A) -> equal(arange(A), x)
    x = op.args[0]
    idx = og.Constant(np.arange(op.axis.length), axes=Axes(op.axis), dtype=x.dtype)
    return og.Equal(idx, x, dtype=op.dtype)


def as_three(x, outer, axis, inner, unit):
    """``x`` (axes ``outer + axis + inner`` in some order) as a 3-D (outer, axis, inner)
    view; empty groups become unit axes."""
    x = view_as(x, outer + Axes(axis) + inner)
    shape = Axes((_group(outer, unit + "_o"), axis, _group(inner, unit + "_i")))
    return x if x.axes == shape else pr.Reshape(x, shape)


def _as_vector(idx, unit):
    return idx if len(idx.axes) == 1 else pr.Reshape(idx, Axes(_group(idx.axes, unit)))


def lower_gather(op):  # gather(x, i, A) -> reshape(take(x as (outer, A, inner), i as (M,)))
    x, idx = op.args
    p = x.axes.index(op.axis)
    outer, inner = Axes(x.axes[:p]), Axes(x.axes[p + 1:])
    t = pr.Take(as_three(x, outer, op.axis, inner, "_gather"), _as_vector(idx, "_gather_m"),
                dtype=op.dtype)
    return t if t.axes == op.axes else pr.Reshape(t, op.axes)


def lower_scatter_add(op):  # scatter_add(d, i, A) -> reshape(put_add(d as (o, M, i), i))
    d, idx = op.args
    p = op.axes.index(op.axis)
    outer, inner = Axes(op.axes[:p]), Axes(op.axes[p + 1:])
    m = _group(idx.axes, "_scatter_m")
    d3 = view_as(d, outer + idx.axes + inner)
    o, i = _group(outer, "_scatter_o"), _group(inner, "_scatter_i")
    if d3.axes != Axes((o, m, i)):
        d3 = pr.Reshape(d3, Axes((o, m, i)))
    r = pr.PutAdd(d3, _as_vector(idx, "_scatter_m"), Axes((o, op.axis, i)), dtype=op.dtype)
    return r if r.axes == op.axes else pr.Reshape(r, op.axes)


def _outer_inner(x, axis):
    p = x.axes.index(axis)
    return Axes(x.axes[:p]), Axes(x.axes[p + 1:])


def lower_cumsum(op):  # cumsum(x, A) -> prefix_sum(x as (outer, A, inner)); flips, shift
    x = op.args[0]
    outer, inner = _outer_inner(x, op.axis)
    c = as_three(x, outer, op.axis, inner, "_cumsum")
    flip = (slice(None), slice(None, None, -1), slice(None))
    if op.reverse:
        c = pr.SliceView(c, flip, c.axes)
    c = pr.PrefixSum(c, dtype=op.dtype)
    n = op.axis.length
    if op.exclusive and n:  # entry i is the inclusive sum of i - 1: a shifted copy
        o, a, i = c.axes
        head = pr.SliceView(c, (slice(None), slice(0, n - 1), slice(None)),
                            Axes((o, Axis(n - 1, a.name + "[:-1]"), i)))
        c = pr.Unslice(head, c.axes, (slice(None), slice(1, n), slice(None)))
    if op.reverse:
        c = pr.SliceView(c, flip, c.axes)
    return c if c.axes == op.axes else pr.Reshape(c, op.axes)


def _negated(x):
    """An order-reversing map of ``x`` that is its own inverse: ``-x`` for floats; for
    integers ``c - x`` with ``c`` = -1 (signed) or the largest value (unsigned), which
    never overflows (``0 - x`` does for unsigned values and for the smallest signed)."""
    if x.dtype.kind == "f":
        return og.Negative(x)
    c = np.iinfo(x.dtype).max if x.dtype.kind == "u" else -1
    return og.Subtract(og.Constant(c, dtype=x.dtype), x, dtype=x.dtype)


def _lowered_sort(m, op):
    """The SortPrim a sibling output of ``m`` was already lowered to, if any."""
    for o in m.outputs:
        if o is op or o.forward is None:
            continue
        cur = og.snap(o)
        for _ in range(6):  # through the reshape, slice, negation and copy on the way
            if isinstance(cur, og.Output) and isinstance(cur.args[0], pr.SortPrim):
                return cur.args[0]
            rest = [a for a in cur.args if not isinstance(a, og.Constant)]
            if not rest:
                break
            cur = rest[0]
    return None


def lower_sort_output(op):  # sort / topk output -> SortPrim output (negated, sliced)
    m = op.args[0]
    x = m.args[0]
    descending = isinstance(m, nn.TopK) or m.descending
    prim = _lowered_sort(m, op)
    if prim is None:
        outer, inner = _outer_inner(x, m.axis)
        x3 = as_three(x, outer, m.axis, inner, "_sort")
        prim = pr.SortPrim(_negated(x3) if descending else x3)
    out = prim.outputs[op.index]
    if op.index == 0 and descending:
        out = _negated(out)
    if isinstance(m, nn.TopK):
        o, _, i = out.axes
        out = pr.SliceView(out, (slice(None), slice(0, m.k), slice(None)),
                           Axes((o, m.new_axis, i)))
    return out if out.axes == op.axes else pr.Reshape(out, op.axes)


def lower_tensor_size(op):  # tensor_size(x) -> constant
    n = op.reduction_axes.size if len(op.reduction_axes) else 1
    if isinstance(n, Sym):  # tensor_size(x) -> its symbolic length, bound per call
        return pr.LengthValue(n, dtype=op.dtype)
    return og.Constant(n, axes=op.axes, dtype=op.dtype)


def lower_stop_gradient(op):  # stop_gradient(x) -> x
    return op.args[0]


def lower_setitem(op):  # SetItem(t, v) -> Assign(t, view(v))
    t, v = op.args
    # The tags say whether a later computation of the reads may run it unannounced.
    return pr.Assign(t, view_as(v, t.axes), tags=op.tags)


def _one_block(key, shape):
    """Whether ``key`` (one int or slice per dimension of ``shape``) selects one block
    of row-major memory: indices, then at most one unit-step slice, then whole
    dimensions (``x[2, 1:3, :]``)."""
    k = 0
    while k < len(key) and not isinstance(key[k], slice):
        k += 1
    if k < len(key) and key[k].step in (None, 1):
        k += 1
    # (a whole dimension: slice(None), the only slice of a symbolic length)
    return all(isinstance(key[j], slice) and (key[j] == slice(None) or not any(
        isinstance(v, Sym) for v in (shape[j], key[j].start, key[j].stop))
        and key[j].indices(shape[j]) == (0, shape[j], 1)) for j in range(k, len(key)))


def _contiguous(x):
    """Whether ``x``'s row-major order is its storage order."""
    if isinstance(x, pr.Dimshuffle):
        kept = [p for p, a in zip(x.perm, x.axes) if a.length != 1]
        return kept == sorted(kept) and _contiguous(x.args[0])
    if isinstance(x, pr.Expand):
        return all(a.length == 1 for a, m in zip(x.axes, x.dim_map) if m is None) \
            and _contiguous(x.args[0])
    if isinstance(x, pr.SliceView):
        return _one_block(x.key, x.args[0].axes.shape) and _contiguous(x.args[0])
    if isinstance(x, pr.Reshape):
        return _contiguous(x.args[0])
    return True


def reshape_contiguous(op):  # reshape(noncontiguous view) -> reshape(copy(view))
    x = op.args[0]
    if _contiguous(x):
        return None
    return pr.Reshape(pr.Copy(x), op.axes)


def _lowered_sibling(m, op):
    """The ReduceMaxArgMax a sibling output of ``m`` was already lowered to, if any."""
    for o in m.outputs:
        if o is op or o.forward is None:
            continue
        s = og.snap(o)
        s = s.args[0] if isinstance(s, pr.Reshape) else s
        if isinstance(s, og.Output) and isinstance(s.args[0], pr.ReduceMaxArgMax):
            return s.args[0]
    return None


def lower_output(op):  # split part -> slice view; max_argmax -> ReduceMaxArgMax
    m = op.args[0]
    if isinstance(m, (nn.Sort, nn.TopK)):
        return lower_sort_output(op)
    if isinstance(m, og.Split):
        x = m.args[0]
        key = [slice(None)] * len(x.axes)
        key[m.axis_pos] = m.keys[op.index]
        return pr.SliceView(x, key, op.axes)
    if isinstance(m, og.MaxArgMax):
        x, red = m.args[0], m.reduction_axes
        if not len(red):
            return view_as(x, op.axes) if op.index == 0 else \
                og.Constant(0, axes=op.axes, dtype=op.dtype)
        prim = _lowered_sibling(m, op)  # both outputs share one primitive
        if prim is None:
            if len(m.out_axes):
                prim = pr.ReduceMaxArgMax(as_matrix(x, m.out_axes, red, "_red"), 1)
            else:
                flat = view_as(x, red)
                if len(red) > 1:
                    flat = pr.Reshape(flat, Axes(FlattenedAxis(red)))
                prim = pr.ReduceMaxArgMax(flat, 0)
        out = prim.outputs[op.index]
        return out if out.axes == op.axes else pr.Reshape(out, op.axes)
    return None


def contiguous_collective(op):  # allreduce(strided view or constant) -> allreduce(copy)
    # MPI sends and receives contiguous buffers; a constant's must not be overwritten
    x = op.args[0]
    if not isinstance(x, og.Constant) and _contiguous(x):
        return None
    return type(op)(pr.Copy(x), **op.attr_values())


def lower_unslice_add(op):  # UnsliceAdd(x, a) -> x + Unslice(a): the standard ops
    """The NumPy transformer's own :class:`~pr.UnsliceAdd` (its ``unslice_add`` pass
    makes it, in the graph the frontend holds, through ``forward``) as the standard ops
    it stands for, so that a graph another transformer compiled first still lowers
    here (the NumPy transformer's pass makes it again after this one)."""
    x = op.args[0]
    x = x if x.axes == op.axes else pr.Reshape(x, op.axes)
    return og.Add(x, pr.Unslice(op.args[1], op.axes, op.key), dtype=op.dtype)


class LowerAxesPass(RewritePass):
    """Axes ops -> semi-primitive ops on row-major buffers."""

    name = "lower"
    rules = [
        (og.ElementWise, lower_elementwise),
        (og.Dot, lower_dot),
        (og.Reduction, lower_reduction),
        ((og.Broadcast, og.AxesWithOrder), lower_view),
        ((og.CastAxes, og.Flatten, og.Unflatten), lower_rename),
        (og.Slice, lower_slice),
        (og.OneHot, lower_one_hot),
        (nn.Gather, lower_gather),
        (nn.ScatterAdd, lower_scatter_add),
        (nn.CumSum, lower_cumsum),
        (og.TensorSize, lower_tensor_size),
        (og.StopGradient, lower_stop_gradient),
        (og.SetItem, lower_setitem),
        (pr.Reshape, reshape_contiguous),
        (pr.UnsliceAdd, lower_unslice_add),
        (og.Output, lower_output),
        (cv.Convolution, cv.lower_convolution),
        (cv.Pooling, cv.lower_pooling),
        ((coll.AllReduce, coll.BroadcastFrom), contiguous_collective),
    ]
