"""GPU-specific passes, run after the standard ones (see ``GPUTransformer.passes``)."""

from geon.op_graph import primitives as pr
from geon.op_graph.nodes import rewriting
from geon.transformers.gpu.layout import (Layout, layouts, reshape_layout, row_major,
                                         view_layout)
from geon.transformers.passes import Pass


class ContiguousReshapes(Pass):
    """``reshape(x) -> reshape(copy(x))`` where no strides describe the reshaped view
    of ``x``'s elements (e.g. a transpose flattened). On the GPU every view is strides
    seen by the kernels that read it; NumPy copies such a reshape silently, the GPU
    needs an explicit :class:`~geon.op_graph.primitives.Copy` (a producer the memory
    planner places)."""

    name = "views"

    def run(self, graph, transformer):
        order = graph.ops()
        lay = layouts([op for op in order if not isinstance(op, pr.ViewOp)])
        changed = False
        for op in order:
            if not isinstance(op, pr.ViewOp):
                continue
            x = op.args[0]
            if not isinstance(op, pr.Reshape) or \
                    reshape_layout(lay[x], op.axes.shape) is not None:
                lay[op] = view_layout(op, lay[x])
                continue
            with rewriting(op):
                c = pr.Copy(x)
            op.replace_arg(x, c)
            lay[c] = Layout(c, 0, c.axes.shape, row_major(c.axes.shape))
            lay[op] = view_layout(op, lay[c])
            changed = True
        if changed:
            graph.invalidate()
