"""The GEMMs of the MLP training step, one by one, against the CPU's peak:
``python -m benchmarks.gemm`` from the repository root.

For the 784-512-512-10 step (benchmarks/mlp.py) at batch 128 and 1024 it times each of
the eight matrix products that geon's NumPy transformer emits (three forward, five
backward, the backward ones reading transposed views), in GFLOP/s and as a fraction of
the peak worked out from /proc/cpuinfo (see :func:`peak`). It runs them

- with NumPy's ``matmul`` (the BLAS NumPy bundles) once per OpenBLAS core type: the
  one OpenBLAS picks itself, then each name in ``--coretypes`` set as
  ``OPENBLAS_CORETYPE`` in a fresh process (the variable is read when NumPy loads its
  OpenBLAS, so it cannot be changed inside a process);
- with ``cblas_sgemm`` of the ``scipy-openblas32`` wheel through ctypes, and with
  BLIS (the ``blis`` wheel's ``gemm``), when those are installed (never a dependency).

``threadpoolctl``, when installed, reports which kernel set (architecture) each
OpenBLAS uses. Each process times its variants round-robin (medians and minimums).
These are measurements, not tests.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

from benchmarks.common import table

#: name, M, K, N, A transposed, B transposed: C[M, N] = op(A)[M, K] @ op(B)[K, N], in
#: the order geon's generated step calls them (``h`` the layer outputs, ``d`` the
#: gradients flowing back, batch ``b``; weights are [out, in], activations [features, b]).
STEP_GEMMS = (
    ("fwd W0 @ x", 512, 784, "b", False, False),
    ("fwd W1 @ h1", 512, 512, "b", False, False),
    ("fwd W2 @ h2", 10, 512, "b", False, False),
    ("dW2 = d2 @ h2.T", 10, "b", 512, False, True),
    ("d1 = W2.T @ d2", 512, 10, "b", True, False),
    ("dW1 = d1 @ h1.T", 512, "b", 512, False, True),
    ("d0 = W1.T @ d1", 512, 512, "b", True, False),
    ("dW0 = d0 @ x.T", 512, "b", 784, False, True),
)

#: fused multiply-add units per core for float32 vectors, by CPU (see :func:`peak`)
_FMA_UNITS_DEFAULT = 2


def gemms(batch):
    """The step's GEMMs at ``batch`` as (name, M, K, N, transA, transB)."""
    b = lambda v: batch if v == "b" else v  # noqa: E731
    return [(n, b(m), b(k), b(nn), ta, tb) for n, m, k, nn, ta, tb in STEP_GEMMS]


def cpuinfo():
    """(model name, flags, MHz) of the first CPU in /proc/cpuinfo (empty if none)."""
    model, flags, mhz = "", set(), 0.0
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, val = line.partition(":")
                key = key.strip()
                if key == "model name" and not model:
                    model = val.strip()
                elif key == "flags" and not flags:
                    flags = set(val.split())
                elif key == "cpu MHz" and not mhz:
                    mhz = float(val)
    except OSError:
        pass
    return model, flags, mhz


def peak(ghz=None, cores=None, fma_units=_FMA_UNITS_DEFAULT):
    """Peak float32 GFLOP/s of this machine and how it was derived (a string).

    lanes = 16 with AVX-512F, 8 with AVX/AVX2, 4 otherwise; 2 FLOPs per lane with FMA
    (a multiply and an add), else 1 (Sandy Bridge style separate add and multiply ports
    give 2 as well, but such CPUs are not what this is for); times the FMA units per
    core (2 on Intel server cores since Skylake-SP and on AMD Zen 2 to Zen 5: pass
    ``fma_units`` for others), the clock (``cpu MHz`` of /proc/cpuinfo unless given:
    under a hypervisor that is the nominal clock, and a core may boost above it) and
    the cores NumPy's BLAS may use.
    """
    model, flags, mhz = cpuinfo()
    lanes = 16 if "avx512f" in flags else 8 if ({"avx2", "avx"} & flags) else 4
    per_lane = 2 if "fma" in flags else 1
    ghz = ghz or (mhz / 1e3 if mhz else 1.0)
    cores = cores or os.cpu_count() or 1
    flop_cycle = lanes * per_lane * fma_units
    value = flop_cycle * ghz * cores
    how = (f"{model or 'CPU'}: {'AVX-512F' if lanes == 16 else 'AVX2' if lanes == 8 else 'SSE'}"
           f"{' + FMA' if per_lane == 2 else ''} -> {lanes} float32 lanes x {per_lane} "
           f"x {fma_units} FMA units = {flop_cycle} FLOP/cycle/core; x {ghz:.3f} GHz x "
           f"{cores} cores = {value:.1f} GFLOP/s")
    return value, how


def _operands(m, k, n, ta, tb, rng):
    a = rng.standard_normal((k, m) if ta else (m, k), dtype=np.float32)
    b = rng.standard_normal((n, k) if tb else (k, n), dtype=np.float32)
    return a, b, np.empty((m, n), np.float32)


def _numpy_call(a, b, c, ta, tb):
    av, bv = (a.T if ta else a), (b.T if tb else b)
    return lambda: np.matmul(av, bv, out=c)


def _openblas32_call():
    """cblas_sgemm of the scipy-openblas32 wheel (None when not installed)."""
    try:
        import ctypes

        import scipy_openblas32
    except ImportError:
        return None, None
    lib = ctypes.CDLL(os.path.join(scipy_openblas32.get_lib_dir(),
                                   "lib" + scipy_openblas32.get_library() + ".so"))
    sgemm = lib.scipy_cblas_sgemm
    i, f, p = ctypes.c_int, ctypes.c_float, ctypes.c_void_p
    sgemm.argtypes = [i, i, i, i, i, i, f, p, i, p, i, f, p, i]
    sgemm.restype = None
    lib.scipy_openblas_get_corename.restype = ctypes.c_char_p
    row, no, yes = 101, 111, 112

    def make(a, b, c, ta, tb):
        m, n = c.shape
        k = a.shape[0] if ta else a.shape[1]
        args = (row, yes if ta else no, yes if tb else no, m, n, k, 1.0,
                a.ctypes.data, a.shape[1], b.ctypes.data, b.shape[1], 0.0,
                c.ctypes.data, n)
        return lambda: sgemm(*args)

    info = f"scipy-openblas32 {scipy_openblas32.__version__ if hasattr(scipy_openblas32, '__version__') else ''}".strip()
    return make, f"{info}, core {lib.scipy_openblas_get_corename().decode()}"


def _blis_call():
    """BLIS's gemm from the ``blis`` wheel (None when not installed)."""
    try:
        import blis.py
    except ImportError:
        return None, None

    def make(a, b, c, ta, tb):
        return lambda: blis.py.gemm(a, b, out=c, trans1=ta, trans2=tb, beta=0.0)

    return make, "blis (single-threaded build)"


def blas_info():
    """What threadpoolctl says about the BLAS libraries loaded (or why not)."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "threadpoolctl not installed"
    rows = [f"{i.get('internal_api')} {i.get('version')} {i.get('architecture', '')} "
            f"{i.get('num_threads')} threads ({os.path.basename(i.get('filepath', ''))})"
            for i in threadpool_info() if i.get("user_api") == "blas"]
    return "; ".join(rows) or "no BLAS seen"


def measure(batches, repeats, backends):
    """{backend: {batch: [(median s, min s) per GEMM]}} for this process, and notes on
    the backends. Backends: numpy (``np.matmul``), openblas32, blis."""
    rng = np.random.default_rng(0)
    makers, notes = {}, {}
    if "numpy" in backends:
        makers["numpy"], notes["numpy"] = _numpy_call, blas_info()
    for name, fn in (("openblas32", _openblas32_call), ("blis", _blis_call)):
        if name in backends:
            make, note = fn()
            if make is not None:
                makers[name], notes[name] = make, note
    out = {k: {} for k in makers}
    for batch in batches:
        for spec in gemms(batch):
            _, m, k, n, ta, tb = spec
            a, b, c = _operands(m, k, n, ta, tb, rng)
            calls = {name: make(a, b, c, ta, tb) for name, make in makers.items()}
            ref = None
            for name, f in calls.items():  # every backend computes the same product
                f()
                if ref is None:
                    ref = c.copy()
                else:
                    np.testing.assert_allclose(c, ref, rtol=1e-3, atol=1e-3 * np.sqrt(k))
            flops = 2.0 * m * k * n
            inner = max(1, int(2e8 / flops))  # about 1-2 ms of work per sample
            samples = {name: [] for name in calls}
            for _ in range(repeats):
                for name, f in calls.items():
                    t0 = time.perf_counter()
                    for _ in range(inner):
                        f()
                    samples[name].append((time.perf_counter() - t0) / inner)
            for name, s in samples.items():
                out[name].setdefault(batch, []).append((statistics.median(s), min(s)))
    return out, notes


def _child(coretype, batches, repeats, backends):
    env = dict(os.environ)
    if coretype is None:
        env.pop("OPENBLAS_CORETYPE", None)
    else:
        env["OPENBLAS_CORETYPE"] = coretype
    code = ("import json, sys; from benchmarks import gemm; "
            "r = gemm.measure(json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3].split(',')); "
            "print('@@' + json.dumps(r))")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = subprocess.run([sys.executable, "-c", code, json.dumps(batches), str(repeats),
                        ",".join(backends)], capture_output=True, text=True, cwd=root,
                       env=env)
    if p.returncode:
        return None, (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
    line = [v for v in p.stdout.splitlines() if v.startswith("@@")][-1]
    res, notes = json.loads(line[2:])
    return res, notes


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats")
    ap.add_argument("--coretypes", default="Haswell,Zen,SkylakeX,Sandybridge",
                    help="OPENBLAS_CORETYPE values to try besides OpenBLAS's own choice "
                         "(comma-separated; empty for none)")
    ap.add_argument("--ghz", type=float, help="clock for the peak (default: cpu MHz)")
    ap.add_argument("--fma-units", type=int, default=_FMA_UNITS_DEFAULT,
                    help="float32 FMA units per core for the peak (default 2)")
    ap.add_argument("--rounds", type=int, help="processes per variant, round-robin")
    ap.add_argument("--others", default="openblas32,blis",
                    help="other BLAS libraries to time when installed (comma-separated "
                         "of openblas32, blis; empty for none)")
    args = ap.parse_args(argv)
    repeats = 3 if args.quick else 9
    rounds = args.rounds or (1 if args.quick else 3)
    batches = [128, 1024]
    pk, how = peak(args.ghz, fma_units=args.fma_units)
    print(f"Peak: {how}")
    print(f"Command: python -m benchmarks.gemm {' '.join(argv or sys.argv[1:])}".rstrip())
    # (label, OPENBLAS_CORETYPE, backend): one process each, because a BLAS's idle
    # threads spin for a while after each call and would slow another BLAS timed in
    # the same process on a machine with few cores
    variants = [("NumPy, OpenBLAS's choice", None, "numpy")]
    variants += [(f"NumPy, {c}", c, "numpy") for c in args.coretypes.split(",") if c]
    others = [o for o in args.others.split(",") if o]
    variants += [(n, None, o) for n, o in (("scipy-openblas32", "openblas32"),
                                           ("blis", "blis")) if o in others]
    # every round runs each variant once, in turn, so that load hits them alike
    results = {}
    for _ in range(rounds):
        for label, ct, backend in variants:
            res, notes = _child(ct, batches, repeats, [backend])
            if res is None:
                results.setdefault(label, (None, notes))
                continue
            if backend not in res:
                continue  # not installed
            slot = results.setdefault(label, ({}, notes[backend]))[0]
            for batch, rows in res[backend].items():
                slot.setdefault(batch, []).append(rows)
    for label, (per, note) in results.items():
        print(f"\n{label}: {note}")
    for batch in batches:
        header = ["GEMM (M x K x N)"] + list(results)
        rows = []
        totals = {label: 0.0 for label in results}
        for j, (name, m, k, n, ta, tb) in enumerate(gemms(batch)):
            row = [f"{name} ({m}x{k}x{n})"]
            for label, (per, _) in results.items():
                if per is None:
                    row.append("failed")
                    continue
                runs = per[str(batch)]
                med = statistics.median(r[j][0] for r in runs)
                best = min(r[j][1] for r in runs)
                totals[label] += med
                gf, gbest = 2e-9 * m * k * n / med, 2e-9 * m * k * n / best
                row.append(f"{gf:.0f} ({gbest:.0f}) GF/s, {gf / pk:.0%}")
            rows.append(row)
        rows.append(["all eight, sum of medians"] +
                    [f"{totals[label] * 1e3:.3f} ms" if per is not None else "failed"
                     for label, (per, _) in results.items()])
        table(f"GEMMs of the MLP step at batch {batch}: median (best) GFLOP/s, median "
              f"as a fraction of the {pk:.0f} GFLOP/s peak", header, rows)


if __name__ == "__main__":
    main()
