"""Training an encoder-decoder supernet on sentence pairs: the sandwich rule with in-place distillation.

A small loop of its own beside :func:`supernet.train.train` (whose driver samples byte windows), built
from the same pieces and habits: :class:`~supernet.train.TrainConfig` (``batch_size`` counts pairs;
``seq_len`` is unused: the space's ``max_seq_len`` bounds a pair), AdamW with the warm-up + cosine
schedule, gradient clipping, JSON Lines metrics, atomic checkpoints (``latest.pt`` / ``final.pt``,
:mod:`supernet.checkpoint`) and exact resume: step ``k`` reads the batch and the subnets that are a
function of (seed, k) only, so a resumed run continues as if never stopped.

A step runs the largest, the smallest and ``n_random`` uniformly sampled subnets on one batch with
teacher forcing (decoder inputs BOS + target, targets target + EOS); the largest learns from the
targets (cross-entropy per target byte, PAD ignored), the others from
``(1 - distill) * cross-entropy + distill * KL(largest || subnet)`` over the target bytes; the
gradients are accumulated.  Held-out loss: cross-entropy per target byte (nats) on fixed batches of
the validation split, the fitness a search reads with inherited weights.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from search_spaces import UserError
from supernet.checkpoint import fill_supernet, load_checkpoint, save_checkpoint
from supernet.distributed import SINGLE, Dist
from supernet.train import (
    EVAL_STREAM,
    PLAN_STREAM,
    JsonlLog,
    StepInfo,
    TrainConfig,
    TrainResult,
    WarmupCosine,
    _catch_interrupts,
    _jsonable,
    param_groups,
    rng_state,
    set_rng_state,
)

from .data import PAD, Pairs, collate, length_batches
from .model import Seq2SeqSuperTransformer, Seq2SeqTransformer
from .space import Seq2SeqSpace, Seq2SeqSubnet


def target_ce(logits: Tensor, targets: Tensor, reduction: str = "mean") -> Tensor:
    """Cross-entropy (nats) of logits (B, T, V) against targets (B, T), PAD positions ignored."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=PAD, reduction=reduction)


@dataclass(frozen=True)
class Seq2SeqSandwich:
    """Which subnets step ``k`` runs (a function of (seed, k)) and what each pass's loss is."""

    space: Seq2SeqSpace
    n_random: int = 2
    distill: float = 0.5
    seed: int = 0
    n_eval_random: int = 2

    def __post_init__(self) -> None:
        if self.n_random < 0:
            raise UserError(f"--random-subnets: {self.n_random} is negative")
        if not 0.0 <= self.distill <= 1.0:
            raise UserError(f"--distill: {self.distill} is not between 0 and 1")

    def plan(self, step: int) -> list[tuple[str, Seq2SeqSubnet]]:
        rng = np.random.default_rng([self.seed, PLAN_STREAM, step])
        randoms = [(f"random{i}", self.space.sample(rng)) for i in range(self.n_random)]
        return [("largest", self.space.largest()), ("smallest", self.space.smallest()), *randoms]

    def loss(self, index: int, logits: Tensor, targets: Tensor, memo: dict, per: float | None = None) -> tuple[Tensor, Tensor]:
        """(the loss to back-propagate, the cross-entropy per target byte of this pass).  ``per``: the target bytes the
        sums are divided by (default: this batch's; data-parallel: the global batch's over the ranks, so that the
        ranks' averaged gradients equal one process's on the whole batch)."""
        real = targets != PAD  # (B, T)
        n = int(real.sum())
        per = n if per is None else per
        ce_sum = target_ce(logits, targets, reduction="sum")
        ce = ce_sum / per
        if index == 0:
            memo["teacher"] = logits.detach().float().log_softmax(-1)[real]  # (N, V) over the real target bytes
            return ce, ce_sum.detach() / n
        if self.distill == 0.0:
            return ce, ce_sum.detach() / n
        kd = F.kl_div(logits.float().log_softmax(-1)[real], memo["teacher"], log_target=True, reduction="sum") / per
        return (1.0 - self.distill) * ce + self.distill * kd, ce_sum.detach() / n

    def eval_subnets(self) -> dict[str, Seq2SeqSubnet]:
        rng = np.random.default_rng([self.seed, EVAL_STREAM])
        fixed = {f"random{i}": self.space.sample(rng) for i in range(self.n_eval_random)}
        return {"largest": self.space.largest(), "smallest": self.space.smallest(), **fixed}

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "sandwich", "n_random": self.n_random, "distill": self.distill, "seed": self.seed,
                "n_eval_random": self.n_eval_random}  # fmt: skip


@dataclass(frozen=True)
class Seq2SeqPlain:
    """One static encoder-decoder (:class:`~tasks.translation.model.Seq2SeqTransformer`) trained on its own: every step one
    pass of the model (plan ``[("model", None)]``), cross-entropy per target byte, no distillation, no sandwich.  What
    ``nas train-subnet`` runs on a seq2seq space (retraining from scratch)."""

    def plan(self, step: int) -> list[tuple[str, None]]:
        return [("model", None)]

    def loss(self, index: int, logits: Tensor, targets: Tensor, memo: dict, per: float | None = None) -> tuple[Tensor, Tensor]:
        n = int((targets != PAD).sum())
        ce_sum = target_ce(logits, targets, reduction="sum")
        return ce_sum / (n if per is None else per), ce_sum.detach() / n

    def eval_subnets(self) -> dict[str, None]:
        return {"model": None}

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "plain"}


def _forward(model: torch.nn.Module, src: Tensor, inp: Tensor, subnet: Seq2SeqSubnet | None) -> Tensor:
    """Logits of ``subnet`` of a supernet, or of a static model (``subnet`` None)."""
    return model(src, inp) if subnet is None else model(src, inp, subnet)


def steps_for_tokens(pairs: Pairs, batch_size: int, max_len: int, seed: int, tokens: int, world: int = 1) -> tuple[int, int]:
    """(steps, target bytes they train on): the most steps of the training loop's batches (``length_batches`` of
    (seed, epoch), epoch after epoch) whose target bytes (EOS included, as the loop counts them) total at most
    ``tokens``.  A token budget in the loop's own unit: models trained with one budget, seed and batch size see the
    same pairs in the same order."""
    lengths = pairs.tgt_lengths.astype(np.int64) + 1
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
def heldout_ce(model: torch.nn.Module, subnet: Seq2SeqSubnet | None, pairs: Pairs, batches: list[np.ndarray]) -> float:
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
        count += int((out != PAD).sum())
    model.train(was)
    return total / count


def train_seq2seq(
    model: Seq2SeqSuperTransformer | Seq2SeqTransformer,
    objective: Seq2SeqSandwich | Seq2SeqPlain,
    train_pairs: Pairs,
    val_pairs: Pairs,
    config: TrainConfig,
    *,
    out: Path | None = None,
    meta: dict[str, Any] | None = None,
    resume: dict[str, Any] | None = None,
    progress: Callable[[StepInfo], None] | None = None,
    report: Callable[[str], None] | None = None,
    dist: Dist = SINGLE,
) -> TrainResult:
    """Train until ``max_steps`` / ``max_time`` or SIGINT / SIGTERM; ``resume``: a loaded ``latest.pt`` to continue.
    ``model``: a supernet with a :class:`Seq2SeqSandwich`, or a static model with :class:`Seq2SeqPlain`.

    Files (with ``out``, rank 0 only): ``latest.pt`` every ``ckpt_interval`` steps, on interrupt and at the end,
    ``final.pt`` when the run reaches its bound, ``log.jsonl``.  Data-parallel (``dist``): every rank collates the
    step's whole batch and runs its share of the rows (the same padding as one process), the gradients averaged by
    DDP; a batch with fewer pairs than ranks is skipped (on every rank count alike, also in one process).
    """
    say = report if (report is not None and dist.is_main) else (lambda text: None)
    device = next(model.parameters()).device
    max_len = model.space.max_seq_len
    def epoch_batches(epoch: int) -> list[np.ndarray]:
        return [b for b in length_batches(train_pairs, config.batch_size, max_len, config.seed, epoch) if len(b) >= dist.world]

    n_epoch = len(epoch_batches(0))
    if n_epoch == 0:
        raise UserError(f"the training split has no pair of at most {max_len} bytes (source, target + 1)")
    val_batches = eval_batches(val_pairs, config.batch_size, max_len, config.eval_batches, config.seed)
    optimizer = torch.optim.AdamW(param_groups(model, config.weight_decay), lr=config.lr, betas=(config.beta1, config.beta2))
    schedule = WarmupCosine.from_config(config)
    meta = {**(meta or {}), "seed": config.seed, "train_config": config.to_dict(), "objective": objective.to_dict(),
            "task": "seq2seq", "torch": str(torch.__version__)}  # fmt: skip
    step, elapsed, tokens, evals = 0, 0.0, 0, []
    if resume is not None:
        model.load_state_dict(resume["model"])
        state = resume["state"]
        optimizer.load_state_dict(state["optimizer"])
        set_rng_state(state["rng"], device)
        step, elapsed, tokens = state["step"], state["elapsed"], state["tokens"]
        say(f"resumed at step {step}")
    latest = out / "latest.pt" if out is not None and dist.is_main else None
    log = JsonlLog(out / "log.jsonl" if latest is not None else None, resume_step=step if resume is not None else None)
    fwd = model
    if dist.enabled:
        from torch.nn.parallel import DistributedDataParallel as DDP

        # Passes of smaller subnets leave parameters unused (the same ones on every rank).
        fwd = DDP(model, device_ids=[device.index] if device.type == "cuda" else None, find_unused_parameters=True)
    log.write("resume" if resume is not None else "start", step=step, meta=_jsonable(meta))
    epochs: dict[int, list[np.ndarray]] = {}

    def batch(k: int) -> tuple[Tensor, Tensor, Tensor, int]:
        """This rank's rows of step k's batch, and the target bytes of the whole batch."""
        epoch, i = divmod(k, n_epoch)
        if epoch not in epochs:
            epochs.clear()
            epochs[epoch] = epoch_batches(epoch)
        src, inp, tgt = collate(train_pairs, epochs[epoch][i])  # (B, S), (B, T), (B, T): the whole batch
        rows = np.array_split(np.arange(len(src)), dist.world)[dist.rank]
        local = (torch.from_numpy(a[rows]).to(device) for a in (src, inp, tgt))
        return *local, int((tgt != PAD).sum())

    def save(path: Path, stopped: str | None) -> None:
        state = {"optimizer": optimizer.state_dict(), "schedule": schedule.state_dict(), "rng": rng_state(device),
                 "data": {"position": step, "sampler": "length_batches(seed, epoch = step // batches per epoch)"},
                 "step": step, "elapsed": elapsed, "tokens": tokens}  # fmt: skip
        save_checkpoint(path, model, state, **meta, step=step, stopped=stopped)
        log.write("checkpoint", step=step, path=str(path))

    def evaluate() -> None:
        if not dist.is_main:
            dist.barrier()
            return
        t0 = time.perf_counter()
        ce = {name: heldout_ce(model, s, val_pairs, val_batches) for name, s in objective.eval_subnets().items()}
        evals.append({"step": step, "ce": ce})
        log.write("eval", step=step, ce=ce, seconds=round(time.perf_counter() - t0, 3))
        say(f"step {step}: validation nats/target byte  " + "  ".join(f"{k} {v:.3f}" for k, v in ce.items()))
        dist.barrier()

    model.train()
    evaluated_at = -1
    with _catch_interrupts() as interrupt:
        while True:
            done_steps = config.max_steps is not None and step >= config.max_steps
            done_time = config.max_time is not None and elapsed >= config.max_time
            stop, elapsed = dist.agree(interrupt.requested or done_steps or done_time, elapsed, device)
            if stop:
                stopped = "interrupted" if interrupt.requested or not (done_steps or done_time) else (
                    "max_steps" if done_steps else "max_time")
                break
            t0 = time.perf_counter()
            lr = schedule(step, elapsed)
            for group in optimizer.param_groups:
                group["lr"] = lr
            src, inp, tgt, n_tokens = batch(step)
            plan, memo, ces = objective.plan(step), {}, []
            for i, (_, subnet) in enumerate(plan):
                sync = not dist.enabled or i == len(plan) - 1
                with nullcontext() if sync else fwd.no_sync():
                    loss, ce = objective.loss(i, _forward(fwd, src, inp, subnet), tgt, memo, n_tokens / dist.world)
                    (loss / len(plan)).backward()
                ces.append(ce)
            if config.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step, tokens = step + 1, tokens + n_tokens
            now = time.perf_counter()
            elapsed += now - t0
            losses = dict(zip((name for name, _ in plan), torch.stack(ces).tolist()))
            if step % config.log_interval == 0 or step == config.max_steps:
                log.write("train", step=step, lr=lr, loss=losses, tokens=tokens, elapsed=round(elapsed, 3))
            if progress is not None:
                rate = n_tokens / max(now - t0, 1e-9)
                progress(StepInfo(step, config.max_steps, elapsed, config.max_time, lr, losses,
                                  tuple(name if s is None else s.key for name, s in plan), rate))  # fmt: skip
            if step % config.eval_interval == 0:
                evaluate()
                evaluated_at = step
            if latest is not None and step % config.ckpt_interval == 0:
                save(latest, None)
            elapsed += time.perf_counter() - now
        if stopped != "interrupted" and evaluated_at != step:
            evaluate()
        checkpoint = None
        if latest is not None:  # rank 0
            save(latest, stopped)
            checkpoint = latest
            if stopped != "interrupted":
                checkpoint = out / "final.pt"
                save(checkpoint, stopped)
    log.write("end", step=step, stopped=stopped, elapsed=round(elapsed, 3), tokens=tokens)
    return TrainResult(step, elapsed, tokens, stopped, evals, checkpoint)


def load_seq2seq_supernet(path: str | Path, space: Seq2SeqSpace | None = None, device: str | torch.device = "cpu"):
    """The encoder-decoder supernet stored in ``path`` (eval mode) and the checkpoint dict."""
    payload = load_checkpoint(path, space)
    if not isinstance(payload["space"], Seq2SeqSpace):
        raise UserError(f"{path}: holds a {payload['space'].task} supernet, not an encoder-decoder (task seq2seq)")
    return fill_supernet(Seq2SeqSuperTransformer(payload["space"]), payload, path, device), payload
