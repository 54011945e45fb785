import time, sys, numpy as np, geon as be
from benchmarks import mlp
batch = int(sys.argv[1]); modes = [(m if m == "auto" else m == "1") for m in sys.argv[2:4]]
params = mlp.init_params(); x, t = mlp.data(batch)
a, _ = mlp.geon_step(batch, params, be.NumPyTransformer(compiled=modes[0]))
b, _ = mlp.geon_step(batch, params, be.NumPyTransformer(compiled=modes[1]))
print("kernels", a.source.count("# compiled:"), b.source.count("# compiled:"))
g = mlp.gemms_only(batch)
for f in (a, b): f(x, t); f(x, t)
ta, tb, tg = [], [], []
n = int(sys.argv[4]) if len(sys.argv) > 4 else 300
for i in range(n):
    for f, ts in ((a, ta), (b, tb), (g, tg)) if i % 2 else ((b, tb), (g, tg), (a, ta)):
        t0 = time.perf_counter(); f(x, t); ts.append(time.perf_counter() - t0)
ta, tb, tg = map(np.array, (ta, tb, tg))
d = tb - ta
print(f"batch {batch}: {modes[0]} {np.median(ta)*1e3:.3f} {modes[1]} {np.median(tb)*1e3:.3f} gemms {np.median(tg)*1e3:.3f} ms; "
      f"median diff {np.median(d)*1e3:+.3f} ms, second faster in {np.mean(d<0)*100:.0f}%; min {ta.min()*1e3:.3f} {tb.min()*1e3:.3f} {tg.min()*1e3:.3f}")
