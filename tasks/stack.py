"""Tasks whose model is one stack of blocks over a sequence: the :class:`~supernet.SuperTransformer` and the
static :class:`~supernet.Transformer` (``causal-lm``, ``masked-lm``, and the classification tasks to come).

:class:`StackTask` gives every method of :class:`~tasks.base.Task` for that model: the one-stack space format
(:func:`search_spaces.space.parse_stack`, with the attention ``form`` the task's model runs), the elastic
model and extraction, the latency parts of a one-stack model (prefill and decode workloads), and export.  A
task of this family says what differs: its ``form``, its ``learner`` (batches, loss, held-out score), its data.
"""

from __future__ import annotations

from typing import Any

from search_spaces.space import describe_stack, parse_stack

from .base import Task


class StackTask(Task):
    """A task whose model is one stack of blocks (see the module doc)."""

    form: str = "causal"  # the attention form of its model: "causal" (a decoder) or "bidirectional" (an encoder)

    # ------------------------------------------------------------------ space

    def parse_space(self, data: dict, where: str, source: str) -> Any:
        return parse_stack(data, where, source, form=self.form)

    def describe(self, space: Any) -> str:
        return describe_stack(space)
