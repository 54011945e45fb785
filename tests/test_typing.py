"""The types the public API gives a type checker: ``make_transformer``'s class per name,
``deriv`` for one variable and for several, and what a computation's call returns.

mypy checks a small user script (``--strict``, as a careful user would) and its
``reveal_type`` notes are compared with what each call should give. Skipped where mypy
is not installed (CI installs it: .ci/run).
"""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

ARRAY = "numpy.ndarray[Any, numpy.dtype[Any]]"
NUMPY_TRANSFORMER = "geon.transformers.numpy.transformer.NumPyTransformer"

#: The script's prologue: what the lines checked below use.
PROLOGUE = """\
import numpy as np
import geon as be

C = be.Axis(4, name="C")
x = be.placeholder([C])
w = be.Variable(be.Axes(C), initial_value=0.5)
v = be.Variable(be.Axes(C), initial_value=0.25)
c: be.TensorOp = be.sum(be.multiply(x, w), out_axes=())
update = be.SetItem(v, x)
name: str = "numpy"
t = be.make_transformer("numpy")
# public attributes that __all__ leaves out (explicit exports for a type checker)
families = (be.np.sum, be.simple, be.sum, be.max, be.min)
"""

#: ``(expression, the type mypy reveals for it)``.
REVEALED = [
    ('be.make_transformer("numpy")', NUMPY_TRANSFORMER),
    ("be.make_transformer()", NUMPY_TRANSFORMER),
    ('be.make_transformer("numpy", check_numerics=True, compiled=False)',
     NUMPY_TRANSFORMER),
    ('be.make_transformer("gpu", device=0, gemm="generated")',
     "geon.transformers.gpu.transformer.GPUTransformer"),
    ("be.make_transformer(name)", "geon.transformers.base.Transformer"),
    ("be.deriv(c, w)", "geon.op_graph.core.TensorOp"),
    ("be.deriv(c, [w, v])", "list[geon.op_graph.core.TensorOp]"),
    ("be.deriv(c, (w, v))", "list[geon.op_graph.core.TensorOp]"),
    ("be.deriv(c, c.variables())", "list[geon.op_graph.core.TensorOp]"),
    ("t.computation(c, x)", f"geon.transformers.base.Computation[{ARRAY}]"),
    ("t.computation(c, x)(np.ones(4))", ARRAY),
    ("t.computation(c, x)([1.0, 2.0, 3.0, 4.0])", ARRAY),
    ("t.computation([c, w], x)(np.ones(4))", f"tuple[{ARRAY}, ...]"),
    ("t.computation((c,), x)(np.ones(4))", f"tuple[{ARRAY}, ...]"),
    ("t.computation(update, x)(np.ones(4))", "None"),
    ("t.computation([c, update], x)(np.ones(4))", f"tuple[{ARRAY} | None, ...]"),
    ("t.computation(c)", f"geon.transformers.base.Computation[{ARRAY}]"),
]

#: Lines mypy must reject, with a part of its message.
REJECTED = [
    ("one: be.TensorOp = be.deriv(c, [w])", "Incompatible types in assignment"),
    ("several: list[be.TensorOp] = be.deriv(c, w)", "Incompatible types in assignment"),
    ('be.deriv(c, "w")', "No overload variant"),
    ("be.deriv(c, {w, v})", "No overload variant"),
    ("array: np.ndarray = t.computation([c], x)(np.ones(4))",
     "Incompatible types in assignment"),
    ("t.computation(c, c)", "No overload variant"),
]


def _run_mypy(tmp_path, lines):
    script = tmp_path / "user_script.py"
    script.write_text(PROLOGUE + "\n".join(lines) + "\n", encoding="utf-8")
    first = PROLOGUE.count("\n") + 1
    # The project's configuration (it says where geon is and how to follow it), with
    # --strict on top; a cache of this test's own, so that the project's is left alone.
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-error-summary",
         "--cache-dir", str(tmp_path / "mypy_cache"), "--config-file",
         str(ROOT / "pyproject.toml"), str(script)],
        cwd=ROOT, capture_output=True, text=True)
    by_line: dict[int, list[str]] = {}
    for out in run.stdout.splitlines():
        prefix = f"{script}:"
        if out.startswith(prefix):
            number, _, message = out[len(prefix):].partition(":")
            by_line.setdefault(int(number) - first + 1, []).append(message.strip())
    return run, by_line


@pytest.fixture(scope="module")
def mypy_results(tmp_path_factory):
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed (CI installs it: .ci/run)")
    tmp_path = tmp_path_factory.mktemp("typing")
    lines = [f"reveal_type({expr})" for expr, _ in REVEALED]
    lines += [code for code, _ in REJECTED]
    return _run_mypy(tmp_path, lines)


@pytest.mark.parametrize("k", range(len(REVEALED)), ids=[e for e, _ in REVEALED])
def test_revealed_type(mypy_results, k):
    run, by_line = mypy_results
    expr, expected = REVEALED[k]
    messages = by_line.get(k + 1, [])
    notes = [m.replace("builtins.", "") for m in messages if m.startswith("note:")]
    assert notes == [f'note: Revealed type is "{expected}"'], (
        f"{expr}: {messages}\n{run.stdout}{run.stderr}")


@pytest.mark.parametrize("k", range(len(REJECTED)), ids=[c for c, _ in REJECTED])
def test_rejected(mypy_results, k):
    run, by_line = mypy_results
    code, expected = REJECTED[k]
    messages = by_line.get(len(REVEALED) + k + 1, [])
    assert any(m.startswith("error:") and expected in m for m in messages), (
        f"{code}: {messages}\n{run.stdout}{run.stderr}")


def test_nothing_else_is_reported(mypy_results):
    """The prologue (typical code of a user: placeholders, variables, a transformer)
    passes --strict, and the lines checked give no other error."""
    run, by_line = mypy_results
    rejected = {len(REVEALED) + k + 1 for k in range(len(REJECTED))}
    other = {n: m for n, m in by_line.items()
             if n not in rejected and any(not s.startswith("note:") for s in m)}
    assert not other, f"{other}\n{run.stdout}{run.stderr}"
    assert not run.stderr.strip(), run.stderr

