"""Segments on against off inside whole forwards of the model zoo (``benchmarks.models``;
see geon/transformers/numpy/segments.py).

For each model, two computations of the same imported graph, one generated with
segments and one without (``segments.ENABLED``), are called in turn, warm, on one
thread (``GEON_NUM_THREADS``, ``OMP_NUM_THREADS`` and ``OPENBLAS_NUM_THREADS`` set to 1
in a process of its own); the table gives the medians (minimums) and their ratio, and
checks that both give the same values, the first call included. Needs what
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
    same = bool(np.array_equal(firsts[False], firsts[True], equal_nan=True)
                and np.array_equal(comps[False](*feeds), comps[True](*feeds),
                                   equal_nan=True))
    stats = _stats({"off": lambda: comps[False](*feeds),
                    "on": lambda: comps[True](*feeds)}, repeats)
    return {"model": name, "same": same, "off": stats["off"], "on": stats["on"],
            "segments": comps[True].source.count("= _Segment((")}


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
    print("| model | segments | off | on | on / off | same values |")
    print("|---|---|---|---|---|---|")
    for line in out.stdout.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            off, on = r["off"], r["on"]
            print(f"| {r['model']} | {r['segments']} | {off[0] * 1e3:.3f} ({off[1] * 1e3:.3f}) "
                  f"| {on[0] * 1e3:.3f} ({on[1] * 1e3:.3f}) | {on[0] / off[0]:.2f} "
                  f"| {'yes' if r['same'] else 'NO'} |")
    return out.returncode


if __name__ == "__main__":
    sys.exit(main())
