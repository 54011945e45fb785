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
    assert "geon/__init__.py" in names and "geon/examples/data/digits.npz" in names
    assert "geon/py.typed" in names                     # PEP 561: the type hints ship
    requires = meta.get_all("Requires-Dist")
    assert requires[0] == "numpy>=1.24"
    extras = set(meta.get_all("Provides-Extra"))
    assert {"test", "gpu", "mpi", "docs", "onnx", "torch", "examples"} <= extras
    # The test extra is pytest and hypothesis only: Sphinx comes with [docs].
    test_extra = sorted(r.split(";")[0] for r in requires if 'extra == "test"' in r)
    assert test_extra == ["hypothesis>=6", "pytest>=7"]
    with zipfile.ZipFile(wheel) as z:
        (ep,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        entry_points = z.read(ep).decode()
    assert "numpy = geon.transformers.numpy:NumPyTransformer" in entry_points
    assert "gpu = geon.transformers.gpu:GPUTransformer" in entry_points


def _toml(path):
    if tomllib is None:
        pytest.skip("reading pyproject.toml needs Python >= 3.11 (tomllib)")
    return tomllib.loads(path.read_text(encoding="utf-8"))


def test_one_version_source():
    project = _toml(ROOT / "pyproject.toml")
    assert project["project"]["name"] == DIST
    assert "version" not in project["project"]
    assert project["project"]["dynamic"] == ["version"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "geon.__version__"}
    assert not (ROOT / "setup.py").exists() and not (ROOT / "setup.cfg").exists()
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
