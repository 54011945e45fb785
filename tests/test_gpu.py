"""The GPU transformer on a real GPU, and how it is asked for where there is none.

Tests marked ``gpu`` need pycuda and a CUDA device; elsewhere they are skipped with the
reason (tests/test_gpu_codegen.py checks the same kernels with nvcc and the CPU
emulator on every run). On a GPU machine: ``pip install -e ".[gpu]"`` and
``python -m pytest tests/test_gpu.py``.

The error paths (no pycuda, no driver, no device) run everywhere, with a fake pycuda.
"""

import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

import geon as be
from geon.transformers.gpu import GPUTransformer, GPUUnavailableError, gpu_status
from test_gpu_codegen import (GRAPHS, build_all, check_checkpoints, check_digits,
                              check_graph, check_state_sync, needs_cxx)
from test_gpu_runtime import _stand_in_pycuda

OK, WHY = gpu_status()
GPU_REASON = f"no CUDA GPU available ({WHY})"
gpu = pytest.mark.gpu


@pytest.fixture(scope="module")
def gpu_transformer():
    """A factory of GPU transformers; skips if pycuda cannot make a context."""
    if not OK:
        pytest.skip(GPU_REASON)
    try:
        GPUTransformer()
    except Exception as e:  # a device that pycuda lists but cannot use
        pytest.skip(f"no CUDA GPU available ({e})")
    return GPUTransformer


@pytest.fixture(scope="module")
def on_gpu(gpu_transformer):
    """Every graph of tests/test_gpu_codegen.py on the GPU, all kernels compiled in
    one module first."""
    graphs = build_all(gpu_transformer)
    runtime = next(iter(graphs.values()))[0].transformer.runtime
    runtime.compile([k for gpu, _, _ in graphs.values() for k in gpu.kernels.values()])
    return graphs


@gpu
@pytest.mark.parametrize("name", list(GRAPHS))
def test_op_table_matches_numpy_on_gpu(name, on_gpu):
    """Every op-table case (float32: rtol 1e-5; float64) and the larger graphs."""
    check_graph(name, *on_gpu[name])


@gpu
def test_state_on_gpu(gpu_transformer):
    check_state_sync(gpu_transformer)


@gpu
def test_checkpoints_between_cpu_and_gpu(gpu_transformer, tmp_path):
    check_checkpoints(gpu_transformer, tmp_path)


@gpu
def test_digits_example_on_gpu(gpu_transformer, tmp_path, monkeypatch):
    check_digits(gpu_transformer, tmp_path, monkeypatch, epochs=10, accuracy=0.95)


@gpu
def test_large_elementwise_and_reduction_on_gpu(gpu_transformer):
    X, Y = be.Axis(4096, "X"), be.Axis(1000, "Y")
    x = be.placeholder((X, Y))
    h = x
    for k in range(20):
        h = be.tanh(h * 1.01 + 0.1) if k % 2 else h - 0.05
    s = be.sum(h, reduction_axes=X)
    v = np.random.default_rng(0).standard_normal((4096, 1000)).astype(np.float32)
    got = gpu_transformer().computation([h, s], x)(v)
    want = be.NumPyTransformer().computation([h, s], x)(v)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-4, atol=1e-3)


@gpu
@pytest.mark.parametrize("gemm", ["generated", "auto", "cublas"])
def test_gemm_on_gpu(gpu_transformer, gemm):
    M, K, N = (be.Axis(n, f"D{n}") for n in (515, 1024, 300))
    a, b = be.placeholder((M, K)), be.placeholder((K, N))
    rng = np.random.default_rng(1)
    va = rng.standard_normal((515, 1024)).astype(np.float32)
    vb = rng.standard_normal((1024, 300)).astype(np.float32)
    t = gpu_transformer(gemm=gemm)
    if gemm != "generated":
        assert t._blas is not None  # cuBLAS loads and works on a GPU machine
    got = t.computation(be.dot(a, b), a, b)(va, vb)
    np.testing.assert_allclose(got, va.astype(np.float64) @ vb, rtol=1e-4, atol=1e-3)


@gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cublas_with_transposed_operands_on_gpu(gpu_transformer, dtype):
    """Both operands read through their transposes' strides, three calls (launched,
    captured into a graph, replayed), new values each time."""
    M, K, N = (be.Axis(n, f"T{n}") for n in (37, 129, 70))
    at, bt = be.placeholder((K, M), dtype=dtype), be.placeholder((N, K), dtype=dtype)
    f = gpu_transformer(gemm="cublas").computation(
        be.dot(be.axes_with_order(at, (M, K)), be.axes_with_order(bt, (K, N))), at, bt)
    rng = np.random.default_rng(4)
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-12)
    for _ in range(3):
        va = rng.standard_normal((129, 37)).astype(dtype)
        vb = rng.standard_normal((70, 129)).astype(dtype)
        np.testing.assert_allclose(f(va, vb), va.T.astype(np.float64) @ vb.T, **tol)
    assert f._run_kernels.graph is not None


@gpu
def test_cuda_graphs_on_gpu(gpu_transformer):
    """From the second call on a computation runs as one captured graph; results follow
    the feeds and the variables it updates."""
    C, N = be.Axis(300, "C"), be.Axis(7, "N")
    x = be.placeholder((C, N), name="x")
    v = be.Variable((C,), initial_value=0.0, name="v")
    total = be.SetItem(v, v + be.sum(be.tanh(x), reduction_axes=N))
    t = gpu_transformer()
    f = t.computation([be.exp(x) * 2.0, total], x)
    rng = np.random.default_rng(5)
    want_v = np.zeros(300)
    for k in range(5):
        xv = rng.standard_normal((300, 7)).astype(np.float32)
        got = f(xv)[0]
        want_v += np.tanh(xv.astype(np.float64)).sum(axis=1)
        np.testing.assert_allclose(got, np.exp(xv) * 2.0, rtol=1e-5)
        np.testing.assert_allclose(t.state[v], want_v, rtol=1e-4, atol=1e-4)
        assert (f._run_kernels.graph is not None) == (k >= 1)
    g = gpu_transformer(cuda_graphs=False).computation([be.exp(x) * 2.0], x)
    for _ in range(3):
        np.testing.assert_allclose(g(xv)[0], np.exp(xv) * 2.0, rtol=1e-5)
    assert g._run_kernels.graph is None


@gpu
def test_large_feeds_and_results_on_gpu(gpu_transformer):
    """Feeds and results of several MB go through pinned buffers in pieces."""
    from geon.transformers.gpu import runtime
    A, B = be.Axis(3000, "A"), be.Axis(1001, "B")   # 12 MB of float32
    assert A.length * B.length * 4 > 2 * runtime.PARALLEL_COPY_BYTES
    x = be.placeholder((A, B), name="x")
    f = gpu_transformer().computation([x + 1.0, be.axes_with_order(x, (B, A))], x)
    rng = np.random.default_rng(6)
    for _ in range(3):
        xv = rng.standard_normal((3000, 1001)).astype(np.float32)
        plus, tr = f(xv)
        np.testing.assert_array_equal(plus, xv + np.float32(1.0))
        np.testing.assert_array_equal(tr, xv.T)


# --- where there is no GPU -------------------------------------------------------------------

def _fake_pycuda(monkeypatch, driver):
    pkg = types.ModuleType("pycuda")
    pkg.__path__ = []
    monkeypatch.setitem(sys.modules, "pycuda", pkg)
    if driver is None:
        monkeypatch.setitem(sys.modules, "pycuda.driver", None)  # import fails
    else:
        pkg.driver = driver
        monkeypatch.setitem(sys.modules, "pycuda.driver", driver)


def test_without_pycuda_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "pycuda", None)      # as if not installed
    with pytest.raises(GPUUnavailableError) as e:
        be.make_transformer("gpu")
    msg = str(e.value)
    assert "pycuda is not installed (pip install -e '.[gpu]' in a checkout of geon, or " \
           "pip install pycuda); building pycuda needs the CUDA toolkit" in msg
    assert "CUDA_ROOT" in msg and "nvcc on PATH" in msg
    assert "available transformers: " in msg and "numpy" in msg.split("available")[-1]
    assert isinstance(e.value, be.UnknownTransformerError)
    assert isinstance(e.value, be.GeonError) and isinstance(e.value, ValueError)
    ok, why = gpu_status()
    assert not ok and why.startswith("pycuda is not installed") and why in msg


def test_without_a_driver(monkeypatch):
    _fake_pycuda(monkeypatch, None)
    with pytest.raises(GPUUnavailableError, match="CUDA driver cannot be loaded") as e:
        GPUTransformer()
    assert "NVIDIA driver is installed" in str(e.value)
    assert "--no-binary pycuda" in str(e.value) and "CUDA_ROOT" in str(e.value)


@needs_cxx
def test_without_nvcc_the_compile_error_says_what_to_do(monkeypatch):
    # pycuda runs nvcc when kernels are compiled (the first call); without it on PATH
    # pycuda raises OSError, which geon turns into advice.
    _stand_in_pycuda(monkeypatch)

    def no_nvcc(*args, **kwargs):
        raise OSError("nvcc was not found (is it on the PATH?) [[Errno 2] No such file "
                      "or directory: 'nvcc']")
    monkeypatch.setattr(sys.modules["pycuda.compiler"], "SourceModule", no_nvcc)
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setenv("CUDA_ROOT", "/opt/cuda-12")
    x = be.placeholder(be.Axis(4, "C"), name="x")
    comp = be.make_transformer("gpu").computation(be.tanh(x), x)
    with pytest.raises(be.GeonError) as e:
        comp(np.ones(4, np.float32))
    msg = str(e.value)
    assert "could not compile its kernels" in msg and "nvcc is not on PATH" in msg
    assert "add /opt/cuda-12/bin (CUDA_ROOT's bin folder) to PATH" in msg
    assert "OSError: nvcc was not found" in msg
    monkeypatch.delenv("CUDA_ROOT")
    monkeypatch.delenv("CUDA_HOME", raising=False)
    with pytest.raises(be.GeonError, match="export PATH=/usr/local/cuda/bin:.PATH"):
        comp(np.ones(4, np.float32))


def test_without_a_device(monkeypatch):
    drv = types.ModuleType("pycuda.driver")
    drv.init = lambda: None
    drv.Device = types.SimpleNamespace(count=lambda: 0)
    _fake_pycuda(monkeypatch, drv)
    with pytest.raises(GPUUnavailableError, match="no CUDA device was found"):
        be.make_transformer("gpu")

    def no_driver():
        raise RuntimeError("cuInit failed: no CUDA-capable device is detected")
    drv.init = no_driver
    with pytest.raises(GPUUnavailableError, match="no CUDA device was found .cuInit"):
        be.make_transformer("gpu")
    drv.init = lambda: None
    drv.Device = types.SimpleNamespace(count=lambda: 1)
    with pytest.raises(GPUUnavailableError, match="CUDA device 3 does not exist"):
        GPUTransformer(device=3)


def test_importing_geon_never_needs_pycuda():
    code = ("import sys; sys.modules['pycuda'] = None; import geon as be; "
            "assert 'gpu' in be.available_transformers(); "
            "from geon.transformers.gpu import CudaCodegenTransformer; print('ok')")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr


def test_registered_by_name_and_entry_point():
    assert "gpu" in be.available_transformers()
    project = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    assert 'gpu = "geon.transformers.gpu:GPUTransformer"' in project
