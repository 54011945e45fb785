"""Mixing op families: automatic coercions, build-time errors, explicit conversions."""

import inspect

import numpy as np
import pytest

import geon as be
from geon.op_graph.coercion import ToAxes, ToPositional, family
from gradcheck import assert_gradcheck

C, N = be.Axis(3, "C"), be.Axis(4, "N", batch=True)


def here():
    """The line of the caller (errors must point at the user's line)."""
    return inspect.currentframe().f_back.f_lineno


def run(results, params, values):
    return be.NumPyTransformer().computation(results, *params)(*values)


def test_same_shape_numpy_operand_takes_the_axes_operands_axes():
    xa = be.placeholder([C, N], name="xa")
    xn = be.np.placeholder((3, 4), name="xn")
    for r in (xa + xn, xn * xa, be.maximum(xn, xa)):
        assert r.axes.names == ("C", "N") and family(r) == "axes"
        coerced = [a for a in r.args if isinstance(a, ToAxes)]
        assert len(coerced) == 1 and coerced[0].args[0] is xn      # an explicit op
    A, B = np.arange(12.0).reshape(3, 4), np.linspace(0, 1, 12).reshape(3, 4)
    got = run([xa + xn, xn * xa], [xa, xn], [A, B])
    assert np.allclose(got[0], A + B) and np.allclose(got[1], A * B)


def test_coercion_is_differentiable():
    xa = be.placeholder([C, N], dtype=np.float64, name="xa")
    xn = be.np.placeholder((3, 4), dtype=np.float64, name="xn")
    cost = be.sum((xa - xn) * (xa - xn), out_axes=())
    dn = be.deriv(cost, xn)
    assert dn.axes == xn.axes                                  # positional, like xn
    A, B = np.ones((3, 4)), np.arange(12.0).reshape(3, 4)
    assert np.allclose(run(dn, [xa, xn], [A, B]), 2 * (B - A))


def test_mixing_without_a_matching_shape_raises_at_build_time():
    xa = be.placeholder([C, N], name="xa")
    xn = be.np.placeholder((4, 3), name="xn")
    with pytest.raises(be.FamilyError) as e:
        line = here(); xa + xn  # noqa: E702 - the error must name this line
    msg = str(e.value)
    assert "Add: cannot mix op families" in msg
    assert "xa (Axes family, axes (C:3, N:4))" in msg
    assert "xn (NumPy family, shape (4, 3))" in msg
    assert f'File "{__file__}", line {line}' in msg
    assert "be.np.with_axes" in msg and "be.np.positional" in msg


@pytest.mark.parametrize("build, fragment", [
    (lambda xa, xn: be.dot(xa, xn), "dot contracts axes by name"),
    (lambda xa, xn: be.dot(xn, xn), "be.np.dot, be.np.matmul or @"),
    (lambda xa, xn: xa @ xn, "@ multiplies positional tensors"),
    (lambda xa, xn: be.np.sum(xa), "a NumPy-family function needs a positional tensor"),
    (lambda xa, xn: be.np.concatenate([xn, xa]), "needs a positional tensor"),
    (lambda xa, xn: be.np.asarray(xa), "needs a positional tensor"),
])
def test_family_errors(build, fragment):
    xa = be.placeholder([C, N], name="xa")
    xn = be.np.placeholder((3, 4), name="xn")
    with pytest.raises(be.FamilyError, match=fragment) as e:
        build(xa, xn)
    assert "xa (Axes family, axes (C:3, N:4))" in str(e.value) or "xn (NumPy" in str(e.value)
    assert f'File "{__file__}"' in str(e.value)


def test_indexing_an_axes_tensor_explains_itself():
    xa = be.placeholder([C, N], name="xa")
    with pytest.raises(TypeError, match="slice_along_axis"):
        xa[0]
    assert xa.T.axes.names == ("N", "C")                      # the Axes meaning of .T


def test_explicit_conversions_both_ways():
    D = be.Axis(4, "D")
    xn = be.np.placeholder((3, 4), dtype=np.float64, name="xn")
    named = be.np.with_axes(xn, [C, D])
    assert isinstance(named, ToAxes) and named.axes.names == ("C", "D")
    xa = be.placeholder([C, D], dtype=np.float64, name="xa")
    view = be.np.positional(xa, [D, C])                        # a chosen axis order
    assert isinstance(view, ToPositional) and be.np.shape(view) == (4, 3)
    assert family(view) == "numpy"
    back = be.np.positional(named)                             # round trip
    A, B = np.arange(12.0).reshape(3, 4), np.linspace(0, 1, 12).reshape(3, 4)
    got = run([named, view, back, view @ xn], [xn, xa], [A, B])
    assert np.array_equal(got[0], A) and np.array_equal(got[1], B.T)
    assert np.array_equal(got[2], A) and np.allclose(got[3], B.T @ A)
    with pytest.raises(be.AxisMismatchError, match="does not have the shape"):
        be.np.with_axes(xn, [D, C])
    with pytest.raises(be.AxisMismatchError, match="not an ordering"):
        be.np.positional(xa, [C])


def test_gradients_through_conversions():
    D = be.Axis(4, "D")

    def build(a, b):
        named = be.np.with_axes(a, [C, D])
        view = be.np.positional(b, [D, C])
        return be.np.with_axes(view @ a, [D, be.Axis(4, "D2")]) * 2.0 + be.dot(named, b)
    rng = np.random.default_rng(0)
    assert_gradcheck(build, [(be.np.canonical_axes((3, 4)), rng.standard_normal((3, 4))),
                             (be.Axes(C, D), rng.standard_normal((3, 4)))])


def test_scalars_and_sample_axes_mix_with_every_family():
    xa = be.placeholder([C, N], name="xa")
    xn = be.np.placeholder((3,), name="xn")
    s = be.np.sum(xn)                                          # 0-d: every family
    per_sample = be.placeholder([N], name="ps")                # only a sample axis
    x = be.simple.placeholder((3,), sample=N, name="x")
    assert (xa * s).axes == xa.axes and (x * per_sample).axes.names == ("N", "-1")
    assert (x + xn).axes.names == ("N", "-1")                  # NumPy + Simple Axes
    with pytest.raises(be.FamilyError):
        x + be.placeholder([be.Axis(4, "N", batch=True), be.Axis(2, "E")])


def test_ops_of_passes_are_left_alone():
    """Lowering builds positional ops by name (inside ``rewriting``): no coercion."""
    xn = be.np.placeholder((2, 3), name="xn")
    w = be.np.placeholder((3, 4), name="w")
    r = be.np.tanh(xn @ w) + be.np.sum(xn, axis=1, keepdims=True)
    comp = be.NumPyTransformer().computation(r, xn, w)
    X, W = np.ones((2, 3)), np.ones((3, 4))
    assert np.allclose(comp(X, W), np.tanh(X @ W) + X.sum(1, keepdims=True))
