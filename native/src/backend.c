/* backend.c: the geon_backend.h ABI of libgeon_native: create (load a plan), run (walk
 * the ops in document order), destroy. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

uint32_t geon_backend_abi_version(void) { return GEON_BACKEND_ABI_VERSION; }

static void report(const gn_error *e, char *err, size_t err_len) {
  if (err && err_len) snprintf(err, err_len, "%s", e->msg);
}

geon_status geon_backend_create(const char *plan_json, size_t len, geon_backend **out,
                                char *err, size_t err_len) {
  gn_error e = {GEON_OK, ""};
  if (err && err_len) err[0] = '\0';
  if (!out) return GEON_ERR_INTERNAL;
  *out = NULL;
  geon_backend *b = calloc(1, sizeof *b);
  if (!b) {
    gn_fail(&e, GEON_ERR_OUT_OF_MEMORY, "out of memory");
  } else if (gn_load_plan(plan_json, len, b, &e) != GEON_OK) {
    gn_free_plan(b);
    free(b);
    b = NULL;
  }
  if (e.status != GEON_OK) {
    /* the library says what it computes products with */
    size_t n = strlen(e.msg);
    snprintf(e.msg + n, sizeof e.msg - n, " [libgeon_native, %s]", gn_blas_name());
    report(&e, err, err_len);
    return e.status;
  }
  *out = b;
  return GEON_OK;
}

/* Check a caller's tensor against value v (its dtype and shape). */
static int tensor_fits(const DLTensor *t, const gn_value *v) {
  static const uint8_t CODE[DT_COUNT] = {kDLBool, kDLInt, kDLInt, kDLInt, kDLInt, kDLUInt,
                                         kDLUInt, kDLUInt, kDLUInt, kDLFloat, kDLFloat};
  if (t->device.device_type != kDLCPU || t->dtype.lanes != 1 || t->ndim != v->ndim ||
      t->dtype.bits != 8 * gn_dtype_size[v->dtype] ||
      (t->dtype.code != CODE[v->dtype] && !(v->dtype == DT_BOOL && t->dtype.code == kDLUInt)))
    return 0;
  if (t->ndim && !t->shape) return 0;
  for (int d = 0; d < t->ndim; d++)
    if (t->shape[d] != v->shape[d]) return 0;
  return t->data != NULL || v->size == 0;
}

/* v describes the caller's tensor t. */
static void describe(gn_value *v, const DLTensor *t) {
  gn_set_compact(v, (char *)t->data + t->byte_offset, t->data);
  if (t->strides)
    for (int d = 0; d < t->ndim; d++) v->strides[d] = t->strides[d];
}

static const gn_value *arg(geon_backend *b, const gn_op *op, int k) {
  return &b->ops[op->arg_op[k]].out[op->arg_out[k]];
}

/* Set op's value descriptions and compute it (op i); an error only from data that the
 * plan could not check at load time (an index out of range). */
static geon_status run_op(geon_backend *b, int32_t i, gn_op *op, const DLTensor *inputs, gn_error *e) {
  gn_value *y = &op->out[0];
  const gn_value *a = op->n_args ? arg(b, op, 0) : NULL, *a2 = op->n_args > 1 ? arg(b, op, 1) : NULL;
  for (int o = 0; o < op->n_out; o++)
    if (op->buffer[o]) gn_set_compact(&op->out[o], op->buffer[o], op->buffer[o]);
  switch (op->kind) {
    case OP_PLACEHOLDER: describe(y, &inputs[op->input_index]); break;
    case OP_VARIABLE:
    case OP_CONSTANT:
      if (op->filled) memset(y->strides, 0, sizeof y->strides);
      break;
    case OP_RESHAPE:
      if (!gn_reshape_strides(a, y)) {   /* no strides describe it: copy */
        gn_value c = *y;
        memcpy(c.shape, a->shape, sizeof c.shape);
        c.ndim = a->ndim;
        gn_set_compact(&c, op->buffer[0], op->buffer[0]);
        gn_copy_values(&c, a);
        gn_set_compact(y, op->buffer[0], op->buffer[0]);
      }
      break;
    case OP_DIMSHUFFLE:
      for (int d = 0; d < y->ndim; d++) y->strides[d] = a->strides[op->perm[d]];
      y->data = a->data; y->storage = a->storage;
      break;
    case OP_EXPAND:
      for (int d = 0; d < y->ndim; d++) y->strides[d] = op->dim_map[d] < 0 ? 0 : a->strides[op->dim_map[d]];
      y->data = a->data; y->storage = a->storage;
      break;
    case OP_SLICEVIEW: {
      int64_t off = 0;
      int j = 0;
      for (int d = 0; d < a->ndim; d++) {
        off += op->key[d].start * a->strides[d];
        if (!op->key[d].is_index) y->strides[j++] = op->key[d].step * a->strides[d];
      }
      y->data = y->size ? a->data + off * gn_dtype_size[a->dtype] : a->data;
      y->storage = a->storage;
      break;
    }
    case OP_UNSLICE: {
      gn_value part = *a;
      int64_t off = 0;
      int j = 0;
      memset(y->data, 0, (size_t)(y->size * gn_dtype_size[y->dtype]));
      for (int d = 0; d < y->ndim; d++) {
        off += op->key[d].start * y->strides[d];
        if (!op->key[d].is_index) part.strides[j++] = op->key[d].step * y->strides[d];
      }
      part.data = y->data + off * gn_dtype_size[y->dtype];
      part.dtype = y->dtype;
      if (part.size) gn_copy_values(&part, a);
      break;
    }
    case OP_COPY: gn_copy_values(y, a); break;
    case OP_ASSIGN: {
      gn_op *var = &b->ops[op->arg_op[0]];
      gn_value dst = var->out[0];
      gn_set_compact(&dst, var->buffer[0], var->buffer[0]);
      if (a2->storage == var->buffer[0]) {  /* the value reads the Variable: go through scratch */
        gn_value tmp = dst;
        tmp.dtype = a2->dtype;
        gn_set_compact(&tmp, b->scratch, b->scratch);
        gn_copy_values(&tmp, a2);
        gn_copy_values(&dst, &tmp);
      } else {
        gn_copy_values(&dst, a2);
      }
      break;
    }
    case OP_GEMM:
      if (op->update_var >= 0) {  /* an SGD update into the Variable's state */
        gn_op *var = &b->ops[op->update_var];
        gn_value into = var->out[0];
        gn_set_compact(&into, var->buffer[0], var->buffer[0]);
        const gn_op *c = &b->ops[op->update_scale];
        gn_run_gemm_update(&into, -gn_load(c->buffer[0], c->out[0].dtype), a, a2, b->scratch);
      } else {
        gn_run_gemm(op, a, a2, b->scratch);
      }
      break;
    case OP_TAKE: return gn_run_take(op, a, a2, i, e);
    case OP_PUTADD: return gn_run_put_add(op, a, a2, b->scratch, i, e);
    case OP_PREFIXSUM: gn_run_prefix_sum(op, a, b->scratch); break;
    case OP_SORT: gn_run_sort(op, a, b->scratch); break;
    case OP_CONV: case OP_CONV_GRAD_DATA: case OP_CONV_GRAD_FILTER: gn_run_conv(op, a, a2, b->scratch); break;
    case OP_MAXPOOL: case OP_MAXPOOL_GRAD: case OP_MAXPOOL_GATHER: gn_run_pool(op, a, a2, b->scratch); break;
    case OP_RANDOM: gn_run_random(op, a); break;
    default: {
      if (GN_IS_REDUCE(op->kind)) {
        gn_run_reduce(op, a);
        break;
      }
      gn_op *tail = NULL;
      if (op->tail >= 0) {  /* a ReduceSum of this value, row by row in the same pass */
        tail = &b->ops[op->tail];
        gn_set_compact(&tail->out[0], tail->buffer[0], tail->buffer[0]);
      }
      if (op->prologue >= 0) {  /* another elementwise op inside this one's pass */
        const gn_op *p = &b->ops[op->prologue];
        gn_run_fused(op, a, a2, op->prologue_at, p->kind, arg(b, p, 0), p->n_args > 1 ? arg(b, p, 1) : NULL,
                     tail);
      } else {
        gn_run_elementwise(op, a, a2, tail);
      }
      break;
    }
  }
  return GEON_OK;
}

geon_status geon_backend_run(geon_backend *b, const DLTensor *inputs, int32_t n_inputs,
                             DLTensor *outputs, int32_t n_outputs, char *err, size_t err_len) {
  gn_error e = {GEON_OK, ""};
  if (err && err_len) err[0] = '\0';
  if (!b) { gn_fail(&e, GEON_ERR_INTERNAL, "no instance"); report(&e, err, err_len); return e.status; }
  if (n_inputs != b->n_inputs || n_outputs != b->n_outputs || (n_inputs && !inputs) || (n_outputs && !outputs)) {
    gn_fail(&e, GEON_ERR_BAD_TENSOR, "the plan takes %d inputs and %d outputs, got %d and %d",
            b->n_inputs, b->n_outputs, n_inputs, n_outputs);
    report(&e, err, err_len);
    return e.status;
  }
  for (int32_t k = 0; k < n_inputs; k++)
    if (!tensor_fits(&inputs[k], &b->ops[b->input_op[k]].out[0]))
      gn_fail(&e, GEON_ERR_BAD_TENSOR, "input %d does not have the plan's dtype and shape", k);
  for (int32_t k = 0; k < n_outputs; k++)
    if (!tensor_fits(&outputs[k], &b->ops[b->output_op[k]].out[b->output_out[k]]))
      gn_fail(&e, GEON_ERR_BAD_TENSOR, "output %d does not have the plan's dtype and shape", k);
  if (e.status) { report(&e, err, err_len); return e.status; }
  for (int32_t i = 0; i < b->n_ops; i++) {
    gn_op *op = &b->ops[i];
    if (op->skip || op->fused_into >= 0 || op->tail_of >= 0) continue;  /* (done in another op) */
    if (run_op(b, i, op, inputs, &e)) { report(&e, err, err_len); return e.status; }
    /* an output is copied as soon as it is computed (a later Assign may change it) */
    for (int32_t k = 0; k < n_outputs; k++) {
      if (b->output_op[k] != i) continue;
      gn_value dst = b->ops[i].out[b->output_out[k]];
      describe(&dst, &outputs[k]);
      gn_copy_values(&dst, &b->ops[i].out[b->output_out[k]]);
    }
  }
  return GEON_OK;
}

void geon_backend_destroy(geon_backend *b) {
  if (!b) return;
  gn_free_plan(b);
  free(b);
}
