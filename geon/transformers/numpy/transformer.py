"""The NumPy transformer: lowered graphs become Python source calling NumPy.

Each computation becomes a small module with two functions:

- ``setup()`` runs once after allocation and makes the views of buffers whose address
  never changes (variables, constants, intermediate buffers);
- ``run(p0, p1, ...)`` takes the placeholder arrays and executes one line per
  primitive, writing into buffers the transformer owns (``out=``), each line commented
  with the op it implements and the user's source line.

``NUMPY_CODE`` (:mod:`.code_table`) maps each base-set class to a function ``fn(op,
out, args)`` returning the lines that compute ``op``; the rules live in modules that
mirror the op modules (``op_graph.py``, ``primitives.py``, ``conv.py``, ...). The module
source is written by :class:`~geon.transformers.numpy.emitter.ModuleEmitter`; this
module keeps the computation (allocation, calls, the debug mode's checks) and the
transformer.
"""

import functools
import linecache
import os
import weakref
from typing import IO, Iterable, Optional, Union

import numpy as np

from geon.op_graph import collectives as coll
from geon.op_graph import domains
from geon.op_graph.control import Scan
from geon.op_graph.control_ops import Cond, WhileLoop
from geon.errors import ArgumentError, FeedError
from geon.op_graph import op_graph as og
from geon.op_graph.np_ops import Select
from geon.op_graph.specialize import call_binders, check_needs, read_binding
from geon.op_graph.symbols import evaluate, symbols_of
from geon.op_graph.primitives import LengthValue, UnsliceAdd
from geon.op_graph.user_ops import UserOp
from geon.transformers.base import (BaseSet, Computation, Transformer,
                                    register_transformer)
from geon.transformers.codegen_text import check_lines, comment
from geon.transformers import fusion, memory, numerics
from geon.transformers import threads as thread_policy
from geon.transformers.numpy import compiled as compiled_kernels
from geon.transformers.numpy import conv as numpy_conv
# the per-op code: the table, then the modules registering into it (each mirrors an op
# module); their names stay importable from here
from geon.transformers.numpy.code_table import (  # noqa: F401
    NUMPY_CODE, NUMPY_GLOBALS, NUMPY_VIEWS, ROW_LENGTHS, ROW_OPERAND, numpy_code)
from geon.transformers.numpy import collectives as _collectives  # noqa: F401
from geon.transformers.numpy import control as _control  # noqa: F401
from geon.transformers.numpy import control_flow as _control_flow  # noqa: F401
from geon.transformers.numpy import np_ops as _np_ops  # noqa: F401
from geon.transformers.numpy import schemas as _schemas  # noqa: F401
from geon.transformers.numpy.op_graph import SCALAR_CLAMP, SIGMOID_UNCLAMPED  # noqa: F401
from geon.transformers.numpy.primitives import ONES_LENGTH, ONES_MIN  # noqa: F401
from geon.transformers.numpy.user_ops import _module_globals
from geon.transformers.numpy.emitter import ModuleEmitter
from geon.transformers.passes.unslice import UnsliceAdds


#: The most bindings of its symbolic lengths a computation keeps the memory plan,
#: arenas and views of (the first made goes first; a call with it plans it again).
MAX_BINDINGS = 32

#: linecache names of generated modules whose computations are gone (see
#: ``_compile_source``).
_DEAD_SOURCES: list = []


def _forget_dead_sources():
    """Drop the linecache entries of computations that are gone."""
    while _DEAD_SOURCES:
        linecache.cache.pop(_DEAD_SOURCES.pop(), None)


def _physical_memory():
    """The machine's memory in bytes (None where the system does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def _check_fits(plan, binding):
    """A :class:`FeedError` before anything is allocated where the memory plan of
    ``binding`` needs more bytes than the machine has, naming the largest value."""
    need, have = sum(plan.sizes), _physical_memory()
    if have is None or need <= have:
        return
    big = max(plan.slot, key=lambda op: evaluate(op.axes.size, binding) * op.dtype.itemsize)
    raise FeedError(
        f"the feeds bind {', '.join(f'{k} = {v}' for k, v in sorted(binding.items()))}, "
        f"for which the computation's buffers need {need / 2**30:,.1f} GiB and this "
        f"machine has {have / 2**30:,.1f} GiB; the largest value is {big.name} "
        f"({og._fmt(big.axes)}) {big.dtype}, "
        f"{evaluate(big.axes.size, binding) * big.dtype.itemsize / 2**30:,.1f} GiB "
        f"(built at {big.file_info})")


class NumPyComputation(Computation):
    """A computation compiled to NumPy calls (see the module docstring)."""

    #: whether the module has a ``step()`` (a loop body's run without its checks and
    #: lock: emitter.step_source)
    _has_step = False
    _c_loop = None   # a scan body's loop in C (c_scan.py), where its step allows

    def __init__(self, transformer, results, params):
        super().__init__(transformer, results, params)
        self._fn = None
        self._symbols = self._find_symbols()
        mode = getattr(transformer, "compiled", False)
        auto = mode == compiled_kernels.AUTO
        if auto and compiled_kernels.auto_unavailable():
            mode = False
        if mode:  # (symbolic lengths: groups of them with size hints, emitter.py)
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

    def _find_symbols(self):
        """The names of the symbols of the computation's symbolic lengths (sorted; empty
        for fixed lengths), after checking that the feeds give each a value."""
        found = set()
        for op in self.ops:
            if isinstance(op, og.TensorOp):
                found |= symbols_of(op.axes.lengths)
        if not found:
            return ()
        #: (parameter index, position, symbol): where each call reads the symbols
        self._binders = call_binders(found, self.variables, self.params)
        #: binding (a tuple of the symbols' values) -> the values setup() returned
        self._setups = {}
        #: binding -> its memory plan (for inspection; ``plan`` is the last one made)
        self._plans = {}
        return tuple(sorted(found))

    def _bind(self, *feeds):
        """The call's feeds (checked, with the shapes of their binding), the symbols'
        values and the views setup() made for that binding (called by the generated
        ``run`` of a computation with symbolic lengths, under the transformer's lock):
        one flat tuple. The first call with a binding plans its memory."""
        shapes = []
        for v in feeds:
            shape = getattr(v, "shape", None)
            if not isinstance(v, np.ndarray):
                try:
                    shape = np.shape(v)
                except (TypeError, ValueError):
                    shape = None  # _check_feed says what is wrong with it
            shapes.append(shape)
        binding = read_binding(self._binders, self.params, shapes)
        for i, v in enumerate(feeds):  # a feed of another rank binds nothing: its
            p = self.params[i]          # check says what is wrong with it first
            if shapes[i] is None or len(shapes[i]) != len(p.axes):
                p.as_feed(v)  # raises (the shape has a symbol): expected (5, N), got ...
        key = tuple(binding[n] for n in self._symbols)
        arrays = []
        for i, v in enumerate(feeds):
            p = self.params[i]
            a = p.as_feed(v, shape=evaluate(p.axes.shape, binding))
            check = self._domain_checks[i]
            if check is not None:
                check(a)
            arrays.append(a)
        views = self._setups.get(key)
        if views is None:
            views = self._plan_binding(key, binding)
        return (*arrays, *key, *views)

    def _plan_binding(self, key, binding):
        """Plan the memory of ``binding``, allocate its arenas and make its views
        (setup()); cached by binding."""
        order, results, groups, into = self._plan_args
        check_needs(order, binding)  # every slice of a symbolic length fits
        t = self.transformer
        if "memory" in t.disabled or self._check_numerics:
            plan = memory.unshared_plan(order, results, groups, binding=binding)
        else:
            plan = memory.plan_memory(order, results, groups=groups, exclude=into,
                                      binding=binding)
        if memory.VERIFY:
            memory.verify_plan(order, results, plan, groups, binding=binding)
        unplanned = [op.name for op in self._planned if op not in plan.slot]
        if unplanned:  # the code assumes every binding plans the same values
            raise memory.PlanError(f"memory plan of binding {binding}: no place for "
                                   f"{', '.join(unplanned)}{memory._HINT}")
        _check_fits(plan, binding)
        arenas = [np.empty(size, np.uint8) for size in plan.sizes]
        views = self._ns["setup"](*key, [arenas[plan.slot[op]] for op in self._planned])
        if len(self._setups) >= MAX_BINDINGS:  # the oldest binding's goes (and memory)
            old = next(iter(self._setups))
            del self._setups[old], self._plans[old]
        self._setups[key] = views
        self._plans[key] = self.plan = plan
        self.plans += 1
        return views

    def _generate(self, compiled=False):
        """Generate and compile the module of this computation (see
        :class:`~geon.transformers.numpy.emitter.ModuleEmitter`), with its fused
        groups compiled to C where ``compiled`` says."""
        ModuleEmitter(self, compiled).emit()

    def _compile_source(self, src):
        """Compile the module whose lines are ``src``; its source stays readable (and
        shows in tracebacks)."""
        check_lines(src, "Python")
        self._source = "\n".join(src) + "\n"
        fname = f"<geon-numpy-{id(self):x}>"
        _forget_dead_sources()
        linecache.cache[fname] = (len(self._source), None, self._source.splitlines(True),
                                  fname)  # tracebacks show generated lines
        # Not popped from linecache by the finalizer itself: it may run (in a garbage
        # collection) while linecache.checkcache walks the cache, which then fails on
        # the missing key. The entry goes at the next compilation instead.
        weakref.finalize(self, _DEAD_SOURCES.append, fname)
        self._code = compile(self._source, fname, "exec")

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
        # whether fixed C kernels (the direct convolutions, erf) may run, and the
        # convolutions' scratch
        ns["_c_kernels"] = self.transformer.compiled is not False
        ns["_conv_ws"] = numpy_conv.Workspace(direct=ns["_c_kernels"])
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
        if self._symbols:  # setup() runs per binding (see _bind)
            self._setups.clear()
            ns["_bind"], ns["_setups"] = self._bind, self._setups
        else:
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
            groups of at least ``compiled.AUTO_MIN_ELEMENTS`` (65,536) elements, and
            those of two ops or more from ``compiled.AUTO_SMALL_ELEMENTS`` (1,024),
            where a compiler works (without one, the NumPy code, silently), and in
            a loop's body (once per step) those of two ops or more at any size; True:
            also small groups, which are then fused too (without a compiler, the
            NumPy code after a GeonWarning); False: the NumPy code only. Default: the environment
            variable ``GEON_COMPILED`` (``auto`` when unset; ``0`` False, ``1`` True).
        size_hints: ``{symbol: typical length}`` for computations with symbolic
            lengths (``geon.op_graph.symbols``): the size-based choices made when their
            code is generated (whether elementwise runs are fused or compiled, on how
            many threads)
            take these values (which change results by a rounding step at most: see
            the doc). Fusion of a computation with
            symbolic lengths needs a hint for each of its symbols, and its symbolic
            axes first in the fused values (``sample_axis="first"``); without, it is
            not fused (nor compiled). See doc/symbolic_axes.rst.
        disable, dump_after, dump_file, sample_axis: as for every transformer.
    """

    name = "numpy"
    #: The standard base set, ``where`` (np_ops.Select), ``scan`` (control.Scan, a
    #: loop calling its body's own computation), ``cond`` and ``while_loop``
    #: (control_ops.Cond, WhileLoop: an ``if`` / a ``while`` calling their subgraphs'
    #: computations), the collectives (allreduce,
    #: broadcast_from; see geon.distributed), UnsliceAdd (made by the
    #: ``unslice_add`` pass) and every user op: the classes with a rule in
    #: ``NUMPY_CODE`` or handled by the code generator itself (views, placeholders,
    #: variables, constants).
    base_set = BaseSet(Select, UserOp, Scan, Cond, WhileLoop, coll.AllReduce,
                       coll.BroadcastFrom, coll.FlatConcat, LengthValue, UnsliceAdd)
    computation_class = NumPyComputation
    # symbolic axis lengths, bound from the feeds' shapes at each call (see _bind)
    symbolic_lengths = True
    #: Whether this transformer compiles a subgraph (a scan's body, a branch, a while
    #: loop's predicate or body) for the loop of another computation's call: its calls
    #: skip the thread-policy refresh, which that call made (set by numpy.control).
    nested = False
    #: Whether it compiles a scan's body (whose module then has a step(), emitter.py).
    steps = False
    # Optional backend steps ``disable`` accepts: "memory" (liveness-based buffer
    # sharing; off: one buffer per value) and "fusion" (blocked elementwise groups).
    backend_steps = ("memory", "fusion")

    def passes(self) -> list:
        """The standard pipeline with ``unslice_add`` (``geon/transformers/passes/
        unslice.py``: a part added into a value where it lies, not through an Unslice
        of zeros) after ``dce``."""
        passes = super().passes()
        at = [p.name for p in passes].index("dce") + 1
        return passes[:at] + [UnsliceAdds()] + passes[at:]

    def __init__(self, disable: Iterable[str] = (), dump_after: Iterable[str] = (),
                 dump_file: Optional[IO[str]] = None, sample_axis: Optional[str] = None,
                 check_numerics: bool = False,
                 compiled: Union[bool, str, None] = None,
                 size_hints: Optional[dict] = None) -> None:
        self.check_numerics = bool(check_numerics)
        self.size_hints = dict(size_hints or {})
        for k, v in self.size_hints.items():
            if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, int) \
                    or v < 0:
                raise ArgumentError(f"size_hints maps symbol names to lengths (ints >= "
                                    f"0), not {k!r}: {v!r}")
        self.compiled = compiled_kernels.mode(compiled)
        super().__init__(disable=disable, dump_after=dump_after, dump_file=dump_file,
                         sample_axis=sample_axis)


register_transformer("numpy", NumPyTransformer)
