"""Memory and the SGD update in the NumPy transformer: an update's gradient product
computed block by block inside its fused group, internal values written over the blocks
of args that die in the group, and the size-ordered memory plan."""

import numpy as np
import pytest

import geon as be
from geon.op_graph import primitives as pr
from geon.transformers import fusion, memory
from geon.transformers.numpy import blas, transformer


@pytest.fixture
def fuse_small(monkeypatch):
    """The NumPy code's blocked groups on small tensors (compiled groups: see
    tests/test_compiled.py)."""
    monkeypatch.setenv("GEON_COMPILED", "0")
    monkeypatch.setattr(fusion, "MIN_ELEMENTS", 1)
    monkeypatch.setattr(fusion, "BLOCK_ELEMENTS", 8)     # several blocks per group
    monkeypatch.setattr(fusion, "PARALLEL_ELEMENTS", 1)  # threads where allowed
    monkeypatch.setattr(fusion, "MAX_THREADS", 2)


def _gradient_update():
    """``W <- W - 0.1 * (a @ b)``: (W, the assignment, placeholders)."""
    I, J, K = be.Axis(6, "uI"), be.Axis(4, "uJ"), be.Axis(5, "uK")
    a = be.placeholder([I, K], dtype=np.float64)
    b = be.placeholder([K, J], dtype=np.float64)
    W = be.Variable(axes=[I, J], initial_value=np.arange(24.0).reshape(6, 4) / 7,
                    dtype=np.float64)
    return W, be.SetItem(W, W - 0.1 * be.dot(a, b)), (a, b)


@pytest.fixture
def no_blas(monkeypatch):
    monkeypatch.setattr(blas, "_GEMM", {})  # as where NumPy's OpenBLAS is not found


needs_blas = pytest.mark.skipif(not blas.available(), reason="NumPy's bundled OpenBLAS "
                                "(scipy-openblas) was not found: NumPy is built with "
                                "another BLAS")


def test_gradient_product_runs_block_by_block_in_the_update(fuse_small, no_blas):
    rng = np.random.default_rng(0)
    av, bv = rng.standard_normal((6, 5)), rng.standard_normal((5, 4))
    got = {}
    for disable in ([], ["fusion"]):
        W, upd, ps = _gradient_update()
        t = be.NumPyTransformer(disable=disable)
        f = t.computation(upd, *ps)
        for _ in range(2):
            f(av, bv)
        got[bool(disable)] = t.state[W].copy()
        if not disable:
            heads = [g for g in f.groups if isinstance(g.members[0], pr.Gemm)]
            assert len(heads) == 1 and heads[0].members[0] in heads[0].internal
            assert heads[0].members[0] not in f.plan.slot  # no full-size gradient
            assert fusion.threads_for(heads[0]) == 1  # BLAS has its own threads
            assert "np.matmul(b_" in f.source  # a block of rows of the first operand
    want = np.arange(24.0).reshape(6, 4) / 7 - 0.2 * (av @ bv)
    np.testing.assert_allclose(got[False], want, rtol=1e-13)
    np.testing.assert_allclose(got[True], want, rtol=1e-13)


def test_a_groups_product_operands_live_to_the_groups_end(fuse_small):
    # Every block of the product reads all of its second operand (and its own rows of
    # the first): both count as reads at other positions than the block written, so
    # the plan keeps them to the group's end and nothing is computed over them.
    W, upd, ps = _gradient_update()
    f = be.NumPyTransformer().computation(upd, *ps)
    (g,) = [g for g in f.groups if isinstance(g.members[0], pr.Gemm)]
    root = memory.value_roots(f.order)
    gemm = g.members[0]
    assert {root.get(a, a) for a in gemm.args} <= fusion.view_reads(g, root)


def test_internal_value_is_written_over_a_dying_args_blocks(fuse_small):
    # y = P @ Q has an arena and dies in the group tanh(y * 2) + 1: the internal
    # y * 2 and tanh(...) are computed over y's blocks, so the group needs no scratch.
    A, B, K = be.Axis(6, "ovA"), be.Axis(5, "ovB"), be.Axis(3, "ovK")
    P = be.placeholder([A, K], dtype=np.float64)
    Q = be.placeholder([K, B], dtype=np.float64)
    y = be.dot(P, Q)
    z = be.tanh(y * 2.0) + 1.0
    f = be.NumPyTransformer().computation(z, P, Q)
    (g,) = f.groups
    assert len(g.internal) == 2
    assert all(temps == [] for _, temps in f._scratch.values())
    rng = np.random.default_rng(2)
    p, q = rng.standard_normal((6, 3)), rng.standard_normal((3, 5))
    np.testing.assert_allclose(f(p, q), np.tanh((p @ q) * 2) + 1, rtol=1e-14)


def test_internal_value_is_not_written_over_an_arg_read_later(fuse_small):
    # y is read again after the group (by the sum): its blocks must survive the group.
    A, B = be.Axis(6, "olA"), be.Axis(5, "olB")
    K = be.Axis(3, "olK")
    P = be.placeholder([A, K], dtype=np.float64)
    Q = be.placeholder([K, B], dtype=np.float64)
    y = be.dot(P, Q)
    z = be.tanh(y * 2.0) + 1.0
    s = be.sum(y, out_axes=())
    f = be.NumPyTransformer().computation([z, s], P, Q)
    rng = np.random.default_rng(3)
    p, q = rng.standard_normal((6, 3)), rng.standard_normal((3, 5))
    gz, gs = f(p, q)
    np.testing.assert_allclose(gz, np.tanh((p @ q) * 2) + 1, rtol=1e-14)
    np.testing.assert_allclose(gs, (p @ q).sum(), rtol=1e-13)


def _small_mlp_step():
    """An MLP training step small enough that nothing is fused (default thresholds),
    shaped like benchmarks/mlp.py: hidden activations twice the first weight's size."""
    F, H, Y = be.Axis(8, "smF"), be.Axis(16, "smH"), be.Axis(2, "smY")
    N = be.Axis(32, "smN", batch=True)
    rng = np.random.default_rng(4)
    x = be.placeholder([F, N])
    t = be.placeholder([Y, N])
    W0 = be.Variable(axes=[H, F], initial_value=rng.standard_normal((16, 8)) * 0.3)
    H2 = be.Axis(16, "smH2")
    W1 = be.Variable(axes=[H2, H], initial_value=rng.standard_normal((16, 16)) * 0.3)
    W2 = be.Variable(axes=[Y, H2], initial_value=rng.standard_normal((2, 16)) * 0.3)
    h0 = be.maximum(be.dot(W0, x), 0.0)
    h1 = be.maximum(be.dot(W1, h0), 0.0)
    loss = be.sum(be.cross_entropy_multi(be.softmax(be.dot(W2, h1)), t), out_axes=())
    ups = [be.SetItem(v, v - 0.01 * be.deriv(loss, v)) for v in (W0, W1, W2)]
    return [loss] + ups, (x, t)


def test_size_ordered_plan_is_used_where_smaller():
    # Placed in schedule order, the hidden layer's weight gradient takes the arena of a
    # dead activation and the next delta a new one; biggest first does better here.
    # (The depth-first schedule, before the NumPy transformer moves each update's
    # gradient product next to it.)
    from geon.op_graph.ordering import schedule
    results, ps = _small_mlp_step()
    f = be.NumPyTransformer().computation(results, *ps)
    order, res = schedule(f.graph.roots), f.results
    kw = dict(inplace=True, groups=(), exclude=())
    in_order = memory._plan_in_order(order, res, **kw)
    by_size = memory._plan_by_size(order, res, **kw)
    for plan in (in_order, by_size):
        assert memory.verify_plan(order, res, plan)
    assert sum(by_size.sizes) < sum(in_order.sizes)
    assert sum(memory.plan_memory(order, res).sizes) == sum(by_size.sizes)
    # and the step computes what the unplanned step computes
    rng = np.random.default_rng(5)
    xv = rng.standard_normal((8, 32)).astype(np.float32)
    tv = np.eye(2, dtype=np.float32)[rng.integers(0, 2, 32)].T.copy()
    losses = []
    for disable in ([], ["memory"]):
        results, ps = _small_mlp_step()
        g = be.NumPyTransformer(disable=disable).computation(results, *ps)
        losses.append([float(g(xv, tv)[0]) for _ in range(3)])
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-6)


def test_size_ordered_plan_keeps_in_place_and_multi_output_rules():
    # a chain that runs in place, and a max/argmax pair written at one step
    A, B = be.Axis(7, "spA"), be.Axis(9, "spB")
    x = be.placeholder([A, B], dtype=np.float64)
    y = be.exp(be.tanh(x * 2.0) + 1.0)
    outs = [be.max(y, reduction_axes=[B]) + be.argmax(y, reduction_axes=[B]) * 1.0]
    f = be.NumPyTransformer().computation(outs, x)
    kw = dict(inplace=True, groups=f.groups, exclude=f._into)
    plan = memory._plan_by_size(f.order, f.results, **kw)
    assert memory.verify_plan(f.order, f.results, plan, f.groups)
    assert plan.inplace  # the chain still runs in place
    v = np.random.default_rng(6).standard_normal((7, 9))
    yv = np.exp(np.tanh(v * 2) + 1)
    np.testing.assert_allclose(f(v)[0], yv.max(1) + yv.argmax(1), rtol=1e-14)


def test_gradient_product_stays_out_of_the_group_when_switched_off(fuse_small,
                                                                   monkeypatch):
    monkeypatch.setattr(fusion, "GEMM_HEADS", False)
    rng = np.random.default_rng(7)
    av, bv = rng.standard_normal((6, 5)), rng.standard_normal((5, 4))
    W, upd, ps = _gradient_update()
    t = be.NumPyTransformer()
    f = t.computation(upd, *ps)
    f(av, bv)
    assert f.groups and not any(isinstance(g.members[0], pr.Gemm) for g in f.groups)
    np.testing.assert_allclose(t.state[W], np.arange(24.0).reshape(6, 4) / 7
                               - 0.1 * (av @ bv), rtol=1e-13)


@needs_blas
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
def test_blas_accumulate_reads_transposed_operands(dtype, ta, tb):
    rng = np.random.default_rng(8)
    a = rng.standard_normal((5, 7) if ta else (7, 5)).astype(dtype)
    b = rng.standard_normal((3, 5) if tb else (5, 3)).astype(dtype)
    a, b = (a.T if ta else a), (b.T if tb else b)
    c = rng.standard_normal((7, 3)).astype(dtype)
    want = c.astype(np.float64) - 0.25 * (a.astype(np.float64) @ b.astype(np.float64))
    assert blas.accumulate(a, b, c, -0.25)
    tol = 1e-13 if dtype == np.float64 else 1e-6
    np.testing.assert_allclose(c, want, rtol=tol, atol=tol)


@needs_blas
@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
def test_blas_accumulate_splits_a_long_inner_dimension(ta, tb, monkeypatch):
    monkeypatch.setattr(blas, "MAX_INNER", 4)
    calls = []
    gemm = blas._GEMM[np.dtype(np.float64)]
    monkeypatch.setitem(blas._GEMM, np.dtype(np.float64),
                        lambda *args: (calls.append(args[5]), gemm(*args)))
    rng = np.random.default_rng(10)
    k = 11                                   # calls of 4, 4 and 3
    # operands that are views into wider arrays: the leading dimension is not the width
    a = rng.standard_normal((k, 9) if ta else (6, 13))
    a = a[:, :6].T if ta else a[:, :k]
    b = rng.standard_normal((5, 15) if tb else (k, 8))
    b = b[:, :k].T if tb else b[:, :5]
    c = rng.standard_normal((6, 5))
    want = c - 0.5 * (a @ b)
    assert blas.accumulate(a, b, c, -0.5)
    assert calls == [4, 4, 3]
    np.testing.assert_allclose(c, want, rtol=1e-13, atol=1e-13)


@needs_blas
def test_blas_accumulate_refuses_what_it_cannot_do():
    rng = np.random.default_rng(9)
    a, b = rng.standard_normal((6, 4)), rng.standard_normal((4, 6))
    c = np.zeros((6, 6))
    cases = [(a[:, ::2], b[::2], c),            # no unit stride
             (a, b, np.zeros((6, 6)).T),        # output not row-major
             (a.astype(np.float32), b, c),      # mixed dtypes
             (a.astype(np.int64), b.astype(np.int64), c.astype(np.int64)),
             (a[:, :0], b[:0], c),              # empty
             (c[:, :4], b, c),                  # operand overlapping the output
             (a, b, np.zeros((6, 5))),          # wrong output shape
             (a, b, np.broadcast_to(0.0, (6, 6)))]  # read-only output
    for x, y, out in cases:
        before = out.copy()
        assert not blas.accumulate(x, y, out, 1.0)
        np.testing.assert_array_equal(out, before)


@needs_blas
@pytest.mark.parametrize("form", ["w - lr * g", "w + g * lr"])
def test_update_is_one_blas_call(fuse_small, form, monkeypatch):
    calls = []  # what the generated code's BLAS call returned: True when BLAS did it

    def recording(*args):
        calls.append(blas.accumulate(*args))
        return calls[-1]

    monkeypatch.setitem(transformer.NUMPY_GLOBALS, "_gemm_acc", recording)
    I, J, K = be.Axis(6, "uI"), be.Axis(4, "uJ"), be.Axis(5, "uK")
    a = be.placeholder([I, K], dtype=np.float64)
    b = be.placeholder([K, J], dtype=np.float64)
    w0 = np.arange(24.0).reshape(6, 4) / 7
    W = be.Variable(axes=[I, J], initial_value=w0, dtype=np.float64)
    g = be.dot(a, b)
    new, alpha = (W - 0.1 * g, -0.1) if form == "w - lr * g" else (W + g * 0.1, 0.1)
    t = be.NumPyTransformer()
    f = t.computation(be.SetItem(W, new), a, b)
    assert f"{alpha!r}):" in f.source.split("_gemm_acc(")[1]
    rng = np.random.default_rng(10)
    av, bv = rng.standard_normal((6, 5)), rng.standard_normal((5, 4))
    f(av, bv)
    assert calls == [True]  # the update was the BLAS call's, not the blocks'
    np.testing.assert_allclose(t.state[W], w0 + alpha * (av @ bv), rtol=1e-13)


@needs_blas
def test_update_falls_back_to_blocks_when_blas_refuses(fuse_small, monkeypatch):
    # The BLAS accumulation is tried at run time; where it refuses (here: pretended
    # unavailable after code generation), the blocked product computes the update.
    W, upd, ps = _gradient_update()
    t = be.NumPyTransformer()
    f = t.computation(upd, *ps)
    assert "_gemm_acc(" in f.source and "np.matmul(b_" in f.source
    monkeypatch.setattr(blas, "_GEMM", {})
    rng = np.random.default_rng(11)
    av, bv = rng.standard_normal((6, 5)), rng.standard_normal((5, 4))
    f(av, bv)
    np.testing.assert_allclose(t.state[W], np.arange(24.0).reshape(6, 4) / 7
                               - 0.1 * (av @ bv), rtol=1e-13)


def test_no_blas_call_without_the_library(fuse_small, no_blas):
    W, upd, ps = _gradient_update()
    f = be.NumPyTransformer().computation(upd, *ps)
    assert "_gemm_acc" not in f.source


# --- a bias added to a GEMM in the same BLAS call --------------------------------------
def _dense(dtype, bias_first=False, keep_product=False):
    """relu(W @ x + b): the bias add starts the fused group after the product."""
    O, I, N = be.Axis(6, "dO"), be.Axis(5, "dI"), be.Axis(7, "dN")
    W = be.placeholder([O, I], dtype=dtype)
    x = be.placeholder([I, N], dtype=dtype)
    b = be.placeholder([O], dtype=dtype)
    p = be.dot(W, x)
    out = be.maximum(b + p if bias_first else p + b, 0.0)
    return ([out, p] if keep_product else out), (W, x, b)


def _dense_feeds(dtype, seed=12):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(dtype) for s in ((6, 5), (5, 7), 6)]


@needs_blas
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("bias_first", [False, True])
def test_bias_add_is_in_the_blas_call(fuse_small, dtype, bias_first, monkeypatch):
    calls = []

    def recording(*args):
        calls.append(blas.add_product(*args))
        return calls[-1]

    monkeypatch.setitem(transformer.NUMPY_GLOBALS, "_gemm_add", recording)
    outs, ps = _dense(dtype, bias_first)
    f = be.NumPyTransformer(compiled=False).computation(outs, *ps)
    group = f.source.split("_gemm_add(")[1].split("_run_blocks(")[0]
    assert "np.add(b_" not in group and "np.maximum(b_" in group  # the add is not blocked
    Wv, xv, bv = _dense_feeds(dtype)
    got = f(Wv, xv, bv)
    assert calls == [True]
    want = np.maximum(Wv.astype(np.float64) @ xv + bv[:, None], 0)
    tol = 1e-13 if dtype == np.float64 else 1e-5
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


@needs_blas
def test_bias_add_falls_back_to_numpy_when_blas_refuses(fuse_small, monkeypatch):
    # decided at code generation, refused at run time: matmul, then the add
    outs, ps = _dense(np.float64)
    f = be.NumPyTransformer(compiled=False).computation(outs, *ps)
    assert "_gemm_add(" in f.source
    monkeypatch.setattr(blas, "_GEMM", {})
    Wv, xv, bv = _dense_feeds(np.float64)
    np.testing.assert_allclose(f(Wv, xv, bv), np.maximum(Wv @ xv + bv[:, None], 0),
                               rtol=1e-13, atol=1e-13)


@needs_blas  # (without the library there is never a BLAS call to refuse)
def test_bias_add_needs_a_product_read_by_it_alone(fuse_small):
    # the product is also a result: the sum cannot be written over it
    outs, ps = _dense(np.float64, keep_product=True)
    f = be.NumPyTransformer(compiled=False).computation(outs, *ps)
    assert "_gemm_add(" not in f.source
    Wv, xv, bv = _dense_feeds(np.float64)
    relu, prod = f(Wv, xv, bv)
    np.testing.assert_allclose(prod, Wv @ xv, rtol=1e-13)
    np.testing.assert_allclose(relu, np.maximum(Wv @ xv + bv[:, None], 0), rtol=1e-13)


def test_no_bias_add_call_without_the_library(fuse_small, no_blas):
    outs, ps = _dense(np.float64)
    f = be.NumPyTransformer(compiled=False).computation(outs, *ps)
    assert "_gemm_add(" not in f.source and "np.add(b_" in f.source


@needs_blas
def test_blas_add_product_reads_broadcasts_and_refuses_what_it_cannot_do():
    rng = np.random.default_rng(13)
    a = rng.standard_normal((7, 5)).T            # (5, 7), read transposed
    b = rng.standard_normal((7, 3))
    bias = rng.standard_normal(5)
    for v in (np.broadcast_to(bias[:, None], (5, 3)), rng.standard_normal((5, 3))):
        c = np.full((5, 3), np.nan)              # every element is written
        assert blas.add_product(a, b, c, v)
        np.testing.assert_allclose(c, v + a @ b, rtol=1e-13, atol=1e-13)
    c = np.zeros((5, 3))
    for v in (c, np.zeros((5, 3), np.float32), np.zeros((5, 4))):  # overlap, dtype, shape
        assert not blas.add_product(a, b, c, v)
        assert not c.any()
