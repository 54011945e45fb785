"""The digits example's graphs, recorded instead of compiled (shared by tests)."""

from geon.examples import digits


class _Recorder:
    """Stands in for the transformer: keeps what each ``computation`` call was given."""

    def __init__(self):
        self.calls = []

    def computation(self, results, *params):
        self.calls.append((results, params))


def digits_graphs(batch_size, n_test, hidden=16):
    """``[(results, params)]`` of the computations the digits example's model builds:
    the evaluation of ``n_test`` images (per-image loss and correctness), the step
    counter's value and the training step, in that order (the readers first)."""
    rec = _Recorder()
    hp = dict(digits.HYPERPARAMETERS, hidden=hidden, batch_size=batch_size)
    model = digits.build_model(hp, 64, rec)
    model.eval_batch_size = n_test
    model._eval_computation()       # built on first use
    train, step, evaluate = rec.calls
    return [evaluate, step, train]
