"""The native adapter's call path: a small CPython extension module, built at first use
through geon's C toolchain and kernel cache (:func:`geon.transformers.numpy.toolchain.build`:
the same checks, the same cache, keyed on the source and the flags), whose one
function runs an executable without Python code or :mod:`ctypes` per tensor (a ctypes
call alone costs about a microsecond, as much as a whole small NumPy computation).

Its ``run(prep, arrays)`` (``METH_FASTCALL``) takes the tuple an executable prepares
once (the backend's ``geon_backend_run`` address, the address of the executable's
handle, its lock, the BLAS thread policy, the DLTensor arrays' addresses, what each
input must be, the outputs' shapes and dtypes, ``numpy.empty``, the error buffer) and
the input arrays. It takes each input's memory through the buffer protocol
(``PyBUF_STRIDES | PyBUF_FORMAT``) and checks it against the plan: an exact ndarray
of the input's shape and buffer format, aligned, with strides of whole elements.
Anything else (another type, a wrong count, shape or dtype, misaligned data, a closed
executable, ...) gives None *before* anything runs, and the adapter's ctypes path
then does the whole call as before (the same checks, errors and copies). Else it makes
the outputs with ``numpy.empty`` (``PyBUF_STRIDES | PyBUF_WRITABLE``), takes the lock,
applies the BLAS thread policy (at a run at most every 20 ms: the policy measures the
load every 0.2 s, and calling it costs about as much as the rest of a small run),
reads the handle (0 once closed), fills the DLTensors' data (and an input's strides,
in elements, where it is not C-contiguous), calls ``geon_backend_run`` without the
GIL, releases the lock and every buffer, and returns the list of outputs or
``(status, message)`` (the message read under the lock).

The lock is the module's own (``lock()``: a PyThread lock in a capsule; ``acquire``
and ``release`` for the adapter's Python side), cheaper to take from C than a
:class:`threading.Lock`; one that must wait waits without the GIL.

:func:`load` gives the module, or None where it cannot be built or loaded (no C
compiler, no ``Python.h``, no kernel cache, ...): the adapter then runs every call
through ctypes, with the same results. Nothing is built when geon is installed
(``pip install -e .`` needs no compiler).
"""

import importlib.machinery
import importlib.util
import os
import sysconfig
import threading
from typing import Any, Optional

__all__ = ["SOURCE", "load"]

#: The module's name (its init function is ``PyInit__geon_callpath``).
NAME = "_geon_callpath"

#: The C source of the module. The DLPack structs are declared here as
#: ``geon_backend.h`` declares them (ABI version 1), so that the source alone (with
#: the flags) keys the cache.
SOURCE = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

typedef struct { int32_t device_type; int32_t device_id; } cp_device;
typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } cp_dtype;
typedef struct {
    void *data; cp_device device; int32_t ndim; cp_dtype dtype;
    int64_t *shape; int64_t *strides; uint64_t byte_offset;
} cp_tensor;
typedef int (*cp_run_fn)(void *, const cp_tensor *, int32_t, cp_tensor *, int32_t,
                         char *, size_t);

/* prep: the tuple _NativeExecutable._prepare makes, in this order (P_KEEP: what the
   addresses point into, kept alive). */
enum { P_RUN, P_HANDLE, P_LOCK, P_BLAS, P_IN_T, P_OUT_T, P_FORMATS,
       P_STRIDES, P_OUT_SPECS, P_EMPTY, P_NDARRAY, P_ERR, P_ERR_LEN, P_KEEP, P_N };

#define CP_STACK 8
#define CP_LOCK "geon.callpath.lock"

/* Seconds between two applications of the BLAS thread policy by one executable (the
   policy measures the load every 0.2 s: a change reaches the BLAS as soon). */
#define CP_BLAS_TICK 0.02

/* The lock of an executable: a PyThread lock in a capsule (lock(), acquire(lock),
   release(lock)); one that must wait waits without the GIL. With it, when the BLAS
   thread policy is next applied (under the lock). */
typedef struct { PyThread_type_lock lock; double blas_next; } cp_lock_t;

static void lock_free(PyObject *cap) {
    cp_lock_t *l = PyCapsule_GetPointer(cap, CP_LOCK);
    if (l) {
        PyThread_free_lock(l->lock);
        PyMem_Free(l);
    }
}

static PyObject *cp_lock(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self; (void)args; (void)nargs;
    cp_lock_t *l = PyMem_Malloc(sizeof(cp_lock_t));
    if (!l) return PyErr_NoMemory();
    l->blas_next = 0.0;
    l->lock = PyThread_allocate_lock();
    if (!l->lock) {
        PyMem_Free(l);
        return PyErr_NoMemory();
    }
    PyObject *cap = PyCapsule_New(l, CP_LOCK, lock_free);
    if (!cap) {
        PyThread_free_lock(l->lock);
        PyMem_Free(l);
    }
    return cap;
}

/* (a coarse clock where there is one: a few ms of resolution, read without a system
   call or a read of the time stamp counter) */
#ifdef CLOCK_MONOTONIC_COARSE
#define CP_CLOCK CLOCK_MONOTONIC_COARSE
#else
#define CP_CLOCK CLOCK_MONOTONIC
#endif

static double now_s(void) {
    struct timespec ts;
    if (clock_gettime(CP_CLOCK, &ts)) return 1e300;   /* (then: every run) */
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void take(PyThread_type_lock l) {
    if (!PyThread_acquire_lock(l, NOWAIT_LOCK)) {
        Py_BEGIN_ALLOW_THREADS
        PyThread_acquire_lock(l, WAIT_LOCK);
        Py_END_ALLOW_THREADS
    }
}

static cp_lock_t *lock_arg(PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 1) {
        PyErr_SetString(PyExc_TypeError, "expected one lock");
        return NULL;
    }
    return PyCapsule_GetPointer(args[0], CP_LOCK);
}

static PyObject *cp_acquire(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    cp_lock_t *l = lock_arg(args, nargs);
    if (!l) return NULL;
    take(l->lock);
    Py_RETURN_NONE;
}

static PyObject *cp_release(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    cp_lock_t *l = lock_arg(args, nargs);
    if (!l) return NULL;
    PyThread_release_lock(l->lock);
    Py_RETURN_NONE;
}

static void *addr(PyObject *prep, int k) { return PyLong_AsVoidPtr(PyTuple_GET_ITEM(prep, k)); }

static void release_all(Py_buffer *views, Py_ssize_t n) {
    for (Py_ssize_t k = 0; k < n; k++) PyBuffer_Release(&views[k]);
}

/* Whether the buffer v holds input k as the plan says (shape, format), aligned, with
   strides of whole elements; *contig: whether it is C-contiguous. */
static int input_fits(const Py_buffer *v, const cp_tensor *t, PyObject *format, int *contig) {
    Py_ssize_t z = v->itemsize;
    if (v->ndim != t->ndim || z <= 0 || z * 8 != t->dtype.bits || v->format == NULL ||
            strcmp(v->format, PyBytes_AS_STRING(format)) != 0)
        return 0;
    for (int d = 0; d < v->ndim; d++)
        if (v->shape[d] != t->shape[d]) return 0;
    if ((uintptr_t)v->buf % (uintptr_t)z) return 0;
    *contig = PyBuffer_IsContiguous(v, 'C');
    if (!*contig)
        for (int d = 0; d < v->ndim; d++)
            if (v->strides[d] % z) return 0;
    return 1;
}

static PyObject *cp_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2 || !PyTuple_CheckExact(args[0]) || PyTuple_GET_SIZE(args[0]) != P_N ||
            !PyTuple_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "run(prep, arrays): prep is the adapter's tuple");
        return NULL;
    }
    PyObject *prep = args[0], *arrays = args[1];
    PyObject *formats = PyTuple_GET_ITEM(prep, P_FORMATS);
    PyObject *strides = PyTuple_GET_ITEM(prep, P_STRIDES);
    PyObject *specs = PyTuple_GET_ITEM(prep, P_OUT_SPECS);
    PyObject *ndarray = PyTuple_GET_ITEM(prep, P_NDARRAY);
    Py_ssize_t n_in = PyTuple_GET_SIZE(formats), n_out = PyTuple_GET_SIZE(specs);
    if (PyTuple_GET_SIZE(arrays) != n_in) Py_RETURN_NONE;   /* the Python path says why */
    cp_run_fn run = (cp_run_fn)addr(prep, P_RUN);
    void **handle = (void **)addr(prep, P_HANDLE);
    cp_tensor *in_t = (cp_tensor *)addr(prep, P_IN_T), *out_t = (cp_tensor *)addr(prep, P_OUT_T);
    char *err = (char *)addr(prep, P_ERR);
    cp_lock_t *lock = PyCapsule_GetPointer(PyTuple_GET_ITEM(prep, P_LOCK), CP_LOCK);
    if (!lock) return NULL;
    size_t err_len = PyLong_AsSize_t(PyTuple_GET_ITEM(prep, P_ERR_LEN));
    if (PyErr_Occurred()) return NULL;

    Py_buffer stack_views[CP_STACK];
    int stack_contig[CP_STACK];
    Py_buffer *views = stack_views;
    int *contig = stack_contig;
    Py_ssize_t n_all = n_in + n_out, got = 0;
    PyObject *outs = NULL, *result = NULL;
    int locked = 0;
    if (n_all > CP_STACK) {
        views = PyMem_Malloc(sizeof(Py_buffer) * n_all);
        contig = PyMem_Malloc(sizeof(int) * n_all);
        if (!views || !contig) { PyErr_NoMemory(); goto done; }
    }
    for (Py_ssize_t k = 0; k < n_in; k++) {
        PyObject *a = PyTuple_GET_ITEM(arrays, k);
        if ((PyObject *)Py_TYPE(a) != ndarray) { result = Py_None; goto done; }
        if (PyObject_GetBuffer(a, &views[k], PyBUF_STRIDES | PyBUF_FORMAT) < 0) {
            PyErr_Clear();
            result = Py_None;
            goto done;
        }
        got = k + 1;
        if (!input_fits(&views[k], &in_t[k], PyTuple_GET_ITEM(formats, k), &contig[k])) {
            result = Py_None;
            goto done;
        }
    }
    outs = PyList_New(n_out);
    if (!outs) goto done;
    PyObject *empty = PyTuple_GET_ITEM(prep, P_EMPTY);
    for (Py_ssize_t k = 0; k < n_out; k++) {
        PyObject *spec = PyTuple_GET_ITEM(specs, k);
        PyObject *shape_dtype[2] = {PyTuple_GET_ITEM(spec, 0), PyTuple_GET_ITEM(spec, 1)};
        PyObject *o = PyObject_Vectorcall(empty, shape_dtype, 2, NULL);
        if (!o) goto done;
        PyList_SET_ITEM(outs, k, o);
        if (PyObject_GetBuffer(o, &views[n_in + k], PyBUF_STRIDES | PyBUF_WRITABLE) < 0)
            goto done;
        got = n_in + k + 1;
    }
    take(lock->lock);
    locked = 1;
    PyObject *blas = PyTuple_GET_ITEM(prep, P_BLAS);
    if (blas != Py_None) {
        double t = now_s();
        if (t >= lock->blas_next) {
            PyObject *r = PyObject_CallNoArgs(blas);
            if (!r) goto done;
            Py_DECREF(r);
            lock->blas_next = t + CP_BLAS_TICK;
        }
    }
    void *h = *handle;
    if (!h) { result = Py_None; goto done; }   /* closed: the Python path raises */
    for (Py_ssize_t k = 0; k < n_in; k++) {
        const Py_buffer *v = &views[k];
        cp_tensor *t = &in_t[k];
        t->data = v->buf;
        if (contig[k]) {
            t->strides = NULL;
        } else {
            int64_t *st = (int64_t *)PyLong_AsVoidPtr(PyTuple_GET_ITEM(strides, k));
            for (int d = 0; d < v->ndim; d++) st[d] = (int64_t)(v->strides[d] / v->itemsize);
            t->strides = st;
        }
    }
    for (Py_ssize_t k = 0; k < n_out; k++) out_t[k].data = views[n_in + k].buf;
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = run(h, in_t, (int32_t)n_in, out_t, (int32_t)n_out, err, err_len);
    Py_END_ALLOW_THREADS
    if (status) {   /* the message is read under the lock */
        result = Py_BuildValue("(iy#)", status, err, (Py_ssize_t)strnlen(err, err_len));
    } else {
        result = outs;
        outs = NULL;
    }
done:
    if (locked) PyThread_release_lock(lock->lock);
    release_all(views, got);
    Py_XDECREF(outs);
    if (views != stack_views) PyMem_Free(views);
    if (contig != stack_contig) PyMem_Free(contig);
    if (result == Py_None) Py_RETURN_NONE;
    return result;
}

static PyMethodDef cp_methods[] = {
    {"run", (PyCFunction)(void (*)(void))cp_run, METH_FASTCALL,
     "run(prep, arrays): the outputs, (status, message), or None for the Python path"},
    {"lock", (PyCFunction)(void (*)(void))cp_lock, METH_FASTCALL, "lock(): a new lock"},
    {"acquire", (PyCFunction)(void (*)(void))cp_acquire, METH_FASTCALL,
     "acquire(lock): take the lock (waiting without the GIL)"},
    {"release", (PyCFunction)(void (*)(void))cp_release, METH_FASTCALL,
     "release(lock): give the lock back"},
    {NULL, NULL, 0, NULL}
};

static struct PyModuleDef cp_module = {
    PyModuleDef_HEAD_INIT, "_geon_callpath", "geon's native call path", -1, cp_methods,
    NULL, NULL, NULL, NULL
};

PyMODINIT_FUNC PyInit__geon_callpath(void) { return PyModule_Create(&cp_module); }
"""

_loaded: dict = {}
_lock = threading.Lock()


def include_dir() -> Optional[str]:
    """The folder of this Python's ``Python.h``, or None where it is not there."""
    inc = sysconfig.get_paths().get("include")
    if inc and os.path.isfile(os.path.join(inc, "Python.h")):
        return inc
    return None


def load() -> Any:
    """The call path module (built and kept in the kernel cache at first use, then
    loaded from it), or None where it cannot be (no compiler, no ``Python.h``, no
    usable kernel cache, a build or load that failed, or ``GEON_COMPILED=0``, which
    keeps geon from running a compiler): once per process, ``$CC`` and
    ``$GEON_COMPILED``."""
    from geon.transformers.numpy.compiled import mode
    if mode(None) is False:
        return None
    key = os.environ.get("CC", "")
    with _lock:
        if key not in _loaded:
            _loaded[key] = _build()
        return _loaded[key]


def _build() -> Any:
    from geon.transformers.numpy import toolchain
    from geon.transformers.numpy.kernel_cache import CompileError
    inc = include_dir()
    if inc is None:
        return None
    try:
        lib = toolchain.build(SOURCE, ("PyInit_" + NAME,), flags=("-I" + inc,))
    except (CompileError, OSError):
        return None
    # the library is loaded already (by ctypes, from the cache's checked bytes): the
    # loader knows it by that name, so importing the same path gives the same library
    try:
        loader = importlib.machinery.ExtensionFileLoader(NAME, lib._name)
        spec = importlib.util.spec_from_file_location(NAME, lib._name, loader=loader)
        if spec is None:
            return None
        module = importlib.util.module_from_spec(spec)
    except (ImportError, OSError):
        return None
    return module if callable(getattr(module, "run", None)) else None
