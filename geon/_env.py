"""geon's environment variables, read with a warning instead of an error.

A ``GEON_*`` variable is often read while ``import geon`` runs; a value geon cannot
use (``GEON_NUM_THREADS=abc``) must not make the import fail. Each reader here returns
the default for such a value and warns once, naming the variable, the value and the
default it used.

Read at import: ``GEON_NUM_THREADS``, ``OMP_NUM_THREADS`` and ``GEON_ADAPT_THREADS``
(the thread policy, ``geon.transformers.threads``) and ``GEON_BLAS_ACCUMULATE``
(``geon.transformers.numpy.blas.ENABLED``).
"""

import os
import warnings
from typing import Mapping, Optional

from geon.errors import GeonWarning

_FALSE = ("0", "false", "no", "off")
_TRUE = ("1", "true", "yes", "on")


def _warn(name, value, expected, default):
    warnings.warn(f"environment variable {name}={value!r} is not {expected}; using the "
                  f"default ({default})", GeonWarning, stacklevel=3)


def env_int(name: str, default: int, minimum: int = 0,
            environ: Optional[Mapping[str, str]] = None) -> int:
    """The integer value of ``name``; ``default`` where it is unset or empty, and where
    it is not an integer or is below ``minimum`` (those two warn)."""
    environ = os.environ if environ is None else environ
    raw = environ.get(name, "")
    text = raw.strip()
    if not text:
        return default
    try:
        v = int(text)
    except ValueError:
        _warn(name, raw, "an integer", default)
        return default
    if v < minimum:
        _warn(name, raw, f"an integer >= {minimum}", default)
        return default
    return v


def env_flag(name: str, default: bool, environ: Optional[Mapping[str, str]] = None) -> bool:
    """``name`` as a switch: ``0``/``false``/``no``/``off`` or ``1``/``true``/``yes``/
    ``on`` (any case); unset or empty gives ``default``, anything else warns and gives
    ``default`` too."""
    environ = os.environ if environ is None else environ
    raw = environ.get(name, "")
    text = raw.strip().lower()
    if not text:
        return default
    if text in _FALSE:
        return False
    if text in _TRUE:
        return True
    _warn(name, raw, "one of " + ", ".join(_TRUE + _FALSE), int(default))
    return default
