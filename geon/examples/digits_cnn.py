"""Handwritten digits with a small convolutional network.

Each 8x8 image of the bundled digits set (see :mod:`geon.examples.digits`) is a
one-channel image with spatial axes H and W. The network is

    Conv 3x3 (16, same padding) -> BatchNorm -> relu -> Conv 3x3 (16) -> BatchNorm -> relu
    -> max pool 2x2 -> Dropout 0.25 -> Flatten -> Affine (10)

trained by Adam on 80% of the images; the fixed held-out 20% gives the test accuracy.
Run it with ``python -m geon.examples.digits_cnn``; it takes the options of every
example (``--help`` describes them with their defaults): ``--epochs`` (the run's total,
as Keras's ``epochs``), ``--checkpoint PATH`` (default ``digits_cnn-ckpt.npz``),
``--resume``, ``--no-save``, ``--plot FILE``, ``--quiet``, ``--transformer``,
``--data-parallel`` (``mpirun -n N python -m geon.examples.digits_cnn --data-parallel``
trains on N ranks with a global batch of N x ``--batch-size``), and the
hyperparameters ``--batch-size``, ``--lr``, ``--channels`` and ``--seed``.
With the defaults (10 epochs, seed 0) it reaches 98.1% test accuracy in a few seconds
(building, training and testing) on an idle 2-core machine; over seeds 0 to 11 the
median is 99.0% and the lowest 96.1% (the last epochs' steps with Adam at 0.005 move
the test accuracy by a few images from one epoch to the next).
"""

import argparse

import geon as be
from geon.examples import _train
from geon.examples._train import Hyper
from geon.frontends import neon as nn

#: The hyperparameters' options and defaults.
OPTIONS = {
    "batch_size": Hyper(32, int, "minibatch size", minimum=1),
    "lr": Hyper(0.005, float, "Adam learning rate", positive=True),
    "channels": Hyper(16, int, "channels of each convolution", minimum=1),
    "seed": Hyper(0, int, "seed of the initial weights, the dropout masks and the "
                  "minibatch order", minimum=0),
}
DEFAULT_EPOCHS = 10


def build_model(args):
    """The network above, as a :class:`~geon.frontends.neon.Model`; ``args`` has the
    attributes ``channels``, ``seed``, ``lr``, ``batch_size``, ``transformer`` and
    ``data_parallel``."""
    C, H, W = be.Axis(1, name="C"), be.Axis(8, name="H"), be.Axis(8, name="W")
    init = nn.KaimingNormal(seed=args.seed)
    k = args.channels
    net = nn.Sequential([
        nn.Conv(k, 3, padding="same", weight_init=init, name="conv1"),
        nn.BatchNorm(name="bn1"), nn.Activation("relu"),
        nn.Conv(k, 3, padding="same", weight_init=init, name="conv2"),
        nn.BatchNorm(name="bn2"), nn.Activation("relu"),
        nn.Pool(2, op="max", name="pool"),
        nn.Dropout(0.25, seed=args.seed, name="dropout"),
        nn.Flatten(name="flat"),
        nn.Affine(be.Axis(10, name="Y"), weight_init=nn.GlorotUniform(seed=args.seed),
                  name="output"),
    ])
    return nn.Model(net, [C, H, W], optimizer=nn.Adam(args.lr), batch_size=args.batch_size,
                    transformer=args.transformer, data_parallel=args.data_parallel)


def main(argv=None):
    """Train and evaluate with the command-line arguments ``argv``; returns the dict of
    :func:`geon.examples._train.run` (``test_accuracy``, ``test_loss``, ``epochs``,
    ``history``, ...)."""
    p = _train.parser("digits_cnn", "A small CNN on the 8x8 digits.", OPTIONS,
                      DEFAULT_EPOCHS)
    args = _train.parse(p, argv)
    return _train.run(args, lambda hp, a: build_model(argparse.Namespace(**{**vars(a), **hp})),
                      (1, 8, 8))


if __name__ == "__main__":
    _train.cli(main)
