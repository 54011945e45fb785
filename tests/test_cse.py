"""The hash-consing pass (``cse``): what it merges, what it must not merge, op counts on
the digits example and on derivative graphs, and unchanged results with it on or off
over the op table (values and gradients)."""

import numpy as np
import pytest

import geon as be
from example_graphs import digits_graphs
from geon.op_graph import op_graph as og
from geon.op_graph import primitives as pr
from geon.transformers.passes import Graph
from geon.transformers.passes.cse import CommonSubexpressionElimination, cse_key
from op_table import CASES

C = be.Axis(3, "C")
H = be.Axis(4, "H")
N = be.Axis(5, "N", batch=True)
OFF = ["cse"]


def count(comp, cls):
    return sum(isinstance(op, cls) for op in comp.ops)


def test_cse_is_in_the_pipeline_and_can_be_switched_off():
    names = [p.name for p in be.NumPyTransformer().passes()]
    assert "cse" in names
    assert names.index("fold") < names.index("cse") < names.index("dce")
    be.NumPyTransformer(disable=OFF)  # accepted like the other optional passes


def test_identical_ops_merge():
    x = be.placeholder((C, N), dtype=np.float64)
    a, b = be.exp(x), be.exp(x)            # built twice by the user
    y = be.sum(a, reduction_axes=C) + be.sum(b, reduction_axes=C)
    on = be.NumPyTransformer().computation(y, x)
    x2 = be.placeholder((C, N), dtype=np.float64)
    y2 = be.sum(be.exp(x2), reduction_axes=C) + be.sum(be.exp(x2), reduction_axes=C)
    off = be.NumPyTransformer(disable=OFF).computation(y2, x2)
    assert count(on, og.Exp) == 1 and count(off, og.Exp) == 2
    assert count(on, pr.ReduceSum) == 1 and count(off, pr.ReduceSum) == 2
    v = np.random.default_rng(0).standard_normal((3, 5))
    np.testing.assert_array_equal(on(v), off(v))
    np.testing.assert_allclose(on(v), 2 * np.exp(v).sum(0), rtol=1e-14)
    # The merged op forwards to the survivor.
    assert be.snap(a) is be.snap(b)


def test_attributes_keep_ops_apart():
    x = be.placeholder((C, H, N), dtype=np.float64)
    s1 = be.slice_along_axis(x, H, slice(0, 2), new_axis=be.Axis(2, "H2"))
    s2 = be.slice_along_axis(x, H, slice(2, 4), new_axis=be.Axis(2, "H2"))
    r1, r2 = be.sum(x, reduction_axes=C), be.sum(x, reduction_axes=H)
    t1, t2 = be.tensor_size(x, reduction_axes=C), be.tensor_size(x, reduction_axes=H)
    for a, b in [(s1, s2), (r1, r2), (t1, t2)]:
        assert cse_key(a) != cse_key(b)
    assert cse_key(be.sum(x, reduction_axes=C)) == cse_key(r1)
    y = be.sum(s1 - s2, out_axes=()) + be.sum(r1, out_axes=()) * t1 / t2
    v = np.random.default_rng(1).standard_normal((3, 4, 5))
    got = be.NumPyTransformer().computation(y, x)(v)
    want = (v[:, :2] - v[:, 2:]).sum() + v.sum() * 3 / 4
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_dtype_keeps_ops_apart():
    """Two conversions of one tensor, the same class, args and axes but to float64 and
    to int32, are different values: a key without the dtype would merge them (and the
    replacement would change the int32 result's type)."""
    x = be.placeholder((C,), dtype=np.float32, name="x")
    wide, whole = og.Negative(x, dtype=np.float64), og.Negative(x, dtype=np.int32)
    assert cse_key(wide) != cse_key(whole)
    assert cse_key(og.Negative(x, dtype=np.float64)) == cse_key(wide)  # same dtype: one
    comp = be.NumPyTransformer().computation([wide, whole], x)
    assert count(comp, og.Negative) == 2
    v = np.array([1.75, -2.5, 3.25], np.float32)
    got_wide, got_whole = comp(v)
    assert got_wide.dtype == np.float64 and got_whole.dtype == np.int32
    np.testing.assert_array_equal(got_wide, [-1.75, 2.5, -3.25])
    np.testing.assert_array_equal(got_whole, [-1, 2, -3])


def test_placeholders_and_variables_are_never_merged():
    p, q = be.placeholder((C,), name="p"), be.placeholder((C,), name="q")
    v = be.Variable((C,), initial_value=1.0, name="v")
    u = be.Variable((C,), initial_value=1.0, name="u")
    for op in (p, q, v, u):
        assert cse_key(op) is None
    y = (p + v) - (q + u)
    comp = be.NumPyTransformer().computation([y, be.SetItem(v, v + 1)], p, q)
    assert count(comp, og.Placeholder) == 2 and count(comp, og.Variable) == 2
    np.testing.assert_array_equal(comp(np.ones(3), np.zeros(3))[0], [1, 1, 1])
    np.testing.assert_array_equal(comp(np.ones(3), np.zeros(3))[0], [2, 2, 2])


def test_constants_merge_only_when_equal():
    k = be.Axis(2, "K")
    same = [be.Constant(np.array([1.0, 2.0]), axes=k) for _ in range(2)]
    assert cse_key(same[0]) == cse_key(same[1])
    for a, b in [(be.Constant(0.0, dtype=np.float64), be.Constant(-0.0, dtype=np.float64)),
                 (be.Constant(1.0, dtype=np.float32), be.Constant(1.0, dtype=np.float64)),
                 (be.Constant(np.array([1.0, 2.0]), axes=k),
                  be.Constant(np.array([1.0, 3.0]), axes=k))]:
        assert cse_key(a) != cse_key(b)
    x = be.placeholder((k,), dtype=np.float64)
    y = x * same[0] + x * same[1]
    comp = be.NumPyTransformer().computation(y, x)
    assert count(comp, og.Constant) == 1 and count(comp, og.Multiply) == 1
    np.testing.assert_array_equal(comp(np.array([3.0, 4.0])), [6.0, 16.0])


def test_reads_on_either_side_of_a_setitem_stay_apart():
    w = be.Variable((C,), initial_value=1.0, name="w", dtype=np.float64)
    two = be.Constant(2.0, dtype=np.float64)
    before_a = w * two
    before_b = w * two                      # identical to before_a: merged
    upd = be.SetItem(w, w + 1.0)
    after = w * two                         # runs after upd (other_deps): kept apart
    assert cse_key(before_a) == cse_key(before_b) != cse_key(after)
    assert upd in after.other_deps
    t = be.NumPyTransformer()
    comp = t.computation([before_a, before_b, upd, after])
    a, b, _, c = comp()
    np.testing.assert_array_equal(a, [2, 2, 2])
    np.testing.assert_array_equal(b, [2, 2, 2])
    np.testing.assert_array_equal(c, [4, 4, 4])
    w2 = be.Variable((C,), initial_value=1.0, name="w2", dtype=np.float64)
    off = be.NumPyTransformer(disable=OFF).computation(
        [w2 * 2.0, w2 * 2.0, be.SetItem(w2, w2 + 1.0), w2 * 2.0])
    assert [np.asarray(r).tolist() if r is not None else None for r in off()] == \
        [[2, 2, 2], [2, 2, 2], None, [4, 4, 4]]
    assert count(comp, og.Multiply) < count(off, og.Multiply)


def test_void_ops_are_never_merged():
    w = be.Variable((), initial_value=0.0, name="counter", dtype=np.float64)
    one = be.Constant(1.0, dtype=np.float64)
    a = be.SetItem(w, w + one, sequence=False)
    b = be.SetItem(w, w + one, sequence=False)
    assert cse_key(a) is None and cse_key(b) is None
    t = be.NumPyTransformer()
    t.computation([a, b])()
    assert count(t.computations[0], be.SetItem) + count(t.computations[0], pr.Assign) == 2


def _digits_graphs():
    return digits_graphs(batch_size=8, n_test=12)


def _user_level_counts(results):
    """Op counts of the user's graph before and after CSE alone (on a copy)."""
    from geon.op_graph.params import clone_graph
    m = clone_graph(results)
    g = Graph([m[be.snap(r)] for r in results])
    p = CommonSubexpressionElimination()
    p.run(g, None)
    return p.before, p.after


def _compiled_counts(build):
    """Ops in the compiled graph with CSE on and off, and the results of both."""
    counts, values = [], []
    for disable in ([], OFF):
        results, params, feeds = build()
        comp = be.NumPyTransformer(disable=disable).computation(results, *params)
        counts.append(len(comp.ops))
        values.append(comp(*feeds))
    return counts, values


def test_op_counts_example_model(capsys):
    report = []
    for i, label in enumerate(["evaluate", "step_value", "train_step"]):
        def build(i=i):
            results, params = _digits_graphs()[i]
            rng = np.random.default_rng(0)
            feeds = [rng.integers(0, 10, p.axes.shape) if p.dtype.kind == "i"
                     else rng.uniform(0, 1, p.axes.shape) for p in params]
            return results, params, feeds
        (on, off), (v_on, v_off) = _compiled_counts(build)
        results, _ = _digits_graphs()[i]
        before, after = _user_level_counts(results if isinstance(results, list)
                                           else [results])
        report.append(f"digits {label}: user graph {before} -> {after} ops; "
                      f"compiled {off} -> {on} ops")
        assert on <= off and after <= before
        for a, b in zip(np.atleast_1d(v_on) if not isinstance(v_on, tuple) else v_on,
                        np.atleast_1d(v_off) if not isinstance(v_off, tuple) else v_off):
            if a is not None:
                np.testing.assert_array_equal(a, b)
        if label == "train_step":
            assert on < off   # the training graph has duplicates (constants, views)
    with capsys.disabled():
        print("\n" + "\n".join(report))


def test_op_counts_derivative_graph(capsys):
    def build(order=1):
        x = be.placeholder((C, N), dtype=np.float64, name="x")
        w1 = be.Variable((H, C), initial_value=lambda s: np.linspace(-1, 1, 12).reshape(s),
                         dtype=np.float64, name="w1")
        w2 = be.Variable((C, H), initial_value=lambda s: np.linspace(1, -1, 12).reshape(s),
                         dtype=np.float64, name="w2")
        h = be.tanh(be.dot(w1, x))
        y = be.sigmoid(be.dot(w2, h))
        loss = be.sum(y * y, out_axes=())
        grads = [be.deriv(loss, w) for w in (w1, w2)]
        if order == 2:   # a second derivative: d/dw1 of |dloss/dw1|^2
            grads.append(be.deriv(be.sum(grads[0] * grads[0], out_axes=()), w1))
        feeds = [np.linspace(-2, 2, 15).reshape(3, 5)]
        return [loss] + grads, [x], feeds

    report = []
    for order in (1, 2):
        (on, off), (v_on, v_off) = _compiled_counts(lambda: build(order))
        results, _, _ = build(order)
        before, after = _user_level_counts(results)
        report.append(f"derivative graph (order {order}): user graph {before} -> {after} "
                      f"ops; compiled {off} -> {on} ops")
        assert on < off and after < before
        for a, b in zip(v_on, v_off):
            np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-15)
    with capsys.disabled():
        print("\n" + "\n".join(report))


def _case_graph(case, arrays):
    xs = [be.placeholder(i.axes, dtype=i.dtype(np.float64)) for i in case.inputs]
    op = case.make(xs, np.float64)
    results = [op]
    if case.grad:
        r = be.Constant(np.linspace(-1, 1, op.axes.size).reshape(op.axes.shape),
                        axes=op.axes, dtype=np.float64) if len(op.axes) else 1.0
        loss = be.sum(op * r, out_axes=())
        results += [be.deriv(loss, x) for x, i in zip(xs, case.inputs) if i.kind == "float"]
    return results, xs


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_results_unchanged_with_cse_on_or_off(case):
    arrays = case.arrays(np.float64)
    got = []
    for disable in ([], OFF):
        results, xs = _case_graph(case, arrays)
        got.append(be.NumPyTransformer(disable=disable).computation(results, *xs)(*arrays))
    for a, b in zip(*got):
        # The same primitives run; only duplicates are gone, so results are bitwise equal
        # up to the order of additions in merged accumulations.
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-15)


def test_merged_multi_output_ops_keep_every_output_used():
    # Two equal max_argmax ops, one read for its maximum and the other for its index:
    # after the merge both values come from the survivor (the code generator used to
    # meet the merged op's orphaned Output and fail with a KeyError).
    x = be.placeholder((H, C))
    m, _ = be.max_argmax(x, reduction_axes=[H])
    _, i = be.max_argmax(x, reduction_axes=[H])
    s, order = be.sort(x, H), be.argsort(x, H)
    f = be.NumPyTransformer().computation([m, i, s, order], x)
    X = np.random.default_rng(3).permutation(12).reshape(4, 3).astype(np.float32)
    got = f(X)
    np.testing.assert_array_equal(got[0], X.max(0))
    np.testing.assert_array_equal(got[1], X.argmax(0))
    np.testing.assert_array_equal(got[2], np.sort(X, 0))
    np.testing.assert_array_equal(got[3], np.argsort(X, 0, kind="stable"))
    assert count(f, pr.ReduceMaxArgMax) == 1
