"""The NumPy backend's layout (geon/transformers/numpy/): the compiled path's
bookkeeping derived from its C rules, found through one table. (The size of modules
and functions is tested for the whole package in tests/test_architecture.py.)"""

import numpy as np

import geon as be
from geon.op_graph import op_graph as og
from geon.op_graph.np_ops import Select
from geon.transformers.numpy import c_rules

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
