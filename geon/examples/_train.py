"""What the digits_cnn and digits_rnn examples share: train a model on the bundled
digits, evaluate it on the held-out 20%, print and return the result; a command line
that exits with 130 on Ctrl-C."""

import argparse
import sys
import time

from geon.frontends import neon as nn


def parser(name, description, epochs, lr):
    """The options both examples take (``--epochs``, ``--batch-size``, ``--lr``,
    ``--seed``, ``--quiet``, ``--transformer``, ``--data-parallel``) with their
    defaults; the caller adds its own."""
    p = argparse.ArgumentParser(prog=f"python -m geon.examples.{name}",
                                description=description)
    p.add_argument("--epochs", type=int, default=epochs)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=lr)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--transformer", default="numpy")
    p.add_argument("--data-parallel", action="store_true",
                   help="train on every rank of an MPI job (mpirun -n N python -m ...): "
                        "--batch-size is per rank, so a step trains on N x batch-size "
                        "images; rank 0 prints; without mpirun, one rank")
    return p


def train_and_report(build_model, args, shape):
    """Fit the model ``build_model(args)`` on the training digits, each image reshaped
    to ``shape`` (after the sample axis), for ``args.epochs`` epochs of
    ``args.batch_size``; evaluate it on the test digits. Returns ``{test_accuracy,
    test_loss, elapsed, history}``; ``elapsed`` counts building, training and testing."""
    start = time.perf_counter()
    x_train, y_train, x_test, y_test = nn.load_digits()
    model = build_model(args)

    def as_model_input(x):
        return x.reshape((len(x),) + tuple(shape))

    # (a data-parallel model's fit gives each rank its block of every global batch)
    history = model.fit(nn.ArrayIterator(as_model_input(x_train), y_train, args.batch_size,
                                         seed=args.seed),
                        epochs=args.epochs, verbose=not args.quiet)
    result = model.evaluate(as_model_input(x_test), y_test)
    elapsed = time.perf_counter() - start
    ranks = getattr(model, "ranks", 1)
    if getattr(model, "rank", 0) == 0:  # data-parallel: rank 0 alone reports
        print(f"test accuracy {result['accuracy']:.4f} after {args.epochs} epochs; "
              f"test loss {result['loss']:.4f}; {elapsed:.1f}s"
              + (f"; {ranks} ranks, global batch {ranks * args.batch_size}"
                 if ranks > 1 else ""), flush=True)
    return {"test_accuracy": result["accuracy"], "test_loss": result["loss"],
            "elapsed": elapsed, "history": history}


def cli(main):
    """Run ``main()``; Ctrl-C ends it with exit status 130."""
    try:
        main()
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        raise SystemExit(130) from None
