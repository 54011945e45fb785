"""Checks run at the end of a pipeline: only base-set ops remain, in positional form."""

from geon.errors import LoweringError
from geon.op_graph import op_graph as og
from geon.transformers.passes import Pass


def unlowered(op, base_set, _in_base=None):
    """Why ``op`` is not a base-set op in positional form, or ``None`` if it is.

    ``_in_base`` (a dict, class -> whether it is in ``base_set``) caches the class
    checks over one walk of a graph."""
    cls = type(op)
    ok = None if _in_base is None else _in_base.get(cls)
    if ok is None:
        ok = issubclass(cls, tuple(base_set))
        if _in_base is not None:
            _in_base[cls] = ok
    if not ok:
        return f"{cls.__name__} is not in the transformer's base set"
    if isinstance(op, og.ElementWise):
        lengths = op.axes.lengths
        for a in op.args:
            if a.axes.lengths != lengths and not (
                    isinstance(a, og.Constant) and not len(a.axes)):
                return (f"elementwise arg {a.name} ({a.axes!r}) is not laid out as the "
                        f"result ({op.axes!r})")
    return None


class VerifyBaseSet(Pass):
    """Raise :class:`LoweringError` naming any op the pipeline could not lower."""

    name = "verify"

    def run(self, graph, transformer):
        in_base, base_set = {}, transformer.base_set   # (a property may compute it)
        for op in graph.ops():
            why = unlowered(op, base_set, in_base)
            if why is not None:
                raise LoweringError(
                    f"{transformer.name} transformer cannot run {op.name} "
                    f"({type(op).__name__}, built at {op.file_info}): {why}")
