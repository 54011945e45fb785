"""The NumPy transformer: lowered graphs become Python source calling NumPy.

Each computation becomes a small module with two functions:

- ``setup()`` runs once after allocation and makes the views of buffers whose address
  never changes (variables, constants, intermediate buffers);
- ``run(p0, p1, ...)`` takes the placeholder arrays and executes one line per
  primitive, writing into buffers the transformer owns (``out=``), each line commented
  with the op it implements and the user's source line.

``NUMPY_CODE`` maps each base-set class to a function ``fn(op, out, args)`` that
returns the lines computing ``op`` into the buffer named ``out`` from the names in
``args``. ``out`` may be the buffer of an arg (the memory planner works in place), so
only the first line may read the args; later lines read and write ``out`` alone.
"""

import functools
import linecache
import re
import weakref
from typing import IO, Iterable, Optional, Union

import numpy as np

from geon.op_graph import collectives as coll
from geon.op_graph import domains
from geon.op_graph import op_graph as og
from geon.op_graph import primitives as pr
from geon.op_graph import schemas as sc
from geon.op_graph import special
from geon.op_graph.autodiff import find_rule
from geon.op_graph.np_ops import Select
from geon.op_graph.user_ops import USER_OPS, UserOp
from geon.op_graph.ordering import schedule
from geon.op_graph.reference import NP_UFUNCS, op_site, sigmoid_ce
from geon.op_graph.tables import OpTable
from geon.transformers import memory
from geon.transformers.base import (STANDARD_BASE_SET, Computation, Transformer,
                                    register_transformer)
from geon.transformers.codegen_text import check_lines, comment, identifier, py_literal
from geon.transformers import fusion, numerics
from geon.transformers import threads as thread_policy
from geon.transformers.numpy import blas
from geon.transformers.numpy import compiled as compiled_kernels
from geon.transformers.fusion import find_groups

NUMPY_CODE = OpTable("NUMPY_CODE", "fn(op, out, args) -> [source lines]")
#: Decorator: ``@numpy_code(Cls, ...)`` registers ``fn(op, out, args) -> [lines]``.
numpy_code = NUMPY_CODE.register
#: Generated lines that run work on several threads (the BLAS's or geon's): a call of
#: a computation with one first asks the thread policy how many to use (threads.py).
_PARALLEL = re.compile(r"\b(?:np\.matmul|_run_blocks|_gemm_\w+|_conv_\w+)\(")
#: Names every generated module can use besides ``np`` (and each user op's NumPy
#: function, see :func:`_user_op`).
NUMPY_GLOBALS = {}

#: Ufunc ops that read a one-number constant as a row of it (the last axis of their
#: result, broadcast over the others) where that row has ``ROW_LENGTHS[0]`` to
#: ``ROW_LENGTHS[1]`` elements: NumPy 2.4 runs np.maximum and np.minimum of an array and a
#: 0-d array or scalar at half the speed of two contiguous operands (ReLU on 128 x 1024
#: float32: 106 us against 52 us with a row of zeros; 16 x 8192: 106 against 36; in
#: place on a block of 131,072: 105 against 24). Its arithmetic ufuncs are faster with
#: the scalar, and keep it. In a fused group, a 1-d op's block reads a slice of the
#: row; the sigmoid's clamp gets its row at run time (:func:`_row`).
ROW_OPERAND = frozenset({og.Maximum, og.Minimum})
ROW_LENGTHS = (16, 131072)
_ROWS = {}  # (value, dtype) -> a read-only row of that value (see _shared_row)


def _constant_row(value, dtype, n):
    """A read-only array of ``n`` elements ``value`` of ``dtype``."""
    row = np.full(n, value, dtype)
    row.setflags(write=False)
    return row


def _shared_row(value, dtype, n):
    """A read-only row of at least ``n`` elements ``value`` of ``dtype``, one per value
    and dtype, made longer when a longer one is asked for."""
    key = (value, dtype)
    row = _ROWS.get(key)
    if row is None or row.size < n:
        row = _ROWS[key] = _constant_row(value, dtype, n)
    return row


def _row(value, like):
    """``value`` as a row of ``like``'s last axis (see ROW_OPERAND), or itself where
    that axis has too few or too many elements."""
    n = like.shape[-1] if like.ndim else 0
    if not ROW_LENGTHS[0] <= n <= ROW_LENGTHS[1]:
        return value
    return _shared_row(value, like.dtype, ROW_LENGTHS[1])[:n]


NUMPY_GLOBALS["_row"] = _row


def _loop(op):
    """``, dtype=...`` making a ufunc compute in ``op``'s compute dtype, where NumPy
    would otherwise pick a loop of the operands' dtypes (integer or float16 arithmetic
    for a float result) and convert after; empty where the loops agree (comparisons:
    NumPy promotes their operands as :meth:`compute_dtype` says, and ``dtype=`` would
    name the bool result)."""
    ct = op.compute_dtype()
    if op.dtype.kind in "fc" and not isinstance(op, og.Comparison):
        for a in op.args:  # (a loop, not any(): this runs for every op emitted)
            if a.dtype is not ct and a.dtype != ct:
                return f", dtype=np.{ct.name}"
    return ""


def _ufunc_code(name):
    def code(op, out, args):
        # An integer result with an operand of another dtype (e.g. a weak float32 constant
        # such as the 1 in ``i + 1``): compute in the promoted type and cast back, as the
        # reference evaluator does ('same_kind' would refuse float64 -> int64).
        cast = ", casting='unsafe'" if op.dtype.kind in "iub" and any(
            a.dtype != op.dtype for a in op.args) else ""
        out_arg = f"out={out}" if name in _KEYWORD_OUT else out
        return [f"np.{name}({', '.join(args)}, {out_arg}{_loop(op)}{cast})"]
    return code


#: Ufuncs given ``out=`` as a keyword. The others get it positionally: NumPy 2.4 then
#: parses the call about 40 ns quicker (16 float32: np.add 476 ns against 802), and
#: Python compiles the line faster (a 5,000-op chain's function: 63 ms against 80).
#: np.maximum and np.minimum are the other way round: 3-4x slower with a positional
#: ``out`` (1.77 us against 0.55 on 16 float32, 3.2 against 0.95 on 1,000).
_KEYWORD_OUT = frozenset({"maximum", "minimum"})


#: class -> its ufunc rule (NumPyComputation._ufunc_allocates checks that a class still
#: has it)
_UFUNC_RULES = {}
for _cls, _fn in NP_UFUNCS.items():
    NUMPY_CODE[_cls] = _UFUNC_RULES[_cls] = _ufunc_code(_fn.__name__)


@numpy_code(Select)
def _select(op, out, args):
    c, a, b = args
    return [f"np.copyto({out}, np.where({c}, {a}, {b}), casting='unsafe')"]


#: user op class -> the name generated code calls its NumPy function by
_USER_FUNCTIONS = {}


def _user_function(cls):
    """The name generated code calls user op ``cls``'s NumPy function by: an ASCII
    identifier, unique among the generated modules' globals (two user ops whose names
    Python would read as one, such as ``fi`` and its ligature, get two names)."""
    name = _USER_FUNCTIONS.get(cls)
    if name is None:
        taken = set(NUMPY_GLOBALS) | set(_USER_FUNCTIONS.values())
        name = _USER_FUNCTIONS[cls] = identifier("user_" + cls.registry_key, taken)
    return name


@numpy_code(UserOp)
def _user_op(op, out, args):
    # every user op (geon.define_op) carries its NumPy function: one rule serves them all
    kw = "".join(f", {k}={py_literal(v)}" for k, v in op.params.items())
    call = f"{_user_function(type(op))}({', '.join(args)}{kw})"
    return [f"np.copyto({out}, {call}, casting='unsafe')"]


def _module_globals():
    """What the generated modules see besides ``np``: :data:`NUMPY_GLOBALS` and the
    user ops' NumPy functions."""
    names = dict(NUMPY_GLOBALS)
    names.update((_user_function(c), c.numpy_impl) for c in USER_OPS.values())
    return names


#: A sigmoid of at least this many elements skips the clamp and lets ``exp`` overflow
#: to inf, with NumPy's overflow warning off for that one call (1 / (1 + inf) = 0): an
#: errstate costs about 1.4 us, the clamp 0.7 cycles per element (one ufunc of the
#: five, on a block of 131,072 float32 in cache), so the clamp is cheaper only below a
#: few thousand elements.
SIGMOID_UNCLAMPED = 8192


@numpy_code(og.Sigmoid)
def _sigmoid(op, out, args):
    # 1 / (1 + exp(-x)), with no overflow warning: -x is clipped below exp's overflow
    # (small arrays) or exp's overflow warning is off (large ones, see SIGMOID_UNCLAMPED);
    # the two differ only where the result is subnormal.
    x, = args
    first = f"np.negative({x}, out={out}{_loop(op)})"
    rest = [f"np.add({out}, 1, out={out})", f"np.reciprocal({out}, out={out})"]
    # float16 never clamps: its clamp would be 11, and sigmoid(-20) 1.7e-5 instead of 0
    if op.axes.size >= SIGMOID_UNCLAMPED or op.dtype.itemsize < 4:
        return [first, "with _overflow_ok():", f"    np.exp({out}, out={out})"] + rest
    limit = compiled_kernels.sigmoid_limit(op.dtype)
    return [first, f"np.minimum({out}, _row({limit}, {out}), out={out})",
            f"np.exp({out}, out={out})"] + rest


NUMPY_GLOBALS["_overflow_ok"] = functools.partial(np.errstate, over="ignore")


@numpy_code(og.Erf)
def _erf(op, out, args):
    return [f"_erf({args[0]}, out={out})"]


NUMPY_GLOBALS["_erf"] = special.erf


@numpy_code(og.Softplus)
def _softplus(op, out, args):
    return [f"np.logaddexp({args[0]}, 0, out={out})"]  # max(x, 0) + log1p(exp(-|x|))


@numpy_code(sc.SigmoidCrossEntropy)
def _sigmoid_ce(op, out, args):
    # one line, because the memory planner may give ``out`` the buffer of x or t (in
    # place); the reference's function, which never forms inf - inf or 0 * inf
    return [f"np.copyto({out}, _sigmoid_ce({', '.join(args)}), casting='unsafe')"]


NUMPY_GLOBALS["_sigmoid_ce"] = sigmoid_ce


@numpy_code(pr.Gemm)
def _gemm(op, out, args):
    return [f"np.matmul({args[0]}, {args[1]}, out={out})"]


NUMPY_GLOBALS["_gemm_acc"] = blas.accumulate
NUMPY_GLOBALS["_gemm_add"] = blas.add_product
_BLAS_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


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


#: The NumPy call of each reduction: the ufunc's own ``reduce`` where there is one (what
#: np.sum, np.prod, np.max and np.min call, less about 2 us of Python around it)
_REDUCE_FN = {pr.ReduceSum: "add.reduce", pr.ReduceProd: "multiply.reduce",
              pr.ReduceMax: "maximum.reduce", pr.ReduceMin: "minimum.reduce",
              pr.ReduceArgMax: "argmax", pr.ReduceArgMin: "argmin"}


#: Sums of float32 / float64 matrices of at least ONES_MIN elements, over at most
#: ONES_LENGTH elements per result, are a product with a row of ones (see _reduce).
ONES_LENGTH = 4096
ONES_MIN = 64


def _ones(dtype, n):
    """The name of a read-only row of at least ``n`` ones of ``dtype`` among the
    generated code's globals (made, or made longer, here)."""
    name = f"_ones_{dtype.name}"
    NUMPY_GLOBALS[name] = _shared_row(1, dtype, max(n, ONES_LENGTH))
    return name


@numpy_code(*_REDUCE_FN)
def _reduce(op, out, args):
    x = op.args[0]
    n = x.axes.lengths[op.axis] if x.axes else 0
    if type(op) is pr.ReduceSum and len(x.axes) == 2 and 1 <= n <= ONES_LENGTH \
            and x.axes.size >= ONES_MIN and x.dtype == op.dtype \
            and op.dtype in _BLAS_DTYPES:
        # NumPy's pairwise sum along rows runs about 4x slower than the BLAS's
        # matrix-vector product with a row of ones (on a few elements NumPy's call is
        # the quicker, by a fraction of a microsecond)
        ones = f"{_ones(op.dtype, n)}[:{n}]"
        pair = (args[0], ones) if op.axis == 1 else (ones, args[0])
        return [f"np.matmul({pair[0]}, {pair[1]}, out={out})"]
    return [f"np.{_REDUCE_FN[type(op)]}({args[0]}, axis={py_literal(op.axis)}, out={out})"]


@numpy_code(pr.ReduceMaxArgMax)
def _reduce_max_argmax(op, outs, args):
    # A multi-output op gets one buffer name per output (None: nobody reads it).
    x, = args
    lines = []
    if outs[0] is not None:
        lines.append(f"np.max({x}, axis={py_literal(op.axis)}, out={outs[0]})")
    if outs[1] is not None:
        lines.append(f"np.argmax({x}, axis={py_literal(op.axis)}, out={outs[1]})")
    return lines


@numpy_code(pr.Copy)
def _copy(op, out, args):
    return [f"np.copyto({out}, {args[0]})"]


@numpy_code(pr.Unslice)
def _unslice(op, out, args):
    return [f"{out}.fill(0)", f"{out}[{py_literal(op.key)}] = {args[0]}"]


@numpy_code(pr.Take)
def _take(op, out, args):
    return [f"_take({args[0]}, {args[1]}, {op_site(op)!r}, out={out})"]


@numpy_code(pr.PutAdd)
def _put_add(op, out, args):
    return [f"_put_add({args[0]}, {args[1]}, {out}, {op_site(op)!r})"]


NUMPY_GLOBALS.update(_take=special.take, _put_add=special.put_add)


@numpy_code(pr.PrefixSum)
def _prefix_sum(op, out, args):
    return [f"np.cumsum({args[0]}, axis=1, out={out})"]


@numpy_code(pr.SortPrim)
def _sort(op, outs, args):
    return [f"_sort({args[0]}, {outs[0]}, {outs[1]})"]


NUMPY_GLOBALS["_sort"] = special.sort_rows


@numpy_code(pr.Assign)
def _assign(op, out, args):
    t, v = args
    return [f"np.copyto({t}, {v})"]


@numpy_code(coll.AllReduce)
def _allreduce(op, out, args):
    # on the planned buffers: ``out`` is ``x`` when the plan works in place
    return [f"_allreduce({args[0]}, {out}, {op.reduce == 'mean'})"]


@numpy_code(coll.BroadcastFrom)
def _broadcast_from(op, out, args):
    return [f"_broadcast_from({args[0]}, {out}, {op.root})"]


@numpy_code(coll.FlatConcat)
def _flat_concat(op, out, args):
    flat = ", ".join(f"{a}.reshape(-1)" for a in args)
    return [f"np.concatenate(({flat},), out={out})"]


def _run_allreduce(x, out, mean):
    coll.collectives().allreduce(x, out, mean)


def _run_broadcast(x, out, root):
    if out is not x:
        np.copyto(out, x)
    coll.collectives().broadcast(out, root)


# looked up at each call: geon.distributed.init() may install MPI after compiling
NUMPY_GLOBALS.update(_allreduce=_run_allreduce, _broadcast_from=_run_broadcast)


# Views are expressions: fn(op, arg) -> expression text.
NUMPY_VIEWS = {
    pr.Dimshuffle: lambda op, x: f"{x}.transpose({py_literal(op.perm)})",
    pr.Reshape: lambda op, x: f"{x}.reshape({py_literal(op.axes.shape)})",
    pr.Expand: lambda op, x: "np.broadcast_to({}.reshape({}), {})".format(
        x, py_literal(tuple(1 if m is None else op.args[0].axes.shape[m]
                            for m in op.dim_map)), py_literal(op.axes.shape)),
    # "..." keeps the result a view when every entry is an index (x[0] would be a copy)
    pr.SliceView: lambda op, x: f"{x}[{py_literal(op.key + (Ellipsis,))}]",
}


class NumPyComputation(Computation):
    """A computation compiled to NumPy calls (see the module docstring)."""

    def __init__(self, transformer, results, params):
        super().__init__(transformer, results, params)
        self._fn = None
        mode = getattr(transformer, "compiled", False)
        auto = mode == compiled_kernels.AUTO
        if auto and compiled_kernels.auto_unavailable():
            mode = False
        if mode:
            try:
                self._generate(compiled=mode)
                return
            except compiled_kernels.CompileError as e:  # the NumPy code instead
                if not auto or e.key not in compiled_kernels.UNAVAILABLE:
                    compiled_kernels.warn_once(e.key,
                                               f"{e}; running the NumPy code instead")
                if auto:
                    compiled_kernels.auto_failed(e)
        self._generate()

    def _generate(self, compiled=False):
        t = self.transformer
        # The module's own names; those it makes itself begin with an underscore, which
        # names made from the graph's text never do (codegen_text.identifier).
        taken = {"np", "setup", "run"}
        taken.update(_module_globals())
        names, consts, variables, scratch = {}, {}, {}, {}
        scalars, zero_d = {}, {}
        self._result_dtypes = {}  # dtype of a result -> its name in the module
        setup, body = [], []
        for p in self.params:
            names[p] = identifier(p.name, taken)
        self._copy_feeds = any(isinstance(op, pr.Assign) and isinstance(op.args[0],
                                                                        og.Placeholder)
                               for op in self.ops)
        order = schedule(self.graph.roots)
        self._into = {}
        # The numerics debug mode checks each primitive's value right after it is
        # computed, and then looks at its inputs: nothing is computed in place (no
        # buffer sharing, nothing computed into a variable's storage), and no ops are
        # fused (a fused group runs the same NumPy calls on blocks of rows, so its ops
        # compute the same values one by one, and the first to go wrong can be named).
        check = self._check_numerics = t.check_numerics
        self._checks = []  # the op of each check, by index
        if "memory" not in t.disabled and not check:
            # an update such as ``w - lr * g`` is written straight into ``w``
            order, self._into = memory.assign_in_place(order, self.results)
        root = memory.value_roots(order)
        # Results get a new array each call (handed to the caller); views of them and
        # of the fed arrays must be made per call, the rest once in setup().
        fresh = {root.get(r, r) for r in self.results}
        fresh = {r for r in fresh if memory.is_producer(r)}
        dynamic = set(self.params) | fresh
        for op in order:
            if isinstance(op, pr.ViewOp) and op.args[0] in dynamic:
                dynamic.add(op)

        def emits(op):
            return not isinstance(op, (og.AssignableTensorOp, og.Output)) and (
                not isinstance(op, pr.ViewOp) or op in dynamic)

        # The compiled path (compiled.py) also fuses smaller groups it can compile (of
        # any size with compiled=True, from AUTO_MIN_ELEMENTS with "auto"). The
        # gradient product of an update ``w - lr * G`` computed into ``w`` runs block by
        # block in its group: G never exists in full, and w is touched once.
        kernels = compiled_kernels.Kernels() if compiled and not check else None
        groups = [] if "fusion" in t.disabled or check else find_groups(
            order, self.results, emits,
            None if kernels is None else compiled_kernels.auto_fusable
            if compiled == compiled_kernels.AUTO else compiled_kernels.fusable,
            kernels and compiled_kernels.MAX_MEMBERS,
            gemm_head=(lambda g, run: run[-1] in self._into) if fusion.GEMM_HEADS else None,
            reductions=True if kernels is None else compiled_kernels.row_sum)
        if kernels is not None and compiled == compiled_kernels.AUTO:
            # below the NumPy code's own threshold, a group is only worth it as C
            scalar_consts = {op for op in order
                             if isinstance(op, og.Constant) and op.scalar is not None}
            groups = [g for g in groups if g.members[0].axes.size >= fusion.MIN_ELEMENTS
                      or kernels.compilable(g, scalar_consts)]
        for g in groups:  # blocked groups read views at other places than they write
            seen = fusion.view_reads(g, root)
            for m in g.members:
                if self._into.get(m) in seen:
                    del self._into[m]
        if "memory" in t.disabled or check:  # checked: each input kept to be shown
            plan = memory.unshared_plan(order, self.results, groups)
        else:
            plan = memory.plan_memory(order, self.results, groups=groups,
                                      exclude=self._into)
        if memory.VERIFY:  # every plan is proved before code is made from it
            memory.verify_plan(order, self.results, plan, groups)
        # The schedule the plan is for (the memory-plan figure of the guide reads it).
        self.plan, self.groups, self.order = plan, groups, order
        self._root, self._last_read, self._step = root, {}, {}
        self._readers = {}   # op -> how many ops read it directly (an op reading it
        # twice counts twice)
        for i, op in enumerate(order):  # the last step reading each value, for groups
            self._step[op] = i
            for a in op.args:
                self._last_read[root.get(a, a)] = i
                self._readers[a] = self._readers.get(a, 0) + 1
        first = {g.members[0]: g for g in groups}
        in_group = {m for g in groups for m in g.members}
        arenas = [identifier(f"arena{k}", taken) for k in range(len(plan.sizes))]
        self._arena_views = {}
        self._names = names

        rows = {}  # (scalar constant, length) -> the name of a row of its value

        def row(c, n):
            name = rows.get((c, n))
            if name is None:
                name = rows[c, n] = identifier(f"r_{c.name}_{n}", taken)
                consts[name] = _constant_row(c.value, c.dtype, n)
            return name

        def arg_names(op, local=None, block=None):
            """The names of ``op``'s args; ``local``: of their blocks in a fused group
            of ``block`` rows per block."""
            local = local or {}
            if not isinstance(op, og.ElementWise):
                return [local.get(a) or names[a] for a in op.args]
            # a ufunc reads a one-number constant faster from a 0-d array than from a
            # NumPy scalar (same dtype, same result)
            small = zero_d if type(op) in NP_UFUNCS else scalars
            if type(op) in ROW_OPERAND and op.axes:
                n = op.axes.lengths[-1]
                cut = ""
                if block is not None and len(op.axes) == 1:  # rows are elements
                    n, cut = min(n, block), "[:_j - _i]"
                if ROW_LENGTHS[0] <= n <= ROW_LENGTHS[1]:
                    return [local.get(a) or (row(a, n) + cut if a in zero_d else names[a])
                            for a in op.args]
            return [local.get(a) or small.get(a) or names[a] for a in op.args]

        present = set(order)
        for op in order:  # storage first: a fused group reads ahead in the order
            if op in names:
                continue
            if isinstance(op, og.Variable):
                names[op] = identifier(op.name, taken)
                variables[names[op]] = op
            elif isinstance(op, og.Constant):
                names[op] = identifier("c_" + op.name, taken)
                consts[names[op]] = op.array()
                if op.scalar is not None:
                    scalars[op] = identifier("s_" + op.name, taken)
                    consts[scalars[op]] = op.value[()]
                    # the 0-d array itself (a ufunc reads it faster than a NumPy scalar):
                    # the constant's own name where its value has its shape
                    if op.value.shape == op.axes.shape:
                        zero_d[op] = names[op]
                    else:
                        zero_d[op] = identifier("z_" + op.name, taken)
                        consts[zero_d[op]] = op.value

        def name_view(op):  # a view made once, named ahead of its place in the order
            if op not in names and isinstance(op, pr.ViewOp) and op not in dynamic:
                name_view(op.args[0])
                names[op] = identifier("v_" + op.name, taken)
                line = f"{names[op]} = {NUMPY_VIEWS[type(op)](op, names[op.args[0]])}"
                setup.append(self._annotate(line, op))

        # groups that start by adding a bias to a GEMM: the two in one BLAS call
        self._bias_adds = {}
        for g in groups:
            if not (kernels and kernels.compilable(g, scalars)):
                found = self._bias_add(g, order, emits, plan)
                if found is not None:
                    self._bias_adds[g] = found
        bias_gemms = {gemm for gemm, _ in self._bias_adds.values()}
        for op in order:
            if op in names:
                continue
            if isinstance(op, pr.ViewOp):
                names[op] = identifier("v_" + op.name, taken)
                line = f"{names[op]} = {NUMPY_VIEWS[type(op)](op, names[op.args[0]])}"
                (body if op in dynamic else setup).append(self._annotate(line, op))
            elif op in first:
                g = first[op]
                for m in g.members:
                    for a in m.args:
                        name_view(a)
                if kernels and kernels.compilable(g, scalars):
                    body.extend(kernels.group_code(
                        g, names, scalars, consts, dynamic, lambda m, lines: self._buffer(
                            m, plan, arenas, setup, lines, fresh, taken), taken))
                else:
                    body.extend(self._group_code(g, names, arg_names, plan, arenas,
                                                 setup, fresh, scratch, taken))
            elif op in in_group or isinstance(op, og.Output):
                continue  # emitted with its group / by its multi-output op
            elif isinstance(op, og.MultiOutput):
                outs = []
                for o in op.outputs:
                    if o in present:
                        names[o] = self._buffer(o, plan, arenas, setup, body, fresh, taken)
                    outs.append(names.get(o))
                lines = find_rule(NUMPY_CODE, op)(op, outs, arg_names(op))
                body.append(self._annotate(lines[0], op))
                body.extend("    " + ln for ln in lines[1:])
                if check:
                    for o, out in zip(op.outputs, outs):
                        if out is not None and numerics.checked(o):
                            body.append(self._check_line(op, out, arg_names(op)))
            elif op in bias_gemms:  # emitted by its group (_group_code)
                names[op] = self._buffer(op, plan, arenas, setup, body, fresh, taken)
            elif isinstance(op, pr.Assign) and op.args[1] in self._into:
                body.append(f"    # {comment(op.name)}: its value was computed in "
                            f"{names[op.args[0]]}")
            elif self._ufunc_allocates(op, fresh, zero_d):
                out = names[op] = identifier("t_" + op.name, taken)
                call = f"np.{NP_UFUNCS[type(op)].__name__}({', '.join(arg_names(op))})"
                body.append(self._annotate(f"{out} = {call}", op))
                if check and numerics.checked(op):
                    body.append(self._check_line(op, out, arg_names(op)))
            else:
                out = None
                if not isinstance(op, og.VoidOp):
                    out = names[op] = self._buffer(op, plan, arenas, setup, body, fresh,
                                                   taken)
                lines = find_rule(NUMPY_CODE, op)(op, out, arg_names(op))
                body.append(self._annotate(lines[0], op))
                body.extend("    " + ln for ln in lines[1:])
                if check and out is not None and numerics.checked(op):
                    body.append(self._check_line(op, out, arg_names(op)))
        # The caller owns every array returned: a fresh buffer goes out once, itself or
        # as a reshape of it (a view of all of it: no copy of a result whose axes were
        # only cast or regrouped); another request for the same buffer (CSE merges equal
        # results), other views, storage and feeds are copied.
        returns, handed = [], set()
        for r in self.results:
            base = r
            while isinstance(base, pr.Reshape):
                base = base.args[0]
            if isinstance(r, og.VoidOp):
                returns.append("None")
            elif base in fresh and base not in handed:
                returns.append(names[r])
                handed.add(base)
            else:
                returns.append(f"np.array({names[r]})")
        # Feeds: arrays of the right shape and dtype pass with three comparisons; the
        # rest goes through Computation._check_feed (conversion or a FeedError).
        checks = []
        for i, p in enumerate(self.params):
            n = names[p]
            checks.append(f"    if {n}.__class__ is not _ndarray or {n}.dtype is not _dt{i}"
                          f" or {n}.shape != {py_literal(p.axes.shape)}:")
            checks.append(f"        {n} = _feed({i}, {n})")
            dom = self._domains[i]
            if dom is not None and p.axes.size:  # one or two reductions (domains.py)
                cond = domains.fast_condition(n, p.dtype, dom[0], f"_u{i}")
                checks.append(f"    elif {cond}: _bad_value({i}, {n})")
            if self._copy_feeds:  # the computation assigns to a placeholder
                checks.append(f"    {n} = {n}.copy()")
            if check and numerics.checked(p):
                checks.append(f"    if not _finite({n}): _bad_feed({i}, {n})")
        body[:0] = checks
        # The last values stay readable (Computation.value): one result as itself,
        # several as the tuple the call returns.
        if self.single:
            body.append(f"    _r = {returns[0]}")
        else:
            body.append(f"    _r = ({', '.join(returns)},)")
        body.append("    _last[0] = _r")
        body.append("    return _r")
        params = [names[p] for p in self.params]
        glob = [ln.split(" = ")[0].strip() for ln in setup]
        src = ["# geon NumPy transformer: computation of "
               + comment(", ".join(getattr(r, "name", "?") for r in self.requested))]
        held = {}
        for o, k in plan.slot.items():
            held.setdefault(k, []).append(o.name)
        for k, (a, size) in enumerate(zip(arenas, plan.sizes)):
            src.append(f"# {a}: {size} bytes, holds in turn: "
                       + comment(", ".join(held.get(k, ()))))
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
        if any(_PARALLEL.search(ln) for ln in body):  # the thread policy (threads.py)
            src.append("        _threads()")
        if check:
            src.append("        with _quiet():")
            src.extend("        " + ln for ln in body)
        else:
            src.extend("    " + ln for ln in body)
        src.append("    finally:")
        src.append("        _release()")
        self._arenas = dict(zip(arenas, plan.sizes))
        self._scratch = scratch
        check_lines(src, "Python")
        self._source = "\n".join(src) + "\n"
        self._consts, self._variables = consts, variables
        fname = f"<geon-numpy-{id(self):x}>"
        linecache.cache[fname] = (len(self._source), None, self._source.splitlines(True),
                                  fname)  # tracebacks show generated lines
        weakref.finalize(self, linecache.cache.pop, fname, None)
        self._code = compile(self._source, fname, "exec")
        self._kernels = kernels  # its .source: the C code of the compiled groups
        self._kernel_fns = kernels.build() if kernels else {}

    def _ufunc_allocates(self, op, fresh, zero_d):
        """Whether result ``op`` is best computed by its ufunc without ``out=``: NumPy
        then allocates the result itself, which saves a call of ``np.empty`` (much of
        the time of a call on a few elements). Only where that array is exactly what
        ``np.empty`` would give: one axis (a new 1-d array is contiguous whatever the
        layout of the operands), the op's shape (no operand broadcast to it) and dtype
        (the ufunc's own loop for the operands' dtypes, no ``dtype=`` or casting)."""
        ufunc = NP_UFUNCS.get(type(op))
        if ufunc is None or op not in fresh or op in self._into or len(op.axes) != 1 \
                or NUMPY_CODE.get(type(op)) is not _UFUNC_RULES.get(type(op)):
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

    def _buffer(self, op, plan, arenas, setup, body, fresh, taken):
        """The name of ``op``'s buffer. A planned value is a view of its arena, made
        once in setup() and shared by every value of that arena with the same shape
        and dtype; a result is a new array each call (a line added to ``body``)."""
        shape, dtype = op.axes.shape, op.dtype
        storage = self._into.get(op)
        if storage is not None:  # computed in place of the variable it is assigned to
            return self._names[storage]
        if op in plan.slot:
            key = (plan.slot[op], shape, dtype)
            name = self._arena_views.get(key)
            if name is None:
                arena = arenas[plan.slot[op]]
                name = self._arena_views[key] = identifier(f"{arena}_{dtype.name}", taken)
                setup.append(f"    {name} = {arena}[:{op.axes.size * dtype.itemsize}]"
                             f".view(np.{dtype.name}).reshape({py_literal(shape)})")
            return name
        assert op in fresh, op
        name = identifier("t_" + op.name, taken)
        # np.empty with a dtype object bound in the module's globals: a call of a few
        # elements spends much of its time here otherwise (attribute look-ups and the
        # conversion of the scalar type)
        known = self._result_dtypes
        dt = known.setdefault(np.dtype(dtype), f"_rdt{len(known)}")
        body.append(f"    {name} = _empty({py_literal(shape)}, {dt})  # {dtype.name}")
        return name

    def _bias_add(self, g, order, emits, plan):
        """``(gemm, v)`` where fused group ``g`` starts by adding ``v`` to a matrix
        product (a bias add after a layer's GEMM) that nothing else reads, emitted right
        before the group, over the product's own buffer; else None.

        The product is then computed as ``v + a @ b`` in one BLAS call
        (:func:`blas.add_product`): ``v`` is copied into the output in place of the
        pass in which the BLAS zeroes it, and the group starts after the addition. In
        the MLP step of the benchmarks at batch 1,024 this took 0.24-0.39 ms off the
        NumPy code's 20 ms (medians of paired differences, two runs on a noisy
        machine; doc/performance.rst)."""
        if not blas.available():
            return None
        m0 = g.members[0]
        if not isinstance(m0, og.Add) or m0 not in g.internal \
                or m0.dtype not in _BLAS_DTYPES:
            return None
        gemms = [a for a in m0.args if isinstance(a, pr.Gemm) and not a.batch_rank]
        if len(gemms) != 1:
            return None
        gemm = gemms[0]
        v = m0.args[1] if m0.args[0] is gemm else m0.args[0]
        if gemm.dtype != m0.dtype or v.dtype != m0.dtype \
                or v.axes.lengths != m0.axes.lengths or gemm in self.results \
                or gemm in self._into or gemm not in plan.slot \
                or self._readers.get(gemm) != 1 \
                or any(r is gemm and x is not gemm for x, r in self._root.items()):
            return None   # read elsewhere too (directly or through a view)
        if any(emits(op) and not isinstance(op, pr.ViewOp)
               for op in order[self._step[gemm] + 1:self._step[m0]]):
            return None   # other code than views (of feeds) runs between them
        if self._block_over(g, 0, _last_readers(g), plan) is not gemm:
            return None   # the sum would not be written over the product
        return gemm, v

    def _group_code(self, g, names, arg_names, plan, arenas, setup, fresh, scratch, taken):
        """A fused group: a nested function that runs the members over a range of rows,
        one block at a time; internal values live in small per-thread scratch arrays,
        everything else is read and written one block at a time. Large groups are
        split over threads (NumPy releases the GIL inside ufunc loops)."""
        lines = []
        members = g.members
        for m in members:
            if m not in g.internal:
                names[m] = self._buffer(m, plan, arenas, setup, lines, fresh, taken)
        bias = self._bias_adds.get(g)   # (gemm, v): the first member is gemm + v
        if bias is not None:
            gemm, v = bias
            a, b, c, v = (names[x] for x in gemm.args + (gemm, v))
            lines.append(self._annotate(f"if not _gemm_add({a}, {b}, {c}, {v}):  # else:",
                                        gemm))
            lines.append(f"        np.matmul({a}, {b}, out={c})")
            lines.append(self._annotate(f"    np.add({c}, {v}, {c})", members[0]))
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
                code = find_rule(NUMPY_CODE, m)(m, out, arg_names(m, local, B))
                body.append("    " + self._annotate(code[0], m))
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
            code = find_rule(NUMPY_CODE, m)(m, out, args)
            body.append("    " + self._annotate(code[0], m))
            body.extend("        " + ln for ln in code[1:])
            for a in dict.fromkeys(m.args):
                if a in temp_of and last[a] == k and temp_of[a] != temp_of.get(m):
                    free.append(temp_of[a])
        sets = identifier("scratch", taken)
        threads = fusion.threads_for(g)
        scratch[sets] = (threads, temps)
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

    def _check_line(self, op, out, args):
        """The debug mode's check of ``op``'s value ``out`` (read from ``args``)."""
        k = len(self._checks)
        self._checks.append(op)
        read = "".join(a + ", " for a in args)
        return f"    if not _finite({out}): _bad({k}, {out}, ({read}))"

    def _bad(self, k, out, args):
        """Raise the NumericsError of check ``k`` (called by the generated code)."""
        op = self._checks[k]
        raise numerics.op_error(op, out, numerics.inputs_status(op, args, out))

    def _bad_feed(self, i, value):
        """Raise the NumericsError of feed ``i`` (called by the generated code)."""
        raise numerics.feed_error(self.params[i], value)

    @staticmethod
    def _annotate(line, op):
        note = _note(type(op), op.derived_from, op.filename, op.lineno)
        return f"    {line:<60} # {note}"

    def _allocate(self):
        ns = dict(_module_globals(), np=np)
        state = self.transformer.state
        for n, v in self._variables.items():
            ns[n] = state[v]
        for n, size in self._arenas.items():
            ns[n] = np.empty(size, np.uint8)
        # Fused groups run one after another, so they share their scratch memory:
        # scratch k of thread j of every group is a view of one buffer (j, k).
        sizes = {}
        for threads, temps in self._scratch.values():
            for j in range(threads):
                for k, (shape, dtype) in enumerate(temps):
                    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
                    sizes[j, k] = max(sizes.get((j, k), 0), n)
        shared = {jk: np.empty(n, np.uint8) for jk, n in sizes.items()}
        for n, (threads, temps) in self._scratch.items():
            ns[n] = [[shared[j, k][:int(np.prod(shape)) * np.dtype(dtype).itemsize]
                      .view(dtype).reshape(shape) for k, (shape, dtype) in enumerate(temps)]
                     for j in range(threads)]
        ns["_run_blocks"] = fusion.run_blocks
        ns["_threads"] = thread_policy.refresh
        ns.update(compiled_kernels.PY_GLOBALS, **self._kernel_fns)
        ns["_ndarray"], ns["_feed"], ns["_last"] = np.ndarray, self._check_feed, [_UNSET]
        lock = self.transformer._lock
        ns["_acquire"], ns["_release"] = lock.acquire, lock.release
        ns["_nofeed"], ns["_bad_args"], ns["_empty"] = _UNSET, self._bad_args, np.empty
        for dt, n in self._result_dtypes.items():
            ns[n] = dt
        if self._check_numerics:
            ns["_finite"] = _all_finite
            ns["_bad"], ns["_bad_feed"] = self._bad, self._bad_feed
            ns["_quiet"] = _quiet
        for i, p in enumerate(self.params):
            ns[f"_dt{i}"] = p.dtype
            if self._domains[i] is not None and p.dtype.kind == "i":
                ns[f"_u{i}"] = domains.unsigned(p.dtype)
        ns["_bad_value"] = self._bad_value
        self._ns = ns
        ns.update(self._consts)
        exec(self._code, ns)
        ns["setup"]()
        self._fn = ns["run"]

    #: the generated ``run`` checks its arguments (see _generate)
    _entry_checks_args = True

    def _fast_entry(self):
        return self._fn

    def _bad_args(self, args, kwargs):
        """Raise the FeedError of a call with keywords or a wrong number of values
        (called by the generated code; parameters not given hold ``_nofeed``)."""
        self._check_args(tuple(a for a in args if a is not _UNSET), kwargs)

    def _last_values(self):
        ns = getattr(self, "_ns", None)  # the generated code keeps the last results
        last = ns["_last"][0] if ns else _UNSET
        if last is _UNSET:
            return None
        return (last,) if self.single else last


#: the default of each parameter of a generated ``run`` (a value not given), and what
#: it keeps as the last results before the first call
_UNSET = object()


@functools.lru_cache(maxsize=4096)  # many ops share a class and a source line
def _note(cls, derived_from, filename, lineno):
    """The comment on a generated line: the op's class, the op it was lowered from, and
    where it was built."""
    origin = f" <- {derived_from}" if derived_from else ""
    return comment(f'{cls.__name__}{origin}, File "{filename}", line {lineno}')


def _all_finite(a):
    return np.isfinite(a).all()


def _quiet():
    return np.errstate(invalid="ignore", divide="ignore", over="ignore")


class NumPyTransformer(Transformer):
    """Runs computations on the CPU through generated NumPy code.

    Args:
        check_numerics: the numerics debug mode (default off): every floating-point
            value a computation computes is checked right after it is computed, and
            every floating-point feed when the computation is called; the first that
            holds a NaN or an infinity raises :class:`~geon.errors.NumericsError`
            naming the op, the user's op it was lowered from, its source line and which
            of its inputs were finite (see ``geon.transformers.numerics``). Off, the
            generated code is exactly what it is without the option.
        compiled: run fused elementwise groups as C loops built with the system C
            compiler (see ``geon.transformers.numpy.compiled``). ``"auto"``: the
            groups of at least ``compiled.AUTO_MIN_ELEMENTS`` (65,536) elements,
            where a compiler works (without one, the NumPy code, silently); True:
            also small groups, which are then fused too (without a compiler, the
            NumPy code after a GeonWarning); False: the NumPy code only. Default: the environment
            variable ``GEON_COMPILED`` (``auto`` when unset; ``0`` False, ``1`` True).
        disable, dump_after, dump_file, sample_axis: as for every transformer.
    """

    name = "numpy"
    #: The standard base set, ``where`` (np_ops.Select), the collectives (allreduce,
    #: broadcast_from; see geon.distributed) and every user op: the classes
    #: with a rule in ``NUMPY_CODE`` or handled by the code generator itself (views,
    #: placeholders, variables, constants).
    base_set = STANDARD_BASE_SET | {Select, UserOp, coll.AllReduce, coll.BroadcastFrom,
                                      coll.FlatConcat}
    computation_class = NumPyComputation
    # Optional backend steps ``disable`` accepts: "memory" (liveness-based buffer
    # sharing; off: one buffer per value) and "fusion" (blocked elementwise groups).
    backend_steps = ("memory", "fusion")

    def __init__(self, disable: Iterable[str] = (), dump_after: Iterable[str] = (),
                 dump_file: Optional[IO[str]] = None, sample_axis: Optional[str] = None,
                 check_numerics: bool = False,
                 compiled: Union[bool, str, None] = None) -> None:
        self.check_numerics = bool(check_numerics)
        self.compiled = compiled_kernels.mode(compiled)
        super().__init__(disable=disable, dump_after=dump_after, dump_file=dump_file,
                         sample_axis=sample_axis)


register_transformer("numpy", NumPyTransformer)
