"""Resizing and sampling at computed positions (Resize, Upsample, GridSample,
AffineGrid)."""

import numpy as np

import geon as be
from geon.frontends.onnx.builders.base import (_float, _norm_axis, _same, carrier, cast,
                                               is_float, onnx_op)
from geon.frontends.onnx.builders.elementwise import (_floor, _integral_from, _round_even,
                                                      _trunc_small)
from geon.frontends.onnx.builders.indexing import _typed
from geon.frontends.onnx.builders.shapes import _slice_along
from geon.frontends.onnx.loading import InvalidOnnxModel, element_count
from geon.op_graph import op_graph as og

gnp = be.np


# --- resizing -----------------------------------------------------------------------------
# Separable: along each resized axis, every output position is a fixed combination of input
# positions known at import, a (out, in) matrix of weights (a selection for ``nearest``,
# taken with a gather, exact for every type; otherwise a matrix product).

def _resize_coords(ctm, n_in, n_out, scale, roi):
    """The input coordinate of each output position along one axis, and (for
    ``tf_crop_and_resize``) which of them fall outside the input."""
    y = np.arange(n_out, dtype=np.float64)
    width = scale * n_in                                   # the output length, unrounded
    outside = None
    if ctm == "align_corners":
        x = np.zeros(n_out) if width == 1 else y * (n_in - 1) / (width - 1)
    elif ctm == "asymmetric":
        x = y / scale
    elif ctm == "tf_crop_and_resize":
        lo, hi = roi
        x = np.full(n_out, (hi - lo) * (n_in - 1) / 2) if width == 1 else \
            y * (hi - lo) * (n_in - 1) / (width - 1)
        x = x + lo * (n_in - 1)
        outside = (x < 0) | (x > n_in - 1)
    elif ctm == "pytorch_half_pixel":
        x = np.full(n_out, -0.5) if width == 1 else (y + 0.5) / scale - 0.5
    elif ctm == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    elif ctm == "half_pixel_symmetric":
        offset = n_in / 2 * (1 - n_out / width)
        x = offset + (y + 0.5) / scale - 0.5
    else:
        raise ValueError(ctm)
    return x, outside


def _cubic_kernel(t, a):
    t = np.abs(t)
    near = ((a + 2) * t - (a + 3)) * t * t + 1
    far = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
    return np.where(t <= 1, near, np.where(t < 2, far, 0.0))


def _resize_weights(mode, nearest_mode, cubic_a, antialias, exclude_outside, x, n_in,
                    scale):
    """``(taps, coeffs)``, each (out, n): the input positions (unclamped) around each
    coordinate ``x`` and their weights. ``ratio`` is the distance from the tap left of
    ``x`` (1 where ``x`` is an integer: the pixel on the left is preferred)."""
    base = np.floor(x)
    ratio = np.where(x == base, 1.0, x - base)[:, None]
    if mode == "nearest":
        if nearest_mode == "round_prefer_floor":
            right = ratio > 0.5
        elif nearest_mode == "round_prefer_ceil":
            right = ratio >= 0.5
        elif nearest_mode == "floor":
            right = np.zeros_like(ratio, dtype=bool)
        else:  # ceil
            right = np.ones_like(ratio, dtype=bool)
        right = right | (ratio == 1.0)      # an integer coordinate is its own tap
        coeffs = np.concatenate([~right, right], 1).astype(np.float64)
    elif mode == "linear" and not (antialias and scale < 1):
        coeffs = np.concatenate([1.0 - ratio, ratio], 1)
    elif mode == "linear":  # antialiased: a triangle stretched by 1 / scale
        start = int(np.floor(-1 / scale) + 1)
        t = (np.arange(start, 2 - start)[None, :] - ratio) * scale
        coeffs = np.clip(1.0 - np.abs(t), 0.0, 1.0)
        coeffs = coeffs / coeffs.sum(1, keepdims=True)
    elif not (antialias and scale < 1):  # cubic
        t = np.concatenate([ratio + 1, ratio, 1 - ratio, 2 - ratio], 1)
        coeffs = _cubic_kernel(t, cubic_a)
    else:  # cubic, antialiased
        start = int(np.floor(-2 / scale) + 1)
        t = scale * (np.arange(start, 2 - start)[None, :] - ratio)
        coeffs = _cubic_kernel(t, cubic_a)
        coeffs = coeffs / coeffs.sum(1, keepdims=True)
    n = coeffs.shape[1]
    # The n positions nearest x (ties to the smaller one), counted as in an input padded
    # by ceil(n / 2) at both ends.
    pad = -(-n // 2)
    xp = x + pad
    p = np.floor(xp)
    frac = xp - p
    if n % 2 == 0:
        first = np.where(frac == 0, -(n // 2), -(n // 2) + 1)
    else:
        first = np.where(frac <= 0.5, -((n - 1) // 2), -((n - 1) // 2) + 1)
    taps = (p + first).astype(np.int64)[:, None] + np.arange(n)[None, :] - pad
    if exclude_outside:
        coeffs = np.where((taps < 0) | (taps >= n_in), 0.0, coeffs)
        total = coeffs.sum(1, keepdims=True)
        coeffs = coeffs / np.where(total == 0, 1.0, total)
    return taps, coeffs


def _resize(ctx, x, dtype, axes, sizes_out, scales, roi, mode, ctm, nearest_mode, cubic_a,
            exclude_outside, extrapolation, antialias):
    """``x`` resized along ``axes`` to ``sizes_out`` with the per-axis ``scales``."""
    shape = list(gnp.shape(x))
    out_shape = list(shape)
    for a, n in zip(axes, sizes_out):
        out_shape[a] = n
    ctx.bound(out_shape, carrier(dtype))
    if 0 in out_shape or 0 in shape:
        if 0 in out_shape:
            return ctx.known(np.empty(out_shape, dtype))
        raise ctx.unsupported("resizing an input with no elements")
    floating = is_float(dtype)
    if mode != "nearest":  # computed in float (float64 for integers, rounded back)
        x = cast(x, np.float64) if not floating else \
            (cast(x, np.float32) if x.dtype.itemsize < 4 else x)
    for a, n_out, scale, r in zip(axes, sizes_out, scales, roi):
        n_in = shape[a]
        xs, outside = _resize_coords(ctm, n_in, n_out, scale, r)
        taps, coeffs = _resize_weights(mode, nearest_mode, cubic_a, antialias,
                                       exclude_outside, xs, n_in, scale)
        taps = np.clip(taps, 0, n_in - 1)
        if mode == "nearest":
            pick = taps[np.arange(n_out), np.argmax(coeffs, 1)]
            if np.array_equal(pick, np.arange(n_in)) and n_out == n_in and outside is None:
                continue
            x = gnp.take(x, gnp.constant(pick.astype(np.int64)), a)
        else:
            ctx.bound((n_out, n_in), np.float64, "the resize weights")
            w = np.zeros((n_out, n_in), np.float64)
            np.add.at(w, (np.repeat(np.arange(n_out), taps.shape[1]), taps.reshape(-1)),
                      coeffs.reshape(-1))
            if n_out == n_in and np.array_equal(w, np.eye(n_in)) and outside is None:
                continue
            perm = [k for k in range(len(shape)) if k != a] + [a]
            moved = gnp.transpose(x, perm) if a != len(shape) - 1 else x
            y = gnp.matmul(moved, gnp.constant(w.T.astype(x.dtype)))
            x = gnp.transpose(y, list(np.argsort(perm))) if a != len(shape) - 1 else y
        if outside is not None and outside.any():
            mask = outside.reshape((n_out,) + (1,) * (len(shape) - a - 1))
            x = gnp.where(gnp.constant(mask.astype(np.float32)),
                          _typed(extrapolation, x.dtype), x)
        shape[a] = n_out
    if mode != "nearest" and not floating:  # as the reference: rounded, saturated
        info = np.iinfo(dtype)
        inside, _, r = _round_even(x)
        x = gnp.clip(gnp.where(inside, r, x), float(info.min), float(info.max))
    return x


def _known_floats(ctx, i):
    if not ctx.has(i):
        return None
    v = np.ravel(ctx.const(i)).astype(np.float64)
    return None if v.size == 0 else v


@onnx_op("Resize", 10)
def _resize_op(ctx):
    x = ctx.tensor(0)
    dtype = ctx.dtype(0)
    shape = ctx.shape(0)
    rank = len(shape)
    v = ctx.version
    mode = ctx.attr("mode", "nearest")
    if mode not in ("nearest", "linear", "cubic") or (v < 11 and mode == "cubic"):
        raise ctx.unsupported(f"mode={mode!r}")
    if v >= 11:
        ctm = ctx.attr("coordinate_transformation_mode", "half_pixel")
        cubic_a = ctx.attr("cubic_coeff_a", -0.75)
        exclude = bool(ctx.attr("exclude_outside", 0))
        extrapolation = ctx.attr("extrapolation_value", 0.0)
        nearest_mode = ctx.attr("nearest_mode", "round_prefer_floor")
        roi_in, scales_in, sizes_in = _known_floats(ctx, 1), _known_floats(ctx, 2), \
            (ctx.const(3) if ctx.has(3) else None)
    else:  # opset 10: Upsample's rule (asymmetric, the nearest pixel on the left)
        ctm, cubic_a, exclude, extrapolation, nearest_mode = \
            "asymmetric", -0.75, False, 0.0, "floor"
        roi_in, scales_in, sizes_in = None, _known_floats(ctx, 1), None
    antialias = bool(ctx.attr("antialias", 0)) if v >= 18 else False
    axes = ctx.attr("axes") if v >= 18 else None
    policy = ctx.attr("keep_aspect_ratio_policy", "stretch") if v >= 18 else "stretch"
    valid_ctm = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric",
                 "tf_crop_and_resize") + (("half_pixel_symmetric",) if v >= 19 else ())
    if ctm not in valid_ctm or nearest_mode not in (
            "round_prefer_floor", "round_prefer_ceil", "floor", "ceil") or \
            policy not in ("stretch", "not_larger", "not_smaller") or \
            (antialias and mode == "nearest"):
        raise ctx.unsupported(f"coordinate_transformation_mode={ctm!r}, nearest_mode="
                              f"{nearest_mode!r}, keep_aspect_ratio_policy={policy!r}, "
                              f"antialias={int(antialias)} with mode={mode!r}")
    axes = list(range(rank)) if axes is None else [_norm_axis(ctx, a, rank) for a in axes]
    sizes = None if sizes_in is None or np.size(sizes_in) == 0 else \
        [int(s) for s in np.ravel(sizes_in)]
    if (sizes is None) == (scales_in is None):
        raise InvalidOnnxModel(f"{ctx.where}: give exactly one of scales and sizes")
    if sizes is not None:
        if len(sizes) != len(axes) or any(s < 0 for s in sizes):
            raise InvalidOnnxModel(f"{ctx.where}: sizes {sizes} for axes {axes}")
        scales = [s / shape[a] if shape[a] else 1.0 for s, a in zip(sizes, axes)]
        if policy != "stretch":
            s = min(scales) if policy == "not_larger" else max(scales)
            scales = [s] * len(axes)
            sizes = [int(s * shape[a] + 0.5) for a in axes]
    else:
        scales = [float(s) for s in scales_in]
        if len(scales) != len(axes) or any(s <= 0 for s in scales):
            raise InvalidOnnxModel(f"{ctx.where}: scales {scales} for axes {axes}")
        sizes = [int(np.float64(s) * shape[a]) for s, a in zip(scales, axes)]
    if ctm == "tf_crop_and_resize":
        if roi_in is None or roi_in.size != 2 * len(axes):
            raise InvalidOnnxModel(f"{ctx.where}: tf_crop_and_resize needs roi for "
                                   f"{len(axes)} axes")
        roi = [(roi_in[k], roi_in[k + len(axes)]) for k in range(len(axes))]
    else:
        roi = [None] * len(axes)
    r = _resize(ctx, x, dtype, axes, sizes, scales, roi, mode, ctm, nearest_mode, cubic_a,
                exclude, extrapolation, antialias)
    return [r if not isinstance(r, og.TensorOp) else
            ctx.out(r, dtype) if mode == "nearest" else _same(ctx, r)]


@onnx_op("Upsample", 7, 9)
def _upsample(ctx):
    mode = ctx.attr("mode", "nearest")
    if mode not in ("nearest", "linear"):
        raise ctx.unsupported(f"mode={mode!r}")
    scales = ctx.attr("scales") if ctx.version < 9 else _known_floats(ctx, 1)
    shape = ctx.shape(0)
    if scales is None or len(scales) != len(shape) or any(s < 1 for s in scales):
        raise InvalidOnnxModel(f"{ctx.where}: scales {scales} for an input {shape}")
    scales = [float(s) for s in scales]
    sizes = [int(np.float64(s) * d) for s, d in zip(scales, shape)]
    r = _resize(ctx, ctx.tensor(0), ctx.dtype(0), list(range(len(shape))), sizes, scales,
                [None] * len(shape), mode, "asymmetric", "floor", -0.75, False, 0.0, False)
    return [r if not isinstance(r, og.TensorOp) else
            ctx.out(r, ctx.dtype(0)) if mode == "nearest" else _same(ctx, r)]


# --- sampling at computed positions -------------------------------------------------------

def _reflect(x, lo, hi):
    """``x`` reflected back into ``[lo, hi]`` as often as it takes (PyTorch's rule)."""
    span = hi - lo
    if span <= 0:  # a single position (align_corners over a dimension of 1)
        return gnp.full(gnp.shape(x), float(lo), dtype=x.dtype)

    def fold(dx):
        _, _, n = _trunc_small(dx / span, _integral_from(dx))
        r = dx - n * span
        _, _, half = _trunc_small(n * 0.5, _integral_from(dx))
        return r, gnp.equal(half * 2.0, n)                   # (remainder, n even)

    below, above = gnp.less(x, lo), gnp.greater(x, hi)
    rb, eb = fold(gnp.where(below, lo - x, 0.0))
    ra, ea = fold(gnp.where(above, x - hi, 0.0))
    from_below = gnp.where(eb, lo + rb, hi - rb)
    from_above = gnp.where(ea, hi - ra, lo + ra)
    return gnp.where(below, from_below, gnp.where(above, from_above, x))


def _cubic_weights(t, a=-0.75):
    """The four cubic-convolution weights of the taps at distances ``t + 1, t, 1 - t,
    2 - t`` (Keys' kernel with ``a``)."""
    def near(d):
        return ((a + 2) * d - (a + 3)) * d * d + 1

    def far(d):
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a

    return [far(t + 1.0), near(t), near(1.0 - t), far(2.0 - t)]


@onnx_op("GridSample", 16)
def _grid_sample(ctx):
    """``X`` sampled at the positions ``grid`` gives (normalized to [-1, 1], the last
    spatial dimension first): each output is a product of per-dimension interpolation
    weights over its taps (1 nearest, 2 linear, 4 cubic per dimension), the taps
    gathered from ``X`` at positions computed when the model runs."""
    x, grid = _float(ctx), _float(ctx, 1)
    xs, gs = ctx.shape(0), ctx.shape(1)
    r = len(xs) - 2
    mode = ctx.attr("mode", "bilinear" if ctx.version < 20 else "linear")
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode) if ctx.version < 20 \
        else mode
    padding = ctx.attr("padding_mode", "zeros")
    align = bool(ctx.attr("align_corners", 0))
    if mode not in ("nearest", "linear", "cubic") or padding not in (
            "zeros", "border", "reflection") or (ctx.version < 20 and r != 2):
        raise ctx.unsupported(f"mode={mode!r}, padding_mode={padding!r} for {r} spatial "
                              f"dimensions")
    if len(gs) != r + 2 or gs[0] != xs[0] or gs[-1] != r:
        raise InvalidOnnxModel(f"{ctx.where}: grid {gs} for input {xs}")
    n, c, dims, out = xs[0], xs[1], xs[2:], tuple(gs[1:-1])
    if 0 in out:
        return [ctx.known(np.empty((n, c) + out, ctx.dtype(0)))]
    taps = {"nearest": 1, "linear": 2, "cubic": 4}[mode] ** r
    ctx.bound((taps, n) + out + (c,), carrier(ctx.dtype(0)), "the gathered taps")
    per_dim = []   # per spatial dimension: [(index, weight)], index a float integer
    for d, size in enumerate(dims):
        g = gnp.squeeze(_slice_along(grid, r + 1, r - 1 - d, r - d), r + 1)   # (N, *out)
        pos = (g + 1.0) * (0.5 * (size - 1)) if align else ((g + 1.0) * size - 1.0) * 0.5
        if mode == "nearest":
            inside, _, rounded = _round_even(pos)
            pos = gnp.where(inside, rounded, pos)
        lo, hi = (0.0, size - 1.0) if align else (-0.5, size - 0.5)
        if padding == "border":
            pos = gnp.clip(pos, 0.0, float(size - 1))
        elif padding == "reflection":
            pos = _reflect(pos, lo, hi)
        if mode == "nearest":
            _, _, t0 = _trunc_small(pos, _integral_from(pos))
            pairs = [(t0, None)]
        else:
            _, _, f0 = _floor(pos)
            t = pos - f0
            if mode == "linear":
                pairs = [(f0, 1.0 - t), (f0 + 1.0, t)]
            else:
                pairs = list(zip([f0 - 1.0, f0, f0 + 1.0, f0 + 2.0], _cubic_weights(t)))
        fixed = []
        for i, w in pairs:   # the tap's position inside the input, by the padding rule
            if padding == "zeros":
                ok = gnp.greater_equal(i, 0.0) * gnp.less(i, float(size))
                i = gnp.where(ok, i, 0.0)
                w = ok if w is None else w * ok
            elif padding == "border":
                i = gnp.clip(i, 0.0, float(size - 1))
            else:
                _, _, i = _trunc_small(_reflect(i, lo, hi), _integral_from(i))
                i = gnp.clip(i, 0.0, float(size - 1))
            fixed.append((i, w))
        per_dim.append(fixed)
    strides = [element_count(dims[d + 1:]) for d in range(r)]
    spatial = element_count(dims)
    base = gnp.constant((np.arange(n, dtype=np.float64) * spatial).reshape(
        (n,) + (1,) * len(out)).astype(grid.dtype))
    idx, wts = [], []
    for combo in np.ndindex(*[len(p) for p in per_dim]):
        flat, weight = base, None
        for d, k in enumerate(combo):
            i, w = per_dim[d][k]
            flat = flat + i * float(strides[d])
            if w is not None:
                weight = w if weight is None else weight * w
        idx.append(cast(flat, np.int64))
        wts.append(weight if weight is not None else gnp.ones((n,) + out, dtype=grid.dtype))
    rows = gnp.reshape(gnp.transpose(gnp.reshape(x, (n, c, spatial)), (0, 2, 1)),
                       (n * spatial, c))
    m = len(idx) * n * element_count(out)
    picked = gnp.take(rows, gnp.reshape(gnp.stack(idx, 0), (m,)), 0)       # (m, C)
    picked = gnp.reshape(picked, (len(idx), n) + out + (c,))
    w = gnp.expand_dims(cast(gnp.stack(wts, 0), x.dtype), -1)
    y = gnp.sum(picked * w, 0)                                             # (N, *out, C)
    perm = [0, len(out) + 1] + list(range(1, len(out) + 1))
    return [_same(ctx, gnp.transpose(y, perm))]
