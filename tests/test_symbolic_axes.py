"""Symbolic axis lengths (issue 34, first slice): the Sym algebra, axes with symbolic
lengths, and NumPy computations bound from the feeds' shapes at each call: one
transformation for every batch size, one memory plan per binding."""

import operator
import pickle

import numpy as np
import pytest

import geon as be
from geon.errors import AxisMismatchError, FeedError
from geon.op_graph.symbols import Sym, Symbol, SymbolicLengthError, evaluate

N_, M_ = Symbol("N"), Symbol("M")


# --- the algebra ------------------------------------------------------------------

def test_sym_normal_form_equal_expressions_compare_and_hash_alike():
    a = (N_ + 1) * (N_ - 1)
    b = N_ * N_ - 1
    assert a == b and hash(a) == hash(b)
    assert N_ * 64 == 64 * N_ == N_ * 32 + N_ * 32
    assert M_ * N_ == N_ * M_ and (M_ + N_) == (N_ + M_)
    assert N_ - N_ == 0 and type(N_ - N_) is int        # no symbol left: an int
    assert (N_ * 6) // 3 == N_ * 2 and (N_ * 6 + 4) // 3 == N_ * 2 + 1
    assert (N_ * 6 + 4) % 3 == 1 and N_ % 1 == 0
    assert isinstance((N_ + 1) // 2, Sym) and (N_ + 1) // 2 == (1 + N_) // 2
    assert N_ != M_ and N_ != 1 and not (N_ == 7)        # structural
    assert len({N_ * 2, 2 * N_, N_ + N_}) == 1
    assert pickle.loads(pickle.dumps(N_ * M_ + 3)) == N_ * M_ + 3


@pytest.mark.parametrize("expr", [
    N_, N_ * 64, 64 * N_ + 1, N_ - 3, 3 - N_, -N_, N_ * M_ * 2 - M_, N_ * N_,
    (N_ + 1) // 2, (N_ * 3 + 1) % 4, M_ * ((N_ + 1) // 2) + 5,
])
def test_sym_repr_is_a_python_expression_that_round_trips(expr):
    text = repr(expr)
    assert eval(text, {"N": N_, "M": M_}) == expr          # the same normal form
    for n, m in [(1, 2), (7, 3), (1000, 11)]:
        assert eval(text, {"N": n, "M": m}) == expr.evaluate({"N": n, "M": m})


def test_sym_repr_and_evaluation():
    assert repr(N_ * 64) == "N*64" and repr(N_ * 64 + 1) == "N*64 + 1"
    assert repr(N_ - 3) == "N - 3" and repr(3 - N_) == "-N + 3"
    assert (N_ * M_ + 2).evaluate({"N": 7, "M": 3}) == 23
    assert ((N_ + 1) // 2).evaluate({"N": 8}) == 4
    assert evaluate((4, N_, N_ * 3), {"N": 5}) == (4, 5, 15)
    with pytest.raises(SymbolicLengthError, match="symbol M has no value"):
        (N_ * M_).evaluate({"N": 1})


def test_undecidable_comparisons_raise_naming_the_symbol():
    for what in (lambda: N_ < 5, lambda: N_ * 3 >= 64, lambda: N_ > M_,
                 lambda: bool(N_), lambda: int(N_), lambda: range(N_)):
        with pytest.raises(TypeError, match="axis N.* is symbolic: .*not decidable at "
                                            "build time"):
            what()
    assert N_ + 1 > N_ and N_ - 2 < N_ and N_ <= N_      # a constant difference decides
    # so does a sign that follows from symbols being lengths (>= 0)
    assert N_ >= 0 and not N_ < 0 and -N_ <= 0 and N_ + 1 > 0 and N_ * 2 >= N_
    assert N_ * M_ >= 0 and (N_ + 1) // 2 >= 0 and not (-N_ - 1 >= 0)
    for undecided in (lambda: N_ > 0, lambda: N_ * 2 > N_, lambda: N_ - 1 >= 0,
                      lambda: (N_ - 3) // 2 >= 0):
        with pytest.raises(SymbolicLengthError):
            undecided()
    with pytest.raises(TypeError, match="division by a symbolic length"):
        6 // N_
    with pytest.raises(TypeError, match=r"^6 / N: division by a symbolic length"):
        6 / N_
    with pytest.raises(TypeError, match=r"^N / 2: lengths divide with //"):
        N_ / 2
    with pytest.raises(TypeError, match=r"^7 % N: a remainder modulo a symbolic"):
        7 % N_
    with pytest.raises(ValueError, match="identifier"):
        Symbol("for")
    with pytest.raises(ValueError, match=r"at most 128 characters.*\(129 characters\)"):
        Symbol("N" * 129)
    assert Symbol("N" * 128) != N_


# --- axes -------------------------------------------------------------------------

def test_symbolic_axes_lengths_size_and_printing():
    N = be.symbolic_axis("N", batch=True)
    assert N.batch and N.is_symbolic and repr(N) == "N:N"
    assert be.Axis(be.Symbol("N"), "N").length == N.length
    C = be.Axis(64, "C")
    axes = be.Axes(C, N)
    assert axes.lengths == (64, N_) and axes.size == N_ * 64 and axes.is_symbolic
    assert axes.shape == (64, N_)
    assert not be.Axes(C).is_symbolic
    with pytest.raises(TypeError, match="axis N is symbolic"):
        operator.index(axes.size)
    with pytest.raises(TypeError, match="N\\*64"):            # NumPy's words, the expression
        np.empty(axes.size)


def test_two_symbols_on_one_axis_name_are_a_mismatch_naming_both():
    a = be.placeholder([be.Axis(Symbol("N"), "B")], name="a")
    b = be.placeholder([be.Axis(Symbol("M"), "B")], name="b")
    with pytest.raises(AxisMismatchError, match=r"axis B has length \(symbolic\) N .* "
                                                r"and M in another"):
        a + b
    c = be.placeholder([be.Axis(8, "B")], name="c")
    with pytest.raises(AxisMismatchError, match="axis B has length"):
        a + c
    a + be.placeholder([be.Axis(Symbol("N"), "B")])        # the same symbol: fine


# --- the NumPy transformer ---------------------------------------------------------

D, H, K = 5, 6, 3
RNG = np.random.default_rng(34)
W1 = RNG.normal(size=(H, D))
B1 = RNG.normal(size=H)
W2 = RNG.normal(size=(K, H))


def mlp(batch_axis):
    """An MLP's inference graph (float64) over ``batch_axis``: results softmax(W2 relu(
    tanh(W1 x + b1))), its sum, and the mean of the hidden layer."""
    Dx, Hx, Kx = be.Axis(D, "D"), be.Axis(H, "H"), be.Axis(K, "K")
    x = be.placeholder([Dx, batch_axis], dtype="float64", name="x")
    w1 = be.Variable([Hx, Dx], initial_value=W1, dtype="float64", name="w1")
    b1 = be.Variable([Hx], initial_value=B1, dtype="float64", name="b1")
    w2 = be.Variable([Kx, Hx], initial_value=W2, dtype="float64", name="w2")
    h = be.tanh(be.dot(w1, x) + b1)
    y = be.softmax(be.dot(w2, be.maximum(h, 0.0)))
    return x, [y, be.sum(y, out_axes=()), be.mean(h, out_axes=())]


def reference(x):
    h = np.tanh(W1 @ x + B1[:, None])
    z = W2 @ np.maximum(h, 0.0)
    e = np.exp(z - z.max(axis=0))
    y = e / e.sum(axis=0)
    return y, y.sum(), h.mean()


def test_one_computation_for_every_batch_size():
    x, results = mlp(be.symbolic_axis("N", batch=True))
    assert results[0].axes.lengths == (K, N_)
    # (the NumPy code on both sides: a fixed length's groups of a thousand elements or
    # more may be compiled, and C's exp need not round as NumPy's does)
    comp = be.make_transformer("numpy", compiled=False).computation(results, x)
    assert comp.transformations == 1 and comp.plans == 0
    assert "N = x.shape[1]" in comp.source and "x.shape == (5, N)" in comp.source
    assert "reshape((6, N))" in comp.source                # shapes print as expressions
    for n in (1, 7, 1000):
        feed = RNG.normal(size=(D, n))
        got = comp(feed)
        want = reference(feed)
        fixed_x, fixed = mlp(be.Axis(n, "N", batch=True))
        fixed_got = be.make_transformer("numpy", compiled=False).computation(
            fixed, fixed_x)(feed)
        for g, w, f in zip(got, want, fixed_got):
            assert g.shape == np.shape(w)
            np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)
            np.testing.assert_array_equal(g, f)    # the same NumPy calls, bit for bit
    assert comp.transformations == 1 and comp.plans == 3
    comp(RNG.normal(size=(D, 7)))                          # a binding seen before
    assert comp.plans == 3
    assert sorted(comp._plans) == [(1,), (7,), (1000,)]


def test_feeds_that_disagree_on_a_symbol_raise_naming_both():
    N = be.symbolic_axis("N", batch=True)
    C = be.Axis(3, "C")
    a = be.placeholder([C, N], dtype="float64", name="a")
    b = be.placeholder([N], dtype="float64", name="b")
    comp = be.make_transformer("numpy").computation(a * b, a, b)
    np.testing.assert_allclose(comp(np.ones((3, 4)), np.arange(4.0)),
                               np.ones((3, 4)) * np.arange(4.0))
    with pytest.raises(FeedError, match=r"placeholder b gives symbol N the value 5 .*"
                                        r"placeholder a gives it 4"):
        comp(np.ones((3, 4)), np.arange(5.0))
    with pytest.raises(FeedError, match="placeholder a expects axes"):
        comp(np.ones((2, 4)), np.arange(4.0))             # a fixed length is checked
    with pytest.raises(FeedError, match=r"placeholder b expects axes \(N:N\) i.e. shape "
                                        r"\(N,\); got shape \(4, 1\)"):
        comp(np.ones((3, 4)), np.ones((4, 1)))            # another rank
    assert comp.plans == 1


def test_a_symbol_no_feed_binds_and_symbolic_variables_are_refused():
    N = be.symbolic_axis("N")
    x = be.placeholder([be.Axis(3, "C")], name="x")
    v = be.Variable([N], name="v")
    with pytest.raises(be.ArgumentError, match="Variable v .* lengths must be fixed"):
        be.make_transformer("numpy").computation(x + v, x)


def test_derivative_and_training_step_over_a_symbolic_batch():
    N = be.symbolic_axis("N", batch=True)
    Dx, Hx = be.Axis(D, "D"), be.Axis(H, "H")
    x = be.placeholder([Dx, N], dtype="float64", name="x")
    t = be.placeholder([Hx, N], dtype="float64", name="t")
    w = be.Variable([Hx, Dx], initial_value=W1, dtype="float64", name="w")
    b = be.Variable([Hx], initial_value=B1, dtype="float64", name="b")
    loss = be.mean(be.square(be.tanh(be.dot(w, x) + b) - t), out_axes=())
    tr = be.make_transformer("numpy")
    step = tr.computation([loss] + [be.SetItem(v, v - 0.1 * be.deriv(loss, v))
                                    for v in (w, b)], x, t)
    grad = tr.computation(be.deriv(loss, w), x, t)
    wv, bv = W1.copy(), B1.copy()
    for n in (1, 7, 1000, 7):
        xv, tv = RNG.normal(size=(D, n)), RNG.normal(size=(H, n))
        y = np.tanh(wv @ xv + bv[:, None])
        dz = 2 * (y - tv) / (H * n) * (1 - y * y)
        np.testing.assert_allclose(grad(xv, tv), dz @ xv.T, rtol=1e-12, atol=1e-14)
        got_loss = step(xv, tv)[0]
        np.testing.assert_allclose(got_loss, np.mean((y - tv) ** 2), rtol=1e-12)
        wv, bv = wv - 0.1 * (dz @ xv.T), bv - 0.1 * dz.sum(axis=1)
        np.testing.assert_allclose(tr.state[w], wv, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(tr.state[b], bv, rtol=1e-12, atol=1e-14)
    assert (step.transformations, step.plans) == (1, 3)
    assert (grad.transformations, grad.plans) == (1, 3)


def test_a_constant_over_a_symbolic_axis_is_viewed_per_binding():
    N = be.symbolic_axis("N")
    C = be.Axis(3, "C")
    x = be.placeholder([C, N], dtype="float64", name="x")
    c = be.constant(2.0, axes=[N], dtype="float64")
    comp = be.make_transformer("numpy").computation(
        [be.sum(x * c, reduction_axes=[C]), c + 0], x)
    source = comp.source
    for n in (1, 4):
        s, cc = comp(np.ones((3, n)))
        np.testing.assert_array_equal(s, np.full(n, 6.0))
        np.testing.assert_array_equal(cc, np.full(n, 2.0))
    assert comp.source is source and comp.plans == 2


def test_a_transformer_without_symbolic_lengths_refuses_them_when_building():
    class Fixed(be.NumPyTransformer):
        symbolic_lengths = False
    x = be.placeholder([be.symbolic_axis("N")], name="x")
    with pytest.raises(be.ArgumentError, match="symbolic length: the .* transformer "
                                               "needs fixed lengths"):
        Fixed().computation(x + 1, x)


def test_the_plans_of_at_most_max_bindings_are_kept(monkeypatch):
    from geon.transformers.numpy import transformer as nt
    monkeypatch.setattr(nt, "MAX_BINDINGS", 2)
    x = be.placeholder([be.symbolic_axis("N")], dtype="float64", name="x")
    comp = be.make_transformer("numpy").computation(be.tanh(x) * 2, x)
    for n in (1, 2, 3, 1):
        np.testing.assert_allclose(comp(np.ones(n)), np.full(n, 2 * np.tanh(1.0)))
    assert sorted(comp._plans) == [(1,), (3,)] and comp.plans == 4


def test_a_scan_over_time_with_a_symbolic_batch():
    N = be.symbolic_axis("N", batch=True)
    T, Hx = be.Axis(4, "T", recurrent=True), be.Axis(3, "H")
    x = be.placeholder([Hx, T, N], dtype="float64", name="x")
    h0 = be.constant(0.0, axes=[Hx, N], dtype="float64")

    def body(h, xt):
        h = be.tanh(h * 0.5 + xt)
        return h, h
    last, _ = be.scan(body, h0, x, T)
    comp = be.make_transformer("numpy").computation(last, x)
    for n in (1, 5):
        xv = RNG.normal(size=(3, 4, n))
        h = np.zeros((3, n))
        for t in range(4):
            h = np.tanh(h * 0.5 + xv[:, t])
        np.testing.assert_allclose(comp(xv), h, rtol=1e-12)
    assert (comp.transformations, comp.plans) == (1, 2)


def test_feeds_are_checked_on_the_fast_path_too():
    N = be.symbolic_axis("N", batch=True)
    Kx = be.Axis(K, "K")
    labels = be.placeholder([N], dtype="int64", name="labels", domain=K)
    comp = be.make_transformer("numpy").computation(be.one_hot(labels, Kx), labels)
    np.testing.assert_array_equal(comp(np.array([0, 2])), np.eye(K)[:, [0, 2]])
    np.testing.assert_array_equal(comp(np.array([1, 1])), np.eye(K)[:, [1, 1]])  # fast
    for bad in (np.array([0, 3]), np.array([0, 1, -1])):   # a binding seen / a new one
        with pytest.raises(be.DomainError, match="labels"):
            comp(bad)
    np.testing.assert_array_equal(comp([2]), np.eye(K)[:, [2]])   # a list: converted
    assert comp(np.zeros(0, np.int64)).shape == (K, 0)             # an empty batch
    with pytest.raises(FeedError, match="placeholder labels expects"):
        comp(np.zeros((2, 2), np.int64))


def test_the_reference_evaluator_binds_the_feeds_and_specialize_copies_the_graph():
    from geon.op_graph.specialize import specialize
    x, results = mlp(be.symbolic_axis("N", batch=True))
    for n in (1, 7):
        feed = RNG.normal(size=(D, n))
        for got, want in zip(be.evaluate(results, {x: feed}), reference(feed)):
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    copies = specialize(results, {"N": 4})
    assert copies[results[0]].axes.lengths == (K, 4) and copies[x].axes.lengths == (D, 4)
    assert x.axes.is_symbolic                                # the original is unchanged

    class Fixed(be.NumPyTransformer):
        symbolic_lengths = False
    comp = Fixed().computation([copies[r] for r in results], copies[x])
    feed = RNG.normal(size=(D, 4))
    for got, want in zip(comp(feed), reference(feed)):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    with pytest.raises(FeedError, match="gives symbol N the value 3"):
        a = be.placeholder([be.symbolic_axis("N")], name="a")
        b = be.placeholder([be.symbolic_axis("N")], name="b")
        be.evaluate(a + b, {a: np.ones(2), b: np.ones(3)})


def test_a_graph_of_symbolic_axes_round_trips_through_a_document():
    import json
    x, results = mlp(be.symbolic_axis("N", batch=True))
    doc = be.serialize(results)
    assert json.loads(doc)["axes"]["N"] == {"length": None, "symbol": "N", "batch": True}
    loaded = be.deserialize_graph(doc)
    assert loaded.results[0].axes.lengths == (K, N_)
    comp = be.make_transformer("numpy").computation(loaded.results, loaded.op("x"))
    for n in (2, 9):
        feed = RNG.normal(size=(D, n))
        for got, want in zip(comp(feed), reference(feed)):
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    bad = json.loads(doc)
    bad["axes"]["N"]["symbol"] = "_x"
    with pytest.raises(be.SerializationError, match="symbol"):
        be.deserialize_graph(json.dumps(bad))
    flat = be.flatten(x)                              # its axis: (D*N), of length N*5
    assert be.deserialize(be.serialize(flat)).axes.lengths == (N_ * 5,)


def test_size_hints_fuse_a_symbolic_computation_without_changing_its_results():
    x, results = mlp(be.symbolic_axis("N", batch=True))
    # (the NumPy code's fusion: the compiled path, test_symbolic_compiled.py)
    plain = be.make_transformer("numpy", sample_axis="first", compiled=False) \
        .computation(results, x)
    fused = be.make_transformer("numpy", sample_axis="first", compiled=False,
                                size_hints={"N": 65536}).computation(results, x)
    assert "_run_blocks(fused, N, " in fused.source and "_run_blocks" not in plain.source
    # within a rounding step (the transformer's docstring): the fused code may sum in
    # another order (bitwise equal for some feeds only, about half of one-column ones;
    # over 800 feeds the largest difference was one eps, absolute, as the results are
    # within [-1, 1]: relative to the mean of h, which sums values of both signs, that
    # was 50 eps)
    eps = np.finfo(np.float64).eps
    for n in (1, 7, 1000, 50000):
        feed = RNG.normal(size=(D, n))
        for a, b in zip(plain(feed), fused(feed)):
            np.testing.assert_allclose(a, b, rtol=4 * eps, atol=4 * eps)
    assert (fused.transformations, fused.plans) == (1, 4)
    # no hint for every symbol: no fusion
    comp = be.make_transformer("numpy", sample_axis="first", size_hints={"M": 65536},
                               compiled=False).computation(results, x)
    assert "_run_blocks" not in comp.source
    # the default layout: values whose symbolic length is not their first are not fused
    comp = be.make_transformer("numpy", size_hints={"N": 65536}).computation(results, x)
    feed = RNG.normal(size=(D, 9))
    for a, b in zip(comp(feed), reference(feed)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    with pytest.raises(be.ArgumentError, match="size_hints"):
        be.make_transformer("numpy", size_hints={"N": -1})


def test_values_of_fixed_lengths_are_fused_in_a_symbolic_computation(monkeypatch):
    from geon.transformers import fusion
    monkeypatch.setattr(fusion, "MIN_ELEMENTS", 16)      # the (6, 5) weight's update
    N = be.symbolic_axis("N", batch=True)
    x = be.placeholder([be.Axis(D, "D"), N], dtype="float64", name="x")
    w = be.Variable([be.Axis(H, "H"), be.Axis(D, "D")], initial_value=W1,
                    dtype="float64", name="w")
    loss = be.mean(be.tanh(be.dot(w, x)), out_axes=())
    tr = be.make_transformer("numpy", compiled=False)
    step = tr.computation([loss, be.SetItem(w, w - 0.5 * be.deriv(loss, w))], x)
    fused = [ln for ln in step.source.splitlines() if "_run_blocks(" in ln]
    assert fused and all(", N," not in ln for ln in fused)   # fixed rows only
    wv = W1.copy()
    for n in (1, 7, 1000):
        xv = RNG.normal(size=(D, n))
        y = np.tanh(wv @ xv)
        np.testing.assert_allclose(step(xv)[0], y.mean(), rtol=1e-12)
        wv = wv - 0.5 * ((1 - y * y) / (H * n)) @ xv.T
        np.testing.assert_allclose(tr.state[w], wv, rtol=1e-12, atol=1e-14)


# --- the neon Model's predict over a symbolic batch ---------------------------------------
def _both_ways(model, method, *args):
    """(``method`` of the model over the symbolic batch, in fixed padded batches)."""
    kind = "predict" if method == "predict" else "eval"
    got = getattr(model, method)(*args)
    any_batch, model._any[kind] = model._any[kind], None   # the fixed path
    try:
        want = getattr(model, method)(*args)
    finally:
        model._any[kind] = any_batch
    return got, want


def test_model_predict_takes_any_number_of_samples_without_padding():
    """One computation over a symbolic batch serves 1, 7 and 1,000 samples in predict
    and in evaluate (batches of 32, the last as it is): the fixed padded batches'
    values (to float32 rounding: a product over fewer columns may add in another
    order), the weights unchanged, one transformation."""
    from geon.examples import digits
    model = digits.build_model(dict(hidden=16, seed=0, lr=0.1, batch_size=32), 64, "numpy")
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 16, size=(1000, 64)).astype(np.float32)
    model.fit(x[:200], rng.integers(0, 10, 200), epochs=1, batch_size=32, seed=0,
              verbose=False)
    before = {k: v.copy() for k, v in model.weights().items()}
    for n in (1, 7, 1000):
        got, want = _both_ways(model, "predict", x[:n])
        assert got.shape == (n, 10)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    comp = model._any["predict"]
    assert comp is not None and comp.transformations == 1
    assert comp.plans == 4          # bindings 1, 7, 32 and 8 (1000 = 31 * 32 + 8)
    assert model.predict(x[0]).shape == (10,)    # one unbatched sample
    y = rng.integers(0, 10, 1000)
    for n in (1, 7, 1000):                       # evaluate likewise
        got, want = _both_ways(model, "evaluate", x[:n], y[:n])
        assert got.keys() == want.keys() == {"loss", "accuracy"}
        np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-5)
        assert got["accuracy"] == want["accuracy"]
    assert model._any["eval"].transformations == 1
    for k, v in model.weights().items():
        np.testing.assert_array_equal(v, before[k])


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_model_predict_of_a_recurrent_network_takes_any_number_of_samples(cell):
    """A recurrent network (one scan over the sequence, its body over the symbolic
    batch) predicts 1, 5 and 6 samples with one computation, with the values of the
    fixed batches (the last padded) the model falls back to without one."""
    import argparse
    from geon.examples import digits_rnn
    model = digits_rnn.build_model(argparse.Namespace(
        hidden=8, cell=cell, seed=0, lr=1e-2, batch_size=4, transformer="numpy",
        data_parallel=False))
    x = np.random.default_rng(1).uniform(0, 16, size=(6, 8, 8)).astype(np.float32)
    for n in (1, 5, 6):
        got, want = _both_ways(model, "predict", x[:n])
        assert got.shape == want.shape == (n, 10)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    comp = model._any["predict"]
    assert comp is not None and comp.transformations == 1


def test_a_binding_whose_buffers_exceed_the_machine_is_refused_before_allocating():
    N, M = be.symbolic_axis("N"), be.symbolic_axis("M")
    a = be.placeholder([N], dtype="float64", name="a")
    b = be.placeholder([M], dtype="float64", name="b")
    f = be.make_transformer("numpy").computation(be.sum(a * b, out_axes=()), a, b)
    assert f(np.ones(3), np.ones(4)) == 12.0
    with pytest.raises(FeedError, match=r"bind M = 3000000, N = 2000000, for which the "
                                        r"computation's buffers need .* GiB and this "
                                        r"machine has .*the largest value is Multiply_\d+ "
                                        r"\(N:N, M:M\) float64"):
        f(np.ones(2_000_000), np.ones(3_000_000))   # an outer product of 44 TiB
    assert f(np.ones(5), np.ones(4)) == 20.0 and f.plans == 2
