"""Convolution and max pooling, forward + backward, geon against PyTorch eager (CPU).

``python -m benchmarks.conv`` from the repository root (``--quick`` for a smoke test).
Both sides compute the result and the derivatives with respect to every input for a
given output gradient, in float32, side by side in one process with interleaved
repeats; the tables give medians and ratios. PyTorch uses its default CPU threads,
geon NumPy's BLAS threads.
"""

import argparse

import numpy as np

import geon as be
from benchmarks.common import interleaved, ms, table

BATCH, CIN, COUT, SIZE = 32, 64, 64, 32


def geon_conv_step():
    """The compiled geon computation of conv2d (3x3, padding 1) and its derivatives."""
    x = be.np.placeholder((BATCH, CIN, SIZE, SIZE))
    w = be.np.placeholder((COUT, CIN, 3, 3))
    g = be.np.placeholder((BATCH, COUT, SIZE, SIZE))
    y = be.np.conv(x, w, padding=1)
    dx, dw = be.deriv(y, [x, w], error=g)
    return be.NumPyTransformer().computation([y, dx, dw], x, w, g)


def geon_pool_step():
    """The compiled geon computation of 2x2 max pooling (stride 2) and its derivative."""
    x = be.np.placeholder((BATCH, CIN, SIZE, SIZE))
    g = be.np.placeholder((BATCH, CIN, SIZE // 2, SIZE // 2))
    y = be.np.max_pool(x, 2)
    return be.NumPyTransformer().computation([y, be.deriv(y, x, error=g)], x, g)


def torch_step(fn, *arrays):
    """PyTorch eager: forward, then backward with the given output gradient."""
    import torch
    *inputs, grad = [torch.from_numpy(a) for a in arrays]
    leaves = [t.requires_grad_() for t in inputs]

    def step():
        for t in leaves:
            t.grad = None
        y = fn(*leaves)
        y.backward(grad)
        return y
    return step


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    args = parser.parse_args(argv)
    repeats = 3 if args.quick else 15
    import torch
    F = torch.nn.functional
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, CIN, SIZE, SIZE)).astype(np.float32)
    w = (rng.standard_normal((COUT, CIN, 3, 3)) * 0.05).astype(np.float32)
    gy = rng.standard_normal((BATCH, COUT, SIZE, SIZE)).astype(np.float32)
    gp = rng.standard_normal((BATCH, CIN, SIZE // 2, SIZE // 2)).astype(np.float32)

    conv = geon_conv_step()
    tconv = torch_step(lambda a, b: F.conv2d(a, b, padding=1), x, w, gy)
    pool = geon_pool_step()
    tpool = torch_step(lambda a: F.max_pool2d(a, 2), x, gp)
    # the two sides agree before they are timed
    ty = tconv()
    np.testing.assert_allclose(conv(x, w, gy)[0], ty.detach().numpy(), rtol=1e-3, atol=1e-3)
    np.testing.assert_array_equal(pool(x, gp)[1], _pool_grad(x, gp))

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; NumPy "
          f"{np.__version__}")
    rows = []
    r = interleaved({"geon": lambda: conv(x, w, gy), "torch": tconv}, repeats=repeats)
    rows.append([f"conv2d {BATCH}x{CIN}x{SIZE}x{SIZE}, {COUT} filters 3x3, padding 1",
                 ms(r["geon"]), ms(r["torch"]), f"{r['geon'] / r['torch']:.2f}"])
    r = interleaved({"geon": lambda: pool(x, gp), "torch": tpool}, repeats=repeats)
    rows.append([f"max_pool2d {BATCH}x{CIN}x{SIZE}x{SIZE}, 2x2, stride 2",
                 ms(r["geon"]), ms(r["torch"]), f"{r['geon'] / r['torch']:.2f}"])
    table("Convolution and pooling, forward + backward, float32",
          ["op", "geon", "PyTorch eager", "geon / PyTorch"], rows)


def _pool_grad(x, g):
    """The derivative of 2x2 max pooling by its definition (first maximum)."""
    B, C, H, W = x.shape
    win = x.reshape(B, C, H // 2, 2, W // 2, 2).transpose(0, 1, 2, 4, 3, 5).reshape(
        B, C, H // 2, W // 2, 4)
    first = np.argmax(win, axis=-1)
    d = np.zeros(win.shape, x.dtype)
    np.put_along_axis(d, first[..., None], g[..., None], axis=-1)
    return d.reshape(B, C, H // 2, W // 2, 2, 2).transpose(0, 1, 2, 4, 3, 5).reshape(x.shape)


if __name__ == "__main__":
    main()
