"""NumPy code for the convolution and pooling primitives (:mod:`geon.op_graph.conv`).

A convolution is one copy of a strided window view of the (padded) image into im2col
order, and one ``matmul`` per group; its transpose in the image is, for stride 1, the
same with the flipped filter, and otherwise one ``matmul`` and one strided add per
kernel offset (col2im); its transpose in the filter is one ``matmul`` over the im2col
copy. Max pooling takes the maximum over one strided view per kernel offset; where the
windows tile the input (kernel = stride, no padding or dilation, the common case) it
reduces one kernel dim at a time instead, and its derivative is one comparison of x with
the repeated maxima and one product with the repeated dy, in x's own layout, so no pass
has a short strided inner loop. No Python loop runs over output positions.

Two kinds of convolution skip im2col. A 1 x 1 convolution (stride 1, no padding, one
group) is a matrix product per image on its (C, P) view: no copy of x, dy or the
result (its derivative in the filter puts small images side by side first). A
convolution with at most :data:`~.conv_kernels.MAX_GROUP_CHANNELS` input channels per
group (depthwise convolution) runs the direct C kernels of :mod:`.conv_kernels` where a
C compiler works, and im2col otherwise.
"""

import math
import weakref

import numpy as np
from numpy.lib.stride_tricks import as_strided

from geon.op_graph import conv as cv
from geon.transformers import fusion
from geon.transformers.numpy import blas
from geon.transformers.numpy import conv_kernels as dk
from geon.transformers.numpy import im2col as c_im2col
from geon.transformers.numpy import pointwise, skinny, small_gemm
from geon.transformers.numpy.code_table import NUMPY_GLOBALS, numpy_code


class Workspace:
    """A computation's convolution settings and scratch: whether the direct C kernels
    may run (``direct``; False under ``NumPyTransformer(compiled=False)``), and the
    temporaries (im2col columns, padded images, products) kept from call to call, one
    buffer per role grown to the largest size asked for. A fresh large temporary comes
    from new pages each call (the allocator returns large blocks to the system): a 3 x
    3 convolution of 64 channels on 56 x 56 images at batch 32 (231 MB of columns) ran
    its forward in 123 ms against 160 ms with fresh temporaries, its derivative in x in
    126 ms against 201 ms, on one thread. The computation holds its workspace, so the
    buffers live as long as it does; its calls do not overlap (they hold the
    transformer's lock)."""

    __slots__ = ("direct", "sites", "_buffers", "_kernels")

    def __init__(self, direct=True):
        self.direct = direct
        self.sites = {}   # (id(w), id(out)) -> _Site
        self._buffers = {}
        self._kernels = {}

    def kernels(self, module):
        """``module.kernels()`` (:mod:`.pointwise`, :mod:`.conv_kernels`) where the
        direct kernels may run, else None; looked up once per workspace."""
        try:
            return self._kernels[module]
        except KeyError:
            fns = self._kernels[module] = module.kernels() if self.direct else None
            return fns

    def take(self, role, shape, dtype):
        """An uninitialized array of ``shape`` and ``dtype`` in the buffer of ``role``
        (valid until the next ``take`` of that role)."""
        dtype = np.dtype(dtype)
        n = math.prod(shape) * dtype.itemsize
        buf = self._buffers.get(role)
        if buf is None or buf.nbytes < n:
            buf = self._buffers[role] = np.empty(max(n, 1), np.uint8)
        return buf[:n].view(dtype).reshape(shape)


def _fixed(ws, module):
    """``module.kernels()`` (a fixed C library: :mod:`.pointwise`, :mod:`.conv_kernels`),
    through the workspace ``ws``'s cache where there is one (None: looked up)."""
    return module.kernels() if ws is None else ws.kernels(module)


def _empty(ws, role, shape, dtype):
    """``ws.take(role, shape, dtype)``, or a new array where there is no workspace."""
    return np.empty(shape, dtype) if ws is None else ws.take(role, shape, dtype)


def _into(out, shape):
    """A view of the contiguous buffer ``out`` with ``shape`` (never a copy)."""
    v = out.view()
    v.shape = shape
    return v


def _padded(x, pads, value=0, ws=None):
    """``x`` with its trailing dimensions padded with ``value`` (``x`` itself if none;
    in ``ws``'s "padded" buffer where given)."""
    if not any(lo or hi for lo, hi in pads):
        return x
    lead = x.ndim - len(pads)
    xp = _empty(ws, "padded", x.shape[:lead] + tuple(n + lo + hi for n, (lo, hi) in
                                                     zip(x.shape[lead:], pads)), x.dtype)
    xp.fill(value)
    xp[(Ellipsis,) + tuple(slice(lo, lo + n) for n, (lo, _) in
                           zip(x.shape[lead:], pads))] = x
    return xp


def _windows(xp, kernel, out, strides, dilation):
    """A read-only view (..., *kernel, *out) of the windows of ``xp``'s trailing dims."""
    n = len(kernel)
    st = xp.strides
    lead = xp.ndim - n
    shape = xp.shape[:lead] + tuple(kernel) + tuple(out)
    strides = st[:lead] + tuple(s * d for s, d in zip(st[lead:], dilation)) \
        + tuple(s * k for s, k in zip(st[lead:], strides))
    if xp.flags.c_contiguous:
        # one np.ndarray call over xp's buffer: a fifth of as_strided's time
        v = np.ndarray(shape, xp.dtype, xp, 0, strides)
        v.flags.writeable = False
        return v
    return as_strided(xp, shape, strides, writeable=False)


def _split_groups(x, groups):
    """(B, C, *S) -> (B, groups, C / groups, *S)."""
    return x.reshape(x.shape[:1] + (groups, x.shape[1] // groups) + x.shape[2:])


def _gemm(a, b, ws=None):
    """``a @ b`` over stacks of matrices (in ``ws``'s "product" buffer where given);
    one stack is one BLAS call on its matrices."""
    out = _empty(ws, "product", a.shape[:2] + b.shape[2:], np.result_type(a, b))
    _gemm_into(a, b, out, ws)
    return out


def _gemm_into(a, b, out, ws=None):
    """``out`` = ``a @ b`` over stacks of matrices, as :func:`_gemm`. One matrix, where
    ``ws`` allows C: few columns (few positions) against a large ``a`` (a filter) by
    the 1 x 1 kernel of :mod:`.pointwise` (``b`` as the columns of one image), a short
    side by :mod:`.skinny` (resnet18's 512 x 4,608 filter over 8 columns, inside its
    forward: 1.41 ms by skinny, 0.84 ms by the kernel), else by :mod:`.small_gemm`'s
    kernel where it takes the operands (on geon's threads where the policy gives more
    than one: resnet18's (64, 576) @ (576, 512) took 160 us on two, 272 on one, against
    291 by the BLAS on one); else by NumPy."""
    if a.shape[0] != 1:
        np.matmul(a, b, out=out)
        return
    c_ok = ws is None or ws.direct
    fns = _fixed(ws, pointwise)
    if fns and a.ndim == b.ndim == 3:
        x, w, y = b[0][None], a[0][..., None], out[0][None]
        if pointwise.usable(x, w, y) and pointwise.conv1x1(fns, x, w, y):
            return
    if skinny.worth_it(a.shape[1:], b.shape[1:], out.dtype):
        skinny.matmul(a[0], b[0], out[0], c_ok)
        return
    products = _fixed(ws, small_gemm)
    if not (products and small_gemm.matmul(a[0], b[0], out[0], products)):
        np.matmul(a[0], b[0], out=out[0])


#: The derivatives of a convolution avoid copying a transposed filter (in x) or a
#: transposed filter gradient (in w) when the images have few positions against the
#: output channels per group: when B * P * ratio <= K / groups, with these ratios. Such
#: a copy of a 512 x 512 x 3 x 3 filter takes several times as long as the products
#: with resnet18's last stage (2 x 2 positions at batch 2); with many positions the
#: products in the copied order, and col2im over contiguous rows, take less.
FEW_POSITIONS_RATIO = {"data": 4, "filter": 1}


def _few_positions(dy, channels, which):
    """Whether ``dy`` (B, K, *P) has few positions for ``channels`` output channels per
    group in the derivative ``which`` ("data" or "filter"; see
    :data:`FEW_POSITIONS_RATIO`)."""
    return dy.shape[0] * math.prod(dy.shape[2:]) * FEW_POSITIONS_RATIO[which] <= channels


def _im2col(x, R, P, strides, pads, dilation, groups, ws=None):
    """The windows of x (B, C, *S) as one contiguous (groups, C/groups * R, B * P)
    array (in ``ws``'s "columns" buffer where given): the copy is the only pass over
    the windows (by :mod:`.im2col`'s C loop where it applies, else from a strided
    view of the padded image)."""
    B, C = x.shape[:2]
    n = len(R)
    fns = _fixed(ws, c_im2col) if c_im2col.usable(x, R) else None
    if fns:
        cols = _empty(ws, "columns", (C * math.prod(R), B * math.prod(P)), x.dtype)
        c_im2col.im2col(fns, x, cols, R, P, strides, pads, dilation)
        return cols.reshape(groups, C // groups * math.prod(R), B * math.prod(P))
    win = _windows(_split_groups(_padded(x, pads, ws=ws), groups), R, P, strides,
                   dilation)
    cols = _empty(ws, "columns", (groups, C // groups) + tuple(R) + (B,) + tuple(P),
                  x.dtype)
    # (B, G, Cg, *R, *P) -> (G, Cg, *R, B, *P)
    np.copyto(cols, win.transpose((1, 2) + tuple(range(3, 3 + n)) + (0,)
                                  + tuple(range(3 + n, 3 + 2 * n))))
    return cols.reshape(groups, C // groups * math.prod(R), B * math.prod(P))


def _by_group(y, groups):
    """y (B, K, *P) as a contiguous (groups, K/groups, B * P)."""
    B, K = y.shape[:2]
    P = math.prod(y.shape[2:])
    g = y.reshape(B, groups, K // groups, P).transpose(1, 2, 0, 3)
    return np.ascontiguousarray(g).reshape(groups, K // groups, B * P)


def _from_groups(out, y):
    """Write y (G, K/G, B * P) into out (B, K, *P)."""
    B, K = out.shape[:2]
    G = y.shape[0]
    P = math.prod(out.shape[2:])
    np.copyto(_into(out, (B, G, K // G, P)), y.reshape(G, K // G, B, P).transpose(2, 0, 1, 3))


def _pointwise(R, strides, pads, groups, a, b, out):
    """Whether the convolution is a matrix product per image: a 1 x ... x 1 kernel,
    stride 1, no padding, one group, and operands ``a``, ``b`` and result ``out`` of one
    dtype (then y[b] = w (K, C) @ x[b] (C, P)). (Called on every convolution: plain
    comparisons, 0.3 us where generators took 1.2.)"""
    if groups != 1 or not a.dtype == b.dtype == out.dtype:
        return False
    for r, s, (lo, hi) in zip(R, strides, pads):
        if r != 1 or s != 1 or lo or hi:
            return False
    return True


def _patches(x, w, out, strides, pads, dilation, groups):
    """Whether the windows tile the image: strides equal to the kernel, no padding or
    dilation, one group, the image's lengths multiples of the kernel's, one dtype (a
    ViT's patch embedding)."""
    R = w.shape[2:]
    return groups == 1 and tuple(strides) == tuple(R) and len(R) == 2 \
        and not any(lo or hi for lo, hi in pads) and all(d == 1 for d in dilation) \
        and all(n == r * p for n, r, p in zip(x.shape[2:], R, out.shape[2:])) \
        and x.dtype == w.dtype == out.dtype and x.flags.c_contiguous


def _patch_product(x, w, out, ws=None):
    """:func:`conv_forward` where the windows tile the image (:func:`_patches`): the
    columns are x's patches by a reshape and one transposing copy, then one product
    (the direct kernels and the general im2col took 28 us for a small ViT's 3 x 8 x 8
    patches of two 32 x 32 images, this 17)."""
    B, C = x.shape[:2]
    K, _, r, s = w.shape
    P, Q = out.shape[2:]
    cols = _empty(ws, "columns", (C, r, s, B, P, Q), x.dtype)
    np.copyto(cols, x.reshape(B, C, P, r, Q, s).transpose(1, 3, 5, 0, 2, 4))
    y = _empty(ws, "product", (K, B * P * Q), x.dtype)
    np.matmul(w.reshape(K, -1), cols.reshape(C * r * s, -1), out=y)
    np.copyto(_into(out, (B, K, P * Q)), y.reshape(K, B, P * Q).transpose(1, 0, 2))


def _patch_plan(x, w, out, ws):
    """:func:`_patch_product` as one C call where it can be made (and this workspace
    allows C: :mod:`.small_gemm`'s patch entry, which gathers the patches as rows,
    multiplies and scatters the result), given the arrays themselves at each call
    (nothing held); its ``step`` is that call. A small ViT's patch embedding took 9
    us a call so, 19-21 through NumPy's copies and product."""
    B, C = x.shape[:2]
    K, _, r, s = w.shape
    P, Q = out.shape[2:]
    fn = small_gemm.patches_entry(x.dtype) if ws is None or ws.direct else None
    if fn is None or K < small_gemm.MIN_ROWS or K * C * r * s * B * P * Q \
            > small_gemm.MAX_WORK:
        def numpy_way(x, w, out, epilogue):
            _patch_product(x, w, out, ws)
        numpy_way.step = lambda x, w, out, epilogue: None
        return numpy_way
    geometry = (B, C, P, r, Q, s)

    def whole(x, w, out):   # (the entry reads them as C-contiguous buffers)
        return x.flags.c_contiguous and w.flags.c_contiguous and out.flags.c_contiguous

    def run(x, w, out, epilogue):
        if not whole(x, w, out) or fn(((x, w, out),) + geometry):
            _patch_product(x, w, out, ws)
    run.step = lambda x, w, out, epilogue: [(fn, ((x, w, out),) + geometry, None)] \
        if whole(x, w, out) else None
    return run


def _direct(a, b, out, channels, kernel, pads, ws):
    """The direct kernels (:mod:`.conv_kernels`) where they apply to this call (few
    input ``channels`` per group, a ``kernel`` of at most ``MAX_KERNEL_LENGTH`` a
    dimension) and the workspace ``ws`` allows them (None: allowed), else None."""
    if channels > dk.MAX_GROUP_CHANNELS or max(kernel, default=1) > dk.MAX_KERNEL_LENGTH:
        return None
    fns = _fixed(ws, dk)
    return fns if fns and dk.usable(a, b, out, pads) else None


def _flat(a):
    """(B, C, *S) as (B, C, prod(S)), a view where ``a``'s layout allows."""
    return a.reshape(a.shape[:2] + (-1,))


def _side_by_side(a):
    """``a`` (B, C, P) as (C, B * P): the images side by side (a view for one image)."""
    return a.transpose(1, 0, 2).reshape(a.shape[1], -1)


#: The derivative in the filter of a 1 x 1 convolution is one product over the images
#: side by side where they have fewer positions than this (copying them costs less
#: than a product per image), else one product per image (no copies).
MERGED_POSITIONS = 256


def conv_forward(x, w, out, strides, pads, dilation, groups, ws=None, epilogue=None):
    """``out`` (B, K, *P) = x correlated with w (K, C/groups, *R); ``ws``:
    the computation's :class:`Workspace` (None: direct kernels allowed, temporaries
    allocated afresh). ``epilogue``: None, or ``(final, bias, lo, hi, act)``: then the
    result wanted is ``final`` = act(out + bias (K,)) (:data:`.pointwise.ACTS`;
    "clamp": between ``lo`` and ``hi``), and ``out`` is scratch (see
    :mod:`.epilogues`). With a workspace, the way is chosen once per call site
    (:class:`_Site`)."""
    if ws is None:
        run = _forward_plan(x, w, out, strides, pads, dilation, groups, None, epilogue)
    else:
        run = _site(x, w, out, (strides, pads, dilation, groups), ws, epilogue).run
    run(x, w, out, epilogue)


def conv_step(x, w, out, strides, pads, dilation, groups, ws, epilogue=None):
    """The step of a line calling :func:`conv_forward` with these arrays (see
    :mod:`.segments`): ``(entry, args, keep)`` of the one C call it makes, or None
    where it makes another or several (a product by the BLAS, calls on geon's
    threads, a copy of a strided operand)."""
    if ws is None:
        return None
    run = _site(x, w, out, (strides, pads, dilation, groups), ws, epilogue).run
    step = getattr(run, "step", None)
    return None if step is None else step(x, w, out, epilogue)


def _site(x, w, out, params, ws, epilogue):
    """The :class:`_Site` of this call in workspace ``ws`` (made if new)."""
    site = ws.sites.get((id(w), id(out)))
    if site is None or not site.takes(x, w, out, params, epilogue):
        site = _Site.make(ws, x, w, out, params, epilogue)
    return site


class _Site:
    """How one call site of :func:`conv_forward` runs, chosen on its first call (the
    checks and plans of the C kernels took 4-6 us a call, against 20-60 us of work in
    a small-image MobileNet): the callable, and what it was chosen for, to tell that a
    later call is the same: its arrays (held weakly: the same array objects have the
    same shapes, strides, dtypes and memory), its settings and geon's threads. A
    computation's workspace keeps its sites by weight and result array; a call with
    other arrays (a feed, say) chooses again."""

    __slots__ = ("refs", "params", "settings", "threads", "run")

    #: At most this many sites a workspace (then it starts afresh).
    MAX = 4096

    @classmethod
    def make(cls, ws, x, w, out, params, epilogue):
        site = cls()
        arrays = (x, w, out) if epilogue is None else (x, w, out) + tuple(epilogue[:2])
        site.refs = tuple(weakref.ref(a) for a in arrays)
        site.params = params
        site.settings = None if epilogue is None else tuple(epilogue[2:])
        site.threads = fusion.MAX_THREADS
        site.run = _forward_plan(x, w, out, *params, ws, epilogue)
        if len(ws.sites) >= cls.MAX:
            ws.sites.clear()
        ws.sites[id(w), id(out)] = site
        return site

    def takes(self, x, w, out, params, epilogue):
        """Whether this call is the one the site was chosen for."""
        refs = self.refs
        if refs[0]() is not x or refs[1]() is not w or refs[2]() is not out \
                or params != self.params or self.threads != fusion.MAX_THREADS:
            return False
        if epilogue is None:
            return self.settings is None
        return self.settings is not None and refs[3]() is epilogue[0] \
            and refs[4]() is epilogue[1] and epilogue[2:] == self.settings


def _forward_plan(x, w, out, strides, pads, dilation, groups, ws, epilogue):
    """The way :func:`conv_forward` takes for these operands: a callable ``(x, w, out,
    epilogue)`` for arrays like these, which holds no array."""
    B, K = out.shape[:2]
    if epilogue is not None:
        final, bias, lo, hi, act = epilogue
        fns = _fixed(ws, pointwise)
        one = near = None
        if fns and pointwise.usable(x, w, final, True) and bias.flags.c_contiguous \
                and _pointwise(w.shape[2:], strides, pads, groups, x, w, final):
            one = pointwise.prepared_conv1x1(fns, x, w, final, bias, lo, hi, act)
        direct = _direct(x, w, out, w.shape[1], w.shape[2:], pads, ws)
        if direct:   # each plane's epilogue as it is done
            near = dk.prepared_forward(direct, x, w, out, strides, pads, dilation, groups,
                                       epilogue)
        elif one is None and not _patches(x, w, out, strides, pads, dilation, groups):
            near = _columns(x, w, out, strides, pads, dilation, groups, ws, epilogue)
        apart = []   # the convolution and the epilogue's pass, chosen where needed

        def parts(x, w, out, final, bias):
            if not apart:
                apart.append(_forward_plan(x, w, out, strides, pads, dilation, groups,
                                           ws, None))
                apart.append(pointwise.prepared_bias_clamp(fns, out, bias, lo, hi, final,
                                                           act))
            return apart

        def run(x, w, out, epilogue):
            final, bias = epilogue[0], epilogue[1]
            if one is not None and one(x, w, final, bias):
                return
            if near is not None and near(x, w, out, final, bias):
                return
            conv, clamp = parts(x, w, out, final, bias)
            conv(x, w, out, None)
            clamp(out, bias, final)

        def step(x, w, out, epilogue):   # (computes nothing: the segment runs it later)
            final, bias = epilogue[0], epilogue[1]
            if one is not None:
                return _step_of(one, x, w, final, bias)
            if near is not None:
                return _step_of(near, x, w, out, final, bias)
            conv, clamp = parts(x, w, out, final, bias)
            first, then = _step_of(conv, x, w, out, None), _step_of(clamp, out, bias, final)
            return None if first is None or then is None else first + then
        run.step = step
        return run
    if _pointwise(w.shape[2:], strides, pads, groups, x, w, out):
        fns = _fixed(ws, pointwise)
        # few positions (one read of the weight) or many over few channels: the C kernel
        one = pointwise.prepared_conv1x1(fns, x, w, out) \
            if fns and pointwise.usable(x, w, out, True) else None

        def run(x, w, out, epilogue):
            if one is None or not one(x, w, out, None):
                # one product per image on its (C, P) view: no copy of x or of the result
                np.matmul(w.reshape(K, -1), _flat(x), out=_into(out, (B, K, -1)))
        def step(x, w, out, epilogue):
            if one is not None:
                return _step_of(one, x, w, out, None)
            views = (_view(w, (K, -1)), _view(x, x.shape[:2] + (-1,)),
                     _view(out, (B, K, -1)))
            return None if any(v is None for v in views) else [(np.matmul, views, None)]
        run.step = step
        return run
    if _patches(x, w, out, strides, pads, dilation, groups):
        return _patch_plan(x, w, out, ws)
    fns = _direct(x, w, out, w.shape[1], w.shape[2:], pads, ws)
    if fns:
        near = dk.prepared_forward(fns, x, w, out, strides, pads, dilation, groups)

        def run(x, w, out, epilogue):
            near(x, w, out, None, None)
        run.step = lambda x, w, out, epilogue: _step_of(near, x, w, out, None, None)
        return run
    cols = _columns(x, w, out, strides, pads, dilation, groups, ws, None)
    return lambda x, w, out, epilogue: (cols is not None and cols(x, w, out, out, None)) \
        or _im2col_forward(x, w, out, strides, pads, dilation, groups, ws)


def _step_of(prepared, *arrays):
    """The steps of a prepared callable (its ``step``) for ``arrays``, or None where it
    has none."""
    step = getattr(prepared, "step", None)
    return None if step is None else step(*arrays)


def _view(a, shape):
    """A view of ``a`` with ``shape``, or None where that takes a copy."""
    v = a.view()
    try:
        v.shape = shape
    except AttributeError:
        return None
    return v


def _columns(x, w, out, strides, pads, dilation, groups, ws, epilogue):
    """Where the windows of an image have few elements (a stem: 3 channels by 3 x 3 or
    7 x 7 taps) and the images many positions: a callable ``(x, w, out, final, bias)``
    -> done that computes the convolution as the im2col copy and the 1 x 1 kernel's
    wide form over it (with the epilogue, into ``final``; without, final is out),
    written in out's layout (the BLAS's product and the copy into out, and the
    epilogue's pass, took twice as long for MobileNet-v2's stem); else None."""
    B, K = out.shape[:2]
    fns = _fixed(ws, pointwise)
    target = out if epilogue is None else epilogue[0]
    if not (fns and groups == 1 and x.dtype == w.dtype == target.dtype
            and target.dtype in pointwise.DTYPES and w.flags.c_contiguous
            and target.flags.c_contiguous and pointwise.wide_form(
                B, w[0].size, math.prod(out.shape[2:]), x.itemsize)
            and (epilogue is None or epilogue[1].flags.c_contiguous)):
        return None
    R, P = w.shape[2:], out.shape[2:]
    if epilogue is None:
        kernel = pointwise.prepared_conv1x1(fns, x, w, out, columns=True)
    else:
        kernel = pointwise.prepared_conv1x1(fns, x, w, target, *epilogue[1:], columns=True)

    def run(x, w, out, final, bias):
        cols = _im2col(x, R, P, strides, pads, dilation, 1, ws)[0]
        return kernel(cols, w, final, bias)
    return run


def _im2col_forward(x, w, out, strides, pads, dilation, groups, ws):
    """:func:`conv_forward` through im2col and one product per group."""
    B, K = out.shape[:2]
    cols = _im2col(x, w.shape[2:], out.shape[2:], strides, pads, dilation, groups, ws)
    wg = w.reshape(groups, K // groups, -1)
    if B == 1 and x.dtype == w.dtype == out.dtype:
        # one image: (G, K/G, P) is out's own layout
        _gemm_into(wg, cols, _into(out, (groups, K // groups, -1)), ws)
        return
    _from_groups(out, _gemm(wg, cols, ws))


def conv_grad_data(dy, w, out, strides, pads, dilation, groups, ws=None):
    """``out`` (B, C, *S): the transpose of :func:`conv_forward` in x, applied to dy."""
    B, K = dy.shape[:2]
    P, R, S = dy.shape[2:], w.shape[2:], out.shape[2:]
    G, Cg = groups, w.shape[1]
    n = len(R)
    if _pointwise(R, strides, pads, groups, dy, w, out):
        # dx[b] = w (K, C)^T @ dy[b]: BLAS reads w transposed, no copy
        np.matmul(w.reshape(K, -1).T, _flat(dy), out=_into(out, (B, Cg, -1)))
        return
    few = _few_positions(dy, K // G, "data")
    full = [d * (k - 1) for k, d in zip(R, dilation)]
    if not few and all(s == 1 for s in strides) and \
            all(lo <= f and hi <= f for (lo, hi), f in zip(pads, full)):
        # stride 1: the correlation of dy with the flipped filter, channels swapped per
        # group, and the complementary padding (one im2col and one GEMM, no col2im; or
        # the direct forward kernel)
        wf = w.reshape((G, K // G, Cg) + R).transpose((0, 2, 1) + tuple(range(3, 3 + n)))
        flipped = _empty(ws, "filter", wf.shape, w.dtype)
        np.copyto(flipped, wf[(Ellipsis,) + (slice(None, None, -1),) * n])
        conv_forward(dy, flipped.reshape((G * Cg, K // G) + R), out, strides,
                     tuple((f - lo, f - hi) for (lo, hi), f in zip(pads, full)), dilation,
                     groups, ws)
        return
    fns = _direct(dy, w, out, w.shape[1], w.shape[2:], pads, ws)
    if fns:  # the direct kernel scatters dy into the image
        dk.grad_data(fns, dy, w, out, strides, pads, dilation, groups)
        return
    wg = w.reshape(G, K // G, -1)
    if few:
        # the columns as (G, B * P, Cg * R) = dy^T @ w: the filter as it is (read once),
        # then read by the taps below through a strided view
        cols = _gemm(_by_group(dy, G).transpose(0, 2, 1), wg, ws).reshape(
            (G, B) + tuple(P) + (Cg,) + tuple(R)).transpose(
            (0, 2 + n) + tuple(range(3 + n, 3 + 2 * n)) + (1,) + tuple(range(2, 2 + n)))
    else:
        wt = _empty(ws, "filter", (G, wg.shape[2], K // G), w.dtype)
        np.copyto(wt, wg.transpose(0, 2, 1))
        cols = _gemm(wt, _by_group(dy, G), ws).reshape((G, Cg) + tuple(R) + (B,) + tuple(P))
    # col2im in (G, Cg, B, *S) order: every add reads and writes contiguous rows
    xp = _empty(ws, "padded", (G, Cg, B) + tuple(n + lo + hi for n, (lo, hi) in
                                                 zip(S, pads)), out.dtype)
    xp.fill(0)
    for tap in np.ndindex(*R):
        xp[(Ellipsis,) + cv.tap_slices(tap, P, strides, dilation)] += \
            cols[(slice(None), slice(None)) + tap]
    crop = xp[(Ellipsis,) + tuple(slice(lo, lo + n) for n, (lo, _) in zip(S, pads))]
    np.copyto(_into(out, (B, G, Cg) + tuple(S)),
              crop.transpose((2, 0, 1) + tuple(range(3, 3 + len(S)))))


def conv_grad_filter(x, dy, out, strides, pads, dilation, groups, ws=None):
    """``out`` (K, C/groups, *R): the transpose of :func:`conv_forward` in w."""
    K, Cg = out.shape[:2]
    G = groups
    if _pointwise(out.shape[2:], strides, pads, groups, x, dy, out):
        _pointwise_grad_filter(_flat(x), _flat(dy), _into(out, (K, Cg)))
        return
    fns = _direct(x, dy, out, out.shape[1], out.shape[2:], pads, ws)
    if fns:
        dk.grad_filter(fns, x, dy, out, strides, pads, dilation, groups)
        return
    cols = _im2col(x, out.shape[2:], dy.shape[2:], strides, pads, dilation, G, ws)
    flat = _into(out, (G, K // G, Cg * math.prod(out.shape[2:])))
    if _few_positions(dy, K // G, "filter") and x.dtype == dy.dtype == out.dtype:
        # (K/G, B * P) @ (B * P, Cg * R) straight into out
        _gemm_into(_by_group(dy, G), cols.transpose(0, 2, 1), flat, ws)
        return
    # (Cg * R, B * P) @ (B * P, K/G), then transposed into out: the BLAS runs this
    # order faster when B * P, the contraction, is long
    np.copyto(flat, _gemm(cols, _by_group(dy, G).transpose(0, 2, 1), ws).transpose(0, 2, 1))


def _pointwise_grad_filter(x, dy, out):
    """``out`` (K, C) = sum over b of dy[b] (K, P) @ x[b] (C, P)^T for x (B, C, P) and
    dy (B, K, P): one product over the images side by side (see
    :data:`MERGED_POSITIONS`; views for one image), else one per image, each after the
    first added into ``out`` by the BLAS itself where it can."""
    B, C, P = x.shape
    if B == 1 or P < MERGED_POSITIONS:
        np.matmul(_side_by_side(dy), _side_by_side(x).T, out=out)
        return
    np.matmul(dy[0], x[0].T, out=out)
    for b in range(1, B):
        if not blas.accumulate(dy[b], x[b].T, out, 1.0):
            out += dy[b] @ x[b].T


def _tap_views(xp, kernel, out, strides, dilation):
    return [xp[(Ellipsis,) + cv.tap_slices(t, out, strides, dilation)]
            for t in np.ndindex(*kernel)]


def _tiled_max(x, kernel, P, out):
    """``out`` (M * prod(P),) = the window maxima of x (..., *S) for windows that tile it
    (see :func:`_tiles`), one kernel dim at a time, last first: each pass takes the
    maximum of k strided column views of (L, k, run), ``run`` the contiguous output
    positions after that dim (a long inner loop, never a short strided one). A window
    holding a NaN has a NaN maximum, as on the strided path."""
    cur, run = x, 1
    for i in reversed(range(len(kernel))):
        k = kernel[i]
        r = cur.reshape(-1, k, run)
        nxt = _into(out, r[:, 0].shape) if i == 0 else np.empty(r[:, 0].shape, x.dtype)
        if k == 1:
            np.copyto(nxt, r[:, 0])
        else:
            np.maximum(r[:, 0], r[:, 1], out=nxt)
            for j in range(2, k):
                np.maximum(nxt, r[:, j], out=nxt)
        cur, run = nxt, run * P[i]
    return out


def _tiled_broadcast(a, kernel, P):
    """``a`` (..., *P) as (M, P0, 1, P1, 1, ..., P_last * k_last): repeated along the last
    kernel dim, broadcastable against x reshaped by :func:`_tiled_shape`."""
    r = np.repeat(a.reshape(-1, P[-1]), kernel[-1], axis=1) if kernel[-1] > 1 else a
    shape = (-1,) + tuple(d for p in P[:-1] for d in (p, 1)) + (P[-1] * kernel[-1],)
    return r.reshape(shape)


def _tiled_shape(kernel, P):
    """x (..., *S) as (M, P0, k0, P1, k1, ..., P_last * k_last) for tiling windows."""
    return (-1,) + tuple(d for p, k in zip(P[:-1], kernel[:-1]) for d in (p, k)) + (
        P[-1] * kernel[-1],)


def max_pool(x, out, kernel, strides, pads, dilation, ws=None):
    """``out`` (..., *P): the maximum of each window of x (..., *S): windows that tile
    x by NumPy (:func:`_tiled_max`), others by :mod:`.im2col`'s C kernel where ``ws``
    allows C (resnet18's 3 x 3 windows at stride 2 on 64 planes of 32 x 32, two images:
    NumPy's nine strided maxima took 340 us), else by NumPy over the padded image."""
    n = len(kernel)
    P = out.shape[out.ndim - n:]
    if _tiles(x.shape[x.ndim - n:], kernel, strides, pads, dilation, P):
        _tiled_max(x, kernel, P, out)
        return
    fns = _fixed(ws, c_im2col)
    if fns and c_im2col.max_pool(fns, x, out, kernel, strides, pads, dilation):
        return
    views = _tap_views(_padded(x, pads, cv._lowest(x.dtype)), kernel, P, strides, dilation)
    np.copyto(out, views[0])
    for v in views[1:]:
        np.maximum(out, v, out=out)


def _first_max_masks(x, kernel, P, strides, pads, dilation):
    """For each kernel offset in order, a boolean (..., *P): whether that offset holds
    the first maximum of its window (one buffer, rewritten per offset)."""
    views = _tap_views(_padded(x, pads, cv._lowest(x.dtype)), kernel, P, strides, dilation)
    top = views[0].copy()
    for v in views[1:]:
        np.maximum(top, v, out=top)
    taken = np.zeros(top.shape, bool)
    hit = np.empty(top.shape, bool)
    for v in views:
        np.equal(v, top, out=hit)
        np.greater(hit, taken, out=hit)  # and not taken by an earlier offset
        taken |= hit
        yield hit


def _tiles(shape, kernel, strides, pads, dilation, P):
    """Whether the windows cover every input position exactly once."""
    return not any(lo or hi for lo, hi in pads) and all(
        d == 1 and s == k and p * s == n
        for n, k, s, d, p in zip(shape, kernel, strides, dilation, P))


def _keep_first(hits, kernel, P):
    """Clear, in ``hits`` (bool, x's tiled layout), every hit after the first of its
    window in kernel-offset order."""
    t = hits.reshape((-1,) + tuple(d for p, k in zip(P, kernel) for d in (p, k)))
    taken = None
    for tap in np.ndindex(*kernel):
        h = t[(slice(None),) + tuple(x for i in tap for x in (slice(None), i))]
        if taken is None:
            taken = h.copy()
        else:
            np.greater(h, taken, out=h)  # and not taken by an earlier offset
            taken |= h


def max_pool_grad(x, dy, out, kernel, strides, pads, dilation, ws=None):
    """``out`` (x's shape): dy (..., *P) added at each window's first maximum of x
    (``ws``, the computation's workspace, is not used)."""
    n = len(kernel)
    P = dy.shape[dy.ndim - n:]
    S = x.shape[x.ndim - n:]
    if _tiles(S, kernel, strides, pads, dilation, P) and x.dtype == dy.dtype == out.dtype:
        # each input is in one window: out = dy (repeated over the window) where x is its
        # window's first maximum, else dy * 0 (as below); all passes in x's own layout
        top = _tiled_max(x, kernel, P, np.empty(dy.size, x.dtype))
        shape = _tiled_shape(kernel, P)
        first = _into(np.empty(x.shape, bool), shape)  # C order: _keep_first writes views
        np.equal(x.reshape(shape), _tiled_broadcast(top, kernel, P), out=first)
        if np.count_nonzero(first) != top.size - np.count_nonzero(np.isnan(top)):
            _keep_first(first, kernel, P)  # some window has its maximum twice
        np.multiply(_tiled_broadcast(dy, kernel, P), first, out=_into(out, shape))
        return
    masks = _first_max_masks(x, kernel, P, strides, pads, dilation)
    xp = np.zeros(x.shape[:x.ndim - n] + tuple(m + lo + hi for m, (lo, hi) in
                                                zip(S, pads)), out.dtype)
    part = np.empty(dy.shape, out.dtype)
    for mask, o in zip(masks, _tap_views(xp, kernel, P, strides, dilation)):
        np.multiply(dy, mask, out=part)
        o += part
    np.copyto(out, xp[(Ellipsis,) + tuple(slice(lo, lo + m) for m, (lo, _) in
                                          zip(S, pads))])


def max_pool_gather(x, v, out, kernel, strides, pads, dilation, ws=None):
    """``out`` (..., *P): v (x's shape) at each window's first maximum of x (``ws``, the
    computation's workspace, is not used)."""
    P = out.shape[out.ndim - len(kernel):]
    masks = _first_max_masks(x, kernel, P, strides, pads, dilation)
    out.fill(0)  # a window of NaNs has no maximum
    for mask, t in zip(masks, _tap_views(_padded(v, pads), kernel, P, strides, dilation)):
        np.copyto(out, t, where=mask)


NUMPY_GLOBALS.update(_conv_forward=conv_forward, _conv_step=conv_step,
                     _conv_grad_data=conv_grad_data, _conv_grad_filter=conv_grad_filter,
                     _max_pool=max_pool, _max_pool_grad=max_pool_grad,
                     _max_pool_gather=max_pool_gather)

_CONV_FN = {cv.Conv: "_conv_forward", cv.ConvGradData: "_conv_grad_data",
            cv.ConvGradFilter: "_conv_grad_filter"}
_POOL_FN = {cv.MaxPool: "_max_pool", cv.MaxPoolGrad: "_max_pool_grad",
            cv.MaxPoolGather: "_max_pool_gather"}


@numpy_code(*_CONV_FN)
def _conv(op, out, args, epilogue=""):
    a, b = args
    # _conv_ws: the computation's Workspace
    return [f"{_CONV_FN[type(op)]}({a}, {b}, {out}, {op.strides}, {op.pads}, "
            f"{op.dilation}, {op.groups}, _conv_ws{epilogue})"]


@numpy_code(*_POOL_FN)
def _pool(op, out, args):
    return [f"{_POOL_FN[type(op)]}({', '.join(args)}, {out}, {op.kernel}, {op.strides}, "
            f"{op.pads}, {op.dilation}, _conv_ws)"]
