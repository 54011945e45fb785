"""geon's benchmark suite: ``python -m benchmarks.run`` from the repository root.

Prints six Markdown tables, each measured side by side in one process (memory: one
process per implementation), with interleaved repeats, as medians with the minimum in
parentheses, and ratios of medians (of minimums in parentheses):

1. MLP training step (784-512-512-10) against hand-written NumPy, the step's eight
   GEMMs alone on geon's GEMM path (``np.matmul`` into preallocated outputs), and JAX,
   PyTensor and PyTorch;
2. a 20-op elementwise chain on 4M float32 against NumPy eager, NumPy with ``out=``
   and the other libraries;
3. a 1,000-op elementwise chain (the 20 ops 50 times) on a 1,000-element float32
   vector, steady calls;
4. transformation time (build + computation() + first call) of long chains and of
   wide graphs, and against ``jax.jit``'s first call and ``pytensor.function``;
5. call overhead of a one-element ``x + 1``, and ``be.run`` per call on graphs of
   100 to 4,000 ops (it should not grow with the graph);
6. peak memory (VmHWM) of the MLP step against the minimum working set.

"geon" is the NumPy transformer as it comes (``compiled="auto"``: its fused groups of at
least 65,536 elements compiled to C where a C compiler works). Tables 1 and 2 also
time its NumPy code alone (``compiled=False``), and tables 1, 2 and 3 its compiled path
with small groups too (``compiled=True``) where a C compiler works.

The JAX, PyTensor and PyTorch columns appear when those libraries can be imported;
none is a dependency of geon. To get them, install beside geon (in a virtual
environment of its own, as they pull in large wheels)::

    pip install jax jaxlib pytensor torch

JAX runs ``jax.jit`` of ``value_and_grad`` plus the update (parameters donated),
PyTensor a compiled ``pytensor.function`` with ``updates`` (its C backend needs a C
compiler; compiled modules are cached across runs in its compile directory, so its
first transformation time in a fresh environment is longer than the one shown after
the first run), PyTorch eager mode with ``torch.no_grad`` updates.

``--quick`` uses fewer repeats (for a smoke test); ``--only NAME`` runs one table
(mlp, chain, small, transform, overhead, memory; comma-separated or repeated for
several);
``--no-compare`` leaves the other libraries out; ``--gap`` sets the pause before each
timed sample (0.1 s by default when other libraries are compared: their idle worker
threads spin for a while after each call and would slow the next library's call on a
machine with few cores). These are measurements, not tests.
"""

import argparse
import contextlib
import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np

import geon as be
from benchmarks import compare, mlp
from benchmarks.gemm import blas_info
from benchmarks.common import interleaved, interleaved_stats, ms, pair, ratio, table, us
from geon.transformers.numpy import compiled

NAMES = {"jax": "JAX", "pytensor": "PyTensor", "torch": "PyTorch", "geon": "geon",
         "geon_c": "geon compiled", "geon_np": "geon NumPy code", "eager": "NumPy eager",
         "out": "NumPy out=",
         "numpy": "NumPy", "gemms": "GEMMs alone"}

#: seconds of sleep before each timed sample when other libraries are compared (their
#: idle worker threads spin for a while after each call; see common.interleaved_stats)
GAP = {"s": 0.0}


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


def bench_mlp(repeats, libs=()):
    rows = []
    for batch in (128, 1024):
        params = mlp.init_params()
        x, t = mlp.data(batch)
        g, _ = mlp.geon_step(batch, params)
        n = mlp.numpy_step(params)
        gn, _ = mlp.geon_step(batch, params, be.NumPyTransformer(compiled=False))
        fns = {"geon": lambda: g(x, t), "geon_np": lambda: gn(x, t)}
        if compiled.available():  # the same step with its fused groups compiled to C
            gc, _ = mlp.geon_step(batch, params, be.NumPyTransformer(compiled=True))
            fns["geon_c"] = lambda: gc(x, t)
        fns.update(numpy=lambda: n(x, t), gemms=mlp.gemms_only(batch))
        for lib in libs:
            fns[lib] = (lambda step=compare.mlp_step(lib, params, batch): step(x, t))
        r = interleaved_stats(fns, repeats=repeats, gap=GAP['s'], prime=GAP.get('prime'))
        mine = [k for k in ("geon", "geon_np", "geon_c") if k in r]
        header = (["batch"] + [NAMES[k] for k in fns] + ["geon / NumPy"]
                  + [f"{NAMES[k]} / GEMMs" for k in mine])
        row = ([batch] + [pair(ms, r[k]) for k in fns] + [ratio(r["geon"], r["numpy"])]
               + [ratio(r[k], r["gemms"]) for k in mine])
        header, row = _against(header, row, r, libs)
        rows.append(row)
    return table("1. MLP training step 784-512-512-10, float32: median (min)", header, rows)


def check_mlp_losses(libs, batch=128):
    """The first step's loss of every implementation from the same parameters agrees
    with hand-written NumPy's (raises AssertionError otherwise)."""
    x, t = mlp.data(batch)
    ref = mlp.numpy_step(mlp.init_params())(x, t)
    g, _ = mlp.geon_step(batch, mlp.init_params())
    out = g(x, t)
    losses = {"geon": float(np.asarray(out[0] if isinstance(out, (list, tuple)) else out))}
    for lib in libs:
        losses[lib] = compare.mlp_step(lib, mlp.init_params(), batch)(x, t)
    for k, v in losses.items():
        assert abs(v - ref) <= 1e-4 * max(1.0, abs(ref)), (k, v, ref)
    return ref, losses


CHAIN = [("mul", 1.001), ("add", 0.01), ("tanh", None), ("mul", 0.9), ("exp", None),
         ("add", -1.0), ("maximum", 0.0), ("sigmoid", None), ("mul", 2.0), ("sub", 0.5),
         ("abs", None), ("add", 1.0), ("log", None), ("mul", 1.5), ("tanh", None),
         ("add", 0.25), ("square", None), ("mul", 0.5), ("minimum", 3.0), ("sqrt", None)]


def apply_chain(x, chain, unary, binary):
    """``x`` through ``chain``: ``binary[name](x, c)`` for the ops with a constant
    (mul, add, sub, maximum, minimum), ``unary[name](x)`` for the others."""
    for name, c in chain:
        x = unary[name](x) if c is None else binary[name](x, c)
    return x


_GEON_BINARY = {"mul": lambda x, c: x * c, "add": lambda x, c: x + c,
                "sub": lambda x, c: x - c, "maximum": be.maximum, "minimum": be.minimum}
_GEON_UNARY = {"abs": abs, "tanh": be.tanh, "exp": be.exp, "log": be.log,
               "sigmoid": be.sigmoid, "square": be.square, "sqrt": be.sqrt}


def chain_geon(x, chain=CHAIN):
    return apply_chain(x, chain, _GEON_UNARY, _GEON_BINARY)


# NumPy in float32 throughout: constants as float32 scalars
_NP_BINARY = {name: (lambda f: lambda x, c: f(x, np.float32(c)))(f) for name, f in
              [("mul", np.multiply), ("add", np.add), ("sub", np.subtract),
               ("maximum", np.maximum), ("minimum", np.minimum)]}
_NP = {"tanh": np.tanh, "exp": np.exp, "log": np.log, "square": np.square,
       "sqrt": np.sqrt, "abs": np.abs, "sigmoid": lambda x: 1 / (1 + np.exp(-x))}


def chain_eager(x, chain=CHAIN):
    return apply_chain(x, chain, _NP, _NP_BINARY)


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


def bench_chain(repeats, libs=()):
    n = 4 * 1024 * 1024
    A = be.Axis(n, "E")
    xs = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    x = be.placeholder([A])
    f = be.NumPyTransformer().computation(chain_geon(x), x)
    buf = np.empty_like(xs)
    ref = chain_eager(xs)
    np.testing.assert_allclose(f(xs), ref, rtol=1e-4, atol=1e-5)
    xn = be.placeholder([A])
    fn = be.NumPyTransformer(compiled=False).computation(chain_geon(xn), xn)
    np.testing.assert_allclose(fn(xs), ref, rtol=1e-4, atol=1e-5)
    fns = {"geon": lambda: f(xs), "geon_np": lambda: fn(xs)}
    fc = _compiled(lambda x: chain_geon(x), A)
    if fc is not None:
        np.testing.assert_allclose(fc(xs), ref, rtol=1e-4, atol=1e-5)
        fns["geon_c"] = lambda: fc(xs)
    fns.update(eager=lambda: chain_eager(xs), out=lambda: chain_out(xs, buf))
    for lib in libs:
        g, _ = compare.chain_fn(lib, CHAIN, n)
        np.testing.assert_allclose(np.asarray(g(xs)), ref, rtol=1e-4, atol=1e-5)
        fns[lib] = (lambda g=g: g(xs))
    r = interleaved_stats(fns, repeats=repeats, gap=GAP['s'], prime=GAP.get('prime'))
    header = [NAMES[k] for k in fns] + ["geon / eager", "geon / out="]
    row = [pair(ms, r[k]) for k in fns] + [ratio(r["geon"], r["eager"]),
                                           ratio(r["geon"], r["out"])]
    header, row = _against(header, row, r, libs)
    return table("2. 20-op elementwise chain, 4M float32: median (min)", header, [row])


def _compiled(build, axis):
    """``NumPyTransformer(compiled=True)``'s computation of ``build(x)`` from a new
    placeholder on ``axis``, or ``None`` where no C compiler works."""
    if not compiled.available():
        return None
    x = be.placeholder([axis])
    return be.NumPyTransformer(compiled=True).computation(build(x), x)


def _against(header, row, r, libs):
    """``header`` and ``row`` with the ratios of geon (and of geon's compiled path,
    where measured) to each of ``libs``."""
    for k in ("geon", "geon_np", "geon_c"):
        if k in r:
            header = header + [f"{NAMES[k]} / {NAMES[lib]}" for lib in libs]
            row = row + [ratio(r[k], r[lib]) for lib in libs]
    return header, row


#: the 1,000-op chain: the 20 ops of CHAIN fifty times (each pass keeps values finite)
SMALL_CHAIN = CHAIN * 50


def bench_small_chain(repeats, libs=()):
    n = 1000
    xs = np.linspace(-2, 2, n, dtype=np.float32)
    t0 = time.perf_counter()
    x = be.placeholder([be.Axis(n, "E")])
    f = be.NumPyTransformer().computation(chain_geon(x, SMALL_CHAIN), x)
    got = f(xs)
    build = {"geon": time.perf_counter() - t0}
    ref = chain_eager(xs, SMALL_CHAIN)
    np.testing.assert_allclose(got, ref, rtol=1e-3, atol=1e-4)
    fns = {"geon": lambda: f(xs)}
    t0 = time.perf_counter()
    fc = _compiled(lambda x: chain_geon(x, SMALL_CHAIN), be.Axis(n, "E"))
    if fc is not None:
        np.testing.assert_allclose(fc(xs), ref, rtol=1e-3, atol=1e-4)
        build["geon_c"] = time.perf_counter() - t0
        fns["geon_c"] = lambda: fc(xs)
    fns["eager"] = lambda: chain_eager(xs, SMALL_CHAIN)
    for lib in libs:
        try:
            g, build[lib] = compare.chain_fn(lib, SMALL_CHAIN, n)
        except RecursionError:  # a library whose graph passes recurse per op
            build[lib] = None
            continue
        np.testing.assert_allclose(np.asarray(g(xs)), ref, rtol=1e-3, atol=1e-4)
        fns[lib] = (lambda g=g: g(xs))
    inner = 20
    r = interleaved_stats(fns, repeats=repeats, inner=inner, gap=GAP['s'],
                          prime=GAP.get('prime'))
    ok = [k for k in libs if k in fns]
    header = [NAMES[k] for k in fns] + ["geon / eager"]
    row = [pair(ms, r[k]) for k in fns] + [ratio(r["geon"], r["eager"])]
    header, row = _against(header, row, r, ok)
    rows = [row]
    rows.append(["transformation: " + ", ".join(
        f"{NAMES.get(k, k)} {v:.2f} s" if v is not None else f"{NAMES[k]} failed"
        for k, v in build.items())] + [""] * (len(header) - 1))
    return table("3. 1,000-op elementwise chain on 1,000 float32, steady call: median (min)",
                 header, rows)


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


def bench_transform(repeats, libs=()):
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
    table("4. Transformation time (build + computation() + first call)",
          ["graph", "time"], rows)
    if libs:
        bench_transform_compare(reps, libs)
    return rows


@contextlib.contextmanager
def cold_kernels():
    """A fresh, empty kernel cache, and no compiled kernels or compiler probe remembered
    in this process: geon as on its first use on a machine, its C loops compiled."""
    old = os.environ.get("GEON_CACHE_DIR")
    libs, toolchains = dict(compiled._libs), dict(compiled._toolchains)
    with tempfile.TemporaryDirectory(prefix="geon-bench-cache-") as d:
        os.environ["GEON_CACHE_DIR"] = d
        compiled._libs.clear()
        compiled._toolchains.clear()
        try:
            yield
        finally:
            if old is None:
                os.environ.pop("GEON_CACHE_DIR", None)
            else:
                os.environ["GEON_CACHE_DIR"] = old
            compiled._libs.update(libs)
            compiled._toolchains.clear()
            compiled._toolchains.update(toolchains)


def _first_step(lib, batch):
    """Seconds from nothing to the end of a first MLP training step at ``batch`` (geon:
    with an empty kernel cache, so the C compiler's time is included)."""
    x, t = mlp.data(batch)
    params = mlp.init_params()
    with cold_kernels() if lib == "geon" else contextlib.nullcontext():
        t0 = time.perf_counter()
        if lib == "geon":
            g, _ = mlp.geon_step(batch, params)
            g(x, t)
        else:
            compare.mlp_step(lib, params, batch)(x, t)
        return time.perf_counter() - t0


def _first_chain(lib, n):
    """Seconds to build, transform and call once an ``n``-op chain (tanh and multiply
    alternating, as :func:`transform_time`) on 16 float32."""
    chain = [("tanh", None) if i % 2 else ("mul", 1.0001) for i in range(n)]
    if lib == "geon":
        t0 = time.perf_counter()
        x = be.placeholder([be.Axis(16, "A")])
        f = be.NumPyTransformer().computation(chain_geon(x, chain), x)
        f(np.full(16, 0.5, np.float32))
        return time.perf_counter() - t0
    return compare.chain_fn(lib, chain, 16)[1]


def bench_transform_compare(reps, libs):
    """geon's transformation against jax.jit's first call and pytensor.function (and
    torch's first eager step, which has nothing to transform): minimum over repeats."""
    who = ["geon"] + list(libs)
    cases = [("MLP step, batch 128", lambda lib: _first_step(lib, 128)),
             ("1000-op chain on 16 float32", lambda lib: _first_chain(lib, 1000))]
    rows = []
    for label, fn in cases:
        best = {}
        for _ in range(reps):
            for lib in who:  # interleaved
                try:
                    v = fn(lib)
                except RecursionError:
                    v = float("inf")
                best[lib] = min(best.get(lib, v), v)
        rows.append([label] + [f"{best[k]:.3f} s" for k in who]
                    + [f"{best['geon'] / best[k]:.2f}" for k in libs])
    return table("4b. Transformation time against the other libraries (minimum of "
                 f"{reps}; geon with an empty kernel cache, its C compiler included; "
                 "PyTorch eager: its first step, nothing to transform)",
                 ["graph", "geon"] + [NAMES[k] for k in libs]
                 + [f"geon / {NAMES[k]}" for k in libs], rows)





def bench_overhead(repeats, libs=()):
    A = be.Axis(1, "one")
    x = be.placeholder([A])
    f = be.NumPyTransformer().computation(x + 1, x)
    xs = np.ones(1, np.float32)
    inner = 2000
    fns = {"geon": lambda: f(xs), "numpy": lambda: xs + 1}
    for lib in libs:
        fns[lib] = compare.add_one(lib)[0]
    r = interleaved_stats(fns, repeats=repeats, inner=inner, gap=GAP['s'],
                          prime=GAP.get('prime'))
    header = (["geon call", "NumPy x + 1"] + [NAMES[k] for k in libs]
              + ["geon - NumPy"] + [f"geon / {NAMES[k]}" for k in libs])
    row = [pair(us, r[k]) for k in fns] + [us(r["geon"][0] - r["numpy"][0])]
    row += [ratio(r["geon"], r[lib]) for lib in libs]
    table("5. Call overhead, x + 1 on one element: median (min)", header, [row])
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
    return table("5b. be.run per call on a chain of n ops (x, a Variable) plus a feed y",
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
blas = 0
if len(sys.argv) > 3 and sys.argv[3] == 'blas':
    # OpenBLAS allocates and touches its packing buffers in a process's first products:
    # the growth of products of the step's shapes into arrays already touched
    import numpy as np
    keep = []
    for m, k, n in ((512, 784, batch), (512, batch, 784), (512, 512, batch)):
        keep += [np.ones((m, k), np.float32), np.ones((k, n), np.float32),
                 np.ones((m, n), np.float32)]
    before = status('VmRSS')
    for i in range(0, len(keep), 3):
        np.matmul(keep[i], keep[i + 1], out=keep[i + 2])
    blas = status('VmRSS') - before
gc.collect()
built = status('VmRSS')
with open('/proc/self/clear_refs', 'w') as f:
    f.write('5')  # the peak (VmHWM) restarts here: initialization temporaries don't count
for _ in range(3):
    step(x, t)
print(built - base, status('VmHWM') - built, blas)
"""


def _child(code, *args):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                         text=True, check=True, cwd=root)
    return [int(v) for v in out.stdout.split()[-3:]]


def bench_memory():
    if not os.path.exists("/proc/self/clear_refs"):
        return table("6. Peak memory", ["note"], [["needs Linux /proc"]])
    rows = []
    sizes = mlp.SIZES
    params = 4 * sum(o * i + o for i, o in zip(sizes[:-1], sizes[1:]))
    for batch in (128, 1024):
        # parameters, their gradients, and every layer's output for the backward pass
        minimum = 2 * params + 4 * sum(sizes[1:]) * batch
        g_model, g_step, _ = _child(_MEM_CHILD, "geon", str(batch))
        n_model, n_step, _ = _child(_MEM_CHILD, "numpy", str(batch))
        blas = _child(_MEM_CHILD, "geon", str(batch), "blas")[2]
        g, n = params + g_step, params + n_step
        mib = lambda v: f"{v / 2**20:.1f} MiB"  # noqa: E731
        rows.append([batch, mib(minimum), mib(g), mib(n), f"{g / minimum:.2f}",
                     f"{n / minimum:.2f}", f"{g / n:.2f}", mib(blas),
                     f"{(g - blas) / minimum:.2f}",
                     f"{mib(g_model - params)} / {mib(n_model - params)}"])
    return table("6. Peak memory of the MLP step: parameters plus the peak growth while "
                 "stepping (VmHWM, one process each)",
                 ["batch", "minimum working set", "geon", "NumPy", "geon / minimum",
                  "NumPy / minimum", "geon / NumPy",
                  "OpenBLAS's buffers (a process's first products of the step's shapes)",
                  "geon less them / minimum", "model objects geon / NumPy"], rows)


TABLES = ("mlp", "chain", "small", "transform", "overhead", "memory")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats")
    ap.add_argument("--only", action="append", metavar="TABLES",
                    help="tables to run (comma-separated or repeated), of: "
                         + ", ".join(TABLES))
    ap.add_argument("--no-compare", action="store_true",
                    help="leave out JAX, PyTensor and PyTorch even when installed")
    ap.add_argument("--gap", type=float, default=None,
                    help="seconds of sleep before each timed sample (default 0.1 when "
                         "other libraries are compared, else 0)")
    ap.add_argument("--cold", action="store_true",
                    help="time the first call after each pause (by default two untimed "
                         "calls come right before each timed one after a pause)")
    args = ap.parse_args(argv)
    only = [v.strip() for arg in args.only or [",".join(TABLES)] for v in arg.split(",")
            if v.strip()]
    unknown = sorted(set(only) - set(TABLES))
    if unknown:
        ap.error(f"--only: unknown table {', '.join(unknown)} (choose from "
                 f"{', '.join(TABLES)})")
    repeats = 3 if args.quick else 15
    libs = [] if args.no_compare else compare.available()
    GAP["s"] = args.gap if args.gap is not None else (0.1 if libs else 0.0)
    GAP["prime"] = False if args.cold else None
    print(f"Machine: {machine()}")
    print(f"BLAS: {blas_info()}")
    if libs:
        print(f"Compared with: {compare.versions(libs)}")
    print(f"Command: python -m benchmarks.run {' '.join(argv if argv is not None else sys.argv[1:])}"
          .rstrip())
    if "mlp" in only:
        check_mlp_losses(libs)
        bench_mlp(repeats, libs)
    if "chain" in only:
        bench_chain(repeats, libs)
    if "small" in only:
        bench_small_chain(repeats, libs)
    if "transform" in only:
        bench_transform(repeats, libs)
    if "overhead" in only:
        bench_overhead(repeats, libs)
    if "memory" in only:
        bench_memory()


if __name__ == "__main__":
    main()
