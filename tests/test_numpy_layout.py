"""The NumPy backend's layout (geon/transformers/numpy/): the compiled path's
bookkeeping derived from its C rules, found through one table. (The size of modules
and functions is tested for the whole package in tests/test_architecture.py.)"""

import numpy as np

import geon as be
from geon.op_graph import op_graph as og
from geon.op_graph.np_ops import Select
from geon.transformers.c_expressions import C_EXPRESSIONS
from geon.transformers.numpy import c_rules

def test_the_maths_functions_are_read_off_the_c_rules():
    # in the order of the rules: the kernels declare their vector versions in it
    # (the shared expressions first, then the compiled path's own rules)
    assert c_rules.math_used() == ("exp", "log", "sin", "cos", "tanh", "expm1", "pow",
                                   "erf", "log1p")


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


def test_every_c_rule_is_found_through_the_tables():
    # the compiled path's own rules first, then the C it shares with the GPU
    for cls in (og.Sigmoid, og.Maximum, Select):
        assert c_rules.rule(cls.__new__(cls)) is c_rules.C_RULES[cls]
    for cls in (og.Add, og.Exp, og.Erf):
        assert cls not in c_rules.C_RULES
        assert c_rules.rule(cls.__new__(cls)) is C_EXPRESSIONS[cls]
    assert c_rules.rule(np.float32(1)) is None


def test_shared_c_expressions_are_what_both_backends_write():
    # one source: the compiled CPU path and the CUDA code write the same expression
    from geon.transformers.gpu.cuda import cuda_rule
    for cls in C_EXPRESSIONS:
        op = cls.__new__(cls)
        for t in ("float", "double"):
            assert cuda_rule(op)(op, ["a0", "a1"], t) == c_rules.rule(op)(op, t, ["a0", "a1"])
    assert cuda_rule(og.Exp.__new__(og.Exp))(None, ["x"], "float") == "expf(x)"
