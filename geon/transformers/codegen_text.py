"""Text from a graph in generated source code: the only ways in.

Op and Variable names, the file names of source locations, ``derived_from`` strings and
user-op parameters come from whoever built the graph, or wrote the document given to
:func:`geon.deserialize`. Code generators (the NumPy transformer's Python, the GPU
transformer's CUDA C) put such text into their source only through these functions,
so that no string can end a comment or a literal and become code:

- :func:`identifier`: a Python name of ``[A-Za-z0-9_]`` only, unique among the names
  already taken, never a keyword or a builtin, and never starting with ``_`` (names
  with a leading underscore are left to the generator's own variables);
- :func:`comment`: text for a ``#``, ``//`` or ``/* */`` comment: printable ASCII, every
  other character (line breaks, NUL, lone surrogates, non-ASCII) and the backslash
  written as an escape such as ``\\x0a``, and neither ``*/`` nor ``??`` (a trigraph);
- :func:`py_literal`: a Python literal (numbers, strings, tuples, slices) in ASCII.

:func:`check_lines` is a generator's last step, applied to each line before the lines
are joined: every line is printable ASCII, so text that bypassed these functions (a line
break, NUL, a lone surrogate) fails loudly instead of running.
"""

import builtins
import keyword
import math
import re

import numpy as np

from geon.op_graph.symbols import Sym

from geon.errors import GeonError

#: Names an identifier made from text never takes: they would change what the
#: generated code means (``min``, ``range``, ``slice``, ``float`` ... are called by it).
RESERVED = frozenset(keyword.kwlist) | frozenset(dir(builtins))
#: Longer names are cut (uniqueness comes from :func:`identifier`'s suffix).
MAX_IDENTIFIER = 48

_NOT_IDENTIFIER = re.compile(r"[^A-Za-z0-9_]")
_PLAIN = re.compile(r"[ -~]*\Z")  # printable ASCII
_PLAIN_TEXT = re.compile(r"[ -~\n]*\Z")  # lines of printable ASCII


def identifier(text, taken):
    """A Python identifier made from ``text`` and not in ``taken`` (a set it is added to).

    Every character outside ``[A-Za-z0-9_]`` becomes ``_`` (so no two names compare
    equal only after Unicode normalization), a name not starting with a letter gets an
    ``n`` in front, and a name already taken or reserved (:data:`RESERVED`) gets a
    suffix ``_1``, ``_2`` ... The result depends only on ``text`` and ``taken``.
    """
    base = _NOT_IDENTIFIER.sub("_", str(text))[:MAX_IDENTIFIER]
    if not base[:1].isalpha():
        base = "n" + base
    name, k = base, 1
    while name in taken or name in RESERVED:
        name, k = f"{base}_{k}", k + 1
    taken.add(name)
    return name


def _escape(c):
    o = ord(c)
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}"


def comment(text):
    """``text`` made safe for any comment of Python or C (see the module docstring):
    printable ASCII without a backslash, ``*/`` or ``??``; anything else escaped."""
    text = str(text)
    if _PLAIN.match(text) and "\\" not in text and "*/" not in text and "??" not in text:
        return text
    out, prev = [], ""
    for c in text:
        plain = " " <= c <= "~" and c != "\\" and prev + c not in ("*/", "??")
        out.append(c if plain else _escape(c))
        prev = c
    return "".join(out)


def py_literal(value):
    """Python source (ASCII) of ``value``: ``None``, a bool, an integer, a float, a
    string, ``...``, a slice or a tuple of those. Raises :class:`GeonError` for others."""
    if value is None or isinstance(value, (bool, np.bool_)):
        return repr(None if value is None else bool(value))
    if value is Ellipsis:
        return "..."
    if isinstance(value, Sym):  # a symbolic length: an expression over local names
        return repr(value)
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        f = float(value)
        return repr(f) if math.isfinite(f) else f"float('{f!r}')"
    if isinstance(value, str):
        return ascii(str.__str__(value))
    if isinstance(value, slice):
        parts = (value.start, value.stop, value.step)
        return f"slice({', '.join(py_literal(v) for v in parts)})"
    if isinstance(value, tuple):
        items = [py_literal(v) for v in value]
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    raise GeonError(f"internal: {type(value).__name__} {value!r} has no literal in "
                    f"generated code")


def check_lines(lines, language):
    """Raise :class:`GeonError` unless every one of ``lines`` (generated source in
    ``language``, "Python" or "CUDA C") is printable ASCII, does not end with a
    backslash (which joins the next line to it, in C even to a comment) and, in C, has
    no ``??`` (a trigraph): text from the graph that bypassed this module fails here
    instead of running."""
    lines = list(lines)
    text = "\n".join(lines)  # one scan of the whole text; line by line only to report
    if _PLAIN_TEXT.match(text) and text.count("\n") == len(lines) - 1 and (
            not text.endswith("\\") and "\\\n" not in text) and (
            language == "Python" or "??" not in text):
        return
    for n, line in enumerate(lines, 1):
        if not _PLAIN.match(line) or line.endswith("\\") or (
                language != "Python" and "??" in line):
            raise GeonError(f"line {n} of the generated {language} code is not printable "
                            f"ASCII or ends with a line continuation: {line!a} (text from "
                            f"the graph must go through geon.transformers.codegen_text)")
