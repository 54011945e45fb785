"""The compiled path of the NumPy transformer (geon/transformers/numpy/compiled.py): fused
elementwise groups as C loops, small groups fused too, the default mode (large groups
only), the kernel cache and the fallback to the NumPy code (without a compiler: see
tests/test_compiled_fallback.py). The differential tests (tests/test_differential.py)
run random graphs through it as well."""

import os
import re
import warnings

import numpy as np
import pytest

import geon as be
from geon.errors import GeonWarning
from geon.transformers import fusion, threads
from geon.transformers.numpy import compiled as ck
from geon.transformers.numpy import c_codegen
from geon.transformers.numpy import toolchain as ctoolchain
from op_table import CASES
from test_compiled_fallback import large_and_small

from test_ops import TOL

needs_cc = pytest.mark.skipif(not ck.available(),
                              reason="no working C compiler for the compiled path")
pytestmark = needs_cc


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh kernel cache, and no library loaded earlier in this process."""
    monkeypatch.setenv("GEON_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(ctoolchain, "_libs", {})
    monkeypatch.setattr(ck, "_auto_off", set())
    return tmp_path / "kernels"


def kernel_calls(comp):
    return comp.source.count("# compiled:")


def compiled_and_numpy(build, *feeds):
    """Results of the graph ``build()`` makes, compiled and on the NumPy path."""
    out = []
    for compiled in (True, False):
        result, params = build()
        comp = be.NumPyTransformer(compiled=compiled).computation(result, *params)
        out.append((comp, np.asarray(comp(*feeds))))
    return out


# --- every op-table case with an elementwise tail --------------------------------------
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_op_table_with_a_compiled_tail_matches_numpy(case, cache):
    dtype = np.float64
    arrays = case.arrays(dtype)
    xs = [be.placeholder(i.axes, dtype=i.dtype(dtype)) for i in case.inputs]
    op = case.make(xs, dtype)
    want = case.expected(arrays)
    tail = op.dtype.kind == "f" and len(op.axes) > 0
    if tail:  # small: fused only because the group compiles
        op = be.tanh(op * 0.5) + op
        want = np.tanh(want * 0.5) + want
    comp = be.NumPyTransformer(compiled=True).computation(op, *xs)
    if tail:
        assert kernel_calls(comp) >= 1, comp.source
    got = np.asarray(comp(*arrays))
    if got.dtype.kind in "iu":
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, **TOL[np.dtype(got.dtype)])


# --- small tensors ---------------------------------------------------------------------
def test_a_long_chain_on_a_small_vector_is_a_few_c_calls(cache):
    n = 1000

    def build():
        A = be.Axis(n, "A")
        x = be.placeholder([A], dtype=np.float32)
        y = x
        for i in range(1000):
            y = be.tanh(y) if i % 2 else y * 1.0001
        return y, (x,)

    xs = np.linspace(-2, 2, n, dtype=np.float32)
    (c, got), (p, want) = compiled_and_numpy(build, xs)
    assert n < fusion.MIN_ELEMENTS
    # one C function per MAX_MEMBERS ops (compile time grows faster than length)
    assert kernel_calls(c) == -(-1000 // ck.MAX_MEMBERS) and "np.tanh" not in c.source
    assert not p.groups and p.source.count("np.tanh") == 500
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# --- views, broadcasting, feeds -------------------------------------------------------
def test_groups_read_broadcast_biases_transposes_and_strided_feeds(cache):
    H, N = be.Axis(5, "H"), be.Axis(7, "N")
    rng = np.random.default_rng(0)
    xv = rng.standard_normal((7, 5))      # fed as (H, N) through a transpose below
    bv = rng.standard_normal(5)

    def build():
        x = be.placeholder([H, N], dtype=np.float64)
        b = be.placeholder([H], dtype=np.float64)
        t = be.placeholder([N, H], dtype=np.float64)
        y = be.maximum(x + b, 0.0) * be.sigmoid(be.axes_with_order(t, [H, N]))
        return be.exp(-y) + 1.0, (x, b, t)

    x_feed = np.ascontiguousarray(xv.T)[:, :]        # contiguous (H, N)
    t_feed = xv.copy()
    strided = np.zeros((5, 14))[:, ::2]             # a non-contiguous feed
    strided[...] = x_feed
    for feed in (x_feed, strided):
        (c, got), (p, want) = compiled_and_numpy(build, feed, bv, t_feed)
        # the per-call transpose of the fed t is made before the group's call: it
        # does not cut the group in two
        assert kernel_calls(c) == 1 and "strided reads" in c.source
        np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize("strided", [False, True])
def test_large_groups_run_in_blocks_on_threads(strided, cache, monkeypatch):
    monkeypatch.setattr(fusion, "MAX_THREADS", 2)
    monkeypatch.setattr(threads.POLICY, "threads", 2)
    monkeypatch.setattr(c_codegen, "PARALLEL_ELEMENTS", 4096)
    monkeypatch.setattr(c_codegen, "BLOCK_ELEMENTS", 1000)   # ragged: the last block is short
    calls, real = [], fusion.run_blocks

    def spy(fn, units, block, sets):
        calls.append((units, block, len(sets)))
        return real(fn, units, block, sets)

    monkeypatch.setattr(fusion, "run_blocks", spy)
    A, B = be.Axis(90, "A"), be.Axis(70, "B")

    def build():
        x = be.placeholder([A, B], dtype=np.float32)
        if not strided:
            return be.tanh(x * 2.0) - x, (x,)
        b = be.placeholder([A], dtype=np.float32)      # read broadcast, by strides
        return be.tanh(x * 2.0 + b) - x, (x, b)

    rng = np.random.default_rng(1)
    feeds = [rng.standard_normal((90, 70)).astype(np.float32)]
    if strided:
        feeds.append(rng.standard_normal(90).astype(np.float32))
    (c, got), (p, want) = compiled_and_numpy(build, *feeds)
    assert kernel_calls(c) == 1 and ("strided reads" in c.source) == strided
    # blocks of 1,000 elements, or of the 14 rows of 70 that fit in 1,000
    assert calls == [(90, 14, 2)] if strided else [(6300, 1000, 2)], calls
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # without threads, one call over the whole range
    monkeypatch.setattr(c_codegen, "PARALLEL_ELEMENTS", 1 << 20)
    calls.clear()
    (c, got), _ = compiled_and_numpy(build, *feeds)
    assert calls == [] and "_run_blocks" not in c.source.split("# compiled:")[1]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("strided", [False, True])
def test_a_compiled_function_writes_only_the_range_it_is_given(strided, cache):
    A, B = be.Axis(6, "A"), be.Axis(5, "B")
    x = be.placeholder([A, B], dtype=np.float64)
    b = be.placeholder([A], dtype=np.float64)
    y = be.tanh(x + b) if strided else be.tanh(x * 2.0) + x
    comp = be.NumPyTransformer(compiled=True).computation(y, x, b)
    assert kernel_calls(comp) == 1
    assert re.search(r"kernel0\(\(\(Placeholder_\d+, " + ("v_Expand" if strided else "t_"),
                     comp.source), comp.source
    (kernel,) = comp._kernel_fns.values()
    xs = np.arange(30.0).reshape(6, 5) / 30
    bs = np.linspace(-1, 1, 6)
    want = np.tanh(xs + bs[:, None]) if strided else np.tanh(xs * 2) + xs
    out = np.full((6, 5), -7.0)
    lo, hi = (2, 4) if strided else (7, 19)    # rows, or elements
    bview = np.broadcast_to(bs[:, None], (6, 5))   # as the generated code passes it
    kernel(((xs, bview, out) if strided else (xs, out), lo, hi))   # one tuple
    expect = np.full(30, -7.0)
    span = slice(lo * 5, hi * 5) if strided else slice(lo, hi)
    expect[span] = want.reshape(-1)[span]
    np.testing.assert_allclose(out.reshape(-1), expect, rtol=1e-15)


def test_a_compiled_function_reads_arrays_through_the_buffer_protocol(cache):
    """The functions take the arrays' memory through the buffer protocol, not from the
    layout of NumPy's objects: an array of another layout than the code reads (not
    C-contiguous where it reads one, a read-only output) is a Python error, not a read
    of the wrong memory; any object exporting a buffer works."""
    A, B = be.Axis(6, "A"), be.Axis(5, "B")
    x = be.placeholder([A, B], dtype=np.float64)
    comp = be.NumPyTransformer(compiled=True).computation(be.tanh(x * 2.0) + x, x)
    (kernel,) = comp._kernel_fns.values()
    xs = np.arange(30.0).reshape(6, 5) / 30
    want = np.tanh(xs * 2) + xs
    out = np.zeros((6, 5))
    kernel(((memoryview(xs), out), 0, 30))       # not an ndarray: its buffer is read
    np.testing.assert_allclose(out, want, rtol=1e-15)
    with pytest.raises((BufferError, ValueError), match="contiguous"):
        kernel(((np.asfortranarray(xs), out), 0, 30))
    frozen = np.zeros((6, 5))
    frozen.flags.writeable = False
    with pytest.raises((BufferError, ValueError), match="read-only|writ"):
        kernel(((xs, frozen), 0, 30))
    assert not frozen.any()
    with pytest.raises(IndexError):       # a tuple without the output: nothing read
        kernel(((xs,), 0, 30))
    with pytest.raises(TypeError):        # a range that is not two integers
        kernel(((xs, out), "0", 30))
    with pytest.raises(IndexError):
        kernel(((xs, out), 0))


# --- large groups with several slow members: loops over tiles ----------------------------
def _tiled_build(dtype, n):
    def build():
        A = be.Axis(n, "A")
        x, y = be.placeholder([A], dtype=dtype), be.placeholder([A], dtype=dtype)
        a = be.tanh(x) * 2.0                      # read again three segments later
        b = be.exp(a - y) / (y * y + 1.0)
        c = be.log(abs(b) + 1.0) + a * x
        d = be.sqrt(c * c + 1.0) - a
        return [d, b], (x, y)                     # b: a member with a buffer, mid-group
    return build


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_large_groups_with_several_slow_members_run_in_tiles(dtype, cache, monkeypatch):
    monkeypatch.setattr(fusion, "MAX_THREADS", 2)
    monkeypatch.setattr(threads.POLICY, "threads", 2)
    # ragged: the last chunk is not whole, nor is the last tile of a chunk
    n = c_codegen.TILED_MIN_ELEMENTS + c_codegen.CHUNK_ELEMENTS + c_codegen.TILE_ELEMENTS * 3 + 77
    rng = np.random.default_rng(4)
    xs, ys = (rng.standard_normal(n).astype(dtype) for _ in range(2))
    build = _tiled_build(dtype, n)
    outs, params = build()
    comp = be.NumPyTransformer(compiled=True).computation(outs, *params)
    src = comp._kernels.source
    assert "loops over tiles of" in src and "tile0[u]" in src, src
    # stores only in the last segment's loop, after all of its loads: an output may be
    # written over an input's buffer
    loops = src.split("for (int64_t u = 0; u < ")[1:]
    store = re.compile(r"\*\)b\d+\)\[[^]]+\] = ")
    assert not any(store.search(lp) for lp in loops[:-1])
    last = loops[-1].split("#pragma omp simd")[0]
    stores = [m.start() for m in store.finditer(last)]
    loads = [m.start() for m in re.finditer(r"\bx\d+ = ", last)]
    assert len(stores) == 2 and all(ld < min(stores) for ld in loads)
    got = [np.asarray(v) for v in comp(xs, ys)]
    x64, y64 = xs.astype(np.float64), ys.astype(np.float64)
    a = np.tanh(x64) * 2.0
    b = np.exp(a - y64) / (y64 * y64 + 1.0)
    c = np.log(abs(b) + 1.0) + a * x64
    d = np.sqrt(c * c + 1.0) - a
    tol = TOL[np.dtype(dtype)]
    np.testing.assert_allclose(got[0], d, **tol)
    np.testing.assert_allclose(got[1], b, **tol)
    # the same values as one loop over the elements (the code before tiles)
    monkeypatch.setattr(c_codegen, "TILED_MIN_ELEMENTS", 2 * n)
    outs, params = build()
    one = be.NumPyTransformer(compiled=True).computation(outs, *params)
    assert "loops over tiles" not in one._kernels.source
    for g, w in zip(got, one(xs, ys)):
        assert _ulps(g, np.asarray(w)).max() <= 8


def test_tiled_groups_read_broadcast_and_transposed_inputs(cache):
    N, H = be.Axis(257, "N"), be.Axis(300, "H")   # rows of 300: one whole tile and a rest
    rng = np.random.default_rng(5)
    xv, bv = rng.standard_normal((257, 300)), rng.standard_normal(300)
    tv = rng.standard_normal((300, 257))

    def build():
        x = be.placeholder([N, H], dtype=np.float64)
        b = be.placeholder([H], dtype=np.float64)
        t = be.placeholder([H, N], dtype=np.float64)
        y = be.tanh(x + b) * be.exp(be.axes_with_order(t, [N, H]) * 0.5)
        return be.log(abs(y) + 1.0) * be.sigmoid(x), (x, b, t)

    (c, got), (p, want) = compiled_and_numpy(build, xv, bv, tv)
    src = c._kernels.source
    assert "strided reads" in c.source and "loops over tiles of" in src, src
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15)
    # rows shorter than a tile (and, read through the transpose, runs of one row):
    # several rows side by side make a step, computed in tiles all the same
    xv, tv = xv.reshape(-1, 100)[:771], tv.reshape(100, -1)[:, :771]
    N, H = be.Axis(771, "N"), be.Axis(100, "H")
    (c, got), (p, want) = compiled_and_numpy(build, xv, bv[:100], tv)
    src = c._kernels.source
    assert "strided reads" in c.source and "loops over tiles of" in src
    assert "whole short runs side by side" in src
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("threads,chunk", [(1, 1024), (3, 1024), (1, 5), (1, 20),
                                           (1, 22), (3, 4)])
def test_strided_rows_taken_in_runs(threads, chunk, cache, monkeypatch):
    """Rows that every strided input reads with one stride are taken as one run: a bias
    broadcast over (B, C, H, W) per (b, c) plane of H * W, a view contiguous over its
    whole shape at once; a transposed input keeps runs of one row. A step takes
    ``chunk`` elements: a piece of a longer run, or short runs side by side (runs of 21
    and of 3 elements, so that steps end one before, at, and one after a run's end). On
    threads, blocks of rows cut runs in the middle (blocks of 5 rows, runs of 7).
    Values as NumPy's."""
    monkeypatch.setattr(c_codegen, "ROW_CHUNK_ELEMENTS", chunk)
    monkeypatch.setattr(fusion, "MAX_THREADS", threads)
    monkeypatch.setattr(c_codegen, "PARALLEL_ELEMENTS", 64)
    monkeypatch.setattr(c_codegen, "BLOCK_ELEMENTS", 5 * 3)
    rng = np.random.default_rng(9)
    xv, bv = rng.standard_normal((2, 4, 7, 3)), rng.standard_normal(4)
    tv = rng.standard_normal((3, 7, 4, 2))

    def build(transposed):
        x = be.np.placeholder((2, 4, 7, 3), dtype=np.float64)
        b = be.np.placeholder((4,), dtype=np.float64)
        t = be.np.placeholder((3, 7, 4, 2), dtype=np.float64)
        y = be.np.maximum(x + be.np.reshape(b, (4, 1, 1)), 0.0) * be.np.tanh(x)
        if transposed:
            y = y + be.np.transpose(t, (3, 2, 1, 0))
        return y, (x, b, t)

    for transposed in (False, True):
        (c, got), (_, want) = compiled_and_numpy(lambda: build(transposed), xv, bv, tv)
        assert "a run's end" in c._kernels.source
        assert ("_run_blocks(" in c.source) == (threads > 1)
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("budget", [None, 48])
def test_long_rows_read_through_each_kind_of_stride(dtype, budget, cache, monkeypatch):
    """A strided row is read a chunk at a time, each strided input's chunk made
    contiguous: a last stride of the element size is read in place, a last stride of 0
    (a value broadcast along the row) fills the chunk, any other stride is gathered.
    Rows of 2,500 take three chunks, the last one short; one of the groups is tiled.
    With 48 bytes for the copies of three strided inputs, chunks are the shortest, 16
    elements (shorter than a tile: no tiles)."""
    if budget:
        monkeypatch.setattr(c_codegen, "ROW_BUFFER_BYTES", budget)
    chunk = 16 if budget else c_codegen.ROW_CHUNK_ELEMENTS
    N, H = be.Axis(27, "N"), be.Axis(2500, "H")
    assert H.length % c_codegen.ROW_CHUNK_ELEMENTS and H.length > 2 * c_codegen.ROW_CHUNK_ELEMENTS
    assert N.length * H.length >= c_codegen.TILED_MIN_ELEMENTS
    rng = np.random.default_rng(11)
    xv, bv, cv = (rng.standard_normal(s).astype(dtype) for s in ((27, 2500), 2500, 27))
    tv = rng.standard_normal((2500, 27)).astype(dtype)

    for slow in (False, True):
        def build():
            # views of variables are made once, so the group is one run of ops
            x = be.placeholder([N, H], dtype=dtype)
            b = be.Variable([H], initial_value=bv, dtype=dtype)  # element stride
            c = be.Variable([N], initial_value=cv, dtype=dtype)  # stride 0 along rows
            t = be.Variable([H, N], initial_value=tv, dtype=dtype)  # transposed
            y = (x + b) * c - be.axes_with_order(t, [N, H])
            if slow:
                y = be.exp(be.tanh(y)) * c
            return y, (x,)

        (comp, got), (_, want) = compiled_and_numpy(build, xv)
        src = comp._kernels.source
        assert kernel_calls(comp) == 1 and "strided reads" in comp.source
        assert ("loops over tiles of" in src) == (slow and not budget), src
        assert f"[{chunk}] __attribute__((aligned(64)))" in src
        # against float64: each element to a few roundings of its terms' size (the
        # subtraction cancels)
        x64, b64, c64, t64 = (a.astype(np.float64) for a in (xv, bv, cv, tv))
        exact = (x64 + b64) * c64[:, None] - t64.T
        size = (abs(x64) + abs(b64)) * abs(c64[:, None]) + abs(t64.T)
        eps = np.finfo(dtype).eps
        if slow:
            exact = np.exp(np.tanh(exact)) * c64[:, None]
            np.testing.assert_allclose(got, want, rtol=8 * eps)
        else:   # + - * give NumPy's bits
            np.testing.assert_array_equal(got, want)
        assert (abs(got - exact) <= 16 * eps * (size + abs(exact))).all()


@pytest.mark.parametrize("rows, length, kept", [(7, 2500, True), (5, 300, False),
                                                 (1100, 1000, True)])
def test_groups_end_with_sums_of_their_rows(rows, length, kept, cache, monkeypatch):
    """A row sum after a group (the bias gradient after the backward ReLU mask) is added
    up in the group's C loop, in double, and stored once per row. ``kept``: the masked
    product is also a result (else it never gets a full buffer); 1,100 x 1,000 runs in
    blocks of rows on two threads."""
    from geon.op_graph import primitives as pr
    monkeypatch.setattr(fusion, "MAX_THREADS", 2)
    monkeypatch.setattr(threads.POLICY, "threads", 2)
    N, H = be.Axis(rows, "N"), be.Axis(length, "H")
    rng = np.random.default_rng(rows)
    dv = rng.standard_normal((rows, length)).astype(np.float32)
    hv = np.maximum(rng.standard_normal((rows, length)), 0).astype(np.float32)
    dv[0, :3], hv[0, :3] = [1e8, 1.0, -1e8], 1.0  # float32 sums would lose the 1

    def build():
        d = be.placeholder([N, H])
        h = be.placeholder([N, H])
        masked = d * be.greater(h, 0.0)
        out = [be.sum(masked, reduction_axes=H)]
        return (out + [masked] if kept else out), (d, h)

    (got, c), (want, _) = [
        (comp(dv, hv), comp) for comp in
        (be.NumPyTransformer(compiled=compiled).computation(out, *params)
         for compiled in (True, False) for out, params in [build()])]
    (g,) = c.groups
    assert isinstance(g.members[-1], pr.ReduceSum) and kernel_calls(c) == 1, c.source
    assert "sum(s) of their rows" in c.source
    assert ("_run_blocks(" in c.source) == (rows * length >= c_codegen.PARALLEL_ELEMENTS)
    masked = dv.astype(np.float64) * (hv > 0)
    exact = masked.sum(axis=1)
    # one rounding of the exact sum (double accumulation: the 1 in row 0 is kept)
    assert (_ulps(got[0], exact.astype(np.float32)) <= 1).all()
    assert abs(exact[0] - (1.0 + masked[0, 3:].sum())) < 1e-6
    assert got[0][0] == np.float32(exact[0])
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4,
                               atol=1e-5 * abs(masked).sum(axis=1).max())
    if kept:
        np.testing.assert_array_equal(got[1], want[1])


def test_segments_are_bounded_and_slots_reused():
    A = be.Axis(c_codegen.TILED_MIN_ELEMENTS, "A")
    x = be.placeholder([A], dtype=np.float32)
    members, y = [], x
    for i in range(40):                           # 40 slow members, 40 cheap ones
        y = be.tanh(y)
        members.append(y)
        y = y * 1.5
        members.append(y)
    segments, slots, decls, tile = c_codegen._segments(members, {}, c_codegen.TILED_MIN_ELEMENTS)
    assert 1 < len(segments) <= c_codegen.MAX_SEGMENTS
    assert [m for seg in segments for _, m in seg] == members
    # a chain: two arrays in turn (one read in a segment, the other written)
    assert len(decls) == 2 and set(decls.values()) == {"float"}
    assert tile == c_codegen.TILE_ELEMENTS
    # under the size threshold, and without slow members: one loop
    assert c_codegen._segments(members, {}, c_codegen.TILED_MIN_ELEMENTS - 1)[3] == 0
    assert c_codegen._segments(members[1::2], {}, c_codegen.TILED_MIN_ELEMENTS)[3] == 0
    # one slow member, first or last: nothing to overlap, one loop
    assert c_codegen._segments(members[:2], {}, c_codegen.TILED_MIN_ELEMENTS)[3] == 0
    assert c_codegen._segments(members[1:3], {}, c_codegen.TILED_MIN_ELEMENTS)[3] == 0
    assert c_codegen._segments(members[:3], {}, c_codegen.TILED_MIN_ELEMENTS)[3] > 0
    # loops over rows shorter than a tile: one loop
    assert c_codegen._segments(members, {}, c_codegen.TILED_MIN_ELEMENTS, row=100)[3] == 0
    assert c_codegen._segments(members, {}, c_codegen.TILED_MIN_ELEMENTS, row=300)[3] > 0
    # an output computed early keeps an array to the last segment, which stores it
    segments, slots, decls, tile = c_codegen._segments(members, {members[0]: 1},
                                                c_codegen.TILED_MIN_ELEMENTS)
    assert members[0] in slots and len(decls) == 3


# --- exactness, ulps, NaN and infinity -------------------------------------------------
def _binary(op, dtype):
    def build():
        A = be.Axis(4096, "A")
        a, b = be.placeholder([A], dtype=dtype), be.placeholder([A], dtype=dtype)
        return op(op(a, b), b), (a, b)
    return build


@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")  # the NumPy path's
@pytest.mark.parametrize("name", ["add", "sub", "mul", "div"])
def test_float64_arithmetic_gives_numpys_bits(name, cache):
    op = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b,
          "mul": lambda a, b: a * b, "div": lambda a, b: a / b}[name]
    rng = np.random.default_rng(2)
    a = rng.standard_normal(4096) * 10.0 ** rng.integers(-300, 300, 4096)
    b = rng.standard_normal(4096) * 10.0 ** rng.integers(-20, 20, 4096)
    (c, got), (p, want) = compiled_and_numpy(_binary(op, np.float64), a, b)
    assert kernel_calls(c) == 1
    np.testing.assert_array_equal(got.view(np.int64), want.view(np.int64))


def _ulps(got, want):
    """Distance in units in the last place of ``want``'s dtype."""
    got, want = np.asarray(got), np.asarray(want)
    spacing = np.spacing(np.abs(want).astype(want.dtype))
    return np.abs(got.astype(np.float64) - want.astype(np.float64)) / spacing


UNARY = {"exp": (be.exp, np.exp, (-80, 80)), "log": (be.log, np.log, (1e-30, 1e30)),
         "tanh": (be.tanh, np.tanh, (-10, 10)), "sin": (be.sin, np.sin, (-100, 100)),
         "cos": (be.cos, np.cos, (-100, 100)), "expm1": (be.expm1, np.expm1, (-5, 5)),
         "sqrt": (be.sqrt, np.sqrt, (0, 1e30)),
         "sigmoid": (be.sigmoid, lambda x: 1 / (1 + np.exp(-x)), (-30, 30))}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(UNARY))
def test_transcendentals_are_within_a_few_ulps(name, dtype, cache):
    fn, ref, (lo, hi) = UNARY[name]
    rng = np.random.default_rng(3)
    if name in ("log", "sqrt"):
        xs = np.exp(rng.uniform(np.log(max(lo, 1e-30)), np.log(hi), 4096))
    else:
        xs = rng.uniform(lo, hi, 4096)
    xs = xs.astype(dtype)

    def build():
        x = be.placeholder([be.Axis(4096, "A")], dtype=dtype)
        return fn(x) * 2.0, (x,)   # "* 2.0" (exact): a group of two, fused and compiled

    (c, got), _ = compiled_and_numpy(build, xs)
    assert kernel_calls(c) == 1
    want = ref(xs.astype(np.float64)).astype(dtype)  # float64 maths, rounded once
    assert _ulps(got / 2, want).max() <= 4, name


SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 1e308, -1e-310, 2.5])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_nan_and_infinity_propagate_as_in_numpy(dtype, cache):
    n = len(SPECIAL)
    with np.errstate(over="ignore"):  # 1e308 is an infinity in float32
        a = SPECIAL.astype(dtype)
        b = np.roll(SPECIAL, 3).astype(dtype)

    def build():
        A = be.Axis(n, "A")
        x, y = be.placeholder([A], dtype=dtype), be.placeholder([A], dtype=dtype)
        outs = [be.maximum(x, y) * 2.0, be.minimum(x, y) * 2.0, x / y * 2.0,
                be.exp(x) * 2.0, be.log(x) * 2.0, be.sigmoid(x) * 2.0, be.sign(x) * 2.0,
                be.softplus(x) * 2.0, be.sqrt(x) * 2.0, be.tanh(x) * 2.0,
                be.less(x, y) * 2.0, be.not_equal(x, y) * 2.0, be.equal(x, x) * 2.0,
                be.where(be.greater(x, 0.0), x, y) * 2.0, x ** y * 2.0, abs(x) * 2.0,
                be.reciprocal(x) * 2.0, be.square(x) * 2.0, -x * 2.0]
        return outs, (x, y)

    with np.errstate(all="ignore"):
        for compiled in (True, False):
            outs, params = build()
            comp = be.NumPyTransformer(compiled=compiled).computation(outs, *params)
            got = [np.asarray(v) for v in comp(a, b)]
            if compiled:
                assert kernel_calls(comp) >= 1
                first = got
    for k, (g, w) in enumerate(zip(first, got)):
        assert np.array_equal(np.isnan(g), np.isnan(w)), (k, g, w)
        fin = np.isfinite(w)
        assert np.array_equal(g[~fin & ~np.isnan(w)], w[~fin & ~np.isnan(w)]), (k, g, w)
        np.testing.assert_allclose(g[fin], w[fin], rtol=4 * np.finfo(dtype).eps,
                                   atol=0, err_msg=str(k))


# --- the cache -------------------------------------------------------------------------
def _chain():
    A = be.Axis(64, "A")
    x = be.placeholder([A], dtype=np.float64)
    return be.tanh(x * 3.0) + x, (x,)


def _run_chain():
    y, params = _chain()
    comp = be.NumPyTransformer(compiled=True).computation(y, *params)
    xs = np.linspace(-1, 1, 64)
    np.testing.assert_allclose(comp(xs), np.tanh(xs * 3.0) + xs, rtol=1e-14)
    return comp


def test_the_cache_is_written_by_rename_and_reused(cache, monkeypatch):
    renames = []
    real_replace = os.replace

    def replace(src, dst, **dir_fds):
        renames.append((str(src), str(dst), dir_fds))
        return real_replace(src, dst, **dir_fds)

    monkeypatch.setattr(ck.os, "replace", replace)
    _run_chain()
    files = sorted(p.name for p in cache.iterdir())
    key = files[0].split(".")[0]
    # no temporary left (the probe's record is kept beside them)
    assert [f for f in files if not f.startswith("toolchain-")] == \
        [f"{key}.c", f"{key}.sha256", f"{key}.so"]
    final = {dst for _, dst, _ in renames}
    assert final >= {f"{key}.c", f"{key}.sha256", f"{key}.so"}
    for src, dst, dir_fds in renames:  # each written under a fresh name, then renamed,
        # both names in the folder that was checked (through its descriptor)
        assert src != dst and src.startswith(".tmp-") and os.sep not in src + dst
        assert dir_fds["src_dir_fd"] == dir_fds["dst_dir_fd"]
    # a new process (no library loaded) reuses the file and never runs the compiler
    monkeypatch.setattr(ctoolchain, "_libs", {})
    monkeypatch.setattr(ctoolchain, "_run_cc", lambda *a: pytest.fail("compiled again"))
    _run_chain()


def replace_file(path, data):
    # a new file (never write into a library this process has mapped)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def test_a_corrupted_cache_file_is_rebuilt(cache, monkeypatch):
    _run_chain()
    so = next(cache.glob("*.so"))
    data = bytearray(so.read_bytes())
    data[len(data) // 2] ^= 0xFF
    replace_file(so, bytes(data))
    monkeypatch.setattr(ctoolchain, "_libs", {})
    runs = []
    real = ctoolchain._run_cc
    monkeypatch.setattr(ctoolchain, "_run_cc", lambda *a: runs.append(1) or real(*a))
    _run_chain()
    assert runs == [1]
    assert ctoolchain._digest(str(so)) == (so.with_suffix(".sha256")).read_text().strip()
    # a truncated library is rejected as well
    replace_file(so, so.read_bytes()[:100])
    monkeypatch.setattr(ctoolchain, "_libs", {})
    _run_chain()
    assert runs == [1, 1]


def test_the_probe_of_the_compiler_is_kept_in_the_cache(cache, monkeypatch):
    monkeypatch.setattr(ctoolchain, "_toolchains", {})
    runs = []
    real = ctoolchain._run_cc
    monkeypatch.setattr(ctoolchain, "_run_cc", lambda *a: runs.append(a[1]) or real(*a))
    first = ck.toolchain()
    assert runs  # probed: at least one build
    (record,) = cache.glob("toolchain-*.json")
    monkeypatch.setattr(ctoolchain, "_toolchains", {})  # a new process, as far as probing goes
    del runs[:]
    again = ck.toolchain()
    assert runs == [] and again.flags == first.flags
    assert (again.identity, again.simd_math) == (first.identity, first.simd_math)
    # a record is never trusted to add flags: anything but a known choice is probed again
    for bad in ('{"extra": ["-fplugin=x.so"], "simd_math": false}', "not json",
                '{"extra": [], "simd_math": true}'):
        record.write_text(bad)
        monkeypatch.setattr(ctoolchain, "_toolchains", {})
        tc = ck.toolchain()
        assert runs and "-fplugin=x.so" not in tc.flags and tc.flags == first.flags
        del runs[:]


# --- fallback --------------------------------------------------------------------------
def test_a_failed_compilation_falls_back(cache, monkeypatch):
    monkeypatch.setattr(ctoolchain, "_warned", set())
    monkeypatch.setattr(ctoolchain, "_run_cc", lambda *a: (False, "error: simulated"))
    with pytest.warns(GeonWarning, match="simulated"):
        comp = _run_chain()
    assert kernel_calls(comp) == 0


def test_the_environment_variable_chooses_the_mode(monkeypatch):
    monkeypatch.delenv("GEON_COMPILED", raising=False)
    assert be.NumPyTransformer().compiled == ck.AUTO
    for value, mode in [("1", True), ("yes", True), ("0", False), ("off", False),
                        ("", ck.AUTO), (" Auto ", ck.AUTO)]:
        monkeypatch.setenv("GEON_COMPILED", value)
        assert be.NumPyTransformer().compiled is mode or (
            mode == ck.AUTO and be.NumPyTransformer().compiled == ck.AUTO), value
        assert be.NumPyTransformer(compiled=False).compiled is False
        assert be.NumPyTransformer(compiled=True).compiled is True
    assert be.NumPyTransformer(compiled="auto").compiled == ck.AUTO
    with pytest.raises(ValueError, match="compiled must be True, False, 'auto'"):
        be.NumPyTransformer(compiled="fast")


# --- the default: large groups, and small groups of several ops ----------------------------------------------------
def test_auto_compiles_the_groups_from_its_threshold_only(cache, monkeypatch):
    monkeypatch.delenv("GEON_COMPILED", raising=False)
    assert ck.AUTO_MIN_ELEMENTS == 256 * 256 < fusion.MIN_ELEMENTS
    comp = large_and_small(be.NumPyTransformer())
    # the large group is one C call; the small ops are not fused (one NumPy call each)
    assert kernel_calls(comp) == 1, comp.source
    assert [g.members[0].axes.lengths for g in comp.groups] == [(256, 256)]
    assert "np.tanh(" in comp.source
    assert list(cache.glob("*.so"))
    everything = large_and_small(be.NumPyTransformer(compiled=True))
    assert kernel_calls(everything) == 2 and "np.tanh(" not in everything.source
    numpy_code = large_and_small(be.NumPyTransformer(compiled=False))  # too small
    assert kernel_calls(numpy_code) == 0 and not numpy_code.groups


def test_auto_compiles_small_groups_of_several_ops(cache, monkeypatch):
    """From AUTO_SMALL_ELEMENTS elements "auto" compiles a group of AUTO_SMALL_MEMBERS
    ops or more; a single op there, and any group below, stays NumPy code."""
    monkeypatch.delenv("GEON_COMPILED", raising=False)
    assert ck.AUTO_SMALL_ELEMENTS == 1024 and ck.AUTO_SMALL_MEMBERS == 2
    rng = np.random.default_rng(5)

    def build(n, chain):
        x = be.placeholder([be.Axis(n, "SgN")], dtype=np.float64)
        y = be.tanh(x * 3.0) + x if chain else be.tanh(x)
        comp = be.NumPyTransformer().computation(y, x)
        v = rng.normal(size=n)
        want = np.tanh(v * 3) + v if chain else np.tanh(v)
        np.testing.assert_allclose(comp(v), want, rtol=1e-14)
        return comp
    at = build(ck.AUTO_SMALL_ELEMENTS, True)
    assert kernel_calls(at) == 1 and "np.tanh(" not in at.source, at.source
    for comp in (build(ck.AUTO_SMALL_ELEMENTS - 1, True),
                 build(ck.AUTO_SMALL_ELEMENTS, False)):
        assert kernel_calls(comp) == 0 and "np.tanh(" in comp.source, comp.source


def test_auto_with_a_cache_it_cannot_use_runs_the_numpy_code_silently(cache, tmp_path,
                                                                      monkeypatch):
    monkeypatch.setattr(ctoolchain, "_warned", set())
    not_a_folder = tmp_path / "a-file"
    not_a_folder.write_text("")
    monkeypatch.setenv("GEON_CACHE_DIR", str(not_a_folder))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        comp = large_and_small(be.NumPyTransformer(compiled="auto"))
    assert kernel_calls(comp) == 0
    with pytest.warns(GeonWarning, match="cannot create the kernel cache"):
        large_and_small(be.NumPyTransformer(compiled=True))


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="no POSIX owners and modes here")
def test_libraries_are_never_loaded_from_a_folder_others_may_write(tmp_path, monkeypatch):
    monkeypatch.setattr(ctoolchain, "_libs", {})
    monkeypatch.setattr(ctoolchain, "_toolchains", {})  # probed here, its record kept here
    monkeypatch.setattr(ctoolchain, "_warned", set())
    monkeypatch.setenv("GEON_CACHE_DIR", str(tmp_path / "mine"))
    _run_chain()
    kernels = tmp_path / "mine" / "kernels"
    assert kernels.stat().st_mode & 0o777 == 0o700  # made readable by its owner only
    (so,) = kernels.glob("*.so")
    kernels.chmod(0o777)
    monkeypatch.setattr(ctoolchain, "_libs", {})
    loads = []
    monkeypatch.setattr(ctoolchain, "_load_cached", lambda *args: loads.append(args))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        comp = large_and_small(be.NumPyTransformer(compiled="auto"))
    assert kernel_calls(comp) == 0 and loads == []
    with pytest.warns(GeonWarning, match="others may write to it"):
        comp = _run_chain()
    assert kernel_calls(comp) == 0 and loads == []
    # nor is the compiler's probe read from or kept there
    (record,) = kernels.glob("toolchain-*.json")
    record.write_text("not json")
    monkeypatch.setattr(ctoolchain, "_toolchains", {})
    assert ck.toolchain().record is None and record.read_text() == "not json"


def test_auto_leaves_a_group_it_cannot_compile_below_the_numpy_threshold(cache,
                                                                          monkeypatch):
    # W <- W - 0.1 * (a @ b) without the BLAS accumulate: the product heads the
    # update's group, and a group with a product does not compile
    from geon.transformers.numpy import blas
    monkeypatch.setattr(blas, "_GEMM", {})
    I, J, K = be.Axis(256, "gI"), be.Axis(256, "gJ"), be.Axis(8, "gK")
    a = be.placeholder([I, K], dtype=np.float32)
    b = be.placeholder([K, J], dtype=np.float32)
    w0 = np.full((256, 256), 1 / 7, np.float32)
    W = be.Variable(axes=[I, J], initial_value=w0, dtype=np.float32)
    t = be.NumPyTransformer(compiled=True)
    upd = be.SetItem(W, W - 0.1 * be.dot(a, b))
    assert t.computation(upd, a, b).groups  # compiled=True: a NumPy blocked group
    t = be.NumPyTransformer(compiled="auto")
    comp = t.computation(upd, a, b)
    assert not comp.groups and "_run_blocks" not in comp.source
    rng = np.random.default_rng(4)
    av, bv = (rng.standard_normal(s).astype(np.float32) for s in ((256, 8), (8, 256)))
    comp(av, bv)
    np.testing.assert_allclose(t.state[W], w0 - 0.1 * (av @ bv), rtol=1e-5, atol=1e-6)


def test_a_compiler_that_fails_is_probed_again_in_the_next_process(cache, monkeypatch):
    monkeypatch.setattr(ctoolchain, "_toolchains", {})
    monkeypatch.setattr(ctoolchain, "_warned", set())
    tc = ck.toolchain()
    assert tc.record and os.path.exists(tc.record)
    monkeypatch.setattr(ctoolchain, "_run_cc", lambda *a: (False, "error: simulated"))
    with pytest.warns(GeonWarning, match="simulated"):
        _run_chain()
    assert not os.path.exists(tc.record)


def test_a_full_disk_gives_the_numpy_code(cache, monkeypatch):
    ck.toolchain()
    monkeypatch.setattr(ctoolchain, "_warned", set())

    def full(*args):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(ctoolchain, "_compile", full)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        comp = large_and_small(be.NumPyTransformer(compiled="auto"))
    assert kernel_calls(comp) == 0
    with pytest.warns(GeonWarning, match="No space left"):
        assert kernel_calls(_run_chain()) == 0


def test_auto_warns_when_a_compilation_fails(cache, monkeypatch):
    ck.toolchain()  # probed with the real compiler: only the kernels' build fails
    monkeypatch.setattr(ctoolchain, "_warned", set())
    monkeypatch.setattr(ctoolchain, "_run_cc", lambda *a: (False, "error: simulated"))
    with pytest.warns(GeonWarning, match="simulated"):
        comp = large_and_small(be.NumPyTransformer(compiled="auto"))
    assert kernel_calls(comp) == 0


def test_groups_that_do_not_compile_run_numpy_code(cache):
    # integer arithmetic has no C rule: such ops are not fused below MIN_ELEMENTS
    A = be.Axis(8, "A")
    i = be.placeholder([A], dtype=np.int32)
    y = (i + 1) * 3
    comp = be.NumPyTransformer(compiled=True).computation(y, i)
    assert kernel_calls(comp) == 0 and not comp.groups
    np.testing.assert_array_equal(comp(np.arange(8, dtype=np.int32)),
                                  (np.arange(8) + 1) * 3)


def test_a_training_step_matches_the_numpy_path(cache):
    from test_fusion import _mlp
    rng = np.random.default_rng(0)
    xs, ts = rng.standard_normal((7, 6)), np.eye(3)[rng.integers(0, 3, 6)].T
    runs = []
    for compiled in (True, False):
        results, params, variables = _mlp()
        t = be.NumPyTransformer(compiled=compiled)
        step = t.computation(results, *params)
        losses = [step(xs, ts)[0] for _ in range(3)]
        runs.append((losses, [t.state[v].copy() for v in variables], step))
    (l1, s1, comp), (l2, s2, plain) = runs
    # bias adds, ReLU, sigmoid and the updates: small, so fused only when compiled
    assert kernel_calls(comp) >= 3 and "strided reads" in comp.source
    assert not plain.groups
    np.testing.assert_allclose(l1, l2, rtol=1e-12)
    for a, b in zip(s1, s2):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
