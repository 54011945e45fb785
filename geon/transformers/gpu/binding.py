"""Symbolic lengths on the GPU: transformed once, one program per binding.

A computation whose lengths are symbolic (``be.symbolic_axis("N")``) runs the pass
pipeline once, on the expressions, like any other. What the GPU backend does after the
passes needs ints (strides, grids, the sizes written into the kernels, the memory
plan), so it runs per *binding* of the symbols, read from the feeds' shapes at a call:
:func:`bound_program` copies the transformed ops with the lengths bound
(:func:`geon.op_graph.specialize.specialize`), turns each ``LengthValue`` (the count a
``mean`` divides by) into a constant, and generates that binding's
:class:`~geon.transformers.gpu.codegen.Program`. :class:`Bindings` reads a call's
binding and keeps the programs, at most :data:`MAX_BINDINGS` of them (the oldest goes
first). Kernels are named by their source, so a kernel that several bindings share is
compiled once.
"""

from collections import OrderedDict

import numpy as np

from geon.errors import ArgumentError, FeedError
from geon.op_graph import op_graph as og
from geon.op_graph import primitives as pr
from geon.op_graph.control_ops import Cond, WhileLoop
from geon.op_graph.params import copy_debug_info
from geon.op_graph.specialize import call_binders, check_needs, read_binding, specialize
from geon.op_graph.symbols import evaluate, symbols_of
from geon.transformers.passes import Graph

#: The most bindings a computation keeps the program (and, on a device, the memory) of;
#: the first made goes first, and a later call with it generates it again.
MAX_BINDINGS = 16


def symbols_in(ops):
    """The names of the symbols in the lengths of ``ops`` (sorted; empty if none)."""
    found = set()
    for op in ops:
        if isinstance(op, og.TensorOp):
            found |= symbols_of(op.axes.lengths)
    return tuple(sorted(found))


def refuse_unsupported(ops, symbols, body):
    """An ``ArgumentError`` naming the op, where a computation of symbolic lengths holds
    what the GPU transformer cannot bind per call yet."""
    names = ", ".join(symbols)
    if body:
        raise ArgumentError(f"a cond branch or a while loop's predicate or body with "
                            f"symbolic length(s) {names}: the gpu transformer runs them "
                            f"with fixed lengths only")
    for op in ops:
        if isinstance(op, (Cond, WhileLoop)):
            raise ArgumentError(
                f"{type(op).__name__} {op.name} (built at {op.file_info}) is in a "
                f"computation with symbolic length(s) {names}: the gpu transformer runs "
                f"cond and while_loop only in computations of fixed lengths so far "
                f"(the numpy transformer takes both; doc/gpu.rst)")


class _BoundComputation:
    """What :func:`~geon.transformers.gpu.codegen.generate` reads of a computation, for
    a copy of its transformed ops with the lengths bound."""

    def __init__(self, comp, graph, params):
        self.transformer = comp.transformer
        self.requested = comp.requested
        self.graph = graph
        self.results = graph.results
        self.params = params


def bound_program(comp, binding, generate_program):
    """The program of ``comp`` (transformed, with symbolic lengths) under ``binding``
    (``{symbol: int}``): ``generate_program(stand_in)`` of a copy of its transformed
    ops with those lengths. A slice that does not fit is a ``FeedError`` naming it."""
    check_needs(comp.ops, binding)
    copies = specialize(comp.graph.roots, binding)
    graph = Graph([copies[r] for r in comp.results])
    graph.extra_roots = [copies[r] for r in comp.graph.extra_roots]
    graph.invalidate()
    for op in graph.ops():
        if isinstance(op, pr.LengthValue):  # the bound count: a constant now
            c = og.Constant(op.value, axes=(), dtype=op.dtype)
            copy_debug_info(c, op.filename, op.lineno, op.derived_from)
            graph.replace(op, c)
    params = [copies.get(p, p) for p in comp.params]
    prog = generate_program(_BoundComputation(comp, graph, params))
    prog.binding = dict(binding)  # (named by errors of its allocation)
    return prog


class Bindings:
    """The bindings of a computation's symbols: where a call reads them, and the
    programs made so far (``programs``: ``{key: Program}``, ``key`` the symbols'
    values in the order of ``symbols``)."""

    def __init__(self, comp, symbols):
        self.comp = comp
        self.symbols = symbols
        #: ``[(parameter index, axis position, symbol)]``
        self.binders = call_binders(symbols, comp.variables, comp.params,
                                    what=f"{comp.transformer.name} transformer: ")
        self.programs = OrderedDict()

    def read(self, feeds):
        """``(key, binding)`` of a call's ``feeds``: each symbol's value from the first
        feed with it as an axis length; a :class:`FeedError` naming both placeholders
        where two feeds disagree, or naming the placeholder of a feed of the wrong rank
        (or of no shape) that a symbol would be read from."""
        params = self.comp.params
        shapes = [_shape(v) for v in feeds]
        for i, k, name in self.binders:
            shape, p = shapes[i], params[i]
            if shape is None or len(shape) != len(p.axes):
                p.as_feed(feeds[i])  # raises: expected (5, N), got ...
        binding = read_binding(self.binders, params, shapes)
        missing = [n for n in self.symbols if n not in binding]
        if missing:  # pragma: no cover - call_binders makes sure a feed has each
            raise FeedError(f"no feed gives symbol(s) {', '.join(missing)}")
        return tuple(binding[n] for n in self.symbols), binding

    def program(self, key, binding, generate_program):
        """The program of ``binding`` (``key`` its values): the one made before, or a
        new one (``comp.plans`` counts them), the oldest dropped past
        :data:`MAX_BINDINGS`. Returns ``(program, dropped keys)``."""
        prog = self.programs.get(key)
        if prog is not None:
            return prog, []
        prog = bound_program(self.comp, binding, generate_program)
        dropped = []
        while len(self.programs) >= MAX_BINDINGS:
            dropped.append(self.programs.popitem(last=False)[0])
        self.programs[key] = prog
        self.comp.plans += 1
        return prog, dropped

    def shapes(self, binding):
        """The parameters' shapes under ``binding``."""
        return [evaluate(p.axes.shape, binding) for p in self.comp.params]

    def binding_of(self, values):
        """``(key, binding)`` of ``{symbol: int}`` given by the user (every symbol of
        the computation, as ints >= 0)."""
        extra = set(values) - set(self.symbols)
        missing = [n for n in self.symbols if n not in values]
        if extra or missing:
            raise ArgumentError(f"a binding of this computation gives each of its symbols "
                                f"({', '.join(self.symbols)}) an int; got {dict(values)}")
        binding = {}
        for n in self.symbols:
            v = values[n]
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise ArgumentError(f"symbol {n}: a length is an int >= 0, not {v!r}")
            binding[n] = int(v)
        return tuple(binding[n] for n in self.symbols), binding


def _shape(v):
    """The shape of feed ``v`` (``None`` where it has none)."""
    if isinstance(v, np.ndarray):
        return v.shape
    try:
        return np.shape(v)
    except (TypeError, ValueError):
        return None
