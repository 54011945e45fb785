"""Structural rules of the code base (see doc/architecture.rst).

- The op graph (``geon/op_graph/``) never imports the backends (``geon.transformers``),
  and the library never imports its examples (``geon.examples``, which use the
  library, not the reverse): every import statement of every module, at any depth
  (inside functions too), is checked on the source's syntax tree.
- The installed package holds no test-only code: a wheel built from the source tree
  contains only ``geon`` and its metadata, and none of the test suite's modules (the
  CUDA emulator among them).
"""

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from test_packaging import setuptools_77

ROOT = Path(__file__).resolve().parent.parent
OP_GRAPH = ROOT / "geon" / "op_graph"
FORBIDDEN = "geon.transformers"


def imported_modules(source, package):
    """``[(line, dotted name)]`` for every module that ``source`` (the text of a module
    of ``package``) imports, relative imports resolved; ``from a import b`` yields both
    ``a`` and ``a.b`` (``b`` may be a submodule); ``import_module("a")`` and
    ``__import__("a")`` with a literal name count too."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{a.name}") for a in node.names]
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and getattr(node.func, "attr", getattr(node.func, "id", None))
              in ("import_module", "__import__")):
            found.append((node.lineno, node.args[0].value))
    return found


def _forbidden(name):
    return name == FORBIDDEN or name.startswith(FORBIDDEN + ".")


def test_op_graph_imports_no_backend():
    modules = sorted(OP_GRAPH.rglob("*.py"))
    assert len(modules) > 10  # the walk found the package
    bad = []
    for m in modules:
        rel = m.relative_to(ROOT)
        package = ".".join(rel.parts[:-1])
        bad += [f"{rel}:{line}: imports {name}"
                for line, name in imported_modules(m.read_text(encoding="utf-8"), package)
                if _forbidden(name)]
    assert not bad, "geon/op_graph must not import geon.transformers:\n" + "\n".join(bad)


def test_the_library_imports_no_example():
    bad = []
    for m in sorted((ROOT / "geon").rglob("*.py")):
        rel = m.relative_to(ROOT)
        if rel.parts[1] == "examples":
            continue
        package = ".".join(rel.parts[:-1])
        bad += [f"{rel}:{line}: imports {name}"
                for line, name in imported_modules(m.read_text(encoding="utf-8"), package)
                if name == "geon.examples" or name.startswith("geon.examples.")]
    assert not bad, "the library must not import geon.examples:\n" + "\n".join(bad)


@pytest.mark.parametrize("source, caught", [
    ("import geon.transformers.numpy", True),
    ("import numpy, geon.transformers as t", True),
    ("from geon.transformers import base", True),
    ("from geon import transformers", True),
    ("def f():\n    from geon.transformers.numpy.transformer import NUMPY_CODE", True),
    ("class A:\n    def f(self):\n        import geon.transformers", True),
    ("from ..transformers import base", True),
    ("from .. import transformers", True),
    ("import importlib\nimportlib.import_module('geon.transformers.base')", True),
    ("from geon.op_graph import op_graph\nimport numpy", False),
    ("from . import axes\nfrom .. import errors", False),
    ("import importlib\nimportlib.import_module('geon.op_graph.axes')", False),
])
def test_import_walk_catches_every_form(source, caught):
    names = [n for _, n in imported_modules(source, "geon.op_graph")]
    assert any(map(_forbidden, names)) == caught


# --- the wheel ---------------------------------------------------------------------------

_NOT_SOURCE = shutil.ignore_patterns(".git", ".venv", "venv", "build", "dist", "*.egg-info",
                                     "__pycache__", ".pytest_cache", ".hypothesis",
                                     "_build", "*.npz.tmp")


@pytest.mark.skipif(not setuptools_77(),
                    reason="building the wheel without downloading needs setuptools >= 77 "
                           "(the build backend pyproject.toml names)")
def test_wheel_ships_no_test_code(tmp_path):
    # build from a copy, so that the build leaves nothing in the source tree
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=_NOT_SOURCE)
    out = tmp_path / "wheel"
    run = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                          "--no-build-isolation", "--no-index", "-w", str(out), str(src)],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    (wheel,) = out.glob("geon_graph-*.whl")  # the distribution is geon-graph
    names = zipfile.ZipFile(wheel).namelist()
    assert "geon/transformers/gpu/codegen.py" in names  # the listing is the package's
    outside = [n for n in names if not n.startswith(("geon/", "geon_graph-"))]
    assert not outside, f"the wheel ships files outside the geon package: {outside}"
    test_modules = {p.stem for p in (ROOT / "tests").glob("*.py")}
    assert "cuda_emulator" in test_modules
    shipped = [n for n in names if n.endswith(".py")
               and (Path(n).stem in test_modules or "emulator" in Path(n).stem)]
    assert not shipped, f"the wheel ships test-only modules: {shipped}"
