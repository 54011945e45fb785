"""Every op-table entry (tests/op_table.py): forward values through the NumPy transformer
and the reference evaluator in float32 and float64, and gradients by central differences.
"""

import numpy as np
import pytest

import geon as be
from gradcheck import assert_gradcheck
from op_table import CASES, GRAD_CASES, REQUIRED_OPS, C, H, N

DTYPES = [np.float32, np.float64]
#: Honest tolerances: float32 results against a float64 NumPy computation from the same
#: (float32-rounded) inputs, and float64 against float64.
TOL = {np.dtype(np.float32): dict(rtol=1e-5, atol=1e-6),
       np.dtype(np.float64): dict(rtol=1e-12, atol=1e-12)}


def test_table_covers_every_op():
    covered = {c.op for c in CASES}
    assert REQUIRED_OPS <= covered, sorted(REQUIRED_OPS - covered)


def test_table_names_are_unique():
    names = [c.name for c in CASES]
    assert len(names) == len(set(names))


def test_table_has_gradient_cases_for_every_differentiable_op():
    not_differentiable = {"equal", "not_equal", "less_equal", "greater", "argmax", "argmin",
                          "one_hot", "stop_gradient", "argsort"}
    checked = {c.op for c in GRAD_CASES}
    assert REQUIRED_OPS - not_differentiable <= checked, \
        sorted(REQUIRED_OPS - not_differentiable - checked)


def _run(case, dtype, path):
    arrays = case.arrays(dtype)
    xs = [be.placeholder(i.axes, dtype=i.dtype(dtype)) for i in case.inputs]
    op = case.make(xs, dtype)
    assert op.axes.names == case.out, f"axes {op.axes.names}, expected {case.out}"
    assert op.dtype == case.result_dtype(dtype)
    if path == "numpy":
        got = be.NumPyTransformer().computation(op, *xs)(*arrays)
    else:
        got = be.evaluate(op, feeds=dict(zip(xs, arrays)))
    return np.asarray(got), case.expected(arrays)


@pytest.mark.parametrize("path", ["numpy", "reference"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_forward(case, dtype, path):
    got, want = _run(case, dtype, path)
    assert got.shape == want.shape == tuple(a.length for a in _out_axes(case, dtype))
    assert got.dtype == case.result_dtype(dtype)
    if got.dtype.kind in "iu":
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, **TOL[np.dtype(got.dtype)])


def _out_axes(case, dtype):
    xs = [be.placeholder(i.axes, dtype=i.dtype(dtype)) for i in case.inputs]
    return case.make(xs, dtype).axes


@pytest.mark.parametrize("graph", ["axes", "lowered"])
@pytest.mark.parametrize("case", GRAD_CASES, ids=[c.name for c in GRAD_CASES])
def test_gradient(case, graph):
    """``deriv`` of the Axes graph, and of the graph after lowering (primitive rules),
    through the NumPy transformer and the reference evaluator, against central
    differences."""
    arrays = case.arrays(np.float64)
    inputs = [(i.axes, a) for i, a in zip(case.inputs, arrays)]
    assert_gradcheck(lambda *xs: case.make(xs, np.float64), inputs,
                     lowered=(graph == "lowered"))


def test_stop_gradient_derivative():
    # d/dx sum(x * stop_gradient(x)) = stop_gradient(x) = x, not 2 x.
    x = be.placeholder((C, N), dtype=np.float64)
    y = be.sum(x * be.stop_gradient(x), reduction_axes=(C, N))
    g = be.deriv(y, x)
    v = np.random.default_rng(0).standard_normal((3, 5))
    got = be.NumPyTransformer().computation(g, x)(v)
    np.testing.assert_allclose(got, v, rtol=1e-14)


@pytest.mark.parametrize("build", [
    lambda x: x > 0.0, lambda x: be.equal(x, x), lambda x: be.sign(x),
    lambda x: be.stop_gradient(x) * 3.0])
def test_zero_derivatives(build):
    x = be.placeholder((C, H), dtype=np.float64)
    y = be.sum(build(x), reduction_axes=(C, H))
    g = be.deriv(y, x)
    got = be.NumPyTransformer().computation(g, x)(np.ones((3, 4)))
    np.testing.assert_array_equal(got, np.zeros((3, 4)))
