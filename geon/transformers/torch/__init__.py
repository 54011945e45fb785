"""Export any geon computation to PyTorch: :func:`to_torch` returns an ``nn.Module``.

PyTorch is optional: importing geon never needs it, and importing this module without
it raises :class:`~geon.errors.TorchMissingError` (a ``GeonError`` and an
``ImportError``) saying how to install it. See doc/torch_export.rst.
"""

from geon.errors import TorchMissingError

try:
    import torch  # noqa: F401 - only to fail early with an install hint
except ImportError as e:  # pragma: no cover - exercised where torch is absent
    raise TorchMissingError("geon.transformers.torch needs PyTorch, which is not installed: "
                            "pip install torch==2.13.0 (or, in a checkout of geon, "
                            "pip install -e '.[torch]')") from e

from geon.transformers.torch.export import TORCH_OPS, TorchComputation, to_torch  # noqa: E402
from geon.transformers.torch import control as _control  # noqa: E402,F401 (its rules)

__all__ = ["TORCH_OPS", "TorchComputation", "to_torch"]
