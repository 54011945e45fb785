"""A model zoo exported from PyTorch to ONNX and imported with geon, timed against
PyTorch eager and ONNX Runtime in the same process.

Models (random weights, no downloads): torchvision resnet18, mobilenet_v2 and
efficientnet_b0 at 64x64, a small torchvision VisionTransformer and ViT-B/16 at one
224x224 image (``vit_b_16``: run only when asked with ``--only``, it takes a
minute per library and thread setting), Hugging Face BERT
(eager attention, and the default sdpa attention with an attention mask) and GPT-2
with 2 layers of hidden size 128, and a 2-layer LSTM. Each is exported with
``torch.onnx.export`` (the TorchScript exporter, opset 17) and imported with
:func:`geon.frontends.onnx.import_model`; its outputs are checked against PyTorch's.

Per model, in one process per thread setting (``--threads 1``: one thread for every
library, geon's included; ``0``: each library's default), interleaved repeats give
medians (minimums) of one forward in geon, PyTorch eager and ONNX Runtime; the import
and first call against ONNX Runtime's session creation and first run; and, with
``--train``, one fine-tuning step (the mean square of the first output, backward, SGD
on every float weight) against PyTorch's; with ``--memory``, the peak memory of
importing the model and running one forward, geon against ONNX Runtime, each in a
fresh process.

Needs torch==2.13.0, torchvision==0.28.0, transformers and onnxruntime (benchmark-only
dependencies, never geon's)::

    python -m benchmarks.models [--threads 1 0] [--repeats 11] [--train] [--memory]
                                [--only resnet18 ...]
"""

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

MODELS = ["resnet18", "mobilenet_v2", "efficientnet_b0", "vit_small", "bert_eager",
          "bert_sdpa_mask", "gpt2", "lstm"]
#: Models run only when ``--only`` names them.
LARGE = ["vit_b_16"]


def _torchvision():
    """Import torchvision. Its wheel's C extension does not load beside the CPU build of
    torch, and its Python part registers fake kernels for two of that extension's
    operators; the classifiers never call them, so they are defined here first (as
    schemas only) when they are missing."""
    import torch
    for name, schema in (("nms", "nms(Tensor dets, Tensor scores, float iou_threshold) "
                                 "-> Tensor"),
                         ("qnms", "qnms(Tensor dets, Tensor scores, float iou_threshold) "
                                  "-> Tensor")):
        try:
            torch.ops.torchvision.__getattr__(name)
        except (AttributeError, RuntimeError):
            lib = torch.library.Library("torchvision", "FRAGMENT")
            lib.define(schema)
            _LIBS.append(lib)
    import torchvision
    return torchvision


_LIBS = []  # the stand-in libraries stay alive while the process runs


def build(name):
    """``(module, inputs, input_names)`` of zoo model ``name`` in eval mode."""
    import torch
    torch.manual_seed(0)
    if name in ("resnet18", "mobilenet_v2", "efficientnet_b0"):
        tv = _torchvision()
        m = getattr(tv.models, name)(weights=None, num_classes=10)
        return m.eval(), (torch.randn(2, 3, 64, 64),), ["x"]
    if name == "vit_small":
        tv = _torchvision()
        m = tv.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2,
                                        num_heads=4, hidden_dim=64, mlp_dim=128,
                                        num_classes=10)
        torch.nn.init.normal_(m.heads.head.weight, std=0.02)  # (zeros in torchvision)
        return m.eval(), (torch.randn(2, 3, 32, 32),), ["x"]
    if name == "vit_b_16":
        m = _torchvision().models.vit_b_16(weights=None)
        torch.nn.init.normal_(m.heads.head.weight, std=0.02)
        return m.eval(), (torch.randn(1, 3, 224, 224),), ["x"]
    if name.startswith(("bert", "gpt2")):
        _torchvision()  # transformers imports torchvision where it is installed
    if name.startswith("bert"):
        from transformers import BertConfig, BertModel
        attn = "eager" if name == "bert_eager" else "sdpa"
        cfg = BertConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=2,
                         num_attention_heads=2, intermediate_size=256,
                         max_position_embeddings=64, attn_implementation=attn)
        m = BertModel(cfg, add_pooling_layer=False).eval()
        ids = torch.randint(0, 1000, (2, 32))
        if name == "bert_eager":
            return _Wrapped(m), (ids,), ["input_ids"]
        mask = torch.ones(2, 32, dtype=torch.int64)
        mask[1, 24:] = 0
        return _Wrapped(m), (ids, mask), ["input_ids", "attention_mask"]
    if name == "gpt2":
        from transformers import GPT2Config, GPT2Model
        cfg = GPT2Config(vocab_size=1000, n_embd=128, n_layer=2, n_head=2, n_positions=64)
        m = GPT2Model(cfg).eval()
        # an attention mask given (without one the model looks for packed sequences
        # with aten::diff, which the TorchScript exporter does not export)
        mask = torch.ones(2, 32, dtype=torch.int64)
        return _Wrapped(m, use_cache=False), (torch.randint(0, 1000, (2, 32)), mask), \
            ["input_ids", "attention_mask"]
    if name == "lstm":
        m = torch.nn.LSTM(32, 64, num_layers=2, batch_first=True).eval()
        return _FirstOutput(m), (torch.randn(4, 16, 32),), ["x"]
    raise ValueError(f"no model {name!r}; the zoo: {', '.join(MODELS + LARGE)}")


def _Wrapped(model, positional=("input_ids", "attention_mask"), **kwargs):
    """A module returning a Hugging Face model's ``last_hidden_state`` only; its
    arguments are passed by the names ``positional``."""
    import torch

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *args):
            named = dict(zip(positional, args))
            return self.model(return_dict=True, **named, **kwargs).last_hidden_state
    return Wrapped().eval()


def _FirstOutput(module):
    import torch

    class First(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.module = module

        def forward(self, x):
            return self.module(x)[0]
    return First().eval()


def export(module, inputs, names):
    """The ONNX bytes of ``module`` (TorchScript exporter, opset 17)."""
    import torch
    buf = io.BytesIO()
    # (PyTorch's fused attention kernel in eval mode has no ONNX export: the exporter
    # gets the composite form)
    torch.backends.mha.set_fastpath_enabled(False)
    with torch.no_grad():
        torch.onnx.export(module, inputs, buf, dynamo=False, opset_version=17,
                          input_names=names)
    return buf.getvalue()


def _stats(fns, repeats):
    for f in fns.values():
        f()
    samples = {k: [] for k in fns}
    for _ in range(repeats):
        for k, f in fns.items():
            t0 = time.perf_counter()
            f()
            samples[k].append(time.perf_counter() - t0)
    return {k: (statistics.median(v), min(v)) for k, v in samples.items()}


def run_model(name, threads, repeats, train, memory=False):
    """The measurements of one model in this process, as a dict."""
    import onnxruntime as ort
    import torch

    import geon as be
    from geon.frontends.onnx import import_model

    module, inputs, names = build(name)
    data = export(module, inputs, names)
    feeds = [t.numpy() for t in inputs]
    with torch.no_grad():
        want = module(*inputs).numpy()

    t0 = time.perf_counter()
    g = import_model(data)
    comp = be.NumPyTransformer().computation(g.outputs[0], *g.inputs)
    got = comp(*feeds)
    geon_first = time.perf_counter() - t0

    opts = ort.SessionOptions()
    if threads:
        opts.intra_op_num_threads = opts.inter_op_num_threads = threads
    t0 = time.perf_counter()
    sess = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
    ort_feeds = {i.name: f for i, f in zip(sess.get_inputs(), feeds)}
    sess.run(None, ort_feeds)
    ort_first = time.perf_counter() - t0

    err = float(np.max(np.abs(got - want)) / (np.max(np.abs(want)) or 1.0))

    def torch_forward():
        with torch.no_grad():
            module(*inputs)

    r = {"model": name, "max_rel_err": err, "geon_first": geon_first,
         "ort_first": ort_first,
         "forward": _stats({"geon": lambda: comp(*feeds), "torch": torch_forward,
                            "ort": lambda: sess.run(None, ort_feeds)}, repeats)}
    if train:
        r["train"] = _train_step(be, g, feeds, module, inputs, repeats)
    if memory:
        r["memory"] = {lib: _peak_memory(lib, data, feeds, threads) for lib in ("geon", "ort")}
    return r


#: Run in a fresh process: load the libraries, then import the model and run one
#: forward; print how much the process's peak resident memory grew meanwhile (bytes).
_MEMORY_PROBE = """
import sys
import numpy as np


def hwm():  # the process's peak resident memory so far (bytes), from /proc
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f
                    if line.startswith("VmHWM:"))


lib, path = sys.argv[1], sys.argv[2]
data = open(path, "rb").read()
with np.load(path + ".npz") as z:
    feeds = [z[k] for k in sorted(z.files, key=lambda k: int(k[4:]))]
if lib == "geon":
    import geon as be
    from geon.frontends.onnx import import_model
else:
    import onnxruntime as ort
before = hwm()
if lib == "geon":
    g = import_model(data)
    be.NumPyTransformer().computation(g.outputs[0], *g.inputs)(*feeds)
else:
    s = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    s.run(None, {i.name: f for i, f in zip(s.get_inputs(), feeds)})
after = hwm()
print(after - before)
"""


def _peak_memory(lib, data, feeds, threads):
    """How much a fresh process's peak resident memory grows while ``lib`` ("geon" or
    "ort") imports the model and runs one forward (bytes; Linux's VmHWM, read after the
    library and the model file are loaded, so only the import's and the forward's own
    share is counted; ru_maxrss would carry this process's peak over into the child)."""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.onnx")
        with open(path, "wb") as f:
            f.write(data)
        np.savez(path + ".npz", **{f"feed{i}": a for i, a in enumerate(feeds)})
        out = subprocess.run([sys.executable, "-c", _MEMORY_PROBE, lib, path],
                             capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1])


def _train_step(be, g, feeds, module, inputs, repeats):
    """geon's and PyTorch's fine-tuning step (the mean square of the output, SGD on
    every float weight, lr 1e-3): medians (minimums) and the first losses."""
    import torch
    out = g.outputs[0]
    loss = be.np.mean(out * out)
    variables = [v for v in g.variables.values()]
    updates = [be.SetItem(v, v - 1e-3 * d)
               for v, d in zip(variables, be.deriv(loss, variables))]
    step = be.NumPyTransformer().computation([loss] + updates, *g.inputs)
    params = [p for p in module.parameters() if p.dtype.is_floating_point]
    module.train(False)  # dropout off, as in the exported graph

    def torch_step():
        for p in params:
            p.grad = None
        y = module(*inputs)
        value = (y * y).mean()
        value.backward()
        with torch.no_grad():
            for p in params:
                if p.grad is not None:
                    p.sub_(1e-3 * p.grad)
        return float(value.detach())
    first = (float(step(*feeds)[0]), torch_step())
    stats = _stats({"geon": lambda: step(*feeds), "torch": torch_step}, repeats)
    return {"first_losses": first, **stats}


def worker(threads, repeats, train, only, memory=False):
    if threads:
        import torch
        torch.set_num_threads(threads)
    for name in only or MODELS:
        try:
            r = run_model(name, threads, repeats, train, memory)
        except Exception as e:  # a model that does not export or import: say why
            r = {"model": name, "error": f"{type(e).__name__}: {str(e)[:300]}"}
        print(json.dumps(r), flush=True)


def _ms(v):
    return f"{v[0] * 1e3:.2f} ({v[1] * 1e3:.2f})"


def report(threads, results):
    label = "one thread" if threads == 1 else ("each library's default threads"
                                               if not threads else f"{threads} threads")
    print(f"\n### Forward, {label}: median (minimum) ms\n")
    print("| model | geon | PyTorch eager | ONNX Runtime | geon / PyTorch | geon / ORT | "
          "max rel. error | geon import + first call | ORT session + first run |")
    print("|---|---|---|---|---|---|---|---|---|")
    ratios = []
    for r in results:
        if "error" in r:
            print(f"| {r['model']} | {r['error']} |" + " - |" * 7)
            continue
        f = r["forward"]
        g, t, o = f["geon"], f["torch"], f["ort"]
        ratios.append((g[0] / t[0], g[0] / o[0]))
        print(f"| {r['model']} | {_ms(g)} | {_ms(t)} | {_ms(o)} | {g[0] / t[0]:.2f} | "
              f"{g[0] / o[0]:.2f} | {r['max_rel_err']:.1e} | {r['geon_first']:.2f} s | "
              f"{r['ort_first']:.2f} s |")
    if ratios:
        print(f"\nMedian over the zoo: geon / PyTorch {statistics.median(a for a, _ in ratios):.2f}, "
              f"geon / ORT {statistics.median(b for _, b in ratios):.2f}")
    measured = [r for r in results if "memory" in r]
    if measured:
        print(f"\n### Peak memory of import + one forward, {label}: MB over the loaded "
              f"library\n")
        print("| model | geon | ONNX Runtime | geon / ORT |")
        print("|---|---|---|---|")
        for r in measured:
            g, o = r["memory"]["geon"], r["memory"]["ort"]
            print(f"| {r['model']} | {g / 1e6:.1f} | {o / 1e6:.1f} | "
                  f"{g / o if o else float('nan'):.2f} |")
    trained = [r for r in results if "train" in r]
    if trained:
        print(f"\n### Fine-tuning step, {label}: median (minimum) ms\n")
        print("| model | geon | PyTorch | geon / PyTorch | first loss geon / PyTorch |")
        print("|---|---|---|---|---|")
        for r in trained:
            tr = r["train"]
            a, b = tr["first_losses"]
            print(f"| {r['model']} | {_ms(tr['geon'])} | {_ms(tr['torch'])} | "
                  f"{tr['geon'][0] / tr['torch'][0]:.2f} | {a:.6g} / {b:.6g} |")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 0],
                   help="thread settings, one process each (0: each library's default)")
    p.add_argument("--repeats", type=int, default=11)
    p.add_argument("--train", action="store_true", help="also time a fine-tuning step")
    p.add_argument("--only", nargs="+", choices=MODELS + LARGE,
                   help="these models only")
    p.add_argument("--memory", action="store_true",
                   help="also the peak memory of importing and running one forward, "
                        "geon against ONNX Runtime (each in a fresh process)")
    p.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker is not None:
        worker(args.worker, args.repeats, args.train, args.only, args.memory)
        return
    for threads in args.threads:
        env = dict(os.environ)
        if threads:
            for var in ("GEON_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
                env[var] = str(threads)
        cmd = [sys.executable, "-m", "benchmarks.models", "--worker", str(threads),
               "--repeats", str(args.repeats)] + (["--train"] if args.train else []) \
            + (["--memory"] if args.memory else []) \
            + (["--only", *args.only] if args.only else [])
        out = subprocess.run(cmd, capture_output=True, text=True, env=env)
        results = [json.loads(line) for line in out.stdout.splitlines()
                   if line.startswith("{")]
        if out.returncode:
            print(out.stderr[-2000:], file=sys.stderr)
        report(threads, results)


if __name__ == "__main__":
    main()
