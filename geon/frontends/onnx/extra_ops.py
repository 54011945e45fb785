"""More of the default ONNX domain, registered in the same table as :mod:`.ops`.

These are the operators exporters emit beyond the core of :mod:`.ops` (``HardSwish``
of MobileNetV3, the ``ScatterND`` of index assignment, the ``IsNaN`` / ``Where`` of
PyTorch's masked attention), and the rest of the default domain that geon's existing
ops compute exactly: activations, rounding, the hyperbolic and inverse trigonometric
functions, the scatters and gathers, normalizations, one-hot, einsum and a few shape
ops. Each is built from NumPy-family ops (``be.np``), so it runs on every transformer
and, where the ONNX op is differentiable, ``be.deriv`` differentiates it.
"""

import re

import numpy as np

import geon as be
from geon.frontends.onnx.loading import InvalidOnnxModel, elem_dtype, elem_name, \
    element_count
from geon.frontends.onnx.ops import (_ACTS, _bound_windows, _ceil_pads, _empty_elementwise,
                                     _float, _initial, _norm_axis, _pads, _rnn_common,
                                     _rnn_outputs, _same, _slice_along, _unary,
                                     _window_attrs, carrier, cast, is_float, onnx_op)
from geon.op_graph import nn_ops
from geon.op_graph import op_graph as og
from geon.op_graph.axes import Axes
from geon.op_graph.coercion import PositionalAxis, temp_axis

gnp = be.np


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


# --- recurrence ---------------------------------------------------------------------------

@onnx_op("RNN", 7)
def _rnn(ctx):
    hidden, direction, dirs, acts, layout, x, seq, batch = _rnn_common(ctx, 1, ["Tanh"])
    W, R = ctx.tensor(1), ctx.tensor(2)
    per_dir = []
    for d in range(dirs):
        act = _ACTS[acts[d]]
        Wt, Rt = gnp.transpose(W[d]), gnp.transpose(R[d])      # (I, H), (H, H)
        xw = gnp.matmul(x, Wt)                                  # (seq, batch, H)
        if ctx.has(3):
            b = ctx.tensor(3)[d]
            xw = xw + (b[:hidden] + b[hidden:])
        h = _initial(ctx, 5, d, layout, batch, hidden, x.dtype)
        reverse = direction == "reverse" or d == 1
        steps = [None] * seq
        for t in (range(seq - 1, -1, -1) if reverse else range(seq)):
            h = act(xw[t] + gnp.matmul(h, Rt))
            steps[t] = h
        per_dir.append((steps, (h,)))
    return _rnn_outputs(ctx, per_dir, layout, 1)


# --- running products ---------------------------------------------------------------------

@onnx_op("CumProd", 26)
def _cumprod(ctx):
    """Running products by doubling: after the step of distance ``s`` each entry holds
    the product of the ``2s`` entries ending at it (log2(n) elementwise products)."""
    x = ctx.tensor(0)
    shape = ctx.shape(0)
    axis = _norm_axis(ctx, int(np.ravel(ctx.const(1))[0]), len(shape))
    n = shape[axis]
    if n == 0:
        return [ctx.value(0)]
    reverse, exclusive = bool(ctx.attr("reverse", 0)), bool(ctx.attr("exclusive", 0))
    if reverse:
        x = _slice_along(x, axis, None, None, -1)

    def ones(k):
        s = list(gnp.shape(x))
        s[axis] = k
        return gnp.ones(s, dtype=x.dtype)

    if exclusive:  # shifted by one: 1 first
        x = gnp.concatenate([ones(1), _slice_along(x, axis, 0, n - 1)], axis) if n > 1 \
            else ones(1)
    s = 1
    while s < n:
        x = x * gnp.concatenate([ones(s), _slice_along(x, axis, 0, n - s)], axis)
        s *= 2
    if reverse:
        x = _slice_along(x, axis, None, None, -1)
    return [_same(ctx, x)]


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


# --- einsum -------------------------------------------------------------------------------

def _einsum_terms(ctx, equation, shapes):
    """The letters of each operand and of the result, with ``...`` spelled out as
    letters of its own (upper-case private ones, right-aligned as NumPy broadcasts)."""
    eq = equation.replace(" ", "")
    if "->" in eq:
        lhs, rhs = eq.split("->")
    else:
        lhs, rhs = eq, None
    ins = lhs.split(",")
    if len(ins) != len(shapes):
        raise InvalidOnnxModel(f"{ctx.where}: equation {equation!r} for {len(shapes)} inputs")
    ell = max([len(s) - len(t.replace("...", "")) for t, s in zip(ins, shapes) if "..." in t],
              default=0)
    dots = "".join(chr(0x3b1 + k) for k in range(ell))   # Greek letters: never in an equation
    terms = []
    for t, s in zip(ins, shapes):
        if "..." in t:
            k = len(s) - len(t.replace("...", ""))
            t = t.replace("...", dots[ell - k:])
        if len(t) != len(s) or not re.fullmatch(r"[A-Za-z\u03b1-\u03c9]*", t):
            raise InvalidOnnxModel(f"{ctx.where}: term {t!r} of {equation!r} for shape {s}")
        terms.append(t)
    if rhs is None:
        once = sorted(c for c in set("".join(terms)) if "".join(terms).count(c) == 1
                      and c not in dots)
        rhs = dots + "".join(once)
    else:
        rhs = rhs.replace("...", dots)
    return terms, rhs


def _einsum_diagonal(x, term):
    """``x`` with the entries of each repeated letter of ``term`` on the diagonal only
    (the letter once, at its first place)."""
    while len(set(term)) < len(term):
        c = next(c for c in term if term.count(c) > 1)
        where = [j for j, t in enumerate(term) if t == c]
        shape = gnp.shape(x)
        rest = [j for j in range(len(term)) if j not in where]
        x = gnp.transpose(x, rest + where)
        d = shape[where[0]]
        x = gnp.reshape(x, tuple(shape[j] for j in rest) + (d ** len(where),))
        step = sum(d ** k for k in range(len(where)))
        x = gnp.take(x, gnp.constant(np.arange(d, dtype=np.int64) * step), len(rest))
        term = "".join(term[j] for j in rest) + c
    return x, term


def _einsum_pair(a, ta, b, tb, keep):
    """The product of ``a`` and ``b`` summed over the letters they share that ``keep``
    does not hold: one batched matrix product (floats) or a broadcast product and sum."""
    da = dict(zip(ta, gnp.shape(a)))
    db = dict(zip(tb, gnp.shape(b)))
    shared = [c for c in ta if c in tb]
    batch = [c for c in shared if c in keep]
    contract = [c for c in shared if c not in keep]
    left = [c for c in ta if c not in tb]
    right = [c for c in tb if c not in ta]
    for c in batch:  # ellipsis letters may broadcast
        if da[c] != db[c]:
            n = max(da[c], db[c])
            if da[c] == 1:
                a = gnp.broadcast_to(a, tuple(n if t == c else da[t] for t in ta))
                da[c] = n
            else:
                b = gnp.broadcast_to(b, tuple(n if t == c else db[t] for t in tb))
                db[c] = n
    if a.dtype.kind != "f" or b.dtype.kind != "f":
        out = batch + left + right
        ea = gnp.reshape(gnp.transpose(a, [ta.index(c) for c in batch + left + contract]),
                         tuple(da[c] for c in batch + left) + (1,) * len(right) +
                         tuple(da[c] for c in contract))
        eb = gnp.reshape(gnp.transpose(b, [tb.index(c) for c in batch + right + contract]),
                         tuple(db[c] for c in batch) + (1,) * len(left) +
                         tuple(db[c] for c in right + contract))
        r = ea * eb
        if contract:
            r = gnp.sum(r, tuple(range(len(out), len(out) + len(contract))))
        return r, "".join(out)
    nb = element_count([da[c] for c in batch])
    nl, nr = element_count([da[c] for c in left]), element_count([db[c] for c in right])
    nc = element_count([da[c] for c in contract])
    am = gnp.reshape(gnp.transpose(a, [ta.index(c) for c in batch + left + contract]),
                     (nb, nl, nc))
    bm = gnp.reshape(gnp.transpose(b, [tb.index(c) for c in batch + contract + right]),
                     (nb, nc, nr))
    r = gnp.matmul(am, bm)
    out = batch + left + right
    return gnp.reshape(r, tuple(da[c] for c in batch + left) + tuple(db[c] for c in right)), \
        "".join(out)


@onnx_op("Einsum", 12)
def _einsum(ctx):
    equation = ctx.attr("equation")
    if not equation:
        raise InvalidOnnxModel(f"{ctx.where}: no equation")
    n = ctx.n_inputs()
    shapes = [ctx.shape(i) for i in range(n)]
    terms, rhs = _einsum_terms(ctx, equation, shapes)
    if len(set(rhs)) != len(rhs) or any(c not in "".join(terms) for c in rhs):
        raise InvalidOnnxModel(f"{ctx.where}: output {rhs!r} of {equation!r}")
    if any(0 in s for s in shapes):
        raise ctx.unsupported("operands with no elements")
    ops = []
    for i, t in enumerate(terms):
        x = ctx.tensor(i)
        if not is_float(ctx.dtype(i)) and ctx.dtype(i).kind not in "iu":
            raise ctx.unsupported(f"input {i} of type {ctx.dtype(i)}")
        x, t = _einsum_diagonal(x, t)
        ops.append((x, t))
    # Letters no other operand and not the result need are summed out first.
    for k, (x, t) in enumerate(ops):
        others = rhs + "".join(u for j, (_, u) in enumerate(ops) if j != k)
        alone = [j for j, c in enumerate(t) if c not in others]
        if alone:
            x = gnp.sum(x, tuple(alone))
            t = "".join(c for c in t if c in others)
        ops[k] = (x, t)
    x, t = ops[0]
    for k in range(1, len(ops)):
        y, u = ops[k]
        keep = rhs + "".join(v for _, v in ops[k + 1:])
        x, t = _einsum_pair(x, t, y, u, keep)
    if set(t) != set(rhs):  # a single operand's letters the result drops
        drop = tuple(j for j, c in enumerate(t) if c not in rhs)
        x = gnp.sum(x, drop) if drop else x
        t = "".join(c for c in t if c in rhs)
    if t != rhs:
        x = gnp.transpose(x, [t.index(c) for c in rhs])
    return [_same(ctx, x)]


# --- determinants -------------------------------------------------------------------------

@onnx_op("Det", 11)
def _det(ctx):
    """The determinant of matrices up to 3 x 3, by its expansion (geon has no LU
    factorization: larger ones are refused)."""
    x = _float(ctx)
    shape = ctx.shape(0)
    if len(shape) < 2 or shape[-1] != shape[-2]:
        raise InvalidOnnxModel(f"{ctx.where}: input {shape} is not a (batch of) square "
                               f"matrices")
    n = shape[-1]
    if n > 3:
        raise ctx.unsupported(f"{n} x {n} matrices (geon has no LU factorization; up to "
                              f"3 x 3 are computed by their expansion)")

    def e(i, j):
        return x[..., i, j]

    if n == 1:
        r = e(0, 0)
    elif n == 2:
        r = e(0, 0) * e(1, 1) - e(0, 1) * e(1, 0)
    else:
        r = (e(0, 0) * (e(1, 1) * e(2, 2) - e(1, 2) * e(2, 1))
             - e(0, 1) * (e(1, 0) * e(2, 2) - e(1, 2) * e(2, 0))
             + e(0, 2) * (e(1, 0) * e(2, 1) - e(1, 1) * e(2, 0)))
    return [_same(ctx, r)]




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
    from geon.frontends.onnx.loading import narrow_format
    from geon.frontends.onnx.ops import to_narrow
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
    from geon.frontends.onnx.loading import narrow_format
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
