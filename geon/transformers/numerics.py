"""The numerics debug mode (``check_numerics=True``): what is checked, and the error.

A transformer made with ``check_numerics=True`` checks the value of every floating-point
primitive right after computing it, and each floating-point feed when the computation is
called. The first value holding a NaN or an infinity raises
:class:`~geon.errors.NumericsError` naming the primitive, the user's op it was lowered
from (its ``derived_from``), where that op was built, and which of the primitive's
inputs were finite. Integer and boolean values are never checked: they cannot be NaN.
The NumPy transformer checks every primitive (it runs them unfused in this mode); the
GPU transformer checks what each kernel writes and computes a failing fused kernel's
ops again on the host (:func:`kernel_error`).

The backends generate the checks (nothing of this module runs when the mode is off);
this module holds what they share: which ops are checked and how the error reads.
"""

import numpy as np

from geon.errors import NumericsError
from geon.op_graph import op_graph as og


def checked(op):
    """Whether the debug mode checks ``op``'s value (a floating-point tensor)."""
    return isinstance(op, og.TensorOp) and np.dtype(op.dtype).kind in "fc"


def finite(value):
    """Whether every element of ``value`` is finite (integers always are)."""
    a = np.asarray(value)
    return a.dtype.kind not in "fc" or bool(np.isfinite(a).all())


def what_is_wrong(value):
    """``"NaN in 3 of 10 elements"`` / ``"Inf in ..."`` / both, for a non-finite value."""
    a = np.asarray(value)
    nan = int(np.isnan(a).sum())
    inf = int(np.isinf(a).sum())
    parts = [f"NaN in {nan}" if nan else "", f"Inf in {inf}" if inf else ""]
    return f"{', '.join(p for p in parts if p)} of {a.size} element(s)"


def describe(op):
    """``"<Class> <name>"`` of a primitive, with the user's op it came from."""
    text = f"{type(op).__name__} {op.name}"
    return f"{text} (from {op.derived_from})" if op.derived_from else text


def user_op(op):
    """``"<Class> <name>"`` of the op the user built that ``op`` was lowered from (``op``
    itself if no pass made it)."""
    return op.derived_from or f"{type(op).__name__} {op.name}"


def op_error(op, value, inputs, members=(), note=""):
    """The :class:`NumericsError` for ``op``, whose value ``value`` is not finite.

    ``inputs``: ``[(arg_op, finite, text)]``, ``text`` saying what is known of the
    arg's value (see :func:`inputs_status`). ``members``: the ops of the fused group
    that computed ``op`` (empty when it ran alone); ``note``: one more line.
    """
    lines = [f"check_numerics: {describe(op)} computed a value that is not finite "
             f"({what_is_wrong(value)})",
             f"  the user's op: {user_op(op)}, built at {op.file_info}"]
    for i, (a, _, text) in enumerate(inputs):
        lines.append(f"  input {i}: {describe(a)}: {text}")
    if not inputs:
        lines.append("  (it has no inputs)")
    if members:
        lines.append("  it ran in a fused kernel with: "
                     + ", ".join(describe(m) for m in members))
    if note:
        lines.append("  " + note)
    return NumericsError("\n".join(lines), op=op.name, user_op=user_op(op),
                         file_info=op.file_info,
                         inputs=[(a.name, ok) for a, ok, _ in inputs],
                         members=[m.name for m in members])


def feed_error(placeholder, value):
    """The :class:`NumericsError` for a placeholder fed a value that is not finite."""
    return NumericsError(
        f"check_numerics: placeholder {placeholder.name} (built at "
        f"{placeholder.file_info}) was fed a value that is not finite "
        f"({what_is_wrong(value)})",
        op=placeholder.name, user_op=f"Placeholder {placeholder.name}",
        file_info=placeholder.file_info)


def input_status(value):
    """``(finite, text)`` of an input's value."""
    if finite(value):
        return True, "finite"
    return False, f"not finite ({what_is_wrong(value)})"


def inputs_status(op, values, out=None):
    """``[(arg, finite, text)]`` for ``op``'s args, whose values (as the op read them)
    are ``values``. An arg whose storage the result ``out`` now occupies (computed in
    place; the debug mode avoids it where it can) was computed earlier in the call and
    checked then."""
    status = []
    for a, v in zip(op.args, values):
        if out is not None and isinstance(v, np.ndarray) and isinstance(out, np.ndarray) \
                and np.shares_memory(v, out):
            status.append((a, True, "finite when computed (its buffer now holds the "
                                    "result)"))
        else:
            status.append((a,) + input_status(v))
    return status


def _bad(value):
    if isinstance(value, tuple):
        return any(not finite(v) for v in value)
    return not finite(value)


def rerun(members, known):
    """Compute ``members`` (the ops of one fused kernel, in order) one by one on the
    host with the reference evaluators, from ``known`` (``{op: value}``: the values the
    kernel read, as they were before it ran). Returns ``(op, value, inputs)`` for the
    first member whose value is not finite (``inputs`` as for :func:`op_error`), or
    ``None`` if they all are (or one cannot be evaluated on the host)."""
    try:
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            return _rerun(members, dict(known))
    except Exception:  # an op without a host evaluator: report what the device gave
        return None


def _rerun(members, values):
    from geon.op_graph import primitives as pr
    from geon.op_graph.autodiff import find_rule
    from geon.op_graph.reference import EVALUATORS

    def value(a):
        # what no member computes is known; views and outputs of members are derived
        if a not in values:
            values[a] = find_rule(EVALUATORS, a)(a, value(a.args[0]))
        return values[a]

    for m in members:
        if isinstance(m, pr.Assign):  # its value is another member's, or was checked
            continue
        args = [value(a) for a in m.args]
        v = values[m] = find_rule(EVALUATORS, m)(m, *args)
        if checked_value(m) and _bad(v):
            bad = v if not isinstance(v, tuple) else next(x for x in v if not finite(x))
            return m, bad, [(a,) + input_status(x) for a, x in zip(m.args, args)]
    return None


def checked_value(op):
    """Whether ``op``'s value (or, for a multi-output op, one of its values) is checked."""
    outs = getattr(op, "outputs", None)
    if outs is not None:
        return any(checked(o) for o in outs)
    return checked(op)


def kernel_error(members, before, op, value):
    """The :class:`NumericsError` for a kernel computing ``members`` whose value of
    ``op`` is ``value`` (not finite). ``before``: ``{op: value}`` of what it read, as it
    was before the kernel ran. The members are computed again one by one on the host
    to name the first that goes wrong (an op the kernel kept in registers)."""
    others = [m for m in members if m is not op] if len(members) > 1 else []
    found = rerun(members, before)
    if found is not None:
        m, v, inputs = found
        note = ("found by computing the fused kernel's ops one by one on the host from "
                "the values it read" if len(members) > 1 else "")
        return op_error(m, v, inputs, [x for x in members if x is not m] if others else (),
                        note)
    inputs = []
    for a in op.args:
        if a in before:
            inputs.append((a,) + input_status(before[a]))
        else:
            inputs.append((a, True, "computed in the same kernel (not checked alone)"))
    return op_error(op, value, inputs, others,
                    "computed one by one on the host from the same inputs, the values are "
                    "finite: the device kernel differs from the reference")
