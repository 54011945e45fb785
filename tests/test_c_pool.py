"""geon's C thread pool (geon/transformers/numpy/c_pool.py) and the kernels that cut
their work into parts on it: small_gemm's products, the im2col copy, the 1 x 1 kernels
and the max pooling kernel. Cut into parts (on 1 to 3 threads, every job however small)
they give the values of one call, bit for bit; the thread policy's count reaches the
pool; and the max pooling kernel gives NumPy's values, NaN and signed zeros included."""

import threading

import numpy as np
import pytest

from geon.op_graph import conv_math as cm
from geon.transformers import threads
from geon.transformers.numpy import c_pool, conv, im2col, pointwise, small_gemm
from geon.transformers.numpy import compiled as ck

pytestmark = pytest.mark.skipif(not ck.available(),
                                reason="no working C compiler for the C kernels")


def _gemm(a, b, out):
    assert small_gemm.matmul(a, b, out)
    return out


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [((), 64, 72, 200), ((), 40, 33, 20), ((), 9, 300, 7),
                                   ((3,), 64, 50, 40)], ids=str)
def test_products_cut_into_parts(shape, dtype, n):
    """By panels of columns (wide products), blocks of rows (narrow ones) or products
    of a batch: the values of one call."""
    rng = np.random.default_rng(1)
    lead, m, k, nn = shape
    a = rng.standard_normal(lead + (m, k)).astype(dtype)
    b = rng.standard_normal(lead + (k, nn)).astype(dtype)
    one = _gemm(a, b, np.empty(lead + (m, nn), dtype))
    with c_pool.forced(n):
        split = _gemm(a, b, np.full(lead + (m, nn), np.nan, dtype))
    np.testing.assert_array_equal(split, one)
    np.testing.assert_allclose(one, a @ b, rtol=1e-4 if dtype == np.float32 else 1e-12,
                               atol=1e-4 if dtype == np.float32 else 1e-12)


def test_a_bias_with_parts():
    """A product with its bias (the joined step's four arrays), cut into panels."""
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((16, 40)), rng.standard_normal((40, 100))
    bias = rng.standard_normal(100)
    fn = small_gemm.kernels()[np.dtype(np.float64)]
    one, split = np.empty((16, 100)), np.empty((16, 100))
    assert fn(((a, b, one, bias),)) == 0
    with c_pool.forced(2):
        assert fn(((a, b, split, bias),)) == 0
    np.testing.assert_array_equal(split, one)
    np.testing.assert_allclose(one, np.matmul(a, b) + bias, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", [
    (2, 8, (2, 2), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),
    (2, 5, (7, 33), (5, 3), (2, 3), ((2, 0), (1, 2)), (1, 1)),
    (1, 6, (11, 40), (3, 3), (1, 1), ((2, 2), (2, 2)), (2, 2)),
    (2, 5, (37,), (3,), (1,), ((1, 1),), (1,))], ids=str)
def test_im2col_by_blocks_of_channels(case):
    B, C, S, R, st, pads, dil = case
    x = np.random.default_rng(0).standard_normal((B, C) + S).astype(np.float32)
    P = tuple(cm.out_length(n, r, s, d, lo, hi)
              for n, r, s, d, (lo, hi) in zip(S, R, st, dil, pads))
    want = conv._im2col(x, R, P, st, pads, dil, 1, conv.Workspace(direct=False)).copy()
    for n in (2, 3):
        with c_pool.forced(n):
            got = conv._im2col(x, R, P, st, pads, dil, 1, conv.Workspace(direct=True))
        np.testing.assert_array_equal(got, want)


# (B, C, S, kernel, strides, pads, dilation)
POOLS = [
    (2, 3, (32, 32), (3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1)),   # resnet18's stem pool
    (1, 2, (9, 20), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),
    (2, 2, (7, 33), (5, 3), (2, 3), ((2, 0), (1, 2)), (1, 1)),    # strides, odd pads
    (1, 3, (11, 40), (3, 3), (1, 1), ((2, 2), (2, 2)), (2, 2)),   # dilated
    (3, 1, (4, 5), (4, 4), (1, 1), ((3, 3), (3, 3)), (1, 1)),     # mostly padding
    (2, 4, (70, 70), (2, 2), (2, 2), ((1, 1), (1, 1)), (1, 1)),   # rows past a vector
    (2, 5, (37,), (3,), (1,), ((1, 1),), (1,)),                   # 1-d
    (1, 4, (9,), (2,), (2,), ((0, 1),), (3,)),                    # 1-d, dilated
]


def _pool_out(S, R, st, pads, dil):
    return tuple(cm.out_length(n, r, s, d, lo, hi)
                 for n, r, s, d, (lo, hi) in zip(S, R, st, dil, pads))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", POOLS, ids=str)
def test_max_pool_kernel_gives_numpys_values(case, dtype):
    """Against NumPy's strided path (compiled=False), with NaN, infinities and signed
    zeros among the values: bit for bit, on one thread and cut into parts."""
    B, C, S, R, st, pads, dil = case
    rng = np.random.default_rng(5)
    x = rng.standard_normal((B, C) + S).astype(dtype)
    flat = x.reshape(-1)
    picks = rng.choice(flat.size, size=(4, max(1, flat.size // 9)), replace=True)
    flat[picks[0]] = np.nan
    flat[picks[1]] = -0.0
    flat[picks[2]] = 0.0
    flat[picks[3][: len(picks[3]) // 4]] = -np.inf
    P = _pool_out(S, R, st, pads, dil)
    want = np.empty((B, C) + P, dtype)
    conv.max_pool(x, want, R, st, pads, dil, conv.Workspace(direct=False))
    for n in (1, 3):
        got = np.full_like(want, 7.0)
        with c_pool.forced(n):
            conv.max_pool(x, got, R, st, pads, dil, conv.Workspace(direct=True))
        np.testing.assert_array_equal(got.view(f"u{got.itemsize}"),
                                      want.view(f"u{want.itemsize}"))


def test_max_pool_kernel_runs_where_it_applies(monkeypatch):
    """The kernel is called for float arrays (and not under compiled=False, nor for
    windows that tile the image, which NumPy does in long passes, nor for integers)."""
    calls = []
    real = im2col.max_pool
    monkeypatch.setattr(im2col, "max_pool", lambda *a: calls.append(a[1].dtype) or real(*a))
    x = np.random.default_rng(0).standard_normal((1, 2, 9, 9)).astype(np.float32)
    out = np.empty((1, 2, 5, 5), np.float32)
    args = ((3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1))
    conv.max_pool(x, out, *args, conv.Workspace(direct=True))
    assert calls == [np.float32]
    conv.max_pool(x, out, *args, conv.Workspace(direct=False))
    conv.max_pool(x, np.empty((1, 2, 3, 3), np.float32), (3, 3), (3, 3),
                  ((0, 0), (0, 0)), (1, 1), conv.Workspace(direct=True))
    assert calls == [np.float32]
    xi = (x * 10).astype(np.int32)
    conv.max_pool(xi, np.empty((1, 2, 5, 5), np.int32), *args, conv.Workspace(direct=True))
    assert calls == [np.float32, np.int32]   # refused inside: NumPy's path ran


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_pointwise_rows_cut_into_parts(dtype):
    """The dot-product form (few columns) and the wide form, in blocks of rows."""
    rng = np.random.default_rng(3)
    fns = pointwise.kernels()
    for B, C, K, P in [(2, 40, 70, 4), (2, 12, 50, 40)]:
        x = rng.standard_normal((B, C, P)).astype(dtype)
        w = rng.standard_normal((K, C, 1)).astype(dtype)
        bias = rng.standard_normal(K).astype(dtype)
        one = np.empty((B, K, P), dtype)
        run = pointwise.prepared_conv1x1(fns, x, w, one, bias, 0.0, np.inf)
        assert run(x, w, one, bias)
        for n in (2, 3):
            split = np.full_like(one, np.nan)
            with c_pool.forced(n):
                assert run(x, w, split, bias)
            np.testing.assert_array_equal(split, one)


def test_the_policy_count_reaches_the_pool(monkeypatch):
    """Every listener of the policy hears its count when it changes (the pool's setter
    is one of them)."""
    heard = []
    policy = threads.POLICY
    monkeypatch.setattr(threads, "_listeners", [])
    monkeypatch.setattr(policy, "threads", 2)
    threads.on_change(heard.append)
    assert heard == [2]
    monkeypatch.setattr(policy, "budget", 2)
    monkeypatch.setattr(policy, "_cpus", [0, 1])
    monkeypatch.setattr(policy, "_next", 0.0)
    monkeypatch.setattr(policy, "adaptive", True)
    monkeypatch.setattr(policy, "others_busy", lambda now: 2.0)   # both cores taken
    policy.refresh()
    assert policy.threads == 1 and heard == [2, 1]


def test_calls_from_several_threads_at_once():
    """Jobs from several Python threads at once: one holds the pool, the others run
    their parts on their own thread; every result is right."""
    rng = np.random.default_rng(7)
    a = rng.standard_normal((64, 96)).astype(np.float32)
    b = rng.standard_normal((96, 256)).astype(np.float32)
    want = _gemm(a, b, np.empty((64, 256), np.float32))
    outs = [np.empty((64, 256), np.float32) for _ in range(4)]
    errors = []

    def work(out):
        try:
            for _ in range(50):
                _gemm(a, b, out)
                np.testing.assert_array_equal(out, want)
        except Exception as e:   # pragma: no cover - reported below
            errors.append(e)
    with c_pool.forced(2):
        ts = [threading.Thread(target=work, args=(o,)) for o in outs]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    assert not errors


def test_empty_shapes():
    """Empty images, planes, filters and channels: nothing written, nothing crashes
    (each once divided by a part size of 0)."""
    ws = conv.Workspace(direct=True)
    out = np.full((0, 3, 4, 4), 1.0, np.float32)
    conv.max_pool(np.zeros((0, 3, 8, 8), np.float32), out, (3, 3), (2, 2),
                  ((1, 1), (1, 1)), (1, 1), ws)
    x = np.zeros((1, 3, 8, 0), np.float32)
    got = np.empty((1, 3, 4, 0), np.float32)
    conv.max_pool(x, got, (3, 1), (2, 2), ((1, 1), (0, 0)), (1, 1), ws)
    x = np.random.default_rng(0).standard_normal((2, 16, 8, 8)).astype(np.float32)
    y = np.empty((2, 0, 8, 8), np.float32)
    conv.conv_forward(x, np.zeros((0, 16, 1, 1), np.float32), y, (1, 1),
                      ((0, 0), (0, 0)), (1, 1), 1, ws)
    with c_pool.forced(2):
        conv.conv_forward(x, np.zeros((0, 16, 1, 1), np.float32), y, (1, 1),
                          ((0, 0), (0, 0)), (1, 1), 1, ws)
    cols = np.empty(0, np.float32)
    im2col.im2col(im2col.kernels(), np.zeros((2, 0, 5, 5), np.float32), cols, (3, 3),
                  (5, 5), (1, 1), ((1, 1), (1, 1)), (1, 1))
