"""Transformers turn op graphs into callable computations."""

from geon.registry import available_transformers, make_transformer, register_transformer
from geon.transformers.base import Computation, Transformer
from geon.transformers.numpy import NumPyTransformer

try:  # registers "gpu"; pycuda is imported only when a GPU transformer is made
    from geon.transformers import gpu as _gpu  # noqa: F401
except ImportError:  # pragma: no cover - a damaged installation must not break geon
    pass

__all__ = ["Computation", "Transformer", "available_transformers", "make_transformer",
           "register_transformer", "NumPyTransformer"]
