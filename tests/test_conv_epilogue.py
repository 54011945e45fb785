"""The 1 x 1 convolution kernel (geon/transformers/numpy/pointwise.py), the bias and
clamp it applies as it stores (and its pass for the other paths), and the emitter's
convolution epilogues (geon/transformers/numpy/epilogues.py): values against NumPy
definitions, NaN and signed zeros as NumPy's maximum / minimum give them, operands that
overlap the result, calls split over threads, and which graphs take the epilogue."""

import io
import math
import warnings

import numpy as np
import pytest

import geon as be
from geon.transformers.numpy import c_pool
from geon.transformers.numpy import compiled as ck
from geon.transformers.numpy import conv as nc
from geon.transformers.numpy import pointwise as pw

pytestmark = pytest.mark.skipif(not ck.available(),
                                reason="no working C compiler for the C kernels")

RTOL = {np.float32: 1e-5, np.float64: 1e-12}


@pytest.fixture
def any_weight(monkeypatch):
    """The kernel for weights of any size (small test shapes)."""
    monkeypatch.setattr(pw, "MIN_WEIGHT_BYTES", 0)
    return pw.kernels()


def _operands(B, C, K, S, dtype, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((B, C) + S).astype(dtype)
    w = rng.standard_normal((K, C) + (1,) * len(S)).astype(dtype)
    b = rng.standard_normal(K).astype(dtype)
    return x, w, b


def _reference(x, w, b=None, lo=-np.inf, hi=np.inf):
    """In float64: the convolution, then NumPy's add, maximum and minimum."""
    y = np.einsum("kc,bc...->bk...", w.reshape(w.shape[:2]).astype(np.float64),
                  x.astype(np.float64))
    if b is not None:
        y = y + b.astype(np.float64).reshape((-1,) + (1,) * (x.ndim - 2))
    return np.minimum(np.maximum(y, lo), hi)


def _close(got, want, dtype):
    scale = np.max(np.abs(want)) or 1.0
    np.testing.assert_allclose(got, want, rtol=RTOL[dtype], atol=RTOL[dtype] * scale)


# columns B * P from 1 to 35 (each of the kernel's 2, 4, 8 and 16 columns at a time;
# past 16, which conv1x1 still computes past MAX_COLUMNS, blocks of columns one after
# another), channels C that are and are not whole vectors (16 float32, 8 float64), rows
# K that are and are not whole blocks of 8, 4, 2 and 1, and C long enough to go in
# pieces (more than 40 KB of packed columns; the last piece partial, with a tail)
SHAPES = [(1, 7, 13, (1, 1)), (2, 5, 12, (2, 1)), (1, 9, 25, (3, 2)), (2, 16, 40, (2, 2)),
          (3, 4, 7, (5,)), (1, 33, 6, (4, 4)), (2, 3, 50, (2, 2, 2)), (1, 1, 5, (1,)),
          (2, 17, 9, (3, 3)), (1, 40, 3, (5, 7)), (2, 64, 11, (2,)), (2, 700, 5, (3, 3)),
          (2, 1400, 3, (2, 2))]
# the wide form (images of 32 float32 or 16 float64 positions or more, C <= 256): whole
# blocks of 4 vectors of positions and a partial last one, rows K that are and are not
# whole blocks of 6 and 12, C past 128 (blocks of 2 vectors), C past 256 (the dot
# products again, 80 columns)
WIDE = [(2, 5, 13, (4, 8)), (1, 3, 7, (33,)), (2, 20, 30, (6, 11)), (1, 200, 9, (5, 7)),
        (2, 130, 8, (16,)), (1, 1, 12, (64,)), (2, 300, 4, (40,))]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", SHAPES + WIDE, ids=str)
def test_kernel_matches_the_definition(shape, dtype, any_weight):
    B, C, K, S = shape
    x, w, b = _operands(B, C, K, S, dtype)
    P = math.prod(S)
    assert pw.usable(x, w, np.empty((B, K) + S, dtype)) == (B * P <= pw.MAX_COLUMNS)
    assert pw.usable(x, w, np.empty((B, K) + S, dtype), wide=True) == \
        (B * P <= pw.MAX_COLUMNS or (C <= 256 and P * np.dtype(dtype).itemsize >= 128))
    out = np.full((B, K) + S, np.nan, dtype)
    assert pw.conv1x1(any_weight, x, w, out)
    _close(out, _reference(x, w), dtype)
    assert pw.conv1x1(any_weight, x, w, out, b, -0.25, 0.75)
    _close(out, _reference(x, w, b, -0.25, 0.75), dtype)
    v = _reference(x, w, b)
    for act, want in (("silu", v / (1 + np.exp(-v))), ("sigmoid", 1 / (1 + np.exp(-v)))):
        assert pw.conv1x1(any_weight, x, w, out, b, act=act)
        _close(out, want, dtype)
        again = np.empty_like(out)
        pw.bias_clamp(any_weight, (v - b.reshape((-1,) + (1,) * len(S))).astype(dtype),
                      b, 0.0, 0.0, again, act)
        _close(again, want, dtype)
        pw.bias_clamp(None, (v - b.reshape((-1,) + (1,) * len(S))).astype(dtype),
                      b, 0.0, 0.0, again, act)
        _close(again, want, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", [(2, 6, 9, (2, 2), (3, 3), (1, 1)),
                                  (1, 5, 14, (5, 4), (3, 3), (2, 2)),
                                  (2, 4, 7, (3,), (3,), (1,))], ids=str)
def test_im2col_products_with_few_columns(case, dtype, any_weight, monkeypatch):
    """A convolution whose im2col product has few columns (a late stage's 3 x 3
    layers) runs it by the kernel, the columns as one image's: the definition's values,
    and the kernel was called."""
    from geon.op_graph import conv_math as cm
    B, C, K, S, R, st = case
    pads = tuple((1, 1) for _ in S)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((B, C) + S).astype(dtype)
    w = rng.standard_normal((K, C) + R).astype(dtype)
    P = tuple(cm.out_length(n, r, s, 1, lo, hi)
              for n, r, s, (lo, hi) in zip(S, R, st, pads))
    calls = []
    real = pw.conv1x1
    monkeypatch.setattr(pw, "conv1x1", lambda *a, **k: calls.append(1) or real(*a, **k))
    out = np.full((B, K) + P, np.nan, dtype)
    nc.conv_forward(x, w, out, st, pads, (1,) * len(S), 1)
    assert calls
    want = cm.reference_conv(x.astype(np.float64), w.astype(np.float64), P, st, pads,
                             (1,) * len(S), 1)
    _close(out, want, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_nan_and_signed_zero_as_numpy_gives_them(dtype, any_weight):
    """A NaN in x makes its column NaN (0 * NaN), and it stays NaN through both bounds;
    maximum(-0.0, 0.0) is +0.0 (NumPy gives the second of equal operands); a NaN bound
    makes every value NaN."""
    x, w, b = _operands(1, 3, 5, (4,), dtype, seed=2)
    x[0, 1, 2] = np.nan
    out = np.empty((1, 5, 4), dtype)
    assert pw.conv1x1(any_weight, x, w, out, b, 0.0, 6.0)
    want = _reference(x, w, b, 0.0, 6.0)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(want))
    assert np.isnan(out[0, :, 2]).all()
    _close(np.nan_to_num(out), np.nan_to_num(want), dtype)
    y = np.full((1, 2, 3), -0.0, dtype)
    zero = np.full(2, -0.0, dtype)
    got = np.empty_like(y)
    pw.bias_clamp(any_weight, y, zero, 0.0, 6.0, got)
    ref = np.minimum(np.maximum(y + zero[:, None], dtype(0)), dtype(6))
    np.testing.assert_array_equal(np.signbit(got), np.signbit(ref))
    assert not np.signbit(got).any()
    pw.bias_clamp(any_weight, y, zero, -np.inf, -0.0, got)   # minimum(-0.0, -0.0)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(np.minimum(y, dtype(-0.0))))
    pw.bias_clamp(any_weight, out, b, np.nan, 6.0, out)
    assert np.isnan(out).all()


#: Values whose clamp NumPy decides by a rule: NaNs of both signs, signed zeros, the
#: bounds themselves, infinities, subnormals.
EDGES = [-0.0, 0.0, 6.0, -6.0, np.nan, -np.nan, np.inf, -np.inf, 1e-45, -1e-45, 3.0,
         7.0, -1.0]
#: Bounds: ReLU6, ReLU with -0.0, equal zeros of both signs, none, a NaN bound on
#: either side (the C's two-sided form), bounds the wrong way round.
BOUNDS = [(0.0, 6.0), (-0.0, 6.0), (0.0, -0.0), (-0.0, 0.0), (-np.inf, np.inf),
          (np.nan, 6.0), (0.0, np.nan), (6.0, 0.0)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("bounds", BOUNDS, ids=str)
def test_clamp_bits_are_numpys(bounds, dtype, any_weight):
    """The clamp of the bias pass, of the 1 x 1 kernel and of the direct kernels'
    epilogue gives NumPy's minimum(maximum(v + bias, lo), hi) bit for bit (the NaN's
    payload and sign, the zero's sign), through their fast form for bounds that are
    not NaN and their two-sided form for a NaN bound."""
    from geon.transformers.numpy import conv_kernels as dk
    lo, hi = bounds
    bits = np.uint32 if dtype == np.float32 else np.uint64
    v = np.array(EDGES, dtype)
    y = np.stack([v, v[::-1]])[None]                        # (1, 2, 13)
    b = np.array([0.0, -0.0], dtype)
    want = np.minimum(np.maximum(y + b[:, None], dtype(lo)), dtype(hi))
    got = np.empty_like(y)
    pw.bias_clamp(any_weight, y, b, lo, hi, got)
    np.testing.assert_array_equal(got.view(bits), want.view(bits))
    # the 1 x 1 kernel and the depthwise kernels: NumPy's clamp of their own sums
    x = y.copy()
    eye = np.eye(2, dtype=dtype)[:, :, None]
    sums, got = np.empty_like(y), np.empty_like(y)
    assert pw.conv1x1(any_weight, x, eye, sums)
    assert pw.conv1x1(any_weight, x, eye, got, b, lo, hi)
    want = np.minimum(np.maximum(sums + b[:, None], dtype(lo)), dtype(hi))
    np.testing.assert_array_equal(got.view(bits), want.view(bits))
    one = np.ones((2, 1, 1), dtype)
    args = ((1,), ((0, 0),), (1,), 2)
    fns = dk.kernels()
    assert dk.forward(fns, x, one, sums, *args)
    assert dk.forward(fns, x, one, np.empty_like(y), *args, (got, b, lo, hi, "clamp"))
    want = np.minimum(np.maximum(sums + b[:, None], dtype(lo)), dtype(hi))
    np.testing.assert_array_equal(got.view(bits), want.view(bits))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_split_over_threads(dtype, any_weight):
    """Blocks of rows on geon's threads give the same values as one call."""
    x, w, b = _operands(2, 24, 100, (2, 2), dtype, seed=3)
    one = np.empty((2, 100, 2, 2), dtype)
    assert pw.conv1x1(any_weight, x, w, one, b, 0.0, np.inf)
    split = np.empty_like(one)
    with c_pool.forced(3):
        assert pw.conv1x1(any_weight, x, w, split, b, 0.0, np.inf)
    np.testing.assert_array_equal(split, one)


def test_a_result_overlapping_an_operand(any_weight):
    """The kernel writes over x only where one call packs all of x before its first
    store (a layer whose input dies at it), never over w or the bias; a call over its
    x is never cut into blocks for geon's threads (a block's stores would reach rows of
    x another has yet to read). The right values either way."""
    x, w, b = _operands(2, 8, 8, (2, 2), np.float64)
    want = _reference(x, w, b, 0.0, np.inf)
    xs = x.copy()
    assert pw.conv1x1(any_weight, xs, w, xs, b, 0.0, np.inf)   # x packed first
    _close(xs, want, np.float64)
    x3, w3, b3 = _operands(2, 8, 8, (3, 3), np.float64, seed=3)   # 18 columns: two
    xs = x3.copy()                                                # blocks, refused
    assert not pw.conv1x1(any_weight, xs, w3, xs, b3, 0.0, np.inf)
    np.testing.assert_array_equal(xs, x3)
    ws = w.reshape(8, 8).copy()
    out = ws.reshape(2, 8, 2, 2)                                  # over the weight
    assert not pw.conv1x1(any_weight, x, ws.reshape(8, 8, 1, 1), out, b, 0.0, np.inf)
    np.testing.assert_array_equal(ws, w.reshape(8, 8))
    x2, w2, b2 = _operands(2, 30, 30, (2, 2), np.float64, seed=5)
    want2 = _reference(x2, w2, b2, 0.0, np.inf)
    xs = x2.copy()
    with c_pool.forced(2):
        assert pw.conv1x1(any_weight, xs, w2, xs, b2, 0.0, np.inf)
    _close(xs, want2, np.float64)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_wide_form_over_its_input(dtype, any_weight):
    """The wide form computes a result laid over its input (the plan gives an
    expansion's result the memory of the input that dies at it) from a copy of the
    input, in one call or in blocks of rows on geon's threads, with one call's
    values."""
    x, w, b = _operands(2, 6, 30, (40,), dtype, seed=4)
    want = _reference(x, w, b, 0.0, 6.0)
    room = np.empty(2 * 30 * 40, dtype)
    xs = room[:x.size].reshape(x.shape)
    xs[...] = x
    out = room.reshape(2, 30, 40)
    assert pw.conv1x1(any_weight, xs, w, out, b, 0.0, 6.0)
    _close(out, want, dtype)
    one = out.copy()
    xs[...] = x
    with c_pool.forced(2):
        assert pw.conv1x1(any_weight, xs, w, out, b, 0.0, 6.0)
    np.testing.assert_array_equal(out, one)
    split = np.empty_like(one)
    with c_pool.forced(2):
        assert pw.conv1x1(any_weight, x, w, split, b, 0.0, 6.0)
    np.testing.assert_array_equal(split, one)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", [((2, 3, 20, 26), (8, 3, 3, 3), (2, 2), 1),
                                  ((1, 3, 19, 19), (13, 3, 7, 7), (2, 2), 3),
                                  ((2, 4, 9, 40), (30, 4, 3, 3), (1, 1), 1)], ids=str)
def test_a_stem_by_the_wide_form_over_its_columns(case, dtype, monkeypatch):
    """A convolution with few elements a window (a stem's 3 channels by 3 x 3 or 7 x 7
    taps) over many positions runs as the im2col copy and the wide form over it, with
    its epilogue or without: the definition's values, in out's layout."""
    from geon.op_graph import conv_math as cm
    xs, ws_, st, p = case
    rng = np.random.default_rng(2)
    x = rng.standard_normal(xs).astype(dtype)
    w = rng.standard_normal(ws_).astype(dtype)
    b = rng.standard_normal(ws_[0]).astype(dtype)
    pads = ((p, p), (p, p))
    P = tuple(cm.out_length(n, ws_[2], s, 1, p, p) for n, s in zip(xs[2:], st))
    calls = []
    real = pw.prepared_conv1x1
    monkeypatch.setattr(pw, "prepared_conv1x1",
                        lambda *a, **k: calls.append(k.get("columns")) or real(*a, **k))
    want = cm.reference_conv(x.astype(np.float64), w.astype(np.float64), P, st, pads,
                             (1, 1), 1)
    out = np.full((xs[0], ws_[0]) + P, np.nan, dtype)
    nc.conv_forward(x, w, out, st, pads, (1, 1), 1, nc.Workspace())
    _close(out, want, dtype)
    v = want + b.astype(np.float64)[:, None, None]
    for act, lo, hi, f in (("clamp", 0.0, 6.0, np.minimum(np.maximum(v, 0.0), 6.0)),
                           ("silu", 0.0, 0.0, v / (1 + np.exp(-v)))):
        final = np.full_like(out, np.nan)
        nc.conv_forward(x, w, out, st, pads, (1, 1), 1, nc.Workspace(),
                        (final, b, lo, hi, act))
        _close(final, f, dtype)
    assert calls == [True] * 3


def test_a_bias_in_the_results_memory(any_weight):
    """A computed bias can share its arena with the chain's result (it dies at the Add):
    the pass declines it (NumPy's add runs), and so does the kernel."""
    rng = np.random.default_rng(0)
    y = rng.standard_normal((1, 64, 5, 5))
    arena = np.empty(y.size)
    bias = arena[:64]
    bias[:] = rng.standard_normal(64)
    want = y + bias.copy()[:, None, None]
    out = arena.reshape(y.shape)
    pw.bias_clamp(any_weight, y, bias, -np.inf, np.inf, out)
    np.testing.assert_array_equal(out, want)


def test_a_computed_bias_under_the_in_order_plan(monkeypatch):
    """Conv + computed bias + SiLU, unfused, under the in-order memory plan (a large
    graph's): the plan gives the bias's arena to the sigmoid, which the epilogue writes
    at the convolution's step; the values are still the NumPy path's."""
    from geon.transformers import memory
    monkeypatch.setattr(memory, "BY_SIZE_LIMIT", 0)
    K, C, S = 64, 4, 5
    rng = np.random.default_rng(0)
    x0 = be.np.placeholder((1, K, S, S), dtype=np.float64)
    m = be.np.placeholder((K, K), dtype=np.float64)
    x = be.np.placeholder((1, C, S, S), dtype=np.float64)
    w = be.np.variable(rng.standard_normal((K, C, 3, 3)))
    bias = be.np.matmul(m, be.np.sum(x0 * 2.0, axis=(0, 2, 3)))
    v = be.np.reshape(bias, (K, 1, 1)) + be.np.conv(x, w, padding=1)
    z = (be.sigmoid(v) * v) * 1.5
    feeds = [rng.standard_normal(p.axes.lengths) for p in (x0, m, x)]
    comp = be.NumPyTransformer(disable=["fusion"]).computation(z, x0, m, x)
    assert "done by the convolution above" in comp.source
    want = be.NumPyTransformer(compiled=False).computation(z, x0, m, x)(*feeds)
    _close(comp(*feeds), want, np.float64)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_bias_clamp_pass(dtype, any_weight):
    """The epilogue as a pass: in C, in place too, and in NumPy where the arrays are
    not contiguous or overlap only in part; the same values each way."""
    rng = np.random.default_rng(4)
    y = rng.standard_normal((2, 5, 3, 4)).astype(dtype)
    b = rng.standard_normal(5).astype(dtype)
    want = np.minimum(np.maximum(y + b[:, None, None], dtype(-0.5)), dtype(0.5))
    out = np.empty_like(y)
    pw.bias_clamp(any_weight, y, b, -0.5, 0.5, out)
    np.testing.assert_array_equal(out, want)
    inplace = y.copy()
    pw.bias_clamp(any_weight, inplace, b, -0.5, 0.5, inplace)
    np.testing.assert_array_equal(inplace, want)
    pw.bias_clamp(None, y, b, -0.5, 0.5, out)          # NumPy only
    np.testing.assert_array_equal(out, want)
    strided = np.repeat(b, 2)[::2]
    pw.bias_clamp(any_weight, y, strided, -0.5, 0.5, out)
    np.testing.assert_array_equal(out, want)
    buf = np.zeros(y.size + 4, dtype)
    buf[4:] = y.ravel()
    shifted = buf[:y.size].reshape(y.shape)             # overlaps the input in part
    pw.bias_clamp(any_weight, buf[4:].reshape(y.shape), b, -0.5, 0.5, shifted)
    np.testing.assert_array_equal(shifted, want)


def _layer(shape, K, dtype, chain):
    """x -> 1 x 1 conv -> the ops ``chain`` names; (result, params, feeds)."""
    B, C = shape[:2]
    x = be.np.placeholder(shape, dtype=dtype)
    w = be.np.placeholder((K, C, 1, 1), dtype=dtype)
    b = be.np.placeholder((K,), dtype=dtype)
    y = be.np.conv(x, w)
    z = y + be.np.reshape(b, (K, 1, 1)) if "bias" in chain else y
    if "relu" in chain:
        z = be.np.maximum(z, 0.0)
    if "six" in chain:
        z = be.np.minimum(z, 6.0)
    if "min-max" in chain:
        z = be.np.maximum(be.np.minimum(z, 1.0), -1.0)
    sig = None
    if "silu" in chain:
        sig = be.sigmoid(z)
        z = z * sig
    if "sigmoid" in chain:
        z = be.sigmoid(z)
    rng = np.random.default_rng(5)
    feeds = (rng.standard_normal(shape).astype(dtype) * 3,
             rng.standard_normal((K, C, 1, 1)).astype(dtype),
             rng.standard_normal(K).astype(dtype))
    return (y, z, sig), (x, w, b), feeds


@pytest.mark.parametrize("big", [False, True], ids=["pass", "kernel"])
@pytest.mark.parametrize("chain", [("bias",), ("bias", "relu"), ("bias", "relu", "six"),
                                   ("bias", "six"), ("bias", "silu"),
                                   ("bias", "sigmoid")], ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_graphs_take_the_epilogue(chain, dtype, big, monkeypatch):
    """conv + bias [+ maximum] [+ minimum], conv + bias + SiLU (x * sigmoid(x)) and
    conv + bias + sigmoid are one line of the generated code, with the values of the
    NumPy-only transformer; by the kernel (any weight) or by the pass after the BLAS
    (no weight qualifies), except a bias alone after the BLAS (np.add is as fast)."""
    monkeypatch.setattr(pw, "MIN_WEIGHT_BYTES", 0 if big else 1 << 60)
    (_, z, _), params, feeds = _layer((2, 6, 2, 2), 30, dtype, chain)
    comp = be.NumPyTransformer().computation(z, *params)
    fused = big or chain != ("bias",)
    assert ("done by the convolution above" in comp.source) == fused
    if fused:
        assert "np.add" not in comp.source and "# compiled:" not in comp.source
    want = be.NumPyTransformer(compiled=False).computation(z, *params)(*feeds)
    _close(comp(*feeds), want, dtype)
    _close(comp(*feeds), want, dtype)   # a second call: the same buffers again


@pytest.mark.parametrize("act", ["silu", "sigmoid"])
def test_one_by_one_planes(act):
    """A squeeze-excitation layer: a conv on 1 x 1 planes, whose bias is broadcast from
    (K, 1, 1) (the import keeps it so), then SiLU or a sigmoid: an epilogue too."""
    rng = np.random.default_rng(8)
    x = be.np.placeholder((2, 12, 1, 1), dtype=np.float64)
    w = be.np.variable(rng.standard_normal((5, 12, 1, 1)))
    b = be.np.variable(rng.standard_normal((5, 1, 1)))
    v = be.np.conv(x, w) + b
    z = v * be.sigmoid(v) if act == "silu" else be.sigmoid(v)
    comp = be.NumPyTransformer().computation(z, x)
    assert "done by the convolution above" in comp.source
    xv = rng.standard_normal((2, 12, 1, 1))
    want = be.NumPyTransformer(compiled=False).computation(z, x)(xv)
    _close(comp(xv), want, np.float64)


def test_layers_in_a_row_read_through_reshapes(monkeypatch):
    """conv + bias + ReLU, a reshape to the same shape (as an import's cast of axes
    makes), then another conv + bias: both take the epilogue, and the second reads the
    first's result through the reshape (which the first's chain must leave alone)."""
    monkeypatch.setattr(pw, "MIN_WEIGHT_BYTES", 0)
    rng = np.random.default_rng(7)
    x = be.np.placeholder((2, 6, 2, 2), dtype=np.float32)
    w1, w2, b1, b2 = (be.np.variable(rng.standard_normal(s).astype(np.float32))
                      for s in ((10, 6, 1, 1), (4, 10, 1, 1), (10,), (4,)))
    h = be.np.maximum(be.np.conv(x, w1) + be.np.reshape(b1, (10, 1, 1)), 0.0)
    z = be.np.conv(be.np.reshape(h, (2, 10, 2, 2)), w2) + be.np.reshape(b2, (4, 1, 1))
    comp = be.NumPyTransformer().computation(z, x)
    assert comp.source.count("done by the convolution above") == 2
    xv = rng.standard_normal((2, 6, 2, 2)).astype(np.float32)
    want = be.NumPyTransformer(compiled=False).computation(z, x)(xv)
    _close(comp(xv), want, np.float32)


@pytest.mark.parametrize("case", ["conv is a result", "no bias", "clamp first",
                                  "compiled off", "sigmoid read elsewhere"])
def test_graphs_left_alone(case):
    """No epilogue where the convolution's value is wanted itself, where the first op
    after it is not a bias add, where a clamp comes first, where a SiLU's sigmoid is
    wanted too, or without C; the values are right in each case."""
    chain = {"no bias": ("relu",), "clamp first": ("bias", "min-max"),
             "sigmoid read elsewhere": ("bias", "silu")}.get(case, ("bias", "relu"))
    (y, z, sig), params, feeds = _layer((2, 6, 3, 3), 12, np.float64, chain)
    outs = {"conv is a result": [y, z], "sigmoid read elsewhere": [z, sig]}.get(case, [z])
    comp = be.NumPyTransformer(compiled=case != "compiled off").computation(outs, *params)
    got = comp(*feeds)
    want = be.NumPyTransformer(compiled=False).computation(outs, *params)(*feeds)
    assert "done by the convolution" not in comp.source
    for g, v in zip(got, want):
        _close(g, v, np.float64)


def test_onnx_layers_take_the_epilogue():
    """An exported Conv + BatchNorm + ReLU6 block (the BatchNorm folded into a bias by
    the exporter) and a Conv + bias + ReLU one run as epilogues, with PyTorch's values."""
    torch = pytest.importorskip("torch", reason="PyTorch exports the layers")
    pytest.importorskip("onnx", reason="the ONNX import reads the export")
    from geon.frontends.onnx import import_model
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(8, 16, 1, bias=False), torch.nn.BatchNorm2d(16),
        torch.nn.ReLU6(), torch.nn.Conv2d(16, 4, 3, padding=1), torch.nn.ReLU()).eval()
    with torch.no_grad():
        model[1].running_mean.uniform_(-1, 1)
        model[1].bias.uniform_(-1, 1)
    x = torch.randn(2, 8, 5, 5)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # (the TorchScript exporter's deprecation)
        torch.onnx.export(model, (x,), buf, input_names=["x"], dynamo=False)
    g = import_model(buf.getvalue())
    comp = be.NumPyTransformer().computation(g.outputs[0], *g.inputs)
    assert comp.source.count("done by the convolution above") == 2
    got = comp(x.numpy())
    want = model(x).detach().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
