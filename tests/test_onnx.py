"""The ONNX frontend: conformance against the committed table, models exported from
PyTorch, fine-tuning through ``be.deriv``, and bad or hostile files."""

import io
import json
import os
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

import geon as be
from geon.errors import GeonError

try:
    import onnx
    from onnx import TensorProto, helper, numpy_helper
except ImportError:
    pytest.skip("the ONNX frontend tests need the onnx package (pip install onnx)",
                allow_module_level=True)

import geon.frontends.onnx as gx  # noqa: E402
from geon.frontends.onnx import conformance  # noqa: E402

DOC = Path(__file__).resolve().parent.parent / "doc"


def _model(nodes, inputs, outputs, initializers=(), opset=20, name="g"):
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _vi(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


# --- conformance ------------------------------------------------------------------------------

def test_conformance_subset_matches_the_committed_table():
    """Every other case of the required operators (sorted by name, >= 300 cases) has the
    status the committed table (doc/onnx_conformance.json) gives it."""
    table = json.loads((DOC / "onnx_conformance.json").read_text(encoding="utf-8"))
    required = sorted(n for n, (op, _, _) in table.items() if op in conformance.REQUIRED)
    subset = set(required[::2])
    assert len(subset) >= 300
    got = conformance.run(set(conformance.REQUIRED), names=subset)
    assert set(got) == subset
    changed = {n: (table[n][1], got[n][1], got[n][2]) for n in subset
               if got[n][1] != table[n][1]}
    assert not changed, f"status changed (committed, now, reason): {changed}"


def test_loss_cases_all_pass_as_committed():
    """Every node test case onnx ships of NegativeLogLikelihoodLoss and
    SoftmaxCrossEntropyLoss (their expansions included) passes, as the committed table
    says: ``reduction="mean"`` is the mean weighted by the class weights over the
    targets not equal to ``ignore_index`` (a plain mean fails 43 of them)."""
    table = json.loads((DOC / "onnx_conformance.json").read_text(encoding="utf-8"))
    got = conformance.run(set(conformance.ALSO_CHECKED))
    names = {n for n, (op, _, _) in table.items() if op in conformance.ALSO_CHECKED}
    assert set(got) == names and len(names) >= 100
    assert any("nllloss" in n and "weight" in n and "ii" in n for n in names)
    bad = {n: got[n][1:] for n in names if got[n][1] != "passed" or table[n][1] != "passed"}
    assert not bad, bad


def test_committed_table_meets_the_acceptance():
    table = json.loads((DOC / "onnx_conformance.json").read_text(encoding="utf-8"))
    passed, total = conformance.summary({n: tuple(v) for n, v in table.items()})
    assert total > 700 and passed / total >= 0.95, (passed, total)
    assert f"onnx {onnx.__version__}" in (DOC / "onnx_operators.txt").read_text()


# --- import: errors, shapes, folding ------------------------------------------------------------

def test_unsupported_op_names_op_node_and_opset():
    m = _model([helper.make_node("NonZero", ["x"], ["y"], name="nz")],
               [_vi("x", [2, 3])], [_vi("y", [2, None], TensorProto.INT64)], opset=13)
    with pytest.raises(gx.UnsupportedOnnxOp) as e:
        gx.import_model(m)
    assert "NonZero" in str(e.value) and "'nz'" in str(e.value) and "13" in str(e.value)
    assert isinstance(e.value, GeonError)


def test_unknown_attribute_and_old_opset_are_refused():
    m = _model([helper.make_node("Relu", ["x"], ["y"], name="r", slope=2.0)],
               [_vi("x", [2])], [_vi("y", [2])])
    with pytest.raises(gx.UnsupportedOnnxOp, match="slope"):
        gx.import_model(m)
    m = _model([helper.make_node("Gelu", ["x"], ["y"])], [_vi("x", [2])], [_vi("y", [2])],
               opset=19)  # Gelu exists from opset 20
    with pytest.raises(gx.UnsupportedOnnxOp, match="opset 19"):
        gx.import_model(m)


def test_a_symbolic_dimension_is_a_symbol_or_fixed_by_input_shapes():
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", ["batch", 3])],
               [_vi("y", ["batch", 3])])
    g = gx.import_model(m)   # one computation for every batch (tests/test_onnx_dynamic.py)
    assert repr(g.inputs[0].axes.lengths[0]) == "batch"
    g = gx.import_model(m, input_shapes={"x": (4, 3)})
    assert g.inputs[0].axes.lengths == (4, 3)
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)
    (y,) = g.computation()(x)
    assert np.array_equal(y, np.maximum(x, 0))


def test_shape_subgraph_is_folded_to_a_constant():
    """Shape -> Gather -> Concat -> Reshape: the Reshape's target is known at import, so
    the model runs with a static reshape (no shape op at run time)."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Constant", [], ["i"], value=numpy_helper.from_array(
                 np.array([0], np.int64))),
             helper.make_node("Gather", ["s", "i"], ["n"]),
             helper.make_node("Constant", [], ["m1"], value=numpy_helper.from_array(
                 np.array([-1], np.int64))),
             helper.make_node("Concat", ["n", "m1"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"])]
    m = _model(nodes, [_vi("x", ["n", 3, 4])], [_vi("y", ["n", 12])])
    for n in (2, 5):
        g = gx.import_model(m, input_shapes={"x": (n, 3, 4)})
        assert be.np.shape(g.outputs[0]) == (n, 12)
        x = np.arange(n * 12, dtype=np.float32).reshape(n, 3, 4)
        f = g.computation()
        assert np.array_equal(f(x)[0], x.reshape(n, 12))
        assert not {"Take", "Gather"} & {type(op).__name__ for op in f.computation.ops}


def test_booleans_and_integers_keep_their_onnx_types():
    m = _model([helper.make_node("Less", ["x", "y"], ["b"]),
                helper.make_node("Not", ["b"], ["nb"]),
                helper.make_node("Cast", ["nb"], ["i"], to=TensorProto.INT64)],
               [_vi("x", [3]), _vi("y", [3])],
               [_vi("nb", [3], TensorProto.BOOL), _vi("i", [3], TensorProto.INT64)])
    nb, i = gx.import_model(m).computation()(np.array([1, 2, 3], np.float32),
                                            np.array([2, 2, 2], np.float32))
    assert nb.dtype == np.bool_ and nb.tolist() == [False, True, True]
    assert i.dtype == np.int64 and i.tolist() == [0, 1, 1]


# --- narrow types (held widened), empty tensors, MaxPool's indices ---------------------------------

def _reference(m, feeds):
    from onnx.reference import ReferenceEvaluator
    return ReferenceEvaluator(m).run(None, feeds)


@pytest.mark.parametrize("to,saturate", [(TensorProto.FLOAT8E4M3FN, 1),
                                         (TensorProto.FLOAT8E4M3FN, 0),
                                         (TensorProto.FLOAT8E5M2, 0),
                                         (TensorProto.FLOAT8E4M3FNUZ, 1),
                                         (TensorProto.BFLOAT16, 1),
                                         (TensorProto.INT4, 1)])
def test_narrow_types_cast_and_compute_as_onnx_reference(to, saturate):
    """Cast to a narrow type, an op computed in it (in float32, rounded once) and a
    narrow initializer: geon's outputs, returned in the ml_dtypes type, equal onnx's
    reference evaluator's."""
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(40) * 30, [0, -0.0, 1e6, -1e6, 448, 464]])
    x = x.astype(np.float32).reshape(2, 23)
    dt = helper.tensor_dtype_to_np_dtype(to)
    w = numpy_helper.from_array(np.full((2, 23), 3, np.float32).astype(dt), "w")
    op = "Add" if to in (TensorProto.INT4,) else "Mul"
    m = _model([helper.make_node("Cast", ["x"], ["q"], to=to, saturate=saturate),
                helper.make_node(op, ["q", "w"], ["y"]),
                helper.make_node("Cast", ["y"], ["f"], to=TensorProto.FLOAT)],
               [_vi("x", [2, 23])], [_vi("q", [2, 23], to), _vi("y", [2, 23], to),
                                     _vi("f", [2, 23])], initializers=[w], opset=21)
    got = gx.import_model(m).computation()(x)
    want = _reference(m, {"x": x})
    for g, r in zip(got, want):
        assert g.dtype == r.dtype
        wide = np.float64 if to != TensorProto.INT4 else np.int64
        np.testing.assert_array_equal(g.astype(wide), np.asarray(r).astype(wide))


@pytest.mark.parametrize("to", [TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E5M2,
                                TensorProto.BFLOAT16, TensorProto.UINT4])
def test_integers_cast_to_narrow_types_as_onnx_reference(to):
    x = np.array([[0, 3, -7, 17, 300, -1000, 70000, 123456]], np.int32)
    m = _model([helper.make_node("Cast", ["x"], ["y"], to=to)],
               [_vi("x", [1, 8], TensorProto.INT32)], [_vi("y", [1, 8], to)], opset=21)
    (got,) = gx.import_model(m).computation()(x)
    (want,) = _reference(m, {"x": x})
    assert got.dtype == want.dtype
    wide = np.int64 if to == TensorProto.UINT4 else np.float64
    np.testing.assert_array_equal(got.astype(wide), want.astype(wide))


def test_narrow_inputs_are_fed_exactly_and_rounded_when_off_the_grid():
    import ml_dtypes
    m = _model([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT)],
               [_vi("x", [4], TensorProto.FLOAT8E4M3FN)], [_vi("y", [4])])
    f = gx.import_model(m).computation()
    vals = np.array([0.5, -3.25, 448, 2.0 ** -9], np.float32)
    (y,) = f(vals.astype(ml_dtypes.float8_e4m3fn))
    assert y.dtype == np.float32 and np.array_equal(y, vals)
    (y,) = f(np.array([1 + 1 / 16, 1 + 3 / 16, 1000, -1e9], np.float32))  # as Cast rounds
    assert y.tolist() == [1.0, 1.25, 448.0, -448.0]


def test_a_narrow_output_off_the_grid_is_an_error_not_rounded_again():
    import ml_dtypes
    from geon.frontends.onnx.importer import _output
    ok = _output(np.array([1.25, np.nan], np.float32), np.dtype(ml_dtypes.float8_e4m3fn))
    assert ok.dtype == ml_dtypes.float8_e4m3fn
    with pytest.raises(GeonError, match="not on the format's grid"):
        _output(np.array([1.1], np.float32), np.dtype(ml_dtypes.float8_e4m3fn))


def test_empty_sets_and_empty_results():
    """A reduction over an axis of length 0 gives the reduction's identity; slices and
    split parts with no elements are returned as empty arrays."""
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    nodes = [helper.make_node(op, ["x", "axes"], [op], keepdims=1)
             for op in ("ReduceSum", "ReduceProd", "ReduceMax", "ReduceMin", "ReduceL2")]
    nodes.append(helper.make_node("Slice", ["z", "st", "en"], ["s"]))
    inits = [axes, numpy_helper.from_array(np.array([5], np.int64), "st"),
             numpy_helper.from_array(np.array([9], np.int64), "en")]
    m = _model(nodes, [_vi("x", [2, 0, 3]), _vi("z", [3, 4])],
               [_vi(n.output[0], None) for n in nodes], initializers=inits, opset=18)
    outs = gx.import_model(m).computation()(np.zeros((2, 0, 3), np.float32),
                                            np.ones((3, 4), np.float32))
    want = [0, 1, -np.inf, np.inf, 0]
    for o, w in zip(outs, want):
        assert o.shape == (2, 1, 3) and (o == w).all()
    assert outs[-1].shape == (0, 4) and outs[-1].dtype == np.float32
    m = _model([helper.make_node("ReduceMean", ["x", "axes"], ["y"])],
               [_vi("x", [2, 0, 3])], [_vi("y", None)], initializers=[axes], opset=18)
    with pytest.raises(gx.UnsupportedOnnxOp, match="empty set"):
        gx.import_model(m)


@pytest.mark.parametrize("shape,attrs", [
    ((2, 3, 7, 6), dict(kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 1])),
    ((2, 3, 7, 6), dict(kernel_shape=[3, 3], strides=[2, 2], storage_order=1)),
    ((1, 2, 9), dict(kernel_shape=[3], strides=[2], pads=[1, 1])),
    ((1, 2, 5, 6, 4), dict(kernel_shape=[2, 3, 2], strides=[1, 2, 2])),
    ((2, 2, 8, 8), dict(kernel_shape=[2, 2], strides=[2, 2], dilations=[2, 2])),
    ((2, 2, 7, 7), dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1))])
def test_max_pool_indices_equal_onnx_reference(shape, attrs):
    m = _model([helper.make_node("MaxPool", ["x"], ["y", "i"], **attrs)],
               [_vi("x", list(shape))], [_vi("y", None), _vi("i", None, TensorProto.INT64)],
               opset=22)
    x = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
    x.flat[::7] = x.flat[1]  # ties: the first maximum in window order counts
    y, i = gx.import_model(m).computation()(x)
    ry, ri = _reference(m, {"x": x})
    assert np.array_equal(y, ry) and i.dtype == np.int64 and np.array_equal(i, ri)
    u = (np.abs(x) * 40).astype(np.uint8)
    m8 = _model([helper.make_node("MaxPool", ["x"], ["y"], **attrs)],
                [_vi("x", list(shape), TensorProto.UINT8)], [_vi("y", None, TensorProto.UINT8)],
                opset=22)
    (y8,) = gx.import_model(m8).computation()(u)
    assert y8.dtype == np.uint8 and np.array_equal(y8, _reference(m8, {"x": u})[0])


# --- models exported from PyTorch ----------------------------------------------------------------

def _torch():
    try:
        import torch
    except ImportError:
        pytest.skip("torch is not installed (pip install torch==2.13.0)")
    return torch


def _export(torch, module, x, **kw):
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # The TorchScript exporter: the dynamo one needs onnxscript, not installed here.
        torch.onnx.export(module, x, buf, dynamo=False, **kw)
    return buf.getvalue()


def _models(torch):
    torch.manual_seed(0)
    nn = torch.nn

    class Recurrent(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(5, 7, batch_first=True)
            self.gru = nn.GRU(7, 6, bidirectional=True)

        def forward(self, x):
            y, _ = self.lstm(x)
            z, h = self.gru(y.transpose(0, 1))
            return z, h

    class Block(nn.Module):  # one transformer encoder block (post-norm)
        def __init__(self, d=16, heads=4):
            super().__init__()
            self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
            self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.ff = nn.Sequential(nn.Linear(d, 32), nn.GELU(), nn.Linear(32, d))

        def forward(self, x):
            a, _ = self.attn(x, x, x, need_weights=False)
            x = self.n1(x + a)
            return self.n2(x + self.ff(x))

    preserve = dict(training=torch.onnx.TrainingMode.PRESERVE, do_constant_folding=False)
    return {
        "mlp": (nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4)),
                torch.randn(3, 8), {}),
        "cnn": (_cnn(torch), torch.randn(2, 1, 8, 8), preserve),
        "rnn": (Recurrent(), torch.randn(2, 12, 5), {}),
        "transformer": (Block(), torch.randn(2, 6, 16), {}),
    }


def _cnn(torch):
    nn = torch.nn
    m = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                      nn.MaxPool2d(2), nn.Flatten(), nn.Linear(4 * 4 * 4, 10))
    with torch.no_grad():
        # Batch-norm state other than the defaults (the exporter would otherwise share one
        # initializer between the zero bias and the zero running mean).
        m[1].running_mean.uniform_(-0.5, 0.5)
        m[1].running_var.uniform_(0.5, 2.0)
        m[1].weight.uniform_(0.5, 1.5)
        m[1].bias.uniform_(-0.2, 0.2)
    return m


@pytest.mark.parametrize("name", ["mlp", "cnn", "rnn", "transformer"])
def test_pytorch_model_matches(name):
    torch = _torch()
    module, x, kw = _models(torch)[name]
    module.eval()
    with torch.no_grad():
        want = module(x)
    want = want if isinstance(want, tuple) else (want,)
    model = onnx.load_from_string(_export(torch, module, x, **kw))
    ops = {n.op_type for n in model.graph.node}
    expected = {"mlp": {"Gemm"}, "cnn": {"Conv", "BatchNormalization", "MaxPool", "Relu"},
                "rnn": {"LSTM", "GRU"},
                "transformer": {"LayerNormalization", "Gelu", "Softmax", "MatMul"}}[name]
    assert expected <= ops, ops
    g = gx.import_model(model)
    outs = g.computation()(x.numpy())
    assert len(outs) == len(want)
    for got, w in zip(outs, want):
        np.testing.assert_allclose(got, w.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["mlp", "cnn", "rnn", "transformer"])
def test_pytorch_model_on_the_emulated_gpu(name):
    torch = _torch()
    from cuda_emulator import EmulatorRuntime, find_compiler
    if find_compiler() is None:
        pytest.skip("no C++ compiler for the GPU emulator")
    from geon.transformers.gpu import GPUTransformer
    module, x, kw = _models(torch)[name]
    module.eval()
    with torch.no_grad():
        want = module(x)
    want = want if isinstance(want, tuple) else (want,)
    g = gx.import_model(_export(torch, module, x, **kw))
    outs = g.computation(GPUTransformer(runtime=EmulatorRuntime(seed=3)))(x.numpy())
    for got, w in zip(outs, want):
        np.testing.assert_allclose(got, w.numpy(), rtol=1e-5, atol=1e-6)


# --- fine-tuning ----------------------------------------------------------------------------------

def _cross_entropy(logits, onehot):
    return be.np.mean(-be.np.sum(onehot * be.np.log_softmax(logits, axis=1), axis=1))


def test_imported_cnn_gradients_equal_torch_autograd():
    torch = _torch()
    module = _cnn(torch).eval()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 1, 8, 8)).astype(np.float32)
    labels = np.array([1, 7, 3, 0])
    onehot = np.eye(10, dtype=np.float32)[labels]
    g = gx.import_model(_export(torch, module, torch.from_numpy(x),
                                training=torch.onnx.TrainingMode.PRESERVE,
                                do_constant_folding=False))
    t = be.np.placeholder((4, 10), name="t")
    cost = _cross_entropy(g.outputs[0], t)
    params = dict(module.named_parameters())
    assert set(params) <= set(g.variables)
    names = sorted(params)
    grads = [be.deriv(cost, g.variables[n]) for n in names]
    got = be.make_transformer("numpy").computation([cost] + grads, g.inputs[0], t)(x, onehot)

    loss = torch.nn.functional.cross_entropy(module(torch.from_numpy(x)),
                                             torch.from_numpy(labels))
    loss.backward()
    np.testing.assert_allclose(got[0], loss.item(), rtol=1e-5)
    for n, gv in zip(names, got[1:]):
        np.testing.assert_allclose(gv, params[n].grad.numpy(), rtol=1e-4, atol=1e-6,
                                   err_msg=n)


def test_imported_cnn_fine_tunes_on_digits():
    torch = _torch()
    from geon.examples.digits import load_digits
    torch.manual_seed(1)
    images, labels = load_digits()
    batch = 32
    x = images[:batch].reshape(batch, 1, 8, 8).astype(np.float32)
    onehot = np.eye(10, dtype=np.float32)[labels[:batch]]
    g = gx.import_model(_export(torch, _cnn(torch).eval(), torch.from_numpy(x),
                                training=torch.onnx.TrainingMode.PRESERVE,
                                do_constant_folding=False))
    t = be.np.placeholder((batch, 10), name="t")
    cost = _cross_entropy(g.outputs[0], t)
    trainable = [v for n, v in g.variables.items() if not n.endswith(("running_mean",
                                                                      "running_var"))]
    updates = [be.SetItem(v, v - 0.1 * be.deriv(cost, v)) for v in trainable]
    tr = be.make_transformer("numpy")
    step = tr.computation([cost] + updates, g.inputs[0], t)
    losses = [float(step(x, onehot)[0]) for _ in range(20)]
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    assert losses[-1] < losses[0] - 0.1, losses


# --- bad and hostile files -----------------------------------------------------------------------

def _small_model_bytes():
    w = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(3, 4) / 10, "w")
    b = numpy_helper.from_array(np.ones(4, np.float32), "b")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Add", ["h", "b"], ["a"], name="add"),
             helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("Shape", ["r"], ["s"], name="shape"),
             helper.make_node("Reshape", ["r", "s"], ["y"], name="reshape")]
    return _model(nodes, [_vi("x", [2, 3])], [_vi("y", [2, 4])], [w, b]).SerializeToString()


def _only_geon_errors(data):
    """``"ok"`` if ``data`` imports (and runs, when it still takes a (2, 3) float
    input), ``"error"`` if a GeonError says why not; anything else propagates."""
    try:
        g = gx.import_model(data)
        if len(g.inputs) == 1 and be.np.shape(g.inputs[0]) == (2, 3) and \
                g.inputs[0].dtype == np.float32:
            g.computation()(np.ones((2, 3), np.float32))
        return "ok"
    except GeonError:
        return "error"


def test_truncated_and_fuzzed_files_raise_geon_errors_only():
    data = _small_model_bytes()
    x = np.ones((2, 3), np.float32)
    ref = gx.import_model(data).computation()(x)[0]
    assert np.allclose(ref, np.maximum(x @ (np.arange(12).reshape(3, 4) / 10) + 1, 0))
    seen = {_only_geon_errors(data[:n]) for n in range(0, len(data), 3)}
    rng = np.random.default_rng(13)
    for _ in range(300):
        mutated = bytearray(data)
        for _ in range(int(rng.integers(1, 4))):
            k = int(rng.integers(len(mutated)))
            mutated[k] = int(rng.integers(256)) if rng.random() < 0.7 else mutated[k] ^ 0x80
        seen.add(_only_geon_errors(bytes(mutated)))
    assert seen == {"ok", "error"}  # the mutations reach the importer, not only the parser


def test_cycle_is_refused():
    nodes = [helper.make_node("Relu", ["x", "b"], ["a"], name="first"),
             helper.make_node("Relu", ["a"], ["b"], name="second")]
    m = _model(nodes, [_vi("x", [2])], [_vi("b", [2])])
    with pytest.raises(gx.InvalidOnnxModel, match="cycle"):
        gx.import_model(m)


def test_huge_declared_shapes_are_refused_before_allocating():
    t = onnx.TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[1 << 20, 1 << 20],
                         raw_data=b"\0" * 16)
    m = _model([helper.make_node("Relu", ["w"], ["y"])], [], [_vi("y", [1])], [t])
    start = time.process_time()
    with pytest.raises(gx.InvalidOnnxModel, match="bytes"):
        gx.import_model(m)
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [1 << 30, 1 << 10])],
               [_vi("y", [1])])
    with pytest.raises(gx.InvalidOnnxModel, match="bytes"):
        gx.import_model(m)
    shape = numpy_helper.from_array(np.array([1 << 30, 1 << 10], np.int64), "shape")
    m = _model([helper.make_node("ConstantOfShape", ["shape"], ["y"])], [],
               [_vi("y", [1])], [shape])
    with pytest.raises(gx.InvalidOnnxModel, match="bytes"):
        gx.import_model(m)
    assert time.process_time() - start < 30  # nothing of that size was made


def _external_model(tmp_path, location):
    t = onnx.TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4])
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", "0"), ("length", "16")):
        e = t.external_data.add()
        e.key, e.value = k, v
    m = _model([helper.make_node("Add", ["x", "w"], ["y"])], [_vi("x", [4])],
               [_vi("y", [4])], [t])
    path = tmp_path / "model.onnx"
    path.write_bytes(m.SerializeToString())
    return path


def test_external_data_only_from_the_models_folder(tmp_path):
    outside = tmp_path / "secret.bin"
    outside.write_bytes(np.arange(4, dtype=np.float32).tobytes())
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "w.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    g = gx.import_model(_external_model(folder, "w.bin"))
    assert g.computation()(np.ones(4, np.float32))[0].tolist() == [1, 2, 3, 4]
    os.symlink(outside, folder / "link.bin")
    for loc in (str(outside), "../secret.bin", "sub/../../secret.bin", "link.bin"):
        with pytest.raises(gx.InvalidOnnxModel, match="external data"):
            gx.import_model(_external_model(folder, loc))
    (folder / "short.bin").write_bytes(b"\0" * 8)  # 8 bytes where 16 are declared
    with pytest.raises(gx.InvalidOnnxModel, match="fewer"):
        gx.import_model(_external_model(folder, "short.bin"))
    with pytest.raises(gx.InvalidOnnxModel, match="path"):  # bytes: no folder to read
        gx.import_model(_external_model(folder, "w.bin").read_bytes())


def test_cast_keeps_the_sign_of_zero_and_integers_exact():
    """Cast converts a float by adding -0.0 (an identity for every float, -0.0
    included; an integer zero becomes +0.0), an integer by adding an integer 0."""
    from onnx import TensorProto, helper
    big = np.array([2**62 + 1, 2**53 + 1, -(2**40) - 3], np.int64)
    cases = [(TensorProto.FLOAT, TensorProto.DOUBLE, np.array([-0.0, 0.0, -2.5], np.float32)),
             (TensorProto.INT32, TensorProto.FLOAT, np.array([0, -1, 2], np.int32)),
             # integers convert as integers: exact above 2**53, wrapping as NumPy does
             (TensorProto.INT64, TensorProto.UINT64, big),
             (TensorProto.INT64, TensorProto.INT32, big)]
    for src, to, x in cases:
        node = helper.make_node("Cast", ["x"], ["y"], to=to)
        g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", src, [3])],
                              [helper.make_tensor_value_info("y", to, [3])])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        got = gx.import_model(m).computation()(x)[0]
        want = x.astype(helper.tensor_dtype_to_np_dtype(to))
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), (got, want)
