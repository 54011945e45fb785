"""The core of the op graph and the Axes family of tensor operations, in one namespace.

``from geon.op_graph import op_graph as og`` gives ``og.TensorOp``, ``og.Variable``,
``og.Add``, ``og.sum`` ...: the names of the modules below, which define them (each op
with its derivatives and reference value; see doc/architecture.rst):

- :mod:`~geon.op_graph.core`: ``Op``, ``TensorOp``, storage ops, weak constants, the
  graph walk;
- :mod:`~geon.op_graph.keywords`: the keyword checks of op-building functions;
- :mod:`~geon.op_graph.core_ops`: the ops the engines build (``Sum``, ``Broadcast``,
  ``AxesWithOrder``, ``StopGradient``, ``MultiOutput`` and ``Output``);
- :mod:`~geon.op_graph.elementwise`, :mod:`~geon.op_graph.reductions` (with ``Dot``),
  :mod:`~geon.op_graph.shaping`: the rest of the Axes family.
"""

from geon.errors import (ArgumentError, AxisIndexError, AxisMismatchError,  # noqa: F401
                         FeedError, GeonError, InvalidValueError, TruthValueError)
from geon.op_graph import nodes  # noqa: F401
from geon.op_graph.axes import (NO_AXES, Axes, AxesLike, Axis, FlattenedAxis,  # noqa: F401
                                as_axes, check_lengths, note_users)
from geon.op_graph.nodes import Node, OrderedSet, user_location  # noqa: F401
from geon.op_graph.tables import declared_primitives, primitive  # noqa: F401
from geon.op_graph.keywords import (  # noqa: F401
    keywords, OP_KEYWORDS, _accepted, _DOT_HINT, _DOT_HINTS, _REDUCE_HINTS,
    _unknown_keywords)
from geon.op_graph.core import (  # noqa: F401
    as_op, as_op_list, AssignableTensorOp, ComputationOp, constant, Constant,
    DEFAULT_DTYPE, DTypeLike, FAMILY_HOOKS, Invalid, Op, placeholder, Placeholder,
    require_valid, result_dtype, SetItem, snap, TensorLike, TensorOp, toposort,
    Variable, VoidOp, weak_number, _arrays_as_constants, _family_hook, _fmt, _Invalid,
    _mismatch, _short, _weak_constant, _WEAK_NUMBERS)
from geon.op_graph.core_ops import (  # noqa: F401
    axes_with_order, AxesWithOrder, Broadcast, broadcast, cast_axes, CastAxes,
    MultiOutput, Output, Reduction, reduction_split, stop_gradient, StopGradient, Sum)
from geon.op_graph.elementwise import (  # noqa: F401
    Absolute, absolute, add, Add, BinaryElementWise, Comparison, cos, Cos, Divide,
    divide, ElementWise, equal, Equal, Erf, erf, Exp, exp, expm1, Expm1, Greater,
    greater, greater_equal, GreaterEqual, less, Less, less_equal, LessEqual, Log, log,
    maximum, Maximum, minimum, Minimum, multiply, Multiply, negative, Negative,
    not_equal, NotEqual, Power, power, reciprocal, Reciprocal, safelog, Sigmoid,
    sigmoid, SigmoidSchema, Sign, sign, sin, Sin, Softplus, softplus, sqrt, Sqrt,
    Square, square, subtract, Subtract, tanh, Tanh, UnaryElementWise,
    _ELEMENTWISE_HINTS)
from geon.op_graph.reductions import (  # noqa: F401
    argmax, ArgMax, ArgMin, argmin, Dot, dot, max, Max, max_argmax, MaxArgMax, mean,
    min, Min, prod, Prod, sum, tensor_size, TensorSize, variance, _DOT_SPLIT_HINT)
from geon.op_graph.shaping import (  # noqa: F401
    Flatten, flatten, one_hot, OneHot, Slice, slice_along_axis, split, Split, Unflatten,
    unflatten, value_of)

#: Every name above, for type checkers (a name a module imports is its own export only
#: when listed here): ``og.TensorOp`` is the class :mod:`~geon.op_graph.core` defines.
#: The private helpers are listed too; other modules use them as ``og._fmt`` and so on.
__all__ = [
    "Absolute", "absolute", "Add", "add", "ArgMax", "argmax", "ArgMin", "argmin",
    "ArgumentError", "as_axes", "as_op", "as_op_list", "AssignableTensorOp", "Axes",
    "axes_with_order", "AxesLike", "AxesWithOrder", "Axis", "AxisIndexError",
    "AxisMismatchError", "BinaryElementWise", "Broadcast", "broadcast", "cast_axes",
    "CastAxes", "check_lengths", "Comparison", "ComputationOp", "Constant", "constant",
    "Cos", "cos", "declared_primitives", "DEFAULT_DTYPE", "Divide", "divide", "Dot",
    "dot", "DTypeLike", "ElementWise", "Equal", "equal", "Erf", "erf", "Exp", "exp",
    "Expm1", "expm1", "FAMILY_HOOKS", "FeedError", "Flatten", "flatten",
    "FlattenedAxis", "GeonError", "Greater", "greater", "greater_equal", "GreaterEqual",
    "Invalid", "InvalidValueError", "keywords", "Less", "less", "less_equal",
    "LessEqual", "Log", "log", "Max", "max", "max_argmax", "MaxArgMax", "Maximum",
    "maximum", "mean", "Min", "min", "Minimum", "minimum", "MultiOutput", "Multiply",
    "multiply", "Negative", "negative", "NO_AXES", "Node", "nodes", "not_equal",
    "note_users", "NotEqual", "one_hot", "OneHot", "Op", "OP_KEYWORDS", "OrderedSet",
    "Output", "Placeholder", "placeholder", "Power", "power", "primitive", "Prod",
    "prod", "Reciprocal", "reciprocal", "Reduction", "reduction_split", "require_valid",
    "result_dtype", "safelog", "SetItem", "Sigmoid", "sigmoid", "SigmoidSchema", "Sign",
    "sign", "Sin", "sin", "Slice", "slice_along_axis", "snap", "Softplus", "softplus",
    "Split", "split", "Sqrt", "sqrt", "Square", "square", "stop_gradient",
    "StopGradient", "Subtract", "subtract", "Sum", "sum", "Tanh", "tanh", "tensor_size",
    "TensorLike", "TensorOp", "TensorSize", "toposort", "TruthValueError",
    "UnaryElementWise", "Unflatten", "unflatten", "user_location", "value_of",
    "Variable", "variance", "VoidOp", "weak_number", "_accepted",
    "_arrays_as_constants", "_DOT_HINT", "_DOT_HINTS", "_DOT_SPLIT_HINT",
    "_ELEMENTWISE_HINTS", "_family_hook", "_fmt", "_Invalid", "_mismatch",
    "_REDUCE_HINTS", "_short", "_unknown_keywords", "_weak_constant", "_WEAK_NUMBERS",
]
