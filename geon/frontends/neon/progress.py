"""Progress output for training: tqdm's bar when tqdm is installed and the stream is a
terminal, otherwise a plain bar (a redrawn line on a terminal, one line per epoch in a
log)."""

import sys
import time


class Progress:
    """A minimal progress bar on a stream (stderr by default).

    On a terminal it redraws one line with ``'\\r'``; otherwise it prints one line per
    finished task (``done``), so logs stay readable. ``enabled=False`` prints nothing.
    """

    def __init__(self, stream=None, enabled=True, width=24):
        self.stream = sys.stderr if stream is None else stream
        self.enabled = enabled
        isatty = getattr(self.stream, "isatty", None)
        self.tty = bool(enabled and isatty is not None and isatty())
        self.width = width
        self._last = 0.0
        self._len = 0

    def update(self, label, step, total, info=""):
        """Redraw the bar (terminals only, at most ~20 times a second)."""
        if not self.tty:
            return
        now = time.monotonic()
        if step < total and now - self._last < 0.05:
            return
        self._last = now
        filled = int(self.width * step / total) if total else self.width
        bar = "#" * filled + "." * (self.width - filled)
        self._write(f"{label} [{bar}] {step}/{total} {info}")

    def done(self, line):
        """Finish the current task with ``line`` (kept on screen / in the log)."""
        if not self.enabled:
            return
        if self.tty:
            self._write(line)
            self.stream.write("\n")
            self._len = 0
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def _write(self, text):
        pad = max(0, self._len - len(text))
        self.stream.write("\r" + text + " " * pad)
        self.stream.flush()
        self._len = len(text)


class TqdmProgress:
    """The same interface drawn by ``tqdm`` (one bar per task)."""

    def __init__(self, tqdm, stream):
        self.tqdm, self.stream, self.bar = tqdm, stream, None

    def update(self, label, step, total, info=""):
        if self.bar is None:
            self.bar = self.tqdm(total=total, desc=label, file=self.stream, leave=False)
        self.bar.n = step
        self.bar.set_postfix_str(info, refresh=False)
        self.bar.refresh()

    def done(self, line):
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        self.stream.write(line + "\n")
        self.stream.flush()


def make_progress(stream=None, enabled=True):
    """A ``TqdmProgress`` if tqdm is importable and ``stream`` (default stderr)
    is a terminal, else a :class:`Progress`."""
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    if enabled and isatty is not None and isatty():
        try:
            from tqdm import tqdm
        except ImportError:
            pass
        else:
            return TqdmProgress(tqdm, stream)
    return Progress(stream, enabled)
