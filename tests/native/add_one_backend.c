/* A backend for tests of geon's native adapter (tests/test_backends.py): it runs the
 * one plan "y = x + 1" on float64 tensors of any shape and strides, and checks what an
 * ABI user must check. Built by the tests with -I geon/transformers/native; TEST_ABI
 * overrides the version it reports, TEST_NO_RUN leaves geon_backend_run out, TEST_SLOW
 * makes each run take a millisecond and count the runs in flight on one instance. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef TEST_SLOW
#include <time.h>
#endif

#include "geon_backend.h"

#ifndef TEST_ABI
#define TEST_ABI GEON_BACKEND_ABI_VERSION
#endif

struct geon_backend {
  long runs;
  int in_flight;
};

/* The most runs seen in flight at once on one instance (TEST_SLOW builds). */
static int most_in_flight = 0;
int test_most_in_flight(void) { return most_in_flight; }

static void message(char *err, size_t err_len, const char *text) {
  if (err_len) {
    snprintf(err, err_len, "%s", text);
  }
}

uint32_t geon_backend_abi_version(void) { return TEST_ABI; }

/* Whether the n bytes at s hold needle. */
static int holds(const char *s, size_t n, const char *needle) {
  size_t m = strlen(needle);
  for (size_t i = 0; i + m <= n; i++) {
    if (memcmp(s + i, needle, m) == 0) return 1;
  }
  return 0;
}

geon_status geon_backend_create(const char *plan, size_t len, geon_backend **out,
                                char *err, size_t err_len) {
  *out = NULL;
  if (!holds(plan, len, "\"format\":\"geon-plan\"")) {
    message(err, err_len, "not a geon plan");
    return GEON_ERR_INVALID_PLAN;
  }
  if (holds(plan, len, "\"op\":\"Tanh\"")) {
    message(err, err_len, "unsupported ops: Tanh");
    return GEON_ERR_UNSUPPORTED;
  }
  *out = calloc(1, sizeof(geon_backend));
  if (!*out) {
    message(err, err_len, "out of memory");
    return GEON_ERR_OUT_OF_MEMORY;
  }
  return GEON_OK;
}

#ifndef TEST_NO_RUN
static int is_f64(const DLTensor *t) {
  return t->dtype.code == kDLFloat && t->dtype.bits == 64 && t->dtype.lanes == 1 &&
         t->device.device_type == kDLCPU;
}

geon_status geon_backend_run(geon_backend *b, const DLTensor *in, int32_t n_in,
                             DLTensor *out, int32_t n_out, char *err, size_t err_len) {
  if (n_in != 1 || n_out != 1 || !is_f64(&in[0]) || !is_f64(&out[0]) ||
      in[0].ndim != out[0].ndim) {
    message(err, err_len, "expected one float64 input and output of one rank");
    return GEON_ERR_BAD_TENSOR;
  }
#ifdef TEST_SLOW
  int now = __atomic_add_fetch(&b->in_flight, 1, __ATOMIC_SEQ_CST);
  if (now > __atomic_load_n(&most_in_flight, __ATOMIC_SEQ_CST)) {
    __atomic_store_n(&most_in_flight, now, __ATOMIC_SEQ_CST);
  }
  struct timespec ms = {0, 1000000};
  nanosleep(&ms, NULL);
  __atomic_sub_fetch(&b->in_flight, 1, __ATOMIC_SEQ_CST);
#endif
  int64_t n = 1;
  for (int32_t d = 0; d < in[0].ndim; d++) {
    if (in[0].shape[d] != out[0].shape[d]) {
      message(err, err_len, "the output's shape is not the input's");
      return GEON_ERR_BAD_TENSOR;
    }
    n *= in[0].shape[d];
  }
  /* strides in elements; NULL: compact row-major */
  int64_t si[8], so[8], step = 1;
  if (in[0].ndim > 8) {
    message(err, err_len, "at most 8 dimensions");
    return GEON_ERR_BAD_TENSOR;
  }
  for (int32_t d = in[0].ndim - 1; d >= 0; d--) {
    si[d] = in[0].strides ? in[0].strides[d] : step;
    so[d] = out[0].strides ? out[0].strides[d] : step;
    step *= in[0].shape[d];
  }
  /* element k in row-major order, through each tensor's strides */
  for (int64_t k = 0; k < n; k++) {
    int64_t rest = k, oi = 0, oo = 0;
    for (int32_t d = in[0].ndim - 1; d >= 0; d--) {
      int64_t i = rest % in[0].shape[d];
      rest /= in[0].shape[d];
      oi += i * si[d];
      oo += i * so[d];
    }
    const double *x = (const double *)((const char *)in[0].data + in[0].byte_offset);
    double *y = (double *)((char *)out[0].data + out[0].byte_offset);
    y[oo] = x[oi] + 1.0;
  }
  b->runs++;
  return GEON_OK;
}
#endif

void geon_backend_destroy(geon_backend *b) { free(b); }
