"""Data-parallel plumbing: who am I (rank, world), and agreeing on small facts across ranks.

``torchrun`` sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``;
:func:`init_from_env` joins the process group (NCCL on CUDA, gloo on CPU).  A single
process needs none of it and gets :data:`SINGLE`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import torch
import torch.distributed as dist

from search_spaces import UserError


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world > 1

    def agree(self, stop: bool, elapsed: float, device: torch.device) -> tuple[bool, float]:
        """Stop if any rank wants to; use the largest elapsed time (so every rank computes the same lr)."""
        if not self.enabled:
            return stop, elapsed
        t = torch.tensor([float(stop), elapsed], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t[0].item()), float(t[1].item())

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()


SINGLE = Dist()


def init_from_env(device: str) -> tuple[Dist, torch.device]:
    """Join the process group ``torchrun`` describes (if any) and pick this rank's device.

    ``device`` is ``auto`` (CUDA when available), ``cpu``, ``cuda`` or ``cuda:N`` (one process: that GPU; under
    ``torchrun`` each rank takes its local GPU).
    """
    if device not in ("auto", "cpu", "cuda") and not re.fullmatch(r"cuda:\d+", str(device)):
        raise UserError(f"--device: {device!r} is not one of auto, cpu, cuda, cuda:N")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"--device {device}: this torch build sees no CUDA device")
    if device.startswith("cuda:") and int(device.split(":")[1]) >= torch.cuda.device_count():
        raise UserError(f"--device {device}: torch sees {torch.cuda.device_count()} CUDA device(s) (cuda:0 to "
                        f"cuda:{torch.cuda.device_count() - 1})")
    use_cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return SINGLE, torch.device(device if device.startswith("cuda:") else "cuda" if use_cuda else "cpu")
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if use_cuda:
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    return Dist(rank, world, local_rank), torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
