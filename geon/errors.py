"""Exception types raised by geon.

Every error a user can trigger derives from :class:`GeonError`; the ones about bad
values also derive from :class:`ValueError` so that generic handlers keep working.
"""


class GeonError(Exception):
    """Base class of geon's own errors."""


class GeonWarning(UserWarning):
    """Base class of geon's warnings (something ran that the user may not expect)."""


class ArgumentError(GeonError, TypeError, ValueError):
    """A geon function or computation was given an argument it does not take or cannot
    use: an unknown keyword, a placeholder twice, a value that is not an op. It is a
    ``TypeError`` (what Python raises for a wrong argument) and a ``ValueError``."""


class AxisIndexError(GeonError, IndexError, ValueError):
    """An index or slice is out of range of its axis; raised when the op is built."""


class TruthValueError(GeonError, TypeError):
    """An op was used where Python needs ``True`` or ``False`` (``if y < 0:``); an op's
    value is only known when a computation runs."""


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


class NumericsError(GeonError, FloatingPointError):
    """A computation built with ``check_numerics=True`` met a NaN or an infinity: an op
    computed one, or a placeholder was fed one. The message names the op, the user's op
    it was lowered from and its source line, and says which inputs were finite.

    Attributes: ``op`` (the op that computed the value, or the placeholder),
    ``user_op`` (``"<Class> <name>"`` of the op the user built), ``file_info`` (where
    that op was built), ``inputs`` (``[(name, finite)]``, one per input; empty for a
    placeholder) and ``members`` (the names of the ops of the fused group that
    computed it, or ``[]``).
    """

    def __init__(self, message, op=None, user_op=None, file_info=None, inputs=(),
                 members=()):
        super().__init__(message)
        self.op, self.user_op, self.file_info = op, user_op, file_info
        self.inputs, self.members = list(inputs), list(members)


class UnknownTransformerError(GeonError, ValueError):
    """``make_transformer`` was given a name no transformer is registered under."""


class SerializationError(GeonError, ValueError):
    """A graph cannot be written as JSON, or a JSON text is not a graph geon can load
    (malformed, an unknown version or op type, a dangling reference ...)."""


class IndexOutOfRangeError(GeonError, IndexError):
    """An index tensor fed at call time holds an index outside the indexed axis."""


class TorchMissingError(GeonError, ImportError):
    """PyTorch is not installed (it is an optional dependency of geon)."""


class DistributedError(GeonError, RuntimeError):
    """A data-parallel job cannot run as asked (see :mod:`geon.distributed`)."""


class MPIUnavailableError(DistributedError, ImportError):
    """:mod:`geon.distributed` was imported without ``mpi4py`` (or without an MPI
    runtime it can load)."""
