"""Import ONNX models as geon graphs (needs ``onnx``: the optional extra ``[onnx]``).

::

    import geon.frontends.onnx as gx
    g = gx.import_model("model.onnx")
    outs = g.computation()(*arrays)

See doc/onnx.rst. Importing :mod:`geon` never needs the ``onnx`` package; this module
imports it when a model is loaded.
"""

from geon.frontends.onnx.importer import OnnxGraph, Value, import_model
from geon.frontends.onnx.loading import MAX_TENSOR_BYTES, InvalidOnnxModel, UnsupportedOnnxOp
from geon.frontends.onnx.ops import OPS, onnx_op
from geon.frontends.onnx.runtime_values import import_runtime_values

__all__ = ["MAX_TENSOR_BYTES", "InvalidOnnxModel", "OPS", "OnnxGraph", "UnsupportedOnnxOp",
           "Value", "import_model", "import_runtime_values", "onnx_op"]
