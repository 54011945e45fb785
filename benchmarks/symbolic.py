"""One computation for every batch size: the MLP training step of ``benchmarks.mlp``
(784-512-512-10, float32) built over a symbolic batch ``N`` against a computation
built for each batch size, timed interleaved at a few batch sizes; and what the first
call at a new batch size costs (its memory plan, arenas and views), and the bytes its
memory plan holds against the fixed computation's.

    python -m benchmarks.symbolic [--batches 1 32 1024] [--repeats 15]

A measurement, not a test. Symbolic computations run without fusion and the compiled
path so far (doc/symbolic_axes.rst): both sides here use ``compiled=False``, and at
batches where the fixed computation fuses the difference includes that.
"""

import argparse
import time

import geon as be
from benchmarks import mlp
from benchmarks.common import interleaved_stats, pair, ratio, table, us


def step(batch_axis, params):
    """The training step over ``batch_axis`` (a fixed or a symbolic axis)."""
    axes = [be.Axis(n, f"L{i}") for i, n in enumerate(mlp.SIZES)]
    x = be.placeholder([axes[0], batch_axis], name="x")
    t = be.placeholder([axes[-1], batch_axis], name="t")
    h, variables = mlp.layers(x, axes, params)
    loss = be.mean(be.cross_entropy_multi(be.softmax(h), t), out_axes=())
    updates = [be.SetItem(v, v - mlp.LR * be.deriv(loss, v)) for v in variables]
    return be.NumPyTransformer(compiled=False).computation([loss] + updates, x, t)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32, 1024])
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args(argv)
    params = mlp.init_params()
    symbolic = step(be.symbolic_axis("N", batch=True), params)
    symbolic(*mlp.data(2))  # allocates and initializes (not a cost of a new size)
    rows = []
    for n in args.batches:
        x, t = mlp.data(n)
        t0 = time.perf_counter()
        symbolic(x, t)  # a new binding: plans its memory
        first = time.perf_counter() - t0
        fixed = step(be.Axis(n, "N", batch=True), params)
        times = interleaved_stats({"fixed": lambda: fixed(x, t),
                                   "symbolic": lambda: symbolic(x, t)},
                                  repeats=args.repeats, inner=max(1, 256 // n))
        # the bytes of the memory plans (the arenas of the intermediate values)
        planned = sum(symbolic._plans[(n,)].sizes), sum(fixed.plan.sizes)
        rows.append([n, pair(us, times["fixed"]), pair(us, times["symbolic"]),
                     ratio(times["symbolic"], times["fixed"]), us(first),
                     f"{planned[0] / planned[1]:.3f} ({planned[1]:,} bytes fixed)"])
    table("MLP training step, one symbolic computation against one per batch size "
          "(median (minimum))",
          ["batch", "fixed", "symbolic", "symbolic / fixed", "first call at the size",
           "planned memory, symbolic / fixed"], rows)
    print(f"\nsymbolic: {symbolic.transformations} transformation, {symbolic.plans} "
          f"plans")


if __name__ == "__main__":
    main()
