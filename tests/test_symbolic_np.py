"""The NumPy family over symbolic lengths (issue 34): ``be.np`` placeholders with a
symbolic dimension, broadcasting, matmul, reductions (``mean`` divides by the count
bound at the call), reshapes with ``-1``, convolution and pooling, basic slicing of the
fixed dimensions (slices of symbolic ones: test_symbolic_slices.py), and derivatives; one computation for every length."""

import numpy as np
import pytest

import geon as be
from geon.errors import AxisMismatchError
from geon.op_graph.symbols import (Symbol, SymbolicLengthError, broadcast_lengths,
                                   exact_quotient)

N, T = Symbol("N"), Symbol("T")


def test_exact_quotient_and_broadcast_lengths():
    assert exact_quotient(N * T * 32, N * 32) == T
    assert exact_quotient(N * 32 + 64, 8) == N * 4 + 8
    assert exact_quotient(64, 8) == 8
    for a, b in ((N * T + 1, N), (N * 3, 2), (N, T), (N, N + 1), (7, 2)):
        with pytest.raises(SymbolicLengthError):
            exact_quotient(a, b)
    assert broadcast_lengths((N, 1, 3), (4, 3)) == (N, 4, 3)
    assert broadcast_lengths((N, 3), (N, 1), ()) == (N, 3)
    with pytest.raises(SymbolicLengthError, match="broadcast only if equal"):
        broadcast_lengths((N, 3), (5, 3))
    with pytest.raises(ValueError):
        broadcast_lengths((2, 3), (5, 3))


def test_a_cnn_over_a_symbolic_batch_matches_pytorch_values_and_gradients():
    torch = pytest.importorskip("torch")
    r = np.random.default_rng(0)
    wc, bc, wf = r.standard_normal((8, 3, 3, 3)), r.standard_normal(8), \
        r.standard_normal((128, 5))
    x = be.np.placeholder((N, 3, 8, 8), dtype=np.float64, name="x")
    c = be.np.conv(x, be.np.constant(wc), padding=1) + \
        be.np.reshape(be.np.constant(bc), (8, 1, 1))
    p = be.np.max_pool(be.np.maximum(c, 0.0), 2)
    y = be.np.reshape(p, (N, -1)) @ be.np.constant(wf)
    out = [y, be.np.log_softmax(y, axis=-1), be.np.concatenate([y, y], axis=1), y[:, 1:3]]
    loss = be.np.mean(y * y)
    f = be.NumPyTransformer().computation(out + [loss, be.deriv(loss, x)], x)
    for n in (1, 4, 2):
        X = r.standard_normal((n, 3, 8, 8))
        xt = torch.tensor(X, requires_grad=True)
        ct = torch.nn.functional.conv2d(xt, torch.tensor(wc), padding=1) + \
            torch.tensor(bc).reshape(8, 1, 1)
        yt = torch.nn.functional.max_pool2d(torch.relu(ct), 2).reshape(n, -1) @ \
            torch.tensor(wf)
        lt = (yt * yt).mean()
        lt.backward()
        want = [yt, torch.log_softmax(yt, -1), torch.cat([yt, yt], 1), yt[:, 1:3], lt,
                xt.grad]
        got = f(X)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b.detach().numpy(), rtol=1e-10, atol=1e-12)
    assert f.transformations == 1 and f.plans == 3   # one memory plan per batch size


def test_reshapes_reductions_and_broadcasts_over_symbolic_lengths():
    x = be.np.placeholder((N, T, 6), dtype=np.float64, name="x")
    heads = be.np.reshape(x, (N, T, 2, 3))
    back = be.np.reshape(be.np.transpose(heads, (0, 2, 1, 3)), (N * 2, -1, 3))
    assert back.axes.lengths == (N * 2, T, 3)
    flat = be.np.reshape(x, (-1, 6))
    assert flat.axes.lengths == (N * T, 6)
    m = be.np.mean(x, axis=(0, 1))
    s = be.np.sum(x * be.np.constant(np.arange(6.0)), axis=-1, keepdims=True)
    f = be.NumPyTransformer().computation([back, flat, m, s, be.np.mean(x)], x)
    for n, t in ((2, 5), (1, 1), (3, 2)):
        X = np.random.default_rng(n).standard_normal((n, t, 6))
        got = f(X)
        want = [X.reshape(n, t, 2, 3).transpose(0, 2, 1, 3).reshape(n * 2, -1, 3),
                X.reshape(-1, 6), X.mean(axis=(0, 1)),
                (X * np.arange(6.0)).sum(-1, keepdims=True), X.mean()]
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def test_what_is_not_decidable_at_build_time_is_a_clear_error():
    x = be.np.placeholder((N, 6), dtype=np.float64, name="x")
    with pytest.raises(AxisMismatchError, match=r"could not be broadcast .*broadcast only "
                                                r"if equal"):
        x + be.np.zeros((5, 6))
    with pytest.raises(be.AxisIndexError, match="slice 5:2:None does not fit a "
                                                "dimension of length N"):
        x[5:2]    # (slices that fit some lengths: tests/test_symbolic_slices.py)
    with pytest.raises(be.ArgumentError, match="cannot reshape"):
        be.np.reshape(x, (4, -1))


def test_mean_keeps_a_float16_sum_and_reshape_takes_a_bare_symbolic_length():
    x = be.np.placeholder((N, 3), dtype=np.float16, name="x")
    m = be.np.mean(x)
    assert m.dtype == np.float16   # as NumPy's mean of float16
    flat = be.np.reshape(x, N * 3)
    assert flat.axes.lengths == (N * 3,)
    f = be.NumPyTransformer().computation([m, flat], x)
    X = np.arange(6, dtype=np.float16).reshape(2, 3)
    got = f(X)
    assert got[0] == X.mean() and got[0].dtype == np.float16
    np.testing.assert_array_equal(got[1], X.ravel())
