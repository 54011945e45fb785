"""Transformers: computations, feed checks, the registry, and the procedures."""

import json
import os
import warnings

import numpy as np
import pytest

import geon as be
from geon.transformers import base as tbase
from geon.transformers.numpy import compiled as compiled_kernels
from geon.transformers.numpy import transformer as nt

A = be.Axis(3, "TA")
B = be.Axis(2, "TB")


def model():
    x = be.placeholder([A], name="feed_x")
    w = be.Variable(axes=[A, B], initial_value=lambda shape: np.arange(6.0).reshape(shape),
                    name="w_model")
    b = be.Variable(axes=[B], initial_value=0.5, name="b_model")
    y = be.dot(x, w) + b
    return x, w, b, y


def test_results_single_list_tuple():
    x, w, b, y = model()
    t = be.make_transformer("numpy")
    assert isinstance(t, be.NumPyTransformer)
    xs = np.array([1.0, 2.0, 3.0])
    expect = xs @ np.arange(6.0).reshape(3, 2) + 0.5
    single = t.computation(y, x)
    out = single(xs)
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    np.testing.assert_allclose(out, expect)
    lst = t.computation([y, be.SetItem(b, b + 1)], x)(xs)
    assert isinstance(lst, tuple) and len(lst) == 2 and lst[1] is None
    tup = t.computation((y,), x)(xs)
    assert isinstance(tup, tuple) and len(tup) == 1
    np.testing.assert_allclose(tup[0], expect + 1)


def test_results_are_fresh_arrays():
    x, w, b, y = model()
    t = be.NumPyTransformer()
    f = t.computation([y, w], x)
    y1, w1 = f(np.ones(3))
    y1[:] = 99
    w1[:] = 99
    y2, w2 = f(np.ones(3))
    assert not np.any(y2 == 99) and not np.any(w2 == 99)


def test_parameter_must_be_placeholder():
    x, w, b, y = model()
    with pytest.raises(ValueError, match="w_model.*not a placeholder"):
        be.NumPyTransformer().computation(y, w)


def test_missing_parameter_is_reported():
    x, w, b, y = model()
    with pytest.raises(ValueError, match="feed_x"):
        be.NumPyTransformer().computation(y)


def test_feed_errors_name_the_placeholder():
    x, w, b, y = model()
    f = be.NumPyTransformer().computation(y, x)
    with pytest.raises(be.FeedError, match="takes 1 value"):
        f()
    with pytest.raises(be.FeedError, match=r"feed_x.*TA:3.*\(3,\).*\(4,\)"):
        f(np.ones(4))
    with pytest.raises(be.FeedError, match="feed_x.*complex128"):
        f(np.ones(3, dtype=complex))
    assert issubclass(be.FeedError, ValueError)
    # same_kind conversions are accepted: float64 and ints into float32
    np.testing.assert_allclose(f(np.ones(3)), f([1, 1, 1]))


def test_float64_feed_is_converted_without_losing_shape():
    p = be.placeholder([A], dtype=np.float64)
    f = be.NumPyTransformer().computation(p * 2, p)
    np.testing.assert_array_equal(f(np.arange(3, dtype=np.int32)), [0, 2, 4])


def test_registry():
    assert "numpy" in be.available_transformers()
    with pytest.raises(be.UnknownTransformerError, match="no transformer named 'nope'.*numpy"):
        be.make_transformer("nope")

    class Mine(be.NumPyTransformer):
        name = "mine"

    be.register_transformer("mine-test", Mine)
    try:
        assert isinstance(be.make_transformer("mine-test"), Mine)
        assert "mine-test" in be.available_transformers()
    finally:
        tbase._REGISTRY.pop("mine-test")


def test_numpy_is_an_installed_entry_point():
    names = set(tbase._entry_points())
    assert "numpy" in names


def test_initialize_is_idempotent_and_automatic():
    x, w, b, y = model()
    t = be.NumPyTransformer()
    step = t.computation([y, be.SetItem(b, b + 1)], x)
    step(np.zeros(3))  # allocates and initializes on first call
    np.testing.assert_array_equal(t.state[b], [1.5, 1.5])
    t.initialize()
    np.testing.assert_array_equal(t.state[b], [1.5, 1.5])
    t.initialize(force=True)
    np.testing.assert_array_equal(t.state[b], [0.5, 0.5])
    np.testing.assert_array_equal(t.state[w], np.arange(6.0).reshape(3, 2))


def test_source_is_readable_numpy():
    x, w, b, y = model()
    f = be.NumPyTransformer().computation(y, x)
    src = f.source
    assert "def run(feed_x=_nofeed, /, *_more, **_kw):" in src and "np.matmul(" in src and "out=" in src
    assert __file__ in src  # each primitive names the user's line


@pytest.mark.parametrize("shape", [(4, 64), (300, 1024), (64,), (70000,), (300000,)])
def test_maximum_and_minimum_read_a_scalar_as_a_row(shape):
    from geon.transformers.numpy import transformer as nt
    axes = [be.Axis(n, f"RowAx{i}") for i, n in enumerate(shape)]
    x = be.placeholder(axes, dtype=np.float64)
    results = [be.maximum(x, 0.0), be.minimum(0.5, x), be.maximum(x, -1.5) * 2.0]
    f = be.NumPyTransformer(compiled=False).computation(results, x)  # the NumPy code
    last = shape[-1]
    if len(shape) == 1 and last > nt.ROW_LENGTHS[1]:  # fused: blocks of the row's length
        assert "_131072[:_j - _i], out=" in f.source, f.source
    else:
        as_row = nt.ROW_LENGTHS[0] <= last <= nt.ROW_LENGTHS[1]
        assert (f"_{last}, out=" in f.source) == as_row, f.source
    v = np.random.default_rng(0).standard_normal(shape)
    v.flat[::7] = np.nan  # NaN propagates from either operand, as with the scalar
    v.flat[1] = -0.0
    got = f(v)
    want = [np.maximum(v, 0.0), np.minimum(0.5, v), np.maximum(v, -1.5) * 2.0]
    for g, w in zip(got, want):  # the same bits as with the number (signed zeros, NaN)
        np.testing.assert_array_equal(g.view(np.uint8), w.view(np.uint8))
    for g, w in zip(got, be.evaluate(results, feeds={x: v})):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
@pytest.mark.parametrize("length", [1, 11, 1000, 5000])
def test_float_sums_of_rows_and_columns_are_products_with_ones(dtype, length):
    from geon.transformers.numpy import transformer as nt
    M, N = be.Axis(6, "SumM"), be.Axis(length, "SumN")
    x = be.placeholder([M, N], dtype=dtype)
    y = be.placeholder([N, M], dtype=dtype)  # the sum over N is then one of columns
    results = [be.sum(x, reduction_axes=N), be.sum(y, reduction_axes=N),
               be.sum(x, reduction_axes=M)]
    f = be.NumPyTransformer().computation(results, x, y)
    product = np.dtype(dtype).kind == "f" and length <= nt.ONES_LENGTH \
        and 6 * length >= nt.ONES_MIN
    assert (f"_ones_{np.dtype(dtype).name}[:{length}]" in f.source) == product, f.source
    rng = np.random.default_rng(5)
    xs = (rng.standard_normal((6, length)) * 100).astype(dtype)
    ys = (rng.standard_normal((length, 6)) * 100).astype(dtype)
    if np.dtype(dtype).kind == "f" and length > 1:
        xs[1, 3], xs[2, 0], xs[3, :2] = np.nan, np.inf, (np.inf, -np.inf)
        ys[0, 4] = -np.inf
    with np.errstate(invalid="ignore"):  # inf - inf
        got = f(xs, ys)
        wants = [v.astype(np.float64).sum(axis) for v, axis in ((xs, 1), (ys, 0), (xs, 0))]
    for g, v, axis, want in zip(got, (xs, ys, xs), (1, 0, 0), wants):
        # want: the sum in double, rounded once
        assert g.dtype == np.dtype(dtype)
        if np.dtype(dtype).kind == "i":
            np.testing.assert_array_equal(g, v.sum(axis, dtype=dtype))
            continue
        # within float rounding of the exact sum (a bound in the sum of magnitudes)
        eps = np.finfo(dtype).eps
        bound = length * eps * np.abs(v).astype(np.float64).sum(axis)
        ok = np.isfinite(want)
        assert np.all(np.abs(g[ok] - want[ok]) <= bound[ok]), (g, want)
        np.testing.assert_array_equal(g[~ok], want[~ok].astype(dtype))  # NaN, +-inf


@pytest.mark.parametrize("xdtype,cdtype", [(np.float32, np.float64), (np.float32, None),
                                           (np.int32, np.int64), (np.int64, None)])
def test_row_operands_with_views_broadcasts_and_other_dtypes(xdtype, cdtype):
    M, N = be.Axis(40, "RowM"), be.Axis(300, "RowN")
    x = be.placeholder([M, N], dtype=xdtype)
    v = be.placeholder([M], dtype=xdtype)
    c = be.constant(2, dtype=cdtype) if cdtype else 2
    results = [be.maximum(be.axes_with_order(x, [N, M]), c),  # a transposed view
               be.minimum(be.broadcast(v, [M, N]), c),  # broadcast along the last axis
               be.maximum(c, x) + be.minimum(x, c)]
    # (the NumPy code's row operands: not a compiled group)
    f = be.NumPyTransformer(compiled=False).computation(results, x, v)
    assert "_40, out=" in f.source and "_300, out=" in f.source, f.source
    rng = np.random.default_rng(2)
    xs = rng.integers(-5, 6, (40, 300)).astype(xdtype)
    vs = rng.integers(-5, 6, 40).astype(xdtype)
    got = f(xs, vs)
    want = be.evaluate(results, feeds={x: xs, v: vs})
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)
    cv = np.array(2, dtype=cdtype) if cdtype else 2
    np.testing.assert_array_equal(got[0], np.maximum(xs.T, cv))


@pytest.mark.parametrize("shape", [(3,), (40, 70), (200000,), (2, 150000)])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_sigmoid_never_warns_and_is_exact_where_normal(shape, dtype):
    # small float32/float64 sigmoids clamp -x below exp's overflow (through a NumPy
    # scalar of the limit, or a row of it from SCALAR_CLAMP elements); large ones and
    # float16 let exp overflow with its warning off for that call
    x = be.placeholder([be.Axis(n, f"SigAx{i}") for i, n in enumerate(shape)], dtype=dtype)
    f = be.NumPyTransformer(compiled=False).computation([be.sigmoid(x), be.sigmoid(x) * 2.0],
                                                        x)  # the NumPy code
    size = int(np.prod(shape))
    unclamped = size >= nt.SIGMOID_UNCLAMPED or dtype == np.float16
    assert ("_overflow_ok()" in f.source) == unclamped
    assert ("_row(" in f.source) == (not unclamped and size >= nt.SCALAR_CLAMP)
    assert ("_clamp_" in f.source) == (not unclamped and size < nt.SCALAR_CLAMP)
    v = np.random.default_rng(1).standard_normal(shape).astype(dtype) * 60
    v.flat[:6] = [-1000.0, 1000.0, np.nan, -0.0, -20.0, 20.0]
    limit = compiled_kernels.sigmoid_limit(dtype)
    with np.errstate(over="ignore"):
        want = 1 / (1 + np.exp(-(v if unclamped else np.maximum(v, -limit))))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = f(v)
    np.testing.assert_array_equal(got[0], want.astype(dtype))
    np.testing.assert_array_equal(got[1], want.astype(dtype) * 2)
    # against the value in extended precision (where the platform has it): equal up to
    # a few ulps wherever that is a normal number of the dtype, and tiny elsewhere
    wide = v.astype(np.longdouble)
    with np.errstate(over="ignore"):
        exact = 1 / (1 + np.exp(-wide))
    normal = np.abs(exact) >= np.finfo(dtype).tiny
    np.testing.assert_allclose(got[0][normal].astype(np.longdouble), exact[normal],
                               rtol=4 * np.finfo(dtype).eps)
    assert np.all(got[0][~normal & ~np.isnan(v)] <= np.finfo(dtype).tiny)


@pytest.mark.parametrize("dtype, limit", [(np.float16, 11.0), (np.float32, 88.0),
                                          (np.float64, 709.0)])
def test_sigmoid_limit_is_the_largest_whole_number_with_a_finite_exp(dtype, limit):
    assert compiled_kernels.sigmoid_limit(dtype) == limit
    with np.errstate(over="raise"):
        assert np.isfinite(np.exp(np.array(limit, dtype)))
        with pytest.raises(FloatingPointError):
            np.exp(np.array(limit + 1, dtype))


def trained(tmp_path):
    x, w, b, y = model()
    t = be.NumPyTransformer()
    step = t.computation([y, be.SetItem(w, w * 1.5 + 0.1), be.SetItem(b, b - 0.3)], x)
    step(np.ones(3))
    return t, step, w, b


def test_save_restore_round_trip_is_bitwise(tmp_path):
    t, step, w, b = trained(tmp_path)
    path = tmp_path / "ck.npz"
    t.save(path)
    saved = {v: t.state[v].copy() for v in (w, b)}
    step(np.ones(3))
    assert not np.array_equal(t.state[w], saved[w])
    t.restore(path)
    for v in (w, b):
        assert t.state[v].tobytes() == saved[v].tobytes()
    # a fresh transformer with the same model (same names) restores too
    x2 = be.placeholder([A])
    w2 = be.Variable(axes=[A, B], name="w_model")
    b2 = be.Variable(axes=[B], name="b_model")
    t2 = be.NumPyTransformer()
    t2.computation(be.dot(x2, w2) + b2, x2)
    t2.restore(path)
    assert t2.state[w2].tobytes() == saved[w].tobytes()
    with np.load(path, allow_pickle=False) as data:  # NumPy opens checkpoints
        names = [e["name"] for e in json.loads(data["geon-checkpoint.json"])["variables"]]
        assert sorted(names) == ["b_model", "w_model"]
        assert data[f"arr_{names.index('w_model')}"].tobytes() == saved[w].tobytes()


def _state(t):
    return {v.name: a.copy() for v, a in t.state.items()}


def _same(s1, s2):
    return s1.keys() == s2.keys() and all(np.array_equal(s1[k], s2[k]) for k in s1)


def test_bad_checkpoints_raise_and_leave_state(tmp_path):
    t, step, w, b = trained(tmp_path)
    before = _state(t)
    with pytest.raises(be.CheckpointError, match="does not exist"):
        t.restore(tmp_path / "missing.npz")
    corrupt = tmp_path / "corrupt.npz"
    corrupt.write_bytes(b"PK\x03\x04 not really a zip file")
    with pytest.raises(be.CheckpointError, match="not a checkpoint"):
        t.restore(corrupt)
    wrong_shape = tmp_path / "shape.npz"
    np.savez(wrong_shape, w_model=np.zeros((2, 2), np.float32), b_model=np.zeros(2, np.float32))
    with pytest.raises(be.CheckpointError, match="w_model"):
        t.restore(wrong_shape)
    wrong_dtype = tmp_path / "dtype.npz"
    np.savez(wrong_dtype, w_model=np.zeros((3, 2)), b_model=np.zeros(2, np.float32))
    with pytest.raises(be.CheckpointError, match="float64"):
        t.restore(wrong_dtype)
    missing_name = tmp_path / "names.npz"
    np.savez(missing_name, w_model=np.zeros((3, 2), np.float32), other=np.zeros(1))
    with pytest.raises(be.CheckpointError, match="missing.*b_model.*unexpected.*other"):
        t.restore(missing_name)
    pickled = tmp_path / "pickled.npz"
    np.savez(pickled, w_model=np.array([object()], dtype=object),
             b_model=np.zeros(2, np.float32))
    with pytest.raises(be.CheckpointError):
        t.restore(pickled)
    truncated = tmp_path / "trunc.npz"
    t.save(truncated)
    data = truncated.read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(be.CheckpointError):
        t.restore(truncated)
    assert _same(before, _state(t))


def test_duplicate_variable_names_refuse_to_save(tmp_path):
    v1 = be.Variable(axes=[A], name="dup")
    v2 = be.Variable(axes=[A], name="dup")
    t = be.NumPyTransformer()
    t.computation([v1 + v2])
    with pytest.raises(be.CheckpointError, match="dup"):
        t.save(tmp_path / "x.npz")
    assert not os.path.exists(tmp_path / "x.npz")


def test_disable_pass_by_name_keeps_results():
    def build():  # passes rewrite the graph they run on, so build one per transformer
        x = be.placeholder([A], dtype=np.float64)
        return be.log(be.exp(x)) * 1.0 + 0.0, x

    on = be.NumPyTransformer().computation(*build())
    off = be.NumPyTransformer(disable=["simplify", "fold"]).computation(*build())
    v = np.array([0.5, 1.0, 2.0])
    np.testing.assert_allclose(on(v), off(v), rtol=1e-15)
    assert "np.exp" in off.source and "np.exp" not in on.source
    with pytest.raises(ValueError, match="unknown pass"):
        be.NumPyTransformer(disable=["nonsense"])


def test_computation_after_allocate_gets_storage():
    x, w, b, y = model()
    t = be.NumPyTransformer()
    t.computation(y, x)
    t.allocate()
    t.initialize()
    v = be.Variable(axes=[B], initial_value=2.0, name="late")
    f = t.computation(y * v, x)
    np.testing.assert_allclose(f(np.zeros(3)), [1.0, 1.0])


def test_initializers_run_once_in_initialize():
    v = be.Variable(axes=[A], initial_value=1.0, name="init_v")
    u = be.Variable(axes=[A], initial_value=2.0, name="init_u",
                    initializers=[be.SetItem(v, 5.0, sequence=False)])
    t = be.NumPyTransformer()
    f = t.computation([u + v, be.SetItem(v, v + 1)])
    total, _ = f()
    np.testing.assert_array_equal(total, [7, 7, 7])  # v was set to 5 by u's initializer
    total, _ = f()
    np.testing.assert_array_equal(total, [8, 8, 8])  # and not again on later calls


def test_initializers_do_not_rerun_for_a_later_computation():
    v = be.Variable(axes=[A], initial_value=0.0, name="init_once_v")
    r = be.negative(v)
    r.initializers = [be.SetItem(v, 5.0, sequence=False)]
    t = be.NumPyTransformer()
    f = t.computation([r, be.SetItem(v, v + 1.0)])
    f()
    np.testing.assert_array_equal(t.state[v], [6, 6, 6])
    u = be.Variable(axes=[A], initial_value=2.0, name="init_once_u")
    np.testing.assert_array_equal(t.computation(u + 1.0)(), [3, 3, 3])
    np.testing.assert_array_equal(t.state[v], [6, 6, 6])  # not reset to 5


def test_passes_leave_ops_outside_the_computation_alone():
    x = be.placeholder([A], name="x_alone")
    w = be.Variable(axes=[A, B], name="w_alone")
    other = be.dot(x, w)  # never requested
    be.NumPyTransformer().computation(be.exp(be.stop_gradient(x)) * 2.0, x)
    assert other.forward is None and isinstance(other, be.Op)


def test_concurrent_calls_give_correct_results():
    """Threads calling one computation (and another of the same transformer, which
    shares its variable) with different inputs: every result is right."""
    import sys
    import threading
    R = be.Axis(20000, "TRows")
    x = be.placeholder([R], name="x_threads")
    s = be.Variable(axes=[], initial_value=3.0, name="s_threads")
    t = be.NumPyTransformer()
    f = t.computation(be.tanh(x * 2.0 + 1.0) * s - x, x)
    g = t.computation(be.sum(x * s, out_axes=()), x)
    # sums differ between inputs by far more than the tolerance (k * 3e4)
    inputs = [np.linspace(-1, k, R.length).astype(np.float32) for k in range(1, 7)]
    want_f = [np.tanh(a * 2 + 1) * 3 - a for a in inputs]
    want_g = [float(np.sum(a.astype(np.float64) * 3)) for a in inputs]
    wrong = []

    def work(k):
        a = inputs[k]
        for _ in range(40):
            if not np.allclose(f(a), want_f[k], rtol=1e-6, atol=1e-6):
                wrong.append(("f", k))
            if not np.isclose(float(g(a)), want_g[k], rtol=1e-4, atol=1e-2):
                wrong.append(("g", k))

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:
        threads = [threading.Thread(target=work, args=(k,)) for k in range(len(inputs))]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        sys.setswitchinterval(old)
    assert wrong == []


def test_a_longer_row_of_ones_is_made_when_the_limit_is_raised(monkeypatch):
    from geon.transformers.numpy import primitives
    monkeypatch.setattr(primitives, "ONES_LENGTH", 8192)
    M, N = be.Axis(3, "OnesM"), be.Axis(6000, "OnesN")
    x = be.placeholder([M, N], dtype=np.float64)
    f = be.NumPyTransformer().computation(be.sum(x, reduction_axes=N), x)
    assert "_ones_float64[:6000]" in f.source
    v = np.random.default_rng(8).standard_normal((3, 6000))
    bound = 6000 * np.finfo(np.float64).eps * np.abs(v).sum(1)  # a float sum's bound
    assert np.all(np.abs(f(v) - v.sum(1)) <= bound)
