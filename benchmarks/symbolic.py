"""One computation for every batch size: the MLP training step of ``benchmarks.mlp``
(784-512-512-10, float32) built over a symbolic batch ``N`` against a computation
built for each batch size, timed interleaved at a few batch sizes; and what the first
call at a new batch size costs (its memory plan, arenas and views), and the bytes its
memory plan holds against the fixed computation's. Then the same for a sequence
model: the training step of an LSTM layer (hidden 256, batch 32, 32 features; one
``be.scan``) over a symbolic sequence axis ``T`` against one computation per length.

    python -m benchmarks.symbolic [--batches 1 32 1024] [--lengths 8 256] [--repeats 15]
                                  [--default]

A measurement, not a test. By default both sides use ``compiled=False`` (the NumPy
code): symbolic values are fused only under size hints. ``--default`` runs both in the
default mode (the compiled path where it pays) with ``sample_axis="first"``, the
symbolic side with the size hints ``N=256``, ``T=64`` (fusing and compiling its groups
of symbolic rows, doc/symbolic_axes.rst).
"""

import argparse
import time

import geon as be
from benchmarks import mlp
from benchmarks.common import interleaved_stats, pair, ratio, table, us


#: the transformers' options: (fixed side, symbolic side) (see --default)
OPTIONS = ({"compiled": False}, {"compiled": False})


def _transformer(axis):
    symbolic = axis.is_symbolic
    return be.NumPyTransformer(**OPTIONS[symbolic])


def step(batch_axis, params):
    """The training step over ``batch_axis`` (a fixed or a symbolic axis)."""
    axes = [be.Axis(n, f"L{i}") for i, n in enumerate(mlp.SIZES)]
    x = be.placeholder([axes[0], batch_axis], name="x")
    t = be.placeholder([axes[-1], batch_axis], name="t")
    h, variables = mlp.layers(x, axes, params)
    loss = be.mean(be.cross_entropy_multi(be.softmax(h), t), out_axes=())
    updates = [be.SetItem(v, v - mlp.LR * be.deriv(loss, v)) for v in variables]
    return _transformer(batch_axis).computation([loss] + updates, x, t)


def lstm_step(seq_axis):
    """The LSTM training step (loss, gradients, SGD) over ``seq_axis`` (fixed or
    symbolic); the same initial weights whatever the axis."""
    from benchmarks.scan import training_graph
    results, x, t, _ = training_graph(seq_axis, 256, 32, unroll=False)
    return _transformer(seq_axis).computation(results, x, t)


def compare(symbolic, make_fixed, sizes, data, repeats, inner, title, what):
    """One table row per size: ``symbolic`` (one computation) against ``make_fixed(n)``
    (one per size) on ``data(n)``, interleaved; the first call at the size (its memory
    plan) and the planned bytes, symbolic / fixed."""
    rows = []
    for n in sizes:
        args = data(n)
        t0 = time.perf_counter()
        symbolic(*args)  # a new binding: plans its memory
        first = time.perf_counter() - t0
        fixed = make_fixed(n)
        fixed(*args)
        times = interleaved_stats({"fixed": lambda: fixed(*args),
                                   "symbolic": lambda: symbolic(*args)},
                                  repeats=repeats, inner=inner(n))
        planned = sum(symbolic._plans[(n,)].sizes), sum(fixed.plan.sizes)
        rows.append([n, pair(us, times["fixed"]), pair(us, times["symbolic"]),
                     ratio(times["symbolic"], times["fixed"]), us(first),
                     f"{planned[0] / planned[1]:.3f} ({planned[1]:,} bytes fixed)"])
    table(title, [what, "fixed", "symbolic", "symbolic / fixed", f"first call at the {what}",
                  "planned memory, symbolic / fixed"], rows)
    print(f"\nsymbolic: {symbolic.transformations} transformation, {symbolic.plans} "
          f"plans")


def lstm_rows(lengths, repeats):
    import numpy as np
    rng = np.random.default_rng(1)

    def data(n):
        return (rng.standard_normal((32, n, 32)).astype(np.float32),
                0.1 * rng.standard_normal((32, n, 256)).astype(np.float32))
    compare(lstm_step(be.symbolic_axis("T", recurrent=True)),
            lambda n: lstm_step(be.Axis(n, "T", recurrent=True)), lengths, data, repeats,
            lambda n: max(1, 32 // n),
            "LSTM training step (hidden 256, batch 32), one computation over a symbolic "
            "sequence axis against one per length (median (minimum))", "length")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32, 1024])
    ap.add_argument("--lengths", type=int, nargs="*", default=[8, 256],
                    help="sequence lengths of the LSTM step (none: skip it)")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--default", action="store_true",
                    help="the default mode (compiled where it pays), symbolic with size "
                         "hints")
    args = ap.parse_args(argv)
    global OPTIONS
    if args.default:
        OPTIONS = ({"sample_axis": "first"},
                   {"sample_axis": "first", "size_hints": {"N": 256, "T": 64}})
    params = mlp.init_params()
    symbolic = step(be.symbolic_axis("N", batch=True), params)
    symbolic(*mlp.data(2))  # allocates and initializes (not a cost of a new size)
    compare(symbolic, lambda n: step(be.Axis(n, "N", batch=True), params), args.batches,
            mlp.data, args.repeats, lambda n: max(1, 256 // n),
            "MLP training step, one symbolic computation against one per batch size "
            "(median (minimum))", "batch")
    if args.lengths:
        lstm_rows(args.lengths, max(3, args.repeats // 3))


if __name__ == "__main__":
    main()
