"""CUDA C kernel templates: fused elementwise, reductions, GEMM, and Unslice.

Every kernel is specialized to its shapes and strides, which appear in its source as
constants (index arithmetic by constants is cheap, and bounds checks that a shape makes
unnecessary disappear). Its arguments are pointers only: each is a buffer's base
address plus a byte offset, fixed when the transformer allocates. The kernel's name is
``geon_<kind>_<hash of its source>``, so equal kernels (from any computation) are
compiled once.

Kernels use only what both nvcc and an ordinary C++ compiler with a small shim accept
(no warp intrinsics), so that the test suite's CPU emulator (tests/cuda_emulator.py)
can run them.
"""

import hashlib

import numpy as np

from geon.errors import LoweringError
from geon.op_graph import op_graph as og
from geon.op_graph import primitives as pr
from geon.transformers.codegen_text import check_lines, comment
from geon.transformers.gpu import cuda
from geon.transformers.gpu.cuda import ctype, literal
from geon.transformers.gpu.layout import offset_expr, scalar_constant

#: Threads per block of elementwise and Unslice kernels.
EW_THREADS = 256
#: Elements each elementwise thread handles per loop iteration (loads in flight); a
#: multiple of 4, so that a thread's elements fill whole 16-byte vectors.
EW_ITEMS = 4
#: At most this many blocks; a grid-stride loop covers the rest.
MAX_BLOCKS = 8192
#: Reductions over more than this many elements per output row with few rows are
#: split over several blocks per row (partial results, then a second pass).
SPLIT_LENGTH = 16384
#: Few rows: fewer than this many blocks would be launched without splitting.
SPLIT_BLOCKS = 264


class Kernel:
    """A generated kernel and how to launch it.

    ``source`` is the complete kernel (its name included), made from the lines of its
    ``body`` (each checked by :func:`~geon.transformers.codegen_text.check_lines`);
    ``deps`` are helper definitions it needs besides the prelude (user ops' device
    functions); ``args`` are ``(buffer, byte_offset)`` per parameter; ``grid`` and
    ``block`` are 3-tuples; ``ops`` the ops it computes (for the annotated source).
    """

    def __init__(self, kind, params, body, threads, grid, block, ops, deps=(), note=""):
        self.kind = kind
        decl = ", ".join(params.declarations())
        check_lines(body, "CUDA C")
        body = "".join(line + "\n" for line in body)
        template = (f'extern "C" __global__ void __launch_bounds__({threads}) '
                    f"KERNEL({decl})\n{{\n{body}}}\n")
        digest = hashlib.sha1(("".join(deps) + template).encode()).hexdigest()[:16]
        self.name = f"geon_{kind}_{digest}"
        self.source = template.replace("KERNEL(", self.name + "(", 1)
        self.deps = tuple(deps)
        self.args = params.args()
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        self.block = tuple(block) + (1,) * (3 - len(block))
        self.ops = list(ops)
        self.note = note

    def __repr__(self):
        return f"<Kernel {self.name} grid={self.grid} block={self.block}>"


class Params:
    """The pointer parameters of a kernel: one per distinct (buffer, byte offset, type).

    A pointer is ``__restrict__`` only if no other parameter points into its buffer, so
    an in-place update (an output over one of its inputs) is one plain pointer.
    """

    def __init__(self):
        self._items = []  # [buffer, byte_offset, ctype, written]
        self._index = {}

    def pointer(self, buffer, byte_offset, ct, written=False):
        key = (buffer, byte_offset, ct)
        k = self._index.get(key)
        if k is None:
            k = self._index[key] = len(self._items)
            self._items.append([buffer, byte_offset, ct, written])
        elif written:
            self._items[k][3] = True
        return f"p{k}"

    def declarations(self):
        count = {}
        for buf, _, _, _ in self._items:
            count[buf] = count.get(buf, 0) + 1
        out = []
        for k, (buf, _, ct, written) in enumerate(self._items):
            const = "" if written else "const "
            restrict = " __restrict__" if count[buf] == 1 else ""
            out.append(f"{const}{ct}*{restrict} p{k}")
        return out

    def args(self):
        return [(buf, off) for buf, off, _, _ in self._items]


def _grid_1d(n, per_block):
    return min(max(1, -(-n // per_block)), MAX_BLOCKS)


def _itype(n, layouts=()):
    """``int`` when every index and offset stays far below 2**31, else ``long long``."""
    big = n + MAX_BLOCKS * EW_THREADS * EW_ITEMS
    for lay in layouts:
        span = lay.span()
        if span:
            big = max(big, abs(span[0]) + 1, abs(span[1]) + 1)
    return "int" if big < 2 ** 30 else "long long"


def describe(op):
    """One line about ``op`` for comments (sanitized): its class, name, origin and
    source line."""
    origin = f" <- {op.derived_from}" if op.derived_from else ""
    return comment(f"{type(op).__name__} {op.name}{origin}, {op.file_info}")


# --- fused elementwise ---------------------------------------------------------------

class Fused:
    """Code for a run of elementwise members (ElementWise, Copy, Assign) of one shape,
    evaluated at one row-major element index. ``ctx`` gives buffers and layouts (see
    :class:`geon.transformers.gpu.codegen.Context`). A member's value read by a later
    member (directly or through a view with the same elements in the same order) is a
    register, never reloaded."""

    def __init__(self, ctx, members, internal, params):
        self.ctx, self.members, self.internal = ctx, members, internal
        self.params = params
        self.member_set = set(members)
        self.loads = {}      # (pointer, dims, ctype) -> load number
        self.load_list = []  # [(pointer, dims, ctype)]
        self.load_layouts = []  # the layout of each load
        self.stores = {}     # pointer -> store number
        self.store_list = []  # [(pointer, ctype, layout)]

    def _load(self, a):
        """The load number of the non-member arg ``a``."""
        lay = self.ctx.layout(a)
        ptr = self.ctx.pointer(self.params, lay)
        key = (ptr, tuple(lay.dims()), ctype(a.dtype))
        k = self.loads.get(key)
        if k is None:
            k = self.loads[key] = len(self.load_list)
            self.load_list.append(key)
            self.load_layouts.append(lay)
        return k

    def plan_loads(self):
        for m in self.members:
            for a in m.args:
                if self.ctx.source(a) in self.member_set or scalar_constant(self.ctx.root(a)):
                    continue
                if isinstance(m, pr.Assign) and a is m.args[0]:
                    continue
                self._load(a)

    def plan_stores(self):
        """Number the pointers the members store to (``store_list``, in order): an
        assignment's target, and every member whose value is not only a register."""
        for m in self.members:
            if isinstance(m, pr.Assign):
                lay = self.ctx.layout(m.args[0])
            elif m not in self.internal:
                lay = self.ctx.layout(m)
            else:
                continue
            ptr = self.ctx.pointer(self.params, lay, written=True)
            if ptr not in self.stores:
                self.stores[ptr] = len(self.store_list)
                self.store_list.append((ptr, ctype(lay.root.dtype), lay))

    def load_lines(self, index, target):
        """``target(k)``: the C lvalue of load ``k``; one line per load at ``index``."""
        return [f"{target(k)} = {ptr}[{offset_expr(dims, index)}];"
                for k, (ptr, dims, _) in enumerate(self.load_list)]

    def compute_lines(self, index, loaded, store=None):
        """Lines computing every member at ``index`` and storing the ones with a
        buffer; ``loaded(k)`` is the C expression of load ``k``; ``store(ptr, value)``
        the C statement storing ``value`` through pointer ``ptr`` (default: at
        ``index``)."""
        lines, var = [], {}
        if store is None:
            def store(ptr, value):
                return f"{ptr}[{index}] = {value};"

        def arg_expr(a, want):
            src = self.ctx.source(a)  # a member read element for element: its register
            if src in var:
                expr, dt = var[src], src.dtype
            else:
                root = self.ctx.root(a)
                if scalar_constant(root):
                    return literal(root.scalar, want)
                lay = self.ctx.layout(a)
                ptr = self.ctx.pointer(self.params, lay)
                expr = loaded(self.loads[(ptr, tuple(lay.dims()), ctype(a.dtype))])
                dt = a.dtype
            return expr if dt == want else f"(({ctype(want)}){expr})"

        for k, m in enumerate(self.members):
            if isinstance(m, pr.Assign):
                target, value = m.args
                ptr = self.ctx.pointer(self.params, self.ctx.layout(target), written=True)
                lines.append(f"{store(ptr, arg_expr(value, target.dtype))}"
                             f"  // Assign to {comment(target.name)}")
                continue
            cdt = cuda.compute_dtype(m)
            rule = self.ctx.rule(m)
            args = [arg_expr(a, cdt) for a in m.args]
            expr = rule(m, args, ctype(cdt))
            v = f"v{k}"
            out_t = ctype(m.dtype)
            if isinstance(m, og.Comparison) or (m.dtype != cdt):
                expr = f"({out_t})({expr})"
            lines.append(f"const {out_t} {v} = {expr};  // {comment(type(m).__name__)}")
            var[m] = v
            if m not in self.internal:
                ptr = self.ctx.pointer(self.params, self.ctx.layout(m), written=True)
                lines.append(store(ptr, v))
        return lines


def vector_width(f):
    """Elements per 16-byte vector for the fused group ``f`` (its loads and stores
    planned), or 0 for scalar accesses. Vectors need every load and store contiguous in
    the kernel's element order, starting 16-byte aligned (device allocations are
    256-byte aligned, so the byte offset decides), and one element size of 4 or 8
    bytes, so that one vector number covers the same elements of every operand."""
    accesses = [(lay, lay.root.dtype) for lay in f.load_layouts]
    accesses += [(lay, lay.root.dtype) for _, _, lay in f.store_list]
    sizes = {dt.itemsize for _, dt in accesses}
    if len(sizes) != 1 or not sizes <= {4, 8}:
        return 0
    for lay, dt in accesses:
        if not lay.contiguous or (lay.offset * dt.itemsize) % 16:
            return 0
    return 16 // sizes.pop()


def _unrolled(U, it, index, lines, checked, pad):
    """``lines`` in an unrolled loop over ``u < U`` with ``i = index`` (checked:
    only where ``i < n``), indented by ``pad``."""
    out = ["#pragma unroll",
           f"{pad}for (int u = 0; u < {U}; ++u) {{",
           f"{pad}    const {it} i = {index};"]
    if checked:
        out.append(f"{pad}    if (i < n) {{")
        out.extend(f"{pad}        {ln}" for ln in lines)
        out.append(f"{pad}    }}")
    else:
        out.extend(f"{pad}    {ln}" for ln in lines)
    out.append(f"{pad}}}")
    return out


def _scalar_tile(f, it, base, checked, pad):
    """A tile in which this thread takes elements ``base + u * EW_THREADS``: every load,
    then every member, each with a check ``i < n`` if ``checked``."""
    T, U = EW_THREADS, EW_ITEMS
    lines = [f"{pad}{ct} x{k}[{U}];" for k, (_, _, ct) in enumerate(f.load_list)]
    if f.load_list:
        lines += _unrolled(U, it, f"{base} + u * {T}",
                           f.load_lines("i", lambda k: f"x{k}[u]"), checked, pad)
    lines += _unrolled(U, it, f"{base} + u * {T}",
                       f.compute_lines("i", lambda k: f"x{k}[u]"), checked, pad)
    return lines


def _vector_tile(f, it, start, V, pad):
    """A whole tile from element ``start`` in 16-byte vectors of ``V`` elements: this
    thread's vectors are ``w * EW_THREADS + threadIdx.x`` (adjacent threads, adjacent
    vectors) for ``w < EW_ITEMS / V``; every load, then every member."""
    T, U = EW_THREADS, EW_ITEMS
    W = U // V
    first = f"const {it} e = {start} + (w * {T} + ({it})threadIdx.x) * {V};"
    lines = [f"{pad}geon_vec<{ct}> x{k}[{W}];" for k, (_, _, ct) in enumerate(f.load_list)]
    if f.load_list:
        lines += ["#pragma unroll", f"{pad}for (int w = 0; w < {W}; ++w) {{",
                  f"{pad}    {first}"]
        lines += [f"{pad}    x{k}[w] = geon_load_vec({ptr} + e);"
                  for k, (ptr, _, _) in enumerate(f.load_list)]
        lines.append(f"{pad}}}")
    lines += ["#pragma unroll", f"{pad}for (int w = 0; w < {W}; ++w) {{", f"{pad}    {first}"]
    lines += [f"{pad}    geon_vec<{ct}> y{j};" for j, (_, ct, _) in enumerate(f.store_list)]
    compute = f.compute_lines("e + u", lambda k: f"x{k}[w].v[u]",
                              lambda ptr, value: f"y{f.stores[ptr]}.v[u] = {value};")
    lines += ["#pragma unroll", f"{pad}    for (int u = 0; u < {V}; ++u) {{"]
    lines += [f"{pad}        {ln}" for ln in compute]
    lines.append(f"{pad}    }}")
    lines += [f"{pad}    geon_store_vec({ptr} + e, y{j});"
              for j, (ptr, _, _) in enumerate(f.store_list)]
    lines.append(f"{pad}}}")
    return lines


def elementwise_kernel(ctx, members, internal):
    """One kernel for a fused group (or a single elementwise op), in tiles of
    ``EW_THREADS * EW_ITEMS`` elements, :data:`EW_ITEMS` per thread with all loads
    first (so that they are in flight together). Whole tiles run in a grid-stride loop
    without bounds checks; the last, partial tile (if any) is the last block's, checked
    element by element. Whole tiles move in 16-byte vectors, each thread taking
    consecutive elements, where :func:`vector_width` allows; otherwise thread ``t``
    of a tile takes its elements ``t, t + EW_THREADS, ...``."""
    shape = _shape_of(members[0])
    n = int(np.prod(shape, dtype=np.int64))
    params = Params()
    f = Fused(ctx, members, internal, params)
    f.plan_loads()
    f.plan_stores()
    lays = [ctx.layout(a) for m in members for a in m.args]
    it = _itype(n, lays)
    T, U = EW_THREADS, EW_ITEMS
    whole = n - n % (T * U)
    V = vector_width(f) if whole else 0
    body = []
    if whole and V:
        body.append(f"    // whole tiles of {T * U} elements, unchecked, in 16-byte vectors of "
                    f"{V} elements: a thread")
        body.append(f"    // takes {U // V} vector(s) per operand, adjacent threads adjacent "
                    f"vectors")
        body.append(f"    for ({it} start = ({it})blockIdx.x * {T * U}; start < {whole}; "
                    f"start += ({it})gridDim.x * {T * U}) {{")
        body += _vector_tile(f, it, "start", V, " " * 8)
        body.append("    }")
    elif whole:
        body.append(f"    // whole tiles of {T * U} elements, unchecked: a thread's {U} "
                    f"elements are {T} apart")
        body.append(f"    for ({it} base = ({it})blockIdx.x * {T * U} + ({it})threadIdx.x; "
                    f"base < {whole}; base += ({it})gridDim.x * {T * U}) {{")
        body += _scalar_tile(f, it, "base", False, " " * 8)
        body.append("    }")
    if whole < n:
        body.append(f"    // the last, partial tile ({n - whole} elements): the last block's, "
                    f"checked")
        body.append("    if (blockIdx.x == gridDim.x - 1) {")
        body.append(f"        const {it} n = {n};")
        body.append(f"        const {it} base = ({it}){whole} + ({it})threadIdx.x;")
        body += _scalar_tile(f, it, "base", True, " " * 8)
        body.append("    }")
    deps = ctx.deps_of(members)
    access = f"16-byte vectors of {V}" if V else "scalar"
    return Kernel("ew", params, body, T, (_grid_1d(n, T * U),), (T,),
                  members, deps=deps, note=f"{len(members)} elementwise op(s) over "
                                           f"{n} elements, {access}")


def _shape_of(m):
    return m.args[0].axes.shape if isinstance(m, pr.Assign) else m.axes.shape


# --- reductions ------------------------------------------------------------------------

def _reduce_init(cls, dt):
    if cls in (pr.ReduceSum,):
        return literal(0, dt)
    if cls in (pr.ReduceProd,):
        return literal(1, dt)
    maxlike = cls in (pr.ReduceMax, pr.ReduceArgMax)
    if dt.kind == "f":
        return literal(-np.inf if maxlike else np.inf, dt)
    info = np.iinfo(dt) if dt.kind in "iu" else None
    if info is None:  # bool
        return "false" if maxlike else "true"
    return literal(info.min if maxlike else info.max, dt)


def _combine(cls, T, a, b):
    """C expression combining partial values ``a`` and ``b``."""
    if cls is pr.ReduceSum:
        return f"{a} + {b}"
    if cls is pr.ReduceProd:
        return f"{a} * {b}"
    if cls is pr.ReduceMax:
        return f"geon_max<{T}>({a}, {b})"
    return f"geon_min<{T}>({a}, {b})"


def _better(cls, dt, v, i, bv, bi):
    """C condition: candidate ``(v, i)`` beats the best so far ``(bv, bi)`` (NumPy's
    argmax / argmin: the first extreme, a NaN being the most extreme)."""
    cmp = ">" if cls is pr.ReduceArgMax else "<"
    if dt.kind == "f":
        return (f"(({v}) != ({v})) ? (({bv}) == ({bv}) || {i} < {bi}) : "
                f"(({bv}) == ({bv}) && (({v}) {cmp} ({bv}) || (({v}) == ({bv}) && "
                f"{i} < {bi})))")
    return f"({v}) {cmp} ({bv}) || (({v}) == ({bv}) && {i} < {bi})"


class ReduceSpec:
    """A reduction of ``R`` rows of ``L`` elements each.

    ``value(r, k, lines)`` appends lines computing element ``(r, k)`` and returns
    ``(expression, index expression)``; ``lanes_on_k`` says whether adjacent threads
    should take adjacent ``k`` (the contiguous direction) or adjacent rows.
    """

    def __init__(self, cls, dt, R, L, lanes_on_k):
        self.cls, self.dt, self.R, self.L = cls, np.dtype(dt), R, L
        self.lanes_on_k = lanes_on_k
        self.arg = cls in (pr.ReduceArgMax, pr.ReduceArgMin)


def reduce_config(spec):
    """``(TX, TY, P, chunk)``: threads along the fast direction and across, the number
    of parts each row is split into and the elements per part."""
    R, L = spec.R, spec.L
    if spec.lanes_on_k:
        TX = 32 if L <= 256 else 128 if L <= 2048 else 256
        TY = 256 // TX
        blocks = -(-R // TY)
        per = TX * 16
    else:
        TX, TY = 32, 8
        blocks = -(-R // TX)
        per = TY * 256
    P = 1
    if L > SPLIT_LENGTH and blocks < SPLIT_BLOCKS:
        P = max(2, min(-(-L // per), max(1, 1024 // blocks)))
    step = TX if spec.lanes_on_k else TY
    chunk = -(-L // P)
    chunk = -(-chunk // step) * step
    P = max(1, -(-L // chunk)) if L else 1
    return TX, TY, P, chunk


def reduce_kernel(spec, params, value, out, out_index=None, ops=(), deps=(), part=None,
                  extent=0, out_value=None):
    """The kernel of ``spec``. ``value(r, k, lines)`` as in :class:`ReduceSpec`;
    ``out`` the pointer of the results (``out_index`` the pointer of the partial
    indices of an arg reduction's first pass; ``out_value`` that of the extreme values
    an arg reduction may also give, and then ``out`` may be ``None``); ``part`` is
    ``(P, chunk)`` of a first pass (results go to ``out[r * P + part]``), ``None`` for
    a direct reduction."""
    cls, dt, R, L = spec.cls, spec.dt, spec.R, spec.L
    T = ctype(dt)
    TX, TY, P, chunk = reduce_config(spec)
    if part is None:
        P, chunk = 1, max(L, 1)
    else:
        P, chunk = part
    lanes_k = spec.lanes_on_k
    threads = TX * TY
    it = "long long" if max(R * max(L, 1), extent) >= 2 ** 30 else "int"
    body = [f"    __shared__ {T} sv[{TY}][{TX}];"]
    if spec.arg:
        body.append(f"    __shared__ long long si[{TY}][{TX}];")
    body.append("    const int tx = threadIdx.x, ty = threadIdx.y;")
    if lanes_k:
        body.append(f"    const {it} r = ({it})blockIdx.x * {TY} + ty;")
        kstart, kstep = "tx", TX
    else:
        body.append(f"    const {it} r = ({it})blockIdx.x * {TX} + tx;")
        kstart, kstep = "ty", TY
    body.append(f"    const {it} k0 = ({it})blockIdx.y * {chunk};")
    body.append(f"    const {it} k1 = k0 + {chunk} < {L} ? k0 + {chunk} : {L};")
    body.append(f"    {T} acc = {_reduce_init(cls, dt)};")
    if spec.arg:
        body.append("    long long ai = 9223372036854775807ll;")
    body.append(f"    if (r < {R}) {{")
    body.append(f"        for ({it} k = k0 + {kstart}; k < k1; k += {kstep}) {{")
    lines = []
    expr, idx = value("r", "k", lines)
    body.extend("            " + ln for ln in lines)
    if spec.arg:
        body.append(f"            const {T} v = {expr};")
        body.append(f"            const long long vi = {idx};")
        body.append(f"            if ({_better(cls, dt, 'v', 'vi', 'acc', 'ai')}) "
                    f"{{ acc = v; ai = vi; }}")
    else:
        body.append(f"            acc = {_combine(cls, T, 'acc', expr)};")
    body.append("        }")
    body.append("    }")
    body.append("    sv[ty][tx] = acc;")
    if spec.arg:
        body.append("    si[ty][tx] = ai;")
    body.append("    __syncthreads();")
    if lanes_k:
        lane, width, me, other = "tx", TX, "sv[ty][tx]", "sv[ty][tx + s]"
        mi, oi = "si[ty][tx]", "si[ty][tx + s]"
    else:
        lane, width, me, other = "ty", TY, "sv[ty][tx]", "sv[ty + s][tx]"
        mi, oi = "si[ty][tx]", "si[ty + s][tx]"
    body.append(f"    for (int s = {width // 2}; s > 0; s >>= 1) {{")
    body.append(f"        if ({lane} < s) {{")
    if spec.arg:
        body.append(f"            if ({_better(cls, dt, other, oi, me, mi)}) "
                    f"{{ {me} = {other}; {mi} = {oi}; }}")
    else:
        body.append(f"            {me} = {_combine(cls, T, me, other)};")
    body.append("        }")
    body.append("        __syncthreads();")
    body.append("    }")
    first = "sv[ty][0]" if lanes_k else "sv[0][tx]"
    first_i = "si[ty][0]" if lanes_k else "si[0][tx]"
    body.append(f"    if ({lane} == 0 && r < {R}) {{")
    slot = "r" if part is None else f"r * {P} + blockIdx.y"
    if spec.arg and part is None:
        if out is not None:
            body.append(f"        {out}[r] = {first_i};")
        if out_value is not None:
            body.append(f"        {out_value}[r] = {first};")
    else:
        body.append(f"        {out}[{slot}] = {first};")
        if spec.arg:
            body.append(f"        {out_index}[{slot}] = {first_i};")
    body.append("    }")
    grid_x = -(-R // TY) if lanes_k else -(-R // TX)
    block = (TX, TY)
    kind = "reduce" if part is None else "reduce_part"
    note = (f"{cls.__name__} of {R} row(s) of {L}" if part is None else
            f"{cls.__name__}, first pass: {R} row(s) of {L} in {P} parts")
    return Kernel(kind, params, body, threads, (grid_x, P), block, ops,
                  deps=deps, note=note)


# --- GEMM ----------------------------------------------------------------------------

#: (BM, BN, BK, TM, TN): tile of C per block, K step, and C elements per thread
#: (in groups of 4 rows / 4 columns spread over the tile, so that shared-memory reads
#: of a warp are conflict free). 256 threads each.
GEMM_LARGE = (128, 128, 8, 8, 8)
GEMM_SMALL = (64, 64, 8, 4, 4)


#: At most this many blocks along the grid's z dimension, which runs over the batch of a
#: batched product (a longer batch is looped over by each block).
GEMM_BATCH_BLOCKS = 65535


def gemm_config(M, N, K, dt, batch=1):
    if np.dtype(dt) == np.float32 and -(-M // 128) * -(-N // 128) * batch >= 132:
        return GEMM_LARGE
    return GEMM_SMALL


def batch_offsets(batch, index="bz"):
    """C expressions of the element offsets of A, B and C for the batch index ``index``
    (row-major over ``batch``: ``[(length, stride of A, of B, of C)]``)."""
    terms = ([], [], [])
    inner = 1
    for pos in range(len(batch) - 1, -1, -1):
        n, *strides = batch[pos]
        q = index if inner == 1 else f"({index} / {inner}LL)"
        if pos > 0:
            q = f"({q} % {n}LL)"
        for t, st in zip(terms, strides):
            if st:
                t.append(q if st == 1 else f"{q} * {st}LL")
        inner *= n
    return tuple(" + ".join(reversed(t)) or "0" for t in terms)


def gemm_kernel(params, a, b, c, M, N, K, sa, sb, dt, vec_a, vec_b, vec_c, ops, cfg=None,
                batch=()):
    """``C (M, N) = A (M, K) @ B (K, N)``: ``a``, ``b``, ``c`` are pointer names, ``sa`` =
    (row stride, column stride) of A and ``sb`` of B, in elements; C is row-major.
    ``vec_*``: float4 accesses are allowed (contiguous direction, 16-byte alignment and
    whole tiles were checked by the caller). Tiles of A and B go through shared memory,
    double buffered: the next tile's global loads are issued before the current tile is
    used.

    ``batch``: ``[(length, stride of A, of B, of C)]`` (elements; a stride of 0 is a
    broadcast) for a batched product, one product per batch index: the grid's z
    dimension runs over the batch (each block loops where the batch has more than
    :data:`GEMM_BATCH_BLOCKS` indices)."""
    dt = np.dtype(dt)
    T = ctype(dt)
    count = 1
    for n, *_ in batch:
        count *= n
    BM, BN, BK, TM, TN = cfg or gemm_config(M, N, K, dt, count)
    threads = 256
    GM, GN = TM // 4, TN // 4          # groups of 4 rows / columns per thread
    even_m, even_n, even_k = M % BM == 0, N % BN == 0, K % BK == 0
    vec = dt == np.float32
    sam, sak = sa
    sbk, sbn = sb
    # Which direction of each tile adjacent threads load (the one with the smaller
    # stride, for coalescing).
    a_fast_k = abs(sak) <= abs(sam) if M > 1 else True
    b_fast_n = abs(sbn) <= abs(sbk) if K > 1 else True
    vec_a = vec_a and vec and even_m and even_k
    vec_b = vec_b and vec and even_n and even_k
    vec_c = vec_c and vec and even_m and even_n
    it = "long long" if max(M * max(abs(sam), 1), K * max(abs(sak), abs(sbk), 1),
                            N * max(abs(sbn), 1), M * N) >= 2 ** 30 else "int"
    L = []
    L.append(f"    __shared__ __align__(16) {T} As[2][{BK}][{BM + 4}];")
    L.append(f"    __shared__ __align__(16) {T} Bs[2][{BK}][{BN + 4}];")
    head = len(L)
    if batch:  # this batch index's matrices, through pointers of the same names
        oa, ob, oc = batch_offsets(batch)
        outer = (a, b, c)
        a, b, c = "ga", "gb", "gc"
    L.append("    const int tid = threadIdx.x;")
    L.append(f"    const int tx = tid % {BN // TN}, ty = tid / {BN // TN};")
    tiles_m, tiles_n = -(-M // BM), -(-N // BN)
    swap = tiles_m > 65535  # gridDim.y is at most 65535; gridDim.x far more
    if swap and tiles_n > 65535:
        raise LoweringError(f"Gemm ({M} x {K}) @ ({K} x {N}) is too large for one launch")
    my, nx = ("x", "y") if swap else ("y", "x")
    L.append(f"    const {it} m0 = ({it})blockIdx.{my} * {BM}, n0 = ({it})blockIdx.{nx} * {BN};")
    L.append(f"    {T} acc[{TM}][{TN}];")
    L.append("#pragma unroll")
    L.append(f"    for (int i = 0; i < {TM}; ++i) {{")
    L.append("#pragma unroll")
    L.append(f"        for (int j = 0; j < {TN}; ++j) {{ acc[i][j] = {literal(0, dt)}; }}")
    L.append("    }")

    def load_plan(rows, cols, fast_cols, vector):
        """Per thread: ``[(row expr, col expr)]`` of a rows x cols tile, adjacent
        threads along ``cols`` if ``fast_cols``; vector: float4 along the fast side."""
        total = rows * cols // (4 if vector else 1)
        per = -(-total // threads)
        out = []
        for j in range(per):
            e = f"(tid + {j * threads})"
            guard = None if (j + 1) * threads <= total else f"{e} < {total}"
            if fast_cols:
                w = cols // 4 if vector else cols
                r, c = f"({e} / {w})", (f"({e} % {w}) * 4" if vector else f"({e} % {w})")
            else:
                w = rows // 4 if vector else rows
                r, c = (f"({e} % {w}) * 4" if vector else f"({e} % {w})"), f"({e} / {w})"
            out.append((r, c, guard))
        return out

    # A tile: rows m (BM), cols k (BK); B tile: rows k (BK), cols n (BN)
    plan_a = load_plan(BM, BK, a_fast_k, vec_a)
    plan_b = load_plan(BK, BN, b_fast_n, vec_b)
    na = len(plan_a) * (4 if vec_a else 1)
    nb = len(plan_b) * (4 if vec_b else 1)
    L.append(f"    {T} ra[{na}];")
    L.append(f"    {T} rb[{nb}];")

    def emit_loads(which):
        out = []
        if which == "a":
            plan, v, reg, ptr = plan_a, vec_a, "ra", a
            s_r, s_c, base_r, base_c = sam, sak, "m0", "kt"
            lim_r, lim_c, ev_r, ev_c = M, K, even_m, even_k
        else:
            plan, v, reg, ptr = plan_b, vec_b, "rb", b
            s_r, s_c, base_r, base_c = sbk, sbn, "kt", "n0"
            lim_r, lim_c, ev_r, ev_c = K, N, even_k, even_n
        for j, (r, c, guard) in enumerate(plan):
            row, col = f"({base_r} + {r})", f"({base_c} + {c})"
            pre = f"if ({guard}) " if guard else ""
            if v:
                addr = f"{row} * {s_r} + {col} * {s_c}"
                out.append(f"{pre}{{ const float4 q = *reinterpret_cast<const float4*>("
                           f"{ptr} + {addr}); {reg}[{4 * j}] = q.x; {reg}[{4 * j + 1}] = q.y; "
                           f"{reg}[{4 * j + 2}] = q.z; {reg}[{4 * j + 3}] = q.w; }}")
                continue
            conds = []
            if not ev_r:
                conds.append(f"{row} < {lim_r}")
            if not ev_c:
                conds.append(f"{col} < {lim_c}")
            addr = f"{ptr}[{row} * {s_r} + {col} * {s_c}]"
            if conds:
                val = f"({' && '.join(conds)}) ? {addr} : {literal(0, dt)}"
            else:
                val = addr
            out.append(f"{pre}{{ {reg}[{j}] = {val}; }}")
        return out

    def emit_stores(which, buf):
        out = []
        if which == "a":
            plan, v, reg, tile, fast_c = plan_a, vec_a, "ra", "As", a_fast_k
        else:
            plan, v, reg, tile, fast_c = plan_b, vec_b, "rb", "Bs", b_fast_n
        for j, (r, c, guard) in enumerate(plan):
            pre = f"if ({guard}) " if guard else ""
            if v:
                for q in range(4):
                    rr, cc = (r, f"{c} + {q}") if fast_c else (f"{r} + {q}", c)
                    out.append(f"{pre}{_tile_store(which, tile, buf, rr, cc)} = {reg}[{4 * j + q}];")
            else:
                out.append(f"{pre}{_tile_store(which, tile, buf, r, c)} = {reg}[{j}];")
        return out

    L.append(f"    {it} kt = 0;")
    L.extend("    " + ln for ln in emit_loads("a") + emit_loads("b"))
    L.extend("    " + ln for ln in emit_stores("a", "0") + emit_stores("b", "0"))
    L.append("    __syncthreads();")
    L.append(f"    const int tiles = {-(-K // BK)};")
    L.append("    for (int t = 0; t < tiles; ++t) {")
    L.append("        const int cur = t & 1;")
    L.append("        if (t + 1 < tiles) {")
    L.append(f"            kt = ({it})(t + 1) * {BK};")
    L.extend("            " + ln for ln in emit_loads("a") + emit_loads("b"))
    L.append("        }")
    L.append("#pragma unroll")
    L.append(f"        for (int kk = 0; kk < {BK}; ++kk) {{")
    L.append(f"            {T} fa[{TM}], fb[{TN}];")
    for g in range(GM):
        base = f"{g * (BM // GM)} + ty * 4"
        if vec:
            L.append(f"            {{ const float4 q = *reinterpret_cast<const float4*>("
                     f"&As[cur][kk][{base}]); fa[{4 * g}] = q.x; fa[{4 * g + 1}] = q.y; "
                     f"fa[{4 * g + 2}] = q.z; fa[{4 * g + 3}] = q.w; }}")
        else:
            for q in range(4):
                L.append(f"            fa[{4 * g + q}] = As[cur][kk][{base} + {q}];")
    for g in range(GN):
        base = f"{g * (BN // GN)} + tx * 4"
        if vec:
            L.append(f"            {{ const float4 q = *reinterpret_cast<const float4*>("
                     f"&Bs[cur][kk][{base}]); fb[{4 * g}] = q.x; fb[{4 * g + 1}] = q.y; "
                     f"fb[{4 * g + 2}] = q.z; fb[{4 * g + 3}] = q.w; }}")
        else:
            for q in range(4):
                L.append(f"            fb[{4 * g + q}] = Bs[cur][kk][{base} + {q}];")
    L.append("#pragma unroll")
    L.append(f"            for (int i = 0; i < {TM}; ++i) {{")
    L.append("#pragma unroll")
    L.append(f"                for (int j = 0; j < {TN}; ++j) {{ acc[i][j] += fa[i] * fb[j]; }}")
    L.append("            }")
    L.append("        }")
    L.append("        if (t + 1 < tiles) {")
    L.extend("            " + ln for ln in emit_stores("a", "cur ^ 1") + emit_stores("b", "cur ^ 1"))
    L.append("        }")
    L.append("        __syncthreads();")
    L.append("    }")
    # epilogue: C[m][n], row-major with leading dimension N
    for gi in range(GM):
        for qi in range(4):
            i = 4 * gi + qi
            L.append(f"    {{ const {it} m = m0 + {gi * (BM // GM)} + ty * 4 + {qi};")
            if not even_m:
                L.append(f"      if (m < {M}) {{")
            for gj in range(GN):
                n_expr = f"n0 + {gj * (BN // GN)} + tx * 4"
                if vec_c:
                    L.append(f"        *reinterpret_cast<float4*>({c} + m * {N} + {n_expr}) = "
                             f"make_float4(acc[{i}][{4 * gj}], acc[{i}][{4 * gj + 1}], "
                             f"acc[{i}][{4 * gj + 2}], acc[{i}][{4 * gj + 3}]);")
                    continue
                for qj in range(4):
                    j = 4 * gj + qj
                    if even_n:
                        L.append(f"        {c}[m * {N} + {n_expr} + {qj}] = acc[{i}][{j}];")
                    else:
                        L.append(f"        if ({n_expr} + {qj} < {N}) {{ "
                                 f"{c}[m * {N} + {n_expr} + {qj}] = acc[{i}][{j}]; }}")
            if not even_m:
                L.append("      }")
            L.append("    }")
    grid = (tiles_m, tiles_n) if swap else (tiles_n, tiles_m)
    note = f"Gemm ({M} x {K}) @ ({K} x {N}), tiles {BM} x {BN} x {BK}, {TM} x {TN} per thread"
    if batch:
        gz = min(count, GEMM_BATCH_BLOCKS)
        # Every thread of a block runs the same batch indices: the tile loop's
        # __syncthreads() stay uniform, and its last one ends all reads of shared
        # memory before the next index stores its first tiles.
        L[head:] = ([f"    for (long long bz = blockIdx.z; bz < {count}LL; bz += {gz}LL) {{",
                     f"    const {T}* ga = {outer[0]} + {oa};",
                     f"    const {T}* gb = {outer[1]} + {ob};",
                     f"    {T}* gc = {outer[2]} + {oc};"]
                    + ["    " + ln if ln.startswith("    ") else ln for ln in L[head:]]
                    + ["    }"])
        grid = grid + (gz,)
        note = f"{count} x " + note
    return Kernel("gemm", params, L, threads, grid, (threads,), ops, note=note)


def _tile_store(which, tile, buf, r, c):
    # Both tiles are stored k-major: As[k][m], Bs[k][n].
    if which == "a":
        return f"{tile}[{buf}][{c}][{r}]"
    return f"{tile}[{buf}][{r}][{c}]"


# --- Unslice -------------------------------------------------------------------------

def unslice_kernel(params, op, out, src, src_lay, ops):
    """Zeros of ``op``'s shape with the arg written at ``op.key``: one thread per
    output element, which finds the arg element it receives, if any."""
    shape = op.axes.shape
    n = int(np.prod(shape, dtype=np.int64))
    T = ctype(op.dtype)
    it = _itype(n, [src_lay])
    lines = [f"    const {it} n = {n};",
             f"    for ({it} i = ({it})blockIdx.x * {EW_THREADS} + ({it})threadIdx.x; "
             f"i < n; i += ({it})gridDim.x * {EW_THREADS}) {{",
             f"        {T} v = {literal(0, op.dtype)};",
             "        bool inside = true;",
             f"        {it} src = 0;"]
    inner = 1
    strides = list(src_lay.strides)
    sdim = len(strides)
    parts = []
    for d in range(len(shape) - 1, -1, -1):
        parts.append((d, inner))
        inner *= shape[d]
    kept = [d for d, k in enumerate(op.key) if isinstance(k, slice)]
    stride_of = {d: strides[j] for j, d in enumerate(kept)} if len(kept) == sdim else {}
    for d, inner_d in reversed(parts):
        k = op.key[d]
        idx = f"((i / {inner_d}) % {shape[d]})" if inner_d != 1 else f"(i % {shape[d]})"
        if isinstance(k, slice):
            start, stop, step = k.indices(shape[d])
            count = len(range(start, stop, step))
            lines.append(f"        {{ const {it} j = {idx} - {start};")
            lines.append(f"          if (j % {step} != 0 || j / {step} < 0 || "
                         f"j / {step} >= {count}) {{ inside = false; }}")
            lines.append(f"          else {{ src += (j / {step}) * {stride_of.get(d, 0)}; }} }}")
        else:
            kk = int(k) % shape[d] if shape[d] else 0
            lines.append(f"        if ({idx} != {kk}) {{ inside = false; }}")
    lines.append(f"        if (inside) {{ v = {src}[src]; }}")
    lines.append(f"        {out}[i] = v;")
    lines.append("    }")
    return Kernel("unslice", params, lines, EW_THREADS,
                  (_grid_1d(n, EW_THREADS),), (EW_THREADS,), ops,
                  note=f"Unslice into {shape}")


# --- transposing copy ----------------------------------------------------------------

def transpose_kernel(params, op, out, src, R, C, sr, sc, ops):
    """A copy whose source is a transpose (element ``(r, c)`` of the row-major (R, C)
    result is ``src[r * sr + c * sc]`` with ``sr`` the smaller stride): 32 x 32 tiles
    through shared memory (one row of padding against bank conflicts), so that both the
    reads and the writes are coalesced."""
    T = ctype(op.dtype)
    it = "long long" if max(R * C, R * abs(sr) + C * abs(sc)) >= 2 ** 30 else "int"
    lines = [f"    __shared__ {T} tile[32][33];",
             "    const int tx = threadIdx.x, ty = threadIdx.y;",
             f"    const {it} r0 = ({it})blockIdx.y * 32, c0 = ({it})blockIdx.x * 32;",
             "    for (int j = ty; j < 32; j += 8) {",
             f"        const {it} r = r0 + tx, c = c0 + j;",
             f"        if (r < {R} && c < {C}) {{ tile[j][tx] = {src}[r * {sr} + c * {sc}]; }}",
             "    }",
             "    __syncthreads();",
             "    for (int j = ty; j < 32; j += 8) {",
             f"        const {it} r = r0 + j, c = c0 + tx;",
             f"        if (r < {R} && c < {C}) {{ {out}[r * {C} + c] = tile[tx][j]; }}",
             "    }"]
    grid = (-(-C // 32), -(-R // 32))
    if grid[1] > 65535:
        raise LoweringError(f"a transposing copy of {R} x {C} is too large for one launch")
    return Kernel("transpose", params, lines, 256, grid, (32, 8), ops,
                  note=f"Copy of a transpose, {R} x {C}")


# --- indexing by an integer tensor, scans and sorts: one thread per element ------------

def _elements(n, it):
    """The opening lines of a grid-stride loop over ``n`` elements (index ``i``)."""
    return [f"    const {it} n = {n};",
            f"    for ({it} i = ({it})blockIdx.x * {EW_THREADS} + ({it})threadIdx.x; "
            f"i < n; i += ({it})gridDim.x * {EW_THREADS}) {{"]


def _coords(shape, it, names=None):
    """Lines computing the row-major coordinates of ``i`` in ``shape``, named ``names``
    (default ``i0, i1, ...``)."""
    names = names or [f"i{d}" for d in range(len(shape))]
    lines, step = [], 1
    for d in range(len(shape) - 1, -1, -1):
        lines.append(f"        const {it} {names[d]} = (i / {step}) % {shape[d]};")
        step *= shape[d]
    return lines[::-1]


def _at(lay, coords, it):
    """The element offset of coordinates ``coords`` (C expressions) in ``lay``."""
    terms = [f"({it})({c}) * {s}" for c, s in zip(coords, lay.strides) if s != 0]
    return " + ".join(terms) or "0"


def _index_lines(idx, idx_lay, j, n, it):
    """``k``: the index read at position ``j`` of the index vector, negative ones
    counted from the end and the rest clamped to ``[0, n)`` (no access outside)."""
    return [f"        {it} k = ({it}){idx}[{_at(idx_lay, [j], it)}];",
            f"        if (k < 0) {{ k += {n}; }}",
            f"        k = k < 0 ? 0 : (k >= {n} ? {n - 1} : k);"]


def take_kernel(params, op, out, src, src_lay, idx, idx_lay, ops):
    """``out[o, j, ...] = src[o, idx[j], ...]``."""
    shape = op.axes.shape
    n = int(np.prod(shape, dtype=np.int64))
    it = _itype(n, [src_lay, idx_lay])
    lines = _elements(n, it) + _coords(shape, it)
    lines += _index_lines(idx, idx_lay, "i1", src_lay.shape[1], it)
    coords = ["i0", "k"] + [f"i{d}" for d in range(2, len(shape))]
    lines.append(f"        {out}[i] = {src}[{_at(src_lay, coords, it)}];")
    lines.append("    }")
    return Kernel("take", params, lines, EW_THREADS,
                  (_grid_1d(n, EW_THREADS),), (EW_THREADS,), ops, note=f"Take {shape}")


def zero_kernel(params, op, out, ops):
    """``out`` (``op``'s row-major buffer) filled with zeros."""
    n = op.axes.size
    it = _itype(n)
    lines = _elements(n, it) + [f"        {out}[i] = {literal(0, op.dtype)};", "    }"]
    return Kernel("zero", params, lines, EW_THREADS,
                  (_grid_1d(n, EW_THREADS),), (EW_THREADS,), ops, note=f"zeros {op.axes.shape}")


def put_add_kernel(params, op, out, src, src_lay, idx, idx_lay, ops):
    """``out[o, idx[j], ...] += src[o, j, ...]`` with atomic adds (after
    :func:`zero_kernel`); float32 and float64 only."""
    if op.dtype.kind != "f":
        raise LoweringError(f"the gpu transformer adds at indices in float32 or float64 "
                            f"only, not {op.dtype} ({op.name}, built at {op.file_info})")
    shape = src_lay.shape
    n = int(np.prod(shape, dtype=np.int64))
    it = _itype(max(n, op.axes.size), [src_lay, idx_lay])
    lines = _elements(n, it) + _coords(shape, it)
    N = op.axes.shape[1]
    lines += _index_lines(idx, idx_lay, "i1", N, it)
    from geon.transformers.gpu.layout import row_major
    dst = _at(type(src_lay)(op, 0, op.axes.shape, row_major(op.axes.shape)),
              ["i0", "k"] + [f"i{d}" for d in range(2, len(shape))], it)
    at = _at(src_lay, [f"i{d}" for d in range(len(shape))], it)
    lines.append(f"        atomicAdd(&{out}[{dst}], {src}[{at}]);")
    lines.append("    }")
    return Kernel("put_add", params, lines, EW_THREADS,
                  (_grid_1d(n, EW_THREADS),), (EW_THREADS,), ops, note=f"PutAdd {shape}")


def _columns(shape, it):
    """A grid-stride loop over the columns ``(o, rest...)`` of (O, N, ...) and their
    coordinates ``i0``, ``i2``, ``i3`` ... (dimension 1 is walked by the body)."""
    cols = [shape[0]] + list(shape[2:])
    n = int(np.prod(cols, dtype=np.int64))
    lines = _elements(n, it)
    return n, lines + _coords(cols, it, ["i0"] + [f"i{d}" for d in range(2, len(shape))])


def prefix_sum_kernel(params, op, out, src, src_lay, ops):
    """Running sums along dimension 1: one thread per column, walking it in order."""
    shape = op.axes.shape
    it = _itype(op.axes.size, [src_lay])
    n, lines = _columns(shape, it)
    T = ctype(op.dtype)
    from geon.transformers.gpu.layout import row_major
    out_lay = type(src_lay)(op, 0, shape, row_major(shape))
    rest = [f"i{d}" for d in range(2, len(shape))]
    lines += [f"        {T} acc = {literal(0, op.dtype)};",
              f"        for ({it} j = 0; j < {shape[1]}; ++j) {{",
              f"            acc += {src}[{_at(src_lay, ['i0', 'j'] + rest, it)}];",
              f"            {out}[{_at(out_lay, ['i0', 'j'] + rest, it)}] = acc;",
              "        }", "    }"]
    return Kernel("prefix_sum", params, lines, EW_THREADS,
                  (_grid_1d(n, EW_THREADS),), (EW_THREADS,), ops, note=f"PrefixSum {shape}")


def sort_kernel(params, op, values, indices, src, src_lay, ops):
    """A stable sort along dimension 1: one thread per element, which counts the
    elements of its column that go before it (smaller, or equal and earlier) and writes
    itself at that rank (N comparisons per element: for the moderate lengths sorted
    inside a model)."""
    x = op.args[0]
    shape = x.axes.shape
    n = int(np.prod(shape, dtype=np.int64))
    it = _itype(n, [src_lay])
    from geon.transformers.gpu.layout import row_major
    lay = type(src_lay)(op, 0, shape, row_major(shape))
    rest = [f"i{d}" for d in range(2, len(shape))]
    T = ctype(x.dtype)
    lines = _elements(n, it) + _coords(shape, it)
    lines += [f"        const {T} v = {src}[{_at(src_lay, ['i0', 'i1'] + rest, it)}];",
              f"        {it} rank = 0;",
              f"        for ({it} j = 0; j < {shape[1]}; ++j) {{",
              f"            const {T} w = {src}[{_at(src_lay, ['i0', 'j'] + rest, it)}];",
              "            if (w < v || (w == v && j < i1)) { ++rank; }",
              "        }",
              f"        const {it} at = {_at(lay, ['i0', 'rank'] + rest, it)};"]
    if values is not None:
        lines.append(f"        {values}[at] = v;")
    if indices is not None:
        lines.append(f"        {indices}[at] = (long long)i1;")
    lines.append("    }")
    return Kernel("sort", params, lines, EW_THREADS,
                  (_grid_1d(n, EW_THREADS),), (EW_THREADS,), ops, note=f"SortPrim {shape}")
