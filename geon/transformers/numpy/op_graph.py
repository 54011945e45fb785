"""NumPy code for the elementwise ops of :mod:`geon.op_graph.op_graph` (one ufunc call
each, and the few that take more: sigmoid, erf, softplus), and the C expressions of the compiled
path (:data:`~geon.transformers.numpy.c_rules.C_RULES`) that the GPU does not share."""

import functools

import numpy as np

from geon.op_graph import op_graph as og
from geon.op_graph.reference import NP_UFUNCS
from geon.op_graph.symbols import Sym
from geon.transformers.c_expressions import call_rule, math_name
from geon.transformers.numpy.c_rules import C_RULES, sigmoid_limit
from geon.transformers.numpy import special_kernels
from geon.transformers.numpy.code_table import NUMPY_CODE, NUMPY_GLOBALS, _loop, numpy_code

def _ufunc_code(name):
    def code(op, out, args):
        # An integer result with an operand of another dtype (e.g. a weak float32 constant
        # such as the 1 in ``i + 1``): compute in the promoted type and cast back, as the
        # reference evaluator does ('same_kind' would refuse float64 -> int64).
        cast = ", casting='unsafe'" if op.dtype.kind in "iub" and any(
            a.dtype != op.dtype for a in op.args) else ""
        out_arg = f"out={out}" if name in _KEYWORD_OUT else out
        return [f"np.{name}({', '.join(args)}, {out_arg}{_loop(op)}{cast})"]
    return code


#: Ufuncs given ``out=`` as a keyword. The others get it positionally: NumPy 2.4 then
#: parses the call about 40 ns quicker (16 float32: np.add 476 ns against 802), and
#: Python compiles the line faster (a 5,000-op chain's function: 63 ms against 80).
#: np.maximum and np.minimum are the other way round: 3-4x slower with a positional
#: ``out`` (1.77 us against 0.55 on 16 float32, 3.2 against 0.95 on 1,000).
_KEYWORD_OUT = frozenset({"maximum", "minimum"})


#: class -> its ufunc rule (ModuleEmitter._ufunc_allocates checks that a class still
#: has it)
_UFUNC_RULES = {}
for _cls, _ufunc in NP_UFUNCS.items():
    NUMPY_CODE[_cls] = _UFUNC_RULES[_cls] = _ufunc_code(_ufunc.__name__)


#: A sigmoid of at least this many elements skips the clamp and lets ``exp`` overflow
#: to inf, with NumPy's overflow warning off for that one call (1 / (1 + inf) = 0): an
#: errstate costs about 1.4 us, the clamp 0.7 cycles per element (one ufunc of the
#: five, on a block of 131,072 float32 in cache), so the clamp is cheaper only below a
#: few thousand elements.
SIGMOID_UNCLAMPED = 8192
#: Below this many elements the clamp's bound is a NumPy scalar of the dtype (0.6 us on
#: 4 x 64 float32, against 1.5 us for a row made at the call: a row pays from a few
#: thousand elements).
SCALAR_CLAMP = 2048


@numpy_code(og.Sigmoid)
def _sigmoid(op, out, args):
    # 1 / (1 + exp(-x)), with no overflow warning: -x is clipped below exp's overflow
    # (small arrays) or exp's overflow warning is off (large ones, see SIGMOID_UNCLAMPED);
    # the two differ only where the result is subnormal.
    x, = args
    first = f"np.negative({x}, out={out}{_loop(op)})"
    rest = [f"np.add({out}, 1, out={out})", f"np.reciprocal({out}, out={out})"]
    # float16 never clamps: its clamp would be 11, and sigmoid(-20) 1.7e-5 instead of 0;
    # a symbolic size clamps (right for every length)
    size = op.axes.size
    if not isinstance(size, Sym) and size >= SIGMOID_UNCLAMPED or op.dtype.itemsize < 4:
        return [first, "with _overflow_ok():", f"    np.exp({out}, out={out})"] + rest
    limit = sigmoid_limit(op.dtype)
    bound = f"_row({limit}, {out})"
    if not isinstance(size, Sym) and size < SCALAR_CLAMP:
        bound = f"_clamp_{op.dtype.name}"
        NUMPY_GLOBALS.setdefault(bound, op.dtype.type(limit))
    return [first, f"np.minimum({out}, {bound}, out={out})",
            f"np.exp({out}, out={out})"] + rest


NUMPY_GLOBALS["_overflow_ok"] = functools.partial(np.errstate, over="ignore")


@numpy_code(og.Erf)
def _erf(op, out, args):
    # _c_kernels: whether the computation's compiled mode lets fixed C kernels run
    return [f"_erf({args[0]}, {out}, _c_kernels)"]


NUMPY_GLOBALS["_erf"] = special_kernels.erf


@numpy_code(og.Softplus)
def _softplus(op, out, args):
    return [f"np.logaddexp({args[0]}, 0, out={out})"]  # max(x, 0) + log1p(exp(-|x|))


# --- C ----------------------------------------------------------------------------
def _c_sigmoid(op, t, a):
    limit = repr(sigmoid_limit(op.dtype)) + ("f" if t == "float" else "")
    return f"(({t})1 / (({t})1 + {math_name('exp', t)}(geon_min_{t[0]}(-{a[0]}, {limit}))))"


def _c_softplus(op, t, a):
    x = a[0]
    return (f"({x} != {x} ? {x} : geon_max_{t[0]}({x}, ({t})0) + "
            f"{math_name('log1p', t)}({math_name('exp', t)}(-{math_name('fabs', t)}({x}))))")


# The C path's own rules (c_rules.py): ElementWise class -> fn(op, C type, [C args]) ->
# C expression. Plain arithmetic and single maths calls, written the same way for the
# GPU, are in geon/transformers/c_expressions.py.
for _cls, _rule in {
    og.Maximum: lambda op, t, a: f"geon_max_{t[0]}({a[0]}, {a[1]})",
    og.Minimum: lambda op, t, a: f"geon_min_{t[0]}({a[0]}, {a[1]})",
    og.Absolute: call_rule("fabs"),
    # NumPy's sign: 1, -1, 0 (also for -0) and NaN for NaN
    og.Sign: lambda op, t, a: (f"({a[0]} > 0 ? ({t})1 : {a[0]} < 0 ? ({t})-1 : "
                               f"{a[0]} == 0 ? ({t})0 : {a[0]})"),
    og.Sigmoid: _c_sigmoid,
    og.Softplus: _c_softplus,
}.items():
    C_RULES[_cls] = _rule
