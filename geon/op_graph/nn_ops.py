"""Ops models need beyond the core set, in the Axes family (named axes).

Most are composites of the core ops: activations, ``where`` / ``clip``,
``log_softmax`` / ``logsumexp``, ``pad``, ``concat``, ``stack`` and ``tile`` build
ordinary ops, so derivatives, lowering and both backends need nothing new. The
semi-primitives they use where no composite is accurate or fast enough are
:class:`~geon.op_graph.op_graph.Erf`, :class:`~geon.op_graph.op_graph.Expm1`,
:class:`~geon.op_graph.op_graph.Softplus` and :class:`~geon.op_graph.np_ops.Select`
(elementwise), and, from :mod:`geon.op_graph.primitives`, ``Take`` / ``ScatterAdd``
(``gather``), ``CumSumPrim`` (``cumsum``) and ``SortPrim`` (``sort``, ``argsort``,
``topk``). The ops here with several results or a data-dependent access pattern
(:class:`Gather`, :class:`CumSum`, :class:`Sort`, :class:`TopK`) are Axes-family ops
lowered to those primitives by :mod:`geon.transformers.passes.lower`.

Every function here also accepts NumPy-family tensors where that makes sense (the
elementwise ones); :mod:`geon.op_graph.np_ops` has the positional forms with NumPy's
and PyTorch's signatures.
"""

import math

import numpy as np

from geon.errors import AxisMismatchError
from geon.op_graph import op_graph as og
from geon.op_graph.axes import Axes, Axis, as_axes
from geon.op_graph.op_graph import _fmt, _mismatch, as_op

__all__ = [
    "elu", "erf", "expm1", "gelu", "hard_sigmoid", "leaky_relu", "log_softmax",
    "logsumexp", "relu", "selu", "silu", "softplus", "where", "clip",
]

erf = og.erf
expm1 = og.expm1
softplus = og.softplus

#: The constants of SELU (Klambauer et al., 2017), as PyTorch uses them.
SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946


# --- selection ------------------------------------------------------------------------------

def where(condition, x, y):
    """``x`` where ``condition`` is nonzero, else ``y`` (operands matched by axis name,
    as in every elementwise op). Derivatives flow to the branch taken only, so an
    infinite or NaN value in the other branch does no harm."""
    from geon.op_graph.np_ops import Select
    return Select(condition, x, y)


def clip(x, lo=None, hi=None):
    """``minimum(maximum(x, lo), hi)``; either bound may be ``None`` (no bound) or a
    tensor matched by axis name. As in NumPy and PyTorch, ``lo > hi`` gives ``hi``."""
    if lo is None and hi is None:
        raise ValueError("clip: give lo, hi or both")
    r = as_op(x)
    if lo is not None:
        r = og.Maximum(r, lo)
    if hi is not None:
        r = og.Minimum(r, hi)
    return r


# --- activations ----------------------------------------------------------------------------

def relu(x):
    """``max(x, 0)``."""
    return og.Maximum(x, 0.0)


def leaky_relu(x, negative_slope=0.01):
    """``x`` for ``x > 0``, else ``negative_slope * x`` (PyTorch's ``leaky_relu``)."""
    x = as_op(x)
    return where(x > 0.0, x, x * float(negative_slope))


def elu(x, alpha=1.0):
    """``x`` for ``x > 0``, else ``alpha * (exp(x) - 1)`` (with ``expm1``, exact near
    0; the exponential sees ``min(x, 0)`` so the branch not taken never overflows)."""
    x = as_op(x)
    return where(x > 0.0, x, og.Expm1(og.Minimum(x, 0.0)) * float(alpha))


def selu(x):
    """``SELU_SCALE * elu(x, SELU_ALPHA)`` (scaled exponential linear unit)."""
    return elu(x, SELU_ALPHA) * SELU_SCALE


def gelu(x, approximate="none"):
    """Gaussian error linear unit, ``x * Phi(x)``: ``approximate="none"`` computes
    ``x / 2 * (1 + erf(x / sqrt(2)))``, ``"tanh"`` PyTorch's tanh approximation
    ``x / 2 * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3)))``."""
    x = as_op(x)
    if approximate == "none":
        return x * 0.5 * (og.Erf(x * float(1 / math.sqrt(2.0))) + 1.0)
    if approximate == "tanh":
        inner = (x + x * x * x * 0.044715) * float(math.sqrt(2.0 / math.pi))
        return x * 0.5 * (og.Tanh(inner) + 1.0)
    raise ValueError(f"gelu: approximate must be 'none' or 'tanh', not {approximate!r}")


def silu(x):
    """``x * sigmoid(x)`` (also called swish)."""
    x = as_op(x)
    return x * og.Sigmoid(x)


def hard_sigmoid(x):
    """``clip(x / 6 + 1/2, 0, 1)`` (PyTorch's ``hardsigmoid``)."""
    return clip(as_op(x) * float(1 / 6) + 0.5, 0.0, 1.0)


# --- log-softmax ------------------------------------------------------------------------------

def logsumexp(x, reduction_axes=None, out_axes=None):
    """``log(sum(exp(x)))`` over the reduction axes (the rule of
    :class:`~geon.op_graph.op_graph.Reduction`), computed as ``m + log(sum(exp(x - m)))``
    with ``m = max(x)``: no overflow, and its derivative is the softmax."""
    x = as_op(x)
    # The value does not depend on the shift, so no derivative flows through it.
    m = og.StopGradient(og.Max(x, reduction_axes, out_axes))
    s = og.Sum(og.Exp(x - m), m.args[0].reduction_axes, m.axes)
    return og.Log(s) + m


def log_softmax(x, normalization_axes=None):
    """``log(softmax(x))`` over ``normalization_axes`` (default: all but the batch and
    recurrent axes), computed as ``(x - m) - log(sum(exp(x - m)))``: exact for any
    logits, derivative ``d - softmax(x) * sum(d)``."""
    x = as_op(x)
    red = as_axes(normalization_axes) if normalization_axes is not None \
        else x.axes.sample_axes()
    shifted = x - og.StopGradient(og.Max(x, reduction_axes=red))
    return shifted - og.Log(og.Sum(og.Exp(shifted), reduction_axes=red))


# --- serialization (until op classes declare ``attrs`` for the serializer) --------------------

def _register():
    from geon.op_graph.serialize import register_op
    for cls in (og.Erf, og.Expm1, og.Softplus):
        register_op(cls, arity=1)


_register()
