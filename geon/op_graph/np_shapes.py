"""The NumPy family's shape functions (``reshape``, ``transpose``, ``concatenate``,
``take``, ``pad``, indexing ...). ``geon.np`` (:mod:`geon.op_graph.np_ops`) re-exports
them."""

import numbers
from typing import Any, Optional, Sequence, Union

import numpy as np

from geon.errors import ArgumentError, AxisIndexError, AxisMismatchError
from geon.op_graph import nn_ops
from geon.op_graph import op_graph as og
from geon.op_graph import primitives as pr
from geon.op_graph.symbols import Sym, cut, exact_quotient
from geon.op_graph.axes import Axes
from geon.op_graph.coercion import (PositionalAxis, canonical_axes, drop_stretched,
                                    positional_shape, split_axes, temp_axis)
from geon.op_graph.np_base import (ArrayLike, AxisArg, Shape, _axis_list, _builtin_max,
                                   _builtin_sum, _front, _named_union, _normalize_axis,
                                   _rename, _shape, _tensor, _with_pos,
                                   cast_through_reorder, ndim)


# --- shapes ---------------------------------------------------------------------------------

def reshape(a: ArrayLike, newshape: Any) -> og.TensorOp:
    """NumPy's ``reshape`` (row-major; one dimension may be -1)."""
    x = _front(_tensor(a, "reshape"))
    pos = positional_shape(x)
    if isinstance(newshape, (numbers.Integral, np.integer, Sym)):
        newshape = (newshape,)
    newshape = [n if isinstance(n, Sym) else int(n) for n in newshape]
    size = 1
    for n in pos:
        size *= n
    unknown = [k for k, n in enumerate(newshape) if not isinstance(n, Sym) and n == -1]
    if len(unknown) > 1:
        raise ArgumentError("reshape: can only specify one unknown dimension")
    if unknown:
        rest = 1
        for k, n in enumerate(newshape):
            rest *= n if k != unknown[0] else 1
        try:
            newshape[unknown[0]] = exact_quotient(size, rest)
        except TypeError:   # (SymbolicLengthError) not a multiple, or by zero
            raise ArgumentError(f"reshape: cannot reshape array of size {size} into shape "
                                f"{tuple(newshape)}") from None
    newshape = _shape(newshape)
    known = 1
    for n in newshape:
        known *= n
    if known != size:
        raise ArgumentError(f"reshape: cannot reshape array of size {size} into shape "
                            f"{newshape}")
    if newshape == pos:
        return x
    return pr.Reshape(x, _with_pos(x, newshape))


def ravel(a: ArrayLike) -> og.TensorOp:
    """NumPy's ``ravel``: the elements in row-major order, 1-D."""
    return reshape(a, -1)


def transpose(a: ArrayLike, axes: Optional[Sequence[int]] = None) -> og.TensorOp:
    """NumPy's ``transpose``: the dimensions permuted (reversed by default)."""
    x = _front(_tensor(a, "transpose"))
    special, pos = split_axes(x)
    n = len(pos)
    perm = list(range(n))[::-1] if axes is None else \
        [_normalize_axis(p, n, "transpose") for p in axes]
    if sorted(perm) != list(range(n)):
        raise ArgumentError(f"transpose: axes {axes} don't match array")
    if perm == list(range(n)):
        return x
    # Rename first (a view of x as it is), then reorder: source dimension perm[i] gets
    # the canonical name of destination i.
    dest = {p: i for i, p in enumerate(perm)}
    y = _rename(x, [f"-{n - dest[i]}" for i in range(n)])
    target = special + [y.axes.find(f"-{n - i}") for i in range(n)]
    return og.AxesWithOrder(y, Axes(target))


def swapaxes(a: ArrayLike, axis1: int, axis2: int) -> og.TensorOp:
    """NumPy's ``swapaxes``."""
    n = ndim(a)
    i, j = _normalize_axis(axis1, n, "swapaxes"), _normalize_axis(axis2, n, "swapaxes")
    perm = list(range(n))
    perm[i], perm[j] = perm[j], perm[i]
    return transpose(a, perm)


def expand_dims(a: ArrayLike, axis: Union[int, Sequence[int]]) -> og.TensorOp:
    """NumPy's ``expand_dims``: unit dimensions inserted at ``axis`` (an int or tuple,
    positions in the result)."""
    x = _tensor(a, "expand_dims")
    pos = positional_shape(x)
    items = axis if isinstance(axis, (tuple, list)) else (axis,)
    n = len(pos) + len(items)
    where_ = _axis_list(tuple(items), n, "expand_dims")
    it = iter(pos)
    return reshape(x, tuple(1 if i in where_ else next(it) for i in range(n)))


def squeeze(a: ArrayLike, axis: AxisArg = None) -> og.TensorOp:
    """NumPy's ``squeeze``: unit dimensions removed (all of them, or those at
    ``axis``)."""
    x = _tensor(a, "squeeze")
    pos = positional_shape(x)
    if axis is None:
        drop = [i for i, n in enumerate(pos) if n == 1]
    else:
        drop = _axis_list(axis, len(pos), "squeeze")
        if any(pos[i] != 1 for i in drop):
            raise ArgumentError("squeeze: cannot select an axis to squeeze out which has size "
                                "not equal to one")
    return reshape(x, tuple(n for i, n in enumerate(pos) if i not in drop))


def broadcast_to(a: ArrayLike, shape: Shape) -> og.TensorOp:
    """NumPy's ``broadcast_to``."""
    x = _front(_tensor(a, "broadcast_to"))
    shape = _shape(shape)
    pos = positional_shape(x)
    ok = len(pos) <= len(shape) and all(
        p in (1, s) for p, s in zip(pos[::-1], shape[::-1]))
    if not ok:
        raise AxisMismatchError(f"broadcast_to: cannot broadcast a tensor of shape {pos} "
                                f"to {shape} ({x.name})")
    out = _with_pos(x, shape)
    y = drop_stretched(x, out)
    return y if y.axes.names == out.names else og.Broadcast(y, out)


def concatenate(arrays: Sequence[ArrayLike], axis: int = 0) -> og.TensorOp:
    """NumPy's ``concatenate``: each array written into its part of the result (an
    ``Unslice``) and the parts added."""
    xs = [_front(_tensor(x, "concatenate")) for x in arrays]
    if not xs:
        raise ArgumentError("concatenate: need at least one array to concatenate")
    shapes = [positional_shape(x) for x in xs]
    nd = len(shapes[0])
    if nd == 0:
        raise ArgumentError("concatenate: zero-dimensional arrays cannot be concatenated")
    if any(len(s) != nd for s in shapes):
        raise ArgumentError("concatenate: all the input arrays must have same number of "
                            "dimensions")
    ax = _normalize_axis(axis, nd, "concatenate")
    for s in shapes[1:]:
        if any(s[i] != shapes[0][i] for i in range(nd) if i != ax):
            raise ArgumentError(f"concatenate: all the input array dimensions except for the "
                                f"concatenation axis must match exactly: {shapes}")
    if len(xs) == 1:
        return xs[0]
    total = _builtin_sum(s[ax] for s in shapes)
    out_shape = tuple(total if i == ax else n for i, n in enumerate(shapes[0]))
    special = _named_union(xs, "concatenate")
    out = Axes(special + list(canonical_axes(out_shape)))
    parts, offset = [], 0
    for x, s in zip(xs, shapes):
        own = Axes(special + [a for a in x.axes if isinstance(a, PositionalAxis)])
        if own.names != x.axes.names:
            x = og.Broadcast(x, own)
        key = [slice(None)] * len(out)
        key[len(special) + ax] = slice(offset, offset + s[ax])
        offset += s[ax]
        parts.append(pr.Unslice(x, out, key))
    r: og.TensorOp = parts[0]
    for p in parts[1:]:
        r = og.Add(r, p)
    return r


def stack(arrays: Sequence[ArrayLike], axis: int = 0) -> og.TensorOp:
    """NumPy's ``stack``: arrays of one shape joined along a new dimension."""
    xs = [_tensor(x, "stack") for x in arrays]
    if not xs:
        raise ArgumentError("stack: need at least one array to stack")
    shapes = {positional_shape(x) for x in xs}
    if len(shapes) != 1:
        raise ArgumentError(f"stack: all input arrays must have the same shape: {sorted(shapes)}")
    n = len(next(iter(shapes))) + 1
    ax = _normalize_axis(axis, n, "stack")
    return concatenate([expand_dims(x, ax) for x in xs], axis=ax)


def tile(A: ArrayLike, reps: Any) -> og.TensorOp:
    """NumPy's ``tile``: ``A`` repeated ``reps[i]`` times along dimension ``i`` (with
    ``reps`` or the shape padded with leading 1s to the same length)."""
    x = _tensor(A, "tile")
    reps = tuple(reps) if isinstance(reps, (tuple, list)) else (reps,)
    reps = _shape(reps)
    pos = positional_shape(x)
    d = _builtin_max(len(pos), len(reps))
    shape = (1,) * (d - len(pos)) + pos
    reps = (1,) * (d - len(reps)) + reps
    if all(r == 1 for r in reps):
        return reshape(x, shape)
    pairs = [n for s, r in zip(shape, reps) for n in (r, s)]
    wide = broadcast_to(reshape(x, [n for s in shape for n in (1, s)]), pairs)
    return reshape(wide, tuple(s * r for s, r in zip(shape, reps)))


def pad(array: ArrayLike, pad_width: Any, mode: str = "constant",
        constant_values: Union[int, float] = 0) -> og.TensorOp:
    """NumPy's ``pad`` for ``mode`` ``"constant"`` (one ``constant_values`` number),
    ``"reflect"`` and ``"edge"``. ``pad_width`` is an int, ``(before, after)`` or one
    pair per dimension. Unlike NumPy, ``reflect`` needs each count below the dimension's
    length (PyTorch's rule): the edge is mirrored once."""
    x = _front(_tensor(array, "pad"))
    special, pos = split_axes(x)
    widths = np.asarray(pad_width)
    if widths.dtype.kind not in "iu" or (widths.size and widths.min() < 0):
        raise ValueError(f"pad: pad_width holds integers >= 0, not {pad_width!r}")
    try:
        widths = np.broadcast_to(widths, (len(pos), 2))
    except ValueError:
        raise ValueError(f"pad: pad_width {pad_width!r} does not fit an array of "
                         f"dimension {len(pos)}") from None
    if np.ndim(constant_values):
        raise ValueError("pad: constant_values must be one number")
    r = x
    for a, (before, after) in zip(pos, widths.tolist()):
        if before or after:
            new = PositionalAxis(a.length + before + after, a.name)
            r = nn_ops.pad_axis(r, r.axes.find(a.name), before, after, mode,
                                float(constant_values), out_axis=new)
    return r


def take(a: ArrayLike, indices: ArrayLike, axis: Optional[int] = None) -> og.TensorOp:
    """NumPy's ``take``: the entries of ``a`` at the integer ``indices`` (a tensor or an
    array-like) along ``axis`` (``None``: of the flattened ``a``); the result has shape
    ``a.shape[:axis] + indices.shape + a.shape[axis + 1:]``. Negative indices count from
    the end; others out of range raise :class:`~geon.errors.IndexOutOfRangeError` when
    the computation runs. Differentiable in ``a`` (the derivative is a scatter-add)."""
    x = _front(_tensor(a, "take"))
    if axis is None:
        x, axis = ravel(x), 0
    special, pos = split_axes(x)
    p = _normalize_axis(axis, len(pos), "take")
    idx = _tensor(indices, "take")
    if idx.dtype.kind not in "iu":
        raise TypeError(f"take: indices must be integers, not {idx.dtype}")
    _, ipos = split_axes(idx)
    idx = cast_through_reorder(idx, [temp_axis(b.length) if isinstance(b, PositionalAxis)
                                     else b for b in idx.axes])
    r = nn_ops.Gather(x, idx, pos[p])
    n = len(pos) - 1 + len(ipos)
    return _front(_rename(r, [f"-{n - k}" for k in range(n)]))


def _along(a, axis, what):
    """``(x, positional axis)`` for an op along ``axis`` (``None``: of the flattened
    ``a``)."""
    x = _front(_tensor(a, what))
    if axis is None:
        x, axis = ravel(x), 0
    _, pos = split_axes(x)
    return x, pos[_normalize_axis(axis, len(pos), what)]


def cumsum(a: ArrayLike, axis: Optional[int] = None) -> og.TensorOp:
    """NumPy's ``cumsum`` (running sums along ``axis``; ``None``: of the flattened
    ``a``). The result keeps ``a``'s dtype."""
    x, ax = _along(a, axis, "cumsum")
    return nn_ops.CumSum(x, ax)


def sort(a: ArrayLike, axis: int = -1) -> og.TensorOp:
    """NumPy's ``sort`` (stable, ascending; ``axis=None`` sorts the flattened ``a``).
    Differentiable: the derivative moves back to where each value came from."""
    x, ax = _along(a, axis, "sort")
    return nn_ops.Sort(x, ax).outputs[0]


def argsort(a: ArrayLike, axis: int = -1) -> og.TensorOp:
    """NumPy's ``argsort`` with ``kind="stable"`` (int64)."""
    x, ax = _along(a, axis, "argsort")
    return nn_ops.Sort(x, ax).outputs[1]


def topk(a: ArrayLike, k: int, axis: int = -1) -> tuple[og.TensorOp, ...]:
    """PyTorch's ``topk``: ``(values, indices)`` of the ``k`` largest entries along
    ``axis``, largest first (ties: the earlier position first)."""
    x, ax = _along(a, axis, "topk")
    outs = nn_ops.TopK(x, ax, k, new_axis=temp_axis(int(k))).outputs
    n = ndim(x)
    return tuple(_rename(o, [f"-{n - i}" for i in range(n)]) for o in outs)


def _sliced(k, n):
    """Slice ``k`` of a dimension of length ``n``: ``(key, length)``, the key with its
    bounds as positions where ``n`` is symbolic (the slice must then fit: checked at
    each call, see :func:`~geon.op_graph.symbols.cut`)."""
    if k == slice(None):
        return k, n
    if isinstance(n, Sym) or isinstance(k.start, Sym) or isinstance(k.stop, Sym):
        try:
            key, length, _ = cut(k, n)
        except ValueError as e:
            raise AxisIndexError(f"x[key]: slice {k.start}:{k.stop}:{k.step} does not fit "
                                 f"a dimension of length {n!r}: {e}") from None
        return key, length
    return k, len(range(*k.indices(n)))


def getitem(x, key):
    """``x[key]`` with basic slicing (slices, integers, ``None``, ``...``) over the
    positional dimensions."""
    x = _front(_tensor(x, "x[key]"))
    special, pos = split_axes(x)
    if not isinstance(key, tuple):
        key = (key,)
    if _builtin_sum(1 for k in key if k is Ellipsis) > 1:
        raise AxisIndexError("an index can only have a single ellipsis ('...')")
    used = _builtin_sum(1 for k in key if k is not None and k is not Ellipsis)
    if used > len(pos):
        raise AxisIndexError(f"too many indices for array: array is {len(pos)}-dimensional, "
                             f"but {used} were indexed")
    if any(k is Ellipsis for k in key):
        i = next(i for i, k in enumerate(key) if k is Ellipsis)
        key = key[:i] + (slice(None),) * (len(pos) - used) + key[i + 1:]
    else:
        key = key + (slice(None),) * (len(pos) - used)
    view, shape_out, d = [], [], 0
    for k in key:
        if k is None:
            shape_out.append(1)
            continue
        n = pos[d].length
        d += 1
        if isinstance(k, slice):
            for v in (k.start, k.stop, k.step):
                if v is not None and (isinstance(v, bool) or not isinstance(
                        v, (numbers.Integral, np.integer, Sym)) or v is k.step and
                        isinstance(v, Sym)):
                    raise ArgumentError(f"slice indices must be integers or None, not {v!r}")
            if k.step == 0:
                raise ArgumentError("slice step cannot be zero")
            k = slice(*(v if v is None or isinstance(v, Sym) else int(v)
                        for v in (k.start, k.stop, k.step)))
            if any(isinstance(v, Sym) for v in (k.start, k.stop)):
                pass  # bounds known at a call: cut by _sliced
            elif k.indices(1 << 62) == (0, 1 << 62, 1):
                k = slice(None)  # all of the dimension (its length may be symbolic)
            k, length = _sliced(k, n)
            view.append(k)
            shape_out.append(length)
        elif isinstance(k, (numbers.Integral, np.integer)) and not isinstance(k, bool):
            if isinstance(n, Sym):  # in range or not: checked at each call
                try:
                    view.append(cut(int(k), n)[0])
                except ValueError as e:
                    raise AxisIndexError(f"index {k} is out of bounds for axis {d - 1} "
                                         f"with size {n!r}: {e}") from None
                continue
            if not -n <= k < n:
                raise AxisIndexError(f"index {k} is out of bounds for axis {d - 1} with size {n}")
            view.append(int(k) % n)
        else:
            raise ArgumentError(f"only basic indexing (integers, slices, None, ...) is "
                                f"supported, not {type(k).__name__} {k!r}")
    r = x
    if any(k != slice(None) for k in view):
        kept = [_sliced(k, p.length)[1] for k, p in zip(view, pos)
                if isinstance(k, slice)]
        full_key = [slice(None)] * len(special) + view
        r = pr.SliceView(x, full_key, _with_pos(x, kept))
    if positional_shape(r) != tuple(shape_out):
        r = reshape(r, tuple(shape_out))
    return r
