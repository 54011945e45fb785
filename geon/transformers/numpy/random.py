"""NumPy code for the random primitive (:class:`geon.op_graph.random.Random`): one call
of the vectorised Philox draw that the reference evaluator also uses."""

import numpy as np

from geon.op_graph import random as rnd
from geon.transformers.codegen_text import py_literal
from geon.transformers.numpy.code_table import NUMPY_GLOBALS, numpy_code


def random_into(out, distribution, seed, stream, step):
    """Write the draw of ``(seed, stream)`` at ``step`` into ``out``."""
    out[...] = rnd.draw(distribution, out.shape, out.dtype, seed, stream, int(np.asarray(step)))


NUMPY_GLOBALS.update(_random_into=random_into)


@numpy_code(rnd.Random)
def _random(op, out, args):
    step, = args
    return [f"_random_into({out}, {py_literal(op.distribution)}, {py_literal(op.seed)}, "
            f"{py_literal(op.stream)}, {step})"]
