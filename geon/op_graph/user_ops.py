"""User-defined ops: a new op class with its axes rule, NumPy implementation and
derivative rules, registered in every table that needs it in one call.

:func:`define_op` makes the class, which carries its implementations as data
(``numpy_impl``, ``cuda_source``), and registers

- the reference evaluator (:data:`geon.op_graph.reference.EVALUATORS`), which calls
  the NumPy implementation;
- the reverse rule (``geon.op_graph.autodiff.ADJOINTS``) and the forward rule
  (``geon.op_graph.forward.FORWARD``; derived from the reverse rule when not given);
- the class in :data:`USER_OPS` under its ``registry_key``.

Backends need no registration per op: each has one rule for :class:`UserOp` in its code
table that reads the class's implementation (the NumPy transformer runs every user op;
the GPU transformer runs the elementwise ones given ``cuda=`` source). A transformer
that cannot run an op raises :class:`~geon.errors.LoweringError` naming it.

:func:`elementwise_op` is the shortcut for a unary elementwise function given by its
value (NumPy) and its derivative (geon ops).
"""

import ast
import inspect
import keyword
from typing import Any, Callable, Optional, Sequence

import numpy as np

from geon.errors import ArgumentError, GeonError
from geon.op_graph import op_graph as og
from geon.op_graph.axes import as_axes
from geon.op_graph.forward import forward_from_reverse
from geon.op_graph.special import align
from geon.op_graph.tables import ADJOINTS, EVALUATORS, FORWARD

#: registry key -> user op class (backends find the classes' implementations here)
USER_OPS: dict[str, type] = {}

# Keywords of every op, and attributes ops set on themselves: parameters cannot shadow
# them (parameters become attributes of the op).
_RESERVED = {"name", "axes", "dtype", "tags", "initializers", "follows", "params",
             "filename", "lineno", "other_deps", "user_deps", "users", "forward"}


class UserOp:
    """Mixin of every class made by :func:`define_op`.

    Class attributes: ``numpy_impl`` (the NumPy function), ``param_names``,
    ``registry_key`` (its key in :data:`USER_OPS`, an identifier), ``cuda_source``
    (CUDA C source or ``None``), ``type_name``
    (``"user:<registry key>"``, the op type in serialized graphs). Instances hold their
    keyword parameters in ``params``; each parameter is also an attribute of the op and
    one of its ``attrs`` (after ``dtype``), so CSE, copying, printing and serialization
    treat user ops like any other op.
    """

    numpy_impl = None
    arity: Optional[int] = None
    param_names = ()
    registry_key = None
    type_name = None
    cuda_source = None
    _axes_rule = None
    _dtype_rule = None

    def __init__(self, *args, **kwargs):
        params = {k: kwargs.pop(k) for k in self.param_names if k in kwargs}
        missing = [k for k in self.param_names if k not in params]
        if missing:
            raise ArgumentError(f"{type(self).__name__} needs parameter(s) {', '.join(missing)}")
        for k, v in params.items():
            if not _literal(v):
                raise ArgumentError(f"{type(self).__name__}: parameter {k}={v!r} must be a "
                                    f"number, string, bool, None or a tuple of those (it is "
                                    f"written into generated code)")
        self.params = params
        super().__init__(*args, **kwargs)

    def _infer_dtype(self):
        rule = type(self)._dtype_rule
        if rule is None:
            dt = og.result_dtype(self.args)
            return dt if dt.kind in "fc" else og.DEFAULT_DTYPE
        return np.dtype(rule(*self.args) if callable(rule) else rule)

    def compute(self, *arrays):
        """The NumPy implementation applied to ``arrays`` with this op's parameters."""
        return type(self).numpy_impl(*arrays, **self.params)


def _literal(v):
    try:
        return ast.literal_eval(repr(v)) == v
    except (ValueError, SyntaxError, TypeError):
        return False


class _UserTensorOp(UserOp, og.ComputationOp):
    def _infer_axes(self):
        axes = type(self)._axes_rule(*self.args, **self.params)
        return as_axes(axes)


class _UserElementWise(UserOp, og.ElementWise):
    pass


def _caller_module():
    f = inspect.currentframe()
    while f is not None and f.f_globals.get("__name__") == __name__:
        f = f.f_back
    return f.f_globals.get("__name__", __name__) if f is not None else __name__


def _unique_key(name):
    key, k = name, 2
    while key in USER_OPS:
        key, k = f"{name}_{k}", k + 1
    return key


def define_op(name: str, numpy: Callable[..., Any], *,
              axes: Optional[Callable[..., Any]] = None,
              reverse: Optional[Callable[..., Any]] = None,
              forward: Optional[Callable[..., Any]] = None, dtype: Any = None,
              params: Sequence[str] = (), arity: Optional[int] = None,
              cuda: Optional[str] = None, doc: Optional[str] = None) -> type:
    """Define a new op class and register it with every table (see the module doc).

    Args:
        name: the class name (an identifier), shown in printed graphs, errors and the
            generated code.
        numpy: ``fn(*arrays, **params) -> array``: the value. Each array is laid out
            by its arg's axes; the result must be laid out by the op's axes. For an
            elementwise op (``axes=None``) the arrays are already broadcast to the
            op's axes in the op's order.
        axes: ``fn(*args, **params) -> Axes``: the result's axes from the arg ops.
            ``None`` makes an elementwise op: args are matched by axis name and the
            result has the first arg's axes followed by the others' new ones.
        reverse: ``fn(op, delta) -> [delta per arg]``: the reverse rule, as in
            ``ADJOINTS`` (``None`` entries: no
            derivative; a delta may have fewer or more axes than its arg: it is
            broadcast or summed). Without it the op is not differentiable.
        forward: ``fn(op, tangents) -> tangent``: the forward rule, as in
            ``FORWARD`` (``tangents[i]`` is ``None``
            where arg ``i`` has none). Default: derived from ``reverse``.
        dtype: the result dtype, or ``fn(*args) -> dtype``; default: the args'
            promoted float type.
        params: names of keyword parameters (``op.params``, passed to ``numpy`` and
            ``axes``); values must be literals (numbers, strings, tuples).
        arity: the number of args, checked when an op is built (default: any).
        cuda: CUDA C source of the op for GPU transformers (kept on the class as
            ``cuda_source``); a transformer that cannot run the op says so by name
            when a computation is built.
        doc: the class docstring.

    Returns the op class; call it with the args (and parameters) to build an op.
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise ArgumentError(f"define_op: name must be an identifier, not {name!r}")
    if not callable(numpy):
        raise ArgumentError(f"define_op {name}: numpy must be a function of arrays")
    params = tuple(params)
    elementwise = axes is None
    base = _UserElementWise if elementwise else _UserTensorOp
    bad = [p for p in params if not isinstance(p, str) or p in _RESERVED
           or not (p.isascii() and p.isidentifier()) or keyword.iskeyword(p)
           or p.startswith("_") or hasattr(base, p)]
    if bad:
        raise ArgumentError(f"define_op {name}: parameter name(s) {bad} are reserved, "
                            f"attributes of every op, keywords or not ASCII identifiers "
                            f"(they are keyword arguments in generated code)")
    if elementwise and params:
        raise ArgumentError(f"define_op {name}: an elementwise op takes no parameters "
                            f"(lowering rebuilds it from its args); close over them instead")
    key = _unique_key(name)
    cls = type(name, (base,), {
        **{p: property(lambda self, p=p: self.params[p],  # type: ignore[misc]
                       doc=f"Parameter {p}.")
           for p in params},
        "attrs": base.attrs + params,
        "type_name": "user:" + key,
        "__doc__": doc or f"User-defined op {name}.",
        "__module__": _caller_module(),
        "numpy_impl": staticmethod(numpy),
        "param_names": params,
        "arity": arity,
        "registry_key": key,
        "cuda_source": cuda,
        "_axes_rule": staticmethod(axes) if axes is not None else None,
        "_dtype_rule": staticmethod(dtype) if callable(dtype) else dtype,
    })
    USER_OPS[key] = cls
    _register_evaluation(cls, elementwise)
    _register_derivatives(cls, reverse, forward)
    return cls


def _register_evaluation(cls, elementwise):
    def evaluate(op, *vals):
        if elementwise:
            vals = [np.broadcast_to(align(v, a.axes, op.axes), op.axes.shape)
                    for v, a in zip(vals, op.args)]  # as the generated code passes them
        with np.errstate(all="ignore"):
            r = np.asarray(op.compute(*vals))
        if elementwise:
            r = np.broadcast_to(r, op.axes.shape)
        elif r.shape != op.axes.shape:
            raise GeonError(f"user op {type(op).__name__} {op.name}: its NumPy "
                            f"implementation returned shape {r.shape}, but its axes "
                            f"{op.axes!r} need {op.axes.shape}{op._where()}")
        return r.astype(op.dtype)

    EVALUATORS[cls] = evaluate


def _register_derivatives(cls, reverse, forward):
    if reverse is not None:
        ADJOINTS[cls] = reverse
    if forward is not None:
        FORWARD[cls] = forward
    elif reverse is not None:
        FORWARD[cls] = forward_from_reverse(reverse)


def elementwise_op(name: str, numpy: Callable[..., Any], derivative: Callable[..., Any],
                   *, cuda: Optional[str] = None, doc: Optional[str] = None) -> type:
    """Shortcut for a unary elementwise op ``f`` given by its value and derivative.

    Args:
        name: the class name.
        numpy: ``fn(array) -> array``, the value ``f(x)`` elementwise.
        derivative: ``fn(x) -> op`` giving ``f'(x)`` from the arg op ``x`` with geon
            ops, or ``fn(x, y) -> op`` to reuse the op's own value ``y = f(x)``. Being
            made of ops, it is itself differentiable, so higher derivatives work.
        cuda, doc: as for :func:`define_op`.

    The reverse rule is ``delta * f'(x)`` and the forward rule ``tangent * f'(x)``.
    Returns the op class.
    """
    try:
        sig = inspect.signature(derivative)
        two = len([p for p in sig.parameters.values()
                   if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                   and p.default is p.empty]) >= 2
    except (TypeError, ValueError):
        two = False

    def slope(op):
        x = op.args[0]
        return derivative(x, op) if two else derivative(x)

    def reverse(op, delta):
        return (delta * slope(op),)

    def forward(op, tangents):
        return tangents[0] * slope(op)

    reverse.__name__ = f"{name}_reverse"
    forward.__name__ = f"{name}_forward"
    return define_op(name, numpy, reverse=reverse, forward=forward, arity=1, cuda=cuda,
                     doc=doc or f"Elementwise user-defined op {name}.")
