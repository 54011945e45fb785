"""JSON serialization of op graphs, and copying a graph.

:func:`serialize` writes the ops reachable from some result ops (through args,
other_deps and initializers) as one JSON document; :func:`deserialize` reads it back
into fresh ops. The format (``"format": "geon-graph"``, ``"version": 1``) is described
field by field in ``doc/interchange.rst``. In short::

    {"format": "geon-graph", "version": 1, "producer": "geon 0.1.0", "single": true,
     "axes": {"C": {"length": 3}, "N": {"length": 5, "batch": true}},
     "ops": [{"id": 0, "op": "Placeholder", "name": "x",
              "outputs": [{"axes": ["C", "N"], "dtype": "float32"}], "args": [],
              "tags": ["in"], "loc": ["model.py", 12]},
             {"id": 1, "op": "Tanh", "name": "Tanh_0",
              "outputs": [{"axes": ["C", "N"], "dtype": "float32"}], "args": [[0, 0]]}],
     "results": [[1, 0]]}

A value is referred to as ``[op id, output index]``: every op of this version has one
output (tensor ops) or none (``SetItem``, ``Assign``), and an op with several outputs
would list them all under ``"outputs"``.

Loading never executes code from the document: op types are looked up in a table of
known classes (:data:`SPECS`), numbers are checked, arrays are raw little-endian bytes
(base64), and every op is rebuilt through its class's constructor, so the checks that
run when a user builds the op (axes, dtypes, shapes) run again. Anything wrong raises
:class:`~geon.errors.SerializationError` naming the place in the document.

The same table drives :func:`clone_graph` (a copy of a graph that shares its
placeholders and variables), the attribute part of the CSE pass's key, and the
attributes shown by :mod:`geon.op_graph.printing`.
"""

import base64
import binascii
import json
import math

import numpy as np

from geon.errors import GeonError, SerializationError
from geon.op_graph import op_graph as og
from geon.op_graph import primitives as pr
from geon.op_graph import schemas as sc
from geon.op_graph.axes import Axes, Axis, FlattenedAxis
from geon.op_graph.nodes import OrderedSet

FORMAT = "geon-graph"
#: The version this geon writes and the only one it reads.
VERSION = 1

#: The dtypes a document may use, by NumPy name.
DTYPES = {n: np.dtype(n) for n in (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128")}


def _fail(where, message):
    return SerializationError(f"{where}: {message}" if where else message)


# --- graph walks (iterative; they follow ``forward`` like a transformer does) -----------

def live_deps(op):
    """``op``'s args then other_deps, each followed to the live op (:func:`og.snap`)."""
    return [og.snap(d) for d in op.all_deps()]


def graph_ops(results, stop=(), initializers=True):
    """The live ops ``results`` need (args, other_deps and, if ``initializers``, the
    initializers of those ops with what they need), each after its dependencies. Ops in
    ``stop`` are listed but not looked into."""
    stop = set(stop)
    roots = [og.snap(r) for r in results]

    def children(op):
        return () if op in stop else live_deps(op)

    order = og.toposort(roots, children=children)
    if not initializers:
        return order
    seen = set(order)
    while True:
        extra = [og.snap(i) for op in order for i in op.initializers]
        extra = [i for i in dict.fromkeys(extra) if i not in seen]
        if not extra:
            return order
        more = [op for op in og.toposort(extra, children=children) if op not in seen]
        order.extend(more)
        seen.update(more)


# --- attribute kinds: how one constructor attribute is written, read, keyed, shown ------

def _is_int(v):
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _int(data, where, lo=None):
    if not isinstance(data, int) or isinstance(data, bool):
        raise _fail(where, f"expected an integer, got {_json_type(data)}")
    if lo is not None and data < lo:
        raise _fail(where, f"expected an integer >= {lo}, got {data}")
    return data


def _bool(data, where):
    if not isinstance(data, bool):
        raise _fail(where, f"expected true or false, got {_json_type(data)}")
    return data


def _str(data, where):
    if not isinstance(data, str) or not data:
        raise _fail(where, f"expected a non-empty string, got {_json_type(data)}")
    return data


def _list(data, where):
    if not isinstance(data, list):
        raise _fail(where, f"expected a list, got {_json_type(data)}")
    return data


def _dict(data, where, allowed=None, required=()):
    if not isinstance(data, dict):
        raise _fail(where, f"expected an object, got {_json_type(data)}")
    if allowed is not None:
        unknown = [k for k in data if k not in allowed]
        if unknown:
            raise _fail(where, f"unknown key {unknown[0]!r} (allowed: "
                               f"{', '.join(sorted(allowed))})")
    for k in required:
        if k not in data:
            raise _fail(where, f"missing key {k!r}")
    return data


def _json_type(data):
    """A short description of a JSON value for messages: ``null``, ``'abc'``, ``2``..."""
    if data is None:
        return "null"
    if isinstance(data, bool):
        return str(data).lower()
    if isinstance(data, (int, float)):
        text = repr(data)
        return text if len(text) <= 40 else text[:37] + "..."
    if isinstance(data, str):
        return repr(data[:40] + ("..." if len(data) > 40 else ""))
    return {list: "a list", dict: "an object"}.get(type(data), type(data).__name__)


def _dtype_name(dtype, where=""):
    dtype = np.dtype(dtype)
    if DTYPES.get(dtype.name) != dtype:
        raise _fail(where, f"dtype {dtype} cannot be serialized (supported: "
                           f"{', '.join(DTYPES)})")
    return dtype.name


def _dtype(data, where):
    if not isinstance(data, str) or data not in DTYPES:
        raise _fail(where, f"unknown dtype {_json_type(data)} (supported: "
                           f"{', '.join(DTYPES)})")
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
    if not isinstance(data["data"], str):
        raise _fail(f"{where}.data", f"expected a base64 string, got "
                                     f"{_json_type(data['data'])}")
    try:
        raw = base64.b64decode(data["data"].encode("ascii"), validate=True)
    except (binascii.Error, ValueError, UnicodeEncodeError) as e:
        raise _fail(f"{where}.data", f"not valid base64 ({e})") from None
    want = math.prod(shape) * dtype.itemsize
    if len(raw) != want:
        raise _fail(f"{where}.data", f"{len(raw)} bytes, but {dtype} {list(shape)} needs "
                                     f"{want}")
    if dtype.kind == "b":
        arr = np.frombuffer(raw, np.uint8) != 0
    else:
        arr = np.frombuffer(raw, dtype.newbyteorder("<")).astype(dtype)
    return arr.reshape(shape)


def _array_key(a):
    a = np.asarray(a)
    return (a.dtype.str, a.shape, a.tobytes())


def _show_array(a):
    a = np.asarray(a)
    if a.ndim == 0:
        return repr(a[()].item())
    if a.size <= 6:
        return np.array2string(a.reshape(-1), separator=", ") \
            + ("" if a.ndim == 1 else f".reshape{a.shape}")
    return f"<{a.dtype} array {a.shape}>"


def _encode_index(k, where):
    if isinstance(k, slice):
        parts = (k.start, k.stop, k.step)
        if any(p is not None and not _is_int(p) for p in parts):
            raise _fail(where, f"slice {k} has a part that is not an integer")
        return {"slice": [None if p is None else int(p) for p in parts]}
    if _is_int(k):
        return int(k)
    raise _fail(where, f"index {k!r} is neither an integer nor a slice")


def _decode_index(data, where):
    if isinstance(data, dict):
        _dict(data, where, {"slice"}, ("slice",))
        parts = _list(data["slice"], f"{where}.slice")
        if len(parts) != 3:
            raise _fail(f"{where}.slice", f"expected [start, stop, step], got {len(parts)} "
                                          f"entries")
        vals = [None if p is None else _int(p, f"{where}.slice[{i}]")
                for i, p in enumerate(parts)]
        if vals[2] == 0:
            raise _fail(f"{where}.slice", "the step is 0")
        return slice(*vals)
    return _int(data, where)


def _index_key(k):
    return ("slice", k.start, k.stop, k.step) if isinstance(k, slice) else int(k)


def _show_index(k):
    if isinstance(k, slice):
        return ":".join("" if v is None else str(v) for v in (k.start, k.stop, k.step))
    return str(k)


def _encode_literal(v, where):
    if v is None or isinstance(v, (bool, str)) or _is_int(v):
        return v if not _is_int(v) else int(v)
    if isinstance(v, float):
        return v if math.isfinite(v) else {"float": repr(v)}
    if isinstance(v, tuple):
        return {"tuple": [_encode_literal(x, where) for x in v]}
    raise _fail(where, f"parameter value {v!r} is not a number, string, bool, None or tuple")


def _decode_literal(data, where):
    if data is None or isinstance(data, (bool, str, int, float)):
        return data
    if isinstance(data, dict) and set(data) == {"float"}:
        if data["float"] not in ("nan", "inf", "-inf"):
            raise _fail(where, f"bad float {_json_type(data['float'])}")
        return float(data["float"])
    if isinstance(data, dict) and set(data) == {"tuple"}:
        items = _list(data["tuple"], f"{where}.tuple")
        return tuple(_decode_literal(x, f"{where}.tuple[{i}]") for i, x in enumerate(items))
    raise _fail(where, f"expected a literal, got {_json_type(data)}")


class Kind:
    """How one kind of attribute value is written (``encode(value, enc, where)``), read
    (``decode(data, dec, where)``), compared (``key(value)``, hashable, equal exactly when
    the values mean the same) and printed (``show(value)``). ``optional`` kinds may be
    ``None`` (written as an absent key)."""

    def __init__(self, encode, decode, key, show=repr, optional=False, inline=False):
        self.encode, self.decode, self.key, self.show = encode, decode, key, show
        self.optional = optional
        self.inline = inline  # shown without its attribute name (user op parameters)


def _opt(kind):
    return Kind(kind.encode, kind.decode, lambda v: None if v is None else kind.key(v),
                lambda v: "None" if v is None else kind.show(v), optional=True)


def _show_axes(axes):
    return "(" + ", ".join(repr(a) for a in axes) + ")"


def _decode_value(data, dec, where):
    arr = decode_array(data, where)
    return arr[()].item() if arr.ndim == 0 else arr


KINDS = {
    "int": Kind(lambda v, e, w: int(v), lambda d, dc, w: _int(d, w), int, str),
    "bool": Kind(lambda v, e, w: bool(v), lambda d, dc, w: _bool(d, w), bool, str),
    "ints": Kind(lambda v, e, w: [int(x) for x in v],
                 lambda d, dc, w: tuple(_int(x, f"{w}[{i}]")
                                        for i, x in enumerate(_list(d, w))),
                 lambda v: tuple(int(x) for x in v), lambda v: str(tuple(v))),
    "opt_ints": Kind(lambda v, e, w: [None if x is None else int(x) for x in v],
                     lambda d, dc, w: tuple(None if x is None else _int(x, f"{w}[{i}]")
                                            for i, x in enumerate(_list(d, w))),
                     lambda v: tuple(v), lambda v: str(tuple(v))),
    "axis": Kind(lambda v, e, w: e.axis(v, w), lambda d, dc, w: dc.axis(d, w),
                 lambda v: v.name, repr),
    "axes": Kind(lambda v, e, w: [e.axis(a, w) for a in v],
                 lambda d, dc, w: dc.axes(d, w), lambda v: Axes(v).names, _show_axes),
    "index": Kind(lambda v, e, w: _encode_index(v, w), lambda d, dc, w: _decode_index(d, w),
                  _index_key, _show_index),
    "indices": Kind(lambda v, e, w: [_encode_index(k, f"{w}[{i}]") for i, k in enumerate(v)],
                    lambda d, dc, w: tuple(_decode_index(k, f"{w}[{i}]")
                                           for i, k in enumerate(_list(d, w))),
                    lambda v: tuple(_index_key(k) for k in v),
                    lambda v: "[" + ", ".join(_show_index(k) for k in v) + "]"),
    "array": Kind(lambda v, e, w: encode_array(v, w), lambda d, dc, w: decode_array(d, w),
                  _array_key, _show_array),
    # a Python number (a weak constant's value): written as a 0-d array of its own type
    "number": Kind(lambda v, e, w: encode_array(np.asarray(v), w),
                   lambda d, dc, w: _decode_number(d, w), _array_key, repr),
    # a Variable's initial value: a number (0-d) or an array; None if not stored
    "value": Kind(lambda v, e, w: encode_array(v, w), _decode_value, _array_key,
                  _show_array),
    "literals": Kind(lambda v, e, w: {k: _encode_literal(x, f"{w}.{k}") for k, x in v.items()},
                     lambda d, dc, w: {k: _decode_literal(x, f"{w}.{k}")
                                       for k, x in _dict(d, w).items()},
                     lambda v: tuple(sorted((k, repr(x)) for k, x in v.items())),
                     lambda v: ", ".join(f"{k}={x!r}" for k, x in v.items()), inline=True),
}
for _k in ("array", "number", "value"):
    KINDS["opt_" + _k] = _opt(KINDS[_k])


def _decode_number(data, where):
    arr = decode_array(data, where)
    if arr.ndim:
        raise _fail(where, f"expected a single number, got shape {list(arr.shape)}")
    return arr[()].item()


# --- the table of op classes --------------------------------------------------------------

class OpSpec:
    """How an op class is written and rebuilt.

    ``fields``: ``(attribute, kind name)`` pairs, the constructor attributes beyond args,
    axes and dtype. ``get(op) -> {attribute: value}`` reads them (default: ``getattr``).
    ``build(cls, args, attrs, out, kw) -> op`` calls the constructor: ``out`` is
    ``(axes, dtype)`` for a tensor op (``None`` for a void op) and ``kw`` holds
    ``name``, ``tags`` and ``follows``. ``arity`` is the number of args (``None``: any).
    ``dtype_from_args``: the class always has its arg's dtype, so the constructor is
    not given one (``out[1]`` is ``None``) and the result is checked against the
    document instead.
    """

    def __init__(self, cls, fields=(), build=None, get=None, arity=None, type_name=None,
                 dtype_from_args=False):
        self.cls = cls
        self.dtype_from_args = dtype_from_args
        self.type_name = type_name or cls.__name__
        self.fields = tuple((f, KINDS[k]) for f, k in fields)
        self.build = build or _build_infer
        self._get = get
        self.arity = arity

    def get(self, op):
        if self._get is not None:
            return self._get(op)
        return {f: getattr(op, f) for f, _ in self.fields}

    def key(self, op):
        """A hashable key of the op's attributes (equal keys: the same attributes)."""
        attrs = self.get(op)
        return tuple(kind.key(attrs[f]) for f, kind in self.fields)

    def show(self, op):
        """``name=value`` text of the attributes (for printing)."""
        attrs = self.get(op)
        parts = [kind.show(attrs[f]) if kind.inline else f"{f}={kind.show(attrs[f])}"
                 for f, kind in self.fields if not (kind.optional and attrs[f] is None)]
        return ", ".join(p for p in parts if p)


#: class name -> :class:`OpSpec` (the ``"op"`` field of a document).
SPECS = {}
_BY_CLASS = {}


def register_op(cls, fields=(), build=None, get=None, arity=None, dtype_from_args=False):
    """Make ``cls`` serializable (and mergeable by CSE, printable with attributes).

    See :class:`OpSpec` for the arguments. The class is written under its class name;
    two classes with one name cannot both be registered.
    """
    spec = OpSpec(cls, fields, build, get, arity, dtype_from_args=dtype_from_args)
    old = SPECS.get(spec.type_name)
    if old is not None and old.cls is not cls:
        raise ValueError(f"another op class is already registered as {spec.type_name!r} "
                         f"({old.cls.__module__}.{old.cls.__qualname__})")
    SPECS[spec.type_name] = spec
    _BY_CLASS[cls] = spec
    return spec


def spec_for(op):
    """The :class:`OpSpec` of ``op``'s exact class, or ``None``."""
    spec = _BY_CLASS.get(type(op))
    if spec is None:
        spec = _user_op_spec(type(op))
    return spec


def _user_op_spec(cls):
    """Ops made by :func:`geon.define_op` are written as ``"user:<key>"`` with their
    parameters; the loading process must have defined the op under the same key."""
    try:
        from geon.op_graph.user_ops import UserOp
    except ImportError:  # pragma: no cover - a geon without user ops
        return None
    if not (isinstance(cls, type) and issubclass(cls, UserOp)) or cls.registry_key is None:
        return None
    return OpSpec(cls, [("params", "literals")], build=_build_user, arity=cls.arity,
                  type_name="user:" + cls.registry_key)


def _spec_by_name(name):
    if not isinstance(name, str):
        return None
    spec = SPECS.get(name)
    if spec is None and name.startswith("user:"):
        try:
            from geon.op_graph.user_ops import USER_OPS
        except ImportError:  # pragma: no cover
            return None
        cls = USER_OPS.get(name[5:])
        spec = _user_op_spec(cls) if cls is not None else None
    return spec


# --- builders: each calls the class's own constructor, so its checks run again ------------

def _build_infer(cls, args, attrs, out, kw):
    """Axes inferred from the args (elementwise, dot, ...)."""
    if out is None:
        return cls(*args, **kw)
    return cls(*args, dtype=out[1], **kw)


def _build_axes(cls, args, attrs, out, kw):
    """``cls(x, axes)``: broadcast, reorder, rename, flatten, reshape."""
    return cls(*args, out[0], dtype=out[1], **kw)


def _build_placeholder(cls, args, attrs, out, kw):
    return cls(out[0], dtype=out[1], **kw)


class MissingValue:
    """The initial value of a Variable written without its value (it was a function):
    calling it raises. Restore a checkpoint before running, or serialize with
    ``values=``."""

    def __init__(self, name):
        self.name = name

    def __call__(self, shape):
        raise SerializationError(
            f"variable {self.name} was serialized without its value (its initial value "
            f"is a function); restore a checkpoint before running, or serialize with "
            f"values=transformer.state_view()")

    def __repr__(self):
        return "<not serialized>"


def _get_variable(op):
    v = op.initial_value
    return {"trainable": op.trainable, "persistent": op.persistent,
            "initial_value": None if callable(v) else v}


def _build_variable(cls, args, attrs, out, kw):
    iv = attrs["initial_value"]
    if iv is None:
        iv = MissingValue(kw["name"])
    return cls(out[0], initial_value=iv, dtype=out[1], trainable=attrs["trainable"],
               persistent=attrs["persistent"], **kw)


def _get_constant(op):
    weak = bool(op.weak)
    return {"weak": weak, "value": None if weak else op.value,
            "number": op._number if weak else None}


def _build_constant(cls, args, attrs, out, kw):
    weak, value, number = attrs["weak"], attrs["value"], attrs["number"]
    if weak != (number is not None) or weak == (value is not None):
        raise SerializationError("a weak constant has a 'number' and no 'value'; any "
                                 "other constant a 'value' and no 'number'")
    c = cls(number if weak else value, axes=out[0], dtype=out[1], **kw)
    if weak:
        c.weak = True  # given dtype=, the constructor made it strong
    return c


def _build_reduction(cls, args, attrs, out, kw):
    return cls(*args, attrs["reduction_axes"], out[0], dtype=out[1], **kw)


def _build_tensor_size(cls, args, attrs, out, kw):
    return cls(*args, attrs["reduction_axes"], None, dtype=out[1], **kw)


def _build_slice(cls, args, attrs, out, kw):
    x, = args
    pos, key = attrs["axis_pos"], attrs["key"]
    if not 0 <= pos < len(x.axes):
        raise SerializationError(f"axis_pos {pos} is not a position of the arg's axes "
                                 f"{_show_axes(x.axes)}")
    new_axis = out[0][pos] if isinstance(key, slice) and pos < len(out[0]) else None
    return cls(x, x.axes[pos], key, new_axis, dtype=out[1], **kw)


def _build_one_hot(cls, args, attrs, out, kw):
    return cls(*args, attrs["axis"], dtype=out[1], **kw)


def _build_dimshuffle(cls, args, attrs, out, kw):
    return cls(*args, attrs["perm"], dtype=out[1], **kw)


def _build_expand(cls, args, attrs, out, kw):
    x, = args
    dim_map = attrs["dim_map"]
    for i, m in enumerate(dim_map):
        if m is not None and i < len(out[0]) and 0 <= m < len(x.axes) \
                and out[0][i].length != x.axes[m].length:
            raise SerializationError(f"dim_map {dim_map}: dimension {i} "
                                     f"({out[0][i]!r}) reads {x.axes[m]!r}")
    return cls(x, out[0], dim_map, dtype=out[1], **kw)


def _check_key(key, shape, want, what):
    if None in shape or None in want:
        return
    got = np.broadcast_to(np.zeros((), np.int8), shape)[tuple(key)].shape
    if got != tuple(want):
        raise SerializationError(f"key {KINDS['indices'].show(key)} of {what} shape "
                                 f"{list(shape)} gives shape {list(got)}, not {list(want)}")


def _build_sliceview(cls, args, attrs, out, kw):
    x, = args
    _check_key(attrs["key"], x.axes.lengths, out[0].lengths, "the arg's")
    return cls(x, attrs["key"], out[0], dtype=out[1], **kw)


def _build_unslice(cls, args, attrs, out, kw):
    x, = args
    _check_key(attrs["key"], out[0].lengths, x.axes.lengths, "the result's")
    return cls(x, out[0], attrs["key"], dtype=out[1], **kw)


def _build_reduce_prim(cls, args, attrs, out, kw):
    return cls(*args, attrs["axis"], dtype=out[1], **kw)


def _build_split(cls, args, attrs, out, kw):
    x = args[0]
    if not 0 <= attrs["axis_pos"] < len(x.axes):
        raise SerializationError(f"axis_pos {attrs['axis_pos']} is not a position of "
                                 f"{_show_axes(x.axes)}")
    return cls(x, x.axes[attrs["axis_pos"]], attrs["lengths"], **kw)


def _build_max_argmax(cls, args, attrs, out, kw):
    return cls(args[0], attrs["reduction_axes"], attrs["out_axes"], **kw)


def _build_user(cls, args, attrs, out, kw):
    return cls(*args, dtype=out[1], **attrs["params"], **kw)


def _register_standard_ops():
    unary = [og.Negative, og.Absolute, og.Sign, og.Square, og.Sqrt, og.Reciprocal, og.Exp,
             og.Log, og.Sin, og.Cos, og.Tanh, og.Sigmoid]
    binary = [og.Add, og.Subtract, og.Multiply, og.Divide, og.Power, og.Maximum, og.Minimum,
              og.Equal, og.NotEqual, og.Less, og.LessEqual, og.Greater, og.GreaterEqual,
              sc.SigmoidCrossEntropy]
    for cls in unary:
        register_op(cls, arity=1)
    for cls in binary + [og.Dot, pr.Gemm]:
        register_op(cls, arity=2)
    register_op(og.Placeholder, build=_build_placeholder, arity=0)
    register_op(og.Variable, [("trainable", "bool"), ("persistent", "bool"),
                              ("initial_value", "opt_value")],
                build=_build_variable, get=_get_variable, arity=0)
    register_op(og.Constant, [("weak", "bool"), ("value", "opt_array"),
                              ("number", "opt_number")],
                build=_build_constant, get=_get_constant, arity=0)
    register_op(og.SetItem, arity=2)
    register_op(pr.Assign, arity=2)
    for cls in (og.Sum, og.Prod, og.Max, og.Min, og.ArgMax, og.ArgMin):
        register_op(cls, [("reduction_axes", "axes")], build=_build_reduction, arity=1)
    register_op(og.TensorSize, [("reduction_axes", "axes")], build=_build_tensor_size,
                arity=1)
    # Views, renamings and copies have their arg's dtype.
    same = dict(arity=1, dtype_from_args=True)
    for cls in (og.Broadcast, og.AxesWithOrder, og.CastAxes, og.Flatten, pr.Reshape):
        register_op(cls, build=_build_axes, **same)
    for cls in (og.Unflatten, og.StopGradient, pr.Copy):
        register_op(cls, **same)
    register_op(og.Slice, [("axis_pos", "int"), ("key", "index")], build=_build_slice,
                **same)
    register_op(og.OneHot, [("axis", "axis")], build=_build_one_hot, arity=1)
    register_op(pr.Dimshuffle, [("perm", "ints")], build=_build_dimshuffle, **same)
    register_op(pr.Expand, [("dim_map", "opt_ints")], build=_build_expand, **same)
    register_op(pr.SliceView, [("key", "indices")], build=_build_sliceview, **same)
    register_op(pr.Unslice, [("key", "indices")], build=_build_unslice, **same)
    for cls in pr.REDUCE_PRIMS:
        register_op(cls, [("axis", "int")], build=_build_reduce_prim, arity=1)
    register_op(pr.ReduceMaxArgMax, [("axis", "int")],
                build=lambda cls, args, attrs, out, kw: cls(args[0], attrs["axis"], **kw),
                arity=1)
    register_op(og.Split, [("axis_pos", "int"), ("lengths", "ints")], build=_build_split,
                get=lambda op: {"axis_pos": op.axis_pos,
                                "lengths": [k.stop - k.start for k in op.keys]}, arity=1)
    register_op(og.MaxArgMax, [("reduction_axes", "axes"), ("out_axes", "axes")],
                build=_build_max_argmax, arity=1)
    # Outputs are written as references; the spec serves CSE and printing.
    register_op(og.Output, [("index", "int")], arity=1)


_register_standard_ops()


# --- rebuilding one op (shared by deserialize and clone_graph) ----------------------------

def _rebuild(spec, args, attrs, out, name, tags, other_deps):
    """Build an op through its constructor, then undo what the constructor does to the
    rest of the graph (``SetItem`` sets its target's ``user_deps``; args' ``user_deps``
    join ``other_deps``): the copy gets exactly ``other_deps``."""
    saved = [(a, a.user_deps) for a in args]
    given = (out[0], None) if out is not None and spec.dtype_from_args else out
    try:
        op = spec.build(spec.cls, list(args), attrs, given,
                        dict(name=name, tags=set(tags), follows=list(other_deps)))
    finally:
        for a, deps in saved:
            a.user_deps = deps
    want = set(other_deps)
    for d in list(op.other_deps):
        if d not in want:
            op.other_deps.discard(d)
            d._dep_users.discard(op)
    if type(op) is not spec.cls:
        raise SerializationError(f"the constructor of {spec.type_name} made a "
                                 f"{type(op).__name__}")
    if out is not None and (op.axes.names != out[0].names or op.axes.lengths != out[0].lengths
                            or op.dtype != out[1]):
        raise SerializationError(
            f"the document says {_show_axes(out[0])} {out[1]}, but the args give "
            f"{_show_axes(op.axes)} {op.dtype}")
    return op


def _copy_debug_info(op, filename, lineno, derived_from):
    op.filename, op.lineno = filename, lineno
    if derived_from is not None:
        op.derived_from = derived_from
    elif "derived_from" in op.__dict__:
        del op.derived_from


def _readopt_weak(constants):
    # Building a user adopts a weak constant arg's dtype; a graph keeps the last user's.
    for c, dtype in constants:
        if c.dtype != dtype:
            c._adopt(dtype)


def clone_graph(results, replace=None):
    """Copy the ops ``results`` need; returns ``{original op: copy}``.

    Placeholders and Variables (storage) are shared, not copied, and so are ops that
    are keys of ``replace`` (``{op: stand-in}``): the copy uses the stand-in and does not
    look into the op. The original graph is not changed. Raises :class:`GeonError` for
    an op class without an :class:`OpSpec`.
    """
    mapping = dict(replace or {})
    order = graph_ops(results, stop=mapping, initializers=False)
    weak = []
    for op in order:
        if op in mapping:
            continue
        if isinstance(op, og.AssignableTensorOp) and not op.is_constant:
            mapping[op] = op
            continue
        if isinstance(op, og.Output):  # the copy of its op already made it
            mapping[op] = mapping[og.snap(op.args[0])].outputs[op.index]
            continue
        spec = spec_for(op)
        if spec is None:
            raise GeonError(f"cannot copy {type(op).__name__} {op.name}: its class has no "
                            f"serialization rule (geon.op_graph.serialize.register_op)")
        out = (op.axes, op.dtype) if isinstance(op, og.TensorOp) else None
        new = _rebuild(spec, [mapping[og.snap(a)] for a in op.args], spec.get(op), out,
                       op.name, op.tags, [mapping[og.snap(d)] for d in op.other_deps])
        _copy_debug_info(new, op.filename, op.lineno, op.derived_from)
        new.initializers = list(op.initializers)
        mapping[op] = new
        if isinstance(new, og.Constant) and new.weak:
            weak.append((new, op.dtype))
    for op in order:
        new = mapping[op]
        if new is op or op in (replace or {}):
            continue
        schema = _map_schema(op.schema, mapping) if isinstance(op, og.TensorOp) else None
        if schema is not None:
            new.schema = schema
    _readopt_weak(weak)
    return mapping


def _map_schema(schema, mapping):
    def m(x):
        return mapping.get(og.snap(x)) if x is not None else None
    if isinstance(schema, sc.SoftmaxSchema):
        x, shifted, Z = m(schema.x), m(schema.shifted), m(schema.Z)
        if None not in (x, shifted, Z):
            return sc.SoftmaxSchema(x, shifted, Z, schema.normalization_axes)
    elif isinstance(schema, sc.SigmoidSchema):
        x = m(schema.x)
        if x is not None:
            return sc.SigmoidSchema(x)
    return None


# --- writing --------------------------------------------------------------------------------

class _Encoder:
    def __init__(self):
        self.table = {}     # name -> entry (JSON)
        self._axes = {}     # name -> Axis written under it

    def axis(self, a, where=""):
        old = self._axes.get(a.name)
        if old is not None:
            if old is not a and not _same_axis(old, a):
                raise _fail(where, f"two different axes are named {a.name!r} ({old!r} "
                                   f"{_flags(old)} and {a!r} {_flags(a)}); an axis name "
                                   f"must mean one axis within a graph")
            return a.name
        if isinstance(a, FlattenedAxis):
            parts = [self.axis(p, where) for p in a.axes]
            entry = {"parts": parts}
        else:
            entry = {"length": a.length}
            if a.batch:
                entry["batch"] = True
            if a.recurrent:
                entry["recurrent"] = True
        self._axes[a.name] = a
        self.table[a.name] = entry
        return a.name


def _flags(a):
    return ("batch " if a.batch else "") + ("recurrent" if a.recurrent else "")


def _same_axis(a, b):
    if isinstance(a, FlattenedAxis) or isinstance(b, FlattenedAxis):
        return isinstance(a, FlattenedAxis) and isinstance(b, FlattenedAxis) and \
            len(a.axes) == len(b.axes) and all(_same_axis(x, y) for x, y in zip(a.axes, b.axes))
    return (a.length, a.batch, a.recurrent) == (b.length, b.batch, b.recurrent)


def serialize(ops, values=None, indent=None, debug_info=True, metadata=None):
    """The graph of ``ops`` (an op, or a list or tuple of ops) as a JSON text.

    It holds every op the results need (args, other_deps, initializers), following
    ``forward`` as a transformer does (serialize before building computations to get
    the user's graph, after to get what the passes made of it).

    Args:
        ops: the result ops; :func:`deserialize` returns the same structure.
        values: ``{Variable: array}`` written as those variables' initial values (for
            example ``transformer.state_view()`` to save trained weights with the
            graph). Other variables keep an initial value that is a number or an array;
            one that is a function is written as absent, and the loaded variable raises
            :class:`SerializationError` if it is initialized without a restore.
        indent: passed to :func:`json.dumps` (``None``: one line).
        debug_info: write each op's source location and ``derived_from``.
        metadata: a JSON-compatible dict stored as ``"metadata"`` (not interpreted).

    Raises :class:`SerializationError` for an op class without a serialization rule, an
    unsupported dtype, a tag that is not a string, or two different axes with one name.
    """
    import geon
    results, single = og.as_op_list(ops, "serialize: ops")
    results = [og.require_valid(r) for r in results]
    values = dict(values or {})
    try:
        order = graph_ops(results)
    except GeonError as e:
        raise SerializationError(str(e)) from None
    # An Output op has no record: it is referred to as [its multi-output op, index].
    ids, n = {}, 0
    for op in order:  # all ids first: user_deps and initializers may point forward
        if isinstance(op, og.Output):
            ids[op] = ids[og.snap(op.args[0])]
        else:
            ids[op], n = n, n + 1
    enc = _Encoder()
    records = [_record(op, ids[op], ids, enc, values, debug_info) for op in order
               if not isinstance(op, og.Output)]
    doc = {"format": FORMAT, "version": VERSION, "producer": f"geon {geon.__version__}",
           "single": single, "axes": enc.table, "ops": records,
           "results": [[ids[r], _out_index(r) if isinstance(r, og.TensorOp) else None]
                       for r in results]}
    if metadata is not None:
        doc["metadata"] = metadata
    try:
        return json.dumps(doc, indent=indent, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise SerializationError(f"metadata is not JSON-compatible: {e}") from None


def _out_index(op):
    """Which output of its op ``op`` is: its index for an :class:`Output`, else 0."""
    return op.index if isinstance(op, og.Output) else 0


def _record(op, i, ids, enc, values, debug_info):
    where = f"op {op.name} ({type(op).__name__})"
    spec = spec_for(op)
    if spec is None:
        raise SerializationError(f"{where}: no serialization rule for "
                                 f"{type(op).__name__} (register one with "
                                 f"geon.op_graph.serialize.register_op)")
    rec = {"id": i, "op": spec.type_name, "name": op.name}
    outs = op.outputs if isinstance(op, og.MultiOutput) else \
        [op] if isinstance(op, og.TensorOp) else []
    rec["outputs"] = [{"axes": [enc.axis(a, where) for a in o.axes],
                       "dtype": _dtype_name(o.dtype, where)} for o in outs]
    rec["args"] = [[ids[s], _out_index(s)] for s in (og.snap(a) for a in op.args)]
    for key, deps in (("other_deps", op.other_deps), ("user_deps", op.user_deps),
                      ("initializers", op.initializers)):
        refs = [ids[s] for s in (og.snap(d) for d in deps) if s in ids]
        if refs:
            rec[key] = refs
    if op.tags:
        bad = [t for t in op.tags if not isinstance(t, str)]
        if bad:
            raise SerializationError(f"{where}: tag {bad[0]!r} is not a string")
        rec["tags"] = sorted(op.tags)
    attrs = spec.get(op)
    if isinstance(op, og.Variable) and op in values:
        v = np.asarray(values[op])
        if v.shape != op.axes.shape:
            raise SerializationError(f"{where}: values[{op.name}] has shape {v.shape}, "
                                     f"its axes need {op.axes.shape}")
        attrs = dict(attrs, initial_value=v.astype(op.dtype))
    enc_attrs = {}
    for f, kind in spec.fields:
        v = attrs[f]
        if v is None and kind.optional:
            continue
        enc_attrs[f] = kind.encode(v, enc, f"{where}, attribute {f}")
    if enc_attrs:
        rec["attrs"] = enc_attrs
    schema = _schema_record(op, ids)
    if schema is not None:
        rec["schema"] = schema
    if debug_info:
        rec["loc"] = [str(op.filename), int(op.lineno)]
        if op.derived_from is not None:
            rec["derived_from"] = str(op.derived_from)
    return rec


def _schema_record(op, ids):
    schema = getattr(op, "schema", None)

    def ref(x):
        s = og.snap(x)
        return [ids[s], _out_index(s)] if s in ids else None
    if isinstance(schema, sc.SoftmaxSchema):
        refs = [ref(schema.x), ref(schema.shifted), ref(schema.Z)]
        if None not in refs:
            return {"kind": "softmax", "x": refs[0], "shifted": refs[1], "Z": refs[2],
                    "normalization_axes": [a.name for a in schema.normalization_axes]}
    elif isinstance(schema, sc.SigmoidSchema):
        r = ref(schema.x)
        if r is not None:
            return {"kind": "sigmoid", "x": r}
    return None


# --- reading --------------------------------------------------------------------------------

class LoadedGraph:
    """What :func:`deserialize_graph` read: ``results`` (a list), ``ops`` (every op, in
    document order), ``single`` (whether :func:`serialize` was given one op) and
    ``metadata``."""

    def __init__(self, results, ops, single, metadata):
        self.results, self.ops, self.single, self.metadata = results, ops, single, metadata

    @property
    def value(self):
        """The results as :func:`serialize` was given them: an op, or a list."""
        return self.results[0] if self.single else list(self.results)

    @property
    def placeholders(self):
        """The placeholders, in document order."""
        return [op for op in self.ops if isinstance(op, og.Placeholder)]

    @property
    def variables(self):
        """The variables, in document order."""
        return [op for op in self.ops if isinstance(op, og.Variable)]

    def op(self, name):
        """The op called ``name``; raises :class:`KeyError` if there is none or several."""
        found = [op for op in self.ops if op.name == name]
        if len(found) != 1:
            raise KeyError(f"{len(found)} ops are named {name!r}")
        return found[0]


class _Decoder:
    def __init__(self):
        self.table = {}

    def axis(self, data, where):
        if not isinstance(data, str) or data not in self.table:
            raise _fail(where, f"unknown axis {_json_type(data)} (not in \"axes\")")
        return self.table[data]

    def axes(self, data, where):
        items = [self.axis(n, f"{where}[{i}]") for i, n in enumerate(_list(data, where))]
        try:
            return Axes(items)
        except (GeonError, ValueError) as e:
            raise _fail(where, str(e)) from None

    def read_axes(self, data):
        _dict(data, "axes")
        for name, entry in data.items():
            where = f"axes[{name!r}]"
            _str(name, where)
            _dict(entry, where, {"length", "batch", "recurrent", "parts"})
            if "parts" in entry:
                if len(entry) != 1:
                    raise _fail(where, "a flattened axis has only \"parts\"")
                parts = [self.axis(p, f"{where}.parts[{i}]")
                         for i, p in enumerate(_list(entry["parts"], f"{where}.parts"))]
                try:
                    a = FlattenedAxis(parts)
                except (GeonError, ValueError) as e:
                    raise _fail(where, str(e)) from None
                if a.name != name:
                    raise _fail(where, f"the parts make an axis named {a.name!r}")
            else:
                if "length" not in entry:
                    raise _fail(where, "missing key 'length'")
                length = entry["length"]
                if length is not None:
                    _int(length, f"{where}.length", 0)
                a = Axis(length, name, _bool(entry.get("batch", False), f"{where}.batch"),
                         _bool(entry.get("recurrent", False), f"{where}.recurrent"))
            self.table[name] = a


_OP_KEYS = {"id", "op", "name", "outputs", "args", "other_deps", "user_deps",
            "initializers", "tags", "attrs", "loc", "derived_from", "schema"}
_TOP_KEYS = {"format", "version", "producer", "single", "axes", "ops", "results",
             "metadata"}


def _reject_constant(name):
    raise ValueError(f"{name} is not valid JSON")


def deserialize_graph(text):
    """Read a document written by :func:`serialize`; returns a :class:`LoadedGraph`.

    ``text`` is a ``str`` (or UTF-8 ``bytes``). Raises :class:`SerializationError`,
    naming the place, for text that is not JSON, another format or version, an unknown
    op type, axis or dtype, a reference to an op not defined before, or an op whose
    constructor rejects what the document says.
    """
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as e:
            raise SerializationError(f"not UTF-8 text: {e}") from None
    if not isinstance(text, str):
        raise TypeError(f"deserialize takes a JSON str, not {type(text).__name__}")
    try:
        doc = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise SerializationError("not valid JSON: nested too deeply") from None
    except ValueError as e:  # json.JSONDecodeError, and the integer digit limit
        raise SerializationError(f"not valid JSON: {e}") from None
    _dict(doc, "document", _TOP_KEYS, ("format", "version", "axes", "ops", "results"))
    if doc["format"] != FORMAT:
        raise SerializationError(f"format: expected {FORMAT!r}, got "
                                 f"{_json_type(doc['format'])}")
    version = doc["version"]
    if version != VERSION or not _is_int(version):
        raise SerializationError(f"version: this geon reads version {VERSION}, the document "
                                 f"has version {_json_type(version)}")
    single = _bool(doc.get("single", False), "single")
    dec = _Decoder()
    dec.read_axes(doc["axes"])
    records = _list(doc["ops"], "ops")
    ops, n_out, weak = [], [], []
    for i, rec in enumerate(records):
        op, n = _read_op(i, rec, ops, n_out, dec)
        ops.append(op)
        n_out.append(n)
        if isinstance(op, og.Constant) and op.weak:
            weak.append((op, op.dtype))
    for i, rec in enumerate(records):
        _read_links(i, rec, ops)
    _readopt_weak(weak)
    results = []
    for j, r in enumerate(_list(doc["results"], "results")):
        results.append(_read_ref(r, len(ops), ops, n_out, f"results[{j}]", allow_op=True))
    if single and len(results) != 1:
        raise SerializationError(f"results: \"single\" is true but there are "
                                 f"{len(results)} results")
    return LoadedGraph(results, ops, single, doc.get("metadata"))


def deserialize(text):
    """The ops of a document written by :func:`serialize`: an op if it was given one op,
    else a list (see :func:`deserialize_graph` for the errors, and for the other ops)."""
    return deserialize_graph(text).value


def _read_ref(data, limit, ops, n_out, where, allow_op=False):
    """``[id, output]`` of an op before ``limit``; ``[id, null]`` (the op itself, for a
    result) if ``allow_op``."""
    _list(data, where)
    if len(data) != 2:
        raise _fail(where, f"expected [op id, output index], got {len(data)} entries")
    i = _int(data[0], f"{where}[0]")
    if not 0 <= i < limit:
        raise _fail(where, f"dangling reference to op {i}"
                           + (f" (only ops 0..{limit - 1} are defined before it)"
                              if limit else " (no op is defined before it)"))
    k = data[1]
    if k is None and allow_op:
        return ops[i]
    k = _int(k, f"{where}[1]")
    if not 0 <= k < n_out[i]:
        raise _fail(where, f"op {i} ({ops[i].name}) has {n_out[i]} output(s), no output {k}")
    return ops[i].outputs[k] if isinstance(ops[i], og.MultiOutput) else ops[i]


def _read_op(i, rec, ops, n_out, dec):
    where = f"ops[{i}]"
    _dict(rec, where, _OP_KEYS, ("id", "op", "name", "outputs", "args"))
    if _int(rec["id"], f"{where}.id") != i:
        raise _fail(f"{where}.id", f"is {rec['id']}; ids number the ops 0, 1, 2, ... in order")
    type_name = rec["op"]
    spec = _spec_by_name(type_name)
    if spec is None:
        raise _fail(f"{where}.op", f"unknown op type {_json_type(type_name)}")
    name = _str(rec["name"], f"{where}.name")
    where = f"ops[{i}] ({type_name} {name!r})"
    outputs = _list(rec["outputs"], f"{where}.outputs")
    if spec.cls is og.Output:
        raise _fail(f"{where}.op", "an Output has no record of its own; refer to it as "
                                   "[its multi-output op, output index]")
    tensor = issubclass(spec.cls, og.TensorOp)
    multi = issubclass(spec.cls, og.MultiOutput)
    if multi and not outputs or not multi and len(outputs) != (1 if tensor else 0):
        raise _fail(f"{where}.outputs", f"has {len(outputs)} entries; a {type_name} op has "
                                        + ("at least 1" if multi else
                                           str(1 if tensor else 0)))
    types = []
    for k, o in enumerate(outputs):
        o = _dict(o, f"{where}.outputs[{k}]", {"axes", "dtype"}, ("axes", "dtype"))
        types.append((dec.axes(o["axes"], f"{where}.outputs[{k}].axes"),
                      _dtype(o["dtype"], f"{where}.outputs[{k}].dtype")))
    out = types[0] if tensor else None
    args = [_read_ref(r, i, ops, n_out, f"{where}.args[{j}]")
            for j, r in enumerate(_list(rec["args"], f"{where}.args"))]
    if spec.arity is not None and len(args) != spec.arity:
        raise _fail(f"{where}.args", f"a {type_name} op takes {spec.arity} arg(s), the "
                                     f"document gives {len(args)}")
    deps = []
    for j, d in enumerate(_list(rec.get("other_deps", []), f"{where}.other_deps")):
        d = _int(d, f"{where}.other_deps[{j}]")
        if not 0 <= d < i:
            raise _fail(f"{where}.other_deps[{j}]", f"dangling reference to op {d}")
        deps.append(ops[d])
    tags = [_str(t, f"{where}.tags[{j}]")
            for j, t in enumerate(_list(rec.get("tags", []), f"{where}.tags"))]
    attrs_data = _dict(rec.get("attrs", {}), f"{where}.attrs", {f for f, _ in spec.fields})
    attrs = {}
    for f, kind in spec.fields:
        if f not in attrs_data:
            if not kind.optional:
                raise _fail(f"{where}.attrs", f"missing attribute {f!r}")
            attrs[f] = None
        else:
            attrs[f] = kind.decode(attrs_data[f], dec, f"{where}.attrs.{f}")
    filename, lineno = "<unknown>", 0
    if "loc" in rec:
        loc = _list(rec["loc"], f"{where}.loc")
        if len(loc) != 2 or not isinstance(loc[0], str):
            raise _fail(f"{where}.loc", "expected [file name, line number]")
        filename, lineno = loc[0], _int(loc[1], f"{where}.loc[1]", 0)
    derived = rec.get("derived_from")
    if derived is not None:
        derived = _str(derived, f"{where}.derived_from")
    try:
        op = _rebuild(spec, args, attrs, out, name, tags, deps)
        if multi:
            got = [(o.axes, o.dtype) for o in op.outputs]
            if len(got) != len(types) or any(
                    g[0].names != t[0].names or g[0].lengths != t[0].lengths or g[1] != t[1]
                    for g, t in zip(got, types)):
                raise SerializationError(
                    "the document's outputs (" + "; ".join(
                        f"{_show_axes(a)} {d}" for a, d in types) + ") are not what the "
                    "args give (" + "; ".join(f"{_show_axes(a)} {d}" for a, d in got) + ")")
    except SerializationError as e:
        raise _fail(where, str(e)) from None
    except Exception as e:  # the constructor's own checks, in the user's terms
        raise _fail(where, f"{type(e).__name__}: {e}") from None
    _copy_debug_info(op, filename, lineno, derived)
    return op, len(outputs)


def _read_links(i, rec, ops):
    """References that may point forward: user_deps, initializers, schema."""
    op = ops[i]
    where = f"ops[{i}] ({rec['op']} {op.name!r})"
    n = len(ops)

    def one(d, w):
        d = _int(d, w)
        if not 0 <= d < n:
            raise _fail(w, f"dangling reference to op {d}")
        return ops[d]
    for key in ("user_deps", "initializers"):
        refs = [one(d, f"{where}.{key}[{j}]")
                for j, d in enumerate(_list(rec.get(key, []), f"{where}.{key}"))]
        if key == "user_deps":
            op.user_deps = OrderedSet(refs)
        else:
            op.initializers = refs
    if "schema" in rec:
        op.schema = _read_schema(rec["schema"], ops, f"{where}.schema", op)


def _read_schema(data, ops, where, op):
    _dict(data, where, {"kind", "x", "shifted", "Z", "normalization_axes"}, ("kind", "x"))
    n_out = [1 if isinstance(o, og.TensorOp) else 0 for o in ops]

    def ref(k):
        if k not in data:
            raise _fail(where, f"missing key {k!r}")
        return _read_ref(data[k], len(ops), ops, n_out, f"{where}.{k}")
    if not isinstance(op, og.TensorOp):
        raise _fail(where, "only tensor ops have a schema")
    if data["kind"] == "sigmoid":
        return sc.SigmoidSchema(ref("x"))
    if data["kind"] == "softmax":
        names = _list(data.get("normalization_axes", []), f"{where}.normalization_axes")
        red = []
        for j, n in enumerate(names):
            a = op.axes.find(n) if isinstance(n, str) else None
            if a is None:
                raise _fail(f"{where}.normalization_axes[{j}]",
                            f"{_json_type(n)} is not an axis of the op")
            red.append(a)
        if len(set(red)) != len(red):
            raise _fail(f"{where}.normalization_axes", "an axis is listed twice")
        return sc.SoftmaxSchema(ref("x"), ref("shifted"), ref("Z"), Axes(red))
    raise _fail(f"{where}.kind", f"unknown schema kind {_json_type(data['kind'])}")
