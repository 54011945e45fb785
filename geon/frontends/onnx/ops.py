"""The table of ONNX ops: ``(domain, op type)`` -> builders, each for a range of opset
versions.

A builder takes a :class:`~geon.frontends.onnx.importer.Context` (the node's inputs,
attributes and opset version) and returns one
:class:`~geon.frontends.onnx.importer.Value` per output (``None`` for an output it does
not make). It builds ``be.np`` ops, reads every attribute it honours through
``ctx.attr`` (an attribute nobody read makes the import fail) and raises
``ctx.unsupported(...)`` for any setting it cannot compute exactly.
"""

from typing import Any, Callable

import numpy as np

import geon as be
from geon.frontends.onnx.loading import (InvalidOnnxModel, UnsupportedOnnxOp, elem_dtype,
                                         elem_name, element_count, narrow_format)
from geon.op_graph import nn_ops
from geon.op_graph import op_graph as og

gnp = be.np

#: ``{(domain, op_type): [(first_version, last_version, builder), ...]}``
OPS: dict[tuple[str, str], list[tuple[int, int, Callable[..., Any]]]] = {}

_LAST = 10 ** 6


def onnx_op(op_type: str, since: int = 1, until: int = _LAST, domain: str = ""
            ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: register a builder for ``op_type`` at opset versions
    ``since..until`` (inclusive)."""
    def register(fn):
        OPS.setdefault((domain, op_type), []).append((since, until, fn))
        return fn
    return register


def find_builder(domain, op_type, version, where):
    """The builder of ``op_type`` at ``version``, or :class:`UnsupportedOnnxOp`."""
    entries = OPS.get((domain, op_type))
    if not entries:
        raise UnsupportedOnnxOp(f"{where}: op type {op_type!r} is not supported")
    for lo, hi, fn in entries:
        if lo <= version <= hi:
            return fn
    ranges = ", ".join(f"{lo}-{hi if hi != _LAST else ''}" for lo, hi, _ in entries)
    raise UnsupportedOnnxOp(f"{where}: opset {version} is not supported for {op_type} "
                            f"(supported: {ranges})")


def carrier(dtype):
    """The dtype geon computes an ONNX type in: booleans and the narrow float formats
    (bfloat16, float8, float4) as float32, the 4- and 2-bit integers as int8 / uint8."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return np.dtype(np.float32)
    fmt = narrow_format(dtype)
    if fmt is not None:
        return np.dtype(np.float32) if not fmt.startswith(("int", "uint")) else \
            np.dtype(np.int8 if fmt.startswith("int") else np.uint8)
    return dtype


def is_float(dtype):
    """Whether an ONNX type (as a NumPy dtype) is floating point, narrow ones included."""
    dtype = np.dtype(dtype)
    fmt = narrow_format(dtype)
    return fmt is not None and not fmt.startswith(("int", "uint")) or \
        fmt is None and dtype.kind == "f"


def to_narrow(op, dtype, saturate=True, round_mode="up"):
    """``op`` rounded to the narrow format ``dtype`` and held in its carrier (float32,
    int8 or uint8). A float64 value is rounded in float64 (once), anything else in
    float32."""
    fmt = narrow_format(dtype)
    if fmt.startswith(("int", "uint")):
        if op.dtype.kind == "f" and op.dtype != np.float64:
            op = cast(op, np.float32)
    elif op.dtype != np.float64:  # integers too: a float format's result can be NaN
        op = cast(op, np.float32 if op.dtype.kind == "f" or op.dtype.itemsize <= 2
                  else np.float64)
    r = gnp.round_to_format(op, fmt, saturate=saturate, round_mode=round_mode)
    return cast(r, carrier(dtype))


def cast(op, dtype):
    """``op`` converted to the carrier of ``dtype`` (float -> int truncates; -> bool
    is ``!= 0``)."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        r = gnp.not_equal(op, 0)
        return r if r.dtype.kind == "f" else og.Add(r, 0, dtype=np.dtype(np.float32))
    if op.dtype == dtype:
        return op
    # x + -0.0 is x for every float, -0.0 included (x + 0 is not); an integer adds an
    # integer 0, so that it is converted as an integer (not through float64)
    return og.Add(op, -0.0 if op.dtype.kind == "f" else 0, dtype=dtype)


def _same(ctx, op, i=0):
    """``op`` as a result with input ``i``'s ONNX type (a narrow type's result computed
    in float32 is rounded to the format once; arithmetic overflows as IEEE does, to
    infinity or, in a format without one, NaN: saturation is a rule of ``Cast`` only)."""
    d = ctx.dtype(i)
    if narrow_format(d) is not None:
        return ctx.out(to_narrow(op, d, saturate=False), d)
    return ctx.out(cast(op, carrier(d)), d)


def _norm_axis(ctx, axis, rank):
    if not -rank <= axis < max(rank, 1):
        raise ctx.unsupported(f"axis {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


def _float(ctx, i=0):
    if not is_float(ctx.dtype(i)):
        raise ctx.unsupported(f"input {i} of type {ctx.dtype(i)} is not supported "
                              f"(floating point only)")
    return ctx.tensor(i)


# --- elementwise ------------------------------------------------------------------------

def _empty_elementwise(ctx, dtype=None):
    """For an elementwise node with an input of no elements: its result, known from the
    broadcast shape alone (``None`` when every input has elements)."""
    present = [i for i in range(ctx.n_inputs()) if ctx.has(i)]
    if not any(0 in ctx.shape(i) for i in present):
        return None
    shape = np.broadcast_shapes(*(ctx.shape(i) for i in present))
    return [ctx.known(np.empty(shape, dtype if dtype is not None else ctx.dtype(0)))]


def _unary(op_type, fn, since=1, floating=True):
    @onnx_op(op_type, since)
    def build(ctx):
        empty = _empty_elementwise(ctx)
        if empty is not None:
            return empty
        x = _float(ctx) if floating else ctx.tensor(0)
        return [_same(ctx, fn(x))]
    build.__name__ = f"build_{op_type}"


_unary("Neg", gnp.negative, floating=False)
_unary("Abs", gnp.absolute, floating=False)
_unary("Sign", gnp.sign, floating=False)
_unary("Sqrt", gnp.sqrt)
_unary("Exp", gnp.exp)
_unary("Log", gnp.log)
_unary("Tanh", gnp.tanh)
_unary("Sin", gnp.sin)
_unary("Cos", gnp.cos)
_unary("Reciprocal", gnp.reciprocal)
_unary("Sigmoid", be.sigmoid)
_unary("Relu", gnp.relu, floating=False)
_unary("Erf", gnp.erf)
_unary("Softplus", gnp.softplus)
_unary("Identity", lambda x: x, floating=False)


@onnx_op("LeakyRelu")
def _leaky_relu(ctx):
    return [_same(ctx, gnp.leaky_relu(_float(ctx), ctx.attr("alpha", 0.01)))]


def _elu(x, alpha):
    return gnp.where(x > 0, x, gnp.expm1(x) * alpha)


@onnx_op("Elu")
def _elu_op(ctx):
    return [_same(ctx, _elu(_float(ctx), ctx.attr("alpha", 1.0)))]


@onnx_op("Selu")
def _selu(ctx):
    alpha = ctx.attr("alpha", 1.67326319217681884765625)
    gamma = ctx.attr("gamma", 1.05070102214813232421875)
    return [_same(ctx, _elu(_float(ctx), alpha) * gamma)]


@onnx_op("Gelu", 20)
def _gelu(ctx):
    approx = ctx.attr("approximate", "none")
    if approx not in ("none", "tanh"):
        raise ctx.unsupported(f"approximate={approx!r}")
    return [_same(ctx, gnp.gelu(_float(ctx), approximate=approx))]


@onnx_op("HardSigmoid")
def _hard_sigmoid(ctx):
    alpha, beta = ctx.attr("alpha", 0.2), ctx.attr("beta", 0.5)
    return [_same(ctx, gnp.clip(_float(ctx) * alpha + beta, 0.0, 1.0))]


@onnx_op("Clip", 6, 10)
def _clip_attr(ctx):
    lo, hi = ctx.attr("min", -3.4028234663852886e38), ctx.attr("max", 3.4028234663852886e38)
    return [_same(ctx, gnp.clip(_float(ctx), lo, hi))]


@onnx_op("Clip", 11)
def _clip(ctx):
    x = ctx.tensor(0)
    lo = ctx.tensor(1) if ctx.has(1) else None
    hi = ctx.tensor(2) if ctx.has(2) else None
    if lo is None and hi is None:
        return [ctx.out(x, ctx.dtype(0))]
    return [_same(ctx, gnp.clip(x, lo, hi))]


def _binary(op_type, fn, since=7):
    @onnx_op(op_type, since)
    def build(ctx):
        empty = _empty_elementwise(ctx)
        if empty is not None:
            return empty
        return [_same(ctx, fn(ctx.tensor(0), ctx.tensor(1)))]
    build.__name__ = f"build_{op_type}"


_binary("Add", gnp.add)
_binary("Sub", gnp.subtract)
_binary("Mul", gnp.multiply)
_binary("Pow", gnp.power)


@onnx_op("Div", 7)
def _div(ctx):
    empty = _empty_elementwise(ctx)
    if empty is not None:
        return empty
    a, b = ctx.tensor(0), ctx.tensor(1)
    # Integers: the float quotient cast back truncates toward zero, ONNX's (C's) rule.
    return [_same(ctx, gnp.divide(a, b))]


def _compare(op_type, fn, since=7):
    @onnx_op(op_type, since)
    def build(ctx):
        empty = _empty_elementwise(ctx, np.bool_)
        if empty is not None:
            return empty
        return [ctx.out(fn(ctx.tensor(0), ctx.tensor(1)), np.bool_)]
    build.__name__ = f"build_{op_type}"


_compare("Equal", gnp.equal)
_compare("Less", gnp.less)
_compare("LessOrEqual", gnp.less_equal, 12)
_compare("Greater", gnp.greater)
_compare("GreaterOrEqual", gnp.greater_equal, 12)


def _bool_in(ctx, i):
    if ctx.dtype(i) != np.bool_:
        raise ctx.unsupported(f"input {i} must be bool, not {ctx.dtype(i)}")
    return ctx.tensor(i)


@onnx_op("Not")
def _not(ctx):
    return [ctx.out(1.0 - _bool_in(ctx, 0), np.bool_)]


@onnx_op("And", 7)
def _and(ctx):
    return [ctx.out(_bool_in(ctx, 0) * _bool_in(ctx, 1), np.bool_)]


@onnx_op("Or", 7)
def _or(ctx):
    return [ctx.out(gnp.maximum(_bool_in(ctx, 0), _bool_in(ctx, 1)), np.bool_)]


@onnx_op("Xor", 7)
def _xor(ctx):
    return [ctx.out(gnp.not_equal(_bool_in(ctx, 0), _bool_in(ctx, 1)), np.bool_)]


@onnx_op("Where", 9)
def _where(ctx):
    r = gnp.where(ctx.tensor(0), ctx.tensor(1), ctx.tensor(2))
    return [_same(ctx, r, 1)]


def _variadic(op_type, fn, mean=False, since=8):
    @onnx_op(op_type, since)
    def build(ctx):
        xs = [ctx.tensor(i) for i in range(ctx.n_inputs()) if ctx.has(i)]
        if not xs:
            raise ctx.unsupported("no inputs")
        r = xs[0]
        for x in xs[1:]:
            r = fn(r, x)
        if mean:
            r = r / float(len(xs))
        return [_same(ctx, r)]
    build.__name__ = f"build_{op_type}"


_variadic("Max", gnp.maximum)
_variadic("Min", gnp.minimum)
_variadic("Sum", gnp.add)
_variadic("Mean", gnp.add, mean=True)


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


# --- shapes -----------------------------------------------------------------------------

def _shape_arg(ctx, i):
    return [int(d) for d in np.ravel(ctx.const(i))]


@onnx_op("Shape", 1)
def _shape(ctx):
    shape = ctx.shape(0)
    start, end = ctx.attr("start", 0), ctx.attr("end", None)
    return [ctx.known(np.array(shape[slice(start, end)], np.int64))]


@onnx_op("Size", 1)
def _size(ctx):
    return [ctx.known(np.array(element_count(ctx.shape(0)), np.int64))]


@onnx_op("Reshape", 5)
def _reshape(ctx):
    shape = _shape_arg(ctx, 1)
    allowzero = ctx.attr("allowzero", 0)
    old = ctx.shape(0)
    if not allowzero:
        shape = [old[k] if d == 0 and k < len(old) else d for k, d in enumerate(shape)]
    # The given dimensions, exactly (one -1 is inferred by the reshape): astronomical
    # ones are refused here, not wrapped around by an int64 product.
    ctx.bound([d for d in shape if d != -1], ctx.dtype(0), "the target shape")
    return [ctx.out(gnp.reshape(ctx.tensor(0), shape), ctx.dtype(0))]


@onnx_op("Flatten", 1)
def _flatten(ctx):
    shape = ctx.shape(0)
    axis = ctx.attr("axis", 1)
    if not -len(shape) <= axis <= len(shape):
        raise ctx.unsupported(f"axis {axis} out of range")
    if axis < 0:
        axis += len(shape)
    rows = element_count(shape[:axis])
    return [ctx.out(gnp.reshape(ctx.tensor(0), (rows, element_count(shape[axis:]))),
                    ctx.dtype(0))]


@onnx_op("Transpose", 1)
def _transpose(ctx):
    perm = ctx.attr("perm")
    return [ctx.out(gnp.transpose(ctx.tensor(0), perm), ctx.dtype(0))]


def _axes_arg(ctx, since_input):
    if ctx.version >= since_input:
        a = ctx.const(1)
        return None if a is None else [int(v) for v in np.ravel(a)]
    return ctx.attr("axes")


@onnx_op("Squeeze", 1)
def _squeeze(ctx):
    axes = _axes_arg(ctx, 13)
    shape = ctx.shape(0)
    axes = None if not axes else tuple(_norm_axis(ctx, a, len(shape)) for a in axes)
    return [ctx.out(gnp.squeeze(ctx.tensor(0), axes), ctx.dtype(0))]


@onnx_op("Unsqueeze", 1)
def _unsqueeze(ctx):
    axes = _axes_arg(ctx, 13)
    if not axes:
        raise ctx.unsupported("Unsqueeze needs axes")
    n = len(ctx.shape(0)) + len(axes)
    axes = tuple(_norm_axis(ctx, a, n) for a in axes)
    return [ctx.out(gnp.expand_dims(ctx.tensor(0), axes), ctx.dtype(0))]


@onnx_op("Concat", 4)
def _concat(ctx):
    xs = [i for i in range(ctx.n_inputs()) if ctx.has(i)]
    rank = len(ctx.shape(xs[0]))
    axis = _norm_axis(ctx, ctx.attr("axis"), rank)
    out = list(ctx.shape(xs[0]))
    out[axis] = sum(ctx.shape(i)[axis] if len(ctx.shape(i)) == rank else 0 for i in xs)
    ctx.bound(out, carrier(ctx.dtype(xs[0])), known=ctx.all_known())
    if ctx.all_known():  # shapes and constants: NumPy, empty ones too
        return [ctx.known(np.concatenate([ctx.const(i) for i in xs], axis))]
    # Empty inputs add nothing (ONNX allows them; geon has no empty slices to join).
    keep = [i for i in xs if ctx.shape(i)[axis] != 0] or xs[:1]
    if len(keep) == 1:
        return [ctx.out(ctx.tensor(keep[0]), ctx.dtype(keep[0]))]
    return [ctx.out(gnp.concatenate([ctx.tensor(i) for i in keep], axis), ctx.dtype(0))]


def _slice_along(x, axis, start, stop, step=1):
    key = [slice(None)] * gnp.ndim(x)
    key[axis] = slice(start, stop, step)
    return x[tuple(key)]


@onnx_op("Split", 2)
def _split(ctx):
    shape = ctx.shape(0)
    axis = _norm_axis(ctx, ctx.attr("axis", 0), len(shape))
    n_out = len(ctx.node.output)
    if ctx.version >= 13:
        sizes = ctx.const(1)
        sizes = None if sizes is None else [int(s) for s in np.ravel(sizes)]
    else:
        sizes = ctx.attr("split")
    if ctx.version >= 18:
        num = ctx.attr("num_outputs")
        if sizes is None and num is not None:
            n_out = num
            step = -(-shape[axis] // num)
            sizes = [min(step, shape[axis] - k * step) for k in range(num)]
    if not sizes:
        if shape[axis] % n_out:
            raise ctx.unsupported(f"cannot split {shape[axis]} evenly into {n_out}")
        sizes = [shape[axis] // n_out] * n_out
    if sum(sizes) != shape[axis] or any(s < 0 for s in sizes):
        raise ctx.unsupported(f"split sizes {sizes} do not add up to {shape[axis]}")
    start, out = 0, []
    for s in sizes:
        if s == 0 or 0 in shape:  # no elements: known from the shape alone
            part = list(shape)
            part[axis] = s
            out.append(ctx.known(np.empty(part, ctx.dtype(0))))
        else:
            out.append(ctx.out(_slice_along(ctx.tensor(0), axis, start, start + s),
                               ctx.dtype(0)))
        start += s
    return out


@onnx_op("Slice", 1, 9)
def _slice_attr(ctx):
    starts, ends = ctx.attr("starts"), ctx.attr("ends")
    axes = ctx.attr("axes") or list(range(len(starts)))
    return _do_slice(ctx, starts, ends, axes, [1] * len(starts))


@onnx_op("Slice", 10)
def _slice(ctx):
    starts, ends = _shape_arg(ctx, 1), _shape_arg(ctx, 2)
    axes = _shape_arg(ctx, 3) if ctx.has(3) else list(range(len(starts)))
    steps = _shape_arg(ctx, 4) if ctx.has(4) else [1] * len(starts)
    return _do_slice(ctx, starts, ends, axes, steps)


def _do_slice(ctx, starts, ends, axes, steps):
    shape = ctx.shape(0)
    key = [slice(None)] * len(shape)
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = _norm_axis(ctx, a, len(shape))
        if st == 0:
            raise ctx.unsupported("slice step 0")
        key[a] = slice(s, e, st)
    if ctx.value(0).array is not None:  # shapes and constants: NumPy, empty ones too
        return [ctx.known(ctx.const(0)[tuple(key)])]
    if any(len(range(*k.indices(n))) == 0 for k, n in zip(key, shape)):
        # No elements: the result is known from its shape alone.
        out = tuple(len(range(*k.indices(n))) for k, n in zip(key, shape))
        return [ctx.known(np.empty(out, ctx.dtype(0)))]
    return [ctx.out(ctx.tensor(0)[tuple(key)], ctx.dtype(0))]


@onnx_op("Gather", 1)
def _gather(ctx):
    shape = ctx.shape(0)
    axis = _norm_axis(ctx, ctx.attr("axis", 0), len(shape))
    if ctx.dtype(1).kind not in "iu":
        raise ctx.unsupported("indices must be integers")
    ctx.bound(shape[:axis] + ctx.shape(1) + shape[axis + 1:], carrier(ctx.dtype(0)))
    if ctx.value(1).array is not None:
        idx = ctx.const(1).astype(np.int64)
        if idx.size and (idx.min() < -shape[axis] or idx.max() >= shape[axis]):
            raise ctx.unsupported(f"index out of range for axis of length {shape[axis]}")
        if idx.ndim == 0:  # one position: a slice, the axis dropped
            r = _slice_along(ctx.tensor(0), axis, int(idx) % shape[axis],
                             int(idx) % shape[axis] + 1)
            return [ctx.out(gnp.squeeze(r, axis), ctx.dtype(0))]
        ind = gnp.constant(idx)
    else:
        ind = ctx.tensor(1)
    return [ctx.out(gnp.take(ctx.tensor(0), ind, axis), ctx.dtype(0))]


@onnx_op("Tile", 6)
def _tile(ctx):
    shape, reps = ctx.shape(0), _shape_arg(ctx, 1)
    if len(reps) != len(shape) or any(r < 0 for r in reps):
        raise ctx.unsupported(f"repeats {reps} for an input of shape {shape}")
    ctx.bound([d * r for d, r in zip(shape, reps)], carrier(ctx.dtype(0)))
    return [ctx.out(gnp.tile(ctx.tensor(0), reps), ctx.dtype(0))]


@onnx_op("Expand", 8)
def _expand(ctx):
    target = _shape_arg(ctx, 1)
    ctx.bound(target, carrier(ctx.dtype(0)), "the target shape")
    shape = np.broadcast_shapes(ctx.shape(0), tuple(target))
    ctx.bound(shape, carrier(ctx.dtype(0)))
    return [ctx.out(gnp.broadcast_to(ctx.tensor(0), shape), ctx.dtype(0))]


def _pad_common(ctx, pads, value, axes):
    shape = ctx.shape(0)
    rank = len(shape)
    mode = ctx.attr("mode", "constant")
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise ctx.unsupported(f"mode={mode!r}")
    axes = list(range(rank)) if axes is None else [_norm_axis(ctx, a, rank) for a in axes]
    if len(pads) != 2 * len(axes):
        raise ctx.unsupported(f"pads {pads} do not fit axes {axes}")
    width = [[0, 0] for _ in range(rank)]
    for k, a in enumerate(axes):
        width[a] = [pads[k], pads[k + len(axes)]]
    pos = [[max(b, 0), max(e, 0)] for b, e in width]
    if any((b < 0 or e < 0) and n + b + e <= 0 for (b, e), n in zip(width, shape)):
        raise ctx.unsupported("padding that removes every element")
    dtype = carrier(ctx.dtype(0))
    ctx.bound([n + b + e for (b, e), n in zip(pos, shape)], dtype, "the padded input")
    ctx.bound([n + b + e for (b, e), n in zip(width, shape)], dtype)
    x = ctx.tensor(0)
    if mode == "reflect" and any(p >= n for (b, e), n in zip(pos, shape) for p in (b, e)):
        raise ctx.unsupported("reflect padding as wide as the dimension")
    if mode == "wrap":  # the far end's elements before, the near end's after
        for a, (b, e) in enumerate(pos):
            if b > shape[a] or e > shape[a]:
                raise ctx.unsupported("wrap padding wider than the dimension")
            parts = ([_slice_along(x, a, shape[a] - b, shape[a])] if b else []) + [x] + \
                ([_slice_along(x, a, 0, e)] if e else [])
            x = gnp.concatenate(parts, a) if len(parts) > 1 else x
    elif any(b or e for b, e in pos):
        x = gnp.pad(x, pos, mode=mode, constant_values=value) if mode == "constant" \
            else gnp.pad(x, pos, mode=mode)
    if any(b < 0 or e < 0 for b, e in width):  # negative pads remove elements
        key = []
        for (b, e), n in zip(width, shape):
            size = n + b + e
            if size <= 0:
                raise ctx.unsupported("padding that removes every element")
            start = -b if b < 0 else 0
            key.append(slice(start, start + size))
        x = x[tuple(key)]
    return [ctx.out(x, ctx.dtype(0))]


@onnx_op("Pad", 2, 10)
def _pad_attr(ctx):
    return _pad_common(ctx, ctx.attr("pads"), ctx.attr("value", 0.0), None)


@onnx_op("Pad", 11)
def _pad(ctx):
    pads = _shape_arg(ctx, 1)
    value = ctx.const(2)
    value = 0.0 if value is None or value.size == 0 else float(np.ravel(value)[0])
    axes = _shape_arg(ctx, 3) if ctx.has(3) else None
    return _pad_common(ctx, pads, value, axes)


def _cast_to(ctx, to_type, saturate=True, round_mode="up"):
    dtype = elem_dtype(to_type)
    if dtype is None:
        raise ctx.unsupported(f"cast to {elem_name(to_type)} is not supported")
    src = ctx.dtype(0)
    v = ctx.value(0)
    fmt = narrow_format(dtype)
    if v.array is not None:
        ctx.bound(v.array.shape, np.float64 if fmt is not None else dtype, known=True)
    if v.array is not None and fmt is None:
        return [ctx.known(v.array.astype(dtype))]
    if v.array is not None:  # rounded by geon's rule, then held in the ml_dtypes type
        from geon.op_graph.formats import round_array
        a = v.array.astype(carrier(src))
        if a.dtype.kind == "f" and a.dtype != np.float64:
            a = a.astype(np.float32)
        return [ctx.known(round_array(a, fmt, saturate, round_mode).astype(dtype))]
    op = ctx.tensor(0)
    if src == np.bool_ and dtype != np.bool_:
        op = cast(op, np.float32 if fmt is not None else dtype)
    if fmt is not None:
        return [ctx.out(to_narrow(op, dtype, saturate, round_mode), dtype)]
    return [ctx.out(cast(op, carrier(dtype)), dtype)]


@onnx_op("Cast", 6)
def _cast(ctx):
    # `saturate` matters for the float8 targets, `round_mode` for FLOAT8E8M0 only.
    saturate = bool(ctx.attr("saturate", 1))
    round_mode = ctx.attr("round_mode", "up")
    if round_mode not in ("up", "down", "nearest"):
        raise ctx.unsupported(f"round_mode={round_mode!r}")
    return _cast_to(ctx, ctx.attr("to"), saturate, round_mode)


@onnx_op("CastLike", 15)
def _cast_like(ctx):
    saturate = bool(ctx.attr("saturate", 1))
    round_mode = ctx.attr("round_mode", "up")
    if round_mode not in ("up", "down", "nearest"):
        raise ctx.unsupported(f"round_mode={round_mode!r}")
    dtype = ctx.dtype(1)
    from onnx.helper import np_dtype_to_tensor_dtype
    return _cast_to(ctx, np_dtype_to_tensor_dtype(dtype), saturate, round_mode)


@onnx_op("Constant", 1)
def _constant(ctx):
    present = [a for a in ctx.attrs]
    if len(present) != 1:
        raise ctx.unsupported(f"attributes {present}")
    name = present[0]
    if name in ("sparse_value", "value_string", "value_strings"):
        ctx.read.add(name)
        raise ctx.unsupported(f"{name} is not supported")
    value = ctx.attr(name)
    dtype = {"value_float": np.float32, "value_floats": np.float32,
             "value_int": np.int64, "value_ints": np.int64}.get(name)
    return [ctx.known(np.asarray(value, dtype=dtype))]


@onnx_op("ConstantOfShape", 9)
def _constant_of_shape(ctx):
    shape = _shape_arg(ctx, 0)
    value = ctx.attr("value")
    value = np.zeros(1, np.float32) if value is None else value
    if any(d < 0 for d in shape):
        raise ctx.unsupported(f"negative dimension in shape {shape}")
    n = ctx.bound(shape, carrier(value.dtype))
    if n * value.dtype.itemsize > (1 << 16):  # large: a filled constant, not an array
        return [ctx.out(gnp.full(shape, np.ravel(value)[0], dtype=carrier(value.dtype)),
                        value.dtype)]
    ctx.bound(shape, value.dtype, known=True)
    return [ctx.known(np.full(shape, np.ravel(value)[0], dtype=value.dtype))]


def _range_length(ctx, start, limit, delta):
    """The length of ``Range``'s result, ONNX's ``max(ceil((limit - start) / delta),
    0)``, before anything is allocated: exactly for integers; for floats as NumPy's
    ``arange`` (ONNX's reference) computes it, the difference in the inputs' type."""
    if start.dtype.kind in "iu":
        s, l, d = int(start), int(limit), int(delta)
        if d == 0:
            raise ctx.unsupported("Range with delta 0")
        return max(-((s - l) // d), 0)  # ceil((l - s) / d) in integers
    with np.errstate(all="ignore"):
        n = float((limit - start) / delta)
    if not np.isfinite(n):
        raise InvalidOnnxModel(f"{ctx.where}: Range from {start} to {limit} by {delta} has "
                               f"no finite length")
    return max(int(np.ceil(n)), 0)


@onnx_op("Range", 11)
def _range(ctx):
    start, limit, delta = (ctx.const(i) for i in range(3))
    if any(v.size != 1 for v in (start, limit, delta)):
        raise ctx.unsupported("start, limit and delta must be scalars")
    start, limit, delta = (v.reshape(()) for v in (start, limit, delta))
    ctx.bound([_range_length(ctx, start, limit, delta)], start.dtype, "the range",
              known=True)
    return [ctx.known(np.arange(start, limit, delta, dtype=start.dtype))]


# --- dropout, running sums, top-k ---------------------------------------------------------

def _dropout_result(ctx, x):
    mask = None
    if len(ctx.node.output) > 1 and ctx.node.output[1]:
        mask = ctx.out(gnp.full(ctx.shape(0), 1.0), np.bool_)
    return [ctx.out(x, ctx.dtype(0)), mask]


@onnx_op("Dropout", 7, 11)
def _dropout_old(ctx):
    ctx.attr("ratio", 0.5)  # inference: the input passes unchanged whatever the ratio
    return _dropout_result(ctx, ctx.tensor(0))


@onnx_op("Dropout", 12)
def _dropout(ctx):
    ctx.attr("seed")
    training = ctx.const(2)
    ratio = ctx.const(1)
    if training is not None and bool(np.ravel(training)[0]) and \
            (ratio is None or float(np.ravel(ratio)[0]) != 0.0):
        raise ctx.unsupported("training_mode=True with a nonzero ratio (random masks are "
                              "not reproducible)")
    return _dropout_result(ctx, ctx.tensor(0))


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


# --- normalization ----------------------------------------------------------------------

def _channel_shape(rank):
    return (1, -1) + (1,) * (rank - 2)


@onnx_op("BatchNormalization", 9)
def _batch_norm(ctx):
    x = _float(ctx)
    shape = ctx.shape(0)
    rank = len(shape)
    eps = ctx.attr("epsilon", 1e-5)
    momentum = ctx.attr("momentum", 0.9)
    training = ctx.attr("training_mode", 0) if ctx.version >= 14 else 0
    if ctx.version < 14 and len([o for o in ctx.node.output if o]) > 1:
        raise ctx.unsupported("training outputs of opset < 14")
    cs = (shape[1],) + (1,) * (rank - 2) if rank > 1 else ()

    def per_channel(i):
        return gnp.reshape(ctx.tensor(i), cs)

    scale, bias = per_channel(1), per_channel(2)
    red = tuple(a for a in range(rank) if a != 1)
    if training:
        mean = gnp.mean(x, red, keepdims=True)
        var = gnp.mean(gnp.square(x - mean), red, keepdims=True)
        y = (x - mean) / gnp.sqrt(var + eps) * scale + bias
        flat = (shape[1],)
        run_mean = ctx.tensor(3) * momentum + gnp.reshape(mean, flat) * (1 - momentum)
        run_var = ctx.tensor(4) * momentum + gnp.reshape(var, flat) * (1 - momentum)
        return [_same(ctx, y), _same(ctx, run_mean, 3), _same(ctx, run_var, 4)]
    y = (x - per_channel(3)) / gnp.sqrt(per_channel(4) + eps) * scale + bias
    return [_same(ctx, y)]


@onnx_op("LayerNormalization", 17)
def _layer_norm(ctx):
    x = _float(ctx)
    shape = ctx.shape(0)
    axis = _norm_axis(ctx, ctx.attr("axis", -1), len(shape))
    eps = ctx.attr("epsilon", 1e-5)
    stash = ctx.attr("stash_type", 1)
    if stash != 1:
        raise ctx.unsupported(f"stash_type={stash}")
    red = tuple(range(axis, len(shape)))
    # Statistics in float32 at least (stash_type=1), as the spec asks.
    xs = cast(x, np.float32) if x.dtype.itemsize < 4 else x
    mean = gnp.mean(xs, red, keepdims=True)
    d = xs - mean
    var = gnp.mean(d * d, red, keepdims=True)
    inv = 1.0 / gnp.sqrt(var + eps)
    y = d * inv * ctx.tensor(1)
    if ctx.has(2):
        y = y + ctx.tensor(2)
    return [_same(ctx, y), ctx.out(mean, np.dtype(mean.dtype)),
            ctx.out(inv, np.dtype(inv.dtype))]


@onnx_op("GlobalAveragePool", 1)
def _global_avg_pool(ctx):
    rank = len(ctx.shape(0))
    return [_same(ctx, gnp.mean(_float(ctx), tuple(range(2, rank)), keepdims=True))]


@onnx_op("GlobalMaxPool", 1)
def _global_max_pool(ctx):
    rank = len(ctx.shape(0))
    return [_same(ctx, gnp.max(_float(ctx), tuple(range(2, rank)), keepdims=True))]


# --- recurrent layers (unrolled over the static sequence length) ---------------------------

_ACTS = {"Sigmoid": be.sigmoid, "Tanh": gnp.tanh, "Relu": gnp.relu}


def _rnn_common(ctx, gates, defaults):
    hidden = ctx.attr("hidden_size")
    direction = ctx.attr("direction", "forward")
    if direction not in ("forward", "reverse", "bidirectional"):
        raise ctx.unsupported(f"direction={direction!r}")
    dirs = 2 if direction == "bidirectional" else 1
    acts = ctx.attr("activations") or defaults * dirs
    if len(acts) != len(defaults) * dirs or any(a not in _ACTS for a in acts):
        raise ctx.unsupported(f"activations={acts}")
    if ctx.attr("activation_alpha") or ctx.attr("activation_beta"):
        raise ctx.unsupported("activation_alpha / activation_beta")
    if ctx.attr("clip") is not None:
        raise ctx.unsupported("clip")
    layout = ctx.attr("layout", 0)
    x = _float(ctx)
    if layout:
        x = gnp.transpose(x, (1, 0, 2))
    seq, batch, _ = gnp.shape(x)
    w_shape = ctx.shape(1)
    if hidden is None:
        hidden = w_shape[1] // gates
    if ctx.has(4):
        lens = ctx.const(4)
        if np.any(lens != seq):
            raise ctx.unsupported("sequence_lens shorter than the sequence")
    return hidden, direction, dirs, acts, layout, x, seq, batch


def _rnn_outputs(ctx, per_dir, layout, extra_count):
    """Y (seq, dirs, batch, hidden) and the last states, from each direction's list of
    states per step (in time order) and its last extra states."""
    ys = [gnp.stack(steps, 0) for steps, _ in per_dir]          # (seq, batch, H)
    y = gnp.stack(ys, 1)                                         # (seq, dirs, batch, H)
    outs = []
    if layout:
        y = gnp.transpose(y, (2, 0, 1, 3))
    outs.append(_same(ctx, y))
    for k in range(extra_count):
        last = gnp.stack([finals[k] for _, finals in per_dir], 0)  # (dirs, batch, H)
        if layout:
            last = gnp.transpose(last, (1, 0, 2))
        outs.append(_same(ctx, last))
    return outs


def _initial(ctx, i, d, layout, batch, hidden, dtype):
    if not ctx.has(i):
        return gnp.zeros((batch, hidden), dtype=dtype)
    s = ctx.tensor(i)
    return s[:, d] if layout else s[d]


@onnx_op("LSTM", 7)
def _lstm(ctx):
    hidden, direction, dirs, acts, layout, x, seq, batch = _rnn_common(
        ctx, 4, ["Sigmoid", "Tanh", "Tanh"])
    if ctx.attr("input_forget", 0):
        raise ctx.unsupported("input_forget")
    W, R = ctx.tensor(1), ctx.tensor(2)
    dtype = x.dtype
    per_dir = []
    for d in range(dirs):
        f_act, g_act, h_act = (_ACTS[a] for a in acts[3 * d:3 * d + 3])
        Wt, Rt = gnp.transpose(W[d]), gnp.transpose(R[d])     # (I, 4H), (H, 4H)
        b = ctx.tensor(3)[d] if ctx.has(3) else None
        bias = b[:4 * hidden] + b[4 * hidden:] if b is not None else None
        P = ctx.tensor(7)[d] if ctx.has(7) else None
        h = _initial(ctx, 5, d, layout, batch, hidden, dtype)
        c = _initial(ctx, 6, d, layout, batch, hidden, dtype)
        reverse = direction == "reverse" or d == 1
        steps = [None] * seq
        xw = gnp.matmul(x, Wt)                                 # (seq, batch, 4H)
        for t in (range(seq - 1, -1, -1) if reverse else range(seq)):
            z = xw[t] + gnp.matmul(h, Rt)
            if bias is not None:
                z = z + bias
            i_, o_, f_, g_ = (z[:, k * hidden:(k + 1) * hidden] for k in range(4))
            if P is not None:
                i_ = i_ + P[:hidden] * c
                f_ = f_ + P[2 * hidden:] * c
            i_, f_, g_ = f_act(i_), f_act(f_), g_act(g_)
            c = f_ * c + i_ * g_
            if P is not None:
                o_ = o_ + P[hidden:2 * hidden] * c
            h = f_act(o_) * h_act(c)
            steps[t] = h
        per_dir.append((steps, (h, c)))
    return _rnn_outputs(ctx, per_dir, layout, 2)


@onnx_op("GRU", 7)
def _gru(ctx):
    hidden, direction, dirs, acts, layout, x, seq, batch = _rnn_common(
        ctx, 3, ["Sigmoid", "Tanh"])
    lbr = ctx.attr("linear_before_reset", 0)
    W, R = ctx.tensor(1), ctx.tensor(2)
    dtype = x.dtype
    per_dir = []
    for d in range(dirs):
        f_act, g_act = (_ACTS[a] for a in acts[2 * d:2 * d + 2])
        Wt, Rt = gnp.transpose(W[d]), gnp.transpose(R[d])     # (I, 3H), (H, 3H)
        b = ctx.tensor(3)[d] if ctx.has(3) else None
        h = _initial(ctx, 5, d, layout, batch, hidden, dtype)
        reverse = direction == "reverse" or d == 1
        steps = [None] * seq
        xw = gnp.matmul(x, Wt)
        if b is not None:
            xw = xw + b[:3 * hidden]

        def part(v, k):
            return v[..., k * hidden:(k + 1) * hidden]

        for t in (range(seq - 1, -1, -1) if reverse else range(seq)):
            xt = xw[t]
            Rz, Rr, Rh = (Rt[:, k * hidden:(k + 1) * hidden] for k in range(3))
            rb = [b[3 * hidden + k * hidden:3 * hidden + (k + 1) * hidden]
                  for k in range(3)] if b is not None else [0.0, 0.0, 0.0]
            z = f_act(part(xt, 0) + gnp.matmul(h, Rz) + rb[0])
            r = f_act(part(xt, 1) + gnp.matmul(h, Rr) + rb[1])
            if lbr:
                n = g_act(part(xt, 2) + r * (gnp.matmul(h, Rh) + rb[2]))
            else:
                n = g_act(part(xt, 2) + gnp.matmul(r * h, Rh) + rb[2])
            h = (1.0 - z) * n + z * h
            steps[t] = h
        per_dir.append((steps, (h,)))
    return _rnn_outputs(ctx, per_dir, layout, 1)



# --- convolution and pooling --------------------------------------------------------------

def _window_attrs(ctx, n, dilations=True):
    """``(kernel, strides, dilations)`` of a Conv / pooling node over ``n`` spatial
    dimensions."""
    kernel = ctx.attr("kernel_shape")
    strides = ctx.attr("strides") or [1] * n
    dil = (ctx.attr("dilations") or [1] * n) if dilations else [1] * n
    if len(strides) != n or len(dil) != n or (kernel is not None and len(kernel) != n):
        raise ctx.unsupported(f"kernel_shape / strides / dilations do not fit {n} spatial "
                              f"dimensions")
    return kernel, strides, dil


def _pads(ctx, sizes, kernel, strides, dil):
    """Per-dimension ``(lo, hi)`` padding from ``pads`` or ``auto_pad``."""
    n = len(sizes)
    auto = ctx.attr("auto_pad", "NOTSET")
    pads = ctx.attr("pads")
    if auto in ("NOTSET", ""):
        pads = pads or [0] * (2 * n)
        if len(pads) != 2 * n or min(pads) < 0:
            raise ctx.unsupported(f"pads {pads}")
        return [(pads[i], pads[i + n]) for i in range(n)]
    if auto == "VALID":
        return [(0, 0)] * n
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise ctx.unsupported(f"auto_pad={auto!r}")
    out = []
    for L, k, s, d in zip(sizes, kernel, strides, dil):
        total = max((-(-L // s) - 1) * s + (k - 1) * d + 1 - L, 0)
        small = total // 2
        out.append((small, total - small) if auto == "SAME_UPPER" else (total - small, small))
    return out


@onnx_op("Conv", 1)
def _conv(ctx):
    x, w = _float(ctx), _float(ctx, 1)
    wshape = ctx.shape(1)
    n = len(wshape) - 2
    kernel, strides, dil = _window_attrs(ctx, n)
    if kernel is not None and list(kernel) != list(wshape[2:]):
        raise ctx.unsupported(f"kernel_shape {kernel} differs from the filter {wshape}")
    pads = _pads(ctx, ctx.shape(0)[2:], wshape[2:], strides, dil)
    y = gnp.conv(x, w, stride=strides, padding=pads, dilation=dil, groups=ctx.attr("group", 1))
    if ctx.has(2):
        y = y + gnp.reshape(ctx.tensor(2), (-1,) + (1,) * n)
    return [_same(ctx, y)]


@onnx_op("ConvTranspose", 1)
def _conv_transpose(ctx):
    x, w = _float(ctx), _float(ctx, 1)
    wshape, xshape = ctx.shape(1), ctx.shape(0)
    n = len(wshape) - 2
    kernel, strides, dil = _window_attrs(ctx, n)
    if kernel is not None and list(kernel) != list(wshape[2:]):
        raise ctx.unsupported(f"kernel_shape {kernel} differs from the filter {wshape}")
    opad = ctx.attr("output_padding") or [0] * n
    out_shape = ctx.attr("output_shape")
    auto = ctx.attr("auto_pad", "NOTSET")
    if out_shape is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        if out_shape is None:
            out_shape = [L * s for L, s in zip(xshape[2:], strides)]
        out_shape = list(out_shape)[-n:]
        pads, opad = [], list(opad)
        for j, (L, k, s, d, want) in enumerate(zip(xshape[2:], wshape[2:], strides, dil,
                                                    out_shape)):
            total = s * (L - 1) + opad[j] + (k - 1) * d + 1 - want
            if total < 0:  # longer than the full result: output padding at the end
                opad[j] -= total
                total = 0
            half = total // 2
            pads.append((half, total - half) if auto == "SAME_UPPER" else (total - half, half))
        ctx.attr("pads")
    else:
        pads = _pads(ctx, xshape[2:], wshape[2:], strides, dil)
    y = gnp.conv_transpose(x, w, stride=strides, padding=pads, output_padding=opad,
                           dilation=dil, groups=ctx.attr("group", 1))
    if ctx.has(2):
        y = y + gnp.reshape(ctx.tensor(2), (-1,) + (1,) * n)
    return [_same(ctx, y)]


def _ceil_pads(ctx, sizes, kernel, strides, dil, pads):
    """With ``ceil_mode``, the extra end padding that makes the floor rule give the ceil
    rule's output length (a last window must start inside the input or the start
    padding); ``None`` when ceil mode changes nothing."""
    extra, changed = [], False
    for L, k, s, d, (lo, hi) in zip(sizes, kernel, strides, dil, pads):
        span = L + lo + hi - (k - 1) * d - 1
        floor_n, ceil_n = span // s + 1, -(-span // s) + 1
        if ceil_n > floor_n and (ceil_n - 1) * s >= L + lo:
            ceil_n -= 1
        changed |= ceil_n != floor_n
        extra.append((lo, hi + (ceil_n - floor_n) * s))
    return extra if changed else None


def _bound_windows(ctx, sizes, kernel, strides, dil, pads):
    """Check the window positions of a pooling before geon builds it: along each
    spatial dimension, the windows times the kernel's taps (what geon computes at build
    time to check that every window reads an input element)."""
    for i, (L, k, s, d, (lo, hi)) in enumerate(zip(sizes, kernel, strides, dil, pads)):
        if k < 1 or s < 1 or d < 1:
            raise ctx.unsupported(f"kernel {kernel}, strides {strides}, dilations {dil}")
        n = (L + lo + hi - d * (k - 1) - 1) // s + 1
        ctx.bound((max(n, 0), k), np.int64, f"the window taps of spatial dimension {i}")


def _pool_input(ctx):
    """MaxPool's input as floats: integers up to 16 bits in float32 and 32-bit ones in
    float64, both exact (a max pool only selects values)."""
    d = ctx.dtype(0)
    if is_float(d):
        return ctx.tensor(0)
    if d.kind in "iu" and d.itemsize <= 4:
        return cast(ctx.tensor(0), np.float32 if d.itemsize <= 2 else np.float64)
    raise ctx.unsupported(f"input 0 of type {d} is not supported")


@onnx_op("MaxPool", 1)
def _max_pool(ctx):
    want_indices = len(ctx.node.output) > 1 and bool(ctx.node.output[1])
    storage_order = ctx.attr("storage_order", 0)  # only the Indices output depends on it
    if storage_order not in (0, 1):
        raise ctx.unsupported(f"storage_order={storage_order}")
    x = _pool_input(ctx)
    sizes = ctx.shape(0)[2:]
    n = len(sizes)
    kernel, strides, dil = _window_attrs(ctx, n)
    pads = _pads(ctx, sizes, kernel, strides, dil)
    if ctx.attr("ceil_mode", 0):
        pads = _ceil_pads(ctx, sizes, kernel, strides, dil, pads) or pads
    _bound_windows(ctx, sizes, kernel, strides, dil, pads)
    y = gnp.max_pool(x, kernel, stride=strides, padding=pads, dilation=dil)
    out = [_same(ctx, y)]
    if want_indices:
        out.append(ctx.out(_max_pool_indices(ctx, x, y, kernel, strides, dil, pads,
                                             storage_order), np.int64))
    return out


def _max_pool_indices(ctx, x, y, kernel, strides, dil, pads, storage_order):
    """MaxPool's Indices output: for each window, the flat position in the input
    ``(N, C, *spatial)`` of its first maximum in window order (ONNX's reference
    order); ``storage_order=1`` counts the spatial positions column-major. Each
    kernel offset's strided slice of the (-inf padded) input is compared with the
    window maxima; the positions of the slices are known at import."""
    shape = ctx.shape(0)
    sizes = shape[2:]
    n = len(sizes)
    outs = gnp.shape(y)[2:]
    # Spatial positions, row- or column-major, -1 in the padding.
    if storage_order == 0:
        mult = [element_count(sizes[i + 1:]) for i in range(n)]
    else:
        mult = [element_count(sizes[:i]) for i in range(n)]
    # Positions known at import: the padded grid, and one slice of it per kernel offset.
    ctx.bound((n + 1,) + tuple(L + lo + hi for L, (lo, hi) in zip(sizes, pads)), np.int64,
              "the padded positions of the input")
    ctx.bound((element_count(kernel),) + tuple(outs), np.int64,
              "the positions of every kernel offset")
    grid = np.indices(sizes, dtype=np.int64)
    pos = sum(g * m for g, m in zip(grid, mult)) if n else np.zeros((), np.int64)
    pos = np.pad(pos, pads, constant_values=-1)
    xp = gnp.pad(x, [(0, 0), (0, 0)] + [list(p) for p in pads], mode="constant",
                 constant_values=-np.inf) if any(lo or hi for lo, hi in pads) else x
    offsets = list(np.ndindex(*kernel))
    found = None
    for off in reversed(offsets):  # the first offset in window order is applied last
        key = tuple(slice(o * d, o * d + s * (m - 1) + 1, s)
                    for o, d, s, m in zip(off, dil, strides, outs))
        here = gnp.constant(np.ascontiguousarray(pos[key]))
        if found is None:
            found = gnp.broadcast_to(here, gnp.shape(y))
            continue
        hit = gnp.equal(xp[(slice(None), slice(None)) + key], y)
        found = gnp.where(hit, here, found)
    channel = np.arange(shape[0] * shape[1], dtype=np.int64).reshape(
        shape[:2] + (1,) * n) * element_count(sizes)
    return found + gnp.constant(channel)


@onnx_op("AveragePool", 1)
def _avg_pool(ctx):
    x = _float(ctx)
    sizes = ctx.shape(0)[2:]
    n = len(sizes)
    kernel, strides, dil = _window_attrs(ctx, n)
    pads = _pads(ctx, sizes, kernel, strides, dil)
    include = bool(ctx.attr("count_include_pad", 0))
    ceil = _ceil_pads(ctx, sizes, kernel, strides, dil, pads) if ctx.attr("ceil_mode", 0) \
        else None
    _bound_windows(ctx, sizes, kernel, strides, dil, ceil or pads)
    if ceil is None and all(d == 1 for d in dil):
        return [_same(ctx, gnp.avg_pool(x, kernel, stride=strides, padding=pads,
                                        count_include_pad=include))]
    # Dilated windows, or the extra windows of ceil mode: each window's sum (a grouped
    # convolution with ones) divided by its count of elements, which is the same sum
    # over a mask of what counts (the input, and the explicit padding if
    # count_include_pad), known at import.
    full = ceil or pads
    channels = ctx.shape(0)[1]
    padded = [L + lo + hi for L, (lo, hi) in zip(sizes, full)]
    ctx.bound((channels, 1) + tuple(kernel), x.dtype, "the kernel of ones")
    ctx.bound(padded, x.dtype, "the mask of the padded input")
    ones = gnp.constant(np.ones((channels, 1) + tuple(kernel), x.dtype))
    sums = gnp.conv(x, ones, stride=strides, padding=full, dilation=dil, groups=channels)
    mask = np.zeros(padded, x.dtype)
    inner = tuple(slice(lo, lo + L) for L, (lo, _) in zip(sizes, pads)) if not include \
        else tuple(slice(0, lo + L + hi) for L, (lo, hi) in zip(sizes, pads))
    mask[inner] = 1
    counts = be.evaluate(gnp.conv(gnp.constant(mask[None, None]),
                                  gnp.constant(np.ones((1, 1) + tuple(kernel), x.dtype)),
                                  stride=strides, dilation=dil))[0]
    return [_same(ctx, sums / gnp.constant(counts))]


@onnx_op("RMSNormalization", 23)
def _rms_norm(ctx):
    x = _float(ctx)
    shape = ctx.shape(0)
    axis = _norm_axis(ctx, ctx.attr("axis", -1), len(shape))
    eps = ctx.attr("epsilon", 1e-5)
    if ctx.attr("stash_type", 1) != 1:
        raise ctx.unsupported("stash_type other than 1")
    xs = cast(x, np.float32) if x.dtype.itemsize < 4 else x
    ms = gnp.mean(xs * xs, tuple(range(axis, len(shape))), keepdims=True)
    y = cast(xs / gnp.sqrt(ms + eps), x.dtype) * ctx.tensor(1)
    return [_same(ctx, y)]


# --- losses ------------------------------------------------------------------------------

def _nll(ctx, logp, target_i, weight_i):
    """The negative log-likelihood of ``logp`` (N, C, d1, ...) at the integer targets
    (N, d1, ...), as ``NegativeLogLikelihoodLoss`` defines it. The class picked is a
    one-hot mask (targets equal to ``ignore_index`` pick nothing and weigh nothing)."""
    shape = gnp.shape(logp)
    if len(shape) < 2:
        raise ctx.unsupported("input of rank < 2")
    if ctx.dtype(target_i).kind not in "iu":
        raise ctx.unsupported("targets must be integers")
    reduction = ctx.attr("reduction", "mean")
    if reduction not in ("none", "sum", "mean"):
        raise ctx.unsupported(f"reduction={reduction!r}")
    ignore = ctx.attr("ignore_index")
    ctx.check_labels(target_i, shape[1], ignore)
    target = ctx.tensor(target_i)
    classes = np.arange(shape[1]).reshape((1, -1) + (1,) * (len(shape) - 2))
    onehot = gnp.equal(gnp.expand_dims(target, 1), gnp.constant(classes))
    if ignore is not None:
        onehot = onehot * gnp.expand_dims(gnp.not_equal(target, ignore), 1)
    onehot = cast(onehot, logp.dtype)
    if ctx.has(weight_i):
        w = gnp.sum(onehot * gnp.reshape(ctx.tensor(weight_i), classes.shape), axis=1)
    else:
        w = gnp.sum(onehot, axis=1)
    loss = -gnp.sum(logp * onehot, axis=1) * (w if ctx.has(weight_i) else 1.0)
    if reduction == "sum":
        loss = gnp.sum(loss)
    elif reduction == "mean":
        loss = gnp.sum(loss) / gnp.sum(w)
    return loss


@onnx_op("NegativeLogLikelihoodLoss", 12)
def _nll_loss(ctx):
    return [_same(ctx, _nll(ctx, _float(ctx), 1, 2))]


@onnx_op("SoftmaxCrossEntropyLoss", 12)
def _softmax_cross_entropy(ctx):
    logp = gnp.log_softmax(_float(ctx), axis=1)
    return [_same(ctx, _nll(ctx, logp, 1, 2)), _same(ctx, logp)]


@onnx_op("ThresholdedRelu", 10)
def _thresholded_relu(ctx):
    x = _float(ctx)
    return [_same(ctx, gnp.where(x > ctx.attr("alpha", 1.0), x, 0.0))]


@onnx_op("GatherElements", 11)
def _gather_elements(ctx):
    dshape, ishape = ctx.shape(0), ctx.shape(1)
    axis = _norm_axis(ctx, ctx.attr("axis", 0), len(dshape))
    if len(dshape) != len(ishape) or any(i > d for k, (i, d) in enumerate(zip(ishape, dshape))
                                         if k != axis):
        raise ctx.unsupported(f"indices of shape {ishape} for data of shape {dshape}")
    if ctx.dtype(1).kind not in "iu":
        raise ctx.unsupported("indices must be integers")
    # Positions in the flattened data: the index along `axis`, the element's own
    # position along the others (known at import).
    idx = cast(ctx.tensor(1), np.int64)
    length = dshape[axis]
    idx = gnp.where(idx < 0, idx + length, idx)
    strides = [element_count(dshape[k + 1:]) for k in range(len(dshape))]
    ctx.bound((len(ishape),) + tuple(ishape), np.int64, "the positions of the indices")
    grid = np.indices(ishape, dtype=np.int64)
    offset = sum(grid[k] * strides[k] for k in range(len(dshape)) if k != axis)
    flat = idx * strides[axis] + gnp.constant(np.asarray(offset, np.int64))
    return [ctx.out(gnp.take(gnp.ravel(ctx.tensor(0)), flat), ctx.dtype(0))]


@onnx_op("Trilu", 14)
def _trilu(ctx):
    shape = ctx.shape(0)
    if len(shape) < 2:
        raise ctx.unsupported("input of rank < 2")
    k = int(np.ravel(ctx.const(1))[0]) if ctx.has(1) else 0
    rows, cols = shape[-2:]
    # The mask is computed in the graph from the row and column numbers (rows + cols
    # constants), never as a rows x cols array at import: column - row >= k keeps the
    # upper part, column - row <= k the lower one.
    diag = gnp.subtract(gnp.constant(np.arange(cols, dtype=np.int64).reshape(1, cols)),
                        gnp.constant(np.arange(rows, dtype=np.int64).reshape(rows, 1)))
    keep = gnp.greater_equal(diag, k) if ctx.attr("upper", 1) else gnp.less_equal(diag, k)
    # A zero of the input's type: a Python 0 beside int64 values would take them through
    # float64 (rounding those past 2**53).
    zero = np.zeros((), carrier(ctx.dtype(0)))[()]
    return [ctx.out(gnp.where(keep, ctx.tensor(0), zero), ctx.dtype(0))]


# The rest of the table: activations, rounding, scatters and gathers, normalizations ...
from geon.frontends.onnx import extra_ops  # noqa: E402,F401  (registers its builders)
