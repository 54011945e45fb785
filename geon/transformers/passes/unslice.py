"""Sums of slices written into a value: ``x + Unslice(a, key)`` as one
:class:`~geon.op_graph.primitives.UnsliceAdd`.

The adjoint of a value read through several slices (the gates of a recurrent cell, the
parts of a split) and a concatenation are sums of Unslices: each fills a buffer of the
whole shape with zeros, writes its part, and is added to the rest, two passes over the
whole shape per part. As UnsliceAdds, the first Unslice stays and every other part is
added into it where it lies (in place, where the sum so far dies there): in the
backward step of the zoo's LSTM, the gates' cotangents are one Unslice and three adds
of one gate each, not four Unslices and three sums over all the gates. The ops it
rewrites are the frontend's (``forward``), so every transformer's ``lower`` pass turns
an UnsliceAdd back into the standard ops (``lower.lower_unslice_add``), and this pass,
after it, makes it again.
"""

from geon.op_graph import op_graph as og
from geon.op_graph import primitives as pr
from geon.op_graph.nodes import rewriting
from geon.transformers.passes import Pass


def _plain(op):
    """Whether Unslice ``op`` has fixed lengths and a key of plain ints."""
    return op.axes.lengths_known and all(isinstance(n, int) for n in op.axes.lengths) \
        and pr.plain_key(op.key)


class UnsliceAdds(Pass):
    """Rewrite ``Add(x, Unslice(a, key))`` (either order; the Unslice read by nothing
    else, of the sum's dtype) into ``UnsliceAdd(x, a, key)``, a chain of such sums into
    a chain of UnsliceAdds."""

    name = "unslice_add"

    def run(self, graph, transformer):
        ops = graph.ops()
        readers = {}
        for op in ops:
            for a in op.all_deps():
                readers[a] = readers.get(a, 0) + 1
        for r in graph.roots:
            readers[r] = readers.get(r, 0) + 1
        changed = False
        for op in ops:
            if type(op) is not og.Add or op.forward is not None:
                continue
            args = list(op.args)
            for k in (1, 0):
                u, x = args[k], args[1 - k]
                if isinstance(u, pr.Unslice) and readers.get(u) == 1 and u is not x \
                        and not u.other_deps and _plain(u) \
                        and u.dtype == x.dtype == op.dtype \
                        and u.axes.lengths == x.axes.lengths == op.axes.lengths \
                        and u.args[0].axes.lengths != op.axes.lengths:
                    with rewriting(op):
                        new = pr.UnsliceAdd(x, u.args[0], u.key, op.axes, dtype=op.dtype)
                    graph.replace(op, new)
                    changed = True
                    break
        if changed:
            graph.invalidate()
