"""Execution order: dependencies plus write-after-read ordering for assignments.

An assignment (``SetItem`` or the primitive ``Assign``) to storage ``S`` must run after
every op that reads ``S`` and was built before it (so reads built before a SetItem see
the old value). Views alias their storage, so reading a view of ``S`` reads ``S``.
"""

from geon.errors import GeonError
from geon.op_graph import op_graph as og
from geon.op_graph import primitives as pr

#: Ops whose value is their first arg's elements (they alias its storage).
VIEW_CLASSES = (og.Broadcast, og.AxesWithOrder, og.CastAxes, og.Flatten, og.Unflatten,
                og.Slice, og.StopGradient) + pr.VIEW_OPS
ASSIGN_CLASSES = (og.SetItem, pr.Assign)


def alias_roots(order):
    """``{op: storage}`` for storage ops and views of storage, over ``order``."""
    root = {}
    for op in order:
        if isinstance(op, og.AssignableTensorOp):
            root[op] = op
        elif isinstance(op, VIEW_CLASSES):
            r = root.get(op.args[0])
            if r is not None:
                root[op] = r
    return root


def _after(order, position, asg):
    """The ops of ``order`` that depend on ``asg`` (and ``asg`` itself): a walk over
    users, so its cost follows what depends on ``asg``, not the graph's size."""
    after, stack = {asg}, [asg]
    while stack:
        op = stack.pop()
        for user in list(op.users) + list(op._dep_users):
            if user in position and user not in after:
                after.add(user)
                stack.append(user)
    return after


def stale_view_reads(order, results=()):
    """``([(op, i)], [result])``: arg ``i`` of ``op`` is a view of storage that an
    assignment overwrites before ``op`` runs (``op`` depends on the assignment), though
    the view was taken before it; and the ``results`` that are such views taken before
    an assignment (the caller reads a result after the whole computation). Each such
    read must go through a copy made before the assignment. (Storage itself requested
    as a result is its value after the computation, as the reference evaluator gives
    it.)"""
    assigns = [op for op in order if isinstance(op, ASSIGN_CLASSES)]
    if not assigns:
        return [], []
    root = alias_roots(order)
    position = {op: i for i, op in enumerate(order)}
    views = [r for r in results if isinstance(r, VIEW_CLASSES)]
    reads, stale = [], []
    for asg in assigns:
        target = asg.args[0]
        after = _after(order, position, asg)
        for op in sorted(after, key=position.__getitem__):
            # Views count too: a rewrite may build a view of the old view that runs
            # after the assignment (it inherits the other_deps of the op it lowers).
            if op is asg:
                continue
            for i, a in enumerate(op.args):
                if a is not target and a not in after and root.get(a) is target:
                    reads.append((op, i))
        stale += [r for r in views if root.get(r) is target and r not in after
                  and r not in stale]
    return reads, stale


#: The tag of an assignment that belongs to the ops reading after it (the step counter
#: of a random op): a computation runs it with them, as meant, so none names it.
PART_OF_READER = "part_of_reader"


def pulled_in(order, requested):
    """``[(assignment, reader)]``: the assignments among ``order`` (the ops of a
    computation of ``requested``) that were not requested, each with the first op of
    ``order`` that has it in its other_deps.

    An op built after ``SetItem(w, ...)`` that reads ``w`` runs after the assignment, so
    a computation of that op runs the assignment too (see :class:`SetItem`); these are
    the assignments a computation runs only because of that ordering (except those
    tagged :data:`PART_OF_READER`)."""
    wanted = set(requested)
    found = {}
    for op in order:
        for d in op.other_deps:
            if (isinstance(d, ASSIGN_CLASSES) and d not in wanted and d not in found
                    and PART_OF_READER not in d.tags):
                found[d] = op
    return list(found.items())


def assignment_inputs(requested, pulled):
    """``{placeholder: (assignment, reader)}`` for the placeholders that the ops of
    ``requested`` need only through a pulled-in assignment (``pulled`` as returned by
    :func:`pulled_in`): one walk over the graph."""
    if not pulled:
        return {}
    skip = {a for a, _ in pulled}
    direct = set(og.toposort(requested, children=lambda op: op.args + tuple(
        d for d in op.other_deps if d not in skip)))
    found, seen = {}, set(direct)
    for asg, reader in pulled:
        stack = [asg]
        while stack:
            op = stack.pop()
            if op in seen:
                continue
            seen.add(op)
            if isinstance(op, og.Placeholder):
                found[op] = (asg, reader)
            stack.extend(op.all_deps())
    return found


def explain_pulled_in(asg, reader, placeholders=()):
    """Why a computation runs the assignment ``asg`` that ``reader`` is ordered after
    (and needs the ``placeholders``), and the ways out; it starts with ``"; "``."""
    target = asg.args[0]
    need = ""
    if placeholders:
        need = (f"{', '.join(p.name for p in placeholders)} "
                f"{'is' if len(placeholders) == 1 else 'are'} read by ")
    return (f"; {need}{type(asg).__name__} {asg.name} (an assignment to {target.name}, "
            f"built at {asg.file_info}), which the computation runs though it was not "
            f"requested: {type(reader).__name__} {reader.name} (built at "
            f"{reader.file_info}) was built after the assignment and reads "
            f"{target.name} (or derives from an op that does), so it runs after the "
            f"assignment. To compute it without the assignment, build it before the "
            f"assignment, build the assignment with be.SetItem(..., sequence=False) if "
            f"later reads should not wait for it, or read the stored value with "
            f"be.value_of({target.name}); to run the assignment, request it among the "
            f"results")


def _smaller_first(roots, limit=64):
    """``roots`` ordered by how many ops each needs, fewest first (stable).

    The depth-first order then finishes cheap results before expensive ones: in a
    training step the last layer's update runs before the first layer's, so each
    layer's activations die as early as the backward pass allows.
    """
    roots = list(roots)
    if len(roots) < 2 or len(roots) > limit:
        return roots
    size = {id(r): len(og.toposort([r])) for r in roots}
    return sorted(roots, key=lambda r: size[id(r)])


def schedule(roots, strict=True):
    """A run order for ``roots``: every op after its args and other_deps, and every
    assignment after the reads of its target that do not depend on it.

    With ``strict``, a read of a view taken before an assignment by an op that runs
    after it raises (backends whose views alias storage copy such reads first, see
    :func:`stale_view_reads`); the reference evaluator, whose views are snapshots,
    passes ``strict=False``."""
    roots = _smaller_first(roots)
    order = og.toposort(roots)
    assigns = [op for op in order if isinstance(op, ASSIGN_CLASSES)]
    if not assigns:
        return order
    root = alias_roots(order)
    readers = {}
    for op in order:
        # Views alias storage, so they are not reads, except for the reference
        # evaluator (not ``strict``): its views are snapshots, so one taken before an
        # assignment must be evaluated before it.
        if strict and isinstance(op, VIEW_CLASSES):
            continue
        for i, a in enumerate(op.args):
            if i == 0 and isinstance(op, ASSIGN_CLASSES):
                continue
            r = root.get(a)
            if r is not None:
                readers.setdefault(r, []).append((op, a))
    position = {op: i for i, op in enumerate(order)}
    extra = {}
    for asg in assigns:
        after = _after(order, position, asg)
        for reader, via in readers.get(asg.args[0], ()):
            if reader is asg:  # it reads its value (even a view of its target) first
                continue
            if reader in after:
                if strict and via is not asg.args[0] and via not in after:
                    raise GeonError(
                        f"{reader.name} (built at {reader.file_info}) runs after "
                        f"{asg.name} but reads {via.name}, a view of "
                        f"{asg.args[0].name} taken before the assignment; take the view "
                        f"after the assignment or copy it first")
                continue
            extra.setdefault(asg, []).append(reader)
    return og.toposort(roots, extra=extra)
