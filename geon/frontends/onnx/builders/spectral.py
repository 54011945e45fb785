"""Signal processing: the windows, Fourier transforms and mel weights."""

import numpy as np

import geon as be
from geon.frontends.onnx.builders.base import (_float, _norm_axis, _same, cast, is_float,
                                               onnx_op)
from geon.frontends.onnx.builders.shapes import _slice_along
from geon.frontends.onnx.loading import InvalidOnnxModel, elem_dtype, elem_name

gnp = be.np


# --- windows ------------------------------------------------------------------------------

def _window(op_type, terms):
    @onnx_op(op_type, 17)
    def build(ctx):
        size = np.ravel(ctx.const(0))
        if size.size != 1:
            raise ctx.unsupported("size must be a scalar")
        size = int(size[0])
        periodic = ctx.attr("periodic", 1)
        to = ctx.attr("output_datatype", 1)
        dtype = elem_dtype(to)
        if dtype is None or not is_float(dtype) and dtype.kind not in "iu":
            raise ctx.unsupported(f"output_datatype {elem_name(to)}")
        ctx.bound((max(size, 0),), np.float64, "the window", known=True)
        n = np.arange(max(size, 0), dtype=np.float64)
        den = size if periodic else size - 1
        w = np.zeros_like(n)
        for k, a in enumerate(terms):
            w = w + a * np.cos(2.0 * np.pi * k * n / den) if den else w + a
        return [ctx.known(w.astype(dtype))]
    build.__name__ = f"build_{op_type}"


_window("HannWindow", (0.5, -0.5))
_window("HammingWindow", (25.0 / 46.0, -(1.0 - 25.0 / 46.0)))
_window("BlackmanWindow", (0.42, -0.5, 0.08))


# --- Fourier transforms -------------------------------------------------------------------

def _dft_along(x, axis, length, inverse, onesided, complex_in, ctx):
    """The DFT of ``x`` (…, n, 1 | 2: real or complex) along ``axis`` at ``length``
    points (truncated or zero-padded): a product with cos / sin matrices computed in
    float64 at import (the transform too, for the narrower types)."""
    shape = list(gnp.shape(x))
    rank = len(shape)
    n = shape[axis]
    wide = cast(x, np.float64) if x.dtype != np.float64 else x
    if n > length:
        wide = _slice_along(wide, axis, 0, length)
    elif n < length:
        widths = [[0, 0] for _ in range(rank)]
        widths[axis][1] = length - n
        wide = gnp.pad(wide, widths)
    perm = [d for d in range(rank - 1) if d != axis] + [axis, rank - 1]
    moved = gnp.transpose(wide, perm)                     # (..., length, 1|2)
    re = moved[..., 0]
    im = moved[..., 1] if complex_in else None
    if inverse and onesided:   # one-sided spectrum in, a real signal of `length` out
        bins = length // 2 + 1
        ctx.bound((bins, length), np.float64, "the DFT matrix", known=True)
        re = _slice_along(re, gnp.ndim(re) - 1, 0, min(bins, length))
        im = _slice_along(im, gnp.ndim(im) - 1, 0, min(bins, length)) if im is not None \
            else None
        got = min(bins, length)
        k = np.arange(got)[:, None]
        t = np.arange(length)[None, :]
        ang = 2.0 * np.pi * ((k * t) % length) / length
        w = np.where((k == 0) | ((length % 2 == 0) & (k == length // 2)), 1.0, 2.0) / length
        out = gnp.matmul(re, gnp.constant(w * np.cos(ang)))
        if im is not None:
            out = out - gnp.matmul(im, gnp.constant(w * np.sin(ang)))
        parts = [out]
    else:
        bins = length // 2 + 1 if onesided else length
        ctx.bound((length, bins), np.float64, "the DFT matrix", known=True)
        t = np.arange(length)[:, None]
        k = np.arange(bins)[None, :]
        ang = 2.0 * np.pi * ((t * k) % length) / length
        sign = 1.0 if inverse else -1.0
        scale = 1.0 / length if inverse else 1.0
        c, s = gnp.constant(np.cos(ang) * scale), gnp.constant(sign * np.sin(ang) * scale)
        out_re = gnp.matmul(re, c)
        out_im = gnp.matmul(re, s)
        if im is not None:           # (a + ib)(c + is) = ac - bs + i(as + bc)
            out_re = out_re - gnp.matmul(im, s)
            out_im = out_im + gnp.matmul(im, c)
        parts = [out_re, out_im]
    y = gnp.stack(parts, -1)                              # (..., bins, 1|2)
    inv = list(np.argsort(perm))
    return gnp.transpose(y, inv)


@onnx_op("DFT", 17)
def _dft(ctx):
    x = _float(ctx)
    shape = ctx.shape(0)
    rank = len(shape)
    if rank < 2 or shape[-1] not in (1, 2):
        raise InvalidOnnxModel(f"{ctx.where}: input {shape} (the last dimension holds 1 "
                               f"real or 2 complex parts)")
    if ctx.version >= 20:
        axis = int(np.ravel(ctx.const(2))[0]) if ctx.has(2) else -2
    else:
        axis = ctx.attr("axis", 1)
    axis = _norm_axis(ctx, axis, rank)
    if axis == rank - 1:
        raise InvalidOnnxModel(f"{ctx.where}: axis {axis} is the complex dimension")
    inverse, onesided = bool(ctx.attr("inverse", 0)), bool(ctx.attr("onesided", 0))
    if ctx.has(1) and np.size(ctx.const(1)):
        length = int(np.ravel(ctx.const(1))[0])
    else:
        length = 2 * (shape[axis] - 1) if inverse and onesided else shape[axis]
    if length < 1:
        raise InvalidOnnxModel(f"{ctx.where}: dft_length {length}")
    if onesided and not inverse and shape[-1] == 2:
        raise InvalidOnnxModel(f"{ctx.where}: a one-sided DFT of a complex signal")
    y = _dft_along(x, axis, length, inverse, onesided, shape[-1] == 2, ctx)
    return [_same(ctx, y)]


@onnx_op("STFT", 17)
def _stft(ctx):
    x = _float(ctx)
    shape = ctx.shape(0)
    if len(shape) != 3 or shape[-1] not in (1, 2):
        raise InvalidOnnxModel(f"{ctx.where}: signal {shape} (batch, length, 1 | 2)")
    step = int(np.ravel(ctx.const(1))[0])
    win = ctx.tensor(2) if ctx.has(2) else None
    if ctx.has(3):
        frame = int(np.ravel(ctx.const(3))[0])
    else:
        frame = ctx.shape(2)[0] if win is not None else shape[1]
    if win is not None and tuple(ctx.shape(2)) != (frame,):
        raise InvalidOnnxModel(f"{ctx.where}: window {ctx.shape(2)} for frames of {frame}")
    onesided = bool(ctx.attr("onesided", 1))
    if step < 1 or not 0 < frame <= shape[1] or (onesided and shape[-1] == 2):
        raise InvalidOnnxModel(f"{ctx.where}: frame_step {step}, frame_length {frame}, "
                               f"onesided {int(onesided)} for signal {shape}")
    frames = (shape[1] - frame) // step + 1
    ctx.bound((frames, frame), np.int64, "the frame positions", known=True)
    pos = (np.arange(frames)[:, None] * step + np.arange(frame)[None, :]).reshape(-1)
    y = gnp.take(x, gnp.constant(pos.astype(np.int64)), 1)     # (batch, frames * frame, c)
    y = gnp.reshape(y, (shape[0], frames, frame, shape[-1]))
    if win is not None:
        y = y * gnp.reshape(win, (frame, 1))
    return [_same(ctx, _dft_along(y, 2, frame, False, onesided, shape[-1] == 2, ctx))]


@onnx_op("MelWeightMatrix", 17)
def _mel_weight_matrix(ctx):
    """Triangular filters between mel-spaced bins (``mel(f) = 2595 log10(1 + f / 700)``),
    each peaking at 1, over the ``dft_length // 2 + 1`` spectrogram bins: known at
    import."""
    bins_mel, dft, rate = (int(np.ravel(ctx.const(i))[0]) for i in range(3))
    lo, hi = (float(np.ravel(ctx.const(i))[0]) for i in (3, 4))
    dtype = elem_dtype(ctx.attr("output_datatype", 1))
    if dtype is None or bins_mel < 1 or dft < 1 or rate < 1:
        raise InvalidOnnxModel(f"{ctx.where}: {bins_mel} mel bins, dft_length {dft}, "
                               f"sample rate {rate}")
    spec = dft // 2 + 1
    ctx.bound((spec, bins_mel), np.float64, known=True)
    mel_lo = 2595.0 * np.log10(1.0 + lo / 700.0)
    mel_hi = 2595.0 * np.log10(1.0 + hi / 700.0)
    edges = np.arange(bins_mel + 2) * ((mel_hi - mel_lo) / (bins_mel + 2)) + mel_lo
    hz = 700.0 * (np.power(10.0, edges / 2595.0) - 1.0)
    b = np.floor((dft + 1) * hz / rate).astype(np.int64)       # the bin of each edge
    w = np.zeros((spec, bins_mel))
    for i in range(bins_mel):
        left, mid, right = b[i], b[i + 1], b[i + 2]
        if mid == left:
            if 0 <= mid < spec:
                w[mid, i] = 1.0
        else:
            j = np.arange(left, mid + 1)
            ok = (j >= 0) & (j < spec)
            w[j[ok], i] = (j[ok] - left) / (mid - left)
        if right > mid:
            j = np.arange(mid, right)
            ok = (j >= 0) & (j < spec)
            w[j[ok], i] = (right - j[ok]) / (right - mid)
    return [ctx.known(w.astype(dtype))]
