"""Whether to draw progress: the one switch every long-running command reads (a task's own commands too), set by the
command line's ``-q`` through the logging level of this project's loggers."""

from __future__ import annotations

import logging


def show_progress() -> bool:
    """Whether progress bars are wanted: notes are shown (no ``-q``)."""
    return logging.getLogger("nas").isEnabledFor(logging.INFO)
