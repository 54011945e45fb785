"""The torch export of control flow (geon/transformers/torch/control.py): a scan is a
Python loop in the module's forward, a cond runs the branch taken, a while loop loops;
values and gradients match geon's, in float64."""

import numpy as np
import pytest

import geon as be

torch = pytest.importorskip("torch")
from geon.transformers.torch import to_torch  # noqa: E402

T, H, D = be.Axis(5, "TcT"), be.Axis(3, "TcH"), be.Axis(2, "TcD")


def _rnn(reverse):
    x = be.placeholder([D, T], dtype=np.float64, name="x")       # T not first
    h0 = be.placeholder([H], dtype=np.float64, name="h0")
    W = be.Variable(axes=[be.Axis(3, "TcHo"), H], initial_value=np.eye(3) * 0.5,
                    dtype=np.float64, name="W")
    U = be.Variable(axes=[H, D], initial_value=np.full((3, 2), 0.3), dtype=np.float64,
                    name="U")

    def cell(h, x_t):
        h_new = be.tanh(be.cast_axes(be.dot(W, h), [H]) + be.dot(U, x_t))
        return h_new, be.sum(h_new * h_new, out_axes=())
    hT, ys = be.scan(cell, h0, x, T, reverse=reverse)
    return x, h0, W, hT, ys, be.sum(ys, out_axes=()) + be.sum(hT, out_axes=())


@pytest.mark.parametrize("reverse", [False, True])
def test_a_scan_is_a_loop_in_forward_with_geons_values_and_gradients(reverse):
    x, h0, W, hT, ys, loss = _rnn(reverse)
    X = np.random.default_rng(0).standard_normal((2, 5))
    H0 = np.array([0.1, -0.2, 0.3])
    want = be.NumPyTransformer().computation(
        [hT, ys, loss] + be.deriv(loss, [x, W]), x, h0)(X, H0)
    module = to_torch([hT, ys, loss], x, h0, output_order="graph")
    xt = torch.tensor(X, requires_grad=True)
    got = module(xt, torch.tensor(H0))
    for g, w in zip(got, want[:3]):
        np.testing.assert_allclose(g.detach().numpy(), w, rtol=1e-12, atol=1e-14)
    got[2].backward()
    np.testing.assert_allclose(xt.grad.numpy(), want[3], rtol=1e-12, atol=1e-14)
    (w_param,) = [p for p in module.parameters() if p.shape == (3, 3)]
    np.testing.assert_allclose(w_param.grad.numpy(), want[4], rtol=1e-12, atol=1e-14)


def test_cond_runs_the_branch_taken_and_differentiates():
    h0 = be.placeholder([H], dtype=np.float64, name="h0")
    p = be.placeholder([], dtype=np.float64, name="p")
    y = be.cond(p, lambda a: be.tanh(a) * 3.0, lambda a: a * a, h0)
    module = to_torch(y, p, h0, output_order="graph")
    v = np.array([0.5, -1.0, 2.0])
    for pv, slope in ((1.0, 3.0 * (1 - np.tanh(v) ** 2)), (0.0, 2 * v), (np.nan, None)):
        ht = torch.tensor(v, requires_grad=True)
        out = module(torch.tensor(pv), ht)
        np.testing.assert_allclose(out.detach().numpy(),
                                   be.evaluate(y, feeds={p: pv, h0: v}), rtol=1e-15)
        if slope is not None:
            out.sum().backward()
            np.testing.assert_allclose(ht.grad.numpy(), slope, rtol=1e-13)


def test_a_while_loop_loops_in_forward():
    h0 = be.placeholder([H], dtype=np.float64, name="h0")
    c = be.while_loop(lambda v: be.sum(v, out_axes=()) < 100.0, lambda v: v * 2.0, h0)
    capped = be.while_loop(lambda v: be.sum(v, out_axes=()) < 100.0, lambda v: v * 2.0,
                           h0, max_steps=2)
    module = to_torch([c, capped], h0, output_order="graph")
    v = np.array([1.0, 2.0, 3.0])
    got = module(torch.tensor(v))
    np.testing.assert_array_equal(got[0].numpy(), v * 32)
    np.testing.assert_array_equal(got[1].numpy(), v * 4)
