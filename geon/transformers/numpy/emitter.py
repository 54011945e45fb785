"""The code generator of the NumPy transformer: a computation's graph becomes the source
of a small Python module (see :mod:`geon.transformers.numpy.transformer`).

:class:`ModuleEmitter` does one computation. It schedules the ops, finds the fused
groups and plans the memory (:meth:`~ModuleEmitter.prepare`), names the storage, then
emits one kind of line per method (a view, a fused or compiled group, a multi-output
op, a ufunc that allocates its result, any other primitive), and wraps the lines in
``setup()`` and ``run()`` with the feed checks and the results
(:meth:`~ModuleEmitter.module_source`).
"""

import functools
import re

import numpy as np

from geon.op_graph import domains
from geon.op_graph import op_graph as og
from geon.op_graph import primitives as pr
from geon.op_graph.ordering import schedule
from geon.op_graph.reference import NP_UFUNCS
from geon.transformers import fusion, memory, numerics
from geon.errors import GeonError
from geon.op_graph.specialize import probe_binding
from geon.op_graph.symbols import Sym, evaluate
from geon.transformers.codegen_text import RESERVED, comment, identifier, py_literal
from geon.transformers.fusion import find_groups
from geon.transformers.numpy import blas, c_scan, epilogues, segments
from geon.transformers.numpy import rows as row_passes
from geon.transformers.numpy import compiled as compiled_kernels
from geon.transformers.numpy.control import subgraph_computations
from geon.transformers.numpy.code_table import (NUMPY_CODE, NUMPY_VIEWS, ROW_LENGTHS,
                                                ROW_OPERAND, _constant_row, _loop)
from geon.transformers.numpy.op_graph import _UFUNC_RULES
from geon.transformers.numpy.primitives import _BLAS_DTYPES
from geon.transformers.numpy.user_ops import _module_globals

#: Generated lines that run work on several threads (the BLAS's or geon's), or call a
#: subgraph's computation (which runs under its caller's count): a call of a
#: computation with one first asks the thread policy how many to use (threads.py).
_PARALLEL = re.compile(r"\b(?:np\.matmul|_run_blocks|_gemm_\w+|_conv_\w+|_skinny)\(|"
                       r"_scan_bodies\[")


def _accumulation(g, names):
    """(a, b, w, alpha) by name when fused group ``g`` is ``w + alpha * (a @ b)``
    written into ``w``'s own buffer (an SGD update ``w - lr * (a @ b)``, or
    ``w + (a @ b) * c``, ...), which the BLAS can do in one call; else None."""
    if not blas.available() or len(g.members) != 3:
        return None
    gemm, scale, last = g.members
    if not isinstance(gemm, pr.Gemm) or gemm.batch_rank or gemm.dtype not in _BLAS_DTYPES \
            or not isinstance(scale, og.Multiply) \
            or not isinstance(last, (og.Add, og.Subtract)) \
            or any(m.dtype != gemm.dtype for m in g.members) \
            or not {gemm, scale} <= g.internal:
        return None
    c = scale.args[1] if scale.args[0] is gemm else scale.args[0]
    w, p = last.args
    if gemm not in scale.args or p is not scale \
            or not (isinstance(c, og.Constant) and c.scalar is not None):
        return None
    alpha = -float(c.scalar) if isinstance(last, og.Subtract) else float(c.scalar)
    a, b = gemm.args
    if any(x not in names for x in (a, b, w, last)) or names[w] != names[last]:
        return None
    return names[a], names[b], names[w], alpha


def _last_readers(g):
    """arg -> the index of the last member of group ``g`` that reads it."""
    return {a: k for k, m in enumerate(g.members) for a in m.args}


class ModuleEmitter:
    """Generates the module of computation ``comp`` (a ``NumPyComputation``), with its
    fused groups compiled to C where ``compiled`` (True or ``compiled.AUTO``) says.

    The emitter keeps the state of one generation (the names given so far, the
    constants, the lines of ``setup()`` and ``run()``); what the computation needs
    later (its source, plan, constants, kernels) is set on ``comp`` by :meth:`emit`."""

    def __init__(self, comp, compiled=False):
        self.comp, self.compiled = comp, compiled
        self.t = comp.transformer
        # The module's own names; those it makes itself begin with an underscore, which
        # names made from the graph's text never do (codegen_text.identifier).
        self.taken = taken = {"np", "setup", "run"}
        taken.update(_module_globals())
        self.names, self.consts, self.variables, self.scratch = {}, {}, {}, {}
        self.scalars, self.zero_d = {}, {}
        self.rows = {}  # (scalar constant, length) -> the name of a row of its value
        comp._result_dtypes = {}  # dtype of a result -> its name in the module
        self.setup, self.body = [], []
        # Symbolic lengths (symbols.py): the symbols are local names of run() and
        # parameters of setup(), which makes the views of one binding's buffers.
        self.sym = sym = getattr(comp, "_symbols", ())
        clash = [n for n in sym if n in taken or n in RESERVED]
        if clash:
            raise GeonError(f"symbol(s) {', '.join(clash)} of the computation's "
                            f"symbolic axes are named like a name the generated code "
                            f"uses; rename the symbol (be.symbolic_axis(name, "
                            f"symbol=...))")
        taken.update(sym)
        known = getattr(self.t, "size_hints", {})
        #: the values of the symbols for size-based choices, if hinted for all of them
        self.hints = {n: known[n] for n in sym} if all(n in known for n in sym) \
            else None
        self.planned = []  # symbolic: the planned values, in the order setup() views them
        for p in comp.params:
            self.names[p] = identifier(p.name, taken)
        comp._copy_feeds = any(isinstance(op, pr.Assign)
                               and isinstance(op.args[0], og.Placeholder)
                               for op in comp.ops)

    def emit(self):
        """Generate the module and compile it (setting what the computation keeps)."""
        comp = self.comp
        self.prepare()
        self.name_storage()
        # groups that start by adding a bias to a GEMM: the two in one BLAS call
        self.bias_adds = {}
        for g in self.groups:
            if not (self.kernels and self.kernels.compilable(g, self.scalars)):
                found = epilogues.gemm_bias(self, g)
                if found is not None:
                    self.bias_adds[g] = found
        self.bias_gemms = {gemm for gemm, _ in self.bias_adds.values()}
        # convolutions that add the bias and clamp after them themselves; softmaxes and
        # layer norms' statistics as one pass (rows.py)
        found = (f(self, op) for op in self.order
                 for f in (epilogues.find, row_passes.find_softmax,
                           row_passes.find_layer_norm))
        self.epilogues = {e.head: e for e in found if e is not None}
        self.fused_away = {m for e in self.epilogues.values() for m in e.ops + e.views}
        for op in self.order:
            if op not in self.names:
                self.emit_op(op)
        returns = self.returns()
        self.core = list(self.body)   # (step(), below: the lines without the checks)
        self.body[:0] = self.feed_checks()
        src = self.module_source(returns)
        comp._arenas = dict(zip(self.arenas, self.plan.sizes))
        comp._planned = self.planned
        comp._scratch = self.scratch
        comp._consts, comp._variables = self.consts, self.variables
        comp._compile_source(src)
        comp._kernels = self.kernels  # its .source: the C code of the compiled groups
        comp._kernel_fns = self.kernels.build() if self.kernels else {}

    # --- the schedule, the groups and the memory plan ---------------------------------
    def prepare(self):
        """Schedule the ops, find the fused groups and plan the buffers."""
        comp, t = self.comp, self.t
        order = schedule(comp.graph.roots)
        comp._into = {}
        # The numerics debug mode checks each primitive's value right after it is
        # computed, and then looks at its inputs: nothing is computed in place (no
        # buffer sharing, nothing computed into a variable's storage), and no ops are
        # fused (a fused group runs the same NumPy calls on blocks of rows, so its ops
        # compute the same values one by one, and the first to go wrong can be named).
        check = self.check = comp._check_numerics = t.check_numerics
        comp._checks = []  # the op of each check, by index
        if "memory" not in t.disabled and not check:
            # an update such as ``w - lr * g`` is written straight into ``w``
            order, comp._into = memory.assign_in_place(order, comp.results)
        root = memory.value_roots(order)
        # Results get a new array each call (handed to the caller); views of them and
        # of the fed arrays must be made per call, the rest once in setup().
        fresh = {root.get(r, r) for r in comp.results}
        self.fresh = fresh = {r for r in fresh if memory.is_producer(r)}
        self.dynamic = dynamic = set(comp.params) | fresh
        for op in order:
            if isinstance(op, pr.ViewOp) and op.args[0] in dynamic:
                dynamic.add(op)
        groups = self.find_groups(order)
        for g in groups:  # blocked groups read views at other places than they write
            seen = fusion.view_reads(g, root)
            for m in g.members:
                if comp._into.get(m) in seen:
                    del comp._into[m]
        # Symbolic lengths: the plan is made per binding (NumPyComputation._bind); the
        # code only needs which values are planned, which no binding changes: any
        # binding under which every slice fits tells.
        binding = probe_binding(self.sym, order) if self.sym else None
        if "memory" in t.disabled or check:  # checked: each input kept to be shown
            plan = memory.unshared_plan(order, comp.results, groups, binding=binding)
        else:
            plan = memory.plan_memory(order, comp.results, groups=groups,
                                      exclude=comp._into, binding=binding)
        if self.sym:
            comp._plan_args = (order, list(comp.results), groups, dict(comp._into))
            plan.sizes = []  # (arenas come with each binding's plan)
        elif memory.VERIFY:  # every plan is proved before code is made from it
            memory.verify_plan(order, comp.results, plan, groups)
        if not self.sym:
            comp.plans += 1
        # The schedule the plan is for (the memory-plan figure of the guide reads it).
        comp.plan, comp.groups, comp.order = plan, groups, order
        self.plan, self.groups, self.order = plan, groups, order
        self._into = comp._into
        self._root, self._last_read, self._step = root, {}, {}
        self._readers = {}   # op -> how many ops read it directly (an op reading it
        # twice counts twice)
        for i, op in enumerate(order):  # the last step reading each value, for groups
            self._step[op] = i
            for a in op.args:
                self._last_read[root.get(a, a)] = i
                self._readers[a] = self._readers.get(a, 0) + 1
        self.first = {g.members[0]: g for g in groups}
        self.in_group = {m for g in groups for m in g.members}
        self.arenas = [identifier(f"arena{k}", self.taken) for k in range(len(plan.sizes))]
        self._arena_views = {}
        self.present = set(order)

    def emits(self, op):
        """Whether ``op`` has a line of its own in ``run()``."""
        return not isinstance(op, (og.AssignableTensorOp, og.Output)) and (
            not isinstance(op, pr.ViewOp) or op in self.dynamic)

    def find_groups(self, order):
        """The fused groups of ``order`` (none in the debug mode or with "fusion"
        disabled), and the compiled path's :class:`Kernels` where it is on."""
        comp, compiled, t = self.comp, self.compiled, self.t
        # The compiled path (compiled.py) also fuses smaller groups it can compile (of
        # any size with compiled=True, from AUTO_MIN_ELEMENTS with "auto"). The
        # gradient product of an update ``w - lr * G`` computed into ``w`` runs block by
        # block in its group: G never exists in full, and w is touched once.
        kernels = compiled_kernels.Kernels(self.hints) if compiled and not self.check \
            else None
        self.kernels = kernels
        # Symbolic lengths: values of fixed lengths fused as usual, those of symbolic
        # lengths where the transformer's size hints give every symbol a typical
        # length, if their symbolic lengths are their rows (fusion.hinted_fusable;
        # doc/symbolic_axes.rst); the compiled path decides with the hinted sizes too
        if kernels is not None:
            # (a scan or loop body runs once a step: "auto" fuses its small ops too)
            test = compiled_kernels.auto_fusable if compiled == compiled_kernels.AUTO \
                and not t.nested else compiled_kernels.fusable
            can = functools.partial(test, hints=self.hints)
        else:
            can = fusion.hinted_fusable(self.hints) if self.sym else None
        # A view line (of a feed or result, made per call) does not cut a run: the
        # group's call makes the views its members read first (group_lines).
        groups = [] if "fusion" in t.disabled or self.check else find_groups(
            order, comp.results,
            lambda op: self.emits(op) and not isinstance(op, pr.ViewOp), can,
            kernels and compiled_kernels.MAX_MEMBERS,
            gemm_head=(lambda g, run: run[-1] in comp._into) if fusion.GEMM_HEADS else None,
            reductions=True if kernels is None else compiled_kernels.row_sum)
        if kernels is not None and compiled == compiled_kernels.AUTO:
            # below AUTO_MIN_ELEMENTS a group is compiled only with several ops, and
            # below the NumPy code's own threshold it is only worth it as C
            scalar_consts = {op for op in order
                             if isinstance(op, og.Constant) and op.scalar is not None}
            hints = self.hints or {}
            sizes = {g: evaluate(g.members[0].axes.size, hints) for g in groups}
            groups = [g for g in groups
                      if (sizes[g] >= compiled_kernels.AUTO_MIN_ELEMENTS or
                          len(g.members) >= compiled_kernels.AUTO_SMALL_MEMBERS)
                      and (sizes[g] >= fusion.MIN_ELEMENTS or
                           kernels.compilable(g, scalar_consts))]
        if kernels is not None and t.steps and not self.sym:
            # a scan's body: single ops compile too, so that its loop can run in C
            # (c_scan.py); as C or NumPy calls they cost about the same
            grouped = {m for g in groups for m in g.members}
            groups += [fusion.Group([op], set()) for op in order
                       if op not in grouped and self.emits(op)
                       and compiled_kernels.fusable(op) and not isinstance(op, pr.ViewOp)]
            at = {op: k for k, op in enumerate(order)}
            groups.sort(key=lambda g: at[g.members[0]])
        return groups

    # --- names --------------------------------------------------------------------------
    def name_storage(self):
        """Name every variable and constant (storage first: a fused group reads ahead in
        the order)."""
        names, consts, taken = self.names, self.consts, self.taken
        for op in self.order:
            if op in names:
                continue
            if isinstance(op, og.Variable):
                names[op] = identifier(op.name, taken)
                self.variables[names[op]] = op
            elif isinstance(op, og.Constant) and self.sym and op.axes.is_symbolic:
                # one number over symbolic axes: its full view is made per binding
                names[op] = identifier("c_" + op.name, taken)
                z = self.zero_d[op] = identifier("z_" + op.name, taken)
                consts[z] = op.value
                self.scalars[op] = identifier("s_" + op.name, taken)
                consts[self.scalars[op]] = op.value[()]
                self.setup.append(f"    {names[op]} = np.broadcast_to({z}, "
                                  f"{py_literal(op.axes.shape)})")
            elif isinstance(op, og.Constant):
                names[op] = identifier("c_" + op.name, taken)
                consts[names[op]] = op.array()
                if op.scalar is not None:
                    self.scalars[op] = identifier("s_" + op.name, taken)
                    consts[self.scalars[op]] = op.value[()]
                    # the 0-d array itself (a ufunc reads it faster than a NumPy scalar):
                    # the constant's own name where its value has its shape
                    if op.value.shape == op.axes.shape:
                        self.zero_d[op] = names[op]
                    else:
                        self.zero_d[op] = identifier("z_" + op.name, taken)
                        consts[self.zero_d[op]] = op.value

    def row(self, c, n):
        """The name of a row of ``n`` elements of scalar constant ``c``'s value."""
        name = self.rows.get((c, n))
        if name is None:
            name = self.rows[c, n] = identifier(f"r_{c.name}_{n}", self.taken)
            self.consts[name] = _constant_row(c.value, c.dtype, n)
        return name

    def arg_names(self, op, local=None, block=None):
        """The names of ``op``'s args; ``local``: of their blocks in a fused group of
        ``block`` rows per block."""
        names = self.names
        local = local or {}
        if not isinstance(op, og.ElementWise):
            return [local.get(a) or names[a] for a in op.args]
        # a ufunc reads a one-number constant faster from a 0-d array than from a
        # NumPy scalar (same dtype, same result)
        small = self.zero_d if type(op) in NP_UFUNCS else self.scalars
        if type(op) in ROW_OPERAND and op.axes \
                and not isinstance(op.axes.lengths[-1], Sym):  # (a row: a fixed length)
            n = op.axes.lengths[-1]
            cut = ""
            if block is not None and len(op.axes) == 1:  # rows are elements
                n, cut = min(n, block), "[:_j - _i]"
            if ROW_LENGTHS[0] <= n <= ROW_LENGTHS[1]:
                return [local.get(a) or (self.row(a, n) + cut if a in self.zero_d
                                         else names[a])
                        for a in op.args]
        return [local.get(a) or small.get(a) or names[a] for a in op.args]

    # --- one method per kind of line ----------------------------------------------------
    def emit_op(self, op):
        """The lines of ``op`` (not named yet), by its kind."""
        comp = self.comp
        if op in self.epilogues:
            self.epilogues[op].emit(self)
        elif op in self.fused_away:
            return   # computed by an epilogue or a row pass (epilogues.py, rows.py)
        elif isinstance(op, pr.ViewOp):
            self.view_line(op)
        elif op in self.first:
            self.group_lines(self.first[op])
        elif op in self.in_group or isinstance(op, og.Output):
            return  # emitted with its group / by its multi-output op
        elif isinstance(op, og.MultiOutput):
            self.multi_output_lines(op)
        elif op in self.bias_gemms:  # emitted by its group (_group_code)
            self.names[op] = self.buffer(op, self.body)
        elif isinstance(op, pr.Assign) and op.args[1] in comp._into:
            self.body.append(f"    # {comment(op.name)}: its value was computed in "
                             f"{self.names[op.args[0]]}")
        elif self._ufunc_allocates(op):
            self.allocating_ufunc_line(op)
        else:
            self.primitive_lines(op)

    def _view_ahead(self, op):
        """Name the view ``op`` (and the views it is made of) before its place in the
        order: a group's member reads it."""
        if op not in self.names and isinstance(op, pr.ViewOp):
            self._view_ahead(op.args[0])
            self.view_line(op)

    def view_line(self, op):
        """A view: made per call where it views a feed or a result, else in setup(); a
        reshape to the arg's own shape (a cast of its axes) is the arg itself."""
        names = self.names
        shape = op.axes.shape
        if isinstance(op, pr.Reshape) and op in self.dynamic and all(
                isinstance(n, int) for n in shape) and shape == op.args[0].axes.shape:
            names[op] = names[op.args[0]]
            return
        names[op] = identifier("v_" + op.name, self.taken)
        line = f"{names[op]} = {NUMPY_VIEWS[type(op)](op, names[op.args[0]])}"
        (self.body if op in self.dynamic else self.setup).append(
            self.comp._annotate(line, op))

    def group_lines(self, g):
        """A fused group: one C call where it compiles, else blocks of NumPy calls."""
        for m in g.members:
            for a in m.args:
                self._view_ahead(a)
        if self.kernels and self.kernels.compilable(g, self.scalars):
            self.body.extend(self.kernels.group_code(
                g, self.names, self.scalars, self.consts, self.dynamic, self.buffer,
                self.taken))
        else:
            self.body.extend(self._group_code(g))

    def rule_lines(self, op, out):
        """The lines of ``op``'s NUMPY_CODE rule computing into ``out``."""
        lines = NUMPY_CODE.find(op)(op, out, self.arg_names(op))
        self.body.append(self.comp._annotate(lines[0], op))
        self.body.extend("    " + ln for ln in lines[1:])

    def multi_output_lines(self, op):
        """An op with several outputs: a buffer per output that is read."""
        outs = []
        for o in op.outputs:
            if o in self.present:
                self.names[o] = self.buffer(o, self.body)
            outs.append(self.names.get(o))
        self.rule_lines(op, outs)
        if self.check:
            for o, out in zip(op.outputs, outs):
                if out is not None and numerics.checked(o):
                    self.body.append(self.comp._check_line(op, out, self.arg_names(op)))

    def allocating_ufunc_line(self, op):
        """A result computed by its ufunc, which allocates it (no ``out=``)."""
        out = self.names[op] = identifier("t_" + op.name, self.taken)
        args = self.arg_names(op)
        call = f"np.{NP_UFUNCS[type(op)].__name__}({', '.join(args)})"
        self.body.append(self.comp._annotate(f"{out} = {call}", op))
        if self.check and numerics.checked(op):
            self.body.append(self.comp._check_line(op, out, args))

    def primitive_lines(self, op):
        """Any other op: its rule, into its buffer (none for a void op)."""
        out = None
        if not isinstance(op, og.VoidOp):
            out = self.names[op] = self.buffer(op, self.body)
        self.rule_lines(op, out)
        if self.check and out is not None and numerics.checked(op):
            self.body.append(self.comp._check_line(op, out, self.arg_names(op)))

    # --- the module around the lines ----------------------------------------------------
    def returns(self):
        """The expression of each result returned.

        The caller owns every array returned: a fresh buffer goes out once, itself or
        as a reshape of it (a view of all of it: no copy of a result whose axes were
        only cast or regrouped); another request for the same buffer (CSE merges equal
        results), other views, storage and feeds are copied. (``step()`` hands the same
        buffer out again: its loop copies the ys at once: ``self.step_returns``.)"""
        returns, handed, self.step_returns = [], set(), []
        for r in self.comp.results:
            base = r
            while isinstance(base, pr.Reshape):
                base = base.args[0]
            if isinstance(r, og.VoidOp):
                returns.append("None")
            elif base in self.fresh and base not in handed:
                returns.append(self.names[r])
                handed.add(base)
            else:
                returns.append(f"np.array({self.names[r]})")
            self.step_returns.append(self.names[r] if base in self.fresh else returns[-1])
        return returns

    def feed_checks(self):
        """The lines checking the feeds: arrays of the right shape and dtype pass with
        three comparisons; the rest goes through Computation._check_feed (conversion or
        a FeedError)."""
        comp, checks = self.comp, []
        if self.sym:
            checks = self.binding_lines()
        for i, p in enumerate(comp.params):
            n = self.names[p]
            if self.sym:
                if comp._copy_feeds:  # the computation assigns to a placeholder
                    checks.append(f"    {n} = {n}.copy()")
                if self.check and numerics.checked(p):
                    checks.append(f"    if not _finite({n}): _bad_feed({i}, {n})")
                continue
            checks.append(f"    if {n}.__class__ is not _ndarray or {n}.dtype is not _dt{i}"
                          f" or {n}.shape != {py_literal(p.axes.shape)}:")
            checks.append(f"        {n} = _feed({i}, {n})")
            dom = comp._domains[i]
            if dom is not None and p.axes.size:  # one or two reductions (domains.py)
                cond = domains.fast_condition(n, p.dtype, dom[0], f"_u{i}")
                checks.append(f"    elif {cond}: _bad_value({i}, {n})")
            if comp._copy_feeds:  # the computation assigns to a placeholder
                checks.append(f"    {n} = {n}.copy()")
            if self.check and numerics.checked(p):
                checks.append(f"    if not _finite({n}): _bad_feed({i}, {n})")
        return checks

    def binding_lines(self):
        """The lines of a computation with symbolic lengths that bind the symbols and
        check the feeds. Arrays of the right dtypes and shapes, whose binding was seen
        before, pass with a few comparisons and a dict look-up that gives the views of
        that binding's buffers; other calls go through ``_bind``
        (NumPyComputation._bind: conversions, FeedErrors, and a new binding's plan)."""
        comp, names = self.comp, self.names
        feeds = [names[p] for p in comp.params]
        out = [names[p] for p in comp.params] + list(self.sym) + self.setup_names()
        views = self.setup_names()
        first = {}  # symbol -> (feed name, position) that binds it on the fast path
        for i, k, sym in comp._binders:
            first.setdefault(sym, (feeds[i], k, len(comp.params[i].axes)))
        ranks = dict.fromkeys(f"{n}.__class__ is _ndarray and {n}.ndim == {r}"
                              for n, _, r in first.values())
        conds = []
        for i, p in enumerate(comp.params):
            n = feeds[i]
            conds.append(f"{n}.__class__ is _ndarray and {n}.dtype is _dt{i} and "
                         f"{n}.shape == {py_literal(p.axes.shape)}")
        key = "(" + "".join(f"{s}, " for s in self.sym) + ")"
        lines = ["    _v = None",
                 f"    if {' and '.join(ranks)}:"]
        lines += [f"        {s} = {n}.shape[{k}]" for s, (n, k, _) in first.items()]
        lines.append(f"        if {' and '.join(conds)}:")
        lines.append(f"            _v = _setups.get({key})")
        for i, p in enumerate(comp.params):
            dom = comp._domains[i]
            if dom is not None:  # one or two reductions (domains.py), if not empty
                n = feeds[i]
                cond = domains.fast_condition(n, p.dtype, dom[0], f"_u{i}")
                lines.append(f"            if {n}.size and {cond}: _bad_value({i}, {n})")
        lines.append("    if _v is None:")
        lines.append(f"        {''.join(n + ', ' for n in out)}= _bind({', '.join(feeds)})")
        if views:
            lines.append("    else:")
            lines.append(f"        {''.join(n + ', ' for n in views)}= _v")
        return lines

    def module_source(self, returns):
        """The lines of the module: a header, ``setup()`` and ``run()``."""
        comp, body, setup = self.comp, self.body, self.setup
        # The last values stay readable (Computation.value): one result as itself,
        # several as the tuple the call returns.
        if comp.single:
            body.append(f"    _r = {returns[0]}")
        else:
            body.append(f"    _r = ({', '.join(returns)},)")
        body.append("    _last[0] = _r")
        body.append("    return _r")
        params = [self.names[p] for p in comp.params]
        glob = self.setup_names()
        src = ["# geon NumPy transformer: computation of "
               + comment(", ".join(getattr(r, "name", "?") for r in comp.requested))]
        held = {}
        for o, k in self.plan.slot.items():
            held.setdefault(k, []).append(o.name)
        for k, (a, size) in enumerate(zip(self.arenas, self.plan.sizes)):
            src.append(f"# {a}: {size} bytes, holds in turn: "
                       + comment(", ".join(held.get(k, ()))))
        if self.sym:
            # setup(symbols, arenas) runs once per binding, from run's _bind
            src.append(f"# symbolic lengths {', '.join(self.sym)}: the memory plan, its "
                       f"arenas and the views below are made once per binding")
            src.append(f"def setup({''.join(n + ', ' for n in self.sym)}_a):")
            src.extend(setup)
            src.append(f"    return ({''.join(n + ', ' for n in glob)})")
        else:
            src.append("def setup():")
            if glob:
                src.append("    global " + ", ".join(glob))
            src.extend(setup or ["    pass"])
        # Computation.__call__ calls run itself: it checks that it got one value per
        # parameter, by position (Computation._check_args raises the FeedError).
        # (positional-only: a keyword named like a parameter lands in _kw too)
        src.append("def run(" + "".join(f"{n}=_nofeed, " for n in params)
                   + ("/, " if params else "") + "*_more, **_kw):")
        got = "".join(f"{n}, " for n in params)
        last = f" or {params[-1]} is _nofeed" if params else ""
        src.append(f"    if _more or _kw{last}:")
        src.append(f"        _bad_args(({got}) + _more, _kw)")
        # Calls take turns: every computation of the transformer shares its buffers.
        # (An acquire and a release around try/finally cost less than a with block.)
        # The debug mode raises NumericsError where NumPy would warn of NaN and Inf.
        src.append("    _acquire()")
        src.append("    try:")
        # the thread policy (threads.py), but not in a subgraph's computation: the call
        # that runs its loop or branch refreshed it
        comp.largest_product = blas.largest_product(self.order, (
            c.largest_product for op in self.order for c in subgraph_computations(op)))
        if not self.t.nested and any(_PARALLEL.search(ln) for ln in body):
            cap = blas.blas_threads_cap(comp.largest_product)  # 1: one BLAS thread
            src.append(f"        _threads({cap or ''})")
        body, defs = segments.split(body, params, self.kernels,  # runs of calls, from C
                                    not (self.sym or self.check or self.compiled is False))
        if self.check:
            src.append("        with _quiet():")
            src.extend("        " + ln for ln in body)
        else:
            src.extend("    " + ln for ln in body)
        src.append("    finally:")
        src.append("        _release()")
        return src + defs + self.step_source(params, returns)

    def step_source(self, params, returns):
        """A loop body's ``step()``: run() without its checks and lock, for the steps
        after a loop's first (numpy/control.py), under the lock the loop holds; not
        with symbolic lengths, value domains or the debug mode."""
        comp = self.comp
        comp._has_step = self.t.steps and not (self.sym or self.check or any(
            d is not None for d in comp._domains))
        comp._c_loop = None
        if not comp._has_step:
            return []
        copies = [f"    {n} = {n}.copy()" for n in params] if comp._copy_feeds else []
        back = ", ".join(self.step_returns) + ("" if comp.single else ",")
        src = [f"def step({', '.join(params)}):"] + copies + self.core + [
            f"    return {back}"]
        actions = c_scan.plan(self)   # the step in C where it can be (c_scan.py)
        if actions:
            trace, names, copied = c_scan.trace_source(actions, params, self.core,
                                                       self.step_returns)
            comp._c_loop = c_scan.Loop(comp, actions, names, copied)
            src += trace
        return src

    def setup_names(self):
        """The names that setup() assigns."""
        return [ln.split(" = ")[0].strip() for ln in self.setup]

    # --- helpers of the lines: buffers, bias adds, fused groups ----------------------
    def _ufunc_allocates(self, op):
        """Whether result ``op`` is best computed by its ufunc without ``out=`` (NumPy
        allocates it: no call of ``np.empty``), where that array is exactly what
        ``np.empty`` would give: one axis (a new 1-d array is contiguous), the op's
        shape (no operand broadcast to it) and dtype (the ufunc's own loop)."""
        fresh, zero_d = self.fresh, self.zero_d
        ufunc = NP_UFUNCS.get(type(op))
        if ufunc is None or op not in fresh or op in self._into or len(op.axes) != 1 \
                or NUMPY_CODE.find(op) is not _UFUNC_RULES.get(type(op)):
            return False
        if _loop(op) or (op.dtype.kind in "iub"
                         and any(a.dtype != op.dtype for a in op.args)):
            return False  # a dtype= or casting= the rule would add
        shapes = [() if a in zero_d else a.axes.shape for a in op.args]
        try:
            if np.broadcast_shapes(*shapes) != op.axes.shape:
                return False
            dtypes = ufunc.resolve_dtypes(tuple(a.dtype for a in op.args) + (None,))
        except (ValueError, TypeError, AttributeError):
            return False
        return dtypes[-1] == op.dtype

    def buffer(self, op, body):
        """The name of ``op``'s buffer. A planned value is a view of its arena, made
        once in setup() and shared by every value of that arena with the same shape
        and dtype; a result is a new array each call (a line added to ``body``)."""
        plan, arenas, setup, taken = self.plan, self.arenas, self.setup, self.taken
        shape, dtype = op.axes.shape, op.dtype
        storage = self._into.get(op)
        if storage is not None:  # computed in place of the variable it is assigned to
            return self.names[storage]
        if op in plan.slot and self.sym:
            # its view of the arena the binding's plan gives it (_a[k]), made by setup()
            name = identifier(f"b_{op.name}", taken)
            k = len(self.planned)
            self.planned.append(op)
            nbytes = py_literal(op.axes.size * dtype.itemsize)
            setup.append(f"    {name} = _a[{k}][:{nbytes}].view(np.{dtype.name})"
                         f".reshape({py_literal(shape)})")
            return name
        if op in plan.slot:
            key = (plan.slot[op], shape, dtype)
            name = self._arena_views.get(key)
            if name is None:
                arena = arenas[plan.slot[op]]
                name = self._arena_views[key] = identifier(f"{arena}_{dtype.name}", taken)
                setup.append(f"    {name} = {arena}[:{op.axes.size * dtype.itemsize}]"
                             f".view(np.{dtype.name}).reshape({py_literal(shape)})")
            return name
        assert op in self.fresh, op
        name = identifier("t_" + op.name, taken)
        # np.empty with a dtype object bound in the module's globals: a call of a few
        # elements spends much of its time here otherwise (attribute look-ups and the
        # conversion of the scalar type)
        known = self.comp._result_dtypes
        dt = known.setdefault(np.dtype(dtype), f"_rdt{len(known)}")
        body.append(f"    {name} = _empty({py_literal(shape)}, {dt})  # {dtype.name}")
        return name

    def _group_code(self, g):
        """A fused group: a nested function running the members over a range of rows a
        block at a time (internal values in per-thread scratch), on threads if large."""
        names, arg_names, plan, taken = self.names, self.arg_names, self.plan, self.taken
        lines = []
        members = g.members
        for m in members:
            if m not in g.internal:
                names[m] = self.buffer(m, lines)
        bias = self.bias_adds.get(g)   # (gemm, v): the first member is gemm + v
        if bias is not None:
            gemm, v = bias
            a, b, c, v = (names[x] for x in gemm.args + (gemm, v))
            lines.append(self.comp._annotate(f"if not _gemm_add({a}, {b}, {c}, {v}):  # else:",
                                        gemm))
            lines.append(f"        np.matmul({a}, {b}, out={c})")
            lines.append(self.comp._annotate(f"    np.add({c}, {v}, {c})", members[0]))
        B, rows = g.rows_per_block, g.rows
        fn = identifier("fused", taken)
        body = [f"        _j = min(_i + {B}, _hi)"]
        local = {}
        for m in members:
            args = m.args[:1] if isinstance(m, pr.Gemm) else m.args
            if bias is not None and m is members[0]:
                args = (bias[0],)   # the sum is the product's buffer
            for a in args:
                if a in local or a in g.internal or a in members:
                    continue
                if isinstance(a, og.Constant) and a.scalar is not None:
                    continue
                local[a] = identifier("b_" + names[a], taken)
                body.append(f"        {local[a]} = {names[a]}[_i:_j]")
        last = _last_readers(g)
        free, temp_of, temps = [], {}, []
        on_block = set()  # internal members computed over the block of a dying arg
        for k, m in enumerate(members):
            if k == 0 and bias is not None:   # computed by the BLAS call above
                on_block.add(m)
                local[m] = local[bias[0]]
                continue
            over = None
            if m in g.internal and isinstance(m, og.ElementWise):
                over = self._block_over(g, k, last, plan)
                if over is None:  # or over an internal arg computed so, dying here
                    over = next((a for a in dict.fromkeys(m.args) if a in on_block
                                 and last[a] == k and a.dtype == m.dtype), None)
            if over is not None:  # written over its arg's block: no scratch
                on_block.add(m)
                out = local[m] = local[over]
                code = NUMPY_CODE.find(m)(m, out, arg_names(m, local, B))
                body.append("    " + self.comp._annotate(code[0], m))
                body.extend("        " + ln for ln in code[1:])
                continue
            if m in g.internal:
                tmp = None
                for a in m.args:  # in place over an internal arg that dies here
                    if a in temp_of and last[a] == k and temps[temp_of[a]][1] == m.dtype:
                        tmp = temp_of[a]
                        break
                if tmp is None:
                    same = [f for f in free if temps[f][1] == m.dtype]
                    if same:
                        tmp = same[0]
                        free.remove(tmp)
                    else:
                        tmp = len(temps)
                        temps.append(((B,) + m.axes.shape[1:], m.dtype))
                temp_of[m] = tmp
                out = identifier("b_" + m.name, taken)
                body.append(f"        {out} = _s{tmp}[:_j - _i]")
            else:
                out = identifier("b_" + names[m], taken)
                body.append(f"        {out} = {names[m]}[_i:_j]")
            local[m] = out
            args = arg_names(m, local, B)
            if isinstance(m, pr.Gemm):  # a block of rows of its first operand, all the second
                args = [local[m.args[0]], names[m.args[1]]]
            code = NUMPY_CODE.find(m)(m, out, args)
            body.append("    " + self.comp._annotate(code[0], m))
            body.extend("        " + ln for ln in code[1:])
            for a in dict.fromkeys(m.args):
                if a in temp_of and last[a] == k and temp_of[a] != temp_of.get(m):
                    free.append(temp_of[a])
        sets = identifier("scratch", taken)
        threads = fusion.threads_for(g, self.hints if self.sym else None)
        self.scratch[sets] = (threads, temps)
        head = "a matrix product and " if isinstance(members[0], pr.Gemm) else ""
        tails = sum(isinstance(m, pr.ReducePrim) for m in members)
        tail = f" and {tails} reduction(s) of their rows" if tails else ""
        ops = len(members) - bool(head) - tails - (bias is not None)
        fused = [f"    # fused: {head}{ops} elementwise ops"
                 f"{tail} ({len(g.internal) - (bias is not None)} without "
                 f"a full buffer) in blocks of {B} rows, on {threads} thread(s)"
                 + (" after the bias add above" if bias is not None else "")]
        params = "".join(f", _s{k}" for k in range(len(temps)))
        fused.append(f"    def {fn}(_lo, _hi{params}):")
        fused.append(f"        for _i in range(_lo, _hi, {B}):")
        fused.extend("    " + ln for ln in body)
        fused.append(f"    _run_blocks({fn}, {rows}, {B}, {sets})")
        acc = _accumulation(g, names)
        if acc is None:
            return lines + fused
        # w + alpha * (a @ b) in one BLAS call where it can (blas.py), else the blocks
        a, b, w, alpha = acc
        lines.append(f"    if not _gemm_acc({a}, {b}, {w}, {alpha!r}):  # else:")
        return lines + ["    " + ln for ln in fused]

    def _block_over(self, g, k, last, plan):
        """The arg of internal member ``k`` of group ``g`` whose blocks it may be written
        over (so it needs no scratch), or None: a planned value of its shape and dtype,
        read by the group's members only directly and by member ``k`` last, and by
        nothing after the group. Each block of it is then read (up to member ``k``) and
        overwritten by the same call on that block, whatever the order of blocks."""
        m = g.members[k]
        end = self._step[g.members[-1]]
        for a in dict.fromkeys(m.args):
            if a not in plan.slot or a in g.members or last.get(a) != k \
                    or a.dtype != m.dtype or a.axes.lengths != m.axes.lengths \
                    or self._last_read.get(a, end + 1) > end:
                continue
            if any(b is not a and self._root.get(b) is a
                   for op in g.members for b in op.args):
                continue  # read through a view somewhere in the group
            return a
        return None
