"""The PyCUDA runtime: device memory, compilation with a cache, copies and launches.

Nothing here is imported unless a GPU transformer is made. :func:`gpu_status` says
whether one can be (pycuda importable, the CUDA driver loadable, a device present)
without raising.

A runtime offers: ``alloc(nbytes) -> buffer`` (``int(buffer)`` is its device address),
``htod(address, array)``, ``dtoh(array, address)``, ``compile(kernels)`` (each kernel
once per device: the cache is keyed by the kernel's name, which holds a hash of its
source, and lives in the runtime of that device), ``launcher(launches)`` (a function
that runs a list of ``(kernel, grid, block, addresses)``), and ``synchronize()``.
The test suite's CPU emulator (tests/cuda_emulator.py) offers the same and is
passed as ``GPUTransformer(runtime=...)``.
"""

import atexit
import os
import shutil
import time
import warnings

import numpy as np

from geon._logging import get_logger
from geon.errors import ArgumentError, GeonError

logger = get_logger(__name__)

_runtimes = {}

#: Why the GPU transformer cannot be made without pycuda, and what to do.
PYCUDA_MISSING = (
    "pycuda is not installed (pip install -e '.[gpu]' in a checkout, or "
    "pip install 'geon-graph[gpu]'); building pycuda needs the CUDA toolkit: its headers "
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


class PyCUDARuntime:
    """Device ``device``'s primary context (shared with other CUDA libraries in the
    process), made current in the thread that creates the runtime."""

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
        self._functions = {}
        self._modules = []
        self._blas = None

    def _close(self):
        try:
            self.context.pop()
            from pycuda.tools import clear_context_caches
            clear_context_caches()
        except Exception:  # the interpreter is exiting: nothing useful to report
            pass

    # --- memory ------------------------------------------------------------------
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
        """A function running ``launches``: ``[(kernel, grid, block, addresses)]``;
        matrix products go to ``blas`` (see :meth:`blas_for`) where it takes them."""
        calls = []
        for k, grid, block, ptrs in launches:
            lib = getattr(k, "library", None)
            if lib is not None and blas is not None and blas.accepts(lib):
                ic, ia, ib = lib[-1]
                calls.append(blas.gemm_call(lib, ptrs[ic], ptrs[ia], ptrs[ib]))
                continue
            f = self._functions[k.name]
            calls.append((f.prepared_call, (grid[0], grid[1]), block, tuple(ptrs)))

        def run():
            for c in calls:
                if callable(c):
                    c()
                else:
                    call, grid, block, ptrs = c
                    call(grid, block, *ptrs)
        return run

    # --- optional cuBLAS through CuPy ---------------------------------------------
    def blas_for(self, choice):
        """What runs matrix products: ``None`` for the generated GEMM, else a BLAS.
        ``choice``: ``"generated"``; ``"cublas"`` (cuBLAS through CuPy, an error if
        that does not work here); ``"auto"`` (cuBLAS if it works, with a warning if
        CuPy is installed but fails)."""
        if choice not in ("auto", "cublas", "generated"):
            raise ArgumentError(f"gemm must be 'auto', 'cublas' or 'generated', not {choice!r}")
        if choice == "generated":
            return None
        if self._blas is None:
            try:
                self._blas = CupyBlas(self)
            except ImportError as e:
                self._blas = e
            except Exception as e:  # CuPy there but not working with this context
                self._blas = e
                if choice == "auto":
                    warnings.warn(f"geon gpu: cuBLAS through CuPy does not work here "
                                  f"({e}); using the generated GEMM", RuntimeWarning,
                                  stacklevel=3)
        if isinstance(self._blas, Exception):
            if choice == "cublas":
                raise GeonError(f"gemm='cublas' needs a working CuPy: {self._blas}")
            return None
        return self._blas


class CupyBlas:
    """Matrix products by cuBLAS through CuPy on geon's own device memory (CuPy shares
    the device's primary context). Checked on a small product when made."""

    def __init__(self, runtime):
        import cupy
        self.cupy = cupy
        self.runtime = runtime
        a = np.arange(6, dtype=np.float32).reshape(2, 3)
        b = np.arange(12, dtype=np.float32).reshape(3, 4) - 5
        bufs = [runtime.alloc(x.nbytes) for x in (a, b)] + [runtime.alloc(32)]
        runtime.htod(int(bufs[0]), a)
        runtime.htod(int(bufs[1]), b)
        lib = ("gemm", 2, 4, 3, (3, 1), (4, 1), np.dtype(np.float32), (0, 1, 2))
        self.gemm_call(lib, int(bufs[2]), int(bufs[0]), int(bufs[1]))()
        c = np.empty((2, 4), np.float32)
        runtime.dtoh(c, int(bufs[2]))
        if not np.allclose(c, a @ b):
            raise GeonError("cuBLAS through CuPy gave a wrong product")

    def _array(self, address, shape, strides, dtype):
        cp = self.cupy
        item = np.dtype(dtype).itemsize
        span = item * (1 + sum((n - 1) * s for n, s in zip(shape, strides)))
        mem = cp.cuda.UnownedMemory(address, max(span, item), self)
        return cp.ndarray(shape, dtype, cp.cuda.MemoryPointer(mem, 0),
                          strides=tuple(s * item for s in strides))

    @staticmethod
    def accepts(lib):
        """Whether CuPy can take these operands (it wants no negative strides)."""
        _, M, N, K, sa, sb, dtype, _ = lib
        return all(s >= 0 for s in sa + sb) and np.dtype(dtype).kind == "f"

    def gemm_call(self, lib, c, a, b):
        """A function computing C = A @ B (``c``, ``a``, ``b`` are device addresses)
        with CuPy's matmul on views of geon's buffers, which calls cuBLAS."""
        _, M, N, K, sa, sb, dtype, _ = lib
        A = self._array(a, (M, K), sa, dtype)
        B = self._array(b, (K, N), sb, dtype)
        C = self._array(c, (M, N), (N, 1), dtype)
        matmul = self.cupy.matmul

        def call():
            matmul(A, B, out=C)
        return call

