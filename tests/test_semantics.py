"""Semantics that used to surprise: assignments pulled into computations, errors of
bad arguments (type, wording, location), truth values of ops, tags."""

import re
import warnings

import numpy as np
import pytest

import geon as be
from geon.op_graph.axes import Axis

C = Axis(3, "C")
N = Axis(4, "N", batch=True)
Y = Axis(2, "Y")
HERE = re.escape(__file__)


def where():
    """A pattern for this file's ``File "...", line N`` (any line)."""
    return f'File "{HERE}", line \\d+'


def _model():
    x = be.placeholder([C, N], name="x")
    y0 = be.placeholder([Y, N], name="y0")
    w = be.Variable([Y, C], initial_value=lambda s: np.arange(6.0).reshape(s) / 10,
                    name="w")
    cost = be.sum(be.square(be.dot(w, x) - y0), out_axes=())
    step = be.SetItem(w, w - 0.01 * be.deriv(cost, w), name="step")
    return x, y0, w, cost, step


# --- 1. assignments pulled in by ordering -----------------------------------------------

def test_read_built_after_an_update_names_the_update_and_the_ways_out():
    x, y0, w, cost, step = _model()
    predict = be.dot(w, x, name="predict")  # built after the step: ordered after it
    with pytest.raises(be.ArgumentError) as info:
        be.NumPyTransformer().computation(predict, x)
    msg = str(info.value)
    assert isinstance(info.value, ValueError)
    assert "needs placeholder(s) y0" in msg
    assert "y0 is read by SetItem step (an assignment to w" in msg
    assert "Dot predict (built at" in msg
    # both locations are this file, and the three ways out are named
    assert len(re.findall(HERE, msg)) >= 3
    assert "build it before the assignment" in msg
    assert "sequence=False" in msg and "be.value_of(w)" in msg


def test_computation_that_runs_an_unrequested_update_warns_and_lists_it():
    w = be.Variable([C], initial_value=1.0, name="w")
    halve = be.SetItem(w, w * 0.5, name="halve")
    read = be.sum(w, out_axes=(), name="read")
    t = be.NumPyTransformer()
    with pytest.warns(be.GeonWarning, match="SetItem halve .* runs though it was not "
                                            "requested: Sum read") as rec:
        comp = t.computation(read)
    assert rec[0].filename == __file__  # points at the user's computation() line
    assert comp.pulled_in == [(halve, read)]
    assert comp() == pytest.approx(1.5)            # the semantics stay: it halved first
    assert np.allclose(t.state[w], 0.5)
    with warnings.catch_warnings():                # requested: no warning
        warnings.simplefilter("error")
        both = t.computation([read, halve])
    assert both.pulled_in == []


def test_value_of_reads_storage_without_running_the_update():
    x, y0, w, cost, step = _model()
    predict = be.dot(be.value_of(w), x)            # built after the step, not ordered
    t = be.NumPyTransformer()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pred = t.computation(predict, x)
    train = t.computation([cost, step], x, y0)
    xv = np.linspace(-1, 1, 12).reshape(3, 4)
    yv = np.ones((2, 4))
    assert pred.pulled_in == []
    first = pred(xv)
    assert np.allclose(first, t.state[w] @ xv)
    for _ in range(3):
        before = t.state[w].copy()
        again = pred(xv)
        assert np.array_equal(t.state[w], before)  # predicting leaves the weights alone
        assert np.allclose(again, before @ xv)
        train(xv, yv)
        assert not np.array_equal(t.state[w], before)  # training changes them
    # derivatives flow through value_of as through w
    g = be.deriv(be.sum(be.value_of(w) * 2.0, out_axes=()), w)
    assert np.allclose(be.evaluate(g), 2.0)


def test_value_of_in_the_same_computation_reads_before_the_update():
    w = be.Variable([C], initial_value=1.0, name="w")
    add = be.SetItem(w, w + 1.0)
    old = be.value_of(w) * 1.0
    new = w * 1.0
    t = be.NumPyTransformer()
    o, _, n = t.computation([old, add, new])()
    assert np.allclose(o, 1.0) and np.allclose(n, 2.0)


def test_value_of_needs_storage():
    with pytest.raises(be.ArgumentError, match="value_of needs a Variable"):
        be.value_of(be.constant(1.0))


# --- 2. a placeholder given twice ---------------------------------------------------------

def test_placeholder_twice_as_parameter():
    x = be.placeholder([C], name="x")
    with pytest.raises(ValueError, match=f"placeholder x \\(built at {where()}\\) is given "
                                         f"twice") as info:
        be.NumPyTransformer().computation(x * 2, x, x)
    assert isinstance(info.value, be.GeonError)


# --- 3. tags ------------------------------------------------------------------------------

def test_a_string_is_one_tag():
    x = be.placeholder([C], tags="hidden")
    assert x.tags == {"hidden", "in"}
    assert be.tanh(x).__class__(x, tags=("a", "b")).tags == {"a", "b"}


# --- 4. error classes -----------------------------------------------------------------------

def test_deriv_of_non_scalar_is_a_value_error():
    w = be.Variable([C], name="w")
    with pytest.raises(ValueError, match=f"a non-scalar cost needs error=.*deriv called at "
                                         f"{where()}") as info:
        be.deriv(w * 2, w)
    assert isinstance(info.value, be.GeonError)


def test_keywords_to_a_computation_are_a_feed_error():
    x = be.placeholder([C], name="x")
    z = be.placeholder([C], name="z")
    comp = be.NumPyTransformer().computation(x * z, x, z)
    with pytest.raises(be.FeedError, match=r"by position, one per parameter \(x, z\); got "
                                           r"keyword\(s\) x, z"):
        comp(x=np.ones(3), z=np.ones(3))


def test_every_bad_argument_error_is_a_geon_error():
    x = be.placeholder([C], name="x")
    cases = [lambda: be.SetItem(be.constant(1.0), 2.0),
             lambda: be.NumPyTransformer().computation(x * 2, "x"),
             lambda: be.Variable([C], initial_value=np.array([1.5, 2, 3]), dtype=np.int32),
             lambda: be.Axis(-1, "Q"),
             lambda: be.NumPyTransformer(sample_axis="middle"),
             lambda: be.np.reshape(be.np.placeholder((2, 3)), (4, 4))]
    for case in cases:
        with pytest.raises(be.GeonError) as info:
            case()
        assert isinstance(info.value, ValueError), info.value


# --- 5. build-time errors name the op, the axes and the user's line -----------------------

def test_deriv_error_with_wrong_axes():
    w = be.Variable([C], name="w")
    c = be.tanh(w)
    with pytest.raises(be.AxisMismatchError,
                       match=f"error= Constant .* has axes \\(Y:2\\) but the cost Tanh "
                             f"{c.name} \\(built at {where()}\\) has \\(C:3\\).*deriv called "
                             f"at {where()}"):
        be.deriv(c, w, error=be.constant(1.0, axes=[Y]))


def test_array_of_unknown_axes():
    x = be.placeholder([C], name="x")
    with pytest.raises(be.AxisMismatchError,
                       match=f"Add: cannot tell the axes of an array of shape \\(7,\\).*x "
                             f"\\(C:3\\).*at {where()}"):
        x + np.ones(7)
    with pytest.raises(be.ArgumentError, match=f"array of shape \\(2, 2\\).*at {where()}"):
        be.dot(x, np.ones((2, 2)))


def test_slice_out_of_range():
    x = be.placeholder([C, N], name="x")
    with pytest.raises(be.AxisIndexError,
                       match=f"index 5 is out of range for axis C:3 of x \\(C:3, N:4\\) "
                             f"\\(at {where()}\\)") as info:
        be.slice_along_axis(x, C, 5)
    assert isinstance(info.value, IndexError) and isinstance(info.value, ValueError)


def test_unset_axis_length_at_computation():
    U = Axis(None, "U")
    u = be.placeholder([U], name="u")
    y = be.tanh(u)
    with pytest.raises(be.AxisMismatchError,
                       match=f"Placeholder u \\(built at {where()}\\) has axes \\(U:\\?\\): "
                             f"axis U has no length"):
        be.NumPyTransformer().computation(y, u)


# --- 6. misleading or unknown keywords -------------------------------------------------------

@pytest.mark.parametrize("build, message", [
    (lambda x, w: be.dot(w, x, axes=[Y]), "be.dot has no 'axes' keyword: it sums over"),
    (lambda x, w: be.sum(x, axes=[C]),
     "be.sum has no 'axes' keyword: use reduction_axes= .* or out_axes="),
    (lambda x, w: be.sum(x, axis=0), "be.sum has no 'axis' keyword: use reduction_axes="),
    (lambda x, w: be.mean(x, keepdims=True), "be.mean has no 'keepdims' keyword"),
    (lambda x, w: be.argmax(x, axis=0), "be.argmax has no 'axis' keyword"),
    (lambda x, w: be.softmax(x, axes=[C]),
     "be.softmax has no 'axes' keyword: use normalization_axes="),
    (lambda x, w: be.placeholder([C], shape=(3,)), "be.placeholder has no 'shape' keyword"),
    (lambda x, w: be.Variable([C], init=1.0),
     "Variable has no 'init' keyword; it takes axes, initial_value"),
    (lambda x, w: be.sum(x, foo=1), "be.sum has no 'foo' keyword; it takes x, "
                                    "reduction_axes, out_axes, name"),
    (lambda x, w: be.exp(x, out=x), "be.exp has no 'out' keyword: .*be.SetItem"),
    (lambda x, w: be.constant(1.0, shape=(3,)), "be.constant has no 'shape' keyword"),
    (lambda x, w: be.cross_entropy_multi(be.softmax(w), w, axes=[Y]),
     "be.cross_entropy_multi has no 'axes' keyword: use out_axes="),
])
def test_unknown_keywords_name_the_right_one(build, message):
    x = be.placeholder([C, N], name="x")
    w = be.Variable([Y, C], name="w")
    with pytest.raises(be.ArgumentError, match=message + f".*at {where()}") as info:
        build(x, w)
    assert isinstance(info.value, TypeError)


def test_keywords_that_ops_take_still_work():
    x = be.placeholder([C, N], name="x")
    s = be.sum(x, reduction_axes=C, name="s", tags="t")
    assert s.name == "s" and s.tags == {"t"}
    m = be.mean(x, out_axes=N, name="m")
    assert m.name == "m" and m.axes == be.Axes(N)  # the name is the mean's, not a part's
    d = be.dot(be.Variable([Y, C]), x, name="d")
    assert d.name == "d" and d.axes == be.Axes(Y, N)


# --- 7. truth values and feeds -------------------------------------------------------------

def test_an_op_has_no_truth_value():
    y = be.placeholder([C], name="y")
    with pytest.raises(TypeError, match=f"Less .* \\(built at {where()}\\) has no truth "
                                        f"value") as info:
        if y < 0:
            pass
    assert isinstance(info.value, be.GeonError)
    with pytest.raises(be.TruthValueError):
        bool(y)
    assert y in [y] and (y is not None)


@pytest.mark.parametrize("value, shown", [({"x": 1}, "got dict {'x': 1}"),
                                          (None, "got NoneType None"),
                                          ([[1, 2], [3]], "from list")])
def test_feed_of_a_wrong_kind_says_what_it_got(value, shown):
    x = be.placeholder([C], name="x")
    comp = be.NumPyTransformer().computation(x * 2, x)
    with pytest.raises(be.FeedError, match=re.escape(shown)):
        comp(value)
    with pytest.raises(be.FeedError, match=re.escape(shown)):
        be.Runner().run(x * 2, {x: value})
