"""Files for running a model with no Python: a plan with its trained weights, and a
data set in a small binary format (see doc/backends.rst, "No Python at run time").

- :func:`write_plan` writes the plan document of a computation
  (:func:`~geon.transformers.backends.plan`) whose Variables carry the values of
  ``state`` (a transformer holding trained weights, or ``{Variable: array}``) as their
  initial values: a backend that loads it starts from those weights. The file is the
  plan's JSON text (UTF-8).
- :func:`write_dataset` writes samples and their integer labels as a *data set file*,
  all little-endian::

      offset 0   4 bytes   b"GNDS" (the magic)
      offset 4   uint32    version, 1
      offset 8   uint32    n, the number of samples (>= 1)
      offset 12  uint32    features, the values of one sample (>= 1)
      offset 16  float32   images[n][features], row-major
      then       int32     labels[n]

  The file is exactly ``16 + 4 * n * (features + 1)`` bytes. :func:`read_dataset`
  reads one back. ``native/examples/digits_predict.c`` reads both files.
"""

import os
import struct
from typing import Any, Union

import numpy as np

from geon.errors import ArgumentError, SerializationError
from geon.transformers.backends import plan

__all__ = ["DATASET_MAGIC", "DATASET_VERSION", "read_dataset", "write_dataset",
           "write_plan"]

#: The data set file's first four bytes and its version.
DATASET_MAGIC, DATASET_VERSION = b"GNDS", 1
_HEADER = struct.Struct("<4sIII")

PathLike = Union[str, "os.PathLike[str]"]


def write_plan(path: PathLike, results: Any, *placeholders: Any, state: Any = None,
               transformer: Any = None) -> str:
    """Write ``plan(results, *placeholders, transformer=transformer, state=state)`` to
    ``path`` (UTF-8 JSON) and return the document."""
    document = plan(results, *placeholders, transformer=transformer, state=state)
    with open(path, "w", encoding="utf-8") as f:
        f.write(document)
    return document


def write_dataset(path: PathLike, images: Any, labels: Any) -> None:
    """Write ``images`` (``n`` samples: an array of shape ``(n, ...)``, stored as float32
    rows of ``features`` values) and ``labels`` (``n`` integers, stored as int32) as a
    data set file (the module's description gives the format)."""
    x = np.asarray(images)
    y = np.asarray(labels)
    if x.ndim < 1 or len(x) < 1 or x.size == 0:
        raise ArgumentError(f"write_dataset: images must hold at least one non-empty "
                            f"sample, not shape {x.shape}")
    n = len(x)
    x = np.ascontiguousarray(x.reshape(n, -1), dtype="<f4")
    if y.shape != (n,) or not np.issubdtype(y.dtype, np.integer):
        raise ArgumentError(f"write_dataset: labels must be {n} integers (one per "
                            f"sample), not {y.dtype} of shape {y.shape}")
    if y.size and (y.min() < -2 ** 31 or y.max() >= 2 ** 31) or x.shape[1] >= 2 ** 32 \
            or n >= 2 ** 32:
        raise ArgumentError("write_dataset: a label, n or the features do not fit 32 bits")
    with open(path, "wb") as f:
        f.write(_HEADER.pack(DATASET_MAGIC, DATASET_VERSION, n, x.shape[1]))
        f.write(x.tobytes())
        f.write(np.ascontiguousarray(y, dtype="<i4").tobytes())


def read_dataset(path: PathLike) -> tuple[np.ndarray, np.ndarray]:
    """``(images, labels)`` of a data set file: float32 ``(n, features)`` and int32
    ``(n,)``; :class:`~geon.errors.SerializationError` for a file of another format."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < _HEADER.size:
        raise SerializationError(f"{path}: not a data set file (too short)")
    magic, version, n, features = _HEADER.unpack_from(data)
    if magic != DATASET_MAGIC:
        raise SerializationError(f"{path}: not a data set file (no {DATASET_MAGIC!r})")
    if version != DATASET_VERSION:
        raise SerializationError(f"{path}: a data set file of version {version}; this geon "
                                 f"reads version {DATASET_VERSION}")
    if n < 1 or features < 1 or len(data) != _HEADER.size + 4 * n * (features + 1):
        raise SerializationError(f"{path}: the size does not match the header ({n} samples "
                                 f"of {features})")
    x = np.frombuffer(data, "<f4", n * features, _HEADER.size).reshape(n, features)
    y = np.frombuffer(data, "<i4", n, _HEADER.size + 4 * n * features)
    return x.astype(np.float32), y.astype(np.int32)
