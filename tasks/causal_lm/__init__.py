"""``causal-lm``: next-byte prediction by a decoder; every position is scored (bits per byte), or with a memory
(``memory:`` in the space, :mod:`supernet.memory`) every position after the window's memory."""

from __future__ import annotations

from typing import Any

from search_spaces.tasks import declare

from ..stack import StackTask

NAME = "causal-lm"


class CausalLMTask(StackTask):
    name = NAME
    doc = "next-byte prediction by a decoder (causal attention); every position scored"
    form = "causal"
    metric = "bits/byte"
    subword = True  # tokenizer: {bpe: ...} (supernet.tokenizer); its score stays bits per byte of text

    def learner(self, space: Any, seed: int = 0, **options: Any):
        from .learner import causal_learner

        return causal_learner(getattr(space, "memory", 0))


TASK = declare(CausalLMTask())
