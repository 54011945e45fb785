"""Layer and batch normalization: values against PyTorch, running statistics, and
float64 central-difference gradients in training and inference modes."""

import numpy as np
import pytest

import geon as be
from gradcheck import gradcheck

N, C, H, W = be.Axis(4, "N"), be.Axis(3, "C"), be.Axis(5, "H"), be.Axis(2, "W")
RNG = np.random.default_rng(0)
X = RNG.normal(2.0, 3.0, (4, 3, 5, 2))
G, B = RNG.normal(size=3), RNG.normal(size=3)
RM, RV = RNG.normal(size=3), RNG.uniform(0.5, 2.0, size=3)


def _torch():
    return pytest.importorskip("torch", reason="torch is not installed (PyTorch "
                                               "reference for normalization)")


def _tol(dtype):
    return dict(rtol=1e-5, atol=1e-5) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layer_norm_matches_torch(dtype):
    torch = _torch()
    x = be.np.placeholder(X.shape, dtype=dtype)
    w = be.np.placeholder((5, 2), dtype=dtype)
    b = be.np.placeholder((5, 2), dtype=dtype)
    y = be.np.layer_norm(x, (5, 2), w, b, eps=1e-4)
    Wt, Bt = RNG.normal(size=(5, 2)), RNG.normal(size=(5, 2))
    args = [a.astype(dtype) for a in (X, Wt, Bt)]
    got = be.NumPyTransformer().computation(y, x, w, b)(*args)
    want = torch.nn.functional.layer_norm(*(torch.from_numpy(a) for a in args[:1]), (5, 2),
                                          torch.from_numpy(args[1]), torch.from_numpy(args[2]),
                                          eps=1e-4).numpy()
    assert got.dtype == dtype
    np.testing.assert_allclose(got, want, **_tol(dtype))
    # The Axes family, normalizing over (H, W), agrees.
    xa = be.placeholder([N, C, H, W], dtype=dtype)
    ga, ba = be.placeholder([H, W], dtype=dtype), be.placeholder([H, W], dtype=dtype)
    ya = be.layer_norm(xa, ga, ba, eps=1e-4)
    np.testing.assert_allclose(be.NumPyTransformer().computation(ya, xa, ga, ba)(*args),
                               want, **_tol(dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_matches_torch_and_updates_running_stats(dtype, training):
    torch = _torch()
    x = be.np.placeholder(X.shape, dtype=dtype)
    rm = be.np.variable(RM.astype(dtype), trainable=False)
    rv = be.np.variable(RV.astype(dtype), trainable=False)
    y, updates = be.np.batch_norm(x, rm, rv, G.astype(dtype), B.astype(dtype),
                                  training=training, momentum=0.2, eps=1e-3)
    assert len(updates) == (2 if training else 0)
    t = be.NumPyTransformer()
    step = t.computation([y] + updates, x)
    read = t.computation([rm, rv])
    ty = [torch.from_numpy(a.astype(dtype)) for a in (RM, RV)]
    for call in range(2):  # the second call sees the updated running statistics
        got = step(X.astype(dtype))[0]
        want = torch.nn.functional.batch_norm(
            torch.from_numpy(X.astype(dtype)), ty[0], ty[1], torch.from_numpy(G.astype(dtype)),
            torch.from_numpy(B.astype(dtype)), training=training, momentum=0.2, eps=1e-3)
        np.testing.assert_allclose(got, want.numpy(), **_tol(dtype))
        for mine, theirs in zip(read(), ty):
            np.testing.assert_allclose(mine, theirs.numpy(), **_tol(dtype))


def test_axes_batch_norm_running_stats_and_inference():
    x = be.placeholder([N, C, H, W], dtype=np.float64)
    rm = be.Variable([C], initial_value=RM, dtype=np.float64, trainable=False)
    rv = be.Variable([C], initial_value=RV, dtype=np.float64, trainable=False)
    g = be.constant(G, axes=[C], dtype=np.float64)
    b = be.constant(B, axes=[C], dtype=np.float64)
    y, updates = be.batch_norm(x, g, b, rm, rv, momentum=0.1)
    t = be.NumPyTransformer()
    got = t.computation([y] + updates, x)(X)[0]
    mean, var = X.mean(axis=(0, 2, 3)), X.var(axis=(0, 2, 3))
    sl = (None, slice(None), None, None)
    want = (X - mean[sl]) / np.sqrt(var[sl] + 1e-5) * G[sl] + B[sl]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    n = 4 * 5 * 2
    new_rm, new_rv = t.computation([rm, rv])()
    np.testing.assert_allclose(new_rm, 0.9 * RM + 0.1 * mean, rtol=1e-13)
    np.testing.assert_allclose(new_rv, 0.9 * RV + 0.1 * var * n / (n - 1), rtol=1e-13)
    yi, none = be.batch_norm(x, g, b, rm, rv, training=False)  # reads the stored stats
    assert none == []
    got = t.computation(yi, x)(X)
    want = (X - new_rm[sl]) / np.sqrt(new_rv[sl] + 1e-5) * G[sl] + B[sl]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_layer_norm_gradients():
    r = gradcheck(lambda x, g, b: be.layer_norm(x, g, b, axes=[H, W]),
                  [([N, C, H, W], X), ([H, W], RNG.normal(size=(5, 2))),
                   ([W], RNG.normal(size=2))])
    assert r.ok, str(r)


@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_gradients(training):
    def build(x, g, b, rm, rv):
        return be.batch_norm(x, g, b, rm, rv, training=training)[0]
    r = gradcheck(build, [([N, C, H, W], X), ([C], G), ([C], B), ([C], RM), ([C], RV)],
                  wrt=[0, 1, 2] if training else [0, 1, 2, 3, 4])
    assert r.ok, str(r)


def test_layer_norm_second_order():
    x = be.placeholder([C, H], dtype=np.float64)
    v = be.placeholder([C, H], dtype=np.float64)
    g = be.deriv(be.sum(be.layer_norm(x, axes=[H]) ** 3, out_axes=()), x)
    hv = be.deriv(be.sum(g * v, out_axes=()), x)
    f = be.NumPyTransformer().computation([g, hv], x, v)
    X0, V = RNG.normal(size=(3, 5)), RNG.normal(size=(3, 5))
    eps = 1e-5
    numeric = (f(X0 + eps * V, V)[0] - f(X0 - eps * V, V)[0]) / (2 * eps)
    np.testing.assert_allclose(f(X0, V)[1], numeric, rtol=1e-6, atol=1e-7)


def test_bad_axes_are_named():
    x = be.placeholder([N, C])
    with pytest.raises(be.AxisMismatchError, match="H:5"):
        be.layer_norm(x, axes=[H])
    with pytest.raises(be.AxisMismatchError, match="normalized_shape"):
        be.np.layer_norm(be.np.placeholder((2, 3)), (2,))
    with pytest.raises(be.AxisMismatchError, match="running_mean"):
        be.np.batch_norm(be.np.placeholder((2, 3)), be.np.variable(np.zeros(4)),
                         be.np.variable(np.ones(3)))
