"""Optimizers built as graph updates.

``opt.updates(loss, variables)`` returns the ``SetItem`` ops of one step: computed
in the graph (no per-step Python over parameters), requested among a computation's
results. Every piece of optimizer state (the step counter, momenta, averages) is a
persistent Variable named ``<optimizer name>/...``, so ``save``/``restore`` resume
training exactly.

Common options: ``learning_rate`` (a number or a schedule, see :class:`Schedule`),
``weight_decay`` (L2: ``weight_decay * w`` added to the gradient; :class:`AdamW`
decouples it), ``clip_norm`` (gradients scaled by ``min(1, clip_norm / (norm + 1e-6))``
where ``norm`` is their global L2 norm, as PyTorch's ``clip_grad_norm_``).

The step counter ``opt.step`` (float64, 0 before the first update) counts updates; a
step's rules see ``t = step + 1``.
"""

from typing import Any, Callable, Iterable, Optional, Sequence, Union

import numpy as np

import geon as be
from geon.errors import ArgumentError
from geon.frontends.neon._api import Configurable
from geon.op_graph import op_graph as og

#: A learning rate: a number, or ``lr(t)`` giving the rate op of update ``t`` (a
#: :class:`Schedule`).
LearningRate = Union[float, Callable[[og.TensorOp], og.TensorOp]]


class Schedule(Configurable):
    """A learning-rate schedule: ``schedule(t)`` gives the rate op of step ``t`` (an
    op, ``t = 1`` for the first update)."""

    def __call__(self, t: og.TensorOp) -> og.TensorOp:
        raise NotImplementedError


class ExponentialDecay(Schedule):
    """``lr * rate ** ((t - 1) / decay_steps)``."""

    def __init__(self, lr: float, rate: float, decay_steps: float) -> None:
        self.lr, self.rate, self.decay_steps = lr, rate, decay_steps

    def __call__(self, t: og.TensorOp) -> og.TensorOp:
        lr: og.TensorOp = self.lr * be.power(self.rate, (t - 1) / self.decay_steps)
        return lr


class PiecewiseConstant(Schedule):
    """``values[i]`` for updates ``t`` with ``boundaries[i-1] < t <= boundaries[i]``:
    ``PiecewiseConstant([100, 200], [0.1, 0.01, 0.001])`` uses 0.1 for the first 100
    updates, 0.01 for the next 100, then 0.001."""

    def __init__(self, boundaries: Sequence[float], values: Sequence[float]) -> None:
        if len(values) != len(boundaries) + 1:
            raise ArgumentError(f"PiecewiseConstant: {len(boundaries)} boundaries need "
                                f"{len(boundaries) + 1} values, not {len(values)}")
        self.boundaries, self.values = list(boundaries), list(values)

    def __call__(self, t: og.TensorOp) -> og.TensorOp:
        lr: og.TensorOp = t * 0 + self.values[0]   # in t's dtype (float64), not float32
        for bound, prev, value in zip(self.boundaries, self.values, self.values[1:]):
            lr = lr + (t > bound) * (value - prev)
        return lr


class Optimizer(Configurable):
    """Base class: subclasses implement ``direction(w, g, lr, t)`` returning the new
    value of ``w`` (an op) and the state updates (a list of SetItems)."""

    def __init__(self, learning_rate: LearningRate = 0.01, weight_decay: float = 0.0,
                 clip_norm: Optional[float] = None, name: str = "optimizer") -> None:
        self.learning_rate = learning_rate
        self.weight_decay = weight_decay
        self.clip_norm = clip_norm
        self.name = name
        self.step = be.Variable((), initial_value=0, dtype=np.float64, trainable=False,
                                name=f"{name}/step")
        self.state: dict[tuple[og.Variable, str], list[og.Variable]] = {}

    @property
    def variables(self) -> list[og.Variable]:
        """The optimizer's state Variables (the step counter first)."""
        return [self.step] + [v for vs in self.state.values() for v in vs]

    def slot(self, w: og.Variable, what: str) -> og.Variable:
        """The state Variable ``<name>/<w's name>/<what>`` (zeros like ``w``)."""
        key = (w, what)
        if key not in self.state:
            self.state[key] = [be.Variable(w.axes, initial_value=0, dtype=w.dtype,
                                           trainable=False, name=f"{self.name}/{w.name}/{what}")]
        return self.state[key][0]

    def updates(self, loss: og.TensorOp, variables: Optional[Iterable[og.Variable]] = None,
                average: Optional[Callable[[list[og.TensorOp]], Iterable[og.TensorOp]]] = None
                ) -> list[og.Op]:
        """The SetItem ops of one step minimizing the scalar ``loss`` over
        ``variables`` (default: the trainable variables ``loss`` depends on).

        ``average``, for data-parallel training, maps the list of gradients to the
        list of the same gradients averaged over the ranks (as
        ``geon.distributed.average_gradients`` does); it is applied before
        clipping, weight decay and the rule, so every rank makes the same update."""
        if variables is None:
            variables = loss.variables()
        variables = list(variables)
        if not variables:
            raise ArgumentError(f"{type(self).__name__}: loss {loss.name} depends on no "
                                f"trainable variables")
        grads = [be.deriv(loss, w) for w in variables]
        if average is not None:
            grads = list(average(grads))
        if self.clip_norm is not None:
            norm = be.sqrt(sum(be.sum(be.square(g), out_axes=()) for g in grads))
            scale = be.minimum(1.0, self.clip_norm / (norm + 1e-6))
            grads = [g * scale for g in grads]
        t = be.value_of(self.step) + 1
        lr = self.learning_rate(t) if callable(self.learning_rate) else self.learning_rate
        ops: list[og.Op] = []
        for w, g in zip(variables, grads):
            wv = be.value_of(w)
            if self.weight_decay:
                g = g + self.weight_decay * wv
            new, state_ops = self.rule(w, wv, g, lr, t)
            ops.extend(state_ops)
            ops.append(be.SetItem(w, new))
        ops.append(be.SetItem(self.step, t))
        return ops

    def rule(self, w: og.Variable, wv: og.TensorOp, g: og.TensorOp, lr: Union[og.TensorOp, float],
             t: og.TensorOp) -> tuple[og.TensorOp, list[og.Op]]:
        raise NotImplementedError


class SGD(Optimizer):
    """Stochastic gradient descent, with momentum and Nesterov momentum as in PyTorch:
    ``v = momentum * v + g``; ``w -= lr * (g + momentum * v if nesterov else v)``."""

    def __init__(self, learning_rate: LearningRate = 0.01, momentum: float = 0.0,
                 nesterov: bool = False, **kw: Any) -> None:
        super().__init__(learning_rate, name=kw.pop("name", "sgd"), **kw)
        if nesterov and not momentum:
            raise ArgumentError("SGD: nesterov=True needs a momentum > 0")
        self.momentum, self.nesterov = momentum, nesterov

    def rule(self, w: og.Variable, wv: og.TensorOp, g: og.TensorOp, lr: Union[og.TensorOp, float],
             t: og.TensorOp) -> tuple[og.TensorOp, list[og.Op]]:
        if not self.momentum:
            return wv - lr * g, []
        v = self.slot(w, "velocity")
        v_new = self.momentum * be.value_of(v) + g
        d = g + self.momentum * v_new if self.nesterov else v_new
        return wv - lr * d, [be.SetItem(v, v_new)]


class RMSProp(Optimizer):
    """RMSProp (Tieleman & Hinton, 2012) as in PyTorch:
    ``s = decay * s + (1 - decay) g^2``; ``w -= lr * g / (sqrt(s) + eps)``."""

    def __init__(self, learning_rate: LearningRate = 0.001, decay: float = 0.99,
                 eps: float = 1e-8, **kw: Any) -> None:
        super().__init__(learning_rate, name=kw.pop("name", "rmsprop"), **kw)
        self.decay, self.eps = decay, eps

    def rule(self, w: og.Variable, wv: og.TensorOp, g: og.TensorOp, lr: Union[og.TensorOp, float],
             t: og.TensorOp) -> tuple[og.TensorOp, list[og.Op]]:
        s = self.slot(w, "sq_avg")
        s_new = self.decay * be.value_of(s) + (1 - self.decay) * be.square(g)
        return wv - lr * g / (be.sqrt(s_new) + self.eps), [be.SetItem(s, s_new)]


class Adam(Optimizer):
    """Adam (Kingma & Ba, 2015): ``m = b1 m + (1 - b1) g``, ``v = b2 v + (1 - b2) g^2``,
    ``w -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)``."""

    decoupled = False

    def __init__(self, learning_rate: LearningRate = 0.001, beta1: float = 0.9,
                 beta2: float = 0.999, eps: float = 1e-8, **kw: Any) -> None:
        super().__init__(learning_rate, name=kw.pop("name", type(self).__name__.lower()),
                         **kw)
        self.beta1, self.beta2, self.eps = beta1, beta2, eps

    def rule(self, w: og.Variable, wv: og.TensorOp, g: og.TensorOp, lr: Union[og.TensorOp, float],
             t: og.TensorOp) -> tuple[og.TensorOp, list[og.Op]]:
        m, v = self.slot(w, "m"), self.slot(w, "v")
        m_new = self.beta1 * be.value_of(m) + (1 - self.beta1) * g
        v_new = self.beta2 * be.value_of(v) + (1 - self.beta2) * be.square(g)
        m_hat = m_new / (1 - be.power(self.beta1, t))
        v_hat = v_new / (1 - be.power(self.beta2, t))
        return wv - lr * m_hat / (be.sqrt(v_hat) + self.eps), \
            [be.SetItem(m, m_new), be.SetItem(v, v_new)]


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter, 2019), as PyTorch's
    ``AdamW``: ``w *= 1 - lr * weight_decay`` before the Adam step (default
    ``weight_decay=0.01``)."""

    def __init__(self, learning_rate: LearningRate = 0.001, weight_decay: float = 0.01,
                 **kw: Any) -> None:
        self.decay_w = weight_decay
        super().__init__(learning_rate, **kw)

    def rule(self, w: og.Variable, wv: og.TensorOp, g: og.TensorOp, lr: Union[og.TensorOp, float],
             t: og.TensorOp) -> tuple[og.TensorOp, list[og.Op]]:
        return super().rule(w, wv * (1 - lr * self.decay_w), g, lr, t)
