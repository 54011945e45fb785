"""NumPy code and the C rule of :mod:`geon.op_graph.np_ops` (``where``)."""

from geon.op_graph.np_ops import Select
from geon.transformers.numpy.c_rules import c_rule
from geon.transformers.numpy.code_table import numpy_code


@numpy_code(Select)
def _select(op, out, args):
    c, a, b = args
    return [f"np.copyto({out}, np.where({c}, {a}, {b}), casting='unsafe')"]


@c_rule(Select)
def _c_select(op, t, a):
    return f"({a[0]} ? {a[1]} : {a[2]})"
