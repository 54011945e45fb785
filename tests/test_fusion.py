"""Fused elementwise groups: with the size thresholds lowered, every op-table case gets
an elementwise tail that is fused (blocks of 3 rows, two threads), and results equal
NumPy's. This module tests the NumPy code's blocked groups: compiling them (the default
``compiled="auto"``) is turned off here; tests/test_compiled.py tests the C loops."""

import numpy as np
import pytest

import geon as be
from geon.op_graph import op_graph as og
from geon.transformers import fusion, threads
from op_table import CASES

from test_ops import TOL


@pytest.fixture(autouse=True)
def numpy_code(monkeypatch):
    """Every NumPy transformer made without ``compiled=`` runs the NumPy code."""
    monkeypatch.setenv("GEON_COMPILED", "0")



@pytest.fixture
def fuse_everything(monkeypatch):
    monkeypatch.setattr(fusion, "MIN_ELEMENTS", 1)
    monkeypatch.setattr(fusion, "BLOCK_ELEMENTS", 3)     # several blocks per group
    monkeypatch.setattr(fusion, "PARALLEL_ELEMENTS", 1)  # and split over threads
    monkeypatch.setattr(fusion, "MAX_THREADS", 2)
    monkeypatch.setattr(threads.POLICY, "threads", 2)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_fused_op_table_matches_numpy(case, fuse_everything):
    dtype = np.float64
    arrays = case.arrays(dtype)
    xs = [be.placeholder(i.axes, dtype=i.dtype(dtype)) for i in case.inputs]
    op = case.make(xs, dtype)
    want = case.expected(arrays)
    tail = op.dtype.kind == "f" and len(op.axes) > 0
    if tail:  # an elementwise tail, so that a group forms in every such case
        op = be.tanh(op * 0.5) + op
        want = np.tanh(want * 0.5) + want
    comp = be.NumPyTransformer().computation(op, *xs)
    assert comp.groups or not tail
    got = np.asarray(comp(*arrays))
    if got.dtype.kind in "iu":
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, **TOL[np.dtype(got.dtype)])


def _mlp(dtype=np.float64):
    F, H, Y = be.Axis(7, "fF"), be.Axis(5, "fH"), be.Axis(3, "fY")
    N = be.Axis(6, "fN", batch=True)
    rng = np.random.default_rng(3)
    x = be.placeholder([F, N], dtype=dtype)
    t = be.placeholder([Y, N], dtype=dtype)
    W1 = be.Variable(axes=[H, F], initial_value=rng.standard_normal((5, 7)), dtype=dtype)
    W2 = be.Variable(axes=[Y, H], initial_value=rng.standard_normal((3, 5)), dtype=dtype)
    b1 = be.Variable(axes=[H], initial_value=0.1, dtype=dtype)
    h = be.maximum(be.dot(W1, x) + b1, 0.0)
    y = be.softmax(be.dot(W2, be.sigmoid(h) * h))
    loss = be.sum(be.cross_entropy_multi(y, t), out_axes=())
    ups = [be.SetItem(v, v - 0.1 * be.deriv(loss, v)) for v in (W1, W2, b1)]
    return [loss] + ups, (x, t), (W1, W2, b1)


def test_fused_training_step_matches_unfused(fuse_everything):
    rng = np.random.default_rng(0)
    xs, ts = rng.standard_normal((7, 6)), np.eye(3)[rng.integers(0, 3, 6)].T
    runs = []
    for disable in ([], ["fusion"]):
        results, params, variables = _mlp()
        t = be.NumPyTransformer(disable=disable)
        step = t.computation(results, *params)
        losses = [step(xs, ts)[0] for _ in range(3)]
        runs.append((losses, [t.state[v].copy() for v in variables], step))
    (l1, s1, fused), (l2, s2, plain) = runs
    assert fused.groups and not plain.groups
    assert "_run_blocks" in fused.source and "_run_blocks" not in plain.source
    np.testing.assert_allclose(l1, l2, rtol=1e-12)
    for a, b in zip(s1, s2):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def test_internal_values_get_no_buffer(fuse_everything):
    A = be.Axis(10, "fA")
    x = be.placeholder([A], dtype=np.float64)
    y = be.tanh(be.exp(x * 0.5) + 1.0)
    f = be.NumPyTransformer().computation(y, x)
    (g,) = f.groups
    assert len(g.members) == 4 and len(g.internal) == 3
    assert f.plan.sizes == []  # the three intermediates live in scratch blocks only
    v = np.linspace(-1, 1, 10)
    np.testing.assert_allclose(f(v), np.tanh(np.exp(v * 0.5) + 1.0), rtol=1e-15)


def test_a_member_is_never_read_through_a_view(fuse_everything):
    A2, B2 = be.Axis(6, "fvA"), be.Axis(6, "fvB")
    x = be.placeholder([A2, B2], dtype=np.float64)
    xt = be.placeholder([B2, A2], dtype=np.float64)
    y = (be.exp(xt) + be.exp(x)) * 2.0  # exp(x) is read transposed by the add
    f = be.NumPyTransformer().computation(y, x, xt)
    a, b = np.random.default_rng(1).random((2, 6, 6))
    np.testing.assert_allclose(f(a, b), (np.exp(b) + np.exp(a).T) * 2, rtol=1e-15)


def test_group_outputs_do_not_reuse_arenas_the_group_still_reads(fuse_everything):
    from geon.op_graph import op_graph as og
    A2, B2, K2 = be.Axis(8, "frA"), be.Axis(4, "frB"), be.Axis(3, "frK")
    x = be.placeholder([A2, B2], dtype=np.float32)
    P = be.placeholder([A2, K2], dtype=np.float64)
    Q = be.placeholder([K2, B2], dtype=np.float64)
    mask = be.greater(x, 0.0)                      # float32, dies inside the group
    g = be.dot(P, Q)
    w = be.tanh(og.Multiply(mask, g, dtype=np.float64))  # float64: bigger elements
    outs = [be.sum(mask, out_axes=()), be.sum(w, out_axes=()) + be.sum(g, out_axes=())]
    rng = np.random.default_rng(0)
    v, p, q = (rng.standard_normal((8, 4)).astype(np.float32),
               rng.standard_normal((8, 3)), rng.standard_normal((3, 4)))
    f = be.NumPyTransformer().computation(outs, x, P, Q)  # the plan is verified too
    assert f.groups
    gg = p @ q
    np.testing.assert_allclose(f(v, p, q)[1], np.tanh((v > 0) * gg).sum() + gg.sum(),
                               rtol=1e-12)


def test_ops_of_equal_size_but_different_shapes_are_never_one_group():
    # (256, 1024) and (1024, 256): the same element count. Scheduled one after the
    # other they sit in one fusion region; grouping by element count alone would run
    # them as one group, reading the second with the first's blocking.
    from geon.transformers.gpu import CudaCodegenTransformer
    P, Q = be.Axis(256, "fP"), be.Axis(1024, "fQ")

    def build(transformer):
        x = be.placeholder([P, Q])
        y = be.placeholder([Q, P])
        a = be.exp(x) * 2.0 + x
        b = be.tanh(y) * 3.0 - y
        return transformer.computation([a, b], x, y)

    gpu = build(CudaCodegenTransformer())  # its own grouping, same rule
    assert gpu.program.groups
    for g in gpu.program.groups:
        assert len({m.axes.lengths for m in g.members}) == 1, g.members
    f = build(be.NumPyTransformer())
    assert f.groups  # the region is fused (default thresholds)
    ops = [op for g in f.groups for op in g.members]
    assert {op.axes.lengths for op in ops} == {(256, 1024), (1024, 256)}
    for g in f.groups:
        assert len({m.axes.lengths for m in g.members}) == 1, g.members
    rng = np.random.default_rng(5)
    xv = rng.standard_normal((256, 1024)).astype(np.float32)
    yv = rng.standard_normal((1024, 256)).astype(np.float32)
    ga, gb = f(xv, yv)
    np.testing.assert_allclose(ga, np.exp(xv) * 2 + xv, rtol=1e-6)
    np.testing.assert_allclose(gb, np.tanh(yv) * 3 - yv, rtol=1e-6, atol=1e-6)


def _recording(fn_slow_pool=None):
    """A block function that records ``(lo, hi, thread, scratch)`` of each call."""
    import threading
    calls, lock = [], threading.Lock()

    def fn(lo, hi, s):
        if fn_slow_pool is not None and threading.current_thread() is not \
                threading.main_thread():
            fn_slow_pool()
        with lock:
            calls.append((lo, hi, threading.get_ident(), id(s)))

    return fn, calls


def test_run_blocks_hands_out_blocks_dynamically(monkeypatch):
    # The pool worker is stalled in its first block until the calling thread has done
    # every other block: with blocks handed out on demand the caller does them all
    # (with fixed halves it would wait, with the stalled worker owning half).
    import threading
    monkeypatch.setattr(fusion, "MAX_THREADS", 2)
    monkeypatch.setattr(threads.POLICY, "threads", 2)
    rows, block = 50, 3
    blocks = -(-rows // block)
    rest_done = threading.Event()
    fn, calls = _recording(lambda: rest_done.wait(timeout=10))
    main = threading.get_ident()

    def caller_side(lo, hi, s):
        fn(lo, hi, s)
        if sum(c[2] == main for c in calls) >= blocks - 1:
            rest_done.set()

    def either(lo, hi, s):
        (caller_side if threading.get_ident() == main else fn)(lo, hi, s)

    scratch = [[np.empty(3)], [np.empty(3)]]
    fusion.run_blocks(either, rows, block, scratch)
    spans = sorted((lo, hi) for lo, hi, _, _ in calls)
    assert spans == [(lo, min(lo + block, rows)) for lo in range(0, rows, block)]
    by_caller = [c for c in calls if c[2] == main]
    others = [c for c in calls if c[2] != main]
    assert len(others) <= 1 and len(by_caller) >= blocks - 1
    assert {c[3] for c in by_caller} == {id(scratch[0][0])}  # each worker its own set
    assert {c[3] for c in others} <= {id(scratch[1][0])}


def test_run_blocks_raises_a_workers_error_after_all_stopped(monkeypatch):
    # A block that raises: the error reaches the caller, and only once no worker runs
    # a block any more (none writes a buffer after run_blocks returned).
    import time
    monkeypatch.setattr(fusion, "MAX_THREADS", 2)
    monkeypatch.setattr(threads.POLICY, "threads", 2)
    ran = []

    def fn(lo, hi, s):
        if lo == 6:
            raise ValueError("block 6")
        time.sleep(0.001)
        ran.append(lo)

    with pytest.raises(ValueError, match="block 6"):
        fusion.run_blocks(fn, 600, 3, [[None], [None]])
    after = len(ran)
    time.sleep(0.05)
    assert len(ran) == after < 200  # stopped early, and nothing ran after the return
    assert len(ran) == len(set(ran))


def test_fused_step_with_a_slow_worker_matches_unfused(fuse_everything, monkeypatch):
    # One worker sleeps in every block it takes: the results equal the unfused run's.
    import threading
    import time
    real = fusion.run_blocks
    seen = []

    def slowed(fn, rows, block, scratch_sets):
        spans = []

        def wrapped(lo, hi, *s):
            if threading.current_thread() is not threading.main_thread():
                time.sleep(0.002)
            spans.append((lo, hi))
            fn(lo, hi, *s)
        real(wrapped, rows, block, scratch_sets)
        # every block of the group ran exactly once (one call on one worker)
        assert sorted(spans) == ([(lo, min(lo + block, rows))
                                  for lo in range(0, rows, block)]
                                 if len(scratch_sets) > 1 else [(0, rows)])
        seen.append(len(scratch_sets))

    monkeypatch.setattr(fusion, "run_blocks", slowed)
    rng = np.random.default_rng(0)
    xs, ts = rng.standard_normal((7, 6)), np.eye(3)[rng.integers(0, 3, 6)].T
    runs = []
    for disable in ([], ["fusion"]):
        results, params, variables = _mlp()
        t = be.NumPyTransformer(disable=disable)
        step = t.computation(results, *params)
        losses = [step(xs, ts)[0] for _ in range(3)]
        runs.append((losses, [t.state[v].copy() for v in variables]))
    assert 2 in seen  # the fused run went through the slowed runner, on two workers
    (l1, s1), (l2, s2) = runs
    np.testing.assert_allclose(l1, l2, rtol=1e-12)
    for a, b in zip(s1, s2):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def _reduced_rows(dtype=np.float64):
    A, B = be.Axis(7, "rtA"), be.Axis(5, "rtB")
    x = be.placeholder([A, B], dtype=dtype)
    y = be.tanh(x * 0.5) * x             # read only by the reductions below
    outs = [be.sum(y, reduction_axes=B), be.max(y, reduction_axes=B),
            be.argmax(y, reduction_axes=B), be.sum(y, reduction_axes=A)]
    return outs, x


def _want_rows(v):
    y = np.tanh(v * 0.5) * v
    return [y.sum(1), y.max(1), y.argmax(1), y.sum(0)]


def test_row_reductions_join_the_group_before_them(fuse_everything):
    from geon.op_graph import primitives as pr
    outs, x = _reduced_rows()
    f = be.NumPyTransformer().computation(outs, x)
    tails = [m for g in f.groups for m in g.members if isinstance(m, pr.ReducePrim)]
    assert tails and all(m.axis == 1 for m in tails)
    # the product is read by reductions of rows only, so it has no full buffer: it lives
    # in a block of scratch
    (g,) = [g for g in f.groups if tails[0] in g.members]
    assert any(isinstance(m, og.Multiply) for m in g.internal)
    v = np.random.default_rng(2).standard_normal((7, 5))
    for got, want in zip(f(v), _want_rows(v)):
        if want.dtype.kind == "i":
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15)


def test_row_reductions_give_the_unfused_values(fuse_everything):
    v = np.random.default_rng(3).standard_normal((7, 5)).astype(np.float32)
    v[1, 2], v[4, 0] = np.nan, np.inf    # propagate the same way block by block
    got = []
    for disable in ([], ["fusion"]):
        outs, x = _reduced_rows(np.float32)
        f = be.NumPyTransformer(disable=disable).computation(outs, x)
        assert bool(f.groups) == (not disable)
        got.append(f(v))
    (s1, m1, i1, c1), (s2, m2, i2, c2) = got
    np.testing.assert_array_equal(m1, m2)
    np.testing.assert_array_equal(i1, i2)
    # sums run through the BLAS, whose order of additions depends on the rows it is
    # given: the same values to float32 rounding, NaN and infinity in the same places
    for a, b in ((s1, s2), (c1, c2)):
        np.testing.assert_allclose(a, b, rtol=1e-6)
        np.testing.assert_array_equal(np.isfinite(a), np.isfinite(b))


def test_a_reduction_of_the_first_axis_stays_out_of_the_group(fuse_everything):
    from geon.op_graph import primitives as pr
    A, B = be.Axis(7, "rcA"), be.Axis(5, "rcB")
    x = be.placeholder([A, B], dtype=np.float64)
    s = be.sum(be.exp(x) + 1.0, reduction_axes=A)
    f = be.NumPyTransformer().computation(s, x)
    assert not any(isinstance(m, pr.ReducePrim) for g in f.groups for m in g.members)
    v = np.random.default_rng(4).standard_normal((7, 5))
    np.testing.assert_allclose(f(v), (np.exp(v) + 1.0).sum(0), rtol=1e-14)


def test_a_member_writes_over_the_arena_its_internal_arg_was_computed_over(
        fuse_everything):
    # relu(W @ x + b): the bias add lives over the product's blocks (no buffer), and the
    # ReLU, its last reader, writes over the same arena instead of taking a new one
    from geon.op_graph import primitives as pr
    H, F, N, Y = (be.Axis(6, "ciH"), be.Axis(4, "ciF"), be.Axis(5, "ciN"),
                  be.Axis(3, "ciY"))
    x = be.placeholder([F, N], dtype=np.float64)
    W = be.placeholder([H, F], dtype=np.float64)
    b = be.placeholder([H], dtype=np.float64)
    V = be.placeholder([Y, H], dtype=np.float64)
    h = be.maximum(be.dot(W, x) + b, 0.0)
    f = be.NumPyTransformer().computation(be.dot(V, h), x, W, b, V)  # plan verified
    gemm = next(op for op in f.plan.slot if isinstance(op, pr.Gemm))
    relu = next(op for op in f.plan.slot if isinstance(op, og.Maximum))
    assert f.plan.slot[relu] == f.plan.slot[gemm]
    rng = np.random.default_rng(6)
    xs, ws, bs, vs = (rng.standard_normal((4, 5)), rng.standard_normal((6, 4)),
                      rng.standard_normal(6), rng.standard_normal((3, 6)))
    want = vs @ np.maximum(ws @ xs + bs[:, None], 0.0)
    np.testing.assert_allclose(f(xs, ws, bs, vs), want, rtol=1e-13)


def test_no_write_over_an_arena_whose_internal_value_is_read_later(fuse_everything):
    from geon.op_graph import primitives as pr
    H, F, N = be.Axis(6, "cjH"), be.Axis(4, "cjF"), be.Axis(5, "cjN")
    x = be.placeholder([F, N], dtype=np.float64)
    W = be.placeholder([H, F], dtype=np.float64)
    z = be.dot(W, x) + 1.0                    # internal, read by both members below
    y = be.maximum(z, 0.0) * z
    f = be.NumPyTransformer().computation(be.tanh(y) + y, x, W)
    gemm = next(op for op in f.plan.slot if isinstance(op, pr.Gemm))
    relu = [op for op in f.plan.slot if isinstance(op, og.Maximum)]
    assert all(f.plan.slot[r] != f.plan.slot[gemm] for r in relu)
    rng = np.random.default_rng(7)
    xs, ws = rng.standard_normal((4, 5)), rng.standard_normal((6, 4))
    zz = ws @ xs + 1.0
    yy = np.maximum(zz, 0.0) * zz
    np.testing.assert_allclose(f(xs, ws), np.tanh(yy) + yy, rtol=1e-14)
