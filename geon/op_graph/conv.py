"""Convolution and pooling: the Axes-family ops, their semi-primitives, and their rules.

Two levels, as everywhere in geon:

- **Axes ops** (:class:`Convolution`, :class:`ConvolutionTranspose`, :class:`Pooling`)
  name the role of every axis: the input's channel and spatial axes, the filter's
  input-channel, kernel and output-channel axes, and the result's output-channel and
  spatial axes. Every other axis of the input is a *batch* axis carried through. The
  result has the input's axes in the input's order, with the channel axis replaced by
  the output-channel axis and each spatial axis by its output axis.
- **Semi-primitives** (:class:`Conv`, :class:`ConvGradData`, :class:`ConvGradFilter`,
  :class:`MaxPool`, :class:`MaxPoolGrad`, :class:`MaxPoolGather`) read their operands
  by position in one canonical layout: images ``(B, C, *S)``, filters ``(K, C/groups,
  *R)`` and results ``(B, K, *P)`` for the convolutions, ``(B, *S)`` for pooling.
  Lowering views the Axes ops' operands in that layout (a transpose, and a reshape
  that merges the batch axes into one).

The three convolution primitives are one bilinear map seen from its three sides:
``<Conv(x, w), d> = <x, ConvGradData(d, w)> = <w, ConvGradFilter(x, d)>``, so each one's
derivatives are the other two, to any order. Average pooling is a convolution with a
constant filter; max pooling routes derivatives to the first maximum of each window
(:class:`MaxPoolGrad` scatters, :class:`MaxPoolGather` gathers, and they are each
other's adjoints).

Padding is given per side as ``((lo, hi), ...)``; an output length is
``(L + lo + hi - dilation * (k - 1) - 1) // stride + 1``.
"""

import math
from typing import Any, Optional, Sequence, Union

import numpy as np

from geon.errors import AxisMismatchError
from geon.op_graph import op_graph as og
from geon.op_graph import primitives as pr
from geon.op_graph.symbols import Sym
from geon.op_graph.axes import Axes, AxesLike, Axis, FlattenedAxis, as_axes
from geon.op_graph.derivatives import terms
from geon.op_graph.tables import adjoint_rule, evaluator, forward_rule
from geon.op_graph.op_graph import ComputationOp, _fmt

from geon.op_graph.conv_math import (user_error, out_length, _ints, normalize_padding,
                                     _check_windows, tap_slices, pool_counts, _pad,
                                     _taps, reference_conv, reference_conv_grad_data,
                                     reference_conv_grad_filter, _lowest, _first_max,
                                     reference_max_pool, reference_max_pool_grad,
                                     reference_max_pool_gather, _to)  # noqa: F401
from geon.op_graph.conv_prims import (  # noqa: F401
    CONV_PRIMITIVES, _FOLD, Conv, ConvGradData, ConvGradFilter, ConvPrim, MaxPool, MaxPoolGather,
    MaxPoolGrad, PoolPrim, _check_real_tap, _conv_term, _merged, _pool_term)


# --- the Axes ops ---------------------------------------------------------------------------


def _find(x, axis, role, op):
    """``x``'s axis named like ``axis``, checked for length; errors name ``role``."""
    if axis.name not in x.axes.names:
        raise og._mismatch(op, f"{role} {axis!r} is not an axis of {x.name}", op.args)
    found = x.axes.find(axis.name)
    if axis.length is not None and found.length != axis.length:
        raise og._mismatch(op, f"{role} is {axis!r} but {x.name} has {found!r}", op.args)
    return found


def _resolve_out(op, axes, lengths, role):
    """``axes`` with the given lengths (set where unset, checked where set)."""
    for a, n in zip(axes, lengths):
        if a.length is None:
            a.length = n
        elif a.length != n:
            raise og._mismatch(op, f"{role} {a!r} should have length {n} (from the "
                                   f"convolution arithmetic)", op.args)
    return axes


class Convolution(ComputationOp):
    """Correlate the image ``x`` with the filter ``w`` over named spatial axes (see the
    module docstring and :func:`conv`).

    ``x`` has ``channel`` and the ``spatial`` axes (any other axis is a batch axis);
    ``w`` has ``filter_channel`` (``channel`` itself unless ``groups > 1``, where it
    has length ``channel.length // groups``), the ``kernel`` axes (one per spatial axis)
    and ``out_channel``. The result has ``x``'s axes with ``channel`` replaced by
    ``out_channel`` and each spatial axis by its ``out_spatial`` axis.
    """

    attrs = ("channel", "spatial", "filter_channel", "kernel", "out_channel",
             "out_spatial", "strides", "pads", "dilation", "groups")
    arity = 2

    def __init__(self, x, w, *, channel, spatial, filter_channel, kernel, out_channel,
                 out_spatial, strides, pads, dilation, groups, **kwargs):
        self.channel, self.filter_channel, self.out_channel = channel, filter_channel, \
            out_channel
        self.spatial, self.kernel = as_axes(spatial), as_axes(kernel)
        self.out_spatial = as_axes(out_spatial)
        self.strides, self.dilation = tuple(strides), tuple(dilation)
        self.pads, self.groups = tuple(tuple(p) for p in pads), int(groups)
        super().__init__(x, w, **kwargs)

    # The two sides of the underlying bilinear map, as (batch, channel axis, spatial).
    def _image_side(self):
        return self.channel, self.spatial

    def _result_side(self):
        return self.out_channel, self.out_spatial

    def _filter_axes(self):
        """The filter's axes in the canonical order (K, C/groups, *R) of :class:`Conv`."""
        return Axes((self.out_channel, self.filter_channel) + tuple(self.kernel))

    def _filter_roles(self):
        """The filter's axes other than its kernel axes, with their roles."""
        return [(self.filter_channel, "filter channel"), (self.out_channel, "output channel")]

    def _infer_axes(self):
        x, w = self.args
        n = len(self.spatial)
        if not (len(self.kernel) == len(self.out_spatial) == len(self.strides)
                == len(self.dilation) == len(self.pads) == n >= 1):
            raise og._mismatch(self, f"spatial ({_fmt(self.spatial)}), kernel "
                                     f"({_fmt(self.kernel)}) and out_spatial "
                                     f"({_fmt(self.out_spatial)}) differ in number",
                               self.args)
        c = _find(x, self.channel, "channel", self)
        spatial = [_find(x, a, "spatial axis", self) for a in self.spatial]
        found = {role: _find(w, a, role, self) for a, role in self._filter_roles()}
        kernel = [_find(w, a, "kernel axis", self) for a in self.kernel]
        extra = w.axes - Axes(list(found.values()) + kernel)
        if len(extra):
            raise og._mismatch(self, f"the filter has axes ({_fmt(extra)}) that are "
                                     f"neither channels nor kernel axes", self.args)
        if self.groups < 1 or c.length % self.groups:
            raise og._mismatch(self, f"groups={self.groups} does not divide channel "
                                     f"{c!r}", self.args)
        fc = found["filter channel"]
        oc = found.get("output channel", self.out_channel)
        return self._result_axes(x, c, spatial, fc, oc, kernel)

    def _result_axes(self, x, c, spatial, fc, oc, kernel):
        g = self.groups
        if fc.length * g != c.length:
            what = "matches" if g == 1 else f"times groups={g} must match"
            raise og._mismatch(self, f"filter channel {fc!r} {what} input channel {c!r}",
                               self.args)
        if oc.length % g:
            raise og._mismatch(self, f"groups={g} does not divide output channel {oc!r}",
                               self.args)
        lengths = [a.length for a in spatial]
        k = [a.length for a in kernel]
        _check_windows(self, lengths, k, self.strides, self.dilation, self.pads, None,
                       [f"spatial axis {a!r} with kernel axis {b!r}"
                        for a, b in zip(spatial, kernel)])
        outs = [out_length(L, kk, s, d, lo, hi) for L, kk, s, d, (lo, hi)
                in zip(lengths, k, self.strides, self.dilation, self.pads)]
        _resolve_out(self, self.out_spatial, outs, "output axis")
        return _replace(x.axes, [c] + spatial, [oc] + list(self.out_spatial), self)


class ConvolutionTranspose(Convolution):
    """The transpose of a :class:`Convolution` in its image (see :func:`conv_transpose`).

    ``x`` has ``channel`` and the ``spatial`` axes (the convolution's result side); ``w``
    has ``channel``, ``filter_channel`` (``out_channel`` itself unless ``groups > 1``,
    where it has length ``out_channel.length // groups``) and the ``kernel`` axes. The
    result has ``x``'s axes with ``channel`` replaced by ``out_channel`` and each
    spatial axis by its ``out_spatial`` axis, whose lengths must be set.
    """

    def _image_side(self):
        return self.out_channel, self.out_spatial

    def _result_side(self):
        return self.channel, self.spatial

    def _filter_axes(self):
        return Axes((self.channel, self.filter_channel) + tuple(self.kernel))

    def _filter_roles(self):
        return [(self.channel, "channel"), (self.filter_channel, "filter channel")]

    def _result_axes(self, x, c, spatial, fc, oc, kernel):
        g = self.groups
        if oc.length is None or any(a.length is None for a in self.out_spatial):
            raise og._mismatch(self, "the output axes need lengths", self.args)
        if fc.length * g != oc.length:
            raise og._mismatch(self, f"filter channel {fc!r} times groups={g} must match "
                                     f"output channel {oc!r}", self.args)
        k = [a.length for a in kernel]
        outs = [a.length for a in self.out_spatial]
        _check_windows(self, outs, k, self.strides, self.dilation, self.pads,
                       [a.length for a in spatial],
                       [f"output axis {a!r} for {b!r}" for a, b in zip(self.out_spatial,
                                                                      spatial)])
        return _replace(x.axes, [c] + spatial, [oc] + list(self.out_spatial), self)


def _replace(axes, old, new, op):
    """``axes`` with each of ``old`` replaced, in place, by the matching ``new``."""
    by_name = {a.name: b for a, b in zip(old, new)}
    out = [by_name.get(a.name, a) for a in axes]
    names = [a.name for a in out]
    if len(set(names)) != len(names):
        raise og._mismatch(op, f"the result axes ({_fmt(out)}) repeat an axis", op.args)
    return Axes(out)


class Pooling(ComputationOp):
    """Max (``kind="max"``) or average (``"avg"``) pooling of ``x`` over its ``spatial``
    axes (see :func:`max_pool`); every other axis is pooled independently. The result
    has ``x``'s axes with each spatial axis replaced by its ``out_spatial`` axis."""

    attrs = ("kind", "spatial", "out_spatial", "kernel", "strides", "pads", "dilation",
             "count_include_pad")
    arity = 1

    def __init__(self, x, *, kind, spatial, out_spatial, kernel, strides, pads, dilation,
                 count_include_pad, **kwargs):
        if kind not in ("max", "avg"):
            raise ValueError(f"Pooling: kind must be 'max' or 'avg', not {kind!r}")
        self.kind, self.count_include_pad = kind, bool(count_include_pad)
        self.spatial, self.out_spatial = as_axes(spatial), as_axes(out_spatial)
        self.kernel, self.strides = tuple(kernel), tuple(strides)
        self.pads, self.dilation = tuple(tuple(p) for p in pads), tuple(dilation)
        super().__init__(x, **kwargs)

    def _infer_axes(self):
        x = self.args[0]
        spatial = [_find(x, a, "spatial axis", self) for a in self.spatial]
        n = len(spatial)
        if not (len(self.out_spatial) == len(self.kernel) == len(self.strides)
                == len(self.pads) == len(self.dilation) == n >= 1):
            raise og._mismatch(self, "spatial axes, kernel, strides, padding and "
                                     "dilation differ in number", self.args)
        if self.kind == "avg" and any(d != 1 for d in self.dilation):
            raise og._mismatch(self, "average pooling has no dilation", self.args)
        lengths = [a.length for a in spatial]
        _check_windows(self, lengths, self.kernel, self.strides, self.dilation, self.pads,
                       None, [f"spatial axis {a!r}" for a in spatial])
        _check_real_tap(self, lengths)
        outs = [out_length(L, k, s, d, lo, hi) for L, k, s, d, (lo, hi)
                in zip(lengths, self.kernel, self.strides, self.dilation, self.pads)]
        _resolve_out(self, self.out_spatial, outs, "output axis")
        return _replace(x.axes, spatial, list(self.out_spatial), self)

    def _infer_dtype(self):
        return self.args[0].dtype


# --- public functions (Axes family) ---------------------------------------------------------


def _auto_out(spatial, out_spatial, suffix) -> Axes:
    """The given output axes, or new ones named ``<spatial name><suffix>``."""
    if out_spatial is None:
        return Axes(Axis(None, f"{a.name}{suffix}") for a in spatial)
    return as_axes(out_spatial)


def _kernel_axes(w, exclude, kernel) -> Axes:
    """The filter's kernel axes: as given, or its axes other than ``exclude``."""
    if kernel is None:
        names = {a.name for a in exclude}
        kernel = [a for a in w.axes if a.name not in names]
    return Axes(w.axes.find(a.name) if a.name in w.axes.names else a for a in kernel)


def conv(x: og.TensorOp, w: og.TensorOp, channel: Axis, spatial: AxesLike,
         out_channel: Axis, kernel: Optional[AxesLike] = None,
         filter_channel: Optional[Axis] = None,
         out_spatial: Optional[AxesLike] = None,
         strides: Union[int, Sequence[int]] = 1, padding: Any = 0,
         dilation: Union[int, Sequence[int]] = 1, groups: int = 1,
         name: Optional[str] = None) -> og.TensorOp:
    """Convolve (correlate, as deep-learning libraries do) ``x`` with the filter ``w``.

    Args:
        x: the image; it has ``channel`` and the ``spatial`` axes; its other axes are
            batch axes, carried through in place.
        w: the filter: ``filter_channel``, one kernel axis per spatial axis, and
            ``out_channel``.
        channel: ``x``'s channel axis.
        spatial: ``x``'s spatial axes (1, 2 or 3 of them, any number works).
        out_channel: the filter's output-channel axis; it replaces ``channel``.
        kernel: the filter's kernel axes, matched to ``spatial`` in order (default:
            the filter's axes other than its channel axes, in its order).
        filter_channel: the filter's input-channel axis (default ``channel``; with
            ``groups > 1`` an axis of length ``channel.length // groups``).
        out_spatial: the result's spatial axes; their lengths follow from the
            arithmetic (set if unset, checked if set). Default: ``<name>_out``.
        strides, dilation: an int or one per spatial axis.
        padding: an int, one int per axis, one ``(lo, hi)`` pair per axis, ``"same"``
            or ``"valid"`` (zero padding).
        groups: the channels split into ``groups`` independent convolutions
            (``groups == channel.length`` is a depthwise convolution).

    A mismatch of axes raises :class:`~geon.errors.AxisMismatchError` when the op is
    built, naming each axis as ``name:length``.
    """
    x, w = og.as_op(x), og.as_op(w)
    spatial = as_axes(spatial)
    n = len(spatial)
    filter_channel = channel if filter_channel is None else filter_channel
    kernel = _kernel_axes(w, (filter_channel, out_channel), kernel)
    strides = _ints(strides, n, "conv: strides", 1)
    dilation = _ints(dilation, n, "conv: dilation", 1)
    if len(kernel) != n:
        raise user_error(f"conv: {n} spatial axes ({_fmt(spatial)}) but kernel axes "
                         f"({_fmt(kernel)}) of filter {w.name} ({_fmt(w.axes)})")
    lengths = [x.axes[x.axes.index(a.name)].length if a.name in x.axes.names else a.length
               for a in spatial]
    pads = normalize_padding(padding, lengths, kernel.lengths, strides, dilation,
                             "conv: padding")
    return Convolution(x, w, channel=channel, spatial=spatial, filter_channel=filter_channel,
                       kernel=kernel, out_channel=out_channel,
                       out_spatial=_auto_out(spatial, out_spatial, "_out"),
                       strides=strides, pads=pads, dilation=dilation, groups=groups,
                       name=name)


def conv_transpose(x: og.TensorOp, w: og.TensorOp, channel: Axis,
                   spatial: AxesLike, out_channel: Axis,
                   kernel: Optional[AxesLike] = None,
                   filter_channel: Optional[Axis] = None,
                   out_spatial: Optional[AxesLike] = None,
                   strides: Union[int, Sequence[int]] = 1, padding: Any = 0,
                   output_padding: Union[int, Sequence[int]] = 0,
                   dilation: Union[int, Sequence[int]] = 1, groups: int = 1,
                   name: Optional[str] = None) -> og.TensorOp:
    """The transposed convolution (the derivative of :func:`conv` in its image).

    ``x`` has ``channel`` and the ``spatial`` axes; the filter ``w`` has ``channel``,
    ``filter_channel`` (default ``out_channel``; with ``groups > 1`` an axis of length
    ``out_channel.length // groups``) and one kernel axis per spatial axis. The result
    has ``x``'s axes with ``channel`` replaced by ``out_channel`` and each spatial axis by
    its output axis of length ``(L - 1) * stride - lo - hi + dilation * (k - 1) +
    output_padding + 1`` (``output_padding < stride`` picks among the lengths that a
    strided convolution maps to ``L``). ``padding`` is the padding of that convolution.
    """
    x, w = og.as_op(x), og.as_op(w)
    spatial = as_axes(spatial)
    n = len(spatial)
    filter_channel = out_channel if filter_channel is None else filter_channel
    kernel = _kernel_axes(w, (channel, filter_channel), kernel)
    if len(kernel) != n:
        raise user_error(f"conv_transpose: {n} spatial axes ({_fmt(spatial)}) but "
                         f"kernel axes ({_fmt(kernel)}) of filter {w.name} "
                         f"({_fmt(w.axes)})")
    strides = _ints(strides, n, "conv_transpose: strides", 1)
    dilation = _ints(dilation, n, "conv_transpose: dilation", 1)
    opad = _ints(output_padding, n, "conv_transpose: output_padding", 0)
    if any(o >= s for o, s in zip(opad, strides)):
        raise user_error(f"conv_transpose: output_padding {opad} must be smaller than "
                         f"the strides {strides}", ValueError)
    if isinstance(padding, str):
        raise user_error("conv_transpose: padding is explicit (an int, per axis or per "
                         "side), not 'same' or 'valid'", ValueError)
    pads = normalize_padding(padding, [0] * n, kernel.lengths, strides, dilation,
                             "conv_transpose: padding")
    out_spatial = _auto_out(spatial, out_spatial, "_out")
    for a, s_ax, k, s, d, (lo, hi), o in zip(out_spatial, spatial, kernel.lengths, strides,
                                             dilation, pads, opad):
        L = x.axes[x.axes.index(s_ax.name)].length if s_ax.name in x.axes.names \
            else s_ax.length
        if L is None or k is None:
            continue
        n_out = (L - 1) * s - lo - hi + d * (k - 1) + o + 1
        if a.length is None:
            a.length = n_out
        elif a.length != n_out:
            raise user_error(f"conv_transpose: output axis {a!r} should have length "
                             f"{n_out}")
    if out_channel.length is None and filter_channel.length is not None:
        out_channel.length = filter_channel.length * groups
    return ConvolutionTranspose(x, w, channel=channel, spatial=spatial,
                                filter_channel=filter_channel, kernel=kernel,
                                out_channel=out_channel, out_spatial=out_spatial,
                                strides=strides, pads=pads, dilation=dilation,
                                groups=groups, name=name)


def _pool(kind, x, spatial, kernel, strides, padding, dilation, count_include_pad,
          out_spatial, name):
    x = og.as_op(x)
    spatial = as_axes(spatial)
    n = len(spatial)
    what = f"{kind}_pool"
    kernel = _ints(kernel, n, f"{what}: kernel", 1)
    strides = kernel if strides is None else _ints(strides, n, f"{what}: strides", 1)
    dilation = _ints(dilation, n, f"{what}: dilation", 1)
    lengths = [x.axes.find(a.name).length if a.name in x.axes.names else a.length
               for a in spatial]
    pads = normalize_padding(padding, lengths, kernel, strides, dilation, f"{what}: padding")
    return Pooling(x, kind=kind, spatial=spatial,
                   out_spatial=_auto_out(spatial, out_spatial, "_pool"), kernel=kernel,
                   strides=strides, pads=pads, dilation=dilation,
                   count_include_pad=count_include_pad, name=name)


def max_pool(x: og.TensorOp, spatial: AxesLike, kernel: Union[int, Sequence[int]],
             strides: Union[int, Sequence[int], None] = None, padding: Any = 0,
             dilation: Union[int, Sequence[int]] = 1,
             out_spatial: Optional[AxesLike] = None,
             name: Optional[str] = None) -> og.TensorOp:
    """The maximum of each window of ``kernel`` elements over the ``spatial`` axes of
    ``x`` (``strides`` default to the kernel; padding as in :func:`conv`, with -inf).
    Derivatives go to the first maximum of each window. The result has ``x``'s axes
    with each spatial axis replaced by its ``out_spatial`` axis (default
    ``<name>_pool``)."""
    return _pool("max", x, spatial, kernel, strides, padding, dilation, True, out_spatial,
                 name)


def avg_pool(x: og.TensorOp, spatial: AxesLike, kernel: Union[int, Sequence[int]],
             strides: Union[int, Sequence[int], None] = None, padding: Any = 0,
             count_include_pad: bool = True, out_spatial: Optional[AxesLike] = None,
             name: Optional[str] = None) -> og.TensorOp:
    """The mean of each window (see :func:`max_pool`). With zero padding,
    ``count_include_pad`` divides by the kernel size, otherwise by the number of input
    elements in the window."""
    return _pool("avg", x, spatial, kernel, strides, padding, 1, count_include_pad,
                 out_spatial, name)


def global_avg_pool(x: og.TensorOp, spatial: AxesLike) -> og.TensorOp:
    """The mean over the ``spatial`` axes of ``x`` (they are removed)."""
    return og.mean(x, reduction_axes=as_axes(spatial))


# --- canonical layouts: the bridge from Axes ops to primitives ------------------------------

_UNIT_BATCH = "_conv_batch"


def _batch_axis(batch):
    if len(batch) == 1:
        return batch[0]
    if not len(batch):
        return Axis(1, _UNIT_BATCH)
    return FlattenedAxis(batch)


def canonical(t, batch, rest):
    """``t`` (axes ``batch`` + ``rest`` in any order) as a positional view
    ``(B, *rest)`` with the batch axes merged into ``B``."""
    t = _view(t, Axes(batch) + Axes(rest))
    if len(batch) == 1:
        return t
    return pr.Reshape(t, Axes((_batch_axis(batch),) + tuple(rest)))


def uncanonical(t, batch):
    """A primitive's ``(B, *rest)`` result with its batch axes unmerged."""
    if len(batch) == 1:
        return t
    return pr.Reshape(t, Axes(tuple(batch) + tuple(t.axes)[1:]))


class _Sides:
    """The canonical layouts of a convolution Axes op: image (B, C, *S), filter
    (K, C/groups, *R), result (B, K, *P), as in :class:`Conv`."""

    def __init__(self, op):
        c, s = op._image_side()
        k, p = op._result_side()
        self.batch = op.args[0].axes - Axes((op.channel,) + tuple(op.spatial))
        self.image = Axes((c,) + tuple(s))
        self.result = Axes((k,) + tuple(p))
        self.filter = op._filter_axes()
        self.params = dict(strides=op.strides, pads=op.pads, dilation=op.dilation,
                           groups=op.groups)
        B = _batch_axis(self.batch)
        self.image_c = Axes((B,) + tuple(self.image))
        self.result_c = Axes((B,) + tuple(self.result))

    def conv(self, x, w):  # -> result side
        y = Conv(canonical(x, self.batch, self.image), _view(w, self.filter),
                 axes=self.result_c, **self.params)
        return uncanonical(y, self.batch)

    def data(self, d, w):  # -> image side
        x = ConvGradData(canonical(d, self.batch, self.result), _view(w, self.filter),
                         axes=self.image_c, **self.params)
        return uncanonical(x, self.batch)

    def filter_grad(self, x, d):  # -> filter
        return ConvGradFilter(canonical(x, self.batch, self.image),
                              canonical(d, self.batch, self.result), axes=self.filter,
                              **self.params)


def _view(t, axes):
    """``t`` with its axes (the set ``axes``) in the order of ``axes``, as a view."""
    names = t.axes.names
    if names == axes.names:
        return t
    if len(names) != len(axes) or any(n not in names for n in axes.names):
        raise AxisMismatchError(f"convolution / pooling: {t.name} ({_fmt(t.axes)}) does not "
                                f"have the axes ({_fmt(axes)}){t._where()}")
    return pr.Dimshuffle(t, [names.index(n) for n in axes.names])


class _PoolSides:
    """The canonical layout (B, *S) / (B, *P) of a :class:`Pooling` op."""

    def __init__(self, op):
        x = op.args[0]
        self.op = op
        self.batch = x.axes - op.spatial
        self.spatial = Axes(x.axes.find(a.name) for a in op.spatial)
        B = _batch_axis(self.batch)
        self.image_c = Axes((B,) + tuple(self.spatial))
        self.result_c = Axes((B,) + tuple(op.out_spatial))
        self.params = dict(kernel=op.kernel, strides=op.strides, pads=op.pads,
                           dilation=op.dilation)

    def image(self, t):
        return canonical(t, self.batch, self.spatial)

    def result(self, t):
        return canonical(t, self.batch, self.op.out_spatial)

    def counted(self):
        """Whether windows are divided by their own number of input elements."""
        op = self.op
        return not op.count_include_pad and any(lo or hi for lo, hi in op.pads)

    def avg_filter(self, dtype):
        """The constant filter (1, 1, *kernel) of average pooling."""
        op = self.op
        scale = 1.0 if self.counted() else 1.0 / math.prod(op.kernel)
        axes = Axes([Axis(1, "_pool_k"), Axis(1, "_pool_c")]
                    + [Axis(k, f"_pool_r{i}") for i, k in enumerate(op.kernel)])
        return og.Constant(scale, axes=axes, dtype=dtype)

    def avg_scale(self, dtype):
        """``1 / count`` per window, (B, *P), or None with ``count_include_pad``."""
        op = self.op
        if not self.counted():
            return None
        if any(isinstance(n, Sym) for n in self.spatial.lengths):
            # over a symbolic length the counts are computed too: the windows' sums of
            # ones (the padding adds none)
            one = Axis(1, "_pool_n")
            image = Axes((one,) + tuple(self.spatial))
            counts = Conv(pr.Reshape(og.Constant(1.0, axes=image, dtype=dtype),
                                     self.unit_axes(image, "_pool_c")),
                          self.avg_filter(dtype),
                          axes=self.unit_axes(Axes((one,) + tuple(op.out_spatial)),
                                              "_pool_k"),
                          strides=op.strides, pads=op.pads, dilation=op.dilation, groups=1)
            c = og.Reciprocal(pr.Reshape(counts, op.out_spatial))
        else:
            counts = pool_counts(self.spatial.lengths, op.kernel, op.strides, op.pads)
            c = og.Constant(1.0 / counts, axes=op.out_spatial, dtype=dtype)
        return pr.Expand(c, self.result_c, (None,) + tuple(range(len(op.out_spatial))))

    def avg(self, x):  # -> (B, *P), the canonical average pooling of (B, *S)
        f = self.avg_filter(x.dtype)
        y = Conv(pr.Reshape(x, self.unit_axes(self.image_c, "_pool_c")), f,
                 axes=self.unit_axes(self.result_c, "_pool_k"),
                 strides=self.op.strides, pads=self.op.pads, dilation=self.op.dilation,
                 groups=1)
        y = pr.Reshape(y, self.result_c)
        scale = self.avg_scale(x.dtype)
        return y if scale is None else og.Multiply(y, scale)

    def avg_grad(self, d):  # -> (B, *S), its transpose
        scale = self.avg_scale(d.dtype)
        if scale is not None:
            d = og.Multiply(d, scale)
        f = self.avg_filter(d.dtype)
        x = ConvGradData(pr.Reshape(d, self.unit_axes(self.result_c, "_pool_k")), f,
                         axes=self.unit_axes(self.image_c, "_pool_c"), strides=self.op.strides,
                         pads=self.op.pads, dilation=self.op.dilation, groups=1)
        return pr.Reshape(x, self.image_c)

    @staticmethod
    def unit_axes(axes, name):
        return Axes((axes[0], Axis(1, name)) + tuple(axes)[1:])


# --- derivatives and reference values of the Axes ops ---------------------------------

def _rebuild(op, *args):
    return type(op)(*args, **op.attr_values())


@adjoint_rule(Convolution)
def _convolution(op, d):
    x, w = op.args
    sides = _Sides(op)
    if isinstance(op, ConvolutionTranspose):  # op = data(x, w)
        return sides.conv(d, w), sides.filter_grad(d, x)
    return sides.data(d, w), sides.filter_grad(x, d)

@forward_rule(Convolution)
def _convolution_fwd(op, ts):  # bilinear; the image's direction axes are batch axes
    w = op.args[1]
    return terms((ts[0], lambda t: _rebuild(op, t, w)),
                 (ts[1], lambda t: _filter_tangent(op, t)))

def _filter_tangent(op, t):
    x, w = op.args
    if t.axes.names == w.axes.names:
        return _rebuild(op, x, t)
    s = _Sides(op)  # directions: through the primitive on canonical views
    dirs = Axes(tuple(t.axes)[len(w.axes):])
    tc = _view(t, s.filter + dirs)
    if isinstance(op, ConvolutionTranspose):
        prim = ConvGradData(canonical(x, s.batch, s.result), _view(w, s.filter),
                            axes=s.image_c, **s.params)
    else:
        prim = Conv(canonical(x, s.batch, s.image), _view(w, s.filter),
                    axes=s.result_c, **s.params)
    return uncanonical(_conv_term(prim, 1, tc), s.batch)

@adjoint_rule(Pooling)
def _pooling(op, d):
    s = _PoolSides(op)
    x = op.args[0]
    if op.kind == "avg":
        return (uncanonical(s.avg_grad(s.result(d)), s.batch),)
    g = MaxPoolGrad(s.image(x), s.result(d), axes=s.image_c, **s.params)
    return (uncanonical(g, s.batch),)

@forward_rule(Pooling)
def _pooling_fwd(op, ts):
    if op.kind == "avg":  # linear; tangent direction axes are batch axes
        return _rebuild(op, ts[0])
    s = _PoolSides(op)
    t = ts[0]
    dirs = Axes(tuple(t.axes)[len(op.args[0].axes):])
    g = _pool_term(MaxPoolGather, s.image(op.args[0]),
                   canonical(t, s.batch, s.spatial + dirs), s.result_c, s.params)
    return uncanonical(g, s.batch)


@evaluator(Convolution)
def _convolution_value(op, x, w):
    s = _Sides(op)
    xa, wa = op.args
    transpose = isinstance(op, ConvolutionTranspose)
    arg_side, side = (s.result, s.image) if transpose else (s.image, s.result)
    xc = np.reshape(_to(x, xa.axes, s.batch + arg_side), (-1,) + arg_side.lengths)
    fn = reference_conv_grad_data if transpose else reference_conv
    y = fn(xc, _to(w, wa.axes, s.filter), side.lengths[1:], op.strides, op.pads,
           op.dilation, op.groups)
    y = y.reshape(s.batch.lengths + side.lengths)
    return _to(y, s.batch + side, op.axes).astype(op.dtype)

@evaluator(Pooling)
def _pooling_value(op, x):
    s = _PoolSides(op)
    xc = np.reshape(_to(x, op.args[0].axes, s.batch + s.spatial),
                    (-1,) + s.spatial.lengths)
    P = op.out_spatial.lengths
    if op.kind == "max":
        y = reference_max_pool(xc, op.kernel, P, op.strides, op.pads, op.dilation)
    else:
        ones = np.ones((1, 1) + tuple(op.kernel))
        y = reference_conv(xc[:, None], ones, P, op.strides, op.pads, op.dilation,
                           1)[:, 0]
        if op.count_include_pad:
            y = y / math.prod(op.kernel)
        else:
            y = y / pool_counts(s.spatial.lengths, op.kernel, op.strides, op.pads)
    y = y.reshape(s.batch.lengths + P)
    return _to(y, s.batch + op.out_spatial, op.axes).astype(op.dtype)




# --- lowering (used by geon.transformers.passes.lower) -----------------------------------------

def lower_convolution(op):  # conv(x, w) -> Conv(canonical x, canonical w), reordered
    s = _Sides(op)
    x, w = op.args
    y = s.data(x, w) if isinstance(op, ConvolutionTranspose) else s.conv(x, w)
    return _view(y, op.axes)


def lower_pooling(op):  # pool(x) -> MaxPool(canonical x) or Conv(canonical x, ones)
    s = _PoolSides(op)
    x = s.image(op.args[0])
    y = MaxPool(x, axes=s.result_c, **s.params) if op.kind == "max" else s.avg(x)
    return _view(uncanonical(y, s.batch), op.axes)

