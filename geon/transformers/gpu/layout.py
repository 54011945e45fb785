"""Layouts: where the elements of a value live, as NumPy strides do.

On the GPU, views (``Dimshuffle``, ``Reshape``, ``Expand``, ``SliceView``) never run:
each becomes a :class:`Layout` (a root buffer, an element offset and per-dimension
strides) that the kernels reading it index through. The root is storage (a
placeholder, variable or constant) or a producer, whose buffer is row-major.
"""

from geon.errors import GeonError
from geon.op_graph import op_graph as og
from geon.op_graph import primitives as pr
from geon.op_graph.symbols import cut, is_symbolic
from geon.op_graph.tables import OpTable


def row_major(shape):
    """Row-major element strides of ``shape``."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


class Layout:
    """``root``'s elements seen with ``shape``: element ``(i0, i1, ...)`` is at
    ``offset + i0 * strides[0] + i1 * strides[1] + ...`` (in elements) in ``root``'s
    buffer."""

    __slots__ = ("root", "offset", "shape", "strides")

    def __init__(self, root, offset, shape, strides):
        self.root, self.offset = root, offset
        self.shape, self.strides = tuple(shape), tuple(strides)

    def __repr__(self):
        return (f"Layout({self.root.name}, offset={self.offset}, shape={self.shape}, "
                f"strides={self.strides})")

    @property
    def size(self):
        n = 1
        for d in self.shape:
            n *= d
        return n

    def key(self):
        """What a kernel needs to know (the root is passed as a pointer)."""
        return (self.offset, self.shape, self.strides)

    def dims(self):
        """``[(length, stride)]`` with unit dimensions dropped and adjacent dimensions
        that step through memory as one merged (NumPy's coalescing)."""
        out = []
        for n, s in zip(self.shape, self.strides):
            if n == 1:
                continue
            if out and out[-1][1] == s * n:
                out[-1] = (out[-1][0] * n, s)
            else:
                out.append((n, s))
        return out

    @property
    def contiguous(self):
        """Whether element ``i`` (row-major) is at ``offset + i``."""
        d = self.dims()
        return not d or (len(d) == 1 and d[0][1] == 1)

    def span(self):
        """``(lo, hi)``: the smallest and largest element offsets read (empty: None)."""
        if self.size == 0:
            return None
        lo = hi = self.offset
        for n, s in zip(self.shape, self.strides):
            if s < 0:
                lo += (n - 1) * s
            else:
                hi += (n - 1) * s
        return lo, hi


def scalar_constant(op):
    """Whether ``op`` is a constant holding one number everywhere."""
    return isinstance(op, og.Constant) and op.scalar is not None


def reshape_layout(lay, shape):
    if lay.contiguous:
        return Layout(lay.root, lay.offset, shape, row_major(shape))
    if all(s == 0 for s in lay.strides):  # a broadcast number stays one
        return Layout(lay.root, lay.offset, shape, (0,) * len(shape))
    # Split / merge dimensions where memory steps evenly (NumPy's no-copy reshape).
    old = [(n, s) for n, s in zip(lay.shape, lay.strides) if n != 1]
    new = [n for n in shape]
    strides = [0] * len(new)
    i = j = 0
    while i < len(old) or j < len(new):
        if j < len(new) and new[j] == 1:
            j += 1
            continue
        if i >= len(old) or j >= len(new):
            break
        # take old dims [i, i2) and new dims [j, j2) with equal products
        po, pn = old[i][0], new[j]
        i2, j2 = i + 1, j + 1
        while po != pn:
            if po < pn:
                if i2 >= len(old):
                    return None
                po *= old[i2][0]
                i2 += 1
            else:
                if j2 >= len(new):
                    return None
                pn *= new[j2]
                j2 += 1
        for k in range(i, i2 - 1):
            if old[k][1] != old[k + 1][1] * old[k + 1][0]:
                return None
        step = old[i2 - 1][1]
        for k in range(j2 - 1, j - 1, -1):
            strides[k] = step
            step *= new[k]
        i, j = i2, j2
    return Layout(lay.root, lay.offset, shape, strides)


#: ``{view class: fn(op, lay) -> Layout}``: the layout of a view ``op`` of a value laid
#: out as ``lay``.
VIEW_LAYOUTS = OpTable("VIEW_LAYOUTS", "fn(view op, layout of its arg) -> Layout")
#: Decorator: ``@view_layout_rule(Cls, ...)`` registers ``fn(op, lay) -> Layout``.
view_layout_rule = VIEW_LAYOUTS.register


@view_layout_rule(pr.Dimshuffle)
def _dimshuffle(op, lay):
    return Layout(lay.root, lay.offset, [lay.shape[p] for p in op.perm],
                  [lay.strides[p] for p in op.perm])


@view_layout_rule(pr.Expand)
def _expand(op, lay):
    shape = op.axes.shape
    return Layout(lay.root, lay.offset, shape,
                  [0 if m is None else lay.strides[m] for m in op.dim_map])


@view_layout_rule(pr.SliceView)
def _slice_view(op, lay):
    offset, shape, strides = lay.offset, [], []
    for k, n, s in zip(op.key, lay.shape, lay.strides):
        if is_symbolic(n) or _symbolic_key(k):
            # (the ``views`` pass, before a binding: bounds relative to the length,
            # a slice that fits, see symbols.cut; a binding's program has ints here)
            k, length, _ = cut(k, n)
            if isinstance(k, slice):
                shape.append(length)
                strides.append(s * (1 if k.step is None else k.step))
                offset += k.start * s
            else:
                offset += k * s
            continue
        if isinstance(k, slice):
            start, stop, step = k.indices(n)
            shape.append(len(range(start, stop, step)))
            strides.append(s * step)
            if shape[-1]:
                offset += start * s
        else:
            k = int(k)
            offset += (k + n if k < 0 else k) * s
    return Layout(lay.root, offset, shape, strides)


def _symbolic_key(k):
    return is_symbolic(k.start) or is_symbolic(k.stop) if isinstance(k, slice) \
        else is_symbolic(k)


@view_layout_rule(pr.Reshape)
def _reshape(op, lay):
    new = reshape_layout(lay, op.axes.shape)
    if new is None:
        raise GeonError(f"internal: the gpu transformer cannot view {op.args[0].name} "
                        f"{lay} as shape {op.axes.shape} without a copy (built at "
                        f"{op.file_info})")
    return new


def view_layout(op, lay):
    """The layout of the view ``op`` of a value laid out as ``lay``."""
    rule = VIEW_LAYOUTS.find(op)
    if rule is None:
        raise GeonError(f"internal: no layout rule for view {type(op).__name__}")
    return rule(op, lay)


def layouts(order):
    """``{op: Layout}`` for every tensor op of ``order`` (a schedule)."""
    out = {}
    for op in order:
        if not isinstance(op, og.TensorOp):
            continue
        if isinstance(op, pr.ViewOp):
            out[op] = view_layout(op, out[op.args[0]])
        elif scalar_constant(op):
            out[op] = Layout(op, 0, op.axes.shape, (0,) * len(op.axes))
        else:
            shape = op.axes.shape
            out[op] = Layout(op, 0, shape, row_major(shape))
    return out


def offset_expr(dims, index="i", itype="long long"):
    """A C expression of the element offset of row-major element ``index`` for the
    coalesced ``dims`` (see :meth:`Layout.dims`)."""
    if not dims:
        return "0"
    terms = []
    inner = 1
    for pos in range(len(dims) - 1, -1, -1):
        n, s = dims[pos]
        if s != 0:
            q = index if inner == 1 else f"({index} / {inner})"
            if pos > 0:  # the outermost dimension needs no wrap: index < total
                q = f"({q} % {n})"
            terms.append(q if s == 1 else f"{q} * {s}")
        inner *= n
    return " + ".join(reversed(terms)) or "0"


def identity_source(a, lay):
    """The op whose elements ``a`` is, in the same row-major order (``a`` itself, or
    the root of a view of ``a`` that only renames or reshapes), else ``a``."""
    if not isinstance(a, pr.ViewOp):
        return a
    la = lay[a]
    if la.offset == 0 and la.contiguous and la.size == la.root.axes.size:
        return la.root
    return a


def permutation_source(a, lay):
    """The op whose elements ``a`` is, each exactly once in some order (a transpose or
    reshape of it), else ``a``."""
    if not isinstance(a, pr.ViewOp):
        return a
    la = lay[a]
    r = la.root
    if la.offset != 0 or la.size != r.axes.size:
        return a
    dims = sorted(((n, st) for n, st in zip(la.shape, la.strides) if n != 1),
                  key=lambda d: -abs(d[1]))
    if any(st <= 0 for _, st in dims):
        return a
    if Layout(r, 0, [n for n, _ in dims], [st for _, st in dims]).contiguous:
        return r
    return a
