"""doc/models.rst shows what the user sees: its ``>>>`` examples (reST doctest blocks)
run, in page order with its ``code-block:: python`` samples in one namespace, and
print what the page says they print. tests/test_docs.py runs the code blocks alone;
this runs the page as a reader would go through it.

Numbers in printed output may differ in their last shown digit from one machine to
another (float32 sums in another order): they match within a small tolerance; all
other text matches exactly (whitespace normalized, ``...`` standing for any text)."""

import doctest
import re
from pathlib import Path


from test_docs import code_blocks, isolated_globals  # noqa: F401  (a fixture)

DOC = Path(__file__).resolve().parent.parent / "doc"
PAGE = DOC / "models.rst"
FIGURE = DOC / "_figures" / "digits_curves.png"
_NUMBER = re.compile(r"-?\d+\.\d+(?:e[-+]?\d+)?")


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


def page_steps(path):
    """The page's code blocks and doctest blocks in page order: ``[(line, "code",
    source) or (line, "doctest", [examples])]``."""
    text = path.read_text(encoding="utf-8")
    steps = [(line, "code", source) for line, source in code_blocks(path)]
    examples = doctest.DocTestParser().get_examples(text, str(path))
    groups = []
    for ex in examples:   # consecutive examples of one block run as one DocTest
        prev = groups[-1][-1] if groups else None
        if prev and ex.lineno == prev.lineno + prev.source.count("\n") + \
                prev.want.count("\n"):
            groups[-1].append(ex)
        else:
            groups.append([ex])
    steps += [(g[0].lineno + 1, "doctest", g) for g in groups]
    return sorted(steps, key=lambda s: s[0])


def test_the_page_has_doctest_blocks_after_the_samples_they_use():
    steps = page_steps(PAGE)
    kinds = [k for _, k, _ in steps]
    assert kinds.count("doctest") >= 4 and kinds[0] == "code"
    shown = " ".join(ex.source for _, k, g in steps if k == "doctest" for ex in g)
    for call in ("model.summary()", "history", "model.predict(", "model.fit("):
        assert call in shown, call


def test_models_page_shows_what_the_calls_print(tmp_path, monkeypatch, isolated_globals):
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "geon_doc_models"}
    runner = doctest.DocTestRunner(checker=TolerantChecker(), optionflags=(
        doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE))
    for line, kind, item in page_steps(PAGE):
        if kind == "code":
            exec(compile("\n" * (line - 1) + item, str(PAGE), "exec"), namespace)
            continue
        test = doctest.DocTest(item, namespace, f"models.rst:{line}", str(PAGE), 0,
                               None)
        out = []
        runner.run(test, out=out.append, clear_globs=False)
        assert runner.failures == 0, "".join(out)
    assert runner.tries >= 10


def test_the_training_curves_figure_is_a_small_png():
    data = FIGURE.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    assert len(data) < 100_000
    assert f"_figures/{FIGURE.name}" in PAGE.read_text(encoding="utf-8")
    # the page says how it was made
    assert f"--plot doc/_figures/{FIGURE.name}" in PAGE.read_text(encoding="utf-8")
