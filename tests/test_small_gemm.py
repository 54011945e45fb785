"""The products of a transformer layer's size in C (geon/transformers/numpy/small_gemm.py):
the kernel against float64 products (every shape of tail, strides, transposed and
broadcast operands, alignments, batches), its refusals, which products :func:`step`
takes, and the segments' lines that reach it."""

import threading

import numpy as np
import pytest

import geon as be
from geon.transformers.numpy import compiled as ck
from geon.transformers.numpy import segments
from geon.transformers.numpy import small_gemm as sg

pytestmark = pytest.mark.skipif(not ck.available(),
                                reason="no working C compiler for the C kernels")

# float32: sums of up to a few hundred terms of order 1, one rounding each
TOL = {np.float32: 2e-5, np.float64: 1e-13}


def run(a, b, out):
    """The entry on (a, b, out): its status; fails where step() declines."""
    steps = sg.step(a, b, out)
    assert steps is not None, (a.shape, a.strides, b.shape, b.strides)
    (fn, args, keep), = steps
    assert segments.is_entry(fn) and keep is None
    return fn(args)


def check(a, b, dtype):
    out = np.full(np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
                  + (a.shape[-2], b.shape[-1]), np.nan, dtype)
    assert run(a, b, out) == 0
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    scale = np.matmul(np.abs(a).astype(np.float64), np.abs(b).astype(np.float64)) + 1
    assert np.all(np.abs(out - want) <= TOL[dtype] * scale)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("m,k,n", [(8, 1, 1), (9, 3, 7), (16, 5, 33), (17, 100, 31),
                                   (64, 128, 512), (63, 33, 47), (40, 7, 64),
                                   (24, 300, 100), (8, 0, 5), (33, 16, 257)])
def test_plain_transposed_and_strided_operands(dtype, m, k, n):
    """Row tails (m not a multiple of MR), column tails (n not a multiple of two
    vectors), K = 0 (zeros), b transposed (W.T) or with every other column, a in
    Fortran order."""
    rng = np.random.default_rng(m * 1000 + k * 10 + n)
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    wide = np.repeat(b, 2, axis=1)[:, ::2]
    for bb in (b, np.asfortranarray(b), wide):
        for aa in (a, np.asfortranarray(a)):
            check(aa, bb, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shift", range(9))
def test_every_alignment_of_the_right_operand(dtype, shift):
    """b's first element at every offset from a 64-byte boundary, rows of whole
    cache lines (a first panel up to the boundary is read from a copy) and not."""
    rng = np.random.default_rng(shift)
    item = np.dtype(dtype).itemsize
    for m, k, n in [(16, 20, 64 * 8 // item * 2), (9, 7, 48), (24, 5, 80 * 8 // item)]:
        buf = np.empty(k * n + 64, dtype)
        start = (-buf.ctypes.data % 64) // item + shift
        b = buf[start:start + k * n].reshape(k, n)
        b[...] = rng.standard_normal((k, n))
        check(rng.standard_normal((m, k)).astype(dtype), b, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_batches_and_broadcast_operands(dtype):
    """3-D operands: one product per batch index, a or b broadcast from one matrix
    (a stride 0), batches of transposed b (an attention's K.T)."""
    rng = np.random.default_rng(3)
    for t, m, k, n in [(4, 32, 64, 32), (12, 17, 32, 17), (2, 9, 5, 40), (5, 20, 7, 70)]:
        a = rng.standard_normal((t, m, k)).astype(dtype)
        b = rng.standard_normal((t, k, n)).astype(dtype)
        kt = np.ascontiguousarray(b.transpose(0, 2, 1)).transpose(0, 2, 1)
        for aa, bb in [(a, b), (a, kt), (a[:1], b), (a, b[0]), (a, b[:1]),
                       (np.ascontiguousarray(a.transpose(1, 0, 2)).transpose(1, 0, 2), b)]:
            check(aa, bb, dtype)


def test_batches_of_several_dimensions():
    """(B, H, M, K) @ (B, H, K, N), an attention's heads: the batch dimensions as one
    where views allow; a broadcast across a dimension that cannot merge with the next
    (a copy) is NumPy's."""
    rng = np.random.default_rng(4)
    a = rng.standard_normal((2, 4, 17, 16)).astype(np.float32)
    b = rng.standard_normal((2, 4, 16, 17)).astype(np.float32)
    check(a, b, np.float32)
    check(a, np.ascontiguousarray(b.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2),
          np.float32)
    check(a[:, :1], b[:, :1], np.float32)   # ((2, 1) batches: one dimension)
    assert sg.step(a, b[:, :1], np.empty((2, 4, 17, 17), np.float32)) is None
    assert sg.step(a[:1], b, np.empty((2, 4, 17, 17), np.float32)) is None


def test_refusals_write_nothing():
    """Overlap of the output with an operand, and arrays whose shapes no longer
    chain, are refused (1) with the output untouched; a read-only output raises."""
    x = np.arange(4 * 8 * 8, dtype=np.float32).reshape(4, 8, 8)
    before = x.copy()
    (fn, args, _), = sg.step(x, np.ones((4, 8, 8), np.float32), x)
    assert fn(args) == 1 and np.array_equal(x, before)
    a, b = np.ones((16, 8), np.float32), np.ones((8, 32), np.float32)
    out = np.zeros((16, 32), np.float32)
    (fn, _, _), = sg.step(a, b, out)
    assert fn(((a, np.ones((9, 32), np.float32), out),)) == 1 and not out.any()
    assert fn(((a, b, np.zeros((16, 32), np.float32)[:, ::-1]),)) == 1
    with pytest.raises(ValueError, match="read-only"):
        fn(((a, b, np.broadcast_to(out, out.shape)),))
    # a bias whose first element is outside c but the rest inside: refused
    buf = np.zeros(16 * 32 + 32, np.float32)
    c = buf[32:].reshape(16, 32)
    assert fn(((a, b, c, buf[31:63]),)) == 1 and not buf.any()
    assert fn(((a, b, c, buf[:32]),)) == 0 and np.all(c == 8)


def test_which_products_step_takes():
    f32 = np.float32
    take = (np.ones((64, 32), f32), np.ones((32, 48), f32), np.empty((64, 48), f32))
    assert sg.step(*take) is not None
    assert sg.step(np.ones((4, 32), f32), take[1], np.empty((4, 48), f32)) is None
    assert sg.step(*(t.astype(np.float16) for t in take[:2]),
                   np.empty((64, 48), np.float16)) is None
    assert sg.step(take[0], take[1].astype(np.float64), take[2]) is None
    assert sg.step(*(t.astype(np.int64) for t in take[:2]),
                   np.empty((64, 48), np.int64)) is None
    big = int(np.sqrt(sg.MAX_WORK)) + 64   # (a product a BLAS may thread)
    assert sg.step(np.ones((big, big), f32), np.ones((big, 8), f32),
                   np.empty((big, 8), f32)) is None
    w = np.ones((48, 32), f32)   # (W.T: its panels transposed as they are copied)
    assert sg.step(np.ones((8, 32), f32), w.T, np.empty((8, 48), f32)) is not None


def test_threads_each_have_their_scratch():
    """Products on two threads at once (each thread keeps its own scratch)."""
    rng = np.random.default_rng(5)
    jobs = [(rng.standard_normal((32, 300)).astype(np.float32),
             np.asfortranarray(rng.standard_normal((300, 70)).astype(np.float32)))
            for _ in range(2)]
    outs = [np.empty((32, 70), np.float32) for _ in jobs]
    errors = []

    def work(j):
        try:
            for _ in range(200):
                assert run(*jobs[j], outs[j]) == 0
        except Exception as e:   # (reported below)
            errors.append(e)

    threads = [threading.Thread(target=work, args=(j,)) for j in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for (a, b), out in zip(jobs, outs):
        np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-4)


def test_a_segments_product_runs_the_entry(monkeypatch):
    """Two linear layers in a segment: their ``np.matmul`` lines are the entry's
    steps, and the values match the computation without segments."""
    x = be.np.placeholder((64, 40), dtype=np.float32)
    w = be.np.constant(np.random.default_rng(0).standard_normal((40, 48))
                       .astype(np.float32))
    w2 = be.np.constant(np.random.default_rng(2).standard_normal((48, 32))
                        .astype(np.float32).T.copy().T)   # (W.T: read through copies)
    h = be.np.tanh(be.np.matmul(be.np.tanh(x), w) + 1.0)
    y = be.np.tanh(be.np.matmul(h, w2))
    xv = np.random.default_rng(1).standard_normal((64, 40)).astype(np.float32)
    called = []
    real = sg.step

    def spy(a, b, out):
        steps = real(a, b, out)
        called.append(steps is not None)
        return steps

    monkeypatch.setattr(sg, "step", spy)
    with_segments = be.NumPyTransformer().computation(y, x)
    got = with_segments(xv)
    monkeypatch.setattr(segments, "ENABLED", False)
    want = be.NumPyTransformer().computation(y, x)(xv)
    assert "_Segment((" in with_segments.source and called == [True, True]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_a_bias_added_in_place_joins_its_product(monkeypatch):
    """``np.matmul(a, w, out=c)`` then ``np.add(c, bias, c)`` in a segment: one step
    of the entry with the bias (the same values, bit for bit, as the two lines); where
    that step refuses, both lines run as NumPy."""
    rng = np.random.default_rng(6)
    a = rng.standard_normal((24, 40)).astype(np.float32)
    w = rng.standard_normal((40, 72)).astype(np.float32)
    bias = rng.standard_normal(72).astype(np.float32)
    c = np.empty((24, 72), np.float32)
    lines = [lambda: np.matmul(a, w, out=c), lambda: np.add(c, bias, c),
             lambda: np.multiply(c, 2.0, c)]
    makers = [lambda: segments.np_step(np.matmul, (a, w), out=c),
              lambda: segments.np_step(np.add, (c, bias, c)),
              lambda: segments.np_step(np.multiply, (c, np.float32(2.0), c))]
    seg = segments.Segment(lines, makers)
    seg()
    assert [first_last for first_last, _ in seg.owner] == [(0, 1), (2, 2)]
    want = (a @ w + bias) * 2
    np.testing.assert_allclose(c, want, rtol=1e-5, atol=1e-5)
    (fn, _, _), = sg.step(a, w, c)
    apart = np.empty_like(c)
    assert fn(((a, w, apart),)) == 0
    assert np.array_equal(c, (apart + bias) * np.float32(2))   # (the two steps' bits)
    # refused (the bias now overlaps c): both lines run as NumPy, then the third
    run_, n, table, items = seg.call
    assert all(x is y for x, y in zip(items[0][0], (a, w, c)))
    seg.call = (run_, n, table, (((a, w, c, c[0]),),) + items[1:])
    c[...] = 0
    seg()
    np.testing.assert_allclose(c, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_patch_entry(dtype):
    """A convolution whose windows tile the image (a ViT's patch embedding) in one
    call: against the definition; sizes that do not match and an output over the
    image are refused with nothing written."""
    rng = np.random.default_rng(8)
    fn = sg.patches_entry(dtype)
    # (few patches of many elements; many patches of few, more than each has: the
    # scratch holds rows (N, L) and the product (K, N))
    for B, C, P, R, Q, S, K in [(2, 3, 3, 4, 2, 5, 9), (2, 1, 24, 2, 20, 2, 40)]:
        x = rng.standard_normal((B, C, P * R, Q * S)).astype(dtype)
        w = rng.standard_normal((K, C, R, S)).astype(dtype)
        y = np.full((B, K, P, Q), np.nan, dtype)
        assert fn(((x, w, y), B, C, P, R, Q, S)) == 0
        want = np.einsum("kcrs,bcprqs->bkpq", w.astype(np.float64),
                         x.reshape(B, C, P, R, Q, S).astype(np.float64))
        np.testing.assert_allclose(y, want, rtol=TOL[dtype] * 10, atol=TOL[dtype] * 10)
    B, C, P, R, Q, S, K = 2, 3, 3, 4, 2, 5, 9
    x = rng.standard_normal((B, C, P * R, Q * S)).astype(dtype)
    w = rng.standard_normal((K, C, R, S)).astype(dtype)
    y = np.empty((B, K, P, Q), dtype)
    y[...] = 7
    assert fn(((x, w, y), B, C, P + 1, R, Q, S)) == 1 and np.all(y == 7)
    over = np.zeros(x.size + y.size, dtype)
    xs, ys = over[:x.size].reshape(x.shape), over[x.size - 1:-1].reshape(y.shape)
    xs[...] = x
    assert fn(((xs, w, ys), B, C, P, R, Q, S)) == 1 and np.array_equal(xs, x)
