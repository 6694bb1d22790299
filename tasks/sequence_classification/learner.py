"""The learner of a sequence classification: batches of examples, the loss at the [CLS] position only.

The model is the one stack of blocks of every one-stack task, bidirectional (an encoder): every example starts
with a [CLS] token, and the model's output at that position, read at the rows of the class ids (``0 .. C-1``), is
the classifier (CLS pooling, the output projection as the linear head).  The cross-entropy is over the full
output at that position, as :class:`supernet.task.ExampleLearner` scores it (the other ids learn to be unlikely);
accuracy is the argmax over the class ids.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from search_spaces import UserError
from supernet.heldout import HeldOut, run_model
from supernet.task import ExampleBatches, ExampleLearner

from .data import Sequences

NAME = "sequence-classification"


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


class SequenceLearner(ExampleLearner):
    """:class:`supernet.task.ExampleLearner` over :class:`Sequences`, checked against the space's sizes."""

    def __init__(self, max_seq_len: int, vocab_size: int):
        self.max_seq_len, self.vocab_size = max_seq_len, vocab_size

    def train_batches(self, examples: Sequences, config: Any, dist: Any) -> ExampleBatches:
        check_fits(examples, self.max_seq_len, self.vocab_size, "training")
        return ExampleBatches(examples, config.batch_size, config.seed, dist.rank, dist.world)

    def heldout(self, examples: Sequences, n: int) -> HeldOut:
        """The first ``n`` examples, fixed (int64, as the model takes them)."""
        check_fits(examples, self.max_seq_len, self.vocab_size, "held-out")
        return HeldOut.of(examples.inputs[:n].astype(np.int64), examples.targets[:n].astype(np.int64))

    def to_dict(self) -> dict[str, Any]:
        return {}


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
