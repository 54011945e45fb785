"""What the compiled path (geon/transformers/numpy/compiled.py) may be trusted with: it
loads no library that another user could have put in its cache, even by swapping the
folder between the check and the load; it rebuilds a cached library that lacks a
kernel; it refuses compiler flags that change floating-point results; and its maximum
and minimum give NumPy's bits for signed zeros and NaN."""

import hashlib
import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

import geon as be
from geon.errors import GeonWarning
from geon.transformers import fusion, threads
from geon.transformers.numpy import compiled as ck
from geon.transformers.numpy import c_codegen
from geon.transformers.numpy import toolchain as ctoolchain
from geon.transformers.numpy import kernel_cache

pytestmark = [
    pytest.mark.skipif(not ck.available(),
                       reason="no working C compiler for the compiled path"),
    pytest.mark.skipif(not hasattr(os, "getuid"), reason="no POSIX owners and modes"),
]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh kernel cache in ``tmp_path``, a folder the test may write to (as another
    user could write to a shared folder); no library loaded, nothing warned."""
    monkeypatch.setenv("GEON_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(ctoolchain, "_libs", {})
    monkeypatch.setattr(ck, "_auto_off", set())
    monkeypatch.setattr(ctoolchain, "_warned", set())
    return tmp_path / "kernels"


def kernel_calls(comp):
    return comp.source.count("# compiled:")


def run_chain(scale=5.0):
    """``tanh(scale * x) - x`` on 64 float64, compiled (one C function, geon_group0);
    checks the values and returns the computation."""
    x = be.placeholder([be.Axis(64, "TrA")], dtype=np.float64)
    comp = be.NumPyTransformer(compiled=True).computation(be.tanh(x * scale) - x, x)
    xs = np.linspace(-1, 1, 64)
    np.testing.assert_allclose(comp(xs), np.tanh(xs * scale) - xs, rtol=1e-14)
    return comp


def library(tmp_path, name, body):
    """A shared library built from C ``body`` with the compiler geon uses: its bytes."""
    src, out = tmp_path / f"{name}.c", tmp_path / f"{name}.so"
    src.write_text(body)
    cmd = ck.toolchain().command + ["-shared", "-fPIC", str(src), "-o", str(out)]
    subprocess.run(cmd, check=True, capture_output=True)
    return out.read_bytes()


def attacker_library(tmp_path, marker):
    """What another user would put there: a library whose constructor runs their code
    (here: writes ``marker``) in the process that loads it, and which defines the
    kernel geon looks for."""
    return library(tmp_path, "attacker", f"""
#include <stdio.h>
#include <stdint.h>
__attribute__((constructor)) static void run_on_load(void) {{
    FILE *f = fopen("{marker}", "w");
    if (f) {{ fputs("the attacker's code ran", f); fclose(f); }}
}}
void geon_group0(void *a, void *b, int64_t lo, int64_t hi) {{ }}
""")


def swap_in(cache, planted):
    """Do what another user who may write to the folder above ``cache`` can do between
    two steps of geon: rename ``cache`` away and put their own folder under its name,
    holding ``planted`` (name -> bytes). Returns the renamed original."""
    moved = cache.with_name("kernels-moved")
    cache.rename(moved)
    cache.mkdir(mode=0o700)
    for name, data in planted.items():
        (cache / name).write_bytes(data)
    return moved


# --- 1. the cache folder swapped between the check and its use ------------------------
def test_a_folder_swapped_in_after_the_check_is_never_loaded_from(cache, tmp_path,
                                                                   monkeypatch):
    run_chain()   # compiled, and kept in the cache
    (so,) = cache.glob("*.so")
    marker = tmp_path / "marker"
    evil = attacker_library(tmp_path, marker)
    digest = hashlib.sha256(evil).hexdigest()
    real, swapped = ctoolchain._load_cached, []

    def swap_then_load(*args, **kwargs):
        # the folder's owner and mode are checked; now the swap, then the load
        swapped.append(swap_in(cache, {so.name: evil,
                                       so.with_suffix(".sha256").name:
                                       (digest + "\n").encode()}))
        return real(*args, **kwargs)

    monkeypatch.setattr(ctoolchain, "_load_cached", swap_then_load)
    monkeypatch.setattr(ctoolchain, "_libs", {})   # a new process, as far as loading goes
    comp = run_chain()   # the values are the real kernel's
    assert swapped and kernel_calls(comp) == 1
    assert not marker.exists(), "the library of the folder swapped in was loaded"


def test_a_folder_swapped_in_before_the_build_gets_nothing_written(cache, tmp_path,
                                                                    monkeypatch):
    ck.toolchain()   # probed before: the swap happens between the check and the build
    real, swapped = ctoolchain._run_cc, []

    def swap_then_compile(*args):
        if not swapped:
            swapped.append(swap_in(cache, {"planted.txt": b"theirs"}))
        return real(*args)

    monkeypatch.setattr(ctoolchain, "_run_cc", swap_then_compile)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        comp = run_chain(scale=6.0)
    assert swapped and kernel_calls(comp) == 1
    # everything went to the folder that was checked; nothing to the one swapped in
    assert sorted(p.name for p in cache.iterdir()) == ["planted.txt"]
    kept = sorted(p.suffix for p in swapped[0].iterdir()
                  if not p.name.startswith("toolchain-"))
    assert kept == [".c", ".sha256", ".so"]


def test_the_cache_folder_must_be_a_real_folder_of_this_user(cache, tmp_path):
    mine = tmp_path / "elsewhere"
    mine.mkdir(mode=0o700)
    cache.symlink_to(mine)
    with pytest.warns(GeonWarning, match="symbolic link"):
        comp = run_chain()
    assert kernel_calls(comp) == 0 and not list(mine.iterdir())


def test_without_proc_fd_every_folder_above_the_cache_must_be_safe(tmp_path,
                                                                    monkeypatch):
    # where a descriptor has no path, the compiler and the loader go by the path: only
    # a path that no other user can change is used
    monkeypatch.setattr(kernel_cache, "_PROC_FD", str(tmp_path / "no-such-folder"))
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)       # others may rename what is in it
    monkeypatch.setenv("GEON_CACHE_DIR", str(shared / "geon"))
    for mode, compiled in ((0o777, False), (0o1777, True), (0o755, True)):
        monkeypatch.setattr(ctoolchain, "_libs", {})
        monkeypatch.setattr(ctoolchain, "_warned", set())
        shared.chmod(mode)    # 0o1777: sticky, as /tmp: others cannot rename ours
        if compiled:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                comp = run_chain()
        else:
            with pytest.warns(GeonWarning, match=f"others may change the folder "
                                                 f"{shared} above"):
                comp = run_chain()
        assert kernel_calls(comp) == int(compiled), oct(mode)


# --- 2. a cached library without the kernel ------------------------------------------
def test_a_cached_library_without_the_kernel_function_is_rebuilt(cache, tmp_path,
                                                                   monkeypatch):
    run_chain(scale=7.0)
    (so,) = cache.glob("*.so")
    empty = library(tmp_path, "empty", "int geon_nothing_here;\n")
    # its digest matches: what a build cut short, or another geon, could leave
    tmp = so.with_suffix(".tmp")
    tmp.write_bytes(empty)
    os.replace(tmp, so)
    so.with_suffix(".sha256").write_text(hashlib.sha256(empty).hexdigest() + "\n")
    monkeypatch.setattr(ctoolchain, "_libs", {})
    runs, real = [], ctoolchain._run_cc
    monkeypatch.setattr(ctoolchain, "_run_cc", lambda *a: runs.append(1) or real(*a))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        comp = run_chain(scale=7.0)
    assert kernel_calls(comp) == 1 and runs == [1]
    assert so.read_bytes() != empty
    assert ctoolchain._digest(str(so)) == so.with_suffix(".sha256").read_text().strip()
    monkeypatch.setattr(ctoolchain, "_libs", {})   # the rebuilt library is used from then on
    run_chain(scale=7.0)
    assert runs == [1]


# --- 3. compiler flags that change floating-point results -----------------------------
FAST_MATH_SCRIPT = r"""
import json, os, sys, warnings
import numpy as np
import geon as be
from geon.transformers.numpy import compiled as ck
from geon.transformers.numpy import toolchain as ctoolchain

def subnormals_kept():
    x = np.array([5e-324, 2.2250738585072014e-308])
    return bool(np.all(x * np.array([1.0, 0.5]) != 0))

def special_values(dtype):
    v = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -3.0, 1e-300], dtype)
    a, b = np.repeat(v, len(v)), np.tile(v, len(v))
    A = be.Axis(len(a), "FmA")
    x, y = be.placeholder([A], dtype=dtype), be.placeholder([A], dtype=dtype)
    outs = [x * y, x / y, x + y, be.maximum(x, y) * 2.0, be.minimum(x, y) * 2.0,
            be.where(be.not_equal(x, x), y, x) * 2.0, be.equal(x, y) * 2.0]
    comp = be.NumPyTransformer(compiled=True).computation(outs, x, y)
    with np.errstate(all="ignore"):
        want = [a * b, a / b, a + b, np.maximum(a, b) * 2, np.minimum(a, b) * 2,
                np.where(a != a, b, a) * 2, (a == b).astype(dtype) * 2]
        got = [np.asarray(g) for g in comp(a, b)]
    same = all(g.dtype == w.dtype and g.tobytes() == w.tobytes()
               for g, w in zip(got, want))
    return comp.source.count("# compiled:"), same

out = {}
for name, cc, refuse in [("dropped", sys.argv[1] + " -ffast-math -Ofast", True),
                         ("probed", sys.argv[1] + " -ffast-math", False)]:
    if not refuse:   # as if geon did not know these flags: its probe must see them
        ctoolchain.REFUSED_FLAGS, ctoolchain.REFUSED_PREFIXES = (), ()
    os.environ["CC"] = cc
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        calls, same = zip(*(special_values(t) for t in (np.float32, np.float64)))
    out[name] = {"warnings": [str(m.message) for m in w], "calls": list(calls),
                 "same": list(same), "subnormals": subnormals_kept()}
print(json.dumps(out))
"""


def test_flags_that_change_floating_point_results_are_refused(tmp_path):
    # in a process of its own: GCC links crtfastmath.o into a -ffast-math library, and
    # loading that makes the whole thread flush subnormal numbers to zero
    env = dict(os.environ, GEON_CACHE_DIR=str(tmp_path), GEON_COMPILED="1")
    r = subprocess.run([sys.executable, "-c", FAST_MATH_SCRIPT,
                        " ".join(ck.toolchain().command)],
                       capture_output=True, text=True, env=env, timeout=600,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.splitlines()[-1])
    dropped, probed = out["dropped"], out["probed"]
    # -ffast-math and -Ofast are left out, with a warning naming them; the kernels
    # compile and give NumPy's bits for NaN, infinities and signed zeros
    assert any("leaves out -ffast-math -Ofast" in w
               for w in dropped["warnings"]), dropped
    assert dropped["calls"] == [1, 1] and dropped["same"] == [True, True], dropped
    assert dropped["subnormals"]
    # a flag geon did not know of: the probe finds that IEEE semantics are broken (and
    # undoes the flush to zero its loading turned on); the NumPy code runs instead
    assert any("IEEE" in w or "subnormal" in w for w in probed["warnings"]), probed
    assert probed["calls"] == [0, 0] and probed["same"] == [True, True], probed
    assert probed["subnormals"], "loading the probe left subnormals flushed to zero"


@pytest.mark.parametrize("flag", ["-ffinite-math-only", "-fno-signed-zeros",
                                  "-fassociative-math -fno-signed-zeros",
                                  "-freciprocal-math"])
def test_the_probe_finds_flags_that_break_ieee_semantics(flag, cache, monkeypatch):
    # what geon would do with a flag it does not know (none of these link crtfastmath)
    monkeypatch.setattr(ctoolchain, "REFUSED_FLAGS", ())
    monkeypatch.setenv("CC", " ".join(ck.toolchain().command + flag.split()))
    monkeypatch.setattr(ctoolchain, "_toolchains", {})
    with pytest.warns(GeonWarning, match=r"breaks IEEE floating point \("):
        comp = run_chain()
    assert kernel_calls(comp) == 0
    assert not list(cache.glob("toolchain-*.json"))   # nothing kept: probed again


def test_the_refused_flags_are_named_in_the_warning(monkeypatch):
    monkeypatch.setattr(ctoolchain, "_warned", set())
    cc = ck.toolchain().command[0]
    monkeypatch.setenv("CC", f"{cc} -O2 -ffp-contract=fast -freciprocal-math -g")
    with pytest.warns(GeonWarning, match="leaves out -ffp-contract=fast "
                                         "-freciprocal-math when"):
        command = ctoolchain._compiler_command()
    assert command == [cc, "-O2", "-g"]


# --- 4. signed zeros and NaN in maximum and minimum -----------------------------------
def _special(dtype):
    """Every ordered pair of -0.0, +0.0, two NaN (one negative, other payloads), +-inf
    and two numbers: ``(a, b)``."""
    bits = np.uint32 if dtype == np.float32 else np.uint64
    nan1 = np.array([0x7FC00001 if dtype == np.float32 else 0x7FF8000000000001],
                    bits).view(dtype)[0]
    nan2 = np.array([0xFFC00002 if dtype == np.float32 else 0xFFF8000000000002],
                    bits).view(dtype)[0]
    v = np.array([-0.0, 0.0, nan1, nan2, np.inf, -np.inf, 1.5, -2.0], dtype)
    return np.repeat(v, len(v)), np.tile(v, len(v))


PATHS = {  # name -> (shape, reads b through a transpose, with slow members, threads)
    "one loop": ((64 * 41 + 13,), False, False, False),     # vectors and their tail
    "short rows": ((64, 3), True, False, False),            # rows of 3: tails only
    "tiles": ((c_codegen.TILED_MIN_ELEMENTS + 64 * 5 + 13,), False, True, False),
    "threads": ((64 * 101 + 13,), False, False, True),
    "threads, rows": ((64 * 11, 13), True, True, True),
}


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_maximum_and_minimum_give_numpys_bits(dtype, path, cache, monkeypatch):
    shape, transposed, slow, threaded = PATHS[path]
    if threaded:
        monkeypatch.setattr(fusion, "MAX_THREADS", 2)
        monkeypatch.setattr(threads.POLICY, "threads", 2)
        monkeypatch.setattr(c_codegen, "PARALLEL_ELEMENTS", 4096)
        monkeypatch.setattr(c_codegen, "BLOCK_ELEMENTS", 1000)   # ragged blocks
    a0, b0 = _special(dtype)
    n = int(np.prod(shape))
    a, b = np.resize(a0, n).reshape(shape), np.resize(b0, n).reshape(shape)
    axes = [be.Axis(k, f"Mm{i}") for i, k in enumerate(shape)]
    x = be.placeholder(axes, dtype=dtype)
    if transposed:
        t = be.placeholder(axes[::-1], dtype=dtype)
        y, feeds = be.axes_with_order(t, axes), (a, np.ascontiguousarray(b.T))
    else:
        t = y = be.placeholder(axes, dtype=dtype)
        feeds = (a, b)
    hi, lo = be.maximum(x, y), be.minimum(x, y)
    outs = [hi * 2.0, lo * 2.0, be.maximum(y, x) * 2.0, be.minimum(y, x) * 2.0]
    if slow:   # more members that call the maths library: the group runs in tiles
        outs.append(be.sqrt(be.exp(hi) + be.exp(lo)))
    comp = be.NumPyTransformer(compiled=True).computation(outs, x, t)
    source = comp._kernels.source or ""
    assert kernel_calls(comp) == 1 and "np.maximum" not in comp.source, comp.source
    assert ("loops over tiles of" in source) == (slow and n >= c_codegen.TILED_MIN_ELEMENTS)
    assert ("_run_blocks" in comp.source) == threaded
    got = [np.asarray(g) for g in comp(*feeds)]
    want = [np.maximum(a, b) * 2, np.minimum(a, b) * 2, np.maximum(b, a) * 2,
            np.minimum(b, a) * 2]
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype
        differ = np.nonzero(g.reshape(-1).view(f"u{w.itemsize}")
                            != w.reshape(-1).view(f"u{w.itemsize}"))[0]
        assert not len(differ), (k, [(a.reshape(-1)[i], b.reshape(-1)[i],
                                      g.reshape(-1)[i], w.reshape(-1)[i])
                                     for i in differ[:4]])


def test_a_closed_cache_folder_never_writes_to_the_working_directory(tmp_path, monkeypatch):
    """dir_fd=None would make every open relative to the working directory: a closed
    folder refuses instead (a probe record once landed in the repository's root)."""
    cache = tmp_path / "cache"
    folder = ck.open_folder(str(cache), make=True)
    folder.close()
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    for call in (lambda: folder.write_atomic("record.json", b"{}"),
                 lambda: folder.write_new("x", b""), lambda: folder.unlink("x")):
        with pytest.raises(OSError, match="was closed"):
            call()
    assert folder.read("record.json") is None
    assert list(work.iterdir()) == []
