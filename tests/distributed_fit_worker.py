"""Runs under ``mpirun -n N python tests/distributed_fit_worker.py SCENARIO ...`` for
tests/test_distributed.py: the neon frontend's ``Model.fit`` with
``data_parallel=True`` (also imported by the tests for one process's reference).

Scenarios:
  fit OUT LOCAL_B CKPT  10 updates (2 epochs of 5 global batches) of an MLP (SGD with
                        momentum) and a CNN (Adam), float32 and float64, from
                        rank-dependent initial weights; rank 0 writes the losses,
                        accuracies, final Variables and evaluate() results to OUT (.npz),
                        ModelCheckpoint writes CKPT; progress goes to stdout
  bn OUT LOCAL_B        a CNN with BatchNorm: every rank's Variables, gathered on
                        rank 0, written to OUT (they must be identical)
"""

import sys

import numpy as np

import geon as be
from geon.frontends import neon as nn

EPOCHS, STEPS_PER_EPOCH = 2, 5


def data(rows, dtype, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, 2, 6, 6)).astype(dtype)
    y = rng.integers(0, 3, rows)
    return x, y


def make(kind, dtype, batch, rank, data_parallel):
    """A Model whose initial weights depend on ``rank`` (only the broadcast from rank
    0 makes the ranks agree)."""
    init = nn.GlorotUniform(seed=10 + rank)
    Y = be.Axis(3, name="Y")
    if kind == "mlp":
        layers = [nn.Flatten(name="flat"),
                  nn.Affine(12, activation="tanh", weight_init=init, name="h", dtype=dtype),
                  nn.Affine(Y, weight_init=init, name="out", dtype=dtype)]
        opt = nn.SGD(0.3, momentum=0.9)
    else:
        layers = [nn.Conv(4, 3, padding="same", weight_init=init, activation="relu",
                          name="conv", dtype=dtype)]
        if kind == "bn":
            layers.append(nn.BatchNorm(name="bn", dtype=dtype))
        layers += [nn.Pool(2, op="max", name="pool"), nn.Flatten(name="flat"),
                   nn.Affine(Y, weight_init=init, name="out", dtype=dtype)]
        opt = nn.Adam(0.02)
    C, H, W = be.Axis(2, name="C"), be.Axis(6, name="H"), be.Axis(6, name="W")
    return nn.Model(nn.Sequential(layers), [C, H, W], optimizer=opt, batch_size=batch,
                    dtype=dtype, data_parallel=data_parallel)


def fit(local_b, ranks=1, ckpt=None, verbose=False, data_parallel=False):
    """{name: array} of each (model, dtype): losses and accuracies of each epoch, the
    final Variables, and evaluate() on held-out data. ``ranks`` sets the size of the
    data (5 global batches of ``ranks * local_b``)."""
    out = {}
    for kind in ("mlp", "cnn"):
        for dtype in (np.float32, np.float64):
            rank = 0
            if data_parallel:
                import geon.distributed as gd
                rank = gd.world().rank
            model = make(kind, dtype, local_b, rank, data_parallel)
            x, y = data(STEPS_PER_EPOCH * ranks * local_b, dtype)
            callbacks = [nn.ModelCheckpoint(ckpt)] if ckpt and kind == "mlp" else []
            hist = model.fit((x, y), epochs=EPOCHS, seed=3, verbose=verbose,
                             stream=sys.stdout, callbacks=callbacks)
            key = f"{kind}_{np.dtype(dtype).name}"
            out[key + "_loss"] = np.array([h["loss"] for h in hist])
            out[key + "_accuracy"] = np.array([h["accuracy"] for h in hist])
            out[key + "_steps"] = np.array(model.step)
            for name, value in model.weights().items():
                out[key + "_" + name.replace("/", "|")] = value
            ev = model.evaluate(*data(23, dtype, seed=1))
            out[key + "_eval"] = np.array([ev["loss"], ev["accuracy"]])
    return out


def main(argv):
    import geon.distributed as gd
    from mpi4py import MPI
    from distributed_worker import CountingComm
    counter = CountingComm(MPI.COMM_WORLD)
    world = gd.init(counter)
    scenario, path, local_b = argv[0], argv[1], int(argv[2])
    if scenario == "fit":
        out = fit(local_b, world.size, ckpt=argv[3], verbose=True, data_parallel=True)
        out["allreduce_calls"] = np.array(counter.calls["Allreduce"])
    elif scenario == "bn":
        model = make("bn", np.float32, local_b, world.rank, True)
        x, y = data(STEPS_PER_EPOCH * world.size * local_b, np.float32)
        model.fit((x, y), epochs=EPOCHS, verbose=False)
        weights = model.weights()
        gathered = world.comm.gather(weights, root=0)
        out = {f"{r}_{k.replace('/', '|')}": v for r, w in enumerate(gathered or [])
               for k, v in w.items()}
    if world.rank == 0:
        np.savez(path, **out)


if __name__ == "__main__":
    main(sys.argv[1:])
