"""Adding an op: one declaration in one new file, one entry per backend code file.

tests/new_ops.py declares ``Softsign`` (one tensor) and ``LeCunTanh`` (two parameters)
as a new op module of geon would. The fixture below makes the one entry per backend
that each op needs: NumPy code, the C expression that the compiled CPU path and the
CUDA code share, and the torch export's rule. Nothing else is registered anywhere, and
the tests show that CSE, printing, cloning, JSON, ``be.evaluate``, both derivative
modes, the NumPy code, the C path, the CUDA code (on the emulator, and through
``nvcc -ptx`` where nvcc is installed) and the torch export all work.
"""

import importlib
import shutil
import subprocess

import numpy as np
import pytest

import geon as be
from geon.op_graph import tables
from geon.op_graph.params import clone_graph
from geon.transformers.base import STANDARD_BASE_SET
from geon.transformers.c_expressions import C_EXPRESSIONS, math_name
from geon.transformers.numpy.code_table import NUMPY_CODE
from geon.transformers.passes.cse import cse_key
from gradcheck import assert_gradcheck

A = be.Axis(9, "NewOpA")
X = np.linspace(-3.0, 2.5, 9)


# --- the one entry per backend code file ---------------------------------------------------

def numpy_softsign(op, out, args):           # geon/transformers/numpy/<family>.py
    return [f"np.divide({args[0]}, 1 + np.abs({args[0]}), out={out})"]


def numpy_scaled_tanh(op, out, args):
    return [f"np.multiply({args[0]}, {op.beta!r}, out={out})",
            f"np.tanh({out}, out={out})", f"np.multiply({out}, {op.alpha!r}, out={out})"]


def c_softsign(op, t, a):                    # geon/transformers/c_expressions.py
    return f"({a[0]} / (({t})1 + {math_name('fabs', t)}({a[0]})))"


def c_scaled_tanh(op, t, a):
    return f"(({t}){op.alpha!r} * {math_name('tanh', t)}(({t}){op.beta!r} * {a[0]}))"


def torch_entries(ops):                      # geon/transformers/torch/export.py
    torch = pytest.importorskip("torch")
    return {ops.Softsign: lambda op, x: torch.nn.functional.softsign(x),
            ops.LeCunTanh: lambda op, x: op.alpha * torch.tanh(op.beta * x)}


@pytest.fixture(scope="module")
def ops():
    """tests/new_ops.py imported (its ops join the standard base set) and the backend
    entries made; both undone after this module's tests."""
    ops = importlib.import_module("new_ops")
    entries = [(NUMPY_CODE, ops.Softsign, numpy_softsign),
               (NUMPY_CODE, ops.LeCunTanh, numpy_scaled_tanh),
               (C_EXPRESSIONS, ops.Softsign, c_softsign),
               (C_EXPRESSIONS, ops.LeCunTanh, c_scaled_tanh)]
    for table, cls, fn in entries:
        table[cls] = fn
    yield ops
    for table, cls, _ in entries:
        del table[cls]
    tables.restore_primitives([c for c in tables._PRIMITIVES
                               if c not in (ops.Softsign, ops.LeCunTanh)])


def expected(x, alpha=1.5, beta=0.5):
    s = x / (1 + np.abs(x))
    return alpha * np.tanh(beta * 2 * s) + s


def build(ops, x):
    """A chain of both ops (one fused group where groups are fused)."""
    s = ops.softsign(x)
    return ops.scaled_tanh(s * 2.0, 1.5, 0.5) + s


# --- the graph: base sets, CSE, printing, cloning, JSON, evaluate --------------------------

def test_the_declared_ops_join_every_base_set(ops):
    from geon.transformers.gpu import CudaCodegenTransformer
    for cls in (ops.Softsign, ops.LeCunTanh):
        assert cls in STANDARD_BASE_SET
        assert cls in be.NumPyTransformer.base_set
        assert cls in CudaCodegenTransformer().base_set


def test_base_sets_follow_every_change_of_the_declarations():
    # declare, read, restore, declare again (one class twice): never a stale set
    saved = list(tables._PRIMITIVES)
    A = tables.primitive(type("StaleA", (be.Op,), {}))
    B = tables.primitive(type("StaleB", (be.Op,), {}))
    assert {A, B} <= STANDARD_BASE_SET and B in be.NumPyTransformer.base_set
    tables.restore_primitives(saved)
    C = tables.primitive(type("StaleC", (be.Op,), {}))
    tables.primitive(B)
    assert A not in STANDARD_BASE_SET and {B, C} <= STANDARD_BASE_SET
    assert A not in be.NumPyTransformer.base_set and C in be.NumPyTransformer.base_set


def test_cse_printing_cloning_and_json_follow_the_attrs(ops):
    x = be.placeholder(A, dtype=np.float64)
    a, b = ops.scaled_tanh(x, 1.5, 0.5), ops.scaled_tanh(x, 1.5, 0.5)
    c = ops.scaled_tanh(x, 1.5, 0.25)
    assert cse_key(a) == cse_key(b) != cse_key(c)
    assert cse_key(ops.softsign(x)) == cse_key(ops.softsign(x))
    assert "LeCunTanh(Placeholder_" in be.graph_text(c)
    assert "alpha=1.5, beta=0.25" in be.graph_text(c)
    copy = clone_graph([c])[c]
    assert copy is not c and type(copy) is ops.LeCunTanh
    assert (copy.alpha, copy.beta, copy.args[0]) == (1.5, 0.25, x)
    y = build(ops, x)
    loaded = be.deserialize(be.serialize(y))
    kinds = sorted(type(o).__name__ for o in _ops_of(loaded))
    assert "LeCunTanh" in kinds and "Softsign" in kinds
    (px,) = [o for o in _ops_of(loaded) if isinstance(o, be.Placeholder)]
    for graph, feed in ((y, x), (loaded, px)):
        np.testing.assert_allclose(be.evaluate(graph, feeds={feed: X}), expected(X),
                                   rtol=1e-13)


def _ops_of(op):
    from geon.op_graph.params import graph_ops
    return graph_ops([op])


# --- values: the NumPy code and the C path ---------------------------------------------

@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("compiled", [False, True])
def test_numpy_code_and_c_path(ops, dtype, compiled, tmp_path, monkeypatch):
    monkeypatch.setenv("GEON_CACHE_DIR", str(tmp_path))
    x = be.placeholder(A, dtype=dtype)
    comp = be.NumPyTransformer(compiled=compiled).computation(build(ops, x), x)
    if compiled:  # the whole chain is one C function: no NumPy call of either op
        assert comp.source.count("# compiled:") == 1, comp.source
        assert "np.tanh" not in comp.source and "np.abs" not in comp.source
    else:
        assert "np.tanh" in comp.source and "np.abs" in comp.source
    tol = 1e-12 if dtype == np.float64 else 1e-5
    got = comp(X.astype(dtype))
    assert got.dtype == dtype
    np.testing.assert_allclose(got, expected(X.astype(dtype)), rtol=tol, atol=tol)


# --- derivatives, both modes -------------------------------------------------------------

def test_reverse_mode_matches_central_differences(ops):
    assert_gradcheck(lambda x: ops.softsign(x), [((A,), X)])
    assert_gradcheck(lambda x: ops.scaled_tanh(x, 1.5, 0.5), [((A,), X)])
    assert_gradcheck(lambda x: build(ops, x), [((A,), X)])


def test_forward_mode_matches_central_differences(ops):
    x = be.placeholder(A, dtype=np.float64)
    y = build(ops, x)
    t = np.cos(np.arange(9.0))
    jt = be.evaluate(be.jvp(y, x, t), feeds={x: X})
    eps = 1e-6
    numeric = (expected(X + eps * t) - expected(X - eps * t)) / (2 * eps)
    np.testing.assert_allclose(jt, numeric, rtol=1e-7, atol=1e-9)
    # and a second derivative, the rules composing (forward over reverse): the
    # Hessian of sum(y) is diagonal, f''(x) along t
    g = be.deriv(be.sum(y, out_axes=()), x)
    h = be.evaluate(be.jvp(g, x, t), feeds={x: X})
    eps = 1e-4  # nested differences: rounding grows as 1 / eps**2
    second = (expected(X + eps) - 2 * expected(X) + expected(X - eps)) / eps ** 2
    np.testing.assert_allclose(h, second * t, rtol=1e-6, atol=1e-7)


# --- CUDA: the emulator, and nvcc where installed --------------------------------------

def test_cuda_code_runs_on_the_emulator_and_compiles_with_nvcc(ops, tmp_path):
    from cuda_emulator import EmulatorRuntime, find_compiler
    from geon.transformers.gpu import GPUTransformer
    from geon.transformers.gpu.codegen import module_source
    x = be.placeholder(A, dtype=np.float64)
    y = build(ops, x)
    results = [y, be.deriv(be.sum(y, out_axes=()), x)]
    runtime = EmulatorRuntime(seed=5)
    gpu = GPUTransformer(runtime=runtime).computation(results, x)
    source = module_source(list(gpu.kernels.values()))
    # the parameters are literals of the compute type
    assert "((double)1.5 * tanh((double)0.5 * " in source
    assert "/ ((double)1 + fabs(" in source
    nvcc = shutil.which("nvcc")
    if nvcc is not None:
        (tmp_path / "new_ops.cu").write_text(source)
        proc = subprocess.run([nvcc, "-ptx", "-arch=sm_90", "-o", str(tmp_path / "o.ptx"),
                               str(tmp_path / "new_ops.cu")], capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0 and "warning" not in proc.stderr, proc.stderr[-3000:]
    if find_compiler() is None:
        pytest.skip("no C++ compiler for the GPU emulator (nvcc checked above if present)")
    runtime.compile(list(gpu.kernels.values()))
    want = be.NumPyTransformer().computation(results, x)(X)
    for got, w in zip(gpu(X), want):
        np.testing.assert_allclose(got, w, rtol=1e-12, atol=1e-12)


# --- the torch export ---------------------------------------------------------------------

def test_torch_export(ops):
    torch = pytest.importorskip("torch")
    from geon.transformers.torch import TORCH_OPS, to_torch
    entries = torch_entries(ops)
    TORCH_OPS.update(entries)
    try:
        x = be.placeholder(A, dtype=np.float64)
        module = to_torch(build(ops, x), x)
        xt = torch.tensor(X, requires_grad=True)
        out = module(xt)
        np.testing.assert_allclose(out.detach().numpy(), expected(X), rtol=1e-12)
        out.sum().backward()
        g = be.deriv(be.sum(build(ops, x), out_axes=()), x)
        np.testing.assert_allclose(xt.grad.numpy(), be.evaluate(g, feeds={x: X}),
                                   rtol=1e-12)
    finally:
        for cls in entries:
            del TORCH_OPS[cls]

