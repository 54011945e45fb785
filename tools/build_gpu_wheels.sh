#!/usr/bin/env bash
# Fill .whl/ (git-ignored) with what tools/gpu_run.sh installs on a GPU machine that has
# Python 3.12, CUDA 13 and no network: a pycuda wheel built here for CPython 3.12, and
# the wheels of pycuda's run-time requirements that such a machine lacks.
#
#   tools/build_gpu_wheels.sh [PYTHON3.12]
#
# Needs: a CPython 3.12 with pip (default: pyenv's 3.12, else python3.12 on PATH), the
# CUDA toolkit's headers (CUDA_ROOT, default /usr/local/cuda) and a C++ compiler. No
# GPU and no driver are needed: pycuda is linked against a stub libcuda.so.1 that
# defines nothing, and the real driver library is loaded on the GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
PYCUDA_VERSION=2026.1
PY=${1:-}
if [ -z "$PY" ]; then
    for c in "$(pyenv root 2>/dev/null)"/versions/3.12*/bin/python3.12 python3.12; do
        if command -v "$c" >/dev/null 2>&1; then PY=$c; break; fi
    done
fi
[ -n "$PY" ] || { echo "no Python 3.12 found: pass one as the first argument" >&2; exit 2; }
"$PY" -c 'import sys; assert sys.version_info[:2] == (3, 12), sys.version' || exit 2
CUDA_ROOT=${CUDA_ROOT:-/usr/local/cuda}
[ -f "$CUDA_ROOT/include/cuda.h" ] || { echo "no $CUDA_ROOT/include/cuda.h: set CUDA_ROOT" >&2; exit 2; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p .whl
# A stub driver library to link against; --no-as-needed keeps libcuda.so.1 in the
# extension's needed libraries although the stub defines none of its symbols.
echo 'void geon_stub(void) {}' > "$work/stub.c"
gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$work/libcuda.so" "$work/stub.c"

"$PY" -m pip download -q --no-deps --no-binary pycuda "pycuda==$PYCUDA_VERSION" -d "$work"
tar xzf "$work/pycuda-$PYCUDA_VERSION.tar.gz" -C "$work"
(
    cd "$work/pycuda-$PYCUDA_VERSION"
    # curand is left out: geon does not use it, and its library need not be on the
    # GPU machine's loader path.
    "$PY" configure.py --cuda-root="$CUDA_ROOT" --no-cuda-enable-curand \
        --cudadrv-lib-dir="$work" >/dev/null
    # LDFLAGS from the environment come before the objects and -lcuda on the link line
    PATH="$CUDA_ROOT/bin:$PATH" LDFLAGS=-Wl,--no-as-needed \
        "$PY" -m pip wheel -q --no-deps -w "$work/out" .
)
so=$(unzip -l "$work"/out/pycuda-*.whl | awk '/_driver.*\.so/ {print $4}')
(cd "$work" && unzip -q -o out/pycuda-*.whl "$so" && readelf -d "$so" | grep -q 'libcuda.so.1') \
    || { echo "the built pycuda does not link libcuda.so.1" >&2; exit 1; }
rm -f .whl/pycuda-*
cp "$work"/out/pycuda-*.whl .whl/
# the sdist too: tools/gpu_run.sh builds it there if the wheel does not load
cp "$work/pycuda-$PYCUDA_VERSION.tar.gz" .whl/

# pycuda's requirements that the GPU machine's image lacks (it has numpy, mako's
# markupsafe and typing-extensions), as CPython 3.12 wheels.
PLAT="--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp $PLAT -d .whl pytools platformdirs mako siphash24
ls -l .whl
