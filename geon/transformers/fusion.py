"""Elementwise fusion: runs of elementwise ops executed block by block.

A *group* is a run of consecutive elementwise ops (in schedule order, among the ops that
execute code) of one shape with at least :data:`MIN_ELEMENTS` elements, possibly headed
by the matrix product they update a variable with, or ended by reductions of their
rows (see :func:`find_groups`). A backend runs the group one block of rows at a time,
so the values passed between its members stay in cache. A member whose value nobody
outside the group reads, directly, is *internal*: it only ever exists one block at a
time and gets no full-size buffer.

Blocked execution reads an input through a view (a broadcast bias, a transpose) at
positions other than the block being written, so the memory planner keeps every value
a group reads through a view (:func:`view_reads`) alive until the group ends, and lets
no member write over it in place (see ``plan_memory(groups=...)``).
"""

import threading
from concurrent.futures import ThreadPoolExecutor

from geon.op_graph import op_graph as og
from geon.op_graph import primitives as pr
from geon.op_graph.symbols import Sym, evaluate
from geon.transformers import threads

#: Groups work on blocks of about this many elements.
BLOCK_ELEMENTS = 131072
#: Only tensors bigger than a few blocks are worth blocking (smaller ones stay in cache).
MIN_ELEMENTS = 2 * BLOCK_ELEMENTS
#: Whether the NumPy transformer lets an update's gradient product start its group (see
#: :func:`find_groups`); read when a computation is compiled.
GEMM_HEADS = True
#: A group that starts with a matrix product computes at least this many of its rows
#: per block (per call of the BLAS library, which runs small products below its speed
#: and pays a synchronization of its threads per call).
GEMM_BLOCK_ROWS = 256
#: Groups at least this big are split over threads.
PARALLEL_ELEMENTS = 1 << 20
#: At most this many threads per group: the thread policy's budget
#: (:func:`geon.transformers.threads.budget`: ``GEON_NUM_THREADS`` if set, ``1`` for no
#: threads, e.g. one MPI rank per core; else ``OMP_NUM_THREADS``; else the CPUs this
#: process may use). Read when geon is imported. A call uses fewer while other
#: processes keep cores busy (:func:`~geon.transformers.threads.active`).
MAX_THREADS = threads.POLICY.budget


class Group:
    """A fused run: ``members`` in order, the ``internal`` ones, and the number of rows
    (of the first dimension) per block."""

    def __init__(self, members, internal):
        self.members = members
        self.internal = internal
        shape = members[0].axes.shape
        row = 1
        for n in shape[1:]:
            row *= n
        self.rows = shape[0]
        self.rows_per_block = max(1, BLOCK_ELEMENTS // max(row, 1))

    def __repr__(self):
        return f"<Group of {len(self.members)} ops, {len(self.internal)} internal>"


def _fusable(op):
    return (isinstance(op, og.ElementWise) and len(op.axes) >= 1
            and op.axes.size >= MIN_ELEMENTS)


def hinted_fusable(hints):
    """The ``fusable`` test of :func:`find_groups` in a computation with symbolic
    lengths: an op of fixed lengths as :func:`_fusable` says; one of symbolic lengths
    only with ``hints`` (``{symbol: length}``, or None: not fused) to take its size
    from, and with symbolic lengths in its first dimension only (the rows; a block
    keeps a fixed number of them)."""
    def fusable(op):
        if not isinstance(op, og.ElementWise) or not len(op.axes):
            return False
        size = op.axes.size
        if not isinstance(size, Sym):
            return size >= MIN_ELEMENTS
        if hints is None or any(isinstance(n, Sym) for n in op.axes.lengths[1:]):
            return False
        return evaluate(size, hints) >= MIN_ELEMENTS
    return fusable


def _row_reduction(op, members):
    """Whether ``op`` reduces the second dimension of a 2-d member of ``members``: each
    block of rows of the member then gives the same rows of the result."""
    return (isinstance(op, _ROW_REDUCTIONS) and op.axis == 1
            and len(op.args[0].axes) == 2 and op.args[0] in members)


#: reductions a group may end with (one output each, computed row by row)
_ROW_REDUCTIONS = (pr.ReduceSum, pr.ReduceProd, pr.ReduceMax, pr.ReduceMin,
                   pr.ReduceArgMax)


def find_groups(order, results, emits, fusable=None, max_members=None, gemm_head=None,
                reductions=False):
    """Groups of ``order`` (a schedule). ``emits(op)`` says whether ``op`` executes code
    in the backend's body (ops that do not, such as storage and views made once, may
    sit between members). ``fusable(op)``: whether ``op`` may be a member (default:
    elementwise with at least :data:`MIN_ELEMENTS` elements); ``max_members``: a
    longer run is cut into groups of at most this many ops.

    With ``gemm_head(gemm, run)``, a matrix product run right before a group, of its
    shape and read only by its members (directly), becomes the group's first member
    where ``gemm_head`` agrees: it is then computed a block of rows at a time (rows of
    its first operand, all of its second) into scratch, and never gets a full buffer. A
    batched product never heads a group (its first dimension is its batch).

    With ``reductions``, reductions of the second dimension of a 2-d member run right
    after a group (or after a single fusable op) join it as its last members: each block
    reduces its own rows while they are in cache (a bias gradient after the backward
    mask), instead of a second pass over the whole member. ``reductions`` may be a
    predicate: then only the reductions it accepts join.
    """
    _fusable_op = fusable or _fusable
    root = {}  # view -> the op whose elements it shows
    for op in order:
        if isinstance(op, pr.ViewOp):
            root[op] = root.get(op.args[0], op.args[0])
    runs, cur, members = [], [], set()
    shortest = 1 if reductions else 2  # a single op may still take a reduction
    for op in order:
        if not emits(op):
            continue
        # A member must read the others element by element (same block), not through
        # a view such as a transpose.
        fusable = _fusable_op(op)
        if fusable and cur and op.axes.lengths == cur[0].axes.lengths and \
                (max_members is None or len(cur) < max_members) and \
                not any(root.get(a) in members for a in op.args):
            cur.append(op)
            members.add(op)
            continue
        if len(cur) >= shortest:
            runs.append(cur)
        if fusable:
            cur, members = [op], {op}
        elif cur:
            cur, members = [], set()
    if len(cur) >= shortest:
        runs.append(cur)
    if not runs:
        return []
    readers = {}
    for op in order:
        for a in op.args:
            readers.setdefault(a, []).append(op)
    keep = set(results)
    emitted = [op for op in order if emits(op)] if gemm_head or reductions else []
    if reductions:
        after = dict(zip(emitted, emitted[1:]))
        for run in runs:
            op = after.get(run[-1])
            while op is not None and (max_members is None or len(run) < max_members) \
                    and _row_reduction(op, run) \
                    and (reductions is True or reductions(op)):
                run.append(op)
                op = after.get(op)
        runs = [run for run in runs if len(run) > 1]
    if gemm_head is not None:
        before = {b: a for a, b in zip(emitted, emitted[1:])}
        for run in runs:
            g = before.get(run[0])
            if isinstance(g, pr.Gemm) and not g.batch_rank and g not in keep \
                    and g.axes.lengths == run[0].axes.lengths \
                    and readers.get(g) and all(r in run for r in readers[g]) \
                    and gemm_head(g, run):
                run.insert(0, g)
    groups = []
    for run in runs:
        members = set(run)
        internal = set()
        for op in run:
            rs = readers.get(op, ())
            if op not in keep and rs and all(r in members for r in rs):
                internal.add(op)
        group = Group(run, internal)
        if isinstance(run[0], pr.Gemm):  # each block is one call of the BLAS library
            group.rows_per_block = max(group.rows_per_block, GEMM_BLOCK_ROWS)
        groups.append(group)
    return groups


def reads_elsewhere(member, arg):
    """Whether group ``member`` reads ``arg`` at other positions than the block it
    writes: through a view, as a matrix product's operand, or with another shape (a
    row reduction's input)."""
    # (an assignment, a GPU group's last member, writes its target's shape)
    lengths = (member.args[0] if isinstance(member, pr.Assign) else member).axes.lengths
    return (isinstance(member, pr.Gemm) or isinstance(arg, pr.ViewOp)
            or arg.axes.lengths != lengths)


def view_reads(group, root):
    """Roots the group's members read at other positions than the block being written
    (:func:`reads_elsewhere`). The memory plan keeps them intact until the group's
    end."""
    return {root.get(a, a) for op in group.members for a in op.args
            if reads_elsewhere(op, a)}


def threads_for(group, hints=None):
    """How many threads run ``group`` (one where it has a matrix product: the BLAS
    library runs that on its own threads). ``hints``: the values of symbolic lengths
    to decide with (a thread count never changes results)."""
    size, rows = group.members[0].axes.size, group.rows
    if hints is not None:
        size, rows = evaluate(size, hints), evaluate(rows, hints)
    if size < PARALLEL_ELEMENTS or MAX_THREADS < 2 \
            or isinstance(group.members[0], pr.Gemm):
        return 1
    blocks = -(-rows // group.rows_per_block)
    return max(1, min(MAX_THREADS, blocks))


_pool = None
_pool_lock = threading.Lock()


def _get_pool():
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max(1, MAX_THREADS - 1),
                                       thread_name_prefix="geon-fused")
        return _pool


def run_blocks(fn, rows, block, scratch_sets):
    """Run ``fn(lo, hi, *scratch)`` over ``range(rows)``, one block of ``block`` rows per
    call, on as many workers as there are scratch sets (worker 0 is the calling thread,
    the others run in the pool; worker ``k`` passes ``scratch_sets[k]``).

    Work is handed out dynamically: each worker takes the next block not yet taken from
    a shared counter until none are left, so a worker whose core is busy (or a pool
    thread that starts late) does fewer blocks instead of holding up the group. Every
    block runs exactly once. Returns when all workers are done, even if one raised (its
    exception is then raised here), so no worker writes a buffer after the return."""
    parts = min(len(scratch_sets), threads.active())
    if parts == 1:
        fn(0, rows, *scratch_sets[0])
        return
    blocks = -(-rows // block)
    parts = min(parts, blocks)
    taken = [0]  # blocks handed out so far
    lock = threading.Lock()  # a lock per block costs little next to a block's work
    stop = []  # set when a worker raised: the others take no more blocks

    def worker(scratch):
        while True:
            with lock:
                k = taken[0]
                taken[0] = k + 1
            if k >= blocks or stop:
                return
            lo = k * block
            try:
                fn(lo, min(lo + block, rows), *scratch)
            except BaseException:
                stop.append(True)
                raise

    pool = _get_pool()
    futures = [pool.submit(worker, scratch_sets[k]) for k in range(1, parts)]
    try:
        worker(scratch_sets[0])
    finally:
        # Every block is taken (or a worker failed): a pool worker that has not started
        # has nothing to do, so it is cancelled rather than waited for (the pool may be
        # busy with another group); the running ones finish their block.
        running = [f for f in futures if not f.cancel()]
        for f in running:
            f.exception()  # waits
    for f in running:
        f.result()
