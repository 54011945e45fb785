"""The im2col copy of a 1-d or 2-d convolution in C.

A convolution that is not 1 x 1 and has many channels per group runs as one copy of
its image's windows into im2col order, ``(C, R, S, B, P, Q)``, then a matrix product
(:func:`geon.transformers.numpy.conv.conv_forward`). NumPy makes that copy from a
strided view of the padded image with one iterator over seven dimensions whose inner
ones are short (the output's width): for resnet18's last stage (512 channels of 2 x 2
images, batch 2, a 3 x 3 kernel: 37 K elements) it took 146 us on one core of a
2.3 GHz Xeon, about a tenth of the convolution. Here one C loop writes each row of
``Q`` output positions from the image's row (a ``memcpy`` at stride 1) and the
padding's zeros, without a padded copy of the image; at strides 1 and 2 with rows of
``PAD_MIN_ROW`` to ``PAD_MAX_ROW`` positions, each channel's planes are first copied
between zero borders, and every row is then one copy of a size the compiler knows.

The copy moves bytes, so one kernel per element size (1, 2, 4, 8 bytes) serves every
dtype; the padding is the all-zero bit pattern, which is 0 in every integer and float
type. The library is built and cached like the other fixed kernels
(:func:`geon.transformers.numpy.compiled.fixed_library`); where it does not build, under
``GEON_COMPILED=0`` or ``NumPyTransformer(compiled=False)``, NumPy makes the copy.
"""

import ctypes

import numpy as np

from geon.transformers.numpy import c_pool, compiled, pointwise, toolchain

_TEMPLATE = r"""
/* cols (C, R, S, B, P, Q) = the windows of x (B, C, H, W) (C-contiguous), zero where a
   window reaches into the padding; g: B C H W R S P Q, strides sh sw, pads ph pw (the
   leading ones), dilations dh dw */
/* where short rows make a call per row cost more than the row (a 2 x 2 image), every
   channel copies by one table of source offsets within the channel's planes (-1:
   padding), made once per call */
static int gather_SUF(const T *restrict x, T *restrict o, const int64_t *g) {
    const int64_t B = g[0], C = g[1], H = g[2], W = g[3], R = g[4], S = g[5];
    const int64_t P = g[6], Q = g[7], sh = g[8], sw = g[9], ph = g[10], pw = g[11];
    const int64_t dh = g[12], dw = g[13], n = R * S * B * P * Q;
    int64_t *idx = malloc((size_t)n * sizeof *idx);
    if (!idx) return 1;
    int64_t j = 0;
    for (int64_t r = 0; r < R; r++)
        for (int64_t s = 0; s < S; s++)
            for (int64_t b = 0; b < B; b++)
                for (int64_t p = 0; p < P; p++)
                    for (int64_t q = 0; q < Q; q++, j++) {
                        const int64_t ih = p * sh - ph + r * dh, iw = q * sw - pw + s * dw;
                        idx[j] = ih < 0 || ih >= H || iw < 0 || iw >= W ? -1
                                 : b * g[14] * H * W + ih * W + iw;
                    }
    for (int64_t c = 0; c < C; c++, o += n) {
        const T *plane = x + c * H * W;
        for (j = 0; j < n; j++) o[j] = idx[j] < 0 ? 0 : plane[idx[j]];
    }
    free(idx);
    return 0;
}

/* rows of cols of NQ elements each from rows of the padded planes (ld apart): a copy
   of a size known here, a few vector moves, where a copy of Q elements called memcpy */
#define PAD_ROWS(NQ) \
static void rows##NQ##_SUF(T *restrict o, const T *restrict src, int64_t ld, int64_t n) { \
    for (int64_t p = 0; p < n; p++, o += NQ, src += ld) \
        __builtin_memcpy(o, src, NQ * sizeof(T)); \
} \
static void evens##NQ##_SUF(T *restrict o, const T *restrict src, int64_t ld, int64_t n) { \
    for (int64_t p = 0; p < n; p++, o += NQ, src += ld) \
        for (int q = 0; q < NQ; q++) o[q] = src[2 * q]; \
}
PAD_ROWS(7) PAD_ROWS(8) PAD_ROWS(14) PAD_ROWS(16) PAD_ROWS(28)
PAD_ROWS(32) PAD_ROWS(56) PAD_ROWS(64)
#undef PAD_ROWS

/* strides 1 or 2 (sh, sw), no dilation: each channel's B planes copied once into
   zero-bordered planes of ((P - 1) sh + R) x ((Q - 1) sw + S) (the part of the padded
   image the windows read), then every row of cols is Q elements of a row of them,
   every sw-th: at rows of 16 elements or fewer, a copy per row from the image (zeros
   and bounds per row) or the table of offsets cost 2-4 times as much (resnet18's 3 x 3
   layers on 16 x 16 and 8 x 8 planes). 1: no memory. */
static int padded_SUF(const T *restrict x, T *restrict o, const int64_t *g) {
    const int64_t B = g[0], C = g[1], H = g[2], W = g[3], R = g[4], S = g[5];
    const int64_t P = g[6], Q = g[7], sh = g[8], sw = g[9], ph = g[10], pw = g[11];
    const int64_t Hp = (P - 1) * sh + R, Wp = (Q - 1) * sw + S, plane = Hp * Wp;
    T *buf = malloc((size_t)(B * plane) * sizeof(T));
    if (!buf) return 1;
    void (*rows)(T *restrict, const T *restrict, int64_t, int64_t) = sw == 1
        ? (Q == 7 ? rows7_SUF : Q == 8 ? rows8_SUF
           : Q == 14 ? rows14_SUF : Q == 16 ? rows16_SUF : Q == 28 ? rows28_SUF
           : Q == 32 ? rows32_SUF : Q == 56 ? rows56_SUF : Q == 64 ? rows64_SUF : NULL)
        : (Q == 7 ? evens7_SUF : Q == 8 ? evens8_SUF
           : Q == 14 ? evens14_SUF : Q == 16 ? evens16_SUF : Q == 28 ? evens28_SUF
           : Q == 32 ? evens32_SUF : Q == 56 ? evens56_SUF : Q == 64 ? evens64_SUF : NULL);
    /* the columns [w0, w1) of a padded row that hold the image's row */
    const int64_t w0 = pw < 0 ? 0 : pw > Wp ? Wp : pw;
    const int64_t w1 = W + pw < w0 ? w0 : W + pw > Wp ? Wp : W + pw;
    for (int64_t c = 0; c < C; c++) {
        for (int64_t b = 0; b < B; b++) {
            T *pl = buf + b * plane;
            const T *img = x + (b * g[14] + c) * H * W;
            for (int64_t i = 0; i < Hp; i++) {
                T *row = pl + i * Wp;
                const int64_t ih = i - ph;
                if (ih < 0 || ih >= H) {
                    memset(row, 0, (size_t)Wp * sizeof(T));
                    continue;
                }
                memset(row, 0, (size_t)w0 * sizeof(T));
                memcpy(row + w0, img + ih * W + (w0 - pw), (size_t)(w1 - w0) * sizeof(T));
                memset(row + w1, 0, (size_t)(Wp - w1) * sizeof(T));
            }
        }
        for (int64_t r = 0; r < R; r++)
            for (int64_t s = 0; s < S; s++)
                for (int64_t b = 0; b < B; b++, o += P * Q) {
                    const T *src = buf + b * plane + r * Wp + s;
                    if (rows) {
                        rows(o, src, sh * Wp, P);
                    } else {
                        for (int64_t p = 0; p < P; p++)
                            for (int64_t q = 0; q < Q; q++)
                                o[p * Q + q] = src[p * sh * Wp + q * sw];
                    }
                }
    }
    free(buf);
    return 0;
}

/* cols (C, R, S, B, P, Q) = the windows of channels [0, C) of x (B, g[14], H, W)
   (C-contiguous), zero where a window reaches into the padding; g: B C H W R S P Q,
   strides sh sw, pads ph pw (the leading ones), dilations dh dw, the channels of an
   image of x. 1: no memory (nothing written). */
static int part_SUF(const T *restrict x, T *restrict cols, const int64_t *g) {
    const int64_t B = g[0], C = g[1], H = g[2], W = g[3], R = g[4], S = g[5];
    const int64_t P = g[6], Q = g[7], sh = g[8], sw = g[9], ph = g[10], pw = g[11];
    const int64_t dh = g[12], dw = g[13];
    if (sh <= 2 && sw <= 2 && dh == 1 && dw == 1 && Q >= PAD_MIN_ROW && Q <= PAD_MAX_ROW)
        return padded_SUF(x, cols, g);
    if (Q < MIN_ROW) return gather_SUF(x, cols, g);
    T *o = cols;
    for (int64_t c = 0; c < C; c++)
        for (int64_t r = 0; r < R; r++)
            for (int64_t s = 0; s < S; s++) {
                /* output columns q in [q0, q1) read x's row at q * sw + off */
                const int64_t off = s * dw - pw;
                int64_t q0 = off >= 0 ? 0 : (-off + sw - 1) / sw;
                int64_t q1 = W - off <= 0 ? 0 : (W - off + sw - 1) / sw;
                if (q1 > Q) q1 = Q;
                if (q0 > q1) q0 = q1;
                for (int64_t b = 0; b < B; b++) {
                    const T *plane = x + (b * g[14] + c) * H * W;
                    for (int64_t p = 0; p < P; p++, o += Q) {
                        const int64_t ih = p * sh - ph + r * dh;
                        if (ih < 0 || ih >= H) {
                            for (int64_t q = 0; q < Q; q++) o[q] = 0;
                            continue;
                        }
                        const T *row = plane + ih * W + off;
                        for (int64_t q = 0; q < q0; q++) o[q] = 0;
                        if (sw == 1)
                            for (int64_t q = q0; q < q1; q++) o[q] = row[q];
                        else
                            for (int64_t q = q0; q < q1; q++) o[q] = row[q * sw];
                        for (int64_t q = q1; q < Q; q++) o[q] = 0;
                    }
                }
            }
    return 0;
}

typedef struct { const T *x; T *cols; const int64_t *g; int64_t per; int failed; } job_SUF;

static void run_SUF(void *p, int64_t k) {
    job_SUF *const j = p;
    const int64_t *const g = j->g, c0 = k * j->per;
    const int64_t n = g[1] - c0 < j->per ? g[1] - c0 : j->per;
    int64_t h[15];
    for (int q = 0; q < 15; q++) h[q] = g[q];
    h[1] = n;
    if (part_SUF(j->x + c0 * g[2] * g[3], j->cols + c0 * g[4] * g[5] * g[0] * g[6] * g[7], h))
        __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
}

/* cols (C, R, S, B, P, Q) = the windows of x (B, C, H, W) (C-contiguous), zero where a
   window reaches into the padding; g: B C H W R S P Q, strides sh sw, pads ph pw (the
   leading ones), dilations dh dw, C again. Blocks of channels on geon's threads where
   there are PAR_ELEMENTS or more to write. 1: no memory. */
int geon_im2col_SUF(const T *restrict x, T *restrict cols, const int64_t *g) {
    const int64_t C = g[1], want = pool_threads();
    if (C <= 0) return 0;
    job_SUF j = {x, cols, g, C, 0};
    if (want > 1 && C > 1 && pool_worth(C * g[4] * g[5] * g[0] * g[6] * g[7], PAR_ELEMENTS))
        j.per = (C + POOL_CUT(want) - 1) / POOL_CUT(want);
    pool_run(run_SUF, &j, (C + j.per - 1) / j.per);
    return j.failed;
}
"""

_POOL = r"""
typedef REAL vp_SUF __attribute__((vector_size(64)));
#define VP_SUF ((int64_t)(64 / sizeof(REAL)))
/* the even elements of vector a then of vector b (GCC before 12 has no
   __builtin_shufflevector) */
#if defined(__clang__) || __GNUC__ >= 12
#define EVENS_SUF(a, b) __builtin_shufflevector(a, b, EVENS_IDX)
#else
#define EVENS_SUF(a, b) __builtin_shuffle(a, b, (__typeof__((a) > (b))){EVENS_IDX})
#endif

/* NumPy's maximum of two vectors (as MAX_SUF: a NaN in a wins, else b's through the
   comparison; of equal operands b) */
static inline vp_SUF vmax_SUF(vp_SUF a, vp_SUF b) {
    const __typeof__(a > b) gt = a > b, nan = a != a, take = gt | nan;
    __typeof__(a > b) ai, bi;
    __builtin_memcpy(&ai, &a, sizeof a);
    __builtin_memcpy(&bi, &b, sizeof b);
    const __typeof__(a > b) r = (ai & take) | (bi & ~take);
    vp_SUF out;
    __builtin_memcpy(&out, &r, sizeof out);
    return out;
}

/* y (B, C, P, Q) = the maximum of each window of x (B, C, H, W) (both C-contiguous;
   g as im2col's): NumPy's maximum folded over the taps in their order from -inf, taps
   out of the image reading -inf, as the strided path over the -inf-padded image does
   (a NaN wins; of -0.0 and 0.0 the later tap). Each plane is first copied between
   -inf borders (the rows and columns the windows reach); then every vector of outputs
   folds its taps in registers (a tap's inputs at stride 1 one load, at stride 2 the
   even elements of two loads, at larger strides gathered) and is stored once (with a
   tap's bounds in the loop and the outputs folded in memory, resnet18's pooling of
   64 planes of 32 x 32 at stride 2, two images, took 240 us). Planes in blocks on
   geon's threads. 1: no memory (y partly written). */
typedef struct { const REAL *x; REAL *y; const int64_t *g; int64_t per; int failed; } mjob_SUF;

static void max_part_SUF(void *p, int64_t k) {
    mjob_SUF *const j = p;
    const int64_t *const g = j->g;
    const int64_t H = g[2], W = g[3], R = g[4], S = g[5], P = g[6], Q = g[7];
    const int64_t sh = g[8], sw = g[9], ph = g[10], pw = g[11], dh = g[12], dw = g[13];
    const int64_t n = g[0] * g[1], c0 = k * j->per, c1 = n - c0 < j->per ? n : c0 + j->per;
    const int64_t Hp = (P - 1) * sh + (R - 1) * dh + 1, Wp = (Q - 1) * sw + (S - 1) * dw + 1;
    /* (2 VP_SUF elements of slack: a last vector of outputs reads past its row) */
    REAL *const pad = malloc((size_t)(Hp * Wp + 2 * VP_SUF) * sizeof(REAL));
    if (!pad) {
        __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    for (int64_t e = Hp * Wp; e < Hp * Wp + 2 * VP_SUF; e++) pad[e] = 0;
    /* the columns [w0, w1) of a padded row that hold the image's row */
    const int64_t w0 = pw < 0 ? 0 : pw > Wp ? Wp : pw;
    const int64_t w1 = W + pw < w0 ? w0 : W + pw > Wp ? Wp : W + pw;
    for (int64_t c = c0; c < c1; c++) {
        const REAL *const xp = j->x + c * H * W;
        REAL *const yp = j->y + c * P * Q;
        for (int64_t i = 0; i < Hp; i++) {
            REAL *const row = pad + i * Wp;
            const int64_t ih = i - ph;
            const int inside = ih >= 0 && ih < H;
            for (int64_t e = 0; e < (inside ? w0 : Wp); e++) row[e] = -(REAL)INFINITY;
            if (!inside) continue;
            memcpy(row + w0, xp + ih * W + (w0 - pw), (size_t)(w1 - w0) * sizeof(REAL));
            for (int64_t e = w1; e < Wp; e++) row[e] = -(REAL)INFINITY;
        }
        for (int64_t p = 0; p < P; p++)
            for (int64_t q = 0; q < Q; q += VP_SUF) {
                vp_SUF acc = (vp_SUF){0} - (REAL)INFINITY;
                for (int64_t r = 0; r < R; r++) {
                    const REAL *const pr = pad + (p * sh + r * dh) * Wp + q * sw;
                    for (int64_t s = 0; s < S; s++) {
                        const REAL *const t = pr + s * dw;
                        vp_SUF v;
                        if (sw == 1) {
                            __builtin_memcpy(&v, t, sizeof v);
                        } else if (sw == 2) {   /* the even elements of two vectors */
                            vp_SUF v0, v1;
                            __builtin_memcpy(&v0, t, sizeof v0);
                            __builtin_memcpy(&v1, t + VP_SUF, sizeof v1);
                            v = EVENS_SUF(v0, v1);
                        } else {
                            REAL tmp[64 / sizeof(REAL)];
                            for (int64_t u = 0; u < VP_SUF; u++)
                                tmp[u] = q + u < Q ? t[u * sw] : 0;
                            __builtin_memcpy(&v, tmp, sizeof v);
                        }
                        acc = vmax_SUF(acc, v);
                    }
                }
                const int64_t m = Q - q < VP_SUF ? Q - q : VP_SUF;
                __builtin_memcpy(yp + p * Q + q, &acc, (size_t)m * sizeof(REAL));
            }
    }
    free(pad);
}

int geon_max_pool_SUF(const REAL *x, REAL *y, const int64_t *g) {
    const int64_t n = g[0] * g[1], want = pool_threads();
    if (n <= 0 || g[6] <= 0 || g[7] <= 0) return 0;   /* nothing to write */
    mjob_SUF j = {x, y, g, n, 0};
    if (want > 1 && n > 1 && pool_worth(n * g[6] * g[7] * g[4] * g[5], PAR_ELEMENTS))
        j.per = (n + POOL_CUT(want) - 1) / POOL_CUT(want);
    pool_run(max_part_SUF, &j, (n + j.per - 1) / j.per);
    return j.failed;
}
"""
#: dtype -> (C type, suffix, NumPy's maximum in C) of the max pooling kernels
_FLOATS = {np.dtype(np.float32): ("float", "f32", "geon_max_f"),
           np.dtype(np.float64): ("double", "f64", "geon_max_d")}

#: element size -> the C type copied
_TYPES = {1: "uint8_t", 2: "uint16_t", 4: "uint32_t", 8: "uint64_t"}
_SYMBOLS = [f"geon_im2col_{n}" for n in _TYPES] + [c_pool.CLIENT_SYMBOL] \
    + [f"geon_max_pool_{t[1]}" for t in _FLOATS.values()]
#: Copies of at least this many elements are cut into blocks of channels for geon's
#: threads (:mod:`.c_pool`) where the thread policy gives more than one.
PAR_ELEMENTS = 1 << 15
#: Output rows shorter than this are copied through a table of offsets (see the C).
MIN_ROW = 16
#: Convolutions of stride 1 or 2 with output rows of PAD_MIN_ROW to PAD_MAX_ROW elements
#: copy each channel into zero-bordered planes first (see padded in the C). One core of a
#: 2.3 GHz Xeon, 3 x 3 windows, one image: 64 channels of 16 x 16 took 25 us against
#: 57 by the table of offsets, 128 of 8 x 8 25 against 55, 256 of 14 x 14 95 against
#: 333, 64 of 56 x 56 356 against 468 by the copy per row; on 4 x 4 planes (35 against
#: 34) and 2 x 2 (44 against 22) filling the planes cost more than it saved.
PAD_MIN_ROW = 7
PAD_MAX_ROW = 64
_loaded = {}  # (CC, cache folder) -> {element size: ctypes function}, or None


def source():
    """The C source of the kernels, one per element size."""
    return f"#include <stdint.h>\n#include <stdlib.h>\n#include <string.h>\n" \
        f"#define MIN_ROW {MIN_ROW}\n#define PAD_MIN_ROW {PAD_MIN_ROW}\n" \
        f"#define PAD_MAX_ROW {PAD_MAX_ROW}\n#define PAR_ELEMENTS {PAR_ELEMENTS}\n" \
        + c_pool.CLIENT + "".join(
        f"#define T {t}\n" + _TEMPLATE.replace("_SUF", f"_{n}") + "#undef T\n"
        for n, t in _TYPES.items()) + "#include <math.h>\n" + toolchain.MINMAX + "".join(
        _POOL.replace("EVENS_IDX", ", ".join(str(2 * u) for u in range(64 // dt.itemsize)))
        .replace("REAL", real).replace("MAX_SUF", mx).replace("_SUF", "_" + suffix)
        for dt, (real, suffix, mx) in _FLOATS.items())


def _bind(lib):
    c_pool.attach(lib)
    fns = {}
    for n in _TYPES:
        f = getattr(lib, f"geon_im2col_{n}")
        f.argtypes = [ctypes.c_void_p] * 3
        f.restype = ctypes.c_int
        fns[n] = f
    for dtype, (_, suffix, _) in _FLOATS.items():
        f = getattr(lib, f"geon_max_pool_{suffix}")
        f.argtypes = [ctypes.c_void_p] * 3
        f.restype = ctypes.c_int
        fns["max_pool", dtype] = f
    return fns


def kernels():
    """``{element size: ctypes function}``, or None where the compiled path is off or
    cannot run here."""
    return compiled.fixed_library(_loaded, "im2col kernels", source, _SYMBOLS, _bind)


def usable(x, kernel):
    """Whether :func:`im2col` copies the windows of ``x`` for a ``kernel`` of this
    rank: a C-contiguous array of 1 or 2 spatial dims whose element size has a
    kernel."""
    return len(kernel) in (1, 2) and x.ndim == 2 + len(kernel) \
        and x.dtype.itemsize in _TYPES and x.flags.c_contiguous


def im2col(fns, x, cols, kernel, out, strides, pads, dilation):
    """Write the windows of ``x`` (B, C, *S) into ``cols``, a C-contiguous array of
    B * C * prod(kernel) * prod(out) elements of x's dtype, in the order (C, *kernel,
    B, *out) (see :func:`usable`); ``pads``: ((lo, hi), ...) per spatial dim (only
    the ``lo`` are read: ``out`` fixes the rest)."""
    if len(kernel) == 1:   # 1-d: one row per image
        x = x.reshape(x.shape[:2] + (1,) + x.shape[2:])
        kernel, out = (1, *kernel), (1, *out)
        strides, pads, dilation = (1, *strides), ((0, 0), *pads), (1, *dilation)
    held = pointwise.geometry((*x.shape, *kernel, *out, *strides, pads[0][0],
                               pads[1][0], *dilation, x.shape[1]))
    if fns[x.dtype.itemsize](x.ctypes.data, cols.ctypes.data, held[1]):
        raise MemoryError("no memory for the offsets of an im2col copy")


def max_pool(fns, x, out, kernel, strides, pads, dilation):
    """``out`` (B, C, *P) = the maximum of each window of ``x`` (B, C, *S) by the C
    kernel, where it applies: True; else False (nothing written). It applies to 1-d and
    2-d windows of C-contiguous float32 or float64 arrays (windows out of the image
    skipped: the strided path's -inf padding)."""
    f = fns.get(("max_pool", x.dtype))
    if f is None or len(kernel) not in (1, 2) or x.ndim != 2 + len(kernel) \
            or out.dtype != x.dtype or out.ndim != x.ndim or out.shape[:2] != x.shape[:2] \
            or not (x.flags.c_contiguous and out.flags.c_contiguous and out.flags.writeable):
        return False
    if np.may_share_memory(x, out) or x.size == 0:
        return False   # (an empty image: NumPy's path fills out with -inf)
    if len(kernel) == 1:   # 1-d: one row per image
        x = x.reshape(x.shape[:2] + (1,) + x.shape[2:])
        kernel, strides, pads, dilation = (1, *kernel), (1, *strides), ((0, 0), *pads), \
            (1, *dilation)
        out = out.reshape(out.shape[:2] + (1,) + out.shape[2:])
    held = pointwise.geometry((*x.shape, *kernel, *out.shape[2:], *strides, pads[0][0],
                               pads[1][0], *dilation, x.shape[1]))
    return f(x.ctypes.data, out.ctypes.data, held[1]) == 0   # (1: no memory for its
    # padded planes: NumPy's path writes all of out again)
