"""The core of the op graph: ``Op``, ``TensorOp`` and its dtype and axes protocol, weak
(Python-number) constants, the storage ops (``Placeholder``, ``Variable``, ``Constant``,
``SetItem``), the keyword checks and the graph walk.

Every op keeps named-axes semantics: its ``axes`` say what each dimension of its value
means, in row-major order. High-level ("Axes") ops match operands by axis name; the
semi-primitive ops in :mod:`geon.op_graph.primitives` interpret their operands by
position, and lowering only ever produces them in forms where both readings agree.

The op vocabulary is in modules by family, each with its rules (derivatives, reference
value) beside its classes: :mod:`~geon.op_graph.core_ops` (the ops the engines build:
sums, broadcasts, reorders), :mod:`~geon.op_graph.elementwise`,
:mod:`~geon.op_graph.reductions`, :mod:`~geon.op_graph.shaping`; and beyond the Axes
core, :mod:`~geon.op_graph.primitives`, :mod:`~geon.op_graph.nn_ops` and the others.
:mod:`geon.op_graph.op_graph` gathers the core and the Axes vocabulary in one namespace.
"""

import math
import numbers
import os
import weakref
from typing import Any, Iterable, Optional, Union, overload

import numpy as np

from geon.errors import (ArgumentError, AxisMismatchError, FeedError, GeonError,
                         InvalidValueError, TruthValueError)
from geon.op_graph import nodes
from geon.op_graph.axes import NO_AXES, Axes, AxesLike, as_axes, check_lengths, note_users
from geon.op_graph.domain_values import Domain, as_domain, check_dtype
from geon.op_graph.keywords import _accepted, _unknown_keywords, keywords
from geon.op_graph.nodes import Node, OrderedSet, user_location
from geon.op_graph.tables import primitive

#: The names ``og`` (:mod:`geon.op_graph.op_graph`) re-exports, helpers among them.
__all__ = [
    "_arrays_as_constants", "as_op", "as_op_list", "AssignableTensorOp",
    "ComputationOp", "Constant", "constant", "DEFAULT_DTYPE", "DTypeLike",
    "_family_hook", "FAMILY_HOOKS", "_fmt", "Invalid", "_Invalid", "_mismatch", "Op",
    "Placeholder", "placeholder", "require_valid", "result_dtype", "SetItem", "_short",
    "snap", "TensorLike", "TensorOp", "toposort", "Variable", "VoidOp",
    "_weak_constant", "weak_number", "_WEAK_NUMBERS",
]
DEFAULT_DTYPE = np.dtype(np.float32)

#: Hooks of the other op families (NumPy, Simple Axes), keyed by name and installed by
#: :mod:`geon.op_graph.coercion`: ``"elementwise"`` (``fn(cls, args, kwargs) -> (args,
#: kwargs)``, run before an elementwise op is built), ``"dot"`` (``fn(a, b)``, checks the
#: operands of a dot), and ``"getitem"``, ``"matmul"``, ``"transpose"`` (``x[key]``,
#: ``x @ y`` and ``x.T`` of positional tensors).
FAMILY_HOOKS: dict[str, Any] = {}
#: What a ``dtype=`` argument accepts: anything :class:`numpy.dtype` takes (a name such
#: as ``"float32"``, a NumPy scalar type), or ``None`` for the default.
DTypeLike = Union[str, type, np.dtype, None]
#: The op classes behind TensorOp's operators (``x + y``, ``-x``, ``x < y``, ``abs(x)``)
#: and ``x.T``, by the name of the function they stand for (``"add"``, ...): the
#: modules that define them fill it in (:mod:`~geon.op_graph.elementwise`,
#: :mod:`~geon.op_graph.core_ops`), so this module needs none of them.
OPERATORS: dict[str, Any] = {}


def _family_hook(name, what):
    hook = FAMILY_HOOKS.get(name)
    if hook is None:
        raise ArgumentError(f"{what} is defined for NumPy-family tensors only (geon.np)")
    return hook


class _Invalid:
    """The ``forward`` of an op whose value a pass removed and nobody asked for."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self):
        return "Invalid"


Invalid = _Invalid()


@overload
def snap(op: "TensorOp") -> "TensorOp": ...
@overload
def snap(op: "Op") -> "Op": ...


def snap(op: "Op") -> "Op":
    """Follow ``forward`` from ``op`` to the live op that now computes its value.

    If the chain ends in :data:`Invalid`, ``op`` itself is returned; asking a
    transformer for its value then raises :class:`~geon.errors.InvalidValueError`.
    """
    cur = op
    while True:
        nxt = cur.forward
        if nxt is None:
            return cur
        if nxt is Invalid:
            return op
        cur = nxt


def require_valid(op: "Op") -> "Op":
    """``snap(op)``, raising :class:`InvalidValueError` if its value was removed."""
    s = snap(op)
    if s is op and op.forward is Invalid:
        raise InvalidValueError(f"the value of {op.name} ({type(op).__name__}, built at "
                                f"{op.file_info}) was removed by a pass; request it in "
                                f"a computation to keep it")
    return s


class Op(Node):
    """Base class of every op.

    Keywords: ``name``, ``tags`` (a set of labels for filtering), ``initializers``
    (ops run by the transformer's ``initialize``), ``follows`` (ops that must run
    first, added to ``other_deps``). Positional arguments are the op's args; Python
    numbers and NumPy arrays are coerced to :class:`Constant`.

    ``attrs`` names the op's static parameters: each is a keyword argument of the
    constructor and an attribute of the op holding that value, so that
    ``type(op)(*args, **op.attr_values(), name=..., tags=..., follows=...)`` builds an
    equivalent op. Equality (the CSE key), copying, printing and serialization are all
    derived from it (``geon.op_graph.params``). Values are immutable and of the types
    ``geon.op_graph.serialize`` encodes: ``None``, ``bool``, ``int``, ``float``,
    ``complex``, ``str``, tuples of these, ``slice``, :class:`Axis`, :class:`Axes`,
    ``np.dtype`` and NumPy arrays. ``axes`` and ``dtype`` are listed where the caller
    chooses them (otherwise they are inferred from the args).
    """

    attrs: tuple[str, ...] = ()
    #: The number of args the op takes (``None``: any; checked when it is built).
    arity: Optional[int] = None

    def __init__(self, *args: Any, name: Optional[str] = None,
                 tags: Union[str, Iterable[str], None] = None,
                 initializers: Optional[Iterable["Op"]] = None,
                 follows: Iterable["Op"] = (), **unknown: Any) -> None:
        if unknown:
            raise _unknown_keywords(type(self).__name__, unknown, _accepted(type(self)))
        if self.arity is not None and len(args) != self.arity:
            raise ArgumentError(f"{type(self).__name__} takes {self.arity} arg(s), got "
                                f"{len(args)}")
        all_ops = True
        for a in args:  # (a loop, not all(): this runs for every op built)
            if not isinstance(a, Op):
                all_ops = False
                break
        if all_ops:
            super().__init__(args, name=name, follows=follows)
        elif nodes._rewrite_stack:  # built by a pass: its ops take the rewritten op's site
            super().__init__(tuple([as_op(a) for a in args]), name=name, follows=follows)
        else:
            # Python numbers become Constants built at the user's line, as this op is:
            # find that line once for all of them
            nodes._site_stack.append(nodes.user_site())
            try:
                super().__init__(tuple([as_op(a) for a in args]), name=name,
                                 follows=follows)
            finally:
                nodes._site_stack.pop()
        if tags:
            # A string is one tag, not a set of characters.
            self._tags = {tags} if isinstance(tags, str) else set(tags)
        if initializers:
            self._initializers = list(initializers)

    # Most ops have no tags and no initializers: they share these empty defaults (fewer
    # objects per op for the garbage collector to scan) until they get their own.
    _tags: "set[str] | frozenset[str]" = frozenset()
    _initializers: "list[Op] | tuple[()]" = ()

    @property
    def tags(self) -> "set[str]":
        """The op's set of tags (strings); mutable."""
        t = self._tags
        if not isinstance(t, set):
            t = self._tags = set()
        return t

    @tags.setter
    def tags(self, value: Iterable[str]) -> None:
        self._tags = set(value)

    @property
    def initializers(self) -> "list[Op]":
        """The list of ops that ``initialize`` runs before the first computation."""
        i = self._initializers
        if not isinstance(i, list):
            i = self._initializers = []
        return i

    @initializers.setter
    def initializers(self, value: Iterable["Op"]) -> None:
        self._initializers = list(value)

    def __repr__(self):
        # ``<Tanh 'Tanh_3' (C:64, N:128) float32 @ model.py:12>``: the class, the name,
        # the value's type (tensor ops) and where the op was built. Defensive: it may be
        # shown for an op whose constructor failed half way.
        name = getattr(self, "name", None)
        return (f"<{type(self).__name__} {name!r}{self._repr_type()} @ "
                f"{self.short_site()}>")

    def _repr_type(self):
        return ""

    def short_site(self) -> str:
        """``file.py:line`` (the file's base name) of where the op was built."""
        filename = getattr(self, "filename", None)
        if filename is None:
            return "<unknown>"
        if filename.startswith("<"):  # <stdin>, <string>, <unknown>
            return filename if filename == "<unknown>" else f"{filename}:{self.lineno}"
        return f"{os.path.basename(filename)}:{self.lineno}"

    def __bool__(self):
        # ``if y < 0:`` would otherwise always run: an op is a graph node, its value is
        # only known when a computation runs.
        raise TruthValueError(
            f"{type(self).__name__} {self.name}{self._where()} has no truth value while "
            f"the graph is built (its value is known only when a computation runs): "
            f"`if y < 0:` does not test values. Compute with the comparison instead "
            f"(be.maximum(y, 0), y * (y > 0)); test whether a variable holds an op with "
            f"`x is not None`")

    def _no_numbers(self, what):
        # A symbolic value: no number exists until a computation runs.
        return TypeError(
            f"{what} cannot take {type(self).__name__} {self.name}{self._where()}: an op "
            f"is a symbolic value in a graph, with no numbers until a computation runs. "
            f"Get its value with be.evaluate(op) (NumPy reference evaluation; placeholders "
            f"fed as a dict: be.evaluate(op, {{x: array}})) or with a transformer's "
            f"computation: be.make_transformer('numpy').computation(op, x)(array)")

    def __array__(self, dtype=None, copy=None):
        # Without this NumPy would make a 0-d object array holding the op (np.asarray(op))
        raise self._no_numbers("np.asarray(op) / np.array(op)")

    def __float__(self):
        raise self._no_numbers("float(op)")

    def __int__(self):
        raise self._no_numbers("int(op)")

    def __complex__(self):
        raise self._no_numbers("complex(op)")

    def __index__(self):
        raise self._no_numbers("an index or size (operator.index(op))")

    def attr_values(self) -> dict[str, Any]:
        """``{name: value}`` of the op's static parameters (see ``attrs``)."""
        return {n: getattr(self, n) for n in self.attrs}

    def variables(self) -> list["Variable"]:
        """The trainable :class:`Variable` s this op's value depends on, in graph order."""
        return [op for op in toposort([self], deps=False)
                if isinstance(op, Variable) and op.trainable]

    def _where(self):
        return f" (built at {self.file_info})"


class VoidOp(Op):
    """An op run for its side effect; it has no value."""


class TensorOp(Op):
    """An op with a tensor value: ``axes`` and ``dtype`` (its tensor description).

    Subclasses infer ``axes`` and ``dtype`` from their args unless given.
    """

    def __init__(self, *args: Any, axes: Optional[AxesLike] = None,
                 dtype: "DTypeLike" = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.axes = as_axes(axes) if axes is not None else self._infer_axes()
        note_users(self.axes, self)  # the axes' lengths stay fixed while this op lives
        self.dtype = np.dtype(dtype) if dtype is not None else self._infer_dtype()
        weak = [a for a in self.args if getattr(a, "weak", False)]
        if weak:
            self._adopt_weak(weak)

    def _adopt_weak(self, weak):
        """Give Python-number constants among the args the dtype of the other operands
        (NumPy's promotion), so ``x_int64 + 16777217`` stays exact. A constant another
        op already uses keeps its dtype; this op gets its own copy (a shared one, the
        shared constant of its dtype: :func:`weak_number`)."""
        promoted = self._promoted_args()
        target = result_dtype(promoted)
        if target.kind not in "iufc":
            return
        for a in weak:
            if not any(a is p for p in promoted):
                continue
            if a.dtype == target:
                continue
            if a._shared or any(u is not self for u in a.users):
                new = weak_number(a._number, target) if a._shared else Constant(
                    a._number, dtype=target, weak=True)
                self._args = tuple(new if x is a else x for x in self._args)
                a.users.discard(self)
                new.users.add(self)
            else:
                a._adopt(target)

    def _promoted_args(self):
        """The args whose dtypes make this op's dtype (all of them; ``where`` leaves out
        its condition): Python-number constants among them adopt it."""
        return self.args

    def _repr_type(self):
        axes, dtype = getattr(self, "axes", None), getattr(self, "dtype", None)
        if axes is None:
            return ""
        return f" ({', '.join(repr(a) for a in axes)}) {dtype}"

    def _infer_axes(self):
        return NO_AXES

    def _infer_dtype(self):
        return result_dtype(self.args)

    @property
    def shape(self) -> tuple[int, ...]:
        """The row-major shape (lengths of ``axes``)."""
        return self.axes.shape

    # Set by helpers such as softmax() whose result has a known structure.
    schema: Any = None
    #: Whether this is a Python-number constant that takes its dtype from the other
    #: operands (see :class:`Constant`).
    weak: bool = False
    __array_ufunc__ = None  # ``array + op`` builds an op (NumPy defers to __radd__)

    # Magic methods build ops (the classes of OPERATORS); ``==`` and ``!=`` stay
    # identity so ops can live in sets.
    def __add__(self, o): return OPERATORS["add"](self, o)
    def __radd__(self, o): return OPERATORS["add"](o, self)
    def __sub__(self, o): return OPERATORS["subtract"](self, o)
    def __rsub__(self, o): return OPERATORS["subtract"](o, self)
    def __mul__(self, o): return OPERATORS["multiply"](self, o)
    def __rmul__(self, o): return OPERATORS["multiply"](o, self)
    def __truediv__(self, o): return OPERATORS["divide"](self, o)
    def __rtruediv__(self, o): return OPERATORS["divide"](o, self)
    def __pow__(self, o): return OPERATORS["power"](self, o)
    def __rpow__(self, o): return OPERATORS["power"](o, self)
    def __neg__(self): return OPERATORS["negative"](self)
    def __abs__(self): return OPERATORS["absolute"](self)
    def __lt__(self, o): return OPERATORS["less"](self, o)
    def __le__(self, o): return OPERATORS["less_equal"](self, o)
    def __gt__(self, o): return OPERATORS["greater"](self, o)
    def __ge__(self, o): return OPERATORS["greater_equal"](self, o)
    __hash__ = Op.__hash__

    # NumPy-family tensors (positional axes) index, multiply and transpose like arrays.
    def __getitem__(self, key): return _family_hook("getitem", "x[key]")(self, key)
    def __matmul__(self, o): return _family_hook("matmul", "x @ y")(self, o)
    def __rmatmul__(self, o): return _family_hook("matmul", "x @ y")(o, self)

    @property
    def T(self) -> "TensorOp":
        """The axes in reverse order; for a NumPy-family tensor, its transpose."""
        hook = FAMILY_HOOKS.get("transpose")
        t = hook(self) if hook is not None else None
        if t is None:
            t = OPERATORS["axes_with_order"](self, Axes(reversed(tuple(self.axes))))
        return t


#: A tensor operand: an op, or a Python or NumPy number (made a :class:`Constant`).
TensorLike = Union[TensorOp, int, float, np.generic]


class ComputationOp(TensorOp):
    """A tensor op that computes a new value from its args (not storage, not a view);
    its ``dtype`` may be chosen by the caller."""

    attrs: tuple[str, ...] = ("dtype",)


def result_dtype(args):
    """NumPy's promotion over args where weak (Python-number) constants only decide the
    kind: a Python float with integer tensors gives float64, as in NumPy."""
    strong = [a.dtype for a in args
              if isinstance(a, TensorOp) and not getattr(a, "weak", False)]
    if not strong:
        return DEFAULT_DTYPE
    dt = strong[0]
    if len(strong) > 1 and strong.count(dt) != len(strong):  # (equal dtypes: no call)
        dt = np.result_type(*strong)
    if dt.kind in "iub" and any(getattr(a, "weak", False) and isinstance(
            a._number, float) for a in args):
        return np.result_type(dt, np.float64)
    return dt


#: ``(type, number, sign, dtype) -> Constant``: the weak constants :func:`weak_number`
#: shares, held while some op uses them
_WEAK_NUMBERS: "weakref.WeakValueDictionary[tuple, Constant]" = \
    weakref.WeakValueDictionary()


def weak_number(number: Union[int, float], dtype: "np.dtype" = DEFAULT_DTYPE) -> "Constant":
    """The weak constant of Python ``int`` or ``float`` ``number`` with ``dtype``,
    shared by every op that uses that number: ``y * 1.0001`` repeated along a chain
    builds one constant, not one per op, so building and CSE do no work per use. A
    shared constant is never changed: an op of another dtype gets the one of its own
    dtype (see :meth:`TensorOp._adopt_weak`). It keeps the name and source line of
    where it was first built; tags set on it reach every use (``be.constant`` builds an
    unshared one).

    Built while a pass or ``deriv`` rewrites an op, a constant takes that op's
    ordering deps and source (see ``geon.op_graph.nodes.rewriting``): there, and for
    a constant that got them from another thread's rewrite, the constant is the
    caller's own, never shared."""
    if nodes._rewrite_stack:
        return _weak_constant(number, dtype)
    # -0.0 == 0.0 (kept apart by the sign)
    key = (type(number), number, math.copysign(1.0, number), dtype)
    c = _WEAK_NUMBERS.get(key)
    if c is None or c.forward is not None:
        c = _weak_constant(number, dtype)
        if c.other_deps or c.derived_from is not None:
            return c
        c._shared = True
        _WEAK_NUMBERS[key] = c
    return c


def _weak_constant(number, dtype):
    return Constant(number) if dtype == DEFAULT_DTYPE else Constant(
        number, dtype=dtype, weak=True)


def as_op(value: Any) -> "TensorOp":
    """Return ``value`` if it is an op; wrap numbers and arrays in a :class:`Constant`
    (a Python ``int`` or ``float`` in a user's expression in a shared one, see
    :func:`weak_number`)."""
    if isinstance(value, Op):
        return value  # type: ignore[return-value]  # a void op passes through too
    if type(value) is float or type(value) is int:
        return weak_number(value)
    if isinstance(value, (numbers.Number, np.number, np.bool_)):
        return Constant(value)
    if isinstance(value, np.ndarray) and value.ndim == 0:
        return Constant(value[()], dtype=value.dtype)
    if isinstance(value, np.ndarray):
        raise ArgumentError(f"cannot tell the axes of a NumPy array of shape "
                            f"{value.shape} here; wrap it in be.Constant(array, axes=...) "
                            f"(at {user_location()})")
    raise ArgumentError(f"cannot use {type(value).__name__} {value!r} here as an op; wrap "
                        f"arrays in be.Constant(array, axes=...) (at {user_location()})")


def _arrays_as_constants(args, what):
    """Give each array in ``args`` the axes of the first op arg of the same shape."""
    ops = [a for a in args if isinstance(a, Op)]
    out = []
    for a in args:
        if isinstance(a, np.ndarray) and a.ndim:
            like = next((o for o in ops if isinstance(o, TensorOp) and
                         o.axes.lengths_known and o.axes.shape == a.shape), None)
            if like is None:
                raise AxisMismatchError(
                    f"{what}: cannot tell the axes of an array of shape {a.shape} (no "
                    f"operand has that shape: "
                    + "; ".join(f"{o.name} ({_fmt(o.axes)})" for o in ops)
                    + f"); wrap it in be.Constant(array, axes=...) (at {user_location()})")
            a = Constant(a, axes=like.axes)
        out.append(a)
    return out


def as_op_list(ops: Any, what: str) -> "tuple[list[Any], bool]":
    """``(list of ops, single)`` for an op or a list / tuple of ops; ``single`` says an
    op was given (callers then return one value, not a list). ``what`` names the
    argument in the error for something that is not an op."""
    single = isinstance(ops, Op)
    ops = [ops] if single else list(ops)
    for op in ops:
        if not isinstance(op, Op):
            raise ArgumentError(f"{what} must be ops, not {type(op).__name__} {op!r}")
    return ops, single


# --- graph walks -----------------------------------------------------------------------

def toposort(roots: Iterable[Any], deps: bool = True, extra: Any = None,
             children: Any = None) -> list[Any]:
    """All ops reachable from ``roots`` (through args, and other_deps if ``deps``),
    each after everything it depends on; iterative, linear, deterministic.

    ``extra`` maps an op to further ops that must come before it; ``children(op)``, if
    given, replaces both rules. A cycle raises.
    """
    if children is None and (extra or not deps):
        def children(op):
            kids = op.all_deps() if deps else op.args
            more = extra.get(op) if extra else None
            return kids + tuple(more) if more else kids

    order, done, onstack = [], set(), set()
    stack = []
    for root in roots:
        stack.append((None, iter((root,))))
        while stack:
            op, it = stack[-1]
            for child in it:
                if child in onstack:
                    raise GeonError(f"dependency cycle through {child.name} "
                                    f"({type(child).__name__}, built at {child.file_info})")
                if child not in done:
                    onstack.add(child)
                    if children is None:  # args and other_deps (all_deps, inlined:
                        od = child.other_deps._d  # passes sort whole graphs often)
                        kids = child._args + tuple(od) if od else child._args
                    else:
                        kids = children(child)
                    stack.append((child, iter(kids)))
                    break
            else:
                stack.pop()
                if op is not None:
                    onstack.discard(op)
                    done.add(op)
                    order.append(op)
    return order


# --- storage ---------------------------------------------------------------------------

class AssignableTensorOp(TensorOp):
    """A tensor with storage: placeholders, variables and constants.

    Flags: ``is_input`` (written before a computation: placeholders), ``persistent``
    (kept between computations and saved), ``trainable`` (found by ``variables()``).
    """

    is_input = False
    persistent = False
    trainable = False
    is_constant = False


@primitive
class Placeholder(AssignableTensorOp):
    """A tensor whose value is passed in when a computation is called (marked ``in``).

    ``domain`` (integer dtypes only) declares the values it may be fed: an int ``n``
    (``0 <= v < n``), a ``range`` of step 1, or a ``Domain`` (from
    ``geon.op_graph.domains``) with allowed extra values (an ``ignore_index``);
    computations check each feed against it when called and raise ``DomainError``. See
    :meth:`set_domain` and the guide's "Value domains of integer placeholders"."""

    is_input = True
    attrs = ("axes", "dtype", "domain")
    #: attrs a serialized graph holds only when they differ from the constructor's
    #: default (documents written before them still load)
    optional_attrs = ("domain",)
    domain = None

    def __init__(self, axes: AxesLike, dtype: DTypeLike = None, domain: Any = None,
                 **kwargs: Any) -> None:
        super().__init__(axes=as_axes(axes), dtype=dtype or DEFAULT_DTYPE, **kwargs)
        self.tags.add("in")
        if domain is not None:
            check_dtype(self.dtype, self.name, f"built at {self.file_info}")
            self.domain = as_domain(domain, f"placeholder {self.name}")

    def set_domain(self, stop: Optional[int], *, start: int = 0,
                   allow: Iterable[int] = ()) -> "Placeholder":
        """Declare the values this integer placeholder may be fed: ``start <= v <
        stop``, and those in ``allow`` (``stop=None``: any). Computations built
        afterwards check their feeds for it; returns the placeholder. The same as
        ``geon.op_graph.domains.set_domain``."""
        if stop is None:
            self.domain = None
            return self
        check_dtype(self.dtype, self.name, f"built at {self.file_info}")
        self.domain = Domain(start, stop, allow)
        return self

    def as_feed(self, value: Any, shape: Optional[tuple[int, ...]] = None) -> np.ndarray:
        """``value`` as an array of this placeholder's shape (or ``shape``: a binding's)
        and dtype, or a :class:`FeedError` naming the placeholder and what was passed."""
        shape, dtype = shape or self.axes.shape, self.dtype
        try:
            a = np.asarray(value)
        except (TypeError, ValueError) as e:  # a ragged list
            raise FeedError(f"placeholder {self.name}: cannot make an array of shape "
                            f"{shape} from {_short(value)}: {e}") from None
        if a.dtype == object:  # a dict, None, a list of arrays ...: say what it was
            raise FeedError(f"placeholder {self.name} expects an array of axes "
                            f"({_fmt(self.axes)}) i.e. shape {shape}; got {_short(value)}")
        if a.shape != shape:
            raise FeedError(f"placeholder {self.name} expects axes ({_fmt(self.axes)}) "
                            f"i.e. shape {shape}; got shape {a.shape}")
        if a.dtype != dtype:
            if not np.can_cast(a.dtype, dtype, "same_kind"):
                raise FeedError(f"placeholder {self.name} has dtype {dtype}; cannot "
                                f"safely convert {a.dtype} to it")
            a = a.astype(dtype)
        return a


def _short(value, limit=60):
    """``value``'s type and a repr of at most ``limit`` characters."""
    text = repr(value)
    return f"{type(value).__name__} " + (text if len(text) <= limit else text[:limit] + "...")


@keywords({"shape": "give axes= (be.Axis objects; be.np.placeholder takes a shape)"})
def placeholder(axes: AxesLike, dtype: DTypeLike = None, name: Optional[str] = None,
                domain: Any = None, **kwargs: Any) -> Placeholder:
    """A tensor with ``axes`` fed at call time. ``dtype`` defaults to float32.

    ``domain`` (integer dtypes): the values it may be fed, checked at each call: ``n``
    for ``0 <= v < n`` (class labels), ``range(start, stop)``, or
    ``Domain(n, allow=(-100,))`` (from ``geon.op_graph.domains``) to also accept an
    ``ignore_index``. A placeholder read as ``one_hot`` labels or ``gather`` indices
    gets the axis's range in each computation without it (doc/building_graphs.rst)."""
    return Placeholder(axes, dtype=dtype, name=name, domain=domain, **kwargs)


@primitive
class Variable(AssignableTensorOp):
    """Persistent, trainable state.

    Args:
        axes: the variable's axes.
        initial_value: a number (fills the tensor), an array with the axes' shape, or a
            callable ``f(shape) -> array`` called by ``initialize``. Default 0.
        dtype: default float32.
        trainable: whether ``variables()`` reports it (default True).
        persistent: whether ``save`` / ``restore`` include it (default True).
    """

    attrs = ("axes", "dtype", "initial_value", "trainable", "persistent")

    def __init__(self, axes: Optional[AxesLike] = None, initial_value: Any = 0,
                 dtype: DTypeLike = None, trainable: bool = True,
                 persistent: bool = True, **kwargs: Any) -> None:
        super().__init__(axes=as_axes(axes), dtype=dtype or DEFAULT_DTYPE, **kwargs)
        self.trainable = bool(trainable)
        self.persistent = bool(persistent)
        if not callable(initial_value):
            if not isinstance(initial_value, (numbers.Number, np.ndarray)):
                initial_value = np.asarray(initial_value)  # a list: keep an array
            arr = np.asarray(initial_value)
            if arr.ndim and self.axes.lengths_known and arr.shape != self.axes.shape:
                raise AxisMismatchError(
                    f"Variable {self.name}: initial value has shape {arr.shape} but axes "
                    f"{self.axes!r} need {self.axes.shape}{self._where()}")
            if arr.ndim and not np.can_cast(arr.dtype, self.dtype, "same_kind"):
                raise ArgumentError(f"Variable {self.name}: initial value of dtype "
                                    f"{arr.dtype} does not cast to {self.dtype}{self._where()}")
        self.initial_value = initial_value

    def initial_array(self) -> np.ndarray:
        """The initial value as an array of the variable's shape and dtype."""
        shape = self.axes.shape
        v = self.initial_value
        arr = np.asarray(v(shape) if callable(v) else v)
        if arr.ndim == 0:
            return np.full(shape, arr, dtype=self.dtype)
        if arr.shape != shape:
            raise AxisMismatchError(f"Variable {self.name}: initial value has shape "
                                    f"{arr.shape}, axes {self.axes!r} need {shape}{self._where()}")
        return np.array(arr, dtype=self.dtype, copy=True)


@primitive
class Constant(AssignableTensorOp):
    """A constant tensor: a number filling ``axes`` (default: a scalar) or an array
    whose shape matches ``axes``.

    A constant built from a Python number is *weak*: it takes the dtype of the tensors
    it is combined with, so ``0.01 * w`` stays float32 for a float32 ``w``. Given
    ``dtype=``, it is strong unless ``weak=True`` (a weak constant already adopted
    ``dtype``; the value must then be a Python number).
    """

    is_constant = True
    attrs = ("value", "axes", "dtype", "weak")
    #: Whether :func:`weak_number` shares this constant among ops (it never changes)
    _shared = False

    def __init__(self, value: Any, axes: Optional[AxesLike] = None,
                 dtype: DTypeLike = None, weak: bool = False, **kwargs: Any) -> None:
        if axes is None and dtype is None and (type(value) is float or type(value) is int):
            # a Python number in an expression (``x * 0.5``): the common case, made short
            self.weak = True
            super().__init__(axes=NO_AXES, dtype=DEFAULT_DTYPE, **kwargs)
            self._number = value
            self._adopt(DEFAULT_DTYPE)
            return
        axes = as_axes(axes)
        arr = np.asarray(value)
        number = arr.ndim == 0 and isinstance(value, numbers.Number) and not isinstance(
            value, np.generic)
        if weak and not number:
            raise TypeError(f"Constant: a weak constant's value is a Python number, not "
                            f"{value!r}")
        self.weak = number and (weak or dtype is None)
        if dtype is None:
            dtype = arr.dtype if (arr.dtype.kind in "iub" or arr.dtype.kind == "f"
                                  and not self.weak) else DEFAULT_DTYPE
            if self.weak and arr.dtype.kind in "iub":
                dtype = DEFAULT_DTYPE
        super().__init__(axes=axes, dtype=dtype, **kwargs)
        if arr.ndim and arr.shape != (axes.shape if axes.lengths_known else None):
            raise AxisMismatchError(f"Constant {self.name}: value has shape {arr.shape} "
                                    f"but axes {axes!r}{self._where()}")
        self._number = value
        self._adopt(self.dtype)

    def attr_values(self) -> dict[str, Any]:
        # A weak constant is rebuilt from its Python number (full precision, and int
        # or float decides promotion), not from the value it adopted.
        values = super().attr_values()
        if self.weak:
            values["value"] = self._number
        return values

    def _adopt(self, dtype):
        # A weak constant takes the dtype of the op that uses it, at full precision.
        self.dtype = np.dtype(dtype)
        self.value = np.array(self._number, dtype=self.dtype)
        self.value.setflags(write=False)
        # (kept: passes and code generation ask for it many times per constant)
        self._scalar = self.value[()] if self.value.ndim == 0 else None

    @property
    def scalar(self) -> Union[int, float, complex, bool, None]:
        """The fill value if the constant is one number everywhere, else ``None``."""
        return self._scalar

    def array(self) -> np.ndarray:
        """The constant's value with the full shape (read-only: a broadcast view, or the
        value itself when it has that shape)."""
        shape = self.axes.shape
        return self.value if self.value.shape == shape else np.broadcast_to(self.value, shape)


@keywords({"shape": "give axes= (the shape follows them)"})
def constant(value: Any, axes: Optional[AxesLike] = None, dtype: DTypeLike = None,
             name: Optional[str] = None) -> Constant:
    """Shorthand for :class:`Constant`."""
    return Constant(value, axes=axes, dtype=dtype, name=name)


class SetItem(VoidOp):
    """Assign ``value`` to the storage ``tensor``.

    ``value`` is broadcast to the tensor's axes by name. The SetItem becomes the
    tensor's ``user_deps``, so every op built afterwards that reads the tensor runs after
    it; reads built before it see the old value. ``sequence=False`` skips that (for
    assignments used as ``initializers``, which run only in ``initialize``).
    """

    def __init__(self, tensor: TensorOp, value: TensorLike, sequence: bool = True,
                 **kwargs: Any) -> None:
        if not isinstance(tensor, AssignableTensorOp) or tensor.is_constant:
            raise ArgumentError(f"SetItem needs a Variable or placeholder to assign to, not "
                                f"{tensor!r}")
        super().__init__(tensor, value, **kwargs)
        value = self.args[1]
        assert isinstance(value, TensorOp)
        extra = value.axes - tensor.axes
        if len(extra):
            raise AxisMismatchError(
                f"SetItem {self.name}: value axes ({_fmt(value.axes)}) include "
                f"{_fmt(extra)}, which tensor {tensor.name} ({_fmt(tensor.axes)}) lacks"
                f"{self._where()}")
        check_lengths([("tensor", tensor.axes), ("value", value.axes)],
                      f"SetItem {self.name}", self._where())
        if sequence:
            tensor.user_deps = OrderedSet([self])

    @property
    def tensor(self) -> TensorOp:
        return self.args[0]


def _fmt(axes: Any) -> str:
    return ", ".join(repr(a) for a in axes) or "scalar"


def _mismatch(op, what, args):
    return AxisMismatchError(
        f"{type(op).__name__} {op.name}: {what}; operands: "
        + "; ".join(f"{a.name} ({_fmt(a.axes)})" for a in args) + op._where())
