"""``TranslatedModel``: an architecture graph as a PyTorch ``nn.Module``. Imports torch;
:func:`geon.frontends.netgraph.pytorch.to_pytorch_model` imports this module when it
first builds a model."""

import hashlib
import math

import torch
from torch import nn

from geon.errors import FeedError
from geon.frontends.netgraph.graph import NodeType
from geon.frontends.netgraph.layout import Layout
from geon.frontends.netgraph.translation_state import (_CACHE, _CACHE_ENABLED, _METRICS,
                                                       StateManager)


class TranslatedModel(nn.Module):
    """An architecture graph as a PyTorch module: ``forward(x, reset_states=False)``
    with ``x`` of shape ``[batch, sum of the INPUT nodes' output_size]``."""

    def __init__(self, graph, config=None):
        super().__init__()
        self.graph = graph
        self.config = dict(config or {})
        self.device = torch.device(self.config.get("device", "cpu"))
        self.dtype = self.config.get("dtype", torch.float32)
        self.cache_enabled = bool(self.config.get("enable_translation_cache",
                                                  _CACHE_ENABLED[0]))
        # Layout's topological sort raises on a cycle of non-recurrent edges,
        # naming its nodes; recurrent edges read the previous step instead.
        lay = self.layout = Layout(graph)
        self.execution_order = lay.order
        self.state_manager = StateManager()
        opts = {"device": self.device, "dtype": self.dtype}
        for nid in sorted(lay.in_edges):
            node = graph.nodes[nid]
            act, size = node.activation_function, lay.size[nid]
            if act == "lstm":
                self.add_module(f"lstm_{nid}", nn.LSTMCell(size, size, bias=False, **opts))
            elif act == "gru":
                self.add_module(f"gru_{nid}", nn.GRUCell(size, size, bias=False, **opts))
            else:
                self.add_module(f"act_{nid}", _activation(nn, act))
            self.register_parameter(f"bias_{nid}", self._cached(
                node, f"bias_{nid}",
                lambda: nn.Parameter(torch.tensor(node.bias, **opts)), lambda p: True))
            shape = lay.query_shape(nid)
            if shape is not None:
                self.register_parameter(f"q_{nid}",
                                        nn.Parameter(torch.randn(*shape, **opts) * 0.01))
        for e in lay.edges():
            key, agg = lay.edge_key(e), lay.aggregation(e.target_id)
            if lay.needs_projection(e):
                self.add_module(f"proj_{key}", nn.Linear(
                    lay.size[e.source_id], lay.edge_size[e.target_id], bias=False,
                    **opts))
            self.register_parameter(f"weight_{key}",
                                    nn.Parameter(torch.tensor(e.weight, **opts)))
            if agg == "gated_sum":
                self.register_parameter(f"gate_{key}",
                                        nn.Parameter(torch.tensor(0.0, **opts)))
            if agg == "moe":
                self.register_parameter(f"router_{key}",
                                        nn.Parameter(torch.tensor(0.0, **opts)))
        for nid in sorted(lay.in_edges):
            if lay.needs_post(nid):
                n_in, n_out = lay.agg_size[nid], lay.size[nid]
                self.add_module(f"post_{nid}", self._cached(
                    graph.nodes[nid], f"post_{nid}",
                    lambda: nn.Linear(n_in, n_out, bias=False, **opts),
                    lambda m: (m.in_features, m.out_features) == (n_in, n_out)))
        self.to(self.device, self.dtype)

    def _cached(self, node, name, make, fits):
        """``make()``, or the object cached under the node's derivation_uuid.

        The layers of a node with a derivation_uuid are initialized from a
        generator seeded by the uuid and the layer's name, not from the global RNG,
        so a fresh translation gives the same values whether or not the cache is
        on (the cache then only shares the objects). ``make()`` runs on a hit too,
        so the global random numbers drawn do not depend on the cache either."""
        fresh = make()
        uuid = node.attributes.get("derivation_uuid")
        if uuid is None:
            return fresh
        entry = _CACHE.setdefault(str(uuid), {}) if self.cache_enabled else {}
        old = entry.get(name)
        if old is not None and fits(old):
            _METRICS["hits"] += 1
            return old
        if self.cache_enabled:
            _METRICS["misses"] += 1
        if isinstance(fresh, nn.Linear):
            digest = hashlib.sha256(f"{uuid}/{name}".encode()).digest()
            gen = torch.Generator(device="cpu").manual_seed(
                int.from_bytes(digest[:8], "little"))
            bound = 1.0 / math.sqrt(fresh.in_features)
            with torch.no_grad():
                w = torch.rand(fresh.weight.shape, generator=gen, dtype=torch.float64)
                fresh.weight.copy_((2 * w - 1) * bound)
        entry[name] = fresh
        return fresh

    @property
    def input_width(self):
        """The width ``forward`` expects: the INPUT nodes' sizes added."""
        return sum(self.layout.input_sizes)

    def forward(self, x, reset_states=False):
        """One step: ``x`` ``[batch, input_width]`` (else :class:`FeedError`, a
        ``ValueError``) -> the OUTPUT nodes' values
        concatenated in ``graph.output_node_ids`` order. Recurrent edges read the
        previous call's values (zeros after ``reset_states=True``, on the first
        call, or when the batch size changes)."""
        lay, graph = self.layout, self.graph
        if x.dim() != 2 or x.shape[1] != self.input_width:
            raise FeedError(
                f"input of shape {tuple(x.shape)}: expected [batch, {self.input_width}] "
                f"(the output_size of the INPUT nodes {graph.input_node_ids} added)")
        if reset_states:
            self.state_manager.reset()
        batch = x.shape[0]
        states = self.state_manager
        states.begin(batch)
        values = dict(zip(graph.input_node_ids, torch.split(x, lay.input_sizes, dim=1)))
        for nid in lay.order:
            if graph.nodes[nid].node_type is NodeType.INPUT:
                continue
            inputs = [self._edge_value(e, values, batch) for e in lay.in_edges[nid]]
            agg = self._aggregate(nid, inputs, batch)
            if lay.needs_post(nid):
                agg = getattr(self, f"post_{nid}")(agg)
            values[nid] = self._activate(nid, agg + getattr(self, f"bias_{nid}"))
        for nid in lay.recurrent_sources:
            states.outputs[nid] = values[nid]
        outs = [values[o] for o in graph.output_node_ids]
        if not outs:
            return x.new_zeros((batch, 0))
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)

    def _edge_value(self, e, values, batch):
        lay = self.layout
        if e.is_recurrent:
            v = self.state_manager.outputs.get(e.source_id)
            if v is None:
                v = torch.zeros(batch, lay.size[e.source_id], device=self.device,
                                dtype=self.dtype)
        else:
            v = values[e.source_id]
        key = lay.edge_key(e)
        if lay.needs_projection(e):
            v = getattr(self, f"proj_{key}")(v)
        v = v * getattr(self, f"weight_{key}")
        if lay.aggregation(e.target_id) == "gated_sum":
            v = v * torch.sigmoid(getattr(self, f"gate_{key}"))
        return v

    def _aggregate(self, nid, xs, batch):
        lay = self.layout
        agg = lay.aggregation(nid)
        if not xs:
            return torch.zeros(batch, lay.agg_size[nid], device=self.device,
                               dtype=self.dtype)
        if agg in ("sum", "gated_sum"):
            return sum(xs[1:], xs[0])
        if agg == "mean":
            return sum(xs[1:], xs[0]) / len(xs)
        if agg == "max":
            return torch.stack(xs).max(dim=0).values
        if agg in ("concat", "matrix_product"):
            # matrix_product stacks to [B, J, D] and flattens: the concatenation.
            return torch.cat(xs, dim=1)
        stacked = torch.stack(xs, dim=1)  # [B, J, D]
        if agg in ("attention", "multi_head_attention", "attn_pool"):
            q = getattr(self, f"q_{nid}")
            rows = q.reshape(-1, q.shape[-1])
            scale = math.sqrt(rows.shape[1]) * lay.temperature(nid)
            heads = []
            for h in range(rows.shape[0]):
                w = torch.softmax(stacked @ rows[h] / scale, dim=1)
                heads.append((w.unsqueeze(-1) * stacked).sum(dim=1))
            return torch.cat(heads, dim=1)
        if agg == "topk_weighted_sum":
            scores = stacked.mean(dim=2)
        else:  # moe: one learned router logit per incoming edge, shared by the batch
            key = [lay.edge_key(e) for e in lay.in_edges[nid]]
            logits = torch.stack([getattr(self, f"router_{k}") for k in key])
            scores = logits.unsqueeze(0).expand(batch, -1)
        k = lay.top_k(nid, len(xs))
        if k is not None:
            # A stable sort: equal scores (moe's routers all start at 0) select the
            # earlier incoming edge, whatever torch.topk's order of ties.
            scores, idx = torch.sort(scores, dim=1, descending=True, stable=True)
            scores, idx = scores[:, :k], idx[:, :k]
            stacked = torch.gather(stacked, 1,
                                   idx.unsqueeze(-1).expand(-1, -1, stacked.shape[2]))
        w = torch.softmax(scores, dim=1)
        return (w.unsqueeze(-1) * stacked).sum(dim=1)

    def _activate(self, nid, z):
        act = self.graph.nodes[nid].activation_function
        cells = self.state_manager.cells
        if act == "lstm":
            zero = torch.zeros_like(z)
            h, c = getattr(self, f"lstm_{nid}")(z, cells.get(nid, (zero, zero)))
            cells[nid] = (h, c)
            return h
        if act == "gru":
            h = getattr(self, f"gru_{nid}")(z, cells.get(nid, torch.zeros_like(z)))
            cells[nid] = h
            return h
        return getattr(self, f"act_{nid}")(z)


def _activation(nn, name):
    table = {"relu": nn.ReLU, "sigmoid": nn.Sigmoid, "tanh": nn.Tanh,
             "softmax": lambda: nn.Softmax(dim=1), "leaky_relu": nn.LeakyReLU, "elu": nn.ELU,
             "gelu": nn.GELU, "linear": nn.Identity}
    return table[name]()
