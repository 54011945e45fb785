"""The reference semantics: a direct NumPy evaluation of any op graph.

Each op class has an entry in :data:`EVALUATORS`: ``fn(op, *arg_values) -> array`` with
the op's axes in the op's order. It serves as the oracle that transformed, optimized and
GPU results are tested against, and as the constant folder of the simplification pass.
It favours clarity over speed.

This module is the engine only: every op module registers its evaluators into
:data:`EVALUATORS` (``geon.op_graph.tables``) where it defines its classes, and this
module imports none of them.
"""

from typing import Any, Mapping, MutableMapping, Optional, Sequence, Union

import numpy as np

from geon.errors import FeedError, GeonError
from geon.op_graph.core import (AssignableTensorOp, Constant, Op, Placeholder, SetItem,
                                Variable, VoidOp, as_op_list, snap)
from geon.op_graph.autodiff import find_rule
from geon.op_graph.ordering import ASSIGN_CLASSES, schedule
from geon.op_graph.special import align, op_site, sigmoid_ce  # noqa: F401
from geon.op_graph.tables import (ELEMENTWISE_FUNCS, EVALUATORS, NP_UFUNCS,  # noqa: F401
                                  evaluator)

__all__ = ["ELEMENTWISE_FUNCS", "EVALUATORS", "NP_UFUNCS", "align", "evaluate",
           "evaluator", "op_site", "sigmoid_ce"]


#: ``[fn(ops, feeds) -> (ops, feeds)]``: copies of ``ops`` and ``feeds`` with the
#: symbolic lengths bound by the feeds' shapes (installed by
#: :mod:`geon.op_graph.specialize`, which needs the op classes this engine does not
#: import).
SPECIALIZE: list = []


def evaluate(results: Union[Op, Sequence[Op]],
             feeds: Optional[Mapping[Op, Any]] = None,
             state: Optional[MutableMapping[Op, Any]] = None) -> Any:
    """Evaluate ``results`` (an op or a list of ops) directly with NumPy.

    ``feeds`` maps placeholders to arrays; ``state`` maps Variables to arrays and is
    updated by assignments (variables missing from it start at their initial value).
    Returns an array, or a list for a list (``None`` for void ops).
    """
    ops, single = as_op_list(results, "evaluate: results")
    ops = [snap(r) for r in ops]
    feeds = dict(feeds or {})
    if SPECIALIZE and any(isinstance(p, Placeholder) and p.axes.is_symbolic
                          for p in feeds):
        # symbolic lengths: a copy of the graph with the feeds' binding
        ops, bound = SPECIALIZE[0](ops, feeds)
        feeds = dict(bound)
    state = state if state is not None else {}
    values: dict[Any, Any] = {}

    def value(op):
        if isinstance(op, Placeholder):
            if op not in feeds:
                raise FeedError(f"no value fed for placeholder {op.name} ({op.axes!r})")
            return np.asarray(feeds[op], dtype=op.dtype).reshape(op.axes.shape)
        if isinstance(op, Variable):
            if op not in state:
                state[op] = op.initial_array()
            return state[op]
        if isinstance(op, Constant):
            return op.array()
        return values[op]

    for op in schedule(ops, strict=False):  # views here are snapshots
        if isinstance(op, AssignableTensorOp):
            continue
        if isinstance(op, ASSIGN_CLASSES):
            target, v = op.args
            if isinstance(op, SetItem):
                arr = np.broadcast_to(align(value(v), v.axes, target.axes), target.shape)
            else:  # the primitive reads by position
                arr = np.reshape(value(v), target.shape)
            arr = np.array(arr, dtype=target.dtype)
            if isinstance(target, Placeholder):
                feeds[target] = arr
            else:
                state[target] = arr
            continue
        fn = find_rule(EVALUATORS, op)
        if fn is None:
            raise GeonError(f"no reference evaluator for {type(op).__name__}")
        values[op] = fn(op, *[value(a) for a in op.args])
    out = [None if isinstance(r, VoidOp) else np.array(value(r)) for r in ops]
    return out[0] if single else out
