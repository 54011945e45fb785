"""Shapes and layouts: reshaping, slicing, concatenation, padding, casts, constants,
ranges, dropout, one-hot, depth/space rearrangements and crops."""

import numpy as np

import geon as be
from geon.op_graph.symbols import Sym
from geon.frontends.onnx.builders.base import _norm_axis, carrier, cast, onnx_op, to_narrow
from geon.frontends.onnx.loading import (InvalidOnnxModel, elem_dtype, elem_name,
                                         element_count, narrow_format)

gnp = be.np


# --- shapes -----------------------------------------------------------------------------

def _shape_arg(ctx, i):
    return [d if isinstance(d, Sym) else int(d) for d in np.ravel(ctx.const(i))]


def _ints(values):
    """``values`` (ints, maybe symbolic lengths) as a known int64 array: an object
    array where one is symbolic (see ``importer.is_symbolic_array``)."""
    values = list(values) if not isinstance(values, (int, Sym)) else values
    flat = values if isinstance(values, list) else [values]
    if any(isinstance(v, Sym) for v in flat):
        arr = np.empty(len(flat), dtype=object)
        arr[:] = flat
        return arr if isinstance(values, list) else arr.reshape(())
    return np.array(values, np.int64)


@onnx_op("Shape", 1)
def _shape(ctx):
    shape = ctx.shape(0)
    start, end = ctx.attr("start", 0), ctx.attr("end", None)
    return [ctx.known(_ints(list(shape[slice(start, end)])), np.int64)]


@onnx_op("Size", 1)
def _size(ctx):
    return [ctx.known(_ints(element_count(ctx.shape(0))), np.int64)]


@onnx_op("Reshape", 5)
def _reshape(ctx):
    shape = _shape_arg(ctx, 1)
    allowzero = ctx.attr("allowzero", 0)
    old = ctx.shape(0)
    if not allowzero:
        shape = [old[k] if d == 0 and k < len(old) else d for k, d in enumerate(shape)]
    # The given dimensions, exactly (one -1 is inferred by the reshape): astronomical
    # ones are refused here, not wrapped around by an int64 product.
    ctx.bound([d for d in shape if d != -1], ctx.dtype(0), "the target shape")
    return [ctx.out(gnp.reshape(ctx.tensor(0), shape), ctx.dtype(0))]


@onnx_op("Flatten", 1)
def _flatten(ctx):
    shape = ctx.shape(0)
    axis = ctx.attr("axis", 1)
    if not -len(shape) <= axis <= len(shape):
        raise ctx.unsupported(f"axis {axis} out of range")
    if axis < 0:
        axis += len(shape)
    rows = element_count(shape[:axis])
    return [ctx.out(gnp.reshape(ctx.tensor(0), (rows, element_count(shape[axis:]))),
                    ctx.dtype(0))]


@onnx_op("Transpose", 1)
def _transpose(ctx):
    perm = ctx.attr("perm")
    return [ctx.out(gnp.transpose(ctx.tensor(0), perm), ctx.dtype(0))]


def _axes_arg(ctx, since_input):
    if ctx.version >= since_input:
        a = ctx.const(1)
        return None if a is None else [int(v) for v in np.ravel(a)]
    return ctx.attr("axes")


@onnx_op("Squeeze", 1)
def _squeeze(ctx):
    axes = _axes_arg(ctx, 13)
    shape = ctx.shape(0)
    axes = None if not axes else tuple(_norm_axis(ctx, a, len(shape)) for a in axes)
    return [ctx.out(gnp.squeeze(ctx.tensor(0), axes), ctx.dtype(0))]


@onnx_op("Unsqueeze", 1)
def _unsqueeze(ctx):
    axes = _axes_arg(ctx, 13)
    if not axes:
        raise ctx.unsupported("Unsqueeze needs axes")
    n = len(ctx.shape(0)) + len(axes)
    axes = tuple(_norm_axis(ctx, a, n) for a in axes)
    return [ctx.out(gnp.expand_dims(ctx.tensor(0), axes), ctx.dtype(0))]


@onnx_op("Concat", 4)
def _concat(ctx):
    xs = [i for i in range(ctx.n_inputs()) if ctx.has(i)]
    rank = len(ctx.shape(xs[0]))
    axis = _norm_axis(ctx, ctx.attr("axis"), rank)
    out = list(ctx.shape(xs[0]))
    out[axis] = sum(ctx.shape(i)[axis] if len(ctx.shape(i)) == rank else 0 for i in xs)
    ctx.bound(out, carrier(ctx.dtype(xs[0])), known=ctx.all_known())
    if ctx.all_known():  # shapes and constants: NumPy, empty ones too
        return [ctx.known(np.concatenate([ctx.const(i) for i in xs], axis))]
    # Empty inputs add nothing (ONNX allows them; geon has no empty slices to join).
    keep = [i for i in xs if ctx.shape(i)[axis] != 0] or xs[:1]
    if len(keep) == 1:
        return [ctx.out(ctx.tensor(keep[0]), ctx.dtype(keep[0]))]
    return [ctx.out(gnp.concatenate([ctx.tensor(i) for i in keep], axis), ctx.dtype(0))]


def _slice_along(x, axis, start, stop, step=1):
    key = [slice(None)] * gnp.ndim(x)
    key[axis] = slice(start, stop, step)
    return x[tuple(key)]


@onnx_op("Split", 2)
def _split(ctx):
    shape = ctx.shape(0)
    axis = _norm_axis(ctx, ctx.attr("axis", 0), len(shape))
    n_out = len(ctx.node.output)
    if ctx.version >= 13:
        sizes = ctx.const(1)
        sizes = None if sizes is None else [int(s) for s in np.ravel(sizes)]
    else:
        sizes = ctx.attr("split")
    if ctx.version >= 18:
        num = ctx.attr("num_outputs")
        if sizes is None and num is not None:
            n_out = num
            step = -(-shape[axis] // num)
            sizes = [min(step, shape[axis] - k * step) for k in range(num)]
    if not sizes:
        if shape[axis] % n_out:
            raise ctx.unsupported(f"cannot split {shape[axis]} evenly into {n_out}")
        sizes = [shape[axis] // n_out] * n_out
    if sum(sizes) != shape[axis] or any(s < 0 for s in sizes):
        raise ctx.unsupported(f"split sizes {sizes} do not add up to {shape[axis]}")
    start, out = 0, []
    for s in sizes:
        if s == 0 or 0 in shape:  # no elements: known from the shape alone
            part = list(shape)
            part[axis] = s
            out.append(ctx.known(np.empty(part, ctx.dtype(0))))
        else:
            out.append(ctx.out(_slice_along(ctx.tensor(0), axis, start, start + s),
                               ctx.dtype(0)))
        start += s
    return out


@onnx_op("Slice", 1, 9)
def _slice_attr(ctx):
    starts, ends = ctx.attr("starts"), ctx.attr("ends")
    axes = ctx.attr("axes") or list(range(len(starts)))
    return _do_slice(ctx, starts, ends, axes, [1] * len(starts))


@onnx_op("Slice", 10)
def _slice(ctx):
    starts, ends = _shape_arg(ctx, 1), _shape_arg(ctx, 2)
    axes = _shape_arg(ctx, 3) if ctx.has(3) else list(range(len(starts)))
    steps = _shape_arg(ctx, 4) if ctx.has(4) else [1] * len(starts)
    return _do_slice(ctx, starts, ends, axes, steps)


#: bounds at or beyond this magnitude mean "to the end" (exporters write INT64_MAX)
_ENDLESS = 2 ** 31 - 1


def _symbolic_bounds(s, e, st):
    """ONNX's slice bounds where the dimension's length or a bound is symbolic: "to the
    end" as ``None``; other bounds stay (such a slice must fit the length, checked at
    each call; ONNX clamps them)."""
    def far(v, sign):
        return not isinstance(v, Sym) and v * sign >= _ENDLESS
    if st > 0:
        return (0 if far(s, -1) else s), (None if far(e, 1) else e)
    return (None if far(s, 1) else s), (None if far(e, -1) else e)


def _do_slice(ctx, starts, ends, axes, steps):
    shape = ctx.shape(0)
    key = [slice(None)] * len(shape)
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = _norm_axis(ctx, a, len(shape))
        if st == 0:
            raise ctx.unsupported("slice step 0")
        if any(isinstance(v, Sym) for v in (shape[a], s, e)):
            s, e = _symbolic_bounds(s, e, int(st))
        key[a] = slice(s, e, st)
    symbolic = any(isinstance(v, Sym) for k in key for v in (k.start, k.stop))
    if ctx.value(0).array is not None and not symbolic:  # shapes, constants: NumPy
        return [ctx.known(ctx.const(0)[tuple(key)])]
    if any(not any(isinstance(v, Sym) for v in (n, k.start, k.stop))
           and len(range(*k.indices(n))) == 0 for k, n in zip(key, shape)):
        # No elements: the result is known from its shape alone.
        out = tuple(len(range(*k.indices(n))) for k, n in zip(key, shape))
        return [ctx.known(np.empty(out, ctx.dtype(0)))]
    return [ctx.out(ctx.tensor(0)[tuple(key)], ctx.dtype(0))]


@onnx_op("Gather", 1)
def _gather(ctx):
    shape = ctx.shape(0)
    axis = _norm_axis(ctx, ctx.attr("axis", 0), len(shape))
    if ctx.dtype(1).kind not in "iu":
        raise ctx.unsupported("indices must be integers")
    ctx.bound(shape[:axis] + ctx.shape(1) + shape[axis + 1:], carrier(ctx.dtype(0)))
    if ctx.value(1).array is not None:
        idx = ctx.const(1).astype(np.int64)
        n = shape[axis]
        if isinstance(n, Sym) and idx.ndim == 0:  # in range: checked at each call
            return [ctx.out(ctx.tensor(0)[(slice(None),) * axis + (int(idx),)],
                            ctx.dtype(0))]
        if idx.size and (idx.min() < -n or idx.max() >= n):
            raise ctx.unsupported(f"index out of range for axis of length {n}")
        if idx.ndim == 0:  # one position: a slice, the axis dropped
            r = _slice_along(ctx.tensor(0), axis, int(idx) % n, int(idx) % n + 1)
            return [ctx.out(gnp.squeeze(r, axis), ctx.dtype(0))]
        ind = gnp.constant(idx)
    else:
        ind = ctx.tensor(1)
    return [ctx.out(gnp.take(ctx.tensor(0), ind, axis), ctx.dtype(0))]


@onnx_op("Tile", 6)
def _tile(ctx):
    shape, reps = ctx.shape(0), _shape_arg(ctx, 1)
    if len(reps) != len(shape) or any(r < 0 for r in reps):
        raise ctx.unsupported(f"repeats {reps} for an input of shape {shape}")
    ctx.bound([d * r for d, r in zip(shape, reps)], carrier(ctx.dtype(0)))
    return [ctx.out(gnp.tile(ctx.tensor(0), reps), ctx.dtype(0))]


@onnx_op("Expand", 8)
def _expand(ctx):
    target = _shape_arg(ctx, 1)
    ctx.bound(target, carrier(ctx.dtype(0)), "the target shape")
    shape = np.broadcast_shapes(ctx.shape(0), tuple(target))
    ctx.bound(shape, carrier(ctx.dtype(0)))
    return [ctx.out(gnp.broadcast_to(ctx.tensor(0), shape), ctx.dtype(0))]


def _pad_common(ctx, pads, value, axes):
    shape = ctx.shape(0)
    rank = len(shape)
    mode = ctx.attr("mode", "constant")
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise ctx.unsupported(f"mode={mode!r}")
    axes = list(range(rank)) if axes is None else [_norm_axis(ctx, a, rank) for a in axes]
    if len(pads) != 2 * len(axes):
        raise ctx.unsupported(f"pads {pads} do not fit axes {axes}")
    width = [[0, 0] for _ in range(rank)]
    for k, a in enumerate(axes):
        width[a] = [pads[k], pads[k + len(axes)]]
    pos = [[max(b, 0), max(e, 0)] for b, e in width]
    if any((b < 0 or e < 0) and n + b + e <= 0 for (b, e), n in zip(width, shape)):
        raise ctx.unsupported("padding that removes every element")
    dtype = carrier(ctx.dtype(0))
    ctx.bound([n + b + e for (b, e), n in zip(pos, shape)], dtype, "the padded input")
    ctx.bound([n + b + e for (b, e), n in zip(width, shape)], dtype)
    x = ctx.tensor(0)
    if mode == "reflect" and any(p >= n for (b, e), n in zip(pos, shape) for p in (b, e)):
        raise ctx.unsupported("reflect padding as wide as the dimension")
    if mode == "wrap":  # the far end's elements before, the near end's after
        for a, (b, e) in enumerate(pos):
            if b > shape[a] or e > shape[a]:
                raise ctx.unsupported("wrap padding wider than the dimension")
            parts = ([_slice_along(x, a, shape[a] - b, shape[a])] if b else []) + [x] + \
                ([_slice_along(x, a, 0, e)] if e else [])
            x = gnp.concatenate(parts, a) if len(parts) > 1 else x
    elif any(b or e for b, e in pos):
        x = gnp.pad(x, pos, mode=mode, constant_values=value) if mode == "constant" \
            else gnp.pad(x, pos, mode=mode)
    if any(b < 0 or e < 0 for b, e in width):  # negative pads remove elements
        key = []
        for (b, e), n in zip(width, shape):
            size = n + b + e
            if size <= 0:
                raise ctx.unsupported("padding that removes every element")
            start = -b if b < 0 else 0
            key.append(slice(start, start + size))
        x = x[tuple(key)]
    return [ctx.out(x, ctx.dtype(0))]


@onnx_op("Pad", 2, 10)
def _pad_attr(ctx):
    return _pad_common(ctx, ctx.attr("pads"), ctx.attr("value", 0.0), None)


@onnx_op("Pad", 11)
def _pad(ctx):
    pads = _shape_arg(ctx, 1)
    value = ctx.const(2)
    value = 0.0 if value is None or value.size == 0 else float(np.ravel(value)[0])
    axes = _shape_arg(ctx, 3) if ctx.has(3) else None
    return _pad_common(ctx, pads, value, axes)


def _cast_to(ctx, to_type, saturate=True, round_mode="up"):
    dtype = elem_dtype(to_type)
    if dtype is None:
        raise ctx.unsupported(f"cast to {elem_name(to_type)} is not supported")
    src = ctx.dtype(0)
    v = ctx.value(0)
    fmt = narrow_format(dtype)
    if v.array is not None:
        ctx.bound(v.array.shape, np.float64 if fmt is not None else dtype, known=True)
    if v.array is not None and fmt is None:
        return [ctx.known(v.array.astype(dtype))]
    if v.array is not None:  # rounded by geon's rule, then held in the ml_dtypes type
        from geon.op_graph.formats import round_array
        a = v.array.astype(carrier(src))
        if a.dtype.kind == "f" and a.dtype != np.float64:
            a = a.astype(np.float32)
        return [ctx.known(round_array(a, fmt, saturate, round_mode).astype(dtype))]
    op = ctx.tensor(0)
    if src == np.bool_ and dtype != np.bool_:
        op = cast(op, np.float32 if fmt is not None else dtype)
    if fmt is not None:
        return [ctx.out(to_narrow(op, dtype, saturate, round_mode), dtype)]
    return [ctx.out(cast(op, carrier(dtype)), dtype)]


@onnx_op("Cast", 6)
def _cast(ctx):
    # `saturate` matters for the float8 targets, `round_mode` for FLOAT8E8M0 only.
    saturate = bool(ctx.attr("saturate", 1))
    round_mode = ctx.attr("round_mode", "up")
    if round_mode not in ("up", "down", "nearest"):
        raise ctx.unsupported(f"round_mode={round_mode!r}")
    return _cast_to(ctx, ctx.attr("to"), saturate, round_mode)


@onnx_op("CastLike", 15)
def _cast_like(ctx):
    saturate = bool(ctx.attr("saturate", 1))
    round_mode = ctx.attr("round_mode", "up")
    if round_mode not in ("up", "down", "nearest"):
        raise ctx.unsupported(f"round_mode={round_mode!r}")
    dtype = ctx.dtype(1)
    from onnx.helper import np_dtype_to_tensor_dtype
    return _cast_to(ctx, np_dtype_to_tensor_dtype(dtype), saturate, round_mode)


@onnx_op("Constant", 1)
def _constant(ctx):
    present = [a for a in ctx.attrs]
    if len(present) != 1:
        raise ctx.unsupported(f"attributes {present}")
    name = present[0]
    if name in ("sparse_value", "value_string", "value_strings"):
        ctx.read.add(name)
        raise ctx.unsupported(f"{name} is not supported")
    value = ctx.attr(name)
    dtype = {"value_float": np.float32, "value_floats": np.float32,
             "value_int": np.int64, "value_ints": np.int64}.get(name)
    return [ctx.known(np.asarray(value, dtype=dtype))]


@onnx_op("ConstantOfShape", 9)
def _constant_of_shape(ctx):
    shape = _shape_arg(ctx, 0)
    value = ctx.attr("value")
    value = np.zeros(1, np.float32) if value is None else value
    if any(not isinstance(d, Sym) and d < 0 for d in shape):
        raise ctx.unsupported(f"negative dimension in shape {shape}")
    n = ctx.bound(shape, carrier(value.dtype))
    if isinstance(n, Sym) or n * value.dtype.itemsize > (1 << 16):
        # large, or of a symbolic length: a filled constant, not an array
        return [ctx.out(gnp.full(shape, np.ravel(value)[0], dtype=carrier(value.dtype)),
                        value.dtype)]
    ctx.bound(shape, value.dtype, known=True)
    return [ctx.known(np.full(shape, np.ravel(value)[0], dtype=value.dtype))]


def _range_length(ctx, start, limit, delta):
    """The length of ``Range``'s result, ONNX's ``max(ceil((limit - start) / delta),
    0)``, before anything is allocated: exactly for integers; for floats as NumPy's
    ``arange`` (ONNX's reference) computes it, the difference in the inputs' type."""
    if start.dtype.kind in "iu":
        s, l, d = int(start), int(limit), int(delta)
        if d == 0:
            raise ctx.unsupported("Range with delta 0")
        return max(-((s - l) // d), 0)  # ceil((l - s) / d) in integers
    with np.errstate(all="ignore"):
        n = float((limit - start) / delta)
    if not np.isfinite(n):
        raise InvalidOnnxModel(f"{ctx.where}: Range from {start} to {limit} by {delta} has "
                               f"no finite length")
    return max(int(np.ceil(n)), 0)


def _symbolic_range(ctx, start, limit, delta):
    """``Range`` whose start or limit is a symbolic length (positions ``0 .. T-1``):
    ``start + delta * k`` for ``k < n``, ``n = ceil((limit - start) / delta)``, computed
    when the model runs (a running sum of ones)."""
    if isinstance(delta, Sym) or int(delta) <= 0:
        raise ctx.unsupported(f"a range over a symbolic length needs a positive int "
                              f"step, not {delta!r}")
    d = int(delta)
    n = (limit - start + d - 1) // d
    dtype = carrier(ctx.dtype(0))
    k = gnp.cumsum(gnp.full((n,), 1, dtype=dtype)) - 1
    first = start if not isinstance(start, Sym) else \
        ctx.known(np.array(start, dtype=object)).tensor()
    return ctx.out(k * d + first if d != 1 else k + first, ctx.dtype(0))


@onnx_op("Range", 11)
def _range(ctx):
    start, limit, delta = (ctx.const(i) for i in range(3))
    if any(v.size != 1 for v in (start, limit, delta)):
        raise ctx.unsupported("start, limit and delta must be scalars")
    start, limit, delta = (v.reshape(()) for v in (start, limit, delta))
    if any(v.dtype == object for v in (start, limit, delta)):
        return [_symbolic_range(ctx, start[()], limit[()], delta[()])]
    ctx.bound([_range_length(ctx, start, limit, delta)], start.dtype, "the range",
              known=True)
    return [ctx.known(np.arange(start, limit, delta, dtype=start.dtype))]


# --- dropout, running sums, top-k ---------------------------------------------------------

def _dropout_result(ctx, x):
    mask = None
    if len(ctx.node.output) > 1 and ctx.node.output[1]:
        mask = ctx.out(gnp.full(ctx.shape(0), 1.0), np.bool_)
    return [ctx.out(x, ctx.dtype(0)), mask]


@onnx_op("Dropout", 7, 11)
def _dropout_old(ctx):
    ctx.attr("ratio", 0.5)  # inference: the input passes unchanged whatever the ratio
    return _dropout_result(ctx, ctx.tensor(0))


@onnx_op("Dropout", 12)
def _dropout(ctx):
    ctx.attr("seed")
    training = ctx.const(2)
    ratio = ctx.const(1)
    if training is not None and bool(np.ravel(training)[0]) and \
            (ratio is None or float(np.ravel(ratio)[0]) != 0.0):
        raise ctx.unsupported("training_mode=True with a nonzero ratio (random masks are "
                              "not reproducible)")
    return _dropout_result(ctx, ctx.tensor(0))


@onnx_op("Trilu", 14)
def _trilu(ctx):
    shape = ctx.shape(0)
    if len(shape) < 2:
        raise ctx.unsupported("input of rank < 2")
    k = int(np.ravel(ctx.const(1))[0]) if ctx.has(1) else 0
    rows, cols = shape[-2:]
    # The mask is computed in the graph from the row and column numbers (rows + cols
    # constants), never as a rows x cols array at import: column - row >= k keeps the
    # upper part, column - row <= k the lower one.
    diag = gnp.subtract(gnp.constant(np.arange(cols, dtype=np.int64).reshape(1, cols)),
                        gnp.constant(np.arange(rows, dtype=np.int64).reshape(rows, 1)))
    keep = gnp.greater_equal(diag, k) if ctx.attr("upper", 1) else gnp.less_equal(diag, k)
    # A zero of the input's type: a Python 0 beside int64 values would take them through
    # float64 (rounding those past 2**53).
    zero = np.zeros((), carrier(ctx.dtype(0)))[()]
    return [ctx.out(gnp.where(keep, ctx.tensor(0), zero), ctx.dtype(0))]


# --- shapes and layouts -------------------------------------------------------------------

@onnx_op("EyeLike", 9)
def _eye_like(ctx):
    shape = ctx.shape(0)
    if len(shape) != 2:
        raise ctx.unsupported(f"input of rank {len(shape)} (EyeLike takes a matrix)")
    to = ctx.attr("dtype")
    dtype = ctx.dtype(0) if to is None else elem_dtype(to)
    if dtype is None:
        raise ctx.unsupported(f"dtype {elem_name(to)} is not supported")
    k = ctx.attr("k", 0)
    rows, cols = shape
    n = ctx.bound(shape, carrier(dtype))
    if n <= (1 << 16):
        ctx.bound(shape, carrier(dtype), known=True)
        return [ctx.known(np.eye(rows, cols, k).astype(dtype))]
    diag = gnp.subtract(gnp.constant(np.arange(cols, dtype=np.int64).reshape(1, cols)),
                        gnp.constant(np.arange(rows, dtype=np.int64).reshape(rows, 1)))
    return [ctx.out(cast(gnp.equal(diag, k), carrier(dtype)), dtype)]


@onnx_op("OneHot", 9)
def _one_hot(ctx):
    depth = np.ravel(ctx.const(1))
    if depth.size != 1:
        raise ctx.unsupported("depth must be a scalar")
    depth = int(depth[0])
    if depth < 1:
        raise InvalidOnnxModel(f"{ctx.where}: depth {depth} is not positive")
    ishape = ctx.shape(0)
    axis = _norm_axis(ctx, ctx.attr("axis", -1), len(ishape) + 1)
    out_shape = tuple(ishape[:axis]) + (depth,) + tuple(ishape[axis:])
    ctx.bound(out_shape, carrier(ctx.dtype(2)))
    idx = ctx.tensor(0)
    if idx.dtype.kind == "f":  # float indices: truncated, as the reference casts them
        idx = cast(idx, np.int64)
    if ctx.version >= 11:  # [-depth, depth): negative ones count from the end
        idx = gnp.where(idx < 0, idx + depth, idx)
    classes = np.arange(depth, dtype=np.int64).reshape(
        (depth,) + (1,) * (len(ishape) - axis))
    hot = gnp.equal(gnp.expand_dims(idx, axis), gnp.constant(classes))
    values = ctx.tensor(2)
    if ctx.shape(2) not in ((2,),):
        raise InvalidOnnxModel(f"{ctx.where}: values must be [off, on], not of shape "
                               f"{ctx.shape(2)}")
    off, on = values[0], values[1]
    return [ctx.out(gnp.where(hot, on, off), ctx.dtype(2))]


@onnx_op("Compress", 9)
def _compress(ctx):
    cond = np.ravel(ctx.const(1)).astype(bool)
    shape = ctx.shape(0)
    axis = ctx.attr("axis")
    if axis is None:
        length = element_count(shape)
    else:
        axis = _norm_axis(ctx, axis, len(shape))
        length = shape[axis]
    keep = np.flatnonzero(cond)
    if keep.size and keep[-1] >= length:
        raise InvalidOnnxModel(f"{ctx.where}: the condition selects position {keep[-1]} "
                               f"of {length}")
    out_shape = (keep.size,) if axis is None else \
        tuple(shape[:axis]) + (keep.size,) + tuple(shape[axis + 1:])
    if 0 in out_shape:
        return [ctx.known(np.empty(out_shape, ctx.dtype(0)))]
    x = ctx.tensor(0)
    if axis is None:
        x, axis = gnp.ravel(x), 0
    return [ctx.out(gnp.take(x, gnp.constant(keep.astype(np.int64)), axis), ctx.dtype(0))]


def _block(ctx, shape):
    b = ctx.attr("blocksize")
    if b is None or b < 1:
        raise InvalidOnnxModel(f"{ctx.where}: blocksize {b}")
    if len(shape) != 4:
        raise ctx.unsupported(f"input of rank {len(shape)} (4 expected: N, C, H, W)")
    return b


@onnx_op("DepthToSpace", 1)
def _depth_to_space(ctx):
    n, c, h, w = shape = ctx.shape(0)
    b = _block(ctx, shape)
    mode = ctx.attr("mode", "DCR") if ctx.version >= 11 else "DCR"
    if mode not in ("DCR", "CRD") or c % (b * b):
        raise ctx.unsupported(f"mode={mode!r} with {c} channels and blocksize {b}")
    x, cb = ctx.tensor(0), c // (b * b)
    if mode == "DCR":  # channels as (row offset, column offset, channel)
        y = gnp.transpose(gnp.reshape(x, (n, b, b, cb, h, w)), (0, 3, 4, 1, 5, 2))
    else:              # channels as (channel, row offset, column offset)
        y = gnp.transpose(gnp.reshape(x, (n, cb, b, b, h, w)), (0, 1, 4, 2, 5, 3))
    return [ctx.out(gnp.reshape(y, (n, cb, h * b, w * b)), ctx.dtype(0))]


@onnx_op("SpaceToDepth", 1)
def _space_to_depth(ctx):
    n, c, h, w = shape = ctx.shape(0)
    b = _block(ctx, shape)
    mode = ctx.attr("mode", "DCR")
    if mode not in ("DCR", "CRD") or h % b or w % b:
        raise ctx.unsupported(f"mode={mode!r} with spatial {h}x{w} and blocksize {b}")
    x = gnp.reshape(ctx.tensor(0), (n, c, h // b, b, w // b, b))
    perm = (0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4)
    y = gnp.transpose(x, perm)
    return [ctx.out(gnp.reshape(y, (n, c * b * b, h // b, w // b)), ctx.dtype(0))]


@onnx_op("ReverseSequence", 10)
def _reverse_sequence(ctx):
    shape = ctx.shape(0)
    if len(shape) < 2:
        raise ctx.unsupported("input of rank < 2")
    tax = _norm_axis(ctx, ctx.attr("time_axis", 0), len(shape))
    bax = _norm_axis(ctx, ctx.attr("batch_axis", 1), len(shape))
    if tax == bax or {tax, bax} != {0, 1}:
        raise ctx.unsupported(f"time_axis={tax}, batch_axis={bax} (0 and 1 expected)")
    lens = np.ravel(ctx.const(1)).astype(np.int64)
    steps, batch = shape[tax], shape[bax]
    if lens.size != batch or np.any((lens < 0) | (lens > steps)):
        raise InvalidOnnxModel(f"{ctx.where}: sequence_lens {lens.tolist()} for {batch} "
                               f"sequences of {steps} steps")
    # The source row of every (time, batch) row, known at import.
    ctx.bound((steps, batch), np.int64, "the source rows", known=True)
    t = np.arange(steps).reshape(steps, 1)
    src_t = np.where(t < lens.reshape(1, batch), lens.reshape(1, batch) - 1 - t, t)
    x = ctx.tensor(0) if tax == 0 else gnp.swapaxes(ctx.tensor(0), 0, 1)
    rest = shape[2:]
    rows = gnp.reshape(x, (steps * batch, element_count(rest)))
    src = (src_t * batch + np.arange(batch).reshape(1, batch)).reshape(-1)
    y = gnp.reshape(gnp.take(rows, gnp.constant(src.astype(np.int64)), 0),
                    (steps, batch) + tuple(rest))
    return [ctx.out(y if tax == 0 else gnp.swapaxes(y, 0, 1), ctx.dtype(0))]


@onnx_op("CenterCropPad", 18)
def _center_crop_pad(ctx):
    shape = ctx.shape(0)
    target = [int(v) for v in np.ravel(ctx.const(1))]
    axes = ctx.attr("axes")
    axes = list(range(len(shape))) if axes is None else \
        [_norm_axis(ctx, a, len(shape)) for a in axes]
    if len(target) != len(axes) or any(t < 0 for t in target):
        raise InvalidOnnxModel(f"{ctx.where}: shape {target} for axes {axes}")
    x = ctx.tensor(0)
    widths = [(0, 0)] * len(shape)
    for a, t in zip(axes, target):
        d = shape[a]
        if t < d:      # crop: the larger part of an odd excess at the end
            start = (d - t) // 2
            x = _slice_along(x, a, start, start + t)
        elif t > d:    # pad: the larger part of an odd excess at the end
            lo = (t - d) // 2
            widths[a] = (lo, t - d - lo)
    if any(lo or hi for lo, hi in widths):
        ctx.bound([d + lo + hi for d, (lo, hi) in zip(gnp.shape(x), widths)],
                  carrier(ctx.dtype(0)))
        x = gnp.pad(x, [list(w) for w in widths], mode="constant", constant_values=0)
    return [ctx.out(x, ctx.dtype(0))]
