"""What the benchmark scripts share beside their curves (:mod:`curves`): one documented ``nas`` command run in the
benchmark's own process, its report kept in a log.

A script imports it as ``from _bench_common import run_nas`` after putting the repository and ``scripts/`` on
``sys.path`` (as for ``curves``); nothing of the packages imports it (``tests/test_import_graph.py``).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from nas.cli import main as nas


def run_nas(argv: list[str], log: Path, prog: str) -> None:
    """``nas ARGV`` in this process, its report appended to ``log`` after the command line; a refusal stops the
    benchmark ``prog`` in one line that names the command, its exit status and the log."""
    with open(log, "a") as f, contextlib.redirect_stdout(f):
        print(f"$ nas {' '.join(argv)}")
        rc = nas(argv)
    if rc != 0:
        raise SystemExit(f"{prog}: `nas {' '.join(argv)}` exited {rc} (its report: {log})")
