"""Convolution and pooling beyond the op table: random geometries (hypothesis) against
the plain-NumPy definitions of tests/op_table.py, PyTorch (CPU) as an independent
reference for values and derivatives, build-time errors, and the generated code.
"""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import geon as be
from geon.op_graph import conv as cv
from geon.op_graph import op_graph as og
from op_table import np_conv, np_conv_transpose, np_pool

QUICK = settings(max_examples=50, derandomize=True, deadline=None, database=None,
                 suppress_health_check=[HealthCheck.too_slow])


def run_np(build, arrays, grads=False):
    """Values of ``build`` on NumPy-family placeholders through the NumPy transformer
    (with the gradients of ``sum(y * r)`` for a fixed ``r`` when asked)."""
    xs = [be.np.placeholder(a.shape, dtype=a.dtype) for a in arrays]
    y = build(*xs)
    outs = [y]
    r = None
    if grads:
        r = np.random.default_rng(5).standard_normal(y.axes.shape).astype(arrays[0].dtype)
        loss = be.np.sum(y * be.np.constant(r))
        outs += be.deriv(loss, xs)
    vals = be.NumPyTransformer().computation(outs, *xs)(*arrays)
    return vals, r


# --- random geometries against the definitions ---------------------------------------------

@st.composite
def conv_geometry(draw, transpose=False):
    n = draw(st.integers(1, 3))
    groups = draw(st.integers(1, 2))
    cg, kg = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    kernel = tuple(draw(st.integers(1, 3)) for _ in range(n))
    stride = tuple(draw(st.integers(1, 3)) for _ in range(n))
    dil = tuple(draw(st.integers(1, 2)) for _ in range(n))
    pads = tuple((draw(st.integers(0, 2)), draw(st.integers(0, 2))) for _ in range(n))
    lengths = []
    for k, d, (lo, hi) in zip(kernel, dil, pads):
        need = max(1, d * (k - 1) + 1 - lo - hi, lo + 1, hi + 1) if transpose else \
            max(1, d * (k - 1) + 1 - lo - hi)
        lengths.append(draw(st.integers(need, need + 4 if n < 3 else need + 2)))
    batch = draw(st.integers(1, 2))
    return dict(n=n, groups=groups, cg=cg, kg=kg, kernel=kernel, stride=stride,
                dilation=dil, pads=pads, lengths=tuple(lengths), batch=batch)


def _grid(rng, shape):
    return rng.integers(-8, 9, size=shape) * 0.25


@QUICK
@given(conv_geometry(), st.sampled_from([np.float64, np.float32]), st.integers(0, 2**31))
def test_np_conv_random_geometry(g, dtype, seed):
    rng = np.random.default_rng(seed)
    C, K = g["cg"] * g["groups"], g["kg"] * g["groups"]
    x = _grid(rng, (g["batch"], C) + g["lengths"]).astype(dtype)
    w = _grid(rng, (K, g["cg"]) + g["kernel"]).astype(dtype)
    (y,), _ = run_np(lambda a, b: be.np.conv(a, b, stride=g["stride"], padding=g["pads"],
                                             dilation=g["dilation"], groups=g["groups"]),
                     [x, w])
    want = np_conv(x.astype(np.float64), w.astype(np.float64), g["stride"], g["pads"],
                   g["dilation"], g["groups"])
    assert y.dtype == dtype and y.shape == want.shape
    np.testing.assert_array_equal(y, want)  # quarters: exact sums


@QUICK
@given(conv_geometry(transpose=True), st.integers(0, 2**31))
def test_np_conv_transpose_random_geometry(g, seed):
    rng = np.random.default_rng(seed)
    C, K = g["cg"] * g["groups"], g["kg"] * g["groups"]
    # output_padding below the stride, padding per side as the transposed conv removes it
    opad = tuple(min(s - 1, 1) for s in g["stride"])
    x = _grid(rng, (g["batch"], C) + g["lengths"])
    w = _grid(rng, (C, g["kg"]) + g["kernel"])
    out = tuple((L - 1) * s - lo - hi + d * (k - 1) + o + 1 for L, s, (lo, hi), d, k, o in
                zip(g["lengths"], g["stride"], g["pads"], g["dilation"], g["kernel"], opad))
    if min(out) < 1:
        with pytest.raises(be.AxisMismatchError):
            be.np.conv_transpose(be.np.placeholder(x.shape), be.np.placeholder(w.shape),
                                 stride=g["stride"], padding=g["pads"], output_padding=opad,
                                 dilation=g["dilation"], groups=g["groups"])
        return
    (y,), _ = run_np(lambda a, b: be.np.conv_transpose(
        a, b, stride=g["stride"], padding=g["pads"], output_padding=opad,
        dilation=g["dilation"], groups=g["groups"]), [x, w])
    want = np_conv_transpose(x, w, g["stride"], g["pads"], g["dilation"], g["groups"], out)
    assert y.shape == (g["batch"], K) + out
    np.testing.assert_array_equal(y, want)


@QUICK
@given(conv_geometry(), st.sampled_from(["max", "avg"]), st.booleans(), st.integers(0, 2**31))
def test_np_pool_random_geometry(g, kind, include_pad, seed):
    rng = np.random.default_rng(seed)
    kernel = g["kernel"]
    pads = tuple((min(lo, (k - 1) // 2), min(hi, (k - 1) // 2))
                 for (lo, hi), k in zip(g["pads"], kernel))
    dil = g["dilation"] if kind == "max" else (1,) * g["n"]
    lengths = tuple(max(L, d * (k - 1) + 1) for L, d, k in zip(g["lengths"], dil, kernel))
    x = rng.permutation(np.prod((g["batch"], 2) + lengths)).reshape(
        (g["batch"], 2) + lengths) * 0.5
    if kind == "max":
        build = lambda a: be.np.max_pool(a, kernel, stride=g["stride"], padding=pads,  # noqa: E731
                                         dilation=dil)
    else:
        build = lambda a: be.np.avg_pool(a, kernel, stride=g["stride"], padding=pads,  # noqa: E731
                                         count_include_pad=include_pad)
    (y,), _ = run_np(build, [x])
    want = np_pool(x, kind, kernel, g["stride"], pads, dil, include_pad)
    np.testing.assert_allclose(y, want, rtol=1e-14, atol=1e-14)


@QUICK
@given(conv_geometry(), st.integers(0, 2**31))
def test_conv_derivatives_are_transposes(g, seed):
    # <conv(x, w), d> = <x, dL/dx> = <w, dL/dw> for the bilinear L = <conv(x, w), d>
    # (exact on quarters), and the derivatives match the reference evaluator.
    rng = np.random.default_rng(seed)
    C, K = g["cg"] * g["groups"], g["kg"] * g["groups"]
    x = _grid(rng, (g["batch"], C) + g["lengths"])
    w = _grid(rng, (K, g["cg"]) + g["kernel"])
    xs = [be.np.placeholder(x.shape, dtype=np.float64),
          be.np.placeholder(w.shape, dtype=np.float64)]
    y = be.np.conv(*xs, stride=g["stride"], padding=g["pads"], dilation=g["dilation"],
                   groups=g["groups"])
    d = _grid(rng, y.axes.shape)
    loss = be.np.sum(y * be.np.constant(d))
    gx, gw = be.deriv(loss, xs)
    lv, gxv, gwv = be.NumPyTransformer().computation([loss, gx, gw], *xs)(x, w)
    assert float(lv) == np.sum(gxv * x) == np.sum(gwv * w)
    ref = be.evaluate([gx, gw], feeds=dict(zip(xs, [x, w])))
    np.testing.assert_array_equal(ref[0], gxv)
    np.testing.assert_array_equal(ref[1], gwv)


# --- PyTorch as an independent reference ---------------------------------------------------

TORCH_CONV = [
    (1, dict(stride=2, padding=1)),
    (2, dict(stride=2, padding=1, dilation=2, groups=2)),
    (2, dict(stride=(1, 2), padding=(0, 2), dilation=(2, 1))),
    (2, dict(padding="same", groups=4)),
    (3, dict(stride=(1, 2, 1), padding=1, groups=2)),
]


def _torch():
    return pytest.importorskip("torch", reason="PyTorch (CPU) is the independent reference")


def _tol(dtype):
    return dict(rtol=1e-4, atol=1e-5) if dtype == np.float32 else dict(rtol=1e-11, atol=1e-11)


@pytest.mark.filterwarnings("ignore:Using padding='same'")
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("n,kw", TORCH_CONV, ids=[f"{n}d-{i}" for i, (n, _) in
                                                  enumerate(TORCH_CONV)])
def test_conv_against_torch(n, kw, dtype):
    torch = _torch()
    F = torch.nn.functional
    rng = np.random.default_rng(n)
    groups = kw.get("groups", 1)
    x = rng.standard_normal((2, 4) + (7, 5, 4)[:n]).astype(dtype)
    w = rng.standard_normal((4, 4 // groups) + (3, 2, 3)[:n]).astype(dtype)
    (y, gx, gw), r = run_np(lambda a, b: be.np.conv(a, b, **kw), [x, w], grads=True)
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    ty = getattr(F, f"conv{n}d")(tx, tw, **kw)
    (ty * torch.tensor(r)).sum().backward()
    for got, want in [(y, ty), (gx, tx.grad), (gw, tw.grad)]:
        assert got.dtype == dtype
        np.testing.assert_allclose(got, want.detach().numpy(), **_tol(dtype))


TORCH_CONV_T = [
    (1, dict(stride=2, padding=1, output_padding=1)),
    (2, dict(stride=2, padding=1, output_padding=(1, 0), dilation=(1, 2), groups=2)),
    (3, dict(stride=(2, 1, 1), padding=(1, 0, 1))),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("n,kw", TORCH_CONV_T, ids=[f"{n}d" for n, _ in TORCH_CONV_T])
def test_conv_transpose_against_torch(n, kw, dtype):
    torch = _torch()
    F = torch.nn.functional
    rng = np.random.default_rng(10 + n)
    groups = kw.get("groups", 1)
    x = rng.standard_normal((2, 4) + (7, 5, 4)[:n]).astype(dtype)
    w = rng.standard_normal((4, 6 // groups) + (3, 2, 3)[:n]).astype(dtype)
    (y, gx, gw), r = run_np(lambda a, b: be.np.conv_transpose(a, b, **kw), [x, w],
                            grads=True)
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    ty = getattr(F, f"conv_transpose{n}d")(tx, tw, **kw)
    (ty * torch.tensor(r)).sum().backward()
    for got, want in [(y, ty), (gx, tx.grad), (gw, tw.grad)]:
        np.testing.assert_allclose(got, want.detach().numpy(), **_tol(dtype))


TORCH_POOL = [
    ("max", 2, dict(kernel_size=3, stride=2, padding=1, dilation=(2, 1))),
    ("max", 2, dict(kernel_size=2)),
    ("max", 3, dict(kernel_size=(1, 1, 2))),  # windows tile the image (6 = 3 * 2)
    ("max", 1, dict(kernel_size=3, stride=1, padding=1)),
    ("max", 3, dict(kernel_size=(2, 3, 2), stride=(1, 2, 2), padding=(0, 1, 1))),
    ("avg", 2, dict(kernel_size=3, stride=2, padding=1)),
    ("avg", 2, dict(kernel_size=3, stride=2, padding=1, count_include_pad=False)),
    ("avg", 3, dict(kernel_size=2, padding=1, count_include_pad=False)),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("kind,n,kw", TORCH_POOL,
                         ids=[f"{k}{n}d-{i}" for i, (k, n, _) in enumerate(TORCH_POOL)])
def test_pool_against_torch(kind, n, kw, dtype):
    torch = _torch()
    F = torch.nn.functional
    shape = (2, 3) + (7, 5, 6)[:n]
    x = (np.random.default_rng(n).permutation(np.prod(shape)).reshape(shape) / 7.0)
    x = x.astype(dtype)
    ours = dict(kw)
    kernel = ours.pop("kernel_size")
    fn = be.np.max_pool if kind == "max" else be.np.avg_pool
    (y, gx), r = run_np(lambda a: fn(a, kernel, **ours), [x], grads=True)
    tx = torch.tensor(x, requires_grad=True)
    ty = getattr(F, f"{kind}_pool{n}d")(tx, **kw)
    (ty * torch.tensor(r)).sum().backward()
    np.testing.assert_allclose(y, ty.detach().numpy(), **_tol(dtype))
    np.testing.assert_allclose(gx, tx.grad.numpy(), **_tol(dtype))


def test_max_pool_derivative_goes_to_the_first_maximum():
    # ties: PyTorch's rule, the first maximum of each window in row-major order
    x = np.array([[[[1.0, 3.0, 3.0, 0.0], [3.0, 2.0, 0.0, 3.0]]]])
    (y, gx), r = run_np(lambda a: be.np.max_pool(a, 2), [x], grads=True)
    np.testing.assert_array_equal(y, [[[[3.0, 3.0]]]])
    want = np.zeros_like(x)
    want[0, 0, 0, 1], want[0, 0, 0, 2] = r[0, 0, 0, 0], r[0, 0, 0, 1]
    np.testing.assert_array_equal(gx, want)


@pytest.mark.parametrize("kernel,spatial", [((2, 2), (6, 8)), ((3,), (9,)),
                                            ((2, 1, 3), (4, 3, 6)), ((1, 1), (3, 3))])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_tiling_max_pool_with_ties_and_nans_equals_the_reference(kernel, spatial, dtype):
    """Windows that tile the input (kernel = stride) take their own NumPy path: many
    ties (small integers) give the reference evaluator's values; a window holding a NaN
    has a NaN maximum and passes no derivative (as the strided path)."""
    rng = np.random.default_rng(len(spatial))
    xv = rng.integers(0, 3, (2, 3) + spatial).astype(dtype)
    pooled = tuple(n // k for n, k in zip(spatial, kernel))
    dv = rng.standard_normal((2, 3) + pooled).astype(dtype)
    x = be.np.placeholder(xv.shape, dtype=dtype)
    d = be.np.placeholder(dv.shape, dtype=dtype)
    y = be.np.max_pool(x, kernel)
    f = be.NumPyTransformer().computation([y, be.deriv(y, x, error=d)], x, d)
    want = be.evaluate([y, be.deriv(y, x, error=d)], {x: xv, d: dv})
    for g, w in zip(f(xv, dv), want):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)
    xv[0, 1].flat[0] = np.nan  # the first window of (0, 1)
    vy, vg = f(xv, dv)
    assert np.isnan(vy[0, 1].flat[0]) and np.isnan(vy).sum() == 1
    window = (0, 1) + tuple(slice(0, k) for k in kernel)
    assert not vg[window].any()
    rest = np.ones(xv.shape, bool)
    rest[window] = False
    np.testing.assert_array_equal(vg[rest], want[1][rest])


# --- errors at build time ------------------------------------------------------------------

C, H, W = be.Axis(4, "C"), be.Axis(7, "H"), be.Axis(5, "W")
N, K, R, S = be.Axis(2, "N", batch=True), be.Axis(6, "K"), be.Axis(3, "R"), be.Axis(2, "S")
HERE = os.path.basename(__file__)


@pytest.mark.parametrize("w_axes,kw,words", [
    ((be.Axis(3, "C"), R, S, K), {}, ["filter channel is C:4", "has C:3"]),
    ((C, R, S, K), dict(groups=3), ["groups=3", "C:4"]),
    ((C, be.Axis(9, "R9"), S, K), {}, ["spatial axis H:7 with kernel axis R9:9"]),
    ((C, R, S, K), dict(out_spatial=(be.Axis(3, "P"), be.Axis(4, "Q"))),
     ["output axis P:3 should have length 5"]),
    ((be.Axis(2, "Cg"), R, S, K), dict(filter_channel=be.Axis(2, "Cg")),
     ["Cg:2", "C:4"]),
])
def test_conv_axis_mismatch_names_axes_and_line(w_axes, kw, words):
    x = be.placeholder((C, H, W, N))
    w = be.placeholder(w_axes)
    with pytest.raises(be.AxisMismatchError) as e:
        be.conv(x, w, channel=C, spatial=(H, W), out_channel=K, **kw)
    msg = str(e.value)
    for word in words:
        assert word in msg, msg
    assert HERE in msg and "H:7" in msg


def test_conv_missing_axes_and_bad_parameters():
    x = be.placeholder((C, H, W, N))
    with pytest.raises(be.AxisMismatchError, match="kernel axes"):
        be.conv(x, be.placeholder((C, R, S, K, be.Axis(2, "Z"))), channel=C,
                spatial=(H, W), out_channel=K)
    with pytest.raises(be.AxisMismatchError, match="spatial axis D:3 is not an axis"):
        be.conv(x, be.placeholder((C, R, S, K)), channel=C, spatial=(H, be.Axis(3, "D")),
                out_channel=K)
    with pytest.raises(ValueError, match="padding"):
        be.conv(x, be.placeholder((C, R, S, K)), channel=C, spatial=(H, W), out_channel=K,
                padding="full")
    with pytest.raises(ValueError, match="strides"):
        be.conv(x, be.placeholder((C, R, S, K)), channel=C, spatial=(H, W), out_channel=K,
                strides=0)
    with pytest.raises(be.AxisMismatchError, match="no input element"):
        be.max_pool(x, (H, W), 3, padding=3)
    with pytest.raises(be.AxisMismatchError, match=r"\(2, 3, 5, 5\) has 3 channels"):
        be.np.conv(be.np.placeholder((2, 3, 5, 5)), be.np.placeholder((4, 2, 3, 3)))
    with pytest.raises(ValueError, match="output_padding"):
        be.np.conv_transpose(be.np.placeholder((2, 3, 5, 5)), be.np.placeholder((3, 2, 3, 3)),
                             stride=2, output_padding=2)


def test_axes_family_roles_and_auto_axes():
    x = be.placeholder((N, H, C, W))
    w = be.placeholder((K, S, C, R))
    y = be.conv(x, w, channel=C, spatial=(H, W), out_channel=K, kernel=(R, S), padding=1)
    assert y.axes.names == ("N", "H_out", "K", "W_out")
    assert y.axes.lengths == (2, 7, 6, 6)
    P, Q = be.Axis(name="P"), be.Axis(name="Q")  # lengths follow from the arithmetic
    y2 = be.conv(x, w, channel=C, spatial=(H, W), out_channel=K, kernel=(R, S), strides=2,
                 out_spatial=(P, Q))
    assert (P.length, Q.length) == (3, 2) and y2.axes.names == ("N", "P", "K", "Q")
    p = be.max_pool(y2, (P, Q), 2)
    assert p.axes.names == ("N", "P_pool", "K", "Q_pool") and p.axes.lengths == (2, 1, 6, 1)
    assert be.global_avg_pool(y2, (P, Q)).axes.names == ("N", "K")


# --- lowering and generated code -----------------------------------------------------------

def test_lowered_to_conv_primitives_and_generated_calls():
    x = be.placeholder((C, H, W, N), dtype=np.float64)
    w = be.placeholder((C, R, S, K), dtype=np.float64)
    y = be.max_pool(be.conv(x, w, channel=C, spatial=(H, W), out_channel=K, padding=1),
                    (be.Axis(name="H_out"), be.Axis(name="W_out")), 2)
    loss = be.sum(y, out_axes=())
    gw = be.deriv(loss, w)
    comp = be.NumPyTransformer().computation([y, gw], x, w)
    kinds = {type(op) for op in comp.ops}
    assert {cv.Conv, cv.ConvGradFilter, cv.MaxPool, cv.MaxPoolGrad} <= kinds
    assert not kinds & {cv.Convolution, cv.Pooling}
    src = comp.source
    for fn in ("_conv_forward(", "_conv_grad_filter(", "_max_pool(", "_max_pool_grad("):
        assert fn in src, src
    rng = np.random.default_rng(0)
    X, Wt = rng.standard_normal((4, 7, 5, 2)), rng.standard_normal((4, 3, 2, 6))
    got = comp(X, Wt)
    ref = be.evaluate([y, gw], feeds={x: X, w: Wt})
    for a, b in zip(got, ref):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_transformer_without_the_primitives_names_the_op():
    class NoConv(be.NumPyTransformer):
        name = "no_conv"
        base_set = be.NumPyTransformer.base_set - cv.CONV_PRIMITIVES

    x, w = be.np.placeholder((1, 2, 5, 5)), be.np.placeholder((3, 2, 3, 3))
    with pytest.raises(be.LoweringError, match="Conv"):
        NoConv().computation(be.np.conv(x, w), x, w)


def test_primitives_check_their_shapes():
    B, Cc, Kk = be.Axis(2, "b"), be.Axis(4, "c"), be.Axis(6, "k")
    x = og.placeholder((B, Cc, be.Axis(7, "h")))
    w = og.placeholder((Kk, be.Axis(2, "cg"), be.Axis(3, "r")))
    with pytest.raises(be.AxisMismatchError, match="Conv"):
        cv.Conv(x, w, axes=(B, Kk, be.Axis(5, "p")), strides=(1,), pads=((0, 0),),
                dilation=(1,), groups=1)  # 4 channels, filter for 2 * groups=1
    y = cv.Conv(x, w, axes=(B, Kk, be.Axis(5, "p")), strides=(1,), pads=((0, 0),),
                dilation=(1,), groups=2)
    assert y.axes.lengths == (2, 6, 5)
    with pytest.raises(be.AxisMismatchError, match="give 5 outputs, not 4"):
        cv.Conv(x, w, axes=(B, Kk, be.Axis(4, "p4")), strides=(1,), pads=((0, 0),),
                dilation=(1,), groups=2)


def test_attrs_rebuild_the_op():
    x = be.placeholder((C, H, W, N))
    w = be.placeholder((C, R, S, K))
    ops = [be.conv(x, w, channel=C, spatial=(H, W), out_channel=K, strides=2, padding=1),
           be.avg_pool(x, (H, W), 3, padding=1, count_include_pad=False),
           be.conv_transpose(x, be.placeholder((C, R, S, K)), channel=C, spatial=(H, W),
                             out_channel=K, strides=2)]
    for op in ops:
        again = type(op)(*op.args, **{n: getattr(op, n) for n in op.attrs})
        assert again.axes == op.axes and again.axes.lengths == op.axes.lengths
        assert all(getattr(again, n) == getattr(op, n) for n in op.attrs)


# --- Jacobians: direction axes through the rules ---------------------------------------------

def _fd_jacobian(f, arrays, k, eps=1e-6):
    """Central differences of ``f`` (arrays -> array) with respect to ``arrays[k]``:
    shape (*f's shape, *arrays[k]'s shape)."""
    base = f(arrays)
    out = np.zeros(base.shape + arrays[k].shape)
    for j in np.ndindex(*arrays[k].shape):
        plus = [a.copy() for a in arrays]
        minus = [a.copy() for a in arrays]
        plus[k][j] += eps
        minus[k][j] -= eps
        out[(Ellipsis,) + j] = (f(plus) - f(minus)) / (2 * eps)
    return out


C2, H5, W4, N1 = be.Axis(2, "C2"), be.Axis(5, "H5"), be.Axis(4, "W4"), be.Axis(2, "N1", batch=True)
K2, R2, S2_ = be.Axis(2, "K2"), be.Axis(2, "R2"), be.Axis(2, "S2_")
JACOBIAN_GRAPHS = {
    "conv": ([(C2, H5, W4, N1), (C2, R2, S2_, K2)],
             lambda x, w: be.conv(x, w, channel=C2, spatial=(H5, W4), out_channel=K2,
                                  strides=(2, 1), padding=1, dilation=(1, 2))),
    "conv_groups": ([(N1, C2, H5, W4), (K2, be.Axis(1, "G1"), R2, S2_)],
                    lambda x, w: be.conv(x, w, channel=C2, spatial=(H5, W4), out_channel=K2,
                                         filter_channel=be.Axis(1, "G1"), kernel=(R2, S2_),
                                         groups=2)),
    "conv_transpose": ([(C2, H5, W4, N1), (C2, R2, S2_, K2)],
                       lambda x, w: be.conv_transpose(x, w, channel=C2, spatial=(H5, W4),
                                                      out_channel=K2, strides=2, padding=1)),
    "max_pool": ([(C2, H5, W4, N1)],
                 lambda x: be.max_pool(x, (H5, W4), 2, strides=1, padding=1)),
    "avg_pool": ([(C2, H5, W4, N1)],
                 lambda x: be.avg_pool(x, (H5, W4), 3, strides=2, padding=1,
                                       count_include_pad=False)),
}


@pytest.mark.parametrize("lowered", [False, True], ids=["axes", "lowered"])
@pytest.mark.parametrize("mode", ["forward", "reverse"])
@pytest.mark.parametrize("name", list(JACOBIAN_GRAPHS))
def test_jacobians_in_both_modes(name, mode, lowered):
    shapes, build = JACOBIAN_GRAPHS[name]
    rng = np.random.default_rng(3)
    arrays = [rng.permutation(np.prod([a.length for a in s])).reshape(
        [a.length for a in s]) * 0.25 - 2.0 for s in shapes]
    xs = [be.placeholder(s, dtype=np.float64) for s in shapes]
    y = build(*xs)
    if lowered:
        be.NumPyTransformer().computation(y, *xs)
        y = be.snap(y)
    comp = be.NumPyTransformer().computation(y, *xs)
    for k in range(len(xs)):
        J = be.jacobian(y, xs[k], mode=mode)
        got = be.NumPyTransformer().computation(J, *xs)(*arrays)
        want = _fd_jacobian(lambda a: comp(*a), arrays, k)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-7, atol=1e-8)


def test_cse_merges_equal_convolutions_only():
    x = be.placeholder((C, H, W, N), dtype=np.float64)
    w = be.placeholder((C, R, S, K), dtype=np.float64)

    def build(**kw):
        return be.conv(x, w, channel=C, spatial=(H, W), out_channel=K, **kw)
    ys = [build(padding=1), build(padding=1), build(padding=1, strides=(1, 2)),
          build(padding=((1, 1), (0, 2)))]
    comp = be.NumPyTransformer().computation(ys, x, w)
    assert sum(isinstance(op, cv.Conv) for op in comp.ops) == 3
    rng = np.random.default_rng(2)
    X, Wt = rng.standard_normal((4, 7, 5, 2)), rng.standard_normal((4, 3, 2, 6))
    got = comp(X, Wt)
    np.testing.assert_array_equal(got[0], got[1])
    for g, y in zip(got, ys):
        np.testing.assert_allclose(g, be.evaluate(y, feeds={x: X, w: Wt}), rtol=1e-12)
    text = be.graph_text(build(padding=((1, 1), (0, 2)), dilation=2))
    assert "pads=((1, 1), (0, 2))" in text and "dilation=(2, 2)" in text  # attributes


def test_simple_axes_images_keep_their_sample_axis():
    # a Simple-Axes image: named samples, positional (C, H, W)
    Ns = be.simple.sample_axis(2)
    x = be.simple.placeholder((4, 7, 5), Ns, dtype=np.float64)
    w = be.np.placeholder((6, 2, 3, 2), dtype=np.float64)
    y = be.np.conv(x, w, stride=2, padding=1, groups=2)
    p = be.np.max_pool(y, 2)
    g = be.np.global_avg_pool(p)
    assert y.axes.names == ("N", "-3", "-2", "-1") and y.axes.lengths == (2, 6, 4, 3)
    assert p.axes.lengths == (2, 6, 2, 1) and g.axes.names == ("N", "-1")
    rng = np.random.default_rng(4)
    X, Wt = _grid(rng, (2, 4, 7, 5)), _grid(rng, (6, 2, 3, 2))
    got = be.NumPyTransformer().computation(y, x, w)(X, Wt)
    np.testing.assert_array_equal(got, np_conv(X, Wt, (2, 2), ((1, 1), (1, 1)), (1, 1), 2))


def test_an_empty_batch():
    x = be.np.placeholder((0, 4, 7, 5), dtype=np.float64)
    w = be.np.placeholder((6, 2, 3, 2), dtype=np.float64)
    p = be.np.max_pool(be.np.conv(x, w, padding=1, groups=2), 2)
    gx, gw = be.deriv(be.np.sum(p), [x, w])
    out = be.NumPyTransformer().computation([p, gx, gw], x, w)(np.zeros((0, 4, 7, 5)),
                                                              np.ones((6, 2, 3, 2)))
    assert [o.shape for o in out] == [(0, 6, 3, 3), (0, 4, 7, 5), (6, 2, 3, 2)]
    np.testing.assert_array_equal(out[2], np.zeros((6, 2, 3, 2)))
