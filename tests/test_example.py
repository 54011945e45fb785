"""The end-to-end example, ``python -m geon.examples.digits``: training reaches the
promised accuracy, checkpoints are written, and ``--resume`` restores them exactly."""

import io
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import geon as be
from geon.examples import digits
from geon.frontends.neon.progress import Progress, clock


def run(tmp_path, *argv, name="ckpt.npz"):
    return digits.main(["--quiet", "--checkpoint", str(tmp_path / name), *map(str, argv)])


def weights(path):
    """``{variable name: array}`` of a checkpoint, read with NumPy and its manifest."""
    with np.load(path, allow_pickle=False) as data:
        entries = json.loads(data["geon-checkpoint.json"])["variables"]
        return {e["name"]: data[e["member"][:-len(".npy")]] for e in entries}


def test_data_and_split():
    x, y = digits.load_digits()
    assert x.shape == (1797, 64) and x.dtype == np.float32
    assert 0.0 <= x.min() and x.max() <= 1.0
    assert y.shape == (1797,) and set(np.unique(y)) == set(range(10))
    train, test = digits.split(len(x))
    assert len(test) == 359 and len(train) == 1797 - 359
    assert not set(train) & set(test)
    # The split is fixed: the same whatever the run's --seed.
    train2, test2 = digits.split(len(x))
    assert np.array_equal(test, test2) and np.array_equal(train, train2)


def test_train_reaches_accuracy_and_resume_restores(tmp_path):
    # 10 epochs (of the default 30) already give >= 95% on the held-out 20%
    # (0.955..0.969 over seeds 0..11); the default run gives about 97-98%.
    r = run(tmp_path, "--epochs", 10)
    ckpt = tmp_path / "ckpt.npz"
    assert r["test_accuracy"] >= 0.95, r
    assert r["epochs"] == 10 and r["n_test"] == 359
    assert 0 < r["loss"] < 0.3 and 0 < r["test_loss"] < 0.3
    assert r["checkpoint"] == os.path.abspath(ckpt) and ckpt.exists()
    saved = weights(ckpt)
    assert set(saved) == {"hidden/W", "hidden/b", "output/W", "output/b", "sgd/step"}
    assert saved["hidden/W"].shape == (64, 64) and saved["output/W"].shape == (10, 64)
    assert int(saved["sgd/step"]) == 10 * 45   # 10 epochs of 44 batches of 32 and one of 30
    assert json.loads((tmp_path / "ckpt.json").read_text()) == {
        "batch_size": 32, "lr": 0.2, "hidden": 64, "seed": 0, "epochs": 10}

    # Resuming with no further epochs evaluates the restored weights: the same accuracy
    # and test loss, and the checkpoint it writes back is bitwise the one it read.
    again = run(tmp_path, "--epochs", 0, "--resume")
    assert again["test_accuracy"] == r["test_accuracy"]
    assert again["test_loss"] == r["test_loss"]
    assert again["epochs"] == 10 and np.isnan(again["loss"])
    rewritten = weights(ckpt)
    assert all(np.array_equal(saved[k], rewritten[k]) for k in saved)
    assert all(saved[k].dtype == rewritten[k].dtype for k in saved)

    # Without --resume the same run starts afresh (and differs from the trained one).
    fresh = run(tmp_path, "--epochs", 0, name="fresh.npz")
    assert fresh["test_accuracy"] < 0.5
    assert not np.array_equal(weights(tmp_path / "fresh.npz")["hidden/W"], saved["hidden/W"])


def test_resume_continues_the_same_run(tmp_path):
    # 2 epochs, save, resume up to epoch 4 (--epochs is the run's total, as Keras's
    # epochs) == 4 epochs in one go, bit for bit: the checkpoint holds every weight and
    # the step count, which fixes the minibatch order; the hyperparameters (here a
    # non-default learning rate) come from the stored run.
    run(tmp_path, "--epochs", 2, "--lr", 0.1, name="split.npz")
    resumed = run(tmp_path, "--epochs", 4, "--resume", name="split.npz")
    assert resumed["epochs_run"] == 2
    straight = run(tmp_path, "--epochs", 4, "--lr", 0.1, name="straight.npz")
    a, b = weights(tmp_path / "split.npz"), weights(tmp_path / "straight.npz")
    assert int(a["sgd/step"]) == int(b["sgd/step"]) == 4 * 45
    assert resumed["hyperparameters"]["lr"] == 0.1 and resumed["epochs"] == 4
    for k in a:
        assert np.array_equal(a[k], b[k]), k
    assert resumed["test_accuracy"] == straight["test_accuracy"]
    assert resumed["loss"] == straight["loss"]


def test_resume_errors(tmp_path):
    with pytest.raises(be.CheckpointError, match="does not exist"):
        run(tmp_path, "--epochs", 0, "--resume", name="missing.npz")
    run(tmp_path, "--epochs", 0, "--hidden", 16)
    # The stored run had 16 hidden units: asking for another number is an error ...
    with pytest.raises(be.CheckpointError, match="--hidden 64 but the run in .* used 16"):
        run(tmp_path, "--epochs", 0, "--resume", "--hidden", 64)
    assert run(tmp_path, "--epochs", 0, "--resume")["hyperparameters"]["hidden"] == 16
    # ... and a checkpoint that does not match the stored hyperparameters is refused.
    (tmp_path / "ckpt.json").write_text(json.dumps({"hidden": 64}))
    with pytest.raises(be.CheckpointError, match="variable needs"):
        run(tmp_path, "--epochs", 0, "--resume")
    (tmp_path / "ckpt.json").unlink()
    with pytest.raises(be.CheckpointError, match="hyperparameters"):
        run(tmp_path, "--epochs", 0, "--resume")
    with pytest.raises(SystemExit):
        digits.main(["--epochs", "-1"])


def test_no_save(tmp_path):
    r = run(tmp_path, "--epochs", 1, "--no-save")
    assert r["checkpoint"] is None and not (tmp_path / "ckpt.npz").exists()
    assert os.listdir(tmp_path) == []


class FakeStream(io.StringIO):
    def __init__(self, tty):
        super().__init__()
        self.tty = tty

    def isatty(self):
        return self.tty


def test_progress_bar():
    tty = FakeStream(True)
    p = Progress(tty)
    p.update("epoch 1/1", 1, 4, "loss 2.3")
    p.done("epoch 1/1: done")
    text = tty.getvalue()
    assert text.startswith("\repoch 1/1 [") and "1/4 loss 2.3" in text
    # The finished line overwrites the bar (padded over its leftovers) and is kept.
    bar, last = text[1:].split("\r")
    assert last == "epoch 1/1: done".ljust(len(bar)) + "\n"

    log = FakeStream(False)                  # not a terminal: one line per epoch, no '\r'
    p = Progress(log)
    for i in range(1, 5):
        p.update("epoch 1/1", i, 4, "loss 2.3")
    p.done("epoch 1/1: done")
    assert log.getvalue() == "epoch 1/1: done\n"

    # The rate (given, or measured between updates) and the time left at that rate.
    tty = FakeStream(True)
    p = Progress(tty)
    p.update("epoch 1/2", 10, 100, "loss 0.5", rate=3.0)
    assert tty.getvalue().endswith("10/100 loss 0.5 | 3.0 steps/s, ETA 0:30")
    p.done("epoch 1/2: done")
    tty = FakeStream(True)
    p = Progress(tty)
    p.update("epoch 2/2", 1, 100)                    # no rate yet: none shown
    assert "steps/s" not in tty.getvalue()
    p._start = ("epoch 2/2", p._start[1] - 2.0, 1)   # as if the first update was 2 s ago
    p._last = 0.0
    p.update("epoch 2/2", 21, 100)                   # 20 steps in 2 s: 10 steps/s
    shown = tty.getvalue().split("\r")[-1]
    assert re.search(r"21/100 \| (9\.\d|10\.0) steps/s, ETA 0:0[89]$", shown), shown

    assert [clock(s) for s in (0, 59.2, 61, 3725, float("inf"), float("nan"))] == \
        ["0:00", "1:00", "1:01", "1:02:05", "?", "?"]

    quiet = FakeStream(True)
    p = Progress(quiet, enabled=False)
    p.update("epoch 1/1", 1, 4)
    p.done("epoch 1/1: done")
    assert quiet.getvalue() == ""


def test_command_line(tmp_path):
    # The module runs as a program; the default checkpoint lands in the working directory
    # and progress goes to stderr (one line per epoch when it is not a terminal).
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.abspath(digits.__file__)))]
        + os.environ.get("PYTHONPATH", "").split(os.pathsep)))
    cmd = [sys.executable, "-m", "geon.examples.digits", "--epochs", "2"]
    p = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "digits-ckpt.npz").exists()
    assert p.stdout.startswith("test accuracy 0.9") and "after 2 epochs" in p.stdout
    assert p.stderr.count("\n") == 2 and "\r" not in p.stderr
    assert "epoch 2/2: loss" in p.stderr

    p = subprocess.run(cmd + ["--resume", "--checkpoint", "nope.npz"], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and "error: checkpoint nope.npz does not exist" in p.stderr
    assert "Traceback" not in p.stderr


# --- every example: one command line -------------------------------------------------------

EXAMPLES = ["digits", "digits_cnn", "digits_rnn"]
#: The options every example takes (each adds its hyperparameters).
COMMON = {"--epochs", "--batch-size", "--lr", "--seed", "--checkpoint", "--resume",
          "--no-save", "--plot", "--quiet", "--transformer", "--data-parallel", "--help"}


def options(module_name):
    """``{option: help text}`` of an example's ``--help``."""
    import contextlib
    import importlib
    module = importlib.import_module(f"geon.examples.{module_name}")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as e:
        module.main(["--help"])
    assert e.value.code == 0
    text = out.getvalue()
    body = text[text.index("options:"):]
    found = {}
    for m in re.finditer(r"^  (-h, )?(--[\w-]+)[^\n]*?(?:  +|\n +)(.*?)(?=^  -|\Z)", body,
                         re.M | re.S):
        found[m[2]] = " ".join(m[3].split())
    return text, found


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_example_has_the_same_options_with_descriptions_and_defaults(name):
    text, found = options(name)
    assert text.startswith(f"usage: python -m geon.examples.{name} ")
    assert COMMON <= set(found), COMMON - set(found)
    for option, help_text in found.items():
        if option in ("--help", "--resume", "--data-parallel", "--no-save"):
            continue
        assert "default" in help_text, (option, help_text)
    assert "the run's total number of epochs, as Keras's epochs" in found["--epochs"]
    assert f"(default {name}-ckpt.npz in the current folder)" in found["--checkpoint"]
    assert "as a PNG; needs matplotlib" in found["--plot"]


def test_examples_count_epochs_in_total_and_say_epoch_for_one(tmp_path, capsys):
    from geon.examples import digits_cnn
    ckpt = str(tmp_path / "cnn.npz")
    base = ["--quiet", "--channels", "2", "--checkpoint", ckpt]
    one = digits_cnn.main(base + ["--epochs", "1"])
    assert "after 1 epoch;" in capsys.readouterr().out
    assert one["epochs"] == one["epochs_run"] == 1
    assert json.loads((tmp_path / "cnn.json").read_text()) == {
        "batch_size": 32, "lr": 0.005, "channels": 2, "seed": 0, "epochs": 1}
    two = digits_cnn.main(base + ["--epochs", "2", "--resume"])   # up to epoch 2 in all
    assert "after 2 epochs;" in capsys.readouterr().out
    assert two["epochs"] == 2 and two["epochs_run"] == 1
    straight = digits_cnn.main(["--quiet", "--channels", "2", "--epochs", "2",
                                "--checkpoint", str(tmp_path / "straight.npz")])
    a, b = weights(ckpt), weights(tmp_path / "straight.npz")
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert two["test_loss"] == straight["test_loss"]
    # a total already reached trains nothing (Keras's initial_epoch >= epochs)
    again = digits_cnn.main(base + ["--epochs", "1", "--resume"])
    assert again["epochs_run"] == 0 and again["epochs"] == 2
    with pytest.raises(be.CheckpointError, match=r"--channels 4 but the run in .* used 2"):
        digits_cnn.main(base + ["--channels", "4", "--resume"])


def png_header(path):
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_plot_option_writes_the_training_curves_as_png(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="--plot needs matplotlib (pip install "
                                             "matplotlib)")
    png = tmp_path / "curves.png"
    r = run(tmp_path, "--epochs", 2, "--no-save", "--plot", png)
    assert r["plot"] == str(png) and png_header(png) == (840, 340)
    assert capsys.readouterr().out.rstrip().endswith(f"; curves {png}")
    assert png.stat().st_size < 100_000


def test_plot_option_without_matplotlib_stops_before_training(monkeypatch, capsys):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else real(name, *a))
    with pytest.raises(SystemExit) as e:
        digits.main(["--plot", "x.png"])
    assert e.value.code == 2
    assert ("error: --plot needs matplotlib, which is not installed: pip install "
            "matplotlib") in capsys.readouterr().err


@pytest.mark.skipif(os.name != "posix", reason="file modes are POSIX")
def test_the_hyperparameters_file_has_the_checkpoints_permissions(tmp_path):
    old = os.umask(0o027)
    try:
        run(tmp_path, "--epochs", 0)
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in tmp_path.iterdir()}
    assert modes == {"ckpt.npz": 0o640, "ckpt.json": 0o640}
