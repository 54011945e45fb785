"""The torch export of graphs with symbolic lengths (doc/torch_export.rst, "Dynamic
dimensions"): one module for every binding, the symbols bound from the feeds' shapes
at each call; values equal to the NumPy transformer's computation of the same graph,
gradients through autograd equal to ``be.deriv``'s, in float64."""

import numpy as np
import pytest

import geon as be
from geon.errors import ArgumentError, FeedError, LoweringError
from geon.op_graph.symbols import Symbol

torch = pytest.importorskip("torch")
from geon.transformers.torch import to_torch  # noqa: E402
from geon.transformers.torch import export as ex  # noqa: E402

F64 = np.float64
TOL = dict(rtol=1e-12, atol=1e-14)
BATCHES = (1, 3, 17)


def _close(got, want):
    got = got.detach().numpy()
    assert got.shape == np.shape(want)
    np.testing.assert_allclose(got, want, **TOL)


def _check_grads(module, variables, loss_value, want):
    """``loss_value.backward()`` gives each Variable's parameter the gradient ``want``."""
    module.zero_grad()
    loss_value.backward()
    params = dict(module.named_parameters())
    attr = {v: a for a, v in module.geon_variables.items()}
    for v, g in zip(variables, want):
        _close(params[attr[v]].grad, g)


def test_an_mlp_over_a_symbolic_batch_runs_every_batch_size():
    N = be.symbolic_axis("N", batch=True)
    F, H, C = be.Axis(6, "F"), be.Axis(5, "H"), be.Axis(4, "C")
    r = np.random.default_rng(0)
    x = be.placeholder([N, F], dtype=F64, name="x")
    w1 = be.Variable([H, F], initial_value=r.standard_normal((5, 6)) * 0.5, dtype=F64,
                     name="w1")
    b1 = be.Variable([H], initial_value=r.standard_normal(5), dtype=F64, name="b1")
    w2 = be.Variable([C, H], initial_value=r.standard_normal((4, 5)), dtype=F64,
                     name="w2")
    h = be.tanh(be.dot(w1, x) + b1)
    p = be.softmax(be.dot(w2, h), normalization_axes=[C])
    loss = be.mean(p * p * be.dot(w2, h), out_axes=())
    variables = [w1, b1, w2]
    module = to_torch([p, loss], x)  # exported once
    assert module.output_axes[0].lengths[0] is N.length     # batch first
    want_comp = be.NumPyTransformer().computation(
        [p, loss] + be.deriv(loss, variables), x)
    for n in BATCHES:
        X = r.standard_normal((n, 6))
        want = want_comp(X)
        got = module(torch.from_numpy(X))
        _close(got[0], np.asarray(want[0]).T)   # the module lays the batch out first
        _close(got[1], want[1])
        _check_grads(module, variables, got[1], want[2:])
    assert module(X.tolist())[0].shape == (17, 4)   # lists and arrays bind too


def _cnn():
    N = Symbol("N")
    r = np.random.default_rng(1)
    x = be.np.placeholder((N, 3, 8, 8), dtype=F64, name="x")
    wc = be.np.variable(r.standard_normal((8, 3, 3, 3)) * 0.3, name="wc")
    bc = be.np.variable(r.standard_normal(8), name="bc")
    wf = be.np.variable(r.standard_normal((128, 5)) * 0.1, name="wf")
    c = be.np.conv(x, wc, padding=1) + be.np.reshape(bc, (8, 1, 1))
    pooled = be.np.max_pool(be.np.maximum(c, 0.0), 2)
    y = be.np.reshape(pooled, (N, -1)) @ wf
    loss = be.np.mean(be.np.log_softmax(y, axis=-1) * y)
    return x, [wc, bc, wf], y, loss


def test_a_cnn_over_a_symbolic_batch_runs_every_batch_size():
    x, variables, y, loss = _cnn()
    module = to_torch([y, y[:, 1:3], loss], x)
    want_comp = be.NumPyTransformer().computation(
        [y, y[:, 1:3], loss] + be.deriv(loss, variables), x)
    r = np.random.default_rng(2)
    for n in BATCHES:
        X = r.standard_normal((n, 3, 8, 8))
        want = want_comp(X)
        got = module(torch.from_numpy(X))
        for g, w in zip(got, want[:3]):
            _close(g, w)
        _check_grads(module, variables, got[2], want[3:])


def test_geons_own_derivatives_export_too():
    """The graph ``be.deriv`` builds (a conv's data gradient, max pooling's gradient, the
    mean's symbolic count) exports over the symbolic batch as well."""
    x, variables, y, loss = _cnn()
    results = [loss] + be.deriv(loss, [x] + variables)
    module = to_torch(results, x, output_order="graph")
    want_comp = be.NumPyTransformer().computation(results, x)
    r = np.random.default_rng(3)
    for n in BATCHES:
        X = r.standard_normal((n, 3, 8, 8))
        for g, w in zip(module(X), want_comp(X)):
            _close(g, w)


def test_a_scan_loops_over_the_bound_length_of_a_symbolic_sequence():
    T = be.symbolic_axis("T", recurrent=True)
    N = be.symbolic_axis("N", batch=True)
    H, D, H2 = be.Axis(3, "H"), be.Axis(2, "D"), be.Axis(3, "H2")
    x = be.placeholder([T, N, D], dtype=F64, name="x")
    h0 = be.placeholder([N, H], dtype=F64, name="h0")
    w = be.placeholder([H2, H], dtype=F64, name="w")
    u = be.placeholder([H, D], dtype=F64, name="u")

    def cell(h, xt):
        hn = be.tanh(be.cast_axes(be.dot(w, h), [H, N]) + be.dot(u, xt))
        return hn, be.sum(hn * hn, out_axes=[N])
    hT, ys = be.scan(cell, h0, x, T)
    cost = be.mean(ys * ys, out_axes=()) + be.sum(hT * hT, out_axes=())
    ins = [x, h0, w, u]
    module = to_torch([cost, hT, ys], *ins, output_order="graph")
    want_comp = be.NumPyTransformer().computation([cost, hT, ys] + be.deriv(cost, ins),
                                                  *ins)
    r = np.random.default_rng(4)
    W, U = 0.5 * r.standard_normal((3, 3)), r.standard_normal((3, 2))
    for t, n in ((1, 2), (4, 1), (9, 3), (4, 17)):
        feeds = [torch.tensor(a, requires_grad=True)
                 for a in (r.standard_normal((t, n, 2)), r.standard_normal((n, 3)), W, U)]
        want = want_comp(*[f.detach().numpy() for f in feeds])
        got = module(*feeds)
        for g, wv in zip(got, want[:3]):
            _close(g, wv)
        got[0].backward()
        for f, g in zip(feeds, want[3:]):
            _close(f.grad, g)


def test_cond_while_loop_and_random_draws_over_a_symbolic_batch():
    """Each branch, predicate or body module binds the batch from its own inputs; a
    random draw has the bound shape (the same Philox numbers as geon's)."""
    from geon.op_graph import random as rnd
    N, H = be.symbolic_axis("N", batch=True), be.Axis(3, "H")
    h0 = be.placeholder([N, H], dtype=F64, name="h0")
    p = be.placeholder([], dtype=F64, name="p")
    y = be.cond(p, lambda a: be.tanh(a) * 3.0, lambda a: a * be.mean(a, out_axes=()), h0)
    c = be.while_loop(lambda v: be.sum(v, out_axes=()) < 100.0, lambda v: v * 2.0, h0)
    noisy = h0 * rnd.uniform([N, H], seed=3, dtype=F64)
    results = [y, c, noisy]
    module = to_torch(results, p, h0, output_order="graph")
    want_comp = be.NumPyTransformer().computation(results, p, h0)
    for n in BATCHES:
        v = np.random.default_rng(n).uniform(0.5, 1.0, (n, 3))
        for pv in (0.0, 1.0):
            for g, w in zip(module(torch.tensor(pv), torch.from_numpy(v)), want_comp(pv, v)):
                _close(g, w)


def test_feeds_are_checked_against_the_binding():
    N = Symbol("N")
    a = be.np.placeholder((N, 4), dtype=F64, name="a")
    b = be.np.placeholder((4, N), dtype=F64, name="b")
    module = to_torch(a @ b, a, b)
    assert module(torch.ones(2, 4), torch.ones(4, 2)).shape == (2, 2)
    with pytest.raises(FeedError, match=r"placeholder b gives symbol N the value 5 .*"
                                        r"placeholder a gives it 2 .*the feeds disagree"):
        module(torch.ones(2, 4), torch.ones(4, 5))
    with pytest.raises(FeedError, match=r"placeholder a expects axes .* shape \(N, 4\); "
                                        r"got shape \(2,\)"):
        module(torch.ones(2), torch.ones(4, 2))
    with pytest.raises(FeedError, match=r"placeholder b expects axes .* i\.e\. shape "
                                        r"\(4, 2\); got shape \(3, 2\)"):
        module(torch.ones(2, 4), torch.ones(3, 2))          # a fixed length that differs
    with pytest.raises(FeedError, match=r"placeholder b expects .* shape \(4, 2\)"):
        module(np.ones((2, 4)), np.ones((3, 2)).tolist())   # the same, as a list
    with pytest.raises(FeedError, match="cannot safely convert"):
        module(torch.ones(2, 4, dtype=torch.complex128), torch.ones(4, 2))


def test_what_cannot_be_bound_is_refused_at_export():
    N = Symbol("N")
    x = be.np.placeholder((N * 2, 3), dtype=F64, name="x")  # no axis of length N alone
    with pytest.raises(ArgumentError, match="symbolic length.*N.*no placeholder"):
        to_torch(be.np.tanh(x), x)

    class Op:  # an op whose rule would read a symbolic attribute without binding it
        attrs = ("repeats", "axes")
        name, file_info, repeats, axes = "Tile_0", "here", (Symbol("N"), 2), None
    with pytest.raises(LoweringError, match=r"Tile_0 .*repeats \(N, 2\) has a symbolic"):
        ex._check_symbolic(Op())


def test_a_graph_of_fixed_lengths_binds_nothing():
    x = be.np.placeholder((2, 4), dtype=F64, name="x")
    module = to_torch(be.np.tanh(x) * 2.0, x)
    assert module._geon_binders is None
    X = np.random.default_rng(5).standard_normal((2, 4))
    _close(module(torch.from_numpy(X)), np.tanh(X) * 2.0)
    with pytest.raises(FeedError, match=r"shape \(2, 4\); got shape \(3, 4\)"):
        module(torch.ones(3, 4))
