"""Checks run at the end of a pipeline: only base-set ops remain, in positional form."""

from geon.errors import LoweringError
from geon.op_graph import op_graph as og
from geon.transformers.passes import Pass


def unlowered(op, base_set):
    """Why ``op`` is not a base-set op in positional form, or ``None`` if it is."""
    if not isinstance(op, tuple(base_set)):
        return f"{type(op).__name__} is not in the transformer's base set"
    if isinstance(op, og.ElementWise):
        for a in op.args:
            if a.axes.lengths != op.axes.lengths and not (
                    isinstance(a, og.Constant) and not len(a.axes)):
                return (f"elementwise arg {a.name} ({a.axes!r}) is not laid out as the "
                        f"result ({op.axes!r})")
    return None


class VerifyBaseSet(Pass):
    """Raise :class:`LoweringError` naming any op the pipeline could not lower."""

    name = "verify"

    def run(self, graph, transformer):
        for op in graph.ops():
            why = unlowered(op, transformer.base_set)
            if why is not None:
                raise LoweringError(
                    f"{transformer.name} transformer cannot run {op.name} "
                    f"({type(op).__name__}, built at {op.file_info}): {why}")
