"""Sequences and optionals: ``SequenceConstruct``, ``SequenceEmpty``, ``SequenceInsert``,
``SequenceAt``, ``SequenceErase``, ``SequenceLength``, ``ConcatFromSequence``,
``SplitToSequence``, ``Optional``, ``OptionalHasElement``, ``OptionalGetElement``, and
``Identity`` (which passes them through).

A sequence is held at import as a list of the importer's tensor values
(:class:`~geon.frontends.onnx.structures.SequenceValue`), an optional as an empty or a
full box (:class:`~geon.frontends.onnx.structures.OptionalValue`): these builders
rearrange them at import and make geon ops only for the tensors they compute
(``ConcatFromSequence``, ``SplitToSequence``). Every position must therefore be known at
import; one computed at run time is refused, naming the node and the value (which
``import_model(..., input_values=...)`` can fix when it is a graph input).
"""

import numpy as np

from geon.frontends.onnx.builders.base import (_empty_elementwise, _norm_axis, _same, gnp,
                                               onnx_op, takes_structures)
from geon.frontends.onnx.builders.shapes import _slice_along
from geon.frontends.onnx.loading import InvalidOnnxModel, UnsupportedOnnxOp, elem_dtype
from geon.frontends.onnx.structures import (OptionalValue, SequenceValue, describe, kind,
                                            is_structure, value_type)


def _sequence(ctx, i):
    """Input ``i``, which must be a sequence."""
    v = ctx.value(i)
    if not isinstance(v, SequenceValue):
        raise InvalidOnnxModel(f"{ctx.where}: input {i} ({ctx.node.input[i]!r}) is "
                               f"{kind(v)}, not a sequence")
    return v


def _tensor_value(ctx, i):
    """Input ``i``, which must be a tensor."""
    v = ctx.value(i)
    if is_structure(v):
        raise InvalidOnnxModel(f"{ctx.where}: input {i} ({ctx.node.input[i]!r}) is "
                               f"{kind(v)}, not a tensor")
    return v


def _known_int(ctx, i, what):
    """Input ``i``, a scalar integer known at import; one computed at run time raises
    :class:`UnsupportedOnnxOp` with its name as ``value_name``."""
    v = _tensor_value(ctx, i)
    name = ctx.node.input[i]
    if v.array is None:
        e = UnsupportedOnnxOp(
            f"{ctx.where}: {what} (input {i}, {name!r}) is computed at run time; "
            f"sequences are held at import, so {what} must be known at import (a "
            f"constant, or a graph input fixed with input_values=)")
        e.value_name = name
        raise e
    a = np.asarray(v.array)
    if a.size != 1 or a.dtype.kind not in "iu":
        raise InvalidOnnxModel(f"{ctx.where}: {what} (input {i}) must be one integer, "
                               f"not {a.dtype} of shape {a.shape}")
    return int(a.reshape(-1)[0])


def _position(ctx, i, length, inserting=False):
    """Input ``i``, a position in a sequence of ``length`` tensors (``-length`` ..
    ``length - 1``, or up to ``length`` when inserting), made non-negative."""
    p = _known_int(ctx, i, "the position")
    hi = length if inserting else length - 1
    if not -length <= p <= hi:
        raise InvalidOnnxModel(f"{ctx.where}: position {p} is out of range for a "
                               f"sequence of {length} tensors ({-length} to {hi})")
    return p + length if p < 0 else p


def _same_type(ctx, seq, v, what):
    if v.dtype != seq.dtype:
        raise InvalidOnnxModel(f"{ctx.where}: {what} is of type {v.dtype}; the sequence "
                               f"holds {seq.dtype}")


# --- sequences ---------------------------------------------------------------------------

@onnx_op("SequenceConstruct", 11)
@takes_structures
def _sequence_construct(ctx):
    items = [_tensor_value(ctx, i) for i in range(ctx.n_inputs())]
    if not items:
        raise InvalidOnnxModel(f"{ctx.where}: no inputs (SequenceEmpty makes an empty "
                               f"sequence)")
    types = {v.dtype for v in items}
    if len(types) != 1:
        raise InvalidOnnxModel(f"{ctx.where}: the tensors have the types "
                               f"{sorted(str(t) for t in types)}; a sequence holds one")
    return [SequenceValue(items, items[0].dtype)]


@onnx_op("SequenceEmpty", 11)
def _sequence_empty(ctx):
    code = ctx.attr("dtype")
    dtype = np.dtype(np.float32) if code is None else elem_dtype(code)
    if dtype is None:
        raise ctx.unsupported(f"sequences of element type {code} are not supported")
    return [SequenceValue([], dtype)]


@onnx_op("SequenceInsert", 11)
@takes_structures
def _sequence_insert(ctx):
    seq, v = _sequence(ctx, 0), _tensor_value(ctx, 1)
    _same_type(ctx, seq, v, "the tensor inserted")
    n = len(seq.items)
    p = _position(ctx, 2, n, inserting=True) if ctx.has(2) else n
    return [SequenceValue(seq.items[:p] + [v] + seq.items[p:], seq.dtype)]


@onnx_op("SequenceAt", 11)
@takes_structures
def _sequence_at(ctx):
    seq = _sequence(ctx, 0)
    return [seq.items[_position(ctx, 1, len(seq.items))]]


@onnx_op("SequenceErase", 11)
@takes_structures
def _sequence_erase(ctx):
    seq = _sequence(ctx, 0)
    n = len(seq.items)
    p = _position(ctx, 1, n) if ctx.has(1) else n - 1
    if p < 0:
        raise InvalidOnnxModel(f"{ctx.where}: erasing from an empty sequence")
    return [SequenceValue(seq.items[:p] + seq.items[p + 1:], seq.dtype)]


@onnx_op("SequenceLength", 11)
@takes_structures
def _sequence_length(ctx):
    return [ctx.known(np.array(len(_sequence(ctx, 0).items), dtype=np.int64))]


@onnx_op("ConcatFromSequence", 11)
@takes_structures
def _concat_from_sequence(ctx):
    """The tensors joined along ``axis`` (``new_axis=1``: stacked along a new one)."""
    seq = _sequence(ctx, 0)
    axis, new = ctx.attr("axis"), bool(ctx.attr("new_axis", 0))
    if axis is None:
        raise InvalidOnnxModel(f"{ctx.where}: attribute 'axis' is required")
    if not seq.items:
        raise ctx.unsupported("an empty sequence (its result's shape is not defined)")
    shapes = [tuple(v.shape) for v in seq.items]
    rank = len(shapes[0])
    if any(len(s) != rank for s in shapes):
        raise InvalidOnnxModel(f"{ctx.where}: the tensors have the shapes {shapes}; "
                               f"they must have one rank")
    axis = _norm_axis(ctx, axis, rank + 1 if new else rank)
    if new:
        if len(set(shapes)) != 1:
            raise InvalidOnnxModel(f"{ctx.where}: stacking tensors of the shapes "
                                   f"{shapes}")
        out = list(shapes[0][:axis]) + [len(shapes)] + list(shapes[0][axis:])
    else:
        rest = {s[:axis] + s[axis + 1:] for s in shapes}
        if len(rest) != 1:
            raise InvalidOnnxModel(f"{ctx.where}: joining tensors of the shapes {shapes} "
                                   f"along axis {axis}")
        out = list(shapes[0])
        out[axis] = sum(s[axis] for s in shapes)
    known = all(v.array is not None for v in seq.items)
    ctx.bound(out, seq.dtype, known=known)
    if known or 0 in out:  # known, or no elements: NumPy
        if known:
            arrays = [v.array for v in seq.items]
            return [ctx.known((np.stack if new else np.concatenate)(arrays, axis),
                              seq.dtype)]
        return [ctx.known(np.empty(out, seq.dtype))]
    if new:
        return [ctx.out(gnp.stack([v.tensor() for v in seq.items], axis), seq.dtype)]
    keep = [v for v, s in zip(seq.items, shapes) if s[axis] != 0]
    if len(keep) == 1:
        return [ctx.out(keep[0].tensor(), seq.dtype)]
    return [ctx.out(gnp.concatenate([v.tensor() for v in keep], axis), seq.dtype)]


@onnx_op("SplitToSequence", 11)
@takes_structures
def _split_to_sequence(ctx):
    """The parts of the input along ``axis``: of the sizes ``split`` gives (known at
    import), of one size (the last part shorter), or of length 1 each (``keepdims=0``
    drops the axis)."""
    x = _tensor_value(ctx, 0)
    shape = tuple(x.shape)
    axis = _norm_axis(ctx, ctx.attr("axis", 0), len(shape))
    keep = bool(ctx.attr("keepdims", 1))
    n = shape[axis]
    if ctx.has(1):
        v = _tensor_value(ctx, 1)
        if v.array is None:
            e = UnsupportedOnnxOp(f"{ctx.where}: the split (input 1, "
                                  f"{ctx.node.input[1]!r}) is computed at run time; the "
                                  f"parts of a sequence must be known at import")
            e.value_name = ctx.node.input[1]
            raise e
        split = np.asarray(v.array)
        if split.ndim == 0:
            step = int(split)
            if step <= 0:
                raise InvalidOnnxModel(f"{ctx.where}: split {step} must be positive")
            sizes = [min(step, n - k) for k in range(0, n, step)]
        else:
            sizes = [int(s) for s in split.reshape(-1)]
            if sum(sizes) != n or any(s < 0 for s in sizes):
                raise InvalidOnnxModel(f"{ctx.where}: split sizes {sizes} do not add up "
                                       f"to {n}")
        squeeze = False
    else:
        sizes, squeeze = [1] * n, not keep
    parts, start = [], 0
    for s in sizes:
        part = list(shape)
        part[axis] = s
        if squeeze:
            del part[axis]
        if x.array is not None:
            a = x.array[(slice(None),) * axis + (slice(start, start + s),)]
            parts.append(ctx.known(a.reshape(part), x.dtype))
        elif s == 0 or 0 in shape:  # no elements: known from the shape alone
            parts.append(ctx.known(np.empty(part, x.dtype)))
        else:
            t = _slice_along(x.tensor(), axis, start, start + s)
            parts.append(ctx.out(gnp.squeeze(t, axis) if squeeze else t, x.dtype))
        start += s
    return [SequenceValue(parts, x.dtype)]


# --- optionals ---------------------------------------------------------------------------

@onnx_op("Optional", 15)
@takes_structures
def _optional(ctx):
    """An optional holding input 0, or an empty one of the type the ``type`` attribute
    declares."""
    ctx.read.add("type")
    a = ctx.attrs.get("type")
    declared = value_type(a.tp, f"{ctx.where}: attribute 'type'") if a is not None \
        else None
    if ctx.has(0):
        v = ctx.value(0)
        if isinstance(v, OptionalValue):
            raise ctx.unsupported("an optional of an optional")
        inner = v.type if isinstance(v, SequenceValue) else ("tensor", v.dtype)
        if declared is not None and declared != inner:
            raise InvalidOnnxModel(f"{ctx.where}: its input is {describe(inner)}, the "
                                   f"attribute 'type' declares {describe(declared)}")
        return [OptionalValue(v, inner)]
    if declared is None:
        raise InvalidOnnxModel(f"{ctx.where}: an empty optional needs the attribute "
                               f"'type'")
    if declared[0] == "optional":
        raise ctx.unsupported("an optional of an optional")
    return [OptionalValue(None, declared)]


@onnx_op("OptionalHasElement", 15)
@takes_structures
def _optional_has_element(ctx):
    """Whether the optional holds a value (a tensor or a sequence given in its place, as
    opset 18 allows, holds one; a missing input is an empty optional)."""
    full = ctx.has(0) and not (isinstance(ctx.value(0), OptionalValue) and
                               ctx.value(0).value is None)
    return [ctx.known(np.array(full))]


@onnx_op("OptionalGetElement", 15)
@takes_structures
def _optional_get_element(ctx):
    """The optional's value (a tensor or a sequence given in its place is its own)."""
    v = ctx.value(0)
    if not isinstance(v, OptionalValue):
        return [v]
    if v.value is None:
        raise InvalidOnnxModel(f"{ctx.where}: the optional {ctx.node.input[0]!r} is empty "
                               f"(known at import)")
    return [v.value]


# --- Identity ----------------------------------------------------------------------------

@onnx_op("Identity")
@takes_structures
def _identity(ctx):
    """Its input: a tensor, or a sequence or an optional passed on as it is."""
    v = ctx.value(0)
    if is_structure(v):
        return [v]
    empty = _empty_elementwise(ctx)
    if empty is not None:
        return empty
    return [_same(ctx, ctx.tensor(0))]


__all__: list = []
