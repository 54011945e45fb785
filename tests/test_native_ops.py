"""The ops of geon's native runtime beyond the elementwise core, against the "numpy"
backend: the schema op of sigmoid cross-entropy (and the softmax path, which lowers to
the core), Take / PutAdd / PrefixSum / SortPrim, and the convolution and max-pooling
primitives, forward and in training steps; indices out of range at run time."""

import argparse
import json

import numpy as np
import pytest

import geon as be
from geon.op_graph import conv_prims as cp
from geon.transformers import backends as bk
from geon.transformers import native

from test_native_runtime import MISSING, _same, kernel_plans, runtime  # noqa: F401

pytestmark = pytest.mark.skipif(bool(MISSING), reason="building the native runtime needs "
                                                      f"{' and '.join(MISSING)}")
DTYPES = [np.float64, np.float32]


def _ops(doc):
    return {r["op"] for r in json.loads(doc)["graph"]["ops"]}


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_losses_and_their_training_steps(runtime, dtype):
    N, Y = be.Axis(6, "OpN"), be.Axis(4, "OpY")
    x = be.placeholder([N, Y], dtype=dtype, name="x")
    t = be.placeholder([N, Y], dtype=dtype, name="t")
    rng = np.random.default_rng(3)
    w = be.Variable(axes=[Y], initial_value=rng.normal(size=4), dtype=dtype, name="w")
    multi = be.sum(be.cross_entropy_multi(be.softmax(x * w, Y), t), out_axes=())
    binary = be.sum(be.cross_entropy_binary(be.sigmoid(x * w + 1.0), t), out_axes=())
    loss = multi + binary
    update = be.SetItem(w, w - 0.05 * be.deriv(loss, w))
    doc = bk.plan([multi, binary, be.deriv(binary, x), update], x, t)
    assert "SigmoidCrossEntropy" in _ops(doc)
    X = rng.normal(size=(6, 4)).astype(dtype) * 3
    X[0, :2] = [60.0, -60.0]                          # saturated logits stay finite
    T = rng.uniform(size=(6, 4)).astype(dtype)
    T[1] = [0.0, 1.0, 0.0, 1.0]
    _same(doc, [X, T], runtime, steps=3, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gather_scatter_cumsum_and_sort(runtime, dtype):
    V, D, M = be.Axis(7, "OpV"), be.Axis(3, "OpD"), be.Axis(5, "OpM")
    rng = np.random.default_rng(4)
    table = be.Variable(axes=[V, D], initial_value=rng.normal(size=(7, 3)), dtype=dtype)
    ids = be.placeholder([M], dtype=np.int64, name="ids")
    x = be.placeholder([M, D], dtype=dtype, name="x")
    rows = be.gather(table, ids, V)
    loss = be.sum(rows * x, out_axes=())
    grad = be.deriv(loss, table)
    update = be.SetItem(table, table - 0.1 * grad)
    outs = [rows, grad, be.cumsum(x, M), be.sort(x, M), be.cumsum(x * 2.0, D), update]
    doc = bk.plan(outs, ids, x)
    assert {"Take", "PutAdd", "PrefixSum", "SortPrim"} <= _ops(doc)
    X = rng.normal(size=(5, 3)).astype(dtype)
    X[1, 0] = X[3, 0]                                 # a tie: the sort is stable
    _same(doc, [np.array([2, -1, 2, 0, 6]), X], runtime, steps=3, dtype=dtype)
    X[2, 2] = X[4, 1] = np.nan                        # sorted last, in their order
    outs = [*be.sort_with_indices(x, M), *be.sort_with_indices(x, D, descending=True),
            be.cumsum(x, M)]
    _same(bk.plan(outs, x), [X], runtime, dtype=dtype)


def test_an_index_out_of_range_is_an_error_at_run_time(runtime):
    V, D, M = be.Axis(4, "OpV2"), be.Axis(2, "OpD2"), be.Axis(3, "OpM2")
    table = be.Variable(axes=[V, D], initial_value=np.ones((4, 2)), dtype=np.float64)
    ids = be.placeholder([M], dtype=np.int32, name="ids")
    rows = be.gather(table, ids, V)
    grad = be.deriv(be.sum(rows, out_axes=()), table)
    for out in (rows, grad):
        ex = runtime.load(bk.plan(out, ids))
        ex.run(np.array([0, -4, 3], np.int32))
        for bad in (4, -5):
            with pytest.raises(native.NativeBackendError, match=f"index {bad} is out of range "
                                                                "for an axis of length 4") as e:
                ex.run(np.array([0, bad, 1], np.int32))
            assert e.value.status == 3
        ex.run(np.array([1, 1, 1], np.int32))         # the instance still runs


def _conv_net(dtype, groups=1, strides=1, padding=1, dilation=1, pool_pad=0):
    Nb, C, H, W = be.Axis(3, "OpB"), be.Axis(4, "OpC"), be.Axis(7, "OpH"), be.Axis(6, "OpW")
    K, R, S = be.Axis(6, "OpK"), be.Axis(3, "OpR"), be.Axis(2, "OpS")
    Cg = be.Axis(4 // groups, "OpCg")
    Yc = be.Axis(5, "OpYc")
    rng = np.random.default_rng(5)
    x = be.placeholder([Nb, C, H, W], dtype=dtype, name="x")
    t = be.placeholder([Nb, Yc], dtype=dtype, name="t")
    w = be.Variable(axes=[K, Cg, R, S], initial_value=rng.normal(size=(6, 4 // groups, 3, 2)) * 0.4,
                    dtype=dtype, name="w")
    y = be.conv(x, w, C, [H, W], K, kernel=[R, S], filter_channel=Cg, strides=strides,
                padding=padding, dilation=dilation, groups=groups)
    h = be.maximum(y, 0.0)
    p = be.max_pool(h, h.axes[-2:], 2, strides=[2, 1], padding=pool_pad)
    feats = p.axes - Nb
    w2 = be.Variable(axes=[Yc] + list(feats),
                     initial_value=rng.normal(size=(5,) + tuple(feats.lengths)) * 0.2,
                     dtype=dtype, name="w2")
    logits = be.dot(p, w2)
    loss = be.mean(be.cross_entropy_multi(be.softmax(logits, Yc), t), out_axes=())
    ups = [be.SetItem(v, v - 0.1 * be.deriv(loss, v)) for v in (w, w2)]
    X = rng.normal(size=(3, 4, 7, 6)).astype(dtype)
    T = np.eye(5, dtype=dtype)[[1, 3, 0]]
    return [loss, y, p, be.deriv(loss, x)] + ups, x, t, X, T


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kw", [dict(), dict(groups=2, strides=[2, 1], padding=[(0, 2), (1, 0)]),
                                dict(dilation=[2, 1], padding=0, pool_pad=1)],
                         ids=["plain", "groups-strides-pads", "dilation-pool-pad"])
def test_a_convolutional_net_trains_in_place(runtime, dtype, kw):
    outs, x, t, X, T = _conv_net(dtype, **kw)
    doc = bk.plan(outs, x, t)
    assert {"Conv", "ConvGradData", "ConvGradFilter", "MaxPool", "MaxPoolGrad"} <= _ops(doc)
    _same(doc, [X, T], runtime, steps=3, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_six_primitives_one_by_one(runtime, dtype):
    """Each primitive on its canonical layout, 2-D and 1-D, including
    MaxPoolGather (what the pooling's second derivative reads)."""
    rng = np.random.default_rng(6)
    A = [be.Axis(n, f"OpP{i}") for i, n in enumerate((2, 4, 6, 5, 6, 2, 3, 2, 3, 4, 3))]
    B, C, H, W, K, Cg, R, S = A[:8]
    x = be.placeholder([B, C, H, W], dtype=dtype, name="x")
    w = be.placeholder([K, Cg, R, S], dtype=dtype, name="w")
    prm = dict(strides=(1, 2), pads=((1, 1), (0, 1)), dilation=(2, 1), groups=2)
    P, Q = be.Axis(4, "OpPP"), be.Axis(3, "OpPQ")
    y = cp.Conv(x, w, axes=[B, K, P, Q], **prm)
    dy = be.placeholder([B, K, P, Q], dtype=dtype, name="dy")
    gd = cp.ConvGradData(dy, w, axes=x.axes, **prm)
    gf = cp.ConvGradFilter(x, dy, axes=w.axes, **prm)
    pool = dict(kernel=(3, 2), strides=(2, 2), pads=((1, 1), (0, 1)), dilation=(1, 2))
    Pp, Qp = be.Axis(3, "OpQP"), be.Axis(2, "OpQQ")
    mp = cp.MaxPool(x, axes=[B, C, Pp, Qp], **pool)
    e = be.placeholder([B, C, Pp, Qp], dtype=dtype, name="e")
    mg = cp.MaxPoolGrad(x, e, axes=x.axes, **pool)
    mga = cp.MaxPoolGather(x, x * 3.0 - 1.0, axes=[B, C, Pp, Qp], **pool)
    L1, Pl = be.Axis(9, "OpL1"), be.Axis(4, "OpPl")
    z = be.placeholder([B, C, L1], dtype=dtype, name="z")
    mp1 = cp.MaxPool(z, axes=[B, C, Pl], kernel=(3,), strides=(2,), pads=((0, 0),),
                     dilation=(1,))
    Wk, Kl = be.Axis(3, "OpWk"), be.Axis(3, "OpKl")
    w1 = be.placeholder([Wk, C, Kl], dtype=dtype, name="w1")
    c1 = cp.Conv(z, w1, axes=[B, Wk, be.Axis(7, "OpC1")], strides=(1,), pads=((0, 0),),
                 dilation=(1,), groups=1)
    doc = bk.plan([y, gd, gf, mp, mg, mga, mp1, c1], x, w, dy, e, z, w1)
    feeds = [rng.normal(size=s).astype(dtype) for s in
             [(2, 4, 6, 5), (6, 2, 3, 2), (2, 6, 4, 3), (2, 4, 3, 2), (2, 4, 9), (3, 4, 3)]]
    feeds[0][0, 0, :2, :2] = 1.0                      # ties: the first maximum wins
    feeds[0][1, 2, 3, 3] = np.nan                     # a NaN is every window's maximum
    _same(doc, feeds, runtime, dtype=dtype)


def test_the_digits_cnn_inference_plan_runs(runtime):
    from geon.examples import digits, digits_cnn
    args = argparse.Namespace(channels=4, seed=0, lr=1e-3, batch_size=8, transformer="numpy",
                              data_parallel=False)
    model = digits_cnn.build_model(args)
    doc = digits.inference_plan(model, 8)
    assert {"Conv", "MaxPool"} <= _ops(doc)
    X = np.random.default_rng(7).uniform(0, 16, size=(8, 1, 8, 8)).astype(np.float32)
    _same(doc, [X], runtime, dtype=np.float32)


def test_the_kernel_plans_of_the_asan_run(runtime):
    """The plans the sanitizer run executes (kernel_plans) give the NumPy backend's
    values here, and an index out of range its error."""
    for doc, feeds, error in kernel_plans():
        if error:
            with pytest.raises(native.NativeBackendError, match="out of range"):
                runtime.load(doc).run(*feeds)
        else:
            _same(doc, feeds, runtime, dtype=feeds[0].dtype.type)
