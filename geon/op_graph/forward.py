"""Forward-mode derivatives: ``jvp`` and the table of forward (tangent) rules.

:data:`FORWARD` maps an op class to ``fn(op, tangents) -> tangent``. ``tangents`` holds
one entry per arg of ``op``: an op, or ``None`` where the arg's tangent is zero (the arg
does not depend on the inputs). The rule returns the tangent of ``op``'s value, or
``None`` for zero. It sits next to the op's reverse rule in
:data:`geon.op_graph.autodiff.ADJOINTS`: every class there has an entry here too.

Tangents may carry *direction axes*: :func:`geon.op_graph.jacobian.jacobian` pushes many
directions at once by giving the input a tangent with extra axes (one direction per
index of the extra axes). The tangent of every op then has the op's axes followed by
those extra axes, in that order; :func:`fit_tangent` brings a rule's result to that
layout in one place (broadcasting by name where the result lacks axes, reordering
where it has them in another order). Rules built from ops that match operands by name
(elementwise ops, ``dot``, reductions) handle direction axes without any care; rules
that read operands by position use :func:`direction_axes` to keep them trailing.
"""

import math
from typing import Any, Sequence, Union

import numpy as np

from geon.errors import ArgumentError, AxisMismatchError, GeonError
from geon.op_graph import nn_ops as nn
from geon.op_graph import op_graph as og
from geon.op_graph import primitives as pr
from geon.op_graph import schemas as sc
from geon.op_graph.autodiff import (_expand_back, find_rule, log_base, prod_of_others,
                                     sorted_axis)
from geon.op_graph.axes import Axes, Axis
from geon.op_graph.nodes import user_location
from geon.op_graph.op_graph import as_op, snap, toposort
from geon.op_graph.tables import OpTable

FORWARD = OpTable("FORWARD", "fn(op, tangents of the args) -> tangent")
#: Decorator: ``@forward_rule(Cls, ...)`` registers ``fn(op, tangents) -> tangent``.
forward_rule = FORWARD.register


def direction_axes(t, arg):
    """The direction axes of tangent ``t`` of ``arg``: its axes after ``arg``'s own."""
    return Axes(tuple(t.axes)[len(arg.axes):])


def fit_tangent(t, op, directions=Axes()):
    """``t`` laid out as ``op.axes + directions`` (broadcast by name, reordered).

    A tangent with axes that the op lacks is a bug in a forward rule: it raises.
    """
    target = op.axes + directions
    if t.axes.names == target.names:
        return t
    stray = t.axes - target
    if len(stray):
        raise GeonError(f"forward rule of {type(op).__name__} {op.name} returned a "
                        f"tangent with axes {stray!r} that the op ({op.axes!r}) lacks "
                        f"(built at {op.file_info})")
    if t.axes.same_set(target):
        return og.AxesWithOrder(t, target)
    return og.Broadcast(t, target)


def _float_dtype(op):
    return op.dtype if op.dtype.kind == "f" else og.DEFAULT_DTYPE


def propagate(outputs, seeds, directions=Axes()):
    """``{op: tangent}`` for the ops ``outputs`` depend on, pushing ``seeds``
    (``{input op: tangent laid out as input.axes + directions}``) forward in
    topological order. Ops without an entry have a zero tangent."""
    order = toposort(outputs, deps=False)
    tangents = {}
    for op in order:
        if op in seeds:
            tangents[op] = seeds[op]
            continue
        if isinstance(op, (og.AssignableTensorOp, og.StopGradient)) or not op.args:
            continue
        ts = [tangents.get(a) for a in op.args]
        if all(t is None for t in ts):
            continue
        rule = find_rule(FORWARD, op)
        if rule is None:
            raise GeonError(f"jvp: no forward rule for {type(op).__name__} {op.name} "
                            f"(built at {op.file_info})")
        t = rule(op, ts)
        if t is None:
            continue
        if isinstance(op, og.MultiOutput):  # one tangent per output (None: zero)
            tangents[op] = tuple(None if ti is None else
                                 fit_tangent(as_op(ti), out, directions)
                                 for ti, out in zip(t, op.outputs))
        else:
            tangents[op] = fit_tangent(as_op(t), op, directions)
    return tangents


def _as_list(x):
    if isinstance(x, (list, tuple)):
        return list(x), False
    return [x], True


def _seed(x, t):
    """The tangent ``t`` given for input ``x`` as an op with ``x``'s axes in order."""
    if not isinstance(t, og.Op):
        arr = np.asarray(t, dtype=_float_dtype(x))
        t = og.Constant(arr, axes=x.axes if arr.ndim else None, dtype=arr.dtype)
    if len(t.axes - x.axes):
        raise AxisMismatchError(f"jvp: tangent {t.name} ({og._fmt(t.axes)}) has axes that "
                                f"input {x.name} ({og._fmt(x.axes)}) lacks (at "
                                f"{user_location()})")
    return fit_tangent(t, x)


def jvp(outputs: Union[og.TensorOp, Sequence[og.TensorOp]],
        inputs: Union[og.TensorOp, Sequence[og.TensorOp]], tangents: Any) -> Any:
    """Jacobian-vector products (forward mode).

    Builds ops for ``sum_i d outputs / d inputs[i] . tangents[i]``: how each output
    changes when every input moves along its tangent.

    Args:
        outputs: an op or a list of ops (any axes).
        inputs: an op or a list of ops (usually variables or placeholders; any op
            may be used, its own dependencies are then ignored).
        tangents: one per input: an op with the input's axes (or fewer; it is
            broadcast), an array of the input's shape, or a number.

    Returns an op with the output's axes (a list for a list of outputs); an output
    that does not depend on the inputs gets zeros. ``stop_gradient`` blocks
    tangents as it blocks :func:`geon.deriv`.
    """
    outs, single = _as_list(outputs)
    ins, one_in = _as_list(inputs)
    ts = [tangents] if one_in else _as_list(tangents)[0]
    if len(ts) != len(ins):
        raise ArgumentError(f"jvp: {len(ins)} input(s) but {len(ts)} tangent(s) (at "
                            f"{user_location()})")
    outs = [snap(as_op(o)) for o in outs]
    seeds = {}
    for x, t in zip(ins, ts):
        x = snap(as_op(x))
        seeds[x] = _seed(x, t)
    found = propagate(outs, seeds)
    result = [found.get(o) if found.get(o) is not None
              else og.Constant(0.0, axes=o.axes, dtype=_float_dtype(o)) for o in outs]
    return result[0] if single else result


def hvp(c: og.TensorOp, wrt: Union[og.TensorOp, Sequence[og.TensorOp]],
        vectors: Any) -> Any:
    """Hessian-vector products of the scalar ``c``: forward mode over reverse mode.

    ``hvp(c, w, v)`` is ``jvp(deriv(c, w), w, v)``: the derivative of the gradient of
    ``c`` along ``v``, an op with ``w``'s axes. With lists ``wrt = [w1, w2]`` and
    ``vectors = [v1, v2]`` it returns a list: entry ``i`` is
    ``sum_j d^2 c / dwi dwj . vj``.
    """
    from geon.op_graph.autodiff import deriv
    ws, single = _as_list(wrt)
    vs = [vectors] if single else list(vectors)
    grads = [deriv(c, w) for w in ws]
    out = jvp(grads, ws, vs)
    return out[0] if single else out


# --- helpers for rules --------------------------------------------------------------------
def _terms(*pairs):
    """``sum_i f_i(t_i)`` over the pairs ``(t_i, f_i)`` whose tangent is not ``None``."""
    out = None
    for t, f in pairs:
        if t is None:
            continue
        term = f(t)
        out = term if out is None else out + term
    return out


def _scaled(factor):
    """A rule for a unary elementwise op: ``tangent * factor(op)``."""
    def rule(op, ts):
        t, = ts
        return t * factor(op)
    return rule


F = forward_rule


@F(og.Add)
def _add(op, ts): return _terms((ts[0], lambda t: t), (ts[1], lambda t: t))
@F(og.Subtract)
def _sub(op, ts): return _terms((ts[0], lambda t: t), (ts[1], lambda t: -t))
@F(og.Multiply)
def _mul(op, ts):
    a, b = op.args
    return _terms((ts[0], lambda t: t * b), (ts[1], lambda t: a * t))
@F(og.Divide)
def _div(op, ts):  # d(a/b) = da/b - (a/b) db/b
    b = op.args[1]
    return _terms((ts[0], lambda t: t / b), (ts[1], lambda t: -(t * op) / b))
@F(og.Power)
def _pow(op, ts):  # d(a**b) = b a**(b-1) da + log(a) a**b db
    a, b = op.args
    return _terms((ts[0], lambda t: t * b * a ** (b - 1)),
                  (ts[1], lambda t: t * log_base(op) * op))
@F(og.Maximum)
def _maximum(op, ts):
    a, b = op.args
    if isinstance(b, og.Constant):  # as the reverse rule: the mask from the result
        return _terms((ts[0], lambda t: t * (op > b)))
    return _terms((ts[0], lambda t: t * (a >= b)), (ts[1], lambda t: t * (a < b)))
@F(og.Minimum)
def _minimum(op, ts):
    a, b = op.args
    if isinstance(b, og.Constant):
        return _terms((ts[0], lambda t: t * (op < b)))
    return _terms((ts[0], lambda t: t * (a <= b)), (ts[1], lambda t: t * (a > b)))
@F(og.Comparison, og.Sign, og.ArgMax, og.TensorSize, og.OneHot, pr.ReduceArgMax,
   og.StopGradient)
def _zero(op, ts): return None
@F(og.Negative)
def _neg(op, ts): return -ts[0]
@F(og.Log)
def _log(op, ts): return ts[0] / op.args[0]


F(og.Absolute)(_scaled(lambda op: og.Sign(op.args[0])))
F(og.Square)(_scaled(lambda op: 2.0 * op.args[0]))
F(og.Sqrt)(_scaled(lambda op: 0.5 / op))
F(og.Reciprocal)(_scaled(lambda op: -(op * op)))
F(og.Exp)(_scaled(lambda op: op))
F(og.Sin)(_scaled(lambda op: og.Cos(op.args[0])))
F(og.Cos)(_scaled(lambda op: -og.Sin(op.args[0])))
F(og.Tanh)(_scaled(lambda op: 1.0 - op * op))
F(og.Sigmoid)(_scaled(lambda op: op * (1.0 - op)))
F(og.Erf)(_scaled(lambda op: float(2 / math.sqrt(math.pi))
                   * og.Exp(-(op.args[0] * op.args[0]))))
F(og.Expm1)(_scaled(lambda op: og.Exp(op.args[0])))  # not op + 1: 0 once op is -1
F(og.Softplus)(_scaled(lambda op: og.Sigmoid(op.args[0])))


@F(sc.SigmoidCrossEntropy)
def _sce(op, ts):  # d/dx = sigmoid(x) - t ; d/dt = -x
    x, target = op.args
    return _terms((ts[0], lambda t: t * (og.Sigmoid(x) - target)), (ts[1], lambda t: -(t * x)))
@F(og.Dot)
def _dot(op, ts):
    a, b = op.args
    s = op.batch_axes
    return _terms((ts[0], lambda t: og.Dot(t, b, batch_axes=s)),
                  (ts[1], lambda t: og.Dot(a, t, batch_axes=s)))
@F(og.Sum)
def _sum(op, ts): return og.Sum(ts[0], reduction_axes=op.reduction_axes)
@F(og.Prod)
def _prod(op, ts):  # d prod(x) = sum(prod(others) * dx)
    return og.Sum(ts[0] * prod_of_others(op), reduction_axes=op.reduction_axes)
@F(og.Max, og.Min)
def _maxmin(op, ts):  # the mean tangent of the tied extremes, as the reverse rule splits
    return _tied_mean(og.Equal(op.args[0], op), ts[0], op.reduction_axes)


def _tied_mean(hit, t, red):
    return og.Sum(hit * t, reduction_axes=red) / og.Sum(hit, reduction_axes=red)
@F(og.Broadcast, og.AxesWithOrder, pr.Copy, pr.Dimshuffle)
def _same(op, ts):  # fit_tangent broadcasts / reorders by name (Dimshuffle keeps names)
    return ts[0]
@F(og.CastAxes)
def _cast(op, ts):
    t = ts[0]
    return og.CastAxes(t, op.axes + direction_axes(t, op.args[0]))
@F(og.Flatten)
def _flatten(op, ts):
    t = ts[0]
    return og.Flatten(t, op.axes + direction_axes(t, op.args[0]))
@F(og.Unflatten)
def _unflatten(op, ts): return og.Unflatten(ts[0])
@F(og.Slice)
def _slice(op, ts):
    x = op.args[0]
    new = op.axes[op.axis_pos] if isinstance(op.key, slice) else None
    return og.Slice(ts[0], x.axes[op.axis_pos], op.key, new_axis=new)


@F(nn.Gather)
def _gather(op, ts): return nn.Gather(ts[0], op.args[1], op.axis)
@F(nn.ScatterAdd)
def _scatter_add(op, ts): return nn.ScatterAdd(ts[0], op.args[1], op.axis)
@F(nn.CumSum)
def _cumsum(op, ts): return nn.CumSum(ts[0], op.axis, op.reverse, op.exclusive)


# Semi-primitives: positional ops, kept differentiable after lowering. Direction axes
# stay trailing, so positional keys and dimension maps extend by whole trailing dims.
@F(pr.Gemm)
def _gemm(op, ts):  # d(a @ b) = da @ b + a @ db, as a dot over a fresh shared axis
    a, b = op.args
    if op.batch_rank == 0:
        k = Axis(a.axes[1].length)

        def as_a(x): return og.CastAxes(x, Axes(a.axes[0], k) + direction_axes(x, a))
        def as_b(x): return og.CastAxes(x, Axes(k, b.axes[1]) + direction_axes(x, b))
        return _terms((ts[0], lambda t: og.Dot(as_a(t), as_b(b))),
                      (ts[1], lambda t: og.Dot(as_a(a), as_b(t))))
    # batched: fresh batch, row, inner and column axes (the operands' batch axes may
    # be named differently), a dot keeping the batch axes, then the result's names
    *batch, m, k, n = (Axis(x) for x in a.axes.lengths + b.axes.lengths[-1:])
    batch = Axes(batch)

    def left(x): return og.CastAxes(x, batch + Axes(m, k) + direction_axes(x, a))
    def right(x): return og.CastAxes(x, batch + Axes(k, n) + direction_axes(x, b))

    def named(y):
        extra = y.axes - (batch + Axes(m, n))
        return og.CastAxes(og.AxesWithOrder(y, batch + Axes(m, n) + extra),
                           op.axes + extra)
    return _terms((ts[0], lambda t: named(og.Dot(left(t), right(b), batch_axes=batch))),
                  (ts[1], lambda t: named(og.Dot(left(a), right(t), batch_axes=batch))))


def _prim_reduced(op):
    x = op.args[0]
    return Axes(x.axes[op.axis])


@F(pr.ReduceSum)
def _rsum(op, ts): return og.Sum(ts[0], reduction_axes=_prim_reduced(op))
@F(pr.ReduceProd)
def _rprod(op, ts):
    return og.Sum(prod_of_others(op) * ts[0], reduction_axes=_prim_reduced(op))
@F(pr.ReduceMax, pr.ReduceMin)
def _rmax(op, ts):
    hit = og.Equal(op.args[0], _expand_back(op, op))
    return _tied_mean(hit, ts[0], _prim_reduced(op))
@F(pr.Reshape)
def _reshape(op, ts):
    t = ts[0]
    return pr.Reshape(t, op.axes + direction_axes(t, op.args[0]))
@F(pr.Expand)
def _expand(op, ts):
    t = ts[0]
    extra = direction_axes(t, op.args[0])
    n = len(op.args[0].axes)
    return pr.Expand(t, op.axes + extra, op.dim_map + tuple(range(n, n + len(extra))))
@F(pr.SliceView)
def _sliceview(op, ts):
    t = ts[0]
    extra = direction_axes(t, op.args[0])
    return pr.SliceView(t, op.key + (slice(None),) * len(extra), op.axes + extra)
@F(pr.Take)
def _take(op, ts): return pr.Take(ts[0], op.args[1])  # direction axes trail
@F(pr.PutAdd)
def _put_add(op, ts):
    t = ts[0]
    return pr.PutAdd(t, op.args[1], op.axes + direction_axes(t, op.args[0]))
@F(pr.PrefixSum)
def _prefix_sum(op, ts): return pr.PrefixSum(ts[0])
@F(pr.Unslice)
def _unslice(op, ts):
    t = ts[0]
    extra = direction_axes(t, op.args[0])
    return pr.Unslice(t, op.axes + extra, op.key + (slice(None),) * len(extra))


# --- forward rules derived from reverse rules ------------------------------------------------
class LinearizationPoint(og.Constant):
    """Zeros that derivatives flow through (a constant for evaluation, not for
    ``deriv``): the point at which a linear map built by a
    reverse rule is differentiated to obtain its transpose."""

    is_constant = False


def forward_from_reverse(reverse):
    """A forward rule computed from the reverse rule ``reverse(op, delta) -> deltas``.

    A reverse rule is the linear map ``delta -> J^T delta``. For a zero ``u`` with the
    op's axes (plus any direction axes), ``s = sum_i <J_i^T u, t_i>`` is linear in ``u``
    and ``d s / d u = sum_i J_i t_i``, the tangent. This needs reverse rules for the ops
    the reverse rule builds, and, for tangents with direction axes (Jacobians), a
    reverse rule that matches its delta by name (elementwise ones do).
    """
    from geon.op_graph.autodiff import deriv

    def rule(op, ts):
        extra = Axes()
        for t, a in zip(ts, op.args):
            if t is not None:
                extra = direction_axes(t, a)
                break
        u = LinearizationPoint(0.0, axes=op.axes + extra, dtype=_float_dtype(op))
        deltas = reverse(op, u)
        s = None
        for t, a, d in zip(ts, op.args, deltas):
            if t is None or d is None:
                continue
            d = fit_tangent(_sum_extra(as_op(d), a, extra), a, extra)
            prod = d * t
            term = og.Sum(prod, reduction_axes=prod.axes)
            s = term if s is None else s + term
        return None if s is None else deriv(s, u)
    name = getattr(reverse, "__name__", "a reverse rule")
    rule.__doc__ = f"Forward rule derived from {name}."
    return rule


def _sum_extra(d, arg, extra):
    """``d`` summed over axes that neither ``arg`` nor the direction axes have."""
    stray = d.axes - (arg.axes + extra)
    return og.Sum(d, reduction_axes=stray) if len(stray) else d


# Multi-output ops: their tangent is a tuple, one entry per output; Output picks one.
@F(og.Output)
def _output(op, ts):
    return ts[0][op.index]
@F(og.Split)
def _split(op, ts):
    t, x = ts[0], op.args[0]
    axis = x.axes[op.axis_pos]
    return tuple(og.Slice(t, axis, k, new_axis=out.axes[op.axis_pos])
                 for k, out in zip(op.keys, op.outputs))
@F(og.MaxArgMax)
def _max_argmax(op, ts):
    hit = og.Equal(op.args[0], op.outputs[0])
    return (_tied_mean(hit, ts[0], op.reduction_axes), None)
@F(nn.Sort, nn.TopK, pr.SortPrim)
def _sort(op, ts):  # the tangent at the positions the values came from
    t, x = ts[0], op.args[0]
    flat, index = nn.along_axis_index(x, op.outputs[1], sorted_axis(op))
    tf = og.Flatten(t, Axes((flat.axes[0],) + tuple(direction_axes(t, x))))
    return (nn.Gather(tf, index, flat.axes[0]), None)
@F(pr.ReduceMaxArgMax)
def _reduce_max_argmax(op, ts):
    hit = og.Equal(op.args[0], _expand_back(op, op.outputs[0]))
    return (_tied_mean(hit, ts[0], _prim_reduced(op)), None)
