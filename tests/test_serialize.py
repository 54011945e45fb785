"""JSON serialization: round trips (every op-table op, lowered graphs, the digits example),
the documented errors, and a seeded fuzzer over damaged documents."""

import copy
import json
import random

import numpy as np
import pytest

import geon as be
from example_graphs import digits_graphs
from geon.examples import digits
from geon.op_graph import op_graph as og
from geon.op_graph import primitives as pr
from geon.op_graph import schemas as sc
from geon.op_graph.params import clone_graph, graph_ops, op_classes, type_name
from geon.op_graph.serialize import VERSION, MissingValue
from geon.op_graph.user_ops import UserOp
from op_table import DOCUMENT_CASES

C = be.Axis(3, "C")
H = be.Axis(4, "H")
N = be.Axis(5, "N", batch=True)


def run_numpy(ops, params, values):
    return be.NumPyTransformer().computation(ops, *params)(*values)


# --- round trips ---------------------------------------------------------------------------

@pytest.mark.parametrize("case", DOCUMENT_CASES, ids=[c.name for c in DOCUMENT_CASES])
def test_op_table_round_trip(case):
    arrays = case.arrays(np.float64)
    xs = [be.placeholder(i.axes, dtype=i.dtype(np.float64)) for i in case.inputs]
    op = case.make(xs, np.float64)
    text = be.serialize(op)
    loaded = be.deserialize_graph(text)
    op2 = loaded.value
    assert isinstance(op2, type(op)) and op2 is not op
    assert op2.axes.names == op.axes.names and op2.dtype == op.dtype
    # The loaded graph is the same graph: writing it again gives the same document.
    assert be.serialize(op2) == text
    xs2 = [loaded.ops[graph_ops([op]).index(x)] for x in xs]
    want = run_numpy(op, xs, arrays)
    got = run_numpy(op2, xs2, arrays)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(got, case.expected(arrays), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", DOCUMENT_CASES[::7],
                         ids=[c.name for c in DOCUMENT_CASES[::7]])
def test_lowered_graph_round_trip(case):
    # After compilation the user's ops forward to semi-primitive ones; those serialize too.
    arrays = case.arrays(np.float64)
    xs = [be.placeholder(i.axes, dtype=i.dtype(np.float64)) for i in case.inputs]
    op = case.make(xs, np.float64)
    want = be.NumPyTransformer().computation(op, *xs)(*arrays)
    lowered = be.snap(op)
    loaded = be.deserialize_graph(be.serialize(op))
    kinds = {type(o) for o in loaded.ops}
    assert kinds <= set(be.NumPyTransformer.base_set), kinds
    assert graph_ops([lowered]) and lowered.forward is None
    by_name = {x.name: a for x, a in zip(xs, arrays)}
    xs2 = loaded.placeholders   # those the lowered graph still needs
    got = run_numpy(loaded.value, xs2, [by_name[p.name] for p in xs2])
    np.testing.assert_array_equal(got, want)


def test_every_standard_op_class_is_known_by_its_name():
    # UserOp: the base of every user op (each one is known by its own name when defined)
    classes = set(be.NumPyTransformer.base_set) - {UserOp} | {
        og.Dot, og.Sum, og.Prod, og.Max, og.Min, og.ArgMax, og.ArgMin, og.TensorSize,
        og.Broadcast, og.AxesWithOrder, og.CastAxes, og.Flatten, og.Unflatten, og.Slice,
        og.OneHot, og.StopGradient, og.SetItem}
    table = op_classes()
    assert [c.__name__ for c in classes if table.get(type_name(c)) is not c] == []


def test_document_layout():
    x = be.placeholder((C, N), name="x")
    y = be.sum(be.tanh(x) * 2.0, reduction_axes=C)
    doc = json.loads(be.serialize(y, indent=1))
    assert doc["format"] == "geon-graph" and doc["version"] == 2 and VERSION == 3  # no body
    assert doc["single"] is True
    assert doc["axes"] == {"C": {"length": 3}, "N": {"length": 5, "batch": True}}
    ops = doc["ops"]
    assert [o["op"] for o in ops] == ["Placeholder", "Tanh", "Constant", "Multiply", "Sum"]
    assert [o["id"] for o in ops] == list(range(5))
    assert ops[0]["outputs"] == [{"axes": ["C", "N"], "dtype": "float32"}]
    assert ops[0]["tags"] == ["in"] and ops[0]["name"] == "x"
    assert ops[3]["args"] == [[1, 0], [2, 0]]
    assert ops[2]["attrs"] == {"value": 2.0, "weak": True}   # a weak Python number
    assert ops[1].get("attrs") is None                     # Tanh: dtype is in "outputs"
    assert ops[4]["attrs"] == {"reduction_axes": {"axes": ["C"]}}
    assert ops[4]["loc"][0] == __file__ and isinstance(ops[4]["loc"][1], int)
    assert doc["results"] == [[4, 0]]


def test_arrays_are_exact_and_compact():
    rng = np.random.default_rng(0)
    for dtype in ["float16", "float32", "float64", "int8", "int64", "uint16", "bool",
                  "complex64"]:
        value = (rng.standard_normal((3, 4)) * 100).astype(dtype)
        c = be.Constant(value, axes=(C, H), dtype=value.dtype)
        text = be.serialize(c)
        data = json.loads(text)["ops"][0]["attrs"]["value"]["array"]["data"]
        assert len(data) == 4 * -(-value.nbytes // 3)   # base64 of the raw bytes
        c2 = be.deserialize(text)
        assert c2.dtype == value.dtype and not c2.weak
        np.testing.assert_array_equal(c2.value, value)
    big = rng.standard_normal(1000)
    text = be.serialize(be.Constant(big, axes=be.Axis(1000, "K1000")), debug_info=False)
    assert len(text) < 1.34 * big.nbytes + 400
    special = np.array([np.nan, np.inf, -np.inf, -0.0], np.float64)
    c2 = be.deserialize(be.serialize(be.Constant(special, axes=be.Axis(4, "S4"))))
    assert np.array_equal(c2.value.view(np.uint64), special.view(np.uint64))


def test_weak_constants_keep_their_number_and_dtype():
    x = be.placeholder((C,), dtype=np.float64)
    y = x * 0.1 + 3
    y2 = be.deserialize(be.serialize(y))
    consts = [o for o in graph_ops([y2]) if isinstance(o, be.Constant)]
    assert [c._number for c in consts] == [0.1, 3] and all(c.weak for c in consts)
    assert all(c.dtype == np.float64 for c in consts)
    assert type(consts[1]._number) is int


def test_variables_values_and_flags():
    v = be.Variable((C, H), initial_value=lambda s: np.ones(s), name="v", trainable=False)
    u = be.Variable((H,), initial_value=np.arange(4.0), name="u", persistent=False)
    k = be.Variable((), initial_value=7, dtype=np.int64, name="k")
    y = be.dot(v, u) + k
    # Without values=, a function initial value is not written.
    loaded = be.deserialize_graph(be.serialize(y))
    v2, u2, k2 = (loaded.op(n) for n in ("v", "u", "k"))
    assert isinstance(v2.initial_value, MissingValue)
    assert not v2.trainable and v2.persistent and u2.trainable and not u2.persistent
    np.testing.assert_array_equal(u2.initial_array(), np.arange(4.0))
    assert k2.initial_value == 7 and k2.dtype == np.int64
    t = be.NumPyTransformer()
    f = t.computation(loaded.value)
    with pytest.raises(be.SerializationError, match="v was serialized without its value"):
        f()
    # With values=, the given arrays become the initial values.
    w = np.arange(12.0).reshape(3, 4)
    loaded = be.deserialize_graph(be.serialize(y, values={v: w}))
    got = be.NumPyTransformer().computation(loaded.value)()
    np.testing.assert_allclose(got, w @ np.arange(4.0) + 7)
    with pytest.raises(be.SerializationError, match="shape"):
        be.serialize(y, values={v: np.zeros(3)})


def test_graph_state_survives(tmp_path):
    # user_deps: a read built after loading still runs after the loaded SetItem.
    w = be.Variable((C,), initial_value=1.0, name="w")
    before = w * 2
    upd = be.SetItem(w, w + 1)
    loaded = be.deserialize_graph(be.serialize([before, upd]))
    before2, upd2 = loaded.value
    w2 = loaded.op("w")
    assert w2.user_deps and list(w2.user_deps) == [upd2]
    after2 = w2 * 2
    assert upd2 in after2.other_deps
    t = be.NumPyTransformer()
    b, _, a = t.computation([before2, upd2, after2])()
    np.testing.assert_array_equal(b, [2, 2, 2])
    np.testing.assert_array_equal(a, [4, 4, 4])
    # Schemas: a loaded softmax still gives the stable cross-entropy.
    x = be.placeholder((C, N), name="x", dtype=np.float64)
    sm2 = be.deserialize(be.serialize(be.softmax(x)))
    assert isinstance(sm2.schema, sc.SoftmaxSchema)
    x2 = sm2.schema.x
    t_ = be.placeholder((C, N), dtype=np.float64)
    ce = be.cross_entropy_multi(sm2, t_)
    logits = np.full((3, 5), -2000.0)
    logits[0] = 0.0
    got = be.NumPyTransformer().computation(ce, x2, t_)(logits, np.eye(3)[[1] * 5].T)
    np.testing.assert_allclose(got, 2000.0)
    s2 = be.deserialize(be.serialize(be.sigmoid(x)))
    assert isinstance(s2.schema, sc.SigmoidSchema) and s2.schema.x is s2.args[0]
    # Tags, names, metadata, source locations and derived_from.
    y = og.Tanh(x, name="hidden", tags={"layer1", "act"})
    loaded = be.deserialize_graph(be.serialize(y, metadata={"model": "demo"}))
    assert loaded.value.tags == {"layer1", "act"} and loaded.value.name == "hidden"
    assert loaded.metadata == {"model": "demo"}
    assert (loaded.value.filename, loaded.value.lineno) == (y.filename, y.lineno)
    no_debug = be.deserialize(be.serialize(y, debug_info=False))
    assert no_debug.filename == "<unknown>" and no_debug.lineno == 0
    d = be.dot(be.placeholder((C, H)), be.placeholder((H, N)))
    be.NumPyTransformer().computation(d, *[a for a in d.args])
    gemm = [o for o in graph_ops([d]) if isinstance(o, pr.Gemm)][0]
    g2 = [o for o in be.deserialize_graph(be.serialize(d)).ops if isinstance(o, pr.Gemm)][0]
    assert g2.derived_from == gemm.derived_from == f"Dot {d.name}"


def test_shared_axes_and_flattened_axes():
    x = be.placeholder((C, H, N), name="x")
    f = be.flatten(x, [be.Axes(C, H), N])
    y = be.unflatten(be.exp(f))
    loaded = be.deserialize_graph(be.serialize(y))
    x2, f2 = loaded.op("x"), loaded.ops[1]
    assert f2.axes.names == ("(C*H)", "N") and f2.axes[0].axes[0] is x2.axes[0]
    assert loaded.value.axes[0] is x2.axes[0]   # one Axis object per name
    assert x2.axes[2].batch and x2.axes[2].length == 5
    # Two different axes under one name cannot be written.
    other = be.placeholder((be.Axis(7, "C"),))
    with pytest.raises(be.SerializationError, match="two different axes are named 'C'"):
        be.serialize([x, other])


def test_bytes_and_type_errors():
    text = be.serialize(be.placeholder((C,)))
    assert isinstance(be.deserialize(text.encode()), be.Placeholder)
    with pytest.raises(TypeError):
        be.deserialize(42)
    with pytest.raises(TypeError):
        be.serialize([np.zeros(3)])
    with pytest.raises(be.SerializationError, match="UTF-8"):
        be.deserialize(b"\xff\xfe")


def test_new_classes_need_no_registration_but_distinct_names():
    class Mystery(og.UnaryElementWise):
        pass
    y = Mystery(be.placeholder((C,)))
    y2 = be.deserialize(be.serialize(y))
    assert type(y2) is Mystery and y2 is not y
    twin = type("Mystery", (og.UnaryElementWise,), {})
    with pytest.raises(be.SerializationError, match="another op class is also named "
                                                    "'Mystery'"):
        be.serialize(y)
    with pytest.raises(be.SerializationError, match="unknown op type 'Mystery'"):
        be.deserialize(be.serialize(og.Tanh(be.placeholder((C,)))).replace("Tanh", "Mystery"))
    del twin


def test_clone_shares_storage_and_leaves_the_original_alone():
    x = be.placeholder((C,), name="x")
    w = be.Variable((C,), initial_value=2.0, name="w")
    y = be.exp(x * w)
    m = clone_graph([y])
    assert m[x] is x and m[w] is w and m[y] is not y
    assert m[y].args[0].args == (x, w) and y.args[0].args == (x, w)
    assert m[y].filename == y.filename and m[y].lineno == y.lineno


def test_example_model_round_trip(monkeypatch, tmp_path):
    # Record the digits example's computations instead of compiling them, write all
    # their ops as one document, and train the original and the loaded graph side by side.
    calls = [(list(r) if isinstance(r, list) else [r], p)
             for r, p in digits_graphs(batch_size=16, n_test=20)]
    flat = [op for results, _ in calls for op in results]
    text = be.serialize(flat)
    loaded = be.deserialize_graph(text)
    assert be.serialize(loaded.value) == text
    order = graph_ops(flat)
    same = dict(zip(order, loaded.ops))

    def compile_all(mapping):
        t = be.NumPyTransformer()
        return t, [t.computation([mapping[op] for op in results],
                                 *[mapping[p] for p in params]) for results, params in calls]

    t1, (ev1, stepv1, train1) = compile_all({op: op for op in order})
    t2, (ev2, stepv2, train2) = compile_all(same)
    t1.initialize()
    ckpt = tmp_path / "w.npz"
    t1.save(ckpt)
    t2.restore(ckpt)   # the weights' initializers are functions: not in the document
    x_all, y_all = digits.load_digits()
    for step in range(5):
        b = slice(16 * step, 16 * (step + 1))
        r1, r2 = train1(x_all[b], y_all[b]), train2(x_all[b], y_all[b])
        assert r1[0] == r2[0] and np.isfinite(r1[0])
    xt, yt = x_all[-20:], y_all[-20:]
    l1, c1 = ev1(xt, yt)
    l2, c2 = ev2(xt, yt)
    np.testing.assert_array_equal(l1, l2)
    np.testing.assert_array_equal(c1, c2)
    assert int(stepv1()[0]) == int(stepv2()[0]) == 5
    for v1 in t1.variables():
        np.testing.assert_array_equal(t1.state[v1], t2.state[same[v1]])


# --- errors ------------------------------------------------------------------------------------

def _doc():
    x = be.placeholder((C, N), name="x")
    w = be.Variable((H, C), initial_value=np.full((4, 3), 0.5), name="w")
    y = be.sum(be.tanh(be.dot(w, x)), reduction_axes=H)
    return json.loads(be.serialize([y, be.SetItem(w, w * 0.5)]))


def _load(doc):
    return be.deserialize(json.dumps(doc))


def _edit(fn):
    doc = _doc()
    fn(doc)
    return doc


def _op(doc, kind):
    return next(o for o in doc["ops"] if o["op"] == kind)


ERRORS = [
    ("not json", lambda: "{", "not valid JSON"),
    ("truncated", lambda: json.dumps(_doc())[:-3], "not valid JSON"),
    ("nan literal", lambda: '{"version": NaN}', "not valid JSON"),
    ("top list", lambda: [], "expected an object"),
    ("format", lambda: _edit(lambda d: d.update(format="onnx")), "format"),
    ("version", lambda: _edit(lambda d: d.update(version=1)),
     "this geon reads versions 2 and 3, the document has version 1"),
    ("version bool", lambda: _edit(lambda d: d.update(version=True)), "version"),
    ("missing key", lambda: _edit(lambda d: d.pop("results")), "missing key 'results'"),
    ("unknown key", lambda: _edit(lambda d: d.update(extra=1)), "unknown key 'extra'"),
    ("unknown op", lambda: _edit(lambda d: _op(d, "Tanh").update(op="Tanhh")),
     r"ops\[\d\]\.op: unknown op type 'Tanhh'"),
    ("dangling arg", lambda: _edit(lambda d: _op(d, "Tanh").update(args=[[99, 0]])),
     r"Tanh.*args\[0\]: dangling reference to op 99"),
    ("forward arg", lambda: _edit(lambda d: _op(d, "Placeholder").update(args=[[3, 0]])),
     "dangling reference to op 3"),
    ("bad output index", lambda: _edit(lambda d: _op(d, "Tanh").update(args=[[1, 1]])),
     "has 1 output"),
    ("void value", lambda: _edit(lambda d: d["results"].__setitem__(0, [_idx(d, "SetItem"), 0])),
     "has 0 output"),
    ("dangling result", lambda: _edit(lambda d: d.update(results=[[12, 0]])),
     r"results\[0\]: dangling reference to op 12"),
    ("dangling dep", lambda: _edit(lambda d: _op(d, "Tanh").update(other_deps=[7])),
     "dangling reference to op 7"),
    ("dangling user dep", lambda: _edit(lambda d: _op(d, "Variable").update(user_deps=[70])),
     "dangling reference to op 70"),
    ("unknown axis", lambda: _edit(lambda d: _op(d, "Tanh")["outputs"][0].update(
        axes=["H", "Q"])), "unknown axis 'Q'"),
    ("duplicate axis", lambda: _edit(lambda d: _op(d, "Tanh")["outputs"][0].update(
        axes=["H", "H"])), "appears twice"),
    ("wrong axes", lambda: _edit(lambda d: _op(d, "Tanh")["outputs"][0].update(
        axes=["N", "H"])), r"the document says \(N:5, H:4\) float32, but the args give "
                           r"\(H:4, N:5\)"),
    ("dtype", lambda: _edit(lambda d: _op(d, "Tanh")["outputs"][0].update(dtype="object")),
     "unknown dtype 'object'"),
    ("two outputs", lambda: _edit(lambda d: _op(d, "Tanh")["outputs"].append(
        {"axes": [], "dtype": "float32"})), "has 2 entries; a Tanh op has 1"),
    ("arity", lambda: _edit(lambda d: _op(d, "Tanh")["args"].append([0, 0])),
     "takes 1 arg"),
    ("missing attr", lambda: _edit(lambda d: _op(d, "Sum").pop("attrs")),
     "missing attribute 'reduction_axes'"),
    ("unknown attr", lambda: _edit(lambda d: _op(d, "Sum")["attrs"].update(keepdims=1)),
     "unknown key 'keepdims'"),
    ("bad attr", lambda: _edit(lambda d: _op(d, "Sum")["attrs"].update(
        reduction_axes={"axes": ["N"]})), r"Sum.*AxisMismatchError"),
    ("untagged attr", lambda: _edit(lambda d: _op(d, "Sum")["attrs"].update(
        reduction_axes=["H"])), r"attrs\.reduction_axes: expected a parameter value"),
    ("unknown tag", lambda: _edit(lambda d: _op(d, "Sum")["attrs"].update(
        reduction_axes={"pickle": "x"})), "expected a parameter value"),
    ("axis length", lambda: _edit(lambda d: d["axes"]["C"].update(length=-1)),
     "expected an integer >= 0"),
    ("flattened name", lambda: _edit(lambda d: d["axes"].update({"(X)": {"parts": ["C", "N"]}})),
     r"the parts make an axis named '\(C\*N\)'"),
    ("id order", lambda: _edit(lambda d: d["ops"][1].update(id=5)), "ids number the ops"),
    ("array bytes", lambda: _edit(lambda d: _op(d, "Variable")["attrs"]["initial_value"][
        "array"].update(data="AAAA")), "3 bytes, but float64 \\[4, 3\\] needs 96"),
    ("base64", lambda: _edit(lambda d: _op(d, "Variable")["attrs"]["initial_value"][
        "array"].update(data="!!")), "not valid base64"),
    ("array shape", lambda: _edit(lambda d: _op(d, "Variable")["attrs"]["initial_value"][
        "array"].update(shape=[3], data="A" * 32)), r"Variable.*initial value has shape \(3,\)"),
    ("setitem on constant", lambda: _edit(lambda d: _op(d, "SetItem").update(
        args=[[_idx(d, "Constant"), 0], [_idx(d, "Tanh"), 0]])), "ArgumentError: SetItem needs"),
    ("name", lambda: _edit(lambda d: _op(d, "Tanh").update(name="")),
     "expected a non-empty string"),
    ("tags", lambda: _edit(lambda d: _op(d, "Tanh").update(tags=[["x"]])),
     r"tags\[0\]: expected a non-empty string"),
]


def _idx(doc, kind):
    return next(o["id"] for o in doc["ops"] if o["op"] == kind)


@pytest.mark.parametrize("make, pattern", [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_errors_name_what_is_wrong(make, pattern):
    doc = make()
    text = doc if isinstance(doc, str) else json.dumps(doc)
    with pytest.raises(be.SerializationError, match=pattern):
        be.deserialize(text)


def test_serialization_error_type():
    assert issubclass(be.SerializationError, be.GeonError)
    assert issubclass(be.SerializationError, ValueError)


def test_unknown_version_message():
    doc = _doc()
    doc["version"] = 7
    with pytest.raises(be.SerializationError) as e:
        _load(doc)
    assert "version" in str(e.value) and "7" in str(e.value)


# --- fuzzing ----------------------------------------------------------------------------------

def _fuzz_document():
    x = be.placeholder((C, H, N), name="x", dtype=np.float64)
    lab = be.placeholder((N,), dtype=np.int64, name="lab")
    w = be.Variable((C,), initial_value=np.arange(3.0), name="w", dtype=np.float64)
    s = be.slice_along_axis(x, H, slice(1, 3))
    f = be.unflatten(be.flatten(s, [be.Axes(C, s.axes[1]), N]))
    y = be.cross_entropy_multi(be.softmax(be.sum(f, reduction_axes=s.axes[1]) * w),
                               be.one_hot(lab, C))
    g = be.deriv(be.sum(y, out_axes=()), w)
    upd = be.SetItem(w, w - 0.1 * g)
    lowered = be.tanh(be.dot(be.placeholder((C, H), dtype=np.float64), x))
    be.NumPyTransformer().computation(lowered, *[op for op in graph_ops([lowered])
                                                 if isinstance(op, be.Placeholder)])
    return be.serialize([y, g, upd, lowered])


_POOL = [None, True, False, -1, 0, 1, 2, 3, 10 ** 30, 0.5, -2.5, "", "C", "N", "x",
         "float32", "int64", "Add", "Placeholder", [], {}, [0, 0], [0, None], [[0, 0]],
         {"slice": [1, None, 0]}, {"slice": [None, None, None]}, [-1, 0], [1, 1],
         {"dtype": "float64", "shape": [2], "data": "AAAAAAAAAAAAAAAAAAAAAA=="}]


def _paths(node, path=()):
    yield path
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, path + (i,))


def _mutate(doc, rng):
    doc = copy.deepcopy(doc)
    paths = [p for p in _paths(doc) if p]
    for _ in range(rng.randint(1, 3)):
        path = rng.choice(paths)
        parent = doc
        try:
            for k in path[:-1]:
                parent = parent[k]
            key = path[-1]
            action = rng.random()
            if action < 0.6:
                parent[key] = copy.deepcopy(rng.choice(_POOL))
            elif action < 0.8:
                del parent[key]
            elif isinstance(parent, list):
                parent.insert(key, copy.deepcopy(parent[key]))
            else:
                parent[key] = [parent[key]]
        except (KeyError, IndexError, TypeError):
            pass  # an earlier mutation removed the path
    return json.dumps(doc)


def test_fuzzed_documents_raise_only_serialization_error():
    text = _fuzz_document()
    doc = json.loads(text)
    assert be.serialize(be.deserialize(text)) == text
    rng = random.Random(20240611)
    inputs = []
    for _ in range(120):  # truncations
        inputs.append(text[:rng.randrange(len(text))])
    for _ in range(120):  # character damage
        i = rng.randrange(len(text))
        inputs.append(text[:i] + rng.choice('{}[]",:0 a-1e9') + text[i + rng.randint(0, 2):])
    for _ in range(300):  # structural damage that still parses
        inputs.append(_mutate(doc, rng))
    outcomes = {"error": 0, "loaded": 0}
    for s in inputs:
        try:
            loaded = be.deserialize(s)
        except be.SerializationError:
            outcomes["error"] += 1
            continue
        # anything else propagates and fails the test; what loads must be a graph that
        # writes and reads back to the same document
        outcomes["loaded"] += 1
        again = be.serialize(loaded)
        assert be.serialize(be.deserialize(again)) == again
    assert outcomes["error"] > 400, outcomes


def test_user_defined_ops():
    softplus = be.elementwise_op("SerSoftplus", lambda x: np.logaddexp(0, x),
                                 lambda x: be.sigmoid(x))
    scale = be.define_op("SerScale", lambda x, k: x * k, axes=lambda x, k: x.axes,
                         params=("k",), reverse=lambda op, d: [d * op.params["k"]])
    x = be.placeholder((C, N), dtype=np.float64, name="x")
    y = scale(softplus(x), k=2.5) + scale(softplus(x), k=2.5)
    text = be.serialize(y)
    kinds = [o["op"] for o in json.loads(text)["ops"]]
    assert kinds.count(f"user:{softplus.registry_key}") == 2
    assert f"user:{scale.registry_key}" in kinds
    loaded = be.deserialize_graph(text)
    assert loaded.value.args[0].params == {"k": 2.5}
    xv = np.linspace(-2, 2, 15).reshape(3, 5)
    got = be.NumPyTransformer().computation(loaded.value, loaded.op("x"))(xv)
    np.testing.assert_allclose(got, 5 * np.logaddexp(0, xv), rtol=1e-14)
    assert "SerScale(SerSoftplus_" in be.graph_text(loaded.value) and "; k=2.5)" in \
        be.graph_text(loaded.value)
    # A process that has not defined the op cannot load it.
    with pytest.raises(be.SerializationError, match="unknown op type 'user:NoSuchOp'"):
        be.deserialize(text.replace(f"user:{scale.registry_key}", "user:NoSuchOp"))


def _hostile_schema(edit):
    """A softmax written with an unrelated op ``u`` beside it, its schema changed by
    ``edit(schema, id of u)``; returns the document text."""
    x = be.placeholder((C, N), name="x", dtype=np.float64)
    u = be.placeholder((C, N), name="u", dtype=np.float64)
    doc = json.loads(be.serialize([be.softmax(x), u]))
    sm = next(o for o in doc["ops"] if "schema" in o)
    edit(sm["schema"], next(o["id"] for o in doc["ops"] if o["name"] == "u"))
    return json.dumps(doc)


def _point(schema, key, target):
    ref = schema[key]
    (ref["op"] if isinstance(ref, dict) else ref)[0] = target


@pytest.mark.parametrize("key", ["shifted", "Z", "x"])
def test_a_schema_pointing_at_an_unrelated_op_is_rejected(key):
    # Cross-entropy trusts a softmax schema (log y = shifted - log Z): one pointing at
    # another op must not load, or the loaded graph would compute garbage silently.
    text = _hostile_schema(lambda s, u: _point(s, key, u))
    with pytest.raises(be.SerializationError, match=r"schema: the softmax schema does "
                                                    r"not describe this op"):
        be.deserialize(text)


def test_a_schema_over_other_axes_is_rejected():
    def edit(s, u):
        n = s["normalization_axes"]
        (n["axes"] if isinstance(n, dict) else n)[:] = ["N"]   # format 2 tags the axes
    with pytest.raises(be.SerializationError, match="does not describe this op"):
        be.deserialize(_hostile_schema(edit))


def test_a_sigmoid_schema_must_name_the_sigmoid_arg():
    x = be.placeholder((C,), name="x", dtype=np.float64)
    u = be.placeholder((C,), name="u", dtype=np.float64)
    doc = json.loads(be.serialize([be.sigmoid(x), u]))
    sg = next(o for o in doc["ops"] if "schema" in o)
    _point(sg["schema"], "x", next(o["id"] for o in doc["ops"] if o["name"] == "u"))
    with pytest.raises(be.SerializationError, match="sigmoid schema does not describe"):
        be.deserialize(json.dumps(doc))
