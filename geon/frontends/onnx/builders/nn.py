"""Convolution, pooling, normalization and the losses; unpooling and folding."""

import numpy as np

import geon as be
from geon.op_graph.symbols import Sym
from geon.frontends.onnx.builders.base import (_float, _norm_axis, _same, carrier, cast,
                                               is_float, onnx_op)
from geon.frontends.onnx.builders.indexing import _int_input, _scatter_add_rows
from geon.frontends.onnx.builders.shapes import _slice_along
from geon.frontends.onnx.loading import InvalidOnnxModel, element_count

gnp = be.np


# --- normalization ----------------------------------------------------------------------

def _channel_shape(rank):
    return (1, -1) + (1,) * (rank - 2)


@onnx_op("BatchNormalization", 9)
def _batch_norm(ctx):
    x = _float(ctx)
    shape = ctx.shape(0)
    rank = len(shape)
    eps = ctx.attr("epsilon", 1e-5)
    momentum = ctx.attr("momentum", 0.9)
    training = ctx.attr("training_mode", 0) if ctx.version >= 14 else 0
    if ctx.version < 14 and len([o for o in ctx.node.output if o]) > 1:
        raise ctx.unsupported("training outputs of opset < 14")
    cs = (shape[1],) + (1,) * (rank - 2) if rank > 1 else ()

    def per_channel(i):
        return gnp.reshape(ctx.tensor(i), cs)

    scale, bias = per_channel(1), per_channel(2)
    red = tuple(a for a in range(rank) if a != 1)
    if training:
        mean = gnp.mean(x, red, keepdims=True)
        var = gnp.mean(gnp.square(x - mean), red, keepdims=True)
        y = (x - mean) / gnp.sqrt(var + eps) * scale + bias
        flat = (shape[1],)
        run_mean = ctx.tensor(3) * momentum + gnp.reshape(mean, flat) * (1 - momentum)
        run_var = ctx.tensor(4) * momentum + gnp.reshape(var, flat) * (1 - momentum)
        return [_same(ctx, y), _same(ctx, run_mean, 3), _same(ctx, run_var, 4)]
    y = (x - per_channel(3)) / gnp.sqrt(per_channel(4) + eps) * scale + bias
    return [_same(ctx, y)]


@onnx_op("LayerNormalization", 17)
def _layer_norm(ctx):
    x = _float(ctx)
    shape = ctx.shape(0)
    axis = _norm_axis(ctx, ctx.attr("axis", -1), len(shape))
    eps = ctx.attr("epsilon", 1e-5)
    stash = ctx.attr("stash_type", 1)
    if stash != 1:
        raise ctx.unsupported(f"stash_type={stash}")
    red = tuple(range(axis, len(shape)))
    # Statistics in float32 at least (stash_type=1), as the spec asks.
    xs = cast(x, np.float32) if x.dtype.itemsize < 4 else x
    mean = gnp.mean(xs, red, keepdims=True)
    d = xs - mean
    var = gnp.mean(d * d, red, keepdims=True)
    inv = 1.0 / gnp.sqrt(var + eps)
    y = d * inv * ctx.tensor(1)
    if ctx.has(2):
        y = y + ctx.tensor(2)
    return [_same(ctx, y), ctx.out(mean, np.dtype(mean.dtype)),
            ctx.out(inv, np.dtype(inv.dtype))]


@onnx_op("GlobalAveragePool", 1)
def _global_avg_pool(ctx):
    rank = len(ctx.shape(0))
    return [_same(ctx, gnp.mean(_float(ctx), tuple(range(2, rank)), keepdims=True))]


@onnx_op("GlobalMaxPool", 1)
def _global_max_pool(ctx):
    rank = len(ctx.shape(0))
    return [_same(ctx, gnp.max(_float(ctx), tuple(range(2, rank)), keepdims=True))]


# --- convolution and pooling --------------------------------------------------------------

def _window_attrs(ctx, n, dilations=True):
    """``(kernel, strides, dilations)`` of a Conv / pooling node over ``n`` spatial
    dimensions."""
    kernel = ctx.attr("kernel_shape")
    strides = ctx.attr("strides") or [1] * n
    dil = (ctx.attr("dilations") or [1] * n) if dilations else [1] * n
    if len(strides) != n or len(dil) != n or (kernel is not None and len(kernel) != n):
        raise ctx.unsupported(f"kernel_shape / strides / dilations do not fit {n} spatial "
                              f"dimensions")
    return kernel, strides, dil


def _pads(ctx, sizes, kernel, strides, dil):
    """Per-dimension ``(lo, hi)`` padding from ``pads`` or ``auto_pad``."""
    n = len(sizes)
    auto = ctx.attr("auto_pad", "NOTSET")
    pads = ctx.attr("pads")
    if auto in ("NOTSET", ""):
        pads = pads or [0] * (2 * n)
        if len(pads) != 2 * n or min(pads) < 0:
            raise ctx.unsupported(f"pads {pads}")
        return [(pads[i], pads[i + n]) for i in range(n)]
    if auto == "VALID":
        return [(0, 0)] * n
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise ctx.unsupported(f"auto_pad={auto!r}")
    out = []
    for L, k, s, d in zip(sizes, kernel, strides, dil):
        # (stride 1: (k - 1) * d whatever the length, which may be symbolic)
        total = (k - 1) * d if s == 1 else max((-(-L // s) - 1) * s + (k - 1) * d + 1 - L, 0)
        small = total // 2
        out.append((small, total - small) if auto == "SAME_UPPER" else (total - small, small))
    return out


@onnx_op("Conv", 1)
def _conv(ctx):
    x, w = _float(ctx), _float(ctx, 1)
    wshape = ctx.shape(1)
    n = len(wshape) - 2
    kernel, strides, dil = _window_attrs(ctx, n)
    if kernel is not None and list(kernel) != list(wshape[2:]):
        raise ctx.unsupported(f"kernel_shape {kernel} differs from the filter {wshape}")
    pads = _pads(ctx, ctx.shape(0)[2:], wshape[2:], strides, dil)
    y = gnp.conv(x, w, stride=strides, padding=pads, dilation=dil, groups=ctx.attr("group", 1))
    if ctx.has(2):
        y = y + gnp.reshape(ctx.tensor(2), (-1,) + (1,) * n)
    return [_same(ctx, y)]


@onnx_op("ConvTranspose", 1)
def _conv_transpose(ctx):
    x, w = _float(ctx), _float(ctx, 1)
    wshape, xshape = ctx.shape(1), ctx.shape(0)
    n = len(wshape) - 2
    kernel, strides, dil = _window_attrs(ctx, n)
    if kernel is not None and list(kernel) != list(wshape[2:]):
        raise ctx.unsupported(f"kernel_shape {kernel} differs from the filter {wshape}")
    opad = ctx.attr("output_padding") or [0] * n
    out_shape = ctx.attr("output_shape")
    auto = ctx.attr("auto_pad", "NOTSET")
    if out_shape is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        if out_shape is None:
            out_shape = [L * s for L, s in zip(xshape[2:], strides)]
        out_shape = list(out_shape)[-n:]
        pads, opad = [], list(opad)
        for j, (L, k, s, d, want) in enumerate(zip(xshape[2:], wshape[2:], strides, dil,
                                                    out_shape)):
            total = s * (L - 1) + opad[j] + (k - 1) * d + 1 - want
            if total < 0:  # longer than the full result: output padding at the end
                opad[j] -= total
                total = 0
            half = total // 2
            pads.append((half, total - half) if auto == "SAME_UPPER" else (total - half, half))
        ctx.attr("pads")
    else:
        pads = _pads(ctx, xshape[2:], wshape[2:], strides, dil)
    y = gnp.conv_transpose(x, w, stride=strides, padding=pads, output_padding=opad,
                           dilation=dil, groups=ctx.attr("group", 1))
    if ctx.has(2):
        y = y + gnp.reshape(ctx.tensor(2), (-1,) + (1,) * n)
    return [_same(ctx, y)]


def _ceil_pads(ctx, sizes, kernel, strides, dil, pads):
    """With ``ceil_mode``, the extra end padding that makes the floor rule give the ceil
    rule's output length (a last window must start inside the input or the start
    padding); ``None`` when ceil mode changes nothing."""
    extra, changed = [], False
    for L, k, s, d, (lo, hi) in zip(sizes, kernel, strides, dil, pads):
        span = L + lo + hi - (k - 1) * d - 1
        floor_n, ceil_n = span // s + 1, -(-span // s) + 1
        if ceil_n > floor_n and (ceil_n - 1) * s >= L + lo:
            ceil_n -= 1
        changed |= ceil_n != floor_n
        extra.append((lo, hi + (ceil_n - floor_n) * s))
    return extra if changed else None


def _bound_windows(ctx, sizes, kernel, strides, dil, pads):
    """Check the window positions of a pooling before geon builds it: along each
    spatial dimension, the windows times the kernel's taps (what geon computes at build
    time to check that every window reads an input element)."""
    for i, (L, k, s, d, (lo, hi)) in enumerate(zip(sizes, kernel, strides, dil, pads)):
        if k < 1 or s < 1 or d < 1:
            raise ctx.unsupported(f"kernel {kernel}, strides {strides}, dilations {dil}")
        n = (L + lo + hi - d * (k - 1) - 1) // s + 1
        if isinstance(n, Sym):
            continue  # (geon checks the windows of a symbolic length without taps)
        ctx.bound((max(n, 0), k), np.int64, f"the window taps of spatial dimension {i}")


def _pool_input(ctx):
    """MaxPool's input as floats: integers up to 16 bits in float32 and 32-bit ones in
    float64, both exact (a max pool only selects values)."""
    d = ctx.dtype(0)
    if is_float(d):
        return ctx.tensor(0)
    if d.kind in "iu" and d.itemsize <= 4:
        return cast(ctx.tensor(0), np.float32 if d.itemsize <= 2 else np.float64)
    raise ctx.unsupported(f"input 0 of type {d} is not supported")


@onnx_op("MaxPool", 1)
def _max_pool(ctx):
    want_indices = len(ctx.node.output) > 1 and bool(ctx.node.output[1])
    storage_order = ctx.attr("storage_order", 0)  # only the Indices output depends on it
    if storage_order not in (0, 1):
        raise ctx.unsupported(f"storage_order={storage_order}")
    x = _pool_input(ctx)
    sizes = ctx.shape(0)[2:]
    n = len(sizes)
    kernel, strides, dil = _window_attrs(ctx, n)
    pads = _pads(ctx, sizes, kernel, strides, dil)
    if ctx.attr("ceil_mode", 0):
        pads = _ceil_pads(ctx, sizes, kernel, strides, dil, pads) or pads
    _bound_windows(ctx, sizes, kernel, strides, dil, pads)
    y = gnp.max_pool(x, kernel, stride=strides, padding=pads, dilation=dil)
    out = [_same(ctx, y)]
    if want_indices:
        out.append(ctx.out(_max_pool_indices(ctx, x, y, kernel, strides, dil, pads,
                                             storage_order), np.int64))
    return out


def _max_pool_indices(ctx, x, y, kernel, strides, dil, pads, storage_order):
    """MaxPool's Indices output: for each window, the flat position in the input
    ``(N, C, *spatial)`` of its first maximum in window order (ONNX's reference
    order); ``storage_order=1`` counts the spatial positions column-major. Each
    kernel offset's strided slice of the (-inf padded) input is compared with the
    window maxima; the positions of the slices are known at import."""
    shape = ctx.shape(0)
    sizes = shape[2:]
    n = len(sizes)
    outs = gnp.shape(y)[2:]
    # Spatial positions, row- or column-major, -1 in the padding.
    if storage_order == 0:
        mult = [element_count(sizes[i + 1:]) for i in range(n)]
    else:
        mult = [element_count(sizes[:i]) for i in range(n)]
    # Positions known at import: the padded grid, and one slice of it per kernel offset.
    ctx.bound((n + 1,) + tuple(L + lo + hi for L, (lo, hi) in zip(sizes, pads)), np.int64,
              "the padded positions of the input")
    ctx.bound((element_count(kernel),) + tuple(outs), np.int64,
              "the positions of every kernel offset")
    grid = np.indices(sizes, dtype=np.int64)
    pos = sum(g * m for g, m in zip(grid, mult)) if n else np.zeros((), np.int64)
    pos = np.pad(pos, pads, constant_values=-1)
    xp = gnp.pad(x, [(0, 0), (0, 0)] + [list(p) for p in pads], mode="constant",
                 constant_values=-np.inf) if any(lo or hi for lo, hi in pads) else x
    offsets = list(np.ndindex(*kernel))
    found = None
    for off in reversed(offsets):  # the first offset in window order is applied last
        key = tuple(slice(o * d, o * d + s * (m - 1) + 1, s)
                    for o, d, s, m in zip(off, dil, strides, outs))
        here = gnp.constant(np.ascontiguousarray(pos[key]))
        if found is None:
            found = gnp.broadcast_to(here, gnp.shape(y))
            continue
        hit = gnp.equal(xp[(slice(None), slice(None)) + key], y)
        found = gnp.where(hit, here, found)
    channel = np.arange(shape[0] * shape[1], dtype=np.int64).reshape(
        shape[:2] + (1,) * n) * element_count(sizes)
    return found + gnp.constant(channel)


@onnx_op("AveragePool", 1)
def _avg_pool(ctx):
    x = _float(ctx)
    sizes = ctx.shape(0)[2:]
    n = len(sizes)
    kernel, strides, dil = _window_attrs(ctx, n)
    pads = _pads(ctx, sizes, kernel, strides, dil)
    include = bool(ctx.attr("count_include_pad", 0))
    ceil = _ceil_pads(ctx, sizes, kernel, strides, dil, pads) if ctx.attr("ceil_mode", 0) \
        else None
    _bound_windows(ctx, sizes, kernel, strides, dil, ceil or pads)
    if ceil is None and all(d == 1 for d in dil):
        return [_same(ctx, gnp.avg_pool(x, kernel, stride=strides, padding=pads,
                                        count_include_pad=include))]
    # Dilated windows, or the extra windows of ceil mode: each window's sum (a grouped
    # convolution with ones) divided by its count of elements, which is the same sum
    # over a mask of what counts (the input, and the explicit padding if
    # count_include_pad), known at import.
    full = ceil or pads
    channels = ctx.shape(0)[1]
    padded = [L + lo + hi for L, (lo, hi) in zip(sizes, full)]
    ctx.bound((channels, 1) + tuple(kernel), x.dtype, "the kernel of ones")
    ctx.bound(padded, x.dtype, "the mask of the padded input")
    ones = gnp.constant(np.ones((channels, 1) + tuple(kernel), x.dtype))
    sums = gnp.conv(x, ones, stride=strides, padding=full, dilation=dil, groups=channels)
    mask = np.zeros(padded, x.dtype)
    inner = tuple(slice(lo, lo + L) for L, (lo, _) in zip(sizes, pads)) if not include \
        else tuple(slice(0, lo + L + hi) for L, (lo, hi) in zip(sizes, pads))
    mask[inner] = 1
    counts = be.evaluate(gnp.conv(gnp.constant(mask[None, None]),
                                  gnp.constant(np.ones((1, 1) + tuple(kernel), x.dtype)),
                                  stride=strides, dilation=dil))[0]
    return [_same(ctx, sums / gnp.constant(counts))]


@onnx_op("RMSNormalization", 23)
def _rms_norm(ctx):
    x = _float(ctx)
    shape = ctx.shape(0)
    axis = _norm_axis(ctx, ctx.attr("axis", -1), len(shape))
    eps = ctx.attr("epsilon", 1e-5)
    if ctx.attr("stash_type", 1) != 1:
        raise ctx.unsupported("stash_type other than 1")
    xs = cast(x, np.float32) if x.dtype.itemsize < 4 else x
    ms = gnp.mean(xs * xs, tuple(range(axis, len(shape))), keepdims=True)
    y = cast(xs / gnp.sqrt(ms + eps), x.dtype) * ctx.tensor(1)
    return [_same(ctx, y)]


# --- losses ------------------------------------------------------------------------------

def _nll(ctx, logp, target_i, weight_i):
    """The negative log-likelihood of ``logp`` (N, C, d1, ...) at the integer targets
    (N, d1, ...), as ``NegativeLogLikelihoodLoss`` defines it. The class picked is a
    one-hot mask (targets equal to ``ignore_index`` pick nothing and weigh nothing)."""
    shape = gnp.shape(logp)
    if len(shape) < 2:
        raise ctx.unsupported("input of rank < 2")
    if ctx.dtype(target_i).kind not in "iu":
        raise ctx.unsupported("targets must be integers")
    reduction = ctx.attr("reduction", "mean")
    if reduction not in ("none", "sum", "mean"):
        raise ctx.unsupported(f"reduction={reduction!r}")
    ignore = ctx.attr("ignore_index")
    ctx.check_labels(target_i, shape[1], ignore)
    target = ctx.tensor(target_i)
    classes = np.arange(shape[1]).reshape((1, -1) + (1,) * (len(shape) - 2))
    onehot = gnp.equal(gnp.expand_dims(target, 1), gnp.constant(classes))
    if ignore is not None:
        onehot = onehot * gnp.expand_dims(gnp.not_equal(target, ignore), 1)
    onehot = cast(onehot, logp.dtype)
    if ctx.has(weight_i):
        w = gnp.sum(onehot * gnp.reshape(ctx.tensor(weight_i), classes.shape), axis=1)
    else:
        w = gnp.sum(onehot, axis=1)
    loss = -gnp.sum(logp * onehot, axis=1) * (w if ctx.has(weight_i) else 1.0)
    if reduction == "sum":
        loss = gnp.sum(loss)
    elif reduction == "mean":
        loss = gnp.sum(loss) / gnp.sum(w)
    return loss


@onnx_op("NegativeLogLikelihoodLoss", 12)
def _nll_loss(ctx):
    return [_same(ctx, _nll(ctx, _float(ctx), 1, 2))]


@onnx_op("SoftmaxCrossEntropyLoss", 12)
def _softmax_cross_entropy(ctx):
    logp = gnp.log_softmax(_float(ctx), axis=1)
    return [_same(ctx, _nll(ctx, logp, 1, 2)), _same(ctx, logp)]


# --- normalization ------------------------------------------------------------------------

def _normalize(x, axes, eps):
    mean = gnp.mean(x, axes, keepdims=True)
    d = x - mean
    var = gnp.mean(d * d, axes, keepdims=True)
    return d / gnp.sqrt(var + eps)


@onnx_op("InstanceNormalization", 6)
def _instance_norm(ctx):
    x = _float(ctx)
    shape = ctx.shape(0)
    if len(shape) < 3:
        raise ctx.unsupported("input of rank < 3")
    eps = ctx.attr("epsilon", 1e-5)
    cs = (shape[1],) + (1,) * (len(shape) - 2)
    y = _normalize(x, tuple(range(2, len(shape))), eps)
    y = y * gnp.reshape(ctx.tensor(1), cs) + gnp.reshape(ctx.tensor(2), cs)
    return [_same(ctx, y)]


@onnx_op("GroupNormalization", 18)
def _group_norm(ctx):
    x = _float(ctx)
    shape = ctx.shape(0)
    groups = ctx.attr("num_groups")
    eps = ctx.attr("epsilon", 1e-5)
    if ctx.version >= 21 and ctx.attr("stash_type", 1) != 1:
        raise ctx.unsupported("stash_type other than 1")
    if len(shape) < 2 or not groups or shape[1] % groups:
        raise InvalidOnnxModel(f"{ctx.where}: {groups} groups for input {shape}")
    n, c = shape[:2]
    xs = cast(x, np.float32) if x.dtype.itemsize < 4 else x  # statistics in float32
    g = gnp.reshape(xs, (n, groups, -1))
    y = gnp.reshape(_normalize(g, (2,), eps), shape)
    y = cast(y, x.dtype) if y.dtype != x.dtype else y
    cs = (c,) + (1,) * (len(shape) - 2)
    scale, bias = ctx.tensor(1), ctx.tensor(2)
    if ctx.version < 21:  # one scale and bias per group, repeated over its channels
        per = c // groups
        scale = gnp.reshape(gnp.broadcast_to(gnp.reshape(scale, (groups, 1)),
                                             (groups, per)), (c,))
        bias = gnp.reshape(gnp.broadcast_to(gnp.reshape(bias, (groups, 1)),
                                            (groups, per)), (c,))
    return [_same(ctx, y * gnp.reshape(scale, cs) + gnp.reshape(bias, cs))]


@onnx_op("LpNormalization", 1)
def _lp_normalization(ctx):
    x = _float(ctx)
    axis = _norm_axis(ctx, ctx.attr("axis", -1), len(ctx.shape(0)))
    p = ctx.attr("p", 2)
    if p == 1:
        norm = gnp.sum(gnp.absolute(x), axis, keepdims=True)
    elif p == 2:
        norm = gnp.sqrt(gnp.sum(x * x, axis, keepdims=True))
    else:
        raise ctx.unsupported(f"p={p} (1 or 2)")
    zero = gnp.equal(norm, 0.0)  # a zero vector stays zero (not 0 / 0)
    return [_same(ctx, gnp.where(zero, 0.0, x / gnp.where(zero, 1.0, norm)))]


@onnx_op("MeanVarianceNormalization", 9)
def _mvn(ctx):
    x = _float(ctx)
    rank = len(ctx.shape(0))
    axes = ctx.attr("axes", [0, 2, 3])
    axes = tuple(sorted({_norm_axis(ctx, a, rank) for a in axes}))
    mean = gnp.mean(x, axes, keepdims=True)
    var = gnp.mean(x * x, axes, keepdims=True) - mean * mean
    return [_same(ctx, (x - mean) / (gnp.sqrt(var) + 1e-9))]


@onnx_op("LRN", 1)
def _lrn(ctx):
    x = _float(ctx)
    shape = ctx.shape(0)
    size = ctx.attr("size")
    alpha, beta, bias = ctx.attr("alpha", 1e-4), ctx.attr("beta", 0.75), ctx.attr("bias", 1.0)
    if size is None or size < 1 or len(shape) < 3:
        raise InvalidOnnxModel(f"{ctx.where}: size {size} for input {shape}")
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    c = shape[1]
    sq = x * x
    padded = gnp.pad(sq, [[0, 0], [lo, hi]] + [[0, 0]] * (len(shape) - 2)) if size > 1 \
        else sq
    total = None  # the sum over each channel's window: `size` shifted slices
    for j in range(size):
        part = _slice_along(padded, 1, j, j + c)
        total = part if total is None else total + part
    return [_same(ctx, x / gnp.power(total * (alpha / size) + bias, beta))]


@onnx_op("LpPool", 2)
def _lp_pool(ctx):
    x = _float(ctx)
    sizes = ctx.shape(0)[2:]
    n = len(sizes)
    kernel, strides, dil = _window_attrs(ctx, n, dilations=ctx.version >= 18)
    if kernel is None:
        raise InvalidOnnxModel(f"{ctx.where}: kernel_shape is required")
    p = ctx.attr("p", 2)
    if p < 1:
        raise ctx.unsupported(f"p={p}")
    pads = _pads(ctx, sizes, kernel, strides, dil)
    if ctx.version >= 18 and ctx.attr("ceil_mode", 0):
        pads = _ceil_pads(ctx, sizes, kernel, strides, dil, pads) or pads
    _bound_windows(ctx, sizes, kernel, strides, dil, pads)
    channels = ctx.shape(0)[1]
    powered = x * x if p == 2 else gnp.absolute(x) if p == 1 else \
        gnp.power(gnp.absolute(x), float(p))
    ctx.bound((channels, 1) + tuple(kernel), x.dtype, "the kernel of ones")
    ones = gnp.constant(np.ones((channels, 1) + tuple(kernel), x.dtype))
    sums = gnp.conv(powered, ones, stride=strides, padding=pads, dilation=dil,
                    groups=channels)
    y = gnp.sqrt(sums) if p == 2 else sums if p == 1 else gnp.power(sums, 1.0 / p)
    return [_same(ctx, y)]


# --- grids, unpooling, folding ------------------------------------------------------------

@onnx_op("AffineGrid", 20)
def _affine_grid(ctx):
    """The grid of ``theta`` applied to the positions of an image of ``size`` spaced
    evenly over [-1, 1] (centres of the corner pixels with ``align_corners``, their
    outer edges without): one batched product with the positions, known at import."""
    theta = _float(ctx)
    size = [int(v) for v in np.ravel(ctx.const(1))]
    dims = size[2:]
    n = len(dims)
    if n not in (2, 3) or tuple(ctx.shape(0)) != (size[0], n, n + 1):
        raise InvalidOnnxModel(f"{ctx.where}: theta {ctx.shape(0)} for size {size}")
    align = ctx.attr("align_corners", 0)
    ctx.bound(tuple(dims) + (n + 1,), np.float64, "the positions", known=True)
    axes = []
    for d in dims:
        if align:
            axes.append(np.linspace(-1.0, 1.0, d) if d > 1 else np.array([-1.0]))
        else:
            axes.append((np.arange(d) * 2.0 + 1.0) / d - 1.0)
    mesh = np.meshgrid(*axes, indexing="ij")         # (d1, ..., dn) each, the first axis first
    pos = np.stack(list(mesh[::-1]) + [np.ones(dims)], -1).reshape(-1, n + 1)  # x, y (, z), 1
    grid = gnp.matmul(gnp.constant(pos.astype(theta.dtype)),
                      gnp.transpose(theta, (0, 2, 1)))            # (N, positions, n)
    return [_same(ctx, gnp.reshape(grid, (size[0],) + tuple(dims) + (n,)))]


@onnx_op("MaxUnpool", 9)
def _max_unpool(ctx):
    """The values of ``X`` written at the flat positions ``I`` of a zero tensor (the
    shape MaxPool's attributes give; ``output_shape`` embeds it at the start). Computed
    as a scatter-add divided by the count of writes per position, in float64 for the
    narrower types: exact for MaxPool's indices, whose repeated positions carry one
    value."""
    x = _float(ctx)
    shape = ctx.shape(0)
    n = len(shape) - 2
    kernel, strides, _ = _window_attrs(ctx, n, dilations=False)
    pads = ctx.attr("pads") or [0] * (2 * n)
    if kernel is None or len(pads) != 2 * n:
        raise InvalidOnnxModel(f"{ctx.where}: kernel_shape {kernel}, pads {pads}")
    inferred = list(shape[:2]) + [(shape[2 + k] - 1) * strides[k] - pads[k] - pads[n + k] +
                                  kernel[k] for k in range(n)]
    out = [int(v) for v in np.ravel(ctx.const(2))] if ctx.has(2) else inferred
    if len(out) != len(shape) or any(o < i for o, i in zip(out, inferred)):
        raise InvalidOnnxModel(f"{ctx.where}: output_shape {out} smaller than {inferred}")
    ctx.bound(out, carrier(ctx.dtype(0)))
    if ctx.shape(1) != shape:
        raise InvalidOnnxModel(f"{ctx.where}: indices {ctx.shape(1)} for X {shape}")
    total, m = element_count(inferred), element_count(shape)
    pos = _int_input(ctx, 1)
    if isinstance(pos, np.ndarray):
        if np.any((pos < 0) | (pos >= total)):
            raise InvalidOnnxModel(f"{ctx.where}: an index is outside the {total} "
                                   f"positions")
        pos = gnp.constant(pos.reshape(m))
    else:
        bad = gnp.less(pos, 0) + gnp.greater_equal(pos, total)
        pos = gnp.reshape(gnp.where(bad > 0, np.int64(total), pos), (m,))
    wide = cast(x, np.float64) if x.dtype.itemsize < 8 else x
    sums = _scatter_add_rows(gnp.reshape(wide, (m, 1)), pos, total)
    count = _scatter_add_rows(gnp.ones((m, 1), dtype=wide.dtype), pos, total)
    y = gnp.reshape(sums / gnp.where(count > 0, count, 1.0), inferred)
    if out != inferred:
        y = gnp.pad(y, [[0, o - i] for o, i in zip(out, inferred)])
    return [_same(ctx, y)]


@onnx_op("Col2Im", 18)
def _col2im(ctx):
    """Blocks (N, C * prod(block), L) added back into an image (N, C, *image_shape):
    a scatter-add of every (block offset, block) entry to its position in the padded
    image, known at import."""
    x = ctx.tensor(0)
    image = [int(v) for v in np.ravel(ctx.const(1))]
    block = [int(v) for v in np.ravel(ctx.const(2))]
    n = len(image)
    strides = ctx.attr("strides") or [1] * n
    dil = ctx.attr("dilations") or [1] * n
    pads = ctx.attr("pads") or [0] * (2 * n)
    shape = ctx.shape(0)
    k = element_count(block)
    if len(block) != n or len(strides) != n or len(dil) != n or len(pads) != 2 * n or \
            len(shape) != 3 or k == 0 or shape[1] % k:
        raise InvalidOnnxModel(f"{ctx.where}: input {shape}, image {image}, block {block}")
    padded = [image[d] + pads[d] + pads[n + d] for d in range(n)]
    counts = [(padded[d] - dil[d] * (block[d] - 1) - 1) // strides[d] + 1 for d in range(n)]
    if element_count(counts) != shape[2] or min(counts) < 1:
        raise InvalidOnnxModel(f"{ctx.where}: {shape[2]} blocks do not tile {image}")
    batch, chan = shape[0], shape[1] // k
    ctx.bound((k, shape[2]), np.int64, "the block positions", known=True)
    # position in the padded image of (block offset, block): row-major over both
    off = np.indices(block).reshape(n, -1).T * np.array(dil)            # (k, n)
    start = np.indices(counts).reshape(n, -1).T * np.array(strides)     # (L, n)
    coords = off[:, None, :] + start[None, :, :]                        # (k, L, n)
    flat = (coords * np.array([element_count(padded[d + 1:]) for d in range(n)])).sum(-1)
    rows = gnp.reshape(gnp.transpose(gnp.reshape(x, (batch, chan, k, shape[2])),
                                     (2, 3, 0, 1)), (k * shape[2], batch * chan))
    img = _scatter_add_rows(rows, gnp.constant(flat.reshape(-1).astype(np.int64)),
                            element_count(padded))                     # (P, N * C)
    img = gnp.reshape(gnp.transpose(img), [batch, chan] + padded)
    key = (slice(None), slice(None)) + tuple(slice(pads[d], pads[d] + image[d])
                                             for d in range(n))
    return [_same(ctx, img[key])]
