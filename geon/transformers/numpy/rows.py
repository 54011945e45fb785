"""One C pass over the rows of a matrix where lowering left several: the emitter's
softmax chains (:func:`find_softmax`) and layer norms' statistics
(:func:`find_layer_norm`).

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

A layer norm as the ONNX importer writes LayerNormalization is, lowered, eight steps
before its normalizing group: a row sum (a product with ones) and a division for the
mean, a group ``d = x - mean`` and ``d * d``, a row sum and a division for the
variance, ``+ eps``, ``sqrt`` and ``1 / .``. Where those values are read by nothing
but the chain and the group after it (which reads ``d`` and ``inv``), one call
``_layer_norm_stats(x (R, L), d (R, L), inv (R,), eps, ...)`` computes ``d`` and ``inv``
a row at a time (sums in another order than the BLAS's: the last bits differ), and the
normalizing group runs as before. The zoo's small ViT has five: 9 calls became 2 each.
"""

import ctypes
import sys

import numpy as np

from geon.op_graph import op_graph as og
from geon.op_graph import primitives as pr
from geon.op_graph.nn_ops import Select
from geon.transformers import fusion
from geon.transformers.codegen_text import identifier, py_literal
from geon.transformers.numpy import compiled, toolchain
from geon.transformers.numpy.code_table import NUMPY_GLOBALS

#: Elements from which a call splits its rows over geon's threads.
PARALLEL_ELEMENTS = 1 << 17
#: Elements from which a call lets go of the GIL while it computes (below, letting go
#: and taking it back cost more than the rows: an attention's scores are a few K).
GIL_ELEMENTS = 1 << 15

_TEMPLATE = r"""
/* rows lo..hi of x (R, L) into y: exp(x - max) / sum, a NaN made 0 where zero_nan;
   y is x or does not overlap it. Blocks of rows: x - max of each row stored, then one
   flat loop of exps over the block (the vector exp without a short tail per row),
   then each row divided by its sum. */
static void softmax_rows_SUF(const REAL *x, REAL *y, int64_t L, int64_t lo,
                             int64_t hi, int zero_nan) {
    const int64_t block = L >= 1024 ? 1 : 1024 / L;
    for (int64_t r0 = lo; r0 < hi; r0 += block) {
        const int64_t r1 = r0 + block < hi ? r0 + block : hi, n = (r1 - r0) * L;
        for (int64_t r = r0; r < r1; r++) {
            const REAL *const xr = x + r * L;
            REAL *const yr = y + r * L;
            /* the maximum, NaN if one is (as NumPy's maximum gives): a vector max
               and a vector test for NaN (a chain of selects took 3 us a call) */
            REAL m = xr[0];
            int nan = 0;
            #pragma omp simd reduction(max:m) reduction(|:nan)
            for (int64_t j = 0; j < L; j++) {
                m = xr[j] > m ? xr[j] : m;
                nan |= xr[j] != xr[j];
            }
            if (nan) m = (REAL)NAN;
            /* x - max below LOW_SUF has the exponential 0. Such an element (an
               attention's masked score: near -1e4, -3e38 or -inf) is stored as 1;
               its exponential, e > 2 (any other is at most 1, or NaN), is read as 0
               by the sum and the division (0 / a NaN sum is NaN, as before). The
               vector exp calls its scalar fallback for a whole vector holding one
               such argument: 5x the pass's time on a causal mask. */
            #pragma omp simd
            for (int64_t j = 0; j < L; j++) {
                const REAL d = xr[j] - m;
                yr[j] = d < LOW_SUF ? (REAL)1 : d;
            }
        }
        REAL *const yb = y + r0 * L;
        #pragma omp simd
        for (int64_t i = 0; i < n; i++) yb[i] = EXP_SUF(yb[i]);
        for (int64_t r = r0; r < r1; r++) {
            REAL *const yr = y + r * L;
            REAL s = 0;
            #pragma omp simd reduction(+:s)
            for (int64_t j = 0; j < L; j++) s += yr[j] > 2 ? (REAL)0 : yr[j];
            if (zero_nan) {
                #pragma omp simd
                for (int64_t j = 0; j < L; j++) {
                    const REAL v = (yr[j] > 2 ? (REAL)0 : yr[j]) / s;
                    yr[j] = v != v ? (REAL)0 : v;
                }
            } else {
                #pragma omp simd
                for (int64_t j = 0; j < L; j++) yr[j] = (yr[j] > 2 ? (REAL)0 : yr[j]) / s;
            }
        }
    }
}

/* args ((x, y), L, lo, hi, zero_nan, size), x and y C-contiguous, y writable: rows
   lo..hi (of L elements). 0: done; 2: y overlaps x other than exactly (nothing
   written); -1: a Python error set. The GIL is let go where the whole call (size
   elements, over all the threads' blocks) has GIL_ELEMENTS. */
int geon_softmax_rows_SUF(void *args) {
    static const int flags[2] = {GEON_CONTIGUOUS, GEON_CONTIGUOUS | GEON_WRITABLE};
    long long iv[5];
    geon_buffer v[2];
    if (!geon_args(args, "iiiii", iv, NULL)) return -1;
    const int64_t L = iv[0], lo = iv[1], hi = iv[2];
    if (!geon_acquire(v, PyTuple_GetItem(args, 0), flags, 2)) return -1;
    const char *const x = v[0].buf, *const y = v[1].buf;
    int status = 0;
    if (x != y && x < y + v[1].len && y < x + v[0].len) status = 2;
    else if (L > 0) {
        void *const state = iv[4] >= GIL_ELEMENTS ? PyEval_SaveThread() : NULL;
        softmax_rows_SUF((const REAL *)x, (REAL *)y, L, lo, hi, (int)iv[3]);
        if (state) PyEval_RestoreThread(state);
    }
    geon_release(v, 2);
    return status;
}
"""

_STATS = r"""
/* rows lo..hi of x (R, L): d = x - mean, inv = 1 / sqrt(mean(d * d) + eps), one a row;
   d is x or does not overlap it, inv overlaps neither */
static void ln_stats_SUF(const REAL *x, REAL *d, REAL *inv, int64_t L, REAL eps,
                         int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; r++) {
        const REAL *const xr = x + r * L;
        REAL *const dr = d + r * L;
        REAL s = 0;
        #pragma omp simd reduction(+:s)
        for (int64_t j = 0; j < L; j++) s += xr[j];
        const REAL m = s / (REAL)L;
        REAL q = 0;
        #pragma omp simd reduction(+:q)
        for (int64_t j = 0; j < L; j++) {
            const REAL v = xr[j] - m;
            dr[j] = v;
            q += v * v;
        }
        inv[r] = (REAL)1 / SQRT_SUF(q / (REAL)L + eps);
    }
}

/* args ((x, d, inv), L, eps, lo, hi, size), C-contiguous, d and inv writable. 0:
   done; 2: an overlap the loop cannot take (nothing written); -1: a Python error set.
   The GIL as for the softmax. */
int geon_ln_stats_SUF(void *args) {
    static const int flags[3] = {GEON_CONTIGUOUS, GEON_CONTIGUOUS | GEON_WRITABLE,
                                 GEON_CONTIGUOUS | GEON_WRITABLE};
    long long iv[4];
    double eps;
    geon_buffer v[3];
    if (!geon_args(args, "idiii", iv, &eps)) return -1;
    const int64_t L = iv[0], lo = iv[1], hi = iv[2];
    if (!geon_acquire(v, PyTuple_GetItem(args, 0), flags, 3)) return -1;
    const char *const x = v[0].buf, *const d = v[1].buf, *const inv = v[2].buf;
    int status = 0;
#define GEON_OVERLAP(a, b, na, nb) ((a) < (b) + (nb) && (b) < (a) + (na))
    if ((x != d && GEON_OVERLAP(x, d, v[0].len, v[1].len))
            || GEON_OVERLAP(x, inv, v[0].len, v[2].len)
            || GEON_OVERLAP(d, inv, v[1].len, v[2].len)) status = 2;
#undef GEON_OVERLAP
    else if (L > 0) {
        void *const state = iv[3] >= GIL_ELEMENTS ? PyEval_SaveThread() : NULL;
        ln_stats_SUF((const REAL *)x, (REAL *)d, (REAL *)inv, L, (REAL)eps, lo, hi);
        if (state) PyEval_RestoreThread(state);
    }
    geon_release(v, 3);
    return status;
}
"""

_TYPES = {np.dtype(np.float32): ("float", "f32", "geon_max_f", "expf"),
          np.dtype(np.float64): ("double", "f64", "geon_max_d", "exp")}


def source():
    """The C source of the kernels, for float32 and float64."""
    head = ("#include <math.h>\n#include <stdint.h>\n#include <stddef.h>\n"
            f"#define GIL_ELEMENTS {GIL_ELEMENTS}\n" + toolchain.BUFFER_API
            + toolchain.MINMAX)
    if toolchain.toolchain().simd_math:   # the vector exp in `omp simd` loops
        head += "".join(f"#pragma omp declare simd notinbranch\n{t} {n}({t});\n"
                        for t, _, _, n in _TYPES.values())
    return head + "\n".join(
        (_TEMPLATE + _STATS).replace("MAX_SUF", mx).replace("EXP_SUF", exp)
        .replace("SQRT_SUF", "sqrtf" if real == "float" else "sqrt")
        .replace("LOW_SUF", "-104.0f" if real == "float" else "-746.0")  # exp rounds to 0
        .replace("REAL", real)
        .replace("_SUF", "_" + suffix) for real, suffix, mx, exp in _TYPES.values())


def _bind(lib):
    """The entries, each taking its arguments as one tuple (see the C)."""
    proto = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object)
    fns = {dt: proto((f"geon_softmax_rows_{t[1]}", lib)) for dt, t in _TYPES.items()}
    fns.update({("stats", dt): proto((f"geon_ln_stats_{t[1]}", lib))
                for dt, t in _TYPES.items()})
    return fns


_loaded = {}  # (CC, cache folder) -> {dtype: function}, or None


def kernels():
    """``{dtype: function}``, or None where the compiled path is off or cannot run
    here."""
    return compiled.fixed_library(_loaded, "row kernels", source,
                                  [f"geon_{k}_{t[1]}" for t in _TYPES.values()
                                   for k in ("softmax_rows", "ln_stats")], _bind)


def _fns(direct):
    """The kernels: ``direct`` is a computation's workspace (conv.Workspace: its cache
    of fixed libraries; a look-up costs 3 us) or whether they may run."""
    if isinstance(direct, bool):
        return kernels() if direct else None
    return direct.kernels(_SELF)


def _by_rows(call, R, size):
    """``call(lo, hi)`` over rows 0..R, split over geon's threads from
    :data:`PARALLEL_ELEMENTS` elements; the worst status returned."""
    threads = fusion.MAX_THREADS if size >= PARALLEL_ELEMENTS else 1
    if threads < 2:
        return call(0, R)
    results = []
    fusion.run_blocks(lambda a, b: results.append(call(a, b)), R,
                      max(1, -(-R // threads)), [()] * threads)
    return max(results)


def _softmax_entry(x, out, direct):
    """The softmax kernel for these arrays, or None."""
    fns = _fns(direct)
    fn = None if fns is None else fns.get(out.dtype)
    if fn is not None and x.dtype == out.dtype and x.flags.c_contiguous \
            and out.flags.c_contiguous:
        return fn
    return None


def softmax_rows(x, out, direct=True, zero_nan=False):
    """``out`` (R, L) = the softmax of each row of ``x`` (R, L) (``out`` may be ``x``),
    a NaN made 0 where ``zero_nan``: by the C kernel where ``direct`` (see
    :func:`_fns`) and the arrays allow, else NumPy's steps."""
    fn = _softmax_entry(x, out, direct)
    R, L = x.shape
    if fn is not None and _by_rows(
            lambda a, b: fn(((x, out), L, a, b, int(zero_nan), x.size)), R, x.size) == 0:
        return
    if np.may_share_memory(x, out) and x is not out:
        x = x.copy()
    m = np.maximum.reduce(x, axis=1, keepdims=True)
    np.subtract(x, m, out=out)
    np.exp(out, out=out)
    np.divide(out, np.add.reduce(out, axis=1, keepdims=True), out=out)
    if zero_nan:
        np.copyto(out, 0, where=np.isnan(out))


def _stats_entry(x, d, inv, direct):
    """The layer norm statistics' kernel for these arrays, or None."""
    fns = _fns(direct)
    fn = None if fns is None else fns.get(("stats", d.dtype))
    if fn is not None and x.dtype == d.dtype == inv.dtype and x.flags.c_contiguous \
            and d.flags.c_contiguous and inv.flags.c_contiguous:
        return fn
    return None


def layer_norm_stats(x, d, inv, eps, direct=True):
    """``d`` (R, L) = x - the mean of its row, ``inv`` (R,) = 1 / sqrt(the mean of the
    row's squared ``d`` + eps), for ``x`` (R, L) (``d`` may be ``x``): by the C kernel
    where ``direct`` (see :func:`_fns`) and the arrays allow, else NumPy's steps."""
    fn = _stats_entry(x, d, inv, direct)
    R, L = x.shape
    if fn is not None and _by_rows(
            lambda a, b: fn(((x, d, inv), L, float(eps), a, b, x.size)), R, x.size) == 0:
        return
    if np.may_share_memory(x, d) and x is not d or np.may_share_memory(x, inv):
        x = x.copy()
    dt = d.dtype.type
    np.subtract(x, np.add.reduce(x, axis=1, keepdims=True) / dt(L), out=d)
    var = np.add.reduce(d * d, axis=1) / dt(L)
    np.divide(dt(1), np.sqrt(var + dt(eps)), out=inv)


def _one_call(R, size):
    """Whether :func:`_by_rows` makes one call."""
    return size < PARALLEL_ELEMENTS or fusion.MAX_THREADS < 2 or R < 2


def softmax_step(x, out, direct=True, zero_nan=False):
    """The steps of a line calling :func:`softmax_rows` (see :mod:`.segments`), or None
    where it runs on several threads or NumPy's steps."""
    fn = _softmax_entry(x, out, direct)
    R, L = x.shape
    if fn is None or not _one_call(R, x.size):
        return None
    return [(fn, ((x, out), L, 0, R, int(zero_nan), x.size), None)]


def layer_norm_step(x, d, inv, eps, direct=True):
    """The steps of a line calling :func:`layer_norm_stats`, or None (as above)."""
    fn = _stats_entry(x, d, inv, direct)
    R, L = x.shape
    if fn is None or not _one_call(R, x.size):
        return None
    return [(fn, ((x, d, inv), L, float(eps), 0, R, x.size), None)]


_SELF = sys.modules[__name__]
NUMPY_GLOBALS.update(_softmax_rows=softmax_rows, _layer_norm_stats=layer_norm_stats,
                     _softmax_step=softmax_step, _layer_norm_step=layer_norm_step)


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


def _reshaped(em, op, shape):
    """The text of ``op``'s buffer (named) as ``shape``: a view made once in setup()
    where the buffer is planned (the same array every call), else per call."""
    name = em.names[op]
    if op in em.fresh or op not in em.plan.slot or em.sym:
        return f"{name}.reshape({py_literal(shape)})"
    view = identifier(f"{name}_rows", em.taken)
    em.setup.append(f"    {view} = {name}.reshape({py_literal(shape)})")
    return view


def _once(em, op):
    """Whether ``op`` is read by one op and is no result."""
    return em._readers.get(op) == 1 and op not in em.comp.results


def find_softmax(em, mx):
    """The :class:`Softmax` whose maximum is ``mx`` in emitter ``em``'s schedule, or
    None (always without the compiled path)."""
    if em.kernels is None or type(mx) is not pr.ReduceMax or mx.axis != 1 \
            or mx.dtype not in _TYPES:
        return None
    rows = mx.args[0]
    x = rows.args[0] if isinstance(rows, pr.Reshape) else None
    if x is None or isinstance(x, pr.ViewOp) \
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
    em.names[s.final] = em.buffer(s.final, em.body)
    R, L = s.rows.axes.lengths
    line = (f"_softmax_rows({em.names[s.rows]}, {_reshaped(em, s.final, (R, L))}, "
            f"_conv_ws{', True' if s.zero_nan else ''})")
    em.body.append(em.comp._annotate(line, s.final))
    em.body.append(f"    # {', '.join(type(m).__name__ for m in s.ops)}: one softmax pass")


class LayerNormStats:
    """A layer norm's statistics found at ``head`` (the first ``ReduceSum``): its
    ``ops``, the ``views`` only they read, ``x`` and its 2-d view ``rows``, the
    deviation ``d`` (``x - mean``) and ``inv`` (``1 / sqrt(var + eps)``), ``eps``."""

    __slots__ = ("head", "ops", "views", "x", "rows", "d", "inv", "eps")

    def __init__(self, ops, views, x, rows, eps):
        self.head, self.ops, self.views, self.x, self.rows = ops[0], ops, views, x, rows
        self.d, self.inv, self.eps = ops[2], ops[-1], eps

    def emit(self, em):
        em._view_ahead(self.rows)
        em.names[self.d] = em.buffer(self.d, em.body)
        em.names[self.inv] = em.buffer(self.inv, em.body)
        R, L = self.rows.axes.lengths
        line = (f"_layer_norm_stats({em.names[self.rows]}, "
                f"{_reshaped(em, self.d, (R, L))}, {_reshaped(em, self.inv, (R,))}, "
                f"{self.eps!r}, _conv_ws)")
        em.body.append(em.comp._annotate(line, self.head))
        em.body.append(f"    # {', '.join(type(m).__name__ for m in self.ops)}: a layer "
                       f"norm's statistics in one pass")


def _row_value(em, s, views):
    """The one op reading row value ``s`` (R,) through views of its size, each read
    once (added to ``views``), and the last view; (None, None) otherwise."""
    op = s
    while True:
        if not _once(em, op):
            return None, None
        (nxt,) = _readers(em, op)
        if not isinstance(nxt, pr.ViewOp):
            return nxt, op
        if not isinstance(nxt, (pr.Reshape, pr.Expand)) or nxt.axes.size != s.axes.size:
            return None, None
        views.append(nxt)
        op = nxt


def _scalar(em, op):
    """The value of scalar constant ``op`` as a float, else None."""
    return float(em.consts[em.scalars[op]]) if op in em.scalars else None


def _row_sum(em, op, x):
    """Whether ``op`` sums the rows of a 2-d reshape of ``x`` (R, L), read once."""
    return type(op) is pr.ReduceSum and op.axis == 1 and op.dtype == x.dtype \
        and isinstance(op.args[0], pr.Reshape) and op.args[0].args[0] is x \
        and op.args[0].axes.lengths[1] == x.axes.lengths[-1] and _once(em, op.args[0])


def _mean(em, s, x, views):
    """The ``Divide(s's view, L)`` reading row sum ``s`` of ``x``, else None."""
    div, last = _row_value(em, s, views)
    L = x.axes.lengths[-1]
    if type(div) is not og.Divide or div.args[0] is not last or \
            _scalar(em, div.args[1]) != L or div.dtype != x.dtype or not _once(em, div):
        return None
    return div


def find_layer_norm(em, s1):
    """The :class:`LayerNormStats` whose first row sum is ``s1`` in emitter ``em``'s
    schedule: ``mean = sum(x) / L``, a group of exactly ``d = x - mean`` and ``d *
    d``, ``var = sum(d * d) / L``, ``inv = 1 / sqrt(var + eps)`` (each read once, but
    ``d`` and ``inv``, by the normalization after them); else None."""
    if em.kernels is None or type(s1) is not pr.ReduceSum or s1.dtype not in _TYPES:
        return None
    rows = s1.args[0]
    x = rows.args[0] if isinstance(rows, pr.Reshape) else None
    if x is None or isinstance(x, pr.ViewOp) \
            or len(rows.axes) != 2 or not _row_sum(em, s1, x) \
            or not all(isinstance(n, int) for n in x.axes.lengths):
        return None
    views = [rows]
    mean = _mean(em, s1, x, views)
    bm = _broadcast(em, mean, x, views) if mean is not None else None
    sub = _readers(em, bm)[0] if bm is not None and _once(em, bm) else None
    g = em.first.get(sub)
    if type(sub) is not og.Subtract or sub.args[0] is not x or sub.args[1] is not bm \
            or g is None or len(g.members) != 2 or sub in g.internal \
            or sub in em.comp.results or sub in em._into:
        return None
    sq = g.members[1]
    if type(sq) is not og.Multiply or sq.args[0] is not sub or sq.args[1] is not sub \
            or not _once(em, sq):
        return None
    (r2,) = _readers(em, sq)
    s2 = _readers(em, r2)[0] if isinstance(r2, pr.Reshape) and _once(em, r2) else None
    if s2 is None or not _row_sum(em, s2, sq):
        return None
    views.append(r2)
    var = _mean(em, s2, sq, views)
    add = _readers(em, var)[0] if var is not None else None
    eps = _scalar(em, add.args[1]) if type(add) is og.Add and add.args[0] is var else None
    sqrt = _readers(em, add)[0] if eps is not None and _once(em, add) else None
    inv = _readers(em, sqrt)[0] if type(sqrt) is og.Sqrt and _once(em, sqrt) else None
    if type(inv) is not og.Divide or inv.args[1] is not sqrt \
            or _scalar(em, inv.args[0]) != 1.0 or inv in em.comp.results \
            or inv in em._into or inv.axes.size * x.axes.lengths[-1] != x.axes.size:
        return None
    ops = [s1, mean, sub, sq, s2, var, add, sqrt, inv]
    if any(op in em.in_group and op not in (sub, sq) or op.dtype != x.dtype
           for op in ops):
        return None
    if any(em.emits(op) and not isinstance(op, pr.ViewOp) and op not in ops
           for op in em.order[em._step[s1] + 1:em._step[inv]]) or kernels() is None:
        return None   # (other code runs in between; the library last: a build)
    return LayerNormStats(ops, views, x, rows, eps)
