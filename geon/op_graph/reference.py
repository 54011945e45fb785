"""The reference semantics: a direct NumPy evaluation of any op graph.

Each op class has an entry in :data:`EVALUATORS`: ``fn(op, *arg_values) -> array`` with
the op's axes in the op's order. It serves as the oracle that transformed, optimized and
GPU results are tested against, and as the constant folder of the simplification pass.
It favours clarity over speed.
"""

from typing import Any, Callable, Mapping, MutableMapping, Optional, Sequence, Union

import numpy as np

from geon.errors import FeedError, GeonError
from geon.op_graph import nn_ops as nn
from geon.op_graph import op_graph as og
from geon.op_graph import primitives as pr
from geon.op_graph import schemas as sc
from geon.op_graph import special
from geon.op_graph.autodiff import find_rule
from geon.op_graph.ordering import ASSIGN_CLASSES, schedule
from geon.op_graph.tables import OpTable

EVALUATORS = OpTable("EVALUATORS", "fn(op, *arg_values) -> array")
#: Decorator: ``@evaluator(Cls, ...)`` registers ``fn(op, *arg_values) -> array``.
evaluator = EVALUATORS.register


def align(value, axes, to_axes):
    """``value`` (laid out by ``axes``) transposed and expanded to broadcast against
    ``to_axes`` (which must contain every axis of ``axes``)."""
    value = np.asarray(value)
    names = axes.names
    present = [n for n in to_axes.names if n in names]
    if present != list(names):
        value = np.transpose(value, [names.index(n) for n in present])
    shape = [a.length if a.name in names else 1 for a in to_axes]
    return value.reshape(shape)


NP_UFUNCS = {
    og.Add: np.add, og.Subtract: np.subtract, og.Multiply: np.multiply,
    og.Divide: np.true_divide, og.Power: np.power, og.Maximum: np.maximum,
    og.Minimum: np.minimum, og.Equal: np.equal, og.NotEqual: np.not_equal,
    og.Less: np.less, og.LessEqual: np.less_equal, og.Greater: np.greater,
    og.GreaterEqual: np.greater_equal, og.Negative: np.negative,
    og.Absolute: np.absolute, og.Sign: np.sign, og.Square: np.square, og.Sqrt: np.sqrt,
    og.Reciprocal: np.reciprocal, og.Exp: np.exp, og.Log: np.log, og.Sin: np.sin,
    og.Cos: np.cos, og.Tanh: np.tanh, og.Expm1: np.expm1,
}


def _sigmoid(x):
    return np.exp(-np.logaddexp(0, -x))


def sigmoid_ce(x, t):
    """``softplus(x) - x t`` elementwise, as ``log1p(exp(-|x|)) + |x| w`` with ``w = 1 - t``
    where ``x > 0`` and ``t`` elsewhere; the product is 0 where ``w`` is, so an infinite
    logit with the matching target gives 0, not ``inf - inf``."""
    x, t = np.asarray(x), np.asarray(t)
    ax = np.abs(x)
    w = np.where(x > 0, 1 - t, t)
    part = np.zeros(np.broadcast_shapes(ax.shape, w.shape), np.result_type(ax, w))
    np.multiply(ax, w, out=part, where=w != 0)
    return np.log1p(np.exp(-ax)) + part


ELEMENTWISE_FUNCS: dict[Any, Callable[..., Any]] = dict(NP_UFUNCS)
ELEMENTWISE_FUNCS[og.Sigmoid] = _sigmoid
ELEMENTWISE_FUNCS[sc.SigmoidCrossEntropy] = sigmoid_ce
ELEMENTWISE_FUNCS[og.Erf] = special.erf
ELEMENTWISE_FUNCS[og.Softplus] = lambda x: np.logaddexp(0.0, x)


@evaluator(og.ElementWise)
def _elementwise(op, *vals):
    fn = ELEMENTWISE_FUNCS[type(op)]
    # Operands are converted to the op's compute dtype first, as in generated code; the
    # result then takes the op's dtype (e.g. 1.0 / 0.0 for a comparison).
    ct = op.compute_dtype()
    args = [align(v if ct is None else np.asarray(v).astype(ct, copy=False), a.axes,
                  op.axes) for v, a in zip(vals, op.args)]
    with np.errstate(all="ignore"):
        r = fn(*args)
    return np.broadcast_to(r, op.axes.shape).astype(op.dtype)


@evaluator(og.Dot)
def _dot(op, a, b):
    letters = {}
    for n in op.args[0].axes.names + op.args[1].axes.names:
        letters.setdefault(n, chr(ord("a") + len(letters)) if len(letters) < 26
                           else chr(ord("A") + len(letters) - 26))
    spec = "".join(letters[n] for n in op.args[0].axes.names) + "," + \
        "".join(letters[n] for n in op.args[1].axes.names) + "->" + \
        "".join(letters[n] for n in op.axes.names)
    return np.einsum(spec, a, b).astype(op.dtype)


def _reduce_layout(in_axes, red, out_axes, x):
    """``x`` (laid out by ``in_axes``) reshaped to (``out_axes``..., product of ``red``)."""
    keep = [in_axes.index(a) for a in out_axes]
    rpos = [in_axes.index(a) for a in red]
    x = np.transpose(x, keep + rpos)
    # the reduced length explicitly: -1 is ambiguous when some kept axis has length 0
    return x.reshape(out_axes.shape + (int(np.prod([a.length for a in red])),))


_REDUCERS = {og.Sum: np.sum, og.Prod: np.prod, og.Max: np.max, og.Min: np.min,
             og.ArgMax: np.argmax, og.ArgMin: np.argmin}


@evaluator(og.Reduction)
def _reduction(op, x):
    y = _REDUCERS[type(op)](_reduce_layout(op.args[0].axes, op.reduction_axes, op.axes, x),
                            axis=-1)
    return np.asarray(y).astype(op.dtype)


@evaluator(og.TensorSize)
def _tensor_size(op, x):
    return np.asarray(op.reduction_axes.size if len(op.reduction_axes) else 1,
                      dtype=op.dtype)


@evaluator(og.Broadcast)
def _broadcast(op, x):
    return np.broadcast_to(align(x, op.args[0].axes, op.axes), op.axes.shape)


@evaluator(og.AxesWithOrder)
def _reorder(op, x):
    names = op.args[0].axes.names
    return np.transpose(x, [names.index(n) for n in op.axes.names])


@evaluator(og.CastAxes, og.StopGradient, pr.Copy)
def _identity(op, x):
    return np.array(x)


@evaluator(og.Flatten, og.Unflatten, pr.Reshape)
def _reshape(op, x):
    return np.reshape(x, op.axes.shape)


@evaluator(og.Slice)
def _slice(op, x):
    key = [slice(None)] * len(op.args[0].axes)
    key[op.axis_pos] = op.key
    return x[tuple(key)]


@evaluator(og.OneHot)
def _one_hot(op, x):
    idx = np.arange(op.axis.length).reshape((-1,) + (1,) * np.ndim(x))
    return (idx == np.asarray(x)[None]).astype(op.dtype)


@evaluator(pr.Gemm)
def _gemm(op, a, b):
    return np.matmul(a, b).astype(op.dtype)


_PRIM_REDUCERS = {pr.ReduceSum: np.sum, pr.ReduceProd: np.prod, pr.ReduceMax: np.max,
                  pr.ReduceMin: np.min, pr.ReduceArgMax: np.argmax,
                  pr.ReduceArgMin: np.argmin}


@evaluator(pr.ReducePrim)
def _reduce_prim(op, x):
    return np.asarray(_PRIM_REDUCERS[type(op)](x, axis=op.axis)).astype(op.dtype)


@evaluator(pr.Dimshuffle)
def _dimshuffle(op, x):
    return np.transpose(x, op.perm)


@evaluator(pr.Expand)
def _expand(op, x):
    shape = [1 if m is None else x.shape[m] for m in op.dim_map]
    return np.broadcast_to(np.reshape(x, shape), op.axes.shape)


@evaluator(pr.SliceView)
def _sliceview(op, x):
    return x[op.key]


@evaluator(pr.Unslice)
def _unslice(op, x):
    out = np.zeros(op.axes.shape, op.dtype)
    out[op.key] = x
    return out


def op_site(op):
    """The op an index error names: the user's op and where it was built."""
    return f"{op.derived_from or type(op).__name__ + ' ' + op.name} ({op.file_info})"


@evaluator(nn.Gather)
def _gather(op, x, idx):
    idx = special.checked_indices(idx, op.axis.length, op_site(op))
    return np.take(x, idx, axis=op.args[0].axes.index(op.axis))


@evaluator(nn.ScatterAdd)
def _scatter_add(op, d, idx):
    dop, iop = op.args
    p = op.axes.index(op.axis)
    outer, inner = og.Axes(op.axes[:p]), og.Axes(op.axes[p + 1:])
    d3 = align(d, dop.axes, outer + iop.axes + inner).reshape(
        (outer.size, iop.axes.size, inner.size))
    out = np.zeros((outer.size, op.axis.length, inner.size), op.dtype)
    idx = special.checked_indices(np.reshape(idx, -1), op.axis.length, op_site(op))
    np.add.at(out, (slice(None), idx), d3)
    return out.reshape(op.axes.shape)


@evaluator(pr.Take)
def _take(op, x, idx):
    return special.take(x, idx, op_site(op))


@evaluator(pr.PutAdd)
def _put_add(op, d, idx):
    return special.put_add(d, idx, np.empty(op.axes.shape, op.dtype), op_site(op))


@evaluator(nn.CumSum)
def _cumsum(op, x):
    p = op.args[0].axes.index(op.axis)
    if op.reverse:
        x = np.flip(x, p)
    c = np.cumsum(x, axis=p, dtype=op.dtype)
    if op.exclusive:
        c = np.concatenate([np.zeros_like(np.take(c, [0], axis=p)),
                            np.take(c, range(c.shape[p] - 1), axis=p)], axis=p)
    return np.flip(c, p) if op.reverse else c


@evaluator(pr.PrefixSum)
def _prefix_sum(op, x):
    return np.cumsum(x, axis=1, dtype=op.dtype)


def _sort_along(x, p, descending):
    idx = np.argsort(-x if descending else x, axis=p, kind="stable")
    return np.take_along_axis(x, idx, axis=p), idx.astype(np.int64)


@evaluator(nn.Sort)
def _sort(op, x):
    return _sort_along(x, op.args[0].axes.index(op.axis), op.descending)


@evaluator(nn.TopK)
def _topk(op, x):
    p = op.args[0].axes.index(op.axis)
    return tuple(np.take(v, range(op.k), axis=p) for v in _sort_along(x, p, True))


@evaluator(pr.SortPrim)
def _sort_prim(op, x):
    return _sort_along(x, 1, False)


@evaluator(og.Split)
def _split(op, x):
    outs = []
    for k in op.keys:
        key = [slice(None)] * x.ndim
        key[op.axis_pos] = k
        outs.append(x[tuple(key)])
    return tuple(outs)


@evaluator(og.MaxArgMax)
def _max_argmax(op, x):
    flat = _reduce_layout(op.args[0].axes, op.reduction_axes, op.out_axes, x)
    return np.max(flat, axis=-1), np.argmax(flat, axis=-1).astype(np.int64)


@evaluator(pr.ReduceMaxArgMax)
def _reduce_max_argmax(op, x):
    return np.max(x, axis=op.axis), np.argmax(x, axis=op.axis).astype(np.int64)


@evaluator(og.Output)
def _output(op, values):
    return np.asarray(values[op.index]).astype(op.dtype)


def evaluate(results: Union[og.Op, Sequence[og.Op]],
             feeds: Optional[Mapping[og.Op, Any]] = None,
             state: Optional[MutableMapping[og.Op, Any]] = None) -> Any:
    """Evaluate ``results`` (an op or a list of ops) directly with NumPy.

    ``feeds`` maps placeholders to arrays; ``state`` maps Variables to arrays and is
    updated by assignments (variables missing from it start at their initial value).
    Returns an array, or a list for a list (``None`` for void ops).
    """
    ops, single = og.as_op_list(results, "evaluate: results")
    ops = [og.snap(r) for r in ops]
    feeds = dict(feeds or {})
    state = state if state is not None else {}
    values: dict[Any, Any] = {}

    def value(op):
        if isinstance(op, og.Placeholder):
            if op not in feeds:
                raise FeedError(f"no value fed for placeholder {op.name} ({op.axes!r})")
            return np.asarray(feeds[op], dtype=op.dtype).reshape(op.axes.shape)
        if isinstance(op, og.Variable):
            if op not in state:
                state[op] = op.initial_array()
            return state[op]
        if isinstance(op, og.Constant):
            return op.array()
        return values[op]

    for op in schedule(ops, strict=False):  # views here are snapshots
        if isinstance(op, og.AssignableTensorOp):
            continue
        if isinstance(op, ASSIGN_CLASSES):
            target, v = op.args
            if isinstance(op, og.SetItem):
                arr = np.broadcast_to(align(value(v), v.axes, target.axes), target.shape)
            else:  # the primitive reads by position
                arr = np.reshape(value(v), target.shape)
            arr = np.array(arr, dtype=target.dtype)
            if isinstance(target, og.Placeholder):
                feeds[target] = arr
            else:
                state[target] = arr
            continue
        fn = find_rule(EVALUATORS, op)
        if fn is None:
            raise GeonError(f"no reference evaluator for {type(op).__name__}")
        values[op] = fn(op, *[value(a) for a in op.args])
    out = [None if isinstance(r, og.VoidOp) else np.array(value(r)) for r in ops]
    return out[0] if single else out
