"""The GPU transformer's code generation, checked without a GPU.

- Every kernel generated for the op table (tests/op_table.py: forward values and
  gradients, float32 and float64) and for a few larger graphs (the big GEMM tiles,
  split reductions, vector loads, integer ops, a user op with CUDA source) is compiled
  with ``nvcc -ptx -arch=sm_90``, all in one invocation (skipped only without nvcc).
- The same kernels run on the CPU emulator (tests/cuda_emulator.py: the
  CUDA C compiled as C++, CUDA threads as fibers), and every result is compared with
  the NumPy transformer (skipped only without a C++ compiler).
- Memory plans of every computation are proved by ``verify_plan`` (tests/conftest.py).
"""

import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import geon as be
from geon.op_graph import primitives as pr
from geon.transformers.gpu import CudaCodegenTransformer, GPUTransformer
from geon.transformers.gpu import gemm as G
from geon.transformers.gpu import kernels as K
from geon.transformers.gpu.codegen import module_source
from cuda_emulator import EmulatorRuntime, find_compiler
from op_table import CASES, GRAD_CASES

DTYPES = [np.float32, np.float64]
TOL = {np.dtype(np.float32): dict(rtol=1e-5, atol=1e-6),
       np.dtype(np.float64): dict(rtol=1e-12, atol=1e-12)}
#: Graphs whose float32 results are sums of many products, compared more loosely (the
#: GEMM and NumPy's BLAS round differently; the op table itself uses TOL).
LOOSE = {"gemm_big_f32": dict(rtol=1e-4, atol=1e-4), "gemm_even": dict(rtol=1e-4, atol=1e-4),
         "gemm_large_tiles": dict(rtol=1e-4, atol=1e-4),
         "gemm_large_even": dict(rtol=1e-4, atol=1e-4),
         "gemm_batched_f32": dict(rtol=1e-4, atol=1e-3),
         "gemm_batched_even": dict(rtol=1e-4, atol=1e-4),
         "gemm_batched_large_tiles": dict(rtol=1e-4, atol=1e-3),
         "split_f32": dict(rtol=1e-4, atol=1e-4), "multi_output": dict(rtol=1e-5, atol=1e-4),
         # a normalization's gradient is a difference of O(1) sums that nearly cancel
         # (it is orthogonal to the constants): float32 rounding of O(1) terms, absolute
         "layer_norm(C,H)-float32": dict(rtol=1e-5, atol=1e-5)}
NVCC = shutil.which("nvcc")
CXX = find_compiler()


# --- the graphs --------------------------------------------------------------------------

def _case_graph(case, dtype, grad):
    """``(results, placeholders, arrays)`` of an op-table case; with ``grad``, also the
    derivative of the sum of the result with respect to every float input."""
    xs = [be.placeholder(i.axes, dtype=i.dtype(dtype)) for i in case.inputs]
    op = case.make(xs, dtype)
    results = [op]
    if grad:
        cost = be.sum(op * op, out_axes=())  # a delta that depends on the values
        results += [be.deriv(cost, x) for x, i in zip(xs, case.inputs) if i.kind == "float"]
    return results, xs, case.arrays(dtype)


LARGE_TILES = "large GEMM tiles"  # a graph's 4th entry: generate with G.GEMM_LARGE


def _extra_graphs():
    """Graphs that reach the code paths the small op table does not."""
    rng = np.random.default_rng(7)
    out = {}
    M, Kd, Nn = (be.Axis(n, f"G{n}") for n in (256, 136, 264))

    def mm(dtype):
        a = be.placeholder((M, Kd), dtype=dtype)
        b = be.placeholder((Kd, Nn), dtype=dtype)
        bt = be.placeholder((Nn, Kd), dtype=dtype)
        vals = [rng.standard_normal(s).astype(dtype) for s in ((256, 136), (136, 264), (264, 136))]
        return [be.dot(a, b), be.dot(a, bt), be.tanh(be.dot(b, a))], [a, b, bt], vals
    out["gemm_big_f32"] = mm(np.float32)  # float32 sums of 136 products: see LOOSE
    out["gemm_big_f64"] = mm(np.float64)

    # GEMM with all tiles whole and float4 loads and stores
    E1, E2, E3 = be.Axis(128, "E1"), be.Axis(64, "E2"), be.Axis(128 * 9, "E3")

    def mm_even():
        a = be.placeholder((E1, E2))
        b = be.placeholder((E2, E3))
        return [be.dot(a, b)], [a, b], [rng.standard_normal((128, 64)).astype(np.float32),
                                        rng.standard_normal((64, 1152)).astype(np.float32)]
    out["gemm_even"] = mm_even()

    # the large tiles (chosen for big products; forced here on moderate ones, with
    # partial tiles, transposed operands and whole-tile float4 paths)
    out["gemm_large_tiles"] = mm(np.float32) + (LARGE_TILES,)
    F1, F2, F3 = be.Axis(256, "F1"), be.Axis(32, "F2"), be.Axis(128, "F3")

    a = be.placeholder((F1, F2))
    b = be.placeholder((F2, F3))
    at = be.placeholder((F2, F1))
    out["gemm_large_even"] = ([be.dot(a, b), be.dot(at, b)], [a, b, at],
                              [rng.standard_normal(s).astype(np.float32)
                               for s in ((256, 32), (32, 128), (32, 256))], LARGE_TILES)

    # batched products: partial tiles, a transposed operand, a broadcast (stride-0)
    # batch, batch dimensions that do not merge into one stride, and the derivatives
    def batched(dtype):
        q = be.np.placeholder((3, 2, 70, 36), dtype=dtype)
        k = be.np.placeholder((3, 2, 36, 66), dtype=dtype)
        kt = be.np.placeholder((2, 66, 36), dtype=dtype)
        w = be.np.placeholder((70, 36), dtype=dtype)
        x = be.np.placeholder((3, 1, 70, 36), dtype=dtype)
        s = be.np.tanh(q @ k) + w @ k + x @ k + q @ be.np.swapaxes(kt, -1, -2)
        cost = be.np.sum(s * s)
        xs = [q, k, kt, w, x]
        vals = [rng.standard_normal(be.np.shape(p)).astype(dtype) for p in xs]
        return [s] + be.deriv(cost, xs), xs, vals
    out["gemm_batched_f32"] = batched(np.float32)
    out["gemm_batched_f64"] = batched(np.float64)

    def batched_even():  # whole tiles and float4 loads and stores, batch by batch
        a = be.np.placeholder((4, 64, 32))
        b = be.np.placeholder((4, 32, 128))
        return [a @ b], [a, b], [rng.standard_normal(s).astype(np.float32)
                                 for s in ((4, 64, 32), (4, 32, 128))]
    out["gemm_batched_even"] = batched_even()
    out["gemm_batched_large_tiles"] = batched(np.float32) + (LARGE_TILES,)

    # reductions long enough to be split in two passes, along and across memory
    L1, R1 = be.Axis(40000, "L1"), be.Axis(3, "R1")

    def split(dtype):
        x = be.placeholder((R1, L1), dtype=dtype)
        v = rng.standard_normal((3, 40000)).astype(dtype)
        return ([be.sum(x, reduction_axes=L1), be.max(x, reduction_axes=L1),
                 be.argmax(x, reduction_axes=L1), be.argmin(x, reduction_axes=L1),
                 be.sum(x * x, reduction_axes=L1),
                 be.sum(be.axes_with_order(x, (L1, R1)) * 2.0, reduction_axes=L1),
                 be.min(x, reduction_axes=(R1, L1)),
                 be.argmax(x, reduction_axes=(L1, R1))], [x], [v])
    out["split_f32"] = split(np.float32)
    out["split_f64"] = split(np.float64)

    # a long elementwise chain on a few blocks' worth of elements, views and a result
    # read back through a transpose
    A1, A2 = be.Axis(96, "A1"), be.Axis(50, "A2")

    def chain():
        x = be.placeholder((A1, A2))
        y = be.placeholder(A2)
        h = x
        for k in range(20):
            h = be.tanh(h * 1.01 + 0.5) if k % 2 else be.maximum(h, y) - 0.25
        return ([h, be.axes_with_order(h, (A2, A1)), be.sigmoid(h) + be.exp(-h)], [x, y],
                [rng.standard_normal((96, 50)).astype(np.float32),
                 rng.standard_normal(50).astype(np.float32)])
    out["chain"] = chain()

    # copies of transposes (tiled through shared memory), with partial tiles, a
    # reversed slice, and float64
    T1, T2, T3 = be.Axis(70, "T1"), be.Axis(45, "T2"), be.Axis(3, "T3")

    def transposes():
        x = be.placeholder((T1, T2))
        y = be.placeholder((T3, T1, T2), dtype=np.float64)
        rev = be.slice_along_axis(x, T1, slice(None, None, -1))
        return ([be.flatten(be.axes_with_order(x, (T2, T1))),
                 be.flatten(be.axes_with_order(rev, (T2, rev.axes[0]))),
                 be.flatten(be.axes_with_order(y, (T3, T2, T1)))], [x, y],
                [rng.standard_normal((70, 45)).astype(np.float32),
                 rng.standard_normal((3, 70, 45))])
    out["transposes"] = transposes()

    # multi-output ops: max_argmax (one ReduceMaxArgMax, also split in two passes; one
    # output unused) and split (views)
    M1, M2, M3, M4 = (be.Axis(n, f"M{n}") for n in (3, 4, 50, 20000))

    def multi():
        x = be.placeholder((M1, M2, M3))
        y = be.placeholder((M1, M4))
        m, a = be.max_argmax(x, reduction_axes=(M1, M2))
        _, a3 = be.max_argmax(x, reduction_axes=M1)
        m2, a2 = be.max_argmax(y, reduction_axes=M4)
        p1, p2 = be.split(x, M3, 2)
        return ([m, a, m2 * 2.0, a2, a3, be.sum(p1 - be.cast_axes(p2, p1.axes), out_axes=())],
                [x, y], [rng.standard_normal((3, 4, 50)).astype(np.float32),
                         rng.standard_normal((3, 20000)).astype(np.float32)])
    out["multi_output"] = multi()

    # integers: labels, counters, comparisons and argmax
    Cl, Nl = be.Axis(4, "Cl"), be.Axis(6, "Nl")

    def ints():
        lab = be.placeholder(Nl, dtype=np.int64)
        f = be.placeholder((Cl, Nl))
        one = be.one_hot(lab, Cl)
        return ([lab + 1, lab * 2, be.maximum(lab, 2), be.argmax(f * one, reduction_axes=Cl),
                 be.sum(lab, out_axes=()), be.equal(lab, 2), be.negative(lab)],
                [lab, f], [np.array([0, 3, 1, 2, 2, 0]),
                           rng.standard_normal((4, 6)).astype(np.float32)])
    out["ints"] = ints()

    # convolution and pooling primitives beyond the op table: max pooling's gather (its
    # forward derivative), a broadcast operand, a 3-d transposed convolution
    def conv_more():
        x = be.np.placeholder((2, 3, 6, 5), dtype=np.float64)
        w = be.np.placeholder((3, 4, 2, 3, 2), dtype=np.float64)
        v = be.np.placeholder((2, 3, 4, 3, 2), dtype=np.float64)
        pooled = be.np.max_pool(x, 3, stride=(1, 2), padding=1)
        tangent = be.jvp(pooled, x, np.linspace(-1, 1, 180).reshape(2, 3, 6, 5))
        f = be.np.placeholder((4, 3, 2, 2), dtype=np.float64)
        bias_image = be.np.broadcast_to(be.np.sum(x, axis=0), (2, 3, 6, 5))
        shifted = be.np.conv(bias_image, f)
        up = be.np.conv_transpose(v, w, stride=(2, 1, 2), padding=(0, 1, 1),
                                  output_padding=(1, 0, 0))
        ps = [x, w, v, f]
        return ([pooled, tangent, shifted, up], ps,
                [rng.standard_normal(p.axes.shape) for p in ps])
    out["conv_more"] = conv_more()
    # float math of integer tensors: computed in float32, not in the operands' type
    def int_math():
        i32 = be.placeholder(Nl, dtype=np.int32)
        u8 = be.placeholder(Nl, dtype=np.uint8)
        return ([be.reciprocal(i32), be.square(i32), -u8, be.sqrt(u8), i32 ** 3,
                 i32 ** -1, be.sigmoid(-u8)], [i32, u8],
                [np.array([2, 3, -7, 2 ** 31 - 1, 46341, -1], np.int32),
                 np.array([250, 1, 0, 255, 7, 128], np.uint8)])
    out["int_math"] = int_math()
    out.update(_tile_graphs(rng))
    return out


#: Elements per tile of a fused elementwise kernel: sizes around it reach the whole
#: tiles (16-byte vectors where they fit), the partial last tile, and both.
TILE = K.EW_THREADS * K.EW_ITEMS


def _tile_graphs(rng):
    """Fused elementwise kernels of sizes that are and are not whole tiles, of each
    element size, on misaligned slices, broadcasts and mixed element sizes. The access
    each kernel should use, by its size: :data:`EW_ACCESS`."""
    out = {}
    sizes = (2 * TILE, 2 * TILE + 37, TILE - 1, 1)

    def tiles():
        xs = [be.placeholder(be.Axis(n, f"TL{n}")) for n in sizes]
        return ([be.sigmoid(x * 3.0 - 1.0) + be.tanh(x) for x in xs], xs,
                [rng.standard_normal(n).astype(np.float32) * 30 for n in sizes])
    out["ew_tiles"] = tiles()
    E = be.Axis(2 * TILE + 37, "EE")
    n = E.length

    def dtypes():
        # one kernel per element size (the sizes differ, so they do not fuse)
        f64 = be.placeholder(be.Axis(n, "EF"), dtype=np.float64)
        i32 = be.placeholder(be.Axis(n + 1, "EI"), dtype=np.int32)
        i64 = be.placeholder(be.Axis(n + 2, "EL"), dtype=np.int64)
        u8 = be.placeholder(be.Axis(n + 3, "EU"), dtype=np.uint8)
        return ([be.exp(f64) - f64, i32 * 3 - 7, i64 * i64 + 1, u8 + 5],
                [f64, i32, i64, u8],
                [rng.standard_normal(n), rng.integers(-1000, 1000, n + 1).astype(np.int32),
                 rng.integers(-2 ** 31, 2 ** 31, n + 2),
                 rng.integers(0, 250, n + 3).astype(np.uint8)])
    out["ew_dtypes"] = dtypes()

    def comparison():
        # int32 in, float32 out (a comparison): two types of one size
        i32 = be.placeholder(E, dtype=np.int32)
        return [be.greater(i32, 2) * 2.0], [i32], [rng.integers(-5, 9, n).astype(np.int32)]
    out["ew_comparison"] = comparison()
    X = be.Axis(n + 4, "EX")

    def misaligned():
        # starting at element 1 (4 bytes in): scalar; at element 4 (16 bytes): vectors
        x = be.placeholder(X)
        s1 = be.slice_along_axis(x, X, slice(1, None))
        s4 = be.slice_along_axis(x, X, slice(4, None))
        return ([s1 * 2.0 + 1.0, be.exp(s4) - s4], [x],
                [rng.standard_normal(n + 4).astype(np.float32)])
    out["ew_misaligned"] = misaligned()

    def mixed():
        # float32 and float64 operands: one vector cannot cover both
        a = be.placeholder(E)
        b = be.placeholder(E, dtype=np.float64)
        return ([a * 0.5 + b], [a, b], [rng.standard_normal(n).astype(np.float32),
                                        rng.standard_normal(n)])
    out["ew_mixed"] = mixed()
    R, C = be.Axis(3, "ER"), be.Axis(TILE - 300, "EC")

    def broadcast():
        # a bias along C and a number broadcast everywhere (stride 0): scalar
        x = be.placeholder((R, C))
        bias = be.placeholder(C)
        s = be.placeholder(())
        return ([be.tanh(x + bias) * s], [x, bias, s],
                [rng.standard_normal((3, TILE - 300)).astype(np.float32),
                 rng.standard_normal(TILE - 300).astype(np.float32), np.float32(1.5)])
    out["ew_broadcast"] = broadcast()
    return out


#: ``{graph: {elements: access}}``: how the elementwise kernels of the graphs of
#: :func:`_tile_graphs` move their elements (the end of their notes).
EW_ACCESS = {
    "ew_tiles": {2 * TILE: "16-byte vectors of 4", 2 * TILE + 37: "16-byte vectors of 4",
                 TILE - 1: "scalar", 1: "scalar"},
    "ew_dtypes": {2 * TILE + 37: "16-byte vectors of 2", 2 * TILE + 38: "16-byte vectors of 4",
                  2 * TILE + 39: "16-byte vectors of 2", 2 * TILE + 40: "scalar"},
    "ew_comparison": {2 * TILE + 37: "16-byte vectors of 4"},
    "ew_misaligned": {2 * TILE + 40: "scalar", 2 * TILE + 37: "16-byte vectors of 4"},
    "ew_mixed": {2 * TILE + 37: "scalar"},
    "ew_broadcast": {3 * (TILE - 300): "scalar"},
}


def _user_op_graph():
    softplus = be.elementwise_op(
        "SoftplusGPUTest", numpy=lambda x: np.logaddexp(0.0, x), derivative=be.sigmoid,
        cuda="__device__ float softplus_gpu_test(float x) { return log1pf(expf(-fabsf(x))) "
             "+ fmaxf(x, 0.0f); }")
    X = be.Axis(7, "X")
    x = be.placeholder(X)
    y = softplus(x) * 2.0
    return [y, be.deriv(be.sum(y, out_axes=()), x)], [x], [np.linspace(-3, 3, 7, dtype=np.float32)]


def _all_graphs():
    graphs = {}
    grad_names = {c.name for c in GRAD_CASES}
    for case in CASES:
        for dt in DTYPES:
            key = f"{case.name}-{np.dtype(dt).name}"
            graphs[key] = lambda case=case, dt=dt: _case_graph(
                case, dt, grad=case.name in grad_names)
    for name, g in _extra_graphs().items():
        graphs[name] = lambda g=g: g
    graphs["user_op"] = _user_op_graph
    return graphs


GRAPHS = _all_graphs()


def build_all(make_transformer):
    """``{name: (gpu computation, numpy computation, arrays)}`` for every graph, the
    GPU ones from ``make_transformer()`` (tests/test_gpu.py uses this on a GPU)."""
    out = {}
    for name, make in GRAPHS.items():
        results, xs, arrays, *options = make()
        with pytest.MonkeyPatch.context() as mp:
            if LARGE_TILES in options:
                mp.setattr(G, "gemm_config", lambda *a: G.GEMM_LARGE)
            gpu = make_transformer().computation(results, *xs)
        cpu = be.NumPyTransformer().computation(results, *xs)
        out[name] = (gpu, cpu, arrays)
    return out


def check_graph(name, gpu, cpu, arrays):
    """The GPU computation matches the NumPy one, twice (buffers are reused)."""
    want = cpu(*arrays)
    for _ in range(2):
        got = gpu(*arrays)
        for g, w in zip(got, want):
            _compare(g, w, LOOSE.get(name))


@pytest.fixture(scope="module")
def built():
    """``(emulator runtime, build_all(...))``; kernels are compiled by ``compiled``."""
    runtime = EmulatorRuntime(seed=3)
    return runtime, build_all(lambda: GPUTransformer(runtime=runtime))


@pytest.fixture(scope="module")
def nvcc_job(built, tmp_path_factory):
    """nvcc on every kernel, started in the background (it runs while the emulator
    compiles and runs): ``(process, kernels, ptx path)``."""
    if NVCC is None:
        pytest.skip("nvcc is not on PATH")
    ks = _kernels(built)
    folder = tmp_path_factory.mktemp("nvcc")
    src = folder / "all.cu"
    src.write_text(module_source(list(ks.values())))
    ptx = folder / "all.ptx"
    proc = subprocess.Popen([NVCC, "-ptx", "-arch=sm_90", "-o", str(ptx), str(src)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    yield proc, ks, ptx
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


def test_nvcc_started(nvcc_job):
    """Starts nvcc early so that it runs beside the emulator's tests."""
    assert nvcc_job[0].pid


def _kernels(built):
    ks = {}
    for gpu, _, _ in built[1].values():
        ks.update(gpu.kernels)
    return ks


# --- the emulator -------------------------------------------------------------------------

needs_cxx = pytest.mark.skipif(CXX is None, reason="no C++ compiler for the GPU emulator")


@pytest.fixture(scope="module")
def compiled(built):
    if CXX is None:
        pytest.skip("no C++ compiler for the GPU emulator")
    runtime, graphs = built
    runtime.compile(list(_kernels(built).values()))
    return graphs


def _compare(got, want, tol=None):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype
    if got.dtype.kind in "iub":
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, **(tol or TOL[np.dtype(got.dtype)]))


@needs_cxx
@pytest.mark.parametrize("name", list(GRAPHS))
def test_emulated_matches_numpy(name, compiled):
    check_graph(name, *compiled[name])


# --- nvcc (started by test_nvcc_started, before the emulator's tests; checked last) -----

@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")
def test_nvcc_compiles_every_kernel(nvcc_job):
    proc, ks, ptx = nvcc_job
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-5000:]
    assert "warning" not in err, err[-5000:]      # PyCUDA would show them to users
    kinds = {k.kind for k in ks.values()}
    assert {"ew", "reduce", "reduce_part", "gemm", "unslice", "transpose"} <= kinds, kinds
    text = ptx.read_text()
    entries = set(re.findall(r"\.entry\s+(\w+)\(", text))
    assert entries == set(ks), sorted(set(ks) ^ entries)[:5]
    # Every launch fits the device: <= 1024 threads, <= 48 KB of static shared memory.
    for k in ks.values():
        assert np.prod(k.block) <= 1024 and k.grid[1] < 65536 and k.grid[2] < 65536
    shared = re.findall(r"\.shared \.align \d+ \.b8 \w+\[(\d+)\]", text)
    assert shared and all(int(n) <= 48 * 1024 for n in shared)


# --- fusion, memory and hazards -------------------------------------------------------------

def _gpu(**kw):
    return GPUTransformer(runtime=EmulatorRuntime(seed=11), **kw)


@needs_cxx
def test_a_batch_longer_than_the_grid_is_looped_over_by_each_block(monkeypatch):
    monkeypatch.setattr(G, "GEMM_BATCH_BLOCKS", 4)
    a, b = be.np.placeholder((10, 5, 3), np.float64), be.np.placeholder((10, 3, 7), np.float64)
    f = _gpu().computation(a @ b, a, b)
    (k,) = [k for k in f.program.launches if k.kind == "gemm"]
    assert k.grid[2] == 4 and "bz < 10LL; bz += 4LL" in k.source
    rng = np.random.default_rng(5)
    va, vb = rng.standard_normal((10, 5, 3)), rng.standard_normal((10, 3, 7))
    np.testing.assert_allclose(f(va, vb), va @ vb, rtol=1e-13, atol=1e-13)


@needs_cxx
def test_a_product_of_two_dtypes_reads_both_in_its_own():
    # NumPy promotes float32 @ float64 to float64; the GEMM reads both operands in the
    # product's type, so the float32 one is converted first (it did not compile: the
    # kernel read a float buffer through a double pointer)
    a = be.np.placeholder((2, 4, 3), np.float32)
    b = be.np.placeholder((2, 3, 5), np.float64)
    for f in (_gpu().computation(a @ b, a, b), _gpu(gemm="generated").computation(a @ b, a, b)):
        assert f.program.launches and any(k.kind == "gemm" for k in f.program.launches)
        rng = np.random.default_rng(2)
        va = rng.standard_normal((2, 4, 3)).astype(np.float32)
        vb = rng.standard_normal((2, 3, 5))
        got = f(va, vb)
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, va.astype(np.float64) @ vb, rtol=1e-13, atol=1e-13)


def test_elementwise_chain_is_one_kernel_with_values_in_registers():
    X, Y = be.Axis(64, "X"), be.Axis(32, "Y")
    x, b = be.placeholder((X, Y)), be.placeholder(Y)
    h = x
    for _ in range(5):
        h = be.tanh(h * 2.0 + b)
    c = CudaCodegenTransformer().computation(h, x, b)
    assert [k.kind for k in c.program.launches] == ["ew"]
    (g,) = c.program.groups
    assert len(g.members) == 15 and len(g.internal) == 14   # only the result is stored
    assert c.program.arenas == []                             # nothing else needs memory
    src = c.source
    assert "tanhf(" in src and "15 elementwise op(s) over 2048 elements" in src
    assert "Tanh Tanh_" in src and "test_gpu_codegen.py" in src  # the user's line


def test_reduction_joins_the_elementwise_run_it_reads():
    X, Y = be.Axis(64, "X"), be.Axis(32, "Y")
    x = be.placeholder((X, Y))
    s = be.sum(be.exp(x) * 3.0, reduction_axes=Y)
    c = CudaCodegenTransformer().computation(s, x)
    assert [k.kind for k in c.program.launches] == ["reduce"]
    assert "ReduceSum of 64 row(s) of 32" in c.source and "expf(" in c.source


def test_fusion_and_memory_can_be_disabled():
    X = be.Axis(10, "X")
    x = be.placeholder(X)
    y = be.exp(x) + be.sin(x) * 2.0
    fused = CudaCodegenTransformer().computation(y, x)
    plain = CudaCodegenTransformer(disable=["fusion", "memory"]).computation(y, x)
    assert len(fused.program.launches) == 1 and len(plain.program.launches) == 4
    assert len(plain.program.arenas) == 3                     # one buffer per value


def test_views_are_strides_not_copies():
    X, Y = be.Axis(6, "X"), be.Axis(4, "Y")
    x = be.placeholder((X, Y))
    b = be.placeholder(X)
    y = be.axes_with_order(x, (Y, X)) + b                     # a transpose and a broadcast
    c = CudaCodegenTransformer().computation(y, x, b)
    assert [k.kind for k in c.program.launches] == ["ew"]
    assert "[(i / 6) + (i % 6) * 4]" in c.source              # x read through strides
    assert "[(i % 6)]" in c.source                           # b broadcast along Y


def test_reshape_of_a_transpose_gets_a_copy():
    X, Y, Z = be.Axis(3, "X"), be.Axis(4, "Y"), be.Axis(5, "Z")
    x = be.placeholder((X, Y, Z))
    t = CudaCodegenTransformer(dump_after=["views"], dump_file=open(os.devnull, "w"))
    c = t.computation(be.flatten(be.axes_with_order(x, (Z, X, Y))), x)
    assert "views" in [p.name for p in t.passes()]
    assert any(isinstance(op, pr.Copy) for op in c.ops)


def test_no_group_output_overlaps_a_read():
    # t2 (float64) must not take y's arena (float32, dead after t1 reads it): thread i
    # writing 8 bytes at 8 i would clobber y elements other threads still read. The
    # memory planner frees arenas released inside a group only when the group ends, so
    # the group stays whole and t2 gets a buffer of its own.
    A, A2, B = be.Axis(16, "A"), be.Axis(16, "A2"), be.Axis(8, "B")
    w, x = be.placeholder((A, B)), be.placeholder((B, A2))
    y = be.dot(w, x)                                          # a Gemm: y is in an arena
    big = be.constant(np.linspace(0, 1, 256).reshape(16, 16), axes=(A, A2))
    t1 = y * 2.0
    t2 = t1 + big                                             # needs a buffer: a Gemm reads it
    v = be.placeholder(A2, dtype=np.float64)
    r = be.dot(t2, v)
    c = CudaCodegenTransformer().computation(r, w, x, v)
    kinds = [k.kind for k in c.program.launches]
    assert kinds == ["gemm", "ew", "gemm"], kinds
    prog = c.program
    (g,) = [g for g in prog.groups if len(g.members) == 2]
    y_arena = prog.plan.slot[be.snap(y)]
    assert all(prog.plan.slot.get(m) != y_arena for m in g.members)
    if CXX is not None:
        rng = np.random.default_rng(0)
        vals = [rng.standard_normal((16, 8)).astype(np.float32),
                rng.standard_normal((8, 16)).astype(np.float32), rng.standard_normal(16)]
        ref = be.NumPyTransformer().computation(r, w, x, v)(*vals)
        got = _gpu().computation(r, w, x, v)(*vals)
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_assign_after_a_transposed_read_is_not_fused():
    A = be.Axis(8, "A")
    A2 = be.Axis(8, "A2")
    w = be.Variable((A, A2), initial_value=lambda s: np.arange(64.0).reshape(s))
    upd = be.SetItem(w, be.cast_axes(be.axes_with_order(w, (A2, A)), (A, A2)) + 1.0)
    c = CudaCodegenTransformer().computation(upd)
    # copy (of the transpose) and add fused; the assignment alone (its target is read
    # through a transpose in the group)
    assert len(c.program.launches) == 2
    if CXX is not None:
        t = _gpu()
        f = t.computation(upd)
        f()
        np.testing.assert_array_equal(t.state[w], np.arange(64.0).reshape(8, 8).T + 1)


def test_find_groups_closes_at_an_assign():
    A = be.Axis(8, "A")
    v = be.Variable(A)
    x = be.placeholder(A)
    c = CudaCodegenTransformer().computation([be.SetItem(v, x * 2.0), x + 1.0], x)
    g = c.program.groups
    assert all(not isinstance(m, pr.Assign) for grp in g for m in grp.members[:-1])


def test_unsupported_dtype_is_a_lowering_error():
    x = be.placeholder(be.Axis(3, "X"), dtype=np.complex64)
    with pytest.raises(be.LoweringError, match="complex64"):
        CudaCodegenTransformer().computation(x * 2, x)


def test_codegen_only_transformer_cannot_run():
    x = be.placeholder(be.Axis(3, "X"))
    c = CudaCodegenTransformer().computation(x * 2, x)
    with pytest.raises(be.GeonError, match="only generates code"):
        c(np.ones(3))


# --- fused elementwise kernels: whole tiles, the partial tile, 16-byte vectors ------------

def _ew_access(results, *xs):
    """``{elements: access}`` of the elementwise kernels of a computation (their notes
    end in the access: 16-byte vectors or scalar)."""
    c = CudaCodegenTransformer().computation(results, *xs)
    out = {}
    for k in c.program.launches:
        if k.kind == "ew":
            m = re.search(r"over (\d+) elements, (.*)\Z", k.note)
            out[int(m.group(1))] = m.group(2)
    return out


@pytest.mark.parametrize("name", sorted(EW_ACCESS))
def test_elementwise_kernels_use_vectors_where_every_access_fits(name):
    # (their values: test_emulated_matches_numpy on the same graphs)
    results, xs, _ = GRAPHS[name]()
    assert _ew_access(results, *xs) == EW_ACCESS[name]


def test_whole_tiles_are_unchecked_and_only_the_partial_tile_is_checked():
    for n in (2 * TILE, 2 * TILE + 5, TILE - 1):
        x = be.placeholder(be.Axis(n, "N"))
        c = CudaCodegenTransformer().computation(be.tanh(x) * 2.0, x)
        (k,) = c.program.launches
        whole, tail = n - n % TILE, n % TILE
        assert (f"start < {whole};" in k.source) == (whole > 0)
        # the loads' and the members' loops of the partial tile check i < n
        assert k.source.count("if (i < n)") == (2 if tail else 0)
        assert (f"const int base = (int){whole} + (int)threadIdx.x;" in k.source) == (tail > 0)
        assert k.grid == (-(-n // TILE), 1, 1)


def test_vector_accesses_are_16_byte_aligned(built):
    """Every pointer of a kernel with 16-byte vectors of V elements starts 16-byte
    aligned (its byte offset into its buffer: device allocations are 256-byte aligned)
    and points to elements of 16 / V bytes, so every vector of every thread is aligned."""
    from geon.transformers.gpu.cuda import C_TYPES
    size = {c: np.dtype(d).itemsize for d, c in C_TYPES.items()}
    ks = [k for k in _kernels(built).values() if "geon_load_vec(" in k.source
          or "geon_store_vec(" in k.source]
    assert len(ks) >= 6, [k.note for k in ks]
    for k in ks:
        V = int(re.search(r"16-byte vectors of (\d+)\Z", k.note).group(1))
        decls = k.source.split(k.name + "(", 1)[1].split(")", 1)[0].split(", ")
        types = [re.match(r"(?:const )?([\w ]+?)\*", d).group(1) for d in decls]
        assert all(size[t] * V == 16 for t in types), (k.note, decls)
        assert all(offset % 16 == 0 for _, offset in k.args), (k.note, k.args)


@needs_cxx
def test_in_place_update_in_vectors():
    # v = v / 2 + sigmoid(x): v is read and written through one pointer, in vectors
    E = be.Axis(2 * TILE + 3, "E")
    v = be.Variable(E, initial_value=lambda s: np.linspace(-1, 1, s[0]).astype(np.float32))
    x = be.placeholder(E)
    upd = be.SetItem(v, v * 0.5 + be.sigmoid(x))
    assert _ew_access([upd], x) == {E.length: "16-byte vectors of 4"}
    t, cpu = _gpu(), be.NumPyTransformer()
    f, g = t.computation(upd, x), cpu.computation(upd, x)
    X = np.linspace(-20, 20, E.length).astype(np.float32)
    for _ in range(3):
        f(X)
        g(X)
    np.testing.assert_allclose(t.state[v], cpu.state[v], rtol=1e-6, atol=1e-7)


def _ulps(a, b):
    """Units in the last place between float32 arrays (as integers on one line, so that
    -0 and 0 are 0 apart)."""
    def line(v):
        i = np.asarray(v, np.float32).view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)
    return np.abs(line(a) - line(b))


SIGMOID_POINTS = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 88.0, -88.0, 1e-30, -1e-30,
                           20.0, -20.0, 1.5, -1.5, 104.0, -104.0], np.float32)


@needs_cxx
def test_float32_sigmoid_at_the_edges():
    # the points twice: in the whole tile (16-byte vectors) and in the partial one
    sweep = np.linspace(-30, 30, TILE - len(SIGMOID_POINTS), dtype=np.float32)
    vals = np.concatenate([SIGMOID_POINTS, sweep, SIGMOID_POINTS])
    x = be.placeholder(be.Axis(len(vals), "S"))
    assert _ew_access([be.sigmoid(x)], x) == {len(vals): "16-byte vectors of 4"}
    got = _gpu().computation(be.sigmoid(x), x)(vals)
    assert got.dtype == np.float32
    with np.errstate(over="ignore"):
        numpy = np.float32(1) / (np.float32(1) + np.exp(-vals))    # NumPy's float32
    exact = (1 / (1 + np.exp(-vals.astype(np.float64)))).astype(np.float32)
    nan = np.isnan(vals)
    np.testing.assert_array_equal(np.isnan(got), nan)
    # NumPy's own float32 result is up to 2 ulp from the rounded exact value, so the
    # points are held to NumPy's result and the whole range to the exact one
    points = np.r_[0:len(SIGMOID_POINTS), len(vals) - len(SIGMOID_POINTS):len(vals)]
    points = points[~nan[points]]
    assert np.all(_ulps(got[points], numpy[points]) <= 2), (vals[points], got[points])
    assert np.all(_ulps(got[~nan], exact[~nan]) <= 2)
    np.testing.assert_array_equal(got[1:5], [1.0, 0.0, 0.5, 0.5])      # inf, -inf, 0, -0


# --- state on the device, checkpoints (emulator) ------------------------------------------

def _model(t):
    F, H = be.Axis(5, "F"), be.Axis(3, "H")
    N = be.Axis(4, "N", batch=True)
    x = be.placeholder((F, N), name="x")
    w = be.Variable((H, F), initial_value=lambda s: np.linspace(-1, 1, 15).reshape(s),
                    name="w")
    b = be.Variable(H, initial_value=0.5, name="b")
    steps = be.Variable((), initial_value=0, dtype=np.int64, trainable=False, name="steps")
    loss = be.sum(be.tanh(be.dot(w, x) + b) ** 2, out_axes=())
    gw, gb = be.deriv(loss, w), be.deriv(loss, b)
    train = t.computation([loss, be.SetItem(w, w - 0.1 * gw), be.SetItem(b, b - 0.1 * gb),
                           be.SetItem(steps, steps + 1)], x)
    return train, (w, b, steps)


X_TRAIN = np.linspace(-2, 2, 20).reshape(5, 4).astype(np.float32)


@needs_cxx
def test_state_lives_on_the_device_and_syncs_on_access():
    check_state_sync(_gpu)


def check_state_sync(make_gpu):
    """Device state and ``t.state``: reads see the device, writes reach it."""
    t = make_gpu()
    train, (w, b, steps) = _model(t)
    cpu = be.NumPyTransformer()
    train_cpu, (wc, bc, sc) = _model(cpu)
    for _ in range(3):
        np.testing.assert_allclose(train(X_TRAIN)[0], train_cpu(X_TRAIN)[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(t.state[w], cpu.state[wc], rtol=1e-5, atol=1e-6)
    assert int(t.state[steps]) == 3
    # reading copies nothing back to the device; the copy read cannot be written
    uploads, htod = [], t.runtime.htod
    variables = {int(t.state.device_buffer(v)) for v in t.state}

    def counting_htod(address, array):
        if address in variables:
            uploads.append(array.nbytes)
        htod(address, array)
    t.runtime.htod = counting_htod
    try:
        np.testing.assert_allclose(t.state[w], cpu.state[wc], rtol=1e-5, atol=1e-6)
        train(X_TRAIN)
        train_cpu(X_TRAIN)
        assert not uploads and not t.state.host_dirty
        with pytest.raises(ValueError, match="read-only"):
            t.state[b][...] = 0.0
        t.write_values({b: np.zeros(b.axes.shape)})  # a write reaches the device
        cpu.state[bc][...] = 0.0
        np.testing.assert_allclose(train(X_TRAIN)[0], train_cpu(X_TRAIN)[0], rtol=1e-5,
                                   atol=1e-6)
        assert uploads == [t.state[b].nbytes]
    finally:
        t.runtime.htod = htod
    t.initialize(force=True)
    assert int(t.state[steps]) == 0 and np.allclose(t.state[b], 0.5)
    assert set(t.state) == {w, b, steps} and len(t.state) == 3


@needs_cxx
def test_checkpoints_move_between_cpu_and_gpu(tmp_path):
    check_checkpoints(_gpu, tmp_path)


def check_checkpoints(make_gpu, tmp_path):
    """Saved on the CPU, restored on the GPU, trained, saved, restored on the CPU."""
    cpu = be.NumPyTransformer()
    train_cpu, (wc, bc, sc) = _model(cpu)
    for _ in range(2):
        train_cpu(X_TRAIN)
    cpu.save(tmp_path / "cpu.npz")

    gpu = make_gpu()
    train_gpu, (wg, bg, sg) = _model(gpu)
    gpu.restore(tmp_path / "cpu.npz")
    np.testing.assert_array_equal(gpu.state[wg], cpu.state[wc])
    assert int(gpu.state[sg]) == 2
    a, b = train_gpu(X_TRAIN)[0], train_cpu(X_TRAIN)[0]      # both continue alike
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    gpu.save(tmp_path / "gpu.npz")

    back = be.NumPyTransformer()
    train_back, (wb, bb, sb) = _model(back)
    back.restore(tmp_path / "gpu.npz")
    for v, g in [(wb, wg), (bb, bg), (sb, sg)]:  # bit for bit what the GPU held
        np.testing.assert_array_equal(back.state[v], gpu.state[g])
    np.testing.assert_allclose(back.state[wb], cpu.state[wc], rtol=1e-5, atol=1e-6)
    assert int(back.state[sb]) == 3
    with np.load(tmp_path / "gpu.npz") as f, np.load(tmp_path / "cpu.npz") as g:
        assert sorted(f.files) == sorted(g.files)   # one format (Transformer.save)
        manifests = [json.loads(d["geon-checkpoint.json"])["variables"] for d in (f, g)]
        assert [(e["name"], e["dtype"], e["shape"]) for e in manifests[0]] == \
            [(e["name"], e["dtype"], e["shape"]) for e in manifests[1]]
        assert sorted(e["name"] for e in manifests[0]) == ["b", "steps", "w"]
    with pytest.raises(be.CheckpointError):
        gpu.restore(tmp_path / "missing.npz")


@needs_cxx
def test_gpu_save_before_the_first_call_and_the_call_after_agree(tmp_path):
    """Saving initializes first; the initial values still reach the device."""
    gpu, cpu = _gpu(), be.NumPyTransformer()
    train_gpu, (wg, bg, sg) = _model(gpu)
    train_cpu, _ = _model(cpu)
    gpu.save(tmp_path / "fresh.npz")
    back = be.NumPyTransformer()
    _, (wb, bb, sb) = _model(back)
    back.restore(tmp_path / "fresh.npz")
    np.testing.assert_array_equal(back.state[wb],
                                  np.linspace(-1, 1, 15).reshape(3, 5).astype(np.float32))
    np.testing.assert_array_equal(back.state[bb], [0.5] * 3)
    np.testing.assert_allclose(train_gpu(X_TRAIN)[0], train_cpu(X_TRAIN)[0], rtol=1e-5)


@needs_cxx
def test_digits_example_trains_on_the_emulated_gpu(tmp_path, monkeypatch):
    check_digits(_gpu, tmp_path, monkeypatch, epochs=1, accuracy=0.85)


def check_digits(make_gpu, tmp_path, monkeypatch, epochs, accuracy):
    """The example trains on the GPU (its transformer swapped in) to the accuracy and
    loss the same training reaches on the CPU, and its checkpoint evaluates the same
    on the CPU."""
    from geon.examples import digits
    monkeypatch.setattr(be, "NumPyTransformer", make_gpu)
    r = digits.main(["--quiet", "--epochs", str(epochs), "--checkpoint",
                     str(tmp_path / "d.npz")])
    assert r["test_accuracy"] >= accuracy, r
    monkeypatch.undo()
    cpu = digits.main(["--quiet", "--epochs", str(epochs), "--checkpoint",
                       str(tmp_path / "cpu.npz")])
    # float32 sums in another order: the two trainings drift apart by rounding only
    assert abs(r["test_accuracy"] - cpu["test_accuracy"]) <= 2 / r["n_test"], (r, cpu)
    assert r["loss"] == pytest.approx(cpu["loss"], rel=1e-3), (r, cpu)
    again = digits.main(["--quiet", "--epochs", "0", "--resume", "--checkpoint",
                         str(tmp_path / "d.npz")])         # restored on the CPU
    assert abs(again["test_accuracy"] - r["test_accuracy"]) <= 1 / 359


def test_gemm_grid_swaps_axes_for_very_tall_products():
    params = K.Params()
    k = G.gemm_kernel(params, "pa", "pb", "pc", 128 * 70000, 8, 16, (16, 1), (8, 1),
                      np.float32, False, False, True, [])
    assert k.grid == (70000, 1, 1) and "blockIdx.x * 128, n0" in k.source


def test_updates_fuse_with_their_assignment():
    # The SGD updates of both layers are scheduled after the products that still read
    # the old weights, so each update is one kernel ending in its assignment.
    F, H, Y = be.Axis(6, "F"), be.Axis(5, "H"), be.Axis(4, "Y")
    N = be.Axis(3, "N", batch=True)
    x = be.placeholder((F, N))
    w1 = be.Variable((H, F), initial_value=lambda s: np.linspace(-1, 1, 30).reshape(s))
    w2 = be.Variable((Y, H), initial_value=lambda s: np.linspace(1, -1, 20).reshape(s))
    loss = be.sum(be.tanh(be.dot(w2, be.tanh(be.dot(w1, x)))) ** 2, out_axes=())
    ups = [be.SetItem(w, w - 0.1 * be.deriv(loss, w)) for w in (w1, w2)]
    c = CudaCodegenTransformer().computation([loss] + ups, x)
    assigns = [k for k in c.program.launches if any(isinstance(o, pr.Assign) for o in k.ops)]
    assert len(assigns) == 2 and all(len(k.ops) == 3 for k in assigns), \
        [[type(o).__name__ for o in k.ops] for k in assigns]
    if CXX is not None:
        t, cpu = _gpu(), be.NumPyTransformer()
        f, g = t.computation([loss] + ups, x), cpu.computation([loss] + ups, x)
        X = np.linspace(-1, 1, 18).reshape(6, 3)
        for _ in range(3):
            np.testing.assert_allclose(f(X)[0], g(X)[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(t.state[w1], cpu.state[w1], rtol=1e-5, atol=1e-6)


def test_every_standard_primitive_has_gpu_code():
    """A primitive added to the standard base set needs GPU rules too: an entry in
    geon.transformers.gpu.kernels.CUDA_KERNELS (what it launches alone) and, if it is
    elementwise, one in geon.transformers.gpu.cuda.CUDA_CODE or the C expressions it
    shares with the CPU (geon.transformers.c_expressions.C_EXPRESSIONS).
    Storage, views and outputs launch nothing."""
    from geon.op_graph import op_graph as og
    from geon.transformers.base import STANDARD_BASE_SET
    from geon.transformers.c_expressions import C_EXPRESSIONS
    from geon.transformers.gpu import CUDA_CODE, CUDA_KERNELS

    def has(table, cls):
        return any(k in table for k in cls.__mro__)

    launch_nothing = (og.AssignableTensorOp, pr.ViewOp, og.Output)
    missing = [c.__name__ for c in STANDARD_BASE_SET
               if not issubclass(c, launch_nothing)
               and not (has(CUDA_KERNELS, c)
                        and (not issubclass(c, og.ElementWise) or has(CUDA_CODE, c)
                             or has(C_EXPRESSIONS, c)))]
    assert not missing, missing


def test_an_op_without_gpu_code_is_a_lowering_error():
    """An op no CUDA_KERNELS entry covers fails by name when its kernels are made."""
    from geon.errors import LoweringError
    from geon.transformers.gpu.kernels import emit

    class Unknown:
        name, file_info = "mystery_op", "here.py:1"

    with pytest.raises(LoweringError, match="cannot run mystery_op"):
        emit(None, Unknown())


@needs_cxx
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sign_gives_numpys_bits(dtype):
    """sign(-0.0) is +0.0 and sign(NaN) is NaN, as in NumPy (bit for bit)."""
    C = be.Axis(6, "C")
    x = be.placeholder(C, dtype=dtype)
    f = _gpu().computation(be.sign(x), x)
    v = np.array([-0.0, 0.0, np.nan, -np.inf, 2.5, -1e-30], dtype)
    got, want = f(v), np.sign(v)
    assert got.tobytes() == want.tobytes(), (got, want)
