"""The axis algebra: :class:`Axis`, :class:`Axes` and :class:`FlattenedAxis`.

An axis is identified by its name. Two ``Axis`` objects with the same name are the same
axis; giving them different lengths inside one expression is an error. An ``Axes`` is an
ordered, immutable collection of axes without duplicates. Its order is the row-major
layout of the tensor it describes.
"""

import gc
import itertools
import math
import weakref
from typing import Any, Iterable, Iterator, Optional, Sequence, Union, overload

from geon.errors import ArgumentError, AxisMismatchError
# Imported for its check that `import geon` found this package (and not, say, an empty
# folder named geon beside the user's script): a clear ImportError instead of a missing
# API. The standard axes (geon.frontends.base.axis) come through here.
from geon.op_graph import nodes as _nodes  # noqa: F401
from geon.op_graph.symbols import Sym, Symbol

_anonymous = itertools.count()
_length_epoch = 0


class _Users:
    """Weak references to the ops whose axes hold an axis (see :func:`note_users`).
    Dead references are dropped when the list has doubled since the last sweep, so
    noting a user costs O(1) amortized and the list stays within twice the live ops."""

    __slots__ = ("refs", "sweep_at")

    def __init__(self) -> None:
        self.refs: list[weakref.ref[Any]] = []
        self.sweep_at = 64

    def sweep(self) -> None:
        refs = self.refs
        refs[:] = [r for r in refs if r() is not None]
        self.sweep_at = max(64, 2 * len(refs))

    def live(self) -> Any:
        """One op still alive, or ``None``."""
        for r in self.refs:
            op = r()
            if op is not None:
                return op
        return None


class Axis:
    """A named tensor dimension.

    Args:
        length: number of entries along the axis; may be set later (``ax.C.length = 64``)
            but must be known before a computation that uses it is built. Once an op
            that uses the axis is built, its length is fixed (changing it would change
            that op's axes): setting another one raises :class:`AxisMismatchError`;
            make a new axis instead (``be.Axis(32, name="C")``). A symbolic length
            (a :class:`~geon.op_graph.symbols.Sym`, ``be.Symbol("N")``) is bound when a
            computation is called (see :func:`symbolic_axis`).
        name: the axis' identity. Defaults to a fresh unique name.
        batch: the axis indexes independent samples (reductions keep it by default).
        recurrent: the axis indexes time steps of a recurrence (kept by reductions too).
    """

    __slots__ = ("name", "_length", "batch", "recurrent", "_users")

    def __init__(self, length: Union[int, Sym, None] = None, name: Optional[str] = None,
                 batch: bool = False, recurrent: bool = False) -> None:
        if name is None:
            name = f"axis{next(_anonymous)}"
        if not isinstance(name, str) or not name:
            raise ArgumentError(f"an axis name must be a non-empty string, not {name!r}")
        self.name = name
        self._length: Optional[int] = None
        self._users: Optional[_Users] = None
        if length is not None:
            self._set_length(length)  # a new axis changes no cached lengths
        self.batch = bool(batch)
        self.recurrent = bool(recurrent)

    @property
    def length(self) -> Optional[int]:
        """The number of entries, or ``None`` while it is not set."""
        return self._length

    @length.setter
    def length(self, value: Optional[int]) -> None:
        old = self._length
        self._set_length(value)
        if self._length != old and old is not None and self._users is not None:
            # A length set once is part of the ops built since: they keep it. (An unset
            # length may be given later: those ops could not be computed before.)
            user = self._users.live()
            if user is not None:
                user = None  # (not a reference that keeps it alive)
                gc.collect()  # ops kept only by reference cycles are not users
                user = self._users.live()
            if user is not None:
                new, self._length = self._length, old
                raise AxisMismatchError(_fixed_length_message(self, new, user))
        global _length_epoch
        _length_epoch += 1  # Axes objects cache their lengths until some length changes

    def _set_length(self, value: Any) -> None:
        # (typed Any: ``length`` says int for the code that predates symbolic lengths)
        if isinstance(value, Sym):  # a symbolic length, bound at call time
            self._length = value  # type: ignore[assignment]
            return
        if value is not None:
            if isinstance(value, bool) or int(value) != value or value < 0:
                raise ArgumentError(f"axis {self.name}: length must be an integer >= 0, "
                                    f"not {value!r}")
            value = int(value)
        self._length = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Axis) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        # ``C:64``; ``N:N`` for a symbolic length (its expression); ``C:?`` while unset
        length = self.length  # a property: FlattenedAxis computes it from its parts
        return f"{self.name}:{length if length is not None else '?'}"

    @property
    def is_symbolic(self) -> bool:
        """Whether the length is symbolic (bound when a computation is called)."""
        return isinstance(self.length, Sym)

    def named(self, name: str) -> "Axis":
        """A new axis with this one's length and flags and another name."""
        return Axis(self.length, name, self.batch, self.recurrent)


class FlattenedAxis(Axis):
    """One axis standing for several, in row-major order (the result of ``flatten``)."""

    __slots__ = ("axes",)

    def __init__(self, axes: "AxesLike") -> None:
        axes = Axes(axes)
        self.axes = axes
        super().__init__(None, "(" + "*".join(a.name for a in axes) + ")",
                         batch=any(a.batch for a in axes),
                         recurrent=any(a.recurrent for a in axes))

    @property
    def length(self) -> Optional[int]:
        # Each part's length once: asking twice (known? then the product) made a
        # flattened axis nested k deep cost 2**k calls.
        lengths = [a.length for a in self.axes]
        return None if None in lengths else math.prod(lengths)  # type: ignore[arg-type]

    @length.setter
    def length(self, value: Optional[int]) -> None:
        if value is not None:
            raise ArgumentError(f"the length of flattened axis {self.name} follows its parts")


class Axes:
    """An ordered, immutable, duplicate-free collection of :class:`Axis`.

    ``Axes(a, b)``, ``Axes((a, b))``, ``Axes([a, b])`` and ``Axes(other_axes)`` are the
    same. Set-like helpers keep the left operand's order: ``a + b`` concatenates (the
    two must not share an axis), ``a - b`` drops b's axes, ``a | b`` appends b's axes
    that a lacks, ``a & b`` keeps a's axes that b has.
    """

    __slots__ = ("_axes", "_names", "_lengths")
    _axes: tuple[Axis, ...]
    _names: tuple[str, ...]
    _lengths: Optional[tuple[int, tuple[Optional[int], ...], Optional[int]]]

    @overload
    def __init__(self, axes: Iterable[Axis], /) -> None: ...
    @overload
    def __init__(self, *axes: Axis) -> None: ...

    def __init__(self, *axes: Any) -> None:
        if len(axes) == 1 and not isinstance(axes[0], Axis):
            axes = axes[0]
        self._lengths = None
        if isinstance(axes, Axes):
            self._axes, self._names = axes._axes, axes._names
            return
        if isinstance(axes, Axis):
            axes = (axes,)
        items = tuple(axes)
        for a in items:
            if not isinstance(a, Axis):
                raise ArgumentError(f"Axes takes Axis objects, not {type(a).__name__} {a!r}")
        names = tuple(a.name for a in items)
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise AxisMismatchError(f"axis {', '.join(dup)} appears twice in {_fmt(items)}")
        self._axes = items
        self._names = names

    # -- sequence behaviour -------------------------------------------------------------
    def __iter__(self) -> Iterator[Axis]:
        return iter(self._axes)

    def __len__(self) -> int:
        return len(self._axes)

    @overload
    def __getitem__(self, i: slice) -> "Axes": ...
    # An Axis; Any for now: op_graph.split still does arithmetic on its length (None
    # when unset) unchecked.
    @overload
    def __getitem__(self, i: int) -> Any: ...

    def __getitem__(self, i: Union[int, slice]) -> Any:
        if isinstance(i, slice):
            return Axes(self._axes[i])
        return self._axes[i]

    def __contains__(self, axis: Union[Axis, str]) -> bool:
        name = axis if isinstance(axis, str) else axis.name
        return name in self._names

    def __eq__(self, other: object) -> bool:
        """Same axes (names and lengths) in the same order."""
        if other is self:
            return True
        if not isinstance(other, Axes):
            return NotImplemented
        return self._names == other._names and self.lengths == other.lengths

    def __hash__(self) -> int:
        return hash(self._names)

    def __repr__(self) -> str:
        return f"Axes({_fmt(self._axes)})"

    # -- facts ---------------------------------------------------------------------------
    @property
    def names(self) -> tuple[str, ...]:
        """The axes' names, in order."""
        return self._names

    @property
    def lengths(self) -> tuple[Optional[int], ...]:
        """The axes' lengths, in order (``None`` where unset)."""
        cached = self._lengths
        if cached is not None and cached[0] == _length_epoch:
            return cached[1]
        return self._cache_lengths()[1]

    def _cache_lengths(self) -> tuple[int, tuple[Optional[int], ...], Optional[int]]:
        """``(epoch, lengths, size)``, recomputed once per change of any axis length."""
        lengths = tuple(a.length for a in self._axes)
        size = (math.prod(lengths)  # type: ignore[arg-type]  # no None in lengths
                if None not in lengths else None)
        cached = self._lengths = (_length_epoch, lengths, size)
        return cached

    @property
    def is_symbolic(self) -> bool:
        """Whether some axis has a symbolic length (see ``geon.op_graph.symbols``)."""
        return any(isinstance(n, Sym) for n in self.lengths)

    @property
    def lengths_known(self) -> bool:
        """Whether every axis has a length."""
        return all(a.length is not None for a in self._axes)

    @property
    def shape(self) -> tuple[int, ...]:
        """The row-major shape; raises if an axis has no length yet. A symbolic length
        stays a :class:`~geon.op_graph.symbols.Sym` in it: code that needs an int
        (``np.empty(shape)``, ``int(n)``) raises a ``TypeError`` naming the symbol."""
        lengths = self.lengths
        if None in lengths:
            missing = [a.name for a in self._axes if a.length is None]
            raise AxisMismatchError(f"axis {', '.join(missing)} of {self!r} has no length; "
                                    f"set it (e.g. ax.{missing[0]}.length = 10) first")
        return lengths  # type: ignore[return-value]  # no None left

    @property
    def size(self) -> int:
        """The number of elements (a ``Sym`` where a length is symbolic)."""
        cached = self._lengths
        if cached is None or cached[0] != _length_epoch:
            cached = self._cache_lengths()
        if cached[2] is None:
            return math.prod(self.shape)  # raises: a length is not set
        return cached[2]

    def index(self, axis: Union[Axis, str]) -> int:
        """Position of ``axis`` (an Axis or a name)."""
        name = axis if isinstance(axis, str) else axis.name
        try:
            return self._names.index(name)
        except ValueError:
            raise AxisMismatchError(f"axis {name} is not in {self!r}") from None

    def find(self, name: str) -> Optional[Axis]:
        """The axis called ``name``, or ``None``."""
        return self._axes[self._names.index(name)] if name in self._names else None

    def batch_axes(self) -> "Axes":
        """The batch axes."""
        return Axes(a for a in self._axes if a.batch)

    def recurrent_axes(self) -> "Axes":
        """The recurrent axes."""
        return Axes(a for a in self._axes if a.recurrent)

    def sample_axes(self) -> "Axes":
        """The axes that are neither batch nor recurrent."""
        return Axes(a for a in self._axes if not (a.batch or a.recurrent))

    def same_set(self, other: "AxesLike") -> bool:
        """Whether both hold the same axes, in any order."""
        return set(self._names) == set(Axes(other)._names)

    # -- algebra ------------------------------------------------------------------------
    def __add__(self, other: "AxesLike") -> "Axes":
        return Axes(self._axes + Axes(other)._axes)

    def __sub__(self, other: "AxesLike") -> "Axes":
        other = Axes(other)
        return Axes(a for a in self._axes if a.name not in other._names)

    def __or__(self, other: "AxesLike") -> "Axes":
        other = Axes(other)
        return Axes(self._axes + tuple(a for a in other._axes if a.name not in self._names))

    def __and__(self, other: "AxesLike") -> "Axes":
        other = Axes(other)
        return Axes(a for a in self._axes if a.name in other._names)


def _fmt(axes: Iterable[Axis]) -> str:
    return ", ".join(repr(a) for a in axes)


def note_users(axes: Axes, op: Any) -> None:
    """Record that ``op`` (alive) uses each axis of ``axes`` (and the parts of flattened
    ones), so that the lengths of those axes stay fixed while it lives. Tensor ops call
    this when they are built."""
    ref = weakref.ref(op)
    level: tuple[Axis, ...] = axes._axes
    while level:  # (this runs for every op built: kept lean)
        parts: tuple[Axis, ...] = ()
        for a in level:
            users = a._users
            if users is None:
                users = a._users = _Users()
            refs = users.refs
            refs.append(ref)
            if len(refs) >= users.sweep_at:
                users.sweep()
            if isinstance(a, FlattenedAxis):
                parts += a.axes._axes  # the parts, at any depth: one level per pass
        level = parts


def _fixed_length_message(axis: Axis, new: Optional[int], user: Any) -> str:
    flags = "".join(f", {f}=True" for f in ("batch", "recurrent") if getattr(axis, f))
    length = "" if new is None else f"{new}, "
    return (f"axis {axis.name}: cannot change its length from {axis.length} to {new}: "
            f"ops built with it use length {axis.length}, such as {user!r}, and "
            f"would change with it. The length of an axis is fixed once an op uses it. "
            f"For another length, make a new axis, e.g. "
            f"be.Axis({length}name={axis.name!r}{flags}), and build the ops again with "
            f"it (or set the length before building any op)")


def check_lengths(groups: Sequence[tuple[str, Axes]], what: str,
                  where: str = "") -> None:
    """Raise :class:`AxisMismatchError` if one axis name has two lengths across ``groups``.

    ``groups`` is a sequence of ``(label, Axes)``; ``what`` names the op being built and
    ``where`` is the user's source location.
    """
    seen: dict[str, Axis] = {}
    for _, axes in groups:
        for a in axes:
            old = seen.get(a.name)
            if old is not None and old.length is not None and a.length is not None \
                    and old.length != a.length:
                detail = "; ".join(f"{label}: {_fmt(ax)}" for label, ax in groups)
                # (symbolic lengths compare structurally: N and M differ, so do N and 64)
                kind = " (symbolic)" if isinstance(old.length, Sym) or isinstance(
                    a.length, Sym) else ""
                raise AxisMismatchError(
                    f"{what}: axis {a.name} has length{kind} {old.length} in one operand "
                    f"and {a.length} in another ({detail}){where}")
            if old is None or old.length is None:
                seen[a.name] = a


#: What an ``axes=`` argument accepts: an :class:`Axes`, one :class:`Axis`, or a sequence
#: of them.
AxesLike = Union[Axes, Axis, Iterable[Axis]]


def as_axes(axes: Any) -> Axes:
    """Coerce an Axis, a sequence of Axis, or Axes to :class:`Axes` (``None`` -> empty)."""
    if axes is None:
        return NO_AXES
    return axes if isinstance(axes, Axes) else Axes(axes)


#: The empty Axes (of scalars), shared: Axes are immutable.
NO_AXES = Axes()


def symbolic_axis(name: str, batch: bool = False, recurrent: bool = False,
                  symbol: Optional[str] = None) -> Axis:
    """An axis whose length is the symbol ``symbol`` (default: the axis' name), bound
    when a computation is called from the shapes of its feeds: one computation for
    every batch size. ``be.symbolic_axis("N", batch=True)`` is
    ``be.Axis(be.Symbol("N"), "N", batch=True)``; it prints as ``N:N``."""
    return Axis(Symbol(symbol or name), name, batch=batch, recurrent=recurrent)
