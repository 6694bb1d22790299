"""``cpu``: the static model in torch eager mode on the CPU, ``threads`` intra-op threads,
timed by the wall clock or (``clock="cpu"``, one thread) by the thread's CPU time."""

from __future__ import annotations

import torch

from search_spaces import UserError, Workload

from ..device import host_fingerprint
from ..timing_core import CLOCKS, Runner, check_clock


def workload_tokens(model, workload: Workload, device: str = "cpu") -> torch.Tensor:
    """Fixed token ids (batch, seq) for timing; the values do not matter, the shape does."""
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, model.config.vocab_size, (workload.batch_size, workload.seq_len), generator=g)  # (B, T)
    return tokens.to(device)


class CPU:
    name = "cpu"

    def __init__(self, threads: int | None = None, clock: str = "wall"):
        if threads is not None and threads < 1:
            raise UserError(f"--threads: {threads} is not a positive integer")
        self.threads = threads or torch.get_num_threads()
        try:
            check_clock(clock, self.threads)
        except ValueError as e:
            raise UserError(str(e)) from None
        self.clock = clock
        torch.set_num_threads(self.threads)  # process-wide: this process times one device

    def fingerprint(self) -> dict:
        return {**host_fingerprint(), "device": "cpu", "runtime": "torch-eager", "torch": torch.__version__, "threads": self.threads, "clock": self.clock}

    def prepare(self, model, workload: Workload) -> Runner:
        model = model.eval()
        tokens = workload_tokens(model, workload)
        now = CLOCKS[self.clock]

        @torch.inference_mode()
        def run(n: int) -> float:
            start = now()
            for _ in range(n):
                model(tokens)
            return now() - start

        return run


DEVICE = CPU
