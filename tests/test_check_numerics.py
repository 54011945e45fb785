"""The numerics debug mode: ``check_numerics=True`` on the NumPy and GPU transformers.

The GPU transformer runs on the CPU emulator of tests/cuda_emulator.py (skipped only
without a C++ compiler to build it).
"""

import gc
import sys

import numpy as np
import pytest

import geon as be
from geon.op_graph import nodes
from geon.transformers.gpu import CudaCodegenTransformer, GPUTransformer

from cuda_emulator import EmulatorRuntime, find_compiler

needs_cxx = pytest.mark.skipif(find_compiler() is None,
                               reason="no C++ compiler for the GPU emulator")

B, HIDDEN, CLASSES = 32, 16, 10
# The mode raises NumericsError where NumPy would warn (a warning turned into an error
# would otherwise be raised first).
pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")


def numpy_transformer(**kw):
    return be.NumPyTransformer(**kw)


def gpu_transformer(**kw):
    return GPUTransformer(runtime=EmulatorRuntime(seed=4), **kw)


TRANSFORMERS = [pytest.param(numpy_transformer, id="numpy"),
                pytest.param(gpu_transformer, id="gpu-emulator", marks=needs_cxx)]


def digits_step(plant=False, dtype=np.float32):
    """The digits example's training step (two affine layers, tanh, softmax,
    cross-entropy, SGD updates) built from geon's ops; with ``plant``, the cost also
    has the mean of ``log(h - 100)`` of the hidden layer ``h``: NaN in every element.
    Returns ``(results, placeholders, the planted op's line)``."""
    rng = np.random.default_rng(0)
    N = be.Axis(B, "N", batch=True)
    F, H, Y = be.Axis(64, "F"), be.Axis(HIDDEN, "H"), be.Axis(CLASSES, "Y")
    x = be.placeholder([N, F], dtype=dtype, name="pixels")
    labels = be.placeholder([N], dtype=np.int64, name="labels")

    def var(axes, name):
        shape = tuple(a.length for a in axes)
        return be.Variable(axes, dtype=dtype, name=name,
                           initial_value=0.2 * rng.standard_normal(shape).astype(dtype))
    w1, b1, w2, b2 = var([H, F], "w1"), var([H], "b1"), var([Y, H], "w2"), var([Y], "b2")
    h = be.tanh(be.dot(w1, x) + b1)
    probs = be.softmax(be.dot(w2, h) + b2, Y)
    cost = be.mean(be.cross_entropy_multi(probs, be.one_hot(labels, Y)), out_axes=())
    line = None
    if plant:
        planted, line = be.log(h - 100), sys._getframe().f_lineno
        planted.name = "planted"
        cost = cost + 1e-3 * be.mean(planted, out_axes=())
    updates = [be.SetItem(v, v - 0.2 * be.deriv(cost, v)) for v in (w1, b1, w2, b2)]
    return [cost] + updates, (x, labels), line


def digits_batch(dtype=np.float32):
    from geon.examples.digits import load_digits
    images, labels = load_digits()
    return images[:B].astype(dtype), labels[:B]


def same_names(build):
    """``build()`` with the default op names it would get in a fresh process, so that
    two builds and compilations of one graph have the same names (and so the same
    generated code). Constants of Python numbers are shared while some op uses them
    (``op_graph.weak_number``) and keep their first name: collect the last build's."""
    gc.collect()
    saved = dict(nodes._name_counters)
    nodes._name_counters.clear()
    try:
        return build()
    finally:
        nodes._name_counters.clear()
        nodes._name_counters.update(saved)


# --- off by default, and free when off -------------------------------------------------

@pytest.mark.parametrize("make", [be.NumPyTransformer, CudaCodegenTransformer],
                         ids=["numpy", "cuda-codegen"])
@pytest.mark.parametrize("plant", [False, True])
def test_generated_code_off_is_the_default(make, plant):
    def source(**kw):
        def build():
            results, params, _ = digits_step(plant)
            return make(**kw).computation(results, *params).source
        return same_names(build)

    default = source()
    assert source(check_numerics=False) == default
    assert source() == default  # the comparison itself is deterministic
    on = source(check_numerics=True)
    marker = "_finite(" if make is be.NumPyTransformer else "check_numerics: then checked"
    assert on != default and marker not in default and marker in on
    assert make().check_numerics is False


# --- NumPy and GPU: the planted NaN -----------------------------------------------------

@pytest.mark.parametrize("make", TRANSFORMERS)
def test_planted_nan_in_the_digits_step_is_named(make):
    results, (x, labels), line = digits_step(plant=True)
    xb, yb = digits_batch()
    silent = make().computation(results, x, labels)
    with np.errstate(invalid="ignore"):
        assert np.isnan(silent(xb, yb)[0])  # without the mode the NaN goes unnoticed

    t = make(check_numerics=True)
    step = t.computation(results, x, labels)
    with pytest.raises(be.NumericsError) as info:
        step(xb, yb)
    e = info.value
    text = str(e)
    assert e.user_op == "Log planted"
    assert e.file_info == f'File "{__file__}", line {line}'
    assert f'built at File "{__file__}", line {line}' in text
    assert "NaN in" in text and "Log " in text.splitlines()[0]
    assert len(e.inputs) == 1 and e.inputs[0][1] is True  # h - 100 is finite
    assert "input 0: Subtract" in text and ": finite" in text
    assert isinstance(e, be.GeonError) and isinstance(e, FloatingPointError)


@pytest.mark.parametrize("make", TRANSFORMERS)
def test_checked_values_equal_unchecked_ones(make):
    """The mode changes nothing where all is finite: the same losses and weights."""
    xb, yb = digits_batch()
    runs = []
    for check in (False, True):
        results, (x, labels), _ = digits_step()
        t = make(check_numerics=check)
        step = t.computation(results, x, labels)
        losses = [step(xb, yb)[0] for _ in range(3)]
        runs.append((losses, [t.state[v].copy() for v in t.variables()]))
    np.testing.assert_allclose(runs[0][0], runs[1][0], rtol=1e-6)
    for a, b in zip(runs[0][1], runs[1][1]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


# --- what is named ------------------------------------------------------------------------

@pytest.mark.parametrize("make", TRANSFORMERS)
def test_first_op_of_an_elementwise_chain_is_named(make):
    """Log, Multiply, Exp, Add and the sum run as one fused kernel on the GPU; the
    first op that goes wrong (Log) is named, not the last."""
    N = be.Axis(8, "N")
    x = be.placeholder([N], name="x")
    the_log = be.log(x - 100)
    the_log.name = "the_log"
    y = be.exp(the_log * 2) + 1
    comp = make(check_numerics=True).computation(be.sum(y), x)
    v = np.arange(8, dtype=np.float32)
    with pytest.raises(be.NumericsError, match="Log") as info:
        comp(v)
    assert info.value.user_op == "Log the_log"
    [(name, ok)] = info.value.inputs
    assert name.startswith("Subtract") and ok
    if make is gpu_transformer:  # it ran in one fused kernel, which the error lists
        assert {"Multiply", "Exp", "Add"} <= {m.split("_")[0] for m in info.value.members}
    np.testing.assert_allclose(comp(v + 200), np.sum(np.exp(np.log(v + 100) * 2) + 1),
                               rtol=1e-5)


@pytest.mark.parametrize("make", TRANSFORMERS)
def test_infinity_and_the_input_that_was_not_finite(make):
    N = be.Axis(4, "N")
    x = be.placeholder([N], name="x", dtype=np.float64)
    w = be.Variable([N], dtype=np.float64, name="w", initial_value=np.zeros(4))
    quotient = be.divide(x, w)
    quotient.name = "quotient"
    comp = make(check_numerics=True).computation(be.sum(quotient * 2), x)
    with pytest.raises(be.NumericsError, match="Inf in 4 of 4") as info:
        comp(np.ones(4))
    assert info.value.user_op == "Divide quotient"
    assert [ok for _, ok in info.value.inputs] == [True, True]
    # a variable holding NaN: the op reading it names it as the input not finite
    t = make(check_numerics=True)
    comp = t.computation(be.sum(be.exp(w) * 3.0), x)
    t.initialize()
    t.write_values({w: np.array([0.0, np.nan, 1.0, 2.0])})
    with pytest.raises(be.NumericsError) as info:
        comp(np.ones(4))
    assert ("w", False) in info.value.inputs
    assert "input 0: Variable w: not finite (NaN in 1 of 4" in str(info.value)


@pytest.mark.parametrize("make", TRANSFORMERS)
def test_a_primitive_names_the_users_op_it_was_lowered_from(make):
    N = be.Axis(2, "N")
    x = be.placeholder([N], name="x")
    total, line = be.sum(x, out_axes=()), sys._getframe().f_lineno
    total.name = "total"
    comp = make(check_numerics=True).computation(total * 0.5, x)
    with pytest.raises(be.NumericsError, match="Inf in 1 of 1") as info:
        comp(np.array([3e38, 3e38], np.float32))  # finite, but not their sum
    e = info.value
    assert e.user_op == "Sum total" and e.op != "total"  # a ReduceSum made by lowering
    assert str(e).startswith(f"check_numerics: ReduceSum {e.op} (from Sum total)")
    assert e.file_info == f'File "{__file__}", line {line}'
    assert e.inputs == [("x", True)]


@pytest.mark.parametrize("make", TRANSFORMERS)
def test_a_fed_nan_names_the_placeholder(make):
    results, (x, labels), _ = digits_step()
    xb, yb = digits_batch()
    xb[3, 5] = np.nan
    step = make(check_numerics=True).computation(results, x, labels)
    with pytest.raises(be.NumericsError, match="placeholder pixels .* was fed a value "
                                               "that is not finite .NaN in 1 of") as info:
        step(xb, yb)
    assert info.value.op == "pixels"
    assert info.value.file_info.startswith(f'File "{__file__}", line ')


@pytest.mark.parametrize("make", TRANSFORMERS)
def test_integer_values_are_not_checked(make):
    N, Y = be.Axis(6, "N"), be.Axis(3, "Y")
    x = be.placeholder([N, Y], name="x")
    comp = make(check_numerics=True).computation(be.argmax(x, reduction_axes=[Y]), x)
    assert "argmax" not in "".join(ln for ln in comp.source.splitlines()
                                   if "_finite(" in ln)
    v = np.random.default_rng(1).standard_normal((6, 3)).astype(np.float32)
    np.testing.assert_array_equal(comp(v), v.argmax(1))


def test_the_digits_example_model_trains_the_same_checked():
    """The example's own model (neon frontend: Affine layers, softmax cross-entropy,
    SGD) raises nothing in the mode and trains to the same losses."""
    from geon.examples import digits
    from geon.frontends import neon as nn
    images, labels = digits.load_digits()
    losses = []
    for check in (False, True):
        model = digits.build_model(dict(digits.HYPERPARAMETERS), images.shape[1],
                                   be.NumPyTransformer(check_numerics=check))
        data = nn.ArrayIterator(images[:320], labels[:320], 32, seed=0)
        history = model.fit(data, epochs=2, verbose=False)
        losses.append([h["loss"] for h in history])
    assert len(losses[1]) == 2
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-6)
