"""Shared helpers for the benchmarks: interleaved timing with medians, table printing."""

import statistics
import time


def interleaved(fns, repeats=15, inner=1, warmup=2):
    """Median seconds per call of each function in ``fns`` (a dict name -> callable),
    timing them round-robin so that machine noise hits all of them alike."""
    return {k: v[0] for k, v in interleaved_stats(fns, repeats, inner, warmup).items()}


#: Untimed calls right before each timed one after a pause (see interleaved_stats).
PRIME_CALLS = 2


def interleaved_stats(fns, repeats=15, inner=1, warmup=2, gap=0.0, prime=None):
    """Like :func:`interleaved`, but name -> (median, minimum) seconds per call.

    ``gap`` seconds of sleep before each sample let the previous function's thread
    pool go idle: OpenBLAS's, XLA's and OpenMP's worker threads spin for a while after
    a call, and on a machine with few cores they would slow whatever runs next.

    ``prime`` untimed calls of the function (default: :data:`PRIME_CALLS` where there
    is a gap, else none; ``False``: none) come right before each timed one, so a
    sample is a call in a running loop (as a training step follows a step), not one of
    the first calls after an idle pause: on a virtual machine those pay for waking idle
    virtual CPUs, once per hand-off between threads. On the 2-core KVM guest of the
    2026-11-27 results, geon's two-thread NumPy code on the 20-op chain took 30-43
    ms as the first call after a 0.1 s pause, alternately 15-16 and 22-30 ms as the
    second, and 15-16 ms from the third on, as in a loop; JAX's one thread took 23 ms
    throughout."""
    if prime is None:
        prime = PRIME_CALLS if gap > 0 else 0
    prime = int(prime)  # (True: one call, as before)
    for f in fns.values():
        for _ in range(warmup):
            f()
    samples = {k: [] for k in fns}
    for _ in range(repeats):
        for k, f in fns.items():
            if gap:
                time.sleep(gap)
            for _ in range(prime):
                f()
            t0 = time.perf_counter()
            for _ in range(inner):
                f()
            samples[k].append((time.perf_counter() - t0) / inner)
    return {k: (statistics.median(v), min(v)) for k, v in samples.items()}


def table(title, header, rows):
    """Print a Markdown table."""
    print(f"\n### {title}\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for r in rows:
        print("| " + " | ".join(str(c) for c in r) + " |")
    return rows


def pair(fmt, v):
    """``median (minimum)`` of a (median, minimum) pair, each through ``fmt``."""
    return f"{fmt(v[0])} ({fmt(v[1])})"


def ratio(a, b):
    """a / b of two (median, minimum) pairs: ``median ratio (minimum ratio)``."""
    return f"{a[0] / b[0]:.2f} ({a[1] / b[1]:.2f})"


def ms(s):
    return f"{s * 1e3:.3f} ms"


def us(s):
    return f"{s * 1e6:.2f} µs"
