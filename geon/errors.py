"""Exception types raised by geon.

Every error a user can trigger derives from :class:`GeonError`; the ones about bad
values also derive from :class:`ValueError` so that generic handlers keep working.
"""


class GeonError(Exception):
    """Base class of geon's own errors."""


class AxisMismatchError(GeonError, ValueError):
    """Operands' axes do not fit together; raised when the op is built."""


class FeedError(GeonError, ValueError):
    """A computation was called with a wrong number, shape or dtype of values."""


class InvalidValueError(GeonError, ValueError):
    """The value of an op that a pass removed (its forward is Invalid) was asked for."""


class LoweringError(GeonError, ValueError):
    """A transformer met an op it cannot lower to its base set."""


class CheckpointError(GeonError, ValueError):
    """A checkpoint is missing, corrupt or does not match the variables."""


class UnknownTransformerError(GeonError, ValueError):
    """``make_transformer`` was given a name no transformer is registered under."""


class SerializationError(GeonError, ValueError):
    """A graph cannot be written as JSON, or a JSON text is not a graph geon can load
    (malformed, an unknown version or op type, a dangling reference ...)."""


class IndexOutOfRangeError(GeonError, IndexError):
    """An index tensor fed at call time holds an index outside the indexed axis."""
