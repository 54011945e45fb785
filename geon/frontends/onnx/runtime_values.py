"""ONNX models whose shape operands arrive when the model runs.

Some ops take a shape-determining operand as a tensor input: ``Reshape``'s target,
``Expand``'s shape, ``ConstantOfShape``, ``Pad``'s pads, ``Slice``'s starts and ends,
the ``axes`` of ``Reduce*``, ``TopK``'s ``k``, ``Range``, ``Tile``'s repeats ... geon's
computations have lengths known when they are built (or symbolic lengths bound from the
feeds' *shapes*), so when such an operand is a graph input, its *value* decides the
shapes of what the model computes. :func:`import_runtime_values` imports such a model
for values given at each call: the inputs the importer needs at import (it names them,
``UnsupportedOnnxOp.value_name``) are found at the first call, and the model is imported
once per distinct set of their values, each import cached (at most ``limit``, the
oldest going first). Every other input is fed to the cached computation as usual; a
``dim_param`` dimension stays a symbolic length, so one import serves every batch size
-- unless the import says that only fixed lengths let it build the model (a symbolic
length broadcast against a fixed one, say): then the inputs' shapes are fixed per call
too, and part of the key.

Shapes decided by those values are checked against the importer's limits before
anything is allocated (a hostile value is an ``InvalidOnnxModel``, never an
out-of-memory).
"""

from collections import OrderedDict
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import numpy as np

from geon.frontends.onnx.importer import import_model
from geon.frontends.onnx.loading import InvalidOnnxModel, UnsupportedOnnxOp, load_proto
from geon.transformers.base import Transformer

#: The words of the importer's errors caused by symbolic lengths.
_SYMBOLIC_HINT = "input_shapes="

#: How many imports (one per distinct set of values of the shape inputs) are kept.
DEFAULT_LIMIT = 16


def _key(values: Sequence[Any]) -> tuple:
    """A hashable key of the values of the inputs that decide shapes (an array; a
    list of arrays for a sequence, None for an empty optional)."""
    out: list = []
    for v in values:
        if v is None:
            out.append(None)
        elif isinstance(v, (list, tuple)):
            out.append(_key(v))
        else:
            a = np.asarray(v)
            out.append((a.dtype.str, a.shape, a.tobytes()))
    return tuple(out)


class RuntimeValuesModel:
    """An ONNX model run with its shape operands given at each call (see the module
    docstring). ``static`` names the inputs found to decide shapes (in the model's input
    order); ``imports`` counts the imports made (one per distinct set of their values,
    plus the ones that found them)."""

    def __init__(self, model: Any, input_shapes: Optional[Mapping[str, Sequence[int]]] = None,
                 transformer: Union[Transformer, str, None] = None,
                 limit: int = DEFAULT_LIMIT) -> None:
        self.proto, _ = load_proto(model)
        graph = self.proto.graph
        inits = {t.name for t in graph.initializer}
        #: the model's inputs, in order (those with an initializer are not inputs)
        self.names = [vi.name for vi in graph.input if vi.name not in inits]
        self.input_shapes = dict(input_shapes or {})
        self.transformer = transformer
        self.limit = int(limit)
        self.static: list[str] = []
        #: whether the inputs' shapes are fixed per call too (where the model's
        #: symbolic dimensions leave something undecided when it is built)
        self.fixed_shapes = False
        self.imports = 0
        self._cache: "OrderedDict[tuple, tuple]" = OrderedDict()

    def _shapes(self, values: Mapping[str, Any]) -> dict:
        """The input shapes the import fixes: ``input_shapes``, and with ``fixed_shapes``
        those of this call's tensor inputs."""
        shapes = dict(self.input_shapes)
        if self.fixed_shapes:
            for n in self.names:
                if n not in self.static and n not in shapes:
                    shapes[n] = np.shape(values[n])
        return shapes

    def _import(self, values: Mapping[str, Any]) -> tuple:
        """``(run, fed)``: the computation of the model with ``values`` fixed, and the
        positions of the inputs it is fed."""
        while True:
            self.imports += 1
            given = {n: values[n] for n in self.static}
            try:
                g = import_model(self.proto, input_shapes=self._shapes(values),
                                 input_values=given)
            except UnsupportedOnnxOp as e:
                name = getattr(e, "value_name", None)
                if name in self.names and name not in self.static:
                    self.static.append(name)
                    self.static.sort(key=self.names.index)
                    continue
                if self.fixed_shapes or _SYMBOLIC_HINT not in str(e):
                    raise
                self.fixed_shapes = True
                continue
            except InvalidOnnxModel as e:
                if self.fixed_shapes or _SYMBOLIC_HINT not in str(e):
                    raise
                self.fixed_shapes = True  # what symbolic lengths leave undecided
                continue
            fed = [k for k, n in enumerate(self.names) if n not in self.static]
            return g.computation(self.transformer), fed

    def _cache_key(self, values: Mapping[str, Any]) -> tuple:
        key = _key([values[n] for n in self.static])
        if self.fixed_shapes:
            key += tuple(np.shape(values[n]) for n in self.names if n not in self.static)
        return key

    def __call__(self, *arrays: Any) -> list:
        if len(arrays) != len(self.names):
            from geon.errors import FeedError
            raise FeedError(f"the model takes {len(self.names)} inputs "
                            f"({', '.join(self.names)}), got {len(arrays)}")
        values = dict(zip(self.names, arrays))
        key = self._cache_key(values)
        found = self._cache.get(key)
        if found is None:
            found = self._import(values)
            # (the import may have found more inputs that decide shapes)
            key = self._cache_key(values)
            self._cache[key] = found
            while len(self._cache) > self.limit:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        run, fed = found
        return run(*[arrays[k] for k in fed])


def import_runtime_values(model: Any, input_shapes: Optional[Mapping[str, Sequence[int]]] = None,
                          transformer: Union[Transformer, str, None] = None,
                          limit: int = DEFAULT_LIMIT) -> Callable[..., list]:
    """A function ``f(*arrays) -> [arrays]`` running ``model`` with every graph input
    given at each call, shape operands included (see the module docstring)."""
    return RuntimeValuesModel(model, input_shapes, transformer, limit)


__all__ = ["DEFAULT_LIMIT", "RuntimeValuesModel", "import_runtime_values"]
