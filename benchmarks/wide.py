"""Wide graphs: n parallel branches reading one placeholder, summed by a chain of adds.

Two forms: plain ``acc + tanh(x * c_i)``, and ``acc + tanh((x * 1.0) * c_i)`` whose
branches each hold an op that simplification replaces by the placeholder itself (the form
a worklist that re-queues all users of a replacement makes quadratic). Prints the time of
build + ``computation()`` + first call at 1k, 5k and 10k branches (best of 3) and the
10k / 5k ratio. Run ``python -m benchmarks.wide`` from the repository root; pointing
``PYTHONPATH`` at another checkout measures that one with the same builder.
"""

import time

import numpy as np

import geon as be


def wide(n, simplifiable):
    t0 = time.perf_counter()
    A = be.Axis(16, "A")
    x = be.placeholder([A], name="x")

    def branch(c):
        return be.tanh((x * 1.0 if simplifiable else x) * c)

    acc = branch(1.0)
    for i in range(1, n):
        acc = acc + branch(1.0 + i * 1e-4)
    f = be.NumPyTransformer().computation(acc, x)
    f(np.linspace(-1, 1, 16, dtype=np.float32))
    return time.perf_counter() - t0


def main():
    for simplifiable in (False, True):
        times = {n: min(wide(n, simplifiable) for _ in range(3)) for n in (1000, 5000, 10000)}
        print("x*1.0 branches" if simplifiable else "plain branches",
              " ".join(f"{n}: {t:.3f} s" for n, t in times.items()),
              f"10k/5k = {times[10000] / times[5000]:.2f}", flush=True)


if __name__ == "__main__":
    main()
