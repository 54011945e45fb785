"""Runs of a generated run()'s lines called from C (geon/transformers/numpy/segments.py):
which lines the emitter gathers, the values of whole computations with and without
segments, and the runner's contract: an entry that refuses its arrays sends its line
back to Python and the run goes on after it; errors propagate; a new thread count
makes the steps again; without the runner the lines run as Python."""

import ctypes
import warnings

import numpy as np
import pytest

import geon as be
from geon.transformers import fusion
from geon.transformers.numpy import compiled as ck
from geon.transformers.numpy import segments, toolchain

needs_cc = pytest.mark.skipif(not ck.available(),
                              reason="no working C compiler for the C kernels")


def _block(x, c, rng, dtype, stride=1):
    """A MobileNet-v2 block: 1 x 1 expansion (bias, ReLU6), 3 x 3 depthwise (bias,
    ReLU6), 1 x 1 projection (bias), and the residual where the shapes allow."""
    def var(*shape):
        return be.np.variable((rng.standard_normal(shape) * 0.3).astype(dtype))

    def bias(k):
        return be.np.reshape(var(k), (k, 1, 1))

    def relu6(v):
        return be.np.minimum(be.np.maximum(v, 0.0), 6.0)
    e = 4 * c
    h = relu6(be.np.conv(x, var(e, c, 1, 1)) + bias(e))
    h = relu6(be.np.conv(h, var(e, 1, 3, 3), stride=stride, padding=1, groups=e) + bias(e))
    y = be.np.conv(h, var(c, e, 1, 1)) + bias(c)
    return y + x if stride == 1 else y


def _model(dtype, B=2, C=16, S=8):
    rng = np.random.default_rng(0)
    x = be.np.placeholder((B, C, S, S), dtype=dtype)
    h = _block(x, C, rng, dtype)
    h = _block(h, C, rng, dtype)
    h = _block(h, C, rng, dtype, stride=2)
    return x, be.np.sum(h * h, axis=(2, 3))


def _computation(dtype, on, monkeypatch, **kw):
    monkeypatch.setattr(segments, "ENABLED", on)
    x, z = _model(dtype)
    return be.NumPyTransformer(**kw).computation(z, x)


@needs_cc
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_values_as_without_segments(dtype, monkeypatch):
    feed = np.random.default_rng(1).standard_normal((2, 16, 8, 8)).astype(dtype)
    off = _computation(dtype, False, monkeypatch)
    on = _computation(dtype, True, monkeypatch)
    assert "_seg0()" in on._source and "_Segment" not in off._source
    want = off(feed).copy()
    for _ in range(3):   # the first call makes the steps, the next ones run them
        np.testing.assert_array_equal(on(feed), want)
    # the convolutions and the compiled group: C entries (the first residual add reads
    # the feed: two segments)
    assert _entries(on, "_seg0") + _entries(on, "_seg1") >= 8
    # a new feed: the first convolution reads it outside the segment
    feed2 = feed[::-1].copy()
    np.testing.assert_array_equal(on(feed2), off(feed2))


@needs_cc
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_first_call_with_the_convolution_and_its_epilogue_apart(dtype, monkeypatch):
    """1 x 1 convolutions whose epilogue runs as a pass after the product (the BLAS's,
    then the bias pass: two steps of one line); the first call makes the steps, and a
    maker that computed would have written over values still to be read."""
    from geon.transformers.numpy import conv, pointwise
    monkeypatch.setattr(pointwise, "usable", lambda *a, **k: False)
    monkeypatch.setattr(conv, "_columns", lambda *a, **k: None)
    feed = np.random.default_rng(4).standard_normal((2, 16, 8, 8)).astype(dtype)
    want = _computation(dtype, False, monkeypatch)(feed)
    on = _computation(dtype, True, monkeypatch)
    np.testing.assert_array_equal(on(feed), want)
    np.testing.assert_array_equal(on(feed), want)
    assert "_seg0()" in on._source


@needs_cc
@pytest.mark.parametrize("apart", [False, True], ids=["kernels", "apart"])
def test_making_the_steps_writes_nothing(apart, monkeypatch):
    from geon.transformers.numpy import conv, pointwise
    if apart:   # (as above)
        monkeypatch.setattr(pointwise, "usable", lambda *a, **k: False)
        monkeypatch.setattr(conv, "_columns", lambda *a, **k: None)
    comp = _computation(np.float64, True, monkeypatch)
    comp(np.random.default_rng(5).standard_normal((2, 16, 8, 8)))
    rng = np.random.default_rng(6)
    for n in comp._arenas:   # values a maker that computed would change
        comp._ns[n][...] = rng.integers(0, 64, comp._ns[n].size, np.uint8)
    arenas = {n: comp._ns[n].copy() for n in comp._arenas}
    segs = [v for n, v in comp._ns.items() if isinstance(v, segments.Segment)]
    assert len(segs) == 2
    # another thread count: the convolutions choose their ways again as the steps are made
    monkeypatch.setattr(fusion, "MAX_THREADS", fusion.MAX_THREADS + 1)
    for seg in segs:
        seg._build()
    for n, a in arenas.items():
        np.testing.assert_array_equal(comp._ns[n], a)


def _entries(comp, name):
    """How many of segment ``name``'s steps are C entries."""
    _, n, table, _ = comp._ns[name].call
    return int(np.count_nonzero(np.ctypeslib.as_array((ctypes.c_int64 * n).from_address(
        table))))


@needs_cc
def test_a_new_thread_count_makes_the_steps_again(monkeypatch):
    comp = _computation(np.float32, True, monkeypatch)
    feed = np.ones((2, 16, 8, 8), np.float32)
    want = comp(feed).copy()
    seg = comp._ns["_seg0"]
    first = seg.call
    monkeypatch.setattr(fusion, "MAX_THREADS", fusion.MAX_THREADS + 1)
    np.testing.assert_array_equal(comp(feed), want)
    assert seg.threads == fusion.MAX_THREADS and seg.call is not first


def test_without_the_runner_the_lines_run_as_python(monkeypatch):
    monkeypatch.setattr(segments, "runner", lambda: None)
    comp = _computation(np.float64, True, monkeypatch)
    feed = np.random.default_rng(2).standard_normal((2, 16, 8, 8))
    want = _computation(np.float64, False, monkeypatch)(feed)
    np.testing.assert_array_equal(comp(feed), want)
    assert comp._ns["_seg0"].call is None


# --- the runner's contract, on entries of our own --------------------------------------

_ENTRIES = r"""
extern void *PyTuple_GetItem(void *tuple, long k);
extern long long PyLong_AsLongLong(void *obj);
extern void *PyErr_Occurred(void);
extern void PyErr_SetString(void *type, const char *message);
extern void *PyExc_ValueError;
/* adds its number to the log (a list's length as the count): args = (log, number) */
extern int PyList_Append(void *list, void *item);
int seg_test_log(void *args) {
    return PyList_Append(PyTuple_GetItem(args, 0), PyTuple_GetItem(args, 1)) ? -1 : 0;
}
/* refuses: returns its second item's value (nonzero) without writing anything */
int seg_test_refuse(void *args) {
    return (int)PyLong_AsLongLong(PyTuple_GetItem(args, 1));
}
int seg_test_fail(void *args) {
    PyErr_SetString(PyExc_ValueError, "the entry failed");
    return -1;
}
"""


@pytest.fixture(scope="module")
def entries():
    if segments.runner() is None:
        pytest.skip("no working C compiler for the runner")
    lib = toolchain.build(_ENTRIES, ["seg_test_log", "seg_test_refuse", "seg_test_fail"])
    proto = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object)
    return {n: proto((f"seg_test_{n}", lib)) for n in ("log", "refuse", "fail")}


def _segment(entries, log, plan):
    """A segment of one line per item of ``plan``: "c" (an entry logging the line's
    number), "py" (a Python step logging it), "refuse" (an entry refusing), "cc" (two
    entries: one logging, then one refusing); each line's Python logs "<number>py"."""
    lines, makers = [], []
    for k, kind in enumerate(plan):
        lines.append(lambda k=k: log.append(f"{k}py"))
        if kind == "c":
            makers.append(lambda k=k: [(entries["log"], (log, k), None)])
        elif kind == "py":
            makers.append(lambda k=k: [(log.append, (k,), None)])
        elif kind == "refuse":
            makers.append(lambda: [(entries["refuse"], ((), 2), None)])
        else:
            makers.append(lambda k=k: [(entries["log"], (log, k), None),
                                       (entries["refuse"], ((), 2), None)])
    return segments.Segment(tuple(lines), tuple(makers))


def test_steps_run_in_order_and_a_refusal_runs_its_line_as_python(entries):
    log = []
    seg = _segment(entries, log, ["c", "refuse", "py", "cc", "c"])
    seg()
    assert log == [0, "1py", 2, 3, "3py", 4]
    log.clear()
    seg()
    assert log == [0, "1py", 2, 3, "3py", 4]


def test_a_refusal_at_the_last_step(entries):
    log = []
    _segment(entries, log, ["c", "refuse"])()
    assert log == [0, "1py"]


def test_errors_propagate_and_stop_the_run(entries):
    log = []
    seg = _segment(entries, log, ["c", "c", "c"])
    seg.makers = (seg.makers[0], lambda: [(entries["fail"], (), None)], seg.makers[2])
    with pytest.raises(ValueError, match="the entry failed"):
        seg()
    assert log == [0]
    log.clear()

    def boom():
        raise KeyError("python step")
    seg = _segment(entries, log, ["c", "c"])
    seg.makers = (lambda: [(boom, (), None)], seg.makers[1])
    with pytest.raises(KeyError, match="python step"):
        seg()
    assert log == []


def test_a_maker_that_raised_is_asked_again(entries):
    log, asked = [], []

    def maker():
        asked.append(1)
        if len(asked) == 1:
            raise RuntimeError("not yet")
        return [(entries["log"], (log, 0), None)]
    seg = segments.Segment((lambda: log.append("0py"),), (maker,))
    with pytest.raises(RuntimeError, match="not yet"):
        seg()
    seg()
    seg()
    assert log == [0, 0] and len(asked) == 2


def test_an_entry_with_arguments_of_the_wrong_kind(entries):
    log = []
    seg = _segment(entries, log, ["refuse"])
    seg.makers = (lambda: [(entries["refuse"], ((), "two"), None)],)
    with pytest.raises(TypeError):
        seg()


# --- which lines the emitter gathers --------------------------------------------------

def _split(body, params=("x",)):
    class Kernels:
        names = [("kernel1", "geon_group1")]
    return segments.split(["    " + ln for ln in body], list(params), Kernels())


def test_split_gathers_runs_of_lines_that_read_only_module_names():
    body = ["_conv_forward(x, w0, a0, (1, 1), ((0, 0), (0, 0)), (1, 1), 1, _conv_ws)",
            "# a comment before the run",
            "kernel1(((a0, b0, a1, ), 0, 64))",
            "# a comment inside the run",
            "np.add(a1, c0, a2)   # Add, File \"m.py\", line 3",
            "_conv_forward(a2, w1, a3, (1, 1), ((0, 0), (0, 0)), (1, 1), 1, _conv_ws)",
            "t = _empty((2, 3), _rdt0)",
            "np.add(a3, c0, t)",
            "_r = t"]
    out, defs = _split(body)
    src = "\n".join(defs)
    # the first line reads the feed x and the last two a local: outside the run
    assert out[0].strip().startswith("_conv_forward(x,") and out[1].strip() == body[1]
    assert out[2].strip().startswith("_seg0()")
    assert [ln.strip() for ln in out[3:]] == body[6:]
    assert "lambda: _conv_step(a2, w1, a3," in src
    assert "lambda: _c_step(kernel1, ((a0, b0, a1, ), 0, 64))," in src
    assert "lambda: _np_step(np.add, (a1, c0, a2, ))," in src
    assert "# a comment inside the run" in src
    compile("\n".join(defs), "<test>", "exec")


def test_split_leaves_short_runs_and_dynamic_arguments_alone():
    # one line that can be a C entry: no segment (np.maximum has no entry)
    body = ["_conv_forward(a2, w1, a3, (1, 1), ((0, 0), (0, 0)), (1, 1), 1, _conv_ws)",
            "np.add(a3, f(c0), a4)", "np.maximum(a3, c0, a4)"]
    assert _split(body) == (["    " + ln for ln in body], [])
    # NumPy's product, copy and arithmetic may be entries (np_step): two make a run
    body = ["np.matmul(a1, w1, out=a2)", "np.add(a2, c0, a2)"]
    assert _split(body)[0] == ["    _seg0()   # 2 lines as one run (see _seg0 below)"]
    body = ["np.matmul(a1, w1, out=a2)", "np.maximum(a2, c0, a2)"]
    assert _split(body) == (["    " + ln for ln in body], [])
    # a NumPy call whose argument is computed at each call is a line of Python
    body = ["kernel1(((a0, b0, a1, ), 0, 64))", "np.add(a1, f(c0), a2)",
            "kernel1(((a0, b0, a1, ), 0, 64))", "np.multiply(a1, a1, out=a2)",
            "np.matmul(a1, a1, out=a2, casting='unsafe')"]
    src = "\n".join(_split(body)[1])
    assert "    None," in src and "_np_step(np.multiply, (a1, a1, ), out=a2)" in src
    assert src.count("    None,") == 2
    # an index may give a copy (a scalar, gathered rows): only slices are taken as
    # views; two statements on one line stay out of any run
    body = ["kernel1(((a0, b0, a1, ), 0, 64))", "kernel1(((a0, b0, a1, ), 0, 64))",
            "np.multiply(a1, s[0], out=a2)", "np.multiply(a1, s[..., 1:3, None], out=a2)",
            "np.add(a1, s[[0, 1]], a2)",
            "kernel1(((a0, b0, a1, ), 0, 64)); kernel1(((a0, b0, a1, ), 0, 32))",
            "kernel1(((a0, b0, a1, ), 0, 64))"]
    out, defs = _split(body)
    src = "\n".join(defs)
    assert src.count("    None,") == 2 and "_np_step(np.multiply, (a1, s[..., 1:3, None]" in src
    assert out[0].strip().startswith("_seg0()")
    assert [ln.strip() for ln in out[1:]] == body[5:]


def test_split_keeps_lines_that_bind_or_read_locals_in_run():
    body = ["kernel1(((a0, b0, a1, ), 0, 64))", "kernel1(((a0, b0, a1, ), 0, 64))",
            "n = len(a0)", "kernel1(((a0, b0, a1, ), 0, n))",
            "_run_blocks(lambda _lo, _hi: kernel1(((a0, b0, a1, ), _lo, _hi)), 64, 8,"
            " ((),) * 2)",
            "kernel1(((a0, b0, a1, ), 0, 64))", "kernel1(((a0, b0, a1, ), 0, 64))"]
    out, defs = _split(body)
    assert out[0].strip().startswith("_seg0()") and out[1].strip() == "n = len(a0)"
    assert out[2].strip() == body[3]
    # the lambda's own parameters are not the run's locals
    assert out[3].strip().startswith("_seg1()") and len(out) == 4
    assert "lambda: _run_blocks(lambda _lo, _hi:" in "\n".join(defs)


def test_numpy_step_out_keyword():
    a, b, out = np.array([1.0, 5.0]), np.array([3.0, 2.0]), np.empty(2)
    (fn, args, _), = segments.np_step(np.maximum, (a, b), out=out)
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # (NumPy deprecates out by position here)
        assert fn(*args) is out
    np.testing.assert_array_equal(out, [3.0, 5.0])


# --- the copy entry ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def library():
    """The runner's library: its entries by name."""
    lib = segments._library()
    if lib is None:
        pytest.skip("no working C compiler for the runner")
    return lib


@pytest.fixture
def copy(library):
    return library["copy"]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int16, np.complex128, bool])
def test_copy_entry_through_any_strides(copy, dtype):
    rng = np.random.default_rng(3)
    base = (rng.standard_normal((4, 6, 5, 8)) * 10).astype(dtype)
    sources = [base, base.transpose(2, 0, 3, 1), base[:, ::-2, 1:4], base[::-1, :, :, ::3],
               base[1:2, 3:4], base[:0], base[2, 1, 3, 4], base.transpose(3, 1, 0, 2)[::2]]
    for src in sources:
        for dst in (np.empty(src.shape, dtype), np.empty(src.shape[::-1], dtype).T):
            dst[...] = 0
            assert copy(((dst, src),)) == 0
            np.testing.assert_array_equal(dst, src)


def test_copy_entry_refuses_what_it_cannot_copy(copy):
    a = np.arange(24.0).reshape(4, 6)
    for dst, src in ((a[:, 1:], a[:, :-1]),                     # overlapping
                     (np.empty((6, 4)), a),                       # shapes differ
                     (np.empty((4, 6), np.float32), a),          # item sizes differ
                     (np.empty((1,) * 9), np.ones((1,) * 9))):   # over 8 dimensions
        before = dst.copy()
        assert copy(((dst, src),)) == 2
        np.testing.assert_array_equal(dst, before)
    with pytest.raises(ValueError, match="read-only"):   # the buffer's own error
        copy(((np.frombuffer(b"\0" * 24), np.ones(3)),))


def test_copy_steps_of_copyto_lines(copy):
    dst, src = np.empty((3, 4)), np.arange(12.0).reshape(4, 3).T
    (fn, args, _), = segments.np_step(np.copyto, (dst, src))
    assert fn is copy
    (fn, _, _), = segments.np_step(np.copyto, (dst, src[0]))   # broadcast: NumPy's
    assert fn is np.copyto


def test_the_benchmark_compares_values_and_times_both():
    pytest.importorskip("torch", reason="benchmarks.segments builds its models in torch")
    pytest.importorskip("onnx", reason="benchmarks.segments exports them to ONNX")
    from benchmarks import segments as bench
    r = bench.run_model("lstm", 2)   # (the zoo's model that needs torch alone)
    assert r["difference"] < 1e-5 and r["off"][0] > 0 and r["on"][0] > 0


# --- the binary entry -------------------------------------------------------------------

@pytest.fixture
def binary(library):
    return library["binary"]


def _specials(rng, shape, dtype):
    x = (rng.standard_normal(shape) * 3).astype(dtype)
    flat = x.reshape(-1)
    flat[::7] = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -1e-310],
                         dtype)[np.arange(len(flat[::7])) % 7]
    return x


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("fn", [np.add, np.subtract, np.multiply, np.divide])
def test_binary_entry_gives_numpys_bits(fn, dtype, binary):
    rng = np.random.default_rng(7)
    big = _specials(rng, (3, 5, 8, 6), dtype)
    cases = [(big, _specials(rng, (3, 5, 8, 6), dtype)),          # contiguous
             (big, _specials(rng, (6,), dtype)),                    # a row broadcast
             (_specials(rng, (5, 1, 1), dtype), big),               # the left broadcast
             (big[:, ::-2, 1:7],                                    # any strides
              _specials(rng, (6, 3, 6, 3), dtype).transpose(3, 1, 0, 2)[:, :, ::-1]),
             (big, np.array(2.5, dtype)),                           # a 0-d array
             (big[..., :0], big[..., :0])]                          # nothing
    for a, b in cases:
        shape = np.broadcast_shapes(a.shape, b.shape)
        out = np.full(shape, 7, dtype)
        (entry, args, _), = segments.np_step(fn, (a, b, out))
        assert entry is binary
        with np.errstate(all="ignore"):
            assert entry(args) == 0
            want = fn(a, b)
        np.testing.assert_array_equal(out.view(f"u{out.itemsize}"),
                                      want.view(f"u{want.itemsize}"))


def test_binary_entry_in_place_and_refusals(binary):
    rng = np.random.default_rng(8)
    a, b = rng.standard_normal((4, 6)), rng.standard_normal(6)
    want = a - b
    (entry, args, _), = segments.np_step(np.subtract, (a, b, a))   # out is a itself
    assert entry(args) == 0
    np.testing.assert_array_equal(a, want)
    c, row = rng.standard_normal((4, 7)), np.broadcast_to(b, (4, 6))
    before = c.copy()
    for args in (((c[:, 1:], c[:, :-1], row), 0, 8),      # out overlaps a, shifted
                 ((c[:, 1:], row, c[:, :-1]), 2, 8),      # out overlaps b, shifted
                 ((c[:, 1:], c[:, 1:], row), 0, 4),       # another item size
                 ((c[:, 1:], b[None, :], c[:, :6]), 0, 8)):   # another shape
        assert binary(args) == 2
        np.testing.assert_array_equal(c, before)
    # mixed dtypes, Python scalars, other functions: NumPy's own call
    x32 = np.ones(3, np.float32)
    for fn, args in ((np.add, (x32, np.ones(3), np.empty(3))), (np.add, (x32, 2.0, x32)),
                     (np.maximum, (x32, x32, x32)), (np.add, (np.ones(3, int),) * 3)):
        assert segments.np_step(fn, args)[0][0] is fn


def test_the_take_entry_against_special_take():
    """x[:, idx] by the C entry: negative indices from the end, rows of any length,
    the same values as special.take; an index out of range gets special.take's error
    and leaves out unwritten by the entry; arrays it does not take (int32 indices, a
    strided table) are special.take's."""
    from geon.errors import IndexOutOfRangeError
    from geon.op_graph import special
    rng = np.random.default_rng(7)
    for shape, idx in [((1, 1000, 128), rng.integers(-1000, 1000, 64)),
                       ((3, 7), np.array([6, -7, 0, 3])), ((2, 5, 3, 2), np.arange(5)),
                       ((2, 4, 6), np.zeros(0, np.int64))]:
        x = rng.standard_normal(shape).astype(np.float32)
        idx = idx.astype(np.int64)
        want = special.take(x, idx, "t")
        out = np.full(want.shape, np.nan, np.float32)
        (fn, args, _), = segments.take_step(x, idx, "t", out=out)
        assert fn(args) == 0 and np.array_equal(out, want)
        out[...] = np.nan
        assert segments.take(x, idx, "t", out=out) is out and np.array_equal(out, want)
    x, out = np.ones((1, 10, 4)), np.full((1, 2, 4), 7.0)
    (fn, args, _), = segments.take_step(x, np.array([1, 10]), "t", out=out)
    assert fn(args) == 2 and np.all(out == 7.0)
    with pytest.raises(IndexOutOfRangeError, match="Gather_3: index 10 is out of range"):
        segments.take(x, np.array([1, 10]), "Gather_3", out=out)
    assert segments.take_step(x, np.array([1, 2], np.int32), "t", out=out) is None
    objects = np.array([[None, "a", 3]], object)   # (references: NumPy's copy)
    assert segments.take_step(objects, np.array([2, 0]), "t",
                              out=np.empty((1, 2), object)) is None
    assert segments.take_step(np.ones((1, 10, 8))[:, :, ::2], np.array([1, 2]), "t",
                              out=out) is None
    (fn, args, _), = segments.take_step(x, np.array([1, 2]), "t", out=x[:, :2])
    assert fn(args) == 2   # (out overlapping the table: refused)
    assert np.array_equal(segments.take(np.arange(10)[None], np.array([3, -1]), "t",
                                        out=np.empty((1, 2), np.int64)), [[3, 9]])
    # a computation without C (compiled=False: its workspace's direct is False)
    from geon.transformers.numpy import conv
    no_c = conv.Workspace(direct=False)
    assert segments.take_step(x, np.array([1, 2]), "t", no_c, out=out) is None
    assert segments.take_step(x, np.array([1, 2]), "t", conv.Workspace(), out=out)
