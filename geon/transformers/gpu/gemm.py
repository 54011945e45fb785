"""CUDA kernels of the matrix product (``Gemm`` of :mod:`geon.op_graph.primitives`).

One kernel per product, specialized to its sizes and strides: each block computes a
tile of C from tiles of A and B staged in shared memory (double buffered), each thread
a few 4 x 4 groups of it. A batched product runs one product per index of the grid's
z dimension. :class:`GemmCall` describes the same product to a BLAS, which the runtime
may call instead.
"""

from typing import NamedTuple

import numpy as np

from geon.errors import LoweringError
from geon.op_graph import primitives as pr
from geon.transformers.gpu.cuda import ctype, literal
from geon.transformers.gpu.kernels import Kernel, Params, cuda_kernels

#: (BM, BN, BK, TM, TN): tile of C per block, K step, and C elements per thread
#: (in groups of 4 rows / 4 columns spread over the tile, so that shared-memory reads
#: of a warp are conflict free). 256 threads each.
GEMM_LARGE = (128, 128, 8, 8, 8)
GEMM_SMALL = (64, 64, 8, 4, 4)
#: Threads per block of every GEMM kernel.
GEMM_THREADS = 256


#: At most this many blocks along the grid's z dimension, which runs over the batch of a
#: batched product (a longer batch is looped over by each block).
GEMM_BATCH_BLOCKS = 65535


def gemm_config(M, N, K, dt, batch=1):
    """The tile configuration of a product: the large tiles for float32 products that
    fill the device (one wave of 132 blocks or more), else the small ones."""
    if np.dtype(dt) == np.float32 and -(-M // 128) * -(-N // 128) * batch >= 132:
        return GEMM_LARGE
    return GEMM_SMALL


def batch_offsets(batch, index="bz"):
    """C expressions of the element offsets of A, B and C for the batch index ``index``
    (row-major over ``batch``: ``[(length, stride of A, of B, of C)]``)."""
    terms = ([], [], [])
    inner = 1
    for pos in range(len(batch) - 1, -1, -1):
        n, *strides = batch[pos]
        q = index if inner == 1 else f"({index} / {inner}LL)"
        if pos > 0:
            q = f"({q} % {n}LL)"
        for t, st in zip(terms, strides):
            if st:
                t.append(q if st == 1 else f"{q} * {st}LL")
        inner *= n
    return tuple(" + ".join(reversed(t)) or "0" for t in terms)


def gemm_kernel(params, a, b, c, M, N, K, sa, sb, dt, vec_a, vec_b, vec_c, ops, cfg=None,
                batch=()):
    """``C (M, N) = A (M, K) @ B (K, N)``: ``a``, ``b``, ``c`` are pointer names, ``sa`` =
    (row stride, column stride) of A and ``sb`` of B, in elements; C is row-major.
    ``vec_*``: float4 accesses are allowed (contiguous direction, 16-byte alignment and
    whole tiles were checked by the caller). Tiles of A and B go through shared memory,
    double buffered: the next tile's global loads are issued before the current tile is
    used.

    ``batch``: ``[(length, stride of A, of B, of C)]`` (elements; a stride of 0 is a
    broadcast) for a batched product, one product per batch index: the grid's z
    dimension runs over the batch (each block loops where the batch has more than
    :data:`GEMM_BATCH_BLOCKS` indices)."""
    count = 1
    for n, *_ in batch:
        count *= n
    g = _GemmWriter(a, b, c, M, N, K, sa, sb, dt, vec_a, vec_b, vec_c,
                    cfg or gemm_config(M, N, K, dt, count))
    L = [f"    __shared__ __align__(16) {g.T} As[2][{g.BK}][{g.BM + 4}];",
         f"    __shared__ __align__(16) {g.T} Bs[2][{g.BK}][{g.BN + 4}];"]
    head = len(L)
    if batch:  # this batch index's matrices, through pointers of the same names
        g.ptr = {"a": "ga", "b": "gb", "c": "gc"}
    swap = g.tiles_m > 65535  # gridDim.y is at most 65535; gridDim.x far more
    if swap and g.tiles_n > 65535:
        raise LoweringError(f"Gemm ({M} x {K}) @ ({K} x {N}) is too large for one launch")
    L += g.prologue(swap) + g.main_loop() + g.epilogue()
    grid = (g.tiles_m, g.tiles_n) if swap else (g.tiles_n, g.tiles_m)
    note = (f"Gemm ({M} x {K}) @ ({K} x {N}), tiles {g.BM} x {g.BN} x {g.BK}, "
            f"{g.TM} x {g.TN} per thread")
    if batch:
        gz = min(count, GEMM_BATCH_BLOCKS)
        oa, ob, oc = batch_offsets(batch)
        # Every thread of a block runs the same batch indices: the tile loop's
        # __syncthreads() stay uniform, and its last one ends all reads of shared
        # memory before the next index stores its first tiles.
        L[head:] = ([f"    for (long long bz = blockIdx.z; bz < {count}LL; bz += {gz}LL) {{",
                     f"    const {g.T}* ga = {a} + {oa};",
                     f"    const {g.T}* gb = {b} + {ob};",
                     f"    {g.T}* gc = {c} + {oc};"]
                    + ["    " + ln if ln.startswith("    ") else ln for ln in L[head:]]
                    + ["    }"])
        grid = grid + (gz,)
        note = f"{count} x " + note
    return Kernel("gemm", params, L, GEMM_THREADS, grid, (GEMM_THREADS,), ops, note=note)


def _load_plan(rows, cols, fast_cols, vector):
    """Per thread: ``[(row expr, col expr, guard or None)]`` of a rows x cols tile,
    adjacent threads along ``cols`` if ``fast_cols``; vector: float4 along the fast
    side."""
    threads = GEMM_THREADS
    total = rows * cols // (4 if vector else 1)
    per = -(-total // threads)
    out = []
    for j in range(per):
        e = f"(tid + {j * threads})"
        guard = None if (j + 1) * threads <= total else f"{e} < {total}"
        if fast_cols:
            w = cols // 4 if vector else cols
            r, c = f"({e} / {w})", (f"({e} % {w}) * 4" if vector else f"({e} % {w})")
        else:
            w = rows // 4 if vector else rows
            r, c = (f"({e} % {w}) * 4" if vector else f"({e} % {w})"), f"({e} / {w})"
        out.append((r, c, guard))
    return out


def _tile_store(which, tile, buf, r, c):
    # Both tiles are stored k-major: As[k][m], Bs[k][n].
    if which == "a":
        return f"{tile}[{buf}][{c}][{r}]"
    return f"{tile}[{buf}][{r}][{c}]"


class _GemmWriter:
    """The source lines of one GEMM kernel (see :func:`gemm_kernel`): the sizes, the
    tile configuration, what may move as float4, and the per-thread plans of the tile
    loads. ``ptr`` names the pointers of A, B and C (a batched kernel's per-index
    ones)."""

    def __init__(self, a, b, c, M, N, K, sa, sb, dt, vec_a, vec_b, vec_c, cfg):
        self.dt = dt = np.dtype(dt)
        self.T = ctype(dt)
        self.M, self.N, self.K = M, N, K
        self.BM, self.BN, self.BK, self.TM, self.TN = cfg
        self.GM, self.GN = self.TM // 4, self.TN // 4  # groups of 4 rows / columns a thread
        self.even_m, self.even_n = M % self.BM == 0, N % self.BN == 0
        self.even_k = K % self.BK == 0
        self.vec = vec = dt == np.float32
        self.sam, self.sak = sa
        self.sbk, self.sbn = sb
        # Which direction of each tile adjacent threads load (the one with the smaller
        # stride, for coalescing).
        self.a_fast_k = abs(self.sak) <= abs(self.sam) if M > 1 else True
        self.b_fast_n = abs(self.sbn) <= abs(self.sbk) if K > 1 else True
        self.vec_a = vec_a and vec and self.even_m and self.even_k
        self.vec_b = vec_b and vec and self.even_n and self.even_k
        self.vec_c = vec_c and vec and self.even_m and self.even_n
        big = max(M * max(abs(self.sam), 1), K * max(abs(self.sak), abs(self.sbk), 1),
                  N * max(abs(self.sbn), 1), M * N)
        self.it = "long long" if big >= 2 ** 30 else "int"
        self.tiles_m, self.tiles_n = -(-M // self.BM), -(-N // self.BN)
        self.ptr = {"a": a, "b": b, "c": c}
        # A tile: rows m (BM), cols k (BK); B tile: rows k (BK), cols n (BN)
        self.plan = {"a": _load_plan(self.BM, self.BK, self.a_fast_k, self.vec_a),
                     "b": _load_plan(self.BK, self.BN, self.b_fast_n, self.vec_b)}

    def prologue(self, swap):
        """The block's and thread's position, the zeroed accumulators and the load
        registers."""
        T, it, TM, TN = self.T, self.it, self.TM, self.TN
        zero = literal(0, self.dt)
        my, nx = ("x", "y") if swap else ("y", "x")
        na = len(self.plan["a"]) * (4 if self.vec_a else 1)
        nb = len(self.plan["b"]) * (4 if self.vec_b else 1)
        return ["    const int tid = threadIdx.x;",
                f"    const int tx = tid % {self.BN // TN}, ty = tid / {self.BN // TN};",
                f"    const {it} m0 = ({it})blockIdx.{my} * {self.BM}, "
                f"n0 = ({it})blockIdx.{nx} * {self.BN};",
                f"    {T} acc[{TM}][{TN}];",
                "#pragma unroll",
                f"    for (int i = 0; i < {TM}; ++i) {{",
                "#pragma unroll",
                f"        for (int j = 0; j < {TN}; ++j) {{ acc[i][j] = {zero}; }}",
                "    }",
                f"    {T} ra[{na}];",
                f"    {T} rb[{nb}];"]

    def loads(self, which):
        """Statements loading this thread's part of the next ``which`` tile ("a" or
        "b", at ``kt``) from global memory into registers."""
        if which == "a":
            v, reg = self.vec_a, "ra"
            s_r, s_c, base_r, base_c = self.sam, self.sak, "m0", "kt"
            lim_r, lim_c, ev_r, ev_c = self.M, self.K, self.even_m, self.even_k
        else:
            v, reg = self.vec_b, "rb"
            s_r, s_c, base_r, base_c = self.sbk, self.sbn, "kt", "n0"
            lim_r, lim_c, ev_r, ev_c = self.K, self.N, self.even_k, self.even_n
        ptr, out = self.ptr[which], []
        for j, (r, c, guard) in enumerate(self.plan[which]):
            row, col = f"({base_r} + {r})", f"({base_c} + {c})"
            pre = f"if ({guard}) " if guard else ""
            if v:
                addr = f"{row} * {s_r} + {col} * {s_c}"
                out.append(f"{pre}{{ const float4 q = *reinterpret_cast<const float4*>("
                           f"{ptr} + {addr}); {reg}[{4 * j}] = q.x; {reg}[{4 * j + 1}] = q.y; "
                           f"{reg}[{4 * j + 2}] = q.z; {reg}[{4 * j + 3}] = q.w; }}")
                continue
            conds = []
            if not ev_r:
                conds.append(f"{row} < {lim_r}")
            if not ev_c:
                conds.append(f"{col} < {lim_c}")
            addr = f"{ptr}[{row} * {s_r} + {col} * {s_c}]"
            if conds:
                val = f"({' && '.join(conds)}) ? {addr} : {literal(0, self.dt)}"
            else:
                val = addr
            out.append(f"{pre}{{ {reg}[{j}] = {val}; }}")
        return out

    def stores(self, which, buf):
        """Statements storing the loaded registers of ``which`` into shared-memory
        buffer ``buf``."""
        if which == "a":
            v, reg, tile, fast_c = self.vec_a, "ra", "As", self.a_fast_k
        else:
            v, reg, tile, fast_c = self.vec_b, "rb", "Bs", self.b_fast_n
        out = []
        for j, (r, c, guard) in enumerate(self.plan[which]):
            pre = f"if ({guard}) " if guard else ""
            if v:
                for q in range(4):
                    rr, cc = (r, f"{c} + {q}") if fast_c else (f"{r} + {q}", c)
                    out.append(f"{pre}{_tile_store(which, tile, buf, rr, cc)} = "
                               f"{reg}[{4 * j + q}];")
            else:
                out.append(f"{pre}{_tile_store(which, tile, buf, r, c)} = {reg}[{j}];")
        return out

    def fragments(self, name, tile, groups, span, lane):
        """Statements reading this thread's ``4 * groups`` values of row ``kk`` of the
        current ``tile`` into the array ``name``."""
        out = []
        for g in range(groups):
            base = f"{g * span} + {lane} * 4"
            if self.vec:
                out.append(f"            {{ const float4 q = *reinterpret_cast<const float4*>("
                           f"&{tile}[cur][kk][{base}]); {name}[{4 * g}] = q.x; "
                           f"{name}[{4 * g + 1}] = q.y; "
                           f"{name}[{4 * g + 2}] = q.z; {name}[{4 * g + 3}] = q.w; }}")
            else:
                out += [f"            {name}[{4 * g + q}] = {tile}[cur][kk][{base} + {q}];"
                        for q in range(4)]
        return out

    def main_loop(self):
        """The first tiles' loads, then per K tile: the next tiles' global loads, the
        products of the current ones, and the next tiles' stores."""
        BK, TM, TN = self.BK, self.TM, self.TN
        both = (lambda f, *a: ["    " + ln for ln in f("a", *a) + f("b", *a)])
        L = [f"    {self.it} kt = 0;"]
        L += both(self.loads) + both(self.stores, "0")
        L += ["    __syncthreads();",
              f"    const int tiles = {-(-self.K // BK)};",
              "    for (int t = 0; t < tiles; ++t) {",
              "        const int cur = t & 1;",
              "        if (t + 1 < tiles) {",
              f"            kt = ({self.it})(t + 1) * {BK};"]
        L += ["        " + ln for ln in both(self.loads)]
        L += ["        }",
              "#pragma unroll",
              f"        for (int kk = 0; kk < {BK}; ++kk) {{",
              f"            {self.T} fa[{TM}], fb[{TN}];"]
        L += self.fragments("fa", "As", self.GM, self.BM // self.GM, "ty")
        L += self.fragments("fb", "Bs", self.GN, self.BN // self.GN, "tx")
        L += ["#pragma unroll",
              f"            for (int i = 0; i < {TM}; ++i) {{",
              "#pragma unroll",
              f"                for (int j = 0; j < {TN}; ++j) "
              "{ acc[i][j] += fa[i] * fb[j]; }",
              "            }",
              "        }",
              "        if (t + 1 < tiles) {"]
        L += ["        " + ln for ln in both(self.stores, "cur ^ 1")]
        L += ["        }",
              "        __syncthreads();",
              "    }"]
        return L

    def epilogue(self):
        """Statements storing the accumulators: ``C[m][n]``, row-major with leading
        dimension N."""
        c, N, it, L = self.ptr["c"], self.N, self.it, []
        rows, cols = self.BM // self.GM, self.BN // self.GN
        for gi in range(self.GM):
            for qi in range(4):
                i = 4 * gi + qi
                L.append(f"    {{ const {it} m = m0 + {gi * rows} + ty * 4 + {qi};")
                if not self.even_m:
                    L.append(f"      if (m < {self.M}) {{")
                for gj in range(self.GN):
                    n_expr = f"n0 + {gj * cols} + tx * 4"
                    if self.vec_c:
                        four = ", ".join(f"acc[{i}][{4 * gj + q}]" for q in range(4))
                        L.append(f"        *reinterpret_cast<float4*>({c} + m * {N} + "
                                 f"{n_expr}) = make_float4({four});")
                        continue
                    for qj in range(4):
                        j = 4 * gj + qj
                        store = f"{c}[m * {N} + {n_expr} + {qj}] = acc[{i}][{j}];"
                        if self.even_n:
                            L.append(f"        {store}")
                        else:
                            L.append(f"        if ({n_expr} + {qj} < {N}) {{ {store} }}")
                if not self.even_m:
                    L.append("      }")
                L.append("    }")
        return L


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


@cuda_kernels(pr.Gemm)
def emit_gemm(ctx, op):
    """A matrix product (batched where the operands have more than 2 dimensions), with
    what a BLAS needs to replace the kernel (the runtime's ``gemm`` option)."""
    a, b = op.args
    la, lb, lc = ctx.layout(a), ctx.layout(b), ctx.layout(op)
    M, K = la.shape[-2:]
    N = lb.shape[-1]
    nb = len(lc.shape) - 2
    batch = merged_batch(lc.shape[:nb], la.strides[:nb], lb.strides[:nb], lc.strides[:nb])
    if M == 0 or N == 0 or any(d[0] == 0 for d in batch):
        return
    params = Params()
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
    k = gemm_kernel(params, pa, pb, c, M, N, K, sa, sb, op.dtype,
                    vec(la, sa, a_fast_k, 1), vec(lb, sb, b_fast_n, 2),
                    not any(d[3] % 4 for d in batch), [op], batch=batch)
    k.library = GemmCall(M, N, K, tuple(sa), tuple(sb), tuple(lc.strides[-2:]),
                         np.dtype(op.dtype), tuple(int(p[1:]) for p in (c, pa, pb)), batch)
    ctx.add(k)
