"""Symbolic lengths in the PyTorch export: a module made from a graph with symbolic
lengths binds them from its inputs' shapes at each call (``TorchComputation._bind``),
and its rules read every shape, key or length through :func:`bound` and
:func:`shape_of`, which evaluate them under the running call's binding (held per
thread in ``_CALL``)."""

import threading
from typing import Optional

import torch

from geon.errors import LoweringError
from geon.op_graph import op_graph as og
from geon.op_graph import primitives as pr
from geon.op_graph import symbols as sy
from geon.op_graph.axes import Axes

class _Call(threading.local):
    """What the running ``forward`` call of a module with symbolic lengths binds (per
    thread): ``binding`` ``{symbol: value}`` (``None`` outside such a call) and the
    ``device`` of its feeds."""

    binding: Optional[dict] = None
    device: Optional[torch.device] = None


_CALL = _Call()


def _bound_value(x, binding):
    if isinstance(x, sy.Sym):
        return x.evaluate(binding)
    if isinstance(x, slice):
        return slice(_bound_value(x.start, binding), _bound_value(x.stop, binding),
                     _bound_value(x.step, binding))
    if isinstance(x, (tuple, list)):
        return type(x)(_bound_value(v, binding) for v in x)
    return x


def bound(x):
    """``x`` (a length, a shape, a key of ints and slices) with its symbolic lengths
    evaluated under the running call's binding; ``x`` itself outside one."""
    binding = _CALL.binding
    return x if binding is None else _bound_value(x, binding)


def shape_of(op) -> tuple:
    """``op.axes.shape`` under the running call's binding (ints): what a rule reads."""
    binding = _CALL.binding
    shape = op.axes.shape
    return shape if binding is None else sy.evaluate(shape, binding)


#: The attributes (beyond ``axes``) that hold symbolic lengths the rules evaluate under
#: the binding; another attribute holding one is refused at export (see _check_symbolic).
_BOUND_ATTRS: dict = {pr.SliceView: ("key",), pr.Unslice: ("key",),
                      pr.LengthValue: ("value",)}


def bound_attrs(*classes: type, names: tuple = ()):
    """Declare that the rules of ``classes`` evaluate their attributes ``names`` under
    the binding (through :func:`bound`), so that symbolic lengths in them export."""
    for cls in classes:
        _BOUND_ATTRS[cls] = tuple(names)


#: ``{op class: fn(op)}``, run for each op of the class when a module with symbolic
#: lengths is made: control flow exports its bodies then (geon.transformers.torch.control),
#: so that what they cannot export is an error at export, not at the first call.
PREPARE_SYMBOLIC: dict = {}


def _symbols_in(x) -> frozenset:
    """The names of the symbols in ``x`` (a length, a shape, a key, an axis)."""
    if isinstance(x, sy.Sym):
        return x.symbols
    if isinstance(x, slice):
        return _symbols_in((x.start, x.stop, x.step))
    if isinstance(x, (tuple, list)):
        return frozenset().union(*[_symbols_in(v) for v in x])
    if isinstance(x, Axes):
        return sy.symbols_of(x.lengths)
    if isinstance(x, og.Axis):
        return _symbols_in(x.length)
    return frozenset()


def _check_symbolic(op) -> None:
    """Raise a :class:`LoweringError` naming ``op`` if one of its attributes holds a
    symbolic length that its rule does not evaluate under the binding."""
    handled = {"axes"}
    for cls in type(op).__mro__:
        handled.update(_BOUND_ATTRS.get(cls, ()))
    for name in tuple(getattr(op, "attrs", ())) + tuple(getattr(op, "optional_attrs", ())):
        if name not in handled and _symbols_in(getattr(op, name, None)):
            raise LoweringError(
                f"{type(op).__name__} {op.name} (built at {op.file_info}): its {name} "
                f"{getattr(op, name)!r} has a symbolic length, which the torch export "
                f"does not bind at call time; export a copy bound to fixed lengths "
                f"(geon.op_graph.specialize.specialize)")


__all__ = ["PREPARE_SYMBOLIC", "bound", "bound_attrs", "shape_of"]
