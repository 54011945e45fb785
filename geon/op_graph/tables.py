"""Tables keyed by op class: one per concern (derivatives, evaluation, code generation).

Each concern keeps its rules in an :class:`OpTable`; adding an op is one entry per
table, and a rule registered for a base class serves its subclasses.
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
