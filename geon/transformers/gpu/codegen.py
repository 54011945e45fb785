"""From a transformed computation to CUDA C and a launch plan, without a GPU.

:func:`generate` schedules the lowered graph, finds the GPU's fused groups, plans
device memory with the CPU's liveness planner (:func:`geon.transformers.memory.plan_memory`,
each plan proved by ``verify_plan``), and emits the kernels of each fused group (here)
and of each other op (its entry in :data:`~geon.transformers.gpu.kernels.CUDA_KERNELS`,
registered by the module of its family).
The result is a :class:`Program`: the kernels (CUDA C), the buffers (arenas, feeds,
results, constants, variables, scratch) and the launches in order, each argument a
buffer and a byte offset. A runtime (PyCUDA, or the CPU emulator) only allocates,
compiles, copies and launches.

Fusion on the GPU: consecutive elementwise ops of one shape (``ElementWise``, ``Copy``,
and an ``Assign`` closing the run) become one kernel, in which values only the group
reads stay in registers; a reduction of the group's values (directly, or through a
view holding each element once, such as a transpose) joins it and computes its input
on the fly. Before grouping, :func:`sink_into_assigns` moves the ops that only compute
an assigned value next to the assignment. A fused kernel runs its members together, so
on top of the planner's rules no member may write a buffer that another member reads
at other positions; :func:`_hazards` finds such groups and they are split before the
memory is planned again.
"""

import numpy as np

from geon.errors import GeonError
from geon.op_graph import op_graph as og
from geon.op_graph import primitives as pr
from geon.op_graph.ordering import schedule
from geon.transformers import memory
from geon.transformers.codegen_text import check_lines, comment
from geon.transformers.gpu import cuda
# The module of each family of ops registers what its ops launch (CUDA_KERNELS).
from geon.transformers.gpu import control as _control  # noqa: F401
from geon.transformers.gpu import conv as _conv  # noqa: F401
from geon.transformers.gpu import gemm as _gemm  # noqa: F401
from geon.transformers.gpu import primitives as _primitives  # noqa: F401
from geon.transformers.gpu import random as _random  # noqa: F401
from geon.transformers.gpu.elementwise import element_count, elementwise_kernel, fusable
from geon.transformers.gpu.kernels import Context, describe, emit
from geon.transformers.gpu.layout import (identity_source, layouts, permutation_source,
                                          scalar_constant)
from geon.transformers.gpu.reduce import emit_reduce


class GPUGroup:
    """A fused group: ``members`` in schedule order, the ``internal`` ones (no buffer),
    and the shape its elementwise members share. The last member may be a reduction."""

    def __init__(self, members, internal):
        self.members = members
        self.internal = internal
        m = members[0]
        self.shape = (m.args[0] if isinstance(m, pr.Assign) else m).axes.lengths

    def __repr__(self):
        return f"<GPUGroup of {len(self.members)} ops, {len(self.internal)} internal>"


def _lengths(op):
    return (op.args[0] if isinstance(op, pr.Assign) else op).axes.lengths


def _uses(order, lay):
    """``(readers, views)``: the ops reading each op (views included), and the views
    whose elements are each op's."""
    readers, views = {}, {}
    for op in order:
        for a in op.args:
            readers.setdefault(a, []).append(op)
        if isinstance(op, pr.ViewOp):
            views.setdefault(lay[op].root, []).append(op)
    return readers, views


def _internal(run, uses, keep, lay):
    """The members of ``run`` whose value only the group uses, so that it needs no
    buffer: other members read it directly or through a view that only reshapes (a
    register), or the group's reduction reads it in any order (it recomputes it)."""
    readers, views = uses
    members = set(run)
    red = run[-1] if isinstance(run[-1], pr.ReducePrim) else None
    internal = set()
    for op in run:
        if not isinstance(op, og.TensorOp) or op in keep or not readers.get(op):
            continue
        ok = all(r in members or isinstance(r, pr.ViewOp) for r in readers[op])
        for v in views.get(op, ()):
            for r in readers.get(v, ()):
                if isinstance(r, pr.ViewOp):
                    continue  # a view of a view: itself among views[op]
                if r is red and permutation_source(v, lay) is op:
                    continue
                if r in members and r is not red and identity_source(v, lay) is op:
                    continue
                ok = False
        if ok:
            internal.add(op)
    return internal


def _keep(results, lay):
    """Results and what they are views of: never internal."""
    return set(results) | {lay[r].root for r in results if r in lay}


def find_gpu_groups(order, results, emits, lay):
    """Fused groups of ``order`` (only those of two or more members)."""
    root = {op: lay[op].root for op in lay}
    runs, cur = [], []

    def close():
        if len(cur) > 1:
            runs.append(list(cur))
        cur.clear()

    for op in order:
        if not emits(op):
            continue
        if fusable(op):
            if cur and (_lengths(op) != _lengths(cur[0]) or not _may_join(cur, op, root)):
                close()
            cur.append(op)
            if isinstance(op, pr.Assign):  # later members would read the old value
                close()
            continue
        if isinstance(op, pr.ReducePrim) and cur \
                and permutation_source(op.args[0], lay) in cur \
                and not isinstance(cur[-1], pr.Assign):
            cur.append(op)  # computes its input on the fly
        close()
    close()
    keep, uses = _keep(results, lay), _uses(order, lay)
    return [GPUGroup(run, _internal(run, uses, keep, lay)) for run in runs]


def sink_into_assigns(order, lay):
    """``order`` with the elementwise ops that only compute an assigned value moved to
    just before the assignment (with the views between them), so that they fuse with it
    (an SGD update ``w - lr * g`` is otherwise often scheduled before the matrix
    products that still read ``w``, and must then be stored and copied). An op moves
    only past ops that neither depend on it nor assign storage it reads. Each op moves
    at most once; the result is again a valid schedule."""
    assigns = [op for op in order if isinstance(op, pr.Assign)]
    if not assigns:
        return order
    dependents = {}
    for op in order:
        for d in op.all_deps():
            dependents.setdefault(d, []).append(op)
    pos = {op: i for i, op in enumerate(order)}
    moves = {}  # assignment -> ops to put right before it, in schedule order
    taken = set()
    for asg in assigns:
        target = asg.args[0]
        chain, frontier = set(), [asg.args[1]]
        while frontier:
            op = frontier.pop()
            if op in chain or op in taken or pos[op] > pos[asg]:
                continue
            is_view = isinstance(op, pr.ViewOp)
            if not is_view and not (isinstance(op, (og.ElementWise, pr.Copy))
                                    and op.axes.lengths == target.axes.lengths):
                continue
            if not all(d is asg or d in chain for d in dependents.get(op, ())):
                continue
            chain.add(op)
            frontier.extend(op.args)
        if not any(not isinstance(op, pr.ViewOp) for op in chain):
            continue
        # What the chain reads must not be assigned between its ops and asg.
        reads = {lay[a].root for op in chain for a in op.args if a in lay}
        first = min(pos[op] for op in chain)
        if any(isinstance(o, pr.Assign) and o.args[0] in reads
               for o in order[first + 1:pos[asg]]):
            continue
        # Views left behind would be needed by the moved ops: all members must move.
        moves[asg] = sorted(chain, key=pos.get)
        taken |= chain
    if not moves:
        return order
    out = []
    for op in order:
        if op in taken:
            continue
        out.extend(moves.get(op, ()))
        out.append(op)
    return out


def _may_join(cur, op, root):
    if not isinstance(op, pr.Assign):
        return True
    # Every member reading the target must read it at its own position (directly):
    # the assignment writes element i while other threads may read element j.
    target = op.args[0]
    for m in cur + [op]:
        for i, a in enumerate(m.args):
            if m is op and i == 0:
                continue
            if root.get(a, a) is target and (a is not target):
                return False
    return True


def _split(groups, group, at, results, order, lay):
    """Replace ``group`` by its members before ``at`` and from ``at`` on. A reduction
    (the last member) whose input member is left in the first part runs alone."""
    idx = groups.index(group)
    keep, uses = _keep(results, lay), _uses(order, lay)
    first, second = group.members[:at], group.members[at:]
    last = second[-1]
    if isinstance(last, pr.ReducePrim) \
            and permutation_source(last.args[0], lay) not in second:
        second = second[:-1]
    groups[idx:idx + 1] = [GPUGroup(run, _internal(run, uses, keep, lay))
                           for run in (first, second) if len(run) > 1]


class ResultSpec:
    """How to fetch one result: from ``buffer`` (a layout at ``offset`` elements with
    element ``strides``), or a host ``array`` (a constant), or nothing (void)."""

    def __init__(self, buffer=None, offset=0, shape=(), strides=(), dtype=None, array=None,
                 void=False):
        self.buffer, self.offset, self.shape, self.strides = buffer, offset, shape, strides
        self.dtype, self.array, self.void = dtype, array, void


class Program:
    """Everything a runtime needs to run one computation (see the module docstring).

    Buffers are keys ``(kind, index)``: ``("arena", k)`` of ``arenas[k]`` bytes,
    ``("feed", i)`` for parameter ``i``, ``("result", j)`` of ``result_bytes[j]``,
    ``("const", j)`` holding ``constants[j]``, ``("var", j)`` for ``variables[j]``,
    ``("scratch", j)`` of ``scratch[j]`` bytes.
    """

    def __init__(self):
        self.kernels = {}       # name -> Kernel (unique)
        self.launches = []      # Kernel per launch, in order
        self.arenas = []
        self.feeds = []         # placeholders, in parameter order
        self.result_bytes = []
        self.constants = []
        self.variables = []
        self.scratch = []
        self.results = []       # ResultSpec per requested result
        self.assigned = []      # variables the computation writes
        self.plan = None
        self.groups = []
        self.checks = []        # CheckUnit per kernel or kernels (check_numerics only)
        #: ``[(position, step)]``: host steps (``Cond``, ``WhileLoop``, see
        #: :mod:`geon.transformers.gpu.control`), each run before ``launches[position]``
        self.host_steps = []
        self.ports = []         # bytes of each ("port", j): dense buffers of host steps
        #: a body's program only: the buffer key holding each result, dense
        self.outputs = []
        self.source = ""

    def module_source(self, names=None):
        """CUDA C of the kernels ``names`` (default all): the prelude, the helper
        definitions they need, then the kernels."""
        return module_source([self.kernels[n] for n in (names or self.kernels)])


def all_kernels(prog):
    """The kernels of ``prog`` and of the sub-programs of its host steps (nested ones
    too), each once, by name."""
    out, todo, seen = {}, [prog], set()
    while todo:
        p = todo.pop()
        if id(p) in seen:
            continue
        seen.add(id(p))
        for name, k in p.kernels.items():
            out.setdefault(name, k)
        for _, step in p.host_steps:
            todo.extend(sub.program for sub in step.subprograms)
    return out


def module_source(kernel_list):
    """A compilable module holding ``kernel_list``."""
    deps, parts = [], [cuda.PRELUDE]
    for k in kernel_list:
        for d in k.deps:
            if d not in deps:
                deps.append(d)
    parts.extend(deps)
    parts.extend(k.source for k in kernel_list)
    return "\n".join(parts)


def _hazards(group, plan, buffer_of, root, lay):
    """The member position at which ``group`` must be split, or ``None`` if its fused
    kernel is safe with ``plan``."""
    shape = group.shape
    members = group.members
    pos = {m: i for i, m in enumerate(members)}
    writes = []  # (position, buffer, aligned, dtype)
    for i, m in enumerate(members):
        if isinstance(m, pr.Assign):
            writes.append((i, buffer_of(m.args[0]), True, m.args[0].dtype))
        elif m not in group.internal:
            writes.append((i, buffer_of(m), not isinstance(m, pr.ReducePrim), m.dtype))
    reads = []  # (position, buffer, aligned, dtype)
    for i, m in enumerate(members):
        for j, a in enumerate(m.args):
            if isinstance(m, pr.Assign) and j == 0:
                continue
            src = (permutation_source if isinstance(m, pr.ReducePrim) else identity_source)
            if src(a, lay) in pos:  # a register, or recomputed by the reduction
                continue
            r = root(a)
            if scalar_constant(r):
                continue
            direct = a is r and a.axes.lengths == shape
            reads.append((i, buffer_of(r), direct, r.dtype))
    for wi, wb, waligned, wdt in writes:
        for ri, rb, raligned, rdt in reads:
            if wb == rb and not (waligned and raligned and wdt == rdt):
                if max(wi, ri) == 0:
                    raise GeonError(f"internal: {members[0].name} writes a buffer it "
                                    f"reads at other positions")
                return max(wi, ri)
        for wi2, wb2, waligned2, wdt2 in writes:
            if wi2 > wi and wb2 == wb and not (waligned and waligned2 and wdt == wdt2):
                return wi2
    return None


def generate(comp, fusion=True, plan_memory=True, check_numerics=False, body=False):
    """The :class:`Program` of ``comp``, a :class:`~geon.transformers.base.Computation`
    whose passes have run (``comp.graph``, ``comp.results``, ``comp.params``). With
    ``check_numerics``, ``checks`` lists what the numerics debug mode checks (the
    kernels are the same). With ``body`` (a branch, predicate or loop body run by a
    host step), every result ends dense in a ``result`` buffer of its own, listed in
    ``outputs`` (a copy kernel at the end where it is a view, a feed or a constant)."""
    prog = Program()
    order = schedule(comp.graph.roots)
    results = comp.results
    for op in order:
        if isinstance(op, og.TensorOp):
            cuda.ctype(op.dtype)  # unsupported dtypes fail here, by name
    lay = layouts(order)
    if fusion:
        order = sink_into_assigns(order, lay)
    root = {op: lay[op].root for op in lay}
    rooted = lambda op: root.get(op, op)  # noqa: E731

    def emits(op):  # an Output is written by its multi-output op
        return not isinstance(op, (og.AssignableTensorOp, pr.ViewOp, og.Output))

    groups = find_gpu_groups(order, results, emits, lay) if fusion else []
    prog.feeds = list(comp.params)
    var_index, const_index = {}, {}
    result_index = {}
    for r in results:
        if isinstance(r, og.TensorOp):
            rr = rooted(r)
            if memory.is_producer(rr) and rr not in result_index:
                result_index[rr] = len(prog.result_bytes)
                prog.result_bytes.append(max(rr.axes.size, 1) * rr.dtype.itemsize)

    def plan_for(groups):
        if plan_memory:
            return memory.plan_memory(order, results, groups=groups)
        return memory.unshared_plan(order, results, groups)

    def buffer_of(r):
        if isinstance(r, og.Placeholder):
            return ("feed", prog.feeds.index(r))
        if isinstance(r, og.Variable):
            if r not in var_index:
                var_index[r] = len(prog.variables)
                prog.variables.append(r)
            return ("var", var_index[r])
        if isinstance(r, og.Constant):
            if r not in const_index:
                const_index[r] = len(prog.constants)
                arr = np.array(r.value if r.scalar is None else r.value.reshape(1),
                               dtype=r.dtype)
                prog.constants.append(np.ascontiguousarray(arr))
            return ("const", const_index[r])
        if r in result_index:
            return ("result", result_index[r])
        slot = plan.slot.get(r)
        if slot is None:
            raise GeonError(f"internal: {r.name} has no buffer")
        return ("arena", slot)

    plan = plan_for(groups)
    for _ in range(10 * len(order) + 10):
        split = None
        for g in groups:
            at = _hazards(g, plan, buffer_of, rooted, lay)
            if at is not None:
                split = (g, at)
                break
        if split is None:
            break
        _split(groups, split[0], split[1], results, order, lay)
        plan = plan_for(groups)
    else:  # pragma: no cover - each round splits a group, so this cannot run long
        raise GeonError("internal: fused groups keep conflicting with the memory plan")
    if memory.VERIFY:  # every plan is proved before kernels are made from it
        memory.verify_plan(order, results, plan, groups)
    prog.plan, prog.groups = plan, groups
    prog.arenas = list(plan.sizes)
    ctx = Context(prog, lay, buffer_of)
    ctx.computation = comp
    first = {g.members[0]: g for g in groups}
    in_group = {m for g in groups for m in g.members}
    for op in order:
        if not emits(op):
            continue
        if isinstance(op, pr.Assign) and isinstance(op.args[0], og.Variable):
            if op.args[0] not in prog.assigned:
                prog.assigned.append(op.args[0])
        if op in first:
            _emit_group(ctx, first[op])
        elif op not in in_group:
            emit(ctx, op)
    if body:
        _dense_outputs(ctx, results)
    for r in results:
        prog.results.append(_result_spec(r, lay, buffer_of))
    if check_numerics:
        prog.checks = check_units(prog, lay, buffer_of, groups)
    prog.source = _source(comp, prog)
    return prog


def _dense_outputs(ctx, results):
    """``prog.outputs`` of a body's program: per result, a ``result`` buffer holding it
    densely, its own (the buffer its producer writes) or one a copy kernel fills."""
    from geon.transformers.gpu.control import copy_kernel
    from geon.transformers.gpu.layout import row_major
    prog, claimed = ctx.prog, set()
    for k, r in enumerate(results):
        lay = ctx.layout(r)
        key = ctx.buffer(lay.root)
        if key[0] == "result" and key not in claimed and lay.offset == 0 \
                and lay.size == lay.root.axes.size \
                and (lay.size <= 1 or lay.strides == row_major(lay.shape)):
            claimed.add(key)
            prog.outputs.append(key)
            continue
        prog.result_bytes.append(max(1, lay.size * r.dtype.itemsize))
        out = ("result", len(prog.result_bytes) - 1)
        prog.outputs.append(out)
        kernel = copy_kernel((out, 0), (key, 0), lay, r.dtype, f"result {k} made dense")
        if kernel is not None:
            ctx.add(kernel)


class CheckUnit:
    """What the numerics debug mode checks around launches ``first`` to ``last`` (the
    kernels that compute ``members``: one op, a fused group, or an op of two kernels):
    the values it reads (``inputs``: ``[(op, ResultSpec)]``), fetched before the first
    launch, and the floating-point values it writes (``outputs``: ``[(op, ResultSpec)]``,
    ``op`` the op named if the value is not finite), fetched after the last."""

    def __init__(self, first, last, members, inputs, outputs):
        self.first, self.last, self.members = first, last, members
        self.inputs, self.outputs = inputs, outputs


def check_units(prog, lay, buffer_of, groups):
    """The :class:`CheckUnit` s of ``prog``'s launches, in order."""
    from geon.transformers import numerics
    internal = set()
    for g in groups:
        internal |= g.internal
    units, i, launches = [], 0, prog.launches
    while i < len(launches):
        members = list(launches[i].ops)
        j = i
        # an op of several kernels (two-pass reductions, zeros then adds): one unit
        while j + 1 < len(launches) and set(launches[j + 1].ops) & set(members):
            j += 1
            members += [m for m in launches[j].ops if m not in members]
        units.append(_check_unit(i, j, members, internal, lay, buffer_of, numerics))
        i = j + 1
    return units


def _derived_from_member(a, members):
    while isinstance(a, (pr.ViewOp, og.Output)) and a not in members:
        a = a.args[0]
    return a in members


def _check_unit(first, last, members, internal, lay, buffer_of, numerics):
    mset = set(members)
    inputs, seen = [], set()
    for m in members:
        for a in m.args:
            if a in seen or _derived_from_member(a, mset) or not isinstance(a, og.TensorOp):
                continue
            seen.add(a)
            inputs.append((a, _result_spec(a, lay, buffer_of)))
    outputs = []
    for m in members:
        if isinstance(m, pr.Assign):
            target, v = m.args
            if v in mset and numerics.checked(target):  # v may be held in registers
                outputs.append((v, _result_spec(target, lay, buffer_of)))
            continue
        for o in getattr(m, "outputs", None) or [m]:
            if o in internal or o not in lay or not numerics.checked(o):
                continue
            outputs.append((m, _result_spec(o, lay, buffer_of)))
    return CheckUnit(first, last, members, inputs, outputs)


def _emit_group(ctx, g):
    """The kernel of a fused group: elementwise, or a reduction computing its input from
    the other members."""
    last = g.members[-1]
    if isinstance(last, pr.ReducePrim):
        emit_reduce(ctx, last, g.members[:-1], g.internal)
    elif element_count(g.members[0]):
        ctx.add(elementwise_kernel(ctx, g.members, g.internal))


def _result_spec(r, lay, buffer_of):
    if not isinstance(r, og.TensorOp):
        return ResultSpec(void=True)
    lr = lay[r]
    rt = lr.root
    if isinstance(rt, og.Constant):
        base = np.ascontiguousarray(rt.value if rt.scalar is None else rt.value.reshape(1))
        return ResultSpec(array=host_view(base.reshape(-1), lr))
    return ResultSpec(buffer=buffer_of(rt), offset=lr.offset, shape=lr.shape,
                      strides=lr.strides, dtype=r.dtype)


def host_view(flat, lay):
    """A new array: the elements of the 1-D array ``flat`` seen through ``lay``."""
    if lay.size == 0:
        return np.empty(lay.shape, flat.dtype)
    item = flat.dtype.itemsize
    view = np.lib.stride_tricks.as_strided(flat[lay.offset:], shape=lay.shape,
                                           strides=[s * item for s in lay.strides])
    return np.array(view)


def _buffer_name(prog, buf):
    """The buffer ``buf`` for comments (sanitized)."""
    kind, i = buf
    if kind == "feed":
        return f"feed {comment(prog.feeds[i].name)}"
    if kind == "var":
        return f"variable {comment(prog.variables[i].name)}"
    return f"{kind}{i}"


def _source(comp, prog):
    """The annotated CUDA source shown by ``Computation.source``."""
    lines = ["// geon GPU transformer: computation of "
             + comment(", ".join(getattr(r, "name", "?") for r in comp.requested))]
    for k, size in enumerate(prog.arenas):
        holders = [o.name for o, s in prog.plan.slot.items() if s == k]
        lines.append(f"// arena{k}: {size} bytes, shared by " + comment(", ".join(holders)))
    for j, n in enumerate(prog.result_bytes):
        lines.append(f"// result{j}: {n} bytes")
    for j, n in enumerate(prog.scratch):
        lines.append(f"// scratch{j}: {n} bytes")
    for j, n in enumerate(prog.ports):
        lines.append(f"// port{j}: {n} bytes")
    lines.append("// launches, in order:")
    hosts = {}
    for at, step in prog.host_steps:
        hosts.setdefault(at, []).append(step)

    def host_lines(at):
        for step in hosts.get(at, ()):
            lines.extend("//  " + comment(line) for line in step.describe())

    for n, k in enumerate(prog.launches):
        host_lines(n)
        args = ", ".join(f"{_buffer_name(prog, b)}+{off}" if off else _buffer_name(prog, b)
                         for b, off in k.args)
        lines.append(f"//  {n}: {k.name}<<<{k.grid}, {k.block}>>>({args})")
        lines.append(f"//      {comment(k.note)}")
        for op in k.ops:
            lines.append(f"//      {describe(op)}")
        for u in prog.checks:
            if u.last == n:
                lines.append("//      check_numerics: then checked: " + comment(", ".join(
                    op.name for op, _ in u.outputs) or "(no floating-point value)"))
    host_lines(len(prog.launches))
    check_lines(lines, "CUDA C")
    lines.append("")
    lines.append(prog.module_source())
    subs = []
    for _, step in prog.host_steps:
        subs += [s for s in step.subprograms if s not in subs]
    for s in subs:
        lines.append(f"// ===== the {comment(s.what)}: a computation of its own =====")
        lines.append(s.program.source)
    return "\n".join(lines) + "\n"
