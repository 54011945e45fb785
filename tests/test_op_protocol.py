"""The op-parameter protocol: an op class declares its parameters once (``attrs``) and
CSE, printing, copying and JSON serialization follow, for a new op defined here with
its rules and for every op class of geon."""

import inspect
import json

import numpy as np
import pytest

import geon as be
from geon.errors import AxisMismatchError
from geon.op_graph import op_graph as og
from geon.op_graph.autodiff import adjoint_rule
from geon.op_graph.forward import forward_rule
from geon.op_graph.params import clone_graph, graph_ops, rebuild, value_key
from geon.op_graph.reference import EVALUATORS
from geon.op_graph.user_ops import UserOp
from geon.transformers.numpy import NumPyTransformer, numpy_code
from geon.transformers.passes.cse import cse_key
from op_table import CASES, DOCUMENT_CASES

C = be.Axis(3, "C")
H = be.Axis(4, "H")
N = be.Axis(5, "N", batch=True)


# --- a new op, defined here: the class and one entry per table ----------------------------

class Roll(og.ComputationOp):
    """``x`` shifted cyclically by ``shift`` positions along ``axis``."""

    attrs = ("axis", "shift", "dtype")
    arity = 1

    def __init__(self, x, axis, shift, **kwargs):
        self.axis, self.shift = axis, int(shift)
        super().__init__(x, **kwargs)

    def _infer_axes(self):
        x = self.args[0]
        if self.axis not in x.axes:
            raise AxisMismatchError(f"Roll {self.name}: {self.axis!r} is not an axis of "
                                    f"{x.name}")
        return x.axes

    def _infer_dtype(self):
        return self.args[0].dtype


@EVALUATORS.register(Roll)
def _roll_value(op, x):
    return np.roll(x, op.shift, axis=op.args[0].axes.index(op.axis))


@adjoint_rule(Roll)
def _roll_adjoint(op, delta):  # the transpose of a cyclic shift shifts back
    return (Roll(delta, op.axis, -op.shift),)


@forward_rule(Roll)
def _roll_forward(op, tangents):  # linear: the tangent rolls the same way
    return Roll(tangents[0], op.axis, op.shift)


@numpy_code(Roll)
def _roll_code(op, out, args):
    pos = op.args[0].axes.index(op.axis)
    return [f"np.copyto({out}, np.roll({args[0]}, {int(op.shift)}, axis={pos}))"]


class RollTransformer(NumPyTransformer):
    """The NumPy transformer that runs :class:`Roll`."""

    base_set = NumPyTransformer.base_set | {Roll}


def _run(results, params, *values):
    return RollTransformer().computation(results, *params)(*values)


def _attr_keys(op):
    return {k: value_key(v) for k, v in op.attr_values().items()}


V = np.arange(60.0).reshape(3, 4, 5)


def test_new_op_rules_and_derivative():
    x = be.placeholder((C, H, N), dtype=np.float64, name="x")
    y = Roll(x, H, 1)
    np.testing.assert_array_equal(_run(y, [x], V), np.roll(V, 1, axis=1))
    np.testing.assert_array_equal(be.evaluate(y, {x: V}), np.roll(V, 1, axis=1))
    w = be.placeholder((C, H, N), dtype=np.float64, name="w")
    g = be.deriv(be.sum(Roll(x, H, 1) * w, out_axes=()), x)
    W = np.random.default_rng(0).standard_normal(V.shape)
    np.testing.assert_allclose(_run(g, [x, w], V, W), np.roll(W, -1, axis=1), rtol=1e-14)
    t = be.jvp(Roll(x, H, 1), x, W)
    np.testing.assert_array_equal(be.evaluate(t, {x: V}), np.roll(W, 1, axis=1))
    with pytest.raises(AxisMismatchError, match="Roll"):
        Roll(be.placeholder((C,)), H, 1)


def test_new_op_cse_merges_equal_parameters_only():
    x = be.placeholder((C, H, N), dtype=np.float64, name="x")
    a, b = Roll(x, H, 1), Roll(x, H, 1)
    assert cse_key(a) == cse_key(b)
    assert cse_key(a) != cse_key(Roll(x, H, 2)) != cse_key(Roll(x, C, 2))
    y = a + b + Roll(x, H, 2) + Roll(x, C, 1)
    comp = RollTransformer().computation(y, x)
    assert sum(isinstance(op, Roll) for op in comp.ops) == 3   # a and b merged
    want = 2 * np.roll(V, 1, 1) + np.roll(V, 2, 1) + np.roll(V, 1, 0)
    np.testing.assert_array_equal(comp(V), want)


def test_new_op_printing_shows_its_parameters():
    x = be.placeholder((C, H, N), name="x")
    y = Roll(x, H, -2, name="r")
    line = [ln for ln in be.graph_text(y).splitlines() if ln.startswith("r = ")][0]
    assert line.startswith("r = Roll(x; axis=H:4, shift=-2) : (C:3, H:4, N:5) float32")
    assert "Roll(axis=H:4, shift=-2)" in be.graph_dot(y)


def test_new_op_clone_and_json_round_trip():
    x = be.placeholder((C, H, N), dtype=np.float64, name="x")
    y = be.exp(Roll(x, N, 3, name="r"))
    m = clone_graph([y])
    r, r2 = y.args[0], m[y].args[0]
    assert type(r2) is Roll and r2 is not r and r2.args == (x,)
    assert _attr_keys(r2) == _attr_keys(r) and r2.name == "r"
    text = be.serialize(y)
    rec = next(o for o in json.loads(text)["ops"] if o["op"] == "Roll")
    assert rec["attrs"] == {"axis": {"axis": "N"}, "shift": 3}
    loaded = be.deserialize_graph(text)
    r3 = loaded.op("r")
    assert type(r3) is Roll and _attr_keys(r3) == _attr_keys(r)
    assert be.serialize(loaded.value) == text
    want = np.exp(np.roll(V, 3, axis=2))
    np.testing.assert_array_equal(_run(loaded.value, [loaded.op("x")], V), want)
    # The constructor's checks run on load: a shift along an axis the arg lacks fails.
    bad = text.replace('{"axis": "N"}', '{"axis": "Q"}').replace(
        '"axes": {', '"axes": {"Q": {"length": 2}, ', 1)
    with pytest.raises(be.SerializationError, match=r"Roll 'r'\).*AxisMismatchError"):
        be.deserialize(bad)


def test_a_mutable_parameter_is_reported_by_name():
    class Pick(og.ComputationOp):
        attrs = ("index", "dtype")

        def __init__(self, x, index, **kwargs):
            self.index = index
            super().__init__(x, **kwargs)

        def _infer_axes(self):
            return self.args[0].axes

    y = Pick(be.placeholder((C,)), [0, 1], name="pick")
    with pytest.raises(be.GeonError, match="Pick pick: a parameter value of type list"):
        cse_key(y)
    with pytest.raises(be.SerializationError, match="pick.*attribute index: cannot write "
                                                    "a value of type list"):
        be.serialize(y)


def test_user_op_parameters_are_attrs():
    Scale = be.define_op("ProtoScale", lambda x, k: x * k, axes=lambda x, k: x.axes,
                         params=("k",))
    assert Scale.attrs == ("dtype", "k")
    x = be.placeholder((C,), dtype=np.float64, name="x")
    a, b, c = Scale(x, k=2.5), Scale(x, k=2.5), Scale(x, k=3.0, name="c")
    assert a.k == 2.5 == a.params["k"] and _rebuilt_equal(a)
    assert cse_key(a) == cse_key(b) != cse_key(c)
    assert "ProtoScale(x; k=3.0)" in be.graph_text(c)
    for bad in ("forward", "args", "type_name", "_hidden"):
        with pytest.raises(ValueError, match="reserved"):
            be.define_op("ProtoBad", lambda x, **kw: x, axes=lambda x, **kw: x.axes,
                         params=(bad,))


# --- every op class of geon -------------------------------------------------------------------

def _geon_op_classes():
    import geon.op_graph.forward  # noqa: F401 - LinearizationPoint
    out, stack = [], [og.Op]
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        if cls.__module__.startswith("geon.") and not issubclass(cls, UserOp):
            out.append(cls)
    return out


def test_every_geon_op_class_declares_attrs_its_constructor_takes():
    classes = _geon_op_classes()
    assert len(classes) > 60
    bad = []
    for cls in classes:
        attrs = cls.attrs
        params = inspect.signature(cls).parameters
        var_kw = any(p.kind is p.VAR_KEYWORD for p in params.values())
        for a in attrs:
            # axes and dtype reach TensorOp's constructor through **kwargs
            if a not in params and not (var_kw and issubclass(cls, og.TensorOp)
                                        and a in ("axes", "dtype")):
                bad.append(f"{cls.__name__}.{a}")
        if not isinstance(attrs, tuple) or len(set(attrs)) != len(attrs):
            bad.append(f"{cls.__name__}: attrs {attrs!r}")
    assert bad == []


def _rebuilt_equal(op):
    """``op`` rebuilt from its args and attrs is the same op (class, parameters, type)."""
    if isinstance(op, og.Output):
        return True  # built by its multi-output op
    new = rebuild(op, op.args, op.other_deps)
    same = type(new) is type(op) and _attr_keys(new) == _attr_keys(op)
    outs = [(o.axes, o.dtype) for o in getattr(op, "outputs", [op])
            if isinstance(o, og.TensorOp)]
    new_outs = [(o.axes, o.dtype) for o in getattr(new, "outputs", [new])
                if isinstance(o, og.TensorOp)]
    return same and [(a.names, a.lengths, d) for a, d in outs] == \
        [(a.names, a.lengths, d) for a, d in new_outs]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_op_table_ops_rebuild_from_their_attrs(case):
    xs = [be.placeholder(i.axes, dtype=i.dtype(np.float64)) for i in case.inputs]
    op = case.make(xs, np.float64)
    user = graph_ops([op])
    assert [o for o in user if not _rebuilt_equal(o)] == []
    be.NumPyTransformer().computation(op, *xs)       # the lowered graph, too
    assert [o for o in graph_ops([op]) if not _rebuilt_equal(o)] == []
    # JSON round trip of the user's op classes gives the same values (see also
    # test_serialize.test_op_table_round_trip, which compares computed results).
    if case not in DOCUMENT_CASES:
        return
    kinds = {type(o) for o in user} | {type(o) for o in graph_ops([op])}
    loaded = be.deserialize_graph(be.serialize(op))
    assert {type(o) for o in loaded.ops} <= kinds


def test_parameters_the_user_chose_survive_rebuild_and_json():
    # Parameters that could be re-inferred wrongly: a named slice axis, an out_axes
    # order, a dtype override, a weak int constant, an array constant.
    x = be.placeholder((C, H, N), dtype=np.float64, name="x")
    s = be.slice_along_axis(x, H, slice(1, 3), new_axis=be.Axis(2, "H2"))
    r = be.sum(x, out_axes=(N, C))
    d = og.Add(s, 1, dtype=np.float32)
    k = be.Constant(np.arange(3.0), axes=C)
    m, i = be.max_argmax(x, reduction_axes=H)
    p1, p2 = be.split(x, H, [1, 3])
    ops = [s, r, d, d.args[1], k, m.args[0], p1.args[0]]
    assert all(_rebuilt_equal(o) for o in ops)
    assert s.axes[1].name == "H2" and r.axes.names == ("N", "C") and d.dtype == np.float32
    loaded = be.deserialize(be.serialize([s, r, d, r * k, m, i, p2]))
    for a, b in zip([s, r, d], loaded):
        assert type(b) is type(a) and _attr_keys(b) == _attr_keys(a)
    assert loaded[2].args[1].weak and loaded[2].args[1]._number == 1


def test_primitive_constructors_check_what_a_document_could_get_wrong():
    # Loading rebuilds every op through its constructor, so these checks (once made by
    # the serializer) guard documents and hand-built graphs alike.
    from geon.op_graph import primitives as pr
    x = be.placeholder((C,), name="x")
    with pytest.raises(AxisMismatchError, match="Expand: bad dimension map"):
        pr.Expand(x, be.Axes(H), (0,))                        # reads C:3 as H:4
    with pytest.raises(AxisMismatchError, match=r"SliceView .*cuts \(C:3\) to lengths \(2,\)"):
        pr.SliceView(x, (slice(0, 2),), be.Axes(be.Axis(3, "K")))
    with pytest.raises(AxisMismatchError, match="one slice or int per dimension"):
        pr.SliceView(x, (slice(0, 2), 0), be.Axes(be.Axis(2, "K")))
    for k in (3, -4):   # an index out of range (it would read outside the buffer)
        with pytest.raises(AxisMismatchError, match=f"index {k} is out of range"):
            pr.SliceView(x, (k,), be.Axes())
    with pytest.raises(AxisMismatchError, match="Unslice"):
        pr.Unslice(x, be.Axes(H), (slice(0, 2),))
    with pytest.raises(TypeError):
        pr.Dimshuffle(x, ("0",))
    with pytest.raises(TypeError, match="Tanh takes 1 arg"):
        og.Tanh(x, x)
    assert pr.SliceView(x, (slice(1, 3),), be.Axes(be.Axis(2, "K"))).axes.lengths == (2,)
