"""The benchmarks' workloads written for JAX, PyTensor and PyTorch, for the comparison
columns of ``python -m benchmarks.run``. None of these libraries is a dependency of
geon: :func:`available` says which are importable, and every builder here imports its
library only when called. Install them beside geon to get their columns::

    pip install jax jaxlib pytensor torch

Each builder returns a callable that runs one step (or one call) and waits for its
result (``block_until_ready`` for JAX), so that timings compare finished work.
"""

import importlib.util
import time

import numpy as np

from benchmarks import mlp

LIBS = ("jax", "pytensor", "torch")


def available():
    """The comparison libraries that can be imported here, in :data:`LIBS` order."""
    return [name for name in LIBS if importlib.util.find_spec(name) is not None]


def versions(libs):
    out = []
    for name in libs:
        try:
            mod = __import__(name)
            out.append(f"{name} {mod.__version__}")
        except Exception as e:  # a broken install shows up in the header, not as a crash
            out.append(f"{name} (import failed: {type(e).__name__})")
    return ", ".join(out)


# ---------------------------------------------------------------------------------------
# MLP training step: the model of benchmarks/mlp.py (weights [out, in], activations
# [features, batch]), ReLU, softmax cross-entropy averaged over the batch, SGD on all
# weights and biases, float32. Each returns (step, first_loss_fn): step(x, t) -> loss.


def jax_mlp(params):
    import jax
    import jax.numpy as jnp

    def loss_fn(ps, x, t):
        h = x
        for i, (W, b) in enumerate(ps):
            h = W @ h + b[:, None]
            if i < len(ps) - 1:
                h = jnp.maximum(h, 0.0)
        return -jnp.sum(t * jax.nn.log_softmax(h, axis=0)) / x.shape[1]

    def update(ps, x, t):
        loss, grads = jax.value_and_grad(loss_fn)(ps, x, t)
        return loss, jax.tree_util.tree_map(lambda p, g: p - mlp.LR * g, ps, grads)

    # the parameters are donated: XLA may update them in place, as geon and torch do
    fn = jax.jit(update, donate_argnums=0)
    state = [[(jnp.array(W), jnp.array(b)) for W, b in params]]
    dev = {}

    def step(x, t):
        key = id(x), id(t)
        if key not in dev:  # the data lives on the device, as geon's is already in NumPy
            dev.clear()
            dev[key] = jnp.asarray(x), jnp.asarray(t)
        loss, state[0] = fn(state[0], *dev[key])
        return float(loss.block_until_ready())

    return step


def pytensor_mlp(params, batch):
    import pytensor
    import pytensor.tensor as pt

    x = pt.matrix("x", dtype="float32")
    t = pt.matrix("t", dtype="float32")
    shared = [(pytensor.shared(W.copy(), name=f"W{i}"), pytensor.shared(b.copy(), name=f"b{i}"))
              for i, (W, b) in enumerate(params)]
    h = x
    for i, (W, b) in enumerate(shared):
        h = pt.dot(W, h) + b[:, None]
        if i < len(shared) - 1:
            h = pt.maximum(h, np.float32(0))
    loss = -pt.sum(t * pt.special.log_softmax(h, axis=0)) / np.float32(batch)
    ps = [p for pair in shared for p in pair]
    grads = pytensor.grad(loss, ps)
    f = pytensor.function([x, t], loss,
                          updates=[(p, p - np.float32(mlp.LR) * g) for p, g in zip(ps, grads)])
    return lambda x, t: float(f(x, t))


def torch_mlp(params):
    import torch

    ps = [torch.tensor(a.copy(), requires_grad=True) for pair in params for a in pair]

    def step(x, t):
        xt, tt = torch.from_numpy(x), torch.from_numpy(t)
        h = xt
        n = len(ps) // 2
        for i in range(n):
            h = ps[2 * i] @ h + ps[2 * i + 1][:, None]
            if i < n - 1:
                h = torch.relu(h)
        loss = -(tt * torch.log_softmax(h, dim=0)).sum() / x.shape[1]
        grads = torch.autograd.grad(loss, ps)
        with torch.no_grad():
            for p, g in zip(ps, grads):
                p.sub_(g, alpha=mlp.LR)
        return float(loss.detach())

    return step


def mlp_step(lib, params, batch):
    """The training step in ``lib`` from a copy of ``params`` (a list of (W, b))."""
    if lib == "jax":
        return jax_mlp(params)
    if lib == "pytensor":
        return pytensor_mlp(params, batch)
    return torch_mlp(params)


# ---------------------------------------------------------------------------------------
# Elementwise chains: benchmarks.run.CHAIN (name, constant) applied in order.


def _ops(lib):
    """name -> function(x, c) for ``lib``: the same elementwise ops in its spelling."""
    if lib == "jax":
        import jax
        import jax.numpy as jnp
        un = {"tanh": jnp.tanh, "exp": jnp.exp, "log": jnp.log, "square": jnp.square,
              "sqrt": jnp.sqrt, "abs": jnp.abs, "sigmoid": jax.nn.sigmoid}
        bi = {"maximum": jnp.maximum, "minimum": jnp.minimum}
    elif lib == "pytensor":
        import pytensor.tensor as pt
        un = {"tanh": pt.tanh, "exp": pt.exp, "log": pt.log, "square": pt.square,
              "sqrt": pt.sqrt, "abs": pt.abs, "sigmoid": pt.sigmoid}
        bi = {"maximum": pt.maximum, "minimum": pt.minimum}
    else:
        import torch
        un = {"tanh": torch.tanh, "exp": torch.exp, "log": torch.log,
              "square": torch.square, "sqrt": torch.sqrt, "abs": torch.abs,
              "sigmoid": torch.sigmoid}
        bi = {"maximum": torch.clamp_min, "minimum": torch.clamp_max}
    ops = {k: (lambda x, c, f=f: f(x)) for k, f in un.items()}
    ops.update({k: (lambda x, c, f=f: f(x, c)) for k, f in bi.items()})
    ops.update({"mul": lambda x, c: x * c, "add": lambda x, c: x + c,
                "sub": lambda x, c: x - c})
    return ops


def _apply(chain, x, lib):
    ops = _ops(lib)
    # float32 constants keep PyTensor in float32 (a Python float would upcast to
    # float64); JAX and torch keep the array's dtype either way
    cast = float if lib == "torch" else np.float32
    for name, c in chain:
        x = ops[name](x, None if c is None else cast(c))
    return x


def chain_fn(lib, chain, n):
    """A compiled (JAX, PyTensor) or eager (torch) function of a float32 vector of length
    ``n`` applying ``chain``; returns (f, seconds to build and compile it, first call
    included). f takes and returns NumPy-convertible arrays and waits for its result."""
    t0 = time.perf_counter()
    probe = np.linspace(0.1, 0.9, n, dtype=np.float32)
    if lib == "jax":
        import jax
        import jax.numpy as jnp
        g = jax.jit(lambda x: _apply(chain, x, "jax"))
        dev = {}

        def f(x):
            if id(x) not in dev:
                dev.clear()
                dev[id(x)] = jnp.asarray(x)
            return g(dev[id(x)]).block_until_ready()
    elif lib == "pytensor":
        import pytensor
        import pytensor.tensor as pt
        xv = pt.vector("x", dtype="float32")
        f = pytensor.function([xv], _apply(chain, xv, "pytensor"))
    else:
        import torch

        def f(x):
            return _apply(chain, torch.from_numpy(x), "torch")
    f(probe)
    return f, time.perf_counter() - t0


def add_one(lib):
    """``x + 1`` on a one-element float32 vector: (f, argument)."""
    x = np.ones(1, np.float32)
    if lib == "jax":
        import jax
        import jax.numpy as jnp
        g = jax.jit(lambda v: v + 1)
        xd = jnp.asarray(x)
        g(xd).block_until_ready()
        return (lambda: g(xd).block_until_ready()), xd
    if lib == "pytensor":
        import pytensor
        import pytensor.tensor as pt
        v = pt.vector("x", dtype="float32")
        f = pytensor.function([v], v + np.float32(1))
        return (lambda: f(x)), x
    import torch
    xt = torch.from_numpy(x)
    return (lambda: xt + 1), xt
