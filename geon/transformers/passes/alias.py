"""Copies for reads of views that an assignment would otherwise change underneath.

A view shares its storage. If an op runs after an assignment to that storage but reads
a view taken before it, the op would see the new values where the graph means the old
ones. This pass routes each such read through a :class:`~geon.op_graph.primitives.Copy`
of the view; the copy does not depend on the assignment, so the scheduler runs it first.
A requested result is read by the caller after the whole computation, so a result that
is such a view is replaced by such a copy too.
"""

from geon.op_graph import primitives as pr
from geon.op_graph.nodes import rewriting
from geon.op_graph.ordering import stale_view_reads, stale_view_results
from geon.transformers.passes import Pass


class CopyStaleViews(Pass):
    """Insert copies for stale view reads (see the module docstring)."""

    name = "alias"

    def run(self, graph, transformer):
        copies = {}
        for op, i in stale_view_reads(graph.ops()):
            view = op.args[i]
            if view not in copies:
                with rewriting(view):  # made where the view was: before the assignment
                    copies[view] = pr.Copy(view)
            op.replace_arg(view, copies[view])
        for view in stale_view_results(graph.ops(), graph.results):
            if view not in copies:
                with rewriting(view):
                    copies[view] = pr.Copy(view)
            graph.results = [copies[view] if r is view else r for r in graph.results]
        if copies:
            graph.invalidate()
