"""Packaging: the distribution is geon-graph (import geon), with one version source, and
the example plugin installs into a fresh environment without pulling in anything but
itself.

The wheel is built from a copy of the checkout with ``pip wheel --no-deps
--no-build-isolation`` (the running interpreter's setuptools; nothing is downloaded).
The plugin test makes a fresh virtual environment without pip and drives it with this
interpreter's pip (``pip --python``): geon-graph from that wheel, then numpy and
setuptools as pip finds them (its configured index), then ``pip install
./examples/plugin`` with ``--no-index``: whatever the plugin needed beyond what is
installed would make that fail, and its report and ``pip freeze`` must show the plugin
alone.
"""

import email.parser
import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import geon

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = None

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = ROOT / "examples" / "plugin"
DIST = "geon-graph"

_NOT_SOURCE = shutil.ignore_patterns(".git", ".venv", "venv", "build", "dist", "*.egg-info",
                                     "__pycache__", ".pytest_cache", ".hypothesis",
                                     "_build", "*.npz.tmp")


def _pip(*args, python=None, timeout=120):
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    if python is not None:
        cmd += ["--python", str(python)]
    return subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=timeout)


def _pip_version():
    from importlib import metadata
    try:
        return tuple(int(p) for p in re.findall(r"\d+", metadata.version("pip"))[:2])
    except metadata.PackageNotFoundError:
        return None


def setuptools_77():
    """Whether setuptools >= 77 (what pyproject.toml's build-system requires) is here."""
    from importlib import metadata
    try:
        version = metadata.version("setuptools")
    except metadata.PackageNotFoundError:
        return False
    return tuple(int(p) for p in re.findall(r"\d+", version)[:1]) >= (77,)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """A wheel of the checkout (built from a copy: the build leaves nothing behind)."""
    if not setuptools_77():
        pytest.skip("building the wheel without downloading needs setuptools >= 77 (the "
                    "build backend pyproject.toml names) installed here")
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=_NOT_SOURCE)
    run = _pip("wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
               "-w", str(tmp / "out"), str(src))
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    (path,) = (tmp / "out").glob("*.whl")
    return path


def _metadata(wheel_path):
    with zipfile.ZipFile(wheel_path) as z:
        (name,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        return email.parser.Parser().parsestr(z.read(name).decode("utf-8")), z.namelist()


def test_the_wheel_is_geon_graph_and_imports_as_geon(wheel):
    meta, names = _metadata(wheel)
    assert meta["Name"] == DIST
    assert meta["Version"] == geon.__version__           # one version source
    assert wheel.name == f"geon_graph-{geon.__version__}-py3-none-any.whl"
    assert "geon/__init__.py" in names and "geon/frontends/neon/datasets/digits.npz" in names
    assert "geon/py.typed" in names                     # PEP 561: the type hints ship
    requires = meta.get_all("Requires-Dist")
    assert requires[0] == "numpy>=1.24"
    extras = set(meta.get_all("Provides-Extra"))
    assert {"test", "gpu", "mpi", "docs", "onnx", "torch", "examples", "plot"} <= extras
    # The test extra is pytest and hypothesis only: Sphinx comes with [docs].
    test_extra = sorted(r.split(";")[0] for r in requires if 'extra == "test"' in r)
    assert test_extra == ["hypothesis>=6", "pytest>=7"]
    # Plots of training curves need matplotlib, which only the plot extra brings.
    assert [r.split(";")[0] for r in requires if 'extra == "plot"' in r] == ["matplotlib"]
    assert not any(r.startswith("matplotlib") and "extra ==" not in r for r in requires)
    with zipfile.ZipFile(wheel) as z:
        (ep,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        entry_points = z.read(ep).decode()
    assert "numpy = geon.transformers.numpy:NumPyTransformer" in entry_points
    assert "gpu = geon.transformers.gpu:GPUTransformer" in entry_points


def _toml(path):
    if tomllib is None:
        pytest.skip("reading pyproject.toml needs Python >= 3.11 (tomllib)")
    return tomllib.loads(path.read_text(encoding="utf-8"))


def _setup_py_calls():
    """The arguments (as source text) of each call in setup.py, and nothing else there
    but imports, the docstring and those calls."""
    import ast
    tree = ast.parse((ROOT / "setup.py").read_text(encoding="utf-8"))
    calls = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            assert node.module == "setuptools" and [a.name for a in node.names] == ["setup"]
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            call = node.value
            assert isinstance(call.func, ast.Name) and call.func.id == "setup"
            calls.append([ast.unparse(a) for a in [*call.args, *call.keywords]])
        else:
            raise AssertionError(f"setup.py holds more than a shim: "
                                 f"{ast.unparse(node)[:200]}")
    return calls


def test_one_version_source():
    project = _toml(ROOT / "pyproject.toml")
    assert project["project"]["name"] == DIST
    assert "version" not in project["project"]
    assert project["project"]["dynamic"] == ["version"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "geon.__version__"}
    assert not (ROOT / "setup.cfg").exists()
    # setup.py is a shim (the design card's layout; some tools look for it): it calls
    # setup() with no arguments, so that the metadata has pyproject.toml as its one source.
    assert _setup_py_calls() == [[]], "setup.py must call setup() once, with no arguments"
    shim = (ROOT / "setup.py").read_text(encoding="utf-8")
    assert geon.__version__ not in shim and DIST not in shim
    # The changelog has an entry for the current version.
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert re.search(rf"^## \[?{re.escape(geon.__version__)}\]?", changelog, re.M)


def test_the_plugin_depends_on_geon_graph_and_its_docs_name_its_entry_point():
    project = _toml(PLUGIN / "pyproject.toml")
    assert project["project"]["dependencies"] == [DIST]
    (name, target), = project["project"]["entry-points"]["geon.transformers"].items()
    readme = (PLUGIN / "README.md").read_text(encoding="utf-8")
    assert f"make_transformer('{name}')" in readme and f"`{name}`" in readme
    for page in ("plugins.rst", "writing_a_transformer.rst"):
        guide = (ROOT / "doc" / page).read_text(encoding="utf-8")
        assert f'{name} = "{target}"' in guide, page


def test_plugin_installs_into_a_fresh_venv_pulling_in_nothing_else(wheel, tmp_path):
    if _pip_version() is None or _pip_version() < (22, 3):
        pytest.skip("needs pip >= 22.3 in the running environment (for pip --python)")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")
    run = _pip("install", "-q", "--no-deps", "--no-index", str(wheel), python=python)
    assert run.returncode == 0, run.stderr
    # geon-graph's one dependency, and the plugin's build backend (setuptools, for the
    # offline build below).
    run = _pip("install", "-q", "numpy>=1.24", "setuptools>=77", python=python, timeout=300)
    if run.returncode != 0:
        pytest.skip(f"pip could not install numpy and setuptools into a fresh venv "
                    f"(no reachable package index?): {run.stderr.strip()[-500:]}")

    def freeze():
        run = _pip("freeze", "--all", python=python)
        assert run.returncode == 0, run.stderr
        return {re.split(r"[=@ ]", line, maxsplit=1)[0].lower()
                for line in run.stdout.splitlines() if line.strip()}

    before = freeze()
    assert DIST in before and "geon-axpy" not in before
    src = tmp_path / "plugin"       # a copy: the build writes build/ and *.egg-info
    shutil.copytree(PLUGIN, src, ignore=_NOT_SOURCE)
    report = tmp_path / "report.json"
    run = _pip("install", "--no-index", "--no-build-isolation", "--report", str(report),
               str(src), python=python)
    assert run.returncode == 0, run.stdout + run.stderr
    installed = [i["metadata"]["name"] for i in json.loads(report.read_text())["install"]]
    assert installed == ["geon-axpy"]
    assert freeze() - before == {"geon-axpy"}
    # The plugin README's command, with the output the README shows: geon finds the
    # plugin through its entry point.
    run = subprocess.run([str(python), "-c", "import geon as be; "
                          "print(be.make_transformer('geon-axpy'))"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout == "<AxpyTransformer 'geon-axpy': 0 computations>\n"
    readme = (PLUGIN / "README.md").read_text(encoding="utf-8")
    assert "python -c \"import geon as be; print(be.make_transformer('geon-axpy'))\"\n# " \
        + run.stdout in readme


# What the docs say about the package index, and the release path CI checks. geon-graph
# is not on the index yet (DEVELOPERS.md, "Releasing"): a user's first command must not
# be a `pip install geon-graph` that finds nothing. When a release is uploaded, the
# README's Install section and this test change together.
_INDEX_CLAIM = re.compile(r"pip install\s+['\"]?geon-graph\b|geon-graph\[|published as|"
                          r"\bis published\b|from the package index")


def _user_facing_texts():
    yield ROOT / "README.md"  # (DEVELOPERS.md says what to change after a release)
    yield from sorted((ROOT / "doc").glob("*.rst"))
    yield from sorted((ROOT / "geon").rglob("*.py"))  # error messages and docstrings
    yield PLUGIN / "README.md"
    yield PLUGIN / "pyproject.toml"


def test_no_text_claims_geon_graph_is_on_the_package_index():
    claims = []
    for path in _user_facing_texts():
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if _INDEX_CLAIM.search(line):
                claims.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not claims, "geon-graph is not on the package index yet:\n" + "\n".join(claims)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    install = readme[readme.index("## Install"):]
    assert "is not on the package index yet" in install.split("\n\n")[1]
    assert "pip install -e ." in install and "python -m build" in install
    # The wheel the README names is the one `python -m build` makes of this version.
    shown = re.findall(r"geon_graph-([^-\s\"]+)-py3-none-any\.whl", readme)
    assert shown and set(shown) == {geon.__version__}


def test_the_release_path_is_documented_and_ci_runs_all_of_it_but_the_upload():
    dev = (ROOT / "DEVELOPERS.md").read_text(encoding="utf-8")
    start = dev.index("\n## Releasing\n")
    section = dev[start:dev.index("\n## ", start + 1)]
    for command in ("python -m build", "twine check --strict dist/*", "twine upload dist/*"):
        assert command in section, command
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    release = ci[ci.index("# The release path"):]
    for step in ("python -m build", "twine check --strict", "python -m venv",
                 "geon_graph-*.whl", "-m geon.examples.digits"):
        assert step in release, step
    assert "twine upload" not in ci  # CI never publishes
    # The main job runs from a folder of its own, not from the checkout.
    assert re.search(r'cd "\$release/run"\n(.*\n)*?.*-m geon\.examples\.digits', release)
    # The test extra is installed as the README says, and matplotlib (the plot extra) too.
    assert 'pip install -e ".[test]" && python -m pytest -q' in ci
    assert re.search(r"^pip install .*\bmatplotlib\b", ci, re.M)
