"""GPU benchmarks: ``python -m benchmarks.gpu`` from the repository root, on a machine
with a CUDA GPU and pycuda (``pip install -e ".[gpu]"``). PyTorch, if installed, is
measured side by side (never a dependency); so is cuBLAS through CuPy, if installed.

Prints these Markdown tables, the first four against the issue's targets:

1. the device's copy bandwidth (device-to-device copy, bytes read + written);
2. a 20-op elementwise chain on 64M float32 (the chain of benchmarks/run.py), inputs
   and output in device-resident variables: one fused kernel; target >= 80% of (1);
   and a chain of as many arithmetic ops (no transcendental functions); PyTorch eager
   (one kernel per op) beside them;
3. the MLP training step of benchmarks/mlp.py (784-512-512-10, batch 1024 and 8192;
   data fed from host arrays and the loss returned to the host in both) against
   PyTorch eager with the same weights; target <= 1.0x;
4. GEMM 4096 x 4096 x 4096 float32 against torch.matmul: cuBLAS (geon's default where
   it works; target >= 0.9x) and the generated GEMM. TF32 is off everywhere (geon's
   generated GEMM uses plain fp32 FMA, its cuBLAS handle the default math mode;
   PyTorch is told not to use TF32 from the start);
   4b. batched products at BERT-base's attention shapes (the scores, and the whole
   attention with its softmax) against PyTorch;
5. a call of 40 small kernels (fusion off), as one CUDA graph and as a launch list;
6. a 25.7 MB feed to the device: a pageable copy, geon's upload, PyTorch's.

Times are medians of interleaved repeats after warm-up, with the device synchronized
around each timed call. ``--quick`` uses fewer repeats.
"""

import argparse
import math
import statistics
import sys
import time

import numpy as np

import geon as be
from benchmarks import mlp
from benchmarks.common import ms, table
from benchmarks.run import CHAIN, apply_chain, chain_eager, chain_geon

try:
    import torch
except ImportError:  # optional
    torch = None


def _timer(sync):
    def measure(fns, repeats, warmup=2):
        for f in fns.values():
            for _ in range(warmup):
                f()
        sync()
        samples = {k: [] for k in fns}
        for _ in range(repeats):
            for k, f in fns.items():
                sync()
                t0 = time.perf_counter()
                f()
                sync()
                samples[k].append(time.perf_counter() - t0)
        return {k: statistics.median(v) for k, v in samples.items()}
    return measure


def _torch_ok():
    return torch is not None and torch.cuda.is_available()


def _sync_all(rt):
    def sync():
        rt.synchronize()
        if _torch_ok():
            torch.cuda.synchronize()
    return sync


def bench_copy(rt, measure, repeats, scale=1):
    n = 256 * 2 ** 20 // scale
    src, dst = rt.alloc(n), rt.alloc(n)
    fns = {"geon": lambda: rt.copy(int(dst), int(src), n)}
    if _torch_ok():
        a = torch.empty(n, dtype=torch.uint8, device="cuda")
        b = torch.empty_like(a)
        fns["torch"] = lambda: b.copy_(a)
    r = measure(fns, repeats)
    bw = {k: 2 * n / v for k, v in r.items()}
    rows = [[f"device copy, {n / 2 ** 20:g} MiB", f"{bw['geon'] / 1e9:.0f} GB/s",
             ms(r["geon"])]]
    if "torch" in bw:
        rows.append(["torch copy_, 256 MiB", f"{bw['torch'] / 1e9:.0f} GB/s", ms(r["torch"])])
    table("1. Copy bandwidth (bytes read + written)", ["copy", "bandwidth", "time"], rows)
    return max(bw.values())


#: The same number of ops as CHAIN, arithmetic only: a kernel bound by memory alone.
CHEAP_CHAIN = [("mul", 1.001), ("add", 0.01), ("maximum", -3.0), ("mul", 0.9),
               ("sub", 0.1), ("abs", None), ("minimum", 5.0), ("mul", 2.0), ("add", 0.5),
               ("square", None), ("mul", 0.25), ("add", 1.0), ("minimum", 9.0),
               ("mul", 1.5), ("sub", 0.75), ("maximum", 0.0), ("add", 0.25),
               ("mul", 0.5), ("square", None), ("minimum", 3.0)]

def _torch_chain(x, chain):
    binary = {"mul": lambda x, c: x * c, "add": lambda x, c: x + c,
              "sub": lambda x, c: x - c, "maximum": torch.clamp_min,
              "minimum": torch.clamp_max}
    unary = {name: getattr(torch, name)
             for name in ("tanh", "exp", "log", "sigmoid", "sqrt", "square", "abs")}
    return apply_chain(x, chain, unary, binary)


def bench_chain(make, measure, repeats, copy_bw, scale=1):
    n = 64 * 2 ** 20 // scale
    E = be.Axis(n, "E")
    rng = np.random.default_rng(0)
    start = rng.standard_normal(n).astype(np.float32)
    rows = []
    for label, chain in [("CHAIN of benchmarks/run.py", CHAIN), ("arithmetic only", CHEAP_CHAIN)]:
        x = be.Variable([E], initial_value=start, name="x")
        y = be.Variable([E], initial_value=0.0, name="y")
        t = make()
        f = t.computation(be.SetItem(y, chain_geon(x, chain)))
        f()
        head = start[:1 << 20]
        np.testing.assert_allclose(t.state[y][:1 << 20], chain_eager(head, chain),
                                   rtol=1e-4, atol=1e-5)
        kernels = [k.note for k in f.program.launches]
        if chain is CHAIN:
            chain_f = f
        fns = {"geon": f}
        if _torch_ok():
            tx = torch.from_numpy(start).cuda()
            ty = torch.empty_like(tx)
            fns["torch"] = lambda: ty.copy_(_torch_chain(tx, chain))
        r = measure(fns, repeats)
        bw = 2 * n * 4 / r["geon"]
        rows.append([label, ms(r["geon"]), f"{bw / 1e9:.0f} GB/s", f"{bw / copy_bw:.2f}",
                     ">= 0.80", ms(r["torch"]) if "torch" in r else "-",
                     f"{len(kernels)}: {kernels[0]}"])
    table(f"2. {len(CHAIN)}-op elementwise chains, {n / 2 ** 20:g}M float32, device-resident",
          ["chain", "geon", "bandwidth", "/ copy bandwidth", "target", "torch eager",
           "geon kernels"], rows)
    return chain_f, start


def _sass_count(cubin):
    """Instructions in a cubin's machine code (cuobjdump on PATH), else None."""
    import re
    import shutil
    import subprocess
    import tempfile
    if shutil.which("cuobjdump") is None:
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as fh:
        fh.write(cubin)
        fh.flush()
        sass = subprocess.run(["cuobjdump", "-sass", fh.name], capture_output=True,
                              text=True).stdout
    return len(re.findall(r"/\*[0-9a-f]{4}\*/\s+\S", sass))


def bench_chain_math(f, start, measure, repeats, copy_bw):
    """What bounds the CHAIN kernel: its generated source launched alone, compiled as
    geon compiles it (CUDA's accurate math) and with nvcc's ``--use_fast_math``
    (approximate exp, log, division and square root); the machine instructions of each
    where cuobjdump is on PATH. geon does not use the fast variant: it is the ceiling
    that approximate math would give."""
    from pycuda.compiler import SourceModule
    from pycuda.compiler import compile as nvcc_compile
    from geon.transformers.gpu.codegen import all_kernels, module_source
    (k,) = all_kernels(f.program).values()
    src, drv, n = module_source([k]), f.transformer.runtime.drv, start.size
    x, y = drv.mem_alloc(start.nbytes), drv.mem_alloc(start.nbytes)
    drv.memcpy_htod(x, start)
    fns, outs, rows = {}, {}, []
    for label, opts in [("accurate (geon)", []), ("--use_fast_math", ["--use_fast_math"])]:
        fn = SourceModule(src, no_extern_c=True, options=opts).get_function(k.name)
        fns[label] = (lambda fn: lambda: fn(x, y, grid=k.grid, block=k.block))(fn)
        fns[label]()
        outs[label] = np.empty_like(start)
        drv.memcpy_dtoh(outs[label], y)
        count = _sass_count(nvcc_compile(src, no_extern_c=True, options=opts))
        rows.append([label, count if count is not None else "-"])
    r = measure(fns, repeats)
    ref = outs["accurate (geon)"].astype(np.float64)
    for row in rows:
        t = r[row[0]]
        diff = np.max(np.abs(outs[row[0]] - ref) / np.maximum(np.abs(ref), 1e-30))
        row[1:] = [ms(t), f"{2 * n * 4 / t / copy_bw:.2f}", row[1], f"{diff:.1e}"]
    table("2b. The CHAIN kernel alone (no call overhead): accurate and fast math",
          ["compiled", "time", "/ copy bandwidth", "SASS instructions (4 elements a "
           "thread and loop)", "max relative difference"], rows)


def bench_batched(make, measure, repeats, shape=(8, 12, 128, 64)):
    """Batched products on device-resident variables, at BERT-base's attention shapes
    (batch 8, 12 heads, sequence 128, head size 64): the scores ``Q K^T`` (one
    batched product of 96 matrices) and the whole attention ``softmax(Q K^T / 8) V``,
    against ``torch.matmul`` and the same attention in eager PyTorch."""
    nb, nh, ns, nd = shape
    Bx, Hx, Sx, Tx, Dx = (be.Axis(n, name) for n, name in
                          zip((nb, nh, ns, ns, nd), ("B", "H", "S", "T", "D")))
    rng = np.random.default_rng(0)
    Q, K, V = (rng.standard_normal(shape).astype(np.float32) for _ in range(3))
    scale = 1 / math.sqrt(nd)   # a Python float: the attention stays float32
    t = make()
    q = be.Variable([Bx, Hx, Sx, Dx], initial_value=Q, name="q")
    k = be.Variable([Bx, Hx, Tx, Dx], initial_value=K, name="k")
    v = be.Variable([Bx, Hx, Tx, Dx], initial_value=V, name="v")
    scores = be.Variable([Bx, Hx, Sx, Tx], initial_value=0.0, name="scores")
    att = be.Variable([Bx, Hx, Sx, Dx], initial_value=0.0, name="att")
    s = be.dot(q, k, batch_axes=[Bx, Hx])
    p = be.softmax(s * scale, normalization_axes=Tx)
    f_scores = t.computation(be.SetItem(scores, s))
    f_att = t.computation(be.SetItem(att, be.dot(p, v, batch_axes=[Bx, Hx])))
    f_scores()
    f_att()
    want = Q @ K.transpose(0, 1, 3, 2)
    np.testing.assert_allclose(t.state[scores], want, rtol=1e-4, atol=1e-4)
    e = np.exp(want * scale - (want * scale).max(-1, keepdims=True))
    np.testing.assert_allclose(t.state[att], (e / e.sum(-1, keepdims=True)) @ V,
                               rtol=1e-4, atol=1e-5)
    fns = {"geon scores": f_scores, "geon attention": f_att}
    if _torch_ok():
        tq, tk, tv = (torch.from_numpy(a).cuda() for a in (Q, K, V))
        ts = torch.empty(nb, nh, ns, ns, device="cuda")
        fns["torch scores"] = lambda: torch.matmul(tq, tk.transpose(-1, -2), out=ts)
        fns["torch attention"] = lambda: torch.matmul(
            torch.softmax(torch.matmul(tq, tk.transpose(-1, -2)) * scale, -1), tv)
    r = measure(fns, repeats)
    flops = 2 * nb * nh * ns * ns * nd
    rows = []
    for what, n in [("scores", flops), ("attention", 2 * flops)]:
        g = r[f"geon {what}"]
        tt = r.get(f"torch {what}")
        rows.append([what, ms(g), f"{n / g / 1e12:.1f} TFLOP/s",
                     ms(tt) if tt else "-", f"{g / tt:.2f}" if tt else "-"])
    table(f"4b. Batched products, {nb} x {nh} heads, sequence {ns}, head size {nd}, "
          "float32, device-resident", ["product", "geon", "rate", "torch", "geon / torch"],
          rows)


def bench_launches(make, measure, repeats, ops=40):
    """What a call costs when it has many small kernels: fusion off, so each of ``ops``
    elementwise ops on 1,024 elements is its own kernel."""
    C = be.Axis(1024, "C")
    x = be.Variable([C], initial_value=1.0, name="x")
    y = be.Variable([C], initial_value=0.0, name="y")
    h = x
    for k in range(ops):
        h = h * 1.0001 if k % 2 else h + 0.001
    fns, kernels, update = {}, 0, be.SetItem(y, h)
    for label, graphs in [("CUDA graph", True), ("launch list", False)]:
        f = make(cuda_graphs=graphs, disable=("fusion",)).computation(update)
        f(), f()
        kernels = len(f.program.launches)
        fns[label] = f
    r = measure(fns, repeats * 4)
    rows = [[k, ms(v), f"{v / kernels * 1e6:.2f} us"] for k, v in r.items()]
    table(f"5. A call of {kernels} small kernels (fusion off)",
          ["launched as", "per call", "per kernel"], rows)


def bench_feeds(rt, measure, repeats, shape=(784, 8192)):
    """A float32 feed of the MLP step at batch 8192 (25.7 MB) to the device: pageable
    (a plain synchronous copy), geon's upload (pinned staging, copied by threads in
    pieces, each sent as it is ready), and PyTorch's ``.to("cuda")``."""
    host = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    dst = rt.alloc(host.nbytes)
    staging = rt.pinned(shape, np.float32)
    fns = {"pageable copy": lambda: rt.htod(int(dst), host),
           "geon upload": lambda: (rt.upload(int(dst), staging, host), rt.finish())}
    if _torch_ok():
        fns["torch .to(cuda)"] = lambda: torch.from_numpy(host).to("cuda")
    r = measure(fns, repeats * 2)
    back = np.empty_like(host)
    rt.upload(int(dst), staging, host)
    rt.finish()
    rt.dtoh(back, int(dst))
    assert np.array_equal(back, host)
    rows = [[k, ms(v), f"{host.nbytes / v / 1e9:.1f} GB/s"] for k, v in r.items()]
    table(f"6. A {host.nbytes / 1e6:.1f} MB feed to the device",
          ["copy", "time", "rate"], rows)


def _torch_mlp(params, batch):
    dev = "cuda"
    ws = [(torch.tensor(W, device=dev, requires_grad=True),
           torch.tensor(b, device=dev, requires_grad=True)) for W, b in params]

    def step(x, t):
        xd = torch.from_numpy(x).to(dev)
        td = torch.from_numpy(t).to(dev)
        h = xd
        for i, (W, b) in enumerate(ws):
            h = W @ h + b[:, None]
            if i < len(ws) - 1:
                h = torch.relu(h)
        logp = torch.log_softmax(h, dim=0)
        loss = -(td * logp).sum() / batch
        loss.backward()
        with torch.no_grad():
            for W, b in ws:
                W -= mlp.LR * W.grad
                b -= mlp.LR * b.grad
                W.grad = None
                b.grad = None
        return loss.item()
    return step


def bench_mlp(make, measure, repeats, batches=(1024, 8192)):
    """The step in geon's default configuration, in the configuration of the first GPU
    run (the generated GEMM, launches one by one, feeds copied from pageable memory is
    not reproduced: feeds always go through pinned staging now), and in PyTorch."""
    rows = []
    for batch in batches:
        params = mlp.init_params()
        x, t = mlp.data(batch)
        g, _ = mlp.geon_step(batch, params, transformer=make())
        g0, _ = mlp.geon_step(batch, params, transformer=make(gemm="generated",
                                                              cuda_graphs=False))
        fns = {"geon": lambda: g(x, t), "plain": lambda: g0(x, t)}
        loss = float(g(x, t)[0])
        assert abs(loss - float(g0(x, t)[0])) <= 1e-4 * max(1.0, abs(loss))
        row = [batch, None, None, "-", "-", "<= 1.00"]
        if _torch_ok():
            ts = _torch_mlp(params, batch)
            tl = ts(x, t)
            assert abs(loss - tl) <= 1e-3 * max(1.0, abs(tl)), (loss, tl)
            fns["torch"] = lambda: ts(x, t)
        r = measure(fns, repeats)
        row[1], row[2] = ms(r["geon"]), ms(r["plain"])
        if "torch" in r:
            row[3], row[4] = ms(r["torch"]), f"{r['geon'] / r['torch']:.2f}"
        rows.append(row)
    table("3. MLP training step 784-512-512-10, float32 (host data in, loss out)",
          ["batch", "geon", "geon: generated GEMM, no graphs", "torch eager",
           "geon / torch", "target"], rows)


def bench_gemm(make, measure, repeats, n=4096):
    A, B, C = be.Axis(n, "GA"), be.Axis(n, "GB"), be.Axis(n, "GC")
    rng = np.random.default_rng(0)
    init = lambda s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    a, b = be.Variable((A, B), initial_value=init), be.Variable((B, C), initial_value=init)
    c = be.Variable((A, C), initial_value=0.0)
    flops = 2 * n ** 3
    fns, notes = {}, {}
    choices = ["generated"] + (["cublas"] if probe_gemm(make) else [])
    ts = {}
    product = be.SetItem(c, be.dot(a, b))
    for gemm in choices:
        t = make(gemm=gemm)
        f = t.computation(product)
        f()
        ts[gemm] = t
        fns[f"geon ({gemm})"] = f
        notes[f"geon ({gemm})"] = (f.program.launches[0].note if gemm == "generated"
                                   else "cuBLAS Sgemm, default math (no TF32)")
    av, bv = ts["generated"].state[a], ts["generated"].state[b]
    got = ts["generated"].state[c]
    want = av[:64].astype(np.float64) @ bv
    np.testing.assert_allclose(got[:64], want, rtol=1e-3, atol=1e-2)
    if _torch_ok():
        ta, tb = torch.from_numpy(av).cuda(), torch.from_numpy(bv).cuda()
        tc = torch.empty_like(ta)
        fns["torch"] = lambda: torch.matmul(ta, tb, out=tc)
        notes["torch"] = "cuBLAS, TF32 off"
    r = measure(fns, repeats)
    rows = []
    for k, v in r.items():
        ratio = f"{r['torch'] / v:.2f}" if "torch" in r else "-"
        rows.append([k, ms(v), f"{flops / v / 1e12:.1f} TFLOP/s", ratio,
                     ">= 0.90" if k == "geon (cublas)" else "", notes[k]])
    table(f"4. GEMM {n}^3 float32 (geon's includes copying C into its variable)",
          ["implementation", "time", "rate", "torch / this", "target", "note"], rows)


def probe_gemm(make):
    """Whether cuBLAS works here."""
    try:
        make(gemm="cublas")
        return True
    except Exception as e:
        print(f"(cuBLAS unavailable: {e})")
        return False


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--smoke", action="store_true",
                    help="tiny sizes on the CPU emulator: checks this script, measures "
                         "nothing")
    args = ap.parse_args(argv)
    from geon.transformers.gpu import GPUTransformer, GPUUnavailableError
    runtime = None
    if args.smoke:
        # the test suite's CPU emulator (tests/cuda_emulator.py, not installed)
        from tests.cuda_emulator import EmulatorRuntime
        runtime = EmulatorRuntime()
    try:
        probe = GPUTransformer(device=args.device, runtime=runtime)
    except GPUUnavailableError as e:
        print(f"cannot run the GPU benchmarks: {e}", file=sys.stderr)
        return 1
    rt = probe.runtime
    repeats = 1 if args.smoke else 5 if args.quick else 20
    if _torch_ok():  # plain float32 products in PyTorch, as in geon
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    print(f"Device: {rt.key}; torch: {torch.__version__ if _torch_ok() else 'absent'}")
    print(f"Command: python -m benchmarks.gpu{' --quick' if args.quick else ''}")
    measure = _timer(_sync_all(rt))

    def make(**kw):
        return GPUTransformer(device=args.device, runtime=rt, **kw)
    if args.smoke:
        copy_bw = bench_copy(rt, measure, repeats, scale=2 ** 12)
        bench_chain(make, measure, repeats, copy_bw, scale=2 ** 12)
        bench_mlp(make, measure, repeats, batches=(8,))
        bench_gemm(make, measure, repeats, n=128)
        bench_batched(make, measure, repeats, shape=(2, 2, 16, 8))
        bench_launches(make, measure, repeats, ops=4)
        bench_feeds(rt, measure, repeats, shape=(64, 64))
        return 0
    copy_bw = bench_copy(rt, measure, repeats)
    bench_chain_math(*bench_chain(make, measure, repeats, copy_bw), measure, repeats,
                     copy_bw)
    bench_mlp(make, measure, repeats)
    bench_gemm(make, measure, repeats)
    bench_batched(make, measure, repeats)
    bench_launches(make, measure, repeats)
    bench_feeds(rt, measure, repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
