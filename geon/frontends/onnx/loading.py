"""Reading ONNX files safely: parsing, tensors (external data included) and node order.

Nothing here executes code from a model: a model is parsed as protobuf data, tensors
are read as plain numbers, and external data is read only from files inside the
model's own folder, after checking that the file holds as many bytes as the tensor
declares. Every problem raises :class:`InvalidOnnxModel`.
"""

import heapq
import os
import stat
from typing import Any, Optional, Sequence

import numpy as np

from geon.op_graph.symbols import Sym
from geon.errors import GeonError

#: The most bytes one tensor of a model may declare (initializers, constants and every
#: value computed at import), and the most bytes the values computed at import may hold
#: in all; a larger declaration or result is refused before anything is allocated. Read
#: when a model is imported (a test may lower it).
MAX_TENSOR_BYTES = 1 << 32


class InvalidOnnxModel(GeonError, ValueError):
    """An ONNX model is malformed, inconsistent or hostile: a file that does not parse,
    a value used before it is made or made twice, a cycle, external data outside the
    model's folder, not a regular file or shorter than declared, a tensor declared (or
    a value computed at import) larger than :data:`MAX_TENSOR_BYTES`."""


class UnsupportedOnnxOp(GeonError, ValueError):
    """An ONNX op, attribute, data type or opset the importer cannot map onto geon ops
    exactly. Raised at import, naming the op type, the node and the opset; geon never
    approximates such an op."""


def onnx_module():
    """The ``onnx`` package, or a clear error saying how to get it."""
    try:
        import onnx
    except ImportError:  # pragma: no cover - depends on the environment
        raise GeonError("the ONNX frontend needs the onnx package: pip install onnx "
                        "(or, in a checkout of geon, pip install -e '.[onnx]')") from None
    return onnx


def load_proto(model):
    """``(ModelProto, folder)`` from a ModelProto, serialized bytes or a path. The
    folder (``None`` unless a path was given) is where external data may be read."""
    onnx = onnx_module()
    folder = None
    if isinstance(model, onnx.ModelProto):
        return model, None
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except (OSError, ValueError) as e:  # ValueError: a NUL in the path
            raise InvalidOnnxModel(f"cannot read ONNX model {path!r}: {e}") from None
        folder = os.path.dirname(os.path.abspath(path))
        model = data
    if not isinstance(model, (bytes, bytearray, memoryview)):
        raise InvalidOnnxModel(f"import_model takes an onnx.ModelProto, bytes or a path, "
                               f"not {type(model).__name__}")
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(bytes(model))
    except Exception as e:  # protobuf's DecodeError and friends
        raise InvalidOnnxModel(f"the data is not an ONNX model (protobuf parse error: "
                               f"{e})") from None
    return proto, folder


# ONNX element types geon can hold. Booleans are carried as 1.0 / 0.0 floats (geon has
# no boolean tensors) and turned back into bool at the outputs.
def elem_dtype(elem_type):
    """The NumPy dtype of an ONNX element type, or ``None`` if geon cannot hold it."""
    tp = onnx_module().TensorProto
    return {tp.FLOAT: np.dtype(np.float32), tp.DOUBLE: np.dtype(np.float64),
            tp.FLOAT16: np.dtype(np.float16),
            tp.INT64: np.dtype(np.int64), tp.INT32: np.dtype(np.int32),
            tp.INT16: np.dtype(np.int16), tp.INT8: np.dtype(np.int8),
            tp.UINT64: np.dtype(np.uint64), tp.UINT32: np.dtype(np.uint32),
            tp.UINT16: np.dtype(np.uint16), tp.UINT8: np.dtype(np.uint8),
            tp.BOOL: np.dtype(np.bool_)}.get(elem_type) or _narrow_dtype(elem_type)


#: ONNX element types geon holds widened (doc/onnx.rst): the narrow format's name (as
#: :mod:`geon.op_graph.formats` and ``ml_dtypes`` call it). Their values are held in
#: float32 (the float formats) or int8 / uint8 (the 4- and 2-bit integers), which hold
#: every value of the format exactly; at the model's outputs they are returned in the
#: ``ml_dtypes`` type the ``onnx`` package uses.
NARROW = {"BFLOAT16": "bfloat16", "FLOAT8E4M3FN": "float8_e4m3fn",
          "FLOAT8E4M3FNUZ": "float8_e4m3fnuz", "FLOAT8E5M2": "float8_e5m2",
          "FLOAT8E5M2FNUZ": "float8_e5m2fnuz", "FLOAT8E8M0": "float8_e8m0fnu",
          "FLOAT4E2M1": "float4_e2m1fn", "INT4": "int4", "UINT4": "uint4",
          "INT2": "int2", "UINT2": "uint2"}


def narrow_format(dtype):
    """The narrow format's name of a NumPy (``ml_dtypes``) dtype, or ``None``."""
    name = np.dtype(dtype).name
    return name if name in NARROW.values() else None


def _narrow_dtype(elem_type):
    tp = onnx_module().TensorProto
    for onnx_name, fmt in NARROW.items():
        if getattr(tp, onnx_name, None) == elem_type:
            import ml_dtypes  # a dependency of onnx; only the ONNX frontend needs it
            return np.dtype(getattr(ml_dtypes, fmt))
    return None


def elem_name(elem_type):
    """The ONNX name of an element type (for messages)."""
    try:
        return onnx_module().TensorProto.DataType.Name(elem_type)
    except ValueError:
        return f"element type {elem_type}"


def element_count(shape: Sequence[int]) -> int:
    """The number of elements of ``shape``, exactly (Python integers: a product of
    dimensions never wraps around as NumPy's ``prod`` of int64 does); an expression
    where a length is symbolic."""
    n: Any = 1
    for d in shape:
        n *= d if isinstance(d, Sym) else int(d)
    return n


def check_size(shape: Sequence[int], dtype: Any, where: str, what: str = "its result",
               used: Optional[int] = None) -> int:
    """The element count of ``shape``, after checking it against the limits on hostile
    files: a negative dimension, or more than :data:`MAX_TENSOR_BYTES`
    bytes of ``dtype``, raises :class:`InvalidOnnxModel` naming ``where`` (the node and
    op), ``what`` and the shape. With ``used`` (the bytes the values computed at import
    already hold), the result is one more such value, and the limit is on their total.

    Every builder calls this (through ``Context.bound``) with the shape of what it
    is about to compute at import *before* computing it, so a 96-byte file cannot
    allocate terabytes first. A symbolic length (a graph input's ``dim_param``) is
    bound when the model runs: a shape holding one returns its element count as an
    expression, its fixed lengths checked now."""
    if any(isinstance(d, Sym) for d in shape):
        fixed = [int(d) for d in shape if not isinstance(d, Sym)]
        if any(d < 0 for d in fixed):
            raise InvalidOnnxModel(f"{where}: {what} would have a negative dimension "
                                   f"({list(shape)})")
        total: Any = 1
        for d in shape:
            total = total * d
        return total
    shape = [int(d) for d in shape]
    if any(d < 0 for d in shape):
        raise InvalidOnnxModel(f"{where}: {what} would have a negative dimension "
                               f"({shape})")
    n = element_count(shape)
    limit = MAX_TENSOR_BYTES
    nbytes = n * np.dtype(dtype).itemsize
    if nbytes > limit:
        raise InvalidOnnxModel(f"{where}: {what} of shape {shape} ({nbytes} bytes of "
                               f"{np.dtype(dtype)}) is larger than the limit of {limit} "
                               f"bytes; refused before computing it")
    if used is not None and used + nbytes > limit:
        raise InvalidOnnxModel(f"{where}: computing {what} of shape {shape} at import "
                               f"({nbytes} bytes) would bring the values computed at "
                               f"import to {used + nbytes} bytes, more than the limit of "
                               f"{limit} bytes")
    return n


def _check_size(dims, dtype, what):
    if any(d < 0 for d in dims):
        raise InvalidOnnxModel(f"{what}: negative dimension in {list(dims)}")
    n = element_count(dims)
    if n * dtype.itemsize > MAX_TENSOR_BYTES:
        raise InvalidOnnxModel(f"{what}: declares {list(dims)} ({n * dtype.itemsize} bytes), "
                               f"more than the limit of {MAX_TENSOR_BYTES} bytes")
    return n


def _external_bytes(t, folder, nbytes, what):
    """The bytes of an external-data tensor, read only from a regular file inside
    ``folder`` (never a link leading out of it, a directory, a FIFO or a device: a
    FIFO would block the import forever, a device would give endless bytes)."""
    info = {e.key: e.value for e in t.external_data}
    loc = info.get("location", "")
    if folder is None:
        raise InvalidOnnxModel(f"{what}: external data ({loc!r}) needs the model to be "
                               f"loaded from a path")
    if not loc or "\0" in loc or os.path.isabs(loc) or loc.startswith(("/", "\\")) or \
            ":" in loc or ".." in loc.replace("\\", "/").split("/"):
        raise InvalidOnnxModel(f"{what}: external data location {loc!r} is not a relative "
                               f"path inside the model's folder")
    root = os.path.realpath(folder)
    path = os.path.realpath(os.path.join(root, loc))
    if os.path.commonpath([root, path]) != root:
        raise InvalidOnnxModel(f"{what}: external data location {loc!r} leads outside the "
                               f"model's folder")
    try:
        offset = int(info.get("offset", 0))
        length = int(info["length"]) if "length" in info else nbytes
    except ValueError:
        raise InvalidOnnxModel(f"{what}: bad external data offset/length {info}") from None
    if offset < 0 or length != nbytes:
        raise InvalidOnnxModel(f"{what}: external data declares {length} bytes at offset "
                               f"{offset}; the tensor needs {nbytes}")
    # Opened without blocking (a FIFO), and without following a link put as the file
    # itself since the path was resolved (a folder on the way swapped for a link in that
    # moment is not caught: whoever can do that can also change the model's files);
    # what was opened is then checked to be a regular file.
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0) | \
        getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        raise InvalidOnnxModel(f"{what}: cannot open external data {loc!r}: {e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InvalidOnnxModel(f"{what}: external data {loc!r} is not a regular file "
                                   f"(a directory, FIFO, socket or device)")
        if offset + nbytes > st.st_size:
            raise InvalidOnnxModel(f"{what}: external data file {loc!r} has {st.st_size} "
                                   f"bytes, fewer than the {offset + nbytes} declared")
        with os.fdopen(fd, "rb", closefd=False) as f:
            f.seek(offset)
            data = f.read(nbytes)
    except OSError as e:
        raise InvalidOnnxModel(f"{what}: cannot read external data {loc!r}: {e}") from None
    finally:
        os.close(fd)
    if len(data) != nbytes:
        raise InvalidOnnxModel(f"{what}: external data file {loc!r} is short")
    return data


def tensor_array(t, folder, what):
    """A TensorProto as a NumPy array (booleans as ``bool``), checked against its
    declared size before anything is allocated."""
    onnx = onnx_module()
    dtype = elem_dtype(t.data_type)
    if dtype is None:
        raise UnsupportedOnnxOp(f"{what}: tensors of {elem_name(t.data_type)} are not "
                                f"supported (geon holds FLOAT, DOUBLE, FLOAT16, the integer "
                                f"types and BOOL)")
    if t.HasField("segment"):
        raise UnsupportedOnnxOp(f"{what}: segmented tensors are not supported")
    dims = tuple(int(d) for d in t.dims)
    n = _check_size(dims, dtype, what)
    if narrow_format(dtype) is not None:
        return _narrow_array(t, dims, n, dtype, what)
    if t.data_location == onnx.TensorProto.EXTERNAL:
        raw = _external_bytes(t, folder, n * dtype.itemsize, what)
        return np.frombuffer(raw, dtype.newbyteorder("<")).astype(dtype).reshape(dims)
    if t.raw_data:
        if len(t.raw_data) != n * dtype.itemsize:
            raise InvalidOnnxModel(f"{what}: raw data has {len(t.raw_data)} bytes; "
                                   f"{list(dims)} of {dtype} needs {n * dtype.itemsize}")
        return np.frombuffer(t.raw_data, dtype.newbyteorder("<")).astype(dtype).reshape(dims)
    if dtype == np.float16:  # stored as the bits in int32_data
        return np.asarray(t.int32_data, np.uint16).view(np.float16).reshape(dims) \
            if len(t.int32_data) == n else _count_error(what, len(t.int32_data), dims, n)
    if dtype.kind == "f":
        field = t.float_data if dtype.itemsize == 4 else t.double_data
    elif dtype == np.int64:
        field = t.int64_data
    elif dtype.kind == "u" and dtype.itemsize >= 4:
        field = t.uint64_data
    else:  # the small integer types and bool are stored as int32
        field = t.int32_data
    if len(field) != n:
        _count_error(what, len(field), dims, n)
    return np.asarray(field, dtype=dtype).reshape(dims)


def _narrow_array(t, dims, n, dtype, what):
    """A tensor of a narrow type (bfloat16, float8, 4- and 2-bit), decoded by onnx's
    own ``numpy_helper`` once its byte count is checked."""
    onnx = onnx_module()
    if t.data_location == onnx.TensorProto.EXTERNAL:
        raise UnsupportedOnnxOp(f"{what}: external data of {dtype} is not supported")
    per_byte = {"int4": 2, "uint4": 2, "float4_e2m1fn": 2, "int2": 4, "uint2": 4}.get(
        dtype.name, 1)
    if t.raw_data:
        need = -(-n // per_byte) * dtype.itemsize
        if len(t.raw_data) != need:
            raise InvalidOnnxModel(f"{what}: raw data has {len(t.raw_data)} bytes; "
                                   f"{list(dims)} of {dtype} needs {need}")
    elif len(t.int32_data) != -(-n // per_byte):
        _count_error(what, len(t.int32_data), dims, -(-n // per_byte))
    from onnx import numpy_helper
    try:
        return np.asarray(numpy_helper.to_array(t), dtype).reshape(dims)
    except (ValueError, TypeError) as e:
        raise InvalidOnnxModel(f"{what}: cannot decode the {dtype} data: {e}") from None


def _count_error(what, got, dims, n):
    raise InvalidOnnxModel(f"{what}: holds {got} values; {list(dims)} needs {n}")


def node_order(graph, known):
    """The nodes of ``graph`` in an order where each comes after the producers of its
    inputs (Kahn's algorithm, linear). ``known`` names the values that exist before
    any node (inputs, initializers). A cycle, a value made twice or used but never
    made raises :class:`InvalidOnnxModel`."""
    producer = {}
    for i, node in enumerate(graph.node):
        for out in node.output:
            if not out:
                continue
            if out in producer or out in known:
                raise InvalidOnnxModel(f"value {out!r} is made twice (node "
                                       f"{node.name or node.op_type!r})")
            producer[out] = i
    waiting = [0] * len(graph.node)
    users = [[] for _ in graph.node]
    for i, node in enumerate(graph.node):
        for inp in node.input:
            if not inp or inp in known:
                continue
            if inp not in producer:
                raise InvalidOnnxModel(f"node {node.name or node.op_type!r} uses {inp!r}, "
                                       f"which no input, initializer or node makes")
            waiting[i] += 1
            users[producer[inp]].append(i)
    # A heap keeps the model's own order among the nodes that are ready.
    ready = [i for i, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(graph.node[i])
        for j in users[i]:
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(ready, j)
    if len(order) != len(graph.node):
        stuck = [graph.node[i].name or graph.node[i].op_type
                 for i, w in enumerate(waiting) if w][:5]
        raise InvalidOnnxModel(f"the graph has a cycle through nodes {stuck}")
    return order
