"""Training steps on a machine another process keeps busy: geon's thread policy
(geon/transformers/threads.py) against the same code with the policy's load
measurement off, side by side with PyTorch and JAX (where installed) in the same
process, idle and loaded: the MLP step of benchmarks/mlp.py, and the digits CNN
(geon.examples.digits_cnn) against the same network in PyTorch (no JAX version).

Each configuration runs in its own process (the policy is per process):
``GEON_ADAPT_THREADS=1`` (the default) or ``0`` (always the budget: every core). In
the loaded phases a second Python process spins on one core for the whole phase. The
table gives medians (minimums) of interleaved repeats and geon's ratio to each
library measured in the same process; the last columns divide each ratio under load by
the idle one (the target for the ratio to JAX is at most 1.3).

    python -m benchmarks.load [--batches 128 1024] [--cnn-batches 32] [--repeats 31]
"""

import argparse
import json
import os
import subprocess
import sys
import time

from benchmarks.common import interleaved_stats, ms, table


def _cnn_steps(batch):
    """The digits CNN's training step (geon.examples.digits_cnn: two 3x3 convolutions
    with BatchNorm and ReLU, max pooling, dropout, a dense layer, Adam) in geon, and
    the same network in PyTorch where installed: {name: step()}."""
    import types

    import numpy as np

    from benchmarks import compare
    from geon.examples import digits_cnn

    rng = np.random.default_rng(0)
    x = rng.random((batch, 1, 8, 8), dtype=np.float32)
    y = rng.integers(0, 10, batch)
    args = types.SimpleNamespace(channels=16, seed=0, lr=0.005, batch_size=batch,
                                 transformer="numpy", data_parallel=False)
    comp = digits_cnn.build_model(args).train_computation(batch)
    steps = {"geon": lambda: comp(x, y)}
    if "torch" in compare.available():
        import torch
        from torch import nn
        torch.manual_seed(0)
        net = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                            nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16),
                            nn.ReLU(), nn.MaxPool2d(2), nn.Dropout(0.25), nn.Flatten(),
                            nn.Linear(16 * 4 * 4, 10))
        opt = torch.optim.Adam(net.parameters(), lr=0.005)
        tx, ty = torch.from_numpy(x), torch.from_numpy(y)

        def torch_step():
            opt.zero_grad()
            loss = nn.functional.cross_entropy(net(tx), ty)
            loss.backward()
            opt.step()
            return float(loss)
        steps["torch"] = torch_step
    return steps


def worker(batch, repeats, model="mlp"):
    """Time geon's step and the other libraries' in this process; print JSON."""
    from benchmarks import compare, mlp
    from geon.transformers import threads

    if model == "cnn":
        fns = _cnn_steps(batch)
    else:
        params = mlp.init_params()
        x, t = mlp.data(batch)
        comp, _ = mlp.geon_step(batch, params)
        fns = {"geon": lambda: comp(x, t)}
        for lib in ("torch", "jax"):
            if lib in compare.available():
                step = compare.mlp_step(lib, params, batch)
                fns[lib] = lambda step=step: step(x, t)
    # a pause before each sample lets the previous library's spinning threads go idle
    stats = interleaved_stats(fns, repeats=repeats, warmup=3, gap=0.05)
    print(json.dumps({"stats": stats, "threads": threads.POLICY.threads,
                      "changes": threads.POLICY.changes}))


def _run(batch, repeats, adapt, model):
    env = dict(os.environ, GEON_ADAPT_THREADS="1" if adapt else "0")
    out = subprocess.run([sys.executable, "-m", "benchmarks.load", "--worker",
                          str(batch), "--repeats", str(repeats), "--model", model],
                         capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _spinner():
    """A process that keeps one core busy until killed."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=int, nargs="+", default=[128, 1024],
                   help="MLP batch sizes")
    p.add_argument("--cnn-batches", type=int, nargs="*", default=[32],
                   help="batch sizes of the digits CNN (its training batch is 32)")
    p.add_argument("--repeats", type=int, default=31)
    p.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    p.add_argument("--model", default="mlp", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args.worker, args.repeats, args.model)
        return
    print(f"{os.cpu_count()} CPUs, {len(os.sched_getaffinity(0))} in this process's "
          f"affinity mask")
    runs = [("mlp", b) for b in args.batches] + [("cnn", b) for b in args.cnn_batches]
    for model, batch in runs:
        rows, idle_ratio = [], {}
        for loaded in (False, True):
            spinner = _spinner() if loaded else None
            try:
                # let the spinner take its core, or the machine settle after one
                time.sleep(0.5 if spinner else 2.0)
                for adapt in (True, False):
                    r = _run(batch, args.repeats, adapt, model)
                    st = r["stats"]
                    g = st["geon"]
                    cells = {lib: f"{ms(v[0])} ({ms(v[1])})" for lib, v in st.items()}
                    ratios = {lib: g[0] / v[0] for lib, v in st.items() if lib != "geon"}
                    key = "adaptive" if adapt else "all cores"
                    if not loaded:
                        idle_ratio[key] = ratios
                    drift = {lib: f"{v / idle_ratio[key][lib]:.2f}"
                             for lib, v in ratios.items() if loaded}
                    rows.append(["loaded" if loaded else "idle", key, r["threads"],
                                 cells["geon"]]
                                + [cells.get(lib, "-") for lib in ("torch", "jax")]
                                + [f"{ratios[lib]:.2f}" if lib in ratios else "-"
                                   for lib in ("torch", "jax")]
                                + [drift.get(lib, "-") for lib in ("torch", "jax")])
            finally:
                if spinner:
                    spinner.kill()
                    spinner.wait()
        name = "MLP step (784-512-512-10)" if model == "mlp" else "digits CNN step"
        table(f"{name} at batch {batch}, float32: median (minimum) per step",
              ["machine", "geon policy", "threads at the end", "geon", "torch", "jax",
               "geon / torch", "geon / jax", "loaded / idle of geon / torch",
               "loaded / idle of geon / jax"], rows)


if __name__ == "__main__":
    main()
