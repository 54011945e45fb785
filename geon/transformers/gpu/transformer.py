"""The GPU transformer: the standard passes, GPU fusion and memory planning, CUDA C
kernels launched through PyCUDA, and variables that live on the device.

:class:`CudaCodegenTransformer` does everything up to the CUDA source and the launch
plan and needs neither pycuda nor a GPU (its computations have a ``source`` and a
``program`` but cannot be called). :class:`GPUTransformer` adds a runtime: PyCUDA on a
CUDA device.
"""

import warnings
import weakref
from collections.abc import MutableMapping

import numpy as np

from geon.errors import (ArgumentError, FeedError, GeonError, LoweringError,
                         UnknownTransformerError)
from geon.op_graph import op_graph as og
from geon.op_graph.control_ops import Cond, WhileLoop
from geon.op_graph.user_ops import USER_OPS
from geon.op_graph.np_ops import Select
from geon.op_graph.primitives import LengthValue
from geon.transformers.base import (STANDARD_BASE_SET, Computation, Transformer,
                                    missing_state)
from geon.transformers.gpu.binding import Bindings, refuse_unsupported, symbols_in
from geon.transformers.gpu.codegen import all_kernels, generate


class GPUUnavailableError(UnknownTransformerError):
    """The GPU transformer was asked for where it cannot run (no pycuda, no driver or
    no device); the message says what is missing and which transformers are available.
    A subclass of :class:`~geon.errors.UnknownTransformerError` (so also of
    ``GeonError`` and ``ValueError``)."""


def _user_elementwise_with_cuda():
    return frozenset(c for c in USER_OPS.values()
                     if issubclass(c, og.ElementWise) and c.cuda_source is not None)


class CudaComputation(Computation):
    """A computation lowered to CUDA C: ``source`` (annotated CUDA) and ``program``
    (:class:`geon.transformers.gpu.codegen.Program`, the kernels and launch plan).

    With symbolic lengths (``be.symbolic_axis``) the passes run once, and each binding
    of the symbols gets a program of its own (:mod:`geon.transformers.gpu.binding`):
    :meth:`program_for` makes or finds it, ``program`` and ``source`` are those of the
    binding made or called last (``None`` and a header before the first)."""

    def __init__(self, transformer, results, params, body=False):
        super().__init__(transformer, results, params)
        self._body = body
        #: the bindings of the symbols and their programs (``None``: fixed lengths)
        self._bindings = None
        symbols = symbols_in(self.ops)
        if symbols:
            refuse_unsupported(self.ops, symbols, body)
            self._bindings = Bindings(self, symbols)
            self.program = None
            self._source = (f"// geon GPU transformer: a computation with symbolic "
                            f"length(s) {', '.join(symbols)}; each binding has a program "
                            f"of its own (comp.program_for({{...}}); none made yet)\n")
            return
        self.program = self._generate(self)
        self.plans += 1
        if body and (self.program.variables or self.program.assigned):
            raise LoweringError("the gpu transformer runs a cond branch or a while "
                                "loop's predicate or body only if it reads no variable "
                                "and assigns nothing")
        self._source = self.program.source

    def _generate(self, comp):
        """The :class:`~geon.transformers.gpu.codegen.Program` of ``comp`` (this
        computation, or a copy of its ops bound to a binding)."""
        t = self.transformer
        return generate(comp, fusion="fusion" not in t.disabled,
                        plan_memory="memory" not in t.disabled,
                        check_numerics=t.check_numerics, body=self._body)

    @property
    def symbols(self):
        """The names of the symbols of the computation's lengths (empty if fixed)."""
        return () if self._bindings is None else self._bindings.symbols

    @property
    def programs(self):
        """``{binding: Program}`` (a binding as the tuple of the symbols' values, in the
        order of ``symbols``): the programs kept (``{(): program}`` for fixed lengths)."""
        if self._bindings is None:
            return {(): self.program}
        return dict(self._bindings.programs)

    def program_for(self, binding=None):
        """The :class:`~geon.transformers.gpu.codegen.Program` of ``binding``
        (``{symbol: int}``, one entry per symbol; ``{}`` or ``None`` for fixed
        lengths), made at the first request or call with it (``plans`` counts them). A
        slice over a symbolic length that does not fit the binding raises the
        ``FeedError`` a call would."""
        if self._bindings is None:
            if binding:
                raise ArgumentError(f"this computation has fixed lengths; no binding "
                                    f"applies ({binding})")
            return self.program
        with self.transformer._lock:
            key, values = self._bindings.binding_of(binding or {})
            return self._program_of(key, values)

    def _program_of(self, key, binding):
        prog, dropped = self._bindings.program(key, binding, self._generate)
        self._dropped(dropped)
        self.program = prog
        self._source = (f"// geon GPU transformer: the program of the binding "
                        + ", ".join(f"{n} = {v}" for n, v in zip(self.symbols, key))
                        + "\n" + prog.source)
        return prog

    def _dropped(self, keys):
        """Forget what depends on the bindings ``keys`` (their programs are gone)."""

    @property
    def kernels(self):
        """The distinct kernels of this computation (of its last binding's program,
        with symbolic lengths), by name."""
        return {} if self.program is None else self.program.kernels

    def _allocate(self):
        raise GeonError(f"the {self.transformer.name} transformer only generates code; "
                        f"use make_transformer('gpu') to run computations")


class _OnDevice:
    """What one program needs on the device: its buffers (the variables' are the
    transformer's), its compiled kernels and runner, and the pinned buffers of the
    copies of feeds and results."""

    def __init__(self, prog, t):
        rt = t.runtime
        bufs = allocate_buffers(prog, t)
        for j, v in enumerate(prog.variables):
            bufs[("var", j)] = t.state.device_buffer(v)
        self.bufs = bufs  # keeps the allocations alive
        # (one nvcc run for the kernels of this program and of its host steps' bodies;
        # kernels are named by their source, so those compiled before are skipped)
        rt.compile(list(all_kernels(prog).values()))
        self.run_kernels = program_runner(prog, bufs, t)
        copier = GPUComputation._result_copier
        if t.check_numerics:
            self.fetch = [GPUComputation._fetcher(spec, bufs, rt) for spec in prog.results]
        else:
            self.results = [copier(spec, bufs, rt.pinned, rt.download, rt.take)
                            for spec in prog.results]
            # feeds go to the device through pinned buffers of their own
            self.staging = [rt.pinned(p.axes.shape, p.dtype) for p in prog.feeds]
        self.fence = None  # the last call's copies out of the staging buffers
        self.feed_ptrs = [int(bufs[("feed", i)]) for i in range(len(prog.feeds))]


class GPUComputation(CudaComputation):
    """A computation run on a device (see :mod:`geon.transformers.gpu`). With symbolic
    lengths, each binding called gets its program's device memory and kernels at its
    first call (kept with its program, see :mod:`geon.transformers.gpu.binding`)."""

    def _allocate(self):
        if self._bindings is not None:
            #: ``{binding: entry}``: the call of each binding made since allocation
            self._entries = {}
            return
        self._device = _OnDevice(self.program, self.transformer)

    @property
    def _run_kernels(self):
        """The function running the program's kernels (fixed lengths)."""
        return self._device.run_kernels

    def _dropped(self, keys):
        for k in keys:
            getattr(self, "_entries", {}).pop(k, None)

    @staticmethod
    def _result_copier(spec, bufs, host, copy, take):
        """``(fetch, value)`` for result ``spec``: ``fetch()`` copies it from the device
        (``copy(array, address)``) into a host array made once by ``host(shape,
        dtype)`` (``fetch`` is ``None`` where nothing is copied: a constant, a void
        op); ``value()`` then gives the result, a new array (``take(array)`` of a
        dense one; a strided one is read from the span of elements it covers)."""
        if spec.void:
            return None, lambda: None
        if spec.array is not None:
            return None, spec.array.copy
        from geon.transformers.gpu.codegen import host_view
        from geon.transformers.gpu.layout import Layout
        dtype, shape = spec.dtype, spec.shape
        item = dtype.itemsize
        lay = Layout(None, spec.offset, shape, spec.strides)
        base = int(bufs[spec.buffer])
        if lay.contiguous or lay.size <= 1:
            dense = host(shape, dtype)
            address = base + spec.offset * item
            return (lambda: copy(dense, address)), (lambda: take(dense))
        lo, hi = lay.span()
        flat = host((hi - lo + 1,), dtype)
        rel = Layout(None, spec.offset - lo, shape, spec.strides)
        address = base + lo * item
        return (lambda: copy(flat, address)), (lambda: host_view(flat, rel))

    @classmethod
    def _fetcher(cls, spec, bufs, rt):
        """A function copying result ``spec`` from the device now (synchronously)."""
        fetch, value = cls._result_copier(spec, bufs, np.empty, rt.dtoh, np.array)
        if fetch is None:
            return value

        def fetch_now():
            fetch()
            return value()
        return fetch_now

    def _fast_entry(self):
        if self._bindings is not None:
            return self._symbolic_entry()
        return self._entry_for(self._device, self.program, self._check_feed)

    def _symbolic_entry(self):
        """The call of a computation with symbolic lengths: the binding read from the
        feeds' shapes, then that binding's call (made at its first call)."""
        read, entries = self._bindings.read, self._entries
        lock = self.transformer._lock

        def entry(*args):
            key, binding = read(args)
            run = entries.get(key)
            if run is None:
                with lock:
                    run = self._bind(key, binding, args)
            return run(*args)
        return entry

    def _bind(self, key, binding, args):
        """The call of ``binding`` (``key`` its values): its program (made once, see
        :meth:`program_for`) on the device. The feeds ``args`` are checked first, so
        that a wrong one costs no program."""
        run = self._entries.get(key)
        if run is not None:  # (another thread bound it meanwhile)
            return run
        shapes = self._bindings.shapes(binding)
        params, domain_checks = self.params, self._domain_checks

        def check(i, a):  # a feed checked against its shape under the binding
            a = params[i].as_feed(a, shape=shapes[i])
            if domain_checks[i] is not None:
                domain_checks[i](a)
            return a
        for i, a in enumerate(args):
            check(i, a)
        prog = self._program_of(key, binding)
        run = self._entries[key] = self._entry_for(_OnDevice(prog, self.transformer),
                                                  prog, check)
        return run

    def _entry_for(self, dev, prog, check):
        """The call running ``prog`` on ``dev`` (:class:`_OnDevice`); ``check(i, a)``
        converts feed ``a`` of parameter ``i`` of the wrong class, dtype or shape."""
        t = self.transformer
        if t.check_numerics:
            return self._checking_feeds(self._checked_entry(dev, prog), check)
        rt, state = t.runtime, t.state
        checks = [(p.axes.shape, p.dtype) for p in prog.feeds]
        copies_in = list(zip(dev.feed_ptrs, dev.staging))
        run = dev.run_kernels
        copies_out = [enqueue for enqueue, _ in dev.results if enqueue is not None]
        values_of = [value for _, value in dev.results]
        assigned = list(prog.assigned)
        single = self.single
        in_domain = self._domain_checks  # per parameter: None, or a check of its values
        upload, fence, finish = rt.upload, rt.fence, rt.finish
        ndarray = np.ndarray
        lock = t._lock  # calls take turns: computations share the device buffers

        def entry(*args):
            with lock:
                if dev.fence is not None:  # the staging buffers are free again
                    dev.fence.wait()
                    dev.fence = None
                for i, a in enumerate(args):
                    shape, dt = checks[i]
                    if a.__class__ is not ndarray or a.dtype is not dt or a.shape != shape:
                        a = check(i, a)   # converts, and checks the domain
                    elif in_domain[i] is not None:
                        in_domain[i](a)
                    upload(*copies_in[i], a)
                if state.host_dirty:
                    state.push()
                run()
                if assigned:
                    state.written(assigned)
                for enqueue in copies_out:
                    enqueue()
                if copies_out:
                    finish()
                elif args:  # nothing to wait for now, but the next call reuses staging
                    dev.fence = fence()
                values = [value() for value in values_of]
                self._last = values
            return values[0] if single else tuple(values)
        return entry

    def _checked_entry(self, dev, prog):
        """The numerics debug mode's call: synchronous copies, launches one by one."""
        t = self.transformer
        rt, state = t.runtime, t.state
        ptrs, run, fetch = dev.feed_ptrs, dev.run_kernels, dev.fetch
        assigned = list(prog.assigned)

        def entry(*args):
            with t._lock:
                for i, a in enumerate(args):
                    rt.htod(ptrs[i], a)
                if state.host_dirty:
                    state.push()
                run()
                if assigned:
                    state.written(assigned)
                values = [f() for f in fetch]
                self._last = values
            return values[0] if self.single else tuple(values)
        return entry

    def _checking_feeds(self, entry, check):
        """``entry`` after the conversion ``check`` of every feed and a check of the
        floating-point ones (numerics debug mode)."""
        from geon.transformers import numerics
        params = self.params

        def checked_entry(*args):
            args = [check(i, a) for i, a in enumerate(args)]
            for p, a in zip(params, args):
                if numerics.checked(p) and not numerics.finite(a):
                    raise numerics.feed_error(p, a)
            return entry(*args)
        return checked_entry


def _check_device_fits(prog, rt, need):
    """An error before anything is allocated where ``prog`` needs more device memory
    than is free (where the runtime says how much is): a ``FeedError`` naming the
    binding for a program of a binding of symbolic lengths."""
    free = getattr(rt, "free_memory", None)
    free = None if free is None else free()
    if free is None or need <= free:
        return
    binding = getattr(prog, "binding", None)
    what = (f"the feeds bind {', '.join(f'{k} = {v}' for k, v in sorted(binding.items()))}"
            f", for which the computation's" if binding else "the computation's")
    raise (FeedError if binding else GeonError)(
        f"{what} buffers need {need / 2**30:,.2f} GiB of device memory and "
        f"{free / 2**30:,.2f} GiB is free on the device")


def allocate_buffers(prog, t, skip=None):
    """``{buffer key: allocation}`` for ``prog`` on ``t``'s runtime: arenas, feeds,
    results, scratch, constants (written) and ports; not the keys ``skip(key)`` says
    (nor the variables, which live in ``t.state``)."""
    rt = t.runtime
    bufs = {}
    sizes = ([(("arena", k), n) for k, n in enumerate(prog.arenas)]
             + [(("feed", i), p.axes.size * p.dtype.itemsize)
                for i, p in enumerate(prog.feeds)]
             + [(("result", j), n) for j, n in enumerate(prog.result_bytes)]
             + [(("scratch", j), n) for j, n in enumerate(prog.scratch)]
             + [(("port", j), n) for j, n in enumerate(prog.ports)])
    _check_device_fits(prog, rt, sum(n for key, n in sizes if skip is None or not skip(key))
                       + sum(arr.nbytes for arr in prog.constants))
    for key, n in sizes:
        if skip is None or not skip(key):
            bufs[key] = rt.alloc(n)
    for j, arr in enumerate(prog.constants):
        bufs[("const", j)] = b = rt.alloc(arr.nbytes)
        rt.htod(int(b), arr)
    return bufs


def _launch_list(kernels, bufs):
    return [(k, k.grid, k.block, [int(bufs[b]) + off for b, off in k.args])
            for k in kernels]


def launches_runner(kernels, bufs, t):
    """A function enqueueing ``kernels`` with the buffers ``bufs``: as one CUDA graph
    from its second call on where the transformer captures graphs (see
    :class:`_Launches`)."""
    rt = t.runtime
    return _Launches(rt, rt.launcher(_launch_list(kernels, bufs), t._blas), t.cuda_graphs)


def program_runner(prog, bufs, t):
    """A function running ``prog`` with the buffers ``bufs``: its launches, and its host
    steps (``Cond``, ``WhileLoop``: :mod:`geon.transformers.gpu.control`) between them.
    Without host steps, one :class:`_Launches` (one CUDA graph from the second call on);
    with them, each run of launches between two host steps is one."""
    hosts = {}
    for at, step in prog.host_steps:
        hosts.setdefault(at, []).append(step.bind(bufs, t))
    if t.check_numerics:
        return checked_runner(prog, bufs, t, hosts)
    if not hosts:
        return launches_runner(prog.launches, bufs, t)
    parts, start = [], 0
    for at in sorted(hosts):
        if at > start:
            parts.append(launches_runner(prog.launches[start:at], bufs, t))
        parts.extend(hosts[at])
        start = at
    if start < len(prog.launches):
        parts.append(launches_runner(prog.launches[start:], bufs, t))

    def run():
        for part in parts:
            part()
    return run


def checked_runner(prog, bufs, t, hosts=None):
    """The numerics debug mode's ``run``: each check unit's launches, with the values
    they read fetched before and the floating-point values they wrote checked after
    (see :class:`geon.transformers.gpu.codegen.CheckUnit`); the host steps ``hosts``
    (``{position: [run]}``) at their positions."""
    from geon.transformers import numerics
    rt = t.runtime
    steps = [rt.launcher([launch], t._blas) for launch in _launch_list(prog.launches, bufs)]
    fetcher = GPUComputation._fetcher
    units = [(u, [(op, fetcher(spec, bufs, rt)) for op, spec in u.inputs],
              [(op, fetcher(spec, bufs, rt)) for op, spec in u.outputs])
             for u in prog.checks]
    assigned = list(prog.assigned)
    hosts = sorted((hosts or {}).items())

    def run():
        h = 0
        for u, reads, writes in units:
            while h < len(hosts) and hosts[h][0] <= u.first:
                for step in hosts[h][1]:
                    step()
                h += 1
            before = {op: fetch() for op, fetch in reads}
            for j in range(u.first, u.last + 1):
                steps[j]()
            for op, fetch in writes:
                value = fetch()
                if not numerics.finite(value):
                    if assigned:  # what ran so far may have written variables
                        t.state.written(assigned)
                    raise numerics.kernel_error(u.members, before, op, value)
        for _, runs in hosts[h:]:
            for step in runs:
                step()
    return run


class _Launches:
    """A computation's kernels: enqueued from the launch list on its first call, and
    from its second call on as one CUDA graph captured then (where the runtime has
    graphs and ``graphs`` is true), so that a call costs one launch however many
    kernels it has. A capture that fails warns and leaves the launch list."""

    def __init__(self, runtime, run, graphs):
        self.runtime, self.run, self.graphs = runtime, run, graphs
        self.graph = None
        self.calls = 0

    def __call__(self):
        if self.graph is not None:
            self.graph()
            return
        self.calls += 1
        if self.graphs and self.calls == 2:  # (the first call loaded what it needed)
            try:
                self.graph = self.runtime.graph(self.run)
            except Exception as e:  # (pycuda's errors too; a real error recurs below)
                warnings.warn(f"geon gpu: capturing a CUDA graph failed ({e}); the "
                              f"computation launches its kernels one by one",
                              RuntimeWarning, stacklevel=4)
            if self.graph is not None:
                self.graph()
                return
            self.graphs = False
        self.run()


class DeviceState(MutableMapping):
    """``{variable: array}`` whose values live on the device.

    Reading ``state[v]`` returns a read-only host copy, synchronized at that moment
    (the same array object each time); reading never copies anything back to the
    device. Writing goes through ``state[v] = value`` or :meth:`store` (which
    :meth:`Transformer.initialize`, ``restore`` and ``write_values`` use): the value
    reaches the device before the next computation runs. So ``save`` and ``restore``
    work as on the CPU, with the same checkpoint files.
    """

    def __init__(self, runtime):
        self.runtime = runtime
        self._host = {}
        self._view = {}             # read-only views of _host, handed out
        self._device = {}
        self.host_dirty = set()     # written on the host: push before the next run
        self._device_dirty = set()  # written by a computation: pull before reading

    def __getitem__(self, v):
        try:
            host = self._host[v]
        except (KeyError, TypeError):  # a name, or a Variable without storage yet
            missing_state(self, v)
        if v in self._device_dirty:
            self.runtime.dtoh(host, int(self._device[v]))
            self._device_dirty.discard(v)
        return self._view[v]

    def __setitem__(self, v, value):
        host = np.array(value, dtype=v.dtype, order="C")
        if host.shape != v.axes.shape:
            raise ArgumentError(f"state of {v.name}: shape {host.shape}, expected "
                                f"{v.axes.shape}")
        if v not in self._device:
            self._device[v] = self.runtime.alloc(max(host.nbytes, 1))
        self._host[v] = host
        view = self._view[v] = host.view()
        view.flags.writeable = False
        self._device_dirty.discard(v)
        self.host_dirty.add(v)

    def store(self, v, value, casting="same_kind"):
        """Write ``value`` into ``v``'s host copy in place (NumPy's ``casting`` rule)
        and mark it for the device."""
        np.copyto(self._host[v], value, casting=casting)
        self._device_dirty.discard(v)  # the whole value is the host's now
        self.host_dirty.add(v)

    def __delitem__(self, v):
        del self._host[v]
        del self._view[v]
        del self._device[v]
        self.host_dirty.discard(v)
        self._device_dirty.discard(v)

    def __contains__(self, v):
        return v in self._host

    def __iter__(self):
        return iter(self._host)

    def __len__(self):
        return len(self._host)

    def device_buffer(self, v):
        """The device allocation holding ``v``."""
        return self._device[v]

    def push(self):
        """Copy the host copies written since the last run to the device."""
        for v in self.host_dirty:
            self.runtime.htod(int(self._device[v]), self._host[v])
        self.host_dirty.clear()

    def written(self, variables):
        """Note that a computation wrote ``variables`` on the device."""
        self._device_dirty.update(variables)


class CudaCodegenTransformer(Transformer):
    """Generates CUDA C and a launch plan for each computation, without pycuda or a
    GPU; its computations have ``source`` and ``program`` but cannot run. Backend steps
    that ``disable`` accepts: ``"memory"`` and ``"fusion"`` (as on the CPU)."""

    name = "cuda-codegen"
    computation_class = CudaComputation
    backend_steps = ("memory", "fusion")
    _required = Transformer._required | {"views", "unroll"}
    # symbolic axis lengths: the passes run once on the expressions, the backend per
    # binding read from the feeds (geon.transformers.gpu.binding)
    symbolic_lengths = True

    def __init__(self, *args, check_numerics=False, **kwargs):
        self.check_numerics = bool(check_numerics)
        #: the sub-programs of cond branches and while loops, by subgraph (held weakly;
        #: geon.transformers.gpu.control.SubProgram)
        self._bodies = weakref.WeakKeyDictionary()
        super().__init__(*args, **kwargs)

    def passes(self):
        """The standard pipeline, then ``gemm_types`` (a product's operands converted
        to its type) and ``views`` (a copy where a reshape cannot be strides: the GPU
        has no implicit copies) before ``alias``, which needs the final graph."""
        from geon.transformers.gpu.passes import ContiguousReshapes, GemmOperandTypes
        from geon.transformers.passes.unroll import UnrollScans
        ps = super().passes()
        at = [p.name for p in ps].index("alias")
        # no loop primitive here: scans are unrolled first, so that the copies of
        # their bodies go through every pass
        return [UnrollScans()] + ps[:at] + [GemmOperandTypes(), ContiguousReshapes()] \
            + ps[at:]

    @property
    def base_set(self):
        """The standard base set plus user elementwise ops given CUDA source, ``Cond``
        and ``WhileLoop`` (host steps: :mod:`geon.transformers.gpu.control`), and
        ``LengthValue`` (a count over symbolic lengths: a constant in each binding's
        program)."""
        return (STANDARD_BASE_SET | {Select, Cond, WhileLoop, LengthValue}
                | _user_elementwise_with_cuda())


class GPUTransformer(CudaCodegenTransformer):
    """Runs computations on a CUDA GPU through PyCUDA.

    Args:
        device: the CUDA device ordinal (default 0).
        runtime: ``None`` (PyCUDA on ``device``), or an object offering the runtime
            interface of :class:`geon.transformers.gpu.runtime.PyCUDARuntime` (the test
            suite passes a CPU emulator of the generated kernels this way).
        gemm: ``"auto"`` (default: cuBLAS where it can be loaded and works here, else
            the generated tiled GEMM), ``"cublas"`` (cuBLAS, an error if it does not
            work) or ``"generated"`` (the generated GEMM only). cuBLAS comes from the
            process, the loader's path, the NVIDIA wheels or the CUDA toolkit (see
            doc/gpu.rst); it never uses TF32.
        cuda_graphs: from the second call on, launch each computation's kernels as one
            CUDA graph captured at that call (default ``True``; where the driver has no
            graphs, or a capture fails, the kernels are launched one by one). A
            computation holding a ``cond`` or a ``while_loop`` (host steps, see
            :mod:`geon.transformers.gpu.control`) has one graph per run of launches
            between its host steps, and one per binding of a branch's or body's program.
        check_numerics: the numerics debug mode (default off): each kernel's
            floating-point results are checked after it runs, and the floating-point
            feeds when the computation is called; the first NaN or infinity raises
            :class:`~geon.errors.NumericsError` naming the op (a fused kernel's ops are
            then computed one by one on the host to name the first that goes wrong), the
            user's op, its source line and which inputs were finite. The kernels are
            the same as without it; it launches them one at a time and copies values
            back, so it is slow. Off, nothing of it runs.
        disable, dump_after, dump_file: as for every transformer.

    Without pycuda, a CUDA driver or a device, making one raises
    :class:`GPUUnavailableError` saying what is missing.
    """

    name = "gpu"
    computation_class = GPUComputation

    def __init__(self, device=0, runtime=None, gemm="auto", cuda_graphs=True, **kwargs):
        if runtime is None:
            from geon.transformers.gpu.runtime import gpu_status, pycuda_runtime
            ok, why = gpu_status(device)
            if not ok:
                from geon.transformers.base import available_transformers
                others = [n for n in available_transformers() if n != "gpu"]
                raise GPUUnavailableError(
                    f"the gpu transformer is not available: {why}; available "
                    f"transformers: {', '.join(others)}")
            runtime = pycuda_runtime(device)
        self.runtime = runtime
        self.gemm = gemm
        self.cuda_graphs = bool(cuda_graphs)
        self._blas = runtime.blas_for(gemm)
        super().__init__(**kwargs)
        # calls take turns with those of every transformer on the device (one stream)
        self._lock = getattr(runtime, "lock", self._lock)
        self.state = DeviceState(runtime)

    def _repr_details(self):
        runtime = getattr(self.runtime, "name", None) or type(self.runtime).__name__
        return ([f"device {runtime}", f"gemm={self.gemm!r}"]
                + ([] if self.cuda_graphs else ["cuda_graphs=False"])
                + super()._repr_details())

    # What host steps bind their programs with (geon.transformers.gpu.control, which
    # imports nothing of this module).
    def _allocate_buffers(self, prog, skip=None):
        return allocate_buffers(prog, self, skip)

    def _program_runner(self, prog, bufs):
        return program_runner(prog, bufs, self)

    def _launches_runner(self, kernels, bufs):
        return launches_runner(kernels, bufs, self)

    def synchronize(self):
        """Wait until every kernel launched so far has finished."""
        self.runtime.synchronize()

    def _store(self, v, value, casting="same_kind"):
        self.state.store(v, value, casting)
