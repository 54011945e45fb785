"""CUDA kernels of the data-movement primitives of :mod:`geon.op_graph.primitives`:
``Copy`` (a tiled transpose where its source is one), ``Unslice``, ``Take`` and
``PutAdd`` (indexing by an integer tensor), ``PrefixSum`` and ``SortPrim``.

Except for the transpose, each is one thread per element (or per column, for the scans)
in a grid-stride loop, reading its operands through their layouts' strides.
(``Gemm`` and the reductions have their own modules, :mod:`~geon.transformers.gpu.gemm`
and :mod:`~geon.transformers.gpu.reduce`.)
"""

import numpy as np

from geon.errors import LoweringError
from geon.op_graph import primitives as pr
from geon.transformers.gpu.cuda import ctype, literal
from geon.transformers.gpu.elementwise import element_count, elementwise_kernel
from geon.transformers.gpu.kernels import (EW_THREADS, Kernel, Params, _elements, _grid_1d,
                                           _itype, cuda_kernels)
from geon.transformers.gpu.layout import row_major, scalar_constant

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


# --- what each op launches --------------------------------------------------------------

@cuda_kernels(pr.Take, pr.PutAdd)
def _emit_indexed(ctx, op):
    """Take (a gather) or PutAdd (zeros, then atomic adds at the indices)."""
    if not op.axes.size:
        return
    lay = ctx.layout(op)
    if isinstance(op, pr.Take) and not op.args[0].axes.lengths[1]:
        raise LoweringError(f"{op.name} (built at {op.file_info}) takes entries from an "
                            f"empty axis")
    if isinstance(op, pr.PutAdd):
        params = Params()
        ctx.add(zero_kernel(params, op, ctx.pointer(params, lay, written=True), [op]))
        if not op.args[0].axes.size:
            return
    params = Params()
    out = ctx.pointer(params, lay, written=True)
    src_lay, idx_lay = ctx.layout(op.args[0]), ctx.layout(op.args[1])
    src, idx = ctx.pointer(params, src_lay), ctx.pointer(params, idx_lay)
    make = take_kernel if isinstance(op, pr.Take) else put_add_kernel
    ctx.add(make(params, op, out, src, src_lay, idx, idx_lay, [op]))


def _emit_transpose(ctx, op):
    """A copy of a (2-D, after merging dimensions) transpose: the tiled kernel."""
    src_lay = ctx.layout(op.args[0])
    if scalar_constant(src_lay.root):
        return False
    dims = src_lay.dims()
    if len(dims) != 2 or abs(dims[1][1]) <= abs(dims[0][1]) or abs(dims[0][1]) != 1:
        return False
    # dims are in result order: result element (a, b) of the row-major (A, B) result
    # is source element a * sa + b * sb, a along the source's contiguous direction
    (A, sa), (B, sb) = dims
    params = Params()
    out = ctx.pointer(params, ctx.layout(op), written=True)
    src = ctx.pointer(params, src_lay)
    ctx.add(transpose_kernel(params, op, out, src, A, B, sa, sb, [op]))
    return True


@cuda_kernels(pr.Copy)
def _emit_copy(ctx, op):
    """A copy of a transpose: the tiled kernel; any other copy: elementwise."""
    if _emit_transpose(ctx, op):
        return
    if element_count(op):
        ctx.add(elementwise_kernel(ctx, [op], set()))


@cuda_kernels(pr.Unslice)
def _emit_unslice(ctx, op):
    if op.axes.size:
        params = Params()
        out = ctx.pointer(params, ctx.layout(op), written=True)
        src_lay = ctx.layout(op.args[0])
        src = ctx.pointer(params, src_lay)
        ctx.add(unslice_kernel(params, op, out, src, src_lay, [op]))


@cuda_kernels(pr.PrefixSum)
def _emit_prefix_sum(ctx, op):
    if op.axes.size:
        params = Params()
        out = ctx.pointer(params, ctx.layout(op), written=True)
        src_lay = ctx.layout(op.args[0])
        ctx.add(prefix_sum_kernel(params, op, out, ctx.pointer(params, src_lay), src_lay,
                                  [op]))


@cuda_kernels(pr.SortPrim)
def _emit_sort(ctx, op):
    if op.args[0].axes.size:
        params = Params()
        outs = [ctx.lay.get(o) for o in op.outputs]
        values, indices = (None if lay is None else ctx.pointer(params, lay, written=True)
                           for lay in outs)
        src_lay = ctx.layout(op.args[0])
        ctx.add(sort_kernel(params, op, values, indices, ctx.pointer(params, src_lay),
                            src_lay, [op]))
