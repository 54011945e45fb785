"""The NumPy transformer where the compiled path cannot run: no C compiler, or a ``$CC``
that does not work. Unlike tests/test_compiled.py, these run on machines without a
compiler too (where they test the real thing)."""

import warnings

import numpy as np
import pytest

import geon as be
from geon.errors import GeonWarning
from geon.transformers.numpy import compiled as ck
from geon.transformers.numpy import toolchain as ctoolchain
from geon.transformers.numpy import transformer as nt


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """A fresh kernel cache; no warning given, library loaded or failure remembered."""
    monkeypatch.setenv("GEON_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(ctoolchain, "_libs", {})
    monkeypatch.setattr(ctoolchain, "_warned", set())
    monkeypatch.setattr(ck, "_auto_off", set())
    return tmp_path / "kernels"


def large_and_small(transformer):
    """``tanh(3x) + x`` on 256 x 256 float64 (AUTO_MIN_ELEMENTS elements: a group "auto"
    compiles) and on 64 (left to NumPy); checks the values and returns the computation."""
    xb = be.placeholder([be.Axis(256, "FbR"), be.Axis(256, "FbC")], dtype=np.float64)
    xs = be.placeholder([be.Axis(64, "FbS")], dtype=np.float64)
    comp = transformer.computation([be.tanh(xb * 3.0) + xb, be.tanh(xs * 3.0) + xs],
                                   xb, xs)
    vb = np.linspace(-1, 1, 256 * 256).reshape(256, 256)
    vs = np.linspace(-2, 2, 64)
    gb, gs = comp(vb, vs)
    np.testing.assert_allclose(gb, np.tanh(vb * 3) + vb, rtol=1e-14)
    np.testing.assert_allclose(gs, np.tanh(vs * 3) + vs, rtol=1e-14)
    return comp


NO_COMPILER = ["geon-no-such-compiler-xyz", "false", '"unterminated']


@pytest.mark.parametrize("cc", NO_COMPILER)
def test_compiled_true_without_a_working_compiler_warns_once_and_runs_numpy_code(
        cc, fresh, monkeypatch):
    monkeypatch.setenv("CC", cc)
    with pytest.warns(GeonWarning, match="C compiler|NumPy code"):
        comp = large_and_small(be.NumPyTransformer(compiled=True))
    assert "# compiled:" not in comp.source
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # once per cause
        large_and_small(be.NumPyTransformer(compiled=True))
    assert not fresh.exists() or not list(fresh.glob("*.so"))


@pytest.mark.parametrize("cc", NO_COMPILER)
def test_auto_without_a_working_compiler_is_silent_and_tries_once(cc, fresh,
                                                                  monkeypatch):
    monkeypatch.setenv("CC", cc)
    generated = []
    real = nt.NumPyComputation._generate

    def counting(self, compiled=False):
        generated.append(compiled)
        return real(self, compiled)
    monkeypatch.setattr(nt.NumPyComputation, "_generate", counting)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        first = large_and_small(be.NumPyTransformer(compiled="auto"))
        second = large_and_small(be.NumPyTransformer(compiled="auto"))
    assert "# compiled:" not in first.source + second.source
    # the first computation tried, found no compiler, and generated the NumPy code; the
    # second went straight to the NumPy code
    assert generated == [ck.AUTO, False, False]
    assert be.NumPyTransformer(compiled="auto").compiled == ck.AUTO
