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
    # One computation (one compile) for the unrolled outputs and the gradients.
    comp = t.computation(list(net.outputs) + dparams, *net.inputs, *net.state_in.values())
    net.load_state_dict(t, model.state_dict())
    zero = net.zero_state()
    res = comp(*xs, *[zero[k] for k in net.state_in])
    res = res if isinstance(res, (list, tuple)) else [res]
    for g_out, t_out in zip(res[:steps], outs):
        np.testing.assert_allclose(g_out, t_out.detach().numpy(), rtol=1e-5, atol=1e-9)
    for name, dg, dt in zip(names, res[steps:], grads):
        want = np.zeros_like(dg) if dt is None else dt.numpy()
        np.testing.assert_allclose(dg, want, rtol=1e-4, atol=1e-8, err_msg=name)


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(graph=graphs(), steps=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_geon_and_pytorch_translations_agree(graph, steps, seed):
    _check(graph, steps, seed)


def _every_kind(multigraph):
    """One graph with every aggregation and every activation, parallel edges (in a
    multigraph), projections, post layers, a disabled edge and recurrent edges."""
    g = Graph({"multigraph": multigraph})
    a = g.add_node({"node_type": NodeType.INPUT, "attributes": {"output_size": 2}})
    b = g.add_node({"node_type": NodeType.INPUT, "attributes": {"output_size": 3}})
    extra = {"attention": {"temperature": 0.7}, "multi_head_attention":
             {"num_heads": 2, "head_dim": 2}, "attn_pool": {"pool_heads": 2},
             "topk_weighted_sum": {"top_k": 2}, "moe": {"router_type": "topk", "top_k": 2}}
    acts = list(ACTIVATIONS) + ["tanh"]
    prev = [a, b]
    for i, agg in enumerate(AGGREGATIONS):
        kind = NodeType.OUTPUT if i in (4, len(AGGREGATIONS) - 1) else NodeType.HIDDEN
        n = g.add_node({"node_type": kind, "activation_function": acts[i], "bias": 0.1 * i,
                        "attributes": {"output_size": 2 + i % 3, "aggregation": agg,
                                       **extra.get(agg, {})}})
        for s in (prev[-1], prev[-2], prev[-1], a):
            g.add_edge(s, n, {"weight": 0.3 + 0.1 * s})
        g.add_edge(b, n, {"enabled": False})
        prev.append(n)
    g.add_edge(prev[-1], prev[3], {"weight": -0.5, "attributes": {"is_recurrent": True}})
    g.add_edge(prev[5], prev[5], {"weight": 0.7, "attributes": {"is_recurrent": True}})
    assert g.validate() == []
    return g


@pytest.mark.parametrize("multigraph", [False, True])
def test_every_aggregation_and_activation(multigraph):
    _check(_every_kind(multigraph), steps=2, seed=5)


def test_stepper_carries_state_like_forward():
    graph = _every_kind(True)
    torch.manual_seed(2)
    model = to_pytorch_model(graph, {"dtype": torch.float64})
    net = to_geon(graph, BATCH, dtype=np.float64)
    t = be.make_transformer("numpy")
    stepper = net.stepper(t)
    net.load_state_dict(t, model.state_dict())
    rng = np.random.default_rng(0)
    for reset in (False, False, False, True, False):
        x = rng.standard_normal((BATCH, 5))
        want = model(torch.from_numpy(x), reset_states=reset).detach().numpy()
        np.testing.assert_allclose(stepper(x, reset_states=reset), want, rtol=1e-10)
    # The state really matters: a reset changes the output of the same input.
    again = stepper(x)
    assert not np.allclose(again, stepper(x, reset_states=True))
    # Parameters come back out unchanged.
    back = net.state_dict(t)
    assert set(back) == set(model.state_dict())
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(back[k], v.numpy())


def test_load_state_dict_checks_names_and_shapes():
    graph = _every_kind(False)
    model = to_pytorch_model(graph, {"dtype": torch.float64})
    net = to_geon(graph, BATCH, dtype=np.float64)
    t = be.make_transformer("numpy")
    net.stepper(t)
    sd = dict(model.state_dict())
    sd.pop("bias_2")
    with pytest.raises(be.GeonError, match="missing \\['bias_2'\\]"):
        net.load_state_dict(t, sd)
    sd["bias_2"] = torch.zeros(3)
    with pytest.raises(be.GeonError, match="bias_2 has shape \\(3,\\)"):
        net.load_state_dict(t, sd)


def test_node_without_enabled_inputs():
    """Zeros of the aggregated width (validate() reports such a node, the translators
    accept it)."""
    g = Graph()
    x = g.add_node({"node_type": NodeType.INPUT, "attributes": {"output_size": 2}})
    lone = g.add_node({"activation_function": "gru", "bias": 0.4, "attributes": {
        "output_size": 3, "aggregation": "attn_pool", "pool_heads": 2}})
    y = g.add_node({"node_type": NodeType.OUTPUT, "attributes": {"output_size": 2}})
    g.add_edge(x, lone, {"enabled": False})
    g.add_edge(lone, y)
    g.add_edge(x, y)
    assert g.validate() == ["node 1: no enabled incoming edge"]
    _check(g, steps=2, seed=1)


def test_float32_defaults_agree():
    """The default dtypes of both translators (float32) agree to float32 accuracy."""
    graph = _every_kind(False)
    torch.manual_seed(4)
    model = to_pytorch_model(graph, {})
    net = to_geon(graph, BATCH)
    t = be.make_transformer("numpy")
    stepper = net.stepper(t)
    net.load_state_dict(t, model.state_dict())
    assert all(p.dtype == np.float32 for p in net.state_dict(t).values())
    x = np.random.default_rng(3).standard_normal((BATCH, 5)).astype(np.float32)
    for _ in range(2):
        got = stepper(x)
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, model(torch.from_numpy(x)).detach().numpy(),
                                   rtol=1e-4, atol=1e-5)


def test_the_geon_translation_runs_on_the_emulated_gpu():
    # to_geon builds ordinary geon ops, so another transformer runs them: the GPU one's
    # generated kernels (on the test emulator) give the NumPy transformer's values.
    from cuda_emulator import EmulatorRuntime, find_compiler
    if find_compiler() is None:
        pytest.skip("no C++ compiler for the GPU emulator")
    from geon.transformers.gpu import GPUTransformer
    graph = _every_kind(True)
    torch.manual_seed(4)
    model = to_pytorch_model(graph, {"dtype": torch.float64})
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    rng = np.random.default_rng(4)
    xs = [rng.standard_normal((BATCH, model.input_width)) for _ in range(2)]
    got = []
    for t in (be.make_transformer("numpy"), GPUTransformer(runtime=EmulatorRuntime(seed=3))):
        net = to_geon(graph, BATCH, steps=2, dtype=np.float64)
        comp = t.computation(list(net.outputs), *net.inputs, *net.state_in.values())
        net.load_state_dict(t, model.state_dict())
        zero = net.zero_state()
        got.append(comp(*xs, *[zero[k] for k in net.state_in]))
    want = [model(torch.from_numpy(x), reset_states=(i == 0)).detach().numpy()
            for i, x in enumerate(xs)]
    for cpu, gpu, w in zip(*got, want):
        np.testing.assert_allclose(cpu, w, rtol=1e-5, atol=1e-9)
        np.testing.assert_allclose(gpu, cpu, rtol=1e-10, atol=1e-12)
