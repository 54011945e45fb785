"""Specialization: a copy of a graph with its symbolic lengths bound to numbers.

``specialize(results, {"N": 7})`` copies the ops ``results`` need, with every symbolic
length evaluated: each axis of a symbolic length becomes an axis of the same name, flags
and the bound length, and each parameter that holds a length (``LengthValue``, slice
keys) gets its value. Variables are shared (their lengths are fixed); placeholders with
symbolic axes are copied. The reference evaluator runs graphs of symbolic lengths this
way (:func:`binding_of` finds the binding from the feeds), and a backend that needs
fixed lengths could transform one copy per binding.
"""

from typing import Any, Mapping

import numpy as np

from geon.errors import ArgumentError, FeedError
from geon.op_graph import op_graph as og
from geon.op_graph.axes import Axes, Axis, FlattenedAxis
from geon.op_graph.params import clone_graph, graph_ops
from geon.op_graph.reference import SPECIALIZE
from geon.op_graph.symbols import Sym


def binding_of(placeholders: Mapping[Any, Any]) -> dict:
    """``{symbol: value}`` read from ``{placeholder: array}``: the lengths of the axes
    whose length is a bare symbol; a :class:`FeedError` where two feeds disagree."""
    binding: dict = {}
    source: dict = {}
    for p, value in placeholders.items():
        shape = np.shape(value)
        if len(shape) != len(p.axes):
            continue  # the feed's own check names the wrong rank
        for k, n in enumerate(p.axes.lengths):
            name = n.symbol if isinstance(n, Sym) else None
            if name is None:
                continue
            old = binding.get(name)
            if old is None:
                binding[name], source[name] = shape[k], p
            elif old != shape[k]:
                raise FeedError(f"placeholder {p.name} gives symbol {name} the value "
                                f"{shape[k]}, but placeholder {source[name].name} gives "
                                f"it {old}: the feeds disagree")
    return binding


def call_binders(found: Any, variables: Any, placeholders: Any, what: str = "") -> list:
    """Where each call of a computation reads the symbols ``found`` (the names of the
    symbols of its symbolic lengths): ``[(placeholder index, axis position, symbol)]``,
    one per axis of a placeholder whose length is a bare symbol. A Variable with a
    symbolic length, or a symbol no placeholder gives, is an ``ArgumentError``
    (``what`` begins its message)."""
    for v in variables:
        if v.axes.is_symbolic:
            raise ArgumentError(
                f"Variable {v.name} (built at {v.file_info}) has axes "
                f"({og._fmt(v.axes)}): a variable's lengths must be fixed (its storage "
                f"outlives every call); symbolic lengths are for placeholders and what "
                f"is computed from them")
    binders = [(i, k, n.symbol) for i, p in enumerate(placeholders)
               for k, n in enumerate(p.axes.lengths)
               if isinstance(n, Sym) and n.symbol is not None]
    missing = set(found) - {s for _, _, s in binders}
    if missing:
        raise ArgumentError(
            f"{what}the computation has symbolic length(s) {', '.join(sorted(missing))} "
            f"that no placeholder has as the length of one of its axes: a call could not "
            f"bind them from the feeds' shapes; feed a placeholder with such an axis")
    return binders


def read_binding(binders: Any, params: Any, shapes: Any) -> dict:
    """``{symbol: value}`` read from the feeds' ``shapes`` (one per parameter, ``None``
    for a feed without one) where ``binders`` (:func:`call_binders`) says; a
    :class:`FeedError` naming both placeholders, both shapes and the symbol where two
    feeds disagree. A feed of another rank binds nothing: the caller's feed check names
    what is wrong with it."""
    binding: dict = {}
    source: dict = {}
    for i, k, name in binders:
        shape, p = shapes[i], params[i]
        if shape is None or len(shape) != len(p.axes):
            continue
        value = shape[k]
        old = binding.get(name)
        if old is None:
            binding[name], source[name] = value, (i, k)
        elif old != value:
            j, m = source[name]
            q = params[j]
            raise FeedError(
                f"placeholder {p.name} gives symbol {name} the value {value} (the "
                f"length of its axis {p.axes[k].name}, shape {tuple(shape)}), but "
                f"placeholder {q.name} gives it {old} (axis {q.axes[m].name}, shape "
                f"{tuple(shapes[j])}): the feeds disagree")
    return binding


def check_needs(ops: Any, binding: Mapping[str, int]) -> None:
    """A :class:`FeedError` where a slice or an index of ``ops`` over a symbolic length
    does not fit the dimension with ``binding`` (each op's ``needs``: expressions that
    must be ``>= 0``, see :func:`~geon.op_graph.symbols.cut`)."""
    for op in ops:
        for expr, what in getattr(op, "needs", ()):
            if expr.evaluate(binding) < 0:
                given = ", ".join(f"{k} = {v}" for k, v in sorted(binding.items())
                                  if k in expr.symbols)
                raise FeedError(f"{type(op).__name__} {op.name} (built at {op.file_info}) "
                                f"takes {what}, which needs {expr!r} >= 0; the feeds give "
                                f"{given}: what an op takes over a symbolic length must "
                                f"fit the dimension (it is not clamped)")


def probe_binding(symbols: Any, ops: Any) -> dict:
    """A binding of ``symbols`` (all equal, as small as it can be) under which every
    length is at least 1 and every slice of ``ops`` fits: for choices that hold for any
    binding, such as which values a memory plan places."""
    for v in range(1, 257):
        binding = dict.fromkeys(symbols, v)
        try:
            check_needs(ops, binding)
        except FeedError:
            continue
        if all(n.evaluate(binding) >= 1 for op in ops if isinstance(op, og.TensorOp)
               for n in op.axes.lengths if isinstance(n, Sym)):
            return binding
    return dict.fromkeys(symbols, 1)


class _Binder:
    """Evaluates the symbolic lengths in parameter values, one new axis per name."""

    def __init__(self, binding: Mapping[str, int]) -> None:
        self.binding = dict(binding)
        self.axes: dict = {}

    def axis(self, a: Axis) -> Axis:
        if isinstance(a, FlattenedAxis):
            parts = self.all_axes(a.axes)
            return a if parts is a.axes else FlattenedAxis(parts)
        if not isinstance(a.length, Sym):
            return a
        key = (a.name, a.length)  # (positional axes share names, not lengths)
        new = self.axes.get(key)
        if new is None:
            new = self.axes[key] = Axis(a.length.evaluate(self.binding), a.name,
                                           batch=a.batch, recurrent=a.recurrent)
        return new

    def all_axes(self, axes: Axes) -> Axes:
        new = [self.axis(a) for a in axes]
        return axes if all(n is a for n, a in zip(new, axes)) else Axes(new)

    def value(self, v: Any) -> Any:
        if isinstance(v, Sym):
            return v.evaluate(self.binding)
        if isinstance(v, Axes):
            return self.all_axes(v)
        if isinstance(v, Axis):
            return self.axis(v)
        if isinstance(v, tuple):
            return tuple(self.value(x) for x in v)
        if isinstance(v, slice):
            return slice(self.value(v.start), self.value(v.stop), self.value(v.step))
        return v


def specialize(results: Any, binding: Mapping[str, int]) -> dict:
    """``{original op: copy}`` for the ops ``results`` need, with the symbolic lengths
    bound by ``binding`` (see the module docstring)."""
    ops, _ = og.as_op_list(results, "specialize: results")
    binder = _Binder(binding)
    replace = {}
    every = graph_ops(ops, initializers=False)
    check_needs(every, binding)
    for op in every:
        if isinstance(op, og.Placeholder) and op.axes.is_symbolic:
            new = og.Placeholder(binder.all_axes(op.axes), dtype=op.dtype,
                                 domain=op.domain, name=op.name)
            new.filename, new.lineno = op.filename, op.lineno
            replace[op] = new
    return clone_graph(ops, replace=replace, values=binder.value)


def _bound(ops: list, feeds: dict) -> tuple:
    """The reference evaluator's hook: copies of ``ops`` and ``feeds`` bound by the
    feeds' shapes."""
    copies = specialize(ops, binding_of(feeds))
    return [copies[r] for r in ops], {copies.get(p, p): v for p, v in feeds.items()}


SPECIALIZE.append(_bound)
