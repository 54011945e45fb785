"""Forward mode (``be.jvp``) against reverse mode and against finite differences.

The dot-product test: for random tangents ``t`` and a random cotangent ``c`` (float64),
``<J t, c>`` from ``jvp`` must equal ``sum_i <t_i, J_i^T c>`` from ``deriv`` with
``error=c``. It runs for every op-table case with float inputs, on the graph as built
(Axes ops) and on the graph after a transformer lowered it (semi-primitive ops), so
that both halves of :data:`geon.op_graph.forward.FORWARD` are exercised. A directional
central difference checks the tangents themselves.
"""

import zlib

import numpy as np
import pytest

import geon as be
from geon.errors import GeonError
from geon.op_graph import autodiff
from geon.op_graph import op_graph as og
from geon.op_graph import primitives as pr
from geon.op_graph.forward import FORWARD
from op_table import CASES, GRAD_CASES, C, H, N, W

F64 = np.float64
#: ops whose derivative is zero wherever it exists
ZERO_DERIVATIVE = {"sign", "equal", "not_equal", "less", "less_equal", "greater",
                   "greater_equal", "tensor_size", "stop_gradient"}
FLOAT_CASES = [c for c in CASES
               if any(i.kind == "float" for i in c.inputs) and c.out_dtype != "int64"]


def _rng(name, salt):
    return np.random.default_rng(zlib.crc32(name.encode()) + salt)


def _build(case, lowered=False):
    """Placeholders, the case's op (lowered by a NumPy transformer if asked), arrays."""
    arrays = case.arrays(F64)
    xs = [be.placeholder(i.axes, dtype=i.dtype(F64)) for i in case.inputs]
    f = case.make(xs, F64)
    if lowered:
        t = be.NumPyTransformer()
        t.computation(f, *xs)
        f = be.snap(f)
        base = tuple(t.base_set)
        assert all(isinstance(op, base) for op in og.toposort([f], deps=False))
    return xs, f, arrays


def dot_test(xs, f, arrays, name, path="reference"):
    """``(<J t, c>, sum_i <t_i, J_i^T c>, scale)`` for random ``t`` and ``c``."""
    rng = _rng(name, 11)
    idx = [k for k, a in enumerate(arrays) if a.dtype.kind == "f"]
    ts = [rng.standard_normal(arrays[k].shape) for k in idx]
    cbar = rng.standard_normal(f.axes.shape)
    jt = be.jvp(f, [xs[k] for k in idx],
                [be.Constant(t, axes=xs[k].axes, dtype=F64) for k, t in zip(idx, ts)])
    assert jt.axes.names == f.axes.names
    jtc = be.deriv(f, [xs[k] for k in idx], error=be.Constant(cbar, axes=f.axes, dtype=F64))
    feeds = dict(zip(xs, arrays))
    if path == "numpy":
        comp = be.NumPyTransformer().computation([jt] + jtc, *xs)
        vals = comp(*arrays)
    else:
        vals = be.evaluate([jt] + jtc, feeds=feeds)
    jt_v, jtc_v = np.asarray(vals[0], F64), [np.asarray(v, F64) for v in vals[1:]]
    lhs = float(np.sum(jt_v * cbar))
    rhs = float(sum(np.sum(t * g) for t, g in zip(ts, jtc_v)))
    scale = float(np.sum(np.abs(jt_v * cbar)) + sum(np.sum(np.abs(t * g))
                                                    for t, g in zip(ts, jtc_v)))
    return lhs, rhs, scale


def assert_dot_test(xs, f, arrays, name, path="reference"):
    lhs, rhs, scale = dot_test(xs, f, arrays, name, path)
    assert np.isfinite(lhs) and np.isfinite(rhs)
    assert abs(lhs - rhs) <= 1e-12 * scale + 1e-13, (lhs, rhs, scale)
    return lhs, rhs, scale


@pytest.mark.parametrize("path", ["numpy", "reference"])
@pytest.mark.parametrize("case", FLOAT_CASES, ids=[c.name for c in FLOAT_CASES])
def test_dot_product(case, path):
    xs, f, arrays = _build(case)
    lhs, rhs, scale = assert_dot_test(xs, f, arrays, case.name, path)
    if case.grad and case.op not in ZERO_DERIVATIVE:
        assert scale > 1e-6  # a real derivative was compared, not zeros with zeros


@pytest.mark.parametrize("case", FLOAT_CASES, ids=[c.name for c in FLOAT_CASES])
def test_dot_product_lowered(case):
    xs, f, arrays = _build(case, lowered=True)
    assert_dot_test(xs, f, arrays, case.name)


def _directional_fd(xs, f, arrays, ts, eps=1e-6):
    idx = [k for k, a in enumerate(arrays) if a.dtype.kind == "f"]

    def at(sign):
        vals = list(arrays)
        for k, t in zip(idx, ts):
            vals[k] = arrays[k] + sign * eps * t
        return np.asarray(be.evaluate(f, feeds=dict(zip(xs, vals))), F64)
    return (at(1) - at(-1)) / (2 * eps)


@pytest.mark.parametrize("case", GRAD_CASES, ids=[c.name for c in GRAD_CASES])
def test_jvp_matches_central_differences(case):
    xs, f, arrays = _build(case)
    rng = _rng(case.name, 23)
    idx = [k for k, a in enumerate(arrays) if a.dtype.kind == "f"]
    ts = [rng.standard_normal(arrays[k].shape) for k in idx]
    got = np.asarray(be.NumPyTransformer().computation(
        be.jvp(f, [xs[k] for k in idx], ts), *xs)(*arrays), F64)
    want = _directional_fd(xs, f, arrays, ts)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7 * (1 + np.abs(want).max()))


# --- the rule table ------------------------------------------------------------------------
def test_every_reverse_rule_has_a_forward_rule():
    missing = [cls.__name__ for cls in autodiff.ADJOINTS if cls not in FORWARD]
    assert not missing, missing
    # and the semi-primitives, so lowered graphs stay differentiable in both modes
    for cls in (pr.Gemm, pr.ReduceSum, pr.ReduceProd, pr.ReduceMax, pr.ReduceMin,
                pr.Dimshuffle, pr.Reshape, pr.Expand, pr.SliceView, pr.Unslice, pr.Copy):
        assert cls in FORWARD, cls.__name__


def _prim_cases():
    """Semi-primitive ops built directly, including ones lowering never produces from
    the op table's forward graphs (Unslice, Copy)."""
    CH = be.Axes(C, H)
    H2 = be.Axis(2, "H2")
    return [
        ("gemm", [CH, be.Axes(H, W)], lambda a, b: pr.Gemm(a, b)),
        ("unslice", [be.Axes(C, H2)],
         lambda x: pr.Unslice(x, CH, (slice(None), slice(1, 3)))),
        ("unslice_index", [be.Axes(C)], lambda x: pr.Unslice(x, CH, (slice(None), 2))),
        ("sliceview", [CH], lambda x: pr.SliceView(x, (slice(None), slice(3, 0, -2)),
                                                   be.Axes(C, H2))),
        ("copy", [CH], lambda x: pr.Copy(x)),
        ("dimshuffle", [be.Axes(C, H, N)], lambda x: pr.Dimshuffle(x, (2, 0, 1))),
        ("reshape", [CH], lambda x: pr.Reshape(x, be.Axes(be.Axis(2, "A"), be.Axis(6, "B")))),
        ("expand", [be.Axes(C)], lambda x: pr.Expand(x, be.Axes(H, C), (None, 0))),
        ("reduce_sum", [CH], lambda x: pr.ReduceSum(x, 1)),
        ("reduce_prod", [CH], lambda x: pr.ReduceProd(x, 0)),
        ("reduce_max", [CH], lambda x: pr.ReduceMax(x, 1)),
        ("reduce_min", [CH], lambda x: pr.ReduceMin(x, 0)),
    ]


@pytest.mark.parametrize("name,axes,build", _prim_cases(), ids=[c[0] for c in _prim_cases()])
def test_dot_product_semi_primitives(name, axes, build):
    rng = _rng(name, 3)
    arrays = [(rng.permutation(a.size) * 0.37 + 0.5).reshape(a.shape) for a in axes]
    xs = [be.placeholder(a, dtype=F64) for a in axes]
    f = build(*xs)
    lhs, rhs, scale = assert_dot_test(xs, f, arrays, name, "numpy")
    assert scale > 1e-3
    ts = [_rng(name, 5).standard_normal(a.shape) for a in arrays]
    got = be.evaluate(be.jvp(f, xs, ts), feeds=dict(zip(xs, arrays)))
    np.testing.assert_allclose(got, _directional_fd(xs, f, arrays, ts), rtol=1e-6, atol=1e-8)


# --- planted wrong rules are caught ----------------------------------------------------------
def _case(name):
    return next(c for c in CASES if c.name == name)


def test_a_planted_wrong_forward_rule_is_caught(monkeypatch):
    case = _case("tanh")
    assert_dot_test(*_build(case), case.name)
    monkeypatch.setitem(FORWARD, og.Tanh, lambda op, ts: ts[0] * (1.0 - op * op) * 1.001)
    lhs, rhs, scale = dot_test(*_build(case), case.name)
    assert abs(lhs - rhs) > 1e-4 * scale


def test_a_planted_wrong_rule_for_one_operand_is_caught(monkeypatch):
    case = _case("dot_mm_transposed")
    right = FORWARD[og.Dot]

    def wrong(op, ts):  # drops the second operand's term
        return right(op, [ts[0], None])
    monkeypatch.setitem(FORWARD, og.Dot, wrong)
    lhs, rhs, scale = dot_test(*_build(case), case.name)
    assert abs(lhs - rhs) > 1e-3 * scale


def test_a_planted_wrong_semi_primitive_rule_is_caught(monkeypatch):
    case = _case("dot_mm")
    xs, f, arrays = _build(case, lowered=True)
    assert_dot_test(xs, f, arrays, case.name)
    monkeypatch.setitem(FORWARD, pr.Gemm, lambda op, ts: None)  # "gemm is constant"
    xs, f, arrays = _build(case, lowered=True)
    lhs, rhs, scale = dot_test(xs, f, arrays, case.name)
    assert lhs == 0.0 and abs(rhs) > 1e-3


# --- the API ---------------------------------------------------------------------------------
def test_jvp_api_lists_arrays_numbers_and_zeros():
    x = be.placeholder((C, N), dtype=F64)
    y = be.placeholder((N,), dtype=F64)
    out1 = be.exp(x) * y
    out2 = be.sum(y * y, reduction_axes=N)
    unrelated = be.placeholder((H,), dtype=F64)
    X = np.linspace(-1, 1, 15).reshape(3, 5)
    Y = np.linspace(0.5, 2, 5)
    tx = np.full((3, 5), 0.5)
    # a tangent with fewer axes than its input is broadcast; a number fills
    j1, j2, j3 = be.jvp([out1, out2, unrelated], [x, y],
                        [be.Constant(np.ones(5), axes=(N,), dtype=F64), 2.0])
    assert j1.axes.names == ("C", "N") and j2.axes.names == () and j3.axes.names == ("H",)
    v1, v2, v3 = be.evaluate([j1, j2, j3], feeds={x: X, y: Y})
    np.testing.assert_allclose(v1, np.exp(X) * Y + np.exp(X) * 2.0, rtol=1e-14)
    np.testing.assert_allclose(v2, np.sum(2 * Y * 2.0), rtol=1e-14)
    np.testing.assert_array_equal(v3, np.zeros(4))
    # a single input with an array tangent
    v = be.evaluate(be.jvp(out1, x, tx), feeds={x: X, y: Y})
    np.testing.assert_allclose(v, np.exp(X) * Y * 0.5, rtol=1e-14)
    with pytest.raises(GeonError, match="tangent"):
        be.jvp(out1, x, be.Constant(np.ones(4), axes=(H,), dtype=F64))
    with pytest.raises(GeonError, match="2 input"):
        be.jvp(out1, [x, y], [tx])


def test_stop_gradient_blocks_tangents_in_both_modes():
    x = be.placeholder((C,), dtype=F64)
    X = np.array([0.5, -1.0, 2.0])
    f = be.stop_gradient(x * x) * x + x     # d f = (x*x) dx + dx, not 3 x^2 dx + dx
    t = np.array([1.0, 2.0, -1.0])
    fwd = be.evaluate(be.jvp(f, x, t), feeds={x: X})
    np.testing.assert_allclose(fwd, (X * X + 1) * t, rtol=1e-14)
    rev = be.evaluate(be.deriv(be.sum(f, reduction_axes=C), x), feeds={x: X})
    np.testing.assert_allclose(rev, X * X + 1, rtol=1e-14)
    # and in a lowered graph (where stop_gradient itself is gone)
    c = be.sum(be.stop_gradient(be.exp(x)) * x, reduction_axes=C)
    np.testing.assert_allclose(be.evaluate(be.jvp(c, x, t), feeds={x: X}),
                               np.sum(np.exp(X) * t), rtol=1e-14)


def test_deriv_of_a_list_and_gradients():
    w = be.Variable((C, H), initial_value=np.arange(12.0).reshape(3, 4) / 10, dtype=F64)
    b = be.Variable((C,), initial_value=np.array([0.1, -0.2, 0.3]), dtype=F64)
    frozen = be.Variable((C,), initial_value=1.0, dtype=F64, trainable=False)
    x = be.placeholder((H, N), dtype=F64)
    X = np.linspace(-1, 1, 20).reshape(4, 5)
    c = be.sum(be.tanh(be.dot(w, x) + b) * frozen, reduction_axes=(C, N))
    dw, db = be.deriv(c, [w, b])
    assert dw.axes.names == ("C", "H") and db.axes.names == ("C",)
    grads = be.gradients(c)
    assert list(grads) == [w, b]           # the trainable variables, in graph order
    assert grads[w] is dw and grads[b] is db  # one reverse pass, shared
    assert be.deriv(c, (w,))[0] is dw
    vals = be.evaluate([dw, db], feeds={x: X})
    z = np.tanh(np.arange(12.0).reshape(3, 4) / 10 @ X + np.array([0.1, -0.2, 0.3])[:, None])
    np.testing.assert_allclose(vals[1], (1 - z * z).sum(1), rtol=1e-13)
    np.testing.assert_allclose(vals[0], (1 - z * z) @ X.T, rtol=1e-13)


def test_an_op_without_a_forward_rule_is_named():
    class Mystery(og.UnaryElementWise):
        """An op nobody wrote a forward rule for."""
    x = be.placeholder((C,), dtype=F64)
    m = Mystery(x)
    with pytest.raises(GeonError, match="no forward rule for Mystery"):
        be.jvp(m, x, np.ones(3))
    # an op that does not depend on the input needs no rule
    np.testing.assert_array_equal(
        be.evaluate(be.jvp(Mystery(be.placeholder((C,))), x, np.ones(3))), np.zeros(3))
