"""The NumPy transformer's ``unslice_add`` pass (geon/transformers/passes/unslice.py):
``x + Unslice(a, key)`` as one UnsliceAdd, ``a`` added into ``x`` where it lies."""

import json

import numpy as np
import pytest

import geon as be
from geon.errors import AxisMismatchError
from geon.op_graph import primitives as pr
from geon.transformers import backends as bk

gnp = be.np
SHAPE = (4, 3, 5)


def _build():
    """The gradient of a value read through four slices (each gate of a cell) and a
    concatenation, both sums of Unslices once lowered."""
    x = gnp.placeholder(SHAPE, dtype=np.float64)
    parts = [gnp.tanh(x[k]) * (k + 1) for k in range(4)]
    y = parts[0] * parts[1] + parts[2] - parts[3]
    loss = gnp.sum(y * y)
    return [be.deriv(loss, x), gnp.concatenate([x, gnp.exp(x)], 1)], x


def _loss(X):
    p = [np.tanh(X[k]) * (k + 1) for k in range(4)]
    y = p[0] * p[1] + p[2] - p[3]
    return np.sum(y * y)


def _kinds(comp):
    return [type(op).__name__ for op in comp.order]


def test_sums_of_unslices_become_unslice_adds_with_the_same_values():
    X = np.random.default_rng(0).standard_normal(SHAPE)
    outs, x = _build()
    comp = be.NumPyTransformer().computation(outs, x)
    grad, cat = comp(X)
    outs, x = _build()
    plain = be.NumPyTransformer(disable=["unslice_add"]).computation(outs, x)
    grad0, cat0 = plain(X)
    kinds, kinds0 = _kinds(comp), _kinds(plain)
    # four slices' adjoints: one Unslice and three UnsliceAdds; the concatenation:
    # one of each (instead of 4 + 2 Unslices and 3 + 1 sums)
    assert kinds.count("UnsliceAdd") == 4 and kinds.count("Unslice") == 2, kinds
    assert "UnsliceAdd" not in kinds0 and kinds0.count("Unslice") == 6, kinds0
    # the same sums in the same order (x + 0 is x, the zeros' sign aside)
    np.testing.assert_array_equal(grad, grad0)
    np.testing.assert_array_equal(cat, cat0)
    np.testing.assert_array_equal(cat, np.concatenate([X, np.exp(X)], 1))
    # and the gradient is the loss's, by central differences
    eps, num = 1e-6, np.zeros(SHAPE)
    for idx in np.ndindex(SHAPE):
        d = np.zeros(SHAPE)
        d[idx] = eps
        num[idx] = (_loss(X + d) - _loss(X - d)) / (2 * eps)
    np.testing.assert_allclose(grad, num, rtol=1e-7, atol=1e-9)


def test_an_unslice_add_writes_over_the_sum_so_far_where_it_dies():
    outs, x = _build()
    comp = be.NumPyTransformer().computation(outs[:1], x)
    adds = [op for op in comp.order if isinstance(op, pr.UnsliceAdd)]
    in_place = [op for op in adds if op in comp.plan.inplace]
    # every add but the last, whose value is the result (a new array each call)
    assert len(adds) == 3 and len(in_place) == 2, comp.source
    assert comp.source.count("np.copyto(") == 1, comp.source


def test_an_unslice_read_elsewhere_stays():
    x = gnp.placeholder((2, 3), dtype=np.float64)
    u = gnp.concatenate([x, x * 2.0], 0)      # Unslice + Unslice, then their sum
    s = gnp.sum(x[0] * 3.0)
    g = be.deriv(s + gnp.sum(x * x), x)       # x[0]'s adjoint, an Unslice, is also
    comp = be.NumPyTransformer().computation([u, g], x)   # added to x's other term
    X = np.arange(6.0).reshape(2, 3)
    got_u, got_g = comp(X)
    np.testing.assert_array_equal(got_u, np.concatenate([X, 2 * X], 0))
    want = 2 * X
    want[0] += 3
    np.testing.assert_array_equal(got_g, want)


def test_a_plan_holds_no_unslice_adds():
    """A plan document holds the standard base set, which other backends (geon's
    native runtime) know: the pass is off for it."""
    outs, x = _build()
    doc = json.loads(bk.plan(outs[:1], x))   # (the gradient: 1 Unslice + 3 sums)
    kinds = {r["op"] for r in doc["graph"]["ops"]}
    assert "Unslice" in kinds and "UnsliceAdd" not in kinds


def test_an_unslice_add_checks_its_shapes():
    x = gnp.placeholder((4, 3), dtype=np.float64)
    a = gnp.placeholder((3,), dtype=np.float64)
    op = pr.UnsliceAdd(x, a, (1, slice(None)))
    assert op.axes.lengths == (4, 3) and op.dtype == np.float64
    with pytest.raises(AxisMismatchError, match="UnsliceAdd"):
        pr.UnsliceAdd(x, a, (slice(None), 1))      # x[:, 1] has 4 elements, not 3


def test_an_unslice_add_exports_to_torch_and_evaluates():
    """Its PyTorch rule (the exporter holds the NumPy transformer's base set) and its
    reference value, with a negative-step key, against NumPy; its gradients through
    torch's autograd."""
    torch = pytest.importorskip("torch", reason="the export needs PyTorch")
    from geon.transformers.torch import to_torch
    R, C, K = be.Axis(5, "UaR"), be.Axis(3, "UaC"), be.Axis(2, "UaK")
    x = be.placeholder((R, C), dtype=np.float64, name="x")
    a = be.placeholder((K, C), dtype=np.float64, name="a")
    key = (slice(4, 0, -3), slice(None))          # rows 4 and 1
    y = pr.UnsliceAdd(x, a, key)
    X, A = np.arange(15.0).reshape(5, 3), np.array([[10.0, 20, 30], [40, 50, 60]])
    want = X.copy()
    want[4:0:-3] += A
    np.testing.assert_array_equal(be.evaluate(y, feeds={x: X, a: A}), want)
    module = to_torch(y, x, a)
    tx = torch.tensor(X, requires_grad=True)
    ta = torch.tensor(A, requires_grad=True)
    got = module(tx, ta)
    np.testing.assert_array_equal(got.detach().numpy(), want)
    weights = torch.arange(15.0, dtype=torch.float64).reshape(5, 3)
    (got * weights).sum().backward()
    np.testing.assert_array_equal(tx.grad.numpy(), weights.numpy())
    np.testing.assert_array_equal(ta.grad.numpy(), weights.numpy()[4:0:-3])


def test_a_graph_the_numpy_transformer_compiled_still_lowers_elsewhere():
    """The pass rewrites the graph the frontend holds (``forward``): a later plan, a
    NumPy transformer without the pass and the GPU transformer's code generation
    lower its UnsliceAdds back to the standard ops (an Unslice and a sum)."""
    from geon.transformers.gpu import CudaCodegenTransformer
    outs, x = _build()
    X = np.random.default_rng(2).standard_normal(SHAPE)
    want = be.NumPyTransformer().computation(outs[:1], x)(X)
    assert any(isinstance(op, pr.UnsliceAdd) for op in be.NumPyTransformer().computation(
        outs[:1], x).order)
    doc = json.loads(bk.plan(outs[:1], x))
    assert "UnsliceAdd" not in {r["op"] for r in doc["graph"]["ops"]}
    plain = be.NumPyTransformer(disable=["unslice_add"]).computation(outs[:1], x)
    assert not any(isinstance(op, pr.UnsliceAdd) for op in plain.order)
    np.testing.assert_array_equal(plain(X), want)
    CudaCodegenTransformer().computation(outs[:1], x)   # (no LoweringError)
