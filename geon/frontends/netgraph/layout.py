"""What both translators agree on before building anything: the execution order, each
node's sizes, the enabled incoming edges in their order, and the names of the
parameters. Keeping it in one place keeps the PyTorch and the geon translation alike.
"""

from geon.frontends.netgraph.graph import ACTIVATIONS, AGGREGATIONS, GraphError, NodeType

#: Aggregations whose incoming edges are projected to ``head_dim``.
ATTENTION_LIKE = ("attention", "multi_head_attention", "attn_pool")


class Layout:
    """The translation plan of a graph. Raises :class:`GraphError` (a ``ValueError``)
    for an unknown activation or aggregation of a non-INPUT node, a node without a
    positive ``output_size``, or a cycle of non-recurrent edges."""

    def __init__(self, graph):
        self.graph = graph
        self.multigraph = graph.multigraph
        self.order = graph.topological_sort(ignore_recurrent=True)
        self.size, self.edge_size, self.agg_size, self.in_edges = {}, {}, {}, {}
        for nid, node in graph.nodes.items():
            size = node.attributes.get("output_size")
            if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
                raise GraphError(f"node {nid}: output_size {size!r} must be a positive int")
            self.size[nid] = size
        for nid, node in graph.nodes.items():
            if node.node_type is NodeType.INPUT:
                continue
            if node.activation_function not in ACTIVATIONS:
                raise GraphError(f"Unknown activation {node.activation_function!r} of node "
                                 f"{nid} (known: {', '.join(ACTIVATIONS)})")
            agg = self.aggregation(nid)
            if agg not in AGGREGATIONS:
                raise GraphError(f"Unknown aggregation {agg!r} of node {nid} "
                                 f"(known: {', '.join(AGGREGATIONS)})")
            edges = graph.in_edges(nid)
            self.in_edges[nid] = edges
            d = self.size[nid]
            if agg in ATTENTION_LIKE:
                d = int(node.attributes.get("head_dim") or d)
            self.edge_size[nid] = d
            if agg in ("concat", "matrix_product"):
                self.agg_size[nid] = d * len(edges) if edges else d
            elif agg in ("multi_head_attention", "attn_pool"):
                self.agg_size[nid] = self.heads(nid) * d
            else:
                self.agg_size[nid] = d
        self.input_sizes = [self.size[i] for i in graph.input_node_ids]
        #: Nodes whose previous output a recurrent edge reads.
        self.recurrent_sources = sorted({e.source_id for edges in self.in_edges.values()
                                         for e in edges if e.is_recurrent})

    def aggregation(self, nid):
        """The node's aggregation name."""
        return self.graph.nodes[nid].attributes.get("aggregation", "sum")

    def heads(self, nid):
        """The number of query rows: ``num_heads`` (multi-head attention), ``pool_heads``
        (attention pooling), else 1."""
        attrs = self.graph.nodes[nid].attributes
        agg = self.aggregation(nid)
        if agg == "multi_head_attention":
            return int(attrs.get("num_heads") or 1)
        if agg == "attn_pool":
            return int(attrs.get("pool_heads") or 1)
        return 1

    def query_shape(self, nid):
        """The shape of ``q_{nid}``, or ``None`` when the aggregation has no query."""
        agg = self.aggregation(nid)
        if agg == "attention":
            return (self.edge_size[nid],)
        if agg in ("multi_head_attention", "attn_pool"):
            return (self.heads(nid), self.edge_size[nid])
        return None

    def edge_key(self, edge):
        """``"{edge_id}"`` in a multigraph, ``"{source}_{target}"`` in a simple graph."""
        return str(edge.edge_id) if self.multigraph else f"{edge.source_id}_{edge.target_id}"

    def needs_projection(self, edge):
        """Whether the edge's source width differs from its target's edge width."""
        return self.size[edge.source_id] != self.edge_size[edge.target_id]

    def needs_post(self, nid):
        """Whether the aggregated width differs from the node's ``output_size``."""
        return self.agg_size[nid] != self.size[nid]

    def edges(self):
        """The enabled edges into non-INPUT nodes, by increasing ``edge_id``."""
        return sorted((e for es in self.in_edges.values() for e in es),
                      key=lambda e: e.edge_id)

    def top_k(self, nid, n):
        """The clamped ``top_k`` for ``n`` candidates, or ``None`` (no selection)."""
        attrs = self.graph.nodes[nid].attributes
        agg = self.aggregation(nid)
        if agg == "topk_weighted_sum":
            k = attrs.get("top_k")
        elif agg == "moe" and attrs.get("router_type", "softmax") == "topk":
            k = attrs.get("top_k", 1)
        else:
            return None
        return None if k is None else max(1, min(int(k), n))

    def temperature(self, nid):
        """The attention temperature (``attn_pool`` has none: 1.0)."""
        if self.aggregation(nid) == "attn_pool":
            return 1.0
        return float(self.graph.nodes[nid].attributes.get("temperature", 1.0))
