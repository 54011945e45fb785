"""The error function in C for the NumPy code of :class:`~geon.op_graph.op_graph.Erf`.

NumPy has no ``erf``. Its NumPy code (:func:`geon.op_graph.special.erf`) takes about 35
array operations for float32 (a rational function in float64) and a few hundred for
float64 (a series), so a GELU of a few thousand elements, which the ``"auto"`` mode
leaves to NumPy, took a quarter of a small ViT's forward. Here one C loop does it:

- float32: the same rational function, the same coefficients and the same order of
  operations in double (the toolchain's ``-ffp-contract=off``), rounded once, so the
  values are bitwise those of :func:`~geon.op_graph.special.erf_rational`;
- float64: the C library's ``erf`` (within an ulp; the series is within about 1e-15
  relative).

The library is built and cached like the direct convolution kernels
(:mod:`.conv_kernels`, by :func:`geon.transformers.numpy.toolchain.build`), and not used
where ``GEON_COMPILED`` is ``0``, under ``NumPyTransformer(compiled=False)``, where no
compiler or cache folder works, or where the build fails (after one warning): the NumPy
code runs then, as it does for other dtypes and for operands that are not contiguous.
"""

import ctypes

import numpy as np

from geon.op_graph import special
from geon.transformers.numpy import compiled


def _horner(coefs):
    """C statements leaving ``sum(c_k u^k)`` in ``acc``, in the operation order of
    :func:`geon.op_graph.special._horner`."""
    lines = [f"double acc = u * {coefs[-1]!r};"]
    lines += [f"acc = (acc + {c!r}) * u;" for c in coefs[-2:0:-1]]
    lines.append(f"acc = acc + {coefs[0]!r};")
    return "\n        ".join(lines)


def source():
    """The C source of the kernels."""
    clamp = repr(float(special._ERF_CLAMP))
    return f"""\
#include <math.h>
#include <stdint.h>

static inline double geon_erf_p(double u) {{
        {_horner(special._ERF_P)}
        return acc;
}}

static inline double geon_erf_q(double u) {{
        {_horner(special._ERF_Q)}
        return acc;
}}

void geon_erf_f32(const float *x, float *y, int64_t n) {{  /* y may be x */
    for (int64_t i = 0; i < n; i++) {{
        double a = x[i];
        a = a < -{clamp} ? -{clamp} : (a > {clamp} ? {clamp} : a);  /* NaN stays NaN */
        double u = a * a;
        double p = geon_erf_p(u);
        p = p / geon_erf_q(u);
        y[i] = (float)(p * a);
    }}
}}

void geon_erf_f64(const double *x, double *y, int64_t n) {{
    for (int64_t i = 0; i < n; i++)
        y[i] = erf(x[i]);
}}
"""


_SUFFIX = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}
_SYMBOLS = [f"geon_erf_{s}" for s in _SUFFIX.values()]
_loaded = {}  # (CC, cache folder) -> {dtype: ctypes function}, or None


def _bind(lib):
    fns = {}
    for dtype, suffix in _SUFFIX.items():
        f = getattr(lib, f"geon_erf_{suffix}")
        f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        f.restype = None
        fns[dtype] = f
    return fns


def kernels():
    """``{dtype: ctypes function}``, or None where the compiled path is off or cannot
    run here (see the module docstring)."""
    return compiled.fixed_library(_loaded, "erf kernels", source,
                                  _SYMBOLS, _bind)


def erf(x, out, c_kernels=True):
    """``out`` = erf(``x``) elementwise (``out`` may be ``x``): by the C loop where
    ``c_kernels`` (the computation's compiled mode is not off), the kernels are built,
    and ``x`` and ``out`` are C-contiguous arrays of one float dtype and one shape;
    else by :func:`geon.op_graph.special.erf`."""
    fn = None
    if c_kernels and isinstance(x, np.ndarray) and x.dtype in _SUFFIX and \
            x.dtype == out.dtype and \
            x.shape == out.shape and x.flags.c_contiguous and out.flags.c_contiguous \
            and out.flags.writeable:
        fns = kernels()
        if fns is not None and (x is out or not np.may_share_memory(x, out) or
                                x.ctypes.data == out.ctypes.data):
            fn = fns[x.dtype]
    if fn is None:
        return special.erf(x, out=out)
    fn(x.ctypes.data, out.ctypes.data, x.size)
    return out
