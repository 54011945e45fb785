"""The torch export's rules for control flow (:mod:`geon.op_graph.control`,
:mod:`geon.op_graph.control_ops`): a scan is a Python loop over its axis in the module's
``forward``, a cond runs the branch its predicate picks, a while loop loops while its
predicate holds. Each body, branch or predicate is exported once as a module of its own
(:func:`~geon.transformers.torch.export.to_torch` of the subgraph from its stand-ins):
closures are inputs of the op, so these modules hold no parameters, and the gradients of
the outer module's parameters flow through them.
"""

import weakref

import torch

from geon.op_graph.control import Scan
from geon.op_graph.control_ops import Cond, WhileLoop
from geon.transformers.torch.binding import PREPARE_SYMBOLIC, bound, bound_attrs, shape_of
from geon.transformers.torch.export import to_torch, torch_dtype, torch_op

_MODULES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # subgraph -> module


def _module(sub):
    """The exported module of a body, branch or predicate (made once)."""
    m = _MODULES.get(sub)
    if m is None:
        m = _MODULES[sub] = to_torch(list(sub.results), *sub.inputs, output_order="graph")
    return m


@torch_op(Scan)
def _scan(op, *args):
    nc, nx, _, ny = op.counts
    body = _module(op.body)
    carries = list(args[:nc])
    xs = [x.movedim(x_op.axes.index(op.axis.name), 0)
          for x, x_op in zip(args[nc:nc + nx], op.args[nc:nc + nx])]
    closures = list(args[nc + nx:])
    T = bound(op.axis.length)  # a symbolic length: its value in this call
    ys, history = [None] * T, [None] * T
    for t in (range(T - 1, -1, -1) if op.reverse else range(T)):
        history[t] = carries
        out = body(*carries, *[x[t] for x in xs], *closures)
        carries, ys[t] = list(out[:nc]), list(out[nc:])
    stacked = []
    for k, per_step in [(j, [y[j] for y in ys]) for j in range(ny)] + \
            [(ny + j, [h[j] for h in history]) for j in range(nc)]:
        out_op = op.outputs[nc + k]
        stacked.append(torch.stack(per_step) if T else
                       torch.zeros(shape_of(out_op), dtype=torch_dtype(out_op.dtype)))
    return tuple(carries) + tuple(stacked)


bound_attrs(Scan, names=("axis",))  # its length, read through bound() above
# In a module with symbolic lengths, the bodies are exported with it (see export.py).
PREPARE_SYMBOLIC[Scan] = lambda op: _module(op.body)
PREPARE_SYMBOLIC[Cond] = lambda op: [_module(b) for b in op.branches]
PREPARE_SYMBOLIC[WhileLoop] = lambda op: (_module(op.pred), _module(op.body))


@torch_op(Cond)
def _cond(op, pred, *args):
    # nonzero or NaN picks the first branch, as geon's cond
    return tuple(_module(op.branches[0 if bool(pred != 0) else 1])(*args))


@torch_op(WhileLoop)
def _while_loop(op, *args):
    nc = op.n_carries
    carries, closures = list(args[:nc]), list(args[nc:])
    pred, body = _module(op.pred), _module(op.body)
    steps = 0
    while (op.max_steps is None or steps < op.max_steps) and \
            bool(pred(*carries, *closures)[0] != 0):
        carries = list(body(*carries, *closures))
        steps += 1
    return tuple(carries)
