/* runtime.h: the internal types of geon's native runtime (libgeon_native).
 *
 * A plan is loaded (plan.c) into an array of ops in document order, which is a
 * topological order: every arg refers to an earlier op. Each op has at most two
 * tensor values. A value is a strided description of elements in some storage: an
 * op that computes writes a compact row-major buffer, a slot of a pool allocated at
 * load time and shared by values whose lifetimes do not overlap (plan.c's memory
 * plan; an elementwise op may compute in place into an arg's slot); a
 * Variable owns its state; a Constant owns its array (one element and zero strides
 * when it is one number filling a shape); a Placeholder points into the caller's
 * input tensor during a run; a view (Reshape, Dimshuffle, Expand, SliceView) describes
 * its arg's elements with other strides and never copies (a Reshape of a view that
 * no strides can describe copies into its own buffer). Running (backend.c) walks the
 * ops in order, sets each value's description and calls its kernel (kernels.c; the ops
 * along dimension 1, convolution and pooling in kernels_more.c; Random in random.c). */
#ifndef GN_RUNTIME_H
#define GN_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#include "geon_backend.h"

#define GN_MAX_DIMS 8
/* A tensor holds at most this many elements, and one instance at most this many bytes
 * of buffers (override with -DGN_MAX_BYTES=...). */
#define GN_MAX_ELEMENTS ((int64_t)1 << 40)
#ifndef GN_MAX_BYTES
#define GN_MAX_BYTES ((int64_t)1 << 33)
#endif

typedef enum { DT_BOOL, DT_I8, DT_I16, DT_I32, DT_I64, DT_U8, DT_U16, DT_U32, DT_U64,
               DT_F32, DT_F64, DT_COUNT } gn_dtype;

extern const int gn_dtype_size[DT_COUNT];
extern const char *const gn_dtype_name[DT_COUNT];

/* The op kinds this runtime runs. */
typedef enum {
  OP_PLACEHOLDER, OP_VARIABLE, OP_CONSTANT,
  /* elementwise, binary */
  OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_MAX, OP_MIN, OP_POW,
  OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE,
  OP_SIGMOID_CE,                 /* the schema op SigmoidCrossEntropy(x, t) */
  /* elementwise, unary */
  OP_NEG, OP_ABS, OP_SIGN, OP_SQUARE, OP_SQRT, OP_RECIP, OP_EXP, OP_LOG, OP_SIN, OP_COS,
  OP_TANH, OP_SIGMOID, OP_ERF, OP_EXPM1, OP_SOFTPLUS,
  /* views */
  OP_RESHAPE, OP_DIMSHUFFLE, OP_EXPAND, OP_SLICEVIEW,
  /* the rest */
  OP_COPY, OP_UNSLICE, OP_ASSIGN, OP_GEMM,
  OP_RSUM, OP_RPROD, OP_RMAX, OP_RMIN, OP_RARGMAX, OP_RARGMIN, OP_RMAXARGMAX,
  /* along dimension 1 of (O, N, ...) */
  OP_TAKE, OP_PUTADD, OP_PREFIXSUM, OP_SORT,
  /* convolution and max pooling over 1 or 2 trailing spatial dimensions */
  OP_CONV, OP_CONV_GRAD_DATA, OP_CONV_GRAD_FILTER, OP_MAXPOOL, OP_MAXPOOL_GRAD,
  OP_MAXPOOL_GATHER,
  /* geon's random numbers (random.c) */
  OP_RANDOM,
  OP_KIND_COUNT
} gn_kind;

#define GN_IS_BINARY(k) ((k) >= OP_ADD && (k) <= OP_SIGMOID_CE)
#define GN_IS_UNARY(k) ((k) >= OP_NEG && (k) <= OP_SOFTPLUS)
#define GN_IS_VIEW(k) ((k) >= OP_RESHAPE && (k) <= OP_SLICEVIEW)
#define GN_IS_REDUCE(k) ((k) >= OP_RSUM && (k) <= OP_RMAXARGMAX)
#define GN_IS_CONV(k) ((k) >= OP_CONV && (k) <= OP_CONV_GRAD_FILTER)
#define GN_IS_POOL(k) ((k) >= OP_MAXPOOL && (k) <= OP_MAXPOOL_GATHER)

/* The window geometry of a convolution or pooling op, always as two spatial
 * dimensions (a 1-D op is read as one of height 1): dimension d of the output reads
 * input position p * stride[d] - pad_lo[d] + r * dilation[d] for kernel offset r. */
typedef struct {
  int n_spatial;                  /* as the plan wrote it: 1 or 2 */
  int64_t kernel[2], stride[2], dilation[2], pad_lo[2], pad_hi[2];
  int64_t groups;                 /* convolutions */
} gn_window;

typedef struct {
  gn_dtype dtype;
  int ndim;
  int64_t shape[GN_MAX_DIMS];
  int64_t size;                  /* product of shape */
  /* set while running */
  char *data;                    /* the element at index 0 in every dimension */
  int64_t strides[GN_MAX_DIMS];  /* in elements */
  const void *storage;           /* what the elements belong to (for aliasing checks) */
} gn_value;

/* One entry of a slice key: an index (is_index) or start/stop/step resolved against
 * the dimension's length (as Python's slice.indices does). */
typedef struct {
  int is_index;
  int64_t start, step, count;
} gn_slice;

typedef struct {
  gn_kind kind;
  int n_args;
  int32_t arg_op[2], arg_out[2];  /* op index and output index of each arg */
  int n_out;                      /* 0 (Assign), 1, or 2 (ReduceMaxArgMax) */
  gn_value out[2];
  /* static parameters */
  int axis;                       /* reductions */
  int perm[GN_MAX_DIMS];          /* Dimshuffle */
  int dim_map[GN_MAX_DIMS];       /* Expand: arg dimension, or -1 for a new one */
  gn_slice key[GN_MAX_DIMS];      /* SliceView (arg's dims), Unslice (result's dims) */
  int input_index;                /* Placeholder: which input */
  gn_window win;                  /* Conv*, MaxPool* */
  uint64_t rnd_seed;              /* Random: seed, stream id, normal (else uniform) */
  uint32_t rnd_stream;
  int rnd_normal;
  /* storage: compact row-major, owned unless shared[o] (NULL for views, placeholders,
   * ops the memory plan gives none) */
  char *buffer[2];
  int filled;                     /* Constant: one element filling the shape */
  /* set by the memory plan (plan.c): the buffers of a computing op are slots of a pool
   * shared with other values whose lifetimes do not overlap (shared[o]: not this op's
   * to free). An SGD update Assign(V, V - c * Gemm(a, b)) runs as the Gemm, accumulating
   * -c * a @ b into V's state (update_var: V's op, update_scale: c's Constant op); the
   * Multiply, Subtract and Assign are then skipped. */
  unsigned char shared[2];
  int32_t update_var, update_scale;
  int skip;
  /* an elementwise op P whose value only the elementwise op Q reads (only ops that
   * compute nothing between them) runs inside Q's pass (gn_run_fused): fused_into is
   * Q on P; prologue is P on Q, its arg prologue_at */
  int32_t fused_into, prologue;
  int prologue_at;
  /* a ReduceSum R along the rows of a typed elementwise op E's value, computed in E's
   * pass (row by row): tail is R on E, tail_of E on R */
  int32_t tail, tail_of;
} gn_op;

struct geon_backend {
  gn_op *ops;
  int32_t n_ops;
  int32_t n_inputs, n_outputs;
  int32_t *input_op;               /* op of each input */
  int32_t *output_op, *output_out; /* op and output index of each output */
  gn_dtype *output_dtype;
  char *scratch;                   /* for packing operands and aliasing assignments */
  int64_t scratch_bytes;
  char **pool;                     /* the memory plan's slots (owned) */
  int32_t n_pool;
};

/* Errors: the first one wins; message printed into err. */
typedef struct {
  geon_status status;
  char msg[1024];
} gn_error;

geon_status gn_fail(gn_error *e, geon_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* plan.c */
geon_status gn_load_plan(const char *text, size_t len, struct geon_backend *b, gn_error *e);
void gn_free_plan(struct geon_backend *b);

/* kernels.c: each computes op's outputs from its args' values (set up by the caller). */
void gn_set_compact(gn_value *v, char *data, const void *storage);
int gn_reshape_strides(const gn_value *from, gn_value *to);
double gn_load(const char *p, gn_dtype t);
void gn_store(char *p, gn_dtype t, double v);
void gn_copy_values(gn_value *dst, const gn_value *src);
/* tail: NULL, or a ReduceSum along the rows of op's value (1-D or 2-D), which these
 * compute too, each row as soon as it is computed */
void gn_run_elementwise(gn_op *op, const gn_value *a, const gn_value *b, gn_op *tail);
void gn_run_fused(gn_op *q, const gn_value *qa, const gn_value *qb, int at, gn_kind pk,
                  const gn_value *pa, const gn_value *pb, gn_op *tail);
void gn_run_reduce(gn_op *op, const gn_value *x);
void gn_run_gemm(gn_op *op, const gn_value *a, const gn_value *b, char *scratch);
/* into += alpha * a @ b (2-D, compact into; only with BLAS: gn_have_blas) */
void gn_run_gemm_update(gn_value *into, double alpha, const gn_value *a, const gn_value *b, char *scratch);
int gn_have_blas(void);
/* kernels_more.c: ops along dimension 1, convolution and pooling. Those that read
 * indices from data return GEON_ERR_BAD_TENSOR (message in e) for one out of range. */
geon_status gn_run_take(gn_op *op, const gn_value *x, const gn_value *idx, int32_t i, gn_error *e);
geon_status gn_run_put_add(gn_op *op, const gn_value *d, const gn_value *idx, char *scratch,
                           int32_t i, gn_error *e);
void gn_run_prefix_sum(gn_op *op, const gn_value *x, char *scratch);
void gn_run_sort(gn_op *op, const gn_value *x, char *scratch);
void gn_run_conv(gn_op *op, const gn_value *a, const gn_value *b, char *scratch);
void gn_run_pool(gn_op *op, const gn_value *a, const gn_value *b, char *scratch);
int64_t gn_scratch_need(const gn_op *op, const gn_value *a, const gn_value *b);
const char *gn_blas_name(void);
/* random.c: the Random primitive's draw at the step counter's value (an integer scalar). */
void gn_run_random(gn_op *op, const gn_value *counter);

#endif
