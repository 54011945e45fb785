"""Transformers: the base class, computations, procedures, and the registry.

A transformer turns requested ops into callable :class:`Computation` s. It runs its
pass pipeline (:meth:`Transformer.passes`) over each computation's graph, down to its
``base_set``, then hands the lowered graph to its backend (:meth:`Transformer._compile`).
It owns the persistent state (Variables) shared by all its computations and the
procedures ``allocate``, ``initialize``, ``save`` and ``restore``.
"""

import os
import tempfile
import types
import zipfile
from importlib import metadata

import numpy as np

from geon.errors import (CheckpointError, FeedError, GeonError, LoweringError,
                         UnknownTransformerError)
from geon.op_graph import op_graph as og
from geon.op_graph.nodes import no_gc
from geon.op_graph import primitives as pr
from geon.op_graph import schemas as sc
from geon.transformers.passes import DeadCodeElimination, Graph, Pass
from geon.transformers.passes.alias import CopyStaleViews
from geon.transformers.passes.cse import CommonSubexpressionElimination
from geon.transformers.passes.layout import LAYOUTS, LayoutPass
from geon.transformers.passes.lower import LowerAxesPass
from geon.transformers.passes.simplify import SimplifyPass
from geon.transformers.passes.verify import VerifyBaseSet

#: The semi-primitive ops every built-in transformer implements.
STANDARD_BASE_SET = frozenset({
    og.Placeholder, og.Variable, og.Constant,
    og.Add, og.Subtract, og.Multiply, og.Divide, og.Power, og.Maximum, og.Minimum,
    og.Equal, og.NotEqual, og.Less, og.LessEqual, og.Greater, og.GreaterEqual,
    og.Negative, og.Absolute, og.Sign, og.Square, og.Sqrt, og.Reciprocal, og.Exp, og.Log,
    og.Sin, og.Cos, og.Tanh, og.Sigmoid, sc.SigmoidCrossEntropy, og.Erf, og.Expm1,
    og.Softplus,
    pr.Gemm, pr.ReduceSum, pr.ReduceProd, pr.ReduceMax, pr.ReduceMin, pr.ReduceArgMax,
    pr.ReduceArgMin, pr.Dimshuffle, pr.Reshape, pr.Expand, pr.SliceView, pr.Unslice,
    pr.Copy, pr.Assign, pr.ReduceMaxArgMax, og.Output, pr.Take, pr.PutAdd,
    pr.PrefixSum, pr.SortPrim,
})


class Computation:
    """A callable that computes some ops from placeholder values.

    Call it with one array per parameter placeholder, in order. It returns a NumPy
    array for a single requested op, or a tuple (one entry per requested op, ``None``
    for void ops such as ``SetItem``) for a list or tuple.
    """

    def __init__(self, transformer, results, params):
        self.transformer = transformer
        self.requested, self.single = og.as_op_list(results, "computation results")
        self.params = list(params)
        for p in self.params:
            if not isinstance(p, og.Placeholder):
                raise ValueError(f"computation parameter {getattr(p, 'name', p)!r} is "
                                 f"not a placeholder ({type(p).__name__}); only "
                                 f"placeholders can be fed")
        self.graph = Graph(self.requested)
        transformer._run_passes(self.graph)
        # What initialize() needs of the user's graph; the rest of it may be freed.
        self.initializers = list(dict.fromkeys(
            i for op in self.graph.initial_order for i in op.initializers))
        del self.graph.initial, self.graph.initial_order
        self.results = list(self.graph.results)
        self.ops = self.graph.ops()
        needed = [op for op in self.ops if isinstance(op, og.Placeholder)]
        missing = [p for p in needed if p not in self.params]
        if missing:
            raise ValueError("the computation needs placeholder(s) "
                             + ", ".join(f"{p.name} ({p.axes!r}, built at {p.file_info})"
                                         for p in missing)
                             + " but they are not among its parameters")
        self.variables = [op for op in self.ops if isinstance(op, og.Variable)]
        self._shapes = [(p, p.axes.shape, p.dtype) for p in self.params]
        self._last = None

    @property
    def source(self):
        """The code the backend generated for this computation, as text."""
        return self._source

    def _check_feed(self, i, v):
        """Placeholder ``i``'s value ``v`` as an array of its shape and dtype, or a
        :class:`FeedError` naming the placeholder."""
        p, shape, dtype = self._shapes[i]
        a = np.asarray(v)
        if a.shape != shape:
            raise FeedError(f"placeholder {p.name} expects axes "
                            f"({', '.join(map(repr, p.axes))}) i.e. shape {shape}; got "
                            f"shape {a.shape}")
        if a.dtype != dtype:
            if not np.can_cast(a.dtype, dtype, "same_kind"):
                raise FeedError(f"placeholder {p.name} has dtype {dtype}; cannot "
                                f"safely convert {a.dtype} to it")
            a = a.astype(dtype)
        return a

    def __call__(self, *args):
        if len(args) != len(self._shapes):
            raise FeedError(f"computation takes {len(self._shapes)} value(s) ("
                            + ", ".join(p.name for p in self.params)
                            + f"), got {len(args)}")
        return self._entry(*args)

    def _entry(self, *args):
        # The first call (and the first after the transformer changed) allocates and
        # initializes, then installs the backend's fast entry point.
        t = self.transformer
        if not t._allocated:
            t.allocate()
        if not t._initialized_all:
            t.initialize()
        self._entry = self._fast_entry()
        return self._entry(*args)

    def _fast_entry(self):
        """A function taking the feeds and returning what the call returns. Backends
        may return generated code; this generic one checks and converts each feed."""
        def entry(*args):
            values = self._run([self._check_feed(i, v) for i, v in enumerate(args)])
            self._last = values
            return values[0] if self.single else tuple(values)
        return entry

    def _reset_entry(self):
        self.__dict__.pop("_entry", None)

    def _last_values(self):
        """The values of the last call, one per result (``None`` before any call)."""
        return self._last

    def value(self, op):
        """The value ``op`` had in the last call; ``op`` must be one of the requested
        ops (or forward to one)."""
        s = og.require_valid(op)
        for r, v in zip(self.results, self._last_values() or ()):
            if r is s:
                return v
        raise GeonError(f"{op.name} is not a result of this computation (or it has not "
                        f"been called yet)")

    def _run(self, feeds):
        raise NotImplementedError


class Transformer:
    """Base class of transformers.

    Subclasses set ``name``, ``base_set`` and ``computation_class``, and may extend
    :meth:`passes`. ``disable`` names passes to skip (for testing an optimization
    against its absence; lowering and verification cannot be skipped). ``dump_after``
    names passes after which each computation's graph is printed (one line per op, see
    :func:`geon.op_graph.printing.graph_text`) to ``dump_file`` (default: stderr).

    ``sample_axis`` (a class attribute, or the keyword to override it) is the
    transformer's preferred place for the sample axis, ``"first"`` or ``"last"``: the
    pipeline then has a ``layout`` pass that lays out computed values that way
    (:mod:`geon.transformers.passes.layout`); ``None`` keeps the layouts of the graph.
    ``frontend_ops`` maps names to functions that build this transformer's own ops;
    frontends get them with :func:`transformer_ops`.
    """

    name = None
    base_set = STANDARD_BASE_SET
    computation_class = Computation
    backend_steps = ()  # names of optional backend steps that ``disable`` accepts
    sample_axis = None
    frontend_ops = {}

    def __init__(self, disable=(), dump_after=(), dump_file=None, sample_axis=None):
        if sample_axis is not None:
            self.sample_axis = sample_axis
        if self.sample_axis not in (None,) + LAYOUTS:
            raise ValueError(f"sample_axis must be None or one of {LAYOUTS}, not "
                             f"{self.sample_axis!r}")
        self.disabled = set(disable)
        known = [p.name for p in self.passes()] + list(self.backend_steps)
        unknown = self.disabled - set(known)
        if unknown:
            raise ValueError(f"unknown pass name(s) {sorted(unknown)}; passes are "
                             f"{known}")
        self.dump_after = {dump_after} if isinstance(dump_after, str) else set(dump_after)
        self.dump_file = dump_file
        unknown = self.dump_after - {p.name for p in self.passes()}
        if unknown:
            raise ValueError(f"dump_after: unknown pass name(s) {sorted(unknown)}; "
                             f"passes are {[p.name for p in self.passes()]}")
        self.computations = []
        self.state = {}
        self._initialized = set()
        self._inits_done = set()
        self._allocated = False
        self._initialized_all = False

    def passes(self):
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
        layout = [LayoutPass(self.sample_axis)] if self.sample_axis else []
        return [SimplifyPass()] + layout + [LowerAxesPass(), SimplifyPass(name="fold"),
                CommonSubexpressionElimination(), DeadCodeElimination(), CopyStaleViews(),
                VerifyBaseSet()]

    _required = {"lower", "alias", "verify"}

    def _run_passes(self, graph, stop_after=None):
        """Run the pipeline over ``graph`` (up to and including the pass named
        ``stop_after``, if given)."""
        try:
            self._run_pipeline(graph, stop_after)
        except LoweringError as e:
            raise _name_owners(e, graph, self) from None

    def _run_pipeline(self, graph, stop_after=None):
        for p in self.passes():
            if p.name not in self.disabled or p.name in self._required:
                p.run(graph, self)
                if p.name in self.dump_after:
                    from geon.op_graph.printing import dump
                    dump(graph.results, f"after pass {p.name}", self.dump_file)
            if p.name == stop_after:
                return

    # --- computations --------------------------------------------------------------
    def computation(self, results, *params):
        """Build a :class:`Computation` computing ``results`` (an op, a list or a tuple)
        from the placeholders ``params`` (its call arguments, in order)."""
        with no_gc():
            comp = self.computation_class(self, results, params)
        self.computations.append(comp)
        self._initialized_all = False
        for c in self.computations:  # the next call of each goes through initialize
            c._reset_entry()
        if self._allocated:
            self._allocate_variables(comp.variables)
            comp._allocate()
        return comp

    # --- procedures ----------------------------------------------------------------
    def variables(self):
        """All Variables used by this transformer's computations, in a stable order."""
        seen = {}
        for c in self.computations:
            for v in c.variables:
                seen.setdefault(v, None)
        return list(seen)

    def _allocate_variables(self, variables):
        for v in variables:
            if v not in self.state:
                self.state[v] = np.zeros(v.axes.shape, v.dtype)

    def allocate(self):
        """Allocate storage for every computation: variables and buffers."""
        self._allocate_variables(self.variables())
        for c in self.computations:
            c._allocate()
            c._reset_entry()
        self._allocated = True

    def initialize(self, force=False):
        """Set every variable not yet initialized (all of them if ``force``) to its
        initial value and run the ``initializers`` of the ops used. Idempotent."""
        if not self._allocated:
            self.allocate()
        todo = [v for v in self.variables() if force or v not in self._initialized]
        for v in todo:
            np.copyto(self.state[v], v.initial_array())
            self._initialized.add(v)
        # Initializers run once each (all again with ``force``).
        inits = [i for c in self.computations for i in c.initializers
                 if force or i not in self._inits_done]
        self._inits_done.update(inits)
        if inits:
            from geon.op_graph.reference import evaluate
            values = dict(self.state)
            evaluate(inits, state=values)
            for v, a in values.items():
                if v in self.state:  # in place: generated code holds these arrays
                    np.copyto(self.state[v], a)
        self._initialized_all = True

    def state_view(self):
        """``{variable: array}``: the live storage of the variables (not a copy)."""
        return self.state

    def _persistent(self):
        vs = [v for v in self.variables() if v.persistent]
        names = {}
        for v in vs:
            if v.name in names:
                raise CheckpointError(f"two persistent variables are named {v.name!r} "
                                      f"(built at {names[v.name].file_info} and "
                                      f"{v.file_info}); give them distinct names")
            names[v.name] = v
        return names

    def save(self, path):
        """Write all persistent variables to ``path`` (``.npz``, keyed by variable name).

        The file is written to a temporary name beside ``path`` and renamed into place,
        so an interrupted save never damages an existing checkpoint.
        """
        if not self._allocated:
            self.allocate()
        names = self._persistent()
        path = os.fspath(path)
        folder = os.path.dirname(os.path.abspath(path))
        fd, tmp = tempfile.mkstemp(prefix=".geon-ckpt-", suffix=".tmp", dir=folder)
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, **{n: self.state[v] for n, v in names.items()})
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    def restore(self, path):
        """Load persistent variables saved by :meth:`save`.

        Every name, shape and dtype is checked before anything changes: a missing,
        corrupt or mismatched file raises :class:`CheckpointError` and leaves the
        current values untouched. Nothing is unpickled.
        """
        if not self._allocated:
            self.allocate()
        names = self._persistent()
        try:
            with np.load(os.fspath(path), allow_pickle=False) as data:
                loaded = {k: data[k] for k in data.files}
        except FileNotFoundError:
            raise CheckpointError(f"checkpoint {path} does not exist") from None
        except (OSError, ValueError, zipfile.BadZipFile, EOFError, KeyError) as e:
            raise CheckpointError(f"checkpoint {path} is unreadable: {e}") from None
        missing = sorted(set(names) - set(loaded))
        extra = sorted(set(loaded) - set(names))
        if missing or extra:
            raise CheckpointError(f"checkpoint {path} does not match the variables: "
                                  f"missing {missing}, unexpected {extra}")
        for n, v in names.items():
            a = loaded[n]
            if a.shape != v.axes.shape or a.dtype != v.dtype:
                raise CheckpointError(f"checkpoint {path}: {n} is {a.dtype}{list(a.shape)}, "
                                      f"variable needs {v.dtype}{list(v.axes.shape)}")
        for n, v in names.items():
            np.copyto(self.state[v], loaded[n])
            self._initialized.add(v)


# --- registry --------------------------------------------------------------------------
_REGISTRY = {}
ENTRY_POINT_GROUP = "geon.transformers"


def register_transformer(name, factory):
    """Make ``make_transformer(name)`` call ``factory(**kwargs)``."""
    _REGISTRY[name] = factory


def _entry_points():
    try:
        return {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}
    except Exception:  # a broken installed distribution must not break geon
        return {}


def available_transformers():
    """Names accepted by :func:`make_transformer`, registered or installed."""
    return sorted(set(_REGISTRY) | set(_entry_points()))


def _factory(name):
    factory = _REGISTRY.get(name)
    if factory is None:
        ep = _entry_points().get(name)
        if ep is None:
            raise UnknownTransformerError(
                f"no transformer named {name!r}; available: "
                f"{', '.join(available_transformers())}")
        factory = ep.load()
        _REGISTRY[name] = factory
    return factory


def make_transformer(name="numpy", **kwargs):
    """A new transformer registered under ``name`` (built in, through
    :func:`register_transformer`, or installed under the ``geon.transformers``
    entry-point group)."""
    return _factory(name)(**kwargs)


# --- plugins -------------------------------------------------------------------------------

def insert_passes(passes, new, *, after=None, before=None):
    """A copy of the pipeline ``passes`` with ``new`` (a pass or a list of passes) right
    after the pass named ``after``, or right before the one named ``before``.

    The named points are the pass names of the pipeline (see
    :meth:`Transformer.passes`); an unknown name raises ``ValueError`` listing them.
    """
    if (after is None) == (before is None):
        raise TypeError("insert_passes: give exactly one of after= and before=")
    names = [p.name for p in passes]
    anchor = after if after is not None else before
    if anchor not in names:
        raise ValueError(f"insert_passes: no pass named {anchor!r}; passes are {names}")
    i = names.index(anchor) + (1 if after is not None else 0)
    new = [new] if isinstance(new, Pass) else list(new)
    return list(passes[:i]) + new + list(passes[i:])


def pass_named(passes, name):
    """The pass of the pipeline ``passes`` named ``name`` (to add rules to it with
    ``add_rule``)."""
    for p in passes:
        if p.name == name:
            return p
    raise ValueError(f"no pass named {name!r}; passes are {[p.name for p in passes]}")


def transformers_with(op_class):
    """Names of the registered or installed transformers whose base set has
    ``op_class`` (installed ones are loaded to find out)."""
    found = []
    for name in available_transformers():
        try:
            factory = _factory(name)
        except Exception:  # a broken plugin must not hide the answer for the others
            continue
        base = getattr(factory, "base_set", None)
        if isinstance(base, (set, frozenset)) and issubclass(op_class, tuple(base)):
            found.append(name)
    return found


def transformer_ops(name):
    """The ops the transformer ``name`` exposes to frontends (its ``frontend_ops``), as
    attributes: ``be.transformer_ops("geon-axpy").axpy(a, x, y)``."""
    return types.SimpleNamespace(**dict(getattr(_factory(name), "frontend_ops", {}) or {}))


def _name_owners(error, graph, transformer):
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
