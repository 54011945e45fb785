"""MLP training step, 784-512-512-10, ReLU, softmax cross-entropy, SGD on all weights
and biases, float32: geon against hand-written NumPy, plus the matrix products alone
(:func:`gemms_only`)."""

import numpy as np

import geon as be

SIZES = (784, 512, 512, 10)
LR = 0.01


def layer_params(i, seed=0):
    """Weights and bias of layer ``i`` (deterministic; He initialization)."""
    rng = np.random.default_rng((seed, i))
    fan_in, fan_out = SIZES[i], SIZES[i + 1]
    W = rng.standard_normal((fan_out, fan_in)).astype(np.float32)
    return W * np.float32(np.sqrt(2.0 / fan_in)), np.zeros(fan_out, np.float32)


def init_params(seed=0):
    return [layer_params(i, seed) for i in range(len(SIZES) - 1)]


def data(batch, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((SIZES[0], batch)).astype(np.float32)
    t = np.eye(SIZES[-1], dtype=np.float32)[rng.integers(0, SIZES[-1], batch)].T.copy()
    return x, t


def layers(x, axes, params=None):
    """The network's logits on ``x`` (over ``axes[0]`` and a batch axis) and its
    Variables: ``(h, [W0, b0, W1, ...])``."""
    h, variables = x, []
    n = len(SIZES) - 1
    for i in range(n):
        if params is not None:
            W, b = params[i]
        else:
            W, b = (lambda shape, i=i: layer_params(i)[0]), 0.0
        Wv = be.Variable(axes=[axes[i + 1], axes[i]], initial_value=W, name=f"W{i}")
        bv = be.Variable(axes=[axes[i + 1]], initial_value=b, name=f"b{i}")
        variables += [Wv, bv]
        h = be.dot(Wv, h) + bv
        if i < n - 1:
            h = be.maximum(h, 0.0)
    return h, variables


def geon_step(batch, params=None, transformer=None):
    """The geon training step: returns (computation, transformer). Without ``params``
    the variables are initialized by callables, so no second copy is kept."""
    axes = [be.Axis(n, f"L{i}") for i, n in enumerate(SIZES)]
    N = be.Axis(batch, "N", batch=True)
    x = be.placeholder([axes[0], N], name="x")
    t = be.placeholder([axes[-1], N], name="t")
    h, variables = layers(x, axes, params)
    y = be.softmax(h)
    loss = be.sum(be.cross_entropy_multi(y, t), out_axes=()) / batch
    updates = [be.SetItem(v, v - LR * be.deriv(loss, v)) for v in variables]
    tr = transformer or be.NumPyTransformer()
    return tr.computation([loss] + updates, x, t), tr


def numpy_step(params, copy=True):
    """Hand-written NumPy, the natural way: ``@``, ``np.maximum``, new arrays."""
    if copy:
        params = [(W.copy(), b.copy()) for W, b in params]

    def step(x, t):
        acts, pre = [x], []
        h = x
        for i, (W, b) in enumerate(params):
            z = W @ h + b[:, None]
            pre.append(z)
            h = np.maximum(z, 0) if i < len(params) - 1 else z
            acts.append(h)
        z = acts[-1]
        e = np.exp(z - z.max(axis=0, keepdims=True))
        p = e / e.sum(axis=0, keepdims=True)
        batch = x.shape[1]
        loss = -np.sum(t * np.log(p)) / batch
        d = (p - t) / batch
        for i in reversed(range(len(params))):
            W, b = params[i]
            dW = d @ acts[i].T
            db = d.sum(axis=1)
            if i:
                d = (W.T @ d) * (pre[i - 1] > 0)
            W -= LR * dW
            b -= LR * db
        return loss

    return step


def gemms_only(batch, seed=2):
    """Only the eight matrix products of geon's step at ``batch``, called the way geon's
    NumPy transformer calls them (``np.matmul`` into preallocated outputs, transposed
    views in the backward pass; the list is benchmarks.gemm.STEP_GEMMS): the time the
    step would take if everything but its GEMMs were free."""
    from benchmarks.gemm import gemms

    rng = np.random.default_rng(seed)
    calls = []
    for _, m, k, n, ta, tb in gemms(batch):
        a = rng.standard_normal((k, m) if ta else (m, k), dtype=np.float32)
        b = rng.standard_normal((n, k) if tb else (k, n), dtype=np.float32)
        calls.append((a.T if ta else a, b.T if tb else b, np.empty((m, n), np.float32)))

    def step(x=None, t=None):
        for a, b, c in calls:
            np.matmul(a, b, out=c)

    return step
