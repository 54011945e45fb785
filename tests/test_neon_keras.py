"""The model frontend as Keras and PyTorch users expect it: Keras's ``fit`` / ``evaluate``
/ ``predict`` calls (bitwise the training of the original API), ``History``,
``summary()``, reprs, plots, errors that say what was passed and what is expected, and
the permissions of the files it writes."""

import contextlib
import io
import json
import os
import re
import struct
import sys
import zlib

import numpy as np
import pytest

import geon as be
from geon.frontends import neon as nn
from geon.frontends.neon.callbacks import write_json

F, Y = be.Axis(64, name="F"), be.Axis(10, name="Y")


@pytest.fixture(scope="module")
def digits():
    x_train, y_train, x_test, y_test = nn.load_digits()
    # a part of the set keeps each fit to a fraction of a second
    return x_train[:640], y_train[:640], x_test, y_test


def make(optimizer=None, batch_size=32, bn=False, **kw):
    layers = [nn.Affine(32, activation="tanh", weight_init=nn.GlorotUniform(seed=1),
                        name="hidden")]
    if bn:
        layers.append(nn.BatchNorm(name="bn"))
    layers.append(nn.Affine(Y, weight_init=nn.GlorotUniform(seed=1), name="out"))
    return nn.Model(nn.Sequential(layers, name="mlp"), [F],
                    optimizer=optimizer or nn.SGD(0.1, momentum=0.5),
                    batch_size=batch_size, **kw)


def assert_same_weights(a, b):
    wa, wb = a.weights(), b.weights()
    assert wa.keys() == wb.keys()
    for k in wa:
        assert wa[k].dtype == wb[k].dtype and np.array_equal(wa[k], wb[k]), k


def metrics(logs):
    return [{k: v for k, v in e.items() if k != "rate"} for e in logs]


# --- fit, evaluate, predict as in Keras ----------------------------------------------------

def test_keras_fit_is_bitwise_the_original_fit(digits):
    x, y, xt, yt = digits
    keras, original = make(), make()
    h = keras.fit(x, y, epochs=3, batch_size=32, validation_data=(xt, yt), verbose=0)
    old = original.fit((x, y), epochs=3, validation_data=(xt, yt), verbose=False)
    assert_same_weights(keras, original)
    assert metrics(h) == metrics(old)        # losses and accuracies, bitwise
    # History: Keras's dict of lists and 0-based epochs, and the list of each epoch's logs
    assert isinstance(h, nn.History) and h.epoch == [0, 1, 2]
    assert list(h.history) == ["loss", "accuracy", "val_loss", "val_accuracy"]
    assert h.history["loss"] == [e["loss"] for e in old]
    assert h.history["val_accuracy"] == [e["val_accuracy"] for e in old]
    assert len(h) == 3 and h[-1]["epoch"] == 3 and [e["step"] for e in h] == [20, 40, 60]
    with pytest.raises(be.ArgumentError, match=r"history.history\['loss'\]"):
        h["loss"]


def test_validation_split_holds_out_the_last_samples(digits):
    x, y, _, _ = digits
    a, b = make(), make()
    h = a.fit(x, y, epochs=2, validation_split=0.25, verbose=0)
    cut = int(len(x) * 0.75)                  # Keras: the last 25%, before shuffling
    old = b.fit((x[:cut], y[:cut]), epochs=2, validation_data=(x[cut:], y[cut:]),
                verbose=False)
    assert_same_weights(a, b)
    assert metrics(h) == metrics(old) and "val_loss" in h.history


def test_initial_epoch_resumes_as_keras_and_equals_one_run(digits, tmp_path):
    x, y, _, _ = digits
    first = make()
    first.fit(x, y, epochs=2, verbose=0)
    first.save(tmp_path / "m.npz")
    resumed = make()
    resumed.restore(tmp_path / "m.npz")
    h = resumed.fit(x, y, initial_epoch=2, epochs=5, verbose=0)   # epochs 3..5
    assert h.epoch == [2, 3, 4] and [e["epoch"] for e in h] == [3, 4, 5]
    straight = make()
    whole = straight.fit((x, y), epochs=5, verbose=False)
    assert_same_weights(resumed, straight)
    assert h.history["loss"] == [e["loss"] for e in whole[2:]]
    # epochs <= initial_epoch: nothing to train (as in Keras)
    assert len(resumed.fit(x, y, initial_epoch=5, epochs=5, verbose=0)) == 0
    with pytest.raises(be.ArgumentError, match=r"initial_epoch=3 but the model stands in "
                                               r"epoch 5 \(100 updates made, 20 per epoch\)"):
        resumed.fit(x, y, initial_epoch=3, epochs=6, verbose=0)


def test_shuffle_and_batch_size_as_the_iterator_gives_them(digits):
    x, y, _, _ = digits
    a, b = make(), make()
    a.fit(x, y, epochs=1, batch_size=64, shuffle=False, seed=5, verbose=0)
    b.fit(nn.ArrayIterator(x, y, 64, shuffle=False, seed=5), epochs=1, verbose=False)
    assert_same_weights(a, b)
    # another batch size than the model's builds its own computation, which trains as
    # a model made for it does (and does not run the first computation's updates)
    native = make(batch_size=64)
    native.fit(x, y, epochs=1, shuffle=False, seed=5, verbose=0)
    assert_same_weights(a, native)
    assert a.step == 10
    # the first one still works: 10 updates of 32 are half an epoch of 20, finished
    a.fit(x, y, epochs=1, batch_size=32, verbose=0)
    assert a.step == 20
    c = make()
    c.fit(x, y, epochs=1, batch_size=64, seed=5, verbose=0)   # shuffled by default
    assert not np.array_equal(c.weights()["mlp/out/W"], a.weights()["mlp/out/W"])
    with pytest.raises(be.ArgumentError, match=r"shuffle=True with an ArrayIterator, "
                                               r"which has its own \(shuffle=False\)"):
        a.fit(nn.ArrayIterator(x, y, 64, shuffle=False), shuffle=True)


def test_float_labels_with_integer_values_train_as_labels(digits):
    x, y, _, _ = digits
    a, b = make(), make()
    a.fit(x, y.astype(np.float64), epochs=1, verbose=0)
    b.fit(x, y, epochs=1, verbose=0)
    assert_same_weights(a, b)


class Stream(io.StringIO):
    def __init__(self, tty):
        super().__init__()
        self.tty = tty

    def isatty(self):
        return self.tty


def test_verbose_levels(digits, monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)   # the plain bar, whatever is installed
    x, y, _, _ = digits
    s = Stream(True)
    make().fit(x, y, epochs=2, verbose=2, stream=s)   # one line per epoch, even on a tty
    assert "\r" not in s.getvalue() and len(s.getvalue().splitlines()) == 2
    s = Stream(True)
    make().fit(x, y, epochs=1, verbose=1, stream=s)   # the bar
    assert "\repoch 1/1 [" in s.getvalue()
    s = Stream(True)
    make().fit(x, y, epochs=1, verbose=0, stream=s)
    assert s.getvalue() == ""
    with pytest.raises(be.ArgumentError, match="verbose must be True, False, 0, 1, 2 or "
                                               "'auto', not 3"):
        make().fit(x, y, verbose=3)


def test_predict_takes_one_sample_and_any_batch_size(digits):
    x, y, xt, yt = digits
    model = make(batch_size=32)
    model.fit(x, y, epochs=1, verbose=0)
    full = model.predict(xt)
    assert full.shape == (len(xt), 10)
    one = model.predict(xt[3])                   # one sample: no batch dimension
    assert one.shape == (10,)
    np.testing.assert_allclose(one, full[3], rtol=1e-5, atol=1e-6)
    for n in (1, 7, 33, 100):
        np.testing.assert_allclose(model.predict(xt[:n]), full[:n], rtol=1e-5, atol=1e-6)
    for b in (1, 5, 64, 500):                    # one computation per batch size
        np.testing.assert_allclose(model.predict(xt[:70], batch_size=b), full[:70],
                                   rtol=1e-5, atol=1e-6)
    ev = model.evaluate(xt, yt)
    ev7 = model.evaluate(xt, yt, batch_size=7)
    assert np.isclose(ev7["loss"], ev["loss"], rtol=1e-6)
    assert ev7["accuracy"] == ev["accuracy"] == np.mean(np.argmax(full, 1) == yt)


def test_predict_and_evaluate_errors_name_the_shapes_not_internal_axes(digits):
    x, y, xt, yt = digits
    model = make()
    with pytest.raises(be.FeedError) as e:
        model.predict(xt[:, :63])
    msg = str(e.value)
    assert ("x has shape (359, 63); the model takes arrays of shape (n, 64): n samples "
            "of shape (64,) (the lengths of F:64), or (64,) for one sample") in msg
    assert "E:" not in msg and "x_predict" not in msg and "test_neon_keras.py" in msg
    with pytest.raises(be.FeedError, match=r"x holds no samples"):
        model.predict(xt[:0])
    with pytest.raises(be.FeedError, match=r"359 samples in x but 358 targets in y"):
        model.evaluate(xt, yt[1:])
    with pytest.raises(be.FeedError, match=r"y has shape \(359, 10\); the cross-entropy "
                                           r"loss takes integer class labels 0..9 of shape "
                                           r"\(359,\); for one-hot rows, give "
                                           r"y.argmax\(axis=1\)"):
        model.evaluate(xt, np.eye(10)[yt])
    with pytest.raises(be.FeedError, match=r"y holds float64 values"):
        model.fit(x, y + 0.5)
    mse = nn.Model(nn.Affine(be.Axis(3, name="O"), name="lin"), [F], loss="mse")
    with pytest.raises(be.FeedError, match=r"y has shape \(4, 2\); the mse loss takes "
                                           r"targets of the output's shape, \(4, 3\)"):
        mse.evaluate(xt[:4], np.zeros((4, 2)))


# --- summary and reprs ---------------------------------------------------------------------

def summary_of(model):
    lines = []
    model.summary(print_fn=lines.append)
    assert len(lines) == 1
    return lines[0]


def count(text, label):
    return int(re.search(rf"^{label}: ([\d,]+) \(", text, re.M)[1].replace(",", ""))


@pytest.mark.parametrize("bn", [False, True])
def test_summary_counts_are_the_variables_sizes(bn):
    model = make(bn=bn, optimizer=nn.Adam(0.01))
    text = summary_of(model)
    variables = model.net.variables
    assert count(text, "Total params") == sum(v.axes.size for v in variables)
    assert count(text, "Trainable params") == sum(v.axes.size for v in variables
                                                  if v.trainable)
    assert count(text, "Non-trainable params") == (2 * 32 if bn else 0)  # running stats
    assert count(text, "Optimizer params") == sum(v.axes.size
                                                  for v in model.optimizer.variables)
    rows = [ln for ln in text.splitlines() if ln.startswith(" mlp/")]
    assert [r.split()[0:2] for r in rows] == (
        [["mlp/hidden", "(Affine)"]] + ([["mlp/bn", "(BatchNorm)"]] if bn else [])
        + [["mlp/out", "(Affine)"]])
    # each row: the output axes (batch first) and the layer's own parameters
    assert re.search(r"mlp/hidden \(Affine\) +\(N, mlp/hidden_out:32\) +2,080$", text, re.M)
    assert re.search(r"mlp/out \(Affine\) +\(N, Y:10\) +330$", text, re.M)
    assert sum(int(r.split()[-1].replace(",", "")) for r in rows) == \
        count(text, "Total params")
    assert text.startswith('Model: "mlp"\n') and " x (input)" in text
    before = model.transformer.computations[:]
    model.summary(print_fn=lambda s: None)          # builds ops, compiles nothing
    assert model.transformer.computations == before


def test_summary_of_a_recurrent_and_a_convolutional_net():
    T, R = be.Axis(8, name="T", recurrent=True), be.Axis(8, name="R")
    rnn = nn.Model(nn.Sequential([nn.LSTM(16, return_sequence=False, name="lstm"),
                                  nn.Affine(Y, name="out")]), [T, R])
    text = summary_of(rnn)
    assert re.search(r"lstm \(LSTM\) +\(N, lstm_out:16\) +1,600$", text, re.M)  # 4*16*(8+16+1)
    assert count(text, "Total params") == sum(v.axes.size for v in rnn.net.variables)
    assert text.startswith('Model: "sequential"\n')
    C, H, W = be.Axis(1, name="C"), be.Axis(8, name="H"), be.Axis(8, name="W")
    cnn = nn.Model(nn.Sequential([nn.Conv(4, 3, padding="same", name="conv"),
                                  nn.Pool(2, name="pool"), nn.Flatten(name="flat"),
                                  nn.Affine(Y, name="out")]), [C, H, W])
    text = summary_of(cnn)
    assert re.search(r"conv \(Conv\) +\(N, conv_out:4, conv_H:8, conv_W:8\) +40$", text,
                     re.M)
    assert re.search(r"flat \(Flatten\) +\(N, flat_out:64\) +0$", text, re.M)


def test_reprs_show_how_things_were_made():
    net = nn.Sequential([nn.Affine(64, activation="tanh",
                                   weight_init=nn.GlorotUniform(seed=0), name="hidden"),
                         nn.Dropout(0.25, name="drop"),
                         nn.Affine(Y, activation=be.tanh, name="out")], name="mlp")
    assert repr(net) == (
        "Sequential([\n"
        "  Affine(64, activation='tanh', weight_init=GlorotUniform(seed=0), "
        "name='mlp/hidden'),\n"
        "  Dropout(0.25, name='mlp/drop'),\n"
        "  Affine(Y:10, activation=be.tanh, name='mlp/out'),\n"
        "], name='mlp')")
    model = nn.Model(net, [F], optimizer=nn.SGD(0.2, momentum=0.5), batch_size=16)
    text = repr(model)
    assert text.startswith("Model(\n  net=Sequential([\n    Affine(64, ")
    assert ("input_axes=(F:64,), loss='cross_entropy', optimizer=SGD(0.2, momentum=0.5),"
            "\n  batch_size=16, transformer=<NumPyTransformer") in text
    things = [nn.Adam(0.1, clip_norm=10.0), nn.AdamW(), nn.RMSProp(decay=0.9),
              nn.ExponentialDecay(0.1, 0.5, 100), nn.PiecewiseConstant([10], [0.1, 0.01]),
              nn.ModelCheckpoint("m.npz", every_n_steps=5), nn.EarlyStopping(patience=2),
              nn.MetricsLog("log.json"), nn.History(), nn.KaimingNormal(seed=2),
              nn.Constant(0.5), nn.BatchNorm(name="bn"), nn.LSTM(8, name="lstm"),
              nn.Conv(4, 3, padding="same", name="c"), nn.Embedding(100, 8, name="emb")]
    assert [repr(t) for t in things] == [
        "Adam(0.1, clip_norm=10.0)", "AdamW()", "RMSProp(decay=0.9)",
        "ExponentialDecay(0.1, 0.5, 100)", "PiecewiseConstant([10], [0.1, 0.01])",
        "ModelCheckpoint('m.npz', every_n_steps=5)", "EarlyStopping(patience=2)",
        "MetricsLog('log.json')", "History(no epochs)", "KaimingNormal(seed=2)",
        "Constant(0.5)", "BatchNorm(name='bn')", "LSTM(8, name='lstm')",
        "Conv(4, 3, padding='same', name='c')", "Embedding(100, 8, name='emb')"]
    assert all(" object at 0x" not in repr(t) for t in things + [model, net])
    data = nn.ArrayIterator(np.zeros((10, 3)), np.zeros(10, int), 4, seed=2)
    assert repr(data) == ("ArrayIterator(10 samples of (3,), targets (), batch_size=4, "
                          "shuffle=True, seed=2)")


def test_history_repr_lists_the_metrics(digits):
    x, y, _, _ = digits
    model = make()
    h = model.fit(x, y, epochs=2, verbose=0)
    assert re.fullmatch(r"History\(epochs 1-2:\n"
                        r"  epoch          1       2\n"
                        r"  loss      \d\.\d{4}  \d\.\d{4}\n"
                        r"  accuracy  \d\.\d{4}  \d\.\d{4}\)", repr(h)), repr(h)
    assert repr(h).splitlines()[2].split()[1:] == [f"{v:.4f}" for v in h.history["loss"]]
    h = model.fit(x, y, epochs=10, verbose=0)          # more than 8: the ends
    assert repr(h).splitlines()[:2] == [
        "History(epochs 3-12:",
        "  epoch          3       4       5     ...      10      11      12"]


# --- errors ---------------------------------------------------------------------------------

def raises(exc, fn):
    with pytest.raises(exc) as e:
        fn()
    return str(e.value)


def test_unknown_keywords_name_the_valid_ones(digits):
    msg = raises(be.ArgumentError, lambda: nn.Affine(10, activaton="relu"))
    assert msg.startswith("nn.Affine has no 'activaton' keyword; did you mean "
                          "'activation'? It takes nout, activation, weight_init, "
                          "bias_init, bias, name, dtype (at ")
    assert "test_neon_keras.py" in msg
    x, y, _, _ = digits
    model = make()
    msg = raises(be.ArgumentError, lambda: model.fit(x, y, epoch=3))
    assert msg.startswith("Model.fit has no 'epoch' keyword; did you mean 'epochs'? It "
                          "takes x, y, epochs, batch_size, ")
    # a keyword passed on to a base class is checked against the whole class's keywords
    msg = raises(be.ArgumentError, lambda: nn.SGD(0.1, beta1=0.9))
    assert msg.startswith("nn.SGD has no 'beta1' keyword; it takes learning_rate, "
                          "momentum, nesterov, weight_decay, clip_norm, name (at ")
    assert "did you mean 'beta1'" in raises(be.ArgumentError, lambda: nn.Adam(bta1=0.9))
    assert "nn.Model has no 'batchsize' keyword; did you mean 'batch_size'?" in raises(
        be.ArgumentError, lambda: nn.Model(model.net, [F], batchsize=8))
    assert "Model.predict has no 'batchsize' keyword" in raises(
        be.ArgumentError, lambda: model.predict(x, batchsize=8))
    assert "nn.EarlyStopping has no 'patiense' keyword; did you mean 'patience'?" in raises(
        be.ArgumentError, lambda: nn.EarlyStopping(patiense=3))


def test_wrong_kinds_of_arguments_say_what_was_passed_and_what_is_expected(digits):
    x, y, xt, yt = digits
    net = nn.Sequential([nn.Affine(Y, name="out")])
    cases = [
        (lambda: nn.Model(net, (6,)),
         "nn.Model: input_axes must be the Axis objects of one sample, such as "
         "[be.Axis(6, name='F')] (the batch axis is added), not (6,) (a tuple)"),
        (lambda: nn.Model([nn.Affine(Y)], [F]),
         "nn.Model: net must be a layer, such as nn.Sequential([...]), not [Affine(Y:10, "),
        (lambda: nn.Model(net, [F], optimizer=nn.Adam),
         "optimizer must be an optimizer (such as nn.SGD(0.1)) or one's name ('sgd', "
         "'adam', 'adamw', 'rmsprop'), not the class nn.Adam; make one: nn.Adam(...)"),
        (lambda: nn.Model(net, [F], batch_size=0),
         "nn.Model: batch_size must be an integer >= 1, not 0 (an int)"),
        (lambda: nn.Model(net, [F], loss="categorical_crossentropy"),
         "nn.Model: loss must be 'cross_entropy' or 'mse', not 'categorical_crossentropy'"),
        (lambda: nn.Affine("64"),
         "nn.Affine: nout must be an Axis or a length (an integer > 0), not '64' (a str)"),
        (lambda: nn.Sequential([nn.Affine(3), nn.Dropout]),
         "nn.Sequential: layers[1] is the class nn.Dropout, not a layer (an nn.Layer); "
         "make one: Dropout(...)"),
        (lambda: nn.Affine(3)(xt),
         "called on an array of shape (359, 64) and dtype float32; a layer is called on "
         "an op, such as be.placeholder(axes) (to run a model on arrays, use "
         "nn.Model(...).predict)"),
        (lambda: nn.EarlyStopping(mode="maximum"),
         "nn.EarlyStopping: mode must be 'min' (lower is better) or 'max', not 'maximum'"),
    ]
    for fn, expected in cases:
        msg = raises(be.ArgumentError, fn)
        assert expected in msg and "test_neon_keras.py" in msg, msg
    model = make()
    cases = [
        (lambda: model.fit((x, y), 3), "Model.fit: y is 3 (an int); the targets are an "
                                       "array (for the number of epochs, write epochs=3)"),
        (lambda: model.fit(x), "Model.fit: no targets: give fit(x, y, ...) or the pair "
                               "fit((x, y), ...)"),
        (lambda: model.fit(x, y, epochs=2.5), "Model.fit: epochs must be an integer >= 0, "
                                              "not 2.5 (a float)"),
        (lambda: model.fit(x, y, callbacks=nn.MetricsLog()),
         "callbacks must be a list of callbacks, not one callback: "
         "callbacks=[MetricsLog()]"),
        (lambda: model.fit(x, y, callbacks=[nn.MetricsLog]),
         "Model.fit: callbacks[0] is the class nn.MetricsLog, not a callback (an "
         "nn.Callback); make one: nn.MetricsLog(...)"),
        (lambda: model.fit(x, y, validation_split=1.5),
         "validation_split must be a fraction in [0, 1), not 1.5 (a float)"),
        (lambda: model.fit(x, y, validation_split=0.2, validation_data=(xt, yt)),
         "give validation_data or validation_split, not both"),
        (lambda: model.fit(x, y, validation_data=xt),
         "validation_data must be a pair (x_val, y_val), not an array of shape (359, 64)"),
    ]
    for fn, expected in cases:
        msg = raises(be.ArgumentError, fn)
        assert expected in msg, msg
    # EarlyStopping on a metric fit does not log
    msg = raises(be.ArgumentError, lambda: model.fit(
        x, y, verbose=0, callbacks=[nn.EarlyStopping("val_loss")]))
    assert ("nn.EarlyStopping: monitor 'val_loss' is not in the epoch's logs, which hold "
            "loss, accuracy; the val_ metrics need fit(..., validation_data=(x, y)) or "
            "validation_split=") in msg


def test_optimizer_by_name_is_that_optimizer_with_its_defaults(digits):
    x, y, _, _ = digits
    a, b = make(optimizer="adam"), make(optimizer=nn.Adam())
    assert repr(a.optimizer) == "Adam()"
    a.fit(x, y, epochs=1, verbose=0)
    b.fit(x, y, epochs=1, verbose=0)
    assert_same_weights(a, b)


def _gpu_emulated():
    from cuda_emulator import EmulatorRuntime, find_compiler
    if find_compiler() is None:
        pytest.skip("no C++ compiler for the GPU emulator")
    from geon.transformers.gpu import GPUTransformer
    return GPUTransformer(runtime=EmulatorRuntime())


@pytest.mark.parametrize("make", [lambda: be.make_transformer("numpy"), _gpu_emulated],
                         ids=["numpy", "gpu-emulator"])
def test_transformer_state_by_name_or_before_allocation_says_what_to_do(make):
    w = be.Variable(be.Axes(be.Axis(3, name="A")), initial_value=1.0, name="w")
    t = make()
    with pytest.raises(KeyError) as e:       # a KeyError still, as a dict's
        t.state[w]
    assert isinstance(e.value, be.GeonError)
    assert str(e.value).startswith("state[<Variable 'w' (A:3) float32 @ ")
    assert ("Variable 'w' has no storage in this transformer yet: storage is made for "
            "the Variables of its computations when they are allocated; build a "
            "computation that uses 'w' (transformer.computation(...)), then call "
            "transformer.initialize()") in str(e.value)
    comp = t.computation(w * 2)
    msg = raises(be.ArgumentError, lambda: t.state["w"])
    assert msg.startswith("state['w']: the state is keyed by Variable objects, not by "
                          "names; write state[w] for the Variable w")
    assert "by name: {v.name: v for v in transformer.variables()}[name]" in msg
    comp()
    assert "(here: <Variable 'w' (A:3)" in raises(be.ArgumentError, lambda: t.state["w"])
    assert raises(be.ArgumentError, lambda: t.state[w * 2]).endswith(
        ": the state is keyed by Variables, not by Multiply values")
    assert t.state[w].tolist() == [1.0, 1.0, 1.0]
    assert "w" not in t.state and w in t.state


# --- plots ----------------------------------------------------------------------------------

def png_size(path):
    """(width, height) of a PNG file, checking its signature and header chunk."""
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG file"
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13
    crc = struct.unpack(">I", data[29:33])[0]
    assert crc == zlib.crc32(data[12:29]), "damaged PNG header"
    assert data.rstrip(b"\x00")[-8:-4] == b"IEND"
    return struct.unpack(">II", data[16:24])


def test_history_and_metrics_log_plot_the_curves(digits, tmp_path):
    pytest.importorskip("matplotlib", reason="the plots need matplotlib (pip install "
                                             "matplotlib)")
    x, y, xt, yt = digits
    log = nn.MetricsLog()
    h = make().fit(x, y, epochs=3, validation_data=(xt, yt), verbose=0, callbacks=[log])
    fig = h.plot(tmp_path / "h.png", title="digits")
    assert png_size(tmp_path / "h.png") == (840, 340)     # two panels, 100 dpi
    loss, accuracy = fig.axes
    assert (loss.get_ylabel(), accuracy.get_ylabel()) == ("loss", "accuracy")
    assert [ln.get_label() for ln in loss.get_lines()] == ["training", "validation"]
    assert list(loss.get_lines()[0].get_xdata()) == [1, 2, 3]
    assert list(loss.get_lines()[0].get_ydata()) == h.history["loss"]
    assert list(accuracy.get_lines()[1].get_ydata()) == h.history["val_accuracy"]
    log.plot(tmp_path / "log.png")
    assert png_size(tmp_path / "log.png") == (840, 340)
    mse = nn.Model(nn.Affine(be.Axis(1, name="O"), name="lin"), [F], loss="mse")
    fig = mse.fit(x, np.zeros((len(x), 1), np.float32), epochs=1, verbose=0).plot()
    assert [a.get_ylabel() for a in fig.axes] == ["loss"]    # no accuracy: one panel
    with pytest.raises(be.ArgumentError, match="nothing to plot: no epoch has been logged"):
        nn.History().plot()


def test_plot_without_matplotlib_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    h = nn.History()
    h.on_epoch_end(None, 1, {"epoch": 1, "loss": 1.0})
    with pytest.raises(ImportError, match=r"^History.plot needs matplotlib, which is not "
                                          r"installed: pip install matplotlib$"):
        h.plot()
    with pytest.raises(ImportError, match=r"^MetricsLog.plot needs matplotlib"):
        nn.MetricsLog().plot()


# --- files: the permissions of checkpoints -------------------------------------------------

@contextlib.contextmanager
def umask(mask):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.skipif(os.name != "posix", reason="file modes are POSIX")
@pytest.mark.parametrize("mask", [0o022, 0o027, 0o077])
def test_json_files_follow_the_umask_as_checkpoints_do(tmp_path, mask, digits):
    x, y, _, _ = digits
    model = make()
    with umask(mask):
        model.fit(x[:64], y[:64], epochs=1, verbose=0,
                  callbacks=[nn.MetricsLog(tmp_path / "log.json"),
                             nn.ModelCheckpoint(tmp_path / "m.npz")])
        write_json(tmp_path / "hp.json", {"lr": 0.1})
    modes = {p.name: p.stat().st_mode & 0o777 for p in tmp_path.iterdir()}
    assert modes == {"log.json": 0o666 & ~mask, "m.npz": 0o666 & ~mask,
                     "hp.json": 0o666 & ~mask}
    assert json.loads((tmp_path / "hp.json").read_text()) == {"lr": 0.1}
    assert json.loads((tmp_path / "log.json").read_text())[0]["epoch"] == 1


def test_write_json_replaces_atomically_and_leaves_no_temporary_files(tmp_path, monkeypatch):
    target = tmp_path / "v.json"
    write_json(target, [1])
    inode = target.stat().st_ino
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd)))
    write_json(target, [1, 2])
    assert json.loads(target.read_text()) == [1, 2] and synced      # flushed to disk
    assert target.stat().st_ino != inode                             # a new file, renamed
    assert os.listdir(tmp_path) == ["v.json"]

    def fail(*a):
        raise OSError("disk full")
    monkeypatch.setattr(os, "fsync", lambda fd: fail())  # the write fails part-way
    with pytest.raises(OSError, match="disk full"):
        write_json(target, [3])
    assert json.loads(target.read_text()) == [1, 2]                  # the old file stays
    assert os.listdir(tmp_path) == ["v.json"]                        # no temporary left


def test_fit_trains_on_the_last_partial_batch(digits):
    """An epoch of 70 samples in batches of 32 is two batches of 32 and one of 6 (run
    by a training computation of that size), the same updates as fitting the first 64
    samples and then the 6 left in one batch; accuracy counts every sample."""
    x, y, _, _ = digits
    x, y = x[:70], y[:70]
    whole, parts = make(bn=True), make(bn=True)
    h = whole.fit(x, y, epochs=1, batch_size=32, shuffle=False, verbose=0)
    assert whole.step == 3 and 6 in whole._train
    parts.fit(x[:64], y[:64], epochs=1, batch_size=32, shuffle=False, verbose=0)
    parts.fit(x[64:], y[64:], epochs=1, batch_size=6, shuffle=False, verbose=0)
    assert parts.step == 3
    assert_same_weights(whole, parts)
    assert 0.0 <= h.history["accuracy"][0] <= 1.0
    data = nn.ArrayIterator(x, y, 32, shuffle=False)
    assert data.steps_per_epoch == 3 and [len(b) for b, _ in data.epoch(0)] == [32, 32, 6]
    assert nn.ArrayIterator(x, y, 32, drop_remainder=True).steps_per_epoch == 2
    assert data.shard(0, 2).drop_remainder and data.shard(0, 2).steps_per_epoch == 1
    with pytest.raises(be.ArgumentError, match="sharded iterator .* drops the remainder"):
        nn.ArrayIterator(x, y, 8, rank=0, ranks=2, drop_remainder=False)
    it = make(bn=True)
    it.fit(nn.ArrayIterator(x, y, 32, shuffle=False), epochs=1, verbose=0)
    assert_same_weights(it, whole)   # an iterator trains as the arrays do
    # the epoch's loss is the mean over its samples (the last batch weighs 6, not 32)

    seen = []

    class Losses(nn.Callback):
        def on_step_end(self, model, step, logs):
            seen.append(logs["loss"])
    h2 = make(bn=True).fit(x, y, epochs=1, batch_size=32, shuffle=False, verbose=0,
                           callbacks=[Losses()])
    assert len(seen) == 3
    np.testing.assert_allclose(h2.history["loss"][0],
                               (32 * seen[0] + 32 * seen[1] + 6 * seen[2]) / 70, rtol=1e-12)


def test_fit_with_dropout_at_two_batch_sizes_keeps_one_step_counter(digits):
    x, y, _, _ = digits
    net = nn.Sequential([nn.Affine(16, activation="relu", name="h"),
                         nn.Dropout(0.3, name="drop"), nn.Affine(Y, name="o")], name="d")
    model = nn.Model(net, [F], batch_size=32)
    model.fit(x[:40], y[:40], epochs=2, verbose=0)
    assert model.step == 4
    counters = [v for v in model.transformer.variables() if v.name.startswith("rng_step")]
    assert len(counters) == 1
    assert int(model.transformer.state[counters[0]]) == 4   # advanced by every update
    # a graph of the network built by hand (dropout at inference, say) advances it once
    # per call, not running the training computations' increments too
    xs = be.placeholder([be.Axis(3, "S", batch=True), F], name="xs")
    f = model.transformer.computation(net(xs, training=True), xs)
    f(x[:3])
    assert int(model.transformer.state[counters[0]]) == 5
    model.fit(x[:40], y[:40], epochs=1, verbose=0)
    assert int(model.transformer.state[counters[0]]) == 7
