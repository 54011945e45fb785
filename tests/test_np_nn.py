"""The newer ``be.np`` ops (activations, log-softmax, pad, tile, take, cumsum, sort,
top-k) on random shapes drawn by hypothesis, against NumPy and PyTorch, through the
NumPy transformer and the reference evaluator; then float64 gradient checks on a few
random shapes. Also the build-time errors of their Axes-family forms."""

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import geon as be
from gradcheck import assert_gradcheck
from test_np_family import FLOATS, SEEDS, check, values

torch = pytest.importorskip("torch")
TF = torch.nn.functional

QUICK = settings(max_examples=50, derandomize=True, deadline=None, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
GRADS = settings(QUICK, max_examples=8)
SHAPES = hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=5)


def t(fn):
    """``fn`` of torch tensors as a function of float arrays (float64 in torch, the
    result cast back to the input's dtype: the reference is exact to that precision)."""
    def f(*xs):
        out = fn(*[torch.from_numpy(np.asarray(x, np.float64)) for x in xs])
        return out.numpy().astype(xs[0].dtype)
    return f


ACTIVATIONS = [
    ("erf", be.np.erf, torch.erf),
    ("expm1", be.np.expm1, torch.expm1),
    ("softplus", be.np.softplus, TF.softplus),
    ("relu", be.np.relu, TF.relu),
    ("leaky_relu", lambda x: be.np.leaky_relu(x, 0.2), lambda x: TF.leaky_relu(x, 0.2)),
    ("elu", be.np.elu, TF.elu),
    ("selu", be.np.selu, TF.selu),
    ("gelu", be.np.gelu, TF.gelu),
    ("gelu_tanh", lambda x: be.np.gelu(x, "tanh"), lambda x: TF.gelu(x, approximate="tanh")),
    ("silu", be.np.silu, TF.silu),
    ("hard_sigmoid", be.np.hard_sigmoid, TF.hardsigmoid),
]


@QUICK
@given(st.sampled_from(ACTIVATIONS), SHAPES, st.sampled_from(FLOATS), SEEDS)
def test_activations(act, shape, dtype, seed):
    name, fn, ref = act
    x = values(np.random.default_rng(seed), shape, dtype) * 2.0
    check(name, lambda a: [fn(a)], lambda a: [t(ref)(a)], [x])


def test_erf_against_math_erf():
    # float64 to ~1e-15 relative over the whole range (series, continued fraction,
    # saturation), math.erf as the oracle
    xs = np.concatenate([np.linspace(-7.0, 7.0, 20001), np.logspace(-300, 1, 400),
                         -np.logspace(-20, 1, 200), [0.0, 2.5, np.nextafter(2.5, 0), 30.0]])
    got = be.NumPyTransformer().computation(be.np.erf(p := be.np.placeholder(
        xs.shape, dtype=np.float64)), p)(xs)
    want = np.array([math.erf(v) for v in xs])
    assert np.max(np.abs(got - want) / np.maximum(np.abs(want), 1e-300)) < 2e-15


@QUICK
@given(SHAPES, st.data(), st.sampled_from(FLOATS), SEEDS)
def test_log_softmax_and_logsumexp(shape, data, dtype, seed):
    x = values(np.random.default_rng(seed), shape, dtype) * 20.0  # large logits
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    keep = data.draw(st.booleans())
    check(("lsm", axis, keep),
          lambda a: [be.np.log_softmax(a, axis), be.np.logsumexp(a, axis, keepdims=keep),
                     be.np.logsumexp(a)],
          lambda a: [t(lambda v: torch.log_softmax(v, axis))(a),
                     t(lambda v: torch.logsumexp(v, axis, keepdim=keep))(a),
                     t(lambda v: torch.logsumexp(v.reshape(-1), 0))(a)], [x])


@QUICK
@given(SHAPES, st.data(), st.sampled_from(["constant", "reflect", "edge"]),
       st.sampled_from(FLOATS), SEEDS)
def test_pad(shape, data, mode, dtype, seed):
    x = values(np.random.default_rng(seed), shape, dtype)
    top = [n - 1 if mode == "reflect" else 3 for n in shape]
    widths = tuple((data.draw(st.integers(0, m)), data.draw(st.integers(0, m))) for m in top)
    kw = {"constant_values": 1.5} if mode == "constant" else {}
    check(("pad", widths, mode), lambda a: [be.np.pad(a, widths, mode, **kw)],
          lambda a: [np.pad(a, widths, mode, **kw)], [x], exact=True)


@QUICK
@given(SHAPES, st.lists(st.integers(1, 3), min_size=1, max_size=4),
       st.sampled_from(FLOATS), SEEDS)
def test_tile(shape, reps, dtype, seed):
    x = values(np.random.default_rng(seed), shape, dtype)
    reps = tuple(reps)
    check(("tile", reps), lambda a: [be.np.tile(a, reps)], lambda a: [np.tile(a, reps)], [x],
          exact=True)


@QUICK
@given(SHAPES, hnp.array_shapes(min_dims=0, max_dims=2, min_side=1, max_side=4), st.data(),
       st.sampled_from(FLOATS), SEEDS)
def test_take(shape, ishape, data, dtype, seed):
    rng = np.random.default_rng(seed)
    x = values(rng, shape, dtype)
    axis = data.draw(st.one_of(st.none(), st.integers(-len(shape), len(shape) - 1)))
    n = x.size if axis is None else shape[axis]
    idx = rng.integers(-n, n, size=ishape)
    check(("take", axis), lambda a, i: [be.np.take(a, i, axis)],
          lambda a, i: [np.take(a, i, axis)], [x, idx], exact=True)


@QUICK
@given(SHAPES, st.data(), st.sampled_from(FLOATS), SEEDS)
def test_cumsum_sort_topk(shape, data, dtype, seed):
    x = values(np.random.default_rng(seed), shape, dtype)  # multiples of 1/8: ties
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    k = data.draw(st.integers(1, shape[axis]))

    def topk(a):
        v, i = torch.topk(torch.from_numpy(a), k, axis)
        return v.numpy(), i.numpy()
    check(("scan", axis, k),
          lambda a: [be.np.cumsum(a, axis), be.np.cumsum(a), be.np.sort(a, axis),
                     be.np.topk(a, k, axis)[0]],
          lambda a: [np.cumsum(a, axis, dtype=a.dtype), np.cumsum(a, dtype=a.dtype),
                     np.sort(a, axis), topk(a)[0]], [x])
    # argsort in a computation of its own: two multi-output ops merged by CSE lose the
    # outputs of the one removed (a CSE bug outside this change, reported)
    check(("argsort", axis), lambda a: [be.np.argsort(a, axis)],
          lambda a: [np.argsort(a, axis, kind="stable")], [x])


@GRADS
@given(SHAPES, st.data(), SEEDS)
def test_gradients(shape, data, seed):
    rng = np.random.default_rng(seed)
    x = rng.permutation(int(np.prod(shape))).reshape(shape) * 0.37 - 1.1  # no ties
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    k = data.draw(st.integers(1, shape[axis]))
    idx = rng.integers(-shape[axis], shape[axis], size=(3,))
    builds = [lambda a: be.np.log_softmax(a, axis), lambda a: be.np.logsumexp(a, axis),
              lambda a: be.np.pad(a, 1, "edge"), lambda a: be.np.pad(a, 2, "constant"),
              lambda a: be.np.tile(a, (2, 1)), lambda a: be.np.take(a, idx, axis),
              lambda a: be.np.cumsum(a, axis), lambda a: be.np.sort(a, axis),
              lambda a: be.np.topk(a, k, axis)[0], lambda a: be.np.gelu(a)]
    build = data.draw(st.sampled_from(builds))
    axes = be.np.placeholder(shape, dtype=np.float64).axes
    assert_gradcheck(build, [(axes, x)])


# --- build-time errors of the Axes-family forms ----------------------------------------
C, H, W = be.Axis(3, "C"), be.Axis(4, "H"), be.Axis(2, "W")


def test_concat_mismatch_names_axes_and_line():
    a, b = be.placeholder((C, H)), be.placeholder((W, H))
    with pytest.raises(be.AxisMismatchError, match=r"concat: .*C:3, H:4.*W:2, H:4.*"
                                                   r"test_np_nn\.py\", line \d+"):
        be.concat([a, b], [H, W])


def test_gather_refuses_float_indices_and_clashing_axes():
    x = be.placeholder((C, H))
    with pytest.raises(be.AxisMismatchError, match="indices .* must be integers"):
        be.gather(x, be.placeholder((W,)), H)
    with pytest.raises(be.AxisMismatchError, match=r"C:3.*test_np_nn\.py"):
        be.gather(x, be.placeholder((C,), dtype=np.int64), H)


def test_gather_one_python_int_index_removes_the_axis():
    x = be.placeholder((C, H), dtype=np.float64)
    y = be.gather(x, -1, H)
    assert y.axes.names == ("C",)
    v = np.arange(12.0).reshape(3, 4)
    np.testing.assert_array_equal(be.NumPyTransformer().computation(y, x)(v), v[:, -1])


def test_out_of_range_index_raises_when_run():
    x, i = be.placeholder((C, H)), be.placeholder((W,), dtype=np.int64)
    comp = be.NumPyTransformer().computation(be.gather(x, i, H), x, i)
    with pytest.raises(be.IndexOutOfRangeError, match="index 4 is out of range .* 4"):
        comp(np.zeros((3, 4), np.float32), np.array([0, 4]))
    with pytest.raises(be.IndexOutOfRangeError, match="index -5 is out of range"):
        be.evaluate(be.gather(x, i, H), feeds={x: np.zeros((3, 4)), i: np.array([0, -5])})


def test_reflect_pad_longer_than_the_axis_and_topk_k():
    x = be.placeholder((C, H))
    with pytest.raises(be.AxisMismatchError, match="reflect padding"):
        be.pad(x, {C: (3, 0)}, mode="reflect")
    with pytest.raises(be.AxisMismatchError, match="k = 5"):
        be.topk(x, 5, H)


def test_two_pads_and_tiles_of_one_tensor_serialize():
    # every axis they make is named with its length, so one graph never holds two
    # axes of one name (a serialized graph requires it)
    x = be.placeholder((C, H), dtype=np.float64)
    ys = [be.pad(x, {H: (1, 0)}, mode="edge"), be.pad(x, {H: (2, 0)}, mode="edge"),
          be.tile(x, {C: 2}), be.tile(x, {C: 3})]
    loaded = be.deserialize_graph(be.serialize(ys))
    v = np.arange(12.0).reshape(3, 4)
    got = be.NumPyTransformer().computation(loaded.value, *[
        o for o in loaded.ops if isinstance(o, be.Placeholder)])(v)
    want = [np.pad(v, ((0, 0), (1, 0)), mode="edge"), np.pad(v, ((0, 0), (2, 0)), mode="edge"),
            np.tile(v, (2, 1)), np.tile(v, (3, 1))]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint64, np.int8, np.int64])
def test_descending_sorts_of_integers_at_the_extremes(dtype):
    # Descending sorts reverse the order before an ascending sort; ``0 - x`` did that
    # wrongly for unsigned values (uint64 top-k was wrong) and overflowed at the
    # smallest signed value.
    info = np.iinfo(dtype)
    X = np.array([0, info.max, 3, info.min, 7, info.max], dtype=dtype)
    H, K = be.Axis(len(X), "H"), be.Axis(4, "K")
    x = be.placeholder((H,), dtype=dtype)
    v, i = be.topk(x, 4, H, K)
    s = be.sort(x, H, descending=True)
    got_v, got_i, got_s = be.NumPyTransformer().computation([v, i, s], x)(X)
    want = np.argsort(-X.astype(np.float64), kind="stable")
    np.testing.assert_array_equal(got_s, X[want])
    np.testing.assert_array_equal(got_v, X[want[:4]])
    np.testing.assert_array_equal(got_i, want[:4])
