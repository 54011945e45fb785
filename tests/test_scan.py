"""be.scan: a loop over a named axis as one differentiable op (geon/op_graph/control.py,
geon/transformers/numpy/control.py)."""

import numpy as np
import pytest

import geon as be
from geon.op_graph.control import Scan
from geon.op_graph.core import toposort
from gradcheck import assert_gradcheck

T, H, D = be.Axis(4, "T"), be.Axis(3, "H"), be.Axis(2, "D")
rng = np.random.default_rng(7)


def run_numpy(results, *params, feeds=()):
    return be.NumPyTransformer().computation(list(results), *params)(*feeds)


def rnn_loop(X, H0, W, U, reverse=False):
    """A tanh RNN in NumPy: h' = tanh(W h + U x_t); y_t = 2 h."""
    h, ys = H0.copy(), np.zeros((X.shape[0],) + H0.shape)
    steps = range(X.shape[0] - 1, -1, -1) if reverse else range(X.shape[0])
    for t in steps:
        ys[t] = 2 * h
        h = np.tanh(W @ h + U @ X[t])
    return h, ys


@pytest.mark.parametrize("reverse", [False, True])
def test_rnn_values_match_loop(reverse):
    x = be.placeholder([T, D], dtype=np.float64)
    h0 = be.placeholder([H], dtype=np.float64)
    w = be.placeholder([be.Axis(3, "H2"), H], dtype=np.float64)
    u = be.placeholder([H, D], dtype=np.float64)
    X, H0 = rng.standard_normal((4, 2)), rng.standard_normal(3)
    W, U = 0.5 * rng.standard_normal((3, 3)), rng.standard_normal((3, 2))
    hT, ys = be.scan(lambda h, xt: (be.tanh(be.cast_axes(be.dot(w, h), [H])
                                            + be.dot(u, xt)), h * 2.0),
                     h0, x, T, reverse=reverse)
    want = rnn_loop(X, H0, W, U, reverse)
    feeds = {x: X, h0: H0, w: W, u: U}
    ref = be.evaluate([hT, ys], feeds=feeds)
    got = run_numpy([hT, ys], x, h0, w, u, feeds=(X, H0, W, U))
    for r, g, e in zip(ref, got, want):
        np.testing.assert_allclose(r, e, rtol=1e-12)
        np.testing.assert_allclose(g, e, rtol=1e-12)
    assert ys.axes == be.Axes(T, H)


def test_op_structure_and_closures():
    x = be.placeholder([T, D], dtype=np.float64, name="x")
    h0 = be.placeholder([H], dtype=np.float64, name="h0")
    u = be.Variable(axes=[H, D], initial_value=np.ones((3, 2)), dtype=np.float64)
    scale = be.placeholder([H], dtype=np.float64, name="scale")
    outer = be.exp(scale)  # an outer computed tensor
    hT, ys = be.scan(lambda h, xt: (h * outer + be.dot(u, xt), None), h0, x, T)
    assert ys is None
    op = hT.args[0]
    assert isinstance(op, Scan)
    nc, nx, nk, ny = op.counts
    assert (nc, nx, ny) == (1, 1, 0)
    closures = op.args[2:]
    assert outer in closures and u in closures and len(closures) == nk == 2
    # the body reads its own stand-ins only
    inputs = set(op.body.inputs)
    for o in toposort(op.body.results, deps=False):
        if isinstance(o, (be.Placeholder, be.Variable)):
            assert o in inputs
    X, H0, S = rng.standard_normal((4, 2)), rng.standard_normal(3), rng.standard_normal(3)
    h = H0.copy()
    for t in range(4):
        h = h * np.exp(S) + X[t].sum()
    t_ = be.NumPyTransformer()
    got = t_.computation(hT, x, h0, scale)(X, H0, S)
    np.testing.assert_allclose(got, h, rtol=1e-12)
    np.testing.assert_allclose(be.evaluate(hT, feeds={x: X, h0: H0, scale: S}), h,
                               rtol=1e-12)


def test_linear_recurrence_gradcheck():
    def build(x, h0, a):
        hT, ys = be.scan(lambda h, xt: (h * a + xt, h * h), h0, x, T)
        return be.sum(ys, out_axes=[H]) + hT
    assert_gradcheck(build, [([T, H], rng.standard_normal((4, 3))),
                             ([H], rng.standard_normal(3)),
                             ([H], 0.7 * rng.standard_normal(3))])


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("mode", ["placeholder", "variable"])
def test_tanh_rnn_gradcheck(reverse, mode):
    H2 = be.Axis(3, "H2")

    def build(x, h0, w, u, b):
        def cell(h, xt):
            hn = be.tanh(be.cast_axes(be.dot(w, h), [H]) + be.dot(u, xt) + b)
            return hn, be.sum(hn * hn, out_axes=())
        hT, ys = be.scan(cell, h0, x, T, reverse=reverse)
        return be.sum(ys, out_axes=()) + be.sum(hT, out_axes=())
    assert_gradcheck(build, [([T, D], rng.standard_normal((4, 2))),
                             ([H], rng.standard_normal(3)),
                             ([H2, H], 0.5 * rng.standard_normal((3, 3))),
                             ([H, D], rng.standard_normal((3, 2))),
                             ([H], rng.standard_normal(3))], mode=mode)


def test_several_carries_and_sequences_gradcheck():
    def build(x, z, c0, m0, w):
        def body(carry, xt):
            c, m = carry
            a, b = xt
            c2 = be.tanh(c * w + a) * b
            m2 = be.maximum(m, c2) + 0.1 * m
            return (c2, m2), (c2 * m2, a + m)
        (cT, mT), (y1, y2) = be.scan(body, (c0, m0), (x, z), T)
        return be.sum(y1, out_axes=[T]) + be.sum(y2 * y2, out_axes=[T]) \
            + be.sum(cT * mT, out_axes=())
    # z has T in second place: sequences may hold the axis anywhere
    assert_gradcheck(build, [([T, H], rng.standard_normal((4, 3))),
                             ([H, T], rng.standard_normal((3, 4))),
                             ([H], rng.standard_normal(3)),
                             ([H], rng.standard_normal(3) + 2.0),
                             ([H], rng.standard_normal(3))])


def test_history_output_and_second_derivative():
    x = be.placeholder([T], dtype=np.float64)
    a = be.placeholder([], dtype=np.float64)
    h0 = be.placeholder([], dtype=np.float64)
    hT, _ = be.scan(lambda h, xt: (h * a + xt * xt, None), h0, x, T)
    g = be.deriv(hT, a)
    gg = be.deriv(g, a)  # deriv of a deriv: the adjoint is itself a Scan
    X, A, H0 = rng.standard_normal(4), 0.8, 0.5

    def f(A):
        h = H0
        for t in range(4):
            h = h * A + X[t] ** 2
        return h
    e = 1e-4
    want_gg = (f(A + e) - 2 * f(A) + f(A - e)) / e ** 2
    got = run_numpy([g, gg], x, a, h0, feeds=(X, A, H0))
    ref = be.evaluate([g, gg], feeds={x: X, a: A, h0: H0})
    np.testing.assert_allclose(got[0], (f(A + 1e-6) - f(A - 1e-6)) / 2e-6, rtol=1e-6)
    np.testing.assert_allclose(got[1], want_gg, rtol=1e-4)
    np.testing.assert_allclose(ref[1], got[1], rtol=1e-10)


def test_jvp_matches_central_differences():
    x = be.placeholder([T, H], dtype=np.float64)
    h0 = be.placeholder([H], dtype=np.float64)
    w = be.placeholder([H], dtype=np.float64)
    hT, ys = be.scan(lambda h, xt: (be.tanh(h * w + xt), be.sin(h)), h0, x, T)
    X, H0, W = rng.standard_normal((4, 3)), rng.standard_normal(3), rng.standard_normal(3)
    dX, dH, dW = rng.standard_normal((4, 3)), rng.standard_normal(3), rng.standard_normal(3)
    tans = be.jvp([hT, ys], [x, h0, w], [dX, dH, dW])
    got = run_numpy(tans, x, h0, w, feeds=(X, H0, W))
    ref = be.evaluate(tans, feeds={x: X, h0: H0, w: W})
    f = be.NumPyTransformer().computation([hT, ys], x, h0, w)
    e = 1e-6
    plus = f(X + e * dX, H0 + e * dH, W + e * dW)
    minus = f(X - e * dX, H0 - e * dH, W - e * dW)
    for g, r, p, m in zip(got, ref, plus, minus):
        np.testing.assert_allclose(g, (p - m) / (2 * e), rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(r, g, rtol=1e-10, atol=1e-12)


def test_hvp_through_scan():
    x = be.placeholder([T], dtype=np.float64)
    a = be.placeholder([], dtype=np.float64)
    hT, _ = be.scan(lambda h, xt: (be.tanh(h * a + xt), None), 0.5 * be.constant(
        1.0, dtype=np.float64), x, T)
    hv = be.hvp(hT, a, 1.0)
    X, A = rng.standard_normal(4), 0.3
    g = be.NumPyTransformer().computation(be.deriv(hT, a), x, a)
    e = 1e-5
    want = (g(X, A + e) - g(X, A - e)) / (2 * e)
    np.testing.assert_allclose(run_numpy([hv], x, a, feeds=(X, A))[0], want, rtol=1e-6)


def test_nested_scan_and_empty_length():
    E = be.Axis(2, "E")
    x = be.placeholder([T, E, H], dtype=np.float64)
    h0 = be.placeholder([H], dtype=np.float64)

    def outer(h, xt):  # xt: (E, H): an inner scan over E
        hi, _ = be.scan(lambda g, xe: (g * 0.5 + xe, None), h, xt, E)
        return hi, hi
    hT, ys = be.scan(outer, h0, x, T)
    X, H0 = rng.standard_normal((4, 2, 3)), rng.standard_normal(3)
    h = H0.copy()
    for t in range(4):
        for e in range(2):
            h = h * 0.5 + X[t, e]
    got = run_numpy([hT], x, h0, feeds=(X, H0))[0]
    np.testing.assert_allclose(got, h, rtol=1e-12)
    g = be.deriv(be.sum(hT, out_axes=()), x)
    np.testing.assert_allclose(run_numpy([g], x, h0, feeds=(X, H0))[0],
                               be.evaluate(g, feeds={x: X, h0: H0}), rtol=1e-12)
    Z = be.Axis(0, "Z")
    z = be.placeholder([Z, H], dtype=np.float64)
    cT, zs = be.scan(lambda c, zt: (c + zt, c), h0, z, Z)
    out = run_numpy([cT, zs], z, h0, feeds=(np.zeros((0, 3)), H0))
    np.testing.assert_array_equal(out[0], H0)
    assert out[1].shape == (0, 3)


def test_errors_name_the_carry():
    x = be.placeholder([T, H], dtype=np.float64)
    h0 = be.placeholder([H], dtype=np.float64)
    with pytest.raises(be.AxisMismatchError, match=r"carry 0 .*\(D:2\).*\(H:3\).*test_scan"):
        be.scan(lambda h, xt: (be.constant(0.0, axes=[D], dtype=np.float64), xt), h0, x, T)
    with pytest.raises(be.ArgumentError, match="dtype float32 .* float64"):
        be.scan(lambda h, xt: (be.constant(0.0, axes=[H], dtype=np.float32), xt), h0, x, T)
    with pytest.raises(be.AxisMismatchError, match="scanned axis"):
        be.scan(lambda h, xt: (h, xt), h0, h0, T)
    with pytest.raises(be.ArgumentError, match="must return"):
        be.scan(lambda h, xt: h, h0, x, T)


def test_serialized_and_printed():
    # (tests/test_serialize_control.py tests documents with bodies in depth)
    x = be.placeholder([T, H], dtype=np.float64)
    h0 = be.placeholder([H], dtype=np.float64)
    hT, _ = be.scan(lambda h, xt: (h + xt, None), h0, x, T)
    text = be.serialize(hT)
    assert be.serialize(be.deserialize(text)) == text
    assert "Scan" in be.graph_text(hT)


def test_cse_keeps_two_bodies_apart():
    x = be.placeholder([T, H], dtype=np.float64)
    h0 = be.placeholder([H], dtype=np.float64)
    a, _ = be.scan(lambda h, xt: (h + xt, None), h0, x, T)
    b, _ = be.scan(lambda h, xt: (h - xt, None), h0, x, T)
    X, H0 = rng.standard_normal((4, 3)), rng.standard_normal(3)
    ra, rb = run_numpy([a, b], x, h0, feeds=(X, H0))
    np.testing.assert_allclose(ra, H0 + X.sum(0))
    np.testing.assert_allclose(rb, H0 - X.sum(0))


def test_integer_carry_and_mixed_dtypes():
    x = be.placeholder([T, H], name="x")   # float32
    h0 = be.placeholder([H], name="h0")
    w = be.Variable(axes=[H], initial_value=np.full(3, 0.5), name="w")
    i0 = be.constant(0, dtype=np.int64)
    (n, hT), ys = be.scan(lambda c, xt: ((c[0] + 1, be.tanh(c[1] * w + xt)), c[1]),
                          (i0, h0), x, T)
    r = be.constant(np.ones((4, 3)), axes=[T, H], dtype=np.float64)
    cost = be.sum(ys * r, out_axes=()) + be.sum(hT, out_axes=())  # float64 cost
    gw, gx = be.deriv(cost, [w, x])
    X, H0 = np.ones((4, 3), np.float32), np.zeros(3, np.float32)
    got = run_numpy([n, gw, gx], x, h0, feeds=(X, H0))
    ref = be.evaluate([n, gw, gx], feeds={x: X, h0: H0})
    assert int(got[0]) == 4
    for g, e in zip(got[1:], ref[1:]):
        np.testing.assert_allclose(g, e, rtol=1e-5)


def test_two_computations_sharing_a_body_run_at_once_from_threads():
    """Steps after the first call the body's step() under its computation's lock, held
    for the loop: two computations holding the same scan, called at once from two
    threads, take turns with the body's buffers and get the loop's values."""
    import threading
    x = be.placeholder([T, D], dtype=np.float64)
    h0 = be.placeholder([H], dtype=np.float64)
    w = be.placeholder([be.Axis(3, "H2"), H], dtype=np.float64)
    u = be.placeholder([H, D], dtype=np.float64)
    hT, ys = be.scan(lambda h, xt: (be.tanh(be.cast_axes(be.dot(w, h), [H])
                                            + be.dot(u, xt)), h * 2.0), h0, x, T)
    first = be.NumPyTransformer().computation([hT, ys], x, h0, w, u)
    second = be.NumPyTransformer().computation([hT, ys], x, h0, w, u)
    assert "_sc_g = _sc_f._ns['step']" in first.source
    body = [ln.split("#")[0].strip() for ln in first.source.splitlines()
            if "_scan_bodies[" in ln]
    assert body and body[0] in second.source     # one body computation for both
    W, U = 0.5 * rng.standard_normal((3, 3)), rng.standard_normal((3, 2))
    inputs = [(rng.standard_normal((4, 2)), rng.standard_normal(3)) for _ in range(2)]
    wrong = []

    def run(comp, X, H0):
        want = rnn_loop(X, H0, W, U)
        for _ in range(300):
            got = comp(X, H0, W, U)
            if not all(np.allclose(g, v, rtol=1e-12, atol=1e-14)
                       for g, v in zip(got, want)):
                wrong.append(got)
    threads = [threading.Thread(target=run, args=(c, *xs))
               for c, xs in zip((first, second), inputs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong


@pytest.mark.parametrize("remat", ["step", "none", "checkpoints:2"])
@pytest.mark.parametrize("reverse", [False, True])
def test_a_weights_share_of_each_step_is_one_product_after_the_loop(remat, reverse,
                                                                    monkeypatch):
    """dW = sum_t dot(h_t, g_t): the adjoint scan stacks h_t and g_t as ys and one
    product over the steps follows the loop (control.STACKED_PRODUCT_ELEMENTS), with
    the gradients of adding dW up step by step in an accumulator, and of central
    differences."""
    from geon.op_graph import control
    T5 = be.Axis(5, "T")
    X, H0 = rng.standard_normal((5, 2)), rng.standard_normal(3)
    W, U = 0.5 * rng.standard_normal((3, 3)), rng.standard_normal((3, 2))

    def grads():
        x = be.placeholder([T5, D], dtype=np.float64)
        h0 = be.placeholder([H], dtype=np.float64)
        w = be.placeholder([be.Axis(3, "H2"), H], dtype=np.float64)
        u = be.placeholder([H, D], dtype=np.float64)
        hT, ys = be.scan(lambda h, xt: (be.tanh(be.cast_axes(be.dot(w, h), [H])
                                                + be.dot(u, xt)), h * 2.0),
                         h0, x, T5, reverse=reverse, remat=remat)
        cost = be.sum(ys * ys, out_axes=()) + be.sum(hT, out_axes=())
        gs = be.deriv(cost, [w, u, x])
        adj = [s for s in toposort(gs) if isinstance(s, Scan) and s.reverse != reverse]
        carries = sum(len(s.body.carries_in) for s in adj)
        comp = be.NumPyTransformer().computation(gs, x, h0, w, u)
        return comp(X, H0, W, U), carries
    stacked, n_stacked = grads()
    monkeypatch.setattr(control, "STACKED_PRODUCT_ELEMENTS", 0)
    summed, n_summed = grads()
    assert n_summed > n_stacked   # (the accumulators of w and u are gone)
    for a, b in zip(stacked, summed):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)

    def cost_of(Wv):
        h, total = H0.copy(), 0.0
        for t in (range(4, -1, -1) if reverse else range(5)):
            total += np.sum((2 * h) ** 2)
            h = np.tanh(Wv @ h + U @ X[t])
        return total + np.sum(h)
    eps, num = 1e-6, np.zeros_like(W)
    for idx in np.ndindex(W.shape):
        d = np.zeros_like(W)
        d[idx] = eps
        num[idx] = (cost_of(W + d) - cost_of(W - d)) / (2 * eps)
    np.testing.assert_allclose(stacked[0], num, rtol=1e-7, atol=1e-9)


def test_a_steps_carry_that_is_also_its_y_is_not_copied_within_the_loop():
    """The body returns h as its carry and as its y (one buffer): run() hands out a
    copy for the second, as a computation's call must; step() hands out the buffer
    twice, since the loop copies each y into the stacked output at once."""
    from geon.transformers.numpy.control import body_runner
    x = be.placeholder([T, D], dtype=np.float64)
    h0 = be.placeholder([D], dtype=np.float64)
    hT, ys = be.scan(lambda h, xt: (be.tanh(h + xt),) * 2, h0, x, T)
    comp = be.NumPyTransformer().computation([hT, ys], x, h0)
    X, H0 = rng.standard_normal((4, 2)), rng.standard_normal(2)
    want_h, want_ys = H0, []
    for t in range(4):
        want_h = np.tanh(want_h + X[t])
        want_ys.append(want_h)
    got_h, got_ys = comp(X, H0)
    np.testing.assert_allclose(got_h, want_h, rtol=1e-13)    # (tanh: a few ulp)
    np.testing.assert_allclose(got_ys, np.stack(want_ys), rtol=1e-13)
    (scan,) = [op for op in toposort([hT]) if isinstance(op, Scan)]
    run, step = body_runner(scan.body).computation.source.split("def step(")
    assert "np.array(" in run.split("def run(")[1] and "np.array(" not in step


def test_a_product_over_the_scanned_axis_keeps_its_accumulator():
    """A closure's share whose operands hold the scanned axis (here W's, through a
    constant over T) cannot be stacked along it: it is added up step by step."""
    T4, H2 = be.Axis(4, "T"), be.Axis(3, "H2")
    H3 = be.Axis(3, "H")
    x = be.placeholder([T4, H3], dtype=np.float64)
    h0 = be.placeholder([H3], dtype=np.float64)
    w = be.placeholder([H2, H3], dtype=np.float64)
    ramp = be.constant(np.arange(1.0, 5.0), axes=[T4])

    def body(h, xt):
        y = be.dot(w, h * ramp)                         # (H2, T)
        return be.tanh(be.cast_axes(be.sum(y, reduction_axes=[T4]), [H3]) * 0.1
                       + xt), None
    hT, _ = be.scan(body, h0, x, T4)
    g = be.deriv(be.sum(hT * hT, out_axes=()), w)
    X, H0, W = (rng.standard_normal((4, 3)), rng.standard_normal(3),
                0.3 * rng.standard_normal((3, 3)))
    got = be.NumPyTransformer().computation(g, x, h0, w)(X, H0, W)

    def cost(Wv):
        h = H0.copy()
        for t in range(4):
            h = np.tanh(0.1 * (Wv @ h) * np.arange(1.0, 5.0).sum() + X[t])
        return np.sum(h * h)
    eps, num = 1e-6, np.zeros_like(W)
    for idx in np.ndindex(W.shape):
        d = np.zeros_like(W)
        d[idx] = eps
        num[idx] = (cost(W + d) - cost(W - d)) / (2 * eps)
    np.testing.assert_allclose(got, num, rtol=1e-7, atol=1e-9)


def test_only_a_scans_body_has_a_step():
    """step() is for a scan's later steps; a cond's branches are called once a call."""
    from geon.transformers.numpy.control import subgraph_computations
    from geon.op_graph.control_ops import Cond
    p = be.placeholder([], dtype=np.float64)
    v = be.placeholder([D], dtype=np.float64)
    y = be.cond(p, lambda u: be.tanh(u) * 2.0, lambda u: u * u, v)
    x = be.placeholder([T, D], dtype=np.float64)
    hT, _ = be.scan(lambda h, xt: (be.tanh(h + xt) * 0.5, None), v, x, T)
    be.NumPyTransformer().computation([y, hT], p, v, x)
    ops = toposort([y, hT])
    (cond,) = [op for op in ops if isinstance(op, Cond)]
    (scan,) = [op for op in ops if isinstance(op, Scan)]
    assert not any(c._has_step for c in subgraph_computations(cond))
    assert all(c._has_step for c in subgraph_computations(scan))


def test_weight_closures_are_passed_as_they_are():
    """A closure the body reads only in matrix products (a recurrent weight) goes to the
    body as it is, a transposed view included (the BLAS reads it so); one an
    elementwise op reads is made contiguous first. The values are the loop's."""
    x = be.placeholder([T, D], dtype=np.float64)
    h0 = be.placeholder([H], dtype=np.float64)
    H2 = be.Axis(3, "H2")
    wt = be.placeholder([H, H2], dtype=np.float64)   # fed transposed: W = wt.T
    u = be.placeholder([H, D], dtype=np.float64)
    w = be.axes_with_order(wt, [H2, H])               # a transposed view of the feed
    hT, ys = be.scan(lambda h, xt: (be.tanh(be.cast_axes(be.dot(w, h), [H])
                                            + be.dot(u, xt)), h * 2.0), h0, x, T)
    X, H0 = rng.standard_normal((4, 2)), rng.standard_normal(3)
    W, U = 0.5 * rng.standard_normal((3, 3)), rng.standard_normal((3, 2))
    comp = be.NumPyTransformer().computation([hT, ys], x, h0, wt, u)
    closures = [ln.strip() for ln in comp.source.splitlines() if "_sc_k" in ln
                and " = " in ln and "_sc_f(" not in ln and "_sc_g(" not in ln]
    assert closures and all("_contiguous" not in ln for ln in closures), closures
    want = rnn_loop(X, H0, W, U)
    for g, e in zip(comp(X, H0, np.ascontiguousarray(W.T), U), want):
        np.testing.assert_allclose(g, e, rtol=1e-12)
    scale = be.placeholder([H], dtype=np.float64)
    hT2, _ = be.scan(lambda h, xt: (h * be.exp(scale) + be.dot(u, xt), None), h0, x, T)
    src = be.NumPyTransformer().computation(hT2, x, h0, u, scale).source
    assert any("_contiguous(" in ln and "_sc_k" in ln for ln in src.splitlines())
