"""The fast paths of the NumPy convolution (geon/transformers/numpy/conv.py): the direct
C kernels for few channels per group (depthwise and grouped convolution, their rows and
lanes forms) and the matrix product of 1 x 1 convolutions, forward and both
derivatives, against the plain-NumPy definitions and PyTorch, with and without a C
compiler (the NumPy path is then the im2col one)."""

import warnings
import weakref

import numpy as np
import pytest

import geon as be
from geon.errors import GeonWarning
from geon.op_graph import conv_math as cm
from geon.transformers import fusion
from geon.transformers.numpy import compiled as ck
from geon.transformers.numpy import conv as nc
from geon.transformers.numpy import conv_kernels as dk
from geon.transformers.numpy import pointwise as pw
from geon.transformers.numpy import toolchain as ctoolchain
from geon.transformers.numpy import small_gemm
from geon.transformers.numpy.kernel_cache import CompileError

# (batch, C, K, groups, spatial, kernel, strides, pads, dilation)
CASES = [
    (1, 6, 6, 6, (9, 10), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),       # depthwise
    (3, 6, 6, 6, (9, 11), (3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1)),
    (3, 5, 10, 5, (8, 9), (5, 5), (1, 2), ((2, 2), (2, 1)), (1, 1)),       # multiplier 2
    (1, 4, 8, 4, (9, 9), (3, 3), (2, 1), ((0, 1), (2, 0)), (2, 2)),        # dilation 2
    (3, 4, 4, 2, (7, 6), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),        # groups 2
    (1, 8, 12, 4, (7, 8), (3, 2), (2, 1), ((1, 0), (0, 1)), (1, 2)),       # groups 4
    (3, 8, 8, 2, (7, 6), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),        # (im2col)
    (3, 3, 8, 1, (9, 20), (3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1)),       # a stem
    (3, 18, 18, 18, (3, 2), (5, 5), (1, 1), ((2, 2), (2, 2)), (1, 1)),     # 2 lane blocks
    (1, 7, 7, 7, (20,), (5,), (2,), ((2, 2),), (1,)),                      # 1-D
    (3, 4, 8, 4, (13,), (3,), (1,), ((2, 0),), (2,)),
    (1, 4, 4, 4, (5, 6, 4), (3, 3, 2), (1, 2, 1), ((1, 1), (1, 0), (0, 1)), (1, 1, 2)),
    (3, 4, 4, 2, (4, 5, 6), (2, 3, 3), (2, 1, 2), ((0, 1), (1, 1), (1, 1)), (1, 1, 1)),
    (3, 6, 6, 6, (9, 10), (3, 3), (1, 1), ((0, 0), (0, 0)), (1, 1)),       # no padding
    (1, 3, 3, 3, (5, 5), (3, 3), (3, 3), ((1, 0), (1, 0)), (1, 1)),        # inputs unread
    # the planes form (depthwise, 3 x 3 or 5 x 5, stride 1 or 2, rows of 16 outputs or
    # more): blocks of 8 output rows and a partial one, a last vector of a row that
    # overlaps the one before, odd and even rows at stride 2, a pad after of 0
    (2, 5, 5, 5, (9, 16), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),
    (1, 3, 3, 3, (5, 37), (3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1)),
    (2, 4, 4, 4, (11, 40), (5, 5), (2, 2), ((2, 2), (2, 2)), (1, 1)),
    (1, 4, 4, 4, (6, 33), (5, 5), (1, 1), ((2, 2), (2, 2)), (1, 1)),
    (1, 2, 2, 2, (4, 33), (5, 5), (2, 2), ((2, 2), (2, 2)), (1, 1)),
    (1, 3, 3, 3, (17, 32), (3, 3), (2, 2), ((1, 0), (1, 0)), (1, 1)),
    # the masked form (3 x 3, stride 1, "same", rows of 8 to 15, planes of whole
    # vectors): two rows a vector, vectors across rows of 12, 4 vectors, 9 vectors
    (2, 5, 5, 5, (6, 8), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),
    (1, 3, 3, 3, (4, 12), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),
    (2, 4, 4, 4, (8, 8), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),
    (1, 2, 2, 2, (12, 12), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),
    # ... and 4 x 4 planes (a vector a plane), 5 x 5 windows, stride 2 through the
    # four phases of an image (rows of 8 and 4: shuffled out of vectors; 12: element by
    # element), planes that are not square
    (2, 5, 5, 5, (4, 4), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),
    (1, 3, 3, 3, (8, 8), (5, 5), (1, 1), ((2, 2), (2, 2)), (1, 1)),
    (2, 4, 4, 4, (4, 4), (5, 5), (1, 1), ((2, 2), (2, 2)), (1, 1)),
    (1, 5, 5, 5, (16, 16), (3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1)),
    (2, 3, 3, 3, (8, 8), (5, 5), (2, 2), ((2, 2), (2, 2)), (1, 1)),
    (1, 2, 2, 2, (24, 24), (3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1)),
    (1, 2, 2, 2, (8, 24), (5, 5), (2, 2), ((2, 2), (2, 2)), (1, 1)),
    # long rows: the rows kernels' blocks of 64 and 16 outputs, and an overlapping one
    (3, 3, 3, 3, (4, 150), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),
    (1, 4, 8, 4, (5, 141), (3, 5), (2, 2), ((1, 1), (2, 2)), (1, 1)),
    (3, 4, 4, 2, (3, 200), (3, 3), (1, 3), ((1, 1), (1, 1)), (1, 2)),
    (1, 2, 2, 2, (300,), (7,), (1,), ((3, 3),), (1,)),
    # rows of 16 to 63 outputs: four rows at a time, then the rows left one at a time
    (2, 3, 3, 3, (6, 40), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),
    (1, 4, 8, 4, (11, 45), (3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1)),
    (1, 2, 2, 2, (3, 5, 20), (2, 3, 3), (1, 1, 1), ((0, 0), (1, 1), (1, 1)), (1, 1, 1)),
]
POINTWISE = [(1, 5, 7, (6, 5)), (3, 5, 7, (4, 3)), (3, 6, 4, (17, 16)), (2, 4, 3, (9,)),
             (3, 4, 5, (2, 3, 2))]


#: The cases the planes and masked forms take (where they are on).
PLANES = CASES[15:21] + [CASES[32], CASES[-3]]
MASKED = CASES[21:32]


@pytest.fixture(params=["compiled-rows", "compiled-lanes", "compiled-planes", "numpy"])
def path(request, tmp_path, monkeypatch):
    """The convolution's code path: the direct kernels (rows or lanes; the planes and
    masked forms where they apply, else rows) where a C compiler works, or the NumPy
    code of a machine without one."""
    monkeypatch.setattr(dk, "_loaded", {})
    monkeypatch.setattr(pw, "_loaded", {})
    if request.param == "numpy":
        monkeypatch.setenv("CC", "geon-no-such-compiler-xyz")
        monkeypatch.setenv("GEON_CACHE_DIR", str(tmp_path))
        monkeypatch.setattr(ctoolchain, "_warned", set())
        assert dk.kernels() is None
    else:
        if not ck.available():
            pytest.skip("no working C compiler")
        assert dk.kernels() is not None
        rows = request.param != "compiled-lanes"
        monkeypatch.setattr(dk, "PLANES", request.param == "compiled-planes")
        monkeypatch.setattr(dk, "LANE_ROWS", 0 if rows else 1 << 40)
        monkeypatch.setattr(dk, "LANE_TILE_BYTES", 1 << 40)
    return request.param


def _arrays(B, C, K, groups, S, R, strides, pads, dilation, dtype, seed=0):
    rng = np.random.default_rng(seed)
    P = tuple(cm.out_length(n, r, s, d, lo, hi)
              for n, r, s, d, (lo, hi) in zip(S, R, strides, dilation, pads))
    x = rng.standard_normal((B, C) + S).astype(dtype)
    w = rng.standard_normal((K, C // groups) + R).astype(dtype)
    dy = rng.standard_normal((B, K) + P).astype(dtype)
    return x, w, dy, P


def _close(got, want, rtol):
    scale = np.max(np.abs(want)) or 1.0
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * scale)


def _check_primitives(x, w, dy, P, strides, pads, dilation, groups, rtol):
    """The three primitives of conv.py against the definitions (in float64)."""
    args = (strides, pads, dilation, groups)
    x64, w64, dy64 = (a.astype(np.float64) for a in (x, w, dy))
    y = np.full(dy.shape, np.nan, x.dtype)
    nc.conv_forward(x, w, y, *args)
    _close(y, cm.reference_conv(x64, w64, P, *args), rtol)
    dx = np.full(x.shape, np.nan, x.dtype)
    nc.conv_grad_data(dy, w, dx, *args)
    _close(dx, cm.reference_conv_grad_data(dy64, w64, x.shape[2:], *args), rtol)
    dw = np.full(w.shape, np.nan, x.dtype)
    nc.conv_grad_filter(x, dy, dw, *args)
    _close(dw, cm.reference_conv_grad_filter(x64, dy64, w.shape[2:], *args), rtol)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_grouped_conv_float64(case, path):
    B, C, K, G, S, R, st, pads, dil = case
    x, w, dy, P = _arrays(B, C, K, G, S, R, st, pads, dil, np.float64)
    assert dk.usable(x, w, dy, pads)
    assert (nc._direct(x, w, dy, C // G, R, pads, None) is None) == (
        path == "numpy" or C // G > dk.MAX_GROUP_CHANNELS)
    _check_primitives(x, w, dy, P, st, pads, dil, G, 1e-12)


@pytest.mark.parametrize("case", CASES[:8], ids=str)
def test_grouped_conv_float32(case, path):
    B, C, K, G, S, R, st, pads, dil = case
    x, w, dy, P = _arrays(B, C, K, G, S, R, st, pads, dil, np.float32, seed=1)
    _check_primitives(x, w, dy, P, st, pads, dil, G, 1e-5)


@pytest.mark.parametrize("case", POINTWISE, ids=str)
@pytest.mark.parametrize("dtype,rtol", [(np.float64, 1e-12), (np.float32, 1e-5)])
def test_pointwise_conv(case, dtype, rtol, path):
    B, C, K, S = case
    n = len(S)
    x, w, dy, P = _arrays(B, C, K, 1, S, (1,) * n, (1,) * n, ((0, 0),) * n, (1,) * n,
                          dtype)
    _check_primitives(x, w, dy, P, (1,) * n, ((0, 0),) * n, (1,) * n, 1, rtol)


@pytest.mark.parametrize("case", [(2, 3, 8, (32, 32), (8, 8)), (1, 2, 5, (12, 6), (3, 2)),
                                  (3, 4, 4, (4, 4), (4, 4))], ids=str)
@pytest.mark.parametrize("dtype,rtol", [(np.float64, 1e-12), (np.float32, 1e-5)])
def test_patches_take_one_product(case, dtype, rtol, path, monkeypatch):
    """Windows that tile the image (strides equal to the kernel, no padding: a ViT's
    patch embedding) are x's patches by a reshape and one copy, then one product (C
    calls where they build): the definitions' values, and the general path's."""
    B, C, K, S, R = case
    x, w, dy, P = _arrays(B, C, K, 1, S, R, R, ((0, 0), (0, 0)), (1, 1), dtype)
    args = (R, ((0, 0), (0, 0)), (1, 1), 1)
    assert nc._patches(x, w, dy, *args)
    assert not nc._patches(x, w, dy, R, ((0, 1), (0, 0)), (1, 1), 1)
    _check_primitives(x, w, dy, P, *args, rtol)
    y = np.empty(dy.shape, dtype)
    nc.conv_forward(x, w, y, *args, nc.Workspace())
    steps = nc._patch_plan(x, w, y, nc.Workspace()).step(x, w, y, None)
    # one C call (small_gemm's patch entry) where C runs and the product has rows
    # enough for small_gemm (K filters)
    c_calls = path != "numpy" and K >= small_gemm.MIN_ROWS
    assert (steps is not None) == c_calls and (steps is None or len(steps) == 1)
    # the call is given each call's arrays: a weight that is not contiguous (NumPy's
    # way), a weight changed in place, and nothing held between calls
    ws = nc.Workspace()
    wt = np.ascontiguousarray(w.transpose(3, 2, 1, 0)).transpose(3, 2, 1, 0)
    for weight in (w.copy(), wt):
        z = np.empty(dy.shape, dtype)
        nc.conv_forward(x, weight, z, *args, ws)
        _close(z, y, rtol)
        weight *= -2
        nc.conv_forward(x, weight, z, *args, ws)
        _close(z, -2 * y, rtol)
    x2 = x.copy()
    held = weakref.ref(x2)
    nc.conv_forward(x2, w, np.empty(dy.shape, dtype), *args, ws)
    del x2
    assert held() is None
    monkeypatch.setattr(nc, "_patches", lambda *a: False)
    general = np.empty(dy.shape, dtype)
    nc.conv_forward(x, w, general, *args, nc.Workspace())
    _close(y, general, rtol)


def test_non_contiguous_operands(path):
    """Views (a transposed image, a strided filter) are read as they are."""
    B, C, K, G, S, R, st, pads, dil = CASES[2]
    x, w, dy, P = _arrays(B, C, K, G, S, R, st, pads, dil, np.float64)
    xt = np.ascontiguousarray(x.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)
    w2 = np.repeat(w, 2, axis=-1)[..., ::2]
    _check_primitives(xt, w2, dy, P, st, pads, dil, G, 1e-12)
    x1, w1, dy1, P1 = _arrays(3, 4, 6, 1, (5, 4), (1, 1), (1, 1), ((0, 0),) * 2, (1, 1),
                              np.float64)
    _check_primitives(x1.transpose(0, 1, 3, 2), w1, dy1.transpose(0, 1, 3, 2), P1[::-1],
                      (1, 1), ((0, 0),) * 2, (1, 1), 1, 1e-12)


def test_mixed_dtypes_and_integers_take_the_general_path(path):
    B, C, K, G, S, R, st, pads, dil = CASES[0]
    x, w, dy, P = _arrays(B, C, K, G, S, R, st, pads, dil, np.float64)
    assert not dk.usable(x.astype(np.float32), w, dy)
    y = np.empty(dy.shape, np.float64)
    nc.conv_forward(x.astype(np.float32), w, y, st, pads, dil, G)
    _close(y, cm.reference_conv(x.astype(np.float32).astype(np.float64), w, P, st, pads,
                                dil, G), 1e-6)
    xi, wi = (np.round(a * 4).astype(np.int64) for a in (x, w))
    yi = np.empty(dy.shape, np.int64)
    nc.conv_forward(xi, wi, yi, st, pads, dil, G)
    np.testing.assert_array_equal(yi, cm.reference_conv(xi, wi, P, st, pads, dil, G))


# many output channels on images of few positions, strided and not, grouped and not
WIDE = [(2, 16, 48, 1, (2, 2), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),
        (1, 24, 40, 2, (3, 4), (3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1)),
        (2, 20, 64, 1, (4,), (3,), (2,), ((1, 0),), (1,)),
        (1, 12, 36, 1, (3, 3), (2, 2), (1, 1), ((0, 1), (1, 0)), (2, 1))]


@pytest.mark.parametrize("few", [True, False])
@pytest.mark.parametrize("case", WIDE + CASES[6:9], ids=str)
def test_few_positions_take_the_filter_as_it_is(case, few, monkeypatch):
    """Both orders of the derivatives' products (the filter read as it is, or copied
    transposed first) give the definitions' values, in float64 and float32, and the
    integer gradients exactly."""
    ratio = 0 if few else 10 ** 9
    monkeypatch.setattr(nc, "FEW_POSITIONS_RATIO", {"data": ratio, "filter": ratio})
    B, C, K, G, S, R, st, pads, dil = case
    x, w, dy, P = _arrays(B, C, K, G, S, R, st, pads, dil, np.float64)
    assert nc._few_positions(dy, K // G, "data") == nc._few_positions(dy, K // G,
                                                                      "filter") == few
    _check_primitives(x, w, dy, P, st, pads, dil, G, 1e-12)
    x, w, dy, P = _arrays(B, C, K, G, S, R, st, pads, dil, np.float32, seed=2)
    _check_primitives(x, w, dy, P, st, pads, dil, G, 1e-5)
    xi, dyi = (np.round(a * 4).astype(np.int64) for a in (x, dy))
    dwi = np.empty(w.shape, np.int64)
    nc.conv_grad_filter(xi, dyi, dwi, st, pads, dil, G)
    np.testing.assert_array_equal(dwi, cm.reference_conv_grad_filter(
        xi, dyi, w.shape[2:], st, pads, dil, G))


def test_one_workspace_serves_calls_of_every_shape(path):
    """A computation's Workspace hands the same buffers to calls of different shapes
    and dtypes (grown where one is too small); every call gives exactly the values of
    one with fresh temporaries."""
    ws = nc.Workspace(direct=path != "numpy")
    for dtype in (np.float64, np.float32):
        for case in WIDE + CASES[::2] + WIDE[::-1]:
            B, C, K, G, S, R, st, pads, dil = case
            x, w, dy, P = _arrays(B, C, K, G, S, R, st, pads, dil, dtype)
            args = (st, pads, dil, G)
            for fn, a, b, shape in ((nc.conv_forward, x, w, dy.shape),
                                    (nc.conv_grad_data, dy, w, x.shape),
                                    (nc.conv_grad_filter, x, dy, w.shape)):
                got, want = np.empty(shape, dtype), np.empty(shape, dtype)
                fn(a, b, got, *args, ws)
                fn(a, b, want, *args, ws=None if path == "numpy" else nc.Workspace())
                np.testing.assert_array_equal(got, want)
    big = ws.take("columns", (1000,), np.float64)
    small = ws.take("columns", (3, 5), np.float32)
    assert np.shares_memory(big, small) and small.shape == (3, 5)


def _torch_conv(torch, n):
    F = torch.nn.functional
    return {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[n]


@pytest.mark.parametrize("case", CASES + [(3, 5, 7, 1, (6, 5), (1, 1), (1, 1),
                                           ((0, 0), (0, 0)), (1, 1))], ids=str)
def test_graph_against_pytorch(case, path):
    """Through the graph (be.np.conv and deriv): values and both derivatives against
    PyTorch's, in float64 (symmetric padding: PyTorch's convolution takes one pad a
    dimension)."""
    torch = pytest.importorskip("torch", reason="PyTorch (CPU) is the reference")
    B, C, K, G, S, R, st, pads, dil = case
    pads = tuple((lo, lo) for lo, _ in pads)
    x, w, dy, _ = _arrays(B, C, K, G, S, R, st, pads, dil, np.float64, seed=2)
    xs = be.np.placeholder(x.shape, dtype=np.float64)
    ws = be.np.placeholder(w.shape, dtype=np.float64)
    y = be.np.conv(xs, ws, stride=st, padding=pads, dilation=dil, groups=G)
    loss = be.np.sum(y * be.np.constant(dy))
    gy, gx, gw = be.NumPyTransformer().computation([y] + be.deriv(loss, [xs, ws]),
                                                   xs, ws)(x, w)
    tx, tw = (torch.from_numpy(a).requires_grad_() for a in (x, w))
    ty = _torch_conv(torch, len(S))(tx, tw, stride=st, padding=tuple(lo for lo, _ in pads),
                                    dilation=dil, groups=G)
    ty.backward(torch.from_numpy(dy))
    _close(gy, ty.detach().numpy(), 1e-12)
    _close(gx, tx.grad.numpy(), 1e-12)
    _close(gw, tw.grad.numpy(), 1e-12)


@pytest.mark.parametrize("case", [CASES[2], CASES[6], CASES[-3]], ids=str)
def test_kernels_split_over_threads(case, path, monkeypatch):
    """Every call split into blocks of planes on geon's threads gives the same values."""
    monkeypatch.setattr(dk, "PARALLEL_WORK", 0)
    monkeypatch.setattr(fusion, "MAX_THREADS", 3)
    B, C, K, G, S, R, st, pads, dil = case
    x, w, dy, P = _arrays(B, C, K, G, S, R, st, pads, dil, np.float64)
    _check_primitives(x, w, dy, P, st, pads, dil, G, 1e-12)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_the_planes_form_takes_its_geometries(case):
    """The planes and masked forms compute the forwards of their cases (and no
    derivative); the other cases go to the rows or lanes forms."""
    B, C, K, G, S, R, st, pads, dil = case
    x, w, dy, P = _arrays(B, C, K, G, S, R, st, pads, dil, np.float64)
    fns = dk.kernels()
    if fns is None:
        pytest.skip("no working C compiler")
    args = (st, pads, dil, G, dy.dtype)
    kinds = [dk._plan(fns, name, x.shape, w.shape, dy.shape, *args)[1]
             for name in ("forward", "grad_data", "grad_filter")]
    assert (kinds[0] == "planes_") == (case in PLANES)
    assert (kinds[0] == "masked_") == (case in MASKED)
    assert not {"planes_", "masked_"} & set(kinds[1:])


def test_a_geometry_is_planned_once(monkeypatch):
    """The kernel, geometry array and items of a call are kept per geometry: a second
    call of one geometry finds its plan, another geometry (or pads given as lists, not
    kept) gets its own, and the same values come out; past MAX_PLANS the plans start
    afresh."""
    if dk.kernels() is None:
        pytest.skip("no C compiler: the direct kernels do not run")
    monkeypatch.setattr(dk, "_plans", {})
    B, C, K, G, S, R, st, pads, dil = CASES[1]
    x, w, dy, P = _arrays(B, C, K, G, S, R, st, pads, dil, np.float64)
    out = np.empty((B, K) + P)
    nc.conv_forward(x, w, out, st, pads, dil, G)
    (plan,) = dk._plans.values()
    again = np.empty_like(out)
    nc.conv_forward(x, w, again, st, pads, dil, G)
    assert list(dk._plans.values()) == [plan]
    np.testing.assert_array_equal(again, out)
    listed = np.empty_like(out)
    nc.conv_forward(x, w, listed, list(st), [list(p) for p in pads], list(dil), G)
    assert len(dk._plans) == 1
    np.testing.assert_array_equal(listed, out)
    nc.conv_forward(x[:1], w, out[:1], st, pads, dil, G)
    assert len(dk._plans) == 2
    monkeypatch.setattr(dk, "MAX_PLANS", 2)
    nc.conv_forward(x[:2], w, out[:2], st, pads, dil, G)
    assert len(dk._plans) == 1
    np.testing.assert_array_equal(out, again)


@pytest.mark.parametrize("case", [CASES[1], CASES[8], WIDE[0],
                                  (3, 5, 7, 1, (6, 5), (1, 1), (1, 1),
                                   ((0, 0), (0, 0)), (1, 1))], ids=str)
def test_a_call_site_chooses_once(case, path, monkeypatch):
    """With a workspace, conv_forward chooses its way once per call site (weight and
    result array) and runs it again for the same arrays and settings, with the values
    of the arrays at that call; other arrays, settings or threads choose again, every
    value as a fresh call's; the sites hold their arrays weakly."""
    import gc
    import weakref
    plans = []   # the sites chosen
    real = nc._Site.make
    monkeypatch.setattr(nc._Site, "make",
                        staticmethod(lambda *a: plans.append(1) or real(*a)))
    B, C, K, G, S, R, st, pads, dil = case
    x, w, dy, P = _arrays(B, C, K, G, S, R, st, pads, dil, np.float32)
    b = np.linspace(-1, 1, K).astype(np.float32)
    ws = nc.Workspace(direct=path != "numpy")
    out, final = np.empty(dy.shape, np.float32), np.empty(dy.shape, np.float32)

    def fresh(x, lo, hi):
        got = np.empty_like(final)
        nc.conv_forward(x, w, np.empty_like(out), st, pads, dil, G, None,
                        (got, b, lo, hi, "clamp"))
        return got
    for turn in range(3):
        x[...] = turn - x   # new values in the same array
        nc.conv_forward(x, w, out, st, pads, dil, G, ws, (final, b, 0.0, 6.0, "clamp"))
        np.testing.assert_array_equal(final, fresh(x, 0.0, 6.0))
    n = len(plans)
    assert n == 1 and len(ws.sites) == 1
    x2 = x + 1   # another image array
    nc.conv_forward(x2, w, out, st, pads, dil, G, ws, (final, b, 0.0, 6.0, "clamp"))
    np.testing.assert_array_equal(final, fresh(x2, 0.0, 6.0))
    assert len(plans) > n
    n = len(plans)
    nc.conv_forward(x2, w, out, st, pads, dil, G, ws, (final, b, -1.0, 3.0, "clamp"))
    np.testing.assert_array_equal(final, fresh(x2, -1.0, 3.0))
    assert len(plans) > n
    n = len(plans)
    monkeypatch.setattr(fusion, "MAX_THREADS", fusion.MAX_THREADS + 1)
    nc.conv_forward(x2, w, out, st, pads, dil, G, ws, (final, b, -1.0, 3.0, "clamp"))
    np.testing.assert_array_equal(final, fresh(x2, -1.0, 3.0))
    assert len(plans) > n
    n = len(plans)
    nc.conv_forward(x2, w, out, st, pads, dil, G, ws)   # no epilogue: its own way
    want = np.empty_like(out)
    nc.conv_forward(x2, w, want, st, pads, dil, G)
    np.testing.assert_array_equal(out, want)
    assert len(plans) > n
    gone = weakref.ref(x2)
    del x2
    gc.collect()
    assert gone() is None
    monkeypatch.setattr(nc._Site, "MAX", 1)
    nc.conv_forward(x, w, final, st, pads, dil, G, ws)
    assert len(ws.sites) == 1


def test_compiled_off_runs_numpy_code(monkeypatch):
    monkeypatch.setenv("GEON_COMPILED", "0")
    assert dk.kernels() is None
    B, C, K, G, S, R, st, pads, dil = CASES[1]
    x, w, dy, P = _arrays(B, C, K, G, S, R, st, pads, dil, np.float64)
    _check_primitives(x, w, dy, P, st, pads, dil, G, 1e-12)


def test_long_kernels_run_im2col(path):
    """A kernel longer than MAX_KERNEL_LENGTH (its taps would fill the C stack) runs
    im2col, with the same values."""
    n = dk.MAX_KERNEL_LENGTH + 1
    x, w, dy, P = _arrays(1, 1, 1, 1, (n + 5,), (n,), (1,), ((0, 0),), (1,), np.float64)
    assert nc._direct(x, w, dy, 1, w.shape[2:], ((0, 0),), None) is None
    _check_primitives(x, w, dy, P, (1,), ((0, 0),), (1,), 1, 1e-12)


@pytest.mark.parametrize("compiled", [False, True])
def test_the_transformers_compiled_mode_decides_on_the_direct_kernels(compiled,
                                                                      monkeypatch):
    """NumPyTransformer(compiled=False) runs no C, the direct kernels included."""
    if compiled and not ck.available():
        pytest.skip("no working C compiler")
    calls = []
    for name in ("forward", "grad_data", "grad_filter"):
        real = getattr(dk, name)
        monkeypatch.setattr(dk, name, lambda *a, _real=real, _n=name: (
            calls.append(_n), _real(*a))[1])
    B, C, K, G, S, R, st, pads, dil = CASES[1]
    x, w, dy, _ = _arrays(B, C, K, G, S, R, st, pads, dil, np.float64)
    xs = be.np.placeholder(x.shape, dtype=np.float64)
    ws = be.np.placeholder(w.shape, dtype=np.float64)
    y = be.np.conv(xs, ws, stride=st, padding=pads, dilation=dil, groups=G)
    loss = be.np.sum(y * be.np.constant(np.ones(y.axes.lengths)))
    want = be.NumPyTransformer(compiled=not compiled).computation(
        [y] + be.deriv(loss, [xs, ws]), xs, ws)(x, w)
    calls.clear()
    comp = be.NumPyTransformer(compiled=compiled).computation([y] + be.deriv(loss, [xs, ws]),
                                                              xs, ws)
    got = comp(x, w)
    for g, v in zip(got, want):
        _close(g, v, 1e-12)
    assert bool(calls) == compiled, calls


def test_kernel_source_is_cached_like_the_fused_kernels(tmp_path, monkeypatch):
    """The library is built through the toolchain's cache (its folder, digests and
    trust rules): a second process-wide load finds it there."""
    if not ck.available():
        pytest.skip("no working C compiler")
    monkeypatch.setenv("GEON_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(dk, "_loaded", {})
    monkeypatch.setattr(ctoolchain, "_libs", {})
    assert dk.kernels() is not None
    kept = sorted(p.suffix for p in (tmp_path / "kernels").iterdir()
                  if not p.name.startswith("toolchain-"))
    assert kept == [".c", ".sha256", ".so"]


def test_a_failed_build_warns_once_and_runs_numpy_code(monkeypatch):
    def failing(source, symbols=()):
        raise CompileError("cc: internal error", key="compile failed")
    monkeypatch.setattr(ctoolchain, "build", failing)
    monkeypatch.setattr(ctoolchain, "_warned", set())
    monkeypatch.setattr(dk, "_loaded", {})
    monkeypatch.delenv("GEON_COMPILED", raising=False)
    B, C, K, G, S, R, st, pads, dil = CASES[0]
    x, w, dy, P = _arrays(B, C, K, G, S, R, st, pads, dil, np.float64)
    with pytest.warns(GeonWarning, match="direct convolution kernels"):
        _check_primitives(x, w, dy, P, st, pads, dil, G, 1e-12)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _check_primitives(x, w, dy, P, st, pads, dil, G, 1e-12)
