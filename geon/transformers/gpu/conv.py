"""CUDA C kernels for the convolution and pooling primitives (:mod:`geon.op_graph.conv`).

Direct kernels: one thread per result element (a grid-stride loop), which loops over
the kernel offsets (and channels, or batch and window positions for the filter
gradient) that contribute to it. Operands are read through their layouts' strides, so
views need no copy. Shapes, strides, padding and dilation are constants of the source.
"""

from geon.op_graph import conv as cv
from geon.transformers.gpu.cuda import ctype, literal
from geon.transformers.gpu.kernels import (EW_THREADS, Kernel, Params, _grid_1d, _itype,
                                           cuda_kernels, describe)


def _at(ptr, lay, idx):
    """``ptr[...]`` at the multi-index ``idx`` (C expressions) of the layout ``lay``
    (every index appears, a broadcast one times 0, so no variable goes unused)."""
    terms = [f"({e}) * {s}" for e, s in zip(idx, lay.strides)]
    return f"{ptr}[{' + '.join(terms) or '0'}]"


class _Body:
    """Source lines with an indentation that follows the nesting."""

    def __init__(self, depth):
        self.lines, self.depth = [], depth

    def add(self, text):
        self.lines.append("    " * self.depth + text)

    def open(self, text):
        self.add(text + " {")
        self.depth += 1

    def close(self, n=1):
        for _ in range(n):
            self.depth -= 1
            self.add("}")


def _window_loops(body, it, prefix, kernel):
    """Nested loops over the kernel offsets ``{prefix}0, {prefix}1 ...`` (row-major)."""
    for d, k in enumerate(kernel):
        body.open(f"for ({it} {prefix}{d} = 0; {prefix}{d} < {k}; ++{prefix}{d})")


def _positions(body, it, prefix, p, r, strides, pads, dilation, lengths):
    """``{prefix}d = p_d * stride - lo + r_d * dilation``; returns the in-range test."""
    tests = []
    for d, (s, (lo, _), dil, n) in enumerate(zip(strides, pads, dilation, lengths)):
        body.add(f"const {it} {prefix}{d} = {p[d]} * {s} - {lo} + {r[d]} * {dil};")
        tests.append(f"{prefix}{d} >= 0 && {prefix}{d} < {n}")
    return " && ".join(tests) or "true"


def _kernel(op, params, body_lines, note):
    shape = op.axes.shape
    n = 1
    for s in shape:
        n *= s
    it = _itype(n)
    head = [f"    for ({it} i = ({it})blockIdx.x * {EW_THREADS} + ({it})threadIdx.x; "
            f"i < {n}; i += ({it})gridDim.x * {EW_THREADS}) {{"]
    rest, inner = [], 1
    for d in range(len(shape) - 1, -1, -1):
        rest.append(f"        const {it} i{d} = (i / {inner}) % {shape[d]};")
        inner *= shape[d]
    lines = head + list(reversed(rest)) + body_lines + ["    }"]
    return Kernel("conv", params, lines, EW_THREADS,
                  (_grid_1d(n, EW_THREADS),), (EW_THREADS,), [op],
                  note=f"{note}: {describe(op)}")


def conv_kernel(params, op, out, args):
    """The kernel of a :class:`~geon.op_graph.conv.ConvPrim`; ``args`` holds one
    ``(pointer, layout)`` per operand."""
    T = ctype(op.dtype)
    it = _itype(max(lay.size for _, lay in args) + op.axes.size,
                [lay for _, lay in args])
    body = _Body(2)
    n = len(op.strides)
    idx = [f"i{d}" for d in range(n + 2)]
    body.add(f"{T} acc = {literal(0, op.dtype)};")
    if isinstance(op, cv.Conv):
        (x, lx), (w, lw) = args
        K, Cg = lw.shape[:2]
        R, S = lw.shape[2:], lx.shape[2:]
        body.add(f"const {it} g = i1 / {K // op.groups};")
        body.open(f"for ({it} c = 0; c < {Cg}; ++c)")
        _window_loops(body, it, "r", R)
        inside = _positions(body, it, "q", idx[2:], [f"r{d}" for d in range(n)], op.strides,
                            op.pads, op.dilation, S)
        body.open(f"if ({inside})")
        xv = _at(x, lx, ["i0", f"g * {Cg} + c"] + [f"q{d}" for d in range(n)])
        wv = _at(w, lw, ["i1", "c"] + [f"r{d}" for d in range(n)])
        body.add(f"acc += {xv} * {wv};")
        body.close(n + 2)
    elif isinstance(op, cv.ConvGradData):
        (dy, ld), (w, lw) = args
        K, Cg = lw.shape[:2]
        R, P = lw.shape[2:], ld.shape[2:]
        Kg = K // op.groups
        body.add(f"const {it} g = i1 / {Cg}, cg = i1 % {Cg};")
        body.open(f"for ({it} kk = 0; kk < {Kg}; ++kk)")
        body.add(f"const {it} k = g * {Kg} + kk;")
        _window_loops(body, it, "r", R)
        tests = []
        for d, (s, (lo, _), dil, m) in enumerate(zip(op.strides, op.pads, op.dilation, P)):
            body.add(f"const {it} t{d} = i{d + 2} + {lo} - r{d} * {dil};")
            body.add(f"const {it} pp{d} = t{d} / {s};")
            tests.append(f"t{d} >= 0 && t{d} % {s} == 0 && pp{d} < {m}")
        body.open(f"if ({' && '.join(tests)})")
        dv = _at(dy, ld, ["i0", "k"] + [f"pp{d}" for d in range(n)])
        wv = _at(w, lw, ["k", "cg"] + [f"r{d}" for d in range(n)])
        body.add(f"acc += {dv} * {wv};")
        body.close(n + 2)
    else:  # ConvGradFilter
        (x, lx), (dy, ld) = args
        B = lx.shape[0]
        S, P = lx.shape[2:], ld.shape[2:]
        K, Cg = op.axes.shape[:2]
        body.add(f"const {it} c = (i0 / {K // op.groups}) * {Cg} + i1;")
        body.open(f"for ({it} b = 0; b < {B}; ++b)")
        _window_loops(body, it, "pp", P)
        inside = _positions(body, it, "q", [f"pp{d}" for d in range(n)], idx[2:], op.strides,
                            op.pads, op.dilation, S)
        body.open(f"if ({inside})")
        xv = _at(x, lx, ["b", "c"] + [f"q{d}" for d in range(n)])
        dv = _at(dy, ld, ["b", "i0"] + [f"pp{d}" for d in range(n)])
        body.add(f"acc += {xv} * {dv};")
        body.close(n + 2)
    body.add(f"{out}[i] = acc;")
    return _kernel(op, params, body.lines, type(op).__name__)


def _first_max(body, it, T, x, lx, lead, p, op, S, lowest, tag, position=False):
    """Lines finding the first maximum of window ``p`` of x: sets ``best{tag}`` (the
    value), ``bt{tag}`` (its offset number, row-major) and, with ``position``,
    ``bq{tag}_d`` / ``bin{tag}`` (its position and whether it is an input element, not
    padding)."""
    n = len(op.kernel)
    body.add(f"{T} best{tag} = {lowest}; {it} bt{tag} = -1;")
    if position:
        body.add(f"bool bin{tag} = false;")
        for d in range(n):
            body.add(f"{it} bq{tag}_{d} = 0;")
    body.add(f"{it} t{tag} = 0;")
    _window_loops(body, it, f"r{tag}_", op.kernel)
    inside = _positions(body, it, f"q{tag}_", p, [f"r{tag}_{d}" for d in range(n)],
                        op.strides, op.pads, op.dilation, S)
    xv = _at(x, lx, lead + [f"q{tag}_{d}" for d in range(n)])
    body.add(f"const bool in{tag} = {inside};")
    body.add(f"const {T} v{tag} = in{tag} ? {xv} : {lowest};")
    body.open(f"if (bt{tag} < 0 || v{tag} > best{tag})")
    body.add(f"best{tag} = v{tag}; bt{tag} = t{tag};")
    if position:
        body.add(f"bin{tag} = in{tag};")
        for d in range(n):
            body.add(f"bq{tag}_{d} = q{tag}_{d};")
    body.close()
    body.add(f"++t{tag};")
    body.close(n)


def pool_kernel(params, op, out, args):
    """The kernel of a max-pooling primitive; ``args`` as for :func:`conv_kernel`."""
    T = ctype(op.dtype)
    (x, lx) = args[0]
    it = _itype(max(lay.size for _, lay in args) + op.axes.size,
                [lay for _, lay in args])
    n = len(op.kernel)
    lead_n = len(lx.shape) - n
    lead = [f"i{d}" for d in range(lead_n)]
    S = lx.shape[lead_n:]
    xdt = op.args[0].dtype
    lowest = literal(cv._lowest(xdt), xdt)
    XT = ctype(xdt)
    body = _Body(2)
    if isinstance(op, (cv.MaxPool, cv.MaxPoolGather)):
        p = [f"i{lead_n + d}" for d in range(n)]
        _first_max(body, it, XT, x, lx, lead, p, op, S, lowest, "",
                   position=isinstance(op, cv.MaxPoolGather))
        if isinstance(op, cv.MaxPool):
            body.add(f"{out}[i] = best;")
        else:
            v, lv = args[1]
            vv = _at(v, lv, lead + [f"bq_{d}" for d in range(n)])
            body.add(f"{out}[i] = bin ? {vv} : {literal(0, op.dtype)};")
    else:  # MaxPoolGrad: the windows holding this element at their first maximum
        dy, ld = args[1]
        P = ld.shape[lead_n:]
        body.add(f"{T} acc = {literal(0, op.dtype)};")
        body.add(f"{it} tap = 0;")
        _window_loops(body, it, "r", op.kernel)
        tests = []
        for d, (s, (lo, _), dil, m) in enumerate(zip(op.strides, op.pads, op.dilation, P)):
            body.add(f"const {it} t{d} = i{lead_n + d} + {lo} - r{d} * {dil};")
            body.add(f"const {it} pp{d} = t{d} / {s};")
            tests.append(f"t{d} >= 0 && t{d} % {s} == 0 && pp{d} < {m}")
        body.open(f"if ({' && '.join(tests)})")
        _first_max(body, it, XT, x, lx, lead, [f"pp{d}" for d in range(n)], op, S, lowest,
                   "w")
        dv = _at(dy, ld, lead + [f"pp{d}" for d in range(n)])
        body.add(f"if (btw == tap) {{ acc += {dv}; }}")
        body.close()
        body.add("++tap;")
        body.close(n)
        body.add(f"{out}[i] = acc;")
    return _kernel(op, params, body.lines, type(op).__name__)


def _emit(build):
    """The :data:`~geon.transformers.gpu.kernels.CUDA_KERNELS` entry of a direct
    kernel ``build(params, op, out, [(pointer, layout) per arg])``."""
    def emit(ctx, op):
        if op.axes.size:
            params = Params()
            out = ctx.pointer(params, ctx.layout(op), written=True)
            args = [(ctx.pointer(params, ctx.layout(a)), ctx.layout(a)) for a in op.args]
            ctx.add(build(params, op, out, args))
    return emit


cuda_kernels(cv.ConvPrim)(_emit(conv_kernel))
cuda_kernels(cv.PoolPrim)(_emit(pool_kernel))
