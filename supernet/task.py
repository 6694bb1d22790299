"""What a training run learns: a task's *learner*, the one interface of the one training loop.

A task (``tasks/<name>/``, found through :mod:`search_spaces.tasks`) makes a learner for a run,
configured by the run's seed and the task's own settings (a masked LM's mask rate):
:func:`task_for` asks the space's task.  The trainer (:func:`supernet.train.train`), the search's fitness
(:class:`supernet.scoring.InheritedLoss`) and the export card see a task only through its learner.
Call order per training step:

* ``train_batches(data, config, dist)`` once: a :class:`Batches`; ``batches(step)`` -> this rank's
  :class:`Batch` of step ``step`` (a function of the seed and the step: the same batch on every rank
  and after any resume);
* the model runs on ``batch.inputs`` -> ``loss(logits, targets, per)`` for the cross-entropy and, for
  the smaller subnets of the sandwich rule, ``kl(student, teacher, targets, per)``;
* ``evaluator(data, config)`` once: ``score(model, subnet)`` -> the held-out ``metric`` (the same
  held-out examples for every subnet and every call), logged under ``eval_key``.

:class:`WindowLearner` is the base of the learners over windows of a token array (the byte LMs): a
step's batch is ``batch_size`` windows drawn by ``default_rng([seed, 0, step])``, the held-out score is
bits per scored token on fixed windows (:class:`supernet.heldout.HeldOut`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from search_spaces import Space, Subnet, UserError, tasks

from .data import check_length, windows
from .heldout import IGNORE, HeldOut
from .tokenizer import Tokens

DATA_STREAM, EVAL_STREAM = 0, 2  # streams of the trainer's generators: default_rng([seed, stream, step])

Score = Callable[[nn.Module, "Subnet | None"], float]  # (model, subnet or None for a static model) -> held-out score


@dataclass
class Batch:
    """This rank's share of one step's batch."""

    inputs: tuple[Tensor, ...]  # what the model takes: model(*inputs, subnet=...)
    targets: Tensor
    tokens: int  # tokens the whole step trains on (the run's count)
    per: float | None = None  # what this rank's loss sums are divided by; None: the mean over its own scored positions

    def to(self, device: torch.device) -> "Batch":
        return Batch(tuple(x.to(device) for x in self.inputs), self.targets.to(device), self.tokens, self.per)


class Batches(Protocol):
    """A run's training batches: ``batches(step)`` is this rank's share of step ``step``'s batch."""

    sampler: str  # how the batches are drawn (stored in checkpoints)

    def __call__(self, step: int) -> Batch: ...


class Learner(Protocol):
    """What a run learns, configured (see the module doc)."""

    metric: str  # what the held-out score is: "bits/byte", "bits/masked byte", "nats/target byte"
    eval_key: str  # the key of the held-out scores in the run's evaluations ("bpb", "ce")
    mixed_precision: bool  # bf16 autocast on CUDA while training

    def train_batches(self, data: Any, config: Any, dist: Any) -> Batches: ...

    def evaluator(self, data: Any, config: Any) -> Score: ...

    def loss(self, logits: Tensor, targets: Tensor, per: float | None = None) -> Tensor:
        """Cross-entropy (nats) over the scored positions: the mean, or their sum divided by ``per``."""
        ...

    def kl(self, student: Tensor, teacher: Tensor, targets: Tensor, per: float | None = None) -> Tensor:
        """KL(teacher || student) over the scored positions (log-probabilities (B, T, V) each), normalised as ``loss``."""
        ...

    def to_dict(self) -> dict[str, Any]:
        """Stored with the objective (empty for a learner without settings: records of earlier versions read the same)."""
        ...


def kl_rows(student: Tensor, teacher: Tensor) -> Tensor:
    """KL(teacher || student), the mean over the rows: log-probabilities (N, V) each."""
    return F.kl_div(student, teacher, log_target=True, reduction="batchmean")


def eval_starts(n_tokens: int, batch_size: int, seq_len: int, n_batches: int, seed: int) -> np.ndarray:
    """The fixed window starts an evaluation uses: (n_batches * batch_size,), a function of ``seed`` only."""
    return np.random.default_rng([seed, EVAL_STREAM]).integers(0, n_tokens - seq_len, size=n_batches * batch_size)


def draw(seed: int, step: int, high: int, size: int) -> np.ndarray:
    """Step ``step``'s global batch: ``size`` indices below ``high`` drawn by ``default_rng([seed, 0, step])``."""
    return np.random.default_rng([seed, DATA_STREAM, step]).integers(0, high, size=size)


def rank_rows(batch_size: int, rank: int, world: int) -> slice:
    """The rows of a global batch that rank ``rank`` of ``world`` trains on."""
    b = batch_size // world
    return slice(rank * b, (rank + 1) * b)


def scored_kl(student: Tensor, teacher: Tensor, targets: Tensor) -> Tensor:
    """KL(teacher || student) over the scored positions (targets other than ``IGNORE``): log-probabilities (B, T, V)."""
    scored = targets.flatten() != IGNORE  # (B*T,)
    return kl_rows(student.flatten(0, 1)[scored], teacher.flatten(0, 1)[scored])


@dataclass(frozen=True)
class WindowBatches:
    """Step ``k``'s batch: ``batch_size`` windows of ``tokens`` at starts drawn by ``default_rng([seed, 0, k])`` (the
    global batch), this rank's rows of it made into (inputs, targets) by the learner."""

    tokens: np.ndarray
    learner: "WindowLearner"
    batch_size: int
    seq_len: int
    seed: int
    rank: int = 0
    world: int = 1
    sampler: str = "windows drawn by default_rng([seed, 0, step])"

    def __call__(self, step: int) -> Batch:
        starts = draw(self.seed, step, len(self.tokens) - self.seq_len, self.batch_size)  # (B,) the global batch
        rows = rank_rows(self.batch_size, self.rank, self.world)
        x, y = self.learner.batch(self.tokens, starts, rows, self.seq_len, step)
        return Batch((x,), y, self.batch_size * self.seq_len)


@dataclass(frozen=True)
class VocabBatches:
    """The batches of a corpus read at several vocabularies (:class:`supernet.tokenizer.Tokens`): ``at(size)`` is that
    vocabulary's :class:`WindowBatches`; a step's subnets share one vocabulary (the objective's choice,
    :func:`step_vocab`), so the trainer asks for that one.  Called alone: the largest vocabulary's."""

    by_vocab: dict[int, WindowBatches]
    sampler: str = "windows drawn by default_rng([seed, 0, step]) from the step's vocabulary's tokens"

    def at(self, vocab: int) -> WindowBatches:
        return self.by_vocab[vocab]

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(sorted(self.by_vocab))

    def __call__(self, step: int) -> Batch:
        return self.by_vocab[max(self.by_vocab)](step)


def step_vocab(vocabs: tuple[int, ...], step: int, period: int = 1) -> int:
    """The vocabulary every subnet of step ``step`` reads: ``vocabs`` in turn, each held for ``period`` steps (the
    sandwich's rotation over attention types), so every type meets every vocabulary as largest and smallest."""
    return vocabs[(step // max(1, period)) % len(vocabs)]


def model_vocab(model: nn.Module, subnet: Subnet | None, sizes: tuple[int, ...]) -> int:
    """The vocabulary a pass reads: the subnet's gene, else the largest of ``sizes`` (a space of one vocabulary); a
    static model's (``subnet`` None): its embedding's rows."""
    if subnet is not None:
        return subnet.vocab if getattr(subnet, "vocab", None) is not None else max(sizes)
    config = getattr(model, "config", None) or getattr(getattr(model, "model", None), "config", None)
    return config.vocab_size if config is not None and config.vocab_size in sizes else max(sizes)


class WindowLearner:
    """Base of the learners over windows of a token array: a subclass gives ``batch`` and ``heldout`` (and ``loss``,
    ``kl``, ``to_dict``).  The array may be a corpus read at subword vocabularies (:class:`supernet.tokenizer.Tokens`):
    then each vocabulary has its batches and its held-out windows, scored per byte of text."""

    metric = "bits/byte"
    eval_key = "bpb"
    mixed_precision = True

    def batch(self, tokens: np.ndarray, starts: np.ndarray, rows: slice, seq_len: int, step: int) -> tuple[Tensor, Tensor]:
        """Rows ``rows`` of the global batch of windows at ``starts`` (the whole step's): (inputs, targets) (b, T) on the CPU."""
        raise NotImplementedError

    def heldout(self, tokens: np.ndarray, starts: np.ndarray, seq_len: int, token_lengths: np.ndarray | None = None) -> HeldOut:
        """Fixed held-out windows (and whatever else is fixed about them, a masked LM's masks) at ``starts``; scored per
        byte with ``token_lengths`` (a subword vocabulary's)."""
        return HeldOut(tokens, starts, seq_len, token_lengths=token_lengths)

    def train_batches(self, tokens: np.ndarray | Tokens, config: Any, dist: Any) -> WindowBatches | VocabBatches:
        if isinstance(tokens, Tokens):
            return VocabBatches({v: self.train_batches(tokens.at(v), config, dist) for v in tokens.sizes})
        check_length(tokens, config.seq_len, "training")
        return WindowBatches(tokens, self, config.batch_size, config.seq_len, config.seed, dist.rank, dist.world)

    def evaluator(self, tokens: np.ndarray | Tokens, config: Any) -> Score:
        c = config
        if isinstance(tokens, Tokens):
            per = {v: self.evaluator_at(tokens.at(v), c, tokens.lengths) for v in tokens.sizes}
            return lambda model, subnet: per[model_vocab(model, subnet, tokens.sizes)](model, subnet)
        return self.evaluator_at(tokens, c)

    def evaluator_at(self, tokens: np.ndarray, config: Any, token_lengths: np.ndarray | None = None) -> Score:
        """The held-out score on one token array (bits per byte of text with ``token_lengths``)."""
        check_length(tokens, config.seq_len, "validation")
        c = config

        def score(model: nn.Module, subnet: Subnet | None) -> float:
            starts = eval_starts(len(tokens), c.batch_size, c.seq_len, c.eval_batches, c.seed)
            return self.heldout(tokens, starts, c.seq_len, token_lengths).bits(model, subnet, c.batch_size)

        return score


class NextToken(WindowLearner):
    """The targets are the inputs shifted by one; every position is scored (a decoder's next-byte prediction)."""

    def batch(self, tokens: np.ndarray, starts: np.ndarray, rows: slice, seq_len: int, step: int) -> tuple[Tensor, Tensor]:
        x, y = windows(tokens, starts[rows], seq_len)  # (b, T) each
        return torch.from_numpy(x), torch.from_numpy(y)

    def loss(self, logits: Tensor, targets: Tensor, per: float | None = None) -> Tensor:
        assert per is None, "windows of equal length: every rank's mean"
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())  # mean over B*T, nats

    def kl(self, student: Tensor, teacher: Tensor, targets: Tensor, per: float | None = None) -> Tensor:
        return kl_rows(student.flatten(0, 1), teacher.flatten(0, 1))

    def to_dict(self) -> dict[str, Any]:
        return {}


@dataclass(frozen=True)
class Examples:
    """Fixed-length examples: ``inputs`` and ``targets`` (N, T) integers (batches are int64; a large set may be stored
    narrower), targets :data:`IGNORE` where a position is not
    scored (a sequence classification's: all but the position that predicts the label)."""

    inputs: np.ndarray
    targets: np.ndarray

    def __post_init__(self) -> None:
        assert self.inputs.shape == self.targets.shape and self.inputs.ndim == 2, (self.inputs.shape, self.targets.shape)

    def __len__(self) -> int:
        return len(self.inputs)


@dataclass(frozen=True)
class ExampleBatches:
    """Step ``k``'s batch: ``batch_size`` examples drawn by ``default_rng([seed, 0, k])`` (the global batch), this rank's
    rows of it (int64)."""

    examples: Examples
    batch_size: int
    seed: int
    rank: int = 0
    world: int = 1
    sampler: str = "examples drawn by default_rng([seed, 0, step])"

    def __call__(self, step: int) -> Batch:
        mine = draw(self.seed, step, len(self.examples), self.batch_size)[rank_rows(self.batch_size, self.rank, self.world)]
        x, y = (torch.from_numpy(a[mine].astype(np.int64, copy=False)) for a in (self.examples.inputs, self.examples.targets))
        return Batch((x,), y, int(self.batch_size * self.examples.inputs.shape[1]))


class ExampleLearner:
    """The learner of a task of fixed-length examples (:class:`Examples`: a sequence classification, ...): batches of
    examples, cross-entropy and distillation over the scored positions, the held-out score in bits per scored position
    on the first ``eval_batches x batch_size`` validation examples (the same for every subnet)."""

    metric = "bits/label"
    eval_key = "bpb"
    mixed_precision = True

    def train_batches(self, examples: Examples, config: Any, dist: Any) -> ExampleBatches:
        return ExampleBatches(examples, config.batch_size, config.seed, dist.rank, dist.world)

    def heldout(self, examples: Examples, n: int) -> HeldOut:
        """The first ``n`` examples, fixed."""
        return HeldOut.of(examples.inputs[:n], examples.targets[:n])

    def evaluator(self, examples: Examples, config: Any) -> Score:
        held = self.heldout(examples, config.eval_batches * config.batch_size)
        return lambda model, subnet: held.bits(model, subnet, config.batch_size)

    def loss(self, logits: Tensor, targets: Tensor, per: float | None = None) -> Tensor:
        assert per is None, "examples of equal length: every rank's mean"
        return scored_loss(logits, targets)

    def kl(self, student: Tensor, teacher: Tensor, targets: Tensor, per: float | None = None) -> Tensor:
        return scored_kl(student, teacher, targets)

    def to_dict(self) -> dict[str, Any]:
        return {}


def scored_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean cross-entropy (nats) over the scored positions (targets other than ``IGNORE``)."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=IGNORE)


def task_for(space: Space, *, seed: int = 0, **options: Any) -> Learner:
    """The learner of ``space``'s task for a run of ``seed``; ``options``: the task's own settings (a masked LM's
    ``mask_rate``; None = not given, the task's default).  A setting of another task is refused in one line."""
    task = tasks.of(space)
    given = {k: v for k, v in options.items() if v is not None}
    for name in given:
        if name not in task.learner_options:
            owners = [t.name for t in tasks.tasks().values() if name in t.learner_options]
            raise UserError(f"--{name.replace('_', '-')}: only for a {' or '.join(owners) or 'other'} space; {space.source} "
                            f"is task {space.task}")
    return task.learner(space, seed=seed, **given)


def trained_options(space: Space, meta: dict[str, Any]) -> dict[str, Any]:
    """The task's settings a checkpoint (its ``meta``) was trained with: what its objective's record keeps of them."""
    record = meta.get("objective") or {}
    return {k: record[k] for k in tasks.of(space).learner_options if k in record}
