"""NumPy code for user ops (:mod:`geon.op_graph.user_ops`): each carries its NumPy
function, which the generated modules call by a name of their own."""

from geon.op_graph.user_ops import USER_OPS, UserOp
from geon.transformers.codegen_text import identifier, py_literal
from geon.transformers.numpy.code_table import NUMPY_GLOBALS, numpy_code


#: user op class -> the name generated code calls its NumPy function by
_USER_FUNCTIONS = {}


def _user_function(cls):
    """The name generated code calls user op ``cls``'s NumPy function by: an ASCII
    identifier, unique among the generated modules' globals (two user ops whose names
    Python would read as one, such as ``fi`` and its ligature, get two names)."""
    name = _USER_FUNCTIONS.get(cls)
    if name is None:
        taken = set(NUMPY_GLOBALS) | set(_USER_FUNCTIONS.values())
        name = _USER_FUNCTIONS[cls] = identifier("user_" + cls.registry_key, taken)
    return name


@numpy_code(UserOp)
def _user_op(op, out, args):
    # every user op (geon.define_op) carries its NumPy function: one rule serves them all
    kw = "".join(f", {k}={py_literal(v)}" for k, v in op.params.items())
    call = f"{_user_function(type(op))}({', '.join(args)}{kw})"
    return [f"np.copyto({out}, {call}, casting='unsafe')"]


def _module_globals():
    """What the generated modules see besides ``np``: :data:`NUMPY_GLOBALS` and the
    user ops' NumPy functions."""
    names = dict(NUMPY_GLOBALS)
    names.update((_user_function(c), c.numpy_impl) for c in USER_OPS.values())
    return names
