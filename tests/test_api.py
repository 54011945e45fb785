"""The public API: ``__all__`` of each public namespace, ``import *`` that leaves the
builtins alone, type hints on every public function and class, and mypy.

The API reference (doc/api/) is checked against the same ``__all__`` lists in
tests/test_docs.py.
"""

import builtins
import importlib
import inspect
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

import geon

ROOT = Path(__file__).resolve().parent.parent

#: The public namespaces: ``(what `import *` names, module)``. ``geon.np`` and
#: ``geon.simple`` are the op families, reached as ``be.np`` and ``be.simple``.
NAMESPACES = [("geon", "geon"), ("geon.np", "geon.op_graph.np_ops"),
              ("geon.simple", "geon.op_graph.simple_axes"),
              ("geon.transformers", "geon.transformers"),
              ("geon.transformers.passes", "geon.transformers.passes"),
              ("geon.frontends.neon", "geon.frontends.neon"),
              ("geon.frontends.netgraph", "geon.frontends.netgraph"),
              ("geon.frontends.onnx", "geon.frontends.onnx"),
              ("geon.transformers.torch", "geon.transformers.torch"),
              ("geon.frontends.torch", "geon.frontends.torch"),  # its former place
              ("geon.distributed", "geon.distributed")]
IDS = [n for n, _ in NAMESPACES]

#: Public attributes of ``geon`` that ``__all__`` leaves out on purpose: the family
#: modules and the reductions named like builtins.
GEON_NOT_EXPORTED = {"np", "simple", "sum", "max", "min"}


def _module(path):
    if path in ("geon.transformers.torch", "geon.frontends.torch"):
        pytest.importorskip("torch", reason=f"{path} needs PyTorch")
    if path == "geon.distributed":
        pytest.importorskip("mpi4py", reason="geon.distributed needs mpi4py")
    return importlib.import_module(path)


@pytest.mark.parametrize("name,path", NAMESPACES, ids=IDS)
def test_star_import_leaves_builtins_and_numpy_alone(name, path):
    module = _module(path)
    ns = {}
    exec(f"from {path} import *", ns)
    bound = set(ns) - {"__builtins__"}
    assert bound == set(module.__all__)
    shadowed = sorted(n for n in bound if hasattr(builtins, n))
    assert not shadowed, f"from {name} import * shadows builtins: {shadowed}"
    assert "np" not in bound
    for n in module.__all__:
        assert not isinstance(getattr(module, n), types.ModuleType), n


@pytest.mark.parametrize("name,path", NAMESPACES, ids=IDS)
def test_all_names_exist_once(name, path):
    module = _module(path)
    assert len(module.__all__) == len(set(module.__all__)), name
    missing = [n for n in module.__all__ if not hasattr(module, n)]
    assert not missing, f"{name}.__all__ names what {name} lacks: {missing}"


def test_star_import_keeps_the_builtins_working():
    ns = {"np": "numpy, untouched"}
    exec("from geon import *\nfrom geon.frontends.neon import *\n"
         "r = (sum([1, 2]), max(1, 2), min(1, 2), abs(-1))", ns)
    assert ns["r"] == (3, 2, 1, 1) and ns["np"] == "numpy, untouched"


def test_geon_exports_every_public_name():
    """A public name added to ``geon`` is either in ``__all__`` or deliberately left
    out (then it is listed here, with the reason above)."""
    public = {n for n, v in vars(geon).items()
              if not n.startswith("_") and not isinstance(v, types.ModuleType)}
    modules = {n for n, v in vars(geon).items() if isinstance(v, types.ModuleType)}
    assert public - set(geon.__all__) == GEON_NOT_EXPORTED - {"np", "simple"}
    assert {"np", "simple"} <= modules
    # the builtin-named reductions are still there, as attributes
    assert geon.sum is not builtins.sum and geon.np.sum is not builtins.sum


# --- type hints -----------------------------------------------------------------------------

#: Namespaces whose public functions and classes must be fully annotated, with the
#: optional package each needs to import (``None``: none).
TYPED = [("geon", None), ("geon.op_graph.np_ops", None),
         ("geon.op_graph.simple_axes", None), ("geon.frontends.neon", None),
         ("geon.frontends.onnx", None),  # imports onnx only when a model is loaded
         ("geon.frontends.netgraph", None),  # imports torch only in to_pytorch_model
         ("geon.transformers.torch", "torch"), ("geon.distributed", "mpi4py")]


def _typed_objects(path, needs):
    if needs is not None:
        pytest.importorskip(needs, reason=f"{path} needs {needs}, which is not installed")
    module = importlib.import_module(path)
    names = list(module.__all__)
    if path == "geon":
        names += sorted(GEON_NOT_EXPORTED - {"np", "simple"})
    elif path == "geon.op_graph.np_ops":
        names += ["sum", "max", "min", "abs"]
    return [(f"{path}.{n}", getattr(module, n)) for n in names]


def _unannotated(fn):
    """Parameters of ``fn`` without annotations (and ``return`` if it has none)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    missing = [p.name for p in sig.parameters.values()
               if p.name not in ("self", "cls") and p.annotation is inspect.Parameter.empty]
    if sig.return_annotation is inspect.Signature.empty and fn.__name__ != "__init__":
        missing.append("return")
    return missing


@pytest.mark.parametrize("path,needs", TYPED, ids=[p for p, _ in TYPED])
def test_public_functions_and_classes_have_type_hints(path, needs):
    """Every public function, and the constructor and public methods of every public
    class (those defined in geon), are annotated: each parameter and the return."""
    bad = []
    for qual, obj in _typed_objects(path, needs):
        if isinstance(obj, type):
            if issubclass(obj, BaseException):
                continue
            for attr, member in vars(obj).items():
                if attr.startswith("_") and attr != "__init__":
                    continue
                fn = member.fget if isinstance(member, property) else member
                if isinstance(fn, (staticmethod, classmethod)):
                    fn = fn.__func__
                if inspect.isfunction(fn) and fn.__module__.startswith("geon"):
                    miss = _unannotated(fn)
                    if miss:
                        bad.append(f"{qual}.{attr}: {miss}")
        elif callable(obj) and getattr(obj, "__module__", "").startswith("geon"):
            miss = _unannotated(obj)
            if miss:
                bad.append(f"{qual}: {miss}")
    assert not bad, "missing type hints:\n" + "\n".join(bad)


def test_py_typed_marker_ships():
    assert (ROOT / "geon" / "py.typed").is_file()
    import tomllib
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "py.typed" in config["tool"]["setuptools"]["package-data"]["geon"]


def test_mypy_is_clean_on_the_public_modules():
    """mypy with the configuration in pyproject.toml (``[tool.mypy]``), as CI runs it."""
    if shutil.which("mypy") is None and importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed (CI installs it: .ci/run)")
    run = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stdout + run.stderr
