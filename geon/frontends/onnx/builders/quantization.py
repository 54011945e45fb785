"""Quantization: (de)quantizing, integer and quantized-linear products and
convolutions."""

import numpy as np

import geon as be
from geon.frontends.onnx.builders.base import (_float, _norm_axis, carrier, cast, is_float,
                                               onnx_op, to_narrow)
from geon.frontends.onnx.builders.elementwise import _round_even
from geon.frontends.onnx.builders.nn import _pads, _window_attrs
from geon.frontends.onnx.loading import (InvalidOnnxModel, elem_dtype, elem_name,
                                         element_count, narrow_format)

gnp = be.np


# --- quantization -------------------------------------------------------------------------

#: The saturation range of each integer quantized type.
_QRANGE = {"uint8": (0, 255), "int8": (-128, 127), "uint16": (0, 65535),
           "int16": (-32768, 32767), "uint4": (0, 15), "int4": (-8, 7), "uint2": (0, 3),
           "int2": (-2, 1)}


def _quant_param(ctx, i, shape, axis, block):
    """Scale or zero point ``i`` broadcast against an input of ``shape``: one value, one
    per index of ``axis``, or (``block``) one per block of ``block`` indices along
    ``axis`` (the blocks' values repeated, known at import)."""
    p = ctx.tensor(i)
    pshape = ctx.shape(i)
    if element_count(pshape) == 1:
        return gnp.reshape(p, ())
    axis = _norm_axis(ctx, axis, len(shape))
    if not block:
        if len(pshape) != 1 or pshape[0] != shape[axis]:
            raise InvalidOnnxModel(f"{ctx.where}: input {i} of shape {pshape} is neither one "
                                   f"value nor one per index of axis {axis} of {shape}")
        return gnp.reshape(p, (pshape[0],) + (1,) * (len(shape) - axis - 1))
    if block < 0 or len(pshape) != len(shape) or pshape[axis] != -(-shape[axis] // block) or \
            any(a != b for k, (a, b) in enumerate(zip(pshape, shape)) if k != axis):
        raise InvalidOnnxModel(f"{ctx.where}: input {i} of shape {pshape} does not block "
                               f"{shape} by {block} along axis {axis}")
    return gnp.take(p, gnp.constant(np.arange(shape[axis], dtype=np.int64) // block), axis)


def _quant_axis(ctx, shape):
    """``(axis, block_size)``; the axis is checked where a scale has one value per index
    (it means nothing for one scale)."""
    axis = ctx.attr("axis", 1)
    block = ctx.attr("block_size", 0) if ctx.version >= 21 else 0
    return axis, block


@onnx_op("DequantizeLinear", 10)
def _dequantize(ctx):
    shape = ctx.shape(0)
    axis, block = _quant_axis(ctx, shape) if ctx.version >= 13 else (0, 0)
    to = ctx.attr("output_dtype", 0) if ctx.version >= 23 else 0
    out = ctx.dtype(1) if not to else elem_dtype(to)
    if out is None or not is_float(out):
        raise ctx.unsupported(f"output_dtype {elem_name(to)}")
    x = cast(ctx.tensor(0), np.float32)
    if ctx.has(2) and not is_float(ctx.dtype(0)):  # (a float8 zero point is 0)
        x = x - cast(_quant_param(ctx, 2, shape, axis, block), np.float32)
    y = x * cast(_quant_param(ctx, 1, shape, axis, block), np.float32)
    return [_same_type(ctx, y, out)]


def _same_type(ctx, op, dtype, saturate=False):
    """``op`` as a result of the ONNX type ``dtype`` (rounded once to a narrow one)."""
    if narrow_format(dtype) is not None:
        return ctx.out(to_narrow(op, dtype, saturate=saturate), dtype)
    return ctx.out(cast(op, carrier(dtype)), dtype)


def _round_saturate(x, lo, hi):
    """``x`` rounded half to even and clipped to ``[lo, hi]`` (floats)."""
    inside, _, r = _round_even(x)
    return gnp.clip(gnp.where(inside, r, x), float(lo), float(hi))


@onnx_op("QuantizeLinear", 10)
def _quantize(ctx):
    shape = ctx.shape(0)
    axis, block = _quant_axis(ctx, shape) if ctx.version >= 13 else (0, 0)
    to = ctx.attr("output_dtype", 0) if ctx.version >= 21 else 0
    saturate = bool(ctx.attr("saturate", 1)) if ctx.version >= 19 else True
    precision = ctx.attr("precision", 0) if ctx.version >= 23 else 0
    out = ctx.dtype(2) if ctx.has(2) else elem_dtype(to) if to else np.dtype(np.uint8)
    if out is None or (to and ctx.has(2) and elem_dtype(to) != ctx.dtype(2)):
        raise ctx.unsupported(f"output_dtype {elem_name(to)} with zero point type "
                              f"{ctx.dtype(2) if ctx.has(2) else None}")
    x = ctx.tensor(0)
    scale = _quant_param(ctx, 1, shape, axis, block)
    if precision:
        p = elem_dtype(precision)
        if p is None or not is_float(p):
            raise ctx.unsupported(f"precision {elem_name(precision)}")
        x, scale = cast(x, carrier(p)), cast(scale, carrier(p))
    else:
        scale = cast(scale, x.dtype)
    q = x / scale
    fmt = narrow_format(out) or out.name
    if fmt in _QRANGE:
        q = cast(q, np.float64) if q.dtype.itemsize < 8 else q
        inside, _, r = _round_even(q)               # rounded, then the zero point added
        q = gnp.where(inside, r, q)
        if ctx.has(2):
            q = q + cast(_quant_param(ctx, 2, shape, axis, block), np.float64)
        lo, hi = _QRANGE[fmt]
        return [ctx.out(cast(gnp.clip(q, float(lo), float(hi)), carrier(out)), out)]
    if is_float(out) and narrow_format(out) is not None:     # float8, float4
        if ctx.has(2) and fmt.startswith("float4"):
            q = q + cast(_quant_param(ctx, 2, shape, axis, block), q.dtype)
        return [_same_type(ctx, q, out, saturate=saturate or fmt.startswith("float4"))]
    raise ctx.unsupported(f"quantizing to {out}")


@onnx_op("DynamicQuantizeLinear", 11)
def _dynamic_quantize(ctx):
    x = _float(ctx)
    if ctx.dtype(0) != np.float32:
        raise ctx.unsupported(f"input of type {ctx.dtype(0)} (float32 only)")
    hi = gnp.maximum(gnp.max(x), 0.0)
    lo = gnp.minimum(gnp.min(x), 0.0)
    span = hi - lo
    scale = gnp.where(gnp.equal(span, 0.0), 1.0, span) / 255.0
    zp = gnp.clip(0.0 - lo / scale, 0.0, 255.0)
    zpi = _round_saturate(zp, 0, 255)
    y = _round_saturate(x / scale, -1e9, 1e9) + zpi
    y = gnp.clip(y, 0.0, 255.0)
    return [ctx.out(cast(y, np.uint8), np.uint8), ctx.out(scale, np.float32),
            ctx.out(cast(zpi, np.uint8), np.uint8)]


def _int_operand(ctx, i, zp_i, zp_shape=None):
    """Integer input ``i`` minus its zero point ``zp_i`` (if given), in float64 (exact)."""
    x = cast(ctx.tensor(i), np.float64)
    if ctx.has(zp_i):
        z = cast(ctx.tensor(zp_i), np.float64)
        if zp_shape is not None and element_count(ctx.shape(zp_i)) > 1:
            z = gnp.reshape(z, zp_shape)
        x = x - z
    return x


@onnx_op("MatMulInteger", 10)
def _matmul_integer(ctx):
    """int32 products of 8-bit integers, computed in float64 (exact: every partial sum
    is an integer far below 2**53)."""
    a = _int_operand(ctx, 0, 2, (-1, 1))          # a zero point per row of A
    b = _int_operand(ctx, 1, 3)                   # ... per column of B
    return [ctx.out(cast(gnp.matmul(a, b), np.int32), np.int32)]


def _conv_attrs(ctx, wshape, xshape):
    n = len(wshape) - 2
    kernel, strides, dil = _window_attrs(ctx, n)
    if kernel is not None and list(kernel) != list(wshape[2:]):
        raise ctx.unsupported(f"kernel_shape {kernel} differs from the filter {wshape}")
    pads = _pads(ctx, xshape[2:], wshape[2:], strides, dil)
    return dict(stride=strides, padding=pads, dilation=dil, groups=ctx.attr("group", 1))


@onnx_op("ConvInteger", 10)
def _conv_integer(ctx):
    wshape = ctx.shape(1)
    x = _int_operand(ctx, 0, 2)
    w = _int_operand(ctx, 1, 3, (-1,) + (1,) * (len(wshape) - 1))
    y = gnp.conv(x, w, **_conv_attrs(ctx, wshape, ctx.shape(0)))
    return [ctx.out(cast(y, np.int32), np.int32)]


def _requantize(ctx, acc, factor, zp_i, out):
    """QLinear*'s result: the exact integer accumulation ``acc`` (float64) times the
    scale ``factor`` (computed in the scales' type, as the reference does), plus the
    output zero point, rounded half to even and saturated to the output type."""
    d = acc * cast(factor, np.float64)
    if ctx.has(zp_i):
        d = d + cast(ctx.tensor(zp_i), np.float64)
    lo, hi = _QRANGE[out.name]
    return ctx.out(cast(_round_saturate(d, lo, hi), out), out)


@onnx_op("QLinearMatMul", 10)
def _qlinear_matmul(ctx):
    out = ctx.dtype(7) if ctx.has(7) else ctx.dtype(0)
    if out.name not in _QRANGE:
        raise ctx.unsupported(f"output type {out}")
    acc = gnp.matmul(_int_operand(ctx, 0, 2, (-1, 1)), _int_operand(ctx, 3, 5))
    factor = ctx.tensor(1) * ctx.tensor(4) / ctx.tensor(6)
    factor = gnp.reshape(factor, ()) if element_count(ctx.shape(1)) == 1 and \
        element_count(ctx.shape(4)) == 1 and element_count(ctx.shape(6)) == 1 else factor
    return [_requantize(ctx, acc, factor, 7, out)]


@onnx_op("QLinearConv", 10)
def _qlinear_conv(ctx):
    out = ctx.dtype(7) if ctx.has(7) else ctx.dtype(0)
    if out.name not in _QRANGE:
        raise ctx.unsupported(f"output type {out}")
    wshape = ctx.shape(3)
    n = len(wshape) - 2
    x = _int_operand(ctx, 0, 2)
    w = _int_operand(ctx, 3, 5, (-1,) + (1,) * (n + 1))
    acc = gnp.conv(x, w, **_conv_attrs(ctx, wshape, ctx.shape(0)))
    if ctx.has(8):
        acc = acc + gnp.reshape(cast(ctx.tensor(8), np.float64), (-1,) + (1,) * n)
    ws = ctx.tensor(4)
    if element_count(ctx.shape(4)) > 1:           # per output channel
        ws = gnp.reshape(ws, (-1,) + (1,) * n)
    factor = ctx.tensor(1) * ws / ctx.tensor(6)
    if element_count(ctx.shape(4)) == 1:
        factor = gnp.reshape(factor, ())
    return [_requantize(ctx, acc, factor, 7, out)]
