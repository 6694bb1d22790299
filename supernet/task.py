"""Tasks: what a training step feeds the model, what its loss scores, and how held-out text is scored.

The trainer (:mod:`supernet.train`), the search's fitness (:class:`nas.search.fitness.InheritedLoss`) and the
export card see the task through this one small interface, so a new task (seq2seq, ...) is one class here
(and a name in :func:`task_for`), not branches through the training loop.  Call order per training step:
``batch(tokens, starts, rows, seq_len, step)`` -> the model runs on ``inputs`` -> ``loss(logits, targets)`` for the
cross-entropy and, for the smaller subnets of the sandwich rule, ``kl(student, teacher, targets)``.

* :class:`CausalLM` (``task: causal-lm``): next-byte prediction; every position is scored.
* :class:`MaskedLM` (``task: masked-lm``): BERT-style masking (:mod:`supernet.masking`); only the chosen
  positions are scored (cross-entropy and distillation alike); held-out windows carry fixed masks, a
  function of the seed only, so every subnet sees the same masks; the metric is bits per masked byte.

Every random choice comes from a generator seeded by ``(seed, stream, step)``: step ``k`` draws the same masks
on every rank and after any resume (the masks of a global batch are drawn whole, each rank takes its rows).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from search_spaces import Space, UserError

from .data import windows
from .heldout import HeldOut
from .masking import IGNORE, MaskingSettings, apply_mask, draw_mask

# Streams of the task's generators: default_rng([seed, stream, step]) (the trainer's own streams are 0, 1, 2).
MASK_STREAM, EVAL_MASK_STREAM = 3, 4


class Task(Protocol):
    """What is learned: batches, losses and held-out scoring.  ``to_dict()`` is stored with the objective
    (empty for the causal task, so checkpoints of earlier versions read the same)."""

    name: str
    metric: str  # what held-out bits are per: "bits/byte", "bits/masked byte"

    def batch(self, tokens: np.ndarray, starts: np.ndarray, rows: slice, seq_len: int, step: int) -> tuple[Tensor, Tensor]:
        """Rows ``rows`` of the global batch of windows at ``starts`` (the whole step's): (inputs, targets) (b, T) on the CPU."""
        ...

    def loss(self, logits: Tensor, targets: Tensor) -> Tensor:
        """Mean cross-entropy (nats) over the scored positions: logits (B, T, V), targets (B, T)."""
        ...

    def kl(self, student: Tensor, teacher: Tensor, targets: Tensor) -> Tensor:
        """KL(teacher || student) per scored position: log-probabilities (B, T, V) each."""
        ...

    def heldout(self, tokens: np.ndarray, starts: np.ndarray, seq_len: int) -> HeldOut:
        """Fixed held-out windows (and their fixed masks) at ``starts``."""
        ...

    def to_dict(self) -> dict[str, Any]: ...


def _kl(student: Tensor, teacher: Tensor) -> Tensor:
    return F.kl_div(student, teacher, log_target=True, reduction="batchmean")  # (N, V) each: mean over the N rows


@dataclass(frozen=True)
class CausalLM:
    """Next-byte prediction: targets are the inputs shifted by one; every position is scored."""

    name: str = "causal-lm"
    metric: str = "bits/byte"

    def batch(self, tokens: np.ndarray, starts: np.ndarray, rows: slice, seq_len: int, step: int) -> tuple[Tensor, Tensor]:
        x, y = windows(tokens, starts[rows], seq_len)  # (b, T) each
        return torch.from_numpy(x), torch.from_numpy(y)

    def loss(self, logits: Tensor, targets: Tensor) -> Tensor:
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())  # mean over B*T, nats

    def kl(self, student: Tensor, teacher: Tensor, targets: Tensor) -> Tensor:
        return _kl(student.flatten(0, 1), teacher.flatten(0, 1))

    def heldout(self, tokens: np.ndarray, starts: np.ndarray, seq_len: int) -> HeldOut:
        return HeldOut(tokens, starts, seq_len)

    def to_dict(self) -> dict[str, Any]:
        return {}


def _torch_seed(*key: int) -> int:
    return int(np.random.default_rng(list(key)).integers(2**62))


@dataclass(frozen=True)
class MaskedLM:
    """BERT-style masked-LM over bytes: the inputs are the windows with ``masking.rate`` of their positions
    corrupted (80% mask byte, 10% random, 10% kept), the targets the original bytes at those positions."""

    masking: MaskingSettings = field(default_factory=MaskingSettings)
    seed: int = 0
    name: str = "masked-lm"
    metric: str = "bits/masked byte"

    def batch(self, tokens: np.ndarray, starts: np.ndarray, rows: slice, seq_len: int, step: int) -> tuple[Tensor, Tensor]:
        x, _ = windows(tokens, starts[rows], seq_len)  # (b, T): an encoder reads the window itself
        g = torch.Generator().manual_seed(_torch_seed(self.seed, MASK_STREAM, step))
        mask = draw_mask((len(starts), seq_len), self.masking, g).rows(rows)  # the global batch's masks, this rank's rows
        return apply_mask(torch.from_numpy(x), mask, self.masking.mask_byte)

    def loss(self, logits: Tensor, targets: Tensor) -> Tensor:
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=IGNORE)

    def kl(self, student: Tensor, teacher: Tensor, targets: Tensor) -> Tensor:
        chosen = targets.flatten() != IGNORE  # (B*T,)
        return _kl(student.flatten(0, 1)[chosen], teacher.flatten(0, 1)[chosen])

    def heldout(self, tokens: np.ndarray, starts: np.ndarray, seq_len: int) -> HeldOut:
        g = torch.Generator().manual_seed(_torch_seed(self.seed, EVAL_MASK_STREAM))
        return HeldOut(tokens, starts, seq_len, masks=(self.masking, g))

    def to_dict(self) -> dict[str, Any]:
        return {"task": self.name, "mask_rate": self.masking.rate, "metric": self.metric}


CAUSAL_LM = CausalLM()
DEFAULT_MASK_RATE = MaskingSettings.rate


def check_mask_rate(rate: float) -> float:
    """``--mask-rate``, checked: a fraction strictly between 0 and 1."""
    if not 0.0 < rate < 1.0:  # NaN fails too
        raise UserError(f"--mask-rate: {rate} is not a fraction strictly between 0 and 1 (BERT uses 0.15)")
    return rate


def trained_mask_rate(meta: dict[str, Any]) -> float | None:
    """The mask rate a supernet checkpoint (its ``meta``) was trained with; None for a causal-lm run."""
    return (meta.get("objective") or {}).get("mask_rate")


def task_for(space: Space, *, seed: int = 0, mask_rate: float | None = None) -> Task:
    """The task of ``space`` (its ``task:`` field); ``mask_rate`` (default 0.15) only for a masked-LM space."""
    if space.task == "masked-lm":
        rate = check_mask_rate(DEFAULT_MASK_RATE if mask_rate is None else mask_rate)
        return MaskedLM(MaskingSettings(rate=rate), seed=seed)
    if mask_rate is not None:
        raise UserError(f"--mask-rate: only for a masked-lm space; {space.source} is task {space.task}")
    assert space.task == "causal-lm", space.task
    return CAUSAL_LM
