"""Compiled fused groups: one C loop per elementwise group.

Which groups: :func:`mode` of ``NumPyTransformer(compiled=...)`` (default: the
environment variable ``GEON_COMPILED``). With :data:`AUTO`, the default, the groups
of at least :data:`AUTO_MIN_ELEMENTS` elements, where a compiler works; with True
(``GEON_COMPILED=1``) small groups too; with False (``GEON_COMPILED=0``) none. Each
such group (see :mod:`geon.transformers.fusion`) whose members all have a C rule here
becomes one C function: a single loop over the elements that loads the group's inputs,
computes every member in local variables and stores the members that have a buffer
(or, for large groups with several slow members, one loop per segment over tiles of
elements: see Tiles below). The functions of one
computation form one C file, compiled with the system C compiler into a shared library,
loaded with :mod:`ctypes` and called from the generated Python with the arrays
themselves.

- Small groups: with ``compiled=True``, elementwise ops under
  :data:`fusion.MIN_ELEMENTS <geon.transformers.fusion.MIN_ELEMENTS>` are fused too when
  they have a C rule, so a long chain on a small tensor is one C call, not one NumPy
  call per op.
- What compiles: members of dtype float32 or float64 whose classes are in
  :data:`C_RULES` (their compute dtype float32 / float64; comparisons may compare any
  integer, bool or float operands); inputs of those dtypes, bool or integer, read as
  buffers of the group's shape (contiguous), as views or constants of the group's shape
  (any strides, read through the strides NumPy reports: a row a chunk of
  :data:`ROW_CHUNK_ELEMENTS` at a time, copied to a contiguous array first where its
  last stride is not the element size), or as scalar constants. A group
  with another member (integer arithmetic, user ops, sigmoid cross-entropy) or an input
  of another shape runs the NumPy code of :mod:`.transformer` instead.
- Floating point: ``-O3 -fno-math-errno -fno-trapping-math -ffp-contract=off`` and
  not ``-ffast-math``: NaN and infinities propagate as in NumPy (maximum / minimum
  return the NaN operand, and of -0.0 and +0.0 the second, as NumPy does; comparisons
  with NaN are false), no ``a * b + c`` is fused into one rounding, so ``+ - * /``
  give NumPy's bits. Words of ``$CC`` that would change that (:data:`REFUSED_FLAGS`,
  :data:`REFUSED_PREFIXES`) are left out with a warning, and the probe of the compiler
  checks IEEE semantics on values the compiler cannot see (inf * 0 is NaN, NaN is
  unequal to itself, 1 / -0.0 is -inf, -0.0 + 0.0 is +0.0, no reordered sums, correctly
  rounded divisions) and that loading its library leaves subnormal numbers alone; a
  compiler that fails is not used (cause "ieee"). ``-march=native`` (with
  512-bit vectors preferred on AVX-512 CPUs) and ``-fopenmp-simd`` (the ``simd``
  directives only: no OpenMP runtime) are used when the compiler accepts them; the
  transcendental functions
  (``exp``, ``log``, ``tanh``, ...) come from the C library, in its vector versions
  (glibc's libmvec, at most 4 ulp) where the compiler can call them.
- Tiles: in a group of at least :data:`TILED_MIN_ELEMENTS` elements with several slow
  members (a call of the maths library, a division), the loop is cut after each slow
  member and the elements are taken a tile at a time (:func:`_segments`): one loop per
  segment over the tile, so the CPU overlaps the slow calls of successive elements
  instead of waiting on each element's chain.
- Row sums: a float sum over the second dimension of a 2-d member right after the
  group (see :func:`row_sum`) is added up in the group's loop, in double, and stored
  once per row.
- Threads: each function takes the range of elements (or rows, for strided reads and
  row sums) it computes. Groups of at least :data:`PARALLEL_ELEMENTS` elements are called in blocks
  of :data:`BLOCK_ELEMENTS` on geon's own threads (``fusion.run_blocks``, with
  ``fusion.MAX_THREADS`` workers, i.e. ``GEON_NUM_THREADS``), which take the next block
  as they become free, so a busy core costs at most its share; :mod:`ctypes` lets go
  of the GIL during each call. There is no OpenMP runtime: its idle threads spin, and
  a process that also loaded PyTorch's (which is initialized as PyTorch wants, before
  geon can set ``OMP_WAIT_POLICY``) ran the MLP step of the benchmarks at batch 128 in
  16.7 ms instead of 2.7, its spinning threads taking the cores from the BLAS.
- Cache: libraries are kept under ``$GEON_CACHE_DIR/kernels`` (default
  ``~/.cache/geon/kernels``), named by a hash of the C source, the compiler, its flags
  and the CPU; each is written to a temporary name and renamed, with a ``.sha256`` file
  of its digest checked before it is loaded (a file that does not match, or that lacks
  one of the kernels, is rebuilt). What the probe of the compiler found (which of
  :data:`PROBE_FLAGS` work) is kept there too, per compiler version and CPU, so a
  process whose kernels are all cached runs the compiler once (``--version``), not
  for the probe. The folder is opened once per build and checked through its
  descriptor (:func:`open_folder`: a real folder, this user's, writable by no one
  else); every read, write and rename in it is relative to that descriptor, the
  compiler runs in it through ``/proc/self/fd``, and a library is loaded from a new
  copy of the bytes that were checked, so a folder swapped in under the same path
  (by another user who may write to the folder above) is never used.
- Fallback: no compiler (``$CC``, else ``cc``, ``gcc`` or ``clang`` on the PATH), no
  cache folder or an unknown ndarray layout give the NumPy code (with ``compiled=True``
  after a :class:`~geon.errors.GeonWarning`, once per cause: :data:`UNAVAILABLE`); a
  failed compilation or load, or a compiler that fails the IEEE checks, gives it after
  a warning in either mode.
"""

import ctypes
import errno
import hashlib
import json
import math
import os
import platform
import secrets
import shlex
import shutil
import stat
import subprocess
import tempfile
import threading
import warnings

import numpy as np

from geon.errors import GeonWarning
from geon.op_graph import op_graph as og
from geon.op_graph import primitives as pr
from geon.op_graph.np_ops import Select
from geon.transformers import fusion

#: Groups with at least this many elements run in blocks on several threads.
PARALLEL_ELEMENTS = 1 << 20
#: Elements per block handed to a thread (rows of strided groups: this many elements'
#: worth, at least one row).
BLOCK_ELEMENTS = 1 << 18
#: At most this many ops per C function: the compiler's time grows faster than the
#: function's length (a 5,000-op loop took 36 s, 1,000 ops 2.8 s).
MAX_MEMBERS = 250
#: Elements per step of a function's outer loop (a step's tiles stay in cache).
CHUNK_ELEMENTS = 1 << 14
#: Elements of a row taken at a time in a group with strided reads. An input read
#: through strides whose last one is not the element size is first copied into a
#: contiguous array of this many elements (filled with one value where that stride is
#: 0, as for a broadcast bias), so the loops over the row read every input as
#: contiguous memory; element by element, a load through a stride the compiler does not
#: know took as long as the rest of the loop (a bias add and ReLU over 512 x 1,024
#: floats right after their GEMM: 369 us read through the stride, 198 us from a filled
#: row, on one Cascade Lake core).
ROW_CHUNK_ELEMENTS = 1024
#: At most this many bytes of those contiguous arrays per function (they are on the C
#: stack, of a thread too): a group with many strided inputs takes shorter chunks.
ROW_BUFFER_BYTES = 1 << 16
#: Flags always given; ``-march=native`` and ``-fopenmp-simd`` are added when they
#: compile.
BASE_FLAGS = ("-O3", "-fPIC", "-shared", "-std=gnu99", "-fno-math-errno",
              "-fno-trapping-math", "-ffp-contract=off")
#: Tried first: all of the CPU, with 512-bit vectors where it has them (GCC prefers 256
#: bits on AVX-512 CPUs; the 20-op chain, mostly exp / tanh / log from libmvec, ran in
#: 25 ms per 4M floats with 512 bits against 48 ms with 256, one Cascade Lake core).
NATIVE_FLAGS = ("-march=native", "-mprefer-vector-width=512")

_CTYPE = {np.dtype(np.float32): "float", np.dtype(np.float64): "double",
          np.dtype(np.bool_): "unsigned char",
          np.dtype(np.int8): "int8_t", np.dtype(np.int16): "int16_t",
          np.dtype(np.int32): "int32_t", np.dtype(np.int64): "int64_t",
          np.dtype(np.uint8): "uint8_t", np.dtype(np.uint16): "uint16_t",
          np.dtype(np.uint32): "uint32_t", np.dtype(np.uint64): "uint64_t"}
_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


class CompileError(Exception):
    """The compiled path cannot be used (no compiler, compilation failed, ...);
    ``key`` names the cause (one warning per cause)."""

    def __init__(self, message, key=None):
        super().__init__(message)
        self.key = key or message


#: ``NumPyTransformer(compiled=AUTO)``, the default: groups of at least
#: :data:`AUTO_MIN_ELEMENTS` elements are compiled where a C compiler works; smaller
#: ops are not fused.
AUTO = "auto"
#: The smallest group :data:`AUTO` compiles. A C function costs tens of milliseconds
#: of compiler time per op once (then it is cached), and saves a pass over memory and
#: a NumPy call per op and call: from 65,536 elements that pays back within about a
#: hundred calls (the MLP step at batch 128: 512 x 128 activations, 0.09-0.15 ms of
#: about 2.7 ms per step, in paired steps). Below it, the saving is mostly NumPy's
#: per-call cost, a microsecond or two per op, and compiling pays back only after
#: thousands of calls: ``compiled=True`` compiles those too.
AUTO_MIN_ELEMENTS = 1 << 16

#: The causes of a :class:`CompileError` that mean this machine cannot compile (no
#: compiler, no cache directory, an unknown ndarray layout): with :data:`AUTO` they
#: give the NumPy code silently; a failed compilation still warns.
UNAVAILABLE = frozenset({"no compiler", "no cache", "layout"})


_auto_off = set()  # (CC, cache folder) where AUTO found that it cannot compile


def _where():
    return os.environ.get("CC", ""), cache_dir()


def auto_unavailable():
    """Whether :data:`AUTO` found earlier in this process that it cannot compile with
    this ``$CC`` and cache folder (no compiler, no cache, libraries that do not load):
    it then goes straight to the NumPy code instead of generating code twice."""
    return _where() in _auto_off


def auto_failed(error):
    """Remember a :class:`CompileError` of :data:`AUTO` that will happen again for every
    computation (see :func:`auto_unavailable`); a failed compilation is not one: it is
    about one C source."""
    if error.key in UNAVAILABLE or error.key in ("load failed", "ieee"):
        _auto_off.add(_where())


def mode(compiled=None):
    """The compiled mode ``NumPyTransformer(compiled=...)`` stands for: True (every
    group that compiles, small ones too), False (none) or :data:`AUTO`. ``None`` reads
    the environment variable ``GEON_COMPILED``: unset, empty or ``auto`` give AUTO;
    ``0``, ``false``, ``no`` or ``off`` False; anything else True."""
    if compiled is None:
        v = os.environ.get("GEON_COMPILED", "").strip().lower()
        if v in ("", AUTO):
            return AUTO
        return v not in ("0", "false", "no", "off")
    if isinstance(compiled, str):
        if compiled.strip().lower() == AUTO:
            return AUTO
        raise ValueError(f"compiled must be True, False, {AUTO!r} or None, not "
                         f"{compiled!r}")
    return bool(compiled)


_warned = set()
_warn_lock = threading.Lock()


def warn_once(key, message):
    """A GeonWarning, once per ``key`` in this process."""
    with _warn_lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(message, GeonWarning, stacklevel=4)


# --- the C rules ----------------------------------------------------------------------
def _fn(name, t):
    return name + ("f" if t == "float" else "")


def sigmoid_limit(dtype):
    """The largest whole number whose exp is finite in ``dtype`` (11 for float16, 88 for
    float32, 709 for float64): the clamp of ``-x`` before ``exp`` in the sigmoid. Up to
    it the result is exact wherever it is a normal number; beyond it the result is
    already below the smallest normal number."""
    return float(math.floor(math.log(float(np.finfo(dtype).max))))


def _sigmoid(op, t, a):
    limit = repr(sigmoid_limit(op.dtype)) + ("f" if t == "float" else "")
    return f"(({t})1 / (({t})1 + {_fn('exp', t)}(geon_min_{t[0]}(-{a[0]}, {limit}))))"


def _softplus(op, t, a):
    x = a[0]
    return (f"({x} != {x} ? {x} : geon_max_{t[0]}({x}, ({t})0) + "
            f"{_fn('log1p', t)}({_fn('exp', t)}(-{_fn('fabs', t)}({x}))))")


def _call(name):
    return lambda op, t, a: f"{_fn(name, t)}({', '.join(a)})"


def _infix(sym):
    return lambda op, t, a: f"({a[0]} {sym} {a[1]})"


#: ElementWise class -> fn(op, C type of the compute dtype, [arg expressions]) -> C
#: expression. The args are already converted to the compute dtype (comparisons: their
#: promoted dtype; ``Select``: as they are).
C_RULES = {
    og.Add: _infix("+"), og.Subtract: _infix("-"), og.Multiply: _infix("*"),
    og.Divide: _infix("/"),
    og.Power: _call("pow"),
    og.Maximum: lambda op, t, a: f"geon_max_{t[0]}({a[0]}, {a[1]})",
    og.Minimum: lambda op, t, a: f"geon_min_{t[0]}({a[0]}, {a[1]})",
    og.Equal: _infix("=="), og.NotEqual: _infix("!="), og.Less: _infix("<"),
    og.LessEqual: _infix("<="), og.Greater: _infix(">"), og.GreaterEqual: _infix(">="),
    og.Negative: lambda op, t, a: f"(-{a[0]})",
    og.Absolute: _call("fabs"),
    # NumPy's sign: 1, -1, 0 (also for -0) and NaN for NaN
    og.Sign: lambda op, t, a: (f"({a[0]} > 0 ? ({t})1 : {a[0]} < 0 ? ({t})-1 : "
                               f"{a[0]} == 0 ? ({t})0 : {a[0]})"),
    og.Square: lambda op, t, a: f"({a[0]} * {a[0]})",
    og.Sqrt: _call("sqrt"),
    og.Reciprocal: lambda op, t, a: f"(({t})1 / {a[0]})",
    og.Exp: _call("exp"), og.Log: _call("log"), og.Sin: _call("sin"),
    og.Cos: _call("cos"), og.Tanh: _call("tanh"), og.Expm1: _call("expm1"),
    og.Sigmoid: _sigmoid,
    og.Softplus: _softplus,
    # in double and rounded once, as geon.op_graph.special.erf does for float32
    og.Erf: lambda op, t, a: f"(({t})erf((double){a[0]}))",
    Select: lambda op, t, a: f"({a[0]} ? {a[1]} : {a[2]})",
}

_MATH_USED = ("exp", "log", "sin", "cos", "tanh", "expm1", "pow", "log1p", "erf")


def supported(op):
    """Whether ``op`` (an elementwise op) has a C rule for its dtypes."""
    if type(op) not in C_RULES or op.dtype not in _FLOATS:
        return False
    if any(a.dtype not in _CTYPE for a in op.args):
        return False
    ct = op.compute_dtype()
    if isinstance(op, og.Comparison):
        return ct in _CTYPE
    return ct is None or ct in _FLOATS


def row_sum(op):
    """Whether ``op`` may end a compiled group as a sum of a member's rows (the group
    finder checks that it reduces the second dimension of a 2-d member): a float
    ReduceSum of its own dtype, accumulated in double."""
    return isinstance(op, pr.ReduceSum) and op.dtype in _FLOATS \
        and op.args[0].dtype == op.dtype


def fusable(op, min_elements=0):
    """The fusion predicate of ``compiled=True``: what fusion fuses anyway, and
    elementwise ops of at least ``min_elements`` elements (any size) that compile."""
    return fusion._fusable(op) or (isinstance(op, og.ElementWise) and len(op.axes) >= 1
                                   and op.axes.size >= min_elements and supported(op))


def auto_fusable(op):
    """The fusion predicate of :data:`AUTO`: :func:`fusable` from
    :data:`AUTO_MIN_ELEMENTS` elements."""
    return fusable(op, AUTO_MIN_ELEMENTS)


def _literal(value, dtype):
    """A C expression of exactly ``value`` in ``dtype``."""
    t = _CTYPE[np.dtype(dtype)]
    v = np.asarray(value).astype(dtype)[()]
    if np.dtype(dtype).kind == "f":
        f = float(v)
        if f != f:
            return f"(({t})NAN)"
        if f in (float("inf"), float("-inf")):
            return f"(({t}){'-' if f < 0 else ''}INFINITY)"
        return f"(({t}){f.hex()})"
    if np.dtype(dtype).kind == "b":
        return "((unsigned char)1)" if v else "((unsigned char)0)"
    if np.dtype(dtype).kind == "u":
        return f"(({t}){int(v)}ULL)"
    iv = int(v)
    if iv == -2 ** 63:
        return "((int64_t)(-9223372036854775807LL - 1))"
    return f"(({t}){iv}LL)"


# --- the toolchain --------------------------------------------------------------------
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
    calls = " + ".join(f"{_fn(n, 'float')}(x[i]{', x[i]' if n == 'pow' else ''})"
                       for n in _MATH_USED)
    return ("#include <math.h>\n#include <stdint.h>\n"
            + (_simd_declarations() if simd_math else "") + """
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
    library, and a known ndarray layout)."""
    try:
        toolchain()
    except CompileError:
        return False
    return ndarray_offsets() is not None


# --- ndarray layout -------------------------------------------------------------------
_layout = []


def ndarray_offsets():
    """Byte offsets of the data pointer and the strides pointer in an ndarray object,
    found (and checked) on a test array; None if not found."""
    if not _layout:
        _layout.append(_find_offsets())
    return _layout[0]


def _find_offsets():
    a = np.zeros((3, 5), np.float64)[:, ::2]
    base = id(a)
    for off in range(8, 129, 8):
        if ctypes.c_void_p.from_address(base + off).value != a.ctypes.data:
            continue
        strides = ctypes.c_void_p.from_address(base + off + 24).value
        dims = ctypes.c_void_p.from_address(base + off + 16).value
        if not strides or not dims:
            continue
        if (list((ctypes.c_int64 * 2).from_address(strides)) == list(a.strides)
                and list((ctypes.c_int64 * 2).from_address(dims)) == list(a.shape)
                and ctypes.c_int.from_address(base + off + 8).value == 2):
            return off, off + 24
    return None


# --- the cache ------------------------------------------------------------------------
def cache_dir():
    """Where compiled kernels are kept: ``$GEON_CACHE_DIR/kernels``, default
    ``~/.cache/geon/kernels``."""
    root = os.environ.get("GEON_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "geon")
    return os.path.join(root, "kernels")


#: Where this process's open descriptors have paths (Linux): ``/proc/self/fd/N`` is
#: the folder opened as N, whatever its old path names by now.
_PROC_FD = "/proc/self/fd"
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def _fresh(prefix, suffix=""):
    """A name never used before (for files made with O_EXCL)."""
    return f"{prefix}{secrets.token_hex(8)}{suffix}"


def _mine(st, strict=True):
    """Whether ``st`` is this user's, and (``strict``) writable by no one else."""
    return st.st_uid == os.getuid() and not (strict and st.st_mode & 0o022)


class Folder:
    """A folder opened once and checked through its descriptor (:func:`open_folder`).

    Every later open, write, rename and removal in it is relative to that descriptor
    (``dir_fd``, never following a symbolic link), and the compiler and the loader
    reach it by :meth:`at`, so a folder swapped in under its path after the check
    (by anyone who may write to the folder above) is never read or written. Close it
    after use (or use ``with``)."""

    def __init__(self, fd, path):
        self.fd, self.path = fd, path
        self.via_fd = os.path.isdir(_PROC_FD)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def _dir(self):
        """The descriptor to open relative to; an error once closed (``dir_fd=None``
        would name the working directory instead)."""
        if self.fd is None:
            raise OSError(f"the cache folder {self.path} was closed")
        return self.fd

    def at(self, name=""):
        """A path naming ``name`` in this folder: through the descriptor
        (``/proc/self/fd/N/name``) where the system has such paths, else through the
        folder's path (then checked from the root: see :func:`open_folder`)."""
        base = f"{_PROC_FD}/{self.fd}" if self.via_fd else self.path
        return os.path.join(base, name) if name else base

    def pass_fds(self):
        """The descriptors a child process needs to reach :meth:`at`."""
        return (self.fd,) if self.via_fd else ()

    def read(self, name, strict=True):
        """The bytes of the file ``name``, read through one descriptor; None where it is
        missing or not a regular file of this user's (``strict``: that no one else may
        write)."""
        try:
            fd = os.open(name, os.O_RDONLY | _NOFOLLOW, dir_fd=self._dir())
        except OSError:
            return None
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or not _mine(st, strict):
                return None
            return f.read()

    def write_new(self, name, data, mode=0o600):
        """Write ``data`` to a new file ``name`` (which must not exist)."""
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, mode,
                     dir_fd=self._dir())
        with os.fdopen(fd, "wb") as f:
            f.write(data)

    def write_atomic(self, name, data):
        """Write ``data`` to ``name`` under a fresh name, then rename it: a reader sees
        the old file or the whole new one."""
        tmp = _fresh(".tmp-", "-" + name)
        try:
            self.write_new(tmp, data)
            os.replace(tmp, name, src_dir_fd=self._dir(), dst_dir_fd=self._dir())
        except BaseException:
            self.unlink(tmp)
            raise

    def unlink(self, name):
        """Remove the file ``name`` if it is there."""
        try:
            os.unlink(name, dir_fd=self._dir())
        except FileNotFoundError:
            pass


def open_folder(d, make=False):
    """The folder ``d`` (made readable by its owner only if ``make`` and it is missing)
    as a :class:`Folder`, after checking through its descriptor that libraries may be
    loaded from it: a real folder (not a symbolic link), this user's, writable by no
    one else, who could otherwise put code there that geon would run. Where the system
    cannot name a descriptor as a path (no ``/proc/self/fd``), every folder above it
    must be this user's or root's and writable by no one else (or sticky, as /tmp),
    so that its path keeps naming it. Raises :class:`CompileError` (cause "no
    cache")."""
    if not hasattr(os, "getuid") or os.open not in os.supports_dir_fd:
        raise CompileError("no kernel cache on this system: it cannot open files "
                           "relative to a folder", key="no cache")
    try:
        if make:
            os.makedirs(os.path.dirname(d), exist_ok=True)
            try:
                os.mkdir(d, 0o700)
            except FileExistsError:
                pass
        fd = os.open(d, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NOFOLLOW)
    except OSError as e:
        why = ("it is a symbolic link (set GEON_CACHE_DIR to the folder it points to)"
               if e.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(d) else e)
        raise CompileError(f"cannot create the kernel cache {d}: {why}",
                           key="no cache") from None
    folder = Folder(fd, d)
    try:
        st = os.fstat(fd)
        if not stat.S_ISDIR(st.st_mode) or not _mine(st):
            raise CompileError(f"the kernel cache {d} belongs to another user or "
                               f"others may write to it: no library is loaded from it "
                               f"(set GEON_CACHE_DIR to a folder of your own)",
                               key="no cache")
        if not folder.via_fd:
            folder.path = _check_path(d, st)
        if not os.access(folder.at(), os.W_OK | os.X_OK):
            raise CompileError(f"cannot write to the kernel cache {d}", key="no cache")
    except BaseException:
        folder.close()
        raise
    return folder


def _check_path(d, st):
    """The real path of the folder ``d`` opened with status ``st``, where no other user
    can change what it names (see :func:`open_folder`)."""
    real = os.path.realpath(d)
    parts = real.split(os.sep)
    for k in range(1, len(parts)):
        above = os.sep.join(parts[:k]) or os.sep
        s = os.stat(above)
        if s.st_uid not in (0, os.getuid()) or (s.st_mode & 0o022
                                                 and not s.st_mode & stat.S_ISVTX):
            raise CompileError(f"others may change the folder {above} above the "
                               f"kernel cache {d}: no library is loaded from it (set "
                               f"GEON_CACHE_DIR to a folder of your own)",
                               key="no cache")
    s = os.stat(real)
    if (s.st_dev, s.st_ino) != (st.st_dev, st.st_ino):
        raise CompileError(f"the kernel cache {d} was moved while it was checked",
                           key="no cache")
    return real


def open_cache():
    """The kernel cache (:func:`cache_dir`) as a checked :class:`Folder`, made if
    missing; raises :class:`CompileError` (cause "no cache")."""
    return open_folder(cache_dir(), make=True)


_libs = {}
_lib_lock = threading.Lock()


def _digest(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def cache_key(source, tc):
    h = hashlib.sha256()
    for part in (source, tc.identity, " ".join(tc.flags)):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:40]


def build(source, symbols=()):
    """The loaded library of C ``source``, which defines the functions ``symbols``:
    from the cache when a checked copy is there, else compiled and stored. Raises
    :class:`CompileError`."""
    tc = toolchain()
    key = cache_key(source, tc)
    with _lib_lock:
        lib = _libs.get(key)
        if lib is not None:
            return lib
        with open_cache() as folder:
            lib = _load_cached(folder, key, symbols)
            if lib is None:
                try:
                    lib = _compile(tc, source, folder, key, symbols)
                except OSError as e:  # a full disk, a folder that turned read-only, ...
                    raise CompileError(f"cannot build the kernels in {folder.path}: "
                                       f"{e}", key="no cache") from None
                except CompileError:
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


def _compile(tc, source, folder, key, symbols=()):
    """Compile ``source``, load it, and keep it in ``folder`` as ``key``: the ``.c``
    file, the ``.sha256`` digest, then the library, each renamed into place (a reader
    that sees the new library also sees its digest)."""
    try:
        lib, data = _build_in(folder, tc.command, tc.flags, source)
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


# --- code generation ------------------------------------------------------------------
_HEADER = """\
/* geon: fused elementwise groups of one computation (generated) */
#include <math.h>
#include <stdint.h>
#define GEON_DATA(o) (*(char **)((char *)(o) + {data}))
#define GEON_STRIDES(o) (*(const int64_t **)((char *)(o) + {strides}))
/* NumPy's maximum / minimum, bit for bit: a NaN operand wins (a's where both are: b's
   through the comparison, a's through the second select), and of equal operands
   (-0.0 and +0.0) the second, as NumPy gives np.maximum(-0.0, 0.0) = 0.0 and
   np.maximum(0.0, -0.0) = -0.0. Two selects, which GCC vectorizes (maxps / minps). */
#define GEON_MINMAX(name, t, cmp) static inline t name(t a, t b) \\
    {{ const t m = a cmp b ? a : b; return a != a ? a : m; }}
GEON_MINMAX(geon_max_f, float, >)
GEON_MINMAX(geon_min_f, float, <)
GEON_MINMAX(geon_max_d, double, >)
GEON_MINMAX(geon_min_d, double, <)
"""


def _simd_declarations():
    # glibc declares the vector versions only under -ffast-math; these declarations let
    # the compiler call them in `omp simd` loops without it.
    out = []
    for name in _MATH_USED:
        for t in ("float", "double"):
            args = f"{t}, {t}" if name == "pow" else t
            out.append(f"#pragma omp declare simd notinbranch\n{t} {_fn(name, t)}({args});")
    return "\n".join(out) + "\n"


#: Members whose C code calls the C library or divides. In a group with several, each
#: ends a segment: see :func:`_segments`.
_SLOW = (og.Power, og.Sqrt, og.Exp, og.Log, og.Sin, og.Cos, og.Tanh, og.Expm1,
         og.Sigmoid, og.Softplus, og.Erf, og.Divide, og.Reciprocal)
#: Elements per tile of a group run in segments, at most; fewer where the arrays that
#: carry values between segments would pass :data:`TILE_BYTES` (per thread, in L1).
TILE_ELEMENTS = 256
TILE_BYTES = 1 << 15
#: Groups of fewer elements run as one loop: each segment's loop adds tens of
#: milliseconds of compile time, repaid only on large tensors.
TILED_MIN_ELEMENTS = 1 << 16
#: At most this many segments per group (slow members beyond share segments).
MAX_SEGMENTS = 16


def _segments(members, outputs, n, row=None):
    """How a group's loop is cut: ``(segments, slots, decls, tile)``.

    One loop that computes every member of an element before the next element makes each
    element one long chain of dependent instructions (a call into the vector maths
    library, a division, a square root: tens of cycles each), and the CPU cannot look
    far enough ahead to start the next elements meanwhile. So a group with more than one
    slow member (:data:`_SLOW`) is cut after each: the elements are taken a tile at a
    time, and each segment is a loop over the tile whose iterations are independent. A
    value read in a later segment goes through an array of one tile (a *slot*, reused
    once the value is dead); so does each of ``outputs`` (members with a buffer)
    computed before the last segment, which stores them all after its loads, since an
    output may be written over an input's buffer. On the benchmarks' 20-op chain (two
    tanh, two exp, a log, a division, a square root) this took about three quarters of
    the time.

    Groups of fewer than :data:`TILED_MIN_ELEMENTS` elements, or with fewer than two
    slow members, are one loop, and so is a group whose loops run over rows of ``row``
    elements (strided reads) shorter than a tile. A group is cut into at most :data:`MAX_SEGMENTS`
    loops: with more slow members (not counting a last member, after which there is
    nothing to cut), it is cut after every second (third, ...) one, which bounds the
    compile time.

    ``segments``: lists of (index, member); ``slots``: member -> the name of its array;
    ``decls``: array name -> C type; ``tile``: elements per tile (0: one segment, no
    tiles)."""
    everything = [list(enumerate(members))]
    slow = [q for q, m in enumerate(members) if isinstance(m, _SLOW)]
    if n < TILED_MIN_ELEMENTS or len(slow) < 2:
        return everything, {}, {}, 0
    slow = [q for q in slow if q < len(members) - 1]   # no cut after the last member
    every = -(-len(slow) // (MAX_SEGMENTS - 1))
    cuts = set(slow[every - 1::every])
    segments = [[]]
    seg_of = {}
    for q, m in enumerate(members):
        segments[-1].append((q, m))
        seg_of[m] = len(segments) - 1
        if q in cuts:
            segments.append([])
    last = {m: len(segments) - 1 for m in outputs}   # member -> its last segment:
    for m in members:                                  # outputs are stored in the last
        for a in m.args:
            if a in seg_of:
                last[a] = max(last.get(a, 0), seg_of[m])
    slots, decls, sizes, free, live = {}, {}, {}, {}, []
    for s, seg in enumerate(segments):
        for item in [x for x in live if x[0] < s]:   # dead before this segment
            live.remove(item)
            free.setdefault(decls[item[1]], []).append(item[1])
        for _, m in seg:
            if last.get(m, -1) > s:
                t = _CTYPE[m.dtype]
                name = free[t].pop() if free.get(t) else f"tile{len(decls)}"
                decls[name], sizes[name] = t, m.dtype.itemsize
                slots[m] = name
                live.append((last[m], name))
    per_element = sum(sizes.values())
    tile = TILE_ELEMENTS
    while tile > 16 and tile * per_element > TILE_BYTES:
        tile //= 2
    if row is not None and row < tile:
        return everything, {}, {}, 0
    return segments, slots, decls, tile


class Kernels:
    """The compiled groups of one computation being generated: collects a C function per
    group (:meth:`group_code`), then builds them into one library (:meth:`build`)."""

    def __init__(self):
        self.functions = []   # C source of each function
        self.names = []       # the Python name each is called by
        self.groups = 0
        self.source = None    # the C file, once built

    def compilable(self, g, scalars):
        """Whether every member of ``g`` compiles and every input is a buffer, view or
        constant of the group's shape, or a scalar constant."""
        lengths = g.members[0].axes.lengths
        members = set(g.members)
        for m in g.members:
            if not (supported(m) or row_sum(m)):
                return False
            for a in m.args:
                if a in members or a in scalars:
                    continue
                if a.axes.lengths != lengths:
                    return False
        return True

    def group_code(self, g, names, scalars, consts, dynamic, buffer, taken):
        """Python lines running group ``g`` as one C call (see the module docstring).

        ``names``: op -> name of its array (filled here for members with a buffer);
        ``scalars``: scalar constant -> name; ``consts``: name -> value; ``dynamic``:
        the ops whose arrays change between calls; ``buffer(op, lines)``: the name of a
        member's buffer, adding any line that makes it to ``lines``."""
        from geon.transformers.codegen_text import identifier
        lines = []
        members = g.members
        for m in members:
            if m not in g.internal:
                names[m] = buffer(m, lines)
        shape = members[0].axes.shape
        n = int(np.prod(shape))
        k = self.groups
        self.groups += 1
        cname = f"geon_group{k}"
        pyname = identifier(f"kernel{k}", taken)
        # the arrays passed: inputs (contiguous or strided) then outputs
        params, number = [], {}   # array name -> parameter number

        def param(name):
            if name not in number:
                number[name] = len(params)
                params.append(name)
            return number[name]

        inputs, strided, param_dtype = {}, set(), {}
        for m in members:
            for a in m.args:
                if a in inputs or a in g.internal or a in members or a in scalars:
                    continue
                inputs[a] = param(names[a])
                param_dtype[inputs[a]] = a.dtype
                if isinstance(a, (pr.ViewOp, og.Constant)):
                    strided.add(inputs[a])
                elif isinstance(a, og.Placeholder):
                    x = names[a]  # a feed may be any ndarray of the right shape
                    lines.append(f"    if not {x}.flags.c_contiguous: "
                                 f"{x} = _np_contiguous({x})")
        outputs = {m: param(names[m]) for m in members if m not in g.internal}
        # an output never goes through strides: buffers, fresh arrays and variables are
        # contiguous (an input read through a view is never an output's buffer)
        strided -= set(outputs.values())
        # row sums (the group finder puts them last): one accumulator each per row,
        # stored once the row is done
        sums = {m: k for k, m in enumerate(x for x in members if row_sum(x))}
        stored = {m: p for m, p in outputs.items() if m not in sums}
        by_rows = bool(strided or sums)   # loops over rows, then over a row's elements
        rank = len(shape)
        rows = int(np.prod(shape[:-1])) if rank > 1 else 1
        inner = shape[-1] if by_rows else n
        if not by_rows:
            rows = 1
        loads = {}    # parameter -> the line loading element i (or j) of that input
        value = {}
        for a, p in inputs.items():
            t = _CTYPE[a.dtype]
            v = f"x{p}"
            if p in strided:   # q<p>: the current chunk of its row, contiguous
                loads[p] = f"const {t} {v} = q{p}[j - c0];"
            elif by_rows:
                loads[p] = f"const {t} {v} = (({t} *)b{p})[r * {inner} + j];"
            else:
                loads[p] = f"const {t} {v} = (({t} *)b{p})[i];"
            value[a] = (v, a.dtype)
        for m in members:
            for a in m.args:
                if a in scalars and a not in value:
                    value[a] = (_literal(consts[scalars[a]], a.dtype), a.dtype)
        # strided groups: a row's piece, its contiguous copies within ROW_BUFFER_BYTES
        copied = sum(param_dtype[p].itemsize for p in strided)
        chunk = min(inner, ROW_CHUNK_ELEMENTS, max(16, ROW_BUFFER_BYTES // max(1, copied)))
        if sums:   # one loop: the sums add up the values of the last one
            segments, slots, decls, tile = [list(enumerate(members))], {}, {}, 0
        else:
            segments, slots, decls, tile = _segments(members, outputs, n,
                                                     chunk if strided else None)

        def loop_bodies(segments, slots):
            """Per segment, (the lines of its loop body, whether they read or write
            the arrays by element index)."""
            bodies, indexed, values = [], [], dict(value)
            for seg in segments:
                used, body, here = set(), [], {m for _, m in seg}
                for q, m in seg:
                    if m in sums:
                        body.append(f"acc{sums[m]} += (double){values[m.args[0]][0]};"
                                    f"  /* {_c_comment(m)} */")
                        continue
                    ct = m.compute_dtype()
                    t = _CTYPE[ct] if ct is not None else _CTYPE[m.dtype]
                    args = []
                    for a in m.args:
                        v, dt = values[a]
                        if a in inputs:
                            used.add(inputs[a])
                        elif a in slots and a not in here:
                            v = f"{slots[a]}[u]"   # computed in an earlier segment
                        args.append(v if (ct is None or dt == ct)
                                    else f"(({_CTYPE[ct]}){v})")
                    expr = C_RULES[type(m)](m, t, args)
                    mt = _CTYPE[m.dtype]
                    body.append(f"const {mt} v{q} = ({mt}){expr};  /* {_c_comment(m)} */")
                    values[m] = (f"v{q}", m.dtype)
                    if m in slots:
                        body.append(f"{slots[m]}[u] = v{q};")
                bodies.append([loads[p] for p in sorted(used)] + body)
                indexed.append(bool(used))
            # Every store comes last, after every load of the element: an output may
            # be written over an input's buffer.
            here = {m for _, m in segments[-1]}
            idx = f"r * {inner} + j" if by_rows else "i"
            for m, p in stored.items():
                v = values[m][0] if m in here else f"{slots[m]}[u]"
                bodies[-1].append(f"(({_CTYPE[m.dtype]} *)b{p})[{idx}] = {v};")
            indexed[-1] = indexed[-1] or bool(outputs)
            return list(zip(bodies, indexed))

        fused = loop_bodies([list(enumerate(members))], {})[0][0]
        bodies = loop_bodies(segments, slots) if tile else []
        src = [f"/* {len(members)} ops, shape {shape}"
               + (f", {len(segments)} loops over tiles of {tile}" if tile else "") + " */",
               f"void {cname}({''.join(f'void *a{p}, ' for p in range(len(params)))}"
               f"int64_t lo, int64_t hi) {{"]
        for p in range(len(params)):
            src.append(f"    char *const b{p} = GEON_DATA(a{p});")
        for p in sorted(strided):
            src.append(f"    const int64_t *const st{p} = GEON_STRIDES(a{p});")
            for d in range(rank):
                src.append(f"    const int64_t s{p}_{d} = st{p}[{d}];")
            src.append(f"    {_CTYPE[param_dtype[p]]} g{p}[{chunk}] "
                       "__attribute__((aligned(64)));")
        ix = "j" if by_rows else "i"   # the element's index in the loops
        # elements lo..hi (rows lo..hi with strided reads): the caller splits the range
        if not by_rows:
            src += [f"    for (int64_t c = lo; c < hi; c += {CHUNK_ELEMENTS}) {{",
                    f"        const int64_t e = c + {CHUNK_ELEMENTS} < hi ? "
                    f"c + {CHUNK_ELEMENTS} : hi;"]
            first = "c"
        else:
            src.append("    for (int64_t r = lo; r < hi; r++) {")
            for p in sorted(strided):
                src.append(f"        int64_t o{p} = 0;")
            for k in sums.values():
                src.append(f"        double acc{k} = 0;")
            if rank > 1 and strided:
                src.append("        int64_t q = r, d;")
                for dim in range(rank - 2, -1, -1):
                    src.append(f"        d = q % {shape[dim]}; q /= {shape[dim]};")
                    for p in sorted(strided):
                        src.append(f"        o{p} += d * s{p}_{dim};")
            # the row a chunk at a time; each strided input's chunk as contiguous memory
            src += [f"      for (int64_t c0 = 0; c0 < {inner}; c0 += {chunk}) {{",
                    f"        const int64_t e = c0 + {chunk} < {inner} ? "
                    f"c0 + {chunk} : {inner};"]
            for p in sorted(strided):
                t, size, s_ = _CTYPE[param_dtype[p]], param_dtype[p].itemsize, \
                    f"s{p}_{rank - 1}"
                src += [f"        const {t} *q{p} = g{p};",
                        f"        if ({s_} == {size}) {{",
                        f"            q{p} = (const {t} *)(b{p} + o{p}) + c0;",
                        f"        }} else if ({s_} == 0) {{",
                        f"            const {t} w = *(const {t} *)(b{p} + o{p});",
                        f"            for (int64_t j = 0; j < e - c0; j++) g{p}[j] = w;",
                        "        } else {",
                        "            for (int64_t j = c0; j < e; j++)",
                        f"                g{p}[j - c0] = "
                        f"*(const {t} *)(b{p} + o{p} + j * {s_});",
                        "        }"]
            first = "c0"
        if tile:   # whole tiles: one loop per segment, values between them in arrays
            for name, t in decls.items():
                src.append(f"        {t} {name}[{tile}] __attribute__((aligned(64)));")
            src += [f"        int64_t t = {first};",
                    f"        for (; t + {tile} <= e; t += {tile}) {{"]
            for body, indexed in bodies:
                src += ["            #pragma omp simd",
                        f"            for (int64_t u = 0; u < {tile}; u++) {{"]
                if indexed:   # it reads an input or writes an output
                    src.append(f"                const int64_t {ix} = t + u;")
                src += ["                " + ln for ln in body] + ["            }"]
            src.append("        }")
            first = "t"   # the rest: one loop, as below
        # one loop over the elements, every member in registers
        accs = ",".join(f"acc{k}" for k in sums.values())
        src += ["        #pragma omp simd" + (f" reduction(+:{accs})" if sums else ""),
                f"        for (int64_t {ix} = {first}; {ix} < e; {ix}++) {{"]
        src += ["            " + ln for ln in fused] + ["        }"]
        if by_rows:
            src.append("      }")   # the row's chunks
        for m, k in sums.items():
            src.append(f"        (({_CTYPE[m.dtype]} *)b{outputs[m]})[r] = "
                       f"({_CTYPE[m.dtype]})acc{k};")
        src += ["    }", "}"]
        self.functions.append("\n".join(src))
        self.names.append((pyname, cname, len(params)))
        lines.append(f"    # compiled: {len(members) - len(sums)} elementwise ops "
                     + (f"and {len(sums)} sum(s) of their rows " if sums else "")
                     + f"({len(g.internal)} without a full buffer) in "
                     + (f"{len(segments)} C loops over tiles of {tile} of the {n} elements "
                        if tile else f"one C loop over {n} elements ")
                     + f"({cname}{', strided reads' if strided else ''})")
        units = rows if by_rows else n   # the function's range
        threads = fusion.MAX_THREADS if n >= PARALLEL_ELEMENTS else 1
        args = "".join(f"{a}, " for a in params)
        if threads > 1:
            block = max(1, BLOCK_ELEMENTS // (inner if by_rows else 1))
            lines.append(f"    _run_blocks(lambda _lo, _hi: {pyname}({args}_lo, _hi), "
                         f"{units}, {block}, ((),) * {threads})")
        else:
            lines.append(f"    {pyname}({args}0, {units})")
        return lines

    def build(self):
        """``{python name: ctypes function}`` of the collected groups; raises
        :class:`CompileError`."""
        if not self.functions:
            return {}
        offsets = ndarray_offsets()
        if offsets is None:
            raise CompileError("this NumPy's ndarray layout was not recognised",
                               key="layout")
        tc = toolchain()
        source = (_HEADER.format(data=offsets[0], strides=offsets[1])
                  + (_simd_declarations() if tc.simd_math else "") + "\n"
                  + "\n\n".join(self.functions) + "\n")
        self.source = source
        lib = build(source, [cname for _, cname, _ in self.names])
        out = {}
        for pyname, cname, nargs in self.names:
            f = getattr(lib, cname)
            f.argtypes = [ctypes.py_object] * nargs + [ctypes.c_int64] * 2
            f.restype = None
            out[pyname] = f
        return out


def _c_comment(op):
    # the class only: op names differ between equal graphs, and the source is the key
    text = type(op).__name__
    return "".join(c if c.isalnum() or c in " _-.:" else "_" for c in text)


#: Names the generated Python of compiled groups uses.
PY_GLOBALS = {"_np_contiguous": np.ascontiguousarray}
