"""Data for training: minibatches of NumPy arrays, and the bundled digits set."""

import importlib.resources
import os
from typing import Any, Iterator, Optional, Union

import numpy as np

from geon.errors import ArgumentError


class ArrayIterator:
    """Minibatches of ``x`` (and the targets ``y``), the first dimension the sample.

    An epoch's order depends only on ``seed`` and the epoch's number (a permutation
    from ``numpy.random.default_rng((seed, epoch))``, or the stored order with
    ``shuffle=False``), so a run resumed at any step sees the batches it would have
    seen. An epoch has ``len(x) // batch_size`` full batches, then, unless
    ``drop_remainder``, the last ``len(x) % batch_size`` samples as a smaller batch
    (with ``drop_remainder`` they are left out: a different remainder each epoch when
    shuffled). By default the remainder is kept, except by a sharded iterator.

    For data-parallel training (:meth:`shard`), ``batch_size`` is the *local* batch:
    a global batch is ``ranks * batch_size`` consecutive samples of the epoch's order,
    and rank ``rank`` reads its ``rank``-th block of ``batch_size`` of them, so the
    ranks' blocks laid end to end are the batch one process with
    ``ranks * batch_size`` reads.
    """

    def __init__(self, x: Any, y: Any = None, batch_size: int = 32, shuffle: bool = True,
                 seed: int = 0, rank: int = 0, ranks: int = 1,
                 drop_remainder: Optional[bool] = None) -> None:
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
        if drop_remainder is None:
            drop_remainder = ranks > 1
        if ranks > 1 and not drop_remainder:
            raise ArgumentError("ArrayIterator: a sharded iterator (ranks > 1) drops the "
                                "remainder (every rank's batch has batch_size samples); "
                                "leave drop_remainder out or give True")
        self.drop_remainder = bool(drop_remainder)

    def __repr__(self) -> str:
        targets = "no targets" if self.y is None else f"targets {self.y.shape[1:]}"
        shard = f", rank={self.rank}, ranks={self.ranks}" if self.ranks > 1 else ""
        keep = ", drop_remainder=True" if self.drop_remainder and self.ranks == 1 else ""
        return (f"ArrayIterator({len(self.x)} samples of {self.x.shape[1:]}, {targets}, "
                f"batch_size={self.batch_size}, shuffle={self.shuffle}, seed={self.seed}"
                f"{shard}{keep})")

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
        """How many batches an epoch has, ``len(x) // global_batch_size`` full ones
        and one more for a remainder kept (``drop_remainder=False``)."""
        full, left = divmod(len(self.x), self.global_batch_size)
        return full + (1 if left and not self.drop_remainder else 0)

    def order(self, epoch: int) -> np.ndarray:
        """The sample order of epoch ``epoch`` (0-based)."""
        if not self.shuffle:
            return np.arange(len(self.x))
        return np.random.default_rng((self.seed, epoch)).permutation(len(self.x))

    def epoch(self, epoch: int, start: int = 0
              ) -> Iterator[tuple[np.ndarray, Optional[np.ndarray]]]:
        """The batches ``(x, y)`` (``y`` None without targets) of epoch ``epoch`` from
        batch ``start`` on (this rank's blocks of them, when sharded); the last may be
        smaller (``drop_remainder=False``)."""
        order, b, g = self.order(epoch), self.batch_size, self.global_batch_size
        for k in range(start, self.steps_per_epoch):
            first = k * g + self.rank * b
            idx = order[first:first + b]
            yield self.x[idx], None if self.y is None else self.y[idx]


#: The seed of the digits' train/test split; fixed so every run is scored on the same
#: images.
SPLIT_SEED = 20240601
#: The digits' held-out fraction.
TEST_FRACTION = 0.2


def digits_arrays(path: Optional[Union[str, "os.PathLike[str]"]] = None,
                  ) -> tuple[np.ndarray, np.ndarray]:
    """``(images, labels)`` of the bundled 8x8 digits (the UCI "Optical Recognition of
    Handwritten Digits" set, ``datasets/digits.npz`` beside this module, see its
    README.txt), or of the ``.npz`` file at ``path`` with the same two arrays: float32
    pixels scaled to [0, 1], shape ``(n, 64)``, and int64 labels 0..9, shape ``(n,)``.
    Loaded without pickle."""
    source: Any = path if path is not None else \
        importlib.resources.files("geon.frontends.neon") / "datasets" / "digits.npz"
    with source.open("rb") if hasattr(source, "open") else open(source, "rb") as f:
        with np.load(f, allow_pickle=False) as data:
            images, labels = data["images"], data["labels"]
    x = images.reshape(len(images), -1).astype(np.float32) / np.float32(16.0)
    return x, labels.astype(np.int64)


def digits_split(n: int, test_fraction: float = TEST_FRACTION,
                 seed: int = SPLIT_SEED) -> tuple[np.ndarray, np.ndarray]:
    """Index arrays ``(train, test)`` into ``n`` samples: a fixed random
    ``test_fraction`` held out."""
    perm = np.random.default_rng(seed).permutation(n)
    n_test = int(round(n * test_fraction))
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])


def load_digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The bundled 8x8 digits: ``(x_train, y_train, x_test, y_test)``, pixels float32
    in [0, 1] with shape ``(n, 64)``, labels int64; the held-out 20% is the fixed split
    of ``digits_split``."""
    x, y = digits_arrays()
    train, test = digits_split(len(x))
    return x[train], y[train], x[test], y[test]
