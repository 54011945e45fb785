/* digits_predict: classify a data set with a saved geon plan, with no Python.
 *
 *   digits_predict PLAN DATA [--runtime LIB] [--predictions OUT]
 *
 * PLAN is a plan document (geon.transformers.backends.plan(), format "geon-plan" 1)
 * with one float32 input of shape [B, F] and one float32 output of shape [B, C] (a
 * batch of B samples of F features in, C class scores out), its Variables holding the
 * trained weights (plan(..., state=...)). DATA is a data set file written by
 * geon.transformers.native.export.write_dataset (little-endian):
 *
 *   "GNDS"  u32 version (1)  u32 n  u32 features  f32 images[n][features]  i32 labels[n]
 *
 * The runtime (LIB, default libgeon_native.so beside this program) is loaded with
 * dlopen and driven through geon_backend.h alone. The samples run in batches of B, the
 * last one padded with zeros and its padding's predictions ignored; a sample's class
 * is the first index of its largest score (as NumPy's argmax). Prints the accuracy and
 * the cold start: the time from entering main to the first batch's result, which
 * loads the runtime, reads and loads the plan (graph and weights) and the data, and
 * runs one batch. With --predictions, writes the n predicted classes as int32 (little-
 * endian) to OUT. Exit status 0, or 1 with a message on stderr. */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "geon_backend.h"

typedef uint32_t (*abi_version_fn)(void);
typedef geon_status (*create_fn)(const char *, size_t, geon_backend **, char *, size_t);
typedef geon_status (*run_fn)(geon_backend *, const DLTensor *, int32_t, DLTensor *, int32_t,
                              char *, size_t);
typedef void (*destroy_fn)(geon_backend *);

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static int fail(const char *fmt, const char *what) {
  fprintf(stderr, "digits_predict: ");
  fprintf(stderr, fmt, what);
  fputc('\n', stderr);
  return 1;
}

/* The whole file at path (NUL-terminated; *len without the NUL), or NULL. */
static char *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *buf = NULL;
  size_t cap = 0, n = 0;
  for (;;) {
    if (cap - n < 65536) {
      char *grown = realloc(buf, cap = cap * 2 + 65536);
      if (!grown) { free(buf); fclose(f); return NULL; }
      buf = grown;
    }
    size_t got = fread(buf + n, 1, cap - n - 1, f);
    n += got;
    if (got == 0) break;
  }
  int bad = ferror(f);
  fclose(f);
  if (bad) { free(buf); return NULL; }
  buf[n] = '\0';
  *len = n;
  return buf;
}

/* --- the plan's input and output shapes ------------------------------------------------
 * A small JSON scanner for the plan's top-level "inputs" and "outputs" lists (the
 * runtime checks the document itself: this only finds the two shapes). */

typedef struct {
  const char *p, *end;
} scan;

static void ws(scan *s) {
  while (s->p < s->end && (*s->p == ' ' || *s->p == '\n' || *s->p == '\r' || *s->p == '\t')) s->p++;
}

static int eat(scan *s, char c) {
  ws(s);
  if (s->p < s->end && *s->p == c) { s->p++; return 1; }
  return 0;
}

/* A string: *str and *len its raw text between the quotes (escapes left as they are). */
static int string(scan *s, const char **str, size_t *len) {
  if (!eat(s, '"')) return 0;
  const char *start = s->p;
  while (s->p < s->end && *s->p != '"') s->p += (*s->p == '\\') ? 2 : 1;
  if (s->p >= s->end) return 0;
  *str = start;
  *len = (size_t)(s->p - start);
  s->p++;
  return 1;
}

static int skip(scan *s, int depth) {
  const char *str;
  size_t len;
  ws(s);
  if (s->p >= s->end || depth > 64) return 0;
  char c = *s->p;
  if (c == '"') return string(s, &str, &len);
  if (c == '{' || c == '[') {
    char close = c == '{' ? '}' : ']';
    s->p++;
    if (eat(s, close)) return 1;
    do {
      if (c == '{' && !(string(s, &str, &len) && eat(s, ':'))) return 0;
      if (!skip(s, depth + 1)) return 0;
    } while (eat(s, ','));
    return eat(s, close);
  }
  while (s->p < s->end && !strchr(",:]} \n\r\t", *s->p)) s->p++;   /* number, literal */
  return 1;
}

static int key_is(const char *str, size_t len, const char *key) {
  return len == strlen(key) && memcmp(str, key, len) == 0;
}

/* A list of exactly one {"shape": [n0, n1], "dtype": "<f4"}: its two lengths. */
static int one_f32_matrix(scan *s, int64_t shape[2]) {
  const char *str;
  size_t len;
  int dims = -1, f32 = 0;
  if (!eat(s, '[') || !eat(s, '{')) return 0;
  do {
    if (!string(s, &str, &len) || !eat(s, ':')) return 0;
    if (key_is(str, len, "shape")) {
      if (!eat(s, '[')) return 0;
      dims = 0;
      if (!eat(s, ']')) {
        do {
          ws(s);
          char *after;
          long long v = strtoll(s->p, &after, 10);
          if (after == s->p || after > s->end || v < 1 || v > (1LL << 31)) return 0;
          if (dims < 2) shape[dims] = v;
          dims++;
          s->p = after;
        } while (eat(s, ','));
        if (!eat(s, ']')) return 0;
      }
    } else if (key_is(str, len, "dtype")) {
      if (!string(s, &str, &len)) return 0;
      f32 = key_is(str, len, "<f4");
    } else if (!skip(s, 1)) {
      return 0;
    }
  } while (eat(s, ','));
  return eat(s, '}') && eat(s, ']') && dims == 2 && f32;
}

/* The shapes of the plan's one input [B, F] and one output [B, C]. */
static int plan_shapes(const char *text, size_t len, int64_t in[2], int64_t out[2]) {
  scan s = {text, text + len};
  const char *str;
  size_t n;
  int found = 0;
  if (!eat(&s, '{')) return 0;
  do {
    if (!string(&s, &str, &n) || !eat(&s, ':')) return 0;
    if (key_is(str, n, "inputs")) {
      if (!one_f32_matrix(&s, in)) return 0;
      found |= 1;
    } else if (key_is(str, n, "outputs")) {
      if (!one_f32_matrix(&s, out)) return 0;
      found |= 2;
    } else if (!skip(&s, 1)) {
      return 0;
    }
  } while (eat(&s, ','));
  return found == 3 && in[0] == out[0];
}

/* --- the data set ----------------------------------------------------------------------- */

typedef struct {
  uint32_t n, features;
  float *images;
  int32_t *labels;
} dataset;

static uint32_t le32(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static const char *read_dataset(const char *path, dataset *d) {
  size_t len;
  unsigned char *raw = (unsigned char *)read_file(path, &len);
  if (!raw) return "cannot read the data file";
  const char *why = NULL;
  if (len < 16 || memcmp(raw, "GNDS", 4) != 0) why = "the data file does not start with GNDS";
  else if (le32(raw + 4) != 1) why = "the data file is not of version 1";
  if (!why) {
    d->n = le32(raw + 8);
    d->features = le32(raw + 12);
    uint64_t want = 16 + ((uint64_t)d->n * d->features + d->n) * 4;
    if (d->n == 0 || d->features == 0 || want != len) why = "the data file's size is not its header's";
  }
  if (!why) {
    size_t pixels = (size_t)d->n * d->features;
    d->images = malloc(pixels * sizeof(float));
    d->labels = malloc((size_t)d->n * sizeof(int32_t));
    if (!d->images || !d->labels) why = "out of memory";
    else {   /* the host is little-endian (checked in main) */
      memcpy(d->images, raw + 16, pixels * 4);
      memcpy(d->labels, raw + 16 + pixels * 4, (size_t)d->n * 4);
    }
  }
  free(raw);
  return why;
}

/* --- main ---------------------------------------------------------------------------- */

typedef struct {
  create_fn create;
  run_fn run;
  destroy_fn destroy;
} runtime;

/* The runtime's functions from the library at path (NULL: beside this program). */
static const char *load_runtime(const char *path, runtime *rt) {
  static char beside[4096];
  if (!path) {
    ssize_t n = readlink("/proc/self/exe", beside, sizeof beside - 32);
    char *slash = n > 0 ? memchr(beside, '/', (size_t)n) : NULL;
    if (slash) {
      beside[n] = '\0';
      strcpy(strrchr(beside, '/') + 1, "libgeon_native.so");
      path = beside;
    } else {
      path = "libgeon_native.so";
    }
  }
  void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib) return dlerror();
  abi_version_fn version = (abi_version_fn)dlsym(lib, "geon_backend_abi_version");
  rt->create = (create_fn)dlsym(lib, "geon_backend_create");
  rt->run = (run_fn)dlsym(lib, "geon_backend_run");
  rt->destroy = (destroy_fn)dlsym(lib, "geon_backend_destroy");
  if (!version || !rt->create || !rt->run || !rt->destroy) return "the library lacks a function of geon_backend.h";
  if (version() != GEON_BACKEND_ABI_VERSION) return "the library's ABI version is not this program's";
  return NULL;
}

static DLTensor f32_matrix(float *data, int64_t *shape) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = kDLCPU;
  t.ndim = 2;
  t.dtype.code = kDLFloat;
  t.dtype.bits = 32;
  t.dtype.lanes = 1;
  t.shape = shape;
  return t;
}

/* The first index of the largest of n scores. */
static int32_t argmax(const float *x, int64_t n) {
  int32_t best = 0;
  for (int64_t k = 1; k < n; k++)
    if (x[k] > x[best]) best = (int32_t)k;
  return best;
}

int main(int argc, char **argv) {
  double t0 = now_ms();
  const char *plan_path = NULL, *data_path = NULL, *lib_path = NULL, *pred_path = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--runtime") && i + 1 < argc) lib_path = argv[++i];
    else if (!strcmp(argv[i], "--predictions") && i + 1 < argc) pred_path = argv[++i];
    else if (!plan_path) plan_path = argv[i];
    else if (!data_path) data_path = argv[i];
    else return fail("unexpected argument %s", argv[i]);
  }
  if (!data_path)
    return fail("%s", "usage: digits_predict PLAN DATA [--runtime LIB] [--predictions OUT]");
  const uint16_t one = 1;
  if (*(const unsigned char *)&one != 1) return fail("%s", "needs a little-endian machine");

  runtime rt = {NULL, NULL, NULL};
  const char *why = load_runtime(lib_path, &rt);
  if (why) return fail("cannot load the runtime: %s", why);
  double t_lib = now_ms();
  size_t len;
  char *text = read_file(plan_path, &len);
  if (!text) return fail("cannot read the plan %s", plan_path);
  int64_t in_shape[2], out_shape[2];
  if (!plan_shapes(text, len, in_shape, out_shape))
    return fail("%s: not a plan of one float32 input [B, F] and one float32 output [B, C]",
                plan_path);
  geon_backend *b = NULL;
  char err[4096];
  if (rt.create(text, len, &b, err, sizeof err) != GEON_OK) return fail("the plan: %s", err);
  free(text);
  double t_plan = now_ms();
  dataset d;
  if ((why = read_dataset(data_path, &d))) return fail("%s", why);
  if (d.features != in_shape[1]) return fail("%s: the plan takes another number of features", data_path);

  int64_t B = in_shape[0], F = in_shape[1], C = out_shape[1];
  float *x = calloc((size_t)(B * F), sizeof(float)), *y = malloc((size_t)(B * C) * sizeof(float));
  int32_t *pred = malloc((size_t)d.n * sizeof(int32_t));
  if (!x || !y || !pred) return fail("%s", "out of memory");
  DLTensor in = f32_matrix(x, in_shape), out = f32_matrix(y, out_shape);
  double t_first = 0;
  int64_t right = 0;
  for (int64_t start = 0; start < d.n; start += B) {
    int64_t m = d.n - start < B ? d.n - start : B;
    memcpy(x, d.images + start * F, (size_t)(m * F) * sizeof(float));
    memset(x + m * F, 0, (size_t)((B - m) * F) * sizeof(float));   /* padding */
    if (rt.run(b, &in, 1, &out, 1, err, sizeof err) != GEON_OK) return fail("run: %s", err);
    if (start == 0) t_first = now_ms();
    for (int64_t k = 0; k < m; k++) {
      pred[start + k] = argmax(y + k * C, C);
      right += pred[start + k] == d.labels[start + k];
    }
  }
  double t_end = now_ms();
  printf("accuracy %.4f (%lld/%u) on %u samples in batches of %lld\n", (double)right / d.n,
         (long long)right, d.n, d.n, (long long)B);
  printf("cold start %.3f ms (runtime %.3f ms, plan and weights %.3f ms, data and first "
         "batch %.3f ms); all batches %.3f ms\n", t_first - t0, t_lib - t0, t_plan - t_lib,
         t_first - t_plan, t_end - t_plan);
  if (pred_path) {
    FILE *f = fopen(pred_path, "wb");
    if (!f || fwrite(pred, sizeof(int32_t), d.n, f) != d.n || fclose(f) != 0)
      return fail("cannot write %s", pred_path);
  }
  rt.destroy(b);
  free(x); free(y); free(pred); free(d.images); free(d.labels);
  return 0;
}
