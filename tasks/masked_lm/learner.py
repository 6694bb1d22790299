"""The masked LM's learner: BERT-style masking (:mod:`.masking`); only the chosen positions are scored.

Cross-entropy and distillation alike are over the chosen positions; held-out windows carry fixed masks, a
function of the seed only, so every subnet sees the same masks; the metric is bits per masked byte.  Every
random choice comes from a generator seeded by ``(seed, stream, step)``: step ``k`` draws the same masks on
every rank and after any resume (the masks of a global batch are drawn whole, each rank takes its rows).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from supernet.data import windows
from supernet.heldout import HeldOut
from supernet.task import WindowLearner, scored_kl, scored_loss

from .masking import MaskingSettings, apply_mask, draw_mask

# Streams of the task's generators: default_rng([seed, stream, step]) (the trainer's own streams are 0, 1, 2).
MASK_STREAM, EVAL_MASK_STREAM = 3, 4
NAME = "masked-lm"


def _torch_seed(*key: int) -> int:
    return int(np.random.default_rng(list(key)).integers(2**62))


@dataclass(frozen=True)
class MaskedLM(WindowLearner):
    """BERT-style masked-LM over bytes: the inputs are the windows with ``masking.rate`` of their positions
    corrupted (80% mask byte, 10% random, 10% kept), the targets the original bytes at those positions."""

    masking: MaskingSettings = field(default_factory=MaskingSettings)
    seed: int = 0
    name: str = NAME
    metric: str = "bits/masked byte"

    def batch(self, tokens: np.ndarray, starts: np.ndarray, rows: slice, seq_len: int, step: int) -> tuple[Tensor, Tensor]:
        x, _ = windows(tokens, starts[rows], seq_len)  # (b, T): an encoder reads the window itself
        g = torch.Generator().manual_seed(_torch_seed(self.seed, MASK_STREAM, step))
        mask = draw_mask((len(starts), seq_len), self.masking, g).rows(rows)  # the global batch's masks, this rank's rows
        return apply_mask(torch.from_numpy(x), mask, self.masking.mask_byte)

    def loss(self, logits: Tensor, targets: Tensor, per: float | None = None) -> Tensor:
        assert per is None, "windows of equal length: every rank's mean"
        return scored_loss(logits, targets)

    def kl(self, student: Tensor, teacher: Tensor, targets: Tensor, per: float | None = None) -> Tensor:
        return scored_kl(student, teacher, targets)  # over the chosen positions

    def heldout(self, tokens: np.ndarray, starts: np.ndarray, seq_len: int, token_lengths: np.ndarray | None = None) -> HeldOut:
        assert token_lengths is None, "a masked LM reads bytes (its space refuses a subword vocabulary)"
        g = torch.Generator().manual_seed(_torch_seed(self.seed, EVAL_MASK_STREAM))
        settings = self.masking

        def masked(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
            return apply_mask(x, draw_mask(tuple(x.shape), settings, g), settings.mask_byte)

        return HeldOut(tokens, starts, seq_len, transform=masked)

    def to_dict(self) -> dict[str, Any]:
        return {"task": self.name, "mask_rate": self.masking.rate, "metric": self.metric}


DEFAULT_MASK_RATE = MaskingSettings.rate


def check_mask_rate(rate: float) -> float:
    """``--mask-rate``, checked: a fraction strictly between 0 and 1."""
    from search_spaces import UserError

    if not 0.0 < rate < 1.0:  # NaN fails too
        raise UserError(f"--mask-rate: {rate} is not a fraction strictly between 0 and 1 (BERT uses 0.15)")
    return rate
