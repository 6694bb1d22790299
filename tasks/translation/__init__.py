"""``seq2seq``: translation by an encoder-decoder (HAT's elastic space, arbitrary encoder-decoder attention and
``translate`` latency workload), trained on sentence pairs; the held-out score is cross-entropy per target byte.

The folder: :mod:`.space` (the space format, subnets, genes and the ``translate`` workload), ...
"""

from __future__ import annotations

from typing import Any

from search_spaces.tasks import declare

from ..base import Task
from .space import TASK as NAME
from .space import TRANSLATE, TranslateWorkload, describe_seq2seq, parse_seq2seq


class TranslationTask(Task):
    name = NAME
    doc = "translation by an encoder-decoder (bidirectional encoder, causal decoder with cross-attention)"
    metric = "nats/target byte"
    workload_kinds = (TRANSLATE,)
    commands = ("tasks.translation.command",)  # nas translate

    # ------------------------------------------------------------------ space

    def parse_space(self, data: dict, where: str, source: str) -> Any:
        return parse_seq2seq(data, where, source)

    def describe(self, space: Any) -> str:
        return describe_seq2seq(space)

    def workload_from_record(self, data: dict, where: str) -> Any:
        return TranslateWorkload.from_record(data, where)


TASK = declare(TranslationTask())
