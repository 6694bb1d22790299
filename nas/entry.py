"""The ``nas`` program's entry point (``nas`` and ``python -m nas``): what must be set before torch starts, then the
command line (:func:`nas.cli.main`).

OpenMP reads its wait policy once, when torch's runtime starts: by default a thread that reaches a barrier first
spins there before it sleeps, which is fast on an idle machine and ruinous beside another busy process (a training
step of many small operators fell to 2% of its quiet tokens/s beside a niced emulator, issue 56: the spinning
threads keep the core from the one they wait for).  ``OMP_WAIT_POLICY=PASSIVE`` makes them sleep at once.  It is set
here, before :mod:`nas.cli` imports torch, unless the user set it (``OMP_WAIT_POLICY=ACTIVE nas ...`` keeps spinning).
This module imports nothing heavy.
"""

from __future__ import annotations

import os
from typing import MutableMapping

WAIT_POLICY = "PASSIVE"


def prepare_environment(env: MutableMapping[str, str] = os.environ) -> None:
    """Set what torch's OpenMP runtime reads when it starts (the wait policy), keeping what the user set."""
    env.setdefault("OMP_WAIT_POLICY", WAIT_POLICY)


def main(argv: list[str] | None = None) -> int:
    prepare_environment()
    from .cli import main as cli_main  # imports torch: after the environment is set

    return cli_main(argv)
