"""geon: an axis-aware op-graph compiler.

Use it as ``import geon as be``: build ops over named axes, differentiate them with
:func:`deriv`, and run them with a transformer (:func:`make_transformer`).
"""

__version__ = "0.1.0"

# Before anything imports NumPy: let OpenBLAS use AVX-512 kernels on CPUs it misjudges
# (never overriding OPENBLAS_CORETYPE; see doc/performance.rst).
from geon._blas import select_coretype as _select_coretype  # noqa: E402

_select_coretype()

from geon.errors import (ArgumentError, AxisIndexError, AxisMismatchError,  # noqa: E402
                         CheckpointError, FeedError, GeonError, GeonWarning,
                         IndexOutOfRangeError, InvalidValueError, LoweringError,
                         NumericsError,
                         TruthValueError,
                         UnknownTransformerError)
from geon.op_graph.axes import Axes, Axis, FlattenedAxis, symbolic_axis  # noqa: E402
from geon.op_graph.symbols import Sym, Symbol  # noqa: E402
# (installs the reference evaluator's binding of symbolic lengths)
from geon.op_graph import specialize as _specialize  # noqa: E402,F401
from geon.op_graph.op_graph import (  # noqa: E402
    Constant, Invalid, Op, Placeholder, SetItem, TensorOp, Variable, VoidOp, ComputationOp,
    absolute, add, argmax, argmin, axes_with_order, broadcast, cast_axes, constant, cos,
    divide, dot, equal, erf, exp, expm1, flatten, greater, greater_equal, less,
    less_equal, log, maximum, mean, minimum, multiply, negative, not_equal, one_hot,
    placeholder, power, prod, reciprocal, safelog, sigmoid, sign, sin, slice_along_axis,
    snap, softplus, sqrt, square, stop_gradient, subtract, tanh, tensor_size, unflatten, variance, split,
    max_argmax, MultiOutput, Output, value_of)
# be.sum, be.max and be.min are left out of __all__ (below): ``x as x`` makes them
# explicit re-exports all the same, which type checkers need to see them.
from geon.op_graph.op_graph import max as max, min as min, sum as sum  # noqa: E402
from geon.op_graph.autodiff import deriv, gradients  # noqa: E402
from geon.op_graph.forward import hvp, jvp  # noqa: E402
from geon.op_graph.jacobian import jacobian, jacobian_axes  # noqa: E402
from geon.op_graph.user_ops import define_op, elementwise_op  # noqa: E402
from geon.op_graph.schemas import (cross_entropy_binary, cross_entropy_multi,  # noqa: E402
                                   softmax)
from geon.op_graph.nn_ops import (  # noqa: E402
    argsort, clip, concat, cumsum, elu, gather, gelu, hard_sigmoid, leaky_relu,
    log_softmax, logsumexp, pad, relu, scatter_add, select, selu, silu, sort,
    sort_with_indices, stack, tile, topk, where)
from geon.op_graph.domains import Domain, DomainError, set_domain  # noqa: E402
from geon.op_graph.reference import evaluate  # noqa: E402
from geon.op_graph.control import scan  # noqa: E402
from geon.op_graph.control_ops import cond, while_loop  # noqa: E402
from geon.op_graph.collectives import allreduce, broadcast_from  # noqa: E402
from geon.op_graph.conv import (avg_pool, conv, conv_transpose, global_avg_pool,  # noqa: E402
                                max_pool)
from geon.op_graph.random import bernoulli, dropout, normal, uniform  # noqa: E402
from geon.op_graph.normalization import batch_norm, layer_norm  # noqa: E402
from geon.transformers import (Computation, NumPyTransformer, Transformer,  # noqa: E402
                               available_transformers, make_transformer,
                               register_transformer)
from geon.errors import SerializationError  # noqa: E402
from geon.op_graph.serialize import (LoadedGraph, deserialize, deserialize_graph,  # noqa: E402
                                     serialize)
from geon.op_graph.printing import graph_after, graph_dot, graph_text  # noqa: E402
from geon.op_graph.run import Runner, run  # noqa: E402
# Op families: NumPy-style (``be.np``) and Simple-Axes (``be.simple``) tensors, the
# coercions between families, and the plugin API of transformers.
from geon.op_graph import np_ops as np  # noqa: E402
from geon.op_graph.formats import round_to_format  # noqa: E402
from geon.op_graph import simple_axes as simple  # noqa: E402
from geon.op_graph.coercion import FamilyError  # noqa: E402
from geon.transformers.base import (insert_passes, pass_named, transformer_ops,  # noqa: E402
                                    transformers_with)
from geon.transformers.native import load_backend  # noqa: E402

#: The names ``from geon import *`` binds: every public name except the modules
#: (``be.np``, ``be.simple``) and the reductions named like Python builtins (``be.sum``,
#: ``be.max``, ``be.min``), which stay reachable as attributes but must not shadow the
#: builtins. tests/test_api.py checks this list against the namespace.
__all__ = [
    "ArgumentError", "Axes", "Axis", "AxisIndexError", "AxisMismatchError",
    "CheckpointError", "Computation", "ComputationOp", "Constant", "Domain", "DomainError",
    "FamilyError",
    "FeedError", "FlattenedAxis", "GeonError", "GeonWarning", "IndexOutOfRangeError",
    "Invalid", "InvalidValueError", "LoadedGraph", "LoweringError", "MultiOutput",
    "NumPyTransformer", "NumericsError", "Op", "Output", "Placeholder", "Runner", "SerializationError",
    "SetItem", "Sym", "Symbol", "TensorOp", "Transformer", "TruthValueError",
    "UnknownTransformerError",
    "Variable", "VoidOp", "absolute", "add", "allreduce", "argmax", "argmin", "argsort",
    "available_transformers", "avg_pool", "axes_with_order", "batch_norm", "bernoulli",
    "broadcast", "broadcast_from", "cast_axes", "clip", "concat", "cond", "constant", "conv",
    "conv_transpose", "cos", "cross_entropy_binary", "cross_entropy_multi", "cumsum",
    "define_op", "deriv", "deserialize", "deserialize_graph", "divide", "dot",
    "dropout", "elementwise_op", "elu", "equal", "erf", "evaluate", "exp", "expm1",
    "flatten", "gather", "gelu", "global_avg_pool", "gradients", "graph_after",
    "graph_dot", "graph_text", "greater", "greater_equal", "hard_sigmoid", "hvp",
    "insert_passes", "jacobian", "jacobian_axes", "jvp", "layer_norm", "leaky_relu",
    "less", "less_equal", "load_backend", "log", "log_softmax", "logsumexp", "make_transformer",
    "max_argmax", "max_pool", "maximum", "mean", "minimum", "multiply", "negative",
    "normal", "not_equal", "one_hot", "pad", "pass_named", "placeholder", "power",
    "prod", "reciprocal", "register_transformer", "relu", "round_to_format", "run", "safelog",
    "scan", "scatter_add", "select", "selu", "serialize", "set_domain", "sigmoid", "sign", "silu",
    "sin",
    "slice_along_axis", "snap", "softmax", "softplus", "sort", "sort_with_indices",
    "split", "sqrt", "square", "stack", "stop_gradient", "subtract", "symbolic_axis",
    "tanh",
    "tensor_size", "tile", "topk", "transformer_ops", "transformers_with", "unflatten",
    "uniform", "value_of", "variance", "where", "while_loop"
]
