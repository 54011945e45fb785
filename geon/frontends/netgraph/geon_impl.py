"""Translation of an architecture graph into geon ops over named axes.

Every node's value has the axes ``(N, F<id>)``: the batch axis and the node's own
feature axis. Parameters are Variables named like the PyTorch translation's
``state_dict`` keys. Steps are unrolled: ``to_geon(graph, batch_size, steps=T)`` builds
``T`` input placeholders and ``T`` outputs; the recurrent state enters as placeholders
(``state_in``) and leaves as ops (``state_out``), and :class:`Stepper` carries it from
one call to the next like ``TranslatedModel.forward`` does.
"""

import math
from typing import Any, Mapping, Union

import numpy as np

import geon as be
from geon.errors import ArgumentError
from geon.frontends.netgraph.graph import Graph, NodeType
from geon.frontends.netgraph.layout import ATTENTION_LIKE, Layout
from geon.op_graph import op_graph as og
from geon.op_graph.axes import Axes, Axis
from geon.transformers.base import Transformer


def to_geon(graph: Graph, batch_size: int, steps: int = 1, dtype: og.DTypeLike = np.float32,
            seed: int = 0) -> "GeonNet":
    """Build the geon computation of ``graph`` (see :class:`GeonNet`).

    ``batch_size`` is the length of the batch axis ``N``; ``steps`` the number of
    unrolled steps; ``dtype`` the dtype of parameters, inputs and states. Parameters
    start from the graph's values (biases, edge weights, zero gates and routers) and,
    for the matrices and queries, from random numbers of ``numpy.random.default_rng(seed)``
    drawn like PyTorch's defaults; :meth:`GeonNet.load_state_dict` replaces them with a
    PyTorch model's. Raises :class:`GraphError` like :func:`to_pytorch_model`.
    """
    return GeonNet(graph, batch_size, steps, np.dtype(dtype), seed)


class GeonNet:
    """The geon translation of an architecture graph.

    Attributes:
        inputs: one placeholder per step, axes ``(N, X)`` with ``X`` the INPUT nodes'
            widths added (the same layout as the PyTorch model's input).
        outputs: one op per step, axes ``(N, OUT)``: the OUTPUT nodes' values
            concatenated in ``graph.output_node_ids`` order.
        state_in: ``{name: placeholder}``, the state before the first step:
            ``prev_<id>`` (the previous output of a node a recurrent edge reads),
            ``h_<id>`` / ``c_<id>`` (LSTM and GRU states); zeros mean a fresh start.
        state_out: ``{name: op}``, the same states after the last step.
        params: ``{name: Variable}`` named like the PyTorch ``state_dict`` keys.
    """

    def __init__(self, graph: Graph, batch_size: int, steps: int, dtype: np.dtype,
                 seed: int) -> None:
        if steps < 1:
            raise ArgumentError(f"to_geon: steps must be at least 1, got {steps}")
        if not graph.output_node_ids:
            raise ArgumentError("to_geon: the graph has no OUTPUT node")
        self.graph, self.dtype = graph, dtype
        self.layout = lay = Layout(graph)
        self.rng = np.random.default_rng(seed)
        self.N = Axis(batch_size, "N", batch=True)
        self.F = {nid: Axis(s, f"F{nid}") for nid, s in lay.size.items()}
        self.E = {nid: Axis(s, f"E{nid}") for nid, s in lay.edge_size.items()}
        self.X = Axis(sum(lay.input_sizes), "X")
        out_sizes = [lay.size[o] for o in graph.output_node_ids]
        self.OUT = Axis(sum(out_sizes), "OUT")
        self.params: dict[str, og.Variable] = {}
        self._make_params()
        self.state_in: dict[str, og.Placeholder] = {}
        for nid in lay.recurrent_sources:
            self._state(f"prev_{nid}", nid)
        for nid in sorted(lay.in_edges):
            act = graph.nodes[nid].activation_function
            if act in ("lstm", "gru"):
                self._state(f"h_{nid}", nid)
            if act == "lstm":
                self._state(f"c_{nid}", nid)
        state = dict(self.state_in)
        self.inputs, self.outputs = [], []
        for t in range(steps):
            x = be.placeholder([self.N, self.X], dtype=dtype, name=f"x{t}")
            out, state = self._step(x, state)
            self.inputs.append(x)
            self.outputs.append(out)
        self.state_out = state

    # --- parameters --------------------------------------------------------------------
    def _param(self, name, axes, value):
        self.params[name] = be.Variable(Axes(axes), initial_value=np.asarray(
            value, self.dtype).reshape(Axes(axes).shape), dtype=self.dtype, name=name)

    def _uniform(self, shape, fan_in):
        bound = 1.0 / math.sqrt(fan_in)
        return self.rng.uniform(-bound, bound, shape)

    def _make_params(self):
        lay, graph = self.layout, self.graph
        for nid in sorted(lay.in_edges):
            node, size, F = graph.nodes[nid], lay.size[nid], self.F[nid]
            act = node.activation_function
            if act in ("lstm", "gru"):
                G = Axis((4 if act == "lstm" else 3) * size, f"G{nid}")
                for w in ("weight_ih", "weight_hh"):
                    self._param(f"{act}_{nid}.{w}", [G, F], self._uniform((G.length, size), size))
            self._param(f"bias_{nid}", [], node.bias)
            shape = lay.query_shape(nid)
            if shape is not None:
                axes = [self.E[nid]] if len(shape) == 1 else [Axis(shape[0], f"Q{nid}"),
                                                             self.E[nid]]
                self._param(f"q_{nid}", axes, self.rng.standard_normal(shape) * 0.01)
        for e in lay.edges():
            key, agg = lay.edge_key(e), lay.aggregation(e.target_id)
            if lay.needs_projection(e):
                n_in = lay.size[e.source_id]
                self._param(f"proj_{key}.weight", [self.E[e.target_id], self.F[e.source_id]],
                            self._uniform((lay.edge_size[e.target_id], n_in), n_in))
            self._param(f"weight_{key}", [], e.weight)
            if agg == "gated_sum":
                self._param(f"gate_{key}", [], 0.0)
            if agg == "moe":
                self._param(f"router_{key}", [], 0.0)
        for nid in sorted(lay.in_edges):
            if lay.needs_post(nid):
                n_in = lay.agg_size[nid]
                self._param(f"post_{nid}.weight", [self.F[nid], self._agg_axis(nid)],
                            self._uniform((lay.size[nid], n_in), n_in))

    def _agg_axis(self, nid):
        """The axis of a node's aggregated value: ``E<id>`` when it is one edge wide,
        else ``A<id>`` (concatenations, several heads)."""
        lay = self.layout
        if lay.agg_size[nid] == lay.edge_size[nid]:
            return self.E[nid]
        return Axis(lay.agg_size[nid], f"A{nid}")

    def _state(self, name, nid):
        self.state_in[name] = be.placeholder([self.N, self.F[nid]], dtype=self.dtype,
                                             name=name)

    # --- one step ----------------------------------------------------------------------
    def _step(self, x, state):
        lay, graph = self.layout, self.graph
        values, start = {}, 0
        for nid, size in zip(graph.input_node_ids, lay.input_sizes):
            values[nid] = be.slice_along_axis(x, self.X, slice(start, start + size),
                                              new_axis=self.F[nid])
            start += size
        new_state = {}
        for nid in lay.order:
            if graph.nodes[nid].node_type is NodeType.INPUT:
                continue
            xs = [self._edge_value(e, values, state) for e in lay.in_edges[nid]]
            agg = self._aggregate(nid, xs)
            F = self.F[nid]
            if lay.needs_post(nid):
                agg = be.dot(agg, self.params[f"post_{nid}.weight"])
            elif agg.axes[1] != F:
                agg = be.cast_axes(agg, Axes([self.N, F]))
            values[nid] = self._activate(nid, agg + self.params[f"bias_{nid}"], state,
                                         new_state)
        for nid in lay.recurrent_sources:
            new_state[f"prev_{nid}"] = values[nid]
        outs = [values[o] for o in graph.output_node_ids]
        if len(outs) == 1:
            out = be.cast_axes(outs[0], Axes([self.N, self.OUT]))
        else:
            out = be.concat(outs, [o.axes[1] for o in outs], out_axis=self.OUT)
        return out, new_state

    def _edge_value(self, e, values, state):
        lay = self.layout
        v = state[f"prev_{e.source_id}"] if e.is_recurrent else values[e.source_id]
        key, E = lay.edge_key(e), self.E[e.target_id]
        if lay.needs_projection(e):
            v = be.dot(v, self.params[f"proj_{key}.weight"])
        else:
            v = be.cast_axes(v, Axes([self.N, E]))
        v = v * self.params[f"weight_{key}"]
        if lay.aggregation(e.target_id) == "gated_sum":
            v = v * be.sigmoid(self.params[f"gate_{key}"])
        return v

    def _aggregate(self, nid, xs):
        lay = self.layout
        agg, E = lay.aggregation(nid), self.E[nid]
        A = self._agg_axis(nid)
        if not xs:
            return be.constant(np.zeros((self.N.length, A.length), self.dtype),
                               axes=Axes([self.N, A]))
        if agg in ("sum", "gated_sum", "mean"):
            total = xs[0]
            for v in xs[1:]:
                total = total + v
            return total / float(len(xs)) if agg == "mean" else total
        if agg in ("concat", "matrix_product"):
            return xs[0] if len(xs) == 1 else be.concat(xs, E, out_axis=A)
        J = Axis(len(xs), f"J{nid}")
        X = be.stack(xs, J, position=1)  # (N, J, E)
        if agg == "max":
            return be.max(X, reduction_axes=[J])
        if agg in ATTENTION_LIKE:
            q = self.params[f"q_{nid}"]
            scale = math.sqrt(E.length) * lay.temperature(nid)
            heads = []
            for h in range(lay.heads(nid)):
                qh = q if agg == "attention" else be.slice_along_axis(q, q.axes[0], h)
                w = be.softmax(be.dot(X, qh) / scale, normalization_axes=[J])
                heads.append(be.sum(w * X, reduction_axes=[J]))
            return heads[0] if len(heads) == 1 else be.concat(heads, E, out_axis=A)
        if agg == "topk_weighted_sum":
            scores = be.mean(X, reduction_axes=[E])  # (N, J)
        else:  # moe: router logits (J), shared by the batch
            keys = [lay.edge_key(e) for e in lay.in_edges[nid]]
            scores = be.stack([self.params[f"router_{k}"] for k in keys], J)
        w = _masked_softmax(scores, J, lay.top_k(nid, len(xs)))
        return be.sum(w * X, reduction_axes=[J])

    def _activate(self, nid, z, state, new_state):
        act = self.graph.nodes[nid].activation_function
        if act == "lstm":
            h, c = _lstm(z, state[f"h_{nid}"], state[f"c_{nid}"],
                         self.params[f"lstm_{nid}.weight_ih"],
                         self.params[f"lstm_{nid}.weight_hh"])
            new_state[f"h_{nid}"], new_state[f"c_{nid}"] = h, c
            return h
        if act == "gru":
            h = _gru(z, state[f"h_{nid}"], self.params[f"gru_{nid}.weight_ih"],
                     self.params[f"gru_{nid}.weight_hh"])
            new_state[f"h_{nid}"] = h
            return h
        if act == "softmax":
            return be.softmax(z, normalization_axes=[self.F[nid]])
        return _ACTIVATIONS[act](z)

    # --- parameters in and out ---------------------------------------------------------
    def load_state_dict(self, transformer: Transformer, state_dict: Mapping[str, Any]) -> None:
        """Copy a ``TranslatedModel.state_dict()`` (tensors or arrays) into this net's
        Variables on ``transformer``; the names and shapes must match exactly. Build the
        computations first: a Variable none of them uses (a node no output depends on)
        has no storage on the transformer and is skipped."""
        missing = sorted(set(self.params) - set(state_dict))
        extra = sorted(set(state_dict) - set(self.params))
        if missing or extra:
            raise ArgumentError(f"load_state_dict: missing {missing}, unexpected {extra}")
        transformer.initialize()
        live: Mapping[Any, np.ndarray] = transformer.state_view()  # keyed by snap(var)
        values: dict[Any, np.ndarray] = {}
        for name, var in self.params.items():
            value = state_dict[name]
            value = np.asarray(value.detach().cpu().numpy() if hasattr(value, "detach")
                               else value)
            if value.shape != var.axes.shape:
                raise ArgumentError(f"load_state_dict: {name} has shape {value.shape}, "
                                    f"the Variable {var.axes.shape}")
            if be.snap(var) in live:
                values[be.snap(var)] = value
        transformer.write_values(values)  # (in place, and on a GPU, to the device)

    def state_dict(self, transformer: Transformer) -> dict[str, np.ndarray]:
        """``{name: array}``: the Variables' values on ``transformer`` (their initial
        values for those no computation uses), for ``TranslatedModel.load_state_dict``
        after ``torch.from_numpy``."""
        transformer.initialize()
        live: Mapping[Any, np.ndarray] = transformer.state_view()  # keyed by snap(var)
        return {name: live[be.snap(var)].copy() if be.snap(var) in live
                else np.asarray(var.initial_array()) for name, var in self.params.items()}

    def zero_state(self) -> dict[str, np.ndarray]:
        """``{name: zeros}``: the state of a fresh start."""
        return {k: np.zeros(p.axes.shape, self.dtype) for k, p in self.state_in.items()}

    def stepper(self, transformer: Transformer) -> "Stepper":
        """A :class:`Stepper` running this net on ``transformer``."""
        return Stepper(self, transformer)


class Stepper:
    """Runs a :class:`GeonNet` call after call, carrying its recurrent state like
    ``TranslatedModel.forward``: ``stepper(x0, ..., reset_states=False)`` takes one
    ``[batch, width]`` array per unrolled step and returns the outputs (one array for
    a one-step net, else a list)."""

    def __init__(self, net: GeonNet, transformer: Transformer) -> None:
        self.net = net
        names = list(net.state_in)
        self.names = names
        self.comp = transformer.computation(
            list(net.outputs) + [net.state_out[n] for n in names],
            *net.inputs, *[net.state_in[n] for n in names])
        self.state = net.zero_state()

    def reset(self) -> None:
        """Start the next call from zero states."""
        self.state = self.net.zero_state()

    def __call__(self, *xs: Any, reset_states: bool = False
                 ) -> Union[np.ndarray, list[np.ndarray]]:
        if reset_states:
            self.reset()
        steps = len(self.net.inputs)
        if len(xs) != steps:
            raise ArgumentError(f"Stepper: {steps} inputs expected (one per step), "
                                f"got {len(xs)}")
        res = self.comp(*xs, *[self.state[n] for n in self.names])
        res = list(res) if isinstance(res, (list, tuple)) else [res]
        outs, new = res[:steps], res[steps:]
        self.state = {n: np.array(v) for n, v in zip(self.names, new)}
        return outs[0] if steps == 1 else outs


def _masked_softmax(scores, J, k):
    """Softmax of ``scores`` over ``J``, restricted to the ``k`` largest when ``k`` is
    given (the others get weight 0): the weights of a top-k softmax. The mask comes
    from top-k's positions, so ties select exactly ``k`` entries as ``torch.topk``
    does."""
    if k is None:
        return be.softmax(scores, normalization_axes=[J])
    K = Axis(k, f"{J.name}top")
    _, idx = be.topk(scores, k, J, new_axis=K)
    keep = be.stop_gradient(be.sum(be.one_hot(idx, J, dtype=scores.dtype),
                                   reduction_axes=[K]))
    e = be.exp(scores - be.stop_gradient(be.max(scores, reduction_axes=[J]))) * keep
    return e / be.sum(e, reduction_axes=[J])


def _gates(z, h, w_ih, w_hh, n, F):
    """``z @ w_ih.T`` and ``h @ w_hh.T`` cut into ``n`` chunks along the gate axis."""
    G = w_ih.axes[0]
    size = F.length
    gi, gh = be.dot(z, w_ih), be.dot(h, w_hh)
    return [(be.slice_along_axis(gi, G, slice(i * size, (i + 1) * size), new_axis=F),
             be.slice_along_axis(gh, G, slice(i * size, (i + 1) * size), new_axis=F))
            for i in range(n)]


def _lstm(z, h, c, w_ih, w_hh):
    """``torch.nn.LSTMCell`` without biases: gates in the order i, f, g, o."""
    F = z.axes[1]
    (ii, hi), (if_, hf), (ig, hg), (io, ho) = _gates(z, h, w_ih, w_hh, 4, F)
    i, f = be.sigmoid(ii + hi), be.sigmoid(if_ + hf)
    g, o = be.tanh(ig + hg), be.sigmoid(io + ho)
    c2 = f * c + i * g
    return o * be.tanh(c2), c2


def _gru(z, h, w_ih, w_hh):
    """``torch.nn.GRUCell`` without biases: gates in the order r, z, n."""
    F = z.axes[1]
    (ir, hr), (iz, hz), (in_, hn) = _gates(z, h, w_ih, w_hh, 3, F)
    r, u = be.sigmoid(ir + hr), be.sigmoid(iz + hz)
    n = be.tanh(in_ + r * hn)
    return (1.0 - u) * n + u * h


_ACTIVATIONS = {"relu": be.relu, "sigmoid": be.sigmoid, "tanh": be.tanh,
                "leaky_relu": be.leaky_relu, "elu": be.elu, "gelu": be.gelu,
                "linear": lambda z: z}
