"""The NumPy transformer's per-op code table and what its rules share.

``NUMPY_CODE`` maps each base-set class to a function ``fn(op, out, args)`` that
returns the lines computing ``op`` into the buffer named ``out`` from the names in
``args``. ``out`` may be the buffer of an arg (the memory planner works in place), so
only the first line may read the args; later lines read and write ``out`` alone.
Rules are registered from modules that mirror the op modules (``op_graph.py``,
``primitives.py``, ``conv.py``, ...); the code generator looks them up with
``NUMPY_CODE.find``.
"""

import numpy as np

from geon.op_graph import op_graph as og
from geon.op_graph import primitives as pr
from geon.op_graph.tables import OpTable
from geon.transformers.codegen_text import py_literal

NUMPY_CODE = OpTable("NUMPY_CODE", "fn(op, out, args) -> [source lines]")
#: Decorator: ``@numpy_code(Cls, ...)`` registers ``fn(op, out, args) -> [lines]``.
numpy_code = NUMPY_CODE.register
#: Names every generated module can use besides ``np`` (and each user op's NumPy
#: function, see :func:`_user_op`).
NUMPY_GLOBALS = {}

#: Ufunc ops that read a one-number constant as a row of it (the last axis of their
#: result, broadcast over the others) where that row has ``ROW_LENGTHS[0]`` to
#: ``ROW_LENGTHS[1]`` elements: NumPy 2.4 runs np.maximum and np.minimum of an array and a
#: 0-d array or scalar at half the speed of two contiguous operands (ReLU on 128 x 1024
#: float32: 106 us against 52 us with a row of zeros; 16 x 8192: 106 against 36; in
#: place on a block of 131,072: 105 against 24). Its arithmetic ufuncs are faster with
#: the scalar, and keep it. In a fused group, a 1-d op's block reads a slice of the
#: row; the sigmoid's clamp gets its row at run time (:func:`_row`).
ROW_OPERAND = frozenset({og.Maximum, og.Minimum})
ROW_LENGTHS = (16, 131072)
_ROWS = {}  # (value, dtype) -> a read-only row of that value (see _shared_row)


def _constant_row(value, dtype, n):
    """A read-only array of ``n`` elements ``value`` of ``dtype``."""
    row = np.full(n, value, dtype)
    row.setflags(write=False)
    return row


def _shared_row(value, dtype, n):
    """A read-only row of at least ``n`` elements ``value`` of ``dtype``, one per value
    and dtype, made longer when a longer one is asked for."""
    key = (value, dtype)
    row = _ROWS.get(key)
    if row is None or row.size < n:
        row = _ROWS[key] = _constant_row(value, dtype, n)
    return row


def _row(value, like):
    """``value`` as a row of ``like``'s last axis (see ROW_OPERAND), or itself where
    that axis has too few or too many elements."""
    n = like.shape[-1] if like.ndim else 0
    if not ROW_LENGTHS[0] <= n <= ROW_LENGTHS[1]:
        return value
    return _shared_row(value, like.dtype, ROW_LENGTHS[1])[:n]


NUMPY_GLOBALS["_row"] = _row


def _expand(x, shape, dim_map):
    """A read-only view of ``x`` as ``shape``: dimension j is x's dimension
    ``dim_map[j]``, or a new (broadcast) one where that is None. For C-contiguous ``x``
    it is made with one ``np.ndarray`` call (a seventh of ``np.broadcast_to``'s time,
    which is most of a small scan step's time for a view of its carry)."""
    if x.flags.c_contiguous:
        st = x.strides
        v = np.ndarray(shape, x.dtype, x, 0, [0 if m is None else st[m] for m in dim_map])
        v.flags.writeable = False
        return v
    return np.broadcast_to(x.reshape([1 if m is None else x.shape[m] for m in dim_map]),
                           shape)


NUMPY_GLOBALS["_expand"] = _expand


def _loop(op):
    """``, dtype=...`` making a ufunc compute in ``op``'s compute dtype, where NumPy
    would otherwise pick a loop of the operands' dtypes (integer or float16 arithmetic
    for a float result) and convert after; empty where the loops agree (comparisons:
    NumPy promotes their operands as :meth:`compute_dtype` says, and ``dtype=`` would
    name the bool result)."""
    ct = op.compute_dtype()
    if op.dtype.kind in "fc" and not isinstance(op, og.Comparison):
        for a in op.args:  # (a loop, not any(): this runs for every op emitted)
            if a.dtype is not ct and a.dtype != ct:
                return f", dtype=np.{ct.name}"
    return ""



# Views are expressions: fn(op, arg) -> expression text.
NUMPY_VIEWS = {
    pr.Dimshuffle: lambda op, x: f"{x}.transpose({py_literal(op.perm)})",
    pr.Reshape: lambda op, x: f"{x}.reshape({py_literal(op.axes.shape)})",
    pr.Expand: lambda op, x: f"_expand({x}, {py_literal(op.axes.shape)}, "
                             f"{py_literal(tuple(op.dim_map))})",
    pr.SliceView: lambda op, x: f"{x}[{index_text(op.key)}]",
}


def _entry(k):
    if isinstance(k, slice):
        a, b, c = (("" if v is None else repr(v)) for v in (k.start, k.stop, k.step))
        return f"{a}:{b}:{c}" if c else f"{a}:{b}"
    return repr(k)


def index_text(key):
    """The text of ``x[key]``'s subscript (one int or slice per dimension), short: NumPy
    parses ``x[0]`` in a quarter of the time of ``x[(0, slice(None, None, None))]``
    (a scan body makes such views at every step). Trailing whole slices are left out;
    where none is, "..." keeps the result a view (``x[0]`` of a vector would be a
    scalar)."""
    if not pr.plain_key(key):  # (symbolic bounds)
        return py_literal(tuple(key) + (Ellipsis,))
    n = len(key)
    while n and key[n - 1] == slice(None):
        n -= 1
    parts = [_entry(k) for k in key[:n]] + ([] if n < len(key) else ["..."])
    return ", ".join(parts) or "..."
