"""A float64 central-difference gradient checker for geon graphs.

For a graph output ``f`` (any axes) the checker builds the scalar
``L = sum(f * R)`` over all of ``f``'s axes, with a fixed random ``R`` laid out as ``f``.
``be.deriv(L, x)`` for every checked input ``x``, run through ``be.NumPyTransformer``
(and, separately, through the reference evaluator ``be.evaluate``), must match the
central differences ``(L(x + eps e_j) - L(x - eps e_j)) / (2 eps)``, where ``L`` is
computed by a separate forward-only computation. The comparison is norm-based:
``||analytic - numeric|| <= atol + rtol * ||numeric||`` per input.

Inputs are placeholders by default, or Variables (``mode="variable"``; the forward
values are then changed through the transformer's live state). With ``lowered=True`` the
graph of ``L`` is first compiled (which lowers it in place to semi-primitive ops) and then
differentiated, so the adjoint rules of the primitives are the ones checked.
"""

import dataclasses
from typing import List

import numpy as np

import geon as be


@dataclasses.dataclass
class InputReport:
    index: int
    analytic: np.ndarray      # through NumPyTransformer
    reference: np.ndarray     # through be.evaluate (None if not checked)
    numeric: np.ndarray
    error: float              # ||analytic - numeric||
    reference_error: float    # ||reference - numeric|| (0 if not checked)
    scale: float              # ||numeric||
    ok: bool


@dataclasses.dataclass
class GradcheckResult:
    inputs: List[InputReport]
    loss: float
    rtol: float
    atol: float

    @property
    def ok(self):
        return all(r.ok for r in self.inputs)

    def __str__(self):
        lines = [f"gradcheck {'passed' if self.ok else 'FAILED'} (L = {self.loss:.6g}, "
                 f"rtol={self.rtol}, atol={self.atol})"]
        for r in self.inputs:
            lines.append(f"  input {r.index}: |analytic - numeric| = {r.error:.3e}, "
                         f"|reference - numeric| = {r.reference_error:.3e}, "
                         f"|numeric| = {r.scale:.3e} -> {'ok' if r.ok else 'WRONG'}")
            if not r.ok:
                lines.append(f"    analytic  {np.array2string(r.analytic.ravel()[:8])}")
                lines.append(f"    numeric   {np.array2string(r.numeric.ravel()[:8])}")
        return "\n".join(lines)


def _is_float(a):
    return np.asarray(a).dtype.kind == "f"


class _Graph:
    """One fresh build of ``L = sum(build(*xs) * R)`` over the given inputs."""

    def __init__(self, build, inputs, R, mode):
        self.xs = []
        for axes, arr in inputs:
            if mode == "variable" and _is_float(arr):
                x = be.Variable(axes=axes, initial_value=arr, dtype=arr.dtype)
            else:
                x = be.placeholder(axes, dtype=arr.dtype)
            self.xs.append(x)
        self.params = [x for x in self.xs if isinstance(x, be.Placeholder)]
        self.f = build(*self.xs)
        if R is None:
            return
        r = be.Constant(np.asarray(R, dtype=np.float64), axes=self.f.axes,
                        dtype=np.float64)
        prod = self.f * r
        self.L = be.sum(prod, reduction_axes=prod.axes) if len(prod.axes) else prod

    def feeds(self, arrays):
        return [a for x, a in zip(self.xs, arrays) if isinstance(x, be.Placeholder)]


def _projection(build, inputs, seed):
    """A fixed random ``R`` with the shape of ``build``'s output."""
    f = _Graph(build, inputs, None, "placeholder").f
    rng = np.random.default_rng(seed)
    return rng.standard_normal(f.axes.shape), f


def gradcheck(build, inputs, wrt=None, *, eps=1e-6, rtol=1e-6, atol=1e-8, seed=1234,
              mode="placeholder", reference=True, lowered=False):
    """Check ``be.deriv`` of ``build``'s output against central differences.

    Args:
        build: ``fn(*input_ops) -> op`` (any axes, float output).
        inputs: a list of ``(axes, array)``; float arrays are made float64 and checked,
            integer arrays (labels) are fed as they are.
        wrt: indices of the inputs to check (default: every float input).
        eps, rtol, atol: step and tolerances (see the module docstring).
        seed: seed of the random projection ``R``.
        mode: ``"placeholder"`` or ``"variable"`` (float inputs become Variables).
        reference: also evaluate the derivative graph with ``be.evaluate``.
        lowered: differentiate the lowered graph (see the module docstring).

    Returns a :class:`GradcheckResult` (``.ok``; ``str()`` explains).
    """
    if mode not in ("placeholder", "variable"):
        raise ValueError(f"mode must be 'placeholder' or 'variable', not {mode!r}")
    inputs = [(be.Axes(axes), np.array(a, dtype=np.float64) if _is_float(a) else np.array(a))
              for axes, a in inputs]
    arrays = [a for _, a in inputs]
    if wrt is None:
        wrt = [i for i, a in enumerate(arrays) if _is_float(a)]
    R, _ = _projection(build, inputs, seed)

    # Analytic derivatives through the NumPy transformer.
    g = _Graph(build, inputs, R, mode)
    t = be.NumPyTransformer()
    if lowered:
        t.computation(g.L, *g.params)
    grads = [be.deriv(g.L, g.xs[i]) for i in wrt]
    comp = t.computation([g.L] + grads, *g.params)
    out = comp(*g.feeds(arrays))
    loss = float(out[0])
    analytic = [np.asarray(v, dtype=np.float64) for v in out[1:]]

    # The same derivatives through the reference evaluator (a fresh graph).
    refs = [None] * len(wrt)
    if reference:
        gr = _Graph(build, inputs, R, mode)
        if lowered:
            be.NumPyTransformer().computation(gr.L, *gr.params)
        rgrads = [be.deriv(gr.L, gr.xs[i]) for i in wrt]
        feeds = {x: a for x, a in zip(gr.xs, arrays) if isinstance(x, be.Placeholder)}
        state = {x: a.copy() for x, a in zip(gr.xs, arrays) if isinstance(x, be.Variable)}
        refs = [np.asarray(v, dtype=np.float64)
                for v in be.evaluate(rgrads, feeds=feeds, state=state)]

    # Central differences of L from a separate forward-only computation.
    numeric = numeric_gradients(build, inputs, R, wrt, eps=eps, mode=mode)

    reports = []
    for k, i in enumerate(wrt):
        a, n = analytic[k], numeric[k]
        if a.shape != n.shape:
            err = float("inf")
        else:
            err = float(np.linalg.norm(a - n))
        scale = float(np.linalg.norm(n))
        bound = atol + rtol * scale
        ref_err = 0.0
        if refs[k] is not None:
            ref_err = float(np.linalg.norm(refs[k] - n)) if refs[k].shape == n.shape \
                else float("inf")
        ok = bool(err <= bound and ref_err <= bound)
        reports.append(InputReport(i, a, refs[k], n, err, ref_err, scale, ok))
    return GradcheckResult(reports, loss, rtol, atol)


def numeric_gradients(build, inputs, R, wrt, eps=1e-6, mode="placeholder"):
    """Central differences of ``L = sum(build(*inputs) * R)`` for each input in ``wrt``."""
    arrays = [np.array(a) for _, a in inputs]
    g = _Graph(build, inputs, R, mode)
    t = be.NumPyTransformer()
    comp = t.computation(g.L, *g.params)

    if mode == "variable":
        comp(*g.feeds(arrays))  # allocate and initialize the state

    def L(vals):
        if mode == "variable":
            for x, v in zip(g.xs, vals):
                if isinstance(x, be.Variable):
                    np.copyto(t.state[x], v)
        return float(comp(*g.feeds(vals)))

    result = []
    for i in wrt:
        base = arrays[i]
        grad = np.zeros(base.shape, dtype=np.float64)
        flat = grad.reshape(-1)
        for j in range(base.size):
            vals = list(arrays)
            plus, minus = base.copy(), base.copy()
            plus.reshape(-1)[j] += eps
            minus.reshape(-1)[j] -= eps
            vals[i] = plus
            lp = L(vals)
            vals[i] = minus
            lm = L(vals)
            flat[j] = (lp - lm) / (2 * eps)
        result.append(grad)
    return result


def assert_gradcheck(build, inputs, wrt=None, **kwargs):
    """:func:`gradcheck`, raising ``AssertionError`` with its report if it fails."""
    res = gradcheck(build, inputs, wrt, **kwargs)
    assert res.ok, str(res)
    return res
