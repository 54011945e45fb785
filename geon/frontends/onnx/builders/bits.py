"""Bitwise operators, shifts and bit casts."""

import numpy as np

import geon as be
from geon.frontends.onnx.builders.base import _empty_elementwise, cast, onnx_op
from geon.frontends.onnx.builders.elementwise import _floor
from geon.frontends.onnx.builders.indexing import _typed
from geon.frontends.onnx.loading import elem_dtype

gnp = be.np


# --- bits ---------------------------------------------------------------------------------
# geon has no bit-level primitive: the bits of integers are computed exactly from float64
# arithmetic on values under 2**32 (a 64-bit value is split into two such halves), and the
# two's complement of a signed value is its same-width unsigned value (a cast wraps).

def _unsigned(op, dtype):
    return cast(op, np.dtype(f"uint{np.dtype(dtype).itemsize * 8}"))


def _halves(u):
    """``(hi, lo)``, float64 values under 2**32, of a uint64 op: ``u = hi 2**32 + lo``
    (the float64 quotient is off by at most one, which the remainder's range shows)."""
    two32 = np.uint64(1 << 32)
    hi = cast(cast(cast(u, np.float64) * 2.0 ** -32, np.int64), np.uint64)
    lo = u - hi * two32                                         # wraps if hi is one too big
    over = gnp.greater_equal(lo, np.uint64(1 << 63))
    under = gnp.greater_equal(lo, two32) * (1.0 - over)
    hi = gnp.where(over, hi - np.uint64(1), gnp.where(under, hi + np.uint64(1), hi))
    lo = gnp.where(over, lo + two32, gnp.where(under, lo - two32, lo))
    return cast(hi, np.float64), cast(lo, np.float64)


def _join(hi, lo):
    """The uint64 ``hi 2**32 + lo`` of float64 halves under 2**32."""
    return cast(hi, np.uint64) * np.uint64(1 << 32) + cast(lo, np.uint64)


def _ftrunc(v):
    return cast(cast(v, np.int64), np.float64)   # (|v| < 2**62 here)


def _bitwise_small(a, b, bits, combine):
    """``combine`` of each pair of bits of float64 values in ``[0, 2**bits)``,
    ``bits <= 32``, assembled back into a float64 value."""
    out = None
    for k in range(bits):
        ha, hb = _ftrunc(a * 0.5), _ftrunc(b * 0.5)
        bit = combine(a - 2.0 * ha, b - 2.0 * hb) * float(2 ** k)
        out = bit if out is None else out + bit
        a, b = ha, hb
    return out


_BIT_OPS = {"BitwiseAnd": lambda x, y: x * y, "BitwiseOr": lambda x, y: x + y - x * y,
            "BitwiseXor": lambda x, y: x + y - 2.0 * x * y}


def _bitwise(op_type):
    @onnx_op(op_type, 18)
    def build(ctx):
        empty = _empty_elementwise(ctx)
        if empty is not None:
            return empty
        dtype = ctx.dtype(0)
        if dtype.kind not in "iu" or ctx.dtype(1) != dtype:
            raise ctx.unsupported(f"inputs of types {dtype}, {ctx.dtype(1)}")
        a, b = _unsigned(ctx.tensor(0), dtype), _unsigned(ctx.tensor(1), dtype)
        combine = _BIT_OPS[op_type]
        if dtype.itemsize < 8:
            bits = dtype.itemsize * 8
            r = _bitwise_small(cast(a, np.float64), cast(b, np.float64), bits, combine)
        else:
            (ah, al), (bh, bl) = _halves(a), _halves(b)
            r = _join(_bitwise_small(ah, bh, 32, combine), _bitwise_small(al, bl, 32, combine))
        return [ctx.out(cast(cast(r, _unsigned(a, dtype).dtype), dtype), dtype)]
    build.__name__ = f"build_{op_type}"


for _op in _BIT_OPS:
    _bitwise(_op)


@onnx_op("BitwiseNot", 18)
def _bitwise_not(ctx):
    x = ctx.tensor(0)
    d = ctx.dtype(0)
    if d.kind not in "iu":
        raise ctx.unsupported(f"input of type {d}")
    # ~x is -x - 1 in two's complement, max - x for an unsigned type (both exact)
    r = -x - _typed(1, d) if d.kind == "i" else _typed(np.iinfo(d).max, d) - x
    return [ctx.out(r, d)]


def _shift_right_u64(u, s):
    """``u >> s`` for uint64 ``u`` and float64 ``s`` in ``[0, 64)``, exactly, from the
    32-bit halves."""
    hi, lo = _halves(u)
    low_s = gnp.less(s, 32.0)
    p = gnp.power(2.0, gnp.where(low_s, s, 0.0))                 # 2**s, s < 32
    hi_q = _ftrunc(hi / p)
    carry = (hi - hi_q * p) * gnp.power(2.0, 32.0 - gnp.where(low_s, s, 0.0))
    small = _join(hi_q, _ftrunc(lo / p) + carry)
    big = cast(_ftrunc(hi / gnp.power(2.0, gnp.where(low_s, 32.0, s) - 32.0)), np.uint64)
    return gnp.where(low_s, small, big)


@onnx_op("BitShift", 11)
def _bit_shift(ctx):
    """Shifts by a count computed at run time: left, the product with ``2**s`` in the
    unsigned type of the width (it wraps as the bits fall off); right, the floor of the
    quotient by ``2**s`` (a sign-extending shift for signed types, from 2**63 added to
    their unsigned value). A count below 0 or past the width gives what the sign fill
    alone gives: -1 for a right shift of a negative value, else 0."""
    empty = _empty_elementwise(ctx)
    if empty is not None:
        return empty
    d = ctx.dtype(0)
    direction = ctx.attr("direction")
    if d.kind not in "iu" or ctx.dtype(1) != d or direction not in ("LEFT", "RIGHT") or \
            (d.kind == "i" and ctx.version < 28):
        raise ctx.unsupported(f"direction={direction!r} for inputs of {d}, {ctx.dtype(1)}")
    bits = d.itemsize * 8
    x, s = ctx.tensor(0), ctx.tensor(1)
    sf = cast(s, np.float64)
    valid = gnp.greater_equal(sf, 0.0) * gnp.less(sf, float(bits))
    sc = gnp.where(valid, sf, 0.0)
    table = gnp.constant(np.array([1 << k for k in range(64)], np.uint64))
    if direction == "LEFT":
        u = cast(_unsigned(x, d), np.uint64)
        r = u * gnp.take(table, cast(sc, np.int64))                # wraps past 64 bits
        r = cast(cast(r, _unsigned(x, d).dtype), d)
        return [ctx.out(gnp.where(valid, r, _typed(0, d)), d)]
    if bits < 64:  # exact in float64: the floor of the quotient
        xf = cast(x, np.float64)
        _, _, r = _floor(xf / gnp.power(2.0, sc))
        r = cast(r, d)
    elif d.kind == "u":
        r = _shift_right_u64(x, sc)
    else:  # int64: (x + 2**63 as uint64) >> s, less 2**(63 - s), wrapped back
        u = cast(x, np.uint64) + np.uint64(1 << 63)
        v = _shift_right_u64(u, sc) - gnp.take(table, cast(63.0 - sc, np.int64))
        r = cast(v, np.int64)
    fill = gnp.where(gnp.less(x, _typed(0, d)), _typed(-1, d), _typed(0, d)) \
        if d.kind == "i" else _typed(0, d)
    return [ctx.out(gnp.where(valid, r, fill), d)]


@onnx_op("BitCast", 26)
def _bit_cast(ctx):
    """The bits of each value as another type of the same width: between the integer
    types (and from bool), where it is the two's complement wrap of a cast; the bits of
    floats are not reachable without a bit-level primitive."""
    src, dst = ctx.dtype(0), elem_dtype(ctx.attr("to"))
    if dst is None or src.itemsize != dst.itemsize or src.kind not in "iub" or \
            dst.kind not in "iub":
        raise ctx.unsupported(f"bit casts from {src} to {dst} (only between integer types "
                              f"of one width: geon has no bit-level primitive for floats)")
    x = ctx.tensor(0)
    if src == np.bool_:
        x = cast(x, np.uint8)
    if dst == np.bool_:
        return [ctx.out(gnp.not_equal(x, _typed(0, x.dtype)), dst)]
    return [ctx.out(cast(x, dst), dst)]
