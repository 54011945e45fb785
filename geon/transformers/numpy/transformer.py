"""The NumPy transformer: lowered graphs become Python source calling NumPy.

Each computation becomes a small module with two functions:

- ``setup()`` runs once after allocation and makes the views of buffers whose address
  never changes (variables, constants, intermediate buffers);
- ``run(p0, p1, ...)`` takes the placeholder arrays and executes one line per
  primitive, writing into buffers the transformer owns (``out=``), each line commented
  with the op it implements and the user's source line.

:data:`NUMPY_CODE` maps each base-set class to a function ``fn(op, out, args)`` that
returns the lines computing ``op`` into the buffer named ``out`` from the names in
``args``.
"""

import keyword
import linecache
import re

import numpy as np

from geon.op_graph import op_graph as og
from geon.op_graph import primitives as pr
from geon.op_graph import schemas as sc
from geon.op_graph.autodiff import find_rule
from geon.op_graph.ordering import schedule
from geon.op_graph.reference import NP_UFUNCS
from geon.transformers import memory
from geon.transformers.base import Computation, Transformer, register_transformer
from geon.transformers.memory import plan_memory, unshared_plan, verify_plan

NUMPY_CODE = {}


def numpy_code(*classes):
    """Register ``fn(op, out, args) -> [lines]`` as the NumPy code of ``classes``."""
    def register(fn):
        for cls in classes:
            NUMPY_CODE[cls] = fn
        return fn
    return register


def _ufunc_code(name):
    def code(op, out, args):
        # An integer result with an operand of another dtype (e.g. a weak float32 constant
        # such as the 1 in ``i + 1``): compute in the promoted type and cast back, as the
        # reference evaluator does ('same_kind' would refuse float64 -> int64).
        cast = ", casting='unsafe'" if op.dtype.kind in "iub" and any(
            a.dtype != op.dtype for a in op.args) else ""
        return [f"np.{name}({', '.join(args)}, out={out}{cast})"]
    return code


for _cls, _fn in NP_UFUNCS.items():
    NUMPY_CODE[_cls] = _ufunc_code(_fn.__name__)


@numpy_code(og.Sigmoid)
def _sigmoid(op, out, args):
    # exp(-log(1 + exp(-x))): no overflow for any x, full relative precision.
    x, = args
    return [f"np.negative({x}, out={out})", f"np.logaddexp(0, {out}, out={out})",
            f"np.negative({out}, out={out})", f"np.exp({out}, out={out})"]


@numpy_code(sc.SigmoidCrossEntropy)
def _sigmoid_ce(op, out, args):
    x, t = args
    # np.subtract(..., out=): an augmented assignment would make the buffer a local name
    return [f"np.logaddexp(0, {x}, out={out})", f"np.subtract({out}, {x} * {t}, out={out})"]


@numpy_code(pr.Gemm)
def _gemm(op, out, args):
    return [f"np.matmul({args[0]}, {args[1]}, out={out})"]


_REDUCE_FN = {pr.ReduceSum: "sum", pr.ReduceProd: "prod", pr.ReduceMax: "max",
              pr.ReduceMin: "min", pr.ReduceArgMax: "argmax", pr.ReduceArgMin: "argmin"}


@numpy_code(*_REDUCE_FN)
def _reduce(op, out, args):
    return [f"np.{_REDUCE_FN[type(op)]}({args[0]}, axis={op.axis}, out={out})"]


@numpy_code(pr.Copy)
def _copy(op, out, args):
    return [f"np.copyto({out}, {args[0]})"]


@numpy_code(pr.Unslice)
def _unslice(op, out, args):
    return [f"{out}.fill(0)", f"{out}[{op.key!r}] = {args[0]}"]


@numpy_code(pr.Assign)
def _assign(op, out, args):
    t, v = args
    return [f"np.copyto({t}, {v})"]


# Views are expressions: fn(op, arg) -> expression text.
NUMPY_VIEWS = {
    pr.Dimshuffle: lambda op, x: f"{x}.transpose({op.perm})",
    pr.Reshape: lambda op, x: f"{x}.reshape({op.axes.shape})",
    pr.Expand: lambda op, x: "np.broadcast_to({}.reshape({}), {})".format(
        x, tuple(1 if m is None else op.args[0].axes.shape[m] for m in op.dim_map),
        op.axes.shape),
    pr.SliceView: lambda op, x: f"{x}[{op.key!r}]",
}


def _ident(text, taken):
    base = re.sub(r"\W", "_", text)
    if not base or base[0].isdigit() or keyword.iskeyword(base):
        base = "_" + base
    name, k = base, 1
    while name in taken:
        name, k = f"{base}_{k}", k + 1
    taken.add(name)
    return name


class NumPyComputation(Computation):
    """A computation compiled to NumPy calls (see the module docstring)."""

    def __init__(self, transformer, results, params):
        super().__init__(transformer, results, params)
        self._generate()
        self._fn = None

    def _generate(self):
        taken = {"np", "setup", "run"}
        names, consts, variables = {}, {}, {}
        scalars = {}
        dynamic = set()
        setup, body = [], []
        for p in self.params:
            names[p] = _ident(f"{p.name}", taken)
            dynamic.add(p)
        self._copy_feeds = False
        order = schedule(self.results)
        if "memory" in self.transformer.disabled:
            plan = unshared_plan(order, self.results)
        else:
            plan = plan_memory(order, self.results)
        if memory.VERIFY:
            verify_plan(order, self.results, plan)
        self.plan = plan
        arenas = [_ident(f"arena{k}", taken) for k in range(len(plan.sizes))]
        fresh = set()
        for op in order:
            if op in names:
                continue
            if isinstance(op, og.Variable):
                names[op] = _ident(op.name, taken)
                variables[names[op]] = op
            elif isinstance(op, og.Constant):
                names[op] = _ident("c_" + op.name, taken)
                consts[names[op]] = op.array()
                if op.scalar is not None:
                    scalars[op] = _ident("s_" + op.name, taken)
                    consts[scalars[op]] = op.value[()]
            elif isinstance(op, pr.ViewOp):
                x = op.args[0]
                names[op] = _ident("v_" + op.name, taken)
                line = f"{names[op]} = {NUMPY_VIEWS[type(op)](op, names[x])}"
                if x in dynamic:
                    dynamic.add(op)
                    body.append(self._annotate(line, op))
                else:
                    setup.append(self._annotate(line, op))
            else:
                rule = find_rule(NUMPY_CODE, op)
                if isinstance(op, og.VoidOp):
                    out = None
                    if isinstance(op, pr.Assign) and isinstance(op.args[0], og.Placeholder):
                        self._copy_feeds = True
                else:
                    out = names[op] = _ident("t_" + op.name, taken)
                    shape, dtype = op.axes.shape, op.dtype
                    if op in plan.slot:
                        setup.append(f"    {out} = {arenas[plan.slot[op]]}"
                                     f"[:{op.axes.size * dtype.itemsize}]"
                                     f".view(np.{dtype.name}).reshape({shape})")
                    else:  # a result: a new array each call, handed to the caller
                        body.append(f"    {out} = np.empty({shape}, np.{dtype.name})")
                        dynamic.add(op)
                        fresh.add(op)
                args = [scalars.get(a) or names[a] if isinstance(op, og.ElementWise)
                        else names[a] for a in op.args]
                lines = rule(op, out, args)
                body.append(self._annotate(lines[0], op))
                body.extend("    " + ln for ln in lines[1:])
        returns = []
        for r in self.results:
            if isinstance(r, og.VoidOp):
                returns.append("None")
            elif r in fresh:
                returns.append(names[r])
            else:
                returns.append(f"np.array({names[r]})")
        params = ", ".join(names[p] for p in self.params)
        glob = [ln.split(" = ")[0].strip() for ln in setup]
        src = [f"# geon NumPy transformer: computation of "
               f"{', '.join(getattr(r, 'name', '?') for r in self.requested)}"]
        for a, size in zip(arenas, plan.sizes):
            src.append(f"# {a}: {size} bytes, shared by "
                       + ", ".join(names[o] for o, k in plan.slot.items()
                                   if arenas[k] == a))
        src.append("def setup():")
        if glob:
            src.append("    global " + ", ".join(glob))
        src.extend(setup or ["    pass"])
        src.append(f"def run({params}):")
        src.extend(body)
        src.append(f"    return ({', '.join(returns)},)")
        self._arenas = dict(zip(arenas, plan.sizes))
        self._source = "\n".join(src) + "\n"
        self._consts, self._variables = consts, variables
        fname = f"<geon-numpy-{id(self):x}>"
        linecache.cache[fname] = (len(self._source), None, self._source.splitlines(True),
                                  fname)
        self._code = compile(self._source, fname, "exec")

    @staticmethod
    def _annotate(line, op):
        origin = f" <- {op.derived_from}" if op.derived_from else ""
        return f"    {line:<60} # {type(op).__name__}{origin}, {op.file_info}"

    def _allocate(self):
        ns = {"np": np}
        state = self.transformer.state
        for n, v in self._variables.items():
            ns[n] = state[v]
        for n, size in self._arenas.items():
            ns[n] = np.empty(size, np.uint8)
        ns.update(self._consts)
        exec(self._code, ns)
        ns["setup"]()
        self._fn = ns["run"]

    def _run(self, feeds):
        if self._copy_feeds:
            feeds = [np.array(f) for f in feeds]
        return self._fn(*feeds)


class NumPyTransformer(Transformer):
    """Runs computations on the CPU through generated NumPy code."""

    name = "numpy"
    computation_class = NumPyComputation
    backend_steps = ("memory",)  # liveness-based buffer sharing; disable to get one
                                 # buffer per value


register_transformer("numpy", NumPyTransformer)
