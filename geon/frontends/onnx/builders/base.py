"""The one table of ONNX builders, :data:`OPS`, and what the builders share.

``OPS`` maps ``(domain, op type)`` to builders, each for a range of opset versions;
:func:`onnx_op` registers one. A builder takes a
:class:`~geon.frontends.onnx.importer.Context` (the node's inputs, attributes and opset
version) and returns one :class:`~geon.frontends.onnx.importer.Value` per output
(``None`` for an output it does not make). It builds ``be.np`` ops, reads every
attribute it honours through ``ctx.attr`` (an attribute nobody read makes the import
fail) and raises ``ctx.unsupported(...)`` for any setting it cannot compute exactly.

The builders live in the modules of :mod:`geon.frontends.onnx.builders`, one per family
of operators; each registers its builders here when it is imported.
"""
from typing import Any, Callable

import numpy as np

import geon as be
from geon.frontends.onnx.loading import UnsupportedOnnxOp, narrow_format
from geon.op_graph import op_graph as og

gnp = be.np


#: ``{(domain, op_type): [(first_version, last_version, builder), ...]}``
OPS: dict[tuple[str, str], list[tuple[int, int, Callable[..., Any]]]] = {}

_LAST = 10 ** 6


def onnx_op(op_type: str, since: int = 1, until: int = _LAST, domain: str = ""
            ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: register a builder for ``op_type`` at opset versions
    ``since..until`` (inclusive)."""
    def register(fn):
        OPS.setdefault((domain, op_type), []).append((since, until, fn))
        return fn
    return register


def takes_structures(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator: the builder takes sequence and optional values too (the importer
    refuses them, naming the node, as the inputs of any other builder)."""
    setattr(fn, "takes_structures", True)
    return fn


def find_builder(domain, op_type, version, where):
    """The builder of ``op_type`` at ``version``, or :class:`UnsupportedOnnxOp`."""
    entries = OPS.get((domain, op_type))
    if not entries:
        raise UnsupportedOnnxOp(f"{where}: op type {op_type!r} is not supported")
    for lo, hi, fn in entries:
        if lo <= version <= hi:
            return fn
    ranges = ", ".join(f"{lo}-{hi if hi != _LAST else ''}" for lo, hi, _ in entries)
    raise UnsupportedOnnxOp(f"{where}: opset {version} is not supported for {op_type} "
                            f"(supported: {ranges})")


def carrier(dtype):
    """The dtype geon computes an ONNX type in: booleans and the narrow float formats
    (bfloat16, float8, float4) as float32, the 4- and 2-bit integers as int8 / uint8."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return np.dtype(np.float32)
    fmt = narrow_format(dtype)
    if fmt is not None:
        return np.dtype(np.float32) if not fmt.startswith(("int", "uint")) else \
            np.dtype(np.int8 if fmt.startswith("int") else np.uint8)
    return dtype


def is_float(dtype):
    """Whether an ONNX type (as a NumPy dtype) is floating point, narrow ones included."""
    dtype = np.dtype(dtype)
    fmt = narrow_format(dtype)
    return fmt is not None and not fmt.startswith(("int", "uint")) or \
        fmt is None and dtype.kind == "f"


def to_narrow(op, dtype, saturate=True, round_mode="up"):
    """``op`` rounded to the narrow format ``dtype`` and held in its carrier (float32,
    int8 or uint8). A float64 value is rounded in float64 (once), anything else in
    float32."""
    fmt = narrow_format(dtype)
    if fmt.startswith(("int", "uint")):
        if op.dtype.kind == "f" and op.dtype != np.float64:
            op = cast(op, np.float32)
    elif op.dtype != np.float64:  # integers too: a float format's result can be NaN
        op = cast(op, np.float32 if op.dtype.kind == "f" or op.dtype.itemsize <= 2
                  else np.float64)
    r = gnp.round_to_format(op, fmt, saturate=saturate, round_mode=round_mode)
    return cast(r, carrier(dtype))


def cast(op, dtype):
    """``op`` converted to the carrier of ``dtype`` (float -> int truncates; -> bool
    is ``!= 0``)."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        r = gnp.not_equal(op, 0)
        return r if r.dtype.kind == "f" else og.Add(r, 0, dtype=np.dtype(np.float32))
    if op.dtype == dtype:
        return op
    # x + -0.0 is x for every float, -0.0 included (x + 0 is not); an integer adds an
    # integer 0, so that it is converted as an integer (not through float64)
    return og.Add(op, -0.0 if op.dtype.kind == "f" else 0, dtype=dtype)


def _same(ctx, op, i=0):
    """``op`` as a result with input ``i``'s ONNX type (a narrow type's result computed
    in float32 is rounded to the format once; arithmetic overflows as IEEE does, to
    infinity or, in a format without one, NaN: saturation is a rule of ``Cast`` only)."""
    d = ctx.dtype(i)
    if narrow_format(d) is not None:
        return ctx.out(to_narrow(op, d, saturate=False), d)
    return ctx.out(cast(op, carrier(d)), d)


def _norm_axis(ctx, axis, rank):
    if not -rank <= axis < max(rank, 1):
        raise ctx.unsupported(f"axis {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


def _float(ctx, i=0):
    if not is_float(ctx.dtype(i)):
        raise ctx.unsupported(f"input {i} of type {ctx.dtype(i)} is not supported "
                              f"(floating point only)")
    return ctx.tensor(i)


# --- elementwise ------------------------------------------------------------------------

def _empty_elementwise(ctx, dtype=None):
    """For an elementwise node with an input of no elements: its result, known from the
    broadcast shape alone (``None`` when every input has elements)."""
    present = [i for i in range(ctx.n_inputs()) if ctx.has(i)]
    if not any(0 in ctx.shape(i) for i in present):
        return None
    shape = np.broadcast_shapes(*(ctx.shape(i) for i in present))
    return [ctx.known(np.empty(shape, dtype if dtype is not None else ctx.dtype(0)))]


def _unary(op_type, fn, since=1, floating=True):
    @onnx_op(op_type, since)
    def build(ctx):
        empty = _empty_elementwise(ctx)
        if empty is not None:
            return empty
        x = _float(ctx) if floating else ctx.tensor(0)
        return [_same(ctx, fn(x))]
    build.__name__ = f"build_{op_type}"
