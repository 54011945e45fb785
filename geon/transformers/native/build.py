"""Building geon's native runtime (``native/`` at the top of the source tree) with CMake.

:func:`build_runtime` configures and builds ``libgeon_native`` into a folder and returns
the library's path, for :func:`geon.transformers.native.load_backend`. It links
scipy-openblas32 when that package is installed (``blas=None``) or asked for
(``blas=True``), and falls back to the runtime's plain C GEMM otherwise. ``import geon``
never needs it: it runs only when called, and needs cmake and a C compiler.
"""

import os
import shutil
import subprocess
from typing import Optional

from geon.errors import GeonError

__all__ = ["RuntimeBuildError", "build_runtime", "source_dir"]


class RuntimeBuildError(GeonError, RuntimeError):
    """cmake or the compiler is missing, or the build failed (the output is in the
    message)."""


def source_dir() -> str:
    """The runtime's source folder (``native/`` beside the ``geon`` package)."""
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.normpath(os.path.join(here, "..", "..", "..", "native"))


def _blas_args(blas: Optional[bool]) -> list[str]:
    if blas is False:
        return []
    try:
        import scipy_openblas32 as ob
    except ImportError:
        if blas:
            raise RuntimeBuildError("blas=True needs scipy-openblas32 (pip install "
                                    "scipy-openblas32)") from None
        return []
    lib = os.path.join(ob.get_lib_dir(), f"lib{ob.get_library()}.so")
    return [f"-DGEON_BLAS_INCLUDE={ob.get_include_dir()}", f"-DGEON_BLAS_LIB={lib}",
            "-DGEON_BLAS_SCIPY=ON"]


def build_runtime(folder: str, blas: Optional[bool] = None, sanitize: bool = False) -> str:
    """Build ``libgeon_native`` in ``folder`` and return its path (``sanitize``: with
    ``-fsanitize=address,undefined``)."""
    cmake = shutil.which("cmake")
    if cmake is None:
        raise RuntimeBuildError("building the native runtime needs cmake")
    src = source_dir()
    if not os.path.isfile(os.path.join(src, "CMakeLists.txt")):
        raise RuntimeBuildError(f"no runtime sources at {src} (a source checkout has them)")
    args = [cmake, "-S", src, "-B", folder, "-DCMAKE_BUILD_TYPE=Release",
            f"-DGEON_SANITIZE={'ON' if sanitize else 'OFF'}", *_blas_args(blas)]
    if shutil.which("ninja"):
        args += ["-G", "Ninja"]
    for step in (args, [cmake, "--build", folder]):
        done = subprocess.run(step, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeBuildError(f"{' '.join(step)} failed:\n{done.stdout}\n{done.stderr}")
    path = os.path.join(folder, "libgeon_native.so")
    os.chmod(path, 0o755)
    return path
