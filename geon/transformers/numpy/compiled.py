"""Compiled fused groups: one C loop per elementwise group.

This module is the policy (which groups are compiled: :func:`mode`, :data:`AUTO`,
:func:`fusable`) and the compiled path's front: its parts live beside it, in
:mod:`.c_rules` (the C rule of each op), :mod:`.c_codegen` (the C functions of a
computation's groups), :mod:`.toolchain` (the compiler, its probe, building and loading
libraries) and :mod:`.kernel_cache` (the checked cache folder); the names the rest of
geon uses are importable from here.

Which groups: :func:`mode` of ``NumPyTransformer(compiled=...)`` (default: the
environment variable ``GEON_COMPILED``). With :data:`AUTO`, the default, the groups
of at least :data:`AUTO_MIN_ELEMENTS` elements and those of several ops from
:data:`AUTO_SMALL_ELEMENTS` elements, where a compiler works; with True
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
  as they become free, so a busy core costs at most its share; a function lets go of
  the GIL while its loops run over at least ``c_codegen.GIL_RELEASE_ELEMENTS``
  elements. There is no OpenMP runtime: its idle threads spin, and
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
- Arrays: each function takes the arrays as one tuple of Python objects (one argument:
  ``ctypes`` spends about 0.1 us on each argument it converts) and reads their memory
  through the buffer protocol (``PyObject_GetBuffer``: the data pointer, and the
  strides of an input read through a view), called with the GIL held
  (``ctypes.PYFUNCTYPE``), so nothing depends on the layout of NumPy's array objects.
  An array that is not C-contiguous where the code reads it as such, or an output that
  is read-only, is a Python error, not a wrong read.
- Fallback: no compiler (``$CC``, else ``cc``, ``gcc`` or ``clang`` on the PATH) or no
  cache folder give the NumPy code (with ``compiled=True``
  after a :class:`~geon.errors.GeonWarning`, once per cause: :data:`UNAVAILABLE`); a
  failed compilation or load, or a compiler that fails the IEEE checks, gives it after
  a warning in either mode.
"""

import os

from geon.op_graph import op_graph as og
from geon.op_graph.symbols import Sym, evaluate
from geon.transformers import fusion
from geon.transformers.numpy.c_codegen import (  # noqa: F401 - the compiled path's names
    BLOCK_ELEMENTS, CHUNK_ELEMENTS, MAX_MEMBERS, MAX_SEGMENTS, PARALLEL_ELEMENTS,
    PY_GLOBALS, ROW_BUFFER_BYTES, ROW_CHUNK_ELEMENTS, TILE_BYTES, TILE_ELEMENTS,
    TILED_MIN_ELEMENTS, Kernels, _segments)
from geon.transformers.numpy.c_rules import (  # noqa: F401
    C_RULES, c_rule, math_used, row_sum, sigmoid_limit, slow, supported)
from geon.transformers.numpy.kernel_cache import (  # noqa: F401
    CompileError, Folder, cache_dir, open_cache, open_folder)
from geon.transformers.numpy.toolchain import (  # noqa: F401
    BASE_FLAGS, NATIVE_FLAGS, PROBE_FLAGS, REFUSED_FLAGS, REFUSED_PREFIXES, Toolchain,
    available, build, cache_key, toolchain, warn_once)
# the process-wide caches (the same dicts: clearing one here clears the toolchain's)
from geon.transformers.numpy.toolchain import _libs, _toolchains  # noqa: F401
from geon.transformers.numpy import toolchain as _tc  # (its build, patched in tests)

#: ``NumPyTransformer(compiled=AUTO)``, the default: groups of at least
#: :data:`AUTO_MIN_ELEMENTS` elements, and groups of several ops from
#: :data:`AUTO_SMALL_ELEMENTS`, are compiled where a C compiler works; smaller ops are
#: not fused.
AUTO = "auto"
#: The smallest group :data:`AUTO` compiles. A C function costs tens of milliseconds
#: of compiler time per op once (then it is cached), and saves a pass over memory and
#: a NumPy call per op and call: from 65,536 elements that pays back within about a
#: hundred calls (the MLP step at batch 128: 512 x 128 activations, 0.09-0.15 ms of
#: about 2.7 ms per step, in paired steps). Below it, the saving is mostly NumPy's
#: per-call cost, a microsecond or two per op, and compiling pays back only after
#: thousands of calls: AUTO compiles those of several ops (:data:`AUTO_SMALL_ELEMENTS`),
#: ``compiled=True`` all of them.
AUTO_MIN_ELEMENTS = 1 << 16
#: Smaller groups :data:`AUTO` compiles too: those of at least AUTO_SMALL_ELEMENTS
#: elements with at least AUTO_SMALL_MEMBERS ops. Each saves a NumPy call per op it
#: fuses and call, and its C function is compiled once per machine (the kernel cache
#: keeps it on disk), so a model that runs many times pays back: the layer norms,
#: GELUs and softmaxes of a small transformer (2 x 17 x 64 to 2 x 2 x 32 x 32
#: elements) are 17-18 such groups, and the zoo's vit_small forward took 0.224 ms
#: against 0.262, BERT and GPT-2 (hidden 128) 0.92 and 0.90 of their time (one
#: thread, interleaved calls). Single ops and tiny groups stay NumPy calls: there the
#: C call saves nothing, and a test suite's thousands of small graphs would compile
#: a function each (geon's own suite: about 8% longer with these thresholds). In a
#: loop's body (a scan's, run once per step) groups of AUTO_SMALL_MEMBERS ops are
#: compiled at any size: the zoo's LSTM cell (4 x 64, 13 ops) is one C call a step.
AUTO_SMALL_ELEMENTS = 1 << 10
AUTO_SMALL_MEMBERS = 2

#: The causes of a :class:`CompileError` that mean this machine cannot compile (no
#: compiler, no cache directory): with :data:`AUTO` they
#: give the NumPy code silently; a failed compilation still warns.
UNAVAILABLE = frozenset({"no compiler", "no cache"})


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


def fixed_library(loaded, what, source, symbols, bind):
    """``bind(lib)`` of the library of the fixed C ``source`` (the direct convolutions,
    erf): built once per ``$CC`` and cache folder and kept in ``loaded``; None where
    the compiled path is off (``GEON_COMPILED=0``) or cannot run here (silently), or
    where the build fails (after one warning naming ``what``)."""
    if mode() is False:
        return None
    where = (os.environ.get("CC", ""), os.environ.get("GEON_CACHE_DIR", ""))
    if where in loaded:
        return loaded[where]
    fns = None
    try:
        lib = _tc.build(source(), symbols)
    except CompileError as e:
        if e.key not in UNAVAILABLE:
            _tc.warn_once((what, e.key), f"the {what} did not compile ({str(e)[:300]}): "
                                         f"geon runs its NumPy code instead")
    else:
        fns = bind(lib)
    loaded[where] = fns
    return fns


def fusable(op, min_elements=0, hints=None):
    """The fusion predicate of ``compiled=True``: what fusion fuses anyway, and
    elementwise ops of at least ``min_elements`` elements (any size) that compile. In a
    computation with symbolic lengths, ``hints`` (``{symbol: length}``) give the sizes
    of ops with symbolic lengths, which must be in their first dimension only (the
    rows: a kernel's loops take the count of rows as an argument); without hints they
    are not fused."""
    if fusion.hinted_fusable(hints)(op):
        return True
    if not (isinstance(op, og.ElementWise) and len(op.axes) >= 1 and supported(op)):
        return False
    size = op.axes.size
    if isinstance(size, Sym):
        if hints is None or any(isinstance(n, Sym) for n in op.axes.lengths[1:]):
            return False
        size = evaluate(size, hints)
    return size >= min_elements


def auto_fusable(op, hints=None):
    """The fusion predicate of :data:`AUTO`: :func:`fusable` from
    :data:`AUTO_SMALL_ELEMENTS` elements (or :data:`AUTO_MIN_ELEMENTS`, if lower); the
    groups it gives are kept from AUTO_MIN_ELEMENTS elements, or with
    :data:`AUTO_SMALL_MEMBERS` ops."""
    return fusable(op, min(AUTO_SMALL_ELEMENTS, AUTO_MIN_ELEMENTS), hints)
