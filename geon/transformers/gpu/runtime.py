"""The PyCUDA runtime: device memory, compilation with a cache, copies and launches on
one stream, CUDA graphs, and matrix products by cuBLAS.

Nothing here is imported unless a GPU transformer is made. :func:`gpu_status` says
whether one can be (pycuda importable, the CUDA driver loadable, a device present)
without raising.

A runtime offers:

- ``alloc(nbytes) -> buffer`` (``int(buffer)`` is its device address);
- synchronous copies ``htod(address, array)``, ``dtoh(array, address)`` and
  ``copy(dst, src, nbytes)`` (device to device);
- ``pinned(shape, dtype)``: a host array in page-locked memory, from which and into
  which the device copies asynchronously; ``upload(address, staging, array)``: ``array``
  to the device through ``staging`` (a pinned array of its shape and dtype), enqueued
  on the runtime's stream; ``download(pinned, address)``: a copy into a pinned array,
  enqueued; ``take(pinned)``: an ordinary array holding a copy of a pinned one;
- ``fence()``: a marker after the work enqueued so far (``fence().wait()`` blocks until
  it is done); ``finish()`` waits for the stream, ``synchronize()`` for the device;
- ``compile(kernels)`` (each kernel once per device: the cache is keyed by the
  kernel's name, which holds a hash of its source, and lives in the runtime of that
  device); ``launcher(launches, blas)`` (a function that enqueues a list of ``(kernel,
  grid, block, addresses)``, matrix products going to ``blas`` where it takes them);
  ``graph(run)`` (a function replaying what ``run`` enqueues as one CUDA graph, or
  ``None`` where graphs are not available); ``blas_for(choice)``.

The test suite's CPU emulator (tests/cuda_emulator.py) offers the same, without a
stream or graphs, and is passed as ``GPUTransformer(runtime=...)``.
"""

import atexit
import concurrent.futures
import ctypes
import glob
import os
import shutil
import sys
import threading
import time
import warnings

import numpy as np

from geon._logging import get_logger
from geon.errors import ArgumentError, GeonError

logger = get_logger(__name__)

_runtimes = {}

#: Why the GPU transformer cannot be made without pycuda, and what to do.
PYCUDA_MISSING = (
    "pycuda is not installed (pip install -e '.[gpu]' in a checkout of geon, or "
    "pip install pycuda); building pycuda needs the CUDA toolkit: its headers "
    "(cuda.h) and nvcc, found through CUDA_ROOT (e.g. export CUDA_ROOT=/usr/local/cuda) "
    "or nvcc on PATH; see doc/gpu.rst")

#: What to do when pycuda is installed but ``pycuda.driver`` does not import.
DRIVER_ADVICE = (
    "check that the NVIDIA driver is installed (nvidia-smi works, libcuda.so is found), "
    "and that pycuda was built against this machine's CUDA toolkit (rebuild it with "
    "CUDA_ROOT set: pip install --force-reinstall --no-cache-dir --no-binary pycuda "
    "pycuda)")


def compile_failure(error):
    """A :class:`GeonError` saying what to do when pycuda could not compile kernels
    because nvcc is missing, else ``None`` (the original error stands)."""
    if shutil.which("nvcc") is not None:
        return None
    var = next((v for v in ("CUDA_ROOT", "CUDA_HOME") if os.environ.get(v)), None)
    where = (f"add {os.path.join(os.environ[var], 'bin')} ({var}'s bin folder) to PATH"
             if var else "add the CUDA toolkit's bin folder to PATH (export "
             "PATH=/usr/local/cuda/bin:$PATH, or wherever the toolkit is)")
    return GeonError(f"the gpu transformer could not compile its kernels: pycuda runs "
                     f"nvcc, the CUDA compiler, at run time and nvcc is not on PATH; "
                     f"{where} ({type(error).__name__}: {error})")


def gpu_status(device=0):
    """``(True, "")`` if a CUDA device ``device`` can be used through pycuda, else
    ``(False, why)``, ``why`` saying what is missing."""
    try:
        import pycuda  # noqa: F401  (is it installed?)
    except ImportError:
        return False, PYCUDA_MISSING
    try:
        import pycuda.driver as drv
    except ImportError as e:
        return False, (f"pycuda is installed but the CUDA driver cannot be loaded ({e}); "
                       f"{DRIVER_ADVICE}")
    try:
        drv.init()
        count = drv.Device.count()
    except Exception as e:  # pycuda raises its own error types
        return False, f"no CUDA device was found ({e})"
    if count == 0:
        return False, "no CUDA device was found"
    if not 0 <= device < count:
        return False, f"CUDA device {device} does not exist ({count} found)"
    return True, ""


def pycuda_runtime(device=0):
    """The runtime of CUDA device ``device`` (one per device and process)."""
    rt = _runtimes.get(device)
    if rt is None:
        rt = _runtimes[device] = PyCUDARuntime(device)
    return rt


#: Host copies of at least this many bytes (into and out of pinned buffers) are split
#: among threads: one thread copies at a few GB/s, less than a PCIe link carries.
PARALLEL_COPY_BYTES = 4 << 20
#: The smallest piece of such a copy.
COPY_CHUNK_BYTES = 2 << 20
#: Threads that copy (made at the first large copy).
COPY_THREADS = max(1, min(8, os.cpu_count() or 1))
_copy_pool = None
_copy_pool_lock = threading.Lock()


def _copy_threads():
    global _copy_pool
    with _copy_pool_lock:
        if _copy_pool is None:
            _copy_pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=COPY_THREADS, thread_name_prefix="geon-copy")
    return _copy_pool


def copy_pieces(nbytes):
    """``[(lo, hi)]``: the byte ranges a copy of ``nbytes`` bytes is split into (one
    range below :data:`PARALLEL_COPY_BYTES`), 4 KiB-aligned."""
    if nbytes < PARALLEL_COPY_BYTES:
        return [(0, nbytes)]
    k = max(1, min(COPY_THREADS, nbytes // COPY_CHUNK_BYTES))
    step = -(-(-(-nbytes // k)) // 4096) * 4096
    return [(lo, min(lo + step, nbytes)) for lo in range(0, nbytes, step)]


def _flat_bytes(a):
    return a.reshape(-1).view(np.uint8)


def host_copy(dst, src, each=None):
    """``np.copyto(dst, src)`` (same shape and dtype), by several threads when it is
    large and both are contiguous (NumPy releases the GIL while it copies); ``each(lo,
    hi)`` is called, in order, as each byte range of ``dst`` is complete."""
    n = dst.nbytes
    pieces = copy_pieces(n)
    if len(pieces) == 1 or not (dst.flags.c_contiguous and src.flags.c_contiguous):
        np.copyto(dst, src)
        if each is not None and n:
            each(0, n)
        return
    d, s = _flat_bytes(dst), _flat_bytes(src)
    pool = _copy_threads()
    jobs = [(lo, hi, pool.submit(np.copyto, d[lo:hi], s[lo:hi])) for lo, hi in pieces]
    for lo, hi, job in jobs:
        job.result()
        if each is not None:
            each(lo, hi)


class PyCUDARuntime:
    """Device ``device``'s primary context (shared with other CUDA libraries in the
    process), made current in the thread that creates the runtime, and one stream on
    which every launch and asynchronous copy is enqueued. The stream is a blocking one,
    so the synchronous copies (on the legacy default stream) are ordered with it."""

    def __init__(self, device=0):
        import pycuda.driver as drv
        drv.init()
        self.drv = drv
        self.device = drv.Device(device)
        self.context = self.device.retain_primary_context()
        self.context.push()
        atexit.register(self._close)
        major, minor = self.device.compute_capability()
        self.arch = f"sm_{major}{minor}"
        self.key = f"{self.device.name()} ({self.device.pci_bus_id()}, {self.arch})"
        self.name = self.device.name()
        self.stream = drv.Stream()
        #: Calls of every transformer of this device take turns (they share the
        #: stream, which a graph capture must have to itself).
        self.lock = threading.RLock()
        self._functions = {}
        self._modules = []
        self._blas = None
        self._graphs = None   # the driver's graph calls, False where unavailable

    @property
    def stream_handle(self):
        """The ``CUstream`` of the runtime's stream, as an integer."""
        return int(self.stream.handle)

    def _close(self):
        try:
            self.context.pop()
            from pycuda.tools import clear_context_caches
            clear_context_caches()
        except Exception:  # the interpreter is exiting: nothing useful to report
            pass

    # --- memory ------------------------------------------------------------------
    def free_memory(self):
        """The device memory free now, in bytes."""
        return int(self.drv.mem_get_info()[0])

    def alloc(self, nbytes):
        # 256-byte granularity; never 0 (an empty tensor still gets an address)
        return self.drv.mem_alloc(max(256, -(-int(nbytes) // 256) * 256))

    def htod(self, address, array):
        if array.nbytes:
            self.drv.memcpy_htod(address, np.ascontiguousarray(array))

    def dtoh(self, array, address):
        if array.nbytes:
            self.drv.memcpy_dtoh(array, address)

    def copy(self, dst, src, nbytes):
        """Device-to-device copy of ``nbytes`` bytes."""
        self.drv.memcpy_dtod(dst, src, nbytes)

    def pinned(self, shape, dtype):
        size = int(np.prod(shape, dtype=np.int64))
        if not size:
            return np.empty(shape, dtype)
        # allocated flat: a 0-d result (a loss) is a view of one element
        return self.drv.pagelocked_empty((size,), dtype).reshape(shape)

    def upload(self, address, staging, array):
        """Copy ``array`` into the pinned ``staging`` and enqueue its copy to the device;
        a large one goes in pieces, each enqueued as soon as it is in ``staging``, so
        that the transfer overlaps the rest of the host copy."""
        if not array.nbytes:
            return
        stream, htod, flat = self.stream, self.drv.memcpy_htod_async, _flat_bytes(staging)
        host_copy(staging, array, lambda lo, hi: htod(address + lo, flat[lo:hi], stream))

    def download(self, pinned, address):
        if pinned.nbytes:
            self.drv.memcpy_dtoh_async(pinned, address, self.stream)

    @staticmethod
    def take(pinned):
        out = np.empty(pinned.shape, pinned.dtype)
        host_copy(out, pinned)
        return out

    def fence(self):
        event = self.drv.Event()
        event.record(self.stream)
        return _Fence(event)

    def finish(self):
        """Wait until everything enqueued on the runtime's stream is done."""
        self.stream.synchronize()

    def synchronize(self):
        self.drv.Context.synchronize()

    # --- kernels -----------------------------------------------------------------
    def compile(self, kernels):
        """Compile the kernels not compiled yet, all in one module."""
        from pycuda.compiler import SourceModule
        from geon.transformers.gpu.codegen import module_source
        new, seen = [], set()
        for k in kernels:
            if k.name not in self._functions and k.name not in seen:
                new.append(k)
                seen.add(k.name)
        logger.debug("gpu: %d kernel(s) compiled already, %d to compile",
                     len(kernels) - len(new), len(new))
        if not new:
            return
        start = time.perf_counter()
        try:
            mod = SourceModule(module_source(new), no_extern_c=True, arch=self.arch)
        except Exception as e:  # pycuda's own error types; OSError without nvcc
            failure = compile_failure(e)
            if failure is None:
                raise
            raise failure from e
        logger.debug("gpu: nvcc compiled %d kernel(s) in %.3f s", len(new),
                     time.perf_counter() - start)
        self._modules.append(mod)
        for k in new:
            f = mod.get_function(k.name)
            f.prepare("P" * len(k.args))
            self._functions[k.name] = f

    def launcher(self, launches, blas=None):
        """A function enqueueing ``launches``: ``[(kernel, grid, block, addresses)]`` on
        the runtime's stream; matrix products go to ``blas`` (see :meth:`blas_for`)
        where it takes them."""
        calls = []
        for k, grid, block, ptrs in launches:
            lib = getattr(k, "library", None)
            if lib is not None and blas is not None and blas.accepts(lib):
                ic, ia, ib = lib.args
                calls.append(blas.gemm_call(lib, ptrs[ic], ptrs[ia], ptrs[ib]))
                continue
            f = self._functions[k.name]
            # (a grid's z dimension only where used: a batched product's)
            calls.append((f.prepared_async_call, tuple(grid[:3 if grid[2] > 1 else 2]),
                          block, tuple(ptrs)))
        stream = self.stream

        def run():
            for c in calls:
                if callable(c):
                    c()
                else:
                    call, grid, block, ptrs = c
                    call(grid, block, stream, *ptrs)
        return run

    def graph(self, run):
        """A function launching what ``run`` enqueues as one CUDA graph (captured from
        the stream now, once), or ``None`` where the driver's graph calls cannot be
        loaded. Raises :class:`GeonError` if the capture fails."""
        if self._graphs is None:
            try:
                self._graphs = _GraphCalls()
            except (OSError, AttributeError) as e:  # no libcuda, or an old driver
                logger.debug("gpu: no CUDA graphs (%s)", e)
                self._graphs = False
        if not self._graphs:
            return None
        return self._graphs.capture(run, self.stream_handle)

    # --- cuBLAS ------------------------------------------------------------------
    def blas_for(self, choice):
        """What runs matrix products: ``None`` for the generated GEMM, else a BLAS.
        ``choice``: ``"generated"``; ``"cublas"`` (cuBLAS, an error if it cannot be
        loaded or does not work here); ``"auto"`` (cuBLAS if it works, else the
        generated GEMM, with a warning if cuBLAS was found but failed)."""
        if choice not in ("auto", "cublas", "generated"):
            raise ArgumentError(f"gemm must be 'auto', 'cublas' or 'generated', not {choice!r}")
        if choice == "generated":
            return None
        if self._blas is None:
            try:
                self._blas = CuBlas(self)
            except ImportError as e:  # no cuBLAS library here
                logger.debug("gpu: %s", e)
                self._blas = e.with_traceback(None)
            except Exception as e:  # found but not working with this context
                self._blas = e.with_traceback(None)  # (frees what the frames held)
                if choice == "auto":
                    warnings.warn(f"geon gpu: cuBLAS does not work here ({e}); using the "
                                  f"generated GEMM", RuntimeWarning, stacklevel=3)
        if isinstance(self._blas, Exception):
            if choice == "cublas":
                raise GeonError(f"gemm='cublas' needs a working cuBLAS: {self._blas}")
            return None
        return self._blas


class _Fence:
    def __init__(self, event):
        self.event = event

    def wait(self):
        self.event.synchronize()


# --- CUDA graphs (the driver's calls through ctypes: pycuda has no binding for them) ---

#: cuStreamBeginCapture's mode: calls that could reach the stream implicitly (a
#: synchronous copy, say) fail in the capturing thread instead of being captured.
CAPTURE_THREAD_LOCAL = 1


def _driver_library():
    return ctypes.CDLL("nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1")


class _GraphCalls:
    """Stream capture, instantiation and launch of CUDA graphs."""

    def __init__(self, lib=None):
        lib = lib if lib is not None else _driver_library()
        vp, pvp = ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)

        def fn(name, *argtypes):
            f = getattr(lib, name)
            f.argtypes, f.restype = list(argtypes), ctypes.c_int
            return f
        self.begin = fn("cuStreamBeginCapture_v2", vp, ctypes.c_int)
        self.end = fn("cuStreamEndCapture", vp, pvp)
        self.instantiate = fn("cuGraphInstantiateWithFlags", pvp, vp, ctypes.c_ulonglong)
        self.launch = fn("cuGraphLaunch", vp, vp)
        self.destroy = fn("cuGraphDestroy", vp)
        self.destroy_exec = fn("cuGraphExecDestroy", vp)
        self.error_name = fn("cuGetErrorName", ctypes.c_int, ctypes.POINTER(ctypes.c_char_p))

    def check(self, rc, what):
        if rc:
            name = ctypes.c_char_p()
            self.error_name(rc, ctypes.byref(name))
            why = name.value.decode() if name.value else f"error {rc}"
            raise GeonError(f"gpu: {what} failed ({why})")

    def capture(self, run, stream):
        self.check(self.begin(stream, CAPTURE_THREAD_LOCAL), "cuStreamBeginCapture")
        graph = ctypes.c_void_p()
        try:
            run()
        except BaseException:  # the capture ends, and what it made goes
            self.end(stream, ctypes.byref(graph))
            if graph.value:
                self.destroy(graph.value)
            raise
        self.check(self.end(stream, ctypes.byref(graph)), "cuStreamEndCapture")
        try:
            exe = ctypes.c_void_p()
            self.check(self.instantiate(ctypes.byref(exe), graph.value, 0),
                       "cuGraphInstantiate")
        finally:
            self.destroy(graph.value)
        return CudaGraph(self, exe.value, stream)


class CudaGraph:
    """An instantiated graph; calling it launches the graph on its stream."""

    def __init__(self, calls, exe, stream):
        self.calls, self.exe, self.stream = calls, exe, stream

    def __call__(self):
        rc = self.calls.launch(self.exe, self.stream)
        if rc:
            self.calls.check(rc, "cuGraphLaunch")

    def __del__(self):
        try:
            self.calls.destroy_exec(self.exe)
        except Exception:  # the interpreter is exiting
            pass


# --- cuBLAS (through ctypes, in geon's context and on its stream) -------------------

CUBLAS_OP_N, CUBLAS_OP_T = 0, 1
#: cuBLAS's default math mode: float32 products in float32, never TF32.
CUBLAS_DEFAULT_MATH = 0


def _cublas_library():
    """cuBLAS: the one already loaded in this process or on the loader's path, else
    the one of the NVIDIA wheels (``nvidia-cublas``, which PyTorch and CuPy install)
    or of the CUDA toolkit."""
    for name in ("libcublas.so.13", "libcublas.so.12", "libcublas.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            pass
    roots = [os.path.join(p, "nvidia", "*", "lib") for p in sys.path if p]
    for var in ("CUDA_ROOT", "CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            roots.append(os.path.join(os.environ[var], "lib64"))
    roots.append("/usr/local/cuda/lib64")
    for root in roots:
        for path in sorted(glob.glob(os.path.join(root, "libcublas.so*")), reverse=True):
            try:
                return ctypes.CDLL(path)
            except OSError:
                pass
    raise ImportError("cuBLAS (libcublas.so) was not found: install the nvidia-cublas "
                      "wheel or the CUDA toolkit's libraries")


def blas_operand(rows, cols, strides):
    """How cuBLAS (column-major) reads a ``rows x cols`` row-major operand with element
    ``strides`` as the transpose that ``C^T = B^T A^T`` needs: ``(op, ld)``, or
    ``None`` where no leading dimension describes it (broadcasts, negative strides,
    neither stride 1)."""
    s0, s1 = strides
    if (s1 == 1 or cols == 1) and (rows == 1 or s0 >= max(1, cols)):
        return CUBLAS_OP_N, (s0 if rows > 1 else max(1, cols))
    if (s0 == 1 or rows == 1) and (cols == 1 or s1 >= max(1, rows)):
        return CUBLAS_OP_T, (s1 if cols > 1 else max(1, rows))
    return None


class CuBlas:
    """Matrix products by cuBLAS on geon's device memory, with a handle of geon's own
    bound to the runtime's stream (so they are captured into its graphs), a workspace
    of its own (so that capturing never allocates), and the default math mode (no
    TF32). Checked on a small product when made. ``lib``: the cuBLAS library (default:
    found by :func:`_cublas_library`)."""

    WORKSPACE_BYTES = 32 << 20

    def __init__(self, runtime, lib=None):
        lib = lib if lib is not None else _cublas_library()
        vp, ci = ctypes.c_void_p, ctypes.c_int

        def fn(name, *argtypes):
            f = getattr(lib, name)
            f.argtypes, f.restype = list(argtypes), ci
            return f
        handle = vp()
        self._check(fn("cublasCreate_v2", ctypes.POINTER(vp))(ctypes.byref(handle)),
                    "cublasCreate")
        self.handle = handle.value
        destroy = fn("cublasDestroy_v2", vp)
        try:
            self._set_up(fn, runtime)
        except BaseException:
            destroy(self.handle)
            raise

    def _set_up(self, fn, runtime):
        vp, ci = ctypes.c_void_p, ctypes.c_int
        self._check(fn("cublasSetStream_v2", vp, vp)(self.handle, runtime.stream_handle),
                    "cublasSetStream")
        self._check(fn("cublasSetMathMode", vp, ci)(self.handle, CUBLAS_DEFAULT_MATH),
                    "cublasSetMathMode")
        self._workspace = runtime.alloc(self.WORKSPACE_BYTES)
        self._check(fn("cublasSetWorkspace_v2", vp, vp, ctypes.c_size_t)(
            self.handle, int(self._workspace), self.WORKSPACE_BYTES), "cublasSetWorkspace")
        sig = (vp, ci, ci, ci, ci, ci, vp, vp, ci, vp, ci, vp, vp, ci)
        self._gemm = {np.dtype(np.float32): fn("cublasSgemm_v2", *sig),
                      np.dtype(np.float64): fn("cublasDgemm_v2", *sig)}
        # batched products: one stride between the matrices of each operand (0: the
        # same matrix for every product)
        ll = ctypes.c_longlong
        sig = (vp, ci, ci, ci, ci, ci, vp, vp, ci, ll, vp, ci, ll, vp, vp, ci, ll, ci)
        try:
            self._batched = {np.dtype(np.float32): fn("cublasSgemmStridedBatched", *sig),
                             np.dtype(np.float64): fn("cublasDgemmStridedBatched", *sig)}
        except AttributeError:  # a cuBLAS without them: the generated GEMM runs those
            self._batched = {}
        # alpha = 1 and beta = 0, read from host memory (the default pointer mode)
        self._scalars = {dt: np.array([1, 0], dt) for dt in self._gemm}
        self._check_product(runtime)

    @staticmethod
    def _check(rc, what):
        if rc:
            raise GeonError(f"cuBLAS: {what} failed (status {rc})")

    def _check_product(self, runtime):
        a = np.arange(6, dtype=np.float32).reshape(2, 3)
        b = np.arange(12, dtype=np.float32).reshape(3, 4) - 5
        bufs = [runtime.alloc(x.nbytes) for x in (a, b)] + [runtime.alloc(32)]
        runtime.htod(int(bufs[0]), a)
        runtime.htod(int(bufs[1]), b)
        from geon.transformers.gpu.gemm import GemmCall
        lib = GemmCall(2, 4, 3, (3, 1), (4, 1), (4, 1), np.dtype(np.float32), (0, 1, 2))
        self.gemm_call(lib, int(bufs[2]), int(bufs[0]), int(bufs[1]))()
        runtime.finish()
        c = np.empty((2, 4), np.float32)
        runtime.dtoh(c, int(bufs[2]))
        if not np.allclose(c, a @ b):
            raise GeonError("cuBLAS gave a wrong product")

    def accepts(self, lib):
        """Whether cuBLAS can compute this product (a ``GemmCall``) in place of the
        generated GEMM."""
        out = blas_operand(lib.M, lib.N, lib.c_strides)  # C is written as is
        batch = getattr(lib, "batch", ())
        return (lib.dtype in self._gemm and lib.K > 0
                and blas_operand(lib.M, lib.K, lib.a_strides) is not None
                and blas_operand(lib.K, lib.N, lib.b_strides) is not None
                and out is not None and out[0] == CUBLAS_OP_N
                # a batch: one stride per operand (the batch dimensions merged into
                # one), none negative, and products that do not write over each other
                and (not batch or lib.dtype in self._batched and len(batch) == 1
                     and min(batch[0][1:]) >= 0 and batch[0][3] >= lib.M * lib.N))

    def gemm_call(self, lib, c, a, b):
        """A function enqueueing C = A @ B (``c``, ``a``, ``b`` are device addresses):
        in column-major terms C^T = B^T A^T; a batched product is one strided-batched
        call."""
        M, N, K, dtype = lib.M, lib.N, lib.K, lib.dtype
        op_a, lda = blas_operand(M, K, lib.a_strides)
        op_b, ldb = blas_operand(K, N, lib.b_strides)
        _, ldc = blas_operand(M, N, lib.c_strides)
        scalars = self._scalars[dtype]
        alpha = scalars.ctypes.data
        beta = alpha + dtype.itemsize
        batch = getattr(lib, "batch", ())
        letter = "S" if dtype.itemsize == 4 else "D"
        if batch:
            (count, sa, sb, sc), = batch
            args = (self.handle, op_b, op_a, N, M, K, alpha, b, ldb, sb, a, lda, sa,
                    beta, c, ldc, sc, count)
            gemm = self._batched[dtype]
            what = f"{letter}gemmStridedBatched of {count} x {M}x{K} @ {K}x{N}"
        else:
            args = (self.handle, op_b, op_a, N, M, K, alpha, b, ldb, a, lda, beta, c, ldc)
            gemm = self._gemm[dtype]
            what = f"{letter}gemm of {M}x{K} @ {K}x{N}"
        check = self._check

        def call():
            rc = gemm(*args)
            if rc:
                check(rc, what)
        return call
