"""A softmax over the rows of a matrix in one C pass: the emitter's softmax chains.

Lowered, ``softmax(x)`` over the last axis is four steps over the scores: the rows'
maxima (``np.maximum.reduce``), a compiled group ``exp(x - max)``, the rows' sums (a
product with a row of ones) and a division. On an attention's scores, rows of 17 to
128, each is a call and a pass: on the zoo's small ViT (2 x 4 heads of 17 x 17) they
took 6.7 + 2.5 + 1.6 + 2.0 us against about 2 for the whole softmax in one pass.

:func:`find` recognizes the chain in a computation's schedule: ``ReduceMax`` over the
second dimension of a 2-d view ``(R, L)`` of a value ``x`` whose last dimension is
``L``; its broadcast back over ``x`` read only by a group of exactly ``Subtract(x, .)``
and ``Exp``; the exponentials read by a ``ReduceSum`` of the same rows (through a 2-d
view) and by a ``Divide`` by that sum's broadcast, and by nothing else; nothing else
running in between; everything of one float dtype. The chain is emitted as one call,
``_softmax_rows(x (R, L), out (R, L), _c_kernels)`` (out: the division's buffer; it may
be x itself), and its ops emit nothing. For each row the kernel takes the maximum
(NaN wins, as NumPy's maximum does), stores ``exp(x - max)`` and adds it up (with the
vector exp of the compiled groups), then divides the row by its sum. The sums are in
another order than the BLAS's: the values differ from the four steps' in the last
bits. Where the library does not build, the compiled path is off, or out overlaps x
other than exactly, NumPy computes the same steps.
"""

import ctypes

import numpy as np

from geon.op_graph import op_graph as og
from geon.op_graph import primitives as pr
from geon.op_graph.nn_ops import Select
from geon.transformers import fusion
from geon.transformers.numpy import compiled, toolchain
from geon.transformers.numpy.code_table import NUMPY_GLOBALS

#: Elements from which a call splits its rows over geon's threads.
PARALLEL_ELEMENTS = 1 << 17

_TEMPLATE = r"""
/* rows lo..hi of x (R, L) into y: exp(x - max) / sum, a NaN made 0 where zero_nan;
   y is x or does not overlap it */
static void softmax_rows_SUF(const REAL *x, REAL *y, int64_t L, int64_t lo,
                             int64_t hi, int zero_nan) {
    for (int64_t r = lo; r < hi; r++) {
        const REAL *const xr = x + r * L;
        REAL *const yr = y + r * L;
        REAL m = xr[0];
        for (int64_t j = 1; j < L; j++) m = MAX_SUF(m, xr[j]);
        REAL s = 0;
        #pragma omp simd reduction(+:s)
        for (int64_t j = 0; j < L; j++) {
            const REAL e = EXP_SUF(xr[j] - m);
            yr[j] = e;
            s += e;
        }
        if (zero_nan) {
            #pragma omp simd
            for (int64_t j = 0; j < L; j++) {
                const REAL v = yr[j] / s;
                yr[j] = v != v ? (REAL)0 : v;
            }
        } else {
            #pragma omp simd
            for (int64_t j = 0; j < L; j++) yr[j] = yr[j] / s;
        }
    }
}

/* arrays (x, y), C-contiguous, y writable: rows lo..hi (of L elements). 0: done;
   2: y overlaps x other than exactly (nothing written); -1: a Python error set */
int geon_softmax_rows_SUF(void *arrays, int64_t L, int64_t lo, int64_t hi,
                          int64_t zero_nan) {
    static const int flags[2] = {GEON_CONTIGUOUS, GEON_CONTIGUOUS | GEON_WRITABLE};
    geon_buffer v[2];
    if (!geon_acquire(v, arrays, flags, 2)) return -1;
    const char *const x = v[0].buf, *const y = v[1].buf;
    int status = 0;
    if (x != y && x < y + v[1].len && y < x + v[0].len) status = 2;
    else if (L > 0) {
        void *const state = PyEval_SaveThread();
        softmax_rows_SUF((const REAL *)x, (REAL *)y, L, lo, hi, (int)zero_nan);
        PyEval_RestoreThread(state);
    }
    geon_release(v, 2);
    return status;
}
"""

_TYPES = {np.dtype(np.float32): ("float", "f32", "geon_max_f", "expf"),
          np.dtype(np.float64): ("double", "f64", "geon_max_d", "exp")}


def source():
    """The C source of the kernels, for float32 and float64."""
    head = ("#include <math.h>\n#include <stdint.h>\n#include <stddef.h>\n"
            + toolchain.BUFFER_API + toolchain.MINMAX)
    if toolchain.toolchain().simd_math:   # the vector exp in `omp simd` loops
        head += "".join(f"#pragma omp declare simd notinbranch\n{t} {n}({t});\n"
                        for t, _, _, n in _TYPES.values())
    return head + "\n".join(
        _TEMPLATE.replace("MAX_SUF", mx).replace("EXP_SUF", exp).replace("REAL", real)
        .replace("_SUF", "_" + suffix) for real, suffix, mx, exp in _TYPES.values())


def _bind(lib):
    proto = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_int64,
                              ctypes.c_int64, ctypes.c_int64, ctypes.c_int64)
    return {dt: proto((f"geon_softmax_rows_{t[1]}", lib)) for dt, t in _TYPES.items()}


_loaded = {}  # (CC, cache folder) -> {dtype: function}, or None


def kernels():
    """``{dtype: function}``, or None where the compiled path is off or cannot run
    here."""
    return compiled.fixed_library(_loaded, "softmax kernels", source,
                                  [f"geon_softmax_rows_{t[1]}" for t in _TYPES.values()],
                                  _bind)


def softmax_rows(x, out, direct=True, zero_nan=False):
    """``out`` (R, L) = the softmax of each row of ``x`` (R, L) (``out`` may be ``x``),
    a NaN made 0 where ``zero_nan``: by the C kernel where ``direct`` and the arrays
    allow, else NumPy's steps."""
    fns = kernels() if direct else None
    fn = None if fns is None else fns.get(out.dtype)
    R, L = x.shape
    if fn is not None and x.dtype == out.dtype and x.flags.c_contiguous \
            and out.flags.c_contiguous:
        threads = fusion.MAX_THREADS if x.size >= PARALLEL_ELEMENTS else 1
        if threads < 2:
            status = fn((x, out), L, 0, R, zero_nan)
        else:
            results = []
            def part(a, b):
                results.append(fn((x, out), L, a, b, zero_nan))
            fusion.run_blocks(part, R, max(1, -(-R // threads)), [()] * threads)
            status = max(results)
        if status == 0:
            return
    if np.may_share_memory(x, out) and x is not out:
        x = x.copy()
    m = np.maximum.reduce(x, axis=1, keepdims=True)
    np.subtract(x, m, out=out)
    np.exp(out, out=out)
    np.divide(out, np.add.reduce(out, axis=1, keepdims=True), out=out)
    if zero_nan:
        np.copyto(out, 0, where=np.isnan(out))


NUMPY_GLOBALS["_softmax_rows"] = softmax_rows


class Softmax:
    """A chain found at ``head`` (the ``ReduceMax``): its ``ops``, the ``final``
    division, the ``views`` only its links read, ``x`` and its 2-d view ``rows``."""

    __slots__ = ("head", "ops", "final", "views", "x", "rows", "zero_nan")

    def __init__(self, ops, views, x, rows, zero_nan):
        self.head, self.ops, self.final, self.views = ops[0], ops, ops[-1], views
        self.x, self.rows, self.zero_nan = x, rows, zero_nan

    def emit(self, em):
        lines(em, self)


def _readers(em, op):
    """The ops that read ``op`` directly (as many as the emitter counted)."""
    n, out = em._readers.get(op, 0), []
    for x in em.order[em._step[op] + 1:]:
        if len(out) == n:
            break
        if any(a is op for a in x.args):
            out.append(x)
    return out


def _broadcast(em, r, x, views):
    """The view of row value ``r`` (R,) broadcast over ``x``'s last dimension, where
    ``r`` reaches it through reshapes and size-keeping expands each read once (added to
    ``views``, with it); else None."""
    op = r
    while True:
        if op in em.comp.results or em._readers.get(op, 0) != 1:
            return None
        (nxt,) = _readers(em, op)
        if isinstance(nxt, pr.Expand) and nxt.axes.lengths == x.axes.lengths:
            n = len(x.axes)
            if nxt.args[0].axes.lengths != x.axes.lengths[:-1] \
                    or tuple(nxt.dim_map) != tuple(range(n - 1)) + (None,):
                return None
            views.append(nxt)
            return nxt
        if not isinstance(nxt, (pr.Reshape, pr.Expand)) or nxt.axes.size != r.axes.size:
            return None   # (an expand of the same size adds dimensions of length 1 only)
        views.append(nxt)
        op = nxt


def _once(em, op):
    """Whether ``op`` is read by one op and is no result."""
    return em._readers.get(op) == 1 and op not in em.comp.results


def find(em, mx):
    """The :class:`Softmax` whose maximum is ``mx`` in emitter ``em``'s schedule, or
    None (always without the compiled path)."""
    if em.kernels is None or type(mx) is not pr.ReduceMax or mx.axis != 1 \
            or mx.dtype not in _TYPES:
        return None
    rows = mx.args[0]
    x = rows.args[0] if isinstance(rows, pr.Reshape) else None
    if x is None or isinstance(x, (pr.ViewOp, og.AssignableTensorOp)) \
            or len(rows.axes) != 2 or x.dtype != mx.dtype \
            or not all(isinstance(n, int) for n in x.axes.lengths) \
            or x.axes.lengths[-1] != rows.axes.lengths[1] or em._readers.get(rows) != 1:
        return None
    views = [rows]
    b1 = _broadcast(em, mx, x, views)
    sub = _readers(em, b1)[0] if b1 is not None and _once(em, b1) else None
    if type(sub) is not og.Subtract or sub.args[0] is not x or sub.args[1] is not b1:
        return None
    g = em.first.get(sub)
    if g is None or len(g.members) != 2 or type(g.members[1]) is not og.Exp \
            or g.members[1].args[0] is not sub or sub not in g.internal:
        return None
    e = g.members[1]
    if e in em.comp.results or em._readers.get(e) != 2:
        return None
    first, div = _readers(em, e)
    if not (isinstance(first, pr.Reshape) and first.axes.lengths == rows.axes.lengths
            and em._readers.get(first) == 1 and first not in em.comp.results):
        return None
    (sm,) = _readers(em, first)
    if type(sm) is not pr.ReduceSum or sm.axis != 1 or sm.dtype != mx.dtype:
        return None
    views.append(first)
    b2 = _broadcast(em, sm, x, views)
    if b2 is None or not _once(em, b2) or type(div) is not og.Divide or div.args[0] is not e \
            or div.args[1] is not b2 or div.dtype != mx.dtype:
        return None
    ops = [mx, sub, e, sm, div] + _zero_nan(em, div)
    if ops[-1] in em._into or ops[-1] in em.in_group and len(ops) == 5:
        return None
    if any(em.emits(op) and not isinstance(op, pr.ViewOp) and op not in ops
           for op in em.order[em._step[mx] + 1:em._step[div]]) or kernels() is None:
        return None   # (other code runs in between; the library last: a build)
    return Softmax(ops, views, x, rows, len(ops) > 5)


def _zero_nan(em, div):
    """``[n, s]`` where ``div`` heads a group of exactly ``n = NotEqual(div, div)``
    (NumPy's isnan) and ``s = Select(n, 0, div)``: the ``Where(IsNaN(p), 0, p)`` that
    PyTorch's exporter writes after an attention's softmax; else []."""
    g = em.first.get(div)
    if g is None or len(g.members) != 3:
        return []
    _, n, s = g.members
    zero = s.args[1] if type(s) is Select else None
    if type(n) is not og.NotEqual or n.args[0] is not div or n.args[1] is not div \
            or s.args[0] is not n or s.args[2] is not div or zero not in em.scalars \
            or float(em.consts[em.scalars[zero]]) != 0 or s.dtype != div.dtype \
            or not {div, n} <= g.internal:
        return []
    return [n, s]


def lines(em, s):
    """Emit softmax chain ``s`` into ``em``'s body (naming the division's buffer)."""
    em._view_ahead(s.rows)
    out = em.names[s.final] = em.buffer(s.final, em.body)
    R, L = s.rows.axes.lengths
    line = (f"_softmax_rows({em.names[s.rows]}, {out}.reshape(({R}, {L})), "
            f"_c_kernels{', True' if s.zero_nan else ''})")
    em.body.append(em.comp._annotate(line, s.final))
    em.body.append(f"    # {', '.join(type(m).__name__ for m in s.ops)}: one softmax pass")
