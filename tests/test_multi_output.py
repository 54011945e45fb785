"""Ops with several results (split, max with argmax): values, derivatives in both modes,
lowering to the multi-output primitive, memory planning, fusion, CSE, JSON, be.run."""

import numpy as np
import pytest

import geon as be
from geon.op_graph import op_graph as og
from geon.op_graph import primitives as pr
from geon.transformers import fusion
from gradcheck import assert_gradcheck
from test_forward import assert_dot_test

A, B, C = be.Axis(6, "mA"), be.Axis(3, "mB"), be.Axis(4, "mC")
NB = be.Axis(2, "mN", batch=True)
F64 = np.float64


def _x(rng, *axes, dtype=F64):
    return rng.standard_normal(tuple(a.length for a in axes)).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_split_values(dtype):
    rng = np.random.default_rng(0)
    x = be.placeholder([B, A], dtype=dtype)
    p1, p2, p3 = be.split(x, A, [1, 2, 3])
    assert [p.axes.names for p in (p1, p2, p3)] == [
        ("mB", "mA[0:1]"), ("mB", "mA[1:3]"), ("mB", "mA[3:6]")]
    q1, q2 = be.split(x, A, 2)
    xv = _x(rng, B, A, dtype=dtype)
    got = be.NumPyTransformer().computation([p1, p2, p3, q1, q2 * 2.0], x)(xv)
    want = [xv[:, :1], xv[:, 1:3], xv[:, 3:], xv[:, :3], xv[:, 3:] * 2]
    for g, w in zip(got, want):
        assert g.dtype == dtype
        np.testing.assert_array_equal(g, w)
    ref = be.evaluate([p1, p2, p3, q1, q2 * 2.0], feeds={x: xv})
    for g, r in zip(got, ref):
        np.testing.assert_array_equal(g, r)


@pytest.mark.parametrize("kw,keep", [
    (dict(reduction_axes=[A]), ["mB", "mC"]),
    (dict(reduction_axes=[A, C]), ["mB"]),
    (dict(out_axes=[C, B]), ["mC", "mB"]),
    (dict(reduction_axes=[A, B, C]), []),
    (dict(), ["mN"]),  # default: all but the batch axis
])
def test_max_argmax_values(kw, keep):
    rng = np.random.default_rng(1)
    axes = [A, B, C] if "mN" not in keep else [A, NB, C]
    x = be.placeholder(axes, dtype=F64)
    m, i = be.max_argmax(x, **kw)
    assert list(m.axes.names) == keep and i.axes == m.axes and i.dtype == np.int64
    xv = _x(rng, *axes)
    names = [a.name for a in axes]
    red = [k for k, n in enumerate(names) if n not in keep]
    keep_pos = [names.index(n) for n in keep]
    flat = np.transpose(xv, keep_pos + red).reshape([xv.shape[k] for k in keep_pos] + [-1])
    got_m, got_i, plain_m, plain_i = be.NumPyTransformer().computation(
        [m, i, be.max(x, **kw), be.argmax(x, **kw)], x)(xv)
    np.testing.assert_array_equal(got_m, flat.max(-1))
    np.testing.assert_array_equal(got_i, flat.argmax(-1))
    np.testing.assert_array_equal(got_m, plain_m)
    np.testing.assert_array_equal(got_i, plain_i)


def test_one_primitive_computes_both_outputs():
    x = be.placeholder([A, B], dtype=F64)
    m, i = be.max_argmax(x, reduction_axes=[A])
    f = be.NumPyTransformer().computation([m * 2.0, i], x)
    prims = [op for op in f.ops if isinstance(op, pr.ReduceMaxArgMax)]
    assert len(prims) == 1
    assert not any(isinstance(op, (og.MaxArgMax, og.Split)) for op in f.ops)
    assert "np.max(" in f.source and "np.argmax(" in f.source


def test_gradients_of_multi_outputs():
    rng = np.random.default_rng(2)

    def build(x):
        p1, p2 = be.split(x, A, [2, 4])
        m, i = be.max_argmax(x, reduction_axes=[A])
        return be.tanh(p1) * 2.0 + be.sum(p2 * p2, reduction_axes=be.Axes(p2.axes[1])) + m

    assert_gradcheck(build, [([B, A], _x(rng, B, A))])
    assert_gradcheck(build, [([B, A], _x(rng, B, A))], lowered=True)


def test_split_with_an_unused_part_and_only_argmax():
    rng = np.random.default_rng(3)

    def build(x):
        p1, p2, p3 = be.split(x, A, 3)
        return be.sin(p2) * 3.0

    assert_gradcheck(build, [([A, B], _x(rng, A, B))])
    x = be.placeholder([A, B], dtype=F64)
    i = be.max_argmax(x, reduction_axes=[A])[1]
    xv = _x(rng, A, B)
    np.testing.assert_array_equal(be.NumPyTransformer().computation(i, x)(xv), xv.argmax(0))
    d = be.deriv(be.sum(x * 1.0, out_axes=()) + be.sum(i * 1.0, out_axes=()), x)
    # the argmax term contributes nothing
    np.testing.assert_array_equal(be.NumPyTransformer().computation(d, x)(xv),
                                  np.ones((6, 3)))


@pytest.mark.parametrize("path", ["numpy", "reference"])
def test_forward_and_reverse_agree(path):
    rng = np.random.default_rng(4)
    x = be.placeholder([A, C], dtype=F64)
    p1, p2 = be.split(x, A, [4, 2])
    m, _ = be.max_argmax(x, reduction_axes=[C])
    f = be.tanh(p1) + be.sum(p2, reduction_axes=be.Axes(p2.axes[0])) * m
    assert_dot_test([x], f, [_x(rng, A, C)], "multi", path)


def test_second_derivative_through_split():
    rng = np.random.default_rng(5)
    xv = _x(rng, A)
    x = be.Variable(axes=[A], initial_value=xv, dtype=F64)
    p1, p2 = be.split(x, A, [3, 3])
    c = be.sum(p1 * p1 * p1, out_axes=()) + be.sum(be.sin(p2), out_axes=())
    v = be.Constant(np.arange(6.0), axes=[A], dtype=F64)
    hv = be.NumPyTransformer().computation(be.hvp(c, x, v))()
    h = np.concatenate([6 * xv[:3], -np.sin(xv[3:])])
    np.testing.assert_allclose(hv, h * np.arange(6.0), rtol=1e-12)


def test_memory_plan_and_fusion_with_multi_outputs(monkeypatch):
    monkeypatch.setattr(fusion, "MIN_ELEMENTS", 1)
    monkeypatch.setattr(fusion, "BLOCK_ELEMENTS", 2)
    rng = np.random.default_rng(6)
    x = be.placeholder([A, B], dtype=F64)
    m, i = be.max_argmax(be.exp(x) * 2.0, reduction_axes=[A])
    out = be.tanh(m) * 3.0 + i * 1.0
    xv = _x(rng, A, B)
    # the NumPy code's blocked groups; the conftest verifies the plan
    f = be.NumPyTransformer(compiled=False).computation(out, x)
    e = np.exp(xv) * 2.0
    np.testing.assert_allclose(f(xv), np.tanh(e.max(0)) * 3 + e.argmax(0), rtol=1e-14)


def test_json_round_trip_cse_and_run():
    rng = np.random.default_rng(7)
    x = be.placeholder([A, B], dtype=F64, name="mx")
    p1, p2 = be.split(x, A, [2, 4])
    q1, q2 = be.split(x, A, [2, 4])         # the same split again: CSE merges them
    m, i = be.max_argmax(x, reduction_axes=[A])
    results = [p1 + q1, p2 * q2, m, i]
    text = be.serialize(results)
    loaded = be.deserialize_graph(text)
    xv = _x(rng, A, B)
    want = [2 * xv[:2], xv[2:] ** 2, xv.max(0), xv.argmax(0)]
    got = be.NumPyTransformer().computation(loaded.results, loaded.op("mx"))(xv)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert be.serialize(be.deserialize(text)) == text
    f = be.NumPyTransformer().computation(results, x)
    assert sum(isinstance(op, pr.SliceView) for op in f.ops) == 2
    for g, w in zip(f(xv), want):
        np.testing.assert_array_equal(g, w)
    for g, w in zip(be.run(results, feeds={x: xv}), want):
        np.testing.assert_array_equal(g, w)


def test_document_refers_to_outputs_by_index():
    import json
    x = be.placeholder([A], dtype=F64)
    m, i = be.max_argmax(x, reduction_axes=[A])
    doc = json.loads(be.serialize([i, m]))
    multi = [r for r in doc["ops"] if r["op"] == "MaxArgMax"]
    assert len(multi) == 1 and len(multi[0]["outputs"]) == 2
    assert not any(r["op"] == "Output" for r in doc["ops"])
    assert doc["results"] == [[multi[0]["id"], 1], [multi[0]["id"], 0]]
    doc["ops"][multi[0]["id"]]["outputs"].pop()
    with pytest.raises(be.SerializationError, match="outputs"):
        be.deserialize(json.dumps(doc))


def test_split_errors_name_the_problem():
    x = be.placeholder([A, B])
    with pytest.raises(be.AxisMismatchError, match="do not add up"):
        be.split(x, A, [2, 2])
    with pytest.raises(be.AxisMismatchError, match="equal parts"):
        be.split(x, A, 4)
    with pytest.raises(be.AxisMismatchError, match="mC"):
        og.Split(x, C, [4])
