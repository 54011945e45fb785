"""The example models on geon's native runtime (issue 36's target): the digits MLP, the
digits CNN and the digits LSTM (and GRU), their inference and their training steps
(loss, correct count and every optimizer update) as plans, against the "numpy"
backend over several steps. The recurrent models' loops are unrolled into the plan
(``plan(..., unroll=True)``): the runtime has no loop primitive, and says so for a plan
that still holds one. A native backend is also found by name through an entry point of
the ``geon.backends`` group, as an installed package would register it."""

import argparse
import importlib
import json
import sys

import numpy as np
import pytest

import geon as be
from geon.examples import digits, digits_cnn, digits_rnn
from geon.transformers import backends as bk
from geon.transformers import native

from test_native_runtime import MISSING, _same, runtime  # noqa: F401

pytestmark = pytest.mark.skipif(bool(MISSING), reason="building the native runtime needs "
                                                      f"{' and '.join(MISSING)}")
BATCH = 8
BUILT = 4   # the batch size the models are built with


def _mlp():
    return digits.build_model(dict(hidden=16, seed=0, lr=0.1, batch_size=BUILT), 64, "numpy")


def _cnn():
    return digits_cnn.build_model(argparse.Namespace(
        channels=4, seed=0, lr=1e-3, batch_size=BUILT, transformer="numpy",
        data_parallel=False))


def _rnn(cell):
    return lambda: digits_rnn.build_model(argparse.Namespace(
        hidden=12, cell=cell, seed=0, lr=1e-2, batch_size=BUILT, transformer="numpy",
        data_parallel=False))


MODELS = {"mlp": _mlp, "cnn": _cnn, "lstm": _rnn("lstm"), "gru": _rnn("gru")}


def _inputs(model, rng):
    shape = (BATCH,) + tuple(a.length for a in model.input_axes)
    return rng.uniform(0, 16, size=shape).astype(np.float32)


def _train_plan(model, unroll):
    """The plan of the model's training step at ``BATCH`` as ``Model.train_computation``
    builds it (``(x, targets) -> (loss, correct count, updates...)``), written by a
    stand-in for the model's transformer (the model is built at another batch size,
    so this is a new step, chained after its first as the model chains its own)."""
    weights = model.transformer          # the Variables' values the plan carries

    class Planner:
        def computation(self, results, *placeholders):
            self.doc = bk.plan(results, *placeholders, state=weights, unroll=unroll)
            self.target = placeholders[1]

    planner = model.transformer = Planner()
    try:
        model.train_computation(BATCH)
    finally:
        model.transformer = weights
    return planner.doc, planner.target


def _ops(doc):
    return {r["op"] for r in json.loads(doc)["graph"]["ops"]}


@pytest.mark.parametrize("name", list(MODELS))
def test_the_example_models_infer_and_train_on_the_runtime(runtime, name):
    model = MODELS[name]()
    recurrent = name in ("lstm", "gru")
    rng = np.random.default_rng(3)
    x = _inputs(model, rng)
    doc = digits.inference_plan(model, BATCH, unroll=recurrent)
    assert "Scan" not in _ops(doc)
    _same(doc, [x], runtime, dtype=np.float32)
    doc, target = _train_plan(model, recurrent)
    labels = rng.integers(0, 10, BATCH)
    if np.dtype(target.dtype).kind in "iu":  # the class numbers
        t = labels.astype(target.dtype)
    else:                                    # one-hot, in the target's axis order
        t = np.eye(10, dtype=target.dtype)[labels]
        t = t if target.axes.lengths == t.shape else t.T.copy()
    _same(doc, [x, t], runtime, steps=3, dtype=np.float32)


def test_a_plan_with_a_loop_is_refused_with_the_way_out(runtime):
    model = MODELS["lstm"]()
    doc = digits.inference_plan(model, BATCH)
    assert "Scan" in _ops(doc)
    with pytest.raises(native.NativeBackendError, match=r"Scan.*unroll=True") as e:
        runtime.load(doc)
    # GEON_ERR_INVALID_PLAN: the runtime reads graphs of format version 2; bodies
    # need version 3
    assert e.value.status == 1 and "version 2" in str(e.value)
    bk.backend("numpy").load(doc)            # the Python backend runs the loop as is


def test_plan_unroll_takes_no_transformer():
    x = be.placeholder([be.Axis(2, "UnA")])
    with pytest.raises(be.ArgumentError, match="unroll=True"):
        bk.plan(x + 1.0, x, transformer=be.NumPyTransformer(), unroll=True)


def test_a_native_backend_found_through_an_entry_point(runtime, tmp_path, monkeypatch):
    """A package that ships a backend library registers a factory under
    ``geon.backends``; ``backend(name)`` finds and loads it."""
    site = tmp_path / "site"
    (site / "geon_native_demo-1.0.dist-info").mkdir(parents=True)
    (site / "geon_native_demo-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: geon-native-demo\nVersion: 1.0\n")
    (site / "geon_native_demo-1.0.dist-info" / "entry_points.txt").write_text(
        "[geon.backends]\nnative-demo = geon_native_demo:backend\n")
    (site / "geon_native_demo.py").write_text(
        "from geon.transformers.native import load_backend\n"
        f"def backend():\n    return load_backend({runtime.path!r})\n")
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    try:
        assert "native-demo" in bk.available_backends()
        found = bk.backend("native-demo")
        assert isinstance(found, native.NativeBackend)
        x = be.placeholder([be.Axis(3, "EpA")], dtype=np.float32)
        (y,) = found.load(bk.plan(be.tanh(x) * 2.0, x)).run(np.arange(3, dtype=np.float32))
        np.testing.assert_allclose(y, np.tanh(np.arange(3)) * 2.0, rtol=1e-6)
    finally:
        sys.modules.pop("geon_native_demo", None)
