"""Data for training: minibatches of NumPy arrays, and the bundled digits set."""

import numpy as np

from geon.errors import ArgumentError


class ArrayIterator:
    """Minibatches of ``x`` (and the targets ``y``), the first dimension the sample.

    An epoch's order depends only on ``seed`` and the epoch's number (a permutation
    from ``numpy.random.default_rng((seed, epoch))``, or the stored order with
    ``shuffle=False``), so a run resumed at any step sees the batches it would have
    seen. Training epochs have ``steps_per_epoch = len(x) // batch_size`` full batches
    (the remainder, a different one each epoch, is left out).
    """

    def __init__(self, x, y=None, batch_size=32, shuffle=True, seed=0):
        self.x = np.asarray(x)
        self.y = None if y is None else np.asarray(y)
        if self.y is not None and len(self.y) != len(self.x):
            raise ArgumentError(f"ArrayIterator: {len(self.x)} inputs but {len(self.y)} "
                                f"targets")
        if not 1 <= batch_size <= len(self.x):
            raise ArgumentError(f"ArrayIterator: batch_size must be in 1..{len(self.x)} "
                                f"(the number of samples), not {batch_size}")
        self.batch_size, self.shuffle, self.seed = int(batch_size), shuffle, seed

    def __len__(self):
        return len(self.x)

    @property
    def steps_per_epoch(self):
        return len(self.x) // self.batch_size

    def order(self, epoch):
        """The sample order of epoch ``epoch`` (0-based)."""
        if not self.shuffle:
            return np.arange(len(self.x))
        return np.random.default_rng((self.seed, epoch)).permutation(len(self.x))

    def epoch(self, epoch, start=0):
        """The batches ``(x, y)`` (``y`` None without targets) of epoch ``epoch`` from
        batch ``start`` on."""
        order, b = self.order(epoch), self.batch_size
        for k in range(start, self.steps_per_epoch):
            idx = order[k * b:(k + 1) * b]
            yield self.x[idx], None if self.y is None else self.y[idx]


def load_digits():
    """The bundled 8x8 digits: ``(x_train, y_train, x_test, y_test)``, pixels float32
    in [0, 1] with shape ``(n, 64)``, labels int64; the held-out 20% is the fixed split
    of ``geon.examples.digits.split``."""
    from geon.examples.digits import load_digits as load, split
    x, y = load()
    train, test = split(len(x))
    return x[train], y[train], x[test], y[test]
