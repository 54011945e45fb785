"""A :class:`Model`: a network, a loss and an optimizer, compiled into one training
computation and inference computations that share the weights."""

import os
import signal
import threading
import time
from typing import IO, Any, Iterable, Optional, Sequence, Union

import numpy as np

import geon as be
from geon.errors import ArgumentError
from geon.frontends.neon.callbacks import Callback
from geon.frontends.neon.data import ArrayIterator
from geon.frontends.neon.layers import Layer
from geon.frontends.neon.optimizers import SGD, Optimizer
from geon.frontends.neon.progress import clock, make_progress
from geon.op_graph import op_graph as og
from geon.op_graph.domains import DomainError
from geon.op_graph.axes import Axis
from geon.op_graph.nodes import user_location
from geon.transformers.base import Computation, Transformer


class Model:
    """Train and run ``net`` (a layer, e.g. :class:`~geon.frontends.neon.Sequential`).

    Args:
        net: a layer mapping the input to the output op.
        input_axes: the axes of one sample (a batch axis ``N`` is put first); the
            arrays given to :meth:`fit` / :meth:`predict` have shape
            ``(n, *lengths)``.
        loss: ``"cross_entropy"`` (the output has one sample axis, the classes; the
            targets are integer labels; the output is read as logits, and ``accuracy``
            is reported) or ``"mse"`` (the targets have the output's shape).
        optimizer: default ``SGD(0.01)``.
        batch_size: of the training computation built now (:meth:`fit` builds another
            for another batch size); inference runs in batches of
            ``eval_batch_size`` (default: ``batch_size``), the last one padded.
        transformer: a transformer name (``"numpy"``, ``"gpu"``, ...) or instance.
        dtype: of the input placeholder.
        data_parallel: train on every rank of an MPI job (``mpirun -n N``; see
            doc/distributed.rst): ``batch_size`` is then each rank's *local* batch and
            a step trains on ``N * batch_size`` samples. Needs ``geon.distributed``
            (``mpi4py``); it calls ``geon.distributed.init`` unless that was done.
            Without ``mpirun`` the job is one rank.

    The training computation returns the loss and applies the optimizer's updates
    and the layers' (BatchNorm's running averages). The inference ones
    (``predict``, ``evaluate``) read the same Variables and never assign any.

    Data-parallel training (``data_parallel=True``) is what one process would do with
    the global batch: each rank reads its own block of every global batch
    (:meth:`ArrayIterator.shard`); the gradients, the BatchNorm running averages and
    the reported loss and accuracy are averaged over the ranks by one bucketed
    allreduce per step; :meth:`fit` first broadcasts every Variable from rank 0, so
    the ranks start identical and stay so. Only rank 0 prints progress and writes
    checkpoints (:meth:`save`; every rank reads them in :meth:`restore`);
    :meth:`evaluate` splits the data over the ranks and sums their results.
    Differences from one process: BatchNorm normalizes with each rank's local batch
    statistics, and a Dropout layer draws the same masks on every rank.
    """

    def __init__(self, net: Layer, input_axes: Union[Axis, Iterable[Axis]],
                 loss: str = "cross_entropy", optimizer: Optional[Optimizer] = None,
                 batch_size: int = 32, eval_batch_size: Optional[int] = None,
                 transformer: Union[str, Transformer] = "numpy",
                 dtype: og.DTypeLike = np.float32, data_parallel: bool = False) -> None:
        if loss not in ("cross_entropy", "mse"):
            raise ArgumentError(f"Model: loss must be 'cross_entropy' or 'mse', not {loss!r} "
                                f"(at {user_location()})")
        self.net, self.loss_kind = net, loss
        self.input_axes = tuple(be.Axes(*input_axes) if not isinstance(input_axes, be.Axis)
                                else be.Axes(input_axes))
        self.optimizer = optimizer or SGD(0.01)
        self.dtype = dtype
        self.transformer: Transformer = (
            be.make_transformer(transformer) if isinstance(transformer, str) else transformer)
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.stop_training = False
        self._train: dict[int, Computation] = {}
        self._predict: dict[int, Computation] = {}
        self._eval: dict[int, Computation] = {}
        self.data_parallel, self._synced = bool(data_parallel), False
        if self.data_parallel:
            import geon.distributed as gd  # raises MPIUnavailableError without mpi4py
            from geon.op_graph.collectives import SingleProcess, collectives
            if isinstance(collectives(), SingleProcess):
                gd.init()
            self._gd = gd
        self.train_computation(batch_size)            # makes every Variable
        self._step = self.transformer.computation(be.value_of(self.optimizer.step))

    # -- graphs ------------------------------------------------------------------------
    def _inputs(self, batch_size, tag):
        # One name, one axis in a graph (serialization relies on it): N for the
        # training batch (N<size> for another size), E for the inference batch.
        name = ("N" if batch_size == self.batch_size else f"N{batch_size}") \
            if tag == "train" else "E"
        N = be.Axis(batch_size, name=name, batch=True)
        x = be.placeholder(be.Axes(N, *self.input_axes), dtype=self.dtype, name=f"x_{tag}")
        return N, x

    def _target(self, N, out, tag):
        if self.loss_kind == "cross_entropy":  # class labels: 0 <= y < classes
            self._class_axis = self._classes(out)
            return be.placeholder(N, dtype=np.int64, name=f"labels_{tag}",
                                  domain=self._class_axis.length)
        return be.placeholder(be.Axes(N, *out.axes.sample_axes(), *out.axes.recurrent_axes()),
                              dtype=out.dtype, name=f"targets_{tag}")

    def _check_labels(self, y, what):
        """A :class:`DomainError` naming the first label of ``y`` (the whole data set,
        before it is cut into batches) that is not a class of the output: an
        out-of-range label would one-hot to zeros and train with a loss of 0."""
        if self.loss_kind != "cross_entropy" or y is None:
            return
        y = np.asarray(y)
        Y = self._class_axis  # (set when __init__ built the training computation)
        n = Y.length
        if y.dtype.kind not in "iu" or not y.size:
            return  # (the feed's conversion says what is wrong with other types)
        bad = (y < 0) | (y >= n)
        if bad.any():
            k = int(np.argmax(bad.reshape(-1)))
            pos = np.unravel_index(k, y.shape)
            more = int(np.count_nonzero(bad)) - 1
            raise DomainError(
                f"Model.{what}: label {y.reshape(-1)[k].item()} at y[{', '.join(map(str, pos))}]"
                f" is not a class of the output axis {Y.name}:{n} (0 <= label < {n})"
                + (f"; {more} more label(s) are out of range too" if more else "")
                + f" (at {user_location()})", value=y.reshape(-1)[k].item(),
                position=tuple(int(p) for p in pos))

    def _classes(self, out):
        classes = out.axes.sample_axes()
        if len(classes) != 1:
            raise ArgumentError(f"Model: the cross-entropy loss needs an output with one "
                                f"sample axis (the classes), not {out.axes!r} (at "
                                f"{user_location()})")
        return classes[0]

    def _per_sample(self, out, target, N):
        """(per-sample loss over N, per-sample correctness or None)."""
        if self.loss_kind == "cross_entropy":
            Y = self._classes(out)
            logp = be.log_softmax(out, Y)
            nll = -be.sum(logp * be.one_hot(target, Y), reduction_axes=Y)
            correct = be.equal(be.argmax(out, reduction_axes=Y), target)
            return nll, correct
        err = be.square(out - target)
        return be.sum(err, out_axes=be.Axes(N)), None

    def train_computation(self, batch_size: int) -> Computation:
        """The training computation for ``batch_size`` (built once per size):
        ``(x, targets) -> (loss, correct count or NaN, *updates)``."""
        if batch_size not in self._train:
            N, x = self._inputs(batch_size, "train")
            out = self.net(x, training=True)
            target = self._target(N, out, "train")
            per, correct = self._per_sample(out, target, N)
            loss = be.mean(per, out_axes=())
            count = be.sum(correct, out_axes=()) if correct is not None else be.constant(-1.0)
            params = [v for v in self.net.variables if v.trainable]
            layer_updates = self.net.pop_updates()
            if self.data_parallel:
                opt_updates, loss, count, layer_updates = self._data_parallel_updates(
                    loss, count, layer_updates, params)
            else:
                opt_updates = self.optimizer.updates(loss, params)
            updates = layer_updates + opt_updates
            self._train[batch_size] = self.transformer.computation(
                [loss, count] + updates, x, target)
        return self._train[batch_size]

    def _data_parallel_updates(self, loss, count, layer_updates, params):
        """``(optimizer updates, loss, count, layer updates)`` of a data-parallel step:
        the gradients, the loss, the correct count and the values the layers assign
        (BatchNorm's running averages) averaged over the ranks, all in the gradients'
        buckets (one allreduce per step while they fit in one)."""
        values = [u.args[1] for u in layer_updates]
        if count.dtype != loss.dtype:  # in the loss's bucket (float64: exact counts)
            count = count * be.constant(1.0, dtype=loss.dtype)
        extra = [loss, count] + values
        averaged = []

        def average(grads):
            grads = list(grads)
            out = self._gd.average_gradients(grads + extra)
            averaged.extend(out[len(grads):])
            return out[:len(grads)]

        updates = self.optimizer.updates(loss, params, average=average)
        loss, count, *values = averaged
        return updates, loss, count, [_replace_assignment(u, v)
                                      for u, v in zip(layer_updates, values)]

    def _predict_computation(self):
        b = self.eval_batch_size
        if b not in self._predict:
            _, x = self._inputs(b, "predict")
            out = self.net(x, training=False)
            batch = out.axes.batch_axes()
            out = be.axes_with_order(out, batch + (out.axes - batch))  # batch first
            self._predict[b] = self.transformer.computation(out, x)
        return self._predict[b]

    def _eval_computation(self):
        b = self.eval_batch_size
        if b not in self._eval:
            N, x = self._inputs(b, "eval")
            out = self.net(x, training=False)
            target = self._target(N, out, "eval")
            per, correct = self._per_sample(out, target, N)
            self._eval[b] = self.transformer.computation(
                [per] + ([correct] if correct is not None else []), x, target)
        return self._eval[b]

    # -- state -------------------------------------------------------------------------
    @property
    def variables(self) -> list[og.Variable]:
        """The network's Variables, then the optimizer's."""
        return list(self.net.variables) + self.optimizer.variables

    @property
    def rank(self) -> int:
        """This process's rank in a data-parallel job (0 otherwise)."""
        return self._gd.world().rank if self.data_parallel else 0

    @property
    def ranks(self) -> int:
        """The number of ranks of a data-parallel job (1 otherwise)."""
        return self._gd.world().size if self.data_parallel else 1

    def sync(self) -> None:
        """Data-parallel: make every rank's Variables rank 0's (one bucketed broadcast;
        :meth:`fit` calls it before its first step). Every rank must call it."""
        if self.data_parallel:
            self._gd.sync_variables(self.transformer)
            self._synced = True

    @property
    def step(self) -> int:
        """The number of updates made so far (restored ones included)."""
        return int(self._step())

    def weights(self) -> dict[str, np.ndarray]:
        """``{name: copy of the array}`` of every Variable (initializing them if needed)."""
        self.transformer.initialize()
        return {v.name: self.transformer.state[v].copy() for v in self.variables}

    def save(self, path: Union[str, os.PathLike]) -> None:
        """Write every Variable (weights and optimizer state) to the checkpoint ``path``.
        Data-parallel: rank 0 writes it; every rank must call it, and returns once the
        file is written."""
        if self.data_parallel:
            self._gd.save(self.transformer, path)
        else:
            self.transformer.save(path)

    def restore(self, path: Union[str, os.PathLike]) -> None:
        """Read a checkpoint written by :meth:`save` of the same model (on every rank,
        when data-parallel: it holds no number of ranks, so a run of 2 ranks resumes on
        1 or 3)."""
        if self.data_parallel:
            self._gd.restore(self.transformer, path)
            self._synced = True   # every rank read the same file
        else:
            self.transformer.restore(path)

    # -- running -----------------------------------------------------------------------
    def _batches(self, x, y=None):
        """Fixed-size batches of ``x`` (and ``y``) in order, the last padded with
        copies of the first sample; yields ``(xb, yb, n_real)``."""
        b = self.eval_batch_size
        for i in range(0, len(x), b):
            xb = x[i:i + b]
            yb = None if y is None else y[i:i + b]
            n = len(xb)
            if n < b:
                xb = np.concatenate([xb, np.repeat(x[:1], b - n, axis=0)])
                if y is not None:
                    yb = np.concatenate([yb, np.repeat(y[:1], b - n, axis=0)])
            yield xb, yb, n

    def predict(self, x: Any) -> np.ndarray:
        """The network's output for ``x`` (shape ``(n, *input lengths)``), as an array
        with the batch first. Assigns no Variable."""
        x = np.asarray(x, dtype=self.dtype)
        comp = self._predict_computation()
        outs = []
        for xb, _, n in self._batches(x):
            outs.append(comp(xb)[:n])
        return np.concatenate(outs)

    def evaluate(self, x: Any, y: Any) -> dict[str, float]:
        """``{"loss": mean loss, "accuracy": fraction right}`` (accuracy with the
        cross-entropy loss only) on ``x``, ``y``. Assigns no Variable. Data-parallel:
        each rank evaluates its contiguous part of ``x`` and the sums are added over
        the ranks (every rank gets the result)."""
        x, y = np.asarray(x, dtype=self.dtype), np.asarray(y)
        self._check_labels(y, "evaluate")
        n_all = len(x)
        if self.data_parallel:
            if not self._synced:
                self.sync()
            lo, hi = (n_all * k // self.ranks for k in (self.rank, self.rank + 1))
            x, y = x[lo:hi], y[lo:hi]
        comp = self._eval_computation()
        total, right = 0.0, 0.0
        if len(x):
            for xb, yb, n in self._batches(x, y):
                res = comp(xb, yb)
                total += float(np.sum(res[0][:n]))
                if len(res) > 1:
                    right += float(np.sum(res[1][:n]))
        if self.data_parallel:
            sums = np.array([total, right])
            self._gd.collectives().allreduce(sums, sums, False)
            total, right = float(sums[0]), float(sums[1])
        logs = {"loss": total / n_all}
        if self.loss_kind == "cross_entropy":
            logs["accuracy"] = right / n_all
        return logs

    def fit(self, data: Union[ArrayIterator, tuple[Any, Any]], epochs: int = 1,
            batch_size: Optional[int] = None, validation_data: Optional[tuple[Any, Any]] = None,
            callbacks: Sequence[Callback] = (), verbose: bool = True, seed: int = 0,
            stream: Optional[IO[str]] = None) -> list[dict[str, Any]]:
        """Train for ``epochs`` epochs and return the list of each epoch's logs.

        ``data`` is an :class:`ArrayIterator` or a pair ``(x, y)`` (then shuffled with
        ``seed``, in batches of ``batch_size``, default the model's). Training resumes
        where the step counter stands: with ``s`` updates made and ``k`` per epoch, it
        runs from update ``s`` to the end of epoch ``s // k + epochs`` (an epoch
        interrupted part way counts as the first), in the order an uninterrupted run
        would have used. ``validation_data`` ``(x, y)`` is evaluated after each epoch.

        Data-parallel (``Model(..., data_parallel=True)``): every rank calls ``fit``
        with the same data; each reads its block of every global batch of
        ``ranks * batch_size`` samples (:meth:`ArrayIterator.shard`), the Variables are
        first broadcast from rank 0, the logs (loss, accuracy) are those of the global
        batches, and only rank 0 prints.

        SIGINT (Ctrl-C) during ``fit`` finishes the current update, runs the
        callbacks' ``on_interrupt`` (:class:`ModelCheckpoint` saves) and raises
        ``KeyboardInterrupt``.
        """
        if not isinstance(data, ArrayIterator):
            x, y = data
            data = ArrayIterator(x, y, batch_size or self.batch_size, seed=seed)
        self._check_labels(data.y, "fit")
        if self.data_parallel:
            if data.ranks == 1 and self.ranks > 1:
                data = data.shard(self.rank, self.ranks)
            if not self._synced:
                self.sync()
        comp = self.train_computation(data.batch_size)
        progress = make_progress(stream, enabled=verbose and self.rank == 0)
        spe = data.steps_per_epoch
        step = self.step
        first = step // spe
        history, logs = [], {}
        self.stop_training = False
        interrupted: list[int] = []  # the signal numbers caught
        restore_handler = self._catch_sigint(interrupted)
        try:
            for cb in callbacks:
                cb.on_train_begin(self)
            for epoch in range(first, first + epochs):
                start_time, total, right, seen = time.perf_counter(), 0.0, 0.0, 0
                for xb, yb in data.epoch(epoch, step - epoch * spe):
                    loss, count = comp(xb.astype(self.dtype, copy=False), yb)[:2]
                    step += 1
                    total += float(loss)
                    right += float(count)
                    seen += 1
                    rate = seen / (time.perf_counter() - start_time)
                    logs = {"loss": float(loss), "step": step, "rate": rate}
                    progress.update(f"epoch {epoch + 1}/{first + epochs}", step - epoch * spe,
                                    spe, f"loss {float(loss):.4f}", rate=rate)
                    for cb in callbacks:
                        cb.on_step_end(self, step, logs)
                    if interrupted:
                        raise KeyboardInterrupt
                logs = {"epoch": epoch + 1, "step": step,
                        "loss": total / seen if seen else float("nan"),
                        "rate": seen / (time.perf_counter() - start_time) if seen else 0.0}
                if self.loss_kind == "cross_entropy" and seen:
                    logs["accuracy"] = right / (seen * data.batch_size)
                if validation_data is not None:
                    val = self.evaluate(*validation_data)
                    logs.update({f"val_{k}": v for k, v in val.items()})
                history.append(logs)
                left = first + epochs - epoch - 1   # epochs still to run
                eta = f", ETA {clock(left * spe / logs['rate'])}" \
                    if left and logs["rate"] else ""
                progress.done(f"epoch {epoch + 1}/{first + epochs}: " + ", ".join(
                    f"{k} {v:.1f} steps/s" if k == "rate" else f"{k} {v:.4f}"
                    for k, v in logs.items() if k not in ("epoch", "step")) + eta)
                for cb in callbacks:
                    cb.on_epoch_end(self, epoch + 1, logs)
                if self.stop_training:
                    break
        except KeyboardInterrupt:
            for cb in callbacks:
                cb.on_interrupt(self, step)
            raise
        finally:
            restore_handler()
        for cb in callbacks:
            cb.on_train_end(self)
        return history

    @staticmethod
    def _catch_sigint(flag):
        """Turn SIGINT into a flag checked between updates (so an update is never cut
        in half); returns the function that puts the previous handler back."""
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        previous = signal.getsignal(signal.SIGINT)
        signal.signal(signal.SIGINT, lambda signum, frame: flag.append(signum))
        return lambda: signal.signal(signal.SIGINT, previous)


def _replace_assignment(old, value):
    """``SetItem(old's tensor, value)`` in place of the SetItem ``old`` (which is then
    never run): the new one is not ordered after ``old`` (as a SetItem built after
    another on the same tensor would be, which would make the computation run both)."""
    new = be.SetItem(old.args[0], value)
    new.other_deps.discard(old)
    old._dep_users.discard(new)
    return new
