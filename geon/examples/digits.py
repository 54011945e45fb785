"""Handwritten digits: train a two-layer MLP with geon's neon frontend and report its
test accuracy.

This is geon's end-to-end example. It loads the 1,797 8x8 images of handwritten
digits shipped with the model frontend (``geon/frontends/neon/datasets/digits.npz``: UCI
"Optical Recognition of Handwritten Digits", CC BY 4.0, see the README.txt there),
holds out 20% of them for testing (a fixed split, the same whatever ``--seed`` is),
and trains

    pixels (F=64) --tanh(W x + b)--> hidden (H=64) --softmax(W x + b)--> classes (10)

with the cross-entropy loss and plain minibatch SGD, written with
:mod:`geon.frontends.neon`: two ``Affine`` layers in a ``Sequential``, an ``SGD``
optimizer (its update is a graph of ``SetItem`` ops) and ``Model.fit``, which runs one
compiled training computation per minibatch. ``Model.evaluate`` scores the held-out
images with an inference computation that shares the weights.

Run it with::

    python -m geon.examples.digits                 # 30 epochs, then save digits-ckpt.npz
    python -m geon.examples.digits --resume        # continue the run saved there
    python -m geon.examples.digits --epochs 40 --resume   # continue it up to epoch 40
    python -m geon.examples.digits --epochs 0 --resume    # only evaluate a checkpoint
    python -m geon.examples.digits --plot curves.png      # and draw the training curves

Options (``--help`` describes each, with its default): ``--epochs N`` (the run's total
number of epochs, as Keras's ``epochs``), ``--batch-size B``, ``--lr RATE``,
``--hidden H``, ``--seed S`` (weight initialisation and minibatch order),
``--checkpoint PATH`` (default ``digits-ckpt.npz`` in the current directory),
``--resume``, ``--no-save``, ``--plot FILE`` (the loss and accuracy of each epoch,
training and test, as a PNG; needs matplotlib), ``--quiet`` (no progress output),
``--transformer NAME``, ``--data-parallel`` and ``--export DIR`` (this example only:
write the trained model's inference plan, its weights included, and the test set, for
the C program ``native/examples/digits_predict``, which classifies them with no
Python: see :func:`export` and doc/backends.rst). The other examples (``digits_cnn``,
``digits_rnn``) take the same options. A progress bar with the current loss, the rate
and the time left is drawn on stderr when it is a terminal (tqdm's if tqdm is
installed, e.g. with ``pip install -e ".[examples]"``); otherwise one line per epoch,
with its rate and the time left, is printed there. The run ends with one line on
stdout giving the test accuracy, the losses and the elapsed time.

The checkpoint is written after every epoch and when the run is interrupted (Ctrl-C);
it holds the weights and the optimizer's step counter. The run's hyperparameters
(``--batch-size``, ``--lr``, ``--hidden``, ``--seed`` and the total number of epochs)
are written beside it, in ``PATH`` with ``.json`` for ``.npz``. ``--resume`` reads
them back (giving one of them with another value is an error) and continues the same
run up to its total number of epochs, or up to ``--epochs N`` (as Keras's
``fit(initial_epoch=..., epochs=N)``; an epoch interrupted part way is finished). The
minibatch order of an epoch depends only on ``--seed`` and the epoch's number, so 10
epochs then ``--epochs 20 --resume``, or a run interrupted and resumed, give bit for
bit the weights of one uninterrupted run of 20.

Data-parallel training on MPI (see doc/distributed.rst)::

    mpirun -n 2 python -m geon.examples.digits --data-parallel

runs one process per rank; ``--batch-size`` is then the batch of each rank, so a step
trains on N x ``--batch-size`` images (each rank reads its own block of every global
batch), the gradients averaged over the ranks. Rank 0 alone prints and writes the
checkpoint (every rank reads it with ``--resume``). Without ``mpirun`` it is one rank.

From Python, :func:`main` takes the same arguments as a list and returns a dict
(``test_accuracy``, ``loss``, ``test_loss``, ``elapsed``, ``epochs``, ``checkpoint``, ...).
With the defaults it reaches about 97-98% test accuracy in a second or two on a
2-core machine.
"""

import os

import numpy as np

import geon as be
from geon.examples import _train
from geon.examples._train import Hyper
from geon.frontends import neon as nn
# The data set and its fixed train/test split live in the model frontend's data module
# (the library); the example keeps the names it always had.
from geon.frontends.neon.data import SPLIT_SEED, TEST_FRACTION  # noqa: F401
from geon.frontends.neon.data import digits_arrays as load_digits  # noqa: F401
from geon.frontends.neon.data import digits_split as split  # noqa: F401

N_CLASSES = 10
#: The hyperparameters stored beside the checkpoint, and their defaults.
HYPERPARAMETERS = {"batch_size": 32, "lr": 0.2, "hidden": 64, "seed": 0}
DEFAULT_EPOCHS = 30
#: Their command-line options.
OPTIONS = {
    "batch_size": Hyper(32, int, "minibatch size", minimum=1),
    "lr": Hyper(0.2, float, "SGD learning rate", positive=True),
    "hidden": Hyper(64, int, "hidden units", minimum=1),
    "seed": Hyper(0, int, "seed of the initial weights and the minibatch order",
                  minimum=0),
}
assert {k: h.default for k, h in OPTIONS.items()} == HYPERPARAMETERS


hyperparameters_path = _train.hyperparameters_path


def build_model(hp, n_features, transformer, data_parallel=False):
    """The model: ``Affine(hidden, tanh) -> Affine(10)`` trained by SGD (on every rank
    of an MPI job with ``data_parallel``)."""
    F = be.Axis(n_features, name="F")
    init = nn.GlorotUniform(seed=hp["seed"])
    net = nn.Sequential([
        nn.Affine(hp["hidden"], activation="tanh", weight_init=init, name="hidden"),
        nn.Affine(be.Axis(N_CLASSES, name="Y"), weight_init=init, name="output"),
    ])
    return nn.Model(net, [F], loss="cross_entropy", optimizer=nn.SGD(hp["lr"]),
                    batch_size=hp["batch_size"], transformer=transformer,
                    data_parallel=data_parallel)


#: The files :func:`export` writes.
PLAN_FILE, DATA_FILE = "digits-plan.json", "digits-test.bin"


def inference_plan(model, batch_size=None, unroll=False):
    """The plan document (:func:`geon.transformers.backends.plan`) of the model's
    inference on a batch of ``batch_size`` images (default the model's
    ``eval_batch_size``): input float32 ``[B, 64]``, output float32 ``[B, 10]`` (the
    class scores; the class is their argmax), its Variables holding the model's current
    weights; ``unroll``: the loops of recurrent layers unrolled (for backends without
    loops, such as geon's native runtime)."""
    from geon.transformers.backends import plan
    b = model.eval_batch_size if batch_size is None else int(batch_size)
    E = be.Axis(b, name="E", batch=True)
    x = be.placeholder(be.Axes(E, *model.input_axes), dtype=model.dtype, name="x")
    out = model.net(x, training=False)
    out = be.axes_with_order(out, be.Axes(E, *(out.axes - E)))
    return plan(out, x, state=model.transformer, unroll=unroll)


def export(model, folder, x_test, y_test, batch_size=None):
    """Write the model's :func:`inference_plan` to ``folder/digits-plan.json`` and the
    test images and labels as a data set file (:mod:`geon.transformers.native.export`)
    to ``folder/digits-test.bin``; returns the two paths. Run them with::

        digits_predict folder/digits-plan.json folder/digits-test.bin
    """
    from geon.transformers.native.export import write_dataset
    os.makedirs(folder, exist_ok=True)
    paths = os.path.join(folder, PLAN_FILE), os.path.join(folder, DATA_FILE)
    with open(paths[0], "w", encoding="utf-8") as f:
        f.write(inference_plan(model, batch_size))
    write_dataset(paths[1], np.asarray(x_test).reshape(len(x_test), -1), y_test)
    return paths


def parse_args(argv=None):
    """The command line (see the module's description)."""
    p = _train.parser("digits", "Train a two-layer MLP on 8x8 handwritten digits with "
                      "geon.", OPTIONS, DEFAULT_EPOCHS)
    p.add_argument("--export", metavar="DIR", default=None,
                   help=f"after training, write the inference plan with the trained "
                        f"weights ({PLAN_FILE}) and the test set ({DATA_FILE}) to DIR, "
                        f"for native/examples/digits_predict (default: no export)")
    return _train.parse(p, argv)


def main(argv=None):
    """Run the example with command-line arguments ``argv`` (default ``sys.argv[1:]``).

    Returns a dict: ``test_accuracy`` (fraction of the held-out images classified
    right), ``loss`` (mean training loss over the last epoch; NaN if none ran),
    ``test_loss`` (mean cross-entropy on the held-out images), ``elapsed`` (seconds,
    data loading and compilation included), ``epochs`` (completed in total, resumed
    ones included), ``epochs_run`` (in this call), ``n_train``, ``n_test``, ``ranks``,
    ``checkpoint`` (absolute path written, or ``None`` with ``--no-save``), ``plot``,
    ``hyperparameters``, ``history`` and ``export`` (the plan and data files written with
    ``--export``, or ``None``).
    """
    args = parse_args(argv)
    models = []

    def build(hp, a):
        models.append(build_model(hp, 64, a.transformer, a.data_parallel))
        return models[-1]
    result = _train.run(args, build, (64,))
    result["export"] = None
    if args.export is not None and models[-1].rank == 0:
        _, _, x_test, y_test = _train.digits_data((64,))
        result["export"] = export(models[-1], args.export, x_test, y_test)
    return result


def _cli():
    _train.cli(main)


if __name__ == "__main__":
    _cli()
