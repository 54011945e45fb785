"""Products with a short side in C (geon/transformers/numpy/skinny.py): the kernel
against float64 products over shapes, layouts and dtypes; np.matmul where it does not
apply; the generated code of a product with a short side, and a convolution over few
positions, against NumPy."""

import numpy as np
import pytest

import geon as be
from geon.transformers.numpy import compiled as ck
from geon.transformers.numpy import conv as nc
from geon.transformers.numpy import pointwise
from geon.transformers.numpy import skinny


@pytest.fixture
def kernels():
    if not ck.available() or skinny.kernels() is None:
        pytest.skip("no working C compiler")
    return skinny.kernels()


@pytest.fixture
def counted(kernels, monkeypatch):
    """The kernel calls made, by dtype."""
    calls = []
    wrapped = {dt: (lambda *a, _f=f, _dt=dt: (calls.append(_dt), _f(*a))[1])
               for dt, f in kernels.items()}
    monkeypatch.setattr(skinny, "_loaded", {where: wrapped for where in skinny._loaded})
    return calls


def _check(a, b, out, rtol):
    want = a.astype(np.float64) @ b.astype(np.float64)
    got = skinny.matmul(a, b, out)
    assert got is out
    np.testing.assert_allclose(out, want, rtol=rtol, atol=rtol * np.abs(want).max())


@pytest.mark.parametrize("dtype,rtol", [(np.float32, 2e-6), (np.float64, 1e-13)])
@pytest.mark.parametrize("short", [2, 3, 4, 5, 7, 8, 9, 16])
@pytest.mark.parametrize("k", [1, 7, 8, 33, 300])
def test_a_short_side_against_float64(short, k, dtype, rtol, counted):
    rng = np.random.default_rng(short * 1000 + k)
    long_ = 41  # not a multiple of the 3 rows taken at a time
    x = rng.standard_normal((short, k)).astype(dtype)
    W = rng.standard_normal((long_, k)).astype(dtype)
    _check(x, W.T, np.empty((short, long_), dtype), rtol)     # x @ W.T: a linear layer
    c = rng.standard_normal((k, short)).astype(dtype)
    _check(W, c, np.empty((long_, short), dtype), rtol)        # W @ c: few positions
    out = np.empty((long_, 2 * short), dtype)[:, ::2]          # a strided result
    _check(W, c, out, rtol)
    assert len(counted) == 3


def test_strided_rows_and_results(counted):
    rng = np.random.default_rng(1)
    big = rng.standard_normal((10, 50)).astype(np.float32)
    x = big[::3, 5:45]                                  # rows apart, unit stride along k
    W = rng.standard_normal((30, 60)).astype(np.float32)[:, 10:50]
    out = np.zeros((8, 30), np.float32)[::2]
    _check(x, W.T, out, 2e-6)
    _check(x[::-1], W.T, np.empty((4, 30), np.float32), 2e-6)   # negative row stride
    assert len(counted) == 2


def test_np_matmul_where_the_kernel_does_not_apply(counted):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 20)).astype(np.float32)
    W = rng.standard_normal((30, 20)).astype(np.float32)
    cases = [
        (x, W.T.astype(np.float64), np.empty((4, 30), np.float64)),    # mixed dtypes
        (x, np.ascontiguousarray(W.T), np.empty((4, 30), np.float32)), # rows along n
        (rng.standard_normal((17, 20)).astype(np.float32), W.T,
         np.empty((17, 30), np.float32)),                               # no short side
        (x.astype(np.int64), W.T.astype(np.int64), np.empty((4, 30), np.int64)),
        (x[:, ::2], W.T[::2], np.empty((4, 30), np.float32)),           # strided k
    ]
    for a, b, out in cases:
        np.testing.assert_allclose(skinny.matmul(a, b, out), a @ b, rtol=1e-5)
    y = np.empty((4, 30), np.float32)
    skinny.matmul(x, W.T, y, c_kernels=False)                # compiled=False: no C
    np.testing.assert_allclose(y, x @ W.T, rtol=1e-5)
    assert counted == []


def test_worth_it():
    assert skinny.worth_it((4, 4608), (4608, 512), np.float32)
    assert skinny.worth_it((512, 4608), (4608, 8), np.float32)
    assert not skinny.worth_it((1, 4608), (4608, 512), np.float32)     # sgemv is fast
    assert not skinny.worth_it((17, 4608), (4608, 512), np.float32)
    assert not skinny.worth_it((4, 64), (64, 64), np.float32)          # in cache
    assert not skinny.worth_it((4, 4608), (4608, 512), np.int32)


@pytest.mark.parametrize("compiled", [False, "auto"])
def test_a_linear_layer_at_a_small_batch(compiled, counted):
    rng = np.random.default_rng(3)
    W = rng.standard_normal((256, 512)).astype(np.float32)
    xv = rng.standard_normal((4, 512)).astype(np.float32)
    x = be.np.placeholder((4, 512), dtype=np.float32)
    y = be.np.matmul(x, be.np.transpose(be.np.constant(W)))
    comp = be.NumPyTransformer(compiled=compiled).computation(y, x)
    assert "_skinny(" in comp.source
    np.testing.assert_allclose(comp(xv), xv @ W.T, rtol=2e-5, atol=1e-4)
    assert len(counted) == (compiled is not False)


def test_a_convolution_over_few_positions(counted, monkeypatch):
    """resnet18's last stage at batch 2: 2 x 2 positions of 512 channels, its product by
    the short-side kernel where the 1 x 1 kernel is off (which takes such products
    first where their filter has 256 KB or more: tests/test_conv_epilogue.py)."""
    monkeypatch.setattr(pointwise, "MIN_WEIGHT_BYTES", 1 << 60)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 64, 2, 2))
    w = rng.standard_normal((128, 64, 3, 3))
    args = ((1, 1), ((1, 1), (1, 1)), (1, 1), 1)
    got, want = np.empty((2, 128, 2, 2)), np.empty((2, 128, 2, 2))
    nc.conv_forward(x, w, got, *args, nc.Workspace())
    nc.conv_forward(x, w, want, *args, nc.Workspace(direct=False))
    assert counted == [np.dtype(np.float64)]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
