"""Backends: a plan document and the placeholders' values in, the results' values out.

A *plan* (:func:`plan`) is a JSON document: geon's graph format holding the graph of a
computation after the NumPy transformer's passes, that is lowered to the standard base
set of semi-primitive ops (row-major buffers, positional axes, every derivative and
rewrite already applied), with its inputs and outputs listed. A backend runs plans:
it never reimplements geon's passes, and needs code only for the base set (see
doc/backends.rst).

A *backend* turns a plan into an :class:`Executable` (:meth:`Backend.load`), which
computes the outputs from the inputs (:meth:`Executable.run`) and keeps the plan's
Variables as its own state. Backends are registered by name (:func:`register_backend`,
or the entry-point group ``geon.backends``); ``"numpy"`` is the NumPy transformer
behind this interface, and :func:`geon.transformers.native.load_backend` loads a
native one (a shared library implementing ``geon_backend.h``).
"""

import abc
import json
from importlib.metadata import entry_points
from typing import Any, Callable, Optional, Sequence

import numpy as np

from geon.errors import ArgumentError, FeedError, SerializationError, UnknownTransformerError
from geon.op_graph import op_graph as og
from geon.op_graph.serialize import deserialize_graph, serialize

__all__ = ["ENTRY_POINT_GROUP", "PLAN_FORMAT", "PLAN_VERSION", "Backend", "Executable",
           "NumPyBackend", "available_backends", "backend", "plan", "read_plan",
           "register_backend"]

#: The plan format's name and version (a document of another version is refused).
PLAN_FORMAT, PLAN_VERSION = "geon-plan", 1
#: The entry-point group of installed backends (entries ``name = "module:factory"``).
ENTRY_POINT_GROUP = "geon.backends"


def plan(results: Any, *placeholders: og.Placeholder, transformer: Any = None,
         state: Any = None, unroll: bool = False) -> str:
    """The plan document of ``transformer.computation(results, *placeholders)`` (by
    default a new NumPy transformer): its lowered graph, its inputs (the placeholders,
    in order) and its outputs (shape and dtype of each tensor result). Assignments
    (``SetItem``) among ``results`` are the graph's last results, after the inputs:
    a backend runs them on every run, updating the Variables it keeps.

    The plan's Variables carry their initial values, or with ``state`` the values it
    holds for them: a transformer (its Variables' current values, e.g. a trained
    model's: they are initialized first if need be) or a mapping ``{Variable:
    array}``; a Variable it lacks keeps its initial value.

    A plan holds the standard ops other backends know: the default transformer runs
    without the NumPy transformer's own ``unslice_add`` pass; give a transformer of
    your own likewise (``NumPyTransformer(disable=["unslice_add"])``).

    Loops (``Scan`` ops, e.g. of the recurrent layers) stay loops: their bodies are
    nested graphs of the document, which the ``"numpy"`` backend runs. For a backend
    without loops (geon's native runtime), ``unroll=True`` writes one copy of the body
    per step instead (the pass the GPU transformer runs, with the default
    transformer only)."""
    values = _state_values(state)
    if transformer is None:
        from geon.transformers.numpy.transformer import NumPyTransformer
        # (no UnsliceAdds: a plan holds the standard base set, which backends know)
        transformer = _Unrolling() if unroll else NumPyTransformer(disable=_NATIVE_OFF)
    elif unroll:
        raise ArgumentError("plan(unroll=True) plans with its own transformer: pass "
                            "no transformer= with it")
    comp = transformer.computation(results, *placeholders)
    outs = [r for r in comp.results if isinstance(r, og.TensorOp)]
    # assignments (SetItems lowered to Assign) among the results: written after the
    # inputs, so that a backend runs them and keeps the Variables they write
    effects = [r for r in comp.results if not isinstance(r, og.TensorOp)]
    graph = json.loads(serialize(outs + list(comp.params) + effects, values=values))
    return json.dumps({
        "format": PLAN_FORMAT, "version": PLAN_VERSION,
        "graph": graph,
        "outputs": [{"shape": list(r.axes.lengths), "dtype": np.dtype(r.dtype).str}
                    for r in outs],
        "inputs": [{"shape": list(p.axes.lengths), "dtype": np.dtype(p.dtype).str}
                   for p in comp.params],
    }, separators=(",", ":"))


def _Unrolling() -> Any:
    """A NumPy transformer that unrolls scans first (see :func:`plan`)."""
    from geon.transformers.numpy.transformer import NumPyTransformer
    from geon.transformers.passes.unroll import UnrollScans

    class UnrollingNumPyTransformer(NumPyTransformer):
        symbolic_lengths = False  # a plan records fixed shapes (doc/symbolic_axes.rst)

        def passes(self) -> list:
            return [UnrollScans()] + super().passes()
    return UnrollingNumPyTransformer(disable=_NATIVE_OFF)


#: the NumPy transformer's passes a plan is made without (their ops are the NumPy
#: transformer's own)
_NATIVE_OFF = ("unslice_add",)


def _state_values(state: Any) -> Optional[dict]:
    """``plan``'s ``state`` as ``{Variable: array}`` (None for None)."""
    if state is None:
        return None
    if hasattr(state, "state_view") and hasattr(state, "initialize"):
        state.initialize()
        return dict(state.state_view())
    if not hasattr(state, "items"):
        raise ArgumentError(f"plan: state must be a transformer or a mapping {{Variable: "
                            f"array}}, not {type(state).__name__}")
    return {v: np.asarray(a) for v, a in state.items()}


def read_plan(document: str) -> tuple[dict, list[og.Op], list[og.Placeholder]]:
    """``(plan, results, inputs)`` of a plan document: the JSON object, the graph's
    result ops (the outputs, then the assignments it runs) and its placeholders;
    :class:`~geon.errors.SerializationError` for anything else."""
    try:
        doc = json.loads(document)
    except ValueError as e:
        raise SerializationError(f"plan: not valid JSON: {e}") from None
    except RecursionError:
        raise SerializationError("plan: not valid JSON: nested too deeply") from None
    if not isinstance(doc, dict) or doc.get("format") != PLAN_FORMAT:
        raise SerializationError(f"plan: expected format {PLAN_FORMAT!r}")
    if doc.get("version") != PLAN_VERSION:
        raise SerializationError(f"plan: this geon reads version {PLAN_VERSION}, the "
                                 f"document has version {doc.get('version')!r}")
    for key in ("graph", "outputs", "inputs"):
        if key not in doc:
            raise SerializationError(f"plan: no {key!r}")
    if not isinstance(doc["outputs"], list) or not isinstance(doc["inputs"], list):
        raise SerializationError("plan: 'outputs' and 'inputs' must be lists")
    loaded = deserialize_graph(json.dumps(doc["graph"]))
    n, m = len(doc["outputs"]), len(doc["inputs"])
    outputs, inputs = loaded.results[:n], loaded.results[n:n + m]
    effects = loaded.results[n + m:]
    if len(inputs) != m or not all(isinstance(p, og.Placeholder) for p in inputs) or \
            not all(isinstance(o, og.TensorOp) for o in outputs) or \
            any(isinstance(e, og.TensorOp) for e in effects):
        raise SerializationError("plan: the graph's results must be the outputs, then "
                                 "one placeholder per input, then the assignments")
    for kind, entries, ops in (("outputs", doc["outputs"], outputs),
                               ("inputs", doc["inputs"], inputs)):
        for k, (entry, op) in enumerate(zip(entries, ops)):
            _check_entry(f"plan: {kind}[{k}]", entry, op)
    return doc, outputs + effects, inputs


def _check_entry(where: str, entry: Any, op: og.Op) -> None:
    """``entry`` (``{"shape": [...], "dtype": "<f4"}``) describes ``op``'s value exactly;
    :class:`~geon.errors.SerializationError` naming ``where`` otherwise (a native
    backend is handed buffers of the shapes the plan lists)."""
    if not isinstance(entry, dict) or set(entry) != {"shape", "dtype"}:
        raise SerializationError(f"{where}: expected {{'shape': [...], 'dtype': ...}}")
    shape, dtype = entry["shape"], entry["dtype"]
    if not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape):
        raise SerializationError(f"{where}: the shape is a list of lengths, not {shape!r}")
    try:
        same_dtype = isinstance(dtype, str) and np.dtype(dtype) == op.dtype
    except TypeError:
        same_dtype = False
    if tuple(shape) != tuple(op.axes.lengths) or not same_dtype:
        raise SerializationError(f"{where} says {dtype!r} {shape}, but the graph's "
                                 f"{op.name} is {op.dtype} {list(op.axes.lengths)}")


class Executable(abc.ABC):
    """A loaded plan: :meth:`Executable.run` computes its outputs;
    :meth:`Executable.close` frees it."""

    def __init__(self, doc: dict) -> None:
        self.inputs = [(tuple(i["shape"]), np.dtype(i["dtype"])) for i in doc["inputs"]]
        self.outputs = [(tuple(o["shape"]), np.dtype(o["dtype"])) for o in doc["outputs"]]

    def check_inputs(self, arrays: Sequence[Any]) -> list[np.ndarray]:
        """The inputs as arrays of the plan's shapes and dtypes; :class:`~geon.errors.FeedError`
        naming the input otherwise."""
        if len(arrays) != len(self.inputs):
            raise FeedError(f"the plan takes {len(self.inputs)} inputs, got {len(arrays)}")
        out = []
        for k, (a, (shape, dtype)) in enumerate(zip(arrays, self.inputs)):
            a = np.asarray(a)
            if a.shape != shape or a.dtype != dtype:
                raise FeedError(f"input {k} of the plan is {dtype}{list(shape)}, got "
                                f"{a.dtype}{list(a.shape)}")
            out.append(a)
        return out

    @abc.abstractmethod
    def run(self, *arrays: Any) -> list[np.ndarray]:
        """The outputs (new arrays) computed from ``arrays``, one per input."""

    def close(self) -> None:
        """Free what the executable holds (it may not run after)."""

    def __enter__(self) -> "Executable":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Backend(abc.ABC):
    """Runs plans: :meth:`Backend.load` gives an :class:`Executable` of a plan
    document."""

    name: str = ""

    @abc.abstractmethod
    def load(self, document: str) -> Executable:
        """The executable of ``document``; :class:`~geon.errors.SerializationError` for a document
        that is no plan, :class:`~geon.errors.LoweringError` for ops it cannot run."""


class _NumPyExecutable(Executable):
    def __init__(self, document: str) -> None:
        from geon.transformers.numpy.transformer import NumPyTransformer
        doc, outputs, inputs = read_plan(document)
        super().__init__(doc)
        self._comp = NumPyTransformer().computation(list(outputs), *inputs)

    def run(self, *arrays: Any) -> list[np.ndarray]:
        values = self._comp(*self.check_inputs(arrays))
        return [np.array(v) for v in values[:len(self.outputs)]]


class NumPyBackend(Backend):
    """The NumPy transformer as a backend: a plan's graph is already lowered, so its
    passes leave it as it is and its code generator runs it."""

    name = "numpy"

    def load(self, document: str) -> Executable:
        return _NumPyExecutable(document)


_BACKENDS: dict[str, Callable[[], Backend]] = {"numpy": NumPyBackend}


def register_backend(name: str, factory: Callable[[], Backend]) -> None:
    """Make ``backend(name)`` call ``factory()``."""
    if not isinstance(name, str) or not name:
        raise ArgumentError(f"a backend's name is a non-empty str, not {name!r}")
    _BACKENDS[name] = factory


def available_backends() -> list[str]:
    """The names of the registered and installed backends."""
    names = set(_BACKENDS) | {e.name for e in entry_points(group=ENTRY_POINT_GROUP)}
    return sorted(names)


def backend(name: str) -> Backend:
    """A new instance of the backend ``name`` (registered, or installed under the
    entry-point group ``geon.backends``)."""
    factory: Optional[Callable[[], Backend]] = _BACKENDS.get(name)
    if factory is None:
        found = [e for e in entry_points(group=ENTRY_POINT_GROUP) if e.name == name]
        if not found:
            raise UnknownTransformerError(f"no backend named {name!r}; available: "
                                          f"{', '.join(available_backends())}")
        factory = found[0].load()
    return factory()
