"""The PyCUDA runtime without a GPU: geon's calls into pycuda, the CUDA driver (graphs)
and cuBLAS, against stand-ins that run on the CPU emulator (tests/cuda_emulator.py).

The stand-ins model what the real libraries document: launches and cuBLAS calls made
on a stream while it captures are recorded into the graph instead of running; a graph
launch runs what was recorded; cuBLAS reads column-major matrices. They check how
geon drives these libraries, not the libraries themselves (tests/test_gpu.py runs the
same paths on a GPU). Enqueued work runs at once here and events are done when
recorded, so the tests of asynchronous copies check the order of geon's calls (a
staging buffer refilled only after a wait on the fence of its last copy), not timing.
"""

import ctypes
import sys
import types
import warnings

import numpy as np
import pytest

import geon as be
from geon.transformers.gpu import GPUTransformer, runtime
from cuda_emulator import EmulatorRuntime
from test_gpu_codegen import X_TRAIN, _model, needs_cxx

STREAM = 0x5E7  # the stand-in stream's handle


class _Device:
    """What the stand-ins share: the calls made, the pinned arrays handed out, and the
    stream's capture (a list of recorded calls, or None)."""

    def __init__(self):
        self.calls = []
        self.pinned = []
        self.capturing = None
        self.graphs = {}

    def enqueue(self, stream, work, what):
        """Run ``work`` now, or record it if ``stream`` is capturing."""
        assert stream == STREAM, f"{what} on stream {stream}, not the runtime's"
        if self.capturing is not None:
            self.capturing.append((work, what))
            return
        self.calls.append(what)
        work()

    def is_pinned(self, a):
        base = a
        while isinstance(base, np.ndarray) and base.base is not None:
            base = base.base
        return any(base is p for p in self.pinned)


def _stand_in_pycuda(monkeypatch):
    """Modules ``pycuda``, ``pycuda.driver``, ``pycuda.compiler``, ``pycuda.tools`` with
    the calls geon's runtime makes (as PyCUDA documents them), backed by host memory and
    the emulator, and a stand-in CUDA driver library for the graph calls. Returns the
    shared :class:`_Device` (its ``calls`` list records what ran)."""
    import cuda_emulator as emulator
    dev = _Device()
    calls = dev.calls
    emu = EmulatorRuntime(seed=5)

    drv = types.ModuleType("pycuda.driver")
    drv.init = lambda: calls.append("init")

    class Context:
        def push(self):
            calls.append("push")

        def pop(self):
            calls.append("pop")

        @staticmethod
        def synchronize():
            calls.append("sync")

    class Device:
        def __init__(self, ordinal):
            assert ordinal == 0

        count = staticmethod(lambda: 1)
        name = lambda self: "Stand-in GPU"  # noqa: E731
        pci_bus_id = lambda self: "0000:00:00.0"  # noqa: E731
        compute_capability = lambda self: (9, 0)  # noqa: E731
        retain_primary_context = lambda self: Context()  # noqa: E731

    class Stream:
        handle = STREAM

        def __init__(self, flags=0):
            assert flags == 0  # a blocking stream: ordered with the default stream

        def synchronize(self):
            calls.append("stream sync")

    class Event:
        def record(self, stream):
            assert stream.handle == STREAM
            calls.append("record")
            return self

        def synchronize(self):
            calls.append("event sync")
            return self

    drv.Device, drv.Context, drv.Stream, drv.Event = Device, Context, Stream, Event
    drv.mem_alloc = lambda n: emu.alloc(n)
    drv.mem_get_info = lambda: (80 << 30, 80 << 30)   # (free, total) bytes

    def pagelocked_empty(shape, dtype):
        a = np.empty(shape, dtype)
        dev.pinned.append(a)
        return a
    drv.pagelocked_empty = pagelocked_empty

    def memcpy_htod(dest, src):
        assert isinstance(dest, int) and src.flags.c_contiguous
        assert dev.capturing is None  # a synchronous copy would end a capture
        ctypes.memmove(dest, src.ctypes.data, src.nbytes)

    def memcpy_dtoh(dest, src):
        assert isinstance(src, int) and dest.flags.c_contiguous and dest.flags.writeable
        assert dev.capturing is None
        ctypes.memmove(dest.ctypes.data, src, dest.nbytes)

    def memcpy_htod_async(dest, src, stream):
        assert isinstance(dest, int) and src.flags.c_contiguous and dev.is_pinned(src)
        dev.enqueue(stream.handle, lambda: ctypes.memmove(dest, src.ctypes.data, src.nbytes),
                    "htod_async")

    def memcpy_dtoh_async(dest, src, stream):
        assert isinstance(src, int) and dest.flags.c_contiguous and dev.is_pinned(dest)
        dev.enqueue(stream.handle, lambda: ctypes.memmove(dest.ctypes.data, src, dest.nbytes),
                    "dtoh_async")
    drv.memcpy_htod, drv.memcpy_dtoh = memcpy_htod, memcpy_dtoh
    drv.memcpy_htod_async, drv.memcpy_dtoh_async = memcpy_htod_async, memcpy_dtoh_async
    drv.memcpy_dtod = lambda d, s, n: ctypes.memmove(int(d), int(s), n)

    comp = types.ModuleType("pycuda.compiler")

    class SourceModule:
        def __init__(self, source, no_extern_c=False, arch=None, **kw):
            assert no_extern_c and arch == "sm_90" and not kw
            calls.append("compile")
            emulator._get_scheduler()  # the kernels link against it
            self.lib = ctypes.CDLL(emulator._build(emulator.SHIM + source, "standin"))

        def get_function(self, name):
            return Function(ctypes.cast(getattr(self.lib, name), ctypes.c_void_p).value,
                            name)

    class Function:
        def __init__(self, address, name):
            self.address, self.name, self.format = address, name, None

        def prepare(self, fmt):
            assert set(fmt) <= {"P"}
            self.format = fmt

        def prepared_async_call(self, grid, block, stream, *args):
            assert self.format is not None and len(args) == len(self.format)
            # geon passes a grid's z dimension only where it uses it
            assert len(grid) == 2 or len(grid) == 3 and grid[2] > 1, grid
            assert len(block) == 3
            arr = (ctypes.c_void_p * max(1, len(args)))(*args)
            gz = grid[2] if len(grid) == 3 else 1

            def launch():
                rc = emulator._get_scheduler().geon_emu_launch(
                    self.address, len(args), arr, grid[0], grid[1], gz, *block, 1)
                assert rc == 0, self.name
            calls.append("launch call")  # a Python-level launch, captured or not
            dev.enqueue(stream.handle, launch, "launch")
    comp.SourceModule = SourceModule
    tools = types.ModuleType("pycuda.tools")
    tools.clear_context_caches = lambda: None
    pkg = types.ModuleType("pycuda")
    pkg.__path__ = []
    pkg.driver, pkg.compiler, pkg.tools = drv, comp, tools
    for name, mod in [("pycuda", pkg), ("pycuda.driver", drv), ("pycuda.compiler", comp),
                      ("pycuda.tools", tools)]:
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setattr(runtime, "_runtimes", {})
    monkeypatch.setattr(runtime, "_driver_library", lambda: _stand_in_driver(dev))
    monkeypatch.setattr(runtime, "_cublas_library", _no_cublas)
    return dev


def _no_cublas():
    raise ImportError("cuBLAS (libcublas.so) was not found (stand-in)")


def _out(pointer, value):
    """Write ``value`` through a ``ctypes.byref`` argument."""
    pointer._obj.value = value


def _stand_in_driver(dev, fail_capture=False):
    """The CUDA driver's graph calls (as the driver API documents them)."""
    lib = types.SimpleNamespace()

    def begin(stream, mode):
        assert stream == STREAM and mode == runtime.CAPTURE_THREAD_LOCAL
        if fail_capture:
            return 900  # CUDA_ERROR_NOT_PERMITTED
        assert dev.capturing is None
        dev.capturing = []
        dev.calls.append("begin capture")
        return 0

    def end(stream, graph):
        recorded, dev.capturing = dev.capturing, None
        dev.graphs[id(recorded)] = recorded
        _out(graph, id(recorded))
        dev.calls.append("end capture")
        return 0

    def instantiate(exe, graph, flags):
        _out(exe, graph)
        return 0

    def launch(exe, stream):
        assert stream == STREAM
        dev.calls.append("graph launch")
        for work, what in dev.graphs[exe]:
            work()
        return 0

    def error_name(rc, name):
        _out(name, b"CUDA_ERROR_NOT_PERMITTED" if rc == 900 else b"?")
        return 0
    lib.cuStreamBeginCapture_v2, lib.cuStreamEndCapture = begin, end
    lib.cuGraphInstantiateWithFlags, lib.cuGraphLaunch = instantiate, launch
    lib.cuGraphDestroy = lambda graph: 0
    lib.cuGraphExecDestroy = lambda exe: 0
    lib.cuGetErrorName = error_name
    return lib


def _stand_in_cublas(dev):
    """cuBLAS's calls that geon makes, on host memory: column-major GEMM."""
    lib = types.SimpleNamespace()
    state = {}

    def create(handle):
        _out(handle, 77)
        state["handles"] = state.get("handles", 0) + 1
        return 0

    def destroy(handle):
        assert handle == 77
        state["handles"] -= 1
        return 0

    def set_stream(handle, stream):
        assert handle == 77
        state["stream"] = stream
        return 0

    def set_math_mode(handle, mode):
        state["math"] = mode
        return 0

    def set_workspace(handle, address, size):
        state["workspace"] = (address, size)
        return 0

    def product(dtype, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc):
        """C = alpha op(A) op(B) + beta C, column-major, on host memory."""
        item = np.dtype(dtype).itemsize

        def matrix(address, rows, cols, ld):  # column-major, ld between columns
            raw = (ctypes.c_char * (item * (ld * (cols - 1) + rows))).from_address(address)
            flat = np.frombuffer(raw, dtype=dtype)
            return np.lib.stride_tricks.as_strided(flat, (rows, cols), (item, ld * item))

        a = matrix(A, *((m, k) if ta == 0 else (k, m)), lda)
        b = matrix(B, *((k, n) if tb == 0 else (n, k)), ldb)
        a, b = (a if ta == 0 else a.T), (b if tb == 0 else b.T)
        al = np.frombuffer((ctypes.c_char * item).from_address(alpha), dtype)[0]
        be_ = np.frombuffer((ctypes.c_char * item).from_address(beta), dtype)[0]
        c = matrix(C, m, n, ldc)
        c[...] = al * (a.astype(np.float64) @ b) + (be_ * c if be_ else 0)

    def gemm(dtype):
        def call(handle, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc):
            def work():
                product(dtype, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc)
            dev.enqueue(state["stream"], work, ("gemm", ta, tb, m, n, k, lda, ldb, ldc))
            return 0
        return call

    def gemm_strided_batched(dtype):
        # matrix i of each operand starts stride * i elements after its first (a stride
        # of 0 reads one matrix for every product)
        item = np.dtype(dtype).itemsize

        def call(handle, ta, tb, m, n, k, alpha, A, lda, sa, B, ldb, sb, beta, C, ldc, sc,
                 count):
            assert min(sa, sb) >= 0 and sc >= m * n and count > 0

            def work():
                for i in range(count):
                    product(dtype, ta, tb, m, n, k, alpha, A + i * sa * item, lda,
                            B + i * sb * item, ldb, beta, C + i * sc * item, ldc)
            dev.enqueue(state["stream"], work, ("gemm_strided_batched", ta, tb, m, n, k,
                                                lda, sa, ldb, sb, ldc, sc, count))
            return 0
        return call
    lib.cublasCreate_v2, lib.cublasSetStream_v2 = create, set_stream
    lib.cublasDestroy_v2 = destroy
    lib.cublasSetMathMode, lib.cublasSetWorkspace_v2 = set_math_mode, set_workspace
    lib.cublasSgemm_v2, lib.cublasDgemm_v2 = gemm(np.float32), gemm(np.float64)
    lib.cublasSgemmStridedBatched = gemm_strided_batched(np.float32)
    lib.cublasDgemmStridedBatched = gemm_strided_batched(np.float64)
    return lib, state


# --- launches, copies and graphs --------------------------------------------------------

@needs_cxx
def test_pycuda_runtime_drives_pycuda_as_documented(monkeypatch, tmp_path):
    dev = _stand_in_pycuda(monkeypatch)
    calls = dev.calls
    from geon.transformers.gpu import gpu_status
    assert gpu_status() == (True, "")
    t = be.make_transformer("gpu")
    assert t.runtime.key == "Stand-in GPU (0000:00:00.0, sm_90)"
    train, (w, b, steps) = _model(t)
    cpu = be.NumPyTransformer()
    train_cpu, (wc, bc, sc) = _model(cpu)
    per_call = []
    for k in range(4):
        before = len(calls)
        np.testing.assert_allclose(train(X_TRAIN + k)[0], train_cpu(X_TRAIN + k)[0],
                                   rtol=1e-5, atol=1e-6)
        per_call.append(calls[before:])
    assert calls.count("compile") == 1 and calls[:2] == ["init", "init"]
    kernels = per_call[0].count("launch")
    assert kernels >= 2
    # the feed goes in and the loss comes out by asynchronous copies through pinned
    # buffers, then the call waits for the stream
    assert per_call[0][0] == "compile"
    for c in [per_call[0][1:]] + per_call[1:]:
        assert c[0] == "htod_async" and c[-2:] == ["dtoh_async", "stream sync"], c
    # the first call launches one by one; the second captures them and launches the
    # graph; later calls launch the graph only: no launch made from Python
    assert "begin capture" not in per_call[0]
    assert per_call[1].count("launch call") == kernels and "graph launch" in per_call[1]
    for c in per_call[2:]:
        assert c.count("graph launch") == 1 and "launch call" not in c, c
    np.testing.assert_allclose(t.state[w], cpu.state[wc], rtol=1e-5, atol=1e-6)
    t.save(tmp_path / "m.npz")
    t.synchronize()
    assert "sync" in calls
    with pytest.raises(be.GeonError, match="needs a working cuBLAS"):
        GPUTransformer(gemm="cublas")


@needs_cxx
def test_without_graphs_kernels_are_launched_one_by_one(monkeypatch):
    dev = _stand_in_pycuda(monkeypatch)
    t = GPUTransformer(cuda_graphs=False)
    assert "cuda_graphs=False" in repr(t)
    train, _ = _model(t)
    for _ in range(3):
        train(X_TRAIN)
    assert "begin capture" not in dev.calls and "graph launch" not in dev.calls


@needs_cxx
def test_a_failed_capture_warns_and_keeps_the_launch_list(monkeypatch):
    dev = _stand_in_pycuda(monkeypatch)
    monkeypatch.setattr(runtime, "_driver_library",
                        lambda: _stand_in_driver(dev, fail_capture=True))
    t = GPUTransformer()
    train, _ = _model(t)
    cpu = be.NumPyTransformer()
    train_cpu, _ = _model(cpu)
    train(X_TRAIN), train_cpu(X_TRAIN)
    with pytest.warns(RuntimeWarning, match="capturing a CUDA graph failed "
                                            r"\(gpu: cuStreamBeginCapture failed "
                                            r"\(CUDA_ERROR_NOT_PERMITTED\)\)"):
        got = train(X_TRAIN)[0]
    np.testing.assert_allclose(got, train_cpu(X_TRAIN)[0], rtol=1e-5, atol=1e-6)
    before = len(dev.calls)
    np.testing.assert_allclose(train(X_TRAIN)[0], train_cpu(X_TRAIN)[0], rtol=1e-5,
                               atol=1e-6)
    assert "launch" in dev.calls[before:] and "graph launch" not in dev.calls


@needs_cxx
def test_staging_buffers_are_reused_only_after_their_copies(monkeypatch):
    """A call with feeds and no results returns without waiting; the next call waits
    for the copies out of the staging buffers before it overwrites them."""
    dev = _stand_in_pycuda(monkeypatch)
    t = GPUTransformer()
    C = be.Axis(4, "C")
    x = be.placeholder(C, name="x")
    v = be.Variable(C, initial_value=0.0, name="v")
    f = t.computation(be.SetItem(v, v + x), x)
    before = len(dev.calls)
    f(np.ones(4, np.float32))
    first = dev.calls[before:]
    assert first[-1] == "record" and "stream sync" not in first
    before = len(dev.calls)
    f(np.full(4, 2.0, np.float32))
    assert dev.calls[before:before + 2] == ["event sync", "htod_async"]
    np.testing.assert_array_equal(t.state[v], [3.0] * 4)


def test_host_copies_in_pieces(monkeypatch):
    monkeypatch.setattr(runtime, "PARALLEL_COPY_BYTES", 1 << 12)
    monkeypatch.setattr(runtime, "COPY_CHUNK_BYTES", 1 << 12)
    src = np.random.default_rng(0).standard_normal((300, 101))  # 242,400 bytes
    dst = np.empty_like(src)
    seen = []
    runtime.host_copy(dst, src, lambda lo, hi: seen.append((lo, hi)))
    np.testing.assert_array_equal(dst, src)
    assert len(seen) == runtime.COPY_THREADS or runtime.COPY_THREADS == 1
    assert seen[0][0] == 0 and seen[-1][1] == src.nbytes
    assert all(a[1] == b[0] for a, b in zip(seen, seen[1:]))  # in order, no gaps
    assert all(lo % 4096 == 0 for lo, _ in seen)
    seen.clear()
    runtime.host_copy(dst, src[:, ::-1], lambda lo, hi: seen.append((lo, hi)))
    np.testing.assert_array_equal(dst, src[:, ::-1])  # not contiguous: one copy
    assert seen == [(0, src.nbytes)]


# --- cuBLAS -----------------------------------------------------------------------------

@pytest.mark.parametrize("rows,cols,strides,expected", [
    (3, 4, (4, 1), (runtime.CUBLAS_OP_N, 4)),      # contiguous rows
    (3, 4, (9, 1), (runtime.CUBLAS_OP_N, 9)),      # rows of a wider matrix
    (3, 4, (1, 3), (runtime.CUBLAS_OP_T, 3)),      # a transposed contiguous matrix
    (3, 4, (1, 5), (runtime.CUBLAS_OP_T, 5)),
    (1, 4, (0, 1), (runtime.CUBLAS_OP_N, 4)),      # one row: its stride is free
    (1, 4, (0, 3), (runtime.CUBLAS_OP_T, 3)),      # one strided row
    (3, 1, (7, 0), (runtime.CUBLAS_OP_N, 7)),      # one column
    (3, 4, (0, 1), None),                          # a broadcast
    (3, 4, (4, -1), None),                         # reversed
    (3, 4, (8, 2), None),                          # no unit stride
    (3, 4, (2, 1), None),                          # overlapping rows
])
def test_blas_operand(rows, cols, strides, expected):
    assert runtime.blas_operand(rows, cols, strides) == expected


@needs_cxx
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cublas_drives_cublas_as_documented(monkeypatch, dtype):
    dev = _stand_in_pycuda(monkeypatch)
    lib, state = _stand_in_cublas(dev)
    monkeypatch.setattr(runtime, "_cublas_library", lambda: lib)
    t = GPUTransformer()  # gemm="auto" takes cuBLAS where it works
    assert state["stream"] == STREAM and state["math"] == runtime.CUBLAS_DEFAULT_MATH
    assert state["workspace"][1] == runtime.CuBlas.WORKSPACE_BYTES
    M, Kx, N = be.Axis(5, "M"), be.Axis(3, "Kx"), be.Axis(4, "N")
    a, bt = be.placeholder((M, Kx), dtype=dtype), be.placeholder((N, Kx), dtype=dtype)
    f = t.computation(be.tanh(be.dot(a, bt)), a, bt)
    rng = np.random.default_rng(2)
    va, vb = rng.standard_normal((5, 3)).astype(dtype), rng.standard_normal((4, 3)).astype(dtype)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == np.float32 else dict(rtol=1e-12)
    for _ in range(3):  # launched, captured, replayed
        np.testing.assert_allclose(f(va, vb), np.tanh(va.astype(np.float64) @ vb.T), **tol)
    gemms = [c for c in dev.calls if isinstance(c, tuple)]
    # the self-test product, then ours: C^T (4 x 5) = op(B) (4 x 3) @ op(A) (3 x 5), B
    # read through its transpose (op T, ld 3), A as stored (op N, ld 3)
    assert gemms[0][:6] == ("gemm", 0, 0, 4, 2, 3)
    assert gemms[1] == ("gemm", runtime.CUBLAS_OP_T, runtime.CUBLAS_OP_N, 4, 5, 3, 3, 3, 4)
    # the second call captured the product into the graph, and both later calls ran it
    # from there: no cuBLAS call made from Python after the first
    assert len(gemms) == 2 and dev.calls.count("graph launch") == 2


@needs_cxx
def test_products_cublas_cannot_take_use_the_generated_gemm(monkeypatch):
    dev = _stand_in_pycuda(monkeypatch)
    lib, _ = _stand_in_cublas(dev)
    monkeypatch.setattr(runtime, "_cublas_library", lambda: lib)
    M, Kx, N = be.Axis(5, "M"), be.Axis(3, "Kx"), be.Axis(4, "N")
    a, b = be.placeholder((M, Kx), dtype=np.int32), be.placeholder((Kx, N), dtype=np.int32)
    f = GPUTransformer().computation(be.dot(a, b), a, b)
    va, vb = np.arange(15, dtype=np.int32).reshape(5, 3), np.arange(12, dtype=np.int32).reshape(3, 4)
    np.testing.assert_array_equal(f(va, vb), va @ vb)
    assert len([c for c in dev.calls if isinstance(c, tuple)]) == 1  # the self-test only


@needs_cxx
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_batched_products_are_one_strided_batched_cublas_call(monkeypatch, dtype):
    dev = _stand_in_pycuda(monkeypatch)
    lib, _ = _stand_in_cublas(dev)
    monkeypatch.setattr(runtime, "_cublas_library", lambda: lib)
    t = GPUTransformer()
    q = be.np.placeholder((3, 2, 5, 4), dtype=dtype)
    k = be.np.placeholder((3, 2, 4, 6), dtype=dtype)
    kt = be.np.placeholder((3, 2, 6, 4), dtype=dtype)
    w = be.np.placeholder((5, 4), dtype=dtype)
    x = be.np.placeholder((2, 1, 5, 4), dtype=dtype)
    kb = be.np.placeholder((7, 4, 6), dtype=dtype)
    results = [q @ k,                               # attention-like: one stride each
               q @ be.np.swapaxes(kt, -1, -2),      # B read through its transpose
               w @ k,                               # A broadcast: stride 0
               x @ kb]                              # batch dimensions that do not merge
    f = t.computation(results, q, k, kt, w, x, kb)
    rng = np.random.default_rng(4)
    vals = [rng.standard_normal(be.np.shape(p)).astype(dtype) for p in (q, k, kt, w, x, kb)]
    vq, vk, vkt, vw, vx, vkb = (v.astype(np.float64) for v in vals)
    want = [vq @ vk, vq @ np.swapaxes(vkt, -1, -2), vw @ vk, vx @ vkb]
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == np.float32 else dict(rtol=1e-12)
    for _ in range(2):  # launched, then captured and replayed
        for got, expect in zip(f(*vals), want):
            np.testing.assert_allclose(got, expect, **tol)
    calls = [c for c in dev.calls if isinstance(c, tuple) and c[0] == "gemm_strided_batched"]
    N_, T_ = runtime.CUBLAS_OP_N, runtime.CUBLAS_OP_T
    # column-major C^T = B^T A^T per product: (name, op(B), op(A), N, M, K, ldb, stride
    # of B, lda, stride of A, ldc, stride of C, count)
    assert sorted(calls) == sorted([
        ("gemm_strided_batched", N_, N_, 6, 5, 4, 6, 24, 4, 20, 6, 30, 6),
        ("gemm_strided_batched", T_, N_, 6, 5, 4, 4, 24, 4, 20, 6, 30, 6),
        ("gemm_strided_batched", N_, N_, 6, 5, 4, 6, 24, 4, 0, 6, 30, 6)])
    # the product whose batch cannot be one stride per operand ran the generated GEMM
    (gen,) = [k for k in f.program.launches if k.kind == "gemm" and k.library.batch
              and len(k.library.batch) == 2]
    assert gen.grid[2] == 14 and not t._blas.accepts(gen.library)


@needs_cxx
def test_without_cublas_auto_uses_the_generated_gemm(monkeypatch):
    _stand_in_pycuda(monkeypatch)  # (its cuBLAS cannot be found)
    t = GPUTransformer()
    assert t._blas is None and t.gemm == "auto"
    with pytest.raises(be.GeonError, match="gemm='cublas' needs a working cuBLAS: "
                                           r"cuBLAS \(libcublas.so\) was not found"):
        GPUTransformer(gemm="cublas")


@needs_cxx
def test_a_failing_cublas_warns_once_and_auto_uses_the_generated_gemm(monkeypatch):
    dev = _stand_in_pycuda(monkeypatch)
    lib, state = _stand_in_cublas(dev)
    lib.cublasSetMathMode = lambda handle, mode: 13  # CUBLAS_STATUS_EXECUTION_FAILED
    monkeypatch.setattr(runtime, "_cublas_library", lambda: lib)
    with pytest.warns(RuntimeWarning, match=r"cuBLAS does not work here \(cuBLAS: "
                                            r"cublasSetMathMode failed \(status 13\)\)"):
        t = GPUTransformer()
    assert t._blas is None
    assert state["handles"] == 0  # the handle made before the failure was destroyed
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the runtime remembers: no second warning
        assert GPUTransformer()._blas is None


@needs_cxx
def test_calls_of_transformers_on_one_device_take_turns(monkeypatch):
    """They share the runtime's stream, which a graph capture must have to itself."""
    _stand_in_pycuda(monkeypatch)
    a, b = GPUTransformer(), GPUTransformer()
    assert a._lock is b._lock is a.runtime.lock


@needs_cxx
def test_an_error_during_a_capture_ends_it_and_keeps_the_launch_list(monkeypatch):
    """A launch that fails while captured ends the capture (and frees what it made);
    the computation warns and launches one by one."""
    dev = _stand_in_pycuda(monkeypatch)
    lib = _stand_in_driver(dev)
    destroyed = []
    lib.cuGraphDestroy = lambda graph: destroyed.append(graph) or 0
    monkeypatch.setattr(runtime, "_driver_library", lambda: lib)
    t = GPUTransformer()
    train, _ = _model(t)
    cpu = be.NumPyTransformer()
    train_cpu, _ = _model(cpu)
    train(X_TRAIN), train_cpu(X_TRAIN)
    run = t.computations[0]._run_kernels.run

    def failing_in_capture():
        if dev.capturing is not None:
            raise RuntimeError("cuLaunchKernel failed: an illegal instruction (stand-in)")
        run()
    t.computations[0]._run_kernels.run = failing_in_capture
    with pytest.warns(RuntimeWarning, match="capturing a CUDA graph failed .*illegal"):
        got = train(X_TRAIN)[0]
    np.testing.assert_allclose(got, train_cpu(X_TRAIN)[0], rtol=1e-5, atol=1e-6)
    assert dev.capturing is None and len(destroyed) == 1


@needs_cxx
def test_results_read_through_strides_and_copied_out_each_call():
    """A result that is a transposed view of a feed comes back through a pinned buffer
    of its span; each call's values are the caller's own (the buffer is reused)."""
    t = GPUTransformer(runtime=EmulatorRuntime(seed=2))
    A, B = be.Axis(30, "A"), be.Axis(11, "B")
    x = be.placeholder((A, B), name="x")
    f = t.computation([x + 1.0, be.axes_with_order(x, (B, A))], x)
    assert f.program.results[1].strides == (1, 11)  # read through the feed's strides
    kept = []
    for k in range(3):
        xv = np.arange(330, dtype=np.float32).reshape(30, 11) * (k + 1)
        plus, tr = f(xv)
        np.testing.assert_array_equal(plus, xv + 1)
        np.testing.assert_array_equal(tr, xv.T)
        kept.append((xv, plus, tr))
    for xv, plus, tr in kept:
        np.testing.assert_array_equal(tr, xv.T)
        np.testing.assert_array_equal(plus, xv + 1)
