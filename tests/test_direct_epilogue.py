"""The epilogue of the direct (depthwise) convolution kernels
(geon/transformers/numpy/conv_kernels.py): bias and activation applied to each output
plane as it is done, in the rows and the lanes forms, against the convolution followed
by the separate epilogue pass; in place, and over the image where each output plane
reads its own input plane; refused (nothing written) where the result overlaps an
operand otherwise, and then conv_forward's separate pass gives the same values."""

import numpy as np
import pytest

from geon.op_graph import conv_math as cm
from geon.transformers.numpy import compiled as ck
from geon.transformers.numpy import conv as nc
from geon.transformers.numpy import conv_kernels as dk
from geon.transformers.numpy import pointwise as pw

pytestmark = pytest.mark.skipif(not ck.available(),
                                reason="no working C compiler for the C kernels")

# (B, C, S, stride): long rows (the planes form where it is on, else rows), short rows
# (4 x 4: masked where on, else lanes), a stride of 2 (rows; planes for the rows of 17
# outputs), 8 x 8 (masked where on, else lanes), a stride of 2 to rows of 8 and of 4
# (masked where on: runs of 4 and 16 planes for an activation's pass, the last short)
SHAPES = [(2, 5, (20, 24), 1), (1, 18, (4, 4), 1), (2, 7, (9, 17), 2), (1, 3, (30,), 1),
          (2, 7, (9, 34), 2), (2, 6, (8, 8), 1), (2, 21, (16, 16), 2), (1, 20, (8, 8), 2)]


@pytest.fixture(params=[True, False], ids=["planes", "rows"])
def planes(request, monkeypatch):
    """The planes form on (where it applies) or off."""
    monkeypatch.setattr(dk, "PLANES", request.param)
    return request.param
ACTS = [("clamp", 0.0, 6.0), ("clamp", -np.inf, np.inf), ("silu", 0, 0),
        ("sigmoid", 0, 0)]


def _case(B, C, S, st, dtype, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((B, C) + S).astype(dtype) * 3
    w = rng.standard_normal((C, 1) + (3,) * len(S)).astype(dtype)
    b = rng.standard_normal(C).astype(dtype)
    pads = ((1, 1),) * len(S)
    P = tuple(cm.out_length(n, 3, st, 1, 1, 1) for n in S)
    return x, w, b, (st,) * len(S), pads, (1,) * len(S), P


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("act", ACTS, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_fused_matches_the_separate_pass(shape, act, dtype, planes):
    B, C, S, st = shape
    x, w, b, strides, pads, dil, P = _case(B, C, S, st, dtype)
    name, lo, hi = act
    fns = dk.kernels()
    out = np.empty((B, C) + P, dtype)
    final = np.full_like(out, np.nan)
    assert dk.forward(fns, x, w, out, strides, pads, dil, C, (final, b, lo, hi, name))
    y = np.empty_like(out)
    dk.forward(fns, x, w, y, strides, pads, dil, C)
    want = np.empty_like(out)
    pw.bias_clamp(None, y, b, lo, hi, want, name)   # NumPy's pass
    tol = 1e-6 if dtype == np.float32 else 1e-14
    np.testing.assert_allclose(final, want, rtol=tol, atol=tol)
    # in place: the result is the scratch itself
    assert dk.forward(fns, x, w, y, strides, pads, dil, C, (y, b, lo, hi, name))
    np.testing.assert_array_equal(y, final)


def test_nan_kept_by_the_clamp():
    x, w, b, strides, pads, dil, P = _case(1, 18, (4, 4), 1, np.float32)
    x[0, 3, 1, 1] = np.nan
    out, final = np.empty((1, 18) + P, np.float32), np.empty((1, 18) + P, np.float32)
    assert dk.forward(dk.kernels(), x, w, out, strides, pads, dil, 18,
                      (final, b, 0.0, 6.0, "clamp"))
    assert np.isnan(final[0, 3]).sum() == 9 and not np.isnan(np.delete(final, 3, 1)).any()


@pytest.mark.parametrize("shape", SHAPES[:2], ids=str)
def test_result_over_the_image(shape, planes):
    """The result in the image's own memory (a plan gives a dead input's memory to the
    result) is taken where each output plane reads its own input plane (depthwise, one
    shape); a result overlapping the image otherwise (shifted by a plane) is refused
    before anything is written, and conv_forward then runs the convolution and its
    separate pass: the definition's values either way."""
    B, C, S, st = shape
    x, w, b, strides, pads, dil, P = _case(B, C, S, st, np.float64)
    assert P == S
    want = cm.reference_conv(x, w, P, strides, pads, dil, C)
    want = np.minimum(np.maximum(want + b.reshape((-1,) + (1,) * len(S)), 0.0), 6.0)
    out = np.empty((B, C) + P)
    buf = x.copy()
    assert dk.forward(dk.kernels(), buf, w, out, strides, pads, dil, C,
                      (buf, b, 0.0, 6.0, "clamp"))
    np.testing.assert_allclose(buf, want, rtol=1e-12, atol=1e-12)
    n = x[0, 0].size
    big = np.concatenate([x.ravel(), np.zeros(n)])
    image, final = big[:x.size].reshape(x.shape), big[n:].reshape(x.shape)
    assert not dk.forward(dk.kernels(), image, w, out, strides, pads, dil, C,
                          (final, b, 0.0, 6.0, "clamp"))
    np.testing.assert_array_equal(image, x)   # untouched
    nc.conv_forward(image, w, out, strides, pads, dil, C, nc.Workspace(),
                    (final, b, 0.0, 6.0, "clamp"))
    np.testing.assert_allclose(final, want, rtol=1e-12, atol=1e-12)


def test_conv_forward_takes_the_fused_kernel(monkeypatch):
    x, w, b, strides, pads, dil, P = _case(2, 5, (20, 24), 1, np.float32)
    calls = []
    real = dk.prepared_forward
    monkeypatch.setattr(dk, "prepared_forward",
                        lambda *a, **k: calls.append(a[-1]) or real(*a, **k))
    out, final = np.empty((2, 5) + P, np.float32), np.empty((2, 5) + P, np.float32)
    nc.conv_forward(x, w, out, strides, pads, dil, 5, nc.Workspace(),
                    (final, b, 0.0, 6.0, "clamp"))
    assert len(calls) == 1 and calls[0] is not None   # one call, with its epilogue
    want = cm.reference_conv(x.astype(np.float64), w.astype(np.float64), P, strides,
                             pads, dil, 5)
    want = np.clip(want + b.reshape(-1, 1, 1), 0.0, 6.0)
    np.testing.assert_allclose(final, want, rtol=1e-5, atol=1e-5)


def test_an_entry_refuses_arguments_of_the_wrong_type():
    """The entries take their arguments as one tuple (one conversion for ctypes); an
    argument missing or of the wrong type is a Python error, and nothing is written."""
    fns, pfns = dk.kernels(), pw.kernels()
    x, w, b, strides, pads, dil, P = _case(1, 4, (8, 8), 1, np.float32)
    out = np.zeros((1, 4) + P, np.float32)
    plan = dk._plan(fns, "forward", x.shape, w.shape, out.shape, strides, pads, dil, 4,
                    out.dtype)
    fn, geo, items = plan[2], plan[4], plan[5]
    with pytest.raises(TypeError):
        fn(((x, w, out), geo, "0", items))
    with pytest.raises(IndexError):
        fn(((x, w, out), geo, 0))
    epi = fns[plan[1], "forward_epi", out.dtype]
    with pytest.raises(TypeError):
        epi(((x, w, out, out, b), geo, 0, items, "lo", 6.0, 0))
    with pytest.raises(TypeError):
        pfns["bias_clamp", out.dtype](((out, b, out), pw.geometry((1, 4, 64))[1], 0.0,
                                       6.0, None))
    assert not out.any()
    assert fn(((x, w, out), geo, 0, items)) == 0
    want = cm.reference_conv(x.astype(np.float64), w.astype(np.float64), P, strides,
                             pads, dil, 4)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
