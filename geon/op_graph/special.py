"""Special functions NumPy lacks, vectorised, for the reference evaluator and the NumPy
transformer (scipy is not a dependency)."""

import math

import numpy as np

from geon.errors import IndexOutOfRangeError

#: Below this |x| the series is used, above it the continued fraction.
_ERF_SWITCH = 2.5
_TERMS = 60


#: ``erf(x) / x`` as a rational function of ``u = x^2`` on ``|x| <= 4``: the
#: coefficients of ``P(u)`` and ``Q(u)``, lowest power first (fitted for this module by
#: least squares on the relative error, weighted iteratively; largest relative error
#: 9e-12 against the series below). Beyond 4, ``erf(x)`` rounds to +-1 in float32.
_ERF_P = (1.1283791670867798, 0.2001874346609207, 0.05809287190523902,
          0.0049545899146123725, 0.0005125052348547768, 2.1731709722596965e-05,
          7.520045580776816e-07, 3.006454845147184e-09)
_ERF_Q = (1.0, 0.5107448276574998, 0.1217317467016524, 0.017703168789757487,
          0.001713060861261714, 0.00011132992115139961, 4.50947065455503e-06,
          7.329021192647694e-08)
_ERF_CLAMP = 4.0


def erf(x, out=None):
    """The error function, elementwise: float32 and float16 inputs through a rational
    function (:func:`erf_rational`, within 1e-11 relative before rounding, so within one
    unit in the last place and almost always correctly rounded), others to about 1e-15
    relative in float64 (:func:`erf_series`)."""
    x = np.asarray(x)
    if x.dtype.kind == "f" and x.dtype.itemsize <= 4:
        return erf_rational(x, out)
    return erf_series(x, out)


def _horner(u, coefs):
    """``sum(c_k u^k)`` by Horner's rule, in place in one new array."""
    acc = np.multiply(u, coefs[-1])
    for c in coefs[-2:0:-1]:
        np.add(acc, c, out=acc)
        np.multiply(acc, u, out=acc)
    np.add(acc, coefs[0], out=acc)
    return acc


def erf_rational(x, out=None):
    """``erf(x)`` of a float32 (or float16) ``x``: ``x P(x^2) / Q(x^2)`` evaluated in
    float64 with ``x`` clipped to ``[-4, 4]`` (see ``_ERF_P``), then rounded once; NaN
    stays NaN, +-inf gives +-1. About 35 array operations, against the series's few
    hundred."""
    x = np.asarray(x)
    a = np.clip(x.reshape(-1), -_ERF_CLAMP, _ERF_CLAMP, dtype=np.float64)  # (1-d: no
    u = a * a                                       # NumPy scalars, which have no out=)
    p = _horner(u, _ERF_P)
    np.divide(p, _horner(u, _ERF_Q), out=p)
    np.multiply(p, a, out=p)
    p = p.reshape(x.shape)
    if out is None:
        return p.astype(x.dtype)
    np.copyto(out, p, casting="unsafe")
    return out


def erf_series(x, out=None):
    """The error function, elementwise, to about 1e-15 relative in float64.

    For ``|x| < 2.5``: ``erf(x) = 2/sqrt(pi) exp(-x^2) sum_n 2^n x^(2n+1) / (2n+1)!!``
    (all terms of one sign, so nothing cancels; 60 terms reach the last bit). Above:
    ``erfc(x) = exp(-x^2) / sqrt(pi) / (x + (1/2) / (x + 1 / (x + (3/2) / (x + ...))))``
    (Laplace's continued fraction, 60 levels evaluated from the bottom) and
    ``erf = 1 - erfc``. Float32 inputs are computed in float64 and rounded once.
    """
    x = np.asarray(x)
    xd = x.astype(np.float64)
    a = np.abs(xd)
    res = np.empty(xd.shape, np.float64)
    near = a < _ERF_SWITCH
    s = xd[near]
    s2 = s * s
    term, total = s.copy(), s.copy()
    for n in range(1, _TERMS):
        term *= 2.0 * s2 / (2 * n + 1)
        total += term
    res[near] = (2.0 / math.sqrt(math.pi)) * np.exp(-s2) * total
    far = ~near
    b = a[far]
    with np.errstate(all="ignore"):  # b = inf gives erfc = 0, as it should
        f = b.copy()
        for k in range(_TERMS, 0, -1):
            f = b + (0.5 * k) / f
        erfc = np.exp(-b * b) / (math.sqrt(math.pi) * f)
    res[far] = np.copysign(1.0 - erfc, xd[far])
    if out is None:
        return res.astype(x.dtype if x.dtype.kind == "f" else np.float64)
    np.copyto(out, res, casting="unsafe")
    return out


def checked_indices(idx, n, what):
    """``idx`` (integers) as int64 in ``[0, n)``: negative indices count from the end, as
    in NumPy; anything else out of range raises
    :class:`~geon.errors.IndexOutOfRangeError` naming ``what``."""
    idx = np.asarray(idx)
    if idx.dtype.kind not in "iu":
        raise IndexOutOfRangeError(f"{what}: indices must be integers, not {idx.dtype}")
    idx = idx.astype(np.int64, copy=False)
    if idx.size:
        lo, hi = int(idx.min()), int(idx.max())
        if lo < -n or hi >= n:
            bad = lo if lo < -n else hi
            raise IndexOutOfRangeError(f"{what}: index {bad} is out of range for an axis of "
                                       f"length {n}")
        if lo < 0:
            idx = np.where(idx < 0, idx + n, idx)
    return idx


def take(x, idx, what, out=None):
    """``x[:, idx]`` for ``x`` of shape ``(O, N, ...)`` and 1-D ``idx`` (checked)."""
    idx = checked_indices(idx, x.shape[1], what)
    return np.take(x, idx, axis=1, out=out)


def put_add(d, idx, out, what):
    """``out`` = zeros, then ``out[:, idx[j]] += d[:, j]`` for every ``j`` (repeated
    indices accumulate): ``d`` has shape ``(O, M, ...)``, ``out`` ``(O, N, ...)``.

    A segment sum over the indices in sorted order (one stable argsort and one
    ``np.add.reduceat``), much faster than ``np.add.at``."""
    idx = checked_indices(idx, out.shape[1], what)
    out.fill(0)
    if idx.size == 0:
        return out
    order = np.argsort(idx, kind="stable")
    s = idx[order]
    starts = np.flatnonzero(np.concatenate(([True], s[1:] != s[:-1])))
    out[:, s[starts]] = np.add.reduceat(d[:, order], starts, axis=1)
    return out


def sort_rows(x, values=None, indices=None):
    """A stable ascending sort along dimension 1 of ``x``, written into ``values`` and
    ``indices`` (either may be ``None``: not needed)."""
    idx = np.argsort(x, axis=1, kind="stable")
    if indices is not None:
        np.copyto(indices, idx)
    if values is not None:
        np.copyto(values, np.take_along_axis(x, idx, axis=1))


def sort_along(x, p, descending):
    """``(values, int64 positions)``: ``x`` sorted stably along dimension ``p``."""
    idx = np.argsort(-x if descending else x, axis=p, kind="stable")
    return np.take_along_axis(x, idx, axis=p), idx.astype(np.int64)


def align(value, axes, to_axes):
    """``value`` (laid out by ``axes``) transposed and expanded to broadcast against
    ``to_axes`` (which must contain every axis of ``axes``)."""
    value = np.asarray(value)
    names = axes.names
    present = [n for n in to_axes.names if n in names]
    if present != list(names):
        value = np.transpose(value, [names.index(n) for n in present])
    shape = [a.length if a.name in names else 1 for a in to_axes]
    return value.reshape(shape)


def op_site(op):
    """The op an index error names: the user's op and where it was built."""
    return f"{op.derived_from or type(op).__name__ + ' ' + op.name} ({op.file_info})"


def sigmoid_ce(x, t):
    """``softplus(x) - x t`` elementwise, as ``log1p(exp(-|x|)) + |x| w`` with ``w = 1 - t``
    where ``x > 0`` and ``t`` elsewhere; the product is 0 where ``w`` is, so an infinite
    logit with the matching target gives 0, not ``inf - inf``."""
    x, t = np.asarray(x), np.asarray(t)
    ax = np.abs(x)
    w = np.where(x > 0, 1 - t, t)
    part = np.zeros(np.broadcast_shapes(ax.shape, w.shape), np.result_type(ax, w))
    np.multiply(ax, w, out=part, where=w != 0)
    return np.log1p(np.exp(-ax)) + part
