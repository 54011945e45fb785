"""``cond`` and ``while_loop`` on the GPU transformer, checked without a GPU.

Each ``Cond`` / ``WhileLoop`` is a host step of its computation's launch list
(geon/transformers/gpu/control.py): the branches, the predicate and the body are GPU
programs of their own, run on the CPU emulator here (tests/cuda_emulator.py) and
compared with the NumPy transformer (float64: rtol 1e-12, float32: rtol 1e-5). Every
kernel they make is compiled with ``nvcc -ptx -arch=sm_90`` (skipped without nvcc); the
CUDA graphs of the runs of launches between host steps are checked against the
stand-in pycuda of tests/test_gpu_runtime.py. Tests marked ``gpu`` run the same graphs
on a real GPU (skipped elsewhere).
"""

import shutil

import numpy as np
import pytest

import geon as be
from geon.op_graph.elementwise import Add
from geon.transformers.gpu import CudaCodegenTransformer, GPUTransformer, gpu_status
from geon.transformers.gpu.codegen import all_kernels
from cuda_emulator import EmulatorRuntime, assert_ptx_compiles, find_compiler

NVCC = shutil.which("nvcc")
needs_cxx = pytest.mark.skipif(find_compiler() is None,
                               reason="no C++ compiler for the GPU emulator")
TOL = {np.dtype(np.float32): dict(rtol=1e-5, atol=1e-6),
       np.dtype(np.float64): dict(rtol=1e-12, atol=1e-12)}
A, B = be.Axis(3, "A"), be.Axis(4, "B")


# --- the graphs: name -> (results, placeholders, [feeds per call]) -------------------------

def _cond(dtype):
    p = be.placeholder([], dtype=dtype, name="p")
    v = be.placeholder([A, B], dtype=dtype, name="v")
    w = be.placeholder([B, A], dtype=dtype, name="w")
    wt = be.axes_with_order(w, [A, B])  # a closure read through strides (a port copy)
    y, z = be.cond(p, lambda u: (be.tanh(u) * wt, u),          # an operand as is
                   lambda u: (u * u, be.constant(2.0, axes=[A, B], dtype=dtype)), v)
    s = be.sum(y + z, out_axes=())
    rng = np.random.default_rng(0)
    V, W = rng.standard_normal((3, 4)), rng.standard_normal((4, 3))
    feeds = [(np.array(pv), V, W) for pv in (1.0, 0.0, -2.5, 0.0)]
    return [y, z, s], [p, v, w], feeds


def _cond_grad(dtype):
    p = be.placeholder([], dtype=dtype, name="p")
    v = be.placeholder([A], dtype=dtype, name="v")
    w = be.placeholder([A], dtype=dtype, name="w")
    y = be.cond(p, lambda u: be.tanh(u) * w, lambda u: u * u, v)
    gv, gw = be.deriv(be.sum(y * y, out_axes=()), [v, w])
    V, W = np.array([0.5, -1.0, 2.0]), np.array([1.0, 2.0, 3.0])
    return [y, gv, gw], [p, v, w], [(np.array(1.0), V, W), (np.array(0.0), V, W)]


def _nested_cond(dtype):
    p = be.placeholder([], dtype=dtype, name="p")
    q = be.placeholder([], dtype=dtype, name="q")
    v = be.placeholder([A], dtype=dtype, name="v")

    def outer_true(u):
        return be.cond(q, lambda a: be.exp(a * 0.5), lambda a: a - 1.0, u) * 3.0
    y = be.cond(p, outer_true, lambda u: be.cond(q - 1.0, lambda a: a * a,
                                                 lambda a: -a, u), v)
    V = np.array([0.25, -0.5, 1.5])
    feeds = [(np.array(a), np.array(b), V) for a in (0.0, 1.0) for b in (0.0, 1.0, 2.0)]
    return [y], [p, q, v], feeds


def _cond_in_scan(dtype):
    T = be.Axis(5, "T")
    x = be.placeholder([T, A], dtype=dtype, name="x")
    h0 = be.placeholder([A], dtype=dtype, name="h0")

    def cell(h, x_t):
        s = be.sum(x_t, out_axes=())
        h = be.cond(s, lambda a: be.tanh(a + x_t), lambda a: a * 0.5 - x_t, h)
        return h, be.sum(h, out_axes=())
    hT, ys = be.scan(cell, h0, x, T)
    X = np.array([[1.0, 0.5, -0.5], [0.0, 0.0, 0.0], [0.2, -0.2, 0.0], [1.0, 1.0, 1.0],
                  [0.0, 0.0, 0.0]])
    return [hT, ys], [x, h0], [(X, np.array([0.1, -0.2, 0.3]))]


def _newton(dtype):
    a = be.placeholder([], dtype=dtype, name="a")
    tol = 1e-12 if np.dtype(dtype) == np.float64 else 1e-5
    x, n = be.while_loop(lambda c: be.absolute(c[0] * c[0] - a) > tol * a,
                         lambda c: (0.5 * (c[0] + a / c[0]), c[1] + 1),
                         (be.constant(1.0, dtype=dtype), be.constant(0, dtype=np.int32)))
    return [x, n], [a], [(np.array(2.0),), (np.array(9.0),), (np.array(1.0),)]


def _while_bounded(dtype):
    v = be.placeholder([A], dtype=dtype, name="v")
    u = be.while_loop(lambda u: be.sum(u * u, out_axes=()) < 1e6, lambda u: u * 2.0 + 1.0,
                      v, max_steps=4)
    V = np.array([0.5, -1.0, 2.0])
    return [u], [v], [(V,), (V * 1e4,), (V * 0.01,)]


def _while_carries(dtype):
    """Three carries (a vector, a matrix and an integer counter), a closure read
    through strides, a carry passed through unchanged and an unused one."""
    v = be.placeholder([A], dtype=dtype, name="v")
    m = be.placeholder([A, B], dtype=dtype, name="m")
    k = be.placeholder([B, A], dtype=dtype, name="k")
    kt = be.axes_with_order(k, [A, B])

    def body(c):
        u, mm, i, same = c
        mm2 = be.tanh(mm * 0.9 + kt * be.cast_axes(u, [A]))
        return be.sum(mm2, reduction_axes=[B]) + u * 0.5, mm2, i + 1, same
    u, mm, i, _ = be.while_loop(lambda c: c[2] < 5, body,
                                (v, m, be.constant(0, dtype=np.int32),
                                 be.constant(7.0, axes=[B], dtype=dtype)))
    rng = np.random.default_rng(1)
    return [u, mm, i], [v, m, k], [(rng.standard_normal(3), rng.standard_normal((3, 4)),
                                    rng.standard_normal((4, 3)))]


def _while_grad(dtype):
    a = be.placeholder([], dtype=dtype, name="a")
    v = be.placeholder([A], dtype=dtype, name="v")
    x, u = be.while_loop(lambda c: be.absolute(c[0] * c[0] - a) > 1e-9,
                         lambda c: (0.5 * (c[0] + a / c[0]), c[1] * be.tanh(c[0])),
                         (be.constant(1.0, dtype=dtype), v), max_steps=8)
    cost = x + be.sum(u * u, out_axes=())
    da, dv = be.deriv(cost, [a, v])
    V = np.array([0.3, -0.7, 1.1])
    return [x, u, da, dv], [a, v], [(np.array(2.0), V), (np.array(1.0), V)]


def _while_jvp(dtype):
    """Forward mode: a while loop over the carries and their tangents (no bound)."""
    v = be.placeholder([A], dtype=dtype, name="v")
    t = be.placeholder([A], dtype=dtype, name="t")
    u = be.while_loop(lambda u: be.sum(u * u, out_axes=()) < 50.0,
                      lambda u: u * 1.5 + be.sin(u), v)
    du = be.jvp(u, v, t)
    return [u, du], [v, t], [(np.array([0.5, -1.0, 2.0]), np.array([1.0, 0.5, -0.25]))]


def _while_in_cond(dtype):
    """A host step inside a sub-program: a while loop in a cond branch, and a cond in
    a while loop's body."""
    p = be.placeholder([], dtype=dtype, name="p")
    v = be.placeholder([A], dtype=dtype, name="v")

    def halve_until_small(u):
        return be.while_loop(lambda c: be.sum(c * c, out_axes=()) > 1.0, lambda c: c * 0.5,
                             u, max_steps=20)

    def body(c):
        u, i = c
        return be.cond(be.sum(u, out_axes=()) > 0.0, lambda x: x - 1.0,
                       lambda x: x * -2.0, u), i + 1
    y = be.cond(p, halve_until_small, lambda u: u + 1.0, v)
    z, _ = be.while_loop(lambda c: c[1] < 3, body, (y, be.constant(0, dtype=np.int32)))
    V = np.array([3.0, -4.0, 5.0])
    return [y, z], [p, v], [(np.array(1.0), V), (np.array(0.0), V)]


GRAPHS = {"cond": _cond, "cond_grad": _cond_grad, "nested_cond": _nested_cond,
          "cond_in_scan": _cond_in_scan, "newton": _newton, "while_bounded": _while_bounded,
          "while_carries": _while_carries, "while_grad": _while_grad,
          "while_jvp": _while_jvp, "while_in_cond": _while_in_cond}
CASES = [(name, dt) for name in GRAPHS for dt in (np.float64, np.float32)]


def _feeds(args, params):
    return [np.asarray(a, dtype=p.dtype) for a, p in zip(args, params)]


def _compare(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype
    if got.dtype.kind in "iub":
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, **TOL[got.dtype])


def check_against_numpy(make_gpu, name, dtype):
    results, params, calls = GRAPHS[name](dtype)
    gpu = make_gpu().computation(results, *params)
    cpu = be.make_transformer("numpy").computation(results, *params)
    for args in calls:
        feeds = _feeds(args, params)
        for g, c in zip(gpu(*feeds), cpu(*feeds)):
            _compare(g, c)
    return gpu


@needs_cxx
@pytest.mark.parametrize("name,dtype", CASES)
def test_emulated_matches_numpy(name, dtype):
    gpu = check_against_numpy(lambda: GPUTransformer(runtime=EmulatorRuntime(seed=7)),
                              name, dtype)
    assert gpu.program.host_steps or name == "cond_in_scan" or \
        any(s.program.host_steps for s in gpu.transformer._bodies.values())


@needs_cxx
def test_check_numerics_mode_runs_host_steps():
    """The numerics debug mode runs the host steps at their place, and checks the
    branches' own kernels."""
    check_against_numpy(lambda: GPUTransformer(runtime=EmulatorRuntime(seed=1),
                                               check_numerics=True), "while_carries",
                        np.float64)
    check_against_numpy(lambda: GPUTransformer(runtime=EmulatorRuntime(seed=1),
                                               check_numerics=True), "cond", np.float64)
    p = be.placeholder([], name="p")
    v = be.placeholder([A], name="v")
    y = be.cond(p, lambda u: be.log(u), lambda u: u, v)
    f = GPUTransformer(runtime=EmulatorRuntime(), check_numerics=True).computation(y, p, v)
    np.testing.assert_allclose(f(0.0, np.ones(3)), np.ones(3))
    with pytest.raises(be.NumericsError, match="Log"):
        f(1.0, -np.ones(3, np.float32))


# --- the launch list -----------------------------------------------------------------------

def test_host_steps_in_the_launch_plan_and_source():
    results, params, _ = _while_carries(np.float32)
    c = CudaCodegenTransformer().computation(results, *params)
    prog = c.program
    (at, step), = prog.host_steps
    assert type(step).__name__ == "WhileStep"
    # before it: the initial carries copied into the ports X, the strided closure made
    # dense; the final carries are copied out by kernels the host step runs
    assert [k.kind for k in prog.launches[:at]] == ["copy"] * 5
    assert all(k.kind == "copy" for f in step.finals for k in f)
    src = c.source
    assert "host step: WhileLoop" in src and "the body of WhileLoop" in src
    assert "the predicate of WhileLoop" in src
    # each body is generated once, with every result dense in a buffer of its own
    body = step.body.program
    assert len(body.outputs) == 4 and len(set(body.outputs)) == 4
    assert all(key[0] == "result" for key in body.outputs)


def test_each_body_is_compiled_once_per_transformer():
    """A cond inside a scan is unrolled into one Cond per step; all share one program
    per branch."""
    results, params, _ = _cond_in_scan(np.float64)
    t = CudaCodegenTransformer()
    c = t.computation(results, *params)
    assert len(c.program.host_steps) == 5
    branches = {id(b) for _, s in c.program.host_steps for b in s.branches}
    assert len(branches) == 2 and len(t._bodies) == 2


def test_unsupported_op_in_a_branch_is_refused_when_built():
    p = be.placeholder([], name="p")
    v = be.placeholder([A], name="v")
    y = be.cond(p, lambda u: Add(Add(u, -0.0, dtype=np.dtype(np.float16)), -0.0,
                                 dtype=np.dtype(np.float32)), lambda u: u, v)
    with pytest.raises(be.LoweringError, match=r"float16.*in the true branch of Cond"):
        CudaCodegenTransformer().computation(y, p, v)


def test_reverse_derivative_of_a_while_loop_is_a_scan_unrolled():
    """The masked scan of a bounded while loop's derivative is unrolled like any scan:
    the derivative's computation holds the forward loop's host step only."""
    results, params, _ = _while_grad(np.float64)
    c = CudaCodegenTransformer().computation(results[2:], *params)
    assert all(type(s).__name__ == "WhileStep" for _, s in c.program.host_steps)
    assert len(c.program.host_steps) == 1  # (2 u, the delta of sum(u * u), needs u)


# --- nvcc -------------------------------------------------------------------------------------

@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")
def test_nvcc_compiles_every_kernel(tmp_path):
    """Every kernel of these graphs (the outer programs, the copies, every branch,
    predicate and body, nested ones too), both dtypes, in one nvcc run."""
    ks = {}
    for name, dt in CASES:
        results, params, _ = GRAPHS[name](dt)
        ks.update(all_kernels(CudaCodegenTransformer().computation(results, *params).program))
    assert "copy" in {k.kind for k in ks.values()}
    assert_ptx_compiles(ks, tmp_path, "all")


# --- PyCUDA and CUDA graphs (the stand-ins of tests/test_gpu_runtime.py) ------------------

@needs_cxx
def test_runs_between_host_steps_are_graphs_and_only_the_predicate_comes_back(monkeypatch):
    from test_gpu_runtime import _stand_in_pycuda
    dev = _stand_in_pycuda(monkeypatch)
    results, params, calls = _while_carries(np.float32)
    f = be.make_transformer("gpu").computation(results, *params)
    cpu = be.make_transformer("numpy").computation(results, *params)
    feeds = _feeds(calls[0], params)
    per_call = []
    for _ in range(4):
        before = len(dev.calls)
        for g, c in zip(f(*feeds), cpu(*feeds)):
            _compare(g, c)
        per_call.append(dev.calls[before:])
    # 5 steps: the predicate is read 6 times; nothing else leaves the device but the
    # 3 results, and nothing but the 3 feeds goes to it
    for c in per_call:
        assert c.count("dtoh_async") == 6 + 3 and c.count("htod_async") == 3, c
        assert "dtoh" not in c and "htod" not in c
    # from the second run of each binding on, each run of launches is a graph
    assert "launch call" not in per_call[-1] and "graph launch" in per_call[-1]


# --- a real GPU ---------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("name,dtype", CASES)
def test_on_gpu_matches_numpy(name, dtype):
    ok, why = gpu_status()
    if not ok:
        pytest.skip(f"no CUDA GPU available ({why})")
    check_against_numpy(GPUTransformer, name, dtype)
