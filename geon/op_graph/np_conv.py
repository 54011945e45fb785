"""Convolution and pooling in the NumPy family (``be.np.conv`` ...), PyTorch's layouts.

Images are ````(N, C, *spatial)```` (``(C, *spatial)`` positionally for a Simple-Axes
image, whose samples are named axes); filters ``(K, C / groups, *kernel)`` for ``conv`` and
``(C, K / groups, *kernel)`` for ``conv_transpose``. Each function renames the
positional dimensions to fresh axes, builds the Axes op of :mod:`geon.op_graph.conv`,
and names the result's dimensions positionally again, so derivatives, lowering and
code generation are the Axes ops'. Named (sample, recurrent) axes of a Simple-Axes
image are carried along as batch axes.
"""

from typing import Any, Sequence, Union

import numpy as np

from geon.op_graph import conv as cv
from geon.op_graph.conv import user_error
from geon.op_graph import op_graph as og
from geon.op_graph.axes import Axes
from geon.op_graph.symbols import Sym
from geon.op_graph.coercion import (AXES, canonical_axes, family, family_error,
                                    positional_shape, split_axes, temp_axis)


def _tensor(x, what):
    if not isinstance(x, og.Op):
        arr = np.asarray(x)
        return og.Constant(arr, axes=canonical_axes(arr.shape), dtype=arr.dtype)
    if family(x) == AXES:
        raise family_error(what, [x], "a NumPy-family function needs a positional tensor")
    return x


def _lead(x):
    """The number of leading positional (batch) dimensions before (C, *spatial): 1 for
    a NumPy-family image ``(N, C, *spatial)``, 0 for a Simple-Axes one (named samples)."""
    return 0 if split_axes(x)[0] else 1


def _renamed(x, n_spatial, what):
    """``(x with fresh positional axes, named axes, [channel, *spatial])``; every other
    axis is a batch axis of the convolution."""
    special, pos = split_axes(x)
    lead = _lead(x)
    if len(pos) != n_spatial + 1 + lead:
        raise user_error(f"{what}: {x.name} has shape {tuple(a.length for a in pos)};"
                         f" expected {'(N, C)' if lead else '(C,)'} and {n_spatial} "
                         f"spatial dimension(s)")
    if [a.name for a in x.axes] != [a.name for a in special + pos]:
        x = og.AxesWithOrder(x, Axes(special + pos))
    fresh = [temp_axis(a.length) for a in pos]
    return og.CastAxes(x, Axes(special + fresh)), special, fresh[lead:]


def _filter(w, n_spatial, what):
    special, pos = split_axes(w)
    if special or len(pos) != n_spatial + 2:
        raise user_error(f"{what}: the filter {w.name} has shape "
                         f"{tuple(a.length for a in w.axes)}; expected "
                         f"{n_spatial + 2} positional dimensions")
    fresh = [temp_axis(a.length) for a in pos]
    return og.CastAxes(w, Axes(fresh)), fresh


def _positional(y, special):
    """``y`` (named axes first, then fresh positional ones) named positionally again."""
    pos = [a for a in y.axes if a not in special]
    return og.CastAxes(y, Axes(list(special) + list(canonical_axes(
        tuple(a.length for a in pos)))))


def _spatial_count(x, w, what):
    n = len(split_axes(w)[1]) - 2
    if n < 1:
        raise user_error(f"{what}: the filter {w.name} needs at least 3 dimensions")
    return n


def conv(x: og.TensorOp, w: og.TensorOp, stride: Union[int, Sequence[int]] = 1,
         padding: Any = 0, dilation: Union[int, Sequence[int]] = 1,
         groups: int = 1) -> og.TensorOp:
    """PyTorch's ``conv{1,2,3}d`` (a correlation): ``x`` ``(N, C, *spatial)``, ``w``
    ``(K, C / groups, *kernel)`` -> ``(N, K, *out)``. ``padding``: an int, one per axis, one
    ``(lo, hi)`` pair per axis, ``"same"`` or ``"valid"``."""
    x, w = _tensor(x, "conv"), _tensor(w, "conv")
    n = _spatial_count(x, w, "conv")
    xr, special, (c, *spatial) = _renamed(x, n, "conv")
    wr, (k, cg, *kernel) = _filter(w, n, "conv")
    if cg.length * groups != c.length or k.length % groups:
        raise user_error(
            f"conv: input {x.name} {positional_shape(x)} has {c.length} channels; filter "
            f"{w.name} {positional_shape(w)} with groups={groups} expects "
            f"{cg.length * groups} (and a number of filters divisible by {groups})")
    strides = cv._ints(stride, n, "conv: stride", 1)
    dil = cv._ints(dilation, n, "conv: dilation", 1)
    pads = cv.normalize_padding(padding, [a.length for a in spatial],
                                [a.length for a in kernel], strides, dil, "conv: padding")
    outs = [temp_axis(cv.out_length(s.length, r.length, st, d, lo, hi))
            for s, r, st, d, (lo, hi) in zip(spatial, kernel, strides, dil, pads)]
    if any(not isinstance(a.length, Sym) and a.length < 1 for a in outs):
        raise user_error(f"conv: input {positional_shape(x)} is smaller than the "
                         f"dilated kernel {positional_shape(w)[2:]}")
    y = cv.Convolution(xr, wr, channel=c, spatial=spatial, filter_channel=cg, kernel=kernel,
                       out_channel=k, out_spatial=outs, strides=strides, pads=pads,
                       dilation=dil, groups=groups)
    return _positional(y, special)


def conv_transpose(x: og.TensorOp, w: og.TensorOp,
                   stride: Union[int, Sequence[int]] = 1, padding: Any = 0,
                   output_padding: Union[int, Sequence[int]] = 0,
                   dilation: Union[int, Sequence[int]] = 1,
                   groups: int = 1) -> og.TensorOp:
    """PyTorch's ``conv_transpose{1,2,3}d``: ``x`` ``(N, C, *spatial)``, ``w``
    ``(C, K / groups, *kernel)`` -> ``(N, K, *out)`` with ``out = (L - 1) * stride - 2 * padding
    + dilation * (k - 1) + output_padding + 1`` (``padding`` may also be per side)."""
    x, w = _tensor(x, "conv_transpose"), _tensor(w, "conv_transpose")
    n = _spatial_count(x, w, "conv_transpose")
    xr, special, (c, *spatial) = _renamed(x, n, "conv_transpose")
    wr, (wc, kg, *kernel) = _filter(w, n, "conv_transpose")
    if wc.length != c.length:
        raise user_error(f"conv_transpose: input {x.name} {positional_shape(x)} has "
                         f"{c.length} channels; filter {w.name} {positional_shape(w)} "
                         f"expects {wc.length}")
    if c.length % groups:
        raise user_error(f"conv_transpose: groups={groups} does not divide the "
                         f"{c.length} channels of {x.name}")
    wr = og.CastAxes(wr, Axes([c, kg] + kernel))  # the filter's channel is x's
    strides = cv._ints(stride, n, "conv_transpose: stride", 1)
    dil = cv._ints(dilation, n, "conv_transpose: dilation", 1)
    opad = cv._ints(output_padding, n, "conv_transpose: output_padding", 0)
    if any(o >= s for o, s in zip(opad, strides)):
        raise user_error(f"conv_transpose: output_padding {opad} must be smaller than the "
                         f"stride {strides}", ValueError)
    pads = cv.normalize_padding(padding, [0] * n, [a.length for a in kernel], strides, dil,
                                "conv_transpose: padding")
    outs = [temp_axis((s.length - 1) * st - lo - hi + d * (r.length - 1) + o + 1)
            for s, r, st, d, (lo, hi), o in zip(spatial, kernel, strides, dil, pads, opad)]
    if any(not isinstance(a.length, Sym) and a.length < 1 for a in outs):
        raise user_error(f"conv_transpose: the padding {pads} leaves no output")
    k = temp_axis(kg.length * groups)
    y = cv.ConvolutionTranspose(xr, wr, channel=c, spatial=spatial, filter_channel=kg,
                                kernel=kernel, out_channel=k, out_spatial=outs,
                                strides=strides, pads=pads, dilation=dil, groups=groups)
    return _positional(y, special)


def _pool(kind, x, kernel, stride, padding, dilation, count_include_pad):
    what = f"{kind}_pool"
    x = _tensor(x, what)
    pos = split_axes(x)[1]
    n = len(kernel) if isinstance(kernel, (tuple, list)) else len(pos) - 1 - _lead(x)
    if n < 1 or len(pos) < n + 1:
        raise user_error(f"{what}: {x.name} {positional_shape(x)} has no spatial "
                         f"dimensions for kernel {kernel!r}")
    ks = cv._ints(kernel, n, f"{what}: kernel", 1)
    strides = ks if stride is None else cv._ints(stride, n, f"{what}: stride", 1)
    dil = cv._ints(dilation, n, f"{what}: dilation", 1)
    special, pos = split_axes(x)
    if [a.name for a in x.axes] != [a.name for a in special + pos]:
        x = og.AxesWithOrder(x, Axes(special + pos))
    fresh = [temp_axis(a.length) for a in pos]
    xr = og.CastAxes(x, Axes(special + fresh))
    spatial = fresh[len(fresh) - n:]
    pads = cv.normalize_padding(padding, [a.length for a in spatial], ks, strides, dil,
                                f"{what}: padding")
    outs = [cv.out_length(s.length, k, st, d, lo, hi)
            for s, k, st, d, (lo, hi) in zip(spatial, ks, strides, dil, pads)]
    outs = [temp_axis(n if isinstance(n, Sym) else max(n, 0)) for n in outs]
    y = cv.Pooling(xr, kind=kind, spatial=spatial, out_spatial=outs, kernel=ks,
                   strides=strides, pads=pads, dilation=dil,
                   count_include_pad=count_include_pad)
    return _positional(y, special)


def max_pool(x: og.TensorOp, kernel: Union[int, Sequence[int]],
             stride: Union[int, Sequence[int], None] = None, padding: Any = 0,
             dilation: Union[int, Sequence[int]] = 1) -> og.TensorOp:
    """PyTorch's ``max_pool{1,2,3}d`` over the trailing spatial dimensions of ``x``
    ``(N, C, *spatial)``: ``kernel`` an int (every dimension after the first two) or one
    per spatial dimension; ``stride`` defaults to the kernel; padding with -inf.
    Derivatives go to the first maximum of each window."""
    return _pool("max", x, kernel, stride, padding, dilation, True)


def avg_pool(x: og.TensorOp, kernel: Union[int, Sequence[int]],
             stride: Union[int, Sequence[int], None] = None, padding: Any = 0,
             count_include_pad: bool = True) -> og.TensorOp:
    """PyTorch's ``avg_pool{1,2,3}d`` (see :func:`max_pool`); with zero padding,
    ``count_include_pad`` divides by the kernel size, otherwise by the number of input
    elements in each window."""
    return _pool("avg", x, kernel, stride, padding, 1, count_include_pad)
