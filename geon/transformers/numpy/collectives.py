"""NumPy code for the collectives (:mod:`geon.op_graph.collectives`): allreduce,
broadcast and the flat concatenation of their buffers."""

import numpy as np

from geon.op_graph import collectives as coll
from geon.transformers.numpy.code_table import NUMPY_GLOBALS, numpy_code


@numpy_code(coll.AllReduce)
def _allreduce(op, out, args):
    # on the planned buffers: ``out`` is ``x`` when the plan works in place
    return [f"_allreduce({args[0]}, {out}, {op.reduce == 'mean'})"]


@numpy_code(coll.BroadcastFrom)
def _broadcast_from(op, out, args):
    return [f"_broadcast_from({args[0]}, {out}, {op.root})"]


@numpy_code(coll.FlatConcat)
def _flat_concat(op, out, args):
    flat = ", ".join(f"{a}.reshape(-1)" for a in args)
    return [f"np.concatenate(({flat},), out={out})"]


def _run_allreduce(x, out, mean):
    coll.collectives().allreduce(x, out, mean)


def _run_broadcast(x, out, root):
    if out is not x:
        np.copyto(out, x)
    coll.collectives().broadcast(out, root)


# looked up at each call: geon.distributed.init() may install MPI after compiling
NUMPY_GLOBALS.update(_allreduce=_run_allreduce, _broadcast_from=_run_broadcast)
