"""Batched matrix products: ``be.np.matmul`` with leading dimensions, ``be.dot`` with
``batch_axes=`` / ``reduction_axes=``, ONNX ``MatMul`` of rank above 2 and the torch
export, all lowered to one batched ``Gemm`` (no broadcast product temporary), with
values against NumPy in float64 and derivatives (both modes) against central
differences."""

import inspect
import os

import numpy as np
import pytest

import geon as be
from geon.errors import AxisMismatchError
from geon.op_graph import op_graph as og
from geon.op_graph import primitives as pr
from geon.op_graph.coercion import canonical_axes
from geon.transformers import memory
from gradcheck import gradcheck

HERE = os.path.basename(__file__)

#: (a's shape, b's shape): leading dimensions on either side, broadcast (missing and
#: unit) batch dimensions, 1-D operands, empty dimensions
SHAPES = [
    ((2, 3, 4), (4, 5)),            # a linear layer on (batch, sequence, features)
    ((3, 4), (2, 4, 5)),            # b batched only: a broadcast
    ((2, 3, 4), (2, 4, 5)),         # one batch dimension on both
    ((2, 3, 5, 4), (2, 3, 4, 6)),   # attention-like
    ((2, 1, 3, 4), (5, 4, 6)),      # unit and missing batch dimensions on both sides
    ((1, 3, 4), (2, 1, 4, 5)),
    ((5, 2, 3, 4), (2, 4, 6)),      # a batch dimension only a has, before a shared one
    ((4,), (2, 4, 5)),              # 1-D a: a row vector per batch
    ((2, 3, 4), (4,)),              # 1-D b: a column vector
    ((2, 1, 4), (4, 3)),
    ((4,), (4,)), ((3, 4), (4,)), ((4,), (4, 2)), ((3, 4), (4, 2)),  # NumPy's 1-D / 2-D
    ((2, 0, 4), (2, 4, 3)),         # empty rows
    ((2, 3, 0), (2, 0, 3)),         # empty inner dimension: zeros
    ((0, 3, 4), (4, 2)),            # empty batch
]


def _ids(shapes):
    return [f"{a}@{b}".replace(" ", "") for a, b in shapes]


def _values(*shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s) for s in shapes]


@pytest.mark.parametrize("sa,sb", SHAPES, ids=_ids(SHAPES))
def test_matmul_matches_numpy(sa, sb):
    a = be.np.placeholder(sa, dtype=np.float64)
    b = be.np.placeholder(sb, dtype=np.float64)
    y = a @ b
    A, B = _values(sa, sb)
    want = np.matmul(A, B)
    assert be.np.shape(y) == want.shape
    got = be.NumPyTransformer().computation(y, a, b)(A, B)
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(be.evaluate(y, feeds={a: A, b: B}), want, rtol=1e-13,
                               atol=1e-13)
    assert be.np.matmul(a, b).axes == y.axes


def test_matmul_of_transposed_views_reads_them_without_a_copy():
    q = be.np.placeholder((2, 3, 5, 4), dtype=np.float64)
    kt = be.np.placeholder((2, 3, 6, 4), dtype=np.float64)
    x = be.np.placeholder((4, 2, 3, 5), dtype=np.float64)
    y1 = q @ be.np.swapaxes(kt, -1, -2)
    y2 = be.np.transpose(x, (1, 2, 3, 0)) @ be.np.swapaxes(kt, -1, -2)
    Q, KT, X = _values((2, 3, 5, 4), (2, 3, 6, 4), (4, 2, 3, 5))
    f = be.NumPyTransformer().computation([y1, y2], q, kt, x)
    r1, r2 = f(Q, KT, X)
    np.testing.assert_allclose(r1, Q @ np.swapaxes(KT, -1, -2), rtol=1e-13)
    np.testing.assert_allclose(r2, np.transpose(X, (1, 2, 3, 0)) @ np.swapaxes(KT, -1, -2),
                               rtol=1e-13)
    # np.matmul reads the transposed views as they are: nothing is copied
    assert "np.copyto(" not in f.source and f.source.count("np.matmul(") == 2


def test_a_product_over_leading_axes_reads_them_without_a_copy():
    """dot(u, v) summing the leading (T, B) of u (T, B, H) and v (T, B, N) (a weight's
    gradient over a loop's steps) reads u as the transposed view of its (T*B, H)
    reshape, not a copy of u laid out (H, T, B)."""
    T, B = be.Axis(5, "LdT"), be.Axis(3, "LdB")
    Hh, N = be.Axis(4, "LdH"), be.Axis(6, "LdN")
    u = be.placeholder([T, B, Hh], dtype=np.float64)
    v = be.placeholder([T, B, N], dtype=np.float64)
    f = be.NumPyTransformer().computation(be.dot(u, v), u, v)
    U, V = _values((5, 3, 4), (5, 3, 6))
    np.testing.assert_allclose(f(U, V), np.einsum("tbh,tbn->hn", U, V), rtol=1e-13)
    assert "np.copyto(" not in f.source and f.source.count("np.matmul(") == 1, f.source
    assert [type(op).__name__ for op in _computed(f)] == ["Gemm"]


def _computed(f):
    """The ops of computation ``f`` that compute a new buffer (no views, no storage)."""
    return [op for op in f.ops if isinstance(op, og.TensorOp) and
            not isinstance(op, (pr.ViewOp, og.AssignableTensorOp))]


#: shapes whose broadcast product (batch x M x K x N) is far bigger than any operand,
#: result or operand broadcast over the batch
BIG = [((2, 16, 24), (24, 32)), ((3, 16, 24), (3, 24, 32)), ((2, 3, 16, 24), (3, 24, 32)),
       ((16, 24), (4, 24, 32)), ((2, 1, 16, 24), (3, 24, 32))]


@pytest.mark.parametrize("sa,sb", BIG, ids=_ids(BIG))
def test_no_product_temporary_forward_or_backward(sa, sb):
    """The forward and both derivatives are GEMMs: no value as large as the
    batch x M x K x N product the broadcast multiply and sum needed."""
    a = be.np.placeholder(sa, dtype=np.float64)
    b = be.np.placeholder(sb, dtype=np.float64)
    y = a @ b
    r = be.np.placeholder(be.np.shape(y), dtype=np.float64)
    ga, gb = be.deriv(be.np.sum(y * r), [a, b])
    A, B, R = _values(sa, sb, be.np.shape(y))
    batch = np.broadcast_shapes(sa[:-2], sb[:-2])
    M, K, N = sa[-2], sa[-1], sb[-1]
    nb = int(np.prod(batch, dtype=np.int64))
    limit = nb * max(M * K, K * N, M * N)
    assert nb * M * K * N >= 8 * limit  # the old temporary would stand out
    t = be.NumPyTransformer()
    fwd = t.computation(y, a, b)
    assert sum(isinstance(op, pr.Gemm) for op in fwd.ops) == 1
    assert not any(isinstance(op, (og.Multiply, pr.ReduceSum)) for op in fwd.ops)
    full = t.computation([y, ga, gb], a, b, r)
    assert sum(isinstance(op, pr.Gemm) for op in full.ops) == 3
    big = [(op, op.axes.size) for op in _computed(full) if op.axes.size > limit]
    assert not big, big
    Y, GA, GB = full(A, B, R)
    tol = dict(rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(Y, A @ B, **tol)
    np.testing.assert_allclose(GA, _sum_to(R @ np.swapaxes(B, -1, -2), sa), **tol)
    np.testing.assert_allclose(GB, _sum_to(np.swapaxes(A, -1, -2) @ R, sb), **tol)


def _sum_to(x, shape):
    """``x`` summed over the dimensions broadcasting stretched to reach it from
    ``shape``."""
    lead = x.ndim - len(shape)
    x = x.sum(axis=tuple(range(lead)))
    return x.sum(axis=tuple(i for i, n in enumerate(shape) if n == 1 and x.shape[i] != 1),
                 keepdims=True)


GRAD_SHAPES = [((2, 3, 4), (4, 5)), ((3, 4), (2, 4, 5)), ((2, 3, 2, 4), (3, 4, 2)),
               ((2, 1, 3, 4), (5, 4, 2)), ((4,), (2, 4, 3)), ((2, 3, 4), (4,)),
               ((5, 2, 3, 4), (2, 4, 2))]


@pytest.mark.parametrize("lowered", [False, True], ids=["axes-ops", "lowered"])
@pytest.mark.parametrize("sa,sb", GRAD_SHAPES, ids=_ids(GRAD_SHAPES))
def test_gradients_match_central_differences(sa, sb, lowered):
    """``be.deriv`` of matmul (and, lowered, of the batched Gemm primitive itself)
    against float64 central differences."""
    A, B = _values(sa, sb, seed=3)
    r = gradcheck(lambda a, b: a @ b, [(canonical_axes(sa), A), (canonical_axes(sb), B)],
                  lowered=lowered)
    assert r.ok, str(r)


@pytest.mark.parametrize("sa,sb", GRAD_SHAPES, ids=_ids(GRAD_SHAPES))
def test_forward_mode_matches_central_differences(sa, sb):
    a = be.np.placeholder(sa, dtype=np.float64)
    b = be.np.placeholder(sb, dtype=np.float64)
    A, B, VA, VB = _values(sa, sb, sa, sb, seed=5)
    tangent = be.jvp(a @ b, [a, b], [VA, VB])
    got = be.NumPyTransformer().computation(tangent, a, b)(A, B)
    eps = 1e-6
    numeric = (np.matmul(A + eps * VA, B + eps * VB) -
               np.matmul(A - eps * VA, B - eps * VB)) / (2 * eps)
    np.testing.assert_allclose(got, numeric, rtol=1e-8, atol=1e-9)
    np.testing.assert_allclose(got, VA @ B + A @ VB, rtol=1e-13, atol=1e-13)


def test_hessian_vector_product_through_a_batched_product():
    """Forward over reverse: the batched product's derivatives are batched products,
    differentiable again."""
    a = be.np.placeholder((2, 3, 4), dtype=np.float64)
    b = be.np.placeholder((2, 4, 5), dtype=np.float64)
    cost = be.np.sum(be.np.tanh(a @ b))
    A, B, V = _values((2, 3, 4), (2, 4, 5), (2, 3, 4), seed=8)
    hv = be.NumPyTransformer().computation(be.hvp(cost, a, V), a, b)(A, B)

    def grad(A_):
        t = np.tanh(A_ @ B)
        return (1 - t * t) @ np.swapaxes(B, -1, -2)
    eps = 1e-6
    np.testing.assert_allclose(hv, (grad(A + eps * V) - grad(A - eps * V)) / (2 * eps),
                               rtol=1e-7, atol=1e-9)


# --- the Axes family ------------------------------------------------------------------------

Bt, Hd, T, S, D = (be.Axis(n, name) for n, name in ((2, "Bt"), (3, "Hd"), (5, "T"), (4, "S"),
                                                    (6, "D")))


def test_dot_keeps_batch_axes_and_sums_the_other_shared_ones():
    q = be.placeholder((Bt, Hd, T, D), dtype=np.float64)
    k = be.placeholder((Bt, Hd, S, D), dtype=np.float64)
    scores = be.dot(q, k, batch_axes=(Bt, Hd))
    assert scores.axes.names == ("Bt", "Hd", "T", "S")
    assert scores.batch_axes.names == ("Bt", "Hd") and scores.reduction_axes.names == ("D",)
    same = be.dot(q, k, reduction_axes=D)
    assert same.axes == scores.axes and same.batch_axes == scores.batch_axes
    Q, K = _values((2, 3, 5, 6), (2, 3, 4, 6))
    f = be.NumPyTransformer().computation([scores, same], q, k)
    for got in f(Q, K):
        np.testing.assert_allclose(got, np.einsum("bhtd,bhsd->bhts", Q, K), rtol=1e-13)
    # one batched GEMM on the operands as they are (k read through its transpose)
    assert "np.copyto(" not in f.source
    (g,) = [op for op in f.ops if isinstance(op, pr.Gemm)]
    assert g.axes.lengths == (2, 3, 5, 4) and g.batch_rank == 2
    # without batch_axes every shared axis is summed over, as before
    assert be.dot(q, k).axes.names == ("T", "S")


def test_batch_axes_follow_a_order_and_b_other_axes_come_last():
    a = be.placeholder((T, Bt, D), dtype=np.float64)
    b = be.placeholder((D, S, Bt), dtype=np.float64)
    y = be.dot(a, b, batch_axes=Bt)
    assert y.axes.names == ("T", "Bt", "S")
    A, B = _values((5, 2, 6), (6, 4, 2))
    f = be.NumPyTransformer().computation(y, a, b)
    np.testing.assert_allclose(f(A, B), np.einsum("tbd,dsb->tbs", A, B), rtol=1e-13)
    # one product per batch index with T as its rows (not one matrix-vector product per
    # (T, Bt) pair), the result a transposed view of it
    (g,) = [op for op in f.ops if isinstance(op, pr.Gemm)]
    assert g.axes.lengths == (2, 5, 4)


@pytest.mark.parametrize("sample_axis", [None, "first", "last"])
def test_sample_axes_are_batch_axes_in_every_layout(sample_axis):
    """A sample axis both operands have is kept (one product per sample), in the Axes
    family and in the Simple-Axes family's ``@``, whichever end of memory the
    transformer puts sample axes at."""
    Ns = be.simple.sample_axis(3)
    x = be.simple.placeholder((4, 5), sample=Ns, dtype=np.float64)
    y = be.simple.placeholder((5, 2), sample=Ns, dtype=np.float64)
    w = be.np.placeholder((2, 5, 6), dtype=np.float64)
    C, H = be.Axis(4, "C"), be.Axis(5, "H")
    a = be.placeholder((C, Ns, H), dtype=np.float64)
    b = be.placeholder((Ns, H), dtype=np.float64)
    X, Y, W, A, B = _values((3, 4, 5), (3, 5, 2), (2, 5, 6), (4, 3, 5), (3, 5), seed=9)
    xy = x @ y
    assert xy.axes.names == ("N", "-2", "-1")
    ab = be.dot(a, b, batch_axes=Ns)
    assert ab.axes.names == ("C", "N")
    cost = be.simple.sample_sum(be.np.sum(be.np.tanh(xy)))
    t = be.NumPyTransformer(sample_axis=sample_axis)
    f = t.computation([xy, be.deriv(cost, x), x @ w, ab], x, y, w, a, b)
    got_xy, gx, xw, got_ab = f(X, Y, W, A, B)
    np.testing.assert_allclose(got_xy, X @ Y, rtol=1e-13)
    np.testing.assert_allclose(gx, (1 - np.tanh(X @ Y) ** 2) @ np.swapaxes(Y, -1, -2),
                               rtol=1e-12)
    np.testing.assert_allclose(xw, np.stack([X[n] @ W for n in range(3)]), rtol=1e-13)
    np.testing.assert_allclose(got_ab, np.einsum("cnh,nh->cn", A, B), rtol=1e-13)


def _line_of(marker):
    src = inspect.getsource(inspect.getmodule(_line_of)).splitlines()
    return next(i for i, ln in enumerate(src, 1) if marker in ln and "_line_of" not in ln)


def test_a_batch_axis_not_in_both_operands_is_an_error_at_build():
    q = be.placeholder((Bt, T, D), name="q")
    w = be.placeholder((D, S), name="w")
    with pytest.raises(AxisMismatchError) as e:
        be.dot(q, w, batch_axes=Bt, name="scores")  # MARK-batch
    msg = str(e.value)
    assert "Dot scores" in msg and "batch_axes (Bt:2)" in msg and "both operands" in msg
    assert "q (Bt:2, T:5, D:6)" in msg and "w (D:6, S:4)" in msg
    assert f"{HERE}\", line {_line_of('MARK-batch')}" in msg


def test_reduction_axes_not_shared_or_with_batch_axes_is_an_error():
    q = be.placeholder((Bt, T, D), name="q")
    k = be.placeholder((Bt, S, D), name="k")
    with pytest.raises(AxisMismatchError) as e:
        be.dot(q, k, reduction_axes=(D, T))  # MARK-red
    msg = str(e.value)
    assert "Dot" in msg and "reduction_axes (T:5)" in msg and "k (Bt:2, S:4, D:6)" in msg
    assert f"{HERE}\", line {_line_of('MARK-red')}" in msg
    with pytest.raises(be.ArgumentError, match="batch_axes=.*reduction_axes=.*not both"):
        be.dot(q, k, batch_axes=Bt, reduction_axes=D)
    with pytest.raises(AxisMismatchError, match="Dot .*: axis Bt has length 3 in one "
                                                "operand and 2 in another"):
        be.dot(q, k, batch_axes=be.Axis(3, "Bt"))


def test_matmul_errors_name_the_shapes():
    a = be.np.placeholder((2, 3, 4), name="a")
    with pytest.raises(AxisMismatchError, match=r"a \(2, 3, 4\) and b \(3, 4, 5\) do not "
                                                r"broadcast"):
        a @ be.np.placeholder((3, 4, 5), name="b")
    with pytest.raises(AxisMismatchError, match="core dimension"):
        a @ be.np.placeholder((2, 5, 4), name="c")


def test_batch_axes_are_a_declared_parameter():
    """Printed, compared by CSE, copied and serialized like every op parameter."""
    q = be.placeholder((Bt, T, D), dtype=np.float64, name="q")
    k = be.placeholder((Bt, S, D), dtype=np.float64, name="k")
    y1 = be.dot(q, k, batch_axes=Bt, name="y1")
    y2 = be.dot(q, k, batch_axes=Bt)
    text = be.graph_text(y1)
    assert "y1 = Dot(q, k; batch_axes=(Bt:2)) : (Bt:2, T:5, S:4) float64" in text
    loaded = be.deserialize_graph(be.serialize(y1))
    assert loaded.op("y1").batch_axes.names == ("Bt",)
    f = be.NumPyTransformer().computation([y1 + y2], q, k)
    assert sum(isinstance(op, pr.Gemm) for op in f.ops) == 1   # cse merged the two
    Q, K = _values((2, 5, 6), (2, 4, 6))
    g = be.NumPyTransformer().computation(loaded.value, loaded.op("q"), loaded.op("k"))
    np.testing.assert_allclose(g(Q, K), np.einsum("btd,bsd->bts", Q, K), rtol=1e-13)


def test_the_memory_plan_of_a_training_step_is_verified(monkeypatch):
    """Batched products read their operands at other positions than they write: the
    planner never writes a product over an operand, and the verifier replays the plan."""
    assert memory.VERIFY
    seen = []
    real = memory.verify_plan
    monkeypatch.setattr(memory, "verify_plan",
                        lambda *a, **k: (seen.append(True), real(*a, **k))[1])
    x = be.np.placeholder((4, 64, 32), dtype=np.float64)
    W = np.random.default_rng(1).standard_normal((32, 32)) * 0.1
    w1 = be.np.variable(W, name="w1")
    h = be.np.tanh(x @ w1)
    att = be.np.tanh(h @ be.np.swapaxes(h, -1, -2)) @ h
    loss = be.np.sum(att * att)
    step = be.SetItem(w1, w1 - 0.01 * be.deriv(loss, w1))
    t = be.NumPyTransformer()
    f = t.computation([loss, step], x)
    assert seen
    for op in f.ops:
        if isinstance(op, pr.Gemm):
            assert op not in f.plan.inplace
    X = np.random.default_rng(2).standard_normal((4, 64, 32)) * 0.3

    def loss_of(W_):
        H = np.tanh(X @ W_)
        A = np.tanh(H @ np.swapaxes(H, -1, -2)) @ H
        return np.sum(A * A)
    got = float(f(X)[0])
    np.testing.assert_allclose(got, loss_of(W), rtol=1e-12)
    # the update is -0.01 times the gradient: the slope of the loss along it (central
    # differences) is -|update| / 0.01
    step_dir = t.state[w1] - W
    u = step_dir / np.linalg.norm(step_dir)
    eps = 1e-5
    slope = (loss_of(W + eps * u) - loss_of(W - eps * u)) / (2 * eps)
    np.testing.assert_allclose(-np.linalg.norm(step_dir) / 0.01, slope, rtol=1e-7)


# --- ONNX and torch --------------------------------------------------------------------------

def test_onnx_matmul_cases_pass_and_rank_above_2_is_one_batched_gemm():
    pytest.importorskip("onnx")
    from geon.frontends.onnx import conformance
    from geon.frontends.onnx.importer import import_model
    cases = conformance.collect({"MatMul"})
    names = {c.name for _, c in cases}
    assert {"test_matmul_3d", "test_matmul_4d", "test_matmul_bcast"} <= names
    for _, case in cases:
        assert conformance.run_case(case) == ("passed", ""), case.name
        ranks = [len(i.type.tensor_type.shape.dim) for i in case.model.graph.input]
        if max(ranks) <= 2:
            continue
        g = import_model(case.model)
        f = be.NumPyTransformer().computation(g.outputs, *g.inputs)
        gemms = [op for op in f.ops if isinstance(op, pr.Gemm)]
        assert len(gemms) == 1, case.name
        assert not any(isinstance(op, (og.Multiply, pr.ReduceSum)) for op in f.ops), case.name


def test_onnx_linear_layer_on_a_sequence_is_one_gemm():
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper
    from geon.frontends.onnx.importer import import_model
    rng = np.random.default_rng(6)
    W = rng.standard_normal((48, 40)).astype(np.float32)
    bias = rng.standard_normal(40).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"]),
         helper.make_node("Add", ["h", "bias"], ["y"])], "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 7, 48])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 7, 40])],
        [numpy_helper.from_array(W, "W"), numpy_helper.from_array(bias, "bias")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    g = import_model(model)
    f = be.NumPyTransformer().computation(g.outputs, *g.inputs)
    X = rng.standard_normal((2, 7, 48)).astype(np.float32)
    (y,) = f(X)
    want = X.astype(np.float64) @ W + bias
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    (g,) = [op for op in f.ops if isinstance(op, pr.Gemm)]
    assert g.axes.lengths == (14, 40)   # the batch folded into the rows: one 2-D GEMM
    assert not any(isinstance(op, pr.ReduceSum) for op in f.ops)


def test_torch_export_runs_the_batched_product_with_torch_matmul():
    torch = pytest.importorskip("torch")
    from geon.transformers.torch import to_torch
    a = be.np.placeholder((2, 1, 3, 4), dtype=np.float64)
    b = be.np.placeholder((5, 4, 6), dtype=np.float64)
    y = be.np.tanh(a @ b)
    module = to_torch(y, a, b)
    A, B = _values((2, 1, 3, 4), (5, 4, 6))
    ta = torch.tensor(A, requires_grad=True)
    tb = torch.tensor(B, requires_grad=True)
    out = module(ta, tb)
    np.testing.assert_allclose(out.detach().numpy(), np.tanh(A @ B), rtol=1e-13)
    out.sum().backward()
    ga, gb = be.deriv(be.np.sum(y), [a, b])
    GA, GB = be.NumPyTransformer().computation([ga, gb], a, b)(A, B)
    np.testing.assert_allclose(ta.grad.numpy(), GA, rtol=1e-12)
    np.testing.assert_allclose(tb.grad.numpy(), GB, rtol=1e-12)
