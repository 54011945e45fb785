"""Direct convolution in C for few input channels per group (depthwise convolution).

A depthwise convolution (``groups == C``: one input channel per group, as in MobileNet
and EfficientNet) is, through im2col, one tiny matrix product per group (a 1 x 9 filter
times a 9 x P window matrix for a 3 x 3 kernel) after a copy of every window. Here each
of the three primitives is a C function that walks the images directly, in one of two
forms, picked per call by the length of an output row (:data:`LANE_ROWS`):

- **rows** (long rows): an input plane is copied into a zero-padded scratch plane, so
  that every window lies inside it; then each output row is computed V (16) outputs at
  a time, the sum over the kernel's taps held in vector registers (GCC's and Clang's
  vector extension) and stored once; the forward keeps four independent chains of
  additions, four blocks of V along a long row or one block of four rows where rows
  are shorter than 4 V (with one chain, waiting on its additions' latency, 144 planes
  of 16 x 16 with a 3 x 3 filter took 105 us; with four, 59 us). The forward sums
  over its group's input channels per output plane ``(b, k)``; the derivative in the
  filter, per filter plane ``(k, c)``, keeps V partial sums per tap over the batch and
  the rows (a short last block overlaps the one before, its repeated products masked
  to zero) and adds them up at the end. The derivative in the image with a stride
  scatters each row of dy into the image plane; with stride 1 :mod:`.conv` runs it as a
  forward with the flipped filter.
- **lanes** (short rows: 7 x 7, 4 x 4 planes): V channels side by side. Their planes
  are copied into one tile of the padded image, (*Q, V) with the channel last (a
  position's V lanes at a time), and every tap of every window is one vector operation
  over the V channels; the result is copied back into its planes (this form's C is
  in :mod:`.conv_lanes`).

The forward can apply a convolution's epilogue (bias and activation, as
:mod:`.pointwise` does) to each output plane as soon as it is done, while it is in
cache, instead of in a pass of its own afterwards (:func:`forward`'s ``epilogue``).

Stride 2 loads take the even elements of two vector loads. Sums are in the data's own
type (float32 or float64), as the BLAS of the im2col path does; they are not rounded
like NumPy's (another order), but no ``a * b + c`` is contracted (the toolchain's
``-ffp-contract=off``). Up to three spatial dimensions (fewer are given leading
dimensions of one). Planes or blocks of channels are spread over geon's own threads
(:func:`geon.transformers.fusion.run_blocks`) where a call has enough work
(:data:`PARALLEL_WORK`); each call lets go of the GIL while it computes.

The library is built and cached by :func:`geon.transformers.numpy.toolchain.build`
(the same compiler, flags, IEEE checks and cache trust rules as the fused groups). It
is not used (:func:`kernels` returns None, and the caller runs its NumPy code, im2col)
where ``GEON_COMPILED`` is ``0``, where no compiler or cache folder works (silently),
or where the build fails (after one :class:`~geon.errors.GeonWarning`).
"""


import ctypes
import math

import numpy as np

from geon.transformers import fusion
from geon.transformers.numpy import compiled, conv_lanes, conv_planes, pointwise, toolchain

#: Where the direct kernels are used (:func:`geon.transformers.numpy.conv._direct`):
#: at most this many input channels per group. Above, a matrix product over
#: ``C/groups * prod(kernel)`` does more useful work per element read than the direct
#: loops: with 4 (64 channels, 28 x 28, 3 x 3, batch 2, float32) the forward kernel
#: took as long as im2col and the derivatives' kernels twice as long; with 2 the
#: forward took 0.6 of im2col's time and the derivatives 1.1.
MAX_GROUP_CHANNELS = 2
#: The longest kernel dimension the direct kernels take: the rows kernels keep four
#: int64 per tap of the last one on the C stack (32 KB at this length; a worker
#: thread's stack may be small). Longer kernels run im2col.
MAX_KERNEL_LENGTH = 1024
#: A call is split over geon's threads from this many multiply-adds: below, handing
#: blocks to the threads costs more than it saves (2-core AMD EPYC, float32 depthwise
#: forward, one thread / two: 538 K multiply-adds 65 / 148 us, 768 K 73 / 95, 7.1 M
#: 537 / 368, 32.5 M 3,403 / 1,646).
PARALLEL_WORK = 1 << 22
#: Channels side by side in the lanes kernels, and outputs of a row computed at once
#: by the rows kernels (one vector of float32 with AVX-512): the C source's V, fixed
#: (its EVENS assume 16).
LANES = 16
#: The lanes kernels are used for output rows shorter than this (the rows kernels
#: compute V outputs of a row at a time; twice as long for the derivative in the image
#: with a stride, whose rows kernel scatters a row at a time), where one tile of the
#: padded image for LANES channels takes at most LANE_TILE_BYTES.
LANE_ROWS = 16
LANE_TILE_BYTES = 1 << 20
#: Depthwise forwards of the geometries :func:`.conv_planes.takes` run the planes form
#: (not the rows or lanes forms). A 2.3 GHz Xeon with AVX-512, one thread, float32,
#: ReLU6 epilogue, batch 2, 3 x 3, rows / lanes / planes: 96 channels of 32 x 32 at
#: stride 2 70 / 131 / 34 us, 144 of 16 x 16 at stride 1 65 / 98 / 31, 32 of 32 x 32
#: 46 / 164 / 24 (ONNX Runtime's layers in MobileNet-v2: 26, 40 and 35 us); and the
#: masked form, lanes / masked: 192 channels of 8 x 8 30-40 / 20 alone, 30 / 21 inside
#: MobileNet-v2's forward (ONNX Runtime: 16); two runs each, including the call: 384
#: channels of 4 x 4 17 / 11, 576 of 4 x 4 24 / 15, 144 of 16 x 16 at stride 2 35 /
#: 24 (ONNX Runtime inside MobileNet-v2: 12, 15 and 14), 192 of 8 x 8 at stride 2 14 /
#: 10.5; 5 x 5: 144 of 16 x 16 at stride 2 55-62 / 38-39, 240 of 8 x 8 46-51 / 44-45,
#: 672 of 4 x 4 39-43 / 33-36 (EfficientNet-B0: 17, 22 and 18).
PLANES = True

#: V: the lanes of a vector value; EVENS: the indices of the even elements of
#: xu[0 .. 2V - 2] in lo = xu[0 .. V - 1] followed by hi = xu[V - 1 .. 2V - 2] (V = 16)
_HEADER = r"""#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
""" + toolchain.BUFFER_API + toolchain.MINMAX + r"""

#define V 16
#define EVENS 0, 2, 4, 6, 8, 10, 12, 14, 17, 19, 21, 23, 25, 27, 29, 31
"""

_TEMPLATE = pointwise.EPILOGUE + r"""
static REAL *scratch_SUF(int64_t n) {
    return malloc((size_t)(n > 0 ? n : 1) * sizeof(REAL));
}

/* A forward's epilogue (NULL: none): final = act(y + bias[k]) (pointwise's epi), each
   output plane as soon as it is done, while it is in cache. final may be y itself. */
typedef struct { REAL *final; const REAL *bias; REAL lo, hi; int act; } epilogue_SUF;

static void finish_SUF(const epilogue_SUF *e, const REAL *y, int64_t plane, int64_t K,
                       int64_t Pn) {
    epi_run_SUF(e->final + plane * Pn, y, Pn, e->bias[plane % K], e->lo, e->hi, e->act);
}

/* the positions j in [0, n) whose input j * s + off lies in [0, len) */
static void span_SUF(int64_t off, int64_t s, int64_t len, int64_t n, int64_t *lo,
                     int64_t *hi) {
    int64_t a = off < 0 ? (-off + s - 1) / s : 0;
    int64_t b = off <= len - 1 ? (len - 1 - off) / s + 1 : 0;
    if (b > n) b = n;
    *lo = a < b ? a : b;
    *hi = b;
}

/* d[j * s + off] += v * y[j] for j in [lo, hi) */
static void scatter_SUF(REAL *restrict d, const REAL *restrict y, REAL v, int64_t lo,
                        int64_t hi, int64_t s, int64_t off) {
    if (s == 1) {
        for (int64_t j = lo; j < hi; j++) d[j + off] += v * y[j];
    } else if (s == 2) {
        for (int64_t j = lo; j < hi; j++) d[2 * j + off] += v * y[j];
    } else {
        for (int64_t j = lo; j < hi; j++) d[j * s + off] += v * y[j];
    }
}

/* Calls BODY for every pair of an output row (od, oh) and a kernel row (kd, kh) whose
   input row (id, ih) is inside the image, with orow / irow the offsets of those rows in
   a plane; then BODY loops over kw with the spans jl[kw], jh[kw] and offsets jo[kw]. */
#define ROWS(BODY) \
    for (int64_t od = 0; od < P0; od++) \
    for (int64_t kd = 0; kd < R0; kd++) { \
        const int64_t id = od * s0 + kd * d0 - p0; \
        if (id < 0 || id >= S0) continue; \
        for (int64_t oh = 0; oh < P1; oh++) \
        for (int64_t kh = 0; kh < R1; kh++) { \
            const int64_t ih = oh * s1 + kh * d1 - p1; \
            if (ih < 0 || ih >= S1) continue; \
            const int64_t orow = (od * P1 + oh) * P2, irow = (id * S1 + ih) * S2; \
            const int64_t tap = (kd * R1 + kh) * R2; \
            BODY \
        } \
    }

#define GEOMETRY \
    const int64_t C = g[1], K = g[2], Cg = g[3], Kg = g[4]; \
    const int64_t S0 = g[5], S1 = g[6], S2 = g[7], R0 = g[8], R1 = g[9], R2 = g[10]; \
    const int64_t P0 = g[11], P1 = g[12], P2 = g[13], s0 = g[14], s1 = g[15]; \
    const int64_t s2 = g[16], d0 = g[17], d1 = g[18], d2 = g[19], p0 = g[20]; \
    const int64_t p1 = g[21], p2 = g[22]; \
    const int64_t Sn = S0 * S1 * S2, Rn = R0 * R1 * R2, Pn = P0 * P1 * P2; \
    const int64_t Q0 = g[23], Q1 = g[24], Q2 = g[25], Qn = Q0 * Q1 * Q2; \
    int64_t jl[R2], jh[R2], jo[R2], ko[R2]; \
    for (int64_t kw = 0; kw < R2; kw++) { \
        jo[kw] = kw * d2 - p2; \
        ko[kw] = kw * d2; \
        span_SUF(jo[kw], s2, S2, P2, &jl[kw], &jh[kw]); \
    } \
    (void)K; (void)Kg; (void)Rn; (void)Sn; (void)Pn; (void)C; (void)Qn; (void)ko;

/* o[j] = the sum over rows m < n and kernel columns kw of wr[m][kw] * xr[m][j * s +
   jo[kw]], for j in [0, P2): one output at a time (rows shorter than V) */
static void short_SUF(REAL *restrict o, const REAL *const *xr, const REAL *const *wr,
                      int64_t n, int64_t R2, const int64_t *jo, int64_t s, int64_t P2) {
    for (int64_t j = 0; j < P2; j++) {
        REAL acc = 0;
        for (int64_t m = 0; m < n; m++)
            for (int64_t kw = 0; kw < R2; kw++) acc += wr[m][kw] * xr[m][j * s + jo[kw]];
        o[j] = acc;
    }
}

/* V elements in one value (GCC's and Clang's vector extension): the compiler keeps it
   in vector registers and loads it with unaligned vector loads */
typedef REAL vec_SUF __attribute__((vector_size(V * sizeof(REAL))));
typedef IREAL ivec_SUF __attribute__((vector_size(V * sizeof(REAL))));

/* the V inputs xu[2 * t]: two vector loads (the second from xu + V - 1, so that
   nothing after xu[2 * V - 2] is read) and one shuffle */
static inline vec_SUF load2_SUF(const REAL *xu) {
    vec_SUF lo, hi;
    memcpy(&lo, xu, sizeof lo);
    memcpy(&hi, xu + V - 1, sizeof hi);
#if defined(__clang__) || __GNUC__ >= 12
    return __builtin_shufflevector(lo, hi, EVENS);
#else
    return __builtin_shuffle(lo, hi, (ivec_SUF){EVENS});
#endif
}

/* xv = the V inputs xu[t * st] */
#define LOAD(xv, xu, st) \
    if (st == 1) { \
        memcpy(&xv, xu, sizeof xv); \
    } else if (st == 2) { \
        xv = load2_SUF(xu); \
    } else { \
        for (int t = 0; t < V; t++) xv[t] = (xu)[t * st]; \
    }

/* the same for U blocks of V outputs: block u starts at o + j0 + u * ostep and reads
   its inputs u * xstep further on (the next V outputs of the row: ostep V, xstep V *
   s; the same V outputs of the next output row: ostep P2, xstep the rows between
   two output rows' inputs). The sums in U vectors of accumulators (independent chains
   of additions), stored once; ST is the stride s where it is known when compiling
   (1, 2), else 0 */
#define BLOCK(U, ST) \
static void block##U##_##ST##_SUF(REAL *restrict o, const REAL *const *xr, \
                                  const REAL *const *wr, int64_t n, int64_t R2, \
                                  const int64_t *jo, int64_t s, int64_t j0, \
                                  int64_t xstep, int64_t ostep) { \
    const int64_t st = ST ? ST : s; \
    vec_SUF acc[U] = {{0}}, xv = {0}; \
    for (int64_t m = 0; m < n; m++) \
        for (int64_t kw = 0; kw < R2; kw++) { \
            const REAL *xp = xr[m] + j0 * st + jo[kw], v = wr[m][kw]; \
            for (int u = 0; u < U; u++) { \
                LOAD(xv, xp + u * xstep, st) \
                acc[u] += v * xv; \
            } \
        } \
    for (int u = 0; u < U; u++) memcpy(o + j0 + u * ostep, &acc[u], sizeof acc[u]); \
}
BLOCK(1, 0)
BLOCK(1, 1)
BLOCK(1, 2)
BLOCK(4, 0)
BLOCK(4, 1)
BLOCK(4, 2)
#undef BLOCK

typedef void (*block_SUF)(REAL *restrict, const REAL *const *, const REAL *const *,
                          int64_t, int64_t, const int64_t *, int64_t, int64_t, int64_t,
                          int64_t);

/* the same for j in [0, P2), P2 >= V: blocks of 4 V, then of V, the last V
   overlapping the block before */
static void row_SUF(REAL *restrict o, const REAL *const *xr, const REAL *const *wr,
                    int64_t n, int64_t R2, const int64_t *jo, int64_t s, int64_t P2) {
    block_SUF one = s == 1 ? block1_1_SUF : s == 2 ? block1_2_SUF : block1_0_SUF;
    block_SUF four = s == 1 ? block4_1_SUF : s == 2 ? block4_2_SUF : block4_0_SUF;
    const int64_t st = V * s;
    int64_t j0 = 0;
    for (; j0 + 4 * V <= P2; j0 += 4 * V) four(o, xr, wr, n, R2, jo, s, j0, st, V);
    for (; j0 + V <= P2; j0 += V) one(o, xr, wr, n, R2, jo, s, j0, st, V);
    if (j0 < P2) one(o, xr, wr, n, R2, jo, s, P2 - V, st, V);
}

/* the same for four output rows at once, V <= P2 < 4 V (too short for row_SUF's
   blocks of 4 V): the rows from o, P2 apart, whose inputs are xstep apart; each
   block of V outputs of the four rows in four chains of additions */
static void rows4_SUF(REAL *restrict o, const REAL *const *xr, const REAL *const *wr,
                      int64_t n, int64_t R2, const int64_t *jo, int64_t s, int64_t P2,
                      int64_t xstep) {
    block_SUF four = s == 1 ? block4_1_SUF : s == 2 ? block4_2_SUF : block4_0_SUF;
    int64_t j0 = 0;
    for (; j0 + V <= P2; j0 += V) four(o, xr, wr, n, R2, jo, s, j0, xstep, P2);
    if (j0 < P2) four(o, xr, wr, n, R2, jo, s, P2 - V, xstep, P2);
}

/* T (Q0, Q1, Q2) = zero, with the plane src (S0, S1, S2) at offset (q0, q1, q2) */
static void pad_SUF(REAL *restrict T, const REAL *restrict src, const int64_t *Q,
                    const int64_t *S, const int64_t *q) {
    memset(T, 0, Q[0] * Q[1] * Q[2] * sizeof(REAL));
    for (int64_t i0 = 0; i0 < S[0]; i0++)
        for (int64_t i1 = 0; i1 < S[1]; i1++)
            memcpy(T + ((i0 + q[0]) * Q[1] + i1 + q[1]) * Q[2] + q[2],
                   src + (i0 * S[1] + i1) * S[2], S[2] * sizeof(REAL));
}

/* y (B, K, *P) = x (B, C, *S) correlated with w (K, Cg, *R): output planes [lo, hi).
   The input planes of a group are copied into zero-padded scratch X (Q, as the lanes
   tiles), so every window is inside; each output row sums over xr / wr, its input and
   filter rows, V outputs at a time in registers (row_SUF). */
static int forward_e_SUF(const REAL *restrict x, const REAL *restrict w,
                         REAL *restrict y, const int64_t *g, int64_t lo, int64_t hi,
                         const epilogue_SUF *e) {
    GEOMETRY
    REAL *X = scratch_SUF(Cg * Qn);
    const REAL **xr = malloc(2 * (Cg * R0 * R1 + 1) * sizeof(REAL *));
    if (!X || !xr) {
        free(X);
        free(xr);
        return 1;
    }
    const REAL **wr = xr + Cg * R0 * R1 + 1;
    int64_t padded = -1;  /* the (b, group) whose planes X holds */
    for (int64_t plane = lo; plane < hi; plane++) {
        const int64_t b = plane / K, k = plane % K, grp = k / Kg;
        if (padded != b * C + grp * Cg)
            for (int64_t c = 0; c < Cg; c++)
                pad_SUF(X + c * Qn, x + (b * C + grp * Cg + c) * Sn, g + 23, g + 5,
                        g + 20);
        padded = b * C + grp * Cg;
        for (int64_t od = 0; od < P0; od++)
        for (int64_t oh = 0; oh < P1;) {
            int64_t n = 0;
            for (int64_t c = 0; c < Cg; c++)
            for (int64_t kd = 0; kd < R0; kd++)
            for (int64_t kh = 0; kh < R1; kh++) {
                xr[n] = X + c * Qn + ((od * s0 + kd * d0) * Q1 + oh * s1 + kh * d1) * Q2;
                wr[n++] = w + (k * Cg + c) * Rn + (kd * R1 + kh) * R2;
            }
            REAL *o = y + plane * Pn + (od * P1 + oh) * P2;
            if (P2 < V) {
                short_SUF(o, xr, wr, n, R2, ko, s2, P2);
                oh++;
            } else if (P2 < 4 * V && oh + 4 <= P1) {
                rows4_SUF(o, xr, wr, n, R2, ko, s2, P2, s1 * Q2);
                oh += 4;
            } else {
                row_SUF(o, xr, wr, n, R2, ko, s2, P2);
                oh++;
            }
        }
        if (e) finish_SUF(e, y + plane * Pn, plane, K, Pn);
    }
    free(X);
    free(xr);
    return 0;
}

static int geon_dconv_forward_SUF(const REAL *x, const REAL *w, REAL *y,
                                  const int64_t *g, int64_t lo, int64_t hi) {
    return forward_e_SUF(x, w, y, g, lo, hi, NULL);
}

/* dx (B, C, *S) = the transpose of the forward in x applied to dy: image planes */
int geon_dconv_grad_data_SUF(const REAL *restrict dy, const REAL *restrict w,
                              REAL *restrict dx, const int64_t *g, int64_t lo,
                              int64_t hi) {
    GEOMETRY
    for (int64_t plane = lo; plane < hi; plane++) {
        const int64_t b = plane / C, ci = plane % C, grp = ci / Cg, c = ci % Cg;
        REAL *d = dx + plane * Sn;
        memset(d, 0, Sn * sizeof(REAL));
        for (int64_t q = 0; q < Kg; q++) {
            const int64_t k = grp * Kg + q;
            const REAL *yi = dy + (b * K + k) * Pn;
            const REAL *wk = w + (k * Cg + c) * Rn;
            ROWS(for (int64_t kw = 0; kw < R2; kw++)
                     scatter_SUF(d + irow, yi + orow, wk[tap + kw], jl[kw], jh[kw], s2,
                                 jo[kw]);)
        }
    }
    return 0;
}

/* One output row's share of the derivative in the filter: for each kernel row m (the
   input row xr[m], the taps from tp[m]) and column kw, the sum over j < P2 of y[j] *
   xr[m][j * s + jo[kw]]: added to a[tap] for rows shorter than V, else to the V
   partial sums A[tap * V ...], summed in a register over the row's blocks of V
   outputs (a last V overlaps the block before, its repeated products masked to +0).
   ST as in BLOCK. */
#define GRAD_ROW(ST) \
static void grad_row_##ST##_SUF(REAL *restrict A, REAL *restrict a, \
                                const REAL *restrict y, const REAL *const *xr, \
                                const int64_t *tp, int64_t n, int64_t R2, \
                                const int64_t *jo, int64_t s, int64_t P2) { \
    const int64_t st = ST ? ST : s; \
    if (P2 < V) { \
        for (int64_t m = 0; m < n; m++) \
            for (int64_t kw = 0; kw < R2; kw++) \
                for (int64_t j = 0; j < P2; j++) \
                    a[tp[m] + kw] += y[j] * xr[m][j * st + jo[kw]]; \
        return; \
    } \
    const int64_t full = P2 / V * V, at = P2 - V; \
    ivec_SUF keep; \
    for (int t = 0; t < V; t++) keep[t] = at + t >= full ? -1 : 0; \
    vec_SUF yv, xv = {0}, sum; \
    for (int64_t m = 0; m < n; m++) \
        for (int64_t kw = 0; kw < R2; kw++) { \
            const REAL *xm = xr[m] + jo[kw]; \
            REAL *Au = A + (tp[m] + kw) * V; \
            memcpy(&sum, Au, sizeof sum); \
            for (int64_t j0 = 0; j0 < full; j0 += V) { \
                memcpy(&yv, y + j0, sizeof yv); \
                LOAD(xv, xm + j0 * st, st) \
                sum += yv * xv; \
            } \
            if (full < P2) { \
                memcpy(&yv, y + at, sizeof yv); \
                LOAD(xv, xm + at * st, st) \
                sum += (vec_SUF)((ivec_SUF)(yv * xv) & keep); \
            } \
            memcpy(Au, &sum, sizeof sum); \
        } \
}
GRAD_ROW(0)
GRAD_ROW(1)
GRAD_ROW(2)
#undef GRAD_ROW
#undef LOAD

/* dw (K, Cg, *R) = the transpose of the forward in w applied to dy: filter planes
   (k, c), a row of dy at a time, the input plane copied into zero-padded scratch X
   (see the forward) */
int geon_dconv_grad_filter_SUF(const REAL *restrict x, const REAL *restrict dy,
                               REAL *restrict dw, const int64_t *g, int64_t lo,
                               int64_t hi) {
    GEOMETRY
    const int64_t B = g[0];
    REAL *A = scratch_SUF(Rn * (V + 1)), *X = scratch_SUF(Qn);
    const REAL **xr = malloc((R0 * R1 + 1) * (sizeof(REAL *) + sizeof(int64_t)));
    if (!A || !X || !xr) {
        free(A);
        free(X);
        free(xr);
        return 1;
    }
    REAL *a = A + Rn * V;
    int64_t *tp = (int64_t *)(xr + R0 * R1 + 1);
    void (*row)(REAL *restrict, REAL *restrict, const REAL *restrict,
                const REAL *const *, const int64_t *, int64_t, int64_t, const int64_t *,
                int64_t, int64_t) =
        s2 == 1 ? grad_row_1_SUF : s2 == 2 ? grad_row_2_SUF : grad_row_0_SUF;
    for (int64_t plane = lo; plane < hi; plane++) {
        const int64_t k = plane / Cg, c = plane % Cg, grp = k / Kg;
        memset(A, 0, Rn * (V + 1) * sizeof(REAL));
        for (int64_t b = 0; b < B; b++) {
            pad_SUF(X, x + (b * C + grp * Cg + c) * Sn, g + 23, g + 5, g + 20);
            const REAL *yi = dy + (b * K + k) * Pn;
            for (int64_t od = 0; od < P0; od++)
            for (int64_t oh = 0; oh < P1; oh++) {
                int64_t n = 0;
                for (int64_t kd = 0; kd < R0; kd++)
                for (int64_t kh = 0; kh < R1; kh++) {
                    xr[n] = X + ((od * s0 + kd * d0) * Q1 + oh * s1 + kh * d1) * Q2;
                    tp[n++] = (kd * R1 + kh) * R2;
                }
                row(A, a, yi + (od * P1 + oh) * P2, xr, tp, n, R2, ko, s2, P2);
            }
        }
        for (int64_t t = 0; t < Rn; t++) {
            REAL sum = a[t];
            for (int l = 0; l < V; l++) sum += A[t * V + l];
            dw[plane * Rn + t] = sum;
        }
    }
    free(A);
    free(X);
    free(xr);
    return 0;
}

""" + conv_lanes.TEMPLATE + conv_planes.TEMPLATE + r"""
/* The entries Python calls (GIL held), their arguments one tuple (arrays, geometry's
   address, lo, hi): the arrays a tuple (a, b, out), all C-contiguous, out written; the
   kernel over items [lo, hi) without the GIL. -1: a Python error set (an array not
   contiguous, an argument of another type, ...), else the kernel's status (1: no
   memory). */
#define ENTRY(name) \
int geon_dconv_##name##_SUF_call(void *args) { \
    static const int flags[3] = {0, 0, GEON_WRITABLE};   /* (contiguous) */ \
    long long iv[3]; \
    geon_buffer v[3]; \
    if (!geon_args(args, "iii", iv, NULL) \
            || !geon_acquire(v, PyTuple_GetItem(args, 0), flags, 3)) return -1; \
    void *const state = PyEval_SaveThread(); \
    const int status = geon_dconv_##name##_SUF(v[0].buf, v[1].buf, v[2].buf, \
                                               (const int64_t *)(intptr_t)iv[0], iv[1], \
                                               iv[2]); \
    PyEval_RestoreThread(state); \
    geon_release(v, 3); \
    return status; \
}
ENTRY(forward) ENTRY(grad_data) ENTRY(grad_filter)
ENTRY(lanes_forward) ENTRY(lanes_grad_data) ENTRY(lanes_grad_filter)
ENTRY(planes_forward) ENTRY(masked_forward)
#undef ENTRY
static int apart_SUF(const geon_buffer *a, const geon_buffer *b) {
    const char *s = a->buf, *t = b->buf;
    return s + a->len <= t || t + b->len <= s;
}
/* The forwards with an epilogue: arguments (arrays, geometry's address, lo, hi, clo,
   chi, act), the arrays (x, w, y, final, bias); 2 (nothing written) where final
   overlaps x, w or bias, or y without being y, or y overlaps bias. final may be x
   itself (a plan gives a dead input's memory to the result) where each output plane
   reads one input plane, the same (b, k) (depthwise, x's shape = final's): both forms
   copy an input plane before computing from it, and the plane of final written after
   that is the one just copied. */
#define EPI_ENTRY(name) \
int geon_dconv_##name##_epi_SUF_call(void *args) { \
    static const int flags[5] = {0, 0, GEON_WRITABLE, GEON_WRITABLE, 0}; \
    long long iv[4]; \
    double dv[2]; \
    geon_buffer v[5]; \
    if (!geon_args(args, "iiiddi", iv, dv) \
            || !geon_acquire(v, PyTuple_GetItem(args, 0), flags, 5)) return -1; \
    const int64_t *const g = (const int64_t *)(intptr_t)iv[0]; \
    int status = 2; \
    const int over_x = v[3].buf == v[0].buf && v[3].len == v[0].len && g[3] == 1 \
                       && g[4] == 1; \
    if ((over_x || apart_SUF(&v[3], &v[0])) && apart_SUF(&v[3], &v[1]) \
            && apart_SUF(&v[3], &v[4]) \
            && apart_SUF(&v[2], &v[4]) \
            && ((v[3].buf == v[2].buf && v[3].len == v[2].len) \
                || apart_SUF(&v[3], &v[2]))) { \
        const epilogue_SUF e = {v[3].buf, v[4].buf, (REAL)dv[0], (REAL)dv[1], \
                                (int)iv[3]}; \
        void *const state = PyEval_SaveThread(); \
        status = name##_e_SUF(v[0].buf, v[1].buf, v[2].buf, g, iv[1], iv[2], &e); \
        PyEval_RestoreThread(state); \
    } \
    geon_release(v, 5); \
    return status; \
}
EPI_ENTRY(forward) EPI_ENTRY(lanes_forward) EPI_ENTRY(planes_forward)
EPI_ENTRY(masked_forward)
#undef EPI_ENTRY
#undef LANES_GEOMETRY
#undef WINDOWS
#undef ROWS
#undef GEOMETRY
"""

#: dtype -> (C type, an integer type of its size, suffix)
_TYPES = {np.dtype(np.float32): ("float", "int32_t", "f32"),
          np.dtype(np.float64): ("double", "int64_t", "f64")}
_NAMES = ("forward", "grad_data", "grad_filter")
_KINDS = ("", "lanes_")
#: The forms of the depthwise forward alone (:mod:`.conv_planes`).
_FORWARD_ONLY = ("planes_", "masked_")


def source():
    """The C source of the kernels, for float32 and float64."""
    parts = [_HEADER + pointwise.simd_exp()]
    for dtype, (_, integer, _) in _TYPES.items():
        parts.append(pointwise.specialize(_TEMPLATE.replace("IREAL", integer), dtype))
    return "\n".join(parts)


_SYMBOLS = [f"geon_dconv_{k}{n}_{s}_call" for k in _KINDS
            for n in _NAMES + ("forward_epi",) for _, _, s in _TYPES.values()] + [
    f"geon_dconv_{k}{n}_{s}_call" for k in _FORWARD_ONLY
    for n in ("forward", "forward_epi") for _, _, s in _TYPES.values()]


_loaded = {}  # (CC, cache folder) -> {(kind, name, dtype): ctypes function}, or None


def _bind(lib):
    """The entries, each taking its arguments as one tuple: ``(arrays, geometry's
    address, lo, hi)``, and ``(..., clo, chi, act)`` for "forward_epi"."""
    proto = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object)
    fns = {}
    for kind in _KINDS + _FORWARD_ONLY:
        for name in (_NAMES if kind in _KINDS else _NAMES[:1]) + ("forward_epi",):
            for dtype, (_, _, suffix) in _TYPES.items():
                fns[kind, name, dtype] = proto((f"geon_dconv_{kind}{name}_{suffix}_call",
                                                lib))
    return fns


def kernels():
    """``{(kind, name, dtype): ctypes function}`` of the direct kernels, or None where
    the compiled path is off or cannot run here (see the module docstring)."""
    return compiled.fixed_library(_loaded, "direct convolution kernels", source,
                                  _SYMBOLS, _bind)


def usable(a, b, out, pads=()):
    """Whether the direct kernels take ``a``, ``b``, ``out`` (padding ``pads``): one float
    dtype, 1-3 spatial dims, no negative padding, out contiguous, writable, apart."""
    return (1 <= out.ndim - 2 <= 3 and a.dtype == b.dtype == out.dtype
            and all(lo >= 0 for lo, _ in pads)
            and out.dtype in _TYPES and out.flags.c_contiguous and out.flags.writeable
            and not np.may_share_memory(out, a) and not np.may_share_memory(out, b))


def _geometry(x_shape, w_shape, y_shape, strides, pads, dilation, groups):
    """The int64 geometry array the kernels read (3 spatial dims, leading ones added):
    B, C, K, C/groups, K/groups, S, R, P, strides, dilation, padding before, and Q,
    the extent of the padded image a lanes tile holds."""
    lead = 3 - len(strides)
    S = (1,) * lead + tuple(x_shape[2:])
    R = (1,) * lead + tuple(w_shape[2:])
    P = (1,) * lead + tuple(y_shape[2:])
    st = (1,) * lead + tuple(strides)
    dl = (1,) * lead + tuple(dilation)
    lo = (0,) * lead + tuple(p for p, _ in pads)
    Q = tuple(max(n + p, (m - 1) * s + (r - 1) * d + 1)
              for n, p, m, s, r, d in zip(S, lo, P, st, R, dl))
    B, C = x_shape[:2]
    K = y_shape[1]
    return np.array((B, C, K, C // groups, K // groups) + S + R + P + st + dl + lo + Q,
                    np.int64)


#: The plans of calls seen, by geometry: see :func:`_plan`. A process meets few
#: geometries (those of its models' layers); past this many the cache starts afresh.
MAX_PLANS = 4096
_plans = {}


def _plan(fns, name, x_shape, w_shape, y_shape, strides, pads, dilation, groups, dtype):
    """``(fns, kind, fn, geo, geo's address, items, work)`` of kernel ``name`` on a
    call of this geometry: the lanes kernel (kind "lanes_") for short output rows (see
    :data:`LANE_ROWS`), else the rows kernel (kind ""); its items (planes or blocks of
    channels), and its multiply-adds. Built once per geometry (a layer's call takes a
    dict lookup, not the ~15 microseconds of building the geometry array and choosing
    the kernel again)."""
    key = (id(fns), name, x_shape, w_shape, y_shape, strides, pads, dilation, groups,
           dtype, LANE_ROWS, LANE_TILE_BYTES, PLANES)
    try:
        return _plans[key]
    except KeyError:
        pass
    except TypeError:  # (lists for tuples: not kept)
        key = None
    geo = _geometry(x_shape, w_shape, y_shape, strides, pads, dilation, groups)
    B, C, K, Cg = (int(n) for n in geo[:4])
    lanes = geo[13] < LANE_ROWS * (2 if name == "grad_data" else 1) and \
        int(np.prod(geo[23:26])) * LANES * dtype.itemsize <= LANE_TILE_BYTES
    if lanes:
        blocks = -(-(C if name == "grad_data" else K) // LANES)
        items = blocks if name == "grad_filter" else B * blocks
    else:
        items = K * Cg if name == "grad_filter" else B * (C if name == "grad_data" else K)
    # multiply-adds: every output of the forward (every element of dy in the
    # derivatives) times a filter's C/groups * prod(kernel)
    work = B * K * math.prod(y_shape[2:]) * Cg * math.prod(w_shape[2:])
    kind = "lanes_" if lanes else ""
    special = conv_planes.form(geo, name) if PLANES else None
    if special:
        kind, items = special, B * K
    plan = (fns, kind, fns[kind, name, dtype], geo, geo.ctypes.data, items, work)
    if key is not None:
        if len(_plans) >= MAX_PLANS:
            _plans.clear()
        _plans[key] = plan
    return plan


def _run(plan, args, variant=None, extra=()):
    """The planned kernel (see :func:`_plan`), or its form's ``variant``
    ("forward_epi", taking ``extra`` arguments), on ``args`` (arrays) over its items,
    split over geon's threads when its work is large (:data:`PARALLEL_WORK`); False
    where the kernel found its arrays overlapping (an epilogue's: nothing written)."""
    fns, kind, fn, _, geo, items, work = plan
    if variant is not None:
        fn = fns[kind, variant, args[2].dtype]
    threads = fusion.MAX_THREADS if work >= PARALLEL_WORK else 1
    apart = []

    def call(lo, hi):
        status = fn((args, geo, lo, hi) + extra)   # (-1: ctypes raises the entry's error)
        if status == 1:
            raise MemoryError("no memory for the scratch of a convolution kernel")
        apart.append(status != 2)   # (2: every call, before writing anything)
    if threads < 2 or items < 2:
        call(0, items)
    else:
        fusion.run_blocks(call, items, max(1, -(-items // (4 * threads))),
                          [()] * threads)
    return all(apart)


def forward(fns, x, w, out, strides, pads, dilation, groups, epilogue=None):
    """``out`` = x correlated with w (see :func:`geon.transformers.numpy.conv.
    conv_forward`), by a direct kernel. ``epilogue``: None, or ``(final, bias, lo, hi,
    act)`` as conv_forward's, applied to each output plane as it is done; then False
    (nothing written) where ``final`` or ``bias`` overlap what they must not (see the
    C entry) or are not contiguous, else True."""
    run = prepared_forward(fns, x, w, out, strides, pads, dilation, groups, epilogue)
    final, bias = (None, None) if epilogue is None else epilogue[:2]
    return run(x, w, out, final, bias)


def prepared_forward(fns, x, w, out, strides, pads, dilation, groups, epilogue=None):
    """:func:`forward` decided once for operands of these shapes, dtypes and layouts
    (and this epilogue's settings): a callable ``(x, w, out, final, bias)`` -> done,
    which holds no array (``final`` and ``bias`` None without an epilogue)."""
    plan = _plan(fns, "forward", x.shape, w.shape, out.shape, strides, pads, dilation,
                 groups, out.dtype)
    one = plan[6] < PARALLEL_WORK or fusion.MAX_THREADS < 2 or plan[5] < 2  # one call
    if epilogue is None:
        def run(x, w, out, final, bias):
            _run(plan, (np.ascontiguousarray(x), np.ascontiguousarray(w), out))
            return True
        if one:
            run.step = lambda x, w, out, final, bias: _step(
                plan, plan[2], (x, w, out), (), run)
        return run
    final, bias, lo, hi, act = epilogue
    if not (final.dtype == bias.dtype == out.dtype and final.shape == out.shape
            and final.flags.c_contiguous and bias.flags.c_contiguous
            and bias.size == out.shape[1]):
        return lambda x, w, out, final, bias: False
    fns, kind, fn, _, geo, items, work = plan
    extra = (lo, hi, pointwise.act_code(act, lo, hi))
    if work >= PARALLEL_WORK and fusion.MAX_THREADS > 1 and items > 1:
        return lambda x, w, out, final, bias: _run(
            plan, (np.ascontiguousarray(x), np.ascontiguousarray(w), out, final, bias),
            "forward_epi", extra)
    fn = fns[kind, "forward_epi", out.dtype]

    def run(x, w, out, final, bias, _plan=plan):   # (_plan holds geo's array)
        status = fn(((np.ascontiguousarray(x), np.ascontiguousarray(w), out, final, bias),
                     geo, 0, items) + extra)
        if status == 1:
            raise MemoryError("no memory for the scratch of a convolution kernel")
        return status != 2
    run.step = lambda x, w, out, final, bias: _step(plan, fn, (x, w, out, final, bias),
                                                     extra, run)
    return run


def _step(plan, fn, arrays, extra, keep):
    """The steps (segments.py) of ``fn``'s one call over the plan's items, or None
    where x or w are not contiguous (the call copies them)."""
    if not (arrays[0].flags.c_contiguous and arrays[1].flags.c_contiguous):
        return None
    return [(fn, (arrays, plan[4], 0, plan[5]) + extra, keep)]


def grad_data(fns, dy, w, out, strides, pads, dilation, groups):
    """``out`` (B, C, *S) = the transpose of the forward in x applied to dy."""
    dy, w = np.ascontiguousarray(dy), np.ascontiguousarray(w)
    _run(_plan(fns, "grad_data", out.shape, w.shape, dy.shape, strides, pads, dilation,
               groups, out.dtype), (dy, w, out))


def grad_filter(fns, x, dy, out, strides, pads, dilation, groups):
    """``out`` (K, C/groups, *R) = the transpose of the forward in w applied to dy."""
    x, dy = np.ascontiguousarray(x), np.ascontiguousarray(dy)
    _run(_plan(fns, "grad_filter", x.shape, out.shape, dy.shape, strides, pads,
               dilation, groups, out.dtype), (x, dy, out))
