"""Matrix products of a transformer layer's size in C, called from segments.

A linear layer of a small transformer (BERT or GPT-2 with hidden size 128, 64 tokens)
is a product of (64, 128) by (128, 512): 8 MFLOP, about 50 us on one core. OpenBLAS's
``sgemm`` packs both operands into its own layouts on every call, and at these sizes
the packing costs a fifth of the product: it took 65 us on (64, 128) @ (128, 512) and
89 us where the right operand was a transposed weight (``W.T``), against 54 and 56 us
here (a 2.3 GHz Xeon with AVX-512, one thread; ONNX Runtime, which packs its constant
weights once, took 59 us on that layer of GPT-2).

Here the right operand is read in place, a panel of ``2 * VG`` columns at a time (two
64-byte vectors: 32 float32 or 16 float64), each panel against every block of
:data:`MR` rows of the left operand: for each ``k``, the two vectors of row ``k`` of
the panel are multiplied by each of the block's elements ``a[r, k]`` (broadcast) and
added into ``2 * MR`` vector sums held in registers, which are stored once at the end
(``beta = 0``: the output is not read). The panel stays in cache while the blocks of
rows pass it. Panels are read from a copy where the right operand's columns are not
adjacent (``W.T``: the copy transposes blocks in registers, with the scan loop's
packing, :mod:`.c_scan`), where a panel would start off a 64-byte boundary (a first
panel up to it), and for the last panel, narrower than two vectors (zero-padded; its
block of results goes through a small tile). The sums are in the data's type, one term
after another along ``k``, contracted to fused multiply-adds as a BLAS does (its order
of terms differs). A bias added to each row (``c = a @ b + bias``) is added to the
finished sums as they are stored, as NumPy's addition after the product would.

:func:`step` is the maker of a segment's line ``np.matmul(a, b, out=c)``
(:mod:`.segments`): the entry and its argument tuple where the arrays suit it (2-D, or
batches of them, float32 or float64 of one dtype, ``c``'s rows with unit stride, at
least :data:`MIN_ROWS` rows, and a product below :data:`MAX_WORK` multiply-adds,
where a BLAS runs on one thread), else None. The entry refuses (returns 1, nothing
written) arrays that changed shape or overlap, or when it cannot get its scratch
memory; the line then runs as NumPy.
"""

import ctypes

import numpy as np

from geon.transformers.numpy import blas, c_pool, c_scan, compiled, toolchain

#: Rows of the left operand per block (2 * MR vector sums in registers).
MR = 8

#: Products of at most this many multiply-adds (M * K * N) take the kernel: a larger
#: one may run on several of the BLAS's threads (see blas.SERIAL_PRODUCT).
MAX_WORK = blas.SERIAL_PRODUCT

#: ... and at least this many rows: fewer leave the vector units waiting on the right
#: operand's loads (skinny.py serves 2 to 16 rows against large weights).
MIN_ROWS = 8

#: Work (multiply-adds) from which a call lets go of the GIL while it computes.
GIL_WORK = 1 << 16

#: Work from which a call runs on geon's threads (:mod:`.c_pool`), where the thread
#: policy allows more than one: a batch of at least as many products as threads one
#: product a part, else each product cut into panels of columns or blocks of rows. A
#: convolution's im2col product (resnet18's are about 19 M), not a small
#: transformer's layers (at most 4 M in the zoo's BERT and GPT-2: cut in two, GPT-2's
#: forward took 0.43 ms where it took 0.51 alone on the machine, but 0.8-1.6 ms where
#: it took 0.6 beside PyTorch and ONNX Runtime, whose threads spin between their calls
#: in the same process).
PAR_WORK = 1 << 23

_TEMPLATE = r"""
typedef REAL vg_SUF __attribute__((vector_size(64)));
#define VG_SUF ((int64_t)(64 / sizeof(REAL)))
#define NR_SUF (2 * VG_SUF)

/* c[r * ldc + j] = sum_k a[r * lda + k * sa] * b[k * ldb + j] (+ v[j] where v is not
   NULL, added to the finished sum: as NumPy adds a bias to the product) for r < H,
   j < NR: the 2 H vector sums in registers, one fused multiply-add each per k. */
#define GEMM_TILE(H) \
__attribute__((optimize("fp-contract=fast"))) \
static void tile##H##_SUF(const REAL *a, int64_t lda, int64_t sa, const REAL *b, \
                          int64_t ldb, REAL *c, int64_t ldc, int64_t K, \
                          const REAL *v) { \
    vg_SUF s0[H], s1[H]; \
    const REAL *ar[H];   /* (row pointers and one running offset: a[r * lda + k * sa] \
                            computed per element took the kernel 75% longer) */ \
    _Pragma("GCC unroll 8") for (int r = 0; r < H; r++) { \
        s0[r] = s1[r] = (vg_SUF){0}; \
        ar[r] = a + r * lda; \
    } \
    for (int64_t k = 0, ka = 0; k < K; k++, ka += sa) { \
        vg_SUF b0, b1; \
        __builtin_memcpy(&b0, b + k * ldb, sizeof b0); \
        __builtin_memcpy(&b1, b + k * ldb + VG_SUF, sizeof b1); \
        _Pragma("GCC unroll 8") for (int r = 0; r < H; r++) { \
            const REAL x = ar[r][ka]; \
            s0[r] += x * b0; \
            s1[r] += x * b1; \
        } \
    } \
    if (v) { \
        vg_SUF v0, v1; \
        __builtin_memcpy(&v0, v, sizeof v0); \
        __builtin_memcpy(&v1, v + VG_SUF, sizeof v1); \
        _Pragma("GCC unroll 8") for (int r = 0; r < H; r++) { \
            s0[r] += v0; \
            s1[r] += v1; \
        } \
    } \
    _Pragma("GCC unroll 8") for (int r = 0; r < H; r++) { \
        __builtin_memcpy(c + r * ldc, &s0[r], sizeof s0[r]); \
        __builtin_memcpy(c + r * ldc + VG_SUF, &s1[r], sizeof s1[r]); \
    } \
}
GEMM_TILE(1) GEMM_TILE(2) GEMM_TILE(3) GEMM_TILE(4)
GEMM_TILE(5) GEMM_TILE(6) GEMM_TILE(7) GEMM_TILE(8)
typedef void (*tile_SUF_t)(const REAL *, int64_t, int64_t, const REAL *, int64_t,
                           REAL *, int64_t, int64_t, const REAL *);
static const tile_SUF_t tiles_SUF[9] = {0, tile1_SUF, tile2_SUF, tile3_SUF, tile4_SUF,
                                        tile5_SUF, tile6_SUF, tile7_SUF, tile8_SUF};

/* the w <= NR columns of b (K, w; strides sk, sj elements) into d: K rows of NR,
   zero-padded */
static void pack_SUF(const REAL *b, int64_t sk, int64_t sj, int64_t K, int64_t w,
                     REAL *d) {
    if (sj == 1) {
        for (int64_t k = 0; k < K; k++)
            for (int64_t q = 0; q < NR_SUF; q++)
                d[k * NR_SUF + q] = q < w ? b[k * sk + q] : (REAL)0;
    } else {   /* (W.T: transposed in registers by the scan loop's packing) */
        SCAN_PACK(((const char *)b), sk * (ptrdiff_t)sizeof(REAL),
                  sj * (ptrdiff_t)sizeof(REAL), K, w, NR_SUF, d);
    }
}

/* c (M, N; rows ldc apart, unit columns) = a (M, K; strides lda, sa) @ b (K, N;
   strides sk, sj). b is read in place, a panel of NR columns at a time, where its
   columns are adjacent and the panel starts on a 64-byte boundary (loads across cache
   lines took the kernel 15-18% longer, and NumPy's arrays are 16- or 32-byte aligned;
   the panel that reaches the boundary is one more, which pays from 8 panels on): a
   first panel up to the boundary, the last narrow one, and each panel of a b whose
   columns are apart (W.T) are copied into pad (K * NR, zero-padded) first, and their
   results go through tile (MR * NR). (Copying all of b into aligned panels cost more
   than it saved: 9 us of 57 on (64, 128) @ (128, 512), b being 256 KiB.) v: NULL, or
   N values added to each row of the product. */
static void gemm_SUF(const REAL *a, int64_t lda, int64_t sa, const REAL *b, int64_t sk,
                     int64_t sj, REAL *c, int64_t ldc, int64_t M, int64_t N, int64_t K,
                     REAL *pad, REAL *tile, const REAL *v) {
    int64_t head = 0;
    if (sj == 1 && sk * (int64_t)sizeof(REAL) % 64 == 0 && N >= 8 * NR_SUF)
        head = (int64_t)((64 - (uintptr_t)b % 64) % 64 / sizeof(REAL));
    for (int64_t j = 0; j < N;) {
        int64_t w = N - j < NR_SUF ? N - j : NR_SUF;
        if (j == 0 && head && head < w) w = head;
        const REAL *panel = b + j;
        int64_t ldp = sk;
        if (w < NR_SUF || sj != 1) {
            pack_SUF(b + j * sj, sk, sj, K, w, pad);
            panel = pad;
            ldp = NR_SUF;
        }
        for (int64_t i = 0; i < M; i += MR_) {
            const int64_t h = M - i < MR_ ? M - i : MR_;
            if (w == NR_SUF) {
                tiles_SUF[h](a + i * lda, lda, sa, panel, ldp, c + i * ldc + j, ldc, K,
                             v ? v + j : NULL);
            } else {
                tiles_SUF[h](a + i * lda, lda, sa, panel, ldp, tile, NR_SUF, K, NULL);
                for (int64_t r = 0; r < h; r++)
                    for (int64_t q = 0; q < w; q++)
                        c[(i + r) * ldc + j + q] = v ? tile[r * NR_SUF + q] + v[j + q]
                                                     : tile[r * NR_SUF + q];
            }
        }
        j += w;
    }
}

/* This thread's scratch of at least bytes, 64-byte aligned, kept for its next calls
   (memory from malloc and back to free on every call came from mmap past 128 KiB:
   fresh pages, faulted in on each call); NULL where there is no memory. */
static REAL *scratch_SUF(size_t bytes) {
    static __thread void *kept = NULL;
    static __thread size_t size = 0;
    if (bytes > size) {
        void *const p = aligned_alloc(64, (bytes + 63) / 64 * 64);
        if (!p) return NULL;
        free(kept);
        kept = p;
        size = bytes;
    }
    return kept;
}

/* One product of a call (or a batch of them) and how it is cut into parts: part k is
   product k / (nr nc), its block of rows (rows of them) k / nc % nr and of columns
   (cols of them) k % nc. */
typedef struct {
    const REAL *a, *b, *v;
    REAL *c;
    int64_t lda, sa, ta, sk, sj, tb, ldc, tc, M, N, K, rows, cols, nr, nc;
    int failed;   /* a part had no memory for its scratch */
} job_SUF;

static void part_SUF(void *job, int64_t k) {
    job_SUF *const g = job;
    const int64_t t = k / (g->nr * g->nc), i = k / g->nc % g->nr * g->rows,
                  j = k % g->nc * g->cols;
    const int64_t h = g->M - i < g->rows ? g->M - i : g->rows;
    const int64_t w = g->N - j < g->cols ? g->N - j : g->cols;
    REAL *const pad = scratch_SUF((g->K + MR_) * NR_SUF * sizeof(REAL));
    if (!pad) {
        __atomic_store_n(&g->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    gemm_SUF(g->a + t * g->ta + i * g->lda, g->lda, g->sa, g->b + t * g->tb + j * g->sj,
             g->sk, g->sj, g->c + t * g->tc + i * g->ldc + j, g->ldc, h, w, g->K, pad,
             pad + g->K * NR_SUF, g->v ? g->v + j : NULL);
}

/* args ((a, b, c),) or ((a, b, c, bias),): c = a @ b (+ bias, C-contiguous, of N
   values, added to each row) for 2-D arrays of REAL (the caller checked the dtype), or
   for 3-D ones, one product per index of the first dimension (a's or b's stride along
   it may be 0: a broadcast). 0: done; 1: refused, nothing written (shapes that do not
   chain, strides that are not whole elements, c's columns not adjacent, c's products
   overlapping each other, a, b or the bias, no memory for the scratch); -1: a Python
   error set. */
int geon_gemm_SUF(void *args) {
    static const int flags[4] = {GEON_STRIDED, GEON_STRIDED,
                                 GEON_STRIDED | GEON_WRITABLE, GEON_CONTIGUOUS};
    geon_buffer v[4];
    void *const arrays = PyTuple_GetItem(args, 0);
    const ptrdiff_t na = arrays ? PyTuple_Size(arrays) : -1;
    if (na != 3 && na != 4) return 1;   /* (refused: not arrays this entry takes) */
    if (!geon_acquire(v, arrays, flags, (int)na)) return -1;
    int status = 1;
    const ptrdiff_t z = (ptrdiff_t)sizeof(REAL);
    const int nd = v[2].ndim, o = nd - 2;   /* o: 1 where there is a batch */
    if (nd < 2 || nd > 3 || v[0].ndim != nd || v[1].ndim != nd
            || v[0].itemsize != z || v[1].itemsize != z || v[2].itemsize != z)
        goto done;
    const int64_t T = o ? v[2].shape[0] : 1;
    const int64_t M = v[0].shape[o], K = v[0].shape[o + 1], N = v[1].shape[o + 1];
    if (v[1].shape[o] != K || v[2].shape[o] != M || v[2].shape[o + 1] != N
            || (o && (v[0].shape[0] != T || v[1].shape[0] != T))
            || (na == 4 && v[3].len != N * z))
        goto done;
    for (int q = 0; q < 3; q++)
        for (int d = 0; d < nd; d++)
            if (v[q].strides[d] % z) goto done;
    if (T == 0 || M == 0 || N == 0) { status = 0; goto done; }
    if (v[2].strides[o + 1] != z && N > 1) goto done;
    const ptrdiff_t ldc_b = v[2].strides[o] < 0 ? -v[2].strides[o] : v[2].strides[o];
    const ptrdiff_t tc_b = o && v[2].strides[0] < 0 ? -v[2].strides[0] : o ? v[2].strides[0] : 0;
    if (T > 1 && tc_b < (M - 1) * ldc_b + N * z) goto done;   /* products overlapping */
    /* c's bytes against a's, b's and the bias's (spans from the lowest to the highest
       element; the bias, read as C-contiguous bytes, has no shape: its length) */
    for (int q = 0; q < (na == 4 ? 3 : 2); q++) {
        const char *lo[2], *hi[2];
        for (int p = 0; p < 2; p++) {
            const geon_buffer *const u = &v[p ? 2 : q < 2 ? q : 3];
            const char *l = u->buf, *h = u == &v[3] ? (const char *)u->buf + u->len - z
                                                    : u->buf;
            for (int d = 0; u != &v[3] && d < u->ndim; d++) {
                const ptrdiff_t e = (u->shape[d] - 1) * u->strides[d];
                if (e < 0) l += e; else h += e;
            }
            lo[p] = l;
            hi[p] = h + z;
        }
        if ((K || q == 2) && lo[0] < hi[1] && lo[1] < hi[0]) goto done;
    }
    const int64_t z_ = (int64_t)z;
    job_SUF g = {v[0].buf, v[1].buf, na == 4 ? (const REAL *)v[3].buf : NULL, v[2].buf,
                 v[0].strides[o] / z_, v[0].strides[o + 1] / z_, o ? v[0].strides[0] / z_ : 0,
                 v[1].strides[o] / z_, N > 1 ? v[1].strides[o + 1] / z_ : 1,
                 o ? v[1].strides[0] / z_ : 0, v[2].strides[o] / z_,
                 o ? v[2].strides[0] / z_ : 0, M, N, K, M, N, 1, 1, 0};
    /* (this thread's scratch, got before anything is written: a part on this thread
       reuses it) */
    if (!scratch_SUF((K + MR_) * NR_SUF * sizeof(REAL))) goto done;
    const int want = pool_threads();
    const int64_t work = T * M * N * K;
    if (want > 1 && T < want && pool_worth(work, PAR_WORK)) {   /* one product in parts */
        if (N >= 2 * NR_SUF) {   /* by panels of columns */
            const int64_t panels = (N + NR_SUF - 1) / NR_SUF;
            g.cols = (panels + POOL_CUT(want) - 1) / POOL_CUT(want) * NR_SUF;
            g.nc = (N + g.cols - 1) / g.cols;
        } else {   /* by blocks of rows */
            const int64_t blocks = (M + MR_ - 1) / MR_;
            g.rows = (blocks + POOL_CUT(want) - 1) / POOL_CUT(want) * MR_;
            g.nr = (M + g.rows - 1) / g.rows;
        }
    }
    const int64_t parts = T * g.nr * g.nc;
    void *const state = work >= GIL_WORK ? PyEval_SaveThread() : NULL;
    if (parts > 1 && want > 1 && pool_worth(work, PAR_WORK))
        pool_run(part_SUF, &g, parts);
    else
        for (int64_t k = 0; k < parts; k++) part_SUF(&g, k);
    if (g.failed) {   /* a worker had no memory for its scratch: every part again, on
                         this thread (whose scratch is there; c overlaps no operand) */
        g.failed = 0;
        for (int64_t k = 0; k < parts; k++) part_SUF(&g, k);
    }
    if (state) PyEval_RestoreThread(state);
    status = 0;
done:
    geon_release(v, (int)na);
    return status;
}

/* args ((x, w, y), B, C, P, R, Q, S): the convolution of x (B, C, P R, Q S) with w (K,
   C, R, S) whose windows tile the image (strides R and S, no padding: a ViT's patch
   embedding) into y (B, K, P, Q), all C-contiguous: the patches gathered as rows
   (B P Q, C R S) into scratch, t (K, B P Q) = w @ rows.T (gemm_SUF, reading rows.T
   through its copies of transposed panels), then y[b, k] = t[k, b P Q ...]. One call
   with the arrays themselves: the three steps as NumPy views took 3.5 us more a
   call, 10 out of cache. 0: done; 1: refused, nothing written (sizes that do not
   match, y overlapping x or w, no memory); -1: a Python error set. */
int geon_patches_SUF(void *args) {
    static const int flags[3] = {GEON_CONTIGUOUS, GEON_CONTIGUOUS,
                                 GEON_CONTIGUOUS | GEON_WRITABLE};
    long long iv[6];
    geon_buffer v[3];
    if (!geon_args(args, "iiiiii", iv, NULL)) return -1;
    if (!geon_acquire(v, PyTuple_GetItem(args, 0), flags, 3)) return -1;
    const int64_t B = iv[0], C = iv[1], P = iv[2], R = iv[3], Q = iv[4], S = iv[5];
    const ptrdiff_t z = (ptrdiff_t)sizeof(REAL);
    const int64_t L = C * R * S, N = B * P * Q;
    const int64_t K = L > 0 ? v[1].len / (L * z) : 0;
    int status = 1;
    if (B <= 0 || L <= 0 || P <= 0 || Q <= 0 || K <= 0 || v[1].len != K * L * z
            || v[0].len != B * L * P * Q * z || v[2].len != B * K * P * Q * z)
        goto done;
    {
        const char *const yb = v[2].buf, *const ye = yb + v[2].len;
        for (int q = 0; q < 2; q++)
            if ((const char *)v[q].buf < ye && yb < (const char *)v[q].buf + v[q].len)
                goto done;
    }
    /* rows (N, L), t (K, N) and the product's pad, each from a 64-byte boundary */
    const int64_t at_t = (N * L + 15) / 16 * 16, at_pad = at_t + (K * N + 15) / 16 * 16;
    REAL *const rows = scratch_SUF((at_pad + (L + MR_) * NR_SUF) * sizeof(REAL));
    if (!rows) goto done;
    REAL *const t = rows + at_t, *const pad = rows + at_pad;
    const REAL *const x = v[0].buf;
    REAL *const y = v[2].buf;
    void *const state = K * N * L >= GIL_WORK ? PyEval_SaveThread() : NULL;
    for (int64_t b = 0; b < B; b++)
        for (int64_t p = 0; p < P; p++)
            for (int64_t q = 0; q < Q; q++)
                for (int64_t c = 0; c < C; c++)
                    for (int64_t r = 0; r < R; r++)
                        __builtin_memcpy(rows + ((b * P + p) * Q + q) * L + (c * R + r) * S,
                                         x + (((b * C + c) * P + p) * R + r) * Q * S + q * S,
                                         S * sizeof(REAL));
    gemm_SUF(v[1].buf, L, 1, rows, 1, L, t, N, K, N, L, pad, pad + L * NR_SUF, NULL);
    for (int64_t b = 0; b < B; b++)
        for (int64_t k = 0; k < K; k++)
            __builtin_memcpy(y + (b * K + k) * P * Q, t + k * N + b * P * Q,
                             P * Q * sizeof(REAL));
    if (state) PyEval_RestoreThread(state);
    status = 0;
done:
    geon_release(v, 3);
    return status;
}
"""

_TYPES = {np.dtype(np.float32): ("float", "f32"), np.dtype(np.float64): ("double", "f64")}


def source():
    """The C source of the kernels, for float32 and float64."""
    head = ("#include <stdint.h>\n#include <stddef.h>\n#include <stdlib.h>\n"
            f"#define MR_ {MR}\n#define GIL_WORK {GIL_WORK}LL\n#define PAR_WORK {PAR_WORK}LL\n"
            "extern ptrdiff_t PyTuple_Size(void *tuple);\n"
            + toolchain.BUFFER_API + c_pool.CLIENT)
    return head + "\n".join(
        c_scan.gemm_source(dtype) + _TEMPLATE.replace("SCAN_PACK", c_scan.pack_name(dtype))
        .replace("REAL", real).replace("_SUF", "_" + suffix)
        for dtype, (real, suffix) in _TYPES.items())


_loaded = {}  # (CC, cache folder) -> {dtype: ctypes function}, or None


def kernels():
    """``{dtype: the product's entry, ("patches", dtype): the patch embedding's}``
    (ctypes functions), or None where the compiled path is off or cannot run here."""
    return compiled.fixed_library(_loaded, "small product kernels", source, _SYMBOLS, _bind)


_SYMBOLS = [f"geon_{n}_{s}" for _, s in _TYPES.values() for n in ("gemm", "patches")] \
    + [c_pool.CLIENT_SYMBOL]


def _bind(lib):
    c_pool.attach(lib)
    proto = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object)
    fns = {dt: proto((f"geon_gemm_{s}", lib)) for dt, (_, s) in _TYPES.items()}
    fns.update({("patches", dt): proto((f"geon_patches_{s}", lib))
                for dt, (_, s) in _TYPES.items()})
    return fns


def patches_entry(dtype):
    """The entry of a convolution whose windows tile the image (see the C), or None."""
    return (kernels() or {}).get(("patches", np.dtype(dtype)))


def step(a, b, out, fns=None):
    """The steps of a segment's line ``np.matmul(a, b, out=out)`` (see the module
    docstring), or None where NumPy's call is the better or the only way. ``fns``:
    :func:`kernels`'s result where the caller has it (None: looked up)."""
    if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)
            and isinstance(out, np.ndarray)) or out.ndim < 2 or a.ndim < 2 \
            or b.ndim < 2 or not a.dtype == b.dtype == out.dtype \
            or out.dtype not in _TYPES:
        return None
    m, k = a.shape[-2:]
    n = b.shape[-1]
    if out.shape[-2:] != (m, n) or b.shape[-2] != k:
        return None
    if out.ndim > 2:   # batches (maybe broadcast) as one dimension, where views allow
        try:
            a = np.broadcast_to(a, out.shape[:-2] + (m, k))
            b = np.broadcast_to(b, out.shape[:-2] + (k, n))
        except ValueError:
            return None
        a, b, out = _batched(a), _batched(b), _batched(out)
        if a is None or b is None or out is None:
            return None
    elif a.ndim != 2 or b.ndim != 2:
        return None
    if m < MIN_ROWS or out.size // max(n, 1) * k * n > MAX_WORK or out.ndim == 3 \
            and out.shape[0] > 1 and abs(out.strides[0]) < (m - 1) * abs(out.strides[1]) \
            + n * out.itemsize:   # (products that interleave: the entry refuses them)
        return None
    fns = kernels() if fns is None else fns
    return None if fns is None else [(fns[out.dtype], ((a, b, out),), None)]


def matmul(a, b, out, fns=None):
    """``np.matmul(a, b, out=out)`` by the kernel where :func:`step` takes the arrays
    and the entry does not refuse them: True; else False (nothing written). ``fns``:
    :func:`kernels`'s result where the caller has it (None: looked up)."""
    steps = step(a, b, out, fns)
    if steps is None:
        return False
    fn, args, _ = steps[0]
    return fn(args) == 0


def _batched(x):
    """``x`` (..., r, c) as a view (-1, r, c), or None where that takes a copy."""
    if x.ndim == 3:
        return x
    y = x.reshape((-1,) + x.shape[-2:])
    return y if y.size == 0 or np.may_share_memory(y, x) else None


def is_entry(fn):
    """Whether ``fn`` is one of this module's product entries."""
    return any(fn is f for fns in _loaded.values() if fns
               for key, f in fns.items() if not isinstance(key, tuple))
