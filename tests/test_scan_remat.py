"""be.scan(..., remat=...): the reverse derivative's policies ("step", "none",
"checkpoints", "checkpoints:N") give the same values and derivatives
(geon/op_graph/control.py)."""

import json

import numpy as np
import pytest

import geon as be
from geon.op_graph.control import Scan, remat_segment
from geon.op_graph.core import toposort
from geon.op_graph.params import clone_graph
from geon.transformers.passes.unroll import UnrollScans
from gradcheck import assert_gradcheck

H, D, H2 = be.Axis(3, "H"), be.Axis(2, "D"), be.Axis(3, "H2")


def tanh_rnn(steps, remat, reverse=False):
    """``(inputs, results, op)``: a tanh RNN's cost and its derivatives."""
    T = be.Axis(steps, "T")
    x, h0 = be.placeholder([T, D], dtype=np.float64), be.placeholder([H], dtype=np.float64)
    w, u = be.placeholder([H2, H], dtype=np.float64), be.placeholder([H, D], dtype=np.float64)

    def cell(h, xt):
        hn = be.tanh(be.cast_axes(be.dot(w, h), [H]) + be.dot(u, xt))
        return hn, be.sum(hn * hn, out_axes=())
    hT, ys = be.scan(cell, h0, x, T, reverse=reverse, remat=remat)
    cost = be.sum(ys * be.sin(be.constant(np.arange(steps, dtype=np.float64), axes=[T])),
                  out_axes=()) + be.sum(hT * hT, out_axes=())
    return [x, h0, w, u], [cost, hT, ys] + be.deriv(cost, [x, h0, w, u]), hT.args[0]


def feeds(steps, seed=3):
    r = np.random.default_rng(seed)
    return (r.standard_normal((steps, 2)), r.standard_normal(3),
            0.5 * r.standard_normal((3, 3)), r.standard_normal((3, 2)))


def close(a, b, rtol=1e-12):
    for p, q in zip(a, b):
        scale = max(np.max(np.abs(p)), 1e-300)
        assert np.max(np.abs(np.asarray(p) - q)) <= rtol * scale


@pytest.mark.parametrize("steps, remat", [(9, "checkpoints"), (10, "checkpoints"),
                                          (3, "checkpoints"), (1, "checkpoints"),
                                          (10, "checkpoints:4"), (7, "checkpoints:7"),
                                          (5, "checkpoints:8"),   # T < segment
                                          (9, "none"), (1, "none")])
@pytest.mark.parametrize("reverse", [False, True])
def test_policies_agree(steps, remat, reverse):
    vals = feeds(steps)
    want = None
    for policy in ("step", remat):
        ins, res, op = tanh_rnn(steps, policy, reverse)
        assert op.remat == policy
        got = be.NumPyTransformer().computation(res, *ins)(*vals)
        ref = be.evaluate(res, feeds=dict(zip(ins, vals)))
        close(got, ref)
        if want is None:
            want = got
        close(want, got)


@pytest.mark.parametrize("steps, reverse, remat", [(9, False, "checkpoints"),
                                                   (10, True, "checkpoints"),
                                                   (6, False, "checkpoints"),
                                                   (6, False, "none"), (5, True, "none")])
def test_policies_gradcheck(steps, reverse, remat):
    T = be.Axis(steps, "T")

    def build(x, h0, w, u, b):
        def cell(h, xt):
            hn = be.tanh(be.cast_axes(be.dot(w, h), [H]) + be.dot(u, xt) + b)
            return hn, be.sum(hn * hn, out_axes=())
        hT, ys = be.scan(cell, h0, x, T, reverse=reverse, remat=remat)
        return be.sum(ys, out_axes=()) + be.sum(hT, out_axes=())
    r = np.random.default_rng(steps)
    assert_gradcheck(build, [([T, D], r.standard_normal((steps, 2))),
                             ([H], r.standard_normal(3)),
                             ([H2, H], 0.5 * r.standard_normal((3, 3))),
                             ([H, D], r.standard_normal((3, 2))),
                             ([H], r.standard_normal(3))])


def test_several_carries_sequences_and_an_integer_carry():
    T = be.Axis(7, "T")

    def build(remat):
        x = be.placeholder([T, H], dtype=np.float64)
        z = be.placeholder([H, T], dtype=np.float64)   # the axis elsewhere
        c0, m0 = be.placeholder([H], dtype=np.float64), be.placeholder([H], dtype=np.float64)
        w = be.placeholder([H], dtype=np.float64)

        def body(carry, xt):
            n, c, m = carry
            a, b = xt
            c2 = be.tanh(c * w + a) * b
            return (n + 1, c2, be.maximum(m, c2) + 0.1 * m), (c2 * m, a + m)
        (n, cT, mT), (y1, y2) = be.scan(body, (be.constant(0, dtype=np.int64), c0, m0),
                                        (x, z), T, remat=remat)
        cost = be.sum(y1, out_axes=()) + be.sum(y2 * y2, out_axes=()) \
            + be.sum(cT * mT, out_axes=())
        ins = [x, z, c0, m0, w]
        return ins, [n, cost] + be.deriv(cost, ins)
    r = np.random.default_rng(5)
    vals = (r.standard_normal((7, 3)), r.standard_normal((3, 7)), r.standard_normal(3),
            r.standard_normal(3) + 2.0, r.standard_normal(3))
    ins, res = build("step")
    want = be.NumPyTransformer().computation(res, *ins)(*vals)
    for remat in ("checkpoints:3", "none"):
        ins, res = build(remat)
        got = be.NumPyTransformer().computation(res, *ins)(*vals)
        assert int(got[0]) == 7
        close(want, got)


def test_second_derivative_and_hvp():
    T = be.Axis(10, "T")
    out = {}
    for remat in ("step", "checkpoints", "none"):
        x = be.placeholder([T], dtype=np.float64)
        a = be.placeholder([], dtype=np.float64)
        hT, _ = be.scan(lambda h, xt: (be.tanh(h * a + xt), None),
                        0.5 * be.constant(1.0, dtype=np.float64), x, T, remat=remat)
        g = be.deriv(hT, a)
        gg = be.deriv(g, a)
        hv = be.hvp(hT, a, 1.0)
        X = np.random.default_rng(2).standard_normal(10)
        out[remat] = be.NumPyTransformer().computation([g, gg, hv], x, a)(X, 0.3)
        gf = be.NumPyTransformer().computation(g, x, a)
        e = 1e-5
        np.testing.assert_allclose(out[remat][1], (gf(X, 0.3 + e) - gf(X, 0.3 - e)) / (2 * e),
                                   rtol=1e-6)
    close(out["step"], out["checkpoints"])
    close(out["step"], out["none"])


def test_checkpoints_do_not_read_the_history():
    ins, res, op = tanh_rnn(16, "checkpoints")
    readers = {o for o in toposort(res) for a in o.args if a in op.history}
    assert not readers
    scans = [o for o in toposort(res) if isinstance(o, Scan)]
    assert any(o.axis.length == 4 and o.axis.name == "T_seg4" for o in scans)
    ins, res, op = tanh_rnn(16, "step")
    assert {o for o in toposort(res) for a in o.args if a in op.history}


def test_segment_lengths_and_errors():
    assert [remat_segment("checkpoints", t) for t in (0, 1, 2, 4, 5, 9, 10, 1000)] == \
        [1, 1, 2, 2, 3, 3, 4, 32]
    assert remat_segment("none", 10) is None
    assert remat_segment("step", 10) is None and remat_segment("checkpoints:6", 10) == 6
    T = be.Axis(4, "T")
    x = be.placeholder([T, H], dtype=np.float64)
    for bad in ("all", "checkpoints:0", "checkpoints:x", 3):
        with pytest.raises(be.ArgumentError, match="remat="):
            be.scan(lambda h, xt: (h + xt, None), be.placeholder([H], dtype=np.float64),
                    x, T, remat=bad)


def test_serialized_printed_and_kept_apart_by_cse():
    T = be.Axis(4, "T")
    x, h0 = be.placeholder([T, H], dtype=np.float64), be.placeholder([H], dtype=np.float64)
    a, _ = be.scan(lambda h, xt: (h * xt, None), h0, x, T, remat="checkpoints")
    text = be.serialize(a)
    back = be.deserialize(text)
    assert be.serialize(back) == text
    assert '"remat": "checkpoints"' in text.replace("\n", " ").replace("  ", " ") \
        or '"remat":"checkpoints"' in text
    assert "checkpoints" in be.graph_text(a)
    # a document written before remat existed loads as "step"
    doc = json.loads(be.serialize(be.scan(lambda h, xt: (h * xt, None), h0, x, T)[0]))
    for rec in doc["ops"]:
        if rec.get("type") == "Scan" or rec.get("op") == "Scan":
            rec["attrs"].pop("remat")
    old = be.deserialize(json.dumps(doc))
    assert old.args[0].remat == "step"
    b, _ = be.scan(lambda h, xt: (h * xt, None), h0, x, T, remat="step")
    c, _ = be.scan(lambda h, xt: (h * xt, None), h0, x, T, remat="checkpoints")
    cost = be.sum(b, out_axes=()) + be.sum(c, out_axes=())
    X, H0 = np.random.default_rng(1).standard_normal((4, 3)), np.ones(3)
    f = be.NumPyTransformer().computation([cost] + be.deriv(cost, [x]), x, h0)
    np.testing.assert_allclose(f(X, H0)[1], 2 * be.evaluate(
        be.deriv(be.sum(b, out_axes=()), x), feeds={x: X, h0: H0}), rtol=1e-12)


class _Unrolling(be.NumPyTransformer):
    """The NumPy transformer with scans unrolled first (as the GPU transformers run)."""

    def passes(self):
        return [UnrollScans()] + super().passes()


@pytest.mark.parametrize("remat", ["checkpoints:2", "none"])
@pytest.mark.parametrize("reverse", [False, True])
def test_policies_run_unrolled(reverse, remat):
    vals = feeds(5)
    ins, res, _ = tanh_rnn(5, remat, reverse)
    want = be.NumPyTransformer().computation(res, *ins)(*vals)
    ins, res, _ = tanh_rnn(5, remat, reverse)
    comp = _Unrolling().computation(res, *ins)
    assert "_scan_bodies" not in comp.source
    close(want, comp(*vals), rtol=1e-11)


def test_benchmark_graph_policies_agree():
    from benchmarks.scan import remat_graph
    losses = []
    for remat in ("step", "checkpoints"):
        results, x, t = remat_graph(6, 8, 2, remat)
        comp = be.NumPyTransformer().computation(results, x, t)
        r = np.random.default_rng(0)
        X = r.standard_normal((6, 32, 2)).astype(np.float32)
        Y = r.standard_normal((8, 2)).astype(np.float32)
        losses.append([float(comp(X, Y)[0]) for _ in range(3)])  # SGD steps
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)


def _scans(ops):
    return [o for o in toposort(ops) if isinstance(o, Scan)]


def _classes(body):
    return {type(o).__name__ for o in toposort(list(body.results))}


def test_none_stores_the_steps_values_and_runs_one_forward_loop():
    """Under "none" the adjoint scan reads the forward step's values (here the tanh)
    from stacks a twin of the forward scan makes; the transformer's CSE merges the
    twin into the user's scan, so one forward loop runs. Under "step" the adjoint
    body recomputes the tanh."""
    _, res, op = tanh_rnn(6, "step")
    (adj,) = [s for s in _scans(res) if s is not op]
    assert "Tanh" in _classes(adj.body)
    ins, res, op = tanh_rnn(6, "none")
    scans = _scans(res)
    assert len(scans) == 3   # the user's, its twin with the stored values, the adjoint
    twin = next(s for s in scans if s is not op and s.body.carries_out == op.body.carries_out)
    assert twin.body.ys_out[:1] == op.body.ys_out and len(twin.body.ys_out) == 2
    adj = next(s for s in scans if s not in (op, twin))
    assert "Tanh" not in _classes(adj.body)
    assert any(a in twin.ys[1:] for a in adj.args)
    mapping = clone_graph(res)
    after = be.make_transformer("numpy").transform([mapping[r] for r in res])
    left = _scans(after)
    assert len(left) == 2
    # the forward scan's ys: its own and the stored tanh; the adjoint's: x's cotangent
    # and, for each of the weights w and u, the two operands of its share (a product,
    # taken over all steps after the loop: control.STACKED_PRODUCT_ELEMENTS)
    assert sorted(len(s.body.ys_out) for s in left) == [2, 5]


def test_merging_twins_whose_stored_values_differ():
    """Two derivatives of one scan under "none" (of two costs) make two twins with
    different stored values; CSE merges the three forward scans into one holding the
    union of their ys."""
    T = be.Axis(5, "T")
    x, h0 = be.placeholder([T, H], dtype=np.float64), be.placeholder([H], dtype=np.float64)
    hT, ys = be.scan(lambda h, xt: (be.tanh(h * xt), be.exp(h) * be.sin(xt)), h0, x, T,
                     remat="none")
    c1 = be.sum(hT, out_axes=())
    c2 = be.sum(ys, out_axes=())
    res = [c1, c2, be.deriv(c1, x), be.deriv(c2, x)]
    assert len(_scans(res)) == 5
    mapping = clone_graph(res)
    after = be.make_transformer("numpy").transform([mapping[r] for r in res])
    forward = [s for s in _scans(after) if not s.reverse]
    assert len(forward) == 1
    X, H0 = np.random.default_rng(4).standard_normal((5, 3)), np.full(3, 0.5)
    got = be.NumPyTransformer().computation(res, x, h0)(X, H0)
    close(got, be.evaluate(res, feeds={x: X, h0: H0}))


def test_none_serializes_and_differentiates_again_after_loading():
    ins, res, op = tanh_rnn(4, "none")
    vals = feeds(4)
    want = be.NumPyTransformer().computation(res, *ins)(*vals)
    text = be.serialize(res)
    back = be.deserialize(text)
    assert be.serialize(back) == text
    loaded_ins = [next(o for o in toposort(back) if o.name == p.name) for p in ins]
    close(be.NumPyTransformer().computation(back, *loaded_ins)(*vals), want)
    # the gradient of the loaded cost, again: the twin's stored values are reused
    g = be.deriv(back[0], loaded_ins[2])
    close([be.NumPyTransformer().computation(g, *loaded_ins)(*vals)], [want[5]])


def test_none_with_a_repeated_y_and_a_value_over_the_scanned_axis():
    """A body returning one op twice among its ys (the merge keeps the scan whose ys
    hold all the others'), and one reading a constant over the scanned axis itself
    (not stacked along it: the adjoint recomputes it); values as under "step"."""
    T = be.Axis(5, "T")
    pos = be.constant(np.linspace(0.1, 0.5, 5), axes=[T], dtype=np.float64)
    X, H0 = np.random.default_rng(6).standard_normal((5, 3)), np.full(3, 0.3)
    got = {}
    for remat in ("step", "none"):
        x, h0 = be.placeholder([T, H], dtype=np.float64), be.placeholder([H], dtype=np.float64)

        def body(h, xt):
            k = be.sum(be.exp(pos * h), reduction_axes=[T])
            hn = be.tanh(h * xt + 0.1 * k)
            y = be.sin(hn)
            return hn, (y, y)
        hT, (y1, y2) = be.scan(body, h0, x, T, remat=remat)
        c = be.sum(y1, out_axes=()) + be.sum(y2 * y2, out_axes=()) + be.sum(hT, out_axes=())
        res = [c] + be.deriv(c, [x, h0])
        got[remat] = be.NumPyTransformer().computation(res, x, h0)(X, H0)
        close(got[remat], be.evaluate(res, feeds={x: X, h0: H0}))
    close(got["step"], got["none"])
