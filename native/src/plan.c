/* plan.c: loading a "geon-plan" document (version 1) into ops (runtime.h).
 *
 * Everything is checked before anything runs: the format and version, every key this
 * runtime reads, each op's type (all unknown ones are listed in one
 * GEON_ERR_UNSUPPORTED message), every reference (args point to earlier ops, so that
 * document order is an execution order), every shape (at most GN_MAX_DIMS dimensions,
 * lengths >= 0, element counts below GN_MAX_ELEMENTS without overflow, buffers below
 * GN_MAX_BYTES in all) and dtype, and each op's declared result against the one its
 * args and parameters give. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "runtime.h"

geon_status gn_fail(gn_error *e, geon_status status, const char *fmt, ...) {
  if (e->status == GEON_OK) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    e->status = status;
  }
  return e->status;
}

#define INVALID(...) gn_fail(L->e, GEON_ERR_INVALID_PLAN, __VA_ARGS__)

/* --- names ----------------------------------------------------------------------------- */

static const char *const KIND_NAMES[OP_KIND_COUNT] = {
  "Placeholder", "Variable", "Constant",
  "Add", "Subtract", "Multiply", "Divide", "Maximum", "Minimum", "Power",
  "Equal", "NotEqual", "Less", "LessEqual", "Greater", "GreaterEqual",
  "SigmoidCrossEntropy",
  "Negative", "Absolute", "Sign", "Square", "Sqrt", "Reciprocal", "Exp", "Log", "Sin", "Cos",
  "Tanh", "Sigmoid", "Erf", "Expm1", "Softplus",
  "Reshape", "Dimshuffle", "Expand", "SliceView",
  "Copy", "Unslice", "Assign", "Gemm",
  "ReduceSum", "ReduceProd", "ReduceMax", "ReduceMin", "ReduceArgMax", "ReduceArgMin",
  "ReduceMaxArgMax",
  "Take", "PutAdd", "PrefixSum", "SortPrim",
  "Conv", "ConvGradData", "ConvGradFilter", "MaxPool", "MaxPoolGrad", "MaxPoolGather",
  "Random"};

static int kind_of(const gj_node *n) {
  for (int k = 0; k < OP_KIND_COUNT; k++)
    if (gj_is(n, KIND_NAMES[k])) return k;
  return -1;
}

/* A graph dtype name ("float32") or a NumPy type string ("<f4"); -1 if unknown. */
static int dtype_of(const gj_node *n, int numpy_str) {
  static const char *const STR[DT_COUNT] = {"|b1", "|i1", "<i2", "<i4", "<i8", "|u1",
                                            "<u2", "<u4", "<u8", "<f4", "<f8"};
  for (int t = 0; t < DT_COUNT; t++)
    if (gj_is(n, numpy_str ? STR[t] : gn_dtype_name[t])) return t;
  return -1;
}

/* A document string cut short and made printable, for messages. */
static const char *shown(const gj_node *n, char *buf, size_t len) {
  size_t o = 0;
  if (!n || n->type != GJ_STRING) return "(not a string)";
  for (size_t i = 0; i < n->str_len && o + 4 < len; i++) {
    unsigned char c = (unsigned char)n->str[i];
    buf[o++] = (c >= 0x20 && c < 0x7F) ? (char)c : '?';
  }
  if (o + 4 >= len) { buf[o++] = '.'; buf[o++] = '.'; buf[o++] = '.'; }
  buf[o] = '\0';
  return buf;
}

/* --- the loader's state ---------------------------------------------------------------- */

typedef struct {
  const char *name;
  size_t name_len;
  const gj_node *def;
  int64_t length;   /* -1: not yet resolved */
  int busy;
} axis_entry;

typedef struct {
  gj_doc doc;
  gn_error *e;
  struct geon_backend *b;
  axis_entry *axes;
  int32_t n_axes;
  int64_t bytes;    /* allocated so far */
} loader;

static int cmp_axis(const void *x, const void *y) {
  const axis_entry *a = x, *b = y;
  size_t n = a->name_len < b->name_len ? a->name_len : b->name_len;
  int c = memcmp(a->name, b->name, n);
  return c ? c : (a->name_len > b->name_len) - (a->name_len < b->name_len);
}

static axis_entry *find_axis(loader *L, const gj_node *name) {
  if (!name || name->type != GJ_STRING) return NULL;
  axis_entry key = {name->str, name->str_len, NULL, 0, 0};
  return bsearch(&key, L->axes, (size_t)L->n_axes, sizeof key, cmp_axis);
}

/* The length of an axis: {"length": n} or {"parts": [names]} (their product). */
static int64_t axis_length(loader *L, axis_entry *a, int depth) {
  if (a->length >= 0) return a->length;
  if (a->busy || depth > 32) { INVALID("flattened axes nest too deep or in a cycle"); return -1; }
  const gj_node *len = gj_get(&L->doc, a->def, "length"), *parts = gj_get(&L->doc, a->def, "parts");
  if (len) {
    if (len->type != GJ_NUMBER || !len->is_int || len->ival < 0 || len->ival > GN_MAX_ELEMENTS) {
      INVALID("an axis length must be an integer from 0 to 2**40");
      return -1;
    }
    return a->length = len->ival;
  }
  if (!parts || parts->type != GJ_ARRAY) { INVALID("an axis needs a length or parts"); return -1; }
  a->busy = 1;
  int64_t product = 1;
  for (const gj_node *p = gj_first(&L->doc, parts); p; p = gj_next(&L->doc, p)) {
    axis_entry *part = find_axis(L, p);
    if (!part) { INVALID("a flattened axis has an unknown part"); return -1; }
    int64_t n = axis_length(L, part, depth + 1);
    if (n < 0) return -1;
    if (n && product > GN_MAX_ELEMENTS / n) { INVALID("a flattened axis is longer than 2**40"); return -1; }
    product *= n;
  }
  a->busy = 0;
  return a->length = product;
}

static geon_status read_axes(loader *L, const gj_node *table) {
  if (!table || table->type != GJ_OBJECT) return INVALID("graph.axes must be an object");
  L->axes = calloc((size_t)table->count + 1, sizeof(axis_entry));
  if (!L->axes) return gn_fail(L->e, GEON_ERR_OUT_OF_MEMORY, "out of memory");
  for (const gj_node *c = gj_first(&L->doc, table); c; c = gj_next(&L->doc, c)) {
    if (c->type != GJ_OBJECT) return INVALID("graph.axes entries must be objects");
    axis_entry *a = &L->axes[L->n_axes++];
    a->name = c->key; a->name_len = c->key_len; a->def = c; a->length = -1;
  }
  qsort(L->axes, (size_t)L->n_axes, sizeof(axis_entry), cmp_axis);
  for (int32_t i = 0; i < L->n_axes; i++)
    if (axis_length(L, &L->axes[i], 0) < 0) return L->e->status;
  return GEON_OK;
}

/* A shape: the element count checked against overflow and GN_MAX_ELEMENTS. */
static geon_status set_shape(loader *L, gn_value *v, int ndim, const int64_t *shape, const char *where) {
  if (ndim > GN_MAX_DIMS) return gn_fail(L->e, GEON_ERR_UNSUPPORTED, "%s: more than %d dimensions", where, GN_MAX_DIMS);
  int64_t size = 1;
  for (int d = 0; d < ndim; d++) {
    if (shape[d] < 0) return INVALID("%s: a negative length", where);
    if (shape[d] && size > GN_MAX_ELEMENTS / shape[d]) return INVALID("%s: more than 2**40 elements", where);
    size *= shape[d];
    v->shape[d] = shape[d];
  }
  v->ndim = ndim;
  v->size = size;
  return GEON_OK;
}

static char *alloc_bytes(loader *L, int64_t bytes) {
  if (bytes > GN_MAX_BYTES - L->bytes) {
    gn_fail(L->e, GEON_ERR_OUT_OF_MEMORY, "the plan needs more than %lld bytes of buffers",
            (long long)GN_MAX_BYTES);
    return NULL;
  }
  char *p = calloc(1, (size_t)(bytes ? bytes : 1));
  if (!p) gn_fail(L->e, GEON_ERR_OUT_OF_MEMORY, "out of memory (%lld bytes)", (long long)bytes);
  else L->bytes += bytes;
  return p;
}

/* --- values: numbers and arrays -------------------------------------------------------- */

/* A number value: a JSON number or bool, or {"float": "nan" | "inf" | "-inf"}. */
static int read_number(loader *L, const gj_node *n, double *out) {
  if (n && n->type == GJ_NUMBER) { *out = n->is_int ? (double)n->ival : n->num; return 1; }
  if (n && (n->type == GJ_TRUE || n->type == GJ_FALSE)) { *out = n->type == GJ_TRUE; return 1; }
  const gj_node *f = gj_get(&L->doc, n, "float");
  if (f && n->count == 1) {
    if (gj_is(f, "nan")) { *out = NAN; return 1; }
    if (gj_is(f, "inf")) { *out = HUGE_VAL; return 1; }
    if (gj_is(f, "-inf")) { *out = -HUGE_VAL; return 1; }
  }
  return 0;
}

static int b64_digit(unsigned char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

/* Decode base64 text (with padding) of exactly want bytes into out. */
static int b64_decode(const char *s, size_t len, unsigned char *out, int64_t want) {
  if (want < 0 || (uint64_t)len != (uint64_t)((want + 2) / 3) * 4) return 0;
  int64_t o = 0;
  for (size_t i = 0; i < len; i += 4) {
    int d[4], pad = 0;
    for (int j = 0; j < 4; j++) {
      unsigned char c = (unsigned char)s[i + j];
      if (c == '=' && i + 4 == len && j >= 2) { d[j] = 0; pad++; continue; }
      if (pad || (d[j] = b64_digit(c)) < 0) return 0;
    }
    uint32_t v = (uint32_t)(d[0] << 18 | d[1] << 12 | d[2] << 6 | d[3]);
    unsigned char bytes[3] = {(unsigned char)(v >> 16), (unsigned char)(v >> 8), (unsigned char)v};
    for (int j = 0; j < 3 - pad; j++) {
      if (o >= want) return 0;
      out[o++] = bytes[j];
    }
  }
  return o == want;
}

/* The value of a Constant or a Variable's initial value into op's storage: a number
 * (fills the shape: one element, zero strides), or an array of one element (the same)
 * or of the op's shape; converted to the op's dtype. */
static geon_status read_fill(loader *L, gn_op *op, const gj_node *n, const char *what) {
  gn_value *v = &op->out[0];
  int z = gn_dtype_size[v->dtype];
  double x;
  if (read_number(L, n, &x)) {
    if (!(op->buffer[0] = alloc_bytes(L, z))) return L->e->status;
    if ((v->dtype == DT_I64 && n->is_int) || (v->dtype == DT_U64 && n->is_uint)) {
      /* exact: 64-bit integers beyond 2**53 (a step counter near 2**63) */
      int64_t bits = v->dtype == DT_I64 ? n->ival : (int64_t)n->uval;
      memcpy(op->buffer[0], &bits, 8);
    } else {
      gn_store(op->buffer[0], v->dtype, x);
    }
    op->filled = 1;
    return GEON_OK;
  }
  const gj_node *arr = gj_get(&L->doc, n, "array");
  if (!arr || n->count != 1) {
    if (gj_get(&L->doc, n, "function"))
      return INVALID("%s was written without its value (an initial value that is a function)", what);
    return gn_fail(L->e, GEON_ERR_UNSUPPORTED, "%s: a value of a type this runtime does not read", what);
  }
  const gj_node *dt = gj_get(&L->doc, arr, "dtype"), *shape = gj_get(&L->doc, arr, "shape"),
                *data = gj_get(&L->doc, arr, "data");
  int t = dtype_of(dt, 0);
  if (!dt || !shape || !data || shape->type != GJ_ARRAY || data->type != GJ_STRING || arr->count != 3)
    return INVALID("%s: an array needs dtype, shape and data", what);
  if (t < 0) return gn_fail(L->e, GEON_ERR_UNSUPPORTED, "%s: an array of a dtype this runtime lacks", what);
  int64_t dims[GN_MAX_DIMS];
  int nd = 0;
  for (const gj_node *d = gj_first(&L->doc, shape); d; d = gj_next(&L->doc, d)) {
    if (nd == GN_MAX_DIMS) return INVALID("%s: an array of too many dimensions", what);
    if (d->type != GJ_NUMBER || !d->is_int) return INVALID("%s: an array's shape holds integers", what);
    dims[nd++] = d->ival;
  }
  gn_value a = {0};
  if (set_shape(L, &a, nd, dims, what)) return L->e->status;
  int full = nd == v->ndim;
  for (int d = 0; full && d < nd; d++) full = dims[d] == v->shape[d];
  if (a.size != 1 && !full) return INVALID("%s: an array of another shape than its op's", what);
  int64_t want = a.size * gn_dtype_size[t];
  unsigned char *raw = (unsigned char *)alloc_bytes(L, want);
  if (!raw) return L->e->status;
  L->bytes -= want; /* (temporary) */
  if (!b64_decode(data->str, data->str_len, raw, want)) {
    free(raw);
    return INVALID("%s: the array's data is not base64 of %lld bytes", what, (long long)want);
  }
  int64_t count = a.size == 1 ? 1 : v->size;
  if (!(op->buffer[0] = alloc_bytes(L, count * z))) { free(raw); return L->e->status; }
  for (int64_t i = 0; i < count; i++) {
    const unsigned char *p = raw + i * gn_dtype_size[t];
    double x2 = t == DT_BOOL ? (*p != 0) : gn_load((const char *)p, (gn_dtype)t);
    if (t == (int)v->dtype) memcpy(op->buffer[0] + i * z, p, (size_t)z);
    else gn_store(op->buffer[0] + i * z, v->dtype, x2);
  }
  free(raw);
  op->filled = a.size == 1;
  return GEON_OK;
}

/* An attribute {"tuple": [ints, or null where allowed]} of at most GN_MAX_DIMS entries. */
static int read_ints(loader *L, const gj_node *n, int64_t *out, int *nulls, int *count) {
  const gj_node *t = gj_get(&L->doc, n, "tuple");
  *count = 0;
  if (!t || t->type != GJ_ARRAY || n->count != 1 || t->count > GN_MAX_DIMS) return 0;
  for (const gj_node *c = gj_first(&L->doc, t); c; c = gj_next(&L->doc, c), (*count)++) {
    if (c->type == GJ_NULL && nulls) { nulls[*count] = 1; out[*count] = 0; continue; }
    if (c->type != GJ_NUMBER || !c->is_int) return 0;
    if (nulls) nulls[*count] = 0;
    out[*count] = c->ival;
  }
  return 1;
}

/* A slice key: one index or {"slice": [start, stop, step]} per dimension of full,
 * resolved as Python does; the shape it cuts full to in cut (ncut dims). */
static geon_status read_key(loader *L, const gj_node *n, gn_op *op, const gn_value *full,
                            int64_t *cut, int *ncut) {
  const gj_node *t = gj_get(&L->doc, n, "tuple");
  if (!t || t->type != GJ_ARRAY || n->count != 1 || t->count != full->ndim)
    return INVALID("a slice key needs one entry per dimension");
  int d = 0;
  *ncut = 0;
  for (const gj_node *c = gj_first(&L->doc, t); c; c = gj_next(&L->doc, c), d++) {
    int64_t len = full->shape[d];
    gn_slice *s = &op->key[d];
    if (c->type == GJ_NUMBER && c->is_int) {
      int64_t i = c->ival < 0 ? c->ival + len : c->ival;
      if (c->ival < -len || i >= len) return INVALID("a slice index is out of range");
      s->is_index = 1; s->start = i; s->step = 1; s->count = 1;
      continue;
    }
    const gj_node *sl = gj_get(&L->doc, c, "slice");
    if (!sl || c->count != 1 || sl->type != GJ_ARRAY || sl->count != 3)
      return INVALID("a slice key entry is an integer or a slice");
    int64_t part[3];
    int none[3];
    int k = 0;
    for (const gj_node *p = gj_first(&L->doc, sl); p; p = gj_next(&L->doc, p), k++) {
      none[k] = p->type == GJ_NULL;
      if (!none[k] && (p->type != GJ_NUMBER || !p->is_int || p->ival < -GN_MAX_ELEMENTS * 4 || p->ival > GN_MAX_ELEMENTS * 4))
        return INVALID("a slice's parts are integers or null");
      part[k] = none[k] ? 0 : p->ival;
    }
    int64_t step = none[2] ? 1 : part[2];
    if (step == 0) return INVALID("a slice step of 0");
    /* Python's slice.indices: clamp start and stop into the dimension */
    int64_t lo = step > 0 ? 0 : -1, hi = step > 0 ? len : len - 1;
    int64_t start = none[0] ? (step > 0 ? lo : hi) : part[0] < 0 ? part[0] + len : part[0];
    int64_t stop = none[1] ? (step > 0 ? hi : lo) : part[1] < 0 ? part[1] + len : part[1];
    if (!none[0]) start = start < lo ? lo : start > hi ? hi : start;
    if (!none[1]) stop = stop < lo ? lo : stop > hi ? hi : stop;
    int64_t count = step > 0 ? (stop > start ? (stop - start + step - 1) / step : 0)
                             : (start > stop ? (start - stop - step - 1) / -step : 0);
    s->is_index = 0; s->start = count ? start : 0; s->step = step; s->count = count;
    cut[(*ncut)++] = count;
  }
  return GEON_OK;
}

/* --- ops ------------------------------------------------------------------------------- */

static int same_shape(const gn_value *a, const gn_value *b) {
  if (a->ndim != b->ndim) return 0;
  for (int d = 0; d < a->ndim; d++) if (a->shape[d] != b->shape[d]) return 0;
  return 1;
}

static int is_integer_dtype(gn_dtype t) { return t >= DT_I8 && t <= DT_U64; }

/* A window parameter {"tuple": [n ints]} in [lo, hi] into out[0..n). */
static int read_window_ints(loader *L, const gj_node *n, int want, int64_t lo, int64_t hi, int64_t *out) {
  int64_t v[GN_MAX_DIMS];
  int count;
  if (!read_ints(L, n, v, NULL, &count) || count != want) return 0;
  for (int d = 0; d < count; d++) {
    if (v[d] < lo || v[d] > hi) return 0;
    out[d] = v[d];
  }
  return 1;
}

/* The window of a convolution (n_spatial from its operands) or a pooling op (from its
 * kernel attribute) into op->win, as two spatial dimensions (a 1-D op gets a leading
 * one of length 1, kernel 1, stride 1, no padding). Kernel lengths and dilations are
 * at most 2**20, strides and pads at most 2**40, so that no window arithmetic on
 * lengths below 2**40 overflows. */
static geon_status read_window(loader *L, const gj_node *attrs, gn_op *op, int n_spatial, int32_t i) {
  const char *name = KIND_NAMES[op->kind];
  gn_window *g = &op->win;
  int64_t kernel[2] = {1, 1}, stride[2], dil[2], lo[2], hi[2], groups = 1;
  int pool = GN_IS_POOL(op->kind);
  if (pool) {
    int64_t v[GN_MAX_DIMS];
    if (!read_ints(L, gj_get(&L->doc, attrs, "kernel"), v, NULL, &n_spatial))
      return INVALID("op %d (%s): kernel must be a tuple of integers", i, name);
    if (n_spatial < 1 || n_spatial > 2)
      return gn_fail(L->e, GEON_ERR_UNSUPPORTED, "op %d (%s): pools over 1 or 2 dimensions only", i, name);
    if (!read_window_ints(L, gj_get(&L->doc, attrs, "kernel"), n_spatial, 1, 1 << 20, kernel))
      return INVALID("op %d (%s): kernel lengths must be from 1 to 2**20", i, name);
  } else if (n_spatial < 1 || n_spatial > 2) {
    return gn_fail(L->e, GEON_ERR_UNSUPPORTED, "op %d (%s): convolves over 1 or 2 spatial dimensions only", i, name);
  }
  if (!read_window_ints(L, gj_get(&L->doc, attrs, "strides"), n_spatial, 1, GN_MAX_ELEMENTS, stride))
    return INVALID("op %d (%s): strides must be %d integers from 1 to 2**40", i, name, n_spatial);
  if (!read_window_ints(L, gj_get(&L->doc, attrs, "dilation"), n_spatial, 1, 1 << 20, dil))
    return INVALID("op %d (%s): dilation must be %d integers from 1 to 2**20", i, name, n_spatial);
  const gj_node *pads = gj_get(&L->doc, attrs, "pads"), *t = gj_get(&L->doc, pads, "tuple");
  if (!t || t->type != GJ_ARRAY || pads->count != 1 || t->count != n_spatial)
    return INVALID("op %d (%s): pads must be %d pairs (lo, hi)", i, name, n_spatial);
  int d = 0;
  for (const gj_node *c = gj_first(&L->doc, t); c; c = gj_next(&L->doc, c), d++) {
    int64_t pair[2];
    if (!read_window_ints(L, c, 2, 0, GN_MAX_ELEMENTS, pair))
      return INVALID("op %d (%s): pads must be pairs of integers from 0 to 2**40", i, name);
    lo[d] = pair[0];
    hi[d] = pair[1];
  }
  if (!pool) {
    const gj_node *gr = gj_get(&L->doc, attrs, "groups");
    if (!gr || gr->type != GJ_NUMBER || !gr->is_int || gr->ival < 1 || gr->ival > GN_MAX_ELEMENTS)
      return INVALID("op %d (%s): groups must be an integer from 1 to 2**40", i, name);
    groups = gr->ival;
  }
  g->n_spatial = n_spatial;
  g->groups = groups;
  for (int k = 0; k < 2; k++) {  /* plan dimension k - (2 - n_spatial), or the added one */
    int src = k - (2 - n_spatial);
    g->kernel[k] = src < 0 ? 1 : kernel[src];
    g->stride[k] = src < 0 ? 1 : stride[src];
    g->dilation[k] = src < 0 ? 1 : dil[src];
    g->pad_lo[k] = src < 0 ? 0 : lo[src];
    g->pad_hi[k] = src < 0 ? 0 : hi[src];
  }
  return GEON_OK;
}

/* The number of windows along one dimension of length n with kernel length k (or -1
 * when the dilated kernel is longer than the padded length). */
static int64_t windows(int64_t n, int64_t k, const gn_window *g, int d) {
  int64_t span = n + g->pad_lo[d] + g->pad_hi[d] - g->dilation[d] * (k - 1) - 1;
  return span < 0 ? -1 : span / g->stride[d] + 1;
}

/* Whether every window of a pooling op reads at least one element that is not padding
 * (geon refuses a pooling op otherwise). */
static int every_window_reads_input(int64_t n, int64_t p_count, const gn_window *g, int d) {
  for (int64_t p = 0; p < p_count; p++) {
    /* taps r (0 <= r < k) read position start + r * dilation; is one in [0, n)? */
    int64_t start = p * g->stride[d] - g->pad_lo[d], dl = g->dilation[d];
    int64_t r = start >= 0 ? 0 : (-start + dl - 1) / dl;
    if (r >= g->kernel[d] || start + r * dl >= n) return 0;
  }
  return 1;
}

/* Check op i's parameters and result against its args; allocate its buffers. */
static geon_status check_op(loader *L, int32_t i, const gj_node *rec) {
  gn_op *op = &L->b->ops[i];
  gn_value *y = &op->out[0];
  const gn_value *a = op->n_args > 0 ? &L->b->ops[op->arg_op[0]].out[op->arg_out[0]] : NULL;
  const gn_value *b2 = op->n_args > 1 ? &L->b->ops[op->arg_op[1]].out[op->arg_out[1]] : NULL;
  const gj_node *attrs = gj_get(&L->doc, rec, "attrs");
  const char *name = KIND_NAMES[op->kind];
  gn_kind k = op->kind;
  int want_args = k <= OP_CONSTANT ? 0
                  : (GN_IS_BINARY(k) || k == OP_GEMM || k == OP_ASSIGN || k == OP_TAKE || k == OP_PUTADD ||
                     GN_IS_CONV(k) || k == OP_MAXPOOL_GRAD || k == OP_MAXPOOL_GATHER) ? 2 : 1;
  int want_out = k == OP_ASSIGN ? 0 : (k == OP_RMAXARGMAX || k == OP_SORT) ? 2 : 1;
  if (op->n_args != want_args || op->n_out != want_out)
    return INVALID("op %d (%s): %d args and %d outputs, expected %d and %d", i, name,
                   op->n_args, op->n_out, want_args, want_out);
  int64_t v[GN_MAX_DIMS], cut[GN_MAX_DIMS];
  int nulls[GN_MAX_DIMS], n = 0;
  int ok = 1, own = 1;
  if (k == OP_VARIABLE || k == OP_CONSTANT) {
    const gj_node *val = gj_get(&L->doc, attrs, k == OP_VARIABLE ? "initial_value" : "value");
    if (!val) return INVALID("op %d (%s): no value", i, name);
    char what[64];
    snprintf(what, sizeof what, "op %d (%s)", i, name);
    if (read_fill(L, op, val, what)) return L->e->status;
    if (k == OP_VARIABLE && op->filled) {  /* state: every element, Assign writes them */
      int z = gn_dtype_size[y->dtype];
      char *full = alloc_bytes(L, y->size * z);
      if (!full) return L->e->status;
      for (int64_t j = 0; j < y->size; j++) memcpy(full + j * z, op->buffer[0], (size_t)z);
      free(op->buffer[0]);
      op->buffer[0] = full;
      op->filled = 0;
    }
    own = 0;
  } else if (k == OP_PLACEHOLDER) {
    own = 0;  /* (its input is checked with the inputs) */
  } else if (GN_IS_BINARY(k) || GN_IS_UNARY(k)) {
    ok = (a->ndim == 0 || same_shape(a, y)) && (!b2 || b2->ndim == 0 || same_shape(b2, y));
  } else if (k == OP_GEMM) {
    int nd = y->ndim;
    ok = nd >= 2 && a->ndim == nd && b2->ndim == nd && a->shape[nd - 1] == b2->shape[nd - 2] &&
         y->shape[nd - 2] == a->shape[nd - 2] && y->shape[nd - 1] == b2->shape[nd - 1];
    for (int d = 0; ok && d < nd - 2; d++) ok = a->shape[d] == y->shape[d] && b2->shape[d] == y->shape[d];
    if (ok && ((y->dtype != DT_F32 && y->dtype != DT_F64) || a->dtype != y->dtype || b2->dtype != y->dtype))
      return gn_fail(L->e, GEON_ERR_UNSUPPORTED, "op %d (Gemm): only float32 or float64 products of one dtype", i);
    if (ok) {
      int64_t need = (a->shape[nd - 2] * a->shape[nd - 1] + b2->shape[nd - 2] * b2->shape[nd - 1]) * gn_dtype_size[y->dtype];
      if (need > L->b->scratch_bytes) L->b->scratch_bytes = need;
    }
  } else if (GN_IS_REDUCE(k)) {
    const gj_node *ax = gj_get(&L->doc, attrs, "axis");
    if (!ax || ax->type != GJ_NUMBER || !ax->is_int || a->ndim < 1 || a->ndim > 2 || ax->ival < 0 || ax->ival >= a->ndim)
      return INVALID("op %d (%s): reduces one position of a tensor of 1 or 2 dimensions", i, name);
    op->axis = (int)ax->ival;
    ok = y->ndim == a->ndim - 1 && (a->ndim == 1 || y->shape[0] == a->shape[1 - op->axis]);
    if (k == OP_RMAXARGMAX) ok = ok && same_shape(&op->out[1], y) && op->out[1].dtype == DT_I64;
    if ((k == OP_RARGMAX || k == OP_RARGMIN) && y->dtype != DT_I64) ok = 0;
  } else if (k == OP_RESHAPE) {
    ok = y->size == a->size && y->dtype == a->dtype;
  } else if (k == OP_DIMSHUFFLE) {
    int seen[GN_MAX_DIMS] = {0};
    if (!read_ints(L, gj_get(&L->doc, attrs, "perm"), v, NULL, &n) || n != a->ndim || n != y->ndim)
      return INVALID("op %d (Dimshuffle): perm must be a permutation of the arg's dimensions", i);
    for (int d = 0; d < n; d++) {
      if (v[d] < 0 || v[d] >= n || seen[v[d]]++) return INVALID("op %d (Dimshuffle): perm is not a permutation", i);
      op->perm[d] = (int)v[d];
      ok = ok && y->shape[d] == a->shape[v[d]];
    }
    own = 0;
  } else if (k == OP_EXPAND) {
    int next = 0;
    if (!read_ints(L, gj_get(&L->doc, attrs, "dim_map"), v, nulls, &n) || n != y->ndim)
      return INVALID("op %d (Expand): dim_map needs one entry per result dimension", i);
    for (int d = 0; d < n; d++) {
      op->dim_map[d] = nulls[d] ? -1 : (int)v[d];
      if (!nulls[d] && (v[d] != next++ || y->shape[d] != a->shape[v[d]])) ok = 0;
    }
    ok = ok && next == a->ndim;
    own = 0;
  } else if (k == OP_SLICEVIEW || k == OP_UNSLICE) {
    const gn_value *full = k == OP_SLICEVIEW ? a : y, *part = k == OP_SLICEVIEW ? y : a;
    if (read_key(L, gj_get(&L->doc, attrs, "key"), op, full, cut, &n)) return L->e->status;
    ok = n == part->ndim;
    for (int d = 0; ok && d < n; d++) ok = cut[d] == part->shape[d];
    own = k == OP_UNSLICE;
  } else if (k == OP_COPY) {
    ok = same_shape(a, y);
  } else if (k == OP_ASSIGN) {
    if (L->b->ops[op->arg_op[0]].kind != OP_VARIABLE)
      return gn_fail(L->e, GEON_ERR_UNSUPPORTED, "op %d (Assign): assigns only to Variables", i);
    ok = same_shape(a, b2);
    if (a->size * 8 > L->b->scratch_bytes) L->b->scratch_bytes = a->size * 8;
    own = 0;
  } else if (k == OP_TAKE || k == OP_PUTADD) {
    /* Take: x (O, N, ...), idx (M) -> (O, M, ...); PutAdd: d (O, M, ...), idx (M) -> (O, N, ...) */
    const gn_value *full = k == OP_TAKE ? a : y, *part = k == OP_TAKE ? y : a;
    if (b2->ndim != 1 || !is_integer_dtype(b2->dtype))
      return INVALID("op %d (%s): its indices must be a 1-D integer tensor", i, name);
    ok = full->ndim >= 2 && part->ndim == full->ndim && part->shape[0] == full->shape[0] &&
         part->shape[1] == b2->shape[0] && y->dtype == a->dtype;
    for (int d = 2; ok && d < full->ndim; d++) ok = part->shape[d] == full->shape[d];
  } else if (k == OP_PREFIXSUM || k == OP_SORT) {
    ok = a->ndim >= 2 && same_shape(a, y) && y->dtype == a->dtype;
    if (k == OP_SORT) ok = ok && same_shape(&op->out[1], y) && op->out[1].dtype == DT_I64;
  } else if (GN_IS_CONV(k)) {
    /* roles: image x (B, C, *S), filter w (K, C/groups, *R), result (B, K, *P) */
    const gn_value *x = k == OP_CONV_GRAD_DATA ? y : a, *w = k == OP_CONV_GRAD_FILTER ? y : b2,
                   *r = k == OP_CONV ? y : k == OP_CONV_GRAD_DATA ? a : b2;
    if (x->ndim < 3) return INVALID("op %d (%s): needs an image (B, C, *S) with spatial dimensions", i, name);
    if (read_window(L, attrs, op, x->ndim - 2, i)) return L->e->status;
    const gn_window *g = &op->win;
    ok = w->ndim == x->ndim && r->ndim == x->ndim && x->shape[0] == r->shape[0] &&
         w->shape[0] == r->shape[1] && x->shape[1] % g->groups == 0 &&
         x->shape[1] / g->groups == w->shape[1] && w->shape[0] % g->groups == 0;
    for (int d = 0; ok && d < g->n_spatial; d++) {
      int e = 2 - g->n_spatial + d, at = x->ndim - g->n_spatial + d;
      int64_t nw = w->shape[at] > (1 << 20) ? -1 : windows(x->shape[at], w->shape[at], g, e);
      ok = w->shape[at] >= 1 && nw >= 1 && nw == r->shape[at];
    }
    if (ok && ((y->dtype != DT_F32 && y->dtype != DT_F64) || a->dtype != y->dtype || b2->dtype != y->dtype))
      return gn_fail(L->e, GEON_ERR_UNSUPPORTED, "op %d (%s): only float32 or float64 operands of one dtype", i, name);
  } else if (k == OP_RANDOM) {
    /* Random(counter): an integer scalar step; distribution "uniform" or "normal",
     * seed in [0, 2**64), stream in [0, 2**32); a float32 or float64 result */
    const gj_node *dist = gj_get(&L->doc, attrs, "distribution"), *seed = gj_get(&L->doc, attrs, "seed"),
                  *stream = gj_get(&L->doc, attrs, "stream");
    if (!attrs || attrs->type != GJ_OBJECT) return INVALID("op %d (Random): no attrs", i);
    if (gj_is(dist, "uniform")) op->rnd_normal = 0;
    else if (gj_is(dist, "normal")) op->rnd_normal = 1;
    else return INVALID("op %d (Random): distribution must be \"uniform\" or \"normal\"", i);
    if (!seed || seed->type != GJ_NUMBER || !seed->is_uint)
      return INVALID("op %d (Random): seed must be an integer from 0 to 2**64 - 1", i);
    if (!stream || stream->type != GJ_NUMBER || !stream->is_uint || stream->uval > 0xFFFFFFFFu)
      return INVALID("op %d (Random): stream must be an integer from 0 to 2**32 - 1", i);
    op->rnd_seed = seed->uval;
    op->rnd_stream = (uint32_t)stream->uval;
    if (a->ndim != 0 || !is_integer_dtype(a->dtype))
      return INVALID("op %d (Random): its arg must be the step counter, an integer scalar", i);
    ok = y->dtype == DT_F32 || y->dtype == DT_F64;
  } else if (GN_IS_POOL(k)) {
    /* x (..., *S); MaxPool -> (..., *P); MaxPoolGrad(x, dy (..., *P)) -> x's shape;
     * MaxPoolGather(x, v (x's shape)) -> (..., *P) */
    if (read_window(L, attrs, op, 0, i)) return L->e->status;
    const gn_window *g = &op->win;
    const gn_value *pooled = k == OP_MAXPOOL_GRAD ? b2 : y, *same = k == OP_MAXPOOL ? a : k == OP_MAXPOOL_GRAD ? y : b2;
    const gn_value *last = b2 ? b2 : a;  /* the result has the dtype of the last arg */
    int lead = a->ndim - g->n_spatial;
    ok = lead >= 0 && pooled->ndim == a->ndim && same_shape(same, a) && y->dtype == last->dtype;
    for (int d = 0; ok && d < lead; d++) ok = pooled->shape[d] == a->shape[d];
    if (ok && y->size * gn_dtype_size[y->dtype] > GN_MAX_BYTES - L->bytes)
      return gn_fail(L->e, GEON_ERR_OUT_OF_MEMORY, "the plan needs more than %lld bytes of buffers", (long long)GN_MAX_BYTES);
    for (int d = 0; ok && d < g->n_spatial; d++) {
      int e = 2 - g->n_spatial + d, at = lead + d;
      int64_t nw = windows(a->shape[at], g->kernel[e], g, e);
      ok = nw >= 1 && nw == pooled->shape[at] &&
           (pooled->size == 0 || every_window_reads_input(a->shape[at], nw, g, e));
    }
  }
  if (ok && op->n_args) {
    int64_t need = gn_scratch_need(op, a, b2);
    if (need > L->b->scratch_bytes) L->b->scratch_bytes = need;
  }
  if ((GN_IS_VIEW(k) || k == OP_COPY || k == OP_UNSLICE) && y->dtype != a->dtype) ok = 0;
  if (!ok) return INVALID("op %d (%s): its result or args do not have the shapes or dtypes it needs", i, name);
  for (int o = 0; own && k == OP_RESHAPE && o < op->n_out; o++) {
    /* a Reshape's buffer is used only when its arg is a view no strides can reshape;
     * the buffers of the other computing ops come from the memory plan */
    if (!(op->buffer[o] = alloc_bytes(L, op->out[o].size * gn_dtype_size[op->out[o].dtype]))) return L->e->status;
  }
  return GEON_OK;
}

/* The generic part of op record i: id, type, outputs, args. Unknown types are listed
 * in unknown (and skipped) so that one message names them all. */
static geon_status read_record(loader *L, int32_t i, const gj_node *rec, char *unknown, size_t ulen) {
  gn_op *op = &L->b->ops[i];
  const gj_node *id = gj_get(&L->doc, rec, "id"), *type = gj_get(&L->doc, rec, "op"),
                *outs = gj_get(&L->doc, rec, "outputs"), *args = gj_get(&L->doc, rec, "args");
  if (!rec || rec->type != GJ_OBJECT) return INVALID("op %d is not an object", i);
  if (!id || id->type != GJ_NUMBER || !id->is_int || id->ival != i) return INVALID("op %d: its id must be %d", i, i);
  if (!type || type->type != GJ_STRING) return INVALID("op %d: no op type", i);
  if (!outs || outs->type != GJ_ARRAY || outs->count > 2) return INVALID("op %d: outputs must be a list of at most 2", i);
  if (!args || args->type != GJ_ARRAY || args->count > 2) return INVALID("op %d: args must be a list (of at most 2 here)", i);
  int kind = kind_of(type);
  char buf[48];
  if (kind < 0) {
    const char *s = shown(type, buf, sizeof buf);
    if (!strstr(unknown, s) && strlen(unknown) + strlen(s) + 3 < ulen) {
      if (*unknown) strcat(unknown, ", ");
      strcat(unknown, s);
    }
    kind = OP_COPY; /* (not run: the plan is refused) */
  }
  op->kind = (gn_kind)kind;
  op->n_out = outs->count;
  int o = 0;
  for (const gj_node *out = gj_first(&L->doc, outs); out; out = gj_next(&L->doc, out), o++) {
    const gj_node *axes = gj_get(&L->doc, out, "axes");
    int t = dtype_of(gj_get(&L->doc, out, "dtype"), 0);
    if (!axes || axes->type != GJ_ARRAY) return INVALID("op %d: an output needs axes", i);
    if (t < 0) {
      if (gj_get(&L->doc, out, "dtype") && gj_get(&L->doc, out, "dtype")->type == GJ_STRING)
        return gn_fail(L->e, GEON_ERR_UNSUPPORTED, "op %d: dtype %s is not one this runtime has", i,
                       shown(gj_get(&L->doc, out, "dtype"), buf, sizeof buf));
      return INVALID("op %d: an output needs a dtype", i);
    }
    if (axes->count > GN_MAX_DIMS) return gn_fail(L->e, GEON_ERR_UNSUPPORTED, "op %d: more than %d dimensions", i, GN_MAX_DIMS);
    int64_t shape[GN_MAX_DIMS];
    int d = 0;
    for (const gj_node *ax = gj_first(&L->doc, axes); ax; ax = gj_next(&L->doc, ax), d++) {
      axis_entry *e = find_axis(L, ax);
      if (!e) return INVALID("op %d: an axis that graph.axes does not define", i);
      shape[d] = e->length;
    }
    op->out[o].dtype = (gn_dtype)t;
    char where[32];
    snprintf(where, sizeof where, "op %d", i);
    if (set_shape(L, &op->out[o], d, shape, where)) return L->e->status;
  }
  op->n_args = args->count;
  int k = 0;
  for (const gj_node *r = gj_first(&L->doc, args); r; r = gj_next(&L->doc, r), k++) {
    const gj_node *ro = gj_at(&L->doc, r, 0), *ri = gj_at(&L->doc, r, 1);
    if (r->type != GJ_ARRAY || r->count != 2 || ro->type != GJ_NUMBER || !ro->is_int ||
        ri->type != GJ_NUMBER || !ri->is_int || ro->ival < 0 || ro->ival >= i || ri->ival < 0 ||
        ri->ival >= L->b->ops[ro->ival].n_out)
      return INVALID("op %d: arg %d does not refer to an output of an earlier op", i, k);
    op->arg_op[k] = (int32_t)ro->ival;
    op->arg_out[k] = (int32_t)ri->ival;
  }
  return GEON_OK;
}

/* A plan's input or output entry {"shape": [...], "dtype": "<f8"} against value v. */
static int entry_matches(loader *L, const gj_node *ent, const gn_value *v) {
  const gj_node *shape = gj_get(&L->doc, ent, "shape");
  if (!shape || shape->type != GJ_ARRAY || shape->count != v->ndim) return 0;
  if (dtype_of(gj_get(&L->doc, ent, "dtype"), 1) != (int)v->dtype) return 0;
  int d = 0;
  for (const gj_node *c = gj_first(&L->doc, shape); c; c = gj_next(&L->doc, c), d++)
    if (c->type != GJ_NUMBER || !c->is_int || c->ival != v->shape[d]) return 0;
  return 1;
}

/* The results: n_out outputs [op, index], n_in placeholders [op, 0], then assignments
 * [op, null]. */
static geon_status read_results(loader *L, const gj_node *results, const gj_node *outs, const gj_node *ins) {
  struct geon_backend *b = L->b;
  if (!results || results->type != GJ_ARRAY || results->count < outs->count + ins->count)
    return INVALID("graph.results must list the outputs, then the inputs");
  b->n_outputs = outs->count;
  b->n_inputs = ins->count;
  b->output_op = calloc((size_t)b->n_outputs + 1, sizeof(int32_t));
  b->output_out = calloc((size_t)b->n_outputs + 1, sizeof(int32_t));
  b->input_op = calloc((size_t)b->n_inputs + 1, sizeof(int32_t));
  if (!b->output_op || !b->output_out || !b->input_op) return gn_fail(L->e, GEON_ERR_OUT_OF_MEMORY, "out of memory");
  int32_t k = 0;
  const gj_node *out_ent = gj_first(&L->doc, outs), *in_ent = gj_first(&L->doc, ins);
  for (const gj_node *r = gj_first(&L->doc, results); r; r = gj_next(&L->doc, r), k++) {
    const gj_node *ro = gj_at(&L->doc, r, 0), *ri = gj_at(&L->doc, r, 1);
    if (r->type != GJ_ARRAY || r->count != 2 || ro->type != GJ_NUMBER || !ro->is_int ||
        ro->ival < 0 || ro->ival >= b->n_ops)
      return INVALID("result %d does not refer to an op", k);
    gn_op *op = &b->ops[ro->ival];
    if (k >= b->n_outputs + b->n_inputs) {
      if (ri->type != GJ_NULL || op->kind != OP_ASSIGN) return INVALID("result %d: after the inputs come assignments", k);
      continue;
    }
    if (ri->type != GJ_NUMBER || !ri->is_int || ri->ival < 0 || ri->ival >= op->n_out)
      return INVALID("result %d does not refer to an output of its op", k);
    const gn_value *v = &op->out[ri->ival];
    if (k < b->n_outputs) {
      if (!entry_matches(L, out_ent, v)) return INVALID("output %d: its shape or dtype is not its op's", k);
      b->output_op[k] = (int32_t)ro->ival;
      b->output_out[k] = (int32_t)ri->ival;
      out_ent = gj_next(&L->doc, out_ent);
    } else {
      int32_t j = k - b->n_outputs;
      if (op->kind != OP_PLACEHOLDER || op->input_index >= 0) return INVALID("input %d is not a placeholder of its own", j);
      if (!entry_matches(L, in_ent, v)) return INVALID("input %d: its shape or dtype is not its placeholder's", j);
      op->input_index = j;
      b->input_op[j] = (int32_t)ro->ival;
      in_ent = gj_next(&L->doc, in_ent);
    }
  }
  for (int32_t i = 0; i < b->n_ops; i++)
    if (b->ops[i].kind == OP_PLACEHOLDER && b->ops[i].input_index < 0)
      return INVALID("op %d: a placeholder that is not an input", i);
  return GEON_OK;
}

/* --- the memory plan -------------------------------------------------------------------
 * Values are numbered 2 * op + output. A view's value lives in its root's storage (a
 * Reshape also has a buffer of its own for the copy it may make). The ops that compute
 * (all but Placeholder, Variable, Constant, the views and Assign) get their buffers
 * from a pool of slots: a slot is free again once the last op that reads its value
 * (directly or through views) has run, and the next op that needs at most its size
 * takes it (best fit). An elementwise op computes in place, into the slot of an arg
 * that it reads element for element (the same shape and element size, not through a
 * view) when it is that value's last reader and does not also read it through a view.
 * An output is copied out as soon as its op has run, so it needs nothing more. */
#define GN_STAGGER 576  /* bytes: 9 cache lines */
#define GN_STAGGER_FROM 65536

static int pooled_kind(gn_kind k) {
  return !(k == OP_PLACEHOLDER || k == OP_VARIABLE || k == OP_CONSTANT || GN_IS_VIEW(k) || k == OP_ASSIGN);
}

static int is_elementwise(gn_kind k) { return GN_IS_BINARY(k) || GN_IS_UNARY(k); }

static const gn_value *arg_value(const struct geon_backend *b, const gn_op *op, int k) {
  return &b->ops[op->arg_op[k]].out[op->arg_out[k]];
}

/* The SGD updates Assign(V, Subtract(V, Multiply(c, Gemm(a, b)))) (or Multiply(Gemm, c))
 * with a 0-d Constant c, where the Gemm, the Multiply and the Subtract are read by the
 * next op of the chain only and are not outputs, and where no op between the Gemm and
 * the Assign reads V (nor do a and b): the Gemm accumulates -c * a @ b into V's state
 * itself, with BLAS (as the NumPy transformer's updates do), and the other three ops
 * are skipped; not where c is 0 or not finite, or the inner length 0 (see below). */
static void find_updates(struct geon_backend *b, const unsigned char *is_out, const int32_t *root,
                         const int32_t *readers) {
  if (!gn_have_blas()) return;
  for (int32_t s = 0; s < b->n_ops; s++) {
    gn_op *as = &b->ops[s];
    if (as->kind != OP_ASSIGN) continue;
    int32_t var = as->arg_op[0], sub = as->arg_op[1];
    gn_op *sop = &b->ops[sub];
    if (sop->kind != OP_SUB || sop->arg_op[0] != var || readers[2 * sub] != 1 || is_out[sub]) continue;
    int32_t mul = sop->arg_op[1];
    gn_op *mop = &b->ops[mul];
    if (mop->kind != OP_MUL || sop->arg_out[1] != 0 || readers[2 * mul] != 1 || is_out[mul]) continue;
    int ci = b->ops[mop->arg_op[0]].kind == OP_CONSTANT ? 0 : 1;
    int32_t c = mop->arg_op[ci], g = mop->arg_op[1 - ci];
    gn_op *gop = &b->ops[g], *cop = &b->ops[c];
    const gn_value *y = &gop->out[0], *v = &b->ops[var].out[0];
    if (cop->kind != OP_CONSTANT || cop->out[0].ndim != 0 || gop->kind != OP_GEMM ||
        readers[2 * g] != 1 || is_out[g] || gop->update_var >= 0 || y->ndim != 2 ||
        !same_shape(y, v) || y->dtype != v->dtype || cop->out[0].dtype != v->dtype ||
        mop->out[0].dtype != v->dtype || sop->out[0].dtype != v->dtype ||
        y->shape[0] > INT32_MAX || y->shape[1] > INT32_MAX || arg_value(b, gop, 0)->shape[1] > INT32_MAX)
      continue;
    int ok = s - g <= 256 &&  /* (a bound on the work a document can ask for here) */
             root[2 * gop->arg_op[0] + gop->arg_out[0]] != 2 * var &&
             root[2 * gop->arg_op[1] + gop->arg_out[1]] != 2 * var;
    for (int32_t j = g + 1; ok && j < s; j++) {
      if (j == mul || j == sub) continue;
      for (int k = 0; ok && k < b->ops[j].n_args; k++)
        ok = root[2 * b->ops[j].arg_op[k] + b->ops[j].arg_out[k]] != 2 * var;
    }
    /* BLAS skips the product where alpha is 0 (and adds nothing where the inner
       length is 0), where V - c * (a @ b) would be NaN for a NaN or infinite
       product (or c): those updates run as the ops they are. */
    double cv = gn_load(cop->buffer[0], cop->out[0].dtype);
    if (!ok || !(cv != 0.0 && isfinite(cv)) || y->size == 0 || arg_value(b, gop, 0)->size == 0) continue;
    gop->update_var = var;
    gop->update_scale = c;
    mop->skip = sop->skip = as->skip = 1;
  }
}

/* A float elementwise op whose args all have its dtype (the typed kernels'). */
static int typed_elementwise(const struct geon_backend *b, const gn_op *op) {
  if (!is_elementwise(op->kind) || op->skip || (op->out[0].dtype != DT_F32 && op->out[0].dtype != DT_F64))
    return 0;
  for (int k = 0; k < op->n_args; k++)
    if (arg_value(b, op, k)->dtype != op->out[0].dtype) return 0;
  return 1;
}

/* Pairs (P, Q) of typed elementwise ops of one shape: Q reads P's value, which nothing
 * else reads and which is no output, and only ops that compute nothing (Placeholders,
 * Variables, Constants, views but Reshape) come between them. P then runs inside Q's
 * pass, a piece of a row at a time: P's value never goes to memory. */
static void find_fusions(struct geon_backend *b, const unsigned char *is_out, const int32_t *readers) {
  for (int32_t q = 0; q < b->n_ops; q++) {
    gn_op *Q = &b->ops[q];
    if (!typed_elementwise(b, Q) || Q->out[0].size == 0) continue;
    for (int k = 0; k < Q->n_args; k++) {
      int32_t p = Q->arg_op[k];
      gn_op *P = &b->ops[p];
      int ok = typed_elementwise(b, P) && P->fused_into < 0 && P->prologue < 0 && readers[2 * p] == 1 &&
               !is_out[p] && P->out[0].dtype == Q->out[0].dtype && same_shape(&P->out[0], &Q->out[0]);
      for (int32_t j = p + 1; ok && j < q; j++) {
        gn_kind kj = b->ops[j].kind;
        ok = kj <= OP_CONSTANT || kj == OP_DIMSHUFFLE || kj == OP_EXPAND || kj == OP_SLICEVIEW;
      }
      if (!ok) continue;
      Q->prologue = p;
      Q->prologue_at = k;
      P->fused_into = q;
      break;
    }
  }
}

/* ReduceSums R along the rows (the last dimension) of a 1-D or 2-D value that a typed
 * elementwise op E computes (R reads it directly; R is no output and has E's dtype):
 * E's pass computes R too, each row's sum as soon as the row is computed (the same
 * sums), and R's turn is skipped. */
static void find_tails(struct geon_backend *b, const unsigned char *is_out) {
  for (int32_t r = 0; r < b->n_ops; r++) {
    gn_op *R = &b->ops[r];
    if (R->kind != OP_RSUM || R->skip || is_out[r] || R->arg_out[0] != 0) continue;
    gn_op *E = &b->ops[R->arg_op[0]];
    const gn_value *x = &E->out[0];
    if (!typed_elementwise(b, E) || E->fused_into >= 0 || E->tail >= 0 || x->size == 0 ||
        x->ndim < 1 || x->ndim > 2 || R->axis != x->ndim - 1 || R->out[0].dtype != x->dtype)
      continue;
    E->tail = r;
    R->tail_of = R->arg_op[0];
  }
}

static geon_status plan_memory(loader *L) {
  struct geon_backend *b = L->b;
  int32_t n = b->n_ops, nv = 2 * n;
  int32_t *root = malloc(sizeof(int32_t) * ((size_t)nv * 7 + (size_t)n + 2));
  unsigned char *flags = calloc((size_t)n + 1, 1);
  b->pool = calloc((size_t)nv + 1, sizeof(char *));
  int64_t *cap = calloc(2 * (size_t)nv + 1, sizeof(int64_t)), *start = cap + nv;
  if (!root || !flags || !b->pool || !cap) {
    free(root); free(flags); free(cap);
    return gn_fail(L->e, GEON_ERR_OUT_OF_MEMORY, "out of memory");
  }
  /* per value: its root, its last reader, its last reader through a view (or by an op
   * that is not elementwise), its slot, its number of readers, the next value freed
   * after the same op; the free slots; per op: the first value freed after it; per
   * slot: its size and where its buffer starts in it */
  int32_t *last = root + nv, *other = last + nv, *slot = other + nv, *readers = slot + nv,
          *next_rel = readers + nv, *free_list = next_rel + nv, *head = free_list + nv;
  int32_t n_free = 0;  /* the free slots: free_list[0 .. n_free) */
  unsigned char *is_out = flags;
  for (int32_t k = 0; k < b->n_outputs; k++) is_out[b->output_op[k]] = 1;
  for (int32_t i = 0; i < n; i++) {
    gn_op *op = &b->ops[i];
    head[i] = -1;
    op->update_var = op->update_scale = op->fused_into = op->prologue = op->tail = op->tail_of = -1;
    for (int o = 0; o < 2; o++) {
      int32_t v = 2 * i + o;
      root[v] = GN_IS_VIEW(op->kind) && o < op->n_out ? root[2 * op->arg_op[0] + op->arg_out[0]] : v;
      last[v] = other[v] = slot[v] = -1;
      readers[v] = 0;
    }
  }
  for (int32_t j = 0; j < n; j++)
    for (int k = 0; k < b->ops[j].n_args; k++) readers[2 * b->ops[j].arg_op[k] + b->ops[j].arg_out[k]]++;
  find_updates(b, is_out, root, readers);
  find_fusions(b, is_out, readers);
  find_tails(b, is_out);
  for (int32_t j = 0; j < n; j++) {
    const gn_op *op = &b->ops[j];
    /* (when its args are read: in its own turn or in the pass it runs in) */
    int32_t at = op->fused_into >= 0 ? op->fused_into : op->tail_of >= 0 ? op->tail_of : j;
    for (int k = 0; k < op->n_args; k++) {
      int32_t v = 2 * op->arg_op[k] + op->arg_out[k], r = root[v];
      if (at > last[r]) last[r] = at;
      if (!(is_elementwise(op->kind) && v == r && same_shape(arg_value(b, op, k), &op->out[0])) && at > other[r])
        other[r] = at;
    }
  }
  /* value v is free again after its last reader (or its op, if nothing reads it) */
  for (int32_t i = 0; i < n; i++)
    for (int o = 0; o < b->ops[i].n_out; o++) {
      int32_t v = 2 * i + o, at = last[v] > i ? last[v] : i;
      next_rel[v] = head[at];
      head[at] = v;
    }
  int32_t n_slots = 0;
  geon_status st = GEON_OK;
  for (int32_t j = 0; j < n && !st; j++) {
    /* (a ReduceSum done in another op's pass gets its buffer with that op's) */
    for (int pass = 0; pass < 2; pass++) {
    int32_t i = pass ? b->ops[j].tail : j;
    if (i < 0 || (!pass && b->ops[j].tail_of >= 0)) continue;
    gn_op *op = &b->ops[i];
    for (int o = 0; pooled_kind(op->kind) && !op->skip && op->update_var < 0 && op->fused_into < 0 &&
                    o < op->n_out; o++) {
      gn_value *y = &op->out[o];
      int64_t need = y->size * gn_dtype_size[y->dtype];
      int32_t s = -1;
      /* (candidates: its args, and those of the op fused into its pass) */
      const gn_op *pro = op->prologue >= 0 ? &b->ops[op->prologue] : NULL;
      for (int k = 0; o == 0 && is_elementwise(op->kind) && s < 0 && k < op->n_args + (pro ? pro->n_args : 0); k++) {
        const gn_op *r = k < op->n_args ? op : pro;
        int kk = k < op->n_args ? k : k - op->n_args;
        if (r == op && op->prologue == op->arg_op[k]) continue;
        int32_t v = 2 * r->arg_op[kk] + r->arg_out[kk];
        const gn_value *a = arg_value(b, r, kk);
        if (root[v] == v && slot[v] >= 0 && last[v] == i && other[v] < i && same_shape(a, y) &&
            gn_dtype_size[a->dtype] == gn_dtype_size[y->dtype]) {
          s = slot[v];
          slot[v] = -1;  /* handed over: not freed after this op */
        }
      }
      int32_t at = -1;
      if (s < 0) {  /* the smallest free slot that is large enough */
        for (int32_t f = 0; f < n_free; f++)
          if (cap[free_list[f]] >= need && (at < 0 || cap[free_list[f]] < cap[free_list[at]])) at = f;
        if (at >= 0) {
          s = free_list[at];
          free_list[at] = free_list[--n_free];
        }
      }
      if (s < 0) {
        /* large slots start at different offsets into a page: loads and stores 4 KiB
         * apart on the same offset into a page can make a CPU wait */
        int64_t stagger = need >= GN_STAGGER_FROM ? GN_STAGGER * (n_slots % 8) : 0;
        if (!(b->pool[n_slots] = alloc_bytes(L, need + stagger))) { st = L->e->status; break; }
        cap[n_slots] = need;
        start[n_slots] = stagger;
        s = n_slots++;
        b->n_pool = n_slots;
      }
      slot[2 * i + o] = s;
      op->buffer[o] = b->pool[s] + start[s];
      op->shared[o] = 1;
    }
    }
    for (int32_t v = head[j]; v >= 0; v = next_rel[v])
      if (slot[v] >= 0) free_list[n_free++] = slot[v];
  }
  free(root); free(flags); free(cap);
  return st;
}

static geon_status load(loader *L, const gj_node *root) {
  struct geon_backend *b = L->b;
  if (!root || root->type != GJ_OBJECT || !gj_is(gj_get(&L->doc, root, "format"), "geon-plan"))
    return INVALID("not a geon plan (format \"geon-plan\")");
  const gj_node *ver = gj_get(&L->doc, root, "version");
  if (!ver || ver->type != GJ_NUMBER || !ver->is_int || ver->ival != 1)
    return INVALID("this runtime reads plan version 1");
  const gj_node *graph = gj_get(&L->doc, root, "graph"), *outs = gj_get(&L->doc, root, "outputs"),
                *ins = gj_get(&L->doc, root, "inputs");
  if (!graph || graph->type != GJ_OBJECT || !outs || outs->type != GJ_ARRAY || !ins || ins->type != GJ_ARRAY)
    return INVALID("a plan needs graph, inputs and outputs");
  const gj_node *gv = gj_get(&L->doc, graph, "version"), *ops = gj_get(&L->doc, graph, "ops");
  if (!gj_is(gj_get(&L->doc, graph, "format"), "geon-graph") || !gv || !gv->is_int || gv->ival != 2)
    return INVALID("the plan's graph must be format geon-graph version 2");
  if (!ops || ops->type != GJ_ARRAY) return INVALID("graph.ops must be a list");
  if (read_axes(L, gj_get(&L->doc, graph, "axes"))) return L->e->status;
  b->ops = calloc((size_t)ops->count + 1, sizeof(gn_op));
  if (!b->ops) return gn_fail(L->e, GEON_ERR_OUT_OF_MEMORY, "out of memory");
  b->n_ops = ops->count;
  char unknown[512] = "";
  int32_t i = 0;
  for (const gj_node *rec = gj_first(&L->doc, ops); rec; rec = gj_next(&L->doc, rec), i++) {
    b->ops[i].input_index = -1;
    if (read_record(L, i, rec, unknown, sizeof unknown)) return L->e->status;
  }
  if (*unknown) return gn_fail(L->e, GEON_ERR_UNSUPPORTED, "unsupported ops: %s", unknown);
  i = 0;
  for (const gj_node *rec = gj_first(&L->doc, ops); rec; rec = gj_next(&L->doc, rec), i++)
    if (check_op(L, i, rec)) return L->e->status;
  if (read_results(L, gj_get(&L->doc, graph, "results"), outs, ins)) return L->e->status;
  if (plan_memory(L)) return L->e->status;
  if (!(b->scratch = alloc_bytes(L, b->scratch_bytes))) return L->e->status;
  return GEON_OK;
}

geon_status gn_load_plan(const char *text, size_t len, struct geon_backend *b, gn_error *e) {
  loader L;
  memset(&L, 0, sizeof L);
  L.e = e;
  L.b = b;
  char msg[256];
  int rc = gj_parse(text, len, &L.doc, msg, sizeof msg);
  if (rc == -2) gn_fail(e, GEON_ERR_OUT_OF_MEMORY, "out of memory reading the plan");
  else if (rc) gn_fail(e, GEON_ERR_INVALID_PLAN, "%s", msg);
  else load(&L, L.doc.nodes);
  gj_free(&L.doc);
  free(L.axes);
  return e->status;
}

void gn_free_plan(struct geon_backend *b) {
  for (int32_t i = 0; b->ops && i < b->n_ops; i++)
    for (int o = 0; o < 2; o++)
      if (!b->ops[i].shared[o]) free(b->ops[i].buffer[o]);
  for (int32_t t = 0; b->pool && t < b->n_pool; t++) free(b->pool[t]);
  free(b->pool);
  free(b->ops);
  free(b->input_op);
  free(b->output_op);
  free(b->output_out);
  free(b->scratch);
}
