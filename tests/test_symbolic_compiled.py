"""The compiled (C) path over symbolic lengths (issue 34): a fused group whose symbolic
lengths are its rows compiles once, and its function takes the count of elements or
rows as an argument, computed from the binding by the calling code; the choices made by
size (fusing, tiling, threads) take the transformer's ``size_hints``. The results equal
those of the fixed-length compiled computation of each length, bit for bit."""

import numpy as np
import pytest

import geon as be
from geon.transformers.numpy import compiled as ck

pytestmark = pytest.mark.skipif(not ck.available(),
                                reason="no working C compiler for the compiled path")
RNG = np.random.default_rng(11)
W = RNG.standard_normal((64, 512))
B = RNG.standard_normal(512)


def _graph(n_axis):
    D, H = be.Axis(64, "D"), be.Axis(512, "H")
    x = be.placeholder([n_axis, D], dtype="float64", name="x")
    w = be.Variable([D, H], initial_value=W, dtype="float64", name="w")
    b = be.Variable([H], initial_value=B, dtype="float64", name="b")
    h = be.tanh(be.dot(x, w) + b)                      # a bias read through a view
    y = be.sigmoid(h) * h + be.exp(-h * h)
    loss = be.sum(y, out_axes=())
    return x, [y, be.sum(y * y, reduction_axes=[H]), loss, be.deriv(loss, w)]


@pytest.mark.parametrize("compiled", [True, "auto"])
def test_a_symbolic_computation_compiles_its_groups_once_for_every_length(compiled):
    x, results = _graph(be.symbolic_axis("N", batch=True))
    f = be.make_transformer("numpy", compiled=compiled, size_hints={"N": 256}) \
        .computation(results, x)
    assert "# compiled:" in f.source and ", 0, N)" in f.source   # the rows: N
    for n in (1, 7, 300, 7):
        X = RNG.standard_normal((n, 64))
        fx, fixed = _graph(be.Axis(n, "N", batch=True))
        want = be.make_transformer("numpy", compiled=True).computation(fixed, fx)(X)
        for a, b in zip(f(X), want):
            assert np.shape(a) == np.shape(b)
            np.testing.assert_array_equal(a, b)    # the same C loops, bit for bit
        ref = be.make_transformer("numpy", compiled=False).computation(fixed, fx)(X)
        for a, b in zip(f(X), ref):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    assert (f.transformations, f.plans) == (1, 3)


def test_without_hints_or_with_a_symbolic_row_the_numpy_code_runs_those_values():
    x, results = _graph(be.symbolic_axis("N", batch=True))
    f = be.make_transformer("numpy", compiled=True).computation(results, x)
    assert ", 0, N)" not in f.source and "N*512)" not in f.source  # no hint: not fused
    T = be.symbolic_axis("T")
    v = be.placeholder([T], dtype="float64", name="v")
    rev = be.cast_axes(be.slice_along_axis(v, T, slice(None, None, -1)), v.axes)
    g = be.make_transformer("numpy", compiled=True, size_hints={"T": 1 << 16}) \
        .computation([be.exp(rev) * 3.0 + be.tanh(v), be.exp(v) * 2.0], v)
    # one row of symbolic length read through a view (strides, a row of unknown
    # length): the NumPy code; the other group compiles
    assert g.source.count("# compiled:") == 1 and "0, T)" in g.source
    for n in (1, 5, 70000):
        V = RNG.standard_normal(n)
        a, b = g(V)
        np.testing.assert_allclose(a, np.exp(V[::-1]) * 3.0 + np.tanh(V), rtol=1e-13)
        np.testing.assert_allclose(b, np.exp(V) * 2.0, rtol=1e-13)
    X = RNG.standard_normal((5, 64))
    fx, fixed = _graph(be.Axis(5, "N", batch=True))
    want = be.make_transformer("numpy", compiled=False).computation(fixed, fx)(X)
    for a, b in zip(f(X), want):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
