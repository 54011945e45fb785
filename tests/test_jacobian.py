"""``be.jacobian``: axes and naming, both modes, against central differences (float64)."""

import numpy as np
import pytest

import geon as be
from geon.op_graph.jacobian import choose_mode

F64 = np.float64
C = be.Axis(3, "C")
H = be.Axis(4, "H")
K = be.Axis(2, "K")
N = be.Axis(5, "N", batch=True)
RNG = np.random.default_rng(2024)
MODES = ["forward", "reverse", None]


def fd_jacobian(fn, arrays, k, eps=1e-6):
    """Central differences of ``fn(*arrays)`` with respect to ``arrays[k]``: an array
    of shape ``out.shape + arrays[k].shape``."""
    base = arrays[k]
    out = np.asarray(fn(*arrays))
    jac = np.zeros(out.shape + base.shape)
    for j in np.ndindex(*base.shape):
        vals = list(arrays)
        plus, minus = base.copy(), base.copy()
        plus[j] += eps
        minus[j] -= eps
        vals[k] = plus
        fp = np.asarray(fn(*vals))
        vals[k] = minus
        fm = np.asarray(fn(*vals))
        jac[(Ellipsis,) + j] = (fp - fm) / (2 * eps)
    return jac


def check(build, np_fn, axes_list, k, mode, want_axes, lowered=False, tol=1e-7):
    """Jacobian of ``build`` wrt input ``k`` through the NumPy transformer and the
    reference evaluator against central differences of ``np_fn``."""
    arrays = [RNG.uniform(-1.5, 1.5, [a.length for a in axes]) for axes in axes_list]
    xs = [be.placeholder(axes, dtype=F64) for axes in axes_list]
    y = build(*xs)
    if lowered:
        be.NumPyTransformer().computation(y, *xs)
        y = be.snap(y)
    J = be.jacobian(y, xs[k], mode=mode)
    assert J.axes.names == tuple(want_axes)
    assert J.dtype == F64
    want = fd_jacobian(np_fn, arrays, k)
    got = be.NumPyTransformer().computation(J, *xs)(*arrays)
    ref = be.evaluate(J, feeds=dict(zip(xs, arrays)))
    scale = max(1.0, np.abs(want).max())
    np.testing.assert_allclose(got, want, rtol=0, atol=tol * scale)
    np.testing.assert_allclose(ref, want, rtol=0, atol=tol * scale)
    assert np.abs(want).max() > 1e-3  # not a comparison of zeros
    return got


# --- the four acceptance graphs ------------------------------------------------------------
def _mlp(w, x, b):
    return be.tanh(be.dot(w, x) + b)


def _np_mlp(w, x, b):
    return np.tanh(w @ x + b[:, None])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("k,want", [(0, "CNC'H"), (1, "CNHN'"), (2, "CNC'")])
def test_mlp_layer(mode, k, want):
    names = {"CNC'H": ("C", "N", "C'", "H"), "CNHN'": ("C", "N", "H", "N'"),
             "CNC'": ("C", "N", "C'")}[want]
    check(_mlp, _np_mlp, [(C, H), (H, N), (C,)], k, mode, names)


def _np_softmax(x):
    e = np.exp(x - x.max(axis=0, keepdims=True))
    return e / e.sum(axis=0, keepdims=True)


@pytest.mark.parametrize("mode", MODES)
def test_softmax(mode):
    J = check(be.softmax, _np_softmax, [(C, N)], 0, mode, ("C", "N", "C'", "N'"))
    # the structure: samples are independent, and each column sums to zero
    assert np.abs(J[:, 0, :, 1]).max() == 0.0
    np.testing.assert_allclose(J.sum(axis=0), 0.0, atol=1e-15)


@pytest.mark.parametrize("mode", MODES)
def test_reductions(mode):
    check(lambda x: be.sum(x * x, reduction_axes=H), lambda x: (x * x).sum(axis=1),
          [(C, H, N)], 0, mode, ("C", "N", "C'", "H", "N'"))
    check(lambda x: be.max(x, reduction_axes=(C, H)), lambda x: x.max(axis=(0, 1)),
          [(C, H, N)], 0, mode, ("N", "C", "H", "N'"))
    check(lambda x: be.prod(x, out_axes=()), np.prod, [(C, K)], 0, mode, ("C", "K"))


@pytest.mark.parametrize("mode", MODES)
def test_broadcast(mode):
    check(lambda x: be.broadcast(x, (N, H, C)) * 2.0,
          lambda x: 2.0 * np.broadcast_to(x.T[:, None, :], (5, 4, 3)),
          [(C, N)], 0, mode, ("N", "H", "C", "C'", "N'"))
    # a bias added over a batch: d y[c, n] / d b[c'] = (c == c')
    J = check(lambda b, x: x + b, lambda b, x: x + b[:, None], [(C,), (C, N)], 0, mode,
              ("C", "N", "C'"))
    np.testing.assert_array_equal(J, np.broadcast_to(np.eye(3)[:, None, :], (3, 5, 3)))


# --- lowered graphs (semi-primitive ops carry the direction axes) ------------------------
def _everything(w, x):
    h = be.tanh(be.dot(w, x))                                  # Gemm, Reshape
    s = be.slice_along_axis(h, C, slice(0, 2))                 # SliceView
    return be.max(s, reduction_axes=s.axes[0]) + be.sum(be.exp(h), reduction_axes=C) \
        + be.prod(h.T, out_axes=(N,))                          # ReduceMax/Sum/Prod, Expand


def _np_everything(w, x):
    h = np.tanh(w @ x)
    return h[0:2].max(axis=0) + np.exp(h).sum(axis=0) + h.prod(axis=0)


@pytest.mark.parametrize("mode", ["forward", "reverse"])
@pytest.mark.parametrize("k", [0, 1])
def test_lowered_graphs(mode, k):
    want = ("N", "C", "H") if k == 0 else ("N", "H", "N'")
    check(_everything, _np_everything, [(C, H), (H, N)], k, mode, want, lowered=True)
    check(_everything, _np_everything, [(C, H), (H, N)], k, mode, want)


def test_slice_and_unslice_in_both_modes():
    # reverse mode runs the forward rules over deriv's Unslice; forward over SliceView
    def f(x):
        return be.sin(be.slice_along_axis(x, H, slice(3, 0, -2))) * 3.0
    for mode in ("forward", "reverse"):
        check(f, lambda x: 3.0 * np.sin(x[:, 3:0:-2]), [(C, H)], 0, mode,
              ("C", "H[3:0:-2]", "C'", "H"))


# --- axes and naming rule -------------------------------------------------------------------
def test_naming_rule_primes_until_free():
    Cp = be.Axis(3, "C'")
    x = be.placeholder((C,), dtype=F64)
    y = be.placeholder((C, Cp), dtype=F64)
    assert be.jacobian_axes(y, x).names == ("C''",)
    z = be.placeholder((C, Cp), dtype=F64)
    assert be.jacobian_axes(be.exp(z), z).names == ("C''", "C'''")
    assert be.jacobian_axes(be.exp(x), be.placeholder((H, N))).names == ("H", "N")
    # flags and lengths survive the renaming
    n = be.jacobian_axes(be.exp(be.placeholder((N,))), be.placeholder((N,)))[0]
    assert (n.name, n.length, n.batch) == ("N'", 5, True)


def test_jacobian_of_a_jacobian_is_the_hessian():
    x = be.placeholder((C,), dtype=F64)
    c = be.sum(be.sin(x) * x, reduction_axes=C)
    g = be.jacobian(c, x)
    assert g.axes.names == ("C",)
    hess = be.jacobian(g, x)
    assert hess.axes.names == ("C", "C'")
    X = np.array([0.3, -1.1, 2.0])
    got = be.evaluate(hess, feeds={x: X})
    np.testing.assert_allclose(got, np.diag(2 * np.cos(X) - X * np.sin(X)), atol=1e-14)


def test_mode_choice_by_size():
    small = be.placeholder((C,))
    big = be.placeholder((C, H, N))
    assert choose_mode(be.exp(big) * small, small) == "forward"      # 60 outputs, 3 inputs
    assert choose_mode(be.sum(big * small, out_axes=()), big) == "reverse"
    assert "forward mode" in be.jacobian.__doc__ and "reverse mode" in be.jacobian.__doc__
    with pytest.raises(be.GeonError, match="mode"):
        be.jacobian(be.exp(small), small, mode="sideways")


@pytest.mark.parametrize("mode", ["forward", "reverse"])
def test_scalars_lists_unrelated_and_stop_gradient(mode):
    x = be.placeholder((C,), dtype=F64)
    s = be.placeholder((), dtype=F64)
    X, S = np.array([0.5, 1.0, -2.0]), np.array(1.5)
    c = be.sum(x * x, reduction_axes=C) * s
    jx, js = be.jacobian(c, [x, s], mode=mode)
    assert jx.axes.names == ("C",) and js.axes.names == ()
    vx, vs = be.evaluate([jx, js], feeds={x: X, s: S})
    np.testing.assert_allclose(vx, 2 * X * S, rtol=1e-14)
    np.testing.assert_allclose(vs, np.sum(X * X), rtol=1e-14)
    unrelated = be.jacobian(be.exp(s), x, mode=mode)
    assert unrelated.axes.names == ("C",)
    np.testing.assert_array_equal(be.evaluate(unrelated, feeds={s: S}), np.zeros(3))
    blocked = be.jacobian(be.stop_gradient(be.exp(x)) * x, x, mode=mode)
    np.testing.assert_allclose(be.evaluate(blocked, feeds={x: X}), np.diag(np.exp(X)),
                               rtol=1e-14)


@pytest.mark.parametrize("mode", ["forward", "reverse"])
def test_jacobian_of_an_input_is_the_identity_in_its_dtype(mode):
    x = be.placeholder((C, K))                     # float32
    J = be.jacobian(x, x, mode=mode)
    assert J.axes.names == ("C", "K", "C'", "K'") and J.dtype == np.float32
    got = be.NumPyTransformer().computation(J, x)(np.ones((3, 2), np.float32))
    np.testing.assert_array_equal(got.reshape(6, 6), np.eye(6))
