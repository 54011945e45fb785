"""be.cond and be.while_loop (geon/op_graph/control_ops.py,
geon/transformers/numpy/control_flow.py)."""

import numpy as np
import pytest

import geon as be
from geon.op_graph.control_ops import Cond, WhileLoop
from gradcheck import assert_gradcheck

A, B = be.Axis(3, "A"), be.Axis(2, "B")
rng = np.random.default_rng(11)


def run_numpy(results, *params, feeds=()):
    return be.NumPyTransformer().computation(list(results), *params)(*feeds)


def _ph(axes, name):
    return be.placeholder(axes, dtype=np.float64, name=name)


# --- cond ------------------------------------------------------------------------------

@pytest.mark.parametrize("pred", [1.0, 0.0, -2.5])
def test_cond_values_match_python(pred):
    p, x, w = _ph([], "p"), _ph([A], "x"), _ph([A, B], "w")
    y, z = be.cond(p, lambda v: (be.tanh(v) * 3.0, be.dot(w, v)),
                   lambda v: (v * v, be.sum(w, out_axes=[B]) - 1.0), x)
    X, W = rng.standard_normal(3), rng.standard_normal((3, 2))
    want = (np.tanh(X) * 3, X @ W) if pred else (X * X, W.sum(0) - 1)
    ref = be.evaluate([y, z], feeds={p: pred, x: X, w: W})
    got = run_numpy([y, z], p, x, w, feeds=(pred, X, W))
    for r, g, e in zip(ref, got, want):
        np.testing.assert_allclose(r, e, rtol=1e-13)
        np.testing.assert_allclose(g, e, rtol=1e-13)
    op = y.args[0]
    assert isinstance(op, Cond) and op.args[0] is p and w in op.args


def test_cond_identity_and_closure_branches():
    """A branch may return its operand itself, or a closed-over tensor."""
    p, x, c = _ph([], "p"), _ph([A], "x"), _ph([A], "c")
    y = be.cond(p, lambda v: v, lambda v: c, x)
    z = be.cond(p, lambda: be.exp(c), lambda: c * 0.5)
    X, C = rng.standard_normal(3), rng.standard_normal(3)
    for P in (1.0, 0.0):
        got = run_numpy([y, z], p, x, c, feeds=(P, X, C))
        np.testing.assert_allclose(got[0], X if P else C)
        np.testing.assert_allclose(got[1], np.exp(C) if P else C * 0.5)


def test_cond_results_reordered_axes():
    p, x = _ph([], "p"), _ph([A, B], "x")
    y = be.cond(p, lambda v: v, lambda v: be.axes_with_order(v * 2.0, [B, A]), x)
    assert y.axes == be.Axes(A, B)
    X = rng.standard_normal((3, 2))
    np.testing.assert_allclose(run_numpy([y], p, x, feeds=(0.0, X))[0], 2 * X)


def test_cond_errors_name_the_branch_and_line():
    p, x = _ph([], "p"), _ph([A], "x")
    with pytest.raises(be.AxisMismatchError, match=r"cond: the false branch's result 0 "
                       r".* has axes \(A:3, B:2\) but the true branch's result 0 has "
                       r"\(A:3\).*test_control_flow.py"):
        be.cond(p, lambda v: v, lambda v: v * be.constant(1.0, axes=[B]), x)
    with pytest.raises(be.ArgumentError, match="dtype int32 but the true branch's"):
        be.cond(p, lambda v: be.sum(v, out_axes=()),
                lambda v: be.constant(1, dtype=np.int32), x)
    with pytest.raises(be.ArgumentError, match="the true branch returned 2 results and "
                       "the false branch 1"):
        be.cond(p, lambda v: (v, v), lambda v: v, x)
    with pytest.raises(be.AxisMismatchError, match="cond: the predicate .* has axes "
                       r"\(A:3\); a predicate is a scalar"):
        be.cond(x, lambda v: v, lambda v: v, x)


@pytest.mark.parametrize("pred", [1.0, 0.0])
def test_cond_gradcheck(pred):
    def build(x, w):
        return be.cond(be.constant(pred), lambda v, m: be.tanh(v * be.sum(m, out_axes=[A])) * v,
                       lambda v, m: be.exp(v) * be.sum(m * m, out_axes=[A]), x, w)
    assert_gradcheck(build, [([A], rng.standard_normal(3)),
                             ([A, B], rng.standard_normal((3, 2)))])


def test_cond_closure_gradients_and_second_derivative():
    p, x, w = _ph([], "p"), _ph([A], "x"), _ph([A], "w")
    y = be.cond(p, lambda v: be.sum(v * v * w, out_axes=()),
                lambda v: be.sum(be.sin(v), out_axes=()), x)
    gx, gw = be.deriv(y, [x, w])
    hx = be.deriv(be.sum(gx * w, out_axes=()), x)  # d/dx (grad . w)
    X, W = rng.standard_normal(3), rng.standard_normal(3)
    r1 = run_numpy([gx, gw, hx], p, x, w, feeds=(1.0, X, W))
    np.testing.assert_allclose(r1[0], 2 * X * W)
    np.testing.assert_allclose(r1[1], X * X)
    np.testing.assert_allclose(r1[2], 2 * W * W)
    r0 = run_numpy([gx, gw, hx], p, x, w, feeds=(0.0, X, W))
    np.testing.assert_allclose(r0[0], np.cos(X))
    np.testing.assert_allclose(r0[1], 0.0)
    np.testing.assert_allclose(r0[2], -np.sin(X) * W)


@pytest.mark.parametrize("pred", [1.0, 0.0])
def test_cond_jvp_matches_central_differences(pred):
    p, x, w = _ph([], "p"), _ph([A], "x"), _ph([A, B], "w")

    def f(v):
        return be.cond(p, lambda u: be.dot(w, be.tanh(u)), lambda u: be.cast_axes(
            be.dot(w, u * u), [B]), v)
    X, W, T = rng.standard_normal(3), rng.standard_normal((3, 2)), rng.standard_normal(3)
    y = f(x)
    tan, = be.jvp([y], [x], [be.constant(T, axes=[A])])
    got = run_numpy([tan], p, x, w, feeds=(pred, X, W))[0]
    comp = be.NumPyTransformer().computation(y, p, x, w)
    e = 1e-6
    num = (comp(pred, X + e * T, W) - comp(pred, X - e * T, W)) / (2 * e)
    np.testing.assert_allclose(got, num, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(be.evaluate(tan, feeds={p: pred, x: X, w: W}), got,
                               rtol=1e-12)


# --- while_loop ---------------------------------------------------------------------------

def newton_sqrt(a, x0, tol=1e-12, max_steps=None):
    x, n = x0, 0
    while abs(x * x - a) > tol and (max_steps is None or n < max_steps):
        x, n = 0.5 * (x + a / x), n + 1
    return x, n


def _sqrt_loop(a, x0, max_steps=None, tol=1e-12):
    n0 = be.constant(0, dtype=np.int32)
    x, n = be.while_loop(lambda c: be.absolute(c[0] * c[0] - a) > tol,
                         lambda c: (0.5 * (c[0] + a / c[0]), c[1] + 1), (x0, n0),
                         max_steps=max_steps)
    return x, n


@pytest.mark.parametrize("max_steps", [None, 3, 50])
def test_while_values_match_python(max_steps):
    a, x0 = _ph([], "a"), _ph([], "x0")
    x, n = _sqrt_loop(a, x0, max_steps)
    want = newton_sqrt(2.0, 1.0, max_steps=max_steps)
    ref = be.evaluate([x, n], feeds={a: 2.0, x0: 1.0})
    got = run_numpy([x, n], a, x0, feeds=(2.0, 1.0))
    for r in (ref, got):
        assert float(r[0]) == pytest.approx(want[0], rel=1e-15) and int(r[1]) == want[1]
    assert isinstance(x.args[0], WhileLoop) and n.dtype == np.int32


def test_while_vector_carry_and_zero_steps():
    v0, w = _ph([A], "v0"), _ph([A], "w")
    v = be.while_loop(lambda u: be.sum(u * u, out_axes=()) < 100.0,
                      lambda u: u * 1.5 + w, v0)
    V, W = np.array([0.1, 0.2, 0.3]), np.array([1.0, 0.5, 0.0])
    u = V.copy()
    while (u * u).sum() < 100:
        u = u * 1.5 + W
    np.testing.assert_allclose(run_numpy([v], v0, w, feeds=(V, W))[0], u)
    big = np.array([20.0, 0.0, 0.0])  # the predicate fails at once: no step
    np.testing.assert_allclose(run_numpy([v], v0, w, feeds=(big, W))[0], big)


def test_while_errors():
    v0 = _ph([A], "v0")
    with pytest.raises(be.AxisMismatchError, match="while_loop: the body's carry 0 .* has "
                       r"axes \(A:3, B:2\) but the carry it replaces has \(A:3\)"):
        be.while_loop(lambda u: be.sum(u, out_axes=()) < 1.0,
                      lambda u: u * be.constant(1.0, axes=[B]), v0)
    with pytest.raises(be.AxisMismatchError, match="cond_fn's result"):
        be.while_loop(lambda u: u < 1.0, lambda u: u, v0)
    with pytest.raises(be.ArgumentError, match="max_steps is 0"):
        be.while_loop(lambda u: be.sum(u, out_axes=()) < 1.0, lambda u: u, v0,
                      max_steps=0)
    v = be.while_loop(lambda u: be.sum(u, out_axes=()) < 1.0, lambda u: u * 2.0, v0)
    with pytest.raises(be.ArgumentError, match=r"WhileLoop .* needs max_steps"):
        be.deriv(be.sum(v, out_axes=()), v0)


@pytest.mark.parametrize("max_steps", [2, 6, 20])
def test_while_gradcheck(max_steps):
    """max_steps below, at and above the steps the loop runs (the gradients with
    respect to the initial carry and to closures, through a stopping rule that does not
    move under small changes)."""
    def build(v0, w):
        k0 = be.constant(0.0)
        k, v = be.while_loop(lambda c: c[0] < 5.5,
                             lambda c: (c[0] + 1.0, be.tanh(c[1] * w + 0.3)), (k0, v0),
                             max_steps=max_steps)
        return v * v
    assert_gradcheck(build, [([A], rng.standard_normal(3)),
                             ([A], rng.standard_normal(3))])


def test_while_gradient_through_data_dependent_stop():
    """The Newton iteration for sqrt(a): d x / d a = 1 / (2 sqrt(a)) at convergence."""
    a, x0 = _ph([], "a"), _ph([], "x0")
    x, _ = _sqrt_loop(a, x0, max_steps=40)
    g = be.deriv(x, a)
    got = run_numpy([x, g], a, x0, feeds=(3.0, 1.0))
    np.testing.assert_allclose(got[0], np.sqrt(3.0), rtol=1e-14)
    np.testing.assert_allclose(got[1], 0.5 / np.sqrt(3.0), rtol=1e-10)
    np.testing.assert_allclose(be.evaluate(g, feeds={a: 3.0, x0: 1.0}), got[1],
                               rtol=1e-12)


def test_while_second_derivatives():
    """deriv of deriv (a scan's adjoint differentiated again) and jvp of deriv."""
    x0 = _ph([], "x0")
    _, x = be.while_loop(lambda c: c[0] < 3.0,
                         lambda c: (c[0] + 1.0, be.sin(c[1]) + c[1] * c[1]),
                         (be.constant(0.0, dtype=np.float64), x0), max_steps=5)
    g = be.deriv(x, x0)
    h = be.deriv(g, x0)
    t, = be.jvp([g], [x0], [be.constant(1.0, dtype=np.float64)])

    def F(v):
        for _ in range(3):
            v = np.sin(v) + v * v
        return v
    e, X = 1e-4, 0.3
    got = run_numpy([g, h, t], x0, feeds=(X,))
    np.testing.assert_allclose(got[0], (F(X + e) - F(X - e)) / (2 * e), rtol=1e-7)
    np.testing.assert_allclose(got[1], (F(X + e) - 2 * F(X) + F(X - e)) / e ** 2,
                               rtol=1e-6)
    np.testing.assert_allclose(got[2], got[1], rtol=1e-12)


@pytest.mark.parametrize("max_steps", [None, 3])
def test_while_jvp_matches_central_differences(max_steps):
    v0, w = _ph([A], "v0"), _ph([A], "w")
    k0 = be.constant(0.0)
    _, v = be.while_loop(lambda c: c[0] < 4.0,
                         lambda c: (c[0] + 1.0, be.sin(c[1]) * w + c[1]), (k0, v0),
                         max_steps=max_steps)
    V, W = rng.standard_normal(3), rng.standard_normal(3)
    TV, TW = rng.standard_normal(3), rng.standard_normal(3)
    tan, = be.jvp([v], [v0, w], [be.constant(TV, axes=[A]), be.constant(TW, axes=[A])])
    got = run_numpy([tan], v0, w, feeds=(V, W))[0]
    comp = be.NumPyTransformer().computation(v, v0, w)
    e = 1e-6
    num = (comp(V + e * TV, W + e * TW) - comp(V - e * TV, W - e * TW)) / (2 * e)
    np.testing.assert_allclose(got, num, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(be.evaluate(tan, feeds={v0: V, w: W}), got, rtol=1e-12)


def test_cond_inside_while_inside_scan():
    """Nesting: a scan whose body runs a while loop whose body branches."""
    T = be.Axis(3, "T")
    x, h0 = _ph([T], "x"), _ph([], "h0")

    def cell(h, xt):
        def step(c):
            return c[0] + 1.0, be.cond(c[1] > 1.0, lambda u: u * 0.5, lambda u: u + xt,
                                       c[1])
        _, h_new = be.while_loop(lambda c: c[0] < 3.0, step, (be.constant(0.0), h),
                                 max_steps=3)
        return h_new, h_new
    hT, ys = be.scan(cell, h0, x, T)
    X = np.array([0.4, 0.9, -0.2])

    def loop(h0):
        h, out = h0, []
        for t in range(3):
            for _ in range(3):
                h = h * 0.5 if h > 1.0 else h + X[t]
            out.append(h)
        return h, out
    want = loop(0.3)
    got = run_numpy([hT, ys], x, h0, feeds=(X, 0.3))
    np.testing.assert_allclose(got[0], want[0], rtol=1e-14)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-14)
    g = be.deriv(hT, h0)
    e = 1e-6
    f = be.NumPyTransformer().computation(hT, x, h0)
    num = (f(X, 0.3 + e) - f(X, 0.3 - e)) / (2 * e)
    np.testing.assert_allclose(run_numpy([g], x, h0, feeds=(X, 0.3))[0], num, rtol=1e-7)


def test_subgraphs_are_serialized():
    # (tests/test_serialize_control.py tests documents with bodies in depth)
    p, x = _ph([], "p"), _ph([A], "x")
    y = be.cond(p, lambda v: v * 2.0, lambda v: v, x)
    text = be.serialize(y)
    assert be.serialize(be.deserialize(text)) == text


# --- ONNX If, Loop, Scan (geon/frontends/onnx/builders/control_flow.py) -------------------

def _onnx():
    return pytest.importorskip("onnx"), pytest.importorskip("onnxruntime")


def _vi(helper, name, dtype, shape):
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(
        np.dtype(dtype)), shape)


def _check_onnx(model, feeds, rtol=1e-6):
    """geon's import of ``model`` against ONNX Runtime."""
    onnx, ort = _onnx()
    from geon.frontends.onnx import import_model
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, feeds)
    got = import_model(model).computation()(*feeds.values())
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=rtol, atol=1e-6)
    return got


def test_onnx_if_with_run_time_condition_and_outer_values():
    onnx, _ = _onnx()
    h = onnx.helper
    then_g = h.make_graph([h.make_node("Mul", ["x", "w"], ["t"]),
                           h.make_node("Tanh", ["t"], ["out"])], "then", [],
                          [_vi(h, "out", np.float32, [2, 3])])
    else_g = h.make_graph([h.make_node("Sub", ["x", "w"], ["out2"])], "else", [],
                          [_vi(h, "out2", np.float32, [2, 3])])
    g = h.make_graph([h.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
                      h.make_node("Greater", ["s", "zero"], ["c"]),
                      h.make_node("If", ["c"], ["y"], then_branch=then_g,
                                  else_branch=else_g)], "g",
                     [_vi(h, "x", np.float32, [2, 3]), _vi(h, "w", np.float32, [2, 3])],
                     [_vi(h, "y", np.float32, [2, 3])],
                     initializer=[onnx.numpy_helper.from_array(np.float32(0.0), "zero")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    W = rng.standard_normal((2, 3)).astype(np.float32)
    for sign in (1.0, -1.0):
        X = (np.abs(rng.standard_normal((2, 3))) * sign).astype(np.float32)
        _check_onnx(m, {"x": X, "w": W})


def test_onnx_loop_as_while_and_as_scan():
    """A loop whose body computes its condition (a while loop over the iteration,
    the condition and the carried value), and one with a scan output (a scan over the
    trip count)."""
    onnx, _ = _onnx()
    h = onnx.helper
    f32 = np.float32
    body = h.make_graph(
        [h.make_node("Mul", ["y_in", "k"], ["y_out"]),
         h.make_node("ReduceSum", ["y_out"], ["s"], keepdims=0),
         h.make_node("Less", ["s", "limit"], ["c_out"])], "body",
        [_vi(h, "i", np.int64, []), _vi(h, "c_in", np.bool_, []),
         _vi(h, "y_in", f32, [3])],
        [_vi(h, "c_out", np.bool_, []), _vi(h, "y_out", f32, [3])])
    g = h.make_graph([h.make_node("Loop", ["M", "", "y0"], ["y"], body=body)], "g",
                     [_vi(h, "M", np.int64, []), _vi(h, "y0", f32, [3]),
                      _vi(h, "k", f32, []), _vi(h, "limit", f32, [])],
                     [_vi(h, "y", f32, [3])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 16)])
    Y = np.array([0.5, 1.0, 0.25], f32)
    for trips in (2, 50):
        _check_onnx(m, {"M": np.array(trips), "y0": Y, "k": np.array(1.5, f32),
                        "limit": np.array(40.0, f32)})
    from geon.frontends.onnx import import_model
    from geon.op_graph.control import Scan
    ops = be.op_graph.core.toposort(import_model(m).outputs)
    assert any(isinstance(o, WhileLoop) for o in ops)
    body2 = h.make_graph(
        [h.make_node("Cast", ["i"], ["fi"], to=onnx.TensorProto.FLOAT),
         h.make_node("Add", ["y_in", "fi"], ["y_out"]),
         h.make_node("Identity", ["c_in"], ["c_out"]),
         h.make_node("Mul", ["y_out", "y_out"], ["sq"])], "body2",
        [_vi(h, "i", np.int64, []), _vi(h, "c_in", np.bool_, []),
         _vi(h, "y_in", f32, [3])],
        [_vi(h, "c_out", np.bool_, []), _vi(h, "y_out", f32, [3]), _vi(h, "sq", f32, [3])])
    g2 = h.make_graph([h.make_node("Loop", ["M", "c", "y0"], ["y", "ys"], body=body2)],
                      "g2", [_vi(h, "y0", f32, [3])],
                      [_vi(h, "y", f32, [3]), _vi(h, "ys", f32, [4, 3])],
                      initializer=[onnx.numpy_helper.from_array(np.array(4), "M"),
                                   onnx.numpy_helper.from_array(np.array(True), "c")])
    m2 = h.make_model(g2, opset_imports=[h.make_opsetid("", 16)])
    _check_onnx(m2, {"y0": Y})
    out = import_model(m2).outputs[0]
    assert any(isinstance(o, Scan) for o in be.op_graph.core.toposort([out]))


@pytest.mark.parametrize("directions,axes", [((0, 0), (0, 0)), ((1, 0), (1, 1))])
def test_onnx_scan_directions_and_axes(directions, axes):
    onnx, _ = _onnx()
    h = onnx.helper
    f32 = np.float32
    body = h.make_graph(
        [h.make_node("Add", ["s_in", "x_t"], ["s_out"]),
         h.make_node("Mul", ["s_out", "x_t"], ["y_t"])], "body",
        [_vi(h, "s_in", f32, [2]), _vi(h, "x_t", f32, [2])],
        [_vi(h, "s_out", f32, [2]), _vi(h, "y_t", f32, [2])])
    x_shape = [4, 2] if axes[0] == 0 else [2, 4]
    node = h.make_node("Scan", ["s0", "x"], ["s", "ys"], body=body, num_scan_inputs=1,
                       scan_input_directions=[directions[0]],
                       scan_output_directions=[directions[1]],
                       scan_input_axes=[axes[0]], scan_output_axes=[axes[1]])
    g = h.make_graph([node], "g", [_vi(h, "s0", f32, [2]), _vi(h, "x", f32, x_shape)],
                     [_vi(h, "s", f32, [2]), _vi(h, "ys", f32, None)])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 16)])
    _check_onnx(m, {"s0": np.array([0.5, -1.0], f32),
                    "x": rng.standard_normal(x_shape).astype(f32)})


def test_a_torch_jit_script_loop_exported_to_onnx_imports_and_matches_pytorch():
    """A Python loop that torch.jit.script keeps (an ONNX Loop in the export) imports
    and gives PyTorch's values."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnx")
    import io
    import warnings
    from geon.frontends.onnx import import_model

    class Recurrence(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            h = torch.zeros(x.shape[1], 4)
            for t in range(x.shape[0]):
                h = torch.tanh(self.lin(x[t]) + h)
            return h

    torch.manual_seed(0)
    x = torch.randn(5, 3, 4)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        # (torch.jit.script and the TorchScript exporter warn that they are deprecated)
        warnings.simplefilter("ignore", DeprecationWarning)
        module = torch.jit.script(Recurrence())
        torch.onnx.export(module, (x,), buf, dynamo=False, opset_version=17,
                          input_names=["x"])
    import onnx
    assert "Loop" in [n.op_type for n in onnx.load_from_string(buf.getvalue()).graph.node]
    g = import_model(buf.getvalue())
    got = be.NumPyTransformer().computation(g.outputs[0], *g.inputs)(x.numpy())
    with torch.no_grad():
        want = module(x).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
