"""What an image-classification run learns: batches of augmented images, cross-entropy at the one scored position.

:class:`ImageLearner` is the learner of the one training loop (:func:`supernet.train.train`): step ``k``'s batch is
``batch_size`` training images drawn by ``default_rng([seed, 0, k])`` and augmented (:func:`.data.augment`) by
``default_rng([seed, 3, k])``, so a batch is a function of the seed and the step (the same after any resume).  The
model's logits are (B, 1, classes) and the targets (B, 1): the loss, the distillation and the held-out score are the
generic ones of fixed-length examples (:class:`supernet.task.ExampleLearner`).  The held-out score of the training log
is bits per label on the first ``eval_batches x batch_size`` validation images; :func:`accuracy` counts the top-1 hits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from supernet.heldout import HeldOut, run_model
from supernet.task import Batch, ExampleLearner, draw, rank_rows

from .data import Split, augment, to_float

AUGMENT_STREAM = 3


@dataclass(frozen=True)
class ImageBatches:
    split: Split
    batch_size: int
    seed: int
    pad: int
    flip: bool
    rank: int = 0
    world: int = 1
    sampler: str = "images drawn by default_rng([seed, 0, step]), augmented by default_rng([seed, 3, step])"

    def __call__(self, step: int) -> Batch:
        index = draw(self.seed, step, len(self.split), self.batch_size)  # (B,) the global batch
        images = augment(self.split.images[index], np.random.default_rng([self.seed, AUGMENT_STREAM, step]), self.pad, self.flip)
        mine = rank_rows(self.batch_size, self.rank, self.world)
        x = torch.from_numpy(to_float(images[mine]))  # (b, C, H, W)
        y = torch.from_numpy(self.split.labels[index][mine][:, None])  # (b, 1)
        return Batch((x,), y, self.batch_size)


def held_out(split: Split, n: int | None = None) -> HeldOut:
    """The first ``n`` images of ``split`` (all by default), fixed: inputs (n, C, H, W), targets (n, 1)."""
    n = len(split) if n is None else min(n, len(split))
    return HeldOut.of(to_float(split.images[:n]), split.labels[:n, None])


@torch.no_grad()
def accuracy(model: nn.Module, held: HeldOut, subnet: Any = None, batch_size: int = 256) -> float:
    """Top-1 accuracy of ``model`` (a static model, or a supernet with ``subnet``) on ``held``, fp32, eval mode."""
    return float(hits(model, held, subnet, batch_size).mean())


@torch.no_grad()
def hits(model: nn.Module, held: HeldOut, subnet: Any = None, batch_size: int = 256) -> np.ndarray:
    """(n,) bool: each held-out image classified right."""
    device = next(model.parameters()).device
    was = model.training
    model.eval()
    out = []
    try:
        for i in range(0, len(held.x), batch_size):
            logits = run_model(model, held.x[i : i + batch_size].to(device), subnet)  # (B, 1, K)
            out.append((logits[:, 0].argmax(-1).cpu() == held.y[i : i + batch_size, 0]).numpy())
    finally:
        model.train(was)
    return np.concatenate(out)


class ImageLearner(ExampleLearner):
    """Batches of augmented images (``pad``, ``flip``: the space's augmentation); the rest as fixed-length examples."""

    metric = "bits/label"
    eval_key = "bpb"
    mixed_precision = True

    def __init__(self, pad: int = 2, flip: bool = True, shape: tuple[int, int, int] | None = None, classes: int | None = None):
        self.pad, self.flip, self.shape, self.classes = pad, flip, shape, classes

    def check(self, split: Split, what: str) -> None:
        """Refuse images of another shape than the space's, or labels beyond its classes, in one line."""
        from search_spaces import UserError

        have = tuple(split.images.shape[1:])
        if self.shape is not None and have != self.shape:
            raise UserError(f"the {what} images are {' x '.join(map(str, have))} (C x H x W); the space takes "
                            f"{' x '.join(map(str, self.shape))} (its image: size, channels)")
        if self.classes is not None and len(split) and int(split.labels.max()) >= self.classes:
            raise UserError(f"the {what} labels go up to {int(split.labels.max())}; the space has {self.classes} classes")
        if self.classes is not None and what == "training" and len(split) and int(split.labels.max()) + 1 < self.classes:
            have = int(split.labels.max()) + 1  # (a class folder, or a label up to the highest, has training images)
            raise UserError(f"the data has {have} classes; the space has {self.classes} (image: classes): a model of "
                            f"{self.classes} outputs trained on {have} would predict classes the data does not have; "
                            f"set classes: {have} in the space")

    def train_batches(self, split: Split, config: Any, dist: Any) -> ImageBatches:
        self.check(split, "training")
        return ImageBatches(split, config.batch_size, config.seed, self.pad, self.flip, dist.rank, dist.world)

    def evaluator(self, split: Split, config: Any):
        self.check(split, "validation")
        held = held_out(split, config.eval_batches * config.batch_size)
        return lambda model, subnet: held.bits(model, subnet, config.batch_size)

    def to_dict(self) -> dict[str, Any]:
        return {}
