"""Memory planning: liveness-based buffer sharing and in-place execution.

The planner gives every op that produces a value (a *producer*: not storage, not a
view, not a requested result) a place in an *arena*, a byte buffer shared over time by
values whose lifetimes do not overlap. A value lives from the step that computes it to
the last step that reads it, directly or through views of it. An elementwise op may
write into the arena of an argument that dies at that op, when it reads that argument
only directly, with its own shape (in-place execution).

Persistent state (variables), constants, placeholders and requested results are never
placed in arenas. :func:`verify_plan` replays a plan and proves that no value is
overwritten while a later step still reads it; the tests run it on every computation.
"""

import bisect

from geon.errors import GeonError
from geon.op_graph import op_graph as og
from geon.op_graph import primitives as pr

#: Set by the test suite: verify every plan the NumPy transformer makes.
VERIFY = False


class Plan:
    """``slot[op]`` is the arena index of each planned producer; ``sizes[i]`` the byte
    size of arena ``i``; ``inplace`` the producers written over one of their args."""

    def __init__(self):
        self.slot = {}
        self.sizes = []
        self.inplace = set()
        #: the most bytes of values held at one step (no plan needs fewer arena bytes)
        self.peak = 0


def _nbytes(op):
    return op.axes.size * op.dtype.itemsize


def is_producer(op):
    """Whether ``op`` computes a new value into a buffer."""
    return isinstance(op, og.TensorOp) and not isinstance(
        op, (og.AssignableTensorOp, pr.ViewOp))


def value_roots(order):
    """``{op: producer or storage whose elements op's value is}`` (views resolved)."""
    root = {}
    for op in order:
        if isinstance(op, pr.ViewOp):
            root[op] = root.get(op.args[0], op.args[0])
        elif isinstance(op, og.TensorOp):
            root[op] = op
    return root


def _reads(order, root):
    """For each step, the roots it reads (through args)."""
    return [[root.get(a, a) for a in op.args] for op in order]


def _elementwise_like(op):
    """Whether ``op``'s kernel may write its result over an arg of its shape: an
    elementwise op, or an op class saying so (``in_place = True``, e.g. an allreduce)."""
    return isinstance(op, og.ElementWise) or getattr(op, "in_place", False)


def _inplace_ok(op, arg_root, root):
    """``op`` may overwrite ``arg_root`` while computing: elementwise (or in place by
    nature), and every arg of ``op`` rooted there is ``arg_root`` itself with ``op``'s
    shape."""
    return _elementwise_like(op) and _nbytes(arg_root) == _nbytes(op) \
        and arg_root.dtype == op.dtype and _reads_only_itself(op, arg_root, root)


def _reads_only_itself(op, arg_root, root):
    """Whether every arg of ``op`` rooted at ``arg_root`` is ``arg_root`` itself with
    ``op``'s shape (no view of it)."""
    lengths = None
    for a in op.args:
        if root.get(a, a) is arg_root:
            if a is not arg_root:
                return False
            if lengths is None:
                lengths = op.axes.lengths
            if a.axes.lengths != lengths:
                return False
    return True


def _group_spans(order, groups, root):
    """``[(last step of group, roots it reads through views)]`` for fused groups."""
    from geon.transformers.fusion import view_reads
    pos = {op: i for i, op in enumerate(order)}
    return [(pos[g.members[-1]], view_reads(g, root)) for g in groups]


def _take(plan, free, need):
    """A free arena for ``need`` bytes: the smallest that fits, else the largest free one
    grown, else a new one."""
    fits = [a for a in free if plan.sizes[a] >= need]
    if fits:
        arena = min(fits, key=lambda a: plan.sizes[a])
    elif free:
        arena = max(free, key=lambda a: plan.sizes[a])
        plan.sizes[arena] = need
    else:
        plan.sizes.append(need)
        return len(plan.sizes) - 1
    free.remove(arena)
    return arena


def assign_in_place(order, results):
    """Write updates such as ``w - lr * g`` straight into ``w``.

    Returns ``(order, {value op: storage})``. For each ``Assign(w, v)`` whose value is an
    elementwise op of ``w``'s shape and dtype read only by the assignment, ``v`` and the
    chain of elementwise ops only it reads (and a matrix product of ``w``'s shape, the
    gradient, that only the chain reads: the fused group can then compute it block by
    block) are moved to just before the assignment (so
    the reads of ``w`` scheduled in between come first); then ``v`` is computed into
    ``w`` and the ``Assign`` does nothing. It is skipped where ``v`` reads ``w`` other
    than element by element, or where the move would carry a read of some storage past
    an assignment to it.
    """
    from geon.op_graph.ordering import ASSIGN_CLASSES, VIEW_CLASSES
    order = list(order)
    assigns = [op for op in order if isinstance(op, pr.Assign)]
    if not assigns:
        return order, {}
    root = {}
    for op in order:  # storage reached through views
        if isinstance(op, og.AssignableTensorOp):
            root[op] = op
        elif isinstance(op, VIEW_CLASSES) and op.args[0] in root:
            root[op] = root[op.args[0]]
    users = {}
    for op in order:
        for a in op.args:
            users.setdefault(a, []).append(op)
    kept = set(results)
    out = {}
    pos = {op: i for i, op in enumerate(order)}
    for asg in assigns:
        w, v = asg.args
        if not isinstance(w, og.Variable) or not _elementwise_like(v) \
                or v in kept or v.dtype != w.dtype or v.axes.lengths != w.axes.lengths \
                or users.get(v) != [asg]:
            continue
        if any(root.get(a) is w and a is not w for a in v.args):
            continue  # reads the storage through a view: not element by element
        chain, todo = {v}, [v]
        while todo:  # the elementwise ops (and a gradient's product) that only feed v
            for a in todo.pop().args:
                if (isinstance(a, og.ElementWise) or isinstance(a, pr.Gemm)
                        and a.axes.lengths == w.axes.lengths) \
                        and a not in kept and a not in chain \
                        and len(users.get(a, ())) == 1 and users[a][0] in chain:
                    chain.add(a)
                    todo.append(a)
        first, end = min(pos[c] for c in chain), pos[asg]
        between = order[first:end]
        read = {root[a] for c in chain for a in c.args if a in root}
        if any(isinstance(op, ASSIGN_CLASSES) and op not in chain and op.args[0] in read
               for op in between):
            continue
        if any(op not in chain and any(d in chain for d in op.all_deps()) for op in between):
            continue  # only the assignment may depend on the chain
        moved = [op for op in between if op in chain]
        order[first:end] = [op for op in between if op not in chain] + moved
        for k in range(first, end):
            pos[order[k]] = k
        out[v] = w
    return order, out


def plan_memory(order, results, inplace=True, groups=(), exclude=()):
    """Plan arenas for the producers in ``order`` (a schedule) that are not in
    ``results``, nor internal to a fused group (``groups``, see
    :mod:`geon.transformers.fusion`). Returns a :class:`Plan`: the smaller (in total
    bytes) of two, one placing values in schedule order (:func:`_plan_in_order`), one
    placing the biggest values first (:func:`_plan_by_size`), made only where the first
    uses more bytes than are ever held at once, and not too many arenas."""
    plan = _plan_in_order(order, results, inplace, groups, exclude)
    if sum(plan.sizes) > plan.peak \
            and len(plan.slot) * len(plan.sizes) <= BY_SIZE_LIMIT:
        other = _plan_by_size(order, results, inplace, groups, exclude)
        if sum(other.sizes) < sum(plan.sizes):
            return other
    return plan


#: The size-ordered plan is tried where planned values times arenas (of the plan in
#: schedule order) is at most this: its search for an arena is linear in the arenas.
BY_SIZE_LIMIT = 100_000


def _lifetimes(order, results, groups, exclude):
    """What both planners know of ``order``: ``root`` (value_roots), ``reads`` (the
    roots each step reads), ``last`` (root -> the last step that needs it),
    ``internal`` (values that live inside a fused group only), ``group_end`` (step of
    a group member -> the group's last step) and ``keep`` (values not planned)."""
    root = value_roots(order)
    reads = _reads(order, root)
    last = {}
    for i, rs in enumerate(reads):
        for r in rs:
            last[r] = i
    # A fused group reads views at other positions than it writes: keep those alive.
    for end_step, roots in _group_spans(order, groups, root):
        for r in roots:
            last[r] = max(last.get(r, end_step), end_step)
    internal = set()
    for g in groups:
        internal |= g.internal
    # A group runs block by block: an arena freed inside it may only be reused (other
    # than in place) once the whole group has run.
    group_end = _group_steps(order, groups)
    end = len(order)
    for r in results:
        last[root.get(r, r)] = end  # results and what they view live to the end
    keep = {root.get(r, r) for r in results} | set(exclude)
    return root, reads, last, internal, group_end, keep


def _plan_in_order(order, results, inplace, groups, exclude):
    """Place values in schedule order: each takes an arena that one of its args frees
    at its step (in place) or the smallest free arena that fits."""
    root, reads, last, internal, group_end, keep = _lifetimes(order, results, groups,
                                                              exclude)
    pending = {}
    plan = Plan()
    slot = plan.slot
    free = []        # arena indices free now
    occupant = {}    # arena -> producer held
    present = set(order)
    unplanned = keep | internal
    size = {}  # planned value -> its bytes
    live = 0  # bytes of the values held now
    # An internal elementwise member of a fused group whose arg dies at its step, with
    # its size and dtype: the arg's arena is released, but only at the group's end,
    # so the member that reads the internal value last may still write over it, block
    # by block (an activation over the product its bias was added to).
    carrier = {}  # internal value -> (the arg that died, key of its arena in pending)
    for i, op in enumerate(order):
        rs = reads[i]
        dying = [r for r in (dict.fromkeys(rs) if len(rs) > 1 else rs)
                 if r in slot and last.get(r) == i]
        kind = _KIND.get(type(op))
        if kind is None:
            kind = _kind(type(op))
        if kind == "multi":
            # Its outputs are written at this step (never over an input).
            for out in op.outputs:
                if out in present and out not in keep:
                    need = size[out] = _nbytes(out)
                    arena = _take(plan, free, need)
                    slot[out] = arena
                    occupant[arena] = out
                    live += need
        elif kind is not None and op not in unplanned:
            need = size[op] = _nbytes(op)
            arena = None
            if inplace and kind == "elementwise":
                for r in dying:
                    if size[r] == need and r.dtype == op.dtype \
                            and _reads_only_itself(op, r, root):  # (_inplace_ok)
                        arena = slot[r]
                        plan.inplace.add(op)
                        break
                if arena is None and carrier:
                    arena = _carried(op, i, need, carrier, last, size, pending, slot, root)
                    if arena is not None:
                        plan.inplace.add(op)
                        live += need  # the dead arg's bytes were released
            if arena is None:
                arena = _take(plan, free, need)
                live += need  # (in place, it replaces a value of its size)
            slot[op] = arena
            occupant[arena] = op
        elif inplace and kind == "elementwise" and op in internal:
            need = _nbytes(op)
            for r in dying:
                if size[r] == need and r.dtype == op.dtype \
                        and _reads_only_itself(op, r, root):
                    carrier[op] = (r, group_end.get(i, i))
                    break
        if live > plan.peak:
            plan.peak = live
        for r in dying:
            a = slot[r]
            if occupant.get(a) is r:
                occupant.pop(a)
                live -= size[r]
                pending.setdefault(group_end.get(i, i), []).append(a)
        if pending:
            free.extend(pending.pop(i, ()))
    return plan


def _carried(op, i, need, carrier, last, size, pending, slot, root):
    """The arena of a dead arg that an internal arg of elementwise ``op`` (step ``i``)
    was computed over (see ``carrier`` in :func:`_plan_in_order`), taken back from the
    arenas waiting for the group's end; or None. ``op`` must read that internal value
    last, element by element, and have the dead arg's size and dtype."""
    for a in op.args:
        held = carrier.get(a)
        if held is None or last.get(a) != i:
            continue
        r, key = held
        arena = slot[r]
        waiting = pending.get(key, ())
        if size[r] == need and r.dtype == op.dtype and arena in waiting \
                and _reads_only_itself(op, a, root):
            waiting.remove(arena)
            del carrier[a]
            return arena
    return None


#: op class -> what :func:`_plan_in_order` does at its step (see :func:`_kind`)
_KIND = {}


def _kind(cls):
    """``"multi"`` (a MultiOutput: its outputs are planned), ``"elementwise"`` (a
    producer that may compute in place, see :func:`_elementwise_like`), ``"producer"``
    (another producer) or ``None`` (nothing planned: storage, views, Outputs, void)."""
    if issubclass(cls, og.MultiOutput):
        kind = "multi"
    elif not issubclass(cls, og.TensorOp) or issubclass(
            cls, (og.AssignableTensorOp, pr.ViewOp, og.Output)):
        kind = None
    elif issubclass(cls, og.ElementWise) or getattr(cls, "in_place", False):
        kind = "elementwise"
    else:
        kind = "producer"
    _KIND[cls] = kind
    return kind


def _plan_by_size(order, results, inplace, groups, exclude):
    """Place values biggest first (then by step): each goes in place over an arg that
    dies at its step where allowed, else into the first arena none of whose values'
    lifetimes it overlaps, else into a new arena of its size.

    Placing in schedule order lets a small value take a big free arena that a big value
    needs a step later (a weight gradient in the arena of a dead activation, so the next
    delta gets a new one); biggest first avoids that. A value lives from its step to
    the last step that reads it; an arena released inside a fused group is reusable
    (other than in place) only after the group's last step, as in the other planner."""
    root, reads, last, internal, group_end, keep = _lifetimes(order, results, groups,
                                                              exclude)
    present = set(order)
    values = []  # (step, value, the step's op)
    for i, op in enumerate(order):
        if isinstance(op, og.MultiOutput):
            values += [(i, out, op) for out in op.outputs if out in present and
                       out not in keep]
        elif is_producer(op) and op not in keep and op not in internal \
                and not isinstance(op, og.Output):
            values.append((i, op, op))
    span = {}  # value -> (first step, last step its arena is held)
    for i, v, _ in values:
        j = last.get(v, i)
        span[v] = (i, group_end.get(j, j) if j > i else j)
    plan = Plan()
    births, held = [], []  # per arena: sorted first steps, and (first, last, value)
    for i, v, op in sorted(values, key=lambda e: (-_nbytes(e[1]), e[0])):
        b, f = span[v]
        arena = None
        if inplace and v is op:
            for r in dict.fromkeys(reads[i]):
                a = plan.slot.get(r)
                if a is not None and last.get(r) == i and _inplace_ok(op, r, root) \
                        and _fits(births[a], held[a], b, f, r):
                    arena = a
                    plan.inplace.add(op)
                    break
        if arena is None:
            for a in range(len(plan.sizes)):
                if _fits(births[a], held[a], b, f, None):
                    arena = a
                    break
        if arena is None:
            plan.sizes.append(_nbytes(v))
            births.append([])
            held.append([])
            arena = len(plan.sizes) - 1
        k = bisect.bisect_right(births[arena], b)
        births[arena].insert(k, b)
        held[arena].insert(k, (b, f, v))
        plan.slot[v] = arena
    return plan


def _fits(births, held, b, f, over):
    """Whether a value held over steps ``b..f`` fits an arena holding ``held`` (sorted
    by first step, not overlapping): the value held before it ends before ``b`` (or is
    ``over``, which it overwrites in place at ``b``), the next starts after ``f``."""
    k = bisect.bisect_left(births, b)
    if k and held[k - 1][1] >= b and held[k - 1][2] is not over:
        return False
    return k == len(held) or held[k][0] > f


def _group_steps(order, groups):
    """``{step of a fused group's member: step of the group's last member}``."""
    pos = {op: i for i, op in enumerate(order)}
    out = {}
    for g in groups:
        end = pos[g.members[-1]]
        for m in g.members:
            out[pos[m]] = end
    return out


def verify_plan(order, results, plan, groups=()):
    """Replay ``plan`` over ``order``; raise :class:`GeonError` if some step reads a
    value whose arena was overwritten since it was computed, or if a step overwrites
    an arg it reads in a way that is not a safe elementwise in-place update. A fused
    group's reads through views must survive to the group's end."""
    root = value_roots(order)
    spans = {}
    for end_step, roots in _group_spans(order, groups, root):
        spans.setdefault(end_step, set()).update(roots)
    # Inside a group, a member may overwrite a value other members read only in place.
    pos = {op: i for i, op in enumerate(order)}
    group_reads = {}
    for g in groups:
        reads = {root.get(a, a) for m in g.members for a in m.args}
        for m in g.members:
            group_reads[pos[m]] = reads
    internal = set()
    for g in groups:
        internal |= g.internal
    holder = {}  # arena -> producer whose value it holds now
    for i, op in enumerate(order):
        for r in spans.get(i - 1, ()):
            a = plan.slot.get(r)
            if a is not None and holder.get(a) is not r:
                raise GeonError(f"memory plan: a fused group reads {r.name} through a "
                                f"view, but arena {a} was overwritten inside the group")
        read = [root.get(a, a) for a in op.args]
        for r in read:
            a = plan.slot.get(r)
            if a is not None and holder.get(a) is not r:
                raise GeonError(f"memory plan: step {i} ({op.name}) reads {r.name} from "
                                f"arena {a}, which now holds "
                                f"{getattr(holder.get(a), 'name', 'nothing')}")
        written = [op] if not isinstance(op, og.MultiOutput) else list(op.outputs)
        if isinstance(op, og.Output):
            written = []  # written by its multi-output op, at that op's step
        for w in written:
            a = plan.slot.get(w)
            if a is None:
                continue
            for r in read:
                if plan.slot.get(r) == a and not (w is op and _inplace_ok(op, r, root)):
                    raise GeonError(f"memory plan: {op.name} overwrites its input "
                                    f"{r.name} in arena {a} unsafely")
            if _nbytes(w) > plan.sizes[a]:
                raise GeonError(f"memory plan: {w.name} does not fit arena {a}")
            prior = holder.get(a)
            if prior is not None and prior in group_reads.get(i, ()) and not (
                    prior in read and _inplace_ok(op, prior, root)) \
                    and not _over_internal(op, prior, root, internal):
                raise GeonError(f"memory plan: fused {op.name} overwrites {prior.name}, "
                                f"which its group still reads block by block")
            holder[a] = w
    for r in spans.get(len(order) - 1, ()):
        a = plan.slot.get(r)
        if a is not None and holder.get(a) is not r:
            raise GeonError(f"memory plan: a fused group's view input {r.name} was "
                            f"overwritten inside the group")
    for r in results:
        r = root.get(r, r)
        a = plan.slot.get(r)
        if a is not None and holder.get(a) is not r:
            raise GeonError(f"memory plan: result {r.name} was overwritten")
    return True


def _over_internal(op, prior, root, internal):
    """Whether ``op`` may overwrite ``prior`` because it could overwrite an internal
    member of its group that could overwrite ``prior`` (both in place, element by
    element; a later read of ``prior`` is caught as a read of the wrong value)."""
    return any(x in internal and _inplace_ok(x, prior, root) and _inplace_ok(op, x, root)
               for x in op.args)


def unshared_plan(order, results, groups=(), exclude=()):
    """One arena per producer (no sharing, nothing in place): the plan with memory
    planning switched off."""
    plan = Plan()
    keep = {value_roots(order).get(r, r) for r in results} | set(exclude)
    for g in groups:
        keep |= g.internal
    for op in order:
        if is_producer(op) and op not in keep:
            plan.slot[op] = len(plan.sizes)
            plan.sizes.append(_nbytes(op))
    return plan
