"""The architecture-graph model (no torch needed): ids, defaults, simple graphs and
multigraphs, cycles, the topological order, validation, importing without torch."""

import subprocess
import sys
import textwrap

import pytest

from geon.frontends.netgraph import Graph, GraphError, NodeType

INPUT, HIDDEN, OUTPUT = NodeType.INPUT, NodeType.HIDDEN, NodeType.OUTPUT


def node(g, kind, size, act="linear", bias=0.0, **attrs):
    return g.add_node({"node_type": kind, "activation_function": act, "bias": bias,
                       "attributes": {"output_size": size, **attrs}})


# --- the graph model (no torch needed) -------------------------------------------------

def test_nodes_and_defaults():
    g = Graph()
    assert g.config["multigraph"] is False
    a = node(g, INPUT, 2)
    o = g.add_node({"node_type": OUTPUT, "attributes": {"output_size": 1}})
    b = node(g, INPUT, 3)
    h = node(g, HIDDEN, 4)
    assert [a, o, b, h] == [0, 1, 2, 3]
    assert g.input_node_ids == [a, b] and g.output_node_ids == [o]
    n = g.nodes[o]
    assert n.bias == 0.0 and n.attributes["aggregation"] == "sum"
    assert n.activation_function == "linear"
    e = g.add_edge(a, o)
    assert g.edges[e].enabled is True and g.edges[e].weight == 1.0
    assert g.edges[e].is_recurrent is False


def test_simple_graph_rejects_parallel_edges_multigraph_keeps_them():
    g = Graph()
    a, b = node(g, INPUT, 1), node(g, OUTPUT, 1)
    assert g.add_edge(a, b, {"weight": 2.0}) == 0
    assert g.add_edge(a, b, {"weight": 3.0}) is None
    assert [e.weight for e in g.find_edges(a, b)] == [2.0]
    m = Graph({"multigraph": True})
    a, b = node(m, INPUT, 1), node(m, OUTPUT, 1)
    ids = [m.add_edge(a, b, {"weight": w}) for w in (2.0, 3.0, 4.0)]
    assert ids == [0, 1, 2]
    assert [e.edge_id for e in m.find_edges(a, b)] == ids
    assert [e.edge_id for e in m.nodes[b].edges_in[a]] == ids
    with pytest.raises(GraphError, match="no node 7"):
        m.add_edge(a, 7)


def test_cycles_and_topological_sort():
    g = Graph()
    x = node(g, INPUT, 1)
    h2 = node(g, HIDDEN, 1)
    h1 = node(g, HIDDEN, 1)
    o = node(g, OUTPUT, 1)
    g.add_edge(x, h1)
    g.add_edge(h1, h2)
    g.add_edge(h2, o)
    g.add_edge(x, o)
    g.add_edge(o, h1, {"attributes": {"is_recurrent": True}})
    assert not g.detect_cycles()
    assert g.topological_sort() == [x, h1, h2, o]
    with pytest.raises(GraphError, match="cycle"):
        g.topological_sort(ignore_recurrent=False)
    g.add_edge(h2, h1)  # a non-recurrent loop h1 -> h2 -> h1
    assert g.detect_cycles()
    with pytest.raises(GraphError, match=r"\[1, 2, 3\]"):
        g.topological_sort()
    g.edges[5].enabled = False  # a disabled edge carries nothing
    assert not g.detect_cycles()


def test_topological_sort_is_iterative():
    g = Graph()
    prev = node(g, INPUT, 1)
    for _ in range(5000):
        nxt = node(g, HIDDEN, 1)
        g.add_edge(prev, nxt)
        prev = nxt
    assert g.topological_sort() == list(range(5001))


def test_validate_reports_each_problem():
    g = Graph()
    x = node(g, INPUT, 2)
    bad_act = node(g, HIDDEN, 2, act="swishy")
    bad_agg = node(g, HIDDEN, 2, aggregation="median")
    no_size = g.add_node({"node_type": OUTPUT, "attributes": {}})
    bad_heads = node(g, HIDDEN, 2, aggregation="multi_head_attention", num_heads=0)
    for n in (bad_act, bad_agg, no_size, bad_heads):
        g.add_edge(x, n)
    lonely = node(g, HIDDEN, 2)
    g.add_edge(bad_act, x)  # into an INPUT node
    problems = g.validate()
    assert any("unknown activation 'swishy'" in p for p in problems)
    assert any("unknown aggregation 'median'" in p for p in problems)
    assert any(f"node {no_size}: output_size None" in p for p in problems)
    assert any("num_heads 0" in p for p in problems)
    assert any(f"node {lonely}: no enabled incoming edge" in p for p in problems)
    assert any("dangling" in p and "INPUT node 0" in p for p in problems)
    g.edges[99] = type(g.edges[0])(99, x, 42, 1.0, True, {})
    assert any("edge 99: dangling" in p for p in g.validate())
    ok = Graph()
    a = node(ok, INPUT, 2)
    ok.add_edge(a, node(ok, OUTPUT, 1))
    assert ok.validate() == []


def test_import_without_torch():
    """The graph model imports without torch; the translator names the install."""
    code = textwrap.dedent("""
        import sys
        sys.modules["torch"] = None  # import torch raises ImportError
        import geon
        from geon.frontends.netgraph import Graph, NodeType, to_pytorch_model
        g = Graph()
        g.add_node({"node_type": NodeType.INPUT, "attributes": {"output_size": 1}})
        try:
            to_pytorch_model(g, {})
        except ImportError as e:
            print(isinstance(e, geon.GeonError), e)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("True ") and "pip install torch==2.13.0" in out.stdout
