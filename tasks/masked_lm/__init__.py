"""``masked-lm``: BERT-style masked bytes for an encoder; only the chosen positions are scored (bits per masked byte)."""

from __future__ import annotations

from search_spaces.tasks import declare

from ..stack import StackTask

NAME = "masked-lm"


class MaskedLMTask(StackTask):
    name = NAME
    doc = "BERT-style masked bytes for an encoder (bidirectional attention); the masked positions scored"
    form = "bidirectional"
    metric = "bits/masked byte"


TASK = declare(MaskedLMTask())
