"""The im2col copy in C (geon/transformers/numpy/im2col.py): the same columns as the
NumPy copy from a strided view of the padded image, over short rows (the table of
offsets) and long ones (a copy per row), 1-d and 2-d kernels, strides, dilations,
uneven padding, groups and every element size; and convolutions through it against
the definition."""

import numpy as np
import pytest

from geon.op_graph import conv_math as cm
from geon.transformers.numpy import compiled as ck
from geon.transformers.numpy import conv as nc
from geon.transformers.numpy import im2col

pytestmark = pytest.mark.skipif(not ck.available(),
                                reason="no working C compiler for the C kernels")

# (B, C, S, R, strides, pads, dilation, groups)
CASES = [
    (2, 8, (2, 2), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 1),      # late-stage 3 x 3
    (1, 3, (9, 20), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 1),     # rows of 20
    (2, 4, (7, 33), (5, 3), (2, 3), ((2, 0), (1, 2)), (1, 1), 1),     # strides, odd pads
    (1, 6, (11, 40), (3, 3), (1, 1), ((2, 2), (2, 2)), (2, 2), 2),    # dilated, 2 groups
    (3, 2, (4, 5), (4, 4), (1, 1), ((3, 3), (3, 3)), (1, 1), 1),      # mostly padding
    (2, 4, (6, 6), (3, 3), (3, 3), ((0, 0), (0, 0)), (1, 1), 4),      # tiled, depthwise
    (2, 5, (37,), (3,), (1,), ((1, 1),), (1,), 1),                    # 1-d, long rows
    (1, 4, (9,), (2,), (2,), ((0, 1),), (3,), 2),                     # 1-d, short rows
    (1, 2, (3, 50), (1, 7), (1, 1), ((0, 0), (6, 0)), (1, 1), 1),     # only left pads
]


def _out(S, R, st, pads, dil):
    return tuple(cm.out_length(n, r, s, d, lo, hi)
                 for n, r, s, d, (lo, hi) in zip(S, R, st, dil, pads))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int8,
                                   np.int64])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_same_columns_as_numpy(case, dtype):
    B, C, S, R, st, pads, dil, G = case
    x = (np.random.default_rng(0).standard_normal((B, C) + S) * 50).astype(dtype)
    P = _out(S, R, st, pads, dil)
    assert im2col.usable(x, R)
    got = nc._im2col(x, R, P, st, pads, dil, G, nc.Workspace(direct=True))
    want = nc._im2col(x, R, P, st, pads, dil, G, nc.Workspace(direct=False))
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("stride", [(1, 1), (2, 2), (1, 2), (2, 1)], ids=str)
@pytest.mark.parametrize("width", [4, 7, 8, 14, 16, 28, 32, 56, 64, 9, 65])
def test_strides_one_and_two_rows_of_every_width(width, stride):
    """Strides 1 and 2 copy zero-bordered planes first, each row of columns a copy of a
    size known to the compiler for the widths of common images, else a loop (9); rows
    shorter than PAD_MIN_ROW (4) take the table of offsets, longer than PAD_MAX_ROW (65)
    the copy per row: the same columns as NumPy's everywhere."""
    rng = np.random.default_rng(4)
    for R, pads in [((3, 3), ((1, 1), (1, 1))), ((1, 3), ((0, 0), (2, 0))),
                    ((2, 2), ((0, 1), (1, 0))), ((7, 7), ((3, 3), (3, 3)))]:
        S = (5 * stride[0], width * stride[1])   # output rows of `width` (or one less)
        x = rng.standard_normal((2, 3) + S).astype(np.float32)
        P = _out(S, R, stride, pads, (1, 1))
        got = nc._im2col(x, R, P, stride, pads, (1, 1), 1, nc.Workspace(direct=True))
        want = nc._im2col(x, R, P, stride, pads, (1, 1), 1, nc.Workspace(direct=False))
        np.testing.assert_array_equal(got, want)


def test_not_taken_where_it_does_not_apply():
    x = np.zeros((1, 2, 4, 4, 4), np.float32)
    assert not im2col.usable(x, (3, 3, 3))               # 3-d: NumPy's copy
    assert not im2col.usable(x[..., 0].transpose(0, 1, 3, 2), (3, 3))  # not contiguous
    assert not im2col.usable(np.zeros((1, 2, 4, 4), np.complex128), (3, 3))  # 16 bytes


def test_short_and_long_rows_both_run(monkeypatch):
    """The table of offsets and the copy per row give the same columns where either
    could run (the threshold moved over the case's row length)."""
    B, C, S, R, st, pads, dil, G = CASES[2]
    x = np.random.default_rng(1).standard_normal((B, C) + S).astype(np.float32)
    P = _out(S, R, st, pads, dil)
    got = []
    for limit in (1, 10 ** 6):
        monkeypatch.setattr(im2col, "MIN_ROW", limit)
        monkeypatch.setattr(im2col, "_loaded", {})   # rebuilt with the new threshold
        got.append(nc._im2col(x, R, P, st, pads, dil, G, nc.Workspace()).copy())
    np.testing.assert_array_equal(got[0], got[1])
    want = nc._im2col(x, R, P, st, pads, dil, G, nc.Workspace(direct=False))
    np.testing.assert_array_equal(got[0], want)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_convolutions_through_it(case):
    """conv_forward and conv_grad_filter (which both take im2col's columns) against the
    definition in float64."""
    B, C, S, R, st, pads, dil, G = case
    rng = np.random.default_rng(2)
    K = 2 * G
    x = rng.standard_normal((B, C) + S)
    w = rng.standard_normal((K, C // G) + R)
    P = _out(S, R, st, pads, dil)
    out = np.full((B, K) + P, np.nan)
    nc.conv_forward(x, w, out, st, pads, dil, G, nc.Workspace())
    want = cm.reference_conv(x, w, P, st, pads, dil, G)
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12 * np.abs(want).max())
    # the filter's derivative: sum over positions of dy times the windows, checked
    # as the adjoint of the forward (<dy, conv(x, v)> = <grad_w, v>)
    dy = rng.standard_normal(out.shape)
    gw = np.full(w.shape, np.nan)
    nc.conv_grad_filter(x, dy, gw, st, pads, dil, G, nc.Workspace())
    v = rng.standard_normal(w.shape)
    lhs = np.vdot(dy, cm.reference_conv(x, v, P, st, pads, dil, G))
    assert np.isclose(lhs, np.vdot(gw, v), rtol=1e-10)
