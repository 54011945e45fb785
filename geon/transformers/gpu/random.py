"""CUDA code for the random primitive (:class:`geon.op_graph.random.Random`).

One thread per element computes the Philox-4x32-10 block(s) holding that element's
words, exactly as :func:`geon.op_graph.random.draw` does: the uniform numbers are the
same bits on every backend, and so are the normal ones: Box-Muller runs the float64
program of :mod:`geon.op_graph.portable_math` (``geon_normal``, written out with
``__dadd_rn`` / ``__dmul_rn`` / ..., never contracted into fused multiply-adds), not the
device's ``log`` and ``cos``.
"""

from geon.op_graph import portable_math
from geon.op_graph import random as rnd
from geon.transformers.gpu import kernels
from geon.transformers.gpu.cuda import ctype

PHILOX_SOURCE = f"""// Philox-4x32-10 (Salmon et al. 2011): word k of the stream keyed (k0, k1) at step s
__device__ __forceinline__ unsigned int geon_philox_word(unsigned long long k, unsigned int k0,
                                                         unsigned int k1, unsigned long long s) {{
    const unsigned long long b = k >> 2;
    unsigned int c0 = (unsigned int)b, c1 = (unsigned int)(b >> 32);
    unsigned int c2 = (unsigned int)s, c3 = (unsigned int)(s >> 32);
    for (int r = 0; r < {rnd.PHILOX_ROUNDS}; ++r) {{
        if (r) {{ k0 += 0x{rnd.PHILOX_W[0]:08X}u; k1 += 0x{rnd.PHILOX_W[1]:08X}u; }}
        const unsigned long long p0 = 0x{rnd.PHILOX_M[0]:08X}ull * c0;
        const unsigned long long p1 = 0x{rnd.PHILOX_M[1]:08X}ull * c2;
        const unsigned int n0 = (unsigned int)(p1 >> 32) ^ c1 ^ k0;
        const unsigned int n2 = (unsigned int)(p0 >> 32) ^ c3 ^ k1;
        c1 = (unsigned int)p1; c3 = (unsigned int)p0; c0 = n0; c2 = n2;
    }}
    const unsigned int w = (unsigned int)(k & 3);
    return w == 0 ? c0 : (w == 1 ? c1 : (w == 2 ? c2 : c3));
}}
// uniform from word k: [0, 1), or (0, 1] with open_low = 1
__device__ __forceinline__ float geon_uniform_f32(unsigned long long k, unsigned int k0,
        unsigned int k1, unsigned long long s, unsigned int open_low) {{
    return (float)((geon_philox_word(k, k0, k1, s) >> 8) + open_low) * 5.9604644775390625e-08f;
}}
// uniform from words k and k + 1 (53 bits)
__device__ __forceinline__ double geon_uniform_f64(unsigned long long k, unsigned int k0,
        unsigned int k1, unsigned long long s, unsigned long long open_low) {{
    const unsigned long long a = geon_philox_word(k, k0, k1, s) >> 5;
    const unsigned long long b = geon_philox_word(k + 1, k0, k1, s) >> 6;
    return (double)((a << 26) + b + open_low) * 1.1102230246251565e-16;
}}
"""


def random_kernel(params, op, out, step, ops):
    """``out`` (``op``'s row-major buffer) = the draw of ``op`` at the step ``*step``."""
    n = op.axes.size
    it = kernels._itype(n)
    k0, k1 = rnd.philox_key(op.seed, op.stream)
    per = rnd.words_per_uniform(op.dtype)
    f = "geon_uniform_f64" if per == 2 else "geon_uniform_f32"
    key = f"{k0}u, {k1}u, s"
    lines = [f"    const unsigned long long s = (unsigned long long){step}[0];"]
    lines += kernels._elements(n, it)
    lines.append("        const unsigned long long e = (unsigned long long)i;")
    if op.distribution == "uniform":
        value = f"{f}(e * {per}, {key}, 0)"
    else:  # Box-Muller from the uniforms of words 2 e per and (2 e + 1) per, as draw()
        lines.append(f"        const double u1 = (double){f}(e * {2 * per}, {key}, 1);")
        lines.append(f"        const double u2 = (double){f}(e * {2 * per} + {per}, {key}, 0);")
        value = "geon_normal(u1, u2)"
    lines.append(f"        {out}[i] = ({ctype(op.dtype)})({value});")
    lines.append("    }")
    return kernels.Kernel("random", params, lines, kernels.EW_THREADS,
                          (kernels._grid_1d(n, kernels.EW_THREADS),), (kernels.EW_THREADS,),
                          ops, deps=(PHILOX_SOURCE, portable_math.CUDA_SOURCE),
                          note=f"Random {op.distribution} {op.axes.shape}")


@kernels.cuda_kernels(rnd.Random)
def _emit_random(ctx, op):
    if op.axes.size:
        params = kernels.Params()
        out = ctx.pointer(params, ctx.layout(op), written=True)
        step = ctx.pointer(params, ctx.layout(op.args[0]))
        ctx.add(random_kernel(params, op, out, step, [op]))
