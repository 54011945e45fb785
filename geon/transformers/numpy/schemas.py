"""NumPy code for the composites of :mod:`geon.op_graph.schemas` that keep their own
code (sigmoid cross-entropy)."""

from geon.op_graph import schemas as sc
from geon.op_graph.reference import sigmoid_ce
from geon.transformers.numpy.code_table import NUMPY_GLOBALS, numpy_code


@numpy_code(sc.SigmoidCrossEntropy)
def _sigmoid_ce(op, out, args):
    # one line, because the memory planner may give ``out`` the buffer of x or t (in
    # place); the reference's function, which never forms inf - inf or 0 * inf
    return [f"np.copyto({out}, _sigmoid_ce({', '.join(args)}), casting='unsafe')"]


NUMPY_GLOBALS["_sigmoid_ce"] = sigmoid_ce
