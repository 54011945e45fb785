"""The MLP training step in two of the NumPy transformer's modes, in paired steps: which
is faster, and by how much, on a machine too noisy for separate medians.

    python -m benchmarks.modes --batch 1024 numpy auto [--pairs 300]

Modes: ``numpy`` (``compiled=False``), ``auto`` (the default) and ``all``
(``compiled=True``). Each pair runs one step of each (the order alternating, with the
step's GEMMs alone between them); the difference of a pair is taken within a few
milliseconds, so load that comes and goes shifts both of its steps alike. Prints the
medians, the median difference (second mode minus first), the share of pairs in which
the second was faster, and the minimums. A measurement, not a test.
"""

import argparse
import time

import numpy as np

from benchmarks import mlp

MODES = {"numpy": False, "auto": "auto", "all": True}


def paired(batch, first, second, pairs):
    """Seconds per step: arrays for ``first``, ``second`` and the GEMMs alone."""
    import geon as be
    params = mlp.init_params()
    x, t = mlp.data(batch)
    steps = [mlp.geon_step(batch, params, be.NumPyTransformer(compiled=MODES[m]))[0]
             for m in (first, second)]
    gemms = mlp.gemms_only(batch)
    for f in steps:  # allocate, initialize, warm up
        f(x, t)
        f(x, t)
    times = ([], [], [])
    runs = list(zip(steps + [gemms], times))
    for i in range(pairs):
        for f, out in (runs if i % 2 else runs[::-1]):
            t0 = time.perf_counter()
            f(x, t)
            out.append(time.perf_counter() - t0)
    return [np.array(v) for v in times]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--pairs", type=int, default=300)
    ap.add_argument("first", choices=sorted(MODES))
    ap.add_argument("second", choices=sorted(MODES))
    args = ap.parse_args(argv)
    a, b, g = paired(args.batch, args.first, args.second, args.pairs)
    d = b - a
    ms = lambda v: f"{v * 1e3:.3f} ms"  # noqa: E731
    print(f"MLP step at batch {args.batch}, {args.pairs} pairs: median {args.first} "
          f"{ms(np.median(a))}, {args.second} {ms(np.median(b))}, GEMMs alone "
          f"{ms(np.median(g))}; median difference {args.second} - {args.first} "
          f"{np.median(d) * 1e3:+.3f} ms, {args.second} faster in "
          f"{np.mean(d < 0) * 100:.0f}% of pairs; minimums {ms(a.min())}, "
          f"{ms(b.min())}, {ms(g.min())}")


if __name__ == "__main__":
    main()
