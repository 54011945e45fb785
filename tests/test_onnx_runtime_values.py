"""Shape operands given when an ONNX model runs (issue 34): ``import_runtime_values``
finds the inputs that decide shapes and imports the model once per distinct set of
their values (cached), and the conformance runner's ``runtime`` mode feeds every
input as ONNX's own runner does."""

import json
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import geon.frontends.onnx as gx
from geon.frontends.onnx import conformance
from geon.frontends.onnx.runtime_values import import_runtime_values

DOC = Path(__file__).resolve().parents[1] / "doc"


def _model(nodes, inputs, outputs, opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _reshape_model(batch="N"):
    vi = helper.make_tensor_value_info
    return _model([helper.make_node("Reshape", ["x", "shape"], ["y"])],
                  [vi("x", TensorProto.FLOAT, [batch, 6]),
                   vi("shape", TensorProto.INT64, [2])],
                  [vi("y", TensorProto.FLOAT, [None, None])])


def test_a_reshape_whose_target_is_fed_at_run_time():
    f = import_runtime_values(_reshape_model())
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    (y,) = f(x, np.array([-1, 3]))
    np.testing.assert_array_equal(y, x.reshape(-1, 3))
    assert f.static == ["shape"] and f.imports == 2   # one to find it, one with it
    x5 = np.ones((5, 6), np.float32)
    (y,) = f(x5, np.array([-1, 3]))   # another batch: the same import (N*6 // 3)
    assert y.shape == (10, 3) and f.imports == 2 and not f.fixed_shapes
    (y,) = f(x, np.array([3, 4]))
    # (3, 4) fits a batch of 2 only: the import over a symbolic batch says so, and the
    # inputs' shapes are fixed per call from then on
    np.testing.assert_array_equal(y, x.reshape(3, 4))
    assert f.fixed_shapes and f.imports == 4
    (y,) = f(x * 2, np.array([3, 4]))                  # seen before: no import
    assert f.imports == 4 and np.all(y == 2 * x.reshape(3, 4))


def test_the_cache_is_bounded_and_hostile_values_are_refused_before_allocating():
    f = import_runtime_values(_reshape_model(batch=2), limit=2)
    x = np.ones((2, 6), np.float32)
    for shape in ([3, 4], [4, 3], [6, 2]):
        f(x, np.array(shape))
    assert len(f._cache) == 2
    vi = helper.make_tensor_value_info
    m = _model([helper.make_node("ConstantOfShape", ["s"], ["y"])],
               [vi("s", TensorProto.INT64, [2])], [vi("y", TensorProto.FLOAT, [None, None])])
    g = import_runtime_values(m)
    (y,) = g(np.array([2, 3]))
    assert y.shape == (2, 3) and not y.any()
    with pytest.raises(gx.InvalidOnnxModel, match="larger than the limit"):
        g(np.array([1 << 30, 1 << 30]))
    with pytest.raises(gx.UnsupportedOnnxOp, match="negative dimension"):
        g(np.array([-2, 3]))


def test_the_required_operators_pass_with_every_input_fed_at_run_time():
    """The conformance runner's runtime mode over every case of the required operators
    (shape operands fed at run time): the status the committed table gives each case
    (fed at import where every data set agrees), and at least 95% passing."""
    table = json.loads((DOC / "onnx_conformance.json").read_text(encoding="utf-8"))
    results = conformance.run(set(conformance.REQUIRED), runtime=True)
    passed, total = conformance.summary(results)
    assert total >= 700 and passed >= 0.95 * total
    differ = {n: (s, table[n][1]) for n, (_, s, _) in results.items() if s != table[n][1]}
    assert not differ
