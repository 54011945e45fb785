"""The native runtime (native/, libgeon_native) against the NumPy transformer (issue 36):
``python -m benchmarks.native [--quick]`` from the repository root.

Two measurements, each timed round-robin (medians and minimums, one process):

- call overhead: ``x + 1`` on one float32 element, the native executable's ``run``
  against a NumPy transformer computation's call (and the ``backend("numpy")``
  executable of the same plan);
- a digits-MLP-like training step, 64 -> 512 -> 10, ReLU, softmax cross-entropy, SGD
  on every weight and bias through ``SetItem``, float32, at batch 128 and 1024: the
  native executable of the plan against the ``backend("numpy")`` executable of the same
  plan and the NumPy transformer's computation of the graph itself (each sample after
  a ``--gap`` pause and two untimed calls, see
  :func:`benchmarks.common.interleaved_stats`).

The runtime is built (with scipy-openblas32 when it is installed) into a temporary
folder first. These are measurements, not tests; the targets of issue 36 are native /
NumPy computation <= 1.0 on ``x + 1`` and <= 1.1 on the step.
"""

import argparse
import os
import shutil
import tempfile

import numpy as np

from benchmarks.common import interleaved_stats, pair, ratio, table, us
from benchmarks.run import machine

SIZES = (64, 512, 10)
LR = 0.05


def add_one():
    """(plan, NumPy computation, feed) of ``x + 1`` on one float32 element."""
    import geon as be
    from geon.transformers import backends as bk
    X = be.Axis(1, "NbX")
    x = be.placeholder([X], dtype=np.float32, name="x")
    y = x + 1.0
    comp = be.NumPyTransformer().computation(y, x)
    return bk.plan([y], x), comp, np.ones(1, np.float32)


def mlp_step(batch, seed=0):
    """(plan, NumPy computation, feeds) of the training step at ``batch``: returns the
    loss; the Variables are updated in place."""
    import geon as be
    from geon.transformers import backends as bk

    def graph():
        N = be.Axis(batch, "N", batch=True)
        axes = [be.Axis(n, f"NbL{i}") for i, n in enumerate(SIZES)]
        x = be.placeholder([axes[0], N], dtype=np.float32, name="x")
        t = be.placeholder([axes[-1], N], dtype=np.float32, name="t")
        rng = np.random.default_rng(seed)
        h, variables = x, []
        for i in range(len(SIZES) - 1):
            w0 = rng.standard_normal((SIZES[i + 1], SIZES[i])) * np.sqrt(2.0 / SIZES[i])
            W = be.Variable(axes=[axes[i + 1], axes[i]], initial_value=w0.astype(np.float32),
                            dtype=np.float32, name=f"W{i}")
            b = be.Variable(axes=[axes[i + 1]], initial_value=0.0, dtype=np.float32,
                            name=f"b{i}")
            variables += [W, b]
            h = be.dot(W, h) + b
            if i < len(SIZES) - 2:
                h = be.maximum(h, 0.0)
        loss = be.sum(be.cross_entropy_multi(be.softmax(h), t), out_axes=()) / batch
        ups = [be.SetItem(v, v - LR * be.deriv(loss, v)) for v in variables]
        return [loss] + ups, x, t

    results, x, t = graph()
    doc = bk.plan(results, x, t)
    results, x, t = graph()
    comp = be.NumPyTransformer().computation(results, x, t)
    rng = np.random.default_rng(seed + 1)
    xv = rng.standard_normal((SIZES[0], batch)).astype(np.float32)
    tv = np.eye(SIZES[-1], dtype=np.float32)[rng.integers(0, SIZES[-1], batch)].T.copy()
    return doc, comp, (xv, tv)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats")
    ap.add_argument("--batches", type=int, nargs="+", default=[128, 1024])
    ap.add_argument("--gap", type=float, default=0.25,
                    help="seconds of sleep before each step sample (then 2 untimed calls)")
    args = ap.parse_args(argv)
    from geon.transformers import backends as bk
    from geon.transformers import native
    from geon.transformers.native.build import build_runtime

    print(f"Machine: {machine()}")
    print("Command: python -m benchmarks.native" + (" --quick" if args.quick else "")
          + (f" --batches {' '.join(map(str, args.batches))}"
             if args.batches != [128, 1024] else "")
          + (f" --gap {args.gap}" if args.gap != 0.25 else ""))
    print(f"GEON_NUM_THREADS={os.environ.get('GEON_NUM_THREADS', 'unset')}, "
          f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}")
    folder = tempfile.mkdtemp(prefix="geon-native-bench-")
    try:
        rt = native.load_backend(build_runtime(folder))
        repeats = 5 if args.quick else 21

        doc, comp, xv = add_one()
        nat, ref = rt.load(doc), bk.backend("numpy").load(doc)
        assert nat.run(xv)[0] == comp(xv)
        r = interleaved_stats({"native": lambda: nat.run(xv), "numpy": lambda: ref.run(xv),
                               "comp": lambda: comp(xv)},
                              repeats=repeats, inner=200 if args.quick else 1000)
        table("x + 1, one float32 element: median (minimum) per call",
              ["native run", "backend(\"numpy\") run", "NumPy computation",
               "native / NumPy computation", "native / backend(\"numpy\")"],
              [[pair(us, r["native"]), pair(us, r["numpy"]), pair(us, r["comp"]),
                ratio(r["native"], r["comp"]), ratio(r["native"], r["numpy"])]])

        rows = []
        for batch in args.batches:
            doc, comp, feeds = mlp_step(batch)
            nat, ref = rt.load(doc), bk.backend("numpy").load(doc)
            # the same first losses before anything is timed
            got, want, direct = (float(nat.run(*feeds)[0]), float(ref.run(*feeds)[0]),
                                 float(comp(*feeds)[0]))
            np.testing.assert_allclose(got, want, rtol=1e-5)
            np.testing.assert_allclose(direct, want, rtol=1e-5)
            # a pause before each sample lets the other library's BLAS threads go idle
            # (NumPy's OpenBLAS and the runtime's scipy-openblas32 are two pools of
            # threads that spin for a while after each call: with two cores, either
            # one's spinning slows the other several times over)
            r = interleaved_stats({"native": lambda: nat.run(*feeds),
                                   "numpy": lambda: ref.run(*feeds),
                                   "comp": lambda: comp(*feeds)},
                                  repeats=repeats, inner=5 if batch <= 256 else 2,
                                  gap=args.gap)
            rows.append([batch, pair(us, r["native"]), pair(us, r["numpy"]),
                         pair(us, r["comp"]), ratio(r["native"], r["comp"]),
                         ratio(r["native"], r["numpy"])])
        table(f"Training step {' -> '.join(map(str, SIZES))}, float32: median (minimum)",
              ["batch", "native run", "backend(\"numpy\") run", "NumPy computation",
               "native / NumPy computation", "native / backend(\"numpy\")"], rows)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
