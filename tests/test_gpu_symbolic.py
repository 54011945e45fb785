"""The GPU transformer with symbolic axis lengths (geon/transformers/gpu/binding.py).

A computation over ``be.symbolic_axis("N")`` is transformed once; each binding of ``N``
read from the feeds gets a program of its own (the transformed ops specialized to the
bound lengths, then fusion, memory plan and kernels). Checked without a GPU: the
programs run on the CPU emulator (tests/cuda_emulator.py) and the stand-in pycuda of
tests/test_gpu_runtime.py, against the NumPy transformer; every kernel of each binding
is compiled with ``nvcc -ptx -arch=sm_90`` (skipped only without nvcc). Tests marked
``gpu`` run the same on a real GPU.
"""

import shutil

import numpy as np
import pytest

import geon as be
from geon.errors import ArgumentError, FeedError
from geon.transformers.gpu import CudaCodegenTransformer, GPUTransformer, binding, gpu_status
from geon.transformers.gpu.codegen import all_kernels
from cuda_emulator import EmulatorRuntime, assert_ptx_compiles, find_compiler

NVCC = shutil.which("nvcc")
needs_cxx = pytest.mark.skipif(find_compiler() is None,
                               reason="no C++ compiler for the GPU emulator")
TOL = {np.dtype(np.float32): dict(rtol=1e-5, atol=1e-6),
       np.dtype(np.float64): dict(rtol=1e-12, atol=1e-12)}
BATCHES = (1, 7, 100)
D, H, C = 6, 5, 4


def _emulated(**kw):
    return GPUTransformer(runtime=EmulatorRuntime(seed=13), **kw)


def _mlp(t, dtype, n=None):
    """An MLP's inference over a batch of ``n`` (symbolic where ``None``): a product
    and a bias, tanh, a second product, softmax, and the mean of the probabilities'
    squares. Returns ``(computation, x)``."""
    N = be.symbolic_axis("N", batch=True) if n is None else be.Axis(n, "N", batch=True)
    Dx, Hx, Cx = be.Axis(D, "D"), be.Axis(H, "H"), be.Axis(C, "C")
    x = be.placeholder([Dx, N], dtype=dtype, name="x")
    w = be.Variable([Hx, Dx], dtype=dtype, name="w",
                    initial_value=lambda s: np.linspace(-1, 1, H * D).reshape(s))
    b = be.Variable([Hx], dtype=dtype, initial_value=0.25, name="b")
    w2 = be.Variable([Cx, Hx], dtype=dtype, name="w2",
                     initial_value=lambda s: np.cos(np.arange(C * H)).reshape(s))
    h = be.tanh(be.dot(w, x) + b)
    p = be.softmax(be.dot(w2, h))
    return t.computation([p, be.mean(p * p, out_axes=()), be.sum(h, out_axes=())], x), x


def _feed(n, dtype, seed=0):
    return np.random.default_rng(seed + n).standard_normal((D, n)).astype(dtype)


def _compare(got, want):
    for g, w in zip(got, want):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, **TOL[g.dtype])


# --- inference ----------------------------------------------------------------------------

@needs_cxx
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_mlp_over_a_symbolic_batch_matches_numpy(dtype):
    gpu, _ = _mlp(_emulated(), dtype)
    cpu, _ = _mlp(be.NumPyTransformer(), dtype)
    for n in BATCHES + (7, 1):  # the last two: bindings seen before
        _compare(gpu(_feed(n, dtype)), cpu(_feed(n, dtype)))
    assert gpu.transformations == 1 and gpu.plans == 3
    assert set(gpu.programs) == {(1,), (7,), (100,)}
    assert gpu.symbols == ("N",)


@needs_cxx
def test_an_empty_batch_runs_as_on_the_cpu():
    gpu, _ = _mlp(_emulated(), np.float64)
    cpu, _ = _mlp(be.NumPyTransformer(), np.float64)
    with np.errstate(invalid="ignore"):  # (the mean of nothing)
        want = cpu(_feed(0, np.float64))
    got = gpu(_feed(0, np.float64))
    assert got[0].shape == (C, 0) and np.isnan(got[1]) and got[2] == want[2] == 0
    _compare(gpu(_feed(2, np.float64)), cpu(_feed(2, np.float64)))


def test_each_binding_has_the_kernels_of_a_fixed_computation_of_its_lengths():
    sym, _ = _mlp(CudaCodegenTransformer(), np.float32)
    for n in BATCHES:
        fixed, _ = _mlp(CudaCodegenTransformer(), np.float32, n)
        prog = sym.program_for({"N": n})
        assert [k.name for k in prog.launches] == [k.name for k in fixed.program.launches]
        assert prog.arenas == fixed.program.arenas
        assert fixed.plans == 1
    assert sym.transformations == 1 and sym.plans == 3
    assert sym.program_for({"N": 7}) is sym.programs[(7,)] and sym.plans == 3
    assert sym.source.startswith("// geon GPU transformer: the program of the binding N = 7")
    with pytest.raises(ArgumentError, match="each of its symbols"):
        sym.program_for({"M": 3})


def test_a_new_computation_says_its_programs_are_made_per_binding():
    sym, _ = _mlp(CudaCodegenTransformer(), np.float32)
    assert sym.program is None and sym.kernels == {} and sym.plans == 0
    assert "symbolic length(s) N" in sym.source


def test_the_binding_cache_is_bounded_and_never_transforms_again(monkeypatch):
    monkeypatch.setattr(binding, "MAX_BINDINGS", 2)
    sym, _ = _mlp(CudaCodegenTransformer(), np.float64)
    for n in (1, 2, 3, 1):  # 1 was dropped for 3, and is made again
        sym.program_for({"N": n})
    assert set(sym.programs) == {(3,), (1,)}
    assert sym.transformations == 1 and sym.plans == 4


@needs_cxx
def test_dropped_bindings_free_their_device_programs(monkeypatch):
    monkeypatch.setattr(binding, "MAX_BINDINGS", 2)
    gpu, _ = _mlp(_emulated(), np.float64)
    cpu, _ = _mlp(be.NumPyTransformer(), np.float64)
    for n in (1, 2, 3, 1, 3):
        _compare(gpu(_feed(n, np.float64)), cpu(_feed(n, np.float64)))
    assert set(gpu._entries) == {(3,), (1,)}
    assert gpu.transformations == 1 and gpu.plans == 4


# --- training -----------------------------------------------------------------------------

def _train(t, dtype):
    """A training step over a symbolic batch: cross-entropy of a softmax, SGD updates
    of the weight and the bias by ``be.deriv``; returns ``(step, (w, b))``."""
    N = be.symbolic_axis("N", batch=True)
    Dx, Cx = be.Axis(D, "D"), be.Axis(C, "C")
    x = be.placeholder([Dx, N], dtype=dtype, name="x")
    y = be.placeholder([Cx, N], dtype=dtype, name="y")
    w = be.Variable([Cx, Dx], dtype=dtype, name="w",
                    initial_value=lambda s: np.linspace(-0.5, 0.5, C * D).reshape(s))
    b = be.Variable([Cx], dtype=dtype, initial_value=0.1, name="b")
    p = be.softmax(be.dot(w, x) + b)
    loss = be.mean(-be.sum(y * be.log(p), reduction_axes=Cx), out_axes=())
    step = t.computation([loss, be.SetItem(w, w - 0.5 * be.deriv(loss, w)),
                          be.SetItem(b, b - 0.5 * be.deriv(loss, b))], x, y)
    return step, (w, b)


def _labels(n, dtype):
    y = np.zeros((C, n), dtype)
    y[np.arange(n) % C, np.arange(n)] = 1
    return y


@needs_cxx
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_training_step_over_a_symbolic_batch_matches_numpy(dtype):
    gt, ct = _emulated(), be.NumPyTransformer()
    gpu, (gw, gb) = _train(gt, dtype)
    cpu, (cw, cb) = _train(ct, dtype)
    for n in (3, 8, 3, 1):
        feeds = (_feed(n, dtype), _labels(n, dtype))
        _compare(gpu(*feeds)[:1], cpu(*feeds)[:1])
        np.testing.assert_allclose(gt.state[gw], ct.state[cw], **TOL[np.dtype(dtype)])
        np.testing.assert_allclose(gt.state[gb], ct.state[cb], **TOL[np.dtype(dtype)])
    assert not np.allclose(gt.state[gw], np.linspace(-0.5, 0.5, C * D).reshape(C, D))
    assert gpu.transformations == 1 and gpu.plans == 3


# --- feeds --------------------------------------------------------------------------------

@needs_cxx
def test_feeds_that_disagree_on_a_symbol_name_both_placeholders():
    step, _ = _train(_emulated(), np.float32)
    with pytest.raises(FeedError, match=r"placeholder y gives symbol N the value 4 .*"
                                        r"placeholder x gives it 3 .*disagree"):
        step(_feed(3, np.float32), _labels(4, np.float32))
    assert step.plans == 0


@needs_cxx
@pytest.mark.parametrize("value,match", [
    (np.zeros((D, 2, 1), np.float32), r"placeholder x expects axes \(D:6, N:N\)"),
    (np.zeros((D + 1, 2), np.float32), r"placeholder x expects axes .* shape \(6, 2\); "
                                       r"got shape \(7, 2\)"),
    ("seven", r"placeholder x"),
])
def test_a_feed_of_the_wrong_rank_or_fixed_length_names_the_placeholder(value, match):
    f, _ = _mlp(_emulated(), np.float32)
    with pytest.raises(FeedError, match=match):
        f(value)
    assert f.plans == 0


@needs_cxx
def test_a_wrong_fixed_length_beside_a_good_binding_costs_no_program():
    step, _ = _train(_emulated(), np.float32)
    with pytest.raises(FeedError, match=r"placeholder y expects axes \(C:4, N:N\) i.e. "
                                        r"shape \(4, 3\); got shape \(5, 3\)"):
        step(_feed(3, np.float32), np.zeros((C + 1, 3), np.float32))
    assert step.plans == 0


@needs_cxx
def test_feeds_are_converted_under_the_binding():
    gpu, _ = _mlp(_emulated(), np.float32)
    cpu, _ = _mlp(be.NumPyTransformer(), np.float32)
    x = _feed(5, np.float64)  # converted to float32
    _compare(gpu(x), cpu(x.astype(np.float32)))
    _compare(gpu(x.tolist()), cpu(x.astype(np.float32)))
    assert gpu.plans == 1


def _sliced(t):
    N = be.symbolic_axis("N", batch=True)
    x = be.placeholder([be.Axis(3, "D"), N], dtype=np.float64, name="x")
    inner = be.slice_along_axis(x, N, slice(1, -1))
    return t.computation(be.tanh(inner) * 2.0, x)


@needs_cxx
def test_a_slice_that_does_not_fit_the_binding_is_a_feed_error():
    gpu, cpu = _sliced(_emulated()), _sliced(be.NumPyTransformer())
    x = np.linspace(-1, 1, 15).reshape(3, 5)
    _compare([gpu(x)], [cpu(x)])
    assert gpu(x).shape == (3, 3)
    with pytest.raises(FeedError, match=r"needs N - 2 >= 0; the feeds give N = 1"):
        gpu(np.ones((3, 1)))
    _compare([gpu(np.ones((3, 2)))], [cpu(np.ones((3, 2)))])  # an empty result
    assert gpu.plans == 2 and gpu.transformations == 1


def test_program_for_checks_slices_too():
    f = _sliced(CudaCodegenTransformer())
    with pytest.raises(FeedError, match=r"SliceView .* needs N - 2 >= 0"):
        f.program_for({"N": 1})
    assert f.plans == 0


# --- what is refused ---------------------------------------------------------------------

def test_control_flow_with_symbolic_lengths_is_refused_naming_the_op():
    N = be.symbolic_axis("N", batch=True)
    p = be.placeholder([], name="p")
    v = be.placeholder([be.Axis(3, "A"), N], name="v")
    y = be.cond(p, lambda u: be.tanh(u), lambda u: u * u, v)
    with pytest.raises(ArgumentError, match=r"Cond Cond_\w+ \(built at .*\) is in a "
                                            r"computation with symbolic length\(s\) N"):
        CudaCodegenTransformer().computation(y, p, v)


def test_a_variable_with_a_symbolic_length_is_refused():
    N = be.symbolic_axis("N", batch=True)
    w = be.Variable([N], initial_value=0.0, name="w")
    x = be.placeholder([N], name="x")
    with pytest.raises(ArgumentError, match=r"Variable w .* must be fixed"):
        CudaCodegenTransformer().computation(w + x, x)


# --- the numerics debug mode, and the stand-in pycuda (pinned buffers, CUDA graphs) -------

@needs_cxx
def test_numerics_mode_over_a_symbolic_batch():
    gpu, _ = _mlp(_emulated(check_numerics=True), np.float64)
    cpu, _ = _mlp(be.NumPyTransformer(), np.float64)
    for n in (2, 9):
        _compare(gpu(_feed(n, np.float64)), cpu(_feed(n, np.float64)))
    x = _feed(4, np.float64)
    x[0, 0] = np.nan
    with pytest.raises(be.NumericsError, match="x"):
        gpu(x)


@needs_cxx
def test_stand_in_pycuda_runs_each_binding_as_a_cuda_graph(monkeypatch):
    from test_gpu_runtime import _stand_in_pycuda
    dev = _stand_in_pycuda(monkeypatch)
    gpu, _ = _mlp(be.make_transformer("gpu"), np.float32)
    cpu, _ = _mlp(be.NumPyTransformer(), np.float32)
    for n in (7, 7, 2, 7, 2, 2):
        before = len(dev.calls)
        _compare(gpu(_feed(n, np.float32)), cpu(_feed(n, np.float32)))
        calls = dev.calls[before:]
        assert calls.count("htod_async") == 1 and "htod" not in calls
    # the third call of each binding is one graph launch
    assert "launch call" not in calls and "graph launch" in calls
    assert gpu.transformations == 1 and gpu.plans == 2


# --- nvcc ---------------------------------------------------------------------------------

@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")
def test_nvcc_compiles_every_kernel_of_each_binding(tmp_path):
    ks = {}
    for dtype in (np.float32, np.float64):
        mlp, _ = _mlp(CudaCodegenTransformer(), dtype)
        step, _ = _train(CudaCodegenTransformer(), dtype)
        for f in (mlp, step):
            for n in BATCHES:
                ks.update(all_kernels(f.program_for({"N": n})))
    assert {"ew", "reduce", "gemm"} <= {k.kind for k in ks.values()}
    assert_ptx_compiles(ks, tmp_path, "symbolic")


# --- a real GPU ---------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_symbolic_batch_on_gpu(dtype):
    ok, why = gpu_status()
    if not ok:
        pytest.skip(f"no CUDA GPU available ({why})")
    gpu, _ = _mlp(GPUTransformer(), dtype)
    cpu, _ = _mlp(be.NumPyTransformer(), dtype)
    for n in BATCHES + (7, 1000):
        _compare(gpu(_feed(n, dtype)), cpu(_feed(n, dtype)))
    gt, ct = GPUTransformer(), be.NumPyTransformer()
    step, (gw, _) = _train(gt, dtype)
    ref, (cw, _) = _train(ct, dtype)
    for n in (3, 64, 3):
        step(_feed(n, dtype), _labels(n, dtype))
        ref(_feed(n, dtype), _labels(n, dtype))
    np.testing.assert_allclose(gt.state[gw], ct.state[cw], rtol=1e-4, atol=1e-6)
    assert gpu.transformations == 1 and gpu.plans == 4 and step.plans == 2


@needs_cxx
def test_a_binding_needing_more_device_memory_than_is_free_is_refused_before_allocating():
    class Small(EmulatorRuntime):
        def free_memory(self):
            return 64 << 10   # 64 KiB free

        def alloc(self, nbytes):
            self.allocated = getattr(self, "allocated", 0) + nbytes
            return super().alloc(nbytes)
    rt = Small(seed=13)
    gpu, _ = _mlp(GPUTransformer(runtime=rt), np.float32)
    cpu, _ = _mlp(be.NumPyTransformer(), np.float32)
    _compare(gpu(_feed(7, np.float32)), cpu(_feed(7, np.float32)))
    before = rt.allocated
    with pytest.raises(FeedError, match=r"the feeds bind N = 5000, for which the "
                                        r"computation's buffers need .* GiB of device "
                                        r"memory and 0.00 GiB is free"):
        gpu(_feed(5000, np.float32))
    assert rt.allocated == before   # nothing allocated for it
    _compare(gpu(_feed(7, np.float32)), cpu(_feed(7, np.float32)))


@needs_cxx
def test_neon_predict_runs_one_symbolic_batch_computation_on_the_gpu():
    from geon.frontends import neon as nn
    F = be.Axis(8, "F")
    model = nn.Model(nn.Sequential([
        nn.Affine(16, activation="tanh", weight_init=nn.GlorotUniform(seed=1), name="hid"),
        nn.Affine(3, weight_init=nn.GlorotUniform(seed=1), name="out")]), [F],
        optimizer=nn.SGD(0.1),
        batch_size=32, transformer=_emulated())
    weights = {k: np.asarray(v).copy() for k, v in model.weights().items()}
    w1, b1, w2, b2 = (weights[k] for k in ("hid/W", "hid/b", "out/W", "out/b"))
    rng = np.random.default_rng(5)
    for n in (1, 7, 100):
        X = rng.standard_normal((n, 8)).astype(np.float32)
        got = np.asarray(model.predict(X))
        np.testing.assert_allclose(got, np.tanh(X @ w1.T + b1) @ w2.T + b2, rtol=1e-5,
                                   atol=1e-5)
    comp = model._any["predict"]
    # bindings 1, 7, then 32 and 4 (100 samples in batches of batch_size 32)
    assert comp is not None and comp.transformations == 1 and comp.plans == 4
    for k, v in model.weights().items():
        np.testing.assert_array_equal(np.asarray(v), weights[k])   # unchanged


def test_a_scan_over_a_symbolic_axis_is_refused_naming_it():
    T = be.symbolic_axis("T", recurrent=True)
    H = be.Axis(4, "H")
    xs = be.placeholder([T, H], dtype="float32", name="xs")

    def body(h, x):
        h = be.tanh(h + x)
        return h, h
    final, ys = be.scan(body, be.constant(0.0, axes=[H], dtype="float32"), xs, T)
    with pytest.raises(ArgumentError, match=r"Scan .* \(built at .*test_gpu_symbolic.py.*"
                                             r"\) runs over axis T of symbolic length T: "
                                             r"the cuda-codegen transformer unrolls scans"):
        CudaCodegenTransformer().computation([final, ys], xs)
