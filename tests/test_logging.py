"""geon logs through ``logging.getLogger("geon")`` and its children, and is silent
unless the application enables it."""

import logging
import subprocess
import sys

import numpy as np

import geon as be


def _graph():
    C = be.Axis(4, "C")
    x = be.placeholder(C, name="x")
    return x, be.tanh(x) * 2


def test_the_geon_logger_has_a_null_handler_and_no_level():
    log = logging.getLogger("geon")
    assert any(isinstance(h, logging.NullHandler) for h in log.handlers)
    assert all(isinstance(h, logging.NullHandler) for h in log.handlers)
    assert log.level == logging.NOTSET and log.propagate


def test_pass_timings_and_the_transformation_total(caplog):
    caplog.set_level(logging.DEBUG, logger="geon")
    x, y = _graph()
    t = be.NumPyTransformer()
    t.computation(y, x)
    passes = [r for r in caplog.records if " pass " in r.getMessage()]
    assert [r.getMessage().split(" pass ")[1].split()[0] for r in passes] == \
        [p.name for p in t.passes()]
    assert all(r.levelno == logging.DEBUG and r.name == "geon.transformers.base"
               for r in passes)
    assert all(" took " in r.getMessage() and " s (" in r.getMessage() for r in passes)
    (total,) = [r for r in caplog.records if r.levelno == logging.INFO]
    msg = total.getMessage()
    assert total.name.startswith("geon.") and msg.startswith("numpy: built a computation")
    assert f"of {y.name} from x:" in msg and "-> 2 primitives in" in msg


def test_info_level_shows_totals_only(caplog):
    caplog.set_level(logging.INFO, logger="geon")
    x, y = _graph()
    be.NumPyTransformer().computation(y, x)
    assert [r.levelno for r in caplog.records] == [logging.INFO]


def test_run_reuse_is_logged(caplog):
    caplog.set_level(logging.DEBUG, logger="geon.op_graph.run")
    x, y = _graph()
    runner = be.Runner()
    feed = {x: np.ones(4, np.float32)}
    runner.run(y, feed)
    assert any(f"compiled a computation of {y.name}" in r.getMessage()
               for r in caplog.records)
    caplog.clear()
    runner.run(y, feed)                             # the value is reused
    assert [r.getMessage() for r in caplog.records] == \
        [f"run: reused the value of {y.name} (its inputs are unchanged)"]
    caplog.clear()
    runner.run(y, {x: np.zeros(4, np.float32)})     # new input: the computation is reused
    assert [r.getMessage() for r in caplog.records] == \
        [f"run: reused the compiled computation of {y.name}"]


def test_silent_by_default():
    # A fresh interpreter that configures no logging: geon prints nothing, even for
    # work that logs at every level it uses.
    code = ("import logging, numpy as np, geon as be\n"
            "C = be.Axis(4, 'C'); x = be.placeholder(C, name='x'); y = be.tanh(x)\n"
            "be.run(y, {x: np.ones(4)}); be.run(y, {x: np.ones(4)})\n"
            "be.NumPyTransformer().computation(y, x)\n"
            "assert not logging.getLogger().handlers\n"
            "print('done')\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout == "done\n" and run.stderr == ""
    # ... and the same program with logging configured does print.
    run = subprocess.run([sys.executable, "-c", "import logging; "
                          "logging.basicConfig(level=logging.DEBUG)\n" + code],
                         capture_output=True, text=True)
    assert "geon.transformers.base:numpy: pass lower took" in run.stderr.replace("DEBUG:", "")
    assert "INFO:geon.transformers.base:numpy: built a computation" in run.stderr
    assert "DEBUG:geon.op_graph.run:run: reused the value of" in run.stderr
