"""Ops models need beyond the core set, in the Axes family (named axes).

Most are composites of the core ops: activations, ``where`` / ``clip``,
``log_softmax`` / ``logsumexp``, ``pad``, ``concat``, ``stack`` and ``tile`` build
ordinary ops, so derivatives, lowering and both backends need nothing new. The
semi-primitives they use where no composite is accurate or fast enough are
:class:`~geon.op_graph.op_graph.Erf`, :class:`~geon.op_graph.op_graph.Expm1`,
:class:`~geon.op_graph.op_graph.Softplus` and :class:`Select`
(elementwise), and, from :mod:`geon.op_graph.primitives`, ``Take`` / ``PutAdd``
(``gather`` and its adjoint), ``PrefixSum`` (``cumsum``) and ``SortPrim`` (``sort``,
``argsort``, ``topk``). The ops here with several results or a data-dependent access
pattern (``Gather``, ``ScatterAdd``, ``CumSum``, ``Sort``,
``TopK``) are Axes-family ops lowered to those primitives by
:mod:`geon.transformers.passes.lower`.

Every function here also accepts NumPy-family tensors where that makes sense (the
elementwise ones); :mod:`geon.op_graph.np_ops` has the positional forms with NumPy's
and PyTorch's signatures.
"""

import math
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from geon.errors import AxisMismatchError
from geon.op_graph import op_graph as og
from geon.op_graph import primitives as pr
from geon.op_graph import special
from geon.op_graph.axes import AxesLike, Axes, Axis, FlattenedAxis, as_axes
from geon.op_graph.derivatives import direction_axes
from geon.op_graph.special import align, op_site
from geon.op_graph.tables import ELEMENTWISE_FUNCS, adjoint_rule, evaluator, forward_rule
from geon.op_graph.nodes import DebugInfo
from geon.op_graph.op_graph import _fmt, _mismatch, as_op

__all__ = [
    "CumSum", "Gather", "ScatterAdd", "Sort", "TopK", "along_axis_index", "argsort",
    "clip", "concat", "cumsum", "elu", "gather", "gelu", "hard_sigmoid",
    "leaky_relu", "log_softmax", "logsumexp", "pad", "pad_axis", "relu", "scatter_add",
    "select", "selu", "silu", "sort", "sort_with_indices", "stack", "tile",
    "topk", "where",
]

#: The constants of SELU (Klambauer et al., 2017), as PyTorch uses them.
SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946


# --- selection -------------------------------------------------------------------------

class Select(og.ElementWise):
    """``where(c, a, b)``: ``a`` where ``c`` is nonzero, else ``b``, elementwise.

    A semi-primitive (it has an evaluator, NumPy code, reverse and forward rules, and is
    in the NumPy transformer's base set): composing it from arithmetic would turn an
    infinite or NaN value in the branch not taken into NaN.
    """

    arity = 3

    def _infer_dtype(self):
        return og.result_dtype(self.args[1:])

    def _promoted_args(self):
        # A Python number in a branch takes the other branch's dtype (where(c, x, 0)
        # with an int64 x stays exact); the condition's dtype plays no part.
        return self.args[1:]

    def compute_dtype(self) -> None:
        """``None``: no arithmetic; the branches are taken as they are (converting the
        condition could turn a tiny nonzero into zero)."""
        return None


ELEMENTWISE_FUNCS[Select] = np.where


@adjoint_rule(Select)
def _select_adjoint(op, delta):  # d where(c, a, b) = where(c, da, 0) + where(c, 0, db)
    c = op.args[0]
    return None, Select(c, delta, 0.0), Select(c, 0.0, delta)


@forward_rule(Select)
def _select_tangent(op, tangents):
    _, ta, tb = tangents
    if ta is None and tb is None:
        return None
    return Select(op.args[0], 0.0 if ta is None else ta, 0.0 if tb is None else tb)


def where(condition: og.TensorLike, x: og.TensorLike, y: og.TensorLike) -> og.TensorOp:
    """``x`` where ``condition`` is nonzero, else ``y`` (operands matched by axis name,
    as in every elementwise op). Derivatives flow to the branch taken only, so an
    infinite or NaN value in the other branch does no harm."""
    return Select(condition, x, y)


select = where


def clip(x: og.TensorLike, lo: Optional[og.TensorLike] = None,
         hi: Optional[og.TensorLike] = None) -> og.TensorOp:
    """``minimum(maximum(x, lo), hi)``; either bound may be ``None`` (no bound) or a
    tensor matched by axis name. As in NumPy and PyTorch, ``lo > hi`` gives ``hi``."""
    if lo is None and hi is None:
        raise ValueError("clip: give lo, hi or both")
    r = as_op(x)
    if lo is not None:
        r = og.Maximum(r, lo)
    if hi is not None:
        r = og.Minimum(r, hi)
    return r


# --- activations -----------------------------------------------------------------------

def relu(x: og.TensorLike) -> og.TensorOp:
    """``max(x, 0)``."""
    return og.Maximum(x, 0.0)


def leaky_relu(x: og.TensorLike, negative_slope: float = 0.01) -> og.TensorOp:
    """``x`` for ``x > 0``, else ``negative_slope * x`` (PyTorch's ``leaky_relu``)."""
    x = as_op(x)
    return where(x > 0.0, x, x * float(negative_slope))


def elu(x: og.TensorLike, alpha: float = 1.0) -> og.TensorOp:
    """``x`` for ``x > 0``, else ``alpha * (exp(x) - 1)`` (with ``expm1``, exact near
    0; the exponential sees ``min(x, 0)`` so the branch not taken never overflows)."""
    x = as_op(x)
    return where(x > 0.0, x, og.Expm1(og.Minimum(x, 0.0)) * float(alpha))


def selu(x: og.TensorLike) -> og.TensorOp:
    """``SELU_SCALE * elu(x, SELU_ALPHA)`` (scaled exponential linear unit)."""
    return elu(x, SELU_ALPHA) * SELU_SCALE


def gelu(x: og.TensorLike, approximate: str = "none") -> og.TensorOp:
    """Gaussian error linear unit, ``x * Phi(x)``: ``approximate="none"`` computes
    ``x / 2 * (1 + erf(x / sqrt(2)))``, ``"tanh"`` PyTorch's tanh approximation
    ``x / 2 * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3)))``."""
    x = as_op(x)
    if approximate == "none":
        return x * 0.5 * (og.Erf(x * float(1 / math.sqrt(2.0))) + 1.0)
    if approximate == "tanh":
        inner = (x + x * x * x * 0.044715) * float(math.sqrt(2.0 / math.pi))
        return x * 0.5 * (og.Tanh(inner) + 1.0)
    raise ValueError(f"gelu: approximate must be 'none' or 'tanh', not {approximate!r}")


def silu(x: og.TensorLike) -> og.TensorOp:
    """``x * sigmoid(x)`` (also called swish)."""
    x = as_op(x)
    return x * og.Sigmoid(x)


def hard_sigmoid(x: og.TensorLike) -> og.TensorOp:
    """``clip(x / 6 + 1/2, 0, 1)`` (PyTorch's ``hardsigmoid``)."""
    return clip(as_op(x) * float(1 / 6) + 0.5, 0.0, 1.0)


# --- log-softmax -----------------------------------------------------------------------

def logsumexp(x: og.TensorLike, reduction_axes: Optional[AxesLike] = None,
              out_axes: Optional[AxesLike] = None) -> og.TensorOp:
    """``log(sum(exp(x)))`` over the reduction axes (the rule of
    ``Reduction``), computed as ``m + log(sum(exp(x - m)))``
    with ``m = max(x)``: no overflow, and its derivative is the softmax."""
    x = as_op(x)
    # The value does not depend on the shift, so no derivative flows through it.
    m = og.StopGradient(og.Max(x, reduction_axes, out_axes))
    s = og.Sum(og.Exp(x - m), m.args[0].reduction_axes, m.axes)
    return og.Log(s) + m


def log_softmax(x: og.TensorLike,
                normalization_axes: Optional[AxesLike] = None) -> og.TensorOp:
    """``log(softmax(x))`` over ``normalization_axes`` (default: all but the batch and
    recurrent axes), computed as ``(x - m) - log(sum(exp(x - m)))``: exact for any
    logits, derivative ``d - softmax(x) * sum(d)``."""
    x = as_op(x)
    red = as_axes(normalization_axes) if normalization_axes is not None \
        else x.axes.sample_axes()
    shifted = x - og.StopGradient(og.Max(x, reduction_axes=red))
    return shifted - og.Log(og.Sum(og.Exp(shifted), reduction_axes=red))


# --- joining, padding, tiling ----------------------------------------------------------

def _built_at():
    """`` (built at File "...", line N)`` of the user's call."""
    return f" (built at {DebugInfo().file_info})"


def _axis_in(x, axis, what):
    """The axis of ``x`` named like ``axis`` (an Axis or a name)."""
    name = axis if isinstance(axis, str) else axis.name
    for a in x.axes:
        if a.name == name:
            return a
    raise AxisMismatchError(f"{what}: axis {name} is not in {x.name} ({_fmt(x.axes)})"
                            f"{_built_at()}")


def _replace(axes, old, new):
    return Axes(new if a.name == old.name else a for a in axes)


def join(parts, part_axes, out_axis, what):
    """The tensors ``parts`` laid end to end along ``out_axis``: part ``i`` fills the
    range of ``out_axis`` its axis ``part_axes[i]`` covers, in order. The other axes of
    every part must match the first's by name and length; the result has the first
    part's axes, ``part_axes[0]`` replaced by ``out_axis``. Each part is written into
    its range (an ``Unslice``, whose adjoint is a slice) and the parts are added."""
    first = parts[0]
    rest0 = first.axes - Axes(part_axes[0])
    total = sum(a.length for a in part_axes)
    if out_axis.length != total:
        raise AxisMismatchError(f"{what}: the result axis {out_axis!r} should have length "
                                f"{total}{_built_at()}")
    out = _replace(first.axes, part_axes[0], out_axis)
    pieces, start = [], 0
    for i, (p, a) in enumerate(zip(parts, part_axes)):
        rest = p.axes - Axes(a)
        if not rest.same_set(rest0) or rest.lengths != Axes(
                [rest0.find(n) for n in rest.names]).lengths:
            raise AxisMismatchError(
                f"{what}: operands must have the same axes except the joined one: "
                f"operand 0 {first.name} ({_fmt(first.axes)}) joined along "
                f"{part_axes[0]!r}, "
                f"operand {i} {p.name} ({_fmt(p.axes)}) along {a!r}{_built_at()}")
        target = _replace(out, out_axis, a)
        if p.axes.names != target.names:
            p = og.AxesWithOrder(p, target)
        key = [slice(None)] * len(out)
        key[out.index(out_axis)] = slice(start, start + a.length)
        start += a.length
        pieces.append(pr.Unslice(p, out, key))
    r = pieces[0]
    for p in pieces[1:]:
        r = r + p
    return r


def concat(xs: Sequence[og.TensorOp], axis: Axis,
           out_axis: Optional[Axis] = None) -> og.TensorOp:
    """``xs`` laid end to end along ``axis``: a name (or Axis) every operand has, with
    any lengths, or a list of one Axis per operand. The other axes must agree by name
    and length (a mismatch raises :class:`AxisMismatchError` naming each operand's axes).
    The result has the first operand's axes with the joined one replaced by
    ``out_axis`` (default: an axis of the total length named by the joined axes' names
    with ``+``, e.g. ``H+W``; an axis name means one axis within a graph)."""
    xs = [as_op(x) for x in xs]
    if not xs:
        raise ValueError("concat: need at least one tensor")
    if isinstance(axis, (list, tuple)):
        if len(axis) != len(xs):
            raise ValueError(f"concat: {len(xs)} tensors but {len(axis)} axes{_built_at()}")
        part_axes = [_axis_in(x, a, "concat") for x, a in zip(xs, axis)]
    else:
        part_axes = [_axis_in(x, axis, "concat") for x in xs]
    total = sum(a.length for a in part_axes)
    a0 = part_axes[0]
    if out_axis is None:
        out_axis = Axis(total, "+".join(a.name for a in part_axes), a0.batch, a0.recurrent)
    return join(xs, part_axes, out_axis, "concat")


def stack(xs: Sequence[og.TensorOp], axis: Axis, position: int = 0) -> og.TensorOp:
    """``xs`` (tensors with the same axes) joined along the new axis ``axis`` (of
    length ``len(xs)``), inserted at ``position`` in the first tensor's axes."""
    xs = [as_op(x) for x in xs]
    if not xs:
        raise ValueError("stack: need at least one tensor")
    if axis.length != len(xs):
        raise AxisMismatchError(f"stack: axis {axis!r} for {len(xs)} tensors{_built_at()}")
    if axis in xs[0].axes:
        raise AxisMismatchError(f"stack: axis {axis!r} is already in {xs[0].name} "
                                f"({_fmt(xs[0].axes)}){_built_at()}")
    parts, part_axes = [], []
    for i, x in enumerate(xs):
        if not x.axes.same_set(xs[0].axes):
            raise AxisMismatchError(
                f"stack: operands must have the same axes: operand 0 {xs[0].name} "
                f"({_fmt(xs[0].axes)}), operand {i} {x.name} ({_fmt(x.axes)}){_built_at()}")
        one = Axis(1, f"{axis.name}[{i}]")
        axes = list(xs[0].axes)
        axes.insert(position, one)
        parts.append(og.Broadcast(x, Axes(axes)))
        part_axes.append(one)
    return join(parts, part_axes, axis, "stack")


def tile(x: og.TensorOp, reps: Mapping[Any, int],
         out_axes: Optional[Mapping[str, Axis]] = None) -> og.TensorOp:
    """``x`` repeated along some of its axes: ``reps`` maps an axis (or name) to a
    repeat count; the axis is replaced by one ``count`` times as long, holding ``x``
    that many times in a row (NumPy's ``tile`` along that axis). ``out_axes`` maps an
    axis name to its replacement; by default ``H`` repeated 3 times becomes ``H*3``."""
    out_axes = dict(out_axes or {})
    x = as_op(x)
    r = x
    for axis, n in dict(reps).items():
        a = _axis_in(r, axis, "tile")
        n = int(n)
        if n < 1:
            raise ValueError(f"tile: repeat count {n} for axis {a!r} must be >= 1"
                             f"{_built_at()}")
        if n == 1:
            continue
        rep = Axis(n, f"({a.name})*{n}")
        order: list = []
        for b in r.axes:
            order.extend((rep, b) if b is a else (b,))
        wide = og.Broadcast(r, Axes(order))
        flat = og.Flatten(wide, Axes(FlattenedAxis(Axes((rep, b))) if b is a else b
                                     for b in r.axes))
        new = out_axes.get(a.name) or Axis(n * a.length, f"{a.name}*{n}", a.batch,
                                           a.recurrent)
        r = og.CastAxes(flat, _replace(r.axes, a, new))
    return r


PAD_MODES = ("constant", "reflect", "edge")


def pad_axis(x, axis, before, after, mode="constant", value=0.0, out_axis=None):
    """``x`` padded along its axis ``axis`` with ``before`` and ``after`` entries (see
    :func:`pad`); the padded axis becomes ``out_axis`` (default: ``H`` padded by 2 and 1
    becomes ``H+2+1``)."""
    if mode not in PAD_MODES:
        raise ValueError(f"pad: mode must be one of {PAD_MODES}, not {mode!r}")
    before, after = int(before), int(after)
    n = axis.length
    if before < 0 or after < 0:
        raise ValueError(f"pad: negative padding ({before}, {after}) along {axis!r}"
                         f"{_built_at()}")
    if out_axis is None:
        out_axis = Axis(n + before + after, f"{axis.name}+{before}+{after}", axis.batch,
                        axis.recurrent)
    if out_axis.length != n + before + after:
        raise AxisMismatchError(f"pad: the result axis {out_axis!r} should have length "
                                f"{n + before + after}{_built_at()}")
    if before == after == 0:
        return og.CastAxes(x, _replace(x.axes, axis, out_axis))
    if mode == "constant":
        out = _replace(x.axes, axis, out_axis)
        key = [slice(None)] * len(out)
        key[out.index(out_axis)] = slice(before, before + n)
        r = pr.Unslice(x, out, key)
        if value != 0:
            border = np.full(out_axis.length, float(value))
            border[before:before + n] = 0.0
            r = r + og.Constant(border, axes=Axes(out_axis), dtype=x.dtype)
        return r
    if n == 0 or (mode == "reflect" and (before >= n or after >= n)):
        raise AxisMismatchError(f"pad: {mode} padding ({before}, {after}) needs more than "
                                f"{max(before, after)} entries along {axis!r} of {x.name}"
                                f"{_built_at()}")
    parts, part_axes = [], []
    for count, side in ((before, 0), (None, None), (after, 1)):
        if count is None:
            parts.append(x)
            part_axes.append(axis)
            continue
        if count == 0:
            continue
        if mode == "edge":
            new = Axis(count, f"{axis.name}{'<>'[side]}{count}")
            one = og.Slice(x, axis, 0 if side == 0 else n - 1)
            part = og.Broadcast(one, _replace(x.axes, axis, new))
        else:  # reflect: the entries next to the edge, mirrored, edge excluded
            stop = n - 2 - count
            key = slice(count, 0, -1) if side == 0 else \
                slice(n - 2, stop if stop >= 0 else None, -1)
            part = og.Slice(x, axis, key)
            new = part.axes[x.axes.index(axis)]
        parts.append(part)
        part_axes.append(new)
    return join(parts, part_axes, out_axis, "pad")


def pad(x: og.TensorOp, paddings: Mapping[Any, Any], mode: str = "constant",
        value: float = 0.0, out_axes: Optional[Mapping[str, Axis]] = None) -> og.TensorOp:
    """``x`` padded along some of its axes: ``paddings`` maps an axis (or name) to
    ``(before, after)`` counts (or one count for both sides). ``mode``: ``"constant"``
    (``value``), ``"reflect"`` (mirrored at the edge, the edge not repeated: NumPy's
    and PyTorch's ``reflect``; counts below the axis length) or ``"edge"`` (the edge
    value repeated; PyTorch's ``replicate``). A padded axis is replaced by a longer one:
    ``out_axes`` maps an axis name to it; by default ``H`` padded by 2 and 1 becomes
    ``H+2+1``."""
    out_axes = dict(out_axes or {})
    x = as_op(x)
    r = x
    for axis, widths in dict(paddings).items():
        a = _axis_in(r, axis, "pad")
        if isinstance(widths, (int, np.integer)):
            widths = (widths, widths)
        before, after = widths
        r = pad_axis(r, a, before, after, mode, value, out_axes.get(a.name))
    return r


# --- gathering -------------------------------------------------------------------------

def _index_tensor(indices, what):
    if isinstance(indices, (int, np.integer)) and not isinstance(indices, bool):
        return og.Constant(np.int64(indices))  # one index: the axis goes away
    if isinstance(indices, (list, tuple, np.ndarray)):
        raise TypeError(f"{what}: give the indices as a tensor with axes, e.g. "
                        f"be.constant(np.array(...), axes=..., dtype=np.int64)")
    idx = as_op(indices)
    if idx.dtype.kind not in "iu":
        raise AxisMismatchError(f"{what}: indices {idx.name} must be integers, not "
                                f"{idx.dtype}{_built_at()}")
    return idx


class Gather(og.ComputationOp):
    """``x`` indexed along its axis ``axis`` by the integer tensor ``indices``: the
    result has ``x``'s axes with ``axis`` replaced, in place, by the axes of ``indices``
    (``gather(E, ids, V)`` of an embedding table ``E`` (V, D) and ids (N,) is (N, D)).
    Negative indices count from the end; others out of range raise
    :class:`~geon.errors.IndexOutOfRangeError` when the computation runs (on the GPU they
    are clamped). Lowered to the :class:`~geon.op_graph.primitives.Take` primitive; its
    adjoint is ``ScatterAdd``."""

    attrs = ("axis",)

    def __init__(self, x, indices, axis, **kwargs):
        x, idx = as_op(x), _index_tensor(indices, "gather")
        self.axis = _axis_in(x, axis, "gather")
        super().__init__(x, idx, **kwargs)

    def _infer_axes(self):
        x, idx = self.args
        clash = (x.axes - Axes(self.axis)) & idx.axes
        if len(clash):
            raise _mismatch(self, f"the indices' axes ({_fmt(idx.axes)}) replace axis "
                                  f"{self.axis!r}, but {_fmt(clash)} is also another axis "
                                  f"of the input", [x, idx])
        p = x.axes.index(self.axis)
        return Axes(tuple(x.axes)[:p] + tuple(idx.axes) + tuple(x.axes)[p + 1:])

    def _infer_dtype(self):
        return self.args[0].dtype


class ScatterAdd(og.ComputationOp):
    """The adjoint of ``Gather``: zeros with axis ``axis`` (a new axis, the one
    gathered from) in place of the axes of ``indices`` in ``d``, with each slice of
    ``d`` added at the index ``indices`` gives it (repeated indices accumulate)."""

    attrs = ("axis",)

    def __init__(self, d, indices, axis, **kwargs):
        self.axis = axis
        super().__init__(as_op(d), _index_tensor(indices, "scatter_add"), **kwargs)

    def _infer_axes(self):
        d, idx = self.args
        if len(idx.axes - d.axes) or self.axis in d.axes:
            raise _mismatch(self, f"d must have every axis of the indices and not "
                                  f"{self.axis!r}", [d, idx])
        names = idx.axes.names
        first = min(d.axes.index(n) for n in names) if names else len(d.axes)
        rest = d.axes - idx.axes
        return Axes(tuple(rest)[:first] + (self.axis,) + tuple(rest)[first:])

    def _infer_dtype(self):
        return self.args[0].dtype


def gather(x: og.TensorOp, indices: og.TensorOp, axis: Axis) -> og.TensorOp:
    """``x`` indexed along ``axis`` by the integer tensor ``indices`` (see
    ``Gather``): an embedding lookup is ``gather(table, ids, vocab_axis)``."""
    return Gather(x, indices, axis)


def scatter_add(d: og.TensorOp, indices: og.TensorOp, axis: Axis) -> og.TensorOp:
    """Zeros along the new axis ``axis`` with the slices of ``d`` added at ``indices``
    (see ``ScatterAdd``)."""
    return ScatterAdd(d, indices, axis)


# --- running sums ----------------------------------------------------------------------

class CumSum(og.ComputationOp):
    """Running sums of ``x`` along ``axis``: entry ``i`` is the sum of entries ``0..i``
    (``exclusive``: ``0..i-1``, so the first is 0) or, with ``reverse``, of entries
    ``i..n-1`` (``i+1..n-1``). The result has ``x``'s axes. Lowered to the
    :class:`~geon.op_graph.primitives.PrefixSum` primitive (reversal and the shift are
    views); its adjoint is the running sum in the other direction."""

    attrs = ("axis", "reverse", "exclusive")

    def __init__(self, x, axis, reverse=False, exclusive=False, **kwargs):
        x = as_op(x)
        self.axis = _axis_in(x, axis, "cumsum")
        self.reverse, self.exclusive = bool(reverse), bool(exclusive)
        super().__init__(x, **kwargs)

    def _infer_axes(self):
        return self.args[0].axes

    def _infer_dtype(self):
        return self.args[0].dtype


def cumsum(x: og.TensorOp, axis: Axis, reverse: bool = False,
           exclusive: bool = False) -> og.TensorOp:
    """Running sums along ``axis`` (see ``CumSum``)."""
    return CumSum(x, axis, reverse, exclusive)


# --- sorting ---------------------------------------------------------------------------

class Sort(og.MultiOutput):
    """``x`` sorted along ``axis`` (ascending, or ``descending``) and the int64
    positions along ``axis`` the values came from; equal values keep their order (a
    stable sort). Both outputs have ``x``'s axes. Lowered to the
    :class:`~geon.op_graph.primitives.SortPrim` primitive; the derivative of the values
    is a scatter-add of the delta to the positions (:func:`along_axis_index`)."""

    attrs = ("axis", "descending")

    def __init__(self, x, axis, descending=False, **kwargs):
        x = as_op(x)
        self.axis = _axis_in(x, axis, "sort")
        self.descending = bool(descending)
        super().__init__(x, **kwargs)

    def _output_types(self):
        x = self.args[0]
        return [(x.axes, x.dtype), (x.axes, np.dtype(np.int64))]


class TopK(og.MultiOutput):
    """The ``k`` largest entries of ``x`` along ``axis``, largest first, and their int64
    positions along ``axis`` (ties: the earlier position first). In both outputs
    ``axis`` is replaced by ``new_axis`` of length ``k`` (default ``"<axis>[:k]"``)."""

    attrs = ("axis", "k", "new_axis")

    def __init__(self, x, axis, k, new_axis=None, **kwargs):
        x = as_op(x)
        self.axis = _axis_in(x, axis, "topk")
        self.k = int(k)
        if not 0 < self.k <= self.axis.length:
            raise AxisMismatchError(f"topk: k = {self.k} for axis {self.axis!r} of "
                                    f"{x.name} ({_fmt(x.axes)}){_built_at()}")
        if new_axis is None:
            new_axis = Axis(self.k, f"{self.axis.name}[:{self.k}]", self.axis.batch,
                            self.axis.recurrent)
        if new_axis.length != self.k or new_axis.name in x.axes.names:
            raise AxisMismatchError(f"topk: the new axis {new_axis!r} must have length "
                                    f"{self.k} and a name not in {x.name} "
                                    f"({_fmt(x.axes)}){_built_at()}")
        self.new_axis = new_axis
        super().__init__(x, **kwargs)

    def _output_types(self):
        x = self.args[0]
        axes = _replace(x.axes, self.axis, self.new_axis)
        return [(axes, x.dtype), (axes, np.dtype(np.int64))]


def sort(x: og.TensorOp, axis: Axis, descending: bool = False) -> og.TensorOp:
    """``x`` sorted along ``axis`` (see ``Sort``)."""
    return Sort(x, axis, descending).outputs[0]


def argsort(x: og.TensorOp, axis: Axis, descending: bool = False) -> og.TensorOp:
    """The int64 positions along ``axis`` that sort ``x`` (stable; see ``Sort``)."""
    return Sort(x, axis, descending).outputs[1]


def sort_with_indices(x: og.TensorOp, axis: Axis,
                      descending: bool = False) -> tuple[og.TensorOp, ...]:
    """``(values, indices)`` of ``Sort``, from one sort."""
    return Sort(x, axis, descending).outputs


def topk(x: og.TensorOp, k: int, axis: Axis,
         new_axis: Optional[Axis] = None) -> tuple[og.TensorOp, ...]:
    """``(values, indices)``: the ``k`` largest entries along ``axis``, largest first
    (see ``TopK``)."""
    return TopK(x, axis, k, new_axis).outputs


def along_axis_index(x, idx, axis):
    """``(flat, flat_index)``: ``x`` flattened to one axis and the int64 positions in it
    of the entries that ``idx`` (positions along ``axis``, with ``x``'s other axes and
    its own in place of ``axis``) picks, so that ``gather(flat, flat_index, flat axis)``
    is NumPy's ``take_along_axis``. Sort and top-k differentiate through it: their
    adjoints are one scatter-add, their tangents one gather."""
    flat = og.flatten(x)
    strides, step = {}, 1
    for a in reversed(tuple(x.axes)):
        strides[a.name] = step
        step *= a.length
    others = x.axes - Axes(axis)
    offsets = np.zeros(others.shape, np.int64)
    for d, a in enumerate(others):
        shape = [1] * len(others)
        shape[d] = a.length
        offsets = offsets + np.arange(a.length).reshape(shape) * strides[a.name]
    index = idx * strides[axis.name]
    if len(others):
        index = index + og.Constant(offsets, axes=others, dtype=np.int64)
    return flat, index


# --- derivatives and reference values ----------------------------------------------------

@adjoint_rule(Gather)
def _gather_adjoint(op, d): return ScatterAdd(d, op.args[1], op.axis), None
@forward_rule(Gather)
def _gather_tangent(op, ts): return Gather(ts[0], op.args[1], op.axis)
@evaluator(Gather)
def _gather_value(op, x, idx):
    idx = special.checked_indices(idx, op.axis.length, op_site(op))
    return np.take(x, idx, axis=op.args[0].axes.index(op.axis))


@adjoint_rule(ScatterAdd)
def _scatter_add_adjoint(op, d): return Gather(d, op.args[1], op.axis), None
@forward_rule(ScatterAdd)
def _scatter_add_tangent(op, ts): return ScatterAdd(ts[0], op.args[1], op.axis)
@evaluator(ScatterAdd)
def _scatter_add_value(op, d, idx):
    dop, iop = op.args
    p = op.axes.index(op.axis)
    outer, inner = Axes(op.axes[:p]), Axes(op.axes[p + 1:])
    d3 = align(d, dop.axes, outer + iop.axes + inner).reshape(
        (outer.size, iop.axes.size, inner.size))
    out = np.zeros((outer.size, op.axis.length, inner.size), op.dtype)
    idx = special.checked_indices(np.reshape(idx, -1), op.axis.length, op_site(op))
    np.add.at(out, (slice(None), idx), d3)
    return out.reshape(op.axes.shape)


@adjoint_rule(CumSum)
def _cumsum_adjoint(op, d): return (CumSum(d, op.axis, not op.reverse, op.exclusive),)
@forward_rule(CumSum)
def _cumsum_tangent(op, ts): return CumSum(ts[0], op.axis, op.reverse, op.exclusive)
@evaluator(CumSum)
def _cumsum_value(op, x):
    p = op.args[0].axes.index(op.axis)
    if op.reverse:
        x = np.flip(x, p)
    c = np.cumsum(x, axis=p, dtype=op.dtype)
    if op.exclusive:
        c = np.concatenate([np.zeros_like(np.take(c, [0], axis=p)),
                            np.take(c, range(c.shape[p] - 1), axis=p)], axis=p)
    return np.flip(c, p) if op.reverse else c


def sorted_axis(op):
    """The axis a Sort, TopK or SortPrim sorts along."""
    return op.axis if not isinstance(op, pr.SortPrim) else op.args[0].axes[1]


# One rule for every sort (the primitive one too): the values' delta goes back to the
# positions they came from, and their tangent is read from there.
@adjoint_rule(Sort, TopK, pr.SortPrim)
def _sort_adjoint(op, d):
    if d[0] is None:
        return (None,)
    flat, index = along_axis_index(op.args[0], op.outputs[1], sorted_axis(op))
    return (og.Unflatten(ScatterAdd(d[0], index, flat.axes[0])),)


@forward_rule(Sort, TopK, pr.SortPrim)
def _sort_tangent(op, ts):
    t, x = ts[0], op.args[0]
    flat, index = along_axis_index(x, op.outputs[1], sorted_axis(op))
    tf = og.Flatten(t, Axes((flat.axes[0],) + tuple(direction_axes(t, x))))
    return (Gather(tf, index, flat.axes[0]), None)


@evaluator(Sort)
def _sort_value(op, x):
    return special.sort_along(x, op.args[0].axes.index(op.axis), op.descending)


@evaluator(TopK)
def _topk_value(op, x):
    p = op.args[0].axes.index(op.axis)
    return tuple(np.take(v, range(op.k), axis=p) for v in special.sort_along(x, p, True))
