"""Serializing control flow (geon/op_graph/serialize_bodies.py): scans, conds and while
loops with their bodies as nested graphs round-trip, compute and differentiate as before
loading; plans with a scan run on the NumPy backend; hostile documents with bodies are
refused with SerializationError naming the place."""

import copy
import json
import random

import numpy as np
import pytest

import geon as be
from geon.op_graph.control import Scan
from geon.op_graph.params import clone_graph
from geon.op_graph.serialize import MAX_BODY_DEPTH, VERSION, VERSIONS
from geon.transformers import backends as bk
from gradcheck import assert_gradcheck
from test_serialize import _mutate

T, H, D = be.Axis(4, "T"), be.Axis(3, "H"), be.Axis(2, "D")
A = be.Axis(3, "A")
rng = np.random.default_rng(35)
X, H0 = rng.standard_normal((4, 2)), rng.standard_normal(3)
UV = rng.standard_normal((3, 2))


def _rnn():
    """A scan with a carry, a sequence and a closure (the variable U)."""
    x = be.placeholder([T, D], dtype=np.float64, name="x")
    h0 = be.placeholder([H], dtype=np.float64, name="h0")
    U = be.Variable(axes=[H, D], initial_value=UV, dtype=np.float64, name="U")
    hT, ys = be.scan(lambda h, xt: (be.tanh(h + be.dot(U, xt)), h * 2.0), h0, x, T)
    return x, h0, hT, ys


def _both(results, feeds):
    """The values of ``results`` by the reference evaluator and the NumPy transformer."""
    ref = be.evaluate(results, feeds=feeds)
    got = be.NumPyTransformer().computation(results, *feeds)(*feeds.values())
    return ref, got


def _round_trip(results, placeholders, values):
    """Write and read ``results``; check the document is stable and that the loaded ops
    compute what the originals do (both engines). Returns the loaded graph."""
    text = be.serialize(results)
    loaded = be.deserialize_graph(text)
    assert be.serialize(loaded.value) == text
    want = _both(results, dict(zip(placeholders, values)))
    got = _both(loaded.value, {loaded.op(p.name): v for p, v in zip(placeholders, values)})
    for w, g in zip(want, got):
        for a, b in zip(w, g):
            np.testing.assert_allclose(b, a, rtol=1e-13, atol=1e-13)
    return loaded


# --- round trips ------------------------------------------------------------------------

def test_a_scan_round_trips_as_a_nested_graph():
    x, h0, hT, ys = _rnn()
    doc = json.loads(be.serialize([hT, ys]))
    assert doc["version"] == VERSION == 3 and VERSIONS == (2, 3)
    scan = next(r for r in doc["ops"] if r["op"] == "Scan")
    body = scan["attrs"]["body"]["scan_body"]
    assert (body["carries"], body["sequences"], body["closures"], body["inputs"]) == \
        (1, 1, 1, 3)
    assert [r["op"] for r in body["ops"][:3]] == ["Placeholder"] * 3
    assert all(len(r) == 2 for r in body["results"]) and len(body["results"]) == 2
    assert scan["attrs"]["axis"] == {"axis": "T"} and scan["attrs"]["reverse"] is False
    loaded = _round_trip([hT, ys], [x, h0], [X, H0])
    op = loaded.value[0].args[0]
    assert isinstance(op, Scan) and op.counts == (1, 1, 1, 1)


def test_documents_without_bodies_stay_version_2():
    # readers of version 2 (the native runtime) read every document they can
    x = be.placeholder([H], dtype=np.float64, name="x")
    assert json.loads(be.serialize(be.tanh(x)))["version"] == 2


def test_derivatives_of_scans_and_nested_scans_round_trip():
    x, h0, hT, ys = _rnn()
    cost = be.sum(ys, out_axes=()) + be.sum(hT, out_axes=())
    dx, dh0 = be.deriv(cost, [x, h0])
    _round_trip([cost, dx, dh0], [x, h0], [X, H0])
    # a scan inside a scan's body, reversed, and its derivative (a body in a body in a
    # body: the adjoint of the inner scan lives in the outer adjoint's body)
    S = be.Axis(5, "S")
    inner = be.placeholder([S, D], dtype=np.float64, name="inner")

    def outer(h, xt):
        c, _ = be.scan(lambda c, it: (c * 0.5 + be.sum(it * xt, out_axes=()), None),
                       be.sum(h, out_axes=()), inner, S, reverse=True)
        return be.tanh(h * c), None
    out, _ = be.scan(outer, h0, x, T)
    g = be.deriv(be.sum(out, out_axes=()), x)
    _round_trip([out, g], [x, h0, inner], [X, H0, rng.standard_normal((5, 2))])


def test_cond_and_while_loop_round_trip():
    p = be.placeholder([], dtype=np.float64, name="p")
    v = be.placeholder([A], dtype=np.float64, name="v")
    w = be.placeholder([A], dtype=np.float64, name="w")
    y = be.cond(p, lambda u: be.tanh(u) * w, lambda u: u * u, v)
    gv, gw = be.deriv(be.sum(y, out_axes=()), [v, w])
    V, W = np.array([0.5, -1.0, 2.0]), np.array([1.0, 2.0, 3.0])
    for P in (1.0, 0.0):
        loaded = _round_trip([y, gv, gw], [p, v, w], [P, V, W])
    cond = loaded.value[0].args[0]
    assert cond.branches[0].inputs == cond.branches[1].inputs   # shared stand-ins
    a = be.placeholder([], dtype=np.float64, name="a")
    z, steps = be.while_loop(lambda c: c[0] < 100.0, lambda c: (c[0] * c[0] + a, c[1] + 1),
                             (a, be.constant(0, dtype=np.int32)), max_steps=10)
    da = be.deriv(z, a)
    loaded = _round_trip([z, steps, da], [a], [2.0])
    loop = loaded.value[0].args[0]
    assert loop.pred.inputs == loop.body.inputs


def test_a_loaded_scan_differentiates():
    # deriv of the loaded scan (not of a written derivative) against central differences
    x, h0, hT, ys = _rnn()
    loaded = be.deserialize_graph(be.serialize([hT, ys]))
    lx, lh = loaded.op("x"), loaded.op("h0")

    def build(xi, hi):
        mapping = clone_graph(loaded.value, replace={lx: xi, lh: hi})
        return be.sum(mapping[loaded.value[1]], reduction_axes=T) + mapping[loaded.value[0]]
    assert_gradcheck(build, [((T, D), X), ((H,), H0)])


def test_a_plan_with_a_scan_runs_on_the_numpy_backend():
    x, h0, hT, ys = _rnn()
    want = be.NumPyTransformer().computation([hT, ys], x, h0)(X, H0)
    document = bk.plan([hT, ys], x, h0)
    graph = json.loads(document)["graph"]
    assert graph["version"] == 3 and any(r["op"] == "Scan" for r in graph["ops"])
    with bk.backend("numpy").load(document) as ex:
        got = ex.run(X, H0)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-13)


def test_writing_refuses_what_a_body_cannot_hold():
    x, h0, hT, ys = _rnn()
    op = hT.args[0]
    outer = be.placeholder([H], dtype=np.float64, name="outer")
    body = op.body
    body.carries_out = (body.carries_out[0] + outer,)   # an outer placeholder, not closed
    with pytest.raises(be.SerializationError, match="reads outer, a placeholder that is "
                                                    "not one of the body's stand-ins"):
        be.serialize(hT)


def _nested(depth):
    """``depth`` scans, each in the body of the one before."""
    h0 = be.placeholder([H], dtype=np.float64, name="h0")

    def step(level):
        def body(h, _):
            if level == depth:
                return h * 0.5, None
            c, _ = be.scan(step(level + 1), h, (), T)
            return c, None
        return body
    return be.scan(step(1), h0, (), T)[0], h0


def test_nesting_is_bounded_on_writing():
    out, h0 = _nested(3)
    _round_trip([out], [h0], [H0])
    with pytest.raises(be.SerializationError, match=f"nest more than {MAX_BODY_DEPTH}"):
        be.serialize(_nested(MAX_BODY_DEPTH + 1)[0])


# --- hostile documents ------------------------------------------------------------------

def _rnn_doc():
    x, h0, hT, ys = _rnn()
    return json.loads(be.serialize([hT, ys]))


def _scan_rec(doc):
    return next(r for r in doc["ops"] if r["op"] == "Scan")


def _body(doc):
    return _scan_rec(doc)["attrs"]["body"]["scan_body"]


def _cond_doc():
    p = be.placeholder([], dtype=np.float64, name="p")
    v = be.placeholder([A], dtype=np.float64, name="v")
    return json.loads(be.serialize(be.cond(p, lambda u: be.tanh(u), lambda u: u * u, v)))


def _branch(doc, k):
    rec = next(r for r in doc["ops"] if r["op"] == "Cond")
    return rec["attrs"]["branches"]["tuple"][k]["subgraph"]


def _edit(make, fn):
    doc = make()
    fn(doc)
    return doc


def _set_arg(rec, j, ref):
    rec["args"][j] = ref


def _self_nested(levels):
    """A scan whose body holds a scan whose body holds ... (``levels`` deep), made by
    putting a body into a copy of itself."""
    out, _ = _nested(2)
    doc = json.loads(be.serialize(out))
    outer = _body(doc)
    inner_rec = next(r for r in outer["ops"] if r["op"] == "Scan")
    template = copy.deepcopy(outer)
    body = outer
    for _ in range(levels):
        rec = next(r for r in body["ops"] if r["op"] == "Scan")
        rec["attrs"]["body"]["scan_body"] = copy.deepcopy(template)
        body = rec["attrs"]["body"]["scan_body"]
    assert inner_rec is not None
    return doc


HOSTILE = [
    ("outer op", lambda: _edit(_rnn_doc, lambda d: _set_arg(_body(d)["ops"][3], 0, [7, 0])),
     r"ops\[\d+\] \(Scan 'Scan_\d+'\)\.attrs\.body\.scan_body\.ops\[3\] \(Dot '[^']+'\)"
     r"\.args\[0\]: dangling reference to op 7"),
    ("forward reference", lambda: _edit(_rnn_doc, lambda d: _set_arg(
        _body(d)["ops"][3], 1, [4, 0])), r"scan_body\.ops\[3\].*dangling reference to op 4"),
    ("self reference", lambda: _edit(_rnn_doc, lambda d: _set_arg(
        _body(d)["ops"][3], 1, [3, 0])), r"scan_body\.ops\[3\].*dangling reference to op 3"),
    ("forward dep", lambda: _edit(_rnn_doc, lambda d: _body(d)["ops"][3].update(
        other_deps=[5])), r"scan_body\.ops\[3\].*other_deps\[0\]: dangling reference"),
    ("dangling result", lambda: _edit(_rnn_doc, lambda d: _body(d)["results"].__setitem__(
        0, [40, 0])), r"scan_body\.results\[0\]: dangling reference to op 40"),
    ("void result", lambda: _edit(_rnn_doc, lambda d: _body(d)["results"].__setitem__(
        0, [4, None])), r"scan_body\.results\[0\]\[1\]: expected an integer"),
    ("placeholder not a stand-in", lambda: _edit(_rnn_doc, lambda d: _body(d).update(
        inputs=2)), r"scan_body\.ops\[2\] \(Placeholder 'closure_U'\): a placeholder that "
                    r"is not one of the body's stand-ins"),
    ("variable in a body", lambda: _edit(_rnn_doc, lambda d: _body(d).update(inputs=2) or
                                         _body(d)["ops"][2].update(
        op="Variable", attrs={"initial_value": 0.0, "trainable": True, "persistent": True})),
     r"scan_body\.ops\[2\] \(Variable 'closure_U'\): a Variable, which a body cannot hold"),
    ("stand-in not a placeholder", lambda: _edit(_rnn_doc, lambda d: _body(d).update(
        inputs=4, closures=2)), r"scan_body\.ops\[3\] \(Dot .*each a Placeholder"),
    ("too many stand-ins", lambda: _edit(_rnn_doc, lambda d: _body(d).update(inputs=99)),
     r"scan_body\.inputs: 99 stand-ins, but the body has only \d+ ops"),
    ("counts", lambda: _edit(_rnn_doc, lambda d: _body(d).update(closures=2)),
     r"scan_body: 1 carries, 1 sequences and 2 closures, but 3 stand-ins"),
    ("negative count", lambda: _edit(_rnn_doc, lambda d: _body(d).update(carries=-1)),
     r"scan_body\.carries: expected an integer >= 0"),
    ("stand-ins and args", lambda: _edit(_rnn_doc, lambda d: _scan_rec(d)["args"].pop()),
     r"\(Scan 'Scan_\d+'\): ArgumentError: Scan .*3 args expected"),
    ("carry layout", lambda: _edit(_rnn_doc, lambda d: _body(d)["results"].__setitem__(
        0, [1, 0])), r"scan_body: result 0 \(D:2\) float64 is not laid out as carry 0"),
    ("unknown body key", lambda: _edit(_rnn_doc, lambda d: _body(d).update(code="x")),
     r"scan_body: unknown key 'code'"),
    ("body op type", lambda: _edit(_rnn_doc, lambda d: _body(d)["ops"][3].update(
        op="eval")), r"scan_body\.ops\[3\]\.op: unknown op type 'eval'"),
    ("version 2 body", lambda: _edit(_rnn_doc, lambda d: d.update(version=2)),
     r"attrs\.body\.scan_body: a body needs version 3 of the format; the document has "
     r"version 2"),
    ("branch stand-in count", lambda: _edit(_cond_doc, lambda d: _branch(d, 1).update(
        inputs=0)), r"branches\.tuple\[1\]\.subgraph\.inputs: 0 stand-ins, but its op's "
                    r"first body has 1"),
    ("branch stand-in type", lambda: _edit(_cond_doc, lambda d: _branch(d, 1)["ops"][0][
        "outputs"][0].update(dtype="float32")), r"subgraph\.ops\[0\] \(Placeholder "
                                                r"'operand0'\): differs from stand-in 0"),
    ("branch results", lambda: _edit(_cond_doc, lambda d: _branch(d, 1)["results"].append(
        [0, 0])), r"\(Cond 'Cond_\d+'\): AxisMismatchError: .*branch 1's results"),
    ("body as a function", lambda: _edit(_rnn_doc, lambda d: next(
        r for r in d["ops"] if r["op"] == "Variable")["attrs"].update(
        initial_value=copy.deepcopy(_scan_rec(d)["attrs"]["body"]))),
     r"\(Variable 'U'\)\.attrs\.initial_value\.scan_body: a body may only be an "
     r"attribute that holds one \(Scan\.body, "),
    ("body as an axis", lambda: _edit(_rnn_doc, lambda d: _scan_rec(d)["attrs"].update(
        axis=copy.deepcopy(_scan_rec(d)["attrs"]["body"]))),
     r"\(Scan 'Scan_\d+'\)\.attrs\.axis\.scan_body: a body may only be"),
    ("nesting", lambda: _self_nested(MAX_BODY_DEPTH + 2),
     f"bodies nest more than {MAX_BODY_DEPTH} deep"),
]


@pytest.mark.parametrize("make, pattern", [h[1:] for h in HOSTILE], ids=[h[0] for h in HOSTILE])
def test_hostile_bodies_are_refused_naming_the_place(make, pattern):
    with pytest.raises(be.SerializationError, match=pattern):
        be.deserialize(json.dumps(make()))


def test_self_nested_documents_load_within_the_bound():
    loaded = be.deserialize(json.dumps(_self_nested(MAX_BODY_DEPTH - 3)))
    assert isinstance(loaded.args[0], Scan)


def test_fuzzed_documents_with_bodies_raise_only_serialization_error():
    x, h0, hT, ys = _rnn()
    cost = be.sum(ys, out_axes=())
    text = be.serialize([hT, be.deriv(cost, x)])
    doc = json.loads(text)
    rand = random.Random(35)
    outcomes = {"error": 0, "loaded": 0}
    for _ in range(300):
        try:
            loaded = be.deserialize(_mutate(doc, rand))
        except be.SerializationError:
            outcomes["error"] += 1
            continue
        outcomes["loaded"] += 1   # what loads writes and reads back the same
        again = be.serialize(loaded)
        assert be.serialize(be.deserialize(again)) == again
    assert outcomes["error"] > 200, outcomes
