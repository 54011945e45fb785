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

Samples show what the user sees rather than check it out of sight: an ``assert`` or
``AssertionError`` in a sample fails the suite, except in a code block that is a test
file a reader would write (``:caption: tests/test_x.py``). Other tests check the
theme's style sheet and that the memory figure's labels are clear of its lines.
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

#: A page whose samples need an optional package says so in a comment line,
#: ``.. geon-doc-requires: torch``: the samples after that line need it. Without the
#: package they are skipped (the page's earlier samples still run), so a page that
#: needs it throughout puts the line before its first sample.
_REQUIRES = re.compile(r"^\.\.\s+geon-doc-requires:\s*(?P<mods>.+?)\s*$", re.M)
_DIRECTIVE = re.compile(r"^(?P<indent>\s*)\.\.\s+(?P<kind>code-block|code|sourcecode)::"
                        r"\s*(?P<lang>\S*)\s*$")
#: Languages of samples that are shown, not run.
SHOWN = {"text", "console", "toml", "ini", "none"}
#: Process-wide tables that samples extend (a plugin's op, rules, transformer).
REGISTRIES = [("geon.registry", "_REGISTRY"),
              ("geon.transformers.numpy.transformer", "NUMPY_CODE"),
              ("geon.transformers.gpu.cuda", "CUDA_CODE"),
              ("geon.transformers.numpy.c_rules", "C_RULES"),
              ("geon.transformers.c_expressions", "C_EXPRESSIONS"),
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
    """``[(lang, kind, first, end, source, options)]`` for every code directive of
    ``path``: ``first`` is the 1-based line of the body's first line, ``end`` the
    1-based line after the body, ``source`` the dedented body, ``options`` the
    directive's options (``{"caption": "tests/test_softplus.py"}``)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        m = _DIRECTIVE.match(lines[i])
        i += 1
        if not m:
            continue
        indent = len(m["indent"])
        # Options (":caption: ...") come first, then a blank line, then the body.
        options = {}
        while i < len(lines) and lines[i].strip().startswith(":"):
            name, _, value = lines[i].strip()[1:].partition(":")
            options[name.strip()] = value.strip()
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
                      textwrap.dedent("\n".join(body)).rstrip() + "\n", options))
    return found


def code_blocks(path):
    """``[(first_line, source)]`` for each ``code-block:: python`` of ``path``.

    ``first_line`` is the 1-based line of the block's first code line; ``source`` is
    dedented. Any other code directive must name a language in :data:`SHOWN`.
    """
    blocks = []
    for lang, kind, first, _, source, _ in _code_directives(path):
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
    for _, _, first, end, _, _ in _code_directives(path):
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


def missing_requirement(path):
    """``(line, module)`` of the first ``geon-doc-requires`` line of ``path`` that names
    a module this Python cannot import, or ``None``."""
    text = path.read_text(encoding="utf-8")
    for m in _REQUIRES.finditer(text):
        for mod in m["mods"].replace(",", " ").split():
            try:
                importlib.import_module(mod)
            except ImportError:
                return text.count("\n", 0, m.start()) + 1, mod
    return None


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
    missing = missing_requirement(page)
    monkeypatch.chdir(tmp_path)  # save / restore samples write files
    namespace = {"__name__": f"geon_doc_{page.stem}"}
    runner = doctest.DocTestRunner(checker=TolerantChecker(), optionflags=DOCTEST_FLAGS)
    with warnings.catch_warnings():
        # A sample that overflows or divides by zero is a wrong sample.
        warnings.simplefilter("error", RuntimeWarning)
        for line, kind, item in page_steps(page):
            if missing and line > missing[0]:
                pytest.skip(f"the samples of {page.name} after line {missing[0]} need "
                            f"{missing[1]}, which is not installed (those before ran)")
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


def test_requirements_apply_from_their_line(tmp_path):
    """``.. geon-doc-requires: MOD`` names the first line whose samples need MOD; a
    module that imports needs nothing."""
    page = tmp_path / "page.rst"
    page.write_text("T\n=\n\n>>> 1\n1\n\n.. geon-doc-requires: numpy\n\n"
                    ".. geon-doc-requires: geon_no_such_module, numpy\n\n>>> 2\n2\n",
                    encoding="utf-8")
    assert missing_requirement(page) == (9, "geon_no_such_module")
    page.write_text("T\n=\n\n.. geon-doc-requires: numpy\n\n>>> 1\n1\n",
                    encoding="utf-8")
    assert missing_requirement(page) is None


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


#: Pages whose samples still check with ``assert`` (or raise ``AssertionError``) instead
#: of showing what the user sees: being converted to ``>>>`` examples. Remove a page
#: once it passes :func:`test_samples_show_outputs_instead_of_asserting`.
ASSERTS_PENDING: set[str] = set()
#: A code block may assert when it shows a test that a reader would write: its
#: ``:caption:`` names a test file (``tests/test_softplus.py``).
_TEST_FILE_CAPTION = re.compile(r"(^|/)test_\w*\.py$")


def _assertions(source):
    """``[(line, what)]``: the ``assert`` statements and the uses of ``AssertionError``
    in the Python ``source`` (1-based lines)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assert):
            found.append((node.lineno, "assert"))
        elif isinstance(node, ast.Name) and node.id == "AssertionError":
            found.append((node.lineno, "AssertionError"))
    return found


def sample_assertions(path):
    """``["page:line: what"]`` for every ``assert`` and ``AssertionError`` in the runnable
    samples of ``path`` (its ``code-block:: python`` bodies and ``>>>`` examples),
    except in code blocks captioned with a test file's name."""
    found = []
    for lang, _, first, _, source, options in _code_directives(path):
        if lang == "python" and not _TEST_FILE_CAPTION.search(options.get("caption", "")):
            found += [(first + line - 1, what) for line, what in _assertions(source)]
    for group in doctest_blocks(path):
        for ex in group:
            found += [(ex.lineno + line, what) for line, what in _assertions(ex.source)]
    return [f"{path.name}:{line}: {what}" for line, what in sorted(found)]


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_samples_show_outputs_instead_of_asserting(page):
    """A sample shows what the user sees: a value as a ``>>>`` example with its output,
    an error as the traceback's last line, not an ``assert`` (or ``try`` / ``except``
    / ``raise AssertionError``) that the reader cannot see pass. A code block that is a
    test file (``:caption: tests/test_x.py``) may assert."""
    if page.name in ASSERTS_PENDING:
        pytest.skip(f"{page.name} is still being converted (ASSERTS_PENDING)")
    found = sample_assertions(page)
    assert not found, ("show the value or the error as a >>> example instead of: "
                       + "; ".join(found))


def test_assertion_finder_sees_asserts_and_allows_test_files(tmp_path):
    page = tmp_path / "page.rst"
    page.write_text(textwrap.dedent("""\
        Title
        =====

        .. code-block:: python

           x = 1
           assert x == 1

        .. code-block:: python
           :caption: tests/test_x.py

           def test_x():
               assert x == 1

        >>> try:
        ...     pass
        ... except ValueError:
        ...     pass
        ... else:
        ...     raise AssertionError("no error")
        """), encoding="utf-8")
    assert sample_assertions(page) == ["page.rst:7: assert",
                                       "page.rst:20: AssertionError"]
    assert ASSERTS_PENDING <= {p.name for p in PAGES}   # no stale names


def test_parser_finds_samples():
    """Every chapter has samples, and the parser sees them all: each ``code-block::
    python`` and each ``>>>`` line outside code directives."""
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        n = len(re.findall(r"^\s*\.\. code-block:: python\s*$", text, re.M))
        lines = text.splitlines()
        for _, _, first, end, _, _ in _code_directives(page):
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


def test_coming_from_page_runs_each_idiom():
    """doc/coming_from.rst shows, with their output, geon's counterparts of the Keras,
    PyTorch and JAX idioms it maps."""
    steps = page_steps(DOC / "coming_from.rst")
    shown = " ".join(ex.source for _, k, g in steps if k == "doctest" for ex in g)
    for call in ("model.fit(", "validation_split=", "model.summary()", "model.evaluate(",
                 "model.predict(", "history", "model.weights()", "model.save(",
                 ".restore(", "be.deriv(", "t.computation(", "be.SetItem(",
                 "be.jacobian(", "be.hvp(", "be.dot(", "reduction_axes=", "to_torch("):
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


# --- the theme ------------------------------------------------------------------------------

def conf_settings():
    """The literal assignments of doc/conf.py (read, not run)."""
    settings = {}
    for node in ast.parse((DOC / "conf.py").read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and \
                isinstance(node.targets[0], ast.Name):
            try:
                settings[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass  # not a literal (a computed value)
    return settings


def css_rules(text):
    """``[(selectors, {property: value})]`` of a style sheet without nesting."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    rules = []
    for selectors, body in re.findall(r"([^{}]+)\{([^{}]*)\}", text):
        props = dict((k.strip(), v.strip()) for k, _, v in
                     (d.partition(":") for d in body.split(";") if ":" in d))
        rules.append(([sel.strip() for sel in selectors.split(",")], props))
    return rules


def _px(value):
    m = re.fullmatch(r"(\d+)px", str(value))
    assert m, f"{value!r}: give theme widths in px"
    return int(m[1])


def test_conf_wires_the_style_sheet_and_its_rules():
    """doc/conf.py loads doc/_static/geon.css, which makes code blocks wrap instead of
    scrolling sideways and lets long names in the sidebar wrap; the theme's page fits a
    window 1,200 px wide with a sidebar wide enough for geon.transformers.passes."""
    conf = conf_settings()
    assert "_static" in conf["html_static_path"]
    assert "geon.css" in conf["html_css_files"]
    css = DOC / "_static" / "geon.css"
    rules = css_rules(css.read_text(encoding="utf-8"))

    def props(selector):
        return {k: v for sels, p in rules if selector in sels for k, v in p.items()}

    for code in ("pre", "div.highlight pre"):       # code blocks and doctest blocks
        assert props(code).get("white-space") == "pre-wrap", code
        assert props(code).get("overflow-wrap") in ("anywhere", "break-word"), code
    assert props("div.sphinxsidebar").get("overflow-wrap") in ("anywhere", "break-word")
    options = conf["html_theme_options"]
    page, sidebar = _px(options["page_width"]), _px(options["sidebar_width"])
    assert page <= 1200 - 20        # a 1,200 px window, less its scroll bar
    # The API page "Passes: geon.transformers.passes" is a second-level entry of the
    # sidebar: alabaster draws it at 110% of 14 px, a monospace character 0.6 em wide,
    # indented 20 px, inside the sidebar's 2 x 10 px padding. The name fits whole:
    assert sidebar >= len("geon.transformers.passes") * 0.6 * 14 * 1.1 + 20 + 2 * 10


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
             ("passes", "geon.transformers.passes", ()),
             ("backends", "geon.transformers.backends", ()),
             ("native", "geon.transformers.native", ()),
             ("native_export", "geon.transformers.native.export", ())]
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


def _svg_text_boxes(svg):
    """``[(text, (x0, y0, x1, y1))]``: the box each ``<text>`` of ``svg`` covers,
    estimated generously (0.62 em a character, the font's ascent and descent)."""
    import xml.etree.ElementTree as ET
    root = ET.fromstring(svg)
    size0 = float(root.get("font-size", 11))
    boxes = []
    for el in root.iter("{http://www.w3.org/2000/svg}text"):
        text, size = el.text or "", float(el.get("font-size", size0))
        x, y = float(el.get("x")), float(el.get("y"))
        width = len(text) * size * 0.62
        x0 = {"end": x - width, "middle": x - width / 2}.get(el.get("text-anchor"), x)
        boxes.append((text, (x0, y - 0.8 * size, x0 + width, y + 0.25 * size)))
    return boxes


def _svg_segments(svg):
    """Every straight segment that ``svg`` draws: its ``<line>`` elements and the
    pieces of its ``<polyline>`` elements, as ``(x1, y1, x2, y2)``."""
    import xml.etree.ElementTree as ET
    ns = "{http://www.w3.org/2000/svg}"
    root = ET.fromstring(svg)
    segments = [tuple(float(el.get(k)) for k in ("x1", "y1", "x2", "y2"))
                for el in root.iter(ns + "line")]
    for el in root.iter(ns + "polyline"):
        pts = [tuple(map(float, p.split(","))) for p in el.get("points").split()]
        segments += [a + b for a, b in zip(pts, pts[1:])]
    return segments


def _crosses(box, seg):
    """Whether the segment ``seg`` (horizontal or vertical, as the plots draw them)
    passes through the box."""
    x0, y0, x1, y1 = box
    sx0, sx1 = sorted((seg[0], seg[2]))
    sy0, sy1 = sorted((seg[1], seg[3]))
    return sx0 <= x1 and sx1 >= x0 and sy0 <= y1 and sy1 >= y0


@pytest.mark.parametrize("case", ["digits", "flat", "peak_at_end", "empty"])
def test_memory_figure_labels_are_clear_of_the_lines(case):
    """No text of the memory figure (the legend's labels, the axis labels, the title)
    lies on a line it draws: the plotted occupancy, the two reference lines or the
    legend's samples of them."""
    figures = _figures_module()
    if case == "digits":
        live, arena_total, unshared = figures.memory_occupancy(figures.digits_step())
    else:
        live = {"flat": [3000] * 40, "peak_at_end": [10] * 30 + [9000, 9000],
                "empty": []}[case]
        arena_total, unshared = max(live, default=0), 2 * max(live, default=1)
    svg = figures.memory_svg(live, arena_total, unshared, "a memory plan")
    boxes, segments = _svg_text_boxes(svg), _svg_segments(svg)
    texts = [t for t, _ in boxes]
    assert any(t.startswith("bytes live in arenas") for t in texts)
    assert any(t.startswith("arenas allocated") for t in texts)
    assert any(t.startswith("one buffer per value") for t in texts)
    assert len(segments) > 2 * len(live)
    clashes = [(t, seg) for t, box in boxes for seg in segments if _crosses(box, seg)]
    assert not clashes
    width = float(re.search(r'width="([\d.]+)"', svg)[1])
    assert all(0 <= box[0] and box[2] <= width for _, box in boxes)   # inside the picture


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
