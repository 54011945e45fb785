"""Recurrent layers (RNN, GRU, LSTM), each direction one :func:`geon.scan` over the
sequence axis.

The tensors are of the NumPy family: the input ``(seq, batch, 4H)`` has the positional
axes ``(-3, -2, -1)``, and scanning over its first axis ``-3`` gives the body steps of
axes ``(-2, -1)``, themselves a NumPy-family ``(batch, 4H)`` tensor; so the body is
written with ``geon.np`` as a step of the loop would be, and the stacked outputs
``(seq, batch, H)`` are NumPy-family tensors again."""

import numpy as np

import geon as be
from geon.frontends.onnx.builders.base import _float, _same, onnx_op

gnp = be.np


# --- recurrent layers (one scan per direction) --------------------------------------------

_ACTS = {"Sigmoid": be.sigmoid, "Tanh": gnp.tanh, "Relu": gnp.relu}


def _rnn_common(ctx, gates, defaults):
    hidden = ctx.attr("hidden_size")
    direction = ctx.attr("direction", "forward")
    if direction not in ("forward", "reverse", "bidirectional"):
        raise ctx.unsupported(f"direction={direction!r}")
    dirs = 2 if direction == "bidirectional" else 1
    acts = ctx.attr("activations") or defaults * dirs
    if len(acts) != len(defaults) * dirs or any(a not in _ACTS for a in acts):
        raise ctx.unsupported(f"activations={acts}")
    if ctx.attr("activation_alpha") or ctx.attr("activation_beta"):
        raise ctx.unsupported("activation_alpha / activation_beta")
    if ctx.attr("clip") is not None:
        raise ctx.unsupported("clip")
    layout = ctx.attr("layout", 0)
    x = _float(ctx)
    if layout:
        x = gnp.transpose(x, (1, 0, 2))
    seq, batch, _ = gnp.shape(x)
    w_shape = ctx.shape(1)
    if hidden is None:
        hidden = w_shape[1] // gates
    if ctx.has(4):
        lens = ctx.const(4)
        if np.any(lens != seq):
            raise ctx.unsupported("sequence_lens shorter than the sequence")
    return hidden, direction, dirs, acts, layout, x, seq, batch


def _rnn_outputs(ctx, per_dir, layout, extra_count):
    """Y (seq, dirs, batch, hidden) and the last states, from each direction's stacked
    states ``(seq, batch, H)`` (in time order) and its last extra states."""
    y = gnp.stack([ys for ys, _ in per_dir], 1)                  # (seq, dirs, batch, H)
    outs = []
    if layout:
        y = gnp.transpose(y, (2, 0, 1, 3))
    outs.append(_same(ctx, y))
    for k in range(extra_count):
        last = gnp.stack([finals[k] for _, finals in per_dir], 0)  # (dirs, batch, H)
        if layout:
            last = gnp.transpose(last, (1, 0, 2))
        outs.append(_same(ctx, last))
    return outs


def _initial(ctx, i, d, layout, batch, hidden, dtype):
    if not ctx.has(i):
        return gnp.zeros((batch, hidden), dtype=dtype)
    s = ctx.tensor(i)
    return s[:, d] if layout else s[d]


def _loop(step, init, xw, reverse):
    """``(ys, final carries)``: ``step(carries, xw_t) -> new carries`` (the first one
    the output ``h``) scanned over the first axis of ``xw`` (seq, batch, nH); ``ys`` is
    every step's ``h`` stacked, in time order."""
    def body(carries, xt):
        new = step(carries, xt)
        return new, new[0]
    final, ys = be.scan(body, tuple(init), xw, xw.axes[0], reverse=reverse)
    return ys, final


@onnx_op("LSTM", 7)
def _lstm(ctx):
    hidden, direction, dirs, acts, layout, x, seq, batch = _rnn_common(
        ctx, 4, ["Sigmoid", "Tanh", "Tanh"])
    if ctx.attr("input_forget", 0):
        raise ctx.unsupported("input_forget")
    W, R = ctx.tensor(1), ctx.tensor(2)
    dtype = x.dtype
    per_dir = []
    for d in range(dirs):
        f_act, g_act, h_act = (_ACTS[a] for a in acts[3 * d:3 * d + 3])
        # A step is one (batch, H) @ (H, 4H) GEMM (a batched product over the gates
        # would read h through a broadcast, 4 small GEMMs a step), then the cell's
        # ops on each gate's (batch, H) columns of it and of xw's step: one C loop
        # (compiled.py). xw's step and the product share their layout, (batch, 4, H),
        # so the cotangents of their gate slices are one sum of Unslices, made once
        # (CSE): the backward step took 23.6 us against 27.2 with xw gate-major.
        Wt = gnp.transpose(W[d])                                   # (I, 4H)
        Rt = gnp.transpose(R[d])                                   # (H, 4H)
        b = ctx.tensor(3)[d] if ctx.has(3) else None
        bias = b[:4 * hidden] + b[4 * hidden:] if b is not None else None
        P = ctx.tensor(7)[d] if ctx.has(7) else None
        h0 = _initial(ctx, 5, d, layout, batch, hidden, dtype)
        c0 = _initial(ctx, 6, d, layout, batch, hidden, dtype)
        xw = gnp.matmul(x, Wt)                                 # (seq, batch, 4H)
        if bias is not None:  # once for every step, not once per step
            xw = xw + bias
        xw = gnp.reshape(xw, (seq, batch, 4, hidden))

        def step(hc, xt, f_act=f_act, g_act=g_act, h_act=h_act, Rt=Rt, P=P):
            h, c = hc
            hr = gnp.reshape(gnp.matmul(h, Rt), (batch, 4, hidden))
            # each gate (batch, H) on its own: every op of the cell then has the
            # step's shape, and the compiled path makes the cell one C loop
            i_, o_, f_, g_ = (xt[:, k] + hr[:, k] for k in range(4))
            if P is not None:
                i_ = i_ + P[:hidden] * c
                f_ = f_ + P[2 * hidden:] * c
            c = f_act(f_) * c + f_act(i_) * g_act(g_)
            if P is not None:
                o_ = o_ + P[hidden:2 * hidden] * c
            return f_act(o_) * h_act(c), c
        per_dir.append(_loop(step, (h0, c0), xw, direction == "reverse" or d == 1))
    return _rnn_outputs(ctx, per_dir, layout, 2)


@onnx_op("GRU", 7)
def _gru(ctx):
    hidden, direction, dirs, acts, layout, x, seq, batch = _rnn_common(
        ctx, 3, ["Sigmoid", "Tanh"])
    lbr = ctx.attr("linear_before_reset", 0)
    W, R = ctx.tensor(1), ctx.tensor(2)
    dtype = x.dtype
    per_dir = []
    for d in range(dirs):
        f_act, g_act = (_ACTS[a] for a in acts[2 * d:2 * d + 2])
        Wt, Rt = gnp.transpose(W[d]), gnp.transpose(R[d])     # (I, 3H), (H, 3H)
        b = ctx.tensor(3)[d] if ctx.has(3) else None
        h0 = _initial(ctx, 5, d, layout, batch, hidden, dtype)
        xw = gnp.matmul(x, Wt)
        if b is not None:
            xw = xw + b[:3 * hidden]
        Rz, Rr, Rh = (Rt[:, k * hidden:(k + 1) * hidden] for k in range(3))
        rb = [b[3 * hidden + k * hidden:3 * hidden + (k + 1) * hidden]
              for k in range(3)] if b is not None else [0.0, 0.0, 0.0]

        def step(hs, xt, f_act=f_act, g_act=g_act, Rz=Rz, Rr=Rr, Rh=Rh, rb=rb):
            h, = hs

            def part(v, k):
                return v[..., k * hidden:(k + 1) * hidden]
            z = f_act(part(xt, 0) + gnp.matmul(h, Rz) + rb[0])
            r = f_act(part(xt, 1) + gnp.matmul(h, Rr) + rb[1])
            if lbr:
                n = g_act(part(xt, 2) + r * (gnp.matmul(h, Rh) + rb[2]))
            else:
                n = g_act(part(xt, 2) + gnp.matmul(r * h, Rh) + rb[2])
            return ((1.0 - z) * n + z * h,)
        per_dir.append(_loop(step, (h0,), xw, direction == "reverse" or d == 1))
    return _rnn_outputs(ctx, per_dir, layout, 1)


# --- recurrence ---------------------------------------------------------------------------

@onnx_op("RNN", 7)
def _rnn(ctx):
    hidden, direction, dirs, acts, layout, x, seq, batch = _rnn_common(ctx, 1, ["Tanh"])
    W, R = ctx.tensor(1), ctx.tensor(2)
    per_dir = []
    for d in range(dirs):
        act = _ACTS[acts[d]]
        Wt, Rt = gnp.transpose(W[d]), gnp.transpose(R[d])      # (I, H), (H, H)
        xw = gnp.matmul(x, Wt)                                  # (seq, batch, H)
        if ctx.has(3):
            b = ctx.tensor(3)[d]
            xw = xw + (b[:hidden] + b[hidden:])
        h0 = _initial(ctx, 5, d, layout, batch, hidden, x.dtype)

        def step(hs, xt, act=act, Rt=Rt):
            return (act(xt + gnp.matmul(hs[0], Rt)),)
        per_dir.append(_loop(step, (h0,), xw, direction == "reverse" or d == 1))
    return _rnn_outputs(ctx, per_dir, layout, 1)
