"""What the examples share: one command line, the run's hyperparameters stored beside
its checkpoint, resuming, training with :meth:`~geon.frontends.neon.Model.fit` (Keras's
``initial_epoch`` / ``epochs``), the result line, the training curves, and the exit
status (1 for a checkpoint or transformer error, 130 for Ctrl-C).

Every example takes the same options: ``--epochs`` (the run's *total* number of epochs,
as Keras's ``epochs``), ``--checkpoint PATH``, ``--resume``, ``--no-save``,
``--plot FILE``, ``--quiet``, ``--transformer NAME``, ``--data-parallel``, and its
hyperparameters (``--batch-size``, ``--lr``, ``--seed`` and its own), which are stored
beside the checkpoint and read back by ``--resume``.
"""

import argparse
import importlib.util
import json
import os
import sys
import time
from typing import Any, Callable, NamedTuple, Optional

import numpy as np

import geon as be
from geon.frontends import neon as nn


class Hyper(NamedTuple):
    """A hyperparameter's option: its default, type, help, and the least value (or
    the choices) it takes."""
    default: Any
    type: Callable[[str], Any]
    help: str
    minimum: Optional[float] = None
    choices: Optional[tuple[str, ...]] = None
    positive: bool = False   # (floats) > 0


def plural(n: int, word: str) -> str:
    """``1 epoch``, ``2 epochs``."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def hyperparameters_path(checkpoint: str) -> str:
    """Where the run's hyperparameters are stored: the checkpoint's path with
    ``.json`` for its extension."""
    return os.path.splitext(checkpoint)[0] + ".json"


def parser(name: str, description: str, hyper: dict[str, Hyper],
           epochs: int) -> argparse.ArgumentParser:
    """The examples' command line: the common options, then one option per
    hyperparameter of ``hyper`` (``batch_size`` is ``--batch-size``), each with its
    description and default in ``--help``."""
    p = argparse.ArgumentParser(prog=f"python -m geon.examples.{name}",
                                description=description)
    p.add_argument("--epochs", type=int, default=None, metavar="N",
                   help=f"the run's total number of epochs, as Keras's epochs (default "
                        f"{epochs}); with --resume the run continues up to epoch N "
                        f"(default: the total the stored run asked for); --epochs 0 "
                        f"--resume only evaluates the checkpoint")
    for key, h in hyper.items():
        option = "--" + key.replace("_", "-")
        kw: dict[str, Any] = {"choices": h.choices} if h.choices else {}
        p.add_argument(option, type=h.type, default=None, dest=key,
                       metavar=None if h.choices else key.split("_")[-1].upper(),
                       help=f"{h.help} (default {h.default}); stored with the "
                            f"checkpoint", **kw)
    p.add_argument("--checkpoint", default=f"{name}-ckpt.npz", metavar="PATH",
                   help=f"the checkpoint, written after every epoch and at Ctrl-C "
                        f"(default {name}-ckpt.npz in the current folder); the run's "
                        f"hyperparameters go beside it, in PATH with .json")
    p.add_argument("--resume", action="store_true",
                   help="restore the checkpoint and continue its run, with the "
                        "hyperparameters stored beside it (default: start afresh)")
    p.add_argument("--no-save", action="store_true",
                   help="write no checkpoint (default: write it)")
    p.add_argument("--plot", metavar="FILE", default=None,
                   help="write the training curves of the epochs this command runs "
                        "(loss and accuracy, training and test) to FILE as a PNG; needs "
                        "matplotlib (default: no plot)")
    p.add_argument("--quiet", action="store_true",
                   help="no progress output (default: a progress bar on a terminal, one "
                        "line per epoch otherwise, on stderr)")
    p.add_argument("--transformer", default="numpy", metavar="NAME",
                   help="the transformer to run on (default numpy; e.g. gpu)")
    p.add_argument("--data-parallel", action="store_true",
                   help=f"train on every rank of an MPI job (mpirun -n N python -m "
                        f"geon.examples.{name} --data-parallel): --batch-size is per "
                        f"rank, so a step trains on N x batch-size images; rank 0 prints "
                        f"and writes the checkpoint; without mpirun, one rank")
    p.set_defaults(_hyper=hyper, _epochs=epochs, _name=name)
    return p


def parse(p: argparse.ArgumentParser, argv: Optional[list[str]] = None) -> argparse.Namespace:
    """``p.parse_args(argv)`` with the values checked (an error exits with status 2
    and the usage, as argparse's own)."""
    args = p.parse_args(argv)
    if args.epochs is not None and args.epochs < 0:
        p.error("--epochs must be >= 0")
    for key, h in args._hyper.items():
        value, option = getattr(args, key), "--" + key.replace("_", "-")
        if value is None:
            continue
        if h.minimum is not None and value < h.minimum:
            p.error(f"{option} must be >= {h.minimum:g}")
        if h.positive and not value > 0:
            p.error(f"{option} must be > 0")
    if args.plot is not None and importlib.util.find_spec("matplotlib") is None:
        p.error("--plot needs matplotlib, which is not installed: pip install matplotlib")
    return args


def hyperparameters(args: argparse.Namespace) -> tuple[dict[str, Any], Optional[dict]]:
    """The run's hyperparameters: the defaults, then (with --resume) the stored ones,
    then the options given; and the stored record (None without --resume). A given
    option that contradicts the stored run is an error."""
    hyper = args._hyper
    given = {k: getattr(args, k) for k in hyper if getattr(args, k) is not None}
    hp = {k: h.default for k, h in hyper.items()}
    stored = None
    if args.resume:
        path = hyperparameters_path(args.checkpoint)
        if not os.path.exists(args.checkpoint):
            raise be.CheckpointError(f"checkpoint {args.checkpoint} does not exist")
        try:
            with open(path) as f:
                stored = json.load(f)
        except (OSError, ValueError) as e:
            raise be.CheckpointError(f"cannot read the run's hyperparameters from {path} "
                                     f"({e}); the checkpoint was not written by this "
                                     f"example") from None
        for k, v in given.items():
            if k in stored and stored[k] != v:
                raise be.CheckpointError(
                    f"--{k.replace('_', '-')} {v} but the run in {args.checkpoint} used "
                    f"{stored[k]} (stored in {path}); leave it out to continue the run")
        hp.update({k: stored[k] for k in hyper if k in stored})
    hp.update(given)
    return hp, stored


def digits_data(shape: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    """``(x_train, y_train, x_test, y_test)`` of the bundled digits (the fixed 20% held
    out), each image reshaped to ``shape``."""
    x_train, y_train, x_test, y_test = nn.load_digits()
    return (x_train.reshape((len(x_train),) + shape), y_train,
            x_test.reshape((len(x_test),) + shape), y_test)


def run(args: argparse.Namespace, build: Callable[[dict[str, Any], argparse.Namespace], Any],
        shape: tuple[int, ...]) -> dict[str, Any]:
    """Train the model ``build(hp, args)`` on the digits (reshaped to ``shape``) up to
    the run's total number of epochs, checkpointing (unless ``--no-save``) after each
    epoch and at Ctrl-C; evaluate it on the test digits; print the result line (rank 0);
    plot the curves with ``--plot``.

    Returns ``test_accuracy``, ``loss`` (mean training loss of the last epoch run; NaN
    if none ran), ``test_loss``, ``elapsed`` (seconds, building and testing included),
    ``epochs`` (completed in total, resumed ones included), ``epochs_run`` (by this
    call), ``n_train``, ``n_test``, ``ranks``, ``checkpoint`` (absolute path, or None
    with ``--no-save``), ``plot`` (the figure's path or None), ``hyperparameters`` and
    ``history`` (the :class:`~geon.frontends.neon.History` of this call)."""
    start = time.perf_counter()
    hp, stored = hyperparameters(args)
    x_train, y_train, x_test, y_test = digits_data(shape)
    model = build(hp, args)
    ranks, chief = model.ranks, model.rank == 0   # 1 and True unless data-parallel
    if hp["batch_size"] * ranks > len(x_train):
        over = f" over {ranks} ranks" if ranks > 1 else ""
        raise SystemExit(f"--batch-size must be at most {len(x_train) // ranks} (the "
                         f"training set{over})")
    if args.resume:
        model.restore(args.checkpoint)  # raises geon.CheckpointError if mismatched
    # The remainder of an epoch is left out, a new one each epoch.
    steps_per_epoch = len(x_train) // (hp["batch_size"] * ranks)
    first = model.step // steps_per_epoch           # epochs completed (0 unless resumed)
    if args.epochs is not None:
        total = args.epochs
    elif stored is not None:
        total = int(stored.get("epochs", first))
    else:
        total = args._epochs
    hp["epochs"] = max(total, first)                # where this run ends
    callbacks = []
    if not args.no_save:
        if chief:
            nn.callbacks.write_json(hyperparameters_path(args.checkpoint), hp)
        callbacks.append(nn.ModelCheckpoint(args.checkpoint))
    history = model.fit(x_train, y_train, epochs=total, initial_epoch=first,
                        batch_size=hp["batch_size"], seed=hp["seed"],
                        validation_data=(x_test, y_test), callbacks=callbacks,
                        verbose=not args.quiet)
    result = model.evaluate(x_test, y_test)
    accuracy = result["accuracy"]
    if not args.no_save:
        model.save(args.checkpoint)
    loss = history[-1]["loss"] if len(history) else float("nan")
    done = model.step // steps_per_epoch
    plot = None
    if args.plot is not None and chief:
        if len(history):
            history.plot(args.plot, title=f"geon.examples.{args._name}")
            plot = args.plot
        else:
            print(f"no epoch ran: {args.plot} not written", file=sys.stderr)
    elapsed = time.perf_counter() - start
    right = int(round(accuracy * len(x_test)))
    if chief:
        print(f"test accuracy {accuracy:.4f} ({right}/{len(x_test)}) after "
              f"{plural(done, 'epoch')}; loss {loss:.4f}, test loss {result['loss']:.4f}; "
              f"{elapsed:.2f}s"
              + ("" if args.no_save else f"; checkpoint {args.checkpoint}")
              + ("" if plot is None else f"; curves {plot}")
              + (f"; {ranks} ranks, global batch {ranks * hp['batch_size']}"
                 if ranks > 1 else ""), flush=True)
    return {"test_accuracy": accuracy, "loss": loss, "test_loss": result["loss"],
            "elapsed": elapsed, "epochs": done, "epochs_run": len(history),
            "n_train": len(x_train), "n_test": len(x_test), "ranks": ranks,
            "checkpoint": None if args.no_save else os.path.abspath(args.checkpoint),
            "plot": plot, "hyperparameters": hp, "history": history}


def cli(main: Callable[[], Any]) -> None:
    """Run ``main()`` as a program: a checkpoint or transformer error prints one line
    and exits with status 1; Ctrl-C exits with 130 (after the checkpoint is saved)."""
    try:
        main()
    except (be.CheckpointError, be.UnknownTransformerError) as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        print("\ninterrupted (the checkpoint, unless --no-save, holds the run so far: "
              "continue it with --resume)", file=sys.stderr)
        raise SystemExit(130) from None
