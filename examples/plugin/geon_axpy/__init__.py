"""geon-axpy: an example transformer plugin for geon.

It adds one primitive, ``Axpy(a, x, y) = a * x + y``, a rule that rewrites the
standard subgraph ``add(multiply(a, x), y)`` into it, and a transformer (the NumPy
transformer plus both) that geon finds by the name ``geon-axpy`` through the
``geon.transformers`` entry point declared in ``pyproject.toml``.
"""

import sys

import geon as be
from geon.op_graph import op_graph as og
from geon.op_graph.autodiff import adjoint_rule
from geon.op_graph.coercion import NUMPY_DTYPE_RULES
from geon.op_graph.forward import forward_rule
from geon.op_graph.reference import ELEMENTWISE_FUNCS
from geon.transformers.numpy import NumPyTransformer, numpy_code
from geon.transformers.passes import RewritePass

__all__ = ["Axpy", "AxpyTransformer", "FuseAxpy", "axpy", "fuse_axpy"]
__version__ = "0.1.0"


# --- the primitive ---------------------------------------------------------------------------

class Axpy(og.ElementWise):
    """``a * x + y`` elementwise, in one primitive (operands matched as in ``add``).
    Without parameters beyond its dtype (``attrs`` inherited), it is compared, copied,
    printed and serialized like any op."""

    arity = 3


def axpy(a, x, y):
    """Build an :class:`Axpy` op. Only transformers with ``Axpy`` in their base set run
    it (``be.transformers_with(Axpy)`` names them)."""
    op = Axpy(a, x, y)
    # geon attributes an op to the first frame outside geon, here this function: point
    # errors and generated code at the frontend's line instead.
    caller = sys._getframe(1)
    op.filename, op.lineno = caller.f_code.co_filename, caller.f_lineno
    return op


def _value(a, x, y):
    return a * x + y


ELEMENTWISE_FUNCS[Axpy] = _value      # the reference semantics (and constant folding)
NUMPY_DTYPE_RULES[Axpy] = _value      # NumPy-family operands: NumPy's result dtype


@numpy_code(Axpy)
def _axpy_code(op, out, args):
    # One line: ``out`` may share its buffer with an operand (in-place memory plan).
    a, x, y = args
    return [f"np.add(np.multiply({a}, {x}), {y}, out={out})"]


@adjoint_rule(Axpy)
def _axpy_adjoint(op, delta):  # d(a x + y) = x da + a dx + dy
    a, x, _ = op.args
    return delta * x, delta * a, delta


@forward_rule(Axpy)
def _axpy_forward(op, tangents):
    a, x, _ = op.args
    ta, tx, ty = tangents
    out = None
    for t in (None if ta is None else ta * x, None if tx is None else a * tx, ty):
        if t is not None:
            out = t if out is None else out + t
    return out


# --- the rewrite ---------------------------------------------------------------------------

def fuse_axpy(op):  # a * x + y -> axpy(a, x, y) ; y + a * x -> axpy(a, x, y)
    for product, y in (op.args, op.args[::-1]):
        if (isinstance(product, og.Multiply) and product.axes == op.axes
                and product.dtype == op.dtype
                # fused only where nothing else reads the product (no double work)
                and all(u is op for u in product.users if u.forward is None)):
            return Axpy(*product.args, y, dtype=op.dtype)
    return None


class FuseAxpy(RewritePass):
    """Fuse a multiply feeding an add into one :class:`Axpy`."""

    name = "fuse_axpy"
    rules = [(og.Add, fuse_axpy)]


# --- the transformer ------------------------------------------------------------------------

class AxpyTransformer(NumPyTransformer):
    """The NumPy transformer with multiply-adds fused into :class:`Axpy`."""

    name = "geon-axpy"
    base_set = NumPyTransformer.base_set | {Axpy}
    frontend_ops = {"axpy": axpy}

    def passes(self):
        # After ``fold``: lowering has laid out every elementwise operand as its result
        # (so Axpy needs no lowering) and constants are folded; the standard passes
        # after it (cse, dce, alias, verify) still follow.
        return be.insert_passes(super().passes(), FuseAxpy(), after="fold")
