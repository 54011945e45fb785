"""Memory plans of values read both directly and through views (issue 31).

An elementwise op that reads a tensor directly and, in its fused group, through a view
(a reversed slice, a transpose, a broadcast) must not write its result over that tensor:
the group runs block by block, so later blocks would read the view's elements already
overwritten. The planner keeps such values alive to the group's end and writes nothing
over them; :func:`geon.transformers.memory.verify_plan` proves every plan before code is
made from it. Every check here is in float64 against NumPy.
"""

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import geon as be
from geon.op_graph import primitives as pr
from geon.transformers import fusion, memory
from geon.transformers.gpu import CudaCodegenTransformer, GPUTransformer
from geon.transformers.numpy import compiled as compiled_kernels
from geon.transformers.numpy import c_codegen
from cuda_emulator import EmulatorRuntime, find_compiler

needs_cc = pytest.mark.skipif(not compiled_kernels.available(),
                              reason="no working C compiler for the compiled path")
needs_cxx = pytest.mark.skipif(find_compiler() is None,
                               reason="no C++ compiler for the GPU emulator")
MODES = [pytest.param("auto", marks=needs_cc, id="auto"),
         pytest.param(True, marks=needs_cc, id="compiled"),
         pytest.param(False, id="numpy")]


@pytest.fixture
def small_groups(monkeypatch):
    """Fusion, blocks, threads and compiled groups on small tensors."""
    monkeypatch.setattr(fusion, "MIN_ELEMENTS", 1)
    monkeypatch.setattr(fusion, "BLOCK_ELEMENTS", 8)      # several blocks per group
    monkeypatch.setattr(fusion, "PARALLEL_ELEMENTS", 1)   # on threads
    monkeypatch.setattr(fusion, "MAX_THREADS", 2)
    monkeypatch.setattr(compiled_kernels, "AUTO_MIN_ELEMENTS", 1)
    monkeypatch.setattr(c_codegen, "PARALLEL_ELEMENTS", 1)
    monkeypatch.setattr(c_codegen, "BLOCK_ELEMENTS", 8)


def _root(op):
    """The op whose elements view ``op`` shows."""
    while isinstance(op, pr.ViewOp):
        op = op.args[0]
    return op


def _data(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


def _check(f, feeds, want, calls=3):
    """``f(*feeds)`` matches ``want`` (float64, a few ulps of its scale), call after call
    (blocks run on threads, so a race would give another answer each time)."""
    scale = max(1.0, float(np.abs(want).max()))
    for _ in range(calls):
        np.testing.assert_allclose(f(*feeds), want, rtol=1e-12, atol=1e-12 * scale)


# --- the graph of the issue -------------------------------------------------------------

def _issue_graph(shape):
    x = be.np.placeholder(shape, dtype=np.float64)
    r = be.np.maximum(x, 0.0)
    return be.np.sum(r[::-1] * 2.0 + r, axis=0), x


def _issue_numpy(xv):
    r = np.maximum(xv, 0.0)
    return (r[::-1] * 2.0 + r).sum(axis=0)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", [(300, 257), (1100, 1100)])
def test_reversed_slice_beside_its_tensor_at_the_reported_sizes(mode, shape):
    # the defaults: auto compiles from 65,536 elements, the NumPy code fuses from
    # 262,144 and runs on threads from 1,048,576 (off by about 1,000 before the fix)
    y, x = _issue_graph(shape)
    f = be.NumPyTransformer(compiled=mode).computation(y, x)
    xv = _data(shape)
    _check(f, [xv], _issue_numpy(xv))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", [(6, 6), (7, 5), (33, 40)])
def test_reversed_slice_beside_its_tensor_in_small_groups(mode, shape, small_groups):
    y, x = _issue_graph(shape)
    f = be.NumPyTransformer(compiled=mode).computation(y, x)
    assert f.groups  # fused, block by block
    xv = _data(shape)
    _check(f, [xv], _issue_numpy(xv))


@pytest.mark.parametrize("mode", MODES)
def test_the_plan_alone_is_right(mode, small_groups, monkeypatch):
    # the planner itself, not only the verifier's refusal, gets it right
    monkeypatch.setattr(memory, "VERIFY", False)
    y, x = _issue_graph((24, 24))
    f = be.NumPyTransformer(compiled=mode).computation(y, x)
    (r,) = [op for op in f.order if type(op).__name__ == "Maximum"]
    members = [m for g in f.groups for m in g.members]
    assert all(f.plan.slot.get(m) != f.plan.slot[r] for m in members)
    xv = _data((24, 24))
    _check(f, [xv], _issue_numpy(xv))


# --- views beside the direct value ------------------------------------------------------

VIEWS = {  # the view of r read beside r, in geon and in NumPy
    "reversed rows": (lambda r: r[::-1], lambda r: r[::-1]),
    "reversed rows and columns": (lambda r: r[::-1, ::-1], lambda r: r[::-1, ::-1]),
    "transpose": (lambda r: r.T, lambda r: r.T),
    "reversed transpose": (lambda r: r.T[::-1], lambda r: r.T[::-1]),
    "broadcast first row": (lambda r: be.np.broadcast_to(r[0], (24, 24)),
                            lambda r: np.broadcast_to(r[0], (24, 24))),
    "first column broadcast as rows": (lambda r: be.np.broadcast_to(r[:, 0], (24, 24)),
                                       lambda r: np.broadcast_to(r[:, 0], (24, 24))),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("view", list(VIEWS))
def test_a_view_read_beside_the_direct_value(view, mode, small_groups):
    # t reads r through the view, t + r reads r directly and is r's last reader; both
    # in one group, whose result a reduction reads (not elementwise)
    gv, nv = VIEWS[view]
    x = be.np.placeholder((24, 24), dtype=np.float64)
    r = be.np.maximum(x, 0.0)
    y = be.np.sum(be.np.tanh(gv(r)) * 3.0 + r, axis=0)
    f = be.NumPyTransformer(compiled=mode).computation(y, x)
    xv = _data((24, 24), seed=1)
    rv = np.maximum(xv, 0.0)
    _check(f, [xv], (np.tanh(nv(rv)) * 3.0 + rv).sum(axis=0))


# --- the ONNX model of the issue: Relu -> Transpose -> Tanh -> Add -> MatMul --------------

def _onnx_chain(n):
    x = be.np.placeholder((n, n), dtype=np.float64)
    w = be.np.placeholder((n, n), dtype=np.float64)
    r = be.np.relu(x)
    return be.np.matmul(be.np.tanh(be.np.transpose(r)) + r, w), x, w


def _onnx_numpy(xv, wv):
    r = np.maximum(xv, 0.0)
    return (np.tanh(r.T) + r) @ wv


@pytest.mark.parametrize("mode", MODES)
def test_onnx_chain_at_512(mode):
    y, x, w = _onnx_chain(512)  # 262,144 elements: fused with the defaults
    f = be.NumPyTransformer(compiled=mode).computation(y, x, w)
    xv, wv = _data((512, 512), 2), _data((512, 512), 3)
    _check(f, [xv, wv], _onnx_numpy(xv, wv), calls=2)


@pytest.mark.parametrize("mode", MODES)
def test_onnx_chain_in_small_groups(mode, small_groups):
    y, x, w = _onnx_chain(20)
    f = be.NumPyTransformer(compiled=mode).computation(y, x, w)
    xv, wv = _data((20, 20), 2), _data((20, 20), 3)
    _check(f, [xv, wv], _onnx_numpy(xv, wv))


# --- the GPU transformer (code generation; the emulator runs it) -------------------------

def _reversed_product(n):
    x = be.np.placeholder((n, n), dtype=np.float64)
    w = be.np.placeholder((n, n), dtype=np.float64)
    r = be.np.maximum(x, 0.0)
    return be.np.matmul(r[::-1] * 2.0 + r, w), x, w


def _reversed_product_numpy(xv, wv):
    r = np.maximum(xv, 0.0)
    return (r[::-1] * 2.0 + r) @ wv


GPU_GRAPHS = {"onnx chain": (_onnx_chain, _onnx_numpy),
              "reversed slice": (_reversed_product, _reversed_product_numpy)}


@pytest.mark.parametrize("name", list(GPU_GRAPHS))
def test_gpu_plan_keeps_the_viewed_value_and_the_group_whole(name):
    # The kernel [view op, add] reads r through the view at other threads' positions:
    # the plan gives the add a buffer of its own (before the fix, it wrote over r and
    # the kernel had to be split in two, one launch more)
    y, *xs = GPU_GRAPHS[name][0](16)
    prog = CudaCodegenTransformer().computation(y, *xs).program
    assert [k.kind for k in prog.launches] == ["ew", "ew", "gemm"]
    (g,) = [g for g in prog.groups if len(g.members) == 2]
    viewed = {_root(a) for m in g.members for a in m.args if isinstance(a, pr.ViewOp)}
    assert viewed and all(v in prog.plan.slot for v in viewed)
    assert not prog.plan.inplace & set(g.members)
    assert not {prog.plan.slot.get(m) for m in g.members} & {prog.plan.slot[v]
                                                              for v in viewed}


@needs_cxx
@pytest.mark.parametrize("name", list(GPU_GRAPHS))
@pytest.mark.parametrize("n", [8, 37])
def test_gpu_emulator_matches_numpy(name, n):
    build, ref = GPU_GRAPHS[name]
    y, *xs = build(n)
    f = GPUTransformer(runtime=EmulatorRuntime(seed=5)).computation(y, *xs)
    xv, wv = _data((n, n), 4), _data((n, n), 5)
    _check(f, [xv, wv], ref(xv, wv), calls=2)


def _split_reduction_graph():
    # [max, min, sum]: min reads max's buffer transposed, so the kernel is split after
    # max; the sum (of max) must then run alone, not with min
    x = be.np.placeholder((2, 16), dtype=np.float64)
    r = be.np.mean(x, axis=1, keepdims=True)
    m = be.np.maximum(r.T[::-1], r[::-1, ::-1])
    return [be.np.minimum(m, m.T), be.np.mean(m, axis=1, keepdims=True)], x


def test_gpu_split_group_keeps_each_reduction_with_its_input():
    # (found by the random graphs of tests/test_differential.py: the split group
    # [min, sum] made a kernel whose sum read max, in neither register nor prologue)
    ys, x = _split_reduction_graph()
    prog = CudaCodegenTransformer().computation(ys, x).program  # raised ValueError
    reductions = [m for g in prog.groups for m in g.members if isinstance(m, pr.ReduceSum)]
    assert not reductions  # its input, max, is in no group: the sum runs alone
    if find_compiler() is not None:
        ys, x = _split_reduction_graph()
        got = GPUTransformer(runtime=EmulatorRuntime()).computation(ys, x)(_data((2, 16)))
        r = _data((2, 16)).mean(axis=1, keepdims=True)
        m = np.maximum(r.T[::-1], r[::-1, ::-1])
        np.testing.assert_allclose(got[0], np.minimum(m, m.T), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(got[1], m.mean(axis=1, keepdims=True), rtol=1e-12,
                                   atol=1e-14)


# --- the keep-alive rule, directly ---------------------------------------------------------

def test_a_value_a_group_reads_through_a_view_lives_to_the_groups_end(small_groups):
    # r is read (through a reversed view) only by the group's first member; the group
    # still reads it until its last block, so nothing is written over it before the
    # group's end, and its arena is free again right after (for e, of r's size)
    x = be.np.placeholder((6, 6), dtype=np.float64)
    r = be.np.maximum(x, 0.0)
    m = be.np.tanh(r[::-1] * 2.0) + 1.0
    s = be.np.sum(m, axis=1)
    e = be.np.exp(be.np.sum(s) + x) * 3.0
    f = be.NumPyTransformer(compiled=False).computation(be.np.sum(e, axis=0), x)
    (r,) = [op for op in f.order if type(op).__name__ == "Maximum"]
    (g,) = [g for g in f.groups if any(isinstance(a, pr.ViewOp) and _root(a) is r
                                       for op in g.members for a in op.args)]
    assert all(f.plan.slot.get(m) != f.plan.slot[r] for m in g.members)
    (after,) = [op for op in f.order[f.order.index(g.members[-1]):]
                if op in f.plan.slot and op.axes.lengths == (6, 6)]
    assert f.plan.slot[after] == f.plan.slot[r]
    xv = _data((6, 6))
    rv = np.maximum(xv, 0.0)
    sv = (np.tanh(rv[::-1] * 2.0) + 1.0).sum(axis=1)
    _check(f, [xv], (np.exp(sv.sum() + xv) * 3.0).sum(axis=0))


# --- the verifier ---------------------------------------------------------------------

def _moved(plan, value, like):
    """A copy of ``plan`` with ``value`` put in the arena of ``like``."""
    bad = memory.Plan()
    bad.slot, bad.sizes = dict(plan.slot), list(plan.sizes)
    bad.slot[value] = bad.slot[like]
    return bad


def test_verifier_refuses_a_write_over_a_value_the_group_reads_through_a_view(
        small_groups):
    y, x = _issue_graph((8, 8))
    f = be.NumPyTransformer(compiled=False).computation(y, x)
    (r,) = [op for op in f.order if type(op).__name__ == "Maximum"]
    (add,) = [op for op in f.order if type(op).__name__ == "Add"]
    (mul,) = [op for op in f.order if type(op).__name__ == "Multiply"]
    assert memory.verify_plan(f.order, f.results, f.plan, f.groups)
    with pytest.raises(memory.PlanError) as e:  # the plan of the issue: add over r
        memory.verify_plan(f.order, f.results, _moved(f.plan, add, r), f.groups)
    msg = str(e.value)
    step = f.order.index
    assert f"Maximum '{r.name}' is overwritten by Add '{add.name}' (step {step(add)})" \
        in msg
    assert f"while step {step(mul)} (Multiply '{mul.name}') still reads it" in msg
    assert "internal error" in msg and "disable=['memory']" in msg
    assert isinstance(e.value, be.GeonError)


def test_verifier_names_the_overwriting_op_and_the_later_reader():
    x = be.np.placeholder((4, 4), dtype=np.float64)
    a = be.np.exp(x)
    b = be.np.tanh(a)
    c = be.np.sum(b + a * 2.0, axis=0)
    f = be.NumPyTransformer(compiled=False).computation(c, x)
    ops = {type(op).__name__: op for op in f.order}
    exp, tanh, mul = ops["Exp"], ops["Tanh"], ops["Multiply"]
    with pytest.raises(memory.PlanError, match=re.escape(  # exp is read after tanh
            f"Exp '{exp.name}' is overwritten by Tanh '{tanh.name}' "
            f"(step {f.order.index(tanh)}) while step {f.order.index(mul)} "
            f"(Multiply '{mul.name}') still reads it")):
        memory.verify_plan(f.order, f.results, _moved(f.plan, tanh, exp), f.groups)


def test_verifier_refuses_an_unsafe_write_over_an_input():
    # a matrix product written over its own operand
    x = be.np.placeholder((4, 4), dtype=np.float64)
    a = be.np.exp(x)
    g = be.np.tanh(a @ a)
    f = be.NumPyTransformer(compiled=False).computation(be.np.sum(g, axis=0), x)
    ops = {type(op).__name__: op for op in f.order}
    with pytest.raises(memory.PlanError, match="which still reads it .*not an elementwise"):
        memory.verify_plan(f.order, f.results, _moved(f.plan, ops["Gemm"], ops["Exp"]),
                           f.groups)


def test_verification_is_on_by_default():
    out = subprocess.run([sys.executable, "-c", "from geon.transformers import memory; "
                          "print(memory.VERIFY)"], capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.strip() == "True", out.stderr


def _breaking_planner(monkeypatch):
    """memory.plan_memory puts every planned value in one arena."""
    real = memory.plan_memory

    def planner(order, results, **kw):
        plan = real(order, results, **kw)
        for v in plan.slot:
            plan.slot[v] = 0
        plan.sizes = [max(plan.sizes)]
        return plan
    monkeypatch.setattr(memory, "plan_memory", planner)


def test_a_wrong_plan_raises_before_the_numpy_code_runs(monkeypatch):
    _breaking_planner(monkeypatch)
    x = be.np.placeholder((4, 4), dtype=np.float64)
    a = be.np.exp(x)
    with pytest.raises(memory.PlanError, match="still reads it"):
        be.NumPyTransformer(compiled=False).computation(
            be.np.sum(be.np.tanh(a) + a * 2.0, axis=0), x)


def test_a_wrong_plan_raises_before_gpu_kernels_are_made(monkeypatch):
    _breaking_planner(monkeypatch)
    y, x, w = _onnx_chain(8)
    with pytest.raises(memory.PlanError, match="still reads it"):
        CudaCodegenTransformer().computation(be.np.sum(y, axis=0) * 2.0 + 1.0, x, w)


def test_the_cost_benchmark_runs():
    # benchmarks/verify.py: transformation time with and without verification
    root = str(Path(__file__).resolve().parent.parent)
    if root not in sys.path:  # benchmarks/ is not installed: it lives beside tests/
        sys.path.insert(0, root)
    from benchmarks import verify
    rows = verify.main(["--repeats", "1", "--chain", "40", "--batch", "8"])
    assert [r[0] for r in rows] == ["40-op chain", "MLP training step, batch 8"]
    assert all(float(r[3].split()[0]) > 0 for r in rows)
    assert memory.VERIFY  # the benchmark leaves verification as it found it (on)
