"""Products, softmax, reductions, running sums and products, top-k, einsum and
determinants."""

import re

import numpy as np

import geon as be
from geon.frontends.onnx.builders.base import (_float, _norm_axis, _same, carrier, is_float,
                                               onnx_op)
from geon.frontends.onnx.builders.shapes import _slice_along
from geon.frontends.onnx.loading import InvalidOnnxModel, element_count, narrow_format
from geon.op_graph import nn_ops
from geon.op_graph import op_graph as og

gnp = be.np


# --- products ---------------------------------------------------------------------------

@onnx_op("MatMul", 1)
def _matmul(ctx):
    return [_same(ctx, gnp.matmul(ctx.tensor(0), ctx.tensor(1)))]


@onnx_op("Gemm", 7)
def _gemm(ctx):
    a, b = ctx.tensor(0), ctx.tensor(1)
    if ctx.attr("transA", 0):
        a = gnp.transpose(a)
    if ctx.attr("transB", 0):
        b = gnp.transpose(b)
    alpha, beta = ctx.attr("alpha", 1.0), ctx.attr("beta", 1.0)
    r = gnp.matmul(a, b)
    if alpha != 1.0:
        r = r * alpha
    if ctx.has(2):
        c = ctx.tensor(2)
        r = r + (c * beta if beta != 1.0 else c)
    return [_same(ctx, r)]


# --- softmax and reductions -------------------------------------------------------------

def _softmax_along(x, axis, log):
    if log:
        return gnp.log_softmax(x, axis)
    e = gnp.exp(x - og.StopGradient(gnp.max(x, axis, keepdims=True)))
    return e / gnp.sum(e, axis, keepdims=True)


def _softmax(op_type, log):
    @onnx_op(op_type, 1, 12)
    def old(ctx):  # the input is coerced to 2-D at `axis`
        x = _float(ctx)
        shape = ctx.shape(0)
        axis = _norm_axis(ctx, ctx.attr("axis", 1), len(shape))
        rows = element_count(shape[:axis])
        flat = gnp.reshape(x, (rows, element_count(shape[axis:])))
        return [_same(ctx, gnp.reshape(_softmax_along(flat, 1, log), shape))]

    @onnx_op(op_type, 13)
    def new(ctx):
        x = _float(ctx)
        axis = _norm_axis(ctx, ctx.attr("axis", -1), len(ctx.shape(0)))
        return [_same(ctx, _softmax_along(x, axis, log))]


_softmax("Softmax", False)
_softmax("LogSoftmax", True)


def _reduce_axes(ctx, from_input):
    rank = len(ctx.shape(0))
    if from_input:
        axes = ctx.const(1)
        axes = None if axes is None else [int(a) for a in np.ravel(axes)]
    else:
        axes = ctx.attr("axes")
    noop = ctx.attr("noop_with_empty_axes", 0) if from_input else 0
    if not axes:
        return None if not noop else ()
    return tuple(sorted(_norm_axis(ctx, a, rank) for a in axes))


#: What a reduction over an empty set of values gives (ONNX's rule): ``"low"`` is -inf
#: for floats and the type's smallest value otherwise (False for bool), ``"high"`` the
#: opposite.
_EMPTY_REDUCTION = {"ReduceSum": 0, "ReduceProd": 1, "ReduceSumSquare": 0, "ReduceL1": 0,
                    "ReduceL2": 0, "ReduceMax": "low", "ReduceMin": "high",
                    "ReduceLogSum": -np.inf, "ReduceLogSumExp": -np.inf}


def _empty_reduction(ctx, op_type, axes, keep):
    """The known result of a reduction of an input with no elements."""
    shape, dtype = ctx.shape(0), ctx.dtype(0)
    red = range(len(shape)) if axes is None else axes
    out = tuple(1 if k in red else d for k, d in enumerate(shape) if keep or k not in red)
    if 0 in out:  # nothing left either
        return ctx.known(np.empty(out, dtype))
    fill = _EMPTY_REDUCTION.get(op_type)
    if fill is None or narrow_format(dtype) is not None:
        raise ctx.unsupported("reducing an empty set of values (the result is undefined)")
    ctx.bound(out, carrier(dtype), "the reduction of an empty set", known=True)
    if fill in ("low", "high"):
        if dtype == np.bool_:
            fill = fill == "high"
        elif is_float(dtype):
            fill = -np.inf if fill == "low" else np.inf
        else:
            info = np.iinfo(dtype)
            fill = info.min if fill == "low" else info.max
    return ctx.known(np.full(out, fill, carrier(dtype)), dtype)


def _reduction(op_type, fn, input_since, floating=False):
    def build(ctx, from_input):
        axes = _reduce_axes(ctx, from_input)
        keep = bool(ctx.attr("keepdims", 1))
        if 0 in ctx.shape(0):
            return [ctx.value(0) if axes == () else _empty_reduction(ctx, op_type, axes, keep)]
        x = _float(ctx) if floating else ctx.tensor(0)
        if axes == ():
            return [ctx.out(x, ctx.dtype(0))]
        return [_same(ctx, fn(x, axes, keep))]

    onnx_op(op_type, 1, input_since - 1)(lambda ctx: build(ctx, False))
    onnx_op(op_type, input_since)(lambda ctx: build(ctx, True))


_reduction("ReduceSum", lambda x, a, k: gnp.sum(x, a, keepdims=k), 13)
_reduction("ReduceMean", lambda x, a, k: gnp.mean(x, a, keepdims=k), 18)
_reduction("ReduceMax", lambda x, a, k: gnp.max(x, a, keepdims=k), 18)
_reduction("ReduceMin", lambda x, a, k: gnp.min(x, a, keepdims=k), 18)
_reduction("ReduceProd", lambda x, a, k: gnp.prod(x, a, keepdims=k), 18)
_reduction("ReduceSumSquare", lambda x, a, k: gnp.sum(x * x, a, keepdims=k), 18)
_reduction("ReduceL1", lambda x, a, k: gnp.sum(gnp.absolute(x), a, keepdims=k), 18)
_reduction("ReduceL2", lambda x, a, k: gnp.sqrt(gnp.sum(x * x, a, keepdims=k)), 18,
           floating=True)
_reduction("ReduceLogSum", lambda x, a, k: gnp.log(gnp.sum(x, a, keepdims=k)), 18,
           floating=True)
_reduction("ReduceLogSumExp", lambda x, a, k: gnp.logsumexp(x, a, keepdims=k), 18,
           floating=True)


def _arg_reduce(op_type, fn):
    @onnx_op(op_type, 1)
    def build(ctx):
        x = ctx.tensor(0)
        shape = ctx.shape(0)
        axis = _norm_axis(ctx, ctx.attr("axis", 0), len(shape))
        keep = bool(ctx.attr("keepdims", 1))
        if ctx.attr("select_last_index", 0):
            # The last extreme is the first of the reversed axis.
            key = [slice(None)] * len(shape)
            key[axis] = slice(None, None, -1)
            r = (shape[axis] - 1) - fn(x[tuple(key)], axis, keepdims=keep)
        else:
            r = fn(x, axis, keepdims=keep)
        return [ctx.out(r, np.int64)]


_arg_reduce("ArgMax", gnp.argmax)
_arg_reduce("ArgMin", gnp.argmin)


@onnx_op("CumSum", 11)
def _cumsum(ctx):
    x = ctx.tensor(0)
    shape = ctx.shape(0)
    axis = _norm_axis(ctx, int(np.ravel(ctx.const(1))[0]), len(shape))
    ax = x.axes[axis] if len(x.axes) == len(shape) else None
    if ax is None:
        raise ctx.unsupported("named axes")
    r = nn_ops.cumsum(x, ax, reverse=bool(ctx.attr("reverse", 0)),
                      exclusive=bool(ctx.attr("exclusive", 0)))
    return [ctx.out(r, ctx.dtype(0))]


@onnx_op("TopK", 10)
def _topk(ctx):
    shape = ctx.shape(0)
    axis = _norm_axis(ctx, ctx.attr("axis", -1), len(shape))
    k = int(np.ravel(ctx.const(1))[0])
    largest = ctx.attr("largest", 1) if ctx.version >= 11 else 1
    ctx.attr("sorted", 1)  # the results are sorted either way
    if not 0 < k <= shape[axis]:
        raise ctx.unsupported(f"k={k} for an axis of length {shape[axis]}")
    x = ctx.tensor(0)
    if not largest and ctx.dtype(0).kind == "u":
        raise ctx.unsupported("largest=0 for unsigned integers")
    if largest:
        vals, idx = gnp.topk(x, k, axis)
    else:
        vals, idx = gnp.topk(-x, k, axis)
        vals = -vals
    return [_same(ctx, vals), ctx.out(idx, np.int64)]


# --- running products ---------------------------------------------------------------------

@onnx_op("CumProd", 26)
def _cumprod(ctx):
    """Running products by doubling: after the step of distance ``s`` each entry holds
    the product of the ``2s`` entries ending at it (log2(n) elementwise products)."""
    x = ctx.tensor(0)
    shape = ctx.shape(0)
    axis = _norm_axis(ctx, int(np.ravel(ctx.const(1))[0]), len(shape))
    n = shape[axis]
    if n == 0:
        return [ctx.value(0)]
    reverse, exclusive = bool(ctx.attr("reverse", 0)), bool(ctx.attr("exclusive", 0))
    if reverse:
        x = _slice_along(x, axis, None, None, -1)

    def ones(k):
        s = list(gnp.shape(x))
        s[axis] = k
        return gnp.ones(s, dtype=x.dtype)

    if exclusive:  # shifted by one: 1 first
        x = gnp.concatenate([ones(1), _slice_along(x, axis, 0, n - 1)], axis) if n > 1 \
            else ones(1)
    s = 1
    while s < n:
        x = x * gnp.concatenate([ones(s), _slice_along(x, axis, 0, n - s)], axis)
        s *= 2
    if reverse:
        x = _slice_along(x, axis, None, None, -1)
    return [_same(ctx, x)]


# --- einsum -------------------------------------------------------------------------------

def _einsum_terms(ctx, equation, shapes):
    """The letters of each operand and of the result, with ``...`` spelled out as
    letters of its own (upper-case private ones, right-aligned as NumPy broadcasts)."""
    eq = equation.replace(" ", "")
    if "->" in eq:
        lhs, rhs = eq.split("->")
    else:
        lhs, rhs = eq, None
    ins = lhs.split(",")
    if len(ins) != len(shapes):
        raise InvalidOnnxModel(f"{ctx.where}: equation {equation!r} for {len(shapes)} inputs")
    ell = max([len(s) - len(t.replace("...", "")) for t, s in zip(ins, shapes) if "..." in t],
              default=0)
    dots = "".join(chr(0x3b1 + k) for k in range(ell))   # Greek letters: never in an equation
    terms = []
    for t, s in zip(ins, shapes):
        if "..." in t:
            k = len(s) - len(t.replace("...", ""))
            t = t.replace("...", dots[ell - k:])
        if len(t) != len(s) or not re.fullmatch(r"[A-Za-z\u03b1-\u03c9]*", t):
            raise InvalidOnnxModel(f"{ctx.where}: term {t!r} of {equation!r} for shape {s}")
        terms.append(t)
    if rhs is None:
        once = sorted(c for c in set("".join(terms)) if "".join(terms).count(c) == 1
                      and c not in dots)
        rhs = dots + "".join(once)
    else:
        rhs = rhs.replace("...", dots)
    return terms, rhs


def _einsum_diagonal(x, term):
    """``x`` with the entries of each repeated letter of ``term`` on the diagonal only
    (the letter once, at its first place)."""
    while len(set(term)) < len(term):
        c = next(c for c in term if term.count(c) > 1)
        where = [j for j, t in enumerate(term) if t == c]
        shape = gnp.shape(x)
        rest = [j for j in range(len(term)) if j not in where]
        x = gnp.transpose(x, rest + where)
        d = shape[where[0]]
        x = gnp.reshape(x, tuple(shape[j] for j in rest) + (d ** len(where),))
        step = sum(d ** k for k in range(len(where)))
        x = gnp.take(x, gnp.constant(np.arange(d, dtype=np.int64) * step), len(rest))
        term = "".join(term[j] for j in rest) + c
    return x, term


def _einsum_pair(a, ta, b, tb, keep):
    """The product of ``a`` and ``b`` summed over the letters they share that ``keep``
    does not hold: one batched matrix product (floats) or a broadcast product and sum."""
    da = dict(zip(ta, gnp.shape(a)))
    db = dict(zip(tb, gnp.shape(b)))
    shared = [c for c in ta if c in tb]
    batch = [c for c in shared if c in keep]
    contract = [c for c in shared if c not in keep]
    left = [c for c in ta if c not in tb]
    right = [c for c in tb if c not in ta]
    for c in batch:  # ellipsis letters may broadcast
        if da[c] != db[c]:
            n = max(da[c], db[c])
            if da[c] == 1:
                a = gnp.broadcast_to(a, tuple(n if t == c else da[t] for t in ta))
                da[c] = n
            else:
                b = gnp.broadcast_to(b, tuple(n if t == c else db[t] for t in tb))
                db[c] = n
    if a.dtype.kind != "f" or b.dtype.kind != "f":
        out = batch + left + right
        ea = gnp.reshape(gnp.transpose(a, [ta.index(c) for c in batch + left + contract]),
                         tuple(da[c] for c in batch + left) + (1,) * len(right) +
                         tuple(da[c] for c in contract))
        eb = gnp.reshape(gnp.transpose(b, [tb.index(c) for c in batch + right + contract]),
                         tuple(db[c] for c in batch) + (1,) * len(left) +
                         tuple(db[c] for c in right + contract))
        r = ea * eb
        if contract:
            r = gnp.sum(r, tuple(range(len(out), len(out) + len(contract))))
        return r, "".join(out)
    nb = element_count([da[c] for c in batch])
    nl, nr = element_count([da[c] for c in left]), element_count([db[c] for c in right])
    nc = element_count([da[c] for c in contract])
    am = gnp.reshape(gnp.transpose(a, [ta.index(c) for c in batch + left + contract]),
                     (nb, nl, nc))
    bm = gnp.reshape(gnp.transpose(b, [tb.index(c) for c in batch + contract + right]),
                     (nb, nc, nr))
    r = gnp.matmul(am, bm)
    out = batch + left + right
    return gnp.reshape(r, tuple(da[c] for c in batch + left) + tuple(db[c] for c in right)), \
        "".join(out)


@onnx_op("Einsum", 12)
def _einsum(ctx):
    equation = ctx.attr("equation")
    if not equation:
        raise InvalidOnnxModel(f"{ctx.where}: no equation")
    n = ctx.n_inputs()
    shapes = [ctx.shape(i) for i in range(n)]
    terms, rhs = _einsum_terms(ctx, equation, shapes)
    if len(set(rhs)) != len(rhs) or any(c not in "".join(terms) for c in rhs):
        raise InvalidOnnxModel(f"{ctx.where}: output {rhs!r} of {equation!r}")
    if any(0 in s for s in shapes):
        raise ctx.unsupported("operands with no elements")
    ops = []
    for i, t in enumerate(terms):
        x = ctx.tensor(i)
        if not is_float(ctx.dtype(i)) and ctx.dtype(i).kind not in "iu":
            raise ctx.unsupported(f"input {i} of type {ctx.dtype(i)}")
        x, t = _einsum_diagonal(x, t)
        ops.append((x, t))
    # Letters no other operand and not the result need are summed out first.
    for k, (x, t) in enumerate(ops):
        others = rhs + "".join(u for j, (_, u) in enumerate(ops) if j != k)
        alone = [j for j, c in enumerate(t) if c not in others]
        if alone:
            x = gnp.sum(x, tuple(alone))
            t = "".join(c for c in t if c in others)
        ops[k] = (x, t)
    x, t = ops[0]
    for k in range(1, len(ops)):
        y, u = ops[k]
        keep = rhs + "".join(v for _, v in ops[k + 1:])
        x, t = _einsum_pair(x, t, y, u, keep)
    if set(t) != set(rhs):  # a single operand's letters the result drops
        drop = tuple(j for j, c in enumerate(t) if c not in rhs)
        x = gnp.sum(x, drop) if drop else x
        t = "".join(c for c in t if c in rhs)
    if t != rhs:
        x = gnp.transpose(x, [t.index(c) for c in rhs])
    return [_same(ctx, x)]


# --- determinants -------------------------------------------------------------------------

@onnx_op("Det", 11)
def _det(ctx):
    """The determinant of matrices up to 3 x 3, by its expansion (geon has no LU
    factorization: larger ones are refused)."""
    x = _float(ctx)
    shape = ctx.shape(0)
    if len(shape) < 2 or shape[-1] != shape[-2]:
        raise InvalidOnnxModel(f"{ctx.where}: input {shape} is not a (batch of) square "
                               f"matrices")
    n = shape[-1]
    if n > 3:
        raise ctx.unsupported(f"{n} x {n} matrices (geon has no LU factorization; up to "
                              f"3 x 3 are computed by their expansion)")

    def e(i, j):
        return x[..., i, j]

    if n == 1:
        r = e(0, 0)
    elif n == 2:
        r = e(0, 0) * e(1, 1) - e(0, 1) * e(1, 0)
    else:
        r = (e(0, 0) * (e(1, 1) * e(2, 2) - e(1, 2) * e(2, 1))
             - e(0, 1) * (e(1, 0) * e(2, 2) - e(1, 2) * e(2, 0))
             + e(0, 2) * (e(1, 0) * e(2, 1) - e(1, 1) * e(2, 0)))
    return [_same(ctx, r)]
