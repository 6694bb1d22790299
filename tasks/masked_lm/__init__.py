"""``masked-lm``: BERT-style masked bytes for an encoder; only the chosen positions are scored (bits per masked byte)."""

from __future__ import annotations

from typing import Any

from search_spaces.tasks import declare

from ..base import Flag
from ..stack import StackTask

NAME = "masked-lm"


class MaskedLMTask(StackTask):
    name = NAME
    doc = "BERT-style masked bytes for an encoder (bidirectional attention); the masked positions scored"
    form = "bidirectional"
    metric = "bits/masked byte"
    learner_options = ("mask_rate",)
    flags = (Flag("--mask-rate", "mask_rate", float, "F", "masked-lm spaces: share of each window's positions chosen "
                  "(BERT-style 80/10/10) and scored, strictly between 0 and 1 (default 0.15)",
                  ("train-supernet", "train-subnet")),)

    @property
    def specials(self) -> dict[str, int]:
        """The byte that stands for a masked position (inside 0-255: it never occurs in UTF-8 text)."""
        from .masking import MASK_BYTE

        return {"MASK": MASK_BYTE}

    def learner(self, space: Any, seed: int = 0, mask_rate: float | None = None):
        """BERT-style masking of ``mask_rate`` of the positions (default 0.15)."""
        from .learner import DEFAULT_MASK_RATE, MaskedLM, MaskingSettings, check_mask_rate

        rate = check_mask_rate(DEFAULT_MASK_RATE if mask_rate is None else mask_rate)
        return MaskedLM(MaskingSettings(rate=rate), seed=seed)


TASK = declare(MaskedLMTask())
