"""The op graph: node attributes, SetItem ordering, forward / snap / Invalid, variables(),
schemas, build-time axis errors."""

import inspect
import sys

import numpy as np
import pytest

import geon as be
from geon.op_graph import nodes
from geon.op_graph import op_graph as og
from geon.op_graph import primitives as pr
from geon.transformers.passes.verify import unlowered


def line_of(marker):
    """The line number in this file of the line containing ``marker``."""
    for i, text in enumerate(inspect.getsource(sys.modules[__name__]).splitlines(), 1):
        if marker in text and "line_of(" not in text:
            return i
    raise AssertionError(marker)


A = be.Axis(3, "A")
B = be.Axis(4, "B")
NB = be.Axis(5, "NB", batch=True)


def test_op_hierarchy_and_attributes():
    assert issubclass(be.Op, nodes.Node)
    assert issubclass(nodes.Node, nodes.NameableValue)
    assert issubclass(nodes.Node, nodes.DebugInfo)
    assert issubclass(be.TensorOp, be.Op) and issubclass(be.VoidOp, be.Op)
    assert issubclass(be.ComputationOp, be.TensorOp)
    x = be.placeholder([A, B], name="x")
    first = be.exp(x)
    y = og.Tanh(x, name="t", tags={"hidden"}, follows=[first])  # MARK-build
    assert y.args == (x,)
    assert first in y.other_deps
    assert y in x.users and first in x.users
    assert y.forward is None and y.tags == {"hidden"} and y.initializers == []
    assert y.name == "t"
    y.name = "renamed"
    assert y.name == "renamed"
    assert y.filename == __file__ and y.lineno == line_of("MARK-build")
    assert y.file_info == f'File "{__file__}", line {y.lineno}'
    assert y.axes == be.Axes(A, B) and y.dtype == np.float32
    assert "in" in x.tags


def test_python_numbers_coerce_to_weak_constants():
    x = be.placeholder([A], dtype=np.float64)
    y = 2 * x + 1
    assert y.dtype == np.float64
    c = y.args[1]
    assert isinstance(c, be.Constant) and c.weak and c.axes == be.Axes()
    x32 = be.placeholder([A])
    assert (0.01 * x32).dtype == np.float32


def test_magic_methods_build_ops():
    x = be.placeholder([A])
    cases = {x + 1: og.Add, 1 - x: og.Subtract, x * x: og.Multiply, x / 2: og.Divide,
             x ** 2: og.Power, -x: og.Negative, abs(x): og.Absolute, x < 1: og.Less,
             x <= 1: og.LessEqual, x > 1: og.Greater, x >= 1: og.GreaterEqual}
    for op, cls in cases.items():
        assert type(op) is cls
    assert (x == x) is True and {x} == {x}  # identity, so ops work in sets


def test_setitem_ordering_through_user_deps():
    w = be.Variable(axes=[A], initial_value=np.arange(3.0), name="w_order")
    before = w * 1.0 + 0.0
    s = be.SetItem(w, w + 10)
    assert list(w.user_deps) == [s]
    after = w * 1.0
    assert s in after.other_deps and s not in before.other_deps
    t = be.NumPyTransformer()
    # request the later read first: ordering must come from the deps, not the list
    f = t.computation([after, s, before])
    a, none, b = f()
    assert none is None
    np.testing.assert_array_equal(b, [0, 1, 2])
    np.testing.assert_array_equal(a, [10, 11, 12])
    np.testing.assert_array_equal(t.state[w], [10, 11, 12])
    a, _, b = f()
    np.testing.assert_array_equal(b, [10, 11, 12])
    np.testing.assert_array_equal(a, [20, 21, 22])


def test_two_setitems_chain():
    w = be.Variable(axes=[A], initial_value=1.0, name="w_chain")
    s1 = be.SetItem(w, w * 2)
    s2 = be.SetItem(w, w + 1)
    assert s1 in s2.other_deps
    t = be.NumPyTransformer()
    with pytest.warns(be.GeonWarning, match="runs though it was not requested"):
        comp = t.computation([s2])          # s2's value reads w after s1: s1 runs first
    assert [a for a, _ in comp.pulled_in] == [s1]
    comp()
    np.testing.assert_array_equal(t.state[w], [3, 3, 3])


def test_setitem_broadcasts_value_and_rejects_extra_axes():
    w = be.Variable(axes=[A, B], initial_value=0.0)
    v = be.Variable(axes=[B], initial_value=np.arange(4.0))
    t = be.NumPyTransformer()
    t.computation(be.SetItem(w, v))()
    np.testing.assert_array_equal(t.state[w], np.tile(np.arange(4.0), (3, 1)))
    with pytest.raises(be.AxisMismatchError, match="NB"):
        be.SetItem(v, be.placeholder([B, NB]))
    with pytest.raises(TypeError):
        be.SetItem(be.Constant(1.0), 2.0)


def test_forward_snap_and_invalid():
    x = be.placeholder([A], dtype=np.float64, name="xs")
    e = be.exp(x)
    lg = be.log(e)
    r = lg + 1.0
    t = be.NumPyTransformer()
    f = t.computation(r, x)
    assert lg.forward is x           # log(exp(x)) -> x
    assert be.snap(lg) is x
    assert e.forward is be.Invalid   # exp left the graph and nobody asked for it
    assert be.snap(e) is e
    with pytest.raises(be.InvalidValueError, match=e.name):
        f.value(e)
    out = f(np.array([1.0, 2.0, 3.0]))
    np.testing.assert_allclose(out, [2, 3, 4])
    np.testing.assert_allclose(f.value(r), out)
    # the frontend's handle still works in a later computation
    g = t.computation(e, x)
    np.testing.assert_allclose(g(np.zeros(3)), [1, 1, 1])


def test_exp_minus_one_becomes_expm1_where_nothing_else_reads_the_exp():
    x = be.placeholder([A], dtype=np.float64, name="xe")
    xs = np.array([1e-10, 0.5, -3.0])
    forms = [be.exp(x) - 1.0, be.exp(x) + -1.0, -1.0 + be.exp(x)]
    f = be.NumPyTransformer().computation(forms, x)
    for y, got in zip(forms, f(xs)):
        assert isinstance(be.snap(y), og.Expm1)
        np.testing.assert_array_equal(got, np.expm1(xs))
    # (the comparison above tells the two apart: exp(x) - 1, rounded twice, is 8 digits
    # off at 1e-10)
    assert np.exp(xs[0]) - 1 != np.expm1(xs[0])

    # an exp built after an assignment to its argument reads the assigned value, and
    # so does the expm1 that replaces it
    v = be.Variable(axes=[A], initial_value=0.0, dtype=np.float64, name="ve")
    s = be.SetItem(v, x)
    after = be.exp(v) - 1.0
    t = be.NumPyTransformer()
    got = t.computation([s, after], x)(xs)[1]
    assert isinstance(be.snap(after), og.Expm1)
    np.testing.assert_array_equal(got, np.expm1(xs))

    # an op ordered after an assignment the exp was not (follows=) reads what the exp
    # read: the rule (and log(exp(v)) -> v) stands aside
    v = be.Variable(axes=[A], initial_value=0.5, dtype=np.float64, name="vf")
    e = be.exp(v)
    s = be.SetItem(v, x)
    ops = [og.Subtract(e, 1.0, follows=[s]), og.Log(e, follows=[s])]
    got = be.NumPyTransformer().computation([s] + ops, x)(xs)[1:]
    assert [type(be.snap(o)).__name__ for o in ops] == ["Subtract", "Log"]
    np.testing.assert_allclose(got[0], np.expm1([0.5] * 3))
    np.testing.assert_allclose(got[1], [0.5] * 3)
    # an integer exp rounds before the subtraction: not expm1's value
    y = og.Exp(x, dtype=np.int32) - 1
    got = be.NumPyTransformer().computation(y, x)(np.array([-1.0, 0.5, 2.0]))
    assert isinstance(be.snap(y), og.Subtract)
    np.testing.assert_array_equal(got, [-1, 0, 6])

    # the exp is read elsewhere too (here by the derivative): both stay
    e = be.exp(x)
    y = e - 1.0
    dy = be.deriv(be.sum(y), x)
    f = be.NumPyTransformer().computation([y, dy], x)
    got, grad = f(xs)
    assert isinstance(be.snap(y), og.Subtract) and isinstance(be.snap(e), og.Exp)
    np.testing.assert_allclose(got, np.expm1(xs), rtol=1e-6)
    np.testing.assert_allclose(grad, np.exp(xs))

    # a constant that broadcasts (more axes than the exp) is not the number 1 of the rule
    ones = be.Constant(np.ones((3, 4)), axes=[A, B])
    z = be.exp(x) - ones
    got = be.NumPyTransformer().computation(z, x)(xs)
    assert isinstance(be.snap(z), og.Subtract)
    np.testing.assert_allclose(got, np.broadcast_to((np.exp(xs) - 1)[:, None], (3, 4)))
    # subtracting 2, or exp subtracted from 1, is not the rule's either
    w = [be.exp(x) - 2.0, 1.0 - be.exp(x)]
    be.NumPyTransformer().computation(w, x)(xs)
    assert [type(be.snap(v)).__name__ for v in w] == ["Subtract", "Subtract"]


def test_expm1_derivatives_keep_their_digits_where_expm1_is_minus_one():
    x = be.placeholder([be.Axis(3, "X")], dtype=np.float64, name="xd")
    xs = np.array([-20.0, -40.0, 0.5])
    y = be.expm1(x)
    t = be.NumPyTransformer()
    grad, tangent = t.computation([be.deriv(be.sum(y), x), be.jvp(y, x, 1.0)], x)(xs)
    # exp(x), not expm1(x) + 1 (which is 0 at -40, and 2.06e-9 only to 8 digits at -20)
    np.testing.assert_allclose(grad, np.exp(xs), rtol=1e-15)
    np.testing.assert_allclose(tangent, np.exp(xs), rtol=1e-15)


def test_replacement_updates_users_outside_the_subgraph():
    x = be.placeholder([A], name="xr")
    y = x - 0.0  # an identity under IEEE (x + 0.0 is not, at x = -0.0)
    z = be.tanh(y)
    t = be.NumPyTransformer()
    t.computation(z, x)
    assert y.forward is x and be.snap(z).args[0] is x


def test_variables_are_trainable_and_ordered():
    w = be.Variable(axes=[A, B], name="w1")
    b = be.Variable(axes=[B], name="b1")
    frozen = be.Variable(axes=[B], trainable=False)
    x = be.placeholder([A, NB])
    y = be.tanh(be.dot(w, x) + b) * frozen
    assert y.variables() == [w, b]
    # the order follows the graph, not the order the variables were made in
    z = be.dot(b, be.tanh(be.dot(w, x)))
    assert z.variables() == [b, w]


def test_axis_mismatch_raised_at_build_with_op_axes_and_line():
    x = be.placeholder([be.Axis(3, "Q")], name="xq")
    y = be.placeholder([be.Axis(4, "Q")], name="yq")
    with pytest.raises(be.AxisMismatchError) as info:
        x + y  # MARK-mismatch
    msg = str(info.value)
    assert "Add" in msg and "Q:3" in msg and "Q:4" in msg and "xq" in msg
    assert f'File "{__file__}", line {line_of("MARK-mismatch")}' in msg
    with pytest.raises(be.AxisMismatchError, match="Q:3.*Q:4|Q:4.*Q:3"):
        be.dot(x, y)
    assert issubclass(be.AxisMismatchError, ValueError)


def test_axes_collection():
    ab = be.Axes(A, B)
    assert be.Axes((A, B)) == ab == be.Axes([A, B]) == be.Axes(ab)
    assert ab.names == ("A", "B") and ab.lengths == (3, 4) and ab.size == 12
    assert (ab - be.Axes(A)) == be.Axes(B)
    assert (be.Axes(A) | be.Axes(B, A)) == ab
    assert (ab & be.Axes(B)) == be.Axes(B)
    assert (be.Axes(B) + be.Axes(A)).names == ("B", "A")
    assert be.Axes(A, NB).batch_axes() == be.Axes(NB)
    assert be.Axes(A, NB).sample_axes() == be.Axes(A)
    with pytest.raises(be.AxisMismatchError):
        be.Axes(A, A)
    with pytest.raises(be.AxisMismatchError):
        ab + be.Axes(A)
    with pytest.raises(TypeError):
        be.Axes(["A"])


def test_standard_axes_lengths_are_settable():
    import geon.frontends.base.axis as ax
    old = ax.Y.length
    try:
        ax.Y.length = 7
        assert be.placeholder([ax.Y]).axes.shape == (7,)
        assert ax.N.batch and ax.T.recurrent and not ax.C.batch
    finally:
        ax.Y.length = old


def test_softmax_schema_and_stable_cross_entropy():
    Y = be.Axis(2, "Ycls")
    logits = be.Constant(np.array([1e4, 1e4]), axes=[Y], dtype=np.float64)
    target = be.Constant(np.array([1.0, 0.0]), axes=[Y], dtype=np.float64)
    s = be.softmax(logits)
    assert isinstance(s, og.Divide) and s.schema is not None
    ce = be.cross_entropy_multi(s, target)
    t = be.NumPyTransformer()
    assert t.computation(ce)() == np.log(2.0)


def test_cross_entropy_derivatives_are_softmax_minus_target_and_finite():
    Y = be.Axis(3, "Ycls3")
    x = be.Variable(axes=[Y], initial_value=np.array([1e4, -1e4, 3.0]), dtype=np.float64)
    tgt = be.Constant(np.array([0.0, 0.0, 1.0]), axes=[Y], dtype=np.float64)
    s = be.softmax(x)
    ce = be.cross_entropy_multi(s, tgt)
    d = be.deriv(ce, x)
    t = be.NumPyTransformer()
    val, grad, sm = t.computation([ce, d, s])()
    assert np.isfinite(val) and np.all(np.isfinite(grad))
    # softmax of [1e4, -1e4, 3] is [1, 0, 0] to double precision (independent values)
    np.testing.assert_allclose(grad, [1, 0, -1], atol=1e-12)
    np.testing.assert_allclose(sm, [1, 0, 0], atol=1e-300)
    np.testing.assert_allclose(val, 1e4 - 3.0, rtol=1e-15)
    # binary: logits of any size stay finite, derivative sigmoid(x) - t
    z = be.Variable(axes=[Y], initial_value=np.array([800.0, -800.0, 0.5]), dtype=np.float64)
    tb = be.Constant(np.array([0.0, 1.0, 1.0]), axes=[Y], dtype=np.float64)
    sg = be.sigmoid(z)
    ceb = be.cross_entropy_binary(sg, tb)
    db = be.deriv(ceb, z)
    vb, gb, sv = t.computation([ceb, db, sg])()
    np.testing.assert_allclose(vb, 800 + 800 + np.log1p(np.exp(-0.5)), rtol=1e-12)
    np.testing.assert_allclose(gb, [1, -1, 1 / (1 + np.exp(-0.5)) - 1], rtol=1e-14,
                               atol=1e-15)


def test_lowered_graph_has_only_base_set_ops():
    x = be.placeholder([A, NB])
    w = be.Variable(axes=[A, B])
    y = be.softmax(be.dot(w, x))
    c = be.sum(be.cross_entropy_multi(y, be.one_hot(be.argmax(y), B)), out_axes=())
    t = be.NumPyTransformer()
    f = t.computation([c, be.deriv(c, w)], x)
    assert f.ops
    for op in f.ops:
        assert unlowered(op, t.base_set) is None, op
    assert not any(isinstance(op, (og.Dot, og.Reduction, og.SetItem)) for op in f.ops)


def test_unlowerable_op_names_op_and_line():
    class NoTanh(be.NumPyTransformer):
        base_set = be.NumPyTransformer.base_set - {og.Tanh}

    x = be.placeholder([A])
    y = be.tanh(x)  # MARK-tanh
    with pytest.raises(be.LoweringError) as info:
        NoTanh().computation(y, x)
    assert y.name in str(info.value) and "Tanh" in str(info.value)
    assert f"line {line_of('MARK-tanh')}" in str(info.value)


def test_deriv_rules():
    x = be.Variable(axes=[A], initial_value=np.arange(3.0), dtype=np.float64)
    other = be.Variable(axes=[A, B], dtype=np.float64)
    c = be.sum(x * x, out_axes=())
    d1, d2 = be.deriv(c, x), be.deriv(c, x)
    assert d1 is d2  # adjoints built once per cost
    z = be.deriv(c, other)
    assert z.axes == other.axes
    t = be.NumPyTransformer()
    g, zz = t.computation([d1, z])()
    np.testing.assert_allclose(g, 2 * np.arange(3.0))
    np.testing.assert_array_equal(zz, np.zeros((3, 4)))
    v = x * 2.0
    with pytest.raises(be.GeonError, match="error="):
        be.deriv(v, x)
    e = be.Constant(np.array([1.0, 2.0, 3.0]), axes=[A], dtype=np.float64)
    np.testing.assert_allclose(t.computation(be.deriv(v, x, error=e))(), [2, 4, 6])


def test_stop_gradient():
    x = be.Variable(axes=[A], initial_value=1.0, dtype=np.float64)
    c = be.sum(x * be.stop_gradient(x * 3.0), out_axes=())
    t = be.NumPyTransformer()
    np.testing.assert_allclose(t.computation(be.deriv(c, x))(), [3, 3, 3])


def test_float64_throughout():
    x = be.placeholder([A, NB], dtype=np.float64)
    w = be.Variable(axes=[A, B], dtype=np.float64, initial_value=0.5)
    y = be.sigmoid(be.dot(w, x))
    c = be.sum(y, out_axes=())
    t = be.NumPyTransformer()
    f = t.computation([y, be.deriv(c, w)], x)
    for op in f.ops:
        if isinstance(op, be.TensorOp) and not isinstance(op, pr.ReduceArgMax):
            assert op.dtype == np.float64, op
    yv, gv = f(np.ones((3, 5)))
    assert yv.dtype == gv.dtype == np.float64


def test_ten_thousand_op_chain_without_recursion():
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(200)  # a recursive walk of 10,000 ops would fail at once
    try:
        x = be.Variable(axes=[A], initial_value=0.1, dtype=np.float64, name="chainx")
        y = x
        for i in range(10000):
            y = be.tanh(y) if i % 2 else y * 1.0001
        c = be.sum(y, out_axes=())
        d = be.deriv(c, x)
        f = be.NumPyTransformer().computation([c, d])
        cv, dv = f()
    finally:
        sys.setrecursionlimit(limit)
    # the same chain directly in NumPy, with the derivative by the chain rule
    v, g = np.full(3, 0.1), np.ones(3)
    for i in range(10000):
        if i % 2:
            v = np.tanh(v)
            g = g * (1 - v * v)
        else:
            v = v * 1.0001
            g = g * 1.0001
    np.testing.assert_allclose(cv, v.sum(), rtol=1e-10)
    np.testing.assert_allclose(dv, g, rtol=1e-11)


def test_simplified_results_keep_ordering_and_side_effects():
    v = be.Variable(axes=[A], initial_value=1.0, name="v_simpl")
    before = v * 1.0               # simplifies to a read of v, taken before the SetItem
    s = be.SetItem(v, v + 5.0)
    after = be.stop_gradient(v)    # lowers to a read of v, after the SetItem
    t = be.NumPyTransformer()
    b, a, none = t.computation([before, after, s])()
    np.testing.assert_array_equal(b, [1, 1, 1])
    np.testing.assert_array_equal(a, [6, 6, 6])
    # a result that simplifies away must not drop the assignment it was ordered after
    w = be.Variable(axes=[A], initial_value=1.0, name="w_simpl")
    x = be.placeholder([A], name="x_simpl")
    be.SetItem(w, w + 5.0)
    r = w * 0.0 + be.exp(x)        # -> exp(x), but built after the SetItem
    t2 = be.NumPyTransformer()
    with pytest.warns(be.GeonWarning, match="runs though it was not requested"):
        comp = t2.computation(r, x)
    np.testing.assert_allclose(comp(np.zeros(3)), [1, 1, 1])
    np.testing.assert_array_equal(t2.state[w], [6, 6, 6])


def test_stale_view_read_after_assignment_is_copied():
    v = be.Variable(axes=[A, B], initial_value=np.arange(12.0).reshape(3, 4), name="v_view")
    old_t = be.axes_with_order(v, [B, A])   # a view of v taken before the SetItem
    s = be.SetItem(v, v * 10.0)
    r = old_t + be.axes_with_order(v, [B, A])  # built after: old view plus new value
    t = be.NumPyTransformer()
    got, _ = t.computation([r, s])()
    np.testing.assert_array_equal(got, np.arange(12.0).reshape(3, 4).T * 11)


@pytest.mark.parametrize("make", ["numpy", "numpy-code", "gpu-emulator"])
def test_a_requested_view_taken_before_an_assignment_has_the_old_values(make):
    """The caller reads results after the whole computation: a result that is a view of
    a variable the computation assigns, taken before the assignment, is copied before
    it (as the reference gives it); the variable itself is its value after."""
    if make == "gpu-emulator":
        from cuda_emulator import EmulatorRuntime
        from geon.transformers.gpu import GPUTransformer
        t = GPUTransformer(runtime=EmulatorRuntime())
    else:
        t = be.NumPyTransformer(compiled="auto" if make == "numpy" else False)
    w = be.np.variable(np.arange(24.0).reshape(6, 4), name="w")
    x = be.np.placeholder((6, 4))
    outs = [w[1:], w[::-1], w.T, w, be.SetItem(w, w + x)]
    got = t.computation(outs, x)(np.ones((6, 4)))
    old = np.arange(24.0).reshape(6, 4)
    for g, want in zip(got, [old[1:], old[::-1], old.T, old + 1]):
        np.testing.assert_array_equal(g, want)
    for g, want in zip(got, be.evaluate(outs, {x: np.ones((6, 4))})):
        if want is not None:
            np.testing.assert_array_equal(g, want)


def test_arrays_take_the_axes_of_a_same_shaped_operand():
    x = be.placeholder([A, B], dtype=np.float64)
    arr = np.arange(12.0).reshape(3, 4)
    f = be.NumPyTransformer().computation([x + arr, arr * x], x)
    a, b = f(np.ones((3, 4)))
    np.testing.assert_array_equal(a, arr + 1)
    np.testing.assert_array_equal(b, arr)
    with pytest.raises(be.AxisMismatchError, match="shape \\(5,\\)"):
        x + np.ones(5)


def test_deriv_built_after_a_setitem_uses_the_values_the_cost_used():
    w = be.Variable(axes=[A], initial_value=np.array([1.0, 2.0, 3.0]), dtype=np.float64)
    loss = be.sum(w * w, out_axes=())
    upd = be.SetItem(w, w * 10.0)
    g = be.deriv(loss, w)  # built after the SetItem, but for loss (which reads old w)
    np.testing.assert_array_equal(be.evaluate([loss, upd, g])[2], [2, 4, 6])
    got_loss, _, got_g = be.NumPyTransformer().computation([loss, upd, g])()
    assert got_loss == 14.0
    np.testing.assert_array_equal(got_g, [2, 4, 6])


def test_shared_weak_constant_keeps_each_users_precision():
    x32 = be.placeholder([A], dtype=np.float32)
    h16 = be.placeholder([A], dtype=np.float16)
    c = be.Constant(0.1)
    a = x32 * c
    h16 * c  # a second user of another dtype must not change a's constant
    assert a.args[1].dtype == np.float32
    np.testing.assert_array_equal(be.evaluate(a, feeds={x32: np.ones(3)}),
                                  np.full(3, np.float32(0.1)))


def test_python_numbers_share_one_constant_per_number_and_dtype():
    x, y = be.placeholder([A]), be.placeholder([A])
    x64 = be.placeholder([A], dtype=np.float64)
    i64 = be.placeholder([A], dtype=np.int64)
    a, b = x * 1.5, y * 1.5
    assert a.args[1] is b.args[1] and a.args[1].dtype == np.float32
    c = x64 * 1.5  # another dtype: its own shared constant; a's is unchanged
    assert c.args[1].dtype == np.float64 and a.args[1].dtype == np.float32
    assert (x64 * 1.5).args[1] is c.args[1]
    # numbers that compare equal but compute differently stay apart
    assert (x * 0.0).args[1] is not (x * -0.0).args[1]
    assert (i64 + 1).args[1] is not (i64 + 1.0).args[1]
    assert (i64 + 1).dtype == np.int64 and (i64 + 1.0).dtype == np.float64
    assert (x * True).args[1] is not (x * 1).args[1]
    # a chain of n ``y * k`` builds one constant
    z = x
    for _ in range(50):
        z = be.tanh(z * 1.0001)
    assert len({op for op in og.toposort([z]) if isinstance(op, be.Constant)}) == 1
    feeds = {x: np.linspace(-1, 1, 3), y: np.ones(3), x64: np.ones(3)}
    want = np.linspace(-1, 1, 3, dtype=np.float32)
    for _ in range(50):
        want = np.tanh(want * np.float32(1.0001))
    f = be.NumPyTransformer().computation([a, b, c, z], x, y, x64)
    got = f(*feeds.values())
    np.testing.assert_array_equal(got[0], np.linspace(-1, 1, 3, dtype=np.float32) * 1.5)
    np.testing.assert_array_equal(got[2], np.full(3, 1.5))
    np.testing.assert_allclose(got[3], want, rtol=1e-6)
    # A transformed graph leaves the constant for the next graph to share, or a new one
    # if a pass replaced it.
    d = x * 1.5
    assert d.args[1] is a.args[1] or a.args[1].forward is not None
    np.testing.assert_array_equal(be.evaluate(d, feeds={x: np.ones(3)}), np.full(3, 1.5))


def test_constants_built_by_deriv_are_not_shared():
    # deriv of w ** 3 builds the 3 - 1 of the power rule while it rewrites, for an op
    # ordered after an assignment to w: a constant built there takes that ordering, and
    # must never reach an unrelated graph through the shared constants.
    w = be.Variable(axes=[A], initial_value=np.arange(3.0), dtype=np.float64,
                    name="w_deriv_share")
    be.SetItem(w, w + 10)
    be.deriv(be.sum(w ** 3), w)
    x = be.placeholder([A])
    for number in (3, 2, 1, 3.0):
        z = x * number
        assert not z.args[1].other_deps and z.args[1].derived_from is None
    t = be.NumPyTransformer()
    np.testing.assert_array_equal(t.computation(x * 3, x)(np.ones(3)), [3, 3, 3])
    np.testing.assert_array_equal(t.computation(be.value_of(w))(), [0, 1, 2])


def test_integer_literals_stay_exact():
    x = be.placeholder([A], dtype=np.int64)
    y = be.placeholder([A], dtype=np.int64)
    big = 16777217  # not representable in float32
    f = be.NumPyTransformer().computation([x + big, be.less(x, big), be.equal(x, y)], x, y)
    xs, ys = np.full(3, 16777216), np.full(3, 16777217)
    for got in (f(xs, ys), be.evaluate([x + big, be.less(x, big), be.equal(x, y)],
                                       feeds={x: xs, y: ys})):
        np.testing.assert_array_equal(got[0], [16777216 + big] * 3)
        np.testing.assert_array_equal(got[1], [1, 1, 1])
        np.testing.assert_array_equal(got[2], [0, 0, 0])


def test_a_python_number_in_a_where_branch_takes_the_other_branchs_dtype():
    """where(x > 3, x, 0) with an int64 x is int64 throughout: the 0 is not a float64
    that sends every value through float64 (which rounds integers above 2**53)."""
    x = be.placeholder([A], dtype=np.int64)
    big = np.array([2**53 + 1, 2**60 + 3, 7], np.int64)
    cases = [(be.np.where(x > 3, x, 0), np.where(big > 3, big, 0)),
             (be.np.where(x < 3, 0, x), np.where(big < 3, 0, big)),
             (be.np.where(x > 3, x, 2.5), np.where(big > 3, big, 2.5))]  # NumPy: float64
    for op, want in cases:
        assert op.dtype == want.dtype
        for got in (be.NumPyTransformer().computation(op, x)(big),
                    be.evaluate(op, feeds={x: big})):
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got, want)


def test_length_check_after_an_unset_length():
    from geon.op_graph.axes import check_lengths
    Q = be.Axis(None, "Qu")
    with pytest.raises(be.AxisMismatchError, match="Qu"):
        check_lengths([("a", be.Axes(Q)), ("b", be.Axes(be.Axis(3, "Qu"))),
                       ("c", be.Axes(be.Axis(4, "Qu")))], "test")


def _wide_graph(n):
    """``sum_i tanh((x * 1) * c_i)``: n branches reading one placeholder, each with a
    ``x * 1`` that simplification replaces by ``x`` itself."""
    x = be.placeholder([A], dtype=np.float64, name="widex")
    acc = None
    for i in range(n):
        b = be.tanh((x * 1.0) * (1.0 + i / n))
        acc = b if acc is None else acc + b
    return x, acc


def test_rewrite_work_is_linear_in_a_wide_graph():
    # Replacing x * 1 by x gives x one more user per branch; a worklist that offered all
    # of x's users to the queue after each replacement did about n^2 / 2 steps.
    from geon.transformers.passes import Graph
    from geon.transformers.passes.simplify import SimplifyPass
    steps = {}
    for n in (300, 600):
        x, acc = _wide_graph(n)
        graph = Graph([acc])
        ops = len(graph.ops())
        p = SimplifyPass()
        p.run(graph, be.NumPyTransformer())
        # every x * 1 replaced: x's live users are the n outer products
        assert sum(u.forward is None for u in x.users) == n
        assert p.steps <= 4 * ops, (n, p.steps, ops)
        steps[n] = p.steps
    assert steps[600] <= 2.1 * steps[300]
    X = np.linspace(-1, 1, 3)
    got = be.NumPyTransformer().computation(acc, x)(X)
    np.testing.assert_allclose(got, sum(np.tanh(X * (1.0 + i / 600)) for i in range(600)),
                               rtol=1e-12)


def test_a_broadcast_of_one_number_folds_without_building_the_array(monkeypatch):
    """Folding a view or broadcast of a one-number constant gives that number over the
    result's axes: no evaluator runs, so no array of the full size is built (building an
    LSTM of 1,000 steps evaluated a (H, T, N) broadcast of 1 / batch this way)."""
    from geon.op_graph import reference
    from geon.transformers.passes.simplify import fold_constants
    Hh, Tt, Nn = be.Axis(256, "FoldH"), be.Axis(1000, "FoldT"), be.Axis(32, "FoldN")
    c = be.constant(0.5, axes=[Nn], dtype=np.float32)
    b = be.broadcast(c, [Hh, Tt, Nn])
    monkeypatch.setattr(reference, "EVALUATORS", None)   # any evaluation would fail
    folded = fold_constants(b)
    assert isinstance(folded, be.Constant) and folded.scalar == 0.5
    assert folded.axes == b.axes and folded.dtype == np.float32
