"""User-defined ops (``be.define_op``, ``be.elementwise_op``): values through both
evaluation paths, the gradient checker, forward against reverse mode, Jacobians and
second derivatives, the generated code, and the errors."""

import numpy as np
import pytest

import geon as be
from geon.errors import GeonError, LoweringError
from geon.op_graph import autodiff
from geon.op_graph.forward import FORWARD
from geon.op_graph.reference import EVALUATORS
from geon.op_graph.user_ops import USER_OPS, UserOp
from geon.transformers.base import STANDARD_BASE_SET
from geon.transformers.gpu import CudaCodegenTransformer
from geon.transformers.numpy.transformer import NUMPY_CODE
from gradcheck import assert_gradcheck

F64 = np.float64
C = be.Axis(3, "C")
H = be.Axis(4, "H")
N = be.Axis(5, "N", batch=True)
RNG = np.random.default_rng(31)


def _softplus_np(x):
    return np.logaddexp(0.0, x)


def _sigmoid_np(x):
    return 1.0 / (1.0 + np.exp(-x))


SOFTPLUS_CUDA = "__device__ float softplus(float x) { return log1pf(expf(x)); }"
Softplus = be.elementwise_op("Softplus", _softplus_np, be.sigmoid, cuda=SOFTPLUS_CUDA)
SoftplusRules = be.define_op(
    "SoftplusRules", _softplus_np,
    reverse=lambda op, d: [d * be.sigmoid(op.args[0])],
    forward=lambda op, ts: ts[0] * be.sigmoid(op.args[0]))
SoftplusDerived = be.define_op(          # forward rule derived from the reverse one
    "SoftplusDerived", _softplus_np, reverse=lambda op, d: [d * be.sigmoid(op.args[0])])
# a binary elementwise op, broadcasting by name: sqrt(a^2 + b^2), forward derived
Hypot = be.define_op(
    "Hypot", np.hypot,
    reverse=lambda op, d: [d * op.args[0] / op, d * op.args[1] / op])


def _cumsum_np(x, pos, backwards):
    if backwards:
        return np.flip(np.cumsum(np.flip(x, pos), axis=pos), pos)
    return np.cumsum(x, axis=pos)


CumSum = be.define_op(
    "CumSum", _cumsum_np, axes=lambda x, pos, backwards: x.axes,
    params=("pos", "backwards"),
    reverse=lambda op, d: [CumSum(d, pos=op.params["pos"],
                                  backwards=not op.params["backwards"])],
    forward=lambda op, ts: CumSum(ts[0], **op.params))
CumSumDerived = be.define_op(
    "CumSumDerived", _cumsum_np, axes=lambda x, pos, backwards: x.axes,
    params=("pos", "backwards"),
    reverse=lambda op, d: [CumSum(d, pos=op.params["pos"],
                                  backwards=not op.params["backwards"])])


def cumsum(x, axis, cls=CumSum):
    return cls(x, pos=x.axes.index(axis), backwards=False)


def _cumsum_along_H(x):
    return _cumsum_np(x, 1, False)


#: (name, build, numpy expectation, input axes)
GRAPHS = [
    ("softplus", lambda x: Softplus(x), _softplus_np, [(C, N)]),
    ("softplus_rules", lambda x: SoftplusRules(x), _softplus_np, [(C, N)]),
    ("softplus_derived", lambda x: SoftplusDerived(x), _softplus_np, [(C, N)]),
    ("softplus_in_mlp", lambda w, x: be.tanh(Softplus(be.dot(w, x))) * 2.0,
     lambda w, x: np.tanh(_softplus_np(w @ x)) * 2.0, [(C, H), (H, N)]),
    ("hypot_broadcast", lambda a, b: Hypot(a, b), lambda a, b: np.hypot(a, b.T[:, None, :]),
     [(C, H, N), (N, C)]),
    ("hypot_scalar", lambda a: Hypot(a, 0.5), lambda a: np.hypot(a, 0.5), [(C, N)]),
    ("cumsum", lambda x: cumsum(x, H), _cumsum_along_H, [(C, H, N)]),
    ("cumsum_derived", lambda x: cumsum(x, H, CumSumDerived), _cumsum_along_H, [(C, H, N)]),
    ("cumsum_of_broadcast", lambda x: cumsum(be.broadcast(x, (C, H, N)), H) * x,
     lambda x: _cumsum_along_H(np.broadcast_to(x[:, None, :], (3, 4, 5))) * x[:, None, :],
     [(C, N)]),
]
IDS = [g[0] for g in GRAPHS]


def _arrays(axes_list, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.uniform(-2.0, 2.0, [a.length for a in axes]) for axes in axes_list]


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name,build,expect,axes", GRAPHS, ids=IDS)
def test_values_both_paths(name, build, expect, axes, dtype):
    arrays = [a.astype(dtype) for a in _arrays(axes)]
    xs = [be.placeholder(a, dtype=dtype) for a in axes]
    y = build(*xs)
    assert y.dtype == dtype
    want = expect(*[a.astype(F64) for a in arrays])
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == np.float32 else dict(rtol=1e-13, atol=1e-13)
    comp = be.NumPyTransformer().computation(y, *xs)
    np.testing.assert_allclose(comp(*arrays), want, **tol)
    np.testing.assert_allclose(be.evaluate(y, feeds=dict(zip(xs, arrays))), want, **tol)


@pytest.mark.parametrize("name,build,expect,axes", GRAPHS, ids=IDS)
def test_gradient_checker(name, build, expect, axes):
    arrays = _arrays(axes, 1)
    assert_gradcheck(build, list(zip(axes, arrays)))
    assert_gradcheck(build, list(zip(axes, arrays)), mode="variable")


@pytest.mark.parametrize("lowered", [False, True], ids=["axes", "lowered"])
@pytest.mark.parametrize("name,build,expect,axes", GRAPHS, ids=IDS)
def test_forward_agrees_with_reverse_and_differences(name, build, expect, axes, lowered):
    arrays = _arrays(axes, 2)
    xs = [be.placeholder(a, dtype=F64) for a in axes]
    y = build(*xs)
    if lowered:
        be.NumPyTransformer().computation(y, *xs)
        y = be.snap(y)
    rng = np.random.default_rng(3)
    ts = [rng.standard_normal(a.shape) for a in arrays]
    cbar = rng.standard_normal(y.axes.shape)
    jt = be.jvp(y, xs, ts)
    jtc = be.deriv(y, xs, error=be.Constant(cbar, axes=y.axes, dtype=F64))
    vals = be.NumPyTransformer().computation([jt] + jtc, *xs)(*arrays)
    lhs = np.sum(vals[0] * cbar)
    rhs = sum(np.sum(t * g) for t, g in zip(ts, vals[1:]))
    assert abs(lhs - rhs) <= 1e-12 * (abs(lhs) + abs(rhs)) + 1e-13
    eps = 1e-6
    plus = expect(*[a + eps * t for a, t in zip(arrays, ts)])
    minus = expect(*[a - eps * t for a, t in zip(arrays, ts)])
    np.testing.assert_allclose(vals[0], (plus - minus) / (2 * eps), rtol=1e-6, atol=1e-8)


def _fd_jacobian(fn, arrays, k, eps=1e-6):
    out = np.asarray(fn(*arrays))
    jac = np.zeros(out.shape + arrays[k].shape)
    for j in np.ndindex(*arrays[k].shape):
        p, m = list(arrays), list(arrays)
        p[k], m[k] = arrays[k].copy(), arrays[k].copy()
        p[k][j] += eps
        m[k][j] -= eps
        jac[(Ellipsis,) + j] = (fn(*p) - fn(*m)) / (2 * eps)
    return jac


@pytest.mark.parametrize("mode", ["forward", "reverse"])
@pytest.mark.parametrize("name,build,expect,axes", GRAPHS, ids=IDS)
def test_jacobians(name, build, expect, axes, mode):
    arrays = _arrays(axes, 4)
    xs = [be.placeholder(a, dtype=F64) for a in axes]
    y = build(*xs)
    for k in range(len(xs)):
        J = be.jacobian(y, xs[k], mode=mode)
        assert J.axes.names == y.axes.names + be.jacobian_axes(y, xs[k]).names
        got = be.NumPyTransformer().computation(J, *xs)(*arrays)
        want = _fd_jacobian(expect, arrays, k)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-7 * max(1, np.abs(want).max()))


@pytest.mark.parametrize("name,build,expect,axes", GRAPHS, ids=IDS)
def test_hessian_vector_products(name, build, expect, axes):
    arrays = _arrays(axes, 5)
    xs = [be.placeholder(a, dtype=F64) for a in axes]
    rng = np.random.default_rng(6)
    R = rng.standard_normal([a.length for a in build(*xs).axes])
    y = build(*xs)
    cost = be.sum(y * be.Constant(R, axes=y.axes, dtype=F64), reduction_axes=y.axes)
    vs = [rng.standard_normal(a.shape) for a in arrays]
    hv = be.hvp(cost, xs, vs)
    grads = be.deriv(cost, xs)
    eps = 1e-5
    gp = be.evaluate(grads, feeds={x: a + eps * v for x, a, v in zip(xs, arrays, vs)})
    gm = be.evaluate(grads, feeds={x: a - eps * v for x, a, v in zip(xs, arrays, vs)})
    got = be.NumPyTransformer().computation(hv, *xs)(*arrays)
    for g, p, m in zip(got, gp, gm):
        fd = (p - m) / (2 * eps)
        assert np.linalg.norm(g - fd) <= 1e-8 + 1e-6 * np.linalg.norm(fd)


# --- registration and generated code ----------------------------------------------------------
def test_registered_in_every_table():
    for cls in (Softplus, SoftplusRules, SoftplusDerived, Hypot, CumSum, CumSumDerived):
        assert issubclass(cls, UserOp) and cls.__name__ in cls.registry_key
        assert USER_OPS[cls.registry_key] is cls
        for table in (EVALUATORS, autodiff.ADJOINTS, FORWARD):
            assert cls in table, (cls.__name__, table is FORWARD)
        # the backends' one rule for every user op
        rule = next(NUMPY_CODE[c] for c in cls.__mro__ if c in NUMPY_CODE)
        assert rule is NUMPY_CODE[UserOp]
        assert issubclass(cls, tuple(be.NumPyTransformer.base_set))
        assert not issubclass(cls, tuple(STANDARD_BASE_SET))
    assert "softplus" in Softplus.cuda_source and Hypot.cuda_source is None
    gpu_base = CudaCodegenTransformer().base_set
    assert Softplus in gpu_base and Hypot not in gpu_base and CumSum not in gpu_base
    assert Softplus.__module__ == __name__


def test_defining_an_op_changes_no_transformer():
    # the base sets are the transformers' own: defining an op patches none of them
    before = be.NumPyTransformer.base_set
    Cube = be.elementwise_op("Cube", lambda x: x ** 3, lambda x: 3.0 * x * x)
    assert be.NumPyTransformer.base_set is before
    x = be.placeholder((C,), dtype=F64)
    X = np.array([1.0, -2.0, 0.5])
    np.testing.assert_array_equal(be.NumPyTransformer().computation(Cube(x), x)(X), X ** 3)


def test_appears_in_the_generated_code():
    x = be.placeholder((C, N), dtype=F64)
    comp = be.NumPyTransformer().computation([Softplus(x), cumsum(x, N)], x)
    lines = comp.source.splitlines()
    sp = [ln for ln in lines if "# Softplus" in ln]
    cs = [ln for ln in lines if "# CumSum" in ln]
    assert len(sp) == 1 and "user_Softplus(" in sp[0] and __file__ in sp[0]
    assert len(cs) == 1 and "pos=1, backwards=False" in cs[0]


def test_fused_blocks_of_a_large_tensor():
    # big elementwise runs are executed block by block; the user op takes part
    A, B = be.Axis(300, "A"), be.Axis(250, "B")
    x = be.placeholder((A, B), dtype=F64)
    y = Softplus(x * 2.0) * 0.5 + 1.0
    X = np.random.default_rng(0).uniform(-3, 3, (300, 250))
    got = be.NumPyTransformer().computation(y, x)(X)
    np.testing.assert_allclose(got, _softplus_np(2 * X) * 0.5 + 1.0, rtol=1e-14)


def test_two_ops_with_one_name_keep_their_own_implementations():
    first = be.elementwise_op("Twice", lambda x: 2 * x, lambda x: 2.0)
    second = be.elementwise_op("Twice", lambda x: 3 * x, lambda x: 3.0)
    assert first.registry_key != second.registry_key
    x = be.placeholder((C,), dtype=F64)
    X = np.array([1.0, 2.0, 3.0])
    comp = be.NumPyTransformer().computation([first(x), second(x)], x)
    a, b = comp(X)
    np.testing.assert_array_equal(a, 2 * X)
    np.testing.assert_array_equal(b, 3 * X)
    d = be.evaluate(be.jvp(second(x), x, np.ones(3)), feeds={x: X})
    np.testing.assert_array_equal(d, np.full(3, 3.0))


def test_elementwise_derivative_may_use_the_value():
    Exp2 = be.elementwise_op("Exp2", np.exp, lambda x, y: y)  # d exp(x) = exp(x)
    x = be.placeholder((C,), dtype=F64)
    X = np.array([0.1, -0.4, 1.2])
    c = be.sum(Exp2(x), out_axes=())
    g, h = be.evaluate([be.deriv(c, x), be.hvp(c, x, np.ones(3))], feeds={x: X})
    np.testing.assert_allclose(g, np.exp(X), rtol=1e-15)
    np.testing.assert_allclose(h, np.exp(X), rtol=1e-15)


# --- errors ---------------------------------------------------------------------------------
def test_a_transformer_without_the_op_names_it():
    class StandardOnly(be.NumPyTransformer):
        name = "standard_only"
        base_set = STANDARD_BASE_SET
    x = be.placeholder((C, N), dtype=F64)
    with pytest.raises(LoweringError, match="standard_only transformer cannot run .*Softplus"):
        StandardOnly().computation(Softplus(x) + 1.0, x)
    with pytest.raises(LoweringError, match="CumSum"):
        StandardOnly().computation(cumsum(x, C), x)


def test_an_op_without_rules_is_not_differentiable_and_says_so():
    Floor = be.define_op("Floor", np.floor)
    x = be.placeholder((C,), dtype=F64)
    y = be.sum(Floor(x), out_axes=())
    assert be.evaluate(y, feeds={x: np.array([0.5, 1.5, -0.5])}) == 0.0
    with pytest.raises(GeonError, match="no derivative rule for Floor"):
        be.deriv(y, x)
    with pytest.raises(GeonError, match="no forward rule for Floor"):
        be.jvp(y, x, np.ones(3))
    # but it may sit behind stop_gradient
    z = be.sum(be.stop_gradient(Floor(x)) * x, out_axes=())
    np.testing.assert_array_equal(be.evaluate(be.deriv(z, x), feeds={x: np.array(
        [0.5, 1.5, -0.5])}), [0.0, 1.0, -1.0])


def test_wrong_shapes_and_bad_definitions():
    Bad = be.define_op("BadShape", lambda x: x.sum(), axes=lambda x: x.axes)
    x = be.placeholder((C, N), dtype=F64)
    with pytest.raises(GeonError, match="BadShape .* returned shape \\(\\)"):
        be.evaluate(Bad(x), feeds={x: np.ones((3, 5))})
    with pytest.raises(ValueError, match="identifier"):
        be.define_op("not a name", np.exp)
    with pytest.raises(TypeError, match="function"):
        be.define_op("NoImpl", None)
    with pytest.raises(ValueError, match="reserved"):
        be.define_op("Reserved", np.exp, axes=lambda x, name: x.axes, params=("name",))
    with pytest.raises(ValueError, match="elementwise op takes no parameters"):
        be.define_op("ParamElementwise", np.exp, params=("k",))
    with pytest.raises(TypeError, match="needs parameter"):
        CumSum(x, pos=0)
    with pytest.raises(TypeError, match="must be a number"):
        CumSum(x, pos=C, backwards=False)
    with pytest.raises(TypeError, match="takes 1 arg"):
        Softplus(x, x)
