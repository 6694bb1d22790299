"""BERT-style masking for the masked-LM task (an encoder over bytes), and its metric.

:func:`mask_tokens` chooses ``rate`` of the positions of each sequence (exactly ``round(rate * T)``,
at least one), then replaces a chosen byte by :data:`MASK_BYTE` with probability ``replace``,
by a uniformly random byte with probability ``random``, and keeps it otherwise (BERT: 15% chosen;
80% masked, 10% random, 10% kept).  The targets are the original bytes at the chosen positions and
:data:`IGNORE` elsewhere: the loss (:func:`masked_loss`) is on the chosen positions only, reported
as bits per masked byte (:func:`bits_per_masked_byte`).  Every draw comes from the generator passed in.

:class:`tasks.masked_lm.learner.MaskedLM` draws the masks of a training step (a generator seeded per step) and of
the held-out windows (seeded by the run's seed only) with :func:`draw_mask`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from supernet.heldout import IGNORE  # a target that is not scored (torch's cross-entropy ignore_index)

MASK_BYTE = 0xFF  # never occurs in UTF-8 text (the corpus's NUL, 0, separates documents)


@dataclass(frozen=True)
class MaskingSettings:
    rate: float = 0.15  # fraction of positions chosen per sequence
    replace: float = 0.8  # of the chosen: replaced by mask_byte
    random: float = 0.1  # of the chosen: replaced by a uniformly random byte (the rest are kept)
    mask_byte: int = MASK_BYTE
    vocab_size: int = 256

    def __post_init__(self) -> None:
        if not 0.0 < self.rate < 1.0:
            raise ValueError(f"mask rate {self.rate}: expected a fraction strictly between 0 and 1")
        if self.replace < 0 or self.random < 0 or self.replace + self.random > 1:
            raise ValueError(
                f"mask replace {self.replace} and random {self.random}: expected non-negative fractions summing to at most 1"
            )
        if not 0 <= self.mask_byte < self.vocab_size:
            raise ValueError(f"mask byte {self.mask_byte}: expected an id in 0..{self.vocab_size - 1}")


class Mask(NamedTuple):
    """Where and how a batch of shape (B, T) is corrupted: each field (B, T)."""

    chosen: Tensor  # bool: scored positions
    masked: Tensor  # bool: chosen and replaced by the mask byte
    randomised: Tensor  # bool: chosen and replaced by ``noise``
    noise: Tensor  # random byte ids

    def rows(self, rows: slice) -> "Mask":
        """The mask of rows ``rows`` (a rank's share of a global batch)."""
        return Mask(*(field[rows] for field in self))

    def to(self, device: torch.device) -> "Mask":
        return Mask(*(field.to(device) for field in self))


def draw_mask(
    shape: tuple[int, int], settings: MaskingSettings, generator: torch.Generator, device: torch.device | None = None,
    dtype: torch.dtype = torch.long,
) -> Mask:
    """Draw the masks of a (B, T) batch; they depend on the shape, the settings and the generator only."""
    b, t = shape
    n = max(1, round(settings.rate * t))
    order = torch.rand(b, t, generator=generator, device=device).argsort(dim=1)  # a random permutation per row
    chosen = torch.zeros(b, t, dtype=torch.bool, device=device).scatter_(1, order[:, :n], True)  # (B, T)
    u = torch.rand(b, t, generator=generator, device=device)  # which corruption, per position
    noise = torch.randint(0, settings.vocab_size, (b, t), generator=generator, device=device, dtype=dtype)
    masked = chosen & (u < settings.replace)
    randomised = chosen & (u >= settings.replace) & (u < settings.replace + settings.random)
    return Mask(chosen, masked, randomised, noise)


def apply_mask(idx: Tensor, mask: Mask, mask_byte: int = MASK_BYTE) -> tuple[Tensor, Tensor]:
    """idx (B, T) byte ids -> (inputs (B, T) with the chosen positions corrupted, targets (B, T): the
    original byte where chosen, :data:`IGNORE` elsewhere)."""
    noise = mask.noise.to(idx.dtype)
    inputs = torch.where(mask.masked, torch.full_like(idx, mask_byte), torch.where(mask.randomised, noise, idx))
    targets = torch.where(mask.chosen, idx, torch.full_like(idx, IGNORE))
    return inputs, targets


def mask_tokens(idx: Tensor, settings: MaskingSettings, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """idx (B, T) byte ids -> (inputs, targets) of :func:`apply_mask`, the masks drawn from ``generator``."""
    mask = draw_mask(tuple(idx.shape), settings, generator, idx.device, idx.dtype)
    return apply_mask(idx, mask, settings.mask_byte)


def masked_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean cross-entropy (nats) over the chosen positions: logits (B, T, V), targets (B, T) with :data:`IGNORE`."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE)


def bits_per_masked_byte(logits: Tensor, targets: Tensor) -> float:
    """The task's metric: :func:`masked_loss` in bits."""
    return float(masked_loss(logits, targets)) / math.log(2)
