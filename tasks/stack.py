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

    # ------------------------------------------------------------------ model

    def supernet(self, space: Any, generator: Any = None, **options: Any):
        from supernet import SuperTransformer

        return SuperTransformer(space, generator=generator, **options)

    def scratch(self, space: Any, subnet: Any, generator: Any = None):
        from supernet import Transformer, TransformerConfig

        return Transformer(TransformerConfig.from_subnet(space, space.check(subnet)), generator=generator)

    # ------------------------------------------------------------------ latency

    def params(self, space: Any, subnet: Any) -> int:
        from latency.features import params

        return params(space, subnet)

    def timing_model(self, space: Any, subnet: Any, *, materialize: bool = True):
        from latency.protocol import timing_model

        return timing_model(space, subnet, materialize=materialize)

    def timing_reference(self, space: Any):
        from latency.protocol import reference_model, timing_model

        return reference_model(timing_model(space, space.smallest(), materialize=False).config)

    def table_features(self, space: Any, subnet: Any, workload: Any) -> dict[str, float]:
        from latency.features import table_features

        return table_features(space, subnet, workload)

    def predictor_features(self, kind: str, space: Any, workload: Any, subnets: Any) -> tuple:
        from latency.features import stack_matrix

        return stack_matrix(kind, space, workload, subnets)

    def bundle_models(self, space: Any, seed: int) -> tuple:
        """(subnet -> the static model a latency bundle exports, the reference model): extracted from a seeded
        supernet (the bundle's graphs carry real initial weights)."""
        import torch

        from latency.protocol import reference_model
        from supernet import SuperTransformer

        supernet = SuperTransformer(space, generator=torch.Generator().manual_seed(seed)).eval()
        return supernet.extract, reference_model(supernet.extract(space.smallest()).config)
