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
from geon.op_graph.ordering import stale_view_reads
from geon.transformers.passes import Pass


class CopyStaleViews(Pass):
    """Insert copies for stale view reads (see the module docstring)."""

    name = "alias"

    def run(self, graph, transformer):
        copies = {}

        def copy_of(view):
            if view not in copies:
                with rewriting(view):  # made where the view was: before the assignment
                    copies[view] = pr.Copy(view)
            return copies[view]
        reads, results = stale_view_reads(graph.ops(), graph.results)
        for op, view in [(op, op.args[i]) for op, i in reads]:  # (before any replacing)
            op.replace_arg(view, copy_of(view))
        if results:
            graph.results = [copy_of(r) if r in results else r for r in graph.results]
        if copies:
            graph.invalidate()
