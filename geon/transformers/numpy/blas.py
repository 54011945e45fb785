"""``C += alpha * A @ B`` in one call of the BLAS library that NumPy bundles.

``np.matmul`` always writes a fresh product, so an SGD update ``w - lr * (a @ b)``
costs a product into scratch plus a pass that scales it and subtracts it from ``w``.
The BLAS ``gemm`` routine computes ``C = alpha * A @ B + beta * C``: with ``beta = 1``
and ``alpha = -lr`` the update is done by the product itself, each element of ``w``
read and written once, inside the BLAS kernel (on a 2-core Cascade Lake the update of
a 512 x 784 weight at batch 128 took 0.52 ms this way against 1.15 ms as product,
scale and subtract).

NumPy does not expose ``gemm``; its Linux and macOS wheels ship OpenBLAS as
``scipy-openblas``, whose C interface is reached here through :mod:`ctypes`. Only the
two builds whose integer width is known from the symbol are used:
``scipy_cblas_sgemm64_`` (64-bit integers, NumPy's default) and
``scipy_cblas_sgemm`` (32-bit). Anything else (NumPy built against MKL, Accelerate or
a system BLAS, ``GEON_BLAS_ACCUMULATE=0``, an operand whose layout BLAS cannot read,
operands that may overlap the output) makes :func:`accumulate` return False, and the
caller computes the same update with NumPy.
"""

import ctypes
import glob
import os

import numpy as np

from geon._env import env_flag
from geon.op_graph import conv as cv
from geon.op_graph import primitives as pr
from geon.op_graph.user_ops import UserOp

#: set ``GEON_BLAS_ACCUMULATE=0`` to compute updates with NumPy calls only (read at
#: import; a value that is not a switch warns and leaves it on, see geon/_env.py)
ENABLED = env_flag("GEON_BLAS_ACCUMULATE", True)

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112

#: The inner dimension K of one BLAS call, at most: a longer one is split into calls of
#: at most this many, each adding its part into ``c``. OpenBLAS packs a panel of A and of
#: B per call, and the memory it touches for them grows with K up to about 1,000 (a
#: 512 x K x 784 float32 product touched 1.5 MiB at K = 512 and 2.5 MiB at K = 1,024, on
#: a Cascade Lake). The weight updates of a training step have the batch as K, so the
#: split keeps a process's peak memory from growing with the batch; each extra call
#: reads and writes ``c`` once more (no difference measured in the MLP step at batch
#: 1,024). 0: never split.
MAX_INNER = 512

#: (symbol prefix, suffix, integer type) of the interfaces we know
_BUILDS = (("scipy_", "64_", ctypes.c_int64), ("scipy_", "", ctypes.c_int32))


def _libraries():
    """The OpenBLAS libraries bundled in NumPy's wheel (Linux: numpy.libs/, macOS:
    numpy/.dylibs/)."""
    folder = os.path.dirname(np.__file__)
    return sorted(glob.glob(folder + ".libs/*openblas*")) + \
        sorted(glob.glob(os.path.join(folder, ".dylibs", "*openblas*")))


def _load():
    """{dtype: gemm function} for float32 and float64, or {} where none is found."""
    for path in _libraries():
        try:
            lib = ctypes.CDLL(path)  # the copy NumPy already loaded: same handle
        except OSError:
            continue
        for prefix, suffix, int_t in _BUILDS:
            try:
                fns = {np.dtype(t): getattr(lib, f"{prefix}cblas_{c}gemm{suffix}")
                       for t, c in ((np.float32, "s"), (np.float64, "d"))}
            except AttributeError:
                continue
            for t, fn in fns.items():
                real = ctypes.c_float if t == np.float32 else ctypes.c_double
                fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, int_t, int_t,
                               int_t, real, ctypes.c_void_p, int_t, ctypes.c_void_p,
                               int_t, real, ctypes.c_void_p, int_t]
                fn.restype = None
            return fns
    return {}


_GEMM = _load() if ENABLED else {}


def available():
    """Whether :func:`accumulate` can call a BLAS here."""
    return bool(_GEMM)


def _layout(x):
    """(transpose flag, leading dimension) for BLAS to read the 2-D array ``x`` as it
    is, or (None, 0) when its strides are not those of a row-major matrix or of the
    transpose of one."""
    s0, s1 = x.strides
    it = x.itemsize
    rows, cols = x.shape
    if s1 == it and s0 % it == 0 and s0 // it >= max(1, cols):
        return _NO_TRANS, s0 // it
    if s0 == it and s1 % it == 0 and s1 // it >= max(1, rows):
        return _TRANS, s1 // it
    return None, 0


def add_product(a, b, c, v):
    """``c = v + a @ b`` for 2-D ``a`` (M, K), ``b`` (K, N), ``c`` (M, N) and ``v`` of
    ``c``'s shape (a broadcast view, such as a bias along the rows, is fine): ``v`` is
    copied into ``c``, then one BLAS call (one per :data:`MAX_INNER` of K) adds the
    product, with ``beta = 1``. That copy takes the place of the pass in which the BLAS
    zeroes ``c`` for a plain product, so the addition costs no pass of its own. Returns
    False, having done nothing, where :func:`accumulate` would, or where ``v`` has
    another dtype or shape or may overlap ``c``."""
    if v.dtype != c.dtype or v.shape != c.shape or np.may_share_memory(v, c):
        return False
    return accumulate(a, b, c, 1.0, fill=v)


def accumulate(a, b, c, alpha, fill=None):
    """``c += alpha * (a @ b)`` for 2-D ``a`` (M, K), ``b`` (K, N) and ``c`` (M, N) of
    one float dtype, in one BLAS call (one per :data:`MAX_INNER` of K). Returns False,
    having done nothing, where it cannot: no BLAS found, another dtype, an empty or
    unreadable operand, ``c`` not row-major, or ``c`` possibly overlapping ``a`` or
    ``b``. With ``fill``, ``c`` is first set to ``fill`` (once the call is known to
    go ahead)."""
    fn = _GEMM.get(c.dtype)
    if fn is None or a.dtype != c.dtype or b.dtype != c.dtype or 0 in a.shape \
            or 0 in b.shape:
        return False
    ta, lda = _layout(a)
    tb, ldb = _layout(b)
    tc, ldc = _layout(c)
    m, k = a.shape
    n = b.shape[1]
    if ta is None or tb is None or tc != _NO_TRANS or b.shape[0] != k \
            or c.shape != (m, n) or not c.flags.writeable \
            or np.may_share_memory(a, c) or np.may_share_memory(b, c):
        return False
    if fill is not None:
        np.copyto(c, fill)
    pa, pb, it = a.ctypes.data, b.ctypes.data, c.itemsize
    # stepping along K: a's columns and b's rows (each stored as rows, or transposed)
    da = it if ta == _NO_TRANS else lda * it
    db = ldb * it if tb == _NO_TRANS else it
    step = MAX_INNER if 0 < MAX_INNER < k else k
    for k0 in range(0, k, step):
        kk = min(step, k - k0)
        fn(_ROW_MAJOR, ta, tb, m, n, kk, alpha, pa + k0 * da, lda, pb + k0 * db, ldb, 1.0,
           c.ctypes.data, ldc)
    return True


#: A computation whose BLAS products all have fewer multiply-adds than this runs them
#: on one BLAS thread (:func:`blas_threads_cap`). Waking the BLAS's threads for each
#: small product, between the NumPy calls of a step, cost more than they saved: a
#: 2-layer BERT of hidden 128 (products of at most 4M multiply-adds) ran its forward in
#: 0.70 ms on one thread against 0.92 ms on two, alone on an idle 2-core machine, and
#: in 1.1 ms against 11 ms (medians) beside PyTorch and ONNX Runtime, whose own threads
#: spin between their calls in the same process. A 128 x 784 x 512 product (51M) runs
#: 1.4x faster on two threads.
SERIAL_PRODUCT = 1 << 25


def _product_size(op):
    """The multiply-adds of one BLAS call of ``op`` (a Gemm: one matrix of a batch; a
    convolution: its im2col product), 0 for other ops, None where a length is
    symbolic or the op is a user op (its NumPy code may call the BLAS)."""
    if isinstance(op, UserOp):
        return None
    try:
        if isinstance(op, pr.Gemm):
            a, b = op.args
            m, k = a.axes.lengths[-2:]
            return int(m) * int(k) * int(b.axes.lengths[-1])
        if isinstance(op, (cv.Conv, cv.ConvGradData)):
            big, w = (op, op.args[1]) if isinstance(op, cv.Conv) else op.args
        elif isinstance(op, cv.ConvGradFilter):
            big, w = op.args[1], op
        else:
            return 0
        return int(big.axes.size) * int(w.axes.size) // int(w.axes.lengths[0])
    except TypeError:  # a symbolic length: its binding decides
        return None


def largest_product(ops, inner=()):
    """The multiply-adds of the largest BLAS call among ``ops`` and the values of
    ``inner`` (those of the subgraphs' computations), None where one is unknown."""
    sizes = [_product_size(op) for op in ops] + list(inner)
    return None if None in sizes else max(sizes, default=0)


def blas_threads_cap(largest):
    """1 where the largest BLAS product (:func:`largest_product`) is smaller than
    :data:`SERIAL_PRODUCT` (the computation's calls then give the BLAS one thread),
    else 0 (no cap: the thread policy decides)."""
    return int(largest is not None and largest < SERIAL_PRODUCT)
