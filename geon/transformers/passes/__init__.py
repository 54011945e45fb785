"""The pass framework.

A :class:`Graph` is the set of ops a computation needs, reached from its results. A
:class:`RewritePass` holds small named rules keyed by op class; it visits ops from a
worklist (arguments first) and, when a rule returns a replacement, swaps it in with
:meth:`Graph.replace` and queues the new ops and the replaced op's users (only they
see a changed arg). It never re-sorts the whole graph per replacement.
"""

import collections

from geon.errors import GeonError
from geon.op_graph import op_graph as og
from geon.op_graph import primitives as pr
from geon.op_graph.nodes import _rewrite_stack, note_rewired, rewriting
from geon.op_graph.ordering import ASSIGN_CLASSES, VIEW_CLASSES

__all__ = ["DeadCodeElimination", "Graph", "Pass", "RewritePass"]


class Graph:
    """The ops reachable from ``results`` (through args and other_deps)."""

    def __init__(self, results):
        self.results = [og.snap(r) for r in results]
        # What replaced results had to run after (their other_deps) stays in the graph.
        self.extra_roots = []
        # Ops built after an earlier transformation may still point at replaced ops.
        stale = False
        for op in self.ops():
            for a in op.all_deps():
                if a.forward is None:
                    continue  # (most ops: no call to snap)
                s = og.snap(a)
                if s is not a:
                    op.replace_arg(a, s)
                    stale = True
        if stale:
            self._ops = None
        self.initial_order = self.ops()
        self.initial = set(self.initial_order)
        self._assigned = {op.args[0] for op in self.initial
                          if isinstance(op, ASSIGN_CLASSES)}

    _ops = None

    def ops(self):
        """All ops, each after its dependencies (cached until the next replacement)."""
        if self._ops is None:
            self._ops = og.toposort(self.roots)
        return self._ops

    @property
    def roots(self):
        """The results, then the ops that replaced results had to run after."""
        return self.results + self.extra_roots

    def invalidate(self):
        """Forget the cached op order; call after changing args or deps directly."""
        self._ops = None

    def replace(self, old, new):
        """Make every user of ``old`` use ``new`` and set ``old.forward = new``.

        ``new`` must have the same axes (in order) and dtype. Users of ``old`` inherit
        its other_deps, so ordering constraints survive the swap.
        """
        if isinstance(old, og.TensorOp):
            if not isinstance(new, og.TensorOp) or new.axes != old.axes \
                    or new.dtype != old.dtype:
                raise GeonError(
                    f"internal: replacement of {old.name} ({old.axes!r} {old.dtype}) by "
                    f"{getattr(new, 'name', new)} ({getattr(new, 'axes', None)!r} "
                    f"{getattr(new, 'dtype', None)}) changes its type")
        if self._assigned and _storage_of(new) in self._assigned and (
                old in self.results or isinstance(new, og.AssignableTensorOp)):
            # ``old`` read the storage where it ran. Its users (and the caller, for a
            # result) read later, maybe after an assignment: copy the storage (or the
            # view of it) where ``old`` ran. Views built by the rule are handled by the
            # alias pass.
            # ``old`` may have run after assignments to that storage only through its
            # args (``-(-v)`` built after a SetItem of v): the copy follows them too.
            storage = _storage_of(new)
            follows = [op for op in og.toposort([old]) if isinstance(op, ASSIGN_CLASSES)
                       and op.args[0] is storage]
            with rewriting(old):
                new = pr.Copy(new, follows=follows)
        for user in list(old.users) + list(old._dep_users):
            if user is new:
                continue
            user.replace_arg(old, new)
            for d in old.other_deps:
                user.add_other_dep(d)
        old.forward = new
        note_rewired(old)
        self._ops = None
        if old in self.extra_roots:
            self.extra_roots = [new if r is old else r for r in self.extra_roots]
        if old in self.results:
            self.results = [new if r is old else r for r in self.results]
            self.extra_roots.extend(d for d in old.other_deps
                                    if d not in self.extra_roots and d is not new)


def _storage_of(op):
    """The Variable or placeholder ``op`` is (or is a view of), else ``None``."""
    while isinstance(op, VIEW_CLASSES):
        op = op.args[0]
    return op if isinstance(op, og.AssignableTensorOp) and not op.is_constant else None


class Pass:
    """A graph pass. Subclasses set ``name`` (or pass ``name=``) and implement
    :meth:`run`."""

    name = "pass"

    def __init__(self, name=None):
        if name is not None:
            self.name = name

    def run(self, graph, transformer):
        """Rewrite ``graph`` (a :class:`Graph`) in place, for ``transformer``."""
        raise NotImplementedError

    def __repr__(self):
        return f"<pass {self.name}>"


class RewritePass(Pass):
    """Apply rules until none fires.

    ``rules`` is a list of ``(classes, fn)``; ``fn(op)`` returns a replacement op or
    ``None``. Ops built inside ``fn`` take the replaced op's source location and
    other_deps (see ``geon.op_graph.nodes.rewriting``). After :meth:`run`,
    ``steps`` counts the ops it took from its worklist plus those it offered to it after
    replacements: linear in the graph's size.
    """

    rules = ()
    steps = 0

    def __init__(self, extra_rules=(), name=None):
        super().__init__(name)
        self._table = {}
        for classes, fn in list(self.rules) + list(extra_rules):
            self.add_rule(classes, fn)

    def add_rule(self, classes, fn):
        """Register ``fn`` for ``classes`` (a class or a tuple); later rules run later."""
        if not isinstance(classes, tuple):
            classes = (classes,)
        for cls in classes:
            self._table.setdefault(cls, []).append(fn)
        self._cache = {}

    def _rules_for(self, cls):
        rules = self._cache.get(cls)
        if rules is None:
            rules = [fn for c in cls.__mro__ for fn in self._table.get(c, ())]
            self._cache[cls] = rules
        return rules

    def run(self, graph, transformer):
        initial = graph.ops()
        work = collections.deque(initial)
        queued = set(initial)
        members = set(initial)  # users outside this graph are not this pass's business
        budget = 100 * len(initial) + 1000
        steps = 0
        # ``with rewriting(op)`` around each rule, inlined: most rules decline, and this
        # loop runs them on every op of the graph
        stack = _rewrite_stack
        rules_for, cache = self._rules_for, self._cache
        while work:
            op = work.popleft()
            queued.discard(op)
            steps += 1
            if op.forward is not None:
                continue
            rules = cache.get(type(op))
            for rule in rules_for(type(op)) if rules is None else rules:
                created = []
                stack.append((op, created, True))
                try:
                    new = rule(op)
                finally:
                    stack.pop()
                if new is None or new is op:
                    continue
                # Only op's users see a new arg: queue them, not all of new's users
                # (new may be a placeholder that thousands of ops read; re-queuing
                # those per replacement made wide graphs quadratic).
                moved = [u for u in list(op.users) + list(op._dep_users) if u in members]
                graph.replace(op, new)
                new = op.forward  # replace() may have put a Copy in between
                members.update(created)
                members.add(new)
                offered = created + [new] + moved
                steps += len(offered)
                for n in offered:
                    if n not in queued and n.forward is None:
                        work.append(n)
                        queued.add(n)
                break
            budget -= 1
            if budget < 0:
                raise GeonError(f"pass {self.name}: rules keep firing; a rule must not "
                                f"undo another (last op: {op.name})")
        self.steps = steps


class DeadCodeElimination(Pass):
    """Drop ops no result needs. Ops that left the graph without a replacement get
    ``forward = Invalid``."""

    name = "dce"

    def run(self, graph, transformer):
        live = set(graph.ops())
        for op in graph.initial - live:
            if op.forward is None and not isinstance(op, og.AssignableTensorOp):
                op.forward = og.Invalid
                note_rewired(op)
