"""What ops, transformers and computations look like when printed, and ops refusing a
truth value."""

import inspect
import os

import numpy as np
import pytest

import geon as be

HERE = os.path.basename(__file__)


def line():
    """The caller's line number."""
    return inspect.currentframe().f_back.f_lineno


def test_op_repr_shows_class_name_axes_dtype_and_site():
    C, N = be.Axis(64, "C"), be.Axis(128, "N")
    x = be.placeholder([C, N], name="x"); at_x = line()
    y = be.tanh(x); at_y = line()
    assert repr(x) == f"<Placeholder 'x' (C:64, N:128) float32 @ {HERE}:{at_x}>"
    assert repr(y) == f"<Tanh '{y.name}' (C:64, N:128) float32 @ {HERE}:{at_y}>"
    assert str(y) == repr(y)
    s = be.sum(be.cast_axes(x, [C, N]) * 1.0, out_axes=()); at_s = line()
    assert repr(s) == f"<Sum '{s.name}' () float32 @ {HERE}:{at_s}>"
    i = be.argmax(be.placeholder([C, N], dtype=np.float64), reduction_axes=[C])
    assert f"'{i.name}' (N:128) int64 @ {HERE}:" in repr(i)


def test_void_and_multi_output_reprs():
    C = be.Axis(4, "C")
    v = be.Variable(axes=[C], initial_value=0.0, name="v")
    s = be.SetItem(v, v + 1); at = line()
    assert repr(s) == f"<SetItem '{s.name}' @ {HERE}:{at}>"
    lo, hi = be.split(be.placeholder([C]), C, 2); at = line()
    assert repr(lo) == f"<Output '{lo.name}' (C[0:2]:2) float32 @ {HERE}:{at}>"


def test_repr_of_ops_built_in_a_string_shows_the_pseudo_file():
    ns = {"be": be}
    exec("C = be.Axis(2, 'C')\nx = be.placeholder(C, name='x')", ns)
    assert repr(ns["x"]) == "<Placeholder 'x' (C:2) float32 @ <string>:2>"


def test_bool_of_an_op_raises_naming_the_op_and_line():
    C = be.Axis(3, "C")
    y = be.placeholder([C], name="y")
    for attempt in (lambda: bool(y), lambda: y and 1, lambda: not y):
        with pytest.raises(be.TruthValueError) as e:
            attempt()
        assert isinstance(e.value, TypeError) and isinstance(e.value, be.GeonError)
        assert f"Placeholder y (built at File \"{__file__}\"" in str(e.value)
        assert "has no truth value" in str(e.value)
    c = y < 0; at = line()
    with pytest.raises(be.TruthValueError, match=f"Less {c.name} .*line {at}"):
        if c:
            pass


def test_transformer_and_computation_reprs():
    C, N = be.Axis(3, "C"), be.Axis(2, "N")
    x = be.placeholder([C, N], name="x")
    w = be.Variable(axes=[C], initial_value=1.0, name="w")
    y = be.tanh(x * w)
    t = be.NumPyTransformer()
    assert repr(t) == "<NumPyTransformer 'numpy': 0 computations>"
    comp = t.computation([y, be.SetItem(w, w * 2)], x)
    primitives = sum(1 for op in comp.ops if not isinstance(op, be.Placeholder)
                     and not isinstance(op, (be.Variable, be.Constant)))
    assert primitives > 0
    assert repr(comp) == (f"<NumPyComputation of NumPyTransformer 'numpy': "
                          f"(x: (C:3, N:2) float32) -> ({y.name}: (C:3, N:2) float32, "
                          f"{comp.requested[1].name}), {primitives} primitives>")
    assert repr(t) == "<NumPyTransformer 'numpy': 1 computation, 1 variable>"
    comp(np.ones((3, 2)))
    assert repr(t) == "<NumPyTransformer 'numpy': 1 computation, 1 variable, allocated>"
    t2 = be.NumPyTransformer(disable=["cse"])
    assert repr(t2) == "<NumPyTransformer 'numpy': 0 computations, disable=['cse']>"


def test_long_parameter_lists_are_shortened():
    C = be.Axis(2, "C")
    xs = [be.placeholder([C], name=f"x{i}") for i in range(9)]
    total = xs[0]
    for x in xs[1:]:
        total = total + x
    comp = be.NumPyTransformer().computation(total, *xs)
    assert "x5: (C:2) float32, ... 3 more) -> (" in repr(comp)


def test_gpu_transformer_repr_names_its_device():
    # The GPU transformer on the test suite's CPU emulator of the generated kernels
    # (no device needed to make one; nothing is compiled by repr).
    from cuda_emulator import EmulatorRuntime
    from geon.transformers.gpu import GPUTransformer
    t = GPUTransformer(runtime=EmulatorRuntime(seed=0))
    assert repr(t) == "<GPUTransformer 'gpu': 0 computations, device CPU emulator, " \
                      "gemm='auto'>"
    t = GPUTransformer(runtime=EmulatorRuntime(seed=0), gemm="generated", cuda_graphs=False)
    assert repr(t) == "<GPUTransformer 'gpu': 0 computations, device CPU emulator, " \
                      "gemm='generated', cuda_graphs=False>"
