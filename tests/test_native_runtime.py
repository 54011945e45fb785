"""geon's native runtime (native/, libgeon_native) against the "numpy" backend: plans
of elementwise chains, views, reductions, products and an MLP training step, and
hostile documents that must give an error code, never a crash (also run against a
build with -fsanitize=address,undefined when the ASan runtime can be preloaded)."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import geon as be
from geon.transformers import backends as bk
from geon.transformers import native
from geon.transformers.native.build import build_runtime

CC = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
MISSING = [t for t, p in (("cmake", shutil.which("cmake")), ("a C compiler", CC)) if not p]
pytestmark = pytest.mark.skipif(bool(MISSING), reason=f"building the native runtime needs "
                                                      f"{' and '.join(MISSING)}")
TOL = {np.float64: 1e-12, np.float32: 1e-5}


@pytest.fixture(scope="session")
def runtime(tmp_path_factory):
    return native.load_backend(build_runtime(str(tmp_path_factory.mktemp("rt"))))


def _same(doc, feeds, rt, steps=1, dtype=np.float64):
    ref, got = bk.backend("numpy").load(doc), rt.load(doc)
    for _ in range(steps):
        for r, g in zip(ref.run(*feeds), got.run(*feeds)):
            assert g.shape == r.shape and g.dtype == r.dtype
            scale = max(1.0, float(np.max(np.abs(r)))) if r.size else 1.0
            np.testing.assert_allclose(g, r, rtol=TOL[dtype], atol=TOL[dtype] * scale)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_elementwise_chains_views_and_reductions(runtime, dtype):
    A, B, C = be.Axis(5, "RtA"), be.Axis(6, "RtB"), be.Axis(4, "RtC")
    x = be.placeholder([A, B], dtype=dtype)
    v = be.placeholder([B], dtype=dtype)
    y = be.slice_along_axis(be.slice_along_axis(x, A, slice(1, 4)), B, slice(None, None, 2))
    z = be.exp(y) * 2.0
    outs = [be.tanh(x + v) / (1.0 + be.square(v)), be.sum(z, out_axes=[y.axes[1]]),
            be.max(x, reduction_axes=[A]), be.min(x * v, reduction_axes=[B]),
            be.sigmoid(x) ** 2.0, be.maximum(x, 0.25) - be.minimum(v, 0.0),
            be.sqrt(be.absolute(x)) + be.reciprocal(1.5 + be.square(x)), be.log(1.0 + be.exp(v)),
            be.slice_along_axis(x, A, 2), be.greater(x, v) * x, be.negative(be.prod(
                be.slice_along_axis(x, B, slice(0, 3)), reduction_axes=[A])),
            be.argmax(x, reduction_axes=[B])]
    rng = np.random.default_rng(1)
    _same(bk.plan(outs, x, v), [rng.normal(size=(5, 6)).astype(dtype),
                                rng.normal(size=6).astype(dtype)], runtime, dtype=dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gemm_2d_batched_and_transposed(runtime, dtype):
    N, K, M, Bt = be.Axis(3, "RtN"), be.Axis(5, "RtK"), be.Axis(4, "RtM"), be.Axis(2, "RtBt")
    a = be.placeholder([N, K], dtype=dtype)
    b = be.placeholder([M, K], dtype=dtype)
    c = be.placeholder([Bt, N, K], dtype=dtype)
    d = be.placeholder([Bt, K, M], dtype=dtype)
    outs = [be.dot(a, b), be.dot(b, a), be.dot(c, d), be.dot(c, b)]
    rng = np.random.default_rng(2)
    feeds = [rng.normal(size=s).astype(dtype) for s in [(3, 5), (4, 5), (2, 3, 5), (2, 5, 4)]]
    doc = bk.plan(outs, a, b, c, d)
    assert "Gemm" in {r["op"] for r in json.loads(doc)["graph"]["ops"]}
    _same(doc, feeds, runtime, dtype=dtype)


def _mlp(dtype, n=8, f=6, h=5, y=4, lr=0.1):
    N, F, H, Y = (be.Axis(k, f"Rt{s}") for k, s in ((n, "N"), (f, "F"), (h, "H"), (y, "Y")))
    x = be.placeholder([N, F], dtype=dtype, name="x")
    t = be.placeholder([N], dtype=np.int64, name="t")
    rng = np.random.default_rng(0)
    W1 = be.Variable(axes=[H, F], initial_value=rng.normal(size=(h, f)) * 0.3, dtype=dtype)
    b1 = be.Variable(axes=[H], initial_value=0.0, dtype=dtype)
    W2 = be.Variable(axes=[Y, H], initial_value=rng.normal(size=(y, h)) * 0.3, dtype=dtype)
    b2 = be.Variable(axes=[Y], initial_value=0.0, dtype=dtype)
    out = be.dot(W2, be.tanh(be.dot(W1, x) + b1)) + b2
    nll = -be.sum(be.log_softmax(out, Y) * be.one_hot(t, Y), reduction_axes=Y)
    loss = be.mean(nll, out_axes=())
    ups = [be.SetItem(w, w - lr * be.deriv(loss, w)) for w in (W1, b1, W2, b2)]
    return bk.plan([loss, out] + ups, x, t), rng.normal(size=(n, f)).astype(dtype), \
        rng.integers(0, y, size=n)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_an_mlp_trains_in_place(runtime, dtype):
    doc, X, T = _mlp(dtype)
    assert "Assign" in {r["op"] for r in json.loads(doc)["graph"]["ops"]}
    _same(doc, [X, T], runtime, steps=5, dtype=dtype)
    ex = runtime.load(doc)
    losses = [float(ex.run(X, T)[0]) for _ in range(5)]
    assert losses == sorted(losses, reverse=True)    # the Variables are the instance's


# --- hostile plans --------------------------------------------------------------------

def _raw_create(rt, data):
    """geon_backend_create straight on bytes (the adapter checks documents in Python
    first): (status, message)."""
    import ctypes
    handle, err = ctypes.c_void_p(), ctypes.create_string_buffer(4096)
    status = rt.lib.geon_backend_create(data, len(data), ctypes.byref(handle), err, 4096)
    if handle:
        rt.lib.geon_backend_destroy(handle)
    return status, err.value.decode()


def hostile_cases():
    """(name, document bytes, expected status)."""
    doc, _, _ = _mlp(np.float64)
    plan = json.loads(doc)
    ops = plan["graph"]["ops"]

    def edit(fn):
        p = json.loads(doc)
        fn(p)
        return json.dumps(p).encode()

    def set_op(i, **kw):
        return lambda p: p["graph"]["ops"][i].update(kw)
    first_gemm = next(i for i, r in enumerate(ops) if r["op"] == "Gemm")
    cases = [("empty", b"", 1), ("truncated", doc.encode()[: len(doc) // 2], 1),
             ("not an object", b"[1, 2]", 1), ("trailing comma", b'{"a": 1,}', 1),
             ("nan", b'{"format": NaN}', 1), ("bad utf8", b'{"format": "\xff"}', 1),
             ("control char", b'{"format": "a\x01"}', 1),
             ("deep", b"[" * 100000 + b"]" * 100000, 1),
             ("deep objects", b'{"a":' * 5000 + b"1" + b"}" * 5000, 1),
             ("format", edit(lambda p: p.update(format="other")), 1),
             ("version", edit(lambda p: p.update(version=2)), 1),
             ("version type", edit(lambda p: p.update(version="1")), 1),
             ("ops type", edit(lambda p: p["graph"].update(ops={})), 1),
             ("unknown op", edit(set_op(first_gemm, op="NoSuchOp")), 2),
             ("known op, wrong args", edit(set_op(first_gemm, op="Conv")), 1),
             ("dangling arg", edit(set_op(first_gemm, args=[[10 ** 6, 0], [0, 0]])), 1),
             ("forward arg", edit(set_op(first_gemm, args=[[first_gemm, 0], [0, 0]])), 1),
             ("negative arg", edit(set_op(first_gemm, args=[[-1, 0], [0, 0]])), 1),
             ("arg index", edit(set_op(first_gemm, args=[[0, 5], [0, 0]])), 1),
             ("arg type", edit(set_op(first_gemm, args=[["0", 0], [0, 0]])), 1),
             ("huge shape", edit(lambda p: p["graph"]["axes"].update(
                 {k: {"length": 2 ** 62} for k in p["graph"]["axes"] if "parts" not in
                  p["graph"]["axes"][k]})), 1),
             ("big buffers", edit(lambda p: p["graph"]["axes"].update(
                 {k: {"length": 2 ** 19} for k in p["graph"]["axes"] if "parts" not in
                  p["graph"]["axes"][k]})), 1),
             ("unknown axis", edit(lambda p: p["graph"].update(axes={})), 1),
             ("unknown dtype", edit(lambda p: ops and p["graph"]["ops"][first_gemm][
                 "outputs"][0].update(dtype="complex64")), 2),
             ("wrong dtype type", edit(lambda p: p["graph"]["ops"][first_gemm][
                 "outputs"][0].update(dtype=7)), 1),
             ("bad base64", doc.replace('"data":"', '"data":"!!!!').encode(), 1),
             ("bad results", edit(lambda p: p["graph"].update(results=[[0]])), 1),
             ("wrong output shape", edit(lambda p: p["outputs"][0].update(shape=[3])), 1),
             ("ids", edit(set_op(0, id=5)), 1)]
    return cases + new_op_hostile_cases()


def kernel_plans():
    """(document, feeds, whether running it is an error): small plans of the ops along
    dimension 1, convolution and pooling (for the sanitizer run)."""
    from geon.op_graph import conv_prims as cp
    rng = np.random.default_rng(9)
    B, C, H, W = (be.Axis(n, f"RtK{s}") for n, s in ((2, "B"), (2, "C"), (5, "H"), (4, "W")))
    K, R, S, P, Q = (be.Axis(n, f"RtK{s}") for n, s in ((3, "K"), (2, "R"), (3, "S"), (3, "P"),
                                                          (2, "Q")))
    x = be.placeholder([B, C, H, W], dtype=np.float64)
    w = be.placeholder([K, C, R, S], dtype=np.float64)
    dy = be.placeholder([B, K, P, Q], dtype=np.float64)
    prm = dict(strides=(2, 1), pads=((1, 1), (0, 0)), dilation=(1, 1), groups=1)
    pool = dict(kernel=(2, 2), strides=(2, 2), pads=((0, 1), (1, 0)), dilation=(1, 1))
    Pp, Qp = be.Axis(3, "RtKPp"), be.Axis(2, "RtKQp")
    e = be.placeholder([B, C, Pp, Qp], dtype=np.float64)
    outs = [cp.Conv(x, w, axes=[B, K, P, Q], **prm), cp.ConvGradData(dy, w, axes=x.axes, **prm),
            cp.ConvGradFilter(x, dy, axes=w.axes, **prm),
            cp.MaxPool(x, axes=[B, C, Pp, Qp], **pool), cp.MaxPoolGrad(x, e, axes=x.axes, **pool),
            cp.MaxPoolGather(x, x * 2.0, axes=[B, C, Pp, Qp], **pool)]
    feeds = [rng.normal(size=s) for s in [(2, 2, 5, 4), (3, 2, 2, 3), (2, 3, 3, 2), (2, 2, 3, 2)]]
    plans = [(bk.plan(outs, x, w, dy, e), feeds, False)]
    V, D, M = be.Axis(6, "RtKV"), be.Axis(3, "RtKD"), be.Axis(4, "RtKM")
    table = be.placeholder([V, D], dtype=np.float32)
    ids = be.placeholder([M], dtype=np.int64)
    rows = be.gather(table, ids, V)
    gathered = bk.plan([rows, be.deriv(be.sum(rows * rows, out_axes=()), table),
                        be.cumsum(table, V), be.sort(table, V)], table, ids)
    tab = rng.normal(size=(6, 3)).astype(np.float32)
    plans += [(gathered, [tab, np.array([0, 5, -6, 2])], False),
              (gathered, [tab, np.array([0, 6, 1, 2])], True)]
    plans.append((random_plan(), [np.ones((3, 5))], False))
    return plans


def random_plan():
    """A plan of geon's Random primitive: uniform and normal draws of both float
    dtypes, odd sizes, the largest seed and stream, used by a dropout mask."""
    from geon.op_graph import random as rnd
    A, B, C = be.Axis(3, "RtRA"), be.Axis(5, "RtRB"), be.Axis(7, "RtRC")
    x = be.placeholder([A, B], dtype=np.float64)
    outs = [rnd.random([A, B, C], d, 2 ** 64 - 1, 2 ** 32 - 1, t)
            for d in ("uniform", "normal") for t in (np.float32, np.float64)]
    return bk.plan(outs + [rnd.random([C], "normal", 5, 9, np.float32),
                           be.dropout(x, 0.5, seed=1)], x)


def new_op_hostile_cases():
    """Hostile edits of the new ops' parameters, shapes and dtypes."""
    plans = kernel_plans()
    doc, gdoc = plans[0][0], plans[1][0]
    cases = []

    def first(d, name):
        return next(i for i, r in enumerate(json.loads(d)["graph"]["ops"]) if r["op"] == name)

    def edit(d, name, fn):
        p = json.loads(d)
        fn(p["graph"]["ops"][first(d, name)])
        return json.dumps(p).encode()

    def attr(**kw):
        return lambda r: r["attrs"].update(kw)

    def tup(*v):
        return {"tuple": list(v)}
    pair = tup(tup(0, 0), tup(0, 0))
    ids = json.loads(gdoc)["graph"]["ops"][first(gdoc, "Take")]["args"][1]  # 1-D int64
    for name in ("Conv", "ConvGradData", "ConvGradFilter"):
        cases += [(f"{name} stride 0", edit(doc, name, attr(strides=tup(0, 1))), 1),
                  (f"{name} strides count", edit(doc, name, attr(strides=tup(1))), 1),
                  (f"{name} strides type", edit(doc, name, attr(strides=[1, 1])), 1),
                  (f"{name} negative pad", edit(doc, name, attr(pads=tup(tup(-1, 0), tup(0, 0)))), 1),
                  (f"{name} huge pad", edit(doc, name, attr(pads=tup(tup(2 ** 62, 0), tup(0, 0)))), 1),
                  (f"{name} pads shape", edit(doc, name, attr(pads=tup(tup(1, 1, 1), tup(0, 0)))), 1),
                  (f"{name} huge dilation", edit(doc, name, attr(dilation=tup(2 ** 40, 1))), 1),
                  (f"{name} groups 0", edit(doc, name, attr(groups=0)), 1),
                  (f"{name} groups 2", edit(doc, name, attr(groups=2)), 1),
                  (f"{name} groups huge", edit(doc, name, attr(groups=2 ** 62)), 1),
                  (f"{name} no groups", edit(doc, name, lambda r: r["attrs"].pop("groups")), 1),
                  (f"{name} wrong window", edit(doc, name, attr(pads=pair)), 1),
                  (f"{name} int dtype", edit(doc, name, lambda r: r["outputs"][0].update(
                      dtype="int32")), 2),
                  (f"{name} swapped args", edit(doc, name, lambda r: r.update(
                      args=r["args"][::-1])), 1),
                  (f"{name} one arg", edit(doc, name, lambda r: r.update(args=r["args"][:1])), 1)]
    for name in ("MaxPool", "MaxPoolGrad", "MaxPoolGather"):
        cases += [(f"{name} kernel 0", edit(doc, name, attr(kernel=tup(0, 2))), 1),
                  (f"{name} kernel huge", edit(doc, name, attr(kernel=tup(2 ** 40, 2))), 1),
                  (f"{name} 3-d kernel", edit(doc, name, attr(kernel=tup(2, 2, 2))), 2),
                  (f"{name} kernel type", edit(doc, name, attr(kernel=2)), 1),
                  (f"{name} stride 0", edit(doc, name, attr(strides=tup(2, 0))), 1),
                  (f"{name} pad-only window", edit(doc, name, attr(
                      pads=tup(tup(0, 3), tup(1, 0)), kernel=tup(1, 2))), 1),
                  (f"{name} wrong window", edit(doc, name, attr(pads=pair)), 1),
                  (f"{name} wrong dtype", edit(doc, name, lambda r: r["outputs"][0].update(
                      dtype="float32")), 1)]
    for name in ("Take", "PutAdd"):
        cases += [(f"{name} float indices", edit(gdoc, name, lambda r: r.update(
                      args=[r["args"][0], r["args"][0]])), 1),
                  (f"{name} wrong shape", edit(gdoc, name, lambda r: r["outputs"][0].update(
                      axes=r["outputs"][0]["axes"][::-1])), 1),
                  (f"{name} wrong dtype", edit(gdoc, name, lambda r: r["outputs"][0].update(
                      dtype="float64")), 1),
                  (f"{name} 1-d operand", edit(gdoc, name, lambda r: r.update(
                      args=[r["args"][1], r["args"][1]])), 1),
                  (f"{name} 2-d indices", edit(gdoc, name, lambda r: r.update(
                      args=[r["args"][0], r["args"][0]])), 1)]
    cases += [("PrefixSum wrong dtype", edit(gdoc, "PrefixSum", lambda r: r["outputs"][0].update(
                   dtype="int32")), 1),
              ("SortPrim positions float", edit(gdoc, "SortPrim", lambda r: r["outputs"][1].update(
                   dtype="float32")), 1),
              ("PrefixSum of 1-d", edit(gdoc, "PrefixSum", lambda r: r.update(args=[ids])), 1),
              ("SortPrim one output", edit(gdoc, "SortPrim", lambda r: r.update(
                   outputs=r["outputs"][:1])), 1)]
    rdoc = plans[-1][0]
    counter = json.loads(rdoc)["graph"]["ops"][first(rdoc, "Random")]["args"][0]
    cases += [(f"Random {what}", edit(rdoc, "Random", fn), status) for what, fn, status in [
        ("distribution", attr(distribution="poisson"), 1),
        ("distribution type", attr(distribution=1), 1),
        ("no distribution", lambda r: r["attrs"].pop("distribution"), 1),
        ("no seed", lambda r: r["attrs"].pop("seed"), 1),
        ("negative seed", attr(seed=-1), 1),
        ("seed 2**64", attr(seed=2 ** 64), 1),
        ("huge seed", attr(seed=10 ** 40), 1),
        ("float seed", attr(seed=1.5), 1),
        ("seed string", attr(seed="1"), 1),
        ("stream 2**32", attr(stream=2 ** 32), 1),
        ("negative stream", attr(stream=-1), 1),
        ("no stream", lambda r: r["attrs"].pop("stream"), 1),
        ("no attrs", lambda r: r.pop("attrs"), 1),
        ("attrs list", lambda r: r.update(attrs=[1]), 1),
        ("int32 result", lambda r: r["outputs"][0].update(dtype="int32"), 1),
        ("float16 result", lambda r: r["outputs"][0].update(dtype="float16"), 2),
        ("two outputs", lambda r: r.update(outputs=r["outputs"] * 2), 1),
        ("no arg", lambda r: r.update(args=[]), 1),
        ("two args", lambda r: r.update(args=[counter, counter]), 1)]]
    p = json.loads(rdoc)                              # a float64 step counter
    p["graph"]["ops"][counter[0]]["outputs"][0]["dtype"] = "float64"
    cases.append(("Random float counter", json.dumps(p).encode(), 1))
    return cases


@pytest.mark.parametrize("name,data,status", hostile_cases(), ids=[c[0] for c in hostile_cases()])
def test_hostile_plans_are_refused(runtime, name, data, status):
    got, message = _raw_create(runtime, data)
    assert got == status, message
    assert message


def test_unsupported_ops_are_listed_through_the_adapter(runtime):
    x = be.placeholder([be.Axis(3, "RtS"), be.Axis(4, "RtT")], dtype=np.float64)
    from geon.op_graph.collectives import AllReduce, BroadcastFrom
    with pytest.raises(native.NativeBackendError,
                       match="unsupported ops: AllReduce, BroadcastFrom") as e:
        runtime.load(bk.plan(AllReduce(x * 2.0) + BroadcastFrom(x), x))
    assert e.value.status == 2


def asan_runtime(tmp_path):
    """``(the ASan runtime to preload, a -fsanitize=address,undefined build of
    libgeon_native)``; skips where gcc has no libasan.so."""
    gcc = shutil.which("gcc")
    asan = gcc and subprocess.run([gcc, "-print-file-name=libasan.so"], capture_output=True,
                                  text=True).stdout.strip()
    if not asan or not os.path.isabs(asan):
        pytest.skip("no libasan.so to preload")
    return asan, build_runtime(str(tmp_path / "asan"), sanitize=True)


def run_under_asan(asan, script):
    """The finished subprocess running Python ``script`` with the ASan runtime
    ``asan`` preloaded (leaks not checked; UBSan halts at its first error)."""
    env = dict(os.environ, LD_PRELOAD=asan, ASAN_OPTIONS="detect_leaks=0",
               UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1")
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=600)


def test_hostile_plans_under_asan(tmp_path):
    """The hostile plans against a -fsanitize=address,undefined build, in a subprocess
    with the ASan runtime preloaded."""
    asan, lib = asan_runtime(tmp_path)
    script = (f"import sys; sys.path.insert(0, {os.path.dirname(__file__)!r})\n"
              "import test_native_runtime as t\nfrom geon.transformers import native\n"
              f"rt = native.load_backend({lib!r})\nbad = 0\n"
              "for name, data, status in t.hostile_cases():\n"
              "    got, msg = t._raw_create(rt, data)\n"
              "    if got != status: print('FAIL', name, got, msg); bad += 1\n"
              "for doc, feeds, error in t.kernel_plans():\n"
              "    ex = rt.load(doc)\n"
              "    try:\n"
              "        ex.run(*feeds)\n"
              "        if error: print('FAIL: no error'); bad += 1\n"
              "    except native.NativeBackendError as e:\n"
              "        if not error: print('FAIL', e); bad += 1\n"
              "print('checked', len(t.hostile_cases()))\nsys.exit(1 if bad else 0)\n")
    done = run_under_asan(asan, script)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    assert "checked" in done.stdout


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_inputs_of_any_layout_and_repeated_runs(runtime, dtype):
    """The adapter passes strided, transposed, read-only and misaligned inputs (its
    DLTensors are made once per executable); outputs are new arrays at every run."""
    A, B = be.Axis(4, "RtLa"), be.Axis(6, "RtLb")
    x = be.placeholder([A, B], dtype=dtype)
    v = be.placeholder([B], dtype=dtype)
    outs = [be.exp(x) * v - x / 3.0, be.sum(x * v, reduction_axes=[A]),
            be.max(x, reduction_axes=[B]), be.absolute(x) + be.maximum(v, 0.0)]
    doc = bk.plan(outs, x, v)
    rng = np.random.default_rng(5)
    base = rng.normal(size=(8, 12)).astype(dtype)
    ro = rng.normal(size=(4, 6)).astype(dtype)
    ro.flags.writeable = False
    raw = np.zeros(4 * 6 * np.dtype(dtype).itemsize + 1, np.uint8)
    mis = raw[1:].view(dtype).reshape(4, 6)
    mis[...] = rng.normal(size=(4, 6))
    vs = rng.normal(size=12).astype(dtype)[::2]
    for xv in (base[::2, ::2], base[:6, :4].T, ro, mis, np.ascontiguousarray(base[:4, :6])):
        _same(doc, [xv, vs], runtime, steps=2, dtype=dtype)
    ex = runtime.load(doc)
    one, two = ex.run(ro, vs), ex.run(ro, vs)
    assert not any(np.shares_memory(a, b) for a, b in zip(one, two))


def test_the_runtimes_own_openblas_follows_the_thread_policy(runtime, monkeypatch):
    """The OpenBLAS libgeon_native links (scipy-openblas32's) takes geon's thread
    count at runs, even where it was mapped before the runtime was loaded (importing
    scipy_openblas32, as build_runtime does, maps it): NumPy's own is left to NumPy's
    policy."""
    numpy_blas = "/x/site-packages/numpy.libs/libscipy_openblas64_-1.so"
    theirs = "/x/site-packages/scipy_openblas32/lib/libscipy_openblas.so"
    monkeypatch.setattr(native.np, "__file__", "/x/site-packages/numpy/__init__.py")
    assert native._own_openblas({numpy_blas}, {numpy_blas, theirs}) == {theirs}
    assert native._own_openblas({numpy_blas, theirs}, {numpy_blas, theirs}) == {theirs}
    monkeypatch.undo()
    try:
        import scipy_openblas32  # noqa: F401
    except ImportError:
        pytest.skip("scipy-openblas32 is not installed: the runtime was built with its "
                    "plain C matrix product")
    blas = runtime.blas_threads()
    assert blas is not None
    get, put = blas.api
    before = get()
    try:
        monkeypatch.setattr(native.POLICY, "refresh", lambda: 1)
        blas.apply()
        assert get() == 1
    finally:
        put(before)

