"""The C rules of the compiled path: the C expression of each elementwise op a compiled
group may hold (:data:`C_RULES`, looked up with ``OpTable.find``), the C types of the
dtypes, and what follows from the rules: which maths functions the kernels call
(:func:`math_used`) and which members are slow (:func:`slow`), read off the C each rule
writes rather than listed by hand.

The rules themselves are registered beside the NumPy code of their ops, in the modules
that mirror the op modules (``numpy/op_graph.py``, ``numpy/np_ops.py``).
"""

import math
import re

import numpy as np

from geon.op_graph import op_graph as og
from geon.op_graph import primitives as pr
from geon.op_graph.tables import OpTable
from geon.transformers.c_expressions import C_EXPRESSIONS, math_name  # noqa: F401

_CTYPE = {np.dtype(np.float32): "float", np.dtype(np.float64): "double",
          np.dtype(np.bool_): "unsigned char",
          np.dtype(np.int8): "int8_t", np.dtype(np.int16): "int16_t",
          np.dtype(np.int32): "int32_t", np.dtype(np.int64): "int64_t",
          np.dtype(np.uint8): "uint8_t", np.dtype(np.uint16): "uint16_t",
          np.dtype(np.uint32): "uint32_t", np.dtype(np.uint64): "uint64_t"}
_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def sigmoid_limit(dtype):
    """The largest whole number whose exp is finite in ``dtype`` (11 for float16, 88 for
    float32, 709 for float64): the clamp of ``-x`` before ``exp`` in the sigmoid. Up to
    it the result is exact wherever it is a normal number; beyond it the result is
    already below the smallest normal number."""
    return float(math.floor(math.log(float(np.finfo(dtype).max))))


#: ElementWise class -> fn(op, C type of the compute dtype, [arg expressions]) -> C
#: expression. The args are already converted to the compute dtype (comparisons: their
#: promoted dtype; ``Select``: as they are). Ops without a rule here use their entry in
#: :data:`~geon.transformers.c_expressions.C_EXPRESSIONS` (shared with the GPU); see
#: :func:`rule`.
C_RULES = OpTable("C_RULES", "fn(op, C type, [C expressions]) -> C expression")
#: Decorator: ``@c_rule(Cls, ...)`` registers ``fn(op, t, args) -> C expression``.
c_rule = C_RULES.register


def rule(op):
    """The C rule of ``op``: its own in :data:`C_RULES`, else the shared expression, else
    ``None``."""
    return C_RULES.find(op) or C_EXPRESSIONS.find(op)


# --- what the rules call --------------------------------------------------------------
#: Maths functions the compiler turns into instructions: no call of the C library.
INSTRUCTIONS = frozenset({"fabs", "sqrt"})
#: Of those, the ones as quick as an addition (sqrt is as slow as a division).
QUICK = frozenset({"fabs"})
_CALL = re.compile(r"\b([A-Za-z_]\w*)\s*\(")


class _Sample:
    """What a rule may read of its op when it is written out to see what it calls: its
    dtype, and 1 for any parameter of the op (``op.alpha``)."""
    dtype = np.dtype(np.float64)

    def __getattr__(self, name):
        return 1


def _written(fn):
    """The C expression rule ``fn`` writes, in double, on args ``a0, a1, a2``."""
    return fn(_Sample(), "double", ["a0", "a1", "a2"])


def _calls(fn):
    """The maths functions (their double names) rule ``fn`` calls, in order."""
    return [n for n in _CALL.findall(_written(fn)) if not n.startswith("geon_")]


def math_used():
    """The C library's maths functions the rules call (double names; the float ones
    end in ``f``), in the order of the rules: the kernels declare their vector versions
    and the probe of the compiler calls each."""
    names = {}
    for fn in [*C_EXPRESSIONS.values(), *C_RULES.values()]:
        names.update((n, None) for n in _calls(fn) if n not in INSTRUCTIONS)
    return tuple(names)


_slow = {}   # rule -> whether it is slow


def slow(op):
    """Whether ``op``'s C code calls the C library's maths or divides (a long chain of
    dependent instructions: see ``c_codegen._segments``)."""
    fn = rule(op)
    if fn is None:
        return False
    known = _slow.get(fn)
    if known is None:
        text = _written(fn)
        known = _slow[fn] = "/" in text or any(n not in QUICK for n in _calls(fn))
    return known


def supported(op):
    """Whether ``op`` (an elementwise op) has a C rule for its dtypes."""
    if rule(op) is None or op.dtype not in _FLOATS:
        return False
    if any(a.dtype not in _CTYPE for a in op.args):
        return False
    ct = op.compute_dtype()
    if isinstance(op, og.Comparison):
        return ct in _CTYPE
    return ct is None or ct in _FLOATS


def row_sum(op):
    """Whether ``op`` may end a compiled group as a sum of a member's rows (the group
    finder checks that it reduces the second dimension of a 2-d member): a float
    ReduceSum of its own dtype, accumulated in double."""
    return isinstance(op, pr.ReduceSum) and op.dtype in _FLOATS \
        and op.args[0].dtype == op.dtype



def _literal(value, dtype):
    """A C expression of exactly ``value`` in ``dtype``."""
    t = _CTYPE[np.dtype(dtype)]
    v = np.asarray(value).astype(dtype)[()]
    if np.dtype(dtype).kind == "f":
        f = float(v)
        if f != f:
            return f"(({t})NAN)"
        if f in (float("inf"), float("-inf")):
            return f"(({t}){'-' if f < 0 else ''}INFINITY)"
        return f"(({t}){f.hex()})"
    if np.dtype(dtype).kind == "b":
        return "((unsigned char)1)" if v else "((unsigned char)0)"
    if np.dtype(dtype).kind == "u":
        return f"(({t}){int(v)}ULL)"
    iv = int(v)
    if iv == -2 ** 63:
        return "((int64_t)(-9223372036854775807LL - 1))"
    return f"(({t}){iv}LL)"



def simd_declarations():
    # glibc declares the vector versions only under -ffast-math; these declarations let
    # the compiler call them in `omp simd` loops without it.
    out = []
    for name in math_used():
        for t in ("float", "double"):
            args = f"{t}, {t}" if name == "pow" else t
            out.append(f"#pragma omp declare simd notinbranch\n{t} {math_name(name, t)}({args});")
    return "\n".join(out) + "\n"



def _c_comment(op):
    # the class only: op names differ between equal graphs, and the source is the key
    text = type(op).__name__
    return "".join(c if c.isalnum() or c in " _-.:" else "_" for c in text)
