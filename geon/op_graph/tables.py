"""Tables keyed by op class: one per concern (derivatives, evaluation, code generation).

Each concern keeps its rules in an :class:`OpTable`; adding an op is one entry per
table, and a rule registered for a base class serves its subclasses.

The op graph's own tables are defined here, empty, and this module imports nothing of
geon: each op module registers its rules into them where it defines its classes, so a
rule exists as soon as its op does, whatever was imported first. The engines that read
the tables (:mod:`~geon.op_graph.autodiff`, :mod:`~geon.op_graph.forward`,
:mod:`~geon.op_graph.reference`) import no op module.
"""


class OpTable(dict):
    """``{op class: rule}`` with a decorator to fill it and a lookup along the MRO.

    ``what`` describes the rules' signature (for docs and error messages).
    """

    def __init__(self, name, what=""):
        super().__init__()
        self.name, self.what = name, what

    def register(self, *classes):
        """Decorator: make the function the rule of ``classes``."""
        def add(fn):
            for cls in classes:
                self[cls] = fn
            return fn
        return add

    def find(self, op):
        """The rule for ``type(op)`` or its nearest registered base class, or ``None``."""
        for cls in type(op).__mro__:
            rule = self.get(cls)
            if rule is not None:
                return rule
        return None

    def __repr__(self):
        return f"<OpTable {self.name}: {len(self)} rules>"


#: Reverse derivatives, read by :func:`geon.op_graph.autodiff.deriv`.
ADJOINTS = OpTable("ADJOINTS", "fn(op, delta) -> one delta per arg")
#: Decorator: ``@adjoint_rule(Cls, ...)`` registers ``fn(op, delta) -> deltas``.
adjoint_rule = ADJOINTS.register

#: Forward derivatives (tangents), read by :func:`geon.op_graph.forward.jvp`.
FORWARD = OpTable("FORWARD", "fn(op, tangents of the args) -> tangent")
#: Decorator: ``@forward_rule(Cls, ...)`` registers ``fn(op, tangents) -> tangent``.
forward_rule = FORWARD.register

#: Reference values, read by :func:`geon.op_graph.reference.evaluate`.
EVALUATORS = OpTable("EVALUATORS", "fn(op, *arg_values) -> array")
#: Decorator: ``@evaluator(Cls, ...)`` registers ``fn(op, *arg_values) -> array``.
evaluator = EVALUATORS.register

#: The NumPy function of an elementwise op of its (aligned) args alone, keyed by the
#: exact class (the reference's evaluator of ``ElementWise`` and constant folding
#: read it).
ELEMENTWISE_FUNCS = OpTable("ELEMENTWISE_FUNCS", "fn(*arrays) -> array")

#: The NumPy ufunc of each elementwise op that is one (the NumPy transformer emits a
#: call of it; dtype rules of the NumPy family use it too).
NP_UFUNCS = OpTable("NP_UFUNCS", "a numpy.ufunc")


#: The classes declared with :func:`primitive`, in the order of their declaration, and
#: how many times that list has changed.
_PRIMITIVES: list = []
_CHANGES = [0]


def primitive(cls: type) -> type:
    """Class decorator: declare the op class ``cls`` a semi-primitive of the standard
    base set, an op every built-in backend runs as it is. The declaration is the
    class's own: a subclass is not a primitive unless it says so too (a user op derived
    from ``Add`` is not ``Add``). A class declared after the transformers were imported
    joins their base sets too: they read :func:`declared_primitives` when asked."""
    cls.primitive_class = cls  # type: ignore[attr-defined]
    _PRIMITIVES.append(cls)
    _CHANGES[0] += 1
    return cls


def restore_primitives(saved: list) -> None:
    """Make the declared primitives ``saved`` (an earlier ``list(_PRIMITIVES)``) again,
    keeping those declared since by geon's own modules (a module imported meanwhile is
    not imported twice, so its classes would not be declared again): for tests that
    declare primitives of their own."""
    kept = [c for c in _PRIMITIVES if c not in saved and c.__module__.startswith("geon.")]
    _PRIMITIVES[:] = list(saved) + kept
    _CHANGES[0] += 1


def declared_primitives(root: type = object) -> list:
    """The classes declared with :func:`primitive` that derive from ``root``, in the
    order of their declaration: the standard base set."""
    return [c for c in _PRIMITIVES if issubclass(c, root)]


def primitives_version() -> int:
    """A number that changes whenever the declared primitives do (a base set computed
    from the declarations is up to date while it does not change)."""
    return _CHANGES[0]
