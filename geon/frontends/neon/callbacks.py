"""Callbacks run by :meth:`Model.fit`.

Each hook gets the model; ``logs`` is a dict of the latest numbers (``loss``,
``accuracy``, ``val_loss``, ``val_accuracy``, ``rate`` in steps per second, ``step``,
``epoch``). A callback may set ``model.stop_training = True`` to end ``fit`` after the
current epoch.
"""

import json
import os
import tempfile
from typing import TYPE_CHECKING, Any, Optional, Union

if TYPE_CHECKING:  # model.py imports this module
    from geon.frontends.neon.model import Model


class Callback:
    """Base class: every hook does nothing."""

    def on_train_begin(self, model: "Model") -> None:
        """Before the first update of ``fit``."""

    def on_step_end(self, model: "Model", step: int, logs: dict[str, Any]) -> None:
        """After update number ``step`` (counted over the whole run, resumes included)."""

    def on_epoch_end(self, model: "Model", epoch: int, logs: dict[str, Any]) -> None:
        """After epoch number ``epoch`` (1-based, resumes included)."""

    def on_interrupt(self, model: "Model", step: int) -> None:
        """``fit`` was interrupted (SIGINT / KeyboardInterrupt) after update ``step``."""

    def on_train_end(self, model: "Model") -> None:
        """After the last update of ``fit``."""


class ModelCheckpoint(Callback):
    """``model.save(path)`` every ``every_n_steps`` updates (if given), at the end of
    every epoch (``every_epoch``) and when ``fit`` is interrupted (``on_interrupt``)."""

    def __init__(self, path: Union[str, os.PathLike], every_n_steps: Optional[int] = None,
                 every_epoch: bool = True, on_interrupt: bool = True) -> None:
        self.path, self.every_n_steps = path, every_n_steps
        self.every_epoch, self.interrupt = every_epoch, on_interrupt

    def on_step_end(self, model: "Model", step: int, logs: dict[str, Any]) -> None:
        if self.every_n_steps and step % self.every_n_steps == 0:
            model.save(self.path)

    def on_epoch_end(self, model: "Model", epoch: int, logs: dict[str, Any]) -> None:
        if self.every_epoch:
            model.save(self.path)

    def on_interrupt(self, model: "Model", step: int) -> None:
        if self.interrupt:
            model.save(self.path)


class EarlyStopping(Callback):
    """Stop when ``monitor`` (default ``val_loss``; lower is better unless
    ``mode="max"``) has not improved by more than ``min_delta`` for ``patience``
    epochs."""

    def __init__(self, monitor: str = "val_loss", patience: int = 3, min_delta: float = 0.0,
                 mode: str = "min") -> None:
        self.monitor, self.patience, self.min_delta = monitor, patience, min_delta
        self.sign = 1.0 if mode == "min" else -1.0
        self.best: Optional[float] = None
        self.wait = 0

    def on_epoch_end(self, model: "Model", epoch: int, logs: dict[str, Any]) -> None:
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

    def __init__(self, path: Union[str, os.PathLike, None] = None) -> None:
        self.path = path
        self.history: list[dict[str, Any]] = []

    def on_epoch_end(self, model: "Model", epoch: int, logs: dict[str, Any]) -> None:
        self.history.append(dict(logs))
        if self.path is not None and getattr(model, "rank", 0) == 0:
            write_json(self.path, self.history)


def write_json(path: Union[str, os.PathLike], value: Any) -> None:
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
