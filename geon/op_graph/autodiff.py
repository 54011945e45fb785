"""Reverse-mode derivatives: ``deriv(c, w)`` and the table of adjoint rules.

A rule receives the op and the adjoint ``delta`` of its value (an op with the op's axes,
in the op's order) and returns one delta per arg (``None`` where no derivative flows).
A returned delta may have axes the arg lacks (summed away) or lack axes the arg has
(broadcast); :func:`_fit` does that, in this one place, as it accumulates.
"""

import math
from typing import Optional, Union, overload

from geon.errors import ArgumentError, AxisMismatchError, GeonError
from geon.op_graph import nn_ops as nn
from geon.op_graph import op_graph as og
from geon.op_graph import primitives as pr
from geon.op_graph import schemas as sc
from geon.op_graph.axes import Axes
from geon.op_graph.nodes import no_gc, rewriting, user_location
from geon.op_graph.op_graph import as_op, snap, toposort
from geon.op_graph.tables import OpTable

ADJOINTS = OpTable("ADJOINTS", "fn(op, delta) -> one delta per arg")
#: Decorator: ``@adjoint_rule(Cls, ...)`` registers ``fn(op, delta) -> deltas``.
adjoint_rule = ADJOINTS.register


def find_rule(table, op):
    """The rule for ``type(op)`` or its nearest registered base class, or ``None``."""
    return OpTable.find(table, op)


def _fit(d, arg):
    """``d`` summed over axes ``arg`` lacks, broadcast to axes it lacks, in arg's order."""
    extra = d.axes - arg.axes
    if len(extra):
        d = og.Sum(d, reduction_axes=extra)
    if len(arg.axes - d.axes):
        return og.Broadcast(d, arg.axes)
    if d.axes.names != arg.axes.names:
        return og.AxesWithOrder(d, arg.axes)
    return d


def _needs_grad(order, source=None):
    """Ops whose value depends on some non-constant storage or on ``source`` (through
    args)."""
    needs = set()
    for op in order:
        if op is source:
            needs.add(op)
        elif isinstance(op, og.AssignableTensorOp):
            if not op.is_constant:
                needs.add(op)
        elif not isinstance(op, og.StopGradient) and any(a in needs for a in op.args):
            needs.add(op)
    return needs


def adjoints(c, error=None, source=None):
    """``{op: d c / d op}`` for every op ``c`` depends on through variables or
    placeholders (and through ``source``, an op whose value depends on neither, such as
    a :class:`~geon.op_graph.op_graph.Constant`, if given); built once per ``(c, error,
    source)`` and cached on ``c``."""
    c = snap(as_op(c))
    cache = c.__dict__.setdefault("_adjoint_cache", {})
    key = None if error is None else id(error)
    if source is not None:
        key = (key, source)
    hit = cache.get(key)
    if hit is not None and hit[0] is error:
        return hit[1]
    if error is None:
        if len(c.axes):
            raise ArgumentError(
                f"deriv: {type(c).__name__} {c.name} (built at {c.file_info}) has axes "
                f"({og._fmt(c.axes)}); a non-scalar cost needs error= (an op with the same "
                f"axes) (deriv called at {user_location()})")
        delta = og.Constant(1.0, dtype=c.dtype)
    else:
        delta = as_op(error)
        if not delta.axes.same_set(c.axes):
            raise AxisMismatchError(
                f"deriv: error= {type(delta).__name__} {delta.name} has axes "
                f"({og._fmt(delta.axes)}) but the cost {type(c).__name__} {c.name} (built "
                f"at {c.file_info}) has ({og._fmt(c.axes)}); they must be the same axes, "
                f"in any order (deriv called at {user_location()})")
        delta = _fit(delta, c)
    with no_gc():
        adj = _reverse_walk(c, delta, source)
    cache[key] = (error, adj)
    return adj


def _reverse_walk(c, delta, source=None):
    order = toposort([c], deps=False)
    needs = _needs_grad(order, source)
    adj = {c: delta}
    for op in reversed(order):
        d = adj.get(op)
        if d is None or op not in needs or isinstance(op, og.AssignableTensorOp):
            continue
        rule = find_rule(ADJOINTS, op)
        if rule is None:
            raise GeonError(f"deriv: no derivative rule for {type(op).__name__} {op.name} "
                            f"(built at {op.file_info})")
        # The adjoint ops read what ``op`` read, when ``op`` read it: they take its
        # other_deps (not the user_deps of assignments built since) and its location.
        with rewriting(op, by_pass=False):
            _accumulate(adj, op, rule(op, d), needs)
    return adj


def _accumulate(adj, op, deltas, needs):
    for arg, da in zip(op.args, deltas):
        if da is None or arg not in needs:
            continue
        if isinstance(arg, og.MultiOutput):
            # A multi-output op's adjoint is a list: one entry per output.
            out = arg.outputs[op.index]
            parts = adj.setdefault(arg, [None] * len(arg.outputs))
            da = _fit(da, out)
            parts[op.index] = da if parts[op.index] is None else parts[op.index] + da
            continue
        da = _fit(da, arg)
        prev = adj.get(arg)
        adj[arg] = da if prev is None else prev + da


#: What :func:`deriv` takes for several variables: a list or a tuple of ops. (Lists
#: are invariant, so the usual kinds of list are named: ``list[Variable]``, from
#: ``TensorOp.variables()``, is no ``list[TensorOp]``.)
SeveralOps = Union[list[og.TensorOp], list[og.Variable], list[og.Placeholder],
                   tuple[og.TensorOp, ...]]


@overload
def deriv(c: og.TensorOp, w: og.TensorOp,
          error: Optional[og.TensorLike] = None) -> og.TensorOp: ...
@overload
def deriv(c: og.TensorOp, w: SeveralOps,
          error: Optional[og.TensorLike] = None) -> list[og.TensorOp]: ...


def deriv(c: og.TensorOp, w: Union[og.TensorOp, SeveralOps],
          error: Optional[og.TensorLike] = None) -> Union[og.TensorOp, list[og.TensorOp]]:
    """The derivative of ``c`` with respect to ``w``, an op with ``w``'s axes.

    ``c`` must be a scalar unless ``error`` (an op with ``c``'s axes, the adjoint to
    propagate) is given. If ``c`` does not depend on ``w`` the result is zeros. For a
    list (or tuple) ``w`` the result is a list, one derivative per entry, all from one
    reverse pass.
    """
    if isinstance(w, (list, tuple)):
        return [deriv(c, wi, error) for wi in w]
    w = as_op(w)
    s = snap(w)
    d = adjoints(c, error).get(s)
    if d is None and not (isinstance(s, og.AssignableTensorOp) and not s.is_constant):
        # ``w`` may depend on constants only (a Constant, an op of constants): the walk
        # above skipped it; walk again from it.
        d = adjoints(c, error, source=s).get(s)
    if d is None:
        return og.Constant(0.0, axes=w.axes, dtype=snap(as_op(c)).dtype)
    return d


def gradients(c: og.TensorOp,
              error: Optional[og.TensorLike] = None) -> dict[og.Variable, og.TensorOp]:
    """``{variable: deriv(c, variable)}`` over ``c.variables()`` (the trainable
    variables ``c`` depends on, in graph order)."""
    c = snap(as_op(c))
    return {v: deriv(c, v, error) for v in c.variables()}


# --- rules -----------------------------------------------------------------------------
R = adjoint_rule


@R(og.Add)
def _add(op, d): return d, d
@R(og.Subtract)
def _sub(op, d): return d, -d
@R(og.Multiply)
def _mul(op, d): return d * op.args[1], d * op.args[0]
@R(og.Divide)
def _div(op, d): return d / op.args[1], -d * op / op.args[1]
@R(og.Power)
def _pow(op, d):
    a, b = op.args
    db = None if isinstance(b, og.Constant) else d * log_base(op) * op  # x ** 2: none
    return d * b * a ** (b - 1), db
@R(og.Maximum)
def _maximum(op, d):
    a, b = op.args
    if isinstance(b, og.Constant):
        # max(a, c), as in ReLU: take the mask from the result, so the input need not be
        # kept for the backward pass (the derivative at a == c is then 0).
        return d * (op > b), None
    return d * (a >= b), d * (a < b)
@R(og.Minimum)
def _minimum(op, d):
    a, b = op.args
    if isinstance(b, og.Constant):  # min(a, c): the mask from the result (see above)
        return d * (op < b), None
    return d * (a <= b), d * (a > b)
@R(og.Comparison, og.Sign, og.ArgMax, og.TensorSize, og.OneHot, pr.ReduceArgMax)
def _zero(op, d): return (None,) * len(op.args)
@R(og.Negative)
def _neg(op, d): return (-d,)
@R(og.Absolute)
def _abs(op, d): return (d * og.Sign(op.args[0]),)
@R(og.Square)
def _square(op, d): return (d * 2.0 * op.args[0],)
@R(og.Sqrt)
def _sqrt(op, d): return (d * 0.5 / op,)
@R(og.Reciprocal)
def _recip(op, d): return (-d * op * op,)
@R(og.Exp)
def _exp(op, d): return (d * op,)
@R(og.Log)
def _log(op, d): return (d / op.args[0],)
@R(og.Sin)
def _sin(op, d): return (d * og.Cos(op.args[0]),)
@R(og.Cos)
def _cos(op, d): return (-d * og.Sin(op.args[0]),)
@R(og.Tanh)
def _tanh(op, d): return (d * (1.0 - op * op),)
@R(og.Sigmoid)
def _sigmoid(op, d): return (d * op * (1.0 - op),)
@R(og.Erf)
def _erf(op, d):
    x = op.args[0]
    return (d * float(2 / math.sqrt(math.pi)) * og.Exp(-(x * x)),)
@R(og.Expm1)
def _expm1(op, d): return (d * og.Exp(op.args[0]),)  # not op + 1: 0 once op rounds to -1
@R(og.Softplus)
def _softplus(op, d): return (d * og.Sigmoid(op.args[0]),)
@R(sc.SigmoidCrossEntropy)
def _sce(op, d):
    x, t = op.args
    return d * (og.Sigmoid(x) - t), -d * x
@R(og.Dot)
def _dot(op, d):  # batched products too: the batch axes stay batch axes
    a, b = op.args
    s = op.batch_axes
    return og.Dot(d, b, batch_axes=s), og.Dot(a, d, batch_axes=s)
@R(og.Sum)
def _sum(op, d): return (d,)  # _fit broadcasts it back over the reduced axes
@R(og.Prod)
def _prod(op, d): return (d * prod_of_others(op),)
@R(og.Max, og.Min)
def _maxmin(op, d):
    x = op.args[0]
    hit = og.Equal(x, op)  # tied extremes share the derivative equally
    return (hit * (d / og.Sum(hit, reduction_axes=op.reduction_axes)),)
@R(og.Broadcast, og.AxesWithOrder, pr.Copy)
def _same(op, d): return (d,)
@R(og.CastAxes)
def _cast(op, d): return (og.CastAxes(d, op.args[0].axes),)
@R(og.Flatten)
def _flatten(op, d): return (og.Unflatten(d),)
@R(og.Unflatten)
def _unflatten(op, d): return (og.Flatten(d, op.args[0].axes),)
@R(og.Slice)
def _slice(op, d):
    x = op.args[0]
    key = [slice(None)] * len(x.axes)
    key[op.axis_pos] = op.key
    return (pr.Unslice(d, x.axes, key),)
@R(og.StopGradient)
def _stop(op, d): return (None,)
@R(nn.Gather)
def _gather(op, d): return nn.ScatterAdd(d, op.args[1], op.axis), None
@R(nn.ScatterAdd)
def _scatter_add(op, d): return nn.Gather(d, op.args[1], op.axis), None
@R(pr.Take)
def _take(op, d): return pr.PutAdd(d, op.args[1], op.args[0].axes), None
@R(pr.PutAdd)
def _put_add(op, d): return pr.Take(d, op.args[1]), None
@R(nn.CumSum)
def _cumsum(op, d): return (nn.CumSum(d, op.axis, not op.reverse, op.exclusive),)
@R(pr.PrefixSum)
def _prefix_sum(op, d):  # the running sum from the other end: flipped, summed, flipped
    flip = (slice(None), slice(None, None, -1)) + (slice(None),) * (len(op.axes) - 2)
    return (pr.SliceView(pr.PrefixSum(pr.SliceView(d, flip, d.axes)), flip, op.axes),)
# Semi-primitives: rules read operands by position, so lowered graphs stay differentiable.
@R(pr.Gemm)
def _gemm(op, d):  # da = d @ b^T, db = a^T @ d, batch by batch
    a, b = op.args
    n = len(op.axes)
    swap = tuple(range(n - 2)) + (n - 1, n - 2)
    return (pr.Reshape(pr.Gemm(d, pr.Dimshuffle(b, swap)), a.axes),
            pr.Reshape(pr.Gemm(pr.Dimshuffle(a, swap), d), b.axes))
@R(pr.ReduceSum)
def _rsum(op, d): return (_expand_back(op, d),)
@R(pr.ReduceProd)
def _rprod(op, d): return (_expand_back(op, d) * prod_of_others(op),)
@R(pr.ReduceMax, pr.ReduceMin)
def _rmax(op, d):
    hit = og.Equal(op.args[0], _expand_back(op, op))
    return (_expand_back(op, d / pr.ReduceSum(hit, op.axis)) * hit,)
@R(pr.Dimshuffle)
def _dimshuffle(op, d):
    inv = [0] * len(op.perm)
    for i, p in enumerate(op.perm):
        inv[p] = i
    return (pr.Dimshuffle(d, inv),)
@R(pr.Reshape)
def _reshape(op, d): return (pr.Reshape(d, op.args[0].axes),)
@R(pr.Expand)
def _expand(op, d):
    new = Axes(a for a, m in zip(op.axes, op.dim_map) if m is None)
    return (og.Sum(d, reduction_axes=new) if len(new) else d,)
@R(pr.SliceView)
def _sliceview(op, d): return (pr.Unslice(d, op.args[0].axes, op.key),)
@R(pr.Unslice)
def _unslice(op, d): return (pr.SliceView(d, op.key, op.args[0].axes),)


# Multi-output ops: ``d`` is a list of the outputs' adjoints (None where none flows).
@R(og.Output)
def _output(op, d): return (d,)
@R(og.Split)
def _split(op, d):
    x = op.args[0]
    total = None
    for k, dk in zip(op.keys, d):
        if dk is None:
            continue
        key = [slice(None)] * len(x.axes)
        key[op.axis_pos] = k
        part = pr.Unslice(dk, x.axes, key)
        total = part if total is None else total + part
    return (total,)
@R(og.MaxArgMax)
def _max_argmax(op, d):
    if d[0] is None:
        return (None,)
    x = op.args[0]
    hit = og.Equal(x, op.outputs[0])  # tied maxima share the derivative, as for Max
    return (hit * (d[0] / og.Sum(hit, reduction_axes=op.reduction_axes)),)
@R(nn.Sort, nn.TopK, pr.SortPrim)
def _sort(op, d):  # the values' delta added back at the positions they came from
    if d[0] is None:
        return (None,)
    flat, index = nn.along_axis_index(op.args[0], op.outputs[1], sorted_axis(op))
    return (og.Unflatten(nn.ScatterAdd(d[0], index, flat.axes[0])),)


def sorted_axis(op):
    """The axis a Sort, TopK or SortPrim sorts along."""
    return op.axis if not isinstance(op, pr.SortPrim) else op.args[0].axes[1]


@R(pr.ReduceMaxArgMax)
def _reduce_max_argmax(op, d):
    if d[0] is None:
        return (None,)
    hit = og.Equal(op.args[0], _expand_back(op, op.outputs[0]))
    return (_expand_back(op, d[0] / pr.ReduceSum(hit, op.axis)) * hit,)


def log_base(op):
    """``log(a)`` for the power ``op = a ** b``, but 0 where ``a ** b`` is 0: the
    factor of ``d(a ** b) / db = log(a) a ** b`` whose limit at ``a = 0 < b`` is 0
    (``log(0) * 0`` would be NaN)."""
    a = op.args[0]
    return og.Log(a + og.Equal(op, 0.0))


def prod_of_others(op):
    """For each element of the input of the product ``op`` (a :class:`Prod` or a
    :class:`ReduceProd`), the product of the other elements it is multiplied with:
    the derivative of the product. ``op / x`` would be NaN where ``x`` is 0, so it is
    ``p / x`` where no element is 0 (``p``: the product of the nonzero elements), ``p``
    at the zero where exactly one is, and 0 everywhere else."""
    x = op.args[0]
    if isinstance(op, og.Prod):
        def reduce(cls, v): return cls(v, reduction_axes=op.reduction_axes)
        def expand(v): return og.Broadcast(v, x.axes)
        total, product = og.Sum, og.Prod
    else:
        def reduce(cls, v): return cls(v, op.axis)
        def expand(v): return _expand_back(op, v)
        total, product = pr.ReduceSum, pr.ReduceProd
    zero = og.Equal(x, 0.0)
    nonzero = x + zero  # the zeros replaced by ones
    others_zero = expand(reduce(total, zero)) - zero  # zeros among the others
    return og.Equal(others_zero, 0.0) * expand(reduce(product, nonzero)) / nonzero


def _expand_back(op, v):
    """``v`` (axes of the ReducePrim ``op``) broadcast back to the input's shape."""
    x = op.args[0]
    dim_map, k = [], 0
    for i in range(len(x.axes)):
        if i == op.axis:
            dim_map.append(None)
        else:
            dim_map.append(k)
            k += 1
    return pr.Expand(v, x.axes, dim_map)
