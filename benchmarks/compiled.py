"""The compiled path against the NumPy path of the NumPy transformer, in one process,
interleaved: the 20-op chain on 4M float32 (table 2 of benchmarks/run.py) and a 1000-op
chain (tanh and scale, alternating) on 1,000 float32 elements. Also the machine's copy
bandwidth, to put the chain in proportion (it reads and writes 16 MiB per call).

    python -m benchmarks.compiled [--quick]
"""

import argparse
import statistics
import time

import numpy as np

import geon as be
from benchmarks.common import interleaved, ms, table, us
from benchmarks.run import chain_eager, chain_geon, machine


def _spread(fns, repeats, inner):
    """Medians and minimums per call, interleaved."""
    samples = {k: [] for k in fns}
    for f in fns.values():
        f()
        f()
    for _ in range(repeats):
        for k, f in fns.items():
            t0 = time.perf_counter()
            for _ in range(inner):
                f()
            samples[k].append((time.perf_counter() - t0) / inner)
    return ({k: statistics.median(v) for k, v in samples.items()},
            {k: min(v) for k, v in samples.items()})


def copy_bandwidth(n=1 << 24):
    """Bytes per second of np.copyto on n float32 (read + write counted)."""
    a = np.ones(n, np.float32)
    b = np.empty_like(a)
    t = interleaved({"copy": lambda: np.copyto(b, a)}, repeats=7)["copy"]
    return 2 * a.nbytes / t


def bench_chain(repeats):
    n = 4 * 1024 * 1024
    x = be.placeholder([be.Axis(n, "E")])
    xs = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    t0 = time.perf_counter()
    comp = be.NumPyTransformer(compiled=True).computation(chain_geon(x), x)
    comp(xs)
    first = time.perf_counter() - t0
    x2 = be.placeholder([be.Axis(n, "E")])
    plain = be.NumPyTransformer(compiled=False).computation(chain_geon(x2), x2)
    ref = chain_eager(xs)
    np.testing.assert_allclose(comp(xs), ref, rtol=1e-4, atol=1e-5)
    med, lo = _spread({"compiled": lambda: comp(xs), "numpy": lambda: plain(xs)},
                      repeats, 1)
    bw = copy_bandwidth()
    moved = 2 * xs.nbytes
    return table("20-op elementwise chain, 4M float32 (median / min of interleaved calls)",
                 ["compiled", "NumPy path", "compiled / NumPy", "compiled GB/s (r+w)",
                  "np.copyto GB/s", "build + first call, compiled"],
                 [[f"{ms(med['compiled'])} / {ms(lo['compiled'])}",
                   f"{ms(med['numpy'])} / {ms(lo['numpy'])}",
                   f"{med['compiled'] / med['numpy']:.2f}",
                   f"{moved / lo['compiled'] / 1e9:.1f}", f"{bw / 1e9:.1f}",
                   f"{first:.2f} s"]])


def small_chain(x, ops=1000):
    y = x
    for i in range(ops):
        y = be.tanh(y) if i % 2 else y * 1.0001
    return y


def bench_small(repeats):
    n = 1000
    xs = np.linspace(-2, 2, n, dtype=np.float32)
    x = be.placeholder([be.Axis(n, "A")])
    t0 = time.perf_counter()
    comp = be.NumPyTransformer(compiled=True).computation(small_chain(x), x)
    comp(xs)
    first = time.perf_counter() - t0
    x2 = be.placeholder([be.Axis(n, "A")])
    plain = be.NumPyTransformer(compiled=False).computation(small_chain(x2), x2)
    np.testing.assert_allclose(comp(xs), plain(xs), rtol=1e-5, atol=1e-6)
    med, lo = _spread({"compiled": lambda: comp(xs), "numpy": lambda: plain(xs)},
                      repeats, 20)
    calls = comp.source.count("# compiled:")
    return table("1000-op chain (tanh, * 1.0001) on 1000 float32 (median / min)",
                 ["compiled", "NumPy path", "compiled / NumPy", "C calls per call",
                  "build + first call, compiled"],
                 [[f"{us(med['compiled'])} / {us(lo['compiled'])}",
                   f"{us(med['numpy'])} / {us(lo['numpy'])}",
                   f"{med['compiled'] / med['numpy']:.2f}", calls, f"{first:.2f} s"]])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats")
    args = ap.parse_args(argv)
    repeats = 5 if args.quick else 21
    print(f"Machine: {machine()}")
    print(f"Command: python -m benchmarks.compiled{' --quick' if args.quick else ''}")
    bench_chain(repeats)
    bench_small(repeats)


if __name__ == "__main__":
    main()
