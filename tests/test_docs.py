"""Run every ``.. code-block:: python`` sample of the user guide in doc/.

The samples of one page run in order in one shared namespace, in a temporary working
directory. They are compiled with the page's path and line numbers, so a failure points
at the line of the .rst file. Sphinx is not needed (a small line parser extracts the
blocks); if it is installed, one more test builds the guide with warnings as errors.
"""

import ast
import importlib
import importlib.util
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

import geon.frontends.base.axis as ax
from geon.op_graph.axes import Axis

DOC = Path(__file__).resolve().parent.parent / "doc"
PAGES = sorted(DOC.glob("*.rst"))

#: A page that runs samples needing an optional package says so in a comment line,
#: ``.. geon-doc-requires: torch``; without the package its samples are skipped.
_REQUIRES = re.compile(r"^\.\.\s+geon-doc-requires:\s*(?P<mods>.+?)\s*$", re.M)
_DIRECTIVE = re.compile(r"^(?P<indent>\s*)\.\.\s+(?P<kind>code-block|code|sourcecode)::"
                        r"\s*(?P<lang>\S*)\s*$")
#: Languages of samples that are shown, not run.
SHOWN = {"text", "console", "toml", "ini", "none"}
#: Process-wide tables that samples extend (a plugin's op, rules, transformer).
REGISTRIES = [("geon.registry", "_REGISTRY"),
              ("geon.transformers.numpy.transformer", "NUMPY_CODE"),
              ("geon.transformers.gpu.cuda", "CUDA_CODE"),
              ("geon.op_graph.reference", "EVALUATORS"),
              ("geon.op_graph.reference", "ELEMENTWISE_FUNCS"),
              ("geon.op_graph.autodiff", "ADJOINTS"),
              ("geon.op_graph.forward", "FORWARD"),
              ("geon.frontends.onnx.ops", "OPS"),
              ("geon.frontends.torch.export", "TORCH_OPS")]


def code_blocks(path):
    """``[(first_line, source)]`` for each ``code-block:: python`` of ``path``.

    ``first_line`` is the 1-based line of the block's first code line; ``source`` is
    dedented. Any other code directive must name a language in :data:`SHOWN`.
    """
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = _DIRECTIVE.match(lines[i])
        i += 1
        if not m:
            continue
        kind, lang = m["kind"], m["lang"]
        if lang != "python":
            assert lang in SHOWN, (f"{path.name}:{i}: code sample in language {lang!r}; use "
                                   f"'python' (run) or one of {sorted(SHOWN)} (shown only)")
            continue
        assert kind == "code-block", f"{path.name}:{i}: use '.. code-block:: python'"
        indent = len(m["indent"])
        # Options (":caption: ...") come first, then a blank line, then the body.
        while i < len(lines) and lines[i].strip().startswith(":"):
            i += 1
        body, first = [], None
        while i < len(lines):
            text = lines[i]
            if text.strip() and len(text) - len(text.lstrip()) <= indent:
                break
            if text.strip() and first is None:
                first = i + 1
            if first is not None:
                body.append(text)
            i += 1
        assert first is not None, f"{path.name}:{i}: empty code block"
        blocks.append((first, textwrap.dedent("\n".join(body)).rstrip() + "\n"))
    return blocks


@pytest.fixture
def isolated_globals():
    """Undo what samples do to process-wide state: the standard axes' lengths and the
    registries a plugin sample extends."""
    lengths = {a: a.length for a in vars(ax).values() if isinstance(a, Axis)}
    tables = []
    for module, name in REGISTRIES:
        try:
            tables.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            pass  # a table this version of geon does not have
    saved = [dict(t) for t in tables]
    from geon.op_graph.collectives import collectives, set_collectives
    backend, hook = collectives(), sys.excepthook  # geon.distributed.init() sets them
    yield
    set_collectives(backend)
    sys.excepthook = hook
    for a, n in lengths.items():
        a.length = n
    for t, s in zip(tables, saved):
        t.clear()
        t.update(s)


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_samples_run(page, tmp_path, monkeypatch, isolated_globals):
    for m in _REQUIRES.finditer(page.read_text(encoding="utf-8")):
        for mod in m["mods"].replace(",", " ").split():
            pytest.importorskip(mod, reason=f"the samples of {page.name} need {mod}")
    blocks = code_blocks(page)
    monkeypatch.chdir(tmp_path)  # save / restore samples write files
    namespace = {"__name__": f"geon_doc_{page.stem}"}
    with warnings.catch_warnings():
        # A sample that overflows or divides by zero is a wrong sample.
        warnings.simplefilter("error", RuntimeWarning)
        for first, source in blocks:
            code = compile("\n" * (first - 1) + source, str(page), "exec")
            exec(code, namespace)


def test_error_samples_fail_when_no_error_is_raised():
    """Every ``try`` with an ``except`` in a sample has an ``else`` branch, so a sample
    that shows an error fails when the error is not raised (instead of passing
    vacuously)."""
    vacuous = []
    for page in PAGES:
        for first, source in code_blocks(page):
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, ast.Try) and node.handlers and not node.orelse:
                    vacuous.append(f"{page.name}:{first + node.lineno - 1}")
    assert not vacuous, f"try/except without else: {vacuous}"


def test_parser_finds_samples():
    """Every chapter has samples, and the parser sees them all."""
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        n = len(re.findall(r"^\s*\.\. code-block:: python\s*$", text, re.M))
        assert len(code_blocks(page)) == n > 0, page.name


def test_toctree_lists_every_page():
    lines = (DOC / "index.rst").read_text(encoding="utf-8").splitlines()
    start = lines.index(".. toctree::") + 1
    listed = set()
    for text in lines[start:]:
        if text.strip() and not text.startswith(" "):
            break  # the end of the directive
        if text.strip() and not text.strip().startswith(":"):
            listed.add(text.strip())
    assert listed == {p.stem for p in PAGES} - {"index"}


def test_sphinx_build_has_no_warnings(tmp_path):
    if importlib.util.find_spec("sphinx") is None:
        pytest.skip("Sphinx is not installed: the docs build needs the docs extra "
                    "(pip install -e '.[docs]'); CI builds the docs in a step of its own")
    run = subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-W", "-q",
                          "-d", str(tmp_path / "doctrees"), str(DOC), str(tmp_path / "html")],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
