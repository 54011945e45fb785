/* kernels_more.c: the ops of libgeon_native that work along dimension 1 of
 * (O, N, ...) tensors (Take, PutAdd, PrefixSum, SortPrim) and the convolution and
 * max-pooling ops.
 *
 * Except Take (which copies elements as they are), each kernel first copies its
 * operands into compact row-major double arrays in the instance's scratch (sized at
 * load time by gn_scratch_need), computes in double on those, and rounds the result
 * once into the op's compact output buffer. The plans this runtime reads are small,
 * so the copies cost little, and the loops below index plain arrays: every index they
 * form is within the shapes that plan.c checked at load time. The convolutions are
 * direct loops (one multiply-add per kernel tap and output position), chosen for
 * being plainly right rather than fast. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

/* v's elements into the compact double array out (v's element count). */
static void to_doubles(const gn_value *v, double *out) {
  gn_value d = *v;
  d.dtype = DT_F64;
  gn_set_compact(&d, (char *)out, out);
  gn_copy_values(&d, v);
}

/* The compact double array in (y's shape) into y, rounded to y's dtype. */
static void from_doubles(gn_value *y, const double *in) {
  gn_value s = *y;
  s.dtype = DT_F64;
  gn_set_compact(&s, (char *)in, in);
  gn_copy_values(y, &s);
}

/* The product of v's lengths from dimension `from` on. */
static int64_t tail_size(const gn_value *v, int from) {
  int64_t n = 1;
  for (int d = from; d < v->ndim; d++) n *= v->shape[d];
  return n;
}

/* An index element as int64 (a uint64 beyond int64 reads as INT64_MAX: out of range). */
static int64_t load_index(const char *p, gn_dtype t) {
  switch (t) {
    case DT_I8: return *(const int8_t *)p;
    case DT_I16: return *(const int16_t *)p;
    case DT_I32: return *(const int32_t *)p;
    case DT_I64: return *(const int64_t *)p;
    case DT_U8: return *(const uint8_t *)p;
    case DT_U16: return *(const uint16_t *)p;
    case DT_U32: return *(const uint32_t *)p;
    case DT_U64: {
      uint64_t u = *(const uint64_t *)p;
      return u > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)u;
    }
    default: return 0; /* (plan.c admits only integer indices) */
  }
}

/* Check every index of idx (1-D) against an axis of length n, as NumPy does (negative
 * ones count from the end); GEON_ERR_BAD_TENSOR naming the first one out of range. */
static geon_status check_indices(const gn_value *idx, int64_t n, int32_t i, const char *what, gn_error *e) {
  int z = gn_dtype_size[idx->dtype];
  for (int64_t j = 0; j < idx->shape[0]; j++) {
    int64_t v = load_index(idx->data + j * idx->strides[0] * z, idx->dtype);
    if (v < -n || v >= n)
      return gn_fail(e, GEON_ERR_BAD_TENSOR, "op %d (%s): index %lld is out of range for an axis of length %lld",
                     i, what, (long long)v, (long long)n);
  }
  return GEON_OK;
}

static int64_t index_at(const gn_value *idx, int64_t j, int64_t n) {
  int64_t v = load_index(idx->data + j * idx->strides[0] * gn_dtype_size[idx->dtype], idx->dtype);
  return v < 0 ? v + n : v;
}

/* v without dimension 1, at position k of it (a strided view, no copy). */
static gn_value drop_dim1(const gn_value *v, int64_t k) {
  gn_value s = *v;
  s.ndim = v->ndim - 1;
  s.shape[0] = v->shape[0];
  s.strides[0] = v->strides[0];
  for (int d = 2; d < v->ndim; d++) {
    s.shape[d - 1] = v->shape[d];
    s.strides[d - 1] = v->strides[d];
  }
  s.size = v->shape[0] * tail_size(v, 2);
  s.data = v->data + k * v->strides[1] * gn_dtype_size[v->dtype];
  return s;
}

/* y (O, M, ...) = x[:, idx]: one strided copy per index. */
geon_status gn_run_take(gn_op *op, const gn_value *x, const gn_value *idx, int32_t i, gn_error *e) {
  gn_value *y = &op->out[0];
  int64_t n = x->shape[1];
  if (check_indices(idx, n, i, "Take", e)) return e->status;
  for (int64_t j = 0; j < y->shape[1]; j++) {
    gn_value dst = drop_dim1(y, j), src = drop_dim1(x, index_at(idx, j, n));
    gn_copy_values(&dst, &src);
  }
  return GEON_OK;
}

/* y (O, N, ...) = zeros, then d[:, j] added at [:, idx[j]] for j in order (repeated
 * indices accumulate, in the order NumPy's segment sums add them). */
geon_status gn_run_put_add(gn_op *op, const gn_value *d, const gn_value *idx, char *scratch,
                           int32_t i, gn_error *e) {
  gn_value *y = &op->out[0];
  int64_t O = y->shape[0], N = y->shape[1], M = d->shape[1], R = tail_size(y, 2);
  if (check_indices(idx, N, i, "PutAdd", e)) return e->status;
  double *D = (double *)scratch, *A = D + d->size;
  to_doubles(d, D);
  memset(A, 0, (size_t)y->size * sizeof(double));
  for (int64_t j = 0; j < M; j++) {
    int64_t at = index_at(idx, j, N);
    for (int64_t o = 0; o < O; o++) {
      double *dst = A + (o * N + at) * R;
      const double *src = D + (o * M + j) * R;
      for (int64_t r = 0; r < R; r++) dst[r] += src[r];
    }
  }
  from_doubles(y, A);
  return GEON_OK;
}

/* Inclusive running sums along dimension 1. */
void gn_run_prefix_sum(gn_op *op, const gn_value *x, char *scratch) {
  int64_t O = x->shape[0], N = x->shape[1], R = tail_size(x, 2);
  double *X = (double *)scratch;
  to_doubles(x, X);
  for (int64_t o = 0; o < O; o++)
    for (int64_t n = 1; n < N; n++) {
      double *row = X + (o * N + n) * R;
      for (int64_t r = 0; r < R; r++) row[r] += row[r - R];
    }
  from_doubles(&op->out[0], X);
}

/* NumPy's order: NaN after every number. */
static int before(double a, double b) { return a == a && (b != b || a < b); }

/* A stable ascending sort along dimension 1: the values (copied element by element
 * from x, so that integers keep every bit) and their int64 positions. Compared in
 * double, so integers beyond 2**53 that differ only in low bits may tie. */
void gn_run_sort(gn_op *op, const gn_value *x, char *scratch) {
  gn_value *vals = &op->out[0], *pos = &op->out[1];
  int64_t O = x->shape[0], N = x->shape[1], R = tail_size(x, 2);
  int z = gn_dtype_size[x->dtype];
  double *X = (double *)scratch;
  int64_t *ord = (int64_t *)(X + x->size), *tmp = ord + N;
  to_doubles(x, X);
  for (int64_t o = 0; o < O; o++)
    for (int64_t r = 0; r < R; r++) {
      const double *key = X + o * N * R + r; /* key[n * R]: element n of this line */
      for (int64_t n = 0; n < N; n++) ord[n] = n;
      /* bottom-up merge sort: runs of width w merged pairwise, the left run first
       * among equal keys (stable) */
      for (int64_t w = 1; w < N; w *= 2) {
        for (int64_t lo = 0; lo < N; lo += 2 * w) {
          int64_t mid = lo + w < N ? lo + w : N, hi = lo + 2 * w < N ? lo + 2 * w : N;
          int64_t a = lo, b = mid, t = lo;
          while (a < mid && b < hi) tmp[t++] = before(key[ord[b] * R], key[ord[a] * R]) ? ord[b++] : ord[a++];
          while (a < mid) tmp[t++] = ord[a++];
          while (b < hi) tmp[t++] = ord[b++];
        }
        memcpy(ord, tmp, (size_t)N * sizeof(int64_t));
      }
      /* the strided offset in x of element (o, 0, r) */
      int64_t off = o * x->strides[0], rest = r;
      for (int d = x->ndim - 1; d >= 2; d--) {
        off += (rest % x->shape[d]) * x->strides[d];
        rest /= x->shape[d];
      }
      for (int64_t n = 0; n < N; n++) {
        int64_t at = (o * N + n) * R + r;
        memcpy(vals->data + at * z, x->data + (off + ord[n] * x->strides[1]) * z, (size_t)z);
        ((int64_t *)pos->data)[at] = ord[n];
      }
    }
}

/* --- convolution ------------------------------------------------------------------------ */

/* The two spatial lengths of v (dimensions 2.. of a convolution's operand, or the
 * trailing ones of a pooling operand): (1, L) for one. */
static void spatial(const gn_value *v, int n_spatial, int64_t *h, int64_t *w) {
  *h = n_spatial == 2 ? v->shape[v->ndim - 2] : 1;
  *w = v->shape[v->ndim - 1];
}

/* Conv (y = x * w), ConvGradData (dx from dy and w) and ConvGradFilter (dw from x and
 * dy) share one loop over (image, filter, channel, tap, output position); each adds
 * one product into its result. Image x (B, C, H, W), filter (K, C/G, R0, R1), result
 * of Conv (B, K, P0, P1); filter k belongs to group k / (K/G), which reads channels
 * g*C/G ... (g+1)*C/G - 1. */
void gn_run_conv(gn_op *op, const gn_value *a, const gn_value *b, char *scratch) {
  gn_value *out = &op->out[0];
  const gn_window *g = &op->win;
  gn_kind k = op->kind;
  /* the three roles: image, filter, convolution result */
  const gn_value *xv = k == OP_CONV_GRAD_DATA ? out : a;
  const gn_value *wv = k == OP_CONV_GRAD_FILTER ? out : b;
  const gn_value *yv = k == OP_CONV ? out : k == OP_CONV_GRAD_DATA ? a : b;
  int64_t B = xv->shape[0], C = xv->shape[1], K = wv->shape[0], Cg = wv->shape[1];
  int64_t H, W, R0, R1, P0, P1;
  spatial(xv, g->n_spatial, &H, &W);
  spatial(wv, g->n_spatial, &R0, &R1);
  spatial(yv, g->n_spatial, &P0, &P1);
  int64_t Kg = K / g->groups;
  double *A = (double *)scratch, *Bd = A + a->size, *Y = Bd + b->size;
  to_doubles(a, A);
  to_doubles(b, Bd);
  memset(Y, 0, (size_t)out->size * sizeof(double));
  /* the arrays in their roles */
  double *X = k == OP_CONV_GRAD_DATA ? Y : A;
  double *Wt = k == OP_CONV ? Bd : k == OP_CONV_GRAD_DATA ? Bd : Y;
  double *Dy = k == OP_CONV ? Y : k == OP_CONV_GRAD_DATA ? A : Bd;
  for (int64_t n = 0; n < B; n++)
    for (int64_t f = 0; f < K; f++) {
      int64_t c0 = (f / Kg) * Cg;
      double *yrow = Dy + (n * K + f) * P0 * P1;
      for (int64_t c = 0; c < Cg; c++) {
        double *xim = X + (n * C + c0 + c) * H * W;
        for (int64_t r = 0; r < R0; r++)
          for (int64_t s = 0; s < R1; s++) {
            double *wp = Wt + ((f * Cg + c) * R0 + r) * R1 + s;
            for (int64_t p = 0; p < P0; p++) {
              int64_t h = p * g->stride[0] - g->pad_lo[0] + r * g->dilation[0];
              if (h < 0 || h >= H) continue;
              for (int64_t q = 0; q < P1; q++) {
                int64_t x = q * g->stride[1] - g->pad_lo[1] + s * g->dilation[1];
                if (x < 0 || x >= W) continue;
                double *xp = xim + h * W + x, *yp = yrow + p * P1 + q;
                if (k == OP_CONV) *yp += *xp * *wp;
                else if (k == OP_CONV_GRAD_DATA) *xp += *yp * *wp;
                else *wp += *xp * *yp;
              }
            }
          }
      }
    }
  from_doubles(out, Y);
}

/* --- max pooling ------------------------------------------------------------------------ */

/* The position (h * W + w) of the first maximum of window (p, q) of image X (H, W), in
 * kernel order, as NumPy's argmax over the padded windows finds it: padding reads as
 * -inf (and gives -1 when it wins), a NaN wins at its first position. */
static int64_t first_max(const double *X, int64_t H, int64_t W, const gn_window *g, int64_t p,
                         int64_t q, double *value) {
  double best = 0.0;
  int64_t at = -1;
  int first = 1;
  for (int64_t r = 0; r < g->kernel[0]; r++)
    for (int64_t s = 0; s < g->kernel[1]; s++) {
      int64_t h = p * g->stride[0] - g->pad_lo[0] + r * g->dilation[0];
      int64_t w = q * g->stride[1] - g->pad_lo[1] + s * g->dilation[1];
      int inside = h >= 0 && h < H && w >= 0 && w < W;
      double v = inside ? X[h * W + w] : -HUGE_VAL;
      if (first || (best == best && (v != v || v > best))) {
        best = v;
        at = inside ? h * W + w : -1;
        first = 0;
      }
    }
  *value = best;
  return at;
}

/* MaxPool (y = window maxima of x), MaxPoolGrad (dy added at each window's first
 * maximum of x: x's shape) and MaxPoolGather (v read there: the pooled shape). The
 * leading dimensions are independent images. */
void gn_run_pool(gn_op *op, const gn_value *a, const gn_value *b, char *scratch) {
  gn_value *out = &op->out[0];
  const gn_window *g = &op->win;
  const gn_value *pooled = op->kind == OP_MAXPOOL_GRAD ? b : out;
  int64_t H, W, P0, P1;
  spatial(a, g->n_spatial, &H, &W);
  spatial(pooled, g->n_spatial, &P0, &P1);
  int64_t images = (H * W) != 0 ? a->size / (H * W) : 0;
  double *X = (double *)scratch, *V = X + a->size, *Y = V + (b ? b->size : 0);
  to_doubles(a, X);
  if (b) to_doubles(b, V);
  memset(Y, 0, (size_t)out->size * sizeof(double));
  for (int64_t l = 0; l < images; l++) {
    const double *xim = X + l * H * W;
    for (int64_t p = 0; p < P0; p++)
      for (int64_t q = 0; q < P1; q++) {
        double m;
        int64_t at = first_max(xim, H, W, g, p, q, &m);
        int64_t po = (l * P0 + p) * P1 + q;
        if (op->kind == OP_MAXPOOL) Y[po] = m;
        else if (at < 0) continue;  /* the maximum is padding: nothing to add or read */
        else if (op->kind == OP_MAXPOOL_GRAD) Y[l * H * W + at] += V[po];
        else Y[po] = V[l * H * W + at];
      }
  }
  from_doubles(out, Y);
}

/* Bytes of scratch op needs (args a, b as loaded). */
int64_t gn_scratch_need(const gn_op *op, const gn_value *a, const gn_value *b) {
  const gn_value *y = &op->out[0];
  switch (op->kind) {
    case OP_PUTADD: return (a->size + y->size) * 8;
    case OP_PREFIXSUM: return a->size * 8;
    case OP_SORT: return a->size * 8 + 2 * a->shape[1] * 8;
    case OP_CONV: case OP_CONV_GRAD_DATA: case OP_CONV_GRAD_FILTER:
    case OP_MAXPOOL: case OP_MAXPOOL_GRAD: case OP_MAXPOOL_GATHER:
      return (a->size + (b ? b->size : 0) + y->size) * 8;
    default: return 0;
  }
}
