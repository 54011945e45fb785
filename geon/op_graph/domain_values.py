"""The values of a domain: :class:`Domain` (a range of integers plus allowed extras)
and the checks a placeholder makes of the domain it is given.

The graph side (a placeholder's domain set or inferred from the ops that read it, and
the checks computations make of their feeds) is :mod:`geon.op_graph.domains`; this
module holds only values, so that the core's :class:`Placeholder` can use it.
"""

from typing import Iterable, Optional, Union

import numpy as np

from geon.errors import ArgumentError

__all__ = ["Domain", "DomainLike", "as_domain", "check_dtype"]


class Domain(tuple):
    """The integers ``start <= v < stop``, and the values ``allow`` besides.

    ``Domain(3)`` is ``[0, 3)``; ``Domain(-3, 3)`` is ``[-3, 3)`` (the arguments of
    ``range``); ``Domain(10, allow=(-100,))`` also accepts -100 (an ``ignore_index``).
    It is the tuple ``(start, stop, allow)``, the form a serialized graph stores;
    ``allow`` is kept sorted, without the values the range already holds."""

    def __new__(cls, start: int, stop: Optional[int] = None,
                allow: Iterable[int] = ()) -> "Domain":
        if stop is None:
            start, stop = 0, start
        for what, v in (("start", start), ("stop", stop)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise ArgumentError(f"domain: {what} must be an integer, not "
                                    f"{type(v).__name__} {v!r}")
        start, stop = int(start), int(stop)
        if stop < start:
            raise ArgumentError(f"domain: [{start}, {stop}) is empty (stop < start)")
        extra = set()
        for v in allow:
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise ArgumentError(f"domain: allowed value {v!r} is not an integer")
            if not start <= int(v) < stop:
                extra.add(int(v))
        return super().__new__(cls, (start, stop, tuple(sorted(extra))))

    def __getnewargs__(self):
        return tuple(self)

    @property
    def start(self) -> int:
        """The smallest value of the range."""
        return self[0]

    @property
    def stop(self) -> int:
        """One past the largest value of the range."""
        return self[1]

    @property
    def allow(self) -> tuple:
        """The values allowed besides the range, sorted."""
        return self[2]

    def __repr__(self) -> str:
        return f"Domain({self.start}, {self.stop}" + (
            f", allow={self.allow})" if self.allow else ")")

    def __str__(self) -> str:
        text = f"[{self.start}, {self.stop})"
        return text + "".join(f" or {v}" for v in self.allow)

    def holds(self, v: int) -> bool:
        """Whether integer ``v`` is in the domain."""
        return self.start <= v < self.stop or v in self.allow

    def narrowed(self, other: "Domain") -> "Domain":
        """The values both domains hold, except that ``self``'s allowed extras stay
        allowed (they were given on purpose, e.g. an ignore_index the loss masks)."""
        start, stop = max(self.start, other.start), min(self.stop, other.stop)
        stop = max(start, stop)
        extra = set(self.allow) | {v for v in other.allow if self.holds(v)}
        return Domain(start, stop, extra)


DomainLike = Union[int, range, tuple, Domain]


def as_domain(value: Optional[DomainLike], where: str = "domain") -> Optional[Domain]:
    """``value`` as a :class:`Domain`: ``None``; an int ``n`` (``[0, n)``); a
    ``range`` with step 1; a ``Domain``; or a tuple ``(start, stop)`` or
    ``(start, stop, allow)`` (the form serialized graphs store)."""
    if value is None:
        return None
    if isinstance(value, Domain):
        return Domain(value.start, value.stop, value.allow)
    if isinstance(value, range):
        if value.step != 1:
            raise ArgumentError(f"{where}: a range domain needs step 1, not {value!r}")
        return Domain(value.start, value.stop)
    if isinstance(value, tuple) and len(value) in (2, 3):
        allow = value[2] if len(value) == 3 else ()
        if not isinstance(allow, (tuple, list)):
            raise ArgumentError(f"{where}: the allowed values must be a tuple, not "
                                f"{allow!r}")
        return Domain(value[0], value[1], allow)
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return Domain(int(value))
    raise ArgumentError(f"{where}: expected an int n ([0, n)), a range, a "
                        f"(start, stop[, allow]) tuple or a Domain, not "
                        f"{type(value).__name__} {value!r}")


def check_dtype(dtype: np.dtype, name: str, where: str) -> None:
    """A :class:`~geon.errors.ArgumentError` unless placeholder ``name`` of ``dtype``
    can have a domain (an integer dtype)."""
    if np.dtype(dtype).kind not in "iu":
        raise ArgumentError(f"placeholder {name}: a domain needs an integer dtype, not "
                            f"{np.dtype(dtype)} ({where})")
