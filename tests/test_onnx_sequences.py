"""ONNX sequences and optionals, held by the importer at import: ONNX's node test cases
of If and Loop carrying them, each sequence and optional operator on hand-built models
against NumPy, an If choosing between two sequences at run time, and the refusals of
positions, trip counts and conditions computed at run time."""

import numpy as np
import pytest

try:
    from onnx import TensorProto, helper, numpy_helper
except ImportError:
    pytest.skip("the ONNX frontend tests need the onnx package (pip install onnx)",
                allow_module_level=True)

import geon.frontends.onnx as gx  # noqa: E402
from geon.frontends.onnx import conformance  # noqa: E402
from geon.frontends.onnx.loading import UnsupportedOnnxOp  # noqa: E402

F = TensorProto.FLOAT
I64 = TensorProto.INT64


def _seq_info(name, elem=F, shape=None):
    return helper.make_tensor_sequence_value_info(name, elem, shape)


def _opt_info(name, inner):
    return helper.make_value_info(name, helper.make_optional_type_proto(inner))


def _model(nodes, inputs, outputs, inits=(), opset=18):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _const(name, value):
    return helper.make_node("Constant", [], [name],
                            value=numpy_helper.from_array(np.asarray(value), name + "_v"))


def _tensor(name, elem=F, shape=None):
    return helper.make_tensor_value_info(name, elem, shape)


def _same_list(got, want):
    assert isinstance(got, list) and len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
        assert np.asarray(g).dtype == np.asarray(w).dtype


A = np.arange(6, dtype=np.float32).reshape(2, 3)
B = -np.arange(6, dtype=np.float32).reshape(2, 3)
C = np.full((2, 3), 7.0, np.float32)


# --- ONNX's own cases ---------------------------------------------------------------------

@pytest.mark.parametrize("name", ["test_if_seq", "test_if_opt", "test_loop13_seq",
                                  "test_loop16_seq_none"])
def test_onnx_cases_pass(name):
    cases = [c for _, c in conformance.collect(["If", "Loop"]) if c.name == name]
    assert len(cases) == 1
    assert conformance.run_case(cases[0]) == ("passed", "")


# --- sequences ----------------------------------------------------------------------------

def _abc_model(nodes, outputs):
    """A model of inputs a, b, c (2 x 3 floats) and ``nodes`` after ``s =
    SequenceConstruct(a, b, c)``."""
    return _model([helper.make_node("SequenceConstruct", ["a", "b", "c"], ["s"])] + nodes,
                  [_tensor(n, F, [2, 3]) for n in "abc"], outputs)


def test_sequence_construct_output_is_a_list():
    m = _abc_model([], [_seq_info("s", F, [2, 3])])
    g = gx.import_model(m)
    (out,) = g.computation()(A, B, C)
    _same_list(out, [A, B, C])


@pytest.mark.parametrize("pos, want", [(None, [A, B, C, A]), (0, [A, A, B, C]),
                                       (-1, [A, B, A, C]), (3, [A, B, C, A])])
def test_sequence_insert(pos, want):
    nodes = [] if pos is None else [_const("p", np.int64(pos))]
    nodes.append(helper.make_node("SequenceInsert", ["s", "a"] + ([] if pos is None
                                                                  else ["p"]), ["t"]))
    (out,) = gx.import_model(_abc_model(nodes, [_seq_info("t")])).computation()(A, B, C)
    _same_list(out, want)


@pytest.mark.parametrize("pos, want", [(0, A), (2, C), (-1, C), (-3, A)])
def test_sequence_at(pos, want):
    m = _abc_model([_const("p", np.int32(pos)),
                    helper.make_node("SequenceAt", ["s", "p"], ["y"])], [_tensor("y")])
    (y,) = gx.import_model(m).computation()(A, B, C)
    np.testing.assert_array_equal(y, want)


@pytest.mark.parametrize("pos, want", [(None, [A, B]), (0, [B, C]), (-2, [A, C])])
def test_sequence_erase(pos, want):
    nodes = [] if pos is None else [_const("p", np.int64(pos))]
    nodes.append(helper.make_node("SequenceErase", ["s"] + ([] if pos is None else ["p"]),
                                  ["t"]))
    (out,) = gx.import_model(_abc_model(nodes, [_seq_info("t")])).computation()(A, B, C)
    _same_list(out, want)


def test_sequence_length_is_a_constant():
    m = _abc_model([helper.make_node("SequenceLength", ["s"], ["n"])], [_tensor("n", I64)])
    g = gx.import_model(m)
    (n,) = g.computation()(A, B, C)
    assert n.dtype == np.int64 and int(n) == 3


def test_sequence_empty_insert_and_length():
    m = _model([helper.make_node("SequenceEmpty", [], ["e"], dtype=F),
                helper.make_node("SequenceLength", ["e"], ["n0"]),
                helper.make_node("SequenceInsert", ["e", "a"], ["s"]),
                helper.make_node("SequenceLength", ["s"], ["n1"])],
               [_tensor("a", F, [2, 3])],
               [_tensor("n0", I64), _tensor("n1", I64), _seq_info("s"), _seq_info("e")])
    n0, n1, s, e = gx.import_model(m).computation()(A)
    assert int(n0) == 0 and int(n1) == 1 and e == []
    _same_list(s, [A])


@pytest.mark.parametrize("axis, new_axis", [(0, 0), (1, 0), (-1, 0), (0, 1), (2, 1),
                                            (-1, 1), (-3, 1)])
def test_concat_from_sequence(axis, new_axis):
    m = _abc_model([helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=axis,
                                     new_axis=new_axis)], [_tensor("y")])
    (y,) = gx.import_model(m).computation()(A, B, C)
    want = (np.stack if new_axis else np.concatenate)([A, B, C], axis)
    np.testing.assert_array_equal(y, want)


@pytest.mark.parametrize("split, axis, keepdims", [(None, 0, 1), (None, 1, 0),
                                                   (None, -1, 1), (2, 1, 1),
                                                   ([1, 3, 0, 1], 1, 0), ([2], 0, 1)])
def test_split_to_sequence(split, axis, keepdims):
    x = np.arange(10, dtype=np.float32).reshape(2, 5)
    nodes = [] if split is None else [_const("sp", np.asarray(split, np.int64))]
    nodes.append(helper.make_node("SplitToSequence", ["x"] + ([] if split is None
                                                              else ["sp"]), ["s"],
                                  axis=axis, keepdims=keepdims))
    m = _model(nodes, [_tensor("x", F, [2, 5])], [_seq_info("s")])
    (out,) = gx.import_model(m).computation()(x)
    n = x.shape[axis]
    if split is None:
        want = [np.take(x, [k], axis) if keepdims else np.take(x, k, axis)
                for k in range(n)]
    else:
        sizes = np.asarray(split).reshape(-1)
        if sizes.size == 1 and np.ndim(split) == 0:
            sizes = [min(int(split), n - k) for k in range(0, n, int(split))]
        edges = np.cumsum([0] + list(sizes))
        want = [np.take(x, range(a, b), axis) for a, b in zip(edges[:-1], edges[1:])]
    _same_list(out, want)


def test_split_then_concat_round_trip_of_run_time_values():
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    m = _model([helper.make_node("SplitToSequence", ["x"], ["s"], axis=1, keepdims=0),
                helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=0, new_axis=1)],
               [_tensor("x", F, [3, 4])], [_tensor("y")])
    (y,) = gx.import_model(m).computation()(x)
    np.testing.assert_array_equal(y, x.T)


def test_sequence_input_given_at_import():
    m = _model([helper.make_node("SequenceAt", ["s", "p"], ["y"]),
                helper.make_node("Add", ["y", "x"], ["z"])],
               [_seq_info("s", F, [3]), _tensor("p", I64, []), _tensor("x", F, [3])],
               [_tensor("z")])
    seq = [np.ones(3, np.float32), np.arange(3, dtype=np.float32)]
    g = gx.import_model(m, input_values={"s": seq, "p": np.int64(1)})
    assert [p.name for p in g.inputs] == ["x"]
    (z,) = g.computation()(np.full(3, 10, np.float32))
    np.testing.assert_array_equal(z, seq[1] + 10)


def test_sequence_input_not_given_is_refused_naming_it():
    m = _model([helper.make_node("SequenceLength", ["s"], ["n"])],
               [_seq_info("s", F, [3])], [_tensor("n", I64)])
    with pytest.raises(UnsupportedOnnxOp, match="input 's' is a sequence.*input_values") \
            as e:
        gx.import_model(m)
    assert e.value.value_name == "s"


# --- refusals of positions computed at run time ------------------------------------------

@pytest.mark.parametrize("op", ["SequenceAt", "SequenceErase", "SequenceInsert"])
def test_run_time_position_is_refused_naming_the_node(op):
    ins = ["s", "a", "p"] if op == "SequenceInsert" else ["s", "p"]
    m = _abc_model([helper.make_node(op, ins, ["t"], name="pick")],
                   [_seq_info("t") if op != "SequenceAt" else _tensor("t")])
    m.graph.input.append(_tensor("p", I64, []))
    with pytest.raises(UnsupportedOnnxOp, match=f"{op} node 'pick'.*position.*'p'.*run "
                                                f"time") as e:
        gx.import_model(m)
    assert e.value.value_name == "p"
    g = gx.import_model(m, input_values={"p": np.int64(-1)})  # fixed at import: fine
    assert len(g.inputs) == 3


def test_sequence_fed_to_a_tensor_op_is_refused_naming_the_node():
    m = _abc_model([helper.make_node("Relu", ["s"], ["y"], name="act")], [_tensor("y")])
    with pytest.raises(UnsupportedOnnxOp, match="Relu node 'act'.*is a sequence"):
        gx.import_model(m)


# --- optionals ----------------------------------------------------------------------------

def test_optional_of_a_tensor():
    m = _model([helper.make_node("Optional", ["x"], ["o"]),
                helper.make_node("OptionalHasElement", ["o"], ["h"]),
                helper.make_node("OptionalGetElement", ["o"], ["y"]),
                helper.make_node("Identity", ["o"], ["o2"])],
               [_tensor("x", F, [2, 3])],
               [_tensor("h", TensorProto.BOOL), _tensor("y"),
                _opt_info("o2", helper.make_tensor_type_proto(F, [2, 3]))])
    h, y, o2 = gx.import_model(m).computation()(A)
    assert h.dtype == np.bool_ and bool(h)
    np.testing.assert_array_equal(y, A)
    np.testing.assert_array_equal(o2, A)


def test_empty_optional():
    seq_type = helper.make_sequence_type_proto(helper.make_tensor_type_proto(F, None))
    m = _model([helper.make_node("Optional", [], ["o"], type=seq_type),
                helper.make_node("OptionalHasElement", ["o"], ["h"]),
                helper.make_node("OptionalHasElement", [""], ["h2"])],
               [], [_tensor("h", TensorProto.BOOL), _tensor("h2", TensorProto.BOOL),
                    _opt_info("o", seq_type)])
    h, h2, o = gx.import_model(m).computation()()
    assert not h and not h2 and o is None


def test_optional_get_element_of_an_empty_optional_is_an_error():
    m = _model([helper.make_node("Optional", [], ["o"],
                                 type=helper.make_tensor_type_proto(F, [2])),
                helper.make_node("OptionalGetElement", ["o"], ["y"], name="get")],
               [], [_tensor("y")])
    with pytest.raises(gx.InvalidOnnxModel, match="OptionalGetElement node 'get'.*empty"):
        gx.import_model(m)


def test_optional_input_given_at_import():
    inner = helper.make_tensor_type_proto(F, [3])
    m = _model([helper.make_node("OptionalHasElement", ["o"], ["h"])],
               [_opt_info("o", inner)], [_tensor("h", TensorProto.BOOL)])
    (h,) = gx.import_model(m, input_values={"o": None}).computation()()
    assert not h
    (h,) = gx.import_model(m, input_values={"o": np.ones(3, np.float32)}).computation()()
    assert h


# --- If -----------------------------------------------------------------------------------

def _branch(name, values):
    nodes = [_const(f"{name}_{k}", v) for k, v in enumerate(values)]
    nodes.append(helper.make_node("SequenceConstruct", [f"{name}_{k}" for k in
                                                         range(len(values))], [name]))
    return helper.make_graph(nodes, name, [], [_seq_info(name)])


def _if_model(then_values, else_values):
    node = helper.make_node("If", ["c"], ["s"], name="choose",
                            then_branch=_branch("t", then_values),
                            else_branch=_branch("e", else_values))
    return _model([node], [_tensor("c", TensorProto.BOOL, [])], [_seq_info("s")])


def test_if_chooses_between_sequences_at_run_time():
    m = _if_model([A, np.ones(4, np.float32)], [B, np.zeros(4, np.float32)])
    f = gx.import_model(m).computation()
    (yes,) = f(np.array(True))
    (no,) = f(np.array(False))
    _same_list(yes, [A, np.ones(4, np.float32)])
    _same_list(no, [B, np.zeros(4, np.float32)])


def test_if_with_different_sequences_needs_a_known_condition():
    m = _if_model([A], [A, B])
    with pytest.raises(UnsupportedOnnxOp, match="If node 'choose'.*condition.*run time") \
            as e:
        gx.import_model(m)
    assert e.value.value_name == "c"
    (out,) = gx.import_model(m, input_values={"c": np.array(False)}).computation()()
    _same_list(out, [A, B])


# --- Loop ---------------------------------------------------------------------------------

def _append_loop(trip_input=True):
    """A Loop appending ``x * iteration`` to a sequence, for ``n`` iterations."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Cast", ["i"], ["fi"], to=F),
         helper.make_node("Mul", ["x", "fi"], ["xi"]),
         helper.make_node("SequenceInsert", ["seq_in", "xi"], ["seq_out"])],
        "body", [_tensor("i", I64, []), _tensor("cond_in", TensorProto.BOOL, []),
                 _seq_info("seq_in")],
        [_tensor("cond_out", TensorProto.BOOL, []), _seq_info("seq_out")])
    nodes = [helper.make_node("SequenceEmpty", [], ["e"], dtype=F),
             helper.make_node("Loop", ["n", "", "e"], ["s"], name="repeat", body=body)]
    inputs = [_tensor("x", F, [3])]
    if trip_input:
        inputs.append(_tensor("n", I64, []))
    return _model(nodes, inputs, [_seq_info("s")])


def test_loop_carrying_a_sequence_is_unrolled():
    x = np.array([1.0, 2.0, 3.0], np.float32)
    g = gx.import_model(_append_loop(), input_values={"n": np.int64(4)})
    (out,) = g.computation()(x)
    _same_list(out, [x * k for k in range(4)])


def test_loop_carrying_a_sequence_needs_a_known_trip_count():
    with pytest.raises(UnsupportedOnnxOp, match="Loop node 'repeat'.*trip count.*'n'.*"
                                                "run time") as e:
        gx.import_model(_append_loop())
    assert e.value.value_name == "n"


def test_loop_carrying_a_sequence_has_a_bound():
    with pytest.raises(UnsupportedOnnxOp, match="Loop node 'repeat'.*at most 10000"):
        gx.import_model(_append_loop(), input_values={"n": np.int64(10 ** 6)})


def test_loop_carrying_a_sequence_needs_a_known_body_condition():
    m = _append_loop()
    body = m.graph.node[1].attribute[0].g
    body.node[0].CopyFrom(helper.make_node("Less", ["fi", "x0"], ["cond_out"]))
    body.node.append(_const("x0", np.float32(2.0)))
    body.node[0].input[0] = "xi0"
    body.node.append(helper.make_node("ReduceMax", ["xi"], ["xi0"], keepdims=0))
    with pytest.raises(UnsupportedOnnxOp, match="Loop node 'repeat'.*body's condition.*"
                                                "'cond_out'.*run time"):
        gx.import_model(m, input_values={"n": np.int64(3)})


def test_loop_carrying_a_sequence_with_a_scan_output():
    m = _append_loop()
    body = m.graph.node[1].attribute[0].g
    body.output.append(_tensor("fi", F, []))
    m.graph.node[1].output.append("scanned")
    m.graph.output.append(_tensor("scanned"))
    x = np.array([1.0, 2.0, 3.0], np.float32)
    s, scanned = gx.import_model(m, input_values={"n": np.int64(3)}).computation()(x)
    _same_list(s, [x * k for k in range(3)])
    np.testing.assert_array_equal(scanned, np.arange(3, dtype=np.float32))


def test_if_chooses_between_optionals_at_run_time():
    def branch(name, value):
        return helper.make_graph(
            [_const(name + "_x", value),
             helper.make_node("Optional", [name + "_x"], [name])],
            name, [], [_opt_info(name, helper.make_tensor_type_proto(F, [2, 3]))])
    node = helper.make_node("If", ["c"], ["o"], then_branch=branch("t", A),
                            else_branch=branch("e", B))
    m = _model([node, helper.make_node("OptionalGetElement", ["o"], ["y"])],
               [_tensor("c", TensorProto.BOOL, [])],
               [_tensor("y"), _opt_info("o", helper.make_tensor_type_proto(F, [2, 3]))])
    f = gx.import_model(m).computation()
    y, o = f(np.array(True))
    np.testing.assert_array_equal(y, A)
    np.testing.assert_array_equal(o, A)
    y, o = f(np.array(False))
    np.testing.assert_array_equal(y, B)
    np.testing.assert_array_equal(o, B)
