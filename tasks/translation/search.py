"""``nas search`` on an encoder-decoder supernet (task seq2seq): the parts that differ from an LM's search.

The search driver, strategies, budgets, storage and outputs are the LM's (:mod:`nas.search`); what differs is
the fitness, held-out cross-entropy per target byte (nats, EOS counted) with inherited weights
(:func:`tasks.translation.train.heldout_ce`) on a fixed subset of the validation split of the supernet's own corpus
(``--val-windows`` batches of ``--eval-batch`` pairs, the first length-sorted batches of ``--val-seed``, the same for
every subnet), and the genetic operators of a seq2seq subnet (:func:`mutate_seq2seq`, :func:`crossover_seq2seq`).
Not yet for seq2seq: ``--hurdles``, ``--verify``, ``--precision`` other than fp32, ``--val-data``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

import numpy as np

from search_spaces import UserError

from .space import Seq2SeqSubnet

METRIC = "nats/target byte"


class Seq2SeqFitness:
    """``fitness(subnets)`` -> held-out cross-entropy per target byte of each subnet with the supernet's weights."""

    task = "seq2seq"

    def __init__(self, supernet, val_pairs, batches: list[np.ndarray], *, seed: int, corpus_hash: str, where: str):
        self.model, self.pairs, self.batches = supernet.eval(), val_pairs, batches
        n = int(sum(len(b) for b in batches))
        self.summary = f"{n} pairs ({len(batches)} batches) of the {where}"
        self.description = {"task": "seq2seq", "metric": METRIC, "pairs": n, "batches": len(batches), "seed": seed}
        self.data_digest = corpus_hash[:16]

    def __call__(self, subnets: Sequence[Seq2SeqSubnet]) -> np.ndarray:
        from .train import heldout_ce

        return np.array([heldout_ce(self.model, s, self.pairs, self.batches) for s in subnets], dtype=np.float64)


def check_flags(args: argparse.Namespace) -> None:
    """Refuse, in one line, the LM search's flags that do not run on an encoder-decoder yet."""
    for flag, off in (("hurdles", 0), ("val_data", None)):
        if getattr(args, flag, off) not in (off, False, None, 0):
            raise UserError(f"--{flag.replace('_', '-')}: not for an encoder-decoder (task seq2seq) search yet")
    if getattr(args, "precision", "fp32") != "fp32":
        raise UserError(f"--precision {args.precision}: an encoder-decoder (task seq2seq) is searched in fp32 only so far")


def seq2seq_search_setup(args: argparse.Namespace, device: str):
    """(supernet, checkpoint, fitness) of a seq2seq checkpoint; its corpus rebuilt from the run's cache and checked."""
    from .data import check_pairs, prepare_pairs
    from .export import corpus_record
    from .train import eval_batches, load_seq2seq_supernet

    check_flags(args)
    if args.val_windows < 1 or args.eval_batch < 1:
        raise UserError(f"--val-windows / --eval-batch: {args.val_windows} / {args.eval_batch} must be positive")
    model, payload = load_seq2seq_supernet(args.supernet, device=device)
    record = corpus_record(payload["meta"])
    cache = Path(args.data_cache) if args.data_cache else Path(args.supernet).parent
    corpus = prepare_pairs(record["data"], cache, seed=record["data_seed"] or 0, lang=record["lang"] or "de")
    check_pairs(corpus, record["corpus_hash"], args.supernet)
    space = model.space
    batches = eval_batches(corpus.val, args.eval_batch, space.max_seq_len, args.val_windows, args.val_seed)
    fitness = Seq2SeqFitness(model, corpus.val, batches, seed=args.val_seed, corpus_hash=str(record["corpus_hash"]),
                             where=f"validation split of {record['corpus']}")  # fmt: skip
    return model, payload, fitness
