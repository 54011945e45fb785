"""The convolution and pooling primitives of the base set (canonical layouts:
``(N, C, *spatial)`` images, ``(K, C/groups, *kernel)`` filters), with their
derivatives (each is the adjoint of another) and reference values.
:mod:`geon.op_graph.conv` re-exports them."""


import numpy as np

from geon.errors import AxisMismatchError
from geon.op_graph import primitives as pr
from geon.op_graph.axes import Axes, FlattenedAxis
from geon.op_graph.derivatives import terms
from geon.op_graph.symbols import Sym, SymbolicLengthError
from geon.op_graph.tables import adjoint_rule, evaluator, forward_rule
from geon.op_graph.core import ComputationOp, _fmt, primitive
from geon.op_graph.conv_math import (_check_windows, out_length, reference_conv,
                                     reference_conv_grad_data, reference_conv_grad_filter,
                                     reference_max_pool, reference_max_pool_gather,
                                     reference_max_pool_grad)


# --- semi-primitives ------------------------------------------------------------------------


class ConvPrim(ComputationOp):
    """Base of the three convolution primitives. ``axes`` is the result's (given, as the
    arithmetic cannot always recover a length); ``pads`` is ``((lo, hi), ...)``."""

    attrs = ("axes", "strides", "pads", "dilation", "groups")
    arity = 2

    def __init__(self, a, b, *, axes, strides, pads, dilation, groups, **kwargs):
        self.strides, self.dilation = tuple(strides), tuple(dilation)
        self.pads, self.groups = tuple(tuple(p) for p in pads), int(groups)
        super().__init__(a, b, axes=axes, **kwargs)
        self._check(*self._roles())

    def _roles(self):
        """``(image, filter, result)`` axes: (B, C, *S), (K, C/groups, *R), (B, K, *P)."""
        raise NotImplementedError

    def _check(self, x, w, y):
        n = len(self.strides)
        ok = (len(x) == len(y) == n + 2 and len(w) == n + 2 and len(self.pads) == n
              and len(self.dilation) == n and self.groups >= 1
              and x[0].length == y[0].length and w[0].length == y[1].length
              and w[1].length * self.groups == x[1].length
              and w[0].length % self.groups == 0)
        if not ok:
            raise AxisMismatchError(
                f"{type(self).__name__} {self.name}: needs image (B, C, *S), filter "
                f"(K, C/{self.groups}, *R) and result (B, K, *P) with {n} spatial "
                f"dimensions; got ({_fmt(x)}), ({_fmt(w)}), ({_fmt(y)}){self._where()}")
        _check_windows(self, x.lengths[2:], w.lengths[2:], self.strides, self.dilation,
                       self.pads, y.lengths[2:])


@primitive
class Conv(ConvPrim):
    """``Conv(x, w)``: x (B, C, *S) correlated with w (K, C/groups, *R): (B, K, *P)."""

    def _roles(self):
        return self.args[0].axes, self.args[1].axes, self.axes


@primitive
class ConvGradData(ConvPrim):
    """``ConvGradData(dy, w)``: the transpose of :class:`Conv` in its image, (B, C, *S)
    from dy (B, K, *P) and w (K, C/groups, *R) (a transposed convolution)."""

    def _roles(self):
        return self.axes, self.args[1].axes, self.args[0].axes


@primitive
class ConvGradFilter(ConvPrim):
    """``ConvGradFilter(x, dy)``: the transpose of :class:`Conv` in its filter,
    (K, C/groups, *R) from x (B, C, *S) and dy (B, K, *P)."""

    def _roles(self):
        return self.args[0].axes, self.axes, self.args[1].axes


class PoolPrim(ComputationOp):
    """Base of the max-pooling primitives over the trailing ``len(kernel)`` dimensions;
    leading dimensions are independent."""

    attrs = ("axes", "kernel", "strides", "pads", "dilation")

    def __init__(self, *args, axes, kernel, strides, pads, dilation, **kwargs):
        self.kernel, self.strides = tuple(kernel), tuple(strides)
        self.pads, self.dilation = tuple(tuple(p) for p in pads), tuple(dilation)
        super().__init__(*args, axes=axes, **kwargs)
        x = self.args[0].axes
        y = self._pooled()
        n = len(self.kernel)
        lead = len(x) - n
        same = self._same_as_x()
        if lead < 0 or len(y) != len(x) or x.lengths[:lead] != y.lengths[:lead] or \
                same.lengths != x.lengths or not (len(self.strides) == len(self.pads)
                                                  == len(self.dilation) == n):
            raise AxisMismatchError(f"{type(self).__name__} {self.name}: ({_fmt(x)}) "
                                    f"pooled over its last {n} dimensions cannot give "
                                    f"({_fmt(y)}){self._where()}")
        _check_windows(self, x.lengths[lead:], self.kernel, self.strides, self.dilation,
                       self.pads, y.lengths[lead:])
        _check_real_tap(self, x.lengths[lead:])

    def _pooled(self):
        """The axes of the pooled (window) side."""
        return self.axes

    def _same_as_x(self):
        """The axes that must have x's shape."""
        return self.args[-1].axes

    def _infer_dtype(self):
        return self.args[-1].dtype


def _check_real_tap(op, lengths):
    """Every window reads at least one input element (not only padding)."""
    for i, (L, k, s, d, (lo, hi)) in enumerate(zip(lengths, op.kernel, op.strides,
                                                   op.dilation, op.pads)):
        if isinstance(L, Sym):
            # undilated, a window is k adjacent taps starting at most k - 1 before the
            # input (and, by the count of windows, ending at most k - 1 after it): one
            # tap is inside whatever the length. Dilated taps can skip the input.
            if (lo <= k - 1 and hi <= k - 1) if d == 1 else lo == hi == 0:
                continue
            raise SymbolicLengthError(
                f"{type(op).__name__} {op.name}: padding ({lo}, {hi}) with kernel {k} "
                f"and dilation {d} over spatial dimension {i} of symbolic length {L!r}: "
                f"whether a window reads only padding depends on the length (symbolic "
                f"lengths take a padding below the kernel, undilated){op._where()}")
        n = out_length(L, k, s, d, lo, hi)
        taps = np.arange(n)[:, None] * s - lo + np.arange(k)[None, :] * d
        if not np.all(np.any((taps >= 0) & (taps < L), axis=1)):
            raise AxisMismatchError(f"{type(op).__name__} {op.name}: padding ({lo}, {hi}) "
                                    f"of spatial dimension {i} leaves a window with no "
                                    f"input element{op._where()}")


@primitive
class MaxPool(PoolPrim):
    """``MaxPool(x)``: the maximum of each window; x (..., *S) -> (..., *P)."""

    arity = 1


@primitive
class MaxPoolGrad(PoolPrim):
    """``MaxPoolGrad(x, dy)``: dy (..., *P) added at the position of the first maximum
    of x in each window; the result has x's shape."""

    def _pooled(self):
        return self.args[1].axes

    def _same_as_x(self):
        return self.axes


@primitive
class MaxPoolGather(PoolPrim):
    """``MaxPoolGather(x, v)``: v (x's shape) read at the position of the first
    maximum of x in each window: (..., *P)."""

    arity = 2


CONV_PRIMITIVES = frozenset({Conv, ConvGradData, ConvGradFilter, MaxPool, MaxPoolGrad,
                             MaxPoolGather})


# --- derivatives -------------------------------------------------------------------------------
# Tangents may carry trailing direction axes (be.jacobian pushes many directions at once).
# A primitive folds them into a dimension that its operand shares with its result and no
# group splits badly (the batch, or a channel: (G, n, D) flattened keeps groups whole),
# and unfolds them from the result.

#: (primitive, operand) -> (operand dimension, result dimension) that directions join.
_FOLD = {(Conv, 0): (0, 0), (Conv, 1): (0, 1), (ConvGradData, 0): (0, 0),
         (ConvGradData, 1): (1, 1), (ConvGradFilter, 0): (1, 1), (ConvGradFilter, 1): (1, 0)}


def _merged(axes, dim, dirs):
    return Axes(tuple(axes)[:dim] + (FlattenedAxis(Axes((axes[dim],) + tuple(dirs))),)
                + tuple(axes)[dim + 1:])


def _conv_term(op, i, t):
    """The tangent of the convolution primitive ``op`` for tangent ``t`` of operand ``i``
    (the other operand fixed), with ``t``'s direction axes trailing in the result."""
    arg = op.args[i]
    params = dict(strides=op.strides, pads=op.pads, dilation=op.dilation, groups=op.groups)
    dirs = Axes(tuple(t.axes)[len(arg.axes):])
    if not len(dirs):
        args = [t if j == i else a for j, a in enumerate(op.args)]
        return type(op)(*args, axes=op.axes, **params)
    a, o = _FOLD[type(op), i]
    n, k = len(arg.axes), len(dirs)
    moved = pr.Dimshuffle(t, list(range(a + 1)) + list(range(n, n + k))
                          + list(range(a + 1, n)))
    args = [pr.Reshape(moved, _merged(arg.axes, a, dirs)) if j == i else b
            for j, b in enumerate(op.args)]
    y = type(op)(*args, axes=_merged(op.axes, o, dirs), **params)
    m = len(op.axes)
    y = pr.Reshape(y, Axes(tuple(op.axes)[:o + 1] + tuple(dirs) + tuple(op.axes)[o + 1:]))
    return pr.Dimshuffle(y, list(range(o + 1)) + list(range(o + 1 + k, m + k))
                         + list(range(o + 1, o + 1 + k)))


def _pool_term(cls, x, t, axes, params):
    """``cls(x, t)`` (a max-pooling primitive linear in ``t``) for a tangent ``t`` with
    trailing direction axes: they become leading dimensions, x is broadcast over them."""
    dirs = Axes(tuple(t.axes)[len(x.axes):])
    if not len(dirs):
        return cls(x, t, axes=axes, **params)
    n, k = len(x.axes), len(dirs)
    t = pr.Dimshuffle(t, list(range(n, n + k)) + list(range(n)))
    xb = pr.Expand(x, dirs + x.axes, [None] * k + list(range(n)))
    y = cls(xb, t, axes=dirs + Axes(axes), **params)
    m = len(axes)
    return pr.Dimshuffle(y, list(range(k, k + m)) + list(range(k)))


def rebuild(op, *args):
    return type(op)(*args, **op.attr_values())

# Primitives: <Conv(x, w), d> = <x, ConvGradData(d, w)> = <w, ConvGradFilter(x, d)>.
def params(op):
    return dict(strides=op.strides, pads=op.pads, dilation=op.dilation, groups=op.groups)

@adjoint_rule(Conv)
def _conv(op, d):
    x, w = op.args
    return (ConvGradData(d, w, axes=x.axes, **params(op)),
            ConvGradFilter(x, d, axes=w.axes, **params(op)))

@adjoint_rule(ConvGradData)
def _conv_data(op, e):
    dy, w = op.args
    return (Conv(e, w, axes=dy.axes, **params(op)),
            ConvGradFilter(e, dy, axes=w.axes, **params(op)))

@adjoint_rule(ConvGradFilter)
def _conv_filter(op, f):
    x, dy = op.args
    return (ConvGradData(dy, f, axes=x.axes, **params(op)),
            Conv(x, f, axes=dy.axes, **params(op)))

@forward_rule(Conv, ConvGradData, ConvGradFilter)
def _conv_fwd(op, ts):  # bilinear: d f(a, b) = f(da, b) + f(a, db)
    return terms((ts[0], lambda t: _conv_term(op, 0, t)),
                 (ts[1], lambda t: _conv_term(op, 1, t)))

def pool_params(op):
    return dict(kernel=op.kernel, strides=op.strides, pads=op.pads, dilation=op.dilation)

@adjoint_rule(MaxPool)
def _maxpool(op, d):
    x = op.args[0]
    return (MaxPoolGrad(x, d, axes=x.axes, **pool_params(op)),)

@adjoint_rule(MaxPoolGrad)
def _maxpool_grad(op, e):  # piecewise constant in x, linear in dy
    x, dy = op.args
    return None, MaxPoolGather(x, e, axes=dy.axes, **pool_params(op))

@adjoint_rule(MaxPoolGather)
def _maxpool_gather(op, d):
    x, v = op.args
    return None, MaxPoolGrad(x, d, axes=v.axes, **pool_params(op))

@forward_rule(MaxPool)
def _maxpool_fwd(op, ts):
    return _pool_term(MaxPoolGather, op.args[0], ts[0], op.axes, pool_params(op))

@forward_rule(MaxPoolGrad, MaxPoolGather)
def _maxpool_linear_fwd(op, ts):
    if ts[1] is None:
        return None
    return _pool_term(type(op), op.args[0], ts[1], op.axes, pool_params(op))


@evaluator(Conv)
def _conv_value(op, x, w):
    return reference_conv(x, w, op.axes.lengths[2:], op.strides, op.pads, op.dilation,
                          op.groups).astype(op.dtype)

@evaluator(ConvGradData)
def _conv_data_value(op, dy, w):
    return reference_conv_grad_data(dy, w, op.axes.lengths[2:], op.strides, op.pads,
                                    op.dilation, op.groups).astype(op.dtype)

@evaluator(ConvGradFilter)
def _conv_filter_value(op, x, dy):
    return reference_conv_grad_filter(x, dy, op.axes.lengths[2:], op.strides, op.pads,
                                      op.dilation, op.groups).astype(op.dtype)

def pool_args(op):
    return dict(strides=op.strides, pads=op.pads, dilation=op.dilation)

@evaluator(MaxPool)
def _max_pool_value(op, x):
    n = len(op.kernel)
    return reference_max_pool(x, op.kernel, op.axes.lengths[-n:], **pool_args(op))

@evaluator(MaxPoolGrad)
def _max_pool_grad_value(op, x, dy):
    return reference_max_pool_grad(x, dy, op.kernel, **pool_args(op)).astype(op.dtype)

@evaluator(MaxPoolGather)
def _max_pool_gather_value(op, x, v):
    n = len(op.kernel)
    return reference_max_pool_gather(x, v, op.kernel, op.axes.lengths[-n:],
                                     **pool_args(op)).astype(op.dtype)
