"""The neon frontend (geon/frontends/neon): layers against PyTorch and the float64
gradient checker, optimizers against hand-written NumPy references of their published
rules, exact resume after save/restore and after SIGINT, and the Model's contracts."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import geon as be
from geon.frontends import neon as nn
from gradcheck import assert_gradcheck

F64 = np.float64


def axis(n, name, **kw):
    return be.Axis(n, name=name, **kw)


def run_layer(layer, x_axes, x, order):
    """The layer's output for ``x`` (laid out as ``x_axes``) in the axis ``order``,
    and its variables' values ``{short name: array}``."""
    xp = be.placeholder(be.Axes(*x_axes), dtype=x.dtype, name="x")
    out = be.axes_with_order(layer(xp), be.Axes(*order))
    t = be.NumPyTransformer()
    y = t.computation(out, xp)(x)
    return y, {v.name.rsplit("/", 1)[1]: t.state[v].copy() for v in layer.variables}


# --- layers: forward values against PyTorch -------------------------------------------

torch = pytest.importorskip("torch", reason="the layers' forward values are checked "
                                            "against PyTorch's layers")


def test_affine_matches_torch_linear():
    F, Y, N = axis(5, "F"), axis(3, "Y"), axis(4, "N", batch=True)
    x = np.random.default_rng(0).standard_normal((4, 5))
    layer = nn.Affine(Y, activation="tanh", bias_init=nn.Uniform(-1, 1, seed=3),
                      dtype=F64, name="dense")
    y, w = run_layer(layer, (N, F), x, (N, Y))
    assert [v.name for v in layer.variables] == ["dense/W", "dense/b"]
    lin = torch.nn.Linear(5, 3).double()
    with torch.no_grad():
        lin.weight.copy_(torch.from_numpy(w["W"]))
        lin.bias.copy_(torch.from_numpy(w["b"]))
        expected = torch.tanh(lin(torch.from_numpy(x))).numpy()
    assert np.allclose(y, expected, rtol=1e-12, atol=1e-12)


def _torch_rnn(kind, H, Fn, w):
    G = {"rnn": 1, "lstm": 4, "gru": 3}[kind]
    cls = {"rnn": torch.nn.RNN, "lstm": torch.nn.LSTM, "gru": torch.nn.GRU}[kind]
    m = cls(Fn, H, batch_first=True).double()
    with torch.no_grad():
        m.weight_ih_l0.copy_(torch.from_numpy(w["W"].reshape(G * H, Fn)))
        m.weight_hh_l0.copy_(torch.from_numpy(w["U"].reshape(G * H, H)))
        m.bias_ih_l0.copy_(torch.from_numpy(w["b"].reshape(G * H)))
        m.bias_hh_l0.copy_(torch.from_numpy(w["bh"].reshape(G * H)) if "bh" in w
                           else torch.zeros(G * H, dtype=torch.float64))
    return m


@pytest.mark.parametrize("kind", ["rnn", "lstm", "gru"])
def test_recurrent_layers_match_torch(kind):
    T, F, N = axis(5, "T", recurrent=True), axis(3, "F"), axis(2, "N", batch=True)
    H = axis(4, "H")
    cls = {"rnn": nn.Recurrent, "lstm": nn.LSTM, "gru": nn.GRU}[kind]
    layer = cls(H, init=nn.Uniform(-0.6, 0.6, seed=1), recurrent_init=nn.Uniform(-0.6, 0.6),
                dtype=F64, name=kind)
    x = np.random.default_rng(1).standard_normal((2, 5, 3))
    # Non-zero biases, so that each bias term is checked.
    layer(be.placeholder(be.Axes(N, T, F), dtype=F64))   # makes the variables
    rng = np.random.default_rng(2)
    for v in layer.variables:
        if v.name.rsplit("/", 1)[1] in ("b", "bh"):
            v.initial_value = rng.uniform(-0.5, 0.5, v.axes.shape)
    y, w = run_layer(layer, (N, T, F), x, (N, T, H))
    assert y.shape == (2, 5, 4)
    m = _torch_rnn(kind, 4, 3, w)
    with torch.no_grad():
        expected = m(torch.from_numpy(x))[0].numpy()
    assert np.allclose(y, expected, rtol=1e-12, atol=1e-12), kind

    last = cls(H, return_sequence=False, dtype=F64, name=kind + "_last")
    y_last, w = run_layer(last, (N, T, F), x, (N, H))
    with torch.no_grad():
        expected = _torch_rnn(kind, 4, 3, w)(torch.from_numpy(x))[0].numpy()[:, -1]
    assert np.allclose(y_last, expected, rtol=1e-12, atol=1e-12)


def test_embedding_and_layernorm_match_torch():
    V, E, S = 7, axis(4, "E"), axis(5, "S")
    ids = np.array([[0, 3, 6, 3, 1], [2, 2, 5, 0, 4]])
    N = axis(2, "N", batch=True)
    emb = nn.Embedding(V, E, dtype=F64, name="emb")
    ip = be.placeholder(be.Axes(N, S), dtype=np.int64, name="ids")
    t = be.NumPyTransformer()
    y = t.computation(be.axes_with_order(emb(ip), be.Axes(N, S, E)), ip)(ids)
    table = t.state[emb.variables[0]]
    m = torch.nn.Embedding(V, 4).double()
    with torch.no_grad():
        m.weight.copy_(torch.from_numpy(table))
        assert np.array_equal(y, m(torch.from_numpy(ids)).numpy())

    F = axis(6, "F")
    x = np.random.default_rng(3).standard_normal((2, 6)) * 3 + 1
    ln = nn.LayerNorm(dtype=F64, name="ln")
    y, _ = run_layer(ln, (N, F), x, (N, F))
    ref = torch.nn.LayerNorm(6, eps=1e-5).double()
    with torch.no_grad():
        assert np.allclose(y, ref(torch.from_numpy(x)).numpy(), rtol=1e-12, atol=1e-12)


def test_flatten_and_sequential_names():
    A, B, N = axis(2, "A"), axis(3, "B"), axis(4, "N", batch=True)
    x = np.arange(24.0).reshape(4, 2, 3)
    flat = nn.Flatten(name="flat")
    y, _ = run_layer(flat, (N, A, B), x, (N, be.Axis(6, "flat_out")))
    assert np.array_equal(y, x.reshape(4, 6))

    net = nn.Sequential([nn.Flatten(name="f"), nn.Affine(2, name="conv1")], name="net")
    xp = be.placeholder(be.Axes(N, A, B), name="x")
    net(xp)
    assert [v.name for v in net.variables] == ["net/conv1/W", "net/conv1/b"]
    net(xp)                                            # variables are made once
    assert len(net.variables) == 2


# --- layers: gradients through the float64 checker ------------------------------------

def _seeded(layer, **variables):
    """Make ``layer`` use the given ops as its Variables (the checker's inputs)."""
    layer._vars.update(variables)
    return layer


def test_affine_and_layernorm_gradients():
    F, Y, N = axis(4, "F"), axis(3, "Y"), axis(2, "N", batch=True)
    rng = np.random.default_rng(4)
    assert_gradcheck(
        lambda x, W, b: _seeded(nn.Affine(Y, activation="tanh", dtype=F64), W=W, b=b)(x),
        [((N, F), rng.standard_normal((2, 4))), ((Y, F), rng.standard_normal((3, 4))),
         ((Y,), rng.standard_normal(3))])
    assert_gradcheck(
        lambda x, g, b: _seeded(nn.LayerNorm(dtype=F64), g=g, b=b)(x),
        [((N, F), rng.standard_normal((2, 4))), ((F,), rng.standard_normal(4)),
         ((F,), rng.standard_normal(4))])


@pytest.mark.parametrize("kind", ["rnn", "lstm", "gru"])
def test_recurrent_gradients(kind):
    T, F, N = axis(3, "T", recurrent=True), axis(2, "F"), axis(2, "N", batch=True)
    H = axis(3, "H")
    cls = {"rnn": nn.Recurrent, "lstm": nn.LSTM, "gru": nn.GRU}[kind]
    G = cls.gates
    name = f"g{kind}"
    gate = (axis(G, f"{name}_gate"),) if G > 1 else ()
    Hr = axis(3, f"{name}_hprev")
    rng = np.random.default_rng(5)

    def arr(*axes):
        return (axes, rng.uniform(-0.8, 0.8, tuple(a.length for a in axes)))
    inputs = [arr(N, T, F), arr(*gate, H, F), arr(*gate, H, Hr), arr(*gate, H)]
    if kind == "gru":
        inputs.append(arr(*gate, H))

    def build(x, W, U, b, bh=None):
        extra = {"bh": bh} if bh is not None else {}
        return _seeded(cls(H, dtype=F64, name=name), W=W, U=U, b=b, **extra)(x)
    assert_gradcheck(build, inputs)


# --- optimizers: the first 5 updates against NumPy references -------------------------

A_, B_ = axis(3, "A"), axis(2, "B")
W0, U0 = np.array([0.5, -1.5, 2.0]), np.array([0.3, -0.7])
SCALE = np.array([1.0, 2.0, 3.0])


def grads(w, u):
    """Gradients of ``L = sum(SCALE * w^2 / 2) + sum(sin(u))`` (``loss`` below)."""
    return [SCALE * w, np.cos(u)]


def geon_steps(opt, n=5):
    w = be.Variable(A_, initial_value=W0, dtype=F64, name="w")
    u = be.Variable(B_, initial_value=U0, dtype=F64, name="u")
    loss = (be.sum(be.Constant(SCALE, axes=A_) * be.square(be.value_of(w)) / 2, out_axes=())
            + be.sum(be.sin(be.value_of(u)), out_axes=()))
    t = be.NumPyTransformer()
    step = t.computation(opt.updates(loss, [w, u]))
    out = []
    for _ in range(n):
        step()
        out.append([t.state[w].copy(), t.state[u].copy()])
    return out


def reference(rule, n=5, clip_norm=None, wd=0.0):
    params = [W0.copy(), U0.copy()]
    state = [{}, {}]
    out = []
    for t in range(1, n + 1):
        g = grads(*params)
        if clip_norm is not None:
            norm = np.sqrt(sum(np.sum(gi ** 2) for gi in g))
            g = [gi * min(1.0, clip_norm / (norm + 1e-6)) for gi in g]
        g = [gi + wd * p for gi, p in zip(g, params)]
        params = [rule(p, gi, s, t) for p, gi, s in zip(params, g, state)]
        out.append([p.copy() for p in params])
    return out


def sgd_rule(lr, mu=0.0, nesterov=False, schedule=None):
    def rule(p, g, s, t):
        rate = schedule(t) if schedule else lr
        if not mu:
            return p - rate * g
        s["v"] = mu * s.get("v", 0.0) + g
        return p - rate * (g + mu * s["v"] if nesterov else s["v"])
    return rule


def rmsprop_rule(lr, a=0.99, eps=1e-8):
    def rule(p, g, s, t):
        s["s"] = a * s.get("s", 0.0) + (1 - a) * g * g
        return p - lr * g / (np.sqrt(s["s"]) + eps)
    return rule


def adam_rule(lr, b1=0.9, b2=0.999, eps=1e-8, decoupled=0.0):
    def rule(p, g, s, t):
        p = p * (1 - lr * decoupled)
        s["m"] = b1 * s.get("m", 0.0) + (1 - b1) * g
        s["v"] = b2 * s.get("v", 0.0) + (1 - b2) * g * g
        mh, vh = s["m"] / (1 - b1 ** t), s["v"] / (1 - b2 ** t)
        return p - lr * mh / (np.sqrt(vh) + eps)
    return rule


CASES = {
    "sgd": (lambda: nn.SGD(0.1), lambda: reference(sgd_rule(0.1))),
    "momentum": (lambda: nn.SGD(0.1, momentum=0.9), lambda: reference(sgd_rule(0.1, 0.9))),
    "nesterov": (lambda: nn.SGD(0.1, momentum=0.9, nesterov=True),
                 lambda: reference(sgd_rule(0.1, 0.9, True))),
    "weight_decay": (lambda: nn.SGD(0.1, momentum=0.5, weight_decay=0.01),
                     lambda: reference(sgd_rule(0.1, 0.5), wd=0.01)),
    "clip_norm": (lambda: nn.SGD(0.1, clip_norm=0.5),
                  lambda: reference(sgd_rule(0.1), clip_norm=0.5)),
    "exponential_decay": (lambda: nn.SGD(nn.ExponentialDecay(0.2, 0.5, 2)),
                          lambda: reference(sgd_rule(None, schedule=lambda t:
                                                     0.2 * 0.5 ** ((t - 1) / 2)))),
    "piecewise": (lambda: nn.SGD(nn.PiecewiseConstant([2, 3], [0.3, 0.1, 0.01])),
                  lambda: reference(sgd_rule(None, schedule=lambda t:
                                             0.3 if t <= 2 else 0.1 if t <= 3 else 0.01))),
    "rmsprop": (lambda: nn.RMSProp(0.01), lambda: reference(rmsprop_rule(0.01))),
    "adam": (lambda: nn.Adam(0.05), lambda: reference(adam_rule(0.05))),
    "adam_clip": (lambda: nn.Adam(0.05, clip_norm=1.0),
                  lambda: reference(adam_rule(0.05), clip_norm=1.0)),
    "adamw": (lambda: nn.AdamW(0.05, weight_decay=0.1),
              lambda: reference(adam_rule(0.05, decoupled=0.1))),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_optimizer_first_updates_match_reference(case):
    make, ref = CASES[case]
    got, want = geon_steps(make()), ref()
    for k, (g, r) in enumerate(zip(got, want)):
        for a, b in zip(g, r):
            assert np.allclose(a, b, rtol=1e-12, atol=1e-12), (case, k, a, b)
    # The updates change the parameters (the comparison is not vacuous).
    assert not np.allclose(got[0][0], W0)


def test_optimizer_state_is_named_variables():
    opt = nn.Adam(0.1, name="opt")
    geon_steps(opt, 1)
    assert [v.name for v in opt.variables] == ["opt/step", "opt/w/m", "opt/w/v",
                                               "opt/u/m", "opt/u/v"]
    assert all(not v.trainable and v.persistent for v in opt.variables)
