"""Batched matrix products on the NumPy transformer against ``np.matmul``:
``python -m benchmarks.matmul`` from the repository root.

Each product is one geon computation ``a @ b`` (``be.np``, float32), timed round-robin
with ``np.matmul(a, b)`` (a fresh result, as geon's call returns one) and
``np.matmul(a, b, out=c)`` (into a buffer made once) and, where ``b`` is 2-D, NumPy's
fastest form, ``np.matmul(a.reshape(-1, K), b, out=c)`` (one 2-D GEMM): medians and
minimums of interleaved repeats, and the ratios (to ``np.matmul(a, b)`` and to the
fastest NumPy form). The products:

- ``(2, 197, 768) @ (768, 768)``: a linear layer on a ViT-B/16 sequence (the batch
  folds into the rows: one 2-D GEMM);
- ``(8, 12, 128, 64) @ (8, 12, 64, 128)``: BERT-base attention scores at batch 8,
  sequence 128 (one batched GEMM of 96 products);
- ``(2, 16, 64) @ (2, 64, 16)``: a small batched product, where the Python around the
  call shows.

``--before`` also times the way geon computed these before the batched primitive (a
broadcast multiply into a batch x M x K x N temporary and a sum), with fewer repeats.
``--layer`` times a BERT-like attention layer imported from an ONNX graph built here
(rank-3 and rank-4 ``MatMul``, ``Softmax``, ``Transpose``, ``Reshape``) against the same
layer written with NumPy calls, and against PyTorch eager where it is installed.
These are measurements, not tests.
"""

import argparse

import numpy as np

import geon as be
from benchmarks.common import interleaved_stats, ms, pair, ratio, table

PRODUCTS = (((2, 197, 768), (768, 768)),
            ((8, 12, 128, 64), (8, 12, 64, 128)),
            ((2, 16, 64), (2, 64, 16)))


def _before(sa, sb):
    """``a @ b`` the way geon built it before batched products were a primitive."""
    a = be.np.placeholder(sa)
    b = be.np.placeholder(sb)
    r = be.np.sum(be.np.multiply(be.np.expand_dims(a, -1), be.np.expand_dims(b, -3)),
                  axis=-2)
    return be.NumPyTransformer().computation(r, a, b)


def products(repeats, before):
    rng = np.random.default_rng(0)
    rows = []
    for sa, sb in PRODUCTS:
        A = rng.standard_normal(sa).astype(np.float32)
        B = rng.standard_normal(sb).astype(np.float32)
        a, b = be.np.placeholder(sa), be.np.placeholder(sb)
        f = be.NumPyTransformer().computation(a @ b, a, b)
        C = np.empty(np.broadcast_shapes(sa[:-2], sb[:-2]) + (sa[-2], sb[-1]), np.float32)
        assert np.allclose(f(A, B), np.matmul(A, B), rtol=1e-4, atol=1e-3)
        fns = {"geon": lambda: f(A, B), "np": lambda: np.matmul(A, B),
               "np_out": lambda: np.matmul(A, B, out=C)}
        if len(sb) == 2:  # NumPy's best form: the leading dimensions folded into rows
            C2 = C.reshape(-1, sb[-1])
            fns["np_2d"] = lambda: np.matmul(A.reshape(-1, sa[-1]), B, out=C2)
        r = interleaved_stats(fns, repeats=repeats)
        best = min((r[k] for k in ("np", "np_out", "np_2d") if k in r), key=lambda v: v[0])
        row = [f"{sa} @ {sb}", pair(ms, r["geon"]), pair(ms, r["np"]), pair(ms, r["np_out"]),
               pair(ms, r["np_2d"]) if "np_2d" in r else "-",
               ratio(r["geon"], r["np"]), ratio(r["geon"], best)]
        if before:
            g = _before(sa, sb)
            old = interleaved_stats({"before": lambda: g(A, B)}, repeats=3, warmup=1)
            row += [pair(ms, old["before"]), ratio(old["before"], r["geon"])]
        rows.append(row)
    header = ["product (float32)", "geon", "np.matmul(a, b)", "np.matmul(out=)",
              "np.matmul, 2-D (out=)", "geon / np.matmul(a, b)", "geon / fastest NumPy"]
    if before:
        header += ["before (broadcast + sum)", "before / geon"]
    return table("Batched products on the NumPy transformer: median (minimum)", header, rows)


# --- a BERT-like attention layer from ONNX ---------------------------------------------------

def _layer_model(batch, seq, hidden, heads, rng):
    from onnx import TensorProto, helper, numpy_helper
    d = hidden // heads
    w = {n: (rng.standard_normal((hidden, hidden)) / np.sqrt(hidden)).astype(np.float32)
         for n in ("wq", "wk", "wv", "wo")}
    bias = {n: (rng.standard_normal(hidden) * 0.1).astype(np.float32)
            for n in ("bq", "bk", "bv", "bo")}
    nodes, inits = [], [numpy_helper.from_array(v, k) for k, v in {**w, **bias}.items()]
    inits.append(numpy_helper.from_array(np.array([batch, seq, heads, d], np.int64), "split"))
    inits.append(numpy_helper.from_array(np.array([batch, seq, hidden], np.int64), "merge"))
    inits.append(numpy_helper.from_array(np.array(np.sqrt(d), np.float32), "scale"))
    for n in "qkv":
        nodes += [helper.make_node("MatMul", ["x", f"w{n}"], [f"{n}0"]),
                  helper.make_node("Add", [f"{n}0", f"b{n}"], [f"{n}1"]),
                  helper.make_node("Reshape", [f"{n}1", "split"], [f"{n}2"]),
                  helper.make_node("Transpose", [f"{n}2"], [f"{n}h"],
                                   perm=[0, 2, 3, 1] if n == "k" else [0, 2, 1, 3])]
    nodes += [helper.make_node("MatMul", ["qh", "kh"], ["s0"]),
              helper.make_node("Div", ["s0", "scale"], ["s1"]),
              helper.make_node("Softmax", ["s1"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "vh"], ["c0"]),
              helper.make_node("Transpose", ["c0"], ["c1"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["c1", "merge"], ["c2"]),
              helper.make_node("MatMul", ["c2", "wo"], ["o0"]),
              helper.make_node("Add", ["o0", "bo"], ["y"])]
    graph = helper.make_graph(
        nodes, "attention",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, seq, hidden])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, seq, hidden])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model, w, bias


def _numpy_layer(x, w, bias, heads):
    batch, seq, hidden = x.shape
    d = hidden // heads

    def split(t):
        return t.reshape(batch, seq, heads, d).transpose(0, 2, 1, 3)
    q, k, v = (split(x @ w[f"w{n}"] + bias[f"b{n}"]) for n in "qkv")
    s = q @ k.transpose(0, 1, 3, 2) / np.float32(np.sqrt(d))
    s = np.exp(s - s.max(-1, keepdims=True))
    p = s / s.sum(-1, keepdims=True)
    c = (p @ v).transpose(0, 2, 1, 3).reshape(batch, seq, hidden)
    return c @ w["wo"] + bias["bo"]


def layer(repeats, batch=8, seq=128, hidden=256, heads=4):
    from geon.frontends.onnx.importer import import_model
    rng = np.random.default_rng(1)
    model, w, bias = _layer_model(batch, seq, hidden, heads, rng)
    g = import_model(model)
    f = be.NumPyTransformer().computation(g.outputs, *g.inputs)
    x = rng.standard_normal((batch, seq, hidden)).astype(np.float32)
    want = _numpy_layer(x.astype(np.float64), w, bias, heads)
    assert np.allclose(f(x)[0], want, rtol=1e-3, atol=1e-4)
    fns = {"geon": lambda: f(x), "numpy": lambda: _numpy_layer(x, w, bias, heads)}
    try:
        import torch  # its threads: its default (OMP_NUM_THREADS where set)
        tw = {k: torch.from_numpy(v) for k, v in {**w, **bias}.items()}
        tx = torch.from_numpy(x)
        mha = lambda: _torch_layer(torch, tx, tw, heads)  # noqa: E731
        with torch.no_grad():
            assert np.allclose(mha().numpy(), want, rtol=1e-3, atol=1e-4)
        fns["torch"] = lambda: _no_grad(torch, mha)
    except ImportError:
        pass
    r = interleaved_stats(fns, repeats=repeats)
    rows = [[k, pair(ms, v), ratio(r["geon"], v)] for k, v in r.items()]
    return table(f"A BERT-like attention layer imported from ONNX (batch {batch}, sequence "
                 f"{seq}, hidden {hidden}, {heads} heads, float32): median (minimum)",
                 ["implementation", "time", "geon / this"], rows)


def _torch_layer(torch, x, w, heads):
    batch, seq, hidden = x.shape
    d = hidden // heads

    def split(t):
        return t.reshape(batch, seq, heads, d).transpose(1, 2)
    q, k, v = (split(x @ w[f"w{n}"] + w[f"b{n}"]) for n in "qkv")
    p = torch.softmax(q @ k.transpose(-1, -2) / float(np.sqrt(d)), dim=-1)
    c = (p @ v).transpose(1, 2).reshape(batch, seq, hidden)
    return c @ w["wo"] + w["bo"]


def _no_grad(torch, fn):
    with torch.no_grad():
        return fn()


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.matmul",
                                description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=21)
    p.add_argument("--before", action="store_true",
                   help="also time the broadcast multiply and sum geon used before")
    p.add_argument("--layer", action="store_true",
                   help="also time a BERT-like attention layer imported from ONNX")
    args = p.parse_args(argv)
    products(args.repeats, args.before)
    if args.layer:
        layer(args.repeats)


if __name__ == "__main__":
    main()
