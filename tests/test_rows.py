"""The softmax over rows in one C pass (geon/transformers/numpy/rows.py): the
kernel against NumPy's definition (NaN, infinities, masked rows, in place, overlap,
threads), and which graphs the emitter gives it (an attention's scores, with a mask,
with PyTorch's Where(IsNaN(p), 0, p) after it) and which it leaves alone."""

import numpy as np
import pytest

import geon as be
from geon.transformers.numpy import compiled as ck
from geon.transformers.numpy import rows as sr

pytestmark = pytest.mark.skipif(not ck.available(),
                                reason="no working C compiler for the C kernels")

RTOL = {np.float32: 2e-6, np.float64: 1e-14}


def definition(x, zero_nan=False):
    x = x.astype(np.float64)
    with np.errstate(invalid="ignore"):
        e = np.exp(x - x.max(axis=1, keepdims=True))
        y = e / e.sum(axis=1, keepdims=True)
    if zero_nan:
        y[np.isnan(y)] = 0
    return y


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(1, 1), (3, 1), (5, 17), (136, 17), (7, 128),
                                   (2, 1000)])
@pytest.mark.parametrize("zero_nan", [False, True])
def test_kernel_against_the_definition(dtype, shape, zero_nan):
    rng = np.random.default_rng(shape[0] * shape[1])
    x = (4 * rng.standard_normal(shape)).astype(dtype)
    out = np.full(shape, np.nan, dtype)
    sr.softmax_rows(x, out, True, zero_nan)
    np.testing.assert_allclose(out, definition(x, zero_nan), rtol=RTOL[dtype],
                               atol=RTOL[dtype])
    assert sr.kernels() is not None


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("zero_nan", [False, True])
def test_nan_infinities_and_masked_rows(dtype, zero_nan):
    """A NaN makes its row NaN (NumPy's maximum); a row of -inf (all masked) is NaN,
    or 0 under zero_nan; -inf elements give 0; a +inf element makes the row NaN."""
    x = np.array([[0.0, np.nan, 1.0, 2.0],
                  [-np.inf] * 4,
                  [1.0, -np.inf, 3.0, -np.inf],
                  [0.0, np.inf, 1.0, 2.0],
                  [1e30, 1e30, -1e30, 0.0]], dtype)
    out = np.empty_like(x)
    sr.softmax_rows(x, out, True, zero_nan)
    want = definition(x, zero_nan)
    np.testing.assert_allclose(out, want, rtol=RTOL[dtype], atol=RTOL[dtype])
    assert np.array_equal(np.isnan(out), np.isnan(want))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("in_place", [False, True])
def test_masked_scores_and_the_edge_of_underflow(dtype, in_place):
    """Scores far below their row's maximum (an attention's masks: -1e4, the dtype's
    lowest, -inf) give exactly 0 (the kernel skips their exponentials); those whose
    exponential is subnormal (x - max between about -87 and -104 in float32, -708 and
    -745 in float64) keep it, to the subnormals' precision; a NaN or +inf row is NaN throughout, masked elements
    included."""
    low = np.finfo(dtype).min
    sub = [-90.0, -95.0, -100.0] if dtype == np.float32 else [-710.0, -730.0, -740.0]
    x = np.array([[0.0, -1e4, 1.0, low, -np.inf, 2.0] + [0.0] * 3,
                  [0.0] + sub + [-104.1, -746.5, -1e4, low, 0.5],
                  [0.0, np.nan, -1e4, low, -np.inf, 1.0, 0.0, 0.0, 0.0],
                  [0.0, np.inf, -1e4, low, -np.inf, 1.0, 0.0, 0.0, 0.0]], dtype)
    x = np.tile(x, (3, 4))   # (vectors mixing masked and plain elements)
    want = definition(x)
    out = x.copy() if in_place else np.empty_like(x)
    sr.softmax_rows(out if in_place else x, out, True)
    ok = ~np.isnan(want)
    assert np.array_equal(np.isnan(out), ~ok)
    np.testing.assert_allclose(out[ok], want[ok].astype(dtype), rtol=RTOL[dtype],
                               atol=4 * np.finfo(dtype).smallest_subnormal)
    assert np.all(out[ok][want[ok] == 0] == 0)
    tiny = out[1::4][:, 1:4]   # the subnormal exponentials, not cut to 0
    assert np.all(tiny > 0) and np.all(tiny < np.finfo(dtype).tiny * 1e2)


@pytest.mark.parametrize("direct", [True, False])
def test_in_place_overlap_and_strides(direct):
    """out may be x (in place); out overlapping x at another offset, and x read
    through strides, take NumPy's steps: the values are the same."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6, 9))
    want = definition(x)
    y = x.copy()
    sr.softmax_rows(y, y, direct)
    np.testing.assert_allclose(y, want, rtol=1e-14)
    buf = np.zeros(6 * 9 + 4)
    buf[:54] = x.ravel()
    src, dst = buf[:54].reshape(6, 9), buf[4:].reshape(6, 9)
    sr.softmax_rows(src, dst, direct)
    np.testing.assert_allclose(dst, want, rtol=1e-14)
    wide = np.zeros((6, 18))
    wide[:, ::2] = x
    out = np.empty((6, 9))
    sr.softmax_rows(wide[:, ::2], out, direct)
    np.testing.assert_allclose(out, want, rtol=1e-14)


def test_rows_split_over_threads(monkeypatch):
    from geon.transformers import fusion
    monkeypatch.setattr(sr, "PARALLEL_ELEMENTS", 1)
    monkeypatch.setattr(fusion, "MAX_THREADS", 3)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((50, 33)).astype(np.float32)
    out = np.empty_like(x)
    sr.softmax_rows(x, out)
    np.testing.assert_allclose(out, definition(x), rtol=2e-6, atol=2e-6)
    d, inv = np.empty_like(x), np.empty(50, np.float32)
    sr.layer_norm_stats(x, d, inv, 1e-5)
    want_d, want_inv = stats_definition(x, 1e-5)
    np.testing.assert_allclose(d, want_d, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(inv, want_inv, rtol=2e-5)


# (2,880 scores: the "auto" mode compiles the group of exp(x - max) from 1,024)
B, Hd, Q = be.Axis(2, "B"), be.Axis(3, "Hd"), be.Axis(12, "Q")
K, D = be.Axis(40, "K"), be.Axis(4, "D")


def attention(dtype, mask=False, nan_to_zero=False):
    """softmax(q k / sqrt(d) [+ mask]) over K, and (a graph, its feeds, the values)."""
    rng = np.random.default_rng(3)
    q = be.placeholder([B, Hd, Q, D], dtype=dtype)
    k = be.placeholder([B, Hd, K, D], dtype=dtype)
    Qv = rng.standard_normal((2, 3, 12, 4)).astype(dtype)
    Kv = rng.standard_normal((2, 3, 40, 4)).astype(dtype)
    s = be.dot(q, k, batch_axes=[B, Hd]) * be.constant(0.5, dtype=dtype)
    want = np.einsum("bhqd,bhkd->bhqk", Qv.astype(np.float64), Kv) / 2
    params, feeds = [q, k], [Qv, Kv]
    if mask:
        m = be.placeholder([B, Q, K], dtype=dtype)
        Mv = np.where(rng.random((2, 12, 40)) < 0.3, -np.inf, 0.0).astype(dtype)
        Mv[0, 1] = -np.inf   # a row masked whole: NaN, or 0 after the Where
        s = s + m
        want = want + Mv[:, None]
        params.append(m)
        feeds.append(Mv)
    p = be.softmax(s, normalization_axes=[K])
    want = definition(want.reshape(-1, 40), nan_to_zero).reshape(2, 3, 12, 40)
    if nan_to_zero:
        p = be.where(be.not_equal(p, p), 0.0, p)
    return p, params, feeds, want


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mask,nan_to_zero", [(False, False), (True, False),
                                              (True, True)])
def test_an_attentions_softmax_takes_the_pass(dtype, mask, nan_to_zero):
    p, params, feeds, want = attention(dtype, mask, nan_to_zero)
    comp = be.NumPyTransformer().computation(p, *params)
    src = comp.source
    assert src.count("_softmax_rows(") == 1, src
    assert ("_conv_ws, True)" in src) == nan_to_zero
    with np.errstate(invalid="ignore"):
        got = comp(*feeds)
    assert got.shape == (2, 3, 12, 40) and got.dtype == dtype
    np.testing.assert_allclose(got, want, rtol=RTOL[dtype] * 10, atol=RTOL[dtype] * 10)
    assert np.array_equal(np.isnan(got), np.isnan(want))


def test_graphs_left_alone():
    """A softmax written out step by step (over the last axis of a 3-d value) takes
    the pass; requesting its exponentials too, or turning the compiled path off, leaves
    the four steps (the same values)."""
    rng = np.random.default_rng(9)
    x = be.np.placeholder((4, 12, 40), dtype=np.float64)
    e = be.np.exp(x - be.np.max(x, axis=2, keepdims=True))
    y = e / be.np.sum(e, axis=2, keepdims=True)
    X = 3 * rng.standard_normal((4, 12, 40))
    want = definition(X.reshape(48, 40)).reshape(4, 12, 40)
    taken = be.NumPyTransformer().computation(y, x)
    assert taken.source.count("_softmax_rows(") == 1, taken.source
    np.testing.assert_allclose(taken(X), want, rtol=1e-14, atol=1e-15)
    e_read = be.NumPyTransformer().computation([y, e], x)   # (the exponentials too)
    assert "_softmax_rows(" not in e_read.source
    np.testing.assert_allclose(e_read(X)[0], want, rtol=1e-13)
    off = be.NumPyTransformer(compiled=False).computation(y, x)
    assert "_softmax_rows(" not in off.source
    np.testing.assert_allclose(off(X), want, rtol=1e-13)


def test_the_softmax_of_an_onnx_attention_with_a_mask():
    """The Where(IsNaN(p), 0, p) PyTorch's exporter writes after an attention's
    softmax with a mask is done by the pass; the values are PyTorch's."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnx")
    import io
    from geon.frontends.onnx import import_model

    class Attn(torch.nn.Module):
        def forward(self, q, k, v, mask):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v,
                                                                    attn_mask=mask)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 2, 16, 8, generator=g)
    k, v = (torch.randn(2, 2, 40, 8, generator=g) for _ in range(2))
    mask = torch.ones(2, 1, 16, 40, dtype=torch.bool)   # (a bool mask: the exporter
    mask[:, :, :, 30:] = False                         # writes the Where after it)
    buf = io.BytesIO()
    torch.onnx.export(Attn(), (q, k, v, mask), buf, input_names=["q", "k", "v", "m"],
                      dynamo=False)
    model = import_model(buf.getvalue())
    comp = be.NumPyTransformer().computation(model.outputs[0], *model.inputs)
    got = comp(q.numpy(), k.numpy(), v.numpy(), mask.numpy())
    want = Attn()(q, k, v, mask).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert "_conv_ws, True)" in comp.source   # (the pass with its Where)


# --- a layer norm's statistics -------------------------------------------------------

def stats_definition(x, eps):
    x = x.astype(np.float64)
    d = x - x.mean(axis=1, keepdims=True)
    return d, 1 / np.sqrt((d * d).mean(axis=1) + eps)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (34, 64), (9, 768), (2, 1000)])
@pytest.mark.parametrize("direct", [True, False])
def test_stats_kernel_against_the_definition(dtype, shape, direct):
    rng = np.random.default_rng(shape[0] + shape[1])
    x = (3 + 2 * rng.standard_normal(shape)).astype(dtype)
    d, inv = np.empty_like(x), np.empty(shape[0], dtype)
    sr.layer_norm_stats(x, d, inv, 1e-5, direct)
    want_d, want_inv = stats_definition(x, 1e-5)
    tol = 20 * RTOL[dtype]
    np.testing.assert_allclose(d, want_d, rtol=tol, atol=tol)
    np.testing.assert_allclose(inv, want_inv, rtol=tol)


@pytest.mark.parametrize("direct", [True, False])
def test_stats_in_place_overlap_and_nan(direct):
    """d may be x; d overlapping x elsewhere, and inv overlapping x, take NumPy's
    steps; a NaN makes its row's d and inv NaN."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((5, 12))
    x[2, 3] = np.nan
    want_d, want_inv = stats_definition(x, 1e-6)
    y, inv = x.copy(), np.empty(5)
    sr.layer_norm_stats(y, y, inv, 1e-6, direct)
    np.testing.assert_allclose(y, want_d, rtol=1e-13)
    np.testing.assert_allclose(inv, want_inv, rtol=1e-13)
    assert np.isnan(y[2]).all() and np.isnan(inv[2]) and not np.isnan(inv[[0, 1, 3, 4]]).any()
    buf = np.zeros(60 + 12)
    buf[:60] = x.ravel()   # (d a row after x: each row written would be read next)
    src, d = buf[:60].reshape(5, 12), buf[12:].reshape(5, 12)
    inv2 = np.empty(5)
    sr.layer_norm_stats(src, d, inv2, 1e-6, direct)
    np.testing.assert_allclose(d, want_d, rtol=1e-13)
    buf2 = np.zeros(60)
    buf2[:] = x.ravel()
    xs, d3, inv3 = buf2.reshape(5, 12), np.empty((5, 12)), buf2[30:35]
    sr.layer_norm_stats(xs, d3, inv3, 1e-6, direct)
    np.testing.assert_allclose(d3, want_d, rtol=1e-13)
    np.testing.assert_allclose(inv3, want_inv, rtol=1e-13)


def layer_norm_graph(dtype, eps=1e-5):
    """A layer norm written as the ONNX importer writes LayerNormalization (a
    reciprocal of the root), over (4, 16, 64), and its feeds and values."""
    rng = np.random.default_rng(6)
    x = be.np.placeholder((4, 16, 64), dtype=dtype)
    gamma = be.np.asarray(rng.standard_normal(64).astype(dtype))
    beta = be.np.asarray(rng.standard_normal(64).astype(dtype))
    mean = be.np.mean(x, (2,), keepdims=True)
    d = x - mean
    var = be.np.mean(d * d, (2,), keepdims=True)
    inv = 1.0 / be.np.sqrt(var + eps)
    y = d * inv * gamma + beta
    X = (1 + rng.standard_normal((4, 16, 64))).astype(dtype)
    dd, ii = stats_definition(X.reshape(-1, 64), eps)
    want = (dd * ii[:, None]).reshape(4, 16, 64) * gamma.value + beta.value
    return y, x, X, want, inv


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_layer_norm_takes_the_pass(dtype):
    y, x, X, want, _ = layer_norm_graph(dtype)
    comp = be.NumPyTransformer().computation(y, x)
    assert comp.source.count("_layer_norm_stats(") == 1, comp.source
    got = comp(X)
    np.testing.assert_allclose(got, want, rtol=RTOL[dtype] * 20, atol=RTOL[dtype] * 20)
    off = be.NumPyTransformer(compiled=False).computation(y, x)
    assert "_layer_norm_stats(" not in off.source
    np.testing.assert_allclose(off(X), want, rtol=RTOL[dtype] * 20, atol=RTOL[dtype] * 20)


def test_a_layer_norm_whose_statistics_are_read_elsewhere_is_left_alone():
    y, x, X, want, inv = layer_norm_graph(np.float64)
    comp = be.NumPyTransformer().computation([y, inv], x)   # (inv a result too)
    assert "_layer_norm_stats(" not in comp.source
    np.testing.assert_allclose(comp(X)[0], want, rtol=1e-12)


def test_an_onnx_layer_norm_against_pytorch():
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnx")
    import io
    from geon.frontends.onnx import import_model
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.LayerNorm(64)).eval()
    x = torch.randn(4, 16, 32)
    buf = io.BytesIO()
    torch.onnx.export(m, (x,), buf, input_names=["x"], dynamo=False, opset_version=17)
    model = import_model(buf.getvalue())
    comp = be.NumPyTransformer().computation(model.outputs[0], *model.inputs)
    with torch.no_grad():
        want = m(x).numpy()
    np.testing.assert_allclose(comp(x.numpy()), want, rtol=1e-5, atol=1e-5)
    assert "_layer_norm_stats(" in comp.source
