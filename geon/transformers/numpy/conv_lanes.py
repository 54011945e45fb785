"""The lanes form of the direct convolution kernels, in C (part of
:mod:`.conv_kernels`' source, which it follows in one translation unit: it uses that
source's macros, scratch and epilogue).

For short output rows (7 x 7, 4 x 4 planes) V channels are computed side by side:
their planes are copied into one tile of the padded image, (*Q, V) with the channel
last, and every tap of every window is one vector operation over the V channels; the
result is copied back into its planes. ``REAL`` and ``_SUF`` are replaced per dtype as
in the rest of the source.
"""


def _transpose():
    """C of ``transpose_SUF(r)``: the V x V matrix held in the V vectors r[0 .. V - 1]
    (V = 16) transposed in place, in four steps of V two-vector shuffles (at step h,
    vectors i and i + h, i without bit h, swap their off-diagonal h x h blocks)."""
    V = 16
    names = [f"r[{i}]" for i in range(V)]
    new_forms, old_forms, step, h = [], [], 0, V // 2
    while h >= 1:
        out = list(names)
        for i in range(V):
            if i & h:
                continue
            j = i + h
            lo = [k if not k & h else V + k - h for k in range(V)]
            hi = [k + h if not k & h else V + k for k in range(V)]
            for dest, idx in ((i, lo), (j, hi)):
                name = f"s{step}_{dest}"
                text = ", ".join(map(str, idx))
                new_forms.append(f"    const vec_SUF {name} = __builtin_shufflevector("
                                 f"{names[i]}, {names[j]}, {text});")
                old_forms.append(f"    const vec_SUF {name} = __builtin_shuffle("
                                 f"{names[i]}, {names[j]}, (ivec_SUF){{{text}}});")
                out[dest] = name
        names, step, h = out, step + 1, h // 2
    ends = "".join(f"    r[{i}] = {n};\n" for i, n in enumerate(names))
    return ("static inline void transpose_SUF(vec_SUF *r) {\n"
            "#if defined(__clang__) || __GNUC__ >= 12\n" + "\n".join(new_forms)
            + "\n" + ends + "#else\n" + "\n".join(old_forms) + "\n" + ends
            + "#endif\n}\n")


TEMPLATE = _transpose() + r"""
/* --- lanes: V channels side by side, for small planes ---------------------------
   A tile holds V planes interleaved, (*Q, V), Q the padded image's extent: the
   windows read it with no bounds checks, every step one vector of V channels. */

/* T (Q0, Q1, Q2, V) = zero (where clear), with plane src[l] (S0, S1, S2) at (q0, q1,
   q2): a position at a time, its nl lanes (all V of them, a loop of known length, for
   every block but a last short one) */
static void tile_in_SUF(REAL *restrict T, const REAL *const *src, int64_t nl,
                        const int64_t *Q, const int64_t *S, const int64_t *q, int clear) {
    if (clear) memset(T, 0, Q[0] * Q[1] * Q[2] * V * sizeof(REAL));
    for (int64_t i0 = 0, p = 0; i0 < S[0]; i0++)
        for (int64_t i1 = 0; i1 < S[1]; i1++) {
            REAL *t = T + (((i0 + q[0]) * Q[1] + i1 + q[1]) * Q[2] + q[2]) * V;
            for (int64_t i2 = 0; i2 < S[2]; i2++, p++, t += V) {
                if (nl == V)
                    for (int l = 0; l < V; l++) t[l] = src[l][p];
                else
                    for (int64_t l = 0; l < nl; l++) t[l] = src[l][p];
            }
        }
}

/* plane dst[l] (S0, S1, S2) = T (Q0, Q1, Q2, V) at offset (q0, q1, q2), lane l: a
   position at a time, as tile_in */
static void tile_out_SUF(REAL *const *dst, const REAL *restrict T, int64_t nl,
                         const int64_t *Q, const int64_t *S, const int64_t *q) {
    for (int64_t i0 = 0, p = 0; i0 < S[0]; i0++)
        for (int64_t i1 = 0; i1 < S[1]; i1++) {
            const REAL *t = T + (((i0 + q[0]) * Q[1] + i1 + q[1]) * Q[2] + q[2]) * V;
            for (int64_t i2 = 0; i2 < S[2]; i2++, p++, t += V) {
                if (nl == V)
                    for (int l = 0; l < V; l++) dst[l][p] = t[l];
                else
                    for (int64_t l = 0; l < nl; l++) dst[l][p] = t[l];
            }
        }
}

/* *v = the m elements from p, the rest zero (sizes known when compiling for the
   usual lengths of a plane's rows of positions) */
static inline void part_in_SUF(vec_SUF *v, const REAL *p, int64_t m) {
    *v = (vec_SUF){0};
    switch (m) {
    case V: memcpy(v, p, V * sizeof(REAL)); break;
    case 8: memcpy(v, p, 8 * sizeof(REAL)); break;
    case 4: memcpy(v, p, 4 * sizeof(REAL)); break;
    case 2: memcpy(v, p, 2 * sizeof(REAL)); break;
    default: for (int64_t k = 0; k < m; k++) (*v)[k] = p[k];
    }
}

static inline void part_out_SUF(REAL *p, const vec_SUF *v, int64_t m) {
    switch (m) {
    case V: memcpy(p, v, V * sizeof(REAL)); break;
    case 8: memcpy(p, v, 8 * sizeof(REAL)); break;
    case 4: memcpy(p, v, 4 * sizeof(REAL)); break;
    case 2: memcpy(p, v, 2 * sizeof(REAL)); break;
    default: for (int64_t k = 0; k < m; k++) p[k] = (*v)[k];
    }
}

/* The tile copies of the forward, V positions at a time through a transpose in
   registers (a position at a time, V scalar loads or stores to V planes each, took
   as long as the convolution), where planes have 8 positions or more (on 2 x 2
   planes a 16 x 16 transpose for 4 positions was no faster than the scalar copies):
   T at position p's offset at[p] (elements) = lane l: plane src[l]'s element p, for
   p < n, nl planes (the other lanes zero) */
static void tile_in_t_SUF(REAL *restrict T, const REAL *const *src, int64_t nl,
                          int64_t n, const int64_t *at) {
    for (int64_t p0 = 0; p0 < n; p0 += V) {
        const int64_t m = n - p0 < V ? n - p0 : V;
        vec_SUF r[V];
        for (int l = 0; l < V; l++) {
            if (l < nl) part_in_SUF(&r[l], src[l] + p0, m);
            else r[l] = (vec_SUF){0};
        }
        transpose_SUF(r);
        for (int64_t j = 0; j < m; j++) memcpy(T + at[p0 + j], &r[j], sizeof r[j]);
    }
}

/* plane dst[l]'s element p = lane l of T's position p (T compact, (n, V)), nl planes */
static void tile_out_t_SUF(REAL *const *dst, const REAL *restrict T, int64_t nl,
                           int64_t n) {
    for (int64_t p0 = 0; p0 < n; p0 += V) {
        const int64_t m = n - p0 < V ? n - p0 : V;
        vec_SUF r[V];
        for (int64_t j = 0; j < V; j++) {
            if (j < m) memcpy(&r[j], T + (p0 + j) * V, sizeof r[j]);
            else r[j] = (vec_SUF){0};
        }
        transpose_SUF(r);
        for (int64_t l = 0; l < nl; l++) part_out_SUF(dst[l] + p0, &r[l], m);
    }
}

#define LANES_GEOMETRY \
    const int64_t B = g[0], C = g[1], K = g[2], Cg = g[3], Kg = g[4]; \
    const int64_t *S = g + 5, *R = g + 8, *P = g + 11, *st = g + 14, *dl = g + 17; \
    const int64_t *pd = g + 20, *Q = g + 23; \
    const int64_t Sn = S[0] * S[1] * S[2], Rn = R[0] * R[1] * R[2]; \
    const int64_t Pn = P[0] * P[1] * P[2], Qn = Q[0] * Q[1] * Q[2]; \
    const int64_t zero[3] = {0, 0, 0}, one[3] = {1, 1, Pn}; \
    (void)B; (void)C; (void)K; (void)Cg; (void)Kg; (void)Sn; (void)one;

/* every output position p (index pi) and kernel offset t, with xo the offset in a
   tile of the padded image of the input that (p, t) reads */
#define WINDOWS(BODY_P, BODY_T, END_P) \
    for (int64_t o0 = 0, pi = 0; o0 < P[0]; o0++) \
    for (int64_t o1 = 0; o1 < P[1]; o1++) \
    for (int64_t o2 = 0; o2 < P[2]; o2++, pi++) { \
        BODY_P \
        for (int64_t r0 = 0, t = 0; r0 < R[0]; r0++) \
        for (int64_t r1 = 0; r1 < R[1]; r1++) { \
            const int64_t row = ((o0 * st[0] + r0 * dl[0]) * Q[1] + o1 * st[1] \
                                 + r1 * dl[1]) * Q[2] + o2 * st[2]; \
            for (int64_t r2 = 0; r2 < R[2]; r2++, t++) { \
                const int64_t xo = (row + r2 * dl[2]) * V; \
                BODY_T \
            } \
        } \
        END_P \
    }

/* forward: items (block of V output channels, b), the block major: its filter tile
   is made once for the batch. The tile is zeroed once a call; the taps of each
   window whose input is in the image (a 5 x 5 window on a 2 x 2 plane has 4 of 25;
   the rows kernels skip rows outside too), with their offsets in the tile and the
   result tile, are a table made once a call, by tap: each tap's products are added
   to every output it reaches, one output after another (independent additions;
   the sums of one output at a time waited on each addition's latency), in the same
   order of taps. With an epilogue, it is
   applied to the result tile, V channels a vector with their V biases, and the tile
   goes to final's planes (y is not written): a call per plane of finish cost more
   than the convolution on 4 x 4 and 2 x 2 planes. */
static int lanes_forward_e_SUF(const REAL *restrict x, const REAL *restrict w,
                               REAL *restrict y, const int64_t *g, int64_t lo,
                               int64_t hi, const epilogue_SUF *e) {
    LANES_GEOMETRY
    const int64_t blocks = (K + V - 1) / V;
    REAL *X = scratch_SUF(Qn * V), *Y = scratch_SUF(Pn * V);
    REAL *W = scratch_SUF(Cg * Rn * V);
    int64_t *xo = malloc((size_t)(2 * Pn * Rn + Rn + Sn + 1) * sizeof(int64_t));
    int64_t *yo = xo + Pn * Rn, *count = yo + Pn * Rn, *at = count + Rn;
    int err = !X || !Y || !W || !xo;
    if (!err) {
        for (int64_t i0 = 0, p = 0; i0 < S[0]; i0++)   /* input positions in the tile */
            for (int64_t i1 = 0; i1 < S[1]; i1++)
                for (int64_t i2 = 0; i2 < S[2]; i2++, p++)
                    at[p] = (((i0 + pd[0]) * Q[1] + i1 + pd[1]) * Q[2] + i2 + pd[2]) * V;
        memset(X, 0, Qn * V * sizeof(REAL));
        memset(W, 0, Cg * Rn * V * sizeof(REAL));
        memset(count, 0, Rn * sizeof(int64_t));
        for (int64_t o0 = 0, pi = 0; o0 < P[0]; o0++)
        for (int64_t o1 = 0; o1 < P[1]; o1++)
        for (int64_t o2 = 0; o2 < P[2]; o2++, pi++)
            for (int64_t r0 = 0, t = 0; r0 < R[0]; r0++)
            for (int64_t r1 = 0; r1 < R[1]; r1++)
            for (int64_t r2 = 0; r2 < R[2]; r2++, t++) {
                const int64_t q0 = o0 * st[0] + r0 * dl[0], q1 = o1 * st[1] + r1 * dl[1];
                const int64_t q2 = o2 * st[2] + r2 * dl[2];
                if (q0 < pd[0] || q0 >= pd[0] + S[0] || q1 < pd[1] || q1 >= pd[1] + S[1]
                        || q2 < pd[2] || q2 >= pd[2] + S[2]) continue;   /* padding */
                xo[t * Pn + count[t]] = ((q0 * Q[1] + q1) * Q[2] + q2) * V;
                yo[t * Pn + count[t]++] = pi * V;
            }
    }
    int64_t filled = -1;   /* the block whose filters W holds */
    for (int64_t item = lo; item < hi && !err; item++) {
        const int64_t b = item % B, block = item / B, k0 = block * V;
        const int64_t nl = K - k0 < V ? K - k0 : V;
        const REAL *src[V];
        REAL *dst[V];
        if (filled != block)
            for (int64_t c = 0; c < Cg; c++)
                for (int64_t l = 0; l < nl; l++)
                    for (int64_t t = 0; t < Rn; t++)
                        W[(c * Rn + t) * V + l] = w[((k0 + l) * Cg + c) * Rn + t];
        filled = block;
        for (int64_t c = 0; c < Cg; c++) {
            const REAL *Wc = W + c * Rn * V;
            for (int64_t l = 0; l < nl; l++)
                src[l] = x + (b * C + (k0 + l) / Kg * Cg + c) * Sn;
            if (Sn >= 8) tile_in_t_SUF(X, src, nl, Sn, at);
            else tile_in_SUF(X, src, nl, Q, S, pd, 0);
            if (c == 0) memset(Y, 0, Pn * V * sizeof(REAL));
            for (int64_t t = 0; t < Rn; t++) {
                const int64_t *xt = xo + t * Pn, *yt = yo + t * Pn;
                vec_SUF wv, xv, yv;
                memcpy(&wv, Wc + t * V, sizeof wv);
                for (int64_t i = 0; i < count[t]; i++) {
                    memcpy(&yv, Y + yt[i], sizeof yv);
                    memcpy(&xv, X + xt[i], sizeof xv);
                    yv += wv * xv;
                    memcpy(Y + yt[i], &yv, sizeof yv);
                }
            }
        }
        REAL *out = y;
        if (e) {
            REAL bv[V] = {0};
            for (int64_t l = 0; l < nl; l++) bv[l] = e->bias[k0 + l];
            const REAL lo_ = e->lo, hi_ = e->hi;
            const int act = e->act;
            for (int64_t pi = 0; pi < Pn; pi++) {
                REAL *t = Y + pi * V;
                if (act == 0) {
                    #pragma omp simd
                    for (int l = 0; l < V; l++) t[l] = clamp_SUF(t[l] + bv[l], lo_, hi_);
                } else {
                    for (int l = 0; l < V; l++) t[l] = epi_SUF(t[l] + bv[l], lo_, hi_, act);
                }
            }
            out = e->final;
        }
        for (int64_t l = 0; l < nl; l++) dst[l] = out + (b * K + k0 + l) * Pn;
        if (Pn >= 8) tile_out_t_SUF(dst, Y, nl, Pn);
        else tile_out_SUF(dst, Y, nl, one, one, zero);
    }
    free(X); free(Y); free(W); free(xo);
    return err;
}

static int geon_dconv_lanes_forward_SUF(const REAL *x, const REAL *w, REAL *y,
                                        const int64_t *g, int64_t lo, int64_t hi) {
    return lanes_forward_e_SUF(x, w, y, g, lo, hi, NULL);
}

/* derivative in the image: items (b, block of V input channels) */
int geon_dconv_lanes_grad_data_SUF(const REAL *restrict dy, const REAL *restrict w,
                                   REAL *restrict dx, const int64_t *g, int64_t lo,
                                   int64_t hi) {
    LANES_GEOMETRY
    const int64_t blocks = (C + V - 1) / V;
    REAL *X = scratch_SUF(Qn * V), *Y = scratch_SUF(Pn * V), *W = scratch_SUF(Rn * V);
    int err = !X || !Y || !W;
    for (int64_t item = lo; item < hi && !err; item++) {
        const int64_t b = item / blocks, c0 = item % blocks * V;
        const int64_t nl = C - c0 < V ? C - c0 : V;
        const REAL *src[V];
        REAL *dst[V];
        memset(X, 0, Qn * V * sizeof(REAL));
        for (int64_t q = 0; q < Kg; q++) {
            memset(W, 0, Rn * V * sizeof(REAL));
            for (int64_t l = 0; l < nl; l++) {
                const int64_t ci = c0 + l, k = ci / Cg * Kg + q;
                src[l] = dy + (b * K + k) * Pn;
                for (int64_t t = 0; t < Rn; t++)
                    W[t * V + l] = w[(k * Cg + ci % Cg) * Rn + t];
            }
            tile_in_SUF(Y, src, nl, one, one, zero, 1);
            WINDOWS(vec_SUF yv; vec_SUF wv; vec_SUF xv;
                    memcpy(&yv, Y + pi * V, sizeof yv);,
                    memcpy(&wv, W + t * V, sizeof wv);
                    memcpy(&xv, X + xo, sizeof xv);
                    xv += wv * yv;
                    memcpy(X + xo, &xv, sizeof xv);,)
        }
        for (int64_t l = 0; l < nl; l++) dst[l] = dx + (b * C + c0 + l) * Sn;
        tile_out_SUF(dst, X, nl, Q, S, pd);
    }
    free(X); free(Y); free(W);
    return err;
}

/* derivative in the filter: items (block of V output channels) */
int geon_dconv_lanes_grad_filter_SUF(const REAL *restrict x, const REAL *restrict dy,
                                     REAL *restrict dw, const int64_t *g, int64_t lo,
                                     int64_t hi) {
    LANES_GEOMETRY
    REAL *X = scratch_SUF(Qn * V), *Y = scratch_SUF(Pn * V), *A = scratch_SUF(Rn * V);
    int err = !X || !Y || !A;
    for (int64_t item = lo; item < hi && !err; item++) {
        const int64_t k0 = item * V, nl = K - k0 < V ? K - k0 : V;
        const REAL *src[V];
        for (int64_t c = 0; c < Cg; c++) {
            memset(A, 0, Rn * V * sizeof(REAL));
            for (int64_t b = 0; b < B; b++) {
                for (int64_t l = 0; l < nl; l++)
                    src[l] = x + (b * C + (k0 + l) / Kg * Cg + c) * Sn;
                tile_in_SUF(X, src, nl, Q, S, pd, 1);
                for (int64_t l = 0; l < nl; l++) src[l] = dy + (b * K + k0 + l) * Pn;
                tile_in_SUF(Y, src, nl, one, one, zero, 1);
                WINDOWS(vec_SUF yv; vec_SUF av; vec_SUF xv;
                        memcpy(&yv, Y + pi * V, sizeof yv);,
                        memcpy(&av, A + t * V, sizeof av);
                        memcpy(&xv, X + xo, sizeof xv);
                        av += yv * xv;
                        memcpy(A + t * V, &av, sizeof av);,)
            }
            for (int64_t l = 0; l < nl; l++)
                for (int64_t t = 0; t < Rn; t++)
                    dw[((k0 + l) * Cg + c) * Rn + t] = A[t * V + l];
        }
    }
    free(X); free(Y); free(A);
    return err;
}
"""
