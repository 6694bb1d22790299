"""``nas search`` on an encoder-decoder supernet (task seq2seq): the translation task's fitness and the flags it refuses.

The search driver, strategies, budgets, storage and outputs are the LM's (:mod:`nas.search`); what differs is
the fitness, held-out cross-entropy per target byte (nats, EOS counted) with inherited weights
(:func:`tasks.translation.train.heldout_ce`) on a fixed subset of the validation split of the supernet's own corpus
(``--val-windows`` batches of ``--eval-batch-size`` pairs, the first length-sorted batches of ``--val-seed``, the same for
every subnet); the genetic operators are the space's (:class:`~.space.Seq2SeqSpace`).  Not yet for seq2seq:
``--precision`` other than fp32, ``--val-data``.  ``--fitness calibrated:DIR`` works as for the LM (a ranker of ``nas
fit-accuracy`` on retrained encoder-decoders, its features over both stacks), and so do ``--hurdles`` (each round
``nas train-subnet`` of the task, its budget in target bytes, scored on the search's validation pairs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from search_spaces import UserError

from .space import Seq2SeqSubnet

METRIC = "nats/target byte"


class Seq2SeqFitness:
    """``fitness(subnets)`` -> held-out cross-entropy per target byte of each subnet with the supernet's weights."""

    def __init__(self, supernet, val_pairs, batches: list[np.ndarray], *, seed: int, corpus_hash: str, where: str):
        self.model, self.pairs, self.batches = supernet.eval(), val_pairs, batches
        n = int(sum(len(b) for b in batches))
        self.summary = f"{n} pairs ({len(batches)} batches) of the {where}"
        self.description = {"task": "seq2seq", "metric": METRIC, "pairs": n, "batches": len(batches), "seed": seed}
        self.data_digest = corpus_hash[:16]

    def static(self, model) -> float:
        """A trained encoder-decoder's cross-entropy per target byte on the same pairs (what a ranker is fitted to)."""
        from .train import heldout_ce

        return heldout_ce(model, None, self.pairs, self.batches)

    def __call__(self, subnets: Sequence[Seq2SeqSubnet]) -> np.ndarray:
        from .train import heldout_ce

        return np.array([heldout_ce(self.model, s, self.pairs, self.batches) for s in subnets], dtype=np.float64)


def refuse(given: dict) -> None:
    """Refuse, in one line, the search's flags that do not run on an encoder-decoder yet."""
    if given.get("val_data"):
        raise UserError("--val-data: not for an encoder-decoder (task seq2seq) search yet")
    if given.get("precision", "fp32") != "fp32":
        raise UserError(f"--precision {given['precision']}: an encoder-decoder (task seq2seq) is searched in fp32 only so far")


def seq2seq_fitness(model, payload: dict, settings) -> tuple[Seq2SeqFitness, str]:
    """(fitness, digest of its data) of an encoder-decoder supernet (``model``, loaded as ``payload``): its corpus rebuilt
    from the run's cache and checked; ``settings``: :class:`supernet.scoring.FitnessSettings`."""
    from .data import check_pairs, prepare_pairs, tokenize_pairs
    from .train import eval_batches
    from .workflows import corpus_record

    if settings.windows < 1 or settings.batch_size < 1:
        raise UserError(f"--val-windows / --eval-batch-size: {settings.windows} / {settings.batch_size} must be positive")
    record = corpus_record(payload["meta"])
    cache = Path(settings.data_cache) if settings.data_cache else Path(settings.path).parent
    corpus = prepare_pairs(record["data"], cache, seed=record["data_seed"] or 0, lang=record["lang"] or "de")
    check_pairs(corpus, record["corpus_hash"], str(settings.path))
    trained = payload["meta"].get("vocabulary")
    if model.space.tokenizer.bpe:  # the pairs read at the run's joint vocabulary
        corpus = tokenize_pairs(corpus, model.space.tokenizer, cache)
        if trained is None or corpus.vocabulary.sha256 != trained["sha256"]:
            raise UserError(f"{settings.path}: trained with tokenizer {(trained or {}).get('sha256', '?')[:16]}, but the "
                            f"data cache now gives {corpus.vocabulary.sha256[:16]}")
    batches = eval_batches(corpus.val, settings.batch_size, model.space.max_seq_len, settings.windows, settings.val_seed)
    fitness = Seq2SeqFitness(model, corpus.val, batches, seed=settings.val_seed, corpus_hash=str(record["corpus_hash"]),
                             where=f"validation split of {record['corpus']}")  # fmt: skip
    return fitness, fitness.data_digest
