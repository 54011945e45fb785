"""Differential tests: random graphs give the same results with every optimization on as
with every optional pass and backend step switched off by name, and as the reference
evaluator (:func:`geon.evaluate`).

A Hypothesis strategy draws a :class:`Recipe`: a few named axes of lengths 1-4 and a list
of steps (placeholders, variables, constants; elementwise unary and binary ops with
broadcasting by name; sum / max / min / mean / prod / argmax / argmin; dot; slicing;
broadcast, axes_with_order and stop_gradient; SetItem of a variable or placeholder
followed by reads built after it; and rewrites the simplifier knows, such as ``x * 1.0``
or ``log(exp(x))``). The recipe is built three times into fresh ops (passes rewrite the
graph they run on): once for ``NumPyTransformer()``, once for
``NumPyTransformer(disable=OPTIONAL)``, once for the reference evaluator. Each computation
is called twice, so the state it leaves behind is compared too. Every memory plan made
here is verified as well (memory.verify_plan runs on every computation).

At the end, many random graphs from a seeded NumPy generator (a new seed each run,
``GEON_DIFF_SEED`` to replay one) put views beside the values they view in fused groups,
with reductions, matrix products and updates, at sizes around every threshold, in every
mode and on the GPU emulator, against NumPy (see "random graphs" below).

Tolerances. Everything is float64 and every value has a bound ``M`` on its magnitude and a
first-order bound ``E`` on its rounding error (:class:`Tracker`), from inputs in [-2, 2].
The strategy only builds ops that keep ``M <= M_CAP`` and stay in their safe domain (no
NaN, no overflow). Values that every implementation computes exactly (inputs, views,
negation, max/min, comparisons, ``x * 1.0`` ...) must agree bit for bit; others within
``rtol=1e-10, atol=1e-12 + 4 * E``. Discontinuous ops (comparisons, sign, argmax) are only
applied to exact values, so they cannot flip on a rounding difference.
"""

import dataclasses
import math
import os
import warnings
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

import geon as be
from geon.transformers import fusion, memory
from geon.transformers.numpy import compiled as compiled_kernels
from geon.transformers.numpy import c_codegen
from geon.transformers.numpy import toolchain as ctoolchain

# Random graphs read variables after assignments they do not request, on purpose: the
# computations then run those assignments (and say so with a GeonWarning).
pytestmark = pytest.mark.filterwarnings("ignore::geon.errors.GeonWarning")

EPS = 2.0 ** -52
M_CAP = 1e4          # no op is built whose result may exceed this magnitude
MAX_RANK = 4
STORAGE_M = 2.0      # inputs and everything assigned to storage lie in [-2, 2]


def optional_steps():
    """Every pass and backend step ``disable`` accepts, minus the required ones."""
    t = be.NumPyTransformer()
    names = [p.name for p in t.passes()] + list(t.backend_steps)
    required = getattr(be.Transformer, "_required", {"lower", "verify"})
    return [n for n in dict.fromkeys(names) if n not in required]


OPTIONAL = optional_steps()


# --- the op vocabulary ------------------------------------------------------------------
# Each entry: build function, bound rule (M, E) -> (M, E), and flags:
#   exact: the result is computed exactly from exact operands (bitwise reproducible);
#   needs_exact: only applied to exact operands (the op is discontinuous);
#   view: the result aliases its operand's storage;
#   max_m: largest operand magnitude the op accepts (domain / overflow safety).
@dataclasses.dataclass(frozen=True)
class OpKind:
    build: object
    bound: object
    exact: bool = False
    needs_exact: bool = False
    view: bool = False
    max_m: float = math.inf


def _same(m, e):
    return m, e


def _square(m, e):
    return m * m, 2 * m * e + e * e + EPS * m * m


def _exp(m, e):
    return math.exp(m), math.exp(m) * (1.01 * e + 2 * EPS)


UNARY = {
    "tanh": OpKind(be.tanh, lambda m, e: (1.0, e + 2 * EPS)),
    "sin": OpKind(be.sin, lambda m, e: (1.0, e + 2 * EPS)),
    "cos": OpKind(be.cos, lambda m, e: (1.0, e + 2 * EPS)),
    "sigmoid": OpKind(be.sigmoid, lambda m, e: (1.0, e / 4 + 4 * EPS)),
    "negative": OpKind(be.negative, _same, exact=True),
    "neg_op": OpKind(lambda x: -x, _same, exact=True),
    "absolute": OpKind(be.absolute, _same, exact=True),
    "sign": OpKind(be.sign, lambda m, e: (1.0, 0.0), exact=True, needs_exact=True),
    "square": OpKind(be.square, _square),
    "exp": OpKind(be.exp, _exp, max_m=4.0),
    "log(x*x+1)": OpKind(lambda x: be.log(x * x + 1.0),
                         lambda m, e: (math.log1p(m * m), e + 4 * EPS * max(1.0, m))),
    "sqrt(x*x+1)": OpKind(lambda x: be.sqrt(be.square(x) + 1.0),
                          lambda m, e: (math.sqrt(m * m + 1), e + 4 * EPS * (m + 1))),
    "1/(x*x+1)": OpKind(lambda x: be.reciprocal(x * x + 1.0),
                        lambda m, e: (1.0, e + 4 * EPS)),
    "stop_gradient": OpKind(be.stop_gradient, _same, exact=True, view=True),
    # rewrites the simplifier knows
    "x*1": OpKind(lambda x: x * 1.0, _same, exact=True),
    "1*x": OpKind(lambda x: 1.0 * x, _same, exact=True),
    "x+0": OpKind(lambda x: x + 0.0, _same, exact=True),
    "0+x": OpKind(lambda x: 0.0 + x, _same, exact=True),
    "x-0": OpKind(lambda x: x - 0.0, _same, exact=True),
    "x/1": OpKind(lambda x: x / 1.0, _same, exact=True),
    "x**1": OpKind(lambda x: x ** 1.0, _same, exact=True),
    "x**2": OpKind(lambda x: x ** 2, _square),
    "x*0": OpKind(lambda x: x * 0.0, lambda m, e: (0.0, 0.0), exact=True),
    "-(-x)": OpKind(lambda x: -(-x), _same, exact=True),
    "log(exp(x))": OpKind(lambda x: be.log(be.exp(x)),
                          lambda m, e: (m, 1.01 * e + 4 * EPS * max(1.0, m)), max_m=20.0),
    # -> expm1(x): the reference's exp(x) - 1 rounds twice, expm1 once
    "exp(x)-1": OpKind(lambda x: be.exp(x) - 1.0,
                       lambda m, e: (math.expm1(m), math.exp(m) * (1.01 * e + 4 * EPS)),
                       max_m=4.0),
    "-1+exp(x)": OpKind(lambda x: -1.0 + be.exp(x),
                        lambda m, e: (math.expm1(m), math.exp(m) * (1.01 * e + 4 * EPS)),
                        max_m=4.0),
}


def _add(ma, ea, mb, eb):
    return ma + mb, ea + eb + EPS * (ma + mb)


def _mul(ma, ea, mb, eb):
    return ma * mb, ma * eb + mb * ea + ea * eb + EPS * ma * mb


def _maxmin(ma, ea, mb, eb):
    return max(ma, mb), max(ea, eb)


def _div(ma, ea, mb, eb):  # a / (b*b + 1)
    return ma, ea + ma * eb + 4 * EPS * ma


def _pow(ma, ea, mb, eb):  # (a*a + 1) ** tanh(b): base >= 1, |exponent| <= 1
    base = ma * ma + 1
    return base, 2 * ma * (ea + EPS) + base * math.log(base) * (eb + 2 * EPS) + 4 * EPS * base


def _cmp(ma, ea, mb, eb):
    return 1.0, 0.0


BINARY = {
    "add": OpKind(be.add, _add),
    "a+b": OpKind(lambda a, b: a + b, _add),
    "subtract": OpKind(be.subtract, _add),
    "a-b": OpKind(lambda a, b: a - b, _add),
    "multiply": OpKind(be.multiply, _mul),
    "a*b": OpKind(lambda a, b: a * b, _mul),
    "maximum": OpKind(be.maximum, _maxmin, exact=True),
    "minimum": OpKind(be.minimum, _maxmin, exact=True),
    "a/(b*b+1)": OpKind(lambda a, b: a / (b * b + 1.0), _div),
    "(a*a+1)**tanh(b)": OpKind(lambda a, b: be.power(a * a + 1.0, be.tanh(b)), _pow,
                               max_m=30.0),
    "equal": OpKind(be.equal, _cmp, exact=True, needs_exact=True),
    "not_equal": OpKind(be.not_equal, _cmp, exact=True, needs_exact=True),
    "less": OpKind(be.less, _cmp, exact=True, needs_exact=True),
    "a<=b": OpKind(lambda a, b: a <= b, _cmp, exact=True, needs_exact=True),
    "greater": OpKind(be.greater, _cmp, exact=True, needs_exact=True),
    "greater_equal": OpKind(be.greater_equal, _cmp, exact=True, needs_exact=True),
}

# Reductions: bound rule (M, E, n) -> (M, E) with n the number of elements combined.
REDUCE = {
    "sum": OpKind(be.sum, lambda m, e, n: (n * m, n * e + n * n * EPS * m)),
    "mean": OpKind(be.mean, lambda m, e, n: (m, e + (n + 2) * EPS * m)),
    "max": OpKind(be.max, lambda m, e, n: (m, e), exact=True),
    "min": OpKind(be.min, lambda m, e, n: (m, e), exact=True),
    "prod": OpKind(be.prod, lambda m, e, n: (m ** n, n * max(m, 1.0) ** (n - 1) * e
                                              + n * EPS * max(m, 1.0) ** n)),
    "argmax": OpKind(be.argmax, None, exact=True, needs_exact=True),
    "argmin": OpKind(be.argmin, None, exact=True, needs_exact=True),
}


# --- recipes ------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Recipe:
    """A graph description. ``axes``: ``(name, length, batch)``; ``steps``: one value (or
    SetItem) each, referring to earlier steps by index; ``results``: the requested steps;
    ``seed`` and ``grid`` choose the data (multiples of 1/4 in [-2, 2] if ``grid``, with
    many ties, else uniform in [-2, 2])."""

    axes: tuple
    steps: tuple
    results: tuple
    seed: int
    grid: bool

    def __repr__(self):
        lines = [f"Recipe(axes={self.axes!r}, seed={self.seed}, grid={self.grid},",
                 "       steps=("]
        lines += [f"    {step!r},  # {k}" for k, step in enumerate(self.steps)]
        lines.append(f"), results={self.results!r})")
        return "\n".join(lines)


@dataclasses.dataclass
class Info:
    """What the strategy and the error analysis know about one value. ``view``:
    ``{storage step: epoch}`` if the value is a view of that storage taken after its
    ``epoch``-th assignment (a read of it after a later assignment sees that value)."""

    axes: tuple = ()
    M: float = STORAGE_M
    E: float = 0.0
    exact: bool = True
    kind: str = "value"     # "value", "int" (argmax), "storage", "void" (SetItem)
    view: dict = dataclasses.field(default_factory=dict)
    exact_only: bool = False  # storage: only exact values are ever assigned
    fed: bool = False         # storage: a placeholder (fed afresh each call)


def _n(axes, lengths):
    return math.prod(lengths[a] for a in axes)


class Tracker:
    """Replays steps on :class:`Info` s: axes, magnitude and error bounds, exactness, and
    the assignment epochs. ``start_e`` gives each variable's error bound at the start of
    the call (its value is whatever the previous call left)."""

    def __init__(self, axes, start_e=None):
        self.lengths = {name: length for name, length, _ in axes}
        self.batch = {name: batch for name, _, batch in axes}
        self.vals = []
        self.start_e = start_e or {}
        self.epoch = {}      # storage step -> number of assignments so far
        self.cur = {}        # storage step -> Info of a read now
        self.set_e = {}      # storage step -> [E of each value assigned to it]

    def arg(self, i):
        v = self.vals[i]
        return self.cur[i] if v.kind == "storage" else v

    def usable(self, i):
        return self.vals[i].kind in ("value", "storage")

    def _value(self, step_out):
        self.vals.append(step_out)
        return step_out

    def apply(self, step):
        kind = step[0]
        idx = len(self.vals)
        if kind in ("placeholder", "variable"):
            axes = step[1]
            is_var = kind == "variable"
            exact_only = step[2] if is_var else False
            e0 = self.start_e.get(idx, 0.0) if is_var else 0.0
            self.epoch[idx] = 0
            self.set_e[idx] = [e0]
            self.cur[idx] = Info(axes, STORAGE_M, e0, exact_only or not is_var,
                                 view={idx: 0})
            return self._value(Info(axes, kind="storage", exact_only=exact_only,
                                    fed=not is_var))
        if kind == "constant":
            return self._value(Info(step[1]))
        if kind == "fill":
            return self._value(Info(step[1], abs(step[2])))
        if kind == "scalar":
            return self._value(Info((), abs(step[1])))
        if kind == "unary":
            op = UNARY[step[1]]
            x = self.arg(step[2])
            m, e = op.bound(x.M, x.E)
            return self._value(Info(x.axes, m, e, x.exact and op.exact,
                                    view=dict(x.view) if op.view else {}))
        if kind == "binary":
            op = BINARY[step[1]]
            a, b = self.arg(step[2]), self.arg(step[3])
            m, e = op.bound(a.M, a.E, b.M, b.E)
            axes = a.axes + tuple(n for n in b.axes if n not in a.axes)
            return self._value(Info(axes, m, e, a.exact and b.exact and op.exact))
        if kind == "reduce":
            op = REDUCE[step[1]]
            x = self.arg(step[2])
            red, out = self.reduce_axes(x.axes, step[3], step[4])
            n = _n(red, self.lengths)
            if op.bound is None:
                return self._value(Info(out, float(n), 0.0, True, kind="int"))
            m, e = op.bound(x.M, x.E, n)
            return self._value(Info(out, m, e, x.exact and op.exact))
        if kind == "dot":
            a, b = self.arg(step[1]), self.arg(step[2])
            shared = [n for n in a.axes if n in b.axes]
            k = _n(shared, self.lengths)
            axes = tuple(n for n in a.axes if n not in shared) + tuple(
                n for n in b.axes if n not in shared)
            m = k * a.M * b.M
            e = k * (a.M * b.E + b.M * a.E + a.E * b.E) + k * EPS * m
            return self._value(Info(axes, m, e, False))
        if kind == "slice":
            x = self.arg(step[1])
            axes = slice_axes(x.axes, step[2], step[3], self.lengths, self.batch)
            return self._value(Info(axes, x.M, x.E, x.exact, view=dict(x.view)))
        if kind in ("broadcast", "reorder"):
            x = self.arg(step[1])
            return self._value(Info(tuple(step[2]), x.M, x.E, x.exact, view=dict(x.view)))
        if kind == "setitem":
            s, i = step[1], step[2]
            v = self.arg(i)
            k = self.epoch[s] + 1
            self.epoch[s] = k
            self.set_e[s].append(v.E)
            old = self.cur[s]
            # exact-only variables only get exact values; other variables may carry
            # rounding errors into the next call; a placeholder is fed afresh each call
            exact = v.exact if self.vals[s].fed else old.exact
            self.cur[s] = Info(old.axes, STORAGE_M, v.E, exact,
                               view={s: k})
            return self._value(Info((), kind="void"))
        raise AssertionError(f"unknown step {step!r}")

    def reduce_axes(self, axes, red, out):
        """(reduced axes, result axes) of a reduction of ``axes`` with these specs."""
        if red is not None and out is not None:
            return tuple(a for a in axes if a in red), tuple(out)
        if red is not None:
            return tuple(a for a in axes if a in red), tuple(a for a in axes if a not in red)
        if out is not None:
            return tuple(a for a in axes if a not in out), tuple(out)
        red = tuple(a for a in axes if not self.batch[a])
        return red, tuple(a for a in axes if a not in red)

    def final_e(self, s):
        """Error bound of storage ``s`` at the end of the call (one of its values)."""
        return max(self.set_e[s])


def slice_name(axis, key):
    s = ":".join("" if v is None else str(v) for v in key)
    return f"{axis}[{s}]"


def slice_axes(axes, axis, key, lengths, batch):
    """Result axes of slicing ``axes`` along ``axis`` by ``key`` (an int or a
    (start, stop, step) triple); registers the new axis in ``lengths`` / ``batch``."""
    pos = axes.index(axis)
    if isinstance(key, int):
        return axes[:pos] + axes[pos + 1:]
    name = slice_name(axis, key)
    lengths[name] = len(range(*slice(*key).indices(lengths[axis])))
    batch[name] = batch[axis]
    return axes[:pos] + (name,) + axes[pos + 1:]


def analyze(recipe):
    """Per call (two calls): the Infos of every step and the final error bound of each
    storage. Variables start call 2 with what call 1 left."""
    calls, start = [], {}
    for _ in range(2):
        tr = Tracker(recipe.axes, start)
        for step in recipe.steps:
            tr.apply(step)
        calls.append(tr)
        start = {s: tr.final_e(s) for s, step in enumerate(recipe.steps)
                 if step[0] == "variable"}
    return calls


# --- the strategy ---------------------------------------------------------------------------
KINDS = (["unary"] * 4 + ["rewrite"] * 2 + ["binary"] * 5 + ["reduce"] * 3 + ["dot"] * 2
         + ["slice"] * 2 + ["broadcast", "reorder", "input"])
REWRITES = ["x*1", "1*x", "x+0", "0+x", "x-0", "x/1", "x**1", "x**2", "x*0", "-(-x)",
            "log(exp(x))", "exp(x)-1", "-1+exp(x)", "stop_gradient"]
PLAIN_UNARY = [n for n in UNARY if n not in REWRITES]
SCALARS = [0.0, 1.0, 2.0, -0.5, 1.5]


def _subset(draw, items, min_size=0, max_size=None):
    """A subset of ``items`` in a drawn order."""
    items = list(items)
    perm = draw(st.permutations(items))
    k = draw(st.integers(min_size, len(items) if max_size is None else
                         min(max_size, len(items))))
    return tuple(perm[:k])


def _pick(draw, cands):
    """One of ``cands`` (step indices), the most recent first: deeper graphs."""
    return draw(st.sampled_from(cands[::-1])) if cands else None


class Gen:
    """The strategy's state: a tracker plus the step list."""

    def __init__(self, axes):
        self.axes = axes
        self.tr = Tracker(axes)
        self.steps = []
        self.storage_only = False  # pick operands among placeholders and variables

    def add(self, step):
        self.steps.append(step)
        return self.tr.apply(step)

    def usable(self, pred=lambda info: True):
        return [i for i in range(len(self.steps))
                if self.tr.usable(i) and pred(self.tr.arg(i))
                and (self.tr.vals[i].kind == "storage" or not self.storage_only)]

    def info(self, i):
        return self.tr.arg(i)


def draw_input(draw, g, kinds=("placeholder", "variable", "constant", "fill", "scalar",
                               "placeholder", "variable")):
    base = [name for name, _, _ in g.axes]
    kind = draw(st.sampled_from(kinds))
    if kind == "scalar":
        return g.add(("scalar", draw(st.sampled_from(SCALARS))))
    axes = _subset(draw, base, max_size=3)
    if kind == "variable":
        return g.add(("variable", axes, draw(st.booleans())))
    if kind == "fill":
        return g.add(("fill", axes, draw(st.sampled_from([0.0, 1.0, 2.0, -1.0]))))
    return g.add((kind, axes))


def draw_op(draw, g, kind):
    """Add one step of ``kind`` (plus helper steps); return False if none applies."""
    if kind == "input":
        draw_input(draw, g)
        return True
    if kind in ("unary", "rewrite"):
        name = draw(st.sampled_from(PLAIN_UNARY if kind == "unary" else REWRITES))
        op = UNARY[name]
        i = _pick(draw, g.usable(lambda x: x.M <= op.max_m and (x.exact or not op.needs_exact)
                                 and op.bound(x.M, x.E)[0] <= M_CAP))
        if i is None:
            return False
        g.add(("unary", name, i))
        return True
    if kind == "binary":
        name = draw(st.sampled_from(list(BINARY)))
        op = BINARY[name]
        ok = lambda x: x.M <= op.max_m and (x.exact or not op.needs_exact)  # noqa: E731
        i = _pick(draw, g.usable(ok))
        if i is None:
            return False
        a = g.info(i)
        if draw(st.integers(0, 2)) == 0:  # often a number, the most recent candidate
            g.add(("scalar", draw(st.sampled_from(SCALARS))))
        j = _pick(draw, g.usable(lambda b: ok(b) and len(set(a.axes) | set(b.axes)) <= MAX_RANK
                                 and op.bound(a.M, a.E, b.M, b.E)[0] <= M_CAP))
        if j is None:
            return False
        g.add(("binary", name, i, j))
        return True
    if kind == "reduce":
        name = draw(st.sampled_from(list(REDUCE)))
        op = REDUCE[name]
        i = _pick(draw, g.usable(lambda x: x.exact or not op.needs_exact))
        if i is None:
            return False
        x = g.info(i)
        mode = draw(st.sampled_from(["red", "out", "both", "default"]))
        red = out = None
        if mode == "red":
            red = _subset(draw, x.axes, min_size=1 if x.axes else 0)
        elif mode == "out":
            out = _subset(draw, x.axes)
        elif mode == "both":
            out = _subset(draw, x.axes)
            red = tuple(draw(st.permutations([a for a in x.axes if a not in out])))
        rd, _ = g.tr.reduce_axes(x.axes, red, out)
        if op.bound is not None and op.bound(x.M, x.E, _n(rd, g.tr.lengths))[0] > M_CAP:
            return False
        g.add(("reduce", name, i, red, out))
        return True
    if kind == "dot":
        i = _pick(draw, g.usable())
        if i is None:
            return False
        a = g.info(i)

        def fits(b):
            shared = set(a.axes) & set(b.axes)
            rank = len(set(a.axes) | set(b.axes)) - len(shared)
            k = _n(shared, g.tr.lengths)
            return rank <= MAX_RANK and k * a.M * b.M <= M_CAP
        j = _pick(draw, g.usable(fits))
        if j is None:
            return False
        g.add(("dot", i, j))
        return True
    if kind == "slice":
        i = _pick(draw, g.usable(lambda x: len(x.axes) > 0))
        if i is None:
            return False
        x = g.info(i)
        axis = draw(st.sampled_from(x.axes))
        n = g.tr.lengths[axis]
        if draw(st.booleans()):
            key = draw(st.integers(-n, n - 1))
        else:
            key = (draw(st.sampled_from([None] + list(range(-n, n)))),
                   draw(st.sampled_from([None] + list(range(-n - 1, n + 1)))),
                   draw(st.sampled_from([None, 1, 2, -1, -2, 3])))
            if not len(range(*slice(*key).indices(n))) or slice_name(axis, key) in x.axes:
                return False
        g.add(("slice", i, axis, key))
        return True
    if kind == "broadcast":
        i = _pick(draw, g.usable(lambda x: len(x.axes) < MAX_RANK))
        if i is None:
            return False
        x = g.info(i)
        pool = [a for a in g.tr.lengths if a not in x.axes]
        extra = _subset(draw, pool, min_size=1 if pool else 0,
                        max_size=MAX_RANK - len(x.axes))
        g.add(("broadcast", i, tuple(draw(st.permutations(x.axes + extra)))))
        return True
    if kind == "reorder":
        i = _pick(draw, g.usable(lambda x: len(x.axes) > 1))
        if i is None:
            return False
        g.add(("reorder", i, tuple(draw(st.permutations(g.info(i).axes)))))
        return True
    if kind == "setitem":
        return draw_setitem(draw, g)
    if kind == "stale":
        return draw_stale_read(draw, g)
    if kind == "storage_view":  # a view (or a read that simplifies to one) of storage
        g.storage_only = True
        try:
            return draw_op(draw, g, draw(st.sampled_from(["slice", "broadcast", "reorder",
                                                          "rewrite"])))
        finally:
            g.storage_only = False
    raise AssertionError(kind)


def draw_setitem(draw, g):
    s = _pick(draw, [k for k in range(len(g.steps)) if g.steps[k][0] in
                     ("placeholder", "variable")])
    if s is None:
        return False
    exact_only = g.tr.vals[s].exact_only
    i = _pick(draw, g.usable(lambda v: not exact_only or v.exact))
    return i is not None and assign(g, s, i)


def assign(g, s, i):
    """SetItem(storage ``s``, value ``i``): the value is reduced (max) over the axes the
    storage lacks and squashed (tanh) into [-1, 1] if it may exceed [-2, 2]."""
    v = g.info(i)
    if g.tr.vals[s].exact_only and (not v.exact or v.M > STORAGE_M):
        return False
    extra = tuple(a for a in v.axes if a not in g.tr.vals[s].axes)
    if extra:
        v = g.add(("reduce", "max", i, extra, None))
        i = len(g.steps) - 1
    if v.M > STORAGE_M:
        g.add(("unary", "tanh", i))
        i = len(g.steps) - 1
    g.add(("setitem", s, i))
    return True


def draw_stale_read(draw, g):
    """Read a view of storage taken before its latest assignment, in an op built after
    the assignment that also reads the new value, or assign it back to the storage."""
    stale = lambda v: any(g.tr.epoch[s] > k for s, k in v.view.items())  # noqa: E731
    i = _pick(draw, g.usable(stale))
    if i is None:
        return False
    v = g.info(i)
    s = draw(st.sampled_from(sorted(k for k, e in v.view.items() if g.tr.epoch[k] > e)))
    how = draw(st.sampled_from(["add", "multiply", "maximum", "dot", "assign"]))
    if how == "assign":
        return assign(g, s, i)
    new = g.info(s)
    a, b = (i, s) if draw(st.booleans()) else (s, i)
    if how == "dot":
        shared = set(v.axes) & set(new.axes)
        if len(set(v.axes) | set(new.axes)) - len(shared) > MAX_RANK:
            return False
        g.add(("dot", a, b))
    else:
        if len(set(v.axes) | set(new.axes)) > MAX_RANK:
            return False
        g.add(("binary", how, a, b))
    return True


@st.composite
def recipes(draw, state=False, max_ops=12):
    """Recipes; with ``state``, mostly assignments, views of storage and reads of views
    taken before an assignment (at least one SetItem)."""
    n_axes = draw(st.integers(2, 4))
    batch = draw(st.sampled_from([None] + list(range(n_axes))))
    axes = tuple((name, draw(st.integers(1, 4)), k == batch)
                 for k, name in enumerate("ABCD"[:n_axes]))
    g = Gen(axes)
    draw_input(draw, g, kinds=("placeholder", "variable"))
    for _ in range(draw(st.integers(0, 3))):
        draw_input(draw, g)
    kinds = KINDS + ["setitem", "stale"] * 2
    if state:
        kinds = KINDS + ["setitem"] * 8 + ["stale"] * 6 + ["storage_view"] * 6
        # a view of storage, an assignment to that storage, a read of the old view
        for kind in draw(st.sampled_from([("storage_view", "setitem", "stale"),
                                          ("storage_view", "setitem", "stale", "stale"),
                                          ("storage_view", "storage_view", "setitem"),
                                          ("setitem", "storage_view", "setitem", "stale")])):
            draw_op(draw, g, kind)
    # At least three ops that apply (a draw may find nothing to apply to).
    target, added = draw(st.integers(3, max_ops)), 0
    for _ in range(4 * max_ops):
        if added >= target:
            break
        if draw_op(draw, g, draw(st.sampled_from(kinds))) is not False:
            added += 1
    event(f"ops added: {min(added, 12)}")
    if state and not any(step[0] == "setitem" for step in g.steps):
        assign(g, 0, g.usable()[-1]) or assign(g, 0, 0)
    values = [k for k, info in enumerate(g.tr.vals) if info.kind in ("value", "int")]
    if not values:
        g.add(("unary", "tanh", 0))
        values = [len(g.steps) - 1]
    requested = set(draw(st.lists(st.sampled_from(values), min_size=1, max_size=4,
                                  unique=True)))
    requested.add(values[-1])
    for k, info in enumerate(g.tr.vals):
        if info.kind == "void" and draw(st.sampled_from([True, True, True, False])):
            requested.add(k)
    return Recipe(axes, tuple(g.steps), tuple(sorted(requested)),
                  draw(st.integers(0, 2 ** 32 - 1)), draw(st.booleans()))


# --- building and running ---------------------------------------------------------------------
def _data(rng, shape, grid):
    if grid:
        return rng.integers(-8, 9, size=shape) / 4.0
    return rng.uniform(-2.0, 2.0, size=shape)


def build(recipe):
    """Fresh ops for ``recipe``: (ops per step, placeholders, {step: variable})."""
    axes = {name: be.Axis(length, name, batch=batch) for name, length, batch in recipe.axes}
    rng = np.random.default_rng(recipe.seed)
    ops, placeholders, variables = [], [], {}

    def ax(names):
        return [axes[n] for n in names]

    def shape(names):
        return tuple(axes[n].length for n in names)

    for k, step in enumerate(recipe.steps):
        kind = step[0]
        if kind == "placeholder":
            op = be.placeholder(ax(step[1]), dtype=np.float64, name=f"p{k}")
            placeholders.append(op)
        elif kind == "variable":
            op = be.Variable(axes=ax(step[1]), initial_value=_data(rng, shape(step[1]),
                                                                   recipe.grid),
                             dtype=np.float64, name=f"v{k}")
            variables[k] = op
        elif kind == "constant":
            op = be.constant(np.asarray(_data(rng, shape(step[1]), recipe.grid)),
                             axes=ax(step[1]))
        elif kind == "fill":
            op = be.constant(np.full(shape(step[1]), step[2]), axes=ax(step[1]))
        elif kind == "scalar":
            op = be.constant(np.float64(step[1]))
        elif kind == "unary":
            op = UNARY[step[1]].build(ops[step[2]])
        elif kind == "binary":
            op = BINARY[step[1]].build(ops[step[2]], ops[step[3]])
        elif kind == "reduce":
            red, out = step[3], step[4]
            op = REDUCE[step[1]].build(ops[step[2]],
                                       reduction_axes=None if red is None else ax(red),
                                       out_axes=None if out is None else ax(out))
        elif kind == "dot":
            op = be.dot(ops[step[1]], ops[step[2]])
        elif kind == "slice":
            key = step[3] if isinstance(step[3], int) else slice(*step[3])
            op = be.slice_along_axis(ops[step[1]], axes[step[2]], key)
            for a in op.axes:
                axes.setdefault(a.name, a)
        elif kind == "broadcast":
            op = be.broadcast(ops[step[1]], ax(step[2]))
        elif kind == "reorder":
            op = be.axes_with_order(ops[step[1]], ax(step[2]))
        elif kind == "setitem":
            op = be.SetItem(ops[step[1]], ops[step[2]])
        else:
            raise AssertionError(step)
        ops.append(op)
    return ops, placeholders, variables


def feeds_for(recipe, placeholders):
    """The placeholder values of the two calls."""
    rng = np.random.default_rng(recipe.seed + 1)
    return [[_data(rng, p.axes.shape, recipe.grid) for p in placeholders] for _ in range(2)]


def run_transformer(recipe, disable, compiled=False):
    ops, placeholders, variables = build(recipe)
    t = be.NumPyTransformer(disable=disable, compiled=compiled)
    comp = t.computation([ops[k] for k in recipe.results], *placeholders)
    calls = []
    for feeds in feeds_for(recipe, placeholders):
        given_feeds = [f.copy() for f in feeds]
        out = comp(*given_feeds)
        for f, g in zip(feeds, given_feeds):
            np.testing.assert_array_equal(f, g, err_msg="the computation changed a feed")
        calls.append(([None if o is None else np.array(o) for o in out],
                      {k: t.state[v].copy() for k, v in variables.items() if v in t.state}))
    return calls, comp, variables


def run_reference(recipe):
    ops, placeholders, variables = build(recipe)
    state, calls = {}, []
    for feeds in feeds_for(recipe, placeholders):
        out = be.evaluate([ops[k] for k in recipe.results],
                          feeds=dict(zip(placeholders, feeds)), state=state)
        calls.append((out, {k: np.array(state[v] if v in state else v.initial_array())
                            for k, v in variables.items()}))
    return calls, variables


def _compare(what, got, want, info):
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    if info.exact or info.kind == "int":
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        assert np.all(np.isfinite(want)), f"{what}: reference is not finite"
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12 + 4 * info.E,
                                   err_msg=what)


def _cycle(fn):
    """``fn()``, or the GeonError it raises for a dependency cycle."""
    try:
        return fn()
    except be.GeonError as e:
        if "dependency cycle" not in str(e):
            raise
        return e


def check_recipe(recipe, compiled=False):
    """Run ``recipe`` all-on, all-off and in the reference evaluator; compare. "All on"
    is ``NumPyTransformer(compiled=compiled)`` (True: the compiled path, small groups
    too; "auto": large groups compiled); "all off" is always the NumPy code."""
    note(repr(recipe))
    bounds = analyze(recipe)
    ref = _cycle(lambda: run_reference(recipe)[0])
    off = _cycle(lambda: run_transformer(recipe, OPTIONAL))
    on = _cycle(lambda: run_transformer(recipe, [], compiled=compiled))
    if isinstance(ref, Exception):
        # Some assignments through views have no order without a temporary (a swap:
        # a := b, then b := a view of the old a). The reference refuses them; where a
        # pass made the copy (e.g. a requested view is copied), the transformers may
        # run them: all on and all off must then agree with each other.
        note(f"reference: {ref}")
        assert isinstance(off, Exception) == isinstance(on, Exception), (off, on)
        if isinstance(off, Exception):
            return
        ref = off[0]
    else:
        for got in (off, on):
            if isinstance(got, Exception):
                raise got
    note(f"all on:\n{on[1].source}")
    for call in range(2):
        tr = bounds[call]
        ref_out, ref_state = ref[call]
        for name, (outs, state) in (("all off", off[0][call]), ("all on", on[0][call])):
            for k, got, want in zip(recipe.results, outs, ref_out):
                what = f"call {call + 1}, {name}, step {k} {recipe.steps[k][:2]}"
                if want is None:
                    assert got is None, what
                    continue
                _compare(what, got, want, tr.vals[k])
            for k, want in ref_state.items():
                if k in state:
                    storage = Info(kind="value", E=tr.final_e(k),
                                   exact=tr.vals[k].exact_only)
                    _compare(f"call {call + 1}, {name}, state of variable {k}", state[k],
                             want, storage)


COMMON = dict(deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                     HealthCheck.filter_too_much])


@settings(max_examples=400, **COMMON)
@given(recipes())
def test_all_passes_on_matches_all_off(recipe):
    check_recipe(recipe)


@settings(max_examples=150, **COMMON)
@given(recipes(state=True, max_ops=10))
def test_state_after_setitems_matches(recipe):
    check_recipe(recipe)


# The compiled path (C loops for fused groups, small groups fused too): fewer examples,
# since each computation runs the C compiler once (its cache is fresh per session).
needs_cc = pytest.mark.skipif(not compiled_kernels.available(),
                              reason="no working C compiler for the compiled path")


@needs_cc
@settings(max_examples=80, **COMMON)
@given(recipes())
def test_compiled_path_matches_reference(recipe):
    check_recipe(recipe, compiled=True)


@needs_cc
@settings(max_examples=30, **COMMON)
@given(recipes(state=True, max_ops=10))
def test_compiled_path_state_after_setitems_matches(recipe):
    check_recipe(recipe, compiled=True)


@needs_cc
@settings(max_examples=100, **COMMON)
@given(recipes())
def test_default_mode_matches_reference(recipe):
    # compiled="auto" compiles groups from AUTO_MIN_ELEMENTS elements and leaves those
    # that do not compile to the NumPy code from fusion.MIN_ELEMENTS: here 4 and 16, so
    # the recipes' tensors (1 to 64 elements) fall on all three sides of them (15 of
    # the 100 examples compile a group). Any fallback to the NumPy code is an error.
    with mock.patch.object(compiled_kernels, "AUTO_MIN_ELEMENTS", 4), \
            mock.patch.object(fusion, "MIN_ELEMENTS", 16), \
            mock.patch.object(compiled_kernels, "UNAVAILABLE", frozenset()), \
            mock.patch.object(ctoolchain, "_warned", set()), \
            warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*running the NumPy code instead")
        check_recipe(recipe, compiled="auto")


# --- the switch itself ---------------------------------------------------------------------
def test_optional_steps_are_known_and_exclude_required():
    assert {"simplify", "fold", "dce", "memory"} <= set(OPTIONAL)
    assert not {"lower", "verify"} & set(OPTIONAL)
    be.NumPyTransformer(disable=OPTIONAL)  # every name is accepted


def test_multiply_by_one_stays_with_the_optional_steps_off():
    A = be.Axis(3, "DiffM")

    def build():  # passes rewrite the graph they run on: one graph per transformer
        x = be.placeholder([A], dtype=np.float64)
        return x * 1.0 - 0.0, x  # (x + 0.0 is not x at -0.0: it stays)

    off = be.NumPyTransformer(disable=OPTIONAL).computation(*build())
    on = be.NumPyTransformer().computation(*build())
    assert "np.multiply" in off.source and "np.subtract" in off.source
    assert "np.multiply" not in on.source and "np.subtract" not in on.source
    xv = np.array([0.5, -1.0, 2.0])
    np.testing.assert_array_equal(on(xv), xv)
    np.testing.assert_array_equal(off(xv), xv)


def test_disabled_transformer_runs_without_the_optional_steps():
    ran = []

    class Recording(be.NumPyTransformer):
        def passes(self):
            ps = super().passes()
            for p in ps:
                def run(graph, transformer, _run=p.run, _name=p.name):
                    ran.append(_name)
                    return _run(graph, transformer)
                p.run = run
            return ps

    A = be.Axis(3, "DiffA")
    B = be.Axis(2, "DiffB")

    def build():
        x = be.placeholder([A, B], dtype=np.float64)
        e = be.exp(x)
        return x, e, be.tanh(be.log(e) * 1.0 + 0.0) * 2.0 + 1.0

    xv = np.linspace(-1, 1, 6).reshape(3, 2)
    x, e_off, y = build()
    off = Recording(disable=OPTIONAL).computation(y, x)
    assert set(ran) == {p.name for p in be.NumPyTransformer().passes()} - set(OPTIONAL)
    assert "simplify" not in ran and "fold" not in ran and "dce" not in ran
    ran.clear()
    x2, e_on, y2 = build()
    on = Recording().computation(y2, x2)
    assert set(ran) == {p.name for p in be.NumPyTransformer().passes()}
    np.testing.assert_allclose(on(xv), off(xv), rtol=1e-12)
    # simplify / fold off: the multiply by 1.0 and log(exp(x)) stay in the code
    assert "np.multiply" in off.source and "np.log" in off.source
    assert "np.log" not in on.source and "np.exp" not in on.source
    # dce off: the exp that simplify removed is not marked invalid
    assert e_off.forward is None
    assert e_on.forward is be.Invalid
    # memory off: one arena per intermediate value, nothing in place
    assert not off.plan.inplace and len(off.plan.sizes) == len(off.plan.slot)
    assert on.plan.inplace or len(on.plan.sizes) < len(on.plan.slot)


def test_dce_alone_can_be_switched_off():
    A = be.Axis(3, "DiffC")

    def build():
        x = be.placeholder([A], dtype=np.float64)
        e = be.exp(x)
        return x, e, be.log(e)

    x, e, y = build()
    be.NumPyTransformer(disable=["dce"]).computation(y, x)
    assert e.forward is None
    x, e, y = build()
    be.NumPyTransformer().computation(y, x)
    assert e.forward is be.Invalid


# --- random graphs around the fusion and memory thresholds -----------------------------
# The Hypothesis tests above draw small graphs over named axes. These are drawn by a
# seeded NumPy generator, many per run and a new seed each run, and aim at what fused
# groups and the memory plan must get right: an elementwise op reading a value both
# directly and through a view (reversed slices, transposes, broadcasts, shifted and
# strided slices), next to reductions, matrix products and a variable's update, at
# sizes on both sides of every threshold (lowered, as in
# test_default_mode_matches_reference, so that tensors of 1 to 400 elements cross
# them). Each graph is built afresh for the reference evaluator and for every mode,
# called twice, and compared with NumPy in float64.

#: How many graphs a run checks (env GEON_DIFF_GRAPHS) from which seed (env
#: GEON_DIFF_SEED, to replay a failure; by default a new one each run).
RANDOM_GRAPHS = int(os.environ.get("GEON_DIFF_GRAPHS") or 500)
#: Every how many graphs one also runs on the GPU emulator (the slowest mode).
GPU_EVERY = 16
#: The thresholds, lowered: (module, name, value).
LOW_THRESHOLDS = [(fusion, "MIN_ELEMENTS", 48), (fusion, "BLOCK_ELEMENTS", 24),
                  (fusion, "PARALLEL_ELEMENTS", 96), (fusion, "GEMM_BLOCK_ROWS", 2),
                  (compiled_kernels, "AUTO_MIN_ELEMENTS", 20),
                  (c_codegen, "PARALLEL_ELEMENTS", 96),
                  (c_codegen, "BLOCK_ELEMENTS", 32),
                  (c_codegen, "TILED_MIN_ELEMENTS", 64),
                  (c_codegen, "CHUNK_ELEMENTS", 16)]
DIMS = (1, 2, 3, 4, 5, 7, 8, 11, 13, 16, 20)
MAX_ELEMENTS = 400
BOUND = 200.0  # a value whose magnitude may pass this goes through tanh before use


def _lib(x):
    return np if isinstance(x, (np.ndarray, np.generic)) else be.np


# name -> (fn for a geon op or a NumPy array alike, whether it applies to a shape)
GRAPH_VIEWS = {
    "same": (lambda x: x, lambda s: True),
    "T": (lambda x: x.T, lambda s: len(s) == 2),
    "rev0": (lambda x: x[::-1], lambda s: True),
    "rev1": (lambda x: x[:, ::-1], lambda s: len(s) == 2),
    "rev01": (lambda x: x[::-1, ::-1], lambda s: len(s) == 2),
    "Trev": (lambda x: x.T[::-1], lambda s: len(s) == 2),
    "tail": (lambda x: x[1:], lambda s: s[0] > 1),
    "head": (lambda x: x[:-1], lambda s: s[0] > 1),
    "even": (lambda x: x[::2], lambda s: s[0] > 1),
    "col": (lambda x: x[:, None], lambda s: len(s) == 1),
    "row0": (lambda x: x[0], lambda s: len(s) == 2),
}
# name -> (fn, bound of the result from the operands' bounds)
GRAPH_UNARY = {
    "tanh": (lambda x: _lib(x).tanh(x), lambda m: min(m, 1.0)),
    "sin": (lambda x: _lib(x).sin(x), lambda m: min(m, 1.0)),
    "relu": (lambda x: _lib(x).maximum(x, 0.0), lambda m: m),
    "neg": (lambda x: -x, lambda m: m),
    "abs": (lambda x: abs(x), lambda m: m),
    "half": (lambda x: x * 0.5, lambda m: m / 2),
    "shift": (lambda x: x + 0.25, lambda m: m + 0.25),
    "exp": (lambda x: _lib(x).exp(x), lambda m: math.exp(m)),
}
GRAPH_BINARY = {
    "add": (lambda a, b: a + b, lambda p, q: p + q),
    "sub": (lambda a, b: a - b, lambda p, q: p + q),
    "mul": (lambda a, b: a * b, lambda p, q: p * q),
    "max": (lambda a, b: _lib(a).maximum(a, b), max),
    "min": (lambda a, b: _lib(a).minimum(a, b), max),
}
GRAPH_REDUCE = {
    "sum": (lambda x, **k: _lib(x).sum(x, **k), lambda m, n: m * n),
    "max": (lambda x, **k: _lib(x).max(x, **k), lambda m, n: m),
    "mean": (lambda x, **k: _lib(x).mean(x, **k), lambda m, n: m),
}


def _view_shape(name, shape):
    return GRAPH_VIEWS[name][0](np.empty(shape)).shape


@dataclasses.dataclass
class RandomGraph:
    """``inputs``: their shapes (input 0 is a variable if ``variable``); ``steps``:
    ``(kind, name, operands, views, extra)``, operands indexing inputs then steps, each
    read through its view; ``results``: requested indices; ``bounds``: of every
    value's magnitude; an ``"update"`` step (the last, if any) assigns to input 0."""

    seed: int
    inputs: list
    steps: list
    results: list
    bounds: list
    variable: bool

    def __str__(self):
        lines = [f"graph seed {self.seed}: inputs {self.inputs}"
                 + (" (input 0 a variable)" if self.variable else "")]
        n = len(self.inputs)
        lines += [f"  {n + k}: {s}" for k, s in enumerate(self.steps)]
        lines.append(f"  results {self.results}")
        return "\n".join(lines)


def draw_graph(seed):
    """A :class:`RandomGraph` from ``seed``."""
    rng = np.random.default_rng(seed)

    def pick(seq):
        return seq[int(rng.integers(len(seq)))]

    R, C, K = (int(pick(DIMS)) for _ in range(3))
    inputs = [(R, C)] + [pick([(R, C), (C, R), (R, K), (K, C), (R,), (C,), (R + 1, C),
                               (2 * R, C)]) for _ in range(int(rng.integers(0, 3)))]
    shapes, bounds, steps = list(inputs), [1.0] * len(inputs), []
    is_input0 = [True] + [False] * (len(inputs) - 1)  # input 0 itself (no real view)

    def add(step, shape, bound):
        steps.append(step)
        shapes.append(shape)
        bounds.append(bound)
        is_input0.append(step[0] == "view" and step[1] == "same" and is_input0[step[2][0]])
        return len(shapes) - 1

    def operand():  # the most recent values most often
        n = len(shapes)
        return n - min(n, int(rng.geometric(0.35)))

    def squash(i):
        if bounds[i] > BOUND:
            return add(("unary", "tanh", (i,), ("same",), None), shapes[i], 1.0)
        return i

    def adapt(a, js):
        """``(j, view)``: a value among ``js`` through a view that broadcasts with
        shape ``a`` (to at most 2-d and MAX_ELEMENTS), or None."""
        for j in js:
            for v in rng.permutation(list(GRAPH_VIEWS)):
                v = str(v)
                if not GRAPH_VIEWS[v][1](shapes[j]):
                    continue
                try:
                    out = np.broadcast_shapes(a, _view_shape(v, shapes[j]))
                except ValueError:
                    continue
                if len(out) <= 2 and math.prod(out) <= MAX_ELEMENTS:
                    return j, v, out
        return None

    for _ in range(int(rng.integers(3, 12))):
        kind = pick(["unary", "binary", "binary", "self", "self", "self", "reduce",
                     "matmul", "view"])
        i = squash(operand())
        a = shapes[i]
        if kind == "unary":
            name = pick(list(GRAPH_UNARY))
            if name == "exp" and bounds[i] > 3:
                name = "tanh"
            add(("unary", name, (i,), ("same",), None), a, GRAPH_UNARY[name][1](bounds[i]))
        elif kind in ("binary", "self"):
            # self: a value beside a view of itself
            found = adapt(a, [i] if kind == "self" else [operand() for _ in range(4)])
            if found is None:
                continue
            j, v, out = found
            j = squash(j)
            mine = "same"
            if kind == "self":  # the value itself through a view of its own shape, too
                mine = pick([w for w in GRAPH_VIEWS if GRAPH_VIEWS[w][1](a)
                             and _view_shape(w, a) == a])
            name = pick(list(GRAPH_BINARY))
            if name == "mul" and bounds[i] * bounds[j] > BOUND:
                name = "add"
            step = (("binary", name, (i, j), (mine, v), None) if rng.integers(2) else
                    ("binary", name, (j, i), (v, mine), None))
            add(step, out, GRAPH_BINARY[name][1](bounds[i], bounds[j]))
        elif kind == "reduce" and len(a) == 2:
            name = pick(list(GRAPH_REDUCE))
            axis, keep = int(rng.integers(2)), bool(rng.integers(2))
            out = list(a)
            if keep:
                out[axis] = 1
            else:
                del out[axis]
            add(("reduce", name, (i,), ("same",), (axis, keep)), tuple(out),
                GRAPH_REDUCE[name][1](bounds[i], a[axis]))
        elif kind == "matmul" and len(a) == 2:
            for j in [operand() for _ in range(4)] + list(range(len(shapes))):
                s = shapes[j]
                v = "same" if s[:1] == a[1:] else "T" if s[1:] == a[1:] else None
                if v is None or len(s) != 2 or a[0] * _view_shape(v, s)[1] > MAX_ELEMENTS:
                    continue
                j = squash(j)
                add(("matmul", "matmul", (i, j), ("same", v), None),
                    (a[0], _view_shape(v, s)[1]), a[1] * bounds[i] * bounds[j])
                break
        elif kind == "view":
            v = pick([w for w in GRAPH_VIEWS if GRAPH_VIEWS[w][1](a)])
            add(("view", v, (i,), (v,), None), _view_shape(v, a), bounds[i])
    if not steps:
        add(("unary", "tanh", (0,), ("same",), None), shapes[0], 1.0)
    n = len(shapes)
    results = sorted({n - 1} | {int(k) for k in rng.integers(
        len(inputs), n, size=int(rng.integers(0, 3)))})
    # With an update of the variable (input 0), a requested view of it, taken before
    # the update, has the old values, as in NumPy (the alias pass copies it first);
    # the variable itself requested is its value after the update: not requested here
    # (the state is compared instead).
    variable = bool(rng.integers(3) == 0)
    if variable:
        results = [k for k in results if not is_input0[k]] or [
            add(("unary", "neg", (n - 1,), ("same",), None), shapes[n - 1],
                bounds[n - 1])]
        n = len(shapes)
    if variable:  # an update of input 0: from a product of its shape, or another value
        step = None
        if rng.integers(2):
            for i in range(n):
                for j in range(n):
                    si, sj = shapes[i], shapes[j]
                    if len(si) == len(sj) == 2 and si[0] == R and sj[1] == C \
                            and si[1] == sj[0]:
                        step = ("update", "gemm", (squash(i), squash(j)), ("same", "same"),
                                None)
                        break
                if step:
                    break
        if step is None:
            found = adapt((R, C), [operand() for _ in range(4)] + [0])
            if found is not None and found[2] == (R, C):
                step = ("update", "tanh", (squash(found[0]),), (found[1],), None)
        if step is None:
            variable = False
        else:
            steps.append(step)
    return RandomGraph(seed, inputs, steps, results, bounds, variable)


def build_graph(graph, arrays, geon):
    """The values of ``graph``: NumPy arrays computed from ``arrays`` (the inputs), or
    with ``geon``, fresh ops (placeholders; input 0 a variable holding ``arrays[0]``
    if ``graph.variable``). Returns ``(values, the update or None)``."""
    if geon:
        vals = [be.np.variable(arrays[0].copy(), dtype=np.float64)
                if k == 0 and graph.variable else be.np.placeholder(s, dtype=np.float64)
                for k, s in enumerate(graph.inputs)]
    else:
        vals = list(arrays)
    update = None
    for kind, name, args, views, extra in graph.steps:
        xs = [GRAPH_VIEWS[v][0](vals[k]) for k, v in zip(args, views)]
        if kind == "unary":
            y = GRAPH_UNARY[name][0](xs[0])
        elif kind == "binary":
            y = GRAPH_BINARY[name][0](*xs)
        elif kind == "reduce":
            y = GRAPH_REDUCE[name][0](xs[0], axis=extra[0], keepdims=extra[1])
        elif kind == "matmul":
            y = xs[0] @ xs[1]
        elif kind == "update":  # w - 0.1 * (a @ b), or w + 0.5 * tanh(x)
            new = (vals[0] - 0.1 * (xs[0] @ xs[1]) if name == "gemm"
                   else vals[0] + 0.5 * _lib(xs[0]).tanh(xs[0]))
            update = be.SetItem(vals[0], new) if geon else new
            continue
        else:
            y = xs[0]
        vals.append(y)
    return vals, update


def _graph_modes(k):
    """The transformers graph number ``k`` runs on: name -> factory."""
    modes = {"compiled=False": lambda: be.NumPyTransformer(compiled=False)}
    if compiled_kernels.available():
        modes["compiled=True"] = lambda: be.NumPyTransformer(compiled=True)
        modes["compiled='auto'"] = lambda: be.NumPyTransformer(compiled="auto")
    if k % GPU_EVERY == 0 and _emulator() is not None:
        from geon.transformers.gpu import GPUTransformer
        modes["GPU emulator"] = lambda: GPUTransformer(runtime=_emulator()(seed=k))
    return modes


def _emulator():
    from cuda_emulator import EmulatorRuntime, find_compiler
    return EmulatorRuntime if find_compiler() else None


def check_random_graph(graph):
    """Run ``graph`` on NumPy, the reference evaluator and every mode, two calls each;
    compare the results (and the variable) with NumPy's."""
    rng = np.random.default_rng(graph.seed + 1)
    feeds = [[rng.uniform(-1.0, 1.0, size=s) for s in graph.inputs] for _ in range(2)]
    if graph.variable:  # input 0 holds feeds[0][0] to begin with, and is not fed
        feeds = [f[1:] for f in feeds]
        first = rng.uniform(-1.0, 1.0, size=graph.inputs[0])
    want, w = [], None
    for f in feeds:  # NumPy; a variable starts the second call where the first left it
        if graph.variable:
            w = first if w is None else w
            vals, w = build_graph(graph, [w] + f, False)
        else:
            vals, _ = build_graph(graph, f, False)
        want.append(([vals[k] for k in graph.results], w))

    def check(what, call, got, state):
        values, new = want[call]
        for k, g, v in zip(graph.results, got, values):
            np.testing.assert_allclose(g, v, rtol=1e-9, atol=1e-9 * (1 + graph.bounds[k]),
                                       err_msg=f"{what}, call {call + 1}, value {k}")
        if graph.variable:
            np.testing.assert_allclose(state, new, rtol=1e-9, atol=1e-9 * (1 + BOUND),
                                       err_msg=f"{what}, call {call + 1}, the variable")

    def build():
        """``(variable or None, placeholders, ops to request)``"""
        vals, update = build_graph(graph, [first] if graph.variable else [], True)
        n = len(graph.inputs)
        wanted = [vals[k] for k in graph.results] + ([update] if update is not None else [])
        if graph.variable:
            return vals[0], vals[1:n], wanted
        return None, vals[:n], wanted

    var, params, wanted = build()
    state = {}
    for call, f in enumerate(feeds):
        got = be.evaluate(wanted, feeds=dict(zip(params, f)), state=state)
        check("be.evaluate", call, got, state.get(var))
    for name, make in _graph_modes(graph.seed).items():
        var, params, wanted = build()
        t = make()
        comp = t.computation(wanted, *params)
        for call, f in enumerate(feeds):
            got = comp(*[a.copy() for a in f])
            check(name, call, got, t.state[var] if var is not None else None)


@pytest.fixture
def low_thresholds(monkeypatch):
    for module, name, value in LOW_THRESHOLDS:
        monkeypatch.setattr(module, name, value)
    monkeypatch.setattr(fusion, "MAX_THREADS", max(2, fusion.MAX_THREADS))
    monkeypatch.setattr(compiled_kernels, "UNAVAILABLE", frozenset())
    monkeypatch.setattr(ctoolchain, "_warned", set())
    monkeypatch.setattr(memory, "VERIFY", True)


def test_random_graphs_match_numpy_in_every_mode(low_thresholds):
    first = int(os.environ.get("GEON_DIFF_SEED") or
                int.from_bytes(os.urandom(4), "little"))
    print(f"random graphs: GEON_DIFF_SEED={first} GEON_DIFF_GRAPHS={RANDOM_GRAPHS}")
    with warnings.catch_warnings():
        # a compiled mode that fell back to the NumPy code would test nothing new
        warnings.filterwarnings("error", message=".*running the NumPy code instead")
        for seed in range(first, first + RANDOM_GRAPHS):
            graph = draw_graph(seed)
            try:
                check_random_graph(graph)
            except Exception as e:
                raise AssertionError(
                    f"{graph}\nreplay: GEON_DIFF_SEED={seed} GEON_DIFF_GRAPHS=1 python -m "
                    f"pytest -q tests/test_differential.py -k random_graphs\n"
                    f"{type(e).__name__}: {e}") from e
