"""Hostile ONNX files (issue 31): every one ends in ``InvalidOnnxModel`` or
``UnsupportedOnnxOp``, in bounded memory and time, and the class labels of the losses
are checked.

A file whose import could allocate gigabytes or block is imported in a child process
whose address space is limited (``RLIMIT_AS``: what the child holds after importing
geon and onnx, plus 1 GiB) and whose run time is limited, so a regression fails the
test instead of exhausting the machine or hanging it. The other checks lower the
limit on values computed at import (``loading.MAX_TENSOR_BYTES``) and measure the
import's peak allocation with ``tracemalloc`` (NumPy reports its arrays to it).
"""

import json
import os
import stat
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import geon as be

try:
    import onnx
    from onnx import TensorProto, helper, numpy_helper
except ImportError:
    pytest.skip("the ONNX frontend tests need the onnx package (pip install onnx)",
                allow_module_level=True)

import geon.frontends.onnx as gx  # noqa: E402
from geon.frontends.onnx import loading  # noqa: E402


def _model(nodes, inputs, outputs, initializers=(), opset=20):
    graph = helper.make_graph(nodes, "hostile", inputs, outputs,
                              initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _vi(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def _const(name, array):
    return helper.make_node("Constant", [], [name],
                            value=numpy_helper.from_array(np.asarray(array), name + "_v"))


_CHILD = textwrap.dedent("""
    import json, resource, sys, tracemalloc
    import geon.frontends.onnx as gx
    from geon.frontends.onnx import loading
    import onnx  # noqa: F401 - loaded before the limit, as an import would load it
    with open("/proc/self/statm") as f:
        held = int(f.read().split()[0]) * resource.getpagesize()
    limit = held + (1 << 30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    default = loading.MAX_TENSOR_BYTES
    for name, path, max_bytes in json.loads(sys.argv[1]):
        loading.MAX_TENSOR_BYTES = max_bytes or default
        tracemalloc.start()
        try:
            gx.import_model(path)
            out = {"error": None, "message": ""}
        except (gx.InvalidOnnxModel, gx.UnsupportedOnnxOp) as e:
            out = {"error": type(e).__name__, "message": str(e)}
        except BaseException as e:  # what escapes the importer's own errors
            out = {"error": "escaped " + type(e).__name__, "message": str(e)[:300]}
        out["peak"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        print(json.dumps([name, out]), flush=True)
""")


def _import_in_child(cases, timeout=120):
    """``{name: {"error": class name or None, "message", "peak": bytes}}`` of importing
    each ``(name, path, max_bytes)`` (``max_bytes``: ``MAX_TENSOR_BYTES`` for it, or
    ``None``) in one child process with 1 GiB of address space beyond what it holds
    once geon and onnx are loaded, within ``timeout`` seconds in all."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the memory-limited child process reads /proc (Linux)")
    try:
        done = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(cases)],
                              capture_output=True, text=True, timeout=timeout)
        stdout, stderr = done.stdout, done.stderr
    except subprocess.TimeoutExpired as e:
        stdout = e.stdout.decode() if isinstance(e.stdout, bytes) else e.stdout or ""
        stderr = f"timed out after {timeout} s"
    results = dict(json.loads(line) for line in stdout.splitlines() if line.startswith("["))
    for name, _, _ in cases:  # a case the child never finished (killed, or hanging)
        results.setdefault(name, {"error": "not finished", "message": stderr[-2000:],
                                  "peak": None})
    return results


#: ``{name: (model, expected error class or None, [words of the message], max bytes)}``,
#: filled by ``_hostile`` as the module is read; imported once, in one child process.
HOSTILE = {}


def _hostile(name, model, *words, cls="InvalidOnnxModel", max_bytes=None):
    HOSTILE[name] = (model, cls, words, max_bytes)
    return name


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hostile")
    cases = []
    for name, (model, _, _, max_bytes) in HOSTILE.items():
        path = folder / f"{name}.onnx"
        path.write_bytes(model.SerializeToString())
        cases.append((name, str(path), max_bytes))
    return _import_in_child(cases)


def _check(imported, name):
    """The case ended in its error (or imported, for ``None``), naming its words, and
    nothing of the refused size was allocated (a peak under 64 MiB)."""
    _, cls, words, _ = HOSTILE[name]
    out = imported[name]
    assert out["error"] == cls, out
    for w in words:
        assert w in out["message"], (w, out["message"])
    assert out["peak"] < 64 << 20, out["peak"]
    return out["message"]


# --- 1. Range: the length first -----------------------------------------------------------

def _range_model(start, limit, delta, elem):
    return _model([_const("s", start), _const("l", limit), _const("d", delta),
                   helper.make_node("Range", ["s", "l", "d"], ["y"], name="rng")],
                  [], [_vi("y", [None], elem)])


RANGES = [
    _hostile("range_int_2_40", _range_model(np.int64(0), np.int64(2 ** 40), np.int64(1),
                                            TensorProto.INT64),
             "Range node 'rng'", "the range", "limit", "refused before computing it"),
    _hostile("range_float_1e-12", _range_model(np.float32(0), np.float32(1),
                                               np.float32(1e-12), TensorProto.FLOAT),
             "Range node 'rng'", "the range", "limit", "refused before computing it"),
    _hostile("range_double_1e-12", _range_model(np.float64(-1), np.float64(1),
                                                np.float64(1e-12), TensorProto.DOUBLE),
             "Range node 'rng'", "the range", "limit", "refused before computing it"),
    _hostile("range_no_finite_length", _range_model(np.float64(-1e308), np.float64(1e308),
                                                    np.float64(1e-300), TensorProto.DOUBLE),
             "Range node 'rng'", "no finite length"),
    _hostile("range_delta_0", _range_model(np.int64(0), np.int64(5), np.int64(0),
                                           TensorProto.INT64),
             "Range node 'rng'", "delta 0", cls="UnsupportedOnnxOp"),
]


@pytest.mark.parametrize("name", RANGES)
def test_range_length_is_computed_and_refused_before_allocating(imported, name):
    assert len(HOSTILE[name][0].SerializeToString()) < 300  # a tiny file
    _check(imported, name)


def test_range_results_still_match_onnx():
    for args, elem in (((3, 20, 4), TensorProto.INT64), ((10, 1, -3), TensorProto.INT32),
                       ((0.5, 2.0, 0.25), TensorProto.FLOAT), ((2, 1, 1), TensorProto.INT64)):
        dt = helper.tensor_dtype_to_np_dtype(elem)
        g = gx.import_model(_range_model(*(np.asarray(a, dt) for a in args), elem))
        y = g.empty_outputs[0] if g.outputs[0] is None else be.evaluate(g.outputs[0])
        assert np.array_equal(y, np.arange(*args, dtype=dt)), (args, y)


# --- 2. Tile: no wrap-around in the size check --------------------------------------------

TILE = _hostile("tile_2_32_squared", _model(
    [_const("x", np.ones((1, 1), np.int64)),
     _const("reps", np.array([2 ** 32, 2 ** 32], np.int64)),
     helper.make_node("Tile", ["x", "reps"], ["y"], name="tile")],
    [], [_vi("y", [None, None], TensorProto.INT64)]),
    "Tile node 'tile'", str([2 ** 32, 2 ** 32]), "limit")


def test_tile_by_2_32_squared_is_refused_naming_the_node(imported):
    _check(imported, TILE)


# --- 3. Trilu: no mask at import ----------------------------------------------------------

# 32768 x 32768 float32 is 4 GiB, at the limit, so the input is accepted; the import must
# build ops only (the mask used to be an 8 GiB float64 array).
TRILU = _hostile("trilu_32768", _model(
    [helper.make_node("Trilu", ["x"], ["y"], name="tri", upper=0)],
    [_vi("x", [32768, 32768])], [_vi("y", [32768, 32768])], opset=14), cls=None)


def test_trilu_of_a_large_declared_input_allocates_no_mask(imported):
    _check(imported, TRILU)


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [-4, -1, 0, 2, 7])
def test_trilu_matches_onnx_reference(upper, k):
    from onnx.reference import ReferenceEvaluator
    m = _model([_const("k", np.array(k, np.int64)),
                helper.make_node("Trilu", ["x", "k"], ["y"], upper=upper)],
               [_vi("x", [2, 4, 6])], [_vi("y", [2, 4, 6])], opset=14)
    x = np.arange(48, dtype=np.float32).reshape(2, 4, 6) - 20
    (got,) = gx.import_model(m).computation()(x)
    (want,) = ReferenceEvaluator(m).run(None, {"x": x})
    assert np.array_equal(got, want)


# --- 4. External data: regular files only -------------------------------------------------

def _external_model(folder, location, dims=(4,)):
    t = onnx.TensorProto(name="w", data_type=TensorProto.FLOAT, dims=list(dims))
    t.data_location = TensorProto.EXTERNAL
    n = int(np.prod(dims)) * 4
    for k, v in (("location", location), ("offset", "0"), ("length", str(n))):
        e = t.external_data.add()
        e.key, e.value = k, v
    m = _model([helper.make_node("Identity", ["w"], ["y"])], [], [_vi("y", list(dims))],
               [t])
    path = folder / "model.onnx"
    path.write_bytes(m.SerializeToString())
    return path


def test_external_data_location_with_a_nul_byte_is_refused(tmp_path):
    with pytest.raises(gx.InvalidOnnxModel, match="not a relative path"):
        gx.import_model(_external_model(tmp_path, "w\0.bin"))
    with pytest.raises(gx.InvalidOnnxModel, match="cannot read ONNX model"):
        gx.import_model(str(tmp_path / "model\0.onnx"))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_external_data_from_a_fifo_is_refused_without_blocking(tmp_path):
    """A zero-size tensor whose data file is a FIFO: opening it for reading used to
    wait for a writer forever."""
    os.mkfifo(tmp_path / "pipe.bin")
    path = _external_model(tmp_path, "pipe.bin", dims=(0,))
    out = _import_in_child([("fifo", str(path), None)], timeout=60)["fifo"]
    assert out["error"] == "InvalidOnnxModel", out
    assert "not a regular file" in out["message"] and "'pipe.bin'" in out["message"]


def test_external_data_from_a_directory_or_device_is_refused(tmp_path):
    (tmp_path / "dir.bin").mkdir()
    for dims in ((0,), (4,)):
        with pytest.raises(gx.InvalidOnnxModel, match="external data"):
            gx.import_model(_external_model(tmp_path, "dir.bin", dims))
    try:  # a character device (/dev/zero's numbers) inside the folder: root only
        os.mknod(tmp_path / "zero.bin", stat.S_IFCHR | 0o600, os.makedev(1, 5))
    except (OSError, AttributeError):
        return
    with pytest.raises(gx.InvalidOnnxModel, match="not a regular file"):
        gx.import_model(_external_model(tmp_path, "zero.bin", dims=(0,)))


def test_external_data_link_inside_the_folder_is_read(tmp_path):
    (tmp_path / "w.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    os.symlink("w.bin", tmp_path / "alias.bin")
    g = gx.import_model(_external_model(tmp_path, "alias.bin"))
    assert be.evaluate(g.outputs[0]).tolist() == [0, 1, 2, 3]


# --- 5. Every folding bounded before it computes ------------------------------------------

HUGE = [2 ** 32, 2 ** 32]  # 2**64 elements: 0 in an int64 product


def _shape_model(op):
    shape = _const("shape", np.array(HUGE, np.int64))
    if op == "ConstantOfShape":
        nodes = [shape, helper.make_node(op, ["shape"], ["y"], name="n")]
    else:
        nodes = [shape, _const("x", np.ones((1, 1), np.float32)),
                 helper.make_node(op, ["x", "shape"], ["y"], name="n")]
    return _model(nodes, [], [_vi("y", [None, None])])


SHAPES = [_hostile(f"shape_{op}", _shape_model(op), f"{op} node 'n'", str(HUGE))
          for op in ("ConstantOfShape", "Expand", "Reshape")]


@pytest.mark.parametrize("name", SHAPES)
def test_shape_arguments_are_counted_exactly(imported, name):
    _check(imported, name)


def _doubling_model():
    nodes = [_const("a0", np.zeros(1 << 14, np.int64))]  # 128 KiB
    for k in range(4):
        nodes.append(helper.make_node("Concat", [f"a{k}", f"a{k}"], [f"a{k + 1}"], axis=0,
                                      name=f"double{k}"))
    return _model(nodes, [], [_vi("a4", [None], TensorProto.INT64)])


FOLDS = [
    # Doubling a value known at import (limit lowered to 1 MiB): each result is under
    # the limit on one tensor, but all of them together are not, and the import stops.
    _hostile("concat_doubling", _doubling_model(), "Concat node 'double2'",
             "values computed at import", str(1 << 20), max_bytes=1 << 20),
    _hostile("concat_join", _model(
        [_const("x", np.zeros(1 << 16, np.int8)),
         helper.make_node("Concat", ["x"] * 32, ["y"], axis=0, name="join")],
        [], [_vi("y", [None], TensorProto.INT8)]),
        "Concat node 'join'", str([1 << 21]), max_bytes=1 << 20),
    _hostile("cast_widening", _model(
        [_const("x", np.zeros(1 << 18, np.int8)),
         helper.make_node("Cast", ["x"], ["y"], to=TensorProto.INT64, name="widen")],
        [], [_vi("y", [None], TensorProto.INT64)]),
        "Cast node 'widen'", "int64", max_bytes=1 << 20),
    _hostile("mod_broadcast", _model(
        [_const("a", np.ones((1 << 17, 1), np.int64)),
         _const("b", np.ones((1, 1 << 17), np.int64)),
         helper.make_node("Mod", ["a", "b"], ["y"], name="mod")],
        [], [_vi("y", [None, None], TensorProto.INT64)]),
        "Mod node 'mod'", str([1 << 17, 1 << 17])),
    # A declared (0, 2**40) input holds nothing; its sum over axis 0, 2**40 zeros.
    _hostile("empty_reduction", _model(
        [helper.make_node("ReduceSum", ["x"], ["y"], keepdims=0, axes=[0], name="sum")],
        [_vi("x", [0, 1 << 40])], [_vi("y", [1 << 40])], opset=11),
        "ReduceSum node 'sum'", "limit"),
    _hostile("pad", _model(
        [_const("pads", np.array([0, 1 << 40, 0, 0], np.int64)),
         helper.make_node("Pad", ["x", "pads"], ["y"], name="pad")],
        [_vi("x", [2, 2])], [_vi("y", [None, None])]),
        "Pad node 'pad'", "limit"),
    _hostile("gather", _model(
        [helper.make_node("Gather", ["x", "i"], ["y"], name="gather")],
        [_vi("x", [4, 1 << 10]), _vi("i", [1 << 16, 1 << 8], TensorProto.INT64)],
        [_vi("y", [None, None, None])]),
        "Gather node 'gather'", "limit"),
    _hostile("average_pool_mask", _model(
        [helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[2, 2],
                          pads=[0, 0, 1 << 20, 1 << 20], dilations=[2, 2], name="avg")],
        [_vi("x", [1, 1, 4, 4])], [_vi("y", [None] * 4)], opset=19),
        "AveragePool node 'avg'", "mask of the padded input"),
    _hostile("max_pool_indices", _model(
        [helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[1 << 9, 1 << 9],
                          pads=[(1 << 9) - 2] * 4, name="maxp")],
        [_vi("x", [1, 1, 4, 4])],
        [_vi("y", [None] * 4), _vi("i", [None] * 4, TensorProto.INT64)], opset=12),
        "MaxPool node 'maxp'", "positions of every kernel offset"),
    # 2**20 windows of 2**20 taps: geon's check that each window reads an input element
    # would compute all their positions.
    _hostile("max_pool_windows", _model(
        [helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[1 << 20], strides=[1],
                          pads=[(1 << 20) - 2] * 2, name="maxp")],
        [_vi("x", [1, 1, 4])], [_vi("y", [None] * 3)], opset=12),
        "MaxPool node 'maxp'", "window taps of spatial dimension 0"),
]


@pytest.mark.parametrize("name", FOLDS)
def test_values_computed_at_import_are_bounded_before_computing(imported, name):
    _check(imported, name)


def test_small_folds_still_happen():
    """The shape subgraphs legitimate models fold are unaffected."""
    m = _model([_const("n", np.array([3], np.int64)),
                helper.make_node("ConstantOfShape", ["n"], ["z"],
                                 value=numpy_helper.from_array(np.array([2], np.int64))),
                helper.make_node("Concat", ["z", "n"], ["s"], axis=0),
                helper.make_node("Cast", ["s"], ["y"], to=TensorProto.INT32)],
               [], [_vi("y", [4], TensorProto.INT32)])
    g = gx.import_model(m)
    assert be.evaluate(g.outputs[0]).tolist() == [2, 2, 2, 3]


# --- 6. The class labels of the losses ----------------------------------------------------

def _loss_model(op, ignore_index=None, reduction="mean", weight=False, labels=None,
                cast=False):
    attrs = {"reduction": reduction}
    if ignore_index is not None:
        attrs["ignore_index"] = ignore_index
    ins = ["x", "t"] + (["w"] if weight else [])
    nodes = [helper.make_node(op, ins, ["loss"], name="loss_node", **attrs)]
    inputs = [_vi("x", [4, 3])]
    inits = [numpy_helper.from_array(np.array([0.2, 0.5, 1.5], np.float32), "w")] \
        if weight else []
    if labels is not None:
        inits.append(numpy_helper.from_array(np.asarray(labels, np.int64), "t"))
    elif cast:
        nodes.insert(0, helper.make_node("Cast", ["t32"], ["t"], to=TensorProto.INT64))
        inputs.append(_vi("t32", [4], TensorProto.INT32))
    else:
        inputs.append(_vi("t", [4], TensorProto.INT64))
    out = [_vi("loss", [4] if reduction == "none" else [])]
    return _model(nodes, inputs, out, inits, opset=13)


def _reference(m, feeds):
    from onnx.reference import ReferenceEvaluator
    return ReferenceEvaluator(m).run(None, feeds)


LOSSES = ["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"]
X = np.log(np.array([[0.2, 0.3, 0.5], [0.6, 0.3, 0.1], [0.25, 0.25, 0.5], [0.1, 0.8, 0.1]],
                    np.float32))


@pytest.mark.parametrize("op", LOSSES)
def test_fed_label_out_of_range_names_the_value_and_the_class_count(op):
    f = gx.import_model(_loss_model(op)).computation()
    with pytest.raises(be.IndexOutOfRangeError) as e:
        f(X, np.array([0, 7, 1, 2], np.int64))
    msg = str(e.value)
    assert "label 7" in msg and "3 classes" in msg and "loss_node" in msg and op in msg
    with pytest.raises(be.IndexOutOfRangeError, match=r"label -1 .*no ignore_index"):
        f(X, np.array([0, 1, -1, 2], np.int64))


@pytest.mark.parametrize("op", LOSSES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_ignore_index_is_honoured_and_matches_onnx(op, reduction):
    for ii, t in ((-1, [0, -1, 2, 1]), (5, [5, 1, 2, 5]), (1, [1, 1, 0, 2])):
        m = _loss_model(op, ignore_index=ii, reduction=reduction, weight=True)
        (got,) = gx.import_model(m).computation()(X, np.array(t, np.int64))
        want = _reference(m, {"x": X, "t": np.array(t, np.int64)})[0]
        assert np.allclose(got, want, rtol=1e-5, atol=1e-6), (ii, t, got, want)
    f = gx.import_model(_loss_model(op, ignore_index=-1, reduction=reduction)).computation()
    with pytest.raises(be.IndexOutOfRangeError, match=r"label 3 .*ignore_index is -1"):
        f(X, np.array([0, -1, 3, 1], np.int64))


@pytest.mark.parametrize("op", LOSSES)
def test_weighted_mean_is_over_the_targets_not_ignored(op):
    """ONNX's mean: sum(w[t] * loss) / sum(w[t]) over the targets not ignored, not a
    plain mean over all of them."""
    t = np.array([0, 2, 1, 2], np.int64)
    w = np.array([0.2, 0.5, 1.5], np.float32)
    logp = X if op == "NegativeLogLikelihoodLoss" else \
        X - np.log(np.exp(X).sum(1, keepdims=True))
    keep = t != 1
    want = -(w[t] * logp[np.arange(4), t])[keep].sum() / w[t][keep].sum()
    (got,) = gx.import_model(_loss_model(op, ignore_index=1, weight=True)).computation()(X, t)
    assert np.isclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("op", LOSSES)
def test_labels_known_at_import_are_checked_at_import(op):
    with pytest.raises(gx.InvalidOnnxModel, match=r"loss_node.*label 7 .*3 classes"):
        gx.import_model(_loss_model(op, labels=[0, 1, 7, 2]))
    g = gx.import_model(_loss_model(op, labels=[0, 1, 9, 2], ignore_index=9))
    assert np.isfinite(g.computation()(X)[0])


@pytest.mark.parametrize("op", LOSSES)
def test_computed_labels_are_checked_when_the_model_runs(op):
    f = gx.import_model(_loss_model(op, cast=True)).computation()
    assert np.isfinite(f(X, np.array([0, 1, 2, 1], np.int32))[0])
    with pytest.raises(be.IndexOutOfRangeError, match=r"label 3 .*3 classes"):
        f(X, np.array([0, 1, 3, 1], np.int32))


def test_graph_input_labels_declare_their_value_domain():
    """A computation built by hand from ``g.outputs`` checks the labels too."""
    g = gx.import_model(_loss_model("NegativeLogLikelihoodLoss", ignore_index=-1))
    comp = be.make_transformer("numpy").computation(g.outputs[0], *g.inputs)
    assert np.isfinite(comp(X, np.array([0, -1, 2, 1], np.int64)))
    with pytest.raises(be.IndexOutOfRangeError, match="7"):
        comp(X, np.array([0, 7, 2, 1], np.int64))


def test_label_check_is_one_function():
    """The one check of loss labels at import and in OnnxGraph.computation."""
    from geon.frontends.onnx.importer import check_labels
    check_labels(np.array([0, 2, -100]), 3, -100, "x")
    check_labels(np.array([0, 2], np.uint8), 3, -1, "x")
    with pytest.raises(be.IndexOutOfRangeError, match=r"x: label 3 \(at position \(1, 0\)\)"):
        check_labels(np.array([[0], [3]]), 3, None, "x")
    with pytest.raises(be.IndexOutOfRangeError, match="label 300"):
        check_labels(np.array([0, 300], np.uint64), 3, -1, "x")
    with pytest.raises(be.IndexOutOfRangeError, match="label 44"):  # not 300 wrapped
        check_labels(np.array([0, 44], np.uint8), 3, 300, "x")
    with pytest.raises(be.IndexOutOfRangeError, match=f"label {2 ** 64 - 1}"):
        check_labels(np.array([2 ** 64 - 1], np.uint64), 3, -1, "x")
