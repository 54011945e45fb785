"""The native adapter's call path (geon/transformers/native/callpath.py: a CPython
extension module built at first use through geon's toolchain and kernel cache) and
its ctypes fallback give the same results and the same errors. Every adapter test here
runs on both paths, against tests/native/add_one_backend.c (``y = x + 1`` in float64,
any shape and strides); the ctypes path is forced by making the module unavailable."""

import ctypes
import os
import shutil
import subprocess
import sys
import threading
import warnings

import numpy as np
import pytest

import geon as be
from geon.errors import FeedError
from geon.transformers import backends as bk
from geon.transformers import native
from geon.transformers.native import callpath
from geon.transformers.numpy import toolchain

HERE = os.path.dirname(os.path.abspath(__file__))
CC = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler to build the test backend")
HAS_CALL_PATH = CC is not None and callpath.include_dir() is not None


def _build(folder, name="backend.so", *defines):
    out = folder / name
    subprocess.run([CC, "-std=c99", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC",
                    *defines, "-I", native.include_dir(),
                    os.path.join(HERE, "native", "add_one_backend.c"), "-o", str(out)],
                   check=True, capture_output=True)
    os.chmod(out, 0o700)
    return str(out)


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    return _build(tmp_path_factory.mktemp("callpath"))


@pytest.fixture(params=["extension", "ctypes"])
def backend(request, library, monkeypatch):
    """The test backend on the call path, or forced onto the ctypes path."""
    if request.param == "ctypes":
        monkeypatch.setattr(callpath, "load", lambda: None)
    elif not HAS_CALL_PATH:
        pytest.skip("no Python.h here: the call path cannot be built")
    nb = native.load_backend(library)
    assert nb.call_path == request.param
    return nb


def _plan(shape=(2, 3)):
    x = be.placeholder([be.Axis(n, f"CpN{k}") for k, n in enumerate(shape)],
                       dtype=np.float64)
    return bk.plan(x + 1.0, x)


def test_the_call_path_is_built_where_it_can_be(library):
    if not HAS_CALL_PATH:
        pytest.skip("no Python.h here")
    nb = native.load_backend(library)
    assert nb.call_path == "extension"
    with nb.load(_plan()) as ex:
        assert ex.call_path == "extension"
        assert ex._fast is not None


def test_inputs_are_read_in_place_whatever_their_layout(backend):
    X = np.arange(48.0).reshape(8, 6)
    with backend.load(_plan((2, 3))) as ex:
        assert ex.call_path == backend.call_path
        for x in (np.ones((2, 3)), X[::4, 1::2], X[::-4, ::-2], X.T[:3, :2].T,
                  np.broadcast_to(np.arange(3.0), (2, 3)),        # zero strides
                  np.asfortranarray(X[:2, :3])):
            (y,) = ex.run(x)
            np.testing.assert_array_equal(y, np.asarray(x) + 1)
            assert y.flags.c_contiguous and y.flags.writeable and y.flags.owndata
        # data that is misaligned, or strides that are not whole elements: copied first
        raw = np.zeros(6 * 8 + 1, np.uint8)
        odd = np.frombuffer(raw.data, np.float64, count=6, offset=1).reshape(2, 3)
        odd[...] = np.arange(6.0).reshape(2, 3)
        assert not odd.flags.aligned
        np.testing.assert_array_equal(ex.run(odd)[0], odd + 1)
        rows = np.zeros((2, 3), [("a", np.float64), ("b", np.int32)])
        rows["a"] = np.arange(6.0).reshape(2, 3)
        np.testing.assert_array_equal(ex.run(rows["a"])[0], rows["a"] + 1)
        # other sequences and subclasses go through np.asarray, as before
        np.testing.assert_array_equal(ex.run([[1.0, 2, 3], [4, 5, 6]])[0],
                                      [[2.0, 3, 4], [5, 6, 7]])
        sub = np.ones((2, 3)).view(type("Sub", (np.ndarray,), {}))
        np.testing.assert_array_equal(ex.run(sub)[0], np.full((2, 3), 2.0))


def test_each_run_gives_new_outputs_and_keeps_no_reference(backend):
    x = np.ones((2, 3))
    with backend.load(_plan((2, 3))) as ex:
        before = sys.getrefcount(x)
        outs = [ex.run(x)[0] for _ in range(50)]
        assert sys.getrefcount(x) == before
        assert len({id(o) for o in outs}) == 50
        for o in outs:
            assert sys.getrefcount(o) == 3    # outs, o and the argument: no leak
        outs[0][...] = 7.0                    # writable, and its own memory
        np.testing.assert_array_equal(outs[1], 2.0)
        x.resize((3, 2), refcheck=False)      # no buffer of x is still held
        np.testing.assert_array_equal(ex.run(x.reshape(2, 3))[0], np.full((2, 3), 2.0))


def test_scalar_and_empty_plans(backend):
    with backend.load(_plan(())) as ex:
        (y,) = ex.run(np.float64(2.5))
        assert y.shape == () and y == 3.5
        (y,) = ex.run(np.array(4.0))
        assert y == 5.0
    with backend.load(_plan((0, 3))) as ex:
        (y,) = ex.run(np.ones((0, 3)))
        assert y.shape == (0, 3)


def test_wrong_inputs_give_the_same_feed_errors(backend):
    with backend.load(_plan((2, 3))) as ex:
        for args, match in [((), r"the plan takes 1 inputs, got 0"),
                            ((np.ones((2, 3)), np.ones((2, 3))), "takes 1 inputs, got 2"),
                            ((np.ones((3, 2)),), r"input 0 of the plan is float64\[2, 3\], "
                                                 r"got float64\[3, 2\]"),
                            ((np.ones((2, 3), np.float32),), r"got float32\[2, 3\]"),
                            ((np.ones((2, 3), ">f8"),), r"got >f8\[2, 3\]"),
                            ((np.ones(6),), r"got float64\[6\]")]:
            with pytest.raises(FeedError, match=match):
                ex.run(*args)
        np.testing.assert_array_equal(ex.run(np.zeros((2, 3)))[0], 1.0)


def test_closed_executables_and_backend_errors(backend):
    ex = backend.load(_plan((3,)))
    np.testing.assert_array_equal(ex.run(np.ones(3))[0], 2.0)
    ex.close()
    with pytest.raises(native.NativeBackendError, match="was closed"):
        ex.run(np.ones(3))
    with pytest.raises(FeedError):            # the inputs are checked first, as before
        ex.run(np.ones(4))
    ex.close()                                # (twice is fine)
    ex = backend.load(_plan((3,)))
    ex.outputs = [((3,), np.dtype(np.float32))]   # an output the backend refuses
    for _ in range(2):                            # (the second run on the new outputs)
        with pytest.raises(native.NativeBackendError,
                           match="running the plan failed with GEON_ERR_BAD_TENSOR: "
                                 "expected one float64") as e:
            ex.run(np.ones(3))
        assert e.value.status == 3
    ex.outputs = [((3,), np.dtype(np.float64))]
    np.testing.assert_array_equal(ex.run(np.ones(3))[0], 2.0)
    np.testing.assert_array_equal(ex.run(np.ones(3))[0], 2.0)
    ex.outputs = [((3,), np.dtype(">f8"))]        # not little-endian: refused before
    with pytest.raises(native.NativeBackendError, match="little-endian"):
        ex.run(np.ones(3))


def test_threads_take_turns_on_one_executable(tmp_path, monkeypatch, request):
    for path in ("extension", "ctypes"):
        if path == "ctypes":
            monkeypatch.setattr(callpath, "load", lambda: None)
        elif not HAS_CALL_PATH:
            continue
        nb = native.load_backend(_build(tmp_path, f"slow-{path}.so", "-DTEST_SLOW",
                                        "-D_POSIX_C_SOURCE=199309L"))
        assert nb.call_path == path
        ex = nb.load(_plan((2, 3)))
        errors = []

        def work():
            try:
                for _ in range(5):
                    np.testing.assert_array_equal(ex.run(np.ones((2, 3)))[0], 2.0)
            except Exception as e:  # (reported below)
                errors.append(e)
        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        assert ctypes.CDLL(nb.path).test_most_in_flight() == 1
        closer = threading.Thread(target=ex.close)
        closer.start()
        try:
            ex.run(np.ones((2, 3)))          # before the close, or refused after it
        except native.NativeBackendError as e:
            assert "was closed" in str(e)
        closer.join()
        with pytest.raises(native.NativeBackendError, match="was closed"):
            ex.run(np.ones((2, 3)))


def test_without_a_compiler_or_python_h_the_ctypes_path_runs_silently(library, monkeypatch):
    monkeypatch.setattr(callpath, "_loaded", {})
    monkeypatch.setenv("CC", "/no/such/compiler")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert callpath.load() is None
        nb = native.load_backend(library)
        assert nb.call_path == "ctypes"
        with nb.load(_plan((2, 3))) as ex:
            np.testing.assert_array_equal(ex.run(np.ones((2, 3)))[0], 2.0)
    monkeypatch.delenv("CC")
    monkeypatch.setattr(callpath, "_loaded", {})
    monkeypatch.setattr(callpath, "include_dir", lambda: None)
    assert callpath.load() is None
    assert native.load_backend(library).call_path == "ctypes"


def test_geon_compiled_0_keeps_the_compiler_from_running(library, monkeypatch):
    monkeypatch.setattr(callpath, "_loaded", {})
    monkeypatch.setenv("GEON_COMPILED", "0")
    monkeypatch.setattr(toolchain, "build", lambda *a, **k: pytest.fail("a compiler ran"))
    assert callpath.load() is None
    with native.load_backend(library).load(_plan((2, 3))) as ex:
        assert ex.call_path == "ctypes"
        np.testing.assert_array_equal(ex.run(np.ones((2, 3)))[0], 2.0)


@pytest.mark.skipif(not HAS_CALL_PATH, reason="no Python.h here")
def test_the_call_path_is_kept_in_the_kernel_cache_keyed_on_its_flags(tmp_path, monkeypatch):
    monkeypatch.setenv("GEON_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(callpath, "_loaded", {})
    monkeypatch.setattr(toolchain, "_libs", {})
    assert callpath.load() is not None
    tc = toolchain.toolchain()
    flags = ("-I" + callpath.include_dir(),)
    key = toolchain.cache_key(callpath.SOURCE, tc, flags)
    kept = tmp_path / "kernels"
    assert (kept / (key + ".c")).read_text() == callpath.SOURCE
    assert (kept / (key + ".so")).exists() and (kept / (key + ".sha256")).exists()
    # the flags are part of the key; no flags keep the key every other build has
    assert key != toolchain.cache_key(callpath.SOURCE, tc)
    assert toolchain.cache_key("int f;", tc, ()) == toolchain.cache_key("int f;", tc)
    # a new process loads it from the cache, and runs on it
    code = ("from geon.transformers.native import callpath; import sys; "
            "sys.exit(0 if callpath.load() is not None else 1)")
    env = dict(os.environ, GEON_CACHE_DIR=str(tmp_path))
    assert subprocess.run([sys.executable, "-c", code], env=env).returncode == 0
    assert sorted(p.name for p in kept.iterdir() if p.name.startswith(key)) == \
        [key + ".c", key + ".sha256", key + ".so"]
