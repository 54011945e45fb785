"""``be.run`` and :class:`be.Runner`: values, reuse verified by counting the primitives
each call executes, and exactly which changes invalidate a remembered value."""

import gc
import tracemalloc
import weakref

import numpy as np
import pytest

import geon as be
from geon.op_graph.run import count_primitives, default_runner, fingerprint

C = be.Axis(3, "C")
H = be.Axis(4, "H")
N = be.Axis(5, "N", batch=True)
RNG = np.random.default_rng(7)
XV = RNG.standard_normal((3, 5))


def chain():
    """x -> h = tanh(x) -> s = exp(h): one primitive each, no views."""
    x = be.placeholder((C, N), dtype=np.float64, name="x")
    h = be.tanh(x)
    s = be.exp(h)
    return x, h, s


def test_values_match_the_reference():
    x = be.placeholder((C, N), dtype=np.float64, name="x")
    w = be.Variable((H, C), initial_value=lambda s: np.linspace(-1, 1, 12).reshape(s),
                    dtype=np.float64)
    y = be.softmax(be.dot(w, x))
    r = be.Runner()
    got = r.run(y, {x: XV})
    np.testing.assert_allclose(got, be.evaluate(y, feeds={x: XV}), rtol=1e-14)
    lst = r.run([y, be.sum(y, out_axes=())], {x: XV})
    assert isinstance(lst, list) and len(lst) == 2
    np.testing.assert_allclose(lst[1], 5.0, rtol=1e-14)


def test_same_inputs_are_not_recomputed():
    x, h, s = chain()
    r = be.Runner()
    first = r.run(s, {x: XV})
    assert r.last_primitives == 2
    np.testing.assert_allclose(first, np.exp(np.tanh(XV)), rtol=1e-15)
    again = r.run(s, {x: XV.copy()})       # another array with the same content
    assert r.last_primitives == 0
    np.testing.assert_array_equal(again, first)
    assert r.primitives_executed == 2 and r.computations_built == 1


def test_changed_feed_invalidates_everything_that_reads_it():
    x, h, s = chain()
    r = be.Runner()
    feed = XV.copy()
    r.run(s, {x: feed})
    feed[0, 0] += 1.0                       # the same array, changed in place
    got = r.run(s, {x: feed})
    assert r.last_primitives == 2
    np.testing.assert_allclose(got, np.exp(np.tanh(feed)), rtol=1e-15)
    r.run(s, {x: feed.astype(np.float32)})  # converted to float64: other bytes
    assert r.last_primitives == 2


def test_an_earlier_target_is_reused_inside_a_later_graph():
    x, h, s = chain()
    r = be.Runner()
    r.run(h, {x: XV})
    assert r.last_primitives == 1           # tanh
    np.testing.assert_allclose(r.run(s, {x: XV}), np.exp(np.tanh(XV)), rtol=1e-15)
    assert r.last_primitives == 1           # exp only: h was fed in
    r.run([h, s], {x: XV})
    assert r.last_primitives == 0
    r.run(s, {x: XV + 1})                   # new x: h is stale, both run
    assert r.last_primitives == 2


def test_intermediates_are_not_remembered():
    x, h, s = chain()
    r = be.Runner()
    r.run(s, {x: XV})
    r.run(h, {x: XV})                       # h ran inside s's graph but was no target
    assert r.last_primitives == 1


def test_unrelated_placeholders_do_not_invalidate():
    x, h, s = chain()
    z = be.placeholder((C,), dtype=np.float64, name="z")
    t = s * z                               # Expand view of z, then a multiply
    r = be.Runner()
    r.run(s, {x: XV})
    r.run(t, {x: XV, z: np.ones(3)})
    out = r.run(t, {x: XV, z: np.full(3, 2.0)})
    np.testing.assert_allclose(out, 2 * np.exp(np.tanh(XV)), rtol=1e-15)
    full = be.Runner()
    full.run(t, {x: XV, z: np.full(3, 2.0)})
    assert r.last_primitives == full.last_primitives - 2   # s reused: no tanh, no exp


def test_assignments_invalidate_what_reads_the_variable():
    x = be.placeholder((C, N), dtype=np.float64, name="x")
    w = be.Variable((C,), initial_value=1.0, dtype=np.float64, name="w")
    y = be.exp(x) * w
    other = be.exp(x) * 3.0                 # does not read w
    r = be.Runner()
    v1 = r.run([y, other], {x: XV})
    n = r.last_primitives
    r.run([y, other], {x: XV})
    assert r.last_primitives == 0
    upd = be.SetItem(w, w + 1.0)
    assert r.run(upd) is None and r.last_primitives >= 1
    v2 = r.run([y, other], {x: XV})
    np.testing.assert_allclose(v2[0], 2 * v1[0], rtol=1e-15)
    np.testing.assert_array_equal(v2[1], v1[1])
    assert 0 < r.last_primitives < n        # y again, other reused
    r.run(upd)
    r.run(other, {x: XV})
    assert r.last_primitives == 0


def test_values_that_depend_on_an_assignment_are_always_recomputed():
    w = be.Variable((), initial_value=0.0, dtype=np.float64, name="count")
    upd = be.SetItem(w, w + 1.0)
    after = w * 10.0                        # built after upd: computing it runs upd
    r = be.Runner()
    with pytest.warns(be.GeonWarning, match="runs though it was not requested"):
        assert r.run(after) == 10.0
    assert r.run(after) == 20.0 and r.last_primitives > 0
    assert r.run(w) == 2.0


def test_invalidate_initialize_restore(tmp_path):
    x = be.placeholder((C,), dtype=np.float64, name="x")
    w = be.Variable((C,), initial_value=2.0, dtype=np.float64, name="w_state")
    y = x * w
    r = be.Runner()
    np.testing.assert_array_equal(r.run(y, {x: np.ones(3)}), [2, 2, 2])
    r.save(tmp_path / "w.npz")
    # A write behind the runner's back is invisible until invalidate().
    np.copyto(r.transformer.state_view()[w], 5.0)
    np.testing.assert_array_equal(r.run(y, {x: np.ones(3)}), [2, 2, 2])
    assert r.last_primitives == 0
    r.invalidate([w])
    np.testing.assert_array_equal(r.run(y, {x: np.ones(3)}), [5, 5, 5])
    r.restore(tmp_path / "w.npz")
    np.testing.assert_array_equal(r.run(y, {x: np.ones(3)}), [2, 2, 2])
    np.copyto(r.transformer.state_view()[w], 7.0)
    r.initialize(force=True)
    np.testing.assert_array_equal(r.run(y, {x: np.ones(3)}), [2, 2, 2])
    assert r.last_primitives > 0
    r.invalidate()
    r.run(y, {x: np.ones(3)})
    assert r.last_primitives > 0


def test_results_are_copies_and_the_user_graph_is_untouched():
    x, h, s = chain()
    args = s.args
    r = be.Runner()
    out = r.run(s, {x: XV})
    out[:] = 0
    np.testing.assert_allclose(r.run(s, {x: XV}), np.exp(np.tanh(XV)), rtol=1e-15)
    assert s.forward is None and s.args == args and h.forward is None


def test_feed_errors():
    x, h, s = chain()
    r = be.Runner()
    with pytest.raises(be.FeedError, match="no value fed for placeholder x"):
        r.run(s)
    with pytest.raises(be.FeedError, match=r"x expects axes.*\(3, 5\).*\(5, 3\)"):
        r.run(s, {x: XV.T})
    with pytest.raises(be.FeedError, match="keyed by placeholders"):
        r.run(s, {h: XV})
    with pytest.raises(TypeError):
        r.run([s, 3])
    # A feed the targets do not need is ignored.
    z = be.placeholder((H,), name="unused")
    r.run(s, {x: XV, z: np.zeros(4)})


def test_computations_are_cached_and_bounded():
    x, h, s = chain()
    r = be.Runner(max_computations=2)
    for k in range(3):
        r.run(s, {x: XV + k})
    assert r.computations_built == 1
    twice, thrice = h * 2.0, h * 3.0
    r.run(twice, {x: XV})
    r.run(thrice, {x: XV})
    assert len(r.transformer.computations) == 2   # the oldest was dropped
    r.clear()
    assert r.transformer.computations == []
    r.run(s, {x: XV})
    assert r.last_primitives == 2


def test_default_runner_and_be_run():
    x, h, s = chain()
    assert isinstance(default_runner(), be.Runner)
    np.testing.assert_allclose(be.run(s, feeds={x: XV}), np.exp(np.tanh(XV)), rtol=1e-15)
    before = default_runner().primitives_executed
    be.run(s, feeds={x: XV})
    assert default_runner().primitives_executed == before


def test_counting_helpers():
    x, h, s = chain()
    comp = be.NumPyTransformer().computation(s, x)
    assert count_primitives(comp) == 2
    a = np.arange(6.0)
    assert fingerprint(a) == fingerprint(a.copy()) != fingerprint(a.reshape(2, 3))
    assert fingerprint(a) != fingerprint(a.astype(np.float32))


def test_runner_forgets_variables_the_user_dropped():
    big = be.Axis(50_000, "big")                  # 200 kB of float32 per variable
    r = be.Runner()
    refs = []
    gc.collect()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        for k in range(20):
            w = be.Variable(big, initial_value=float(k), name=f"w{k}")
            assert r.run(be.sum(w, out_axes=())) == pytest.approx(50_000.0 * k)
            refs.append(weakref.ref(w))
            del w
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    assert all(ref() is None for ref in refs)     # no variable outlived the user's code
    assert len(r.transformer.state) == 0 and r.transformer.computations == []
    assert kept < 2 * 200_000                     # 20 variables were 4 MB


def test_default_runner_keeps_only_reachable_variables():
    w = be.Variable(C, initial_value=2.0, name="kept")
    total = be.sum(w, out_axes=())
    gone = be.Variable(C, initial_value=3.0, name="gone")
    assert be.run([total, be.sum(gone, out_axes=())]) == [6.0, 9.0]
    ref = weakref.ref(gone)
    del gone
    gc.collect()
    assert ref() is None
    assert be.run(total) == 6.0 and w in default_runner().transformer.state


def test_value_written_by_a_later_initializer_is_recomputed():
    w = be.Variable(C, initial_value=1.0, dtype=np.float64, name="w")
    doubled = w * 2.0
    r = be.Runner()
    np.testing.assert_array_equal(r.run(doubled), [2.0, 2.0, 2.0])
    # An op whose computation's initialize() sets w to 5 (once, when first compiled).
    from geon.op_graph import op_graph as og
    reset = og.Tanh(be.placeholder(C, dtype=np.float64, name="z"),
                    initializers=[be.SetItem(w, 5.0, sequence=False)])
    r.run(reset, {reset.args[0]: np.zeros(3)})
    np.testing.assert_array_equal(r.transformer.state[w], [5.0, 5.0, 5.0])
    np.testing.assert_array_equal(r.run(doubled), [10.0, 10.0, 10.0])
    assert r.last_primitives > 0


def test_a_call_does_not_walk_the_graph_again(monkeypatch):
    """The graph is walked once per set of targets (and once more to build each
    computation); later calls, with new feeds or a changed Variable, only look at
    their inputs, and still see every change."""
    import geon.op_graph.run as run_module
    x = be.placeholder((C,), dtype=np.float64, name="x")
    y = be.placeholder((C,), dtype=np.float64, name="y")
    w = be.Variable((C,), initial_value=1.0, dtype=np.float64, name="w")
    h = x
    for k in range(300):
        h = h * 1.001 + w if k % 2 else be.tanh(h)
    t = h + y
    r = be.Runner()
    r.run([h, t], {x: XV[:, 0], y: XV[:, 1]})
    r.run(t, {x: XV[:, 0], y: XV[:, 1]})
    r.run(t, {x: XV[:, 0], y: XV[:, 2]})
    ref = be.Runner()
    want = [ref.run(t, {x: XV[:, 0], y: XV[:, k]}) for k in range(3)]
    walks = []
    real = run_module.graph_ops
    monkeypatch.setattr(run_module, "graph_ops", lambda *a, **k: walks.append(1) or real(*a, **k))
    for k in range(6):                      # new y only: h is reused
        got = r.run(t, {x: XV[:, 0], y: XV[:, k % 3]})
        assert r.last_primitives == 1
        np.testing.assert_allclose(got, want[k % 3], rtol=1e-15)
    assert walks == [] and r.computations_built == 2
    double = be.SetItem(w, w * 2.0)
    for k in range(3):                      # a changed Variable: t is computed in full
        r.run(double)
        ref.run(double)
        walks.clear()
        built = r.computations_built
        after = r.run(t, {x: XV[:, 0], y: XV[:, 0]})
        assert r.last_primitives > 1
        np.testing.assert_allclose(after, ref.run(t, {x: XV[:, 0], y: XV[:, 0]}),
                                   rtol=1e-15)
        assert not np.allclose(after, want[0])
        if k:                               # the second time: nothing walked or built
            assert walks == [] and r.computations_built == built
        r.run(t, {x: XV[:, 0], y: XV[:, 0]})
        assert r.last_primitives == 0


def test_new_shapes_dtypes_and_rewired_graphs_are_seen():
    x = be.placeholder((C,), dtype=np.float64, name="x")
    s = be.exp(x) * 2.0
    r = be.Runner()
    np.testing.assert_allclose(r.run(s, {x: np.ones(3)}), 2 * np.e, rtol=1e-15)
    # a feed of another dtype is converted (other bytes: computed again)
    got = r.run(s, {x: np.zeros(3, np.float32)})
    assert r.last_primitives > 0
    np.testing.assert_allclose(got, 2.0, rtol=1e-15)
    with pytest.raises(be.FeedError, match="x"):
        r.run(s, {x: np.zeros(4)})
    # Compiling the user's ops directly rewrites their graph in place (here CSE
    # forwards one exp to the other): the runner's kept walk of it is made again.
    from geon.op_graph import nodes
    a, b = be.exp(x), be.exp(x)
    t = a * 2.0 + b
    np.testing.assert_allclose(r.run(t, {x: np.ones(3)}), 3 * np.e, rtol=1e-15)
    edits = nodes.graph_edits
    plan = r._plans[(id(t),)]
    be.NumPyTransformer().computation(t, x)
    assert b.forward is a and nodes.graph_edits != edits
    np.testing.assert_allclose(r.run(t, {x: np.full(3, 0.5)}), 3 * np.exp(0.5),
                               rtol=1e-15)
    assert r._plans[(id(t),)] is not plan
    np.testing.assert_allclose(r.run(t, {x: np.full(3, 0.5)}), 3 * np.exp(0.5),
                               rtol=1e-15)
    assert r.last_primitives == 0


def test_kept_walks_do_not_keep_targets_alive():
    x = be.placeholder((C,), dtype=np.float64, name="x")
    r = be.Runner()
    refs = []
    for k in range(5):
        t = be.tanh(x) * float(k)
        r.run([t, x], {x: np.ones(3)})
        refs.append(weakref.ref(t))
        del t
    gc.collect()
    assert all(ref() is None for ref in refs)
    assert len(r._plans) == 0
