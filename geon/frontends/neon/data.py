"""Data for training: minibatches of NumPy arrays, and the bundled digits set."""

from typing import Any, Iterator, Optional

import numpy as np

from geon.errors import ArgumentError


class ArrayIterator:
    """Minibatches of ``x`` (and the targets ``y``), the first dimension the sample.

    An epoch's order depends only on ``seed`` and the epoch's number (a permutation
    from ``numpy.random.default_rng((seed, epoch))``, or the stored order with
    ``shuffle=False``), so a run resumed at any step sees the batches it would have
    seen. Training epochs have ``steps_per_epoch = len(x) // batch_size`` full batches
    (the remainder, a different one each epoch, is left out).

    For data-parallel training (:meth:`shard`), ``batch_size`` is the *local* batch:
    a global batch is ``ranks * batch_size`` consecutive samples of the epoch's order,
    and rank ``rank`` reads its ``rank``-th block of ``batch_size`` of them, so the
    ranks' blocks laid end to end are the batch one process with
    ``ranks * batch_size`` reads.
    """

    def __init__(self, x: Any, y: Any = None, batch_size: int = 32, shuffle: bool = True,
                 seed: int = 0, rank: int = 0, ranks: int = 1) -> None:
        self.x = np.asarray(x)
        self.y = None if y is None else np.asarray(y)
        if self.y is not None and len(self.y) != len(self.x):
            raise ArgumentError(f"ArrayIterator: {len(self.x)} inputs but {len(self.y)} "
                                f"targets")
        if not 0 <= rank < ranks:
            raise ArgumentError(f"ArrayIterator: rank must be in 0..{ranks - 1}, not "
                                f"{rank}")
        if not 1 <= batch_size * ranks <= len(self.x):
            raise ArgumentError(
                f"ArrayIterator: batch_size must be in 1..{len(self.x) // ranks} (the "
                f"number of samples" + (f" over {ranks} ranks" if ranks > 1 else "") +
                f"), not {batch_size}")
        self.batch_size, self.shuffle, self.seed = int(batch_size), shuffle, seed
        self.rank, self.ranks = int(rank), int(ranks)

    def __repr__(self) -> str:
        targets = "no targets" if self.y is None else f"targets {self.y.shape[1:]}"
        shard = f", rank={self.rank}, ranks={self.ranks}" if self.ranks > 1 else ""
        return (f"ArrayIterator({len(self.x)} samples of {self.x.shape[1:]}, {targets}, "
                f"batch_size={self.batch_size}, shuffle={self.shuffle}, seed={self.seed}"
                f"{shard})")

    def shard(self, rank: int, ranks: int) -> "ArrayIterator":
        """This iterator for rank ``rank`` of ``ranks`` (the same arrays, order and
        local ``batch_size``): see the class's description."""
        return ArrayIterator(self.x, self.y, self.batch_size, self.shuffle, self.seed,
                             rank=rank, ranks=ranks)

    @property
    def global_batch_size(self) -> int:
        """``ranks * batch_size``: the samples of one step over every rank."""
        return self.ranks * self.batch_size

    def __len__(self) -> int:
        return len(self.x)

    @property
    def steps_per_epoch(self) -> int:
        """The number of full global batches in an epoch, ``len(x) // global_batch_size``."""
        return len(self.x) // self.global_batch_size

    def order(self, epoch: int) -> np.ndarray:
        """The sample order of epoch ``epoch`` (0-based)."""
        if not self.shuffle:
            return np.arange(len(self.x))
        return np.random.default_rng((self.seed, epoch)).permutation(len(self.x))

    def epoch(self, epoch: int, start: int = 0
              ) -> Iterator[tuple[np.ndarray, Optional[np.ndarray]]]:
        """The batches ``(x, y)`` (``y`` None without targets) of epoch ``epoch`` from
        batch ``start`` on (this rank's blocks of them, when sharded)."""
        order, b, g = self.order(epoch), self.batch_size, self.global_batch_size
        for k in range(start, self.steps_per_epoch):
            first = k * g + self.rank * b
            idx = order[first:first + b]
            yield self.x[idx], None if self.y is None else self.y[idx]


def load_digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The bundled 8x8 digits: ``(x_train, y_train, x_test, y_test)``, pixels float32
    in [0, 1] with shape ``(n, 64)``, labels int64; the held-out 20% is the fixed split
    of ``geon.examples.digits.split``."""
    from geon.examples.digits import load_digits as load, split
    x, y = load()
    train, test = split(len(x))
    return x[train], y[train], x[test], y[test]
