"""Algebraic simplification and constant folding.

Rules fire only where the replacement has exactly the op's axes (in order) and dtype,
so broadcasting ops (``x(C) + zeros(C, N)``) are left alone.

The identities keep IEEE results bit for bit, signed zeros, infinities and NaN
included: ``x + (-0.0)`` and ``x - 0.0`` are ``x``, but ``x + 0.0`` and ``x - (-0.0)``
are not (``+0.0`` at ``x = -0.0``), and ``x * 0`` is zeros for integers only. Two rules
change results on purpose, to compute the exact value more closely: ``log(exp(x)) ->
x`` (no overflow of ``exp``) and ``exp(x) - 1 -> expm1(x)`` (no cancellation near 0;
``-0.0`` at ``x = -0.0``, where the literal form gives ``+0.0``); one for speed, within
about an ulp: ``x ** 3 -> x * x * x`` in floats (see :func:`pow_small`).
"""

import numpy as np

from geon.op_graph import op_graph as og
from geon.op_graph import primitives as pr
from geon.op_graph.ordering import VIEW_CLASSES
from geon.transformers.passes import RewritePass

#: Constants up to this many elements are folded; bigger results only if uniform.
FOLD_LIMIT = 4096


def _const_value(op):
    """The single number ``op`` holds everywhere, if it is such a constant."""
    if isinstance(op, og.Constant):
        v = op.scalar
        if v is None and op.value.size and op.value.size <= FOLD_LIMIT:
            flat = op.value.reshape(-1)
            if np.all(flat == flat[0]):
                v = flat[0]
        return v
    return None


def _is(op, number):
    v = _const_value(op)
    return v is not None and v == number


def _same_type(new, op):
    return new.axes == op.axes and new.dtype == op.dtype


def _keep(x, op):
    """``x`` if it can stand in for ``op`` as it is, else ``None``."""
    return x if _same_type(x, op) else None


def _is_zero(op, negative, result):
    """Whether ``op`` is zero everywhere, and for a float or complex ``result`` dtype
    also of the given sign: under IEEE ``-0.0 + 0.0`` is ``+0.0``, so ``x + 0.0``
    is not ``x`` at ``x = -0.0`` (``1 / (x + 0.0)`` is ``+inf`` there), while
    ``x + (-0.0)`` and ``x - 0.0`` are ``x`` for every ``x``, NaN and infinities
    included. An integer zero operand of a float op converts to ``+0.0``."""
    if not isinstance(op, og.Constant) or not op.value.size or (
            op.scalar is None and op.value.size > FOLD_LIMIT):
        return False
    v = op.value
    if not np.all(v == 0):
        return False
    if result.kind not in "fc":
        return True  # integers and bools have one zero
    if v.dtype.kind == "c":  # both parts' signs count
        v = np.stack([v.real, v.imag])
    sign = np.signbit(v) if v.dtype.kind == "f" else np.zeros(v.shape, bool)
    return bool(np.all(sign)) if negative else not bool(np.any(sign))


def add_zero(op):  # x + (-0) -> x ; (-0) + x -> x (any zero for integers)
    a, b = op.args
    if _is_zero(b, True, op.dtype):
        return _keep(a, op)
    if _is_zero(a, True, op.dtype):
        return _keep(b, op)
    return None


def sub_zero(op):  # x - (+0) -> x (any zero for integers)
    a, b = op.args
    return _keep(a, op) if _is_zero(b, False, op.dtype) else None


def mul_one_zero(op):  # x * 1 -> x ; x * 0 -> 0 for integer or bool x only
    a, b = op.args
    pairs = [(x, v) for x, v in ((a, _const_value(b)), (b, _const_value(a)))
             if v is not None]
    for x, v in pairs:
        if v == 1:
            r = _keep(x, op)
            if r is not None:
                return r
    for x, v in pairs:
        # NaN * 0 and inf * 0 are NaN under IEEE: a float x is never known finite
        if v == 0 and x.dtype.kind in "iub":
            return og.Constant(0, axes=op.axes, dtype=op.dtype)
    return None


def div_one(op):  # x / 1 -> x
    a, b = op.args
    return _keep(a, op) if _is(b, 1) else None


def pow_small(op):  # x ** 1 -> x ; x ** 2 -> square(x) ; x ** -1 -> 1 / x ; x ** 3 -> x * x * x
    """Both sides of the first three are one correctly rounded result. ``x ** 3`` (GELU's
    tanh form) becomes two products in floats: within an ulp or so of ``pow``, the
    rounding PyTorch's ``pow(x, 3)`` gives, and a hundred times faster than the C
    library's ``pow`` of a negative base."""
    a, b = op.args
    if _is(b, 1):
        return _keep(a, op)
    if a.axes != op.axes:
        return None
    if _is(b, 2):
        return og.Square(a, dtype=op.dtype)
    if _is(b, -1) and op.dtype.kind == "f" and a.dtype == op.dtype:
        return og.Reciprocal(a, dtype=op.dtype)
    if _is(b, 3) and op.dtype.kind == "f" and a.dtype == op.dtype:
        return og.Multiply(og.Square(a, dtype=op.dtype), a, dtype=op.dtype)
    return None


def neg_neg(op):  # -(-x) -> x
    a = op.args[0]
    return _keep(a.args[0], op) if isinstance(a, og.Negative) else None


def _runs_as(op, a):
    """Whether ``op`` waits for nothing its operand ``a`` did not wait for (its
    other_deps, e.g. an assignment it was built ``follows=``): then a rule may compute
    ``op`` from ``a``'s own operands where ``a`` ran."""
    return all(d in a.other_deps for d in op.other_deps)


def log_exp(op):  # log(exp(x)) -> x
    a = op.args[0]
    ok = isinstance(a, og.Exp) and _runs_as(op, a)
    return _keep(a.args[0], op) if ok else None


def exp_minus_one(op):  # exp(x) - 1 -> expm1(x) ; exp(x) + -1 and -1 + exp(x) too
    """One rounding instead of two, exact near 0 where ``exp(x) - 1`` cancels (``x =
    1e-10`` loses 8 of 16 digits), and one pass over the data instead of two. Only
    where no other op reads this ``exp`` op (computing it and ``expm1`` would cost
    more; an ``exp(x)`` built twice is merged only later, by ``cse``), and only in
    floats: an integer ``exp`` rounds before the subtraction."""
    a, b = op.args
    if isinstance(op, og.Subtract):
        e = a if _is(b, 1) else None
    else:
        e = a if _is(b, -1) else b if _is(a, -1) else None
    if not isinstance(e, og.Exp) or e.axes != op.axes or e.dtype != op.dtype \
            or op.dtype.kind != "f" or len(e.users) != 1 or e._dep_users \
            or not _runs_as(op, e):
        return None
    new = og.Expm1(e.args[0], dtype=op.dtype)
    for d in e.other_deps:  # the exp read its argument after these (an assignment)
        new.add_other_dep(d)
    return new


#: Ops whose value is a rearrangement of their one arg's elements.
_SAME_NUMBER = tuple(VIEW_CLASSES)


def fold_constants(op):  # f(constants) -> constant
    if not op.args:
        return None
    for a in op.args:  # (a loop, not all(): this rule sees almost every op)
        if not isinstance(a, og.Constant):
            return None
    if getattr(op, "communicates", False):
        return None  # its value depends on the other processes, and when it runs
    if any(a.value.size > FOLD_LIMIT for a in op.args) and not all(
            _const_value(a) is not None for a in op.args):
        return None
    numbers = [_const_value(a) for a in op.args]
    if isinstance(op, _SAME_NUMBER) and numbers[0] is not None \
            and op.dtype == op.args[0].dtype:
        # a broadcast, reordering or view of one number is that number: no array built
        return og.Constant(np.asarray(numbers[0], op.dtype)[()], axes=op.axes,
                           dtype=op.dtype)
    from geon.op_graph.reference import ELEMENTWISE_FUNCS, EVALUATORS
    ew = ELEMENTWISE_FUNCS.get(type(op))
    if ew is not None and all(v is not None for v in numbers):
        # One number everywhere in, one number out: no full-size arrays.
        with np.errstate(all="ignore"):
            v = np.asarray(ew(*[np.asarray(n, a.dtype) for n, a in zip(numbers, op.args)]))
        if not np.isnan(v):
            return og.Constant(v.astype(op.dtype)[()], axes=op.axes, dtype=op.dtype)
    fn = EVALUATORS.find(op)
    if fn is None or (op.axes.is_symbolic if isinstance(op, og.TensorOp) else False) \
            or any(a.axes.is_symbolic for a in op.args):
        return None  # (no array of a symbolic shape exists before a call)
    # The op alone on its constants; evaluate(op) would also run its other_deps (the
    # assignments it is ordered after), which may need feeds.
    value = np.array(fn(op, *[a.array() for a in op.args]))
    flat = value.reshape(-1)
    if flat.size and np.all(flat == flat[0]) and not np.isnan(flat[0]):
        return og.Constant(flat[0], axes=op.axes, dtype=op.dtype)
    if value.size > FOLD_LIMIT:
        return None
    return og.Constant(value, axes=op.axes, dtype=op.dtype)


class SimplifyPass(RewritePass):
    """Algebraic identities and constant folding."""

    name = "simplify"
    rules = [
        (og.Add, add_zero),
        (og.Add, exp_minus_one),
        (og.Subtract, sub_zero),
        (og.Subtract, exp_minus_one),
        (og.Multiply, mul_one_zero),
        (og.Divide, div_one),
        (og.Power, pow_small),
        (og.Negative, neg_neg),
        (og.Log, log_exp),
        ((og.ComputationOp, pr.ViewOp) + VIEW_CLASSES, fold_constants),
    ]
