"""A scan's loop in C (geon/transformers/numpy/c_scan.py): the loop's values against a
NumPy loop and against the Python loop, which bodies it takes and which it leaves,
weights fed transposed, constant and changed between calls, reverse scans, the history
and derivatives, and the product kernel's packing over odd sizes."""

import numpy as np
import pytest

import geon as be
from geon.op_graph.control import Scan
from geon.op_graph.core import toposort
from geon.transformers.numpy import c_scan
from geon.transformers.numpy import compiled as ck
from geon.transformers.numpy.control import subgraph_computations
from gradcheck import assert_gradcheck

pytestmark = pytest.mark.skipif(not ck.available(),
                                reason="no working C compiler for the C kernels")

RTOL = {np.float32: 2e-5, np.float64: 1e-12}


def loops_in_c(results):
    """How many of the scans under ``results`` ran their loop in C (at least once)."""
    scans = [op for op in toposort(list(results)) if isinstance(op, Scan)]
    comps = [c for op in scans for c in subgraph_computations(op)]
    return sum(1 for c in comps if c._c_loop is not None
               and any(b is not None for b in c._c_loop._built.values()))


def rnn(N, H, D, T, dtype, reverse=False, transposed=False, weight="placeholder"):
    """A batched tanh RNN: h' = tanh(h @ W + x_t @ U + b), y_t = 2 h'; returns the
    computation (fed x, h0, and the weights that are placeholders), its feeds, the
    NumPy loop's (hT, ys), the results and the bias."""
    rng = np.random.default_rng(N * 100 + H)
    ax_n, ax_h, ax_d, ax_t = (be.Axis(N, "N"), be.Axis(H, "H"), be.Axis(D, "D"),
                              be.Axis(T, "T"))
    ax_g = be.Axis(H, "G")
    X = rng.standard_normal((T, N, D)).astype(dtype)
    H0 = rng.standard_normal((N, H)).astype(dtype)
    W = (rng.standard_normal((H, H)) / np.sqrt(H)).astype(dtype)
    U = (rng.standard_normal((D, H)) / np.sqrt(D)).astype(dtype)
    B = rng.standard_normal(H).astype(dtype)
    x = be.placeholder([ax_t, ax_n, ax_d], dtype=dtype)
    h0 = be.placeholder([ax_n, ax_h], dtype=dtype)
    u = be.placeholder([ax_d, ax_g], dtype=dtype)
    b = be.constant(B, [ax_g], dtype=dtype)
    params, feeds = [x, h0, u], [X, H0, U]
    if weight == "constant":
        w = be.constant(W, [ax_h, ax_g], dtype=dtype)
    elif weight == "variable":
        w = be.Variable(axes=[ax_h, ax_g], initial_value=W, dtype=dtype)
    elif transposed:   # fed as W.T: the body reads a transposed view
        wt = be.placeholder([ax_g, ax_h], dtype=dtype)
        w = be.axes_with_order(wt, [ax_h, ax_g])
        params.append(wt)
        feeds.append(np.ascontiguousarray(W.T))
    else:
        w = be.placeholder([ax_h, ax_g], dtype=dtype)
        params.append(w)
        feeds.append(W)

    def cell(h, xt):
        hn = be.tanh(be.cast_axes(be.dot(h, w) + be.dot(xt, u) + b, [ax_n, ax_h]))
        return hn, hn * 2.0
    hT, ys = be.scan(cell, h0, x, ax_t, reverse=reverse)
    h, want = H0.astype(np.float64), np.zeros((T, N, H))
    for t in (range(T - 1, -1, -1) if reverse else range(T)):
        h = np.tanh(h @ W + X[t] @ U + B)
        want[t] = 2 * h
    return params, feeds, (h, want), (hT, ys), B


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(4, 64, 32, 16), (3, 5, 7, 4), (9, 40, 3, 2)])
@pytest.mark.parametrize("reverse", [False, True])
def test_rnn_values_in_c(dtype, shape, reverse):
    params, feeds, want, results, _ = rnn(*shape, dtype, reverse)
    comp = be.NumPyTransformer().computation(list(results), *params)
    for _ in range(2):   # (the first call traces and builds the loop)
        got = comp(*feeds)
        for g, e in zip(got, want):
            assert g.dtype == dtype
            np.testing.assert_allclose(g, e, rtol=RTOL[dtype], atol=RTOL[dtype])
    assert loops_in_c(results) == 1


@pytest.mark.parametrize("weight", ["transposed", "constant"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_weights_transposed_and_constant(weight, dtype):
    """A weight fed transposed is packed each call (the product reads it as its rows);
    a constant one once: the values are the same."""
    params, feeds, want, results, _ = rnn(4, 24, 5, 6, dtype,
                                          transposed=weight == "transposed", weight=weight)
    comp = be.NumPyTransformer().computation(list(results), *params)
    for _ in range(3):
        for g, e in zip(comp(*feeds), want):
            np.testing.assert_allclose(g, e, rtol=RTOL[dtype], atol=RTOL[dtype])
    assert loops_in_c(results) == 1


def test_a_variable_weight_changed_between_calls_is_read_again():
    """A weight that is a Variable is packed each call: a new value is read."""
    params, feeds, want, results, bias = rnn(3, 8, 2, 5, np.float64, weight="variable")
    t = be.NumPyTransformer()
    comp = t.computation(list(results), *params)
    np.testing.assert_allclose(comp(*feeds)[0], want[0], rtol=1e-12)
    (w,) = [v for v in t.state if isinstance(v, be.Variable)]
    W2 = -0.5 * np.array(t.state[w])
    np.copyto(t.state[w], W2)
    X, H0, U = feeds
    h = H0
    for x_t in X:
        h = np.tanh(h @ W2 + x_t @ U + bias)
    np.testing.assert_allclose(comp(*feeds)[0], h, rtol=1e-12)
    assert loops_in_c(results) == 1


def test_the_python_loop_where_the_c_loop_declines(monkeypatch):
    """A product over MAX_PRODUCT multiply-adds keeps the Python loop (the BLAS's);
    the values agree with the C loop's."""
    params, feeds, want, results, _ = rnn(4, 16, 3, 5, np.float64)
    monkeypatch.setattr(c_scan, "MAX_PRODUCT", 0)
    got = be.NumPyTransformer().computation(list(results), *params)(*feeds)
    assert loops_in_c(results) == 0
    for g, e in zip(got, want):
        np.testing.assert_allclose(g, e, rtol=1e-12)


def test_compiled_off_keeps_the_python_loop():
    params, feeds, want, results, _ = rnn(4, 16, 3, 5, np.float64)
    got = be.NumPyTransformer(compiled=False).computation(list(results), *params)(*feeds)
    assert loops_in_c(results) == 0
    np.testing.assert_allclose(got[1], want[1], rtol=1e-12)


@pytest.mark.parametrize("reverse", [False, True])
def test_derivatives_through_a_loop_in_c(reverse):
    """The forward scan keeps its history for the reverse one; both loops in C where
    they can; the gradients match central differences."""
    T, H, D, N = be.Axis(5, "T"), be.Axis(6, "H"), be.Axis(3, "D"), be.Axis(2, "N")
    G = be.Axis(6, "G")
    rng = np.random.default_rng(3)

    def build(x, h0, w, u):
        def cell(h, xt):
            hn = be.tanh(be.cast_axes(be.dot(h, w) + be.dot(xt, u), [N, H]))
            return hn, hn * hn
        hT, ys = be.scan(cell, h0, x, T, reverse=reverse)
        return be.sum(ys, out_axes=()) + be.sum(hT * hT, out_axes=())
    assert_gradcheck(build, [([T, N, D], rng.standard_normal((5, 2, 3))),
                             ([N, H], rng.standard_normal((2, 6))),
                             ([H, G], 0.4 * rng.standard_normal((6, 6))),
                             ([D, G], rng.standard_normal((3, 6)))])


def test_the_history_of_the_carries():
    """A scan whose history is read (its reverse derivative) writes each step's
    entering carry in C: the gradient of the loop's cost with respect to h0 matches
    the NumPy loop's own derivative."""
    dtype = np.float64
    params, feeds, _, (hT, ys), bias = rnn(3, 7, 2, 6, dtype)
    x, h0, u, w = params
    cost = be.sum(hT * hT, out_axes=()) + be.sum(ys, out_axes=())
    grad = be.deriv(cost, h0)
    comp = be.NumPyTransformer().computation([cost, grad], *params)
    X, H0, U, W = feeds

    def loss(h):
        total = 0.0
        for x_t in X:
            h = np.tanh(h @ W + x_t @ U + bias)
            total += (2 * h).sum()
        return total + (h * h).sum()
    eps, num = 1e-6, np.zeros_like(H0)
    for idx in np.ndindex(H0.shape):
        d = np.zeros_like(H0)
        d[idx] = eps
        num[idx] = (loss(H0 + d) - loss(H0 - d)) / (2 * eps)
    for _ in range(2):
        c, g = comp(*feeds)
        np.testing.assert_allclose(c, loss(H0), rtol=1e-12)
        np.testing.assert_allclose(g, num, rtol=1e-6, atol=1e-8)
    assert loops_in_c([cost, grad]) >= 1


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("M,K,N", [(1, 1, 1), (4, 64, 256), (5, 9, 33), (7, 16, 8),
                                   (3, 17, 40), (13, 8, 70)])
@pytest.mark.parametrize("layout", ["rows", "columns", "strided"])
def test_the_product_kernel(dtype, M, K, N, layout):
    """The loop's product against NumPy's over odd sizes and each layout of the right
    operand (rows contiguous, columns contiguous: the transposing pack, neither)."""
    rng = np.random.default_rng(M * K * N)
    A = rng.standard_normal((M, K)).astype(dtype)
    Bm = rng.standard_normal((K, N)).astype(dtype)
    if layout == "rows":
        b = Bm
    elif layout == "columns":
        b = np.ascontiguousarray(Bm.T).T
    else:
        big = np.zeros((2 * K, 3 * N), dtype)
        big[::2, ::3] = Bm
        b = big[::2, ::3]
    fns = _product_kernel(dtype)
    out = np.full((M, N), np.nan, dtype)
    fns(A, b, out)
    np.testing.assert_allclose(out, A.astype(np.float64) @ Bm, rtol=RTOL[dtype] * 10,
                               atol=RTOL[dtype] * 10 * np.sqrt(K))


def _product_kernel(dtype):
    """A Python function calling the loop's pack and product kernels once."""
    import ctypes
    from geon.transformers.numpy import toolchain
    from geon.transformers.numpy.c_codegen import _HEADER
    real = "float" if dtype == np.float32 else "double"
    s = real[0]
    src = _HEADER + "#include <stdlib.h>\n" + c_scan.gemm_source(np.dtype(dtype)) + f"""
int product(void *arrays, int64_t M, int64_t KN) {{
    static const int flags[3] = {{GEON_STRIDED, GEON_STRIDED, GEON_STRIDED}};
    geon_buffer v[3];
    if (!geon_acquire(v, arrays, flags, 3)) return -1;
    const int64_t K = KN >> 32, N = KN & 0xffffffff, L = 4 * 32 / sizeof({real});
    const int64_t NP = (N + L - 1) / L * L;
    {real} *p = malloc(K * NP * sizeof({real}));
    scan_pack_{s}(v[1].buf, v[1].strides[0], v[1].strides[1], K, N, NP, p);
    scan_gemm_{s}(v[0].buf, v[0].strides[0], v[0].strides[1], p, NP, v[2].buf,
                  v[2].strides[0], v[2].strides[1], M, N, K);
    free(p);
    geon_release(v, 3);
    return 0;
}}
"""
    lib = toolchain.build(src, ["product"])
    fn = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_int64,
                           ctypes.c_int64)(("product", lib))

    def call(a, b, out):
        assert fn((a, b, out), a.shape[0], (a.shape[1] << 32) | b.shape[1]) == 0
    return call


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_an_lstm_cell_with_one_array_fed_as_both_carries(dtype):
    """Two carries (h, c) started from the same array, gates from one product, two
    sequences (one holding the scanned axis second): the C loop's values are the
    NumPy loop's (the trace tells the carries apart)."""
    rng = np.random.default_rng(5)
    ax_t, ax_n, ax_h, ax_d = (be.Axis(6, "T"), be.Axis(3, "N"), be.Axis(8, "H"),
                              be.Axis(4, "D"))
    ax_g = be.Axis(32, "G")
    X = rng.standard_normal((6, 3, 4)).astype(dtype)
    Z = rng.standard_normal((3, 6, 8)).astype(dtype)   # (N, T, H)
    S0 = rng.standard_normal((3, 8)).astype(dtype)
    W = (0.3 * rng.standard_normal((8, 32))).astype(dtype)
    U = (0.3 * rng.standard_normal((4, 32))).astype(dtype)
    x = be.placeholder([ax_t, ax_n, ax_d], dtype=dtype)
    z = be.placeholder([ax_n, ax_t, ax_h], dtype=dtype)
    s0 = be.placeholder([ax_n, ax_h], dtype=dtype)
    w = be.placeholder([ax_h, ax_g], dtype=dtype)
    u = be.placeholder([ax_d, ax_g], dtype=dtype)

    def gate(g, k):
        return be.cast_axes(be.slice_along_axis(g, ax_g, slice(8 * k, 8 * k + 8)),
                            [ax_n, ax_h])

    def cell(carry, xt):
        h, c = carry
        a, b = xt
        g = be.dot(h, w) + be.dot(a, u)
        i, f, o, n = (be.sigmoid(gate(g, 0)), be.sigmoid(gate(g, 1)),
                      be.sigmoid(gate(g, 2)), be.tanh(gate(g, 3)))
        c2 = f * c + i * n + 0.1 * b
        h2 = o * be.tanh(c2)
        return (h2, c2), h2
    (hT, cT), ys = be.scan(cell, (s0, s0), (x, z), ax_t)
    comp = be.NumPyTransformer().computation([hT, cT, ys], x, z, s0, w, u)

    def sig(v):
        return 1 / (1 + np.exp(-v))
    h = c = S0.astype(np.float64)
    want_ys = []
    for t in range(6):
        g = h @ W + X[t] @ U
        i, f, o, n = sig(g[:, :8]), sig(g[:, 8:16]), sig(g[:, 16:24]), np.tanh(g[:, 24:])
        c = f * c + i * n + 0.1 * Z[:, t]
        h = o * np.tanh(c)
        want_ys.append(h)
    for _ in range(2):
        got = comp(X, Z, S0, W, U)
        for g, e in zip(got, (h, c, np.stack(want_ys))):
            np.testing.assert_allclose(g, e, rtol=RTOL[dtype], atol=RTOL[dtype])
    assert loops_in_c([hT, cT, ys]) == 1


def test_a_y_that_is_the_entering_carry_is_copied_at_the_steps_end():
    """y_t = h_t (the carry entering the step, a result the step copies): the loop
    copies it into a buffer of its own before the next step overwrites nothing."""
    rng = np.random.default_rng(11)
    ax_t, ax_h = be.Axis(5, "T"), be.Axis(3, "H")
    x = be.placeholder([ax_t, ax_h], dtype=np.float64)
    h0 = be.placeholder([ax_h], dtype=np.float64)
    hT, ys = be.scan(lambda h, xt: (be.tanh(h * 0.5 + xt) * 2.0, h), h0, x, ax_t)
    X, H0 = rng.standard_normal((5, 3)), rng.standard_normal(3)
    h, want = H0, []
    for t in range(5):
        want.append(h)
        h = np.tanh(h * 0.5 + X[t]) * 2.0
    comp = be.NumPyTransformer().computation([hT, ys], x, h0)
    for _ in range(2):
        got = comp(X, H0)
        np.testing.assert_allclose(got[0], h, rtol=1e-12)
        np.testing.assert_allclose(got[1], np.stack(want), rtol=1e-12)
    assert loops_in_c([hT, ys]) == 1


def _lstm_gradients(monkeypatch, in_c):
    """The gradients of an LSTM cell's loss in its weights and h0, and how many of
    the scans ran in C (``in_c``: False: MAX_PRODUCT 0, the Python loops)."""
    if not in_c:
        monkeypatch.setattr(c_scan, "MAX_PRODUCT", 0)
    rng = np.random.default_rng(8)
    ax_t, ax_n, ax_h, ax_d = (be.Axis(5, "T"), be.Axis(3, "N"), be.Axis(6, "H"),
                              be.Axis(4, "D"))
    ax_g = be.Axis(24, "G")
    x = be.placeholder([ax_t, ax_n, ax_d], dtype=np.float64)
    h0 = be.placeholder([ax_n, ax_h], dtype=np.float64)
    w = be.placeholder([ax_h, ax_g], dtype=np.float64)
    u = be.placeholder([ax_d, ax_g], dtype=np.float64)

    def gate(g, k):
        return be.cast_axes(be.slice_along_axis(g, ax_g, slice(6 * k, 6 * k + 6)),
                            [ax_n, ax_h])

    def cell(carry, xt):
        h, c = carry
        g = be.dot(h, w) + be.dot(xt, u)
        c2 = be.sigmoid(gate(g, 1)) * c + be.sigmoid(gate(g, 0)) * be.tanh(gate(g, 3))
        h2 = be.sigmoid(gate(g, 2)) * be.tanh(c2)
        return (h2, c2), (h2, g)   # (g read whole too: its adjoint adds into a sum)
    (hT, cT), (ys, gs) = be.scan(cell, (h0, h0 * 0.5), x, ax_t)
    loss = be.sum(ys * ys, out_axes=()) + be.sum(cT, out_axes=()) \
        + 0.1 * be.sum(gs * gs, out_axes=())
    grads = be.deriv(loss, [w, u, h0])
    comp = be.NumPyTransformer().computation([loss] + list(grads), x, h0, w, u)
    feeds = (rng.standard_normal((5, 3, 4)), rng.standard_normal((3, 6)),
             0.4 * rng.standard_normal((6, 24)), 0.4 * rng.standard_normal((4, 24)))
    comp(*feeds)
    return comp(*feeds), loops_in_c([loss] + list(grads))


def test_an_lstms_derivative_runs_both_loops_in_c(monkeypatch):
    """The reverse scan of an LSTM's derivative (its gates' slices' adjoints are
    Unslice and UnsliceAdd) runs in C too; its gradients are the Python loops'."""
    got, n = _lstm_gradients(monkeypatch, True)
    assert n >= 2
    with monkeypatch.context() as m:
        want, n_py = _lstm_gradients(m, False)
    assert n_py == 0
    for g, e in zip(got, want):
        np.testing.assert_allclose(g, e, rtol=1e-11, atol=1e-12)


def test_a_weight_fed_anew_each_call_is_packed_anew():
    """A weight that is a placeholder keeps its pack between calls only while its
    bytes stay the same: other values fed in place give their own results."""
    params, feeds, want, results, bias = rnn(4, 12, 3, 5, np.float64)
    comp = be.NumPyTransformer().computation(list(results), *params)
    X, H0, U, W = feeds
    for scale in (1.0, -0.5, 1.0, 2.0):
        W2 = W * scale
        h = H0
        for x_t in X:
            h = np.tanh(h @ W2 + x_t @ U + bias)
        np.testing.assert_allclose(comp(X, H0, U, W2)[0], h, rtol=1e-12)
        np.testing.assert_allclose(comp(X, H0, U, W2.copy())[0], h, rtol=1e-12)
    assert loops_in_c(results) == 1
