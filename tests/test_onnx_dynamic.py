"""ONNX models with symbolic dimensions (issue 34): a graph input's ``dim_param`` is a
symbolic length, bound when the model runs. Shape arithmetic over it (Shape, Gather,
Concat, Range, arithmetic ...) is computed at import on the expressions
(``geon/frontends/onnx/symbolic.py``), so that one computation serves every batch size
and sequence length. PyTorch models exported with ``dynamic_axes`` (an MLP, a CNN, an
LSTM and a BERT-style encoder) import once and match PyTorch at three sizes each."""

import io
import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import geon as be
import geon.frontends.onnx as gx

torch = pytest.importorskip("torch")


def _exported(module, args, names, dynamic):
    buf = io.BytesIO()
    args = tuple(torch.tensor(a) if isinstance(a, np.ndarray) else a for a in args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), args, buf, input_names=names,
                          output_names=["y"], dynamic_axes=dynamic, opset_version=17,
                          dynamo=False)
    return buf.getvalue()


def _check(module, data, names, dynamic, sizes, make):
    """Import ``module`` exported once; for each size, its output on ``make(size)``
    matches PyTorch's; one transformation in all."""
    f = gx.import_model(_exported(module, data, names, dynamic)).computation()
    for size in sizes:
        args = make(size)
        with torch.no_grad():
            want = module(*[torch.tensor(a) for a in args]).numpy()
        (got,) = f(*args)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert f.computation.transformations == 1
    assert f.computation.plans == len(set(sizes))


def _floats(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


class _Block(torch.nn.Module):
    """A BERT-style encoder layer whose reshapes read the input's shape."""

    def __init__(self, d=16, heads=4):
        super().__init__()
        nn = torch.nn
        self.h, self.qkv, self.o = heads, nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 32), nn.GELU(), nn.Linear(32, d))

    def forward(self, x, mask):
        b, t, d = x.shape
        q, k, v = (p.view(b, t, self.h, d // self.h).transpose(1, 2)
                   for p in self.qkv(x).split(d, dim=-1))
        a = (q @ k.transpose(-1, -2)) / (d // self.h) ** 0.5 \
            + (1.0 - mask[:, None, None, :]) * -1e4
        y = (a.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d)
        x = self.ln1(x + self.o(y))
        return self.ln2(x + self.ff(x))


class _Encoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos = torch.nn.Embedding(50, 16), torch.nn.Embedding(64, 16)
        self.blocks = torch.nn.ModuleList([_Block(), _Block()])

    def forward(self, ids, mask):
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1]).unsqueeze(0))
        for b in self.blocks:
            x = b(x, mask)
        return x


def test_an_mlp_and_a_cnn_with_a_dynamic_batch():
    torch.manual_seed(0)
    nn = torch.nn
    mlp = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    _check(mlp, (torch.zeros(2, 16),), ["x"], {"x": {0: "N"}, "y": {0: "N"}},
           (1, 5, 64), lambda n: (_floats((n, 16)),))
    cnn = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                        nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * 4 * 4, 5))
    _check(cnn, (torch.zeros(2, 3, 8, 8),), ["x"], {"x": {0: "N"}, "y": {0: "N"}},
           (1, 3, 16), lambda n: (_floats((n, 3, 8, 8)),))


def test_an_lstm_with_a_dynamic_batch_and_sequence():
    torch.manual_seed(0)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = torch.nn.LSTM(8, 16, batch_first=True)
            self.out = torch.nn.Linear(16, 3)

        def forward(self, x):
            return self.out(self.lstm(x)[0])
    _check(Model(), (torch.zeros(2, 5, 8),), ["x"],
           {"x": {0: "N", 1: "T"}, "y": {0: "N", 1: "T"}},
           ((1, 1), (3, 7), (8, 20)), lambda s: (_floats(s + (8,)),))


def test_a_bert_style_encoder_with_a_dynamic_batch_and_sequence():
    torch.manual_seed(0)

    def make(size):
        n, t = size
        r = np.random.default_rng(t)
        return r.integers(0, 50, (n, t)), (r.random((n, t)) > 0.3).astype(np.float32)
    dyn = {"ids": {0: "N", 1: "T"}, "mask": {0: "N", 1: "T"}, "y": {0: "N", 1: "T"}}
    _check(_Encoder(), make((2, 7)), ["ids", "mask"], dyn, ((1, 3), (3, 9), (2, 33)),
           make)


def test_a_fully_convolutional_net_with_dynamic_batch_height_and_width():
    torch.manual_seed(0)
    nn = torch.nn
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                        nn.MaxPool2d(2), nn.Conv2d(8, 8, 3, stride=2, padding=1),
                        nn.AvgPool2d(3, 2, 1, count_include_pad=False), nn.ReLU(),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5))
    dyn = {"x": {0: "N", 2: "H", 3: "W"}, "y": {0: "N"}}
    _check(net, (torch.zeros(2, 3, 16, 16),), ["x"], dyn, ((1, 8, 8), (2, 17, 23),
                                                           (3, 32, 12)),
           lambda s: (_floats((s[0], 3) + s[1:]),))


class _Causal(torch.nn.Module):
    """A GPT-style decoder layer: the causal mask is a fixed buffer sliced to the
    sequence length (``bias[:t, :t]``), and the head reads the last position and the
    shifted sequence (``x[:, -1]``, ``x[:, 1:]``): slices with symbolic bounds."""

    def __init__(self, d=16, heads=2, most=32):
        super().__init__()
        self.block, self.h = _Block(d, heads), heads
        self.register_buffer("bias", torch.tril(torch.ones(most, most)))
        self.tok = torch.nn.Embedding(50, d)

    def forward(self, ids):
        x = self.tok(ids)
        t = ids.shape[1]
        mask = self.bias[:t, :t]
        s = (x @ x.transpose(-1, -2)).masked_fill(mask == 0, -1e4).softmax(-1) @ x
        y = self.block(s, torch.ones(ids.shape))
        return torch.cat([y[:, -1:], y[:, 1:] - y[:, :-1]], dim=1)


def test_a_gpt_style_decoder_slicing_its_causal_mask_to_a_dynamic_length():
    torch.manual_seed(0)

    def make(size):
        return (np.random.default_rng(size[1]).integers(0, 50, size),)
    dyn = {"ids": {0: "N", 1: "T"}, "y": {0: "N", 1: "T"}}
    _check(_Causal(), make((2, 7)), ["ids"], dyn, ((1, 2), (3, 9), (2, 32)), make)


class _Positions(torch.nn.Module):
    """Hugging Face's position ids: an integer buffer sliced to the input's length
    (``position_ids[:, :t]``), then embedded."""

    def __init__(self, most=32, d=4):
        super().__init__()
        self.register_buffer("position_ids", torch.arange(most)[None])
        self.pos = torch.nn.Embedding(most, d)

    def forward(self, x):
        return x + self.pos(self.position_ids[:, :x.shape[1]])


def test_an_integer_initializer_sliced_to_a_dynamic_length():
    torch.manual_seed(0)
    dyn = {"x": {0: "N", 1: "T"}, "y": {0: "N", 1: "T"}}
    _check(_Positions(), (_floats((2, 5, 4)),), ["x"], dyn, ((2, 5), (3, 9), (1, 32)),
           lambda size: (_floats(size + (4,), seed=size[1]),))
    f = gx.import_model(_exported(_Positions(), (_floats((2, 5, 4)),), ["x"], dyn))
    with pytest.raises(be.FeedError, match=r"takes \[0:T:1\] of a dimension of length "
                                           r"32, which needs -T \+ 32 >= 0; the feeds "
                                           r"give T = 33"):
        f.computation()(_floats((1, 33, 4)))


def _model(nodes, inputs, outputs, opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _const(name, values):
    return helper.make_node("Constant", [], [name],
                            value=numpy_helper.from_array(np.array(values, np.int64)))


def test_shape_arithmetic_over_symbols_is_done_at_import():
    """``Reshape(x, Concat(Shape(x)[0] * 2, -1))`` and ``Equal(shape, -1)`` (which a
    length never is) computed on the expressions: one computation for every length."""
    vi = helper.make_tensor_value_info
    nodes = [helper.make_node("Shape", ["x"], ["s"]), _const("i0", [0]),
             _const("two", [2]), _const("m1", [-1]),
             helper.make_node("Gather", ["s", "i0"], ["n"]),
             helper.make_node("Mul", ["n", "two"], ["n2"]),
             helper.make_node("Concat", ["n2", "m1"], ["target"], axis=0),
             helper.make_node("Equal", ["target", "m1"], ["is_m1"]),
             helper.make_node("Where", ["is_m1", "two", "target"], ["fixed"]),
             helper.make_node("Reshape", ["x", "fixed"], ["y"])]
    m = _model(nodes, [vi("x", TensorProto.FLOAT, ["B", 4])],
               [vi("y", TensorProto.FLOAT, [None, None])])
    g = gx.import_model(m)
    f = g.computation()
    for n in (1, 3, 6):
        x = _floats((n, 4))
        (y,) = f(x)
        np.testing.assert_array_equal(y, x.reshape(n * 2, 2))
    assert f.computation.transformations == 1


def test_symbols_are_named_by_dim_param_and_feeds_must_agree():
    vi = helper.make_tensor_value_info
    nodes = [helper.make_node("Add", ["a", "b"], ["y"])]
    m = _model(nodes, [vi("a", TensorProto.FLOAT, ["batch size", 3]),
                       vi("b", TensorProto.FLOAT, ["batch size", 3])],
               [vi("y", TensorProto.FLOAT, ["batch size", 3])])
    g = gx.import_model(m)
    (sym_a,), (sym_b,) = ([n for n in p.axes.lengths if not isinstance(n, int)]
                          for p in g.inputs)
    assert repr(sym_a) == repr(sym_b) == "batch_size"   # one symbol, an identifier
    f = g.computation()
    np.testing.assert_array_equal(f(np.ones((2, 3)), np.ones((2, 3)))[0], 2 * np.ones((2, 3)))
    with pytest.raises(be.FeedError, match="batch_size"):
        f(np.ones((2, 3)), np.ones((5, 3)))
    # an unnamed dynamic dimension gets a symbol of its own
    m = _model([helper.make_node("Relu", ["x"], ["y"])],
               [vi("x", TensorProto.FLOAT, [None, 3])], [vi("y", TensorProto.FLOAT, [None, 3])])
    (p,) = gx.import_model(m).inputs
    assert repr(p.axes.lengths[0]) == "x_0"


def test_what_depends_on_a_binding_is_refused_naming_the_node():
    vi = helper.make_tensor_value_info
    nodes = [helper.make_node("Shape", ["x"], ["s"]), _const("i0", [0]), _const("k", [5]),
             helper.make_node("Gather", ["s", "i0"], ["n"]),
             helper.make_node("Equal", ["n", "k"], ["eq"], name="same"),
             helper.make_node("Cast", ["eq"], ["y"], to=TensorProto.FLOAT)]
    m = _model(nodes, [vi("x", TensorProto.FLOAT, ["B", 4])],
               [vi("y", TensorProto.FLOAT, [1])])
    with pytest.raises(gx.UnsupportedOnnxOp, match=r"Equal node 'same'.*B == 5.* known "
                                                   r"only when the model runs.*input_shapes="):
        gx.import_model(m)


def test_a_same_padded_convolution_over_dynamic_height_and_width():
    """``auto_pad="SAME_UPPER"`` at stride 1 pads ``(k - 1) * d`` whatever the length:
    one import for every image size (a stride above 1 needs the length's remainder)."""
    vi = helper.make_tensor_value_info
    w = np.random.default_rng(2).standard_normal((4, 3, 3, 5)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], auto_pad="SAME_UPPER")]
    graph = helper.make_graph(nodes, "g", [vi("x", TensorProto.FLOAT, ["N", 3, "H", "W"])],
                              [vi("y", TensorProto.FLOAT, None)],
                              initializer=[numpy_helper.from_array(w, "w")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    f = gx.import_model(m).computation()
    for shape in ((1, 3, 5, 7), (2, 3, 8, 6), (1, 3, 1, 1)):
        x = _floats(shape)
        (y,) = f(x)
        want = torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(w), padding="same")
        np.testing.assert_allclose(y, want.numpy(), rtol=1e-4, atol=1e-5)
    assert f.computation.transformations == 1
