"""Training: one generic driver for every task, and small objectives that say what a step computes.

:func:`train` owns everything that does not depend on what is trained: AdamW, the
warm-up + cosine schedule, gradient clipping, bf16 autocast on CUDA, optional
``torch.compile``, DistributedDataParallel, JSON Lines metrics, evaluations,
atomic checkpoints, exact resume and SIGINT.  The task's learner (:mod:`supernet.task`) says
what a step's batch is, what a pass's loss and distillation are and what is scored on held-out
data; an :class:`Objective` says, per step, which passes run (which subnets) and how their losses
combine:

* :class:`SandwichObjective` trains a :class:`~supernet.SuperTransformer` by the
  sandwich rule (largest, smallest and N uniformly sampled subnets, gradients
  accumulated) with in-place distillation from the largest subnet;
* :class:`PlainObjective` trains one static model (a subnet on its own, or fine-tuning an extracted one).

Every random choice of a step is drawn from a generator seeded by ``(seed, stream,
step)``, so step ``k`` sees the same batch and the same subnets on every rank and
after any resume: the data position is the step.
"""

from __future__ import annotations

import json
import math
import signal
import time
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

import numpy as np
import torch
import torch.nn as nn
from torch import Tensor

from search_spaces import Space, Subnet, UserError

from .attention.registry import fast_paths
from .checkpoint import load_checkpoint, save_checkpoint
from .data import check_length
from .distributed import SINGLE, Dist
from .heldout import HeldOut, autocast, run_model
from .task import EVAL_STREAM, Batch, Learner, eval_starts, model_vocab, step_vocab, task_for
from .tokenizer import Tokens

# Streams of the per-step generators: default_rng([seed, STREAM, step]) (the data's and evaluation's: supernet.task).
PLAN_STREAM = 1


# --------------------------------------------------------------------------- config


@dataclass(frozen=True)
class TrainConfig:
    """What a run does.  ``batch_size`` is global: it is split evenly across the ranks."""

    batch_size: int = 16
    seq_len: int = 128
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup_steps: int = 100
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    max_steps: int | None = 2000  # total steps; the schedule's horizon unless None
    max_time: float | None = None  # total seconds (over resumes); the horizon when max_steps is None
    eval_interval: int = 250
    eval_batches: int = 16
    ckpt_interval: int = 250
    log_interval: int = 10
    seed: int = 0
    compile: bool = False
    threads: int | None = None  # torch's intra-op CPU threads (None: torch's choice); kept for the resumed run
    log: str = "jsonl"  # of LOGS: log.jsonl always; "tensorboard" also writes TensorBoard event files to OUT/tensorboard
    # what max_time (and a time-bound schedule) counts: "wall" seconds, or "cpu", the training thread's CPU seconds
    # (time.thread_time: with threads=1 every op runs in it, so runs compared at equal time get equal compute on a busy
    # machine; with more threads it undercounts)
    clock: str = "wall"

    # May differ between a run and its resumption (they bound or observe the run, not its maths; ``threads`` does change
    # the float sums, so a resumed run keeps the stored value unless told otherwise, and says so when told).
    RESUMABLE = ("max_steps", "max_time", "eval_interval", "eval_batches", "ckpt_interval", "log_interval", "compile",
                 "threads", "log")

    def __post_init__(self) -> None:
        problems = []
        for name in ("batch_size", "seq_len", "eval_interval", "eval_batches", "ckpt_interval", "log_interval"):
            if getattr(self, name) < 1:
                problems.append(f"--{name.replace('_', '-')}: {getattr(self, name)} is not a positive integer")
        for name in ("lr", "min_lr", "weight_decay", "grad_clip", "warmup_steps"):
            if getattr(self, name) < 0:
                problems.append(f"--{name.replace('_', '-')}: {getattr(self, name)} is negative")
        if self.min_lr > self.lr:
            problems.append(f"--min-lr: {self.min_lr} exceeds --lr {self.lr}")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                problems.append(f"--{name}: {getattr(self, name)} is not in [0, 1)")
        if self.max_steps is None and self.max_time is None:
            problems.append("give --max-steps or --max-time (or both): a run needs a bound")
        if self.max_steps is not None and self.max_steps < 1:
            problems.append(f"--max-steps: {self.max_steps} is not a positive integer")
        if self.max_time is not None and self.max_time <= 0:
            problems.append(f"--max-time: {self.max_time} is not a positive number of seconds")
        if self.threads is not None and (not isinstance(self.threads, int) or self.threads < 1):
            problems.append(f"--threads: {self.threads} is not a positive integer")
        if self.log not in LOGS:
            problems.append(f"--log: {self.log!r} is not one of {', '.join(LOGS)}")
        if self.clock not in CLOCKS:
            problems.append(f"clock: {self.clock!r} is not one of {', '.join(CLOCKS)}")
        if problems:
            raise UserError("\n".join(problems))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if d["threads"] is None:  # absent when not given: the settings (and hashes) of runs from before stay as they were
            del d["threads"]
        if d["log"] == "jsonl":  # likewise
            del d["log"]
        if d["clock"] == "wall":  # likewise
            del d["clock"]
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrainConfig":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


AUTO = "auto"  # --threads auto: the CPUs free here now (supernet.threads)


def resolve_threads(requested: int | str | None, resuming: bool = False) -> int | None:
    """The threads a run asks for: ``requested`` when a number; for ``"auto"``, or nothing asked of a new run (the
    commands' default), the CPUs free here now (:func:`supernet.threads.auto_threads`: this process's CPUs and cgroup
    quota, less what other processes keep busy), as a number, so the run records it and its resumption sums alike;
    None for a resumed run that asked nothing (it keeps its own)."""
    if requested == AUTO or (requested is None and not resuming):
        from .threads import auto_threads

        return auto_threads().threads
    assert requested is None or isinstance(requested, int), requested
    return requested


def use_threads(config: TrainConfig, stored: dict[str, Any] | None = None, say: Callable[[str], None] | None = None) -> None:
    """Run on the run's CPU threads (``config.threads``: what :func:`resolve_threads` chose, a number; None leaves
    torch's setting).  ``stored``: the train_config of the run being resumed; where its threads differ from these,
    ``say`` is told the result will not be bit-identical."""
    if config.threads is not None and torch.get_num_threads() != config.threads:
        torch.set_num_threads(config.threads)
    before = (stored or {}).get("threads")
    if stored is not None and before != config.threads and say is not None:
        say(f"threads {config.threads or 'torch default'}, the run's earlier part {before or 'torch default'}: the float sums "
            "differ, so the result will not be bit-identical to an uninterrupted run")


# --------------------------------------------------------------------------- schedule


@dataclass(frozen=True)
class WarmupCosine:
    """Linear warm-up over ``warmup_steps``, then cosine from ``lr`` to ``min_lr`` over the run.

    The run's progress is ``step / max_steps``, or ``elapsed / max_time`` when only a time
    budget is given (then the schedule follows the run's clock, ``TrainConfig.clock``, and is not bit-reproducible).
    ``restart``: a learner of two phases (:attr:`Learner.phase_steps`: a sequence classification's self-pretraining)
    has a schedule of its own in each: warm-up and cosine over the first ``restart`` steps, then again over the rest.
    """

    lr: float
    min_lr: float
    warmup_steps: int
    max_steps: int | None
    max_time: float | None
    restart: int = 0

    @classmethod
    def from_config(cls, config: TrainConfig, restart: int = 0) -> "WarmupCosine":
        return cls(config.lr, config.min_lr, config.warmup_steps, config.max_steps, config.max_time, restart)

    def progress(self, step: int, elapsed: float) -> float:
        if self.max_steps is not None:
            return min(1.0, step / self.max_steps)
        return min(1.0, elapsed / self.max_time)

    def __call__(self, step: int, elapsed: float) -> float:
        if self.restart and self.max_steps is not None:  # (a phased run is bounded by steps: Trainer checks)
            local, horizon = (step, self.restart) if step < self.restart else (step - self.restart, self.max_steps - self.restart)
            progress = min(1.0, local / horizon)
        else:
            local, progress = step, self.progress(step, elapsed)
        warm = min(1.0, (local + 1) / self.warmup_steps) if self.warmup_steps else 1.0
        cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
        return warm * (self.min_lr + (self.lr - self.min_lr) * cosine)

    def state_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if not d["restart"]:
            del d["restart"]
        return {"kind": "warmup-cosine", **d}


# --------------------------------------------------------------------------- objectives


Plan = list[tuple[str, Subnet | None]]  # (name, subnet) per pass; subnet None = a static model


class Objective(Protocol):
    """Per step: which passes run and what each pass's loss is.

    Call order per step: ``plan(step)``; then for each pass ``i`` in order the trainer runs the
    model on the batch (the learner's ``train_batches``) and calls ``loss(i, logits, targets, memo, per)``,
    then backpropagates it.  ``memo`` is a fresh dict per step, for what one pass hands to the next (e.g. soft
    targets); ``per``: the batch's normaliser (:attr:`supernet.task.Batch.per`).
    """

    def plan(self, step: int) -> Plan: ...

    def loss(self, index: int, logits: Tensor, targets: Tensor, memo: dict, per: float | None = None) -> tuple[Tensor, Tensor]:
        """(loss to backpropagate, its cross-entropy part detached, per scored position, for logging)."""
        ...

    def eval_subnets(self) -> dict[str, Subnet | None]: ...

    def fixed_subnets(self) -> set[Subnet | None]:
        """The subnets every step runs: with ``compile``, only these passes are compiled (once each)."""
        ...

    # Optional: ``before_step(model, step, progress) -> str | None`` changes the model before step ``step`` (progress:
    # the run's fraction done, 0..1) and says what it did; ``usage(steps) -> {attention type: layer-passes}`` of the
    # first ``steps`` steps (reported at each validation and written to ``OUT/type_passes.json``).

    def to_dict(self) -> dict[str, Any]: ...

    @property
    def task(self) -> Learner:
        """What is learned (:mod:`supernet.task`): the batches, the losses and the held-out scoring."""
        ...


def _pass_loss(task: Learner, logits: Tensor, targets: Tensor, per: float | None) -> tuple[Tensor, Tensor]:
    """(the cross-entropy to backpropagate, normalised by ``per``; the one logged: per scored position of this rank)."""
    ce = task.loss(logits, targets, per)
    return ce, ce.detach() if per is None else task.loss(logits.detach(), targets).detach()


CLOCKS = ("wall", "cpu")  # TrainConfig.clock: what a run's elapsed seconds count
LOGS = ("jsonl", "tensorboard")  # --log: training metrics as log.jsonl alone, or also as TensorBoard event files
BALANCES = ("types", "first")  # --balance: the sandwich's largest / smallest rotate over the types, or use the first
SPLITS = ("none", "families")  # --split: one Q/K/V/O for every type, or one per attention family (few-shot NAS)


@dataclass(frozen=True)
class SandwichObjective:
    """Largest, smallest and ``n_random`` uniformly sampled subnets per step; in-place distillation.

    The largest subnet learns from the data.  Every smaller one learns from
    ``(1 - distill) * CE(data) + distill * KL(largest || it)``, the largest subnet's
    predictions taken as fixed soft targets.  Both terms are over the ``task``'s scored positions (for
    a masked LM: the chosen ones).  ``task``: the learner (default: the space's task's, :func:`supernet.task.task_for`).

    ``balance="types"``: step ``k``'s largest and smallest subnets have every layer of the space's type
    ``k mod n`` (FairNAS's rule: each type is the sandwich's largest, smallest and teacher equally often; the
    sampled ones draw types uniformly already).  ``"first"``: both always use the first listed type (the
    rule before; a resumed run of that time keeps it): with 11 types that trains the first about 12x more.
    An encoder-decoder's space rotates over the types both its sides offer (its ``attention``), every layer of both
    sides of type ``t`` in its ``largest(t)`` and ``smallest(t)``.

    ``split="families"``: from the step where the run's progress reaches ``split_at``, each attention family
    (``AttentionType.family``) has its own Q/K/V/O, warm-started from the shared ones then
    (:meth:`~supernet.SuperTransformer.split_families`; few-shot NAS's split of a one-shot supernet).
    """

    space: Space
    n_random: int = 2
    distill: float = 0.5
    seed: int = 0
    n_eval_random: int = 3
    task: Learner | None = None
    balance: str = "types"
    split: str = "none"
    split_at: float = 0.5

    def __post_init__(self) -> None:
        if self.task is None:
            object.__setattr__(self, "task", task_for(self.space, seed=self.seed))
        if self.n_random < 0:
            raise UserError(f"--random-subnets: {self.n_random} is negative")
        if not 0.0 <= self.distill <= 1.0:
            raise UserError(f"--distill: {self.distill} is not between 0 and 1")
        if self.balance not in BALANCES:
            raise UserError(f"--balance: {self.balance!r} is not one of {', '.join(BALANCES)}")
        if self.split not in SPLITS:
            raise UserError(f"--split: {self.split!r} is not one of {', '.join(SPLITS)}")
        if not 0.0 <= self.split_at < 1.0:  # NaN fails too
            raise UserError(f"--split-at: {self.split_at} is not a fraction of the run in [0, 1)")

    @property
    def types(self) -> tuple[str, ...]:
        """The attention types the extremes are built of: a one-stack space's list; none for a space of a task's own
        shape (an encoder-decoder's sides list their own), whose extremes are its ``largest()`` and ``smallest()``."""
        return tuple(getattr(self.space, "attention", ()))

    def sandwich_type(self, step: int) -> str | None:
        """The attention type of step ``step``'s largest and smallest subnets (None: the space's own extremes)."""
        types = self.types
        if not types:
            return None
        return types[step % len(types)] if self.balance == "types" else types[0]

    def extremes(self, t: str | None) -> tuple[Subnet, Subnet]:
        """The largest and smallest subnets of type ``t`` (None: the space's own)."""
        return (self.space.largest(), self.space.smallest()) if t is None else (self.space.largest(t), self.space.smallest(t))

    def step_vocab(self, step: int) -> int | None:
        """The vocabulary every subnet of step ``step`` reads, for a space that searches it (None otherwise): the sizes in
        turn, each held for one round of the types, so that the teacher and its students always share token boundaries
        and the distillation compares distributions over the same ids (docs/tokenizers.md)."""
        tokenizer = getattr(self.space, "tokenizer", None)
        if tokenizer is None or not tokenizer.searched:
            return None
        period = len(self.types) if self.balance == "types" and self.types else 1
        return step_vocab(self.space.vocabs, step, period)

    def plan(self, step: int) -> Plan:
        rng = np.random.default_rng([self.seed, PLAN_STREAM, step])
        random = [(f"random{i}", self.space.sample(rng)) for i in range(self.n_random)]
        largest, smallest = self.extremes(self.sandwich_type(step))
        plan = [("largest", largest), ("smallest", smallest), *random]
        vocab = self.step_vocab(step)
        return plan if vocab is None else [(name, replace(s, vocab=vocab)) for name, s in plan]

    def before_step(self, model: nn.Module, step: int, progress: float) -> str | None:
        """Split the projections by family once the run's ``progress`` (0..1) reaches ``split_at``; what happened, or None."""
        if self.split != "families" or model.families_split or progress < self.split_at:
            return None
        model.split_families()
        return f"step {step}: each attention family has its own Q/K/V/O from here ({', '.join(model.families)})"

    def usage(self, steps: int) -> dict[str, int]:
        """Layer-passes per attention type of the first ``steps`` steps (every pass of every layer counts one); empty for
        a space without one list of types."""
        if not self.types:
            return {}
        counts = dict.fromkeys(self.space.attention, 0)
        for step in range(steps):
            for _, subnet in self.plan(step):
                for a in subnet.attention:
                    counts[a] += 1
        return counts

    def loss(self, index: int, logits: Tensor, targets: Tensor, memo: dict, per: float | None = None) -> tuple[Tensor, Tensor]:
        ce, logged = _pass_loss(self.task, logits, targets, per)
        if index == 0:
            memo["teacher"] = logits.detach().float().log_softmax(-1)  # (B, T, V)
            return ce, logged
        if self.distill == 0.0:
            return ce, logged
        student = logits.float().log_softmax(-1)  # (B, T, V)
        kd = self.task.kl(student, memo["teacher"], targets, per)
        return (1.0 - self.distill) * ce + self.distill * kd, logged

    def eval_subnets(self) -> dict[str, Subnet | None]:
        rng = np.random.default_rng([self.seed, EVAL_STREAM])
        fixed = {f"random{i}": self.space.sample(rng) for i in range(self.n_eval_random)}
        return {"largest": self.space.largest(), "smallest": self.space.smallest(), **fixed}

    def fixed_subnets(self) -> set[Subnet | None]:
        types = (self.types if self.balance == "types" else self.types[:1]) or (None,)
        fixed = {s for t in types for s in self.extremes(t)}
        if self.step_vocab(0) is None:
            return fixed
        return {replace(s, vocab=v) for s in fixed for v in self.space.vocabs}

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "sandwich",
            "n_random": self.n_random,
            "distill": self.distill,
            "seed": self.seed,
            "n_eval_random": self.n_eval_random,
            "balance": self.balance,
            **({"split": self.split, "split_at": self.split_at} if self.split != "none" else {}),
            **self.task.to_dict(),
        }


@dataclass(frozen=True)
class PlainObjective:
    """One pass of one static model, cross-entropy on the data (``task``: the learner, :func:`supernet.task.task_for`)."""

    task: Learner

    def plan(self, step: int) -> Plan:
        return [("model", None)]

    def loss(self, index: int, logits: Tensor, targets: Tensor, memo: dict, per: float | None = None) -> tuple[Tensor, Tensor]:
        return _pass_loss(self.task, logits, targets, per)

    def eval_subnets(self) -> dict[str, Subnet | None]:
        return {"model": None}

    def fixed_subnets(self) -> set[Subnet | None]:
        return {None}

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "plain", **self.task.to_dict()}


# --------------------------------------------------------------------------- evaluation


@torch.no_grad()
def evaluate_bpb(
    model: nn.Module,
    subnet: Subnet | None,
    tokens: np.ndarray,
    batch_size: int,
    seq_len: int,
    n_batches: int,
    seed: int,
    task: Learner | None = None,
) -> float:
    """Bits per byte of ``model`` (running ``subnet``; None for a static model) on fixed windows of ``tokens``, every
    position scored; with a window ``task`` (:class:`supernet.task.WindowLearner`) its held-out windows (bits per
    masked byte for a masked LM).

    The windows (and masks) depend only on ``seed`` and the sizes, so every subnet and every call sees
    the same bytes.  Runs in eval mode without gradients (bf16 autocast on CUDA).
    """
    check_length(tokens, seq_len, "validation")
    starts = eval_starts(len(tokens), batch_size, seq_len, n_batches, seed)
    held = HeldOut(tokens, starts, seq_len) if task is None else task.heldout(tokens, starts, seq_len)
    return held.bits(model, subnet, batch_size)


# --------------------------------------------------------------------------- checkpoints


class CompiledFor(nn.Module):
    """Runs ``torch.compile``d code for the ``fixed`` subnets and eager code for the rest.

    A compiled supernet would recompile for every sampled subnet (their shapes differ); the
    largest and smallest run every step, so compiling just those pays off.  The compiled
    module shares the parameters (it is kept outside the module tree, so DDP sees them once).
    """

    def __init__(self, model: nn.Module, fixed: set[Subnet | None]):
        super().__init__()
        self.model = model
        self.fixed = fixed
        object.__setattr__(self, "_compiled", torch.compile(model, dynamic=False))

    def forward(self, *inputs: Tensor, subnet: Subnet | None = None) -> Tensor:
        if subnet not in self.fixed:
            return run_model(self.model, inputs, subnet)
        with fast_paths():  # the types' fast paths (torch 2.11 calls a compile an export)
            return run_model(self._compiled, inputs, subnet)


class Checkpointer(Protocol):
    """Where the trainer's state goes.  ``load`` returns a dict with ``model``, ``state`` and ``meta``."""

    def save(self, path: Path, model: nn.Module, state: dict[str, Any], meta: dict[str, Any]) -> None: ...

    def load(self, path: Path) -> dict[str, Any]: ...


@dataclass(frozen=True)
class SupernetCheckpointer:
    """Supernet checkpoints (:mod:`supernet.checkpoint`): atomic, weights_only, checked against the space."""

    space: Space

    def save(self, path: Path, model: nn.Module, state: dict[str, Any], meta: dict[str, Any]) -> None:
        save_checkpoint(path, model, state, **meta)

    def load(self, path: Path) -> dict[str, Any]:
        return load_checkpoint(path, self.space)


# --------------------------------------------------------------------------- the driver


@dataclass(frozen=True)
class StepInfo:
    """What the progress callback sees after each step."""

    step: int
    max_steps: int | None
    elapsed: float
    max_time: float | None
    lr: float
    losses: dict[str, float]  # cross-entropy (nats) of each pass of this step
    subnets: tuple[str, ...]  # keys of the subnets this step ran (for checking ranks agree)
    tokens_per_s: float
    loss_unit: str = "nats"  # what ``losses`` are per: "nats/byte" beside a held-out "bits/byte" (:func:`loss_unit`)


def loss_unit(metric: str, subword: bool = False) -> str:
    """The unit of the training loss (cross-entropy in nats per scored position) of a learner whose held-out score is
    ``metric``, so that a progress line says what its number is beside the validation's: ``bits/byte`` -> ``nats/byte``,
    ``bits/masked byte`` -> ``nats/masked byte``, ``bits/label`` -> ``nats/label`` (a metric without a ``/``: ``nats``).
    ``subword``: the model reads a BPE, so a scored position is a token, not a byte (``nats/target byte`` ->
    ``nats/target token``), while the held-out score stays per byte."""
    if "/" not in metric:
        return "nats"
    per = metric.split("/", 1)[1].strip()
    return f"nats/{per.replace('byte', 'token') if subword else per}"


@dataclass
class TrainResult:
    step: int
    elapsed: float
    tokens: int
    stopped: str  # "max_steps", "max_time" or "interrupted"
    evals: list[dict] = field(default_factory=list)
    checkpoint: Path | None = None


class _Interrupt:
    """SIGINT or SIGTERM sets a flag (the step finishes, a checkpoint is saved); a second one aborts at once."""

    def __init__(self) -> None:
        self.requested = False

    def __call__(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True


def reads_subwords(objective: Any, model: nn.Module | None, data: Any = None) -> bool:
    """Whether what trains reads a byte-level BPE (the sandwich objective's space, the static model's, or a corpus read
    at subword vocabularies): its training positions are tokens (bytes are the tokens of its smallest vocabulary when
    it searches the size)."""
    if isinstance(data, Tokens):
        return True
    space = getattr(objective, "space", None) or getattr(model, "space", None)
    tokenizer = getattr(space, "tokenizer", None)
    return bool(tokenizer is not None and tokenizer.bpe)


@contextmanager
def _catch_interrupts() -> Iterator[_Interrupt]:
    flag = _Interrupt()
    previous = {}
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, flag)
    except ValueError:  # not the main thread: leave signals alone
        pass
    try:
        yield flag
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class JsonlLog:
    """Metrics as JSON Lines; on resume, lines past the checkpoint's step are dropped (they are redone)."""

    def __init__(self, path: Path | None, resume_step: int | None = None):
        self.path = path
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is not None and path.exists():
            keep = [line for line in path.read_text().splitlines() if _line_step(line) <= resume_step]
            path.write_text("".join(line + "\n" for line in keep))
        elif resume_step is None:
            path.write_text("")

    def write(self, event: str, **values: Any) -> None:
        if self.path is not None:
            with self.path.open("a") as f:
                f.write(json.dumps({"event": event, "time": round(time.time(), 3), **values}) + "\n")


def check_log(log: str) -> None:
    """Refuse ``--log tensorboard`` where the tensorboard package is missing, in one line, before a run prepares its
    data or makes its folder (not after the corpus is cached)."""
    if log != "tensorboard":
        return
    try:
        import tensorboard  # noqa: F401 - (light: the package loads its parts lazily)
    except ImportError:
        raise UserError("--log tensorboard: the tensorboard package is not installed "
                        "(pip install 'nas-transformers[tensorboard]')") from None


class TensorBoardLog(JsonlLog):
    """log.jsonl, and the same training and validation scalars as TensorBoard event files in ``folder``
    (``tensorboard --logdir OUT/tensorboard``).  log.jsonl is the record: a resumed run rewrites the event files from
    its kept lines (those past the checkpoint's step were dropped), so its curves are the uninterrupted run's, each
    step once."""

    def __init__(self, path: Path, folder: Path, resume_step: int | None = None):
        super().__init__(path, resume_step)
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise UserError("--log tensorboard: the tensorboard package is not installed "
                            "(pip install 'nas-transformers[tensorboard]')") from e  # fmt: skip
        for old in folder.glob("events.out.tfevents.*"):
            old.unlink()
        self.writer = SummaryWriter(str(folder))
        for line in path.read_text().splitlines() if resume_step is not None and path.exists() else ():
            record = json.loads(line)
            self._scalars(record.pop("event"), record)
        self.writer.flush()

    def write(self, event: str, **values: Any) -> None:
        super().write(event, **values)
        self._scalars(event, values)
        if event == "end":
            self.writer.close()
        else:
            self.writer.flush()

    def _scalars(self, event: str, values: dict[str, Any]) -> None:
        step = values.get("step")
        if event == "train":
            for name, loss in values["loss"].items():
                self.writer.add_scalar(f"train/loss/{name}", loss, step)
            self.writer.add_scalar("train/lr", values["lr"], step)
            self.writer.add_scalar("train/tokens_per_s", values["tokens_per_s"], step)
        elif event == "eval":
            for key, scores in values.items():
                if isinstance(scores, dict):
                    for name, score in scores.items():
                        self.writer.add_scalar(f"validation/{key}/{name}", score, step)


def metrics_log(out: Path | None, config: TrainConfig, resume_step: int | None) -> JsonlLog:
    """Where metrics go: ``out/log.jsonl`` (and ``out/tensorboard`` with ``--log tensorboard``); nowhere without ``out``."""
    if out is None:
        return JsonlLog(None)
    if config.log == "tensorboard":
        return TensorBoardLog(out / "log.jsonl", out / "tensorboard", resume_step)
    return JsonlLog(out / "log.jsonl", resume_step)


def _line_step(line: str) -> float:
    try:
        return json.loads(line).get("step", -1)
    except json.JSONDecodeError:
        return math.inf  # a torn last line of a killed run: drop it


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices and embeddings, not biases and norm gains (nanoGPT)."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def rng_state(device: torch.device) -> dict[str, Any]:
    state = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


class Trainer:
    """One run: the optimizer, the schedule and the counters, and the pieces of a step.

    :func:`train` drives it; the objective decides which passes a step runs, the task's learner what its
    batches, losses and held-out scores are.
    """

    def __init__(self, model, objective, train_data, val_data, config, out, checkpointer, meta, dist, report):
        self.model, self.objective, self.config, self.dist = model, objective, config, dist
        self.learner: Learner = objective.task
        self.device = next(model.parameters()).device
        if config.batch_size % dist.world:
            raise UserError(f"--batch-size: {config.batch_size} does not split evenly across {dist.world} ranks")
        self.batches = self.learner.train_batches(train_data, config, dist)
        self.score = self.learner.evaluator(val_data, config)
        self.out, self.checkpointer = out, checkpointer
        self.latest = out / "latest.pt" if out is not None else None
        self.say = report if (report is not None and dist.is_main) else (lambda text: None)
        self.meta = {**(meta or {}), "seed": config.seed, "train_config": config.to_dict(), "objective": objective.to_dict(),
                     "world_size": dist.world, "torch": str(torch.__version__)}
        self.optimizer = torch.optim.AdamW(
            param_groups(model, config.weight_decay), lr=config.lr, betas=(config.beta1, config.beta2)
        )
        self.phase = int(getattr(self.learner, "phase_steps", 0) or 0)  # where a learner's second phase starts (0: none)
        if self.phase and (config.max_steps is None or self.phase >= config.max_steps):
            raise UserError(f"a run of two phases (the first {self.phase} steps) needs --max-steps beyond them (the "
                            f"schedule starts again at step {self.phase}); got --max-steps {config.max_steps}")
        self.schedule = WarmupCosine.from_config(config, self.phase)
        self.step, self.elapsed, self.tokens = 0, 0.0, 0
        self.evals: list[dict] = []
        self.evaluated_at = -1
        self.log = JsonlLog(None)
        self.fwd = CompiledFor(model, objective.fixed_subnets()) if config.compile else model
        if dist.enabled:
            from torch.nn.parallel import DistributedDataParallel as DDP

            # Passes of smaller subnets leave parameters unused (the same ones on every rank).
            device_ids = [self.device.index] if self.device.type == "cuda" else None
            self.fwd = DDP(self.fwd, device_ids=device_ids, find_unused_parameters=True)

    # -- state ------------------------------------------------------------------------

    def restore(self, ckpt: dict[str, Any]) -> None:
        self.model.load_state_dict(ckpt["model"])
        state = ckpt["state"]
        try:
            self.optimizer.load_state_dict(state["optimizer"])
            set_rng_state(state["rng"], self.device)
            self.step, self.elapsed, self.tokens = state["step"], state["elapsed"], state["tokens"]
        except (KeyError, ValueError, RuntimeError) as e:
            raise UserError(f"{self.latest}: checkpoint holds no resumable trainer state ({type(e).__name__}: {e})") from None

    def save(self, path: Path, stopped: str | None) -> None:
        if self.checkpointer is None or not self.dist.is_main:
            return
        state = {
            "optimizer": self.optimizer.state_dict(),
            "schedule": self.schedule.state_dict(),
            "rng": rng_state(self.device),
            "data": {"position": self.step, "sampler": self.batches.sampler},
            "step": self.step,
            "elapsed": self.elapsed,
            "tokens": self.tokens,
        }
        self.checkpointer.save(path, self.model, state, {**self.meta, "step": self.step, "stopped": stopped})
        self.log.write("checkpoint", step=self.step, path=str(path))

    # -- the loop's pieces ------------------------------------------------------------

    def stop_reason(self, interrupted: bool) -> str:
        """Why to stop before the next step ("" to go on); every rank gets the same answer."""
        c = self.config
        reached_steps = c.max_steps is not None and self.step >= c.max_steps
        reached_time = c.max_time is not None and self.elapsed >= c.max_time
        stop, self.elapsed = self.dist.agree(interrupted or reached_steps or reached_time, self.elapsed, self.device)
        if not stop:
            return ""
        return (
            "interrupted"
            if interrupted or not (reached_steps or reached_time)
            else ("max_steps" if reached_steps else "max_time")
        )

    def batch(self, plan: Plan | None = None) -> Batch:
        """This rank's share of step ``step``'s batch, on the device: read at the vocabulary of the ``plan``'s subnets
        where the data has several (a space that searches it: every subnet of a step reads the same one)."""
        at = getattr(self.batches, "at", None)
        if at is None or plan is None:
            return self.batches(self.step).to(self.device)
        vocabs = {model_vocab(self.model, s, self.batches.sizes) for _, s in plan}
        assert len(vocabs) == 1, f"the passes of step {self.step} read vocabularies {sorted(vocabs)}"
        return at(vocabs.pop())(self.step).to(self.device)

    def train_step(self) -> tuple[Plan, dict[str, float], float, int]:
        """One optimizer step over the objective's passes, gradients accumulated (synchronised on the last);
        (plan, each pass's cross-entropy, lr, tokens trained on)."""
        lr = self.schedule(self.step, self.elapsed)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        before = getattr(self.objective, "before_step", None)
        if before is not None and (note := before(self.model, self.step, self.schedule.progress(self.step, self.elapsed))):
            self.say(note)
            self.log.write("note", step=self.step, note=note)
        if self.phase and self.step == self.phase:  # the second phase: the optimizer's moments start again too
            self.optimizer.state.clear()
            note = f"step {self.step}: the second phase starts (schedule and optimizer moments start again)"
            self.say(note)
            self.log.write("note", step=self.step, note=note)
        plan = self.objective.plan(self.step)
        b = self.batch(plan)
        memo: dict = {}
        ces = []
        amp = autocast(self.device) if self.learner.mixed_precision else nullcontext()
        for i, (_, subnet) in enumerate(plan):
            sync = not self.dist.enabled or i == len(plan) - 1
            with (nullcontext() if sync else self.fwd.no_sync()), amp:
                logits = run_model(self.fwd, b.inputs, subnet)  # (b, T, V)
                loss, ce = self.objective.loss(i, logits, b.targets, memo, b.per)
            (loss / len(plan)).backward()
            ces.append(ce)
        if self.config.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.tokens += b.tokens
        return plan, dict(zip((name for name, _ in plan), torch.stack(ces).tolist())), lr, b.tokens

    def report_usage(self) -> None:
        """Layer-passes per attention type so far (objectives with ``usage``): logged, said, and ``OUT/type_passes.json``."""
        usage = getattr(self.objective, "usage", None)
        if usage is None or self.step == 0:
            return
        counts = usage(self.step)
        if not counts:
            return
        used = [n for n in counts.values() if n]
        ratio = max(used) / min(used) if used and len(used) == len(counts) else math.inf
        self.log.write("type_passes", step=self.step, passes=counts, max_over_min=round(ratio, 3))
        self.say(f"layer-passes per attention type over {self.step} steps (max/min {ratio:.2f}): "
                 + ", ".join(f"{k} {v}" for k, v in counts.items()))
        if self.out is not None:
            from .files import atomic_write

            doc = {"step": self.step, "passes": counts, "max_over_min": ratio if math.isfinite(ratio) else None}
            atomic_write(self.out / "type_passes.json", json.dumps(doc, indent=1) + "\n")

    def evaluate(self) -> None:
        """The held-out score (the learner's metric) of the objective's evaluation subnets (rank 0; the others wait)."""
        self.evaluated_at = self.step
        if self.dist.is_main:
            t0, key = time.perf_counter(), self.learner.eval_key
            scores = {name: self.score(self.model, subnet) for name, subnet in self.objective.eval_subnets().items()}
            self.evals.append({"step": self.step, key: scores})
            self.log.write("eval", step=self.step, **{key: scores}, seconds=round(time.perf_counter() - t0, 3))
            text = "  ".join(f"{k} {v:.3f}" for k, v in scores.items())
            self.say(f"step {self.step}: validation {self.learner.metric}  {text}")
            self.report_usage()
        self.dist.barrier()


def train(
    model: nn.Module,
    objective: Objective,
    train_data: Any,
    val_data: Any,
    config: TrainConfig,
    *,
    out: Path | None = None,
    checkpointer: Checkpointer | None = None,
    meta: dict[str, Any] | None = None,
    resume: bool | dict[str, Any] = False,
    dist: Dist = SINGLE,
    progress: Callable[[StepInfo], None] | None = None,
    report: Callable[[str], None] | None = None,
) -> TrainResult:
    """Train ``model`` (already on its device) until ``max_steps`` or ``max_time``, or SIGINT / SIGTERM.

    ``train_data`` / ``val_data``: the task's (a token array for the byte LMs, sentence pairs for translation), read
    through the objective's learner (``objective.task``).

    With ``out`` and ``checkpointer``: ``out/latest.pt`` every ``ckpt_interval`` steps, on SIGINT
    or SIGTERM and at the end, ``out/final.pt`` when the run reaches its bound, ``out/log.jsonl`` metrics.
    ``resume`` continues from ``out/latest.pt`` exactly where it was written (pass the
    checkpoint dict instead of True if the caller has already loaded it).  ``meta`` is stored
    in every checkpoint (with the step).  Only rank 0 writes files; ``progress`` is called on
    every rank it is given to, ``report`` (human-readable lines) on rank 0.
    """
    t = Trainer(model, objective, train_data, val_data, config, out, checkpointer, meta, dist, report)
    resuming = resume is not False
    if resuming:
        if t.latest is None or checkpointer is None:
            raise UserError("resume needs a run directory (--out) with checkpoints")
        if not t.latest.exists():
            raise UserError(f"--resume: {out} holds no checkpoint (latest.pt); start a new run without --resume")
        resume = resume if isinstance(resume, dict) else checkpointer.load(t.latest)
        use_threads(config, resume.get("meta", {}).get("train_config", {}), t.say)
        t.restore(resume)
        t.say(f"resumed from {t.latest} at step {t.step}")
    else:
        use_threads(config)
    t.log = metrics_log(out if dist.is_main else None, config, t.step if resuming else None)
    t.log.write("resume" if resuming else "start", step=t.step, meta=_jsonable(t.meta))

    model.train()
    clock = run_clock(config)
    unit = loss_unit(t.learner.metric, reads_subwords(objective, model, train_data))  # the progress lines' loss unit
    window_t, window_tokens = time.perf_counter(), 0
    with _catch_interrupts() as interrupt:
        while not (stopped := t.stop_reason(interrupt.requested)):
            c0 = clock()
            plan, losses, lr, step_tokens = t.train_step()
            now, c1 = time.perf_counter(), clock()
            t.elapsed += c1 - c0
            window_tokens += step_tokens
            rate = window_tokens / max(now - window_t, 1e-9)
            if t.step % config.log_interval == 0 or t.step == config.max_steps:
                t.log.write(
                    "train",
                    step=t.step,
                    lr=lr,
                    loss=losses,
                    tokens=t.tokens,
                    tokens_per_s=round(rate, 1),
                    elapsed=round(t.elapsed, 3),
                )
                window_t, window_tokens = now, 0
            if progress is not None:
                keys = tuple(s.key if s is not None else "" for _, s in plan)
                progress(StepInfo(t.step, config.max_steps, t.elapsed, config.max_time, lr, losses, keys, rate,
                                  unit))
            evaluate, save = t.step % config.eval_interval == 0, t.latest is not None and t.step % config.ckpt_interval == 0
            if evaluate:
                t.evaluate()
            if save:
                t.save(t.latest, None)
            if evaluate or save:
                window_t, window_tokens = time.perf_counter(), 0  # tokens/s measures training only
            t.elapsed += clock() - c1  # evaluations and checkpoints count against --max-time

        if stopped != "interrupted" and t.evaluated_at != t.step:
            t.evaluate()
        checkpoint = None
        if t.latest is not None and checkpointer is not None:
            t.save(t.latest, stopped)
            checkpoint = t.latest
            if stopped != "interrupted":
                checkpoint = out / "final.pt"
                t.save(checkpoint, stopped)
    t.log.write("end", step=t.step, stopped=stopped, elapsed=round(t.elapsed, 3), tokens=t.tokens)
    return TrainResult(t.step, t.elapsed, t.tokens, stopped, t.evals, checkpoint)


def run_clock(config: TrainConfig) -> Callable[[], float]:
    """What a run's elapsed seconds are read from: the wall clock, or the training thread's CPU time (``clock="cpu"``)."""
    return time.thread_time if config.clock == "cpu" else time.perf_counter


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


# --------------------------------------------------------------------------- training a static model


class Distilled(nn.Module):
    """A static ``student`` that, while training, also runs a frozen ``teacher`` on the same input.

    Only the student is a submodule (the optimizer, checkpoints and evaluations see only it);
    the teacher's log-probabilities of the last training forward wait in ``teacher_logp`` for
    :class:`DistillObjective`.  In eval mode the teacher is not run.
    """

    def __init__(self, student: nn.Module, teacher: nn.Module | None = None):
        super().__init__()
        self.student = student
        object.__setattr__(self, "teacher", teacher.eval().requires_grad_(False) if teacher is not None else None)
        self.teacher_logp: Tensor | None = None

    def forward(self, *inputs: Tensor) -> Tensor:
        """``inputs``: what the student takes (a sequence, images, or an encoder-decoder's source and target)."""
        if self.training and self.teacher is not None:
            with torch.no_grad():
                self.teacher_logp = self.teacher(*inputs).float().log_softmax(-1)  # (B, T, V)
        return self.student(*inputs)  # (B, T, V)


@dataclass(frozen=True)
class DistillObjective:
    """One pass of a :class:`Distilled` student: ``(1 - distill) * CE + distill * KL(teacher || student)``."""

    model: Distilled
    distill: float = 0.5
    task: Learner | None = None  # the learner (supernet.task.task_for): required

    def __post_init__(self) -> None:
        assert self.task is not None, "DistillObjective needs the task's learner"
        if not 0.0 <= self.distill <= 1.0:
            raise UserError(f"--distill: {self.distill} is not between 0 and 1")

    def plan(self, step: int) -> Plan:
        return [("model", None)]

    def loss(self, index: int, logits: Tensor, targets: Tensor, memo: dict, per: float | None = None) -> tuple[Tensor, Tensor]:
        ce, logged = _pass_loss(self.task, logits, targets, per)
        teacher = self.model.teacher_logp
        assert teacher is not None and teacher.shape == logits.shape, "the teacher runs in Distilled.forward (training mode)"
        student = logits.float().log_softmax(-1)  # (B, T, V)
        kd = self.task.kl(student, teacher, targets, per)
        return (1.0 - self.distill) * ce + self.distill * kd, logged

    def eval_subnets(self) -> dict[str, Subnet | None]:
        return {"model": None}

    def fixed_subnets(self) -> set[Subnet | None]:
        return {None}

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "distill", "distill": self.distill, **self.task.to_dict()}


STATIC_FORMAT = "nas-finetune-checkpoint"  # the marker keeps its first name: earlier fine-tuning checkpoints still read


@dataclass(frozen=True)
class StaticCheckpointer:
    """Checkpoints of a trained static model (``nas train-subnet``, ``nas finetune``): atomic, ``weights_only``,
    checked against its space and subnet."""

    space: Space
    subnet: Subnet

    def save(self, path: Path, model: nn.Module, state: dict[str, Any], meta: dict[str, Any]) -> None:
        import yaml

        from .files import atomic_write

        payload = {
            "format": STATIC_FORMAT, "version": 1, "space": yaml.safe_dump(self.space.to_dict(), sort_keys=False),
            "space_hash": self.space.hash, "subnet": self.subnet.to_dict(),
            "model": {k: v.detach().cpu() for k, v in model.state_dict().items()}, "state": state, "meta": meta,
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, lambda f: torch.save(payload, f))

    def load(self, path: Path) -> dict[str, Any]:
        payload = read_static_checkpoint(path)
        if payload["space_hash"] != self.space.hash or payload["subnet"] != self.subnet.to_dict():
            raise UserError(
                f"{path}: written for another model (space hash {payload.get('space_hash')}, subnet {payload.get('subnet')}); "
                f"this run trains {self.subnet} of space hash {self.space.hash}"
            )
        return payload


def read_static_checkpoint(path: str | Path, payload: dict[str, Any] | None = None) -> dict[str, Any]:
    """A static model's training checkpoint (:class:`StaticCheckpointer`), with ``space_obj`` (its
    :class:`~search_spaces.Space`) and ``subnet_obj`` (its :class:`~search_spaces.Subnet`) parsed and checked."""
    from search_spaces import parse_space

    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such checkpoint file")
    from .checkpoint import load_marked

    payload = load_marked(path, STATIC_FORMAT, "training checkpoint of this tool", payload)
    try:
        space = parse_space(payload["space"], where=f"{path.name}[space]", source=str(path))
        subnet = space.subnet_type.from_dict(payload["subnet"], where=f"{path.name}[subnet]")  # the space's task's type
    except KeyError as e:
        raise UserError(f"{path}: training checkpoint without {e}") from None
    if space.hash != payload.get("space_hash"):
        raise UserError(f"{path}: stored space hash {payload.get('space_hash')} does not match its space ({space.hash})")
    return {**payload, "space_obj": space, "subnet_obj": space.check(subnet)}
