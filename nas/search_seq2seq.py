"""``nas search`` on an encoder-decoder supernet (task seq2seq): the parts that differ from an LM's search.

The search driver, strategies, budgets, storage and outputs are the LM's (:mod:`nas.search`); what differs is
the fitness, held-out cross-entropy per target byte (nats, EOS counted) with inherited weights
(:func:`supernet.seq2seq_train.heldout_ce`) on a fixed subset of the validation split of the supernet's own corpus
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
from search_spaces.seq2seq import Seq2SeqSpace, Seq2SeqSubnet

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
        from supernet.seq2seq_train import heldout_ce

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
    from nas.export_seq2seq import corpus_record
    from supernet.seq2seq_train import eval_batches, load_seq2seq_supernet
    from supernet.translation import check_pairs, prepare_pairs

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


# --------------------------------------------------------------------------- genetic operators


def _cross_genes(space: Seq2SeqSpace, depth: int, parents: Sequence[Seq2SeqSubnet], pick) -> tuple[tuple, tuple]:
    heads, layers = [], []
    for i in range(depth):
        for out, name, choices in ((heads, "cross_heads", space.cross_heads), (layers, "cross_layers", space.cross_layers)):
            out.append(int(pick(i, [getattr(p, name)[i] for p in parents if i < p.decoder.depth], choices)))
    return tuple(heads), tuple(layers)


def mutate_seq2seq(space: Seq2SeqSpace, parent: Seq2SeqSubnet, rng: np.random.Generator, prob: float) -> Seq2SeqSubnet:
    """The encoder and the decoder mutated as LM subnets of their sides; each decoder layer's cross heads and encoder
    layers redrawn with probability ``prob`` (drawn fresh on layers a deeper child gains)."""
    from nas.search.operators import mutate

    enc, dec = mutate(space.encoder, parent.encoder, rng, prob), mutate(space.decoder, parent.decoder, rng, prob)

    def pick(_i: int, have: list, choices: tuple):
        return have[0] if have and rng.random() >= prob else choices[int(rng.integers(len(choices)))]

    return Seq2SeqSubnet(enc, dec, *_cross_genes(space, dec.depth, (parent,), pick))


def crossover_seq2seq(space: Seq2SeqSpace, a: Seq2SeqSubnet, b: Seq2SeqSubnet, rng: np.random.Generator) -> Seq2SeqSubnet:
    """Each side crossed as LM subnets; each cross gene from a parent that has the layer."""
    from nas.search.operators import crossover

    enc, dec = crossover(space.encoder, a.encoder, b.encoder, rng), crossover(space.decoder, a.decoder, b.decoder, rng)

    def pick(_i: int, have: list, _choices: tuple):
        return have[int(rng.integers(len(have)))]

    return Seq2SeqSubnet(enc, dec, *_cross_genes(space, dec.depth, (a, b), pick))


def seq2seq_trial_params(space: Seq2SeqSpace, subnet: Seq2SeqSubnet):
    """The subnet as Optuna parameters: each side's as an LM subnet's (prefixed ``enc.`` / ``dec.``), then the cross
    genes per decoder layer."""
    from optuna.distributions import CategoricalDistribution

    from nas.search.storage import subnet_params

    params, dists = {}, {}
    for prefix, side, sub in (("enc.", space.encoder, subnet.encoder), ("dec.", space.decoder, subnet.decoder)):
        p, d = subnet_params(side, sub)
        params.update({prefix + k: v for k, v in p.items()})
        dists.update({prefix + k: v for k, v in d.items()})
    for i in range(subnet.decoder.depth):
        for name, choices in (("cross_heads", space.cross_heads), ("cross_layers", space.cross_layers)):
            params[f"dec.l{i}.{name}"] = getattr(subnet, name)[i]
            dists[f"dec.l{i}.{name}"] = CategoricalDistribution(choices)
    return params, dists
