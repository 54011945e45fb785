"""Schemas: structure attached to an op so that later ops can compute stably.

``softmax`` returns a :class:`~geon.op_graph.op_graph.Divide` op carrying a
``SoftmaxSchema``; ``cross_entropy_multi`` recognises it and works from the shifted
logits and their log-sum-exp instead of taking the log of a rounded probability.
``sigmoid`` results carry a :class:`SigmoidSchema`, used by ``cross_entropy_binary``.

A schema class declares ``attrs`` like an op (constructor arguments kept as attributes;
ops among them are references), so it is copied and serialized generically, and
``matches(op)`` checks that the op really has the structure the schema claims: a graph
read from a document or copied keeps a schema only where it matches.
"""

from typing import Optional

import numpy as np

from geon.op_graph import op_graph as og
from geon.op_graph.axes import AxesLike, as_axes
from geon.op_graph.derivatives import terms
from geon.op_graph.special import sigmoid_ce
from geon.op_graph.tables import ELEMENTWISE_FUNCS, adjoint_rule, forward_rule
from geon.op_graph.op_graph import (BinaryElementWise, Constant, Divide, Exp, Log, Maximum,
                                    Sigmoid, SigmoidSchema, Subtract, Sum, as_op, keywords,
                                    max, safelog, stop_gradient, sum)

_AXES_HINT = {k: "use normalization_axes= (the axes to normalize over)"
              for k in ("axes", "axis", "reduction_axes")}
_OUT_HINT = {k: "use out_axes= (the axes to keep; the others are summed over)"
             for k in ("axes", "axis", "reduction_axes")}


class SoftmaxSchema:
    """``softmax(x) = exp(x - m) / Z`` with ``m = max(x)`` and ``Z = sum(exp(x - m))``."""

    kind = "softmax"
    attrs = ("x", "shifted", "Z", "normalization_axes")

    def __init__(self, x, shifted, Z, normalization_axes):
        self.x, self.shifted, self.Z = x, shifted, Z
        self.normalization_axes = normalization_axes

    def matches(self, y):
        """Whether ``y`` is ``exp(shifted) / Z`` with ``shifted = x - m`` and ``Z`` the
        sum of that ``exp`` over ``normalization_axes`` (what cross-entropy relies on)."""
        if not isinstance(y, Divide):
            return False
        e, Z = y.args
        return (Z is self.Z and isinstance(Z, Sum) and Z.args[0] is e
                and isinstance(e, Exp) and e.args[0] is self.shifted
                and isinstance(self.shifted, Subtract) and self.shifted.args[0] is self.x
                and Z.reduction_axes.same_set(self.normalization_axes))


#: The schema classes a document may name, by ``kind``.
SCHEMAS = {cls.kind: cls for cls in (SoftmaxSchema, SigmoidSchema)}


@keywords(_AXES_HINT)
def softmax(x: og.TensorLike,
            normalization_axes: Optional[AxesLike] = None) -> og.TensorOp:
    """Softmax over ``normalization_axes`` (default: all but batch and recurrent axes).

    Computed from ``x - max(x)`` so it never overflows; the result is a division op
    with a ``SoftmaxSchema``.
    """
    x = as_op(x)
    red = as_axes(normalization_axes) if normalization_axes is not None \
        else x.axes.sample_axes()
    # The value does not depend on the shift, so no derivative flows through it.
    m = stop_gradient(max(x, reduction_axes=red))
    shifted = x - m
    exps = Exp(shifted)
    Z = sum(exps, reduction_axes=red)
    y = exps / Z
    y.schema = SoftmaxSchema(x, shifted, Z, red)
    return y


@keywords(_OUT_HINT)
def cross_entropy_multi(y: og.TensorOp, t: og.TensorLike, usebits: bool = False,
                        out_axes: Optional[AxesLike] = None) -> og.TensorOp:
    """``-sum(t * log(y))`` over the sample axes (``out_axes`` keeps others).

    If ``y`` came from :func:`softmax`, ``log(y)`` is computed as ``shifted - log(Z)``,
    exact for any logits; the derivative with respect to the logits is then
    ``(softmax - t) * sum(t)``, i.e. ``softmax - t`` for a distribution ``t``.
    """
    y, t = as_op(y), as_op(t)
    s = y.schema
    if isinstance(s, SoftmaxSchema):
        # A -inf logit (masked), or one so far below the maximum that the shift
        # overflows, has log(y) = -inf: clipped to the lowest finite number so that a
        # target of 0 there adds 0 (t * -inf would be NaN).
        logy = s.shifted - Log(s.Z)
        if logy.dtype.kind == "f":
            logy = Maximum(logy, Constant(np.finfo(logy.dtype).min, dtype=logy.dtype))
    else:
        logy = safelog(y)
    r = -sum(t * logy, out_axes=out_axes)
    return r * float(1 / np.log(2)) if usebits else r


@og.primitive
class SigmoidCrossEntropy(BinaryElementWise):
    """Elementwise ``-(t log sigmoid(x) + (1 - t) log(1 - sigmoid(x)))`` from logits
    ``x``, computed as ``softplus(x) - x t``; its derivative is ``sigmoid(x) - t``."""


ELEMENTWISE_FUNCS[SigmoidCrossEntropy] = sigmoid_ce


@adjoint_rule(SigmoidCrossEntropy)
def _sce_adjoint(op, d):  # d/dx = sigmoid(x) - t ; d/dt = -x
    x, t = op.args
    return d * (Sigmoid(x) - t), -d * x


@forward_rule(SigmoidCrossEntropy)
def _sce_tangent(op, ts):
    x, target = op.args
    return terms((ts[0], lambda t: t * (Sigmoid(x) - target)), (ts[1], lambda t: -(t * x)))


@keywords(_OUT_HINT)
def cross_entropy_binary(y: og.TensorOp, t: og.TensorLike,
                         out_axes: Optional[AxesLike] = None) -> og.TensorOp:
    """Binary cross-entropy summed over the sample axes (``out_axes`` keeps others).

    If ``y`` came from :func:`sigmoid`, it is computed from the logits (stable for any
    magnitude, derivative ``sigmoid(x) - t``); otherwise from ``y`` with a safe log.
    """
    y, t = as_op(y), as_op(t)
    s = y.schema
    if isinstance(s, SigmoidSchema):
        e = SigmoidCrossEntropy(s.x, t)
    else:
        e = -(t * safelog(y) + (1 - t) * safelog(1 - y))
    return sum(e, out_axes=out_axes)
