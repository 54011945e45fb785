"""Runs of a computation's lines called from C.

A generated ``run()`` is a list of calls; in a small-image CNN most are calls of C
kernels (a convolution, a compiled group) that take a few microseconds each. The Python
between them costs about as much as some of them: each convolution line looks up its
call site, checks its arrays and builds the kernel's argument tuple, and every call
goes through :mod:`ctypes`. MobileNet-v2 at batch 2 (one thread, 77 calls a forward)
took 0.11 ms of Python a forward with every kernel made a no-op, of 1.72 ms; called
from segments, as below, the forward takes 1.60-1.63 ms.

So the emitter (:func:`split`) finds the runs of lines that read only the module's own
arrays (arenas, variables, constants and their views, made once by ``setup()``), not the
feeds nor anything ``run()`` binds, and turns each run of at least :data:`MIN_STEPS`
lines that can be C calls into a :class:`Segment`. The first call of a segment (and
the first after geon's thread count changed) asks each line for its *step*: the C entry
it would call and that entry's argument tuple, made once for these arrays (a line's
``maker``: :func:`c_step` for a compiled group, ``conv.conv_step`` for a convolution),
or None: then the line itself is the step, a Python callable. Every later call hands
the list to :data:`SOURCE`'s ``geon_steps``, one C loop that calls each entry by its
address and each Python step through ``PyObject_Call``.

An entry that returns nonzero (a kernel that refuses its arrays: they overlap, or it
found no memory) has written nothing; the loop stops there and the line runs again as
Python, which takes the slow way or raises the error, and the loop goes on after it.
Without a C compiler (or with ``GEON_COMPILED=0``) a segment calls its lines one after
another.
"""

import ast
import collections
import ctypes
import functools
import math
import sys

import numpy as np

from geon.op_graph import special
from geon.transformers import fusion
from geon.transformers.numpy import compiled, small_gemm, toolchain
from geon.transformers.numpy.code_table import NUMPY_GLOBALS

#: A run of lines becomes a segment where at least this many of them can be C entries
#: (a run of NumPy calls alone gains nothing).
MIN_STEPS = 2

#: The helpers of generated lines that have a maker taking the same arguments: the
#: convolutions' (conv.py), the row passes' (rows.py) and the gathers' (below).
STEP_FUNCTIONS = {"_conv_forward": "_conv_step", "_softmax_rows": "_softmax_step",
                  "_layer_norm_stats": "_layer_norm_step", "_take": "_take_step"}

#: Whether the emitter makes segments (False: every line in run(), as Python).
ENABLED = True

_STEPS = r"""
extern void *PyObject_Call(void *callable, void *args, void *kwargs);
extern void Py_DecRef(void *obj);
typedef int (*geon_entry)(void *);

/* t = (address of the int64 table of entries, count, items, first step). Step k is
   entry table[k] called with items[k] (one tuple), or, where table[k] is 0, the
   callable items[k][0] called with the tuple items[k][1]. Returns 0 once every step
   ran; k + 1 where entry k returned nonzero without a Python error (nothing after it
   ran); -1 with a Python error set (ctypes raises it). */
int geon_steps(void *t) {
    void *const o_table = PyTuple_GetItem(t, 0), *const o_n = PyTuple_GetItem(t, 1);
    void *const items = PyTuple_GetItem(t, 2), *const o_first = PyTuple_GetItem(t, 3);
    if (!o_table || !o_n || !items || !o_first) return -1;
    const int64_t *const table = (const int64_t *)(intptr_t)PyLong_AsLongLong(o_table);
    const long long n = PyLong_AsLongLong(o_n), first = PyLong_AsLongLong(o_first);
    if (PyErr_Occurred()) return -1;
    for (long long k = first; k < n; k++) {
        void *const item = PyTuple_GetItem(items, k);
        if (!item) return -1;
        if (table[k]) {
            const int status = ((geon_entry)(intptr_t)table[k])(item);
            if (PyErr_Occurred()) return -1;
            if (status) return (int)(k + 1);
        } else {
            void *const f = PyTuple_GetItem(item, 0), *const a = PyTuple_GetItem(item, 1);
            void *const r = f && a ? PyObject_Call(f, a, NULL) : NULL;
            if (!r) return -1;
            Py_DecRef(r);
        }
    }
    return 0;
}
"""

_WALK = r"""
/* What the copy and the binary entries share: k arrays v[0..k) (v[0] the result) of one
   shape, walked by runs of their innermost dimension. */

/* 1 where the k arrays have one shape of n = v[0].ndim <= 8 dimensions and item size
   `size`: span[a] = the bytes array a covers from its buffer (lo, hi), *empty where the
   shape has no element; else 0. */
static int geon_one_shape(const geon_buffer *v, int k, ptrdiff_t size, ptrdiff_t span[][2],
                          int *empty) {
    const int n = v[0].ndim;
    *empty = 0;
    if (n > 8) return 0;
    for (int a = 0; a < k; a++) {
        if (v[a].ndim != n || v[a].itemsize != size) return 0;
        span[a][0] = 0;
        span[a][1] = size;
    }
    for (int d = 0; d < n; d++) {
        *empty |= v[0].shape[d] == 0;
        for (int a = 0; a < k; a++) {
            if (v[a].shape[d] != v[0].shape[d]) return 0;
            const ptrdiff_t step = v[a].strides[d] * (v[a].shape[d] - 1);
            span[a][step < 0 ? 0 : 1] += step;
        }
    }
    return 1;
}

/* Whether the result v[0] overlaps array a without being it (the same memory through
   the same strides). */
static int geon_overlaps(const geon_buffer *v, int a, ptrdiff_t span[][2]) {
    const char *const o = v[0].buf, *const p = v[a].buf;
    int same = o == p;
    for (int d = 0; same && d < v[0].ndim; d++) same = v[0].strides[d] == v[a].strides[d];
    return !same && o + span[0][0] < p + span[a][1] && p + span[a][0] < o + span[0][1];
}

/* The dimensions, innermost first, merged where all k arrays allow: their lengths
   shape[0..m) and each array's strides st[a][0..m); returns m (at least 1). */
static int geon_merged(const geon_buffer *v, int k, ptrdiff_t size, ptrdiff_t *shape,
                       ptrdiff_t st[][8]) {
    int m = 0;
    for (int d = v[0].ndim - 1; d >= 0; d--) {
        const ptrdiff_t len = v[0].shape[d];
        if (len == 1) continue;
        int merge = m > 0;
        for (int a = 0; merge && a < k; a++)
            merge = st[a][m - 1] * shape[m - 1] == v[a].strides[d];
        if (merge) {
            shape[m - 1] *= len;
            continue;
        }
        shape[m] = len;
        for (int a = 0; a < k; a++) st[a][m] = v[a].strides[d];
        m++;
    }
    if (!m) {
        shape[0] = 1;
        for (int a = 0; a < k; a++) st[a][0] = size;
        m = 1;
    }
    return m;
}

/* The next run: index (over dimensions 1..m) advanced and each array's run start p[a]
   moved with it; 0 after the last. */
static inline int geon_next_run(ptrdiff_t *index, const ptrdiff_t *shape, int m, int k,
                                ptrdiff_t st[][8], char **p) {
    for (int d = 1; d < m; d++) {
        for (int a = 0; a < k; a++) p[a] += st[a][d];
        if (++index[d] < shape[d]) return 1;
        for (int a = 0; a < k; a++) p[a] -= shape[d] * st[a][d];
        index[d] = 0;
    }
    return 0;
}
"""

_COPY = r"""
/* args ((dst, src),): dst = src, of the same shape and item size, any strides (as
   np.copyto gives it). 0: done; 2: refused (nothing written): the shapes or item sizes
   differ, more than 8 dimensions, or the two overlap; -1: a Python error set. */
int geon_copy(void *args) {
    static const int flags[2] = {GEON_STRIDED | GEON_WRITABLE, GEON_STRIDED};
    geon_buffer v[2];
    void *const arrays = PyTuple_GetItem(args, 0);
    if (!arrays || !geon_acquire(v, arrays, flags, 2)) return -1;
    const ptrdiff_t size = v[0].itemsize;
    ptrdiff_t span[2][2], shape[8], st[2][8], index[8] = {0};
    int empty, status = 0;
    if (!geon_one_shape(v, 2, size, span, &empty) || geon_overlaps(v, 1, span)) status = 2;
    else if (!empty) {
        const int m = geon_merged(v, 2, size, shape, st);
        char *p[2] = {v[0].buf, v[1].buf};
        const ptrdiff_t sd = st[0][0], ss = st[1][0], len = shape[0];
        do {
            if (sd == size && ss == size) __builtin_memcpy(p[0], p[1], len * size);
            else if (size == 4)
                for (ptrdiff_t i = 0; i < len; i++)
                    __builtin_memcpy(p[0] + i * sd, p[1] + i * ss, 4);
            else if (size == 8)
                for (ptrdiff_t i = 0; i < len; i++)
                    __builtin_memcpy(p[0] + i * sd, p[1] + i * ss, 8);
            else
                for (ptrdiff_t i = 0; i < len; i++)
                    __builtin_memcpy(p[0] + i * sd, p[1] + i * ss, size);
        } while (geon_next_run(index, shape, m, 2, st, p));
    }
    geon_release(v, 2);
    return status;
}
"""

_BINARY = r"""
/* one run of len elements of out = a OP b, strides in bytes: unit strides and a
   broadcast operand (its one value loaded once: out never overlaps it) spelled out, so
   the compiler makes vector loops of them (ivdep: out is an input itself or overlaps
   none, so no element depends on another's result) */
#define GEON_BINARY_RUN(T, OP) { \
    T *const o = (T *)r; \
    const T *const p = (const T *)x, *const q = (const T *)y; \
    const ptrdiff_t z = sizeof(T); \
    if (so == z && sa == z && sb == z) \
        _Pragma("GCC ivdep") for (ptrdiff_t i = 0; i < len; i++) o[i] = p[i] OP q[i]; \
    else if (so == z && sa == z && sb == 0) { \
        const T c = *q; \
        _Pragma("GCC ivdep") for (ptrdiff_t i = 0; i < len; i++) o[i] = p[i] OP c; \
    } else if (so == z && sa == 0 && sb == z) { \
        const T c = *p; \
        _Pragma("GCC ivdep") for (ptrdiff_t i = 0; i < len; i++) o[i] = c OP q[i]; \
    } else \
        for (ptrdiff_t i = 0; i < len; i++) \
            *(T *)(r + i * so) = *(const T *)(x + i * sa) OP *(const T *)(y + i * sb); \
}
#define GEON_BINARY_OPS(T) switch (op) { \
    case 0: GEON_BINARY_RUN(T, +) break; case 1: GEON_BINARY_RUN(T, -) break; \
    case 2: GEON_BINARY_RUN(T, *) break; default: GEON_BINARY_RUN(T, /) break; }
static void geon_binary_run(char *r, const char *x, const char *y, ptrdiff_t len,
                            ptrdiff_t so, ptrdiff_t sa, ptrdiff_t sb, ptrdiff_t size,
                            int op) {
    if (size == 4) GEON_BINARY_OPS(float)
    else GEON_BINARY_OPS(double)
}

/* args ((out, a, b), op, itemsize): out = a op b elementwise (op 0 +, 1 -, 2 *, 3 /),
   all float32 (itemsize 4) or all float64 (8), of one shape, any strides (a broadcast
   operand has strides 0); out may be a or b itself (the same memory and strides), else
   none may overlap it. 0: done; 2: refused (nothing written); -1: a Python error. */
int geon_binary(void *args) {
    static const int flags[3] = {GEON_STRIDED | GEON_WRITABLE, GEON_STRIDED,
                                 GEON_STRIDED};
    long long iv[2];
    geon_buffer v[3];
    if (!geon_args(args, "ii", iv, NULL)) return -1;
    void *const arrays = PyTuple_GetItem(args, 0);
    if (!arrays || !geon_acquire(v, arrays, flags, 3)) return -1;
    const int op = (int)iv[0];
    const ptrdiff_t size = iv[1];
    ptrdiff_t span[3][2], shape[8], st[3][8], index[8] = {0};
    int empty, status = 0;
    if ((size != 4 && size != 8) || !geon_one_shape(v, 3, size, span, &empty)
            || geon_overlaps(v, 1, span) || geon_overlaps(v, 2, span)) status = 2;
    else if (!empty) {
        const int m = geon_merged(v, 3, size, shape, st);
        char *p[3] = {v[0].buf, v[1].buf, v[2].buf};
        do geon_binary_run(p[0], p[1], p[2], shape[0], st[0][0], st[1][0], st[2][0], size,
                           op);
        while (geon_next_run(index, shape, m, 3, st, p));
    }
    geon_release(v, 3);
    return status;
}
"""

_TAKE = r"""
/* args ((x, idx, out), O, N, row): out[o, j] = x[o, idx[j]] (numpy.take along axis 1),
   x (O, N) and out (O, J) C-contiguous rows of row bytes, idx C-contiguous int64; an
   index below 0 counts from the end. 0: done; 2: refused (nothing written): an index
   out of range, sizes that do not match, out overlapping x or idx; -1: a Python error
   set. */
int geon_take(void *args) {
    static const int flags[3] = {GEON_CONTIGUOUS, GEON_CONTIGUOUS,
                                 GEON_CONTIGUOUS | GEON_WRITABLE};
    long long iv[3];
    geon_buffer v[3];
    if (!geon_args(args, "iii", iv, NULL)) return -1;
    if (!geon_acquire(v, PyTuple_GetItem(args, 0), flags, 3)) return -1;
    const int64_t O = iv[0], N = iv[1], row = iv[2], J = v[1].len / 8;
    const int64_t *const idx = v[1].buf;
    const char *const x = v[0].buf;
    char *const out = v[2].buf;
    int status = 2;
    if (v[1].len % 8 || v[0].len != O * N * row || v[2].len != O * J * row
            || (v[2].len && ((out < x + v[0].len && x < out + v[2].len)
                             || (out < (const char *)idx + v[1].len
                                 && (const char *)idx < out + v[2].len))))
        goto done;
    for (int64_t j = 0; j < J; j++)
        if (idx[j] < -N || idx[j] >= N) goto done;
    for (int64_t o = 0; o < O; o++)
        for (int64_t j = 0; j < J; j++) {
            const int64_t i = idx[j] < 0 ? idx[j] + N : idx[j];
            __builtin_memcpy(out + (o * J + j) * row, x + (o * N + i) * row, row);
        }
    status = 0;
done:
    geon_release(v, 3);
    return status;
}
"""

SOURCE = ("#include <stddef.h>\n#include <stdint.h>\n" + toolchain.BUFFER_API + _STEPS + _WALK
          + _COPY + _BINARY + _TAKE)

_loaded = {}  # (CC, cache folder) -> the runner, or None


def _library():
    """``{"steps": the runner, "copy": ..., "binary": ..., "take": ...}`` (ctypes
    functions), or None where the compiled path is off or cannot run here."""
    return compiled.fixed_library(_loaded, "runner of compiled steps", _source, _SYMBOLS,
                                  _bind)


_NAMES = ("steps", "copy", "binary", "take")
_SYMBOLS = [f"geon_{n}" for n in _NAMES]


def _source():
    return SOURCE


def _bind(lib):
    proto = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object)
    return {n: proto((f"geon_{n}", lib)) for n in _NAMES}


def kernels():
    """:func:`_library` (the name a computation's workspace looks up and keeps:
    ``conv.Workspace.kernels``)."""
    return _library()


def runner():
    """The ctypes function ``geon_steps``, or None (see :func:`_library`)."""
    lib = _library()
    return None if lib is None else lib["steps"]


def address(fn):
    """The address of the C function behind the ctypes function ``fn``."""
    return ctypes.cast(fn, ctypes.c_void_p).value


def c_step(fn, args):
    """The steps of a line ``fn(args)`` calling a C entry (a compiled group)."""
    return [(fn, args, None)]


def np_step(fn, args, out=None):
    """The steps of a line calling the NumPy function ``fn`` with ``args`` (and ``out``
    by keyword). A copy between arrays of one shape and dtype (``np.copyto(dst, src)``)
    is :data:`_COPY`'s entry: NumPy's call took 1.5 us on an attention's heads (a few
    K elements), the entry a fifth of that. An add, subtract, multiply or divide of
    float32 or float64 arrays of one dtype into an array of the shape they broadcast to
    is :data:`_BINARY`'s entry: NumPy took 6 us to add a bias row to a (64, 384)
    float32 product in place. Its values are NumPy's bit for bit, except which of two
    NaN operands a sum or product passes on (the compiler may swap the operands of + and
    *); like the compiled groups, it gives no floating-point warnings (NumPy's
    ``errstate`` does not apply: the numerics debug mode, which has no segments, finds
    NaN and infinities). A product of 2-D float arrays of a transformer layer's size
    (``np.matmul(a, b, out=c)``) is :mod:`.small_gemm`'s entry."""
    if fn is np.matmul and out is not None and len(args) == 2:
        steps = small_gemm.step(args[0], args[1], out)
        if steps is not None:
            return steps
    lib = _library()
    if lib is not None and fn is np.copyto and out is None and len(args) == 2:
        dst, src = args
        if isinstance(src, np.ndarray) and isinstance(dst, np.ndarray) \
                and src.shape == dst.shape and src.dtype == dst.dtype \
                and dst.dtype.kind in "biufc":
            return [(lib["copy"], ((dst, src),), None)]
    if lib is not None and fn in _BINARY_OPS and len(args) + (out is not None) == 3:
        arrays = args + ((out,) if out is not None else ())
        r, a, b = arrays[2], arrays[0], arrays[1]
        if all(isinstance(x, np.ndarray) and x.dtype == r.dtype for x in arrays) \
                and r.dtype in _FLOATS and np.broadcast_shapes(a.shape, b.shape) == r.shape:
            a, b = np.broadcast_to(a, r.shape), np.broadcast_to(b, r.shape)
            return [(lib["binary"], ((r, a, b), _BINARY_OPS[fn], r.itemsize), None)]
    return [(fn if out is None else functools.partial(fn, out=out), args, None)]


#: The NumPy functions :data:`_BINARY`'s entry computes (its op codes), and its dtypes.
_BINARY_OPS = {np.add: 0, np.subtract: 1, np.multiply: 2, np.divide: 3}
_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def _take_call(x, idx, ws, out):
    """``(entry, args)`` of :data:`_TAKE`'s entry for ``special.take(x, idx, what,
    out)``, or None where the arrays do not suit it or the computation's workspace
    ``ws`` (None: none) has no C (``compiled=False``)."""
    lib = None if out is None else _library() if ws is None else ws.kernels(_SELF)
    if lib is None or not (isinstance(x, np.ndarray) and isinstance(idx, np.ndarray)
                           and isinstance(out, np.ndarray)) \
            or idx.dtype != np.int64 or idx.ndim != 1 or x.ndim < 2 \
            or x.dtype != out.dtype or x.dtype.kind not in "biufc" \
            or out.shape != x.shape[:1] + idx.shape + x.shape[2:] \
            or not (x.flags.c_contiguous and idx.flags.c_contiguous
                    and out.flags.c_contiguous and out.flags.writeable):
        return None
    row = x.itemsize * math.prod(x.shape[2:])
    return lib["take"], ((x, idx, out), x.shape[0], x.shape[1], row)


def take(x, idx, what, ws=None, out=None):
    """``special.take`` (``x[:, idx]``, the indices checked), by :data:`_TAKE`'s entry
    where the arrays suit it and the computation's workspace ``ws`` allows C (NumPy's
    call took 7-14 us on an embedding's 64 rows of 128, checks included); an index out
    of range gets ``special.take``'s error."""
    call = _take_call(x, idx, ws, out)
    if call is None or call[0](call[1]):
        return special.take(x, idx, what, out)
    return out


def take_step(x, idx, what, ws=None, out=None):
    """The steps of a line calling :func:`take` (see above), or None."""
    call = _take_call(x, idx, ws, out)
    return None if call is None else [(call[0], call[1], None)]


def is_entry(fn):
    """Whether ``fn`` is a C entry (a ctypes function taking one tuple)."""
    return isinstance(fn, ctypes._CFuncPtr)


class Segment:
    """A run of lines of a generated ``run()`` (see the module's text): ``lines``, each
    a callable of no arguments running one line, and ``makers``, for each line None or
    a callable of no arguments giving its steps or None (computing nothing: the
    steps are made for every line before the first runs). A step is ``(fn, args,
    keep)``: a C entry (:func:`is_entry`) and its one tuple, or a Python callable and
    the tuple of its arguments; ``keep``: what must live while the step may run. A
    line of several steps must be one that can run again from its start (its results
    do not overlap what it reads), as it does where one of its entries refuses.

    A module's segments are made with it; ``setup()`` makes its arrays once per
    module (a computation's ``_allocate`` runs a new module)."""

    __slots__ = ("lines", "makers", "threads", "call", "owner", "keep")

    def __init__(self, lines, makers):
        self.lines, self.makers = lines, makers
        self.threads = self.call = None

    def __call__(self):
        if self.threads != fusion.MAX_THREADS:
            self._build()
        call = self.call
        if call is None:
            for line in self.lines:
                line()
            return
        run, n, table, items = call
        k = run((table, n, items, 0))
        while k:   # an entry refused its arrays: its lines the Python way, then on
            (first, last), after = self.owner[k - 1]
            for line in self.lines[first:last + 1]:
                line()
            k = run((table, n, items, after)) if after < n else 0

    def _build(self):
        run, threads = runner(), fusion.MAX_THREADS
        if run is None:
            self.call, self.threads = None, threads
            return
        entries, items, lines, keep = [], [], [], []
        made = [None if make is None else make() for make in self.makers]
        for first, last, steps in _joined([s or [(line, (), None)] for line, s in
                                           zip(self.lines, made)]):
            for fn, args, held in steps:
                entry = is_entry(fn)
                entries.append(address(fn) if entry else 0)
                items.append(args if entry else (fn, args))
                lines.append((first, last))
                keep.append(held)
        n = len(items)
        # for each step: its lines, and the first step of the next lines
        owner, after = [None] * n, n
        for j in range(n - 1, -1, -1):
            if j + 1 < n and lines[j + 1] != lines[j]:
                after = j + 1
            owner[j] = (lines[j], after)
        self.owner = owner
        table = np.array(entries, np.int64)
        keep.append(table)
        self.keep = keep
        self.call = (run, n, table.ctypes.data, tuple(items))
        self.threads = threads   # (last: a maker that raised leaves it to make again)


def _joined(steps):
    """``(first line, last line, steps)`` for each line's ``steps`` (a list per line),
    with a product followed by the in-place addition of a bias to each of its rows
    (``np.matmul(a, b, out=c)``, then ``np.add(c, bias, c)``, the bias broadcast
    along c's rows: a linear layer) joined into one step of :mod:`.small_gemm`'s
    entry that adds the bias as it stores (the same values: the bias is added to the
    finished sums). Where that step refuses its arrays, both lines run as Python."""
    out, k = [], 0
    while k < len(steps):
        if k + 1 < len(steps) and len(steps[k]) == len(steps[k + 1]) == 1:
            joined = _with_bias(steps[k][0], steps[k + 1][0])
            if joined is not None:
                out.append((k, k + 1, [joined]))
                k += 2
                continue
        out.append((k, k, steps[k]))
        k += 1
    return out


def _with_bias(product, add):
    """The step of ``product`` (small_gemm's) and then ``add`` (the binary entry's
    ``c = c + bias``, bias broadcast along c's rows) as one, or None."""
    gemm, binary = product[0], add[0]
    if not (is_entry(gemm) and is_entry(binary) and small_gemm.is_entry(gemm)) \
            or binary is not (_library() or {}).get("binary") or add[1][1] != 0:
        return None
    (a, b, c), = product[1]
    r, x, bias = add[1][0]
    if not (_same(r, c) and _same(x, c)) or bias.strides[-1] != bias.itemsize \
            or any(bias.strides[:-1]):
        return None
    row = bias[(0,) * (bias.ndim - 1)]
    if np.may_share_memory(row, c):
        return None
    return gemm, ((a, b, c, row),), product[2]


def _same(x, y):
    """Whether arrays ``x`` and ``y`` are views of the same elements."""
    return x is y or (x.__array_interface__["data"][0] == y.__array_interface__["data"][0]
                      and x.shape == y.shape and x.strides == y.strides
                      and x.dtype == y.dtype)


_SELF = sys.modules[__name__]
NUMPY_GLOBALS.update(_Segment=Segment, _c_step=c_step, _np_step=np_step,
                     _take_step=take_step)   # (_take: primitives.py)


# --- finding the segments in the generated lines ---------------------------------------

def split(body, params, kernels, wanted=True, prefix="_seg"):
    """``(body, definitions)``: the lines of a ``run()`` (each indented by 4; ``params``
    its parameters) with the runs of lines that read only module-level names replaced
    by a call of a segment, and the module-level lines defining the segments (none
    unless ``wanted`` and :data:`ENABLED`). ``kernels``: the computation's compiled
    groups (:class:`.c_codegen.Kernels`), or None."""
    if not (wanted and ENABLED):
        return body, []
    makers = {f: (lambda head, args, s=s: s + args) for f, s in STEP_FUNCTIONS.items()}
    for name, _ in (kernels.names if kernels else ()):
        makers[name] = lambda head, args: f"_c_step({head}, {args[1:-1]})"
    try:
        tree = ast.parse("def run(" + ", ".join(params) + "):\n" + "\n".join(body)
                         + "\n    pass")
    except SyntaxError:   # (text that bypassed codegen_text: check_lines reports it)
        return body, []
    fn = tree.body[0]
    local = set(params)
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            local.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node is not fn:
            local.add(node.name)
        elif isinstance(node, ast.Global):
            local.update(node.names)
    steps = {}   # index of a body line -> (its call's text, its maker's text or None)
    per_line = collections.Counter(stmt.lineno for stmt in fn.body)
    for stmt in fn.body:
        k = stmt.lineno - 2
        if stmt.end_lineno != stmt.lineno or per_line[stmt.lineno] > 1 \
                or not _reads_only_globals(stmt, local):
            continue
        call, line = stmt.value, body[k]
        head = line[call.func.col_offset:call.func.end_col_offset]
        text = line[call.col_offset:call.end_col_offset]
        make = makers.get(head)
        maker = make(head, text[len(head):]) if make is not None \
            else _numpy_maker(call, head, text[len(head):])
        steps[k] = (text, maker, line[call.end_col_offset:].strip())
    out, defs, run = [], [], []   # run: the body's indices of the current run's calls

    def close(end):
        if run and sum(_may_be_entry(steps[k][1]) for k in run) >= MIN_STEPS:
            name = f"{prefix}{len(defs)}"
            out.append(f"    {name}()   # {len(run)} lines as one run (see {name} below)")
            defs.append(_definition(name, [steps.get(k, body[k]) for k in range(
                run[0], run[-1] + 1)]))
            out.extend(body[run[-1] + 1:end])
        elif run:
            out.extend(body[run[0]:end])
        run.clear()

    for k, line in enumerate(body):
        if k in steps:
            run.append(k)
        elif _code(line):
            close(k)
            out.append(line)
        elif not run:
            out.append(line)
    close(len(body))
    return out, [ln for d in defs for ln in d]


def _numpy_maker(call, head, args):
    """The maker's text of a call of a NumPy function (``np.add(a, b, out)``,
    ``np.matmul(a, b, out=c)``) whose arguments are names, constants, attributes,
    slices and tuples of them (the same objects, or views of the same memory, at every
    call); else None."""
    if not head.startswith("np.") or any(k.arg != "out" for k in call.keywords) \
            or not all(_simple(a) for a in call.args + [k.value for k in call.keywords]):
        return None
    out = next((k.value for k in call.keywords), None)
    tail = "" if out is None else f", out={ast.unparse(out)}"
    return f"_np_step({head}, ({''.join(ast.unparse(a) + ', ' for a in call.args)}){tail})"


#: The NumPy functions whose lines :func:`np_step` may give a C entry.
_NUMPY_ENTRIES = ("np.copyto", "np.add", "np.subtract", "np.multiply", "np.divide",
                  "np.matmul")


def _may_be_entry(maker):
    """Whether a line with this maker's text (None: no maker) may be a C entry."""
    return maker is not None and (not maker.startswith("_np_step(") or maker[
        len("_np_step("):].startswith(tuple(f + ", " for f in _NUMPY_ENTRIES)))


def _simple(node):
    """Whether the expression ``node`` names a fixed object or a view (see above): a
    subscript only by slices (an index can give a copy: a scalar, a gathered array)."""
    if isinstance(node, (ast.Name, ast.Constant)):
        return True
    if isinstance(node, ast.Attribute):
        return _simple(node.value)
    if isinstance(node, ast.Subscript):
        parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        return _simple(node.value) and all(
            isinstance(p, ast.Slice) and _simple(p) or isinstance(p, ast.Constant)
            and p.value in (None, Ellipsis) for p in parts)
    if isinstance(node, ast.Slice):
        return all(p is None or _constant(p) for p in (node.lower, node.upper, node.step))
    if isinstance(node, ast.Tuple):
        return all(_simple(e) for e in node.elts)
    return _constant(node)


def _constant(node):
    """Whether ``node`` is a number written as a constant (or its negation)."""
    return isinstance(node, ast.Constant) or isinstance(node, ast.UnaryOp) \
        and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant)


def _code(line):
    """Whether ``line`` holds code (not only a comment or blank)."""
    s = line.strip()
    return bool(s) and not s.startswith("#")


def _reads_only_globals(stmt, local):
    """Whether ``stmt`` is one call that binds nothing and reads no name of ``local``
    (the lambdas' own parameters aside)."""
    if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)):
        return False
    own = set()
    for node in ast.walk(stmt):
        if isinstance(node, (ast.NamedExpr, ast.Yield, ast.YieldFrom, ast.Await,
                             ast.comprehension)):
            return False
        if isinstance(node, ast.Lambda):
            own.update(a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg))
    return not any(isinstance(node, ast.Name) and node.id in local and node.id not in own
                   for node in ast.walk(stmt))


def _definition(name, lines):
    """The module-level lines defining segment ``name`` of ``lines``: for each line of
    the run, its step ``(call's text, maker's text or None, the line's comment)``, or
    the line itself (a comment)."""
    calls, makers = [], []
    for ln in lines:
        if isinstance(ln, str):
            calls.append("    " + ln.strip())
            continue
        text, maker, rest = ln
        calls.append(f"    lambda: {text},{'  ' + rest if rest else ''}")
        makers.append("    None," if maker is None else f"    lambda: {maker},")
    return [f"# {name}: run() calls these lines as one run (geon's segments.py)",
            f"{name} = _Segment(("] + calls + ["), ("] + makers + ["))"]
