"""Keyword checks of the public op-building functions (``@keywords``), and the hints
that name the right keyword when a user gives a wrong one."""

import functools
import inspect

from geon.errors import ArgumentError
from geon.op_graph.nodes import user_location

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
