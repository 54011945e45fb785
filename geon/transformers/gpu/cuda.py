"""CUDA C tables: C types, literals, the prelude, and each elementwise op's expression.

:data:`CUDA_CODE` maps an elementwise op class to ``fn(op, args, ctype) -> expression``:
``args`` are C expressions already converted to the op's *compute type* (see
:func:`compute_dtype`) and ``ctype`` is that type's C name. The expression's value is
converted to the op's dtype by the caller. Plain arithmetic and single calls of the
maths library are written once for this table and the compiled CPU path, in
:data:`~geon.transformers.c_expressions.C_EXPRESSIONS`, which :func:`cuda_rule` reads
for the ops without an entry here. Adding an elementwise op to the GPU transformer is
one entry in one of the two (user ops made by :func:`geon.define_op` with ``cuda=``
share one entry, which reads the class's ``cuda_source``, see :func:`user_op_code`).
"""

import re
import struct

import numpy as np

from geon.errors import LoweringError
from geon.op_graph import op_graph as og
from geon.op_graph import primitives as pr
from geon.op_graph import schemas as sc
from geon.op_graph.np_ops import Select
from geon.op_graph.tables import OpTable
from geon.op_graph.user_ops import UserOp
from geon.transformers.c_expressions import C_EXPRESSIONS

#: NumPy dtype -> C type of the generated code.
C_TYPES = {
    np.dtype(np.float32): "float", np.dtype(np.float64): "double",
    np.dtype(np.int8): "signed char", np.dtype(np.int16): "short",
    np.dtype(np.int32): "int", np.dtype(np.int64): "long long",
    np.dtype(np.uint8): "unsigned char", np.dtype(np.uint16): "unsigned short",
    np.dtype(np.uint32): "unsigned int", np.dtype(np.uint64): "unsigned long long",
    np.dtype(np.bool_): "bool",
}


def ctype(dtype):
    """The C type of ``dtype``; a :class:`LoweringError` for dtypes the GPU lacks."""
    t = C_TYPES.get(np.dtype(dtype))
    if t is None:
        raise LoweringError(f"the gpu transformer does not support dtype {np.dtype(dtype)}")
    return t


def literal(value, dtype):
    """A C literal of ``value`` in ``dtype`` that reads back bit for bit."""
    dtype = np.dtype(dtype)
    v = np.asarray(value).astype(dtype)[()]
    if dtype.kind == "f":
        if not np.isfinite(v):  # no portable literal: the bit pattern
            if dtype.itemsize == 4:
                return f"geon_f32(0x{struct.unpack('<I', struct.pack('<f', v))[0]:08x}u)"
            return f"geon_f64(0x{struct.unpack('<Q', struct.pack('<d', v))[0]:016x}ull)"
        # str() of a NumPy float is the shortest text that reads back in its own type
        text = str(v) if dtype.itemsize <= 4 else repr(float(v))
        if "e" not in text and "." not in text:
            text += ".0"
        if dtype.itemsize == 8:
            return text
        if dtype.itemsize == 4:
            return text + "f"
        raise LoweringError(f"the gpu transformer does not support dtype {dtype}")
    if dtype.kind == "b":
        return "true" if v else "false"
    if dtype.kind == "u":
        return f"{int(v)}ull" if dtype.itemsize == 8 else f"{int(v)}u"
    if dtype.itemsize == 8:
        if int(v) == -2 ** 63:
            return "(-9223372036854775807ll - 1)"
        return f"{int(v)}ll"
    return str(int(v))


def fn(name, dtype):
    """The C math function ``name`` for ``dtype`` (``expf`` for float32, ``exp`` else)."""
    return name + "f" if np.dtype(dtype) == np.float32 else name


#: Definitions every kernel may use. Written so that nvcc and an ordinary C++ compiler
#: (the test suite's emulator, tests/cuda_emulator.py) both accept them.
PRELUDE = r"""// geon CUDA prelude
__device__ __forceinline__ float geon_f32(unsigned int b) { return __uint_as_float(b); }
__device__ __forceinline__ double geon_f64(unsigned long long b) {
    return __longlong_as_double((long long)b);
}
// 16 bytes of T (4 floats, 2 doubles ...), moved by one vector load or store; the
// address must be 16-byte aligned
template <typename T> struct __align__(16) geon_vec { T v[16 / sizeof(T)]; };
template <typename T> __device__ __forceinline__ geon_vec<T> geon_load_vec(const T* p) {
    return *reinterpret_cast<const geon_vec<T>*>(p);
}
template <typename T>
__device__ __forceinline__ void geon_store_vec(T* p, const geon_vec<T>& v) {
    *reinterpret_cast<geon_vec<T>*>(p) = v;
}
// NaN-propagating max / min, as NumPy's maximum and minimum (a != a: a is NaN)
template <typename T> __device__ __forceinline__ T geon_max(T a, T b) {
    return (a > b || a != a) ? a : b;
}
template <typename T> __device__ __forceinline__ T geon_min(T a, T b) {
    return (a < b || a != a) ? a : b;
}
// NumPy's sign: 1, -1, +0 for either zero, NaN for NaN (a != a)
template <typename T> __device__ __forceinline__ T geon_sign(T a) {
    return a > T(0) ? T(1) : (a < T(0) ? T(-1) : (a != a ? a : T(0)));
}
// sigmoid without overflow: exp of a non-positive number only. float32 without a
// branch: with e = exp(-|x|), 1 / (1 + e) for x >= 0 and e / (1 + e) below, as one
// IEEE division (the same bits as a branch on the sign; NaN gives NaN)
__device__ __forceinline__ float geon_sigmoid(float x) {
    const float e = expf(-fabsf(x));
    return (x >= 0.0f ? 1.0f : e) / (1.0f + e);
}
__device__ __forceinline__ double geon_sigmoid(double x) {
    if (x >= 0.0) { return 1.0 / (1.0 + exp(-x)); }
    const double e = exp(x);
    return e / (1.0 + e);
}
#ifndef __CUDACC__
// the emulator runs one thread at a time between barriers: a plain add is atomic there
template <typename T> static inline T atomicAdd(T* p, T v) { T old = *p; *p = old + v; return old; }
#endif
// log(1 + exp(x)) = max(x, 0) + log1p(exp(-|x|)), exact for any x
__device__ __forceinline__ float geon_softplus(float x) {
    return (x > 0.0f ? x : 0.0f) + log1pf(expf(-fabsf(x)));
}
__device__ __forceinline__ double geon_softplus(double x) {
    return (x > 0.0 ? x : 0.0) + log1p(exp(-fabs(x)));
}
// softplus(x) - x t = log1p(exp(-|x|)) + |x| w, w = 1 - t for x > 0 else t; the
// product is 0 where w is (an infinite logit with the matching target: 0, not NaN)
__device__ __forceinline__ float geon_sigmoid_ce(float x, float t) {
    const float a = fabsf(x), w = x > 0.0f ? 1.0f - t : t;
    return log1pf(expf(-a)) + (w == 0.0f ? 0.0f : a * w);
}
__device__ __forceinline__ double geon_sigmoid_ce(double x, double t) {
    const double a = fabs(x), w = x > 0.0 ? 1.0 - t : t;
    return log1p(exp(-a)) + (w == 0.0 ? 0.0 : a * w);
}
"""

CUDA_CODE = OpTable("CUDA_CODE", "fn(op, args, ctype) -> C expression")
#: Decorator: ``@cuda_code(Cls, ...)`` registers ``fn(op, args, ctype) -> C expression``.
cuda_code = CUDA_CODE.register


def cuda_rule(op):
    """``fn(op, args, ctype)`` for the elementwise ``op``: its entry in
    :data:`CUDA_CODE`, else its shared C expression, else ``None``."""
    own = CUDA_CODE.find(op)
    if own is not None:
        return own
    shared = C_EXPRESSIONS.find(op)
    if shared is None:
        return None
    return lambda op, args, t: shared(op, t, args)


@cuda_code(og.Maximum)
def _maximum(op, args, t):
    return f"geon_max<{t}>({args[0]}, {args[1]})"


@cuda_code(og.Minimum)
def _minimum(op, args, t):
    return f"geon_min<{t}>({args[0]}, {args[1]})"


@cuda_code(og.Absolute)
def _absolute(op, args, t):
    if compute_dtype(op).kind == "f":
        return f"{fn('fabs', compute_dtype(op))}({args[0]})"
    return f"({args[0]} < 0 ? -{args[0]} : {args[0]})"


@cuda_code(og.Sign)
def _sign(op, args, t):
    return f"geon_sign<{t}>({args[0]})"


@cuda_code(og.Sigmoid)
def _sigmoid(op, args, t):
    return f"geon_sigmoid(({_float_type(op)}){args[0]})"


@cuda_code(og.Softplus)
def _softplus(op, args, t):
    return f"geon_softplus(({_float_type(op)}){args[0]})"


@cuda_code(Select)
def _select(op, args, t):
    c, a, b = args
    return f"({c} != ({t})0 ? {a} : {b})"


@cuda_code(sc.SigmoidCrossEntropy)
def _sigmoid_ce(op, args, t):
    ft = _float_type(op)
    return f"geon_sigmoid_ce(({ft}){args[0]}, ({ft}){args[1]})"


@cuda_code(pr.Copy)
def _copy(op, args, t):
    return args[0]


def _float_type(op):
    return "float" if compute_dtype(op) == np.float32 else "double"


_DEVICE_FN = re.compile(r"__device__\s+[\w\s\*]*?\b(\w+)\s*\(")


def user_op_code(cls):
    """``(function name, source)`` of a user elementwise op defined with ``cuda=``."""
    src = cls.cuda_source
    if src is None:
        raise LoweringError(f"the gpu transformer has no CUDA code for {cls.__name__}: "
                            f"define it with cuda= source")
    m = _DEVICE_FN.search(src)
    if m is None:
        raise LoweringError(f"the CUDA source of {cls.__name__} defines no __device__ "
                            f"function: {src!r}")
    return m.group(1), src


@cuda_code(UserOp)
def _user_op(op, args, t):
    # a user elementwise op (geon.define_op with cuda=) carries its __device__ function
    return f"{user_op_code(type(op))[0]}({', '.join(args)})"


def compute_dtype(op):
    """The type an elementwise op computes in (:meth:`ElementWise.compute_dtype
    <geon.op_graph.op_graph.ElementWise.compute_dtype>`, the rule of every backend); a
    copy in its own type."""
    if isinstance(op, pr.Copy):
        return op.dtype
    return op.compute_dtype()
