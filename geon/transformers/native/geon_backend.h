/* geon_backend.h: the C ABI of a geon backend, version 1.
 *
 * A backend is a shared library that runs geon plans: JSON documents written by
 * geon.transformers.backends.plan() (format "geon-plan"), which hold a graph lowered to
 * geon's base set of semi-primitive ops (row-major buffers, positional axes) with its
 * inputs and outputs. geon loads such a library at run time with
 * geon.load_backend(path); nothing of geon is rebuilt.
 *
 * Tensors cross the ABI as DLPack DLTensors (the struct below is the DLPack
 * specification's, so a library that includes dlpack.h itself can define
 * GEON_HAVE_DLPACK before including this header).
 *
 * Ownership:
 *  - geon_backend_create copies what it needs of the plan: the caller may free the
 *    text when it returns.
 *  - The caller owns every input and output tensor and their memory. Outputs are
 *    allocated by the caller with the shapes and dtypes the plan lists for them;
 *    the backend writes their elements and nothing else.
 *  - A backend keeps no pointer into a tensor after geon_backend_run returns.
 *  - Error messages are written into the caller's buffer (err, err_len), always
 *    NUL-terminated when err_len > 0, truncated if longer.
 *
 * Thread safety:
 *  - geon_backend_abi_version, geon_backend_create and geon_backend_destroy may be
 *    called from any thread at any time (on different instances).
 *  - One instance runs one call at a time: the caller serializes geon_backend_run on
 *    the same instance (geon's adapter does). Different instances may run
 *    concurrently.
 *
 * Tensors: an input's strides may be zero (a broadcast) or negative, and inputs may
 * share memory with each other; outputs share memory with nothing. Data pointers are
 * aligned to the element size.
 *
 * Errors: every function that can fail returns a geon_status; GEON_OK is 0. A plan the
 * backend cannot run (an op it does not implement, a dtype it lacks) is
 * GEON_ERR_UNSUPPORTED at create time, with the unsupported ops listed in the message;
 * a malformed plan is GEON_ERR_INVALID_PLAN. Neither may crash or read out of bounds,
 * whatever the document holds.
 */
#ifndef GEON_BACKEND_H
#define GEON_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GEON_BACKEND_ABI_VERSION 1u

#ifndef GEON_HAVE_DLPACK
/* DLPack's device and dtype codes that geon uses. */
typedef enum { kDLCPU = 1 } DLDeviceType;
typedef enum { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBool = 6 } DLDataTypeCode;

typedef struct {
  int32_t device_type;  /* DLDeviceType */
  int32_t device_id;
} DLDevice;

typedef struct {
  uint8_t code;   /* DLDataTypeCode */
  uint8_t bits;   /* 8, 16, 32, 64 */
  uint16_t lanes; /* 1 */
} DLDataType;

typedef struct {
  void *data;           /* the first element is at data + byte_offset */
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t *shape;       /* ndim lengths */
  int64_t *strides;     /* ndim strides in elements, or NULL: row-major, compact */
  uint64_t byte_offset;
} DLTensor;
#endif

typedef enum {
  GEON_OK = 0,
  GEON_ERR_INVALID_PLAN = 1,  /* the document is not a plan this backend reads */
  GEON_ERR_UNSUPPORTED = 2,   /* ops, dtypes or devices this backend does not run */
  GEON_ERR_BAD_TENSOR = 3,    /* an input or output of the wrong count, dtype or shape */
  GEON_ERR_OUT_OF_MEMORY = 4,
  GEON_ERR_INTERNAL = 5
} geon_status;

typedef struct geon_backend geon_backend; /* an instance: one loaded plan */

/* GEON_BACKEND_ABI_VERSION of the header the library was built with; geon refuses a
 * library whose version is not its own. */
uint32_t geon_backend_abi_version(void);

/* A new instance running the plan plan_json (len bytes of UTF-8 JSON, not necessarily
 * NUL-terminated) in *out; on failure *out is NULL and err holds the reason. */
geon_status geon_backend_create(const char *plan_json, size_t len, geon_backend **out,
                                char *err, size_t err_len);

/* Compute the plan's outputs from its inputs: n_inputs and n_outputs tensors, in the
 * plan's order. */
geon_status geon_backend_run(geon_backend *backend, const DLTensor *inputs,
                             int32_t n_inputs, DLTensor *outputs, int32_t n_outputs,
                             char *err, size_t err_len);

/* Free an instance (NULL is allowed). */
void geon_backend_destroy(geon_backend *backend);

#ifdef __cplusplus
}
#endif

#endif /* GEON_BACKEND_H */
