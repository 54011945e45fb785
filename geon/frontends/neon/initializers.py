"""Initializers: callables ``init(shape, dtype, name) -> array`` for a layer's Variables.

Each initializer is seeded: the array it gives depends only on its ``seed``, the
variable's hierarchical name (``conv1/W``) and shape, so a model built twice with the
same seeds starts from bitwise the same weights, in any process. The values come from
geon's own counter-based generator (:mod:`geon.op_graph.random`, Philox-4x32-10): the
numbers ``be.uniform`` / ``be.normal`` with ``seed=seed`` and ``stream=crc32(name)``
draw at their first call, in float64, then scaled; they become the Variable's
``initial_value``, which the transformer's ``initialize`` writes. ``fan_in`` is the product of every axis length except the first (the layer's
output axis), ``fan_out`` the first axis' length times the receptive field.
"""

import zlib
from typing import Any, Sequence

import numpy as np

from geon.frontends.neon._api import Configurable
from geon.op_graph import random as rnd


class _Stream:
    """The draws of geon's Philox stream ``(seed, crc32(name))`` at steps 1, 2, ...: what
    successive calls of a random op with that seed and stream give."""

    def __init__(self, seed: int, name: str) -> None:
        self.seed, self.stream, self.step = int(seed), zlib.crc32(name.encode()), 1

    def _draw(self, distribution: str, shape: tuple[int, ...]) -> np.ndarray:
        values: np.ndarray = rnd.draw(distribution, shape, np.float64, self.seed,
                                      self.stream, self.step)
        self.step += 1
        return values

    def uniform(self, low: float, high: float, shape: tuple[int, ...]) -> np.ndarray:
        values: np.ndarray = low + (high - low) * self._draw("uniform", shape)
        return values

    def normal(self, loc: float, scale: float, shape: tuple[int, ...]) -> np.ndarray:
        values: np.ndarray = loc + scale * self._draw("normal", shape)
        return values


def _rng(seed: int, name: str) -> _Stream:
    return _Stream(seed, name)


def _fans(shape: tuple[int, ...]) -> tuple[int, int]:
    if len(shape) == 0:
        return 1, 1
    if len(shape) == 1:
        return shape[0], shape[0]
    fan_in = int(np.prod(shape[1:]))
    return fan_in, shape[0]


class Initializer(Configurable):
    """Base class: subclasses implement ``sample``."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def __call__(self, shape: Sequence[int], dtype: Any, name: str) -> np.ndarray:
        """The initial array of a variable ``name`` of ``shape`` and ``dtype``."""
        return np.asarray(self.sample(_rng(self.seed, name), tuple(shape)), dtype=dtype)

    def sample(self, rng: _Stream, shape: tuple[int, ...]) -> np.ndarray:
        raise NotImplementedError


class Constant(Initializer):
    """Every entry ``value``."""

    def __init__(self, value: float = 0.0) -> None:
        super().__init__(0)
        self.value = value

    def sample(self, rng: _Stream, shape: tuple[int, ...]) -> np.ndarray:
        return np.full(shape, self.value)


class Uniform(Initializer):
    """Uniform on ``[low, high)``."""

    def __init__(self, low: float = -0.05, high: float = 0.05, seed: int = 0) -> None:
        super().__init__(seed)
        self.low, self.high = low, high

    def sample(self, rng: _Stream, shape: tuple[int, ...]) -> np.ndarray:
        return rng.uniform(self.low, self.high, shape)


class Gaussian(Initializer):
    """Normal with mean ``loc`` and standard deviation ``scale``."""

    def __init__(self, loc: float = 0.0, scale: float = 0.05, seed: int = 0) -> None:
        super().__init__(seed)
        self.loc, self.scale = loc, scale

    def sample(self, rng: _Stream, shape: tuple[int, ...]) -> np.ndarray:
        return rng.normal(self.loc, self.scale, shape)


class GlorotUniform(Initializer):
    """Uniform on ``±sqrt(6 / (fan_in + fan_out))`` (Glorot & Bengio, 2010)."""

    def sample(self, rng: _Stream, shape: tuple[int, ...]) -> np.ndarray:
        fan_in, fan_out = _fans(shape)
        limit = np.sqrt(6.0 / (fan_in + fan_out))
        return rng.uniform(-limit, limit, shape)


class KaimingNormal(Initializer):
    """Normal with standard deviation ``sqrt(2 / fan_in)`` (He et al., 2015)."""

    def sample(self, rng: _Stream, shape: tuple[int, ...]) -> np.ndarray:
        fan_in, _ = _fans(shape)
        return rng.normal(0.0, np.sqrt(2.0 / fan_in), shape)
