"""What proving every memory plan costs: transformation time with the plan verifier
(:func:`geon.transformers.memory.verify_plan`, on by default) against without it.

    python -m benchmarks.verify [--repeats 15] [--chain 5000] [--batch 128]

Two graphs, each built, transformed and called once per sample (as table 4 of
``benchmarks.run`` times them): the chain of that table (``--chain`` ops, tanh and
multiply alternating, on 16 float32) and the MLP training step of ``benchmarks.mlp``
(784-512-512-10 with its gradients and SGD updates, at ``--batch``; the compiled
kernels come from the warm cache after the first sample). Samples alternate between
verification on and off, so that load which comes and goes hits both alike. Prints a
Markdown table: medians with minimums in parentheses, the ratio on / off, and the time
spent inside ``verify_plan`` itself (counted in the samples with it on; in parentheses,
the median share of their time, which load on the machine disturbs less than the
ratio). A measurement, not a test.
"""

import argparse
import statistics
import time

import geon as be
from benchmarks import mlp
from benchmarks.common import table
from benchmarks.run import transform_time
from geon.transformers import memory


def mlp_time(batch):
    """Seconds to build the MLP training step, transform it and call it once."""
    x, t = mlp.data(batch)
    t0 = time.perf_counter()
    step, _ = mlp.geon_step(batch, transformer=be.NumPyTransformer())
    step(x, t)
    return time.perf_counter() - t0


class _Timed:
    """``memory.verify_plan`` with the seconds spent in it added up."""

    def __init__(self):
        self.seconds = 0.0
        self.verify = memory.verify_plan

    def __call__(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return self.verify(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - t0


def measure(cases, repeats):
    """``{case: {"on": [s], "off": [s], "verify": [s]}}``: per sample, the
    transformation time with verification on and off, and the part spent verifying."""
    timed = _Timed()
    out = {name: {"on": [], "off": [], "verify": []} for name in cases}
    saved = memory.VERIFY
    # (the NumPy and GPU transformers call it as memory.verify_plan)
    memory.verify_plan = timed
    try:
        for name, fn in cases.items():  # warm up: imports, the kernel cache
            for flag in (True, False):
                memory.VERIFY = flag
                fn()
        for k in range(repeats):
            for name, fn in cases.items():
                for flag in ((True, False) if k % 2 else (False, True)):
                    memory.VERIFY = flag
                    timed.seconds = 0.0
                    s = fn()
                    out[name]["on" if flag else "off"].append(s)
                    if flag:
                        out[name]["verify"].append(timed.seconds)
    finally:
        memory.verify_plan = timed.verify
        memory.VERIFY = saved
    return out


def report(out):
    def pair(v):
        return f"{statistics.median(v):.4f} s ({min(v):.4f} s)"

    rows = []
    for name, r in out.items():
        on, off, ver = r["on"], r["off"], r["verify"]
        share = statistics.median(v / t for v, t in zip(ver, on))
        rows.append([name, pair(off), pair(on),
                     f"{statistics.median(on) / statistics.median(off):.3f} "
                     f"({min(on) / min(off):.3f})",
                     f"{statistics.median(ver) * 1e3:.2f} ms ({100 * share:.1f}%)"])
    return table("Transformation time with and without plan verification: median (min) "
                 f"of {len(next(iter(out.values()))['on'])}",
                 ["graph", "verification off", "verification on", "on / off",
                  "inside verify_plan (share of its sample)"], rows)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--chain", type=int, default=5000, help="ops in the chain")
    ap.add_argument("--batch", type=int, default=128, help="batch of the MLP step")
    args = ap.parse_args(argv)
    cases = {f"{args.chain}-op chain": lambda: transform_time(args.chain),
             f"MLP training step, batch {args.batch}": lambda: mlp_time(args.batch)}
    return report(measure(cases, args.repeats))


if __name__ == "__main__":
    main()
