"""Two new ops, declared as a new op module of geon declares its ops (doc/architecture.rst
walks this file): ``softsign``, a function of one tensor, and ``scaled_tanh``, one with
two parameters.

Each op is one declaration here: its class, marked ``@primitive`` so that every
built-in transformer runs it as it is (it joins the standard base set when this module
is imported); its reference value; its derivative for both modes; and its building
function. Its attributes (``attrs``) give it CSE, cloning, printing and JSON. What a
backend runs for it is one entry in that backend's code file; tests/test_new_op.py makes
those entries (NumPy, the C shared by the compiled path and CUDA, torch) and checks all
of it.
"""

import numpy as np

from geon.op_graph import op_graph as og
from geon.op_graph.derivatives import scaled
from geon.op_graph.tables import (ELEMENTWISE_FUNCS, adjoint_rule, evaluator, forward_rule,
                                  primitive)


# --- softsign: a function of one tensor ---------------------------------------------------

@primitive
class Softsign(og.UnaryElementWise):
    """``x / (1 + |x|)``"""


ELEMENTWISE_FUNCS[Softsign] = lambda x: x / (1 + np.abs(x))


def _softsign_slope(op):
    return 1.0 / og.square(1.0 + og.absolute(op.args[0]))


adjoint_rule(Softsign)(lambda op, d: (d * _softsign_slope(op),))
forward_rule(Softsign)(scaled(_softsign_slope))


def softsign(x: og.TensorLike) -> og.TensorOp:
    """``x / (1 + |x|)``, elementwise."""
    return Softsign(x)


# --- scaled_tanh: an op with two parameters ------------------------------------------------

@primitive
class LeCunTanh(og.UnaryElementWise):
    """``alpha * tanh(beta * x)`` (LeCun's ``1.7159 tanh(2x / 3)`` by default)."""

    attrs = ("alpha", "beta")

    def __init__(self, x, alpha=1.7159, beta=2 / 3, **kwargs):
        self.alpha, self.beta = float(alpha), float(beta)
        super().__init__(x, **kwargs)


@evaluator(LeCunTanh)
def _scaled_tanh_value(op, x):
    x = np.asarray(x, op.dtype)
    return (op.alpha * np.tanh(op.beta * x)).astype(op.dtype)


def _scaled_tanh_slope(op):
    t = og.tanh(op.beta * op.args[0])
    return op.alpha * op.beta * (1.0 - t * t)


adjoint_rule(LeCunTanh)(lambda op, d: (d * _scaled_tanh_slope(op),))
forward_rule(LeCunTanh)(scaled(_scaled_tanh_slope))


def scaled_tanh(x: og.TensorLike, alpha: float = 1.7159, beta: float = 2 / 3) -> og.TensorOp:
    """``alpha * tanh(beta * x)``, elementwise."""
    return LeCunTanh(x, alpha, beta)
