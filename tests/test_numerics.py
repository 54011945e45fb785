"""Numerics that must not be silently wrong: compute dtypes, derivatives at zeros and
infinities, IEEE semantics under simplification, and results the caller owns.

Expected values are written with NumPy (float64 closed forms where the result is a
formula), never with geon's reference evaluator.
"""

import numpy as np
import pytest

import geon as be

A = be.Axis(4, "A")
B = be.Axis(3, "B")


def _run(results, feeds, **kw):
    """``results`` computed by a NumPy transformer from ``{placeholder: array}``."""
    ps = list(feeds)
    f = be.make_transformer("numpy", **kw).computation(results, *ps)
    return f(*[feeds[p] for p in ps])


def _all_ways(results, feeds):
    """``[(how, values)]``: the reference evaluator (first: a transformer rewrites the
    graph in place, after which ``evaluate`` would see the lowered ops) and the NumPy
    transformer with and without fusion."""
    return [("reference", be.evaluate(results, feeds)),
            ("numpy", _run(results, feeds)),
            ("numpy, no fusion", _run(results, feeds, disable=["fusion"]))]


# --- 1. unary math and ** of integer tensors compute in the result dtype ----------------

INT_CASES = [
    # (input dtype, values, geon op, NumPy function of the float32 values)
    (np.int32, [2, 3, -7, 2 ** 31 - 1], be.reciprocal, np.reciprocal),
    (np.int32, [2, 3, -7, 2 ** 31 - 1], be.square, np.square),
    (np.uint8, [250, 1, 0, 255], be.negative, np.negative),
    (np.int8, [3, 5, 7, 127], be.sqrt, np.sqrt),
    (np.int8, [3, 5, 7, 127], be.log, np.log),
    (np.int16, [1, 2, 3, 100], be.exp, np.exp),
    (np.int8, [3, -5, 7, -128], be.absolute, np.absolute),
    (np.uint8, [0, 1, 2, 200], be.sigmoid, lambda v: 1 / (1 + np.exp(-v))),
    (np.int32, [2, 3, -2, 46341], lambda x: x ** 2, np.square),
    (np.int32, [2, 3, -2, 2 ** 31 - 1], lambda x: x ** x, lambda v: np.power(v, v)),
    (np.int32, [2, 3, -2, 2 ** 31 - 1], lambda x: x ** -1, np.reciprocal),
]


@pytest.mark.parametrize("dtype, values, build, expect", INT_CASES,
                         ids=[f"{np.dtype(c[0]).name}-{i}" for i, c in enumerate(INT_CASES)])
def test_integer_inputs_compute_in_the_float_result_dtype(dtype, values, build, expect):
    x = be.placeholder(A, dtype=dtype, name="x")
    v = np.array(values, dtype=dtype)
    y = build(x)
    assert y.dtype == np.float32  # the result dtype rule of the Axes family
    with np.errstate(all="ignore"):
        want = np.asarray(expect(v.astype(np.float32)), np.float32)
        for how, got in _all_ways(y, {x: v}):
            assert got.dtype == np.float32, how
            np.testing.assert_allclose(got, want, rtol=2e-7, err_msg=how)


# --- 2. derivatives of prod at zeros; derivatives with respect to constants --------------

# rows: no zero, one zero, two zeros, all zeros (products along B)
PROD_X = np.array([[2.0, -3.0, 0.5], [2.0, 0.0, -4.0], [0.0, 3.0, 0.0], [0.0, 0.0, 0.0]])


def _prod_of_others(x):
    """``d prod(x, axis=1) / d x``: for each element the product of the others in its
    row, by deleting it (float64, no division)."""
    out = np.empty_like(x)
    for i, j in np.ndindex(*x.shape):
        out[i, j] = np.prod(np.delete(x[i], j))
    return out


@pytest.mark.parametrize("lowered", [False, True], ids=["axes", "lowered"])
def test_derivative_of_prod_at_zeros_is_the_product_of_the_others(lowered):
    from gradcheck import assert_gradcheck
    x = be.placeholder((A, B), dtype=np.float64, name="x")
    p = be.prod(x, reduction_axes=B)
    cost = be.sum(p * be.Constant(np.array([1.0, -2.0, 3.0, 0.5]), axes=A, dtype=np.float64),
                  out_axes=())
    if lowered:  # lowering rewrites the graph in place: the ReduceProd rule is used
        be.make_transformer("numpy").computation(cost, x)
    d = be.deriv(cost, x)
    want = _prod_of_others(PROD_X) * np.array([1.0, -2.0, 3.0, 0.5])[:, None]
    assert want[1, 1] == -2.0 * -8.0 and want[2, 0] == 0.0  # one zero; two zeros
    for how, got in _all_ways(d, {x: PROD_X}):
        np.testing.assert_allclose(got, want, rtol=1e-15, atol=0, err_msg=how)
    # and against central differences (prod is linear in each element: exact there)
    assert_gradcheck(lambda v: be.prod(v, reduction_axes=B), [((A, B), PROD_X)],
                     lowered=lowered)


def test_jvp_of_prod_at_zeros():
    x = be.placeholder((A, B), dtype=np.float64, name="x")
    tangent = np.arange(12.0).reshape(4, 3) - 5.0
    j = be.jvp(be.prod(x, reduction_axes=B), x, be.Constant(tangent, axes=(A, B),
                                                            dtype=np.float64))
    want = np.sum(_prod_of_others(PROD_X) * tangent, axis=1)
    for how, got in _all_ways(j, {x: PROD_X}):
        np.testing.assert_allclose(got, want, rtol=1e-15, atol=0, err_msg=how)


def test_derivative_with_respect_to_a_constant_is_real():
    x = be.placeholder(A, dtype=np.float64, name="x")
    kv = np.array([1.0, -2.0, 0.5, 3.0])
    k = be.Constant(kv, axes=A, dtype=np.float64, name="k")
    k2 = k * 2.0  # an op of constants only
    c = be.sum(x * k2 + k * k, out_axes=())
    xv = np.array([0.5, 1.5, -1.0, 2.0])
    for w, want in [(k, 2 * xv + 2 * kv), (k2, xv)]:
        d = be.deriv(c, w)
        assert d.axes == w.axes
        for how, got in _all_ways(d, {x: xv}):
            np.testing.assert_allclose(got, want, rtol=1e-15, err_msg=how)
    # a constant c does not depend on: zeros, as for a variable
    other = be.Constant(np.ones(3), axes=B, dtype=np.float64)
    assert np.all(be.evaluate(be.deriv(c, other)) == 0)
    # the derivatives with respect to variables are unchanged (and still cached)
    assert be.deriv(c, x) is be.deriv(c, x)
    np.testing.assert_allclose(be.evaluate(be.deriv(c, x), {x: xv}), 2 * kv)


# --- 4. the simplifier keeps IEEE semantics ---------------------------------------------

SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, -1.5, 2.0])


def _unsafe_rewrites(x):
    """Expressions that algebra would fold but IEEE arithmetic does not (NaN, inf, 0 and
    negative numbers give other values)."""
    return [be.exp(be.log(x)), x * 0.0, 0.0 * x, x * 0, x / x, x - x, (x - x) * 0.0]


def _ieee(v):
    with np.errstate(all="ignore"):
        return [np.exp(np.log(v)), v * 0.0, 0.0 * v, v * 0, v / v, v - v, (v - v) * 0.0]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("source", ["placeholder", "constant"])
def test_simplifier_never_fires_unsafe_rules(dtype, source):
    v = SPECIAL.astype(dtype)
    S = be.Axis(len(v), "S")
    if source == "placeholder":
        x = be.placeholder(S, dtype=dtype, name="x")
        feeds = {x: v}
    else:  # constant folding must give the IEEE values too
        x = be.Constant(v, axes=S, dtype=dtype, name="x")
        feeds = {}
    results = _unsafe_rewrites(x)
    with np.errstate(all="ignore"):
        for how, got in _all_ways(results, feeds):
            for i, (g, w) in enumerate(zip(got, _ieee(v))):
                assert g.dtype == dtype, (how, i)
                np.testing.assert_array_equal(g, w, err_msg=f"{how}: expression {i}")


def test_integer_times_zero_still_folds():
    from geon.transformers.passes.simplify import mul_one_zero
    i = be.placeholder(A, dtype=np.int32, name="i")
    f = be.placeholder(A, dtype=np.float32, name="f")
    folded = mul_one_zero(i * 0)
    assert isinstance(folded, be.Constant) and folded.scalar == 0
    assert mul_one_zero(f * 0.0) is None and mul_one_zero(0.0 * f) is None
    np.testing.assert_array_equal(_run(i * 0, {i: np.arange(4, dtype=np.int32)}), 0)


# --- 6. the reference evaluator reduces when another axis has length 0 -----------------

def test_reference_reduces_with_an_empty_kept_axis():
    E = be.Axis(0, "E")
    x = be.placeholder((E, B), name="x")
    v = np.zeros((0, 3), np.float32)
    for op, want in [(be.sum(x, reduction_axes=B), np.zeros(0)),
                     (be.max(x, reduction_axes=B), np.zeros(0)),
                     (be.sum(x, reduction_axes=E), np.zeros(3)),
                     (be.prod(x, reduction_axes=E), np.ones(3))]:
        for how, got in _all_ways(op, {x: v}):
            assert got.shape == want.shape, how
            np.testing.assert_array_equal(got, want, err_msg=how)


# --- 7. results are distinct arrays the caller owns --------------------------------------

def test_results_are_distinct_arrays_the_caller_owns():
    x = be.placeholder(A, name="x")
    w = be.Variable(A, initial_value=np.arange(4.0), name="w")
    y = x * 3.0
    t = be.make_transformer("numpy")
    f = t.computation([x * 3.0, x * 3.0, y, y, w, x, be.axes_with_order(x, (A,))], x)
    xv = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    out = f(xv)
    for i in range(len(out)):
        for j in range(i + 1, len(out)):
            assert not np.shares_memory(out[i], out[j]), (i, j)
    assert not np.shares_memory(out[4], t.state[w])   # not the Variable's storage
    assert not np.shares_memory(out[5], xv)            # not the caller's feed
    for a in out:
        a[...] = -7.0  # the caller may write what it owns
    np.testing.assert_array_equal(t.state[w], np.arange(4.0))
    np.testing.assert_array_equal(xv, [1, 2, 3, 4])
    again = f(xv)
    np.testing.assert_array_equal(again[0], 3 * xv)
    np.testing.assert_array_equal(again[3], 3 * xv)
    np.testing.assert_array_equal(again[4], np.arange(4.0))
    assert not np.shares_memory(again[0], out[0])      # a new array each call


def test_reshaped_results_are_arrays_the_caller_owns():
    # a result that is a reshape of a new buffer goes out without a copy, once
    x = be.np.placeholder((2, 6), name="x")
    y = be.np.reshape(x * 2.0, (3, 4))
    f = be.NumPyTransformer().computation([y, y, be.np.reshape(y, (12,))], x)
    xv = np.arange(12.0, dtype=np.float32).reshape(2, 6)
    out = f(xv)
    assert [a.shape for a in out] == [(3, 4), (3, 4), (12,)]
    for i in range(3):
        np.testing.assert_array_equal(out[i].ravel(), 2 * xv.ravel())
        for j in range(i + 1, 3):
            assert not np.shares_memory(out[i], out[j]), (i, j)
    again = f(xv)
    for a, b in zip(out, again):
        assert not np.shares_memory(a, b)
    out[0][...] = -1.0  # the caller's to write
    np.testing.assert_array_equal(again[0].ravel(), 2 * xv.ravel())


# --- 3. cross-entropy, safelog and powers at infinities and zeros ------------------------

def test_softmax_cross_entropy_with_masked_and_huge_logits():
    Y, N = be.Axis(3, "Y3"), be.Axis(4, "N4", batch=True)
    z = be.placeholder((Y, N), name="z")
    t = be.placeholder((Y, N), name="t")
    ce = be.cross_entropy_multi(be.softmax(z), t)
    dz = be.deriv(be.sum(ce, out_axes=()), z)
    Z = np.array([[-np.inf, 3e38, 1.0, -3e38],
                  [2.0, -3e38, -np.inf, 3e38],
                  [0.5, 3e38, 0.0, -np.inf]], np.float32)
    T = np.array([[0, 0, 1, 0], [1, 0, 0, 1], [0, 1, 0, 0]], np.float32)
    # float64 closed forms: log-softmax of the finite logits, -inf logits weigh nothing
    Zd = Z.astype(np.float64)
    m = Zd.max(axis=0)
    shifted = Zd - m  # -3e38 - 3e38 is -6e38: finite in float64
    lse = np.log(np.sum(np.exp(shifted), axis=0))
    want_ce = -np.sum(T * np.where(T > 0, shifted - lse, 0.0), axis=0)
    want_dz = np.exp(shifted - lse) * T.sum(axis=0) - T
    with np.errstate(over="ignore"):  # float32 z - max(z) overflows to -inf, as it may
        ways = _all_ways([ce, dz], {z: Z, t: T})
    for how, (c, d) in ways:
        assert np.all(np.isfinite(c)) and np.all(np.isfinite(d)), how
        np.testing.assert_allclose(c, want_ce, rtol=1e-6, atol=1e-6, err_msg=how)
        np.testing.assert_allclose(d, want_dz, rtol=1e-6, atol=1e-6, err_msg=how)


def test_binary_cross_entropy_at_infinite_logits():
    M = be.Axis(8, "M8")
    x = be.placeholder(M, name="x")
    t = be.placeholder(M, name="t")
    e = be.cross_entropy_binary(be.sigmoid(x), t, out_axes=(M,))
    dx = be.deriv(be.sum(e, out_axes=()), x)
    X = np.array([np.inf, -np.inf, np.inf, -np.inf, 0.0, 5.0, -30.0, 1e4], np.float32)
    T = np.array([1.0, 0.0, 0.0, 1.0, 0.0, 0.25, 1.0, 1.0], np.float32)
    Xd = X.astype(np.float64)
    with np.errstate(invalid="ignore"):
        finite = np.logaddexp(0, Xd) - Xd * T
    want = np.where(np.isfinite(Xd), finite, np.where((Xd > 0) == (T == 1), 0.0, np.inf))
    want_dx = 1 / (1 + np.exp(-Xd)) - T
    for how, (v, d) in _all_ways([e, dx], {x: X, t: T}):
        np.testing.assert_allclose(v, want, rtol=1e-6, atol=1e-7, err_msg=how)
        np.testing.assert_allclose(d, want_dx, rtol=1e-6, atol=1e-7, err_msg=how)


def test_float16_safelog_of_zero_is_finite():
    x = be.placeholder(A, dtype=np.float16, name="x")
    v = np.array([0.0, 1e-8, 0.5, 2.0], np.float16)
    tiny = np.finfo(np.float16).tiny
    want = np.log(np.maximum(v, tiny).astype(np.float64))
    for how, got in _all_ways(be.safelog(x), {x: v}):
        assert got.dtype == np.float16 and np.all(np.isfinite(got)), how
        np.testing.assert_allclose(got, want, rtol=1e-3, err_msg=how)


def test_derivative_of_power_in_the_exponent_at_a_zero_base():
    a = be.placeholder(A, dtype=np.float64, name="a")
    b = be.placeholder(A, dtype=np.float64, name="b")
    p = a ** b
    av, bv = np.array([0.0, 0.0, 2.0, 0.5]), np.array([2.0, 0.5, 3.0, -1.0])
    want = np.array([0.0, 0.0, 8 * np.log(2.0), 2 * np.log(0.5)])  # a**b log a; 0 at a=0<b
    db = be.deriv(be.sum(p, out_axes=()), b)
    tb = be.jvp(p, b, np.ones(4))
    for how, (g, j) in _all_ways([db, tb], {a: av, b: bv}):
        np.testing.assert_allclose(g, want, rtol=1e-15, err_msg=how)
        np.testing.assert_allclose(j, want, rtol=1e-15, err_msg=how)
