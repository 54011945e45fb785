"""GPU-specific passes, run after the standard ones (see ``GPUTransformer.passes``)."""

from geon.op_graph import primitives as pr
from geon.op_graph.nodes import rewriting
from geon.op_graph.symbols import SymbolicLengthError
from geon.transformers.gpu.layout import (Layout, layouts, reshape_layout, row_major,
                                         view_layout)
from geon.transformers.passes import Pass


class GemmOperandTypes(Pass):
    """``gemm(a, b)`` whose operands are not of its type (a float64 product of a
    float32 operand: NumPy's promotion) -> ``gemm(copy(a) : dtype, ...)``. The
    generated GEMM and cuBLAS read both operands in the product's type; NumPy's matmul
    converts them itself."""

    name = "gemm_types"

    def run(self, graph, transformer):
        changed = False
        for op in graph.ops():
            if not isinstance(op, pr.Gemm):
                continue
            for x in list(op.args):
                if x.dtype != op.dtype:
                    with rewriting(op):
                        c = pr.Copy(x, dtype=op.dtype)
                    op.replace_arg(x, c)
                    changed = True
        if changed:
            graph.invalidate()


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
            if not isinstance(op, pr.Reshape) or _no_copy(lay[x], op.axes.shape):
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


def _no_copy(lay, shape):
    """Whether strides describe ``lay`` reshaped to ``shape``. Over symbolic lengths, a
    reshape that would need an order of two lengths to decide gets its copy (which
    computes the same values for every binding)."""
    try:
        return reshape_layout(lay, shape) is not None
    except SymbolicLengthError:
        return False
