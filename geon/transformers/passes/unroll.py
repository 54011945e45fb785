"""Unrolling of :class:`~geon.op_graph.control.Scan` ops, for a transformer without a
loop primitive (a ``Scan`` outside its base set).

Each step becomes one copy of the scan's body whose stand-ins are the carries leaving
the previous step, the slices of the sequences at the step's index and the closed-over
ops; the scan's outputs become the last step's carries and the stacks (the scanned axis
first) of every step's ``y_t`` and of the carries entering every step. The graph then
grows with the axis's length, as a frontend's unrolled loop would; the values are those
of the loop. Scans inside a body are unrolled in their turn.
"""

from geon.errors import ArgumentError
from geon.op_graph import op_graph as og
from geon.op_graph.control import Scan
from geon.op_graph.nn_ops import stack
from geon.op_graph.nodes import rewriting
from geon.op_graph.params import clone_graph
from geon.op_graph.shaping import slice_along_axis
from geon.op_graph.symbols import Sym
from geon.transformers.passes import Pass

__all__ = ["UnrollScans", "unrolled_outputs"]


def _stacked(parts, axis, like):
    """``parts`` (one per index of ``axis``) stacked as the output ``like``."""
    s = stack(parts, axis, position=0)
    return s if s.axes == like.axes else og.AxesWithOrder(s, like.axes)


def unrolled_outputs(op: Scan) -> list:
    """Ops computing each output of ``op`` (final carries, stacked ``y_t``, history)
    with one copy of its body per step."""
    nc, nx, _, ny = op.counts
    body, axis, steps = op.body, op.axis, int(op.axis.length or 0)
    carries = list(op.args[:nc])
    seqs, closures = op.args[nc:nc + nx], list(op.args[nc + nx:])
    ys = [[None] * steps for _ in range(ny)]
    hist = [[None] * steps for _ in range(nc)]
    for t in (range(steps - 1, -1, -1) if op.reverse else range(steps)):
        for k in range(nc):
            hist[k][t] = carries[k]
        xs = [slice_along_axis(s, axis, t) for s in seqs]
        copies = clone_graph(list(body.results),
                             replace=dict(zip(body.inputs, carries + xs + closures)))
        new = [copies[r] for r in body.results]
        carries = new[:nc]
        for j in range(ny):
            ys[j][t] = new[nc + j]
    stacked = [_stacked(parts, axis, o) for parts, o in zip(ys + hist, op.outputs[nc:])]
    return carries + stacked


class UnrollScans(Pass):
    """Replace every :class:`Scan` (those of the bodies too) by its unrolled steps."""

    name = "unroll"

    def run(self, graph, transformer):
        done = set()
        while True:
            scans = [op for op in graph.ops() if isinstance(op, Scan) and op not in done]
            if not scans:
                return
            for op in scans:
                done.add(op)
                if isinstance(op.axis.length, Sym):
                    raise ArgumentError(
                        f"Scan {op.name} (built at {op.file_info}) runs over axis "
                        f"{op.axis.name} of symbolic length {op.axis.length!r}: the "
                        f"{transformer.name} transformer unrolls scans, which needs a "
                        f"fixed number of steps (the numpy transformer and the PyTorch "
                        f"export loop over a symbolic one; doc/symbolic_axes.rst)")
                if op.axis.length == 0:
                    continue  # (no step: nothing to unroll; the backend refuses it)
                with rewriting(op):
                    outs = unrolled_outputs(op)
                for old, new in zip(op.outputs, outs):
                    if old.forward is None:
                        graph.replace(old, new)
            graph.invalidate()
