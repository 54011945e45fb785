"""Native backends: shared libraries implementing ``geon_backend.h``, loaded at run time.

:func:`load_backend` loads a library with :mod:`ctypes` (part of Python: geon needs no
compiler, and ``pip install -e .`` no build step, to load one), checks it, and returns
a :class:`~geon.transformers.backends.Backend`. The checks, each a
:class:`NativeBackendError` naming the library:

- before it is loaded: the file and every folder above it are no one else's to change:
  owned by this user or root, not writable by group or others (a folder may be if it
  has the sticky bit, as /tmp does), the rule the kernel cache follows (the libraries
  it depends on are found by the system's loader, as for any library, and are not
  checked);
- then it loads, and it has every function of the ABI (a missing one is named);
- ``geon_backend_abi_version()`` is this geon's :data:`ABI_VERSION`.

Tensors are passed as DLPack ``DLTensor`` structs describing the NumPy arrays' own
memory (data pointer, shape and strides in elements; copied first only where the data
is misaligned or a stride is not a whole number of elements); the outputs are arrays
geon allocates with the plan's shapes and dtypes (new arrays at every run; the
DLTensor structs themselves are made once per executable). One executable runs one
call at a time: calls from several threads take turns. An OpenBLAS that the library
brought into the process when it loaded (libgeon_native's scipy-openblas32) follows
geon's thread policy at each run, as NumPy's does (:mod:`geon.transformers.threads`;
on the call path below, at a run at most every 20 ms: the policy measures the load
every 0.2 s).
:func:`include_dir` is the folder holding ``geon_backend.h``.

A run goes through the *call path* (``geon/transformers/native/callpath.py``), a small
C extension module built at the first executable through geon's toolchain and kernel
cache, which does the checks and the call without Python code per tensor; where it
cannot be built (no compiler, no ``Python.h``) every run goes through ctypes, with
the same results and errors. :attr:`NativeBackend.call_path` says which.
"""

import ctypes
import os
import stat
import threading
from typing import Any

import numpy as np

from geon.errors import GeonError
from geon.transformers.backends import Backend, Executable, read_plan
from geon.transformers.native import callpath as _callpath
from geon.transformers.numpy.kernel_cache import changeable_by_others
from geon.transformers.threads import POLICY, _blas_thread_api, mapped_openblas

__all__ = ["ABI_VERSION", "STATUS", "SYMBOLS", "DLTensor", "NativeBackend",
           "NativeBackendError", "include_dir", "load_backend"]

#: The ABI version this geon speaks (``GEON_BACKEND_ABI_VERSION`` of its header).
ABI_VERSION = 1
#: The functions a library must export.
SYMBOLS = ("geon_backend_abi_version", "geon_backend_create", "geon_backend_run",
           "geon_backend_destroy")
#: ``geon_status`` codes and their names.
STATUS = {0: "GEON_OK", 1: "GEON_ERR_INVALID_PLAN", 2: "GEON_ERR_UNSUPPORTED",
          3: "GEON_ERR_BAD_TENSOR", 4: "GEON_ERR_OUT_OF_MEMORY", 5: "GEON_ERR_INTERNAL"}
_ERR_LEN = 4096


class NativeBackendError(GeonError, RuntimeError):
    """A native backend could not be loaded, or returned an error (``status``: its
    ``geon_status`` code, or None for a library refused before any call)."""

    def __init__(self, message: str, status: Any = None) -> None:
        super().__init__(message)
        self.status = status


def include_dir() -> str:
    """The folder of ``geon_backend.h`` (``-I`` it when building a backend)."""
    return os.path.dirname(os.path.abspath(__file__))


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    """DLPack's ``DLTensor``, as ``geon_backend.h`` declares it."""
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


_CODES = {"i": 0, "u": 1, "f": 2, "b": 6}   # NumPy kind -> DLPack type code
_CPU = 1


def _address(a: np.ndarray) -> int:
    """The address of array ``a``'s first element (through the buffer protocol where it
    can: much faster than ``a.ctypes.data``)."""
    if a.flags.c_contiguous and a.flags.writeable and a.nbytes:
        return ctypes.addressof(ctypes.c_char.from_buffer(a))
    return a.ctypes.data


class _BlasThreads:
    """The backend's own OpenBLAS (one it loaded, e.g. libgeon_native's
    scipy-openblas32) follows geon's thread policy (:mod:`geon.transformers.threads`)
    as NumPy's does: under load from other processes, fewer threads, never more than
    it had at first (``OPENBLAS_NUM_THREADS`` stands). Two BLAS threads on a 2-core
    machine with one core busy elsewhere made the MLP step many times slower."""

    def __init__(self, api: Any) -> None:
        self.api, self.cap, self.now = api, None, None

    def apply(self) -> None:
        n = POLICY.refresh()
        if n == self.now:
            return
        get, put = self.api
        have = get()
        if self.cap is None or have != self.now:   # first time, or changed by others
            self.cap = have
        want = max(1, min(n, self.cap))
        if want != have:
            put(want)
        self.now = want


def _check_owner(path: str) -> str:
    """The real path of the library ``path`` where no other user can change it."""
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except OSError as e:
        raise NativeBackendError(f"no backend library at {path}: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise NativeBackendError(f"the backend {path} is not a regular file")
    if st.st_uid not in (0, os.getuid()) or st.st_mode & 0o022:
        raise NativeBackendError(f"others may change the backend library {path} (owned by "
                                 f"uid {st.st_uid}, mode {stat.filemode(st.st_mode)}): "
                                 f"it is not loaded")
    above = changeable_by_others(real)
    if above is not None:
        raise NativeBackendError(f"others may change the folder {above} above the backend "
                                 f"library {path}: it is not loaded")
    return real


class NativeBackend(Backend):
    """A shared library implementing ``geon_backend.h`` (see :func:`load_backend`)."""

    def __init__(self, path: str) -> None:
        real = _check_owner(path)
        before = mapped_openblas()
        try:
            lib = ctypes.CDLL(real, mode=ctypes.RTLD_LOCAL)
        except OSError as e:
            raise NativeBackendError(f"the backend {path} does not load: {e}") from None
        self._own_blas = _own_openblas(before, mapped_openblas())
        missing = [s for s in SYMBOLS if not hasattr(lib, s)]
        if missing:
            raise NativeBackendError(f"the backend {path} lacks {', '.join(missing)} of "
                                     f"geon_backend.h")
        lib.geon_backend_abi_version.restype = ctypes.c_uint32
        version = lib.geon_backend_abi_version()
        if version != ABI_VERSION:
            raise NativeBackendError(f"the backend {path} speaks ABI version {version}, "
                                     f"this geon version {ABI_VERSION}")
        lib.geon_backend_create.argtypes = [ctypes.c_char_p, ctypes.c_size_t,
                                            ctypes.POINTER(ctypes.c_void_p),
                                            ctypes.c_char_p, ctypes.c_size_t]
        lib.geon_backend_create.restype = ctypes.c_int
        lib.geon_backend_run.argtypes = [ctypes.c_void_p, ctypes.POINTER(DLTensor),
                                         ctypes.c_int32, ctypes.POINTER(DLTensor),
                                         ctypes.c_int32, ctypes.c_char_p, ctypes.c_size_t]
        lib.geon_backend_run.restype = ctypes.c_int
        lib.geon_backend_destroy.argtypes = [ctypes.c_void_p]
        lib.geon_backend_destroy.restype = None
        self.lib, self.path = lib, path
        self.name = os.path.basename(path)
        self._run_address = ctypes.cast(lib.geon_backend_run, ctypes.c_void_p).value
        self._module: Any = False   # the call path module (None: ctypes); at first use

    @property
    def call_path(self) -> str:
        """The path executables run through, ``"extension"`` (the call path module,
        ``geon/transformers/native/callpath.py``) or ``"ctypes"`` (where that cannot be
        built or loaded here), decided at the first executable."""
        return "ctypes" if self._call_module() is None else "extension"

    def _call_module(self) -> Any:
        if self._module is False:
            self._module = _callpath.load()
        return self._module

    def load(self, document: str) -> Executable:
        return _NativeExecutable(self, document)

    def blas_threads(self) -> Any:
        """What keeps the OpenBLAS this library brought in on geon's thread policy (a
        ``_BlasThreads``), or None if it brought none."""
        if "_blas" not in self.__dict__:
            api = _blas_thread_api(self._own_blas) if self._own_blas else None
            self._blas = None if api is None else _BlasThreads(api)
        return self._blas


def _own_openblas(before: set, after: set) -> set:
    """The OpenBLAS libraries a backend library brought: those mapped by loading it,
    or, where it was mapped already (scipy-openblas32's Python package maps its library
    when imported, as ``build_runtime`` does to find it), every one but NumPy's, whose
    threads NumPy's policy sets (:mod:`geon.transformers.threads`)."""
    new = after - before
    if new:
        return new
    numpy_dir = os.path.dirname(os.path.realpath(np.__file__))
    return {p for p in after
            if not os.path.realpath(p).startswith((numpy_dir + os.sep, numpy_dir + ".libs"))}


def _failed(backend: NativeBackend, what: str, status: int, err: Any) -> NativeBackendError:
    message = (err if isinstance(err, bytes) else err.value).decode("utf-8", "replace") \
        or "(no message)"
    return NativeBackendError(f"{backend.name}: {what} failed with "
                              f"{STATUS.get(status, status)}: {message}", status)


def _loops(doc: dict) -> list[str]:
    """The names of the op types with bodies (loops, branches) in plan ``doc``'s
    graph."""
    from geon.op_graph.serialize_bodies import BODY_ATTRS
    names = {cls.__name__ for cls in BODY_ATTRS}
    return sorted({r.get("op") for r in doc["graph"].get("ops", ()) if isinstance(r, dict)}
                  & names)


class _Lock:
    """An executable's lock where the call path runs it: the module's lock (taken in C
    by its ``run``), as a context manager for the ctypes path and ``close``."""

    __slots__ = ("capsule", "_acquire", "_release")

    def __init__(self, module: Any) -> None:
        self.capsule, self._acquire, self._release = module.lock(), module.acquire, \
            module.release

    def __enter__(self) -> None:
        self._acquire(self.capsule)

    def __exit__(self, *exc: Any) -> None:
        self._release(self.capsule)


class _NativeExecutable(Executable):
    # One instance runs one call at a time (geon_backend.h): ``_lock`` is held across
    # every call into the library on it, and across its destruction (ctypes and the
    # call path release the GIL during a call, so Python threads could otherwise
    # overlap). The handle is cleared in place when it is destroyed: the call path
    # reads it under the lock.
    def __init__(self, backend: NativeBackend, document: str) -> None:
        doc, _, _ = read_plan(document)   # checked here first: a clear error in Python
        self._fast: Any = None
        super().__init__(doc)
        module = backend._call_module()
        self._call: Any = None if module is None else module.run
        self._lock: Any = threading.Lock() if module is None else _Lock(module)
        self.backend, self._handle = backend, ctypes.c_void_p()
        self._prepare()
        data = document.encode("utf-8")
        err = ctypes.create_string_buffer(_ERR_LEN)
        status = backend.lib.geon_backend_create(data, len(data), ctypes.byref(self._handle),
                                                 err, _ERR_LEN)
        if status:
            self._handle.value = None
            failure = _failed(backend, "loading the plan", status, err)
            loops = _loops(doc)
            if loops:
                failure.args = (f"{failure.args[0]} (the plan holds {', '.join(loops)} "
                                f"ops, loops with bodies: for a backend without them, "
                                f"write it with plan(..., unroll=True))",)
            raise failure

    # (replacing ``inputs`` or ``outputs`` sends the next run through the ctypes path,
    # which prepares again, under the lock)
    @property
    def inputs(self) -> list:
        return self.__dict__["inputs"]

    @inputs.setter
    def inputs(self, value: list) -> None:
        self.__dict__["inputs"], self._fast, self._prepared = value, None, None

    @property
    def outputs(self) -> list:
        return self.__dict__["outputs"]

    @outputs.setter
    def outputs(self, value: list) -> None:
        self.__dict__["outputs"], self._fast, self._prepared = value, None, None

    @property
    def call_path(self) -> str:
        """The path this executable runs through, ``"extension"`` or ``"ctypes"``
        (see :attr:`NativeBackend.call_path`)."""
        return "ctypes" if self._call is None else "extension"

    def _prepare(self) -> None:
        # What does not change between runs, made once (again only where ``inputs`` or
        # ``outputs`` was replaced): the DLTensor arrays of the inputs and outputs with
        # the plan's shapes, an error buffer, and the inputs' dtype checks
        # (check_inputs makes every input the plan's dtype). Each run fills in the data
        # pointers (and an input's strides) under ``_lock``. For the call path, the
        # tuple its ``run`` takes (see callpath.py).
        def tensors(specs):
            arr = (DLTensor * max(len(specs), 1))()
            keep = []
            for t, (shape, dtype) in zip(arr, specs):
                dtype = np.dtype(dtype)
                nd = len(shape)
                sh = (ctypes.c_int64 * max(nd, 1))(*shape)
                st = (ctypes.c_int64 * max(nd, 1))()
                keep.append((sh, st))
                t.device = _DLDevice(_CPU, 0)
                t.ndim = nd
                if dtype.kind in _CODES:
                    t.dtype = _DLDataType(_CODES[dtype.kind], dtype.itemsize * 8, 1)
                t.shape = sh
            return arr, keep
        self._fast = None
        self._prepared = (self.inputs, self.outputs)
        self._in_t, self._in_keep = tensors(self.inputs)
        self._out_t, self._out_keep = tensors(self.outputs)
        self._in_bad = [np.dtype(d).kind not in _CODES or np.dtype(d).byteorder == ">"
                        for _, d in self.inputs]
        self._out_bad = [np.dtype(d).kind not in _CODES or np.dtype(d).byteorder == ">"
                         for _, d in self.outputs]
        self._any_bad = any(self._in_bad) or any(self._out_bad)
        self._out_specs = [(tuple(shape), np.dtype(dtype)) for shape, dtype in self.outputs]
        self._err = ctypes.create_string_buffer(_ERR_LEN)
        if self._call is not None and not self._any_bad:
            try:   # each input's buffer format as NumPy gives it for the plan's dtype
                formats = tuple(np.empty(0, d).data.format.encode("ascii")
                                for _, d in self.inputs)
            except (ValueError, TypeError):   # (no buffer format: the ctypes path)
                return
            blas = self.backend.blas_threads()
            self._fast = (
                self.backend._run_address, ctypes.addressof(self._handle),
                self._lock.capsule, None if blas is None else blas.apply,
                ctypes.addressof(self._in_t), ctypes.addressof(self._out_t), formats,
                tuple(ctypes.addressof(st) for _, st in self._in_keep),
                tuple(self._out_specs), np.empty, np.ndarray,
                ctypes.addressof(self._err), _ERR_LEN,
                # (kept alive with the tuple: what the addresses point into)
                (self._handle, self._in_t, self._out_t, self._in_keep, self._err))

    def run(self, *arrays: Any) -> list[np.ndarray]:
        fast = self._fast
        if fast is not None:
            got = self._call(fast, arrays)
            if got.__class__ is list:
                return got
            if got is not None:
                raise _failed(self.backend, "running the plan", got[0], got[1])
        return self._run_ctypes(arrays)   # (also where the call path passed it on)

    def _run_ctypes(self, arrays: Any) -> list[np.ndarray]:
        ins = self.check_inputs(arrays)
        # (the arrays whose memory is passed: an input copied first where its data is
        # misaligned or a stride is not a whole number of elements)
        ins = [a if (a.flags.c_contiguous and a.flags.aligned) or (a.flags.aligned and not any(
               s % a.itemsize for s in a.strides)) else np.ascontiguousarray(a) for a in ins]
        lib = self.backend.lib
        blas = self.backend.blas_threads()
        with self._lock:
            if blas is not None:
                blas.apply()
            if not self._handle:
                raise NativeBackendError(f"{self.backend.name}: the executable was closed")
            if self._prepared is None:   # (``inputs`` or ``outputs`` was replaced)
                self._prepare()
            outs = [np.empty(shape, dtype) for shape, dtype in self._out_specs]
            for a, bad in zip(ins + outs, self._in_bad + self._out_bad) if self._any_bad else ():
                if bad:
                    raise NativeBackendError(f"native backends take little-endian bool, "
                                             f"integer or float arrays, not {a.dtype}")
            for t, a, (_, st) in zip(self._in_t, ins, self._in_keep):
                t.data = _address(a)
                if a.flags.c_contiguous:
                    t.strides = None          # (DLPack: compact row-major)
                else:
                    z = a.itemsize
                    for d, s in enumerate(a.strides):
                        st[d] = s // z
                    t.strides = st
            for t, a in zip(self._out_t, outs):
                t.data = _address(a)
            err = self._err
            status = lib.geon_backend_run(self._handle, self._in_t, len(ins), self._out_t,
                                          len(outs), err, _ERR_LEN)
            if status:
                failure = _failed(self.backend, "running the plan", status, err)
        if status:
            raise failure
        return outs

    def close(self) -> None:
        with self._lock:
            if self._handle:
                self.backend.lib.geon_backend_destroy(self._handle)
                self._handle.value = None

    def __del__(self) -> None:
        try:
            if getattr(self, "_lock", None) is not None:
                self.close()
        except Exception:  # at interpreter exit the library may be gone
            pass


def load_backend(path: str) -> NativeBackend:
    """The native backend in the shared library ``path`` (see the module docstring)."""
    return NativeBackend(path)
