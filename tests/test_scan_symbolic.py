"""A scan over an axis of symbolic length (issues 34 and 35): one computation runs every
sequence length, with the values and derivatives of a computation built for that
length, and without transforming again."""

import numpy as np
import pytest

import geon as be
from geon.frontends import neon as nn

F64 = np.float64
H, D, H2 = be.Axis(3, "H"), be.Axis(2, "D"), be.Axis(3, "H2")


def rnn(T, remat, reverse):
    """``(inputs, results)``: a tanh RNN over ``T``, its cost and the cost's
    derivatives."""
    x, h0 = be.placeholder([T, D], dtype=F64), be.placeholder([H], dtype=F64)
    w, u = be.placeholder([H2, H], dtype=F64), be.placeholder([H, D], dtype=F64)

    def cell(h, xt):
        hn = be.tanh(be.cast_axes(be.dot(w, h), [H]) + be.dot(u, xt))
        return hn, be.sum(hn * hn, out_axes=())
    hT, ys = be.scan(cell, h0, x, T, reverse=reverse, remat=remat)
    cost = be.sum(ys * ys, out_axes=()) + be.sum(hT * hT, out_axes=())
    ins = [x, h0, w, u]
    return ins, [cost, hT, ys] + be.deriv(cost, ins)


@pytest.mark.parametrize("remat", ["none", "step"])
@pytest.mark.parametrize("reverse", [False, True])
def test_one_computation_for_every_length(remat, reverse):
    ins, res = rnn(be.symbolic_axis("T", recurrent=True), remat, reverse)
    comp = be.NumPyTransformer().computation(res, *ins)
    r = np.random.default_rng(0)
    w, u, h0 = 0.5 * r.standard_normal((3, 3)), r.standard_normal((3, 2)), r.standard_normal(3)
    for n in (1, 4, 9, 4):
        x = r.standard_normal((n, 2))
        got = comp(x, h0, w, u)
        fixed_ins, fixed_res = rnn(be.Axis(n, "T", recurrent=True), remat, reverse)
        want = be.NumPyTransformer().computation(fixed_res, *fixed_ins)(x, h0, w, u)
        assert [np.shape(a) for a in got] == [np.shape(a) for a in want]
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
    assert comp.transformations == 1
    assert comp.plans == 3   # one memory plan per distinct length


def test_checkpoints_need_a_fixed_length():
    T = be.symbolic_axis("T")
    with pytest.raises(be.ArgumentError, match=r"remat='checkpoints:4' over an axis of "
                                               r"symbolic length T.*'none' or 'step'"):
        rnn(T, "checkpoints:4", False)
    with pytest.raises(be.ArgumentError, match="remat='checkpoints' over an axis"):
        rnn(T, "checkpoints", False)
    with pytest.raises(be.ArgumentError, match="expected one of"):
        rnn(T, "all", False)


@pytest.mark.parametrize("kind", [nn.LSTM, nn.GRU])
def test_a_recurrent_layer_over_a_symbolic_sequence_trains_as_at_a_fixed_length(kind):
    """A training step (loss, gradients, SGD) of a layer over a symbolic sequence axis
    and a symbolic batch, against the same layer built for each length."""
    def step(N, T):
        x = be.placeholder([N, T, be.Axis(3, "F")], dtype=F64, name="x")
        init = nn.Uniform(-0.5, 0.5, seed=4)
        layer = kind(be.Axis(4, "Hd"), init=init, recurrent_init=init, dtype=F64,
                     name="rec")
        y = layer(x)
        loss = be.sum(y * y, out_axes=())
        grads = be.deriv(loss, layer.variables)
        comp = be.NumPyTransformer().computation([loss] + grads, x)
        return comp
    sym = step(be.symbolic_axis("N", batch=True), be.symbolic_axis("T", recurrent=True))
    r = np.random.default_rng(1)
    for n, t in ((2, 5), (1, 1), (3, 8)):
        X = r.standard_normal((n, t, 3))
        want = step(be.Axis(n, "N", batch=True), be.Axis(t, "T", recurrent=True))(X)
        for a, b in zip(sym(X), want):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
    assert sym.transformations == 1
