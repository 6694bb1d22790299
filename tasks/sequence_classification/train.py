"""Train one subnet of a sequence-classification space from scratch, and score a model's accuracy.

What ``scripts/bench_lra.py`` runs for its uniform types and for the found subnets retrained: the static model of
the subnet (:class:`supernet.Transformer`), the one training loop (:func:`supernet.train.train`) with one plain
pass a step (:class:`supernet.train.PlainObjective`) on the task's batches (:class:`.learner.SequenceLearner`),
the same steps, batch and learning rate for every subnet (a :class:`Schedule`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable

import torch

from .data import Sequences
from .learner import SequenceLearner, accuracy


@dataclass(frozen=True)
class Schedule:
    """The training protocol every subnet gets: steps, batch, peak learning rate, warmup, seed."""

    steps: int = 200
    batch_size: int = 8
    lr: float = 1e-3
    warmup: int = 20
    seed: int = 0
    eval_batches: int = 4
    device: str = "cpu"  # where it trains ("cuda" on a GPU)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def train_subnet(space: Any, subnet: Any, train: Sequences, val: Sequences, schedule: Schedule,
                 progress: Callable[[Any], None] | None = None):
    """The static model of ``subnet`` trained ``schedule.steps`` steps from a seeded initialisation on ``schedule.device``;
    (the model, on the CPU, and the loop's result)."""
    from supernet import Transformer, TransformerConfig
    from supernet.train import PlainObjective, TrainConfig
    from supernet.train import train as run

    s = schedule
    config = TransformerConfig.from_subnet(space, space.check(subnet))
    model = Transformer(config, generator=torch.Generator().manual_seed(s.seed))
    learner = SequenceLearner(space.max_seq_len, space.vocab_size)
    config = TrainConfig(batch_size=s.batch_size, seq_len=min(space.max_seq_len, train.inputs.shape[1]), lr=s.lr,
                         min_lr=s.lr / 10, warmup_steps=s.warmup, max_steps=s.steps, eval_interval=s.steps,
                         eval_batches=s.eval_batches, ckpt_interval=s.steps, log_interval=max(1, s.steps // 10), seed=s.seed)
    result = run(model.to(s.device).train(), PlainObjective(learner), train, val, config, progress=progress)
    return model.cpu().eval(), result


def score_accuracy(model: Any, examples: Sequences, space: Any, batch_size: int = 8) -> float:
    """``model``'s accuracy on every example of ``examples`` (a test split)."""
    held = SequenceLearner(space.max_seq_len, space.vocab_size).heldout(examples, len(examples))
    return accuracy(model, held, examples.classes, None, batch_size)
