"""Runs under ``mpirun -n N python tests/distributed_worker.py SCENARIO ...`` for
tests/test_distributed.py (also imported by it to compute one process's reference).

Scenarios:
  train OUT LOCAL_B [SAVE]  10 SGD steps of an MLP and a small CNN, in float32 and
                            float64, from rank-dependent initial weights synchronized
                            from rank 0; rank 0 writes losses, final Variables and the
                            MPI call counts to OUT (.npz); SAVE: a checkpoint path
  restore CKPT OUT          restore CKPT on every rank; rank 0 writes the Variables
  fail                      rank 1 raises while rank 0 waits in an allreduce
"""

import sys

import numpy as np

import geon as be

STEPS, ROWS, SEED = 10, 120, 3


class CountingComm:
    """An mpi4py communicator that counts the collective calls made through it."""

    def __init__(self, comm):
        self.comm, self.calls = comm, {"Allreduce": 0, "Bcast": 0}

    def __getattr__(self, name):
        attr = getattr(self.comm, name)
        if name not in self.calls:
            return attr

        def counted(*args, **kwargs):
            self.calls[name] += 1
            return attr(*args, **kwargs)
        return counted


def data(dtype):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((ROWS, 4, 6, 6)).astype(dtype)
    y = rng.integers(0, 3, ROWS)
    return x, y


def model(kind, dtype, rank, local_b):
    """(cost over the local batch, variables, placeholders) of one model; the initial
    weights depend on the rank, so that only sync_variables makes them agree."""
    rng = np.random.default_rng(100 + rank)
    N = be.Axis(local_b, "N", batch=True)
    C, H, W, Y = be.Axis(4, "C"), be.Axis(6, "H"), be.Axis(6, "W"), be.Axis(3, "Y")
    x = be.placeholder([N, C, H, W], dtype=dtype, name="x")
    labels = be.placeholder([N], dtype=np.int64, name="labels")

    def var(axes, name):
        shape = tuple(a.length for a in axes)
        return be.Variable(axes, dtype=dtype, name=name,
                           initial_value=0.3 * rng.standard_normal(shape).astype(dtype))
    if kind == "mlp":
        Hd = be.Axis(16, "Hd")
        w1, b1 = var([Hd, C, H, W], "w1"), var([Hd], "b1")
        w2, b2 = var([Y, Hd], "w2"), var([Y], "b2")
        h = be.tanh(be.dot(w1, x) + b1)
        logits = be.dot(w2, h) + b2
        vs = [w1, b1, w2, b2]
    else:
        K, R, S = be.Axis(5, "K"), be.Axis(3, "R"), be.Axis(3, "S")
        f, b = var([C, R, S, K], "f"), var([K], "bf")
        h = be.relu(be.conv(x, f, C, [H, W], K, padding=1) + b)
        pooled = be.mean(h, reduction_axes=h.axes - [N, K])
        w2, b2 = var([Y, K], "w2"), var([Y], "b2")
        logits = be.dot(w2, pooled) + b2
        vs = [f, b, w2, b2]
    probs = be.softmax(logits, Y)
    cost = be.mean(be.cross_entropy_multi(probs, be.one_hot(labels, Y)), out_axes=())
    return cost, vs, (x, labels)


def train(local_b, size=None, rank=None, save=None):
    """{name: array}: losses and final Variables of each (model, dtype)."""
    import geon.distributed as gd
    out = {}
    for kind in ("mlp", "cnn"):
        for dtype in (np.float32, np.float64):
            cost, vs, (x, labels) = model(kind, dtype, gd.world().rank, local_b)
            t = be.make_transformer("numpy")
            updates = gd.data_parallel(cost, vs, learning_rate=0.5)
            # the loss of the global batch: the mean of the ranks' local means
            step = t.computation([be.allreduce(cost, "mean")] + updates, x, labels)
            gd.sync_variables(t)
            X, Y = data(dtype)
            losses, epoch = [], 0
            while len(losses) < STEPS:
                for xb, yb in gd.sharded_batches([X, Y], local_b, epoch=epoch, seed=SEED,
                                                 rank=rank, size=size):
                    losses.append(step(xb, yb)[0])
                    if len(losses) == STEPS:
                        break
                epoch += 1
            out[f"{kind}_{np.dtype(dtype).name}_loss"] = np.array(losses)
            for v in vs:
                out[f"{kind}_{np.dtype(dtype).name}_{v.name}"] = t.state[v].copy()
            if save and kind == "mlp" and dtype is np.float64:
                gd.save(t, save)
    return out


def main(argv):
    import geon.distributed as gd
    counter = CountingComm(__import__("mpi4py.MPI").MPI.COMM_WORLD)
    world = gd.init(counter)
    if argv[0] == "train":
        out = train(int(argv[2]), save=argv[3] if len(argv) > 3 else None)
        out["allreduce_calls"] = np.array(counter.calls["Allreduce"])
        out["bcast_calls"] = np.array(counter.calls["Bcast"])
    elif argv[0] == "restore":
        cost, vs, _ = model("mlp", np.float64, world.rank, 1)
        t = be.make_transformer("numpy")
        t.computation(cost.variables())
        gd.restore(t, argv[1])
        out = {v.name: t.state[v].copy() for v in vs}
        out["size"] = np.array(world.size)
    elif argv[0] == "fail":
        if world.rank == 1:
            raise ValueError("rank 1 broke on purpose")
        x = be.placeholder([be.Axis(3, "C")], dtype=np.float64, name="x")
        be.make_transformer("numpy").computation(be.allreduce(x), x)(np.ones(3))
        return
    if world.rank == 0:
        np.savez(argv[1] if argv[0] == "train" else argv[2], **out)


if __name__ == "__main__":
    main(sys.argv[1:])
