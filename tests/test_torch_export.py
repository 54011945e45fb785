"""geon.transformers.torch.to_torch: every op-table case, gradients through torch autograd,
the digits graphs and a model trained by geon, feeds, unsupported ops, names."""

import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="to_torch needs PyTorch (pip install "
                                            "torch==2.13.0)")

import geon as be  # noqa: E402
from geon.errors import ArgumentError, FeedError, LoweringError  # noqa: E402
from geon.examples import digits  # noqa: E402
from geon.frontends import neon as nn  # noqa: E402
from geon.transformers.torch import to_torch  # noqa: E402
from example_graphs import digits_graphs  # noqa: E402
from op_table import CASES, GRAD_CASES  # noqa: E402

DTYPES = [np.float32, np.float64]
TOL = {np.dtype(np.float32): dict(rtol=1e-5, atol=1e-6),
       np.dtype(np.float64): dict(rtol=1e-10, atol=1e-12)}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _assert_same(got, want):
    """A torch result equal to geon's NumPy result: same shape and dtype, same values."""
    got = got.detach().cpu().numpy()
    want = np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.dtype, want.dtype)
    if want.dtype.kind in "iub":
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, **TOL[want.dtype])


def _loss(f, seed=3):
    """``(L, R, r)``: ``L = sum(f * R)`` with a placeholder ``R`` and its value ``r``."""
    R = be.placeholder(f.axes, dtype=np.float64)
    r = np.random.default_rng(seed).uniform(0.5, 1.5, f.axes.shape)
    return (be.sum(f * R, reduction_axes=f.axes) if len(f.axes) else f * R), R, r


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_every_op_table_case(case, dtype):
    arrays = case.arrays(dtype)
    xs = [be.placeholder(i.axes, dtype=i.dtype(dtype)) for i in case.inputs]
    op = case.make(xs, dtype)
    module = to_torch(op, *xs, output_order="graph")  # before the computation, which rewrites the graph
    want = be.NumPyTransformer().computation(op, *xs)(*arrays)
    _assert_same(module(*[torch.from_numpy(a) for a in arrays]), want)


@pytest.mark.parametrize("case", GRAD_CASES, ids=[c.name for c in GRAD_CASES])
def test_autograd_equals_deriv(case):
    """torch autograd through the exported module gives ``be.deriv``'s gradients of
    ``L = sum(f * R)`` (float64)."""
    arrays = case.arrays(np.float64)
    xs = [be.placeholder(i.axes, dtype=i.dtype(np.float64)) for i in case.inputs]
    f = case.make(xs, np.float64)
    L, R, r = _loss(f)
    wrt = [k for k, a in enumerate(arrays) if a.dtype.kind == "f"]
    module = to_torch(f, *xs, output_order="graph")
    ts = [torch.tensor(a, requires_grad=(k in wrt)) for k, a in enumerate(arrays)]
    loss = (module(*ts) * torch.from_numpy(r)).sum()
    # a piecewise constant result (a comparison, tensor_size) has no autograd graph
    got = torch.autograd.grad(loss, [ts[k] for k in wrt], allow_unused=True) \
        if loss.requires_grad else [None] * len(wrt)
    want = be.NumPyTransformer().computation([be.deriv(L, xs[k]) for k in wrt],
                                            *xs, R)(*arrays, r)
    for k, g, w in zip(wrt, got, want):
        g = np.zeros_like(arrays[k]) if g is None else g.numpy()
        np.testing.assert_allclose(g, w, rtol=1e-8, atol=1e-10, err_msg=f"input {k}")


@pytest.mark.parametrize("case", GRAD_CASES, ids=[c.name for c in GRAD_CASES])
def test_derivative_graphs_export(case):
    """The graph of ``be.deriv`` itself exports (the adjoint primitives: Unslice,
    PutAdd, ConvGradData, ConvGradFilter, MaxPoolGrad, ...) with geon's values."""
    arrays = case.arrays(np.float64)
    xs = [be.placeholder(i.axes, dtype=i.dtype(np.float64)) for i in case.inputs]
    L, R, r = _loss(case.make(xs, np.float64))
    grads = [be.deriv(L, x) for x, a in zip(xs, arrays) if a.dtype.kind == "f"]
    module = to_torch(grads, *xs, R, output_order="graph")
    got = module(*[torch.from_numpy(a) for a in arrays + [r]])
    want = be.NumPyTransformer().computation(grads, *xs, R)(*arrays, r)
    for g, w in zip(got, want):
        _assert_same(g, w)


def test_a_product_of_two_dtypes_exports():
    # NumPy promotes float32 @ float64 to float64; torch.matmul refuses mixed types
    a = be.np.placeholder((2, 4, 3), np.float32)
    b = be.np.placeholder((2, 3, 5), np.float64)
    module = to_torch(a @ b, a, b)
    rng = np.random.default_rng(3)
    va, vb = rng.standard_normal((2, 4, 3)).astype(np.float32), rng.standard_normal((2, 3, 5))
    got = module(torch.from_numpy(va), torch.from_numpy(vb))
    got = got[0] if isinstance(got, (tuple, list)) else got
    assert got.dtype == torch.float64
    np.testing.assert_allclose(got.numpy(), va.astype(np.float64) @ vb, rtol=1e-13)


def test_second_derivative_of_max_pooling_exports():
    """d/dR of sum(MaxPoolGrad(x, R) * R2) is MaxPoolGather(x, R2)."""
    case = next(c for c in GRAD_CASES if c.op == "max_pool")
    x = be.placeholder(case.inputs[0].axes, dtype=np.float64)
    L, R, r = _loss(case.make([x], np.float64))
    L2, R2, r2 = _loss(be.deriv(L, x), seed=4)
    h = be.deriv(L2, R)
    a = case.arrays(np.float64)[0]
    assert "MaxPoolGather" in be.graph_after(h, "verify")
    got = to_torch(h, x, R, R2, output_order="graph")(*[torch.from_numpy(v) for v in (a, r, r2)])
    _assert_same(got, be.NumPyTransformer().computation(h, x, R, R2)(a, r, r2))


def test_max_pooling_gradients_go_to_the_first_maximum_as_in_geon():
    H = be.Axis(6, "H")
    x = be.placeholder((N, H), name="x", dtype=np.float64)
    f = be.max_pool(x, (H,), 3, strides=1)           # overlapping windows, with ties
    a = np.array([[1.0, 1.0, 1.0, 0.0, 2.0, 2.0]] * 4)
    L, R, r = _loss(f)
    want = be.NumPyTransformer().computation(be.deriv(L, x), x, R)(a, r)
    t = torch.tensor(a, requires_grad=True)
    (to_torch(f, x, output_order="graph")(t) * torch.from_numpy(r)).sum().backward()
    np.testing.assert_allclose(t.grad.numpy(), want, rtol=1e-12)
    # ties: the first maximum of each window wins (an even split would reach 2 and 5)
    assert want[0, 2] == want[0, 5] == 0.0 and np.all(want[0, [0, 1, 4]] != 0.0)


def test_digits_graphs_export_and_match():
    """Every computation of the digits example exported with the state of a geon
    transformer gives its values, and the training step updates the parameters as geon
    does."""
    graphs = digits_graphs(batch_size=8, n_test=12)
    t = be.NumPyTransformer()
    comps = [t.computation(r, *p) for r, p in graphs]
    t.initialize()
    modules = [to_torch(r, *p, transformer=t, output_order="graph") for r, p in graphs]
    rng = np.random.default_rng(0)
    feeds = {"x_eval": rng.uniform(0, 1, (12, 64)).astype(np.float32),
             "labels_eval": rng.integers(0, 10, 12), "x_train": rng.uniform(0, 1, (8, 64))
             .astype(np.float32), "labels_train": rng.integers(0, 10, 8)}
    for comp, module in zip(comps, modules):
        args = [feeds[p.name] for p in comp.params]
        module_out = module(*[torch.from_numpy(a) for a in args])
        geon_out = comp(*args)
        if not isinstance(geon_out, tuple):
            geon_out, module_out = (geon_out,), (module_out,)
        for g, m in zip(geon_out, module_out):
            if g is None:  # a SetItem
                assert m is None
            else:
                _assert_same(m, np.asarray(g))
        for name, v in module.geon_variables.items():  # what the SetItems wrote
            _assert_same(module.get_buffer(name) if name in dict(module.named_buffers())
                         else module.get_parameter(name), t.state[v])


def test_model_trained_by_geon_has_the_same_accuracy_in_pytorch():
    x_train, y_train, x_test, y_test = nn.load_digits()
    model = digits.build_model(dict(digits.HYPERPARAMETERS, hidden=16), 64, "numpy")
    model.eval_batch_size = len(x_test)       # one evaluation batch: the whole test set
    model.fit((x_train, y_train), epochs=2, verbose=False)
    result = model.evaluate(x_test, y_test)
    assert result["accuracy"] > 0.8  # it did learn: the comparison below is not of chance levels

    evaluate = model._eval_computation()      # (per-image loss, per-image correctness)
    module = to_torch(evaluate.requested, *evaluate.params, transformer=model.transformer)
    # the two layers' weights and biases, registered from the input to the output
    assert len(module.state_dict()) == 4
    assert [v.name for v in module.geon_variables.values()] == \
        [v.name for v in model.net.variables]
    with torch.no_grad():
        t_loss, t_correct = module(torch.from_numpy(x_test), torch.from_numpy(y_test))
    assert np.mean(t_correct.numpy()) == result["accuracy"]
    np.testing.assert_allclose(np.mean(t_loss.numpy()), result["loss"], rtol=1e-5)


# --- feeds -------------------------------------------------------------------------------

F = be.Axis(3, "F")
N = be.Axis(4, "N", batch=True)


def _scaled():
    x = be.placeholder((N, F), name="x")
    w = be.Variable(F, initial_value=[1.0, 2.0, 3.0], name="w")
    return x, w, x * w


def test_feed_of_the_wrong_shape_names_the_placeholder_and_the_shape():
    x, _, y = _scaled()
    module = to_torch(y, x)
    with pytest.raises(ValueError, match=r"placeholder x expects axes \(N:4, F:3\) i\.e\. "
                                         r"shape \(4, 3\); got shape \(3, 4\)"):
        module(torch.zeros(3, 4))
    with pytest.raises(FeedError, match=r"placeholder x .*shape \(4, 3\); got shape"):
        module(np.zeros((4, 2), np.float32))  # arrays are checked as geon checks feeds


def test_feed_count_and_dtype_are_checked():
    x, _, y = _scaled()
    module = to_torch(y, x)
    with pytest.raises(FeedError, match=r"takes 1 value\(s\) \(x\), got 2"):
        module(torch.zeros(4, 3), torch.zeros(4, 3))
    with pytest.raises(FeedError, match="placeholder x has dtype float32; cannot safely "
                                        "convert torch.complex64"):
        module(torch.zeros(4, 3, dtype=torch.complex64))
    # float64 converts to the placeholder's float32, as geon's feeds do
    out = module(torch.ones(4, 3, dtype=torch.float64))
    assert out.dtype == torch.float32
    np.testing.assert_array_equal(out.detach().numpy(), np.tile([1.0, 2.0, 3.0], (4, 1)))


def test_integer_placeholder_rejects_floats():
    idx = be.placeholder(N, dtype=np.int64, name="labels")
    module = to_torch(be.one_hot(idx, be.Axis(5, "Y")), idx)
    with pytest.raises(FeedError, match="placeholder labels has dtype int64"):
        module(torch.zeros(4))
    out = module(torch.tensor([0, 4, 2, 2]))
    # batch first, as torch.nn.functional.one_hot lays it out
    np.testing.assert_array_equal(out.numpy(), np.eye(5, dtype=np.float32)[[0, 4, 2, 2]])


def test_negative_step_slices_and_their_adjoint():
    """PyTorch has no negative slice steps: the exporter flips a positive-step slice."""
    C7 = be.Axis(7, "C7")
    D = be.Axis(3, "D")
    x = be.placeholder((C7, F), name="x", dtype=np.float64)
    y = be.slice_along_axis(x, C7, slice(5, 0, -2), new_axis=D)
    g = be.deriv(be.sum(y * y, out_axes=()), x)   # an Unslice with the same key
    module = to_torch([y, g], x)
    a = np.arange(21.0).reshape(7, 3)
    got = module(torch.from_numpy(a))
    want = be.NumPyTransformer().computation([y, g], x)(a)
    np.testing.assert_array_equal(got[0].numpy(), a[5:0:-2])
    for t, w in zip(got, want):
        _assert_same(t, w)


def test_indices_are_checked_as_geon_checks_them():
    M = be.Axis(2, "M")
    x = be.placeholder((N, F), name="x")
    idx = be.placeholder(M, dtype=np.int64, name="idx")
    module = to_torch(be.gather(x, idx, F), x, idx)
    a = np.arange(12, dtype=np.float32).reshape(4, 3)
    got = module(torch.from_numpy(a), torch.tensor([-1, 0]))
    np.testing.assert_array_equal(got.numpy(), a[:, [2, 0]])
    with pytest.raises(be.IndexOutOfRangeError, match=r"Gather .*test_torch_export\.py.*: "
                                                      r"index 3 is out of range for an "
                                                      r"axis of length 3"):
        module(torch.from_numpy(a), torch.tensor([3, 0]))


def test_every_primitive_of_the_numpy_transformer_has_a_rule():
    """The exporter's base set holds the NumPy transformer's (user ops aside: each needs
    its own PyTorch rule), so whatever geon runs, the exporter runs."""
    from geon.transformers.torch.export import _TorchLowering
    from geon.op_graph.user_ops import UserOp
    ours = _TorchLowering().base_set
    missing = sorted(c.__name__ for c in be.NumPyTransformer.base_set - {UserOp}
                     if c not in ours)
    assert not missing, missing


def test_the_users_graph_is_not_rewritten():
    x, w, y = _scaled()
    z = be.softmax(y)
    to_torch(z, x)
    assert be.graph_text(z) == be.graph_text(z, lowered=True)  # no op was replaced


def test_collectives_of_a_single_process_are_the_value_itself():
    x = be.placeholder(F, name="x", dtype=np.float64)
    y = be.placeholder(N, name="y", dtype=np.float64)
    from geon.op_graph.collectives import FlatConcat
    flat = FlatConcat(x * 2.0, y, axis=be.Axis(7, "flat"))
    results = [be.allreduce(x), be.allreduce(x, "mean"), be.broadcast_from(x), flat]
    module = to_torch(results, x, y)
    a, b = np.array([1.0, 2.0, 3.0]), np.arange(4.0)
    got = module(torch.from_numpy(a), torch.from_numpy(b))
    want = be.NumPyTransformer().computation(results, x, y)(a, b)
    for g, w in zip(got, want):
        _assert_same(g, w)
    np.testing.assert_array_equal(got[3].numpy(), [2, 4, 6, 0, 1, 2, 3])


_DISTRIBUTED = """
import sys, numpy as np, torch, torch.distributed as dist
import geon as be
from geon.transformers.torch import to_torch
rank = int(sys.argv[1])
dist.init_process_group("gloo", init_method=sys.argv[2], rank=rank, world_size=2)
F = be.Axis(3, "F")
x = be.placeholder(F, name="x", dtype=np.float64)
m = to_torch([be.allreduce(x), be.allreduce(x, "mean"), be.broadcast_from(x, root=1)], x)
t = (torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64) * (rank + 1)).requires_grad_()
s, mean, b = m(t)
(s * (rank + 1)).sum().backward()  # d/dx_r sum_s y_s (s + 1) = 1 + 2
print(s.tolist(), mean.tolist(), b.tolist(), t.grad.tolist(), flush=True)
dist.destroy_process_group()
# gloo's threads can make the interpreter's normal exit abort ("terminate called without
# an active exception") after everything above succeeded: leave without it.
import os
os._exit(0)
"""


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is "
                                                                 "not available")
def test_collectives_in_a_torch_distributed_job():
    """Two processes (gloo, on this machine): the exported allreduce and broadcast are
    torch.distributed's, and autograd sums the ranks' deltas as geon's adjoint does."""
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=ROOT)
    procs = [subprocess.Popen([sys.executable, "-c", _DISTRIBUTED, str(r),
                               f"tcp://127.0.0.1:{port}"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
             for r in (0, 1)]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert out.strip() == ("[3.0, 6.0, 9.0] [1.5, 3.0, 4.5] [2.0, 4.0, 6.0] "
                               "[3.0, 3.0, 3.0]"), (out, err)


# --- unsupported ops ---------------------------------------------------------------------

Twice = be.define_op("TorchExportTwice", lambda x: 2 * x)


def test_an_op_without_a_rule_is_named_at_export_with_its_line():
    x = be.placeholder(F, name="x")
    y = Twice(x)
    line = sys._getframe().f_lineno - 1
    with pytest.raises(LoweringError, match=rf"TorchExportTwice.*built at .*"
                                            rf"test_torch_export\.py\", line {line}"):
        to_torch(y, x)
    # the user's graph was not touched: geon still runs it
    np.testing.assert_array_equal(be.NumPyTransformer().computation(y, x)([1, 2, 3]),
                                  [2, 4, 6])


# --- parameters --------------------------------------------------------------------------

def test_parameters_are_named_after_the_variables():
    x = be.placeholder(F, name="x")
    names = ["layer1.weight", "3d", "forward", "bias", "my var"]
    vs = [be.Variable(F, initial_value=k, name=n) for k, n in enumerate(names)]
    step = be.Variable((), initial_value=7, dtype=np.int64, name="step")
    frozen = be.Variable(F, initial_value=0.5, trainable=False, name="frozen")
    y = sum(vs[1:], vs[0] * x) + frozen + step
    module = to_torch(y, x)
    assert [n for n, _ in module.named_parameters()] == \
        ["layer1_weight", "_3d", "forward_", "bias", "my_var"]
    assert {n for n, _ in module.named_buffers()} >= {"step", "frozen"}
    assert set(module.state_dict()) == {"layer1_weight", "_3d", "forward_", "bias",
                                        "my_var", "step", "frozen"}  # constants: not state
    assert module.geon_variables["forward_"] is vs[2]
    assert module.step.dtype == torch.int64 and module.frozen.requires_grad is False
    np.testing.assert_allclose(module(torch.ones(3)).detach().numpy(),
                               [0 + 1 + 2 + 3 + 4 + 0.5 + 7] * 3)


def test_names_that_sanitize_alike_are_an_error_naming_both():
    x = be.placeholder(F, name="x")
    a = be.Variable(F, name="enc.w")
    b = be.Variable(F, name="enc-w")
    site = r"\(built at .*test_torch_export\.py\", line \d+\)"
    with pytest.raises(ArgumentError, match=rf"Variables enc\.w {site} and enc-w {site} "
                                            rf"both become the attribute 'enc_w'"):
        to_torch(a * x + b, x)


def test_values_come_from_the_transformer_state():
    x, w, y = _scaled()
    t = be.NumPyTransformer()
    update = t.computation(be.SetItem(w, w * 10.0))
    update()
    module = to_torch(y, x, transformer=t)
    np.testing.assert_array_equal(module.w.detach().numpy(), [10.0, 20.0, 30.0])
    assert to_torch(y, x).w.tolist() == [1.0, 2.0, 3.0]  # without it: initial values


def test_without_a_transformer_the_initializers_run():
    v = be.Variable(F, initial_value=1.0, name="v")
    u = be.Variable(F, initial_value=2.0, name="u",
                    initializers=[be.SetItem(v, 5.0, sequence=False)])
    module = to_torch(u + v)
    assert module().tolist() == [7.0, 7.0, 7.0]
    assert module.v.tolist() == [5.0, 5.0, 5.0]


def test_assignments_write_the_parameters_in_place():
    x, w, y = _scaled()
    loss = be.sum(y, out_axes=())
    module = to_torch([loss, be.SetItem(w, w - 0.5 * be.deriv(loss, w))], x)
    out, none = module(torch.ones(4, 3))
    assert none is None and out.item() == 24.0
    np.testing.assert_array_equal(module.w.detach().numpy(), [-1.0, 0.0, 1.0])
    out, _ = module(torch.ones(4, 3))  # the next call reads the updated value
    assert out.item() == 0.0


def test_results_that_are_storage_are_new_tensors_each_call():
    w = be.Variable(F, initial_value=1.0, name="w")
    results = [w, be.SetItem(w, w + 1.0)]
    module = to_torch(results)
    first, _ = module()
    second, _ = module()
    want = be.NumPyTransformer().computation(results)
    assert first.tolist() == want()[0].tolist() == [2.0, 2.0, 2.0]  # read after the update
    assert second.tolist() == want()[0].tolist() == [3.0, 3.0, 3.0]
    assert first is not module.w and first.tolist() == [2.0, 2.0, 2.0]


def test_an_assignment_to_a_placeholder_leaves_the_callers_value_alone():
    x = be.placeholder(F, name="x", dtype=np.float64)
    results = [be.SetItem(x, x * 2.0), x + 1.0]
    module = to_torch(results, x)
    a, t = np.ones(3), torch.ones(3, dtype=torch.float64)
    want = be.NumPyTransformer().computation(results, x)(np.ones(3))[1]
    for value in (a, t):
        none, out = module(value)
        assert none is None and out.tolist() == want.tolist() == [3.0, 3.0, 3.0]
    assert a.tolist() == t.tolist() == [1.0, 1.0, 1.0]


def test_the_module_trains_in_pytorch():
    """Autograd reaches the parameters: a PyTorch optimizer step changes the loss."""
    x, w, y = _scaled()
    module = to_torch(be.sum(y * y, out_axes=()), x)
    opt = torch.optim.SGD(module.parameters(), lr=0.01)
    first = module(torch.ones(4, 3))
    first.backward()
    np.testing.assert_allclose(module.w.grad.numpy(), 8 * np.array([1.0, 2.0, 3.0]))
    opt.step()
    assert module(torch.ones(4, 3)).item() < first.item()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="no CUDA device (torch.cuda.is_available() is False)")
def test_runs_on_a_gpu():
    x, w, y = _scaled()
    f = be.tanh(be.sum(be.softmax(y), out_axes=N))
    module = to_torch(f, x).to("cuda")
    a = np.random.default_rng(1).uniform(-1, 1, (4, 3)).astype(np.float32)
    out = module(torch.from_numpy(a).to("cuda"))
    assert out.device.type == "cuda"
    _assert_same(out, be.NumPyTransformer().computation(f, x)(a))


def test_importing_geon_does_not_need_torch_and_the_exporter_says_how_to_get_it():
    code = ("import sys; sys.modules['torch'] = None\n"
            "import geon\n"
            "try:\n"
            "    import geon.transformers.torch\n"
            "except geon.errors.TorchMissingError as e:\n"
            "    print(isinstance(e, ImportError), e)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("True ") and "pip install torch==2.13.0" in run.stdout


# --- layout, registration order, repr ----------------------------------------------------

def _two_layers():
    """A two-layer network on (N, F) inputs whose output layer is built first."""
    C, H = be.Axis(2, "C"), be.Axis(5, "H")
    W2 = be.Variable((C, H), initial_value=0.25, name="out.W")
    b2 = be.Variable(C, initial_value=0.5, name="out.b")
    x = be.placeholder((N, F), name="x")
    W1 = be.Variable((H, F), initial_value=lambda s: np.linspace(-1, 1, 15).reshape(s),
                     name="hidden.W")
    b1 = be.Variable(H, initial_value=0.1, name="hidden.b")
    h = be.tanh(be.dot(W1, x) + b1)           # (H, N)
    return x, be.dot(W2 * 2.0, h) + b2, h      # (C, N)


def test_outputs_are_batch_first_by_default_and_in_any_order_asked():
    x, y, h = _two_layers()
    assert [a.name for a in y.axes] == ["C", "N"]
    X = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
    want_y, want_h = be.NumPyTransformer().computation([y, h], x)(X)
    module = to_torch(y, x)
    assert module.output_axes == [be.Axes([N, y.axes[0]])]
    _assert_same(module(torch.from_numpy(X)), want_y.T)   # (N, C), as PyTorch lays out
    _assert_same(to_torch(y, x, output_order="graph")(X), want_y)
    _assert_same(to_torch(y, x, output_order=y.axes)(X), want_y)
    both = to_torch([y, h], x, output_order=[None, (N, h.axes[0])])(X)
    _assert_same(both[0], want_y)
    _assert_same(both[1], want_h.T)
    for a, b in zip(to_torch([y, h], x)(X), (want_y.T, want_h.T)):
        _assert_same(a, b)


def test_inputs_keep_the_placeholders_layout():
    """An input whose batch axis is not first is still fed in its placeholder's order."""
    x = be.placeholder((F, N), name="x_fn")
    w = be.Variable(F, initial_value=[1.0, 2.0, 3.0], name="w")
    module = to_torch(be.sum(x * w, out_axes=N), x)
    X = np.arange(12, dtype=np.float32).reshape(3, 4)
    _assert_same(module(X), X.T @ np.array([1.0, 2.0, 3.0], np.float32))
    with pytest.raises(FeedError, match=r"placeholder x_fn expects axes \(F:3, N:4\)"):
        module(X.T)


def test_bad_output_orders_are_errors_naming_the_result():
    x, y, h = _two_layers()
    with pytest.raises(ArgumentError, match=r"output_order \(N:4, F:3\) is not a "
                                            r"reordering of result .*\(C:2, N:4\).*built at"):
        to_torch(y, x, output_order=(N, F))
    with pytest.raises(ArgumentError, match="'nchw' is not an order; use 'batch_first'"):
        to_torch(y, x, output_order="nchw")
    with pytest.raises(ArgumentError, match="output_order has 1 entries for 2 results"):
        to_torch([y, h], x, output_order=["graph"])
    with pytest.raises(ArgumentError, match=r"output_order\[1\] must be .* got 3"):
        to_torch([y, h], x, output_order=["graph", 3])


def test_parameters_are_registered_from_the_inputs_to_the_outputs():
    x, y, _ = _two_layers()
    module = to_torch(y, x)
    assert [n for n, _ in module.named_parameters()] == \
        ["hidden_W", "hidden_b", "out_W", "out_b"]
    assert list(module.state_dict()) == ["hidden_W", "hidden_b", "out_W", "out_b"]


def test_repr_lists_inputs_outputs_and_state():
    x, y, _ = _two_layers()
    step = be.Variable((), dtype=np.int64, initial_value=0, name="step")
    module = to_torch([y, be.SetItem(step, step + 1)], x)
    assert repr(module).splitlines() == [
        "TorchComputation(",
        "  input x: (N:4, F:3) float32",
        "  output: (N:4, C:2) float32",
        "  output: None",
        "  parameter hidden_W: (H:5, F:3) float32",
        "  parameter hidden_b: (H:5) float32",
        "  parameter out_W: (C:2, H:5) float32",
        "  parameter out_b: (C:2) float32",
        "  buffer step: scalar int64",
        ")"]


def test_the_former_import_path_gives_the_same_objects():
    """The export is a backend (geon.transformers.torch); geon.frontends.torch, where it
    used to live, re-exports the same objects so old imports keep working."""
    import geon.frontends.torch as former
    import geon.transformers.torch as current
    assert former.__all__ == current.__all__
    for name in current.__all__:
        assert getattr(former, name) is getattr(current, name)
