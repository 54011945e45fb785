"""``log`` and ``cos(2 pi u)`` in float64 as one fixed sequence of exactly specified
operations, so that every backend computes the same bits.

A platform's ``log`` and ``cos`` (NumPy's, the C library's, CUDA's) are accurate to an
ulp or so but not bit-identical to each other. The normal draws of
:mod:`geon.op_graph.random` must be, so they use the functions here instead. Each is
written once, as a *program* over a small set of float64 operations whose results IEEE
754 fixes exactly:

- ``add``, ``sub``, ``mul``, ``div``, ``sqrt`` (correctly rounded, round to nearest even),
  ``neg``;
- ``frexp`` (``x = m * 2**e`` with ``m`` in ``[0.5, 1)``: exact) and ``floor`` (exact);
- comparisons and ``select`` (no rounding at all).

The program runs on an *arithmetic*: :class:`NumPyArithmetic` evaluates it with NumPy's
element-wise ufuncs (never fused), and :class:`CArithmetic` writes it out as CUDA C, one
statement per operation in the same order, with ``__dadd_rn`` / ``__dmul_rn`` / ... (which
the CUDA compiler never contracts into a fused multiply-add). The constants are float64
numbers computed here, once, from exact rationals and written into the C source with
``repr`` (which reads back as the same double). Hence the same inputs give the same bits
on every backend by construction.

Accuracy (asserted in ``tests/test_random.py`` over about 10**5 points each, against
long-double references): ``log`` within 2 ulp of the exact value (1.5 measured) over
positive normal float64 numbers; ``cos_2pi(u)`` for ``u`` in ``[0, 1)`` within 2 ulp of
the exact ``cos(2 pi u)`` (1.6 measured) (its argument reduction is exact:
``4u`` and its fractional part are exact, so it is accurate near the zeros of ``cos``
too, where ``np.cos(2 * np.pi * u)`` is not).
"""

import math
from decimal import Decimal
from fractions import Fraction

import numpy as np

# 50 digits of pi and ln 2: far more than a double needs.
_PI = Fraction(Decimal("3.14159265358979323846264338327950288419716939937511"))
_LN2 = Fraction(Decimal("0.69314718055994530941723212145817656807550013436026"))


def _ln2_split():
    """``ln 2 = hi + lo`` with ``hi`` of 32 significant bits, so ``e * hi`` is exact for
    every binary exponent ``e`` of a double (11 bits)."""
    m, e = math.frexp(float(_LN2))
    hi = math.ldexp(math.floor(math.ldexp(m, 32)), e - 32)
    return hi, float(_LN2 - Fraction(hi))


LN2_HI, LN2_LO = _ln2_split()
SQRT_HALF = float(Fraction(Decimal("0.70710678118654752440084436210484903928483593768847")))

#: log(m) = 2 s + s z Q(z) with s = (m - 1) / (m + 1), z = s**2, Q(z) = sum_k 2/(2k+1) z**(k-1)
#: (the series of 2 atanh(s)); |s| <= 0.1716, so z**10 / 21 < 2**-57 bounds the rest.
LOG_Q = tuple(float(Fraction(2, 2 * k + 1)) for k in range(1, 11))
#: cos(pi r / 2) = sum_k C[k] r**(2k), sin(pi r / 2) = r sum_k S[k] r**(2k), |r| <= 1/2
#: (Taylor series; the first omitted terms are below 2**-60 relative).
COS_C = tuple(float((_PI / 2) ** (2 * k) / math.factorial(2 * k) * (-1) ** k)
              for k in range(0, 10))
SIN_S = tuple(float((_PI / 2) ** (2 * k + 1) / math.factorial(2 * k + 1) * (-1) ** k)
              for k in range(0, 10))


def _horner(a, coeffs, z):
    """``coeffs[0] + z (coeffs[1] + z (...))``, innermost first."""
    acc = a.const(coeffs[-1])
    for c in reversed(coeffs[:-1]):
        acc = a.add(a.const(c), a.mul(z, acc))
    return acc


def log_program(a, x):
    """The natural logarithm of ``x`` (positive, normal, finite) on arithmetic ``a``."""
    m, e = a.frexp(x)                       # x = m 2**e, m in [0.5, 1)
    low = a.lt(m, a.const(SQRT_HALF))
    m = a.select(low, a.mul(m, a.const(2.0)), m)             # exact
    e = a.select(low, a.sub(e, a.const(1.0)), e)             # m in [sqrt(1/2), sqrt(2))
    f = a.sub(m, a.const(1.0))              # exact (Sterbenz)
    s = a.div(f, a.add(m, a.const(1.0)))
    z = a.mul(s, s)
    tail = a.mul(s, a.mul(z, _horner(a, LOG_Q, z)))          # log(m) - 2 s
    lo = a.add(a.mul(e, a.const(LN2_LO)), tail)
    return a.add(a.mul(e, a.const(LN2_HI)), a.add(a.mul(s, a.const(2.0)), lo))


def cos_2pi_program(a, u):
    """``cos(2 pi u)`` for ``u`` in ``[0, 1)`` with at most 53 significant bits below
    the binary point (every uniform draw) on arithmetic ``a``."""
    t = a.mul(u, a.const(4.0))              # exact: quarter turns, in [0, 4)
    q = a.floor(t)
    r = a.sub(t, q)                         # exact, in [0, 1)
    up = a.gt(r, a.const(0.5))
    r = a.select(up, a.sub(r, a.const(1.0)), r)              # exact, in [-1/2, 1/2]
    q = a.select(up, a.add(q, a.const(1.0)), q)              # 0 .. 4
    r2 = a.mul(r, r)
    c = _horner(a, COS_C, r2)                                # cos(pi r / 2)
    s = a.mul(r, _horner(a, SIN_S, r2))                      # sin(pi r / 2)
    # cos(pi q / 2 + x) for q mod 4 = 0, 1, 2, 3: cos x, -sin x, -cos x, sin x
    q4 = a.sub(q, a.mul(a.floor(a.mul(q, a.const(0.25))), a.const(4.0)))  # exact
    return a.select(a.eq(q4, a.const(0.0)), c,
                    a.select(a.eq(q4, a.const(1.0)), a.neg(s),
                             a.select(a.eq(q4, a.const(2.0)), a.neg(c), s)))


def normal_program(a, u1, u2):
    """Box-Muller: ``sqrt(-2 log u1) cos(2 pi u2)`` for ``u1`` in ``(0, 1]``."""
    radius = a.sqrt(a.mul(a.const(-2.0), log_program(a, u1)))
    return a.mul(radius, cos_2pi_program(a, u2))


class NumPyArithmetic:
    """The operations on float64 NumPy arrays (element-wise ufuncs: correctly rounded,
    never fused)."""

    const = staticmethod(np.float64)
    add, sub, mul, div = np.add, np.subtract, np.multiply, np.divide
    sqrt, neg, floor = np.sqrt, np.negative, np.floor
    lt, gt, eq = np.less, np.greater, np.equal
    select = staticmethod(np.where)

    @staticmethod
    def frexp(x):
        m, e = np.frexp(x)
        return m, e.astype(np.float64)


def _as_f64(x):
    return np.asarray(x, dtype=np.float64)


def log(x):
    """:func:`log_program` on NumPy: ``log(x)`` element-wise, the same bits everywhere."""
    return log_program(NumPyArithmetic, _as_f64(x))


def cos_2pi(u):
    """:func:`cos_2pi_program` on NumPy: ``cos(2 pi u)`` for ``u`` in ``[0, 1)``."""
    return cos_2pi_program(NumPyArithmetic, _as_f64(u))


def normal_from_uniforms(u1, u2):
    """:func:`normal_program` on NumPy (float64)."""
    return normal_program(NumPyArithmetic, _as_f64(u1), _as_f64(u2))


class CArithmetic:
    """The operations written out as CUDA C statements (one ``const`` temporary each)."""

    def __init__(self):
        self.lines = []
        self._n = 0

    def _tmp(self, ctype, expr):
        self._n += 1
        name = f"t{self._n}"
        self.lines.append(f"    const {ctype} {name} = {expr};")
        return name

    @staticmethod
    def const(v):
        v = float(v)
        assert math.isfinite(v)
        return f"({v!r})"

    def add(self, x, y):
        return self._tmp("double", f"__dadd_rn({x}, {y})")

    def sub(self, x, y):
        return self._tmp("double", f"__dsub_rn({x}, {y})")

    def mul(self, x, y):
        return self._tmp("double", f"__dmul_rn({x}, {y})")

    def div(self, x, y):
        return self._tmp("double", f"__ddiv_rn({x}, {y})")

    def sqrt(self, x):
        return self._tmp("double", f"__dsqrt_rn({x})")

    def neg(self, x):
        return self._tmp("double", f"-{x}")

    def floor(self, x):
        return self._tmp("double", f"floor({x})")

    def lt(self, x, y):
        return self._tmp("bool", f"{x} < {y}")

    def gt(self, x, y):
        return self._tmp("bool", f"{x} > {y}")

    def eq(self, x, y):
        return self._tmp("bool", f"{x} == {y}")

    def select(self, c, x, y):
        return self._tmp("double", f"{c} ? {x} : {y}")

    def frexp(self, x):
        self._n += 1
        e = f"e{self._n}"
        self.lines.append(f"    int {e};")
        m = self._tmp("double", f"frexp({x}, &{e})")
        return m, self._tmp("double", f"(double){e}")


def c_function(name, program, nargs):
    """CUDA C source of ``__device__ double name(double a0, ...)`` running ``program``."""
    a = CArithmetic()
    args = [f"a{i}" for i in range(nargs)]
    result = program(a, *args)
    params = ", ".join(f"double {x}" for x in args)
    return "\n".join([f"__device__ double {name}({params}) {{", *a.lines,
                      f"    return {result};", "}", ""])


#: The device functions geon_log, geon_cos_2pi and geon_normal (Box-Muller).
CUDA_SOURCE = ("// float64 log, cos(2 pi u) and Box-Muller as fixed sequences of IEEE operations\n"
               "// (geon/op_graph/portable_math.py): the same bits as the NumPy code\n"
               + c_function("geon_log", log_program, 1)
               + c_function("geon_cos_2pi", cos_2pi_program, 1)
               + c_function("geon_normal", normal_program, 2))
