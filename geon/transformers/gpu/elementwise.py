"""CUDA kernels of elementwise ops (:class:`~geon.op_graph.op_graph.ElementWise`, and
the ``Copy`` and ``Assign`` primitives that run the same way), fused or alone.

A fused run of members of one shape is one kernel (:func:`elementwise_kernel`): values
that only the run reads stay in registers. Each member's C expression comes from
:data:`~geon.transformers.gpu.cuda.CUDA_CODE`; :class:`Fused` also serves the
reductions that compute their input on the fly (:mod:`~geon.transformers.gpu.reduce`).
"""

import numpy as np

from geon.op_graph import op_graph as og
from geon.op_graph import primitives as pr
from geon.transformers.codegen_text import comment
from geon.transformers.gpu import cuda
from geon.transformers.gpu.cuda import ctype, literal
from geon.transformers.gpu.kernels import (EW_ITEMS, EW_THREADS, Kernel, Params, _grid_1d,
                                           _itype, cuda_kernels)
from geon.transformers.gpu.layout import offset_expr, scalar_constant


def fusable(op):
    """Ops a fused elementwise kernel can compute (per element, same shape)."""
    if isinstance(op, (pr.Copy, pr.Assign)):
        return True
    return isinstance(op, og.ElementWise)


class Fused:
    """Code for a run of elementwise members (ElementWise, Copy, Assign) of one shape,
    evaluated at one row-major element index. ``ctx`` gives buffers and layouts (see
    :class:`geon.transformers.gpu.kernels.Context`). A member's value read by a later
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


def element_count(op):
    """The number of elements an elementwise member computes (an ``Assign``: its
    target's)."""
    return (op.args[0] if isinstance(op, pr.Assign) else op).axes.size


@cuda_kernels(og.ElementWise, pr.Assign)
def emit_elementwise(ctx, op):
    """An elementwise op alone: a kernel of one member (none for no elements). A
    ``Copy`` registers its own rule, which may use a transposing kernel instead."""
    if element_count(op):
        ctx.add(elementwise_kernel(ctx, [op], set()))
