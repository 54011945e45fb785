/* kernels.c: the computations of libgeon_native on strided values.
 *
 * Elementwise ops work a row (the last dimension, merged with the ones every operand
 * steps through contiguously) at a time. When the result and its operands are all
 * float32 or all float64, typed loops run on the elements themselves (run_typed; an
 * op whose value only one other elementwise op reads can run inside that op's pass,
 * gn_run_fused); otherwise each operand's row is
 * loaded into a double buffer whatever its dtype and strides, the op runs on the
 * buffers, and the result row is stored in the output's dtype. float64 results are
 * thus computed exactly as NumPy does; float32 results are computed in double and
 * rounded once (within an ulp of NumPy's float32 arithmetic). Reductions accumulate in
 * double. Gemm calls BLAS (cblas_?gemm) when the library was built with one, on
 * operands that have a unit stride in one of their two dimensions (others are packed
 * first), and a plain C loop otherwise; with BLAS, an SGD update w - c * (a @ b) is
 * one call that accumulates into w (gn_run_gemm_update). */
#include <math.h>
#include <string.h>

#include "runtime.h"

#ifdef GEON_HAVE_BLAS
#include <cblas.h>
#ifdef GEON_BLAS_SCIPY
/* scipy-openblas prefixes its symbols with scipy_ */
#define GN_DGEMM scipy_cblas_dgemm
#define GN_SGEMM scipy_cblas_sgemm
#else
#define GN_DGEMM cblas_dgemm
#define GN_SGEMM cblas_sgemm
#endif
#endif

const char *gn_blas_name(void) {
#ifdef GEON_HAVE_BLAS
  return "BLAS (cblas_?gemm)";
#else
  return "plain C GEMM (built without BLAS)";
#endif
}

int gn_have_blas(void) {
#ifdef GEON_HAVE_BLAS
  return 1;
#else
  return 0;
#endif
}

const int gn_dtype_size[DT_COUNT] = {1, 1, 2, 4, 8, 1, 2, 4, 8, 4, 8};
const char *const gn_dtype_name[DT_COUNT] = {"bool", "int8", "int16", "int32", "int64",
                                             "uint8", "uint16", "uint32", "uint64",
                                             "float32", "float64"};

double gn_load(const char *p, gn_dtype t) {
  switch (t) {
    case DT_BOOL: return *(const uint8_t *)p ? 1.0 : 0.0;
    case DT_I8: return *(const int8_t *)p;
    case DT_I16: return *(const int16_t *)p;
    case DT_I32: return *(const int32_t *)p;
    case DT_I64: return (double)*(const int64_t *)p;
    case DT_U8: return *(const uint8_t *)p;
    case DT_U16: return *(const uint16_t *)p;
    case DT_U32: return *(const uint32_t *)p;
    case DT_U64: return (double)*(const uint64_t *)p;
    case DT_F32: return *(const float *)p;
    default: return *(const double *)p;
  }
}

/* Integers: NaN and out-of-range values become 0 rather than undefined behaviour. */
#define GN_TO_INT(T, lo, hi) ((v == v && v >= (lo) && v <= (hi)) ? (T)v : (T)0)

void gn_store(char *p, gn_dtype t, double v) {
  switch (t) {
    case DT_BOOL: *(uint8_t *)p = v != 0.0; break;
    case DT_I8: *(int8_t *)p = GN_TO_INT(int8_t, -128.0, 127.0); break;
    case DT_I16: *(int16_t *)p = GN_TO_INT(int16_t, -32768.0, 32767.0); break;
    case DT_I32: *(int32_t *)p = GN_TO_INT(int32_t, -2147483648.0, 2147483647.0); break;
    case DT_I64: *(int64_t *)p = GN_TO_INT(int64_t, -9.2233720368547758e18, 9.2233720368547748e18); break;
    case DT_U8: *(uint8_t *)p = GN_TO_INT(uint8_t, 0.0, 255.0); break;
    case DT_U16: *(uint16_t *)p = GN_TO_INT(uint16_t, 0.0, 65535.0); break;
    case DT_U32: *(uint32_t *)p = GN_TO_INT(uint32_t, 0.0, 4294967295.0); break;
    case DT_U64: *(uint64_t *)p = GN_TO_INT(uint64_t, 0.0, 1.8446744073709550e19); break;
    case DT_F32: *(float *)p = (float)v; break;
    default: *(double *)p = v; break;
  }
}

/* v describes a compact row-major buffer at data. */
void gn_set_compact(gn_value *v, char *data, const void *storage) {
  int64_t step = 1;
  for (int d = v->ndim - 1; d >= 0; d--) {
    v->strides[d] = step;
    step *= v->shape[d];
  }
  v->data = data;
  v->storage = storage;
}

/* Strides for `to` (same elements, another shape) that read `from`'s elements in
 * row-major order without a copy; 0 when no strides can. Dimensions of length 1 are
 * left out, then the old and new dimensions are matched in groups of equal products:
 * the old dimensions of a group must be contiguous among themselves. */
int gn_reshape_strides(const gn_value *from, gn_value *to) {
  int64_t os[GN_MAX_DIMS], ost[GN_MAX_DIMS];
  int on = 0;
  if (from->size == 0) { gn_set_compact(to, from->data, from->storage); return 1; }
  for (int d = 0; d < from->ndim; d++) {
    if (from->shape[d] != 1) { os[on] = from->shape[d]; ost[on] = from->strides[d]; on++; }
  }
  int i = 0, j = 0; /* old and new dimension */
  while (j < to->ndim) {
    if (to->shape[j] == 1) { to->strides[j++] = 0; continue; }
    int i0 = i, j0 = j;
    int64_t po = os[i++], pn = to->shape[j++];
    while (po != pn) {
      if (po < pn) po *= os[i++]; else {
        while (j < to->ndim && to->shape[j] == 1) j++;
        pn *= to->shape[j++];
      }
    }
    for (int k = i0; k < i - 1; k++) {
      if (ost[k] != ost[k + 1] * os[k + 1]) return 0;
    }
    /* the new dimensions of the group step through the last old one's stride */
    int64_t stride = ost[i - 1];
    for (int k = j - 1; k >= j0; k--) {
      if (to->shape[k] == 1) { to->strides[k] = 0; continue; }
      to->strides[k] = stride;
      stride *= to->shape[k];
    }
  }
  to->data = from->data;
  to->storage = from->storage;
  return 1;
}

/* Walk the outer dimensions (all but the last) of shape in row-major order:
 * calls body with the element offsets of each operand for the row's first element. */
typedef struct {
  int ndim;
  const int64_t *shape;
  int64_t idx[GN_MAX_DIMS];
} outer_iter;

/* Advance to the next row; 0 when done. offs[k] moves by strides[k][d]. */
static int next_row(outer_iter *it, int n, int64_t *offs, const int64_t *const *strides) {
  for (int d = it->ndim - 2; d >= 0; d--) {
    it->idx[d]++;
    for (int k = 0; k < n; k++) offs[k] += strides[k][d];
    if (it->idx[d] < it->shape[d]) return 1;
    for (int k = 0; k < n; k++) offs[k] -= strides[k][d] * it->shape[d];
    it->idx[d] = 0;
  }
  return 0;
}

static int merge_dims(int nd, int64_t *shape, int n, int64_t (*strides)[GN_MAX_DIMS]);

/* One row of n elements of size z, same dtype: one memcpy where both are contiguous,
 * else typed element moves. */
static void copy_row(char *o, int64_t sd, const char *s, int64_t ss, int64_t n, int z) {
  if (sd == 1 && ss == 1) { memcpy(o, s, (size_t)(n * z)); return; }
  int64_t i;
  switch (z) {
    case 8: for (i = 0; i < n; i++) ((uint64_t *)o)[i * sd] = ((const uint64_t *)s)[i * ss]; break;
    case 4: for (i = 0; i < n; i++) ((uint32_t *)o)[i * sd] = ((const uint32_t *)s)[i * ss]; break;
    case 2: for (i = 0; i < n; i++) ((uint16_t *)o)[i * sd] = ((const uint16_t *)s)[i * ss]; break;
    default: for (i = 0; i < n; i++) o[i * sd] = s[i * ss]; break;
  }
}

void gn_copy_values(gn_value *dst, const gn_value *src) {
  if (dst->size == 0) return;
  int nd = dst->ndim;
  int64_t shape[GN_MAX_DIMS], st[2][GN_MAX_DIMS];
  for (int d = 0; d < nd; d++) {
    shape[d] = dst->shape[d];
    st[0][d] = dst->strides[d];
    st[1][d] = src->ndim ? src->strides[d] : 0;
  }
  nd = merge_dims(nd, shape, 2, st);
  const int64_t *strides[2] = {st[0], st[1]};
  int64_t n = nd ? shape[nd - 1] : 1;
  int64_t sd = nd ? st[0][nd - 1] : 0, ss = nd ? st[1][nd - 1] : 0;
  int64_t offs[2] = {0, 0};
  int zd = gn_dtype_size[dst->dtype], zs = gn_dtype_size[src->dtype];
  outer_iter it = {nd, shape, {0}};
  do {
    char *o = dst->data + offs[0] * zd;
    const char *s = src->data + offs[1] * zs;
    if (dst->dtype == src->dtype) {
      copy_row(o, sd, s, ss, n, zd);
    } else {
      for (int64_t i = 0; i < n; i++) gn_store(o + i * sd * zd, dst->dtype, gn_load(s + i * ss * zs, src->dtype));
    }
  } while (nd > 1 && next_row(&it, 2, offs, strides));
}

#define CHUNK 256

static void load_row(double *buf, const char *p, int64_t stride, gn_dtype t, int64_t n) {
  int z = gn_dtype_size[t];
  if (t == DT_F64) {
    const double *x = (const double *)p;
    for (int64_t i = 0; i < n; i++) buf[i] = x[i * stride];
  } else if (t == DT_F32) {
    const float *x = (const float *)p;
    for (int64_t i = 0; i < n; i++) buf[i] = x[i * stride];
  } else {
    for (int64_t i = 0; i < n; i++) buf[i] = gn_load(p + i * stride * z, t);
  }
}

static void store_row(char *p, gn_dtype t, const double *buf, int64_t n) {
  if (t == DT_F64) memcpy(p, buf, (size_t)n * sizeof(double));
  else if (t == DT_F32) {
    float *y = (float *)p;
    for (int64_t i = 0; i < n; i++) y[i] = (float)buf[i];
  } else {
    for (int64_t i = 0; i < n; i++) gn_store(p + i * gn_dtype_size[t], t, buf[i]);
  }
}

/* e**x for a float32 result: in double, exact to about 1e-15 relative (2**k times a
 * polynomial of r = x - k ln 2, |r| <= ln 2 / 2), so that rounding it to float32 gives
 * the bits of (float)exp(x) but where exp(x) lies within 1e-15 of a rounding boundary;
 * no branches and no calls, so that loops of it vectorize. x is clamped to [-150, 100]
 * first (the float32 results there are 0 and inf); NaN stays NaN. */
static inline double gn_exp_f32(double x) {
  x = x < -150.0 ? -150.0 : x > 100.0 ? 100.0 : x;
  double t = x * 1.4426950408889634 + 0x1.8p52;  /* rounds x / ln 2 to an integer k */
  double k = t - 0x1.8p52;
  double r = (x - k * 0x1.62e42fefa3800p-1) - k * 0x1.ef35793c76730p-45;
  double p = 1.0 / 479001600.0;
  p = p * r + 1.0 / 39916800.0;
  p = p * r + 1.0 / 3628800.0;
  p = p * r + 1.0 / 362880.0;
  p = p * r + 1.0 / 40320.0;
  p = p * r + 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  uint64_t bits;
  memcpy(&bits, &t, 8);
  bits = (bits + 1023) << 52;  /* the low bits of t hold k: 2**k */
  double scale;
  memcpy(&scale, &bits, 8);
  return p * scale;
}

static double gn_sign(double x) { return x > 0 ? 1.0 : x < 0 ? -1.0 : x == 0 ? 0.0 : x; }
static double gn_max(double a, double b) { return a != a ? a : b != b ? b : a > b ? a : b; }
static double gn_min(double a, double b) { return a != a ? a : b != b ? b : a < b ? a : b; }
/* softplus(x) - x t as log1p(exp(-|x|)) + |x| w, w = 1 - t where x > 0 and t elsewhere;
 * the product is left out where w is 0, so an infinite logit with its matching target
 * gives 0 rather than inf - inf (geon's sigmoid_ce). */
static double gn_sigmoid_ce(double x, double t) {
  double ax = fabs(x), w = x > 0 ? 1.0 - t : t;
  return log1p(exp(-ax)) + (w != 0.0 ? ax * w : 0.0);
}
static double gn_softplus(double x) {
  return x != x ? x : (x > 0 ? x : 0.0) + log1p(exp(-fabs(x)));
}

/* y = op(a, b) on n doubles (b unused by unary ops). */
static void apply(gn_kind k, const double *a, const double *b, double *y, int64_t n) {
  int64_t i;
  switch (k) {
    case OP_ADD: for (i = 0; i < n; i++) y[i] = a[i] + b[i]; break;
    case OP_SUB: for (i = 0; i < n; i++) y[i] = a[i] - b[i]; break;
    case OP_MUL: for (i = 0; i < n; i++) y[i] = a[i] * b[i]; break;
    case OP_DIV: for (i = 0; i < n; i++) y[i] = a[i] / b[i]; break;
    case OP_MAX: for (i = 0; i < n; i++) y[i] = gn_max(a[i], b[i]); break;
    case OP_MIN: for (i = 0; i < n; i++) y[i] = gn_min(a[i], b[i]); break;
    case OP_POW: for (i = 0; i < n; i++) y[i] = pow(a[i], b[i]); break;
    case OP_EQ: for (i = 0; i < n; i++) y[i] = a[i] == b[i]; break;
    case OP_NE: for (i = 0; i < n; i++) y[i] = a[i] != b[i]; break;
    case OP_LT: for (i = 0; i < n; i++) y[i] = a[i] < b[i]; break;
    case OP_LE: for (i = 0; i < n; i++) y[i] = a[i] <= b[i]; break;
    case OP_GT: for (i = 0; i < n; i++) y[i] = a[i] > b[i]; break;
    case OP_GE: for (i = 0; i < n; i++) y[i] = a[i] >= b[i]; break;
    case OP_SIGMOID_CE: for (i = 0; i < n; i++) y[i] = gn_sigmoid_ce(a[i], b[i]); break;
    case OP_NEG: for (i = 0; i < n; i++) y[i] = -a[i]; break;
    case OP_ABS: for (i = 0; i < n; i++) y[i] = fabs(a[i]); break;
    case OP_SIGN: for (i = 0; i < n; i++) y[i] = gn_sign(a[i]); break;
    case OP_SQUARE: for (i = 0; i < n; i++) y[i] = a[i] * a[i]; break;
    case OP_SQRT: for (i = 0; i < n; i++) y[i] = sqrt(a[i]); break;
    case OP_RECIP: for (i = 0; i < n; i++) y[i] = 1.0 / a[i]; break;
    case OP_EXP: for (i = 0; i < n; i++) y[i] = exp(a[i]); break;
    case OP_LOG: for (i = 0; i < n; i++) y[i] = log(a[i]); break;
    case OP_SIN: for (i = 0; i < n; i++) y[i] = sin(a[i]); break;
    case OP_COS: for (i = 0; i < n; i++) y[i] = cos(a[i]); break;
    case OP_TANH: for (i = 0; i < n; i++) y[i] = tanh(a[i]); break;
    case OP_SIGMOID: for (i = 0; i < n; i++) y[i] = 1.0 / (1.0 + exp(-a[i])); break;
    case OP_ERF: for (i = 0; i < n; i++) y[i] = erf(a[i]); break;
    case OP_EXPM1: for (i = 0; i < n; i++) y[i] = expm1(a[i]); break;
    case OP_SOFTPLUS: for (i = 0; i < n; i++) y[i] = gn_softplus(a[i]); break;
    default: break;
  }
}

static int is_int_dtype(gn_dtype t) { return t >= DT_I8 && t <= DT_U64; }

/* An integer element as 64 bits (signed ones sign-extended, unsigned ones as they are). */
static uint64_t load_bits(const char *p, gn_dtype t) {
  switch (t) {
    case DT_I8: return (uint64_t)(int64_t)*(const int8_t *)p;
    case DT_I16: return (uint64_t)(int64_t)*(const int16_t *)p;
    case DT_I32: return (uint64_t)(int64_t)*(const int32_t *)p;
    case DT_U8: return *(const uint8_t *)p;
    case DT_U16: return *(const uint16_t *)p;
    case DT_U32: return *(const uint32_t *)p;
    default: return *(const uint64_t *)p;  /* int64, uint64 */
  }
}

/* int64 or uint64 results of + - * max min from integer operands: exact, wrapping
 * modulo 2**64 as NumPy's do (a step counter near 2**63 steps on exactly). */
static int int64_kernel(gn_kind k, gn_dtype t) {
  return (t == DT_I64 || t == DT_U64) &&
         (k == OP_ADD || k == OP_SUB || k == OP_MUL || k == OP_MAX || k == OP_MIN);
}

static void run_int64(gn_op *op, const gn_value *a, const gn_value *b) {
  gn_value *y = &op->out[0];
  static const int64_t zero[GN_MAX_DIMS] = {0};
  int nd = y->ndim, sgn = y->dtype == DT_I64;
  const int64_t *strides[3] = {y->strides, a->ndim ? a->strides : zero, b->ndim ? b->strides : zero};
  int64_t n = nd ? y->shape[nd - 1] : 1;
  int64_t sa = nd ? strides[1][nd - 1] : 0, sb = nd ? strides[2][nd - 1] : 0;
  int64_t offs[3] = {0, 0, 0};
  int za = gn_dtype_size[a->dtype], zb = gn_dtype_size[b->dtype];
  outer_iter it = {nd, y->shape, {0}};
  do {
    uint64_t *o = (uint64_t *)(y->data + offs[0] * 8);
    for (int64_t i = 0; i < n; i++) {
      uint64_t x = load_bits(a->data + (offs[1] + i * sa) * za, a->dtype);
      uint64_t z = load_bits(b->data + (offs[2] + i * sb) * zb, b->dtype);
      int less = sgn ? (int64_t)x < (int64_t)z : x < z;
      uint64_t r;
      switch (op->kind) {
        case OP_ADD: r = x + z; break;
        case OP_SUB: r = x - z; break;
        case OP_MUL: r = x * z; break;
        case OP_MAX: r = less ? z : x; break;
        default: r = less ? x : z; break;
      }
      memcpy(o + i, &r, 8);
    }
  } while (nd > 1 && next_row(&it, 3, offs, strides));
}

/* --- typed elementwise loops ----------------------------------------------------------
 * When the result and every operand are one float dtype, a row runs straight on the
 * elements, with no double buffers: + - * / max min, the comparisons, negation,
 * absolute value, sign, square and reciprocal in the dtype itself (for float32 these
 * give the bits of the double computation rounded once, as the generic path does:
 * double has more than twice float's precision), the other functions in double and
 * rounded once, as the generic path does (exp of float32 by gn_exp_f32, which gives
 * the same bits). Loops are specialized on unit and zero strides so that the compiler
 * vectorizes them. */
#define EW(T, E)                                                                           \
  do {                                                                                     \
    int64_t i;                                                                             \
    if (sa == 1 && sb == 1) {                                                              \
      for (i = 0; i < n; i++) { T x = pa[i], z = pb[i]; (void)z; py[i] = (T)(E); }         \
    } else if (sa == 1 && sb == 0) {                                                       \
      T z = pb[0]; (void)z;                                                                \
      for (i = 0; i < n; i++) { T x = pa[i]; py[i] = (T)(E); }                             \
    } else if (sa == 0 && sb == 1) {                                                       \
      T x = pa[0]; (void)x;                                                                \
      for (i = 0; i < n; i++) { T z = pb[i]; (void)z; py[i] = (T)(E); }                    \
    } else {                                                                               \
      for (i = 0; i < n; i++) { T x = pa[i * sa], z = pb[i * sb]; (void)z; py[i] = (T)(E); } \
    }                                                                                      \
  } while (0)

/* The hot loops are also compiled for AVX2 (chosen at load time where the CPU has it:
 * twice the SSE2 baseline's width) where the compiler and the platform can (GCC or
 * clang, x86-64, glibc's ifuncs: not musl); AVX2 has no fused multiply-add, so the
 * results are those of the baseline code. */
#if defined(__x86_64__) && defined(__GLIBC__) && defined(__GNUC__) && !defined(GEON_NO_CLONES) && \
    (defined(__clang__) ? __clang_major__ >= 14 : __GNUC__ >= 6)
#define GN_HOT __attribute__((target_clones("avx2", "default")))
#else
#define GN_HOT
#endif

#define EW_KERNEL(T, NAME)                                                                 \
  GN_HOT static void NAME(gn_kind k, const T *pa, int64_t sa, const T *pb, int64_t sb,     \
                   T *py, int64_t n) {                                                     \
    switch (k) {                                                                           \
      case OP_ADD: EW(T, x + z); break;                                                    \
      case OP_SUB: EW(T, x - z); break;                                                    \
      case OP_MUL: EW(T, x * z); break;                                                    \
      case OP_DIV: EW(T, x / z); break;                                                    \
      /* (against one number that is not NaN, as a ReLU: one comparison, same results) */  \
      case OP_MAX:                                                                         \
        if (sb == 0 && sa == 1 && pb[0] == pb[0]) EW(T, !(x <= z) ? x : z);                \
        else if (sa == 0 && sb == 1 && pa[0] == pa[0]) EW(T, x > z ? x : z);               \
        else EW(T, x != x ? x : z != z ? z : x > z ? x : z);                               \
        break;                                                                             \
      case OP_MIN:                                                                         \
        if (sb == 0 && sa == 1 && pb[0] == pb[0]) EW(T, !(x >= z) ? x : z);                \
        else if (sa == 0 && sb == 1 && pa[0] == pa[0]) EW(T, x < z ? x : z);               \
        else EW(T, x != x ? x : z != z ? z : x < z ? x : z);                               \
        break;                                                                             \
      case OP_POW: EW(T, pow((double)x, (double)z)); break;                                \
      case OP_EQ: EW(T, x == z ? (T)1 : (T)0); break;                                      \
      case OP_NE: EW(T, x != z ? (T)1 : (T)0); break;                                      \
      case OP_LT: EW(T, x < z ? (T)1 : (T)0); break;                                       \
      case OP_LE: EW(T, x <= z ? (T)1 : (T)0); break;                                      \
      case OP_GT: EW(T, x > z ? (T)1 : (T)0); break;                                       \
      case OP_GE: EW(T, x >= z ? (T)1 : (T)0); break;                                      \
      case OP_SIGMOID_CE: EW(T, gn_sigmoid_ce((double)x, (double)z)); break;               \
      case OP_NEG: EW(T, -x); break;                                                       \
      case OP_ABS: EW(T, fabs((double)x)); break;                                          \
      case OP_SIGN: EW(T, gn_sign((double)x)); break;                                      \
      case OP_SQUARE: EW(T, x * x); break;                                                 \
      case OP_SQRT: EW(T, sqrt((double)x)); break;                                         \
      case OP_RECIP: EW(T, (T)1 / x); break;                                               \
      case OP_EXP:                                                                         \
        if (sizeof(T) == 4) EW(T, gn_exp_f32((double)x));                                  \
        else EW(T, exp((double)x));                                                        \
        break;                                                                             \
      case OP_LOG: EW(T, log((double)x)); break;                                           \
      case OP_SIN: EW(T, sin((double)x)); break;                                           \
      case OP_COS: EW(T, cos((double)x)); break;                                           \
      case OP_TANH: EW(T, tanh((double)x)); break;                                         \
      case OP_SIGMOID: EW(T, 1.0 / (1.0 + exp(-(double)x))); break;                        \
      case OP_ERF: EW(T, erf((double)x)); break;                                           \
      case OP_EXPM1: EW(T, expm1((double)x)); break;                                       \
      case OP_SOFTPLUS: EW(T, gn_softplus((double)x)); break;                              \
      default: break;                                                                      \
    }                                                                                      \
  }
EW_KERNEL(float, ew_float)
EW_KERNEL(double, ew_double)

/* Merge the dimensions of shape that every operand steps through as one (the row
 * then spans them): fewer, longer rows. Returns the new number of dimensions. */
static int merge_dims(int nd, int64_t *shape, int n, int64_t (*strides)[GN_MAX_DIMS]) {
  if (nd <= 1) return nd;
  int out = nd - 1;  /* the last kept dimension, filled from the right */
  for (int d = nd - 2; d >= 0; d--) {
    int ok = 1;
    for (int k = 0; ok && k < n; k++) ok = strides[k][d] == strides[k][out] * shape[out];
    if (ok) { shape[out] *= shape[d]; continue; }
    out--;
    shape[out] = shape[d];
    for (int k = 0; k < n; k++) strides[k][out] = strides[k][d];
  }
  int m = nd - out;
  if (out) {
    memmove(shape, shape + out, (size_t)m * sizeof *shape);
    for (int k = 0; k < n; k++) memmove(strides[k], strides[k] + out, (size_t)m * sizeof(int64_t));
  }
  return m;
}

static void tail_row(gn_op *r, int64_t j, const char *row, int64_t n, int f32);

/* (tail: a ReduceSum along the rows of op's value, done row by row as they are
 * computed; the rows are then not merged) */
static int run_typed(gn_op *op, const gn_value *a, const gn_value *b, gn_op *tail) {
  gn_value *y = &op->out[0];
  gn_dtype t = y->dtype;
  if ((t != DT_F32 && t != DT_F64) || a->dtype != t || (b && b->dtype != t)) return 0;
  int nd = y->ndim;
  int64_t shape[GN_MAX_DIMS], st[3][GN_MAX_DIMS];
  for (int d = 0; d < nd; d++) {
    shape[d] = y->shape[d];
    st[0][d] = y->strides[d];
    st[1][d] = a->ndim ? a->strides[d] : 0;
    st[2][d] = b && b->ndim ? b->strides[d] : 0;
  }
  if (!b) memcpy(st[2], st[1], sizeof st[1]);
  if (!tail) nd = merge_dims(nd, shape, 3, st);
  const int64_t *strides[3] = {st[0], st[1], st[2]};
  int64_t n = nd ? shape[nd - 1] : 1;
  int64_t sa = nd ? st[1][nd - 1] : 0, sb = nd ? st[2][nd - 1] : 0;
  int64_t offs[3] = {0, 0, 0}, j = 0;
  const gn_value *bb = b ? b : a;
  outer_iter it = {nd, shape, {0}};
  do {
    if (t == DT_F32)
      ew_float(op->kind, (const float *)a->data + offs[1], sa, (const float *)bb->data + offs[2], sb,
               (float *)y->data + offs[0], n);
    else
      ew_double(op->kind, (const double *)a->data + offs[1], sa, (const double *)bb->data + offs[2], sb,
                (double *)y->data + offs[0], n);
    if (tail) tail_row(tail, j++, y->data + offs[0] * gn_dtype_size[t], n, t == DT_F32);
  } while (nd > 1 && next_row(&it, 3, offs, strides));
  return 1;
}

/* q's value = q(qa, qb) where q's arg `at` is p(pa, pb) (unary ops: the second arg
 * NULL), p's value computed a piece of a row at a time into a buffer on the stack
 * rather than into memory of its own: one pass over the elements for the two ops
 * (every operand float32 or every one float64, each of q's shape or 0-d; the memory
 * plan pairs them, plan.c). */
#define FUSED_PIECE 512

void gn_run_fused(gn_op *q, const gn_value *qa, const gn_value *qb, int at, gn_kind pk,
                  const gn_value *pa, const gn_value *pb, gn_op *tail) {
  gn_value *y = &q->out[0];
  if (y->size == 0) return;
  int f32 = y->dtype == DT_F32, z = f32 ? 4 : 8;
  int nd = y->ndim;
  const gn_value *ops[4] = {y, at == 0 ? (qb ? qb : pa) : qa, pa, pb ? pb : pa};
  int64_t shape[GN_MAX_DIMS], st[4][GN_MAX_DIMS];
  for (int d = 0; d < nd; d++) {
    shape[d] = y->shape[d];
    for (int k = 0; k < 4; k++) st[k][d] = ops[k]->ndim ? ops[k]->strides[d] : 0;
  }
  if (!tail) nd = merge_dims(nd, shape, 4, st);
  const int64_t *strides[4] = {st[0], st[1], st[2], st[3]};
  int64_t n = nd ? shape[nd - 1] : 1, s[4], j = 0;
  for (int k = 0; k < 4; k++) s[k] = nd ? st[k][nd - 1] : 0;
  int64_t offs[4] = {0, 0, 0, 0};
  double buf[FUSED_PIECE];  /* (float32 pieces use its first half) */
  outer_iter it = {nd, shape, {0}};
  do {
    for (int64_t i0 = 0; i0 < n; i0 += FUSED_PIECE) {
      int64_t m = n - i0 < FUSED_PIECE ? n - i0 : FUSED_PIECE;
      const char *o1 = ops[1]->data + (offs[1] + i0 * s[1]) * z;
      const char *o2 = ops[2]->data + (offs[2] + i0 * s[2]) * z;
      const char *o3 = ops[3]->data + (offs[3] + i0 * s[3]) * z;
      char *oy = y->data + (offs[0] + i0 * s[0]) * z;
      if (f32) {
        float *t = (float *)buf;
        ew_float(pk, (const float *)o2, s[2], (const float *)o3, s[3], t, m);
        if (at == 0) ew_float(q->kind, t, 1, qb ? (const float *)o1 : t, qb ? s[1] : 1, (float *)oy, m);
        else ew_float(q->kind, (const float *)o1, s[1], t, 1, (float *)oy, m);
      } else {
        double *t = buf;
        ew_double(pk, (const double *)o2, s[2], (const double *)o3, s[3], t, m);
        if (at == 0) ew_double(q->kind, t, 1, qb ? (const double *)o1 : t, qb ? s[1] : 1, (double *)oy, m);
        else ew_double(q->kind, (const double *)o1, s[1], t, 1, (double *)oy, m);
      }
    }
    if (tail) tail_row(tail, j++, y->data + offs[0] * z, n, f32);
  } while (nd > 1 && next_row(&it, 4, offs, strides));
}

/* Integer results of + - * and max/min of int64 or uint64 are exact (run_int64); of
 * narrower integers, computed in double, exact below 2**53. */
void gn_run_elementwise(gn_op *op, const gn_value *a, const gn_value *b, gn_op *tail) {
  gn_value *y = &op->out[0];
  if (y->size == 0) return;
  if (b && int64_kernel(op->kind, y->dtype) && is_int_dtype(a->dtype) && is_int_dtype(b->dtype)) {
    run_int64(op, a, b);
    return;
  }
  if (run_typed(op, a, b, tail)) return;
  static const int64_t zero[GN_MAX_DIMS] = {0};
  int nd = y->ndim, na = b ? 3 : 2;
  const int64_t *strides[3] = {y->strides, a->ndim ? a->strides : zero,
                               b && b->ndim ? b->strides : zero};
  int64_t n = nd ? y->shape[nd - 1] : 1;
  int64_t sa = nd ? strides[1][nd - 1] : 0, sb = nd ? strides[2][nd - 1] : 0;
  int64_t offs[3] = {0, 0, 0};
  double ba[CHUNK], bb[CHUNK], by[CHUNK];
  int zy = gn_dtype_size[y->dtype], za = gn_dtype_size[a->dtype];
  int zb = b ? gn_dtype_size[b->dtype] : 0;
  outer_iter it = {nd, y->shape, {0}};
  do {
    for (int64_t i0 = 0; i0 < n; i0 += CHUNK) {
      int64_t m = n - i0 < CHUNK ? n - i0 : CHUNK;
      load_row(ba, a->data + (offs[1] + i0 * sa) * za, sa, a->dtype, m);
      if (b) load_row(bb, b->data + (offs[2] + i0 * sb) * zb, sb, b->dtype, m);
      apply(op->kind, ba, bb, by, m);
      store_row(y->data + (offs[0] + i0) * zy, y->dtype, by, m);
    }
  } while (nd > 1 && next_row(&it, na, offs, strides));
}

/* --- reductions ------------------------------------------------------------------------
 * Each output element j reduces its line of n elements in order (a sum with eight
 * double accumulators, interleaved; a product in one), accumulating in double. The
 * maxima and minima take the first NaN, else the first extreme. A line that steps
 * through memory while its neighbours are adjacent (a reduced axis that is not the
 * inner one) is read a block of lines at a time, element i of each in turn. */
#define RED_BLOCK 256

static int is_max_kind(gn_kind k) { return k == OP_RMAX || k == OP_RARGMAX || k == OP_RMAXARGMAX; }

#define REDUCE_LINE(T, NAME)                                                               \
  GN_HOT static double NAME(gn_kind k, const T *p, int64_t n, int64_t sn, int64_t *at_out) {     \
    int64_t at = 0;                                                                        \
    if (k == OP_RSUM) {                                                                    \
      double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};                                              \
      int64_t i = 0;                                                                       \
      if (sn == 1) /* (the same sums, in a loop that vectorizes) */                        \
        for (; i + 8 <= n; i += 8)                                                         \
          for (int r = 0; r < 8; r++) s[r] += (double)p[i + r];                            \
      for (; i + 8 <= n; i += 8)                                                           \
        for (int r = 0; r < 8; r++) s[r] += (double)p[(i + r) * sn];                      \
      for (int r = 0; i < n; i++, r++) s[r] += (double)p[i * sn];                          \
      return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));            \
    }                                                                                      \
    if (k == OP_RPROD) {                                                                   \
      double acc = 1.0;                                                                    \
      for (int64_t i = 0; i < n; i++) acc *= (double)p[i * sn];                            \
      return acc;                                                                          \
    }                                                                                      \
    if (n == 0) { *at_out = 0; return NAN; }                                               \
    double acc = (double)p[0];                                                             \
    int mx = is_max_kind(k);                                                               \
    for (int64_t i = 1; i < n && acc == acc; i++) {                                        \
      double v = (double)p[i * sn];                                                        \
      if (v != v || (mx ? v > acc : v < acc)) { acc = v; at = i; }                         \
    }                                                                                      \
    *at_out = at;                                                                          \
    return acc;                                                                            \
  }
REDUCE_LINE(float, line_float)
REDUCE_LINE(double, line_double)

/* Lines j0 .. j0 + w - 1, adjacent (stride 1 between them), each stepping by sn. */
#define REDUCE_BLOCK(T, NAME)                                                              \
  GN_HOT static void NAME(gn_kind k, const T *p, int64_t n, int64_t sn, int64_t w, double *acc,  \
                   int64_t *at) {                                                          \
    int64_t j, i;                                                                          \
    for (j = 0; j < w; j++) at[j] = 0;                                                     \
    if (k == OP_RSUM || k == OP_RPROD) {                                                   \
      double init = k == OP_RSUM ? 0.0 : 1.0;                                              \
      for (j = 0; j < w; j++) acc[j] = init;                                               \
      for (i = 0; i < n; i++) {                                                            \
        const T *row = p + i * sn;                                                         \
        if (k == OP_RSUM) for (j = 0; j < w; j++) acc[j] += (double)row[j];                \
        else for (j = 0; j < w; j++) acc[j] *= (double)row[j];                             \
      }                                                                                    \
      return;                                                                              \
    }                                                                                      \
    if (n == 0) { for (j = 0; j < w; j++) acc[j] = NAN; return; }                          \
    for (j = 0; j < w; j++) acc[j] = (double)p[j];                                         \
    if (k == OP_RMAX || k == OP_RMIN) { /* no positions: selects that vectorize */         \
      for (i = 1; i < n; i++) {                                                            \
        const T *row = p + i * sn;                                                         \
        if (k == OP_RMAX)                                                                  \
          for (j = 0; j < w; j++) {                                                        \
            double v = (double)row[j], c = acc[j];                                         \
            acc[j] = c == c && (v != v || v > c) ? v : c;                                  \
          }                                                                                \
        else                                                                               \
          for (j = 0; j < w; j++) {                                                        \
            double v = (double)row[j], c = acc[j];                                         \
            acc[j] = c == c && (v != v || v < c) ? v : c;                                  \
          }                                                                                \
      }                                                                                    \
      return;                                                                              \
    }                                                                                      \
    int mx = is_max_kind(k);                                                               \
    for (i = 1; i < n; i++) {                                                              \
      const T *row = p + i * sn;                                                           \
      for (j = 0; j < w; j++) {                                                            \
        double v = (double)row[j], c = acc[j];                                             \
        if (c == c && (v != v || (mx ? v > c : v < c))) { acc[j] = v; at[j] = i; }         \
      }                                                                                    \
    }                                                                                      \
  }
REDUCE_BLOCK(float, block_float)
REDUCE_BLOCK(double, block_double)

static void reduce_store(gn_op *op, int64_t j, double acc, int64_t at) {
  gn_kind k = op->kind;
  if (k == OP_RARGMAX || k == OP_RARGMIN) {
    ((int64_t *)op->out[0].data)[j] = at;
  } else {
    gn_dtype t = op->out[0].dtype;
    if (t == DT_F32) ((float *)op->out[0].data)[j] = (float)acc;
    else if (t == DT_F64) ((double *)op->out[0].data)[j] = acc;
    else gn_store(op->out[0].data + j * gn_dtype_size[t], t, acc);
    if (k == OP_RMAXARGMAX) ((int64_t *)op->out[1].data)[j] = at;
  }
}

/* Element j of the ReduceSum r along rows: the row of n elements (compact) at row. */
static void tail_row(gn_op *r, int64_t j, const char *row, int64_t n, int f32) {
  int64_t at = 0;
  reduce_store(r, j, f32 ? line_float(OP_RSUM, (const float *)row, n, 1, &at)
                         : line_double(OP_RSUM, (const double *)row, n, 1, &at), 0);
}

/* Reduce dimension op->axis of x (at most 2-D) into op->out (compact). */
void gn_run_reduce(gn_op *op, const gn_value *x) {
  int64_t n = x->shape[op->axis], sn = x->strides[op->axis];
  int other = x->ndim == 2 ? 1 - op->axis : -1;
  int64_t m = other >= 0 ? x->shape[other] : 1, sm = other >= 0 ? x->strides[other] : 0;
  int z = gn_dtype_size[x->dtype];
  gn_kind k = op->kind;
  if (x->dtype == DT_F32 || x->dtype == DT_F64) {
    int f32 = x->dtype == DT_F32;
    if (sm == 1 && m > 1 && sn != 1) {
      double acc[RED_BLOCK];
      int64_t at[RED_BLOCK];
      for (int64_t j0 = 0; j0 < m; j0 += RED_BLOCK) {
        int64_t w = m - j0 < RED_BLOCK ? m - j0 : RED_BLOCK;
        if (f32) block_float(k, (const float *)x->data + j0, n, sn, w, acc, at);
        else block_double(k, (const double *)x->data + j0, n, sn, w, acc, at);
        for (int64_t j = 0; j < w; j++) reduce_store(op, j0 + j, acc[j], at[j]);
      }
      return;
    }
    for (int64_t j = 0; j < m; j++) {
      int64_t at = 0;
      double acc = f32 ? line_float(k, (const float *)x->data + j * sm, n, sn, &at)
                       : line_double(k, (const double *)x->data + j * sm, n, sn, &at);
      reduce_store(op, j, acc, at);
    }
    return;
  }
  for (int64_t j = 0; j < m; j++) {
    const char *p = x->data + j * sm * z;
    double acc = k == OP_RPROD ? 1.0 : k == OP_RSUM ? 0.0 : NAN;
    int64_t at = 0;
    for (int64_t i = 0; i < n; i++) {
      double v = gn_load(p + i * sn * z, x->dtype);
      if (k == OP_RSUM) acc += v;
      else if (k == OP_RPROD) acc *= v;
      else if (i == 0) acc = v;
      else if (acc != acc) break;  /* a NaN wins, at its first position */
      else if (v != v || (is_max_kind(k) ? v > acc : v < acc)) {
        acc = v;
        at = i;
      }
    }
    reduce_store(op, j, acc, at);
  }
}

/* --- Gemm ---------------------------------------------------------------------------- */

/* One product y (m, n), compact with row stride n, of a (m, k) and b (k, n) given by
 * their strides, in the plain C loop (i, p, j order: rows of b stream through). */
#define PLAIN_GEMM(T)                                                                     \
  static void plain_gemm_##T(int64_t m, int64_t n, int64_t k, const T *a, int64_t sa0,   \
                             int64_t sa1, const T *b, int64_t sb0, int64_t sb1, T *y) {  \
    for (int64_t i = 0; i < m; i++) {                                                    \
      T *row = y + i * n;                                                                \
      for (int64_t j = 0; j < n; j++) row[j] = 0;                                        \
      for (int64_t p = 0; p < k; p++) {                                                  \
        T s = a[i * sa0 + p * sa1];                                                      \
        const T *brow = b + p * sb0;                                                     \
        for (int64_t j = 0; j < n; j++) row[j] += s * brow[j * sb1];                     \
      }                                                                                  \
    }                                                                                    \
  }
PLAIN_GEMM(float)
PLAIN_GEMM(double)

#ifdef GEON_HAVE_BLAS
/* How BLAS reads a (rows, cols) operand with strides (s0, s1): row-major with leading
 * dimension ld (no transpose), or its transpose; 0 when it must be packed first. */
static int blas_layout(int64_t rows, int64_t cols, int64_t s0, int64_t s1, int *trans, int64_t *ld) {
  if ((s1 == 1 || cols == 1) && s0 >= (cols > 1 ? cols : 1) && s0 > 0) { *trans = 0; *ld = s0; return 1; }
  if ((s0 == 1 || rows == 1) && s1 >= (rows > 1 ? rows : 1) && s1 > 0) { *trans = 1; *ld = s1; return 1; }
  if (rows == 1 && cols == 1) { *trans = 0; *ld = 1; return 1; }
  return 0;
}

static void pack(char *dst, const char *src, int64_t rows, int64_t cols, int64_t s0, int64_t s1, int z) {
  for (int64_t i = 0; i < rows; i++)
    for (int64_t j = 0; j < cols; j++) memcpy(dst + (i * cols + j) * z, src + (i * s0 + j * s1) * z, (size_t)z);
}
#endif

/* op's output (B..., m, n) = a (B..., m, k) @ b (B..., k, n); scratch holds one packed
 * a and one packed b (allocated at load time). */
static void gemm(gn_value *y, double alpha, double beta, const gn_value *a, const gn_value *b, char *scratch);

void gn_run_gemm(gn_op *op, const gn_value *a, const gn_value *b, char *scratch) {
  gemm(&op->out[0], 1.0, 0.0, a, b, scratch);
}

void gn_run_gemm_update(gn_value *into, double alpha, const gn_value *a, const gn_value *b, char *scratch) {
  gemm(into, alpha, 1.0, a, b, scratch);
}

/* y = alpha * a @ b + beta * y (beta 0 or, with BLAS and 2-D operands only, 1) */
static void gemm(gn_value *y, double alpha, double beta, const gn_value *a, const gn_value *b, char *scratch) {
  int nd = y->ndim, nb = nd - 2;
  int64_t m = y->shape[nd - 2], n = y->shape[nd - 1], k = a->shape[nd - 1];
  int z = gn_dtype_size[y->dtype];
  int64_t batches = 1, idx[GN_MAX_DIMS] = {0};
  for (int d = 0; d < nb; d++) batches *= y->shape[d];
  if (y->size == 0) return;
  for (int64_t t = 0; t < batches; t++) {
    int64_t oa = 0, ob = 0, rest = t;
    for (int d = nb - 1; d >= 0; d--) {
      idx[d] = rest % y->shape[d];
      rest /= y->shape[d];
      oa += idx[d] * a->strides[d];
      ob += idx[d] * b->strides[d];
    }
    const char *pa = a->data + oa * z, *pb = b->data + ob * z;
    char *py = y->data + t * m * n * z;
    int64_t sa0 = a->strides[nd - 2], sa1 = a->strides[nd - 1];
    int64_t sb0 = b->strides[nd - 2], sb1 = b->strides[nd - 1];
    if (k == 0) {
      if (beta == 0.0) memset(py, 0, (size_t)(m * n * z));
      continue;
    }
#ifdef GEON_HAVE_BLAS
    if (m <= INT32_MAX && n <= INT32_MAX && k <= INT32_MAX) {
      int ta, tb;
      int64_t lda, ldb;
      if (!blas_layout(m, k, sa0, sa1, &ta, &lda) || lda > INT32_MAX) {
        pack(scratch, pa, m, k, sa0, sa1, z);
        pa = scratch; ta = 0; lda = k;
      }
      if (!blas_layout(k, n, sb0, sb1, &tb, &ldb) || ldb > INT32_MAX) {
        char *sb = scratch + m * k * z;
        pack(sb, pb, k, n, sb0, sb1, z);
        pb = sb; tb = 0; ldb = n;
      }
      enum CBLAS_TRANSPOSE A = ta ? CblasTrans : CblasNoTrans, B = tb ? CblasTrans : CblasNoTrans;
      if (y->dtype == DT_F64)
        GN_DGEMM(CblasRowMajor, A, B, (int)m, (int)n, (int)k, alpha, (const double *)pa, (int)lda,
                 (const double *)pb, (int)ldb, beta, (double *)py, (int)n);
      else
        GN_SGEMM(CblasRowMajor, A, B, (int)m, (int)n, (int)k, (float)alpha, (const float *)pa, (int)lda,
                 (const float *)pb, (int)ldb, (float)beta, (float *)py, (int)n);
      continue;
    }
#else
    (void)scratch;
    (void)alpha;
    (void)beta;
#endif
    if (y->dtype == DT_F64)
      plain_gemm_double(m, n, k, (const double *)pa, sa0, sa1, (const double *)pb, sb0, sb1, (double *)py);
    else
      plain_gemm_float(m, n, k, (const float *)pa, sa0, sa1, (const float *)pb, sb0, sb1, (float *)py);
  }
}
