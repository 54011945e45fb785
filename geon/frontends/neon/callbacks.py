"""Callbacks run by :meth:`Model.fit`.

Each hook gets the model; ``logs`` is a dict of the latest numbers (``loss``,
``accuracy``, ``val_loss``, ``val_accuracy``, ``rate`` in steps per second, ``step``,
``epoch``). A callback may set ``model.stop_training = True`` to end ``fit`` after the
current epoch.
"""

import json
import os
import tempfile


class Callback:
    """Base class: every hook does nothing."""

    def on_train_begin(self, model):
        pass

    def on_step_end(self, model, step, logs):
        """After update number ``step`` (counted over the whole run, resumes included)."""

    def on_epoch_end(self, model, epoch, logs):
        """After epoch number ``epoch`` (1-based, resumes included)."""

    def on_interrupt(self, model, step):
        """``fit`` was interrupted (SIGINT / KeyboardInterrupt) after update ``step``."""

    def on_train_end(self, model):
        pass


class ModelCheckpoint(Callback):
    """``model.save(path)`` every ``every_n_steps`` updates (if given), at the end of
    every epoch (``every_epoch``) and when ``fit`` is interrupted (``on_interrupt``)."""

    def __init__(self, path, every_n_steps=None, every_epoch=True, on_interrupt=True):
        self.path, self.every_n_steps = path, every_n_steps
        self.every_epoch, self.interrupt = every_epoch, on_interrupt

    def on_step_end(self, model, step, logs):
        if self.every_n_steps and step % self.every_n_steps == 0:
            model.save(self.path)

    def on_epoch_end(self, model, epoch, logs):
        if self.every_epoch:
            model.save(self.path)

    def on_interrupt(self, model, step):
        if self.interrupt:
            model.save(self.path)


class EarlyStopping(Callback):
    """Stop when ``monitor`` (default ``val_loss``; lower is better unless
    ``mode="max"``) has not improved by more than ``min_delta`` for ``patience``
    epochs."""

    def __init__(self, monitor="val_loss", patience=3, min_delta=0.0, mode="min"):
        self.monitor, self.patience, self.min_delta = monitor, patience, min_delta
        self.sign = 1.0 if mode == "min" else -1.0
        self.best, self.wait = None, 0

    def on_epoch_end(self, model, epoch, logs):
        value = self.sign * logs[self.monitor]
        if self.best is None or value < self.best - self.min_delta:
            self.best, self.wait = value, 0
        else:
            self.wait += 1
            if self.wait >= self.patience:
                model.stop_training = True


class MetricsLog(Callback):
    """The logs of every epoch, kept in ``self.history`` and, with ``path``, written
    there as a JSON list after each epoch (atomically: temporary file and rename; in a
    data-parallel job by rank 0 only, the logs being the same on every rank)."""

    def __init__(self, path=None):
        self.path, self.history = path, []

    def on_epoch_end(self, model, epoch, logs):
        self.history.append(dict(logs))
        if self.path is not None and getattr(model, "rank", 0) == 0:
            write_json(self.path, self.history)


def write_json(path, value):
    """Write ``value`` as JSON to ``path`` atomically (temporary file in the same
    folder, fsync, rename), so a reader never sees a partial file."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(value, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
