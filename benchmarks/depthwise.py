"""Depthwise and 1 x 1 convolutions of MobileNet-like layers, geon against PyTorch eager
(CPU), forward and forward + backward.

``python -m benchmarks.depthwise`` from the repository root (``--quick`` for a smoke
test, ``--threads 0`` for each library's default threads). Each layer is one
convolution at batch 1 in float32, as in mobilenet_v2 and efficientnet_b0 at 224 x 224:
the depthwise layers (``groups`` = channels, 3 x 3 or 5 x 5, stride 1 or 2, "same"
padding), a few 1 x 1 layers and the first layer (3 input channels). Both sides compute
the result, and for "fwd + bwd" also the derivatives in the image and the filter for a
given output gradient, side by side in one process with interleaved repeats; the
tables give medians and ratios. With ``--threads 1`` (the default) PyTorch runs
``torch.set_num_threads(1)`` and geon ``GEON_NUM_THREADS=1`` (set before geon is
imported).
"""

import argparse
import os

import numpy as np

#: (channels, spatial size, kernel, stride): the depthwise layers of mobilenet_v2
#: (3 x 3) and efficientnet_b0 (5 x 5) at 224 x 224, and one 7 x 7 (ConvNeXt-like)
DEPTHWISE = [(32, 112, 3, 1), (96, 112, 3, 2), (144, 56, 3, 1), (144, 56, 5, 2),
             (192, 28, 3, 1), (240, 28, 5, 1), (384, 14, 3, 1), (576, 14, 3, 2),
             (672, 14, 5, 1), (960, 7, 3, 1), (1152, 7, 5, 1), (96, 28, 7, 1)]
#: (in channels, out channels, spatial size): 1 x 1 layers
POINTWISE = [(32, 16, 112), (144, 24, 56), (960, 160, 7)]
#: the first layer of both: 3 x 224 x 224 -> 32, 3 x 3, stride 2 (the derivative in
#: the image is not computed, as for a model's input)
STEM = (3, 32, 224)


def geon_steps(be, shape, wshape, stride, pad, groups, image_grad=True):
    """The geon computations of one convolution: forward, and forward + backward (the
    derivatives in the image, unless not ``image_grad``, and in the filter)."""
    x = be.np.placeholder(shape)
    w = be.np.placeholder(wshape)
    y = be.np.conv(x, w, stride=stride, padding=pad, groups=groups)
    g = be.np.placeholder(y.axes.lengths)
    grads = be.deriv(y, [x, w] if image_grad else [w], error=g)
    t = be.NumPyTransformer()
    return t.computation(y, x, w), t.computation([y] + grads, x, w, g), y.axes.lengths


def torch_steps(torch, x, w, g, stride, pad, groups, image_grad=True):
    """PyTorch eager: forward (no grad), forward + backward for the gradient g, and the
    filter whose ``grad`` the latter sets."""
    F = torch.nn.functional
    tx, tw, tg = (torch.from_numpy(a) for a in (x, w, g))
    lx, lw = tx.clone().requires_grad_(image_grad), tw.clone().requires_grad_()

    def forward():
        with torch.no_grad():
            return F.conv2d(tx, tw, stride=stride, padding=pad, groups=groups)

    def both():
        lx.grad = lw.grad = None
        y = F.conv2d(lx, lw, stride=stride, padding=pad, groups=groups)
        y.backward(tg)
        return y
    return forward, both, lw


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats and layers")
    parser.add_argument("--threads", type=int, default=1,
                        help="threads for each library (0: each library's default)")
    args = parser.parse_args(argv)
    if args.threads:
        os.environ["GEON_NUM_THREADS"] = str(args.threads)
    import torch

    import geon as be
    from benchmarks.common import interleaved, ms, table
    if args.threads:
        torch.set_num_threads(args.threads)
    repeats = 3 if args.quick else 15
    rng = np.random.default_rng(0)
    layers = [(f"depthwise {c}x{n}x{n}, {k}x{k}, stride {s}", (1, c, n, n),
               (c, 1, k, k), s, k // 2, c, True) for c, n, k, s in DEPTHWISE]
    layers += [(f"1x1 {c}x{n}x{n} -> {k}", (1, c, n, n), (k, c, 1, 1), 1, 0, 1, True)
               for c, k, n in POINTWISE]
    c, k, n = STEM
    layers.append((f"first layer {c}x{n}x{n} -> {k}, 3x3, stride 2 (no dx)",
                   (1, c, n, n), (k, c, 3, 3), 2, 1, 1, False))
    if args.quick:
        layers = layers[::4]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; geon "
          f"GEON_NUM_THREADS={os.environ.get('GEON_NUM_THREADS', 'unset')}; NumPy "
          f"{np.__version__}")
    rows = []
    for label, shape, wshape, stride, pad, groups, image_grad in layers:
        fwd, both, yshape = geon_steps(be, shape, wshape, stride, pad, groups, image_grad)
        x = rng.standard_normal(shape).astype(np.float32)
        w = (rng.standard_normal(wshape) * 0.1).astype(np.float32)
        g = rng.standard_normal(yshape).astype(np.float32)
        tfwd, tboth, tw = torch_steps(torch, x, w, g, stride, pad, groups, image_grad)
        # the two sides agree before they are timed
        want = tboth()
        got = both(x, w, g)
        np.testing.assert_allclose(got[0], want.detach().numpy(), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(got[-1], tw.grad.numpy(), rtol=1e-3, atol=1e-3)
        r = interleaved({"geon": lambda: fwd(x, w), "torch": tfwd,
                         "geon2": lambda: both(x, w, g), "torch2": tboth},
                        repeats=repeats)
        rows.append([label, ms(r["geon"]), ms(r["torch"]), f"{r['geon'] / r['torch']:.2f}",
                     ms(r["geon2"]), ms(r["torch2"]), f"{r['geon2'] / r['torch2']:.2f}"])
    table("Depthwise, 1x1 and first-layer convolution, batch 1, float32",
          ["layer", "geon fwd", "PyTorch fwd", "ratio", "geon fwd + bwd",
           "PyTorch fwd + bwd", "ratio"], rows)


if __name__ == "__main__":
    main()
