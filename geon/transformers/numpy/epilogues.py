"""Work after a product done by the product's own call: the emitter's epilogues.

**A bias added to a GEMM** (:func:`gemm_bias`): a fused group that starts by adding
``v`` to a matrix product nothing else reads becomes ``v + a @ b`` in one BLAS call
(:func:`.blas.add_product`: ``v`` is copied into the output in place of the BLAS's
zeroing; the MLP step at batch 1,024: 0.24-0.39 ms off 20 ms, doc/performance.rst).

**The bias and activation after a convolution** (:func:`find`, :func:`lines`). An
exported CNN layer is ``Conv`` then ``Add`` of a bias broadcast over the channels (a
BatchNorm folded into the convolution leaves one too), then often ``Relu`` or ``Clip(0,
6)`` (in the graph, ``Add(conv, Expand(bias))``, ``Maximum(., lo)``, ``Minimum(.,
hi)``), a SiLU (``Sigmoid`` of the sum, and ``Multiply`` of the two) or a sigmoid. As ops
of their own they are a pass over the convolution's result (a compiled group, or
``np.add``), which on the small planes of a late stage costs more than it should: on
MobileNet's 2 x 2 planes the group's C loop took about 25 us for 7,680 elements, a
row of two or four at a time. Such a chain is emitted as the convolution with an
*epilogue* (``conv_forward(..., epilogue=(final, bias, lo, hi, act))``): the 1 x 1
convolution kernel (:mod:`.pointwise`) applies it as it stores, any other path by one
C pass over its result (:func:`.pointwise.bias_clamp`), and the chain's ops emit
nothing (MobileNet-v2 at batch 2, 64 x 64, one thread: 4.4 -> 3.0 ms a forward with
the 1 x 1 kernel; EfficientNet-B0 with SiLU epilogues: 5.08 -> 4.94 ms).

The chain qualifies when its values are read by nothing else (no other reader, view or
result of the convolution or of a link before the last), nothing else runs between the
convolution and the chain's last op, the links are exactly one fused group or single
ops outside any group, and everything is of the convolution's float dtype. The last
op's buffer is taken at the convolution: nothing else runs meanwhile, so no value
lives in it then but those the chain reads, which die on the way: the convolution's
inputs and the bias (a computed bias that the plan let a later link overwrite). Where
it is one of them the kernel declines (it writes over x only once x is packed, never
over w or the bias), the convolution computes into its own buffer, and the pass
declines a bias in the result's memory too (NumPy's add, which copies what overlaps,
runs instead).
"""

import numpy as np

from geon.op_graph import conv as cv
from geon.op_graph import op_graph as og
from geon.op_graph import primitives as pr
from geon.op_graph.symbols import Sym
from geon.transformers.numpy import blas, pointwise
from geon.transformers.numpy.conv import _conv
from geon.transformers.numpy.primitives import _BLAS_DTYPES

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def gemm_bias(em, g):
    """``(gemm, v)`` where fused group ``g`` (of emitter ``em``) starts by adding ``v``
    to a matrix product (a bias add after a layer's GEMM) that nothing else reads,
    emitted right before the group, over the product's own buffer; else None."""
    if not blas.available():
        return None
    m0 = g.members[0]
    if not isinstance(m0, og.Add) or m0 not in g.internal or m0.dtype not in _BLAS_DTYPES:
        return None
    gemms = [a for a in m0.args if isinstance(a, pr.Gemm) and not a.batch_rank]
    if len(gemms) != 1:
        return None
    gemm = gemms[0]
    v = m0.args[1] if m0.args[0] is gemm else m0.args[0]
    if gemm.dtype != m0.dtype or v.dtype != m0.dtype \
            or v.axes.lengths != m0.axes.lengths or gemm in em.comp.results \
            or gemm in em._into or gemm not in em.plan.slot \
            or em._readers.get(gemm) != 1 \
            or any(r is gemm and x is not gemm for x, r in em._root.items()):
        return None   # read elsewhere too (directly or through a view)
    if not _only_views_between(em, gemm, m0, ()):
        return None   # other code than views (of feeds) runs between them
    last = {a: k for k, m in enumerate(g.members) for a in m.args}
    if em._block_over(g, 0, last, em.plan) is not gemm:
        return None   # the sum would not be written over the product
    return gemm, v


def _only_views_between(em, first, last, allowed):
    """Whether nothing but views and ``allowed`` ops has code in ``em``'s order after
    ``first`` and before ``last``."""
    return not any(em.emits(op) and not isinstance(op, pr.ViewOp) and op not in allowed
                   for op in em.order[em._step[first] + 1:em._step[last]])


class Epilogue:
    """A chain found after convolution ``conv``: its ``ops`` (the Add first), the
    ``final`` one, the ``views`` only its links read (they need no line), the 1-D
    ``bias`` op, the activation ``act`` (:data:`.pointwise.ACTS`) and the bounds
    ``lo``, ``hi`` of a clamp."""

    __slots__ = ("conv", "ops", "final", "views", "bias", "lo", "hi", "act")

    def __init__(self, conv, ops, views, bias, lo, hi, act="clamp"):
        self.conv, self.ops, self.final, self.views = conv, ops, ops[-1], views
        self.bias, self.lo, self.hi, self.act = bias, lo, hi, act

    @property
    def head(self):
        return self.conv

    def emit(self, em):
        lines(em, self)


def _reader(em, op, views):
    """The one op that reads ``op`` (through reshapes that keep its lengths, added to
    ``views``), or None where more read it, it is a result, or it is read through
    another view."""
    while True:
        if op in em.comp.results or em._readers.get(op, 0) != 1:
            return None
        r = next(x for x in em.order[em._step[op] + 1:] if any(a is op for a in x.args))
        if not isinstance(r, pr.ViewOp):
            return r
        if not isinstance(r, pr.Reshape) or r.axes.lengths != op.axes.lengths:
            return None
        views.append(r)
        op = r


def _bias(v, conv):
    """The op of K elements that ``v`` broadcasts over ``conv``'s channels (a (K,)
    vector, or (K, 1, 1) where the planes are 1 x 1), else None."""
    if not isinstance(v, pr.Expand) or v.axes.lengths != conv.axes.lengths:
        return None
    src, dims = v.args[0], tuple(v.dim_map)
    K = conv.axes.lengths[1]
    if dims[1] is None or src.dtype != conv.dtype or src.axes.size != K \
            or src.axes.lengths[dims[1]] != K or dims.count(dims[1]) != 1:
        return None
    return src


def _bound(em, link, cls, prev):
    """The scalar value of ``link`` = ``cls(prev, scalar)`` as a float, else None."""
    if type(link) is not cls or link.args[0] is not prev \
            or link.args[1] not in em.scalars:
        return None
    return float(em.consts[em.scalars[link.args[1]]])


def find(em, conv):
    """The :class:`Epilogue` after ``conv`` (a forward convolution scheduled by emitter
    ``em``), or None (always without the compiled path: ``compiled=False``, or the
    numerics checks)."""
    if em.kernels is None or not isinstance(conv, cv.Conv) or conv.dtype not in _FLOATS \
            or conv not in em.plan.slot or conv in em._into \
            or not all(isinstance(n, int) for n in conv.axes.lengths):
        return None
    views = []   # (reshapes of the links: read by the next link only)
    add = _reader(em, conv, views)
    if not isinstance(add, og.Add):
        return None
    bias = None
    for k in (0, 1):
        if _root_conv(add.args[k]) is conv:
            bias = _bias(add.args[1 - k], conv)
            if bias is not None and em._readers.get(add.args[1 - k]) == 1:
                views.append(add.args[1 - k])
    if bias is None:
        return None
    ops, lo, hi = [add], -np.inf, np.inf
    act = _sigmoids(em, add)
    if act is not None:
        ops += act[1]
        act = act[0]
    else:
        act = "clamp"
        for cls in (og.Maximum, og.Minimum):
            between = []   # (the views to the next link: its own if it is one)
            nxt = _reader(em, ops[-1], between)
            value = None if nxt is None else _bound(em, nxt, cls, ops[-1])
            if value is not None:
                ops.append(nxt)
                views += between
                lo, hi = (value, hi) if cls is og.Maximum else (lo, value)
    if any(m.dtype != conv.dtype or m.compute_dtype() != conv.dtype
           or m.axes.lengths != conv.axes.lengths for m in ops):
        return None
    if len(ops) == 1 and not _takes_the_kernel(conv):
        return None   # a bias alone after another path: np.add is as fast as the pass
    g = em.first.get(ops[0])
    if (list(g.members) != ops) if g is not None else any(m in em.in_group for m in ops):
        return None   # part of a group, or a group that does more
    if ops[-1] in em._into:
        return None   # (computed into a variable's storage)
    if not _only_views_between(em, conv, ops[-1], ops) or pointwise.kernels() is None:
        return None   # (the library last: building it takes a second)
    return Epilogue(conv, ops, views, bias, lo, hi, act)


def _sigmoids(em, add):
    """``("silu", [s, m])`` where ``add`` is read by exactly ``s = Sigmoid(add)`` and
    ``m = Multiply(add, s)`` (either order) and ``s`` by ``m`` only; ``("sigmoid",
    [s])`` where ``s`` is its only reader; else None."""
    if add in em.comp.results:
        return None
    n = em._readers.get(add, 0)
    readers = []   # (the first n ops after it that read it: its readers)
    for x in em.order[em._step[add] + 1:]:
        if len(readers) == n:
            break
        if any(a is add for a in x.args):
            readers.append(x)
    sig = [x for x in readers if type(x) is og.Sigmoid]
    if len(sig) != 1 or sig[0].args[0] is not add:
        return None
    s = sig[0]
    if n == 1:
        return "sigmoid", [s]
    mul = [x for x in readers if type(x) is og.Multiply]
    if n != 2 or len(mul) != 1 or em._readers.get(s, 0) != 1 \
            or s in em.comp.results or sorted(map(id, mul[0].args)) != sorted(
                (id(add), id(s))):
        return None
    return "silu", [s, mul[0]]


def _takes_the_kernel(conv):
    """Whether ``conv`` will run the 1 x 1 kernel (:func:`.pointwise.usable`, from the
    shapes: the arrays are laid out contiguously)."""
    x, w = conv.args[0], conv.args[1]
    B, C = x.axes.lengths[:2]
    if not (conv.groups == 1 and all(r == 1 for r in w.axes.lengths[2:])
            and all(s == 1 for s in conv.strides) and not any(map(any, conv.pads))):
        return False
    if x.axes.size // C <= pointwise.MAX_COLUMNS:
        return w.axes.size * conv.dtype.itemsize >= pointwise.MIN_WEIGHT_BYTES
    return not isinstance(x.axes.size, Sym) and pointwise.wide_form(
        B, C, x.axes.size // (B * C), conv.dtype.itemsize)


def _root_conv(op):
    while isinstance(op, pr.Reshape):
        op = op.args[0]
    return op


def _number(v):
    """Python text of the float ``v``."""
    if np.isnan(v):
        return "np.nan"
    return ("-np.inf" if v < 0 else "np.inf") if np.isinf(v) else repr(v)


def lines(em, e):
    """Emit convolution ``e.conv`` with its epilogue into ``em``'s body (naming its
    buffer and the final op's)."""
    em._view_ahead(e.bias)
    final = em.names[e.final] = em.buffer(e.final, em.body)
    out = em.names[e.conv] = em.buffer(e.conv, em.body)
    epi = (f", ({final}, {em.names[e.bias]}, {_number(e.lo)}, {_number(e.hi)}, "
           f"{e.act!r})")
    (line,) = _conv(e.conv, out, em.arg_names(e.conv), epilogue=epi)
    em.body.append(em.comp._annotate(line, e.conv))
    em.body.append(f"    # {', '.join(type(m).__name__ for m in e.ops)}: "
                   f"done by the convolution above")
