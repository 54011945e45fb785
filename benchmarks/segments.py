"""Segments on against off inside whole forwards of the model zoo (``benchmarks.models``;
see geon/transformers/numpy/segments.py).

For each model, two computations of the same imported graph, one generated with
segments and one without (``segments.ENABLED``), are called in turn, warm, on one
thread (``GEON_NUM_THREADS``, ``OMP_NUM_THREADS`` and ``OPENBLAS_NUM_THREADS`` set to 1
in a process of its own); the table gives the medians (minimums) and their ratio, and
compares their values, the first call included: bit for bit, but for the products that
:mod:`geon.transformers.numpy.small_gemm` computes, whose order of terms differs from
the BLAS's where it splits the sums (the largest difference relative to the output's
largest magnitude). Needs what
``benchmarks.models`` needs::

    python -m benchmarks.segments [--repeats 300] [--only mobilenet_v2 ...]
"""

import argparse
import json
import os
import subprocess
import sys


def run_model(name, repeats):
    import numpy as np

    import geon as be
    from benchmarks import models
    from benchmarks.models import _stats
    from geon.frontends.onnx import import_model
    from geon.transformers.numpy import segments

    module, inputs, names = models.build(name)
    data = models.export(module, inputs, names)
    feeds = [t.numpy() for t in inputs]
    comps, firsts = {}, {}
    for on in (False, True):
        was, segments.ENABLED = segments.ENABLED, on
        try:
            g = import_model(data)
            comps[on] = be.NumPyTransformer().computation(g.outputs[0], *g.inputs)
        finally:
            segments.ENABLED = was
        firsts[on] = np.array(comps[on](*feeds))
    diff = max(_difference(firsts[False], firsts[True]),
               _difference(comps[False](*feeds), comps[True](*feeds)))
    stats = _stats({"off": lambda: comps[False](*feeds),
                    "on": lambda: comps[True](*feeds)}, repeats)
    return {"model": name, "difference": diff, "off": stats["off"], "on": stats["on"],
            "segments": comps[True].source.count("= _Segment((")}


def _difference(x, y):
    """0.0 where ``x`` and ``y`` are equal bit for bit (NaN where NaN), else the
    largest difference relative to ``x``'s largest magnitude (inf where NaN differ)."""
    import numpy as np
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if np.array_equal(x, y, equal_nan=True):
        return 0.0
    if not np.array_equal(np.isnan(x), np.isnan(y)):
        return float("inf")
    ok = ~np.isnan(x)
    return float(np.max(np.abs(x[ok] - y[ok])) / max(np.max(np.abs(x[ok])), 1e-300))


def main(argv=None):
    from benchmarks.models import MODELS
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=300)
    p.add_argument("--only", nargs="+", choices=MODELS, help="these models only")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        for name in args.only or MODELS:
            print(json.dumps(run_model(name, args.repeats)), flush=True)
        return
    env = dict(os.environ, GEON_NUM_THREADS="1", OMP_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "benchmarks.segments", "--worker", "--repeats",
           str(args.repeats)] + (["--only", *args.only] if args.only else [])
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode:
        print(out.stderr[-2000:], file=sys.stderr)
    print("One thread, warm, in turn: median (minimum) ms\n")
    print("| model | segments | off | on | on / off | values on against off |")
    print("|---|---|---|---|---|---|")
    for line in out.stdout.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            off, on = r["off"], r["on"]
            print(f"| {r['model']} | {r['segments']} | {off[0] * 1e3:.3f} ({off[1] * 1e3:.3f}) "
                  f"| {on[0] * 1e3:.3f} ({on[1] * 1e3:.3f}) | {on[0] / off[0]:.2f} "
                  f"| {_said(r['difference'])} |")
    return out.returncode


def _said(diff):
    return "bitwise" if diff == 0 else f"max rel. difference {diff:.1e}"


if __name__ == "__main__":
    sys.exit(main())
