"""Wall time per statement of a NumPy computation's generated ``run``: where the MLP
training step spends its time, GEMMs and fused groups line by line.

    python -m benchmarks.linetime            # batch 1024, 50 steps
    python -m benchmarks.linetime --batch 128 --steps 200 [--compiled | --numpy]

The step is generated as the NumPy transformer does by default (``compiled="auto"``);
``--compiled`` compiles small groups too (``compiled=True``), ``--numpy`` gives the
NumPy code alone (``compiled=False``).

Each top-level statement of ``run`` (a NumPy call, a fused group's ``_run_blocks``, a
guarded BLAS update) gets a clock reading before it; the table gives the mean per step
of each, slowest first. The readings add about a microsecond per statement, so use it
to compare statements, not to time the step (``benchmarks.run`` does that). The step
is generated without segments (``geon/transformers/numpy/segments.py``), whose runs of
calls would be one statement each.
"""

import argparse
import re
import time

from benchmarks import mlp


def instrument(comp):
    """``(run, labels, totals)``: ``comp``'s generated ``run`` with a clock reading
    before each top-level statement, the statements' first lines, and the dict of
    seconds per statement index it fills as it runs."""
    labels, lines, inside = [], [], False
    for line in comp.source.splitlines():
        if line.startswith("def run("):
            inside = True
        stripped = line.strip()
        if inside and line.startswith(" " * 8) and not line.startswith(" " * 9):
            if stripped.startswith("_r ="):
                lines.append("        _tick(-1)")
            elif not stripped.startswith(("_last", "return", "#", "elif ", "else:",
                                          "except", "finally:")):
                # (a clause continuing a statement takes no statement before it)
                labels.append(re.split(r"\s+# ", stripped)[0])
                lines.append(f"        _tick({len(labels) - 1})")
        lines.append(line)
    totals = {}
    state = [None, 0.0]  # statement running, when it started

    def _tick(k):
        now = time.perf_counter()
        if state[0] is not None:
            totals[state[0]] = totals.get(state[0], 0.0) + now - state[1]
        state[0] = None if k == -1 else k
        state[1] = time.perf_counter()

    ns = comp._ns  # the generated module's globals: arenas, constants, helpers
    ns["_tick"] = _tick
    exec(compile("\n".join(lines) + "\n", "<linetime>", "exec"), ns)
    ns["setup"]()
    return ns["run"], labels, totals


def is_product(statement):
    """Whether a statement of the generated step is one of its matrix products:
    ``np.matmul`` (but not a sum written as a product with a vector of ones), the
    accumulating ``_gemm_acc`` or the short-side kernel ``_skinny``."""
    return ("np.matmul(" in statement and "_ones_" not in statement
            or "_gemm_acc(" in statement or "_skinny(" in statement)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=50)
    how = ap.add_mutually_exclusive_group()
    how.add_argument("--compiled", dest="mode", action="store_const", const=True,
                     default="auto", help="NumPyTransformer(compiled=True)")
    how.add_argument("--numpy", dest="mode", action="store_const", const=False,
                     help="NumPyTransformer(compiled=False)")
    ap.add_argument("--top", type=int, default=25, help="rows shown")
    args = ap.parse_args(argv)
    import geon as be
    from geon.transformers.numpy import segments
    was, segments.ENABLED = segments.ENABLED, False   # each statement in run() itself
    try:
        comp, _ = mlp.geon_step(args.batch,
                                transformer=be.NumPyTransformer(compiled=args.mode))
    finally:
        segments.ENABLED = was
    x, t = mlp.data(args.batch)
    comp(x, t)  # allocates and initializes
    run, labels, totals = instrument(comp)
    for _ in range(3):
        run(x, t)
    totals.clear()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        run(x, t)
    step = (time.perf_counter() - t0) / args.steps
    gemm = sum(v for k, v in totals.items() if is_product(labels[k])) / args.steps
    print(f"MLP step at batch {args.batch}: {step * 1e3:.3f} ms per step with the "
          f"readings; matrix products {gemm * 1e3:.3f} ms, the rest "
          f"{(step - gemm) * 1e3:.3f} ms")
    print("| ms per step | statement |\n|---|---|")
    for k, v in sorted(totals.items(), key=lambda kv: -kv[1])[:args.top]:
        print(f"| {v / args.steps * 1e3:.3f} | `{labels[k][:100]}` |")


if __name__ == "__main__":
    main()
