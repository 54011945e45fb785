"""Ops: the base classes, storage, SetItem, and the Axes family of tensor operations.

Every op keeps named-axes semantics: its ``axes`` say what each dimension of its value
means, in row-major order. High-level ("Axes") ops match operands by axis name; the
semi-primitive ops in :mod:`geon.op_graph.primitives` interpret their operands by
position, and lowering only ever produces them in forms where both readings agree.
"""

import builtins
import math
import numbers
import operator
import os
import weakref
from typing import Any, Iterable, Optional, Sequence, Union, overload

import numpy as np

import functools
import inspect

from geon.errors import (ArgumentError, AxisIndexError, AxisMismatchError, FeedError,
                         GeonError, InvalidValueError, TruthValueError)
from geon.op_graph.axes import (NO_AXES, Axes, AxesLike, Axis, FlattenedAxis, as_axes,
                                check_lengths, note_users)
from geon.op_graph import nodes
from geon.op_graph.nodes import Node, OrderedSet, user_location

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


def require_valid(op):
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

    # Magic methods build ops; ``==`` and ``!=`` stay identity so ops can live in sets.
    def __add__(self, o): return Add(self, o)
    def __radd__(self, o): return Add(o, self)
    def __sub__(self, o): return Subtract(self, o)
    def __rsub__(self, o): return Subtract(o, self)
    def __mul__(self, o): return Multiply(self, o)
    def __rmul__(self, o): return Multiply(o, self)
    def __truediv__(self, o): return Divide(self, o)
    def __rtruediv__(self, o): return Divide(o, self)
    def __pow__(self, o): return Power(self, o)
    def __rpow__(self, o): return Power(o, self)
    def __neg__(self): return Negative(self)
    def __abs__(self): return Absolute(self)
    def __lt__(self, o): return Less(self, o)
    def __le__(self, o): return LessEqual(self, o)
    def __gt__(self, o): return Greater(self, o)
    def __ge__(self, o): return GreaterEqual(self, o)
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
            t = axes_with_order(self, Axes(reversed(tuple(self.axes))))
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


# --- keyword checks ------------------------------------------------------------------
#: The keywords every op takes (see :class:`Op`).
OP_KEYWORDS = ("name", "tags", "initializers", "follows")


def _accepted(cls):
    """The keyword names the constructor of op class ``cls`` accepts, in MRO order."""
    names = []
    for k in cls.__mro__:
        init = k.__dict__.get("__init__")
        if init is None:
            continue
        for p in inspect.signature(init).parameters.values():
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self" \
                    and p.name not in names:
                names.append(p.name)
    return names


def _unknown_keywords(what, unknown, accepted, hints=None):
    """The :class:`ArgumentError` for keywords ``unknown`` given to ``what``."""
    k = next(iter(unknown))
    hint = (hints or {}).get(k)
    if hint is not None:
        return ArgumentError(f"{what} has no {k!r} keyword: {hint} (at {user_location()})")
    return ArgumentError(f"{what} has no {k!r} keyword; it takes "
                         f"{', '.join(accepted)} (at {user_location()})")


def keywords(hints=None):
    """Decorator for public op-building functions: a keyword the function does not
    take raises :class:`ArgumentError` naming it (with ``hints[keyword]``, the right
    keyword to use, where given) instead of reaching an op's constructor, where it
    could silently set something else (``axes=`` would set a result's axes). A
    function with ``**kw`` takes the keywords of every op (:data:`OP_KEYWORDS`)."""
    def decorate(fn):
        params = inspect.signature(fn).parameters.values()
        accepted = [p.name for p in params
                    if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        if any(p.kind is p.VAR_KEYWORD for p in params):
            accepted += [k for k in OP_KEYWORDS if k not in accepted]
        known = frozenset(accepted)

        @functools.wraps(fn)
        def checked(*args, **kw):
            for k in kw:
                if k not in known:
                    raise _unknown_keywords(f"be.{fn.__name__}", {k: kw[k]}, accepted,
                                            hints)
            return fn(*args, **kw)
        return checked
    return decorate


_REDUCE_HINTS = {
    "axes": "use reduction_axes= (the axes to reduce) or out_axes= (the axes to keep)",
    "axis": "use reduction_axes= (the Axis objects to reduce, not positions) or "
            "out_axes= (the axes to keep)",
    "keepdims": "the result has the out_axes=; put reduced axes back with be.broadcast",
}
_DOT_HINT = ("it sums over the axes its operands share and keeps the others (a's, "
             "then b's); rename an axis with be.cast_axes to keep it out of the sum, "
             "reorder the result with be.axes_with_order")
_DOT_HINTS = dict.fromkeys(("axes", "axis", "out_axes"), _DOT_HINT)


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


def as_op_list(ops, what):
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

def toposort(roots, deps=True, extra=None, children=None):
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
            from geon.op_graph.domains import as_domain, check_dtype
            check_dtype(self.dtype, self.name, f"built at {self.file_info}")
            self.domain = as_domain(domain, f"placeholder {self.name}")

    def set_domain(self, stop: Optional[int], *, start: int = 0,
                   allow: Iterable[int] = ()) -> "Placeholder":
        """Declare the values this integer placeholder may be fed: ``start <= v <
        stop``, and those in ``allow`` (``stop=None``: any). Computations built
        afterwards check their feeds for it; returns the placeholder. The same as
        ``geon.op_graph.domains.set_domain``."""
        from geon.op_graph.domains import set_domain
        return set_domain(self, stop, start=start, allow=allow)

    def as_feed(self, value: Any) -> np.ndarray:
        """``value``, fed for this placeholder, as an array of its shape and dtype, or a
        :class:`FeedError` naming the placeholder and saying what was passed."""
        shape, dtype = self.axes.shape, self.dtype
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


def value_of(tensor: TensorOp) -> TensorOp:
    """The value stored in ``tensor`` (a Variable or placeholder), read without the
    ordering after earlier assignments that reading ``tensor`` itself gets.

    An op built after ``SetItem(w, ...)`` that reads ``w`` runs after the assignment,
    so a computation of it runs the assignment too. An op that reads
    ``be.value_of(w)`` instead does not: in a computation without the assignment it
    reads what is stored (what the last call that assigned left there); in one with
    it, it reads the value from before the assignment, like an op built before it.
    Derivatives flow through it as through ``w``.
    """
    if not isinstance(tensor, AssignableTensorOp) or tensor.is_constant:
        raise ArgumentError(f"value_of needs a Variable or placeholder, not {tensor!r} "
                            f"(at {user_location()})")
    # A reordering that keeps the order: a view of the storage (it lowers to nothing)
    # that, unlike every op built with ``tensor`` as an arg, does not take the
    # tensor's user_deps.
    view = AxesWithOrder(tensor, tensor.axes, name=f"{tensor.name}_stored")
    for d in tensor.user_deps:
        view.other_deps.discard(d)
        d._dep_users.discard(view)
    return view


def _fmt(axes):
    return ", ".join(repr(a) for a in axes) or "scalar"


def _mismatch(op, what, args):
    return AxisMismatchError(
        f"{type(op).__name__} {op.name}: {what}; operands: "
        + "; ".join(f"{a.name} ({_fmt(a.axes)})" for a in args) + op._where())


# --- elementwise -----------------------------------------------------------------------

class ElementWise(ComputationOp):
    """Elementwise ops. Args are matched by axis name: the result has the first arg's
    axes followed by each later arg's axes that are not yet present.

    A NumPy array among the args takes the axes of the first op arg whose shape it has
    (``x + np.ones(3)`` for ``x`` with axes ``(C:3,)``); otherwise wrap it in
    :class:`Constant` with its axes.
    """

    def __init__(self, *args, **kwargs):
        hook = FAMILY_HOOKS.get("elementwise")
        if hook is not None:  # NumPy broadcasting, coercions between families
            args, kwargs = hook(type(self), args, kwargs)
        if any(isinstance(a, np.ndarray) and a.ndim for a in args):
            args = _arrays_as_constants(args, type(self).__name__)
        super().__init__(*args, **kwargs)

    def _infer_axes(self):
        args = self.args
        axes = args[0].axes
        for a in args:  # the common case: nothing to match
            if a.axes is not axes and len(a.axes):
                break
        else:
            return axes
        check_lengths([(a.name, a.axes) for a in args], f"{type(self).__name__} {self.name}",
                      self._where())
        for a in args[1:]:
            if a.axes != axes:
                axes = axes | a.axes
        return axes

    def compute_dtype(self):
        """The dtype the op computes in, the same in every backend and the reference.

        A floating-point result is computed in its own dtype, the operands converted
        first: ``reciprocal`` of an int32 is not integer division, ``-x`` of a uint8 does
        not wrap, ``sqrt`` of an int8 is not float16 arithmetic. An integer result is
        computed in the operands' promoted dtype and converted after, as NumPy does.
        """
        if self.dtype.kind in "fc" or not self.args:
            return self.dtype
        return np.result_type(*[a.dtype for a in self.args])


class UnaryElementWise(ElementWise):
    arity = 1

    def _infer_dtype(self):
        dt = self.args[0].dtype
        return dt if dt.kind in "fc" else DEFAULT_DTYPE


class BinaryElementWise(ElementWise):
    arity = 2


class Comparison(BinaryElementWise):
    """Comparisons give 1.0 where true and 0.0 where false, in the operands' float type."""

    def _infer_dtype(self):
        dt = result_dtype(self.args)
        return dt if dt.kind == "f" else DEFAULT_DTYPE

    def compute_dtype(self):
        """Operands compare in their promoted dtype (the result is only 1 or 0)."""
        return np.result_type(*[a.dtype for a in self.args])


class Add(BinaryElementWise): """``a + b``"""
class Subtract(BinaryElementWise): """``a - b``"""
class Multiply(BinaryElementWise): """``a * b``"""
class Maximum(BinaryElementWise): """``max(a, b)`` elementwise"""
class Minimum(BinaryElementWise): """``min(a, b)`` elementwise"""


class Divide(BinaryElementWise):
    """``a / b`` (true division)"""

    def _infer_dtype(self):
        dt = result_dtype(self.args)
        return dt if dt.kind in "fc" else DEFAULT_DTYPE


class Power(BinaryElementWise):
    """``a ** b``"""

    def _infer_dtype(self):
        dt = result_dtype(self.args)
        return dt if dt.kind in "fc" else DEFAULT_DTYPE


class Equal(Comparison): """``a == b``"""
class NotEqual(Comparison): """``a != b``"""
class Less(Comparison): """``a < b``"""
class LessEqual(Comparison): """``a <= b``"""
class Greater(Comparison): """``a > b``"""
class GreaterEqual(Comparison): """``a >= b``"""
class Negative(UnaryElementWise): """``-x``"""
class Absolute(UnaryElementWise): """``|x|``"""
class Sign(UnaryElementWise): """``sign(x)``: -1, 0 or 1"""
class Square(UnaryElementWise): """``x * x``"""
class Sqrt(UnaryElementWise): """``sqrt(x)``"""
class Reciprocal(UnaryElementWise): """``1 / x``"""
class Exp(UnaryElementWise): """``e ** x``"""
class Log(UnaryElementWise): """natural logarithm"""
class Sin(UnaryElementWise): """``sin(x)``"""
class Cos(UnaryElementWise): """``cos(x)``"""
class Tanh(UnaryElementWise): """``tanh(x)``"""
class Sigmoid(UnaryElementWise): """``1 / (1 + exp(-x))``"""


class Erf(UnaryElementWise):
    """The error function ``2/sqrt(pi) int_0^x exp(-t^2) dt`` (a semi-primitive: no
    composite of the others is accurate)."""

    attrs = ()


class Expm1(UnaryElementWise):
    """``exp(x) - 1``, accurate near 0 (a semi-primitive, as ``exp(x) - 1`` cancels)."""

    attrs = ()


class Softplus(UnaryElementWise):
    """``log(1 + exp(x))``, computed as ``max(x, 0) + log1p(exp(-|x|))``: accurate for
    any ``x`` (no overflow for large ``x``, no underflow to 0 for very negative ``x``);
    a semi-primitive, its derivative is ``sigmoid(x)``."""

    attrs = ()


def add(a: TensorLike, b: TensorLike) -> TensorOp: return Add(a, b)
def subtract(a: TensorLike, b: TensorLike) -> TensorOp: return Subtract(a, b)
def multiply(a: TensorLike, b: TensorLike) -> TensorOp: return Multiply(a, b)
def divide(a: TensorLike, b: TensorLike) -> TensorOp: return Divide(a, b)
def power(a: TensorLike, b: TensorLike) -> TensorOp: return Power(a, b)
def maximum(a: TensorLike, b: TensorLike) -> TensorOp: return Maximum(a, b)
def minimum(a: TensorLike, b: TensorLike) -> TensorOp: return Minimum(a, b)
def equal(a: TensorLike, b: TensorLike) -> TensorOp: return Equal(a, b)
def not_equal(a: TensorLike, b: TensorLike) -> TensorOp: return NotEqual(a, b)
def less(a: TensorLike, b: TensorLike) -> TensorOp: return Less(a, b)
def less_equal(a: TensorLike, b: TensorLike) -> TensorOp: return LessEqual(a, b)
def greater(a: TensorLike, b: TensorLike) -> TensorOp: return Greater(a, b)
def greater_equal(a: TensorLike, b: TensorLike) -> TensorOp: return GreaterEqual(a, b)
def negative(x: TensorLike) -> TensorOp: return Negative(x)
def absolute(x: TensorLike) -> TensorOp: return Absolute(x)
def sign(x: TensorLike) -> TensorOp: return Sign(x)
def square(x: TensorLike) -> TensorOp: return Square(x)
def sqrt(x: TensorLike) -> TensorOp: return Sqrt(x)
def reciprocal(x: TensorLike) -> TensorOp: return Reciprocal(x)
def exp(x: TensorLike) -> TensorOp: return Exp(x)
def log(x: TensorLike) -> TensorOp: return Log(x)
def sin(x: TensorLike) -> TensorOp: return Sin(x)
def cos(x: TensorLike) -> TensorOp: return Cos(x)
def tanh(x: TensorLike) -> TensorOp: return Tanh(x)
def erf(x: TensorLike) -> TensorOp: return Erf(x)
def expm1(x: TensorLike) -> TensorOp: return Expm1(x)
def softplus(x: TensorLike) -> TensorOp: return Softplus(x)


_ELEMENTWISE_HINTS = {
    "out": "an op computes a new tensor; write it into a Variable with be.SetItem(v, op)",
    "dtype": "the result's dtype follows the operands' (NumPy's promotion)",
}

for _f in (add, subtract, multiply, divide, power, maximum, minimum, equal, not_equal,
           less, less_equal, greater, greater_equal, negative, absolute, sign, square,
           sqrt, reciprocal, exp, log, sin, cos, tanh, erf, expm1, softplus):
    _f.__doc__ = "Elementwise " + _f.__name__ + " (operands matched by axis name)."
    globals()[_f.__name__] = keywords(_ELEMENTWISE_HINTS)(_f)


@keywords()
def sigmoid(x: TensorLike) -> TensorOp:
    """The logistic function; the result carries a schema that
    :func:`cross_entropy_binary` uses to compute from the logits."""
    from geon.op_graph.schemas import SigmoidSchema
    y = Sigmoid(x)
    y.schema = SigmoidSchema(as_op(x))
    return y


@keywords()
def safelog(x: TensorLike, limit: float = -50.0) -> TensorOp:
    """``log(max(x, exp(limit)))``: a logarithm that never returns ``-inf``. Where
    ``exp(limit)`` is below the smallest normal number of ``x``'s dtype (float16), the
    floor is that number instead (``exp(-50)`` would round to 0 there)."""
    x = as_op(x)
    floor = float(np.exp(limit))
    if x.dtype.kind == "f":
        floor = builtins.max(floor, float(np.finfo(x.dtype).tiny))
    return Log(Maximum(x, floor))


# --- dot -------------------------------------------------------------------------------

class Dot(ComputationOp):
    """Sum of products over the axes ``a`` and ``b`` share, except ``batch_axes``.

    The result has ``a``'s axes that are not summed over (its batch axes among them,
    in ``a``'s order) followed by ``b``'s axes that ``a`` lacks. Each batch axis must be
    an axis of both operands: the product is then taken separately for each index along
    it (a batched matrix product), where without ``batch_axes`` the shared axis would be
    summed over."""

    attrs = ("batch_axes", "dtype")

    def __init__(self, a, b, batch_axes=NO_AXES, **kwargs):
        hook = FAMILY_HOOKS.get("dot")
        if hook is not None:  # operands of other op families are refused
            hook(a, b)
        self.batch_axes = as_axes(batch_axes)
        super().__init__(a, b, **kwargs)

    def _infer_axes(self):
        a, b = self.args
        check_lengths([(a.name, a.axes), (b.name, b.axes)], f"Dot {self.name}", self._where())
        shared = a.axes & b.axes
        missing = self.batch_axes - shared
        if len(missing):
            raise _mismatch(self, f"batch_axes ({_fmt(missing)}) must be axes of both "
                                  f"operands", [a, b])
        check_lengths([("batch_axes", self.batch_axes), (a.name, a.axes)],
                      f"Dot {self.name}", self._where())
        # the batch axes in a's order: how they appear in the result
        self.batch_axes = a.axes & self.batch_axes
        return (a.axes - (shared - self.batch_axes)) + (b.axes - shared)

    @property
    def reduction_axes(self):
        """The axes summed over: those the operands share, less the batch axes."""
        return (self.args[0].axes & self.args[1].axes) - self.batch_axes


_DOT_SPLIT_HINT = "give batch_axes= (the shared axes to keep) or reduction_axes= (the " \
                  "shared axes to sum over), not both"


@keywords(_DOT_HINTS)
def dot(a: TensorLike, b: TensorLike, batch_axes: Optional[AxesLike] = None,
        reduction_axes: Optional[AxesLike] = None, **kwargs: Any) -> TensorOp:
    """Contract ``a`` and ``b`` over their shared axes (see ``Dot``).

    ``batch_axes=`` names shared axes to keep instead: the result has one product per
    index along them (a batched matrix product, ``np.matmul``'s leading dimensions).
    ``reduction_axes=`` says the same from the other side: the shared axes to sum over,
    every other shared axis being kept as a batch axis."""
    if reduction_axes is not None:
        if batch_axes is not None:
            raise ArgumentError(f"be.dot: {_DOT_SPLIT_HINT}")
        a, b = as_op(a), as_op(b)
        red = as_axes(reduction_axes)
        shared = a.axes & b.axes
        if len(red - shared):
            raise AxisMismatchError(
                f"Dot: reduction_axes ({_fmt(red - shared)}) must be axes of both "
                f"operands; operands: {a.name} ({_fmt(a.axes)}); {b.name} "
                f"({_fmt(b.axes)}) (built at {nodes.user_location()})")
        batch_axes = shared - red
    return Dot(a, b, batch_axes=NO_AXES if batch_axes is None else batch_axes, **kwargs)


# --- reductions ------------------------------------------------------------------------

class Reduction(ComputationOp):
    """Reduce ``x`` over ``reduction_axes``. By default every axis but the batch and
    recurrent ones is reduced; ``out_axes=`` (or ``axes=``, the result's axes) names the
    axes to keep (in that order)."""

    attrs = ("reduction_axes", "axes", "dtype")

    def __init__(self, x, reduction_axes=None, out_axes=None, axes=None, **kwargs):
        if axes is not None and out_axes is not None:
            raise TypeError(f"{type(self).__name__}: give out_axes or axes, not both")
        self._red_spec = reduction_axes
        self._out_spec = out_axes if axes is None else axes
        super().__init__(x, **kwargs)

    def _infer_axes(self):
        self.reduction_axes, out = reduction_split(
            self.args[0], self._red_spec, self._out_spec, self)
        del self._red_spec, self._out_spec
        return out


def reduction_split(x, red, out, op, default=None):
    """``(reduction axes in x's order, result axes)`` for reducing ``x`` with the given
    ``red`` / ``out`` (either may be ``None``; ``default`` is the reduction axes when both
    are: all but batch and recurrent axes unless given). Errors name ``op``."""
    if red is not None and out is not None:
        red, out = as_axes(red), as_axes(out)
        if not (red + out).same_set(x.axes):
            raise _mismatch(op, f"reduction_axes ({_fmt(red)}) and out_axes "
                                f"({_fmt(out)}) must split the input's axes", [x])
    elif red is not None:
        red = as_axes(red)
        out = x.axes - red
    elif out is not None:
        out = as_axes(out)
        red = x.axes - out
    else:
        red = x.axes.sample_axes() if default is None else as_axes(default)
        out = x.axes - red
    missing = (red | out) - x.axes
    if len(missing):
        raise _mismatch(op, f"axes {_fmt(missing)} are not in the input", [x])
    check_lengths([("input", x.axes), ("reduction/out axes", red + out)],
                  f"{type(op).__name__} {op.name}", op._where())
    return x.axes & red, out


class Sum(Reduction): """Sum over the reduction axes."""
class Prod(Reduction): """Product over the reduction axes."""
class Max(Reduction): """Maximum over the reduction axes."""
class Min(Reduction): """Minimum over the reduction axes."""


class ArgMax(Reduction):
    """Index (row-major over the reduction axes) of the maximum; int64."""

    def _infer_dtype(self):
        return np.dtype(np.int64)


class ArgMin(ArgMax):
    """Index (row-major over the reduction axes) of the minimum; int64."""


@keywords(_REDUCE_HINTS)
def sum(x: TensorLike,  # noqa: A001 - the public name
        reduction_axes: Optional[AxesLike] = None, out_axes: Optional[AxesLike] = None,
        **kw: Any) -> TensorOp:
    """Sum (see ``Reduction`` for the axes rule)."""
    return Sum(x, reduction_axes, out_axes, **kw)


@keywords(_REDUCE_HINTS)
def prod(x: TensorLike, reduction_axes: Optional[AxesLike] = None,
         out_axes: Optional[AxesLike] = None, **kw: Any) -> TensorOp:
    """Product (see ``Reduction``)."""
    return Prod(x, reduction_axes, out_axes, **kw)


@keywords(_REDUCE_HINTS)
def max(x: TensorLike, reduction_axes: Optional[AxesLike] = None,
        out_axes: Optional[AxesLike] = None, **kw: Any) -> TensorOp:  # noqa: A001
    """Maximum (see ``Reduction``)."""
    return Max(x, reduction_axes, out_axes, **kw)


@keywords(_REDUCE_HINTS)
def min(x: TensorLike, reduction_axes: Optional[AxesLike] = None,
        out_axes: Optional[AxesLike] = None, **kw: Any) -> TensorOp:  # noqa: A001
    """Minimum (see ``Reduction``)."""
    return Min(x, reduction_axes, out_axes, **kw)


@keywords(_REDUCE_HINTS)
def argmax(x: TensorLike, reduction_axes: Optional[AxesLike] = None,
           out_axes: Optional[AxesLike] = None, **kw: Any) -> TensorOp:
    """Index of the maximum (see ``Reduction``)."""
    return ArgMax(x, reduction_axes, out_axes, **kw)


@keywords(_REDUCE_HINTS)
def argmin(x: TensorLike, reduction_axes: Optional[AxesLike] = None,
           out_axes: Optional[AxesLike] = None, **kw: Any) -> TensorOp:
    """Index of the minimum (see ``Reduction``)."""
    return ArgMin(x, reduction_axes, out_axes, **kw)


@keywords(_REDUCE_HINTS)
def tensor_size(x: TensorLike, reduction_axes: Optional[AxesLike] = None,
                out_axes: Optional[AxesLike] = None) -> TensorOp:
    """The number of elements a reduction of ``x`` with these axes combines, as an op."""
    return TensorSize(x, reduction_axes, out_axes)


@keywords(_REDUCE_HINTS)
def mean(x: TensorLike, reduction_axes: Optional[AxesLike] = None,
         out_axes: Optional[AxesLike] = None, **kw: Any) -> TensorOp:
    """Mean (see ``Reduction``)."""
    s = Sum(x, reduction_axes, out_axes)
    return Divide(s, TensorSize(x, s.reduction_axes, None), **kw)  # kw name the mean


@keywords(_REDUCE_HINTS)
def variance(x: TensorLike, reduction_axes: Optional[AxesLike] = None,
             out_axes: Optional[AxesLike] = None, **kw: Any) -> TensorOp:
    """Population variance, ``mean((x - mean(x))**2)`` (see ``Reduction``)."""
    m = mean(x, reduction_axes, out_axes)
    d = x - m
    return mean(d * d, m.args[0].reduction_axes, m.axes, **kw)


class TensorSize(ComputationOp):
    """The element count of ``x`` over its reduction axes (a scalar, folded to a
    constant when the graph is transformed)."""

    attrs = ("reduction_axes", "dtype")

    def __init__(self, x, reduction_axes=None, out_axes=None, **kwargs):
        super().__init__(x, axes=(), **kwargs)
        x = self.args[0]  # by default the size of all of x
        self.reduction_axes, _ = reduction_split(x, reduction_axes, out_axes, self,
                                                 default=x.axes)

    def _infer_dtype(self):
        return DEFAULT_DTYPE


# --- shaping ---------------------------------------------------------------------------

class Broadcast(TensorOp):
    """``x`` repeated along ``axes`` it lacks; the result has exactly ``axes``."""

    attrs = ("axes",)

    def __init__(self, x, axes, **kwargs):
        super().__init__(x, axes=as_axes(axes), **kwargs)
        x = self.args[0]
        if len(x.axes - self.axes):
            raise _mismatch(self, f"cannot broadcast to ({_fmt(self.axes)})", [x])
        check_lengths([("input", x.axes), ("target", self.axes)], f"Broadcast {self.name}",
                      self._where())

    def _infer_dtype(self):
        return self.args[0].dtype


@keywords()
def broadcast(x: TensorLike, axes: AxesLike) -> TensorOp:
    """Repeat ``x`` along the axes of ``axes`` it lacks, in the order ``axes`` gives."""
    return Broadcast(x, axes)


class AxesWithOrder(TensorOp):
    """``x`` with its axes put in the order ``axes`` gives (a transpose)."""

    attrs = ("axes",)

    def __init__(self, x, axes, **kwargs):
        super().__init__(x, axes=as_axes(axes), **kwargs)
        x = self.args[0]
        if not self.axes.same_set(x.axes):
            raise _mismatch(self, f"({_fmt(self.axes)}) is not a reordering of the input", [x])

    def _infer_dtype(self):
        return self.args[0].dtype


@keywords()
def axes_with_order(x: TensorLike, axes: AxesLike) -> TensorOp:
    """Reorder the axes of ``x`` (the same set of axes in a new order)."""
    return AxesWithOrder(x, axes)


class CastAxes(TensorOp):
    """``x`` with its axes renamed, position by position; lengths must match."""

    attrs = ("axes",)

    def __init__(self, x, axes, **kwargs):
        super().__init__(x, axes=as_axes(axes), **kwargs)
        x = self.args[0]
        if len(self.axes) != len(x.axes) or (
                self.axes.lengths_known and x.axes.lengths_known
                and self.axes.lengths != x.axes.lengths):
            raise _mismatch(self, f"cannot cast to ({_fmt(self.axes)}): lengths differ", [x])

    def _infer_dtype(self):
        return self.args[0].dtype


@keywords()
def cast_axes(x: TensorLike, axes: AxesLike) -> TensorOp:
    """Give the axes of ``x`` new names (``axes`` position by position)."""
    return CastAxes(x, axes)


class Flatten(TensorOp):
    """``x`` with consecutive axes merged into :class:`FlattenedAxis` es."""

    attrs = ("axes",)

    def __init__(self, x, axes, **kwargs):
        super().__init__(x, axes=as_axes(axes), **kwargs)
        x = self.args[0]
        parts = []
        for a in self.axes:
            parts.extend(a.axes if isinstance(a, FlattenedAxis) else (a,))
        if tuple(p.name for p in parts) != x.axes.names:
            raise _mismatch(self, f"({_fmt(self.axes)}) does not flatten the input's axes "
                                  f"in order", [x])

    def _infer_dtype(self):
        return self.args[0].dtype


@keywords()
def flatten(x: TensorLike, groups: Optional[Sequence[AxesLike]] = None) -> TensorOp:
    """Merge axes of ``x``. ``groups`` lists, in order, Axes (merged into one
    :class:`FlattenedAxis`) or single axes; by default all axes become one."""
    x = as_op(x)
    if groups is None:
        groups = [x.axes]
    out = []
    for g in groups:
        out.append(g if isinstance(g, Axis) else
                   (FlattenedAxis(g) if len(as_axes(g)) != 1 else as_axes(g)[0]))
    return Flatten(x, Axes(out))


class Unflatten(TensorOp):
    """Undo :func:`flatten`: every :class:`FlattenedAxis` becomes its parts again."""

    def __init__(self, x, **kwargs):
        super().__init__(x, **kwargs)

    def _infer_axes(self):
        parts = []
        for a in self.args[0].axes:
            parts.extend(a.axes if isinstance(a, FlattenedAxis) else (a,))
        return Axes(parts)

    def _infer_dtype(self):
        return self.args[0].dtype


@keywords()
def unflatten(x: TensorLike) -> TensorOp:
    """Split every flattened axis of ``x`` back into its parts."""
    return Unflatten(x)


class Slice(TensorOp):
    """``x`` restricted along ``axis`` by a Python slice or an index.

    An index removes the axis; a slice replaces it with a new axis named
    ``new_axis`` (default ``"<name>[start:stop:step]"``) of the sliced length.
    """

    attrs = ("axis", "key", "new_axis")

    def __init__(self, x, axis, key, new_axis=None, **kwargs):
        x = as_op(x)
        if axis not in x.axes:
            raise AxisMismatchError(f"Slice: axis {axis!r} is not in {x.name} "
                                    f"({_fmt(x.axes)}) (at {user_location()})")
        pos = x.axes.index(axis)
        axis = x.axes[pos]
        if isinstance(key, slice):
            n = len(range(*key.indices(axis.length)))
            if new_axis is None:
                s = ":".join("" if v is None else str(v) for v in (key.start, key.stop, key.step))
                new_axis = Axis(n, f"{axis.name}[{s}]", axis.batch, axis.recurrent)
            elif new_axis.length is None:
                new_axis.length = n
            elif new_axis.length != n:
                raise AxisMismatchError(f"Slice: new axis {new_axis!r} but the slice of "
                                        f"{x.name} ({_fmt(x.axes)}) has {n} entries (at "
                                        f"{user_location()})")
            out = Axes(tuple(x.axes)[:pos] + (new_axis,) + tuple(x.axes)[pos + 1:])
        else:
            key = int(key)
            if not -axis.length <= key < axis.length:
                raise AxisIndexError(f"Slice: index {key} is out of range for axis "
                                     f"{axis!r} of {x.name} ({_fmt(x.axes)}) (at "
                                     f"{user_location()})")
            key %= axis.length
            out = x.axes - Axes(axis)
            new_axis = None
        self.axis_pos, self.key = pos, key
        self.axis, self.new_axis = axis, new_axis
        super().__init__(x, axes=out, **kwargs)

    def _infer_dtype(self):
        return self.args[0].dtype


@keywords()
def slice_along_axis(x: TensorLike, axis: Axis, key: Union[int, slice],
                     new_axis: Optional[Axis] = None) -> TensorOp:
    """Take ``key`` (a slice or an int) of ``x`` along ``axis`` (see ``Slice``)."""
    return Slice(x, axis, key, new_axis)


class OneHot(TensorOp):
    """``one_hot(x, axis)``: 1.0 where ``axis``'s index equals the value of ``x``."""

    attrs = ("axis", "dtype")

    def __init__(self, x, axis, dtype=None, **kwargs):
        self.axis = axis
        super().__init__(x, dtype=dtype or DEFAULT_DTYPE, **kwargs)

    def _infer_axes(self):
        x = self.args[0]
        if self.axis in x.axes:
            raise _mismatch(self, f"axis {self.axis!r} is already in the input", [x])
        return Axes(self.axis) + x.axes


@keywords()
def one_hot(x: TensorLike, axis: Axis, dtype: DTypeLike = None) -> TensorOp:
    """One-hot encode integer labels ``x`` along the new axis ``axis`` (first)."""
    return OneHot(x, axis, dtype=dtype)


class StopGradient(TensorOp):
    """The value of ``x``; derivatives do not flow through it."""

    arity = 1

    def _infer_axes(self):
        return self.args[0].axes

    def _infer_dtype(self):
        return self.args[0].dtype


@keywords()
def stop_gradient(x: TensorLike) -> TensorOp:
    """``x``'s value, treated as a constant by :func:`deriv`."""
    return StopGradient(x)


# --- ops with several results ----------------------------------------------------------

class MultiOutput(Op):
    """An op that computes several values at once.

    It has no value of its own: ``outputs`` holds one :class:`Output` op per value, each a
    tensor usable like any other. Subclasses implement ``_output_types()`` returning
    ``[(axes, dtype), ...]``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.outputs = tuple(Output(self, i, axes=axes, dtype=dtype)
                             for i, (axes, dtype) in enumerate(self._output_types()))

    def _output_types(self):
        raise NotImplementedError


class Output(TensorOp):
    """Value number ``index`` of the :class:`MultiOutput` op that is its only arg."""

    attrs = ("index", "axes", "dtype")

    def __init__(self, op: MultiOutput, index: int, axes: AxesLike, dtype: DTypeLike,
                 **kwargs: Any) -> None:
        self.index = index
        super().__init__(op, axes=axes, dtype=dtype, **kwargs)

    @property
    def source(self) -> MultiOutput:
        return self.args[0]


class Split(MultiOutput):
    """``x`` cut along ``axis`` into consecutive parts of the given lengths; part ``i``
    has the axis replaced by ``"<axis>[start:stop]"``."""

    attrs = ("axis", "lengths")

    def __init__(self, x, axis, lengths, **kwargs):
        x = as_op(x)
        if axis not in x.axes:
            raise AxisMismatchError(f"split: axis {axis!r} is not in {x.name} "
                                    f"({_fmt(x.axes)}) (at {user_location()})")
        self.axis_pos = x.axes.index(axis)
        full = self.axis = x.axes[self.axis_pos]
        self.lengths = lengths = tuple(operator.index(n) for n in lengths)
        if any(n <= 0 for n in lengths) or builtins.sum(lengths) != full.length:
            raise AxisMismatchError(f"split: parts {lengths} do not add up to axis "
                                    f"{full!r} of {x.name} (at {user_location()})")
        self.keys, start = [], 0
        for n in lengths:
            self.keys.append(slice(start, start + n))
            start += n
        super().__init__(x, **kwargs)

    def _output_types(self):
        x = self.args[0]
        full = x.axes[self.axis_pos]
        types = []
        for k in self.keys:
            part = Axis(k.stop - k.start, f"{full.name}[{k.start}:{k.stop}]", full.batch,
                        full.recurrent)
            axes = tuple(x.axes)
            types.append((Axes(axes[:self.axis_pos] + (part,) + axes[self.axis_pos + 1:]),
                          x.dtype))
        return types


@keywords()
def split(x: TensorLike, axis: Axis,
          parts: Union[int, Sequence[int]]) -> tuple[TensorOp, ...]:
    """Cut ``x`` along ``axis`` into ``parts`` equal parts (an int) or parts of the given
    lengths (a list); returns a tuple of tensors (one ``Split`` op computes them)."""
    x = as_op(x)
    n = x.axes[x.axes.index(axis)].length
    if isinstance(parts, int):
        if parts <= 0 or n % parts:
            raise AxisMismatchError(f"split: axis {axis!r} of length {n} does not split "
                                    f"into {parts} equal parts (at {user_location()})")
        parts = [n // parts] * parts
    return Split(x, axis, parts).outputs


class MaxArgMax(MultiOutput):
    """The maximum over the reduction axes and where it is (row-major index over them),
    from one pass over ``x`` (see ``Reduction`` for the axes rule)."""

    attrs = ("reduction_axes", "out_axes")

    def __init__(self, x, reduction_axes=None, out_axes=None, **kwargs):
        self._spec = (reduction_axes, out_axes)
        super().__init__(x, **kwargs)

    def _output_types(self):
        x = self.args[0]
        self.reduction_axes, self.out_axes = reduction_split(x, *self._spec, self)
        return [(self.out_axes, x.dtype), (self.out_axes, np.dtype(np.int64))]


@keywords(_REDUCE_HINTS)
def max_argmax(x: TensorLike, reduction_axes: Optional[AxesLike] = None,
               out_axes: Optional[AxesLike] = None) -> tuple[TensorOp, ...]:
    """``(max, argmax)`` of ``x`` over the reduction axes, computed together."""
    return MaxArgMax(x, reduction_axes, out_axes).outputs
