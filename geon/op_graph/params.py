"""The op-parameter protocol: what every tool that copies, compares, prints or writes ops
derives from an op class's ``attrs`` (see :class:`~geon.op_graph.op_graph.Op`).

- :func:`value_key` makes a parameter value hashable for the CSE key;
- :func:`show_value` prints it (:mod:`geon.op_graph.printing`);
- :func:`build` / :func:`rebuild` call an op class's constructor with args and
  parameters, so the checks of graph building run again; :func:`clone_graph` copies a
  graph with them;
- :func:`op_classes` is the registry of op classes by type name that
  :mod:`geon.op_graph.serialize` reads documents with.

A new op class declares ``attrs`` and needs nothing here.
"""

import inspect
import weakref

import numpy as np

from geon.errors import GeonError
from geon.op_graph import op_graph as og
from geon.op_graph.axes import Axes, Axis
from geon.op_graph.symbols import Sym


# --- graph walks (iterative; they follow ``forward`` like a transformer does) -----------

def live_deps(op):
    """``op``'s args then other_deps, each followed to the live op (:func:`og.snap`)."""
    return [og.snap(d) for d in op.all_deps()]


def graph_ops(results, stop=(), initializers=True):
    """The live ops ``results`` need (args, other_deps and, if ``initializers``, the
    initializers of those ops with what they need), each after its dependencies. Ops in
    ``stop`` are listed but not looked into."""
    stop = set(stop)
    roots = [og.snap(r) for r in results]

    def children(op):
        return () if op in stop else live_deps(op)

    order = og.toposort(roots, children=children)
    if not initializers:
        return order
    seen = set(order)
    while True:
        extra = [og.snap(i) for op in order for i in op._initializers]
        extra = [i for i in dict.fromkeys(extra) if i not in seen]
        if not extra:
            return order
        more = [op for op in og.toposort(extra, children=children) if op not in seen]
        order.extend(more)
        seen.update(more)


# --- parameter values ---------------------------------------------------------------------

def value_key(v):
    """A hashable key of a parameter value: equal exactly when the values mean the same
    (``1`` and ``1.0``, ``0.0`` and ``-0.0`` differ; arrays compare dtype, shape and
    bytes; axes compare names and lengths). Raises :class:`TypeError` for a value of a
    type parameters may not have."""
    key = _KEY_OF_TYPE.get(type(v))
    if key is None:
        key = _KEY_OF_TYPE[type(v)] = _key_function(v)
    return key(v)


def _key_function(v):
    """The function computing :func:`value_key` for values of ``type(v)`` (looked up
    once per type: CSE keys every op of a graph)."""
    if v is None or isinstance(v, (bool, int, str)):
        return lambda v: (type(v).__name__, v)
    if isinstance(v, float):
        return lambda v: ("float", v.hex())
    if isinstance(v, complex):
        return lambda v: ("complex", v.real.hex(), v.imag.hex())
    if isinstance(v, tuple):
        return lambda v: ("tuple",) + tuple(value_key(x) for x in v)
    if isinstance(v, slice):
        return lambda v: ("slice", value_key(v.start), value_key(v.stop),
                          value_key(v.step))
    if isinstance(v, Sym):  # a symbolic length: immutable, in normal form
        return lambda v: ("sym", v)
    if isinstance(v, Axis):
        return lambda v: ("axis", v.name, v.length)
    if isinstance(v, Axes):
        return lambda v: ("axes",) + tuple((a.name, a.length) for a in v)
    if isinstance(v, np.dtype):
        return lambda v: ("dtype", v.str)
    if isinstance(v, (np.ndarray, np.generic)):
        def array_key(v):
            a = np.asarray(v)
            return ("array", a.dtype.str, a.shape, a.tobytes())
        return array_key
    if isinstance(v, og.Op) or callable(v):
        return lambda v: ("ref", v)  # identity
    raise TypeError(f"a parameter value of type {type(v).__name__} ({v!r}) is not "
                    f"supported")


#: type -> the function computing value_key for its values
_KEY_OF_TYPE = {}


def _show_index(k):
    if isinstance(k, slice):
        return ":".join("" if v is None else str(v) for v in (k.start, k.stop, k.step))
    return str(k)


def show_array(a):
    """Short text of an array: its values if there are at most 6, else its type."""
    a = np.asarray(a)
    if a.ndim == 0:
        return repr(a[()].item())
    if a.size <= 6:
        return np.array2string(a.reshape(-1), separator=", ") \
            + ("" if a.ndim == 1 else f".reshape{a.shape}")
    return f"<{a.dtype} array {a.shape}>"


def show_axes(axes):
    """``(C:3, N:5)``."""
    return "(" + ", ".join(repr(a) for a in axes) + ")"


def show_value(v):
    """The text of a parameter value in a printed graph."""
    if isinstance(v, slice):
        return _show_index(v)
    if isinstance(v, tuple):
        return "(" + ", ".join(show_value(x) for x in v) + ("," if len(v) == 1 else "") + ")"
    if isinstance(v, Axes):
        return show_axes(v)
    if isinstance(v, (np.ndarray, np.generic)):
        return show_array(v)
    if isinstance(v, og.Op):
        return v.name
    if callable(v) and not isinstance(v, type):
        return "<function>"
    return str(v) if isinstance(v, (np.dtype, Axis)) else repr(v)


# --- op classes ---------------------------------------------------------------------------

def type_name(cls):
    """The name an op class is written under: its ``type_name`` (user ops:
    ``"user:<key>"``) or its class name."""
    return cls.__dict__.get("type_name") or cls.__name__


def op_classes():
    """``{type name: class}`` of every op class this process has defined. Nothing is
    imported. A name two live classes share maps to geon's class if one is geon's (a
    program cannot shadow geon's ops), else to ``None`` (neither can be written)."""
    by_name, seen, stack = {}, set(), [og.Op]
    while stack:
        cls = stack.pop()
        if cls not in seen:
            seen.add(cls)
            stack.extend(cls.__subclasses__())
            by_name.setdefault(type_name(cls), []).append(cls)
    table = {}
    for name, classes in by_name.items():
        ours = [c for c in classes if c.__module__.startswith("geon.")]
        table[name] = classes[0] if len(classes) == 1 else ours[0] if len(ours) == 1 \
            else None
    return table


# --- building ops -------------------------------------------------------------------------

def build(cls, args, attrs, name=None, tags=(), follows=()):
    """``cls(*args, **attrs, name=, tags=, follows=)``, without the constructor's effects
    on the rest of the graph (``SetItem`` sets its target's ``user_deps``; args'
    ``user_deps`` join ``other_deps``): the op runs after exactly ``follows``."""
    saved = [(a, a.user_deps) for a in args]
    try:
        op = cls(*args, **attrs, name=name, tags=set(tags), follows=list(follows))
    finally:
        for a, deps in saved:
            a.user_deps = deps
    want = set(follows)
    for d in list(op.other_deps):
        if d not in want:
            op.other_deps.discard(d)
            d._dep_users.discard(op)
    if type(op) is not cls:
        raise GeonError(f"the constructor of {cls.__name__} made a {type(op).__name__}")
    return op


def copy_debug_info(op, filename, lineno, derived_from):
    """Give ``op`` a source location and ``derived_from`` (``None``: its own)."""
    op.filename, op.lineno = filename, lineno
    if derived_from is not None:
        op.derived_from = derived_from
    elif "derived_from" in op.__dict__:
        del op.derived_from


def rebuild(op, args, follows=(), mapping=None, values=None):
    """A copy of ``op`` with ``args`` and ``follows``: the same class, parameters, name,
    tags and source location. Op references among the parameters are looked up in
    ``mapping`` (``{original: copy}``) when given; ``values(v)``, if given, maps each
    parameter value (``geon.op_graph.specialize`` binds symbolic lengths so)."""
    attrs = op.attr_values()
    if mapping is not None:
        attrs = {k: map_refs(v, mapping) for k, v in attrs.items()}
    if values is not None:
        attrs = {k: values(v) for k, v in attrs.items()}
    new = build(type(op), list(args), attrs, op.name, op.tags, follows)
    copy_debug_info(new, op.filename, op.lineno, op.derived_from)
    return new


def map_refs(v, mapping):
    """``v`` with each op in it replaced by ``mapping[snap(op)]`` (``None`` if absent)."""
    if isinstance(v, og.Op):
        return mapping.get(og.snap(v))
    if isinstance(v, tuple):
        return tuple(map_refs(x, mapping) for x in v)
    return v


def copy_schema(schema, mapping, op):
    """``schema`` with its op references mapped, if it matches ``op``; else ``None``."""
    if schema is None:
        return None
    values = {k: map_refs(getattr(schema, k), mapping) for k in schema.attrs}
    if any(v is None for v in values.values()):
        return None
    new = type(schema)(**values)
    return new if new.matches(op) else None


def restore_weak(constants):
    """Building a user adopts a weak constant arg's dtype; a rebuilt graph keeps the
    dtypes the original had: ``constants`` is ``[(constant, dtype)]``."""
    for c, dtype in constants:
        if c.dtype != dtype:
            c._adopt(dtype)


def clone_graph(results, replace=None, values=None):
    """Copy the ops ``results`` need; returns ``{original op: copy}``.

    Placeholders and Variables (storage) are shared, not copied, and so are ops that
    are keys of ``replace`` (``{op: stand-in}``): the copy uses the stand-in and does not
    look into the op. The original graph is not changed. Each copy is built by
    :func:`rebuild` from the op's ``attrs`` (through ``values``, if given).
    """
    mapping = dict(replace or {})
    order = graph_ops(results, stop=mapping, initializers=False)
    weak, copied = [], []
    for op in order:
        if op in mapping:
            continue
        if isinstance(op, og.AssignableTensorOp) and not op.is_constant:
            mapping[op] = op
            continue
        if isinstance(op, og.Output):  # the copy of its op already made it
            mapping[op] = mapping[og.snap(op.args[0])].outputs[op.index]
            continue
        new = rebuild(op, [mapping[og.snap(a)] for a in op.args],
                      [mapping[og.snap(d)] for d in op.other_deps], mapping, values)
        if op._initializers:
            new.initializers = op._initializers
        mapping[op] = new
        copied.append(op)
        if isinstance(new, og.Constant) and new.weak:
            weak.append((new, op.dtype))
    for op in copied:
        if isinstance(op, og.TensorOp) and op.schema is not None:
            mapping[op].schema = copy_schema(op.schema, mapping, mapping[op])
    restore_weak(weak)
    return mapping


_DEFAULTS = weakref.WeakKeyDictionary()   # class -> defaults; does not keep classes


def signature_defaults(cls):
    """``{parameter: default}`` of ``cls``'s constructor (for printing non-defaults)."""
    found = _DEFAULTS.get(cls)
    if found is None:
        try:
            params = inspect.signature(cls).parameters.values()
        except (TypeError, ValueError):
            params = ()
        found = _DEFAULTS[cls] = {p.name: p.default for p in params
                                  if p.default is not p.empty}
    return found
