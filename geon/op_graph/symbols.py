"""Symbolic axis lengths: :class:`Sym`, an integer expression over named symbols.

An axis whose length is a :class:`Sym` (``be.symbolic_axis("N", batch=True)``) has a
length known only when a computation is called: the computation reads each symbol's
value from the shapes of its feeds (a *binding*, ``{"N": 7}``) and evaluates every
length with it. Graphs, passes and the generated code carry the expressions.

A ``Sym`` is immutable and kept in a normal form, so that equal expressions compare
equal and hash alike: a sum of monomials with nonzero ``int`` coefficients, sorted, each
monomial a sorted product of *atoms* (a symbol's name, or a floor division / remainder
of an expression by an int that does not simplify). Arithmetic (``+``, ``-``, ``*`` by
ints and other expressions, ``//`` and ``%`` by positive ints) returns a ``Sym``, or a
plain ``int`` when the result no longer depends on any symbol (``N - N`` is ``0``).

``repr`` is a Python expression over the symbols' names (``N*64 + 1``), so generated
code prints it where it printed a literal length, with the symbols bound as local
names. ``==`` and ``!=`` are structural (``N == 1`` is ``False``: not *known* to be 1);
an order comparison is decided where the difference of the two sides is a constant
(``N + 1 > N``) or has a sign that follows from symbols being lengths, ``>= 0``
(``N*2 >= N``); otherwise it, ``bool()``, ``int()`` and ``operator.index``
raise a :class:`TypeError` naming the symbol: the value is not decidable at build time.
"""

import ast
import keyword
import numbers
import re
from typing import Any, Mapping, Union

__all__ = ["Sym", "Symbol", "SymbolicLengthError", "Length", "is_symbolic", "evaluate",
           "symbols_of", "cut", "parse"]


class SymbolicLengthError(TypeError):
    """A symbolic length was used where an int is needed at build time (``int()``, an
    order comparison, a truth test, a size-based choice)."""


class _Atom:
    """A floor division or remainder of an expression by a positive int that does not
    simplify (``(N + 1)//2``): a factor of monomials, like a symbol."""

    __slots__ = ("op", "expr", "k", "key")

    def __init__(self, op: str, expr: "Sym", k: int) -> None:
        self.op, self.expr, self.k = op, expr, k
        self.key = f"(({expr!r}){op}{k})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Atom) and other.key == self.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __repr__(self) -> str:
        return self.key

    def names(self) -> frozenset:
        return self.expr.symbols

    def value(self, binding: Mapping[str, int]) -> int:
        v = self.expr.evaluate(binding)
        return v // self.k if self.op == "//" else v % self.k


def _key(atom: Any) -> str:
    return atom if isinstance(atom, str) else atom.key


def _mono_key(mono: tuple) -> tuple:
    return (len(mono), tuple(_key(a) for a in mono))


Length = Union[int, "Sym"]


def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


class Sym:
    """An integer expression over named symbols, in normal form (see the module
    docstring). Build one with :func:`Symbol` and arithmetic; never mutate one."""

    __slots__ = ("_terms", "_hash")
    _terms: tuple  # ((monomial, coefficient), ...): monomial a sorted tuple of atoms

    @staticmethod
    def _make(terms: Mapping[tuple, int]) -> Length:
        items = [(m, c) for m, c in terms.items() if c]
        if not any(m for m, _ in items):
            return sum(c for _, c in items)  # no symbol left: a plain int
        s = object.__new__(Sym)
        # the constant term (empty monomial) sorts first by degree; shown last by repr
        s._terms = tuple(sorted(items, key=lambda t: _mono_key(t[0])))
        s._hash = hash(s._terms)
        return s

    # -- facts ------------------------------------------------------------------------
    @property
    def symbols(self) -> frozenset:
        """The names of the symbols the expression depends on."""
        out: set = set()
        for mono, _ in self._terms:
            for a in mono:
                out |= {a} if isinstance(a, str) else a.names()
        return frozenset(out)

    @property
    def symbol(self) -> "str | None":
        """The name of the symbol if the expression is one bare symbol, else None."""
        if len(self._terms) == 1:
            mono, c = self._terms[0]
            if c == 1 and len(mono) == 1 and isinstance(mono[0], str):
                return mono[0]
        return None

    def evaluate(self, binding: Mapping[str, int]) -> int:
        """The value of the expression with each symbol's value from ``binding``."""
        total = 0
        for mono, c in self._terms:
            v = c
            for a in mono:
                if isinstance(a, str):
                    try:
                        v *= binding[a]
                    except KeyError:
                        raise SymbolicLengthError(
                            f"symbol {a} has no value in the binding {dict(binding)!r}"
                        ) from None
                else:
                    v *= a.value(binding)
            total += v
        return total

    # -- arithmetic ---------------------------------------------------------------------
    @staticmethod
    def _terms_of(x: Any) -> "dict | None":
        if isinstance(x, Sym):
            return dict(x._terms)
        if _is_int(x):
            return {(): int(x)}
        return None

    def __add__(self, other: Any) -> Length:
        o = Sym._terms_of(other)
        if o is None:
            return NotImplemented
        t = dict(self._terms)
        for m, c in o.items():
            t[m] = t.get(m, 0) + c
        return Sym._make(t)

    __radd__ = __add__

    def __neg__(self) -> Length:
        return Sym._make({m: -c for m, c in self._terms})

    def __pos__(self) -> "Sym":
        return self

    def __sub__(self, other: Any) -> Length:
        if Sym._terms_of(other) is None:
            return NotImplemented
        return self + (-other)

    def __rsub__(self, other: Any) -> Length:
        if Sym._terms_of(other) is None:
            return NotImplemented
        return (-self) + other

    def __mul__(self, other: Any) -> Length:
        o = Sym._terms_of(other)
        if o is None:
            return NotImplemented
        t: dict = {}
        for m1, c1 in self._terms:
            for m2, c2 in o.items():
                m = tuple(sorted(m1 + m2, key=_key))
                t[m] = t.get(m, 0) + c1 * c2
        return Sym._make(t)

    __rmul__ = __mul__

    def _divmod_check(self, k: Any, op: str) -> int:
        if not _is_int(k):
            raise SymbolicLengthError(
                f"symbolic length {self!r} {op} {k!r}: only division by a positive int "
                f"is supported")
        if k <= 0:
            raise SymbolicLengthError(f"symbolic length {self!r} {op} {k}: the divisor "
                                      f"must be positive")
        return int(k)

    def __floordiv__(self, k: Any) -> Length:
        k = self._divmod_check(k, "//")
        if k == 1:
            return self
        const = dict(self._terms).get((), 0)
        if all(c % k == 0 for m, c in self._terms if m):
            # (k*X + c)//k == X + c//k for integer X
            return Sym._make({m: (c // k if m else const // k) for m, c in self._terms})
        return Sym._make({(_Atom("//", self, k),): 1})

    def __mod__(self, k: Any) -> Length:
        k = self._divmod_check(k, "%")
        if k == 1:
            return 0
        const = dict(self._terms).get((), 0)
        if all(c % k == 0 for m, c in self._terms if m):
            return const % k  # (k*X + c) % k == c % k
        return Sym._make({(_Atom("%", self, k),): 1})

    def __rfloordiv__(self, other: Any) -> Any:
        raise SymbolicLengthError(f"{other!r} // {self!r}: division by a symbolic "
                                  f"length is not supported")

    def __rmod__(self, other: Any) -> Any:
        raise SymbolicLengthError(f"{other!r} % {self!r}: a remainder modulo a symbolic "
                                  f"length is not supported")

    def __truediv__(self, other: Any) -> Any:
        raise SymbolicLengthError(f"{self!r} / {other!r}: lengths divide with //, and "
                                  f"only by a positive int")

    def __rtruediv__(self, other: Any) -> Any:
        raise SymbolicLengthError(f"{other!r} / {self!r}: division by a symbolic "
                                  f"length is not supported")

    # -- comparisons -----------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        # structural: normal forms are unique, and a constant is never a Sym
        return isinstance(other, Sym) and other._terms == self._terms

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return self._hash

    def _undecidable(self, what: str) -> SymbolicLengthError:
        names = ", ".join(sorted(self.symbols))
        return SymbolicLengthError(
            f"the length of axis {names} is symbolic: {what} is not decidable at build "
            f"time (it is known only when a computation is called, from the shapes of "
            f"its feeds)")

    def _nonnegative(self) -> bool:
        """Whether the value is >= 0 for every binding (symbols are lengths, >= 0): no
        negative coefficient, and every atom >= 0."""
        for mono, c in self._terms:
            if c < 0:
                return False
            for a in mono:  # a remainder by k > 0 is >= 0; a quotient, if its dividend
                if not isinstance(a, str) and a.op == "//" and not (
                        isinstance(a.expr, Sym) and a.expr._nonnegative()):
                    return False
        return True

    def _compare(self, other: Any, op: str) -> bool:
        if Sym._terms_of(other) is None:
            return NotImplemented
        diff = self - other
        if isinstance(diff, Sym):
            # decided where the sign of the difference follows from symbols >= 0:
            # lo / hi, bounds of diff known for every binding (None: none known)
            lo = 1 if (diff - 1)._nonnegative() else 0 if diff._nonnegative() else None
            neg = -diff
            hi = -1 if (neg - 1)._nonnegative() else 0 if neg._nonnegative() else None
            answer = {">=": True if lo is not None else False if hi == -1 else None,
                      ">": True if lo == 1 else False if hi is not None else None,
                      "<=": True if hi is not None else False if lo == 1 else None,
                      "<": True if hi == -1 else False if lo is not None else None}[op]
            if answer is None:
                raise self._undecidable(f"`{self!r} {op} {other!r}`")
            return answer
        return {"<": diff < 0, "<=": diff <= 0, ">": diff > 0, ">=": diff >= 0}[op]

    def __lt__(self, other: Any) -> bool: return self._compare(other, "<")
    def __le__(self, other: Any) -> bool: return self._compare(other, "<=")
    def __gt__(self, other: Any) -> bool: return self._compare(other, ">")
    def __ge__(self, other: Any) -> bool: return self._compare(other, ">=")

    def __bool__(self) -> bool:
        raise self._undecidable(f"the truth of {self!r} (is it zero?)")

    def __int__(self) -> int:
        raise self._undecidable(f"int({self!r})")

    def __index__(self) -> int:
        raise self._undecidable(f"{self!r} as an int (an index, a size or a shape)")

    def __float__(self) -> float:
        raise self._undecidable(f"float({self!r})")

    # -- text ------------------------------------------------------------------------
    def __repr__(self) -> str:
        parts = []
        const = 0
        for mono, c in self._terms:
            if not mono:
                const = c
                continue
            body = "*".join(_key(a) for a in mono)
            if abs(c) != 1:
                body += f"*{abs(c)}"
            parts.append((c < 0, body))
        if const:
            parts.append((const < 0, str(abs(const))))
        text = ""
        for k, (neg, body) in enumerate(parts):
            if k == 0:
                text = "-" + body if neg else body
            else:
                text += (" - " if neg else " + ") + body
        return text

    __str__ = __repr__

    def __reduce__(self) -> Any:  # copy / deepcopy keep the normal form
        return (_rebuild, (self._terms,))


def _rebuild(terms: tuple) -> Length:
    return Sym._make(dict(terms))


#: The longest name of a symbol (it is a local name of generated code).
MAX_NAME = 128


def Symbol(name: str) -> Sym:
    """The symbolic length called ``name`` (a Python identifier): the length of a
    symbolic axis, ``be.Axis(be.Symbol("N"), "N")``; see :func:`geon.symbolic_axis`."""
    # (printed in generated code as a local name: ASCII letters, digits and _, no
    # keyword, no leading underscore, which generated code keeps for its own names)
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", name) \
            or keyword.iskeyword(name) or len(name) > MAX_NAME:
        shown = repr(name) if not isinstance(name, str) or len(name) <= MAX_NAME else \
            f"{name[:40]!r}... ({len(name)} characters)"
        raise ValueError(f"a symbol's name must be an ASCII Python identifier starting "
                         f"with a letter (not a keyword), of at most {MAX_NAME} "
                         f"characters, not {shown}")
    return Sym._make({(name,): 1})  # type: ignore[return-value]


def is_symbolic(x: Any) -> bool:
    """Whether ``x`` is a symbolic length."""
    return isinstance(x, Sym)


def evaluate(x: Any, binding: Mapping[str, int]) -> Any:
    """``x`` with every symbolic length evaluated: an int, a Sym, or a tuple / list of
    them (a shape); anything else unchanged."""
    if isinstance(x, Sym):
        return x.evaluate(binding)
    if isinstance(x, tuple):
        return tuple(evaluate(v, binding) for v in x)
    if isinstance(x, list):
        return [evaluate(v, binding) for v in x]
    return x


def symbols_of(lengths: Any) -> frozenset:
    """The names of the symbols in an iterable of lengths."""
    out: frozenset = frozenset()
    for v in lengths:
        if isinstance(v, Sym):
            out |= v.symbols
    return out


def exact_quotient(a: Length, b: Length) -> Length:
    """``a // b`` where ``b`` divides ``a`` for every binding as written: ``b`` an int
    dividing each coefficient of ``a``, or one term (``k * N * ...``) dividing each
    term of ``a`` (``N*T*32 // (N*32) == T``). Anything else (a remainder, a sum as the
    divisor) is a :class:`SymbolicLengthError`; two ints divide as ints (exactly)."""
    if not isinstance(a, Sym) and not isinstance(b, Sym):
        if b == 0 or a % b:
            raise SymbolicLengthError(f"{a} is not a multiple of {b}")
        return a // b
    if isinstance(b, Sym):
        if len(b._terms) != 1:
            raise SymbolicLengthError(f"{a!r} // {b!r}: a symbolic divisor must be one "
                                      f"term (such as N*32)")
        (mono_b, cb), = b._terms
    else:
        mono_b, cb = (), int(b)
    if cb == 0:
        raise SymbolicLengthError(f"{a!r} // {b!r}: division by zero")
    terms = a._terms if isinstance(a, Sym) else (((), int(a)),) if a else ()
    out: dict = {}
    for mono, c in terms:
        rest = list(mono)
        for atom in mono_b:
            if atom not in rest:
                rest = None  # type: ignore[assignment]
                break
            rest.remove(atom)
        if rest is None or c % cb:
            raise SymbolicLengthError(f"{a!r} is not a multiple of {b!r} for every "
                                      f"value of its symbols")
        out[tuple(rest)] = out.get(tuple(rest), 0) + c // cb
    return Sym._make(out)


def broadcast_lengths(*shapes: Any) -> tuple:
    """NumPy's broadcast of ``shapes`` (aligned from the right) whose lengths may be
    symbolic: equal lengths stay, 1 stretches to the other; a symbolic length against
    a different one other than 1 is a :class:`SymbolicLengthError` (whether they are
    equal is known only at a call) and two different ints a ``ValueError``, as NumPy's."""
    ndim = max((len(s) for s in shapes), default=0)
    out = []
    for k in range(ndim):
        found: Any = 1
        for s in shapes:
            j = len(s) - ndim + k
            if j < 0:
                continue
            n = s[j]
            if n == 1 and not isinstance(n, Sym):
                continue
            if found == 1 and not isinstance(found, Sym):
                found = n
            elif found != n:
                if isinstance(found, Sym) or isinstance(n, Sym):
                    raise SymbolicLengthError(f"lengths {found!r} and {n!r} broadcast "
                                              f"only if equal, which is known only when "
                                              f"the computation is called")
                raise ValueError(f"shape mismatch: {found} against {n}")
        out.append(found)
    return tuple(out)


def cut(key: Any, n: Length) -> tuple:
    """A slice or an index ``key`` of a dimension of length ``n`` where ``n`` or a bound
    of ``key`` is symbolic: ``(key, length, needs)``. The returned key has its bounds
    as positions (negative ints counted from ``n``; a step below zero keeps a stop of
    ``None``), ``length`` is what a slice leaves (``None`` for an index) and ``needs``
    the expressions that must be ``>= 0`` at a call for ``key`` to lie within the
    dimension (a symbolic slice does not clamp its bounds as Python's does: it must fit).
    Needs decided at build time are left out; one that never holds is a ``ValueError``
    naming it."""
    def at(v: Any) -> Any:
        if not isinstance(v, Sym):
            return v if v >= 0 else n + v
        if all(c <= 0 for _, c in v._terms):
            raise ValueError(f"the bound {v!r} is never a position (a symbolic bound "
                             f"counts from the start: write {n!r} - {-v!r} to count from "
                             f"the end)")
        return v
    if isinstance(key, slice):
        step = 1 if key.step is None else int(key.step)
        if step > 0:
            start = 0 if key.start is None else at(key.start)
            stop = n if key.stop is None else at(key.stop)
            new = slice(start, stop, key.step)
            length = (stop - start + step - 1) // step
            needs: tuple = (start, stop - start, n - stop)
        else:
            start = n - 1 if key.start is None else at(key.start)
            stop = -1 if key.stop is None else at(key.stop)
            new = slice(start, None if key.stop is None else stop, step)
            length = (start - stop - step - 1) // -step
            # an explicit stop must be a position (>= 0): a stop of -1 reads as "the last"
            # to NumPy, not "before the first"; only a stop of None runs down to 0
            needs = (stop + int(key.stop is None), start - stop, n - 1 - start)
    else:
        new = at(key)
        length, needs = None, (new, n - 1 - new)
    kept = []
    for e in needs:
        try:
            holds = e >= 0
        except SymbolicLengthError:
            kept.append(e)
            continue
        if not holds:
            raise ValueError(f"{e!r} >= 0 never holds")
    return new, length, tuple(dict.fromkeys(kept))


def key_text(key: Any) -> str:
    """``key`` (a slice or an index, bounds possibly symbolic) as written in brackets:
    ``[1:N - 1]``."""
    if not isinstance(key, slice):
        return f"[{key!r}]"
    parts = ["" if v is None else repr(v) for v in (key.start, key.stop, key.step)]
    return "[" + ":".join(parts if key.step is not None else parts[:2]) + "]"


#: the longest expression :func:`parse` reads (documents are untrusted input), and the
#: most terms a product it reads may expand to
MAX_TEXT = 1000
MAX_TERMS = 256


def _size(v: Length) -> int:
    return len(v._terms) if isinstance(v, Sym) else 1


def parse(text: str) -> Length:
    """The length ``text`` writes (``repr`` of a :class:`Sym`, or an int): symbols'
    names, ints, ``+``, ``-``, ``*``, ``//``, ``%`` and parentheses. Anything else is a
    ``ValueError``; nothing is evaluated but this arithmetic (documents are untrusted)."""
    if not isinstance(text, str) or len(text) > MAX_TEXT:
        raise ValueError(f"a length is a text of at most {MAX_TEXT} characters")
    try:
        tree = ast.parse(text, mode="eval").body
    except (SyntaxError, RecursionError, MemoryError):
        raise ValueError(f"{text[:80]!r} is not an expression of lengths") from None
    ops = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
           ast.Mult: lambda a, b: a * b, ast.FloorDiv: lambda a, b: a // b,
           ast.Mod: lambda a, b: a % b}

    def walk(node: Any, depth: int) -> Any:
        if depth > 100:
            raise ValueError("an expression of lengths nested too deeply")
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.Name):
            return Symbol(node.id)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand, depth + 1)
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            a, b = walk(node.left, depth + 1), walk(node.right, depth + 1)
            if isinstance(node.op, (ast.FloorDiv, ast.Mod)) and not (
                    type(b) is int and b > 0):
                raise ValueError("// and % of a length take a positive int")
            if isinstance(node.op, ast.Mult) and _size(a) * _size(b) > MAX_TERMS:
                # products of sums expand: a short text could ask for millions of terms
                raise ValueError(f"{text[:80]!r} expands to more than {MAX_TERMS} terms")
            return ops[type(node.op)](a, b)
        raise ValueError(f"{text[:80]!r} is not an expression of lengths (only names, "
                         f"ints, +, -, *, // and % by positive ints)")
    return walk(tree, 0)
