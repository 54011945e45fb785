"""Value domains of integer placeholders: the values a placeholder may be fed.

A :class:`Domain` is a half-open range ``[start, stop)`` of integers plus a few extra
values allowed besides (an ``ignore_index`` such as -100). A placeholder gets one

- explicitly: ``be.placeholder(N, dtype=np.int64, domain=3)`` (``[0, 3)``),
  ``domain=range(-3, 3)``, ``domain=Domain(3, allow=(-100,))``, or
  :func:`set_domain` on a placeholder that exists (frontends and importers use it:
  ``set_domain(labels, n_classes, allow=(ignore_index,))``);
- by inference when a computation is built (:func:`param_domains`): a ``one_hot``
  whose labels are a placeholder constrains it to ``[0, length)`` of the one-hot axis
  (a label outside gives a row of zeros, which trains with a loss of 0 and no error),
  and a ``gather`` (or the ``Take`` primitive) whose indices are a placeholder to
  ``[-length, length)`` of the gathered axis (negative indices count from the end).
  The index may reach the op through axis casts, reorders, broadcasts, flattening and
  integer dtype conversions, which keep every value; not through slices or arithmetic.

The computation checks each fed array against its placeholder's domain (the explicit
one narrowed by the inferred ones) when it is called, with one or two reductions over
that array only (nothing for placeholders without a domain), and raises
:class:`DomainError` naming the placeholder, where it was built, the first value
outside the domain and its position, the domain, and why the placeholder has it.
"""

import weakref
from typing import Any, Iterable, Optional

import numpy as np

from geon.errors import ArgumentError, FeedError, IndexOutOfRangeError
from geon.op_graph import nn_ops
from geon.op_graph import op_graph as og
from geon.op_graph import primitives as pr
from geon.op_graph.domain_values import (Domain, DomainLike, as_domain,  # noqa: F401
                                         check_dtype)

__all__ = ["Domain", "DomainError", "as_domain", "set_domain", "param_domains"]


class DomainError(FeedError, IndexOutOfRangeError):
    """A placeholder was fed a value outside its domain (see :class:`Domain`). It is a
    :class:`~geon.errors.FeedError` (a ``ValueError``) and an ``IndexError``, as
    PyTorch's out-of-range class targets are; ``placeholder``, ``value`` and
    ``position`` say what was fed where."""

    def __init__(self, message: str, placeholder: Any = None, value: Any = None,
                 position: tuple = ()) -> None:
        super().__init__(message)
        self.placeholder, self.value, self.position = placeholder, value, position


def set_domain(placeholder: Any, stop: Optional[int], *, start: int = 0,
               allow: Iterable[int] = ()) -> Any:
    """Declare the values integer ``placeholder`` may be fed: ``start <= v < stop``
    and the values in ``allow`` (``stop=None`` removes the domain). Every computation
    built afterwards checks its feeds for it when called (see :class:`DomainError`);
    computations built before keep what they had. Returns the placeholder.

    ``set_domain(labels, n_classes, allow=(ignore_index,))`` is how a loss with an
    ``ignore_index`` declares its labels."""
    if not isinstance(placeholder, og.Placeholder):
        raise ArgumentError(f"set_domain: {getattr(placeholder, 'name', placeholder)!r} "
                            f"is not a placeholder ({type(placeholder).__name__})")
    return placeholder.set_domain(stop, start=start, allow=allow)


# --- inference -----------------------------------------------------------------------

def _value_source(op):
    """The placeholder whose every value ``op`` holds unchanged (through axis casts,
    reorders, broadcasts, flattening and integer dtype conversions), or ``None``."""
    same = (og.AxesWithOrder, og.CastAxes, og.Flatten, og.Unflatten, og.Broadcast,
            og.StopGradient, pr.Dimshuffle, pr.Reshape, pr.Expand, pr.Copy)
    seen = 0
    while seen < 10_000:  # (a bound, not recursion: chains of views may be long)
        seen += 1
        op = og.snap(op)
        if isinstance(op, og.Placeholder):
            return op
        if isinstance(op, same) and op.args:
            op = op.args[0]
            continue
        # ``x + 0`` with an integer result: how frontends convert integer dtypes
        # (int32 -> int64 keeps every value); not from floats, which truncate.
        if isinstance(op, (og.Add, og.Subtract)) and op.dtype.kind in "iu":
            a, b = op.args
            if _is_int_zero(b) and a.dtype.kind in "iu":
                op = a
                continue
            if isinstance(op, og.Add) and _is_int_zero(a) and b.dtype.kind in "iu":
                op = b
                continue
        return None
    return None


def _is_int_zero(op):
    return isinstance(op, og.Constant) and op.value.size == 1 and op.value.dtype.kind \
        in "iub" and not op.value.reshape(-1)[0]


def _constraints(ops):
    """``[(op, placeholder, Domain, noun, reason)]``: what the index-reading ops among ``ops``
    ask of the placeholders they read (see the module docstring)."""
    found = []
    readers = (og.OneHot, nn_ops.Gather, pr.Take)
    for op in ops:
        if not isinstance(op, readers):  # (one test for most ops)
            continue
        if isinstance(op, og.OneHot):
            idx, n = op.args[0], op.axis.length
            dom, noun = Domain(n), "label"
            what = f"one-hot labels along axis {op.axis.name}:{n}"
        elif isinstance(op, nn_ops.Gather):
            idx, n = op.args[1], op.axis.length
            dom, noun = Domain(-n, n), "index"
            what = f"indices into axis {op.axis.name}:{n} (negative ones count from the end)"
        elif isinstance(op, pr.Take):
            idx, n = op.args[1], op.args[0].axes[1].length
            dom, noun = Domain(-n, n), "index"
            what = f"indices into a dimension of length {n}"
        if not isinstance(n, int):
            continue  # a length bound later
        p = _value_source(idx)
        if p is not None and p.dtype.kind in "iu":
            found.append((op, p, dom, noun, f"it is read as {what} by "
                                            f"{type(op).__name__} {op.name}, built at "
                                            f"{op.file_info}"))
    return found


def _readers(p):
    """``{op: (Domain, noun, reason)}``: the index-reading ops seen reading placeholder
    ``p`` (held weakly). A pass replaces such an op (``one_hot`` becomes a comparison
    with a range); a later computation of the same graph finds the op's constraint
    here, and applies it if the op's replacement is in its graph."""
    r = p.__dict__.get("_index_readers")
    if r is None:
        r = p._index_readers = weakref.WeakKeyDictionary()
    return r


def param_domains(params: list, ops: Iterable) -> list:
    """One entry per placeholder of ``params``: ``None`` or ``(Domain, reason,
    noun)``, the placeholder's own domain narrowed by what the ops of ``ops`` (a
    computation's graph as built) ask of it, why, and what its values are (``"label"``,
    ``"index"`` or ``"value"``). An empty result (no value fits) is an
    :class:`~geon.errors.ArgumentError` now, naming both."""
    ops = list(ops)
    out = []
    wanted = set(params)
    found: dict = {}
    for reader, p, dom, noun, why in _constraints(ops):
        if p in wanted:
            _readers(p)[reader] = (dom, noun, why)
    present = None
    for p in wanted:
        readers = p.__dict__.get("_index_readers")
        if not readers:
            continue
        if present is None:
            present = set(ops)
        for reader, c in list(readers.items()):
            if og.snap(reader) in present:  # it, or what a pass made of it
                found.setdefault(p, []).append(c)
    for p in params:
        dom = getattr(p, "domain", None)
        reasons = ["it was declared so"] if dom is not None else []
        noun, applied = "value", set()
        for d, n, why in found.get(p, ()):
            if d in applied:  # (a gather and the take it was lowered to)
                continue
            applied.add(d)
            new = d if dom is None else dom.narrowed(d)
            if new != dom or new == d:  # it narrows the domain, or is the domain
                reasons.append(why)
                noun = n
            dom = new
            if dom.start == dom.stop and not dom.allow:
                raise ArgumentError(
                    f"placeholder {p.name} (built at {p.file_info}): no value fits, as "
                    f"{' and '.join(reasons)}")
        out.append(None if dom is None else (dom, "; ".join(reasons), noun))
    return out


# --- checking ------------------------------------------------------------------------

def unsigned(dtype: np.dtype) -> np.dtype:
    """The unsigned integer dtype of signed ``dtype``'s size."""
    return np.dtype(np.dtype(dtype).str.replace("i", "u"))


def fast_condition(name: str, dtype: np.dtype, dom: Domain, uname: str) -> str:
    """A Python expression, true when the array ``name`` (of integer ``dtype``, not
    empty) may hold a value outside ``dom``: one reduction for ``[0, n)`` (a negative
    value viewed as unsigned, ``uname`` bound to :func:`unsigned` of ``dtype``, is
    larger than any ``n``), else two."""
    dtype = np.dtype(dtype)
    info = np.iinfo(dtype)
    lo, hi = dom.start, dom.stop
    if dtype.kind == "i" and lo == 0:
        if hi > info.max:
            return f"{name}.min() < 0"
        return f"{name}.view({uname}).max() >= {hi}"
    parts = []
    if lo > info.min:
        parts.append(f"{name}.min() < {lo}")
    if hi <= info.max:
        parts.append(f"{name}.max() >= {hi}")
    return " or ".join(parts) or "False"


def checker(placeholder: Any, dom: Domain, reason: str, noun: str = "value"):
    """``check(array)``: nothing if every value of the (fed, converted) array lies in
    ``dom``, else :func:`report`'s :class:`DomainError`."""
    size = placeholder.axes.size
    if not isinstance(size, int) and not isinstance(size, np.integer):
        size = None  # symbolic: an empty feed is known at call time only
    if size == 0:
        return lambda a: None
    code = fast_condition("a", placeholder.dtype, dom, "u")
    if size is None:
        code = f"a.size and ({code})"
    test = eval(f"lambda a: {code}",  # noqa: S307 - an expression made above
                {"u": unsigned(placeholder.dtype)})

    def check(a):
        if test(a):
            report(placeholder, a, dom, reason, noun)
    return check


def report(placeholder: Any, a: np.ndarray, dom: Domain, reason: str,
           noun: str = "value") -> None:
    """Raise the :class:`DomainError` of the first value of ``a`` outside ``dom``
    (return if every value is in it: an allowed extra value made a quick test fail)."""
    a = np.asarray(a)
    bad = (a < dom.start) | (a >= dom.stop)
    if dom.allow:
        bad &= ~np.isin(a, dom.allow)
    n_bad = int(np.count_nonzero(bad))
    if not n_bad:
        return
    flat = int(np.argmax(bad.reshape(-1)))
    pos = tuple(int(k) for k in np.unravel_index(flat, a.shape))
    value = a.reshape(-1)[flat].item()
    names = ", ".join(ax.name for ax in placeholder.axes)
    more = f" ({n_bad - 1} more value(s) are out of range too)" if n_bad > 1 else ""
    allowed = f" and not one of {', '.join(map(str, dom.allow))}" if dom.allow else ""
    raise DomainError(
        f"placeholder {placeholder.name} (built at {placeholder.file_info}): {noun} "
        f"{value} is out of range [{dom.start}, {dom.stop}){allowed}, at position "
        f"{list(pos)} of ({names}){more}; {reason}", placeholder, value, pos)
