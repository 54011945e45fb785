"""What every public class of the frontend shares: keyword checks in the ``be.*`` style
(an unknown keyword names the valid ones), readable argument errors, and reprs that
show how an object was made (``Affine(64, activation='tanh', name='hidden')``)."""

import difflib
import functools
import inspect
from typing import Any, Callable, Iterable, Optional, TypeVar

import numpy as np

from geon.errors import ArgumentError
from geon.op_graph.nodes import user_location

F = TypeVar("F", bound=Callable[..., Any])

_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def unknown_keyword(what: str, keyword: str, accepted: Iterable[str]) -> ArgumentError:
    """The :class:`ArgumentError` for ``keyword`` given to ``what``, which takes
    ``accepted``: it names them, and the closest one where the keyword looks like a
    misspelling of it."""
    accepted = list(accepted)
    close = difflib.get_close_matches(keyword, accepted, n=1)
    guess = f"did you mean {close[0]!r}? It" if close else "it"
    return ArgumentError(f"{what} has no {keyword!r} keyword; {guess} takes "
                         f"{', '.join(accepted)} (at {user_location()})")


def _keywords_of(fn: Callable[..., Any]) -> tuple[list[str], bool]:
    """(the keyword names ``fn`` takes, whether it takes ``**kw`` too)."""
    params = [p for p in inspect.signature(fn).parameters.values() if p.name != "self"]
    return ([p.name for p in params if p.kind in _NAMED],
            any(p.kind is p.VAR_KEYWORD for p in params))


def checked(what: str) -> Callable[[F], F]:
    """Decorator of a method or function named ``what`` in messages (``Model.fit``): a
    keyword it does not take raises :func:`unknown_keyword`'s error instead of Python's
    bare ``TypeError``."""
    def decorate(fn: F) -> F:
        names, _ = _keywords_of(fn)
        known = frozenset(names)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kw: Any) -> Any:
            for k in kw:
                if k not in known:
                    raise unknown_keyword(what, k, names)
            return fn(*args, **kw)
        return wrapper  # type: ignore[return-value]
    return decorate


def public_name(cls: type) -> str:
    """``nn.Affine`` for the frontend's own classes, the class name for others."""
    return (f"nn.{cls.__name__}" if cls.__module__.startswith("geon.frontends.neon")
            else cls.__name__)


def _all_keywords(cls: type) -> list[str]:
    """The keywords the constructors along ``cls``'s MRO take, in MRO order."""
    names: list[str] = []
    for k in cls.__mro__:
        init = k.__dict__.get("__init__")
        if init is None or k is object:
            continue
        for n in _keywords_of(init)[0]:
            if n not in names:
                names.append(n)
    return names


class Configurable:
    """Base of the frontend's layers, initializers, optimizers, schedules and
    callbacks. Each subclass's ``__init__`` is wrapped once, when the class is made:

    - an unknown keyword raises :class:`ArgumentError` naming the keywords the class
      takes (a constructor with ``**kw`` passes them on to its base, which checks);
    - the arguments of the outermost call are kept, and ``repr`` shows them as they
      were given: ``SGD(0.2, momentum=0.5)``.
    """

    _given: Optional[list[tuple[Optional[str], Any]]] = None

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        init = cls.__dict__.get("__init__")
        if init is None or getattr(init, "_geon_checked", False):
            return
        names, takes_any = _keywords_of(init)
        known = frozenset(names)
        signature = inspect.signature(init)

        @functools.wraps(init)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            if not takes_any:
                for k in kwargs:
                    if k not in known:
                        raise unknown_keyword(public_name(type(self)), k,
                                              _all_keywords(type(self)))
            if "_given" not in self.__dict__:  # the outermost constructor's arguments
                self._given = _as_given(signature, self, args, kwargs)
            init(self, *args, **kwargs)

        __init__._geon_checked = True  # type: ignore[attr-defined]
        setattr(cls, "__init__", __init__)

    def _repr_arguments(self, skip: Iterable[str] = ()) -> list[str]:
        """The constructor's arguments as given, formatted, less the keywords
        ``skip``."""
        skip = frozenset(skip)
        return [fmt(v) if k is None else f"{k}={fmt(v)}"
                for k, v in (self._given or []) if k not in skip]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(self._repr_arguments())})"


def _as_given(signature: inspect.Signature, obj: Any, args: tuple[Any, ...],
              kwargs: dict[str, Any]) -> Optional[list[tuple[Optional[str], Any]]]:
    """``[(None, value)]`` for each positional argument, then ``[(name, value)]`` for
    each keyword one, as they were passed (None when they do not bind: the constructor
    raises Python's error for that)."""
    try:
        signature.bind(obj, *args, **kwargs)
    except TypeError:
        return None
    return [(None, a) for a in args] + [(k, v) for k, v in kwargs.items()]


def fmt(value: Any) -> str:
    """A short, readable form of an argument: functions by name, floats as short as
    they print, sequences and mappings element by element."""
    if isinstance(value, (float, np.floating)):
        return repr(float(value))
    if isinstance(value, np.dtype) or (isinstance(value, type) and
                                       issubclass(value, np.generic)):
        return f"np.{np.dtype(value).name}"
    if isinstance(value, np.ndarray):
        return f"array(shape={value.shape}, dtype={value.dtype})"
    if inspect.isfunction(value) or inspect.isbuiltin(value) or \
            isinstance(value, functools.partial):
        name = getattr(value, "__qualname__", None) or getattr(value, "__name__", None)
        module = getattr(value, "__module__", "") or ""
        if name and module.startswith("geon"):
            return f"be.{name}" if "." not in name else name
        return name or repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(fmt(v) for v in value) + "]"
    if isinstance(value, tuple):
        return "(" + ", ".join(fmt(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {fmt(v)}" for k, v in value.items()) + "}"
    return repr(value)


def describe(value: Any) -> str:
    """``value`` as an error message names what was passed: its repr (shortened) and
    its type, ``(6,) (a tuple)``."""
    if isinstance(value, type):
        return f"the class {public_name(value)}"
    text = repr(value) if not isinstance(value, np.ndarray) else \
        f"an array of shape {value.shape} and dtype {value.dtype}"
    if len(text) > 60:
        text = text[:57] + "..."
    if isinstance(value, np.ndarray):
        return text
    kind = type(value).__name__
    article = "an" if kind[:1].lower() in "aeiou" else "a"
    return f"{text} ({article} {kind})"


def is_int(value: Any) -> bool:
    """An int or NumPy integer, not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def check_count(what: str, name: str, value: Any, minimum: int = 1) -> int:
    """``value`` as an int, or an :class:`ArgumentError` saying an integer >=
    ``minimum`` was expected and what was given."""
    if not is_int(value) or value < minimum:
        raise ArgumentError(f"{what}: {name} must be an integer >= {minimum}, not "
                            f"{describe(value)} (at {user_location()})")
    return int(value)
