"""An LSTM layer as one :func:`geon.scan` against the same layer unrolled
(``nn.LSTM(..., unroll=True)``), in one process, side by side:

- build + transformation: building the layer's graph (forward, the loss and the
  derivatives of the weights) and ``computation(...)`` on a fresh NumPy transformer,
  at 10, 100 and 1,000 steps (the unrolled layer only up to ``--max-unrolled`` steps,
  default 100: its graph grows with the sequence), with the ratio to 10 steps;
- a training step (forward, backward, plain SGD on the weights) at 100 steps,
  interleaved medians, scanned / unrolled.

    python -m benchmarks.scan [--quick] [--hidden 256] [--batch 32]

A measurement, not a test: on a shared machine the figures move from run to run.
"""

import argparse
import time

import numpy as np

import geon as be
from benchmarks.common import interleaved_stats, ms, pair, ratio, table
from benchmarks.run import machine
from geon.frontends import neon as nn

FEATURES = 32
LR = 0.01


def training_graph(steps, hidden, batch, unroll, seed=0):
    """``(results, x, t, layer)``: the loss and one SGD update per weight of an LSTM
    of ``hidden`` units over ``steps`` steps, batch ``batch``, float32."""
    T = be.Axis(steps, name="T", recurrent=True)
    F, N = be.Axis(FEATURES, name="F"), be.Axis(batch, name="N", batch=True)
    init = nn.GlorotUniform(seed=seed)
    H = be.Axis(hidden, name="H")
    layer = nn.LSTM(H, init=init, recurrent_init=init, unroll=unroll,
                    name="lstm")  # the same name: the same initial weights
    x = be.placeholder([N, T, F], name="x")
    t = be.placeholder([N, T, H], name="t")
    y = layer(x)
    loss = be.sum(be.square(y - t), out_axes=()) / batch
    weights = layer.variables
    grads = be.deriv(loss, weights)
    updates = [be.SetItem(v, v - LR * g) for v, g in zip(weights, grads)]
    return [loss] + updates, x, t, layer


def build_time(steps, hidden, batch, unroll):
    """Seconds to build the training graph and the computation (no call)."""
    t0 = time.perf_counter()
    results, x, t, _ = training_graph(steps, hidden, batch, unroll)
    be.NumPyTransformer().computation(results, x, t)
    return time.perf_counter() - t0


def bench_build(hidden, batch, lengths, max_unrolled, repeats):
    times = {}
    for _ in range(repeats):  # round-robin, so that load that comes and goes hits all
        for n in lengths:
            for unroll in (False, True):
                if unroll and n > max_unrolled:
                    continue
                t = build_time(n, hidden, batch, unroll)
                times[n, unroll] = min(t, times.get((n, unroll), t))
    rows = []
    for n in lengths:
        row = [n]
        for unroll in (False, True):
            v = times.get((n, unroll))
            row += ["-" if v is None else f"{v:.3f} s",
                    "-" if v is None else f"{v / times[lengths[0], unroll]:.2f}x"]
        u = times.get((n, True))
        row.append("-" if u is None else f"{times[n, False] / u:.2f}")
        rows.append(row)
    return table(f"LSTM (hidden {hidden}, batch {batch}): build + computation(...), "
                 f"fastest of {repeats}",
                 ["steps", "scanned", "scanned / 10 steps", "unrolled",
                  "unrolled / 10 steps", "scanned / unrolled"], rows)


def bench_step(hidden, batch, steps, repeats):
    rng = np.random.default_rng(1)
    X = rng.standard_normal((batch, steps, FEATURES)).astype(np.float32)
    Y = rng.standard_normal((batch, steps, hidden)).astype(np.float32) * 0.1
    fns, losses = {}, {}
    for unroll in (False, True):
        results, x, t, _ = training_graph(steps, hidden, batch, unroll)
        comp = be.NumPyTransformer().computation(results, x, t)
        losses[unroll] = float(comp(X, Y)[0])
        fns["unrolled" if unroll else "scanned"] = lambda c=comp: c(X, Y)
    # Same weights at the first call: the first losses agree.
    np.testing.assert_allclose(losses[False], losses[True], rtol=1e-4)
    stats = interleaved_stats(fns, repeats=repeats, warmup=2)
    return table(f"LSTM (hidden {hidden}, batch {batch}) training step at {steps} steps: "
                 f"median (minimum) of interleaved steps",
                 ["scanned", "unrolled", "scanned / unrolled"],
                 [[pair(ms, stats["scanned"]), pair(ms, stats["unrolled"]),
                   ratio(stats["scanned"], stats["unrolled"])]])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats, shorter runs")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--max-unrolled", type=int, default=100,
                    help="the longest unrolled sequence built (default 100)")
    args = ap.parse_args(argv)
    print(f"Machine: {machine()}")
    print("Command: python -m benchmarks.scan" + (" --quick" if args.quick else "")
          + (f" --hidden {args.hidden}" if args.hidden != 256 else "")
          + (f" --batch {args.batch}" if args.batch != 32 else "")
          + (f" --max-unrolled {args.max_unrolled}" if args.max_unrolled != 100 else ""))
    bench_build(args.hidden, args.batch, (10, 100, 1000), args.max_unrolled,
                1 if args.quick else 5)
    bench_step(args.hidden, args.batch, 100, 3 if args.quick else 15)


if __name__ == "__main__":
    main()
