"""The op table: one list of cases that drives the forward tests (tests/test_ops.py) and
the gradient checks (tests/test_gradcheck.py).

Each :class:`OpCase` says

- ``name``: a readable test id;
- ``op``: the public geon function it covers (``"add"``, ``"sum"``, ...), so that
  coverage of the whole op set can be asserted;
- ``inputs``: one :class:`Inp` per input: its axes, its value domain (positive for
  ``log``, tie-free for ``max`` ...), and whether it holds floats or integer labels;
- ``build(*input_ops)``: the geon graph under test;
- ``out``: the names of the result's axes, in order (the axes rule is checked too);
- ``expect(*arrays)``: the expected value, written directly with NumPy on float64
  copies of the inputs (laid out as their ``Inp.axes``), with every axis order explicit.
  It never calls geon, so it is independent of geon's reference evaluator;
- ``grad``: whether the gradient checker applies (a derivative exists almost
  everywhere and the inputs' domain keeps away from kinks and ties; for piecewise
  constant ops such as ``sign`` or comparisons that derivative is zero);
- ``out_dtype``: ``None`` for the float type of the inputs, else a fixed dtype;
- ``pass_dtype``: ``build`` takes the float type as a ``dtype=`` keyword.

The axes are fresh objects with small, mostly distinct lengths so that a transposition
or a wrong axis choice changes shapes or values.
"""

import dataclasses
import zlib
from typing import Callable, Optional, Tuple

import math

import numpy as np

import geon as be

try:  # the independent reference of the newer ops, where it is installed
    import torch
    import torch.nn.functional as TF
except ImportError:  # pragma: no cover - then plain NumPy formulas
    torch = TF = None

# --- axes ------------------------------------------------------------------------------
C = be.Axis(3, "C")
H = be.Axis(4, "H")
W = be.Axis(2, "W")
N = be.Axis(5, "N", batch=True)
T = be.Axis(2, "T", recurrent=True)
C2 = be.Axis(3, "C2")   # for cast_axes
H2 = be.Axis(4, "H2")


# --- value domains ---------------------------------------------------------------------
def _grid(rng, shape, offset):
    return rng.integers(-8, 9, size=shape) * 0.25 + offset


def _distinct(rng, shape):
    n = int(np.prod(shape, dtype=np.int64))
    return ((rng.permutation(n) - n // 2) * 0.25 + 0.125).reshape(shape)


def _nonzero(rng, shape):
    return rng.uniform(0.5, 2.0, shape) * rng.choice([-1.0, 1.0], shape)


def _with_zeros(rng, shape):
    v = rng.uniform(0.0, 2.0, shape)
    v.reshape(-1)[::3] = 0.0
    return v


#: domain name -> fn(rng, shape) -> float64 array. All values are exact or far from the
#: kinks of the ops that use them.
DOMAINS = {
    "real": lambda rng, s: rng.uniform(-2.0, 2.0, s),
    "positive": lambda rng, s: rng.uniform(0.5, 2.0, s),
    "nonzero": _nonzero,                      # |x| >= 0.5 (abs, sign, reciprocal, prod)
    "unit": lambda rng, s: rng.uniform(0.05, 0.95, s),   # probabilities / targets
    "wide": lambda rng, s: rng.uniform(-40.0, 40.0, s),  # sigmoid saturation
    "distinct": _distinct,                    # no ties inside one tensor (max, argmax)
    "grid0": lambda rng, s: _grid(rng, s, 0.0),     # multiples of 1/4 ...
    "grid1": lambda rng, s: _grid(rng, s, 0.125),   # ... never equal to these (>= 1/8 apart)
    "int3": lambda rng, s: rng.integers(-1, 2, s).astype(np.float64),  # many ties
    "with_zeros": _with_zeros,                # exact zeros (safelog's floor, sign(0))
    "six": lambda rng, s: rng.uniform(-6.0, 6.0, s),    # hard_sigmoid's kinks at +-3
}


@dataclasses.dataclass(frozen=True)
class Inp:
    """An input: its axes, value domain, and kind (``"float"`` or ``"label"``; labels are
    int64 in ``[0, high)``)."""

    axes: Tuple[be.Axis, ...]
    domain: str = "real"
    kind: str = "float"
    high: int = 0

    def make(self, rng, dtype):
        shape = tuple(a.length for a in self.axes)
        if self.kind == "label":
            return rng.integers(0, self.high, size=shape).astype(np.int64)
        return np.asarray(DOMAINS[self.domain](rng, shape), dtype=dtype)

    def dtype(self, float_dtype):
        return np.dtype(np.int64) if self.kind == "label" else np.dtype(float_dtype)


@dataclasses.dataclass(frozen=True)
class OpCase:
    name: str
    op: str
    inputs: Tuple[Inp, ...]
    build: Callable
    out: Tuple[str, ...]
    expect: Callable
    grad: bool = True
    out_dtype: Optional[str] = None
    pass_dtype: bool = False

    def __repr__(self):
        return self.name

    def arrays(self, dtype, seed=0):
        """Deterministic input values for this case in float type ``dtype``."""
        rng = np.random.default_rng(zlib.crc32(self.name.encode()) + seed)
        return [i.make(rng, dtype) for i in self.inputs]

    def result_dtype(self, float_dtype):
        return np.dtype(self.out_dtype) if self.out_dtype else np.dtype(float_dtype)

    def make(self, xs, float_dtype):
        """Build the op under test from input ops ``xs``."""
        if self.pass_dtype:
            return self.build(*xs, dtype=float_dtype)
        return self.build(*xs)

    def expected(self, arrays):
        """The NumPy expectation from the (rounded) input values, in float64."""
        args = [a if a.dtype.kind == "i" else a.astype(np.float64) for a in arrays]
        with np.errstate(all="raise"):
            return np.asarray(self.expect(*args))


CASES = []


def case(name, op, inputs, build, out, expect, **kw):
    inputs = tuple(i if isinstance(i, Inp) else Inp(tuple(i)) for i in inputs)
    CASES.append(OpCase(name, op, inputs, build, tuple(out), expect, **kw))


def I(*axes, domain="real"):  # noqa: E743 - short on purpose: I(C, N, domain="positive")
    return Inp(tuple(axes), domain)


def softplus(x):
    return np.logaddexp(0.0, x)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def softmax0(x, axes=(0,)):
    e = np.exp(x - x.max(axis=axes, keepdims=True))
    return e / e.sum(axis=axes, keepdims=True)


# --- elementwise binary, with broadcasting by name -------------------------------------
case("add(C,N)+(C,N)", "add", [I(C, N), I(C, N)], be.add, "CN", lambda a, b: a + b)
case("add(C,N)+(N)", "add", [I(C, N), I(N)], be.add, "CN", lambda a, b: a + b[None, :])
case("add(C)+(N)->outer", "add", [I(C), I(N)], be.add, "CN",
     lambda a, b: a[:, None] + b[None, :])
case("add(C,H)+(H,C)", "add", [I(C, H), I(H, C)], lambda a, b: a + b, "CH",
     lambda a, b: a + b.T)
case("add_scalar", "add", [I(C, N)], lambda a: a + 1.5, "CN", lambda a: a + 1.5)
case("subtract(C,H)-(H,C)", "subtract", [I(C, H), I(H, C)], be.subtract, "CH",
     lambda a, b: a - b.T)
case("subtract(N)-(C,N)", "subtract", [I(N), I(C, N)], be.subtract, "NC",
     lambda a, b: a[:, None] - b.T)
case("rsubtract_scalar", "subtract", [I(C, N)], lambda a: 1.0 - a, "CN", lambda a: 1.0 - a)
case("multiply(N)*(C,N)", "multiply", [I(N), I(C, N)], be.multiply, "NC",
     lambda a, b: a[:, None] * b.T)
case("multiply(C,H,N)*(N,C)", "multiply", [I(C, H, N), I(N, C)], lambda a, b: a * b,
     "CHN", lambda a, b: a * b.T[:, None, :])
case("multiply(H,C)*(C,N,H)", "multiply", [I(H, C), I(C, N, H)], be.multiply, "HCN",
     lambda a, b: a[:, :, None] * np.einsum("cnh->hcn", b))
case("divide(C,N)/(N)", "divide", [I(C, N), I(N, domain="nonzero")], be.divide, "CN",
     lambda a, b: a / b[None, :])
case("divide(N)/(N,C)", "divide", [I(N), I(N, C, domain="nonzero")], lambda a, b: a / b,
     "NC", lambda a, b: a[:, None] / b)
case("rdivide_scalar", "divide", [I(C, N, domain="nonzero")], lambda a: 2.0 / a, "CN",
     lambda a: 2.0 / a)
case("power(C,N)**(N)", "power", [I(C, N, domain="positive"), I(N)], be.power, "CN",
     lambda a, b: a ** b[None, :])
case("power(H,C)**(C,H)", "power", [I(H, C, domain="positive"), I(C, H)], be.power,
     "HC", lambda a, b: a ** b.T)
case("power_scalar3", "power", [I(C, N)], lambda a: a ** 3.0, "CN", lambda a: a ** 3)
case("power_scalar2", "power", [I(C, N)], lambda a: a ** 2, "CN", lambda a: a * a)
case("rpower_scalar", "power", [I(C, N)], lambda a: 2.0 ** a, "CN", lambda a: 2.0 ** a)
case("maximum(C,N),(N)", "maximum", [I(C, N, domain="grid0"), I(N, domain="grid1")],
     be.maximum, "CN", lambda a, b: np.maximum(a, b[None, :]))
case("maximum(N),(N,C)", "maximum", [I(N, domain="grid1"), I(N, C, domain="grid0")],
     be.maximum, "NC", lambda a, b: np.maximum(a[:, None], b))
case("minimum(C,N),(N,C)", "minimum", [I(C, N, domain="grid0"), I(N, C, domain="grid1")],
     be.minimum, "CN", lambda a, b: np.minimum(a, b.T))
case("minimum(H),(C,H)", "minimum", [I(H, domain="grid1"), I(C, H, domain="grid0")],
     be.minimum, "HC", lambda a, b: np.minimum(a[:, None], b.T))

# --- comparisons: 1.0 / 0.0 in the float type. With ties (forward only) ... ------------
for _name, _fn, _npfn in [("equal", be.equal, np.equal),
                          ("not_equal", be.not_equal, np.not_equal),
                          ("less", be.less, np.less),
                          ("less_equal", be.less_equal, np.less_equal),
                          ("greater", be.greater, np.greater),
                          ("greater_equal", be.greater_equal, np.greater_equal)]:
    case(f"{_name}(C,N),(N)", _name, [I(C, N, domain="int3"), I(N, domain="int3")], _fn,
         "CN", lambda a, b, f=_npfn: f(a, b[None, :]).astype(np.float64), grad=False)
    case(f"{_name}(H,C),(C,H)", _name, [I(H, C, domain="int3"), I(C, H, domain="int3")],
         _fn, "HC", lambda a, b, f=_npfn: f(a, b.T).astype(np.float64), grad=False)
# ... and tie-free, where the (zero) derivative is checked.
case("less_tiefree", "less", [I(C, N, domain="grid0"), I(N, domain="grid1")],
     lambda a, b: a < b, "CN", lambda a, b: (a < b[None, :]).astype(np.float64))
case("greater_equal_tiefree", "greater_equal",
     [I(C, N, domain="grid1"), I(N, C, domain="grid0")], lambda a, b: a >= b, "CN",
     lambda a, b: (a >= b.T).astype(np.float64))

# --- elementwise unary -----------------------------------------------------------------
case("negative", "negative", [I(C, N)], be.negative, "CN", lambda x: -x)
case("negative_op", "negative", [I(C, N)], lambda x: -x, "CN", lambda x: -x)
case("absolute", "absolute", [I(C, N, domain="nonzero")], be.absolute, "CN", np.abs)
case("sign", "sign", [I(C, N, domain="nonzero")], be.sign, "CN", np.sign)
case("sign_zeros", "sign", [I(C, N, domain="int3")], be.sign, "CN", np.sign, grad=False)
case("square", "square", [I(C, N)], be.square, "CN", lambda x: x * x)
case("sqrt", "sqrt", [I(C, N, domain="positive")], be.sqrt, "CN", np.sqrt)
case("reciprocal", "reciprocal", [I(C, N, domain="nonzero")], be.reciprocal, "CN",
     lambda x: 1.0 / x)
case("exp", "exp", [I(C, N)], be.exp, "CN", np.exp)
case("log", "log", [I(C, N, domain="positive")], be.log, "CN", np.log)
case("log_exp", "log", [I(C, N)], lambda x: be.log(be.exp(x)), "CN", lambda x: x)
case("safelog", "safelog", [I(C, N, domain="positive")], be.safelog, "CN", np.log)
case("safelog_zeros", "safelog", [I(C, N, domain="with_zeros")], be.safelog, "CN",
     lambda x: np.where(x > 0, np.log(np.where(x > 0, x, 1.0)), -50.0), grad=False)
case("sin", "sin", [I(C, N)], be.sin, "CN", np.sin)
case("cos", "cos", [I(C, N)], be.cos, "CN", np.cos)
case("tanh", "tanh", [I(C, N)], be.tanh, "CN", np.tanh)
case("sigmoid", "sigmoid", [I(C, N)], be.sigmoid, "CN", sigmoid)
case("sigmoid_wide", "sigmoid", [I(C, N, domain="wide")], be.sigmoid, "CN", sigmoid)


def ref(torch_fn, numpy_fn):
    """PyTorch's ``torch_fn`` on the float64 inputs where torch is installed (an
    independent implementation), else the NumPy formula ``numpy_fn``."""
    if torch is None:
        return numpy_fn

    def f(*xs):
        return torch_fn(*[torch.from_numpy(np.ascontiguousarray(x)) for x in xs]).numpy()
    return f


_erf = np.vectorize(math.erf, otypes=[np.float64])


def _gelu(x):
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def _elu(x, a=1.0):
    return np.where(x > 0, x, a * np.expm1(np.minimum(x, 0.0)))


# --- activations and other elementwise newcomers ---------------------------------------
case("erf", "erf", [I(C, N)], be.erf, "CN", ref(torch.erf if torch else None, _erf))
case("erf_wide", "erf", [I(C, N, domain="wide")], be.erf, "CN", _erf)  # math.erf
case("erf_six", "erf", [I(C, N, domain="six")], be.erf, "CN", _erf)
case("expm1", "expm1", [I(C, N)], be.expm1, "CN", ref(torch.expm1 if torch else None,
                                                        np.expm1))
case("softplus", "softplus", [I(C, N)], be.softplus, "CN",
     ref(TF.softplus if TF else None, softplus))
# PyTorch returns x above 20; the exact value is log(1 + exp(x)):
case("softplus_wide", "softplus", [I(C, N, domain="wide")], be.softplus, "CN", softplus)
case("relu", "relu", [I(C, N)], be.relu, "CN", ref(TF.relu if TF else None,
                                                     lambda x: np.maximum(x, 0.0)))
case("leaky_relu", "leaky_relu", [I(C, N)], be.leaky_relu, "CN",
     ref(TF.leaky_relu if TF else None, lambda x: np.where(x > 0, x, 0.01 * x)))
case("leaky_relu(0.2)", "leaky_relu", [I(C, N)], lambda x: be.leaky_relu(x, 0.2), "CN",
     ref(lambda x: TF.leaky_relu(x, 0.2), lambda x: np.where(x > 0, x, 0.2 * x)))
case("elu", "elu", [I(C, N)], be.elu, "CN", ref(TF.elu if TF else None, _elu))
case("elu(0.5)_wide", "elu", [I(C, N, domain="wide")], lambda x: be.elu(x, 0.5), "CN",
     ref(lambda x: TF.elu(x, 0.5), lambda x: _elu(x, 0.5)))
case("selu", "selu", [I(C, N)], be.selu, "CN",
     ref(TF.selu if TF else None, lambda x: 1.0507009873554804934193349852946 * _elu(
         x, 1.6732632423543772848170429916717)))
case("gelu", "gelu", [I(C, N)], be.gelu, "CN", ref(TF.gelu if TF else None, _gelu))
case("gelu_wide", "gelu", [I(C, N, domain="six")], be.gelu, "CN", _gelu)
case("gelu_tanh", "gelu", [I(C, N)], lambda x: be.gelu(x, approximate="tanh"), "CN",
     ref(lambda x: TF.gelu(x, approximate="tanh"),
         lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))))
case("silu", "silu", [I(C, N)], be.silu, "CN",
     ref(TF.silu if TF else None, lambda x: x * sigmoid(x)))
case("silu_wide", "silu", [I(C, N, domain="wide")], be.silu, "CN",
     lambda x: x / (1.0 + np.exp(-x)))
case("hard_sigmoid", "hard_sigmoid", [I(C, N, domain="six")], be.hard_sigmoid, "CN",
     ref(TF.hardsigmoid if TF else None, lambda x: np.clip(x / 6 + 0.5, 0.0, 1.0)))
case("where(C,N),(C,N),(N)", "where", [I(C, N), I(C, N), I(N)],
     lambda c, a, b: be.where(c > 0.0, a, b), "CN",
     ref(lambda c, a, b: torch.where(c > 0, a, b[None, :]),
         lambda c, a, b: np.where(c > 0, a, b[None, :])))
case("where(N),(C,N),scalar", "where", [I(N), I(N, C)],
     lambda c, a: be.where(c > 0.0, a, -1.5), "NC",
     lambda c, a: np.where(c[:, None] > 0, a, -1.5))
# the branch not taken may be infinite: its derivative must not become NaN
case("where_safe_log", "where", [I(C, N)],
     lambda x: be.where(x > 0.0, be.log(be.absolute(x)), x), "CN",
     lambda x: np.where(x > 0, np.log(np.abs(x)), x))
case("clip", "clip", [I(C, N)], lambda x: be.clip(x, -0.5, 1.0), "CN",
     ref(lambda x: torch.clamp(x, -0.5, 1.0), lambda x: np.clip(x, -0.5, 1.0)))
case("clip_tensor_lo(N)", "clip", [I(C, N, domain="grid0"), I(N, domain="grid1")],
     lambda x, lo: be.clip(x, lo), "CN", lambda x, lo: np.maximum(x, lo[None, :]))
case("log_softmax(C,N)", "log_softmax", [I(C, N)], be.log_softmax, "CN",
     ref(lambda x: torch.log_softmax(x, 0), lambda x: np.log(softmax0(x))))
case("log_softmax_wide", "log_softmax", [I(C, N, domain="wide")], be.log_softmax, "CN",
     lambda x: x - x.max(0) - np.log(np.exp(x - x.max(0)).sum(0)))
case("log_softmax_norm(H)", "log_softmax", [I(C, H, N)],
     lambda x: be.log_softmax(x, normalization_axes=H), "CHN",
     ref(lambda x: torch.log_softmax(x, 1), lambda x: np.log(softmax0(x, (1,)))))
case("logsumexp_default", "logsumexp", [I(C, H, N)], be.logsumexp, "N",
     ref(lambda x: torch.logsumexp(x, (0, 1)),
         lambda x: np.log(np.exp(x).sum(axis=(0, 1)))))
case("logsumexp_out(N,C)_wide", "logsumexp", [I(C, H, N, domain="wide")],
     lambda x: be.logsumexp(x, out_axes=(N, C)), "NC",
     lambda x: (x.max(1) + np.log(np.exp(x - x.max(1, keepdims=True)).sum(1))).T)

# --- joining, padding, tiling (composites of slices and Unslice) -----------------------
S2 = be.Axis(2, "S2")
case("concat(C,H)+(C,W)", "concat", [I(C, H), I(C, W)],
     lambda a, b: be.concat([a, b], [H, W]), ("C", "H+W"),
     ref(lambda a, b: torch.cat([a, b], 1), lambda a, b: np.concatenate([a, b], 1)))
case("concat_reordered_three", "concat", [I(C, H), I(W, C), I(C, H)],
     lambda a, b, c: be.concat([a, b, c], [H, W, H], out_axis=be.Axis(10, "CAT")),
     ("C", "CAT"), ref(lambda a, b, c: torch.cat([a, b.T, c], 1),
                       lambda a, b, c: np.concatenate([a, b.T, c], 1)))
case("stack(C,N),(N,C)", "stack", [I(C, N), I(N, C)],
     lambda a, b: be.stack([a, b], S2, 1), ("C", "S2", "N"),
     ref(lambda a, b: torch.stack([a, b.T], 1), lambda a, b: np.stack([a, b.T], 1)))
case("tile(C,H)", "tile", [I(C, H)], lambda x: be.tile(x, {H: 2, "C": 3}), ("C*3", "H*2"),
     ref(lambda x: x.repeat(3, 2), lambda x: np.tile(x, (3, 2))))
case("pad_constant", "pad", [I(C, H, N)],
     lambda x: be.pad(x, {H: (2, 1), C: 1}, value=-0.5), ("C+1+1", "H+2+1", "N"),
     lambda x: np.pad(x, ((1, 1), (2, 1), (0, 0)), constant_values=-0.5))
case("pad_reflect", "pad", [I(C, H, N)], lambda x: be.pad(x, {H: (3, 2), N: (0, 4)},
                                                         mode="reflect"),
     ("C", "H+3+2", "N+0+4"),
     lambda x: np.pad(x, ((0, 0), (3, 2), (0, 4)), mode="reflect"))
case("pad_edge", "pad", [I(C, H, N)], lambda x: be.pad(x, {C: (2, 3), H: (0, 1)},
                                                      mode="edge"),
     ("C+2+3", "H+0+1", "N"),
     lambda x: np.pad(x, ((2, 3), (0, 1), (0, 0)), mode="edge"))

# --- gathering by integer indices; the derivative is a scatter-add ---------------------
def _scatter(d, ids, n):
    out = np.zeros((n,) + d.shape[1:])
    np.add.at(out, ids, d)
    return out


case("gather_embedding", "gather", [I(H, C), Inp((N,), kind="label", high=4)],
     lambda e, ids: be.gather(e, ids, H), "NC",
     ref(lambda e, ids: TF.embedding(ids, e), lambda e, ids: e[ids]))
case("gather_middle_2d_indices", "gather", [I(C, H, N), Inp((W, T), kind="label", high=4)],
     lambda x, ids: be.gather(x, ids, H), "CWTN", lambda x, ids: np.take(x, ids, axis=1))
case("gather_negative_indices", "gather", [I(C, H), Inp((N,), kind="label", high=4)],
     lambda x, ids: be.gather(x, ids - 4, "H"), "CN",
     lambda x, ids: np.take(x, ids - 4, axis=1))
case("scatter_add", "scatter_add", [I(N, C), Inp((N,), kind="label", high=4)],
     lambda d, ids: be.scatter_add(d, ids, H), "HC", lambda d, ids: _scatter(d, ids, 4))

# --- running sums, sorting -------------------------------------------------------------
case("cumsum(H)", "cumsum", [I(C, H, N)], lambda x: be.cumsum(x, H), "CHN",
     ref(lambda x: torch.cumsum(x, 1), lambda x: np.cumsum(x, 1)))
case("cumsum(N)", "cumsum", [I(C, N)], lambda x: be.cumsum(x, "N"), "CN",
     ref(lambda x: torch.cumsum(x, 1), lambda x: np.cumsum(x, 1)))
case("cumsum_reverse(C)", "cumsum", [I(C, H, N)], lambda x: be.cumsum(x, C, reverse=True),
     "CHN", lambda x: np.cumsum(x[::-1], 0)[::-1])
case("cumsum_exclusive(H)", "cumsum", [I(C, H)], lambda x: be.cumsum(x, H, exclusive=True),
     "CH", lambda x: np.cumsum(x, 1) - x)
case("cumsum_reverse_exclusive(H)", "cumsum", [I(H, N)],
     lambda x: be.cumsum(x, H, reverse=True, exclusive=True), "HN",
     lambda x: np.cumsum(x[::-1], 0)[::-1] - x)
case("sort(H)", "sort", [I(C, H, N, domain="distinct")], lambda x: be.sort(x, H), "CHN",
     ref(lambda x: torch.sort(x, 1).values, lambda x: np.sort(x, 1)))
case("sort_descending(C)", "sort", [I(C, H, domain="distinct")],
     lambda x: be.sort(x, C, descending=True), "CH",
     ref(lambda x: torch.sort(x, 0, descending=True).values, lambda x: -np.sort(-x, 0)))
case("argsort(N)", "argsort", [I(C, N, domain="distinct")], lambda x: be.argsort(x, N),
     "CN", ref(lambda x: torch.argsort(x, 1), lambda x: np.argsort(x, 1)),
     grad=False, out_dtype="int64")
case("argsort_ties_stable(H)", "argsort", [I(C, H, N, domain="int3")],
     lambda x: be.argsort(x, H, descending=True), "CHN",
     ref(lambda x: torch.argsort(x, dim=1, descending=True, stable=True),
         lambda x: np.argsort(-x, 1, kind="stable")), grad=False, out_dtype="int64")
case("topk_values(H)", "topk", [I(C, H, N, domain="distinct")],
     lambda x: be.topk(x, 2, H)[0], ("C", "H[:2]", "N"),
     ref(lambda x: torch.topk(x, 2, 1).values, lambda x: -np.sort(-x, 1)[:, :2]))
case("topk_indices(C)", "topk", [I(C, N, domain="distinct")],
     lambda x: be.topk(x, 1, C)[1], ("C[:1]", "N"),
     ref(lambda x: torch.topk(x, 1, 0).indices, lambda x: np.argsort(-x, 0)[:1]),
     grad=False, out_dtype="int64")

# --- reductions: x(C, H, N); the default keeps the batch axis N ------------------------
_RED = {
    "sum": (be.sum, np.sum, "real"),
    "max": (be.max, np.max, "distinct"),
    "min": (be.min, np.min, "distinct"),
    "mean": (be.mean, np.mean, "real"),
    "prod": (be.prod, np.prod, "nonzero"),
    "variance": (be.variance, np.var, "real"),
}
for _name, (_fn, _npfn, _dom) in _RED.items():
    x3 = I(C, H, N, domain=_dom)
    case(f"{_name}_default", _name, [x3], _fn, "N",
         lambda x, f=_npfn: f(x, axis=(0, 1)))
    case(f"{_name}_red(H)", _name, [x3], lambda x, fn=_fn: fn(x, reduction_axes=H), "CN",
         lambda x, f=_npfn: f(x, axis=1))
    case(f"{_name}_red(N,C)", _name, [x3],
         lambda x, fn=_fn: fn(x, reduction_axes=be.Axes(N, C)), "H",
         lambda x, f=_npfn: f(x, axis=(0, 2)))
    case(f"{_name}_out(N,C)", _name, [x3], lambda x, fn=_fn: fn(x, out_axes=(N, C)), "NC",
         lambda x, f=_npfn: f(x, axis=1).T)
    case(f"{_name}_all", _name, [x3], lambda x, fn=_fn: fn(x, reduction_axes=x.axes), "",
         lambda x, f=_npfn: f(x))
case("sum_default_recurrent", "sum", [I(C, T, N)], be.sum, "TN",
     lambda x: x.sum(axis=0))
case("sum_red_and_out", "sum", [I(C, H, N)],
     lambda x: be.sum(x, reduction_axes=(C, H), out_axes=(N,)), "N",
     lambda x: x.sum(axis=(0, 1)))
case("mean_red(N)", "mean", [I(C, N)], lambda x: be.mean(x, reduction_axes=N), "C",
     lambda x: x.mean(axis=1))
case("max_vector", "max", [I(C, domain="distinct")], be.max, "", np.max)
# Ties: max(x, x, x, x) = x, so tied extremes must share the derivative (sum 1, not 4).
case("max_over_broadcast", "max", [I(C)],
     lambda x: be.max(be.broadcast(x, (H, C)), reduction_axes=H), "C", lambda x: x)
case("min_over_broadcast", "min", [I(C, N)],
     lambda x: be.min(be.broadcast(x, (N, H, C)), out_axes=(N, C)), "NC", lambda x: x.T)
case("max_ties", "max", [I(C, H, N, domain="int3")], be.max, "N",
     lambda x: x.max(axis=(0, 1)), grad=False)


def _argred(np_arg, x, keep, red):
    """Index of the extreme of ``x`` (axes C, H, N = 0, 1, 2) row-major over the
    positions ``red`` (in x's order), for each index of the positions ``keep``."""
    xt = np.transpose(x, list(keep) + list(red))
    shape = xt.shape[:len(keep)]
    return np_arg(xt.reshape(shape + (-1,)), axis=-1)


for _name, _fn, _npfn in [("argmax", be.argmax, np.argmax), ("argmin", be.argmin, np.argmin)]:
    x3 = I(C, H, N, domain="distinct")
    kw = dict(grad=False, out_dtype="int64")
    case(f"{_name}_default", _name, [x3], _fn, "N",
         lambda x, f=_npfn: _argred(f, x, [2], [0, 1]), **kw)
    case(f"{_name}_red(H)", _name, [x3], lambda x, fn=_fn: fn(x, reduction_axes=H), "CN",
         lambda x, f=_npfn: f(x, axis=1), **kw)
    case(f"{_name}_red(N,C)", _name, [x3],
         lambda x, fn=_fn: fn(x, reduction_axes=(N, C)), "H",
         lambda x, f=_npfn: _argred(f, x, [1], [0, 2]), **kw)
    case(f"{_name}_out(N,C)", _name, [x3], lambda x, fn=_fn: fn(x, out_axes=(N, C)), "NC",
         lambda x, f=_npfn: f(x, axis=1).T, **kw)
    case(f"{_name}_all", _name, [x3], lambda x, fn=_fn: fn(x, reduction_axes=x.axes), "",
         lambda x, f=_npfn: f(x.reshape(-1)), **kw)

# --- dot: contracts the shared axes; result = a's other axes then b's other axes -------
case("dot_vv", "dot", [I(C), I(C)], be.dot, "", lambda a, b: a @ b)
case("dot_mv", "dot", [I(C, H), I(H)], be.dot, "C", lambda a, b: a @ b)
case("dot_vm", "dot", [I(H), I(C, H)], be.dot, "C", lambda a, b: b @ a)
case("dot_mm", "dot", [I(C, H), I(H, W)], be.dot, "CW", lambda a, b: a @ b)
case("dot_mm_transposed", "dot", [I(H, C), I(W, H)], be.dot, "CW",
     lambda a, b: a.T @ b.T)
case("dot_batch", "dot", [I(C, H), I(H, N)], be.dot, "CN", lambda a, b: a @ b)
case("dot_two_shared", "dot", [I(C, H, W), I(W, N, H)], be.dot, "CN",
     lambda a, b: np.einsum("chw,wnh->cn", a, b))
case("dot_two_shared_interleaved", "dot", [I(H, C, W), I(N, W, H)], be.dot, "CN",
     lambda a, b: np.einsum("hcw,nwh->cn", a, b))
case("dot_full_contraction", "dot", [I(C, H), I(H, C)], be.dot, "",
     lambda a, b: np.einsum("ch,hc->", a, b))
case("dot_full_contraction_3d", "dot", [I(C, H, N), I(N, C, H)], be.dot, "",
     lambda a, b: np.einsum("chn,nch->", a, b))
case("dot_outer_vv", "dot", [I(C), I(N)], be.dot, "CN", lambda a, b: np.outer(a, b))
case("dot_outer_mv", "dot", [I(C, H), I(N)], be.dot, "CHN",
     lambda a, b: a[:, :, None] * b[None, None, :])
case("dot_scalar_vector", "dot", [I(), I(C)], be.dot, "C", lambda a, b: a * b)
# batched: the batch axes are kept (one product per index), the other shared ones summed
case("dot_batched", "dot", [I(N, C, H), I(N, H, W)],
     lambda a, b: be.dot(a, b, batch_axes=N), "NCW",
     lambda a, b: np.einsum("nch,nhw->ncw", a, b))
case("dot_batched_transposed", "dot", [I(C, N, H), I(W, H, N)],
     lambda a, b: be.dot(a, b, batch_axes=[N]), "CNW",
     lambda a, b: np.einsum("cnh,whn->cnw", a, b))
case("dot_batched_two_batch_axes", "dot", [I(T, N, C, H), I(N, T, H, W)],
     lambda a, b: be.dot(a, b, batch_axes=(N, T)), "TNCW",
     lambda a, b: np.einsum("tnch,nthw->tncw", a, b))
case("dot_batched_two_summed", "dot", [I(N, C, H, W), I(W, H, N, T)],
     lambda a, b: be.dot(a, b, reduction_axes=(H, W)), "NCT",
     lambda a, b: np.einsum("nchw,whnt->nct", a, b))
case("dot_batched_matrix_vector", "dot", [I(N, C, H), I(H, N)],
     lambda a, b: be.dot(a, b, batch_axes=N), "NC",
     lambda a, b: np.einsum("nch,hn->nc", a, b))
case("dot_batched_vector_matrix", "dot", [I(H, N), I(N, H, W)],
     lambda a, b: be.dot(a, b, batch_axes=N), "NW",
     lambda a, b: np.einsum("hn,nhw->nw", a, b))
case("dot_batched_outer", "dot", [I(N, C), I(W, N)],
     lambda a, b: be.dot(a, b, batch_axes=N), "NCW",
     lambda a, b: np.einsum("nc,wn->ncw", a, b))

# --- softmax and cross-entropy ---------------------------------------------------------
case("softmax(C,N)", "softmax", [I(C, N)], be.softmax, "CN", softmax0)
case("softmax(N,C)", "softmax", [I(N, C)], be.softmax, "NC",
     lambda x: softmax0(x, (1,)))
case("softmax(C,H,N)", "softmax", [I(C, H, N)], be.softmax, "CHN",
     lambda x: softmax0(x, (0, 1)))
case("softmax_norm(H)", "softmax", [I(C, H, N)],
     lambda x: be.softmax(x, normalization_axes=H), "CHN", lambda x: softmax0(x, (1,)))
case("softmax_large_logits", "softmax", [I(C, N, domain="wide")], be.softmax, "CN",
     softmax0)
case("cross_entropy_multi(softmax)", "cross_entropy_multi",
     [I(C, N), I(C, N, domain="unit")],
     lambda x, t: be.cross_entropy_multi(be.softmax(x), t), "N",
     lambda x, t: -(t * np.log(softmax0(x))).sum(axis=0))
case("cross_entropy_multi(softmax,(C,H,N))", "cross_entropy_multi",
     [I(C, H, N), I(N, H, C, domain="unit")],
     lambda x, t: be.cross_entropy_multi(be.softmax(x), t), "N",
     lambda x, t: -(np.einsum("nhc->chn", t) * np.log(softmax0(x, (0, 1)))).sum(axis=(0, 1)))
case("cross_entropy_multi(softmax,wide)", "cross_entropy_multi",
     [I(C, N, domain="wide"), I(C, N, domain="unit")],
     lambda x, t: be.cross_entropy_multi(be.softmax(x), t), "N",
     lambda x, t: -(t * (x - x.max(0) - np.log(np.exp(x - x.max(0)).sum(0)))).sum(0))
case("cross_entropy_multi_usebits", "cross_entropy_multi",
     [I(C, N), I(C, N, domain="unit")],
     lambda x, t: be.cross_entropy_multi(be.softmax(x), t, usebits=True), "N",
     lambda x, t: -(t * np.log2(softmax0(x))).sum(axis=0))
case("cross_entropy_multi_out(N)", "cross_entropy_multi",
     [I(C, N), I(C, N, domain="unit")],
     lambda x, t: be.cross_entropy_multi(be.softmax(x), t, out_axes=(N,)), "N",
     lambda x, t: -(t * np.log(softmax0(x))).sum(axis=0))
case("cross_entropy_multi(plain)", "cross_entropy_multi",
     [I(C, N, domain="unit"), I(C, N, domain="unit")],
     be.cross_entropy_multi, "N", lambda y, t: -(t * np.log(y)).sum(axis=0))
case("cross_entropy_binary(sigmoid)", "cross_entropy_binary",
     [I(C, N), I(C, N, domain="unit")],
     lambda x, t: be.cross_entropy_binary(be.sigmoid(x), t), "N",
     lambda x, t: (softplus(x) - x * t).sum(axis=0))
case("cross_entropy_binary(sigmoid,wide)", "cross_entropy_binary",
     [I(C, N, domain="wide"), I(N, C, domain="unit")],
     lambda x, t: be.cross_entropy_binary(be.sigmoid(x), t), "N",
     lambda x, t: (softplus(x) - x * t.T).sum(axis=0))
case("cross_entropy_binary(plain)", "cross_entropy_binary",
     [I(C, N, domain="unit"), I(C, N, domain="unit")],
     be.cross_entropy_binary, "N",
     lambda y, t: -(t * np.log(y) + (1 - t) * np.log(1 - y)).sum(axis=0))
case("cross_entropy_binary(plain,out(C,N))", "cross_entropy_binary",
     [I(C, N, domain="unit"), I(C, N, domain="unit")],
     lambda y, t: be.cross_entropy_binary(y, t, out_axes=(C, N)), "CN",
     lambda y, t: -(t * np.log(y) + (1 - t) * np.log(1 - y)))

# --- one_hot, stop_gradient, tensor_size -----------------------------------------------
case("one_hot(N)", "one_hot", [Inp((N,), kind="label", high=3)],
     lambda x: be.one_hot(x, C), "CN",
     lambda x: (np.arange(3)[:, None] == x[None, :]).astype(np.float64),
     grad=False, out_dtype="float32")
case("one_hot(H,N)_dtype", "one_hot", [Inp((H, N), kind="label", high=3)],
     lambda x, dtype: be.one_hot(x, C, dtype=dtype), "CHN",
     lambda x: (np.arange(3)[:, None, None] == x[None]).astype(np.float64),
     grad=False, pass_dtype=True)
case("stop_gradient", "stop_gradient", [I(C, N)], be.stop_gradient, "CN", lambda x: x,
     grad=False)  # its derivative is zero on purpose; see test_stop_gradient_derivative
case("tensor_size", "tensor_size", [I(C, H, N)], be.tensor_size, "",
     lambda x: np.float64(x.size), out_dtype="float32")
case("tensor_size_red(C,H)", "tensor_size", [I(C, H, N)],
     lambda x: be.tensor_size(x, reduction_axes=(C, H)), "", lambda x: np.float64(12),
     out_dtype="float32")
case("tensor_size_out(N)", "tensor_size", [I(C, H, N)],
     lambda x: be.tensor_size(x, out_axes=(N,)), "", lambda x: np.float64(12),
     out_dtype="float32")

# --- shaping ---------------------------------------------------------------------------
case("broadcast(C)->(C,N)", "broadcast", [I(C)], lambda x: be.broadcast(x, (C, N)), "CN",
     lambda x: np.broadcast_to(x[:, None], (3, 5)))
case("broadcast(N)->(C,H,N)", "broadcast", [I(N)], lambda x: be.broadcast(x, (C, H, N)),
     "CHN", lambda x: np.broadcast_to(x[None, None, :], (3, 4, 5)))
case("broadcast(C,N)->(N,H,C)", "broadcast", [I(C, N)],
     lambda x: be.broadcast(x, (N, H, C)), "NHC",
     lambda x: np.broadcast_to(x.T[:, None, :], (5, 4, 3)))
case("axes_with_order(C,H,N)->(N,C,H)", "axes_with_order", [I(C, H, N)],
     lambda x: be.axes_with_order(x, (N, C, H)), "NCH",
     lambda x: np.einsum("chn->nch", x))
case("transpose_T", "axes_with_order", [I(C, H, N)], lambda x: x.T, "NHC",
     lambda x: np.einsum("chn->nhc", x))
case("cast_axes", "cast_axes", [I(C, H)], lambda x: be.cast_axes(x, (C2, H2)), ("C2", "H2"),
     lambda x: x)
case("cast_axes_then_dot", "cast_axes", [I(C, H), I(C, H)],
     lambda a, b: be.dot(be.cast_axes(a, (C2, H)), b), ("C2", "C"),
     lambda a, b: a @ b.T)
case("flatten_all", "flatten", [I(C, H, N)], be.flatten, ("(C*H*N)",),
     lambda x: x.reshape(-1))
case("flatten_groups", "flatten", [I(C, H, N)],
     lambda x: be.flatten(x, [be.Axes(C, H), N]), ("(C*H)", "N"),
     lambda x: x.reshape(12, 5))
case("flatten_transposed", "flatten", [I(C, H, N)],
     lambda x: be.flatten(be.axes_with_order(x, (N, C, H)), [N, be.Axes(C, H)]),
     ("N", "(C*H)"), lambda x: np.einsum("chn->nch", x).reshape(5, 12))
case("unflatten(flatten)", "unflatten", [I(C, H, N)],
     lambda x: be.unflatten(be.flatten(x, [C, be.Axes(H, N)])), "CHN", lambda x: x)
case("unflatten_after_op", "unflatten", [I(C, H, N)],
     lambda x: be.unflatten(be.exp(be.flatten(x))), "CHN", np.exp)
case("slice[1:3]", "slice_along_axis", [I(C, H, N)],
     lambda x: be.slice_along_axis(x, H, slice(1, 3)), ("C", "H[1:3:]", "N"),
     lambda x: x[:, 1:3, :])
case("slice[::2]", "slice_along_axis", [I(C, H, N)],
     lambda x: be.slice_along_axis(x, N, slice(None, None, 2)), ("C", "H", "N[::2]"),
     lambda x: x[:, :, ::2])
case("slice[3:0:-2]", "slice_along_axis", [I(C, H, N)],
     lambda x: be.slice_along_axis(x, H, slice(3, 0, -2)), ("C", "H[3:0:-2]", "N"),
     lambda x: x[:, 3:0:-2, :])
case("slice_index", "slice_along_axis", [I(C, H, N)],
     lambda x: be.slice_along_axis(x, H, 2), "CN", lambda x: x[:, 2, :])
case("slice_index_negative", "slice_along_axis", [I(C, H, N)],
     lambda x: be.slice_along_axis(x, C, -1), "HN", lambda x: x[-1])
case("slice_then_add", "slice_along_axis", [I(C, H, N), I(C, N)],
     lambda x, y: be.slice_along_axis(x, H, 0) + y, "CN", lambda x, y: x[:, 0, :] + y)

# --- compound graphs -------------------------------------------------------------------
case("mlp_layer", "dot", [I(C, H), I(H, N), I(C)],
     lambda w, x, b: be.tanh(be.dot(w, x) + b), "CN",
     lambda w, x, b: np.tanh(w @ x + b[:, None]))
case("mlp_softmax_ce", "cross_entropy_multi",
     [I(C, H), I(H, N), Inp((N,), kind="label", high=3)],
     lambda w, x, y: be.cross_entropy_multi(be.softmax(be.dot(w, x)), be.one_hot(y, C)),
     "N", lambda w, x, y: -np.log(softmax0(w @ x))[y, np.arange(5)])
case("normalize_batch", "variance", [I(C, N)],
     lambda x: (x - be.mean(x, reduction_axes=N)) / be.sqrt(
         be.variance(x, reduction_axes=N) + 1e-3),
     "CN", lambda x: (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-3))

def _normalized(x, axes, eps=1e-5):
    return (x - x.mean(axes, keepdims=True)) / np.sqrt(x.var(axes, keepdims=True) + eps)


case("layer_norm(H)", "layer_norm", [I(C, H, N), I(H), I(H)],
     lambda x, g, b: be.layer_norm(x, g, b, axes=H), "CHN",
     lambda x, g, b: _normalized(x, 1) * g[None, :, None] + b[None, :, None])
case("layer_norm(C,H)", "layer_norm", [I(C, H, N)],
     lambda x: be.layer_norm(x, axes=[C, H], eps=1e-3), "CHN",
     lambda x: _normalized(x, (0, 1), 1e-3))


def _running_stats(x):  # training reads no running statistic: no inputs for them
    return [be.Variable([C], initial_value=v, dtype=x.dtype, trainable=False)
            for v in (0.0, 1.0)]


case("batch_norm_training", "batch_norm", [I(C, H, N), I(C), I(C)],
     lambda x, g, b: be.batch_norm(x, g, b, *_running_stats(x))[0], "CHN",
     lambda x, g, b: _normalized(x, (1, 2)) * g[:, None, None] + b[:, None, None])
case("batch_norm_inference", "batch_norm",
     [I(C, H, N), I(C), I(C), I(C), I(C, domain="positive")],
     lambda x, g, b, m, v: be.batch_norm(x, g, b, m, v, training=False)[0], "CHN",
     lambda x, g, b, m, v: (x - m[:, None, None]) / np.sqrt(v[:, None, None] + 1e-5)
     * g[:, None, None] + b[:, None, None])


#: The public ops the table must cover.
REQUIRED_OPS = {
    "add", "subtract", "multiply", "divide", "power", "negative", "absolute", "sign",
    "square", "sqrt", "reciprocal", "exp", "log", "safelog", "sin", "cos", "tanh",
    "sigmoid", "maximum", "minimum", "equal", "not_equal", "less", "less_equal",
    "greater", "greater_equal", "sum", "max", "min", "mean", "prod", "variance", "argmax",
    "argmin", "dot", "softmax", "cross_entropy_multi", "cross_entropy_binary", "one_hot",
    "stop_gradient", "broadcast", "axes_with_order", "cast_axes", "flatten", "unflatten",
    "slice_along_axis", "tensor_size",
    "erf", "expm1", "softplus", "relu", "leaky_relu", "elu", "selu", "gelu", "silu",
    "hard_sigmoid", "where", "clip", "log_softmax", "logsumexp", "concat", "stack", "tile",
    "pad", "gather", "scatter_add", "cumsum", "sort", "argsort", "topk",
    "layer_norm", "batch_norm",
}

GRAD_CASES = [c for c in CASES if c.grad]

# --- convolution and pooling ----------------------------------------------------------------
# Odd shapes (7 x 5 images, stride 2, padding 1, dilation 2, groups 2) and axis orders
# other than the canonical one. The expectations loop over output (or input) positions:
# the definitions, independent of geon's kernel-offset loops and im2col code. Inputs
# on the grid of quarters keep float32 sums exact.
CI, CG, C1 = be.Axis(4, "CI"), be.Axis(2, "CG"), be.Axis(1, "C1")
KO, K4 = be.Axis(6, "KO"), be.Axis(4, "K4")
H7, W5, D3 = be.Axis(7, "H7"), be.Axis(5, "W5"), be.Axis(3, "D3")
R3, S2, T2 = be.Axis(3, "R3"), be.Axis(2, "S2"), be.Axis(2, "T2")
NB = be.Axis(2, "NB", batch=True)


def np_conv(x, w, stride, pads, dilation, groups):
    """x (N, C, *S), w (K, C/groups, *R) -> (N, K, *P), one output position at a time."""
    n = x.ndim - 2
    xp = np.pad(x, [(0, 0), (0, 0)] + list(pads))
    K, Cg = w.shape[:2]
    R = w.shape[2:]
    P = [(xp.shape[2 + i] - dilation[i] * (R[i] - 1) - 1) // stride[i] + 1 for i in range(n)]
    out = np.zeros((x.shape[0], K) + tuple(P))
    for k in range(K):
        g = k // (K // groups)
        for p in np.ndindex(*P):
            idx = tuple(slice(p[i] * stride[i], p[i] * stride[i] + dilation[i] * (R[i] - 1) + 1,
                              dilation[i]) for i in range(n))
            patch = xp[(slice(None), slice(g * Cg, (g + 1) * Cg)) + idx]
            out[(slice(None), k) + p] = np.sum(patch * w[k], axis=tuple(range(1, n + 2)))
    return out


def np_conv_transpose(x, w, stride, pads, dilation, groups, out):
    """x (N, C, *S), w (C, K/groups, *R) -> (N, K, *out): each input position scatters
    its kernel-weighted values (the definition of the transposed convolution)."""
    n = x.ndim - 2
    C, Kg = w.shape[:2]
    R = w.shape[2:]
    full = [out[i] + pads[i][0] + pads[i][1] for i in range(n)]
    y = np.zeros((x.shape[0], Kg * groups) + tuple(full))
    for c in range(C):
        g = c // (C // groups)
        for s in np.ndindex(*x.shape[2:]):
            for r in np.ndindex(*R):
                pos = tuple(s[i] * stride[i] + r[i] * dilation[i] for i in range(n))
                if all(pos[i] < full[i] for i in range(n)):
                    y[(slice(None), slice(g * Kg, (g + 1) * Kg)) + pos] += \
                        x[(slice(None), c) + s][:, None] * w[(c, slice(None)) + r][None, :]
    crop = tuple(slice(pads[i][0], pads[i][0] + out[i]) for i in range(n))
    return y[(Ellipsis,) + crop]


def np_pool(x, kind, kernel, stride, pads, dilation=None, count_include_pad=True):
    """Max or average pooling of x (N, C, *S) by its definition."""
    n = len(kernel)
    dilation = dilation or (1,) * n
    S = x.shape[2:]
    P = [(S[i] + sum(pads[i]) - dilation[i] * (kernel[i] - 1) - 1) // stride[i] + 1
         for i in range(n)]
    out = np.zeros(x.shape[:2] + tuple(P))
    for p in np.ndindex(*P):
        vals = []
        for r in np.ndindex(*kernel):
            q = tuple(p[i] * stride[i] - pads[i][0] + r[i] * dilation[i] for i in range(n))
            if all(0 <= q[i] < S[i] for i in range(n)):
                vals.append(x[(slice(None), slice(None)) + q])
        vals = np.stack(vals)
        if kind == "max":
            out[(Ellipsis,) + p] = vals.max(axis=0)
        else:
            out[(Ellipsis,) + p] = vals.sum(axis=0) / (np.prod(kernel) if count_include_pad
                                                       else len(vals))
    return out


def _nc(x, order):
    """x transposed by ``order`` (its positions of N, C, *S) to (N, C, *S)."""
    return np.transpose(x, order)


_P1 = ((1, 1), (1, 1))
_GRID = "grid0"
case("conv2d_pad1", "conv", [I(CI, H7, W5, NB, domain=_GRID), I(CI, R3, S2, KO, domain=_GRID)],
     lambda x, w: be.conv(x, w, channel=CI, spatial=(H7, W5), out_channel=KO, padding=1),
     ("KO", "H7_out", "W5_out", "NB"),
     lambda x, w: np.transpose(np_conv(_nc(x, (3, 0, 1, 2)), _nc(w, (3, 0, 1, 2)), (1, 1),
                                       _P1, (1, 1), 1), (1, 2, 3, 0)))
case("conv2d_stride2_pad1_dil2_groups2", "conv",
     [I(CI, H7, W5, NB, domain=_GRID), I(CG, R3, S2, KO, domain=_GRID)],
     lambda x, w: be.conv(x, w, channel=CI, spatial=(H7, W5), out_channel=KO,
                          filter_channel=CG, strides=2, padding=1, dilation=(2, 1), groups=2),
     ("KO", "H7_out", "W5_out", "NB"),
     lambda x, w: np.transpose(np_conv(_nc(x, (3, 0, 1, 2)), _nc(w, (3, 0, 1, 2)), (2, 2),
                                       _P1, (2, 1), 2), (1, 2, 3, 0)))
case("conv2d_batch_first_orders", "conv",
     [I(NB, H7, CI, W5, domain=_GRID), I(KO, S2, CI, R3, domain=_GRID)],
     lambda x, w: be.conv(x, w, channel=CI, spatial=(H7, W5), out_channel=KO,
                          kernel=(R3, S2), strides=(2, 1), padding=((0, 1), (1, 0))),
     ("NB", "H7_out", "KO", "W5_out"),
     lambda x, w: np.transpose(np_conv(_nc(x, (0, 2, 1, 3)), _nc(w, (0, 2, 3, 1)), (2, 1),
                                       ((0, 1), (1, 0)), (1, 1), 1), (0, 2, 1, 3)))
case("conv2d_depthwise_same", "conv",
     [I(CI, H7, W5, NB, domain=_GRID), I(C1, R3, S2, K4, domain=_GRID)],
     lambda x, w: be.conv(x, w, channel=CI, spatial=(H7, W5), out_channel=K4,
                          filter_channel=C1, padding="same", groups=4),
     ("K4", "H7_out", "W5_out", "NB"),
     lambda x, w: np.transpose(np_conv(_nc(x, (3, 0, 1, 2)), _nc(w, (3, 0, 1, 2)), (1, 1),
                                       ((1, 1), (0, 1)), (1, 1), 4), (1, 2, 3, 0)))
case("conv1d_stride2_valid", "conv", [I(CI, H7, NB, domain=_GRID), I(KO, CI, R3, domain=_GRID)],
     lambda x, w: be.conv(x, w, channel=CI, spatial=(H7,), out_channel=KO, strides=2,
                          padding="valid"),
     ("KO", "H7_out", "NB"),
     lambda x, w: np.transpose(np_conv(_nc(x, (2, 0, 1)), w, (2,), ((0, 0),), (1,), 1),
                               (1, 2, 0)))
case("conv3d", "conv", [I(CG, D3, H7, W5, NB, domain=_GRID),
                        I(CG, T2, R3, S2, K4, domain=_GRID)],
     lambda x, w: be.conv(x, w, channel=CG, spatial=(D3, H7, W5), out_channel=K4,
                          strides=(1, 2, 1), padding=(1, 0, 1), dilation=(1, 2, 1)),
     ("K4", "D3_out", "H7_out", "W5_out", "NB"),
     lambda x, w: np.transpose(np_conv(_nc(x, (4, 0, 1, 2, 3)), _nc(w, (4, 0, 1, 2, 3)),
                                       (1, 2, 1), ((1, 1), (0, 0), (1, 1)), (1, 2, 1), 1),
                               (1, 2, 3, 4, 0)))
case("conv_transpose2d_stride2_groups2", "conv_transpose",
     [I(CI, H7, W5, NB, domain=_GRID), I(CI, R3, S2, CG, domain=_GRID)],
     lambda x, w: be.conv_transpose(x, w, channel=CI, spatial=(H7, W5), out_channel=K4,
                                    filter_channel=CG, strides=2, padding=1,
                                    output_padding=(1, 0), dilation=(1, 2), groups=2),
     ("K4", "H7_out", "W5_out", "NB"),
     lambda x, w: np.transpose(np_conv_transpose(_nc(x, (3, 0, 1, 2)), _nc(w, (0, 3, 1, 2)),
                                                 (2, 2), _P1,
                                                 (1, 2), 2, (14, 9)), (1, 2, 3, 0)))
case("conv_transpose1d", "conv_transpose", [I(NB, CI, H7, domain=_GRID),
                                            I(CI, KO, R3, domain=_GRID)],
     lambda x, w: be.conv_transpose(x, w, channel=CI, spatial=(H7,), out_channel=KO),
     ("NB", "KO", "H7_out"),
     lambda x, w: np_conv_transpose(x, w, (1,), ((0, 0),), (1,), 1, (9,)))
case("max_pool2d_stride2_pad1_dil2", "max_pool", [I(CI, H7, W5, NB, domain="distinct")],
     lambda x: be.max_pool(x, (H7, W5), 3, strides=2, padding=1, dilation=(2, 1)),
     ("CI", "H7_pool", "W5_pool", "NB"),
     lambda x: np.transpose(np_pool(_nc(x, (3, 0, 1, 2)), "max", (3, 3), (2, 2), _P1,
                                    (2, 1)), (1, 2, 3, 0)))
case("max_pool2d_default_stride", "max_pool", [I(NB, H7, W5, CI, domain="distinct")],
     lambda x: be.max_pool(x, (H7, W5), (2, 2)),
     ("NB", "H7_pool", "W5_pool", "CI"),
     lambda x: np.transpose(np_pool(_nc(x, (0, 3, 1, 2)), "max", (2, 2), (2, 2),
                                    ((0, 0), (0, 0))), (0, 2, 3, 1)))
case("max_pool1d_overlap", "max_pool", [I(CI, H7, domain="distinct")],
     lambda x: be.max_pool(x, (H7,), 3, strides=1), ("CI", "H7_pool"),
     lambda x: np_pool(x[None], "max", (3,), (1,), ((0, 0),))[0])
case("avg_pool2d_pad1_include", "avg_pool", [I(CI, H7, W5, NB, domain=_GRID)],
     lambda x: be.avg_pool(x, (H7, W5), 3, strides=2, padding=1),
     ("CI", "H7_pool", "W5_pool", "NB"),
     lambda x: np.transpose(np_pool(_nc(x, (3, 0, 1, 2)), "avg", (3, 3), (2, 2), _P1),
                            (1, 2, 3, 0)))
case("avg_pool2d_pad1_exclude", "avg_pool", [I(CI, H7, W5, NB, domain=_GRID)],
     lambda x: be.avg_pool(x, (H7, W5), (3, 2), strides=(2, 1), padding=1,
                           count_include_pad=False),
     ("CI", "H7_pool", "W5_pool", "NB"),
     lambda x: np.transpose(np_pool(_nc(x, (3, 0, 1, 2)), "avg", (3, 2), (2, 1), _P1,
                                    count_include_pad=False), (1, 2, 3, 0)))
case("global_avg_pool", "global_avg_pool", [I(CI, H7, W5, NB)],
     lambda x: be.global_avg_pool(x, (H7, W5)), ("CI", "NB"), lambda x: x.mean(axis=(1, 2)))

# The NumPy family: PyTorch's layouts, positional axes.
_POS4 = ("-4", "-3", "-2", "-1")


def _np_of(fn):
    return lambda *xs, **kw: fn(*[be.np.positional(x) for x in xs], **kw)


case("np.conv2d_odd", "np.conv",
     [I(NB, CI, H7, W5, domain=_GRID), I(KO, CG, R3, S2, domain=_GRID)],
     _np_of(lambda x, w: be.np.conv(x, w, stride=2, padding=1, dilation=(2, 1), groups=2)),
     _POS4, lambda x, w: np_conv(x, w, (2, 2), _P1, (2, 1), 2))
case("np.conv2d_same", "np.conv",
     [I(NB, CI, H7, W5, domain=_GRID), I(KO, CI, R3, S2, domain=_GRID)],
     _np_of(lambda x, w: be.np.conv(x, w, padding="same")),
     _POS4, lambda x, w: np_conv(x, w, (1, 1), ((1, 1), (0, 1)), (1, 1), 1))
case("np.conv_transpose2d", "np.conv_transpose",
     [I(NB, CI, H7, W5, domain=_GRID), I(CI, CG, R3, S2, domain=_GRID)],
     _np_of(lambda x, w: be.np.conv_transpose(x, w, stride=2, padding=1, output_padding=1,
                                              groups=2)),
     _POS4, lambda x, w: np_conv_transpose(x, w, (2, 2), _P1, (1, 1), 2, (14, 9)))
case("np.max_pool2d", "np.max_pool", [I(NB, CI, H7, W5, domain="distinct")],
     _np_of(lambda x: be.np.max_pool(x, 3, stride=2, padding=1, dilation=(1, 2))), _POS4,
     lambda x: np_pool(x, "max", (3, 3), (2, 2), _P1, (1, 2)))
case("np.avg_pool2d", "np.avg_pool", [I(NB, CI, H7, W5, domain=_GRID)],
     _np_of(lambda x: be.np.avg_pool(x, (2, 3), padding=(1, 1), count_include_pad=False)),
     _POS4, lambda x: np_pool(x, "avg", (2, 3), (2, 3), _P1, count_include_pad=False))
case("np.global_avg_pool", "np.global_avg_pool", [I(NB, CI, H7, W5)],
     _np_of(be.np.global_avg_pool), ("-2", "-1"), lambda x: x.mean(axis=(2, 3)))

#: The cases whose graphs a JSON document can hold: NumPy-family operands of different
#: shapes reuse positional axis names ("-1", "-2" ...) with other lengths, and a
#: document keeps one axis per name.
DOCUMENT_CASES = [c for c in CASES if not c.op.startswith("np.")]

REQUIRED_OPS |= {"conv", "conv_transpose", "max_pool", "avg_pool", "global_avg_pool",
                 "np.conv", "np.conv_transpose", "np.max_pool", "np.avg_pool",
                 "np.global_avg_pool"}
GRAD_CASES = [c for c in CASES if c.grad]
