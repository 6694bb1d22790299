"""The learner of a sequence classification: batches of examples, the loss at the [CLS] position only.

The model is the one stack of blocks of every one-stack task, bidirectional (an encoder): every example starts
with a [CLS] token, and the model's output at that position, read at the rows of the class ids (``0 .. C-1``), is
the classifier (CLS pooling, the output projection as the linear head).  The cross-entropy is over the full
output at that position, as :class:`supernet.task.ExampleLearner` scores it (the other ids learn to be unlikely);
accuracy is the argmax over the class ids.

Self-pretraining (``pretrain_steps``; "Never Train from Scratch", Amos et al., ICLR 2024): the run's first
``pretrain_steps`` steps denoise the task's own training inputs (:class:`DenoisingBatches`: a ``mask_rate`` share of
each example's tokens, never [CLS] or padding, replaced by a mask id, the first id past the data's vocabulary, and
predicted at those positions through the same output projection), then the classification's steps follow; the
trainer starts the schedule and the optimizer's moments again at the boundary (``phase_steps``,
:class:`supernet.train.WarmupCosine`).  The loss is the same function in both phases (the cross-entropy over the
scored positions), so distillation, checkpoints and exact resume work across the boundary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from search_spaces import UserError
from supernet.heldout import HeldOut, run_model
from supernet.heldout import IGNORE
from supernet.task import Batch, ExampleBatches, ExampleLearner, draw, rank_rows

from .data import Sequences

NAME = "sequence-classification"
MASK_STREAM = 5  # the denoising masks of step k: default_rng([seed, MASK_STREAM, k])
MASK_RATE = 0.15


def check_fits(examples: Sequences, max_seq_len: int, vocab_size: int, what: str) -> None:
    """Refuse, in one line naming the row, an example longer than the space's ``max_seq_len`` (with its [CLS]), and
    data whose vocabulary the space's ``vocab_size`` does not hold."""
    if examples.vocab > vocab_size:
        raise UserError(f"the {what} data needs {examples.vocab} token ids ({examples.classes} classes + [CLS] + padding + "
                        f"{examples.vocab - examples.classes - 2} symbols); the space's vocab_size is {vocab_size}")
    if examples.inputs.shape[1] > max_seq_len:
        i = int(np.argmax(examples.lengths))
        raise UserError(f"{examples.row(i)}: {int(examples.lengths[i]):,} tokens (+1 for [CLS]) exceed the space's "
                        f"max_seq_len {max_seq_len}")


def mask_tokens(inputs: np.ndarray, rng: np.random.Generator, rate: float, mask_id: int, pad_id: int) -> tuple[np.ndarray,
                                                                                                               np.ndarray]:
    """(inputs with a ``rate`` share of their tokens replaced by ``mask_id``, targets: the original ids there and
    :data:`IGNORE` elsewhere): (N, T) int64 each.  Only tokens are drawn (never [CLS] at position 0, never padding);
    a batch in which the draw picks none gets its first example's first token, so every step has a loss."""
    x = inputs.astype(np.int64, copy=True)
    real = x != pad_id
    real[:, 0] = False
    chosen = real & (rng.random(x.shape) < rate)
    if not chosen.any() and real.any():
        chosen[np.unravel_index(int(np.argmax(real)), real.shape)] = True
    y = np.where(chosen, x, IGNORE)
    x[chosen] = mask_id
    return x, y


@dataclass(frozen=True)
class DenoisingBatches:
    """Step ``k``'s self-pretraining batch: ``batch_size`` examples drawn by ``default_rng([seed, 0, k])`` (the global
    batch), masked by ``default_rng([seed, 5, k])`` (:func:`mask_tokens`), this rank's rows of it."""

    examples: Sequences
    batch_size: int
    seed: int
    rate: float
    mask_id: int
    rank: int = 0
    world: int = 1
    sampler: str = "examples drawn by default_rng([seed, 0, step]), masked by default_rng([seed, 5, step])"

    def __call__(self, step: int) -> Batch:
        index = draw(self.seed, step, len(self.examples), self.batch_size)  # (B,)
        x, y = mask_tokens(self.examples.inputs[index], np.random.default_rng([self.seed, MASK_STREAM, step]), self.rate,
                           self.mask_id, self.examples.classes + 1)
        mine = rank_rows(self.batch_size, self.rank, self.world)
        return Batch((torch.from_numpy(x[mine]),), torch.from_numpy(y[mine]), int(self.batch_size * x.shape[1]))


@dataclass(frozen=True)
class PhasedBatches:
    """``first``'s batches for the steps before ``switch``, ``then``'s from it.  (Not named ``at``: the trainer reads a
    batches' ``at`` as the per-vocabulary batches of a space that searches its vocabulary.)"""

    first: Any
    then: Any
    switch: int

    @property
    def sampler(self) -> str:
        return f"steps below {self.switch}: {self.first.sampler}; then {self.then.sampler}"

    def __call__(self, step: int) -> Batch:
        return self.first(step) if step < self.switch else self.then(step)


class SequenceLearner(ExampleLearner):
    """:class:`supernet.task.ExampleLearner` over :class:`Sequences`, checked against the space's sizes; with
    ``pretrain_steps``, the run's first steps denoise the inputs (the module doc)."""

    def __init__(self, max_seq_len: int, vocab_size: int, pretrain_steps: int = 0, mask_rate: float = MASK_RATE):
        if not isinstance(pretrain_steps, int) or pretrain_steps < 0:
            raise UserError(f"--pretrain-steps: {pretrain_steps} is not a whole number of steps (0 or more)")
        if not 0.0 < mask_rate < 1.0:
            raise UserError(f"mask rate {mask_rate} is not strictly between 0 and 1")
        self.max_seq_len, self.vocab_size = max_seq_len, vocab_size
        self.pretrain_steps, self.mask_rate = pretrain_steps, mask_rate

    @property
    def phase_steps(self) -> int:
        """Where the classification's phase starts (the trainer restarts the schedule there); 0 without pretraining."""
        return self.pretrain_steps

    def train_batches(self, examples: Sequences, config: Any, dist: Any) -> ExampleBatches | PhasedBatches:
        check_fits(examples, self.max_seq_len, self.vocab_size, "training")
        classify = ExampleBatches(examples, config.batch_size, config.seed, dist.rank, dist.world)
        if not self.pretrain_steps:
            return classify
        if examples.vocab >= self.vocab_size:
            raise UserError(f"--pretrain-steps: the masked denoising needs one token id past the data's {examples.vocab} "
                            f"(its mask); the space's vocab_size is {self.vocab_size}: give vocab_size {examples.vocab + 1} "
                            "or more")
        denoise = DenoisingBatches(examples, config.batch_size, config.seed, self.mask_rate, examples.vocab, dist.rank,
                                   dist.world)
        return PhasedBatches(denoise, classify, self.pretrain_steps)

    def heldout(self, examples: Sequences, n: int) -> HeldOut:
        """The first ``n`` examples, fixed (int64, as the model takes them)."""
        check_fits(examples, self.max_seq_len, self.vocab_size, "held-out")
        return HeldOut.of(examples.inputs[:n].astype(np.int64), examples.targets[:n].astype(np.int64))

    def to_dict(self) -> dict[str, Any]:
        return {"pretrain_steps": self.pretrain_steps, "mask_rate": self.mask_rate} if self.pretrain_steps else {}


@torch.no_grad()
def correct(model: nn.Module, held: HeldOut, classes: int, subnet: Any = None, batch_size: int = 16) -> torch.Tensor:
    """Whether each of ``held``'s examples gets its label (argmax over the class ids at [CLS]): (N,) bool, in order
    (what a paired comparison of two models on the same examples needs)."""
    device = next(model.parameters()).device
    was = model.training
    model.eval()
    right = []
    try:
        for i in range(0, len(held.x), batch_size):
            x, y = held.x[i: i + batch_size].to(device), held.y[i: i + batch_size, 0].to(device)  # (B, T), (B,)
            logits = run_model(model, x, subnet)[:, 0, :classes]  # (B, C)
            right.append((logits.argmax(-1) == y).cpu())
    finally:
        model.train(was)
    return torch.cat(right) if right else torch.zeros(0, dtype=torch.bool)


def accuracy(model: nn.Module, held: HeldOut, classes: int, subnet: Any = None, batch_size: int = 16) -> float:
    """The share of ``held``'s examples whose class (argmax over the class ids at [CLS]) is the label."""
    right = correct(model, held, classes, subnet, batch_size)
    return float(right.float().mean()) if len(right) else 0.0
