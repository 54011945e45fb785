"""Run the generated CUDA C on the CPU, slowly: a check of code generation without a GPU.

The kernels are compiled as C++ by the system compiler (``c++``, ``g++`` or ``clang++``)
against a small shim (``__global__`` is nothing, ``__shared__`` is ``static``,
``threadIdx`` and friends are globals) and run by a scheduler that gives every CUDA
thread of a block its own stack (``ucontext`` fibers): threads run one at a time, each
up to its next ``__syncthreads()``, in a shuffled order, and blocks run one after the
other, in a shuffled order too. Buffers are host memory with guard bytes around them,
checked after every launch, so a kernel writing out of bounds is reported by name.

It offers the runtime interface of :class:`geon.transformers.gpu.runtime.PyCUDARuntime`;
tests pass it as ``GPUTransformer(runtime=EmulatorRuntime())``. Test support only (not
installed with geon); it says nothing about speed, and device-only behaviour (warp
scheduling, memory ordering between blocks) is not reproduced.
"""

import atexit
import ctypes
import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
import threading
import weakref

import numpy as np

from geon.errors import ArgumentError, GeonError

#: Kernels are called through a switch on their number of (pointer) arguments.
MAX_ARGS = 64
GUARD = 256
_GUARD_BYTE = 0xA5

SHIM = r"""// geon emulator shim: CUDA C as C++ on the host
#include <cmath>
#include <math.h>
#include <cstring>
#include <cstdint>
using std::isnan;
struct dim3 { unsigned int x, y, z; };
extern "C" dim3 geon_emu_threadIdx, geon_emu_blockIdx, geon_emu_blockDim, geon_emu_gridDim;
extern "C" void geon_emu_syncthreads(void);
#define threadIdx geon_emu_threadIdx
#define blockIdx geon_emu_blockIdx
#define blockDim geon_emu_blockDim
#define gridDim geon_emu_gridDim
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
static inline void __syncthreads(void) { geon_emu_syncthreads(); }
static inline float __uint_as_float(unsigned int b) { float f; std::memcpy(&f, &b, 4); return f; }
static inline double __longlong_as_double(long long b) {
    double d; std::memcpy(&d, &b, 8); return d;
}
// CUDA's explicitly rounded double operations: plain IEEE operations here (the kernels
// are compiled with -ffp-contract=off, so nothing is fused into a multiply-add)
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dsub_rn(double a, double b) { return a - b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __ddiv_rn(double a, double b) { return a / b; }
static inline double __dsqrt_rn(double a) { return std::sqrt(a); }
struct alignas(16) float4 { float x, y, z, w; };
static inline float4 make_float4(float x, float y, float z, float w) {
    float4 r = {x, y, z, w}; return r;
}
"""


def _scheduler_source():
    cases = []
    for n in range(MAX_ARGS + 1):
        sig = ", ".join(["void*"] * n)
        args = ", ".join(f"a[{i}]" for i in range(n))
        cases.append(f"    case {n}: ((void (*)({sig}))g_fn)({args}); break;")
    return r"""// geon emulator: CUDA threads as fibers
#include <ucontext.h>
#include <cstdlib>
#include <vector>
struct dim3 { unsigned int x, y, z; };
extern "C" {
dim3 geon_emu_threadIdx, geon_emu_blockIdx, geon_emu_blockDim, geon_emu_gridDim;
}
static ucontext_t g_sched;
static std::vector<ucontext_t> g_fibers;
static std::vector<char*> g_stacks;
static std::vector<int> g_status;  // 0 runnable, 1 at a barrier, 2 finished
static int g_current;
static void* g_fn;
static int g_nargs;
static void** g_args;
static const size_t STACK = 256 * 1024;
static unsigned long long g_rng;

static unsigned long long next_random() {
    g_rng ^= g_rng << 13; g_rng ^= g_rng >> 7; g_rng ^= g_rng << 17; return g_rng;
}
static void shuffle(std::vector<int>& v) {
    for (size_t i = v.size(); i > 1; --i) {
        size_t j = next_random() % i; int t = v[i - 1]; v[i - 1] = v[j]; v[j] = t;
    }
}
extern "C" void geon_emu_syncthreads(void) {
    g_status[g_current] = 1;
    swapcontext(&g_fibers[g_current], &g_sched);
}
static void call_kernel() {
    void** a = g_args;
    switch (g_nargs) {
""" + "\n".join(cases) + r"""
    default: break;
    }
}
static void fiber_main(int id) {
    call_kernel();
    g_status[id] = 2;
}
// 0: done; -1: a barrier not reached by every thread; -2: too many arguments
extern "C" int geon_emu_launch(void* fn, int nargs, void** args, unsigned gx, unsigned gy,
                               unsigned gz, unsigned bx, unsigned by, unsigned bz,
                               unsigned long long seed) {
    if (nargs > """ + str(MAX_ARGS) + r""") return -2;
    g_fn = fn; g_nargs = nargs; g_args = args;
    g_rng = seed * 2654435761ull + 88172645463325252ull;
    const int nt = (int)(bx * by * bz);
    while ((int)g_stacks.size() < nt) g_stacks.push_back((char*)std::malloc(STACK));
    g_fibers.resize(nt);
    g_status.resize(nt);
    geon_emu_gridDim = {gx, gy, gz};
    geon_emu_blockDim = {bx, by, bz};
    std::vector<int> blocks(gx * gy * gz);
    for (size_t b = 0; b < blocks.size(); ++b) blocks[b] = (int)b;
    shuffle(blocks);
    std::vector<int> threads(nt);
    for (int b : blocks) {
        geon_emu_blockIdx = {b % gx, (b / gx) % gy, b / (gx * gy)};
        for (int t = 0; t < nt; ++t) {
            getcontext(&g_fibers[t]);
            g_fibers[t].uc_stack.ss_sp = g_stacks[t];
            g_fibers[t].uc_stack.ss_size = STACK;
            g_fibers[t].uc_link = &g_sched;
            makecontext(&g_fibers[t], (void (*)())fiber_main, 1, t);
            g_status[t] = 0;
            threads[t] = t;
        }
        for (;;) {
            shuffle(threads);
            for (int t : threads) {
                if (g_status[t] != 0) continue;
                geon_emu_threadIdx = {t % bx, (t / bx) % by, t / (bx * by)};
                g_current = t;
                swapcontext(&g_sched, &g_fibers[t]);
            }
            int waiting = 0, done = 0;
            for (int t = 0; t < nt; ++t) { waiting += g_status[t] == 1; done += g_status[t] == 2; }
            if (done == nt) break;
            if (done) return -1;
            for (int t = 0; t < nt; ++t) g_status[t] = 0;
        }
    }
    return 0;
}
"""


def find_compiler():
    """The C++ compiler the emulator uses, or ``None``."""
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


_private = None


def _cache_dir():
    """Where compiled kernels are kept: a folder only this user can write, since the
    shared objects found there are loaded. The per-user folder in the temp directory
    (created 0700) if it is a real folder owned by this user that nobody else can
    write, else a fresh private folder for this process, removed at exit."""
    global _private
    d = os.path.join(tempfile.gettempdir(), f"geon-emulator-{os.getuid()}")
    try:
        os.mkdir(d, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(d)
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022:
        return d
    if _private is None:
        _private = tempfile.mkdtemp(prefix="geon-emulator-")
        atexit.register(shutil.rmtree, _private, True)
    return _private


def _build(source, tag):
    """Compile ``source`` into a shared library (cached by its hash); its path."""
    cxx = find_compiler()
    if cxx is None:
        raise GeonError("the GPU emulator needs a C++ compiler (c++, g++ or clang++)")
    digest = hashlib.sha256(source.encode()).hexdigest()[:24]
    folder = _cache_dir()
    path = os.path.join(folder, f"{tag}-{digest}.so")
    if os.path.exists(path):
        return path
    fd, src = tempfile.mkstemp(suffix=".cpp", dir=folder)
    with os.fdopen(fd, "w") as f:
        f.write(source)
    tmp = path + f".{os.getpid()}.tmp"
    try:
        run = subprocess.run([cxx, "-std=c++17", "-O1", "-ffp-contract=off", "-shared",
                              "-fPIC", "-w",
                              "-fno-strict-aliasing", "-o", tmp, src],
                             capture_output=True, text=True)
        if run.returncode != 0:
            raise GeonError(f"the GPU emulator could not compile the kernels:\n"
                            f"{run.stderr[-4000:]}")
        os.replace(tmp, path)
    finally:
        os.unlink(src)
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


_scheduler = None
_lock = threading.Lock()


def _get_scheduler():
    global _scheduler
    with _lock:
        if _scheduler is None:
            lib = ctypes.CDLL(_build(_scheduler_source(), "scheduler"),
                              mode=ctypes.RTLD_GLOBAL)
            lib.geon_emu_launch.restype = ctypes.c_int
            lib.geon_emu_launch.argtypes = [ctypes.c_void_p, ctypes.c_int,
                                            ctypes.POINTER(ctypes.c_void_p)] + \
                [ctypes.c_uint] * 6 + [ctypes.c_ulonglong]
            _scheduler = lib
        return _scheduler


class _Buffer:
    """Host memory standing for a device allocation, with guard bytes around it."""

    def __init__(self, nbytes):
        self.nbytes = int(nbytes)
        raw = np.empty(self.nbytes + 3 * GUARD, np.uint8)
        start = (-raw.ctypes.data) % GUARD
        self.raw = raw
        self.lo = start
        self.mem = raw[start + GUARD:start + GUARD + self.nbytes]
        raw[:] = _GUARD_BYTE
        self.mem[:] = 0x7F  # not zero: kernels must not rely on fresh memory being 0
        self.address = self.mem.ctypes.data

    def __int__(self):
        return self.address

    def intact(self):
        g = self.raw
        lo, hi = self.lo + GUARD, self.lo + GUARD + self.nbytes
        return bool(np.all(g[self.lo:lo] == _GUARD_BYTE)
                    and np.all(g[hi:hi + GUARD] == _GUARD_BYTE))


class _DoneFence:
    def wait(self):
        pass


class EmulatorRuntime:
    """The runtime interface on the CPU (see the module docstring). ``seed`` fixes the
    shuffled order of blocks and threads."""

    key = "emulator"
    name = "CPU emulator"

    def __init__(self, seed=0):
        self.seed = seed
        self._functions = {}
        self._libs = []
        self._buffers = weakref.WeakSet()
        self._launches = 0

    def blas_for(self, choice):
        if choice not in ("auto", "cublas", "generated"):
            raise ArgumentError(f"gemm must be 'auto', 'cublas' or 'generated', not {choice!r}")
        if choice == "cublas":
            raise GeonError("gemm='cublas' needs a GPU; the emulator runs the generated GEMM")
        return None

    def alloc(self, nbytes):
        b = _Buffer(nbytes)
        self._buffers.add(b)
        return b

    def htod(self, address, array):
        a = np.ascontiguousarray(array)
        if a.nbytes:
            ctypes.memmove(int(address), a.ctypes.data, a.nbytes)

    def dtoh(self, array, address):
        if array.nbytes:
            ctypes.memmove(array.ctypes.data, int(address), array.nbytes)

    def copy(self, dst, src, nbytes):
        ctypes.memmove(int(dst), int(src), nbytes)

    # Copies are synchronous here, so there is no stream: pinned memory is ordinary,
    # fences are done when made, and there are no graphs.
    stream_handle = 0

    @staticmethod
    def pinned(shape, dtype):
        return np.empty(shape, dtype)

    def upload(self, address, staging, array):
        np.copyto(staging, array)
        self.htod(address, staging)

    def download(self, pinned, address):
        self.dtoh(pinned, address)

    @staticmethod
    def take(pinned):
        return pinned.copy()

    def fence(self):
        return _DoneFence()

    def finish(self):
        pass

    def synchronize(self):
        pass

    def graph(self, run):
        return None

    def compile(self, kernels):
        from geon.transformers.gpu.codegen import module_source
        new, seen = [], set()
        for k in kernels:
            if k.name not in self._functions and k.name not in seen:
                if len(k.args) > MAX_ARGS:
                    raise GeonError(f"the emulator takes at most {MAX_ARGS} kernel "
                                    f"arguments; {k.name} has {len(k.args)}")
                new.append(k)
                seen.add(k.name)
        if not new:
            return
        self._sched = _get_scheduler()  # first: kernels link against it
        lib = ctypes.CDLL(_build(SHIM + module_source(new), "kernels"))
        self._libs.append(lib)
        for k in new:
            self._functions[k.name] = ctypes.cast(getattr(lib, k.name), ctypes.c_void_p).value

    def launcher(self, launches, blas=None):
        calls = []
        buffers = list(self._buffers)
        for k, grid, block, ptrs in launches:
            args = (ctypes.c_void_p * max(1, len(ptrs)))(*ptrs)
            # the buffers this launch may touch: those its pointers point into
            mine = [b for b in buffers if any(b.address <= p <= b.address + b.nbytes
                                               for p in ptrs)]
            calls.append((k.name, self._functions[k.name], len(ptrs), args, grid, block,
                          mine))

        def run():
            for name, fn, n, args, grid, block, mine in calls:
                self._launches += 1
                rc = self._sched.geon_emu_launch(fn, n, args, *grid, *block,
                                                 self.seed + self._launches)
                if rc == -1:
                    raise GeonError(f"emulator: in {name}, some threads of a block "
                                    f"finished while others waited at __syncthreads()")
                if rc:
                    raise GeonError(f"emulator: launch of {name} failed ({rc})")
                bad = [b for b in mine if not b.intact()]
                if bad:
                    raise GeonError(f"emulator: {name} wrote outside its buffers")
        return run


def assert_ptx_compiles(kernels, folder, name):
    """``nvcc -ptx -arch=sm_90`` of ``kernels`` (``{name: Kernel}``) as one module in
    ``folder``: no error, no warning, and one entry point per kernel."""
    import re
    from geon.transformers.gpu.codegen import module_source
    src = folder / f"{name}.cu"
    src.write_text(module_source(list(kernels.values())))
    ptx = folder / f"{name}.ptx"
    run = subprocess.run([shutil.which("nvcc"), "-ptx", "-arch=sm_90", "-o", str(ptx),
                          str(src)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-5000:]
    assert "warning" not in run.stderr, run.stderr[-5000:]
    entries = set(re.findall(r"\.entry\s+(\w+)\(", ptx.read_text()))
    assert entries == set(kernels), sorted(set(kernels) ^ entries)[:5]
