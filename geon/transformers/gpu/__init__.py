"""The GPU transformer (PyCUDA), registered as ``"gpu"``.

Importing this package never needs pycuda or a GPU: code generation is pure Python
(:class:`CudaCodegenTransformer`), and pycuda is imported only when a
:class:`GPUTransformer` is made. Without pycuda or a device, ``make_transformer("gpu")``
raises :class:`GPUUnavailableError` saying what is missing.
"""

from geon.transformers.base import register_transformer
from geon.transformers.gpu.cuda import CUDA_CODE, cuda_code
from geon.transformers.gpu.kernels import CUDA_KERNELS, cuda_kernels
from geon.transformers.gpu.transformer import (CudaCodegenTransformer, CudaComputation,
                                               DeviceState, GPUComputation, GPUTransformer,
                                               GPUUnavailableError)


def gpu_status(device=0):
    """``(True, "")`` if the GPU transformer can run on CUDA device ``device`` here,
    else ``(False, why)``."""
    from geon.transformers.gpu.runtime import gpu_status as status
    return status(device)


register_transformer("gpu", GPUTransformer)

__all__ = ["CUDA_CODE", "CUDA_KERNELS", "cuda_code", "cuda_kernels", "CudaCodegenTransformer",
           "CudaComputation", "DeviceState", "GPUComputation", "GPUTransformer",
           "GPUUnavailableError", "gpu_status"]
