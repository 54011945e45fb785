"""NumPy code for the primitives of :mod:`geon.op_graph.primitives`: matrix products,
reductions, copies, gathers and scatters, sorts and assignments."""

import numpy as np

from geon.op_graph import primitives as pr
from geon.op_graph import special
from geon.op_graph.reference import op_site
from geon.op_graph.symbols import Sym
from geon.transformers.codegen_text import py_literal
from geon.transformers.numpy import blas, segments, skinny
from geon.transformers.numpy.code_table import (NUMPY_GLOBALS, _shared_row, index_text,
                                                numpy_code)


@numpy_code(pr.LengthValue)
def _length_value(op, out, args):
    # the symbols are local names of run(), bound from the feeds' shapes
    return [f"{out}[()] = {op.value!r}"]


@numpy_code(pr.Gemm)
def _gemm(op, out, args):
    a, b = op.args
    if op.batch_rank == 0 and a.dtype == b.dtype == op.dtype and \
            not any(isinstance(n, Sym) for n in a.axes.lengths + b.axes.lengths) and \
            skinny.worth_it(a.axes.lengths, b.axes.lengths, op.dtype):
        # a short side: one pass over the large operand (skinny.py); _c_kernels: whether
        # the computation's compiled mode lets fixed C kernels run
        return [f"_skinny({args[0]}, {args[1]}, {out}, _c_kernels)"]
    return [f"np.matmul({args[0]}, {args[1]}, out={out})"]


NUMPY_GLOBALS["_skinny"] = skinny.matmul


NUMPY_GLOBALS["_gemm_acc"] = blas.accumulate
NUMPY_GLOBALS["_gemm_add"] = blas.add_product
_BLAS_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


#: The NumPy call of each reduction: the ufunc's own ``reduce`` where there is one (what
#: np.sum, np.prod, np.max and np.min call, less about 2 us of Python around it)
_REDUCE_FN = {pr.ReduceSum: "add.reduce", pr.ReduceProd: "multiply.reduce",
              pr.ReduceMax: "maximum.reduce", pr.ReduceMin: "minimum.reduce",
              pr.ReduceArgMax: "argmax", pr.ReduceArgMin: "argmin"}


#: Sums of float32 / float64 matrices of at least ONES_MIN elements, over at most
#: ONES_LENGTH elements per result, are a product with a row of ones (see _reduce).
ONES_LENGTH = 4096
ONES_MIN = 64


def _ones(dtype, n):
    """The name of a read-only row of at least ``n`` ones of ``dtype`` among the
    generated code's globals (made, or made longer, here)."""
    name = f"_ones_{dtype.name}"
    NUMPY_GLOBALS[name] = _shared_row(1, dtype, max(n, ONES_LENGTH))
    return name


@numpy_code(*_REDUCE_FN)
def _reduce(op, out, args):
    x = op.args[0]
    n = x.axes.lengths[op.axis] if x.axes else 0
    size = x.axes.size
    if type(op) is pr.ReduceSum and len(x.axes) == 2 and not isinstance(n, Sym) \
            and 1 <= n <= ONES_LENGTH and x.dtype == op.dtype \
            and op.dtype in _BLAS_DTYPES and (isinstance(size, Sym) or size >= ONES_MIN):
        # NumPy's pairwise sum along rows runs about 4x slower than the BLAS's
        # matrix-vector product with a row of ones (on a few elements NumPy's call is
        # the quicker, by a fraction of a microsecond)
        ones = f"{_ones(op.dtype, n)}[:{n}]"
        pair = (args[0], ones) if op.axis == 1 else (ones, args[0])
        product = f"np.matmul({pair[0]}, {pair[1]}, out={out})"
        if isinstance(size, Sym):
            # a symbolic size: the choice is made per call, as a computation of the
            # binding's fixed lengths makes it (the same sums, bit for bit)
            return [f"if {size!r} >= {ONES_MIN}: {product}",
                    f"else: np.{_REDUCE_FN[type(op)]}({args[0]}, axis="
                    f"{py_literal(op.axis)}, out={out})"]
        return [product]
    return [f"np.{_REDUCE_FN[type(op)]}({args[0]}, axis={py_literal(op.axis)}, out={out})"]


@numpy_code(pr.ReduceMaxArgMax)
def _reduce_max_argmax(op, outs, args):
    # A multi-output op gets one buffer name per output (None: nobody reads it).
    x, = args
    lines = []
    if outs[0] is not None:
        lines.append(f"np.max({x}, axis={py_literal(op.axis)}, out={outs[0]})")
    if outs[1] is not None:
        lines.append(f"np.argmax({x}, axis={py_literal(op.axis)}, out={outs[1]})")
    return lines


@numpy_code(pr.Copy)
def _copy(op, out, args):
    return [f"np.copyto({out}, {args[0]})"]


@numpy_code(pr.Unslice)
def _unslice(op, out, args):
    return [f"{out}.fill(0)", f"{out}[{index_text(op.key)}] = {args[0]}"]


@numpy_code(pr.UnsliceAdd)
def _unslice_add(op, out, args):
    x, a = args
    # (where the plan gave the result x's buffer, x is already there)
    return ([] if out == x else [f"np.copyto({out}, {x})"]) + [
        f"_ua = {out}[{index_text(op.key)}]", f"np.add(_ua, {a}, _ua)"]


@numpy_code(pr.Take)
def _take(op, out, args):
    # _conv_ws: the computation's workspace, which says whether its C may run
    return [f"_take({args[0]}, {args[1]}, {op_site(op)!r}, _conv_ws, out={out})"]


@numpy_code(pr.PutAdd)
def _put_add(op, out, args):
    return [f"_put_add({args[0]}, {args[1]}, {out}, {op_site(op)!r})"]


NUMPY_GLOBALS.update(_take=segments.take, _put_add=special.put_add)


@numpy_code(pr.PrefixSum)
def _prefix_sum(op, out, args):
    return [f"np.cumsum({args[0]}, axis=1, out={out})"]


@numpy_code(pr.SortPrim)
def _sort(op, outs, args):
    return [f"_sort({args[0]}, {outs[0]}, {outs[1]})"]


NUMPY_GLOBALS["_sort"] = special.sort_rows


@numpy_code(pr.Assign)
def _assign(op, out, args):
    t, v = args
    return [f"np.copyto({t}, {v})"]
