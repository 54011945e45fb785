"""One-shot execution with reuse: ``be.run(targets, feeds={placeholder: array})``.

A :class:`Runner` owns a transformer (a NumPy transformer by default) and compiles
what each call asks for, caching the computations. It remembers the value of every
target it returned, with the state of the inputs that value came from, and reuses it
instead of computing it again while those inputs are unchanged.

What is reused, exactly
-----------------------

The runner remembers the value of each *target* op of a call (not intermediates) that
has a value and whose dependencies contain no assignment. With it, it records its
*inputs*: the placeholders the op depends on, each with a digest of the fed array
(dtype, shape and bytes), and the Variables it depends on, each with a version number.

In a later call, a remembered op whose inputs are unchanged (every placeholder fed an
array with the same dtype, shape and bytes, every variable at the same version) is not
computed: as a target, its value is returned directly; inside the graph of another
target, it is fed in place of its subgraph, and what only it needed is not computed.

A variable's version changes when

- a call of this runner runs an assignment to it (``SetItem``): every remembered value
  that depends on it is recomputed next time;
- the transformer's procedures write it: ``initialize`` (with ``force=True``, or the
  ``initializers`` of a computation built later, which run when it is first called)
  and ``restore`` (see :meth:`Transformer.write_count`);
- :meth:`Runner.initialize` with ``force=True``, :meth:`Runner.restore` or
  :meth:`Runner.invalidate` is called.

Never reused: void ops (a ``SetItem`` runs on every call); values whose dependencies
(args or other_deps) include an assignment, since computing them runs the assignment
again; placeholders, variables and constants themselves (they cost no primitive).
Not seen by the runner: writes into its storage behind its back (``np.copyto`` into
``runner.transformer.state_view()`` arrays, which the GPU transformer's are not: they
are read-only there); call :meth:`Runner.invalidate` after them.

What the runner keeps alive: nothing of the user's graph. It refers to the ops it
computed or reused weakly; when one of them is garbage, the computation compiled for it
is dropped, and with it the state of Variables that nothing else refers to (the
transformer holds state weakly). Compiling ``be.run(x * 2)`` for a temporary ``x * 2``
is therefore never reused, and a program that makes fresh Variables in a loop does not
grow.

The user's graph is never transformed: each computation is compiled from a copy
(:func:`~geon.op_graph.params.clone_graph`) that shares the placeholders and
variables, with a fresh placeholder standing in for each reused value.

What a call costs
-----------------

The first call with a list of targets walks their graph once and keeps what it found
(the placeholders to feed, the inputs each op depends on, which ops may be remembered)
for as long as the targets live. Later calls with the same targets do work in
proportion to their inputs, not to the graph: a digest of each fed array, the version
of each Variable, a look at the remembered values inside the graph, and, when something
must be computed, the call of a computation found by which remembered values are
reusable now (the graph is walked again only to build a new one). The kept walk is
made again after an op of it is rewired in place (a transformer's passes do that to the
graph they compile: ``transformer.computation(ops)`` on your own ops).

Counting
--------

``last_primitives`` is the number of primitives the last call executed (the ops of the
lowered graphs it ran, views included, placeholders, variables and constants not), and
``primitives_executed`` their total; ``computations_built`` counts compilations.
"""

import collections
import hashlib
import logging
import os
import weakref
from typing import Any, Iterable, Mapping, Optional, Union

import numpy as np

from geon._logging import get_logger
from geon.errors import FeedError
from geon.op_graph import nodes, op_graph as og
from geon.op_graph.ordering import ASSIGN_CLASSES
from geon.op_graph.params import clone_graph, graph_ops, live_deps
from geon.registry import make_transformer


logger = get_logger(__name__)


def fingerprint(array):
    """A digest of ``array``'s dtype, shape and bytes."""
    a = np.ascontiguousarray(array)
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{a.dtype.str}{a.shape}".encode())
    h.update(a.view(np.uint8).reshape(-1) if a.size else b"")
    return h.digest()


def count_primitives(computation):
    """The primitives one call of ``computation`` executes: the ops of its lowered graph
    other than placeholders, variables and constants."""
    return sum(1 for op in computation.ops if not isinstance(op, og.AssignableTensorOp))


class _Entry:
    """A compiled computation of the runner. It refers to the user's ops it computes
    and reuses only weakly (``keys``): the runner must not keep them, nor through its
    computation the Variables they read, alive."""

    __slots__ = ("computation", "placeholders", "reused", "primitives", "assigned", "keys",
                 "__weakref__")

    def __init__(self, computation, placeholders, reused, primitives, assigned, keys):
        self.computation, self.placeholders = computation, placeholders
        self.reused = [weakref.ref(c) for c in reused]
        self.primitives, self.assigned, self.keys = primitives, assigned, keys


class Runner:
    """Runs ops on demand with reuse (see the module docstring).

    Args:
        transformer: the transformer that compiles and holds the variables' state
            (default: a new ``"numpy"`` transformer from :func:`geon.make_transformer`).
        max_computations: how many compiled computations to keep (least recently used
            ones are dropped; the variables' state stays).
    """

    def __init__(self, transformer: Any = None, max_computations: int = 64) -> None:
        if transformer is None:
            transformer = make_transformer("numpy")
        self.transformer = transformer
        self.max_computations = max_computations
        self._computations: collections.OrderedDict = collections.OrderedDict()
        # op -> (inputs signature, array)
        self._memo: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        # Variable -> int
        self._versions: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        # targets' ids -> _Plan; the count of ops added to _memo (plans list the
        # remembered ops of their graph again when it changed)
        self._plans: dict = {}
        self._memo_epoch = 0
        self.primitives_executed = 0
        self.last_primitives = 0
        self.computations_built = 0

    # --- state -------------------------------------------------------------------------
    def invalidate(self, variables: Optional[Iterable[og.Variable]] = None) -> None:
        """Forget remembered values that depend on ``variables`` (default: forget all).
        Call it after writing into the variables' storage directly."""
        if variables is None:
            self._memo = weakref.WeakKeyDictionary()
            self._memo_epoch += 1
            return
        for v in ([variables] if isinstance(variables, og.Op) else variables):
            self._versions[v] = self._versions.get(v, 0) + 1

    def initialize(self, force: bool = False) -> None:
        """Initialize the variables of the computations built so far (all of them again
        if ``force``, which forgets every remembered value)."""
        self.transformer.initialize(force=force)
        if force:
            self.invalidate()

    def save(self, path: Union[str, os.PathLike]) -> None:
        """Save the variables (see :meth:`Transformer.save`)."""
        self.transformer.save(path)

    def restore(self, path: Union[str, os.PathLike]) -> None:
        """Restore the variables (see :meth:`Transformer.restore`); forgets every
        remembered value."""
        self.transformer.restore(path)
        self.invalidate()

    def clear(self) -> None:
        """Drop the compiled computations and the remembered values (the variables keep
        their state)."""
        for entry in list(self._computations.values()):
            self._drop(entry)
        self._computations.clear()
        self.invalidate()

    def _drop(self, entry):
        # A new list, not an edit in place: this may run from a weakref callback while
        # the transformer iterates over its computations.
        t = self.transformer
        t.computations = [c for c in t.computations if c is not entry.computation]

    # --- running -------------------------------------------------------------------------
    def run(self, targets: Any, feeds: Optional[Mapping[og.Op, Any]] = None) -> Any:
        """Compute ``targets`` (an op, or a list or tuple of ops) from ``feeds``
        (``{placeholder: array}``, one for every placeholder the targets need).

        Returns an array for one op, else a list (``None`` for void ops such as
        ``SetItem``, which are executed). Arrays are fresh copies.
        """
        targets, single = og.as_op_list(targets, "run: targets")
        live = [og.require_valid(t) for t in targets]
        plan = self._plan(live)
        sig = _Signatures(plan, self._feeds(feeds, plan), self._version)

        values: list[Any] = [None] * len(live)
        compute = []
        for i, op in enumerate(live):
            hit = self._lookup(op, sig)
            if hit is not None:
                logger.debug("run: reused the value of %s (its inputs are unchanged)",
                             op.name)
                values[i] = hit.copy()
            else:
                compute.append(op)
        compute = list(dict.fromkeys(compute))
        self.last_primitives = 0
        if compute:
            entry = self._computation(compute, live, plan, sig)
            args = [sig.arrays[p] for p in entry.placeholders] + \
                [self._memo[c()][1] for c in entry.reused]
            out = entry.computation(*args)
            self.last_primitives = entry.primitives
            self.primitives_executed += entry.primitives
            got = dict(zip(compute, out))
            for op, value in got.items():
                if value is not None and sig.memoizable(op):
                    if op not in self._memo:
                        self._memo_epoch += 1  # the plans' lists of reusable ops grow
                    self._memo[op] = (sig.of(op), np.array(value))
            for v in entry.assigned:
                self._versions[v] = self._versions.get(v, 0) + 1
            for i, op in enumerate(live):
                if op in got:
                    values[i] = None if got[op] is None else np.array(got[op])
        return values[0] if single else values

    def _plan(self, live):
        """The :class:`_Plan` of the graph of ``live`` (the targets): made by one walk
        of the graph, then kept while the targets live and no graph was rewired."""
        key = tuple(map(id, live))
        plan = self._plans.get(key)
        if plan is not None and plan.edits == nodes.graph_edits and \
                all(r() is op for r, op in zip(plan.keys, live)):
            return plan
        if (plan is not None and plan.edits != nodes.graph_edits) or \
                len(self._plans) >= 4 * self.max_computations:
            self._plans.clear()  # a graph was rewired: every plan may be stale
        plan = _Plan(live, graph_ops(live, initializers=False))
        runner = weakref.ref(self)

        def dead(_):
            # (each target's death calls it: only the first finds the plan)
            r, p = runner(), plan_ref()
            if r is not None and p is not None and r._plans.get(key) is p:
                r._plans.pop(key, None)

        plan_ref = weakref.ref(plan)
        plan.keys = [weakref.ref(op, dead) for op in live]
        self._plans[key] = plan
        return plan

    def _feeds(self, feeds, plan):
        feeds = dict(feeds or {})
        for p in feeds:
            if not isinstance(p, og.Placeholder):
                raise FeedError(f"run: feeds are keyed by placeholders, not "
                                f"{type(p).__name__} {getattr(p, 'name', p)!r}")
        arrays = {}
        for r in plan.placeholders:
            p = r()
            if p not in feeds:
                raise FeedError(f"run: no value fed for placeholder {p.name} "
                                f"({', '.join(map(repr, p.axes))}), built at {p.file_info}")
            arrays[p] = p.as_feed(feeds[p])
        return arrays

    def _version(self, v):
        # Assignments by this runner's calls, and writes by the transformer's procedures
        # (initializers of a computation built later, restore, initialize).
        return self._versions.get(v, 0), self.transformer.write_count(v)

    def _lookup(self, op, sig):
        """The remembered value of ``op`` if its inputs are unchanged, else ``None``."""
        if not sig.memoizable(op):
            return None
        hit = self._memo.get(op)
        if hit is None or hit[0] != sig.of(op):
            return None
        return hit[1]

    def _computation(self, compute, live, plan, sig):
        # Which remembered values inside the graph can be reused now: the walk below
        # depends only on that (and on the ops to compute), so its outcome is kept.
        if plan.memo_epoch != self._memo_epoch:
            plan.candidates = [(weakref.ref(op), id(op)) for op in list(self._memo.keys())
                               if id(op) in plan.ids]
            plan.memo_epoch = self._memo_epoch
        computed = set(map(id, compute))
        hits = []
        for r, i in plan.candidates:
            op = r()
            if op is not None and i not in computed and self._lookup(op, sig) is not None:
                hits.append(i)
        walk_key = (tuple(map(id, compute)), frozenset(hits))
        key = plan.walks.get(walk_key)
        if key is not None:
            entry = self._computations.get(key)
            if entry is not None and all(r() is not None for r in entry.keys):
                self._computations.move_to_end(key)
                if logger.isEnabledFor(logging.DEBUG):   # no name joining per call
                    logger.debug("run: reused the compiled computation of %s",
                                 ", ".join(op.name for op in compute))
                return entry
        entry, key = self._walk(compute, graph_ops(live, initializers=False), sig)
        plan.walks[walk_key] = key
        return entry

    def _walk(self, compute, order, sig):
        # Walk down from the ops to compute; stop at values that can be reused.
        reused, placeholders, assigned = [], [], []
        seen = set(compute)
        stack = list(compute)
        for op in compute:
            if isinstance(op, og.Placeholder):
                placeholders.append(op)
            if isinstance(op, ASSIGN_CLASSES):
                assigned.append(og.snap(op.args[0]))
        while stack:
            for d in live_deps(stack.pop()):
                if d in seen:
                    continue
                seen.add(d)
                if self._lookup(d, sig) is not None:
                    logger.debug("run: reused the value of %s (its inputs are unchanged) "
                                 "instead of computing it again", d.name)
                    reused.append(d)
                    continue
                if isinstance(d, og.Placeholder):
                    placeholders.append(d)
                if isinstance(d, ASSIGN_CLASSES):
                    assigned.append(og.snap(d.args[0]))
                stack.append(d)
        pos = {op: i for i, op in enumerate(order)}
        reused.sort(key=pos.get)
        placeholders.sort(key=pos.get)
        # Keyed by identity; the entry holds the ops weakly and is dropped when one of
        # them dies (its id may then be reused by another op).
        key = (tuple(map(id, compute)), tuple(map(id, reused)))
        entry = self._computations.get(key)
        if entry is not None:
            if all(r() is op for r, op in zip(entry.keys, compute + reused)):
                self._computations.move_to_end(key)
                if logger.isEnabledFor(logging.DEBUG):   # no name joining per call
                    logger.debug("run: reused the compiled computation of %s",
                                 ", ".join(op.name for op in compute))
                return entry, key
            del self._computations[key]  # ops that died and left their ids to others
            self._drop(entry)
        stand_ins = {}
        for c in reused:
            p = og.Placeholder(c.axes, dtype=c.dtype, name=f"{c.name}_reused")
            p.filename, p.lineno = c.filename, c.lineno
            stand_ins[c] = p
        mapping = clone_graph(compute, replace=stand_ins)
        comp = self.transformer.computation([mapping[op] for op in compute],
                                            *placeholders, *[stand_ins[c] for c in reused])
        self.computations_built += 1
        logger.debug("run: compiled a computation of %s (%d reused value(s) fed in)",
                     ", ".join(op.name for op in compute), len(reused))
        entry = _Entry(comp, placeholders, reused, count_primitives(comp),
                       [v for v in dict.fromkeys(assigned) if isinstance(v, og.Variable)],
                       None)
        runner, entry_ref = weakref.ref(self), weakref.ref(entry)

        def dead(_):
            # Called when an op of the key dies, maybe by the cyclic collector in the
            # middle of other work: only unlink (see _drop).
            r, e = runner(), entry_ref()
            if r is not None and e is not None and r._computations.get(key) is e:
                del r._computations[key]
                r._drop(e)

        entry.keys = [weakref.ref(op, dead) for op in compute + reused]
        self._computations[key] = entry
        while len(self._computations) > self.max_computations:
            _, old = self._computations.popitem(last=False)
            self._drop(old)
        return entry, key


class _Plan:
    """What one walk of the targets' graph says, kept for the next calls with the same
    targets, so that a call does work in proportion to its inputs, not to the graph:
    the placeholders to feed, which ops may be remembered, the inputs (placeholders and
    Variables) each op depends on, and which computation each set of reusable values
    leads to. It holds ops only weakly or by ``id`` (every op of the graph lives as
    long as the targets, and the runner drops the plan when a target dies), and it is
    stale once an op of a kept walk was rewired (``nodes.graph_edits``, which the
    passes and Node.replace_arg / add_other_dep change for ops marked ``_walked``)."""

    __slots__ = ("keys", "edits", "sources", "placeholders", "inputs", "memo_ok", "ids",
                 "candidates", "memo_epoch", "walks", "__weakref__")

    def __init__(self, live, order):
        self.edits = nodes.graph_edits
        self.keys = []
        index = {}          # id(placeholder or variable) -> its index in sources
        self.sources = []   # weak references to the placeholders and variables
        self.placeholders = []
        inputs = {}         # id(op) -> frozenset of source indices
        volatile = set()
        self.memo_ok = set()
        empty = frozenset()
        for op in order:
            op._walked = True  # rewiring it now marks kept walks stale
            deps = live_deps(op)
            if isinstance(op, (og.Placeholder, og.Variable)):
                index[id(op)] = len(self.sources)
                self.sources.append(weakref.ref(op))
                if isinstance(op, og.Placeholder):
                    self.placeholders.append(self.sources[-1])
                inputs[id(op)] = frozenset((index[id(op)],))
                continue
            if isinstance(op, og.AssignableTensorOp) and not isinstance(op, og.Constant):
                volatile.add(id(op))  # storage of a kind the runner does not track
            if isinstance(op, ASSIGN_CLASSES) or any(id(d) in volatile for d in deps):
                volatile.add(id(op))
            inputs[id(op)] = empty.union(*(inputs[id(d)] for d in deps))
            if isinstance(op, og.TensorOp) and not isinstance(op, og.AssignableTensorOp) \
                    and id(op) not in volatile:
                self.memo_ok.add(id(op))
        self.inputs = inputs
        self.ids = frozenset(inputs)
        self.candidates, self.memo_epoch = [], -1
        self.walks = {}


class _Signatures:
    """Per call: the fed arrays, and the state of each op's inputs (placeholder digests
    and variable versions, each computed once per call when first needed)."""

    def __init__(self, plan, arrays, version):
        self.arrays, self._plan, self._version = arrays, plan, version
        self._tokens = {}

    def memoizable(self, op):
        """Whether a value of ``op`` may be remembered and reused."""
        return id(op) in self._plan.memo_ok

    def _token(self, s):
        t = self._tokens.get(s)
        if t is None:
            t = fingerprint(self.arrays[s]) if isinstance(s, og.Placeholder) \
                else ("version",) + self._version(s)
            self._tokens[s] = t
        return t

    def of(self, op):
        """The state of ``op``'s inputs (placeholder digests, variable versions)."""
        sources = self._plan.sources
        return frozenset((s, self._token(s))
                         for s in (sources[i]() for i in self._plan.inputs[id(op)]))


_default = None


def default_runner():
    """The :class:`Runner` that :func:`run` uses (made on first use)."""
    global _default
    if _default is None:
        _default = Runner()
    return _default


def run(targets: Any, feeds: Optional[Mapping[og.Op, Any]] = None) -> Any:
    """Compute ``targets`` (an op or a list of ops) with the default :class:`Runner`,
    feeding ``feeds`` (``{placeholder: array}``). Values whose inputs did not change
    since an earlier call that returned them are reused, not recomputed (see
    ``geon.op_graph.run`` for exactly which changes invalidate what). Variables keep
    their values between calls, in the default runner's transformer."""
    return default_runner().run(targets, feeds)
