"""Second derivatives: every twice-differentiable op-table case, in all four
combinations of reverse and forward mode, against central differences of its gradient.

For a case ``f`` with float inputs ``x`` and a fixed random ``R`` laid out as ``f``,
``L = sum(f * R)`` and ``g = d L / d x``. Along a random direction ``v``, the
Hessian-vector product ``H v`` must equal ``(g(x + eps v) - g(x - eps v)) / (2 eps)``,
built four ways:

- reverse over reverse: ``deriv(sum_i <g_i, v_i>, x)``;
- forward over reverse: ``jvp(g, x, v)`` (what ``be.hvp`` does);
- reverse over forward: ``deriv(sum(jvp(f, x, v) * R), x)``;
- forward over forward: ``<jvp(jvp(f, x, v), x, w), R>`` equals ``<H v, w>``.
"""

import zlib

import numpy as np
import pytest

import geon as be
from op_table import GRAD_CASES

F64 = np.float64
EPS = 1e-5


def _inner(a, b):
    p = a * b
    return be.sum(p, reduction_axes=p.axes) if len(p.axes) else p


def _total(terms):
    out = None
    for t in terms:
        out = t if out is None else out + t
    return out


class Setup:
    def __init__(self, case):
        rng = np.random.default_rng(zlib.crc32(case.name.encode()) + 77)
        self.arrays = case.arrays(F64)
        self.xs = [be.placeholder(i.axes, dtype=i.dtype(F64)) for i in case.inputs]
        self.f = case.make(self.xs, F64)
        self.R = rng.standard_normal(self.f.axes.shape)
        self.idx = [k for k, a in enumerate(self.arrays) if a.dtype.kind == "f"]
        self.v = [rng.standard_normal(self.arrays[k].shape) for k in self.idx]
        self.w = [rng.standard_normal(self.arrays[k].shape) for k in self.idx]
        self.L = _inner(self.f, be.Constant(self.R, axes=self.f.axes, dtype=F64))
        self.wrt = [self.xs[k] for k in self.idx]
        self.g = be.deriv(self.L, self.wrt)

    def const(self, arrays):
        return [be.Constant(a, axes=x.axes, dtype=F64) for a, x in zip(arrays, self.wrt)]

    def feeds(self, shift=0.0):
        vals = list(self.arrays)
        for k, v in zip(self.idx, self.v):
            vals[k] = self.arrays[k] + shift * v
        return dict(zip(self.xs, vals))

    def fd_hvp(self):
        plus = be.evaluate(self.g, feeds=self.feeds(EPS))
        minus = be.evaluate(self.g, feeds=self.feeds(-EPS))
        return [(p - m) / (2 * EPS) for p, m in zip(plus, minus)]


def _close(got, want, what):
    for k, (a, b) in enumerate(zip(got, want)):
        a = np.asarray(a, F64)
        assert a.shape == b.shape, (what, k)
        err = np.linalg.norm(a - b)
        assert err <= 1e-8 + 1e-6 * np.linalg.norm(b), (what, k, err, np.linalg.norm(b))


@pytest.mark.parametrize("case", GRAD_CASES, ids=[c.name for c in GRAD_CASES])
def test_second_derivatives(case):
    s = Setup(case)
    want = s.fd_hvp()
    vs = s.const(s.v)
    rr = be.deriv(_total(_inner(g, v) for g, v in zip(s.g, vs)), s.wrt)
    fr = be.jvp(s.g, s.wrt, vs)
    jf = be.jvp(s.f, s.wrt, vs)
    rf = be.deriv(_inner(jf, be.Constant(s.R, axes=s.f.axes, dtype=F64)), s.wrt)
    ff = be.jvp(jf, s.wrt, s.const(s.w))
    comp = be.NumPyTransformer().computation(rr + fr + rf + [ff], *s.xs)
    out = comp(*[s.arrays[k] for k in range(len(s.xs))])
    n = len(s.wrt)
    _close(out[:n], want, "reverse over reverse")
    _close(out[n:2 * n], want, "forward over reverse")
    _close(out[2 * n:3 * n], want, "reverse over forward")
    ff_val = float(np.sum(np.asarray(out[3 * n]) * s.R))
    ff_want = float(sum(np.sum(h * w) for h, w in zip(want, s.w)))
    scale = float(sum(np.sum(np.abs(h * w)) for h, w in zip(want, s.w)))
    assert abs(ff_val - ff_want) <= 1e-8 + 1e-6 * scale, (ff_val, ff_want)
    # the reference evaluator agrees with the generated code
    ref = be.evaluate(fr, feeds=s.feeds())
    for a, b in zip(ref, out[n:2 * n]):  # two exact computations: tight tolerance
        np.testing.assert_allclose(np.asarray(a, F64), np.asarray(b, F64), rtol=1e-12,
                                   atol=1e-12)


# --- the MLP loss ----------------------------------------------------------------------------
def _mlp_loss():
    C, H, D = be.Axis(3, "C"), be.Axis(4, "H"), be.Axis(6, "D")
    N = be.Axis(5, "N", batch=True)
    rng = np.random.default_rng(5)
    init = {"w1": rng.normal(0, 0.5, (4, 6)), "b1": rng.normal(0, 0.1, 4),
            "w2": rng.normal(0, 0.5, (3, 4)), "b2": rng.normal(0, 0.1, 3)}
    w1 = be.Variable((H, D), initial_value=init["w1"], dtype=F64, name="w1")
    b1 = be.Variable((H,), initial_value=init["b1"], dtype=F64, name="b1")
    w2 = be.Variable((C, H), initial_value=init["w2"], dtype=F64, name="w2")
    b2 = be.Variable((C,), initial_value=init["b2"], dtype=F64, name="b2")
    x = be.placeholder((D, N), dtype=F64)
    y = be.placeholder((N,), dtype=np.int64)
    h = be.tanh(be.dot(w1, x) + b1)
    p = be.softmax(be.dot(w2, h) + b2)
    loss = be.mean(be.cross_entropy_multi(p, be.one_hot(y, C)), out_axes=())
    data = {x: rng.normal(size=(6, 5)), y: rng.integers(0, 3, 5)}
    return loss, [w1, b1, w2, b2], init, data


def test_hessian_vector_product_of_the_mlp_loss():
    loss, ws, init, data = _mlp_loss()
    rng = np.random.default_rng(9)
    vs = [rng.standard_normal(init[w.name].shape) for w in ws]
    hv = be.hvp(loss, ws, vs)
    assert [h.axes.names for h in hv] == [w.axes.names for w in ws]
    grads = be.deriv(loss, ws)
    assert set(be.gradients(loss)) == set(ws)

    def grads_at(shift):
        state = {w: init[w.name] + shift * v for w, v in zip(ws, vs)}
        return be.evaluate(grads, feeds=data, state=state)
    fd = [(p - m) / (2 * EPS) for p, m in zip(grads_at(EPS), grads_at(-EPS))]
    t = be.NumPyTransformer()
    x, y = data
    got = t.computation(hv, x, y)(data[x], data[y])
    _close(got, fd, "hvp")
    assert min(np.linalg.norm(f) for f in fd) > 1e-3
    # reverse over reverse gives the same
    rr = be.deriv(_total(_inner(g, be.Constant(v, axes=w.axes, dtype=F64))
                         for g, v, w in zip(grads, vs, ws)), ws)
    _close(t.computation(rr, x, y)(data[x], data[y]), fd, "deriv(deriv)")


def test_single_input_hvp_and_third_derivative():
    x = be.placeholder((), dtype=F64)
    c = be.sin(x) * x
    X = 0.7
    d1 = be.deriv(c, x)
    d2 = be.deriv(d1, x)
    d3 = be.deriv(d2, x)
    h = be.hvp(c, x, 2.0)
    v1, v2, v3, hv = be.evaluate([d1, d2, d3, h], feeds={x: X})
    assert np.isclose(v1, np.cos(X) * X + np.sin(X), rtol=1e-14)
    assert np.isclose(v2, 2 * np.cos(X) - X * np.sin(X), rtol=1e-14)
    assert np.isclose(v3, -3 * np.sin(X) - X * np.cos(X), rtol=1e-14)
    assert np.isclose(hv, 2 * v2, rtol=1e-14)
