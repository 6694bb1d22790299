"""Training an encoder-decoder on sentence pairs: the translation task's learner for the one training loop.

:func:`supernet.train.train` runs it (the sandwich rule with in-place distillation for a supernet,
:class:`~supernet.train.SandwichObjective`; one static model with :class:`~supernet.train.PlainObjective`):
:class:`~supernet.train.TrainConfig`'s ``batch_size`` counts pairs, its ``seq_len`` is unused (the space's
``max_seq_len`` bounds a pair); step ``k`` reads the batch that is a function of (seed, k) only
(:class:`PairBatches`), so a resumed run continues as if never stopped.

A step runs the largest, the smallest and ``n_random`` uniformly sampled subnets on one batch with
teacher forcing (decoder inputs BOS + target, targets target + EOS); the largest learns from the
targets (cross-entropy per target byte, PAD ignored), the others from
``(1 - distill) * cross-entropy + distill * KL(largest || subnet)`` over the target bytes; the
gradients are accumulated.  Held-out loss: cross-entropy per target byte (nats) on fixed batches of
the validation split, the fitness a search reads with inherited weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from search_spaces import UserError
from supernet.checkpoint import fill_supernet, load_checkpoint
from supernet.task import Batch

from .data import PAD, Pairs, collate, length_batches
from .model import TranslationSuperTransformer
from .space import TranslationSpace, TranslationSubnet


def target_ce(logits: Tensor, targets: Tensor, reduction: str = "mean") -> Tensor:
    """Cross-entropy (nats) of logits (B, T, V) against targets (B, T), PAD positions ignored."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=PAD, reduction=reduction)


@dataclass(frozen=True)
class TranslationLearner:
    """Teacher forcing on sentence pairs: decoder inputs BOS + target, targets target + EOS; the cross-entropy and the
    distillation are over the target bytes (PAD ignored), summed and divided by the step's target bytes per rank (the
    ranks' averaged gradients equal one process's on the whole batch); the held-out score is the cross-entropy per
    target byte (nats, EOS counted) on fixed batches of the validation pairs."""

    max_len: int  # the space's max_seq_len: a pair's longest source, and its longest target + 1
    metric: str = "nats/target byte"
    eval_key: str = "ce"
    mixed_precision: bool = False  # the encoder-decoder trains in fp32 (its loop never ran under autocast)

    def train_batches(self, pairs: Pairs, config: Any, dist: Any) -> "PairBatches":
        return PairBatches(pairs, config.batch_size, self.max_len, config.seed, dist.rank, dist.world)

    def evaluator(self, pairs: Pairs, config: Any):
        batches = eval_batches(pairs, config.batch_size, self.max_len, config.eval_batches, config.seed)
        return lambda model, subnet: heldout_ce(model, subnet, pairs, batches)

    def loss(self, logits: Tensor, targets: Tensor, per: float | None = None) -> Tensor:
        if per is None:
            return target_ce(logits, targets)
        return target_ce(logits, targets, reduction="sum") / per

    def kl(self, student: Tensor, teacher: Tensor, targets: Tensor, per: float | None = None) -> Tensor:
        real = targets != PAD  # (B, T)
        kd = F.kl_div(student[real], teacher[real], log_target=True, reduction="sum")  # over the real target bytes
        return kd / (int(real.sum()) if per is None else per)

    def to_dict(self) -> dict[str, Any]:
        return {}


class PairBatches:
    """Step ``k``'s batch: batch ``k mod n`` of epoch ``k // n`` of the length-sorted batches of (seed, epoch)
    (:func:`~.data.length_batches`; a batch with fewer pairs than ranks is skipped, on every rank count alike).  Every
    rank collates the whole batch (the same padding as one process) and takes its share of the rows."""

    sampler = "length_batches(seed, epoch = step // batches per epoch)"

    def __init__(self, pairs: Pairs, batch_size: int, max_len: int, seed: int, rank: int = 0, world: int = 1):
        self.pairs, self.batch_size, self.max_len, self.seed = pairs, batch_size, max_len, seed
        self.rank, self.world = rank, world
        self.n_epoch = len(self.epoch(0))
        if self.n_epoch == 0:
            raise UserError(f"the training split has no pair of at most {max_len} bytes (source, target + 1)")
        self.epochs: dict[int, list[np.ndarray]] = {}

    def epoch(self, epoch: int) -> list[np.ndarray]:
        return [b for b in length_batches(self.pairs, self.batch_size, self.max_len, self.seed, epoch) if len(b) >= self.world]

    def __call__(self, step: int) -> Batch:
        epoch, i = divmod(step, self.n_epoch)
        if epoch not in self.epochs:
            self.epochs.clear()
            self.epochs[epoch] = self.epoch(epoch)
        idx = self.epochs[epoch][i]
        src, inp, tgt = collate(self.pairs, idx)  # (B, S), (B, T), (B, T): the whole batch
        rows = np.array_split(np.arange(len(src)), self.world)[self.rank]
        n_tokens = int((tgt != PAD).sum())  # the loss is over the target tokens (and EOS) of the whole batch
        src, inp, tgt = (torch.from_numpy(a[rows]) for a in (src, inp, tgt))
        # counted in target bytes + EOS (the bytes' own tokens for a byte model): a budget and a rate mean the same text
        return Batch((src, inp), tgt, self.pairs.target_units(idx), per=n_tokens / self.world)


def steps_for_tokens(pairs: Pairs, batch_size: int, max_len: int, seed: int, tokens: int, world: int = 1) -> tuple[int, int]:
    """(steps, target bytes they train on): the most steps of the training loop's batches (``length_batches`` of
    (seed, epoch), epoch after epoch) whose target bytes (EOS included, as the loop counts them) total at most
    ``tokens``.  A token budget in the loop's own unit: models trained with one budget, seed and batch size see the
    same pairs in the same order."""
    lengths = pairs.unit_lengths  # target bytes + EOS (a subword vocabulary's pairs too: the same text per budget)
    steps, total, epoch = 0, 0, 0
    while True:
        batches = [b for b in length_batches(pairs, batch_size, max_len, seed, epoch) if len(b) >= world]
        if not batches:
            raise UserError(f"the training split has no pair of at most {max_len} bytes (source, target + 1)")
        for b in batches:
            n = int(lengths[b].sum())
            if total + n > tokens:
                return steps, total
            steps, total = steps + 1, total + n
        epoch += 1


def eval_batches(pairs: Pairs, batch_size: int, max_len: int, n_batches: int, seed: int) -> list[np.ndarray]:
    """The fixed validation batches: the first ``n_batches`` of epoch 0's length-sorted batches (same for every subnet)."""
    batches = length_batches(pairs, batch_size, max_len, seed, 0)
    if not batches:
        raise UserError(f"the validation split has no pair of at most {max_len} bytes (source, target + 1)")
    return batches[:n_batches]


@torch.no_grad()
def heldout_ce(model: torch.nn.Module, subnet: TranslationSubnet | None, pairs: Pairs, batches: list[np.ndarray]) -> float:
    """Cross-entropy per target byte (nats; EOS counts as a byte) of ``subnet`` with the supernet's weights (the
    search's fitness), or of a static model (``subnet`` None)."""
    was = model.training
    model.eval()
    device = next(model.parameters()).device
    total, count = 0.0, 0
    for idx in batches:
        src, inp, out = (torch.from_numpy(a).to(device) for a in collate(pairs, idx))
        logits = model(src, inp) if subnet is None else model(src, inp, subnet)
        total += float(target_ce(logits, out, reduction="sum"))
        count += pairs.target_units(idx)  # target bytes + EOS: a subword model's loss per byte too (issue 54)
    model.train(was)
    return total / count


def split_ce(model: torch.nn.Module, pairs: Pairs, max_len: int, batch_size: int = 64) -> tuple[float, int, int]:
    """(cross-entropy per target byte in nats, EOS counted; pairs scored; target bytes scored) of a static model over
    *every* pair of ``pairs`` that fits ``max_len`` (a whole split, not a fixed subset of batches: the benchmark's
    primary retrained metric).  Pairs are length-sorted into batches (little padding); the figure does not depend on
    the batching (a sum over target bytes)."""
    if batch_size < 1:
        raise ValueError(f"batch_size: {batch_size} is not a positive integer")
    batches = length_batches(pairs, batch_size, max_len, seed=0, epoch=0)
    if not batches:
        raise UserError(f"the split has no pair of at most {max_len} bytes (source, target + 1) to score")
    n_pairs = int(sum(len(b) for b in batches))
    n_bytes = int(sum(pairs.target_units(b) for b in batches))
    return heldout_ce(model, None, pairs, batches), n_pairs, n_bytes


def load_translation_supernet(path: str | Path, space: TranslationSpace | None = None, device: str | torch.device = "cpu"):
    """The encoder-decoder supernet stored in ``path`` (eval mode) and the checkpoint dict."""
    payload = load_checkpoint(path, space)
    if not isinstance(payload["space"], TranslationSpace):
        raise UserError(f"{path}: holds a {payload['space'].task} supernet, not an encoder-decoder (task seq2seq)")
    return fill_supernet(TranslationSuperTransformer(payload["space"]), payload, path, device), payload
