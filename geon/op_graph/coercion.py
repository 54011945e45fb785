"""Op families and the coercions between them.

Every tensor op has named axes; the *family* of a tensor says how its axes are read.

``numpy``
    every axis is a :class:`PositionalAxis` with its canonical name: the k-th axis from
    the right is called ``-k`` (a (3, 4) tensor has axes ``(-2:3, -1:4)``). Built by
    :mod:`geon.np`; ops follow NumPy's rules (right-aligned broadcasting, ``axis=``).
``simple``
    the NumPy family plus named sample (batch) and recurrent axes, matched by name and
    carried through every NumPy-family op (see :mod:`geon.op_graph.simple_axes`).
``axes``
    named axes only (the Axes family of ``be.placeholder``, ``be.dot`` ...).

Scalars, and tensors whose only axes are sample or recurrent axes, belong to every
family. Because canonical names are aligned from the right, the name matching of the
core ops already broadcasts positional tensors as NumPy does in the common cases; the
hook installed here into :data:`geon.op_graph.op_graph.FAMILY_HOOKS` handles the rest
when an elementwise op is built: it stretches unit dimensions, puts the result's axes
in NumPy's order, gives the result NumPy's dtype, and coerces or refuses operands of
different families:

- a NumPy-family operand of an elementwise op whose other operands are of the Axes
  family takes, through an explicit :class:`ToAxes` op, the axes of the first Axes
  operand that has its shape (the rule for NumPy arrays in Axes ops); without such an
  operand the op raises :class:`FamilyError`;
- ``dot`` refuses NumPy-family operands (it contracts axes by name; ``be.np.dot`` and
  ``be.np.matmul`` contract by position).

Explicit conversions: :func:`with_axes` (NumPy family -> named axes) and
:func:`positional` (Axes family -> NumPy family, in a given axis order).

Ops built by passes (inside :class:`geon.op_graph.nodes.rewriting`) are left alone, and
so are operands whose positional axes do not carry their canonical names (the
intermediate values of NumPy-family ops): name matching is their meaning.
"""

import itertools
from typing import Optional, Sequence

import numpy as np

from geon.errors import ArgumentError, AxisMismatchError
from geon.op_graph import nodes
from geon.op_graph import op_graph as og
from geon.op_graph import primitives as pr
from geon.op_graph.axes import AxesLike, Axes, Axis, as_axes
from geon.op_graph.symbols import Sym, broadcast_lengths
from geon.op_graph.tables import NP_UFUNCS

NUMPY, SIMPLE, AXES, SCALAR, SAMPLE, INTERNAL = (
    "numpy", "simple", "axes", "scalar", "sample", "internal")

_FAMILY_WORDS = {NUMPY: "NumPy family", SIMPLE: "Simple-Axes family", AXES: "Axes family",
                 SCALAR: "scalar", SAMPLE: "sample axes only",
                 INTERNAL: "positional intermediate"}


class FamilyError(AxisMismatchError):
    """Operands of different op families were mixed where no coercion is unambiguous."""


class PositionalAxis(Axis):
    """A dimension known only by its position (NumPy and Simple-Axes families).

    Its canonical name is ``-k`` for the k-th dimension from the right, so that name
    matching aligns dimensions from the right as NumPy's broadcasting does.
    """

    __slots__ = ()


_temp_names = itertools.count()


def canonical_axes(shape: Sequence[int]) -> Axes:
    """The canonical positional axes of ``shape``: ``(-n:shape[0], ..., -1:shape[-1])``."""
    n = len(shape)
    return tuple(PositionalAxis(length if isinstance(length, Sym) else int(length),
                                f"-{n - i}") for i, length in enumerate(shape))


def temp_axis(length):
    """A positional axis with a fresh, non-canonical name (for contractions)."""
    return PositionalAxis(length, f"~{next(_temp_names)}")


def _special(axis):
    return not isinstance(axis, PositionalAxis) and (axis.batch or axis.recurrent)


def split_axes(x):
    """``(special axes, positional axes)`` of ``x``, each in ``x``'s order."""
    special, pos = [], []
    for a in x.axes:
        (pos if isinstance(a, PositionalAxis) else special).append(a)
    return special, pos


def family(x):
    """The family of the tensor op ``x``: ``"numpy"``, ``"simple"``, ``"axes"``,
    ``"scalar"`` (no axes), ``"sample"`` (only sample / recurrent axes) or
    ``"internal"`` (positional axes without their canonical names)."""
    axes = x.axes
    if not len(axes):
        return SCALAR
    special, pos = split_axes(x)
    if not pos:
        return SAMPLE if all(a.batch or a.recurrent for a in axes) else AXES
    n = len(pos)
    for i, a in enumerate(pos):
        if a.name != f"-{n - i}":
            return INTERNAL
    if not special:
        return NUMPY
    return SIMPLE if all(_special(a) for a in special) else INTERNAL


def positional_shape(x):
    """The lengths of the positional axes of ``x`` (its NumPy shape without the sample
    and recurrent axes)."""
    return tuple(a.length for a in x.axes if isinstance(a, PositionalAxis))


def describe(x):
    """``name (family, shape or axes)`` for error messages."""
    fam = family(x) if isinstance(x, og.TensorOp) else SCALAR
    if not isinstance(x, og.TensorOp):
        return f"{x!r} (a Python value)"
    if fam == NUMPY:
        detail = f"shape {x.axes.shape}"
    elif fam == SIMPLE:
        special, _ = split_axes(x)
        detail = (f"sample axes ({og._fmt(special)}), feature shape "
                  f"{positional_shape(x)}")
    else:
        detail = f"axes ({og._fmt(x.axes)})"
    return f"{x.name} ({_FAMILY_WORDS[fam]}, {detail})"


def _where():
    # DebugInfo walks out of geon's own frames to the user's line.
    return nodes.DebugInfo().file_info


_CONVERT_HINT = ("convert explicitly: be.np.with_axes(x, axes) names the axes of a "
                 "NumPy-family tensor, be.np.positional(y, order) gives the positional "
                 "view of an Axes tensor")


def family_error(what, operands, why, hint=True):
    """A :class:`FamilyError` naming the operands, their families and shapes or axes,
    and the user's source line."""
    return FamilyError(f"{what}: {why}: " + "; ".join(describe(o) for o in operands)
                       + (f"; {_CONVERT_HINT}" if hint else "") + f" (at {_where()})")


# --- coercion ops ------------------------------------------------------------------------

class ToAxes(og.CastAxes):
    """A NumPy-family tensor given named axes, dimension by dimension (a coercion)."""


class ToPositional(og.CastAxes):
    """An Axes-family tensor read by position: its axes, in order, become the canonical
    positional axes (a coercion; ``geon.op_graph.simple_axes.from_axes`` keeps the
    sample and recurrent axes named)."""


def with_axes(x: og.TensorOp, axes: AxesLike) -> og.TensorOp:
    """The NumPy-family (or Simple-Axes) tensor ``x`` with named ``axes``, matched by
    position; the lengths must agree. The result belongs to the Axes family."""
    x = og.as_op(x) if not isinstance(x, np.ndarray) else _np_constant(x)
    axes = as_axes(axes)
    if family(x) in (AXES,):
        raise family_error("with_axes", [x], "the tensor already has named axes")
    if len(axes) != len(x.axes) or (axes.lengths_known and axes.lengths != x.axes.lengths):
        raise AxisMismatchError(f"with_axes: {describe(x)} does not have the shape of "
                                f"({og._fmt(axes)}) (at {_where()})")
    if any(isinstance(a, PositionalAxis) for a in axes):
        raise AxisMismatchError(f"with_axes: ({og._fmt(axes)}) are positional axes; give "
                                f"named axes (at {_where()})")
    return ToAxes(x, axes)


def positional(x: og.TensorOp, axes: Optional[AxesLike] = None) -> og.TensorOp:
    """The positional (NumPy-family) view of ``x``, with its axes in the order ``axes``
    gives (by default ``x``'s own order). Sample and recurrent axes become positional
    too; see ``geon.op_graph.simple_axes.from_axes`` to keep them."""
    x = og.as_op(x)
    order = x.axes if axes is None else as_axes(axes)
    if not order.same_set(x.axes):
        raise AxisMismatchError(f"positional: ({og._fmt(order)}) is not an ordering of the "
                                f"axes of {describe(x)} (at {_where()})")
    order = Axes(x.axes.find(a.name) for a in order)
    if family(x) in (NUMPY, SCALAR):
        return x if order.names == x.axes.names else og.AxesWithOrder(x, order)
    if order.names != x.axes.names:
        x = og.AxesWithOrder(x, order)
    return ToPositional(x, canonical_axes(order.lengths))


def _np_constant(value):
    arr = np.asarray(value)
    return og.Constant(arr, axes=canonical_axes(arr.shape), dtype=arr.dtype)


# --- NumPy broadcasting and dtypes in elementwise ops -------------------------------------

def _has_positional(x):
    return isinstance(x, og.TensorOp) and any(isinstance(a, PositionalAxis) for a in x.axes)


def broadcast_result(operands, what):
    """The axes of the NumPy-style broadcast of ``operands`` (NumPy / Simple-Axes /
    sample-only tensors): their sample axes in order of appearance, then the canonical
    axes of the broadcast of their positional shapes."""
    special, seen = [], {}
    for x in operands:
        for a in x.axes:
            if isinstance(a, PositionalAxis):
                continue
            old = seen.get(a.name)
            if old is None:
                seen[a.name] = a
                special.append(a)
            elif old.length != a.length:
                raise AxisMismatchError(
                    f"{what}: axis {a.name} has length {old.length} in one operand and "
                    f"{a.length} in another: " + "; ".join(describe(o) for o in operands)
                    + f" (at {_where()})")
    shapes = [positional_shape(x) for x in operands]
    try:
        out = broadcast_lengths(*shapes)
    except (ValueError, TypeError) as e:   # (TypeError: SymbolicLengthError)
        why = f" ({e})" if isinstance(e, TypeError) else ""
        raise AxisMismatchError(
            f"{what}: operands could not be broadcast together with shapes "
            + " ".join(str(s) for s in shapes) + why + ": "
            + "; ".join(describe(o) for o in operands) + f" (at {_where()})") from None
    return Axes(special + list(canonical_axes(out)))


def drop_stretched(x, out_axes):
    """``x`` without its unit positional dimensions that ``out_axes`` (a broadcast
    result) stretches, as a row-major reshape; other axes keep their names."""
    _, pos = split_axes(x)
    out_pos = [a for a in out_axes if isinstance(a, PositionalAxis)]
    offset = len(out_pos) - len(pos)
    drop = {a.name for i, a in enumerate(pos)
            if a.length == 1 and out_pos[offset + i].length != 1}
    if not drop:
        return x
    return pr.Reshape(x, Axes(a for a in x.axes if a.name not in drop))


def numpy_dtype(fn, args):
    """The dtype NumPy's ``fn`` gives for operands like ``args`` (Python numbers stay
    Python numbers, so they are weak as in NumPy), or ``None``."""
    samples = []
    for a in args:
        if isinstance(a, og.Constant) and a.weak:
            samples.append(a._number)
        elif isinstance(a, og.TensorOp):
            samples.append(np.ones(1, a.dtype))
        else:
            samples.append(a)
    try:
        with np.errstate(all="ignore"):
            return np.asarray(fn(*samples)).dtype
    except Exception:  # NumPy refuses these dtypes (it would at run time too)
        return None


#: Elementwise op class -> the NumPy function whose dtype rule it follows (the ufuncs
#: of the standard classes; a plugin adds its elementwise primitives here).
NUMPY_DTYPE_RULES = {}


def numpy_dtype_rule(cls):
    """The NumPy function of ``cls`` or its nearest registered base class, or ``None``."""
    for c in cls.__mro__:
        fn = NUMPY_DTYPE_RULES.get(c)
        if fn is not None:
            return fn
    return None


def elementwise_hook(cls, args, kwargs):
    """Run before an elementwise op is built (see the module docstring)."""
    for a in args:  # (loops, not any(): this runs for every elementwise op built)
        if isinstance(a, og.TensorOp):
            for axis in a.axes:
                if isinstance(axis, PositionalAxis):
                    break
            else:
                continue
            break
    else:
        return args, kwargs
    if nodes.in_pass():
        return args, kwargs
    args = [_np_constant(a) if isinstance(a, np.ndarray) and a.ndim else a for a in args]
    tensors = [a for a in args if isinstance(a, og.TensorOp)]
    fams = [family(a) for a in tensors]
    if INTERNAL in fams:
        return args, kwargs
    what = cls.__name__
    if AXES in fams:
        return _coerce_to_axes(what, args, tensors, fams), kwargs
    operands = [a for a, f in zip(tensors, fams) if f != SCALAR]
    out = broadcast_result(operands, what)
    new = [drop_stretched(a, out) if isinstance(a, og.TensorOp) and len(a.axes) else a
           for a in args]
    union = Axes()
    for a in new:
        if isinstance(a, og.TensorOp):
            union = union | a.axes
    if union.names != out.names:
        i = next(i for i, a in enumerate(new) if isinstance(a, og.TensorOp) and len(a.axes))
        new[i] = og.Broadcast(new[i], out)
    if "dtype" not in kwargs and not issubclass(cls, og.Comparison):
        fn = numpy_dtype_rule(cls)
        dtype = numpy_dtype(fn, args) if fn is not None else None
        if dtype is not None:
            kwargs = dict(kwargs, dtype=dtype)
    return new, kwargs


def _coerce_to_axes(what, args, tensors, fams):
    named = [a for a, f in zip(tensors, fams) if f == AXES]
    out = []
    for a in args:
        if isinstance(a, og.TensorOp) and family(a) in (NUMPY, SIMPLE):
            like = next((n for n in named if n.axes.lengths_known and a.axes.lengths_known
                         and n.axes.shape == a.axes.shape), None)
            if like is None:
                raise family_error(what, tensors, "cannot mix op families (no Axes "
                                                  "operand has the NumPy operand's shape)")
            a = ToAxes(a, like.axes)
        out.append(a)
    return out


def dot_hook(a, b):
    """Refuse NumPy-family operands of the name-matching ``dot``."""
    if nodes.in_pass() or not (_has_positional(a) or _has_positional(b)):
        return
    fa, fb = family(og.as_op(a)), family(og.as_op(b))
    if INTERNAL in (fa, fb):
        return
    if fa in (NUMPY, SIMPLE) or fb in (NUMPY, SIMPLE):
        if fa in (SCALAR, SAMPLE) or fb in (SCALAR, SAMPLE):
            return
        mixed = AXES in (fa, fb)
        raise family_error("dot", [a, b], "dot contracts axes by name; NumPy-family "
                                          "tensors are contracted by position with "
                                          "be.np.dot, be.np.matmul or @", hint=mixed)


def numpy_constant(value, dtype=None, name=None):
    """A NumPy-family constant holding ``value`` (an array-like; its dtype unless
    ``dtype`` is given): ``geon.np.constant``."""
    arr = np.asarray(value, dtype=dtype)
    if arr.dtype.kind not in "biuf":
        raise ArgumentError(f"constant: cannot hold {arr.dtype} values")
    return og.Constant(arr, axes=canonical_axes(arr.shape), dtype=arr.dtype, name=name)


def _install():
    NUMPY_DTYPE_RULES.update(NP_UFUNCS)
    og.FAMILY_HOOKS["elementwise"] = elementwise_hook
    og.FAMILY_HOOKS["dot"] = dot_hook


_install()
