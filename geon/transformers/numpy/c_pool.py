"""geon's own worker threads in C, for the parallel parts of a fixed library's entries.

A convolution of resnet18 at 64 x 64 (a (64, 576) @ (576, 512) product, 300 us on one
core) gains little from Python's threads on a 2-core virtual machine: a pool thread
that has slept takes its half at about 60% of the speed of a thread that has just
worked, and the product split in two took 280 us. Threads in C that wait for the next
job by spinning a short while (:data:`SPIN_US`) before they sleep took it in 170 us:
layers follow each other within tens of microseconds, so the workers of a model's
forward stay awake from one layer to the next, as ONNX Runtime's and OpenMP's do.

The pool is a library of its own (:data:`SOURCE`, built and loaded once per compiler
and cache folder, like every fixed library: one in a process that keeps them); a
library that uses it includes :data:`CLIENT` and is given the pool's functions when it
is loaded (:func:`attach`). The interface a client sees:

- ``pool_run(fn, ctx, parts)`` runs ``fn(ctx, k)`` for every ``k < parts`` on up to
  ``pool_want`` threads, the caller's among them, and returns when every part is done.
  Parts are taken one at a time from a shared counter, so a worker that comes late (or
  whose core is busy) takes fewer of them; the caller alone runs a job while another
  thread's job holds the pool, and any job of one part. (A worker that holds a part
  while another thread has its core keeps the caller waiting, which yields its core
  after a short spin. Running jobs alone for a while after such a wait gained nothing
  measurable beside PyTorch and ONNX Runtime in one process.)
- ``pool_threads()`` is ``pool_want``: the thread policy's count
  (:mod:`geon.transformers.threads`), passed on whenever it changes. Workers are
  started when a job first wants them and stay; none is started while the count is 1
  (``GEON_NUM_THREADS=1``, or under load).

Without the pool (it did not build, or ``GEON_COMPILED=0``) a client runs its parts
one after another on the caller's thread. A part never calls Python (an entry may
hold the GIL while its workers run, where its work is too small to let it go).
"""

import contextlib
import ctypes

from geon.transformers import threads
from geon.transformers.numpy import compiled

#: How long a worker spins on the next job before it sleeps (microseconds).
SPIN_US = 50

#: Clients cut a job into this many parts a thread: where another thread (of this
#: process or another) holds a core, the worker on it takes fewer parts instead of
#: holding the job up with a long one.
PARTS_PER_THREAD = 4

#: The most threads of one pool.
MAX_THREADS = 64

SOURCE = r"""
#include <pthread.h>
#include <sched.h>
#include <time.h>
#include <stdint.h>
/* geon's pool (see geon/transformers/numpy/c_pool.py) */
typedef void (*pool_fn)(void *ctx, int64_t part);
static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;   /* sleepers wait under it */
static pthread_cond_t pool_cv = PTHREAD_COND_INITIALIZER;
static pthread_mutex_t pool_run_mu = PTHREAD_MUTEX_INITIALIZER;   /* one job at a time */
/* [0]: threads a job may use (the caller's included); [1]: 1 where clients cut every
   job into parts, however small (for tests) */
static int pool_state[2] = {1, 0};
#define pool_want pool_state[0]
static int pool_started = 0;   /* workers running */
static int pool_forks = 0;     /* the fork handler is registered */
/* (job << 32) | the next part to take; a worker takes a part by exchanging it for the
   next, so a part of an earlier job is never taken after that job's end */
static uint64_t pool_ticket = 0;
static uint64_t pool_jobs = 0;  /* jobs posted (the caller's count, under pool_run_mu) */
static int64_t pool_left = 0;   /* parts of the job not finished */
static int pool_seats = 0;      /* workers that may still join the job */
static pool_fn pool_job_fn;
static void *pool_job_ctx;
static int64_t pool_job_parts;

static inline void pool_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static int64_t pool_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* Take and run parts of job until none is left. A stale read of the job's fields
   before a part is taken is harmless: the exchange fails where the ticket moved on,
   and while a part of job is running the job cannot end, so its fields stand. */
static void pool_take(uint64_t job) {
    uint64_t t = __atomic_load_n(&pool_ticket, __ATOMIC_ACQUIRE);
    for (;;) {
        if ((t >> 32) != job) return;
        const int64_t k = (int64_t)(t & 0xffffffffu);
        if (k >= __atomic_load_n(&pool_job_parts, __ATOMIC_RELAXED)) return;
        if (!__atomic_compare_exchange_n(&pool_ticket, &t, t + 1, 0, __ATOMIC_ACQ_REL,
                                         __ATOMIC_ACQUIRE))
            continue;
        pool_job_fn(pool_job_ctx, k);
        __atomic_fetch_sub(&pool_left, 1, __ATOMIC_RELEASE);
        t = __atomic_load_n(&pool_ticket, __ATOMIC_ACQUIRE);
    }
}

/* A worker: arg, the last job posted before it was started (it takes the next). After
   a job it spins SPIN_NS on the next before it sleeps; after a job without a seat for
   it (the count was lowered) it sleeps at once. */
static void *pool_worker(void *arg) {
    uint64_t seen = (uint64_t)(uintptr_t)arg, job;
    int spin = 1;
    for (;;) {
        const int64_t until = spin ? pool_ns() + SPIN_NS : 0;
        int n = 0;
        while ((job = __atomic_load_n(&pool_ticket, __ATOMIC_ACQUIRE) >> 32) == seen) {
            if ((++n & 63) == 0 && pool_ns() > until) {
                pthread_mutex_lock(&pool_mu);
                while ((job = __atomic_load_n(&pool_ticket, __ATOMIC_ACQUIRE) >> 32) == seen)
                    pthread_cond_wait(&pool_cv, &pool_mu);
                pthread_mutex_unlock(&pool_mu);
                break;
            }
            pool_relax();
        }
        seen = job;
        spin = __atomic_sub_fetch(&pool_seats, 1, __ATOMIC_ACQ_REL) >= 0;
        if (spin) pool_take(job);
    }
    return NULL;
}

/* In a forked child the workers are gone: start afresh. */
static void pool_after_fork(void) {
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
    pool_mu = mu;
    pool_run_mu = mu;
    pool_cv = cv;
    pool_started = 0;
}

/* Start workers until want - 1 run (fewer where the system refuses a thread). */
static void pool_start(int want) {
    if (!pool_forks) {
        pthread_atfork(NULL, NULL, pool_after_fork);
        pool_forks = 1;
    }
    while (pool_started < want - 1) {
        pthread_t t;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        const int failed = pthread_create(&t, &at, pool_worker,
                                          (void *)(uintptr_t)pool_jobs);
        pthread_attr_destroy(&at);
        if (failed) break;
        pool_started++;
    }
}

/* fn(ctx, k) for every k < parts, on up to pool_want threads; returns when all are
   done. */
void geon_pool_run(pool_fn fn, void *ctx, int64_t parts) {
    int want = __atomic_load_n(&pool_want, __ATOMIC_RELAXED);
    if (want > parts) want = (int)parts;
    if (want <= 1 || parts > 0xffffffffLL || pthread_mutex_trylock(&pool_run_mu)) {
        for (int64_t k = 0; k < parts; k++) fn(ctx, k);
        return;
    }
    pool_start(want);
    if (want > pool_started + 1) want = pool_started + 1;
    pool_job_fn = fn;
    pool_job_ctx = ctx;
    __atomic_store_n(&pool_job_parts, parts, __ATOMIC_RELAXED);
    __atomic_store_n(&pool_left, parts, __ATOMIC_RELAXED);
    __atomic_store_n(&pool_seats, want - 1, __ATOMIC_RELAXED);
    const uint64_t job = pool_jobs = (pool_jobs + 1) & 0xffffffffu;
    __atomic_store_n(&pool_ticket, job << 32, __ATOMIC_RELEASE);
    pthread_mutex_lock(&pool_mu);
    pthread_cond_broadcast(&pool_cv);
    pthread_mutex_unlock(&pool_mu);
    pool_take(job);
    /* the parts the workers hold: spin, then yield (a worker may share this core) */
    for (int n = 0; __atomic_load_n(&pool_left, __ATOMIC_ACQUIRE) > 0;) {
        if (n < 4096) {
            n++;
            pool_relax();
        } else {
            sched_yield();
        }
    }
    pthread_mutex_unlock(&pool_run_mu);
}

/* The number of threads a job may use (the thread policy's count). */
void geon_pool_threads(int64_t n) {
    __atomic_store_n(&pool_want, n < 1 ? 1 : n > POOL_MAX ? POOL_MAX : (int)n,
                     __ATOMIC_RELAXED);
}

void geon_pool_eager(int64_t on) {
    __atomic_store_n(&pool_state[1], on != 0, __ATOMIC_RELAXED);
}

/* Where the count and the flag are, for the clients to read. */
void *geon_pool_want(void) {
    return pool_state;
}
""".replace("SPIN_NS", f"{SPIN_US * 1000}LL").replace("POOL_MAX", str(MAX_THREADS))

#: What a library using the pool includes (after ``<stdint.h>``): ``pool_run`` and
#: ``pool_threads``, and the entry :func:`attach` calls.
CLIENT = r"""
typedef void (*pool_fn)(void *ctx, int64_t part);
/* the parts a job is cut into for want threads */
#define POOL_CUT(want) ((want) * PARTS_PER_THREAD)
static void (*pool_run_at)(pool_fn, void *, int64_t) = 0;
static const int *pool_want_at = 0;
void geon_use_pool(void *run, void *want) {
    pool_run_at = (void (*)(pool_fn, void *, int64_t))run;
    pool_want_at = (const int *)want;
}
static inline int pool_threads(void) {
    return pool_want_at ? __atomic_load_n(pool_want_at, __ATOMIC_RELAXED) : 1;
}
/* whether a job of this much work is cut into parts: at least min, or any where the
   pool says so (tests) */
static inline int pool_worth(int64_t work, int64_t min) {
    return work >= min || (pool_want_at && __atomic_load_n(pool_want_at + 1, __ATOMIC_RELAXED));
}
static void pool_run(pool_fn fn, void *ctx, int64_t parts) {
    if (pool_run_at) {
        pool_run_at(fn, ctx, parts);
        return;
    }
    for (int64_t k = 0; k < parts; k++) fn(ctx, k);
}
""".replace("PARTS_PER_THREAD", str(PARTS_PER_THREAD))

#: The symbol of :data:`CLIENT` that :func:`attach` calls.
CLIENT_SYMBOL = "geon_use_pool"

_SYMBOLS = ["geon_pool_run", "geon_pool_threads", "geon_pool_want", "geon_pool_eager"]
_loaded = {}  # (CC, cache folder) -> (run, want addresses, setters), or None


def _bind(lib):
    setter = lib.geon_pool_threads
    setter.argtypes = (ctypes.c_int64,)
    setter.restype = None
    want = lib.geon_pool_want
    want.restype = ctypes.c_void_p
    threads.on_change(setter)
    eager = lib.geon_pool_eager
    eager.argtypes = (ctypes.c_int64,)
    eager.restype = None
    return ctypes.cast(lib.geon_pool_run, ctypes.c_void_p).value, want(), setter, eager


@contextlib.contextmanager
def forced(n):
    """For tests: the pool (of this compiler and cache folder: the one the libraries
    built now use) runs jobs on ``n`` threads and its clients cut every job into parts,
    however small, until the block ends (then the policy's count again). Where the pool
    is not built, clients run their parts on one thread."""
    pool = _loaded_pool()
    if pool is None:
        yield
        return
    _, _, set_threads, set_eager = pool
    set_threads(n)
    set_eager(1)
    try:
        yield
    finally:
        set_eager(0)
        set_threads(threads.active())


def _loaded_pool():
    return compiled.fixed_library(_loaded, "thread pool", lambda: SOURCE, _SYMBOLS, _bind)


def attach(lib):
    """Give library ``lib`` (a ctypes CDLL including :data:`CLIENT`) the process's pool;
    where the pool cannot be had, ``lib`` runs its parts on the calling thread."""
    pool = _loaded_pool()
    if pool is not None:
        use = lib[CLIENT_SYMBOL]
        use.argtypes = (ctypes.c_void_p, ctypes.c_void_p)
        use.restype = None
        use(*pool[:2])
