"""Random ops: the Philox generator against published answers, determinism (across
processes, backends, save/restore), statistics, dropout's mask in its gradient, CSE."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import geon as be
from geon.op_graph import random as rnd
from geon.op_graph.random import philox4x32

# A random op's counter update runs with it as meant: no computation warns about it
# (also after a first computation lowered the graph in place).
pytestmark = pytest.mark.filterwarnings("error::geon.errors.GeonWarning")

# Random123's known-answer vectors for philox4x32-10.
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8)),
    ((0xffffffff,) * 4, (0xffffffff,) * 2, (0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd)),
    ((0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344), (0xa4093822, 0x299f31d0),
     (0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1)),
]


@pytest.mark.parametrize("counter,key,expected", KAT)
def test_philox_known_answers(counter, key, expected):
    assert tuple(int(w) for w in philox4x32(counter, key)) == expected


def test_philox_vectorised_equals_one_at_a_time():
    words = rnd.philox_words(4 * 3, seed=7, stream=5, step=2)
    for b in range(3):
        one = philox4x32((b, 0, 2, 0), (7, 5))
        assert [int(w) for w in one] == [int(w) for w in words[4 * b:4 * b + 4]]


def test_uniform_words_to_floats():
    w = np.array([0xFFFFFFFF, 0, 0x100], dtype=np.uint32)
    assert np.array_equal(rnd.uniform_from_words(w, np.float32),
                          np.array([1 - 2.0 ** -24, 0.0, 2.0 ** -24], np.float32))
    w64 = np.array([0xFFFFFFFF, 0xFFFFFFFF, 0, 0], dtype=np.uint32)
    assert np.array_equal(rnd.uniform_from_words(w64, np.float64), [1 - 2.0 ** -53, 0.0])
    # (0, 1] for Box-Muller's u1: a zero word gives the smallest positive number
    assert rnd.uniform_from_words(np.zeros(1, np.uint32), np.float32, open_low=True)[0] > 0


A, B = be.Axis(6, "A"), be.Axis(5, "B")
BUILD = """
import numpy as np, geon as be
A, B = be.Axis(6, "A"), be.Axis(5, "B")
ops = [be.uniform([A, B], seed=11, stream=1), be.normal([A, B], seed=11, stream=2,
       dtype=np.float64), be.bernoulli(0.3, axes=[A], seed=11, stream=3),
       be.uniform([B], low=-2.0, high=3.0, seed=2**40 + 5, stream=4, dtype=np.float64),
       be.normal([A, B], mean=1.0, std=3.0, seed=11, stream=5, dtype=np.float32)]
"""


def _values(n_calls=2):
    scope = {}
    exec(BUILD, scope)
    f = be.NumPyTransformer().computation(scope["ops"])
    return [[np.array(v) for v in f()] for _ in range(n_calls)]


def test_bitwise_identical_in_another_process(tmp_path):
    out = tmp_path / "draws.npz"
    code = BUILD + textwrap.dedent(f"""
        f = be.NumPyTransformer().computation(ops)
        values = [np.array(v) for _ in range(2) for v in f()]
        np.savez({str(out)!r}, *values)
    """)
    subprocess.run([sys.executable, "-c", code], check=True)
    theirs = np.load(out)
    ours = [v for call in _values() for v in call]
    assert len(theirs.files) == len(ours)
    for i, v in enumerate(ours):
        assert theirs[f"arr_{i}"].dtype == v.dtype
        assert np.array_equal(theirs[f"arr_{i}"], v)


def test_reference_evaluator_equals_numpy_transformer_and_calls_differ():
    scope = {}
    exec(BUILD, scope)
    ops = scope["ops"]
    f = be.NumPyTransformer().computation(ops)
    state = {}
    for _ in range(2):
        got, ref = f(), be.evaluate(ops, state=state)
        for g, r in zip(got, ref):
            assert g.dtype == r.dtype and np.array_equal(g, r)
    first, second = _values()
    for a, b in zip(first, second):
        assert not np.array_equal(a, b)  # each call draws fresh numbers


def test_values_follow_the_documented_stream():
    u = be.uniform([A, B], seed=3, stream=9)
    f = be.NumPyTransformer().computation(u)
    f()
    words = rnd.philox_words(30, seed=3, stream=9, step=2)
    expect = ((words >> 8).astype(np.float32) * np.float32(2.0 ** -24)).reshape(6, 5)
    assert np.array_equal(f(), expect)


def test_save_draw_restore_draw(tmp_path):
    u = be.uniform([A, B], seed=1)
    z = be.normal([A], seed=1, dtype=np.float64)
    t = be.NumPyTransformer()
    f = t.computation([u, z])
    f()
    path = tmp_path / "state.npz"
    t.save(path)
    first = [np.array(v) for v in f()]
    f()
    t.restore(path)
    again = [np.array(v) for v in f()]
    for a, b in zip(first, again):
        assert np.array_equal(a, b)


def _mean_var_check(values, mean, var, fourth_central):
    n = values.size
    m = values.mean()
    v = values.var()
    assert abs(m - mean) < 4 * np.sqrt(var / n), (m, mean)
    assert abs(v - var) < 4 * np.sqrt((fourth_central - var ** 2) / n), (v, var)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_statistics_of_a_million_draws(dtype):
    N = be.Axis(1_000_000, "N")
    lo, hi, p = -1.0, 3.0, 0.3
    ops = [be.uniform([N], low=lo, high=hi, seed=5, dtype=dtype),
           be.normal([N], mean=2.0, std=0.5, seed=5, dtype=dtype),
           be.bernoulli(p, axes=[N], seed=5, dtype=dtype)]
    u, z, b = (np.asarray(v, np.float64) for v in be.NumPyTransformer().computation(ops)())
    w = hi - lo
    _mean_var_check(u, (lo + hi) / 2, w ** 2 / 12, w ** 4 / 80)
    _mean_var_check(z, 2.0, 0.25, 3 * 0.25 ** 2)
    _mean_var_check(b, p, p * (1 - p), p * (1 - p) * (1 - 3 * p + 3 * p * p))
    assert set(np.unique(b)) == {0.0, 1.0}
    assert u.min() >= lo and u.max() < hi


def test_dropout_gradient_uses_the_forward_mask():
    rate = 0.4
    x = be.placeholder([A, B], dtype=np.float64, name="x")
    c = be.placeholder([A, B], dtype=np.float64, name="c")
    y = be.dropout(x, rate, seed=4)
    g = be.deriv(be.sum(y * c, out_axes=()), x)
    f = be.NumPyTransformer().computation([y, g], x, c)
    rng = np.random.default_rng(0)
    X = rng.uniform(1.0, 2.0, (6, 5))  # never zero: the mask is y != 0
    C = rng.normal(size=(6, 5))
    for _ in range(3):  # a new mask each call, the same one for value and gradient
        yv, gv = (np.array(v) for v in f(X, C))
        mask = yv != 0
        assert 0 < mask.sum() < mask.size
        assert np.allclose(yv[mask], X[mask] / (1 - rate), rtol=0, atol=1e-15)
        assert np.allclose(gv, mask * C / (1 - rate), rtol=0, atol=1e-15)


def test_dropout_off_and_bad_rate():
    x = be.placeholder([A], name="x")
    assert be.dropout(x, 0.5, training=False) is x
    with pytest.raises(be.GeonError, match="rate"):
        be.dropout(x, 1.0)


def test_bernoulli_with_an_op_probability():
    p = be.placeholder([A], dtype=np.float64, name="p")
    b = be.bernoulli(p, seed=2)
    P = np.array([0.0, 1.0, 0.0, 1.0, 0.0, 1.0])
    got = be.NumPyTransformer().computation(b, p)(P)
    assert np.array_equal(got, P)


def test_cse_keeps_random_ops_apart_unless_the_stream_is_shared():
    a = be.uniform([A], seed=0)
    b = be.uniform([A], seed=0)
    assert a.stream != b.stream
    va, vb = be.NumPyTransformer().computation([a, b])()
    assert not np.array_equal(va, vb)
    c = be.uniform([A], seed=0, stream=a.stream)  # the same stream: the same numbers
    vc, = be.NumPyTransformer().computation([c])()
    va2, = be.NumPyTransformer().computation([a])()
    assert np.array_equal(va2, vc)


def test_random_values_are_constants_for_derivatives():
    x = be.placeholder([A], dtype=np.float64, name="x")
    y = x * be.normal([A], seed=1, dtype=np.float64)
    g = be.deriv(be.sum(y, out_axes=()), x)
    yv, gv = be.NumPyTransformer().computation([y, g], x)(np.ones(6))
    assert np.array_equal(yv, gv)


def test_bad_arguments_are_named():
    with pytest.raises(be.GeonError, match="seed"):
        be.uniform([A], seed=-1)
    with pytest.raises(be.GeonError, match="float32 or float64"):
        be.uniform([A], dtype=np.int32)
    with pytest.raises(be.GeonError, match="axes="):
        be.bernoulli(0.5)


def test_np_family_forms():
    u = be.np.uniform((3, 4), low=1.0, high=2.0, seed=3, stream=77)
    z = be.np.normal(5, seed=3, dtype=np.float64)
    x = be.np.placeholder((3, 4), dtype=np.float64)
    d = be.np.dropout(x, 0.5, seed=1)
    b = be.np.bernoulli(0.5, size=(2, 2))
    uv, zv, dv, bv = be.NumPyTransformer().computation([u, z, d, b], x)(np.ones((3, 4)))
    assert uv.shape == (3, 4) and zv.shape == (5,) and bv.shape == (2, 2)
    assert zv.dtype == np.float64 and ((uv >= 1) & (uv < 2)).all()
    assert set(np.unique(dv)) <= {0.0, 2.0}
    ref = rnd.draw("uniform", (3, 4), np.float32, 3, 77, 1) + np.float32(1.0)
    assert np.allclose(uv, ref, rtol=0, atol=1e-6)


# --- the GPU code: the emulator (tiny sizes) and nvcc ----------------------------------------

def _gpu_graph():
    E = be.Axis(7, "E")
    M = be.Axis(300, "M")
    return [be.uniform([E, B], seed=9, stream=101), be.normal([E], seed=9, stream=102),
            be.uniform([E], seed=2 ** 33 + 1, stream=103, dtype=np.float64),
            be.normal([B], seed=9, stream=104, dtype=np.float64),
            be.dropout(be.constant(np.ones(7), axes=[E], dtype=np.float64), 0.5, seed=9,
                       stream=105),
            be.normal([M], seed=2 ** 40 + 3, stream=106, dtype=np.float32),
            be.normal([M], seed=2 ** 40 + 3, stream=107, dtype=np.float64)]


def test_emulated_gpu_draws_the_same_numbers():
    from cuda_emulator import EmulatorRuntime, find_compiler
    if find_compiler() is None:
        pytest.skip("no C++ compiler for the GPU emulator")
    from geon.transformers.gpu import GPUTransformer
    ops = _gpu_graph()
    gpu = GPUTransformer(runtime=EmulatorRuntime(seed=0)).computation(ops)
    cpu = be.NumPyTransformer().computation(ops)
    for _ in range(2):  # each advances its own counter: the same steps
        got, want = gpu(), cpu()
        for g, w in zip(got, want):  # uniform, normal, masks: the same bits
            assert g.dtype == w.dtype
            assert np.array_equal(g, w)


def test_nvcc_compiles_the_random_kernel(tmp_path):
    import shutil
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH")
    from geon.transformers.gpu import CudaCodegenTransformer
    f = CudaCodegenTransformer().computation(_gpu_graph())
    assert "geon_philox_word" in f.source
    src = tmp_path / "random.cu"
    from geon.transformers.gpu.codegen import module_source
    src.write_text(module_source(list(f.kernels.values())))
    proc = subprocess.run([nvcc, "-ptx", "-arch=sm_90", "-o", str(tmp_path / "r.ptx"),
                           str(src)], capture_output=True, text=True)
    assert proc.returncode == 0 and "warning" not in proc.stderr, proc.stderr[-3000:]


# --- normal draws: log and cos(2 pi u) as fixed IEEE operation sequences ----------------------

def _spread_uniforms(rng, n):
    """Uniform numbers as the draws make them (53 and 24 bits), plus the awkward ones:
    the quarter turns and their neighbours, and the ends of (0, 1]."""
    k53 = rng.integers(0, 2 ** 53, n, dtype=np.int64).astype(np.float64) * 2.0 ** -53
    k24 = rng.integers(0, 2 ** 24, n, dtype=np.int64).astype(np.float64) * 2.0 ** -24
    quarters = np.array([0.0, 0.25, 0.5, 0.75])
    near = (quarters[:, None] + np.arange(-40, 41) * 2.0 ** -53).ravel()
    return np.concatenate([k53, k24, near[(near >= 0) & (near < 1)],
                           1 - np.arange(1, 200) * 2.0 ** -53])


def _ulps(got, exact):
    """|got - exact| in ulps of the float64 nearest ``exact`` (a long double)."""
    return np.abs(got.astype(np.longdouble) - exact) / np.spacing(np.abs(exact.astype(np.float64)))


needs_long_double = pytest.mark.skipif(
    np.finfo(np.longdouble).nmant < 63,
    reason="the accuracy reference needs an 80-bit or wider long double")


@needs_long_double
def test_portable_log_is_within_two_ulps():
    from geon.op_graph import portable_math as pm
    rng = np.random.default_rng(0)
    x = np.concatenate([_spread_uniforms(rng, 50_000)[1:],  # u1 is never 0
                        np.exp(rng.uniform(-700.0, 700.0, 50_000)),
                        1 + np.arange(1, 500) * 2.0 ** -52, [2.0 ** -1022, 1.0, 2.0, 0.5]])
    x = x[x > 0]
    got = pm.log(x)
    exact = np.log(x.astype(np.longdouble))
    nonzero = exact != 0
    assert np.all(got[~nonzero] == 0)
    worst = _ulps(got[nonzero], exact[nonzero]).max()
    assert worst <= 2.0, worst
    # and so within a few ulps of NumPy's own log (itself within 1 ulp)
    assert (_ulps(got[nonzero], np.log(x[nonzero]).astype(np.longdouble)).max()) <= 3.0


@needs_long_double
def test_portable_cos_2pi_is_within_two_ulps():
    from geon.op_graph import portable_math as pm
    rng = np.random.default_rng(1)
    u = _spread_uniforms(rng, 50_000)
    u = u[(u >= 0) & (u < 1)]
    got = pm.cos_2pi(u)
    # the exact value, reduced by quarter turns (4u and its fractional part are exact)
    t = 4 * u
    q = np.floor(t)
    r = t - q
    q = np.where(r > 0.5, q + 1, q) % 4
    r = np.where(r > 0.5, r - 1, r)
    x = np.longdouble("1.57079632679489661923132169163975144") * r.astype(np.longdouble)
    exact = np.select([q == 0, q == 1, q == 2], [np.cos(x), -np.sin(x), -np.cos(x)], np.sin(x))
    zero = exact == 0  # u a multiple of 1/4 with an odd quadrant: exactly 0
    assert np.all(got[zero] == 0) and np.all(np.isin(u[zero], [0.25, 0.75]))
    worst = _ulps(got[~zero], exact[~zero]).max()
    assert worst <= 2.0, worst
    # NumPy rounds 2 pi u first: agreement within a few ulps of 1 (absolute)
    assert np.abs(got - np.cos(2 * np.pi * u)).max() <= 4 * 2.0 ** -52


def test_compiled_portable_math_gives_numpys_bits():
    """The CUDA C of log, cos(2 pi u) and Box-Muller, compiled for the host as the
    emulator compiles kernels, gives the NumPy program's bits on 10**5 points."""
    import ctypes
    from cuda_emulator import SHIM, _build, find_compiler
    if find_compiler() is None:
        pytest.skip("no C++ compiler for the GPU emulator")
    from geon.op_graph import portable_math as pm
    source = SHIM + pm.CUDA_SOURCE + """
extern "C" void run_all(long n, const double* u1, const double* u2, double* lg, double* cs,
                        double* z) {
    for (long i = 0; i < n; ++i) {
        lg[i] = geon_log(u1[i]); cs[i] = geon_cos_2pi(u2[i]); z[i] = geon_normal(u1[i], u2[i]);
    }
}
"""
    lib = ctypes.CDLL(_build(source, "portable-math"))
    rng = np.random.default_rng(2)
    u2 = _spread_uniforms(rng, 50_000)
    u2 = u2[(u2 >= 0) & (u2 < 1)]
    u1 = 1.0 - u2  # in (0, 1]
    out = [np.empty_like(u1) for _ in range(3)]
    ptr = [a.ctypes.data_as(ctypes.c_void_p) for a in [u1, u2, *out]]
    lib.run_all(ctypes.c_long(u1.size), *ptr)
    for got, want in zip(out, [pm.log(u1), pm.cos_2pi(u2), pm.normal_from_uniforms(u1, u2)]):
        assert np.array_equal(got.view(np.uint64), want.view(np.uint64))


def test_normal_draws_are_box_muller_of_the_documented_uniforms():
    from geon.op_graph import portable_math as pm
    for dtype in (np.float32, np.float64):
        z = rnd.draw("normal", (4, 5), dtype, seed=3, stream=8, step=2)
        per = rnd.words_per_uniform(dtype)
        w = rnd.philox_words(40 * per, seed=3, stream=8, step=2).reshape(20, 2, per)
        u1 = rnd.uniform_from_words(w[:, 0].reshape(-1), dtype, open_low=True)
        u2 = rnd.uniform_from_words(w[:, 1].reshape(-1), dtype)
        want = pm.normal_from_uniforms(u1, u2).astype(dtype).reshape(4, 5)
        assert z.dtype == dtype and np.array_equal(z, want)
        # a few ulps from the same formula with NumPy's log and cos
        a, b = u1.astype(np.float64), u2.astype(np.float64)
        libm = np.sqrt(-2 * np.log(a)) * np.cos(2 * np.pi * b)
        np.testing.assert_allclose(z.astype(np.float64).ravel(), libm, rtol=0,
                                   atol=1e-6 if dtype == np.float32 else 1e-14)
