"""Run the user guide's samples (doc/*.rst) and check what they print.

A page's samples are its ``>>>`` examples (reST doctest blocks: the call, then what it
prints or returns, or for an error ``Traceback (most recent call last):``, ``...`` and
the exception's last line) and its ``.. code-block:: python`` programs. They run in page
order in one shared namespace, in a temporary working directory; code blocks are
compiled with the page's path and line numbers, and a doctest failure names the page's
line, so a failure points at the line of the .rst file. Sphinx is not needed (a small
line parser extracts the blocks); if it is installed, more tests build the guide with
warnings as errors.

Numbers in printed output may differ in their last shown digit from one machine to
another (float32 sums in another order): they match within a small tolerance; all other
text matches exactly (whitespace normalized, ``...`` standing for any text).
"""

import ast
import doctest
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
              ("geon.transformers.torch.export", "TORCH_OPS")]
#: doctest's options for every page: ``...`` matches any text, and runs of whitespace
#: (a long line wrapped in the page) match any whitespace.
DOCTEST_FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
_NUMBER = re.compile(r"-?\d+\.\d+(?:e[-+]?\d+)?")


def _code_directives(path):
    """``[(lang, kind, first, end, source)]`` for every code directive of ``path``:
    ``first`` is the 1-based line of the body's first line, ``end`` the 1-based line
    after the body, ``source`` the dedented body."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        m = _DIRECTIVE.match(lines[i])
        i += 1
        if not m:
            continue
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
        found.append((m["lang"], m["kind"], first, i + 1,
                      textwrap.dedent("\n".join(body)).rstrip() + "\n"))
    return found


def code_blocks(path):
    """``[(first_line, source)]`` for each ``code-block:: python`` of ``path``.

    ``first_line`` is the 1-based line of the block's first code line; ``source`` is
    dedented. Any other code directive must name a language in :data:`SHOWN`.
    """
    blocks = []
    for lang, kind, first, _, source in _code_directives(path):
        if lang != "python":
            assert lang in SHOWN, (f"{path.name}:{first}: code sample in language {lang!r}; "
                                   f"use 'python' (run) or one of {sorted(SHOWN)} (shown "
                                   f"only)")
            continue
        assert kind == "code-block", f"{path.name}:{first}: use '.. code-block:: python'"
        blocks.append((first, source))
    return blocks


def doctest_blocks(path):
    """``[[doctest.Example]]``: the ``>>>`` examples of ``path`` outside code
    directives, one list per doctest block (consecutive examples). An example's
    ``lineno`` is its 0-based line in the page."""
    lines = path.read_text(encoding="utf-8").splitlines()
    for _, _, first, end, _ in _code_directives(path):
        lines[first - 1:end - 1] = [""] * (end - first)  # a shown session is not run
    examples = doctest.DocTestParser().get_examples("\n".join(lines) + "\n", str(path))
    groups = []
    for ex in examples:
        prev = groups[-1][-1] if groups else None
        if prev and ex.lineno == prev.lineno + prev.source.count("\n") + \
                prev.want.count("\n"):
            groups[-1].append(ex)
        else:
            groups.append([ex])
    return groups


def page_steps(path):
    """The page's code blocks and doctest blocks in page order: ``[(line, "code",
    source) or (line, "doctest", [examples])]`` (1-based lines)."""
    steps = [(line, "code", source) for line, source in code_blocks(path)]
    steps += [(g[0].lineno + 1, "doctest", g) for g in doctest_blocks(path)]
    return sorted(steps, key=lambda s: s[0])


class TolerantChecker(doctest.OutputChecker):
    """doctest's checker, then the same comparison with each decimal number of the
    expected output standing for any number within 2e-3 (relative) or 2e-4 of it."""

    def check_output(self, want, got, optionflags):
        if super().check_output(want, got, optionflags):
            return True
        wants, gots = _NUMBER.findall(want), _NUMBER.findall(got)
        if len(wants) != len(gots) or not wants:
            return False
        close = all(abs(float(w) - float(g)) <= max(2e-4, 2e-3 * abs(float(w)))
                    for w, g in zip(wants, gots))
        return close and super().check_output(_NUMBER.sub("0.0", want),
                                              _NUMBER.sub("0.0", got), optionflags)


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
    for t, s in zip(tables, saved):
        t.clear()
        t.update(s)
    # After the tables: a rule a sample registered keeps the sample's ops alive (through
    # its globals), and a length cannot change while ops built with it live.
    for a, n in lengths.items():
        a.length = n


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_samples_run(page, tmp_path, monkeypatch, isolated_globals):
    """The page's samples run in order, and each ``>>>`` example prints what the page
    shows."""
    for m in _REQUIRES.finditer(page.read_text(encoding="utf-8")):
        for mod in m["mods"].replace(",", " ").split():
            pytest.importorskip(mod, reason=f"the samples of {page.name} need {mod}")
    monkeypatch.chdir(tmp_path)  # save / restore samples write files
    namespace = {"__name__": f"geon_doc_{page.stem}"}
    runner = doctest.DocTestRunner(checker=TolerantChecker(), optionflags=DOCTEST_FLAGS)
    with warnings.catch_warnings():
        # A sample that overflows or divides by zero is a wrong sample.
        warnings.simplefilter("error", RuntimeWarning)
        for line, kind, item in page_steps(page):
            if kind == "code":
                exec(compile("\n" * (line - 1) + item, str(page), "exec"), namespace)
                continue
            test = doctest.DocTest(item, namespace, f"{page.name}:{line}", str(page), 0,
                                   None)
            test.globs = namespace  # DocTest copies the namespace: share it instead
            out = []
            failed = runner.failures
            runner.run(test, out=out.append, clear_globs=False)
            assert runner.failures == failed, "".join(out)


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
    """Every chapter has samples, and the parser sees them all: each ``code-block::
    python`` and each ``>>>`` line outside code directives."""
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        n = len(re.findall(r"^\s*\.\. code-block:: python\s*$", text, re.M))
        lines = text.splitlines()
        for _, _, first, end, _ in _code_directives(page):
            lines[first - 1:end - 1] = [""] * (end - first)
        prompts = sum(1 for t in lines if t.lstrip().startswith(">>>"))
        examples = [ex for g in doctest_blocks(page) for ex in g]
        assert len(code_blocks(page)) == n, page.name
        assert len(examples) == prompts, page.name
        assert n + prompts > 0, f"{page.name} has no samples"


def test_doctest_blocks_stand_apart():
    """A ``>>>`` block follows a blank line (else reST runs it into the paragraph above
    and does not show it as code)."""
    for page in PAGES:
        lines = page.read_text(encoding="utf-8").splitlines()
        for group in doctest_blocks(page):
            assert group[0].lineno > 0 and not lines[group[0].lineno - 1].strip(), \
                f"{page.name}:{group[0].lineno + 1}: put a blank line before '>>>'"


def test_models_page_shows_the_keras_style_calls():
    """doc/models.rst shows, with their output, the calls Keras users look for, each
    after the code blocks that set up what it uses."""
    steps = page_steps(DOC / "models.rst")
    kinds = [k for _, k, _ in steps]
    assert kinds.count("doctest") >= 4 and kinds[0] == "code"
    shown = " ".join(ex.source for _, k, g in steps if k == "doctest" for ex in g)
    for call in ("model.summary()", "history", "model.predict(", "model.fit("):
        assert call in shown, call


def test_the_training_curves_figure_is_a_small_png():
    figure = DOC / "_figures" / "digits_curves.png"
    page = (DOC / "models.rst").read_text(encoding="utf-8")
    data = figure.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    assert len(data) < 100_000
    assert f"_figures/{figure.name}" in page
    assert f"--plot doc/_figures/{figure.name}" in page  # the page says how it was made


def test_toctree_lists_every_page():
    lines = (DOC / "index.rst").read_text(encoding="utf-8").splitlines()
    start = lines.index(".. toctree::") + 1
    listed = set()
    for text in lines[start:]:
        if text.strip() and not text.startswith(" "):
            break  # the end of the directive
        if text.strip() and not text.strip().startswith(":"):
            listed.add(text.strip())
    assert listed - {"api/index"} == {p.stem for p in PAGES} - {"index"}
    assert "api/index" in listed  # the API reference (doc/api/)


# --- the API reference --------------------------------------------------------------------

#: ``(page of doc/api/, namespace it documents, extra names)``: the extra names are
#: public attributes that ``__all__`` leaves out so that ``import *`` never shadows a
#: builtin; the reference documents them too.
API_PAGES = [("geon", "geon", ("sum", "max", "min")),
             ("np", "geon.np", ("sum", "max", "min", "abs")),
             ("simple", "geon.simple", ()),
             ("neon", "geon.frontends.neon", ()),
             ("netgraph", "geon.frontends.netgraph", ()),
             ("onnx", "geon.frontends.onnx", ()),
             ("torch", "geon.transformers.torch", ()),
             ("passes", "geon.transformers.passes", ())]
_API_ENTRY = re.compile(r"^\.\.\s+(?:auto(?:function|class|exception|data)|"
                        r"py:(?:data|exception|function|class))::\s+(?P<name>\w+)\s*$", re.M)


def namespace(path):
    """The module or family namespace ``path`` names (``geon.np`` is ``be.np``)."""
    import geon
    if path in ("geon.np", "geon.simple"):
        return getattr(geon, path.split(".")[1])
    return importlib.import_module(path)


def public_names(path, extra):
    """The names the reference must document for ``path``: ``__all__`` and ``extra``."""
    if path == "geon.transformers.torch":
        pytest.importorskip("torch", reason="geon.transformers.torch needs PyTorch")
    return set(namespace(path).__all__) | set(extra)


@pytest.mark.parametrize("page,path,extra", API_PAGES, ids=[p[0] for p in API_PAGES])
def test_api_pages_list_every_public_name(page, path, extra):
    """Each page of doc/api/ documents exactly its namespace's public names (so a name
    added to ``__all__`` without a reference entry fails here, without Sphinx)."""
    text = (DOC / "api" / f"{page}.rst").read_text(encoding="utf-8")
    assert re.search(rf"^\.\. (py:)?module:: {re.escape(path)}$", text, re.M), page
    documented = [m["name"] for m in _API_ENTRY.finditer(text)]
    assert len(documented) == len(set(documented)), f"{page}: a name documented twice"
    assert set(documented) == public_names(path, extra)


def test_api_index_lists_every_page():
    text = (DOC / "api" / "index.rst").read_text(encoding="utf-8")
    listed = set(re.findall(r"^   (\w+)$", text, re.M))
    assert listed == {p[0] for p in API_PAGES} == {p.stem for p in (DOC / "api").glob("*.rst")} - {"index"}


# --- the Sphinx build (nitpicky, warnings are errors) ------------------------------------

@pytest.fixture(scope="module")
def built_html(tmp_path_factory):
    """The guide built once with ``-W -n`` (warnings, unresolved references included,
    are errors): ``(html directory, sphinx output)``."""
    if importlib.util.find_spec("sphinx") is None:
        pytest.skip("Sphinx is not installed: the docs build needs the docs extra "
                    "(pip install -e '.[docs]'); CI builds the docs in a step of its own")
    tmp = tmp_path_factory.mktemp("doc")
    run = subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-W", "-n",
                          "--keep-going", "-q", "-d", str(tmp / "doctrees"), str(DOC),
                          str(tmp / "html")], capture_output=True, text=True)
    return tmp / "html", run


def test_sphinx_build_has_no_warnings(built_html):
    html, run = built_html
    assert run.returncode == 0, run.stdout + run.stderr


def read_inventory(path):
    """``{(domain:role, name)}`` of a Sphinx ``objects.inv`` (version 2)."""
    import zlib
    data = path.read_bytes()
    header_end = 0
    for _ in range(4):  # four text lines, then the compressed body
        header_end = data.index(b"\n", header_end) + 1
    assert data.startswith(b"# Sphinx inventory version 2")
    body = zlib.decompress(data[header_end:]).decode("utf-8")
    entries = set()
    for line in body.splitlines():
        m = re.match(r"(?P<name>\S+)\s+(?P<role>\S+:\S+)\s+-?\d+\s", line)
        if m:
            entries.add((m["role"], m["name"]))
    return entries


def test_api_reference_documents_every_public_name(built_html):
    """The built index (objects.inv) has an entry for every public name of every
    namespace, under the name users write (``geon.tanh``, ``geon.np.matmul``)."""
    html, run = built_html
    assert run.returncode == 0, run.stdout + run.stderr
    names = {name for _, name in read_inventory(html / "objects.inv")}
    missing = []
    for _, path, extra in API_PAGES:
        try:
            expected = public_names(path, extra)
        except pytest.skip.Exception:
            continue
        missing += [f"{path}.{n}" for n in sorted(expected) if f"{path}.{n}" not in names]
    assert not missing, f"not in the API reference: {missing}"


#: The pictures of the guide: ``(page, figure, text the SVG must contain)``.
FIGURES = [("transformers", "readme_before", "Tanh"),
           ("transformers", "readme_after", "Gemm"),
           ("transformers", "passes", "LowerAxesPass"),
           ("transformers", "digits_memory", "bytes live")]


@pytest.mark.parametrize("page,name,needle", FIGURES, ids=[f[1] for f in FIGURES])
def test_built_html_shows_the_figures(built_html, page, name, needle):
    html, run = built_html
    assert run.returncode == 0, run.stdout + run.stderr
    src = f"_static/geon_figures/{name}.svg"
    assert f'<img src="{src}"' in (html / f"{page}.html").read_text(encoding="utf-8")
    svg = (html / src).read_text(encoding="utf-8")
    assert "<svg" in svg and needle in svg


def _figures_module():
    sys.path.insert(0, str(DOC / "_ext"))
    try:
        return importlib.import_module("geon_figures")
    finally:
        sys.path.remove(str(DOC / "_ext"))


def test_figures_fall_back_to_the_committed_svgs_without_graphviz(tmp_path, monkeypatch):
    """Without graphviz's ``dot`` the graph pictures are the committed SVGs; the memory
    plot needs nothing but geon."""
    figures = _figures_module()
    monkeypatch.setattr(figures.shutil, "which", lambda name: None)
    how = figures.make_figures(tmp_path)
    assert how == {**{n: "fallback" for n in figures.DOT_FIGURES},
                   "digits_memory": "generated"}
    for name in figures.DOT_FIGURES:
        assert (tmp_path / f"{name}.svg").read_bytes() == \
            (DOC / "_figures" / f"{name}.svg").read_bytes()
    assert "<polyline" in (tmp_path / "digits_memory.svg").read_text(encoding="utf-8")


def test_memory_figure_reads_the_plan():
    """The occupancy plotted is the plan's: it never exceeds the arenas allocated, and
    those are less than one buffer per value (the plan shares memory)."""
    figures = _figures_module()
    comp = figures.digits_step()
    live, arena_total, unshared = figures.memory_occupancy(comp)
    assert len(live) == len(comp.order) > 0
    assert 0 < max(live) <= arena_total == sum(comp.plan.sizes) < unshared


def test_committed_figures_are_small():
    for svg in (DOC / "_figures").glob("*.svg"):
        assert svg.stat().st_size < 64 * 1024, svg.name
