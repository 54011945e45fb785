"""``import_model``: an ONNX graph as geon ops of the NumPy family.

Every ONNX value becomes a :class:`Value`: a geon tensor op, or (when it can be known
at import: constants, shapes and everything computed from them only) a NumPy array.
Nodes are mapped one at a time by the table of :mod:`geon.frontends.onnx.ops`; a node
whose inputs are all known arrays is evaluated at import, which folds shape-computing
subgraphs (``Shape -> Gather -> Concat -> Reshape``) into constants.
"""

import os
from typing import (TYPE_CHECKING, Any, Callable, Mapping, NamedTuple, Optional, Sequence,
                    Union)

import numpy as np

import geon as be
from geon.errors import GeonError, IndexOutOfRangeError
from geon.frontends.onnx import loading
from geon.frontends.onnx.functions import MAX_EXPANSION, function_body, import_function
from geon.frontends.onnx.loading import (InvalidOnnxModel, UnsupportedOnnxOp, check_size,
                                         elem_dtype, elem_name, element_count, load_proto,
                                         narrow_format, node_order, onnx_module,
                                         tensor_array)
from geon.frontends.onnx.ops import carrier, find_builder, to_narrow
from geon.frontends.onnx.symbolic import (host_result, is_symbolic_array, symbol_name,
                                           symbolic_tensor)
from geon.frontends.onnx.structures import (OptionalValue, SequenceValue, given_value,
                                            is_structure, kind, leaves)
from geon.op_graph import op_graph as og
from geon.op_graph.symbols import Sym, Symbol, SymbolicLengthError
from geon.transformers.base import Transformer

if TYPE_CHECKING:  # only for the annotations: importing geon never needs onnx
    import onnx

# Nodes evaluated at import when all their inputs are known have results at most this
# large; bigger ones stay ops (folding must not turn a small model into a huge one).
FOLD_LIMIT = 1 << 16


def check_labels(labels: Any, classes: int, ignore_index: Optional[int], what: str,
                 error: type = IndexOutOfRangeError) -> None:
    """Raise ``error`` if an integer class label of ``labels`` is outside
    ``0 .. classes - 1`` and is not ``ignore_index``, naming the label, its position and
    the class count.

    This is the one check of the labels (targets) of ``NegativeLogLikelihoodLoss`` and
    ``SoftmaxCrossEntropyLoss``: ONNX leaves an out-of-range label undefined, and the
    importer's one-hot form would silently give it a loss of 0. A label equal to
    ``ignore_index`` is skipped whatever its value, as ONNX specifies. It runs at import
    for labels known then (``error=InvalidOnnxModel``), and when the function of
    :meth:`OnnxGraph.computation` is called for labels fed or computed at run time
    (:class:`~geon.errors.IndexOutOfRangeError`, naming the loss node). A graph input's
    labels also get that domain as their placeholder's value domain
    (:func:`geon.set_domain`), so that a computation built from ``g.outputs`` by hand
    checks them too (its error names the placeholder)."""
    a = np.asarray(labels)
    if a.dtype.kind not in "iu":
        a = a.astype(np.int64)
    if a.dtype == np.uint64:  # the one type int64 does not hold: compared as it is
        bad = a >= np.uint64(classes)
        if ignore_index is not None and ignore_index >= 0:
            bad &= a != np.uint64(ignore_index)
    else:
        wide = a.astype(np.int64, copy=False)
        bad = (wide < 0) | (wide >= classes)
        if ignore_index is not None:
            bad &= wide != ignore_index
    if np.any(bad):
        k = int(np.flatnonzero(bad)[0])
        pos = tuple(int(i) for i in np.unravel_index(k, a.shape)) if a.ndim else ()
        ignored = (f"; ignore_index is {ignore_index}" if ignore_index is not None else
                   "; no ignore_index is set")
        raise error(f"{what}: label {a.flat[k]} (at position {pos}) is not a class: there "
                    f"are {classes} classes, 0 to {classes - 1}{ignored}")


class LabelCheck(NamedTuple):
    """A check of class labels when the model runs (:func:`check_labels`): ``op`` (the
    labels: a graph input's placeholder, or an op computing them), ``classes``,
    ``ignore_index`` and ``where`` (the node, for the message)."""
    op: Any
    classes: int
    ignore_index: Optional[int]
    where: str


class Value:
    """An ONNX value at import: ``op`` (a geon tensor op) or ``array`` (known at import),
    and ``dtype``, the ONNX element type as a NumPy dtype (``bool`` for booleans, which
    geon carries as 1.0 / 0.0 floats)."""

    __slots__ = ("op", "array", "dtype")

    def __init__(self, op: Optional[og.TensorOp] = None, array: Optional[np.ndarray] = None,
                 dtype: og.DTypeLike = None) -> None:
        if op is None and array is None:
            raise TypeError("Value: give op or array")
        self.op, self.array = op, array
        if dtype is None:
            dtype = array.dtype if array is not None else self.tensor().dtype
        self.dtype = np.dtype(dtype)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.array.shape if self.array is not None else be.np.shape(self.tensor())

    def tensor(self) -> og.TensorOp:
        """The value as a geon op (a constant for a known array; for shape values
        holding symbolic lengths, their values computed when the model runs)."""
        if self.op is None:
            array = self.array
            assert array is not None  # __init__ has one of op and array
            if array.dtype == object:
                self.op = symbolic_tensor(array, carrier(self.dtype))
                return self.op
            if array.size == 0:
                raise UnsupportedOnnxOp(f"an empty tensor (shape {array.shape}) used "
                                        f"as an operand: geon has no empty tensors")
            self.op = be.np.constant(array.astype(carrier(self.dtype)))
        return self.op


class OnnxGraph:
    """An imported ONNX model.

    Attributes:
        inputs: the placeholders of the graph inputs that are not initializers, in
            model order.
        outputs: the ops of the graph outputs, in model order; ``None`` for an output
            known at import to have no elements (a slice or split part with none, a
            ``Shape`` with ``start > end``): its array is in ``empty_outputs`` under its
            position and is what :meth:`computation` returns for it. An output of
            sequence or optional type is the importer's
            :class:`~geon.frontends.onnx.structures.SequenceValue` or
            :class:`~geon.frontends.onnx.structures.OptionalValue` (its tensors'
            values: ``.tensor()`` gives an element's op); :meth:`computation` returns
            a list of arrays for a sequence, and the value or ``None`` for an
            optional.
        variables: ``{initializer name: Variable}`` for the floating-point
            initializers, trainable and initialized from the model.
        output_dtypes: the ONNX element type of each output (of a sequence's or an
            optional's tensors for those; booleans are computed as
            1.0 / 0.0 and returned as ``bool`` by :meth:`computation`).
        opsets: ``{domain: version}`` of the model.
        label_checks: the class labels of the loss nodes that are only known when the
            model runs (``LabelCheck`` tuples: the labels' op, the class count, the
            ``ignore_index`` and the node); the function of :meth:`computation` checks
            them on every call.
    """

    def __init__(self, inputs: list[og.Placeholder],
                 outputs: list[Union[og.TensorOp, None, SequenceValue, OptionalValue]],
                 variables: dict[str, og.Variable], output_dtypes: Sequence[np.dtype],
                 input_dtypes: Sequence[np.dtype], opsets: dict[str, int],
                 empty_outputs: Optional[Mapping[int, np.ndarray]] = None,
                 label_checks: Sequence[tuple] = ()) -> None:
        self.inputs, self.outputs, self.variables = inputs, outputs, variables
        self.output_dtypes, self.input_dtypes, self.opsets = output_dtypes, input_dtypes, \
            opsets
        self.empty_outputs = dict(empty_outputs or {})
        self.label_checks: list[LabelCheck] = [LabelCheck(*c) for c in label_checks]

    def computation(self, transformer: Union[Transformer, str, None] = None
                    ) -> Callable[..., list[np.ndarray]]:
        """A function ``f(*arrays) -> [arrays]`` running the model: one array per input
        (in ``inputs`` order), one per output. ``transformer`` is a transformer,
        a registered name, or ``None`` for the NumPy transformer.

        The function checks the class labels of the loss nodes (``label_checks``): a
        label out of range raises :class:`~geon.errors.IndexOutOfRangeError` naming
        the node, the label and the class count (a graph input's labels before the
        model runs, computed ones after)."""
        tf = (be.make_transformer(transformer or "numpy")
              if transformer is None or isinstance(transformer, str) else transformer)
        # Each output's plan (see _plan): the ops to compute, one per tensor computed at
        # run time, and how the results make the outputs (a sequence's elements are
        # results of their own, regrouped into a list).
        computed: list = []
        plans = [_plan(o, d, self.empty_outputs.get(k), computed)
                 for k, (o, d) in enumerate(zip(self.outputs, self.output_dtypes))]
        # Labels fed as graph inputs are checked in the feeds; computed labels are
        # extra results of the computation, checked before the outputs are returned.
        position = {id(p): k for k, p in enumerate(self.inputs)}
        fed = [(position[id(c.op)], c) for c in self.label_checks if id(c.op) in position]
        later = [c for c in self.label_checks if id(c.op) not in position]
        extra = [c.op for c in later]
        comp = tf.computation(computed + extra, *self.inputs) if computed or extra \
            else None
        in_types = [carrier(d) for d in self.input_dtypes]

        def run(*arrays):
            if len(arrays) != len(in_types):
                raise be.FeedError(f"the model takes {len(in_types)} inputs, got "
                                   f"{len(arrays)}")
            feeds = [np.asarray(a).astype(t, copy=False) for a, t in zip(arrays, in_types)]
            for k, c in fed:
                check_labels(feeds[k], c.classes, c.ignore_index,
                             f"{c.where}: input {self.inputs[k].name!r}")
            results = list(comp(*feeds)) if comp is not None else []
            for c, value in zip(later, results[len(computed):]):
                check_labels(value, c.classes, c.ignore_index, f"{c.where}: the labels")
            outs = iter(results[:len(computed)])
            return [_unplan(p, outs) for p in plans]
        setattr(run, "computation", comp)  # a function attribute (mypy: not declared)
        return run


def _plan(out, dtype, empty, computed):
    """How :meth:`OnnxGraph.computation` makes one output: ``("empty", array)`` (known
    at import to have no elements), ``("tensor", dtype)`` (the next computed result,
    its op appended to ``computed``), ``("sequence", [plans])`` or ``("optional",
    plan or None)``."""
    if isinstance(out, SequenceValue):
        return ("sequence", [_plan_value(v, computed) for v in out.items])
    if isinstance(out, OptionalValue):
        if out.value is None:
            return ("optional", None)
        if isinstance(out.value, SequenceValue):
            return ("optional", _plan(out.value, dtype, None, computed))
        return ("optional", _plan_value(out.value, computed))
    if out is None:
        return ("empty", empty)
    computed.append(out)
    return ("tensor", dtype)


def _plan_value(v, computed):
    """The plan of a tensor's value inside a sequence or an optional."""
    if v.array is not None and v.array.size == 0:
        return ("empty", v.array)
    computed.append(v.tensor())
    return ("tensor", v.dtype)


def _unplan(plan, outs):
    """An output of :meth:`OnnxGraph.computation` from its plan and the iterator of the
    computed results."""
    what, arg = plan
    if what == "empty":
        return arg.copy()
    if what == "tensor":
        return _output(next(outs), arg)
    if what == "sequence":
        return [_unplan(p, outs) for p in arg]
    return None if arg is None else _unplan(arg, outs)


def _output(value, dtype):
    """A computed output in its ONNX type: booleans from 1.0 / 0.0; a narrow type
    (bfloat16, float8, 4- and 2-bit) from its widened values, which lie on the format's
    grid, so the conversion is exact (checked: a value off the grid is a bug, never
    silently rounded again)."""
    value = np.asarray(value)
    if dtype == np.bool_:
        return value != 0
    out = value.astype(dtype, copy=False)
    if narrow_format(dtype) is not None:
        back = out.astype(value.dtype)
        same = (back == value) | (np.isnan(value) if value.dtype.kind == "f" else False)
        if not np.all(same):
            k = int(np.flatnonzero(~same)[0])
            raise GeonError(f"output of type {dtype}: the value {value.flat[k]!r} is not on "
                            f"the format's grid (it became {back.flat[k]!r})")
    return out


def _tensor_type(vi, what, input_shapes):
    """``(shape, dtype)`` of a graph input's ValueInfo, symbolic dimensions resolved
    from ``input_shapes``."""
    t = vi.type
    if t.WhichOneof("value") != "tensor_type":
        raise UnsupportedOnnxOp(f"{what}: only tensor inputs are supported, not "
                                f"{t.WhichOneof('value')}")
    tt = t.tensor_type
    dtype = elem_dtype(tt.elem_type)
    if dtype is None:
        raise UnsupportedOnnxOp(f"{what}: inputs of {elem_name(tt.elem_type)} are not "
                                f"supported")
    given = input_shapes.get(vi.name)
    if given is not None:
        given = tuple(int(d) for d in given)
    if not tt.HasField("shape"):
        if given is None:
            raise InvalidOnnxModel(f"{what} has no declared shape: give it with "
                                   f"input_shapes={{{vi.name!r}: (...)}}")
        return given, dtype
    dims = tt.shape.dim
    if given is not None:
        if len(given) != len(dims):
            raise InvalidOnnxModel(f"{what}: input_shapes gives {given}, the model declares "
                                   f"{len(dims)} dimensions")
        for k, (d, g) in enumerate(zip(dims, given)):
            if d.HasField("dim_value") and d.dim_value != g:
                raise InvalidOnnxModel(f"{what}: input_shapes gives {g} for dimension {k}, "
                                       f"the model declares {d.dim_value}")
        shape = given
    else:
        shape = []
        for k, d in enumerate(dims):
            if not d.HasField("dim_value"):
                # a symbolic length, bound when the computation is called
                shape.append(Symbol(symbol_name(d.dim_param, vi.name, k)))
                continue
            shape.append(int(d.dim_value))
        shape = tuple(shape)
    n = 1
    for d in shape:
        if isinstance(d, Sym):
            continue
        if d < 0:
            raise InvalidOnnxModel(f"{what}: negative dimension in {shape}")
        n *= d
    if n * dtype.itemsize > loading.MAX_TENSOR_BYTES:
        raise InvalidOnnxModel(f"{what}: declares {shape}, more than "
                               f"{loading.MAX_TENSOR_BYTES} bytes")
    return shape, dtype


def import_model(model: Union["onnx.ModelProto", bytes, str, os.PathLike],
                 input_shapes: Optional[Mapping[str, Sequence[int]]] = None,
                 input_values: Optional[Mapping[str, Any]] = None) -> OnnxGraph:
    """Import an ONNX model as geon ops (see :class:`OnnxGraph`).

    ``model`` is an ``onnx.ModelProto``, its serialized bytes or a path (external
    data is then read from the model's folder only). ``input_shapes`` maps input
    names to shapes, for inputs with symbolic dimensions. ``input_values`` maps input
    names to arrays fixed at import: such inputs are constants of the graph (not in
    ``OnnxGraph.inputs``), which lets shape arguments given as inputs (a
    ``Reshape``'s target shape, ``Unsqueeze``'s axes) be folded. An input of sequence
    or optional type must be given there (a list of arrays for a sequence, ``None``
    for an empty optional): such values are held at import, never fed at run time.

    Raises :class:`UnsupportedOnnxOp` for an op, attribute, data type or opset the
    importer cannot map exactly, and :class:`InvalidOnnxModel` for a malformed model.
    """
    proto, folder = load_proto(model)
    input_shapes = dict(input_shapes or {})
    input_values = dict(input_values or {})
    graph = proto.graph
    opsets = {}
    for o in proto.opset_import:
        opsets[o.domain if o.domain != "ai.onnx" else ""] = int(o.version)
    if graph.sparse_initializer:
        raise UnsupportedOnnxOp("sparse initializers are not supported")

    values, variables = {}, {}
    for t in graph.initializer:
        if not t.name or t.name in values:
            raise InvalidOnnxModel(f"initializer {t.name!r} is unnamed or given twice")
        arr = tensor_array(t, folder, f"initializer {t.name!r}")
        if arr.dtype.kind == "f":
            var = be.np.variable(arr, name=_geon_name(t.name))
            variables[t.name] = var
            values[t.name] = Value(op=var, dtype=arr.dtype)
        else:
            values[t.name] = Value(array=arr)
    inputs, input_dtypes = [], []
    for vi in graph.input:
        if vi.name in values:  # an initializer: a default the graph does not take
            continue
        if vi.type.WhichOneof("value") in ("sequence_type", "optional_type"):
            values[vi.name] = _structure_input(vi, input_values)
            continue
        shape, dtype = _tensor_type(vi, f"input {vi.name!r}", input_shapes)
        if vi.name in input_values:
            arr = np.asarray(input_values[vi.name])
            if arr.shape != tuple(shape):
                raise InvalidOnnxModel(f"input_values gives {vi.name!r} shape {arr.shape}, "
                                       f"the model declares {tuple(shape)}")
            values[vi.name] = Value(array=arr.astype(dtype))
            continue
        ph = be.np.placeholder(shape, dtype=carrier(dtype), name=_geon_name(vi.name))
        # A narrow type's input is fed widened (exactly, from the ml_dtypes array);
        # values fed off the format's grid are rounded to it as a Cast would.
        values[vi.name] = Value(op=to_narrow(ph, dtype) if narrow_format(dtype) else ph,
                                dtype=dtype)
        inputs.append(ph)
        input_dtypes.append(dtype)
    unknown = (set(input_shapes) | set(input_values)) - {vi.name for vi in graph.input}
    if unknown:
        raise InvalidOnnxModel(f"input_shapes / input_values name {sorted(unknown)}, which "
                               f"are not inputs of the model")

    state = _ImportState()
    for node in node_order(graph, set(values)):
        _import_node(node, values, opsets, state)

    outputs: list[Union[og.TensorOp, None, SequenceValue, OptionalValue]] = []
    output_dtypes, empty_outputs = [], {}
    for vi in graph.output:
        if vi.name not in values:
            raise InvalidOnnxModel(f"graph output {vi.name!r} is not made by any node")
        v = values[vi.name]
        if isinstance(v, (SequenceValue, OptionalValue)):
            outputs.append(v)  # its tensors are results of their own (see computation)
        elif v.array is not None and v.array.size == 0:
            outputs.append(None)  # no elements: returned as they are
            empty_outputs[len(outputs) - 1] = v.array
        else:
            outputs.append(v.tensor())
        output_dtypes.append(v.dtype)
    return OnnxGraph(inputs, outputs, variables, output_dtypes, input_dtypes, opsets,
                     empty_outputs, state.label_checks)


def _structure_input(vi, input_values):
    """The value of a graph input of sequence or optional type: given at import
    (``input_values``: a list of arrays for a sequence, ``None`` for an empty
    optional), since sequences and optionals are structures the importer holds, not
    tensors a computation is fed."""
    what = f"input {vi.name!r}"
    if vi.name not in input_values:
        which = "a sequence" if vi.type.WhichOneof("value") == "sequence_type" else \
            "an optional"
        e = UnsupportedOnnxOp(
            f"{what} is {which}: sequences and optionals are held at import, not fed "
            f"when the model runs; give its value with input_values={{{vi.name!r}: "
            f"[arrays] (a sequence) or None (an empty optional)}}")
        e.value_name = vi.name
        raise e
    return given_value(vi.type, input_values[vi.name], what,
                       lambda arr: Value(array=arr))


def _geon_name(name):
    if not isinstance(name, str):  # protobuf hands invalid UTF-8 over as bytes
        raise InvalidOnnxModel(f"the name {name!r} is not valid UTF-8 text")
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name) or "value"


class _ImportState:
    """What the nodes of one import share: the bytes of the values computed at import
    so far (bounded in all by ``MAX_TENSOR_BYTES``), and the label checks left for
    run time."""

    def __init__(self):
        self.folded_bytes = 0
        self.label_checks: list[LabelCheck] = []


def _import_node(node, values, opsets, state, depth=0):
    domain = node.domain if node.domain != "ai.onnx" else ""
    version = opsets.get(domain)
    label = f"{node.op_type} node {node.name!r}" if node.name else f"{node.op_type} node"
    where = f"{label} (opset {domain or 'ai.onnx'} {version})"
    if version is None:
        raise UnsupportedOnnxOp(f"{where}: the model imports no version of domain "
                                f"{domain!r}")
    try:
        build = find_builder(domain, node.op_type, version, where)
    except UnsupportedOnnxOp:
        body = function_body(node, domain, version, values) if depth < MAX_EXPANSION \
            else None
        if body is None:
            raise
        import_function(node, body, values, opsets, state, depth, where, _import_node)
        return
    args = [values[name] if name else None for name in node.input]
    if not getattr(build, "takes_structures", False):
        for i, a in enumerate(args):
            if is_structure(a):
                raise UnsupportedOnnxOp(f"{where}: input {i} ({node.input[i]!r}) is "
                                        f"{kind(a)}; the op takes tensors here")
    ctx = Context(node, args, version, where, state)
    ctx.scope, ctx.opsets = values, opsets  # what a subgraph (If, Loop, Scan) may read
    symbolic = any(isinstance(a, Value) and is_symbolic_array(a.array) for a in args)
    try:
        host = host_result(ctx) if symbolic and ctx.all_known() else None
        if host is not None:  # shape arithmetic over symbolic lengths, at import
            results = [Value(array=host, dtype=np.bool_ if host.dtype == np.bool_
                             else np.int64)]
        else:
            results = build(ctx)
        if ctx.all_known() and not symbolic and node.op_type not in NO_FOLD:
            results = _fold(results, state)
    except (UnsupportedOnnxOp, InvalidOnnxModel):
        raise
    except GeonError as e:
        hint = ""
        if any(isinstance(v, Sym) for a in args if isinstance(a, Value)
               for v in (np.ravel(a.array) if a.array is not None else a.shape)):
            hint = (" (the shapes hold symbolic lengths: import_model(..., "
                    "input_shapes=...) fixes them)")
        raise InvalidOnnxModel(f"{where}: {e}{hint}") from None
    except SymbolicLengthError as e:   # (a TypeError: checked first)
        raise UnsupportedOnnxOp(f"{where}: {e}; import_model(..., input_shapes=...) "
                                f"fixes the lengths of the inputs' symbolic dimensions"
                                ) from None
    except (ValueError, TypeError, IndexError, KeyError, ZeroDivisionError,
            OverflowError) as e:
        raise InvalidOnnxModel(f"{where}: the node does not fit its inputs: {e}") from None
    unused = set(ctx.attrs) - ctx.read
    if unused:
        raise UnsupportedOnnxOp(f"{where}: attribute(s) {sorted(unused)} not supported")
    outs = [o for o in node.output]
    if len(results) < len([o for o in outs if o]):
        raise UnsupportedOnnxOp(f"{where}: output(s) {outs[len(results):]} not supported")
    given = [x.array for a in args if a is not None for x in leaves(a)]
    for name, v in zip(outs, results):
        if not name or v is None:
            continue
        if is_structure(v):  # made of values already checked and counted
            values[name] = v
            continue
        if not isinstance(v, Value):
            raise AssertionError(f"{where}: builder returned {v!r}")
        check_size(v.shape, v.dtype, where, f"output {name!r}")
        if v.array is not None and not any(v.array is a for a in given):
            state.folded_bytes += v.array.nbytes
        values[name] = v


# Ops never evaluated at import (their value is not a function of their inputs; a
# control-flow op's subgraph may read values of the enclosing graph computed at run time).
NO_FOLD = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
           "Multinomial", "Bernoulli", "If", "Loop", "Scan"}


def _fold(results, state):
    """``results`` with the small ones computed from known inputs evaluated now (the
    element count taken exactly; a result that would take the values computed at
    import past the limit stays an op)."""
    todo, used = [], state.folded_bytes
    for k, v in enumerate(results):
        if not isinstance(v, Value) or v.array is not None:
            continue
        nbytes = element_count(v.shape) * max(np.dtype(v.dtype).itemsize,
                                               np.dtype(v.op.dtype).itemsize)
        if element_count(v.shape) <= FOLD_LIMIT and \
                used + nbytes <= loading.MAX_TENSOR_BYTES:
            todo.append(k)
            used += nbytes
    if not todo:
        return results
    arrays = be.evaluate([results[k].op for k in todo])
    out = list(results)
    for k, arr in zip(todo, arrays):
        d = results[k].dtype
        arr = np.asarray(arr)
        out[k] = Value(array=(arr != 0) if d == np.bool_ else arr.astype(d))
    return out


class Context:
    """What a builder sees of one node: its inputs, attributes and opset version."""

    def __init__(self, node, args, version, where, state=None):
        self.node, self.args, self.version, self.where = node, args, version, where
        self.attrs = {a.name: a for a in node.attribute}
        self.read = set()
        self.state = state if state is not None else _ImportState()
        # the values and opsets in scope (set by the importer; read by control flow)
        self.scope: dict = {}
        self.opsets: dict = {}

    # --- limits ------------------------------------------------------------------------
    def bound(self, shape, dtype, what="its result", known=False):
        """The element count of ``shape``, checked by ``loading.check_size`` before a
        builder makes a value of that shape; ``known``: the value is computed now, at
        import (an array), and counts toward the limit on all such values."""
        return check_size(shape, dtype, self.where, what,
                          self.state.folded_bytes if known else None)

    def check_labels(self, i, classes, ignore_index):
        """Check input ``i``, the class labels of a loss, by :func:`check_labels`: now
        if they are known at import, else each time the model runs (a graph input's
        labels are checked in the feeds, computed ones in the results)."""
        v = self.value(i)
        what = f"{self.where}: input {i} ({self.node.input[i]!r})"
        if v.array is not None:
            check_labels(v.array, classes, ignore_index, what, error=InvalidOnnxModel)
            return
        op = v.tensor()
        self.state.label_checks.append(LabelCheck(op, int(classes), ignore_index,
                                                  self.where))
        # A graph input's labels declare their value domain too, so that a computation
        # built from ``g.outputs`` by hand checks them as well (the first loss to read
        # them declares it; OnnxGraph.computation checks them first, naming the node).
        if isinstance(op, og.Placeholder) and op.domain is None:
            op.set_domain(int(classes), allow=() if ignore_index is None else
                          (int(ignore_index),))

    # --- inputs ----------------------------------------------------------------------
    def n_inputs(self):
        return len(self.args)

    def has(self, i):
        return i < len(self.args) and self.args[i] is not None

    def value(self, i):
        if not self.has(i):
            raise InvalidOnnxModel(f"{self.where}: input {i} is missing")
        return self.args[i]

    def tensor(self, i):
        """Input ``i`` as a geon op."""
        return self.value(i).tensor()

    def dtype(self, i):
        return self.value(i).dtype

    def shape(self, i):
        return tuple(self.value(i).shape)

    def const(self, i, default=None):
        """Input ``i`` as a NumPy array known at import (``default`` if absent); an
        input computed at run time raises :class:`UnsupportedOnnxOp`."""
        if not self.has(i):
            return default
        v = self.args[i]
        if v.array is None:
            e = UnsupportedOnnxOp(f"{self.where}: input {i} ({self.node.input[i]!r}) must "
                                  f"be known at import (a constant or computed from "
                                  f"shapes); it is computed at run time")
            e.value_name = self.node.input[i]
            raise e
        return v.array

    def all_known(self):
        """Whether every input is known at import (a sequence's or an optional's
        tensors all known)."""
        return all(x.array is not None for a in self.args if a is not None
                   for x in leaves(a))

    # --- attributes ------------------------------------------------------------------
    def attr(self, name, default=None):
        """Attribute ``name`` as a Python value (``default`` if absent)."""
        self.read.add(name)
        a = self.attrs.get(name)
        if a is None:
            return default
        onnx = onnx_module()
        at = onnx.AttributeProto
        if a.ref_attr_name:
            raise UnsupportedOnnxOp(f"{self.where}: attribute references are not supported")
        if a.type == at.INT:
            return int(a.i)
        if a.type == at.FLOAT:
            return float(a.f)
        if a.type == at.STRING:
            return a.s.decode("utf-8", "replace")
        if a.type == at.INTS:
            return [int(x) for x in a.ints]
        if a.type == at.FLOATS:
            return [float(x) for x in a.floats]
        if a.type == at.STRINGS:
            return [s.decode("utf-8", "replace") for s in a.strings]
        if a.type == at.TENSOR:
            return tensor_array(a.t, None, f"{self.where}: attribute {name!r}")
        raise UnsupportedOnnxOp(f"{self.where}: attribute {name!r} of type "
                                f"{at.AttributeType.Name(a.type)} is not supported")

    def unsupported(self, what):
        return UnsupportedOnnxOp(f"{self.where}: {what}")

    def import_graph(self, graph, values):
        """Import the nodes of ``graph``, a subgraph of this node (``If``, ``Loop``,
        ``Scan``), into ``values`` ({name: Value}: the scope and the subgraph's inputs)."""
        for node in node_order(graph, set(values)):
            _import_node(node, values, self.opsets, self.state)

    # --- results ---------------------------------------------------------------------
    def out(self, op, dtype=None):
        """A result Value from a geon op (``dtype``: its ONNX type, if not the op's)."""
        return Value(op=op, dtype=dtype)

    def known(self, array, dtype=None):
        arr = np.asarray(array)
        if is_symbolic_array(arr):  # shape values with symbolic lengths
            dtype = np.dtype(np.int64 if dtype is None else dtype)
            if dtype.kind in "iu":
                return Value(array=arr, dtype=dtype)
            return Value(op=symbolic_tensor(arr, carrier(dtype)), dtype=dtype)
        if dtype is not None:
            arr = arr.astype(dtype)
        return Value(array=arr)


__all__ = ["FOLD_LIMIT", "LabelCheck", "OnnxGraph", "OptionalValue", "SequenceValue",
           "Value", "check_labels", "import_model"]
