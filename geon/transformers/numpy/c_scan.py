"""A scan's loop in C.

A :class:`~geon.op_graph.control.Scan` runs as a Python loop that calls its body's
``step()`` once per step (:mod:`.control`). Where the body is small, as an RNN cell is,
the Python around the work costs more than the work: the zoo's LSTM cell (a 4 x 64 by
64 x 256 product and a compiled group of 13 ops) took about 6.4 us a step, of which the
product's ``np.matmul`` call and the group's call were 2.4 and 1.9 and the rest Python.

Here the whole loop runs in one C call, where the body's step does only this:

- views (of its inputs, of its module's arrays, of its results), and copies of them;
- the adjoints of slices (``Unslice``: zeros and a slice set; ``UnsliceAdd``: a slice
  added into a value), as nested C loops over the slice;
- compiled groups (:mod:`.c_codegen`): their loops are called directly, with the
  pointers and strides of the arrays the step's Python would hand them;
- 2-d matrix products of float32 or float64 of at most :data:`MAX_PRODUCT`
  multiply-adds: a small kernel of ours (the right operand packed into rows of whole
  vectors, once a loop where it is a closure or a constant, else once a step; blocks
  of 4 rows by 4 vectors of 64 bytes of columns held in registers).

What each array of a step is, is found once, by tracing: the body's module has a
``_trace()`` that runs the step's lines on the first step's arrays and returns every
array the groups and products read or write and the step's results. Each is then a
view of one *base*: a carry, a sequence's step, a closure, an array of the body's
module (an arena, a constant), or a result's buffer; its offset from its base and its
strides do not change from step to step (the carries and steps are contiguous arrays
of fixed shapes; the closures' strides are part of the key the loop is built for).
The generated C loop then computes each step's pointers: a sequence's step moves by
its stride, a carry is the first step's array and then the previous step's result, and
each result's buffer is one of two, taken in turn, so that a step never writes what
it reads. The stacked ys and the history are copied in from the results and carries.

A body whose step does anything else (a NumPy call, a product with a batch, a reduction
NumPy runs) keeps the Python loop, as do bodies where the compiled path is off, and
loops where the C library does not build (once, silently; the Python loop is exact).
The products are summed in another order than the BLAS's (fused multiply-adds), so
values differ from the Python loop's in the last bits.
"""

import ctypes

import numpy as np

from geon.op_graph import primitives as pr
from geon.transformers.numpy import compiled, toolchain
from geon.transformers.numpy.c_rules import _CTYPE

#: The largest product (multiply-adds) the loop computes itself: larger ones are worth
#: the BLAS's threads and blocking more than the Python around a step.
MAX_PRODUCT = 1 << 20

_GEMM = toolchain.VECTOR32 + r"""
typedef INDEX vi_SUF __attribute__((vector_size(32)));   /* shuffle masks */
/* the product's vectors: 64 bytes (the zoo's LSTM, 2 layers of 16 steps of a 4 x 64
   by 64 x 256 float32 product, took 141-149 us a forward where 32-byte vectors took
   165-172: a 2.3 GHz Xeon with AVX-512, one thread) */
typedef REAL vg_SUF __attribute__((vector_size(64)));
#define VG_SUF ((int64_t)(64 / sizeof(REAL)))

/* rows k0..k1 by columns n0..n1 of b (K, N), any strides, into p (zeros from N on) */
static void scan_pack_range_SUF(const char *b, ptrdiff_t sk, ptrdiff_t sn, int64_t k0,
                                int64_t k1, int64_t n0, int64_t n1, int64_t N,
                                int64_t NP, REAL *restrict p) {
    for (int64_t k = k0; k < k1; k++)
        for (int64_t n = n0; n < n1; n++)
            p[k * NP + n] = n < N ? *(const REAL *)(b + k * sk + n * sn) : 0;
}

/* b (K, N) into p: K rows of NP (N padded with zeros to 4 of the product's vectors,
   vg); where b's columns are contiguous (a transposed weight), blocks of VL x VL
   transposed in registers */
static void scan_pack_SUF(const char *b, ptrdiff_t sk, ptrdiff_t sn, int64_t K,
                          int64_t N, int64_t NP, REAL *restrict p) {
    int64_t KF = 0, NF = 0;
    if (sk == sizeof(REAL)) {
        KF = K - K % VL_SUF;
        NF = N - N % VL_SUF;
        for (int64_t n0 = 0; n0 < NF; n0 += VL_SUF)
            for (int64_t k0 = 0; k0 < KF; k0 += VL_SUF) {
                vr_SUF r[VL_SUF], o[VL_SUF];
                for (int i = 0; i < VL_SUF; i++)
                    r[i] = load_SUF((const REAL *)(b + (n0 + i) * sn) + k0);
                TRANSPOSE_SUF
                for (int j = 0; j < VL_SUF; j++)
                    __builtin_memcpy(p + (k0 + j) * NP + n0, &o[j], sizeof o[j]);
            }
    }
    scan_pack_range_SUF(b, sk, sn, KF, K, 0, NP, N, NP, p);
    scan_pack_range_SUF(b, sk, sn, 0, KF, NF, NP, N, NP, p);
}

/* c (M, N) = a (M, K) @ p (packed b), a and c through byte strides: blocks of 4 rows
   (the last clamped: repeated rows computed, not stored) by 4 vectors of columns */
__attribute__((optimize("fp-contract=fast")))
static void scan_gemm_SUF(const char *a, ptrdiff_t sam, ptrdiff_t sak,
                          const REAL *restrict p, int64_t NP, char *c, ptrdiff_t scm,
                          ptrdiff_t scn, int64_t M, int64_t N, int64_t K) {
    for (int64_t n0 = 0; n0 < NP; n0 += 4 * VG_SUF) {
        for (int64_t m0 = 0; m0 < M; m0 += 4) {
            const char *ar[4];
            for (int i = 0; i < 4; i++) ar[i] = a + (m0 + i < M ? m0 + i : M - 1) * sam;
            vg_SUF acc[4][4];
            _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++)
                _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) acc[i][j] = (vg_SUF){0};
            for (int64_t k = 0; k < K; k++) {
                vg_SUF bv[4];
                _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++)
                    __builtin_memcpy(&bv[j], p + k * NP + n0 + j * VG_SUF, sizeof bv[j]);
                _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
                    const REAL s = *(const REAL *)(ar[i] + k * sak);
                    _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++)
                        acc[i][j] += s * bv[j];
                }
            }
            const int64_t nn = N - n0 < 4 * VG_SUF ? N - n0 : 4 * VG_SUF;
            for (int i = 0; i < 4 && m0 + i < M; i++) {
                REAL row[4 * VG_SUF];
                __builtin_memcpy(row, acc[i], sizeof row);
                char *const out = c + (m0 + i) * scm + n0 * scn;
                for (int64_t n = 0; n < nn; n++) *(REAL *)(out + n * scn) = row[n];
            }
        }
    }
}
"""


def _shuffles(steps):
    """C statements transposing ``r`` (rows) into ``o`` (columns) by ``steps``: each a
    list of (output, first, second, mask) of ``__builtin_shuffle``."""
    return " ".join(f"const vi_SUF m{k}_{i} = {{{', '.join(map(str, mask))}}}; "
                    f"{'' if out.startswith('o') else 'const vr_SUF '}{out} = "
                    f"__builtin_shuffle({x}, {y}, m{k}_{i});"
                    for k, step in enumerate(steps) for i, (out, x, y, mask) in
                    enumerate(step))


#: The VL x VL transposes: three rounds of shuffles for 8 floats (pairs of elements,
#: pairs of pairs, halves), two for 4 doubles.
_TRANSPOSE = {
    4: _shuffles([
        [(f"t{2 * i + h}", f"r[{2 * i}]", f"r[{2 * i + 1}]",
          [0, 8, 1, 9, 4, 12, 5, 13] if h == 0 else [2, 10, 3, 11, 6, 14, 7, 15])
         for i in range(4) for h in (0, 1)],
        [(f"u{4 * q + 2 * h + e}", f"t{4 * q + h}", f"t{4 * q + 2 + h}",
          [0, 1, 8, 9, 4, 5, 12, 13] if e == 0 else [2, 3, 10, 11, 6, 7, 14, 15])
         for q in (0, 1) for h in (0, 1) for e in (0, 1)],
        [(f"o[{j + 4 * e}]", f"u{j}", f"u{j + 4}",
          [0, 1, 2, 3, 8, 9, 10, 11] if e == 0 else [4, 5, 6, 7, 12, 13, 14, 15])
         for j in range(4) for e in (0, 1)]]),
    8: _shuffles([
        [(f"t{2 * i + h}", f"r[{2 * i}]", f"r[{2 * i + 1}]",
          [0, 4, 2, 6] if h == 0 else [1, 5, 3, 7]) for i in range(2) for h in (0, 1)],
        [(f"o[{h + 2 * e}]", f"t{h}", f"t{2 + h}", [0, 1, 4, 5] if e == 0 else [2, 3, 6, 7])
         for h in (0, 1) for e in (0, 1)]]),
}


def gemm_source(dtype):
    """The C of the product kernel and of its packing (``scan_pack_f``, ...) for
    ``dtype`` (float32 or float64); :mod:`.small_gemm` packs transposed weights with
    it."""
    real = _CTYPE[dtype]
    suf = "_" + real[0]
    index = "int32_t" if dtype.itemsize == 4 else "int64_t"
    return (_GEMM.replace("TRANSPOSE_SUF", _TRANSPOSE[dtype.itemsize])
            .replace("INDEX", index)
            .replace("REAL", real).replace("_SUF", suf))


def pack_name(dtype):
    """The name of :func:`gemm_source`'s packing function for ``dtype``."""
    return "scan_pack_" + _CTYPE[dtype][0]


def plan(em):
    """The actions of a scan body's step (emitter ``em``, after its lines are made):
    ``("group", C name, names, strided parameters, range)``, ``("copy", a, out)`` and
    ``("gemm", a, b, out, dtype)`` by the names of their arrays, in order; None where
    the step does anything else (see the module docstring)."""
    comp, kernels = em.comp, em.kernels
    if kernels is None or em.epilogues or em.bias_adds or comp._into or comp._copy_feeds:
        return None
    actions = []
    for op in em.order:
        if not em.emits(op) or isinstance(op, pr.ViewOp):
            continue
        if op in em.first:
            call = kernels.calls.get(em.first[op])
            if call is None or not isinstance(call[3], int):
                return None
            actions.append(("group",) + call)
        elif op in em.in_group:
            continue
        elif isinstance(op, pr.Copy) and op.axes.size and all(
                isinstance(n, int) for n in op.axes.lengths):
            actions.append(("copy", em.names[op.args[0]], em.names[op]))
        elif isinstance(op, pr.Unslice) and op.dtype in _DTYPES and all(
                isinstance(n, int) for n in op.axes.lengths):   # zeros, a slice set
            actions.append(("unslice", em.names[op.args[0]], em.names[op], op.key))
        elif isinstance(op, pr.UnsliceAdd) and op.dtype in _DTYPES and all(
                isinstance(n, int) for n in op.axes.lengths):   # (a slice's adjoint)
            x, a = op.args
            actions.append(("unslice_add", em.names[x], em.names[a], em.names[op],
                            op.key))
        elif isinstance(op, pr.Gemm) and not op.batch_rank and op.dtype in _DTYPES \
                and all(a.dtype == op.dtype for a in op.args) \
                and all(isinstance(n, int) for a in op.args for n in a.axes.lengths) \
                and _work(op) <= MAX_PRODUCT:
            a, b = op.args
            actions.append(("gemm", em.names[a], em.names[b], em.names[op], op.dtype))
        else:
            return None
    return actions or None


_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _work(op):
    (m, k), n = op.args[0].axes.lengths, op.axes.lengths[-1]
    return m * k * n


def trace_source(actions, params, core, step_returns):
    """The lines of the body module's ``_trace()`` (the step's lines, then the arrays
    of the actions and the results), the names of the actions' arrays, and whether
    each result is a copy the step makes (``np.array(name)``)."""
    names = []
    for act in actions:
        for n in (act[2] if act[0] == "group" else act[1:3] if act[0] in ("copy", "unslice")
                  else act[1:4]):   # (a gemm's a, b, out; an unslice_add's x, a, out)
            if n not in names:
                names.append(n)
    # (a result the step copies, np.array(name), is returned as the array it copies)
    copied = [r.startswith("np.array(") for r in step_returns]
    back = [r[len("np.array("):-1] if c else r for r, c in zip(step_returns, copied)]
    return ([f"def _trace({', '.join(params)}):"] + core
            + [f"    return ({''.join(n + ', ' for n in names)}), "
               f"({''.join(r + ', ' for r in back)})"]), names, copied


def _copy_lines(src, a, dst, b, add=False):
    """C lines copying array ``a`` at ``src`` into ``b`` (same shape) at ``dst`` (adding
    it to ``b`` where ``add``)."""
    real = _CTYPE.get(a.dtype)
    if real is None or a.dtype != b.dtype or a.shape != b.shape:
        raise _Declined("copy")
    lines, ind = [], "        "
    for d, n in enumerate(a.shape):
        lines.append(f"{ind}for (int64_t i{d} = 0; i{d} < {n}; i{d}++)")
        ind += "    "
    at = [" + ".join([p] + [f"i{d} * {s}" for d, s in enumerate(x.strides)])
          for p, x in ((src, a), (dst, b))]
    value = f"*(const {real} *)({at[0]})"
    if add:
        value = f"*({real} *)({at[1]}) + {value}"
    store = f"{ind}*({real} *)({at[1]}) = {value};"
    return ["        {"] + lines + [store, "        }"]


def _bounds(a):
    """The first and one-past-last byte address ``a`` reads."""
    lo = hi = a.__array_interface__["data"][0]
    for n, s in zip(a.shape, a.strides):
        lo, hi = (lo + (n - 1) * s, hi) if s < 0 else (lo, hi + (n - 1) * s)
    return lo, hi + a.itemsize


def _address(a):
    return a.__array_interface__["data"][0]


class Loop:
    """The loop of one scan body in C: :meth:`run` runs every step in one call, or
    returns None where this body's loop cannot (the caller runs its Python loop)."""

    def __init__(self, comp, actions, names, copied):
        self.comp, self.actions, self.names, self.copied = comp, actions, names, copied
        self._built = {}   # the closures' layouts, ys, hist -> _Built or None

    def run(self, carries, xs, closures, ys, hist, finals, reverse, frozen, T):
        """Run ``T`` steps: each step's ys and entering carries written into
        ``ys[j][t]`` and ``hist[k][t]``, the final carries into ``finals[k]`` (None:
        not kept); ``frozen[k]``: whether closure ``k`` is a constant (a product's
        operand that is one is packed once, not each call). True: done; None: not
        run (the caller runs its Python loop)."""
        if "_entry" not in vars(self.comp) or T < 1:
            return None   # (not allocated since the transformer changed: its call does)
        outs = ys + hist + finals
        key = (tuple((c.shape, c.strides, c.dtype) for c in closures),
               tuple(o is None for o in outs), frozen)
        built = self._built.get(key, False)
        if built is False:
            built = self._built[key] = self._build(carries, xs, closures, ys, hist,
                                                   finals, frozen)
        if built is None or not all(a.flags.c_contiguous for a in carries + xs) or \
                not all(o.flags.c_contiguous for o in outs if o is not None):
            return None
        return built.run(carries, xs, closures, outs, reverse, T)

    def _build(self, carries, xs, closures, ys, hist, finals, frozen):
        """Trace the step, write its loop and build it; None where it cannot run."""
        comp = self.comp
        # (inputs sharing memory, such as one array fed as two carries, are traced as
        # copies: each array of the step must be a view of one input)
        inputs, seen = [], []
        for a in (*carries, *(x[0] for x in xs), *closures):   # (a sequence: its step)
            inputs.append(np.array(a) if any(np.may_share_memory(a, b) for b in seen)
                          else a)
            seen.append(inputs[-1])
        with comp.transformer._lock:
            arrays, results = comp._ns["_trace"](*inputs)
        nc, nx = len(carries), len(xs)
        carries, steps, closures = inputs[:nc], inputs[nc:nc + nx], inputs[nc + nx:]
        try:
            built = _Built(comp, self.actions, dict(zip(self.names, arrays)), results,
                           self.copied, carries, steps, closures, ys, hist, finals, frozen)
        except _Declined:
            return None
        except compiled.CompileError:
            return None
        return built


class _Declined(Exception):
    """A step this loop cannot run (an array that is no view of a base, a result that
    is not a buffer of the step's own, ...)."""


class _Built:
    """One traced and built loop (see :class:`Loop`)."""

    def __init__(self, comp, actions, arrays, results, copied, carries, xs, closures, ys,
                 hist, finals, frozen):
        nc = len(carries)
        self.frozen = frozen
        #: products whose operand b is a constant closure as it is: (closure number,
        #: padded columns); packed once (:meth:`_packed`), passed after the ys
        self.prepacked, self._packs = [], {}
        self.nc, self.comp = nc, comp
        # the bases: (C expression of its pointer in a step, array at trace time)
        bases = [(f"c{k}", a) for k, a in enumerate(carries)]
        bases += [(f"x{k}", x) for k, x in enumerate(xs)]   # (one step of each)
        bases += [(f"B[{nc + len(xs) + k}]", a) for k, a in enumerate(closures)]
        slot = nc + len(xs) + len(closures)
        self.globals, fresh = [], []   # names of the module's arrays used; result roots
        for r, c in zip(results, copied):
            if c:
                continue
            root = r
            while isinstance(root.base, np.ndarray):
                root = root.base
            if not any(root is f for f in fresh) and \
                    not any(np.may_share_memory(root, b) for _, b in bases):
                fresh.append(root)
        module = [(n, v) for n, v in comp._ns.items() if isinstance(v, np.ndarray)]
        where = {}   # array name or result number -> (base expression, offset)

        def find(a):
            lo, hi = _bounds(a)
            for expr, b in bases:
                blo, bhi = _bounds(b)
                if blo <= lo and hi <= bhi:
                    return expr, _address(a) - _address(b)
            for j, f in enumerate(fresh):
                blo, bhi = _bounds(f)
                if blo <= lo and hi <= bhi:
                    return f"f{j}", _address(a) - _address(f)
            for n, v in module:
                blo, bhi = _bounds(v)
                if v.size and blo <= lo and hi <= bhi:
                    if n not in self.globals:
                        self.globals.append(n)
                    return f"B[{slot + self.globals.index(n)}]", _address(a) - _address(v)
            raise _Declined(a.shape)

        for n, a in arrays.items():
            if not isinstance(a, np.ndarray) or not a.size:
                raise _Declined(n)
            where[n] = find(a)
        fslot = slot + len(self.globals)
        # each result: a contiguous buffer of the step's own (a fresh root), or a copy
        # the step makes at its end (into a buffer of the loop's own)
        res, self.copies = [], []
        for r, c in zip(results, copied):
            expr, off = find(r)
            if not r.flags.c_contiguous or not (c or expr.startswith("f")):
                raise _Declined("result")
            if c:
                self.copies.append((len(fresh), f"{expr} + {off}", r.nbytes))
                fresh.append(np.empty(r.nbytes, np.uint8))   # (found by nothing)
                expr, off = f"f{len(fresh) - 1}", 0
            res.append((int(expr[1:]), off, r.nbytes))
        for k, c in enumerate(carries):
            if res[k][2] != c.nbytes or results[k].dtype != c.dtype:
                raise _Declined("carry")
        for j, y in enumerate(ys):
            if y is not None and (y[0].nbytes != res[nc + j][2] or y.dtype != results[
                    nc + j].dtype):
                raise _Declined("y")
        for f, c in zip(finals, carries):
            if f is not None and (f.nbytes != c.nbytes or f.dtype != c.dtype):
                raise _Declined("final")
        # the results' buffers, two of each (steps take them in turn), in one array
        self.fresh = [-(-f.nbytes // 64) * 64 for f in fresh]
        self.fresh_bytes = 2 * sum(self.fresh)
        src = self._source(actions, arrays, where, res, xs, closures, ys, hist, finals,
                           slot, fslot)
        lib = toolchain.build(src, ["geon_scan_loop"])
        proto = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_int64,
                                  ctypes.c_int64)
        self.fn = proto(("geon_scan_loop", lib))

    def _source(self, actions, arrays, where, res, xs, closures, ys, hist, finals, slot,
                fslot):
        """The C source of the loop: the body's groups, the product kernel, and
        ``geon_scan_loop(arrays, T, reverse)`` over the tuple :meth:`run` passes."""
        nc, nx = self.nc, len(xs)
        yslot = fslot + 1
        kept_y = [j for j, y in enumerate(ys) if y is not None]
        kept_h = [k for k, h in enumerate(hist) if h is not None]
        kept_f = [k for k, f in enumerate(finals) if f is not None]
        pslot = yslot + len(kept_y) + len(kept_h) + len(kept_f)   # then packed constants
        at = [sum(2 * n for n in self.fresh[:j]) for j in range(len(self.fresh))]

        def fresh(j, parity):   # result buffer j of a step of this parity
            return f"B[{fslot}] + {at[j]} + ({parity}) * {self.fresh[j]}"

        def ptr(name):
            expr, off = where[name]
            return f"({expr} + {off})"

        setup, body, frees = self._actions(actions, arrays, ptr, where, closures,
                                           nc + nx, slot, pslot)
        n = pslot + len(self.prepacked)
        dtypes = sorted({act[4] for act in actions if act[0] == "gemm"}, key=str)
        src = [self.comp._kernels.source, "#include <stdlib.h>"]
        src += [gemm_source(d) for d in dtypes]
        src += ["/* the loop: 0 done, 1 no memory, -1 a Python error set */",
                "int geon_scan_loop(void *arrays, int64_t T, int64_t reverse) {",
                f"    static const int flags[{n}] = {{{', '.join(['GEON_STRIDED'] * n)}}};",
                f"    geon_buffer v[{n}];",
                f"    if (!geon_acquire(v, arrays, flags, {n})) return -1;",
                f"    char *B[{n}];",
                f"    for (int k = 0; k < {n}; k++) B[k] = (char *)v[k].buf;"]
        src += setup
        src.append(f"    const int ok = {' && '.join(frees) or 1};")
        src.append("    void *const state = PyEval_SaveThread();   /* the loop: no Python */")
        src += ["    if (ok) for (int64_t s = 0; s < T; s++) {",
                "        const int64_t t = reverse ? T - 1 - s : s;"]
        for k in range(nc):
            j, off, _ = res[k]
            src.append(f"        char *const c{k} = s ? {fresh(j, '(s - 1) & 1')} + {off} "
                       f": B[{k}];")
        for k, x in enumerate(xs):
            src.append(f"        char *const x{k} = B[{nc + k}] + t * {x.nbytes};")
        for j in range(len(self.fresh)):
            src.append(f"        char *const f{j} = {fresh(j, 's & 1')};")
        for i, k in enumerate(kept_h):
            size = res[k][2]
            src.append(f"        __builtin_memcpy(B[{yslot + len(kept_y) + i}] + t * {size}, "
                       f"c{k}, {size});")
        src += body
        src += [f"        __builtin_memcpy(f{j}, {at}, {size});"
                for j, at, size in self.copies]
        for i, j in enumerate(kept_y):
            f, off, size = res[nc + j]
            src.append(f"        __builtin_memcpy(B[{yslot + i}] + t * {size}, f{f} + {off}, "
                       f"{size});")
        src.append("    }")
        for i, k in enumerate(kept_f):   # the final carries (T >= 1)
            j, off, size = res[k]
            dst = yslot + len(kept_y) + len(kept_h) + i
            src.append(f"    if (ok && T > 0) __builtin_memcpy(B[{dst}], "
                       f"{fresh(j, '(T - 1) & 1')} + {off}, {size});")
        src.append("    PyEval_RestoreThread(state);")
        src += [f"    free({p});" for p in frees]
        src += [f"    geon_release(v, {n});", "    return ok ? 0 : 1;", "}", ""]
        return "\n".join(src)

    def _actions(self, actions, arrays, ptr, where, closures, cslot, slot, pslot):
        """The C of each action: ``(setup, body, frees)``: lines before the loop, in
        each step, and the buffers to free after it. ``ptr(name)``: the C pointer of an
        array in a step; closures from slot ``cslot``, the module's arrays from
        ``slot``, the packed constants from ``pslot``."""
        setup, body, frees = [], [], []
        invariant = {f"B[{cslot + k}]" for k in range(len(closures))}
        invariant |= {f"B[{slot + i}]" for i, g in enumerate(self.globals)
                      if g in self.comp._consts}
        for i, act in enumerate(actions):
            if act[0] == "group":
                _, cname, names, strided, units = act
                for p in strided:
                    setup.append(f"    static const ptrdiff_t st{i}_{p}[] = {{"
                                 f"{', '.join(map(str, arrays[names[p]].strides))}}};")
                body.append(f"        {cname}_loops({''.join(ptr(m) + ', ' for m in names)}"
                            f"{''.join(f'st{i}_{p}, ' for p in strided)}0, {units});")
                continue
            if act[0] == "copy":
                body += _copy_lines(ptr(act[1]), arrays[act[1]], ptr(act[2]),
                                    arrays[act[2]])
                continue
            if act[0] in ("unslice", "unslice_add"):
                # out = 0 or x; out[key] = a or out[key] + a
                if act[0] == "unslice":
                    (_, a, out, key), x = act, None
                    if not arrays[out].flags.c_contiguous:
                        raise _Declined("unslice")
                    body.append(f"        __builtin_memset({ptr(out)}, 0, "
                                f"{arrays[out].nbytes});")
                else:
                    _, x, a, out, key = act
                if x is not None and x != out:
                    body += _copy_lines(ptr(x), arrays[x], ptr(out), arrays[out])
                part = arrays[out][key]
                if not isinstance(part, np.ndarray) or not part.size:
                    raise _Declined("unslice_add")
                base, off = where[out]
                dst = f"({base} + {off + _address(part) - _address(arrays[out])})"
                add = np.broadcast_to(arrays[a], part.shape)
                body += _copy_lines(ptr(a), add, dst, part, add=act[0] == "unslice_add")
                continue
            _, a, b, out, dtype = act
            A, Bm, C = arrays[a], arrays[b], arrays[out]
            if any(s % A.itemsize for s in A.strides + Bm.strides + C.strides):
                raise _Declined("strides")
            (M, K), N = A.shape, Bm.shape[1]
            real, suf = _CTYPE[dtype], _CTYPE[dtype][0]
            lanes = 4 * 64 // dtype.itemsize   # (the product's blocks of columns)
            NP = -(-N // lanes) * lanes
            const = [j for j, c in enumerate(closures) if self.frozen[j] and where[b] == (
                f"B[{cslot + j}]", 0) and c.shape == Bm.shape and c.strides == Bm.strides]
            if const:   # a constant closure as it is: packed once, by run()
                setup.append(f"    const {real} *const p{i} = (const {real} *)"
                             f"B[{pslot + len(self.prepacked)}];")
                self.prepacked.append((const[0], NP))
            else:
                pack = (f"scan_pack_{suf}({ptr(b)}, {Bm.strides[0]}, {Bm.strides[1]}, "
                        f"{K}, {N}, {NP}, p{i});")
                setup.append(f"    {real} *const p{i} = malloc({K * NP} * sizeof({real}));")
                frees.append(f"p{i}")
                if where[b][0] in invariant:   # read-only in the loop: packed once
                    setup.append(f"    if (p{i}) {pack}")
                else:
                    body.append(f"        {pack}")
            body.append(f"        scan_gemm_{suf}({ptr(a)}, {A.strides[0]}, {A.strides[1]}, "
                        f"p{i}, {NP}, {ptr(out)}, {C.strides[0]}, {C.strides[1]}, "
                        f"{M}, {N}, {K});")
        return setup, body, frees

    def _packed(self, closures):
        """The constant closures' packed arrays (made on the first call with each)."""
        out = []
        for k, NP in self.prepacked:
            c = closures[k]
            hit = self._packs.get(k)
            if hit is None or hit[0] is not c:   # (the array is kept: its memory too)
                p = np.zeros((c.shape[0], NP), c.dtype)
                p[:, :c.shape[1]] = c
                hit = self._packs[k] = (c, p)
            out.append(hit[1])
        return out

    def run(self, carries, xs, closures, outs, reverse, T):
        ns = self.comp._ns
        with self.comp.transformer._lock:
            arrays = (*carries, *xs, *closures, *(ns[g] for g in self.globals),
                      np.empty(self.fresh_bytes, np.uint8),
                      *(o for o in outs if o is not None), *self._packed(closures))
            if self.fn(arrays, T, 1 if reverse else 0):
                raise MemoryError("no memory for a scan's packed products")
        return True
