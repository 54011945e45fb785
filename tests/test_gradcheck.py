"""Tests of the gradient checker itself (tests/gradcheck.py): it passes for correct
derivative rules and reports a planted wrong one.

Adjoints are cached on the cost op, so every check builds a fresh graph.
"""

import numpy as np
import pytest

import geon as be
from geon.op_graph import autodiff
from geon.op_graph import op_graph as og
from gradcheck import gradcheck, numeric_gradients
from op_table import CASES, C, H, N

ORIGINAL_TANH_RULE = autodiff.ADJOINTS[og.Tanh]
RNG = np.random.default_rng(7)
X_CN = RNG.uniform(-1.5, 1.5, (3, 5))
W_CH = RNG.uniform(-1.0, 1.0, (3, 4))
X_HN = RNG.uniform(-1.0, 1.0, (4, 5))


def _tanh_graph(x):
    return be.tanh(x)


def _mlp(w, x):
    return be.tanh(be.dot(w, x))


@pytest.mark.parametrize("mode", ["placeholder", "variable"])
def test_passes_for_the_correct_tanh_rule(mode):
    res = gradcheck(_tanh_graph, [((C, N), X_CN)], mode=mode)
    assert res.ok, str(res)
    # and it really compared something: the gradient is not trivially zero
    assert res.inputs[0].scale > 0.1
    assert res.inputs[0].error < 1e-8


@pytest.mark.parametrize("mode", ["placeholder", "variable"])
def test_reports_a_planted_wrong_tanh_rule(monkeypatch, mode):
    def wrong(op, d):
        return (d * 2.0 * (1.0 - op * op),)
    monkeypatch.setitem(autodiff.ADJOINTS, og.Tanh, wrong)
    res = gradcheck(_tanh_graph, [((C, N), X_CN)], mode=mode)
    assert not res.ok
    assert "WRONG" in str(res)
    # the analytic values are exactly twice the numeric ones
    r = res.inputs[0]
    np.testing.assert_allclose(r.analytic, 2 * r.numeric, rtol=1e-7, atol=1e-9)


def test_reports_a_slightly_wrong_rule(monkeypatch):
    # a relative error of 1e-4 is far above the checker's resolution
    def wrong(op, d):
        return (d * (1.0 - op * op) * (1.0 + 1e-4),)
    monkeypatch.setitem(autodiff.ADJOINTS, og.Tanh, wrong)
    assert not gradcheck(_tanh_graph, [((C, N), X_CN)]).ok


def test_reports_a_planted_rule_inside_a_larger_graph(monkeypatch):
    assert gradcheck(_mlp, [((C, H), W_CH), ((H, N), X_HN)]).ok

    def wrong(op, d):  # the derivative of tanh(x) taken as 1 - x*x instead of 1 - y*y
        x = op.args[0]
        return (d * (1.0 - x * x),)
    monkeypatch.setitem(autodiff.ADJOINTS, og.Tanh, wrong)
    res = gradcheck(_mlp, [((C, H), W_CH), ((H, N), X_HN)])
    assert not res.ok
    assert not res.inputs[0].ok and not res.inputs[1].ok


def test_reports_a_wrong_dot_rule_for_one_operand_only(monkeypatch):
    right = autodiff.ADJOINTS[og.Dot]

    def wrong(op, d):
        da, db = right(op, d)
        return da, db * 1.5
    monkeypatch.setitem(autodiff.ADJOINTS, og.Dot, wrong)
    res = gradcheck(be.dot, [((C, H), W_CH), ((H, N), X_HN)])
    assert res.inputs[0].ok
    assert not res.inputs[1].ok
    assert not res.ok


def test_reports_a_wrong_reduction_rule(monkeypatch):
    monkeypatch.setitem(autodiff.ADJOINTS, og.Sum, lambda op, d: (d * 0.0,))
    res = gradcheck(lambda x: be.sum(be.sin(x), reduction_axes=C), [((C, N), X_CN)])
    assert not res.ok


def test_restored_rule_passes_again():
    # monkeypatch undid the planted rules of the tests above
    assert autodiff.ADJOINTS[og.Tanh] is ORIGINAL_TANH_RULE
    assert gradcheck(_tanh_graph, [((C, N), X_CN)]).ok


def test_numeric_gradient_of_a_known_function():
    # L = sum(x**3 * R)  =>  dL/dx = 3 x**2 R
    R = np.random.default_rng(3).standard_normal((3, 5))
    (num,) = numeric_gradients(lambda x: x ** 3.0, [(be.Axes(C, N), X_CN)], R, [0])
    np.testing.assert_allclose(num, 3 * X_CN ** 2 * R, rtol=1e-8, atol=1e-9)


def test_scalar_output_and_label_inputs():
    labels = np.array([0, 2, 1, 1, 0])

    def build(w, x, y):
        return be.sum(be.cross_entropy_multi(be.softmax(be.dot(w, x)), be.one_hot(y, C)),
                      reduction_axes=N)
    res = gradcheck(build, [((C, H), W_CH), ((H, N), X_HN), ((N,), labels)])
    assert res.ok, str(res)
    assert [r.index for r in res.inputs] == [0, 1]


def test_every_table_gradient_case_is_float_output():
    # the checker needs a float output; argmax-style cases are excluded from it
    for case in CASES:
        if case.grad:
            assert case.out_dtype in (None, "float32")
