"""Rounding to narrow number formats ("fake quantization"), held in a wider type.

:func:`round_to_format` (``be.np.round_to_format``) rounds each element of a tensor to
the nearest value of a narrow format (bfloat16, the float8 formats, float4 E2M1, the
E8M0 scale format, the 4- and 2-bit integers) and returns it in the input's own dtype:
the values lie on the format's grid, the storage stays wide. geon computes in the types
NumPy has; a value of a narrow format is exactly representable in float32 (and a 4- or
2-bit integer in int8 / uint8), so holding it widened loses nothing. This is what
quantization-aware training needs (the forward pass sees the rounded values) and what
ONNX's ``Cast`` to these types means.

The result has ``x``'s dtype: give float32 (or float64) values, since a float16 ``x``
cannot hold every bfloat16 or E8M0 value (those round beyond float16's range). The op
is a user op (:func:`geon.define_op`) with a NumPy implementation: the NumPy
transformer and the reference evaluator run it; the GPU transformer refuses it by
name.

The derivative is the straight-through estimator: the op passes the incoming
gradient unchanged (the exact derivative is zero almost everywhere, which would stop
training). Use :func:`~geon.op_graph.op_graph.stop_gradient` around it for no gradient.

The rules, per the ONNX ``Cast`` operator's description:

* Floating formats round to nearest, ties to even, with the format's exponent range
  and subnormals. A value whose rounded magnitude exceeds the largest finite value
  (infinities included) becomes, with ``saturate=True``, that largest value with the
  value's sign; with ``saturate=False``, infinity for the formats that have one
  (E5M2, bfloat16) and NaN for the others (E4M3FN, E4M3FNUZ, E5M2FNUZ). bfloat16
  follows IEEE rules whatever ``saturate`` says (ONNX's saturation is a float8 rule).
  NaN stays NaN. The ``FNUZ`` formats have no negative zero: -0 becomes +0.
* float4 E2M1 (largest value 6) has no infinity and no NaN: it always saturates; a NaN
  input stays NaN in the widened value (the format cannot hold it).
* E8M0 (``float8_e8m0fnu``) holds powers of two ``2**-127 .. 2**127`` and NaN. The
  value is first rounded to float32 and then to a power of two by ``round_mode``:
  ``"up"`` (the next power of two above a value that is not one), ``"down"`` (the one
  below) or ``"nearest"`` (the nearer; a tie, ``1.5 * 2**e``, goes up). Zero and
  float32's subnormal numbers follow float32's encoding (exponent field 0): 0 becomes
  ``2**-127``, a subnormal ``2**-126`` when rounding up. With ``saturate=True`` results
  are clipped to ``2**127`` (infinity included); with ``saturate=False``, a result
  above ``2**127`` or an input below ``2**-127`` (zero included) is NaN. The sign is
  ignored (negative inputs are unspecified in ONNX).
* The integer formats (``int4``, ``uint4``, ``int2``, ``uint2``) truncate toward zero
  and keep the low bits (two's complement), as ONNX's casts between integer types do;
  NaN and infinities become 0 (ONNX leaves out-of-range float conversions undefined).
"""

import numpy as np

from geon.errors import ArgumentError
from geon.op_graph import op_graph as og
from geon.op_graph.coercion import numpy_constant
from geon.op_graph.user_ops import define_op


class _Float:
    def __init__(self, mbits, emin, max_value, inf=False, nan=True, neg_zero=True,
                 ieee=False):
        self.mbits, self.emin, self.max_value = mbits, emin, max_value
        self.inf, self.nan, self.neg_zero, self.ieee = inf, nan, neg_zero, ieee


class _Int:
    def __init__(self, bits, signed):
        self.bits, self.signed = bits, signed
        self.lo = -(1 << (bits - 1)) if signed else 0
        self.hi = self.lo + (1 << bits) - 1


#: The formats by name (ml_dtypes' names): their mantissa bits, smallest normal
#: exponent, largest finite value and special values.
FORMATS = {
    "bfloat16": _Float(7, -126, float.fromhex("0x1.fep127"), inf=True, ieee=True),
    "float8_e4m3fn": _Float(3, -6, 448.0),
    "float8_e4m3fnuz": _Float(3, -7, 240.0, neg_zero=False),
    "float8_e5m2": _Float(2, -14, 57344.0, inf=True),
    "float8_e5m2fnuz": _Float(2, -15, 57344.0, neg_zero=False),
    "float4_e2m1fn": _Float(1, 0, 6.0, nan=False),
    "float8_e8m0fnu": None,  # powers of two: its own rule
    "int4": _Int(4, True), "uint4": _Int(4, False),
    "int2": _Int(2, True), "uint2": _Int(2, False),
}

ROUND_MODES = ("up", "down", "nearest")


def _float_format(x, f, saturate):
    a = np.abs(x)
    finite = np.isfinite(a)
    a0 = np.where(finite, a, 0.0)
    _, ex = np.frexp(a0)                       # a = m * 2**ex, m in [0.5, 1)
    e = np.maximum(ex - 1, f.emin)              # the binade (subnormals share emin's)
    shift = (e - f.mbits).astype(np.int64)
    r = np.ldexp(np.rint(np.ldexp(a0, -shift)), shift)  # RNE on the mantissa, exact
    over = (r > f.max_value) | np.isinf(a)
    if f.ieee:                                 # bfloat16: IEEE overflow
        big = np.inf
    elif saturate or not f.nan:                # float4 E2M1 always saturates
        big = f.max_value
    else:
        big = np.inf if f.inf else np.nan
    r = np.where(over, big, r)
    r = np.where(np.isnan(a), np.nan, r)
    if f.neg_zero:
        r = np.copysign(r, x)
    else:
        r = np.where(x < 0, -r, r)
        r = np.where(r == 0, 0.0, r)  # +0 only
    return r


def _e8m0(x, saturate, round_mode):
    a = np.abs(np.asarray(x, np.float32)).astype(np.float64)
    nan = np.isnan(a)
    inf = np.isinf(a)
    tiny = 2.0 ** -126
    normal = (a >= tiny) & ~inf & ~nan
    m, ex = np.frexp(np.where(normal, a, 1.0))
    e = ex - 1
    if round_mode == "up":
        e = e + (m != 0.5)
        low = np.where(a > 0, -126, -127)       # float32's exponent field 0
    elif round_mode == "nearest":
        e = e + (m >= 0.75)
        low = np.where(a > 2.0 ** -127, -126, -127)
    else:
        low = np.full(a.shape, -127)
    e = np.where(normal, e, low)
    if saturate:
        e = np.minimum(e, 127)
        r = np.ldexp(1.0, e)
        r = np.where(inf, 2.0 ** 127, r)
    else:
        r = np.ldexp(1.0, np.minimum(e, 128))
        r = np.where((e > 127) | inf | (a < 2.0 ** -127), np.nan, r)
    return np.where(nan, np.nan, r)


def _int_format(x, f):
    x = np.asarray(x)
    if x.dtype.kind in "iub":
        return (x.astype(np.int64) - f.lo) % (1 << f.bits) + f.lo
    t = np.where(np.isfinite(x), np.trunc(x), 0.0).astype(np.float64)
    return np.mod(t - f.lo, float(1 << f.bits)) + f.lo


def round_array(x, fmt, saturate=True, round_mode="up"):
    """NumPy: ``x`` rounded to the format ``fmt`` (see the module doc), in ``x``'s dtype
    (floating-point for the float formats)."""
    check_format(fmt, round_mode)
    x = np.asarray(x)
    f = FORMATS[fmt]
    out_dtype = result_dtype(x.dtype, fmt)
    with np.errstate(all="ignore"):
        if isinstance(f, _Int):
            r = _int_format(x, f)
        elif f is None:
            r = _e8m0(x, bool(saturate), round_mode)
        else:
            r = _float_format(x.astype(np.float64), f, bool(saturate))
        return np.asarray(r).astype(out_dtype)


def result_dtype(dtype, fmt):
    """The dtype of ``round_to_format`` of a ``dtype`` value: ``dtype`` itself, except
    float32 for an integer or boolean value rounded to a float format (its result
    can be NaN or fractional) and for a boolean one rounded to an integer format."""
    dtype = np.dtype(dtype)
    if isinstance(FORMATS[fmt], _Int):
        return dtype if dtype.kind in "fiu" else np.dtype(np.float32)
    return dtype if dtype.kind == "f" else np.dtype(np.float32)


def check_format(fmt, round_mode="up"):
    if fmt not in FORMATS:
        raise ArgumentError(f"round_to_format: unknown format {fmt!r} (known: "
                            f"{', '.join(FORMATS)})")
    if round_mode not in ROUND_MODES:
        raise ArgumentError(f"round_to_format: round_mode must be one of {ROUND_MODES}, "
                            f"not {round_mode!r}")


def _numpy(x, fmt, saturate, round_mode):
    return round_array(x, fmt, saturate, round_mode)


def _straight_through(op, delta):
    return (delta,)


def _define():
    return define_op(
        "RoundToFormat", _numpy, axes=lambda x, **params: x.axes,
        reverse=_straight_through, params=("fmt", "saturate", "round_mode"), arity=1,
        dtype=lambda x: x.dtype,
        doc="``x`` rounded to a narrow number format, held in ``x``'s dtype "
            "(:func:`geon.op_graph.formats.round_to_format`); its derivative is the "
            "straight-through estimator.")


RoundToFormat = _define()


def round_to_format(x: og.TensorOp, fmt: str, saturate: bool = True,
                    round_mode: str = "up") -> og.TensorOp:
    """``x`` rounded elementwise to the narrow format ``fmt`` (one of ``FORMATS``:
    ``"bfloat16"``, ``"float8_e4m3fn"``, ``"float8_e4m3fnuz"``, ``"float8_e5m2"``,
    ``"float8_e5m2fnuz"``, ``"float8_e8m0fnu"``, ``"float4_e2m1fn"``, ``"int4"``,
    ``"uint4"``, ``"int2"``, ``"uint2"``), in ``x``'s dtype and axes. ``saturate`` and
    ``round_mode`` as in ONNX's ``Cast`` (see the module doc). Differentiable with the
    straight-through estimator (the gradient passes unchanged)."""
    check_format(fmt, round_mode)
    if not isinstance(x, og.Op):
        x = numpy_constant(x)
    wide = result_dtype(x.dtype, fmt)
    if wide != x.dtype:  # integers rounded to a float format: in float32 first
        x = og.Add(x, 0, dtype=wide)
    return RoundToFormat(x, fmt=fmt, saturate=bool(saturate), round_mode=round_mode)


__all__ = ["FORMATS", "ROUND_MODES", "RoundToFormat", "result_dtype", "round_array",
           "round_to_format"]
