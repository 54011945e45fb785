#!/usr/bin/env bash
# The whole hardware check of the GPU transformer, as one command on a GPU machine:
#
#   tools/gpu_run.sh OUTDIR
#
# run from anywhere in a checkout whose .whl/ holds what tools/build_gpu_wheels.sh puts
# there (pycuda for CPython 3.12 and its requirements). It installs them into a private
# folder (no network needed), checks that pycuda sees a device, runs the GPU tests
# (`pytest -m gpu`, every test to the end, a time limit per test) and
# `python -m benchmarks.gpu --quick`, and writes into OUTDIR:
#
#   env.txt      the device, driver, Python, CUDA and package versions
#   install.log  what installing printed
#   pytest.log   the tests' output; junit.xml their results
#   bench.log    the benchmarks' output (Markdown tables)
#   results.md   the summary: each phase's time, the pass/fail/skip counts, the failures
#                and the benchmark tables
#
# Each phase has a time limit (GPU_TEST_LIMIT, GPU_BENCH_LIMIT seconds) so that the
# whole run ends within about 8 minutes even when something hangs; a failed phase does
# not stop the later ones. The exit status is that of the tests.
set -uo pipefail
out=${1:?usage: tools/gpu_run.sh OUTDIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
root=$(pwd)
PY=${PYTHON:-python3}
site=${GPU_SITE:-/tmp/geon-gpu-site}
test_limit=${GPU_TEST_LIMIT:-250}
bench_limit=${GPU_BENCH_LIMIT:-150}
t0=$(date +%s)
phase_times=()
stamp() { phase_times+=("$1: $(( $(date +%s) - $2 )) s"); }

# nvcc must be on PATH at run time: pycuda compiles geon's kernels with it.
if ! command -v nvcc >/dev/null 2>&1; then
    for d in "${CUDA_ROOT:-}/bin" /usr/local/cuda/bin /usr/local/cuda-*/bin; do
        if [ -x "$d/nvcc" ]; then export PATH="$d:$PATH"; break; fi
    done
fi

{
    echo "date: $(date -u +%FT%TZ)"
    echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo '?') $(git status --porcelain 2>/dev/null | wc -l) file(s) changed"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv 2>&1
    "$PY" -V 2>&1
    command -v nvcc && nvcc --version | tail -2
    "$PY" -m pip list 2>/dev/null | grep -i -E '^(numpy|torch|cupy|cuda-bindings|pytest|pytest-timeout|hypothesis) '
} > "$out/env.txt" 2>&1
cat "$out/env.txt"

# --- install: the carried wheels, into a folder of their own ---------------------------
t=$(date +%s)
{
    "$PY" -m pip install --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$site" "$root"/.whl/*.whl
    export PYTHONPATH="$site:$root"
    if ! "$PY" -c 'import pycuda.driver as d; d.init(); print("pycuda", d.get_version(), d.Device(0).name())'; then
        # the carried wheel does not load here: build pycuda from the carried sdist
        sdist=$(ls "$root"/.whl/pycuda-*.tar.gz 2>/dev/null | head -1)
        if [ -n "$sdist" ]; then
            echo "building pycuda from $sdist"
            tmp=$(mktemp -d) && tar xzf "$sdist" -C "$tmp" && (
                cd "$tmp"/pycuda-* &&
                "$PY" configure.py --cuda-root="$(dirname "$(dirname "$(command -v nvcc)")")" \
                    --no-cuda-enable-curand >/dev/null &&
                MAKEFLAGS=-j16 "$PY" -m pip install --no-index --no-deps --no-build-isolation \
                    --target "$site" --upgrade .
            )
        fi
    fi
} > "$out/install.log" 2>&1
export PYTHONPATH="$site:$root"
stamp install "$t"
tail -3 "$out/install.log"

status=$("$PY" -c 'from geon.transformers.gpu import gpu_status; ok, why = gpu_status(); print("ok" if ok else why)' 2>&1)
echo "gpu_status: $status"

# --- the GPU tests ----------------------------------------------------------------------
t=$(date +%s)
opts=()  # pytest-timeout, where installed: a hung test fails and the rest go on
"$PY" -c 'import pytest_timeout' 2>/dev/null && opts=(--timeout 150)
# pytest-xdist, where installed: each test compiles its kernels with nvcc, so the tests
# share the machine's cores (each worker has a CUDA context of its own)
"$PY" -c 'import xdist' 2>/dev/null && opts+=(-n "${GPU_TEST_WORKERS:-12}")
timeout -k 10 "$test_limit" "$PY" -m pytest -m gpu -p no:cacheprovider -o addopts="" -rfEs \
    "${opts[@]}" --junitxml="$out/junit.xml" tests/test_gpu.py tests/test_torch_export.py \
    > "$out/pytest.log" 2>&1
test_rc=$?
stamp "tests (rc $test_rc)" "$t"
tail -25 "$out/pytest.log"

# --- the benchmarks ---------------------------------------------------------------------
t=$(date +%s)
PYTHONUNBUFFERED=1 timeout -k 10 "$bench_limit" "$PY" -m benchmarks.gpu --quick \
    > "$out/bench.log" 2>&1
bench_rc=$?
stamp "benchmarks (rc $bench_rc)" "$t"
cat "$out/bench.log"
stamp total "$t0"

# --- the summary --------------------------------------------------------------------------
"$PY" - "$out" "$status" "${phase_times[@]}" <<'PYEOF'
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

out, status, phases = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
env = (out / "env.txt").read_text().strip()
lines = ["# GPU run", "", "```", env, "```", "", f"gpu_status: {status}", "",
         "| phase | time |", "|---|---|"]
lines += [f"| {p.split(': ')[0]} | {p.split(': ')[1]} |" for p in phases]
counts, failed = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}, []
try:
    root = ET.parse(out / "junit.xml").getroot()
    for case in root.iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        kinds = [c.tag for c in case]
        if "failure" in kinds or "error" in kinds:
            kind = "failed" if "failure" in kinds else "error"
            counts[kind] += 1
            msg = next(c for c in case if c.tag in ("failure", "error")).get("message", "")
            failed.append(f"- `{name}` ({kind}): {msg[:300]}")
        elif "skipped" in kinds:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
except (OSError, ET.ParseError) as e:
    lines += ["", f"no test results ({e})"]
lines += ["", "| passed | failed | errors | skipped |", "|---|---|---|---|",
          f"| {counts['passed']} | {counts['failed']} | {counts['error']} | {counts['skipped']} |"]
if failed:
    lines += ["", "Failures:", ""] + failed
bench = (out / "bench.log").read_text() if (out / "bench.log").exists() else ""
lines += ["", "## Benchmarks (`python -m benchmarks.gpu --quick`)", "", bench.strip()]
(out / "results.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines[:len(lines) - 1]))
PYEOF
exit $test_rc
