"""Pitfalls that used to fail silently or obscurely, and the errors they give now: an
axis length changed after ops were built with it, an op used where Python or NumPy
needs numbers, and a folder named ``geon`` that shadows the installed package."""

import gc
import operator
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import geon as be

ROOT = Path(__file__).resolve().parent.parent


# --- axis lengths are fixed once an op uses the axis -----------------------------------

def test_changing_a_used_axis_length_raises_naming_the_axis_and_an_op():
    C, N = be.Axis(64, "C"), be.Axis(128, "N", batch=True)
    x = be.placeholder([C, N], name="x")
    y = be.tanh(x)
    with pytest.raises(be.AxisMismatchError) as e:
        C.length = 32
    msg = str(e.value)
    assert msg.startswith("axis C: cannot change its length from 64 to 32: ")
    assert "<Placeholder 'x' (C:64, N:128) float32 @ test_pitfalls.py:" in msg
    assert "make a new axis, e.g. be.Axis(32, name='C')" in msg
    # nothing changed: the ops keep the length they were built with
    assert C.length == 64 and x.axes.shape == (64, 128) and y.axes.lengths == (64, 128)
    with pytest.raises(be.AxisMismatchError, match=r"be\.Axis\(3, name='N', batch=True\)"):
        N.length = 3
    with pytest.raises(be.AxisMismatchError, match="from 64 to None") as e:
        C.length = None
    assert "make a new axis, e.g. be.Axis(name='C')," in str(e.value)
    C.length = 64  # the same length is no change
    assert C.length == 64


def test_the_suggested_new_axis_works_beside_the_old_ops():
    C = be.Axis(4, "C")
    x = be.placeholder([C], name="x")
    with pytest.raises(be.AxisMismatchError):
        C.length = 2
    C2 = be.Axis(2, name="C")  # what the error suggests
    x2 = be.placeholder([C2], name="x2")
    t = be.make_transformer("numpy")
    assert t.computation(be.sum(x), x)(np.ones(4)) == 4
    assert t.computation(be.sum(x2), x2)(np.ones(2)) == 2
    with pytest.raises(be.AxisMismatchError):  # one name, two lengths, one expression
        x + x2


def test_an_unset_length_may_still_be_given_after_ops_use_the_axis():
    A = be.Axis(name="A_later")
    x = be.placeholder([A], name="x")
    A.length = 3  # (ops could not be computed before: nothing of theirs changes)
    assert x.axes.shape == (3,)
    with pytest.raises(be.AxisMismatchError):
        A.length = 4


def test_the_length_is_free_again_once_the_ops_are_gone():
    B = be.Axis(5, "B")
    x = be.placeholder([B])
    y = be.exp(x) * 2  # ops in reference cycles too (args and users)
    del x, y
    B.length = 6  # collected first: unreachable ops do not hold the length
    assert B.length == 6 and be.placeholder([B]).axes.shape == (6,)


def test_parts_of_a_flattened_axis_are_fixed_too():
    A, B = be.Axis(2, "A"), be.Axis(3, "B")
    flat = be.FlattenedAxis([A, be.FlattenedAxis([B])])  # parts at two depths
    op = be.placeholder([flat], name="flat")
    assert op.axes.shape == (6,)
    with pytest.raises(be.AxisMismatchError, match="'flat'"):
        A.length = 5
    with pytest.raises(be.AxisMismatchError, match="'flat'"):
        B.length = 5
    assert op.axes.shape == (6,)
    del op
    gc.collect()
    B.length = 5
    assert flat.length == 10


def test_many_ops_on_one_axis_keep_a_bounded_list_of_users():
    A = be.Axis(7, "A_many")
    x = be.placeholder([A])
    for _ in range(2000):
        be.negative(x)  # each dies at once (or at the next collection)
    gc.collect()
    for _ in range(200):
        be.negative(x)  # sweeps drop the dead ones
    refs = A._users.refs
    assert len(refs) <= 2 * max(64, sum(r() is not None for r in refs))
    del x
    gc.collect()
    A.length = 8


def test_the_readme_pattern_still_works():
    """The standard axes are set before building, as the README does."""
    import geon.frontends.base.axis as ax
    old = ax.Q.length
    try:
        ax.Q.length = 5
        q = be.placeholder([ax.Q])
        assert q.axes.shape == (5,)
        with pytest.raises(be.AxisMismatchError, match="axis Q: cannot change"):
            ax.Q.length = 6
        del q
    finally:
        ax.Q.length = old


# --- an op is symbolic: no numbers from np.asarray, float, int, ... ---------------------

@pytest.mark.parametrize("convert,what", [
    (np.asarray, "np.asarray(op)"),
    (np.array, "np.array(op)"),
    (float, "float(op)"),
    (int, "int(op)"),
    (complex, "complex(op)"),
    (operator.index, "operator.index(op)"),
    (lambda op: [1, 2, 3][op], "operator.index(op)"),
    (lambda op: np.zeros(3)[op], "np.asarray(op)"),
])
def test_ops_give_no_numbers_and_say_how_to_get_them(convert, what):
    A = be.Axis(3, "A")
    x = be.placeholder([A], name="x")
    y = be.tanh(x)
    with pytest.raises(TypeError) as e:
        convert(y)
    msg = str(e.value)
    assert what in msg and "Tanh " + y.name in msg and "test_pitfalls.py" in msg
    assert "symbolic value" in msg and "be.evaluate(op" in msg
    assert ".computation(op, x)(array)" in msg
    # and what the message says works
    assert np.allclose(be.evaluate(y, {x: np.zeros(3)}), 0)
    assert np.allclose(be.make_transformer("numpy").computation(y, x)(np.zeros(3)), 0)


def test_numpy_arithmetic_with_ops_still_builds_ops():
    A = be.Axis(3, "A")
    x = be.placeholder([A], name="x")
    for built in (np.float32(2) * x, x * np.float64(2), np.ones(3) + x, 2.0 ** x):
        assert isinstance(built, be.TensorOp)
    with pytest.raises(be.TruthValueError):  # and `if op:` still says why not
        bool(x > 0)


# --- a folder named geon that shadows the installed package -----------------------------

def _run(script, cwd, *, env=None):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=cwd,
                          capture_output=True, text=True, timeout=120, env=env)


def _env_without_checkout_on_path():
    """The environment of a user's script: the checkout is not on sys.path by way of
    PYTHONPATH (an installed geon is found as it is installed)."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    return env


_SCRIPT = """
import geon as be
import geon.frontends.base.axis as ax      # the README's imports
x = be.placeholder([be.Axis(3, "A")])
print("OK", be.__file__)
"""


def _geon_seen_from(cwd):
    probe = _run("import geon, sys; print(getattr(geon, '__file__', None))", cwd,
                 env=_env_without_checkout_on_path())
    if probe.returncode != 0 or probe.stdout.strip() == "None":
        return None  # a namespace package (or nothing): the pitfall
    return probe.stdout.strip()


def test_an_empty_geon_folder_beside_the_script_gives_a_clear_error(tmp_path):
    (tmp_path / "geon").mkdir()
    found = _geon_seen_from(tmp_path)
    if found is not None:
        # A regular (non-editable) install wins over a namespace portion: no pitfall here.
        assert found.startswith(str(Path(be.__file__).parent.parent)) or "site-packages" in found
        run = _run(_SCRIPT, tmp_path, env=_env_without_checkout_on_path())
        assert run.returncode == 0 and run.stdout.startswith("OK"), run.stderr
        pytest.skip("geon is installed so that a folder named geon does not shadow it "
                    "(not editable); the script runs")
    run = _run(_SCRIPT, tmp_path, env=_env_without_checkout_on_path())
    assert run.returncode == 1
    last = run.stderr.strip().splitlines()[-1]
    assert "NoneType" not in run.stderr
    assert last.startswith("ImportError: `import geon` found the folder "
                           f"{tmp_path / 'geon'}, which has no __init__.py"), last
    assert "namespace package" in last and "rename or move that folder" in last
    assert str(Path(be.__file__).parent) in last  # where the real one is


def test_the_same_folder_through_a_namespace_package_made_by_hand(tmp_path):
    """Deterministic whatever the install: geon resolved to a namespace package whose
    path also reaches the real submodules (what an editable install's finder does)."""
    (tmp_path / "geon").mkdir()
    script = f"""
    import importlib.machinery, importlib.util, sys
    spec = importlib.machinery.ModuleSpec("geon", None, is_package=True)
    spec.submodule_search_locations = [{str(tmp_path / 'geon')!r},
                                       {str(Path(be.__file__).parent)!r}]
    sys.modules["geon"] = importlib.util.module_from_spec(spec)
    import geon.frontends.neon
    """
    run = _run(script, tmp_path)
    assert run.returncode == 1 and "NoneType" not in run.stderr, run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: `import geon` found the folder "), last
    assert "namespace package" in last


def test_another_package_named_geon_gives_a_clear_error(tmp_path):
    (tmp_path / "geon").mkdir()
    (tmp_path / "geon" / "__init__.py").write_text("mine = True\n")
    script = f"""
    import sys
    import geon                      # the folder beside the script
    assert geon.mine
    # the real submodules, reached as an editable install's finder reaches them
    geon.__path__.append({str(Path(be.__file__).parent)!r})
    import geon.op_graph.op_graph
    """
    run = _run(script, tmp_path)
    assert run.returncode == 1, run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: `import geon` found another package, "
                           f"{tmp_path / 'geon' / '__init__.py'}"), last


def test_geon_imports_cleanly_from_its_own_checkout():
    run = _run("import geon.frontends.base.axis, geon as be; print(be.placeholder)", ROOT)
    assert run.returncode == 0, run.stderr
