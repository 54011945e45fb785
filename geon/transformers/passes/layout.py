"""The layout pass: the sample axis first or last in every computed value.

A transformer that prefers the sample (batch) axis first or last sets
``sample_axis = "first"`` or ``"last"``; its pipeline then runs this pass on the Axes
ops, before lowering. Elementwise ops, dot products and reductions are rebuilt so that
their results have the sample axes at the preferred end (recurrent axes next to them,
feature axes in their order), and the value a user's op had is an ``AxesWithOrder``
view of the rebuilt one. These ops match their operands by name, so the pass reads
operands through such views directly (a reorder costs nothing until lowering lays out
an operand, and then only where layouts really differ). Placeholders keep the layout
in which they are fed and requested results are returned in the order of their axes,
so results do not depend on the preference; the generated code does: buffer shapes and
``matmul`` operand order show the layout.
"""

from geon.errors import ArgumentError
from geon.op_graph import op_graph as og
from geon.op_graph.axes import Axes
from geon.transformers.passes import RewritePass

LAYOUTS = ("first", "last")


def preferred_axes(axes, sample_axis):
    """``axes`` with sample axes at the ``sample_axis`` end ("first" or "last"),
    recurrent axes beside them, and the others in their order."""
    batch = [a for a in axes if a.batch]
    rec = [a for a in axes if a.recurrent and not a.batch]
    rest = [a for a in axes if not (a.batch or a.recurrent)]
    if sample_axis == "first":
        return Axes(batch + rec + rest)
    return Axes(rest + rec + batch)


def _strip(x):
    """``x`` without reorderings (ops matching operands by name do not need them)."""
    while isinstance(x, og.AxesWithOrder):
        x = x.args[0]
    return x


def _same(a, b):
    if a is b:
        return True
    return (isinstance(a, og.AxesWithOrder) and isinstance(b, og.AxesWithOrder)
            and a.args[0] is b.args[0] and a.axes.names == b.axes.names)


def _ordered(x, axes):
    return x if x.axes.names == axes.names else og.AxesWithOrder(x, axes)


class LayoutPass(RewritePass):
    """Put the sample axis first or last in computed values (see the module doc)."""

    name = "layout"

    def __init__(self, sample_axis="first", name=None):
        if sample_axis not in LAYOUTS:
            raise ArgumentError(f"sample_axis must be one of {LAYOUTS}, not {sample_axis!r}")
        self.sample_axis = sample_axis
        super().__init__(name=name)
        self.add_rule(og.ElementWise, self.elementwise)
        self.add_rule(og.Dot, self.dot)
        self.add_rule(og.Reduction, self.reduction)
        self.add_rule(og.CastAxes, self.cast)

    def __repr__(self):
        return f"<pass {self.name} (sample axis {self.sample_axis})>"

    def preferred(self, axes):
        return preferred_axes(axes, self.sample_axis)

    def elementwise(self, op):  # f(a, b) : (C, N) -> reorder(f(a, b) : (N, C))
        args = [_strip(a) for a in op.args]
        want = self.preferred(op.axes)
        if want.names == op.axes.names and all(a is b for a, b in zip(args, op.args)):
            return None
        new = type(op)(*args, axes=want, dtype=op.dtype)
        return _ordered(new, op.axes)

    def dot(self, op):  # dot(w, x) : (Y, N) -> reorder(dot(x, w) : (N, Y))
        if len(op.batch_axes):  # a batched product keeps its layout (a's, then b's)
            return None
        a, b = (_strip(x) for x in op.args)
        want = self.preferred(op.axes)
        shared = a.axes & b.axes
        for first, second in ((a, b), (b, a)):
            m, n = first.axes - shared, second.axes - shared
            k = len(m)
            if set(want.names[:k]) == set(m.names) and set(want.names[k:]) == set(n.names):
                f = _ordered(first, want[:k] + (first.axes & shared))
                s = _ordered(second, (second.axes & shared) + want[k:])
                break
        else:  # sample axes on both sides: keep the op as it is
            return None
        if _same(f, op.args[0]) and _same(s, op.args[1]):
            return None
        return _ordered(og.Dot(f, s, dtype=op.dtype), op.axes)

    def cast(self, op):  # cast(reorder(x)) -> reorder(cast(x)): a view, not a copy
        if not isinstance(op.args[0], og.AxesWithOrder):
            return None
        from geon.op_graph.np_ops import cast_through_reorder
        return cast_through_reorder(op.args[0], op.axes, type(op))

    def reduction(self, op):  # sum(x) : (C, N) -> reorder(sum(x) : (N, C))
        x = op.args[0]
        # An argmax over several axes counts in the input's order: keep it.
        if not (isinstance(op, og.ArgMax) and len(op.reduction_axes) > 1):
            x = _strip(x)
        want = self.preferred(op.axes)
        if want.names == op.axes.names and x is op.args[0]:
            return None
        new = type(op)(x, reduction_axes=op.reduction_axes, out_axes=want, dtype=op.dtype)
        return _ordered(new, op.axes)
