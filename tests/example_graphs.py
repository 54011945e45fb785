"""The digits example's graphs, recorded instead of compiled (shared by tests)."""

import pytest

import geon as be
from geon.examples import digits


class _Recorder:
    """Stands in for the transformer: keeps what each ``computation`` call was given."""

    def __init__(self):
        self.calls = []

    def computation(self, results, *params):
        self.calls.append((results, params))


def digits_graphs(batch_size, n_test, hidden=16):
    """``[(results, params)]`` of every computation the digits example builds."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(be, "NumPyTransformer", _Recorder)
        args = digits.parse_args(["--hidden", str(hidden), "--batch-size", str(batch_size)])
        rec, *_ = digits.build(args, 64, n_test)
    return rec.calls
