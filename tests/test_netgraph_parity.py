"""Parity of the two translations of random architecture graphs: ``to_geon`` on the
NumPy transformer and ``to_pytorch_model`` compute the same outputs over several steps
(recurrent edges, LSTM / GRU states) and the same gradients, after the PyTorch model's
parameters are copied into the geon Variables."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import geon as be
from geon.frontends.netgraph import ACTIVATIONS, AGGREGATIONS, Graph, NodeType, to_geon

torch = pytest.importorskip("torch", reason="parity with PyTorch needs torch")
from geon.frontends.netgraph import to_pytorch_model  # noqa: E402

BATCH = 2


@st.composite
def graphs(draw):
    """A valid graph: INPUT nodes first, then HIDDEN / OUTPUT nodes whose forward edges
    come from earlier nodes; recurrent edges may go anywhere (self loops included)."""
    g = Graph({"multigraph": draw(st.booleans())})
    size = st.integers(1, 3)
    for _ in range(draw(st.integers(1, 2))):
        g.add_node({"node_type": NodeType.INPUT, "attributes": {"output_size": draw(size)}})
    kinds = draw(st.lists(st.sampled_from([NodeType.HIDDEN, NodeType.OUTPUT]),
                          min_size=1, max_size=4))
    if NodeType.OUTPUT not in kinds:
        kinds[-1] = NodeType.OUTPUT
    weight = st.floats(-1.5, 1.5, allow_nan=False)
    for kind in kinds:
        agg = draw(st.sampled_from(AGGREGATIONS))
        attrs = {"output_size": draw(size), "aggregation": agg}
        if agg in ("attention", "multi_head_attention") and draw(st.booleans()):
            attrs["temperature"] = draw(st.floats(0.5, 2.0))
        if agg in ("attention", "multi_head_attention", "attn_pool") and draw(st.booleans()):
            attrs["head_dim"] = draw(size)
        if agg == "multi_head_attention":
            attrs["num_heads"] = draw(st.integers(1, 2))
        if agg == "attn_pool":
            attrs["pool_heads"] = draw(st.integers(1, 2))
        if agg == "topk_weighted_sum" and draw(st.booleans()):
            attrs["top_k"] = draw(st.integers(1, 3))
        if agg == "moe" and draw(st.booleans()):
            attrs.update(router_type="topk", top_k=draw(st.integers(1, 3)))
        nid = g.add_node({"node_type": kind, "activation_function":
                          draw(st.sampled_from(ACTIVATIONS)), "bias": draw(weight),
                          "attributes": attrs})
        sources = draw(st.lists(st.integers(0, nid - 1), min_size=1, max_size=3))
        for s in sources:
            g.add_edge(s, nid, {"weight": draw(weight)})
        if draw(st.booleans()):
            g.add_edge(draw(st.integers(0, nid - 1)), nid, {"enabled": False})
    non_input = [n for n in g.nodes if n not in g.input_node_ids]
    for _ in range(draw(st.integers(0, 2))):
        g.add_edge(draw(st.sampled_from(non_input)), draw(st.sampled_from(non_input)),
                   {"weight": draw(weight), "attributes": {"is_recurrent": True}})
    assert g.validate() == []
    return g


def _check(graph, steps, seed):
    torch.manual_seed(seed)
    model = to_pytorch_model(graph, {"dtype": torch.float64})
    with torch.no_grad():  # move zero gates / routers and tiny queries off their start
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal((BATCH, model.input_width)) for _ in range(steps)]
    net = to_geon(graph, BATCH, steps=steps, dtype=np.float64)
    rs = [rng.standard_normal(o.axes.shape) for o in net.outputs]
    names = list(net.params)

    outs = [model(torch.from_numpy(x), reset_states=(t == 0)) for t, x in enumerate(xs)]
    loss = sum((o * torch.from_numpy(r)).sum() for o, r in zip(outs, rs))
    params = dict(model.named_parameters())
    grads = torch.autograd.grad(loss, [params[n] for n in names], allow_unused=True)

    t = be.make_transformer("numpy")
    cost = None
    for o, r in zip(net.outputs, rs):
        term = be.sum(o * be.constant(r, axes=o.axes), reduction_axes=o.axes)
        cost = term if cost is None else cost + term
    dparams = be.deriv(cost, [net.params[n] for n in names])
    stepper = net.stepper(t)
    comp = t.computation(dparams, *net.inputs, *net.state_in.values())
    net.load_state_dict(t, model.state_dict())
    got = stepper(*xs)
    got = [got] if steps == 1 else got
    for g_out, t_out in zip(got, outs):
        np.testing.assert_allclose(g_out, t_out.detach().numpy(), rtol=1e-5, atol=1e-9)
    zero = net.zero_state()
    dgot = comp(*xs, *[zero[k] for k in net.state_in])
    dgot = dgot if isinstance(dgot, (list, tuple)) else [dgot]
    for name, dg, dt in zip(names, dgot, grads):
        want = np.zeros_like(dg) if dt is None else dt.numpy()
        np.testing.assert_allclose(dg, want, rtol=1e-4, atol=1e-8, err_msg=name)


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(graph=graphs(), steps=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_geon_and_pytorch_translations_agree(graph, steps, seed):
    _check(graph, steps, seed)
