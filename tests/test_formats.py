"""``be.np.round_to_format``: rounding to narrow number formats held widened, checked
against ml_dtypes' conversions (and onnx's E8M0 helper), and its straight-through
gradient."""

import numpy as np
import pytest

import geon as be
from geon.errors import ArgumentError
from geon.op_graph.formats import FORMATS, round_array

ml_dtypes = pytest.importorskip("ml_dtypes", reason="the reference conversions come from "
                                "ml_dtypes (installed with onnx)")

FLOATS = ["bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz",
          "float4_e2m1fn"]
INTS = ["int4", "uint4", "int2", "uint2"]


def _values(seed=0):
    """Random values over many binades, and the edge cases of every format: zeros,
    NaN, infinities, the largest values and just past them, ties halfway between
    neighbours, the subnormal ranges and the smallest subnormals and half of them."""
    rng = np.random.default_rng(seed)
    x = np.concatenate([rng.standard_normal(4000) * s for s in
                        (1e-6, 1e-4, 1e-2, 1e-1, 1, 10, 300, 1e4, 1e6)])
    edges = [0.0, np.nan, np.inf, 448, 464, 470, 480, 240, 248, 57344, 61440, 61439, 65536,
             6, 5, 7, 0.25, 0.75, 1.25, 2.5, 1 + 1 / 16, 1 + 3 / 16,
             float.fromhex("0x1.fep127"), float.fromhex("0x1.ffp127"), 3e38]
    for e in range(-20, 0):  # powers of two and the ties between them (subnormals too)
        edges += [2.0 ** e, 1.5 * 2.0 ** e, 1.25 * 2.0 ** e, 1.125 * 2.0 ** e]
    x = np.concatenate([x, edges]).astype(np.float32)
    return np.concatenate([x, -x, np.array([-0.0], np.float32)])


def _same(got, want):
    return (got == want) | (np.isnan(got) & np.isnan(want))


@pytest.mark.parametrize("fmt", FLOATS)
@pytest.mark.parametrize("saturate", [True, False])
def test_float_formats_equal_ml_dtypes(fmt, saturate):
    x = _values()
    dt = getattr(ml_dtypes, fmt)
    info = ml_dtypes.finfo(dt)
    if fmt == "bfloat16" or not saturate and fmt != "float4_e2m1fn":
        want = x.astype(dt).astype(np.float32)  # IEEE / ONNX's saturate=0 rules
    else:  # saturation: clip to the largest finite value, then round
        want = np.clip(x, float(info.min), float(info.max)).astype(dt).astype(np.float32)
    got = round_array(x, fmt, saturate=saturate)
    assert got.dtype == np.float32
    ok = _same(got, want)
    if fmt == "float4_e2m1fn":  # no NaN in the format: a NaN stays NaN widened
        ok |= np.isnan(x) & np.isnan(got)
    assert ok.all(), list(zip(x[~ok][:5], got[~ok][:5], want[~ok][:5]))
    # The sign of zero: kept, except in the FNUZ formats (no negative zero).
    zeros = (want == 0) & ~np.isnan(x)
    assert np.array_equal(np.signbit(got[zeros]), np.signbit(want[zeros]))
    if fmt.endswith("fnuz"):
        assert not np.signbit(got[got == 0]).any()


def test_saturation_rules_of_onnx_cast():
    big = np.array([1e6, -1e6, np.inf, -np.inf], np.float32)
    assert round_array(big, "float8_e4m3fn").tolist() == [448, -448, 448, -448]
    assert np.isnan(round_array(big, "float8_e4m3fn", saturate=False)).all()
    assert round_array(big, "float8_e5m2", saturate=False).tolist() == \
        [np.inf, -np.inf, np.inf, -np.inf]
    assert np.isnan(round_array(big, "float8_e5m2fnuz", saturate=False)).all()
    assert round_array(big, "float4_e2m1fn", saturate=False).tolist() == [6, -6, 6, -6]
    b = round_array(np.array([3.4e38, np.inf], np.float32), "bfloat16")
    assert np.isinf(b).all()  # bfloat16 overflows to infinity (IEEE), saturate or not
    # Ties go to the even neighbour: 464 lies halfway between 448 and 480.
    assert round_array(np.float32(464), "float8_e4m3fn") == 448
    assert round_array(np.float32(1 + 1 / 16), "float8_e4m3fn") == 1
    assert round_array(np.float32(1 + 3 / 16), "float8_e4m3fn") == 1.25


@pytest.mark.parametrize("fmt", INTS)
def test_integer_formats_keep_the_low_bits_as_ml_dtypes(fmt):
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.uniform(-300, 300, 5000), np.arange(-40, 40),
                        np.arange(-40, 40) + 0.5]).astype(np.float32)
    want = x.astype(getattr(ml_dtypes, fmt)).astype(np.float32)
    assert np.array_equal(round_array(x, fmt), want)
    ints = np.arange(-300, 300, dtype=np.int32)
    r = round_array(ints, fmt)
    assert r.dtype == np.int32
    lo, hi = FORMATS[fmt].lo, FORMATS[fmt].hi
    assert r.min() == lo and r.max() == hi
    assert np.array_equal(r % (hi - lo + 1), ints % (hi - lo + 1))


@pytest.mark.parametrize("mode", ["up", "down", "nearest"])
def test_e8m0_equals_onnx_helper(mode):
    onnx_helper = pytest.importorskip("onnx.numpy_helper", reason="needs the onnx package")
    rng = np.random.default_rng(2)
    x = np.abs(np.concatenate([rng.standard_normal(3000) * 10.0 ** k
                               for k in range(-37, 38, 3)])).astype(np.float32)
    x = np.concatenate([x, np.array([1e-40, 2 ** -127, 2 ** -126, 1.5, 3, 0.75, 1, 2 ** 127,
                                     3e38, np.nan], np.float32)])
    want = onnx_helper.to_float8e8m0(x, True, mode).astype(np.float32)
    got = round_array(x, "float8_e8m0fnu", saturate=True, round_mode=mode)
    assert _same(got, want).all()
    # Zero (float32's exponent field 0) is the smallest value, 2**-127.
    assert round_array(np.float32(0), "float8_e8m0fnu") == 2.0 ** -127
    # Where the ONNX Cast table and onnx's helper differ, geon follows the table:
    # infinity saturates to the largest value; without saturation anything out of range
    # (zero included) is NaN.
    assert round_array(np.float32(np.inf), "float8_e8m0fnu") == 2.0 ** 127
    nosat = round_array(np.array([0, 3e38, 1], np.float32), "float8_e8m0fnu",
                        saturate=False, round_mode="nearest")
    assert np.isnan(nosat[:2]).all() and nosat[2] == 1


@pytest.mark.parametrize("fmt", FLOATS + INTS + ["float8_e8m0fnu"])
def test_the_op_runs_in_a_graph_and_is_idempotent(fmt):
    x = _values(3)[:2000].reshape(40, 50)
    if fmt in INTS:
        x = np.where(np.isfinite(x), np.clip(x, -1e6, 1e6), 0).astype(np.float32)
    p = be.np.placeholder((40, 50))
    y = be.np.round_to_format(p * 1.0, fmt)
    f = be.make_transformer("numpy").computation([y, be.np.round_to_format(y, fmt)], p)
    got, again = f(x)
    assert _same(got, round_array(x, fmt)).all()
    assert _same(again, got).all()  # values on the grid stay where they are
    assert _same(be.evaluate(be.np.round_to_format(x, fmt)), got).all()


def test_straight_through_gradient():
    """The derivative passes the incoming gradient unchanged: for
    ``L = sum(w * tanh(round(3 x)))`` it is ``3 w tanh'(round(3 x))``, compared with
    float64 central differences of ``tanh`` at the rounded values."""
    rng = np.random.default_rng(4)
    x0 = rng.standard_normal((4, 5)).astype(np.float32)
    w0 = rng.standard_normal((4, 5))
    x = be.np.variable(x0)
    q = be.np.round_to_format(x * 3.0, "float8_e4m3fn")
    loss = be.np.sum(be.np.tanh(q) * be.np.constant(w0.astype(np.float32)))
    grad = be.make_transformer("numpy").computation([be.deriv(loss, x)])()[0]
    qv = round_array(x0 * np.float32(3), "float8_e4m3fn").astype(np.float64)
    eps = 1e-6
    dtanh = (np.tanh(qv + eps) - np.tanh(qv - eps)) / (2 * eps)
    np.testing.assert_allclose(grad, 3 * w0 * dtanh, rtol=1e-5, atol=1e-6)
    # Integer formats too: the gradient of sum(round(x)) is all ones.
    g = be.evaluate(be.deriv(be.np.sum(be.np.round_to_format(x, "int4")), x))
    assert np.array_equal(g, np.ones((4, 5), np.float32))


def test_bad_format_and_round_mode_are_refused():
    with pytest.raises(ArgumentError, match="unknown format 'float7'"):
        be.np.round_to_format(be.np.zeros(3), "float7")
    with pytest.raises(ArgumentError, match="round_mode"):
        be.np.round_to_format(be.np.zeros(3), "float8_e8m0fnu", round_mode="odd")


def test_geon_imports_without_ml_dtypes():
    """Importing geon (and using the op) never needs ml_dtypes: only the ONNX frontend
    imports it."""
    import subprocess
    import sys
    code = ("import sys; sys.modules['ml_dtypes'] = None\n"
            "import geon as be, numpy as np\n"
            "print(be.evaluate(be.np.round_to_format(np.float32(464), 'float8_e4m3fn')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "448.0"
