"""Choosing OpenBLAS's kernel set before NumPy loads it (see doc/performance.rst).

NumPy's wheels bundle OpenBLAS built for many CPUs at once; it picks its kernels from
the CPU's identity when the library loads, and reads ``OPENBLAS_CORETYPE`` to override
that choice. Some OpenBLAS releases take AMD CPUs with AVX-512 (Zen 4, Zen 5) for AVX2
machines and run their "Haswell" kernels, about half as fast as the "SkylakeX" ones
there. This module must not import NumPy: it runs before NumPy is imported.
"""

import os
import sys

#: what the SkylakeX kernels execute; a CPU without all of these would die of an
#: illegal instruction under OPENBLAS_CORETYPE=SkylakeX (seen on an AVX2 Zen 3)
AVX512_NEEDED = frozenset({"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"})

#: set to ``off`` to keep geon from choosing (OpenBLAS then picks by itself)
OPT_OUT = "GEON_OPENBLAS_CORETYPE"


def _cpu(path="/proc/cpuinfo"):
    """(vendor_id, set of flags) of the first CPU, or ("", set()) where unknown."""
    vendor, flags = "", set()
    try:
        with open(path) as f:
            for line in f:
                key, _, val = line.partition(":")
                key = key.strip()
                if key == "vendor_id" and not vendor:
                    vendor = val.strip()
                elif key == "flags":
                    flags = set(val.split())
                    break
    except OSError:
        pass
    return vendor, flags


def coretype_for(vendor, flags):
    """The OPENBLAS_CORETYPE geon sets for a CPU, or None to leave OpenBLAS's choice:
    SkylakeX on AMD CPUs with the AVX-512 subsets those kernels use; None elsewhere
    (Intel CPUs with AVX-512 are detected correctly, and AVX2-only CPUs gain nothing:
    on an AMD EPYC Zen 3 OpenBLAS's own choice, Haswell, is its fastest, see
    benchmarks/gemm.py)."""
    if vendor == "AuthenticAMD" and AVX512_NEEDED <= flags:
        return "SkylakeX"
    return None


def select_coretype(environ=None, modules=None, cpu=None):
    """Set OPENBLAS_CORETYPE in ``environ`` (default ``os.environ``) when NumPy is not
    loaded yet, the user has not set it (nor set GEON_OPENBLAS_CORETYPE=off), and
    :func:`coretype_for` names one. Returns what it set, or None."""
    environ = os.environ if environ is None else environ
    modules = sys.modules if modules is None else modules
    if "numpy" in modules or "OPENBLAS_CORETYPE" in environ:
        return None  # too late, or the user's explicit choice
    if environ.get(OPT_OUT, "").lower() in ("off", "0", "no", "false"):
        return None
    if not sys.platform.startswith("linux"):
        return None
    choice = coretype_for(*(cpu if cpu is not None else _cpu()))
    if choice is not None:
        environ["OPENBLAS_CORETYPE"] = choice
    return choice
