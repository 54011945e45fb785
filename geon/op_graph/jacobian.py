"""Jacobians as ops: ``jacobian(y, x)`` has y's axes followed by x's axes.

Both modes push many directions at once through the forward rules of
:mod:`geon.op_graph.forward`: the seed is an identity tensor whose extra *direction
axes* index the directions, so every element of the Jacobian comes out of one pass
over the graph instead of one pass per element.

- forward mode seeds ``x`` with the identity over (x's axes, directions) and reads the
  tangent of ``y``: one direction per element of ``x``;
- reverse mode builds the vector-Jacobian product ``g(u) = deriv(y, x, error=u)`` once,
  which is linear in ``u``, and pushes the identity over (y's axes, directions) through
  it from ``u``: one direction per element of ``y``. This gives ``J^T``, which is then
  reordered.
"""

from typing import Optional, Sequence, Union, overload

import numpy as np

from geon.errors import ArgumentError
from geon.op_graph.core import Constant, TensorOp, as_op, snap
from geon.op_graph.core_ops import AxesWithOrder, CastAxes
from geon.op_graph.autodiff import deriv
from geon.op_graph.axes import Axes, Axis
from geon.op_graph.forward import LinearizationPoint, _float_dtype, propagate


def jacobian_axes(y: TensorOp, x: TensorOp) -> Axes:
    """The axes given to x's side of ``jacobian(y, x)``.

    Naming rule: an axis of ``x`` whose name is not among ``y``'s axes keeps its name;
    one whose name ``y`` also has gets a prime appended (``C`` becomes ``C'``), and
    another one while the name is still taken by ``y`` or by another axis of the
    result (``C''``). Lengths and batch / recurrent flags are kept.
    """
    y, x = as_op(y), as_op(x)
    taken = set(y.axes.names) | set(x.axes.names)
    out = []
    for a in x.axes:
        if a.name in y.axes:
            name = a.name + "'"
            while name in taken:
                name += "'"
            taken.add(name)
            a = a.named(name)
        out.append(a)
    return Axes(out)


def _identity(axes, directions, dtype):
    n = axes.size if len(axes) else 1
    eye = np.eye(n, dtype=dtype).reshape(axes.shape + directions.shape)
    return Constant(eye, axes=axes + directions, dtype=dtype)


def _fresh(axes):
    """Directions: one fresh axis per axis of ``axes``, same lengths, unused names."""
    return Axes(Axis(a.length) for a in axes)


def choose_mode(y, x):
    """``"forward"`` if x has at most as many elements as y, else ``"reverse"``."""
    nx = x.axes.size if len(x.axes) else 1
    ny = y.axes.size if len(y.axes) else 1
    return "forward" if nx <= ny else "reverse"


@overload
def jacobian(y: TensorOp, x: TensorOp, mode: Optional[str] = None) -> TensorOp: ...
@overload
def jacobian(y: TensorOp, x: Sequence[TensorOp],
             mode: Optional[str] = None) -> list[TensorOp]: ...


def jacobian(y: TensorOp, x: Union[TensorOp, Sequence[TensorOp]],
             mode: Optional[str] = None) -> Union[TensorOp, list[TensorOp]]:
    """The Jacobian ``d y / d x`` as an op with y's axes followed by x's axes.

    Entry ``[i, j]`` (``i`` indexing y's axes, ``j`` x's) is ``d y[i] / d x[j]``. The
    x side is named by :func:`jacobian_axes`: an axis of x whose name y also has gets
    a prime (``C'``, then ``C''`` while taken).

    Mode: by default forward mode when ``x`` has at most as many elements as ``y``
    (one direction per element of ``x``), otherwise reverse mode (one direction per
    element of ``y``); both push all directions through the graph at once as extra
    axes. ``mode="forward"`` or ``"reverse"`` forces one. Every op in ``y``'s graph
    needs a forward rule (reverse mode also needs reverse rules). ``x`` may be a list:
    the result is then a list of Jacobians.
    """
    if isinstance(x, (list, tuple)):
        return [jacobian(y, xi, mode) for xi in x]
    y, x = snap(as_op(y)), snap(as_op(x))
    if mode is None:
        mode = choose_mode(y, x)
    if mode not in ("forward", "reverse"):
        raise ArgumentError(f"jacobian: mode must be 'forward' or 'reverse', not {mode!r}")
    dtype = _float_dtype(y)
    x_side = jacobian_axes(y, x)
    out_axes = y.axes + x_side
    if mode == "forward":
        dirs = _fresh(x.axes)
        found = propagate([y], {x: _identity(x.axes, dirs, dtype)}, dirs).get(y)
        if found is None:
            return Constant(0.0, axes=out_axes, dtype=dtype)
        return CastAxes(found, out_axes)          # (y, dirs) -> (y, x')
    u = LinearizationPoint(0.0, axes=y.axes, dtype=dtype)
    g = snap(deriv(y, x, error=u))                   # J^T u, axes of x
    dirs = _fresh(y.axes)
    found = propagate([g], {u: _identity(y.axes, dirs, dtype)}, dirs).get(g)
    if found is None:
        return Constant(0.0, axes=out_axes, dtype=dtype)
    jt = AxesWithOrder(found, dirs + x.axes)    # (x, dirs) -> (dirs, x)
    return CastAxes(jt, out_axes)               # (dirs, x) -> (y, x')
