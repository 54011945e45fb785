"""Structural rules of the code base (see doc/architecture.rst).

- The op graph (``geon/op_graph/``) never imports the backends (``geon.transformers``),
  and the library never imports its examples (``geon.examples``, which use the
  library, not the reverse): every import statement of every module, at any depth
  (inside functions too), is checked on the source's syntax tree.
- No module of ``geon`` takes part in an import cycle, counting the imports inside
  functions (in the op graph: engines own tables, op modules register into them), and
  no module of the op graph imports inside a function at all.
- The installed package holds no test-only code: a wheel built from the source tree
  contains only ``geon`` and its metadata, and none of the test suite's modules (the
  CUDA emulator among them).
"""

import ast
import gc
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


# --- import cycles -----------------------------------------------------------------------

def geon_modules():
    """``{dotted name: path}`` for every module of the geon package."""
    found = {}
    for m in sorted((ROOT / "geon").rglob("*.py")):
        parts = m.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = m
    return found


def module_deps(source, name, is_package, modules):
    """The modules of ``modules`` that the module ``name`` imports, at any depth.

    ``from p import x`` depends on ``p.x`` where that is a module and on ``p`` otherwise;
    the implicit import of a module's parent packages is not counted (every import of
    ``p.x`` runs ``p/__init__.py`` first: a package that imports its own submodules is
    the usual layout, not a cycle). Imports under ``if TYPE_CHECKING:`` never run and
    do not count.
    """
    package = name if is_package else name.rpartition(".")[0]
    deps = set()
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if (isinstance(node, ast.If) and isinstance(node.test, ast.Name)
                and node.test.id == "TYPE_CHECKING"):
            node.body = []  # (ast.walk reads the children after this)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            deps.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            for a in node.names:
                sub = f"{base}.{a.name}"
                deps.add(sub if sub in modules else base)
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and getattr(node.func, "attr", getattr(node.func, "id", None))
              in ("import_module", "__import__")):
            deps.add(node.args[0].value)
    return {d for d in deps if d in modules and d != name}


def import_graph():
    modules = geon_modules()
    return {name: module_deps(path.read_text(encoding="utf-8"), name,
                              path.name == "__init__.py", modules)
            for name, path in modules.items()}


def import_cycles(graph):
    """The strongly connected components of ``graph`` with more than one module (each
    sorted), found without recursion (Tarjan's algorithm with an explicit stack)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_op_graph_has_no_import_cycle():
    graph = import_graph()
    assert "geon.op_graph.autodiff" in graph  # the walk found the package
    bad = [c for c in import_cycles(graph) if any(m.startswith("geon.op_graph") for m in c)]
    assert not bad, "import cycles through geon/op_graph:\n" + "\n".join(map(str, bad))


def test_the_library_has_no_import_cycle():
    found = import_cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(map(str, found))


def test_cycle_search_finds_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e2"}, "e2": set()}
    assert import_cycles(graph) == [["a", "b", "c"]]
    modules = {"p", "p.x", "p.y"}
    assert module_deps("from . import x\nfrom .x import f", "p.y", False, modules) == {"p.x"}
    assert module_deps("def f():\n    from p import VERSION", "p.y", False, modules) == {"p"}
    assert module_deps("if TYPE_CHECKING:\n    from p import x", "p.y", False, modules) == set()


# --- engines and op modules --------------------------------------------------------------

#: The engines: they own the rule tables (``geon.op_graph.tables``) and walk graphs;
#: op modules register into the tables where they define their classes.
ENGINES = ("autodiff", "forward", "reference", "jacobian", "tables", "derivatives")
#: What an engine may import from the op graph: the core (``core``: Op, TensorOp,
#: storage; ``core_ops``: the sums, broadcasts, reorders and renames the engines
#: build), helpers without ops, and the other engines. ``ordering`` (the schedule with
#: write-after-read order) reads the view and assignment classes of the families.
ENGINE_MAY_IMPORT = {"core", "core_ops", "axes", "nodes", "keywords", "special",
                     "domain_values", "ordering"} | set(ENGINES)


def test_engines_import_no_op_module():
    graph = import_graph()
    bad = []
    for engine in ENGINES:
        for dep in sorted(graph[f"geon.op_graph.{engine}"]):
            if dep.startswith("geon.op_graph.") and dep.split(".")[2] not in ENGINE_MAY_IMPORT:
                bad.append(f"geon/op_graph/{engine}.py imports {dep}")
    assert not bad, "an engine imports an op module:\n" + "\n".join(bad)


def test_op_graph_imports_at_module_level_only():
    """No import inside a function: what a module needs is loaded with it, so no rule
    exists only once something else has been imported."""
    bad = []
    for m in sorted(OP_GRAPH.rglob("*.py")):
        for node in ast.walk(ast.parse(m.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                bad += [f"{m.relative_to(ROOT)}:{sub.lineno} (in {node.name})"
                        for sub in ast.walk(node)
                        if isinstance(sub, (ast.Import, ast.ImportFrom))]
    assert not bad, "imports inside functions:\n" + "\n".join(sorted(set(bad)))


def test_modules_and_functions_stay_small():
    """No module of the package over 800 lines, no function over 120."""
    bad = []
    for m in sorted((ROOT / "geon").rglob("*.py")):
        text = m.read_text(encoding="utf-8")
        if text.count("\n") > 800:
            bad.append(f"{m.relative_to(ROOT)}: {text.count(chr(10))} lines (over 800)")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > 120:
                    bad.append(f"{m.relative_to(ROOT)}:{node.lineno}: {node.name} has {n} lines")
    assert not bad, "\n".join(bad)


def test_one_rule_lookup():
    from geon.op_graph import autodiff
    from geon.op_graph.tables import ADJOINTS, OpTable
    import geon as be
    x = be.placeholder([be.Axis(3, "C")])
    y = be.tanh(x)
    assert autodiff.find_rule(ADJOINTS, y) is ADJOINTS.find(y)
    assert "OpTable.find" in (ROOT / "geon/op_graph/autodiff.py").read_text(encoding="utf-8")
    assert isinstance(ADJOINTS, OpTable)


def test_the_base_set_is_the_declared_primitives():
    import geon  # noqa: F401 (every op module loaded)
    from geon.op_graph import op_graph as og
    from geon.op_graph.autodiff import ADJOINTS
    from geon.op_graph.forward import FORWARD
    from geon.op_graph.primitives import Assign
    from geon.op_graph.reference import EVALUATORS
    from geon.op_graph.tables import primitive
    from geon.transformers.base import STANDARD_BASE_SET
    assert STANDARD_BASE_SET == frozenset(og.declared_primitives(og.Op))
    assert {og.Add, og.Constant, og.Output}.issubset(STANDARD_BASE_SET)

    class Plus(og.Add):  # a subclass is no primitive unless it says so
        pass

    @primitive
    class Declared(og.Add):
        pass

    found = og.declared_primitives(og.Op)
    assert Declared in found and Plus not in found
    del Plus, Declared, found  # (other tests walk the op classes too)
    gc.collect()
    # every primitive that computes a value has its reference value and derivatives
    computed = [c for c in STANDARD_BASE_SET
                if not issubclass(c, (og.AssignableTensorOp, Assign))]
    for table in (EVALUATORS, ADJOINTS, FORWARD):
        missing = [c.__name__ for c in computed
                   if not any(k in table for k in c.__mro__)]
        assert not missing, f"{table.name} lacks {missing}"


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
