"""A :class:`Model`: a network, a loss and an optimizer, compiled into one training
computation and inference computations that share the weights."""

import os
from typing import (IO, Any, Callable, Container, Iterable, Iterator, Optional, Sequence,
                    Union, cast, overload)

import numpy as np

import geon as be
from geon.errors import ArgumentError, FeedError, GeonError
from geon.frontends.neon._api import (check_count, checked, describe, fmt, is_int,
                                      public_name)
from geon.frontends.neon.callbacks import Callback, History
from geon.frontends.neon import fitting
from geon.frontends.neon.data import ArrayIterator
from geon.frontends.neon.layers import Layer, Sequential, end_trace, trace_calls
from geon.frontends.neon.optimizers import SGD, Adam, AdamW, Optimizer, RMSProp
from geon.op_graph import op_graph as og
from geon.op_graph.domains import DomainError
from geon.op_graph.axes import Axis
from geon.op_graph.nodes import user_location
from geon.transformers.base import Computation, Transformer

#: The optimizers ``Model(optimizer=...)`` takes by name, with their defaults.
OPTIMIZERS: dict[str, type[Optimizer]] = {"sgd": SGD, "adam": Adam, "adamw": AdamW,
                                          "rmsprop": RMSProp}

#: A computation of ``(loss, correct count, ...)`` (then ``None`` for each assignment):
#: the training and evaluation ones.
_Steps = Computation[tuple[Any, ...]]


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
        optimizer: an :class:`~geon.frontends.neon.Optimizer`, or the name of one with
            its defaults (``"sgd"``, ``"adam"``, ``"adamw"``, ``"rmsprop"``); default
            ``SGD(0.01)``.
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
    statistics, a Dropout layer draws the same masks on every rank, and on several
    ranks an epoch leaves out the samples that do not fill a global batch (one process
    trains on them as a last, smaller batch).
    """

    @checked("nn.Model")
    def __init__(self, net: Layer, input_axes: Union[Axis, Iterable[Axis]],
                 loss: str = "cross_entropy", optimizer: Union[Optimizer, str, None] = None,
                 batch_size: int = 32, eval_batch_size: Optional[int] = None,
                 transformer: Union[str, Transformer] = "numpy",
                 dtype: og.DTypeLike = np.float32, data_parallel: bool = False) -> None:
        if not isinstance(net, Layer):
            hint = (": put the layers in nn.Sequential([...])"
                    if isinstance(net, (list, tuple)) else
                    f"; make one: {public_name(net)}(...)"
                    if isinstance(net, type) and issubclass(net, Layer) else "")
            raise ArgumentError(f"nn.Model: net must be a layer, such as "
                                f"nn.Sequential([...]), not {describe(net)}{hint} (at "
                                f"{user_location()})")
        if loss not in ("cross_entropy", "mse"):
            raise ArgumentError(f"nn.Model: loss must be 'cross_entropy' or 'mse', not "
                                f"{describe(loss)} (at {user_location()})")
        self.net, self.loss_kind = net, loss
        self.input_axes = _input_axes(input_axes)
        self.optimizer = _optimizer(optimizer)
        self.dtype = dtype
        if not isinstance(transformer, str) and not hasattr(transformer, "computation"):
            raise ArgumentError(f"nn.Model: transformer must be a transformer's name (such "
                                f"as 'numpy' or 'gpu') or a Transformer, not "
                                f"{describe(transformer)} (at {user_location()})")
        self.transformer: Transformer = (
            be.make_transformer(transformer) if isinstance(transformer, str) else transformer)
        self.batch_size = check_count("nn.Model", "batch_size", batch_size)
        self.eval_batch_size = (self.batch_size if eval_batch_size is None else
                                check_count("nn.Model", "eval_batch_size", eval_batch_size))
        self.stop_training = False
        self._train: dict[int, _Steps] = {}
        self._updates_built: set[og.Op] = set()   # the training computations' updates
        self._predict: dict[int, Computation[np.ndarray]] = {}
        #: "predict" / "eval" -> the computation over a symbolic batch, or None where a
        #: fixed batch is needed (see _any_batch)
        self._any: dict[str, Any] = {}
        self._eval: dict[int, _Steps] = {}
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
    def _inputs(self, batch_size: Union[int, Axis], tag: str) -> tuple[Axis, og.Placeholder]:
        # One name, one axis in a graph (serialization relies on it): N for the
        # training batch, E for the inference batch (N<size>, E<size> for other sizes).
        # (An Axis: that batch axis, e.g. a symbolic one.)
        if isinstance(batch_size, Axis):
            N = batch_size
        else:
            if tag == "train":
                name = "N" if batch_size == self.batch_size else f"N{batch_size}"
            else:
                name = "E" if batch_size == self.eval_batch_size else f"E{batch_size}"
            N = be.Axis(batch_size, name=name, batch=True)
        x = be.placeholder(be.Axes(N, *self.input_axes), dtype=self.dtype, name=f"x_{tag}")
        return N, x

    def _target(self, N: Axis, out: og.TensorOp, tag: str) -> og.Placeholder:
        if self.loss_kind == "cross_entropy":  # class labels: 0 <= y < classes
            self._class_axis = self._classes(out)
            labels: og.Placeholder = be.placeholder(
                N, dtype=np.int64, name=f"labels_{tag}", domain=self._class_axis.length)
            return labels
        target: og.Placeholder = be.placeholder(
            be.Axes(N, *out.axes.sample_axes(), *out.axes.recurrent_axes()),
            dtype=out.dtype, name=f"targets_{tag}")
        self._target_axes = target.axes[1:]
        return target

    def _check_labels(self, y: Optional[np.ndarray], what: str) -> None:
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

    def _classes(self, out: og.TensorOp) -> Axis:
        classes = out.axes.sample_axes()
        if len(classes) != 1:
            raise ArgumentError(f"Model: the cross-entropy loss needs an output with one "
                                f"sample axis (the classes), not {out.axes!r} (at "
                                f"{user_location()})")
        axis: Axis = classes[0]
        return axis

    def _per_sample(self, out: og.TensorOp, target: og.TensorOp, N: Axis
                    ) -> tuple[og.TensorOp, Optional[og.TensorOp]]:
        """(per-sample loss over N, per-sample correctness or None)."""
        if self.loss_kind == "cross_entropy":
            Y = self._classes(out)
            logp = be.log_softmax(out, Y)
            nll = -be.sum(logp * be.one_hot(target, Y), reduction_axes=Y)
            correct = be.equal(be.argmax(out, reduction_axes=Y), target)
            return nll, correct
        err = be.square(out - target)
        return be.sum(err, out_axes=be.Axes(N)), None

    def train_computation(self, batch_size: int) -> Computation[tuple[Any, ...]]:
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
            built = _unchain([loss, count] + updates, self._updates_built)
            self._updates_built.update(op for op in built if isinstance(op, og.VoidOp))
            self._train[batch_size] = self.transformer.computation(
                [loss, count] + updates, x, target)
        return self._train[batch_size]

    def _data_parallel_updates(self, loss: og.TensorOp, count: og.TensorOp,
                               layer_updates: list[og.Op], params: list[og.Variable]
                               ) -> tuple[list[og.Op], og.TensorOp, og.TensorOp,
                                          list[og.Op]]:
        """``(optimizer updates, loss, count, layer updates)`` of a data-parallel step:
        the gradients, the loss, the correct count and the values the layers assign
        (BatchNorm's running averages) averaged over the ranks, all in the gradients'
        buckets (one allreduce per step while they fit in one)."""
        values = [u.args[1] for u in layer_updates]
        if count.dtype != loss.dtype:  # in the loss's bucket (float64: exact counts)
            count = count * be.constant(1.0, dtype=loss.dtype)
        extra = [loss, count] + values
        averaged: list[og.TensorOp] = []

        def average(grads: Iterable[og.TensorOp]) -> list[og.TensorOp]:
            grads = list(grads)
            out: list[og.TensorOp] = self._gd.average_gradients(grads + extra)
            averaged.extend(out[len(grads):])
            return out[:len(grads)]

        updates = self.optimizer.updates(loss, params, average=average)
        loss, count, *values = averaged
        return updates, loss, count, [_replace_assignment(u, v)
                                      for u, v in zip(layer_updates, values)]

    def _predict_computation(self, b: Optional[int] = None) -> Computation[np.ndarray]:
        b = self.eval_batch_size if b is None else b
        if b not in self._predict:
            self._predict[b] = self._build_predict(b)
        return self._predict[b]

    def _build_predict(self, batch: Union[int, Axis]) -> Computation[np.ndarray]:
        _, x = self._inputs(batch, "predict")
        out = self.net(x, training=False)
        axes = out.axes.batch_axes()
        out = be.axes_with_order(out, axes + (out.axes - axes))  # batch first
        return self.transformer.computation(out, x)

    def _eval_computation(self, b: Optional[int] = None) -> _Steps:
        b = self.eval_batch_size if b is None else b
        if b not in self._eval:
            self._eval[b] = self._build_eval(b)
        return self._eval[b]

    def _build_eval(self, batch: Union[int, Axis]) -> _Steps:
        N, x = self._inputs(batch, "eval")
        out = self.net(x, training=False)
        target = self._target(N, out, "eval")
        per, correct = self._per_sample(out, target, N)
        return self.transformer.computation(
            [per] + ([correct] if correct is not None else []), x, target)

    def _any_batch(self, kind: str) -> Any:
        """The ``"predict"`` or ``"eval"`` computation over a symbolic batch (one
        computation for every number of samples: nothing padded), or None where the
        transformer has no symbolic lengths or the network needs a fixed batch to be
        built or transformed (it then runs in batches of a fixed size, the last
        padded). See doc/symbolic_axes.rst."""
        if kind not in self._any:
            comp = None
            if getattr(self.transformer, "symbolic_lengths", False):
                E = be.symbolic_axis(f"E_{kind}", batch=True)
                build = self._build_predict if kind == "predict" else self._build_eval
                try:
                    comp = build(E)
                except (TypeError, GeonError):  # SymbolicLengthError is a TypeError
                    comp = None   # (a layer or pass that needs a number: fixed batches)
            self._any[kind] = comp
        return self._any[kind]

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

    def save(self, path: Union[str, os.PathLike[str]]) -> None:
        """Write every Variable (weights and optimizer state) to the checkpoint ``path``.
        Data-parallel: rank 0 writes it; every rank must call it, and returns once the
        file is written."""
        if self.data_parallel:
            self._gd.save(self.transformer, path)
        else:
            self.transformer.save(path)

    def restore(self, path: Union[str, os.PathLike[str]]) -> None:
        """Read a checkpoint written by :meth:`save` of the same model (on every rank,
        when data-parallel: it holds no number of ranks, so a run of 2 ranks resumes on
        1 or 3)."""
        if self.data_parallel:
            self._gd.restore(self.transformer, path)
            self._synced = True   # every rank read the same file
        else:
            self.transformer.restore(path)

    # -- running -----------------------------------------------------------------------
    @overload
    def _batches(self, x: np.ndarray, b: int,
                 y: None = None) -> Iterator[tuple[np.ndarray, None, int]]: ...
    @overload
    def _batches(self, x: np.ndarray, b: int,
                 y: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray, int]]: ...

    def _batches(self, x: np.ndarray, b: int, y: Optional[np.ndarray] = None
                 ) -> Iterator[tuple[np.ndarray, Optional[np.ndarray], int]]:
        """Batches of ``b`` samples of ``x`` (and ``y``) in order, the last padded with
        copies of the first sample; yields ``(xb, yb, n_real)``."""
        for i in range(0, len(x), b):
            xb = x[i:i + b]
            yb = None if y is None else y[i:i + b]
            n = len(xb)
            if n < b:
                xb = np.concatenate([xb, np.repeat(x[:1], b - n, axis=0)])
                if y is not None:
                    yb = np.concatenate([yb, np.repeat(y[:1], b - n, axis=0)])
            yield xb, yb, n

    def _sample_text(self) -> str:
        """``(64,) (the lengths of F:64)``: the shape of one sample, for messages."""
        lengths = tuple(a.length for a in self.input_axes)
        return f"{lengths} (the lengths of {', '.join(map(repr, self.input_axes))})"

    def _as_inputs(self, x: Any, what: str, single_ok: bool = False
                   ) -> tuple[np.ndarray, bool]:
        """``(array of samples, whether x was one sample)``: ``x`` checked against the
        input axes, with a :class:`FeedError` that says what shape was expected."""
        if isinstance(x, ArrayIterator):
            raise ArgumentError(f"Model.{what}: takes arrays, not an ArrayIterator; give "
                                f"its arrays, x.x and x.y (at {user_location()})")
        try:
            arr = np.asarray(x)
        except (TypeError, ValueError) as e:
            raise FeedError(f"Model.{what}: x is not an array of numbers ({e}) (at "
                            f"{user_location()})") from None
        lengths = tuple(a.length for a in self.input_axes)
        if arr.dtype.kind not in "biuf":
            raise FeedError(f"Model.{what}: x holds {arr.dtype} values; the model takes "
                            f"numbers ({np.dtype(self.dtype).name}) (at {user_location()})")
        if arr.ndim == len(lengths) + 1 and arr.shape[1:] == lengths:
            if not len(arr):
                raise FeedError(f"Model.{what}: x holds no samples (shape {arr.shape}) "
                                f"(at {user_location()})")
            return arr, False
        if single_ok and arr.shape == lengths:
            return arr[None], True
        one = f", or {lengths} for one sample" if single_ok else ""
        raise FeedError(f"Model.{what}: x has shape {arr.shape}; the model takes arrays "
                        f"of shape (n, {', '.join(map(str, lengths))}{',' * (len(lengths) == 0)}"
                        f"): n samples of shape {self._sample_text()}{one} (at "
                        f"{user_location()})")

    def _as_targets(self, y: object, n: int, what: str) -> np.ndarray:
        """``y`` checked against ``n`` samples and the loss: integer class labels of
        shape ``(n,)`` for the cross-entropy (floats with integer values are taken as
        such), else the output's shape after the sample axis."""
        if y is None:
            raise ArgumentError(f"Model.{what}: no targets y: give {what}(x, y) (at "
                                f"{user_location()})")
        try:
            y = np.asarray(y)
        except (TypeError, ValueError) as e:
            raise FeedError(f"Model.{what}: y is not an array of numbers ({e}) (at "
                            f"{user_location()})") from None
        if y.ndim == 0 or len(y) != n:
            raise FeedError(f"Model.{what}: {n} samples in x but "
                            f"{'a scalar' if y.ndim == 0 else len(y)} targets in y (at "
                            f"{user_location()})")
        if self.loss_kind == "cross_entropy":
            classes = cast(int, self._class_axis.length)  # (set: the output's axis)
            if y.shape != (n,):
                onehot = ("; for one-hot rows, give y.argmax(axis=1)"
                          if y.shape == (n, classes) else "")
                raise FeedError(f"Model.{what}: y has shape {y.shape}; the cross-entropy "
                                f"loss takes integer class labels 0..{classes - 1} of shape "
                                f"({n},){onehot} (at {user_location()})")
            if y.dtype.kind == "f" and np.all(np.isfinite(y)) and np.all(y == np.round(y)):
                y = y.astype(np.int64)   # labels read from a float table
            if y.dtype.kind not in "iu":
                raise FeedError(f"Model.{what}: y holds {y.dtype} values; the cross-entropy "
                                f"loss takes integer class labels 0..{classes - 1} (at "
                                f"{user_location()})")
            return y
        want = (n,) + tuple(a.length for a in self._target_axes)
        if y.shape != want:
            raise FeedError(f"Model.{what}: y has shape {y.shape}; the mse loss takes "
                            f"targets of the output's shape, {want} (the lengths of "
                            f"{', '.join(map(repr, self._target_axes))} after the "
                            f"samples) (at {user_location()})")
        return y

    def _batch_size(self, batch_size: Optional[int], what: str, default: int) -> int:
        return default if batch_size is None else check_count(f"Model.{what}",
                                                              "batch_size", batch_size)

    @checked("Model.predict")
    def predict(self, x: Any, batch_size: Optional[int] = None,
                verbose: Union[bool, int, str] = False) -> np.ndarray:
        """The network's output for ``x``, with the batch first. Assigns no Variable.

        ``x`` has shape ``(n, *lengths of input_axes)`` for any ``n``, or the input
        axes' lengths for one sample (the result has then no batch dimension, as a
        PyTorch module's for an unbatched input). It runs in batches of
        ``batch_size`` (default ``eval_batch_size``; one computation is built per
        size), the last one padded, the padding's outputs dropped; where the network
        and the transformer take a symbolic batch (the NumPy transformer, layers whose
        lowering needs no fixed batch), one computation serves every batch size and
        nothing is padded (``doc/symbolic_axes.rst``). ``verbose`` is
        accepted as in Keras; ``predict`` prints nothing."""
        x, single = self._as_inputs(x, "predict", single_ok=True)
        x = x.astype(self.dtype, copy=False)
        b = self._batch_size(batch_size, "predict", self.eval_batch_size)
        any_batch = self._any_batch("predict")
        if any_batch is not None:   # batches of b, the last as it is
            out = np.concatenate([any_batch(x[i:i + b]) for i in range(0, len(x), b)]) \
                if len(x) else any_batch(x)
            return out[0] if single else out
        comp = self._predict_computation(b)
        outs = []
        for xb, _, n in self._batches(x, b):
            outs.append(comp(xb)[:n])
        out = np.concatenate(outs)
        return out[0] if single else out

    @checked("Model.evaluate")
    def evaluate(self, x: Any, y: Any, batch_size: Optional[int] = None,
                 verbose: Union[bool, int, str] = False) -> dict[str, float]:
        """``{"loss": mean loss, "accuracy": fraction right}`` (accuracy with the
        cross-entropy loss only) on ``x``, ``y`` (as Keras's ``evaluate(...,
        return_dict=True)``). Assigns no Variable. Runs in batches of ``batch_size``
        (default ``eval_batch_size``), the last one padded, or as it is where the
        network takes a symbolic batch (as :meth:`predict`). ``verbose`` prints the
        result on one line. Data-parallel: each rank evaluates its contiguous part of
        ``x`` and the sums are added over the ranks (every rank gets the result)."""
        x, _ = self._as_inputs(x, "evaluate")
        x = x.astype(self.dtype, copy=False)
        y = self._as_targets(y, len(x), "evaluate")
        b = self._batch_size(batch_size, "evaluate", self.eval_batch_size)
        self._check_labels(y, "evaluate")
        n_all = len(x)
        if self.data_parallel:
            if not self._synced:
                self.sync()
            lo, hi = (n_all * k // self.ranks for k in (self.rank, self.rank + 1))
            x, y = x[lo:hi], y[lo:hi]
        any_batch = self._any_batch("eval")
        comp = any_batch if any_batch is not None else self._eval_computation(b)
        total, right = 0.0, 0.0
        if len(x):
            # (over a symbolic batch the last batch is as it is, else padded)
            batches = ((x[i:i + b], y[i:i + b], len(x[i:i + b]))
                       for i in range(0, len(x), b)) if any_batch is not None \
                else self._batches(x, b, y)
            for xb, yb, n in batches:
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
        if fitting.verbosity(verbose, "evaluate") and self.rank == 0:
            print(f"evaluate on {n_all} sample{'s' * (n_all != 1)}: "
                  + ", ".join(f"{k} {v:.4f}" for k, v in logs.items()), flush=True)
        return logs

    @checked("Model.fit")
    def fit(self, x: Any = None, y: Any = None, *, epochs: int = 1,
            batch_size: Optional[int] = None, verbose: Union[bool, int, str] = True,
            callbacks: Sequence[Callback] = (), validation_split: float = 0.0,
            validation_data: Optional[tuple[Any, Any]] = None,
            shuffle: Optional[bool] = None, initial_epoch: Optional[int] = None,
            seed: int = 0, stream: Optional[IO[str]] = None) -> History:
        """Train, as Keras's ``fit``, and return the :class:`History` of the epochs run.

        The data: arrays ``fit(x, y)`` (``x`` of shape ``(n, *input lengths)``), the
        pair ``fit((x, y))``, or an :class:`ArrayIterator`. Arrays are shuffled
        (unless ``shuffle=False``) by an order that depends only on ``seed`` and the
        epoch's number, in batches of ``batch_size`` (default the model's); an epoch
        has ``n // batch_size`` full batches and, where ``batch_size`` does not divide
        ``n``, a last batch of the ``n % batch_size`` samples left (its update is the
        mean over those samples, run by a training computation of that size; a
        data-parallel model over several ranks leaves the remainder out, a different
        one each epoch). ``validation_split`` holds out that fraction of the
        arrays (the last samples, before shuffling), evaluated after each epoch as
        ``validation_data`` ``(x_val, y_val)`` is (give one of them).

        Epochs: training continues from the model's update counter (a restored
        checkpoint's included). With ``s`` updates made and ``k`` per epoch, the model
        stands in epoch ``s // k`` (counted from 0); ``fit`` runs ``epochs`` epochs
        from there, or, with ``initial_epoch`` (which must be that epoch: Keras's
        resume idiom ``fit(..., initial_epoch=5, epochs=10)``), up to the end of
        epoch ``epochs`` in total. An epoch interrupted part way is finished in the
        order an uninterrupted run would have used, so a resumed run gives bitwise the
        weights of one that never stopped.

        ``verbose``: ``True``/``1``/``"auto"`` draws a progress bar on a terminal
        (one line per epoch elsewhere), ``2`` one line per epoch, ``False``/``0``
        nothing; progress goes to ``stream`` (default stderr).

        Data-parallel (``Model(..., data_parallel=True)``): every rank calls ``fit``
        with the same data; each reads its block of every global batch of
        ``ranks * batch_size`` samples (:meth:`ArrayIterator.shard`), the Variables are
        first broadcast from rank 0, the logs (loss, accuracy) are those of the global
        batches, and only rank 0 prints.

        SIGINT (Ctrl-C) during ``fit`` finishes the current update, runs the
        callbacks' ``on_interrupt`` (:class:`ModelCheckpoint` saves) and raises
        ``KeyboardInterrupt``.
        """
        return fitting.fit(self, x, y, epochs=epochs, batch_size=batch_size,
                           verbose=verbose, callbacks=callbacks,
                           validation_split=validation_split,
                           validation_data=validation_data, shuffle=shuffle,
                           initial_epoch=initial_epoch, seed=seed, stream=stream)

    # -- description ---------------------------------------------------------------------
    def __repr__(self) -> str:
        net = "".join(f"\n  {line}" for line in f"net={self.net!r},".splitlines())
        dp = ", data_parallel=True" if self.data_parallel else ""
        eval_b = (f", eval_batch_size={self.eval_batch_size}"
                  if self.eval_batch_size != self.batch_size else "")
        return (f"Model({net}\n  input_axes={fmt(self.input_axes)}, loss={self.loss_kind!r}, "
                f"optimizer={self.optimizer!r},\n  batch_size={self.batch_size}{eval_b}, "
                f"transformer={self.transformer!r}{dp})")

    @checked("Model.summary")
    def summary(self, print_fn: Optional[Callable[[str], Any]] = None) -> None:
        """Print the table of the network's layers, as Keras's ``summary``: each
        layer's name and type, its output axes (the batch axis first, by name; the
        others as ``name:length``) and its number of parameters, then the totals:
        every Variable of the network, the trainable ones, the others (BatchNorm's
        running averages) and the optimizer's state. ``print_fn`` (default
        ``print``) gets the whole table as one string."""
        (print_fn or print)(self._summary_text())

    def _summary_text(self) -> str:
        N = be.Axis(self.batch_size, name="N", batch=True)
        x = be.placeholder(be.Axes(N, *self.input_axes), dtype=self.dtype, name="x")
        token = trace_calls()
        try:
            self.net(x, training=False)   # inference: assigns nothing
        finally:
            calls = end_trace(token)
        rows = [("x (input)", _axes_text(x), "0")]
        shown: set[int] = set()
        for layer, out, container in calls:
            own = list(layer._vars.values())
            if id(layer) in shown or ((container or isinstance(layer, Sequential))
                                      and not own):
                continue  # a layer called twice shows once; containers show their layers
            shown.add(id(layer))
            rows.append((f"{layer.name} ({type(layer).__name__})", _axes_text(out),
                         f"{sum(v.axes.size for v in own):,}"))
        net_vars = list(dict.fromkeys(self.net.variables))
        trainable = [v for v in net_vars if v.trainable]
        others = [v for v in net_vars if not v.trainable]
        head = ("Layer (type)", "Output axes", "Param #")
        w0 = max(len(r[0]) for r in rows + [head]) + 2
        w1 = max(len(r[1]) for r in rows + [head]) + 2
        w2 = max(len(r[2]) for r in rows + [head])
        width = 1 + w0 + w1 + w2 + 1

        def line(a: str, b: str, c: str) -> str:
            return f" {a:<{w0}}{b:<{w1}}{c:>{w2}}".rstrip()
        name = self.net.name or type(self.net).__name__.lower()
        out = [f'Model: "{name}"', "_" * width, line(*head), "=" * width]
        out += [line(*r) for r in rows]
        out += ["=" * width]
        for label, vs in (("Total params", net_vars), ("Trainable params", trainable),
                          ("Non-trainable params", others),
                          ("Optimizer params", self.optimizer.variables)):
            count = sum(v.axes.size for v in vs)
            size = sum(v.axes.size * np.dtype(v.dtype).itemsize for v in vs)
            out.append(f"{label}: {count:,} ({_bytes(size)})")
        out.append("_" * width)
        return "\n".join(out)



def _unchain(results: Iterable[og.Op], earlier: Container[og.Op]) -> set[og.Op]:
    """Free the graph of one training computation (``results``) from the ordering
    after the assignments ``earlier`` (of another batch size's computation, built
    before it on the same Variables): a SetItem built after another on the same
    Variable runs after it, and so do the reads built after it (a dropout layer's step
    counter and its draw), which would make the new computation run the old one's
    assignments too. Returns the graph's ops (reached through args and the ordering
    left). Every other read of the Variables goes through ``be.value_of``, which takes
    no such order."""
    seen: set[og.Op] = set()
    stack = list(results)
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        for old in [d for d in op.other_deps if d in earlier]:
            op.other_deps.discard(old)
            old._dep_users.discard(op)
        stack.extend(op.args)
        stack.extend(op.other_deps)
    return seen


def _replace_assignment(old: og.Op, value: og.TensorOp) -> og.Op:
    """``SetItem(old's tensor, value)`` in place of the SetItem ``old`` (which is then
    never run): the new one is not ordered after ``old`` (as a SetItem built after
    another on the same tensor would be, which would make the computation run both)."""
    new = be.SetItem(old.args[0], value)
    new.other_deps.discard(old)
    old._dep_users.discard(new)
    return new


def _axes_text(op: og.TensorOp) -> str:
    """``(N, hidden_out:64)``: the batch axes first, by name (their length is the
    batch's), then the other axes as ``name:length``."""
    batch = op.axes.batch_axes()
    rest = [a for a in op.axes if a not in batch]
    return "(" + ", ".join([a.name for a in batch] + [repr(a) for a in rest]) + ")"


def _bytes(n: int) -> str:
    """``18.79 KB``: a size in bytes, as Keras prints them (1 KB = 1024 B)."""
    if n < 1024:
        return f"{n} B"
    size = n / 1024
    for unit in ("KB", "MB"):
        if size < 1024:
            return f"{size:.2f} {unit}"
        size /= 1024
    return f"{size:.2f} GB"


def _input_axes(value: Any) -> tuple[Axis, ...]:
    """``input_axes`` as a tuple of Axis, or an :class:`ArgumentError` that shows how
    to write them."""
    if isinstance(value, Axis):
        return (value,)
    try:
        items = list(value)
    except TypeError:
        items = None
    if items is not None and all(isinstance(a, Axis) for a in items):
        return tuple(be.Axes(*items))
    example = "[be.Axis(64, name='F')]"
    if items and all(is_int(n) for n in items):   # a Keras input_shape
        example = "[" + ", ".join(f"be.Axis({n}, name='{'FGHIJ'[i % 5]}')"
                                  for i, n in enumerate(items)) + "]"
    raise ArgumentError(f"nn.Model: input_axes must be the Axis objects of one sample, "
                        f"such as {example} (the batch axis is added), not "
                        f"{describe(value)} (at {user_location()})")


def _optimizer(value: Any) -> Optimizer:
    """``Model``'s optimizer argument as an :class:`Optimizer` (a name gives that one
    with its defaults)."""
    if value is None:
        return SGD(0.01)
    if isinstance(value, Optimizer):
        return value
    if isinstance(value, str) and value.lower() in OPTIMIZERS:
        return OPTIMIZERS[value.lower()]()
    made = (f"; make one: {public_name(value)}(...)"
            if isinstance(value, type) and issubclass(value, Optimizer) else "")
    raise ArgumentError(f"nn.Model: optimizer must be an optimizer (such as nn.SGD(0.1)) "
                        f"or one's name ({', '.join(map(repr, OPTIMIZERS))}), not "
                        f"{describe(value)}{made} (at {user_location()})")
