"""Random numbers as ops: a counter-based generator (Philox-4x32-10) and the ops built on it.

The generator is Philox-4x32-10 (Salmon, Moraes, Dror and Shaw, "Parallel random numbers:
as easy as 1, 2, 3", SC 2011): a bijection of a 128-bit counter keyed by a 64-bit key,
so any element of a draw is computed on its own from its index, and every backend
computes the same bits.

A draw is one :class:`Random` primitive. Its words come from these inputs:

- **key** ``(k0, k1) = (seed mod 2**32, (seed >> 32) XOR stream)``: the ``seed`` the user
  gives and the op's ``stream`` id, a number given to each random op when it is built
  (one more than the last one built in this process, or ``stream=`` to choose it), so
  that two random ops with the same seed draw different numbers;
- **counter** ``(b mod 2**32, b >> 32, s mod 2**32, s >> 32)``: ``b`` the index of the
  128-bit block (word ``k`` of the draw is word ``k mod 4`` of block ``k // 4``) and
  ``s`` the *step*, the value of the op's step counter, a non-trainable int64
  :class:`Variable` that an assignment built with the op advances by one before the
  op reads it: each call of a computation draws new numbers, and ``save`` / ``restore``
  carry the counter, so a restore replays the stream.

Element ``i`` of a ``float32`` uniform draw is ``(w[i] >> 8) * 2**-24``; of a ``float64``
one, ``((w[2i] >> 5) * 2**26 + (w[2i+1] >> 6)) * 2**-53``. A standard normal element
takes two uniforms ``u1`` in ``(0, 1]`` and ``u2`` in ``[0, 1)`` from the words of two
uniform elements (``2i`` and ``2i + 1``) and returns ``sqrt(-2 log u1) cos(2 pi u2)``
(Box-Muller, computed in float64 and rounded to the draw's dtype), with ``log`` and
``cos`` from :mod:`geon.op_graph.portable_math`: fixed sequences of correctly rounded
float64 operations that give the same bits on every backend.
"""

import itertools
import math
import numbers
from typing import Optional

import numpy as np

from geon.errors import ArgumentError
from geon.op_graph import nodes
from geon.op_graph import op_graph as og
from geon.op_graph import portable_math
from geon.op_graph.axes import AxesLike, as_axes
from geon.op_graph.shaping import value_of
from geon.op_graph.derivatives import zero_adjoint, zero_tangent
from geon.op_graph.ordering import PART_OF_READER
from geon.op_graph.tables import adjoint_rule, evaluator, forward_rule

PHILOX_M = (0xD2511F53, 0xCD9E8D57)
PHILOX_W = (0x9E3779B9, 0xBB67AE85)
PHILOX_ROUNDS = 10
_MASK = np.uint64(0xFFFFFFFF)
_SHIFT32 = np.uint64(32)


def philox4x32(counter, key, rounds=PHILOX_ROUNDS):
    """Philox-4x32 of ``counter`` (four arrays or ints, the 32-bit words) under ``key``
    (two 32-bit words): four uint32 arrays, vectorised over the counters' shape."""
    c = [np.asarray(w, dtype=np.uint64) & _MASK for w in counter]
    k0, k1 = (np.uint64(int(k) & 0xFFFFFFFF) for k in key)
    m0, m1 = np.uint64(PHILOX_M[0]), np.uint64(PHILOX_M[1])
    w0, w1 = np.uint64(PHILOX_W[0]), np.uint64(PHILOX_W[1])
    for r in range(rounds):
        if r:
            k0, k1 = (k0 + w0) & _MASK, (k1 + w1) & _MASK
        p0 = m0 * c[0]  # < 2**64: the full 32x32 product
        p1 = m1 * c[2]
        c = [(p1 >> _SHIFT32) ^ c[1] ^ k0, p1 & _MASK, (p0 >> _SHIFT32) ^ c[3] ^ k1, p0 & _MASK]
    return [w.astype(np.uint32) for w in c]


def philox_key(seed, stream):
    """The Philox key ``(k0, k1)`` of a draw with ``seed`` and ``stream`` id."""
    return seed & 0xFFFFFFFF, ((seed >> 32) ^ stream) & 0xFFFFFFFF


def philox_words(n, seed, stream, step):
    """The first ``n`` 32-bit words (uint32) of the stream ``(seed, stream)`` at ``step``."""
    blocks = np.arange((n + 3) // 4, dtype=np.uint64)
    step = int(step) & 0xFFFFFFFFFFFFFFFF
    out = philox4x32((blocks & _MASK, blocks >> _SHIFT32, step & 0xFFFFFFFF, step >> 32),
                     philox_key(seed, stream))
    return np.stack(out, axis=-1).reshape(-1)[:n]


def words_per_uniform(dtype):
    """How many 32-bit words one uniform element of ``dtype`` takes."""
    return 2 if np.dtype(dtype) == np.float64 else 1


def uniform_from_words(w, dtype, open_low=False):
    """Uniform numbers in ``[0, 1)`` (``(0, 1]`` if ``open_low``) of ``dtype`` from words
    ``w`` (``words_per_uniform(dtype)`` words per number, consecutive)."""
    if np.dtype(dtype) == np.float64:
        w = w.astype(np.uint64).reshape(-1, 2)
        bits = (w[:, 0] >> np.uint64(5)) * np.uint64(1 << 26) + (w[:, 1] >> np.uint64(6))
        return ((bits + np.uint64(open_low)).astype(np.float64) * 2.0 ** -53)
    bits = (w >> np.uint32(8)).astype(np.uint32) + np.uint32(open_low)
    return bits.astype(np.float32) * np.float32(2.0 ** -24)


def draw(distribution, shape, dtype, seed, stream, step):
    """The values of a :class:`Random` op: ``distribution`` ("uniform" or "normal")
    numbers of ``shape`` and ``dtype``. Every backend's result equals this one."""
    n = math.prod(shape)
    dtype = np.dtype(dtype)
    per = words_per_uniform(dtype)
    if distribution == "uniform":
        return uniform_from_words(philox_words(n * per, seed, stream, step),
                                  dtype).reshape(shape)
    w = philox_words(2 * n * per, seed, stream, step).reshape(n, 2, per)
    u1 = uniform_from_words(w[:, 0].reshape(-1), dtype, open_low=True).astype(np.float64)
    u2 = uniform_from_words(w[:, 1].reshape(-1), dtype).astype(np.float64)
    z = portable_math.normal_from_uniforms(u1, u2)
    return z.astype(dtype).reshape(shape)


DISTRIBUTIONS = ("uniform", "normal")
_streams = itertools.count(1)


@og.primitive
class Random(og.TensorOp):
    """The random primitive: ``distribution`` numbers (uniform in ``[0, 1)`` or standard
    normal) with ``axes`` and a float ``dtype``, drawn from the Philox stream
    ``(seed, stream)`` at the step held by its one arg, the int64 step counter.

    Its value does not depend on its arg's value differentiably: derivatives treat
    it as a constant.
    """

    attrs = ("axes", "dtype", "distribution", "seed", "stream")
    arity = 1

    def __init__(self, counter, axes, dtype=None, distribution="uniform", seed=0, stream=0,
                 **kwargs):
        dtype = np.dtype(dtype or og.DEFAULT_DTYPE)
        if dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise ArgumentError(f"Random: dtype must be float32 or float64, not {dtype} "
                                f"(at {nodes.DebugInfo().file_info})")
        if distribution not in DISTRIBUTIONS:
            raise ArgumentError(f"Random: distribution must be one of {DISTRIBUTIONS}, not "
                                f"{distribution!r} (at {nodes.DebugInfo().file_info})")
        self.distribution = distribution
        self.seed, self.stream = _word(seed, "seed", 64), _word(stream, "stream", 32)
        super().__init__(counter, axes=as_axes(axes), dtype=dtype, **kwargs)


def _word(value, what, bits):
    if isinstance(value, bool) or not isinstance(value, (numbers.Integral, np.integer)) \
            or not 0 <= value < 2 ** bits:
        raise ArgumentError(f"{what} must be an integer in [0, 2**{bits}), not {value!r} "
                            f"(at {nodes.DebugInfo().file_info})")
    return int(value)


def step_counter(stream):
    """A new step counter: a non-trainable, persistent int64 scalar Variable."""
    return og.Variable((), initial_value=0, dtype=np.int64, trainable=False,
                       name=f"rng_step_{stream}")


def random(axes, distribution="uniform", seed=0, stream=None, dtype=None, counter=None):
    """A :class:`Random` draw with its own step counter, advanced once per call.

    ``stream`` defaults to a new id (one more than the last one built in this process);
    give it (with the same ``seed``) to draw the numbers of another op again.
    ``counter``: the step counter to advance (a :func:`step_counter`; default a new
    one): draws built into several graphs (a layer's training step at two batch sizes)
    that pass the same one continue one sequence and save one Variable.
    """
    stream = next(_streams) if stream is None else stream
    if counter is None:
        counter = step_counter(stream)
        # Built before the draw, so the draw (a later reader of the counter) runs after
        # it and every computation of the draw advances the counter.
        og.SetItem(counter, counter + 1, tags=PART_OF_READER)
    elif not (isinstance(counter, og.Variable) and counter.axes == og.Axes()
              and counter.dtype == np.int64):
        raise ArgumentError(f"random: counter must be an int64 scalar Variable (a "
                            f"step_counter), not {counter!r} (at "
                            f"{nodes.DebugInfo().file_info})")
    else:
        # A counter other graphs advance too: this increment reads it unordered and is
        # not ordered after theirs (a computation of this draw runs its own only).
        inc = og.SetItem(counter, value_of(counter) + 1, tags=PART_OF_READER)
        for d in [d for d in inc.other_deps if isinstance(d, og.SetItem)
                  and d.args[0] is counter]:
            inc.other_deps.discard(d)
            d._dep_users.discard(inc)
    return Random(counter, axes, dtype=dtype, distribution=distribution, seed=seed,
                  stream=stream)


def uniform(axes: AxesLike, low: float = 0.0, high: float = 1.0, seed: int = 0,
            stream: Optional[int] = None, dtype: og.DTypeLike = None) -> og.TensorOp:
    """Numbers uniform in ``[low, high)`` with ``axes`` (float32 unless ``dtype``)."""
    u = random(axes, "uniform", seed, stream, dtype)
    if (low, high) == (0.0, 1.0):
        return u
    return u * (high - low) + low


def normal(axes: AxesLike, mean: float = 0.0, std: float = 1.0, seed: int = 0,
           stream: Optional[int] = None, dtype: og.DTypeLike = None) -> og.TensorOp:
    """Normal numbers with ``mean`` and standard deviation ``std`` with ``axes``."""
    z = random(axes, "normal", seed, stream, dtype)
    if (mean, std) == (0.0, 1.0):
        return z
    return z * std + mean


def bernoulli(p: og.TensorLike, axes: Optional[AxesLike] = None, seed: int = 0,
              stream: Optional[int] = None, dtype: og.DTypeLike = None,
              counter: Optional[og.Variable] = None) -> og.TensorOp:
    """1.0 with probability ``p`` (a number or an op, broadcast by axis name) and 0.0
    otherwise, with ``axes`` (default: ``p``'s axes)."""
    if axes is None:
        if not isinstance(p, og.TensorOp):
            raise ArgumentError(f"bernoulli: give axes= for a number p (at "
                                f"{nodes.DebugInfo().file_info})")
        axes = p.axes
    if dtype is None and isinstance(p, og.TensorOp):
        dtype = p.dtype
    u = random(axes, "uniform", seed, stream, dtype, counter)
    return og.Less(u, p, dtype=u.dtype)


def dropout(x: og.TensorOp, rate: float, seed: int = 0, stream: Optional[int] = None,
            training: bool = True, counter: Optional[og.Variable] = None) -> og.TensorOp:
    """Inverted dropout: each element of ``x`` kept with probability ``1 - rate`` and
    scaled by ``1 / (1 - rate)``, else 0. ``training=False`` returns ``x``. The mask is
    one op, used by the value and by its derivative. ``counter``: as ``random``'s."""
    if not 0.0 <= rate < 1.0:
        raise ArgumentError(f"dropout: rate must be in [0, 1), not {rate!r} (at "
                            f"{nodes.DebugInfo().file_info})")
    if not training or rate == 0.0:
        return x
    keep = bernoulli(1.0 - rate, axes=x.axes, seed=seed, stream=stream, dtype=x.dtype,
                     counter=counter)
    return x * (keep * (1.0 / (1.0 - rate)))


# The values are constants: no derivative flows through them.
adjoint_rule(Random)(zero_adjoint)
forward_rule(Random)(zero_tangent)


@evaluator(Random)
def _random_value(op, step):
    return draw(op.distribution, op.axes.shape, op.dtype, op.seed, op.stream, step)
