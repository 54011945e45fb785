"""Special functions NumPy lacks, vectorised, for the reference evaluator and the NumPy
transformer (scipy is not a dependency)."""

import math

import numpy as np

#: Below this |x| the series is used, above it the continued fraction.
_ERF_SWITCH = 2.5
_TERMS = 60


def erf(x, out=None):
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
    from geon.errors import IndexOutOfRangeError
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
