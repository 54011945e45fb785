"""Handwritten digits with a small convolutional network.

Each 8x8 image of the bundled digits set (see :mod:`geon.examples.digits`) is a
one-channel image with spatial axes H and W. The network is

    Conv 3x3 (32, same padding) -> BatchNorm -> relu -> Conv 3x3 (32) -> BatchNorm -> relu
    -> max pool 2x2 -> Flatten -> Affine (10)

trained by Adam on 80% of the images; the fixed held-out 20% gives the test accuracy.
Run it with ``python -m geon.examples.digits_cnn`` (options ``--epochs``,
``--batch-size``, ``--lr``, ``--channels``, ``--seed``, ``--quiet``, ``--transformer``,
``--data-parallel``: ``mpirun -n N python -m geon.examples.digits_cnn --data-parallel``
trains on N ranks with a global batch of N x ``--batch-size``).
With the defaults (10 epochs, dropout 0.25 after the pooling) it reaches 98.9% test
accuracy in about 2 s (building, training and testing) on an idle 2-core machine.
"""

import geon as be
from geon.examples._train import cli, parser, train_and_report
from geon.frontends import neon as nn


def build_model(args):
    """The network above, as a :class:`~geon.frontends.neon.Model`."""
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
    """Train and evaluate; returns ``{"test_accuracy", "test_loss", "elapsed",
    "history"}``."""
    p = parser("digits_cnn", "A small CNN on the 8x8 digits.", epochs=10, lr=0.005)
    p.add_argument("--channels", type=int, default=16)
    args = p.parse_args(argv)
    return train_and_report(build_model, args, (1, 8, 8))


if __name__ == "__main__":
    cli(main)
