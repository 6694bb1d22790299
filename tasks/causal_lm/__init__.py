"""``causal-lm``: next-byte prediction by a decoder; every position is scored (bits per byte)."""

from __future__ import annotations

from search_spaces.tasks import declare

from ..stack import StackTask

NAME = "causal-lm"


class CausalLMTask(StackTask):
    name = NAME
    doc = "next-byte prediction by a decoder (causal attention); every position scored"
    form = "causal"
    metric = "bits/byte"


TASK = declare(CausalLMTask())
