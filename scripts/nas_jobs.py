"""Running ``nas`` command lines from a benchmark, several at a time: each training on one thread, so ``jobs`` of them
use ``jobs`` cores (two one-thread trainings side by side do about twice the work of one two-thread training on the
2-core machines the benchmarks are sized for).  Shared by the benchmarks that retrain many models."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_nas(argvs: list[list[str]], jobs: int) -> None:
    """Each ``nas`` command line, ``jobs`` at a time: in this process when one at a time, else each in its own
    ``python -m nas``; a failure names its command in one line (``search_spaces.UserError``)."""
    from nas.cli import main as nas
    from search_spaces import UserError

    def one(argv: list[str]) -> int:
        if jobs == 1:
            return nas(argv)
        return subprocess.run([sys.executable, "-m", "nas", *argv], cwd=ROOT).returncode

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for argv, rc in zip(argvs, pool.map(one, argvs)):
            if rc != 0:
                raise UserError(f"`nas {' '.join(argv)}` failed; fix the cause above and run again to resume")
