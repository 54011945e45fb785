"""The ops of geon's native runtime beyond the elementwise core, against the "numpy"
backend: the schema op of sigmoid cross-entropy (and the softmax path, which lowers to
the core), Take / PutAdd / PrefixSum / SortPrim, and the convolution and max-pooling
primitives, forward and in training steps; indices out of range at run time."""

import argparse
import json
import os

import numpy as np
import pytest

import geon as be
from geon.op_graph import conv_prims as cp
from geon.transformers import backends as bk
from geon.transformers import native

from test_native_runtime import (MISSING, _same, asan_runtime, kernel_plans,  # noqa: F401
                                 run_under_asan, runtime)

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


# --- the memory plan: buffers shared by lifetime, in-place ops, SGD updates in the Gemm ---

def _mlp_step(dtype, batch=6, sizes=(5, 7, 3), lr=0.1, extra=False):
    """A training step like benchmarks/native.py's (Gemm, bias, ReLU, softmax
    cross-entropy, SGD through SetItem); ``extra``: also outputs that read values the
    memory plan would otherwise reuse (a transposed hidden layer, a weight's gradient)."""
    N = be.Axis(batch, "MpN", batch=True)
    axes = [be.Axis(n, f"MpL{i}") for i, n in enumerate(sizes)]
    x = be.placeholder([axes[0], N], dtype=dtype, name="x")
    t = be.placeholder([axes[-1], N], dtype=dtype, name="t")
    rng = np.random.default_rng(11)
    h, variables, hidden = x, [], []
    for i in range(len(sizes) - 1):
        w0 = rng.standard_normal((sizes[i + 1], sizes[i])) * 0.5
        W = be.Variable(axes=[axes[i + 1], axes[i]], initial_value=w0.astype(dtype), dtype=dtype)
        b = be.Variable(axes=[axes[i + 1]], initial_value=0.1, dtype=dtype)
        variables += [W, b]
        h = be.dot(W, h) + b
        if i < len(sizes) - 2:
            h = be.maximum(h, 0.0)
            hidden.append(h)
    loss = be.sum(be.cross_entropy_multi(be.softmax(h), t), out_axes=()) / batch
    ups = [be.SetItem(v, v - lr * be.deriv(loss, v)) for v in variables]
    outs = [loss]
    if extra:
        outs += [be.axes_with_order(hidden[0], [N, hidden[0].axes[0]]) * 2.0,
                 be.deriv(loss, variables[0])]
    X = rng.standard_normal((sizes[0], batch)).astype(dtype)
    T = np.eye(sizes[-1], dtype=dtype)[rng.integers(0, sizes[-1], batch)].T.copy()
    return bk.plan(outs + ups, x, t), [X, T]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("extra", [False, True])
def test_training_steps_with_shared_buffers_and_updates_in_the_gemm(runtime, dtype, extra):
    """The weights' updates w - lr * (a @ b) accumulate into the Variables inside the
    product (with BLAS), the other values share buffers by lifetime: the losses of
    several steps (each after the previous updates) are the NumPy backend's."""
    doc, feeds = _mlp_step(dtype, extra=extra)
    _same(doc, feeds, runtime, steps=4, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_updates_that_must_not_be_done_in_the_gemm(runtime, dtype):
    """A product that reads the Variable it updates, a Variable read again between its
    gradient's product and its Assign, and one updated twice in a step: each update is
    computed as written."""
    A, B = be.Axis(4, "MpA"), be.Axis(4, "MpB")
    rng = np.random.default_rng(12)
    x = be.placeholder([A, B], dtype=dtype, name="x")
    w = be.Variable(axes=[A, B], initial_value=rng.normal(size=(4, 4)).astype(dtype) * 0.3,
                    dtype=dtype)
    v = be.Variable(axes=[A, B], initial_value=rng.normal(size=(4, 4)).astype(dtype) * 0.3,
                    dtype=dtype)
    Bw = be.Axis(4, "MpBw")
    wt = be.cast_axes(w, [B, Bw])
    own = be.SetItem(w, w - 0.1 * be.cast_axes(be.dot(w, wt), [A, B]))  # reads w itself
    g = be.dot(x, be.cast_axes(v, [B, Bw]))
    upd = be.SetItem(v, v - 0.05 * be.cast_axes(g, [A, B]))
    late = v * 3.0 + be.cast_axes(g, [A, B])           # v and g read after g's product
    outs = [be.sum(g, out_axes=()), late, own, upd]
    doc = bk.plan(outs, x)
    _same(doc, [rng.normal(size=(4, 4)).astype(dtype)], runtime, steps=3, dtype=dtype)


def _views_plan(dtype):
    """Values read element for element and through views (a transpose of the same value
    in one op, a slice read after several other ops), outputs among the intermediates,
    long chains that compute in place."""
    A, B = be.Axis(6, "MpVa"), be.Axis(6, "MpVb")
    rng = np.random.default_rng(13)
    x = be.placeholder([A, B], dtype=dtype, name="x")
    y = be.placeholder([A, B], dtype=dtype, name="y")
    p = be.exp(x * 0.5) - y                          # read later through views
    q = be.tanh(p) * p + 1.0                        # p read twice
    pt = be.cast_axes(be.axes_with_order(p, [B, A]), [A, B])
    sym = p + pt                                    # p directly and transposed: not in place
    chain = q
    for _ in range(6):
        chain = be.maximum(chain * 1.1 - 0.2, -0.5) + be.square(chain) * 0.01
    sl = be.slice_along_axis(p, A, slice(1, 5))     # a view of p, read at the end
    tail = be.sum(be.slice_along_axis(sym, A, slice(1, 5)) * sl + 2.0, out_axes=())
    outs = [chain, sym, tail, q, be.max(pt, reduction_axes=[A]), be.minimum(p, 0.0)]
    feeds = [rng.normal(size=(6, 6)).astype(dtype), rng.normal(size=(6, 6)).astype(dtype)]
    return bk.plan(outs, x, y), feeds


def _edges_plan(dtype):
    """exp of float32 (computed without libm, vectorized) over its whole range and at
    inf, -inf and NaN; maxima and minima against one number (one comparison) and
    against NaN; comparisons; maxima along a strided dimension with NaN in it."""
    A, B = be.Axis(3, "MpEa"), be.Axis(40, "MpEb")
    x = be.placeholder([A, B], dtype=dtype, name="x")
    xs = np.linspace(-110.0, 95.0, 3 * 40).reshape(3, 40)
    xs[0, :8] = [np.inf, -np.inf, np.nan, 0.0, -0.0, 88.72, -87.33, -103.97]
    xs[1, 3] = np.nan
    outs = [be.exp(x), be.maximum(x, 0.0), be.minimum(x, -1.5), be.maximum(1.0, x),
            be.minimum(2.0, x), be.maximum(x, float("nan")), be.greater(x, 0.5) * x,
            be.less_equal(x, -3.0), be.max(x, reduction_axes=[A]),
            be.min(x, reduction_axes=[A]), be.sum(x * 0.001, reduction_axes=[B])]
    return bk.plan(outs, x), [xs.astype(dtype)]


def _sums_plan(dtype):
    """Sums along rows of elementwise values (which the runtime computes in the pass of
    the op that computes the rows): of 1-D and 2-D values, along either axis, of values
    also read by later ops, sums that are outputs and sums read by later ops."""
    A, B = be.Axis(5, "MpSa"), be.Axis(9, "MpSb")
    rng = np.random.default_rng(15)
    x = be.placeholder([A, B], dtype=dtype, name="x")
    v = be.placeholder([B], dtype=dtype, name="v")
    e = be.maximum(x * 1.5 - 0.25, 0.0) * x             # read by the sums and a later op
    rows = be.sum(e, reduction_axes=[B])
    cols = be.sum(e, reduction_axes=[A])
    whole = be.sum(be.exp(v * 0.5) + 1.0, out_axes=())   # of a 1-D value
    outs = [rows * 2.0 + 1.0, cols, whole * 3.0, e + 1.0, be.sum(x * v, reduction_axes=[B])]
    feeds = [rng.normal(size=(5, 9)).astype(dtype), rng.normal(size=9).astype(dtype)]
    return bk.plan(outs, x, v), feeds


@pytest.mark.parametrize("lr, inner", [(0.0, 3), (float("inf"), 0), (float("nan"), 3)],
                         ids=["lr-0", "inner-0", "lr-nan"])
def test_updates_whose_product_blas_would_skip(runtime, lr, inner):
    """V - lr * (x @ y) is NaN where the product holds an infinity and lr is 0, or lr
    is infinite and the inner length 0 (0 * inf); BLAS skips the product for alpha 0
    and adds nothing for an empty inner length, so such updates are not done in the
    Gemm: V becomes NaN there as on the NumPy backend."""
    dtype = np.float32
    A, B, K = be.Axis(4, "BsA"), be.Axis(5, "BsB"), be.Axis(inner, f"BsK{inner}")
    x = be.placeholder([A, K], dtype=dtype, name="x")
    y = be.placeholder([K, B], dtype=dtype, name="y")
    v = be.Variable(axes=[A, B], initial_value=np.ones((4, 5)), dtype=dtype, name="v")
    doc = bk.plan([v * 1.0, be.SetItem(v, v - lr * be.dot(x, y))], x, y)
    X = np.ones((4, inner), dtype)
    X[0, :1] = np.inf
    with np.errstate(invalid="ignore"):   # (0 * inf: NaN is the point)
        ref = bk.backend("numpy").load(doc)
        ref.run(X, np.ones((inner, 5), dtype))
        assert np.isnan(ref.run(X, np.ones((inner, 5), dtype))[0]).any()   # (the case)
        _same(doc, [X, np.ones((inner, 5), dtype)], runtime, steps=2, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_sums_computed_with_the_values_they_sum(runtime, dtype):
    """_sums_plan: the same sums as the NumPy backend's, run after run."""
    doc, feeds = _sums_plan(dtype)
    _same(doc, feeds, runtime, steps=2, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_values_read_through_views_after_their_buffers_could_be_reused(runtime, dtype):
    """The memory plan keeps every value until its last reader, through views too, and
    computes in place only into values read element for element (_views_plan)."""
    doc, feeds = _views_plan(dtype)
    _same(doc, feeds, runtime, steps=2, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_float_kernels_at_their_edges(runtime, dtype):
    """The kernels' fast paths at their edges (_edges_plan)."""
    doc, feeds = _edges_plan(dtype)
    with np.errstate(all="ignore"):
        _same(doc, feeds, runtime, dtype=dtype)


def _move_op(doc, i, to):
    """The plan ``doc`` with op ``i`` moved to position ``to`` of the document order
    (which must stay an execution order); ids, args and results renumbered."""
    d = json.loads(doc)
    ops = d["graph"]["ops"]
    order = list(range(len(ops)))
    order.insert(to, order.pop(i))
    new = {old: k for k, old in enumerate(order)}
    moved = []
    for old in order:
        op = dict(ops[old], id=new[old])
        op["args"] = [[new[a], o] for a, o in op["args"]]
        assert all(a < op["id"] for a, _ in op["args"])
        moved.append(op)
    d["graph"]["ops"] = moved
    d["graph"]["results"] = [[new[r], o] for r, o in d["graph"]["results"]]
    return json.dumps(d)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_variable_read_between_its_update_product_and_its_assign(runtime, dtype):
    """An update v - lr * (x @ y) (which the runtime would do inside the product) whose
    Variable is read after the product but before the Assign, in document order, is
    computed as written: the read sees the old v."""
    A, B, K = be.Axis(4, "MpRa"), be.Axis(5, "MpRb"), be.Axis(3, "MpRk")
    rng = np.random.default_rng(14)
    x = be.placeholder([A, K], dtype=dtype, name="x")
    y = be.placeholder([K, B], dtype=dtype, name="y")
    v0 = rng.normal(size=(4, 5)).astype(dtype)
    v = be.Variable(axes=[A, B], initial_value=v0, dtype=dtype)
    doc = bk.plan([v * 3.0, be.SetItem(v, v - 0.05 * be.dot(x, y))], x, y)
    ops = json.loads(doc)["graph"]["ops"]
    kinds = [r["op"] for r in ops]
    var, gemm, assign = (kinds.index(k) for k in ("Variable", "Gemm", "Assign"))
    late = next(r["id"] for r in ops if r["op"] == "Multiply" and [var, 0] in r["args"])
    between = _move_op(doc, late, gemm + 1 if late > gemm else gemm)
    ops2 = json.loads(between)["graph"]["ops"]
    k = [r["op"] for r in ops2]
    read = next(r["id"] for r in ops2
                if r["op"] == "Multiply" and [k.index("Variable"), 0] in r["args"])
    assert k.index("Gemm") < read < k.index("Assign") and assign > gemm
    feeds = [rng.normal(size=(4, 3)).astype(dtype), rng.normal(size=(3, 5)).astype(dtype)]
    for d in (doc, between):
        _same(d, feeds, runtime, steps=3, dtype=dtype)
    np.testing.assert_allclose(runtime.load(between).run(*feeds)[0], 3.0 * v0, rtol=1e-6)


def test_the_memory_plan_under_asan(tmp_path):
    """The plans above against a -fsanitize=address,undefined build (shared buffers,
    in-place ops, updates inside the product, ops and sums in another op's pass), in a
    subprocess with ASan preloaded."""
    asan, lib = asan_runtime(tmp_path)
    script = (f"import sys; sys.path.insert(0, {os.path.dirname(__file__)!r})\n"
              "import numpy as np\nimport test_native_ops as t\n"
              "from geon.transformers import native\n"
              f"rt = native.load_backend({lib!r})\n"
              "for dt in (np.float32, np.float64):\n"
              "    for doc, feeds in (t._mlp_step(dt), t._mlp_step(dt, extra=True),\n"
              "                       t._views_plan(dt), t._edges_plan(dt), t._sums_plan(dt)):\n"
              "        ex = rt.load(doc)\n"
              "        for _ in range(2): ex.run(*feeds)\n"
              "print('ran')\n")
    done = run_under_asan(asan, script)
    assert done.returncode == 0 and "ran" in done.stdout, done.stdout + done.stderr[-4000:]
