"""What the PyTorch translation of architecture graphs keeps between translations
(a torch-free module, so that its switches work without torch): the translation cache
and its metrics, and the recurrent state of a model."""

from typing import Any

# The translation cache: derivation_uuid -> {parameter or layer name: object}. Nodes of
# one derivation share their bias and post-aggregation layer across translations.
_CACHE: dict[str, dict[str, Any]] = {}
_METRICS = {"hits": 0, "misses": 0}
_CACHE_ENABLED = [True]


def set_translation_cache_enabled(enabled: bool) -> None:
    """Turn the translation cache on or off for models built afterwards (a model's
    ``config["enable_translation_cache"]`` overrides this)."""
    _CACHE_ENABLED[0] = bool(enabled)


def clear_translation_cache() -> None:
    """Empty the translation cache and zero its metrics."""
    _CACHE.clear()
    _METRICS.update(hits=0, misses=0)


def get_translation_cache_metrics() -> dict[str, int]:
    """``{"hits", "misses", "entries"}``: lookups that found / did not find an object
    under a node's ``derivation_uuid``, and the number of cached objects."""
    return {**_METRICS, "entries": sum(len(v) for v in _CACHE.values())}


class StateManager:
    """Per-model recurrent state: the previous step's output of every node a recurrent
    edge reads, and the (h, c) / h states of LSTM / GRU nodes. Empty means zeros."""

    def __init__(self):
        self.reset()

    def reset(self):
        """Forget every state (the next step starts from zeros)."""
        self.outputs, self.cells, self.batch_size = {}, {}, None

    def begin(self, batch_size):
        """Start a step; a batch of another size cannot continue the old states."""
        if batch_size != self.batch_size:
            self.reset()
            self.batch_size = batch_size
