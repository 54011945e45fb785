"""The NumPy backend's layout (geon/transformers/numpy/): small modules and functions,
and the compiled path's bookkeeping derived from its C rules."""

import ast
import pathlib

import numpy as np

import geon as be
from geon.op_graph import op_graph as og
from geon.op_graph.np_ops import Select
from geon.transformers.numpy import c_rules

NUMPY_BACKEND = pathlib.Path(be.__file__).parent / "transformers" / "numpy"


def test_numpy_backend_modules_and_functions_stay_small():
    bad = []
    for m in sorted(NUMPY_BACKEND.rglob("*.py")) + [NUMPY_BACKEND.parent / "fusion.py"]:
        text = m.read_text(encoding="utf-8")
        if text.count("\n") > 800:
            bad.append(f"{m.name}: {text.count(chr(10))} lines (over 800)")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > 120:
                    bad.append(f"{m.name}:{node.lineno}: {node.name} has {n} lines")
    assert not bad, "\n".join(bad)


def test_the_maths_functions_are_read_off_the_c_rules():
    # in the order of the rules: the kernels declare their vector versions in it
    assert c_rules.math_used() == ("exp", "log", "sin", "cos", "tanh", "expm1", "pow",
                                   "log1p", "erf")


def test_slow_members_are_those_that_call_the_maths_library_or_divide():
    A = be.Axis(8, "SlowA")
    x, y = be.placeholder([A]), be.placeholder([A])
    slow = {type(op).__name__ for op in
            [x / y, be.reciprocal(x), be.sqrt(x), be.exp(x), be.log(x), be.sin(x),
             be.cos(x), be.tanh(x), be.expm1(x), x ** y, be.sigmoid(x),
             be.softplus(x), be.erf(x)]
            if c_rules.slow(op)}
    assert slow == {"Divide", "Reciprocal", "Sqrt", "Exp", "Log", "Sin", "Cos", "Tanh",
                    "Expm1", "Power", "Sigmoid", "Softplus", "Erf"}
    quick = [x + y, x - y, x * y, be.maximum(x, y), be.minimum(x, y), -x,
             be.absolute(x), be.sign(x), be.square(x), be.less(x, y)]
    assert not [type(op).__name__ for op in quick if c_rules.slow(op)]


def test_every_c_rule_is_found_through_the_table():
    for cls in (og.Add, og.Exp, og.Sigmoid, og.Erf, Select):
        assert c_rules.C_RULES.find(cls.__new__(cls)) is c_rules.C_RULES[cls]
    assert c_rules.C_RULES.find(np.float32(1)) is None
