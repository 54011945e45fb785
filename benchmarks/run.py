"""geon's benchmark suite: ``python -m benchmarks.run`` from the repository root.

Prints five Markdown tables, each measured side by side in one process (memory: one
process per implementation), with interleaved repeats and medians, as ratios:

1. MLP training step (784-512-512-10) against hand-written NumPy and the matrix
   products alone;
2. a 20-op elementwise chain on 4M float32 against NumPy eager and NumPy with ``out=``;
3. transformation time (build + computation() + first call) of long chains and of
   wide graphs (n branches reading one placeholder, summed);
4. call overhead of a one-element ``x + 1``, and ``be.run`` per call on graphs of
   100 to 4,000 ops (it should not grow with the graph);
5. peak memory (VmHWM) of the MLP step against the minimum working set.

``--quick`` uses fewer repeats (for a smoke test); ``--only memory`` (or mlp, chain,
transform, overhead; may be repeated) runs only those tables. These are measurements,
not tests.
"""

import argparse
import os
import platform
import subprocess
import sys
import time

import numpy as np

import geon as be
from benchmarks import mlp
from benchmarks.common import interleaved, ms, table, us


def machine():
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return (f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"NumPy {np.__version__}")


def bench_mlp(repeats):
    rows = []
    for batch in (128, 1024):
        params = mlp.init_params()
        x, t = mlp.data(batch)
        g, _ = mlp.geon_step(batch, params)
        n = mlp.numpy_step(params)
        m = mlp.matmul_only(params)
        r = interleaved({"geon": lambda: g(x, t), "numpy": lambda: n(x, t),
                         "mm": lambda: m(x, t)}, repeats=repeats)
        rows.append([batch, ms(r["geon"]), ms(r["numpy"]), ms(r["mm"]),
                     f"{r['geon'] / r['numpy']:.2f}", f"{r['geon'] / r['mm']:.2f}"])
    return table("1. MLP training step 784-512-512-10, float32",
                 ["batch", "geon", "NumPy", "matmuls only", "geon / NumPy",
                  "geon / matmuls"], rows)


CHAIN = [("mul", 1.001), ("add", 0.01), ("tanh", None), ("mul", 0.9), ("exp", None),
         ("add", -1.0), ("maximum", 0.0), ("sigmoid", None), ("mul", 2.0), ("sub", 0.5),
         ("abs", None), ("add", 1.0), ("log", None), ("mul", 1.5), ("tanh", None),
         ("add", 0.25), ("square", None), ("mul", 0.5), ("minimum", 3.0), ("sqrt", None)]


def chain_geon(x):
    for name, c in CHAIN:
        if name == "mul":
            x = x * c
        elif name == "add":
            x = x + c
        elif name == "sub":
            x = x - c
        elif name == "maximum":
            x = be.maximum(x, c)
        elif name == "minimum":
            x = be.minimum(x, c)
        elif name == "abs":
            x = abs(x)
        else:
            x = getattr(be, name)(x)
    return x


_NP = {"tanh": np.tanh, "exp": np.exp, "log": np.log, "square": np.square,
       "sqrt": np.sqrt, "abs": np.abs}


def chain_eager(x):
    for name, c in CHAIN:
        if name == "mul":
            x = x * np.float32(c)
        elif name == "add":
            x = x + np.float32(c)
        elif name == "sub":
            x = x - np.float32(c)
        elif name == "maximum":
            x = np.maximum(x, np.float32(c))
        elif name == "minimum":
            x = np.minimum(x, np.float32(c))
        elif name == "sigmoid":
            x = 1 / (1 + np.exp(-x))
        else:
            x = _NP[name](x)
    return x


def chain_out(x, buf):
    np.copyto(buf, x)
    for name, c in CHAIN:
        if name == "mul":
            np.multiply(buf, np.float32(c), out=buf)
        elif name == "add":
            np.add(buf, np.float32(c), out=buf)
        elif name == "sub":
            np.subtract(buf, np.float32(c), out=buf)
        elif name == "maximum":
            np.maximum(buf, np.float32(c), out=buf)
        elif name == "minimum":
            np.minimum(buf, np.float32(c), out=buf)
        elif name == "sigmoid":
            np.negative(buf, out=buf)
            np.exp(buf, out=buf)
            np.add(buf, 1, out=buf)
            np.reciprocal(buf, out=buf)
        else:
            _NP[name](buf, out=buf)
    return buf


def bench_chain(repeats):
    n = 4 * 1024 * 1024
    A = be.Axis(n, "E")
    xs = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    x = be.placeholder([A])
    f = be.NumPyTransformer().computation(chain_geon(x), x)
    buf = np.empty_like(xs)
    ref = chain_eager(xs)
    np.testing.assert_allclose(f(xs), ref, rtol=1e-4, atol=1e-5)
    r = interleaved({"geon": lambda: f(xs), "eager": lambda: chain_eager(xs),
                     "out": lambda: chain_out(xs, buf)}, repeats=repeats)
    return table("2. 20-op elementwise chain, 4M float32",
                 ["geon", "NumPy eager", "NumPy out=", "geon / eager", "geon / out="],
                 [[ms(r["geon"]), ms(r["eager"]), ms(r["out"]),
                   f"{r['geon'] / r['eager']:.2f}", f"{r['geon'] / r['out']:.2f}"]])


def transform_time(n, derivative=False):
    t0 = time.perf_counter()
    A = be.Axis(16, "A")
    x = be.Variable(axes=[A], initial_value=0.5, name="x")
    y = x
    for i in range(n):
        y = be.tanh(y) if i % 2 else y * 1.0001
    out = be.deriv(be.sum(y, out_axes=()), x) if derivative else y
    f = be.NumPyTransformer().computation(out)
    f()
    return time.perf_counter() - t0


def wide_time(n):
    """Build, compile and run ``sum_i tanh(x * c_i)`` over ``n`` branches (one
    placeholder read by n ops: the case a worklist must not make quadratic)."""
    t0 = time.perf_counter()
    A = be.Axis(16, "A")
    x = be.placeholder([A], name="x")
    acc = be.tanh(x * 1.0)
    for i in range(1, n):
        acc = acc + be.tanh(x * (1.0 + i * 1e-4))
    f = be.NumPyTransformer().computation(acc, x)
    f(np.linspace(-1, 1, 16, dtype=np.float32))
    return time.perf_counter() - t0


def bench_transform(repeats):
    reps = max(1, repeats // 5)
    sizes = (1000, 5000, 10000)
    times = {n: min(transform_time(n) for _ in range(reps)) for n in sizes}
    d1k = min(transform_time(1000, derivative=True) for _ in range(reps))
    wide = {n: min(wide_time(n) for _ in range(reps)) for n in sizes}
    rows = [[f"{n}-op chain", f"{times[n]:.3f} s"] for n in sizes]
    rows.append(["derivative of 1000-op chain", f"{d1k:.3f} s"])
    rows.append(["chain 10k / 5k", f"{times[10000] / times[5000]:.2f}"])
    rows += [[f"wide graph, {n} branches", f"{wide[n]:.3f} s"] for n in sizes]
    rows.append(["wide 10k / 5k", f"{wide[10000] / wide[5000]:.2f}"])
    return table("3. Transformation time (build + computation() + first call)",
                 ["graph", "time"], rows)


def bench_overhead(repeats):
    A = be.Axis(1, "one")
    x = be.placeholder([A])
    f = be.NumPyTransformer().computation(x + 1, x)
    xs = np.ones(1, np.float32)
    inner = 2000
    r = interleaved({"geon": lambda: f(xs), "numpy": lambda: xs + 1},
                    repeats=repeats, inner=inner)
    table("4. Call overhead, x + 1 on one element",
          ["geon call", "NumPy x + 1", "geon - NumPy"],
          [[us(r["geon"]), us(r["numpy"]), us(r["geon"] - r["numpy"])]])
    return bench_be_run(repeats)


def _run_graph(n):
    """``t = h + y`` where ``h`` is a chain of ``n`` ops on ``x`` and a Variable."""
    A = be.Axis(4, "A")
    x, y = be.placeholder([A], name="x"), be.placeholder([A], name="y")
    v = be.Variable([A], initial_value=1.0, name="v")
    h = x
    for i in range(n // 2):
        h = h * 1.0001 + v
    return x, y, h, h + y


def bench_be_run(repeats):
    """``be.run`` per call on a chain of n ops: the target's inputs unchanged (its
    remembered value is returned), and one feed changed (the chain's remembered value
    is reused, one add runs). Neither should grow with n."""
    rows, per = [], {}
    for n in (100, 1000, 4000):
        x, y, h, t = _run_graph(n)
        runner = be.Runner()
        xs = np.ones(4, np.float32)
        ys = [np.full(4, k, np.float32) for k in range(2)]
        runner.run([h, t], {x: xs, y: ys[0]})
        flip = [0]

        def changed():
            flip[0] ^= 1
            runner.run(t, {x: xs, y: ys[flip[0]]})

        r = interleaved({"same": lambda: runner.run(t, {x: xs, y: ys[0]}),
                         "changed": changed}, repeats=repeats, inner=50)
        per[n] = r
        rows.append([n, us(r["same"]), us(r["changed"])])
    rows.append(["4000 / 100", f"{per[4000]['same'] / per[100]['same']:.2f}",
                 f"{per[4000]['changed'] / per[100]['changed']:.2f}"])
    return table("4b. be.run per call on a chain of n ops (x, a Variable) plus a feed y",
                 ["ops", "inputs unchanged", "y changed"], rows)


_MEM_CHILD = """
import gc, sys
from benchmarks import mlp
which, batch = sys.argv[1], int(sys.argv[2])
x, t = mlp.data(batch)

def status(key):
    with open('/proc/self/status') as f:
        return int([l for l in f if l.startswith(key)][0].split()[1]) * 1024

base = status('VmRSS')
if which == 'geon':
    step, tr = mlp.geon_step(batch)
    tr.allocate()
    tr.initialize()
else:
    step = mlp.numpy_step(mlp.init_params(), copy=False)
gc.collect()
built = status('VmRSS')
with open('/proc/self/clear_refs', 'w') as f:
    f.write('5')  # the peak (VmHWM) restarts here: initialization temporaries don't count
for _ in range(3):
    step(x, t)
print(built - base, status('VmHWM') - built)
"""


def _child(code, *args):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                         text=True, check=True, cwd=root)
    return [int(v) for v in out.stdout.split()[-2:]]


def bench_memory():
    if not os.path.exists("/proc/self/clear_refs"):
        return table("5. Peak memory", ["note"], [["needs Linux /proc"]])
    rows = []
    sizes = mlp.SIZES
    params = 4 * sum(o * i + o for i, o in zip(sizes[:-1], sizes[1:]))
    for batch in (128, 1024):
        # parameters, their gradients, and every layer's output for the backward pass
        minimum = 2 * params + 4 * sum(sizes[1:]) * batch
        g_model, g_step = _child(_MEM_CHILD, "geon", str(batch))
        n_model, n_step = _child(_MEM_CHILD, "numpy", str(batch))
        g, n = params + g_step, params + n_step
        mib = lambda v: f"{v / 2**20:.1f} MiB"  # noqa: E731
        rows.append([batch, mib(minimum), mib(g), mib(n), f"{g / minimum:.2f}",
                     f"{n / minimum:.2f}", f"{g / n:.2f}",
                     f"{mib(g_model - params)} / {mib(n_model - params)}"])
    return table("5. Peak memory of the MLP step: parameters plus the peak growth while "
                 "stepping (VmHWM, one process each)",
                 ["batch", "minimum working set", "geon", "NumPy", "geon / minimum",
                  "NumPy / minimum", "geon / NumPy", "model objects geon / NumPy"], rows)


#: The tables by the name ``--only`` takes, in the order they print.
TABLES = {"mlp": bench_mlp, "chain": bench_chain, "transform": bench_transform,
          "overhead": bench_overhead, "memory": lambda repeats: bench_memory()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats")
    ap.add_argument("--only", action="append", choices=list(TABLES), metavar="TABLE",
                    help=f"run only this table (one of {', '.join(TABLES)}; repeatable)")
    args = ap.parse_args(argv)
    repeats = 3 if args.quick else 15
    print(f"Machine: {machine()}")
    print("Command: python -m benchmarks.run" + (" --quick" if args.quick else "")
          + "".join(f" --only {t}" for t in args.only or ()))
    for name, bench in TABLES.items():
        if not args.only or name in args.only:
            bench(repeats)


if __name__ == "__main__":
    main()
