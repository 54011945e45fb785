"""JSON serialization of op graphs: :func:`serialize` writes the ops some results need
as one document (format ``"geon-graph"``, described in ``doc/interchange.rst``);
:func:`deserialize` reads it back into fresh ops. A document holding a control-flow body
(a scan's, a branch of a cond, ...) is version 3, any other version 2, so that readers of
version 2 (geon's native runtime) read what they can; this geon reads both. Bodies are
nested graphs (:mod:`geon.op_graph.serialize_bodies`).

An op's ``"attrs"`` are its class's ``attrs`` (:class:`~geon.op_graph.op_graph.Op`) but
``axes`` and ``dtype``, which its ``"outputs"`` give; those the class lists in
``optional_attrs`` (a placeholder's ``domain``) are written only when not ``None``, and
a document without them still loads. Values are encoded by their Python
type (:data:`CODECS`). This module knows no op class. Loading executes nothing from the
document: op types are looked up among the op classes the program defined
(:func:`~geon.op_graph.params.op_classes`), every op is rebuilt through its constructor
(so the checks of graph building run again), and a schema is kept only if it describes
its op. Anything wrong raises :class:`~geon.errors.SerializationError` naming the place.
"""

import base64
import binascii
import json
import math
import sys
from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np

from geon.errors import GeonError, SerializationError
from geon.op_graph import op_graph as og
from geon.op_graph.axes import Axes, Axis, FlattenedAxis
from geon.op_graph.symbols import Sym, parse
from geon.op_graph.nodes import OrderedSet
from geon.op_graph.params import (build, copy_debug_info, graph_ops, op_classes,
                                  restore_weak, show_axes, type_name)
from geon.op_graph.schemas import SCHEMAS

FORMAT = "geon-graph"
#: The newest version: what this geon writes for a document holding a body (a document
#: without one is written as version 2, which it is too).
VERSION = 3
#: The versions this geon reads (version 2 has no bodies).
VERSIONS = (2, 3)

#: Parameter values (a tuple in a tuple ...) and flattened axes (of flattened axes ...)
#: nest at most this deep in a document, so that neither reading nor the ops built
#: from it recurse without bound; a deeper one is a SerializationError, on writing too.
MAX_DEPTH = 32
#: Control-flow bodies nest at most this deep (a body's op holding a body is depth 2).
MAX_BODY_DEPTH = 16
#: A flattened axis stands for at most this many plain axes, its parts' parts counted
#: (with repeats: ``((A*B)*(A*B)*...)`` made of shared parts counts every use).
MAX_FLAT_AXES = 4096

#: The dtypes a document may use, by NumPy name.
DTYPES = {n: np.dtype(n) for n in (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128")}
_DT = ", ".join(DTYPES)


def _fail(where, message):
    return SerializationError(f"{where}: {message}" if where else message)


def _clip(text, limit=120):
    """``text``, its middle cut out past ``limit`` characters (a deep place's path)."""
    return text if len(text) <= limit else text[:limit // 2] + " ... " + text[-limit // 3:]


# --- checked reading of JSON values -----------------------------------------------------

def _expect(ok, what):
    def check(data, where):
        if not ok(data):
            raise _fail(where, f"expected {what}, got {_json_type(data)}")
        return data
    return check


_bool = _expect(lambda d: isinstance(d, bool), "true or false")
_str = _expect(lambda d: isinstance(d, str) and d, "a non-empty string")
_list = _expect(lambda d: isinstance(d, list), "a list")
_is_int = _expect(lambda d: isinstance(d, int) and not isinstance(d, bool), "an integer")
_b64 = _expect(lambda d: isinstance(d, str), "a base64 string")


def _int(data, where, lo=-math.inf):
    if _is_int(data, where) < lo:
        raise _fail(where, f"expected an integer >= {lo}, got {data}")
    return data


def _dict(data, where, allowed=None, required=(), what="key"):
    if not isinstance(data, dict):
        raise _fail(where, f"expected an object, got {_json_type(data)}")
    if allowed is not None:
        unknown = [k for k in data if k not in allowed]
        if unknown:
            raise _fail(where, f"unknown key {unknown[0]!r} (allowed: "
                               f"{', '.join(sorted(allowed)) or 'none'})")
    for k in required:
        if k not in data:
            raise _fail(where, f"missing {what} {k!r}")
    return data


def _json_type(data):
    """A short description of a JSON value for messages: ``null``, ``'abc'``, ``2``..."""
    if data is None or isinstance(data, bool):
        return json.dumps(data)
    if isinstance(data, (int, float, str)):
        text = repr(data[:40] + ("..." if len(data) > 40 else "") if isinstance(data, str)
                    else data)
        return text if len(text) <= 40 else text[:37] + "..."
    return {list: "a list", dict: "an object"}.get(type(data), type(data).__name__)


def _dtype_name(dtype, where=""):
    dtype = np.dtype(dtype)
    if DTYPES.get(dtype.name) != dtype:
        raise _fail(where, f"dtype {dtype} cannot be serialized (supported: {_DT})")
    return dtype.name


def _dtype(data, where):
    if not isinstance(data, str) or data not in DTYPES:
        raise _fail(where, f"unknown dtype {_json_type(data)} (supported: {_DT})")
    return DTYPES[data]


def encode_array(value, where=""):
    """``{"dtype", "shape", "data"}``: the array's little-endian bytes in base64."""
    arr = np.asarray(value)
    name = _dtype_name(arr.dtype, where)
    le = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<"))
    return {"dtype": name, "shape": list(arr.shape),
            "data": base64.b64encode(le.tobytes()).decode("ascii")}


def decode_array(data, where):
    """The array :func:`encode_array` wrote; checks the byte count before allocating."""
    _dict(data, where, {"dtype", "shape", "data"}, ("dtype", "shape", "data"))
    dtype = _dtype(data["dtype"], f"{where}.dtype")
    shape = tuple(_int(n, f"{where}.shape[{i}]", 0)
                  for i, n in enumerate(_list(data["shape"], f"{where}.shape")))
    _b64(data["data"], f"{where}.data")
    want = math.prod(shape) * dtype.itemsize
    if len(data["data"]) > 4 * (want // 3 + 1):
        raise _fail(f"{where}.data", f"longer than {dtype} {list(shape)} needs")
    try:
        raw = base64.b64decode(data["data"].encode("ascii"), validate=True)
    except (binascii.Error, ValueError, UnicodeEncodeError) as e:
        raise _fail(f"{where}.data", f"not valid base64 ({e})") from None
    if len(raw) != want:
        raise _fail(f"{where}.data", f"{len(raw)} bytes, but {dtype} {list(shape)} needs "
                                     f"{want}")
    arr = (np.frombuffer(raw, np.uint8) != 0 if dtype.kind == "b" else
           np.frombuffer(raw, dtype.newbyteorder("<")).astype(dtype)).reshape(shape)
    arr.setflags(write=False)
    return arr


class MissingValue:
    """A parameter that was a function when the graph was written (a Variable's
    initial value): calling it raises."""

    def __init__(self, name):
        self.name = name

    def __call__(self, shape):
        raise SerializationError(f"{self.name} was serialized without its value (its initial "
                                 f"value is a function); restore a checkpoint before running, "
                                 f"or serialize with values=transformer.state_view()")

    def __repr__(self):
        return "<not serialized>"


# --- parameter values, encoded by Python type ------------------------------------------------

def _float(data, where):
    if isinstance(data, dict) and set(data) == {"float"}:
        data = data["float"]
        if data in ("nan", "inf", "-inf"):
            return float(data)
    elif isinstance(data, (int, float)) and not isinstance(data, bool):
        return float(data)
    raise _fail(where, f"expected a number, got {_json_type(data)}")


def _encode_float(v):
    return v if math.isfinite(v) else {"float": repr(v)}


def _parts(data, n, where):
    if len(_list(data, where)) != n:
        raise _fail(where, f"expected a list of {n}, got {len(data)} entries")
    return enumerate(data)


def _encode_slice(enc, k, where):
    parts = [k.start, k.stop, k.step]
    if any(p is not None and not isinstance(p, (int, np.integer, Sym)) for p in parts):
        raise _fail(where, f"slice {k} has a part that is not an integer")
    return [None if p is None else enc.value(p, where) if isinstance(p, Sym) else int(p)
            for p in parts]


def _decode_slice_part(d, x, where):
    if x is None:
        return None
    if isinstance(x, dict):  # a symbolic bound
        v = d.value(x, where)
        if not isinstance(v, Sym):
            raise _fail(where, "a slice's part is an integer, a length or null")
        return v
    return _int(x, where)


#: Python type -> (tag, encode(encoder, value, where), decode(decoder, data, where)): a
#: value of such a type is written as ``{tag: encoded}``. Looked up along the type's MRO.
CODECS = {
    float: ("float", None, lambda d, x, w: _float({"float": x}, w)),  # non-finite only
    complex: ("complex", lambda e, v, w: [_encode_float(v.real), _encode_float(v.imag)],
              lambda d, x, w: complex(*[_float(p, f"{w}[{i}]") for i, p in _parts(x, 2, w)])),
    tuple: ("tuple", lambda e, v, w: [e.value(x, f"{w}[{i}]") for i, x in enumerate(v)],
            lambda d, x, w: tuple(d.value(p, f"{w}[{i}]")
                                  for i, p in enumerate(_list(x, w)))),
    slice: ("slice", _encode_slice, lambda d, x, w: slice(*[
        _decode_slice_part(d, p, f"{w}[{i}]") for i, p in _parts(x, 3, w)])),
    Sym: ("length", lambda e, v, w: repr(v),
          lambda d, x, w: _checked(parse, w, _str(x, w))),
    Axis: ("axis", lambda e, v, w: e.axis(v, w), lambda d, x, w: d.axis(x, w)),
    Axes: ("axes", lambda e, v, w: [e.axis(a, w) for a in v], lambda d, x, w: d.axes(x, w)),
    np.dtype: ("dtype", lambda e, v, w: _dtype_name(v, w), lambda d, x, w: _dtype(x, w)),
    np.ndarray: ("array", lambda e, v, w: encode_array(v, w),
                 lambda d, x, w: decode_array(x, w)),
    np.generic: ("array", lambda e, v, w: encode_array(v, w), None),
    og.Op: ("op", lambda e, v, w: e.ref(v, w), lambda d, x, w: d.ref(x, w)),
}


def register_codec(cls, tag, encode, decode):
    """Write values of type ``cls`` as ``{tag: encode(encoder, value, where)}`` and read
    ``{tag: x}`` as ``decode(decoder, x, where)`` (``None``: not read)."""
    CODECS[cls] = (tag, encode, decode)


def _tags():
    """``{tag: decode}`` of the codecs registered now (modules register theirs when
    imported, after this one)."""
    tags = {tag: dec for tag, _, dec in CODECS.values() if dec is not None}
    tags["function"] = lambda d, x, w: MissingValue(d.op_name)
    return tags


# --- writing ------------------------------------------------------------------------------

class _Encoder:
    """Writes one graph's records: the document's, or (:meth:`nested`) a body's, whose
    records refer to its own ops by their ``ids`` and share the document's axes."""

    def __init__(self, ids, values=None, debug_info=True, classes=None, parent=None,
                 prefix=""):
        self.ids, self.values, self.debug_info = ids, values or {}, debug_info
        self.classes = classes if classes is not None else op_classes()
        self.prefix = prefix    # of the places in messages: the body's place
        # table: JSON entry, _axes: Axis (by name); one of each per document
        self.table, self._axes = (parent.table, parent._axes) if parent else ({}, {})
        self.root = parent.root if parent else self
        self.body_depth = parent.body_depth + 1 if parent else 0
        self.depth = parent.depth if parent else 0  # of the parameter value being written
        self.stand_ins = None   # the stand-ins of the op being written, from its first body
        self.wrote_body = False  # (of the root) a body was written: version 3

    def nested(self, ids, prefix):
        """The encoder of a body whose ops have ``ids``."""
        return _Encoder(ids, self.values, self.debug_info, self.classes, self, prefix)

    def axis(self, a, where=""):
        if isinstance(a, FlattenedAxis) and a.name not in self._axes:
            _check_flat(_flat_shape(a), a.name, where)
        return self._axis(a, where)

    def _axis(self, a, where):
        old = self._axes.get(a.name)
        if old is not None:
            if old is not a and _axis_key(old) != _axis_key(a):
                raise _fail(where, f"two different axes are named {a.name!r} ({old!r} and "
                                   f"{a!r}: length, batch, recurrent {_axis_key(old)} and "
                                   f"{_axis_key(a)}); a name must mean one axis in a graph")
            return a.name
        self._axes[a.name] = a
        length: Any = a.length
        if isinstance(length, Sym):  # a symbol or an expression, as text (symbols.parse)
            length = None
        self.table[a.name] = {"parts": [self._axis(p, where) for p in a.axes]} \
            if isinstance(a, FlattenedAxis) else {"length": length, **(
                {"symbol": repr(a.length)} if isinstance(a.length, Sym) else {}), **{
                k: True for k in ("batch", "recurrent") if getattr(a, k)}}
        return a.name

    def ref(self, op, where):
        s = og.snap(op)
        if s not in self.ids:
            raise _fail(where, f"refers to {s.name}, which is not in the graph")
        return [self.ids[s], _out_index(s)]

    def value(self, v, where):
        """The JSON form of a parameter value (see :data:`CODECS`)."""
        if v is None or isinstance(v, (bool, str)) or isinstance(v, float) and math.isfinite(v):
            return v
        if isinstance(v, (int, np.integer)):
            return int(v)
        codec = next((CODECS[k] for k in type(v).__mro__ if k in CODECS), None)
        if codec is not None:
            self.depth += 1
            try:
                if self.depth > MAX_DEPTH:
                    raise _fail(_clip(where), f"the value is nested more than {MAX_DEPTH} "
                                              f"deep")
                return {codec[0]: codec[1](self, v, where) if codec[1] else repr(v)}
            finally:
                self.depth -= 1
        if callable(v):
            return {"function": None}   # read back as a MissingValue
        raise _fail(where, f"cannot write a value of type {type(v).__name__} ({v!r})")


def _flat_shape(a):
    """``(depth, plain axes)`` of flattened axis ``a``: how deep its parts nest and how
    many plain axes it stands for (each use of a shared part counted), found without
    recursion and stopping early past the bounds."""
    too_deep = (MAX_DEPTH + 1, MAX_FLAT_AXES + 1)
    memo = {}
    stack = [(a, 1, False)]  # (axis, its depth below a, its parts done)
    while stack:
        f, depth, parts_done = stack.pop()
        if id(f) in memo:
            continue
        if not parts_done:
            if depth > MAX_DEPTH:  # a is too deep whatever lies below: stop here
                memo[id(f)] = too_deep
                continue
            stack.append((f, depth, True))
            stack.extend((p, depth + 1, False) for p in f.axes
                         if isinstance(p, FlattenedAxis) and id(p) not in memo)
            continue
        parts = [memo[id(p)] if isinstance(p, FlattenedAxis) else (0, 1) for p in f.axes]
        memo[id(f)] = (1 + max((d for d, _ in parts), default=0),
                       min(MAX_FLAT_AXES + 1, sum(n for _, n in parts)))
    return memo[id(a)]


def _check_flat(shape, name, where):
    depth, count = shape
    short = _clip(name, 60)
    if depth > MAX_DEPTH:
        raise _fail(where, f"flattened axis {short} nests more than {MAX_DEPTH} deep")
    if count > MAX_FLAT_AXES:
        raise _fail(where, f"flattened axis {short} stands for more than {MAX_FLAT_AXES} "
                           f"axes")


def _axis_key(a):
    return tuple(map(_axis_key, a.axes)) if isinstance(a, FlattenedAxis) else \
        (a.length, a.batch, a.recurrent)


def _outputs(op):  # the tensors op computes
    return op.outputs if isinstance(op, og.MultiOutput) else \
        [op] if isinstance(op, og.TensorOp) else []


def _out_index(op):  # which output of its op ``op`` is
    return op.index if isinstance(op, og.Output) else 0


def _written_attrs(cls):  # all but a tensor op's axes and dtype (its outputs give them)
    tensor = issubclass(cls, og.TensorOp)
    return [n for n in cls.attrs if not (tensor and n in ("axes", "dtype"))]


def _version():
    """geon's version (the top package, imported before any of its submodules)."""
    return sys.modules[__name__.partition(".")[0]].__version__


def serialize(ops: Union[og.Op, Sequence[og.Op]],
              values: Optional[Mapping[og.Variable, Any]] = None,
              indent: Optional[int] = None, debug_info: bool = True,
              metadata: Optional[dict] = None) -> str:
    """The graph of ``ops`` (an op, or a list or tuple of ops) as a JSON text.

    It holds every op the results need (args, other_deps, initializers), following
    ``forward`` as a transformer does (serialize before building computations to get
    the user's graph, after to get what the passes made of it).

    Args:
        ops: the result ops; :func:`deserialize` returns the same structure.
        values: ``{Variable: array}`` written as those variables' initial values (e.g.
            ``transformer.state_view()``, to save trained weights with the graph). An
            initial value that is a function is not written: the loaded variable
            raises :class:`SerializationError` if it is initialized without a restore.
        indent: passed to ``json.dumps`` (``None``: one line).
        debug_info: write each op's source location and ``derived_from``.
        metadata: a JSON-compatible dict stored as ``"metadata"`` (not interpreted).

    Raises :class:`SerializationError` for two op classes with one name, a parameter or
    dtype that cannot be written, a tag that is not a string, or two axes with one name.
    """
    results, single = og.as_op_list(ops, "serialize: ops")
    results = [og.require_valid(r) for r in results]
    values = dict(values or {})
    try:
        order = graph_ops(results)
    except GeonError as e:
        raise SerializationError(str(e)) from None
    # All ids first (user_deps and initializers may point forward). An Output op has no
    # record: it is referred to as [its multi-output op, index].
    written = [op for op in order if not isinstance(op, og.Output)]
    ids = {op: i for i, op in enumerate(written)}
    ids.update((op, ids[og.snap(op.args[0])]) for op in order if isinstance(op, og.Output))
    enc = _Encoder(ids, values, debug_info)
    records = [_record(op, ids[op], enc) for op in written]
    doc = {"format": FORMAT, "version": VERSION if enc.wrote_body else 2,
           "producer": f"geon {_version()}",
           "single": single, "axes": enc.table, "ops": records,
           "results": [[ids[r], _out_index(r) if isinstance(r, og.TensorOp) else None]
                       for r in results]}
    if metadata is not None:
        doc["metadata"] = metadata
    try:
        return json.dumps(doc, indent=indent, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise SerializationError(f"metadata is not JSON-compatible: {e}") from None


def _record(op, i, enc):
    """The record of ``op`` (id ``i``) in the graph ``enc`` writes."""
    cls, values = type(op), enc.values
    where = f"{enc.prefix}op {op.name} ({cls.__name__})"
    name = type_name(cls)
    enc.stand_ins = None
    if enc.classes.get(name) is not cls:
        raise _fail(where, f"another op class is also named {name!r}; a document could "
                           f"not tell them apart (rename one)")
    rec = {"id": i, "op": name, "name": op.name, "outputs": [
        {"axes": [enc.axis(a, where) for a in o.axes], "dtype": _dtype_name(o.dtype, where)}
        for o in _outputs(op)], "args": [enc.ref(a, f"{where}, args") for a in op.args]}
    for key, deps in (("other_deps", op.other_deps), ("user_deps", op.user_deps),
                      ("initializers", op._initializers)):
        refs = [enc.ids[s] for s in (og.snap(d) for d in deps) if s in enc.ids]
        if refs:
            rec[key] = refs
    for t in op.tags:
        if not isinstance(t, str):
            raise _fail(where, f"tag {t!r} is not a string")
        rec["tags"] = sorted(op.tags)
    attrs = op.attr_values()
    if isinstance(op, og.Variable) and op in values:
        v = np.asarray(values[op])
        if v.shape != op.axes.shape:
            raise _fail(where, f"values[{op.name}] has shape {v.shape}, its axes need "
                               f"{op.axes.shape}")
        attrs["initial_value"] = v.astype(op.dtype)
    optional = getattr(cls, "optional_attrs", ())
    written = {k: enc.value(attrs[k], f"{where}, attribute {k}") for k in _written_attrs(cls)
               if not (k in optional and attrs[k] is None)}
    if written:
        rec["attrs"] = written
    schema = getattr(op, "schema", None)
    refs = [] if schema is None else [getattr(schema, k) for k in schema.attrs]
    if schema is not None and all(og.snap(r) in enc.ids for r in refs if isinstance(r, og.Op)):
        rec["schema"] = {"kind": schema.kind, **{k: enc.value(r, f"{where}, schema {k}")
                                                 for k, r in zip(schema.attrs, refs)}}
    if enc.debug_info:
        rec["loc"] = [str(op.filename), int(op.lineno)]
        if op.derived_from is not None:
            rec["derived_from"] = str(op.derived_from)
    return rec


# --- reading --------------------------------------------------------------------------------

class LoadedGraph:
    """What :func:`deserialize_graph` read: ``results`` (a list), ``ops`` (in document
    order), ``single`` (:func:`serialize` was given one op) and ``metadata``."""

    def __init__(self, results: list[og.Op], ops: list[og.Op], single: bool,
                 metadata: Any) -> None:
        self.results, self.ops, self.single, self.metadata = results, ops, single, metadata

    @property
    def value(self) -> Union[og.Op, list[og.Op]]:
        """The results as :func:`serialize` was given them: an op, or a list."""
        return self.results[0] if self.single else list(self.results)

    @property
    def placeholders(self) -> list[og.Placeholder]:
        """The placeholders, in document order."""
        return [op for op in self.ops if isinstance(op, og.Placeholder)]

    @property
    def variables(self) -> list[og.Variable]:
        """The variables, in document order."""
        return [op for op in self.ops if isinstance(op, og.Variable)]

    def op(self, name: str) -> og.Op:
        """The op called ``name``; raises :class:`KeyError` if there is none or several."""
        found = [op for op in self.ops if op.name == name]
        if len(found) != 1:
            raise KeyError(f"{len(found)} ops are named {name!r}")
        return found[0]


class _Decoder:
    """Reads one graph's records: the document's, or (a subclass's, in
    :mod:`~geon.op_graph.serialize_bodies`) a body's, which refer to the body's own ops
    and share the document's axes."""

    def __init__(self, version=VERSION, parent=None, prefix=""):
        self.ops, self.n_out, self.types = [], [], []
        self.version = parent.version if parent else version
        self.classes = parent.classes if parent else op_classes()
        # axis name -> Axis, flattened axis name -> (depth, plain axes): one per document
        self.table, self.flat = (parent.table, parent.flat) if parent else ({}, {})
        self.body_depth = parent.body_depth + 1 if parent else 0
        self.depth = parent.depth if parent else 0  # of the parameter value being read
        self.prefix = prefix    # of the places in messages: the body's place
        self.limit = 0          # ops before this id may be referred to
        self.op_name = None     # the op being read (for MissingValue)
        self.stand_ins = None   # the stand-ins of the op being read, from its first body
        self.reading = None     # (op class, attribute) whose value is being read

    def add(self, op, where):
        """Append ``op``, just built from record ``len(self.ops)``; returns the op the
        graph keeps (a body keeps the stand-ins its op's first body made)."""
        self.ops.append(op)
        return op

    def axis(self, data, where):
        if not isinstance(data, str) or data not in self.table:
            raise _fail(where, f"unknown axis {_json_type(data)} (not in \"axes\")")
        return self.table[data]

    def axes(self, data, where):
        return _checked(Axes, where, [self.axis(n, f"{where}[{i}]")
                                      for i, n in enumerate(_list(data, where))])

    def id_list(self, rec, key, where, limit):
        """The ops whose ids ``rec[key]`` lists (each below ``limit``)."""
        out = []
        for j, d in enumerate(_list(rec.get(key, []), f"{where}.{key}")):
            if not 0 <= _int(d, f"{where}.{key}[{j}]") < limit:
                raise _fail(f"{where}.{key}[{j}]", f"dangling reference to op {d}")
            out.append(self.ops[d])
        return out

    def read_axes(self, data):
        _dict(data, "axes")
        for name, entry in data.items():
            where = _clip(f"axes[{name!r}]")
            _str(name, where)
            _dict(entry, where, {"length", "batch", "recurrent", "parts", "symbol"})
            if "parts" in entry:
                if len(entry) != 1:
                    raise _fail(where, "a flattened axis has only \"parts\"")
                parts = [self.axis(p, f"{where}.parts[{i}]")
                         for i, p in enumerate(_list(entry["parts"], f"{where}.parts"))]
                # (bounded before the axis is built: its length is a walk of its parts)
                shape = [self.flat.get(p.name, (0, 1)) for p in parts]
                self.flat[name] = (1 + max((d for d, _ in shape), default=0),
                                   sum(n for _, n in shape))
                _check_flat(self.flat[name], name, where)
                a = _checked(FlattenedAxis, where, parts)
                if a.name != name:
                    raise _fail(where, f"the parts make an axis named {a.name!r}")
            else:
                length = _dict(entry, where, required=("length",))["length"]
                if length is not None:
                    _int(length, f"{where}.length", 0)
                if "symbol" in entry:  # a symbolic length (symbols.py)
                    if length is not None:
                        raise _fail(where, "an axis has a length or a symbol, not both")
                    length = _checked(parse, f"{where}.symbol",
                                      _str(entry["symbol"], f"{where}.symbol"))
                a = Axis(length, name, _bool(entry.get("batch", False), f"{where}.batch"),
                         _bool(entry.get("recurrent", False), f"{where}.recurrent"))
            self.table[name] = a

    def ref(self, data, where, allow_op=False):
        """``[id, output]`` of an op before ``limit``; ``[id, null]`` (the op itself, for
        a result) if ``allow_op``."""
        _parts(data, 2, where)
        i, limit = _int(data[0], f"{where}[0]"), self.limit
        if not 0 <= i < limit:
            raise _fail(where, f"dangling reference to op {i}"
                               + (f" (only ops 0..{limit - 1} are defined before it)"
                                  if limit else " (no op is defined before it)"))
        op, k = self.ops[i], data[1]
        if k is None and allow_op:
            return op
        k = _int(k, f"{where}[1]")
        if not 0 <= k < self.n_out[i]:
            raise _fail(where, f"op {i} ({op.name}) has {self.n_out[i]} output(s), no "
                               f"output {k}")
        return op.outputs[k] if isinstance(op, og.MultiOutput) else op

    def value(self, data, where):
        """The parameter value :meth:`_Encoder.value` wrote."""
        if data is None or isinstance(data, (bool, str, int, float)):
            return data
        if isinstance(data, dict) and len(data) == 1:
            (tag, x), = data.items()
            tags = _tags()
            decode = tags.get(tag)
            if decode is not None:
                self.depth += 1
                try:
                    if self.depth > MAX_DEPTH:
                        raise _fail(_clip(where), f"the value is nested more than "
                                                  f"{MAX_DEPTH} deep")
                    return decode(self, x, f"{where}.{tag}")
                finally:
                    self.depth -= 1
        raise _fail(where, f"expected a parameter value (a JSON scalar or one of "
                           f"{', '.join(sorted(_tags()))}), got {_json_type(data)}")


_OP_KEYS = {"id", "op", "name", "outputs", "args", "other_deps", "user_deps",
            "initializers", "tags", "attrs", "loc", "derived_from", "schema"}
_TOP_KEYS = {"format", "version", "producer", "single", "axes", "ops", "results",
             "metadata"}


def _checked(make, where, arg):
    try:
        return make(arg)
    except (GeonError, ValueError) as e:
        raise _fail(where, str(e)) from None


def _reject_constant(name):
    raise ValueError(f"{name} is not valid JSON")


def deserialize_graph(text: str) -> "LoadedGraph":
    """Read a document written by :func:`serialize`; returns a ``LoadedGraph``.

    ``text`` is a ``str`` (or UTF-8 ``bytes``). Raises :class:`SerializationError`,
    naming the place, for text that is not JSON, another format or a version other than
    2 and 3, a body in a version 2 document or one that reads what a body may not, an
    unknown op type, axis or dtype, a dangling reference, an op whose constructor
    rejects what the document says, or a schema that does not describe its op.
    """
    if not isinstance(text, (str, bytes, bytearray)):
        raise TypeError(f"deserialize takes a JSON str, not {type(text).__name__}")
    try:
        text = bytes(text).decode("utf-8") if not isinstance(text, str) else text
        doc = json.loads(text, parse_constant=_reject_constant)
    except UnicodeDecodeError as e:
        raise SerializationError(f"not UTF-8 text: {e}") from None
    except RecursionError:
        raise SerializationError("not valid JSON: nested too deeply") from None
    except ValueError as e:  # json.JSONDecodeError, and the integer digit limit
        raise SerializationError(f"not valid JSON: {e}") from None
    _dict(doc, "document", _TOP_KEYS, ("format", "version", "axes", "ops", "results"))
    if doc["format"] != FORMAT:
        raise _fail("format", f"expected {FORMAT!r}, got {_json_type(doc['format'])}")
    version = doc["version"]
    if type(version) is not int or version not in VERSIONS:
        raise SerializationError(f"version: this geon reads versions "
                                 f"{' and '.join(map(str, VERSIONS))}, the document has "
                                 f"version {_json_type(version)}")
    single = _bool(doc.get("single", False), "single")
    dec = _Decoder(version)
    dec.read_axes(doc["axes"])
    try:
        read_graph(dec, _list(doc["ops"], "ops"))
    except RecursionError:  # (bounded by MAX_DEPTH and MAX_BODY_DEPTH; a safety net)
        raise SerializationError("the document nests too deeply") from None
    results = [dec.ref(r, f"results[{j}]", allow_op=True)
               for j, r in enumerate(_list(doc["results"], "results"))]
    if single and len(results) != 1:
        raise SerializationError(f"results: \"single\" is true but there are "
                                 f"{len(results)} results")
    return LoadedGraph(results, dec.ops, single, doc.get("metadata"))


def read_graph(dec, records):
    """Build the ops of ``records`` (a list of op records) into ``dec.ops``."""
    for i, rec in enumerate(records):
        dec.limit = i
        _read_op(i, rec, dec)
    # Building a user adopts a weak constant arg's dtype: give back the document's.
    weak = [(op, t[1]) for op, t in zip(dec.ops, dec.types) if getattr(op, "weak", False)]
    dec.limit = n = len(records)
    for i, (rec, op) in enumerate(zip(records, dec.ops)):  # may point forward
        where = f"{dec.prefix}ops[{i}] ({rec['op']} {op.name!r})"
        op.user_deps = OrderedSet(dec.id_list(rec, "user_deps", where, n))
        op.initializers = dec.id_list(rec, "initializers", where, n)
        if "schema" in rec:
            op.schema = _read_schema(rec["schema"], dec, f"{where}.schema", op)
    restore_weak(weak)


def deserialize(text: str) -> Any:
    """The results of a document: an op or a list, as :func:`serialize` was given them
    (see :func:`deserialize_graph`)."""
    return deserialize_graph(text).value


def _read_op(i, rec, dec):
    where = f"{dec.prefix}ops[{i}]"
    _dict(rec, where, _OP_KEYS, ("id", "op", "name", "outputs", "args"))
    if _int(rec["id"], f"{where}.id") != i:
        raise _fail(f"{where}.id", f"is {rec['id']}; ids number the ops 0, 1, 2, ... in order")
    type_name_ = rec["op"]
    cls = dec.classes.get(type_name_) if isinstance(type_name_, str) else None
    if cls is None:
        raise _fail(f"{where}.op", f"unknown op type {_json_type(type_name_)}")
    name = dec.op_name = _str(rec["name"], f"{where}.name")
    where = f"{dec.prefix}ops[{i}] ({type_name_} {name!r})"
    dec.stand_ins = None
    if cls is og.Output:
        raise _fail(f"{where}.op", "an Output has no record of its own; refer to it as "
                                   "[its multi-output op, output index]")
    outputs = _list(rec["outputs"], f"{where}.outputs")
    tensor, multi = issubclass(cls, og.TensorOp), issubclass(cls, og.MultiOutput)
    if (not outputs) if multi else len(outputs) != tensor:
        raise _fail(f"{where}.outputs", f"has {len(outputs)} entries; a {type_name_} op has "
                                        f"{'at least 1' if multi else int(tensor)}")
    types = []
    for k, o in enumerate(outputs):
        o = _dict(o, f"{where}.outputs[{k}]", {"axes", "dtype"}, ("axes", "dtype"))
        types.append((dec.axes(o["axes"], f"{where}.outputs[{k}].axes"),
                      _dtype(o["dtype"], f"{where}.outputs[{k}].dtype")))
    args = [dec.ref(r, f"{where}.args[{j}]")
            for j, r in enumerate(_list(rec["args"], f"{where}.args"))]
    deps = dec.id_list(rec, "other_deps", where, i)
    tags = [_str(t, f"{where}.tags[{j}]")
            for j, t in enumerate(_list(rec.get("tags", []), f"{where}.tags"))]
    names = _written_attrs(cls)
    optional = getattr(cls, "optional_attrs", ())  # None when left out
    data = _dict(rec.get("attrs", {}), f"{where}.attrs", set(names),
                 [n for n in names if n not in optional], "attribute")
    attrs = {}
    for n in names:
        dec.reading = (cls, n)  # (a body may be read only as certain attributes)
        attrs[n] = dec.value(data[n], f"{where}.attrs.{n}") if n in data else None
    dec.reading = None
    if tensor:
        attrs.update({k: v for k, v in zip(("axes", "dtype"), types[0]) if k in cls.attrs})
    loc = _list(rec.get("loc", ["<unknown>", 0]), f"{where}.loc")
    if len(loc) != 2 or not isinstance(loc[0], str):
        raise _fail(f"{where}.loc", "expected [file name, line number]")
    derived = rec.get("derived_from")
    derived = None if derived is None else _str(derived, f"{where}.derived_from")
    try:
        op = build(cls, args, attrs, name, tags, deps)
    except Exception as e:  # the constructor's own checks, in the user's terms
        raise _fail(where, f"{type(e).__name__}: {e}") from None
    got = [(o.axes, o.dtype) for o in _outputs(op)]
    if any(g[0].names != t[0].names or g[0].lengths != t[0].lengths or g[1] != t[1]
           for g, t in zip(got, types)) or len(got) != len(types):
        raise _fail(where + ".outputs" * multi, "the document says " + "; ".join(
            f"{show_axes(a)} {d}" for a, d in types) + ", but the args give " + "; ".join(
            f"{show_axes(a)} {d}" for a, d in got))
    copy_debug_info(op, loc[0], _int(loc[1], f"{where}.loc[1]", 0), derived)
    dec.add(op, where)
    dec.n_out.append(len(outputs))
    dec.types.append(types[0] if tensor else None)


def _read_schema(data, dec, where, op):
    _dict(data, where, required=("kind",))
    cls = SCHEMAS.get(data["kind"]) if isinstance(data["kind"], str) else None
    if cls is None:
        raise _fail(f"{where}.kind", f"unknown schema kind {_json_type(data['kind'])}")
    _dict(data, where, {"kind", *cls.attrs}, cls.attrs)
    values = {k: dec.value(data[k], f"{where}.{k}") for k in cls.attrs}
    try:
        schema = cls(**values)
        ok = isinstance(op, og.TensorOp) and schema.matches(op)
    except Exception:  # a value of another kind (a body, a number for axes, ...)
        ok = False
    if not ok:
        raise _fail(where, f"the {cls.kind} schema does not describe this op (its "
                           f"references must be the ops that compute it)")
    return schema
