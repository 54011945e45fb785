"""The Simple-Axes family and the layout pass: sample axis first or last, same results."""

import re

import numpy as np
import pytest

import geon as be
from geon.op_graph.coercion import family
from geon.transformers.passes.layout import LayoutPass, preferred_axes

RNG = np.random.default_rng(7)
W1, B1 = RNG.standard_normal((5, 6)) * 0.4, RNG.standard_normal(6) * 0.1
W2, B2 = RNG.standard_normal((6, 3)) * 0.4, RNG.standard_normal(3) * 0.1
X, Y = RNG.standard_normal((8, 5)), RNG.standard_normal((8, 3))
PREFERENCES = [None, "first", "last"]


def simple_mlp():
    """A two-layer MLP in the Simple-Axes family: one training step."""
    N = be.simple.sample_axis(8)
    x = be.simple.placeholder((5,), sample=N, dtype=np.float64, name="x")
    y = be.simple.placeholder((3,), sample=N, dtype=np.float64, name="y")
    w1 = be.simple.variable(W1, name="w1")
    b1 = be.simple.variable(B1, name="b1")
    w2 = be.simple.variable(W2, name="w2")
    b2 = be.simple.variable(B2, name="b2")
    h = be.np.tanh(x @ w1 + b1)
    p = h @ w2 + b2
    loss = be.simple.sample_mean(be.np.sum(be.np.square(p - y), axis=-1))
    grads = be.deriv(loss, [w1, b1, w2, b2])
    updates = [be.SetItem(v, v - 0.1 * g) for v, g in zip([w1, b1, w2, b2], grads)]
    return [loss, p, grads[0]] + updates, [x, y], [w1, w2]


def axes_mlp():
    """The same MLP in the Axes family (the sample axis last, as users often write)."""
    F, H, K = be.Axis(5, "F"), be.Axis(6, "H"), be.Axis(3, "K")
    N = be.Axis(8, "N", batch=True)
    x = be.placeholder([N, F], dtype=np.float64, name="x")
    y = be.placeholder([N, K], dtype=np.float64, name="y")
    w1 = be.Variable([F, H], initial_value=W1, dtype=np.float64, name="w1")
    b1 = be.Variable([H], initial_value=B1, dtype=np.float64, name="b1")
    w2 = be.Variable([H, K], initial_value=W2, dtype=np.float64, name="w2")
    h = be.tanh(be.dot(w1, x) + b1)
    p = be.dot(w2, h)
    loss = be.mean(be.sum((p - y) * (p - y), reduction_axes=[K]), out_axes=())
    grads = be.deriv(loss, [w1, w2])
    updates = [be.SetItem(v, v - 0.1 * g) for v, g in zip([w1, w2], grads)]
    return [loss, p, grads[0]] + updates, [x, y], [w1, w2]


def train(model, preference, steps=3):
    results, params, weights = model()
    t = be.NumPyTransformer(sample_axis=preference)
    step = t.computation(results, *params)
    outs = [step(X, Y)[:3] for _ in range(steps)]
    return outs, [t.state[w].copy() for w in weights], step


@pytest.mark.parametrize("model", [simple_mlp, axes_mlp])
def test_both_preferences_give_the_same_results(model):
    runs = {p: train(model, p) for p in PREFERENCES}
    base_outs, base_weights, _ = runs[None]
    for p in ("first", "last"):
        outs, weights, _ = runs[p]
        for step_base, step_p in zip(base_outs, outs):
            for a, b in zip(step_base, step_p):
                assert a.shape == b.shape
                np.testing.assert_allclose(b, a, rtol=1e-13, atol=1e-15)
        for a, b in zip(base_weights, weights):
            np.testing.assert_allclose(b, a, rtol=1e-13, atol=1e-15)
    loss0 = base_outs[0][0]
    h = np.tanh(X @ W1 + B1)
    expected = np.mean(np.sum((h @ W2 + (B2 if model is simple_mlp else 0) - Y) ** 2, -1))
    assert np.isclose(loss0, expected, rtol=1e-12)
    assert base_outs[-1][0] < loss0                         # the updates ran


def gemm_shapes(source):
    """The shapes of the matmul results in generated code, in order."""
    shapes = {}
    for m in re.finditer(r"(\w+) = (?:arena\d+\[:\d+\]\.view\(np\.\w+\)\.reshape|_empty)"
                         r"\(\(([\d, ]+)\)", source):
        shapes[m.group(1)] = tuple(int(n) for n in m.group(2).split(",") if n.strip())
    found = []
    for line in source.splitlines():
        m = re.search(r"np\.matmul\([^)]*out=(\w+)\)", line)
        if m and "# Gemm" in line:  # (sums are products with a row of ones too)
            found.append(shapes[m.group(1)])
    return found


@pytest.mark.parametrize("model", [simple_mlp, axes_mlp])
def test_the_generated_code_shows_the_layout(model):
    first = gemm_shapes(train(model, "first", 1)[2].source)
    last = gemm_shapes(train(model, "last", 1)[2].source)
    # The forward layers' products: (samples, units) first, (units, samples) last.
    assert first[0] == (8, 6) and last[0] == (6, 8)
    assert any(s[0] == 8 for s in first) and all(s != (8, 6) for s in last[:2])


def test_the_layout_pass_sits_between_simplify_and_lower():
    names = [p.name for p in be.NumPyTransformer(sample_axis="last").passes()]
    assert names[:3] == ["simplify", "layout", "lower"]
    assert "layout" not in [p.name for p in be.NumPyTransformer().passes()]

    class Last(be.NumPyTransformer):
        sample_axis = "last"                                # a transformer's declaration

    assert Last().sample_axis == "last" and Last(sample_axis="first").sample_axis == "first"
    with pytest.raises(ValueError, match="sample_axis"):
        be.NumPyTransformer(sample_axis="middle")
    with pytest.raises(ValueError, match="sample_axis"):
        LayoutPass("middle")


def test_preferred_axes_with_a_recurrent_axis():
    N = be.Axis(2, "N", batch=True)
    T = be.Axis(3, "T", recurrent=True)
    F, G = be.Axis(4, "F"), be.Axis(5, "G")
    axes = be.Axes(F, T, G, N)
    assert preferred_axes(axes, "first").names == ("N", "T", "F", "G")
    assert preferred_axes(axes, "last").names == ("F", "G", "T", "N")


@pytest.mark.parametrize("preference", PREFERENCES)
def test_recurrent_axis_and_feature_ops(preference):
    N = be.simple.sample_axis(2)
    T = be.simple.recurrent_axis(3)
    x = be.simple.placeholder((4,), sample=N, recurrent=T, dtype=np.float64, name="x")
    assert family(x) == "simple" and be.simple.feature_shape(x) == (4,)
    assert be.simple.sample_axes(x).names == ("N", "T")
    w = be.simple.variable(np.arange(8.0).reshape(4, 2) / 8, name="w")
    h = be.np.tanh(x @ w)                                    # (N, T, 2)
    pooled = be.np.max(h, axis=-1)                           # (N, T)
    first = h[0]                                             # features only: h[..., 0]
    total = be.simple.sample_sum(be.np.sum(h))               # a scalar
    assert h.axes.names == ("N", "T", "-1") and pooled.axes.names == ("N", "T")
    comp = be.NumPyTransformer(sample_axis=preference).computation(
        [h, pooled, first, total], x)
    V = np.linspace(-1, 1, 24).reshape(2, 3, 4)
    H = np.tanh(V @ (np.arange(8.0).reshape(4, 2) / 8))
    got = comp(V)
    np.testing.assert_allclose(got[0], H, rtol=1e-14)
    np.testing.assert_allclose(got[1], H.max(-1), rtol=1e-14)
    np.testing.assert_allclose(got[2], H[..., 0], rtol=1e-14)
    np.testing.assert_allclose(got[3], H.sum(), rtol=1e-13)


def test_from_axes_and_errors():
    N = be.Axis(4, "N", batch=True)
    C, D = be.Axis(3, "C"), be.Axis(2, "D")
    xa = be.placeholder([C, N, D], name="xa")
    xs = be.simple.from_axes(xa, [D, C])
    assert xs.axes.names == ("N", "-2", "-1") and be.simple.feature_shape(xs) == (2, 3)
    A = np.arange(24.0).reshape(3, 4, 2)
    got = be.NumPyTransformer().computation(xs, xa)(A)
    assert np.array_equal(got, A.transpose(1, 2, 0))
    with pytest.raises(be.AxisMismatchError, match="sample"):
        be.simple.placeholder((3,), sample=C)
    with pytest.raises(be.AxisMismatchError, match="does not order"):
        be.simple.from_axes(xa, [C])
    assert np.isclose(be.evaluate(be.simple.sample_mean(be.np.sum(xs)), feeds={xa: A}),
                      A.sum() / 4)
