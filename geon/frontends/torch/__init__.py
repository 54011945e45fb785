"""The PyTorch export's former place, kept so that ``from geon.frontends.torch import
to_torch`` goes on working: the export is a backend and lives in
:mod:`geon.transformers.torch`, whose names this module re-exports (the same objects).
"""

from geon.transformers.torch import TORCH_OPS, TorchComputation, to_torch

__all__ = ["TORCH_OPS", "TorchComputation", "to_torch"]
