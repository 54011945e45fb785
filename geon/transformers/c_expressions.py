"""C expressions that the compiled CPU path and the CUDA code write the same way.

:data:`C_EXPRESSIONS` maps an elementwise op class to ``fn(op, t, args) -> C
expression``: ``t`` is the C name of the type the op computes in (``float`` or
``double`` on the compiled path; on the GPU also the integer and bool types) and
``args`` are the args' C expressions, already in that type. Both
backends look an op up in their own table first (``C_RULES`` of the NumPy transformer's
compiled path, ``CUDA_CODE`` of the GPU transformer) and then here, so an op whose C is
plain arithmetic or one call of the C maths library has one entry for both. An op whose
code differs between them (a helper of the CUDA prelude, integer types the compiled
path does not run) has an entry in each backend's own table instead.
"""

from geon.op_graph import op_graph as og
from geon.op_graph.tables import OpTable


def math_name(name, t):
    """The C library's name of maths function ``name`` (its double name) in C type
    ``t``: ``expf`` for float, ``exp`` for double."""
    return name + ("f" if t == "float" else "")


def call_rule(name):
    """The expression calling maths function ``name`` on the args."""
    return lambda op, t, a: f"{math_name(name, t)}({', '.join(a)})"


def infix_rule(sym):
    """The expression of a binary operator ``sym`` (``+``, ``<``, ...)."""
    return lambda op, t, a: f"({a[0]} {sym} {a[1]})"


C_EXPRESSIONS = OpTable("C_EXPRESSIONS", "fn(op, C type, [C expressions]) -> C expression")
#: Decorator: ``@c_expression(Cls, ...)`` registers ``fn(op, t, args) -> C expression``.
c_expression = C_EXPRESSIONS.register

for _cls, _sym in [(og.Add, "+"), (og.Subtract, "-"), (og.Multiply, "*"), (og.Divide, "/"),
                   # comparisons: 1 or 0, converted to the op's dtype by the caller
                   (og.Equal, "=="), (og.NotEqual, "!="), (og.Less, "<"),
                   (og.LessEqual, "<="), (og.Greater, ">"), (og.GreaterEqual, ">=")]:
    C_EXPRESSIONS[_cls] = infix_rule(_sym)

# The order here is the order of the maths library's declarations in the compiled
# path's C (see numpy/c_rules.math_used).
for _cls, _name in [(og.Sqrt, "sqrt"), (og.Exp, "exp"), (og.Log, "log"), (og.Sin, "sin"),
                    (og.Cos, "cos"), (og.Tanh, "tanh"), (og.Expm1, "expm1"),
                    (og.Power, "pow")]:
    C_EXPRESSIONS[_cls] = call_rule(_name)


@c_expression(og.Negative)
def _negative(op, t, a):
    return f"(-{a[0]})"


@c_expression(og.Square)
def _square(op, t, a):
    return f"({a[0]} * {a[0]})"


@c_expression(og.Reciprocal)
def _reciprocal(op, t, a):
    return f"(({t})1 / {a[0]})"


@c_expression(og.Erf)
def _erf(op, t, a):
    # in double and rounded once: within an ulp of geon.op_graph.special.erf in float32
    return f"(({t})erf((double){a[0]}))"
