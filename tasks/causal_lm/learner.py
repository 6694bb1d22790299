"""The causal LM's learner: next-byte prediction, every position scored (:class:`supernet.task.NextToken`); with a
memory (a space's ``memory: M``, :mod:`supernet.memory`) every window's first ``M`` tokens are the memory of the
segment after them: not scored (in training, in the training log's held-out score and in the search's fitness)."""

from __future__ import annotations

from typing import Any

import numpy as np
from torch import Tensor

from search_spaces import UserError
from supernet.heldout import IGNORE, HeldOut
from supernet.task import NextToken, scored_kl, scored_loss

CAUSAL_LM = NextToken()


def unscored_memory(targets: Tensor, memory: int) -> Tensor:
    """``targets`` (B, T) with the first ``memory`` positions :data:`IGNORE` (the memory predicts nothing scored)."""
    out = targets.clone()
    out[:, :memory] = IGNORE
    return out


class MemoryNextToken(NextToken):
    """Next-byte prediction over windows whose first ``memory`` tokens are the previous segment's (see the module doc);
    a window must hold more than the memory (``--seq-len``)."""

    def __init__(self, memory: int):
        self.memory = memory

    def _check(self, seq_len: int) -> None:
        if seq_len <= self.memory:
            raise UserError(f"--seq-len: {seq_len} tokens leave no segment after the memory of {self.memory} tokens "
                            f"(the space's memory); give more than {self.memory}")

    def batch(self, tokens: np.ndarray, starts: np.ndarray, rows: slice, seq_len: int, step: int) -> tuple[Tensor, Tensor]:
        self._check(seq_len)
        x, y = super().batch(tokens, starts, rows, seq_len, step)
        return x, unscored_memory(y, self.memory)

    def heldout(self, tokens: np.ndarray, starts: np.ndarray, seq_len: int, token_lengths: np.ndarray | None = None) -> HeldOut:
        self._check(seq_len)
        return HeldOut(tokens, starts, seq_len, transform=lambda x, y: (x, unscored_memory(y, self.memory)),
                       token_lengths=token_lengths)

    def loss(self, logits: Tensor, targets: Tensor, per: float | None = None) -> Tensor:
        assert per is None, "windows of equal length: every rank's mean"
        return scored_loss(logits, targets)

    def kl(self, student: Tensor, teacher: Tensor, targets: Tensor, per: float | None = None) -> Tensor:
        return scored_kl(student, teacher, targets)

    def to_dict(self) -> dict[str, Any]:
        return {"memory": self.memory}


def causal_learner(memory: int):
    """The learner of a causal-lm space: every position scored, or the segment after a memory of ``memory`` tokens."""
    return MemoryNextToken(memory) if memory else CAUSAL_LM


__all__ = ["CAUSAL_LM", "MemoryNextToken", "causal_learner", "unscored_memory"]
