"""Recurrent models built with be.scan: the neon layers (Recurrent, LSTM, GRU), the ONNX
importer's RNN, GRU and LSTM, and the unrolling of a scan for transformers without a
loop primitive (geon/transformers/passes/unroll.py). Values in float64 against the
unrolled layers, NumPy references and central differences."""

import numpy as np
import pytest

import geon as be
from geon.frontends import neon as nn
from geon.op_graph import op_graph as og
from geon.op_graph.control import Scan
from geon.op_graph.params import clone_graph
from geon.transformers.passes.unroll import UnrollScans, unrolled_outputs
from gradcheck import assert_gradcheck

F64 = np.float64
KINDS = {"rnn": nn.Recurrent, "lstm": nn.LSTM, "gru": nn.GRU}


def _scans(results):
    return [op for op in og.toposort(list(results)) if isinstance(op, Scan)]


# --- neon layers ------------------------------------------------------------------------

def _layer_pair(kind, return_sequence=True):
    """The same layer (same name, so the same initial weights) scanned and unrolled."""
    init = nn.Uniform(-0.6, 0.6, seed=3)
    return [KINDS[kind](be.Axis(4, "H"), init=init, recurrent_init=init, dtype=F64,
                        return_sequence=return_sequence, unroll=u, name=f"s{kind}")
            for u in (False, True)]


def _axes(steps):
    return (be.Axis(2, "N", batch=True), be.Axis(steps, "T", recurrent=True),
            be.Axis(3, "F"))


@pytest.mark.parametrize("return_sequence", [True, False])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_scanned_layer_equals_unrolled_values_and_gradients(kind, return_sequence):
    x = be.placeholder(_axes(6), dtype=F64, name="x")
    X = np.random.default_rng(0).standard_normal((2, 6, 3))
    got, R = [], None
    for layer in _layer_pair(kind, return_sequence):
        y = layer(x)
        for v in layer.variables:  # non-zero biases: every term counts
            if v.name.rsplit("/", 1)[1] in ("b", "bh"):
                v.initial_value = np.random.default_rng(2).uniform(-0.5, 0.5, v.axes.shape)
        if R is None:
            R = np.random.default_rng(1).standard_normal(y.axes.shape)
        loss = be.sum(y * be.constant(R, axes=y.axes, dtype=F64), out_axes=())
        grads = be.deriv(loss, [x] + layer.variables)
        comp = be.NumPyTransformer().computation([y] + grads, x)
        got.append([np.asarray(a) for a in comp(X)])
        assert len(_scans([y])) == (0 if layer.unroll else 1)
    scanned, unrolled = got
    assert [a.shape for a in scanned] == [a.shape for a in unrolled]
    for a, b in zip(scanned, unrolled):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_scanned_graph_does_not_grow_with_the_sequence(kind):
    sizes = []
    for steps in (3, 40):
        x = be.placeholder(_axes(steps), dtype=F64)
        layer = KINDS[kind](4, dtype=F64, name=f"g{kind}")
        y = layer(x)
        cost = be.sum(y, out_axes=())
        grads = be.deriv(cost, layer.variables)
        ops = og.toposort([cost] + list(grads))
        body = sum(len(og.toposort(list(s.body.results))) for s in _scans([cost] + grads))
        sizes.append((len(ops), body))
    assert sizes[0] == sizes[1]


def test_layer_repr_and_variables_keep_their_order():
    layer = nn.GRU(3, unroll=True, name="gru")
    assert repr(layer) == "GRU(3, unroll=True, name='gru')"
    layer(be.placeholder(_axes(4)))
    assert [v.name for v in layer.variables] == ["gru/W", "gru/U", "gru/b", "gru/bh"]


# --- ONNX RNN / GRU / LSTM ----------------------------------------------------------------

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

import geon.frontends.onnx as gx  # noqa: E402

SEQ, BATCH, IN, HID = 3, 2, 2, 2
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def _sig(v):
    return 1 / (1 + np.exp(-v))


def _reference(op, x, W, R, B, h, c, reverse, lbr=False):
    """ONNX's recurrences for one direction, float64: (Y (seq, batch, H), h, c)."""
    ys = [None] * len(x)
    Wb, Rb = B[:len(B) // 2], B[len(B) // 2:]
    for t in (range(len(x) - 1, -1, -1) if reverse else range(len(x))):
        if op == "RNN":
            h = np.tanh(x[t] @ W.T + h @ R.T + Wb + Rb)
        elif op == "LSTM":
            z = x[t] @ W.T + h @ R.T + Wb + Rb
            i, o, f, g = (z[:, k * HID:(k + 1) * HID] for k in range(4))
            c = _sig(f) * c + _sig(i) * np.tanh(g)
            h = _sig(o) * np.tanh(c)
        else:
            xw = x[t] @ W.T + Wb
            part = [slice(k * HID, (k + 1) * HID) for k in range(3)]
            z = _sig(xw[:, part[0]] + h @ R[part[0]].T + Rb[part[0]])
            r = _sig(xw[:, part[1]] + h @ R[part[1]].T + Rb[part[1]])
            if lbr:
                n = np.tanh(xw[:, part[2]] + r * (h @ R[part[2]].T + Rb[part[2]]))
            else:
                n = np.tanh(xw[:, part[2]] + (r * h) @ R[part[2]].T + Rb[part[2]])
            h = (1 - z) * n + z * h
        ys[t] = h
    return np.stack(ys), h, c


def _model(op, direction, lbr):
    """An ONNX node whose every operand (x, W, R, B, initial states) is a graph input."""
    d, dirs, G = TensorProto.DOUBLE, 2 if direction == "bidirectional" else 1, GATES[op]
    shapes = {"x": (SEQ, BATCH, IN), "W": (dirs, G * HID, IN), "R": (dirs, G * HID, HID),
              "B": (dirs, 2 * G * HID), "h0": (dirs, BATCH, HID)}
    names = ["x", "W", "R", "B", "", "h0"]
    outs = ["Y", "Y_h"]
    if op == "LSTM":
        shapes["c0"] = (dirs, BATCH, HID)
        names.append("c0")
        outs.append("Y_c")
    attrs = {"linear_before_reset": 1} if lbr else {}
    node = helper.make_node(op, names, outs, hidden_size=HID, direction=direction, **attrs)
    graph = helper.make_graph([node], op.lower(),
                              [helper.make_tensor_value_info(n, d, s)
                               for n, s in shapes.items()],
                              [helper.make_tensor_value_info(o, d, None) for o in outs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]), shapes


CASES = [("RNN", "forward", False), ("RNN", "bidirectional", False),
         ("GRU", "reverse", False), ("GRU", "bidirectional", True),
         ("LSTM", "forward", False), ("LSTM", "bidirectional", False)]


@pytest.mark.parametrize("op,direction,lbr", CASES)
def test_onnx_recurrence_is_a_scan_and_matches_numpy(op, direction, lbr):
    model, shapes = _model(op, direction, lbr)
    g = gx.import_model(model)
    assert len(_scans(g.outputs)) == (2 if direction == "bidirectional" else 1)
    rng = np.random.default_rng(3)
    vals = {n: rng.standard_normal(s) * 0.7 for n, s in shapes.items()}
    got = g.computation()(*[vals[n] for n in shapes])
    dirs = shapes["W"][0]
    for d in range(dirs):
        c0 = vals["c0"][d] if op == "LSTM" else None
        y, h, c = _reference(op, vals["x"], vals["W"][d], vals["R"][d], vals["B"][d],
                             vals["h0"][d], c0, direction == "reverse" or d == 1, lbr)
        np.testing.assert_allclose(got[0][:, d], y, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(got[1][d], h, rtol=1e-12, atol=1e-14)
        if op == "LSTM":
            np.testing.assert_allclose(got[2][d], c, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("op,direction,lbr", CASES)
def test_onnx_recurrence_gradcheck(op, direction, lbr):
    """Derivatives in every operand (input, weights, biases, initial states)."""
    model, shapes = _model(op, direction, lbr)
    rng = np.random.default_rng(4)
    inputs = [(be.np.placeholder(s, dtype=F64).axes, rng.uniform(-0.8, 0.8, s))
              for s in shapes.values()]

    def build(*xs):
        g = gx.import_model(model)
        outs = [o for o in g.outputs]
        copies = clone_graph(outs, replace=dict(zip(g.inputs, xs)))
        total = None
        for o in outs:  # every output counts
            term = be.np.sum(copies[o])
            total = term if total is None else total + term
        y = copies[outs[0]]
        return be.np.sum(y * y) + total
    assert_gradcheck(build, inputs)


# --- unrolling a scan (transformers without a loop primitive) -----------------------------

@pytest.mark.parametrize("reverse", [False, True])
def test_unrolled_scan_outputs_equal_the_scan(reverse):
    T, H, D = be.Axis(4, "T"), be.Axis(3, "H"), be.Axis(2, "D")
    x = be.placeholder([D, T], dtype=F64, name="x")           # T second
    h0 = be.placeholder([H], dtype=F64, name="h0")
    u = be.placeholder([H, D], dtype=F64, name="u")

    def cell(h, xt):
        hn = be.tanh(h * 0.5 + be.dot(u, xt))
        return hn, (hn * 2.0, be.sum(hn, out_axes=()))
    hT, (y1, y2) = be.scan(cell, h0, x, T, reverse=reverse)
    cost = be.sum(y1 * y1, out_axes=()) + be.sum(y2, out_axes=()) + be.sum(hT, out_axes=())
    dx, du = be.deriv(cost, [x, u])
    results = [hT, y1, y2, dx, du]
    rng = np.random.default_rng(6)
    feeds = {x: rng.standard_normal((2, 4)), h0: rng.standard_normal(3),
             u: rng.standard_normal((3, 2))}
    want = be.evaluate(results, feeds=feeds)
    scans = _scans(results)
    assert len(scans) == 2                      # the loop and its reverse derivative
    unrolled = list(results)
    while _scans(unrolled):  # the derivative's scan reads the loop's history: in turn
        inner = _scans(unrolled)[0]
        m = {o: n for o, n in zip(inner.outputs, unrolled_outputs(inner))}
        c = clone_graph(unrolled, replace=m)
        unrolled = [c[r] for r in unrolled]
    got = be.evaluate(unrolled, feeds=feeds)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-14)
    tanhs = [op for op in og.toposort(unrolled) if isinstance(op, og.Tanh)]
    assert len(tanhs) >= 4                      # one copy of the cell per step


def test_benchmark_builds_the_same_step_both_ways():
    from benchmarks.scan import training_graph
    losses = []
    X = np.random.default_rng(0).standard_normal((2, 5, 32)).astype(np.float32)
    Y = np.zeros((2, 5, 8), np.float32)
    for unroll in (False, True):
        results, x, t, _ = training_graph(5, 8, 2, unroll)
        step = be.NumPyTransformer().computation(results, x, t)
        losses.append([float(step(X, Y)[0]) for _ in range(3)])
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
    assert losses[0][2] < losses[0][0]


class _Unrolling(be.NumPyTransformer):
    """The NumPy transformer with scans unrolled first (as the GPU transformer runs)."""

    def passes(self):
        return [UnrollScans()] + super().passes()


def test_unroll_pass_runs_nested_scans_and_derivatives():
    T, S, H = be.Axis(3, "T"), be.Axis(2, "S"), be.Axis(2, "H")
    x = be.placeholder([T, S, H], dtype=F64, name="x")
    h0 = be.placeholder([H], dtype=F64, name="h0")

    def outer(h, xt):                       # xt: (S, H); an inner scan over S
        def inner(g, xs):
            return be.tanh(g * 0.7 + xs), None
        g, _ = be.scan(inner, h, xt, S)
        return g * 0.9, be.sum(g * g, out_axes=())
    hT, ys = be.scan(outer, h0, x, T)
    cost = be.sum(ys, out_axes=()) + be.sum(hT * hT, out_axes=())
    dx, dh0 = be.deriv(cost, [x, h0])
    rng = np.random.default_rng(8)
    X, H0 = rng.standard_normal((3, 2, 2)), rng.standard_normal(2)
    want = be.NumPyTransformer().computation([cost, dx, dh0], x, h0)(X, H0)
    comp = _Unrolling().computation([cost, dx, dh0], x, h0)
    assert "_scan_bodies" not in comp.source
    for a, b in zip(comp(X, H0), want):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-14)


def test_torch_export_runs_a_scanned_layer_unrolled():
    torch = pytest.importorskip("torch")
    from geon.transformers.torch.export import to_torch
    x = be.placeholder(_axes(5), dtype=F64, name="x")
    y = nn.GRU(4, dtype=F64, name="tgru")(x)
    X = np.random.default_rng(9).standard_normal((2, 5, 3))
    want = be.NumPyTransformer().computation(y, x)(X)
    got = to_torch(y, x, output_order=None)(torch.from_numpy(X))
    np.testing.assert_allclose(got.detach().numpy(), want, rtol=1e-13, atol=1e-14)
