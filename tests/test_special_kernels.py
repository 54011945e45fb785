"""The C loop of the NumPy code of erf (geon/transformers/numpy/special_kernels.py):
bitwise the NumPy code's values in float32, the C library's (within an ulp) in float64,
the NumPy code where the operands or the computation's mode do not allow it."""

import math

import numpy as np
import pytest

import geon as be
from geon.op_graph import special
from geon.transformers.numpy import code_table
from geon.transformers.numpy import compiled as ck
from geon.transformers.numpy import special_kernels as sk

SPECIAL = [np.nan, np.inf, -np.inf, 0.0, -0.0, 3.99, 4.0, 4.01, -4.5, 1e-30, -1e-38,
           0.5, -2.25, 1e4]


def _inputs(dtype):
    rng = np.random.default_rng(3)
    return np.concatenate([rng.standard_normal(5000) * 2.5, SPECIAL]).astype(dtype)


@pytest.fixture
def c_kernels():
    if not ck.available() or sk.kernels() is None:
        pytest.skip("no working C compiler")
    return sk.kernels()


def test_float32_is_bitwise_the_numpy_code(c_kernels):
    x = _inputs(np.float32)
    got, want = np.full_like(x, 7), np.full_like(x, 7)
    assert sk.erf(x, got) is got
    special.erf_rational(x, want)
    assert np.array_equal(got, want, equal_nan=True)
    assert np.array_equal(np.signbit(got), np.signbit(want))  # erf(-0) = -0
    inplace = x.copy()
    sk.erf(inplace, inplace)
    assert np.array_equal(inplace, want, equal_nan=True)


def test_float64_is_the_c_librarys(c_kernels):
    x = _inputs(np.float64)
    got = np.empty_like(x)
    sk.erf(x, got)
    want = np.array([math.erf(v) if not math.isnan(v) else math.nan for v in x])
    assert np.array_equal(got, want, equal_nan=True)
    series = special.erf_series(x)
    np.testing.assert_allclose(got, series, rtol=4e-15, atol=1e-300)


def test_the_numpy_code_runs_where_the_loop_cannot(c_kernels, monkeypatch):
    calls = []
    counted = {dt: (lambda *a, _f=f: (calls.append(1), _f(*a))[1])
               for dt, f in c_kernels.items()}
    monkeypatch.setattr(sk, "_loaded", {where: counted for where in sk._loaded})
    x = _inputs(np.float32)
    want = special.erf(x)
    cases = [(x[::2], np.empty(x[::2].shape, np.float32), True),   # strided operand
             (x, np.empty(x.shape, np.float64), True),             # another dtype
             (x.astype(np.float16), np.empty(x.shape, np.float16), True),
             (x, np.empty(x.shape, np.float32), False)]            # compiled=False
    for a, out, allowed in cases:
        sk.erf(a, out, allowed)
        np.testing.assert_allclose(out, special.erf(a).astype(out.dtype), rtol=1e-3)
    assert calls == []
    out = np.empty_like(x)
    sk.erf(x, out)
    assert calls == [1] and np.array_equal(out, want, equal_nan=True)


@pytest.mark.parametrize("compiled", [False, "auto"])
def test_a_computations_mode_decides(compiled, c_kernels, monkeypatch):
    """A GELU's erf runs the loop in the default mode, never under compiled=False;
    the values agree with the reference."""
    calls = []
    real = sk.erf
    monkeypatch.setitem(code_table.NUMPY_GLOBALS, "_erf",
                        lambda x, out, c: (calls.append(c), real(x, out, c))[1])
    xv = _inputs(np.float32)[:4096].reshape(64, 64)
    x = be.np.placeholder(xv.shape, dtype=np.float32)
    y = be.np.erf(x)
    got = be.NumPyTransformer(compiled=compiled).computation(y, x)(xv)
    assert calls == [compiled is not False]
    assert np.array_equal(got, special.erf(xv), equal_nan=True)
