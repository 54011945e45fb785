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
from geon.op_graph import core, core_ops, elementwise, reductions, shaping
from geon.op_graph.core import *  # noqa: F401,F403
from geon.op_graph.core_ops import *  # noqa: F401,F403
from geon.op_graph.elementwise import *  # noqa: F401,F403
from geon.op_graph.reductions import *  # noqa: F401,F403
from geon.op_graph.shaping import *  # noqa: F401,F403

#: Every name above, for type checkers (a name a module imports is its own export only
#: when listed here): the modules' own ``__all__`` lists (``og.TensorOp`` is the class
#: :mod:`~geon.op_graph.core` defines), and the names imported one by one. The private
#: helpers are listed too; other modules use them as ``og._fmt`` and so on.
__all__ = [
    "_accepted", "ArgumentError", "as_axes", "Axes", "AxesLike", "Axis",
    "AxisIndexError", "AxisMismatchError", "check_lengths", "declared_primitives",
    "_DOT_HINT", "_DOT_HINTS", "FeedError", "FlattenedAxis", "GeonError",
    "InvalidValueError", "keywords", "NO_AXES", "Node", "nodes", "note_users",
    "OP_KEYWORDS", "OrderedSet", "primitive", "_REDUCE_HINTS", "TruthValueError",
    "_unknown_keywords", "user_location",
]
__all__ += core.__all__
__all__ += core_ops.__all__
__all__ += elementwise.__all__
__all__ += reductions.__all__
__all__ += shaping.__all__
