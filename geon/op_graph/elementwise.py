"""Elementwise ops: arithmetic, comparisons and functions of one tensor, matched by
axis name (the result has the left operand's axes, then the right's that the left
lacks), with their derivatives and reference values; and the operators of
:class:`~geon.op_graph.core.TensorOp` (``x + y``, ``-x``, ``x < y``, ``abs(x)``)."""

import builtins
import math

import numpy as np

from geon.op_graph import special
from geon.op_graph.axes import check_lengths
from geon.op_graph.core import (DEFAULT_DTYPE, FAMILY_HOOKS, OPERATORS, ComputationOp, Constant,
                                TensorLike, TensorOp, _arrays_as_constants, as_op,
                                primitive, result_dtype)
from geon.op_graph.derivatives import scaled, terms, zero_adjoint, zero_tangent
from geon.op_graph.keywords import keywords
from geon.op_graph.special import align
from geon.op_graph.tables import (ELEMENTWISE_FUNCS, NP_UFUNCS, adjoint_rule, evaluator,
                                  forward_rule)

#: The names :mod:`geon.op_graph.op_graph` re-exports (``og.X``), private helpers that
#: other modules use as ``og._x`` among them.
__all__ = [
    "Absolute", "absolute", "Add", "add", "BinaryElementWise", "Comparison", "Cos",
    "cos", "Divide", "divide", "ElementWise", "_ELEMENTWISE_HINTS", "Equal", "equal",
    "Erf", "erf", "Exp", "exp", "Expm1", "expm1", "Greater", "greater",
    "greater_equal", "GreaterEqual", "Less", "less", "less_equal", "LessEqual", "Log",
    "log", "Maximum", "maximum", "Minimum", "minimum", "Multiply", "multiply",
    "Negative", "negative", "not_equal", "NotEqual", "Power", "power", "Reciprocal",
    "reciprocal", "safelog", "Sigmoid", "sigmoid", "SigmoidSchema", "Sign", "sign",
    "Sin", "sin", "Softplus", "softplus", "Sqrt", "sqrt", "Square", "square",
    "Subtract", "subtract", "Tanh", "tanh", "UnaryElementWise",
]


class ElementWise(ComputationOp):
    """Elementwise ops. Args are matched by axis name: the result has the first arg's
    axes followed by each later arg's axes that are not yet present.

    A NumPy array among the args takes the axes of the first op arg whose shape it has
    (``x + np.ones(3)`` for ``x`` with axes ``(C:3,)``); otherwise wrap it in
    :class:`Constant` with its axes.
    """

    def __init__(self, *args, **kwargs):
        hook = FAMILY_HOOKS.get("elementwise")
        if hook is not None:  # NumPy broadcasting, coercions between families
            args, kwargs = hook(type(self), args, kwargs)
        if any(isinstance(a, np.ndarray) and a.ndim for a in args):
            args = _arrays_as_constants(args, type(self).__name__)
        super().__init__(*args, **kwargs)

    def _infer_axes(self):
        args = self.args
        axes = args[0].axes
        for a in args:  # the common case: nothing to match
            if a.axes is not axes and len(a.axes):
                break
        else:
            return axes
        check_lengths([(a.name, a.axes) for a in args], f"{type(self).__name__} {self.name}",
                      self._where())
        for a in args[1:]:
            if a.axes != axes:
                axes = axes | a.axes
        return axes

    def compute_dtype(self):
        """The dtype the op computes in, the same in every backend and the reference.

        A floating-point result is computed in its own dtype, the operands converted
        first: ``reciprocal`` of an int32 is not integer division, ``-x`` of a uint8 does
        not wrap, ``sqrt`` of an int8 is not float16 arithmetic. An integer result is
        computed in the operands' promoted dtype and converted after, as NumPy does.
        """
        if self.dtype.kind in "fc" or not self.args:
            return self.dtype
        return np.result_type(*[a.dtype for a in self.args])


class UnaryElementWise(ElementWise):
    arity = 1

    def _infer_dtype(self):
        dt = self.args[0].dtype
        return dt if dt.kind in "fc" else DEFAULT_DTYPE


class BinaryElementWise(ElementWise):
    arity = 2


class Comparison(BinaryElementWise):
    """Comparisons give 1.0 where true and 0.0 where false, in the operands' float type."""

    def _infer_dtype(self):
        dt = result_dtype(self.args)
        return dt if dt.kind == "f" else DEFAULT_DTYPE

    def compute_dtype(self):
        """Operands compare in their promoted dtype (the result is only 1 or 0)."""
        return np.result_type(*[a.dtype for a in self.args])


@primitive
class Add(BinaryElementWise): """``a + b``"""
@primitive
class Subtract(BinaryElementWise): """``a - b``"""
@primitive
class Multiply(BinaryElementWise): """``a * b``"""
@primitive
class Maximum(BinaryElementWise): """``max(a, b)`` elementwise"""
@primitive
class Minimum(BinaryElementWise): """``min(a, b)`` elementwise"""


@primitive
class Divide(BinaryElementWise):
    """``a / b`` (true division)"""

    def _infer_dtype(self):
        dt = result_dtype(self.args)
        return dt if dt.kind in "fc" else DEFAULT_DTYPE


@primitive
class Power(BinaryElementWise):
    """``a ** b``"""

    def _infer_dtype(self):
        dt = result_dtype(self.args)
        return dt if dt.kind in "fc" else DEFAULT_DTYPE


@primitive
class Equal(Comparison): """``a == b``"""
@primitive
class NotEqual(Comparison): """``a != b``"""
@primitive
class Less(Comparison): """``a < b``"""
@primitive
class LessEqual(Comparison): """``a <= b``"""
@primitive
class Greater(Comparison): """``a > b``"""
@primitive
class GreaterEqual(Comparison): """``a >= b``"""
@primitive
class Negative(UnaryElementWise): """``-x``"""
@primitive
class Absolute(UnaryElementWise): """``|x|``"""
@primitive
class Sign(UnaryElementWise): """``sign(x)``: -1, 0 or 1"""
@primitive
class Square(UnaryElementWise): """``x * x``"""
@primitive
class Sqrt(UnaryElementWise): """``sqrt(x)``"""
@primitive
class Reciprocal(UnaryElementWise): """``1 / x``"""
@primitive
class Exp(UnaryElementWise): """``e ** x``"""
@primitive
class Log(UnaryElementWise): """natural logarithm"""
@primitive
class Sin(UnaryElementWise): """``sin(x)``"""
@primitive
class Cos(UnaryElementWise): """``cos(x)``"""
@primitive
class Tanh(UnaryElementWise): """``tanh(x)``"""
@primitive
class Sigmoid(UnaryElementWise): """``1 / (1 + exp(-x))``"""


@primitive
class Erf(UnaryElementWise):
    """The error function ``2/sqrt(pi) int_0^x exp(-t^2) dt`` (a semi-primitive: no
    composite of the others is accurate)."""

    attrs = ()


@primitive
class Expm1(UnaryElementWise):
    """``exp(x) - 1``, accurate near 0 (a semi-primitive, as ``exp(x) - 1`` cancels)."""

    attrs = ()


@primitive
class Softplus(UnaryElementWise):
    """``log(1 + exp(x))``, computed as ``max(x, 0) + log1p(exp(-|x|))``: accurate for
    any ``x`` (no overflow for large ``x``, no underflow to 0 for very negative ``x``);
    a semi-primitive, its derivative is ``sigmoid(x)``."""

    attrs = ()


def add(a: TensorLike, b: TensorLike) -> TensorOp: return Add(a, b)
def subtract(a: TensorLike, b: TensorLike) -> TensorOp: return Subtract(a, b)
def multiply(a: TensorLike, b: TensorLike) -> TensorOp: return Multiply(a, b)
def divide(a: TensorLike, b: TensorLike) -> TensorOp: return Divide(a, b)
def power(a: TensorLike, b: TensorLike) -> TensorOp: return Power(a, b)
def maximum(a: TensorLike, b: TensorLike) -> TensorOp: return Maximum(a, b)
def minimum(a: TensorLike, b: TensorLike) -> TensorOp: return Minimum(a, b)
def equal(a: TensorLike, b: TensorLike) -> TensorOp: return Equal(a, b)
def not_equal(a: TensorLike, b: TensorLike) -> TensorOp: return NotEqual(a, b)
def less(a: TensorLike, b: TensorLike) -> TensorOp: return Less(a, b)
def less_equal(a: TensorLike, b: TensorLike) -> TensorOp: return LessEqual(a, b)
def greater(a: TensorLike, b: TensorLike) -> TensorOp: return Greater(a, b)
def greater_equal(a: TensorLike, b: TensorLike) -> TensorOp: return GreaterEqual(a, b)
def negative(x: TensorLike) -> TensorOp: return Negative(x)
def absolute(x: TensorLike) -> TensorOp: return Absolute(x)
def sign(x: TensorLike) -> TensorOp: return Sign(x)
def square(x: TensorLike) -> TensorOp: return Square(x)
def sqrt(x: TensorLike) -> TensorOp: return Sqrt(x)
def reciprocal(x: TensorLike) -> TensorOp: return Reciprocal(x)
def exp(x: TensorLike) -> TensorOp: return Exp(x)
def log(x: TensorLike) -> TensorOp: return Log(x)
def sin(x: TensorLike) -> TensorOp: return Sin(x)
def cos(x: TensorLike) -> TensorOp: return Cos(x)
def tanh(x: TensorLike) -> TensorOp: return Tanh(x)
def erf(x: TensorLike) -> TensorOp: return Erf(x)
def expm1(x: TensorLike) -> TensorOp: return Expm1(x)
def softplus(x: TensorLike) -> TensorOp: return Softplus(x)


_ELEMENTWISE_HINTS = {
    "out": "an op computes a new tensor; write it into a Variable with be.SetItem(v, op)",
    "dtype": "the result's dtype follows the operands' (NumPy's promotion)",
}

for _f in (add, subtract, multiply, divide, power, maximum, minimum, equal, not_equal,
           less, less_equal, greater, greater_equal, negative, absolute, sign, square,
           sqrt, reciprocal, exp, log, sin, cos, tanh, erf, expm1, softplus):
    _f.__doc__ = "Elementwise " + _f.__name__ + " (operands matched by axis name)."
    globals()[_f.__name__] = keywords(_ELEMENTWISE_HINTS)(_f)


class SigmoidSchema:
    """``sigmoid(x)``: remembers the logits ``x``."""

    kind = "sigmoid"
    attrs = ("x",)

    def __init__(self, x):
        self.x = x

    def matches(self, y):
        """Whether ``y`` is ``sigmoid(x)``."""
        return isinstance(y, Sigmoid) and y.args[0] is self.x


@keywords()
def sigmoid(x: TensorLike) -> TensorOp:
    """The logistic function; the result carries a schema that
    :func:`cross_entropy_binary` uses to compute from the logits."""
    y = Sigmoid(x)
    y.schema = SigmoidSchema(as_op(x))
    return y


@keywords()
def safelog(x: TensorLike, limit: float = -50.0) -> TensorOp:
    """``log(max(x, exp(limit)))``: a logarithm that never returns ``-inf``. Where
    ``exp(limit)`` is below the smallest normal number of ``x``'s dtype (float16), the
    floor is that number instead (``exp(-50)`` would round to 0 there)."""
    x = as_op(x)
    floor = float(np.exp(limit))
    if x.dtype.kind == "f":
        floor = builtins.max(floor, float(np.finfo(x.dtype).tiny))
    return Log(Maximum(x, floor))


OPERATORS.update(add=Add, subtract=Subtract, multiply=Multiply, divide=Divide, power=Power,
                 negative=Negative, absolute=Absolute, less=Less, less_equal=LessEqual,
                 greater=Greater, greater_equal=GreaterEqual)


# --- reference values --------------------------------------------------------------------

NP_UFUNCS.update({
    Add: np.add, Subtract: np.subtract, Multiply: np.multiply, Divide: np.true_divide,
    Power: np.power, Maximum: np.maximum, Minimum: np.minimum, Equal: np.equal,
    NotEqual: np.not_equal, Less: np.less, LessEqual: np.less_equal, Greater: np.greater,
    GreaterEqual: np.greater_equal, Negative: np.negative, Absolute: np.absolute,
    Sign: np.sign, Square: np.square, Sqrt: np.sqrt, Reciprocal: np.reciprocal,
    Exp: np.exp, Log: np.log, Sin: np.sin, Cos: np.cos, Tanh: np.tanh, Expm1: np.expm1,
})
ELEMENTWISE_FUNCS.update(NP_UFUNCS)
ELEMENTWISE_FUNCS[Sigmoid] = lambda x: np.exp(-np.logaddexp(0, -x))
ELEMENTWISE_FUNCS[Erf] = special.erf
ELEMENTWISE_FUNCS[Softplus] = lambda x: np.logaddexp(0.0, x)


@evaluator(ElementWise)
def _elementwise_value(op, *vals):
    fn = ELEMENTWISE_FUNCS[type(op)]
    # Operands are converted to the op's compute dtype first, as in generated code; the
    # result then takes the op's dtype (e.g. 1.0 / 0.0 for a comparison).
    ct = op.compute_dtype()
    args = [align(v if ct is None else np.asarray(v).astype(ct, copy=False), a.axes,
                  op.axes) for v, a in zip(vals, op.args)]
    with np.errstate(all="ignore"):
        r = fn(*args)
    return np.broadcast_to(r, op.axes.shape).astype(op.dtype)


# --- derivatives ---------------------------------------------------------------------------

def log_base(op):
    """``log(a)`` for the power ``op = a ** b``, but 0 where ``a ** b`` is 0: the
    factor of ``d(a ** b) / db = log(a) a ** b`` whose limit at ``a = 0 < b`` is 0
    (``log(0) * 0`` would be NaN)."""
    a = op.args[0]
    return Log(a + Equal(op, 0.0))


R, F = adjoint_rule, forward_rule


@R(Add)
def _add(op, d): return d, d
@F(Add)
def _add_t(op, ts): return terms((ts[0], lambda t: t), (ts[1], lambda t: t))
@R(Subtract)
def _sub(op, d): return d, -d
@F(Subtract)
def _sub_t(op, ts): return terms((ts[0], lambda t: t), (ts[1], lambda t: -t))
@R(Multiply)
def _mul(op, d): return d * op.args[1], d * op.args[0]
@F(Multiply)
def _mul_t(op, ts):
    a, b = op.args
    return terms((ts[0], lambda t: t * b), (ts[1], lambda t: a * t))
@R(Divide)
def _div(op, d): return d / op.args[1], -d * op / op.args[1]
@F(Divide)
def _div_t(op, ts):  # d(a/b) = da/b - (a/b) db/b
    b = op.args[1]
    return terms((ts[0], lambda t: t / b), (ts[1], lambda t: -(t * op) / b))
@R(Power)
def _pow(op, d):
    a, b = op.args
    db = None if isinstance(b, Constant) else d * log_base(op) * op  # x ** 2: none
    return d * b * a ** (b - 1), db
@F(Power)
def _pow_t(op, ts):  # d(a**b) = b a**(b-1) da + log(a) a**b db
    a, b = op.args
    return terms((ts[0], lambda t: t * b * a ** (b - 1)),
                 (ts[1], lambda t: t * log_base(op) * op))
@R(Maximum)
def _maximum(op, d):
    a, b = op.args
    if isinstance(b, Constant):
        # max(a, c), as in ReLU: take the mask from the result, so the input need not be
        # kept for the backward pass (the derivative at a == c is then 0).
        return d * (op > b), None
    return d * (a >= b), d * (a < b)
@F(Maximum)
def _maximum_t(op, ts):
    a, b = op.args
    if isinstance(b, Constant):  # as the reverse rule: the mask from the result
        return terms((ts[0], lambda t: t * (op > b)))
    return terms((ts[0], lambda t: t * (a >= b)), (ts[1], lambda t: t * (a < b)))
@R(Minimum)
def _minimum(op, d):
    a, b = op.args
    if isinstance(b, Constant):  # min(a, c): the mask from the result (see above)
        return d * (op < b), None
    return d * (a <= b), d * (a > b)
@F(Minimum)
def _minimum_t(op, ts):
    a, b = op.args
    if isinstance(b, Constant):
        return terms((ts[0], lambda t: t * (op < b)))
    return terms((ts[0], lambda t: t * (a <= b)), (ts[1], lambda t: t * (a > b)))


R(Comparison, Sign)(zero_adjoint)
F(Comparison, Sign)(zero_tangent)


@R(Negative)
def _neg(op, d): return (-d,)
@F(Negative)
def _neg_t(op, ts): return -ts[0]
@R(Log)
def _log(op, d): return (d / op.args[0],)
@F(Log)
def _log_t(op, ts): return ts[0] / op.args[0]


# The other unary functions: ``d f(x) = f'(x) dx``, one slope for both directions.
_SLOPES = {
    Absolute: lambda op: Sign(op.args[0]),
    Square: lambda op: 2.0 * op.args[0],
    Sqrt: lambda op: 0.5 / op,
    Reciprocal: lambda op: -(op * op),
    Exp: lambda op: op,
    Sin: lambda op: Cos(op.args[0]),
    Cos: lambda op: -Sin(op.args[0]),
    Tanh: lambda op: 1.0 - op * op,
    Sigmoid: lambda op: op * (1.0 - op),
    Erf: lambda op: float(2 / math.sqrt(math.pi)) * Exp(-(op.args[0] * op.args[0])),
    Expm1: lambda op: Exp(op.args[0]),  # not op + 1: 0 once op rounds to -1
    Softplus: lambda op: Sigmoid(op.args[0]),
}


def _slope_adjoint(slope):
    def rule(op, d):
        return (d * slope(op),)
    return rule


for _cls, _slope in _SLOPES.items():
    R(_cls)(_slope_adjoint(_slope))
    F(_cls)(scaled(_slope))
