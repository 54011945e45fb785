"""Callbacks run by :meth:`Model.fit`.

Each hook gets the model; ``logs`` is a dict of the latest numbers (``loss``,
``accuracy``, ``val_loss``, ``val_accuracy``, ``rate`` in steps per second, ``step``,
``epoch``). A callback may set ``model.stop_training = True`` to end ``fit`` after the
current epoch.
"""

import json
import os
from typing import TYPE_CHECKING, Any, Iterator, Optional, Union, overload

from geon.errors import ArgumentError
from geon.frontends.neon._api import Configurable, describe
from geon.op_graph.nodes import user_location
from geon.transformers import checkpoint

if TYPE_CHECKING:  # model.py imports this module
    from geon.frontends.neon.model import Model


class Callback(Configurable):
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

    def __init__(self, path: Union[str, os.PathLike[str]],
                 every_n_steps: Optional[int] = None, every_epoch: bool = True,
                 on_interrupt: bool = True) -> None:
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
        if mode not in ("min", "max"):
            raise ArgumentError(f"nn.EarlyStopping: mode must be 'min' (lower is better) "
                                f"or 'max', not {describe(mode)} (at {user_location()})")
        self.monitor, self.patience, self.min_delta = monitor, patience, min_delta
        self.sign = 1.0 if mode == "min" else -1.0
        self.best: Optional[float] = None
        self.wait = 0

    def on_epoch_end(self, model: "Model", epoch: int, logs: dict[str, Any]) -> None:
        if self.monitor not in logs:
            raise ArgumentError(
                f"nn.EarlyStopping: monitor {self.monitor!r} is not in the epoch's logs, "
                f"which hold {', '.join(k for k in logs if k not in BOOKKEEPING)}"
                + ("; the val_ metrics need fit(..., validation_data=(x, y)) or "
                   "validation_split=" if self.monitor.startswith("val_") else "")
                + f" (at {user_location()})")
        value = self.sign * logs[self.monitor]
        if self.best is None or value < self.best - self.min_delta:
            self.best, self.wait = value, 0
        else:
            self.wait += 1
            if self.wait >= self.patience:
                model.stop_training = True


#: Keys of the logs that are bookkeeping, not metrics: left out of
#: :attr:`History.history`.
BOOKKEEPING = ("epoch", "step", "rate")


class History(Callback):
    """What :meth:`Model.fit` returns, as Keras's ``History``: ``history`` is
    ``{metric: [value of each epoch]}`` (``loss``, ``accuracy``, ``val_loss``,
    ``val_accuracy``) and ``epoch`` the epochs' numbers counted from 0 (as Keras's;
    a resumed run's continue from where the model stood). Indexing and iterating
    give each epoch's full logs (with ``epoch`` counted from 1, ``step`` and ``rate``
    in steps per second), so ``history[-1]["loss"]`` and ``len(history)`` work as on
    the list ``fit`` returned before. :meth:`plot` draws the curves."""

    def __init__(self) -> None:
        self.logs: list[dict[str, Any]] = []
        self.history: dict[str, list[float]] = {}
        self.epoch: list[int] = []

    def on_epoch_end(self, model: "Model", epoch: int, logs: dict[str, Any]) -> None:
        self.logs.append(dict(logs))
        self.epoch.append(epoch - 1)
        for k, v in logs.items():
            if k not in BOOKKEEPING:
                self.history.setdefault(k, []).append(v)

    @overload
    def __getitem__(self, i: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, i: slice) -> list[dict[str, Any]]: ...

    def __getitem__(self, i: Union[int, slice]) -> Any:
        if isinstance(i, str):
            raise ArgumentError(f"History[{i!r}]: index a History by epoch "
                                f"(history[-1]); the metrics by name are in "
                                f"history.history[{i!r}] (at {user_location()})")
        return self.logs[i]

    def __len__(self) -> int:
        return len(self.logs)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.logs)

    def __repr__(self) -> str:
        """A table: a row per metric, a column per epoch (the first and last three of
        more than eight, with ``...`` between)."""
        if not self.logs:
            return "History(no epochs)"
        first, last = self.logs[0].get("epoch"), self.logs[-1].get("epoch")
        span = f"epoch {first}" if first == last else f"epochs {first}-{last}"
        keep = list(range(len(self.logs)))
        if len(keep) > 8:
            keep = keep[:3] + [-1] + keep[-3:]
        rows = [("epoch", [str(e + 1) for e in self.epoch])]
        rows += [(k, [f"{v:.4f}" for v in vs]) for k, vs in self.history.items()]
        width = max(len(k) for k, _ in rows)
        lines = [f"  {k:<{width}}" + "".join("     ..." if i < 0 else f" {vs[i]:>7}"
                                              for i in keep)
                 for k, vs in rows]
        return f"History({span}:\n" + "\n".join(lines) + ")"

    def plot(self, path: Union[str, os.PathLike[str], None] = None,
             title: Optional[str] = None) -> Any:
        """The training curves (loss and accuracy, training and validation, per
        epoch) as a ``matplotlib.figure.Figure``, written to ``path`` if given (PNG for
        ``.png``). Needs matplotlib (``pip install matplotlib``)."""
        from geon.frontends.neon.plot import plot_logs
        return plot_logs(self.logs, path, title, what="History.plot")


class MetricsLog(Callback):
    """The logs of every epoch, kept in ``self.history`` (a list of dicts) and, with
    ``path``, written there as a JSON list after each epoch (as checkpoints are:
    atomically, with the permissions of any new file; in a data-parallel job by rank 0
    only, the logs being the same on every rank). :meth:`plot` draws the curves."""

    def __init__(self, path: Union[str, os.PathLike[str], None] = None) -> None:
        self.path = path
        self.history: list[dict[str, Any]] = []

    def on_epoch_end(self, model: "Model", epoch: int, logs: dict[str, Any]) -> None:
        self.history.append(dict(logs))
        if self.path is not None and getattr(model, "rank", 0) == 0:
            write_json(self.path, self.history)

    def plot(self, path: Union[str, os.PathLike[str], None] = None,
             title: Optional[str] = None) -> Any:
        """As :meth:`History.plot`, for the epochs logged so far."""
        from geon.frontends.neon.plot import plot_logs
        return plot_logs(self.history, path, title, what="MetricsLog.plot")


def write_json(path: Union[str, os.PathLike[str]], value: Any) -> None:
    """Write ``value`` as JSON to ``path`` as checkpoints are written
    (:mod:`geon.transformers.checkpoint`): a temporary file beside it, created with
    the process's umask like any new file, flushed and fsynced, then renamed over
    ``path``, so a reader never sees a partial file and the permissions are those of
    the ``.npz`` checkpoints."""
    text = json.dumps(value, indent=1).encode("utf-8")
    checkpoint.write_atomically(path, lambda f: f.write(text))
