"""The NumPy (CPU) transformer."""

from geon.transformers.numpy.transformer import (NUMPY_CODE, NumPyComputation,
                                                 NumPyTransformer, numpy_code)

__all__ = ["NUMPY_CODE", "NumPyComputation", "NumPyTransformer", "numpy_code"]
