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

Planes of 4 to 15 positions a row (4 x 4, 8 x 8, 12 x 12) under 3 x 3 or 5 x 5 windows
take the masked form where a plane is a whole number of vectors: each output vector
is a run of whole rows, and each tap one load at the tap's offset in the plane, its
lanes outside the plane cleared by a mask, and one multiply-add with the tap's weight
(no copy of the plane, no transposes). At stride 2 an input plane is first split into
its four phases (even or odd rows by even or odd columns), each of the output's shape,
so that every tap reads one phase at stride 1. Both forms are measured against the
others at :data:`.conv_kernels.PLANES`.
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
#define QUARTERS 0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15

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

/* The masked form: y (B, K, *P) = x correlated with w, depthwise, R x R (3 or 5),
   "same" padding (R / 2 each side), stride 1 (P = S) or 2 (S = 2P), planes of a whole
   number of vectors (4 x 4 to 16 x 15), output planes [lo, hi). At stride 2 the input
   plane is first split into its four phases (even and odd rows by even and odd
   columns), each a plane of P's shape, in a zero-margined scratch: input row 2i + d is
   row i + (d - (d & 1)) / 2 of phase d & 1, so every tap reads one phase at stride 1.
   Each tap of each output vector is then a load at the tap's offset in its plane (a
   vector of whole rows, shifted by dh rows and dw columns) with the lanes whose input
   lies outside the plane cleared (a mask a vector and tap, made once a call), and a
   multiply-add (fused), one chain of sums a kernel row. A plane of one vector is
   stored at once; a plane of several after all its vectors are computed (the result
   may be laid over x at stride 1). At stride 1 the first and last planes of x are read
   from a zero-margined copy (their taps reach past x). */
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
MASKED(5)
#undef MASKED

/* the four phases of plane xp (2 P1 x 2 P2) at ph + a * phase (a = 2 * row parity +
   column parity), each P1 x P2: for rows of 8 outputs, an input row a vector, its
   evens and odds shuffled out of a pair of rows; for rows of 4, a pair of input rows a
   vector, shuffled into its four quarters; else element by element */
static void phases_SUF(REAL *restrict ph, int64_t phase, const REAL *restrict xp,
                       int64_t P1, int64_t P2) {
    REAL *const p00 = ph, *const p01 = ph + phase, *const p10 = ph + 2 * phase,
         *const p11 = ph + 3 * phase;
    if (P2 == V / 2) {
        for (int64_t i = 0; i < P1; i++) {
            const vec_SUF a = at_SUF(xp + 2 * i * V), b = at_SUF(xp + (2 * i + 1) * V);
            const vec_SUF e = SHUF2_SUF(a, b, EVENS2), o = SHUF2_SUF(a, b, ODDS2);
            memcpy(p00 + i * P2, &e, P2 * sizeof(REAL));
            memcpy(p10 + i * P2, (const REAL *)&e + P2, P2 * sizeof(REAL));
            memcpy(p01 + i * P2, &o, P2 * sizeof(REAL));
            memcpy(p11 + i * P2, (const REAL *)&o + P2, P2 * sizeof(REAL));
        }
    } else if (P2 == V / 4) {
        for (int64_t i = 0; i < P1; i++) {
            const vec_SUF a = at_SUF(xp + i * V);
            const vec_SUF q = SHUF2_SUF(a, a, QUARTERS);
            memcpy(p00 + i * P2, &q, P2 * sizeof(REAL));
            memcpy(p10 + i * P2, (const REAL *)&q + P2, P2 * sizeof(REAL));
            memcpy(p01 + i * P2, (const REAL *)&q + 2 * P2, P2 * sizeof(REAL));
            memcpy(p11 + i * P2, (const REAL *)&q + 3 * P2, P2 * sizeof(REAL));
        }
    } else {
        for (int64_t i = 0; i < 2 * P1; i++) {
            const REAL *row = xp + i * 2 * P2;
            REAL *e = (i & 1 ? p10 : p00) + (i >> 1) * P2, *o = e + phase;
            for (int64_t j = 0; j < P2; j++) {
                e[j] = row[2 * j];
                o[j] = row[2 * j + 1];
            }
        }
    }
}

static int masked_forward_e_SUF(const REAL *restrict x, const REAL *restrict w,
                                REAL *restrict y, const int64_t *g, int64_t lo,
                                int64_t hi, const epilogue_SUF *e) {
    GEOMETRY
    const int64_t NV = Pn / V, H = R2 / 2, total = g[0] * K;
    /* how far a tap's load reaches before or after its vector, in its plane's elements */
    const int64_t reach = s2 == 1 ? H * P2 + H : P2 + 1;
    /* stride 2: the four phases, one after another, between margins of reach */
    const int64_t phase = Pn + reach, scratch = s2 == 1 ? Pn + 2 * reach : 4 * phase + reach;
    /* (the masks aligned as their type: the compiler's loads of them assume it) */
    char *held = malloc((size_t)(NV * Rn) * sizeof(ivec_SUF) + sizeof(ivec_SUF));
    /* a sigmoid or SiLU epilogue runs over the results of RUN planes at once (a call
       of epi_run a plane of 16 took twice as long) */
    const int64_t RUN = e && e->act != 0 && Pn < 256 ? 256 / Pn : 1;
    REAL *pad = scratch_SUF(2 * scratch), *tile = scratch_SUF(RUN * Pn);
    int64_t *off = malloc((size_t)(3 * Rn) * sizeof(int64_t));
    if (!held || !pad || !tile || !off) {
        free(held); free(pad); free(tile); free(off);
        return 1;
    }
    ivec_SUF *mask = (ivec_SUF *)(((uintptr_t)held + sizeof(ivec_SUF) - 1)
                                  & ~(uintptr_t)(sizeof(ivec_SUF) - 1));
    /* tap t reads its phase's plane shifted by dh[t] rows and dw[t] columns: off[t]
       from the first phase (no division a lane) */
    int64_t *dh = off + Rn, *dw = dh + Rn;
    for (int64_t t = 0; t < Rn; t++) {
        const int64_t u = t / R2 - H, v = t % R2 - H;
        const int64_t pu = s2 == 1 ? 0 : u & 1, pv = s2 == 1 ? 0 : v & 1;
        dh[t] = s2 == 1 ? u : (u - pu) / 2, dw[t] = s2 == 1 ? v : (v - pv) / 2;
        off[t] = (2 * pu + pv) * phase + dh[t] * P2 + dw[t];
    }
    for (int64_t pos = 0, r = 0, c = 0; pos < Pn; pos++) {   /* (row r, column c) */
        for (int64_t t = 0; t < Rn; t++) {
            const int64_t i = r + dh[t], j = c + dw[t];
            mask[pos / V * Rn + t][pos % V] = i >= 0 && i < P1 && j >= 0 && j < P2 ? -1 : 0;
        }
        if (++c == P2) c = 0, r++;
    }
    memset(pad, 0, 2 * scratch * sizeof(REAL));
    if (s2 == 2 && lo < hi) phases_SUF(pad + reach, phase, x + lo * Sn, P1, P2);
    for (int64_t plane = lo; plane < hi; plane++) {
        const int64_t k = plane % K;
        const REAL *xp = x + plane * Sn;
        if (s2 == 2) {
            /* the phases of this plane were made one plane ago, those of the next
               now (a load of phases just stored, across several of its stores, waits
               for them to be written: 192 channels of 8 x 8 at batch 2 took 15.6 us
               with the phases made just before their loads, 10.7 us so) */
            if (plane + 1 < hi)
                phases_SUF(pad + (plane + 1 - lo) % 2 * scratch + reach, phase, xp + Sn,
                           P1, P2);
            xp = pad + (plane - lo) % 2 * scratch + reach;
        } else if (plane == 0 || plane == total - 1) {
            memcpy(pad + reach, xp, Pn * sizeof(REAL));
            xp = pad + reach;
        }
        const REAL *wk = w + k * Rn, b = e ? e->bias[k] : 0;
        REAL *out = (e ? e->final : y) + plane * Pn;
        const int64_t ran = (plane - lo) % RUN;   /* planes before it in the run */
        REAL *dst = RUN > 1 ? tile + ran * Pn : NV == 1 && (!e || e->act == 0) ? out : tile;
        for (int64_t v = 0; v < NV; v++) {
            vec_SUF sum = R2 == 3 ? masked3_SUF(xp + v * V, off, mask + v * Rn, wk)
                                  : masked5_SUF(xp + v * V, off, mask + v * Rn, wk);
            if (e && e->act == 0)
                sum = vclamp_SUF(sum + b, (vec_SUF){0} + e->lo, (vec_SUF){0} + e->hi);
            else if (e)
                sum += b;
            memcpy(dst + v * V, &sum, sizeof sum);
        }
        /* (the bias is in the sums: adding -0 keeps every value, -0 among them) */
        if (e && e->act != 0 && (ran == RUN - 1 || plane == hi - 1))
            epi_run_SUF(out - ran * Pn, tile, (ran + 1) * Pn, (REAL)-0.0, e->lo, e->hi,
                        e->act);
        else if (dst != out && RUN == 1)
            memcpy(out, tile, Pn * sizeof(REAL));
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
#undef QUARTERS
#undef SHUF2_SUF
"""


def form(geo, name):
    """The form that computes kernel ``name`` ("forward", ...) of geometry ``geo``
    (:func:`.conv_kernels._geometry`'s array): "planes_" (:func:`takes`), "masked_"
    (:func:`takes_masked`) or None."""
    return "planes_" if takes(geo, name) else "masked_" if takes_masked(geo, name) \
        else None


def takes_masked(geo, name):
    """Whether the masked form computes it: a 2-D depthwise forward, 3 x 3 or 5 x 5
    windows padded R / 2 on each side, stride 1 (planes of P = S) or 2 (S = 2P), output
    rows of 4 to 15 positions and a whole number of 16 positions a plane (at most
    256). Measured against the lanes form at :data:`.conv_kernels.PLANES`. Inside whole
    forwards its 4 x 4 layers at stride 1 gained nothing measurable, where alone they
    took two thirds of the lanes form's time: MobileNet-v2's forward took 1.68 ms with
    them in this form and 1.66 in the lanes form, EfficientNet-B0's 3.39 and 3.43
    (medians of six alternating runs of 100, one thread; a call's fixed cost with its
    caches cold dominates these layers)."""
    S1, S2, R2, P1, P2, s2 = (int(geo[i]) for i in (6, 7, 10, 12, 13, 16))
    return _square_depthwise(geo, name) and R2 in (3, 5) and s2 in (1, 2) \
        and (S1, S2) == (s2 * P1, s2 * P2) and 4 <= P2 < 16 and P1 * P2 % 16 == 0 \
        and P1 * P2 <= 256 and (s2 == 2 or R2 // 2 * (P2 + 1) <= P1 * P2)


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
