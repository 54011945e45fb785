"""Translation of an architecture graph into a PyTorch ``nn.Module``.

torch is imported when a model is built, not when this module is imported, so the graph
model works without it: the model class lives in :mod:`.torch_model`, imported then,
and the translation cache's switches in :mod:`.translation_state`, which needs no torch.
"""

from typing import TYPE_CHECKING, Any, Mapping, Optional

from geon.errors import TorchMissingError
from geon.frontends.netgraph.graph import Graph
from geon.frontends.netgraph.translation_state import (  # noqa: F401 (re-exported)
    StateManager, clear_translation_cache, get_translation_cache_metrics,
    set_translation_cache_enabled)

if TYPE_CHECKING:  # only for the annotations: importing geon never needs torch
    import torch

__all__ = ["StateManager", "TorchMissingError", "clear_translation_cache",
           "get_translation_cache_metrics", "set_translation_cache_enabled",
           "to_pytorch_model"]


def to_pytorch_model(graph: Graph, config: Optional[Mapping[str, Any]] = None
                     ) -> "torch.nn.Module":
    """Build the ``TranslatedModel`` (an ``nn.Module``) of ``graph``.

    ``config``: ``device`` (default ``"cpu"``), ``dtype`` (default ``torch.float32``),
    ``enable_translation_cache`` (default: the global setting). Raises
    :class:`GraphError` (a ``ValueError``) for an unknown activation or aggregation or
    a cycle of non-recurrent edges, and :class:`TorchMissingError` (an ``ImportError``)
    without torch.
    """
    try:
        from geon.frontends.netgraph.torch_model import TranslatedModel
    except ImportError as e:
        if e.name != "torch" and not (e.name or "").startswith("torch."):
            raise
        raise TorchMissingError("geon.frontends.netgraph.to_pytorch_model needs PyTorch: "
                                "pip install torch==2.13.0") from e
    model: "torch.nn.Module" = TranslatedModel(graph, config)
    return model
