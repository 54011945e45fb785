"""The exporter behind :func:`geon.transformers.torch.to_torch`.

A copy of the graph (:func:`~geon.op_graph.params.clone_graph`) goes through geon's own
pass pipeline (:meth:`~geon.transformers.base.Transformer.passes`: simplify, lower,
fold, CSE, DCE, alias, verify) down to the semi-primitive ops; the module then
interprets the lowered graph in ``forward``, one PyTorch call per primitive, in the
order the NumPy transformer runs them (:func:`~geon.op_graph.ordering.schedule`).

:data:`TORCH_OPS` maps each supported primitive class to ``fn(op, *arg_tensors)``
returning a tensor (a tuple for a multi-output op). Its keys, with the storage ops, are
the exporter's base set: the pipeline's ``verify`` pass rejects any other op at export,
naming it and where it was built. Adding a primitive is one entry.

The module speaks the user's layout: each input is laid out as its placeholder's axes;
each output in the order ``to_torch(..., output_order=)`` chooses (batch axes first by
default, as PyTorch lays out batches), made in the copied graph with ``axes_with_order``
before lowering, so the reordering is one more op the pipeline can fuse or fold.
Parameters are registered in the order data from the inputs reaches them
(``data_order``), and the module's repr lists inputs, outputs and state.

Symbolic lengths (doc/symbolic_axes.rst) export as dynamic dimensions: one module for
every binding. Each call of a module with symbolic lengths binds the symbols from its
feeds' shapes, as the NumPy transformer does, and holds the binding for the call
(:data:`_CALL`, per thread); a rule reads every shape, key or length through
:func:`shape_of` or :func:`bound`, which evaluate the symbolic lengths under it (and
return them as they are in a module of fixed lengths, which binds nothing).
"""

import keyword
import math
import re
import warnings
from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from geon.errors import ArgumentError, FeedError, IndexOutOfRangeError, LoweringError
from geon.op_graph import collectives as coll
from geon.op_graph import conv as cv
from geon.op_graph import op_graph as og
from geon.op_graph import primitives as pr
from geon.op_graph import random as rnd
from geon.op_graph import schemas as sc
from geon.op_graph import symbols as sy
from geon.op_graph.axes import Axes, AxesLike, as_axes
from geon.op_graph.nodes import no_gc
from geon.op_graph.np_ops import Select
from geon.op_graph.ordering import schedule
from geon.op_graph.params import clone_graph
from geon.op_graph.reference import op_site
from geon.op_graph.specialize import call_binders, check_needs, read_binding
from geon.op_graph.tables import OpTable
from geon.transformers.base import Computation, Transformer
from geon.transformers.torch.binding import (_BOUND_ATTRS, _CALL, PREPARE_SYMBOLIC,
                                             _check_symbolic, _symbols_in, bound, shape_of)

TORCH_OPS = OpTable("TORCH_OPS", "fn(op, *arg_tensors) -> tensor (a tuple for a "
                                 "multi-output op)")
#: Decorator: ``@torch_op(Cls, ...)`` registers ``fn(op, *arg_tensors) -> tensor``.
torch_op = TORCH_OPS.register

_STORAGE = frozenset({og.Placeholder, og.Variable, og.Constant})


def torch_dtype(dtype: og.DTypeLike) -> torch.dtype:
    """The torch dtype of the NumPy dtype ``dtype`` (the same width and kind)."""
    return torch.from_numpy(np.empty(0, np.dtype(dtype))).dtype


# --- elementwise ---------------------------------------------------------------------
# Operands keep their dtypes and the result is cast to the op's dtype afterwards (as the
# NumPy transformer does), so these are the plain PyTorch functions.

def _softplus(x):
    return torch.logaddexp(x, torch.zeros_like(x))  # exact where F.softplus switches


_ELEMENTWISE = {
    og.Add: torch.add, og.Subtract: torch.sub, og.Multiply: torch.mul,
    og.Divide: torch.true_divide, og.Power: torch.pow, og.Maximum: torch.maximum,
    og.Minimum: torch.minimum, og.Equal: torch.eq, og.NotEqual: torch.ne,
    og.Less: torch.lt, og.LessEqual: torch.le, og.Greater: torch.gt,
    og.GreaterEqual: torch.ge, og.Negative: torch.neg, og.Absolute: torch.abs,
    og.Sign: torch.sign, og.Square: torch.square, og.Sqrt: torch.sqrt,
    og.Reciprocal: torch.reciprocal, og.Exp: torch.exp, og.Log: torch.log,
    og.Sin: torch.sin, og.Cos: torch.cos, og.Tanh: torch.tanh, og.Sigmoid: torch.sigmoid,
    og.Erf: torch.erf, og.Expm1: torch.expm1, og.Softplus: _softplus,
    # softplus(x) - x t
    sc.SigmoidCrossEntropy: lambda x, t: _softplus(x) - x * t,
    # a where c is nonzero, else b
    Select: lambda c, a, b: torch.where(c if c.dtype == torch.bool else c != 0, a, b),
}


def _elementwise_rule(fn):
    return lambda op, *args: fn(*args)


for _cls, _fn in _ELEMENTWISE.items():
    TORCH_OPS[_cls] = _elementwise_rule(_fn)


# --- matrix product and reductions -------------------------------------------------------

@torch_op(pr.Gemm)
def _gemm(op, a, b):
    # both operands in the product's type (NumPy promotes float32 @ float64; torch
    # refuses mixed types)
    dt = torch_dtype(op.dtype)
    return torch.matmul(a.to(dt), b.to(dt))


_REDUCE = {pr.ReduceSum: torch.sum, pr.ReduceProd: torch.prod, pr.ReduceMax: torch.amax,
           pr.ReduceMin: torch.amin, pr.ReduceArgMax: torch.argmax,
           pr.ReduceArgMin: torch.argmin}


@torch_op(*_REDUCE)
def _reduce(op, x):
    return _REDUCE[type(op)](x, dim=op.axis)


@torch_op(pr.ReduceMaxArgMax)
def _reduce_max_argmax(op, x):
    values, indices = torch.max(x, dim=op.axis)  # the first maximum on ties, as NumPy
    return values, indices


@torch_op(og.Output)
def _output(op, values):
    return values[op.index]


# --- views and copies ----------------------------------------------------------------

def _positive_key(key, shape):
    """``(key', flips)``: ``key`` with every negative-step slice replaced by the
    positive-step slice of the same elements (PyTorch has no negative steps), and the
    result dimensions that must be flipped to restore their order."""
    out, flips, dim = [], [], 0
    for k, n in zip(key, shape):
        if isinstance(k, slice):
            start, stop, step = k.indices(n)
            if step < 0:
                idx = range(start, stop, step)
                k = slice(idx[-1], idx[0] + 1, -step) if len(idx) else slice(0, 0)
                flips.append(dim)
            dim += 1
        out.append(k)
    return tuple(out), flips


@torch_op(pr.SliceView)
def _slice(op, x):
    key, flips = _positive_key(bound(op.key), shape_of(op.args[0]))
    y = x[key]
    return y.flip(flips) if flips else y


@torch_op(pr.Unslice)
def _unslice(op, x):
    shape = shape_of(op)
    key, flips = _positive_key(bound(op.key), shape)
    out = x.new_zeros(shape)
    out[key] = x.flip(flips) if flips else x
    return out


@torch_op(pr.UnsliceAdd)
def _unslice_add(op, x, a):
    key, flips = _positive_key(bound(op.key), shape_of(op))
    out = x.clone()
    out[key] += a.flip(flips) if flips else a
    return out


@torch_op(pr.Dimshuffle)
def _dimshuffle(op, x):
    return x.permute(op.perm)


@torch_op(pr.Reshape)
def _reshape(op, x):
    return x.reshape(shape_of(op))


@torch_op(pr.Expand)
def _expand(op, x):
    kept = tuple(1 if m is None else x.shape[m] for m in op.dim_map)
    return x.reshape(kept).expand(shape_of(op))


@torch_op(pr.LengthValue)
def _length_value(op):
    # the value of a symbolic length (e.g. the count a mean divides by) in this call
    return torch.tensor(bound(op.value), dtype=torch_dtype(op.dtype), device=_CALL.device)


@torch_op(pr.Copy)
def _copy(op, x):
    return x.clone(memory_format=torch.contiguous_format)


@torch_op(pr.Assign)
def _assign(op, target, value):
    # In place, as geon does; not recorded by autograd (see to_torch).
    with torch.no_grad():
        target.copy_(value)


# --- indexing, scans and sorts along dimension 1 -----------------------------------------

def _checked_indices(op, idx, n):
    """``idx`` in ``[0, n)`` (negative ones count from the end), or an
    :class:`IndexOutOfRangeError` naming the user's op, as the NumPy transformer says."""
    if idx.numel():
        lo, hi = int(idx.min()), int(idx.max())
        if lo < -n or hi >= n:
            raise IndexOutOfRangeError(f"{op_site(op)}: index {lo if lo < -n else hi} is "
                                       f"out of range for an axis of length {n}")
    return torch.where(idx < 0, idx + n, idx).long()


@torch_op(pr.Take)
def _take(op, x, idx):
    return torch.index_select(x, 1, _checked_indices(op, idx, x.shape[1]))


@torch_op(pr.PutAdd)
def _put_add(op, d, idx):
    shape = shape_of(op)
    out = d.new_zeros(shape)
    return out.index_add(1, _checked_indices(op, idx, shape[1]), d)


@torch_op(pr.PrefixSum)
def _prefix_sum(op, x):
    return torch.cumsum(x, dim=1)


@torch_op(pr.SortPrim)
def _sort(op, x):
    values, indices = torch.sort(x, dim=1, stable=True)
    return values, indices


@torch_op(rnd.Random)
def _random(op, step):
    # The same Philox words as every geon backend (the draw is defined bit by bit in
    # geon.op_graph.random), made on the host and moved to the step counter's device.
    values = rnd.draw(op.distribution, shape_of(op), op.dtype, op.seed, op.stream,
                      int(step))
    return torch.from_numpy(np.ascontiguousarray(values)).to(step.device)


# --- convolution and max pooling (geon.op_graph.conv) ------------------------------------

def _pad(x, pads, value=0):
    """``x`` padded by ``pads`` ``((lo, hi), ...)`` over its trailing dimensions."""
    flat = [p for lo_hi in reversed(pads) for p in lo_hi]  # F.pad: last dimension first
    return F.pad(x, flat, value=value) if any(flat) else x


def _crop(x, shape, pads):
    """The inverse of :func:`_pad`: the trailing dimensions of ``x`` cut to ``shape``."""
    return x[(Ellipsis,) + tuple(slice(lo, lo + n) for n, (lo, _) in zip(shape, pads))]


def _spatial(op, module, name):
    """``module``'s function ``name`` (``"conv{}d"``, ...) for ``op``'s number of
    spatial dimensions (PyTorch has 1 to 3)."""
    n = len(op.strides)
    if not 1 <= n <= 3:
        raise LoweringError(f"{type(op).__name__} {op.name} (built at {op.file_info}): "
                            f"PyTorch convolves over 1 to 3 spatial dimensions, not {n}")
    return getattr(module, name.format(n))


def _common(a, b):
    dtype = torch.promote_types(a.dtype, b.dtype)
    return a.to(dtype), b.to(dtype)


@torch_op(cv.Conv)
def _conv(op, x, w):
    x, w = _common(x, w)
    return _spatial(op, F, "conv{}d")(_pad(x, op.pads), w, stride=op.strides,
                                      dilation=op.dilation, groups=op.groups)


@torch_op(cv.ConvGradData)
def _conv_grad_data(op, dy, w):
    dy, w = _common(dy, w)
    shape = shape_of(op)
    S = shape[2:]
    padded = shape[:2] + tuple(n + lo + hi for n, (lo, hi) in zip(S, op.pads))
    xp = _spatial(op, torch.nn.grad, "conv{}d_input")(
        padded, w, dy, stride=op.strides, dilation=op.dilation, groups=op.groups)
    return _crop(xp, S, op.pads)


@torch_op(cv.ConvGradFilter)
def _conv_grad_filter(op, x, dy):
    x, dy = _common(x, dy)
    return _spatial(op, torch.nn.grad, "conv{}d_weight")(
        _pad(x, op.pads), shape_of(op), dy, stride=op.strides, dilation=op.dilation,
        groups=op.groups)


def _windows(op, xp, P):
    """The windows of the padded ``xp``, one slice per kernel offset (in kernel order)
    stacked along a new first dimension: ``(taps, ..., *P)``."""
    return torch.stack([xp[(Ellipsis,) + cv.tap_slices(tap, P, op.strides, op.dilation)]
                        for tap in np.ndindex(*op.kernel)])


def _first_max(op, x, P):
    """The kernel-order index of each window's first maximum of ``x``, ``(..., *P)``."""
    lowest = -math.inf if x.is_floating_point() else torch.iinfo(x.dtype).min
    return torch.argmax(_windows(op, _pad(x, op.pads, lowest), P), dim=0)


def _pooled(op, x):
    return shape_of(op)[len(op.axes) - len(op.kernel):]


@torch_op(cv.MaxPool)
def _max_pool(op, x):
    # x at each window's first maximum: autograd then routes to it, as MaxPoolGrad does
    return _max_pool_gather(op, x, x)


@torch_op(cv.MaxPoolGather)
def _max_pool_gather(op, x, v):
    P = _pooled(op, x)
    idx = _first_max(op, x, P)
    return _windows(op, _pad(v, op.pads), P).gather(0, idx[None])[0]


@torch_op(cv.MaxPoolGrad)
def _max_pool_grad(op, x, dy):
    P = dy.shape[dy.dim() - len(op.kernel):]
    idx = _first_max(op, x, P)
    out = _pad(dy.new_zeros(x.shape), op.pads)
    for i, tap in enumerate(np.ndindex(*op.kernel)):
        key = (Ellipsis,) + cv.tap_slices(tap, P, op.strides, op.dilation)
        out[key] = out[key] + torch.where(idx == i, dy, 0)
    return _crop(out, x.shape[x.dim() - len(op.kernel):], op.pads)


# --- collectives (geon.op_graph.collectives) ---------------------------------------------
# In a torch.distributed job, the ranks are its processes and the collectives its own
# (through torch.distributed.nn, which autograd differentiates); otherwise the job is
# one process, whose allreduce and broadcast are its own value.

def _world_size():
    d = torch.distributed
    return d.get_world_size() if d.is_available() and d.is_initialized() else 1


@torch_op(coll.AllReduce)
def _allreduce(op, x):
    n = _world_size()
    if n == 1:
        return x
    y = _differentiable_collective("all_reduce", x)
    return y / n if op.reduce == "mean" else y


@torch_op(coll.BroadcastFrom)
def _broadcast_from(op, x):
    if _world_size() == 1:
        return x
    return _differentiable_collective("broadcast", x, src=op.root)


def _differentiable_collective(name, x, **kwargs):
    # torch.distributed.nn.functional is the public collectives API autograd
    # differentiates; torch 2.13 marks it deprecated in favour of a private module, so
    # its FutureWarning is not passed on to every forward call.
    from torch.distributed.nn import functional as dist_fn
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return getattr(dist_fn, name)(x, **kwargs)


@torch_op(coll.FlatConcat)
def _flat_concat(op, *parts):
    return torch.cat([p.reshape(-1) for p in parts])


# --- the exporter ----------------------------------------------------------------------

class _TorchLowering(Transformer):
    """Runs geon's standard pipeline down to the ops :data:`TORCH_OPS` has (never
    registered, never compiles: :func:`to_torch` interprets what it leaves)."""

    name = "torch export"
    # symbolic axis lengths, bound from the feeds' shapes at each call of the module
    symbolic_lengths = True

    @property
    def base_set(self):
        return frozenset(TORCH_OPS) | _STORAGE


def _attribute_name(name, taken):
    """``name`` as a valid attribute name: non-word characters become ``_``, a leading
    digit or an empty name gets a leading ``_``, and a keyword, a name in ``taken`` (the
    module's own attributes: ``forward``, ``training``, ...) or one starting with
    ``_geon_`` (the exporter's) gets a trailing ``_``."""
    base = re.sub(r"\W", "_", name)
    if not base or base[0].isdigit():
        base = "_" + base
    while keyword.iskeyword(base) or base in taken or base.startswith("_geon_"):
        base += "_"
    return base


def _storage_view(op):
    """Whether ``op`` is storage or a view of storage (its value aliases it)."""
    while isinstance(op, pr.ViewOp):
        op = op.args[0]
    return isinstance(op, og.AssignableTensorOp)


def data_order(variables, order):
    """``variables`` in the order data from the placeholders reaches them: a layer's
    weights before the next layer's, whatever order the schedule loads them in.

    ``order`` is a topological order of the graph. An op's distance is the longest path
    from a placeholder to it along ``args``; an op no placeholder reaches (a view or a
    product of Variables alone) takes the least distance of its consumers. A Variable
    ranks by the least distance of its consumers, then by where it is first read, then
    by name; one nothing reads comes last."""
    consumers: dict[og.Op, list[og.Op]] = {}
    for op in order:
        for a in op.args:
            consumers.setdefault(a, []).append(op)
    dist: dict[og.Op, Optional[int]] = {}
    for op in order:
        reached = [dist[a] for a in op.args if dist.get(a) is not None]
        dist[op] = 0 if isinstance(op, og.Placeholder) else \
            1 + max(reached) if reached else None
    inf = float("inf")
    rank: dict[og.Op, float] = {}
    for op in reversed(order):
        d = dist[op]
        rank[op] = d if d is not None else min(
            (rank[c] for c in consumers.get(op, ())), default=inf)
    position = {op: i for i, op in enumerate(order)}

    def key(v):
        readers = consumers.get(v, ())
        return (min((rank[c] for c in readers), default=inf),
                min((position[c] for c in readers), default=len(order)), v.name)
    return sorted(variables, key=key)


def _output_axes(result, order, what):
    """The axes ``result`` is returned in under ``order``: ``"batch_first"`` (its batch
    axes first, the others after, each group in the graph's order), ``"graph"`` or
    ``None`` (the graph's order), or the axes themselves (a reordering of the
    result's)."""
    axes = result.axes
    if order is None or order == "graph":
        return axes
    if order == "batch_first":
        return Axes(list(axes.batch_axes()) + [a for a in axes if not a.batch])
    if isinstance(order, str):
        raise ArgumentError(f"to_torch: {what} {order!r} is not an order; use "
                            f"'batch_first', 'graph' or the result's axes in order")
    try:
        wanted = as_axes(order)
    except (TypeError, ValueError) as e:
        raise ArgumentError(f"to_torch: {what} must be 'batch_first', 'graph', None or "
                            f"axes; got {order!r}") from e
    if not wanted.same_set(axes) or len(wanted) != len(axes):
        raise ArgumentError(f"to_torch: {what} ({og._fmt(wanted)}) is not a reordering "
                            f"of result {result.name}'s axes ({og._fmt(axes)})"
                            + result._where())
    return wanted


def _per_result(output_order, requested, single):
    """One order per requested result, from ``output_order`` as :func:`to_torch`
    takes it."""
    if single or output_order is None or isinstance(output_order, str):
        return [output_order] * len(requested)
    orders = list(output_order)
    if len(orders) != len(requested):
        raise ArgumentError(f"to_torch: output_order has {len(orders)} entries for "
                            f"{len(requested)} results; give one per result (None, "
                            f"'batch_first', 'graph' or axes), or one string for all")
    return orders


# How forward() gets a value (the other steps apply a TORCH_OPS rule).
_FEED, _STATE, _CONST = "feed", "state", "const"


class TorchComputation(nn.Module):
    """A geon computation as an ``nn.Module`` (made by :func:`to_torch`).

    ``forward(*tensors)`` takes one value per placeholder, in order, each laid out as
    the placeholder's axes, and returns what the geon computation returns: one tensor
    for a single result, else a tuple (``None`` for a void result such as ``SetItem``),
    each laid out as ``output_axes`` says. ``geon_variables`` maps each parameter or
    buffer name to the geon Variable it holds, in registration order (``data_order``).
    """

    def __init__(self, comp: Computation, values: Mapping[og.Variable, Any]) -> None:
        super().__init__()
        self.single = comp.single
        self.placeholders = list(comp.params)
        #: The axes of each result in the order ``forward`` returns them (``None`` for a
        #: void result).
        self.output_axes = [r.axes if isinstance(r, og.TensorOp) else None
                            for r in comp.results]
        self.geon_variables = {}
        self._geon_steps: list[tuple[Any, ...]] = []  # (op, dtype, how, ref)
        taken = set(dir(self))
        owner: dict[str, og.Variable] = {}
        order = schedule(comp.graph.roots)
        for v in data_order(comp.variables, order):
            attr = _attribute_name(v.name, taken)
            if attr in owner:
                other = owner[attr]
                raise ArgumentError(
                    f"to_torch: Variables {other.name} (built at {other.file_info}) and "
                    f"{v.name} (built at {v.file_info}) both become the attribute "
                    f"{attr!r}; give them names that differ in letters, digits or '_'")
            owner[attr] = v
            tensor = torch.tensor(np.array(values[v], dtype=v.dtype))
            if v.trainable and tensor.is_floating_point():
                self.register_parameter(attr, nn.Parameter(tensor))
            else:
                self.register_buffer(attr, tensor)
            self.geon_variables[attr] = v
        var_attr = {v: a for a, v in self.geon_variables.items()}
        feed_pos = {p: i for i, p in enumerate(self.placeholders)}
        position: dict[og.Op, int] = {}
        n_const = 0
        for op in order:
            dtype = torch_dtype(op.dtype) if isinstance(op, og.TensorOp) else None
            step: tuple[Any, Any]  # (how, ref): a kind and its index or name, or a rule
            if isinstance(op, og.Placeholder):
                step = (_FEED, feed_pos[op])
            elif isinstance(op, og.Variable):
                step = (_STATE, var_attr[op])
            elif isinstance(op, og.Constant):
                attr = f"_geon_const{n_const}"
                n_const += 1
                scalar = op.scalar is not None  # one number: stored once, expanded
                value = np.asarray(op.value[()] if scalar else op.array(), dtype=op.dtype)
                self.register_buffer(attr, torch.tensor(value), persistent=False)
                step = (_CONST, attr)
            else:
                rule = TORCH_OPS.find(op)
                step = (rule, [position[a] for a in op.args])
            position[op] = len(self._geon_steps)
            self._geon_steps.append((op, dtype) + step)
        self._geon_results = [None if isinstance(r, og.VoidOp) else position[r]
                              for r in comp.results]
        # A result that is storage (or a view of it) is copied, as geon returns new
        # arrays: the next call's assignments must not change what the caller holds.
        self._geon_copied_results = {position[r] for r in comp.results
                                     if _storage_view(r)}
        # Assignments to a placeholder must not change the caller's tensor.
        self._geon_copied_feeds = {feed_pos[op.args[0]] for op in order
                             if isinstance(op, pr.Assign)
                             and isinstance(op.args[0], og.Placeholder)}
        self._geon_feed_dtypes = [torch_dtype(p.dtype) for p in self.placeholders]
        self._geon_feed_shapes = [p.axes.shape for p in self.placeholders]
        #: (feed index, position, symbol): where each call reads the symbols (None for
        #: a module of fixed lengths, which binds nothing)
        self._geon_binders: Optional[list[tuple[int, int, str]]] = \
            self._find_symbols(comp, order)
        #: the slices over symbolic lengths, and the bindings they were seen to fit
        self._geon_slices = [op for op in order if getattr(op, "needs", ())]
        self._geon_fitting: set = set()

    def _find_symbols(self, comp: Computation,
                      order: list) -> Optional[list[tuple[int, int, str]]]:
        """Where each call reads the symbols of the module's symbolic lengths (None for
        fixed lengths), after checking, as the NumPy transformer does, that the feeds
        give each a value and no Variable has one, and that every rule evaluates the
        symbolic lengths its op holds."""
        found: set = set()
        for op in order:
            if isinstance(op, og.TensorOp):
                found |= sy.symbols_of(op.axes.lengths)
            for cls in type(op).__mro__:
                for name in _BOUND_ATTRS.get(cls, ()):
                    found |= _symbols_in(getattr(op, name, None))
        if not found:
            return None
        binders = call_binders(found, comp.variables, self.placeholders, "to_torch: ")
        for op in order:
            _check_symbolic(op)
            for cls in type(op).__mro__:
                if cls in PREPARE_SYMBOLIC:
                    PREPARE_SYMBOLIC[cls](op)
                    break
        return binders

    def extra_repr(self) -> str:
        """One line per input, output, parameter and buffer, with axes and dtype."""
        def described(axes, dtype):
            return (f"({og._fmt(axes)})" if len(axes) else "scalar") + \
                f" {np.dtype(dtype).name}"
        lines = [f"input {p.name}: {described(p.axes, p.dtype)}" for p in self.placeholders]
        for k, axes in zip(self._geon_results, self.output_axes):
            lines.append("output: None" if k is None else
                         f"output: {described(axes, self._geon_steps[k][0].dtype)}")
        params = dict(self.named_parameters())
        for attr, v in self.geon_variables.items():
            kind = "parameter" if attr in params else "buffer"
            lines.append(f"{kind} {attr}: {described(v.axes, v.dtype)}")
        return "\n".join(lines)

    def _device(self):
        for t in self.parameters():
            return t.device
        for t in self.buffers():
            return t.device
        return torch.device("cpu")

    def _bind(self, tensors: Sequence[Any]) -> dict:
        """The call's binding ``{symbol: value}``, read from the feeds' shapes as the
        NumPy transformer reads it: a :class:`FeedError` naming both placeholders and
        the symbol where two feeds disagree, or naming the placeholder where a feed has
        another rank (the shapes under the binding are checked by ``_feed``)."""
        shapes: list[Optional[tuple]] = []
        for v in tensors:
            if isinstance(v, torch.Tensor):
                shapes.append(tuple(v.shape))
                continue
            try:
                shapes.append(np.shape(v))
            except (TypeError, ValueError):
                shapes.append(None)  # _feed says what is wrong with it
        assert self._geon_binders is not None
        binding = read_binding(self._geon_binders, self.placeholders, shapes)
        for v, p, got in zip(tensors, self.placeholders, shapes):
            if got is None or len(got) != len(p.axes):
                if not isinstance(v, torch.Tensor):
                    p.as_feed(v)  # raises, saying what is wrong with it
                raise FeedError(f"placeholder {p.name} expects axes ({og._fmt(p.axes)}) "
                                f"i.e. shape {p.axes.shape}; got shape {got}")
        if self._geon_slices:
            key = tuple(sorted(binding.items()))
            if key not in self._geon_fitting:
                check_needs(self._geon_slices, binding)
                if len(self._geon_fitting) < 1024:
                    self._geon_fitting.add(key)
        return binding

    def _feed(self, i, value, shape=None):
        """Placeholder ``i``'s value as a tensor of its shape (``shape``: the shape
        under the call's binding) and dtype, or a :class:`FeedError` (a
        ``ValueError``) naming the placeholder."""
        p, dtype = self.placeholders[i], self._geon_feed_dtypes[i]
        if shape is None:
            shape = self._geon_feed_shapes[i]
        if not isinstance(value, torch.Tensor):
            value = torch.as_tensor(p.as_feed(value, shape=shape), device=self._device())
        elif tuple(value.shape) != shape:
            raise FeedError(f"placeholder {p.name} expects axes ({og._fmt(p.axes)}) i.e. "
                            f"shape {shape}; got shape {tuple(value.shape)}")
        elif value.dtype != dtype:
            if not torch.can_cast(value.dtype, dtype):
                raise FeedError(f"placeholder {p.name} has dtype {p.dtype}; cannot safely "
                                f"convert {value.dtype} to it")
            value = value.to(dtype)
        return value.clone() if i in self._geon_copied_feeds else value

    def forward(self, *tensors: Any) -> Any:
        """The computation's results from one tensor (or array) per placeholder."""
        if len(tensors) != len(self.placeholders):
            raise FeedError(f"the module takes {len(self.placeholders)} value(s) ("
                            + ", ".join(p.name for p in self.placeholders)
                            + f"), got {len(tensors)}")
        if self._geon_binders is None:  # fixed lengths: nothing to bind
            return self._run([self._feed(i, t) for i, t in enumerate(tensors)])
        binding = self._bind(tensors)
        feeds = [self._feed(i, t, sy.evaluate(shape, binding))
                 for i, (t, shape) in enumerate(zip(tensors, self._geon_feed_shapes))]
        outer = _CALL.binding, _CALL.device  # a body's module runs inside a scan's call
        _CALL.binding, _CALL.device = binding, feeds[self._geon_binders[0][0]].device
        try:
            return self._run(feeds)
        finally:
            _CALL.binding, _CALL.device = outer

    def _run(self, feeds: list) -> Any:
        """The results from the checked feeds (under the call's binding, if any)."""
        values: list[Any] = []
        for op, dtype, how, ref in self._geon_steps:
            if how is _FEED:
                v = feeds[ref]
            elif how is _STATE:
                v = getattr(self, ref)
            elif how is _CONST:
                v = getattr(self, ref)
                if v.dim() != len(op.axes):
                    v = v.expand(shape_of(op))
            else:
                v = how(op, *[values[k] for k in ref])
                if dtype is not None and v.dtype != dtype:
                    v = v.to(dtype)
            values.append(v)
        out = tuple(None if k is None else values[k].clone()
                    if k in self._geon_copied_results else values[k]
                    for k in self._geon_results)
        return out[0] if self.single else out


def _initial_values(comp, transformer):
    """``{variable: array}``: with a transformer, its state (a variable it does not hold
    starts at its initial value); without one, what ``initialize`` would give: the
    initial values, then the graph's initializers."""
    if transformer is not None:
        return {v: transformer.state[v] if v in transformer.state else v.initial_array()
                for v in comp.variables}
    values = {v: v.initial_array() for v in comp.variables}
    if comp.initializers:
        from geon.op_graph.reference import evaluate
        evaluate(comp.initializers, state=values)
    return values


OutputOrder = Union[str, None, AxesLike]


def to_torch(results: Union[og.Op, list[og.Op], tuple[og.Op, ...]],
             *placeholders: og.Placeholder, transformer: Optional[Transformer] = None,
             output_order: Union[OutputOrder, Sequence[OutputOrder]] = "batch_first",
             ) -> TorchComputation:
    """An ``nn.Module`` computing ``results`` (an op, or a list or tuple of ops) from
    ``placeholders`` with PyTorch ops, as ``transformer.computation(results,
    *placeholders)`` would.

    Each input is laid out as its placeholder's axes. Each output is laid out as
    ``output_order`` says: ``"batch_first"`` (the default: the result's batch axes
    first, as PyTorch lays out batches, then its other axes in the graph's order),
    ``"graph"`` (the graph's order, as geon's own computations return it), or the
    result's axes in the order wanted; with several results, one string for all or a
    list with one entry per result. ``module.output_axes`` says what was chosen.

    The graph is copied and lowered by geon's pass pipeline to semi-primitive ops, each
    run by its :data:`TORCH_OPS` rule; an op without one raises a
    :class:`~geon.errors.LoweringError` here, naming it and where it was built. Dtypes
    are geon's (float32 stays float32). The module runs on any device
    (``module.to("cuda")``) and autograd differentiates through it.

    Variables become parameters (trainable floating-point ones) or buffers (the rest),
    named after the Variables (``_attribute_name``; two Variables that would get the
    same name raise :class:`~geon.errors.ArgumentError` naming both). Their values are
    ``transformer``'s state (e.g. after training with it; a Variable it does not hold
    starts at its initial value), or without one, what ``initialize`` gives (initial
    values, then the graph's ``initializers``). Assignments (``SetItem``) among the
    results write into the parameter or buffer in place, without autograd, as in geon;
    differentiate a computation without assignments. Results are new tensors or
    autograd results, never the parameters themselves.

    Symbolic lengths (doc/symbolic_axes.rst) are dynamic dimensions: one module runs
    every binding, each call binding the symbols from its inputs' shapes as the NumPy
    transformer does (a :class:`~geon.errors.FeedError` where inputs disagree). See
    doc/torch_export.rst.
    """
    requested, single = og.as_op_list(results, "to_torch: results")
    orders = _per_result(output_order, requested, single)
    mapping = clone_graph(requested)
    copies = [mapping[og.snap(r)] for r in requested]
    for i, (r, order) in enumerate(zip(requested, orders)):
        if isinstance(r, og.TensorOp):
            what = "output_order" if single else f"output_order[{i}]"
            axes = _output_axes(r, order, what)
            if tuple(axes) != tuple(copies[i].axes):
                copies[i] = og.axes_with_order(copies[i], axes)
    with no_gc():
        comp = Computation(_TorchLowering(), copies[0] if single else copies, placeholders)
    return TorchComputation(comp, _initial_values(comp, transformer))
