"""Memory planning: liveness-based buffer sharing and in-place execution.

The planner gives every op that produces a value (a *producer*: not storage, not a
view, not a requested result) a place in an *arena*, a byte buffer shared over time by
values whose lifetimes do not overlap. A value lives from the step that computes it to
the last step that reads it, directly or through views of it. An elementwise op may
write into the arena of an argument that dies at that op, when it reads that argument
only directly, with its own shape (in-place execution), and nothing else at that step
reads it at other positions: a fused group runs block by block, so what its members
read through views lives to the group's end and no member writes over it.

Persistent state (variables), constants, placeholders and requested results are never
placed in arenas. :func:`verify_plan` replays every plan before code is made from it
and raises :class:`PlanError` if a value would be overwritten while a later step still
reads it.
"""

import bisect

from geon.errors import GeonError
from geon.op_graph import op_graph as og
from geon.op_graph import primitives as pr
from geon.op_graph.symbols import Sym
from geon.transformers.fusion import reads_elsewhere, view_reads

#: Verify every plan the NumPy and GPU transformers make (:func:`verify_plan`, linear
#: in the schedule: a few percent of the transformation time). Switch it off only to
#: measure that cost (benchmarks/verify.py).
VERIFY = True


class Plan:
    """``slot[op]`` is the arena index of each planned producer; ``sizes[i]`` the byte
    size of arena ``i``; ``inplace`` the producers written over one of their args."""

    def __init__(self):
        self.slot = {}
        self.sizes = []
        self.inplace = set()
        #: the most bytes of values held at one step (no plan needs fewer arena bytes)
        self.peak = 0


def _nbytes(op, binding=None):
    n = op.axes.size
    if binding is not None and isinstance(n, Sym):
        n = n.evaluate(binding)  # a symbolic length: the plan of one binding
    return n * op.dtype.itemsize


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


def plan_memory(order, results, inplace=True, groups=(), exclude=(), binding=None):
    """Plan arenas for the producers in ``order`` (a schedule) that are not in
    ``results``, nor internal to a fused group (``groups``, see
    :mod:`geon.transformers.fusion`). Returns a :class:`Plan`: the smaller (in total
    bytes) of two, one placing values in schedule order (:func:`_plan_in_order`), one
    placing the biggest values first (:func:`_plan_by_size`), made only where the first
    uses more bytes than are ever held at once, and not too many arenas.

    Where lengths are symbolic, ``binding`` (``{symbol: int}``) gives their values:
    a plan is for one binding (which values are planned does not depend on it, only
    where they go)."""
    plan = _plan_in_order(order, results, inplace, groups, exclude, binding)
    if sum(plan.sizes) > plan.peak \
            and len(plan.slot) * len(plan.sizes) <= BY_SIZE_LIMIT:
        other = _plan_by_size(order, results, inplace, groups, exclude, binding)
        if sum(other.sizes) < sum(plan.sizes):
            return other
    return plan


#: The size-ordered plan is tried where planned values times arenas (of the plan in
#: schedule order) is at most this: its search for an arena is linear in the arenas.
BY_SIZE_LIMIT = 100_000


class _Lives:
    """What both planners know of a schedule (see :func:`_lifetimes`)."""

    __slots__ = ("root", "reads", "last", "internal", "group_end", "keep", "viewed")


def _lifetimes(order, results, groups, exclude):
    """What both planners know of ``order``: ``root`` (value_roots), ``reads`` (the
    roots each step reads), ``last`` (root -> the last step that needs it),
    ``internal`` (values that live inside a fused group only), ``group_end`` (step of
    a group member -> the group's last step), ``keep`` (values not planned) and
    ``viewed`` (step -> the roots read there at positions other than those written:
    no value may be written over them at that step)."""
    lives = _Lives()
    lives.root = root = value_roots(order)
    lives.reads = reads = _reads(order, root)
    lives.last = last = {}
    for i, rs in enumerate(reads):
        for r in rs:
            last[r] = i
    # A fused group runs block by block: an arena released inside it is reused only
    # after its last step (group_end), and what a member reads through a view (or as
    # a matrix product's operand) is read at other positions than the block being
    # written, at every member's step, so no member (the last one included) may write
    # over it in place. Both keep such values intact to the group's end.
    lives.viewed = viewed = {}
    lives.group_end = group_end = {}
    lives.internal = internal = set()
    if groups:
        pos = {op: i for i, op in enumerate(order)}
        for g in groups:
            internal |= g.internal
            steps = [pos[m] for m in g.members]
            for s in steps:
                group_end[s] = steps[-1]
            seen = view_reads(g, root)
            if seen:
                for s in steps:
                    viewed[s] = seen
    end = len(order)
    for r in results:
        last[root.get(r, r)] = end  # results and what they view live to the end
    lives.keep = {root.get(r, r) for r in results} | set(exclude)
    return lives


def _overwritable(op, r, i, lives):
    """Whether elementwise-like ``op`` at step ``i`` may write its value over ``r`` (an
    arg's root that dies there): same shape and dtype, ``op`` reads ``r`` only directly
    (no view of it), and nothing else at step ``i`` (the rest of ``op``'s fused group)
    reads ``r`` at other positions."""
    if r.dtype != op.dtype or r in lives.viewed.get(i, ()) \
            or r.axes.lengths != op.axes.lengths:
        return False
    root = lives.root
    for a in op.args:
        if a is not r and root.get(a, a) is r:
            return False
    return True


def _plan_in_order(order, results, inplace, groups, exclude, binding=None):
    """Place values in schedule order: each takes an arena that one of its args frees
    at its step (in place) or the smallest free arena that fits."""
    lives = _lifetimes(order, results, groups, exclude)
    reads, last, group_end, keep = lives.reads, lives.last, lives.group_end, lives.keep
    pending = {}
    plan = Plan()
    slot = plan.slot
    free = []        # arena indices free now
    occupant = {}    # arena -> producer held
    present = set(order)
    unplanned = keep | lives.internal
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
                    need = size[out] = _nbytes(out, binding)
                    arena = _take(plan, free, need)
                    slot[out] = arena
                    occupant[arena] = out
                    live += need
        elif kind is not None and op not in unplanned:
            need = size[op] = _nbytes(op, binding)
            arena = None
            if inplace and kind == "elementwise":
                for r in dying:
                    if _overwritable(op, r, i, lives):
                        arena = slot[r]
                        plan.inplace.add(op)
                        break
                if arena is None and carrier:
                    arena = _carried(op, i, carrier, pending, slot, lives)
                    if arena is not None:
                        plan.inplace.add(op)
                        live += need  # the dead arg's bytes were released
            if arena is None:
                arena = _take(plan, free, need)
                live += need  # (in place, it replaces a value of its size)
            slot[op] = arena
            occupant[arena] = op
        elif inplace and kind == "elementwise" and op in lives.internal:
            for r in dying:
                if _overwritable(op, r, i, lives):
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


def _carried(op, i, carrier, pending, slot, lives):
    """The arena of a dead arg that an internal arg of elementwise ``op`` (step ``i``)
    was computed over (see ``carrier`` in :func:`_plan_in_order`), taken back from the
    arenas waiting for the group's end; or None. ``op`` must read that internal value
    last, element by element, and have the dead arg's size and dtype."""
    for a in op.args:
        held = carrier.get(a)
        if held is None or lives.last.get(a) != i:
            continue
        r, key = held
        arena = slot[r]
        waiting = pending.get(key, ())
        if arena in waiting and _overwritable(op, r, i, lives) \
                and _reads_only_itself(op, a, lives.root):
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


def _plan_by_size(order, results, inplace, groups, exclude, binding=None):
    """Place values biggest first (then by step): each goes in place over an arg that
    dies at its step where allowed, else into the first arena none of whose values'
    lifetimes it overlaps, else into a new arena of its size.

    Placing in schedule order lets a small value take a big free arena that a big value
    needs a step later (a weight gradient in the arena of a dead activation, so the next
    delta gets a new one); biggest first avoids that. A value lives from its step to
    the last step that reads it; an arena released inside a fused group is reusable
    (other than in place) only after the group's last step, as in the other planner."""
    lives = _lifetimes(order, results, groups, exclude)
    reads, last, group_end, keep = lives.reads, lives.last, lives.group_end, lives.keep
    internal = lives.internal
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
    for i, v, op in sorted(values, key=lambda e: (-_nbytes(e[1], binding), e[0])):
        b, f = span[v]
        arena = None
        if inplace and v is op:
            for r in dict.fromkeys(reads[i]):
                a = plan.slot.get(r)
                if a is not None and last.get(r) == i and _elementwise_like(op) \
                        and _overwritable(op, r, i, lives) \
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
            plan.sizes.append(_nbytes(v, binding))
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


class PlanError(GeonError):
    """A memory plan would overwrite a value that a later step still reads: an internal
    error of geon, raised before any code runs instead of returning wrong numbers.
    Switching the planner off (``disable=["memory"]``) works around it."""


def _named(op):
    return f"{type(op).__name__} '{op.name}'"


def verify_plan(order, results, plan, groups=(), binding=None):
    """Replay ``plan`` over ``order`` (a schedule) and prove that every step reads the
    values it was scheduled to read; raise :class:`PlanError`, naming the value, the
    op that overwrote it and the step that still reads it, if not. Linear in the steps
    and the reads: run on every computation (see :data:`VERIFY`).

    A step reads its args' roots, then writes its value (a multi-output op: each
    output) into its arena. A read finds its value if the arena still holds it. A
    write over a value the step itself reads must be an in-place update (elementwise,
    same dtype and shape, the value read only directly). A fused group runs block by
    block through all its members: what a member reads through a view, as a matrix
    product's operand or with another shape, it reads at other positions than the
    block being written, all through the group, so those values must still be held
    after the group's last step; and a member may write over a value the group reads
    directly only block for block (same shape and element size)."""
    slot = plan.slot
    if not slot:
        return True
    sizes = plan.sizes
    root = value_roots(order)
    in_group, ends = {}, {}  # step -> its group's _GroupReads; last step -> [those]
    if groups:
        pos = {op: i for i, op in enumerate(order)}
        for g in groups:
            info = _GroupReads(g, pos, root, slot)
            for m in g.members:
                in_group[pos[m]] = info
            ends.setdefault(info.last, []).append(info)
    holder = {}   # arena -> the value it holds now
    clobber = {}  # value -> the step that wrote over it
    for i, op in enumerate(order):
        for a in op.args:
            r = root.get(a, a)
            arena = slot.get(r)
            if arena is not None and holder.get(arena) is not r:
                raise _stale(r, i, op, clobber, order)
        kind = _KIND.get(type(op), False)
        if kind is False:
            kind = _kind(type(op))
        if kind == "multi":
            written = [w for w in op.outputs if w in slot]
        elif kind is not None and op in slot:
            written = (op,)
        else:
            written = ()  # storage, a view, an Output (written at its op's step)
        for w in written:
            arena = slot[w]
            need = _nbytes(w, binding)
            if need > sizes[arena]:
                raise PlanError(f"memory plan: {_named(w)} ({need} bytes) does not fit "
                                f"arena {arena} ({sizes[arena]} bytes){_HINT}")
            prior = holder.get(arena)
            if prior is not None:
                _check_write(op, w, prior, i, in_group.get(i), root)
                clobber[prior] = i
            holder[arena] = w
        if i in ends:
            for info in ends[i]:
                for r, (reader, j) in info.spread.items():
                    if holder.get(slot[r]) is not r:
                        raise _stale(r, j, reader, clobber, order, info)
    for r in results:
        r = root.get(r, r)
        arena = slot.get(r)
        if arena is not None and holder.get(arena) is not r:
            raise _stale(r, len(order), None, clobber, order)
    return True


class _GroupReads:
    """What a fused group reads from arenas: ``spread`` (root -> (member, step) of a
    read at other positions than the block being written: through a view, as a matrix
    product's operand, or with another shape) and ``direct`` (roots read block for
    block); ``first`` and ``last``, its steps."""

    def __init__(self, group, pos, root, slot):
        self.first, self.last = pos[group.members[0]], pos[group.members[-1]]
        self.spread, self.direct = {}, set()
        for m in group.members:
            for a in m.args:
                r = root.get(a, a)
                if r not in slot:
                    continue
                if a is r and not reads_elsewhere(m, a):
                    self.direct.add(r)
                elif r not in self.spread:
                    self.spread[r] = (m, pos[m])


def _check_write(op, w, prior, i, group, root):
    """Raise :class:`PlanError` unless step ``i`` (``op``) may write ``w`` over
    ``prior``, the value its arena holds (see :func:`verify_plan`)."""
    reads = False  # op reads what it overwrites: only an elementwise update in place
    for a in op.args:
        if root.get(a, a) is prior:
            if a is not prior:
                reads = "through a view"
                break
            reads = True
    if reads and (reads is not True or w is not op or not _elementwise_like(op)
                  or prior.dtype != op.dtype or prior.axes.lengths != op.axes.lengths):
        raise PlanError(
            f"memory plan: {_named(prior)} is overwritten by {_named(op)} (step {i}), "
            f"which still reads it {'at other positions' if reads is True else reads} "
            f"(not an elementwise update in place){_HINT}")
    if group is None:
        return
    spread = group.spread.get(prior)
    if spread is not None:
        reader, j = spread
        raise PlanError(
            f"memory plan: {_named(prior)} is overwritten by {_named(op)} (step {i}) "
            f"while step {j} ({_named(reader)}) still reads it at other positions, "
            f"block by block in the fused group of steps {group.first}-{group.last}"
            f"{_HINT}")
    if prior in group.direct and not (
            w is op and w.axes.lengths == prior.axes.lengths
            and w.dtype.itemsize == prior.dtype.itemsize):
        raise PlanError(
            f"memory plan: {_named(prior)} is overwritten by {_named(op)} (step {i}) "
            f"(a value of another shape or element size) while the fused group of steps "
            f"{group.first}-{group.last} still reads it block by block{_HINT}")


_HINT = ("; this is an internal error of geon's memory planner (please report it); "
         "disable=['memory'] avoids it")


def _stale(r, j, reader, clobber, order, group=None):
    """The :class:`PlanError` of step ``j`` (``reader``; None: the caller, for a
    result) finding ``r``'s arena overwritten."""
    k = clobber.get(r)
    by = (f"overwritten by {_named(order[k])} (step {k})" if k is not None
          else "not computed into its arena")
    if reader is None:
        still = "the caller still reads it (a requested result)"
    elif group is not None:
        still = (f"step {j} ({_named(reader)}) still reads it at other positions, block "
                 f"by block in the fused group of steps {group.first}-{group.last}")
    else:
        still = f"step {j} ({_named(reader)}) still reads it"
    return PlanError(f"memory plan: {_named(r)} is {by} while {still}{_HINT}")


def unshared_plan(order, results, groups=(), exclude=(), binding=None):
    """One arena per producer (no sharing, nothing in place): the plan with memory
    planning switched off."""
    plan = Plan()
    keep = {value_roots(order).get(r, r) for r in results} | set(exclude)
    for g in groups:
        keep |= g.internal
    for op in order:
        if is_producer(op) and op not in keep:
            plan.slot[op] = len(plan.sizes)
            plan.sizes.append(_nbytes(op, binding))
    return plan
