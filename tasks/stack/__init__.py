"""Tasks whose model is one stack of blocks over a sequence: the :class:`~supernet.SuperTransformer` and the
static :class:`~supernet.Transformer` (the decoder and the encoder byte LMs, and the classification tasks to come).

:class:`StackTask` gives every method of :class:`~tasks.base.Task` for that model: the one-stack space format
(:func:`search_spaces.space.parse_stack`, with the attention ``form`` the task's model runs), the elastic
model and extraction, the latency parts of a one-stack model (prefill and decode workloads), and export.  A
task of this family says what differs: its ``form``, its ``learner`` (batches, loss, held-out score), its data.
"""

from __future__ import annotations

from typing import Any

import torch

from latency.features import params, stack_matrix, table_features
from latency.protocol import reference_model, timing_model
from search_spaces.space import describe_stack, parse_stack, tokenizer_spec
from supernet import SuperTransformer, Transformer, TransformerConfig, load_model
from supernet.artifact import open_export
from supernet.data import check_corpus, prepare_corpus
from supernet.tokenizer import tokenize_corpus
from supernet.scoring import inherited_fitness

from ..base import Task
from .export import export_stack, stack_validation
from .train import train_subnet


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
        return SuperTransformer(space, generator=generator, **options)

    def scratch(self, space: Any, subnet: Any, generator: Any = None):
        return Transformer(TransformerConfig.from_subnet(space, space.check(subnet)), generator=generator)

    # ------------------------------------------------------------------ data: a byte corpus (supernet.data)

    data_keys = ("data", "data_seed", "val_fraction")
    data_defaults = {"data": None, "data_seed": 0, "val_fraction": 0.05}

    def prepare_data(self, settings: dict, cache_dir: Any, progress: Any = None):
        """The byte corpus; read through the space's subword vocabularies where ``settings`` names them (``tokenizer``,
        the space's field as a run records it): the BPE trained on the training split, cached beside the corpus."""
        corpus = prepare_corpus(settings["data"], cache_dir, settings["data_seed"], settings["val_fraction"], progress=progress)
        raw = settings.get("tokenizer")
        if raw is None or raw == "bytes":
            return corpus
        return tokenize_corpus(corpus, tokenizer_spec(raw, where="the run's tokenizer"), cache_dir)

    def data_record(self, meta: dict, where: str, hint: str = "") -> dict:
        record = super().data_record(meta, where, hint)
        return {**record, "tokenizer": meta["tokenizer"]} if meta.get("tokenizer") is not None else record

    def check_data(self, data: Any, expected_hash: str, where: str) -> None:
        check_corpus(data, expected_hash, where)

    def describe_data(self, data: Any, settings: dict) -> str:
        sizes = data.meta["sizes"]
        what = "the Python standard library (PSF licence)" if settings["data"] is None else settings["data"]
        vocab = data.meta.get("tokenizer")
        read = "" if vocab is None else (f"; read as byte-level BPE {', '.join(map(str, vocab['sizes']))} (bytes per token on "
                                         "validation: " + ", ".join(f"{k} {v:.2f}" for k, v in vocab["bytes_per_token"].items())
                                         + f"; tokenizer {vocab['sha256'][:16]})")
        return (f"corpus: {what}: {sizes['train']:,} training bytes ({sizes['train_docs']} docs), {sizes['val']:,} validation "
                f"bytes ({sizes['val_docs']} docs), hash {data.hash[:16]}{read}")

    def describe_batch(self, config: Any) -> str:
        return f"batch {config.batch_size} x {config.seq_len} bytes"

    def describe_split(self, record: dict) -> str:
        return (f"validation split of {record['data'] or 'the default corpus'} (seed {record['data_seed']}, fraction "
                f"{record['val_fraction']})")

    # ------------------------------------------------------------------ search and export

    def fitness(self, model: Any, payload: dict, settings: Any) -> tuple[Any, str]:
        s = settings
        return inherited_fitness(s.path, model, payload, seq_len=s.seq_len, windows=s.windows, batch_size=s.batch_size,
                                 val_seed=s.val_seed, device=s.device, val_data=s.val_data, data_cache=s.data_cache,
                                 precision=s.precision)

    default_workload = "prefill"

    def train_subnet(self, settings: Any, progress: Any = None):
        return train_subnet(settings, progress)

    def load_trained(self, model_dir: Any, device: Any = "cpu") -> tuple[Any, Any, Any]:
        _, _, space, subnet = open_export(model_dir)
        return space, subnet, load_model(model_dir, device=device)

    def validation(self, model: Any, payload: dict, scoring: Any) -> dict:
        return stack_validation(model, payload, scoring)

    def export(self, supernet: Any, payload: dict, subnet: Any, settings: Any, predicted: dict | None):
        return export_stack(supernet, payload, subnet, settings, predicted)

    # ------------------------------------------------------------------ latency

    def params(self, space: Any, subnet: Any) -> int:
        return params(space, subnet)

    def timing_model(self, space: Any, subnet: Any, *, materialize: bool = True):
        return timing_model(space, subnet, materialize=materialize)

    def timing_reference(self, space: Any):
        return reference_model(timing_model(space, space.smallest(), materialize=False).config)

    def table_features(self, space: Any, subnet: Any, workload: Any) -> dict[str, float]:
        return table_features(space, subnet, workload)

    def predictor_features(self, kind: str, space: Any, workload: Any, subnets: Any) -> tuple:
        return stack_matrix(kind, space, workload, subnets)

    def bundle_models(self, space: Any, seed: int) -> tuple:
        """(subnet -> the static model a latency bundle exports, the reference model): extracted from a seeded
        supernet (the bundle's graphs carry real initial weights)."""
        supernet = SuperTransformer(space, generator=torch.Generator().manual_seed(seed)).eval()
        return supernet.extract, reference_model(supernet.extract(space.smallest()).config)
