"""Convolution and pooling arithmetic (output lengths, padding, window checks) and their
reference semantics as direct NumPy loops over kernel offsets in canonical layouts:
the numbers behind :mod:`geon.op_graph.conv`, which re-exports them."""

import numbers

import numpy as np

from geon.errors import AxisMismatchError
from geon.op_graph import nodes
from geon.op_graph import op_graph as og
from geon.op_graph.symbols import Sym, SymbolicLengthError


# --- arithmetic -----------------------------------------------------------------------------


def user_error(message, cls=AxisMismatchError):
    """``cls(message)`` ending with the user's source line (for errors raised before an
    op exists to carry it)."""
    return cls(f"{message} (at {nodes.DebugInfo().file_info})")


def out_length(length, kernel, stride, dilation, lo, hi):
    """The number of windows of a convolution or pooling along one axis."""
    return (length + lo + hi - dilation * (kernel - 1) - 1) // stride + 1


def _ints(value, n, what, minimum) -> tuple[int, ...]:
    """``value`` (an int or a sequence of ``n`` ints) as a tuple of ``n`` ints."""
    if isinstance(value, (numbers.Integral, np.integer)) and not isinstance(value, bool):
        value = (int(value),) * n
    value = tuple(value)
    if len(value) != n or any(isinstance(v, bool) or not isinstance(
            v, (numbers.Integral, np.integer)) or v < minimum for v in value):
        raise user_error(f"{what} must be an integer >= {minimum} or {n} of them, not "
                         f"{value!r}", ValueError)
    return tuple(int(v) for v in value)


def normalize_padding(padding, lengths, kernel, strides, dilation, what="padding"):
    """``padding`` as ``((lo, hi), ...)``, one pair per spatial axis.

    ``padding`` is an int (every side), one int per axis (both sides), one ``(lo, hi)``
    pair per axis, ``"valid"`` (none) or ``"same"`` (``ceil(L / stride)`` outputs, the
    odd element of padding on the high side).
    """
    n = len(lengths)
    if isinstance(padding, str):
        if padding == "valid":
            return ((0, 0),) * n
        if padding != "same":
            raise user_error(f"{what} must be 'same', 'valid', an int or a tuple, not "
                             f"{padding!r}", ValueError)
        pads = []
        for L, k, s, d in zip(lengths, kernel, strides, dilation):
            if isinstance(L, Sym) and s != 1:
                raise SymbolicLengthError(
                    f"{what} 'same' with stride {s} over a length {L!r}: its padding "
                    f"depends on the length's remainder modulo the stride, known only "
                    f"at a call (stride 1 pads {d * (k - 1)} whatever the length)")
            total = d * (k - 1) if s == 1 else \
                max((-(-L // s) - 1) * s + d * (k - 1) + 1 - L, 0)
            pads.append((total // 2, total - total // 2))
        return tuple(pads)
    if isinstance(padding, (numbers.Integral, np.integer)) and not isinstance(padding, bool):
        padding = (padding,) * n
    padding = tuple(padding)
    if len(padding) != n:
        raise user_error(f"{what} {padding!r} must have one entry per spatial axis ({n})",
                         ValueError)
    pads = []
    for p in padding:
        pair = tuple(p) if isinstance(p, (tuple, list)) else (p, p)
        if len(pair) != 2 or any(isinstance(v, bool) or not isinstance(
                v, (numbers.Integral, np.integer)) or v < 0 for v in pair):
            raise user_error(f"{what} {padding!r}: each entry is an int >= 0 or a pair "
                             f"(lo, hi) of them", ValueError)
        pads.append((int(pair[0]), int(pair[1])))
    return tuple(pads)


def _check_windows(op, lengths, kernel, strides, dilation, pads, out, labels=None):
    """Every spatial length gives at least one window, and ``out`` has that many.
    ``labels`` name the spatial axes in errors (default: their positions)."""
    for i, (L, k, s, d, (lo, hi)) in enumerate(zip(lengths, kernel, strides, dilation, pads)):
        n = out_length(L, k, s, d, lo, hi)
        label = labels[i] if labels else f"spatial dimension {i} of length {L!r}"
        if isinstance(n, Sym):
            try:
                fits = n >= 1
            except SymbolicLengthError:  # known at a call (specialize.check_needs)
                op.needs = getattr(op, "needs", ()) + (
                    (n - 1, f"windows of kernel {k}, stride {s}, dilation {d} and "
                            f"padding ({lo}, {hi}) over {label}"),)
                fits = True
        else:
            fits = n >= 1
        if not fits:
            raise og._mismatch(op, f"{label} (padding {lo}+{hi}) is shorter than the "
                                   f"dilated kernel ({d} * ({k} - 1) + 1)", op.args)
        if out is not None and out[i] != n:
            raise og._mismatch(op, f"{label}: kernel {k}, stride {s}, dilation {d}, "
                                   f"padding ({lo}, {hi}) give {n} outputs, not {out[i]}",
                               op.args)


def tap_slices(tap, out, strides, dilation):
    """The slices of a padded input that kernel offset ``tap`` reads for ``out`` windows."""
    return tuple(slice(t * d, t * d + (p - 1) * s + 1, s)
                 for t, p, s, d in zip(tap, out, strides, dilation))


def pool_counts(lengths, kernel, strides, pads):
    """The number of input (not padding) elements in each pooling window, ``(*P)``."""
    counts = None
    for L, k, s, (lo, hi) in zip(lengths, kernel, strides, pads):
        n = out_length(L, k, s, 1, lo, hi)
        start = np.arange(n) * s - lo
        c = np.minimum(start + k, L) - np.maximum(start, 0)
        counts = c if counts is None else np.multiply.outer(counts, c)
    return counts


# --- the reference semantics (direct loops over kernel offsets, canonical layouts) ------------

def _pad(x, pads, value=0):
    lead = x.ndim - len(pads)
    return np.pad(x, [(0, 0)] * lead + [tuple(p) for p in pads], constant_values=value)


def _taps(kernel):
    return list(np.ndindex(*kernel))


def reference_conv(x, w, P, strides, pads, dilation, groups):
    """:class:`Conv` on arrays x (B, C, *S), w (K, C/groups, *R): (B, K, *P)."""
    B = x.shape[0]
    K, Cg = w.shape[:2]
    G = groups
    xp = _pad(x, pads).reshape((B, G, Cg) + tuple(np.add(x.shape[2:], np.sum(pads, 1))))
    wg = w.reshape((G, K // G, Cg) + w.shape[2:])
    out = np.zeros((B, G, K // G) + tuple(P), np.result_type(x, w))
    for tap in _taps(w.shape[2:]):
        part = xp[(Ellipsis,) + tap_slices(tap, P, strides, dilation)]
        out += np.einsum("bgc...,gkc->bgk...", part, wg[(Ellipsis,) + tap])
    return out.reshape((B, K) + tuple(P))


def reference_conv_grad_data(dy, w, S, strides, pads, dilation, groups):
    """:class:`ConvGradData` on arrays dy (B, K, *P), w (K, C/groups, *R): (B, C, *S)."""
    B, K = dy.shape[:2]
    Cg = w.shape[1]
    G = groups
    P = dy.shape[2:]
    padded = tuple(n + lo + hi for n, (lo, hi) in zip(S, pads))
    xp = np.zeros((B, G, Cg) + padded, np.result_type(dy, w))
    dyg = dy.reshape((B, G, K // G) + P)
    wg = w.reshape((G, K // G, Cg) + w.shape[2:])
    for tap in _taps(w.shape[2:]):
        xp[(Ellipsis,) + tap_slices(tap, P, strides, dilation)] += np.einsum(
            "bgk...,gkc->bgc...", dyg, wg[(Ellipsis,) + tap])
    crop = tuple(slice(lo, lo + n) for n, (lo, _) in zip(S, pads))
    return xp[(Ellipsis,) + crop].reshape((B, G * Cg) + tuple(S))


def reference_conv_grad_filter(x, dy, R, strides, pads, dilation, groups):
    """:class:`ConvGradFilter` on arrays x (B, C, *S), dy (B, K, *P): (K, C/groups, *R)."""
    B, C = x.shape[:2]
    K = dy.shape[1]
    G = groups
    P = dy.shape[2:]
    xp = _pad(x, pads)
    xp = xp.reshape((B, G, C // G) + xp.shape[2:])
    dyg = dy.reshape((B, G, K // G) + P)
    out = np.zeros((G, K // G, C // G) + tuple(R), np.result_type(x, dy))
    for tap in _taps(R):
        part = xp[(Ellipsis,) + tap_slices(tap, P, strides, dilation)]
        out[(Ellipsis,) + tap] = np.einsum("bgcp,bgkp->gkc", part.reshape(B, G, C // G, -1),
                                           dyg.reshape(B, G, K // G, -1))
    return out.reshape((K, C // G) + tuple(R))


def _lowest(dtype):
    dtype = np.dtype(dtype)
    return -np.inf if dtype.kind == "f" else np.iinfo(dtype).min


def _first_max(x, kernel, P, strides, pads, dilation):
    """The index (in kernel order) of the first maximum of each window, (..., *P)."""
    xp = _pad(x, pads, _lowest(x.dtype))
    stack = np.stack([xp[(Ellipsis,) + tap_slices(t, P, strides, dilation)]
                      for t in _taps(kernel)])
    return np.argmax(stack, axis=0)


def reference_max_pool(x, kernel, P, strides, pads, dilation):
    """:class:`MaxPool` on an array (..., *S): (..., *P)."""
    xp = _pad(x, pads, _lowest(x.dtype))
    return np.max(np.stack([xp[(Ellipsis,) + tap_slices(t, P, strides, dilation)]
                            for t in _taps(kernel)]), axis=0)


def reference_max_pool_grad(x, dy, kernel, strides, pads, dilation):
    """:class:`MaxPoolGrad`: dy (..., *P) added at each window's first maximum of x."""
    P = dy.shape[x.ndim - len(kernel):]
    idx = _first_max(x, kernel, P, strides, pads, dilation)
    xp = np.zeros(_pad(x, pads).shape, dy.dtype)
    for i, t in enumerate(_taps(kernel)):
        xp[(Ellipsis,) + tap_slices(t, P, strides, dilation)] += np.where(idx == i, dy, 0)
    crop = tuple(slice(lo, lo + n) for n, (lo, _) in zip(x.shape[x.ndim - len(kernel):], pads))
    return xp[(Ellipsis,) + crop]


def reference_max_pool_gather(x, v, kernel, P, strides, pads, dilation):
    """:class:`MaxPoolGather`: v (x's shape) at each window's first maximum of x."""
    idx = _first_max(x, kernel, P, strides, pads, dilation)
    vp = _pad(v, pads)
    stack = np.stack([vp[(Ellipsis,) + tap_slices(t, P, strides, dilation)]
                      for t in _taps(kernel)])
    return np.take_along_axis(stack, idx[None], axis=0)[0]


def _to(value, axes, order):
    """``value`` laid out by ``axes`` transposed to the names of ``order``."""
    names = axes.names
    return np.transpose(value, [names.index(a.name) for a in order])
