"""geon's loggers: ``logging.getLogger("geon")`` and its children (one per module,
``geon.transformers.base``, ``geon.op_graph.run``, ...).

geon never configures logging: the ``geon`` logger gets a ``NullHandler`` and nothing
else, so it prints nothing unless the application asks for it, e.g.
``logging.basicConfig(level=logging.INFO)`` or
``logging.getLogger("geon").setLevel(logging.DEBUG)`` with a handler. What is logged:

- INFO, ``geon.transformers.base``: each computation a transformer builds, with the
  number of ops before and primitives after, and the seconds spent in its passes and
  in all of the transformation;
- DEBUG, ``geon.transformers.base``: each pass, with its seconds and the ops left;
- DEBUG, ``geon.op_graph.run``: ``be.run`` reusing a remembered value or a compiled
  computation, and compiling a new one;
- DEBUG, ``geon.transformers.gpu.runtime``: kernels compiled and kernels found in the
  runtime's cache.
"""

import logging

ROOT = "geon"

logging.getLogger(ROOT).addHandler(logging.NullHandler())


def get_logger(name):
    """The logger ``name`` (a module's ``__name__``, under ``geon``)."""
    if name != ROOT and not name.startswith(ROOT + "."):
        name = f"{ROOT}.{name}"
    return logging.getLogger(name)
