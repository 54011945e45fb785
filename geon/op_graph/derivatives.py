"""Building blocks of derivative rules, shared by the op modules that register rules
(reverse ones into ``ADJOINTS``, forward ones into ``FORWARD``; see
:mod:`geon.op_graph.tables`). Nothing here builds an op of its own."""

from geon.op_graph.axes import Axes


def zero_adjoint(op, d):
    """The reverse rule of an op through which no derivative flows."""
    return (None,) * len(op.args)


def same_adjoint(op, d):
    """The reverse rule of an op whose value is its arg's in another layout (the
    engine fits the delta to the arg by name)."""
    return (d,)


def zero_tangent(op, ts):
    """The forward rule of an op whose value does not change with its args'."""
    return None


def same_tangent(op, ts):
    """The forward rule of an op whose value is its arg's in another layout (the
    engine fits the tangent to the op by name)."""
    return ts[0]


def terms(*pairs):
    """``sum_i f_i(t_i)`` over the pairs ``(t_i, f_i)`` whose tangent is not ``None``."""
    out = None
    for t, f in pairs:
        if t is None:
            continue
        term = f(t)
        out = term if out is None else out + term
    return out


def scaled(factor):
    """The forward rule of a unary elementwise op: ``tangent * factor(op)``."""
    def rule(op, ts):
        t, = ts
        return t * factor(op)
    return rule


def direction_axes(t, arg):
    """The direction axes of tangent ``t`` of ``arg``: its axes after ``arg``'s own
    (see :mod:`geon.op_graph.forward`)."""
    return Axes(tuple(t.axes)[len(arg.axes):])
