"""An LSTM layer as one :func:`geon.scan` against the same layer unrolled
(``nn.LSTM(..., unroll=True)``), in one process, side by side:

- build + transformation: building the layer's graph (forward, the loss and the
  derivatives of the weights) and ``computation(...)`` on a fresh NumPy transformer,
  at 10, 100 and 1,000 steps (the unrolled layer only up to ``--max-unrolled`` steps,
  default 100: its graph grows with the sequence), with the ratio to 10 steps;
- a training step (forward, backward, plain SGD on the weights) at 100 steps,
  interleaved medians, scanned (under ``remat="none"``, the layer's default, and
  ``remat="step"``) / unrolled;
- with ``--memory``: the peak memory of a training step of an LSTM-like cell written
  with ``be.scan`` over 1,000 steps (``--memory-steps``), under the reverse-mode
  policies ``remat="none"``, ``"step"`` and ``"checkpoints"``: the peak of the memory
  ``tracemalloc`` traces (NumPy's arrays included) during the first call, in a fresh
  process per policy, after the computation was built and the inputs made.

    python -m benchmarks.scan [--quick] [--hidden 256] [--batch 32] [--memory]

A measurement, not a test: on a shared machine the figures move from run to run.
"""

import argparse
import json
import subprocess
import sys
import time
import tracemalloc

import numpy as np

import geon as be
from benchmarks.common import interleaved_stats, ms, pair, ratio, table
from benchmarks.run import machine
from geon.frontends import neon as nn

FEATURES = 32
LR = 0.01


def training_graph(steps, hidden, batch, unroll, seed=0, remat="none"):
    """``(results, x, t, layer)``: the loss and one SGD update per weight of an LSTM
    of ``hidden`` units over ``steps`` steps (or the axis ``steps``: a symbolic
    one), batch ``batch``, float32 (scanned under
    the policy ``remat`` unless ``unroll``)."""
    T = steps if isinstance(steps, be.Axis) else be.Axis(steps, name="T", recurrent=True)
    F, N = be.Axis(FEATURES, name="F"), be.Axis(batch, name="N", batch=True)
    init = nn.GlorotUniform(seed=seed)
    H = be.Axis(hidden, name="H")
    layer = nn.LSTM(H, init=init, recurrent_init=init, unroll=unroll, remat=remat,
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
    for name, unroll, remat in (("none", False, "none"), ("step", False, "step"),
                                ("unrolled", True, "none")):
        results, x, t, _ = training_graph(steps, hidden, batch, unroll, remat=remat)
        comp = be.NumPyTransformer().computation(results, x, t)
        losses[name] = float(comp(X, Y)[0])
        fns[name] = lambda c=comp: c(X, Y)
    # Same weights at the first call: the first losses agree.
    for name in ("step", "unrolled"):
        np.testing.assert_allclose(losses["none"], losses[name], rtol=1e-4)
    stats = interleaved_stats(fns, repeats=repeats, warmup=2)
    return table(f"LSTM (hidden {hidden}, batch {batch}) training step at {steps} steps: "
                 f"median (minimum) of interleaved steps; scanned under remat='none' "
                 f"(the layer's default) and remat='step'",
                 ["scanned, none", "scanned, step", "unrolled", "none / unrolled",
                  "step / unrolled", "none / step"],
                 [[pair(ms, stats["none"]), pair(ms, stats["step"]),
                   pair(ms, stats["unrolled"]), ratio(stats["none"], stats["unrolled"]),
                   ratio(stats["step"], stats["unrolled"]),
                   ratio(stats["none"], stats["step"])]])


def remat_graph(steps, hidden, batch, remat, seed=0):
    """``(results, x, t)``: an LSTM-like cell scanned over ``steps`` steps (float32),
    the loss of its final hidden state against ``t``, and one SGD update per weight."""
    T = be.Axis(steps, name="T")
    F, N = be.Axis(FEATURES, name="F"), be.Axis(batch, name="N")
    H, G = be.Axis(hidden, name="H"), be.Axis(4 * hidden, name="G")
    rng = np.random.default_rng(seed)
    W = be.Variable(axes=[G, F], initial_value=0.1 * rng.standard_normal((4 * hidden,
                    FEATURES)), name="W")
    R = be.Variable(axes=[G, H], initial_value=rng.standard_normal((4 * hidden, hidden))
                    / np.sqrt(hidden), name="R")
    x = be.placeholder([T, F, N], name="x")
    t = be.placeholder([H, N], name="t")

    def cell(carry, x_t):
        h, c = carry
        z = be.dot(W, x_t) + be.dot(R, h)                    # (G, N)
        i, f, o, g = (be.slice_along_axis(z, G, slice(k * hidden, (k + 1) * hidden),
                                          new_axis=H) for k in range(4))
        c2 = be.sigmoid(f) * c + be.sigmoid(i) * be.tanh(g)
        return (be.sigmoid(o) * be.tanh(c2), c2), None
    zeros = be.constant(0.0, axes=[H, N])
    (hT, _), _ = be.scan(cell, (zeros, zeros), x, T, remat=remat)
    loss = be.sum(be.square(hT - t), out_axes=()) / batch
    grads = be.deriv(loss, [W, R])
    return [loss] + [be.SetItem(v, v - LR * g) for v, g in zip([W, R], grads)], x, t


def memory_peak(steps, hidden, batch, remat):
    """``(peak bytes, loss)``: the peak traced memory of the first training step
    (:func:`remat_graph`), measured in this process."""
    results, x, t = remat_graph(steps, hidden, batch, remat)
    comp = be.NumPyTransformer().computation(results, x, t)
    rng = np.random.default_rng(1)
    X = rng.standard_normal((steps, FEATURES, batch)).astype(np.float32)
    Y = 0.1 * rng.standard_normal((hidden, batch)).astype(np.float32)
    tracemalloc.start()
    loss = float(comp(X, Y)[0])
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak, loss


def bench_memory(hidden, batch, steps):
    peaks, losses = {}, {}
    for remat in ("none", "step", "checkpoints"):
        code = (f"import json, benchmarks.scan as b; print(json.dumps("
                f"b.memory_peak({steps}, {hidden}, {batch}, {remat!r})))")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True).stdout
        peaks[remat], losses[remat] = json.loads(out.strip().splitlines()[-1])
    for remat in ("none", "checkpoints"):
        np.testing.assert_allclose(losses["step"], losses[remat], rtol=1e-5)
    mib = 2.0 ** 20
    return table(f"LSTM-like cell (hidden {hidden}, batch {batch}) training step at "
                 f"{steps} steps: peak traced memory (tracemalloc) of the first call, "
                 f"fresh process each",
                 ["none", "step", "checkpoints", "none / step", "checkpoints / step",
                  "checkpoints / none"],
                 [[f"{peaks['none'] / mib:.1f} MiB", f"{peaks['step'] / mib:.1f} MiB",
                   f"{peaks['checkpoints'] / mib:.1f} MiB",
                   f"{peaks['none'] / peaks['step']:.3f}",
                   f"{peaks['checkpoints'] / peaks['step']:.3f}",
                   f"{peaks['checkpoints'] / peaks['none']:.3f}"]])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats, shorter runs")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--max-unrolled", type=int, default=100,
                    help="the longest unrolled sequence built (default 100)")
    ap.add_argument("--memory", action="store_true",
                    help="only the peak memory of remat='none', 'step' and 'checkpoints'")
    ap.add_argument("--memory-steps", type=int, default=1000)
    args = ap.parse_args(argv)
    print(f"Machine: {machine()}")
    print("Command: python -m benchmarks.scan" + (" --quick" if args.quick else "")
          + (f" --hidden {args.hidden}" if args.hidden != 256 else "")
          + (f" --batch {args.batch}" if args.batch != 32 else "")
          + (f" --max-unrolled {args.max_unrolled}" if args.max_unrolled != 100 else "")
          + (" --memory" if args.memory else "")
          + (f" --memory-steps {args.memory_steps}" if args.memory_steps != 1000 else ""))
    if args.memory:
        bench_memory(args.hidden, args.batch, args.memory_steps)
        return
    bench_build(args.hidden, args.batch, (10, 100, 1000), args.max_unrolled,
                1 if args.quick else 5)
    bench_step(args.hidden, args.batch, 100, 3 if args.quick else 15)


if __name__ == "__main__":
    main()
