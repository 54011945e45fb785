"""The PyTorch translation of architecture graphs, behaviour by behaviour (the
"Translation to PyTorch" design): expected values are computed here with plain torch
ops from the model's own parameters."""

import hashlib
import math
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from geon.errors import GeonError
from geon.frontends.netgraph import Graph, NodeType, to_geon

INPUT, HIDDEN, OUTPUT = NodeType.INPUT, NodeType.HIDDEN, NodeType.OUTPUT


def node(g, kind, size, act="linear", bias=0.0, **attrs):
    return g.add_node({"node_type": kind, "activation_function": act, "bias": bias,
                       "attributes": {"output_size": size, **attrs}})


torch = pytest.importorskip("torch", reason="the PyTorch translator needs torch")
from geon.frontends.netgraph import (clear_translation_cache,  # noqa: E402
                                     get_translation_cache_metrics,
                                     set_translation_cache_enabled, to_pytorch_model)


@pytest.fixture(autouse=True)
def fresh_cache():
    clear_translation_cache()
    set_translation_cache_enabled(True)
    yield
    clear_translation_cache()
    set_translation_cache_enabled(True)


def test_device_dtype_and_execution_order():
    g = Graph()
    x = node(g, INPUT, 2)
    o = node(g, OUTPUT, 2)
    h = node(g, HIDDEN, 3, act="relu")
    g.add_edge(x, h)
    g.add_edge(h, o)
    m = to_pytorch_model(g, {"dtype": torch.float64, "device": "cpu"})
    assert all(p.dtype == torch.float64 and p.device.type == "cpu" for p in m.parameters())
    assert m.execution_order == [x, h, o] == g.topological_sort(ignore_recurrent=True)
    assert m(torch.zeros(5, 2, dtype=torch.float64)).dtype == torch.float64
    assert next(to_pytorch_model(g, {}).parameters()).dtype == torch.float32


def test_input_width_is_checked_and_split_in_input_order():
    g = Graph()
    a = node(g, INPUT, 2)
    ob = node(g, OUTPUT, 1)
    b = node(g, INPUT, 1)
    oa = node(g, OUTPUT, 2)
    g.add_edge(b, ob, {"weight": 10.0})
    g.add_edge(a, oa, {"weight": 1.0})
    m = to_pytorch_model(g, {"dtype": torch.float64})
    assert m.input_width == 3
    for bad in (torch.zeros(4, 2), torch.zeros(4, 4), torch.zeros(4)):
        with pytest.raises(ValueError, match=r"expected \[batch, 3\]") as err:
            m(bad)
        assert isinstance(err.value, GeonError)
    x = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64)
    # a takes x[:, :2], b takes x[:, 2:]; outputs in output_node_ids order: ob, oa.
    assert m(x).tolist() == [[30.0, 1.0, 2.0]]


def test_parameter_names_simple_and_multigraph():
    for multi in (False, True):
        g = Graph({"multigraph": multi})
        x = node(g, INPUT, 2)
        h = node(g, HIDDEN, 3, act="lstm", aggregation="attention")
        gs = node(g, HIDDEN, 3, aggregation="gated_sum")
        moe = node(g, HIDDEN, 3, aggregation="moe")
        o = node(g, OUTPUT, 3, act="gru", aggregation="concat")
        e = [g.add_edge(x, h), g.add_edge(x, h), g.add_edge(h, gs), g.add_edge(h, moe),
             g.add_edge(gs, o), g.add_edge(moe, o), g.add_edge(x, o, {"enabled": False}),
             g.add_edge(o, h, {"attributes": {"is_recurrent": True}})]
        names = set(to_pytorch_model(g, {}).state_dict())
        if multi:
            ek = [str(i) for i in e]
        else:
            assert e[1] is None
            ek = ["0_1", None, "1_2", "1_3", "2_4", "3_4", "0_4", "4_1"]
        want = {"bias_1", "bias_2", "bias_3", "bias_4", "q_1",
                "lstm_1.weight_ih", "lstm_1.weight_hh", "gru_4.weight_ih", "gru_4.weight_hh",
                f"proj_{ek[0]}.weight", f"gate_{ek[2]}", f"router_{ek[3]}", "post_4.weight"}
        want |= {f"weight_{k}" for i, k in enumerate(ek) if k is not None and i != 6}
        if multi:
            want |= {f"proj_{ek[1]}.weight"}
        assert names == want, (multi, names ^ want)


def test_projections_and_post_layers_exactly_when_sizes_differ():
    """Every incoming edge is projected to the target's edge width (its output_size, or
    head_dim for attention); post_ maps the aggregated width to output_size."""
    g = Graph()
    x = node(g, INPUT, 3)
    same = node(g, HIDDEN, 3)
    wider = node(g, HIDDEN, 5)
    cat = node(g, OUTPUT, 8, aggregation="concat")  # 8 + 8 wide: post
    cat1 = node(g, OUTPUT, 3, aggregation="concat")  # one 3-wide input: no post
    cat2 = node(g, OUTPUT, 3, aggregation="concat")  # 3 + 3 wide: post
    att = node(g, OUTPUT, 3, aggregation="attention", head_dim=3)  # no proj, no post
    for a, b in [(x, same), (x, wider), (same, cat), (wider, cat), (x, cat1), (x, cat2),
                 (same, cat2), (x, att), (same, att)]:
        g.add_edge(a, b)
    m = to_pytorch_model(g, {})
    mods = {k: tuple(v.weight.shape) for k, v in m.named_children()
            if k.startswith(("proj", "post"))}
    assert mods == {"proj_0_2": (5, 3), "proj_1_3": (8, 3), "proj_2_3": (8, 5),
                    "post_3": (8, 16), "post_5": (3, 6)}
    assert m(torch.randn(2, 3)).shape == (2, 8 + 3 + 3 + 3)


def _reference_activation(name, z, m, nid):
    f = {"relu": lambda v: torch.clamp(v, min=0), "sigmoid": lambda v: 1 / (1 + torch.exp(-v)),
         "tanh": lambda v: (torch.exp(2 * v) - 1) / (torch.exp(2 * v) + 1),
         "softmax": lambda v: torch.exp(v) / torch.exp(v).sum(1, keepdim=True),
         "leaky_relu": lambda v: torch.where(v > 0, v, 0.01 * v),
         "elu": lambda v: torch.where(v > 0, v, torch.exp(v) - 1),
         "gelu": lambda v: 0.5 * v * (1 + torch.erf(v / math.sqrt(2))),
         "linear": lambda v: v}
    if name in f:
        return f[name](z)
    sd = m.state_dict()
    wi, wh = sd[f"{name}_{nid}.weight_ih"], sd[f"{name}_{nid}.weight_hh"]
    h = torch.zeros_like(z)
    gi, gh = z @ wi.T, h @ wh.T
    if name == "lstm":
        i, f_, g, o = (gi + gh).chunk(4, dim=1)
        c = torch.sigmoid(f_) * 0 + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(c)
    r, u = torch.sigmoid(gi[:, :3] + gh[:, :3]), torch.sigmoid(gi[:, 3:6] + gh[:, 3:6])
    n = torch.tanh(gi[:, 6:] + r * gh[:, 6:])
    return (1 - u) * n + u * h


@pytest.mark.parametrize("act", ["relu", "sigmoid", "tanh", "softmax", "leaky_relu", "elu",
                                 "gelu", "lstm", "gru", "linear"])
def test_activations(act):
    g = Graph()
    x = node(g, INPUT, 3)
    o = node(g, OUTPUT, 3, act=act, bias=0.25)
    g.add_edge(x, o, {"weight": -1.5})
    torch.manual_seed(1)
    m = to_pytorch_model(g, {"dtype": torch.float64})
    inp = torch.randn(4, 3, dtype=torch.float64)
    z = inp * -1.5 + 0.25
    want = _reference_activation(act, z, m, o)
    with torch.no_grad():
        got = m(inp)
    assert got.shape == (4, 3)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12, atol=1e-14)
    layer = dict(m.named_children())[f"{act}_1" if act in ("lstm", "gru") else "act_1"]
    kind = {"lstm": torch.nn.LSTMCell, "gru": torch.nn.GRUCell, "linear": torch.nn.Identity}
    assert isinstance(layer, kind.get(act, torch.nn.Module))
    if act == "softmax":
        assert layer.dim == 1


def test_unknown_activation_is_a_value_error_at_construction():
    g = Graph()
    x = node(g, INPUT, 1)
    g.add_edge(x, node(g, OUTPUT, 1, act="swish"))
    for translate in (lambda: to_pytorch_model(g, {}), lambda: to_geon(g, 2)):
        with pytest.raises(ValueError, match="Unknown activation 'swish'") as err:
            translate()
        assert isinstance(err.value, GeonError)
    g.nodes[1].activation_function = "relu"
    g.nodes[1].attributes["aggregation"] = "median"
    with pytest.raises(ValueError, match="Unknown aggregation 'median'"):
        to_pytorch_model(g, {})


def test_node_without_enabled_inputs_aggregates_zeros():
    g = Graph()
    x = node(g, INPUT, 2)
    o = node(g, OUTPUT, 3, act="tanh", bias=0.5, aggregation="multi_head_attention",
             num_heads=2)
    g.add_edge(x, o, {"enabled": False})
    m = to_pytorch_model(g, {"dtype": torch.float64})
    assert set(m.state_dict()) == {"bias_1", "q_1", "post_1.weight"}
    out = m(torch.randn(4, 2, dtype=torch.float64))
    # zero aggregate + bias, through torch's own tanh (it may differ from math.tanh by
    # an ulp, depending on the CPU's vector kernels)
    expected = torch.tanh(torch.full((4, 3), 0.5, dtype=torch.float64))
    assert torch.equal(out, expected)


AGGS = {"sum": {}, "mean": {}, "max": {}, "concat": {}, "matrix_product": {},
        "attention": {"temperature": 0.7}, "multi_head_attention": {"num_heads": 2},
        "topk_weighted_sum": {"top_k": 2}, "moe": {}, "attn_pool": {"pool_heads": 2,
                                                                     "temperature": 9.0},
        "gated_sum": {}}


def _aggregation_model(agg, attrs, **more):
    """Three inputs (widths 2, 3, 3) into an OUTPUT node of width 3."""
    g = Graph()
    ins = [node(g, INPUT, s) for s in (2, 3, 3)]
    o = node(g, OUTPUT, 3, bias=0.5, aggregation=agg, **attrs, **more)
    for i, w in zip(ins, (0.5, -1.0, 2.0)):
        g.add_edge(i, o, {"weight": w})
    torch.manual_seed(3)
    m = to_pytorch_model(g, {"dtype": torch.float64})
    with torch.no_grad():  # non-trivial queries, gates and routers
        for name, p in m.named_parameters():
            if name.startswith(("q_", "gate_", "router_")):
                p.copy_(torch.randn_like(p))
    return m


def _weighted_inputs(m, x):
    sd = m.state_dict()
    xa, xb, xc = x[:, :2], x[:, 2:5], x[:, 5:]
    return [xa @ sd["proj_0_3.weight"].T * 0.5, xb * -1.0, xc * 2.0]


def _softmax_sum(scores, vs):
    w = torch.exp(scores) / torch.exp(scores).sum(1, keepdim=True)
    return sum(w[:, j:j + 1] * v for j, v in enumerate(vs))


@pytest.mark.parametrize("agg", sorted(AGGS))
def test_aggregations(agg):
    m = _aggregation_model(agg, AGGS[agg])
    sd = m.state_dict()
    x = torch.randn(5, 8, dtype=torch.float64)
    vs = _weighted_inputs(m, x)
    if agg == "sum":
        a = vs[0] + vs[1] + vs[2]
    elif agg == "mean":
        a = (vs[0] + vs[1] + vs[2]) / 3
    elif agg == "max":
        a = torch.maximum(torch.maximum(vs[0], vs[1]), vs[2])
    elif agg in ("concat", "matrix_product"):
        a = torch.cat(vs, dim=1)
        assert tuple(sd["post_3.weight"].shape) == (3, 9)
    elif agg == "attention":
        q = sd["q_3"]
        assert tuple(q.shape) == (3,)
        a = _softmax_sum(torch.stack([v @ q for v in vs], 1) / (math.sqrt(3) * 0.7), vs)
    elif agg in ("multi_head_attention", "attn_pool"):
        q = sd["q_3"]
        assert tuple(q.shape) == (2, 3)
        temp = 1.0 if agg == "attn_pool" else AGGS[agg].get("temperature", 1.0)
        a = torch.cat([_softmax_sum(torch.stack([v @ q[h] for v in vs], 1)
                                    / (math.sqrt(3) * temp), vs) for h in range(2)], 1)
        assert tuple(sd["post_3.weight"].shape) == (3, 6)
    elif agg == "topk_weighted_sum":
        scores = torch.stack([v.mean(1) for v in vs], 1)
        a = torch.zeros_like(vs[0])
        for b in range(x.shape[0]):
            top = sorted(range(3), key=lambda j: -scores[b, j])[:2]
            w = torch.softmax(scores[b, top], 0)
            a[b] = sum(w[i] * vs[j][b] for i, j in enumerate(top))
    elif agg == "moe":
        r = torch.stack([sd["router_0_3"], sd["router_1_3"], sd["router_2_3"]])
        a = _softmax_sum(r.expand(x.shape[0], 3), vs)
    elif agg == "gated_sum":
        a = sum(torch.sigmoid(sd[f"gate_{i}_3"]) * v for i, v in enumerate(vs))
    if "post_3.weight" in sd:
        a = a @ sd["post_3.weight"].T
    with torch.no_grad():
        got = m(x)
    assert got.shape == (5, 3)
    np.testing.assert_allclose(got.numpy(), (a + 0.5).numpy(), rtol=1e-12, atol=1e-13)


def test_topk_weighted_sum_without_top_k_and_moe_top_k_routing():
    x = torch.randn(4, 8, dtype=torch.float64)
    m = _aggregation_model("topk_weighted_sum", {})
    vs = _weighted_inputs(m, x)
    want = _softmax_sum(torch.stack([v.mean(1) for v in vs], 1), vs) + 0.5
    np.testing.assert_allclose(m(x).detach().numpy(), want.numpy(), rtol=1e-12)
    m = _aggregation_model("moe", {"router_type": "topk", "top_k": 1})
    sd = m.state_dict()
    best = int(torch.argmax(torch.stack([sd[f"router_{i}_3"] for i in range(3)])))
    vs = _weighted_inputs(m, x)
    np.testing.assert_allclose(m(x).detach().numpy(), (vs[best] + 0.5).numpy(), rtol=1e-12)


def test_head_dim_sets_the_edge_width():
    m = _aggregation_model("multi_head_attention", {"num_heads": 3}, head_dim=4)
    sd = m.state_dict()
    assert tuple(sd["q_3"].shape) == (3, 4)
    assert {k for k in sd if k.startswith("proj")} == {f"proj_{i}_3.weight" for i in range(3)}
    assert tuple(sd["post_3.weight"].shape) == (3, 12)
    assert m(torch.randn(2, 8, dtype=torch.float64)).shape == (2, 3)


def _recurrent_model():
    """h = tanh(w_in x + w_rec h_prev + b); out = 2 h (an Elman cell on scalars)."""
    g = Graph()
    x = node(g, INPUT, 1)
    h = node(g, HIDDEN, 1, act="tanh", bias=0.1)
    o = node(g, OUTPUT, 1)
    g.add_edge(x, h, {"weight": 0.8})
    g.add_edge(h, h, {"weight": 0.5, "attributes": {"is_recurrent": True}})
    g.add_edge(h, o, {"weight": 2.0})
    return to_pytorch_model(g, {"dtype": torch.float64})


def test_recurrent_edges_over_several_steps():
    m = _recurrent_model()
    xs = torch.randn(4, 3, 1, dtype=torch.float64)
    hp = torch.zeros(3, 1, dtype=torch.float64)
    for t in range(4):
        hp = torch.tanh(0.8 * xs[t] + 0.5 * hp + 0.1)
        np.testing.assert_allclose(m(xs[t]).detach().numpy(), (2 * hp).numpy(), rtol=1e-13)
    # reset_states starts again from zeros; without it the state carries on.
    first = torch.tanh(0.8 * xs[0] + 0.1)
    np.testing.assert_allclose(m(xs[0], reset_states=True).detach().numpy(),
                               (2 * first).numpy(), rtol=1e-13)
    second = torch.tanh(0.8 * xs[0] + 0.5 * first + 0.1)
    np.testing.assert_allclose(m(xs[0]).detach().numpy(), (2 * second).numpy(), rtol=1e-13)
    # Another batch size cannot continue the old state: it starts from zeros.
    np.testing.assert_allclose(m(xs[0][:2]).detach().numpy(), (2 * first[:2]).numpy(),
                               rtol=1e-13)


def test_lstm_state_carries_over_calls():
    g = Graph()
    x = node(g, INPUT, 2)
    o = node(g, OUTPUT, 2, act="lstm")
    g.add_edge(x, o)
    torch.manual_seed(0)
    m = to_pytorch_model(g, {"dtype": torch.float64})
    cell = torch.nn.LSTMCell(2, 2, bias=False).double()
    cell.load_state_dict({k.split(".")[1]: v for k, v in m.state_dict().items()
                          if k.startswith("lstm")})
    xs = torch.randn(3, 4, 2, dtype=torch.float64)
    state = None
    for t in range(3):
        state = cell(xs[t], state)
        np.testing.assert_allclose(m(xs[t]).detach().numpy(), state[0].detach().numpy(),
                                   rtol=1e-13)
    np.testing.assert_allclose(m(xs[0], reset_states=True).detach().numpy(),
                               cell(xs[0])[0].detach().numpy(), rtol=1e-13)


def _cached_graph(uuid="d-1"):
    g = Graph()
    x = node(g, INPUT, 2)
    o = node(g, OUTPUT, 2, bias=0.3, aggregation="concat", derivation_uuid=uuid)
    h = node(g, HIDDEN, 2, act="tanh")
    g.add_edge(x, o)
    g.add_edge(x, h)
    g.add_edge(h, o)
    g.add_edge(x, node(g, OUTPUT, 1))  # no uuid: never looked up
    return g


def test_translation_cache_metrics_and_reuse():
    m1 = to_pytorch_model(_cached_graph(), {})
    assert get_translation_cache_metrics() == {"hits": 0, "misses": 2, "entries": 2}
    m2 = to_pytorch_model(_cached_graph(), {})
    assert get_translation_cache_metrics() == {"hits": 2, "misses": 2, "entries": 2}
    assert m2.bias_1 is m1.bias_1 and m2.post_1 is m1.post_1
    to_pytorch_model(_cached_graph("d-2"), {})
    assert get_translation_cache_metrics() == {"hits": 2, "misses": 4, "entries": 4}
    to_pytorch_model(_cached_graph(), {"enable_translation_cache": False})
    set_translation_cache_enabled(False)
    m3 = to_pytorch_model(_cached_graph(), {})
    assert m3.post_1 is not m1.post_1
    assert get_translation_cache_metrics()["hits"] == 2
    to_pytorch_model(_cached_graph(), {"enable_translation_cache": True})
    assert get_translation_cache_metrics()["hits"] == 4
    clear_translation_cache()
    assert get_translation_cache_metrics() == {"hits": 0, "misses": 0, "entries": 0}


def test_cache_toggle_does_not_change_outputs():
    x = torch.randn(3, 2)
    outs = []
    for enabled in (True, False):
        clear_translation_cache()
        set_translation_cache_enabled(enabled)
        torch.manual_seed(7)
        first = to_pytorch_model(_cached_graph(), {})
        second = to_pytorch_model(_cached_graph(), {})  # a hit when enabled
        third = to_pytorch_model(_cached_graph("other"), {})
        outs.append([first(x), second(x), third(x)])
    for a, b in zip(*outs):
        assert torch.equal(a, b)


DETERMINISM = textwrap.dedent("""
    import hashlib, torch
    from geon.frontends.netgraph import Graph, NodeType, to_pytorch_model
    def build():
        g = Graph({"multigraph": True})
        x = g.add_node({"node_type": NodeType.INPUT, "attributes": {"output_size": 3}})
        h = g.add_node({"activation_function": "gru", "attributes": {
            "output_size": 4, "aggregation": "multi_head_attention", "num_heads": 2}})
        o = g.add_node({"node_type": NodeType.OUTPUT, "activation_function": "tanh",
                        "attributes": {"output_size": 2, "aggregation": "concat"}})
        g.add_edge(x, h); g.add_edge(x, h); g.add_edge(h, o)
        g.add_edge(o, h, {"attributes": {"is_recurrent": True}})
        return g
    torch.manual_seed(11)
    m = to_pytorch_model(build(), {"dtype": torch.float64})
    x = torch.linspace(-1, 1, 12, dtype=torch.float64).reshape(4, 3)
    digest = hashlib.sha256()
    for k, v in m.state_dict().items():
        digest.update(k.encode()); digest.update(v.numpy().tobytes())
    digest.update(m(x).detach().numpy().tobytes()); digest.update(m(x).detach().numpy().tobytes())
    print(digest.hexdigest())
""")


def test_determinism_in_one_and_two_processes():
    runs = [subprocess.run([sys.executable, "-c", DETERMINISM], capture_output=True,
                           text=True) for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr
    ns = {}
    exec(DETERMINISM.replace("print(digest.hexdigest())", "result = digest.hexdigest()"), ns)
    first = ns["result"]
    exec(DETERMINISM.replace("print(digest.hexdigest())", "result = digest.hexdigest()"), ns)
    assert first == ns["result"] == runs[0].stdout.strip() == runs[1].stdout.strip()
    assert len(first) == 64 and hashlib.sha256().hexdigest() != first


def test_top_k_ties_select_the_earlier_edge():
    """A fresh moe node's routers are all 0: top-1 routing takes the first edge."""
    g = Graph()
    ins = [node(g, INPUT, 2) for _ in range(4)]
    o = node(g, OUTPUT, 2, aggregation="moe", router_type="topk", top_k=1)
    for i in reversed(ins[1:]):
        g.add_edge(i, o)
    g.add_edge(ins[0], o)
    m = to_pytorch_model(g, {"dtype": torch.float64})
    x = torch.randn(3, 8, dtype=torch.float64)
    assert torch.equal(m(x), x[:, 6:8])  # edge 0 comes from ins[3]


def test_graph_without_outputs():
    g = Graph()
    x = node(g, INPUT, 2)
    g.add_edge(x, node(g, HIDDEN, 2))
    assert to_pytorch_model(g, {})(torch.zeros(3, 2)).shape == (3, 0)
    with pytest.raises(GeonError, match="no OUTPUT node"):
        to_geon(g, 3)
