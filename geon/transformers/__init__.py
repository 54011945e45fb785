"""Transformers turn op graphs into callable computations."""

from geon.transformers.base import (Computation, Transformer, available_transformers,
                                    make_transformer, register_transformer)
from geon.transformers.numpy import NumPyTransformer

__all__ = ["Computation", "Transformer", "available_transformers", "make_transformer",
           "register_transformer", "NumPyTransformer"]
