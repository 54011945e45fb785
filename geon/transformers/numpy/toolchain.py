"""The C toolchain of the compiled path and the libraries it builds: which compiler
and flags (probed once per ``$CC``, the IEEE checks), and building, caching and loading a library (:func:`build`). See
:mod:`geon.transformers.numpy.compiled` for the policy that decides what is compiled."""

import ctypes
import hashlib
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings


from geon.errors import GeonWarning
from geon.transformers.numpy.c_rules import math_name, math_used, simd_declarations
from geon.transformers.numpy.kernel_cache import (CompileError, _fresh, open_cache,
                                                  open_folder)

#: Flags always given; ``-march=native`` and ``-fopenmp-simd`` are added when they
#: compile.
BASE_FLAGS = ("-O3", "-fPIC", "-shared", "-std=gnu99", "-fno-math-errno",
              "-fno-trapping-math", "-ffp-contract=off") + (
    # the compiled groups and the native call path use Python's C API, found in the
    # process when they are loaded (macOS's linker wants to be told so)
    ("-undefined", "dynamic_lookup") if sys.platform == "darwin" else ())
#: Tried first: all of the CPU, with 512-bit vectors where it has them (GCC prefers 256
#: bits on AVX-512 CPUs; the 20-op chain, mostly exp / tanh / log from libmvec, ran in
#: 25 ms per 4M floats with 512 bits against 48 ms with 256, one Cascade Lake core).
NATIVE_FLAGS = ("-march=native", "-mprefer-vector-width=512")


#: C declarations of the functions that take their arrays as one tuple (the compiled
#: groups, the 1 x 1 convolution kernels): after ``<stdint.h>`` and ``<stddef.h>``.
BUFFER_API = r"""/* The arrays come as one tuple of Python objects (one ctypes argument: ctypes spends
   about 0.1 us converting each) and are read through the buffer protocol (PEP 3118: the
   Py_buffer struct below is CPython's, whose layout is part of its stable ABI). The
   functions are called with the GIL held (ctypes.PYFUNCTYPE); a Python error set here
   (an array that is not C-contiguous where the code reads it as such, a read-only
   output, a tuple too short) is raised by ctypes after the call. */
typedef struct {
    void *buf; void *obj; ptrdiff_t len, itemsize; int readonly, ndim;
    char *format; ptrdiff_t *shape, *strides, *suboffsets; void *internal;
} geon_buffer;
extern int PyObject_GetBuffer(void *obj, geon_buffer *view, int flags);
extern void PyBuffer_Release(geon_buffer *view);
extern void *PyTuple_GetItem(void *tuple, ptrdiff_t k);
extern void *PyEval_SaveThread(void);
extern void PyEval_RestoreThread(void *state);
#define GEON_CONTIGUOUS 0     /* PyBUF_SIMPLE: C-contiguous memory */
#define GEON_STRIDED 0x18     /* PyBUF_STRIDES */
#define GEON_WRITABLE 0x1     /* PyBUF_WRITABLE */
/* The buffer of every array of the tuple, or none (0, a Python error set). */
static int geon_acquire(geon_buffer *v, void *arrays, const int *flags, int n) {
    for (int k = 0; k < n; k++) {
        void *const a = PyTuple_GetItem(arrays, k);
        if (!a || PyObject_GetBuffer(a, &v[k], flags[k])) {
            while (k-- > 0) PyBuffer_Release(&v[k]);
            return 0;
        }
    }
    return 1;
}
static void geon_release(geon_buffer *v, int n) {
    for (int k = 0; k < n; k++) PyBuffer_Release(&v[k]);
}
extern long long PyLong_AsLongLong(void *obj);
extern double PyFloat_AsDouble(void *obj);
extern void *PyErr_Occurred(void);
/* The entries take their arguments as one tuple (ctypes converts one argument: a call
   of a function of seven arguments took 1.3 us, of one 0.4 us, and 3.8 against 2.2 us
   after the caches had been flushed, as they are between the layers of a model): item
   0, the tuple of arrays, then one item for each letter of kinds, 'i' an integer (into
   the next of iv), 'd' a double (into the next of dv). 0 where one is missing or of
   another type (a Python error set). */
static int geon_args(void *t, const char *kinds, long long *iv, double *dv) {
    for (int k = 0; kinds[k]; k++) {
        void *const a = PyTuple_GetItem(t, k + 1);
        if (!a) return 0;
        if (kinds[k] == 'i' ? (*iv++ = PyLong_AsLongLong(a)) == -1
                            : (*dv++ = PyFloat_AsDouble(a)) == -1.0) {
            if (PyErr_Occurred()) return 0;
        }
    }
    return 1;
}
"""
#: A 32-byte vector of ``REAL`` (``vr_SUF``, ``VL_SUF`` lanes) and its unaligned load,
#: for the fixed kernels' templates (``REAL`` and ``_SUF`` replaced per dtype).
VECTOR32 = r"""
typedef REAL vr_SUF __attribute__((vector_size(32)));
#define VL_SUF ((int64_t)(32 / sizeof(REAL)))

static inline vr_SUF load_SUF(const REAL *p) {
    vr_SUF v;
    __builtin_memcpy(&v, p, sizeof v);
    return v;
}
"""
#: NumPy's maximum and minimum in C (``geon_max_f``, ``geon_min_d``, ...).
MINMAX = r"""/* NumPy's maximum / minimum, bit for bit: a NaN operand wins (a's where both are: b's
   through the comparison, a's through the second select), and of equal operands
   (-0.0 and +0.0) the second, as NumPy gives np.maximum(-0.0, 0.0) = 0.0 and
   np.maximum(0.0, -0.0) = -0.0. Two selects, which GCC vectorizes (maxps / minps). */
#define GEON_MINMAX(name, t, cmp) static inline t name(t a, t b) \
    { const t m = a cmp b ? a : b; return a != a ? a : m; }
GEON_MINMAX(geon_max_f, float, >)
GEON_MINMAX(geon_min_f, float, <)
GEON_MINMAX(geon_max_d, double, >)
GEON_MINMAX(geon_min_d, double, <)
"""


_warned = set()
_warn_lock = threading.Lock()


def warn_once(key, message):
    """A GeonWarning, once per ``key`` in this process."""
    with _warn_lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(message, GeonWarning, stacklevel=4)


class Toolchain:
    """A working C compiler: its command, its flags and a text naming it (for the cache
    key)."""

    def __init__(self, command, flags, identity, simd_math=False, record=None):
        self.command, self.flags, self.identity = command, tuple(flags), identity
        #: whether the C library's vector maths (glibc's libmvec) can be called
        self.simd_math = simd_math
        #: the file keeping what the probe found (removed when a build with these
        #: flags fails: the next process probes again)
        self.record = record


_toolchains = {}
_tc_lock = threading.Lock()

#: Flags that change floating-point results from NumPy's: they let the compiler assume
#: that no value is NaN or infinite, ignore the sign of zero, reorder sums, divide by
#: multiplying with a reciprocal, flush subnormal numbers to zero (GCC links
#: crtfastmath.o into a ``-ffast-math`` library, whose loading sets that for the whole
#: thread, NumPy included), fuse ``a * b + c`` into one rounding or round constants to
#: float. geon leaves them out of ``$CC`` with a :class:`~geon.errors.GeonWarning`
#: naming them; ``-fno-math-errno`` and ``-fno-trapping-math`` stay (they change no
#: result: geon gives them itself). geon reads no ``$CFLAGS``.
REFUSED_FLAGS = ("-ffast-math", "-Ofast", "-ffinite-math-only", "-fno-signed-zeros",
                 "-funsafe-math-optimizations", "-fassociative-math",
                 "-freciprocal-math", "-fno-honor-nans", "-fno-honor-infinities",
                 "-fapprox-func", "-fsingle-precision-constant", "-mdaz-ftz")
#: Flags refused whatever their value (geon sets ``-ffp-contract=off`` itself).
REFUSED_PREFIXES = ("-ffp-contract=", "-ffp-model=", "-fdenormal-fp-math")

#: The checks of :data:`_IEEE_SOURCE`: bit -> what failed.
_IEEE_CHECKS = {1: "inf * 0 is not NaN, or NaN compares equal", 2: "no infinities",
                4: "signed zeros are not kept (1 / -0.0 is not -inf, or -0.0 + 0.0 is "
                   "-0.0)",
                8: "sums are reordered", 16: "divisions are not correctly rounded"}
# Each check runs on values the caller passes (zero, one), so the compiler cannot fold
# it to the right answer at compile time; what the flags let it assume it does fold.
_IEEE_SOURCE = """
int geon_ieee(double zero, double one) {
    int bad = 0;
    const double inf = one / zero, nan = inf * zero, nzero = -zero;
    const float fzero = (float)zero, fone = (float)one;
    const float finf = fone / fzero, fnan = finf * fzero, fnzero = -fzero;
    if (!isnan(nan) || nan == nan || !(nan != nan) || nan < one || nan >= one
            || !isnan(fnan) || fnan == fnan || !(fnan != fnan) || fnan < fone)
        bad |= 1;
    if (!isinf(inf) || !(inf > 1e308) || !isinf(finf) || !(finf > 3e38f))
        bad |= 2;
    if (one / nzero != -inf || fone / fnzero != -finf || signbit(nzero + 0.0)
            || signbit(fnzero + 0.0f) || !signbit(nzero - 0.0))
        bad |= 4;
    const double big = one * 9007199254740992.0;    /* 2^53: big + 1 rounds to big */
    const float fbig = fone * 16777216.0f;           /* 2^24 */
    if ((big + one) - big != 0.0 || (fbig + fone) - fbig != 0.0f)
        bad |= 8;
    if ((one * 5.0) / 3.0 != 0x1.aaaaaaaaaaaabp+0        /* 5 / 3, correctly rounded */
            || (fone * 5.0f) / 3.0f != 0x1.aaaaaap+0f)
        bad |= 16;
    return bad;
}
"""


def _probe_source(simd_math):
    calls = " + ".join(f"{math_name(n, 'float')}(x[i]{', x[i]' if n == 'pow' else ''})"
                       for n in math_used())
    return ("#include <math.h>\n#include <stdint.h>\n"
            + (simd_declarations() if simd_math else "") + """
void geon_probe(float *x, int64_t n) {
    for (int64_t c = 0; c < n; c += 64) {
        int64_t e = c + 64 < n ? c + 64 : n;
        #pragma omp simd
        for (int64_t i = c; i < e; i++) x[i] = """ + calls + """;
    }
}
""" + _IEEE_SOURCE)


def _refused(word):
    return word in REFUSED_FLAGS or word.startswith(REFUSED_PREFIXES)


def _compiler_command():
    cc = os.environ.get("CC", "").strip()
    if cc:
        try:
            cmd = shlex.split(cc)
        except ValueError as e:
            raise CompileError(f"no C compiler: $CC is {cc!r}, which does not parse: {e}",
                               key="no compiler") from None
        path = shutil.which(cmd[0])
        if path is None:
            raise CompileError(f"no C compiler: $CC is {cc!r}, which is not on the PATH",
                               key="no compiler")
        refused = [w for w in cmd[1:] if _refused(w)]
        if refused:
            warn_once(("refused flags", cc),
                      f"$CC is {cc!r}: geon leaves out {' '.join(refused)} when it "
                      "compiles its kernels, since they change floating-point results "
                      "from NumPy's (NaN, infinities, signed zeros, rounding or "
                      "subnormal numbers)")
        return [path] + [w for w in cmd[1:] if not _refused(w)]
    for name in ("cc", "gcc", "clang"):
        path = shutil.which(name)
        if path:
            return [path]
    raise CompileError("no C compiler: $CC is not set and neither cc, gcc nor clang "
                       "is on the PATH", key="no compiler")


def _cpu_identity():
    """What ``-march=native`` depends on: the CPU's model and flags."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [ln for ln in f.read().splitlines()
                     if ln.startswith(("model name", "flags", "Features"))]
        return "\n".join(dict.fromkeys(lines))
    except OSError:
        return platform.processor()


def _run_cc(command, flags, src, out, folder):
    """Compile ``src`` into the shared library ``out``, two names in ``folder`` (a
    :class:`Folder`); the compiler runs in that folder, reached through its descriptor
    (see :meth:`Folder.at`)."""
    try:
        r = subprocess.run(command + list(flags) + [src, "-o", out, "-lm"],
                           capture_output=True, text=True, timeout=300,
                           cwd=folder.at(), pass_fds=folder.pass_fds())
    except (OSError, subprocess.SubprocessError) as e:
        return False, str(e)
    return r.returncode == 0, (r.stderr or r.stdout or "")


def toolchain():
    """The :class:`Toolchain` for the current ``$CC`` (probed once per value); raises
    :class:`CompileError` when there is none."""
    key = os.environ.get("CC", "")
    with _tc_lock:
        tc = _toolchains.get(key)
        if tc is None:
            try:
                tc = _probe()
            except CompileError as e:
                tc = e
            _toolchains[key] = tc
    if isinstance(tc, CompileError):
        raise tc
    return tc


#: The extra flags tried, best first; the first that builds the probe is used.
PROBE_FLAGS = ((*NATIVE_FLAGS, "-fopenmp-simd"), ("-march=native", "-fopenmp-simd"),
               ("-fopenmp-simd",), ("-march=native",), ())


def _probe():
    command = _compiler_command()
    try:
        version = subprocess.run(command + ["--version"], capture_output=True, text=True,
                                 timeout=60).stdout.splitlines()[:1]
    except (OSError, subprocess.SubprocessError) as e:
        raise CompileError(f"the C compiler {command[0]} does not run: {e}",
                           key="no compiler") from None
    # What the probe found for this compiler (its version) on this CPU is kept in the
    # cache: a process that only loads cached kernels runs the compiler once, for
    # --version, not five times.
    h = hashlib.sha256()
    for part in (command, version, [platform.machine(), _cpu_identity()],
                 platform.libc_ver(),
                 [_probe_source(True), _probe_source(False)], [BASE_FLAGS, PROBE_FLAGS]):
        h.update(repr(part).encode())
    try:  # probed where the kernels will be loaded from (a folder whose files cannot
        # be run fails there too), and kept there; without a cache folder to trust, in
        # a private folder made in the system's temporary folder, and kept nowhere
        folder = open_cache()
    except CompileError:
        folder = None
    record = f"toolchain-{h.hexdigest()[:40]}.json"
    try:
        found = _read_probe(folder, record) if folder else None
        if found is None:
            found = _run_probe(command, folder)
            try:
                if folder:
                    folder.write_atomic(record, json.dumps(
                        {"extra": list(found[0]), "simd_math": found[1]}).encode())
            except OSError:
                folder.close()
                folder = None  # not kept: probed again in the next process
    finally:
        if folder:
            folder.close()
    extra, simd_math = found
    flags = BASE_FLAGS + extra
    identity = "\n".join([" ".join(command)] + version + [platform.machine()]
                         + ([_cpu_identity()] if "-march=native" in flags else []))
    return Toolchain(command, flags, identity, simd_math,
                     folder and os.path.join(folder.path, record))


def _read_probe(folder, name):
    """``(extra flags, simd_math)`` kept in the file ``name`` of ``folder``, or None;
    only one of :data:`PROBE_FLAGS` is accepted (the file is never trusted to add
    flags)."""
    try:
        data = json.loads(folder.read(name))
        extra = tuple(data["extra"])
        simd_math = data["simd_math"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if extra not in PROBE_FLAGS or simd_math not in (True, False) or (
            simd_math and PROBE_FLAGS.index(extra) >= 2):
        return None
    return extra, simd_math


def _run_probe(command, folder=None):
    """The first of :data:`PROBE_FLAGS` with which ``command`` builds a shared library
    that loads (and whether the vector maths library resolves with it), built in
    ``folder`` (default: a private folder in the system's temporary folder): ``(extra,
    simd_math)``. Raises :class:`CompileError` where none does, and where the library
    fails the IEEE checks of :data:`_IEEE_SOURCE` (cause "ieee")."""
    own = folder is None
    if own:
        path = None
        try:
            path = tempfile.mkdtemp(prefix="geon-probe-")
            folder = open_folder(path)
        except (OSError, CompileError) as e:
            if path:
                shutil.rmtree(path, ignore_errors=True)
            raise CompileError(f"no folder to probe the C compiler in: {e}",
                               key="no compiler") from None
    err, key = "", "no compiler"
    try:
        for k, extra in enumerate(PROBE_FLAGS):
            # vector maths: only with the best flags, and only where it resolves
            for simd_math in ((True, False) if k < 2 else (False,)):
                try:
                    lib, _ = _build_in(folder, command, BASE_FLAGS + extra,
                                       _probe_source(simd_math))
                except CompileError as e:
                    if e.key == "ieee":
                        raise
                    err = str(e)
                    if e.key == "compile failed":
                        key = "no compiler"
                        break  # these flags do not build: the next ones
                    key = "load failed"
                    continue
                _check_ieee(lib, command, BASE_FLAGS + extra)
                return extra, simd_math
    finally:
        if own:
            folder.close()
            shutil.rmtree(folder.path, ignore_errors=True)
    if key == "load failed":
        raise CompileError(f"libraries built by the C compiler {command[0]} do not "
                           f"load from {folder.path}: {err.strip()[-500:]}", key=key)
    raise CompileError(f"the C compiler {command[0]} cannot build a shared "
                       f"library: {err.strip()[-500:]}", key=key)


def _check_ieee(lib, command, flags):
    """Raise :class:`CompileError` (cause "ieee") where the probe library ``lib`` shows
    that the compiler with these flags breaks IEEE arithmetic."""
    f = lib.geon_ieee
    f.argtypes, f.restype = [ctypes.c_double, ctypes.c_double], ctypes.c_int
    bad = f(0.0, 1.0)
    if bad:
        what = "; ".join(text for bit, text in _IEEE_CHECKS.items() if bad & bit)
        raise CompileError(f"the C compiler {' '.join(command)} with the flags "
                           f"{' '.join(flags)} breaks IEEE floating point ({what}): "
                           "geon does not use it", key="ieee")


def available():
    """Whether the compiled path can run here (a C compiler that builds a shared
    library)."""
    try:
        toolchain()
    except CompileError:
        return False
    return True


_libs = {}
_lib_lock = threading.Lock()


def _digest(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def cache_key(source, tc, flags=()):
    h = hashlib.sha256()
    for part in (source, tc.identity, " ".join(tc.flags)) + (
            (" ".join(flags),) if flags else ()):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:40]


def build(source, symbols=(), flags=()):
    """The loaded library of C ``source``, which defines the functions ``symbols``:
    from the cache when a checked copy is there, else compiled and stored. ``flags``:
    compiler flags given after the toolchain's (e.g. ``-I`` a folder), part of the
    cache key. Raises :class:`CompileError`."""
    tc = toolchain()
    flags = tuple(flags)
    key = cache_key(source, tc, flags)
    with _lib_lock:
        lib = _libs.get(key)
        if lib is not None:
            return lib
        with open_cache() as folder:
            lib = _load_cached(folder, key, symbols)
            if lib is None:
                try:
                    lib = _compile(tc, source, folder, key, symbols, flags)
                except OSError as e:  # a full disk, a folder that turned read-only, ...
                    raise CompileError(f"cannot build the kernels in {folder.path}: "
                                       f"{e}", key="no cache") from None
                except CompileError:
                    if not flags:   # (with flags of its own, the source's failure)
                        _forget_probe(tc)
                    raise
        _libs[key] = lib
        return lib


def _forget_probe(tc):
    """A build with ``tc``'s flags failed: the next process probes the compiler again
    (this one keeps its toolchain)."""
    if tc.record:
        try:
            with open_folder(os.path.dirname(tc.record)) as folder:
                folder.unlink(os.path.basename(tc.record))
        except (OSError, CompileError):
            pass


def _load_cached(folder, key, symbols=()):
    """The library ``key`` kept in ``folder`` if it is there, is this user's alone,
    matches the digest in its .sha256 file and defines every one of ``symbols``; else
    None (it is then built again)."""
    want, data = folder.read(key + ".sha256"), folder.read(key + ".so")
    if want is None or data is None or hashlib.sha256(data).hexdigest() != \
            want.decode("ascii", "replace").strip():
        return None
    try:
        lib = _load(folder, data)
    except CompileError as e:
        if e.key == "load failed":
            return None
        raise
    if not all(hasattr(lib, s) for s in symbols):
        return None  # e.g. written by a build that was cut short
    return lib


def _compile(tc, source, folder, key, symbols=(), flags=()):
    """Compile ``source`` (with ``flags`` after the toolchain's), load it, and keep it
    in ``folder`` as ``key``: the ``.c`` file, the ``.sha256`` digest, then the
    library, each renamed into place (a reader that sees the new library also sees its
    digest)."""
    try:
        lib, data = _build_in(folder, tc.command, tc.flags + tuple(flags), source)
    except CompileError as e:
        if e.key != "compile failed":
            raise
        raise CompileError(f"{tc.command[0]} failed on the fused kernels: "
                           f"{str(e).strip()[-2000:]}", key=e.key) from None
    missing = [s for s in symbols if not hasattr(lib, s)]
    if missing:
        raise CompileError(f"the compiled kernels lack {', '.join(missing)}",
                           key="compile failed")
    folder.write_atomic(key + ".c", source.encode())
    folder.write_atomic(key + ".sha256",
                        (hashlib.sha256(data).hexdigest() + "\n").encode())
    folder.write_atomic(key + ".so", data)
    return lib


def _build_in(folder, command, flags, source):
    """``source`` compiled in ``folder`` under fresh names (removed after) and loaded
    (:func:`_load`): ``(library, its bytes)``. Raises :class:`CompileError`: cause
    "compile failed" (its text: the compiler's message), or :func:`_load`'s."""
    stem = _fresh(".build-")
    src, out = stem + ".c", stem + ".so"
    try:
        folder.write_new(src, source.encode())
        ok, err = _run_cc(command, flags, src, out, folder)
        # the compiler's output: this user's (its mode is the umask's)
        data = folder.read(out, strict=False) if ok else None
        if data is None:
            raise CompileError(err or "no library was written", key="compile failed")
        return _load(folder, data), data
    finally:
        folder.unlink(src)
        folder.unlink(out)


def _load(folder, data):
    """The library whose bytes are ``data`` (checked by the caller), loaded: written to
    a new file of ``folder`` (O_EXCL), loaded through the folder's descriptor, then
    removed. So the loader maps exactly these bytes, under a name never used before
    (it knows libraries by name: a name loaded earlier gives the earlier library).
    Raises :class:`CompileError`: cause "load failed", or "ieee" where loading it made
    this thread flush subnormal numbers to zero (undone)."""
    name = _fresh(".load-", ".so")
    folder.write_new(name, data, 0o700)
    try:
        kept = _subnormals_kept()
        env = _fenv("fegetenv") if kept else None
        try:
            lib = ctypes.CDLL(folder.at(name))
        except OSError as e:
            raise CompileError(f"cannot load the compiled kernels in {folder.path}: "
                               f"{e}", key="load failed") from None
        if kept and not _subnormals_kept():
            _fenv("fesetenv", env)
            raise CompileError(
                "loading a library built by the C compiler made this process flush "
                "subnormal numbers to zero (as a library built with -ffast-math does): "
                "geon does not use it", key="ieee")
        return lib
    finally:
        folder.unlink(name)


_SUBNORMAL = [5e-324, 1.0, 2.2250738585072014e-308, 0.5]   # a list: nothing folds it


def _subnormals_kept():
    """Whether this thread computes with subnormal numbers (no flush to zero: reads and
    results), as NumPy does by default."""
    tiny, one, least_normal, half = _SUBNORMAL
    return tiny * one != 0.0 and least_normal * half != 0.0


def _fenv(name, env=None):
    """Call the C library's ``fegetenv`` (returns the saved environment) or ``fesetenv``
    (restores ``env``), where it can be called; None otherwise."""
    try:
        fn = getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError, TypeError):
        return None
    if env is None:
        if name != "fegetenv":
            return None
        env = ctypes.create_string_buffer(1024)   # larger than any fenv_t
    return env if fn(env) == 0 else None

