"""Backends behind one interface (geon/transformers/backends.py) and native ones behind
the C ABI of geon_backend.h (geon/transformers/native): plan documents, the NumPy
backend, and the adapter's checks, run against tests/native/add_one_backend.c (a
backend of the one plan ``x + 1``, built here with the system C compiler)."""

import json
import os
import shutil
import subprocess

import numpy as np
import pytest

import geon as be
from geon.errors import FeedError, SerializationError
from geon.transformers import backends as bk
from geon.transformers import native

HERE = os.path.dirname(os.path.abspath(__file__))
CC = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
needs_cc = pytest.mark.skipif(CC is None, reason="no C compiler to build the test backend")


def _mlp_plan():
    A, B = be.Axis(3, "BkA"), be.Axis(4, "BkB")
    x = be.placeholder([A, B], dtype=np.float64, name="x")
    w = be.Variable(axes=[B], initial_value=np.arange(4.0), dtype=np.float64, name="w")
    return bk.plan([be.tanh(be.dot(x, w)), be.sum(x, out_axes=())], x)


# --- plans and the NumPy backend -------------------------------------------------------

def test_a_plan_is_the_lowered_graph_with_its_inputs_and_outputs():
    doc = json.loads(_mlp_plan())
    assert (doc["format"], doc["version"]) == ("geon-plan", 1)
    kinds = {r["op"] for r in doc["graph"]["ops"]}
    assert "Gemm" in kinds and "Dot" not in kinds        # lowered to the base set
    assert doc["inputs"] == [{"shape": [3, 4], "dtype": "<f8"}]
    assert doc["outputs"] == [{"shape": [3], "dtype": "<f8"}, {"shape": [], "dtype": "<f8"}]


def test_the_numpy_backend_runs_a_plan():
    X = np.linspace(-1, 1, 12).reshape(3, 4)
    with bk.backend("numpy").load(_mlp_plan()) as ex:
        y, s = ex.run(X)
    np.testing.assert_allclose(y, np.tanh(X @ np.arange(4.0)), rtol=1e-15)
    np.testing.assert_allclose(s, X.sum(), rtol=1e-15)
    assert "numpy" in bk.available_backends()


def test_bad_plans_and_feeds_are_clear_errors():
    ex = bk.backend("numpy").load(_mlp_plan())
    with pytest.raises(FeedError, match=r"input 0 of the plan is float64\[3, 4\]"):
        ex.run(np.zeros((4, 3)))
    with pytest.raises(FeedError, match="takes 1 inputs, got 2"):
        ex.run(np.zeros((3, 4)), np.zeros(3))
    doc = json.loads(_mlp_plan())
    for bad, match in [("[]", "expected format"), ("{", "not valid JSON"),
                       (json.dumps(dict(doc, version=7)), "reads version 1"),
                       (json.dumps(dict(doc, inputs=[])), "one placeholder per input"),
                       ("[" * 100000 + "]" * 100000, "nested too deeply"),
                       (json.dumps(dict(doc, inputs=[7])), r"inputs\[0\]: expected"),
                       (json.dumps(dict(doc, inputs=[{"shape": [3, 4]}])), "expected"),
                       (json.dumps(dict(doc, inputs=[{"shape": [3, 4.0], "dtype": "<f8"}])),
                        "list of lengths"),
                       (json.dumps(dict(doc, inputs=[{"shape": [3, 4], "dtype": "<f4"}])),
                        r"inputs\[0\] says '<f4' \[3, 4\], but the graph's x is float64"),
                       (json.dumps(dict(doc, inputs=[{"shape": [3, 4], "dtype": "nope"}])),
                        "says 'nope'"),
                       (json.dumps(dict(doc, outputs=[{"shape": [7, 7], "dtype": "<f8"},
                                                      doc["outputs"][1]])),
                        r"outputs\[0\] says '<f8' \[7, 7\]")]:
        with pytest.raises(SerializationError, match=match):
            bk.backend("numpy").load(bad)
    with pytest.raises(be.UnknownTransformerError, match="no backend named 'nope'"):
        bk.backend("nope")


# --- the native adapter -------------------------------------------------------------------

def _build(tmp_path, name="backend.so", *defines):
    out = tmp_path / name
    subprocess.run([CC, "-std=c99", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC",
                    *defines, "-I", native.include_dir(),
                    os.path.join(HERE, "native", "add_one_backend.c"), "-o", str(out)],
                   check=True, capture_output=True)
    os.chmod(out, 0o700)
    return str(out)


def _add_one_plan(shape=(2, 3)):
    x = be.placeholder([be.Axis(n, f"BkN{k}") for k, n in enumerate(shape)],
                       dtype=np.float64)
    return bk.plan(x + 1.0, x)


@needs_cc
def test_a_native_backend_runs_on_the_arrays_own_memory(tmp_path):
    nb = native.load_backend(_build(tmp_path))
    X = np.arange(24.0).reshape(4, 6)
    with nb.load(_add_one_plan((2, 3))) as ex:
        (y,) = ex.run(X[::2, 1::2])               # strided input, read in place
        np.testing.assert_array_equal(y, X[::2, 1::2] + 1)
        (y,) = ex.run(np.ones((2, 3)))
        np.testing.assert_array_equal(y, 2 * np.ones((2, 3)))
    with pytest.raises(native.NativeBackendError, match="was closed"):
        ex.run(np.ones((2, 3)))


@needs_cc
def test_native_errors_carry_the_code_and_message(tmp_path):
    nb = native.load_backend(_build(tmp_path))
    x = be.placeholder([be.Axis(3, "BkT")], dtype=np.float64)
    with pytest.raises(native.NativeBackendError,
                       match="GEON_ERR_UNSUPPORTED: unsupported ops: Tanh") as e:
        nb.load(bk.plan(be.tanh(x), x))
    assert e.value.status == 2
    ex = nb.load(_add_one_plan((3,)))
    ex.outputs = [((3,), np.dtype(np.float32))]   # an output the backend refuses
    with pytest.raises(native.NativeBackendError, match="GEON_ERR_BAD_TENSOR"):
        ex.run(np.ones(3))


@needs_cc
def test_libraries_are_checked_before_use(tmp_path):
    with pytest.raises(native.NativeBackendError, match="no backend library"):
        native.load_backend(str(tmp_path / "missing.so"))
    old = _build(tmp_path, "old.so", "-DTEST_ABI=2")
    with pytest.raises(native.NativeBackendError, match="ABI version 2, this geon version 1"):
        native.load_backend(old)
    partial = _build(tmp_path, "partial.so", "-DTEST_NO_RUN")
    with pytest.raises(native.NativeBackendError, match="lacks geon_backend_run"):
        native.load_backend(partial)
    shared = _build(tmp_path, "shared.so")
    os.chmod(shared, 0o722)
    with pytest.raises(native.NativeBackendError, match="others may change the backend"):
        native.load_backend(shared)
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    lib = _build(open_dir, "b.so")
    os.chmod(open_dir, 0o777)
    with pytest.raises(native.NativeBackendError, match="others may change the folder"):
        native.load_backend(lib)
    with pytest.raises(native.NativeBackendError, match="does not load"):
        bad = tmp_path / "text.so"
        bad.write_text("not a library")
        os.chmod(bad, 0o600)
        native.load_backend(str(bad))


def test_the_header_ships_with_the_package():
    header = os.path.join(native.include_dir(), "geon_backend.h")
    text = open(header).read()
    assert "#define GEON_BACKEND_ABI_VERSION 1u" in text
    assert all(s in text for s in native.SYMBOLS)
