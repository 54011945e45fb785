"""Calls of a computation: the generated entry point that ``comp(...)`` runs directly
(argument checks, feed checks, threads taking turns, results the caller owns, the
last values) and the one-axis results a ufunc allocates itself."""

import sys
import threading
import time

import numpy as np
import pytest

import geon as be

A = be.Axis(5, "A")


def test_argument_errors_on_the_first_and_later_calls():
    x = be.placeholder(A, name="x")
    z = be.placeholder(A, name="z")
    f = be.NumPyTransformer().computation(x + z, x, z)
    ones = np.ones(5, np.float32)
    for _ in range(2):  # before the first call (initializing entry) and after (generated)
        with pytest.raises(be.FeedError, match=r"takes 2 value\(s\) \(x, z\), got 1"):
            f(ones)
        with pytest.raises(be.FeedError, match=r"takes 2 value\(s\) \(x, z\), got 3"):
            f(ones, ones, ones)
        with pytest.raises(be.FeedError, match=r"by position.*\(x, z\); got keyword\(s\) z"):
            f(ones, z=ones)
        np.testing.assert_array_equal(f(ones, ones), 2 * ones)
    g = be.NumPyTransformer().computation(be.Variable(A, initial_value=2.0) * 3.0)
    np.testing.assert_array_equal(g(), np.full(5, 6.0, np.float32))
    with pytest.raises(be.FeedError, match=r"takes 0 value\(s\) \(\), got 1"):
        g(ones)


def test_feed_errors_name_the_placeholder_on_the_fast_path():
    x = be.placeholder(A, name="x_feed")
    f = be.NumPyTransformer().computation(x * 2.0, x)
    f(np.ones(5, np.float32))
    with pytest.raises(be.FeedError, match="x_feed"):
        f(np.ones(4, np.float32))
    np.testing.assert_array_equal(f([1, 2, 3, 4, 5]), [2, 4, 6, 8, 10])  # converted


@pytest.mark.parametrize("build, dtype", [
    (lambda x: x + 1.0, np.float32),
    (lambda x: x * x, np.float32),
    (lambda x: be.less(x, 2.0), np.float32),
    (lambda x: x + 1, np.int32),
    (lambda x: x * 0.5, np.int32),
    (lambda x: x + 1.0, np.float16),
    (lambda x: x - be.Variable((), initial_value=1.0, dtype=np.float64), np.float32),
])
def test_one_axis_results_are_fresh_arrays_of_the_ops_dtype(build, dtype):
    x = be.placeholder(A, dtype=dtype, name="x")
    y = build(x)
    f = be.NumPyTransformer().computation(y, x)
    base = np.arange(10).astype(dtype)
    for v in (base[:5], base[::2]):  # contiguous and strided feeds
        want = be.evaluate(y, feeds={x: v})
        a, b = f(v), f(v)
        assert a.dtype == y.dtype and a.shape == (5,) and a.flags.c_contiguous
        np.testing.assert_allclose(a, want, rtol=1e-6)
        assert a is not b and not np.shares_memory(a, b)
        assert not np.shares_memory(a, v)
        a[:] = 0  # the caller owns it
        np.testing.assert_allclose(f(v), want, rtol=1e-6)


def test_a_result_read_by_another_result_is_not_changed_by_the_caller():
    x = be.placeholder(A, name="x")
    y = x + 1.0
    f = be.NumPyTransformer().computation([y, y * 2.0], x)
    a, b = f(np.ones(5, np.float32))
    np.testing.assert_array_equal(a, 2.0)
    np.testing.assert_array_equal(b, 4.0)
    assert not np.shares_memory(a, b)


def test_last_values():
    x = be.placeholder(A, name="x")
    y, w = x + 1.0, x * 3.0
    t = be.NumPyTransformer()
    one, two = t.computation(y, x), t.computation([y, w], x)
    with pytest.raises(be.ArgumentError, match="not been called"):
        one.value(y)
    got = one(np.ones(5, np.float32))
    assert one.value(y) is got
    got2 = two(np.full(5, 2.0, np.float32))
    np.testing.assert_array_equal(two.value(w), 6.0)
    assert two.value(y) is got2[0]
    upd = t.computation(be.SetItem(be.Variable(A, initial_value=0.0), 1.0))
    assert upd() is None and upd._last_values() == (None,)


def test_calls_of_one_transformer_take_turns():
    """Calls from several threads of computations sharing a transformer never overlap:
    a user op that sleeps (releasing the GIL) counts the calls inside it at once."""
    inside, most = [0], [0]
    counter = threading.Lock()

    def slow(v):
        with counter:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.002)
        with counter:
            inside[0] -= 1
        return v + 1.0

    Slow = be.elementwise_op("SlowIncrement", numpy=slow, derivative=lambda x: 1.0)
    x = be.placeholder(A, name="x")
    total = be.Variable((), initial_value=0.0, name="total")
    t = be.NumPyTransformer()
    f = t.computation(Slow(x), x)
    g = t.computation([Slow(x) * 2.0, be.SetItem(total, total + 1.0)], x)
    errors = []

    def work(k):
        v = np.full(5, k, np.float32)
        try:
            for _ in range(10):
                np.testing.assert_array_equal(f(v), v + 1)
                np.testing.assert_array_equal(g(v)[0], 2 * (v + 1))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        sys.setswitchinterval(old)
    assert errors == []
    assert most[0] == 1          # never two calls inside at once
    assert float(t.state[total]) == 40.0   # no lost update: 4 threads x 10 calls


def test_a_failed_call_releases_the_lock():
    x = be.placeholder(A, name="x")
    t = be.NumPyTransformer()
    f = t.computation(x * 2.0, x)
    f(np.ones(5, np.float32))
    with pytest.raises(be.FeedError):
        f(np.ones(3, np.float32))
    done = []
    th = threading.Thread(target=lambda: done.append(f(np.ones(5, np.float32))))
    th.start()
    th.join(timeout=30)
    assert not th.is_alive() and len(done) == 1
    assert t._lock.acquire(blocking=False)
    t._lock.release()
