"""Progress of long work: whether to show it, and how.  Every long-running command reads this (a task's own commands
too, so it sits below the tasks): ``-q`` (the logging level of this project's loggers) and ``--no-progress`` (a
context variable, so that ``nas demo`` switches it off for the commands it runs in-process) hide it; where stderr is a
terminal a tqdm bar is redrawn in place, elsewhere (a file, a pipe, a cluster job's log) :class:`ProgressLines` writes
one line every ``$NAS_PROGRESS_INTERVAL`` seconds (30 by default), never a redrawn frame."""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import sys
import time
from collections.abc import Iterator

from search_spaces import UserError

_NO_PROGRESS = contextvars.ContextVar("nas_no_progress", default=False)  # --no-progress of the running command(s)


def show_progress() -> bool:
    """Whether progress is wanted: notes are shown (no ``-q``) and neither the running command nor one that runs it
    (``nas demo``) was given ``--no-progress``."""
    return not _NO_PROGRESS.get() and logging.getLogger("nas").isEnabledFor(logging.INFO)


@contextlib.contextmanager
def progress_off(off: bool) -> Iterator[None]:
    """``--no-progress`` while a command runs: it stays off for the commands it runs in-process (``nas demo``'s)."""
    token = _NO_PROGRESS.set(_NO_PROGRESS.get() or off)
    try:
        yield
    finally:
        _NO_PROGRESS.reset(token)


PROGRESS_INTERVAL_ENV = "NAS_PROGRESS_INTERVAL"  # seconds between progress lines in a log (default 30)
PROGRESS_INTERVAL_S = 30.0
progress_log = logging.getLogger("nas.progress")


def progress_interval() -> float:
    """Seconds between two progress lines in a log: ``$NAS_PROGRESS_INTERVAL``, else 30 (UserError: not a number >= 0)."""
    text = os.environ.get(PROGRESS_INTERVAL_ENV, "").strip()
    if not text:
        return PROGRESS_INTERVAL_S
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0 or seconds == float("inf"):
        raise UserError(f"{PROGRESS_INTERVAL_ENV}={text!r}: not a number of seconds >= 0 (the time between two progress "
                        "lines in a log; default 30)")
    return seconds


def format_time(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


def _amount(x: float, unit: str, scale: bool) -> str:
    """A count as a progress line shows it: ``1,234`` (a fraction of a second as such), or bytes scaled (``12.3 MB``)."""
    if scale:
        for prefix in ("", "k", "M", "G", "T"):
            if abs(x) < 1000 or prefix == "T":
                return f"{x:.0f} {prefix}{unit}" if not prefix else f"{x:.1f} {prefix}{unit}"
            x /= 1000
    return f"{x:,.0f}" if float(x).is_integer() or abs(x) >= 100 else f"{x:,.1f}"


def _rate(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}" if x >= 0.01 else f"{x:.2g}"


def progress_line(desc: str, n: float, total: float | None, unit: str, postfix: str, elapsed: float, rate: float | None,
                  scale: bool = False) -> str:
    """One line of progress: ``train-supernet: 120/1,000 step (12%), loss(L/S) 2.345 2.567 nats/byte, ..., 2.1 step/s,
    57 s elapsed, ETA 7m00s`` (rate and ETA left out until there is a rate; a bar over seconds has no rate)."""
    parts = [f"{_amount(n, unit, scale)}" + (f"/{_amount(total, unit, scale)}" if total else "")
             + ("" if scale else f" {unit}") + (f" ({100 * n / total:.0f}%)" if total else "")]
    if postfix:
        parts.append(postfix)
    left = None
    if unit == "s":
        left = (total - n) if total else None
    elif rate:
        parts.append(f"{_amount(rate, unit, scale)}/s" if scale else f"{_rate(rate)} {unit}/s")
        left = (total - n) / rate if total else None
    parts.append(f"{format_time(elapsed)} elapsed")
    if left is not None:
        parts.append(f"ETA {format_time(max(left, 0.0))}")
    return f"{desc}: " + ", ".join(parts)


class ProgressLines:
    """A progress bar for a log that is not a terminal (a file, a pipe, a cluster job's output): one line (a note on
    stderr) at the first update, then at most one per ``interval`` seconds, and the last at :meth:`close`; never a
    redrawn frame.  It takes the calls of the tqdm bars it stands in for: ``update``, ``set_postfix_str``, ``refresh``,
    ``close``, and the ``n`` and ``total`` fields set directly."""

    def __init__(self, total: float | None, desc: str, unit: str, initial: float = 0, interval: float = PROGRESS_INTERVAL_S,
                 scale: bool = False, clock=time.monotonic, say=None):
        self.total, self.n, self.desc, self.unit, self.scale = total, initial, desc, unit, scale
        self.interval, self.clock, self.say = interval, clock, say or progress_log.info
        self.postfix = ""
        self.start_n, self.start_t = initial, clock()
        self.said_t: float | None = None  # when the last line was written
        self.said_n: float | None = None  # at what count
        self.closed = False

    def update(self, k: float = 1) -> None:
        self.n += k
        self.refresh()

    def set_postfix_str(self, text: str = "", refresh: bool = True) -> None:
        self.postfix = text
        if refresh:
            self.refresh()

    def refresh(self) -> None:
        now = self.clock()
        if not self.closed and (self.said_t is None or now - self.said_t >= self.interval):
            self._say(now)

    def close(self) -> None:
        moved = self.said_t is not None or self.n != self.start_n  # a bar that never moved closes without a word
        if not self.closed and moved and self.said_n != self.n:  # the last count, unless the last line said it
            self._say(self.clock())
        self.closed = True

    def _say(self, now: float) -> None:
        elapsed = now - self.start_t
        done = self.n - self.start_n
        # no rate (nor ETA) in the first line: one step's time since the bar opened says little
        rate = done / elapsed if self.said_t is not None and elapsed > 0 and done > 0 else None
        self.say(progress_line(self.desc, self.n, self.total, self.unit, self.postfix, elapsed, rate, self.scale))
        self.said_t, self.said_n = now, self.n


def progress_bar(*, total: float | None, desc: str, unit: str, initial: float = 0, scale: bool = False, leave: bool = True,
                 bar_format: str | None = None):
    """A progress bar for a long loop: a tqdm bar redrawn in place where stderr is a terminal, :class:`ProgressLines`
    (a line every ``$NAS_PROGRESS_INTERVAL`` seconds, 30 by default) where it is a file or a pipe, nothing with ``-q`` or
    ``--no-progress`` (a disabled tqdm bar, which ignores every call)."""
    from tqdm import tqdm

    if not show_progress():
        return tqdm(total=total, initial=initial, disable=True)
    if not _is_terminal(sys.stderr):
        return ProgressLines(total, desc, unit, initial, progress_interval(), scale)
    return tqdm(total=total, initial=initial, desc=desc, unit=unit, unit_scale=scale, leave=leave, dynamic_ncols=True,
                bar_format=bar_format, file=sys.stderr)


def _is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a replaced stream without isatty, or a closed one
        return False
