"""NumPy code for control flow (:mod:`geon.op_graph.control`).

A :class:`~geon.op_graph.control.Scan` runs as a Python loop over its axis in the
generated module; each step calls the body, compiled once (when the first computation
holding the op is generated) into a computation of its own from a copy of the body's
ops, so that every pass (simplification, lowering, CSE, fusion, memory planning) runs
inside the body too. The generated code finds that computation by a number in
``_scan_bodies`` (a table of weak references: a body's computation lives as long as
its op's body).
"""

import itertools
import weakref

import numpy as np

from geon.op_graph import op_graph as og
from geon.op_graph import primitives as pr
from geon.op_graph.control import Scan
from geon.op_graph.control_ops import Cond, WhileLoop
from geon.op_graph.params import clone_graph
from geon.registry import make_transformer
from geon.transformers.numpy.code_table import NUMPY_GLOBALS, numpy_code


class _BodyRunner:
    """A scan body compiled by the NumPy transformer: ``computation(*inputs)`` returns
    the tuple of the body's results (new arrays the caller owns)."""

    def __init__(self, body, token, steps):
        self.token = token
        # The passes rewrite the ops they compile: they get a copy (placeholders, the
        # stand-ins, are shared).
        mapping = clone_graph(list(body.results))
        results = [mapping[r] for r in body.results]
        t = make_transformer("numpy")
        t.nested = True  # called inside a computation's call: no thread-policy refresh
        t.steps = steps  # a scan's: the module has a step() for the loop's later steps
        self.computation = t.computation(results, *body.inputs)


_RUNNERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # body -> runner
#: token -> the body's computation (called by the generated code; alive with its runner)
_BY_TOKEN: "weakref.WeakValueDictionary" = weakref.WeakValueDictionary()
_TOKENS = itertools.count()
NUMPY_GLOBALS["_scan_bodies"] = _BY_TOKEN


def _contiguous(a):
    """``a`` itself where it is C-contiguous, else a C-contiguous copy (0-d stays 0-d,
    unlike ``np.ascontiguousarray``): the body's computation is fed whole arrays."""
    return a if a.flags.c_contiguous else np.array(a, order="C")


NUMPY_GLOBALS["_contiguous"] = _contiguous


def subgraph_computations(op):
    """The computations of ``op``'s subgraphs (a scan's body, a cond's branches, a
    while loop's predicate and body), compiled by now; empty for other ops."""
    bodies = op.branches if isinstance(op, Cond) else (op.pred, op.body) \
        if isinstance(op, WhileLoop) else (op.body,) if isinstance(op, Scan) else ()
    return [body_runner(b, isinstance(op, Scan)).computation for b in bodies]


def body_runner(body, steps=False) -> _BodyRunner:
    """The compiled computation of a scan body (compiled on first request; ``steps``:
    a scan's, whose module has a ``step()``)."""
    runner = _RUNNERS.get(body)
    if runner is None:
        runner = _BodyRunner(body, next(_TOKENS), steps)
        _RUNNERS[body] = runner
        _BY_TOKEN[runner.token] = runner.computation
    return runner


def _products_only(comp, p):
    """Whether every op of ``comp`` that reads placeholder ``p`` is a matrix product,
    directly or through a transposing view: a scan's closure that is a weight is then
    passed as it is (a transposed view: the BLAS reads it so at about the same speed,
    where a copy of an LSTM's 64 x 256 weight took 10 us a scan)."""
    readers = [op for op in comp.ops if any(a is p for a in op.args)]
    return bool(readers) and all(
        isinstance(op, pr.Gemm)
        or isinstance(op, pr.Dimshuffle) and _products_only(comp, op) for op in readers)


def _constant(op):
    """Whether ``op`` is a constant or a view of one (its values never change)."""
    while isinstance(op, pr.ViewOp):
        op = op.args[0]
    return isinstance(op, og.Constant)


@numpy_code(Scan)
def _scan_numpy(op, out, args):
    """``out``: the final carries, the stacked ys and the history (None: not read)."""
    nc, nx, _, ny = op.counts
    runner = body_runner(op.body, True)
    T = op.axis.length
    final, ys, hist = out[:nc], out[nc:nc + ny], out[nc + ny:]
    c = [f"_sc_c{k}" for k in range(nc)]
    lines = [f"_sc_f = _scan_bodies[{runner.token}]  # the body's computation"]
    lines += [f"{n} = _contiguous({a})" for n, a in zip(c, args[:nc])]
    xs = []
    for k, (a, s) in enumerate(zip(args[nc:nc + nx], op.args[nc:nc + nx])):
        pos = s.axes.index(op.axis.name)
        x = f"np.moveaxis({a}, {pos}, 0)" if pos else a
        lines.append(f"_sc_x{k} = _contiguous({x})  # {op.axis.name} first")
        xs.append(f"_sc_x{k}[_sc_t]")
    ks = [f"_sc_k{k}" for k in range(len(args) - nc - nx)]
    closures = runner.computation.params[nc + nx:]
    lines += [f"{n} = {a}" if _products_only(runner.computation, p)
              else f"{n} = _contiguous({a})"
              for n, a, p in zip(ks, args[nc + nx:], closures)]
    y = [f"_sc_y{j}" for j in range(ny)]
    targets = ", ".join(c + y) + ("," if nc + ny == 1 else "")

    def one_step(fn, indent):
        out = [f"{indent}{h}[_sc_t] = {n}" for h, n in zip(hist, c) if h is not None]
        call = f"{fn}({', '.join(c + xs + ks)})"
        out.append(f"{indent}{targets} = {call}" if nc + ny else f"{indent}{call}")
        return out + [f"{indent}{o}[_sc_t] = {n}" for o, n in zip(ys, y) if o is not None]
    copies = [f"np.copyto({o}, {n})" for o, n in zip(final, c) if o is not None]
    if isinstance(T, int) and T >= 2 and runner.computation._c_loop is not None:
        # The whole loop in one C call where the body's step allows (c_scan.py), which
        # writes the ys, the history and the final carries; else (None) the loop below
        def tup(names):
            return "(" + "".join(f"{n}, " for n in names) + ")"
        outs = [tup(o or "None" for o in group) for group in (ys, hist, final)]
        frozen = tuple(map(_constant, op.args[nc + nx:]))
        stacked = [f"_sc_x{k}" for k in range(nx)]
        lines.append(f"if _sc_f._c_loop.run({tup(c)}, {tup(stacked)}, {tup(ks)}, "
                     f"{', '.join(outs)}, {op.reverse}, {frozen}, {T}) is None:")
        return lines + ["    " + ln for ln in _python_loop(op, T, runner, one_step)
                        + copies]
    return lines + _python_loop(op, T, runner, one_step) + copies


def _python_loop(op, T, runner, one_step):
    """The lines of a scan's loop in Python."""
    if isinstance(T, int) and T >= 2 and runner.computation._has_step:
        # The first step through the body's call (which checks the values), the others
        # through its step() (no checks: the carries are its own results, the slices
        # and closures as checked) under its lock, held for the loop: 1-2 us a step.
        first, rest = (T - 1, f"range({T - 2}, -1, -1)") if op.reverse \
            else (0, f"range(1, {T})")
        return [f"_sc_t = {first}"] + one_step("_sc_f", "") + [
            "_sc_g = _sc_f._ns['step']", "with _sc_f.transformer._lock:",
            f"    for _sc_t in {rest}:"] + one_step("_sc_g", "        ")
    steps = f"range({T - 1}, -1, -1)" if op.reverse else f"range({T})"
    return [f"for _sc_t in {steps}:"] + one_step("_sc_f", "    ")

