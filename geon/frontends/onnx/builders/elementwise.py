"""Elementwise builders: activations, arithmetic, comparisons and logic, rounding,
the (inverse) trigonometric and hyperbolic functions, remainders."""

import numpy as np

import geon as be
from geon.frontends.onnx.builders.base import (_empty_elementwise, _float, _norm_axis, _same,
                                               _unary, cast, is_float, onnx_op)
from geon.frontends.onnx.loading import InvalidOnnxModel, element_count
from geon.op_graph import op_graph as og

gnp = be.np


_unary("Neg", gnp.negative, floating=False)
_unary("Abs", gnp.absolute, floating=False)
_unary("Sign", gnp.sign, floating=False)
_unary("Sqrt", gnp.sqrt)
_unary("Exp", gnp.exp)
_unary("Log", gnp.log)
_unary("Tanh", gnp.tanh)
_unary("Sin", gnp.sin)
_unary("Cos", gnp.cos)
_unary("Reciprocal", gnp.reciprocal)
_unary("Sigmoid", be.sigmoid)
_unary("Relu", gnp.relu, floating=False)
_unary("Erf", gnp.erf)
_unary("Softplus", gnp.softplus)


@onnx_op("LeakyRelu")
def _leaky_relu(ctx):
    return [_same(ctx, gnp.leaky_relu(_float(ctx), ctx.attr("alpha", 0.01)))]


def _elu(x, alpha):
    return gnp.where(x > 0, x, gnp.expm1(x) * alpha)


@onnx_op("Elu")
def _elu_op(ctx):
    return [_same(ctx, _elu(_float(ctx), ctx.attr("alpha", 1.0)))]


@onnx_op("Selu")
def _selu(ctx):
    alpha = ctx.attr("alpha", 1.67326319217681884765625)
    gamma = ctx.attr("gamma", 1.05070102214813232421875)
    return [_same(ctx, _elu(_float(ctx), alpha) * gamma)]


@onnx_op("Gelu", 20)
def _gelu(ctx):
    approx = ctx.attr("approximate", "none")
    if approx not in ("none", "tanh"):
        raise ctx.unsupported(f"approximate={approx!r}")
    return [_same(ctx, gnp.gelu(_float(ctx), approximate=approx))]


@onnx_op("HardSigmoid")
def _hard_sigmoid(ctx):
    alpha, beta = ctx.attr("alpha", 0.2), ctx.attr("beta", 0.5)
    return [_same(ctx, gnp.clip(_float(ctx) * alpha + beta, 0.0, 1.0))]


@onnx_op("Clip", 6, 10)
def _clip_attr(ctx):
    lo, hi = ctx.attr("min", -3.4028234663852886e38), ctx.attr("max", 3.4028234663852886e38)
    return [_same(ctx, gnp.clip(_float(ctx), lo, hi))]


@onnx_op("Clip", 11)
def _clip(ctx):
    x = ctx.tensor(0)
    lo = ctx.tensor(1) if ctx.has(1) else None
    hi = ctx.tensor(2) if ctx.has(2) else None
    if lo is None and hi is None:
        return [ctx.out(x, ctx.dtype(0))]
    return [_same(ctx, gnp.clip(x, lo, hi))]


def _binary(op_type, fn, since=7):
    @onnx_op(op_type, since)
    def build(ctx):
        empty = _empty_elementwise(ctx)
        if empty is not None:
            return empty
        return [_same(ctx, fn(ctx.tensor(0), ctx.tensor(1)))]
    build.__name__ = f"build_{op_type}"


_binary("Add", gnp.add)
_binary("Sub", gnp.subtract)
_binary("Mul", gnp.multiply)
_binary("Pow", gnp.power)


@onnx_op("Div", 7)
def _div(ctx):
    empty = _empty_elementwise(ctx)
    if empty is not None:
        return empty
    a, b = ctx.tensor(0), ctx.tensor(1)
    # Integers: the float quotient cast back truncates toward zero, ONNX's (C's) rule.
    return [_same(ctx, gnp.divide(a, b))]


def _compare(op_type, fn, since=7):
    @onnx_op(op_type, since)
    def build(ctx):
        empty = _empty_elementwise(ctx, np.bool_)
        if empty is not None:
            return empty
        return [ctx.out(fn(ctx.tensor(0), ctx.tensor(1)), np.bool_)]
    build.__name__ = f"build_{op_type}"


_compare("Equal", gnp.equal)
_compare("Less", gnp.less)
_compare("LessOrEqual", gnp.less_equal, 12)
_compare("Greater", gnp.greater)
_compare("GreaterOrEqual", gnp.greater_equal, 12)


def _bool_in(ctx, i):
    if ctx.dtype(i) != np.bool_:
        raise ctx.unsupported(f"input {i} must be bool, not {ctx.dtype(i)}")
    return ctx.tensor(i)


@onnx_op("Not")
def _not(ctx):
    return [ctx.out(1.0 - _bool_in(ctx, 0), np.bool_)]


@onnx_op("And", 7)
def _and(ctx):
    return [ctx.out(_bool_in(ctx, 0) * _bool_in(ctx, 1), np.bool_)]


@onnx_op("Or", 7)
def _or(ctx):
    return [ctx.out(gnp.maximum(_bool_in(ctx, 0), _bool_in(ctx, 1)), np.bool_)]


@onnx_op("Xor", 7)
def _xor(ctx):
    return [ctx.out(gnp.not_equal(_bool_in(ctx, 0), _bool_in(ctx, 1)), np.bool_)]


@onnx_op("Where", 9)
def _where(ctx):
    r = gnp.where(ctx.tensor(0), ctx.tensor(1), ctx.tensor(2))
    return [_same(ctx, r, 1)]


def _variadic(op_type, fn, mean=False, since=8):
    @onnx_op(op_type, since)
    def build(ctx):
        xs = [ctx.tensor(i) for i in range(ctx.n_inputs()) if ctx.has(i)]
        if not xs:
            raise ctx.unsupported("no inputs")
        r = xs[0]
        for x in xs[1:]:
            r = fn(r, x)
        if mean:
            r = r / float(len(xs))
        return [_same(ctx, r)]
    build.__name__ = f"build_{op_type}"


_variadic("Max", gnp.maximum)
_variadic("Min", gnp.minimum)
_variadic("Sum", gnp.add)
_variadic("Mean", gnp.add, mean=True)


@onnx_op("ThresholdedRelu", 10)
def _thresholded_relu(ctx):
    x = _float(ctx)
    return [_same(ctx, gnp.where(x > ctx.attr("alpha", 1.0), x, 0.0))]


# --- activations --------------------------------------------------------------------------

def _wide16(x):
    """``x`` in float32 if it is float16: the activations compute float16 values in
    float32, and the builder rounds the result back once."""
    return cast(x, np.float32) if x.dtype == np.float16 else x


def _f32(fn):
    return lambda x: fn(_wide16(x))


_unary("HardSwish", _f32(lambda x: x * gnp.clip(x * (1.0 / 6.0) + 0.5, 0.0, 1.0)), since=14)
_unary("Mish", _f32(lambda x: x * gnp.tanh(gnp.softplus(x))), since=18)
_unary("Softsign", _f32(lambda x: x / (gnp.absolute(x) + 1.0)))


@onnx_op("Celu", 12)
def _celu(ctx):
    x = _wide16(_float(ctx))
    alpha = ctx.attr("alpha", 1.0)
    # The negative branch of x where x <= 0 (else 0), so that a large x never overflows
    # exp, and -0.0 stays -0.0.
    pos = x > 0
    neg = gnp.expm1(gnp.where(pos, 0.0, x) / alpha) * alpha
    return [_same(ctx, gnp.where(pos, x, neg))]


@onnx_op("Swish", 24)
def _swish(ctx):
    x = _wide16(_float(ctx))
    alpha = ctx.attr("alpha", 1.0)
    ax = x * alpha if alpha != 1.0 else x
    # Far below 0, sigmoid(ax) is exp(ax) to float64's precision: x * exp(ax) gives -0.0
    # (NaN for -inf) as the formula does, where a clamped sigmoid would leave x * tiny.
    far = gnp.less(ax, -50.0)
    tail = x * gnp.exp(gnp.where(far, ax, 0.0))
    return [_same(ctx, gnp.where(far, tail, x * be.sigmoid(ax)))]


@onnx_op("Shrink", 9)
def _shrink(ctx):
    empty = _empty_elementwise(ctx)
    if empty is not None:
        return empty
    lambd, bias = ctx.attr("lambd", 0.5), ctx.attr("bias", 0.0)
    x = ctx.tensor(0)
    if not is_float(ctx.dtype(0)):  # integers as the reference: in float64, truncated
        x = cast(x, np.float64)
    r = gnp.where(x < -lambd, x + bias, gnp.where(x > lambd, x - bias, 0.0))
    return [_same(ctx, r)]


@onnx_op("PRelu", 6)
def _prelu(ctx):
    x, slope = ctx.tensor(0), ctx.tensor(1)
    return [_same(ctx, gnp.where(x < 0, x * slope, x))]


def _hardmax_along(x, axis):
    is_max = gnp.equal(x, gnp.max(x, axis, keepdims=True))         # 1.0 / 0.0
    return is_max * gnp.equal(gnp.cumsum(is_max, axis), 1.0)       # ties: the first


@onnx_op("Hardmax", 1, 12)
def _hardmax_old(ctx):  # the input is coerced to 2-D at `axis`
    x = _float(ctx)
    shape = ctx.shape(0)
    axis = _norm_axis(ctx, ctx.attr("axis", 1), len(shape))
    flat = gnp.reshape(x, (element_count(shape[:axis]), element_count(shape[axis:])))
    return [_same(ctx, gnp.reshape(_hardmax_along(flat, 1), shape))]


@onnx_op("Hardmax", 13)
def _hardmax(ctx):
    x = _float(ctx)
    axis = _norm_axis(ctx, ctx.attr("axis", -1), len(ctx.shape(0)))
    return [_same(ctx, _hardmax_along(x, axis))]


# --- NaN and infinities -------------------------------------------------------------------

@onnx_op("IsNaN", 9)
def _isnan(ctx):
    empty = _empty_elementwise(ctx, np.bool_)
    if empty is not None:
        return empty
    x = _float(ctx)
    return [ctx.out(gnp.not_equal(x, x), np.bool_)]  # NaN is the one value unequal to itself


@onnx_op("IsInf", 10)
def _isinf(ctx):
    empty = _empty_elementwise(ctx, np.bool_)
    if empty is not None:
        return empty
    x = _float(ctx)
    pos, neg = ctx.attr("detect_positive", 1), ctx.attr("detect_negative", 1)
    if pos and neg:
        r = gnp.equal(gnp.absolute(x), np.inf)
    elif pos:
        r = gnp.equal(x, np.inf)
    elif neg:
        r = gnp.equal(x, -np.inf)
    else:
        return [ctx.known(np.zeros(ctx.shape(0), np.bool_))]
    return [ctx.out(r, np.bool_)]


# --- rounding -----------------------------------------------------------------------------

def _integral_from(x):
    """The float magnitude from which every value of ``x``'s type is an integer."""
    return float(2.0 ** (np.finfo(x.dtype).nmant))


def _trunc_small(x, big):
    """``(small, t)``: ``x`` where ``|x| < big`` (else 0, so that NaN and infinities never
    reach the conversion), and its truncation toward zero, as floats of ``x``'s type
    (through int64, exact below ``big``)."""
    inside = gnp.less(gnp.absolute(x), big)
    small = gnp.where(inside, x, 0.0)
    return inside, small, cast(cast(small, np.int64), x.dtype)


def _finish_rounding(x, inside, small, r):
    """``r`` (an integer value of ``small``) where ``|x| < big``, else ``x`` itself (NaN,
    infinities and the large values are integers already); a zero result takes the sign
    of ``x`` (``floor(-0.0)`` and ``ceil(-0.5)`` are ``-0.0``, as IEEE rounds). Rounding
    has the derivative 0."""
    r = gnp.where(gnp.equal(r, 0.0), small * 0.0, r)
    return og.StopGradient(gnp.where(inside, r, x))


def _floor(x):
    big = _integral_from(x)
    inside, small, t = _trunc_small(x, big)
    return inside, small, t - gnp.greater(t, small)


@onnx_op("Floor", 6)
def _floor_op(ctx):
    x = _float(ctx)
    inside, small, r = _floor(x)
    return [_same(ctx, _finish_rounding(x, inside, small, r))]


@onnx_op("Ceil", 6)
def _ceil_op(ctx):
    x = _float(ctx)
    inside, small, t = _trunc_small(x, _integral_from(x))
    return [_same(ctx, _finish_rounding(x, inside, small, t + gnp.less(t, small)))]


def _round_even(x):
    """``(inside, small, r)`` as ``_floor`` gives them, ``r`` rounded half to even: the
    floor, plus one above the half, and at the half when the floor is odd (``x -
    floor(x)`` is exact below ``big``)."""
    inside, small, f = _floor(x)
    frac = small - f
    _, _, half = _trunc_small(f * 0.5, _integral_from(x))
    odd = gnp.not_equal(half * 2.0, f)
    return inside, small, f + (gnp.greater(frac, 0.5) + gnp.equal(frac, 0.5) * odd)


@onnx_op("Round", 11)
def _round_op(ctx):
    x = _float(ctx)
    return [_same(ctx, _finish_rounding(x, *_round_even(x)))]


# --- hyperbolic and inverse trigonometric functions ---------------------------------------
# Computed in float64 for the narrower types (float32, float16, bfloat16), in which the
# formulas below are accurate to well under their rounding; each avoids the cancellation
# of its textbook form (log(1 + a) for a small a goes through an accurate log1p).

def _wide(ctx):
    x = _float(ctx)
    return cast(x, np.float64) if x.dtype != np.float64 else x


def _log1p(a):
    """``log(1 + a)`` accurate for small ``a``: ``log(u) * a / (u - 1)`` with ``u = 1 + a``
    rounded (the rounding error of ``u`` cancels), ``a`` itself where ``u == 1``."""
    u = a + 1.0
    exact = gnp.equal(u, 1.0)
    d = gnp.where(exact, 1.0, u - 1.0)
    return gnp.where(exact, a, gnp.log(u) * (a / d))


def _hyperbolic(op_type, fn, since):
    @onnx_op(op_type, since)
    def build(ctx):
        empty = _empty_elementwise(ctx)
        if empty is not None:
            return empty
        return [_same(ctx, fn(_wide(ctx)))]
    build.__name__ = f"build_{op_type}"


#: Where sinh and cosh overflow float64: ln(2 * the largest float64).
_HYPERBOLIC_OVERFLOW = 710.4758600739439


def _exp_half(a):
    """``exp(a) / 2`` for ``a >= 20`` (where ``exp(-a)`` no longer counts), infinity past
    float64's range without computing an overflow."""
    big = gnp.greater(a, _HYPERBOLIC_OVERFLOW)
    h = gnp.exp(gnp.minimum(a, _HYPERBOLIC_OVERFLOW) * 0.5)   # exp(a/2)^2 / 2: no
    return gnp.where(big, np.inf, (h * 0.5) * h)               # overflow before the result


def _odd(x, g):
    """The odd function whose values for ``a >= 0`` are ``g(a)``: ``g(x)`` for ``x >= 0``,
    ``-g(-x)`` below (each branch from a clamped argument, so that neither computes
    outside its domain); ``x`` itself where the result is 0 (``-0.0`` stays ``-0.0``,
    and the derivative at 0 is 1, as for every function built with it)."""
    neg = gnp.less(x, 0.0)
    r = gnp.where(neg, -g(gnp.where(neg, -x, 0.0)), g(gnp.where(neg, 0.0, x)))
    return gnp.where(gnp.equal(r, 0.0), x, r)


def _sinh(x):
    def g(a):
        e = gnp.expm1(gnp.minimum(a, 20.0))       # exp(a) - 1, exact for small a
        # sinh(a) = (e^a - e^-a) / 2 = (e + e / (e + 1)) / 2
        return gnp.where(gnp.less(a, 20.0), (e + e / (e + 1.0)) * 0.5, _exp_half(a))
    return _odd(x, g)


def _cosh(x):
    a = gnp.absolute(x)
    e = gnp.exp(gnp.minimum(a, 20.0))
    return gnp.where(gnp.less(a, 20.0), (e + 1.0 / e) * 0.5, _exp_half(a))


def _asinh(x):
    def g(a):
        huge = gnp.greater(a, np.float64(1e150))  # a * a would overflow: log(2a)
        s = gnp.where(huge, 1.0, a)
        near = _log1p(s + s * s / (gnp.sqrt(s * s + 1.0) + 1.0))
        far = gnp.log(gnp.where(huge, a, 1.0)) + float(np.log(2.0))
        return gnp.where(huge, far, near)
    return _odd(x, g)


def _acosh(x):
    # acosh(1 + t) = log1p(t + sqrt(2t + t^2)); NaN below 1
    huge = gnp.greater(x, np.float64(1e150))
    ts = gnp.where(huge + gnp.less(x, 1.0) > 0, 0.0, x - 1.0)
    near = _log1p(ts + gnp.sqrt(ts * (ts + 2.0)))
    far = gnp.log(gnp.where(huge, x, 1.0)) + float(np.log(2.0))
    return gnp.where(gnp.less(x, 1.0), np.nan, gnp.where(huge, far, near))


def _atanh(x):
    # atanh(a) = log1p(2a / (1 - a)) / 2; +inf at 1, NaN beyond
    def g(a):
        s = gnp.where(gnp.greater_equal(a, 1.0), 0.0, a)
        r = _log1p(2.0 * s / (1.0 - s)) * 0.5
        return gnp.where(gnp.equal(a, 1.0), np.inf, gnp.where(gnp.greater(a, 1.0), np.nan, r))
    return _odd(x, g)


def _atan_unit(z):
    """``atan(z)`` for ``0 <= z <= 1``: two halvings of the angle
    (``atan(z) = 2 atan(z / (1 + sqrt(1 + z^2)))``) bring ``z`` under ``tan(pi/16)``
    (0.199), where the Taylor series to ``z^27 / 27`` is exact to float64's precision
    (its next term is under 1e-19 of the result)."""
    for _ in range(2):
        z = z / (gnp.sqrt(z * z + 1.0) + 1.0)
    z2 = z * z
    acc = gnp.full(gnp.shape(z), 1.0 / 27, dtype=z.dtype)  # Horner, from the last term
    for k in range(25, 0, -2):
        acc = 1.0 / k - z2 * acc
    return z * acc * 4.0


def _atan_pos(a):
    """``atan(a)`` for ``a >= 0``: ``pi/2 - atan(1 / a)`` above 1 (0 for infinity)."""
    above = gnp.greater(a, 1.0)
    z = gnp.where(above, 1.0 / gnp.where(above, a, 1.0), a)
    t = _atan_unit(z)
    return gnp.where(above, float(np.pi / 2) - t, t)


def _atan(x):
    return _odd(x, _atan_pos)


def _asin(x):
    # asin(a) = atan(a / sqrt((1 - a)(1 + a))): pi/2 at 1, NaN beyond
    def g(a):
        s = gnp.where(gnp.greater(a, 1.0), 0.0, a)
        c = gnp.sqrt((1.0 - s) * (1.0 + s))
        edge = gnp.equal(c, 0.0)
        r = gnp.where(edge, float(np.pi / 2), _atan_pos(s / gnp.where(edge, 1.0, c)))
        return gnp.where(gnp.greater(a, 1.0), np.nan, r)
    return _odd(x, g)


def _acos(x):
    # acos(x) = 2 atan(sqrt((1 - x) / (1 + x))): exact near 1 (no pi/2 - asin(x)); pi at -1
    out = gnp.greater(gnp.absolute(x), 1.0)
    xs = gnp.where(out, 0.0, x)
    m1 = gnp.equal(xs, -1.0)
    q = gnp.sqrt((1.0 - xs) / gnp.where(m1, 1.0, 1.0 + xs))
    r = gnp.where(m1, float(np.pi), _atan_pos(q) * 2.0)
    return gnp.where(out, np.nan, r)


_hyperbolic("Sinh", _sinh, 9)
_hyperbolic("Cosh", _cosh, 9)
_hyperbolic("Tan", lambda x: gnp.sin(x) / gnp.cos(x), 7)
_hyperbolic("Asinh", _asinh, 9)
_hyperbolic("Acosh", _acosh, 9)
_hyperbolic("Atanh", _atanh, 9)
_hyperbolic("Atan", _atan, 7)
_hyperbolic("Asin", _asin, 7)
_hyperbolic("Acos", _acos, 7)


# --- remainders ---------------------------------------------------------------------------
# geon has no remainder op: the remainder is computed exactly from divisions, products and
# subtractions whose results are exact. Values known at import are computed by NumPy.

def _finite(x):
    return gnp.less(gnp.absolute(x), np.inf)   # false for NaN and the infinities


def _trunc64(q):
    """``trunc(q)`` of a float64 ``q`` with ``|q| < 2**62`` (through int64)."""
    return cast(cast(q, np.int64), np.float64)


def _float_fmod(a, b, chunks):
    """C's ``fmod(a, b)`` (the sign of ``a``) of float64 values of a narrower type (at
    most 24 significant bits), exactly. The magnitude is reduced by ``|b| * 2**(28 k)``
    for ``k = chunks - 1 .. 0``: each quotient is under ``2**29``, so its product with the
    divisor and the subtraction are exact in float64, and a quotient rounded up to the
    next integer leaves a negative remainder, which one divisor puts back."""
    fa, fb = _finite(a), _finite(b)
    ok = fa * fb * gnp.not_equal(b, 0.0)
    r = gnp.absolute(gnp.where(ok, a, 0.0))
    m = gnp.absolute(gnp.where(ok, b, 1.0))
    for k in range(chunks - 1, -1, -1):
        # (float64 constants: a Python float this large would pass through float32)
        c = m * np.float64(2.0 ** (28 * k))
        if k:  # a divisor scaled past float64's range takes nothing away
            big = gnp.greater(c, np.float64(1e300))
            c = gnp.where(big, np.float64(1e300), c)
        q = _trunc64(r / c)
        r = r - q * c
        r = gnp.where(gnp.less(r, 0.0), r + c, r)
        if k:
            r = gnp.where(big, gnp.where(gnp.less(r, 0.0), r + c, r), r)
    r = gnp.where(gnp.less(a, 0.0), -r, r)
    r = gnp.where(gnp.equal(r, 0.0), gnp.where(ok, a, 0.0) * 0.0, r)  # zero: a's sign
    # fmod(x, +-inf) is x; NaN for an infinite or NaN x, or a zero divisor
    r = gnp.where(fa * gnp.equal(gnp.absolute(b), np.inf), a, r)
    return gnp.where(ok + fa * gnp.equal(gnp.absolute(b), np.inf) > 0, r, np.nan)


def _int_fmod_small(a, b):
    """C's remainder of integers of up to 32 bits, computed in float64: the quotient of
    two such values is never rounded across an integer, so its truncation, the product
    and the difference are exact. A zero divisor gives 0."""
    af, bf = cast(a, np.float64), cast(b, np.float64)
    zero = gnp.equal(bf, 0.0)
    bs = gnp.where(zero, 1.0, bf)
    return gnp.where(zero, 0.0, af - _trunc64(af / bs) * bs)


def _int64_fmod(a, b):
    """C's remainder of int64 values: three refinements with a quotient from float64
    (each error shrinks the remainder by ~2**50; products and differences wrap around
    as int64 arithmetic does, exact for the true remainder which fits), then one
    correction to ``|r| < |b|`` with the sign of ``a``. A zero divisor gives 0."""
    zero = gnp.equal(b, 0)
    bs = gnp.where(zero, np.int64(1), b)
    bf = cast(bs, np.float64)
    r = a
    lim = float(2.0 ** 62)
    for _ in range(3):
        q = cast(r, np.float64) / bf
        q = gnp.where(gnp.greater(q, lim), lim, gnp.where(gnp.less(q, -lim), -lim, q))
        r = r - cast(q, np.int64) * bs
    mag = gnp.where(bs < 0, -bs, bs)
    pos = gnp.greater_equal(a, 0)
    neg = 1.0 - pos
    r = gnp.where(pos * gnp.less(r, 0), r + mag, r)
    r = gnp.where(pos * gnp.greater_equal(r, mag), r - mag, r)
    r = gnp.where(neg * gnp.greater(r, 0), r - mag, r)
    r = gnp.where(neg * gnp.less_equal(r, -mag), r + mag, r)
    return gnp.where(zero, np.int64(0), r)


def _uint64_mod(a, b):
    """The remainder of uint64 values: quotients from float64 shrunk by 2**-50 so that
    they never exceed the true one (no wrap-around), three times, then at most two
    subtractions of the divisor. A zero divisor gives 0."""
    zero = gnp.equal(b, 0)
    bs = gnp.where(zero, np.uint64(1), b)
    bf = cast(bs, np.float64)
    r = a
    for _ in range(3):
        q = cast(r, np.float64) / bf * (1.0 - 2.0 ** -50)
        r = r - cast(q, np.uint64) * bs
    for _ in range(2):
        r = gnp.where(gnp.greater_equal(r, bs), r - bs, r)
    return gnp.where(zero, np.uint64(0), r)


@onnx_op("Mod", 10)
def _mod(ctx):
    fmod = ctx.attr("fmod", 0)
    da, db = ctx.dtype(0), ctx.dtype(1)
    if ctx.all_known():  # shape arithmetic: NumPy, at import
        a, b = ctx.const(0), ctx.const(1)
        ctx.bound(np.broadcast_shapes(a.shape, b.shape), a.dtype, known=True)
        if b.dtype.kind in "iu" and np.any(b == 0):
            raise ctx.unsupported("Mod by zero")
        with np.errstate(all="ignore"):
            return [ctx.known(np.fmod(a, b) if fmod else np.mod(a, b))]
    empty = _empty_elementwise(ctx)
    if empty is not None:
        return empty
    if da != db:
        raise InvalidOnnxModel(f"{ctx.where}: operands of types {da} and {db}")
    a, b = ctx.tensor(0), ctx.tensor(1)
    if is_float(da):
        if da == np.float64:
            raise ctx.unsupported("Mod of float64 values computed at run time (geon has no "
                                  "remainder op; narrower floats are computed exactly in "
                                  "float64)")
        chunks = 2 if da == np.float16 else 10   # 2**40 / 2**277: the widest quotients
        a, b = cast(a, np.float64), cast(b, np.float64)
        r = _float_fmod(a, b, chunks)
    elif da == np.uint64:
        r = _uint64_mod(a, b)
    elif da == np.int64:
        r = _int64_fmod(a, b)
    else:
        r = _int_fmod_small(a, b)
    if not fmod and da.kind != "u":
        # The sign of the divisor: a nonzero remainder of the other sign gets one divisor
        # (x % inf is inf for a negative x); a zero one is -0.0 for a negative divisor.
        other = gnp.not_equal(r, 0) * gnp.not_equal(gnp.less(r, 0), gnp.less(b, 0))
        r = gnp.where(other, r + b, r)
        if is_float(da):
            r = gnp.where(gnp.equal(r, 0.0), gnp.where(gnp.less(b, 0.0), -0.0, 0.0), r)
    return [_same(ctx, r)]
