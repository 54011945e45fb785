"""Generated CUDA kernels, and the table of what each op launches.

A :class:`Kernel` is one ``__global__`` function with its launch shape; its pointer
parameters come from :class:`Params`. :data:`CUDA_KERNELS` maps an op class (or a base
class) to the function that builds the kernels computing an op of it that runs alone
(not fused): ``fn(ctx, op)``, which adds them through its :class:`Context`. Each family
of ops registers its entries from its own module, beside its kernel templates:
:mod:`~geon.transformers.gpu.elementwise`, :mod:`~geon.transformers.gpu.reduce`,
:mod:`~geon.transformers.gpu.gemm`, :mod:`~geon.transformers.gpu.primitives`,
:mod:`~geon.transformers.gpu.conv` and :mod:`~geon.transformers.gpu.random`.

Every kernel is specialized to its shapes and strides, which appear in its source as
constants (index arithmetic by constants is cheap, and bounds checks that a shape makes
unnecessary disappear). Its arguments are pointers only: each is a buffer's base
address plus a byte offset, fixed when the transformer allocates. The kernel's name is
``geon_<kind>_<hash of its source>``, so equal kernels (from any computation) are
compiled once.

Kernels use only what both nvcc and an ordinary C++ compiler with a small shim accept
(no warp intrinsics), so that the test suite's CPU emulator (tests/cuda_emulator.py)
can run them.
"""

import hashlib

from geon.errors import LoweringError
from geon.op_graph.tables import OpTable
from geon.op_graph.user_ops import UserOp
from geon.transformers.codegen_text import check_lines, comment
from geon.transformers.gpu import cuda
from geon.transformers.gpu.layout import identity_source


#: Threads per block of elementwise and Unslice kernels.
EW_THREADS = 256
#: Elements each elementwise thread handles per loop iteration (loads in flight); a
#: multiple of 4, so that a thread's elements fill whole 16-byte vectors.
EW_ITEMS = 4
#: At most this many blocks; a grid-stride loop covers the rest.
MAX_BLOCKS = 8192


class Kernel:
    """A generated kernel and how to launch it.

    ``source`` is the complete kernel (its name included), made from the lines of its
    ``body`` (each checked by :func:`~geon.transformers.codegen_text.check_lines`);
    ``deps`` are helper definitions it needs besides the prelude (user ops' device
    functions); ``args`` are ``(buffer, byte_offset)`` per parameter; ``grid`` and
    ``block`` are 3-tuples; ``ops`` the ops it computes (for the annotated source).
    """

    def __init__(self, kind, params, body, threads, grid, block, ops, deps=(), note=""):
        self.kind = kind
        decl = ", ".join(params.declarations())
        check_lines(body, "CUDA C")
        body = "".join(line + "\n" for line in body)
        template = (f'extern "C" __global__ void __launch_bounds__({threads}) '
                    f"KERNEL({decl})\n{{\n{body}}}\n")
        digest = hashlib.sha1(("".join(deps) + template).encode()).hexdigest()[:16]
        self.name = f"geon_{kind}_{digest}"
        self.source = template.replace("KERNEL(", self.name + "(", 1)
        self.deps = tuple(deps)
        self.args = params.args()
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        self.block = tuple(block) + (1,) * (3 - len(block))
        self.ops = list(ops)
        self.note = note

    def __repr__(self):
        return f"<Kernel {self.name} grid={self.grid} block={self.block}>"


class Params:
    """The pointer parameters of a kernel: one per distinct (buffer, byte offset, type).

    A pointer is ``__restrict__`` only if no other parameter points into its buffer, so
    an in-place update (an output over one of its inputs) is one plain pointer.
    """

    def __init__(self):
        self._items = []  # [buffer, byte_offset, ctype, written]
        self._index = {}

    def pointer(self, buffer, byte_offset, ct, written=False):
        key = (buffer, byte_offset, ct)
        k = self._index.get(key)
        if k is None:
            k = self._index[key] = len(self._items)
            self._items.append([buffer, byte_offset, ct, written])
        elif written:
            self._items[k][3] = True
        return f"p{k}"

    def declarations(self):
        count = {}
        for buf, _, _, _ in self._items:
            count[buf] = count.get(buf, 0) + 1
        out = []
        for k, (buf, _, ct, written) in enumerate(self._items):
            const = "" if written else "const "
            restrict = " __restrict__" if count[buf] == 1 else ""
            out.append(f"{const}{ct}*{restrict} p{k}")
        return out

    def args(self):
        return [(buf, off) for buf, off, _, _ in self._items]


def _grid_1d(n, per_block):
    return min(max(1, -(-n // per_block)), MAX_BLOCKS)


def _itype(n, layouts=()):
    """``int`` when every index and offset stays far below 2**31, else ``long long``."""
    big = n + MAX_BLOCKS * EW_THREADS * EW_ITEMS
    for lay in layouts:
        span = lay.span()
        if span:
            big = max(big, abs(span[0]) + 1, abs(span[1]) + 1)
    return "int" if big < 2 ** 30 else "long long"


def describe(op):
    """One line about ``op`` for comments (sanitized): its class, name, origin and
    source line."""
    origin = f" <- {op.derived_from}" if op.derived_from else ""
    return comment(f"{type(op).__name__} {op.name}{origin}, {op.file_info}")


def _elements(n, it):
    """The opening lines of a grid-stride loop over ``n`` elements (index ``i``)."""
    return [f"    const {it} n = {n};",
            f"    for ({it} i = ({it})blockIdx.x * {EW_THREADS} + ({it})threadIdx.x; "
            f"i < n; i += ({it})gridDim.x * {EW_THREADS}) {{"]


# --- what an op launches -----------------------------------------------------------------

#: ``{op class: fn(ctx, op)}``: the kernels of an op that runs alone. Fused groups are
#: made by :func:`geon.transformers.gpu.codegen.generate` from the elementwise and
#: reduction kernels directly.
CUDA_KERNELS = OpTable("CUDA_KERNELS", "fn(ctx, op): adds the kernels computing op")
#: Decorator: ``@cuda_kernels(Cls, ...)`` registers ``fn(ctx, op)``.
cuda_kernels = CUDA_KERNELS.register


def emit(ctx, op):
    """Add the kernels of ``op`` (not fused) through ``ctx``; a
    :class:`~geon.errors.LoweringError` for an op the GPU cannot run."""
    build = CUDA_KERNELS.find(op)
    if build is None:
        raise LoweringError(f"the gpu transformer cannot run {op.name} "
                            f"({type(op).__name__}, built at {op.file_info})")
    build(ctx, op)


class Context:
    """What kernel builders need: layouts, roots, buffers, the code of each elementwise
    op, and the program the kernels go to (``prog``, a
    :class:`~geon.transformers.gpu.codegen.Program`)."""

    def __init__(self, prog, lay, buffer_of):
        self.prog = prog
        self.lay = lay
        self._buffer_of = buffer_of

    def add(self, kernel):
        """Launch ``kernel`` next (compiled once however often it is launched)."""
        self.prog.kernels.setdefault(kernel.name, kernel)
        self.prog.launches.append(kernel)

    def scratch(self, nbytes):
        """A new scratch buffer of ``nbytes`` bytes (its buffer key)."""
        self.prog.scratch.append(nbytes)
        return ("scratch", len(self.prog.scratch) - 1)

    def layout(self, op):
        return self.lay[op]

    def source(self, op):
        """See :func:`~geon.transformers.gpu.layout.identity_source`."""
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
        """The C expression function of the elementwise ``op`` (from
        :data:`~geon.transformers.gpu.cuda.CUDA_CODE` or the shared C expressions)."""
        r = cuda.cuda_rule(op)
        if r is not None:
            return r
        raise LoweringError(f"the gpu transformer has no CUDA code for {op.name} "
                            f"({type(op).__name__}, built at {op.file_info})")

    def deps_of(self, members):
        """The device functions of the user ops among ``members`` (each once)."""
        out = []
        for m in members:
            if isinstance(m, UserOp):
                src = cuda.user_op_code(type(m))[1]
                if src not in out:
                    out.append(src)
        return out
