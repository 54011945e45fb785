"""The architecture-graph model: nodes with an activation, a bias and attributes, joined
by weighted edges (optionally recurrent, optionally parallel in a multigraph).

Node and edge ids are integers handed out in insertion order (nodes and edges count
separately). Everything here is plain Python: no tensor library is needed.
"""

import enum
import heapq
import numbers
from typing import Any, Mapping, Optional

from geon.errors import GeonError

#: Activation functions the translators implement.
ACTIVATIONS = ("relu", "sigmoid", "tanh", "softmax", "leaky_relu", "elu", "gelu", "lstm",
               "gru", "linear")
#: Aggregations of a node's incoming values.
AGGREGATIONS = ("sum", "mean", "max", "concat", "matrix_product", "attention",
                "multi_head_attention", "topk_weighted_sum", "moe", "attn_pool",
                "gated_sum")


class GraphError(GeonError, ValueError):
    """A malformed architecture graph (unknown node, cycle without recurrent edge, ...)."""


class NodeType(enum.Enum):
    """The role of a node: INPUT nodes receive the model's input, OUTPUT nodes form its
    output, HIDDEN nodes are everything in between."""

    INPUT = "input"
    HIDDEN = "hidden"
    OUTPUT = "output"


class Node:
    """A node of a :class:`Graph` (see :meth:`Graph.add_node` for the properties).

    ``edges_in`` / ``edges_out`` map the node at the other end to the edge (a simple
    graph) or to the list of edges, by increasing ``edge_id`` (a multigraph)."""

    def __init__(self, node_id: int, node_type: "NodeType", activation_function: str, bias: float,
                 attributes: dict[str, Any]) -> None:
        self.node_id = node_id
        self.node_type = node_type
        self.activation_function = activation_function
        self.bias = bias
        self.attributes = attributes
        # the other end -> Edge (a simple graph) or list[Edge] (a multigraph)
        self.edges_in: dict[int, Any] = {}
        self.edges_out: dict[int, Any] = {}

    def __repr__(self):
        return (f"Node({self.node_id}, {self.node_type.name}, {self.activation_function!r}, "
                f"output_size={self.attributes.get('output_size')})")


class Edge:
    """A weighted connection ``source_id -> target_id`` (see :meth:`Graph.add_edge`)."""

    def __init__(self, edge_id: int, source_id: int, target_id: int, weight: float,
                 enabled: bool, attributes: dict[str, Any]) -> None:
        self.edge_id = edge_id
        self.source_id = source_id
        self.target_id = target_id
        self.weight = weight
        self.enabled = enabled
        self.attributes = attributes

    @property
    def is_recurrent(self) -> bool:
        """Whether the edge carries the source's output of the previous step."""
        return bool(self.attributes.get("is_recurrent", False))

    def __repr__(self):
        rec = ", recurrent" if self.is_recurrent else ""
        off = ", disabled" if not self.enabled else ""
        return f"Edge({self.edge_id}: {self.source_id} -> {self.target_id}{rec}{off})"


class Graph:
    """A neural-architecture graph.

    ``config["multigraph"]`` (default False) allows parallel edges between one pair of
    nodes; a simple graph refuses a second edge between the same (source, target).
    """

    def __init__(self, config: Optional[Mapping[str, Any]] = None) -> None:
        self.config: dict[str, Any] = {"multigraph": False, **(config or {})}
        self.nodes: dict[int, Node] = {}
        self.edges: dict[int, Edge] = {}
        self.input_node_ids: list[int] = []
        self.output_node_ids: list[int] = []
        self._next_node = 0
        self._next_edge = 0

    @property
    def multigraph(self) -> bool:
        """Whether parallel edges are allowed."""
        return bool(self.config.get("multigraph"))

    def add_node(self, properties: Mapping[str, Any]) -> int:
        """Add a node and return its id.

        ``properties``: ``node_type`` (a :class:`NodeType`, default HIDDEN),
        ``activation_function`` (default ``"linear"``), ``bias`` (default 0.0) and
        ``attributes``: ``output_size`` (required by the translators), ``aggregation``
        (default ``"sum"``) and the aggregation's own attributes (``num_heads``,
        ``head_dim``, ``temperature``, ``top_k``, ``pool_heads``, ``router_type``),
        plus ``derivation_uuid`` for the translation cache.
        """
        node_type = properties.get("node_type", NodeType.HIDDEN)
        if not isinstance(node_type, NodeType):
            raise GraphError(f"add_node: node_type {node_type!r} is not a NodeType")
        attributes = dict(properties.get("attributes") or {})
        attributes.setdefault("aggregation", "sum")
        node_id = self._next_node
        self._next_node += 1
        self.nodes[node_id] = Node(node_id, node_type,
                                   properties.get("activation_function", "linear"),
                                   float(properties.get("bias", 0.0)), attributes)
        if node_type is NodeType.INPUT:
            self.input_node_ids.append(node_id)
        elif node_type is NodeType.OUTPUT:
            self.output_node_ids.append(node_id)
        return node_id

    def add_edge(self, source_id: int, target_id: int,
                 properties: Optional[Mapping[str, Any]] = None) -> Optional[int]:
        """Add an edge and return its id, or ``None`` when a simple graph already has an
        edge from ``source_id`` to ``target_id``.

        ``properties``: ``weight`` (default 1.0), ``enabled`` (default True) and
        ``attributes`` (``is_recurrent``: the edge carries the previous step's output).
        """
        for nid in (source_id, target_id):
            if nid not in self.nodes:
                raise GraphError(f"add_edge: no node {nid!r} in the graph")
        src, dst = self.nodes[source_id], self.nodes[target_id]
        if not self.multigraph and target_id in src.edges_out:
            return None
        properties = properties or {}
        edge = Edge(self._next_edge, source_id, target_id,
                    float(properties.get("weight", 1.0)), bool(properties.get("enabled", True)),
                    dict(properties.get("attributes") or {}))
        self._next_edge += 1
        self.edges[edge.edge_id] = edge
        if self.multigraph:
            src.edges_out.setdefault(target_id, []).append(edge)
            dst.edges_in.setdefault(source_id, []).append(edge)
        else:
            src.edges_out[target_id] = edge
            dst.edges_in[source_id] = edge
        return edge.edge_id

    def find_edges(self, source_id: int, target_id: int) -> list[Edge]:
        """The edges ``source_id -> target_id`` by increasing id (at most one in a simple
        graph)."""
        found = self.nodes[source_id].edges_out.get(target_id)
        if found is None:
            return []
        return list(found) if self.multigraph else [found]

    def in_edges(self, node_id: int, enabled_only: bool = True) -> list[Edge]:
        """The edges into ``node_id``, by increasing ``edge_id`` (the translators' order
        for concatenation and stacking)."""
        return self._edges(self.nodes[node_id].edges_in, enabled_only)

    def out_edges(self, node_id: int, enabled_only: bool = True) -> list[Edge]:
        """The edges out of ``node_id``, by increasing ``edge_id``."""
        return self._edges(self.nodes[node_id].edges_out, enabled_only)

    def _edges(self, table: dict[int, Any], enabled_only: bool) -> list[Edge]:
        if self.multigraph:
            found = [e for lst in table.values() for e in lst]
        else:
            found = list(table.values())
        found.sort(key=lambda e: e.edge_id)
        return [e for e in found if e.enabled or not enabled_only]

    # --- structure ---------------------------------------------------------------------
    def _order(self, ignore_recurrent: bool) -> list[int]:
        """Kahn's algorithm over enabled edges, smallest ready node id first; returns the
        order (shorter than the graph when a cycle remains)."""
        indegree = {nid: 0 for nid in self.nodes}
        for nid in self.nodes:
            for e in self.in_edges(nid):
                if not (ignore_recurrent and e.is_recurrent) and e.source_id in self.nodes:
                    indegree[nid] += 1
        ready = [nid for nid, d in indegree.items() if d == 0]
        heapq.heapify(ready)
        order = []
        while ready:
            nid = heapq.heappop(ready)
            order.append(nid)
            for e in self.out_edges(nid):
                if (ignore_recurrent and e.is_recurrent) or e.target_id not in self.nodes:
                    continue
                indegree[e.target_id] -= 1
                if indegree[e.target_id] == 0:
                    heapq.heappush(ready, e.target_id)
        return order

    def detect_cycles(self) -> bool:
        """Whether the enabled, non-recurrent edges form a cycle (recurrent edges close
        loops legitimately: they read the previous step)."""
        return len(self._order(True)) != len(self.nodes)

    def topological_sort(self, ignore_recurrent: bool = True) -> list[int]:
        """The node ids in an order where every enabled edge (recurrent ones excepted when
        ``ignore_recurrent``) goes forward; ties go to the smaller node id, so the order
        is deterministic. Raises :class:`GraphError` naming the nodes left on a cycle."""
        order = self._order(ignore_recurrent)
        if len(order) != len(self.nodes):
            left = sorted(set(self.nodes) - set(order))
            raise GraphError(f"topological_sort: the nodes {left} lie on or after a cycle "
                             f"of enabled{' non-recurrent' if ignore_recurrent else ''} edges")
        return order

    def validate(self) -> list[str]:
        """A list of problems (empty when the graph is valid): unknown activations and
        aggregations, missing or non-positive ``output_size``, bad aggregation attributes,
        dangling edges (an endpoint that is not a node, an edge into an INPUT node),
        non-INPUT nodes without enabled incoming edges, and cycles of non-recurrent
        edges."""
        problems = []
        for nid, node in self.nodes.items():
            size = node.attributes.get("output_size")
            if not (isinstance(size, numbers.Integral) and not isinstance(size, bool)
                    and int(size) > 0):
                problems.append(f"node {nid}: output_size {size!r} must be a positive int")
            if node.node_type is NodeType.INPUT:
                continue
            if node.activation_function not in ACTIVATIONS:
                problems.append(f"node {nid}: unknown activation "
                                f"{node.activation_function!r}")
            agg = node.attributes.get("aggregation", "sum")
            if agg not in AGGREGATIONS:
                problems.append(f"node {nid}: unknown aggregation {agg!r}")
            for key in ("num_heads", "head_dim", "top_k", "pool_heads"):
                v = node.attributes.get(key)
                if v is not None and not (isinstance(v, numbers.Integral) and int(v) > 0):
                    problems.append(f"node {nid}: {key} {v!r} must be a positive int")
            t = node.attributes.get("temperature")
            if t is not None and not (isinstance(t, numbers.Real) and float(t) > 0):
                problems.append(f"node {nid}: temperature {t!r} must be positive")
            rt = node.attributes.get("router_type", "softmax")
            if rt not in ("softmax", "topk"):
                problems.append(f"node {nid}: router_type {rt!r} is not 'softmax' or 'topk'")
            if not self.in_edges(nid):
                problems.append(f"node {nid}: no enabled incoming edge")
        for e in self.edges.values():
            if e.source_id not in self.nodes or e.target_id not in self.nodes:
                problems.append(f"edge {e.edge_id}: dangling ({e.source_id} -> {e.target_id})")
            elif self.nodes[e.target_id].node_type is NodeType.INPUT:
                problems.append(f"edge {e.edge_id}: dangling, it ends at INPUT node "
                                f"{e.target_id}")
        if self.detect_cycles():
            problems.append("the enabled non-recurrent edges form a cycle")
        return problems
