"""``Cond`` and ``WhileLoop`` on the GPU: host steps between launches.

A :class:`~geon.op_graph.control.Scan` is unrolled before the passes (``unroll``); a
:class:`~geon.op_graph.control_ops.Cond` or :class:`~geon.op_graph.control_ops.WhileLoop`
runs on the host, between two launches of its computation's launch list:

- each branch, the predicate and the body are compiled once per transformer into a GPU
  computation of their own (:class:`SubProgram`: every pass runs inside it, and it is
  generated in *body* mode, so that each of its results ends dense in a ``result``
  buffer of its own, whose address the caller gives);
- the host step (:class:`CondStep`, :class:`WhileStep`, kept in the program's
  ``host_steps`` with the launch position before which it runs) copies the scalar
  predicate back to the host (one element; the only value that leaves the device) and
  runs the chosen sub-program's launches. The sub-programs read their inputs where
  the outer computation keeps them (a strided or broadcast operand is first copied
  into a dense *port* buffer by a copy kernel of the outer launch list) and write
  their results straight into the outer op's output buffers;
- a while loop's carries live in two sets of port buffers, ``X`` and ``Y``: the body
  is bound twice (reading ``X`` and writing ``Y``, and the other way round), so that
  steps alternate between the two bindings without any copy; the initial carries are
  copied into ``X`` before the loop, the final ones from ``X`` or ``Y`` into the
  outputs after it.

The sub-programs of a transformer share nothing with each other but its runtime (the
device, its stream and its compiled kernels); each has its own arenas, allocated once
and shared by all its bindings (they never run at the same time: everything is on one
stream, in order). A computation holding a host step is not captured as one CUDA
graph: each run of launches between host steps (and each binding of a sub-program
without host steps) is, from its second run on.
"""

from geon.errors import LoweringError
from geon.op_graph.control_ops import Cond, WhileLoop
from geon.op_graph.params import clone_graph
from geon.transformers.codegen_text import comment
from geon.transformers.gpu.cuda import ctype
from geon.transformers.gpu.kernels import (EW_THREADS, Kernel, Params, _elements, _grid_1d,
                                           _itype, cuda_kernels, describe)
from geon.transformers.gpu.layout import Layout, offset_expr, row_major


def copy_kernel(dst, src, lay, dtype, note):
    """A kernel copying the elements of ``lay`` (a :class:`Layout` in buffer ``src[0]``,
    ``src = (buffer, byte offset of the root)``) densely, in row-major order, to
    ``dst`` (``(buffer, byte offset)``); ``None`` for no elements."""
    n = lay.size
    if not n:
        return None
    params = Params()
    T = ctype(dtype)
    d = params.pointer(dst[0], dst[1], T, written=True)
    s = params.pointer(src[0], src[1] + lay.offset * dtype.itemsize, T)
    it = _itype(n, [lay])
    lines = _elements(n, it) + [f"        {d}[i] = {s}[{offset_expr(lay.dims(), 'i', it)}];",
                                "    }"]
    return Kernel("copy", params, lines, EW_THREADS, (_grid_1d(n, EW_THREADS),),
                  (EW_THREADS,), [], note=comment(note))


def _port(ctx, nbytes):
    """A new dense buffer of the outer program (its key)."""
    ctx.prog.ports.append(max(1, int(nbytes)))
    return ("port", len(ctx.prog.ports) - 1)


def _dense_input(ctx, op, k, a):
    """``(buffer, byte offset)`` where argument ``a`` is dense in row-major order: its
    own place, or a port it is copied into first."""
    lay = ctx.layout(a)
    key = ctx.buffer(lay.root)
    item = a.dtype.itemsize
    if lay.contiguous:
        return key, lay.offset * item
    port = _port(ctx, lay.size * item)
    kernel = copy_kernel((port, 0), (key, 0), lay, a.dtype,
                         f"{type(op).__name__} {op.name}: arg {k} ({a.name}) made dense")
    if kernel is not None:
        ctx.add(kernel)
    return port, 0


def _output(ctx, out):
    """``(buffer, byte offset)`` of an output of a host step's op (a port if no one
    reads it: the sub-program writes it anyway)."""
    if out not in ctx.lay:
        return _port(ctx, out.axes.size * out.dtype.itemsize), 0
    return ctx.buffer(ctx.root(out)), 0


def _address(ctx, a):
    lay = ctx.layout(a)
    return ctx.buffer(lay.root), lay.offset * a.dtype.itemsize


def sub_program(ctx, subgraph, op, what):
    """The :class:`SubProgram` of ``subgraph`` (compiled once per transformer)."""
    t = ctx.computation.transformer
    bodies = t._bodies
    sub = bodies.get(subgraph)
    if sub is None:
        sub = bodies[subgraph] = SubProgram(t, subgraph, op, what)
    return sub


class SubProgram:
    """A branch, predicate or body compiled by the transformer ``t`` into a computation
    of its own (``computation``, made from a copy of the subgraph's ops; its
    ``program`` has ``outputs``: the buffer of each result). :meth:`bind` gives a
    function running it on given input and output addresses (through the runtime side
    of the transformer ``t``: ``t._allocate_buffers``, ``t._program_runner``; this module
    imports nothing of it)."""

    def __init__(self, t, subgraph, op, what):
        self.what = f"{what} of {type(op).__name__} {op.name}"
        mapping = clone_graph(list(subgraph.results))
        results = [mapping[r] for r in subgraph.results]
        try:
            self.computation = t.computation_class(t, results, subgraph.inputs, body=True)
        except LoweringError as e:
            raise LoweringError(f"{e} (in the {self.what}, built at {op.file_info})") \
                from None
        self.program = self.computation.program
        self._shared = None

    def _allocate(self, t):
        """The buffers every binding shares (once): arenas, scratch, constants, ports and
        the result buffers that are not outputs."""
        if self._shared is not None:
            return self._shared
        prog = self.program
        outs = set(prog.outputs)
        self._shared = t._allocate_buffers(prog, skip=lambda key: key[0] == "feed"
                                           or key in outs)
        return self._shared

    def bind(self, t, feeds, outputs):
        """A function running the program with input ``i`` read at address
        ``feeds[i]`` and result ``k`` written at ``outputs[k]`` (integers)."""
        prog = self.program
        bufs = dict(self._allocate(t))
        for i, a in enumerate(feeds):
            bufs[("feed", i)] = a
        for key, a in zip(prog.outputs, outputs):
            bufs[key] = a
        return t._program_runner(prog, bufs)


def _at(bufs, place):
    key, off = place
    return int(bufs[key]) + off


class CondStep:
    """The host step of a ``Cond``: reads the predicate, runs the branch it chooses."""

    def __init__(self, op, pred, feeds, outputs, branches):
        self.op, self.pred, self.feeds, self.outputs = op, pred, feeds, outputs
        self.branches = branches

    @property
    def subprograms(self):
        return list(self.branches)

    def describe(self):
        return [f"host step: {describe(self.op)}",
                "    the predicate to the host, then the true or the false branch's "
                "program (see below)"]

    def bind(self, bufs, t):
        rt = t.runtime
        feeds = [_at(bufs, f) for f in self.feeds]
        outs = [_at(bufs, o) for o in self.outputs]
        run_true, run_false = (b.bind(t, feeds, outs) for b in self.branches)
        flag = rt.pinned((1,), self.op.args[0].dtype)
        pred = _at(bufs, self.pred)
        download, finish = rt.download, rt.finish

        def run():
            download(flag, pred)
            finish()
            (run_true if flag[0] != 0 else run_false)()  # (NaN is true, as on the CPU)
        return run


class WhileStep:
    """The host step of a ``WhileLoop``: runs the predicate, reads it, runs the body,
    with the carries alternating between the ports ``X`` and ``Y``."""

    def __init__(self, op, xs, ys, closures, flag, finals, pred, body):
        self.op, self.xs, self.ys, self.closures = op, xs, ys, closures
        self.flag, self.finals = flag, finals  # finals: kernels from X, from Y
        self.pred, self.body = pred, body

    @property
    def subprograms(self):
        return [self.pred, self.body]

    def describe(self):
        bound = "" if self.op.max_steps is None else f", at most {self.op.max_steps} steps"
        return [f"host step: {describe(self.op)}",
                f"    while the predicate's program gives nonzero{bound}: the body's "
                f"program, carries alternating between ports "
                + ", ".join(f"{x[0][0]}{x[0][1]}/{y[0][0]}{y[0][1]}"
                            for x, y in zip(self.xs, self.ys))
                + "; then the final carries copied out by "
                + (", ".join(k.name for k in self.finals[0] + self.finals[1]) or "nothing")]

    def bind(self, bufs, t):
        rt = t.runtime
        xs = [_at(bufs, x) for x in self.xs]
        ys = [_at(bufs, y) for y in self.ys]
        ks = [_at(bufs, k) for k in self.closures]
        flag_at = _at(bufs, self.flag)
        preds = [self.pred.bind(t, c + ks, [flag_at]) for c in (xs, ys)]
        bodies = [self.body.bind(t, xs + ks, ys), self.body.bind(t, ys + ks, xs)]
        finals = [t._launches_runner(ks_, bufs) for ks_ in self.finals]
        flag = rt.pinned((1,), self.op.pred.results[0].dtype)
        download, finish = rt.download, rt.finish
        limit = self.op.max_steps

        def run():
            cur = steps = 0
            while limit is None or steps < limit:
                preds[cur]()
                download(flag, flag_at)
                finish()
                if flag[0] == 0:
                    break
                bodies[cur]()
                cur ^= 1
                steps += 1
            finals[cur]()
        return run


@cuda_kernels(Cond)
def _emit_cond(ctx, op):
    """Operands made dense where needed, then the host step."""
    branches = [sub_program(ctx, b, op, f"{name} branch")
                for b, name in zip(op.branches, ("true", "false"))]
    feeds = [_dense_input(ctx, op, k + 1, a) for k, a in enumerate(op.args[1:])]
    outs = [_output(ctx, o) for o in op.outputs]
    ctx.prog.host_steps.append((len(ctx.prog.launches),
                                CondStep(op, _address(ctx, op.args[0]), feeds, outs,
                                         branches)))


@cuda_kernels(WhileLoop)
def _emit_while(ctx, op):
    """The initial carries copied into the ports ``X``, closures made dense where
    needed, then the host step."""
    pred = sub_program(ctx, op.pred, op, "predicate")
    body = sub_program(ctx, op.body, op, "body")
    nc = op.n_carries
    xs, ys = [], []
    for k, a in enumerate(op.args[:nc]):
        nbytes = a.axes.size * a.dtype.itemsize
        x, y = (_port(ctx, nbytes), 0), (_port(ctx, nbytes), 0)
        xs.append(x)
        ys.append(y)
        lay = ctx.layout(a)
        kernel = copy_kernel(x, (ctx.buffer(lay.root), 0), lay, a.dtype,
                             f"WhileLoop {op.name}: initial carry {k} ({a.name})")
        if kernel is not None:
            ctx.add(kernel)
    closures = [_dense_input(ctx, op, nc + k, a) for k, a in enumerate(op.args[nc:])]
    flag = (_port(ctx, op.pred.results[0].dtype.itemsize), 0)
    finals: list = [[], []]
    for k, o in enumerate(op.outputs):
        if o not in ctx.lay:
            continue
        lay = ctx.layout(o)
        dst = (ctx.buffer(ctx.root(o)), 0)
        for j, src in enumerate((xs[k], ys[k])):
            dense = Layout(o, 0, lay.shape, row_major(lay.shape))
            kernel = copy_kernel(dst, src, dense, o.dtype,
                                 f"WhileLoop {op.name}: final carry {k}")
            if kernel is not None:
                ctx.prog.kernels.setdefault(kernel.name, kernel)
                finals[j].append(kernel)
    ctx.prog.host_steps.append((len(ctx.prog.launches),
                                WhileStep(op, xs, ys, closures, flag, finals, pred, body)))


__all__ = ["CondStep", "SubProgram", "WhileStep", "copy_kernel"]
