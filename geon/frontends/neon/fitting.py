"""The training loop behind :meth:`Model.fit <geon.frontends.neon.Model.fit>`: its
arguments checked, the data made an :class:`ArrayIterator`, and the epochs run with
their callbacks, progress and Ctrl-C handling."""

import signal
import threading
import time
from typing import IO, TYPE_CHECKING, Any, Callable, NamedTuple, Optional, Sequence, Union

import numpy as np

from geon.errors import ArgumentError
from geon.frontends.neon._api import check_count, describe, is_int, public_name
from geon.frontends.neon.callbacks import Callback, History
from geon.frontends.neon.data import ArrayIterator
from geon.frontends.neon.progress import Progress, clock, make_progress
from geon.op_graph.nodes import user_location
from geon.transformers.base import Computation

if TYPE_CHECKING:
    from geon.frontends.neon.model import Model


class _Run(NamedTuple):
    """What one ``fit`` call trains on and reports to."""
    data: ArrayIterator
    validation_data: Optional[tuple[np.ndarray, np.ndarray]]
    comp: Computation[tuple[Any, ...]]
    progress: Any
    callbacks: list[Callback]
    first: int   # the epoch the model stands in
    last: int    # the epoch after the last to run


def fit(model: "Model", x: Any, y: Any, *, epochs: int, batch_size: Optional[int],
        verbose: Union[bool, int, str], callbacks: Sequence[Callback],
        validation_split: float, validation_data: Optional[tuple[Any, Any]],
        shuffle: Optional[bool], initial_epoch: Optional[int], seed: int,
        stream: Optional[IO[str]]) -> History:
    """``model.fit(...)``: see its docstring."""
    run = _prepare(model, x, y, epochs, batch_size, verbose, callbacks, validation_split,
                   validation_data, shuffle, initial_epoch, seed, stream)
    history = History()
    callbacks = [history] + run.callbacks
    step = model.step
    model.stop_training = False
    interrupted: list[int] = []  # the signal numbers caught
    restore_handler = catch_sigint(interrupted)
    try:
        for cb in callbacks:
            cb.on_train_begin(model)
        for epoch in range(run.first, run.last):
            step = _epoch(model, run, callbacks, epoch, step, interrupted)
            if model.stop_training:
                break
    except KeyboardInterrupt:
        for cb in callbacks:
            cb.on_interrupt(model, step)
        raise
    finally:
        restore_handler()
    for cb in callbacks:
        cb.on_train_end(model)
    return history


def _prepare(model: "Model", x: Any, y: Any, epochs: int, batch_size: Optional[int],
             verbose: Union[bool, int, str], callbacks: Sequence[Callback],
             validation_split: float, validation_data: Optional[tuple[Any, Any]],
             shuffle: Optional[bool], initial_epoch: Optional[int], seed: int,
             stream: Optional[IO[str]]) -> _Run:
    """``fit``'s arguments checked, its data and computation ready."""
    epochs = check_count("Model.fit", "epochs", epochs, minimum=0)
    if initial_epoch is not None:
        initial_epoch = check_count("Model.fit", "initial_epoch", initial_epoch, 0)
    level = verbosity(verbose, "fit")
    checked_callbacks = callback_list(callbacks)
    if not is_int(seed):
        raise ArgumentError(f"Model.fit: seed must be an integer, not {describe(seed)} "
                            f"(at {user_location()})")
    if not (isinstance(validation_split, (float, int, np.floating))
            and 0 <= validation_split < 1):
        raise ArgumentError(f"Model.fit: validation_split must be a fraction in [0, 1), "
                            f"not {describe(validation_split)} (at {user_location()})")
    if validation_split and validation_data is not None:
        raise ArgumentError(f"Model.fit: give validation_data or validation_split, not "
                            f"both (at {user_location()})")
    data = training_data(model, x, y, batch_size, shuffle, seed, validation_split)
    if isinstance(data, tuple):
        data, validation_data = data
    if validation_data is not None:
        if not (isinstance(validation_data, (tuple, list)) and len(validation_data) == 2):
            raise ArgumentError(f"Model.fit: validation_data must be a pair (x_val, "
                                f"y_val), not {describe(validation_data)} (at "
                                f"{user_location()})")
        vx, _ = model._as_inputs(validation_data[0], "fit (validation_data)")
        validation_data = (vx, model._as_targets(validation_data[1], len(vx),
                                                 "fit (validation_data)"))
    model._check_labels(data.y, "fit")
    if model.data_parallel:
        if data.ranks == 1 and model.ranks > 1:
            data = data.shard(model.rank, model.ranks)
        if not model._synced:
            model.sync()
    comp = model.train_computation(data.batch_size)
    chief = model.rank == 0
    if level == 2:   # one line per epoch, on a terminal too
        progress: Any = Progress(stream, enabled=chief)
        progress.tty = False
    else:
        progress = make_progress(stream, enabled=bool(level) and chief)
    spe = data.steps_per_epoch
    step = model.step
    first = step // spe
    if initial_epoch is not None and initial_epoch != first:
        raise ArgumentError(
            f"Model.fit: initial_epoch={initial_epoch} but the model stands in epoch "
            f"{first} ({step} update{'s' * (step != 1)} made, {spe} per epoch): fit "
            f"continues from the model's update counter; restore the checkpoint saved "
            f"after epoch {initial_epoch} first, or leave initial_epoch out (at "
            f"{user_location()})")
    last = first + epochs if initial_epoch is None else max(epochs, first)
    return _Run(data, validation_data, comp, progress, checked_callbacks, first, last)


def _epoch(model: "Model", run: _Run, callbacks: list[Callback], epoch: int, step: int,
           interrupted: list[int]) -> int:
    """Run epoch ``epoch`` (from the update counter ``step`` on, so an epoch
    interrupted part way is finished) with its callbacks and report; returns the
    update counter after it."""
    data, spe, last = run.data, run.data.steps_per_epoch, run.last
    start_time, total, right, seen = time.perf_counter(), 0.0, 0.0, 0
    samples = 0
    for xb, yb in data.epoch(epoch, step - epoch * spe):
        # (yb is None for an ArrayIterator without targets: the call's FeedError says
        # what is missing); the remainder kept at an epoch's end has a step of its size
        comp = run.comp if len(xb) == data.batch_size else model.train_computation(len(xb))
        loss, count = comp(xb.astype(model.dtype, copy=False),
                           yb)[:2]  # type: ignore[arg-type]
        step += 1
        total += float(loss) * len(xb)  # (an epoch's loss: the mean over its samples)
        right += float(count)
        seen += 1
        samples += len(xb)
        rate = seen / (time.perf_counter() - start_time)
        logs: dict[str, Any] = {"loss": float(loss), "step": step, "rate": rate}
        run.progress.update(f"epoch {epoch + 1}/{last}", step - epoch * spe, spe,
                            f"loss {float(loss):.4f}", rate=rate)
        for cb in callbacks:
            cb.on_step_end(model, step, logs)
        if interrupted:
            raise KeyboardInterrupt
    logs = {"epoch": epoch + 1, "step": step,
            "loss": total / samples if seen else float("nan"),
            "rate": seen / (time.perf_counter() - start_time) if seen else 0.0}
    if model.loss_kind == "cross_entropy" and seen:
        logs["accuracy"] = right / samples
    if run.validation_data is not None:
        val = model.evaluate(*run.validation_data)
        logs.update({f"val_{k}": v for k, v in val.items()})
    left = last - epoch - 1   # epochs still to run
    eta = f", ETA {clock(left * spe / logs['rate'])}" if left and logs["rate"] else ""
    run.progress.done(f"epoch {epoch + 1}/{last}: " + ", ".join(
        f"{k} {v:.1f} steps/s" if k == "rate" else f"{k} {v:.4f}"
        for k, v in logs.items() if k not in ("epoch", "step")) + eta)
    for cb in callbacks:
        cb.on_epoch_end(model, epoch + 1, logs)
    return step


def training_data(model: "Model", x: Any, y: Any, batch_size: Optional[int],
                  shuffle: Optional[bool], seed: int, validation_split: float
                  ) -> Union[ArrayIterator,
                             tuple[ArrayIterator, tuple[np.ndarray, np.ndarray]]]:
    """The :class:`ArrayIterator` that ``fit``'s data arguments give, or
    ``(iterator, validation data)`` with a ``validation_split``."""
    if x is None:
        raise ArgumentError(f"Model.fit: no training data: give fit(x, y, ...) (or the "
                            f"pair fit((x, y), ...), or an ArrayIterator) (at "
                            f"{user_location()})")
    if isinstance(x, ArrayIterator):
        for name, value, its in (("y", y, None), ("batch_size", batch_size, x.batch_size),
                                 ("shuffle", shuffle, x.shuffle)):
            if value is not None and value != its:
                raise ArgumentError(
                    f"Model.fit: {name}={value!r} with an ArrayIterator, which has its "
                    f"own ({name}={its!r}); give arrays fit(x, y, {name}=...) or make "
                    f"the iterator with it (at {user_location()})")
        if validation_split:
            raise ArgumentError(f"Model.fit: validation_split needs arrays "
                                f"fit(x, y, ...), not an ArrayIterator; give "
                                f"validation_data=(x_val, y_val) (at {user_location()})")
        model._as_inputs(x.x, "fit")
        return x
    if y is None:
        if isinstance(x, (tuple, list)) and len(x) == 2:
            x, y = x                     # fit((x, y), ...)
        else:
            raise ArgumentError(f"Model.fit: no targets: give fit(x, y, ...) or the "
                                f"pair fit((x, y), ...) (at {user_location()})")
    elif is_int(y):
        raise ArgumentError(f"Model.fit: y is {describe(y)}; the targets are an array "
                            f"(for the number of epochs, write epochs={y}) (at "
                            f"{user_location()})")
    x, _ = model._as_inputs(x, "fit")
    y = model._as_targets(y, len(x), "fit")
    b = model._batch_size(batch_size, "fit", model.batch_size)
    val = None
    if validation_split:
        split_at = int(len(x) * (1 - validation_split))
        if not 0 < split_at < len(x):
            raise ArgumentError(f"Model.fit: validation_split={validation_split} of "
                                f"{len(x)} samples leaves "
                                f"{'no' if split_at == len(x) else 'every'} sample for "
                                f"validation (at {user_location()})")
        x, y, val = x[:split_at], y[:split_at], (x[split_at:], y[split_at:])
    if b > len(x):
        raise ArgumentError(f"Model.fit: batch_size={b} is more than the {len(x)} "
                            f"training samples (at {user_location()})")
    # (data-parallel: every rank's batch has b samples, so the remainder is left out)
    data = ArrayIterator(x, y, b, shuffle=True if shuffle is None else bool(shuffle),
                         seed=seed, drop_remainder=model.data_parallel and model.ranks > 1)
    return data if val is None else (data, val)


def catch_sigint(flag: list[int]) -> Callable[[], Any]:
    """Turn SIGINT into a flag checked between updates (so an update is never cut
    in half); returns the function that puts the previous handler back."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, lambda signum, frame: flag.append(signum))
    return lambda: signal.signal(signal.SIGINT, previous)


def callback_list(value: Any) -> list[Callback]:
    """``fit``'s callbacks as a list, each checked to be a :class:`Callback`."""
    if isinstance(value, Callback):
        raise ArgumentError(f"Model.fit: callbacks must be a list of callbacks, not one "
                            f"callback: callbacks=[{value!r}] (at {user_location()})")
    try:
        items = list(value or ())
    except TypeError:
        raise ArgumentError(f"Model.fit: callbacks must be a list of callbacks, not "
                            f"{describe(value)} (at {user_location()})") from None
    for i, cb in enumerate(items):
        if not isinstance(cb, Callback):
            made = (f"; make one: {public_name(cb)}(...)"
                    if isinstance(cb, type) and issubclass(cb, Callback) else "")
            raise ArgumentError(f"Model.fit: callbacks[{i}] is {describe(cb)}, not a "
                                f"callback (an nn.Callback){made} (at {user_location()})")
    return items


def verbosity(value: Any, what: str) -> int:
    """Keras's ``verbose``: 0 (or False) silent, 1 (True, ``"auto"``) a progress bar, 2
    one line per epoch."""
    if value == "auto":
        return 1
    if isinstance(value, (bool, np.bool_)) or (is_int(value) and value in (0, 1, 2)):
        return int(value)
    raise ArgumentError(f"Model.{what}: verbose must be True, False, 0, 1, 2 or 'auto', not "
                        f"{describe(value)} (at {user_location()})")
