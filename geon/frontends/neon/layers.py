"""Layers over named axes.

A layer is called on an op and returns an op: ``h = Affine(64, name="hidden")(x)``.
Its Variables are created at the first call (their axes follow from the input's) and
reused by every later call, so one layer serves a training graph and an inference graph
with different batch axes. Variables are named hierarchically, ``<layer>/<name>``
(``hidden/W``, ``hidden/b``; a :class:`Sequential` named ``net`` makes them
``net/hidden/W``), and listed by ``layer.variables``.

Layers read their Variables through :func:`geon.value_of`, so computations built from
the same layers at different times (a training step, a prediction) never wait for each
other's assignments; derivatives flow through the reads as through the Variables.

The axes: the *batch* axes (``Axis(..., batch=True)``) and the *recurrent* axis
(``recurrent=True``, the time axis T) pass through a layer; the other axes of the input
(the *sample* axes, the features) are what a layer's weights act on.
"""

import contextvars
import itertools
import zlib
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence, Union

import numpy as np

import geon as be
from geon.errors import ArgumentError, AxisMismatchError
from geon.frontends.neon._api import Configurable, describe, is_int, public_name
from geon.frontends.neon.initializers import Constant, Gaussian, GlorotUniform, KaimingNormal
from geon.op_graph import op_graph as og
from geon.op_graph.axes import Axes, Axis
from geon.op_graph.nodes import user_location
from geon.op_graph.control import remat_segment
from geon.op_graph.random import step_counter

#: An activation: a function of an op, or the name of a geon function (``"relu"``).
ActivationLike = Union[str, Callable[[og.TensorOp], og.TensorOp], None]
#: An initializer: ``init(shape, dtype, name) -> array`` (see ``initializers``).
Init = Callable[[tuple[int, ...], np.dtype, str], Any]
#: An output axis, or its length.
AxisOrLength = Union[Axis, int]

_counters: dict[str, Iterator[int]] = {}

#: While :func:`trace_calls` records: the list of ``(layer, output op, container)``
#: of the layer calls made, each appended when the call returns (``container``: the
#: call made other layer calls).
_trace: contextvars.ContextVar[Optional[list[list[Any]]]] = \
    contextvars.ContextVar("geon_neon_trace", default=None)


def _auto_name(kind: str) -> str:
    n = _counters.setdefault(kind, itertools.count())
    i = next(n)
    return kind if i == 0 else f"{kind}_{i}"


def _activation(fn: ActivationLike) -> Optional[Callable[[og.TensorOp], og.TensorOp]]:
    if fn is None or callable(fn):
        return fn
    try:
        f: Callable[[og.TensorOp], og.TensorOp] = getattr(be, fn)
        return f
    except AttributeError:
        raise ArgumentError(f"unknown activation {fn!r}: give a callable or the name of a "
                            f"geon function such as 'relu' or 'tanh' (at {user_location()})"
                            ) from None


def _required(fn: ActivationLike, what: str) -> Callable[[og.TensorOp], og.TensorOp]:
    f = _activation(fn)
    if f is None:
        raise ArgumentError(f"{what}: the activation is None; give a callable or the name "
                            f"of a geon function such as 'relu' or 'tanh' (at "
                            f"{user_location()})")
    return f


def _features(x: og.TensorOp, what: str) -> Axes:
    feats = x.axes.sample_axes()
    if not len(feats):
        raise AxisMismatchError(f"{what}: input {x.name} ({x.axes!r}) has no feature axes "
                                f"(all are batch or recurrent) (at {user_location()})")
    return feats


class Layer(Configurable):
    """Base class of layers: a name, Variables made once, and ``__call__``.

    Subclasses implement ``forward(x, training)``; they create Variables with
    :meth:`variable`, which returns the existing one on later calls. A layer's
    ``repr`` shows the arguments it was made with and its current name.
    """

    def __init__(self, name: Optional[str] = None, dtype: og.DTypeLike = np.float32) -> None:
        self.name = name or _auto_name(type(self).__name__.lower())
        self.dtype = np.dtype(dtype)
        self._vars: dict[str, og.Variable] = {}
        self._updates: list[og.Op] = []

    def __call__(self, x: og.TensorOp, training: bool = False) -> og.TensorOp:
        """The layer's output op for the input op ``x``; ``training`` selects the
        training behaviour of layers that have one (BatchNorm, Dropout)."""
        if not isinstance(x, og.TensorOp):
            hint = (" (to run a model on arrays, use nn.Model(...).predict)"
                    if isinstance(x, (np.ndarray, list, tuple, np.generic, float, int))
                    else "")
            raise ArgumentError(f"{public_name(type(self))} {self.name}: called on "
                                f"{describe(x)}; a layer is called on an op, such as "
                                f"be.placeholder(axes){hint} (at {user_location()})")
        trace = _trace.get()
        if trace is None:
            return self.forward(x, training)
        start = len(trace)
        out = self.forward(x, training)
        trace.append([self, out, len(trace) > start])
        return out

    def forward(self, x: og.TensorOp, training: bool) -> og.TensorOp:
        raise NotImplementedError

    def variable(self, short: str, axes: Iterable[Axis], init: Init,
                 trainable: bool = True) -> og.TensorOp:
        """The Variable ``<self.name>/<short>`` (created on first use), read through
        :func:`geon.value_of`."""
        v = self._vars.get(short)
        if v is None:
            name = f"{self.name}/{short}"
            axes = be.Axes(*axes)
            v = be.Variable(axes, dtype=self.dtype, trainable=trainable, name=name,
                            initial_value=lambda shape, i=init, n=name, d=self.dtype:
                            i(shape, d, n))
            self._vars[short] = v
        elif (v.axes.names, v.axes.lengths) != (be.Axes(*axes).names, be.Axes(*axes).lengths):
            # Another feature axis of the same length would make a dot an outer product.
            raise AxisMismatchError(f"layer {self.name}: called on an input whose axes "
                                    f"need {v.name} with axes {be.Axes(*axes)!r} but it was "
                                    f"made with {v.axes!r} (at {user_location()})")
        return be.value_of(v)

    @property
    def variables(self) -> list[og.Variable]:
        """The layer's Variables (trainable or not), in creation order."""
        return list(self._vars.values())

    def pop_updates(self) -> list[og.Op]:
        """The assignments (SetItems) the training-mode calls since the last
        ``pop_updates`` made, such as BatchNorm's running averages: a training
        computation requests them among its results. Cleared by the call."""
        ups, self._updates = self._updates, []
        return ups

    def _rename(self, prefix: str) -> None:
        self.name = f"{prefix}/{self.name}"

    def __repr__(self) -> str:
        return (f"{type(self).__name__}("
                + ", ".join(self._repr_arguments(skip=("name",)) + [f"name={self.name!r}"])
                + ")")


def trace_calls() -> "contextvars.Token[Optional[list[list[Any]]]]":
    """Start recording layer calls (see :data:`_trace`); returns the token that
    :func:`end_trace` takes."""
    return _trace.set([])


def end_trace(token: "contextvars.Token[Optional[list[list[Any]]]]") -> list[list[Any]]:
    """Stop recording; the ``[layer, output, container]`` of each call recorded."""
    calls = _trace.get() or []
    _trace.reset(token)
    return calls


def _check_nout(nout: Any, what: str) -> None:
    if isinstance(nout, be.Axis) or (is_int(nout) and nout > 0):
        return
    raise ArgumentError(f"{what}: nout must be an Axis or a length (an integer > 0), not "
                        f"{describe(nout)} (at {user_location()})")


def _out_axis(n: AxisOrLength, layer: Layer) -> Axis:
    if isinstance(n, be.Axis):
        return n
    return be.Axis(int(n), name=f"{layer.name}_out")


class Affine(Layer):
    """A dense layer: ``activation(W · x + b)`` over the input's feature axes.

    ``nout`` is the output axis, or its length (the axis is then named
    ``<layer name>_out``). ``W`` has axes ``(out, *features)``; ``bias=False`` drops
    ``b``.
    """

    def __init__(self, nout: AxisOrLength, activation: ActivationLike = None,
                 weight_init: Optional[Init] = None, bias_init: Optional[Init] = None,
                 bias: bool = True, name: Optional[str] = None,
                 dtype: og.DTypeLike = np.float32) -> None:
        super().__init__(name, dtype)
        _check_nout(nout, "nn.Affine")
        self.nout, self.activation = nout, _activation(activation)
        self.weight_init = weight_init or GlorotUniform()
        self.bias_init = bias_init or Constant(0.0)
        self.bias = bias
        self.out_axis: Optional[Axis] = None

    def forward(self, x: og.TensorOp, training: bool) -> og.TensorOp:
        feats = _features(x, f"Affine {self.name}")
        if self.out_axis is None:
            self.out_axis = _out_axis(self.nout, self)
        y = be.dot(self.variable("W", (self.out_axis,) + tuple(feats), self.weight_init), x)
        if self.bias:
            y = y + self.variable("b", (self.out_axis,), self.bias_init)
        return self.activation(y) if self.activation else y


class Activation(Layer):
    """An elementwise function, given as a callable or a geon function's name."""

    def __init__(self, fn: ActivationLike, name: Optional[str] = None) -> None:
        super().__init__(name)
        self.fn = _required(fn, "Activation")

    def forward(self, x: og.TensorOp, training: bool) -> og.TensorOp:
        return self.fn(x)


class Flatten(Layer):
    """The feature axes merged into one axis ``<name>_out`` (batch and recurrent axes
    kept, first and last)."""

    def forward(self, x: og.TensorOp, training: bool) -> og.TensorOp:
        feats = _features(x, f"Flatten {self.name}")
        lead = x.axes.batch_axes()
        rest = x.axes.recurrent_axes()
        ordered = be.axes_with_order(x, lead + feats + rest)
        groups = list(lead) + [feats] + list(rest)
        flat = be.flatten(ordered, groups)
        out = be.Axis(feats.size, name=f"{self.name}_out")
        y: og.TensorOp = be.cast_axes(flat, be.Axes(*lead, out, *rest))
        return y


class Embedding(Layer):
    """A lookup table: integer ids (any axes) to vectors along the axis ``nout``.

    The table ``W`` has axes ``(vocab, out)``, ``vocab`` of length ``vocab_size``.
    """

    def __init__(self, vocab_size: int, nout: AxisOrLength, init: Optional[Init] = None,
                 name: Optional[str] = None, dtype: og.DTypeLike = np.float32) -> None:
        super().__init__(name, dtype)
        if not (is_int(vocab_size) and vocab_size > 0):
            raise ArgumentError(f"nn.Embedding: vocab_size must be an integer > 0, not "
                                f"{describe(vocab_size)} (at {user_location()})")
        _check_nout(nout, "nn.Embedding")
        self.vocab = be.Axis(int(vocab_size), name=f"{self.name}_vocab")
        self.nout, self.init = nout, init
        self.out_axis: Optional[Axis] = None

    def forward(self, ids: og.TensorOp, training: bool) -> og.TensorOp:
        if self.out_axis is None:
            self.out_axis = _out_axis(self.nout, self)
        table = self.variable("W", (self.vocab, self.out_axis), self.init or Gaussian(0, 1))
        return be.gather(table, ids, self.vocab)


class LayerNorm(Layer):
    """Normalization over the feature axes of each sample (and time step):
    ``(x - mean) / sqrt(var + eps) * g + b`` with ``g``, ``b`` over the features."""

    def __init__(self, eps: float = 1e-5, name: Optional[str] = None,
                 dtype: og.DTypeLike = np.float32) -> None:
        super().__init__(name, dtype)
        self.eps = eps

    def forward(self, x: og.TensorOp, training: bool) -> og.TensorOp:
        feats = _features(x, f"LayerNorm {self.name}")
        mu = be.mean(x, reduction_axes=feats)
        centered = x - mu
        var = be.mean(be.square(centered), reduction_axes=feats)
        y = centered / be.sqrt(var + self.eps)
        out: og.TensorOp = (y * self.variable("g", tuple(feats), Constant(1.0))
                            + self.variable("b", tuple(feats), Constant(0.0)))
        return out


class BatchNorm(Layer):
    """Batch normalization (Ioffe & Szegedy, 2015) as PyTorch's ``BatchNorm*d``.

    ``axis`` is the channel axis (default: the input's first feature axis); statistics
    are taken over every other axis (batch, spatial, recurrent). In training calls the
    output uses the batch's mean and biased variance, and ``pop_updates`` gives the
    updates of the running averages ``mean = (1 - momentum) mean + momentum batch_mean``
    and ``var`` likewise with the unbiased batch variance. Inference calls use the
    running averages and assign nothing. Variables: ``g`` and ``b`` (trainable),
    ``mean`` and ``var`` (persistent, not trainable).
    """

    def __init__(self, axis: Optional[Axis] = None, momentum: float = 0.1, eps: float = 1e-5,
                 name: Optional[str] = None, dtype: og.DTypeLike = np.float32) -> None:
        super().__init__(name, dtype)
        self.axis, self.momentum, self.eps = axis, momentum, eps

    def forward(self, x: og.TensorOp, training: bool) -> og.TensorOp:
        channel = self.axis or _features(x, f"BatchNorm {self.name}")[0]
        if channel not in x.axes:
            raise AxisMismatchError(f"BatchNorm {self.name}: axis {channel!r} is not in "
                                    f"input {x.name} ({x.axes!r}) (at {user_location()})")
        c = (channel,)
        g = self.variable("g", c, Constant(1.0))
        b = self.variable("b", c, Constant(0.0))
        mean = self.variable("mean", c, Constant(0.0), trainable=False)
        var = self.variable("var", c, Constant(1.0), trainable=False)
        red = x.axes - be.Axes(channel)
        if training:
            mu = be.mean(x, reduction_axes=red)
            centered = x - mu
            v = be.mean(be.square(centered), reduction_axes=red)
            n = red.size
            m = self.momentum
            self._updates += [
                be.SetItem(self._vars["mean"], (1 - m) * mean + m * mu),
                be.SetItem(self._vars["var"], (1 - m) * var + m * v * (n / max(n - 1, 1)))]
        else:
            centered, v = x - mean, var
        out: og.TensorOp = centered / be.sqrt(v + self.eps) * g + b
        return out


class _RecurrentBase(Layer):
    """Shared time loop over the input's recurrent axis.

    ``nout`` is the hidden axis (or its length). The result has the hidden axis, the
    recurrent axis T (every step's state, ``return_sequence=True``, the default) or
    not (the last state only), and the batch axes. The initial state is zero.

    The loop is one :func:`geon.scan` over T whose body is one copy of the cell,
    whatever the sequence's length; ``unroll=True`` builds one copy of the cell per
    step instead (the graph grows with the sequence; the values are the same).
    ``remat`` is the scan's policy for the reverse derivative (see :func:`geon.scan`):
    ``"none"`` (the default) stores each step's intermediates, ``"step"`` recomputes
    them from the stored state, ``"checkpoints"`` stores the state every
    ``ceil(sqrt(T))`` steps only.
    """

    gates = 1
    #: The number of states the cell carries (the output first).
    states = 1

    def __init__(self, nout: AxisOrLength, activation: ActivationLike = "tanh",
                 init: Optional[Init] = None, recurrent_init: Optional[Init] = None,
                 return_sequence: bool = True, unroll: bool = False, remat: str = "none",
                 name: Optional[str] = None, dtype: og.DTypeLike = np.float32) -> None:
        super().__init__(name, dtype)
        _check_nout(nout, public_name(type(self)))
        remat_segment(remat, 1)  # (an unknown policy is an error here, not at the call)
        self.remat = remat
        self.nout = nout
        self.activation = _required(activation, type(self).__name__)
        self.init = init or GlorotUniform()
        self.recurrent_init = recurrent_init or GlorotUniform()
        self.return_sequence = return_sequence
        self.unroll = bool(unroll)
        self.out_axis: Optional[Axis] = None

    def _setup(self, x: og.TensorOp) -> tuple[Axis, og.TensorOp, og.TensorOp]:
        rec = x.axes.recurrent_axes()
        if len(rec) != 1:
            raise AxisMismatchError(f"{type(self).__name__} {self.name}: input {x.name} "
                                    f"({x.axes!r}) needs exactly one recurrent axis (at "
                                    f"{user_location()})")
        feats = _features(x, f"{type(self).__name__} {self.name}")
        if self.out_axis is None:
            self.out_axis = self.hidden_axis = _out_axis(self.nout, self)
            self.rec_axis = be.Axis(self.out_axis.length, name=f"{self.name}_hprev")
            self.gate_axis = be.Axis(self.gates, name=f"{self.name}_gate")
        H, Hr, G = self.out_axis, self.rec_axis, self.gate_axis
        lead = (G,) if self.gates > 1 else ()
        W = self.variable("W", lead + (H,) + tuple(feats), self.init)
        U = self.variable("U", lead + (H, Hr), self.recurrent_init)
        return rec[0], W, U

    def _as_prev(self, h: og.TensorOp) -> og.TensorOp:
        prev: og.TensorOp = be.cast_axes(h, be.Axes(*[self.rec_axis if a == self.out_axis
                                                      else a for a in h.axes]))
        return prev

    def _gate(self, y: og.TensorOp, k: int) -> og.TensorOp:
        return be.slice_along_axis(y, self.gate_axis, k) if self.gates > 1 else y

    def forward(self, x: og.TensorOp, training: bool) -> og.TensorOp:
        T, W, U = self._setup(x)
        wx = self._input_part(be.dot(W, x))
        if self.unroll:
            return self._unrolled(T, U, wx)
        # The state's axes: a step's input part without T (the hidden and batch axes).
        state_axes = be.Axes(*[a for a in wx[0].axes if a.name != T.name])
        zero = be.constant(0.0, axes=state_axes, dtype=wx[0].dtype)
        init = (zero,) * self.states

        def body(state: tuple[og.TensorOp, ...], xt: tuple[og.TensorOp, ...]) -> Any:
            new = self.cell(list(xt), be.dot(U, self._as_prev(state[0])), state)
            return new, new[0] if self.return_sequence else None
        final, ys = be.scan(body, init, tuple(wx), T, remat=self.remat)
        if not self.return_sequence:
            out: og.TensorOp = final[0]
            return out
        # ys has T first; the unrolled layer's order is (hidden, T, batch...).
        order = be.Axes(*list(ys.axes)[1:2], T, *list(ys.axes)[2:])
        seq: og.TensorOp = be.axes_with_order(ys, order)
        return seq

    def _unrolled(self, T: Axis, U: og.TensorOp, wx: list[og.TensorOp]) -> og.TensorOp:
        """One copy of the cell per step (``unroll=True``)."""
        state: Optional[tuple[og.TensorOp, ...]] = None
        outs = []
        steps = T.length
        assert steps is not None  # the input's own axis: its length is known
        for t in range(steps):
            xt = [be.slice_along_axis(p, T, t) for p in wx]
            uh: Optional[og.TensorOp] = (None if state is None
                                         else be.dot(U, self._as_prev(state[0])))
            state = self.cell(xt, uh, state)
            outs.append(state[0])
        if not self.return_sequence:
            return outs[-1]
        return be.stack(outs, T, position=1)

    def cell(self, xt: list[og.TensorOp], uh: Optional[og.TensorOp],
             state: Optional[tuple[og.TensorOp, ...]]) -> tuple[og.TensorOp, ...]:
        """One step: the new states (the output first) from the input part of each gate
        ``xt``, ``U h_{t-1}`` (``uh``) and the previous states (both None at the first
        step of an unrolled loop, whose states start at zero)."""
        raise NotImplementedError

    def _input_part(self, wx: og.TensorOp) -> list[og.TensorOp]:
        return [self._gate(wx, k) for k in range(self.gates)]


class Recurrent(_RecurrentBase):
    """An Elman RNN: ``h_t = activation(W x_t + U h_{t-1} + b)`` (PyTorch's ``nn.RNN``
    with one bias)."""

    def _input_part(self, wx: og.TensorOp) -> list[og.TensorOp]:
        # the bias is added once, to every step's input part
        return [wx + self.variable("b", (self.hidden_axis,), Constant(0.0))]

    def cell(self, xt: list[og.TensorOp], uh: Optional[og.TensorOp],
             state: Optional[tuple[og.TensorOp, ...]]) -> tuple[og.TensorOp, ...]:
        return (self.activation(xt[0] if uh is None else xt[0] + uh),)


class LSTM(_RecurrentBase):
    """A long short-term memory layer (Hochreiter & Schmidhuber, 1997), gates in the
    order input, forget, cell, output (PyTorch's ``nn.LSTM`` with one bias ``b`` of
    axes ``(gate, out)``; ``W`` is ``(gate, out, *features)``, ``U`` is
    ``(gate, out, out_prev)``). ``activation`` (tanh) is that of the cell input and
    output; the gates use the sigmoid."""

    gates = 4
    states = 2

    def _input_part(self, wx: og.TensorOp) -> list[og.TensorOp]:
        b = self.variable("b", (self.gate_axis, self.hidden_axis), Constant(0.0))
        return super()._input_part(wx + b)   # the bias once, for every step

    def cell(self, xt: list[og.TensorOp], uh: Optional[og.TensorOp],
             state: Optional[tuple[og.TensorOp, ...]]) -> tuple[og.TensorOp, ...]:
        pre = [xt[k] if uh is None else xt[k] + self._gate(uh, k) for k in range(4)]
        i, f, o = be.sigmoid(pre[0]), be.sigmoid(pre[1]), be.sigmoid(pre[3])
        g = self.activation(pre[2])
        c = i * g if state is None else f * state[1] + i * g
        return (o * self.activation(c), c)


class GRU(_RecurrentBase):
    """A gated recurrent unit (Cho et al., 2014) in PyTorch's ``nn.GRU`` form, gates
    reset, update, new: ``n = tanh(W_n x + b_n + r * (U_n h + bh_n))``,
    ``h' = (1 - z) n + z h``; biases ``b`` (input) and ``bh`` (recurrent)."""

    gates = 3

    def _input_part(self, wx: og.TensorOp) -> list[og.TensorOp]:
        b = self.variable("b", (self.gate_axis, self.hidden_axis), Constant(0.0))
        self.variable("bh", (self.gate_axis, self.hidden_axis), Constant(0.0))
        return super()._input_part(wx + b)   # the input bias once, for every step

    def cell(self, xt: list[og.TensorOp], uh: Optional[og.TensorOp],
             state: Optional[tuple[og.TensorOp, ...]]) -> tuple[og.TensorOp, ...]:
        bh = self.variable("bh", (self.gate_axis, self.hidden_axis), Constant(0.0))
        hp = bh if uh is None else uh + bh       # all gates' recurrent parts at once
        hpart = [self._gate(hp, k) for k in range(3)]
        r = be.sigmoid(xt[0] + hpart[0])
        z = be.sigmoid(xt[1] + hpart[1])
        n = self.activation(xt[2] + r * hpart[2])
        h = (1 - z) * n if state is None else (1 - z) * n + z * state[0]
        return (h,)


class Sequential(Layer):
    """Layers applied in order. With a ``name``, the children's names (and so their
    Variables') are prefixed with it: ``net/hidden/W``."""

    def __init__(self, layers: Iterable[Layer], name: Optional[str] = None) -> None:
        super().__init__()
        self.name = name or ""
        if isinstance(layers, Layer) or not isinstance(layers, Iterable):
            raise ArgumentError(f"nn.Sequential: layers must be a list of layers, not "
                                f"{describe(layers)}: nn.Sequential([nn.Affine(64), ...])"
                                f" (at {user_location()})")
        self.layers = list(layers)
        for i, layer in enumerate(self.layers):
            if not isinstance(layer, Layer):
                made = (f"; make one: {layer.__name__}(...)"
                        if isinstance(layer, type) and issubclass(layer, Layer) else "")
                raise ArgumentError(f"nn.Sequential: layers[{i}] is {describe(layer)}, "
                                    f"not a layer (an nn.Layer){made} (at "
                                    f"{user_location()})")
        if self.name:
            for layer in self.layers:
                layer._rename(self.name)

    def _rename(self, prefix: str) -> None:
        if self.name:
            super()._rename(prefix)
        for layer in self.layers:
            layer._rename(prefix)

    def forward(self, x: og.TensorOp, training: bool) -> og.TensorOp:
        for layer in self.layers:
            x = layer(x, training)
        return x

    @property
    def variables(self) -> list[og.Variable]:
        return [v for layer in self.layers for v in layer.variables]

    def pop_updates(self) -> list[og.Op]:
        return [u for layer in self.layers for u in layer.pop_updates()]

    def __repr__(self) -> str:
        inner = "".join(f"\n  {line}" for layer in self.layers
                        for line in (repr(layer) + ",").splitlines())
        name = f", name={self.name!r}" if self.name else ""
        return f"Sequential([{inner}\n]{name})" if self.layers else f"Sequential([]{name})"


def _spatial_out(layer: Layer, spatial: Axes) -> Axes:
    """The layer's own output spatial axes (lengths set by the op), one per input axis,
    named ``<layer>_<axis>``: layers applied one after another never share one."""
    return be.Axes(*[be.Axis(None, name=f"{layer.name}_{a.name}") for a in spatial])


def _channel_spatial(x: og.TensorOp, channel: Optional[Axis],
                     spatial: Optional[Iterable[Axis]], what: str) -> tuple[Axis, Axes]:
    feats = _features(x, what)
    channel = feats[0] if channel is None else channel
    if spatial is None:
        spatial = feats - be.Axes(channel)
    return channel, be.Axes(*spatial)


class Conv(Layer):
    """A convolution over 1 to 3 spatial axes: ``activation(conv(x, W) + b)``.

    ``nout`` is the output-channel axis (or its length; the axis is then
    ``<name>_out``); ``kernel`` the filter's size along each spatial axis. The input's
    ``channel`` axis defaults to its first feature axis, the ``spatial`` axes to the
    other feature axes. ``W`` has axes ``(out, channel, k0, k1, ...)`` (PyTorch's
    layout), ``b`` ``(out,)``. ``strides``, ``padding`` (ints, per axis, ``"same"`` or
    ``"valid"``) and ``dilation`` are those of :func:`geon.conv`. The result has the
    input's axes with the channel replaced by the output channel and each spatial axis
    ``A`` by ``<name>_A``.
    """

    def __init__(self, nout: AxisOrLength, kernel: Union[int, Sequence[int]],
                 strides: Union[int, Sequence[int]] = 1, padding: Any = 0,
                 dilation: Union[int, Sequence[int]] = 1, activation: ActivationLike = None,
                 channel: Optional[Axis] = None, spatial: Optional[Iterable[Axis]] = None,
                 weight_init: Optional[Init] = None, bias_init: Optional[Init] = None,
                 bias: bool = True, name: Optional[str] = None,
                 dtype: og.DTypeLike = np.float32) -> None:
        super().__init__(name, dtype)
        _check_nout(nout, "nn.Conv")
        self.nout, self.kernel = nout, kernel
        self.strides, self.padding, self.dilation = strides, padding, dilation
        self.activation = _activation(activation)
        self.channel, self.spatial = channel, spatial
        self.weight_init = weight_init or KaimingNormal()
        self.bias_init = bias_init or Constant(0.0)
        self.bias = bias
        self.out_axis: Optional[Axis] = None

    def forward(self, x: og.TensorOp, training: bool) -> og.TensorOp:
        channel, spatial = _channel_spatial(x, self.channel, self.spatial,
                                            f"Conv {self.name}")
        kernel = self.kernel if isinstance(self.kernel, (tuple, list)) else \
            (self.kernel,) * len(spatial)
        if self.out_axis is None:
            self.out_axis = _out_axis(self.nout, self)
        kaxes = tuple(be.Axis(k, name=f"{self.name}_k{i}") for i, k in enumerate(kernel))
        W = self.variable("W", (self.out_axis, channel) + kaxes, self.weight_init)
        y = be.conv(x, W, channel, spatial, self.out_axis, kernel=be.Axes(*kaxes),
                    out_spatial=_spatial_out(self, spatial), strides=self.strides,
                    padding=self.padding, dilation=self.dilation)
        if self.bias:
            y = y + self.variable("b", (self.out_axis,), self.bias_init)
        return self.activation(y) if self.activation else y


class Pool(Layer):
    """Max (``op="max"``) or average (``op="avg"``) pooling over the ``spatial`` axes
    (default: the feature axes after the first, the channel), windows of ``kernel``,
    ``strides`` defaulting to the kernel (see :func:`geon.max_pool`). Each spatial axis
    ``A`` becomes ``<name>_A``."""

    def __init__(self, kernel: Union[int, Sequence[int]],
                 strides: Union[int, Sequence[int], None] = None, padding: Any = 0,
                 op: str = "max", channel: Optional[Axis] = None,
                 spatial: Optional[Iterable[Axis]] = None, name: Optional[str] = None) -> None:
        super().__init__(name)
        if op not in ("max", "avg"):
            raise ArgumentError(f"Pool: op must be 'max' or 'avg', not {op!r} (at "
                                f"{user_location()})")
        self.kernel, self.strides, self.padding, self.op = kernel, strides, padding, op
        self.channel, self.spatial = channel, spatial

    def forward(self, x: og.TensorOp, training: bool) -> og.TensorOp:
        _, spatial = _channel_spatial(x, self.channel, self.spatial, f"Pool {self.name}")
        pool = be.max_pool if self.op == "max" else be.avg_pool
        return pool(x, spatial, self.kernel, strides=self.strides, padding=self.padding,
                    out_spatial=_spatial_out(self, spatial))


class Dropout(Layer):
    """Inverted dropout (:func:`geon.dropout`): in training calls each element is kept
    with probability ``1 - rate`` and scaled by ``1 / (1 - rate)``; inference calls
    return the input. The mask comes from geon's seeded random ops: ``seed`` and the
    stream (by default from the layer's name, so a model built again draws the same
    masks) fix it; its step counter is a persistent Variable, so a restored run draws
    what an uninterrupted one would."""

    def __init__(self, rate: float = 0.5, seed: int = 0, stream: Optional[int] = None,
                 name: Optional[str] = None) -> None:
        super().__init__(name)
        if not 0.0 <= rate < 1.0:
            raise ArgumentError(f"Dropout: rate must be in [0, 1), not {rate!r} (at "
                                f"{user_location()})")
        self.rate, self.seed, self.stream = rate, seed, stream

    def forward(self, x: og.TensorOp, training: bool) -> og.TensorOp:
        if not training:
            return x
        stream = self.stream if self.stream is not None else \
            zlib.crc32(self.name.encode()) & 0x7FFFFFFF
        if getattr(self, "_counter", None) is None:  # one per layer, whatever the graphs
            self._counter = step_counter(stream)
        return be.dropout(x, self.rate, seed=self.seed, stream=stream,
                          counter=self._counter)
