"""The compiled path of two checkouts of geon, side by side: the MLP step (784-512-512-10,
float32, batch 128, the default ``compiled="auto"``), the 20-op chain on 4M float32 and
the 1000-op chain on 1,000 float32 (both ``compiled=True``), and a 5-op compiled group
on 1,000 float32 (one C call: the per-call cost).

    git worktree add /tmp/geon-old <commit>
    python -m benchmarks.revisions /tmp/geon-old . [--rounds 3]

Each round runs one process per checkout, alternating (the checkout's own ``geon`` first
on ``sys.path``), and each process times its computations interleaved; the table gives
the median over rounds of each process's median, and the ratio second / first. Run it
on an otherwise idle machine.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

from benchmarks.common import table, us

_CHILD = r"""
import json, statistics, sys, time
import numpy as np
import geon as be
from benchmarks.mlp import data, geon_step
from benchmarks.run import chain_geon
from benchmarks.compiled import small_chain

repeats = int(sys.argv[1])
fns = {}
step, _ = geon_step(128)
feeds = data(128)
fns["MLP step, batch 128"] = (lambda: step(*feeds), 5)
n = 4 * 1024 * 1024
x = be.placeholder([be.Axis(n, "E")])
xs = np.random.default_rng(0).standard_normal(n).astype(np.float32)
chain = be.NumPyTransformer(compiled=True).computation(chain_geon(x), x)
fns["20-op chain, 4M float32"] = (lambda: chain(xs), 1)
y = be.placeholder([be.Axis(1000, "A")])
ys = np.linspace(-2, 2, 1000, dtype=np.float32)
small = be.NumPyTransformer(compiled=True).computation(small_chain(y), y)
fns["1000-op chain, 1,000 float32"] = (lambda: small(ys), 20)
z = be.placeholder([be.Axis(1000, "B")])
group = be.NumPyTransformer(compiled=True).computation(be.tanh(z * 2.0 + 1.0) * z - z, z)
fns["5-op group, 1,000 float32"] = (lambda: group(ys), 200)
samples = {k: [] for k in fns}
for f, inner in fns.values():
    f(); f()
for _ in range(repeats):
    for k, (f, inner) in fns.items():
        t0 = time.perf_counter()
        for _ in range(inner):
            f()
        samples[k].append((time.perf_counter() - t0) / inner)
print(json.dumps({"geon": be.__file__,
                  "times": {k: statistics.median(v) for k, v in samples.items()}}))
"""


def run_child(repo, repeats):
    env = dict(os.environ)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join([os.path.abspath(repo), here])
    out = subprocess.run([sys.executable, "-c", _CHILD, str(repeats)], env=env,
                         capture_output=True, text=True, check=True,
                         cwd=os.path.abspath(repo))
    got = json.loads(out.stdout.strip().splitlines()[-1])
    if not os.path.abspath(got["geon"]).startswith(os.path.abspath(repo) + os.sep):
        raise SystemExit(f"the process for {repo} imported {got['geon']}")
    return got["times"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("first", help="the first checkout (e.g. a worktree of the old commit)")
    ap.add_argument("second", help="the second checkout")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args(argv)
    results = {args.first: [], args.second: []}
    for _ in range(args.rounds):
        for repo in (args.first, args.second):
            results[repo].append(run_child(repo, args.repeats))
    rows = []
    for name in results[args.first][0]:
        a = statistics.median(r[name] for r in results[args.first])
        b = statistics.median(r[name] for r in results[args.second])
        rows.append([name, us(a), us(b), f"{b / a:.3f}"])
    table(f"compiled path, {args.rounds} rounds of alternating processes "
          "(median of per-process medians)",
          ["computation", args.first, args.second, "second / first"], rows)


if __name__ == "__main__":
    main()
