"""Models that run with no Python (issue 36): the digits example trains its MLP and
exports the inference plan with the trained weights and the test set
(``--export``); ``native/examples/digits_predict.c``, built with the runtime by CMake,
classifies the test set from those two files alone, and its accuracy is the one the
example reports. Also: ``plan(..., state=...)``, and the data set file format.

The cold start the program measures (entering main to the first batch's result:
loading the runtime, the plan with its weights and the data, one batch) is printed and
recorded as a property (``-rP`` or ``--junitxml`` show it), never asserted."""

import json
import os
import re
import shutil
import subprocess
import time

import numpy as np
import pytest

import geon as be
from geon.errors import ArgumentError, SerializationError
from geon.examples import _train, digits
from geon.transformers import backends as bk
from geon.transformers.native import export as ex
from geon.transformers.native.build import build_runtime

CC = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
MISSING = [t for t, p in (("cmake", shutil.which("cmake")), ("a C compiler", CC)) if not p]
needs_build = pytest.mark.skipif(bool(MISSING), reason=f"building the native runtime and "
                                                       f"digits_predict needs "
                                                       f"{' and '.join(MISSING)}")


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    """The path of digits_predict, built beside libgeon_native by build_runtime."""
    lib = build_runtime(str(tmp_path_factory.mktemp("rt")))
    path = os.path.join(os.path.dirname(lib), "digits_predict")
    assert os.access(path, os.X_OK), path
    return path


def _predict(program, plan_path, data_path, tmp_path):
    """Run digits_predict: (right, n, cold start ms, wall seconds, predictions)."""
    preds = tmp_path / "predictions.bin"
    start = time.perf_counter()
    done = subprocess.run([program, plan_path, data_path, "--predictions", str(preds)],
                          capture_output=True, text=True, timeout=120,
                          env={"PATH": os.environ.get("PATH", "")})   # no PYTHON* at all
    wall = time.perf_counter() - start
    assert done.returncode == 0, done.stdout + done.stderr
    m = re.search(r"^accuracy [\d.]+ \((\d+)/(\d+)\)", done.stdout, re.M)
    cold = re.search(r"^cold start ([\d.]+) ms", done.stdout, re.M)
    assert m and cold, done.stdout
    print(done.stdout.strip(), f"\n(process wall time {wall * 1e3:.1f} ms)")
    return int(m[1]), int(m[2]), float(cold[1]), wall, np.fromfile(preds, "<i4")


def _python_scores(plan_path, x):
    """The plan's class scores for every sample of x on the NumPy backend, in batches
    of the plan's size, the last padded."""
    with open(plan_path, encoding="utf-8") as f:
        document = f.read()
    b = json.loads(document)["inputs"][0]["shape"][0]
    executable = bk.backend("numpy").load(document)
    out = []
    for s in range(0, len(x), b):
        batch = np.zeros((b, x.shape[1]), np.float32)
        batch[:len(x[s:s + b])] = x[s:s + b]
        out.append(executable.run(batch)[0][:len(x[s:s + b])])
    return np.concatenate(out)


def _check_same_classes(c_preds, scores, labels, right_c, right_py):
    """C's predictions are NumPy's argmax of the same scores, except where the two
    largest scores are within float32 rounding of each other (the runtime's products
    add in another order than NumPy's): only such ties may change a class."""
    py_preds = np.argmax(scores, axis=1)
    differ = np.flatnonzero(c_preds != py_preds)
    top2 = np.sort(scores, axis=1)[:, -2:]
    gap = top2[:, 1] - top2[:, 0]
    assert np.all(gap[differ] <= 1e-5 * np.maximum(1.0, np.abs(top2[differ, 1]))), differ
    assert abs(right_c - right_py) <= len(differ)
    assert int(np.sum(py_preds == labels)) == right_py


@needs_build
def test_digits_predict_reports_the_examples_accuracy(program, tmp_path, record_property):
    """The example's own run (default hyperparameters, 30 epochs) with --export, then
    the C program on the files: the accuracy the example prints, with no Python."""
    result = digits.main(["--quiet", "--no-save", "--export", str(tmp_path)])
    plan_path, data_path = result["export"]
    n_test = result["n_test"]
    right_py = int(round(result["test_accuracy"] * n_test))
    right_c, n, cold_ms, wall, c_preds = _predict(program, plan_path, data_path, tmp_path)
    assert n == n_test and len(c_preds) == n_test
    x, y = ex.read_dataset(data_path)
    scores = _python_scores(plan_path, x)      # the same weights, in Python
    _check_same_classes(c_preds, scores, y, right_c, right_py)
    assert right_c == right_py   # no near-ties on this data: the same accuracy exactly
    record_property("cold_start_ms", cold_ms)
    record_property("accuracy_c", right_c / n)
    record_property("accuracy_python", result["test_accuracy"])
    print(f"digits: C {right_c}/{n}, Python {right_py}/{n_test}; cold start "
          f"{cold_ms:.3f} ms (process {wall * 1e3:.1f} ms)")


@needs_build
def test_a_plan_of_the_whole_test_set_in_one_batch(program, tmp_path):
    """export() with the test set's size as the batch (no padding), on a model trained
    with the example's functions for 2 epochs: the accuracy of Model.evaluate."""
    x_train, y_train, x_test, y_test = _train.digits_data((64,))
    model = digits.build_model(dict(digits.HYPERPARAMETERS), 64, "numpy")
    model.fit(x_train, y_train, epochs=2, batch_size=32, seed=0, verbose=False)
    plan_path, data_path = digits.export(model, str(tmp_path), x_test, y_test,
                                         batch_size=len(x_test))
    assert json.loads(open(plan_path).read())["inputs"][0]["shape"] == [len(x_test), 64]
    right_c, n, _, _, c_preds = _predict(program, plan_path, data_path, tmp_path)
    right_py = int(round(model.evaluate(x_test, y_test)["accuracy"] * len(x_test)))
    _check_same_classes(c_preds, model.predict(x_test), y_test, right_c, right_py)
    assert (n, right_c) == (len(x_test), right_py)


@needs_build
def test_digits_predict_refuses_bad_files(program, tmp_path):
    A, B = be.Axis(4, "NdA"), be.Axis(3, "NdB")
    x = be.placeholder([A, B], dtype=np.float32)
    good_plan = tmp_path / "plan.json"
    ex.write_plan(str(good_plan), x * 2.0, x)
    data = tmp_path / "data.bin"
    ex.write_dataset(str(data), np.zeros((5, 3)), np.arange(5))
    (tmp_path / "bad.bin").write_bytes(data.read_bytes()[:-1])
    (tmp_path / "notaplan.json").write_text('{"format": "geon-plan", "inputs": [')
    other = tmp_path / "other.bin"
    ex.write_dataset(str(other), np.zeros((5, 4)), np.arange(5))
    cases = [([str(good_plan)], "usage"), ([str(good_plan), str(tmp_path / "bad.bin")],
                                           "size is not its header's"),
             ([str(tmp_path / "notaplan.json"), str(data)], "not a plan of one float32"),
             ([str(good_plan), str(other)], "another number of features"),
             ([str(good_plan), str(data), "--runtime", "/no/such/lib.so"], "cannot load"),
             ([str(tmp_path / "missing.json"), str(data)], "cannot read the plan")]
    for args, message in cases:
        done = subprocess.run([program, *args], capture_output=True, text=True, timeout=60)
        assert done.returncode == 1 and message in done.stderr, (args, done.stderr)
    done = subprocess.run([program, str(good_plan), str(data)], capture_output=True,
                          text=True, timeout=60)
    # the scores are all 0: the class is 0, the first label
    assert done.returncode == 0 and "(1/5) on 5 samples in batches of 4" in done.stdout


def test_plan_state_sets_the_variables_values():
    A, B = be.Axis(3, "NdS"), be.Axis(2, "NdT")
    x = be.placeholder([A, B], dtype=np.float64)
    w = be.Variable(axes=[B], initial_value=np.ones(2), dtype=np.float64, name="w")
    feeds = np.arange(6.0).reshape(3, 2)
    runs = {}
    for key, state in (("initial", None), ("mapping", {w: [2.0, -1.0]})):
        runs[key] = bk.backend("numpy").load(bk.plan(be.dot(x, w), x, state=state)).run(feeds)[0]
    np.testing.assert_allclose(runs["initial"], feeds.sum(1))
    np.testing.assert_allclose(runs["mapping"], feeds @ [2.0, -1.0])
    t = be.make_transformer("numpy")
    t.computation(be.dot(x, w), x)
    t.write_values({w: np.array([0.5, 3.0])})
    y = bk.backend("numpy").load(bk.plan(be.dot(x, w), x, state=t)).run(feeds)[0]
    np.testing.assert_allclose(y, feeds @ [0.5, 3.0])
    with pytest.raises(ArgumentError, match="state must be a transformer or a mapping"):
        bk.plan(be.dot(x, w), x, state=3)


def test_dataset_files_round_trip_and_refuse_others(tmp_path):
    path = tmp_path / "d.bin"
    images = np.random.default_rng(0).random((7, 2, 3))
    ex.write_dataset(str(path), images, np.arange(7) - 2)
    raw = path.read_bytes()
    assert raw[:4] == b"GNDS" and len(raw) == 16 + 4 * 7 * (6 + 1)
    x, y = ex.read_dataset(str(path))
    np.testing.assert_array_equal(x, images.reshape(7, 6).astype(np.float32))
    np.testing.assert_array_equal(y, np.arange(7) - 2)
    assert x.dtype == np.float32 and y.dtype == np.int32
    for bad in (raw[:-4], b"XXXX" + raw[4:], raw[:4] + b"\x02" + raw[5:], raw[:10]):
        path.write_bytes(bad)
        with pytest.raises(SerializationError):
            ex.read_dataset(str(path))
    with pytest.raises(ArgumentError, match="labels must be 2 integers"):
        ex.write_dataset(str(path), np.zeros((2, 3)), np.zeros(2))
