"""Layer and batch normalization, as composites of existing ops.

Both are built from means, a subtraction, ``sqrt`` and a division, so their derivatives
(of any order) come from the rules of those ops; the variance is the mean of the squared
deviation from the mean (never ``E[x**2] - E[x]**2``, which cancels catastrophically).

Batch normalization in training mode also returns the assignments that update the
running statistics (``running = (1 - momentum) * running + momentum * batch``, the
unbiased batch variance for the running variance, as PyTorch does); request them in
the computation that trains.
"""

from typing import Any, Optional

from geon.errors import ArgumentError, AxisMismatchError
from geon.op_graph import nodes
from geon.op_graph import op_graph as og
from geon.op_graph.axes import AxesLike, as_axes


def _where():
    return f" (at {nodes.DebugInfo().file_info})"


def _normalize(x, mean, var, gamma, beta, eps):
    y = (x - mean) / og.sqrt(var + eps)
    if gamma is not None:
        y = y * gamma
    if beta is not None:
        y = y + beta
    return y


def _check_subset(what, axes, x):
    missing = as_axes(axes) - x.axes
    if len(missing):
        raise AxisMismatchError(f"{what}: axes ({og._fmt(missing)}) are not axes of "
                                f"{x.name} ({og._fmt(x.axes)}){_where()}")


def stored(t):
    """``t``'s stored value if it is a Variable or placeholder (so inference built after
    a training step's updates does not run them; see :func:`value_of`), else ``t``."""
    if isinstance(t, og.AssignableTensorOp) and not t.is_constant:
        return og.value_of(t)
    return t


def layer_norm(x: og.TensorOp, gamma: Optional[og.TensorOp] = None,
               beta: Optional[og.TensorOp] = None, axes: Optional[AxesLike] = None,
               eps: float = 1e-5) -> og.TensorOp:
    """``(x - mean) / sqrt(var + eps) * gamma + beta`` with the mean and (population)
    variance over ``axes`` (default: ``gamma``'s axes), for each index of the others.
    ``gamma`` and ``beta`` (optional) have axes among ``axes``."""
    if axes is None:
        if gamma is None:
            raise ArgumentError(f"layer_norm: give axes= (the normalized axes){_where()}")
        axes = gamma.axes
    axes = as_axes(axes)
    _check_subset("layer_norm", axes, x)
    for name, p in (("gamma", gamma), ("beta", beta)):
        if p is not None and len(p.axes - axes):
            raise AxisMismatchError(f"layer_norm: {name} axes ({og._fmt(p.axes)}) must be "
                                    f"among the normalized axes ({og._fmt(axes)}){_where()}")
    mean = og.mean(x, reduction_axes=axes)
    d = x - mean
    var = og.mean(d * d, reduction_axes=axes)
    return _normalize(x, mean, var, gamma, beta, eps)


def batch_norm(x: og.TensorOp, gamma: Optional[og.TensorOp],
               beta: Optional[og.TensorOp], running_mean: og.Variable,
               running_var: og.Variable, reduction_axes: Optional[AxesLike] = None,
               momentum: float = 0.1, eps: float = 1e-5, training: bool = True) -> Any:
    """Batch normalization: ``(y, updates)``.

    In training mode ``y`` normalizes ``x`` with the mean and population variance over
    ``reduction_axes`` (default: the axes of ``x`` that ``running_mean`` lacks), and
    ``updates`` are two :class:`SetItem` s moving ``running_mean`` and ``running_var``
    (Variables) towards the batch mean and the unbiased batch variance by ``momentum``.
    Otherwise ``y`` uses the stored running statistics (without running updates built
    before it) and ``updates`` is empty. ``gamma`` and
    ``beta`` may be ``None``.
    """
    if reduction_axes is None:
        reduction_axes = x.axes - running_mean.axes
    reduction_axes = as_axes(reduction_axes)
    _check_subset("batch_norm", reduction_axes, x)
    if not training:
        return _normalize(x, stored(running_mean), stored(running_var), gamma, beta,
                          eps), []
    mean = og.mean(x, reduction_axes=reduction_axes)
    d = x - mean
    var = og.mean(d * d, reduction_axes=reduction_axes)
    y = _normalize(x, mean, var, gamma, beta, eps)
    n = reduction_axes.size
    if n < 2:
        raise ArgumentError(f"batch_norm: training needs more than one value per channel "
                            f"(reduction axes {og._fmt(reduction_axes)}){_where()}")
    # Built after y, so y reads the statistics from before the update.
    updates = [og.SetItem(running_mean, running_mean * (1.0 - momentum) + mean * momentum),
               og.SetItem(running_var,
                          running_var * (1.0 - momentum) + var * (momentum * n / (n - 1)))]
    return y, updates
