"""The fast paths the model zoo (benchmarks/models.py) leans on: float32 erf by a
rational function, ``x ** 3`` and ``x ** -1`` rewritten to products and reciprocals,
and the ONNX LSTM's gates taking one sigmoid per step."""

import math

import numpy as np
import pytest

import geon as be
from geon.op_graph import op_graph as og
from geon.op_graph import special


def _correctly_rounded_erf(x32):
    return np.array([math.erf(float(v)) for v in x32.ravel()]).astype(np.float32) \
        .reshape(x32.shape)


def test_float32_erf_is_within_one_ulp_and_almost_always_correctly_rounded():
    rng = np.random.default_rng(0)
    x = np.concatenate([np.linspace(-5, 5, 20001), rng.standard_normal(20000) * 2,
                        rng.standard_normal(2000) * 1e-3, [1e-30, -1e-30, 1e-45, 3.9, 4.0,
                                                           4.5, 100.0, -100.0]])
    x32 = x.astype(np.float32)
    got, want = special.erf(x32), _correctly_rounded_erf(x32)
    assert got.dtype == np.float32
    ulps = np.abs(got.view(np.int32).astype(np.int64) - want.view(np.int32))
    assert ulps.max() <= 1
    assert np.count_nonzero(ulps) <= x.size // 1000  # (7 in 42,009 here)


def test_float32_erf_special_values_shapes_and_out():
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0], np.float32)
    got = special.erf(x)
    assert np.isnan(got[0]) and list(got[1:3]) == [1.0, -1.0]
    assert got[3] == 0 and not np.signbit(got[3]) and np.signbit(got[4])
    assert special.erf(np.float32(0.5)).shape == ()
    assert special.erf(np.zeros((0, 3), np.float32)).shape == (0, 3)
    half = special.erf(np.array([0.5, -2.0], np.float16))
    assert half.dtype == np.float16
    np.testing.assert_allclose(half, [math.erf(0.5), math.erf(-2.0)], rtol=1e-3)
    out = np.empty((2, 3), np.float32)
    x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    assert special.erf(x, out=out) is out
    np.testing.assert_array_equal(out, _correctly_rounded_erf(x))


def test_float64_erf_keeps_the_series_precision():
    x = np.linspace(-6, 6, 2001)
    want = np.array([math.erf(v) for v in x])
    np.testing.assert_allclose(special.erf(x), want, rtol=4e-15, atol=1e-300)


def _axis(n, name):
    return be.Axis(n, name=name)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cube_and_reciprocal_powers_become_products(dtype):
    C = _axis(7, "C")
    x = be.placeholder(be.Axes([C]), dtype=dtype)
    X = np.array([-2.5, -0.0, 0.0, 1.5, 3.0, -np.inf, 1e-3], dtype)
    t = be.NumPyTransformer()
    cube, inv = t.computation(x ** 3.0, x), t.computation(x ** -1.0, x)
    for comp in (cube, inv):
        kinds = {type(op) for op in comp.graph.ops()}
        assert og.Power not in kinds
    with np.errstate(divide="ignore"):
        np.testing.assert_array_equal(inv(X), np.reciprocal(X))
        np.testing.assert_array_equal(cube(X), X * X * X)
    np.testing.assert_allclose(cube(X), np.power(X, 3), rtol=2 * np.finfo(dtype).eps)


# --- the ONNX LSTM ------------------------------------------------------------------------

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

import geon.frontends.onnx as gx  # noqa: E402
from geon.op_graph.control import Scan  # noqa: E402
from geon.transformers.numpy import compiled as ck  # noqa: E402
from geon.transformers.numpy.control import body_runner  # noqa: E402

SEQ, BATCH, IN, HID = 5, 3, 4, 6


def _sig(v):
    return 1 / (1 + np.exp(-v))


def _lstm_reference(x, W, R, B, P=None):
    """ONNX's LSTM (forward, gates i o f c), float64."""
    h = np.zeros((x.shape[1], HID))
    c = np.zeros_like(h)
    ys = []
    for t in range(x.shape[0]):
        z = x[t] @ W.T + h @ R.T + B[:4 * HID] + B[4 * HID:]
        i, o, f, g = (z[:, k * HID:(k + 1) * HID] for k in range(4))
        if P is not None:
            i, f = i + P[:HID] * c, f + P[2 * HID:] * c
        c = _sig(f) * c + _sig(i) * np.tanh(g)
        if P is not None:
            o = o + P[HID:2 * HID] * c
        h = _sig(o) * np.tanh(c)
        ys.append(h)
    return np.stack(ys)[:, None]


def _lstm_model(W, R, B, P):
    d = TensorProto.DOUBLE
    inits = [helper.make_tensor(n, d, a.shape, a.ravel().tolist())
             for n, a in (("W", W[None]), ("R", R[None]), ("B", B[None]))]
    names = ["x", "W", "R", "B"]
    if P is not None:
        inits.append(helper.make_tensor("P", d, (1, 3 * HID), P.tolist()))
        names += ["", "", "", "P"]
    node = helper.make_node("LSTM", names, ["Y"], hidden_size=HID)
    graph = helper.make_graph([node], "lstm",
                              [helper.make_tensor_value_info("x", d, [SEQ, BATCH, IN])],
                              [helper.make_tensor_value_info("Y", d, [SEQ, 1, BATCH, HID])],
                              initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])


@pytest.mark.parametrize("peepholes", [False, True])
def test_onnx_lstm_matches_reference_and_its_input_gradient_central_differences(peepholes):
    rng = np.random.default_rng(1)
    W, R = rng.standard_normal((4 * HID, IN)) * 0.5, rng.standard_normal((4 * HID, HID)) * 0.5
    B = rng.standard_normal(8 * HID) * 0.5
    P = rng.standard_normal(3 * HID) * 0.5 if peepholes else None
    X = rng.standard_normal((SEQ, BATCH, IN))
    g = gx.import_model(_lstm_model(W, R, B, P))
    y, x = g.outputs[0], g.inputs[0]
    (scan,) = [op for op in og.toposort([y]) if isinstance(op, Scan)]
    if ck.available():
        # every op of the cell has the step's shape (batch, H): the body's computation
        # runs the cell as one C loop (with its gates read through views of the step's
        # product and of xw's step), and the product before it
        run = body_runner(scan.body).computation.source.split("def step(")[0]
        assert run.count("# compiled:") == 1 and run.count("np.matmul(") == 1, run
    Rw = rng.standard_normal(y.axes.shape)
    Rc = be.constant(Rw, axes=y.axes)
    loss = be.sum(y * Rc, out_axes=())
    comp = be.NumPyTransformer().computation([y, be.deriv(loss, x)], x)
    got, grad = comp(X)
    np.testing.assert_allclose(got, _lstm_reference(X, W, R, B, P), rtol=1e-12, atol=1e-14)
    eps, num = 1e-6, np.zeros_like(X)
    for idx in np.ndindex(X.shape):
        d = np.zeros_like(X)
        d[idx] = eps
        num[idx] = (np.sum(_lstm_reference(X + d, W, R, B, P) * Rw)
                    - np.sum(_lstm_reference(X - d, W, R, B, P) * Rw)) / (2 * eps)
    np.testing.assert_allclose(grad, num, rtol=1e-6, atol=1e-8)
