"""The NumPy family (``be.np``) against NumPy itself.

Each op group is checked on random shapes drawn by hypothesis (broadcastable shape
pairs and triples included), through the NumPy transformer and the reference evaluator,
for values and dtypes; then through the float64 gradient checker. Computations are
cached by graph signature (shapes, dtypes, parameters), so repeated shapes reuse one
compiled computation with new values.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import geon as be
from geon.op_graph.coercion import PositionalAxis, canonical_axes, family
from geon.op_graph.np_ops import Select
from geon.op_graph.primitives import UnsliceAdd
from geon.transformers.base import STANDARD_BASE_SET
from gradcheck import assert_gradcheck

CASES = settings(max_examples=200, derandomize=True, deadline=None, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
GRADS = settings(CASES, max_examples=25)

SEEDS = st.integers(0, 2**31 - 1)
FLOATS = ["float64", "float32"]
_CACHE = {}


def values(rng, shape, dtype, domain="real"):
    """Multiples of 1/8 (exact in float32), of the domain's sign and size."""
    if np.dtype(dtype).kind in "iu":
        v = rng.integers(-4, 5, size=shape)
        if domain == "nonzero":
            v = np.where(v == 0, 3, v)
        return v.astype(dtype)
    v = np.round(rng.uniform(-2.0, 2.0, size=shape) * 8) / 8
    if domain == "positive":
        v = np.abs(v) + 0.5
    elif domain == "nonzero":
        v = np.where(np.abs(v) < 0.5, 0.75, v)
    return np.asarray(v, dtype=dtype)


def compiled(key, build, shapes, dtypes):
    """``(computation, results, placeholders)`` for ``build(*placeholders)``, cached."""
    hit = _CACHE.get(key)
    if hit is None:
        ps = [be.np.placeholder(s, dtype=d) for s, d in zip(shapes, dtypes)]
        results = build(*ps)
        comp = be.NumPyTransformer().computation(results, *ps)
        hit = _CACHE[key] = (comp, ps)
    return hit


def check(key, build, expect, arrays, exact=False, reference=True):
    """Run ``build`` on ``arrays`` and compare every result with ``expect(*arrays)``."""
    shapes = [a.shape for a in arrays]
    dtypes = [a.dtype for a in arrays]
    comp, ps = compiled((key, tuple(shapes), tuple(map(str, dtypes))), build, shapes, dtypes)
    got = comp(*arrays)
    wants = expect(*arrays)
    evaluated = None
    if reference:
        evaluated = be.evaluate(build(*ps), feeds=dict(zip(ps, arrays)))
    for i, (g, w) in enumerate(zip(got, wants)):
        w = np.asarray(w)
        if w.dtype == bool:  # geon comparisons give 1.0 / 0.0 in a float type
            assert g.dtype.kind == "f", (key, i)
            w = w.astype(g.dtype)
        assert g.shape == w.shape, (key, i, g.shape, w.shape)
        assert g.dtype == w.dtype, (key, i, g.dtype, w.dtype)
        tol = dict(rtol=0, atol=0) if exact else dict(
            rtol=1e-5 if g.dtype == np.float32 else 1e-12,
            atol=1e-6 if g.dtype == np.float32 else 1e-14)
        np.testing.assert_allclose(g, w, err_msg=f"{key} result {i}", **tol)
        if evaluated is not None:
            np.testing.assert_allclose(evaluated[i], w, err_msg=f"{key} reference {i}", **tol)


# --- elementwise --------------------------------------------------------------------------

def operator_or(operator, function):
    """The operator form on tensors with axes; the function on 0-d tensors, which have
    no positional axes to tell their family (operators give them geon's dtypes)."""
    return lambda *xs: operator(*xs) if any(len(x.axes) for x in xs) else function(*xs)


BINARY = [  # name, geon, numpy, float only
    ("add", lambda a, b: a + b, np.add, False),
    ("subtract", lambda a, b: be.np.subtract(a, b), np.subtract, False),
    ("multiply", lambda a, b: a * b, np.multiply, False),
    ("maximum", be.np.maximum, np.maximum, False),
    ("minimum", be.np.minimum, np.minimum, False),
    ("divide", be.np.divide, np.divide, False),
    ("true_divide", operator_or(lambda a, b: a / b, be.np.true_divide), np.true_divide,
     False),
    ("power", lambda a, b: be.np.power(be.np.absolute(a) + 0.5, b),
     lambda a, b: np.power(np.abs(a) + 0.5, b), True),
    ("equal", be.np.equal, np.equal, False),
    ("not_equal", be.np.not_equal, np.not_equal, False),
    ("less", lambda a, b: a < b, np.less, False),
    ("less_equal", be.np.less_equal, np.less_equal, False),
    ("greater", lambda a, b: a > b, np.greater, False),
    ("greater_equal", lambda a, b: a >= b, np.greater_equal, False),
]


@CASES
@given(shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4,
                                                min_side=1, max_side=4),
       dtypes=st.tuples(st.sampled_from(FLOATS + ["int64", "int32"]),
                        st.sampled_from(FLOATS + ["int64"])),
       seed=SEEDS)
def test_binary_elementwise_broadcasting(shapes, dtypes, seed):
    rng = np.random.default_rng(seed)
    (sa, sb), (da, db) = shapes.input_shapes, dtypes
    ints = np.dtype(da).kind == "i" or np.dtype(db).kind == "i"
    ops = [op for op in BINARY if not (op[3] and ints)]
    a, b = values(rng, sa, da), values(rng, sb, db, "nonzero")
    check(("binary", ints), lambda x, y: [f(x, y) for _, f, _, _ in ops],
          lambda x, y: [g(x, y) for _, _, g, _ in ops], [a, b], exact=True)


UNARY = [  # name, geon, numpy, domain, float only
    ("negative", operator_or(lambda a: -a, be.np.negative), np.negative, "real", False),
    ("absolute", operator_or(abs, be.np.absolute), np.absolute, "real", False),
    ("sign", be.np.sign, np.sign, "real", False),
    ("square", be.np.square, np.square, "real", False),
    ("sqrt", lambda a: be.np.sqrt(be.np.absolute(a)), lambda a: np.sqrt(np.abs(a)), "real",
     True),
    ("reciprocal", be.np.reciprocal, np.reciprocal, "nonzero", True),
    ("exp", be.np.exp, np.exp, "real", True),
    ("log", lambda a: be.np.log(be.np.absolute(a)), lambda a: np.log(np.abs(a)), "nonzero",
     True),
    ("sin", be.np.sin, np.sin, "real", True),
    ("cos", be.np.cos, np.cos, "real", True),
    ("tanh", be.np.tanh, np.tanh, "real", True),
    ("scalar arithmetic", lambda a: 2 * a - 1, lambda a: 2 * a - 1, "real", False),
    ("float scalar", lambda a: a * 0.5 + 1.5, lambda a: a * 0.5 + 1.5, "real", False),
]


@CASES
@given(shape=hnp.array_shapes(min_dims=0, max_dims=4, min_side=1, max_side=4),
       dtype=st.sampled_from(FLOATS + ["int64"]), seed=SEEDS)
def test_unary_elementwise(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    ints = np.dtype(dtype).kind == "i"
    ops = [op for op in UNARY if not (op[4] and ints)]
    a = values(rng, shape, dtype, "nonzero")
    check(("unary", ints), lambda x: [f(x) for _, f, *_ in ops],
          lambda x: [g(x) for _, _, g, *_ in ops], [a],
          exact=ints)


@CASES
@given(shapes=hnp.mutually_broadcastable_shapes(num_shapes=3, min_dims=0, max_dims=3,
                                                min_side=1, max_side=4),
       dtype=st.sampled_from(FLOATS), seed=SEEDS)
def test_where_and_clip(shapes, dtype, seed):
    rng = np.random.default_rng(seed)
    c, a, b = (values(rng, s, dtype) for s in shapes.input_shapes)
    lo = np.minimum(a, b)
    hi = np.maximum(a, b)
    check("where/clip",
          lambda c_, a_, b_: [be.np.where(c_ > 0, a_, b_), be.np.where(c_, a_, 0.5),
                              be.np.clip(c_, be.np.minimum(a_, b_), be.np.maximum(a_, b_)),
                              be.np.clip(c_, -0.5, None), be.np.clip(c_, None, 0.25)],
          lambda c_, a_, b_: [np.where(c_ > 0, a_, b_), np.where(c_, a_, 0.5),
                              np.clip(c_, lo, hi), np.clip(c_, -0.5, None),
                              np.clip(c_, None, 0.25)],
          [c, a, b], exact=True)


# --- reductions ---------------------------------------------------------------------------

@st.composite
def reduction_case(draw):
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=4, min_side=1, max_side=4))
    n = len(shape)
    if not n:
        return shape, draw(st.sampled_from([None, ()])), draw(st.booleans())
    axis = draw(st.one_of(
        st.none(),
        st.integers(-n, n - 1),
        st.lists(st.integers(0, n - 1), unique=True, max_size=n).map(
            lambda xs: tuple(x - n if i % 2 else x for i, x in enumerate(xs)))))
    return shape, axis, draw(st.booleans())


@CASES
@given(case=reduction_case(), dtype=st.sampled_from(FLOATS + ["int64", "int32"]),
       seed=SEEDS)
def test_reductions(case, dtype, seed):
    shape, axis, keepdims = case
    rng = np.random.default_rng(seed)
    a = values(rng, shape, dtype, "nonzero")
    # Distinct values so that argmax / argmin do not depend on tie-breaking order.
    a = (a + np.arange(a.size).reshape(shape) * (1 / 1024)).astype(dtype) \
        if np.dtype(dtype).kind == "f" else a
    single = axis if not isinstance(axis, tuple) else None
    kw = dict(axis=axis, keepdims=keepdims)
    check(("reduce", axis, keepdims),
          lambda x: [be.np.sum(x, **kw), be.np.mean(x, **kw), be.np.max(x, **kw),
                     be.np.min(x, **kw), be.np.prod(x, **kw),
                     be.np.argmax(x, axis=single, keepdims=keepdims),
                     be.np.argmin(x, axis=single, keepdims=keepdims)],
          lambda x: [np.sum(x, **kw), np.mean(x, **kw), np.max(x, **kw), np.min(x, **kw),
                     np.prod(x, **kw), np.argmax(x, axis=single, keepdims=keepdims),
                     np.argmin(x, axis=single, keepdims=keepdims)],
          [a])


# --- products -----------------------------------------------------------------------------

@st.composite
def product_case(draw):
    kind = draw(st.sampled_from(["dot", "matmul"]))
    na = draw(st.integers(1, 4 if kind == "matmul" else 3))
    nb = draw(st.integers(1, 4 if kind == "matmul" else 3))
    side = st.integers(1, 4)
    k = draw(side)
    if kind == "dot":
        sa = tuple(draw(side) for _ in range(na - 1)) + (k,)
        sb = (k,) if nb == 1 else tuple(draw(side) for _ in range(nb - 2)) + (k, draw(side))
        return kind, sa, sb
    batch = draw(hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=2,
                                                   min_side=1, max_side=3)).input_shapes
    sa = (k,) if na == 1 else batch[0][:_bmax(na)] + (draw(side), k)
    sb = (k,) if nb == 1 else batch[1][:_bmax(nb)] + (k, draw(side))
    return kind, sa, sb


def _bmax(n):
    return max(n - 2, 0)


@CASES
@given(case=product_case(), dtype=st.sampled_from(FLOATS), seed=SEEDS)
def test_dot_and_matmul(case, dtype, seed):
    kind, sa, sb = case
    rng = np.random.default_rng(seed)
    a, b = values(rng, sa, dtype), values(rng, sb, dtype)
    if kind == "dot":
        check("dot", lambda x, y: [be.np.dot(x, y)], lambda x, y: [np.dot(x, y)], [a, b])
    else:
        check("matmul", lambda x, y: [x @ y, be.np.matmul(x, y)],
              lambda x, y: [x @ y, np.matmul(x, y)], [a, b])


# --- shapes ---------------------------------------------------------------------------------

@st.composite
def shape_case(draw):
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=4))
    n = len(shape)
    perm = tuple(draw(st.permutations(range(n))))
    size = int(np.prod(shape))
    # a new shape: the size split into factors, one of them maybe -1
    factors, rest = [], size
    while rest > 1 and len(factors) < 3:
        divisors = [d for d in range(2, rest + 1) if rest % d == 0]
        d = draw(st.sampled_from(divisors))
        factors.append(d)
        rest //= d
    new = tuple(factors) + ((rest,) if rest > 1 else ())
    new = new or (1,)
    if draw(st.booleans()):
        i = draw(st.integers(0, len(new) - 1))
        new = new[:i] + (-1,) + new[i + 1:]
    expand = draw(st.integers(-n - 1, n))
    unit = tuple(i for i, s in enumerate(shape) if s == 1)
    squeeze = draw(st.sampled_from([None] + [u for u in unit] + [unit] if unit else [None]))
    swap = (draw(st.integers(-n, n - 1)), draw(st.integers(-n, n - 1)))
    target = draw(hnp.broadcastable_shapes(shape, min_dims=n, max_dims=n + 1, min_side=1,
                                           max_side=4))
    target = tuple(t if s == 1 else s for t, s in zip(target[-n:], shape))
    target = (draw(st.integers(1, 3)),) + target if draw(st.booleans()) else target
    return shape, perm, new, expand, squeeze, swap, target


@CASES
@given(case=shape_case(), dtype=st.sampled_from(FLOATS + ["int64"]), seed=SEEDS)
def test_shape_ops(case, dtype, seed):
    shape, perm, new, expand, squeeze, swap, target = case
    rng = np.random.default_rng(seed)
    a = values(rng, shape, dtype)
    check(("shape", perm, new, expand, squeeze, swap, target),
          lambda x: [be.np.reshape(x, new), be.np.transpose(x, perm), x.T,
                     be.np.expand_dims(x, expand), be.np.squeeze(x, squeeze),
                     be.np.swapaxes(x, *swap), be.np.broadcast_to(x, target),
                     be.np.ravel(be.np.transpose(x, perm)),
                     be.np.reshape(be.np.transpose(x, perm), new) * 2],
          lambda x: [np.reshape(x, new), np.transpose(x, perm), x.T,
                     np.expand_dims(x, expand), np.squeeze(x, squeeze),
                     np.swapaxes(x, *swap), np.broadcast_to(x, target),
                     np.ravel(np.transpose(x, perm)),
                     np.reshape(np.transpose(x, perm), new) * 2],
          [a], exact=True)


@st.composite
def join_case(draw):
    base = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=3))
    n = len(base)
    axis = draw(st.integers(-n, n - 1))
    k = draw(st.integers(1, 3))
    shapes = [base[:axis % n] + (draw(st.integers(1, 3)),) + base[axis % n + 1:]
              for _ in range(k)]
    return shapes, axis, draw(st.integers(-n - 1, n))


@CASES
@given(case=join_case(), dtypes=st.lists(st.sampled_from(FLOATS), min_size=3, max_size=3),
       seed=SEEDS)
def test_concatenate_and_stack(case, dtypes, seed):
    shapes, axis, stack_axis = case
    rng = np.random.default_rng(seed)
    arrays = [values(rng, s, d) for s, d in zip(shapes, dtypes)]
    same = [values(rng, shapes[0], dtypes[i]) for i in range(len(shapes))]
    k = len(arrays)
    check(("join", axis, stack_axis),
          lambda *xs: [be.np.concatenate(xs[:k], axis=axis),
                       be.np.stack(xs[k:], axis=stack_axis)],
          lambda *xs: [np.concatenate(xs[:k], axis=axis), np.stack(xs[k:], axis=stack_axis)],
          arrays + same, exact=True)


@st.composite
def index_case(draw):
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=5))
    key = draw(hnp.basic_indices(shape, min_dims=0, allow_newaxis=True,
                                 allow_ellipsis=True))
    return shape, key


@CASES
@given(case=index_case(), dtype=st.sampled_from(FLOATS + ["int64"]), seed=SEEDS)
def test_getitem_basic_indexing(case, dtype, seed):
    shape, key = case
    rng = np.random.default_rng(seed)
    a = values(rng, shape, dtype)
    check(("getitem", repr(key)), lambda x: [x[key] * 1], lambda x: [x[key] * 1], [a],
          exact=True)


# --- derivatives: the float64 checker on every group -------------------------------------

def grad_inputs(rng, shapes, domain="nonzero"):
    # Away from kinks (|x| >= 0.5) and ties (distinct offsets).
    out = []
    for s in shapes:
        v = rng.uniform(0.5, 2.0, s) * rng.choice([-1.0, 1.0], s)
        v = v + np.arange(v.size).reshape(s) * 1e-3
        out.append((canonical_axes(s), np.abs(v) if domain == "positive" else v))
    return out


@GRADS
@given(shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3,
                                                min_side=1, max_side=3), seed=SEEDS)
def test_gradients_elementwise(shapes, seed):
    rng = np.random.default_rng(seed)
    inputs = grad_inputs(rng, shapes.input_shapes)

    def build(a, b):
        return (a * b - be.np.maximum(a, b) / b + be.np.power(be.np.absolute(a), b)
                + be.np.tanh(a) * be.np.exp(-b) + be.np.where(a > b, be.np.log(
                    be.np.absolute(b)), be.np.sqrt(be.np.absolute(a)))
                + be.np.clip(a, -1.0, 1.0))
    assert_gradcheck(build, inputs)


@GRADS
@given(case=reduction_case(), seed=SEEDS)
def test_gradients_reductions(case, seed):
    shape, axis, keepdims = case
    rng = np.random.default_rng(seed)
    kw = dict(axis=axis, keepdims=keepdims)

    def build(x):
        return (be.np.sum(x * x, **kw) + be.np.mean(x, **kw) + be.np.max(x, **kw)
                - be.np.min(x, **kw) + be.np.prod(x, **kw))
    assert_gradcheck(build, grad_inputs(rng, [shape]))


@GRADS
@given(case=product_case(), seed=SEEDS)
def test_gradients_products(case, seed):
    kind, sa, sb = case
    rng = np.random.default_rng(seed)
    assert_gradcheck(be.np.dot if kind == "dot" else be.np.matmul,
                     grad_inputs(rng, [sa, sb]))


@GRADS
@given(case=shape_case(), seed=SEEDS)
def test_gradients_shapes(case, seed):
    shape, perm, new, expand, squeeze, swap, target = case
    rng = np.random.default_rng(seed)

    def build(x):
        y = be.np.reshape(be.np.transpose(x, perm), new)
        return (be.np.sum(y * y) + be.np.sum(be.np.tanh(be.np.expand_dims(x, expand)))
                + be.np.sum(be.np.swapaxes(x, *swap) ** 3)
                + be.np.sum(be.np.broadcast_to(x, target) * 2.0)
                + be.np.sum(be.np.exp(be.np.squeeze(x, squeeze))))
    assert_gradcheck(build, grad_inputs(rng, [shape]))


@GRADS
@given(case=join_case(), key=st.data(), seed=SEEDS)
def test_gradients_join_and_index(case, key, seed):
    shapes, axis, stack_axis = case
    rng = np.random.default_rng(seed)
    index = key.draw(hnp.basic_indices(shapes[0], allow_newaxis=True, allow_ellipsis=True))

    def build(*xs):
        c = be.np.concatenate(xs, axis=axis)
        s = be.np.stack([xs[0], xs[0] * 2.0], axis=stack_axis)
        return be.np.sum(c * c) + be.np.sum(be.np.sin(s)) + be.np.sum(xs[0][index] ** 2)
    assert_gradcheck(build, grad_inputs(rng, shapes))


# --- the rest: one path, families, dtypes, errors ----------------------------------------------

def test_lowered_to_the_standard_primitives():
    """No second execution path: NumPy-family graphs lower to the same base set."""
    x = be.np.placeholder((3, 4), name="x")
    w = be.np.variable(np.ones((4, 2), np.float32), name="w")
    y = be.np.where(x > 0, x, 0.0) @ w
    cost = be.np.mean(be.np.concatenate([y, y[:, :1]], axis=1) ** 2)
    grads = be.deriv(cost, w)
    comp = be.NumPyTransformer().computation([cost, grads], x)
    kinds = {type(op) for op in comp.ops}
    # (UnsliceAdd: the concatenation's sum, made by the NumPy transformer's own pass
    # from the standard ops)
    assert kinds <= STANDARD_BASE_SET | {Select, UnsliceAdd}, kinds - STANDARD_BASE_SET
    assert Select in kinds and "np.where(" in comp.source


def test_tensors_are_ordinary_ops_with_positional_axes():
    x = be.np.placeholder((2, 3), name="x")
    assert isinstance(x, be.Placeholder) and family(x) == "numpy"
    assert [a.name for a in x.axes] == ["-2", "-1"]
    assert all(isinstance(a, PositionalAxis) for a in x.axes)
    assert be.np.shape(x) == (2, 3) and be.np.ndim(x) == 2
    assert x.dtype == np.float32
    v = be.np.variable(np.zeros((3,), np.float64))
    assert v.dtype == np.float64 and be.np.shape(v) == (3,)
    assert be.np.variable(1.0, shape=(2,)).dtype == np.float32
    assert be.np.constant([1, 2]).dtype == np.int64
    assert be.np.zeros((2, 2)).dtype == np.float32
    s = be.np.sum(x)
    assert family(s) == "scalar" and s.axes == be.Axes()


def test_numpy_dtype_rules():
    i = be.np.placeholder((3,), dtype=np.int64)
    i32 = be.np.placeholder((3,), dtype=np.int32)
    f = be.np.placeholder((3,), dtype=np.float32)
    assert (i / i).dtype == np.float64              # true division of integers
    assert be.np.sqrt(i).dtype == np.float64
    assert (-i).dtype == np.int64                   # stays integer, as in NumPy
    assert (i + 1).dtype == np.int64 and (i + 1.5).dtype == np.float64
    assert (f + 1.5).dtype == np.float32 and (f * i32).dtype == np.float64
    assert be.np.sum(i32).dtype == np.int64 and be.np.max(i32).dtype == np.int32
    assert be.np.mean(i).dtype == np.float64 and be.np.argmax(f).dtype == np.int64
    assert (f < i).dtype == np.float64              # comparisons: 1.0 / 0.0 floats


def test_iteration_and_item_access():
    x = be.np.constant(np.arange(6.0).reshape(2, 3))
    rows = list(x)
    assert len(rows) == 2
    assert np.array_equal(be.evaluate(rows[1]), [3.0, 4.0, 5.0])
    with pytest.raises(IndexError, match="out of bounds"):
        x[2]
    with pytest.raises(IndexError, match="too many indices"):
        x[0, 0, 0]
    with pytest.raises(TypeError, match="basic indexing"):
        x[[0, 1]]


def test_forward_mode_and_hessian_vector_products():
    x = be.np.placeholder((2, 3), dtype=np.float64, name="x")
    y = be.np.sum(be.np.tanh(x @ be.np.constant(np.ones((3, 2)))), axis=0)
    X = np.linspace(-1, 1, 6).reshape(2, 3)
    V = np.ones((2, 3))
    t = be.evaluate(be.jvp(y, x, V), feeds={x: X})
    eps = 1e-6
    f = be.NumPyTransformer().computation(y, x)
    numeric = (f(X + eps * V) - f(X - eps * V)) / (2 * eps)
    assert np.allclose(t, numeric, rtol=1e-7)
    h = be.evaluate(be.hvp(be.np.sum(be.np.exp(x)), x, V), feeds={x: X})
    assert np.allclose(h, np.exp(X), rtol=1e-12)


@pytest.mark.parametrize("build, message", [
    (lambda x, y: x + y, r"could not be broadcast together with shapes \(2, 3\) \(4,\)"),
    (lambda x, y: be.np.dot(x, y), r"not aligned"),
    (lambda x, y: x @ y, r"mismatch in its core dimension"),
    (lambda x, y: be.np.sum(x, axis=2), r"axis 2 is out of bounds for array of dimension 2"),
    (lambda x, y: be.np.reshape(x, (4, 2)), r"cannot reshape array of size 6"),
    (lambda x, y: be.np.squeeze(x, 0), r"size not equal to one"),
    (lambda x, y: be.np.concatenate([x, y]), r"same number of dimensions"),
    (lambda x, y: be.np.stack([x, x.T]), r"same shape"),
    (lambda x, y: be.np.transpose(x, (0, 0)), r"don't match"),
    (lambda x, y: be.np.broadcast_to(x, (3, 3)), r"cannot broadcast"),
])
def test_errors_follow_numpy(build, message):
    x = be.np.placeholder((2, 3), name="x")
    y = be.np.placeholder((4,), name="y")
    with pytest.raises((ValueError, IndexError, TypeError), match=message):
        build(x, y)
