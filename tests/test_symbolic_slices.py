"""Slices, indices and concatenation over symbolic lengths (issue 34): bounds relative
to the length (``x[1:-1]``, ``x[-1]``, ``x[::-2]``) are positions computed from the
binding; a slice of a symbolic length must fit it, which each call checks once per
binding (a ``FeedError`` naming the op, the key and the symbols), and what never fits is
an error when the graph is built. One computation for every length, in the NumPy
transformer, the reference evaluator and the PyTorch export."""

import numpy as np
import pytest

import geon as be
from geon.errors import AxisIndexError, FeedError
from geon.op_graph.symbols import Symbol, SymbolicLengthError, cut

N = Symbol("N")
RNG = np.random.default_rng(7)

#: keys of the leading dimension, with the smallest length each fits
KEYS = [(slice(1, None), 1), (slice(None, -1), 1), (slice(1, -1), 2),
        (slice(None, None, 2), 0), (slice(1, None, 3), 1), (slice(None, None, -1), 0),
        (slice(-2, None), 2), (slice(None, None, -2), 0), (slice(-1, 0, -1), 1),
        (slice(2, 5), 5), (slice(-3, -1), 3), (-1, 1), (0, 1), (2, 3), (-3, 3),
        # a step below zero with an explicit stop: that stop must be a position (>= 0)
        (slice(None, -3, -1), 3), (slice(-1, -4, -1), 4)]


def _bound(key, binding):
    def value(v):
        return v.evaluate(binding) if hasattr(v, "evaluate") else v
    if isinstance(key, slice):
        return slice(value(key.start), value(key.stop), key.step)
    return value(key)


@pytest.mark.parametrize("key,smallest", KEYS)
def test_cut_gives_pythons_slice_wherever_it_fits(key, smallest):
    for n in range(smallest, smallest + 6):
        new, length, needs = cut(key, N)
        binding = {"N": n}
        assert all(e.evaluate(binding) >= 0 for e in needs)
        got = np.arange(n)[_bound(new, binding)]
        np.testing.assert_array_equal(got, np.arange(n)[key])
        if length is not None:
            assert (length if isinstance(length, int) else length.evaluate(binding)) == \
                len(got)
    if smallest > 0:  # one shorter does not fit: some need fails
        assert any(e.evaluate({"N": smallest - 1}) < 0 for e in cut(key, N)[2])


def test_needs_decided_when_the_graph_is_built():
    assert cut(slice(None, None, 2), N)[2] == ()        # always fits: nothing to check
    assert cut(slice(N - 2, N), N)[1] == 2               # a fixed length from symbols
    with pytest.raises(ValueError, match="-2 >= 0 never holds"):
        cut(slice(3, 1), N)                              # Python gives []; refused
    x = be.np.placeholder((N, 3), dtype=np.float64, name="x")
    with pytest.raises(AxisIndexError, match=r"slice 3:1:None does not fit a dimension "
                                             r"of length N"):
        x[3:1]


def _positional_cases(x):
    return [x[1:-1], x[-1], x[::-2] * 2.0, x[1:, 1], x[:-1, ::2],
            be.np.concatenate([x, x[1:]], axis=0), be.np.concatenate([x[:1], x], axis=0)]


def _numpy_cases(X):
    return [X[1:-1], X[-1], X[::-2] * 2.0, X[1:, 1], X[:-1, ::2],
            np.concatenate([X, X[1:]], axis=0), np.concatenate([X[:1], X], axis=0)]


def test_numpy_family_slices_and_concatenation_over_a_symbolic_length():
    x = be.np.placeholder((N, 3), dtype=np.float64, name="x")
    outs = _positional_cases(x)
    assert outs[0].axes.lengths == (N - 2, 3) and outs[5].axes.lengths == (N * 2 - 1, 3)
    loss = be.np.sum(be.np.concatenate([x[1:] * x[:-1], x[::-1]], axis=0) ** 2)
    f = be.NumPyTransformer().computation(outs + [loss, be.deriv(loss, x)], x)
    for n in (2, 5, 9, 5):
        X = RNG.standard_normal((n, 3))
        got = f(X)
        want = _numpy_cases(X)
        want.append(np.sum(np.concatenate([X[1:] * X[:-1], X[::-1]]) ** 2))
        g = 2 * X                                     # d/dX of sum(X[::-1]**2)
        p = X[1:] * X[:-1]
        g[1:] += 2 * p * X[:-1]
        g[:-1] += 2 * p * X[1:]
        want.append(g)
        for a, b in zip(got, want):
            assert np.shape(a) == np.shape(b)
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13)
    assert f.transformations == 1 and f.plans == 3


def test_a_slice_that_does_not_fit_the_bound_length_is_a_feed_error_naming_it():
    x = be.np.placeholder((N, 3), dtype=np.float64, name="x")
    f = be.NumPyTransformer().computation(x[1:-1] + 1.0, x)
    np.testing.assert_array_equal(f(np.zeros((2, 3))), np.ones((0, 3)))  # it fits
    with pytest.raises(FeedError, match=r"SliceView .*built at .*test_symbolic_slices.py"
                                        r".* takes \[1:N - 1\] of a dimension of length "
                                        r"N, which needs N - 2 >= 0; the feeds give "
                                        r"N = 1"):
        f(np.zeros((1, 3)))
    g = be.NumPyTransformer().computation(x[4] * 2.0, x)
    np.testing.assert_array_equal(g(np.arange(15.0).reshape(5, 3)), [24.0, 26.0, 28.0])
    with pytest.raises(FeedError, match=r"takes \[4\] .* needs N - 5 >= 0; the feeds "
                                        r"give N = 4"):
        g(np.zeros((4, 3)))
    assert f.plans == 1 and g.plans == 1   # a binding refused is not planned
    # a step below zero with an explicit stop: at N = 2 the stop N - 3 would be -1, which
    # NumPy reads as "the last row" (an empty result); it is refused instead
    h = be.NumPyTransformer().computation(x[:-3:-1], x)
    X = np.arange(12.0).reshape(4, 3)
    np.testing.assert_array_equal(h(X), X[:-3:-1])
    with pytest.raises(FeedError, match=r"takes \[N - 1:N - 3:-1\] .* needs N - 3 >= 0; "
                                        r"the feeds give N = 2"):
        h(X[:2])


def test_axes_family_slices_concat_and_their_derivatives_over_a_symbolic_axis():
    Na = be.symbolic_axis("N", batch=True)
    C = be.Axis(3, "C")
    x = be.placeholder([Na, C], dtype="float64", name="x")
    w = be.Variable([C], initial_value=np.array([0.5, -1.0, 2.0]), dtype="float64",
                    name="w")
    head = be.slice_along_axis(x, Na, slice(None, -1))
    tail = be.slice_along_axis(x, Na, slice(1, None))
    assert head.axes.lengths == (N - 1, 3)
    last = be.slice_along_axis(x, Na, -1)
    joined = be.concat([x, tail], [Na, tail.axes[0]])
    assert joined.axes.lengths == (N * 2 - 1, 3)
    diff = be.cast_axes(tail, head.axes) - head
    loss = be.sum(be.square(diff * w), out_axes=()) + be.sum(last * w, out_axes=())
    tr = be.make_transformer("numpy")
    f = tr.computation([joined, loss, be.deriv(loss, x), be.deriv(loss, w)], x)
    wv = np.array([0.5, -1.0, 2.0])

    def numeric(X):
        d = (X[1:] - X[:-1]) * wv
        return np.sum(d ** 2) + np.sum(X[-1] * wv)

    for n in (2, 6):
        X = RNG.standard_normal((n, 3))
        j, l, gx, gw = f(X)
        np.testing.assert_allclose(j, np.concatenate([X, X[1:]]), rtol=0, atol=0)
        np.testing.assert_allclose(l, numeric(X), rtol=1e-12)
        num = np.zeros_like(X)   # central differences, float64
        for idx in np.ndindex(X.shape):
            e = np.zeros_like(X)
            e[idx] = 1e-6
            num[idx] = (numeric(X + e) - numeric(X - e)) / 2e-6
        np.testing.assert_allclose(gx, num, rtol=1e-6, atol=1e-7)
        d = X[1:] - X[:-1]
        np.testing.assert_allclose(gw, np.sum(2 * d * d * wv, axis=0) + X[-1],
                                   rtol=1e-12)
    assert f.transformations == 1 and f.plans == 2
    with pytest.raises(FeedError, match=r"needs N - 1 >= 0; the feeds give N = 0"):
        f(np.zeros((0, 3)))


def test_the_reference_evaluator_binds_and_checks_slices_too():
    x = be.np.placeholder((N, 3), dtype=np.float64, name="x")
    outs = _positional_cases(x)
    X = RNG.standard_normal((4, 3))
    for got, want in zip(be.evaluate(outs, {x: X}), _numpy_cases(X)):
        np.testing.assert_allclose(got, want, rtol=1e-15)
    with pytest.raises(FeedError, match=r"needs N - 2 >= 0; the feeds give N = 1"):
        be.evaluate(outs[0], {x: np.zeros((1, 3))})


def test_the_pytorch_export_binds_and_checks_slices():
    torch = pytest.importorskip("torch")
    from geon.transformers.torch import to_torch
    x = be.np.placeholder((N, 3), dtype=np.float64, name="x")
    outs = _positional_cases(x)
    loss = be.np.sum(be.np.concatenate([x[1:] * x[:-1], x[::-1]], axis=0) ** 2)
    module = to_torch(outs + [loss], x)
    ref = be.NumPyTransformer().computation(outs + [loss], x)
    for n in (3, 8, 2):
        X = RNG.standard_normal((n, 3))
        for a, b in zip(module(torch.tensor(X)), ref(X)):
            np.testing.assert_allclose(a.numpy(), b, rtol=1e-12, atol=1e-13)
    xt = torch.tensor(RNG.standard_normal((5, 3)), requires_grad=True)
    module(xt)[-1].backward()
    grad = be.NumPyTransformer().computation(be.deriv(loss, x), x)
    np.testing.assert_allclose(xt.grad.numpy(), grad(xt.detach().numpy()), rtol=1e-12)
    with pytest.raises(FeedError, match=r"needs N - 2 >= 0; the feeds give N = 1"):
        module(torch.zeros((1, 3), dtype=torch.float64))


def test_expressions_of_symbols_round_trip_through_a_document():
    import json
    Na = be.symbolic_axis("N", batch=True)
    C = be.Axis(3, "C")
    x = be.placeholder([Na, C], dtype="float64", name="x")
    tail = be.slice_along_axis(x, Na, slice(1, None))
    last = be.slice_along_axis(x, Na, -1)
    joined = be.concat([x, tail], [Na, tail.axes[0]])
    loss = be.sum(joined * joined, out_axes=()) + be.sum(last, out_axes=()) + \
        be.mean(x, out_axes=())
    results = [joined, last, loss, be.deriv(loss, x)]
    doc = be.serialize(results)
    axes = json.loads(doc)["axes"]
    assert axes["N[1::]"] == {"length": None, "symbol": "N - 1", "batch": True}
    assert axes["N+N[1::]"]["symbol"] == "N*2 - 1"
    loaded = be.deserialize_graph(doc)
    assert loaded.results[0].axes.lengths == (N * 2 - 1, 3)
    want = be.make_transformer("numpy").computation(results, x)
    got = be.make_transformer("numpy").computation(loaded.results, loaded.op("x"))
    for n in (1, 4):
        X = RNG.standard_normal((n, 3))
        for a, b in zip(got(X), want(X)):
            np.testing.assert_array_equal(a, b)
    with pytest.raises(FeedError, match=r"needs N - 1 >= 0; the feeds give N = 0"):
        got(np.zeros((0, 3)))      # the loaded slice checks its fit too
    sums = "(" + " + ".join("abcdefghijklmnopqrstuvwxyz") + ")"
    for bad in ("N**2", "__import__('os').getcwd()", "N // T", "(" * 600 + "N" + ")" * 600,
                "N - 1.5", "*".join([sums] * 6), "-" * 150 + "N"):
        hostile = json.loads(doc)
        hostile["axes"]["N[1::]"]["symbol"] = bad
        with pytest.raises(be.SerializationError, match=r"axes\['N\[1::\]'\].symbol"):
            be.deserialize_graph(json.dumps(hostile))


def test_convolution_and_pooling_over_symbolic_spatial_lengths_match_pytorch():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    H, W = Symbol("H"), Symbol("W")
    r = np.random.default_rng(3)
    w1, w2, w3 = (r.standard_normal(s) for s in ((4, 3, 3, 3), (6, 2, 3, 3), (3, 4, 2, 2)))
    x = be.np.placeholder((2, 3, H, W), dtype=np.float64, name="x")
    c1 = be.np.conv(x, be.np.constant(w1), padding=1)
    c2 = be.np.conv(c1, be.np.constant(w2), stride=2, padding=1, dilation=2, groups=2)
    outs = [c1, c2, be.np.max_pool(x, 2), be.np.max_pool(c1, 3, stride=2, padding=1),
            be.np.avg_pool(x, 3, stride=2, padding=1, count_include_pad=True),
            be.np.avg_pool(x, 3, stride=2, padding=1, count_include_pad=False),
            be.np.conv_transpose(x, be.np.constant(w3), stride=2),
            be.np.conv(x, be.np.constant(w1), padding="same", dilation=2)]
    loss = sum(be.np.sum(o * o) for o in outs)
    f = be.NumPyTransformer().computation(outs + [be.deriv(loss, x)], x)
    for h, w in ((7, 9), (8, 8), (5, 12)):
        X = r.standard_normal((2, 3, h, w))
        xt = torch.tensor(X, requires_grad=True)
        t1 = F.conv2d(xt, torch.tensor(w1), padding=1)
        t2 = F.conv2d(t1, torch.tensor(w2), stride=2, padding=1, dilation=2, groups=2)
        want = [t1, t2, F.max_pool2d(xt, 2), F.max_pool2d(t1, 3, 2, 1),
                F.avg_pool2d(xt, 3, 2, 1, count_include_pad=True),
                F.avg_pool2d(xt, 3, 2, 1, count_include_pad=False),
                F.conv_transpose2d(xt, torch.tensor(w3), stride=2),
                F.conv2d(xt, torch.tensor(w1), padding="same", dilation=2)]
        sum((o * o).sum() for o in want).backward()
        got = f(X)
        for a, b in zip(got, want + [xt.grad]):
            np.testing.assert_allclose(a, b.detach().numpy(), rtol=1e-10, atol=1e-10)
    assert f.transformations == 1 and f.plans == 3
    with pytest.raises(FeedError, match=r"windows of kernel 3, stride 2, dilation 2 .* "
                                        r"needs .* >= 0; the feeds give H = 2"):
        f(r.standard_normal((2, 3, 2, 8)))   # too short for c2's dilated kernel
    with pytest.raises(SymbolicLengthError, match="'same' with stride 2 over a length H"):
        be.np.conv(x, be.np.constant(w1), padding="same", stride=2)
    # dilated taps can all skip the input (kernel 2, dilation 3, padding 1 at H = 1):
    # with a symbolic length that is refused rather than checked per length
    with pytest.raises(SymbolicLengthError, match=r"padding \(1, 1\) with kernel 2 and "
                                                  r"dilation 3 over spatial dimension 0"):
        be.np.max_pool(x, 2, stride=1, padding=1, dilation=3)


def test_the_pytorch_export_runs_convolution_and_pooling_over_symbolic_spatial_lengths():
    torch = pytest.importorskip("torch")
    from geon.transformers.torch import to_torch
    H, W = Symbol("H"), Symbol("W")
    w1 = RNG.standard_normal((4, 3, 3, 3))
    x = be.np.placeholder((2, 3, H, W), dtype=np.float64, name="x")
    c1 = be.np.conv(x, be.np.constant(w1), padding=1, stride=2)
    outs = [c1, be.np.max_pool(c1, 2),
            be.np.avg_pool(x, 3, stride=2, padding=1, count_include_pad=False)]
    module = to_torch(outs, x)
    ref = be.NumPyTransformer().computation(outs, x)
    for h, w in ((7, 9), (8, 8), (4, 13)):
        X = RNG.standard_normal((2, 3, h, w))
        for a, b in zip(module(torch.tensor(X)), ref(X)):
            np.testing.assert_allclose(a.numpy(), b, rtol=1e-12, atol=1e-13)


def test_forward_mode_and_hessian_vector_products_through_symbolic_slices():
    Na = be.symbolic_axis("N", batch=True)
    C = be.Axis(3, "C")
    x = be.placeholder([Na, C], dtype="float64", name="x")
    t = be.placeholder([Na, C], dtype="float64", name="t")
    wv = np.array([0.5, -1.0, 2.0])
    w = be.Variable([C], initial_value=wv, dtype="float64", name="w")
    tail = be.slice_along_axis(x, Na, slice(1, None))
    loss = be.sum(be.square(be.tanh(x * w)), out_axes=()) + \
        be.sum(be.exp(tail * w), out_axes=())
    v = np.array([0.3, 0.2, -0.1])
    f = be.make_transformer("numpy").computation(
        [loss, be.jvp(loss, x, t), be.hvp(loss, w, v)], x, t)

    def value(X, W):
        return np.sum(np.tanh(X * W) ** 2) + np.sum(np.exp(X[1:] * W))

    def grad_w(X, W):  # central differences of the loss, per weight
        return np.array([(value(X, W + e) - value(X, W - e)) / 2e-6
                         for e in np.eye(3) * 1e-6])
    for n in (2, 6):
        X, T = RNG.standard_normal((n, 3)), RNG.standard_normal((n, 3))
        l, jx, hw = f(X, T)
        np.testing.assert_allclose(l, value(X, wv), rtol=1e-12)
        np.testing.assert_allclose(jx, (value(X + 1e-6 * T, wv) - value(X - 1e-6 * T, wv))
                                   / 2e-6, rtol=1e-6)
        np.testing.assert_allclose(hw, (grad_w(X, wv + 1e-4 * v) - grad_w(X, wv - 1e-4 * v))
                                   / 2e-4, rtol=1e-4, atol=1e-5)
    assert f.transformations == 1


def test_symbolic_bounds_of_a_fixed_axis_in_the_axes_family():
    T = be.symbolic_axis("T")
    F = be.Axis(10, "F")
    x = be.placeholder([F], dtype="float64", name="x")
    t = be.placeholder([T], dtype="float64", name="t")
    head = be.slice_along_axis(x, F, slice(None, T.length))     # x[:T], T of the feeds
    last = be.slice_along_axis(x, F, T.length - 1)               # x[T - 1]
    assert head.axes.lengths == (T.length,) and last.axes.lengths == ()
    f = be.NumPyTransformer().computation([be.sum(head * 2.0), last, be.sum(t)], x, t)
    X = RNG.standard_normal(10)
    for n in (1, 4, 10):
        got = f(X, np.ones(n))
        np.testing.assert_allclose(got[0], 2 * X[:n].sum(), rtol=1e-12)
        assert got[1] == X[n - 1] and got[2] == n
    with pytest.raises(FeedError, match=r"takes \[T - 1\] of a dimension of length 10, "
                                        r"which needs -T \+ 10 >= 0; the feeds give T = 11"):
        f(X, np.ones(11))
    with pytest.raises(AxisIndexError, match=r"the bound -T is never a position .* write "
                                             r"10 - T to count from the end"):
        be.slice_along_axis(x, F, slice(-T.length, None))
