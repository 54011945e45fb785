"""From a transformed computation to CUDA C and a launch plan, without a GPU.

:func:`generate` schedules the lowered graph, finds the GPU's fused groups, plans
device memory with the CPU's liveness planner (:func:`geon.transformers.memory.plan_memory`,
each plan proved by ``verify_plan``), and emits one kernel per group or op.
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

from typing import NamedTuple

import numpy as np

from geon.errors import GeonError, LoweringError
from geon.op_graph import conv as cv
from geon.op_graph import op_graph as og
from geon.op_graph import primitives as pr
from geon.op_graph.random import Random
from geon.op_graph.conv import CONV_PRIMITIVES
from geon.op_graph.ordering import schedule
from geon.op_graph.user_ops import UserOp
from geon.transformers import memory
from geon.transformers.codegen_text import check_lines, comment
from geon.transformers.gpu import conv as gpu_conv
from geon.transformers.gpu import random as gpu_random
from geon.transformers.gpu import cuda, kernels
from geon.transformers.gpu.layout import Layout, layouts, scalar_constant


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


def fusable(op):
    """Ops a fused elementwise kernel can compute (per element, same shape)."""
    if isinstance(op, (pr.Copy, pr.Assign)):
        return True
    return isinstance(op, og.ElementWise)


def _lengths(op):
    return (op.args[0] if isinstance(op, pr.Assign) else op).axes.lengths


def identity_source(a, lay):
    """The op whose elements ``a`` is, in the same row-major order (``a`` itself, or
    the root of a view of ``a`` that only renames or reshapes), else ``a``."""
    if not isinstance(a, pr.ViewOp):
        return a
    la = lay[a]
    if la.offset == 0 and la.contiguous and la.size == la.root.axes.size:
        return la.root
    return a


def permutation_source(a, lay):
    """The op whose elements ``a`` is, each exactly once in some order (a transpose or
    reshape of it), else ``a``."""
    if not isinstance(a, pr.ViewOp):
        return a
    la = lay[a]
    r = la.root
    if la.offset != 0 or la.size != r.axes.size:
        return a
    dims = sorted(((n, st) for n, st in zip(la.shape, la.strides) if n != 1),
                  key=lambda d: -abs(d[1]))
    if any(st <= 0 for _, st in dims):
        return a
    if Layout(r, 0, [n for n, _ in dims], [st for _, st in dims]).contiguous:
        return r
    return a


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


class Context:
    """What kernel builders need: layouts, roots, buffers and the code of each op."""

    def __init__(self, lay, buffer_of):
        self.lay = lay
        self._buffer_of = buffer_of

    def layout(self, op):
        return self.lay[op]

    def source(self, op):
        """See :func:`identity_source`."""
        return identity_source(op, self.lay)

    def root(self, op):
        return self.lay[op].root

    def buffer(self, root):
        return self._buffer_of(root)

    def pointer(self, params, lay, written=False):
        dt = lay.root.dtype
        return params.pointer(self.buffer(lay.root), lay.offset * dt.itemsize,
                              cuda.ctype(dt), written)

    def rule(self, op):
        r = cuda.cuda_rule(op)
        if r is not None:
            return r
        raise LoweringError(f"the gpu transformer has no CUDA code for {op.name} "
                            f"({type(op).__name__}, built at {op.file_info})")

    def deps_of(self, members):
        out = []
        for m in members:
            if isinstance(m, UserOp):
                src = cuda.user_op_code(type(m))[1]
                if src not in out:
                    out.append(src)
        return out


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
        self.source = ""

    def module_source(self, names=None):
        """CUDA C of the kernels ``names`` (default all): the prelude, the helper
        definitions they need, then the kernels."""
        return module_source([self.kernels[n] for n in (names or self.kernels)])


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


def generate(comp, fusion=True, plan_memory=True, check_numerics=False):
    """The :class:`Program` of ``comp``, a :class:`~geon.transformers.base.Computation`
    whose passes have run (``comp.graph``, ``comp.results``, ``comp.params``). With
    ``check_numerics``, ``checks`` lists what the numerics debug mode checks (the
    kernels are the same)."""
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
    ctx = Context(lay, buffer_of)
    first = {g.members[0]: g for g in groups}
    in_group = {m for g in groups for m in g.members}
    for op in order:
        if not emits(op):
            continue
        if isinstance(op, pr.Assign) and isinstance(op.args[0], og.Variable):
            if op.args[0] not in prog.assigned:
                prog.assigned.append(op.args[0])
        if op in first:
            _emit_group(prog, ctx, first[op])
        elif op in in_group:
            continue
        else:
            _emit_single(prog, ctx, op)
    for r in results:
        prog.results.append(_result_spec(r, lay, buffer_of))
    if check_numerics:
        prog.checks = check_units(prog, lay, buffer_of, groups)
    prog.source = _source(comp, prog)
    return prog


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


def _add(prog, kernel):
    prog.kernels.setdefault(kernel.name, kernel)
    prog.launches.append(kernel)


def _emit_group(prog, ctx, g):
    last = g.members[-1]
    if isinstance(last, pr.ReducePrim):
        _emit_reduce(prog, ctx, last, g.members[:-1], g.internal)
    else:
        if _size(g.members[0]):
            _add(prog, kernels.elementwise_kernel(ctx, g.members, g.internal))


def _size(op):
    return (op.args[0] if isinstance(op, pr.Assign) else op).axes.size


def _emit_single(prog, ctx, op):
    if isinstance(op, pr.Copy) and _emit_transpose(prog, ctx, op):
        return
    if fusable(op):
        if _size(op):
            _add(prog, kernels.elementwise_kernel(ctx, [op], set()))
    elif isinstance(op, (pr.ReducePrim, pr.ReduceMaxArgMax)):
        _emit_reduce(prog, ctx, op, [], set())
    elif isinstance(op, pr.Gemm):
        _emit_gemm(prog, ctx, op)
    elif isinstance(op, tuple(CONV_PRIMITIVES)):
        if op.axes.size:
            params = kernels.Params()
            out = ctx.pointer(params, ctx.layout(op), written=True)
            args = [(ctx.pointer(params, ctx.layout(a)), ctx.layout(a)) for a in op.args]
            build = gpu_conv.conv_kernel if isinstance(op, cv.ConvPrim) else \
                gpu_conv.pool_kernel
            _add(prog, build(params, op, out, args))
    elif isinstance(op, Random):
        if op.axes.size:
            params = kernels.Params()
            out = ctx.pointer(params, ctx.layout(op), written=True)
            step = ctx.pointer(params, ctx.layout(op.args[0]))
            _add(prog, gpu_random.random_kernel(params, op, out, step, [op]))
    elif isinstance(op, pr.Unslice):
        if op.axes.size:
            params = kernels.Params()
            out = ctx.pointer(params, ctx.layout(op), written=True)
            src_lay = ctx.layout(op.args[0])
            src = ctx.pointer(params, src_lay)
            _add(prog, kernels.unslice_kernel(params, op, out, src, src_lay, [op]))
    elif isinstance(op, (pr.Take, pr.PutAdd)):
        _emit_indexed(prog, ctx, op)
    elif isinstance(op, pr.PrefixSum):
        if op.axes.size:
            params = kernels.Params()
            out = ctx.pointer(params, ctx.layout(op), written=True)
            src_lay = ctx.layout(op.args[0])
            _add(prog, kernels.prefix_sum_kernel(params, op, out, ctx.pointer(params, src_lay),
                                                 src_lay, [op]))
    elif isinstance(op, pr.SortPrim):
        if op.args[0].axes.size:
            params = kernels.Params()
            outs = [ctx.lay.get(o) for o in op.outputs]
            values, indices = (None if lay is None else ctx.pointer(params, lay, written=True)
                               for lay in outs)
            src_lay = ctx.layout(op.args[0])
            _add(prog, kernels.sort_kernel(params, op, values, indices,
                                           ctx.pointer(params, src_lay), src_lay, [op]))
    else:
        raise LoweringError(f"the gpu transformer cannot run {op.name} "
                            f"({type(op).__name__}, built at {op.file_info})")


def _emit_indexed(prog, ctx, op):
    """Take (a gather) or PutAdd (zeros, then atomic adds at the indices)."""
    if not op.axes.size:
        return
    lay = ctx.layout(op)
    if isinstance(op, pr.Take) and not op.args[0].axes.lengths[1]:
        raise LoweringError(f"{op.name} (built at {op.file_info}) takes entries from an "
                            f"empty axis")
    if isinstance(op, pr.PutAdd):
        params = kernels.Params()
        _add(prog, kernels.zero_kernel(params, op, ctx.pointer(params, lay, written=True),
                                       [op]))
        if not op.args[0].axes.size:
            return
    params = kernels.Params()
    out = ctx.pointer(params, lay, written=True)
    src_lay, idx_lay = ctx.layout(op.args[0]), ctx.layout(op.args[1])
    src, idx = ctx.pointer(params, src_lay), ctx.pointer(params, idx_lay)
    make = kernels.take_kernel if isinstance(op, pr.Take) else kernels.put_add_kernel
    _add(prog, make(params, op, out, src, src_lay, idx, idx_lay, [op]))


def _emit_transpose(prog, ctx, op):
    """A copy of a (2-D, after merging dimensions) transpose: the tiled kernel."""
    src_lay = ctx.layout(op.args[0])
    if scalar_constant(src_lay.root):
        return False
    dims = src_lay.dims()
    if len(dims) != 2 or abs(dims[1][1]) <= abs(dims[0][1]) or abs(dims[0][1]) != 1:
        return False
    # dims are in result order: result element (a, b) of the row-major (A, B) result
    # is source element a * sa + b * sb, a along the source's contiguous direction
    (A, sa), (B, sb) = dims
    params = kernels.Params()
    out = ctx.pointer(params, ctx.layout(op), written=True)
    src = ctx.pointer(params, src_lay)
    _add(prog, kernels.transpose_kernel(params, op, out, src, A, B, sa, sb, [op]))
    return True


class GemmCall(NamedTuple):
    """A ``Gemm`` kernel as a BLAS call ``C = A @ B`` (``Kernel.library``): the sizes
    (``A`` is ``M x K``, ``B`` is ``K x N``), each matrix's element strides, the dtype,
    and which kernel arguments are ``C``, ``A`` and ``B``. A batched product has
    ``batch``: ``[(count, stride of A, of B, of C)]`` in elements after merging the
    batch dimensions that step evenly (a BLAS's strided-batched call takes one)."""
    M: int
    N: int
    K: int
    a_strides: tuple
    b_strides: tuple
    c_strides: tuple
    dtype: np.dtype
    args: tuple
    batch: tuple = ()


def merged_batch(shape, *strides):
    """``[(length, stride, stride, ...)]`` of batch dimensions ``shape`` with one stride
    per operand: unit dimensions dropped, and adjacent ones merged where every operand
    steps through them evenly (one index then serves all operands)."""
    out = []
    for k, n in enumerate(shape):
        if n == 1:
            continue
        st = [s[k] for s in strides]
        if out and all(prev == s * n for prev, s in zip(out[-1][1:], st)):
            out[-1] = (out[-1][0] * n,) + tuple(st)
        else:
            out.append((n,) + tuple(st))
    return tuple(out)


def _emit_gemm(prog, ctx, op):
    a, b = op.args
    la, lb, lc = ctx.layout(a), ctx.layout(b), ctx.layout(op)
    M, K = la.shape[-2:]
    N = lb.shape[-1]
    nb = len(lc.shape) - 2
    batch = merged_batch(lc.shape[:nb], la.strides[:nb], lb.strides[:nb], lc.strides[:nb])
    if M == 0 or N == 0 or any(d[0] == 0 for d in batch):
        return
    params = kernels.Params()
    c = ctx.pointer(params, lc, written=True)
    pa = ctx.pointer(params, la)
    pb = ctx.pointer(params, lb)
    sa, sb = la.strides[-2:], lb.strides[-2:]

    def vec(lay, strides, fast_second, which):
        s0, s1 = strides
        if lay.offset % 4 or any(d[which] % 4 for d in batch):
            return False
        return (s1 == 1 and s0 % 4 == 0) if fast_second else (s0 == 1 and s1 % 4 == 0)

    sam, sak = sa
    sbk, sbn = sb
    a_fast_k = abs(sak) <= abs(sam) if M > 1 else True
    b_fast_n = abs(sbn) <= abs(sbk) if K > 1 else True
    k = kernels.gemm_kernel(params, pa, pb, c, M, N, K, sa, sb, op.dtype,
                            vec(la, sa, a_fast_k, 1), vec(lb, sb, b_fast_n, 2),
                            not any(d[3] % 4 for d in batch), [op], batch=batch)
    # What a BLAS needs to replace the kernel (the runtime's gemm option)
    k.library = GemmCall(M, N, K, tuple(sa), tuple(sb), tuple(lc.strides[-2:]),
                         np.dtype(op.dtype), tuple(int(p[1:]) for p in (c, pa, pb)), batch)
    _add(prog, k)


def _emit_reduce(prog, ctx, op, prologue, internal):
    """A reduction, computing its input from the fused ``prologue`` members if any.
    ``ReduceMaxArgMax`` is an argmax that also writes the maxima (to its outputs that
    the graph uses)."""
    x = op.args[0]
    lx = ctx.layout(x)
    shape = lx.shape
    both = isinstance(op, pr.ReduceMaxArgMax)
    cls, dt = (pr.ReduceArgMax if both else type(op)), x.dtype
    if both:
        values_lay, index_lay = (ctx.lay.get(o) for o in op.outputs)
    else:
        values_lay, index_lay = None, ctx.layout(op)
    if len(shape) == 1:
        R, L = 1, shape[0]
    elif op.axis == 1:
        R, L = shape
    else:
        L, R = shape
    if R == 0:
        return
    params = kernels.Params()
    ops = list(prologue) + [op]
    deps = ctx.deps_of(prologue)
    if len(shape) == 1:
        sr, sk = 0, lx.strides[0]
    elif op.axis == 1:
        sr, sk = lx.strides
    else:
        sk, sr = lx.strides
    lanes_on_k = R == 1 or abs(sk) <= abs(sr)
    if prologue:
        # x is a member, or a view of one that holds each of its elements once: element
        # (r, k) is the member's element p, computed on the fly.
        f = kernels.Fused(ctx, prologue, internal, params)
        f.plan_loads()
        lays = [ctx.layout(a) for m in prologue for a in m.args]
        src = prologue.index(permutation_source(x, ctx.lay))

        def value(r, k, lines):
            terms = [t if st == 1 else f"{t} * {st}" for t, st in ((r, sr), (k, sk)) if st]
            lines.append(f"const long long p = {' + '.join(terms) or '0'};")
            lines.extend(f.load_lines("p", lambda j: f"const {f.load_list[j][2]} x{j}"))
            lines.extend(f.compute_lines("p", lambda j: f"x{j}"))
            return f"v{src}", k
    else:
        src = ctx.pointer(params, lx)
        lays = [lx]

        def value(r, k, lines):
            idx = " + ".join(f"{t} * {st}" if st != 1 else t
                             for t, st in ((r, sr), (k, sk)) if st != 0) or "0"
            return f"{src}[{idx}]", k

    extent = max([max(abs(v) for v in lay.span()) for lay in lays if lay.span()] + [0])
    spec = kernels.ReduceSpec(cls, dt, R, L, lanes_on_k)
    TX, TY, P, chunk = kernels.reduce_config(spec)
    def outputs(params):
        """Pointers of the result and, for ReduceMaxArgMax, of the maxima."""
        out = ctx.pointer(params, index_lay, written=True) if index_lay else None
        vals = ctx.pointer(params, values_lay, written=True) if values_lay else None
        return out, vals

    if P == 1:
        out, vals = outputs(params)
        _add(prog, kernels.reduce_kernel(spec, params, value, out, ops=ops, deps=deps,
                                         extent=extent, out_value=vals))
        return
    # Two passes: partial results per part of each row, then a reduction of those.
    sv = ("scratch", len(prog.scratch))
    prog.scratch.append(R * P * dt.itemsize)
    out = params.pointer(sv, 0, cuda.ctype(dt), written=True)
    out_i = None
    if spec.arg:
        si = ("scratch", len(prog.scratch))
        prog.scratch.append(R * P * 8)
        out_i = params.pointer(si, 0, "long long", written=True)
    _add(prog, kernels.reduce_kernel(spec, params, value, out, out_i, ops=ops,
                                     deps=deps, part=(P, chunk), extent=extent))
    params2 = kernels.Params()
    pv = params2.pointer(sv, 0, cuda.ctype(dt))
    pi = params2.pointer(si, 0, "long long") if spec.arg else None
    final, vals = outputs(params2)

    def partial(r, k, lines):
        return f"{pv}[{r} * {P} + {k}]", (f"{pi}[{r} * {P} + {k}]" if spec.arg else k)

    spec2 = kernels.ReduceSpec(cls, dt, R, P, True)
    _add(prog, kernels.reduce_kernel(spec2, params2, partial, final, ops=[op],
                                     out_value=vals))


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
    lines.append("// launches, in order:")
    for n, k in enumerate(prog.launches):
        args = ", ".join(f"{_buffer_name(prog, b)}+{off}" if off else _buffer_name(prog, b)
                         for b, off in k.args)
        lines.append(f"//  {n}: {k.name}<<<{k.grid}, {k.block}>>>({args})")
        lines.append(f"//      {comment(k.note)}")
        for op in k.ops:
            lines.append(f"//      {kernels.describe(op)}")
        for u in prog.checks:
            if u.last == n:
                lines.append("//      check_numerics: then checked: " + comment(", ".join(
                    op.name for op, _ in u.outputs) or "(no floating-point value)"))
    check_lines(lines, "CUDA C")
    lines.append("")
    lines.append(prog.module_source())
    return "\n".join(lines) + "\n"
