"""Training: one generic driver, and small objectives that say what a step computes.

:func:`train` owns everything that does not depend on what is trained: AdamW, the
warm-up + cosine schedule, gradient clipping, bf16 autocast on CUDA, optional
``torch.compile``, DistributedDataParallel, JSON Lines metrics, evaluations,
atomic checkpoints, exact resume and SIGINT.  An :class:`Objective` says, per step,
which passes run (which subnets) and what each pass's loss is:

* :class:`SandwichObjective` trains a :class:`~supernet.SuperTransformer` by the
  sandwich rule (largest, smallest and N uniformly sampled subnets, gradients
  accumulated) with in-place distillation from the largest subnet;
* :class:`PlainObjective` trains one static model (fine-tuning an extracted subnet).

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
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from search_spaces import Space, Subnet, UserError

from .checkpoint import load_checkpoint, save_checkpoint
from .data import check_length, windows
from .distributed import SINGLE, Dist

# Streams of the per-step generators: default_rng([seed, STREAM, step]).
DATA_STREAM, PLAN_STREAM, EVAL_STREAM = 0, 1, 2
LN2 = math.log(2.0)


# --------------------------------------------------------------------------- config


@dataclass(frozen=True)
class TrainConfig:
    """What a run does.  ``batch_size`` is global: it is split evenly across the ranks."""

    batch_size: int = 32
    seq_len: int = 256
    lr: float = 2e-3
    min_lr: float = 2e-4
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

    # May differ between a run and its resumption (they bound or observe the run, not its maths).
    RESUMABLE = ("max_steps", "max_time", "eval_interval", "eval_batches", "ckpt_interval", "log_interval", "compile")

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
        if problems:
            raise UserError("\n".join(problems))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrainConfig":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


# --------------------------------------------------------------------------- schedule


@dataclass(frozen=True)
class WarmupCosine:
    """Linear warm-up over ``warmup_steps``, then cosine from ``lr`` to ``min_lr`` over the run.

    The run's progress is ``step / max_steps``, or ``elapsed / max_time`` when only a time
    budget is given (then the schedule follows the wall clock and is not bit-reproducible).
    """

    lr: float
    min_lr: float
    warmup_steps: int
    max_steps: int | None
    max_time: float | None

    @classmethod
    def from_config(cls, config: TrainConfig) -> "WarmupCosine":
        return cls(config.lr, config.min_lr, config.warmup_steps, config.max_steps, config.max_time)

    def progress(self, step: int, elapsed: float) -> float:
        if self.max_steps is not None:
            return min(1.0, step / self.max_steps)
        return min(1.0, elapsed / self.max_time)

    def __call__(self, step: int, elapsed: float) -> float:
        warm = min(1.0, (step + 1) / self.warmup_steps) if self.warmup_steps else 1.0
        cosine = 0.5 * (1.0 + math.cos(math.pi * self.progress(step, elapsed)))
        return warm * (self.min_lr + (self.lr - self.min_lr) * cosine)

    def state_dict(self) -> dict[str, Any]:
        return {"kind": "warmup-cosine", **asdict(self)}


# --------------------------------------------------------------------------- objectives


Plan = list[tuple[str, Subnet | None]]  # (name, subnet) per pass; subnet None = a static model


class Objective(Protocol):
    """Per step: which passes run and what each pass's loss is.

    Call order per step: ``plan(step)``; then for each pass ``i`` in order the trainer runs the
    model on the batch and calls ``loss(i, logits, targets, memo)``, then backpropagates it.
    ``memo`` is a fresh dict per step, for what one pass hands to the next (e.g. soft targets).
    """

    def plan(self, step: int) -> Plan: ...

    def loss(self, index: int, logits: Tensor, targets: Tensor, memo: dict) -> tuple[Tensor, Tensor]:
        """(loss to backpropagate, its cross-entropy part detached, for logging)."""
        ...

    def eval_subnets(self) -> dict[str, Subnet | None]: ...

    def to_dict(self) -> dict[str, Any]: ...


def cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())  # mean over B*T, nats


@dataclass(frozen=True)
class SandwichObjective:
    """Largest, smallest and ``n_random`` uniformly sampled subnets per step; in-place distillation.

    The largest subnet learns from the data.  Every smaller one learns from
    ``(1 - distill) * CE(data) + distill * KL(largest || it)``, the largest subnet's
    predictions taken as fixed soft targets.
    """

    space: Space
    n_random: int = 2
    distill: float = 0.5
    seed: int = 0
    n_eval_random: int = 3

    def __post_init__(self) -> None:
        if self.n_random < 0:
            raise UserError(f"--random-subnets: {self.n_random} is negative")
        if not 0.0 <= self.distill <= 1.0:
            raise UserError(f"--distill: {self.distill} is not between 0 and 1")

    def plan(self, step: int) -> Plan:
        rng = np.random.default_rng([self.seed, PLAN_STREAM, step])
        random = [(f"random{i}", self.space.sample(rng)) for i in range(self.n_random)]
        return [("largest", self.space.largest()), ("smallest", self.space.smallest()), *random]

    def loss(self, index: int, logits: Tensor, targets: Tensor, memo: dict) -> tuple[Tensor, Tensor]:
        ce = cross_entropy(logits, targets)
        if index == 0:
            memo["teacher"] = logits.detach().float().log_softmax(-1)  # (B, T, V)
            return ce, ce.detach()
        if self.distill == 0.0:
            return ce, ce.detach()
        student = logits.float().log_softmax(-1)  # (B, T, V)
        kd = F.kl_div(student.flatten(0, 1), memo["teacher"].flatten(0, 1), log_target=True, reduction="batchmean")
        return (1.0 - self.distill) * ce + self.distill * kd, ce.detach()

    def eval_subnets(self) -> dict[str, Subnet | None]:
        rng = np.random.default_rng([self.seed, EVAL_STREAM])
        fixed = {f"random{i}": self.space.sample(rng) for i in range(self.n_eval_random)}
        return {"largest": self.space.largest(), "smallest": self.space.smallest(), **fixed}

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "sandwich", "n_random": self.n_random, "distill": self.distill, "seed": self.seed, "n_eval_random": self.n_eval_random}


@dataclass(frozen=True)
class PlainObjective:
    """One pass of one static model, cross-entropy on the data (fine-tuning an extracted subnet)."""

    def plan(self, step: int) -> Plan:
        return [("model", None)]

    def loss(self, index: int, logits: Tensor, targets: Tensor, memo: dict) -> tuple[Tensor, Tensor]:
        ce = cross_entropy(logits, targets)
        return ce, ce.detach()

    def eval_subnets(self) -> dict[str, Subnet | None]:
        return {"model": None}

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "plain"}


# --------------------------------------------------------------------------- evaluation


def run_model(model: nn.Module, idx: Tensor, subnet: Subnet | None) -> Tensor:
    """``model(idx, subnet)`` for a supernet, ``model(idx)`` for a static model (subnet None)."""
    return model(idx) if subnet is None else model(idx, subnet)


def autocast(device: torch.device):
    """bf16 autocast on CUDA, nothing (fp32) elsewhere."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()


def eval_starts(n_tokens: int, batch_size: int, seq_len: int, n_batches: int, seed: int) -> np.ndarray:
    """The fixed window starts an evaluation uses: (n_batches * batch_size,), a function of ``seed`` only."""
    return np.random.default_rng([seed, EVAL_STREAM]).integers(0, n_tokens - seq_len, size=n_batches * batch_size)


@torch.no_grad()
def evaluate_bpb(
    model: nn.Module,
    subnet: Subnet | None,
    tokens: np.ndarray,
    batch_size: int,
    seq_len: int,
    n_batches: int,
    seed: int,
) -> float:
    """Bits per byte of ``model`` (running ``subnet``; None for a static model) on fixed windows of ``tokens``.

    The windows depend only on ``seed`` and the sizes, so every subnet and every call sees
    the same bytes.  Runs in eval mode without gradients (bf16 autocast on CUDA).
    """
    check_length(tokens, seq_len, "validation")
    device = next(model.parameters()).device
    starts = eval_starts(len(tokens), batch_size, seq_len, n_batches, seed)
    was_training = model.training
    model.eval()
    total = torch.zeros((), dtype=torch.float64, device=device)
    try:
        for b in range(n_batches):
            x, y = windows(tokens, starts[b * batch_size : (b + 1) * batch_size], seq_len)  # (B, T) each
            with autocast(device):
                logits = run_model(model, torch.from_numpy(x).to(device), subnet)  # (B, T, V)
            total += F.cross_entropy(logits.float().flatten(0, 1), torch.from_numpy(y).to(device).flatten(), reduction="sum")
    finally:
        model.train(was_training)
    return total.item() / (n_batches * batch_size * seq_len) / LN2


# --------------------------------------------------------------------------- checkpoints


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


@dataclass
class TrainResult:
    step: int
    elapsed: float
    tokens: int
    stopped: str  # "max_steps", "max_time" or "interrupted"
    evals: list[dict] = field(default_factory=list)
    checkpoint: Path | None = None


class _Interrupt:
    """SIGINT sets a flag (the step finishes, a checkpoint is saved); a second SIGINT aborts at once."""

    def __init__(self) -> None:
        self.requested = False

    def __call__(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True


@contextmanager
def _catch_sigint() -> Iterator[_Interrupt]:
    flag = _Interrupt()
    try:
        previous = signal.signal(signal.SIGINT, flag)
    except ValueError:  # not the main thread: leave signals alone
        yield flag
        return
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, previous)


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


def train(
    model: nn.Module,
    objective: Objective,
    train_tokens: np.ndarray,
    val_tokens: np.ndarray,
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
    """Train ``model`` (already on its device) until ``max_steps`` or ``max_time``, or SIGINT.

    With ``out`` and ``checkpointer``: ``out/latest.pt`` every ``ckpt_interval`` steps, on SIGINT
    and at the end, ``out/final.pt`` when the run reaches its bound, ``out/log.jsonl`` metrics.
    ``resume`` continues from ``out/latest.pt`` exactly where it was written (pass the
    checkpoint dict instead of True if the caller has already loaded it).  ``meta`` is stored
    in every checkpoint (with the step).  Only rank 0 writes files.
    """
    device = next(model.parameters()).device
    check_length(train_tokens, config.seq_len, "training")
    check_length(val_tokens, config.seq_len, "validation")
    if config.batch_size % dist.world:
        raise UserError(f"--batch-size: {config.batch_size} does not split evenly across {dist.world} ranks")
    local = config.batch_size // dist.world
    say = report if (report is not None and dist.is_main) else (lambda text: None)
    meta = dict(meta or {})
    meta.update(seed=config.seed, train_config=config.to_dict(), objective=objective.to_dict(), world_size=dist.world, torch=str(torch.__version__))

    optimizer = torch.optim.AdamW(param_groups(model, config.weight_decay), lr=config.lr, betas=(config.beta1, config.beta2))
    schedule = WarmupCosine.from_config(config)
    step, elapsed, tokens = 0, 0.0, 0
    latest = out / "latest.pt" if out is not None else None
    if resume is not False:
        if latest is None or checkpointer is None:
            raise UserError("resume needs a run directory (--out) with checkpoints")
        if not latest.exists():
            raise UserError(f"--resume: {out} holds no checkpoint (latest.pt); start a new run without --resume")
        ckpt = resume if isinstance(resume, dict) else checkpointer.load(latest)
        model.load_state_dict(ckpt["model"])
        state = ckpt["state"]
        try:
            optimizer.load_state_dict(state["optimizer"])
            set_rng_state(state["rng"], device)
            step, elapsed, tokens = state["step"], state["elapsed"], state["tokens"]
        except (KeyError, ValueError, RuntimeError) as e:
            raise UserError(f"{latest}: checkpoint holds no resumable trainer state ({type(e).__name__}: {e})") from None
        say(f"resumed from {latest} at step {step}")
    log = JsonlLog(out / "log.jsonl" if (out is not None and dist.is_main) else None, resume_step=step if resume is not False else None)
    log.write("resume" if resume is not False else "start", step=step, meta=_jsonable(meta))

    def save(path: Path, stopped: str | None) -> None:
        if checkpointer is None or not dist.is_main:
            return
        state = {
            "optimizer": optimizer.state_dict(),
            "schedule": schedule.state_dict(),
            "rng": rng_state(device),
            "data": {"position": step, "sampler": "windows drawn by default_rng([seed, 0, step])"},
            "step": step,
            "elapsed": elapsed,
            "tokens": tokens,
        }
        checkpointer.save(path, model, state, {**meta, "step": step, "stopped": stopped})
        log.write("checkpoint", step=step, path=str(path))

    evals: list[dict] = []
    evaluated_at = -1

    def evaluate() -> None:
        nonlocal evaluated_at
        evaluated_at = step
        if dist.is_main:
            t0 = time.perf_counter()
            bpb = {
                name: evaluate_bpb(model, subnet, val_tokens, config.batch_size, config.seq_len, config.eval_batches, config.seed)
                for name, subnet in objective.eval_subnets().items()
            }
            evals.append({"step": step, "bpb": bpb})
            log.write("eval", step=step, bpb=bpb, seconds=round(time.perf_counter() - t0, 3))
            say(f"step {step}: validation bits/byte  " + "  ".join(f"{k} {v:.3f}" for k, v in bpb.items()))
        dist.barrier()

    fwd = torch.compile(model) if config.compile else model
    if dist.enabled:
        from torch.nn.parallel import DistributedDataParallel as DDP

        # Passes of smaller subnets leave parameters unused (the same ones on every rank).
        fwd = DDP(fwd, device_ids=[device.index] if device.type == "cuda" else None, find_unused_parameters=True)

    model.train()
    stopped = ""
    window_t, window_tokens = time.perf_counter(), 0
    with _catch_sigint() as interrupt:
        while True:
            want = interrupt.requested or (config.max_steps is not None and step >= config.max_steps)
            want = want or (config.max_time is not None and elapsed >= config.max_time)
            want, elapsed = dist.agree(want, elapsed, device)
            if want:
                if interrupt.requested:
                    stopped = "interrupted"
                else:
                    stopped = "max_steps" if config.max_steps is not None and step >= config.max_steps else "max_time"
                break
            t0 = time.perf_counter()
            lr = schedule(step, elapsed)
            for group in optimizer.param_groups:
                group["lr"] = lr
            starts = np.random.default_rng([config.seed, DATA_STREAM, step]).integers(0, len(train_tokens) - config.seq_len, size=config.batch_size)
            x, y = windows(train_tokens, starts[dist.rank * local : (dist.rank + 1) * local], config.seq_len)  # (b, T) each
            x, y = torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)
            plan = objective.plan(step)
            memo: dict = {}
            ces = []
            for i, (name, subnet) in enumerate(plan):
                last = i == len(plan) - 1
                with (fwd.no_sync() if dist.enabled and not last else nullcontext()), autocast(device):
                    logits = run_model(fwd, x, subnet)  # (b, T, V)
                    loss, ce = objective.loss(i, logits, y, memo)
                (loss / len(plan)).backward()
                ces.append(ce)
            del memo, logits, loss
            if config.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            tokens += config.batch_size * config.seq_len
            window_tokens += config.batch_size * config.seq_len
            losses = dict(zip((name for name, _ in plan), torch.stack(ces).tolist()))
            now = time.perf_counter()
            elapsed += now - t0
            rate = window_tokens / max(now - window_t, 1e-9)
            if step % config.log_interval == 0 or step == config.max_steps:
                log.write("train", step=step, lr=lr, loss=losses, tokens=tokens, tokens_per_s=round(rate, 1), elapsed=round(elapsed, 3))
                window_t, window_tokens = now, 0
            if progress is not None:
                keys = tuple(s.key if s is not None else "" for _, s in plan)
                progress(StepInfo(step, config.max_steps, elapsed, config.max_time, lr, losses, keys, rate))
            if step % config.eval_interval == 0:
                evaluate()
            if latest is not None and step % config.ckpt_interval == 0:
                save(latest, None)
            if step % config.eval_interval == 0 or step % config.ckpt_interval == 0:
                window_t, window_tokens = time.perf_counter(), 0  # tokens/s measures training only
            elapsed += time.perf_counter() - now  # evaluations and checkpoints count against --max-time

        if stopped != "interrupted" and evaluated_at != step:
            evaluate()
        checkpoint = None
        if latest is not None:
            save(latest, stopped)
            checkpoint = latest
            if stopped != "interrupted":
                save(out / "final.pt", stopped)
                checkpoint = out / "final.pt"
    log.write("end", step=step, stopped=stopped, elapsed=round(elapsed, 3), tokens=tokens)
    return TrainResult(step, elapsed, tokens, stopped, evals, checkpoint)


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))
