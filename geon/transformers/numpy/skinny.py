"""Matrix products with a short side (2 to :data:`MAX_SHORT` rows or columns) in C.

A product of a large matrix with a few vectors (a linear layer at batch 2 to 16, a
convolution's im2col product over the few positions of a late stage) is bound by
reading the large matrix once. OpenBLAS's ``sgemm`` read it at about 5 GB/s in such
shapes on a 2-core AMD EPYC (x (8, 4,608) @ W.T, W 512 x 4,608 float32, out of cache:
1.86 ms), a third of what one core streams (its ``sgemv``, one vector, reached 15 GB/s).
Here one C loop streams each row of the large matrix once and multiplies it with every
short row, three rows of the large matrix and four short rows at a time in vector
registers (GCC's vector extension), the short rows staying in cache: 1.28 ms at 8 rows,
0.86 ms at 2 (against 1.67 ms).

The kernel computes ``out[s, m] = sum_k x[s, k] * w[m, k]`` for ``S`` short rows ``x``
and ``M`` rows ``w``, both with unit stride along ``k``, and any strides of ``out``; so
``a (S, K) @ b (K, M)`` is it with ``w = b.T`` where ``b`` is a transposed row-major
matrix (a weight ``W.T``), and ``a (M, K) @ b (K, S)`` with ``w = a`` and ``x = b.T``
(copied where it is not contiguous: a few rows). Sums run in the data's type, in
another order than the BLAS's, with fused multiply-adds as the BLAS's. Other dtypes and
layouts, and machines where the library does not build (see
:func:`geon.transformers.numpy.compiled.fixed_library`), run ``np.matmul``.
"""

import ctypes

import numpy as np

from geon.transformers.numpy import compiled, toolchain

#: The longest short side the kernel takes.
MAX_SHORT = 16
#: The kernel is used where the large operand has at least this many bytes: smaller
#: ones stay in cache, where the BLAS's own blocking is as fast.
MIN_BYTES = 1 << 18

_TEMPLATE = toolchain.VECTOR32 + r"""
static inline REAL geon_hsum_SUF(vr_SUF v) {
    REAL s = 0;
    for (int i = 0; i < VL_SUF; i++)
        s += v[i];
    return s;
}

/* out[s*os + m*om] = sum_k x[s*ldx + k] * w[m*ldw + k], for s < S and m0 <= m < m1;
   geo: S, M, K, ldx, ldw, os, om. Three rows of w and four of x at a time: twelve
   vector sums in registers, contracted to fused multiply-adds as a BLAS does. */
__attribute__((optimize("fp-contract=fast")))
void geon_skinny_SUF(const REAL *x, const REAL *w, REAL *out, const int64_t *geo,
                     int64_t m0, int64_t m1) {
    const int64_t S = geo[0], K = geo[2], ldx = geo[3], ldw = geo[4];
    const int64_t os = geo[5], om = geo[6];
    const int64_t kv = K - K % VL_SUF;
    for (int64_t m = m0; m < m1; m += 3) {
        const REAL *w0 = w + m * ldw;
        const REAL *w1 = w + (m + 1 < m1 ? m + 1 : m) * ldw;  /* past the end: row m */
        const REAL *w2 = w + (m + 2 < m1 ? m + 2 : m) * ldw;  /* again, not stored */
        for (int64_t s = 0; s < S; s += 4) {
            const REAL *x0 = x + s * ldx;
            const REAL *x1 = x + (s + 1 < S ? s + 1 : s) * ldx;
            const REAL *x2 = x + (s + 2 < S ? s + 2 : s) * ldx;
            const REAL *x3 = x + (s + 3 < S ? s + 3 : s) * ldx;
            vr_SUF c00 = {0}, c01 = {0}, c02 = {0}, c10 = {0}, c11 = {0}, c12 = {0};
            vr_SUF c20 = {0}, c21 = {0}, c22 = {0}, c30 = {0}, c31 = {0}, c32 = {0};
            for (int64_t k = 0; k < kv; k += VL_SUF) {
                vr_SUF b0 = load_SUF(w0 + k), b1 = load_SUF(w1 + k);
                vr_SUF b2 = load_SUF(w2 + k), u;
                u = load_SUF(x0 + k); c00 += u * b0; c01 += u * b1; c02 += u * b2;
                u = load_SUF(x1 + k); c10 += u * b0; c11 += u * b1; c12 += u * b2;
                u = load_SUF(x2 + k); c20 += u * b0; c21 += u * b1; c22 += u * b2;
                u = load_SUF(x3 + k); c30 += u * b0; c31 += u * b1; c32 += u * b2;
            }
            const REAL *xs[4] = {x0, x1, x2, x3}, *wr[3] = {w0, w1, w2};
            vr_SUF acc[4][3] = {{c00, c01, c02}, {c10, c11, c12}, {c20, c21, c22},
                                   {c30, c31, c32}};
            for (int i = 0; i < 4 && s + i < S; i++)
                for (int r = 0; r < 3 && m + r < m1; r++) {
                    REAL t = geon_hsum_SUF(acc[i][r]);
                    for (int64_t k = kv; k < K; k++)
                        t += xs[i][k] * wr[r][k];
                    out[(s + i) * os + (m + r) * om] = t;
                }
        }
    }
}
"""

_TYPES = {np.dtype(np.float32): ("float", "f32"), np.dtype(np.float64): ("double", "f64")}
_SYMBOLS = [f"geon_skinny_{s}" for _, s in _TYPES.values()]


def source():
    """The C source of the kernels, for float32 and float64."""
    return "#include <stdint.h>\n" + "\n".join(
        _TEMPLATE.replace("REAL", real).replace("_SUF", "_" + suffix)
        for real, suffix in _TYPES.values())


def _bind(lib):
    fns = {}
    for dtype, (_, suffix) in _TYPES.items():
        f = getattr(lib, f"geon_skinny_{suffix}")
        f.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 2
        f.restype = None
        fns[dtype] = f
    return fns


_loaded = {}  # (CC, cache folder) -> {dtype: ctypes function}, or None


def kernels():
    """``{dtype: ctypes function}``, or None where the compiled path is off or cannot
    run here."""
    return compiled.fixed_library(_loaded, "short-side product kernels", source,
                                  _SYMBOLS, _bind)


def worth_it(a_shape, b_shape, dtype):
    """Whether a 2-D product of these static shapes goes to :func:`matmul` (a short
    side of 2 to MAX_SHORT, a large operand of at least MIN_BYTES, float32 or
    float64)."""
    (m, k), (_, n) = a_shape, b_shape
    short, long_ = (m, n) if m <= n else (n, m)
    return np.dtype(dtype) in _TYPES and 2 <= short <= MAX_SHORT and \
        long_ * k * np.dtype(dtype).itemsize >= MIN_BYTES


def _unit_rows(a):
    """Whether the rows of 2-D ``a`` have unit stride (rows may be apart)."""
    return a.strides[1] == a.itemsize or a.shape[1] == 1


def matmul(a, b, out, c_kernels=True):
    """``out`` = ``a @ b`` for 2-D float arrays of one dtype: by the kernel where
    ``c_kernels`` allows C, the library is built and a side is short (see the module
    docstring), else ``np.matmul``."""
    fns = kernels() if c_kernels else None
    dt = out.dtype
    if fns is None or not (a.dtype == b.dtype == dt and dt in _TYPES) or \
            np.may_share_memory(out, a) or np.may_share_memory(out, b):
        return np.matmul(a, b, out=out)
    (m, k), n = a.shape, b.shape[1]
    item = dt.itemsize
    os_, om = out.strides[0] // item, out.strides[1] // item
    if m <= n and 2 <= m <= MAX_SHORT and _unit_rows(a) and \
            (b.strides[0] == item or k == 1):
        x, w, rows = a, b.T, n                       # out[s, m'] = a[s] . b[:, m']
    elif 2 <= n <= MAX_SHORT and _unit_rows(a):
        x, w, rows = np.ascontiguousarray(b.T), a, m  # out[m', s] = b[:, s] . a[m']
        os_, om = om, os_
    else:
        return np.matmul(a, b, out=out)
    geo = np.array((x.shape[0], rows, k, x.strides[0] // item, w.strides[0] // item,
                    os_, om), np.int64)
    fns[dt](x.ctypes.data, w.ctypes.data, out.ctypes.data, geo.ctypes.data, 0, rows)
    return out
