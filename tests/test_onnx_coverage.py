"""The ONNX operators beyond the required core (``conformance.EXPORTED`` and ``ADDED``,
built in geon/frontends/onnx/builders/): every node
test case onnx ships for them against the committed table; each op against ONNX's
reference evaluator or NumPy on values that reach its edge cases (signed zeros, halves,
NaN and infinities, 64-bit integers past float64's precision, repeated and negative
indices); their derivatives; and a PyTorch module using ``nn.Hardswish``, a masked
attention with ``torch.isnan`` / ``torch.where`` and index assignment, exported by
``torch.onnx.export`` and imported."""

import io
import json
import warnings
from pathlib import Path

import numpy as np
import pytest

import geon as be
from geon.errors import IndexOutOfRangeError

try:
    import onnx
    from onnx import TensorProto, helper, numpy_helper
except ImportError:
    pytest.skip("the ONNX frontend tests need the onnx package (pip install onnx)",
                allow_module_level=True)

import geon.frontends.onnx as gx  # noqa: E402
from geon.frontends.onnx import conformance  # noqa: E402

DOC = Path(__file__).resolve().parent.parent / "doc"
RNG = np.random.default_rng(7)


def _elem(dtype):
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def _model(op, inputs, attrs=None, opset=22, outputs=1, out_dtype=None, inits=()):
    """A one-node model of ``op`` over ``inputs`` ({name: array}; those in ``inits`` are
    initializers, known at import)."""
    names = list(inputs)
    node = helper.make_node(op, names, [f"y{k}" for k in range(outputs)], **(attrs or {}))
    first = next(iter(inputs.values()))
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, _elem(a.dtype), list(a.shape))
         for n, a in inputs.items() if n not in inits],
        [helper.make_tensor_value_info(f"y{k}", _elem(out_dtype or first.dtype), None)
         for k in range(outputs)],
        initializer=[numpy_helper.from_array(inputs[n], n) for n in inits])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _run(model, inputs, inits=()):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # onnx's reference warns on NaN, as NumPy does
        f = gx.import_model(model).computation()
        return f(*[a for n, a in inputs.items() if n not in inits])


def _reference(model, inputs):
    from onnx.reference import ReferenceEvaluator
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return ReferenceEvaluator(model).run(None, inputs)


def _same(got, want, rtol=0.0, atol=0.0):
    """Equal values (floats within rtol/atol), NaN where NaN, the sign of every zero."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.dtype, want.dtype)
    if want.dtype.kind != "f":
        np.testing.assert_array_equal(got, want)
        return
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    g, w = got[~nan].astype(np.float64), want[~nan].astype(np.float64)
    assert np.array_equal(g == 0, w == 0) and np.array_equal(
        np.signbit(g[w == 0]), np.signbit(w[w == 0])), "signed zeros differ"
    np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


def _edges(dtype, n=400, scale=4.0):
    fi = np.finfo(dtype)
    special = [0.0, -0.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 1.0, -1.0, 3.0, -3.0,
               fi.max, -fi.max, fi.tiny, np.inf, -np.inf, np.nan]
    return np.concatenate([RNG.standard_normal(n) * scale, special]).astype(dtype)


# --- the conformance table ---------------------------------------------------------------

def test_added_operators_match_the_committed_table():
    """Every node test case of the operators this file covers (and of those exporters
    emit, ``conformance.EXPORTED``) has the status the committed table gives it, and
    the issue's four operators pass every case."""
    table = json.loads((DOC / "onnx_conformance.json").read_text(encoding="utf-8"))
    ops = set(conformance.EXPORTED) | set(conformance.ADDED)
    got = conformance.run(ops)
    names = {n for n, (op, _, _) in table.items() if op in ops}
    assert set(got) == names and len(names) >= 300
    changed = {n: (table[n][1], got[n][1], got[n][2]) for n in names
               if got[n][1] != table[n][1]}
    assert not changed, f"status changed (committed, now, reason): {changed}"
    for op in ("HardSwish", "ScatterND", "IsNaN", "IsInf"):
        cases = [s for o, s, _ in got.values() if o == op]
        assert cases and all(s == "passed" for s in cases), op


def test_the_table_lists_what_is_left_and_why():
    text = (DOC / "onnx_operators.txt").read_text(encoding="utf-8")
    assert "What is left, and why" in text
    table = json.loads((DOC / "onnx_conformance.json").read_text(encoding="utf-8"))
    left = {op for op, s, _ in table.values() if s != "passed"}
    for op in left:  # every operator with a case that does not pass has its reason
        assert f"``{op}``" in text.split("What is left, and why")[1], op


# --- activations --------------------------------------------------------------------------

@pytest.mark.parametrize("op,attrs,opset", [
    ("HardSwish", {}, 14), ("HardSwish", {}, 22), ("Mish", {}, 18), ("Softsign", {}, 13),
    ("Celu", {"alpha": 0.5}, 12), ("Swish", {"alpha": 0.7}, 24),
    ("Shrink", {"lambd": 1.5, "bias": 0.25}, 9), ("ThresholdedRelu", {"alpha": 0.5}, 10),
    ("IsNaN", {}, 20), ("IsNaN", {}, 9),
    ("IsInf", {}, 20), ("IsInf", {"detect_negative": 0}, 10),
    ("IsInf", {"detect_positive": 0}, 10),
    ("IsInf", {"detect_positive": 0, "detect_negative": 0}, 10)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_elementwise_ops_equal_onnx_reference(op, attrs, opset, dtype):
    """float16 against the reference in float32, rounded once (geon computes these in
    float32 too)."""
    x = _edges(dtype)
    boolean = op.startswith("Is")
    m = _model(op, {"x": x}, attrs, opset, out_dtype=np.bool_ if boolean else None)
    if dtype == np.float16 and not boolean:
        x32 = x.astype(np.float32)
        want = _reference(_model(op, {"x": x32}, attrs, opset), {"x": x32})[0]
        want = want.astype(np.float16)
    else:
        want = _reference(m, {"x": x})[0]
    _same(_run(m, {"x": x})[0], want, rtol=1e-3 if dtype == np.float16 else 1e-6, atol=1e-6)


def test_shrink_of_integers_and_prelu_broadcast_equal_reference():
    x = RNG.integers(-20, 20, (3, 7)).astype(np.int32)
    m = _model("Shrink", {"x": x}, {"lambd": 2.0, "bias": 1.5}, 9)
    _same(_run(m, {"x": x})[0], _reference(m, {"x": x})[0])
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    slope = RNG.standard_normal(4).astype(np.float32)
    m = _model("PRelu", {"x": x, "slope": slope}, opset=16, inits=("slope",))
    _same(_run(m, {"x": x, "slope": slope}, inits=("slope",))[0],
          _reference(m, {"x": x, "slope": slope})[0], rtol=1e-6)


@pytest.mark.parametrize("opset,axis", [(11, 1), (11, 0), (13, -1), (13, 1)])
def test_hardmax_picks_the_first_maximum(opset, axis):
    """Opset 13 against the reference; before 13 the input is coerced to 2-D at ``axis``
    (the spec's rule, which onnx's reference does not follow): against NumPy."""
    x = RNG.integers(0, 3, (3, 4, 5)).astype(np.float32)   # many ties
    m = _model("Hardmax", {"x": x}, {"axis": axis}, opset)
    if opset >= 13:
        want = _reference(m, {"x": x})[0]
    else:
        flat = x.reshape(int(np.prod(x.shape[:axis])), -1)
        want = np.zeros_like(flat)
        want[np.arange(len(flat)), flat.argmax(1)] = 1
        want = want.reshape(x.shape)
    _same(_run(m, {"x": x})[0], want)


# --- rounding, hyperbolic and inverse trigonometric functions ---------------------------------

@pytest.mark.parametrize("op,fn", [("Floor", np.floor), ("Ceil", np.ceil), ("Round", np.round)])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_rounding_is_exact_with_signed_zeros_and_halves_to_even(op, fn, dtype):
    fi = np.finfo(dtype)
    big = 2.0 ** fi.nmant                       # from here on every value is an integer
    x = np.concatenate([
        RNG.standard_normal(2000) * np.exp2(RNG.integers(-4, fi.nmant + 2, 2000)),
        np.arange(-40, 40) / 4.0,
        [big - 0.5, big + 1, -big + 0.5, big / 2 + 0.5, -big / 2 - 0.5, 0.49999997,
         fi.max, -fi.max, fi.tiny, 0.0, -0.0, np.inf, -np.inf, np.nan]]).astype(dtype)
    m = _model(op, {"x": x}, opset=22 if op == "Round" else 13)
    _same(_run(m, {"x": x})[0], fn(x))


@pytest.mark.parametrize("op,fn", [("Sinh", np.sinh), ("Cosh", np.cosh), ("Tan", np.tan),
                                   ("Asin", np.arcsin), ("Acos", np.arccos),
                                   ("Atan", np.arctan), ("Asinh", np.arcsinh),
                                   ("Acosh", np.arccosh), ("Atanh", np.arctanh)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_hyperbolic_and_inverse_trigonometric_functions(op, fn, dtype):
    """float32 results are NumPy's (computed in float64, rounded once); float64 ones are
    within a few units in the last place, at every magnitude and at the edges."""
    x = np.concatenate([
        RNG.standard_normal(1000) * np.exp2(RNG.integers(-30, 10, 1000)),
        RNG.uniform(-1, 1, 1000),
        1 + np.abs(RNG.standard_normal(300)) * np.exp2(RNG.integers(-40, 4, 300)),
        [0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 30.0, 88.0, 700.0, 711.0, np.inf, -np.inf,
         np.nan]]).astype(dtype)
    (got,) = _run(_model(op, {"x": x}), {"x": x})
    with np.errstate(all="ignore"):
        want = fn(x.astype(np.float64)).astype(dtype)
    _same(got, want, rtol=0.0 if dtype == np.float32 else 1e-15)


# --- remainders ------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint16, np.uint64])
@pytest.mark.parametrize("fmod", [0, 1])
def test_integer_mod_at_run_time_is_exact(dtype, fmod):
    info = np.iinfo(dtype)
    a = RNG.integers(info.min, info.max, 3000, dtype=dtype, endpoint=True)
    b = np.concatenate([RNG.integers(info.min, info.max, 1500, dtype=dtype, endpoint=True),
                        RNG.integers(max(info.min, -40), 40, 1500, dtype=dtype)]).astype(dtype)
    b[b == 0] = 3
    a[:4], b[:4] = [info.min, info.max, info.min, info.max], [1, 1, 7, 7]
    m = _model("Mod", {"a": a, "b": b}, {"fmod": fmod}, 13)
    want = np.fmod(a, b) if fmod else np.mod(a, b)
    _same(_run(m, {"a": a, "b": b})[0], want)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("fmod", [0, 1])
def test_float_mod_at_run_time_is_exact(dtype, fmod):
    """Also for quotients far past 2**53 (a huge dividend, a subnormal divisor), and
    with NumPy's results for zeros, infinities and NaN."""
    fi = np.finfo(dtype)
    a = (RNG.standard_normal(2000) * np.exp2(RNG.integers(-8, 8, 2000))).astype(dtype)
    b = (RNG.standard_normal(2000) * np.exp2(RNG.integers(-8, 8, 2000))).astype(dtype)
    a[:50] = (fi.max * RNG.uniform(-1, 1, 50)).astype(dtype)
    b[:50] = (fi.smallest_subnormal * RNG.integers(1, 30, 50)).astype(dtype)
    a[50:60] = [np.inf, -np.inf, np.nan, 0.0, -0.0, 1.0, -1.0, 5.0, -5.0, 0.0]
    b[50:60] = [1.0, 1.0, 1.0, 2.0, -2.0, np.inf, np.inf, -np.inf, -np.inf, 0.0]
    m = _model("Mod", {"a": a, "b": b}, {"fmod": fmod}, 13 if fmod else 28)
    with np.errstate(all="ignore"):
        want = np.fmod(a, b) if fmod else np.mod(a, b)
    _same(_run(m, {"a": a, "b": b})[0], want)


def test_float64_mod_at_run_time_is_refused_and_known_values_fold():
    a, b = np.array([5.5, -7.25]), np.array([2.0, 3.0])
    with pytest.raises(gx.UnsupportedOnnxOp, match="float64"):
        gx.import_model(_model("Mod", {"a": a, "b": b}, {"fmod": 1}, 13))
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["a"], value=numpy_helper.from_array(a)),
         helper.make_node("Constant", [], ["b"], value=numpy_helper.from_array(b)),
         helper.make_node("Mod", ["a", "b"], ["y"], fmod=1)], "g", [],
        [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [2])])
    g = gx.import_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))
    assert g.inputs == [] and np.array_equal(g.computation()()[0], np.fmod(a, b))


# --- scatters and gathers --------------------------------------------------------------------

def _scatter_nd_case(reduction, dtype=np.float32, dup=False):
    data = (RNG.standard_normal((5, 4, 3)) * 10).astype(dtype)
    if dtype == np.int64:     # past float64's precision: exact only if never in a float
        data = RNG.integers(2 ** 60, 2 ** 62, (5, 4, 3))
    idx = np.array([[[0, 1], [4, -1]], [[-5, 2], [3, 3]]], np.int64)
    if dup:
        idx[1, 1] = [4, 3]    # = [4, -1]: written twice
    upd = (RNG.standard_normal((2, 2, 3)) * 10).astype(dtype) if dtype != np.int64 else \
        RNG.integers(-2 ** 62, 2 ** 62, (2, 2, 3))
    return {"data": data, "idx": idx, "upd": upd}, {"reduction": reduction}


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("known", [False, True], ids=["runtime-indices", "known-indices"])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_scatter_nd_equals_onnx_reference(reduction, known, dtype):
    feeds, attrs = _scatter_nd_case(reduction, dtype)
    inits = ("idx",) if known else ()
    m = _model("ScatterND", feeds, attrs, 18, inits=inits)
    want = _reference(m, feeds)[0]
    if dtype == np.int64 and reduction == "mul":   # the reference wraps around too
        want = want.astype(np.int64)
    _same(_run(m, feeds, inits)[0], want, rtol=1e-6)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_nd_with_repeated_indices(reduction):
    """Known indices are applied in order, as ONNX's reference applies them (for
    ``none`` the last write wins); at run time the reductions combine every update
    (``none`` with repeated indices is undefined in ONNX and is not checked there)."""
    feeds, attrs = _scatter_nd_case(reduction, dup=True)
    for inits in [("idx",)] + ([()] if reduction != "none" else []):
        m = _model("ScatterND", feeds, attrs, 18, inits=inits)
        _same(_run(m, feeds, inits)[0], _reference(m, feeds)[0], rtol=1e-6)


def test_scatter_nd_indices_out_of_range():
    feeds, attrs = _scatter_nd_case("none")
    feeds["idx"] = feeds["idx"].copy()
    feeds["idx"][0, 0, 1] = 4                     # the second dimension has 4
    with pytest.raises(gx.InvalidOnnxModel, match="out of range"):
        gx.import_model(_model("ScatterND", feeds, attrs, 18, inits=("idx",)))
    f = gx.import_model(_model("ScatterND", feeds, attrs, 18)).computation()
    with pytest.raises(IndexOutOfRangeError):
        f(*feeds.values())


def test_scatter_nd_differentiates_in_data_and_updates():
    onnx_model = _model("ScatterND", {"data": np.zeros((5, 3), np.float32),
                                      "idx": np.array([[3], [0]], np.int64),
                                      "upd": np.zeros((2, 3), np.float32)},
                        {}, 16, inits=("idx",))
    g = gx.import_model(onnx_model)
    y = g.outputs[0]
    w = be.np.constant(np.arange(15, dtype=np.float32).reshape(5, 3))
    cost = be.np.sum(y * w)
    dd, du = be.deriv(cost, g.inputs[0]), be.deriv(cost, g.inputs[1])
    got = be.make_transformer("numpy").computation([dd, du], *g.inputs)(
        np.ones((5, 3), np.float32), np.ones((2, 3), np.float32))
    wv = np.arange(15, dtype=np.float32).reshape(5, 3)
    keep = np.ones((5, 1), np.float32)
    keep[[3, 0]] = 0
    np.testing.assert_array_equal(got[0], wv * keep)       # overwritten rows: no gradient
    np.testing.assert_array_equal(got[1], wv[[3, 0]])      # updates: where they went


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("known", [False, True], ids=["runtime-indices", "known-indices"])
def test_scatter_elements_equals_onnx_reference(reduction, known):
    data = RNG.standard_normal((4, 5)).astype(np.float32)
    idx = np.array([[1, -1, 2], [0, 4, -3]], np.int64)
    if reduction != "none":
        idx[1, 2] = idx[1, 1]            # repeated
    upd = RNG.standard_normal((2, 3)).astype(np.float32)
    feeds = {"data": data, "idx": idx, "upd": upd}
    inits = ("idx",) if known else ()
    m = _model("ScatterElements", feeds, {"axis": 1, "reduction": reduction}, 18, inits=inits)
    _same(_run(m, feeds, inits)[0], _reference(m, feeds)[0], rtol=1e-6)


@pytest.mark.parametrize("batch_dims", [0, 1, 2])
@pytest.mark.parametrize("known", [False, True], ids=["runtime-indices", "known-indices"])
def test_gather_nd_equals_onnx_reference(batch_dims, known):
    data = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    k = {0: 2, 1: 2, 2: 1}[batch_dims]
    lead = (2, 3)[:batch_dims]
    dims = data.shape[batch_dims:batch_dims + k]
    idx = np.stack([RNG.integers(-d, d, lead + (3,)) for d in dims], -1).astype(np.int64)
    feeds = {"data": data, "idx": idx}
    inits = ("idx",) if known else ()
    m = _model("GatherND", feeds, {"batch_dims": batch_dims}, 13, inits=inits)
    _same(_run(m, feeds, inits)[0], _reference(m, feeds)[0])


@pytest.mark.parametrize("mode", ["linear", "circular"])
def test_tensor_scatter_writes_the_cache_rows(mode):
    cache = RNG.standard_normal((3, 2, 6, 4)).astype(np.float32)
    upd = RNG.standard_normal((3, 2, 3, 4)).astype(np.float32)
    start = np.array([0, 2, 5 if mode == "circular" else 3], np.int64)
    feeds = {"cache": cache, "upd": upd, "start": start}
    m = _model("TensorScatter", feeds, {"mode": mode, "axis": 2}, 24)
    _same(_run(m, feeds)[0], _reference(m, feeds)[0])


# --- shapes, layouts, normalization, one-hot, einsum ---------------------------------------------

@pytest.mark.parametrize("op,inputs,attrs,opset,inits", [
    ("DepthToSpace", {"x": (2, 8, 3, 2)}, {"blocksize": 2, "mode": "CRD"}, 13, ()),
    ("DepthToSpace", {"x": (2, 8, 3, 2)}, {"blocksize": 2}, 13, ()),
    ("SpaceToDepth", {"x": (2, 3, 4, 6)}, {"blocksize": 2}, 13, ()),
    ("InstanceNormalization", {"x": (2, 3, 4, 5), "s": (3,), "b": (3,)}, {}, 22, ()),
    ("GroupNormalization", {"x": (2, 6, 4), "s": (6,), "b": (6,)}, {"num_groups": 3}, 21, ()),
    ("LpNormalization", {"x": (3, 4)}, {"p": 2, "axis": 0}, 22, ()),
    ("MeanVarianceNormalization", {"x": (2, 3, 4, 2)}, {"axes": [0, 2]}, 13, ()),
    ("LpPool", {"x": (1, 2, 7, 6)}, {"kernel_shape": [3, 2], "p": 3, "strides": [2, 1],
                                     "pads": [1, 0, 1, 1]}, 18, ()),
    ("CumProd", {"x": (3, 7), "axis": np.array(1)}, {"exclusive": 1, "reverse": 1}, 26,
     ("axis",)),
    ("Einsum", {"a": (2, 3, 4), "b": (2, 4, 5)}, {"equation": "bij,bjk->bki"}, 12, ()),
    ("Einsum", {"a": (3, 3), "b": (3,)}, {"equation": "ii,i"}, 12, ()),
    ("Einsum", {"a": (2, 1, 3), "b": (4, 3)}, {"equation": "...j,kj->...k"}, 12, ()),
    ("Det", {"x": (4, 3, 3)}, {}, 22, ()),
])
def test_more_ops_equal_onnx_reference(op, inputs, attrs, opset, inits):
    feeds = {n: (RNG.standard_normal(s).astype(np.float32) if isinstance(s, tuple) else s)
             for n, s in inputs.items()}
    m = _model(op, feeds, attrs, opset, inits=inits)
    _same(_run(m, feeds, inits)[0], _reference(m, feeds)[0], rtol=1e-4, atol=1e-5)


def test_l1_normalization_and_lrn_follow_the_spec():
    """Against NumPy: onnx's reference sums x (not |x|) for p=1, and its LRN loops over
    the batch instead of the channels."""
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    x[:, 1] = 0.0                                    # a zero vector stays zero
    m = _model("LpNormalization", {"x": x}, {"p": 1, "axis": 0}, 22)
    norm = np.abs(x).sum(0, keepdims=True)
    _same(_run(m, {"x": x})[0], np.where(norm == 0, 0, x / np.where(norm == 0, 1, norm)),
          rtol=1e-6)
    x = RNG.standard_normal((2, 6, 3, 3)).astype(np.float32)
    size, alpha, beta, bias = 4, 0.01, 0.6, 1.5
    m = _model("LRN", {"x": x}, {"size": size, "alpha": alpha, "beta": beta, "bias": bias},
               13)
    sq = np.zeros_like(x)
    for c in range(6):   # channels c - floor((size-1)/2) .. c + ceil((size-1)/2)
        sq[:, c] = (x[:, max(0, c - 1):min(6, c + 3)] ** 2).sum(1)
    _same(_run(m, {"x": x})[0], x / (bias + alpha / size * sq) ** beta, rtol=1e-5)


def test_one_hot_compress_reverse_sequence_eye_like():
    idx = np.array([[1, -1], [5, 0]], np.int64)    # -1 counts from the end; 5 is no class
    feeds = {"idx": idx, "depth": np.array(4, np.int64),
             "values": np.array([-2.0, 3.0], np.float32)}
    m = _model("OneHot", feeds, {"axis": 1}, 11, out_dtype=np.float32, inits=("depth",))
    _same(_run(m, feeds, ("depth",))[0], _reference(m, feeds)[0])
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    feeds = {"x": x, "c": np.array([True, False, True], np.bool_)}
    m = _model("Compress", feeds, {"axis": 0}, 11, inits=("c",))
    _same(_run(m, feeds, ("c",))[0], _reference(m, feeds)[0])
    x = RNG.standard_normal((4, 3, 2)).astype(np.float32)
    feeds = {"x": x, "lens": np.array([4, 1, 3], np.int64)}
    m = _model("ReverseSequence", feeds, {"time_axis": 0, "batch_axis": 1}, 10,
               inits=("lens",))
    _same(_run(m, feeds, ("lens",))[0], _reference(m, feeds)[0])
    m = _model("EyeLike", {"x": x[0]}, {"k": -1, "dtype": TensorProto.INT32}, 22,
               out_dtype=np.int32)
    _same(_run(m, {"x": x[0]})[0], _reference(m, {"x": x[0]})[0])


def test_trilu_keeps_64_bit_integers_exact():
    x = RNG.integers(2 ** 60, 2 ** 62, (3, 4))
    m = _model("Trilu", {"x": x}, {}, 14)
    _same(_run(m, {"x": x})[0], np.triu(x))


# --- derivatives ---------------------------------------------------------------------------------

@pytest.mark.parametrize("op,deriv", [
    ("HardSwish", lambda x: np.where(x < -3, 0.0, np.where(x > 3, 1.0, (2 * x + 3) / 6))),
    ("Softsign", lambda x: 1 / (1 + np.abs(x)) ** 2),
    ("Mish", None), ("Celu", None), ("Asinh", lambda x: 1 / np.sqrt(x * x + 1)),
    ("Atan", lambda x: 1 / (1 + x * x))])
def test_derivatives_of_differentiable_ops(op, deriv):
    x = np.concatenate([np.linspace(-5, 5, 41), [-2.9, 2.9]]).astype(np.float64)
    x = x[np.abs(np.abs(x) - 3) > 1e-3]           # HardSwish's kinks
    m = _model(op, {"x": x}, opset={"Mish": 18, "Celu": 12}.get(op, 22))
    g = gx.import_model(m)
    d = be.deriv(be.np.sum(g.outputs[0]), g.inputs[0])
    (got,) = be.make_transformer("numpy").computation([d], g.inputs[0])(x)
    if deriv is None:  # central differences of the imported op itself
        f = g.computation()
        h = 1e-6
        deriv_v = (f(x + h)[0] - f(x - h)[0]) / (2 * h)
        np.testing.assert_allclose(got, deriv_v, rtol=1e-6, atol=1e-8)
    else:
        np.testing.assert_allclose(got, deriv(x), rtol=1e-9, atol=1e-12)


# --- exported from PyTorch -----------------------------------------------------------------------

def _torch():
    try:
        import torch
    except ImportError:
        pytest.skip("torch is not installed (pip install torch==2.13.0): the export test "
                    "needs torch.onnx.export")
    return torch


def _exporter_module(torch):
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):
        """MobileNetV3's activations, a masked attention written as PyTorch's
        attention writes it (``where(isnan(softmax), 0, ...)``), and index assignment
        (``index_put``) with indices given at run time and with a mask built as Swin
        builds its shifted-window mask (slices of a zero tensor set to a count)."""

        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)
            self.se = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(8, 8, 1),
                                    nn.Hardsigmoid())
            self.act = nn.Hardswish()
            self.q, self.k, self.v = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, img, mask, rows):
            h = self.act(self.conv(img))
            h = h * self.se(h)
            tok = h.flatten(2).transpose(1, 2)                        # (B, 16, 8)
            b, t, d = tok.shape
            q, k, v = (m(tok).view(b, t, 2, 4).transpose(1, 2)
                       for m in (self.q, self.k, self.v))
            s = (q @ k.transpose(-1, -2)) / 2.0
            s = s.masked_fill(~mask[:, None, None, :], float("-inf")).softmax(-1)
            s = torch.where(torch.isnan(s), torch.zeros_like(s), s)  # fully masked rows
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :])
            a = torch.where(torch.isnan(a), torch.zeros_like(a), a)
            out = (s @ v + a).transpose(1, 2).reshape(b, t, d)
            win = torch.zeros(4, 4)                                     # Swin's mask
            count = 0
            for hs in (slice(0, -2), slice(-2, -1), slice(-1, None)):
                for ws in (slice(0, -2), slice(-2, -1), slice(-1, None)):
                    win[hs, ws] = count
                    count += 1
            out = out + win.reshape(1, 16, 1)
            out = out.clone()
            out[:, rows] = out[:, rows] * 2.0 + 1.0                     # index_put
            return out

    return Block()


def test_exported_module_with_hardswish_isnan_where_and_index_put_matches_torch():
    torch = _torch()
    torch.manual_seed(0)
    module = _exporter_module(torch).eval()
    img = torch.randn(2, 3, 4, 4)
    mask = torch.ones(2, 16, dtype=torch.bool)
    mask[0, :] = False                 # a fully masked sequence: softmax gives NaN
    mask[1, 9:] = False
    rows = torch.tensor([0, 3, 15])
    with torch.no_grad():
        want = module(img, mask, rows).numpy()
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (img, mask, rows), buf, dynamo=False, opset_version=17)
    model = onnx.load_from_string(buf.getvalue())
    ops = {n.op_type for n in model.graph.node}
    assert {"HardSwish", "HardSigmoid", "IsNaN", "Where", "ScatterND"} <= ops, ops
    g = gx.import_model(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # the fully masked row computes inf - inf
        (got,) = g.computation()(img.numpy(), mask.numpy(), rows.numpy())
    assert not np.isnan(want).any()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # other rows at run time: the index assignment's indices are a graph input
    rows2 = torch.tensor([15, 1])
    with torch.no_grad():
        want2 = module(img, mask, rows2).numpy()
    model2 = onnx.load_from_string(_export_again(torch, module, (img, mask, rows2)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        (got2,) = gx.import_model(model2).computation()(img.numpy(), mask.numpy(),
                                                         rows2.numpy())
    np.testing.assert_allclose(got2, want2, rtol=1e-5, atol=1e-5)


def _export_again(torch, module, args):
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, buf, dynamo=False, opset_version=17)
    return buf.getvalue()


def test_exported_hardswish_gradients_equal_torch_autograd():
    torch = _torch()
    torch.manual_seed(1)
    module = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Hardswish(),
                                 torch.nn.Linear(5, 3)).eval()
    x = torch.randn(8, 6) * 3
    model = onnx.load_from_string(_export_again(torch, module, (x,)))
    assert "HardSwish" in {n.op_type for n in model.graph.node}
    g = gx.import_model(model)
    cost = be.np.sum(g.outputs[0] * g.outputs[0])
    names = sorted(dict(module.named_parameters()))
    grads = be.make_transformer("numpy").computation(
        [be.deriv(cost, g.variables[n]) for n in names], g.inputs[0])(x.numpy())
    (module(x) ** 2).sum().backward()
    params = dict(module.named_parameters())
    for n, gv in zip(names, grads):
        np.testing.assert_allclose(gv, params[n].grad.numpy(), rtol=1e-4, atol=1e-5,
                                   err_msg=n)


def test_exported_interpolate_and_grid_sample_match_torch():
    """``F.interpolate`` (Resize) in each mode and ``F.grid_sample`` (GridSample)."""
    torch = _torch()
    F = torch.nn.functional

    class Sampler(torch.nn.Module):
        def forward(self, x, grid):
            outs = [F.interpolate(x, scale_factor=2, mode="nearest"),
                    F.interpolate(x, size=(7, 5), mode="bilinear", align_corners=False),
                    F.interpolate(x, size=(7, 5), mode="bilinear", align_corners=True),
                    F.interpolate(x, scale_factor=0.5, mode="bilinear", antialias=False),
                    F.interpolate(x, size=(9, 6), mode="bicubic", align_corners=False),
                    F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros",
                                  align_corners=False),
                    F.grid_sample(x, grid, mode="nearest", padding_mode="border",
                                  align_corners=True),
                    F.grid_sample(x, grid, mode="bicubic", padding_mode="reflection",
                                  align_corners=False)]
            return tuple(outs)

    torch.manual_seed(2)
    x = torch.randn(2, 3, 6, 4)
    grid = torch.rand(2, 5, 3, 2) * 2.6 - 1.3            # some positions outside
    module = Sampler().eval()
    with torch.no_grad():
        want = [w.numpy() for w in module(x, grid)]
    model = onnx.load_from_string(_export_again(torch, module, (x, grid)))
    assert {"Resize", "GridSample"} <= {n.op_type for n in model.graph.node}
    got = gx.import_model(model).computation()(x.numpy(), grid.numpy())
    for k, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=f"output {k}")


# --- bits ----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint16, np.uint64])
def test_bitwise_ops_and_shifts_are_exact(dtype):
    """Every bit, for every width (64-bit values past float64's precision included),
    against NumPy and, for the shifts with counts below 0 and past the width, against
    onnx's reference."""
    info = np.iinfo(dtype)
    a = RNG.integers(info.min, info.max, 600, dtype=dtype, endpoint=True)
    b = RNG.integers(info.min, info.max, 600, dtype=dtype, endpoint=True)
    a[:3] = [info.min, info.max, 0]
    shift = RNG.integers(max(info.min, -3), min(info.max, info.bits + 3), 600,
                         endpoint=True).astype(dtype)
    for op, fn in [("BitwiseAnd", np.bitwise_and), ("BitwiseOr", np.bitwise_or),
                   ("BitwiseXor", np.bitwise_xor)]:
        _same(_run(_model(op, {"a": a, "b": b}, {}, 18), {"a": a, "b": b})[0], fn(a, b))
    _same(_run(_model("BitwiseNot", {"a": a}, {}, 18), {"a": a})[0], np.invert(a))
    for direction in ("LEFT", "RIGHT"):
        m = _model("BitShift", {"a": a, "s": shift}, {"direction": direction}, 28)
        _same(_run(m, {"a": a, "s": shift})[0], _reference(m, {"a": a, "s": shift})[0])
