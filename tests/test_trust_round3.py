"""Trust, round 3 (issue 31): the simplifier keeps IEEE signed zeros; integer
placeholders carry value domains checked when a computation is called (class labels,
gather indices); bad ``GEON_*`` environment values warn instead of breaking the import;
deep documents are a SerializationError, not a RecursionError; a larger model's
checkpoint names the variables that differ."""

import io
import json
import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest

import geon as be
from geon import _env
from geon.op_graph import op_graph as og
from geon.op_graph.axes import FlattenedAxis
from geon.op_graph.domains import Domain, DomainError, set_domain
from geon.transformers.numpy import compiled as compiled_kernels
from cuda_emulator import EmulatorRuntime, find_compiler

C = be.Axis(3, "C")
N = be.Axis(6, "N", batch=True)


def _line_of(text):
    """This file's line number of the first line holding ``text``."""
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if text in line)


def _modes():
    """Every way a computation runs: (name, make_transformer or None: the reference)."""
    modes = [("reference", None),
             ("numpy", lambda: be.NumPyTransformer()),
             ("numpy-literal", lambda: be.NumPyTransformer(disable=["simplify", "fold"]))]
    if compiled_kernels.available():
        modes.append(("numpy-compiled", lambda: be.NumPyTransformer(compiled=True)))
    if find_compiler() is not None:
        from geon.transformers.gpu import GPUTransformer
        modes.append(("gpu-emulated",
                      lambda: GPUTransformer(runtime=EmulatorRuntime(seed=3))))
    return modes


MODES = _modes()


# --- 1. signed zeros and the other IEEE identities -------------------------------------

#: (name, f): rewrites the simplifier knows or must not apply. Each is compared with
#: NumPy evaluating ``f`` literally on the same values, sign bits included.
IDENTITIES = [
    ("x + 0.0", lambda x: x + 0.0),          # not x at x = -0.0
    ("0.0 + x", lambda x: 0.0 + x),
    ("x - (-0.0)", lambda x: x - (-0.0)),     # not x at x = -0.0
    ("x + (-0.0)", lambda x: x + (-0.0)),     # x
    ("x - 0.0", lambda x: x - 0.0),           # x
    ("x * 1.0", lambda x: x * 1.0),           # x
    ("1.0 * x", lambda x: 1.0 * x),
    ("x * 0.0", lambda x: x * 0.0),           # not 0: NaN at inf and NaN, -0.0 at x < 0
    ("x / 1.0", lambda x: x / 1.0),
    ("x ** 1.0", lambda x: x ** 1.0),
    ("-(-x)", lambda x: -(-x)),
    ("x + int 0", lambda x: x + 0),           # an integer zero converts to +0.0
]
SPECIAL = [-0.0, 0.0, np.inf, -np.inf, np.nan, -1.5, 2.0]


def _ieee_graph(dtype):
    X = be.Axis(len(SPECIAL), "X")
    x = be.placeholder(X, dtype=dtype, name="x")
    outs = []
    for _, f in IDENTITIES:
        y = f(x)
        outs += [y, be.reciprocal(y)]  # 1 / (x + 0.0) is +inf at x = -0.0
    return x, outs


@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mode", MODES, ids=[m for m, _ in MODES])
def test_identities_keep_ieee_results_and_signed_zeros(mode, dtype):
    name, make = mode
    xv = np.array(SPECIAL, dtype)
    x, outs = _ieee_graph(dtype)
    if make is None:
        got = be.evaluate(outs, {x: xv})
    else:
        got = make().computation(outs, x)(xv)
    with np.errstate(all="ignore"):
        want = []
        for _, f in IDENTITIES:
            y = np.asarray(f(xv), dtype)
            want += [y, np.reciprocal(y)]
    for k, (g, w) in enumerate(zip(got, want)):
        what = f"{IDENTITIES[k // 2][0]}{' (reciprocal)' if k % 2 else ''} in {name}"
        g = np.asarray(g)
        assert g.dtype == dtype, what
        np.testing.assert_array_equal(g, w, err_msg=what)       # NaN where NaN
        np.testing.assert_array_equal(np.signbit(g), np.signbit(w), err_msg=what)


def test_the_true_identities_are_still_simplified():
    X = be.Axis(4, "X")
    for dtype, build in [(np.float64, lambda x: x - 0.0), (np.float64, lambda x: x + (-0.0)),
                         (np.float32, lambda x: (-0.0) + x), (np.float64, lambda x: x * 1.0),
                         (np.int64, lambda x: x + 0), (np.int32, lambda x: x - 0),
                         (np.int64, lambda x: 0 + x)]:
        x = be.placeholder(X, dtype=dtype)
        y = build(x)
        be.NumPyTransformer().computation(be.tanh(y) if dtype != np.int64 else y + x, x)
        assert be.snap(y) is x, (dtype, y)
    # a zero constant with both signs is no identity for either operation
    x = be.placeholder(X, dtype=np.float64)
    mixed = be.Constant(np.array([0.0, -0.0, 0.0, -0.0]), axes=[X], dtype=np.float64)
    s, d = x + mixed, x - mixed
    comp = be.NumPyTransformer().computation([s, d], x)
    assert be.snap(s) is not x and be.snap(d) is not x
    got_s, got_d = comp(np.array([-0.0, -0.0, 0.0, 0.0]))
    np.testing.assert_array_equal(np.signbit(got_s), [False, True, False, False])
    np.testing.assert_array_equal(np.signbit(got_d), [True, False, False, False])


# --- 2. value domains of integer placeholders --------------------------------------------

def _classifier(labels_dtype=np.int64):
    """A softmax cross-entropy over classes C with integer labels (one-hot)."""
    x = be.placeholder([C, N], dtype=np.float64, name="logits")
    labels = be.placeholder(N, dtype=labels_dtype, name="labels")  # <- built here
    loss = be.mean(be.cross_entropy_multi(be.softmax(x), be.one_hot(labels, C)),
                   out_axes=())
    return x, labels, loss


GOOD = np.array([0, 1, 2, 2, 1, 0])
LOGITS = np.linspace(-1, 1, 18).reshape(3, 6)


@pytest.mark.parametrize("mode", MODES[1:], ids=[m for m, _ in MODES[1:]])
def test_one_hot_labels_out_of_range_raise_when_called(mode):
    _, make = mode
    x, labels, loss = _classifier()
    comp = make().computation(loss, x, labels)
    ok = comp(LOGITS, GOOD)
    assert np.isfinite(ok) and ok > 0
    built = _line_of('name="labels")  # <- built ' + "here")
    for bad, pos in [(7, 2), (-1, 4), (3, 0)]:
        y = GOOD.copy()
        y[pos] = bad
        with pytest.raises(DomainError) as info:
            comp(LOGITS, y)
        e = info.value
        assert isinstance(e, be.FeedError) and isinstance(e, IndexError)
        msg = str(e)
        assert msg.startswith("placeholder labels (built at ")
        assert f'File "{__file__}", line {built}' in msg              # the user's line
        assert f"label {bad} is out of range [0, 3), at position [{pos}] of (N)" in msg
        assert "one-hot labels along axis C:3 by OneHot" in msg
        assert (e.placeholder, e.value, e.position) == (labels, bad, (pos,))
    # a list goes through the conversion, and is checked as well
    with pytest.raises(DomainError, match="label 9 is out of range"):
        comp(LOGITS, [0, 1, 9, 0, 0, 0])
    assert comp(LOGITS, GOOD) == pytest.approx(ok)


def test_a_second_computation_of_the_lowered_graph_checks_too():
    """The first computation lowers one_hot into a comparison with a range; the next
    one built over the same graph still knows the labels' domain."""
    x, labels, loss = _classifier()
    t = be.NumPyTransformer()
    t.computation(loss, x, labels)
    again = t.computation([loss, be.sum(x, out_axes=())], x, labels)
    with pytest.raises(DomainError, match="label 5 is out of range"):
        again(LOGITS, np.array([0, 1, 5, 0, 0, 0]))
    # a computation that does not read the labels as one-hot labels does not check them
    plain = t.computation(labels * 2, labels)
    np.testing.assert_array_equal(plain(np.array([7, -1, 0, 0, 0, 0])), [14, -2, 0, 0, 0, 0])


def test_labels_of_another_integer_dtype_through_casts():
    M = be.Axis(6, "M")
    raw = be.placeholder(M, dtype=np.int32, name="raw")
    wide = og.Add(be.cast_axes(raw, [N]), 0, dtype=np.dtype(np.int64))  # int32 -> int64
    onehot = be.one_hot(wide, C)
    comp = be.NumPyTransformer().computation(onehot, raw)
    assert comp(GOOD.astype(np.int32)).shape == (3, 6)
    with pytest.raises(DomainError, match=r"placeholder raw .* label 3 is out of range "
                                          r"\[0, 3\), at position \[1\] of \(M\)"):
        comp(np.array([0, 3, 0, 0, 0, 0], np.int32))


def test_gather_indices_may_count_from_the_end_but_not_past_it():
    H, W = be.Axis(4, "H"), be.Axis(2, "W")
    table = be.placeholder((C, H), name="table")
    idx = be.placeholder((W,), dtype=np.int64, name="idx")
    comp = be.NumPyTransformer().computation(be.gather(table, idx, H), table, idx)
    v = np.arange(12.0, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(comp(v, np.array([-4, 3])), v[:, [-4, 3]])
    with pytest.raises(DomainError, match=r"index 4 is out of range \[-4, 4\), at position "
                                          r"\[1\] of \(W\); it is read as indices into "
                                          r"axis H:4"):
        comp(v, np.array([0, 4]))
    # be.np.take reaches the placeholder through an axis cast
    a = be.np.placeholder((5,), dtype=np.float64)
    i = be.np.placeholder((2,), dtype=np.int64, name="i")
    taken = be.NumPyTransformer().computation(be.np.take(a, i), a, i)
    np.testing.assert_array_equal(taken(np.arange(5.0), np.array([-5, 4])), [0.0, 4.0])
    with pytest.raises(DomainError, match="placeholder i .* index -6 is out of range"):
        taken(np.arange(5.0), np.array([-6, 0]))


def test_declared_domains_with_an_ignore_index():
    x = be.placeholder(N, dtype=np.int64, name="targets", domain=Domain(3, allow=(-100,)))
    assert x.domain == Domain(0, 3, (-100,)) and str(x.domain) == "[0, 3) or -100"
    comp = be.NumPyTransformer().computation(x * 1, x)
    np.testing.assert_array_equal(comp(np.array([0, -100, 2, 1, -100, 0])),
                                  [0, -100, 2, 1, -100, 0])
    with pytest.raises(DomainError, match=r"value -1 is out of range \[0, 3\) and not one "
                                          r"of -100, at position \[3\] of \(N\) \(1 more "
                                          r"value\(s\) are out of range too\); it was "
                                          r"declared so"):
        comp(np.array([0, -100, 2, -1, 5, 0]))
    # set_domain (what a loss importer calls), the range form, and removing it
    y = be.placeholder(N, dtype=np.int32, name="y")
    assert set_domain(y, 10, allow=[-1]) is y and y.domain == Domain(0, 10, (-1,))
    assert y.set_domain(5, start=-5).domain == Domain(-5, 5)
    assert be.placeholder(N, dtype=np.int8, domain=range(-2, 2)).domain == Domain(-2, 2)
    assert set_domain(y, None).domain is None
    # one_hot narrows a declared domain and keeps its ignore_index
    z = be.placeholder(N, dtype=np.int64, name="z", domain=Domain(10, allow=(-100,)))
    comp = be.NumPyTransformer().computation(be.one_hot(z, C), z)
    comp(np.array([0, -100, 2, 1, 1, 0]))
    with pytest.raises(DomainError, match="label 5 is out of range .0, 3. and not one of "
                                          "-100.*declared so; it is read as one-hot"):
        comp(np.array([0, -100, 5, 1, 1, 0]))
    # no value fits: said when the computation is built
    w = be.placeholder(N, dtype=np.int64, name="w", domain=range(5, 9))
    with pytest.raises(be.ArgumentError, match="placeholder w .*no value fits"):
        be.NumPyTransformer().computation(be.one_hot(w, C), w)


def test_domain_arguments_are_checked():
    with pytest.raises(be.ArgumentError, match="a domain needs an integer dtype, not "
                                               "float32"):
        be.placeholder(N, domain=3)
    with pytest.raises(be.ArgumentError, match=r"\[3, 1\) is empty"):
        be.placeholder(N, dtype=np.int64, domain=range(3, 1))
    with pytest.raises(be.ArgumentError, match="step 1"):
        be.placeholder(N, dtype=np.int64, domain=range(0, 6, 2))
    with pytest.raises(be.ArgumentError, match="expected an int n"):
        be.placeholder(N, dtype=np.int64, domain="3")
    with pytest.raises(be.ArgumentError, match="not a placeholder"):
        set_domain(be.Variable(N, dtype=np.int64), 3)


def test_domains_are_serialized_and_cost_one_reduction():
    x = be.placeholder(N, dtype=np.int64, name="lab", domain=Domain(4, allow=(-1,)))
    plain = be.placeholder(N, dtype=np.int64, name="plain")
    text = be.serialize([x + plain])
    back = be.deserialize_graph(text)
    assert back.op("lab").domain == Domain(0, 4, (-1,)) and back.op("plain").domain is None
    assert '"domain"' in text and text.count('"domain"') == 1  # only where there is one
    # A document without the attribute (written before domains existed) still loads.
    doc = json.loads(text)
    for rec in doc["ops"]:
        rec.get("attrs", {}).pop("domain", None)
    assert be.deserialize_graph(json.dumps(doc)).op("lab").domain is None
    # the generated check: one max over the labels viewed as unsigned, none for others
    f = be.placeholder([C, N], dtype=np.float32, name="f")
    labels = be.placeholder(N, dtype=np.int64, name="labels")
    comp = be.NumPyTransformer().computation(be.sum(f * be.one_hot(labels, C),
                                                    out_axes=()), f, labels)
    checks = [ln.strip() for ln in comp.source.splitlines() if "_bad_value" in ln]
    assert checks == ["elif labels.view(_u1).max() >= 3: _bad_value(1, labels)"]


def _model(classes=3):
    from geon.frontends import neon as nn
    F, Y = be.Axis(3, "F"), be.Axis(classes, "Y")
    net = nn.Sequential([nn.Affine(4, name="a"), nn.Activation("relu"),
                         nn.Affine(Y, name="o")])
    return nn.Model(net, [F], batch_size=4)


def test_model_fit_and_evaluate_refuse_labels_that_are_no_class():
    model = _model()
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((8, 3)).astype(np.float32), rng.integers(0, 3, 8)
    before = model.weights()
    for bad in (7, -1, 3):
        y_bad = y.copy()
        y_bad[5] = bad
        line = _line_of("# <- the fit " + "that raises")
        with pytest.raises(DomainError) as info:
            model.fit((x, y_bad), epochs=1, verbose=False)  # <- the fit that raises
        msg = str(info.value)
        assert f"Model.fit: label {bad} at y[5] is not a class of the output axis Y:3 " \
               f"(0 <= label < 3)" in msg and f'line {line})' in msg
        with pytest.raises(DomainError, match=rf"Model.evaluate: label {bad} at y\[5\]"):
            model.evaluate(x, y_bad)
    after = model.weights()
    assert all(np.array_equal(before[k], after[k]) for k in before)  # nothing trained
    model.fit((x, y), epochs=1, verbose=False)
    assert set(model.evaluate(x, y)) == {"loss", "accuracy"}
    # the training computation's labels carry the domain themselves
    train = model.train_computation(4)
    assert train.params[1].domain == Domain(3)
    with pytest.raises(DomainError, match="placeholder labels_train .* label 3 is out of "
                                          "range"):
        train(x[:4], np.array([0, 1, 3, 2]))


# --- 3. GEON_* environment variables ----------------------------------------------------------

def test_bad_environment_values_warn_and_use_the_default():
    with pytest.warns(be.GeonWarning, match=r"environment variable GEON_X='abc' is not an "
                                            r"integer; using the default \(4\)"):
        assert _env.env_int("GEON_X", 4, environ={"GEON_X": "abc"}) == 4
    with pytest.warns(be.GeonWarning, match=r"GEON_X='-2' is not an integer >= 0"):
        assert _env.env_int("GEON_X", 4, environ={"GEON_X": "-2"}) == 4
    assert _env.env_int("GEON_X", 4, environ={"GEON_X": " 3 "}) == 3
    assert _env.env_int("GEON_X", 4, environ={}) == 4
    with pytest.warns(be.GeonWarning, match="GEON_Y='maybe' is not one of 1, true"):
        assert _env.env_flag("GEON_Y", True, environ={"GEON_Y": "maybe"}) is True
    assert _env.env_flag("GEON_Y", True, environ={"GEON_Y": "Off"}) is False


def test_import_survives_bad_geon_variables():
    code = ("import os, geon; from geon.transformers import fusion, threads; "
            "from geon.transformers.numpy import blas; "
            "print(fusion.MAX_THREADS == threads.budget(dict(os.environ, "
            "GEON_NUM_THREADS='')), blas.ENABLED)")
    env = dict(os.environ, GEON_NUM_THREADS="abc", GEON_BLAS_ACCUMULATE="maybe",
               PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["True", "True"]
    assert "GEON_NUM_THREADS='abc' is not an integer" in p.stderr
    assert "GEON_BLAS_ACCUMULATE='maybe'" in p.stderr


# --- 4. deep documents --------------------------------------------------------------------------

def _flat_chain_document(depth):
    A = be.Axis(2, "A")
    doc = json.loads(be.serialize(be.placeholder([A], name="x")))
    prev = "A"
    for _ in range(depth):
        doc["axes"]["(" + prev + ")"] = {"parts": [prev]}
        prev = "(" + prev + ")"
    doc["ops"][0]["outputs"][0]["axes"] = [prev]
    return json.dumps(doc)


def test_a_deep_flattened_axis_chain_is_a_serialization_error():
    with pytest.raises(be.SerializationError, match="nests more than 32 deep"):
        be.deserialize(_flat_chain_document(500))
    loaded = be.deserialize(_flat_chain_document(30))    # deep, but within the bound
    assert loaded.axes[0].length == 2
    a = be.Axis(2, "A")
    for _ in range(40):
        a = FlattenedAxis([a])
    with pytest.raises(be.SerializationError, match="nests more than 32 deep"):
        be.serialize(be.placeholder([a]))


def test_a_flattened_axis_of_many_shallow_parts_round_trips():
    """The depth bound counts nesting, not parts: 40 parts, each two deep, is fine."""
    parts = [FlattenedAxis([FlattenedAxis([be.Axis(2, f"P{i}a"), be.Axis(3, f"P{i}b")]),
                            be.Axis(1, f"P{i}c")]) for i in range(40)]
    x = be.placeholder([FlattenedAxis(parts)], name="wide")
    loaded = be.deserialize(be.serialize(x * 2.0))
    assert loaded.axes[0].length == 6 ** 40


def test_a_flattened_axis_of_too_many_shared_parts_is_refused():
    doc = json.loads(be.serialize(be.placeholder([be.Axis(2, "A")], name="x")))
    doc["axes"]["B"] = {"length": 2}
    lo, hi = "A", "B"
    for _ in range(14):   # each level uses the last two twice: 2**14 plain axes in all
        doc["axes"]["(" + lo + "*" + hi + ")"] = {"parts": [lo, hi]}
        doc["axes"]["(" + hi + "*" + lo + ")"] = {"parts": [hi, lo]}
        lo, hi = "(" + lo + "*" + hi + ")", "(" + hi + "*" + lo + ")"
    with pytest.raises(be.SerializationError, match="stands for more than 4096 axes"):
        be.deserialize(json.dumps(doc))


def test_a_deeply_nested_user_op_parameter_is_a_serialization_error():
    scale = be.define_op("Round3Scale", lambda x, k: x * 2.0, axes=lambda x, k: x.axes,
                         params=("k",))
    x = be.placeholder([C], name="x")
    doc = json.loads(be.serialize(scale(x, k=((1,),))))
    rec = next(r for r in doc["ops"] if r["op"].startswith("user:"))
    assert be.deserialize(json.dumps(doc)).params["k"] == ((1,),)
    v = 1
    for _ in range(450):
        v = {"tuple": [v]}
    rec["attrs"]["k"] = v
    with pytest.raises(be.SerializationError, match=r"attrs\.k.*nested more than 32 deep"):
        be.deserialize(json.dumps(doc))
    deep = 1
    for _ in range(40):
        deep = (deep,)
    with pytest.raises(be.SerializationError, match="attribute k.*nested more than 32"):
        be.serialize(scale(x, k=deep))


# --- 5. a larger model's checkpoint -----------------------------------------------------------

def _trained(n, width):
    """A transformer of ``n`` variables: ``layer{i}/w`` (A, B) and ``layer{i}/b``
    (a ``width`` axis), alternately."""
    A, B = be.Axis(4, "A"), be.Axis(3, "B")
    t = be.NumPyTransformer()
    vs = [be.Variable([A, B] if i % 2 == 0 else [be.Axis(width, f"Wd{width}")],
                      name=f"layer{i}/{'w' if i % 2 == 0 else 'b'}") for i in range(n)]
    t.computation([v * 1.0 for v in vs])
    t.initialize()
    return t


def test_a_larger_models_checkpoint_names_the_variables_that_differ(tmp_path):
    path = tmp_path / "big.npz"
    _trained(16, 5).save(path)
    small = _trained(3, 2)
    with zipfile.ZipFile(path) as z:  # the case of the issue: the directory is too big
        size = sum(46 + len(i.filename) + len(i.extra) for i in z.infolist())
    assert size > 46 + 128 + 22 + 3 * (46 + 128 + 14)
    with pytest.raises(be.CheckpointError) as info:
        small.restore(path)
    msg = str(info.value)
    assert "declares a zip directory" not in msg
    assert "does not match the variables: missing [], unexpected ['layer10/w', " in msg
    assert "and 3 more" in msg
    assert "of another shape or dtype: layer1/b is float32[5], variable needs " \
           "float32[2]" in msg


def test_a_checkpoint_of_other_shapes_says_names_and_shapes_together(tmp_path):
    path = tmp_path / "wide.npz"
    _trained(4, 5).save(path)
    with pytest.raises(be.CheckpointError, match=r"missing \[\], unexpected "
                                                 r"\['layer3/b'\]; of another shape or "
                                                 r"dtype: layer1/b is float32\[5\], "
                                                 r"variable needs float32\[2\]"):
        _trained(3, 2).restore(path)


def test_a_larger_plain_npz_lists_its_arrays(tmp_path):
    path = tmp_path / "plain.npz"
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.zeros(2, np.float32))
    with zipfile.ZipFile(path, "w") as z:
        for i in range(40):
            z.writestr(f"extra{i:02d}.npy", buf.getvalue())
    with pytest.raises(be.CheckpointError, match=r"missing \['layer0/w', 'layer1/b', "
                                                 r"'layer2/w'\], unexpected \['extra00', "
                                                 r".* and 30 more"):
        _trained(3, 2).restore(path)
