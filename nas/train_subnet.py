"""``nas train-subnet`` and ``nas finetune``: train one subnet as its own model, as the space's task trains it
(:meth:`tasks.base.Task.train_subnet`; a one-stack model's: :func:`tasks.stack.train.train_subnet`), in the run-folder
protocol of :mod:`supernet.runs` (resumable, its settings in every checkpoint and in the card).
"""

from __future__ import annotations

from typing import Callable

from search_spaces import tasks
from supernet.runs import SubnetTraining, SubnetTrainingResult
from supernet.train import StepInfo


def train_subnet(settings: SubnetTraining, progress: Callable[[StepInfo], None] | None = None) -> SubnetTrainingResult:
    """Train ``settings.subnet`` and write its model folder to ``settings.out``, as the space's task does."""
    return tasks.of(settings.space).train_subnet(settings, progress)
