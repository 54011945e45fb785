"""The table of ONNX ops: ``(domain, op type)`` -> builders, each for a range of opset
versions (see :mod:`geon.frontends.onnx.builders.base`).

This module is the table's public face: importing it registers every builder (the
modules of :mod:`geon.frontends.onnx.builders`, one per family of operators) and gives
:data:`OPS`, the :func:`onnx_op` decorator, :func:`find_builder`, :func:`supported` and
the type helpers the importer uses.
"""

from geon.frontends.onnx import builders  # noqa: F401  (registers every builder)
from geon.frontends.onnx.builders.base import (OPS, carrier, cast, find_builder, is_float,
                                               onnx_op, to_narrow)

__all__ = ["OPS", "carrier", "cast", "find_builder", "is_float", "onnx_op", "supported",
           "to_narrow"]


def supported(domain=""):
    """The operators of ``domain`` with a builder in :data:`OPS`, sorted."""
    return sorted(op for d, op in OPS if d == domain)
