"""Progress output for training: tqdm's bar when tqdm is installed and the stream is a
terminal, otherwise a plain bar (a redrawn line on a terminal, one line per epoch in a
log). Both show the rate in steps per second and the time left (ETA) of the task.
tqdm is optional (the ``examples`` extra installs it)."""

import sys
import time
from typing import IO, Any, Optional, Union


class Progress:
    """A minimal progress bar on a stream (stderr by default).

    On a terminal it redraws one line with ``'\\r'``; otherwise it prints one line per
    finished task (``done``), so logs stay readable. ``enabled=False`` prints nothing.
    """

    def __init__(self, stream: Optional[IO[str]] = None, enabled: bool = True,
                 width: int = 24) -> None:
        self.stream = sys.stderr if stream is None else stream
        self.enabled = enabled
        isatty = getattr(self.stream, "isatty", None)
        self.tty = bool(enabled and isatty is not None and isatty())
        self.width = width
        self._last = 0.0
        self._len = 0
        # (label, time, step) of the current task's first update
        self._start: Optional[tuple[str, float, int]] = None

    def update(self, label: str, step: int, total: int, info: str = "",
               rate: Optional[float] = None) -> None:
        """Redraw the bar (terminals only, at most ~20 times a second) with ``step`` of
        ``total``, ``info``, the rate (``rate`` steps per second if given, else measured
        from this task's first update) and the time left at that rate."""
        if not self.tty:
            return
        now = time.monotonic()
        if self._start is None or self._start[0] != label:
            self._start = (label, now, step)
        if rate is None:
            _, t0, s0 = self._start
            rate = (step - s0) / (now - t0) if step > s0 and now > t0 else None
        if step < total and now - self._last < 0.05:
            return
        self._last = now
        filled = int(self.width * step / total) if total else self.width
        bar = "#" * filled + "." * (self.width - filled)
        speed = "" if not rate else \
            f" | {rate:.1f} steps/s, ETA {clock(max(total - step, 0) / rate)}"
        self._write(f"{label} [{bar}] {step}/{total} {info}".rstrip() + speed)

    def done(self, line: str) -> None:
        """Finish the current task with ``line`` (kept on screen / in the log)."""
        self._start = None
        if not self.enabled:
            return
        if self.tty:
            self._write(line)
            self.stream.write("\n")
            self._len = 0
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def _write(self, text: str) -> None:
        pad = max(0, self._len - len(text))
        self.stream.write("\r" + text + " " * pad)
        self.stream.flush()
        self._len = len(text)


class TqdmProgress:
    """The same interface drawn by ``tqdm`` (one bar per task; tqdm measures the rate
    and the time left itself)."""

    def __init__(self, tqdm: Any, stream: IO[str]) -> None:
        self.tqdm, self.stream = tqdm, stream
        self.bar: Any = None  # the current task's tqdm bar

    def update(self, label: str, step: int, total: int, info: str = "",
               rate: Optional[float] = None) -> None:
        if self.bar is None:
            # initial: a resumed epoch starts part way; tqdm's rate counts from there.
            self.bar = self.tqdm(total=total, desc=label, file=self.stream, leave=False,
                                 unit="step", initial=max(step - 1, 0))
        self.bar.set_postfix_str(info, refresh=False)
        self.bar.update(step - self.bar.n)   # update (not n =): tqdm's rate follows it

    def done(self, line: str) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        self.stream.write(line + "\n")
        self.stream.flush()


def clock(seconds: float) -> str:
    """``m:ss`` (or ``h:mm:ss``) of a number of seconds, rounded up."""
    s = int(-(-seconds // 1)) if seconds == seconds and seconds < 1e9 else None
    if s is None:
        return "?"
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def make_progress(stream: Optional[IO[str]] = None, enabled: bool = True
                  ) -> Union[Progress, TqdmProgress]:
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
