"""Collective ops across the processes of a data-parallel job: ``allreduce`` and
``broadcast_from``.

What they mean lives here; how they communicate is a *collectives backend*, an object
with ``allreduce(x, out, mean)`` and ``broadcast(buf, root)`` working on NumPy arrays
(``out`` may be ``x``: in place). Without one installed the job is a single process:
an allreduce of one rank is its own value and a broadcast changes nothing.
:func:`geon.distributed.init` installs the MPI backend (``mpi4py``); the op graph never
imports MPI.

Derivatives: ``allreduce(x, "sum")`` is linear and its Jacobian is the same on every
rank (each rank's output is the sum of every rank's input), so its adjoint is
``allreduce(delta, "sum")``; likewise ``"mean"``'s is ``allreduce(delta, "mean")``.
``broadcast_from`` has no derivative (it is used to make initial values identical).
"""

import numpy as np

from geon.errors import ArgumentError
from geon.op_graph import op_graph as og
from geon.op_graph.autodiff import adjoint_rule
from geon.op_graph.axes import FlattenedAxis
from geon.op_graph.forward import forward_rule
from geon.op_graph.reference import EVALUATORS


class SingleProcess:
    """The collectives of a job of one process."""

    rank, size = 0, 1

    def allreduce(self, x, out, mean):
        """``out[...] = x`` (the sum, and the mean, over one rank)."""
        if out is not x:
            np.copyto(out, x)

    def broadcast(self, buf, root):
        """Nothing to do: the root is this process."""

    def barrier(self):
        """Nothing to wait for."""


_BACKEND = [SingleProcess()]


def collectives():
    """The installed collectives backend (:class:`SingleProcess` unless one was set)."""
    return _BACKEND[0]


def set_collectives(backend):
    """Install ``backend`` (``None``: back to a single process); returns the old one."""
    old = _BACKEND[0]
    _BACKEND[0] = backend if backend is not None else SingleProcess()
    return old


class AllReduce(og.ComputationOp):
    """``x`` summed (``reduce="sum"``) or averaged (``"mean"``) over every rank; every
    rank gets the result. The number of ranks is read when the op runs, never baked
    into the graph."""

    attrs = ("reduce", "dtype")
    arity = 1
    #: the backend may write the result over the arg's buffer (MPI_IN_PLACE)
    in_place = True
    #: its value comes from other processes: never folded at compile time
    communicates = True

    def __init__(self, x, reduce="sum", **kwargs):
        if reduce not in ("sum", "mean"):
            raise ArgumentError(f"allreduce: reduce must be 'sum' or 'mean', not {reduce!r}")
        self.reduce = reduce
        super().__init__(x, **kwargs)

    def _infer_axes(self):
        return self.args[0].axes

    def _infer_dtype(self):
        return self.args[0].dtype


class BroadcastFrom(og.ComputationOp):
    """Rank ``root``'s value of ``x``, on every rank."""

    attrs = ("root", "dtype")
    arity = 1
    in_place = True
    #: its value comes from other processes: never folded at compile time
    communicates = True

    def __init__(self, x, root=0, **kwargs):
        self.root = int(root)
        super().__init__(x, **kwargs)

    def _infer_axes(self):
        return self.args[0].axes

    def _infer_dtype(self):
        return self.args[0].dtype


def allreduce(x: og.TensorLike, reduce: str = "sum") -> og.TensorOp:
    """``x`` summed or averaged (``reduce="mean"``) over the ranks (see ``AllReduce``)."""
    return AllReduce(og.as_op(x), reduce=reduce)


def broadcast_from(x: og.TensorLike, root: int = 0) -> og.TensorOp:
    """Rank ``root``'s ``x`` on every rank (see ``BroadcastFrom``)."""
    return BroadcastFrom(og.as_op(x), root=root)


@EVALUATORS.register(AllReduce)
def _allreduce_value(op, v):
    out = np.array(v, dtype=op.dtype, order="C")
    collectives().allreduce(out, out, op.reduce == "mean")
    return out


@EVALUATORS.register(BroadcastFrom)
def _broadcast_value(op, v):
    out = np.array(v, dtype=op.dtype, order="C")
    collectives().broadcast(out, op.root)
    return out


@adjoint_rule(AllReduce)
def _allreduce_adjoint(op, delta):  # d/dx_r sum_s y_s . delta_s = allreduce(delta)
    return (AllReduce(delta, reduce=op.reduce),)


@forward_rule(AllReduce)
def _allreduce_forward(op, tangents):  # linear
    return AllReduce(tangents[0], reduce=op.reduce)


class FlatConcat(og.ComputationOp):
    """The args, each flattened in its own axes' order (row-major), laid end to end
    along ``axis`` (of their total size): the buffer a bucketed collective works on.
    All args have one dtype."""

    attrs = ("axis", "dtype")

    def __init__(self, *args, axis, **kwargs):
        self.axis = axis
        super().__init__(*args, **kwargs)
        total = sum(a.axes.size for a in self.args)
        if axis.length != total or len({a.dtype for a in self.args}) != 1:
            raise ArgumentError(
                f"FlatConcat: axis {axis!r} must have the args' total size {total}, and "
                f"the args one dtype (got {sorted({a.dtype.name for a in self.args})})"
                f"{self._where()}")

    def _infer_axes(self):
        return og.as_axes([self.axis])

    def _infer_dtype(self):
        return self.args[0].dtype


def flat_split(flat, like):
    """The parts of ``flat`` (one axis, as :class:`FlatConcat` made it) with the axes of
    the tensors ``like``: slices of it, in order (views where the layout allows)."""
    axis, = flat.axes
    parts, start = [], 0
    for k, t in enumerate(like):
        n = t.axes.size
        if not len(t.axes):
            parts.append(og.slice_along_axis(flat, axis, start))
        else:
            piece = og.slice_along_axis(flat, axis, slice(start, start + n),
                                        og.Axis(n, f"{axis.name}[{k}]"))
            if len(t.axes) == 1:
                parts.append(og.cast_axes(piece, t.axes))
            else:
                parts.append(og.unflatten(og.cast_axes(piece, [FlattenedAxis(t.axes)])))
        start += n
    return parts


@EVALUATORS.register(FlatConcat)
def _flat_concat_value(op, *vs):
    return np.concatenate([np.asarray(v, op.dtype).reshape(-1) for v in vs])


@adjoint_rule(FlatConcat)
def _flat_concat_adjoint(op, delta):  # each arg's range of delta, in its axes
    return tuple(flat_split(delta, op.args))


@forward_rule(FlatConcat)
def _flat_concat_forward(op, tangents):  # linear
    return FlatConcat(*[og.Constant(0, axes=a.axes, dtype=op.dtype) if t is None else t
                        for a, t in zip(op.args, tangents)], axis=op.axis)
