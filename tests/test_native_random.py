"""geon's random numbers (the ``Random`` primitive) in the native runtime, against the
"numpy" backend BIT FOR BIT: uniform and normal, float32 and float64, several seeds,
stream ids and step counters (up to 2**63 and past it, where the int64 counter wraps),
odd sizes and multi-dimensional shapes; then training steps with dropout (a small
convolutional net and the digits CNN) whose masks are the same bits and change from
step to step. The hostile plans of the op and its sanitizer run are in
test_native_runtime.py (new_op_hostile_cases, kernel_plans)."""

import argparse
import json

import numpy as np
import pytest

import geon as be
from geon.op_graph import random as rnd
from geon.transformers import backends as bk

from test_native_runtime import MISSING, runtime  # noqa: F401

pytestmark = pytest.mark.skipif(bool(MISSING), reason="building the native runtime needs "
                                                      f"{' and '.join(MISSING)}")
DTYPES = [np.float32, np.float64]
#: (seed, stream): zero, the largest of each, and words that differ in both halves
KEYS = [(0, 0), (2 ** 64 - 1, 2 ** 32 - 1), (123456789012345, 7), (2 ** 32, 2 ** 31 + 3)]
#: first step counter values: 0, a carry into the counter's high word, and 2**63 - 2
#: (the third step wraps to -2**63, which the draw reads as 2**63)
STARTS = [0, 2 ** 32 - 2, 2 ** 63 - 2, -3]


def _set_counters(doc, start):
    """The plan with every step counter (Variable rng_step_*) starting at start."""
    p = json.loads(doc)
    for r in p["graph"]["ops"]:
        if r["op"] == "Variable" and r["name"].startswith("rng_step"):
            r["attrs"]["initial_value"] = start
    return json.dumps(p)


def _with_outputs(doc, op_type):
    """The plan with the value of every op of op_type added to its outputs (after the
    others), so that runs return them too."""
    p = json.loads(doc)
    g = p["graph"]
    extra = [r for r in g["ops"] if r["op"] == op_type]
    n_out = len(p["outputs"])
    g["results"][n_out:n_out] = [[r["id"], 0] for r in extra]
    def length(name):
        a = g["axes"][name]
        return a["length"] if "length" in a else int(np.prod([length(q) for q in a["parts"]]))
    for r in extra:
        p["outputs"].append({"shape": [length(a) for a in r["outputs"][0]["axes"]],
                             "dtype": np.dtype(r["outputs"][0]["dtype"]).str})
    return json.dumps(p), len(extra)


def _bitwise(doc, feeds, rt, steps):
    """Run both backends steps times; assert every result is the same bits; return the
    runtime's results of each step."""
    ref, got = bk.backend("numpy").load(doc), rt.load(doc)
    runs = []
    for s in range(steps):
        R, G = ref.run(*feeds), rt_run(got, feeds)
        assert len(R) == len(G)
        for k, (r, g) in enumerate(zip(R, G)):
            assert g.shape == r.shape and g.dtype == r.dtype, (s, k)
            assert g.tobytes() == r.tobytes(), (
                f"step {s}, result {k}: {int(np.sum(g != r))} of {r.size} elements differ, "
                f"at most {np.max(np.abs(g.astype(np.float64) - r))}")
        runs.append([np.array(g, copy=True) for g in G])
    return runs


def rt_run(ex, feeds):
    return [np.array(v, copy=True) for v in ex.run(*feeds)]


@pytest.mark.parametrize("distribution", ["uniform", "normal"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_draws_are_the_numpy_backends_bit_for_bit(runtime, distribution, dtype):
    A, B, C = be.Axis(5, "RnA"), be.Axis(7, "RnB"), be.Axis(3, "RnC")
    One, Odd = be.Axis(1, "RnOne"), be.Axis(13, "RnOdd")
    shapes = [[A, B], [C, One, A], [Odd], [One], [], [C, A, B, One]]
    outs = [rnd.random(axes, distribution, seed, stream, dtype)
            for axes in shapes for seed, stream in KEYS]
    x = be.placeholder([One], dtype=dtype)
    doc = bk.plan(outs + [x * 2.0], x)
    for start in STARTS:
        runs = _bitwise(_set_counters(doc, start), [np.ones(1, dtype)], runtime, steps=3)
        big = [k for k, s in enumerate(shapes) if int(np.prod([a.length for a in s])) > 4]
        for k in big:                         # each step draws new numbers
            k0 = k * len(KEYS)
            assert not np.array_equal(runs[0][k0], runs[1][k0])
            assert not np.array_equal(runs[1][k0], runs[2][k0])
        if distribution == "uniform":
            v = np.concatenate([r.ravel() for r in runs[0][:-1]])
            assert np.all((v >= 0) & (v < 1))


def test_a_large_draw_and_its_statistics(runtime):
    """About 10**5 numbers of each kind (every block lane and both float widths), the
    same bits; their moments are those of the distributions."""
    N = be.Axis(50001, "RnBig")
    outs = [rnd.random([N], d, 99, 4, t) for d in ("uniform", "normal") for t in DTYPES]
    x = be.placeholder([be.Axis(1, "RnOne1")], dtype=np.float64)
    runs = _bitwise(bk.plan(outs + [x + 1.0], x), [np.zeros(1)], runtime, steps=2)
    for k, v in enumerate(runs[1][:4]):
        v = v.astype(np.float64)
        mean, var = (0.5, 1 / 12) if k < 2 else (0.0, 1.0)
        assert abs(v.mean() - mean) < 0.02 and abs(v.var() - var) < 0.03 * max(var, 0.1)


def test_the_composites_uniform_normal_bernoulli_and_dropout(runtime):
    """The random ops users write (scaled, shifted, compared, masked, differentiated):
    float64 results the same bits (the runtime's float64 elementwise ops are NumPy's)."""
    N, D = be.Axis(6, "RnN"), be.Axis(5, "RnD")
    x = be.placeholder([N, D], dtype=np.float64, name="x")
    y = be.dropout(x, 0.3, seed=3)
    outs = [be.uniform([N, D], low=-2.0, high=3.0, seed=11, dtype=np.float64),
            be.normal([D], mean=1.0, std=0.5, seed=11, dtype=np.float64),
            be.bernoulli(0.25, axes=[N], seed=5, dtype=np.float64), y,
            be.deriv(be.sum(y * y, out_axes=()), x)]
    X = np.random.default_rng(2).normal(size=(6, 5))
    runs = _bitwise(bk.plan(outs, x), [X], runtime, steps=3)
    masks = [r[3] != 0 for r in runs]
    assert not np.array_equal(masks[0], masks[1]) and not np.array_equal(masks[1], masks[2])


def _conv_dropout_net(dtype):
    Nb, C, H, W = be.Axis(4, "RnB"), be.Axis(2, "RnC"), be.Axis(6, "RnH"), be.Axis(5, "RnW")
    K, R, S, Yc = be.Axis(3, "RnK"), be.Axis(3, "RnR"), be.Axis(3, "RnS"), be.Axis(4, "RnY")
    rng = np.random.default_rng(6)
    x = be.placeholder([Nb, C, H, W], dtype=dtype, name="x")
    t = be.placeholder([Nb, Yc], dtype=dtype, name="t")
    w = be.Variable(axes=[K, C, R, S], initial_value=rng.normal(size=(3, 2, 3, 3)) * 0.4,
                    dtype=dtype, name="w")
    h = be.maximum(be.conv(x, w, C, [H, W], K, kernel=[R, S], padding=1), 0.0)
    d = be.dropout(h, 0.5, seed=21)
    feats = d.axes - Nb
    w2 = be.Variable(axes=[Yc] + list(feats),
                     initial_value=rng.normal(size=(4,) + tuple(feats.lengths)) * 0.2,
                     dtype=dtype, name="w2")
    loss = be.mean(be.cross_entropy_multi(be.softmax(be.dot(d, w2), Yc), t), out_axes=())
    ups = [be.SetItem(v, v - 0.1 * be.deriv(loss, v)) for v in (w, w2)]
    X = rng.normal(size=(4, 2, 6, 5)).astype(dtype)
    T = np.eye(4, dtype=dtype)[[1, 3, 0, 2]]
    return bk.plan([loss] + ups, x, t), X, T


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_conv_dropout_dense_net_trains_with_new_masks(runtime, dtype):
    doc, X, T = _conv_dropout_net(dtype)
    doc, n = _with_outputs(doc, "Random")
    assert n == 1
    ref, got = bk.backend("numpy").load(doc), runtime.load(doc)
    tol = {np.float64: 1e-12, np.float32: 1e-5}[dtype]
    masks = []
    for _ in range(3):
        R, G = ref.run(X, T), rt_run(got, [X, T])
        assert G[-1].tobytes() == R[-1].tobytes()      # the dropout's uniforms: the same bits
        masks.append(G[-1] < 0.5)
        for r, g in zip(R[:-1], G[:-1]):
            np.testing.assert_allclose(g, r, rtol=tol, atol=tol)
    assert not np.array_equal(masks[0], masks[1]) and not np.array_equal(masks[1], masks[2])


def test_the_digits_cnn_training_step_runs_with_its_dropout(runtime):
    """The digits CNN's training step (conv, batch norm, max pool, dropout, dense, Adam)
    over 3 steps: the loss and correct count of each equal the NumPy backend's, the
    dropout's uniforms are the same bits and its mask changes every step."""
    from geon.examples import digits_cnn
    args = argparse.Namespace(channels=4, seed=0, lr=1e-3, batch_size=8, transformer="numpy",
                              data_parallel=False)
    model = digits_cnn.build_model(args)
    comp = model.train_computation(8)
    doc = bk.plan(list(comp.requested), *comp.params, state=model.transformer)
    assert {"Random", "Conv", "MaxPool"} <= {r["op"] for r in json.loads(doc)["graph"]["ops"]}
    doc, n = _with_outputs(doc, "Random")
    assert n == 1
    rng = np.random.default_rng(0)
    X = rng.uniform(0, 16, size=(8, 1, 8, 8)).astype(np.float32)
    Y = rng.integers(0, 10, 8)
    ref, got = bk.backend("numpy").load(doc), runtime.load(doc)
    masks = []
    for _ in range(3):
        R, G = ref.run(X, Y), rt_run(got, [X, Y])
        assert G[-1].tobytes() == R[-1].tobytes()
        masks.append(G[-1] < 0.75)                     # kept where u < 1 - rate
        np.testing.assert_allclose(G[0], R[0], rtol=1e-5, atol=1e-5)   # the loss
        assert G[1] == R[1]                            # the correct count
    assert not np.array_equal(masks[0], masks[1]) and not np.array_equal(masks[1], masks[2])
