"""ONNX sequences and optionals, held at import as host-side structures.

geon's graphs hold tensors only. An ONNX *sequence* is therefore a Python list of the
importer's values (:class:`SequenceValue`), its length known at import, and an ONNX
*optional* is either empty or holds one value (:class:`OptionalValue`). The operators
that make, read and change them (``SequenceConstruct``, ``SequenceInsert``,
``SequenceAt``, ``Optional`` ...) rearrange these values at import; the tensors inside
are ordinary geon ops (or arrays known at import). Lengths, positions and the trip
count of a ``Loop`` that carries them must be known at import; a graph input of such
a type is given at import (``import_model(..., input_values=...)``), and a graph output
is returned by ``OnnxGraph.computation`` as a list of arrays (a sequence), or as its
value or ``None`` (an optional).
"""

from typing import Any, Optional, Union

import numpy as np

from geon.frontends.onnx.loading import (InvalidOnnxModel, UnsupportedOnnxOp, check_size,
                                         elem_dtype, elem_name)

#: The declared type of a value: ``("tensor", dtype)``, ``("sequence", dtype)`` (a
#: sequence of tensors of that element type) or ``("optional", inner)`` (``inner`` one
#: of the first two).
ValueType = tuple


class SequenceValue:
    """An ONNX sequence at import: ``items``, the importer's values of its tensors
    (``Value``: a geon op or an array known at import), and ``dtype``, their ONNX
    element type. Its length, ``len(items)``, is known at import."""

    __slots__ = ("items", "dtype")

    def __init__(self, items, dtype) -> None:
        self.items = list(items)
        self.dtype = np.dtype(dtype)

    @property
    def type(self) -> ValueType:
        return ("sequence", self.dtype)

    def tensor(self):
        raise UnsupportedOnnxOp("a sequence used where a tensor is expected")

    def __repr__(self) -> str:
        return f"<sequence of {len(self.items)} {self.dtype} tensors>"


class OptionalValue:
    """An ONNX optional at import: ``value`` (the importer's value of a tensor, or a
    :class:`SequenceValue`), or ``None`` when it is empty; ``inner`` is its declared
    element type (``("tensor", dtype)`` or ``("sequence", dtype)``)."""

    __slots__ = ("value", "inner")

    def __init__(self, value, inner: ValueType) -> None:
        self.value, self.inner = value, inner

    @property
    def dtype(self) -> np.dtype:
        return self.inner[1]

    @property
    def type(self) -> ValueType:
        return ("optional", self.inner)

    def tensor(self):
        raise UnsupportedOnnxOp("an optional used where a tensor is expected")

    def __repr__(self) -> str:
        what = "empty" if self.value is None else f"holding {self.value!r}"
        return f"<optional {what}>"


def is_structure(v: Any) -> bool:
    """Whether ``v`` is a sequence or an optional (not a tensor's value)."""
    return isinstance(v, (SequenceValue, OptionalValue))


def describe(t: ValueType) -> str:
    """A declared type in ONNX's words: ``seq(float32)``, ``optional(float32)``."""
    if t[0] == "tensor":
        return f"tensor({t[1]})"
    if t[0] == "sequence":
        return f"seq({t[1]})"
    return f"optional({describe(t[1])})"


def kind(v: Any) -> str:
    """``'a sequence'``, ``'an optional'`` or ``'a tensor'``."""
    if isinstance(v, SequenceValue):
        return "a sequence"
    return "an optional" if isinstance(v, OptionalValue) else "a tensor"


def value_type(tp, what: str) -> ValueType:
    """The :data:`ValueType` of an ONNX ``TypeProto``; a type geon cannot hold (maps,
    sparse tensors, sequences of sequences, unsupported element types) raises
    :class:`UnsupportedOnnxOp` naming ``what``."""
    which = tp.WhichOneof("value")
    if which == "tensor_type":
        dtype = elem_dtype(tp.tensor_type.elem_type)
        if dtype is None:
            name = elem_name(tp.tensor_type.elem_type)
            raise UnsupportedOnnxOp(f"{what}: tensors of {name} are not supported")
        return ("tensor", dtype)
    if which == "sequence_type":
        inner = value_type(tp.sequence_type.elem_type, what)
        if inner[0] != "tensor":
            raise UnsupportedOnnxOp(f"{what}: sequences of {describe(inner)} are not "
                                    f"supported (sequences of tensors only)")
        return ("sequence", inner[1])
    if which == "optional_type":
        inner = value_type(tp.optional_type.elem_type, what)
        if inner[0] == "optional":
            raise UnsupportedOnnxOp(f"{what}: an optional of an optional is not supported")
        return ("optional", inner)
    raise UnsupportedOnnxOp(f"{what}: values of type {which} are not supported")


def _declared_shape(tp) -> Optional[list]:
    """The declared dimensions of a tensor ``TypeProto`` (``None`` for one not known)."""
    tt = tp.tensor_type
    if not tt.HasField("shape"):
        return None
    return [int(d.dim_value) if d.HasField("dim_value") else None for d in tt.shape.dim]


def given_value(tp, given: Any, what: str, make_value):
    """The importer's value of a graph input of sequence or optional type ``tp`` from
    the Python value given for it at import: a list (or tuple) of arrays for a
    sequence, ``None`` for an empty optional. ``make_value(array)`` makes a tensor's
    value. A value that does not fit the declared type raises
    :class:`InvalidOnnxModel` naming ``what``."""
    t = value_type(tp, what)
    if t[0] == "optional":
        if given is None:
            return OptionalValue(None, t[1])
        return OptionalValue(given_value(tp.optional_type.elem_type, given, what,
                                         make_value), t[1])
    if t[0] == "tensor":
        if given is None or isinstance(given, (list, tuple)):
            raise InvalidOnnxModel(f"{what}: input_values gives {type(given).__name__}, "
                                   f"the model declares a tensor")
        return make_value(_checked_array(given, t[1], _declared_shape(tp), what))
    if given is None or not isinstance(given, (list, tuple)):
        raise InvalidOnnxModel(f"{what}: input_values gives {type(given).__name__}; a "
                               f"sequence input takes a list of arrays")
    shape = _declared_shape(tp.sequence_type.elem_type)
    return SequenceValue([make_value(_checked_array(a, t[1], shape, f"{what}, element {j}"))
                          for j, a in enumerate(given)], t[1])


def _checked_array(given: Any, dtype: np.dtype, shape: Optional[list], what: str
                   ) -> np.ndarray:
    arr = np.asarray(given)
    if shape is not None and (arr.ndim != len(shape) or any(
            d is not None and d != n for d, n in zip(shape, arr.shape))):
        declared = tuple(d if d is not None else "?" for d in shape)
        raise InvalidOnnxModel(f"{what}: input_values gives shape {arr.shape}, the model "
                               f"declares {declared}")
    check_size(arr.shape, dtype, what, "its value")
    return arr.astype(dtype)


def leaves(v: Any) -> list:
    """The tensors' values inside ``v`` (a value, a sequence or an optional), in order."""
    if isinstance(v, SequenceValue):
        return list(v.items)
    if isinstance(v, OptionalValue):
        return [] if v.value is None else leaves(v.value)
    return [v]


def signature(v: Any) -> tuple:
    """What a choice made at run time needs two values to share: the structure, the
    sequences' lengths, and each tensor's shape and type."""
    if isinstance(v, SequenceValue):
        return ("sequence", v.dtype, tuple(signature(x) for x in v.items))
    if isinstance(v, OptionalValue):
        return ("optional", v.inner, None if v.value is None else signature(v.value))
    return ("tensor", tuple(int(d) for d in v.shape), v.dtype)


def rebuild(sig: tuple, make) -> Union[SequenceValue, OptionalValue, Any]:
    """The structure ``sig`` (a :func:`signature`) with its tensors made by ``make(dtype)``,
    called once per tensor in order."""
    if sig[0] == "sequence":
        return SequenceValue([rebuild(s, make) for s in sig[2]], sig[1])
    if sig[0] == "optional":
        return OptionalValue(None if sig[2] is None else rebuild(sig[2], make), sig[1])
    return make(sig[2])


def describe_signature(sig: tuple) -> str:
    """A :func:`signature` in words: ``seq(2 x float32[5])``."""
    if sig[0] == "sequence":
        return f"seq of {len(sig[2])} [{', '.join(describe_signature(s) for s in sig[2])}]"
    if sig[0] == "optional":
        return f"empty {describe(('optional', sig[1]))}" if sig[2] is None else \
            f"optional({describe_signature(sig[2])})"
    return f"{sig[2]}{list(sig[1])}"


__all__ = ["OptionalValue", "SequenceValue", "describe", "given_value", "is_structure",
           "leaves", "rebuild", "signature", "value_type"]
