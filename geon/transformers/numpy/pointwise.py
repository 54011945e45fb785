"""1 x 1 convolutions in C, with the bias and a clamp (ReLU, ReLU6) applied as they are
stored.

A 1 x 1 convolution (stride 1, no padding, one group) is ``y[b] = w (K, C) @ x[b] (C,
P)``. In the late stages of a small-image CNN (MobileNet, EfficientNet at 64 x 64) P is
4 or 16, and ``np.matmul`` per image reads the whole weight once per image, packing it
for its kernel each time: OpenBLAS took 316 us for a 1,280 x 320 weight on two images
of 2 x 2 positions with the weight out of cache, 190 us in cache (one 2-core AMD EPYC
core). Here the images' columns are copied into a small block, a row of C each (N =
B * P of them), and each row of the weight is read once, straight from its own
layout: blocks of 16 / NC rows (NC: N rounded up to 2, 4, 8 or 16; more columns go 16
at a time), their dot products with the NC columns along C a vector at a time in 16
vector sums, added up across lanes by one tree of shuffles at the end of the block;
the weight is prefetched 6 KiB ahead, which reaches into the rows after a short one.
An earlier form broadcast each element of a row against the columns held in vector
registers: at 8 columns of float32 it used half of a 16-lane vector, and took 44 us for
a 960 x 160 weight in cache where this one takes 33, 103 us out of L2 where this
one takes 54 (a 2.3 GHz Xeon with AVX-512 and 2 MiB of L2 a core, one thread; its
6 KiB prefetch against 1 KiB: 54 against 70 us; 1,280 x 320: 141 against 215, the
BLAS 247 in cache and 342 out of it).

Many columns (images of 32 positions or more, C <= :data:`WIDE_MAX_C`) go to the wide
form: per image, blocks of 4 vectors of positions straight from x's layout (an
image's (C, P) has its positions along a row), each against every block of 6 rows of
the weight, each weight element broadcast against the block (24 vector sums in
registers), the epilogue applied to the sums before they are stored. It replaces the
BLAS's product per image and the epilogue's pass after it: MobileNet-v2's 16 -> 96
expansion on 2 images of 32 x 32 took 60-70 us against 135-145 (the 2.3 GHz Xeon, one
thread), most other 1 x 1 layers of its early stages 5-25% less. A result laid over
its input (the plan gives an expansion's result the memory of the input that dies at
it) is computed from a copy of the input.

Each stored element is ``min(max(sum + bias[k], lo), hi)`` (NumPy's maximum and
minimum, NaN kept; no bias: 0; lo / hi: -inf / inf for none), so that the bias add and
activation after a convolution need no pass of their own (see
:mod:`geon.transformers.numpy.conv_epilogue`; :func:`bias_clamp` is that epilogue as
one pass, after the other paths). The sums are in the data's type with fused
multiply-adds, in another order than the BLAS's. float32 and float64; other dtypes, and
machines where the library does not build (see
:func:`geon.transformers.numpy.compiled.fixed_library`), run NumPy.
"""

import ctypes

import numpy as np

from geon.transformers.numpy import c_pool, compiled, toolchain
from geon.transformers.numpy.c_rules import sigmoid_limit

#: The kernel is used for at most this many columns (images times positions) and a
#: weight of at least MIN_WEIGHT_BYTES; the BLAS's blocking wins on more columns, and
#: on small weights, which stay in cache. Measured inside MobileNet-v2 and
#: EfficientNet-B0 forwards (batch 2, 64 x 64 images, one thread, calls interleaved
#: with np.matmul per image; a 2-core AMD EPYC): at 8 columns the kernel took 54 / 80 /
#: 139 us where np.matmul took 86 / 127 / 339 (960 x 160, 1,152 x 192, 1,280 x 320
#: weights); at 32 columns 41 against 28 (384 x 64) and 76 against 88 (112 x 672); at
#: 2 columns, on weights under 256 KiB (1 x 1 squeeze-excitation layers), 15 against
#: 10. On a 2.3 GHz Xeon (one thread), at 8 columns 53 / 119 / 639 us against 53 / 136
#: / 800 (960 x 160, 1,280 x 320, 512 x 4,608), at 16 columns 84 / 116 / 264 against
#: 57 / 84 / 230 (960 x 160, 1,152 x 192, 256 x 2,304): the BLAS from 9 columns. (Those
#: were the broadcasting form's; with the dot products, MobileNet-v2's and
#: EfficientNet-B0's forwards took as long with 16 or 32 here, within 4%.)
MAX_COLUMNS = 8
MIN_WEIGHT_BYTES = 1 << 18
#: More columns go to the wide form (the convolution's own callers only) where C is at
#: most this: C rows of its blocks of columns stay in L1 (see pw_wide).
WIDE_MAX_C = 256
#: Work (multiply-adds) from which a call is cut into blocks of rows for geon's threads
#: (:mod:`.c_pool`) where the thread policy gives more than one.
PARALLEL_WORK = 1 << 21

#: The epilogue of one element in C (``epi_SUF``), also the direct convolutions'
#: (:mod:`.conv_kernels`); :func:`specialize` fills in its names per dtype.
EPILOGUE = r"""
/* NumPy's minimum(maximum(v, lo), hi) for bounds that are not NaN (act_code gives
   NaN bounds act 3, the two-sided form): of equal values the bound (NumPy's second
   operand), a NaN v passed through. A max, a min and one NaN test a vector; MIN_SUF
   (MAX_SUF()) tests both operands of both for NaN, which GCC compiles to eight
   mask compares a vector (half a cycle an element, three times a copy's time). */
static inline REAL clamp_SUF(REAL v, REAL lo, REAL hi) {
    const REAL m = v > lo ? v : lo;
    const REAL n = m < hi ? m : hi;
    return v != v ? v : n;
}

/* VCLAMP_SUF(VT, IT) defines vclamp_SUF: clamp_SUF of each lane of a vector of type VT
   (IT: the integer vector of its size), by masks and bits (GCC's C has no ?: on
   vectors) */
#define VCLAMP_SUF(VT, IT) \
static inline VT vclamp_SUF(VT v, VT lo, VT hi) { \
    const IT a = v > lo; \
    const VT m = (VT)(((IT)v & a) | ((IT)lo & ~a)); \
    const IT b = m < hi; \
    const VT n = (VT)(((IT)m & b) | ((IT)hi & ~b)); \
    const IT c = v != v; \
    return (VT)(((IT)v & c) | ((IT)n & ~c)); \
}

/* the epilogue of an element: v = sum + bias, then act 0: min(max(v, lo), hi) (3: the
   same with a NaN bound), 1: v * sigmoid(v) (SiLU), 2: sigmoid(v); the sigmoid as the
   compiled groups write it */
static inline REAL epi_SUF(REAL v, REAL lo, REAL hi, int act) {
    if (act == 0) return clamp_SUF(v, lo, hi);
    if (act == 3) return MIN_SUF(MAX_SUF(v, lo), hi);
    const REAL s = (REAL)1 / ((REAL)1 + EXP_SUF(MIN_SUF(-v, (REAL)SIGLIMIT_SUF)));
    return act == 1 ? v * s : s;
}

/* d[j] = epi(s[j] + b), j < n, one loop per act (d may be s; kept out of line: one
   copy where the kernels' forms finish a run of sums) */
__attribute__((noinline))
static void epi_run_SUF(REAL *d, const REAL *s, int64_t n, REAL b, REAL lo, REAL hi,
                        int act) {
    if (act == 0) {
        #pragma omp simd
        for (int64_t j = 0; j < n; j++) d[j] = clamp_SUF(s[j] + b, lo, hi);
    } else if (act == 3) {
        for (int64_t j = 0; j < n; j++) d[j] = epi_SUF(s[j] + b, lo, hi, 3);
    } else if (act == 1) {
        #pragma omp simd
        for (int64_t j = 0; j < n; j++) d[j] = epi_SUF(s[j] + b, lo, hi, 1);
    } else {
        #pragma omp simd
        for (int64_t j = 0; j < n; j++) d[j] = epi_SUF(s[j] + b, lo, hi, 2);
    }
}
"""

_TEMPLATE = r"""
typedef REAL vw_SUF __attribute__((vector_size(64)));
#define VW_SUF ((int64_t)(64 / sizeof(REAL)))
HSUM_SUF
""" + EPILOGUE + r"""

/* The dot products of rows i < MB of w (at wr[i], prefetched ahead elements ahead)
   with columns n < NC of x (rows of xt, ldx apart) over elements [c0, c1) of C, VW
   at a time (a last partial VW read through a zeroed vector: nothing past a row is
   read), in MB * NC = 16 vector sums: started at zero where c0 is 0, else from part
   (16 vectors); then added up across lanes into sums[i * NC + n] (hsum) where c1 is
   C, else stored back into part. */
#define PW_DOT(NC, MB) \
__attribute__((optimize("fp-contract=fast"))) \
static void dot##NC##_SUF(const REAL *const *wr, const REAL *restrict xt, int64_t ldx, \
                          int64_t c0, int64_t c1, int64_t C, int64_t ahead, \
                          vw_SUF *part, REAL *restrict sums) { \
    vw_SUF acc[MB * NC]; \
    if (c0 == 0) { \
        _Pragma("GCC unroll 16") for (int a = 0; a < MB * NC; a++) acc[a] = (vw_SUF){0}; \
    } else { \
        __builtin_memcpy(acc, part, sizeof acc); \
    } \
    const int64_t full = C / VW_SUF * VW_SUF; \
    for (int64_t c = c0; c < c1; c += VW_SUF) { \
        vw_SUF wv[MB]; \
        if (c < full) { \
            _Pragma("GCC unroll 8") for (int i = 0; i < MB; i++) { \
                __builtin_memcpy(&wv[i], wr[i] + c, sizeof wv[i]); \
                __builtin_prefetch(wr[i] + c + ahead, 0, 3); \
            } \
        } else { \
            _Pragma("GCC unroll 8") for (int i = 0; i < MB; i++) { \
                wv[i] = (vw_SUF){0}; \
                __builtin_memcpy(&wv[i], wr[i] + c, (C - c) * sizeof(REAL)); \
            } \
        } \
        _Pragma("GCC unroll 16") for (int n = 0; n < NC; n++) { \
            vw_SUF xv; \
            __builtin_memcpy(&xv, xt + n * ldx + c, sizeof xv); \
            _Pragma("GCC unroll 8") for (int i = 0; i < MB; i++) \
                acc[i * NC + n] += wv[i] * xv; \
        } \
    } \
    if (c1 == C) hsum_SUF(acc, sums); \
    else __builtin_memcpy(part, acc, sizeof acc); \
}
PW_DOT(2, 8)
PW_DOT(4, 4)
PW_DOT(8, 2)
PW_DOT(16, 1)
#undef PW_DOT

/* y (B, K, P) = epi(w (K, C) @ x (B, C, P) + bias): rows [lo, hi) of w, every
   column (N = B * P, few); geo: B, C, K, P; bias may be NULL. Blocks of up to 16
   columns are copied into xt, a row of C (padded to whole vectors, zeros) each, NC
   of them (rounded up to 2, 4, 8 or 16); then blocks of MB = 16 / NC rows of w, each
   read once from its own layout, VW elements at a time against the same elements of
   the NC columns (dot products along C: every lane of every multiply-add used, where
   a row of w broadcast against the N columns used N of a vector's lanes). Where NC
   rows of xt take more than XT_BYTES (L1's share), C goes in pieces that do, all the
   rows' blocks a piece, their vector sums kept in part between pieces: else every
   block of rows read all of xt from L2 (resnet18's 512 x 4,608 filter on 8 columns:
   150 KB of columns a block). The weight is prefetched 6 KiB ahead in one piece (a
   short row's prefetch reaches into the rows after it), the next block's rows' same
   elements in pieces. 1: no memory. */
#define XT_BYTES 40960
static int pw_SUF(const REAL *restrict x, const REAL *restrict w,
                  const REAL *restrict bias, REAL *restrict y, const int64_t *geo,
                  REAL lo_, REAL hi_, int act, int64_t lo, int64_t hi) {
    const int64_t B = geo[0], C = geo[1], K = geo[2], P = geo[3], N = B * P;
    const int64_t ldx = (C + VW_SUF - 1) / VW_SUF * VW_SUF;
    /* (aligned to a cache line, as its rows: a vector read across two lines costs
       two reads; from malloc's 16 bytes, a 960 x 160 weight on 8 columns took 50 us,
       aligned 33) */
    const int64_t blocks = hi - lo;   /* (at most: MB >= 1) */
    char *held = malloc((size_t)(16 * ldx) * sizeof(REAL) + 64
                        + (ldx * 16 * (int64_t)sizeof(REAL) > XT_BYTES
                           ? (size_t)blocks * 16 * sizeof(vw_SUF) : 0));
    if (!held) return 1;
    REAL *xt = (REAL *)(((uintptr_t)held + 63) & ~(uintptr_t)63);
    vw_SUF *part = (vw_SUF *)(xt + 16 * ldx);
    REAL sums[16];
    int64_t yo[16];   /* column j's offset in y */
    for (int64_t n0 = 0; n0 < N; n0 += 16) {   /* blocks of up to 16 columns */
        const int64_t nb = N - n0 < 16 ? N - n0 : 16;
        const int64_t NC = nb <= 2 ? 2 : nb <= 4 ? 4 : nb <= 8 ? 8 : 16, MB = 16 / NC;
        int64_t piece = XT_BYTES / (NC * (int64_t)sizeof(REAL)) / VW_SUF * VW_SUF;
        if (piece < VW_SUF) piece = VW_SUF;
        for (int64_t j = 0; j < NC; j++) {   /* column n = b * P + p: x[b, :, p] */
            REAL *row = xt + j * ldx;
            if (j < nb) {
                const int64_t b = (n0 + j) / P, p = (n0 + j) % P;
                const REAL *xc = x + b * C * P + p;
                for (int64_t c = 0; c < C; c++) row[c] = xc[c * P];
                for (int64_t c = C; c < ldx; c++) row[c] = 0;
                yo[j] = b * K * P + p;
            } else {
                for (int64_t c = 0; c < ldx; c++) row[c] = 0;
            }
        }
        void (*dot)(const REAL *const *, const REAL *restrict, int64_t, int64_t, int64_t,
                    int64_t, int64_t, vw_SUF *, REAL *restrict) =
            NC == 2 ? dot2_SUF : NC == 4 ? dot4_SUF : NC == 8 ? dot8_SUF : dot16_SUF;
        for (int64_t c0 = 0; c0 < C; c0 += piece) {
            const int64_t c1 = C - c0 <= piece ? C : c0 + piece;
            for (int64_t m0 = lo; m0 < hi; m0 += MB) {
                const REAL *wr[8];
                for (int64_t i = 0; i < MB; i++)
                    wr[i] = w + (m0 + i < hi ? m0 + i : m0) * C;
                dot(wr, xt, ldx, c0, c1, C, piece < C ? MB * C : 1536,
                    part + (m0 - lo) / MB * 16, sums);
                if (c1 < C) continue;
                for (int64_t i = 0; i < MB && m0 + i < hi; i++) {
                    const int64_t m = m0 + i;
                    const REAL b = bias ? bias[m] : 0, *si = sums + i * NC;
                    REAL *ym = y + m * P;
                    if (act == 0)
                        for (int64_t j = 0; j < nb; j++)
                            ym[yo[j]] = clamp_SUF(si[j] + b, lo_, hi_);
                    else
                        for (int64_t j = 0; j < nb; j++)
                            ym[yo[j]] = epi_SUF(si[j] + b, lo_, hi_, act);
                }
            }
        }
    }
    free(held);
    return 0;
}
#undef XT_BYTES

VCLAMP_SUF(vw_SUF, iw_SUF)

/* Many columns: the rows [m0, m0 + rows) of y (their columns [0, n), ldy apart) =
   epi(rows of w (K, C) @ NV vectors of columns of x (C rows, ldx apart) + bias), the
   columns straight from x's layout (a row of an image's (C, P) is its positions) and
   every weight element broadcast against them: MR rows by NV vectors of sums in
   registers (rows past `rows` repeat row m0, their sums dropped). The NV vectors of C
   rows of x stay in L1 while all the rows of w go by. */
#define PW_WIDE(NV, MR) \
__attribute__((optimize("fp-contract=fast"))) \
static void wide##NV##_SUF(const REAL *restrict w, int64_t C, int64_t m0, int64_t rows, \
                           const REAL *restrict x, int64_t ldx, int64_t n, \
                           const REAL *restrict bias, REAL *restrict y, int64_t ldy, \
                           REAL lo_, REAL hi_, int act) { \
    vw_SUF acc[MR][NV]; \
    const REAL *wr[MR]; \
    _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) { \
        wr[i] = w + (m0 + (i < rows ? i : 0)) * C; \
        _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) acc[i][v] = (vw_SUF){0}; \
    } \
    for (int64_t c = 0; c < C; c++) { \
        vw_SUF xv[NV]; \
        _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) \
            __builtin_memcpy(&xv[v], x + c * ldx + v * VW_SUF, sizeof xv[v]); \
        _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) { \
            const REAL s = wr[i][c]; \
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) acc[i][v] += s * xv[v]; \
        } \
    } \
    const vw_SUF lov = (vw_SUF){0} + lo_, hiv = (vw_SUF){0} + hi_; \
    const int whole = n == NV * VW_SUF && act == 0; \
    _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) { \
        if (i >= rows) break; \
        const REAL b = bias ? bias[m0 + i] : 0; \
        REAL *yr = y + i * ldy; \
        if (whole) { \
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) { \
                const vw_SUF t = vclamp_SUF(acc[i][v] + b, lov, hiv); \
                __builtin_memcpy(yr + v * VW_SUF, &t, sizeof t); \
            } \
        } else { \
            epi_run_SUF(yr, (const REAL *)acc[i], n, b, lo_, hi_, act); \
        } \
    } \
}
PW_WIDE(2, 12)
PW_WIDE(4, 6)
#undef PW_WIDE

/* y (B, K, P) = epi(w (K, C) @ x (B, C, P) + bias) for rows [lo, hi) of w, many
   columns: per image (xstep apart in x, its C rows ldx apart: an image's own (C, P),
   or its share of an im2col copy of all the images' windows), blocks of 4 vectors of
   positions (2 where C > WIDE_ROWS / 4, so that C rows of a block fit in L1; a last
   partial block copied into xt, zero-padded), each against every block of rows of w
   (6 rows by 4 vectors of sums, or 12 by 2). 1: no memory. */
#define WIDE_ROWS 512
static int pw_wide_SUF(const REAL *restrict x, const REAL *restrict w,
                       const REAL *restrict bias, REAL *restrict y, const int64_t *geo,
                       REAL lo_, REAL hi_, int act, int64_t lo, int64_t hi) {
    const int64_t B = geo[0], C = geo[1], K = geo[2], P = geo[3];
    const int64_t ldx = geo[4], xstep = geo[5];   /* x's rows and images apart */
    const int64_t most = C * 4 <= WIDE_ROWS ? 4 : 2;
    char *held = malloc((size_t)(C * most * VW_SUF) * sizeof(REAL) + 64);
    if (!held) return 1;
    REAL *xt = (REAL *)(((uintptr_t)held + 63) & ~(uintptr_t)63);
    for (int64_t b = 0; b < B; b++) {
        const REAL *xb = x + b * xstep;
        REAL *yb = y + b * K * P;
        for (int64_t p0 = 0; p0 < P; p0 += most * VW_SUF) {
            const int64_t n = P - p0 < most * VW_SUF ? P - p0 : most * VW_SUF;
            const int64_t NV = n > 2 * VW_SUF ? 4 : 2;
            const REAL *src = xb + p0;
            int64_t lds = ldx;
            if (n < NV * VW_SUF) {   /* a partial block: its columns, zero-padded */
                for (int64_t c = 0; c < C; c++) {
                    REAL *row = xt + c * NV * VW_SUF;
                    __builtin_memcpy(row, src + c * ldx, n * sizeof(REAL));
                    for (int64_t j = n; j < NV * VW_SUF; j++) row[j] = 0;
                }
                src = xt;
                lds = NV * VW_SUF;
            }
            const int64_t MR = NV == 4 ? 6 : 12;
            for (int64_t m0 = lo; m0 < hi; m0 += MR) {
                const int64_t rows = hi - m0 < MR ? hi - m0 : MR;
                REAL *ym = yb + m0 * P + p0;
                (NV == 4 ? wide4_SUF : wide2_SUF)(w, C, m0, rows, src, lds, n, bias, ym, P,
                                                  lo_, hi_, act);
            }
        }
    }
    free(held);
    return 0;
}
#undef WIDE_ROWS

/* One call's rows [lo, hi) in blocks of per: block k is rows [lo + k per, ...). */
typedef struct {
    const REAL *x, *w, *bias;
    REAL *y;
    const int64_t *geo;
    REAL lo_, hi_;
    int act;
    int64_t lo, hi, per;
    int (*fn)(const REAL *restrict, const REAL *restrict, const REAL *restrict,
              REAL *restrict, const int64_t *, REAL, REAL, int, int64_t, int64_t);
    int status;   /* 1 where a block had no memory */
} pwjob_SUF;

static void pw_part_SUF(void *p, int64_t k) {
    pwjob_SUF *const j = p;
    const int64_t a = j->lo + k * j->per, b = j->hi - a < j->per ? j->hi : a + j->per;
    if (j->fn(j->x, j->w, j->bias, j->y, j->geo, j->lo_, j->hi_, j->act, a, b))
        __atomic_store_n(&j->status, 1, __ATOMIC_RELAXED);
}

/* The entry (GIL held), its arguments one tuple (arrays, narrays, geo's address, lo_,
   hi_, act, lo, hi, wide): arrays (x, w, y[, bias]), all C-contiguous, y writable; rows
   [lo, hi) of w without the GIL. 0: done; 1: no memory; 2: y overlaps an operand
   (nothing written); -1: a Python error set (an array not contiguous, ...). y may be
   x itself where one call computes every row of one block of columns (x is packed
   whole before the first store: a layer whose input dies at it); wide (many columns,
   pw_wide): y may overlap x where one call computes every row (it reads a copy of
   x; the plan gives a convolution's epilogue the memory of the input that dies at
   it). */
int geon_pointwise_SUF(void *args) {
    static const int flags[4] = {GEON_CONTIGUOUS, GEON_CONTIGUOUS,
                                 GEON_CONTIGUOUS | GEON_WRITABLE, GEON_CONTIGUOUS};
    long long iv[6];
    double dv[2];
    geon_buffer v[4];
    if (!geon_args(args, "iiddiiii", iv, dv)) return -1;
    const int64_t narrays = iv[0] < 4 ? iv[0] : 4, act = iv[2], lo = iv[3], hi = iv[4];
    const int64_t wide = iv[5], *const geo = (const int64_t *)(intptr_t)iv[1];
    const double lo_ = dv[0], hi_ = dv[1];
    if (!geon_acquire(v, PyTuple_GetItem(args, 0), flags, (int)narrays)) return -1;
    const char *ys = v[2].buf, *ye = ys + v[2].len;
    int status = 2;
    const int whole = lo == 0 && hi == geo[2];
    const int packed_first = !wide && geo[0] * geo[3] <= 16 && whole;
    int overlap = 0, over_x = 0;
    for (int k = 0; k < narrays; k++) {
        const char *s = v[k].buf, *e = s + v[k].len;
        if (k == 2 || (k == 0 && packed_first) || !(s < ye && ys < e)) continue;
        if (k == 0 && wide && whole) over_x = 1;
        else overlap = 1;
    }
    if (!overlap) {
        void *const state = PyEval_SaveThread();
        const void *xs = v[0].buf;
        void *copy = NULL;
        if (over_x) {   /* the wide form over its own input: from a copy of it */
            copy = malloc((size_t)v[0].len);
            if (copy) xs = __builtin_memcpy(copy, xs, (size_t)v[0].len);
        }
        pwjob_SUF job = {xs, v[1].buf, narrays > 3 ? v[3].buf : NULL, v[2].buf, geo,
                         (REAL)lo_, (REAL)hi_, (int)act, lo, hi, hi - lo,
                         wide ? pw_wide_SUF : pw_SUF, 0};
        /* blocks of rows on geon's threads, where y does not overlap x (a block's
           stores would reach rows of x another block has yet to read) */
        const int64_t want = pool_threads();
        if (want > 1 && !(xs == v[0].buf && (const char *)xs < ye
                          && ys < (const char *)xs + v[0].len)
                && pool_worth(geo[0] * geo[1] * geo[3] * (hi - lo), PAR_WORK))
            /* (a multiple of the kernels' blocks of rows: 6 or 12 wide, up to 8 dots) */
            job.per = ((hi - lo + POOL_CUT(want) - 1) / POOL_CUT(want) + 23) / 24 * 24;
        if (over_x && !copy) job.status = 1;
        else if (hi > lo) pool_run(pw_part_SUF, &job, (hi - lo + job.per - 1) / job.per);
        status = job.status;
        free(copy);
        PyEval_RestoreThread(state);
    }
    geon_release(v, (int)narrays);
    return status;
}
/* y (B, K, P) = epilogue(x (B, K, P) + bias (K)) (see epi), after another path; x may
   be y itself (not part of it). Entry as above, its arguments (arrays, geo's address,
   lo_, hi_, act), the arrays (x, bias, y): 2 where x and y
   overlap without being the same memory, or bias and y overlap (a computed bias whose
   memory the plan gave to the result: it is read a step at a time). */
int geon_bias_clamp_SUF(void *args) {
    static const int flags[3] = {GEON_CONTIGUOUS, GEON_CONTIGUOUS,
                                 GEON_CONTIGUOUS | GEON_WRITABLE};
    long long iv[2];
    double dv[2];
    geon_buffer v[3];
    if (!geon_args(args, "iddi", iv, dv)
            || !geon_acquire(v, PyTuple_GetItem(args, 0), flags, 3)) return -1;
    const int64_t *const geo = (const int64_t *)(intptr_t)iv[0], act = iv[1];
    const double lo_ = dv[0], hi_ = dv[1];
    const char *xs = v[0].buf, *ys = v[2].buf, *bs = v[1].buf;
    int status = 2;
    if ((xs == ys || xs + v[0].len <= ys || ys + v[2].len <= xs)
            && (bs + v[1].len <= ys || ys + v[2].len <= bs)) {
        const int64_t B = geo[0], K = geo[1], P = geo[2];
        const REAL lo = (REAL)lo_, hi = (REAL)hi_;
        const REAL *x = v[0].buf, *bias = v[1].buf;
        REAL *y = v[2].buf;
        void *const state = B * K * P >= (1 << 15) ? PyEval_SaveThread() : NULL;
        /* steps of up to 1,024 elements: short rows (b, k) (small planes) side by
           side, or a piece of a long row; each element's bias in bb (filled once a
           row where rows are long), so that the loops run long */
        REAL bb[1024];
        const int64_t rows = B * K, per = P < 1024 ? 1024 / P : 1;
        for (int64_t r0 = 0, k = 0; r0 < rows; r0 += per) {
            const int64_t r1 = r0 + per < rows ? r0 + per : rows;
            const int64_t fill = P < 1024 ? P : 1024;
            for (int64_t r = r0; r < r1; r++) {
                const REAL c = bias[k];
                REAL *row = bb + (r - r0) * P;
                for (int64_t j = 0; j < fill; j++) row[j] = c;
                k = k + 1 == K ? 0 : k + 1;
            }
            for (int64_t c0 = 0; c0 < (r1 - r0) * P; c0 += 1024) {
                const int64_t left = (r1 - r0) * P - c0, n = left < 1024 ? left : 1024;
                const REAL *xr = x + r0 * P + c0;
                REAL *yr = y + r0 * P + c0;
                if (act == 0) {
                    #pragma omp simd
                    for (int64_t j = 0; j < n; j++)
                        yr[j] = clamp_SUF(xr[j] + bb[j], lo, hi);
                } else if (act == 3) {
                    for (int64_t j = 0; j < n; j++)
                        yr[j] = epi_SUF(xr[j] + bb[j], lo, hi, 3);
                } else if (act == 1) {   /* (the vector exp where the C library has it) */
                    #pragma omp simd
                    for (int64_t j = 0; j < n; j++)
                        yr[j] = epi_SUF(xr[j] + bb[j], lo, hi, 1);
                } else {
                    #pragma omp simd
                    for (int64_t j = 0; j < n; j++)
                        yr[j] = epi_SUF(xr[j] + bb[j], lo, hi, 2);
                }
            }
        }
        if (state) PyEval_RestoreThread(state);
        status = 0;
    }
    geon_release(v, 3);
    return status;
}
"""

_TYPES = {np.dtype(np.float32): ("float", "f32", "geon_max_f", "geon_min_f"),
          np.dtype(np.float64): ("double", "f64", "geon_max_d", "geon_min_d")}
#: The dtypes the kernels compute.
DTYPES = frozenset(_TYPES)
#: The activations an epilogue applies after its bias (the ``act`` codes of the C):
#: "clamp" (min(max(v, lo), hi)), "silu" (v * sigmoid(v)), "sigmoid".
ACTS = {"clamp": 0, "silu": 1, "sigmoid": 2}


def act_code(act, lo, hi):
    """The C code of activation ``act`` with bounds ``lo`` and ``hi``: :data:`ACTS`,
    and 3 for a clamp with a NaN bound (the C's two-sided form)."""
    return 3 if act == "clamp" and (lo != lo or hi != hi) else ACTS[act]


_SYMBOLS = [f"geon_{k}_{t[1]}" for k in ("pointwise", "bias_clamp")
            for t in _TYPES.values()] + [c_pool.CLIENT_SYMBOL]


def source():
    """The C source of the kernels, for float32 and float64."""
    head = ("#include <math.h>\n#include <stdint.h>\n#include <stddef.h>\n"
            f"#include <stdlib.h>\n#define PAR_WORK {PARALLEL_WORK}LL\n"
            + toolchain.BUFFER_API + toolchain.MINMAX + c_pool.CLIENT)
    return head + simd_exp() + "\n".join(
        specialize(_TEMPLATE.replace("HSUM_SUF", _hsum(64 // np.dtype(dt).itemsize,
                                                       "int32_t" if dt == np.float32
                                                       else "int64_t")), dt)
        for dt in _TYPES)


def _hsum(lanes, index):
    """C of ``hsum_SUF(acc, sums)``: sums[j] = the sum of the ``lanes`` lanes of
    vector acc[j], j < 16, by a tree of shuffles and additions that adds up many
    vectors at once (each level pairs the vectors, each half of a group of lanes with
    its other half: 30 shuffles and 15 additions for 16 vectors of 16 lanes, where
    adding each vector's lanes alone took 4 levels of 2 operations a vector), then
    one shuffle per 16 / ``lanes`` sums into their order. ``index``: the C integer
    type of a lane's size (GCC before 12 takes the shuffle's indices as a vector)."""
    def shuffle(a, b, idx, form):
        idx = ", ".join(map(str, idx))
        return (form.format(f"__builtin_shufflevector({a}, {b}, {idx})"),
                form.format(f"__builtin_shuffle({a}, {b}, (iw_SUF){{{idx}}})"))
    vecs, labels = [f"acc[{j}]" for j in range(16)], [[j] * lanes for j in range(16)]
    width, body = lanes, []
    while width > 1:
        h, nv, nl = width // 2, [], []
        for u in range(0, len(vecs), 2):
            lo, hi, lab = [], [], []
            for q in range(lanes // width):
                for src in (0, 1):
                    base = src * lanes + q * width
                    lo += range(base, base + h)
                    hi += range(base + h, base + width)
                    lab += labels[u + src][q * width:q * width + h]
            name = f"t{len(body)}"
            a = shuffle(vecs[u], vecs[u + 1], lo, "{}")
            b = shuffle(vecs[u], vecs[u + 1], hi, "{}")
            body.append((f"    const vw_SUF {name} = {a[0]} + {b[0]};",
                         f"    const vw_SUF {name} = {a[1]} + {b[1]};"))
            nv.append(name)
            nl.append(lab)
        vecs, labels, width = nv, nl, h
    # the final vectors (one or two) hold the sums in the order of their labels
    where = {lab: (v, k) for v, labs in enumerate(labels) for k, lab in enumerate(labs)}
    for part in range(16 // lanes):
        idx = [v * lanes + k for v, k in (where[j] for j in range(part * lanes,
                                                                     (part + 1) * lanes))]
        store = f"    {{{{ const vw_SUF o = {{}}; __builtin_memcpy(sums + {part * lanes}, " \
                "&o, sizeof o); }}"
        body.append(shuffle(vecs[0], vecs[-1], idx, store))
    return ("typedef " + index + " iw_SUF __attribute__((vector_size(64)));\n"
            "static inline void hsum_SUF(const vw_SUF *acc, REAL *sums) {\n"
            "#if defined(__clang__) || __GNUC__ >= 12\n"
            + "\n".join(b[0] for b in body) + "\n#else\n"
            + "\n".join(b[1] for b in body) + "\n#endif\n}\n")


def simd_exp():
    """The declarations that let ``omp simd`` loops call the C library's vector exp
    (glibc's libmvec), where the toolchain found it; else nothing."""
    if not toolchain.toolchain().simd_math:
        return ""
    return "".join(f"#pragma omp declare simd notinbranch\n{t} {n}({t});\n"
                   for t, n in (("float", "expf"), ("double", "exp")))


def specialize(template, dtype):
    """``template`` (C with ``REAL``, ``_SUF`` and :data:`EPILOGUE`'s names) for
    ``dtype`` (float32 or float64); the caller includes ``math.h`` and
    :data:`~.toolchain.MINMAX`."""
    real, suffix, mx, mn = _TYPES[np.dtype(dtype)]
    return (template.replace("MAX_SUF", mx).replace("MIN_SUF", mn)
            .replace("EXP_SUF", "expf" if real == "float" else "exp")
            .replace("SIGLIMIT_SUF", repr(sigmoid_limit(dtype))).replace("REAL", real)
            .replace("_SUF", "_" + suffix))


def _bind(lib):
    """The entries, each taking its arguments as one tuple (see the C)."""
    c_pool.attach(lib)
    proto = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object)
    fns = {}
    for dtype, (_, suffix, _, _) in _TYPES.items():
        fns[dtype] = proto((f"geon_pointwise_{suffix}", lib))
        fns["bias_clamp", dtype] = proto((f"geon_bias_clamp_{suffix}", lib))
    return fns


_loaded = {}  # (CC, cache folder) -> {dtype: function}, or None


def kernels():
    """``{dtype: function, ("bias_clamp", dtype): function}``, or None where the
    compiled path is off or cannot run here."""
    return compiled.fixed_library(_loaded, "1 x 1 convolution kernels", source,
                                  _SYMBOLS, _bind)


_geos = {}  # geometry -> (its int64 array, the array's address)


def usable(x, w, out, wide=False):
    """Whether :func:`conv1x1` takes these operands: one float dtype the kernels have,
    contiguous arrays, and few columns and a large weight (:data:`MAX_COLUMNS`), or,
    where ``wide``, more columns over at most :data:`WIDE_MAX_C` input channels."""
    B, C = x.shape[:2]
    if not (x.dtype == w.dtype == out.dtype and out.dtype in _TYPES
            and x.flags.c_contiguous and w.flags.c_contiguous
            and out.flags.c_contiguous):
        return False
    P = x.size // max(B * C, 1)
    if B * P <= MAX_COLUMNS:
        return w.nbytes >= MIN_WEIGHT_BYTES
    return wide and wide_form(B, C, P, x.itemsize)


def wide_form(B, C, P, itemsize):
    """Whether the kernel computes these operands in its wide form (else the dot
    products): more than :data:`MAX_COLUMNS` columns, at most :data:`WIDE_MAX_C`
    input channels, and images of two vectors of positions or more."""
    return B * P > MAX_COLUMNS and C <= WIDE_MAX_C and P * itemsize >= 128


def conv1x1(fns, x, w, out, bias=None, lo=-np.inf, hi=np.inf, act="clamp"):
    """``out`` (B, K, *S) = act(w (K, C, 1, ...) applied to x (B, C, *S) + bias (K,))
    (:data:`ACTS`; "clamp": between ``lo`` and ``hi``) by the kernel ``fns[dtype]``
    (see :func:`usable`); False (nothing written) where ``out`` overlaps an
    operand."""
    return prepared_conv1x1(fns, x, w, out, bias, lo, hi, act)(x, w, out, bias)


def prepared_conv1x1(fns, x, w, out, bias=None, lo=-np.inf, hi=np.inf, act="clamp",
                     columns=False):
    """:func:`conv1x1` decided once for operands of these shapes, dtypes and
    settings: a callable ``(x, w, out, bias)`` -> done (False: nothing written, the
    arrays overlap), which holds no array. ``columns``: the callable's x is instead the
    (C, B * P) im2col copy of the B images' windows (C: channels times taps) and w the
    (K, C, ...) filter: always the wide form (see :func:`wide_form`)."""
    code = act_code(act, lo, hi)
    K = w.shape[0]
    if columns:   # (x may be the images: the columns' shape is the filter's and out's)
        B, C = out.shape[0], w.size // max(K, 1)
        P = out.size // max(B * K, 1)
        ldx, xstep = B * P, P
    else:
        B, C = x.shape[:2]
        P = x.size // max(B * C, 1)
        ldx, xstep = P, C * P
    held = geometry((B, C, K, P, ldx, xstep))
    geo = held[1]
    fn = fns[out.dtype]
    n = 3 if bias is None else 4
    wide = int(columns or wide_form(B, C, P, x.itemsize))

    def run(x, w, out, bias, _held=held):
        arrays = (x, w, out) if bias is None else (x, w, out, bias)
        status = fn((arrays, n, geo, lo, hi, code, 0, K, wide))
        if status == 1:
            raise MemoryError("no memory for the columns of a 1 x 1 convolution")
        return status == 0
    run.step = lambda x, w, out, bias: [(   # one call: a step (segments.py)
        fn, ((x, w, out) if bias is None else (x, w, out, bias), n, geo, lo, hi, code,
             0, K, wide), run)]
    return run


def geometry(key):
    """``(array, its address)``: the int64 geometry array of the tuple ``key`` (kept: a
    process meets few shapes), for the fixed kernels that read one (these, and
    :mod:`.im2col`). The caller holds the pair while the kernel reads the address
    (another thread may start the cache afresh meanwhile)."""
    got = _geos.get(key)
    if got is None:
        if len(_geos) >= 4096:
            _geos.clear()
        geo = np.array(key, np.int64)
        got = _geos[key] = (geo, geo.ctypes.data)
    return got


def bias_clamp(fns, y, bias, lo, hi, out, act="clamp"):
    """``out`` = act(y + bias) over y (B, K, *S) and bias (K,) (:data:`ACTS`; "clamp":
    min(max(v, lo), hi), as the graph's Add, Maximum and Minimum compute it; ``out``
    may be ``y``): one C pass where ``fns`` (:func:`kernels`) is given and the arrays
    allow, else NumPy's."""
    prepared_bias_clamp(fns, y, bias, lo, hi, out, act)(y, bias, out)


def prepared_bias_clamp(fns, y, bias, lo, hi, out, act="clamp"):
    """:func:`bias_clamp` decided once for arrays of these shapes, dtypes and layouts:
    a callable ``(y, bias, out)``, which holds no array."""
    B, K = y.shape[:2]
    if fns is not None and y.dtype == bias.dtype == out.dtype and out.dtype in _TYPES \
            and y.flags.c_contiguous and bias.flags.c_contiguous \
            and out.flags.c_contiguous:
        held = geometry((B, K, y.size // max(B * K, 1)))
        fn, geo, code = fns["bias_clamp", out.dtype], held[1], act_code(act, lo, hi)

        def run(y, bias, out, _held=held):
            if fn(((y, bias, out), geo, lo, hi, code)) != 0:
                _numpy_bias_clamp(y, bias, lo, hi, out, act)
        run.step = lambda y, bias, out: [(fn, ((y, bias, out), geo, lo, hi, code), run)]
        return run
    return lambda y, bias, out: _numpy_bias_clamp(y, bias, lo, hi, out, act)


def _numpy_bias_clamp(y, bias, lo, hi, out, act):
    """:func:`bias_clamp` in NumPy."""
    K = y.shape[1]
    np.add(y, bias.reshape((K,) + (1,) * (y.ndim - 2)), out=out)
    if act != "clamp":
        s = np.minimum(np.negative(out), sigmoid_limit(out.dtype))
        np.reciprocal(np.exp(s, out=s) + 1, out=s)
        if act == "silu":
            np.multiply(out, s, out=out)
        else:
            np.copyto(out, s)
        return
    if lo != -np.inf:   # (a NaN bound too: NaN everywhere, as np.maximum gives)
        np.maximum(out, lo, out=out)
    if hi != np.inf:
        np.minimum(out, hi, out=out)
