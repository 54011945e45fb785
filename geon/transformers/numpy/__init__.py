"""The NumPy (CPU) transformer."""

from geon.transformers.numpy.transformer import (NUMPY_CODE, NumPyComputation,
                                                 NumPyTransformer, numpy_code)
from geon.transformers.numpy import conv as _conv  # noqa: F401 - registers NUMPY_CODE

__all__ = ["NUMPY_CODE", "NumPyComputation", "NumPyTransformer", "numpy_code"]
