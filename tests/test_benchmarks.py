"""The benchmark suite (benchmarks/) runs, and its comparison workloads compute what
geon computes. Timings are never asserted. JAX and PyTensor are optional: their cases
skip when they are not installed; PyTorch's run wherever torch is."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # benchmarks/ is not installed: it lives beside tests/
    sys.path.insert(0, str(ROOT))

from benchmarks import compare, gemm, mlp, run  # noqa: E402
from geon import _blas  # noqa: E402


def _need(lib):
    if importlib.util.find_spec(lib) is None:
        pytest.skip(f"{lib} is not installed (an optional comparison library)")


def test_quick_run_of_one_table_without_comparisons():
    out = subprocess.run([sys.executable, "-m", "benchmarks.run", "--quick", "--only",
                          "overhead", "--no-compare"], capture_output=True, text=True,
                         cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "Call overhead" in out.stdout
    assert "MLP training step" not in out.stdout  # --only ran one table


def test_only_rejects_an_unknown_table(capsys):
    with pytest.raises(SystemExit):
        run.main(["--only", "mlp,nonsense"])
    assert "nonsense" in capsys.readouterr().err


def test_gemms_alone_are_the_step_gemms():
    # the same eight products, with the shapes of geon's generated step
    from benchmarks import linetime
    batch = 16
    g, _ = mlp.geon_step(batch, mlp.init_params())
    # (sums are matrix-vector products too: their lines name a ReduceSum)
    calls = [ln for ln in g.source.splitlines() if linetime.is_product(ln) and "# Gemm" in ln]
    assert len(calls) == len(gemm.STEP_GEMMS)
    mlp.gemms_only(batch)()  # runs


@pytest.mark.parametrize("lib", compare.LIBS)
def test_comparison_mlp_step_has_geons_loss(lib):
    _need(lib)
    ref, losses = run.check_mlp_losses([lib], batch=32)
    assert np.isfinite(ref) and set(losses) == {"geon", lib}


@pytest.mark.parametrize("lib", compare.LIBS)
def test_comparison_chain_matches_numpy(lib):
    _need(lib)
    xs = np.linspace(-2, 2, 64, dtype=np.float32)
    f, seconds = compare.chain_fn(lib, run.CHAIN * 2, xs.size)
    np.testing.assert_allclose(np.asarray(f(xs)), run.chain_eager(xs, run.CHAIN * 2),
                               rtol=1e-4, atol=1e-5)
    assert seconds > 0
    add, _ = compare.add_one(lib)
    np.testing.assert_allclose(np.asarray(add()), [2.0])


def test_gemm_measure_agrees_between_backends():
    # one repeat of every GEMM of the step on the backends installed here; measure()
    # itself checks that they compute the same products
    res, notes = gemm.measure([8], 1, ["numpy", "openblas32", "blis"])
    assert "numpy" in res and len(res["numpy"][8]) == len(gemm.STEP_GEMMS)
    assert all(med >= best > 0 for med, best in res["numpy"][8])


def test_peak_from_cpu_flags(monkeypatch):
    monkeypatch.setattr(gemm, "cpuinfo", lambda: ("X", {"avx512f", "avx2", "fma"}, 2000.0))
    value, how = gemm.peak(cores=2)
    assert value == pytest.approx(16 * 2 * 2 * 2.0 * 2)  # lanes * FMA * units * GHz * cores
    assert "AVX-512F" in how
    monkeypatch.setattr(gemm, "cpuinfo", lambda: ("X", {"avx2", "fma"}, 2500.0))
    assert gemm.peak(cores=1, fma_units=1)[0] == pytest.approx(8 * 2 * 1 * 2.5)


AMD512 = ("AuthenticAMD", set(_blas.AVX512_NEEDED) | {"avx2", "fma"})


def test_coretype_choice():
    assert _blas.coretype_for(*AMD512) == "SkylakeX"
    assert _blas.coretype_for("AuthenticAMD", {"avx2", "fma", "avx512f"}) is None
    assert _blas.coretype_for("GenuineIntel", AMD512[1]) is None


def test_select_coretype_respects_the_user_and_numpy(monkeypatch):
    monkeypatch.setattr(sys, "platform", "linux")
    env = {}
    assert _blas.select_coretype(env, modules={}, cpu=AMD512) == "SkylakeX"
    assert env == {"OPENBLAS_CORETYPE": "SkylakeX"}
    env = {"OPENBLAS_CORETYPE": "Haswell"}  # the user's choice stands
    assert _blas.select_coretype(env, modules={}, cpu=AMD512) is None
    assert env == {"OPENBLAS_CORETYPE": "Haswell"}
    env = {_blas.OPT_OUT: "off"}
    assert _blas.select_coretype(env, modules={}, cpu=AMD512) is None
    assert "OPENBLAS_CORETYPE" not in env
    env = {}  # NumPy already loaded its OpenBLAS: setting it now would do nothing
    assert _blas.select_coretype(env, modules={"numpy": np}, cpu=AMD512) is None
    assert env == {}
    assert _blas.select_coretype(env, modules={}, cpu=("AuthenticAMD", {"avx2"})) is None


def test_import_geon_sets_no_coretype_on_this_cpu_unless_it_should():
    code = "import os, geon; print(os.environ.get('OPENBLAS_CORETYPE', '-'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, env={k: v for k, v in __import__("os").environ.items()
                                        if k not in ("OPENBLAS_CORETYPE", _blas.OPT_OUT)},
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == (_blas.coretype_for(*_blas._cpu()) or "-")


def test_samples_after_a_pause_are_primed_by_untimed_calls():
    from benchmarks.common import PRIME_CALLS, interleaved_stats
    calls = {"a": 0, "b": 0}

    def counter(k):
        def f():
            calls[k] += 1
        return f

    fns = {k: counter(k) for k in calls}
    interleaved_stats(fns, repeats=3, warmup=1, gap=0.001)
    per = 1 + 3 * (PRIME_CALLS + 1)   # warm-up, then primed samples
    assert PRIME_CALLS == 2 and calls == {"a": per, "b": per}
    calls.update(a=0, b=0)
    interleaved_stats(fns, repeats=3, warmup=1, gap=0.001, prime=1)
    assert calls == {"a": 1 + 3 * 2, "b": 1 + 3 * 2}
    calls.update(a=0, b=0)
    interleaved_stats(fns, repeats=3, warmup=1, gap=0.001, prime=False)  # --cold
    assert calls == {"a": 4, "b": 4}
    calls.update(a=0, b=0)
    interleaved_stats(fns, repeats=3, warmup=1)  # no pause: nothing to prime
    assert calls == {"a": 4, "b": 4}


def test_linetime_times_every_statement_of_the_step(capsys):
    from benchmarks import linetime
    linetime.main(["--batch", "16", "--steps", "2", "--top", "100"])
    out = capsys.readouterr().out
    rows = [ln for ln in out.splitlines() if ln.startswith("| ") and "`" in ln]
    # the step's eight products are among the statements timed, each with its time
    products = [r for r in rows if linetime.is_product(r)]
    assert len(products) == len(gemm.STEP_GEMMS)
    # every statement has its time (a check of a feed's type can round to 0.000 ms)
    assert all(float(r.split("|")[1]) >= 0 for r in rows)
    assert all(float(r.split("|")[1]) > 0 for r in products)
    assert "matrix products" in out


@pytest.mark.parametrize("flag, mode", [([], "auto"), (["--numpy"], False),
                                        (["--compiled"], True)])
def test_linetime_times_the_mode_asked_for(flag, mode, monkeypatch):
    from benchmarks import linetime, mlp
    made = []
    real = mlp.geon_step
    monkeypatch.setattr(mlp, "geon_step", lambda *a, **k: made.append(
        k["transformer"].compiled) or real(*a, **k))
    linetime.main(["--batch", "4", "--steps", "1"] + flag)
    assert made == [mode]


def test_modes_pairs_steps_of_two_modes(capsys):
    from benchmarks import modes
    a, b, g = modes.paired(4, "numpy", "all", pairs=3)
    assert len(a) == len(b) == len(g) == 3 and (a > 0).all() and (b > 0).all()
    modes.main(["--batch", "4", "--pairs", "2", "numpy", "auto"])
    out = capsys.readouterr().out
    assert "median difference auto - numpy" in out and "of pairs" in out


def test_symbolic_times_one_computation_for_every_batch_size(capsys):
    from benchmarks import symbolic
    symbolic.main(["--batches", "3", "5", "--repeats", "1"])
    out = capsys.readouterr().out
    assert "| 5 |" in out and "symbolic: 1 transformation, 3 plans" in out


@pytest.mark.parametrize("name", ["CHAIN", "CHEAP_CHAIN"])
def test_gpu_benchmark_chains_agree_in_torch_and_numpy(name):
    """benchmarks.gpu compares geon's fused chain with PyTorch's ops on the GPU; the
    PyTorch version computes what the NumPy one does (checked here on the CPU)."""
    torch = pytest.importorskip("torch", reason="needs PyTorch (pip install torch==2.13.0)")
    from benchmarks import gpu as bgpu
    from benchmarks.run import chain_eager
    chain = getattr(bgpu, name)
    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    got = bgpu._torch_chain(torch.from_numpy(x), chain).numpy()
    np.testing.assert_allclose(got, chain_eager(x, chain), rtol=1e-5, atol=1e-6)


def test_matmul_benchmark_computes_the_products_and_the_layer():
    """benchmarks/matmul.py: the broadcast-and-sum form it times as "before" computes the
    same product, and the attention layer imported from ONNX matches the NumPy one."""
    pytest.importorskip("onnx")
    from benchmarks import matmul
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((2, 3, 4, 5)), rng.standard_normal((3, 5, 2))
    f = matmul._before((2, 3, 4, 5), (3, 5, 2))
    np.testing.assert_allclose(f(A.astype(np.float32), B.astype(np.float32)), A @ B,
                               rtol=1e-5, atol=1e-5)
    rows = matmul.layer(1, batch=2, seq=8, hidden=16, heads=2)   # asserts the values
    assert [r[0] for r in rows][:2] == ["geon", "numpy"]
