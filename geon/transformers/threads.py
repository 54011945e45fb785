"""One thread policy for geon's own threads and the BLAS library's.

A step of a computation runs two kinds of parallel work, one after the other: the
matrix products in the BLAS library NumPy loaded (OpenBLAS in NumPy's wheels), and
geon's fused groups on geon's own threads (:func:`geon.transformers.fusion.run_blocks`).
Both split their work into equal parts and wait for the slowest part, so one thread
whose core is taken by another process holds the whole step up: with a second busy
process on a 2-core machine, two BLAS threads ran the MLP step at batch 128 in 124 ms
against 55 ms with one (doc/performance.rst, "Threads under load").

The policy:

- **The budget** is the number of cores the process may use: ``GEON_NUM_THREADS`` if
  set (``0`` or unset: the default), else ``OMP_NUM_THREADS``, else the CPUs in the
  process's affinity mask (``os.sched_getaffinity``; a container's or ``taskset``'s
  limit counts). Neither geon nor the BLAS ever runs more threads than that.
- **Under load**, the number used is the budget less the cores that *other* processes
  kept busy over the last :data:`INTERVAL` seconds (at least one): the busy time of
  the CPUs in the affinity mask (``/proc/stat``) less this process's own CPU time, so
  our own threads, spinning or not, never count against us. It is measured at most
  once per interval, at the start of a computation's call; between measurements a
  call costs one clock read.
- Both libraries get the same number: the BLAS through its own API
  (``openblas_set_num_threads`` of the library NumPy loaded, found in the process's
  memory map), set only when the number changes, and never above what the BLAS had
  before geon first set it (so ``OPENBLAS_NUM_THREADS=1`` or a ``threadpoolctl``
  limit stands); geon's groups through :func:`active`, which
  :func:`~geon.transformers.fusion.run_blocks` reads; the C pool of the fixed kernels
  (:mod:`geon.transformers.numpy.c_pool`) through :func:`on_change`.

A computation whose BLAS products are all small passes a cap of one BLAS thread
(:func:`geon.transformers.numpy.blas.blas_threads_cap`): the BLAS gets one thread for
its calls, geon's groups keep the policy's count, and the next call without the cap
gives the BLAS its count back.

``GEON_ADAPT_THREADS=0`` turns the load measurement off (the budget is always used).
Where ``/proc/stat`` or the BLAS's API is missing (not Linux, another BLAS), the part
that needs it does nothing: geon's groups still follow the policy.
"""

import ctypes
import os
import threading
import time
from typing import Optional

from geon._env import env_flag, env_int

#: Seconds between two load measurements.
INTERVAL = 0.2
#: Another process must keep a core busy for at least this fraction of the interval
#: before geon gives the core up (a short daemon wake-up is not load).
BUSY_FRACTION = 0.5


def affinity_cpus() -> list[int]:
    """The CPUs this process may run on (all of them where the OS does not say)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def budget(environ: Optional[dict[str, str]] = None) -> int:
    """The most threads a step may use: ``GEON_NUM_THREADS``, else ``OMP_NUM_THREADS``,
    else the CPUs in the affinity mask (a value that is not an integer warns and
    falls through, see geon/_env.py)."""
    environ = os.environ if environ is None else environ
    cpus = len(affinity_cpus())
    for name in ("GEON_NUM_THREADS", "OMP_NUM_THREADS"):
        n = env_int(name, 0, minimum=0, environ=environ)
        if n:
            return n
    return cpus


def _read_cpu_ticks(cpus: list[int], path: str = "/proc/stat") -> Optional[int]:
    """The busy clock ticks (all but idle and I/O wait) of ``cpus`` since boot, or
    None where ``/proc/stat`` cannot be read."""
    wanted = {f"cpu{c}" for c in cpus}
    busy = 0
    try:
        with open(path, "rb") as f:
            for line in f:
                if not line.startswith(b"cpu"):
                    break
                fields = line.split()
                if fields[0].decode() not in wanted:
                    continue
                ticks = [int(v) for v in fields[1:]]
                # user nice system idle iowait irq softirq steal (guest is in user)
                busy += sum(ticks[:8]) - ticks[3] - ticks[4]
    except (OSError, ValueError, IndexError):
        return None
    return busy


def mapped_openblas():
    """The paths of the OpenBLAS libraries mapped into this process now (from its
    memory map; empty where there is none)."""
    try:
        with open("/proc/self/maps") as f:
            return {line.split()[-1] for line in f if ".so" in line
                    and "openblas" in os.path.basename(line.split()[-1]).lower()}
    except OSError:
        return set()


def _blas_thread_api(paths=None):
    """``(get, set)`` for the OpenBLAS among ``paths`` (by default every one mapped:
    NumPy's), or None if none is loaded or it lacks them."""
    if paths is None:
        paths = mapped_openblas()
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix, suffix in (("scipy_openblas", "64_"), ("openblas", "64_"),
                               ("scipy_openblas", ""), ("openblas", "")):
            get = getattr(lib, f"{prefix}_get_num_threads{suffix}", None)
            put = getattr(lib, f"{prefix}_set_num_threads{suffix}", None)
            if get is not None and put is not None:
                get.argtypes, get.restype = [], ctypes.c_int
                put.argtypes, put.restype = [ctypes.c_int], None
                return get, put
    return None


class Policy:
    """The process's thread policy (one instance: :data:`POLICY`)."""

    def __init__(self, environ: Optional[dict[str, str]] = None,
                 stat_path: str = "/proc/stat") -> None:
        environ = os.environ if environ is None else environ
        self.budget = budget(environ)
        self.adaptive = env_flag("GEON_ADAPT_THREADS", True, environ=environ) \
            and self.budget > 1
        self._cpus = affinity_cpus()
        self._stat_path = stat_path
        self._tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self.threads = self.budget
        self._lock = threading.Lock()
        self._last: Optional[tuple[float, int, float]] = None  # (wall, busy ticks, own cpu)
        self._next = 0.0
        self._blas = None
        self._blas_threads: Optional[int] = None
        self._blas_cap = 1
        self._blas_looked = False
        self._want = 0  # the last call's cap of BLAS threads (0: none)
        #: How many times the number of threads changed (for tests and benchmarks).
        self.changes = 0

    def others_busy(self, now: float) -> Optional[float]:
        """Cores other processes kept busy since the last reading (None at the first
        reading or where ``/proc/stat`` is missing)."""
        ticks = _read_cpu_ticks(self._cpus, self._stat_path)
        own = time.process_time()
        last, self._last = self._last, (None if ticks is None else (now, ticks, own))
        if ticks is None or last is None or now <= last[0]:
            return None
        wall = now - last[0]
        busy = (ticks - last[1]) / self._tick
        return max(0.0, (busy - (own - last[2])) / wall)

    def refresh(self, blas_cap: int = 0) -> int:
        """The number of threads a step should use now; measures the load when the
        last measurement is :data:`INTERVAL` old, and passes a new number on to the
        BLAS, at most ``blas_cap`` where that is not 0 (a computation of small
        products only). Called at the start of a computation's call."""
        now = time.monotonic()
        if now < self._next:
            if self._want != blas_cap:  # another computation's cap than the last call's
                with self._lock:
                    self._want = blas_cap
                    self._apply_blas(self.threads)
            return self.threads
        with self._lock:
            self._want = blas_cap
            if now < self._next:
                self._apply_blas(self.threads)
                return self.threads
            self._next = now + INTERVAL
            n = self.budget
            if self.adaptive:
                others = self.others_busy(now)
                if others is not None:
                    taken = int(others + (1.0 - BUSY_FRACTION))
                    n = max(1, min(self.budget, len(self._cpus) - taken))
            if n != self.threads:
                self.changes += 1
                self.threads = n
                for fn in _listeners:
                    fn(n)
            self._apply_blas(n)
            return n

    def _apply_blas(self, n: int) -> None:
        """Give the BLAS ``n`` threads, or fewer where it was limited before geon
        first set it (``OPENBLAS_NUM_THREADS``, ``threadpoolctl``): the count it had
        then, or whatever someone else set since, is its cap."""
        if not self._blas_looked:
            self._blas_looked = True
            self._blas = _blas_thread_api()
        if self._blas is None:
            return
        get, put = self._blas
        now = get()
        if now != self._blas_threads:  # first time, or someone else changed it
            self._blas_cap = now
        want = max(1, min(n, self._blas_cap, self._want or n))
        if want != now:
            put(want)
        self._blas_threads = want


#: The process's policy.
POLICY = Policy()

#: Called with the policy's new count whenever it changes (:func:`on_change`).
_listeners: list = []


def on_change(fn) -> None:
    """Call ``fn(n)`` with the policy's count of threads now and whenever it changes
    (the C pools of :mod:`geon.transformers.numpy.c_pool` follow it so)."""
    with POLICY._lock:   # (a refresh meanwhile would change the count unheard)
        _listeners.append(fn)
        fn(POLICY.threads)


def active() -> int:
    """The number of threads geon's fused groups may use now."""
    return POLICY.threads


def refresh(blas_cap: int = 0) -> int:
    """:meth:`Policy.refresh` of the process's policy."""
    return POLICY.refresh(blas_cap)
