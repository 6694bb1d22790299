"""``seq2seq``: translation by an encoder-decoder (HAT's elastic space, arbitrary encoder-decoder attention and
``translate`` latency workload), trained on sentence pairs; the held-out score is cross-entropy per target byte.

The folder: :mod:`.space` (the space format, subnets, genes and the ``translate`` workload), :mod:`.model` (the
elastic and the static encoder-decoder, one forward), :mod:`.data` (sentence pairs: gettext catalogs or a TSV, split
and cached), :mod:`.train` (the learner of the one training loop, its batches and held-out score), :mod:`.decode`
(greedy and beam search, chrF / BLEU), :mod:`.onnx` (the encoder and decoder-step graphs), :mod:`.artifact` (an
exported model), :mod:`.features` and :mod:`.timing` (the workload's cost terms, timing models, the devices' loops),
:mod:`.search` (the fitness), :mod:`.export`, :mod:`.workflows` (the flags it refuses, its data settings, training
one subnet) and :mod:`.command` (``nas translate``).
"""

from __future__ import annotations

from typing import Any

from search_spaces.tasks import declare

from ..base import Flag, Task
from .space import TASK as NAME
from .space import TRANSLATE, TranslateWorkload, describe_seq2seq, parse_seq2seq


def _check_lang(value: str, flag: str) -> None:
    from .data import check_lang  # (a locale's name, before it becomes part of a path)

    check_lang(value, flag)


class TranslationTask(Task):
    name = NAME
    doc = "translation by an encoder-decoder (bidirectional encoder, causal decoder with cross-attention)"
    metric = "nats/target byte"
    workload_kinds = (TRANSLATE,)
    commands = ("tasks.translation.command",)  # nas translate
    flags = (Flag("--lang", "lang", str, "LANG", "seq2seq spaces: the target language of the system's gettext catalogs "
                  "(default de; English is the source); --data takes a source<TAB>target file instead",
                  ("train-supernet", "train-subnet"), elsewhere="for a seq2seq (translation) space only; a language model "
                  "reads --data", check=_check_lang),)
    objective_defaults = {"n_eval_random": 2}  # two random subnets evaluated (the records of earlier runs)
    token_unit = "target bytes"

    def example_tokens(self, seq_len: int) -> None:
        return None  # a pair's target bytes vary: a budget of target bytes is not whole steps

    # ------------------------------------------------------------------ commands

    def refuse(self, command: str, given: dict[str, Any]) -> None:
        from . import search, workflows

        (search.refuse(given) if command == "search" else workflows.refuse(command, given))

    # ------------------------------------------------------------------ search and export

    unit = "nats"

    @property
    def specials(self) -> dict[str, int]:
        """The ids after the bytes: PAD, BOS (the decoder's first input) and EOS (the end of a translation)."""
        from .data import SPECIALS

        return dict(SPECIALS)

    def fitness(self, model: Any, payload: dict, settings: Any) -> tuple[Any, str]:
        from .search import seq2seq_fitness

        return seq2seq_fitness(model, payload, settings)

    def training_data(self, meta: dict) -> dict:
        from .workflows import corpus_record

        record = corpus_record(meta)  # the pairs: a file, or the catalogs of a language; split by the seed
        return {"data": record["data"], "data_seed": record["data_seed"] or 0, "options": {"lang": record["lang"]}}

    def load_trained(self, model_dir: Any, device: Any = "cpu") -> tuple[Any, Any, Any]:
        from .artifact import load_seq2seq_model

        model, _ = load_seq2seq_model(model_dir, device)
        return model.space, model.subnet, model

    def train_subnet(self, settings: Any, progress: Any = None):
        from .workflows import train_subnet

        return train_subnet(settings, progress)

    def export(self, supernet: Any, payload: dict, subnet: Any, settings: Any, predicted: dict | None):
        from .export import export_seq2seq

        return export_seq2seq(supernet, payload, subnet, settings, predicted)

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

    # ------------------------------------------------------------------ data: sentence pairs (.data)

    def data_settings(self, settings: dict, flags: dict, stored: dict | None) -> dict:
        from .workflows import data_settings

        return data_settings(settings, flags, stored)

    def data_record(self, meta: dict, where: str, hint: str = "") -> dict:
        from .workflows import corpus_record

        record = corpus_record(meta)
        return {**record, "tokenizer": meta["tokenizer"]} if meta.get("tokenizer") is not None else record

    def prepare_data(self, settings: dict, cache_dir: Any, progress: Any = None):
        """The sentence pairs; read at the space's joint BPE where ``settings`` names it (``tokenizer``, as a run records
        the space's field): trained on the training pairs' sentences, cached beside them."""
        from search_spaces.space import tokenizer_spec

        from .data import DEFAULT_LANG, VOCAB_SIZE, prepare_pairs, tokenize_pairs

        pairs = prepare_pairs(settings["data"], cache_dir, seed=settings["data_seed"] or 0,
                              lang=settings["lang"] or DEFAULT_LANG)
        raw = settings.get("tokenizer")
        if raw is None or raw == "bytes":
            return pairs
        return tokenize_pairs(pairs, tokenizer_spec(raw, VOCAB_SIZE, "the run's tokenizer"), cache_dir)

    def check_data(self, data: Any, expected_hash: str, where: str) -> None:
        from .data import check_pairs

        check_pairs(data, expected_hash, where)

    def describe_data(self, data: Any, settings: dict) -> str:
        sizes, vocab = data.meta["sizes"], data.meta.get("tokenizer")
        read = "" if vocab is None else (f"; read as a joint byte-level BPE of {data.vocabulary.size:,} ids ("
                                         + ", ".join(f"{v:.2f}" for v in vocab["bytes_per_token"].values())
                                         + " target bytes per token on validation)")
        return (f"corpus {data.meta['corpus']}: {sizes['train']['pairs']:,} training pairs ({sizes['train']['source_bytes']:,} + "
                f"{sizes['train']['target_bytes']:,} bytes), {sizes['val']['pairs']:,} validation pairs, "
                f"{sizes['test']['pairs']:,} test pairs, hash {data.hash[:16]}{read}")

    def describe_batch(self, config: Any) -> str:
        return f"batch {config.batch_size} pairs"

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
