"""Gathers and scatters, with every reduction the opset allows."""

import numpy as np

import geon as be
from geon.frontends.onnx.builders.base import _norm_axis, _same, carrier, cast, onnx_op
from geon.frontends.onnx.builders.shapes import _slice_along
from geon.frontends.onnx.loading import InvalidOnnxModel, element_count
from geon.op_graph import nn_ops
from geon.op_graph import op_graph as og
from geon.op_graph.axes import Axes
from geon.op_graph.coercion import PositionalAxis, temp_axis

gnp = be.np


@onnx_op("GatherElements", 11)
def _gather_elements(ctx):
    dshape, ishape = ctx.shape(0), ctx.shape(1)
    axis = _norm_axis(ctx, ctx.attr("axis", 0), len(dshape))
    if len(dshape) != len(ishape) or any(i > d for k, (i, d) in enumerate(zip(ishape, dshape))
                                         if k != axis):
        raise ctx.unsupported(f"indices of shape {ishape} for data of shape {dshape}")
    if ctx.dtype(1).kind not in "iu":
        raise ctx.unsupported("indices must be integers")
    # Positions in the flattened data: the index along `axis`, the element's own
    # position along the others (known at import).
    idx = cast(ctx.tensor(1), np.int64)
    length = dshape[axis]
    idx = gnp.where(idx < 0, idx + length, idx)
    strides = [element_count(dshape[k + 1:]) for k in range(len(dshape))]
    ctx.bound((len(ishape),) + tuple(ishape), np.int64, "the positions of the indices")
    grid = np.indices(ishape, dtype=np.int64)
    offset = sum(grid[k] * strides[k] for k in range(len(dshape)) if k != axis)
    flat = idx * strides[axis] + gnp.constant(np.asarray(offset, np.int64))
    return [ctx.out(gnp.take(gnp.ravel(ctx.tensor(0)), flat), ctx.dtype(0))]


# --- gathers and scatters -----------------------------------------------------------------

def _int_input(ctx, i, what="indices"):
    if ctx.dtype(i).kind not in "iu":
        raise ctx.unsupported(f"{what} must be integers, not {ctx.dtype(i)}")
    v = ctx.value(i)
    return v.array.astype(np.int64) if v.array is not None else cast(v.tensor(), np.int64)


def _linear_positions(ctx, idx, dims, what="index"):
    """The row-major positions in a tensor of shape ``dims`` of the index tuples along
    the last axis of ``idx`` (an int64 array known at import, or an op), negative
    entries counted from the end. Known indices out of range raise
    :class:`InvalidOnnxModel`; computed ones are mapped to a position out of range, so
    that the gather or scatter using them raises when the model runs."""
    n = len(dims)
    total = element_count(dims)
    strides = [element_count(dims[j + 1:]) for j in range(n)]
    if isinstance(idx, np.ndarray):
        if np.any((idx < -np.array(dims, np.int64)) | (idx >= np.array(dims, np.int64))):
            raise InvalidOnnxModel(f"{ctx.where}: an {what} is out of range for the "
                                   f"dimensions {list(dims)}")
        idx = np.where(idx < 0, idx + np.array(dims, np.int64), idx)
        return (idx * np.array(strides, np.int64)).sum(-1) if n else \
            np.zeros(idx.shape[:-1], np.int64)
    if n == 0:
        return gnp.zeros(gnp.shape(idx)[:-1], dtype=np.int64)
    pos, bad = None, None
    for j, d in enumerate(dims):
        c = gnp.squeeze(_slice_along(idx, gnp.ndim(idx) - 1, j, j + 1), -1)
        c = gnp.where(c < 0, c + d, c)
        out = gnp.less(c, 0) + gnp.greater_equal(c, d)
        bad = out if bad is None else bad + out
        term = c * strides[j] if strides[j] != 1 else c
        pos = term if pos is None else pos + term
    return gnp.where(bad > 0, np.int64(total), pos)


def _scatter_add_rows(upd, pos, n):
    """Zeros of shape ``(n, K)`` with the rows of ``upd`` (M, K) added at the positions
    ``pos`` (M,) (repeated positions accumulate): geon's ``ScatterAdd``."""
    m, k = gnp.shape(upd)
    t = temp_axis(m)
    u = og.CastAxes(upd, Axes([t, PositionalAxis(k, "-1")]))
    i = og.CastAxes(pos, Axes([t]))
    return nn_ops.ScatterAdd(u, i, PositionalAxis(n, "-2"))


def _typed(value, dtype):
    """``value`` as a NumPy scalar of ``dtype``: a branch of ``where`` beside 64-bit
    integers must not be a Python number, which would pass them through float64."""
    return np.array(value, dtype=dtype)[()]


_COMBINE = {"mul": gnp.multiply, "max": gnp.maximum, "min": gnp.minimum}


def _lowest(dtype, high=False):
    if np.dtype(dtype).kind == "f":
        return np.inf if high else -np.inf
    info = np.iinfo(dtype)
    return info.max if high else info.min


def _scatter_rows(ctx, data, pos, upd, reduction):
    """``data`` (N, K) with the rows of ``upd`` (M, K) written at the row positions
    ``pos`` (M,): replacing (``none``) or combined by ``add``, ``mul``, ``max``, ``min``.

    Positions known at import are applied as ONNX's reference applies them, in order
    (for ``none`` the last write to a row wins): one gather of the updates per round of
    repeated positions. Positions computed at run time go through ``ScatterAdd`` (for
    ``none``, a repeated position gets the sum of its updates: ONNX leaves it
    undefined), or for ``mul``, ``max`` and ``min`` through an (M, N) one-hot
    comparison of the positions with the rows."""
    n, k = gnp.shape(data)
    m = gnp.shape(upd)[0]
    if reduction == "add":
        p = gnp.constant(pos) if isinstance(pos, np.ndarray) else pos
        return data + _scatter_add_rows(upd, p, n)
    if isinstance(pos, np.ndarray):
        ctx.bound((2, n), np.int64, "the rows written", known=True)
        if reduction == "none":  # the last write to each row
            rev = pos[::-1]
            _, first = np.unique(rev, return_index=True)
            rounds = [m - 1 - first]
        else:  # rounds of distinct positions, in the order of the updates
            order = np.argsort(pos, kind="stable")
            s = pos[order]
            start = np.r_[0, np.flatnonzero(s[1:] != s[:-1]) + 1]
            rank = np.empty(m, np.int64)
            rank[order] = np.arange(m) - np.repeat(start, np.diff(np.r_[start, m]))
            rounds = [np.flatnonzero(rank == r) for r in range(int(rank.max()) + 1)]
        out = data
        for sel in rounds:
            src = np.zeros(n, np.int64)
            src[pos[sel]] = sel
            hit = np.zeros((n, 1), np.float32)
            hit[pos[sel]] = 1.0
            g = gnp.take(upd, gnp.constant(src), 0)
            h = gnp.constant(hit)
            out = gnp.where(h, g if reduction == "none" else _COMBINE[reduction](out, g), out)
        return out
    if reduction == "none":
        ones = gnp.ones((m, 1), dtype=np.float32)
        count = _scatter_add_rows(ones, pos, n)
        return gnp.where(count > 0, _scatter_add_rows(upd, pos, n), data)
    ctx.bound((m, n, k), carrier(ctx.dtype(0)), "the one-hot expansion of the scatter")
    onehot = gnp.equal(gnp.reshape(pos, (m, 1)),
                       gnp.constant(np.arange(n, dtype=np.int64).reshape(1, n)))
    sel = gnp.reshape(onehot, (m, n, 1))
    u3 = gnp.reshape(upd, (m, 1, k))
    if reduction == "mul":
        return data * gnp.prod(gnp.where(sel, u3, _typed(1, upd.dtype)), 0)
    fill = _typed(_lowest(upd.dtype, high=reduction == "min"), upd.dtype)
    picked = gnp.where(sel, u3, fill)
    red = gnp.max(picked, 0) if reduction == "max" else gnp.min(picked, 0)
    hit = gnp.reshape(gnp.max(onehot, 0), (n, 1))
    return gnp.where(hit, _COMBINE[reduction](data, red), data)


def _reduction_attr(ctx, allowed):
    r = ctx.attr("reduction", "none")
    if r not in allowed:
        raise ctx.unsupported(f"reduction={r!r} (opset {ctx.version} allows "
                              f"{', '.join(allowed)})")
    return r


def _reductions(version):
    return ("none",) if version < 16 else ("none", "add", "mul") if version < 18 else \
        ("none", "add", "mul", "max", "min")


@onnx_op("ScatterND", 11)
def _scatter_nd(ctx):
    reduction = _reduction_attr(ctx, _reductions(ctx.version))
    dshape, ishape, ushape = ctx.shape(0), ctx.shape(1), ctx.shape(2)
    if not ishape:
        raise InvalidOnnxModel(f"{ctx.where}: indices must have rank >= 1")
    k = ishape[-1]
    if k > len(dshape) or tuple(ushape) != tuple(ishape[:-1]) + tuple(dshape[k:]):
        raise InvalidOnnxModel(f"{ctx.where}: updates of shape {ushape} do not fit indices "
                               f"{ishape} into data {dshape}")
    idx = _int_input(ctx, 1)
    m, rows, width = element_count(ishape[:-1]), element_count(dshape[:k]), \
        element_count(dshape[k:])
    if 0 in dshape or m == 0:  # nothing to write (or nowhere to write it)
        return [ctx.value(0)]
    pos = _linear_positions(ctx, idx, dshape[:k])
    pos = pos.reshape(-1) if isinstance(pos, np.ndarray) else gnp.reshape(pos, (m,))
    data = gnp.reshape(ctx.tensor(0), (rows, width))
    upd = gnp.reshape(ctx.tensor(2), (m, width))
    r = _scatter_rows(ctx, data, pos, upd, reduction)
    return [_same(ctx, gnp.reshape(r, dshape))]


def _element_positions(ctx, dshape, ishape, axis, idx):
    """Flat positions in ``data`` of ``GatherElements`` / ``ScatterElements``' indices:
    the index along ``axis``, the element's own position along the others."""
    length = dshape[axis]
    strides = [element_count(dshape[j + 1:]) for j in range(len(dshape))]
    ctx.bound((len(ishape),) + tuple(ishape), np.int64, "the positions of the indices")
    grid = np.indices(ishape, dtype=np.int64)
    offset = sum((grid[j] * strides[j] for j in range(len(dshape)) if j != axis),
                 np.zeros(ishape, np.int64))
    total = element_count(dshape)
    if isinstance(idx, np.ndarray):
        if np.any((idx < -length) | (idx >= length)):
            raise InvalidOnnxModel(f"{ctx.where}: an index is out of range for an axis of "
                                   f"length {length}")
        return np.where(idx < 0, idx + length, idx) * strides[axis] + offset
    idx = gnp.where(idx < 0, idx + length, idx)
    bad = gnp.less(idx, 0) + gnp.greater_equal(idx, length)
    return gnp.where(bad > 0, np.int64(total), idx * strides[axis] + gnp.constant(offset))


def _scatter_elements(ctx, reduction):
    dshape, ishape = ctx.shape(0), ctx.shape(1)
    axis = _norm_axis(ctx, ctx.attr("axis", 0), len(dshape))
    if len(ishape) != len(dshape) or tuple(ctx.shape(2)) != tuple(ishape) or \
            any(i > d for j, (i, d) in enumerate(zip(ishape, dshape)) if j != axis):
        raise InvalidOnnxModel(f"{ctx.where}: indices {ishape} and updates {ctx.shape(2)} do "
                               f"not fit data {dshape} along axis {axis}")
    idx = _int_input(ctx, 1)
    m, total = element_count(ishape), element_count(dshape)
    if total == 0 or m == 0:
        return [ctx.value(0)]
    pos = _element_positions(ctx, dshape, ishape, axis, idx)
    pos = pos.reshape(-1) if isinstance(pos, np.ndarray) else gnp.reshape(pos, (m,))
    data = gnp.reshape(ctx.tensor(0), (total, 1))
    upd = gnp.reshape(ctx.tensor(2), (m, 1))
    r = _scatter_rows(ctx, data, pos, upd, reduction)
    return [_same(ctx, gnp.reshape(r, dshape))]


@onnx_op("ScatterElements", 11)
def _scatter_elements_op(ctx):
    return _scatter_elements(ctx, _reduction_attr(ctx, _reductions(ctx.version)))


@onnx_op("Scatter", 9)
def _scatter_op(ctx):  # ScatterElements before it was renamed
    return _scatter_elements(ctx, "none")


@onnx_op("GatherND", 11)
def _gather_nd(ctx):
    dshape, ishape = ctx.shape(0), ctx.shape(1)
    b = ctx.attr("batch_dims", 0) if ctx.version >= 12 else 0
    if not 0 <= b < min(len(dshape), len(ishape)) or \
            tuple(dshape[:b]) != tuple(ishape[:b]):
        raise InvalidOnnxModel(f"{ctx.where}: indices {ishape} do not fit data {dshape} "
                               f"with batch_dims={b}")
    k = ishape[-1]
    if b + k > len(dshape):
        raise InvalidOnnxModel(f"{ctx.where}: index tuples of length {k} for data {dshape} "
                               f"with batch_dims={b}")
    out_shape = tuple(ishape[:-1]) + tuple(dshape[b + k:])
    ctx.bound(out_shape, carrier(ctx.dtype(0)))
    if 0 in out_shape:
        return [ctx.known(np.empty(out_shape, ctx.dtype(0)))]
    batches, rows, width = element_count(dshape[:b]), element_count(dshape[b:b + k]), \
        element_count(dshape[b + k:])
    idx = _int_input(ctx, 1)
    pos = _linear_positions(ctx, idx, dshape[b:b + k])     # shape ishape[:-1]
    # Each batch's rows follow the previous batch's: an offset known at import.
    offset = (np.arange(batches, dtype=np.int64) * rows).reshape(
        tuple(dshape[:b]) + (1,) * (len(ishape) - 1 - b))
    m = element_count(ishape[:-1])
    if isinstance(pos, np.ndarray):
        flat = gnp.constant((pos + offset).reshape(m))
    else:
        flat = gnp.reshape(pos + gnp.constant(offset) if b else pos, (m,))
    table = gnp.reshape(ctx.tensor(0), (batches * rows, width))
    return [ctx.out(gnp.reshape(gnp.take(table, flat, 0), out_shape), ctx.dtype(0))]


@onnx_op("TensorScatter", 24)
def _tensor_scatter(ctx):
    """``update`` written into the cache ``past_cache`` along ``axis`` from each batch
    entry's ``write_indices`` (0 if absent), wrapping around in ``circular`` mode."""
    cshape, ushape = ctx.shape(0), ctx.shape(1)
    axis = _norm_axis(ctx, ctx.attr("axis", -2), len(cshape))
    mode = ctx.attr("mode", "linear")
    if mode not in ("linear", "circular"):
        raise ctx.unsupported(f"mode={mode!r}")
    if axis == 0 or len(ushape) != len(cshape) or \
            any(u != c for j, (u, c) in enumerate(zip(ushape, cshape)) if j != axis) or \
            ushape[axis] > cshape[axis]:
        raise InvalidOnnxModel(f"{ctx.where}: update {ushape} does not fit the cache "
                               f"{cshape} along axis {axis}")
    batch, length, steps = cshape[0], cshape[axis], ushape[axis]
    # (batch, axis, rest): the cache rows of each batch entry, the update's rows
    perm = [0, axis] + [j for j in range(1, len(cshape)) if j != axis]
    inv = list(np.argsort(perm))
    width = element_count([cshape[j] for j in perm[2:]])
    cache = gnp.reshape(gnp.transpose(ctx.tensor(0), perm), (batch * length, width))
    upd = gnp.reshape(gnp.transpose(ctx.tensor(1), perm), (batch * steps, width))
    step = np.arange(steps, dtype=np.int64).reshape(1, steps)
    base = (np.arange(batch, dtype=np.int64) * length).reshape(batch, 1)
    if ctx.has(2):
        start = _int_input(ctx, 2, "write_indices")
        if isinstance(start, np.ndarray):
            p = start.reshape(batch, 1) + step
            if mode == "circular":
                p = p % length
            elif np.any((start < 0) | (p >= length)):
                raise InvalidOnnxModel(f"{ctx.where}: write_indices {start.tolist()} run "
                                       f"past the cache length {length}")
            pos = (p + base).reshape(-1)
        else:
            p = gnp.reshape(start, (batch, 1)) + gnp.constant(step)
            if mode == "circular":
                p = gnp.where(p >= length, p - length, p)  # start < length, steps <= length
            p = gnp.where(gnp.less(p, 0) + gnp.greater_equal(p, length) > 0,
                          np.int64(batch * length), p + gnp.constant(base))
            pos = gnp.reshape(p, (batch * steps,))
    else:
        pos = (np.zeros((batch, 1), np.int64) + step + base).reshape(-1)
    r = _scatter_rows(ctx, cache, pos, upd, "none")
    shape_t = [cshape[j] for j in perm]
    return [_same(ctx, gnp.transpose(gnp.reshape(r, shape_t), inv))]
