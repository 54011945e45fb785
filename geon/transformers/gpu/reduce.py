"""CUDA kernels of the reductions (``ReducePrim`` and ``ReduceMaxArgMax`` of
:mod:`geon.op_graph.primitives`): sums, products, extremes and arg-extremes along one
dimension of a 1-D or 2-D value.

A block reduces rows in shared memory; a few long rows are split over several blocks
(partial results in scratch memory, then a second pass). A reduction that ends a fused
group computes its input on the fly from the group's elementwise members.
"""

import re

import numpy as np

from geon.op_graph import primitives as pr
from geon.transformers.gpu.cuda import ctype, literal
from geon.transformers.gpu.elementwise import Fused
from geon.transformers.gpu.kernels import Kernel, Params, cuda_kernels
from geon.transformers.gpu.layout import permutation_source

#: Reductions over more than this many elements per output row with few rows are
#: split over several blocks per row (partial results, then a second pass).
SPLIT_LENGTH = 16384
#: Few rows: fewer than this many blocks would be launched without splitting.
SPLIT_BLOCKS = 264


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


def emit_reduce(ctx, op, prologue=(), internal=frozenset()):
    """A reduction, computing its input from the fused ``prologue`` members if any.
    ``ReduceMaxArgMax`` is an argmax that also writes the maxima (to its outputs that
    the graph uses)."""
    x = op.args[0]
    lx = ctx.layout(x)
    shape = lx.shape
    both = isinstance(op, pr.ReduceMaxArgMax)
    cls, dt = (pr.ReduceArgMax if both else type(op)), x.dtype
    if both:
        values_lay, index_lay = (ctx.lay.get(o) for o in op.outputs)
    else:
        values_lay, index_lay = None, ctx.layout(op)
    if len(shape) == 1:
        R, L = 1, shape[0]
    elif op.axis == 1:
        R, L = shape
    else:
        L, R = shape
    if R == 0:
        return
    params = Params()
    ops = list(prologue) + [op]
    deps = ctx.deps_of(prologue)
    if len(shape) == 1:
        sr, sk = 0, lx.strides[0]
    elif op.axis == 1:
        sr, sk = lx.strides
    else:
        sk, sr = lx.strides
    lanes_on_k = R == 1 or abs(sk) <= abs(sr)
    if prologue:
        # x is a member, or a view of one that holds each of its elements once: element
        # (r, k) is the member's element p, computed on the fly.
        f = Fused(ctx, prologue, internal, params)
        f.plan_loads()
        lays = [ctx.layout(a) for m in prologue for a in m.args]
        src = prologue.index(permutation_source(x, ctx.lay))

        def value(r, k, lines):
            terms = [t if st == 1 else f"{t} * {st}" for t, st in ((r, sr), (k, sk)) if st]
            body = (f.load_lines("p", lambda j: f"const {f.load_list[j][2]} x{j}")
                    + f.compute_lines("p", lambda j: f"x{j}"))
            if any(re.search(r"\bp\b", line) for line in body):  # (all loads may be
                # of one broadcast number: a length-1 dimension, say; nvcc warns of an
                # unused p)
                lines.append(f"const long long p = {' + '.join(terms) or '0'};")
            lines.extend(body)
            return f"v{src}", k
    else:
        src = ctx.pointer(params, lx)
        lays = [lx]

        def value(r, k, lines):
            idx = " + ".join(f"{t} * {st}" if st != 1 else t
                             for t, st in ((r, sr), (k, sk)) if st != 0) or "0"
            return f"{src}[{idx}]", k

    extent = max([max(abs(v) for v in lay.span()) for lay in lays if lay.span()] + [0])
    spec = ReduceSpec(cls, dt, R, L, lanes_on_k)
    TX, TY, P, chunk = reduce_config(spec)

    def outputs(params):
        """Pointers of the result and, for ReduceMaxArgMax, of the maxima."""
        out = ctx.pointer(params, index_lay, written=True) if index_lay else None
        vals = ctx.pointer(params, values_lay, written=True) if values_lay else None
        return out, vals

    if P == 1:
        out, vals = outputs(params)
        ctx.add(reduce_kernel(spec, params, value, out, ops=ops, deps=deps, extent=extent,
                              out_value=vals))
        return
    # Two passes: partial results per part of each row, then a reduction of those.
    sv = ctx.scratch(R * P * dt.itemsize)
    out = params.pointer(sv, 0, ctype(dt), written=True)
    out_i = None
    if spec.arg:
        si = ctx.scratch(R * P * 8)
        out_i = params.pointer(si, 0, "long long", written=True)
    ctx.add(reduce_kernel(spec, params, value, out, out_i, ops=ops, deps=deps,
                          part=(P, chunk), extent=extent))
    params2 = Params()
    pv = params2.pointer(sv, 0, ctype(dt))
    pi = params2.pointer(si, 0, "long long") if spec.arg else None
    final, vals = outputs(params2)

    def partial(r, k, lines):
        return f"{pv}[{r} * {P} + {k}]", (f"{pi}[{r} * {P} + {k}]" if spec.arg else k)

    spec2 = ReduceSpec(cls, dt, R, P, True)
    ctx.add(reduce_kernel(spec2, params2, partial, final, ops=[op], out_value=vals))


@cuda_kernels(pr.ReducePrim, pr.ReduceMaxArgMax)
def _emit_alone(ctx, op):
    """A reduction that reads its input from memory (not fused)."""
    emit_reduce(ctx, op)
