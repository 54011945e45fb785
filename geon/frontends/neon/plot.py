"""Training curves: the per-epoch logs of :meth:`Model.fit` drawn with matplotlib.

matplotlib is optional (``pip install matplotlib``); it is imported when a plot is
made, never by ``import geon``. The figure is a ``matplotlib.figure.Figure`` made
without pyplot, so it needs no display and leaves pyplot's state alone; in a notebook
it shows as the cell's result.
"""

from typing import Any, Mapping, Optional, Sequence, Union
import os

from geon.errors import ArgumentError
from geon.op_graph.nodes import user_location

#: The metrics drawn, one panel each, with their validation counterparts.
PANELS = (("loss", "loss"), ("accuracy", "accuracy"))


def require_matplotlib(what: str) -> Any:
    """The ``matplotlib.figure.Figure`` class, or an ``ImportError`` saying that
    ``what`` needs matplotlib and how to install it."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError(f"{what} needs matplotlib, which is not installed: pip install "
                          f"matplotlib") from None
    return Figure


def plot_logs(logs: Sequence[Mapping[str, Any]],
              path: Union[str, os.PathLike[str], None] = None,
              title: Optional[str] = None, what: str = "plot") -> Any:
    """Draw the training curves of ``logs`` (one dict per epoch, as :meth:`Model.fit`
    makes them): one panel for the loss and one for the accuracy (where logged), each
    with the training values and, where logged, the validation ones (``val_...``), over
    the epoch number. Writes the figure to ``path`` if given (the format from its
    extension: ``.png``, ``.svg``, ``.pdf``) and returns it (a
    ``matplotlib.figure.Figure``)."""
    Figure = require_matplotlib(what)
    logs = [dict(e) for e in logs]
    if not logs:
        raise ArgumentError(f"{what}: there is nothing to plot: no epoch has been logged "
                            f"(at {user_location()})")
    epochs = [int(e.get("epoch", i + 1)) for i, e in enumerate(logs)]
    panels = [(key, label) for key, label in PANELS
              if any(key in e or f"val_{key}" in e for e in logs)]
    if not panels:
        raise ArgumentError(f"{what}: the logs hold no loss or accuracy to plot; their "
                            f"keys are {sorted(logs[0])} (at {user_location()})")
    fig = Figure(figsize=(4.2 * len(panels), 3.4), layout="constrained")
    marker = "o" if len(epochs) <= 30 else None
    for i, (key, label) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), i + 1)
        for name, style in ((key, "-"), (f"val_{key}", "--")):
            points = [(n, e[name]) for n, e in zip(epochs, logs) if name in e]
            if points:
                xs, ys = zip(*points)
                ax.plot(xs, ys, style, marker=marker, markersize=3,
                        label="validation" if name.startswith("val_") else "training")
        ax.set_xlabel("epoch")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        # integer epochs on the axis
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.legend(loc="best", frameon=False)
    if title:
        fig.suptitle(title)
    if path is not None:
        fig.savefig(os.fspath(path), dpi=100)
    return fig
