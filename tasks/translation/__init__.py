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

    # ------------------------------------------------------------------ model

    def supernet(self, space: Any, generator: Any = None, **options: Any):
        from .model import Seq2SeqSuperTransformer

        assert not options, f"an encoder-decoder supernet takes no {', '.join(options)}"
        return Seq2SeqSuperTransformer(space, generator=generator)

    def scratch(self, space: Any, subnet: Any, generator: Any = None):
        from .model import Seq2SeqTransformer

        return Seq2SeqTransformer(space, subnet, generator=generator)

    # ------------------------------------------------------------------ training

    def learner(self, space: Any, seed: int = 0, **options: Any):
        from .train import TranslationLearner

        return TranslationLearner(space.max_seq_len)

    # ------------------------------------------------------------------ latency

    def check_timing(self, space: Any, device: str, precision: str | None = "fp32", for_transfer: bool = False) -> None:
        from .timing import require_device

        require_device(space, device, precision, for_transfer)

    def params(self, space: Any, subnet: Any) -> int:
        from .timing import seq2seq_params

        return seq2seq_params(space, subnet)

    def timing_model(self, space: Any, subnet: Any, *, materialize: bool = True):
        from .timing import seq2seq_timing_model

        return seq2seq_timing_model(space, subnet, materialize=materialize)

    def timing_reference(self, space: Any):
        from .timing import seq2seq_reference

        return seq2seq_reference(space)

    def table_features(self, space: Any, subnet: Any, workload: Any) -> dict[str, float]:
        from .timing import seq2seq_table_features

        return seq2seq_table_features(space, subnet, workload)

    def predictor_features(self, kind: str, space: Any, workload: Any, subnets: Any) -> tuple:
        from .timing import seq2seq_matrix

        return seq2seq_matrix(kind, space, workload, subnets)

    def bundle_models(self, space: Any, seed: int) -> tuple:
        """Meta-device models: the graphs are exported from seeded weights, then stripped."""
        return (lambda s: self.timing_model(space, s, materialize=False)), self.timing_model(space, space.smallest(),
                                                                                             materialize=False)

    def torch_call(self, model: Any, workload: Any, device: str = "cpu", runtime: str = "eager"):
        from .timing import translate_call

        return translate_call(model, workload, runtime)

    def ort_runner(self, model: Any, workload: Any, threads: int | None, provider: str, clock: str, precision: str):
        from .timing import translate_ort_runner_of

        return translate_ort_runner_of(model, workload, threads, provider, clock, precision)

    def bundle_graphs(self, model: Any) -> tuple[dict, dict]:
        from .timing import bundle_graphs

        return bundle_graphs(model)


TASK = declare(TranslationTask())
