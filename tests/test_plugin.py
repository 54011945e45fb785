"""The example transformer plugin (examples/plugin): installed, found, fused, correct.

The fixture installs the package with pip into a temporary folder put on ``sys.path``
(its ``geon.transformers`` entry point is found there, as in site-packages), unless it
is installed already (``pip install -e examples/plugin``). The environment is left as
it was, apart from the plugin's module staying imported.
"""

import importlib
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest

import geon as be
from geon.transformers import base as tbase

PLUGIN = Path(__file__).resolve().parent.parent / "examples" / "plugin"
NAME = "geon-axpy"


def _installed():
    return NAME in {ep.name for ep in metadata.entry_points(group=tbase.ENTRY_POINT_GROUP)}


def _offline_build_possible():
    """Whether pip can build the plugin without downloading setuptools: its
    pyproject.toml needs setuptools >= 77 (the SPDX ``license`` string; bdist_wheel is
    part of setuptools from 70.1)."""
    try:
        import setuptools
    except ImportError:
        return False
    version = tuple(int(p) for p in setuptools.__version__.split(".")[:2] if p.isdigit())
    return version >= (77, 0)


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    """The plugin's module, installed for this test module."""
    added = None
    if not _installed():
        tmp = tmp_path_factory.mktemp("geon-axpy")
        src, site = tmp / "src", tmp / "site"
        # A copy, so that the build leaves no build/ or *.egg-info in the repository.
        shutil.copytree(PLUGIN, src, ignore=shutil.ignore_patterns(
            "build", "*.egg-info", "__pycache__"))
        cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile",
               "--disable-pip-version-check", "--quiet", "--target", str(site), str(src)]
        if _offline_build_possible():
            cmd.insert(4, "--no-build-isolation")
        run = subprocess.run(cmd, capture_output=True, text=True)
        assert run.returncode == 0, "pip could not install the plugin:\n" + run.stdout \
            + run.stderr
        sys.path.insert(0, str(site))
        added = str(site)
        importlib.invalidate_caches()
    yield importlib.import_module("geon_axpy")
    if added is not None:
        sys.path.remove(added)
        importlib.invalidate_caches()
    tbase._REGISTRY.pop(NAME, None)


def model(C, N):
    a = be.placeholder(C, dtype=np.float64, name="a")
    x = be.placeholder([C, N], dtype=np.float64, name="x")
    y = be.placeholder([N, C], dtype=np.float64, name="y")
    r = a * x + y                                   # the standard subgraph Axpy replaces
    return [r, be.tanh(r), be.deriv(be.sum(r * r, out_axes=()), a)], [a, x, y]


def test_discovered_through_its_entry_point(plugin):
    assert NAME in be.available_transformers()
    eps = {ep.name: ep for ep in metadata.entry_points(group="geon.transformers")}
    assert eps[NAME].value == "geon_axpy:AxpyTransformer"
    t = be.make_transformer(NAME)
    assert isinstance(t, plugin.AxpyTransformer) and isinstance(t, be.NumPyTransformer)
    assert t.name == NAME and plugin.Axpy in t.base_set


def test_the_rewrite_fires_and_results_match(plugin):
    C, N = be.Axis(4, "C"), be.Axis(3, "N", batch=True)
    rng = np.random.default_rng(0)
    values = [rng.standard_normal(4), rng.standard_normal((4, 3)), rng.standard_normal((3, 4))]
    results, params = model(C, N)
    fused = be.make_transformer(NAME).computation(results, *params)
    results, params = model(C, N)
    plain = be.make_transformer("numpy").computation(results, *params)
    assert "# Axpy <- Add" in fused.source and "np.multiply(" in fused.source
    assert "# Axpy" not in plain.source
    for got, want in zip(fused(*values), plain(*values)):
        np.testing.assert_allclose(got, want, rtol=1e-14)
    a, x, y = values
    np.testing.assert_allclose(fused(*values)[0], a[:, None] * x + y.T, rtol=1e-14)


def test_numpy_family_graphs_fuse_too(plugin):
    def mlp():
        x = be.np.placeholder((5, 4), dtype=np.float64, name="x")
        w = be.np.variable(np.linspace(-1, 1, 12).reshape(4, 3), name="w")
        b = be.np.variable(np.ones(3), name="b")
        return be.np.tanh(x @ w * 2.0 + b), x

    X = np.linspace(0, 1, 20).reshape(5, 4)
    r, x = mlp()
    fused = be.make_transformer(NAME).computation(r, x)
    r, x = mlp()
    plain = be.NumPyTransformer().computation(r, x)
    assert "# Axpy" in fused.source
    np.testing.assert_allclose(fused(X), plain(X), rtol=1e-14)


def test_passes_inserted_at_a_named_point(plugin):
    standard = [p.name for p in be.NumPyTransformer().passes()]
    at = standard.index("fold") + 1
    names = [p.name for p in be.make_transformer(NAME).passes()]
    assert names == standard[:at] + ["fuse_axpy"] + standard[at:]
    unfused = be.make_transformer(NAME, disable=["fuse_axpy"])
    results, params = model(be.Axis(2, "C"), be.Axis(2, "N"))
    assert "# Axpy" not in unfused.computation(results, *params).source


def test_transformer_specific_op_needs_a_transformer_that_has_it(plugin):
    C = be.Axis(3, "C")
    ops = be.transformer_ops(NAME)                   # exposed to frontends
    a, x = be.placeholder(C, name="a"), be.placeholder(C, name="x")
    r = ops.axpy(a, x, 1.0)
    assert isinstance(r, plugin.Axpy)
    assert be.transformers_with(plugin.Axpy) == [NAME]
    with pytest.raises(be.LoweringError) as e:
        be.NumPyTransformer().computation(r, a, x)
    msg = str(e.value)
    assert "Axpy is not in the transformer's base set" in msg
    assert f"transformer(s) {NAME}" in msg and f'File "{__file__}"' in msg
    got = be.make_transformer(NAME).computation(r, a, x)(np.ones(3), np.full(3, 2.0))
    np.testing.assert_allclose(got, 3.0)


def test_axpy_derivatives(plugin):
    C = be.Axis(3, "C")
    a = be.placeholder(C, dtype=np.float64, name="a")
    x = be.placeholder(C, dtype=np.float64, name="x")
    cost = be.sum(plugin.axpy(a, x, x) ** 2, out_axes=())
    da, dx = be.deriv(cost, [a, x])
    tangent = be.jvp(plugin.axpy(a, x, 1.0), [a, x], [np.ones(3), np.ones(3)])
    A, X = np.array([1.0, 2.0, 3.0]), np.array([0.5, -1.0, 2.0])
    got = be.make_transformer(NAME).computation([da, dx, tangent], a, x)(A, X)
    r = A * X + X
    np.testing.assert_allclose(got[0], 2 * r * X)
    np.testing.assert_allclose(got[1], 2 * r * (A + 1))
    np.testing.assert_allclose(got[2], X + A)


def test_insert_passes_names_the_points():
    passes = be.NumPyTransformer().passes()
    with pytest.raises(ValueError, match="no pass named 'nope'"):
        be.insert_passes(passes, [], after="nope")
    with pytest.raises(TypeError, match="exactly one"):
        be.insert_passes(passes, [], after="fold", before="cse")
    extra = be.pass_named(passes, "fold")
    assert be.insert_passes(passes, extra, before="lower")[1] is extra
