"""C code generation of the compiled path: one C function per compiled group
(:class:`Kernels`), a loop over the group's elements (or rows) computing every member
with the rules of :mod:`.c_rules`, cut into segments over tiles where the group has
several slow members (:func:`_segments`). See :mod:`geon.transformers.numpy.compiled`
for which groups are compiled and how."""

import ctypes
import math

import numpy as np

from geon.op_graph import op_graph as og
from geon.op_graph import primitives as pr
from geon.op_graph.symbols import Sym, evaluate
from geon.transformers import fusion
from geon.transformers.codegen_text import identifier
from geon.transformers.numpy import toolchain
from geon.transformers.numpy.c_rules import (_CTYPE, _c_comment, _literal, rule as c_rule_of,
                                             row_sum, simd_declarations, slow, supported)

#: Groups with at least this many elements run in blocks on several threads.
PARALLEL_ELEMENTS = 1 << 20
#: A group of at least this many elements runs its loops without holding the GIL (the
#: threads of a blocked group run at once; other Python threads may run meanwhile).
#: Smaller ones keep it: releasing and taking it back costs more than they take.
GIL_RELEASE_ELEMENTS = 1 << 15
#: Elements per block handed to a thread (rows of strided groups: this many elements'
#: worth, at least one row).
BLOCK_ELEMENTS = 1 << 18
#: At most this many ops per C function: the compiler's time grows faster than the
#: function's length (a 5,000-op loop took 36 s, 1,000 ops 2.8 s).
MAX_MEMBERS = 250
#: Elements per step of a function's outer loop (a step's tiles stay in cache).
CHUNK_ELEMENTS = 1 << 14
#: Elements of a row taken at a time in a group with strided reads. An input read
#: through strides whose last one is not the element size is first copied into a
#: contiguous array of this many elements (filled with one value where that stride is
#: 0, as for a broadcast bias), so the loops over the row read every input as
#: contiguous memory; element by element, a load through a stride the compiler does not
#: know took as long as the rest of the loop (a bias add and ReLU over 512 x 1,024
#: floats right after their GEMM: 369 us read through the stride, 198 us from a filled
#: row, on one Cascade Lake core).
ROW_CHUNK_ELEMENTS = 1024
#: Runs (rows read with one stride) shorter than this are copied side by side into a
#: step (their inputs copied too); longer ones are a step each, read in place where
#: their stride allows (copying the rows of a (B, S, 128) layer's input to put eight
#: side by side cost more than the loop's restarts it saved: 4% of a small ViT).
SHORT_RUN = 64
#: At most this many bytes of those contiguous arrays per function (they are on the C
#: stack, of a thread too): a group with many strided inputs takes shorter chunks.
ROW_BUFFER_BYTES = 1 << 16

#: Elements per tile of a group run in segments, at most; fewer where the arrays that
#: carry values between segments would pass :data:`TILE_BYTES` (per thread, in L1).
TILE_ELEMENTS = 256
TILE_BYTES = 1 << 15
#: Groups of fewer elements run as one loop: each segment's loop adds tens of
#: milliseconds of compile time, repaid only on large tensors.
TILED_MIN_ELEMENTS = 1 << 16
#: At most this many segments per group (slow members beyond share segments).
MAX_SEGMENTS = 16


_HEADER = ("/* geon: fused elementwise groups of one computation (generated) */\n"
           "#include <math.h>\n#include <stdint.h>\n#include <stddef.h>\n"
           + toolchain.BUFFER_API + toolchain.MINMAX)



def _segments(members, outputs, n, row=None):
    """How a group's loop is cut: ``(segments, slots, decls, tile)``.

    One loop that computes every member of an element before the next element makes each
    element one long chain of dependent instructions (a call into the vector maths
    library, a division, a square root: tens of cycles each), and the CPU cannot look
    far enough ahead to start the next elements meanwhile. So a group with more than one
    slow member (:func:`.c_rules.slow`) is cut after each: the elements are taken a tile at a
    time, and each segment is a loop over the tile whose iterations are independent. A
    value read in a later segment goes through an array of one tile (a *slot*, reused
    once the value is dead); so does each of ``outputs`` (members with a buffer)
    computed before the last segment, which stores them all after its loads, since an
    output may be written over an input's buffer. On the benchmarks' 20-op chain (two
    tanh, two exp, a log, a division, a square root) this took about three quarters of
    the time.

    Groups of fewer than :data:`TILED_MIN_ELEMENTS` elements, or with fewer than two
    slow members, are one loop, and so is a group whose loops run over rows of ``row``
    elements (strided reads) shorter than a tile. A group is cut into at most :data:`MAX_SEGMENTS`
    loops: with more slow members (not counting a last member, after which there is
    nothing to cut), it is cut after every second (third, ...) one, which bounds the
    compile time.

    ``segments``: lists of (index, member); ``slots``: member -> the name of its array;
    ``decls``: array name -> C type; ``tile``: elements per tile (0: one segment, no
    tiles)."""
    everything = [list(enumerate(members))]
    slow_ = [q for q, m in enumerate(members) if slow(m)]
    if n < TILED_MIN_ELEMENTS or len(slow_) < 2:
        return everything, {}, {}, 0
    slow_ = [q for q in slow_ if q < len(members) - 1]   # no cut after the last member
    every = -(-len(slow_) // (MAX_SEGMENTS - 1))
    cuts = set(slow_[every - 1::every])
    segments = [[]]
    seg_of = {}
    for q, m in enumerate(members):
        segments[-1].append((q, m))
        seg_of[m] = len(segments) - 1
        if q in cuts:
            segments.append([])
    last = {m: len(segments) - 1 for m in outputs}   # member -> its last segment:
    for m in members:                                  # outputs are stored in the last
        for a in m.args:
            if a in seg_of:
                last[a] = max(last.get(a, 0), seg_of[m])
    slots, decls, sizes, free, live = {}, {}, {}, {}, []
    for s, seg in enumerate(segments):
        for item in [x for x in live if x[0] < s]:   # dead before this segment
            live.remove(item)
            free.setdefault(decls[item[1]], []).append(item[1])
        for _, m in seg:
            if last.get(m, -1) > s:
                t = _CTYPE[m.dtype]
                name = free[t].pop() if free.get(t) else f"tile{len(decls)}"
                decls[name], sizes[name] = t, m.dtype.itemsize
                slots[m] = name
                live.append((last[m], name))
    per_element = sum(sizes.values())
    tile = TILE_ELEMENTS
    while tile > 16 and tile * per_element > TILE_BYTES:
        tile //= 2
    if row is not None and row < tile:
        return everything, {}, {}, 0
    return segments, slots, decls, tile



class Kernels:
    """The compiled groups of one computation being generated: collects a C function per
    group (:meth:`group_code`), then builds them into one library (:meth:`build`)."""

    def __init__(self, hints=None):
        #: the values of symbolic lengths to make size-based choices with (a group's
        #: symbolic lengths are in its first dimension: its loops take the count)
        self.hints = hints
        self.functions = []   # C source of each function
        self.names = []       # the Python name each is called by
        self.groups = 0
        self.source = None    # the C file, once built
        #: group -> (C name, parameter names, strided parameters, range): what a scan's
        #: loop in C (c_scan.py) calls the group's loops with
        self.calls = {}

    def compilable(self, g, scalars):
        """Whether every member of ``g`` compiles and every input is a buffer, view or
        constant of the group's shape, or a scalar constant."""
        lengths = g.members[0].axes.lengths
        members = set(g.members)
        if any(isinstance(n, Sym) for n in lengths[1:]) or isinstance(lengths[-1], Sym) \
                and (any(row_sum(m) for m in g.members) or any(
                    isinstance(a, (pr.ViewOp, og.Constant)) and a not in scalars
                    for m in g.members for a in m.args)):
            return False  # (symbolic: the rows only, a row of a fixed length)
        for m in g.members:
            if not (supported(m) or row_sum(m)):
                return False
            for a in m.args:
                if a in members or a in scalars:
                    continue
                if a.axes.lengths != lengths:
                    return False
        return True

    def group_code(self, g, names, scalars, consts, dynamic, buffer, taken):
        """Python lines running group ``g`` as one C call (see the module docstring).

        ``names``: op -> name of its array (filled here for members with a buffer);
        ``scalars``: scalar constant -> name; ``consts``: name -> value; ``dynamic``:
        the ops whose arrays change between calls; ``buffer(op, lines)``: the name of a
        member's buffer, adding any line that makes it to ``lines``."""
        lines = []
        for m in g.members:
            if m not in g.internal:
                names[m] = buffer(m, lines)
        k = self.groups
        self.groups += 1
        group = _GroupFunction(g, names, scalars, consts, lines, self.hints)
        cname = f"geon_group{k}"
        pyname = identifier(f"kernel{k}", taken)
        self.functions.append("\n".join(group.c_source(cname)))
        self.names.append((pyname, cname))
        self.calls[g] = (cname, list(group.params), sorted(group.strided),
                         group.rows if group.by_rows else group.size)
        return lines + group.python_call(cname, pyname)

    def build(self):
        """``{python name: ctypes function}`` of the collected groups; raises
        :class:`CompileError`."""
        if not self.functions:
            return {}
        tc = toolchain.toolchain()
        source = (_HEADER
                  + (simd_declarations() if tc.simd_math else "") + "\n"
                  + "\n\n".join(self.functions) + "\n")
        self.source = source
        lib = toolchain.build(source, [cname for _, cname in self.names])
        out = {}
        # called with the GIL held: the function takes the arrays' buffers, and
        # releases the GIL itself around long loops (GIL_RELEASE_ELEMENTS); its
        # arguments come as one tuple (arrays, lo, hi); they return 0 (-1: ctypes
        # raises the Python error they set)
        proto = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object)
        for pyname, cname in self.names:
            out[pyname] = proto((cname, lib))
        return out


class _GroupFunction:
    """The C function of one compiled group, and the Python lines calling it: what it
    reads and writes (its parameters), how its loops run (over elements or rows, in
    tiles or not), and the text of each part."""

    def __init__(self, g, names, scalars, consts, lines, hints=None):
        self.g, self.members = g, g.members
        self.shape = shape = self.members[0].axes.shape
        #: the count of elements (an expression where the rows are symbolic: the code
        #: that calls the function evaluates it) and its value for size-based choices
        self.size = self.members[0].axes.size
        self.n = int(evaluate(self.size, hints or {}))
        self._parameters(names, scalars, lines)
        # row sums (the group finder puts them last): one accumulator each per row,
        # stored once the row is done
        self.sums = {m: k for k, m in enumerate(x for x in self.members if row_sum(x))}
        self.stored = {m: p for m, p in self.outputs.items() if m not in self.sums}
        # loops over rows, then over a row's elements
        self.by_rows = by_rows = bool(self.strided or self.sums)
        self.rank = rank = len(shape)
        rows = math.prod(shape[:-1]) if rank > 1 else 1
        self.inner = shape[-1] if by_rows else self.n
        self.rows = rows if by_rows else 1
        self._loads(scalars, consts)
        # strided groups: a row's piece, its contiguous copies within ROW_BUFFER_BYTES
        # (without row sums, consecutive rows that every strided input reads as one
        # strided run are taken together: see _row_head)
        copied = sum(self.param_dtype[p].itemsize for p in self.strided)
        self.chunk = min(self.inner if self.sums else max(self.n, 1), ROW_CHUNK_ELEMENTS,
                         max(16, ROW_BUFFER_BYTES // max(1, copied)))
        if self.sums:   # one loop: the sums add up the values of the last one
            self.segments, self.slots, self.decls, self.tile = \
                [list(enumerate(self.members))], {}, {}, 0
        else:
            self.segments, self.slots, self.decls, self.tile = _segments(
                self.members, self.outputs, self.n,
                self.chunk if self.strided else None)

    def _parameters(self, names, scalars, lines):
        """The arrays passed: inputs (contiguous or strided) then outputs."""
        g, members = self.g, self.members
        params, number = [], {}   # array name -> parameter number

        def param(name):
            if name not in number:
                number[name] = len(params)
                params.append(name)
            return number[name]

        inputs, strided, param_dtype = {}, set(), {}
        for m in members:
            for a in m.args:
                if a in inputs or a in g.internal or a in members or a in scalars:
                    continue
                inputs[a] = param(names[a])
                param_dtype[inputs[a]] = a.dtype
                if isinstance(a, (pr.ViewOp, og.Constant)):
                    strided.add(inputs[a])
                elif isinstance(a, og.Placeholder):
                    x = names[a]  # a feed may be any ndarray of the right shape
                    lines.append(f"    if not {x}.flags.c_contiguous: "
                                 f"{x} = _np_contiguous({x})")
        outputs = {m: param(names[m]) for m in members if m not in g.internal}
        # an output never goes through strides: buffers, fresh arrays and variables are
        # contiguous (an input read through a view is never an output's buffer)
        strided -= set(outputs.values())
        self.params, self.inputs, self.outputs = params, inputs, outputs
        self.strided, self.param_dtype = strided, param_dtype

    def _loads(self, scalars, consts):
        """The line loading each input's element (by parameter), and the C value of
        each input and scalar constant."""
        self.loads, self.value = loads, value = {}, {}
        for a, p in self.inputs.items():
            t = _CTYPE[a.dtype]
            v = f"x{p}"
            if p in self.strided:   # q<p>: the step's elements, contiguous
                loads[p] = f"const {t} {v} = q{p}[j];"
            elif self.by_rows:
                loads[p] = f"const {t} {v} = (({t} *)b{p})[base + j];"
            else:
                loads[p] = f"const {t} {v} = (({t} *)b{p})[i];"
            value[a] = (v, a.dtype)
        for m in self.members:
            for a in m.args:
                if a in scalars and a not in value:
                    value[a] = (_literal(consts[scalars[a]], a.dtype), a.dtype)

    def _member_line(self, m, q, values, slots, here, used):
        """The line computing member ``m`` (number ``q``) from ``values``."""
        if m in self.sums:
            return f"acc{self.sums[m]} += (double){values[m.args[0]][0]};" \
                   f"  /* {_c_comment(m)} */"
        ct = m.compute_dtype()
        t = _CTYPE[ct] if ct is not None else _CTYPE[m.dtype]
        args = []
        for a in m.args:
            v, dt = values[a]
            if a in self.inputs:
                used.add(self.inputs[a])
            elif a in slots and a not in here:
                v = f"{slots[a]}[u]"   # computed in an earlier segment
            args.append(v if (ct is None or dt == ct) else f"(({_CTYPE[ct]}){v})")
        expr = c_rule_of(m)(m, t, args)
        mt = _CTYPE[m.dtype]
        values[m] = (f"v{q}", m.dtype)
        return f"const {mt} v{q} = ({mt}){expr};  /* {_c_comment(m)} */"

    def loop_bodies(self, segments, slots):
        """Per segment, (the lines of its loop body, whether they read or write the
        arrays by element index)."""
        bodies, indexed, values = [], [], dict(self.value)
        for seg in segments:
            used, body, here = set(), [], {m for _, m in seg}
            for q, m in seg:
                body.append(self._member_line(m, q, values, slots, here, used))
                if m in slots and m not in self.sums:
                    body.append(f"{slots[m]}[u] = v{q};")
            bodies.append([self.loads[p] for p in sorted(used)] + body)
            indexed.append(bool(used))
        # Every store comes last, after every load of the element: an output may be
        # written over an input's buffer.
        here = {m for _, m in segments[-1]}
        idx = "base + j" if self.by_rows else "i"
        for m, p in self.stored.items():
            v = values[m][0] if m in here else f"{slots[m]}[u]"
            bodies[-1].append(f"(({_CTYPE[m.dtype]} *)b{p})[{idx}] = {v};")
        indexed[-1] = indexed[-1] or bool(self.outputs)
        return list(zip(bodies, indexed))

    def c_source(self, cname):
        """The lines of the C function ``cname``."""
        members, segments, tile = self.members, self.segments, self.tile
        nparams = len(self.params)
        body_params = "".join(f"char *const b{p}, " for p in range(nparams)) + "".join(
            f"const ptrdiff_t *const st{p}, " for p in sorted(self.strided))
        src = [f"/* {len(members)} ops, shape {self.shape}"
               + (f", {len(segments)} loops over tiles of {tile}" if tile else "") + " */",
               f"static void {cname}_loops({body_params}int64_t lo, int64_t hi) {{"]
        for p in sorted(self.strided):
            for d in range(self.rank):
                src.append(f"    const int64_t s{p}_{d} = st{p}[{d}];")
            src.append(f"    {_CTYPE[self.param_dtype[p]]} g{p}[{self.chunk}] "
                       "__attribute__((aligned(64)));")
        # elements lo..hi (rows lo..hi with strided reads): the caller splits the range
        if not self.by_rows:
            src += [f"    for (int64_t c = lo; c < hi; c += {CHUNK_ELEMENTS}) {{",
                    f"        const int64_t e = c + {CHUNK_ELEMENTS} < hi ? "
                    f"c + {CHUNK_ELEMENTS} : hi;"]
            first = "c"
            tail = ["    }"]
        else:
            head, tail = self._row_head()
            src += head
            first = "0"
        if tile:   # whole tiles: one loop per segment, values between them in arrays
            src += self._tiles(first)
            first = "t"   # the rest: one loop, as below
        src += self._fused_loop(first) + tail + ["}"]
        return src + self._entry(cname)

    def _entry(self, cname):
        """The exported function: the arrays' buffers, then the loops (without the GIL
        when they are long)."""
        nparams, written = len(self.params), set(self.outputs.values())
        flags = ", ".join(
            ("GEON_STRIDED" if p in self.strided else "GEON_CONTIGUOUS")
            + (" | GEON_WRITABLE" if p in written else "") for p in range(nparams))
        call = (f"{cname}_loops("
                + "".join(f"(char *)v[{p}].buf, " for p in range(nparams))
                + "".join(f"v[{p}].strides, " for p in sorted(self.strided)) + "lo, hi);")
        release = self.n >= GIL_RELEASE_ELEMENTS
        # its arguments one tuple (arrays, lo, hi); 0, or -1 with a Python error set
        return [f"int {cname}(void *args) {{",
                f"    static const int flags[{nparams}] = {{{flags}}};",
                "    long long iv[2];",
                f"    geon_buffer v[{nparams}];",
                "    if (!geon_args(args, \"ii\", iv, NULL)) return -1;",
                "    const int64_t lo = iv[0], hi = iv[1];",
                f"    if (!geon_acquire(v, PyTuple_GetItem(args, 0), flags, {nparams})) "
                "return -1;"]  \
            + (["    void *const state = PyEval_SaveThread();", f"    {call}",
                "    PyEval_RestoreThread(state);"] if release else [f"    {call}"]) \
            + [f"    geon_release(v, {nparams});", "    return 0;", "}"]

    def _row_head(self):
        """``(head, tail)``: the lines around the loops of a group read by rows (strided
        reads or row sums). Each step hands the loops ``e`` elements from ``base`` (the
        index of the first in the contiguous arrays), each strided input's as contiguous
        memory ``q<p>`` (read in place where its stride is the element size, else
        copied into ``g<p>``: filled with one value where the stride is 0, as for a
        broadcast bias, else gathered).

        With row sums, a step is a chunk of one row. Without, the rows go by *runs*:
        the rows that every strided input reads with one stride from the run's first
        element to its last (checked on the strides at run time, once per call; a bias
        broadcast over (B, C, H, W) is read so over each image's channel, H * W
        elements), and a step is a run or a chunk of it, or several short runs side by
        side (:data:`SHORT_RUN`), each copied: on 2 x 2 planes a step computes hundreds
        of elements, not four."""
        strided, rank, chunk, inner = self.strided, self.rank, self.chunk, self.inner
        if rank < 2 or not strided or self.sums:
            head = ["    for (int64_t r = lo; r < hi; r++) {"]
            head += [f"        int64_t o{p} = 0;" for p in sorted(strided)]
            head += [f"        double acc{k} = 0;" for k in self.sums.values()]
            head += self._offsets("        ")
            head += [f"      for (int64_t c0 = 0; c0 < {inner}; c0 += {chunk}) {{",
                     f"        const int64_t e = c0 + {chunk} < {inner} ? {chunk} : "
                     f"{inner} - c0;",
                     f"        const int64_t base = r * {inner} + c0;"]
            for p in sorted(strided):
                t = _CTYPE[self.param_dtype[p]]
                head.append(f"        const {t} *q{p} = g{p};")
                head += self._piece(p, "c0", "e", f"g{p}", "        ", in_place=True)
            tail = ["      }"] + [f"        (({_CTYPE[m.dtype]} *)b{self.outputs[m]})[r] = "
                                   f"({_CTYPE[m.dtype]})acc{k};"
                                   for m, k in self.sums.items()] + ["    }"]
            return head, tail
        head = self._runs()
        head += [f"    int64_t {', '.join(f'o{p}' for p in sorted(strided))};",
                 "    for (int64_t r = lo, c0 = 0; r < hi;) {",
                 f"        const int64_t base = r * {inner} + c0;",
                 f"        int64_t e = 0, span = ((rn < hi ? rn : hi) - r) * {inner};"]
        head += self._offsets("        ", declare=False)
        for p in sorted(strided):
            head.append(f"        const {_CTYPE[self.param_dtype[p]]} *q{p} = g{p};")
        head += [f"        if (span - c0 >= {chunk} || span >= {SHORT_RUN}) {{"
                 "   /* a run, or a piece of it */",
                 f"            e = span - c0 < {chunk} ? span - c0 : {chunk};"]
        for p in sorted(strided):
            head += self._piece(p, "c0", "e", f"g{p}", "            ", in_place=True)
        advance = ["r = rn < hi ? rn : hi;", "rn += R;", "c0 = 0;"]
        head += ["            c0 += e;",
                 f"            if (c0 == span) {{ {' '.join(advance)} }}",
                 "        } else {   /* whole short runs side by side */",
                 "            for (;;) {",
                 f"                const int64_t take = span - c0 < {chunk} - e ? "
                 f"span - c0 : {chunk} - e;"]
        for p in sorted(strided):
            head += self._piece(p, "c0", "take", f"g{p} + e", "                ")
        head += ["                e += take;", "                c0 += take;",
                 "                if (c0 < span) break;   /* the step is full */"]
        head += [f"                {x}" for x in advance]
        head += [f"                if (e == {chunk} || r >= hi) break;",
                 f"                span = ((rn < hi ? rn : hi) - r) * {inner};"]
        head += self._offsets("                ", declare=False)
        head += ["            }", "        }"]
        return head, ["    }"]

    def _runs(self):
        """The lines computing R, the rows of a run, and ``rn``, the first run's end
        (see :meth:`_row_head`): dimension d joins the run when every strided input
        steps over it as over d + 1's whole length."""
        strided, shape, rank = self.strided, self.shape, self.rank
        src = ["    int64_t R = 1, whole = 0;"]
        for d in range(rank - 2, -1, -1):
            cond = " && ".join(f"s{p}_{d} == s{p}_{d + 1} * {shape[d + 1]}"
                               for p in sorted(strided))
            src.append(f"    {'    ' * (rank - 2 - d)}if ({cond}) {{")
            src.append(f"    {'    ' * (rank - 1 - d)}"
                       + ("whole = 1;" if d == 0 else f"R *= {shape[d]};"))
        src += ["    " + "    " * d + "}" for d in range(rank - 2, -1, -1)]
        return src + ["    int64_t rn = whole ? hi : (lo / R + 1) * R;  /* a run's end */"]

    def _offsets(self, ind, declare=True):
        """The lines setting each strided input's offset ``o<p>`` of row ``r``."""
        strided, shape, rank = sorted(self.strided), self.shape, self.rank
        if rank < 2 or not strided:
            return []
        src = [] if declare else [f"{ind}o{p} = 0;" for p in strided]
        src.append(f"{ind}{{ int64_t q = r" + (", d;" if rank > 2 else ";"))
        for dim in range(rank - 2, 0, -1):
            src.append(f"{ind}  d = q % {shape[dim]}; q /= {shape[dim]};")
            src += [f"{ind}  o{p} += d * s{p}_{dim};" for p in strided]
        # the first dimension: q itself (its length, which may be symbolic, is not
        # needed)
        src += [f"{ind}  o{p} += q * s{p}_0;" for p in strided]
        return src + [f"{ind}}}"]

    def _piece(self, p, start, count, dst, ind, in_place=False):
        """The lines making ``count`` elements of strided input ``p``'s current row or
        run, from element ``start``, contiguous at ``dst``; ``in_place``: pointing
        ``q<p>`` at them where they already are."""
        t, size, s_ = (_CTYPE[self.param_dtype[p]], self.param_dtype[p].itemsize,
                       f"s{p}_{self.rank - 1}")
        at = f"(const {t} *)(b{p} + o{p}) + {start}"
        first = [f"{ind}    q{p} = {at};"] if in_place else [
            f"{ind}    const {t} *src = {at};",
            f"{ind}    for (int64_t j = 0; j < {count}; j++) ({dst})[j] = src[j];"]
        return [f"{ind}if ({s_} == {size}) {{"] + first + [
            f"{ind}}} else if ({s_} == 0) {{",
            f"{ind}    const {t} w = *(const {t} *)(b{p} + o{p});",
            f"{ind}    for (int64_t j = 0; j < {count}; j++) ({dst})[j] = w;",
            f"{ind}}} else {{",
            f"{ind}    for (int64_t j = 0; j < {count}; j++)",
            f"{ind}        ({dst})[j] = *(const {t} *)(b{p} + o{p} + ({start} + j) * {s_});",
            f"{ind}}}"]

    def _tiles(self, first):
        """The loops over whole tiles from ``first``: one per segment."""
        tile, ix = self.tile, "j" if self.by_rows else "i"
        src = [f"        {t} {name}[{tile}] __attribute__((aligned(64)));"
               for name, t in self.decls.items()]
        src += [f"        int64_t t = {first};",
                f"        for (; t + {tile} <= e; t += {tile}) {{"]
        for body, indexed in self.loop_bodies(self.segments, self.slots):
            src += ["            #pragma omp simd",
                    f"            for (int64_t u = 0; u < {tile}; u++) {{"]
            if indexed:   # it reads an input or writes an output
                src.append(f"                const int64_t {ix} = t + u;")
            src += ["                " + ln for ln in body] + ["            }"]
        src.append("        }")
        return src

    def _fused_loop(self, first):
        """One loop over the elements from ``first``, every member in registers."""
        ix = "j" if self.by_rows else "i"
        fused = self.loop_bodies([list(enumerate(self.members))], {})[0][0]
        accs = ",".join(f"acc{k}" for k in self.sums.values())
        src = ["        #pragma omp simd" + (f" reduction(+:{accs})" if self.sums else ""),
               f"        for (int64_t {ix} = {first}; {ix} < e; {ix}++) {{"]
        return src + ["            " + ln for ln in fused] + ["        }"]

    def python_call(self, cname, pyname):
        """The Python lines calling the function: a comment, then one call, or calls
        by blocks on geon's threads for a large group."""
        members, sums, n, tile = self.members, self.sums, self.n, self.tile
        lines = [f"    # compiled: {len(members) - len(sums)} elementwise ops "
                 + (f"and {len(sums)} sum(s) of their rows " if sums else "")
                 + f"({len(self.g.internal)} without a full buffer) in "
                 + (f"{len(self.segments)} C loops over tiles of {tile} of the {self.size!r} "
                    f"elements " if tile else f"one C loop over {self.size!r} elements ")
                 + f"({cname}{', strided reads' if self.strided else ''})"]
        units = self.rows if self.by_rows else self.size   # the function's range (an
        # expression of the symbols, bound in the calling code, where they are symbolic)
        threads = fusion.MAX_THREADS if n >= PARALLEL_ELEMENTS else 1
        arrays = f"({''.join(f'{a}, ' for a in self.params)})"
        if threads > 1:
            block = max(1, BLOCK_ELEMENTS // (self.inner if self.by_rows else 1))
            lines.append(f"    _run_blocks(lambda _lo, _hi: {pyname}(({arrays}, _lo, "
                         f"_hi)), {units}, {block}, ((),) * {threads})")
        else:
            lines.append(f"    {pyname}(({arrays}, 0, {units}))")
        return lines


#: Names the generated Python of compiled groups uses.
PY_GLOBALS = {"_np_contiguous": np.ascontiguousarray}
