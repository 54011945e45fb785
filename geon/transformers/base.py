"""Transformers: the base class, computations, procedures, and plugin helpers.

A transformer turns requested ops into callable :class:`Computation` s. It runs its
pass pipeline (:meth:`Transformer.passes`) over each computation's graph, down to its
``base_set``, then hands the lowered graph to its backend (:meth:`Transformer._compile`).
It owns the persistent state (Variables) shared by all its computations and the
procedures ``allocate``, ``initialize``, ``save`` and ``restore``. The registry of
transformers is :mod:`geon.registry` (its names are re-exported here).
"""

import collections.abc
import logging
import operator
import threading
import time
import types
import warnings
import weakref
import os
from typing import (IO, TYPE_CHECKING, Any, Callable, Generic, Iterable, Literal,
                    Mapping, MutableMapping, NoReturn, Optional, Sequence, TypeVar, Union,
                    overload)

import numpy as np

from geon._logging import get_logger
from geon.errors import (ArgumentError, AxisMismatchError, CheckpointError, FeedError,
                         GeonError, GeonWarning, LoweringError)
from geon.op_graph import domains
from geon.op_graph import op_graph as og
from geon.op_graph.nodes import no_gc, user_stacklevel
from geon.op_graph.ordering import (ASSIGN_CLASSES, assignment_inputs, explain_pulled_in,
                                    pulled_in)
# Re-exported (``x as x``: explicitly, for type checkers) for the backends and plugins
# that import them from here.
from geon.registry import (ENTRY_POINT_GROUP as ENTRY_POINT_GROUP,  # noqa: F401
                           _REGISTRY as _REGISTRY, _entry_points as _entry_points,
                           available_transformers as available_transformers,
                           make_transformer as make_transformer,
                           register_transformer as register_transformer,
                           transformer_factory as transformer_factory)
from geon.transformers import checkpoint
from geon.transformers.base_sets import (STANDARD_BASE_SET as STANDARD_BASE_SET,  # noqa: F401
                                         BaseSet)
from geon.transformers.passes import DeadCodeElimination, Graph, Pass
from geon.transformers.passes.alias import CopyStaleViews
from geon.transformers.passes.cse import CommonSubexpressionElimination
from geon.transformers.passes.layout import LAYOUTS, LayoutPass
from geon.transformers.passes.lower import LowerAxesPass
from geon.transformers.passes.simplify import SimplifyPass
from geon.transformers.passes.verify import VerifyBaseSet

if TYPE_CHECKING:
    import numpy.typing as npt

logger = get_logger(__name__)

#: The value of a computed op, as a computation returns it: a NumPy array.
Array = np.ndarray[Any, np.dtype[Any]]
#: What a computation's call returns: an array, ``None`` (a void op), or a tuple of them.
#: (Any where not given: ``Computation`` is ``Computation[Any]``; a default needs
#: typing_extensions before Python 3.13, so type checkers alone see it.)
if TYPE_CHECKING:
    from typing_extensions import TypeVar as _TypeVar
    _R = _TypeVar("_R", covariant=True, default=Any)
else:
    _R = TypeVar("_R", covariant=True)
#: ``np.copyto``'s casting rules.
_Casting = Literal["no", "equiv", "safe", "same_kind", "unsafe"]

def _grouped(placeholders: Iterable[og.Op], needed_by: Mapping[og.Op, tuple[og.Op, og.Op]]
             ) -> Iterable[tuple[tuple[og.Op, og.Op], list[og.Op]]]:
    """``{(assignment, reader): [placeholder, ...]}`` for the ``placeholders`` that
    ``needed_by`` attributes to a pulled-in assignment."""
    groups: dict[tuple[og.Op, og.Op], list[og.Op]] = {}
    for p in placeholders:
        if p in needed_by:
            groups.setdefault(needed_by[p], []).append(p)
    return groups.items()


def _log_computation(comp: "Computation[Any]", seconds: float) -> None:
    """Log (INFO) the computation a transformer just built: what it computes, its size
    before and after the passes and where the time went."""
    graph = comp.graph
    passes = sum(getattr(graph, "pass_seconds", {}).values())
    primitives = sum(1 for op in comp.ops if not isinstance(op, og.AssignableTensorOp))
    logger.info("%s: built a computation of %s from %s: %d ops -> %d primitives in "
                "%.4f s (passes %.4f s, the rest %.4f s)", comp.transformer.name,
                _short_list(getattr(r, "name", "?") for r in comp.requested) or "nothing",
                _short_list(p.name for p in comp.params) or "no placeholders",
                getattr(graph, "ops_before", 0), primitives, seconds, passes,
                seconds - passes)


def _value_type(op: og.TensorOp) -> str:
    """``(C:64, N:128) float32``: an op's axes and dtype, as op reprs show them."""
    return f"({', '.join(repr(a) for a in op.axes)}) {op.dtype}"


def _short_list(items: Iterable[str], most: int = 6) -> str:
    """``items`` joined by commas, the ones after the first ``most`` counted."""
    items = list(items)
    if len(items) > most:
        items = items[:most] + [f"... {len(items) - most} more"]
    return ", ".join(items)


def _lengths_set(order: Iterable[og.Op], transformer: "Transformer") -> None:
    """Raise, naming the op, if an op of ``order`` has an axis without a length, or
    a symbolic length that ``transformer`` cannot bind."""
    for op in order:
        if isinstance(op, og.TensorOp) and not transformer.symbolic_lengths \
                and op.axes.is_symbolic:
            raise ArgumentError(
                f"{type(op).__name__} {op.name} (built at {op.file_info}) has axes "
                f"({og._fmt(op.axes)}) with a symbolic length: the {transformer.name} "
                f"transformer needs fixed lengths (symbolic lengths are bound at call "
                f"time by the numpy and gpu transformers and the PyTorch export, so "
                f"far; "
                f"doc/symbolic_axes.rst)")
        if isinstance(op, og.TensorOp) and not op.axes.lengths_known:
            unset = [a.name for a in op.axes if a.length is None]
            raise AxisMismatchError(
                f"{type(op).__name__} {op.name} (built at {op.file_info}) has axes "
                f"({og._fmt(op.axes)}): axis {', '.join(unset)} has no length; set it "
                f"(e.g. ax.{unset[0]}.length = 10) before building a computation")


class Computation(Generic[_R]):
    """A callable that computes some ops from placeholder values.

    Call it with one array per parameter placeholder, in order. It returns a NumPy
    array for a single requested op, or a tuple (one entry per requested op, ``None``
    for void ops such as ``SetItem``) for a list or tuple.

    For type checkers, ``Computation[R]`` is a computation whose call returns ``R``
    (see :meth:`Transformer.computation`).
    """

    #: The generated code (set by the backend).
    _source: str
    #: How many times the graph was transformed (the passes and the code generation;
    #: one for a computation's life, whatever the bindings of its symbolic lengths).
    transformations = 0
    #: The number of memory plans made, one for fixed lengths; with symbolic lengths
    #: (NumPy transformer) one per distinct binding called.
    plans = 0
    requested: list[og.Op]
    single: bool

    def __init__(self, transformer: "Transformer", results: Union[og.Op, Iterable[og.Op]],
                 params: Sequence[og.Placeholder]) -> None:
        self.transformer = transformer
        self.requested, self.single = og.as_op_list(results, "computation results")
        self.params = list(params)
        seen: set[og.Placeholder] = set()
        for p in self.params:
            if not isinstance(p, og.Placeholder):
                raise ArgumentError(f"computation parameter {getattr(p, 'name', p)!r} is "
                                    f"not a placeholder ({type(p).__name__}); only "
                                    f"placeholders can be fed")
            if p in seen:
                raise ArgumentError(f"computation: placeholder {p.name} (built at "
                                    f"{p.file_info}) is given twice as a parameter; give "
                                    f"each placeholder once")
            seen.add(p)
        self.graph = Graph(self.requested)
        _lengths_set(self.graph.initial_order, transformer)
        #: ``[(assignment, reader)]``: assignments this computation runs though they
        #: were not requested, each with the op that is ordered after it (see
        #: ``pulled_in``); a :class:`GeonWarning` names them.
        self.pulled_in: list[tuple[og.Op, og.Op]] = pulled_in(self.graph.initial_order,
                                                              self.graph.results)
        needed_by = assignment_inputs(self.graph.results, self.pulled_in)
        # Value domains (declared, and those one_hot / gather indices imply) are read off
        # the graph as built, before lowering turns those ops into comparisons and takes.
        #: per parameter: None, or (Domain, why, noun) checked on each call (see
        #: geon/op_graph/domains.py; the backends' fast entries check it too)
        self._domains = domains.param_domains(self.params, self.graph.initial_order)
        self._domain_checks = [None if d is None else domains.checker(p, *d)
                               for p, d in zip(self.params, self._domains)]
        transformer._run_passes(self.graph)
        self.transformations += 1
        # What initialize() needs of the user's graph; the rest of it may be freed.
        self.initializers: list[og.Op] = list(dict.fromkeys(
            i for op in self.graph.initial_order for i in op._initializers))
        del self.graph.initial, self.graph.initial_order
        self.results: list[og.Op] = list(self.graph.results)
        self.ops: list[og.Op] = self.graph.ops()
        needed = [op for op in self.ops if isinstance(op, og.Placeholder)]
        missing = [p for p in needed if p not in self.params]
        if missing:
            raise ArgumentError("the computation needs placeholder(s) "
                                + ", ".join(f"{p.name} ({p.axes!r}, built at "
                                            f"{p.file_info})" for p in missing)
                                + " but they are not among its parameters"
                                + "".join(explain_pulled_in(a, r, placeholders=ps)
                                          for (a, r), ps in _grouped(missing, needed_by)))
        if self.pulled_in:
            warnings.warn("".join(explain_pulled_in(a, r) for a, r in self.pulled_in)
                          .lstrip("; "), GeonWarning, stacklevel=user_stacklevel())
        self.variables = [op for op in self.ops if isinstance(op, og.Variable)]
        self._shapes = [(p, p.axes.shape, p.dtype) for p in self.params]
        self._last: Optional[Sequence[Optional[Array]]] = None

    @property
    def source(self) -> str:
        """The code the backend generated for this computation, as text."""
        return self._source

    def __repr__(self) -> str:
        # <NumPyComputation of NumPyTransformer 'numpy': (x: (C:64, N:128) float32)
        #  -> (Tanh_3: (C:64, N:128) float32, SetItem_1), 12 primitives>
        t = getattr(self, "transformer", None)
        params = _short_list(f"{p.name}: {_value_type(p)}" for p in getattr(self, "params", ()))
        results = _short_list(
            f"{r.name}: {_value_type(r)}" if isinstance(r, og.TensorOp) else r.name
            for r in getattr(self, "requested", ()))
        ops = getattr(self, "ops", None)
        count = ""
        if ops is not None:
            n = sum(1 for op in ops if not isinstance(op, og.AssignableTensorOp))
            count = f", {n} primitive{'' if n == 1 else 's'}"
        return (f"<{type(self).__name__} of {type(t).__name__} {getattr(t, 'name', None)!r}: "
                f"({params}) -> ({results}){count}>")

    def _check_feed(self, i: int, v: Any) -> Array:
        """Placeholder ``i``'s value ``v`` as an array of its shape and dtype, or a
        :class:`FeedError` naming the placeholder; a value outside the placeholder's
        domain is a :class:`~geon.op_graph.domains.DomainError`."""
        a: Array = self._shapes[i][0].as_feed(v)
        check = self._domain_checks[i]
        if check is not None:
            check(a)
        return a

    def _bad_value(self, i: int, a: Array) -> None:
        """Raise the :class:`~geon.op_graph.domains.DomainError` of feed ``a`` of
        parameter ``i`` (called where a quick test of it failed; returns if every
        value is in the domain after all, e.g. an allowed ignore_index)."""
        domains.report(self.params[i], a, *self._domains[i])

    # ``comp(x)`` finds ``__call__`` on the class; this property (a getter written in C)
    # hands back the instance's ``_entry``, which is called with the feeds. Before the
    # first call that is the method below, which allocates and initializes; after it,
    # the backend's fast entry (for the NumPy transformer, the generated ``run``), so a
    # steady call runs no Python frame but the entry's own.
    if TYPE_CHECKING:
        def __call__(self, *feeds: "npt.ArrayLike") -> _R:
            """Call the computation with one value per parameter, by position;
            returns the result (a tuple for several)."""
            ...
    else:
        __call__ = property(operator.attrgetter("_entry"),
                            doc="Call the computation with one value per parameter, by "
                                "position; returns the result (a tuple for several).")
    #: Whether the backend's fast entry checks the number of values and rejects
    #: keywords itself (with :meth:`_check_args`); if not, it is wrapped in a check.
    _entry_checks_args = False

    def _check_args(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
        """Raise the :class:`FeedError` of a call with keywords or a wrong number of
        values (nothing if the call is well formed)."""
        if kwargs:
            raise FeedError(f"a computation takes its values by position, one per "
                            f"parameter ({', '.join(p.name for p in self.params)}); got "
                            f"keyword(s) {', '.join(kwargs)}")
        if len(args) != len(self._shapes):
            raise FeedError(f"computation takes {len(self._shapes)} value(s) ("
                            + ", ".join(p.name for p in self.params)
                            + f"), got {len(args)}")

    def _entry(self, *args: Any, **kwargs: Any) -> _R:
        # The first call (and the first after the transformer changed) allocates and
        # initializes, then installs the backend's fast entry point.
        self._check_args(args, kwargs)
        t = self.transformer
        with t._lock:
            t._ready()
            fast = self._fast_entry()
            if not self._entry_checks_args:
                fast = _checking_args(self, fast)
            # (an attribute of the instance from now on, found by ``__call__``)
            self._entry = fast  # type: ignore[method-assign]
        return self._entry(*args)

    def _fast_entry(self) -> Callable[..., Any]:
        """A function taking the feeds and returning what the call returns. Backends
        may return generated code; this generic one checks and converts each feed.
        Every entry runs under the transformer's ``_lock``: the computations of a
        transformer share its variables and buffers, so calls from several threads
        take turns."""
        lock = self.transformer._lock

        def entry(*args: Any) -> Any:
            with lock:
                values = self._run([self._check_feed(i, v) for i, v in enumerate(args)])
                self._last = values
            return values[0] if self.single else tuple(values)
        return entry

    def _allocate(self) -> None:
        """Allocate this computation's buffers (each backend defines it)."""
        raise NotImplementedError(f"{type(self).__name__} does not allocate buffers")

    def _reset_entry(self) -> None:
        self.__dict__.pop("_entry", None)

    def _last_values(self) -> Optional[Sequence[Optional[Array]]]:
        """The values of the last call, one per result (``None`` before any call)."""
        return self._last

    def value(self, op: og.Op) -> Optional[Array]:
        """The value ``op`` had in the last call; ``op`` must be one of the requested
        ops (or forward to one)."""
        s = og.require_valid(op)
        for r, v in zip(self.results, self._last_values() or ()):
            if r is s:
                return v
        raise ArgumentError(f"{op.name} is not a result of this computation (or it has not "
                            f"been called yet)")

    def _run(self, feeds: list[Array]) -> Sequence[Optional[Array]]:
        raise NotImplementedError


def _checking_args(comp: Computation[Any], entry: Callable[..., Any]) -> Callable[..., Any]:
    """``entry`` behind the check of :meth:`Computation._check_args`."""
    n = len(comp._shapes)

    def checked(*args: Any, **kwargs: Any) -> Any:
        if kwargs or len(args) != n:
            comp._check_args(args, kwargs)
        return entry(*args)
    return checked


class _StateKeyError(GeonError, KeyError):
    """A Variable with no storage in the transformer (a ``KeyError``, as a dict's)."""

    __str__ = Exception.__str__  # the message, not KeyError's repr of it


class _VariableState(weakref.WeakKeyDictionary[og.Variable, Array]):
    """``Transformer.state``: ``{Variable: array}``, held weakly. Indexing it with a
    name, another op, or a Variable that has no storage yet says what to do."""

    def __getitem__(self, v: og.Variable) -> Array:
        try:
            return super().__getitem__(v)
        except (KeyError, TypeError):
            pass
        missing_state(self, v)


def missing_state(state: Mapping[Any, Any], v: object) -> NoReturn:
    """Raise the error of ``state[v]`` (a transformer's state mapping) for a key it
    lacks: a name, another op, or a Variable that has no storage yet, saying what to
    do."""
    if isinstance(v, str):
        named = [k for k in list(state.keys()) if k.name == v]
        raise ArgumentError(
            f"state[{v!r}]: the state is keyed by Variable objects, not by names; "
            f"write state[w] for the Variable w" + (
                f" (here: {named[0]!r})" if len(named) == 1 else "")
            + "; by name: {v.name: v for v in transformer.variables()}[name]")
    if not isinstance(v, og.Variable):
        raise ArgumentError(f"state[{v!r}]: the state is keyed by Variables, not by "
                            f"{type(v).__name__} values")
    raise _StateKeyError(
        f"state[{v!r}]: Variable {v.name!r} has no storage in this transformer yet: "
        f"storage is made for the Variables of its computations when they are "
        f"allocated; build a computation that uses {v.name!r} "
        f"(transformer.computation(...)), then call transformer.initialize() (or the "
        f"computation) before reading its state")


class Transformer:
    """Base class of transformers.

    Subclasses set ``name``, ``base_set`` and ``computation_class``, and may extend
    :meth:`passes`. ``disable`` names passes to skip (for testing an optimization
    against its absence; lowering and verification cannot be skipped). ``dump_after``
    names passes after which each computation's graph is printed (one line per op, see
    ``geon.op_graph.printing.graph_text``) to ``dump_file`` (default: stderr).

    ``sample_axis`` (a class attribute, or the keyword to override it) is the
    transformer's preferred place for the sample axis, ``"first"`` or ``"last"``: the
    pipeline then has a ``layout`` pass that lays out computed values that way
    (``geon.transformers.passes.layout``); ``None`` keeps the layouts of the graph.
    ``frontend_ops`` maps names to functions that build this transformer's own ops;
    frontends get them with :func:`transformer_ops`.
    """

    name: Optional[str] = None
    base_set: Any = BaseSet()
    computation_class: type[Computation[Any]] = Computation
    # names of optional backend steps that ``disable`` accepts
    backend_steps: tuple[str, ...] = ()
    sample_axis: Optional[str] = None
    frontend_ops: dict[str, Callable[..., Any]] = {}
    #: Whether computations may have symbolic axis lengths, bound at each call
    #: (``geon.op_graph.symbols``); otherwise building one raises.
    symbolic_lengths = False

    def __init__(self, disable: Iterable[str] = (), dump_after: Iterable[str] = (),
                 dump_file: Optional[IO[str]] = None,
                 sample_axis: Optional[str] = None) -> None:
        # Held by every call of a computation and by the procedures: they share the
        # variables and buffers, so threads take turns (reentrant: procedures call
        # each other).
        self._lock = threading.RLock()
        if sample_axis is not None:
            self.sample_axis = sample_axis
        if self.sample_axis not in (None,) + LAYOUTS:
            raise ArgumentError(f"sample_axis must be None or one of {LAYOUTS}, not "
                                f"{self.sample_axis!r}")
        self.disabled = set(disable)
        known = [p.name for p in self.passes()] + list(self.backend_steps)
        unknown = self.disabled - set(known)
        if unknown:
            raise ArgumentError(f"unknown pass name(s) {sorted(unknown)}; passes are "
                                f"{known}")
        self.dump_after = {dump_after} if isinstance(dump_after, str) else set(dump_after)
        self.dump_file = dump_file
        unknown = self.dump_after - {p.name for p in self.passes()}
        if unknown:
            raise ArgumentError(f"dump_after: unknown pass name(s) {sorted(unknown)}; "
                                f"passes are {[p.name for p in self.passes()]}")
        self.computations: list[Computation[Any]] = []
        # Held weakly: state of a Variable nothing else refers to any more (no
        # computation, no user code) is freed with it.
        self.state: MutableMapping[og.Variable, Array] = _VariableState()
        self._initialized: weakref.WeakSet[og.Variable] = weakref.WeakSet()
        self._inits_done: weakref.WeakSet[og.Op] = weakref.WeakSet()
        # Variable -> writes by procedures
        self._writes: weakref.WeakKeyDictionary[og.Variable, int] = \
            weakref.WeakKeyDictionary()
        self._allocated = False
        self._initialized_all = False

    def __repr__(self) -> str:
        # <NumPyTransformer 'numpy': 2 computations, 3 variables, allocated>
        comps = getattr(self, "computations", [])
        details = [f"{len(comps)} computation{'' if len(comps) == 1 else 's'}"]
        if comps:
            n = len(self.variables())
            details.append(f"{n} variable{'' if n == 1 else 's'}")
        details += self._repr_details()
        return f"<{type(self).__name__} {self.name!r}: {', '.join(details)}>"

    def _repr_details(self) -> list[str]:
        """More ``repr`` details (strings) of a transformer; subclasses may extend."""
        details = []
        if getattr(self, "_allocated", False):
            details.append("allocated")
        if getattr(self, "disabled", None):
            details.append(f"disable={sorted(self.disabled)}")
        if self.sample_axis is not None:
            details.append(f"sample_axis={self.sample_axis!r}")
        return details

    def passes(self) -> list[Pass]:
        """The ordered pass pipeline. Ordering constraints:

        - ``simplify`` runs first, on the Axes ops, where patterns such as
          ``log(exp(x))`` are still visible;
        - ``layout`` (only with a ``sample_axis`` preference) reorders the axes of Axes
          ops, so it runs before ``lower`` and after ``simplify`` (whose rules then see
          the graph as it was built);
        - ``lower`` produces only semi-primitive ops;
        - ``fold`` (simplify again) folds the views and constants lowering created;
        - ``cse`` merges identical ops after ``lower`` and ``fold``, so it also merges
          the duplicate views and constants lowering makes (identical user ops lower
          alike and then merge bottom-up); it must run before ``dce``, which marks what
          the results no longer need;
        - ``dce`` drops what no result needs;
        - ``alias`` copies views an assignment would change under a later reader; it
          needs the final graph, so it runs after every rewriting pass;
        - ``verify`` must come last.
        """
        layout: list[Pass] = [LayoutPass(self.sample_axis)] if self.sample_axis else []
        return [SimplifyPass()] + layout + [LowerAxesPass(), SimplifyPass(name="fold"),
                CommonSubexpressionElimination(), DeadCodeElimination(), CopyStaleViews(),
                VerifyBaseSet()]

    _required = {"lower", "alias", "verify"}

    def _run_passes(self, graph: Graph, stop_after: Optional[str] = None) -> None:
        """Run the pipeline over ``graph`` (up to and including the pass named
        ``stop_after``, if given)."""
        try:
            self._run_pipeline(graph, stop_after)
        except LoweringError as e:
            raise _name_owners(e, graph, self) from None

    def transform(self, results: Union[og.Op, Iterable[og.Op]],
                  stop_after: Optional[str] = None) -> list[og.Op]:
        """Run the pipeline over the graph of ``results`` (ops; they are rewritten in
        place, so pass a copy, see ``clone_graph``), up
        to and including the pass named ``stop_after`` (default: all of them). Returns
        the ops computing the results afterwards. :func:`geon.graph_after` uses it."""
        names = [p.name for p in self.passes()]
        if stop_after is not None and stop_after not in names:
            raise ArgumentError(f"unknown pass name {stop_after!r}; passes are {names}")
        graph = Graph(og.as_op_list(results, "transform: results")[0])
        with no_gc():
            self._run_passes(graph, stop_after)
        return list(graph.results)

    def _run_pipeline(self, graph: Graph, stop_after: Optional[str] = None) -> None:
        # Seconds per pass are kept on the graph (``pass_seconds``) for the log.
        timings: dict[str, float] = {}
        # (attributes of this pass run, kept on the graph for the log)
        graph.pass_seconds = timings  # type: ignore[attr-defined]
        graph.ops_before = len(graph.ops())  # type: ignore[attr-defined]
        debug = logger.isEnabledFor(logging.DEBUG)
        for p in self.passes():
            if p.name not in self.disabled or p.name in self._required:
                start = time.perf_counter()
                p.run(graph, self)
                timings[p.name] = seconds = time.perf_counter() - start
                if debug:
                    logger.debug("%s: pass %s took %.6f s (%d ops after it)", self.name,
                                 p.name, seconds, len(graph.ops()))
                if p.name in self.dump_after:
                    from geon.op_graph.printing import dump
                    dump(graph.results, f"after pass {p.name}", self.dump_file)
            if p.name == stop_after:
                return

    # --- computations --------------------------------------------------------------
    @overload
    def computation(self, results: og.TensorOp,
                    *params: og.Placeholder) -> Computation[Array]: ...
    @overload
    def computation(self, results: og.VoidOp,
                    *params: og.Placeholder) -> Computation[None]: ...
    @overload
    def computation(self, results: og.Op,
                    *params: og.Placeholder) -> Computation[Optional[Array]]: ...
    @overload
    def computation(self, results: Iterable[og.TensorOp],
                    *params: og.Placeholder) -> Computation[tuple[Array, ...]]: ...
    @overload
    def computation(self, results: Iterable[og.Op], *params: og.Placeholder
                    ) -> Computation[tuple[Optional[Array], ...]]: ...

    def computation(self, results: Union[og.Op, Iterable[og.Op]],
                    *params: og.Placeholder) -> Computation[Any]:
        """Build a :class:`Computation` computing ``results`` (an op, a list or a tuple)
        from the placeholders ``params`` (its call arguments, in order).

        Its call returns an array for one op (``None`` for a void op such as a
        ``SetItem``) and a tuple for a list or tuple of ops (``None`` for each void
        op); the overloads say so to type checkers."""
        start = time.perf_counter()
        with self._lock, no_gc():
            comp = self.computation_class(self, results, params)
            if logger.isEnabledFor(logging.INFO):
                _log_computation(comp, time.perf_counter() - start)
            self.computations.append(comp)
            self._initialized_all = False
            for c in self.computations:  # the next call of each goes through initialize
                c._reset_entry()
            if self._allocated:
                self._allocate_variables(comp.variables)
                comp._allocate()
        return comp

    # --- procedures ----------------------------------------------------------------
    def variables(self) -> list[og.Variable]:
        """All Variables used by this transformer's computations, in a stable order."""
        seen: dict[og.Variable, None] = {}
        for c in self.computations:
            for v in c.variables:
                seen.setdefault(v, None)
        return list(seen)

    def _allocate_variables(self, variables: Iterable[og.Variable]) -> None:
        for v in variables:
            if v not in self.state:
                self.state[v] = np.zeros(v.axes.shape, v.dtype)

    def allocate(self) -> None:
        """Allocate storage for every computation: variables and buffers."""
        with self._lock:
            self._allocate_variables(self.variables())
            for c in self.computations:
                c._allocate()
                c._reset_entry()
            self._allocated = True

    def initialize(self, force: bool = False) -> None:
        """Set every variable not yet initialized (all of them if ``force``) to its
        initial value and run the ``initializers`` of the ops used. Idempotent."""
        with self._lock:
            self._initialize(force)

    def _initialize(self, force: bool) -> None:
        if not self._allocated:
            self.allocate()
        todo = [v for v in self.variables() if force or v not in self._initialized]
        for v in todo:
            self._store(v, v.initial_array())
            self._initialized.add(v)
            self._wrote(v)
        # Initializers run once each (all again with ``force``).
        inits = [i for c in self.computations for i in c.initializers
                 if force or i not in self._inits_done]
        self._inits_done.update(inits)
        if inits:
            from geon.op_graph.reference import evaluate
            # {op: value}: the Variables' arrays, and the ops evaluate computes
            values: dict[Any, Any] = dict(self.state)
            evaluate(inits, state=values)
            for v, a in values.items():
                if v in self.state:  # in place: generated code holds these arrays
                    self._store(v, a)
            for op in og.toposort(inits):
                if isinstance(op, ASSIGN_CLASSES):
                    self._wrote(og.snap(op.args[0]))
        self._initialized_all = True

    def _store(self, v: og.Variable, value: "npt.ArrayLike",
               casting: _Casting = "same_kind") -> None:
        """Write ``value`` into Variable ``v``'s storage, in place (generated code holds
        the arrays)."""
        np.copyto(self.state[v], value, casting=casting)

    def _wrote(self, v: og.Variable) -> None:
        self._writes[v] = self._writes.get(v, 0) + 1

    def write_count(self, v: og.Variable) -> int:
        """How many times the procedures (``initialize``, the ``initializers`` it runs,
        ``restore``) have written Variable ``v``; computations' assignments are not
        counted. A cache of values computed from ``v`` is stale when it changed."""
        return self._writes.get(v, 0)

    def state_view(self) -> Mapping[og.Variable, np.ndarray]:
        """``{variable: array}``: the live storage of the variables (not a copy). The
        GPU transformer's variables live on the device: its arrays are read-only host
        copies, synchronized when read; write with :meth:`write_values` there."""
        return self.state

    def write_values(self, values: Mapping[og.Variable, Any]) -> None:
        """Write ``{variable: array}`` into the variables' storage (as :meth:`restore`
        does: they count as initialized, and :meth:`write_count` counts the write).
        Each array must have its variable's shape; it is cast to the variable's dtype."""
        with self._lock:
            if not self._allocated:
                self.allocate()
            for v, a in values.items():
                a = np.asarray(a)
                if a.shape != v.axes.shape:
                    raise ArgumentError(f"write_values: {v.name} has shape {v.axes.shape} "
                                        f"({v.axes!r}), the value {a.shape}")
                self._store(v, a, casting="unsafe")
                self._initialized.add(v)
                self._wrote(v)

    def _persistent(self) -> dict[str, og.Variable]:
        vs = [v for v in self.variables() if v.persistent]
        names: dict[str, og.Variable] = {}
        for v in vs:
            if v.name in names:
                raise CheckpointError(f"two persistent variables are named {v.name!r} "
                                      f"(built at {names[v.name].file_info} and "
                                      f"{v.file_info}); give them distinct names")
            names[v.name] = v
        return names

    def _ready(self) -> None:
        """Allocate and initialize what the next call needs (what its first call does)."""
        if not self._initialized_all:
            self.initialize()

    def save(self, path: Union[str, os.PathLike[str]]) -> None:
        """Write all persistent variables to the checkpoint file ``path``.

        Variables not initialized yet are initialized first, so a checkpoint always
        holds what a call would start from. The file format and its guarantees are
        those of ``geon.transformers.checkpoint``: any variable name, an ``.npz``
        archive NumPy can open, written atomically (temporary file, fsync, rename) with
        the permissions the umask gives new files. A failure raises
        :class:`CheckpointError` and leaves an existing file at ``path`` untouched.
        """
        with self._lock:
            names = self._persistent()
            self._ready()
            checkpoint.write(path, [(n, self.state[v]) for n, v in names.items()])

    def restore(self, path: Union[str, os.PathLike[str]]) -> None:
        """Load persistent variables saved by :meth:`save`.

        The file's names, shapes and dtypes are checked against the variables, and all
        of it is read into new arrays, before anything changes: a missing, corrupt or
        mismatched file raises :class:`CheckpointError` and leaves the transformer's
        state as it was (memory used to reject a file is bounded by the variables'
        sizes, whatever the file claims). Nothing is unpickled. Restored variables
        count as initialized, and win over ``initializers`` that have not run yet
        (those run now, so that they cannot overwrite the restored values later).
        """
        with self._lock:
            names = self._persistent()
            loaded = checkpoint.read(path, {n: (v.axes.shape, v.dtype)
                                            for n, v in names.items()})
            if not self._allocated:
                self.allocate()

            def commit() -> None:
                for n, v in names.items():
                    self._store(v, loaded[n])
                    self._initialized.add(v)
                    self._wrote(v)
            # Restored variables are never initialized (their initial value may be
            # unknown, e.g. in a deserialized graph); the rest are, and pending
            # initializers run, before the restored values are written again.
            commit()
            if not self._initialized_all:
                self.initialize()
                commit()


# --- plugins -------------------------------------------------------------------------------

def insert_passes(passes: Sequence[Pass], new: Union[Pass, Sequence[Pass]], *,
                  after: Optional[str] = None,
                  before: Optional[str] = None) -> list[Pass]:
    """A copy of the pipeline ``passes`` with ``new`` (a pass or a list of passes) right
    after the pass named ``after``, or right before the one named ``before``.

    The named points are the pass names of the pipeline (see
    :meth:`Transformer.passes`); an unknown name raises ``ValueError`` listing them.
    """
    if (after is None) == (before is None):
        raise ArgumentError("insert_passes: give exactly one of after= and before=")
    names = [p.name for p in passes]
    anchor = after if after is not None else before
    if anchor not in names:
        raise ArgumentError(f"insert_passes: no pass named {anchor!r}; passes are {names}")
    i = names.index(anchor) + (1 if after is not None else 0)
    new = [new] if isinstance(new, Pass) else list(new)
    return list(passes[:i]) + new + list(passes[i:])


def pass_named(passes: Sequence[Pass], name: str) -> Pass:
    """The pass of the pipeline ``passes`` named ``name`` (to add rules to it with
    ``add_rule``)."""
    for p in passes:
        if p.name == name:
            return p
    raise ArgumentError(f"no pass named {name!r}; passes are {[p.name for p in passes]}")


def transformers_with(op_class: type) -> list[str]:
    """Names of the registered or installed transformers whose base set has
    ``op_class`` (installed ones are loaded to find out)."""
    found = []
    for name in available_transformers():
        try:
            factory = transformer_factory(name)
        except Exception:  # a broken plugin must not hide the answer for the others
            continue
        base = getattr(factory, "base_set", None)
        if isinstance(base, collections.abc.Set) and issubclass(op_class, tuple(base)):
            found.append(name)
    return found


def transformer_ops(name: str) -> types.SimpleNamespace:
    """The ops the transformer ``name`` exposes to frontends (its ``frontend_ops``), as
    attributes: ``be.transformer_ops("geon-axpy").axpy(a, x, y)``."""
    ops = getattr(transformer_factory(name), "frontend_ops", {}) or {}
    return types.SimpleNamespace(**dict(ops))


def _name_owners(error: LoweringError, graph: Graph, transformer: Transformer
                 ) -> LoweringError:
    """``error`` (from a pipeline) with the transformers that do have the op it names."""
    base = tuple(transformer.base_set)
    for op in graph.ops():
        if isinstance(op, base):
            continue
        owners = [n for n in transformers_with(type(op)) if n != transformer.name]
        if owners:
            return LoweringError(f"{error}; {type(op).__name__} is an op of the "
                                 f"transformer(s) {', '.join(owners)}, which have it in "
                                 f"their base set")
        break
    return error
