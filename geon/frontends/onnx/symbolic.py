"""Shape arithmetic over symbolic lengths, on the host at import.

A graph input's ``dim_param`` dimension is a symbolic length (``Sym``), bound when the
model runs. ``Shape`` of a tensor with one gives a value known at import whose
elements are ints and ``Sym`` expressions (an object array; see
:func:`geon.frontends.onnx.importer.is_symbolic_array`). The ops exporters apply to
such values (``Gather``, ``Unsqueeze``, ``Concat``, ``Slice``, arithmetic, ``Cast`` to
an integer type, ...) are computed here, on those expressions, so that a ``Reshape``,
``Expand`` or ``ConstantOfShape`` downstream receives its target shape as expressions
and builds one computation for every binding. An op outside :data:`HOST_OPS` given
such a value reads it as a tensor computed when the model runs (its symbolic elements
from the binding), and what needs an int at import (an index, a comparison whose
answer depends on the binding) is a clear error naming the node.
"""

import keyword
import re
from typing import Any, Callable

import numpy as np

import geon as be
from geon.op_graph import op_graph as og
from geon.op_graph.symbols import MAX_NAME, Sym, SymbolicLengthError
from geon.transformers.codegen_text import RESERVED


def is_symbolic_array(array: Any) -> bool:
    """Whether ``array`` is a shape value known at import that holds symbolic lengths
    (an object array of ints and ``Sym`` expressions)."""
    return isinstance(array, np.ndarray) and array.dtype == object


def symbolic_tensor(array: np.ndarray, dtype: Any) -> og.TensorOp:
    """The op whose value is ``array`` (ints and symbolic lengths) in ``dtype``, the
    symbolic elements computed from the binding when the model runs."""
    from geon.op_graph.primitives import LengthValue
    flat = [LengthValue(v, dtype=dtype) if isinstance(v, Sym)
            else be.np.constant(np.asarray(v, dtype)) for v in array.ravel()]
    if array.ndim == 0:
        return flat[0]
    parts = [be.np.reshape(f, (1,)) for f in flat]
    whole = parts[0] if len(parts) == 1 else be.np.concatenate(parts, axis=0)
    return whole if array.ndim == 1 else be.np.reshape(whole, array.shape)


def symbol_name(dim_param, input_name, k):
    """The symbol of a dimension without a length: its ``dim_param`` (the same name in
    two inputs is one symbol) made an identifier, or ``<input>_<k>`` for an unnamed
    one."""
    name = dim_param or f"{input_name}_{k}"
    name = re.sub(r"\W", "_", name.encode("ascii", "replace").decode("ascii"))
    if not name[:1].isalpha() or keyword.iskeyword(name) or name in RESERVED \
            or name in ("np", "setup", "run"):  # (names generated code uses)
        name = "s_" + name
    return name[:MAX_NAME]


def _obj(a: Any) -> np.ndarray:
    """``a`` as an object array (ints stay Python ints, as ``Sym`` arithmetic wants)."""
    if isinstance(a, Sym):
        return _scalar(a)
    arr = np.asarray(a)
    if arr.dtype == object:
        return arr
    out = np.empty(arr.shape, dtype=object)
    out[...] = arr.tolist() if arr.ndim else int(arr)
    return out


def _ints(ctx, i):
    return [int(v) for v in np.ravel(ctx.const(i))]


def _axis(ctx, axis, rank):
    if not -rank <= axis < rank:
        raise ctx.unsupported(f"axis {axis} out of range for rank {rank}")
    return axis % rank


def _gather(ctx):
    data, idx = _obj(ctx.const(0)), np.asarray(ctx.const(1)).astype(np.int64)
    axis = _axis(ctx, ctx.attr("axis", 0), data.ndim)
    n = data.shape[axis]
    if idx.size and (idx.min() < -n or idx.max() >= n):
        raise ctx.unsupported(f"index out of range for axis of length {n}")
    return np.take(data, idx % n if n else idx, axis=axis)


def _axes(ctx, since_input):
    if ctx.version >= since_input:
        return _ints(ctx, 1) if ctx.has(1) else None
    return ctx.attr("axes")


def _unsqueeze(ctx):
    data, axes = _obj(ctx.const(0)), _axes(ctx, 13)
    if not axes:
        raise ctx.unsupported("Unsqueeze needs axes")
    n = data.ndim + len(axes)
    for a in sorted(_axis(ctx, a, n) for a in axes):
        data = np.expand_dims(data, a)
    return data


def _squeeze(ctx):
    data, axes = _obj(ctx.const(0)), _axes(ctx, 13)
    if not axes:
        return np.squeeze(data)
    return np.squeeze(data, tuple(_axis(ctx, a, data.ndim) for a in axes))


def _concat(ctx):
    parts = [_obj(ctx.const(i)) for i in range(ctx.n_inputs()) if ctx.has(i)]
    return np.concatenate(parts, _axis(ctx, ctx.attr("axis"), parts[0].ndim))


def _slice(ctx):
    data = _obj(ctx.const(0))
    if ctx.version < 10:
        starts, ends = ctx.attr("starts"), ctx.attr("ends")
        axes = ctx.attr("axes") or list(range(len(starts)))
        steps = [1] * len(starts)
    else:
        starts, ends = (list(np.ravel(ctx.const(i))) for i in (1, 2))
        if any(isinstance(v, Sym) for v in starts + ends):
            return None   # a symbolic number of entries: the builder's slice
        starts, ends = [int(v) for v in starts], [int(v) for v in ends]
        axes = _ints(ctx, 3) if ctx.has(3) else list(range(len(starts)))
        steps = _ints(ctx, 4) if ctx.has(4) else [1] * len(starts)
    key = [slice(None)] * data.ndim
    for s, e, a, st in zip(starts, ends, axes, steps):
        if st == 0:
            raise ctx.unsupported("slice step 0")
        key[_axis(ctx, a, data.ndim)] = slice(s, e, st)
    return data[tuple(key)]


def _reshape(ctx):
    data = _obj(ctx.const(0))
    shape = _ints(ctx, 1)
    if not ctx.attr("allowzero", 0):
        shape = [data.shape[k] if d == 0 and k < data.ndim else d
                 for k, d in enumerate(shape)]
    return data.reshape(shape)


def _cast(ctx):
    to = ctx.attr("to")
    from geon.frontends.onnx.loading import elem_dtype
    dtype = elem_dtype(to)
    if dtype is None or np.dtype(dtype).kind not in "iu":
        return None  # a float (or other) value: a tensor computed at run time
    return _obj(ctx.const(0))


def _binary(fn: Callable) -> Callable:
    def build(ctx):
        return np.vectorize(fn, otypes=[object])(_obj(ctx.const(0)), _obj(ctx.const(1)))
    return build


def _div(a, b):
    if isinstance(b, Sym):
        from geon.op_graph.symbols import exact_quotient
        return exact_quotient(a, b)  # (lengths: exact, or a clear error)
    if b == 0:
        raise ZeroDivisionError("integer division by zero")
    if isinstance(a, Sym):
        return a // b   # (lengths are >= 0: flooring is ONNX's truncation)
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _mod(a, b):
    if isinstance(b, Sym):
        raise SymbolicLengthError(f"{a!r} % {b!r}: a remainder modulo a symbolic length")
    return a % b


def _equal(a, b):
    """Whether two lengths are equal, where that is known at import: equal
    expressions, two ints, or a length against a negative int (a length is never
    negative: the exporters' ``Equal(shape, -1)``)."""
    if isinstance(a, Sym) or isinstance(b, Sym):
        if isinstance(a, Sym) and isinstance(b, Sym) and a == b:
            return True
        other = b if isinstance(a, Sym) else a
        if not isinstance(other, Sym) and other < 0:
            return False
        raise SymbolicLengthError(f"whether {a!r} == {b!r} is known only when the model "
                                f"runs")
    return a == b


def _where(ctx):
    cond = np.asarray(ctx.const(0)).astype(bool)
    return np.where(cond, _obj(ctx.const(1)), _obj(ctx.const(2)))


def _identity(ctx):
    return _obj(ctx.const(0))


#: op type -> a function of the node's context returning the result (an object array
#: of ints and symbolic lengths), or None to leave the node to its builder.
HOST_OPS: dict = {
    "Gather": _gather, "Unsqueeze": _unsqueeze, "Squeeze": _squeeze, "Concat": _concat,
    "Slice": _slice, "Reshape": _reshape, "Cast": _cast, "Identity": _identity,
    "Add": _binary(lambda a, b: a + b), "Sub": _binary(lambda a, b: a - b),
    "Mul": _binary(lambda a, b: a * b), "Div": _binary(_div), "Mod": _binary(_mod),
    "Max": _binary(lambda a, b: a if a == b else max(a, b)),
    "Min": _binary(lambda a, b: a if a == b else min(a, b)),
    "Equal": _binary(_equal), "Where": _where,
}


def host_result(ctx) -> Any:
    """The result of the node of ``ctx`` computed on the host (see :data:`HOST_OPS`),
    an object array; ``None`` where the node is left to its builder."""
    fn = HOST_OPS.get(ctx.node.op_type)
    if fn is None or ctx.node.domain not in ("", "ai.onnx"):
        return None
    if ctx.node.op_type == "Mod" and ctx.attr("fmod", 0):
        return None
    out = fn(ctx)
    if out is None:
        return None
    if ctx.node.op_type == "Equal":
        return np.asarray(np.asarray(out, dtype=object).tolist(), dtype=bool)
    out = _obj(out) if isinstance(out, np.ndarray) else _scalar(out)
    if not any(isinstance(v, Sym) for v in out.ravel()):
        return np.asarray(out.tolist(), dtype=np.int64)  # no symbol left: plain ints
    return out


def _scalar(v: Any) -> np.ndarray:
    out = np.empty((), dtype=object)
    out[()] = v
    return out
