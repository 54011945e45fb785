"""Run the ONNX node test cases of the installed ``onnx`` package through geon.

``python -m geon.frontends.onnx.conformance [--ops Add,Relu] [--rst FILE] [--json FILE]``

Each case (``onnx.backend.test.case.node.collect_testcases``: a one-node model, or a
function's expansion, with inputs and expected outputs) is imported, run on the NumPy
transformer and compared at the tolerances the case declares. The result of a case is
``passed``, ``failed`` (wrong values, or an error while running) or ``unsupported``
(the importer refused it with :class:`UnsupportedOnnxOp`), with the reason.
"""

import argparse
import json
import re
import sys
import warnings

import numpy as np

from geon.frontends.onnx.importer import import_model
from geon.frontends.onnx.loading import UnsupportedOnnxOp, narrow_format, onnx_module
from geon.frontends.onnx.ops import supported
from geon.frontends.onnx.runtime_values import import_runtime_values

#: The operators issue 13 asks for: the acceptance counts the cases of these.
REQUIRED = (
    "Add Sub Mul Div Pow Neg Abs Sqrt Exp Log Tanh Sigmoid Relu LeakyRelu Elu Selu Gelu Erf "
    "Softplus HardSigmoid Clip Min Max Sum Mean Equal Less LessOrEqual Greater "
    "GreaterOrEqual Where MatMul Gemm Conv ConvTranspose MaxPool AveragePool "
    "GlobalAveragePool BatchNormalization LayerNormalization Softmax LogSoftmax ReduceSum "
    "ReduceMean ReduceMax ReduceMin ReduceProd ReduceL2 ReduceLogSumExp ArgMax ArgMin "
    "Reshape Flatten Transpose Squeeze Unsqueeze Concat Split Slice Gather Pad Tile Expand "
    "Shape Identity Cast Constant ConstantOfShape Dropout CumSum TopK LSTM GRU").split()

#: Operators outside ``REQUIRED`` every case of which the test suite also runs against
#: the committed table (issue 31): the losses, whose weighted mean over the targets not
#: ignored only these cases check against ONNX's own definition.
ALSO_CHECKED = ("NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss")

#: Operators outside ``REQUIRED`` that ``torch.onnx.export`` (the TorchScript and dynamo
#: exporters) and Hugging Face models emit for real architectures (torchvision's ResNet,
#: MobileNetV3, EfficientNet, Swin, ConvNeXt and ViT; BERT, GPT-2, T5; LSTM / GRU) or
#: for the PyTorch functions they call (``index_put``, ``isnan``, ``interpolate``,
#: ``einsum``, ``scaled_dot_product_attention`` at opset 23 ...). The summary counts
#: their cases apart; tests/test_onnx_coverage.py checks every case of them.
EXPORTED = (
    "HardSwish ScatterND IsNaN IsInf Not And Or Xor Trilu Range Reciprocal Sign Sin Cos "
    "Floor Ceil Round Mod Einsum GatherElements GatherND ScatterElements "
    "InstanceNormalization GroupNormalization ReduceL1 ReduceSumSquare Resize PRelu Mish "
    "Softsign Celu Hardmax Size CastLike GlobalMaxPool Attention RMSNormalization "
    "NonZero").split()

#: Operators without a builder that the importer expands as the ONNX function their
#: schema defines, and whose every case the test suite checks too (the other function
#: operators, ``Attention`` of ``EXPORTED`` among them, are counted where listed).
FUNCTIONS_CHECKED = ("RotaryEmbedding", "SwiGLU", "CausalConvWithState", "FlexAttention",
                     "LinearAttention")


def _added():
    """The operators of the default domain with a builder in ``OPS`` (computed from the
    registered builders, never kept by hand) beyond ``REQUIRED``, ``ALSO_CHECKED`` and
    ``EXPORTED``, then ``FUNCTIONS_CHECKED``."""
    listed = set(REQUIRED) | set(ALSO_CHECKED) | set(EXPORTED)
    return tuple(op for op in supported() if op not in listed) + FUNCTIONS_CHECKED


#: The other operators geon imports (those built in geon/frontends/onnx/builders/, and
#: ``FUNCTIONS_CHECKED``): every case of them is checked too.
ADDED = _added()

#: Why the cases that do not pass are left, per operator (an operator not named here is
#: explained by the reason its first such case gives).
WHY_LEFT = {
    "Scan": "control flow: see builders/control_flow.py",
    "AffineGrid": "only the expanded cases fail: their function body computes the grid's "
                  "shape from the size input at run time, where the importer needs it "
                  "at import; the operator itself is built",
    "Range": "only the expanded cases fail: their function body is a Loop with a scan "
             "output whose length (the trip count) is computed at run time; the "
             "operator itself is built",
    "HannWindow": "only the expanded cases fail: the window's length is computed from "
                  "the size input at run time there (a shape computed at run time: "
                  "symbolic shapes are another issue's work)",
    "HammingWindow": "as HannWindow",
    "BlackmanWindow": "as HannWindow",
    "CenterCropPad": "only the expanded cases fail: the pads are computed from the shape "
                     "input at run time there (symbolic shapes: another issue)",
    "Attention": "the bfloat16 cases (single-node and expanded alike): the reference "
                 "rounds to bfloat16 after every step; geon computes in float32 and "
                 "rounds once (see Data types), which the cases' tolerance of 1e-3, "
                 "under bfloat16's resolution, tells apart",
    "DFT": "the two inverse cases: the expected values come from a float32 FFT, whose "
           "rounding near zero (1.5e-6) exceeds the cases' atol of 1e-7; geon computes "
           "the transform in float64 and is 3 times closer to the exact result "
           "(4.4e-7, the float32 rounding of the output)",
    "Mod": "float64 values computed at run time: geon has no remainder primitive; the "
           "integer types and the floats up to float32 are computed exactly from "
           "divisions and products, float64 would need one (known values fold)",
    "Dropout": "training mode with a nonzero ratio: random masks cannot match the "
               "reference's",
    "Bernoulli": "random numbers cannot match the reference's",
    "NonZero": "the result's shape depends on the values (geon compiles static shapes)",
    "Unique": "the result's shape depends on the values",
    "NonMaxSuppression": "the result's shape depends on the values",
    "BitCast": "the casts between floats and integers: reinterpreting a float's bits "
               "(NaN payloads included) needs a bit-level primitive, which geon lacks; "
               "the casts between integer types (and from bool) are built",
    "ImageDecoder": "decoding compressed images: not a tensor computation",
    "TfIdfVectorizer": "n-gram counting: not built",
    "RoiAlign": "not built (bilinear sampling at positions computed at run time, as "
                "GridSample does; detection models, not the architectures listed)",
    "DeformConv": "not built (bilinear sampling at offsets computed at run time; "
                  "torchvision's deform_conv2d)",
    "Equal": "strings: geon holds numbers only",
    "StringConcat": "strings", "StringNormalizer": "strings", "StringSplit": "strings",
    "RegexFullMatch": "strings", "LabelEncoder": "strings (and the ai.onnx.ml domain)",
    "ArrayFeatureExtractor": "the ai.onnx.ml domain: not the default domain",
    "Binarizer": "the ai.onnx.ml domain: not the default domain",
    "TreeEnsemble": "the ai.onnx.ml domain: not the default domain",
    "Adagrad": "the ai.onnx.preview.training domain (optimizers): not the default domain",
    "Adam": "the ai.onnx.preview.training domain (optimizers): not the default domain",
    "Momentum": "the ai.onnx.preview.training domain (optimizers): not the default domain",
}


def collect(ops=None):
    """``[(operator, case)]`` for the node test cases (those of ``ops`` if given).
    A function's expanded form counts under the function's operator."""
    from onnx.backend.test.case.node import collect_testcases
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases()
    single = {c.name: c.model.graph.node[0].op_type for c in cases
              if len(c.model.graph.node) == 1}
    out = []
    for c in cases:
        op = single.get(re.sub(r"_expanded(_ver\d+)?$", "", c.name)) or single.get(c.name)
        if op is None:
            op = "+".join(sorted({n.op_type for n in c.model.graph.node}))
        if ops is None or op in ops:
            out.append((op, c))
    return out


def _close(got, want, rtol, atol):
    if want is None:  # an empty optional
        return None if got is None else "a value, expected an empty optional"
    if isinstance(want, list):  # a sequence: element by element
        if not isinstance(got, list):
            return f"{type(got).__name__}, expected a sequence"
        if len(got) != len(want):
            return f"a sequence of {len(got)} tensors, expected {len(want)}"
        for j, (a, b) in enumerate(zip(got, want)):
            bad = _close(a, b, rtol, atol)
            if bad:
                return f"element {j}: {bad}"
        return None
    if got is None or isinstance(got, list):
        return f"{'an empty optional' if got is None else 'a sequence'}, expected a tensor"
    want = np.asarray(want)
    got = np.asarray(got)
    if got.shape != want.shape:
        return f"shape {got.shape}, expected {want.shape}"
    fmt = narrow_format(want.dtype)
    if fmt is not None:  # ml_dtypes types: compared by value, in a type NumPy has
        if got.dtype != want.dtype:
            return f"dtype {got.dtype}, expected {want.dtype}"
        wide = np.int64 if fmt.startswith(("int", "uint")) else np.float32
        got, want = got.astype(wide), want.astype(wide)
    if want.dtype == np.bool_ or want.dtype.kind in "iu":
        if not np.array_equal(got, want):
            return f"values differ ({int(np.sum(got != want))} of {want.size})"
        return None
    if want.dtype.kind == "f":
        if not np.allclose(got, want, rtol=rtol, atol=atol, equal_nan=True):
            err = np.max(np.abs(got.astype(np.float64) - want) /
                         (atol + rtol * np.abs(want)))
            return f"values differ (max error {err:.3g} x tolerance)"
        return None
    return f"cannot compare {want.dtype}"


def _array(a, numpy_helper, structured=False):
    """A case's value as an array; with ``structured`` (a value the model declares a
    sequence or an optional), a list of arrays for a sequence and ``None`` for an empty
    optional."""
    if structured:
        if a is None:
            return None
        if isinstance(a, (list, tuple)):
            return [_array(x, numpy_helper) for x in a]
    return numpy_helper.to_array(a) if hasattr(a, "HasField") else np.asarray(a)


def _structured(vi):
    """Whether a graph input's or output's declared type is a sequence or an optional."""
    return vi.type.WhichOneof("value") in ("sequence_type", "optional_type")


def _declared_shape_known(vi):
    """Whether a tensor input declares every dimension's length."""
    tt = vi.type.tensor_type
    return vi.type.WhichOneof("value") != "tensor_type" or tt.HasField("shape") and all(
        d.HasField("dim_value") for d in tt.shape.dim)


def _same_value(a, b):
    """Whether two values of a case (arrays, lists of them, ``None``) are the same."""
    if a is None or b is None or isinstance(a, list) or isinstance(b, list):
        if a is None or b is None:
            return a is None and b is None
        if not (isinstance(a, list) and isinstance(b, list)) or len(a) != len(b):
            return False
        return all(_same_value(x, y) for x, y in zip(a, b))
    return bool(np.array_equal(a, b))


def run_case(case, runtime=False):
    """``(status, reason)`` of one test case: ``passed``, ``failed`` or
    ``unsupported``. With ``runtime``, every tensor input is given when the model runs,
    as ONNX's own runner feeds them (shape operands included:
    :func:`~geon.frontends.onnx.runtime_values.import_runtime_values`), and a dimension
    the model leaves symbolic stays a symbolic length."""
    from onnx import numpy_helper
    graph = case.model.graph
    inits = {t.name for t in graph.initializer}
    fed = [vi for vi in graph.input if vi.name not in inits]
    names = [vi.name for vi in fed]
    in_kinds = [_structured(vi) for vi in fed]
    out_kinds = [_structured(vi) for vi in graph.output]
    try:
        data = [([_array(a, numpy_helper, k) for a, k in zip(ins, in_kinds)],
                 [_array(b, numpy_helper, k) for b, k in zip(outs, out_kinds)])
                for ins, outs in case.data_sets]
    except (ValueError, TypeError) as e:
        return "unsupported", f"the case's values are not tensors (sequences, maps): {e}"
    if runtime:
        return _run_at_runtime(case, data, _close)
    # An input with a dimension the model leaves symbolic takes its length from the
    # data, when every data set gives the input the same shape.
    shapes = {}
    for k, vi in enumerate(fed):
        if in_kinds[k] or not data or _declared_shape_known(vi):
            continue
        got = {np.shape(ins[k]) for ins, _ in data}
        if len(got) == 1:
            shapes[vi.name] = got.pop()
    bound = {}
    # Sequences and optionals are held at import (never fed at run time): an input of
    # such a type is fixed at import, when every data set gives it the same value.
    for k, name in enumerate(names):
        if in_kinds[k] and data:
            vals = [ins[k] for ins, _ in data]
            if any(not _same_value(v, vals[0]) for v in vals[1:]):
                return "unsupported", (f"input {name!r} is a sequence or an optional, "
                                       f"held at import, and the data sets give it "
                                       f"different values")
            bound[name] = vals[0]
    while True:
        try:
            g = import_model(case.model, input_shapes=shapes, input_values=bound)
            f = g.computation()
            break
        except UnsupportedOnnxOp as e:
            # An input the importer needs at import (a shape, axes, pads): the case
            # fixes it when every data set gives it the same value.
            name = getattr(e, "value_name", None)
            if name not in names or name in bound or not data:
                return "unsupported", str(e)
            k = names.index(name)
            vals = [ins[k] for ins, _ in data]
            if any(not np.array_equal(v, vals[0]) for v in vals[1:]):
                return "unsupported", str(e)
            bound[name] = vals[0]
        except Exception as e:  # noqa: BLE001 - every other import problem is a failure
            return "failed", f"import: {type(e).__name__}: {e}"
    for inputs, outputs in data:
        inputs = [a for n, a in zip(names, inputs) if n not in bound]
        try:
            with np.errstate(all="ignore"):
                got = f(*inputs)
        except Exception as e:  # noqa: BLE001
            return "failed", f"run: {type(e).__name__}: {e}"
        for k, (a, b) in enumerate(zip(got, outputs)):
            bad = _close(a, b, case.rtol, case.atol)
            if bad:
                return "failed", f"output {k}: {bad}"
    return "passed", ""


def _run_at_runtime(case, data, close):
    """:func:`run_case` with every input given at each call."""
    try:
        f = import_runtime_values(case.model)
        for inputs, outputs in data:
            with np.errstate(all="ignore"):
                got = f(*inputs)
            for k, (a, b) in enumerate(zip(got, outputs)):
                bad = close(a, b, case.rtol, case.atol)
                if bad:
                    return "failed", f"output {k}: {bad}"
    except UnsupportedOnnxOp as e:
        return "unsupported", str(e)
    except Exception as e:  # noqa: BLE001 - every other problem is a failure
        return "failed", f"{type(e).__name__}: {e}"
    return "passed", ""


def run(ops=None, names=None, runtime=False):
    """Run the cases (of operators ``ops`` / with case names ``names``); returns
    ``{case name: (operator, status, reason)}``. ``runtime``: see :func:`run_case`."""
    results = {}
    for op, case in collect(ops):
        if names is not None and case.name not in names:
            continue
        status, reason = run_case(case, runtime)
        results[case.name] = (op, status, " ".join(reason.split())[:300])
    return results


#: The reasons of cases refused for a data type geon does not hold.
_TYPE_REFUSAL = re.compile(r"(inputs of|tensors of|cast to) [A-Z0-9]+ (are|is) not supported")


def _all(results):
    return sum(s == "passed" for _, s, _ in results.values()), len(results)


def summary(results, required=REQUIRED, holdable_only=False):
    """``(passed, total)`` over the cases of the ``required`` operators; with
    ``holdable_only``, leaving out those refused for a data type geon does not hold."""
    rows = [s for op, s, r in results.values() if op in required
            and not (holdable_only and _TYPE_REFUSAL.search(r))]
    return sum(s == "passed" for s in rows), len(rows)


def rst_table(results):
    """The results as the reStructuredText chapter committed to doc/."""
    onnx = onnx_module()
    per_op = {}
    for name, (op, status, reason) in sorted(results.items()):
        per_op.setdefault(op, []).append((name, status, reason))
    passed, total = summary(results)
    held = summary(results, holdable_only=True)
    exported = summary(results, EXPORTED)
    lines = ["Supported operators", "-------------------", "",
             f"Generated by ``python -m geon.frontends.onnx.conformance --rst "
             f"doc/onnx_operators.txt --json doc/onnx_conformance.json`` with "
             f"onnx {onnx.__version__}: every node test case "
             f"the onnx package ships, imported into geon and run on the NumPy "
             f"transformer at the tolerances the case declares.", "",
             f"Cases of the operators geon's ONNX importer is required to cover: "
             f"**{passed} of {total} pass** ({100.0 * passed / max(total, 1):.1f}%); "
             f"leaving out the cases refused for a data type geon does not hold "
             f"(strings, for instance; bfloat16, the float8, float4 and 4- and 2-bit "
             f"integer types are held widened), {held[0]} of {held[1]} "
             f"({100.0 * held[0] / max(held[1], 1):.1f}%). "
             f"Cases of the operators exporters emit beyond those "
             f"(``conformance.EXPORTED``): **{exported[0]} of {exported[1]} pass**. "
             f"All cases: **{_all(results)[0]} of {_all(results)[1]} pass**. The test "
             f"suite runs half of the required operators' cases, and every case of "
             f"{' and '.join(ALSO_CHECKED)}, of ``EXPORTED`` and of the other operators "
             f"added for them (``conformance.ADDED``), against this table; the "
             f"operators with cases that do not pass are listed after the table, with "
             f"the reason.", "",
             ".. list-table::", "   :header-rows: 1", "",
             "   * - operator", "     - required", "     - passed", "     - failed",
             "     - unsupported"]
    for op in sorted(per_op):
        rows = per_op[op]
        n = {s: sum(r[1] == s for r in rows) for s in ("passed", "failed", "unsupported")}
        lines += [f"   * - {op}", f"     - {'yes' if op in REQUIRED else ''}",
                  f"     - {n['passed']}", f"     - {n['failed']}", f"     - {n['unsupported']}"]
    lines += ["", "What is left, and why", "~" * 21, "",
              "Every operator with a case that does not pass (its cases that pass / all "
              "of its cases), and why; each case's own reason is in "
              "``doc/onnx_conformance.json``.", ""]
    for op in sorted(per_op):
        rows = per_op[op]
        ok = sum(r[1] == "passed" for r in rows)
        if ok == len(rows):
            continue
        why = WHY_LEFT.get(op) or next(r[2] for r in rows if r[1] != "passed")
        why = why.replace("*", "\\*").replace("`", "'") if op not in WHY_LEFT else why
        lines.append(f"* ``{op}`` ({ok} / {len(rows)}): {why}")
    lines += ["", "Cases that do not pass, with the reason", "~" * 39, "",
              "Only the required operators are listed here (the full list is in "
              "``doc/onnx_conformance.json``).", ""]
    for op in sorted(per_op):
        if op not in REQUIRED:
            continue
        for name, status, reason in per_op[op]:
            if status != "passed":
                text = reason.replace("*", "\\*").replace("`", "'")
                lines.append(f"* ``{name}`` ({op}, {status}): {text}")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m geon.frontends.onnx.conformance",
                                description=__doc__.splitlines()[0])
    p.add_argument("--ops", help="comma-separated operators to run (default: all)")
    p.add_argument("--rst", help="write the table as reStructuredText to this file")
    p.add_argument("--json", help="write {case: [operator, status, reason]} to this file")
    p.add_argument("--runtime", action="store_true",
                   help="give every input when the model runs, as ONNX's runner does "
                        "(shape operands included)")
    args = p.parse_args(argv)
    ops = set(args.ops.split(",")) if args.ops else None
    results = run(ops, runtime=args.runtime)
    per_op = {}
    for op, status, _ in results.values():
        per_op.setdefault(op, {"passed": 0, "failed": 0, "unsupported": 0})[status] += 1
    print(f"{'operator':28} {'passed':>7} {'failed':>7} {'unsupported':>12}")
    for op in sorted(per_op):
        n = per_op[op]
        print(f"{op:28} {n['passed']:7} {n['failed']:7} {n['unsupported']:12}")
    for name, (op, status, reason) in sorted(results.items()):
        if status != "passed":
            print(f"{status:11} {name} ({op}): {reason}")
    passed, total = summary(results)
    held = summary(results, holdable_only=True)
    exported = summary(results, EXPORTED)
    print(f"required operators: {passed} / {total} cases pass ({held[0]} / {held[1]} of "
          f"the data types geon holds); operators exporters emit (EXPORTED): "
          f"{exported[0]} / {exported[1]}; all: {_all(results)[0]} / {_all(results)[1]}")
    if args.rst:
        _write(args.rst, rst_table(results))
    if args.json:
        _write(args.json, json.dumps({k: list(v) for k, v in sorted(results.items())},
                                     indent=0) + "\n")
    return 0


def _write(path, text):
    """Write ``text`` to ``path`` as checkpoints are written
    (:mod:`geon.transformers.checkpoint`): a temporary file beside it, created with the
    process's umask like any new file (``tempfile.mkstemp`` made it 0600), flushed and
    fsynced, then renamed over ``path``."""
    from geon.transformers import checkpoint
    checkpoint.write_atomically(path, lambda f: f.write(text.encode("utf-8")))


if __name__ == "__main__":
    sys.exit(main())
