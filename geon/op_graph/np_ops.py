"""The NumPy family: tensors with positional shapes and ops with NumPy's names and rules.

Use it as ``be.np``::

    x = be.np.placeholder((32, 784))
    w = be.np.variable(np.zeros((784, 10)))
    y = be.np.tanh(x @ w + be.np.zeros(10))
    loss = be.np.mean(be.np.sum(y * y, axis=-1))

A NumPy-family tensor is an ordinary op whose axes are *positional*: the k-th axis from
the right is the :class:`~geon.op_graph.coercion.PositionalAxis` named ``-k``. Every
function here builds the standard ops of the Axes family over such axes (renaming
axes where NumPy's positions call for it), so derivatives (``be.deriv``, ``be.jvp``),
the reference evaluator, lowering, memory planning and fusion work unchanged: there is
no second execution path. The one op added here is :class:`Select` (``where``), a
semi-primitive with an entry in every table.

Tensors of the Simple-Axes family (:mod:`geon.op_graph.simple_axes`) also have named
sample and recurrent axes; every function here works on their positional (feature)
dimensions and carries the named axes along. ``axis=`` counts positional dimensions
only.

Differences from NumPy: comparisons give 1.0 / 0.0 in the operands' float type (float32
for integer operands), as everywhere in geon; ``==`` and ``!=`` between ops are
identity (use :func:`equal`); placeholders, variables and filled constants default to
float32.
"""

import inspect
import numbers
from typing import Callable, Optional

import numpy as np

from geon.errors import ArgumentError, AxisMismatchError
from geon.op_graph import nn_ops
from geon.op_graph import op_graph as og
from geon.op_graph.symbols import Sym, broadcast_lengths
from geon.op_graph.formats import round_to_format as _round_to_format
from geon.op_graph.nn_ops import Select
from geon.op_graph.tables import ELEMENTWISE_FUNCS
from geon.op_graph import primitives as pr
from geon.op_graph.axes import Axes
from geon.op_graph.coercion import (AXES, NUMPY, NUMPY_DTYPE_RULES, SCALAR, SIMPLE,
                                    FamilyError, PositionalAxis, canonical_axes, family,
                                    family_error, numpy_dtype, numpy_dtype_rule,
                                    positional, positional_shape, split_axes, temp_axis,
                                    with_axes)

#: ``from geon.op_graph.np_ops import *`` binds these. Unlike NumPy's, the reductions named like
#: Python builtins (``sum``, ``max``, ``min``, ``abs``) are left out so that they never
#: shadow the builtins; use them as ``be.np.sum`` and so on.
__all__ = [
    "FamilyError", "PositionalAxis", "Select", "absolute", "add", "argmax", "argmin",
    "argsort", "asarray", "avg_pool", "broadcast_to", "canonical_axes", "clip",
    "concatenate", "constant", "conv", "conv_transpose", "cos", "cumsum", "sort", "topk",
    "divide", "dot", "elu", "equal", "erf", "exp", "expand_dims", "expm1", "full", "gelu",
    "global_avg_pool", "greater", "greater_equal", "hard_sigmoid", "leaky_relu", "less",
    "less_equal", "log", "log_softmax", "logsumexp", "matmul", "max_pool", "maximum",
    "mean", "minimum", "pad",
    "multiply", "ndim", "negative", "not_equal", "ones", "placeholder", "positional",
    "power", "prod", "ravel", "reciprocal", "relu", "reshape", "selu", "shape", "sign",
    "silu", "sin", "softplus", "sqrt",
    "square", "squeeze", "stack", "subtract", "swapaxes", "take", "tanh", "tile",
    "transpose", "uniform", "normal", "bernoulli", "dropout", "layer_norm", "batch_norm",
    "true_divide", "variable", "where", "with_axes", "zeros", "round_to_format",
]

# The base and the shape functions live in their own modules; geon.np is this one.
from geon.op_graph.np_base import (ArrayLike, AxisArg, Shape, _arg, _axis_list,
                                   _builtin_max, _front, _named_union, _normalize_axis,
                                   _rename, _shape, _tensor, asarray,
                                   cast_through_reorder, constant, full, ndim, ones,
                                   placeholder, shape, variable, zeros)  # noqa: F401
from geon.op_graph.np_shapes import (argsort, broadcast_to, concatenate, cumsum,
                                     expand_dims, getitem, pad, ravel, reshape, sort,
                                     squeeze, stack, swapaxes, take, tile, topk,
                                     transpose)  # noqa: F401


# --- elementwise ----------------------------------------------------------------------------

def _numpy_kwargs(cls, args):
    # Positional operands get NumPy's dtype from the family hook; 0-d ones (which have
    # no positional axes to tell their family) get it here.
    if issubclass(cls, og.Comparison) or any(
            isinstance(a, og.TensorOp) and len(a.axes) for a in args):
        return {}
    fn = numpy_dtype_rule(cls)
    dtype = numpy_dtype(fn, args) if fn is not None else None
    return {} if dtype is None else {"dtype": dtype}


def _elementwise(cls, name, n) -> Callable[..., og.TensorOp]:
    def fn(*args):
        if len(args) != n:
            raise ArgumentError(f"{name} takes {n} argument(s), got {len(args)}")
        args = [_arg(a) for a in args]
        return cls(*args, **_numpy_kwargs(cls, args))
    fn.__name__ = fn.__qualname__ = name
    # The signature NumPy's function has (``fn`` takes ``*args`` to check the count).
    names = ["x"] if n == 1 else [f"x{i + 1}" for i in range(n)]
    fn.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(p, inspect.Parameter.POSITIONAL_ONLY, annotation=ArrayLike)
         for p in names], return_annotation=og.TensorOp)
    fn.__doc__ = (f"NumPy's ``{name}`` (broadcast as NumPy does; the result has NumPy's "
                  f"dtype)." if not issubclass(cls, og.Comparison) else
                  f"NumPy's ``{name}``, giving 1.0 where true and 0.0 where false.")
    return fn


add = _elementwise(og.Add, "add", 2)
subtract = _elementwise(og.Subtract, "subtract", 2)
multiply = _elementwise(og.Multiply, "multiply", 2)
divide = _elementwise(og.Divide, "divide", 2)
true_divide = _elementwise(og.Divide, "true_divide", 2)
power = _elementwise(og.Power, "power", 2)
maximum = _elementwise(og.Maximum, "maximum", 2)
minimum = _elementwise(og.Minimum, "minimum", 2)
equal = _elementwise(og.Equal, "equal", 2)
not_equal = _elementwise(og.NotEqual, "not_equal", 2)
less = _elementwise(og.Less, "less", 2)
less_equal = _elementwise(og.LessEqual, "less_equal", 2)
greater = _elementwise(og.Greater, "greater", 2)
greater_equal = _elementwise(og.GreaterEqual, "greater_equal", 2)
negative = _elementwise(og.Negative, "negative", 1)
absolute = _elementwise(og.Absolute, "absolute", 1)
abs = absolute  # noqa: A001 - NumPy's name
sign = _elementwise(og.Sign, "sign", 1)
square = _elementwise(og.Square, "square", 1)
sqrt = _elementwise(og.Sqrt, "sqrt", 1)
reciprocal = _elementwise(og.Reciprocal, "reciprocal", 1)
exp = _elementwise(og.Exp, "exp", 1)
log = _elementwise(og.Log, "log", 1)
sin = _elementwise(og.Sin, "sin", 1)
cos = _elementwise(og.Cos, "cos", 1)
tanh = _elementwise(og.Tanh, "tanh", 1)
erf = _elementwise(og.Erf, "erf", 1)
expm1 = _elementwise(og.Expm1, "expm1", 1)
softplus = _elementwise(og.Softplus, "softplus", 1)
erf.__doc__ = "The error function, elementwise (scipy's ``erf``; NumPy has none)."
softplus.__doc__ = "``log(1 + exp(x))``, elementwise and stable (PyTorch's ``softplus``)."


def _activation(fn) -> Callable[..., og.TensorOp]:
    def act(x, *args, **kwargs):
        return fn(_arg(x), *args, **kwargs)
    act.__name__ = act.__qualname__ = fn.__name__
    act.__doc__ = fn.__doc__
    # ``fn``'s signature, its first argument any NumPy-family operand.
    sig = inspect.signature(fn)
    first, *rest = sig.parameters.values()
    act.__signature__ = sig.replace(  # type: ignore[attr-defined]
        parameters=[first.replace(annotation=ArrayLike)] + rest)
    return act


relu = _activation(nn_ops.relu)
leaky_relu = _activation(nn_ops.leaky_relu)
elu = _activation(nn_ops.elu)
selu = _activation(nn_ops.selu)
gelu = _activation(nn_ops.gelu)
silu = _activation(nn_ops.silu)
hard_sigmoid = _activation(nn_ops.hard_sigmoid)


def round_to_format(x: ArrayLike, fmt: str, saturate: bool = True,
                    round_mode: str = "up") -> og.TensorOp:
    """``x`` rounded elementwise to a narrow number format (bfloat16, float8, float4,
    E8M0, int4 / int2 ...) and held in ``x``'s dtype ("fake quantization"); the gradient
    passes straight through. See ``geon.round_to_format``."""
    return _round_to_format(_arg(x) if not isinstance(x, numbers.Number) else constant(x), fmt,
               saturate=saturate, round_mode=round_mode)


def where(condition: ArrayLike, x: ArrayLike, y: ArrayLike) -> og.TensorOp:
    """NumPy's ``where(condition, x, y)``: ``x`` where ``condition`` is nonzero, else
    ``y`` (all three broadcast together). Derivatives flow to the branch taken."""
    args = [_arg(condition), _arg(x), _arg(y)]
    return Select(*args, **_numpy_kwargs(Select, args))


def clip(a: ArrayLike, a_min: Optional[ArrayLike],
         a_max: Optional[ArrayLike]) -> og.TensorOp:
    """NumPy's ``clip``: ``minimum(maximum(a, a_min), a_max)`` (either bound may be
    ``None``)."""
    if a_min is None and a_max is None:
        raise ArgumentError("clip: one of a_min and a_max must be given")
    r = _arg(a)
    if a_min is not None:
        r = maximum(r, a_min)
    if a_max is not None:
        r = minimum(r, a_max)
    return r


# --- reductions -----------------------------------------------------------------------------

def _reduce(cls, a, axis, keepdims, what, dtype=None):
    x = _front(_tensor(a, what))
    special, pos = split_axes(x)
    idx = _axis_list(axis, len(pos), what)
    red = Axes(pos[i] for i in idx)
    if dtype is None:
        dtype = x.dtype
    if not len(red) and cls is not og.ArgMax and cls is not og.ArgMin:
        # Nothing to reduce: x itself, in the dtype NumPy gives (x + 0 converts).
        return x if x.dtype == dtype else og.Add(x, 0, dtype=dtype)
    r = cls(x, reduction_axes=red, dtype=dtype)
    if keepdims:
        if not len(red):
            return r
        target = special + [PositionalAxis(1, p.name) if i in idx else p
                            for i, p in enumerate(pos)]
        return og.Broadcast(r, Axes(target))
    kept = len(pos) - len(idx)
    return _rename(r, [f"-{kept - j}" for j in range(kept)])


def _sum_dtype(x, fn):
    with np.errstate(all="ignore"):
        return fn(np.ones(1, x.dtype)).dtype


def sum(a: ArrayLike, axis: AxisArg = None,  # noqa: A001 - NumPy's name
        keepdims: bool = False) -> og.TensorOp:
    """NumPy's ``sum`` over ``axis`` (an int, a tuple, or ``None`` for every positional
    dimension); small integer and bool inputs sum in int64 as in NumPy."""
    x = _tensor(a, "sum")
    return _reduce(og.Sum, x, axis, keepdims, "sum", _sum_dtype(x, np.sum))


def prod(a: ArrayLike, axis: AxisArg = None, keepdims: bool = False) -> og.TensorOp:
    """NumPy's ``prod`` (see :func:`sum` for ``axis``)."""
    x = _tensor(a, "prod")
    return _reduce(og.Prod, x, axis, keepdims, "prod", _sum_dtype(x, np.prod))


def max(a: ArrayLike, axis: AxisArg = None,  # noqa: A001
        keepdims: bool = False) -> og.TensorOp:
    """NumPy's ``max`` (``amax``)."""
    return _reduce(og.Max, a, axis, keepdims, "max")


def min(a: ArrayLike, axis: AxisArg = None,  # noqa: A001
        keepdims: bool = False) -> og.TensorOp:
    """NumPy's ``min`` (``amin``)."""
    return _reduce(og.Min, a, axis, keepdims, "min")


def mean(a: ArrayLike, axis: AxisArg = None, keepdims: bool = False) -> og.TensorOp:
    """NumPy's ``mean``: the sum divided by the number of elements reduced (float64 for
    integer inputs)."""
    x = _tensor(a, "mean")
    pos = positional_shape(x)
    idx = _axis_list(axis, len(pos), "mean")
    n = 1
    for i in idx:
        n *= pos[i]
    if isinstance(n, Sym):  # the count, bound when the computation is called
        reduced = [split_axes(_front(x))[1][i] for i in idx]
        total = sum(x, axis, keepdims)
        # (in the sum's float type: float16 stays float16, as NumPy's mean)
        count = og.TensorSize(x, reduction_axes=reduced,
                              dtype=total.dtype if total.dtype.kind == "f" else None)
        return total / count
    return sum(x, axis, keepdims) / float(n)


def _arg_reduce(cls, a, axis, keepdims, what):
    if isinstance(axis, (tuple, list)):
        raise ArgumentError(f"{what}: axis must be an integer or None")
    x = _tensor(a, what)
    r = _reduce(cls, x, axis, False, what, np.dtype(np.int64))
    if not keepdims:
        return r
    special, pos = split_axes(_front(x))
    if axis is None:
        return reshape(r, (1,) * len(pos))
    i = _normalize_axis(axis, len(pos), what)
    return expand_dims(r, i)


def logsumexp(a: ArrayLike, axis: AxisArg = None,
              keepdims: bool = False) -> og.TensorOp:
    """``log(sum(exp(a), axis))`` without overflow (scipy's and PyTorch's
    ``logsumexp``): ``m + log(sum(exp(a - m)))`` with ``m`` the maximum, through which
    no derivative flows (the value does not depend on it)."""
    x = _tensor(a, "logsumexp")
    m = og.StopGradient(max(x, axis, keepdims=True))
    r = log(sum(exp(x - m), axis, keepdims=keepdims))
    return r + (m if keepdims else reshape(m, shape(r)))


def log_softmax(x: ArrayLike, axis: int = -1) -> og.TensorOp:
    """``x - logsumexp(x, axis, keepdims=True)`` (PyTorch's ``log_softmax``; exact for
    any logits)."""
    x = _tensor(x, "log_softmax")
    _normalize_axis(axis, ndim(x), "log_softmax")
    shifted = x - og.StopGradient(max(x, axis, keepdims=True))
    return shifted - log(sum(exp(shifted), axis, keepdims=True))


def argmax(a: ArrayLike, axis: Optional[int] = None,
           keepdims: bool = False) -> og.TensorOp:
    """NumPy's ``argmax``: with ``axis=None`` the index into the flattened array
    (row-major), else the index along ``axis`` (int64)."""
    return _arg_reduce(og.ArgMax, a, axis, keepdims, "argmax")


def argmin(a: ArrayLike, axis: Optional[int] = None,
           keepdims: bool = False) -> og.TensorOp:
    """NumPy's ``argmin`` (see :func:`argmax`)."""
    return _arg_reduce(og.ArgMin, a, axis, keepdims, "argmin")


# --- products -------------------------------------------------------------------------------

def dot(a: ArrayLike, b: ArrayLike) -> og.TensorOp:
    """NumPy's ``dot``: for 1-D and 2-D operands the inner / matrix product; for N-D
    operands the sum over the last axis of ``a`` and the second-to-last of ``b``
    (``dot(a, b)[i, j, k, m] = sum(a[i, j, :] * b[k, :, m])``); a 0-d operand
    multiplies."""
    a, b = _tensor(a, "dot"), _tensor(b, "dot")
    sa, pa = split_axes(a)
    sb, pb = split_axes(b)
    if not pa or not pb:
        return multiply(a, b)
    shared = {x.name for x in sa} & {x.name for x in sb}
    if shared:
        raise AxisMismatchError(f"dot: both operands have the named axes {sorted(shared)}, "
                                f"which a product by position cannot keep apart: "
                                f"{a.name}, {b.name}")
    ka, kb = pa[-1], (pb[-2] if len(pb) >= 2 else pb[0])
    if ka.length != kb.length:
        raise AxisMismatchError(
            f"dot: shapes {positional_shape(a)} and {positional_shape(b)} not aligned: "
            f"{ka.length} (dim {len(pa) - 1}) != {kb.length} (dim {_builtin_max(len(pb) - 2, 0)})")
    a_other = pa[:-1]
    b_other = pb[:-2] + pb[-1:] if len(pb) >= 2 else []
    r = len(a_other) + len(b_other)
    names = [f"-{r - i}" for i in range(r)]
    k = temp_axis(ka.length)
    na = iter(names[:len(a_other)])
    nb = iter(names[len(a_other):])
    a2 = cast_through_reorder(a, [k if x is ka else (PositionalAxis(x.length, next(na))
                                                     if isinstance(x, PositionalAxis) else x)
                                  for x in a.axes])
    b2 = cast_through_reorder(b, [k if x is kb else (PositionalAxis(x.length, next(nb))
                                                     if isinstance(x, PositionalAxis) else x)
                                  for x in b.axes])
    return _front(og.Dot(a2, b2))


def matmul(a: ArrayLike, b: ArrayLike) -> og.TensorOp:
    """NumPy's ``matmul`` (``a @ b``): matrix products over the last two dimensions,
    broadcasting the others; a 1-D operand is a row (``a``) or column (``b``) vector
    whose unit dimension is removed from the result. With leading dimensions (or a
    sample axis both operands have) it is one batched product (see
    :func:`geon.dot`'s ``batch_axes``), never a broadcast product and a sum."""
    if isinstance(a, og.Op) and family(a) == AXES or isinstance(b, og.Op) and \
            family(b) == AXES:
        ops = [x for x in (a, b) if isinstance(x, og.Op)]
        raise family_error("matmul", ops, "@ multiplies positional tensors")
    a, b = _tensor(a, "matmul"), _tensor(b, "matmul")
    pa, pb = positional_shape(a), positional_shape(b)
    if not pa or not pb:
        raise ArgumentError("matmul: Input operand does not have enough dimensions")
    kb = pb[0 if len(pb) == 1 else -2]
    if pa[-1] != kb:
        raise AxisMismatchError(
            f"matmul: Input operand 1 has a mismatch in its core dimension 0, with gufunc "
            f"signature (n?,k),(k,m?)->(n?,m?) (size {kb} is different from {pa[-1]}): "
            f"{a.name} {pa} @ {b.name} {pb}")
    shared = {x.name for x in split_axes(a)[0]} & {x.name for x in split_axes(b)[0]}
    if len(pa) <= 2 and len(pb) <= 2 and not shared:
        return dot(a, b)
    return _batched_matmul(a, b, pa, pb)


def _batched_matmul(a, b, pa, pb):
    """``a @ b`` with leading (batch) dimensions: one :class:`~og.Dot` that keeps the
    batch dimensions both operands have as batch axes (lowered to one batched GEMM, no
    product temporary). A batch dimension only ``a`` has stays a free axis of ``a``
    (folded into the product's rows where the layout allows); one only ``b`` has is
    broadcast into ``a`` first (a stride-0 view), so that the result comes out in
    NumPy's order; unit dimensions that broadcast are dropped. Named (sample,
    recurrent) axes of either operand are kept, as an elementwise op keeps them."""
    ba, bb = pa[:-2], pb[:-2]
    try:
        batch = broadcast_lengths(ba, bb)
    except (ValueError, TypeError):   # (TypeError: SymbolicLengthError)
        raise AxisMismatchError(f"matmul: the batch dimensions of {a.name} {pa} and "
                                f"{b.name} {pb} do not broadcast") from None
    nb, has_m, has_n = len(batch), len(pa) >= 2, len(pb) >= 2
    r = nb + has_m + has_n
    out_batch = [PositionalAxis(batch[i], f"-{r - i}") for i in range(nb)]
    k = temp_axis(pa[-1])
    m = [PositionalAxis(pa[-2], f"-{1 + has_n}")] if has_m else []
    n = [PositionalAxis(pb[-1], "-1")] if has_n else []

    def renamed(x, lead, core):
        """``x`` with its ``lead`` batch dimensions named as the result's (unit ones
        that broadcast dropped) and its last dimensions named ``core``."""
        _, pos = split_axes(x)
        off = nb - lead
        drop = {p.name for j, p in enumerate(pos[:lead])
                if p.length == 1 and batch[off + j] != 1}
        if drop:
            x = pr.Reshape(x, Axes(c for c in x.axes if c.name not in drop))
        names = iter([out_batch[off + j] for j, p in enumerate(pos[:lead])
                      if p.name not in drop] + core)
        return cast_through_reorder(x, [next(names) if isinstance(c, PositionalAxis)
                                        else c for c in x.axes])

    a2 = renamed(a, len(ba), m + [k])
    b2 = renamed(b, len(bb), [k] + n)
    # a takes what only b has (batch dimensions, named axes), in the result's order
    special = _named_union([a2, b2], "matmul")
    want = Axes(special + out_batch + m + [k])
    full = Axes(c for c in want if c in a2.axes or c in b2.axes)
    if not full.same_set(a2.axes):
        a2 = og.Broadcast(a2, full)
    shared = (a2.axes & b2.axes) - Axes(k)
    return _front(og.Dot(a2, b2, batch_axes=shared))


# --- hooks: x[key], x @ y, x.T on positional tensors --------------------------------------

def _getitem_hook(x, key):
    if family(x) in (NUMPY, SIMPLE, SCALAR):
        return getitem(x, key)
    raise ArgumentError(f"{x.name} has named axes ({og._fmt(x.axes)}); slice an Axes-family "
                        f"tensor by axis with be.slice_along_axis(x, axis, key), or take "
                        f"be.np.positional(x) first")


def _transpose_hook(x):
    return transpose(x) if family(x) in (NUMPY, SIMPLE) else None


# Select's dtype rule for Python numbers, and those of the core functions without a
# NumPy ufunc of their own.
NUMPY_DTYPE_RULES[Select] = ELEMENTWISE_FUNCS[Select]
NUMPY_DTYPE_RULES[og.Erf] = ELEMENTWISE_FUNCS[og.Erf]
NUMPY_DTYPE_RULES[og.Softplus] = ELEMENTWISE_FUNCS[og.Softplus]
og.FAMILY_HOOKS["getitem"] = _getitem_hook
og.FAMILY_HOOKS["matmul"] = matmul
og.FAMILY_HOOKS["transpose"] = _transpose_hook

# Convolution and pooling (PyTorch's layouts) live in their own module.
from geon.op_graph import np_conv as _np_conv  # noqa: E402
from geon.op_graph.np_conv import avg_pool, conv, conv_transpose, max_pool  # noqa: E402


def global_avg_pool(x: og.TensorOp, keepdims: bool = False) -> og.TensorOp:
    """The mean over the spatial dimensions of ``x`` ``(N, C, *spatial)``: (N, C), or
    (N, C, 1, ...) with ``keepdims``."""
    x = _np_conv._tensor(x, "global_avg_pool")
    n = len(split_axes(x)[1])
    first = 1 + _np_conv._lead(x)
    if n <= first:
        raise _np_conv.user_error(f"global_avg_pool: {x.name} {positional_shape(x)} has "
                                  f"no spatial dimensions")
    return mean(x, axis=tuple(range(first, n)), keepdims=keepdims)

# Random numbers (one Philox stream per op; see geon.op_graph.random).
from geon.op_graph import random as _rnd  # noqa: E402


def uniform(size: Shape = (), low: float = 0.0, high: float = 1.0, seed: int = 0,
            stream: Optional[int] = None, dtype: og.DTypeLike = None) -> og.TensorOp:
    """Numbers uniform in ``[low, high)`` of shape ``size`` (float32 unless ``dtype``),
    new ones each call (see :func:`geon.uniform`)."""
    return _rnd.uniform(canonical_axes(_shape(size)), low, high, seed, stream, dtype)


def normal(size: Shape = (), loc: float = 0.0, scale: float = 1.0, seed: int = 0,
           stream: Optional[int] = None, dtype: og.DTypeLike = None) -> og.TensorOp:
    """Normal numbers with mean ``loc`` and standard deviation ``scale`` of shape
    ``size`` (see :func:`geon.normal`)."""
    return _rnd.normal(canonical_axes(_shape(size)), loc, scale, seed, stream, dtype)


def bernoulli(p: ArrayLike, size: Optional[Shape] = None, seed: int = 0,
              stream: Optional[int] = None, dtype: og.DTypeLike = None) -> og.TensorOp:
    """1.0 with probability ``p`` (a number, or a tensor whose shape is the result's
    when ``size`` is not given), else 0.0 (see :func:`geon.bernoulli`)."""
    if isinstance(p, og.Op):
        p = _tensor(p, "bernoulli")
    axes = None if size is None else canonical_axes(_shape(size))
    return _rnd.bernoulli(p, axes=axes, seed=seed,  # type: ignore[arg-type]  # arrays too
                          stream=stream, dtype=dtype)


def dropout(x: ArrayLike, rate: float, seed: int = 0, stream: Optional[int] = None,
            training: bool = True) -> og.TensorOp:
    """Inverted dropout of ``x`` (see :func:`geon.dropout`)."""
    return _rnd.dropout(_tensor(x, "dropout"), rate, seed, stream, training)


# Normalization with PyTorch's conventions (composites; see geon.op_graph.normalization).
from geon.op_graph.normalization import stored as _stored  # noqa: E402

def layer_norm(x: ArrayLike, normalized_shape: Shape,
               weight: Optional[ArrayLike] = None, bias: Optional[ArrayLike] = None,
               eps: float = 1e-5) -> og.TensorOp:
    """Layer normalization over the trailing ``normalized_shape`` axes of ``x``, as
    ``torch.nn.functional.layer_norm``."""
    x = _tensor(x, "layer_norm")
    shape = _shape(normalized_shape)
    k = len(shape)
    if k > len(x.axes) or tuple(x.axes.shape[len(x.axes) - k:]) != shape:
        raise AxisMismatchError(f"layer_norm: normalized_shape {shape} is not the end of "
                                f"{x.name}'s shape {x.axes.shape}")
    axis = tuple(range(len(x.axes) - k, len(x.axes)))
    mean_ = mean(x, axis=axis, keepdims=True)
    d = x - mean_
    y = d / sqrt(mean(d * d, axis=axis, keepdims=True) + eps)
    if weight is not None:
        y = y * _tensor(weight, "layer_norm")
    if bias is not None:
        y = y + _tensor(bias, "layer_norm")
    return y


def batch_norm(x: ArrayLike, running_mean: og.Variable, running_var: og.Variable,
               weight: Optional[ArrayLike] = None, bias: Optional[ArrayLike] = None,
               training: bool = False, momentum: float = 0.1,
               eps: float = 1e-5) -> tuple[og.TensorOp, list[og.SetItem]]:
    """Batch normalization of ``x`` shaped ``(N, C, *spatial)`` per channel, as
    ``torch.nn.functional.batch_norm``: returns ``(y, updates)``, ``updates`` the two
    assignments of the running statistics (Variables of shape ``(C,)``) in training
    mode (request them to apply them), empty otherwise."""
    x = _tensor(x, "batch_norm")
    if len(x.axes) < 2:
        raise AxisMismatchError(f"batch_norm: {x.name} needs a shape (N, C, *spatial), "
                                f"not {x.axes.shape}")
    c, rest = x.axes.shape[1], len(x.axes) - 2

    def checked(t, what):
        t = _tensor(t, f"batch_norm {what}")
        if t.axes.shape != (c,):
            raise AxisMismatchError(f"batch_norm: {what} has shape {t.axes.shape}, the "
                                    f"channels need ({c},)")
        return t

    def per_channel(t):  # (C,) against (N, C, *spatial)
        return reshape(t, (c,) + (1,) * rest) if rest else t

    w = None if weight is None else per_channel(checked(weight, "weight"))
    b = None if bias is None else per_channel(checked(bias, "bias"))
    running_mean = checked(running_mean, "running_mean")
    running_var = checked(running_var, "running_var")
    if not training:
        y = ((x - per_channel(_stored(running_mean)))
             / sqrt(per_channel(_stored(running_var)) + eps))
        updates = []
    else:
        axis = (0,) + tuple(range(2, 2 + rest))
        n = x.axes.size // c
        if n < 2:
            raise ArgumentError("batch_norm: training needs more than one value per channel")
        m = mean(x, axis=axis, keepdims=True)
        d = x - m
        var = mean(d * d, axis=axis, keepdims=True)
        y = d / sqrt(var + eps)
        # Built after y, so y does not wait for them; statistics shaped (C,) to assign.
        m_c, var_c = reshape(m, (c,)), reshape(var, (c,))
        updates = [og.SetItem(running_mean, running_mean * (1.0 - momentum) + m_c * momentum),
                   og.SetItem(running_var, running_var * (1.0 - momentum)
                              + var_c * (momentum * n / (n - 1)))]
    if w is not None:
        y = y * w
    if b is not None:
        y = y + b
    return y, updates
