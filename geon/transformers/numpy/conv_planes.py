"""The planes and masked forms of the direct convolution kernels, in C (part of
:mod:`.conv_kernels`' source, which it follows in one translation unit: it uses that
source's macros, vectors and epilogue).

For a depthwise convolution (one input plane per output plane) with square 3 x 3 or
5 x 5 windows, "same" padding before (R / 2), stride 1 or 2, no dilation, and output
rows of at least V positions: the early layers of MobileNet and EfficientNet (32 x
32 and 16 x 16 planes at 64 x 64 images). The rows kernel copied each plane into a
zero-padded tile and took two loads and a shuffle per tap and output vector at
stride 2; the lanes kernel transposed planes of 256 positions into channels side by
side and back. Here an input plane is copied row by row between zero margins (no
rows above or below: rows outside the image are skipped), and eight output rows at
a time are summed in eight vectors (eight chains of additions): each input row in
reach is read once for them, as its R shifted vectors (stride 1: loads at the R
offsets), and every tap of every output row is one multiply-add
(fused). At stride 2 a row's vectors are loaded once, aligned, and the inputs of each
tap shuffled out of them (the evens, the odds, and those shifted by one): two
unaligned loads a tap, most across a cache line, took longer. The epilogue is
applied to the sums before they are stored (y is not written).

Planes of 8 to 15 positions a row at stride 1 (8 x 8, 12 x 12) under 3 x 3 windows
take the masked form where a plane is a whole number of vectors: each output vector is a run of whole
rows, and each tap one load at the tap's offset in the plane, its lanes outside the
plane cleared by a mask, and one multiply-add with the tap's weight (no copy of the
plane, no transposes). Both are measured against the other forms at
:data:`.conv_kernels.PLANES`.
"""

#: The zero margins left and right of each copied input row, in elements: at least as
#: far as the loads of a row reach past it (left: a vector, at stride 2; right: see
#: :func:`takes`); a vector's worth on the left keeps the rows' loads aligned.
MARGIN = 16
RIGHT = 32

#: C of the planes form. V = 16 (one vector of float32 under AVX-512); the indices of
#: two-vector shuffles: EVENS2 and ODDS2 the even and odd elements of the 2V; PREV1,
#: PREV2: the last and the last but one of the first vector, then the second's first V -
#: 1; NEXT1: the first vector's last V - 1, then the second's first.
TEMPLATE = r"""
#define MARGIN """ + str(MARGIN) + r"""
#define RIGHT """ + str(RIGHT) + r"""
#define PLANE_ROWS 8
#define EVENS2 """ + ", ".join(str(2 * i) for i in range(16)) + r"""
#define ODDS2 """ + ", ".join(str(2 * i + 1) for i in range(16)) + r"""
#define PREV1 15, """ + ", ".join(str(16 + i) for i in range(15)) + r"""
#define PREV2 14, """ + ", ".join(str(16 + i) for i in range(15)) + r"""
#define NEXT1 """ + ", ".join(str(1 + i) for i in range(16)) + r"""

static inline vec_SUF at_SUF(const REAL *p) {
    vec_SUF v;
    memcpy(&v, p, sizeof v);
    return v;
}

#if defined(__clang__) || __GNUC__ >= 12
#define SHUF2_SUF(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define SHUF2_SUF(a, b, ...) __builtin_shuffle(a, b, (ivec_SUF){__VA_ARGS__})
#endif

/* xs[kw] = the V inputs p[2t + kw - R / 2], t < V, at stride 2: from the vectors at p -
   V, p, p + V (and p + 2V for R = 5; aligned where p is), the even and odd elements
   of the middle two shuffled out, and those shifted by one with an element of a
   neighbour (three shuffles a row where two unaligned loads each took more: most
   cross a cache line) */
static inline void stride2_SUF(vec_SUF *xs, const REAL *p, int R) {
    const vec_SUF z = at_SUF(p - V), a = at_SUF(p), b = at_SUF(p + V);
    const vec_SUF e = SHUF2_SUF(a, b, EVENS2), o = SHUF2_SUF(a, b, ODDS2);
    if (R == 3) {
        xs[0] = SHUF2_SUF(z, o, PREV1);
        xs[1] = e;
        xs[2] = o;
    } else {
        xs[0] = SHUF2_SUF(z, e, PREV2);
        xs[1] = SHUF2_SUF(z, o, PREV1);
        xs[2] = e;
        xs[3] = o;
        xs[4] = SHUF2_SUF(e, at_SUF(p + 2 * V), NEXT1);
    }
}

VCLAMP_SUF(vec_SUF, ivec_SUF)

/* Output rows [oh0, oh0 + PLANE_ROWS) of one plane (those under P1), the V outputs
   from j0 of each: X, the copied input plane (S1 rows, ldq apart, each MARGIN elements after its
   row's start); wv, the R x R taps broadcast; o, the output plane; e: NULL, or the
   epilogue with bias b. */
#define PLANE(R, ST) \
__attribute__((optimize("fp-contract=fast"))) \
static void plane##R##_##ST##_SUF(const REAL *restrict X, int64_t ldq, int64_t S1, \
                                  const vec_SUF *restrict wv, REAL *restrict o, \
                                  int64_t P1, int64_t P2, int64_t oh0, int64_t j0, \
                                  const epilogue_SUF *e, REAL b) { \
    enum { H = R / 2, OB = PLANE_ROWS, IN = (OB - 1) * ST + R }; \
    vec_SUF acc[OB]; \
    _Pragma("GCC unroll 8") for (int ob = 0; ob < OB; ob++) acc[ob] = (vec_SUF){0}; \
    _Pragma("GCC unroll 16") for (int r = 0; r < IN; r++) { \
        const int64_t ih = oh0 * ST - H + r; \
        if (ih < 0 || ih >= S1) continue; \
        const REAL *row = X + ih * ldq + MARGIN + j0 * ST; \
        vec_SUF xs[R]; \
        if (ST == 2) { \
            stride2_SUF(xs, row, R); \
        } else { \
            _Pragma("GCC unroll 8") for (int kw = 0; kw < R; kw++) \
                xs[kw] = at_SUF(row + kw - H); \
        } \
        _Pragma("GCC unroll 8") for (int ob = 0; ob < OB; ob++) { \
            const int kh = r - ob * ST; \
            if (kh < 0 || kh >= R) continue; \
            _Pragma("GCC unroll 8") for (int kw = 0; kw < R; kw++) \
                acc[ob] += wv[kh * R + kw] * xs[kw]; \
        } \
    } \
    _Pragma("GCC unroll 8") for (int ob = 0; ob < OB; ob++) { \
        if (oh0 + ob >= P1) break; \
        REAL *out = o + (oh0 + ob) * P2 + j0; \
        if (!e) { \
            memcpy(out, &acc[ob], sizeof acc[ob]); \
            continue; \
        } \
        if (e->act == 0) { \
            const vec_SUF t = vclamp_SUF(acc[ob] + b, (vec_SUF){0} + e->lo, \
                                         (vec_SUF){0} + e->hi); \
            memcpy(out, &t, sizeof t); \
        } else { \
            epi_run_SUF(out, (const REAL *)&acc[ob], V, b, e->lo, e->hi, e->act); \
        } \
    } \
}
PLANE(3, 1)
PLANE(3, 2)
PLANE(5, 1)
PLANE(5, 2)
#undef PLANE

/* d[j] = s[j], j < n, in vectors where they fit (as a loop GCC calls memcpy: a call a
   row of 32 elements took longer than the row's taps) */
__attribute__((optimize("no-tree-loop-distribute-patterns")))
static void copy_row_SUF(REAL *restrict d, const REAL *restrict s, int64_t n) {
    int64_t j = 0;
    for (; j + V <= n; j += V) memcpy(d + j, s + j, V * sizeof(REAL));
    for (; j < n; j++) d[j] = s[j];
}

/* y (B, K, *P) = x correlated with w, depthwise (K = C, one channel a group), items:
   output planes [lo, hi). See the module's text for the geometries it takes (the
   caller's checks); a last partial vector of a row overlaps the one before. */
static int planes_forward_e_SUF(const REAL *restrict x, const REAL *restrict w,
                                REAL *restrict y, const int64_t *g, int64_t lo,
                                int64_t hi, const epilogue_SUF *e) {
    GEOMETRY
    /* rows a whole number of vectors long, from a cache line (the loads of a row at
       stride 2 aligned) */
    const int64_t ldq = (S2 + MARGIN + RIGHT + V - 1) / V * V;
    char *held = calloc((size_t)(S1 * ldq) * sizeof(REAL) + 64, 1);
    if (!held) return 1;
    REAL *X = (REAL *)(((uintptr_t)held + 63) & ~(uintptr_t)63);
    vec_SUF wv[25];
    for (int64_t plane = lo; plane < hi; plane++) {
        const int64_t k = plane % K;
        for (int64_t ih = 0; ih < S1; ih++)
            copy_row_SUF(X + ih * ldq + MARGIN, x + plane * Sn + ih * S2, S2);
        for (int64_t t = 0; t < Rn; t++) wv[t] = (vec_SUF){0} + w[k * Rn + t];
        REAL *o = (e ? e->final : y) + plane * Pn;
        const REAL b = e ? e->bias[k] : 0;
        for (int64_t oh0 = 0; oh0 < P1; oh0 += PLANE_ROWS)
            for (int64_t j = 0; j < P2; j += V) {
                const int64_t j0 = j + V <= P2 ? j : P2 - V;
                if (R2 == 3 && s2 == 1)
                    plane3_1_SUF(X, ldq, S1, wv, o, P1, P2, oh0, j0, e, b);
                else if (R2 == 3)
                    plane3_2_SUF(X, ldq, S1, wv, o, P1, P2, oh0, j0, e, b);
                else if (s2 == 1)
                    plane5_1_SUF(X, ldq, S1, wv, o, P1, P2, oh0, j0, e, b);
                else
                    plane5_2_SUF(X, ldq, S1, wv, o, P1, P2, oh0, j0, e, b);
            }
    }
    free(held);
    return 0;
}

static int geon_dconv_planes_forward_SUF(const REAL *x, const REAL *w, REAL *y,
                                         const int64_t *g, int64_t lo, int64_t hi) {
    return planes_forward_e_SUF(x, w, y, g, lo, hi, NULL);
}

/* The masked form: y (B, K, *P) = x correlated with w, depthwise, 3 x 3, stride 1,
   "same" (P = S), planes of a whole number of vectors (8 x 8), output planes [lo,
   hi). Each tap of each output vector is a load at the tap's offset in the input
   plane (a vector of whole rows, shifted by dh rows and dw columns) with the lanes
   whose input lies outside the plane cleared (a mask a vector and tap, made once a
   call), then a multiply-add (fused), one chain of sums a kernel row. The plane's
   vectors are stored after all are computed (the result may be laid over x); the first
   and last planes of x are read from a zero-padded copy (their taps reach past x). */
/* one output vector of the masked form: the R x R taps at offsets off from xp, masked,
   times the taps' weights wk (broadcast from memory: a plane of one vector took longer
   to broadcast them first), in one chain of sums a kernel row */
#define MASKED(R) \
__attribute__((optimize("fp-contract=fast"))) \
static inline vec_SUF masked##R##_SUF(const REAL *xp, const int64_t *off, \
                                      const ivec_SUF *mv, const REAL *wk) { \
    vec_SUF acc[R]; \
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) acc[r] = (vec_SUF){0}; \
    _Pragma("GCC unroll 32") for (int t = 0; t < R * R; t++) { \
        vec_SUF xv; \
        memcpy(&xv, xp + off[t], sizeof xv); \
        acc[t / R] += wk[t] * (vec_SUF)((ivec_SUF)xv & mv[t]); \
    } \
    _Pragma("GCC unroll 8") for (int r = 1; r < R; r++) acc[0] += acc[r]; \
    return acc[0]; \
}
MASKED(3)
#undef MASKED

static int masked_forward_e_SUF(const REAL *restrict x, const REAL *restrict w,
                                REAL *restrict y, const int64_t *g, int64_t lo,
                                int64_t hi, const epilogue_SUF *e) {
    GEOMETRY
    const int64_t NV = Pn / V, H = R2 / 2, reach = H * S2 + H, total = g[0] * K;
    /* (the masks aligned as their type: the compiler's loads of them assume it) */
    char *held = malloc((size_t)(NV * Rn) * sizeof(ivec_SUF) + sizeof(ivec_SUF));
    REAL *pad = scratch_SUF(Pn + 2 * reach), *tile = scratch_SUF(Pn);
    int64_t *off = malloc((size_t)Rn * sizeof(int64_t));
    if (!held || !pad || !tile || !off) {
        free(held); free(pad); free(tile); free(off);
        return 1;
    }
    ivec_SUF *mask = (ivec_SUF *)(((uintptr_t)held + sizeof(ivec_SUF) - 1)
                                  & ~(uintptr_t)(sizeof(ivec_SUF) - 1));
    int64_t dh[9], dw[9];   /* (3 x 3: takes_masked; no division a lane) */
    for (int64_t t = 0; t < Rn; t++) {
        dh[t] = t / R2 - H, dw[t] = t % R2 - H;
        off[t] = dh[t] * S2 + dw[t];
    }
    for (int64_t pos = 0, r = 0, c = 0; pos < Pn; pos++) {   /* (row r, column c) */
        for (int64_t t = 0; t < Rn; t++) {
            const int64_t i = r + dh[t], j = c + dw[t];
            mask[pos / V * Rn + t][pos % V] = i >= 0 && i < S1 && j >= 0 && j < S2 ? -1 : 0;
        }
        if (++c == S2) c = 0, r++;
    }
    memset(pad, 0, (Pn + 2 * reach) * sizeof(REAL));
    for (int64_t plane = lo; plane < hi; plane++) {
        const int64_t k = plane % K;
        const REAL *xp = x + plane * Sn;
        if (plane == 0 || plane == total - 1) {
            memcpy(pad + reach, xp, Pn * sizeof(REAL));
            xp = pad + reach;
        }
        const REAL *wk = w + k * Rn, b = e ? e->bias[k] : 0;
        for (int64_t v = 0; v < NV; v++) {
            vec_SUF sum = masked3_SUF(xp + v * V, off, mask + v * Rn, wk);
            if (e && e->act == 0)
                sum = vclamp_SUF(sum + b, (vec_SUF){0} + e->lo, (vec_SUF){0} + e->hi);
            memcpy(tile + v * V, &sum, sizeof sum);
        }
        REAL *out = (e ? e->final : y) + plane * Pn;
        if (e && e->act != 0) epi_run_SUF(out, tile, Pn, b, e->lo, e->hi, e->act);
        else memcpy(out, tile, Pn * sizeof(REAL));
    }
    free(held); free(pad); free(tile); free(off);
    return 0;
}

static int geon_dconv_masked_forward_SUF(const REAL *x, const REAL *w, REAL *y,
                                         const int64_t *g, int64_t lo, int64_t hi) {
    return masked_forward_e_SUF(x, w, y, g, lo, hi, NULL);
}
#undef MARGIN
#undef RIGHT
#undef PLANE_ROWS
#undef EVENS2
#undef ODDS2
#undef PREV1
#undef PREV2
#undef NEXT1
#undef SHUF2_SUF
"""


def form(geo, name):
    """The form that computes kernel ``name`` ("forward", ...) of geometry ``geo``
    (:func:`.conv_kernels._geometry`'s array): "planes_" (:func:`takes`), "masked_"
    (:func:`takes_masked`) or None."""
    return "planes_" if takes(geo, name) else "masked_" if takes_masked(geo, name) \
        else None


def takes_masked(geo, name):
    """Whether the masked form computes it: a 2-D depthwise forward, 3 x 3 windows
    padded 1 on each side, stride 1, planes of P = S, rows of 8 to 15 positions and a
    whole number of 16 positions a plane (at most 256). (On 4 x 4 planes it took 11-13
    us against the lanes form's 18 for 384 channels alone, but 24 against 18 inside
    MobileNet-v2's forward; EfficientNet-B0's forward with its 5 x 5 layers on 8 x 8
    planes by this form took 1-2% longer than by the lanes form.)"""
    S1, S2, R2, P1, P2, s2 = (int(geo[i]) for i in (6, 7, 10, 12, 13, 16))
    return _square_depthwise(geo, name) and R2 == 3 and s2 == 1 \
        and (P1, P2) == (S1, S2) and 8 <= P2 < 16 and P1 * P2 % 16 == 0 \
        and P1 * P2 <= 256


def takes(geo, name):
    """Whether the planes form computes kernel ``name`` ("forward", ...) of geometry
    ``geo`` (:func:`.conv_kernels._geometry`'s array): a 2-D depthwise forward, R x R
    windows (R 3 or 5) padded R / 2 before, stride 1 or 2, and output rows of at least
    16 positions whose loads stay within a row's margins."""
    S2, R2, P2, s2 = (int(geo[i]) for i in (7, 10, 13, 16))
    if not (_square_depthwise(geo, name) and R2 in (3, 5) and s2 in (1, 2) and P2 >= 16):
        return False
    # the last element a row's loads read (the last vector of outputs starts at P2 - 16)
    reach = P2 - 1 + R2 // 2 if s2 == 1 else 2 * P2 - 1 + (16 if R2 == 5 else 0)
    return reach < S2 + RIGHT


def _square_depthwise(geo, name):
    """What both forms ask of kernel ``name`` and geometry ``geo``: a forward, one
    channel a group (K = C), 2-D, square windows padded R / 2 before, the same stride
    both ways, no dilation."""
    C, K, Cg, Kg, S0, R0, R1, R2, P0 = (int(geo[i]) for i in (1, 2, 3, 4, 5, 8, 9, 10, 11))
    s1, s2, d1, d2, p1, p2 = (int(geo[i]) for i in (15, 16, 18, 19, 21, 22))
    return name == "forward" and Cg == Kg == 1 and C == K and S0 == R0 == P0 == 1 \
        and R1 == R2 and s1 == s2 and d1 == d2 == 1 and p1 == p2 == R2 // 2
