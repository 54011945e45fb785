"""Base sets: the ops a transformer runs as they are.

:data:`STANDARD_BASE_SET` holds the op classes declared with ``@primitive``
(:func:`geon.op_graph.tables.primitive`), each where it is defined; it is read when
asked, so a primitive declared in a module imported later (a new op in its own file)
is in it. A transformer class declares its own as ``base_set = BaseSet(extra, ...)``:
the standard set at the time it is read, plus the extra classes.
"""

import collections.abc
from typing import Any, Iterable, Iterator, Optional

# The op modules that declare the standard primitives.
from geon.op_graph import conv as _conv, primitives as _pr  # noqa: F401
from geon.op_graph import op_graph as og
from geon.op_graph import random as _rnd, schemas as _sc  # noqa: F401
from geon.op_graph.tables import primitives_version


class _DeclaredPrimitives(collections.abc.Set):
    """The classes declared with ``@primitive`` so far, read when asked: a primitive
    declared after this module was imported is in it too. Set operations (``|``,
    ``-``, ...) give a frozenset of the members at that moment."""

    _cache: tuple[int, frozenset[type]] = (-1, frozenset())

    def _members(self) -> frozenset[type]:
        n = primitives_version()
        if self._cache[0] != n:
            self._cache = (n, frozenset(og.declared_primitives(og.Op)))
        return self._cache[1]

    @classmethod
    def _from_iterable(cls, it: Iterable[Any]) -> frozenset[Any]:
        return frozenset(it)

    def __contains__(self, cls: object) -> bool:
        return cls in self._members()

    def __iter__(self) -> Iterator[type]:
        return iter(self._members())

    def __len__(self) -> int:
        return len(self._members())

    def __repr__(self) -> str:
        return f"STANDARD_BASE_SET({len(self)} primitives)"


#: The semi-primitive ops every built-in transformer implements: the classes the op
#: modules declare with ``@primitive`` (``geon.op_graph.tables``), each where it is
#: defined, whenever that module is imported (the modules imported above hold the
#: built-in ones). ``STANDARD_BASE_SET | {Op}`` is a frozenset of today's members.
STANDARD_BASE_SET = _DeclaredPrimitives()


class BaseSet:
    """A transformer class's ``base_set``, declared as ``base_set = BaseSet(Cls, ...)``:
    the standard base set as it is when read, plus ``extra``. Read on the class or on
    an instance, it is a frozenset (the same object until another primitive is
    declared), so a transformer runs every primitive declared after it was defined."""

    def __init__(self, *extra: type) -> None:
        self.extra = frozenset(extra)
        self._cache: tuple[int, frozenset[type]] = (-1, frozenset())

    def __get__(self, instance: object, owner: Optional[type] = None) -> frozenset[type]:
        n = primitives_version()
        if self._cache[0] != n:
            self._cache = (n, frozenset(STANDARD_BASE_SET) | self.extra)
        return self._cache[1]
