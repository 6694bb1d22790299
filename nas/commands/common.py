"""What the commands share, in one place: the training flags and their defaults, the measurement protocol's flags
and defaults, the held-out scoring flags, the task flags (each registered task's extra flags of a command),
durations and counts, and progress (bars on a terminal, a line per interval in a log; hidden with ``-q`` or
``--no-progress``).

Only the command modules import this; the library workflows take the typed settings the commands build.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import re
from pathlib import Path
from typing import Any

TOKEN_FORMS = "a whole number of tokens, optionally with a suffix K, M or G (powers of 1000): 20M, 500k, 1.5G"

# --------------------------------------------------------------------------- training flags

# flag -> (field, type, metavar, help); every default is None = "not given" (a resumed run keeps its
# stored value); "{default}" in a help text is filled from TrainConfig / the objective / the data defaults.
CONFIG_FLAGS = {
    "--batch-size": ("batch_size", int, "N", "global batch: windows per step, split across ranks (default {default})"),
    "--seq-len": ("seq_len", int, "N", "window length in bytes (default {default}, at most the space's max_seq_len)"),
    "--lr": ("lr", float, "LR", "peak learning rate (default {default})"),
    "--min-lr": ("min_lr", float, "LR", "learning rate at the end of the cosine (default {default})"),
    "--lr-warmup": ("warmup_steps", int, "N", "linear learning-rate warm-up steps (default {default})"),
    "--weight-decay": ("weight_decay", float, "X", "AdamW weight decay of matrices and embeddings (default {default})"),
    "--beta1": ("beta1", float, "X", "AdamW beta1 (default {default})"),
    "--beta2": ("beta2", float, "X", "AdamW beta2 (default {default})"),
    "--grad-clip": ("grad_clip", float, "X", "clip the gradient norm to this, 0 = off (default {default})"),
    "--max-steps": (
        "max_steps",
        int,
        "N",
        "total steps and the schedule's length (default {default} unless --max-time is given)",
    ),
    "--eval-interval": ("eval_interval", int, "N", "validate every N steps and at the end (default {default})"),
    "--eval-batches": ("eval_batches", int, "N", "validation batches per subnet (default {default})"),
    "--ckpt-interval": ("ckpt_interval", int, "N", "write latest.pt every N steps (default {default})"),
    "--log-interval": ("log_interval", int, "N", "write training metrics every N steps (default {default})"),
    "--log": ("log", str, "FORMAT", "training metrics: jsonl (OUT/log.jsonl) or tensorboard (also TensorBoard event "
              "files in OUT/tensorboard; the [tensorboard] extra) (default {default})"),
    "--seed": ("seed", int, "S", "seed of the initial weights, the batches and the sampled subnets (default {default})"),
}
OBJECTIVE_FLAGS = {
    "--random-subnets": (
        "n_random",
        int,
        "N",
        "uniformly sampled subnets per step besides the largest and smallest (default {default})",
    ),
    "--distill": (
        "distill",
        float,
        "W",
        "weight of the largest subnet's soft targets in the smaller subnets' loss, 0..1 (default {default})",
    ),
    "--balance": (
        "balance",
        str,
        "RULE",
        "types: the sandwich's largest and smallest subnets (and the distillation teacher) rotate over the space's "
        "attention types, each equally often; first: always the first listed type (the rule before 2026-11-26; "
        "it trains that type about 12x more in an 11-type space) (default {default})",
    ),
    "--split": (
        "split",
        str,
        "HOW",
        "none: one Q/K/V/O per layer for every attention type; families: one per attention family (dot-product, "
        "kernel-feature, gating), warm-started from the shared ones at --split-at (few-shot NAS) (default {default})",
    ),
    "--split-at": (
        "split_at",
        float,
        "F",
        "with --split families: the fraction of the run after which each family has its own projections "
        "(default {default})",
    ),
}
DATA_FLAGS = {
    "--data-seed": ("data_seed", int, "S", "seed of the train/validation split by document (default {default})"),
    "--val-fraction": (
        "val_fraction",
        float,
        "F",
        "share of the bytes (whole documents) held out for validation (default {default})",
    ),
}
DATA_DEFAULTS = {"data": None, "data_seed": 0, "val_fraction": 0.05}
# The defaults of TrainConfig and SandwichObjective, for --help without importing torch (a test keeps them equal).
HELP_DEFAULTS = {
    "batch_size": 16, "seq_len": 128, "lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 100, "weight_decay": 0.1, "beta1": 0.9,
    "beta2": 0.95, "grad_clip": 1.0, "max_steps": 2000, "eval_interval": 250, "eval_batches": 16, "ckpt_interval": 250,
    "log_interval": 10, "log": "jsonl", "seed": 0, "n_random": 2, "distill": 0.5, "balance": "types", "split": "none",
    "split_at": 0.5,
    **DATA_DEFAULTS,
}


def parse_duration(text: str) -> float:
    """Seconds from ``600``, ``90s``, ``10m``, ``1.5h`` or ``1h30m``."""
    match = re.fullmatch(r"\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s?)?\s*", text)
    if not match or not any(match.groups()):
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (examples: 600, 90s, 10m, 1.5h, 1h30m)")
    h, m, s = (float(g) if g else 0.0 for g in match.groups())
    return h * 3600 + m * 60 + s


def given(args: argparse.Namespace, flags: dict) -> dict:
    return {dest: getattr(args, dest) for dest, *_ in flags.values() if getattr(args, dest) is not None}


def flag_of(dest: str) -> str:
    for flags in (CONFIG_FLAGS, OBJECTIVE_FLAGS, DATA_FLAGS):
        for flag, (d, *_) in flags.items():
            if d == dest:
                return flag
    return "--" + dest.replace("_", "-")


def set_threads(args: argparse.Namespace) -> None:
    import torch

    from search_spaces import UserError

    if args.threads is not None:
        if args.threads < 1:
            raise UserError(f"--threads: {args.threads} is not a positive integer")
        torch.set_num_threads(args.threads)


def given_config(args: argparse.Namespace) -> dict:
    """The TrainConfig fields whose flags were given (``--max-time`` too)."""
    out = given(args, CONFIG_FLAGS)
    if args.max_time is not None:
        out["max_time"] = args.max_time
    if getattr(args, "threads", None) is not None:
        out["threads"] = args.threads  # kept in the run's settings: a resumed run sums as the first did
    return out


def token_budget(args: argparse.Namespace) -> int | None:
    from nas.search.budget import MAX_TOKENS, parse_count
    from search_spaces import UserError

    if args.tokens is None:
        return None
    if args.max_steps is not None:
        raise UserError(f"--tokens {args.tokens} and --max-steps {args.max_steps}: give one (a token budget sets the steps)")
    return parse_count(args.tokens, "--tokens", "tokens", limit=MAX_TOKENS, forms=TOKEN_FORMS, noun="token budget")


def train_device(name: str | None) -> str:
    """``--device`` of a training command: auto (None) is the GPU when there is one; every value checked (auto, cpu,
    cuda, cuda:N, the GPU there)."""
    from supernet.scoring import pick_device

    return pick_device(name or "auto")


# --------------------------------------------------------------------------- task flags


def add_task_flags(p: argparse.ArgumentParser, command: str) -> None:
    """The extra flags the registered tasks add to ``command`` (:attr:`tasks.base.Task.flags`), each once."""
    from search_spaces.tasks import tasks

    seen = set()
    for task in tasks().values():
        for f in task.flags:
            if command in f.commands and f.dest not in seen:
                seen.add(f.dest)
                p.add_argument(f.name, dest=f.dest, type=f.type, metavar=f.metavar, help=f.help)


def add_device_flags(p, command: str) -> None:
    """The option flags the registered devices declare for ``command`` (``--timing-threads``, ``--clock``,
    ``--runtime``, ``--provider``, a plugin device's own), each once (:func:`latency.device.device_flags`)."""
    from latency.device import device_flags

    for f in device_flags(command):
        p.add_argument(f.name, dest=f.dest, type=f.type, metavar=f.metavar, help=f.help)


def task_flags(args: argparse.Namespace, command: str) -> dict[str, Any]:
    """The task flags given to ``command`` (dest -> value): what the space's task checks and reads."""
    from search_spaces.tasks import tasks

    dests = {f.dest for t in tasks().values() for f in t.flags if command in f.commands}
    return {d: getattr(args, d) for d in sorted(dests) if getattr(args, d, None) is not None}


# --------------------------------------------------------------------------- measurement protocol


# A campaign's protocol (measure-latency: many subnets, each visited in every round) ...
CAMPAIGN_DEFAULTS = {"warmup": 10, "repeats": 30, "rounds": 5, "min_sample_ms": 30.0, "tolerance": 0.15, "max_retries": 1}
# ... and one model's, measured once (export, search --timing-target): more samples and rounds.
PROTOCOL_DEFAULTS = {"warmup": 20, "repeats": 60, "rounds": 10, "min_sample_ms": 30.0, "tolerance": 0.15, "max_retries": 2}


def add_protocol_arguments(p: argparse.ArgumentParser, prefix: str = "", defaults: dict | None = None,
                           title: str = "measurement protocol"):
    """The measurement protocol's flags (``--timing-warmup`` ...), with one model's defaults (``defaults``: a campaign's);
    returns their group."""
    d = defaults or PROTOCOL_DEFAULTS
    g = p.add_argument_group(title)
    g.add_argument(
        f"--{prefix}timing-warmup",
        dest="timing_warmup",
        type=int,
        metavar="N",
        default=d["warmup"],
        help=f"untimed calls before timing (default {d['warmup']})",
    )
    g.add_argument(
        f"--{prefix}repeats",
        dest="repeats",
        type=int,
        default=d["repeats"],
        help=f"timed samples, spread over the rounds (default {d['repeats']})",
    )
    g.add_argument(
        f"--{prefix}rounds",
        dest="rounds",
        type=int,
        default=d["rounds"],
        help=f"interleaved rounds with the reference model (default {d['rounds']})",
    )
    g.add_argument(f"--{prefix}min-sample-ms", dest="min_sample_ms", type=float, default=d["min_sample_ms"],
                   help=f"a sample times back-to-back calls for at least this long (default {d['min_sample_ms']:g})")
    g.add_argument(f"--{prefix}tolerance", dest="tolerance", type=float, default=d["tolerance"],
                   help=f"reference change across a visit that marks it disturbed (default {d['tolerance']})")
    g.add_argument(f"--{prefix}max-retries", dest="max_retries", type=int, default=d["max_retries"],
                   help=f"re-measure passes for disturbed visits (default {d['max_retries']})")
    g.add_argument(
        f"--{prefix}combine",
        dest="combine",
        choices=["median", "min"],
        default="median",
        help="round medians -> one figure (default median)",
    )
    g.add_argument(
        f"--{prefix}no-drift-correction",
        dest="no_drift_correction",
        action="store_true",
        help="do not rescale by the reference model",
    )
    g.add_argument(
        f"--{prefix}paired",
        dest="paired",
        action="store_true",
        help="a reference sample after every sample (fast machine swings)",
    )
    return g


@contextlib.contextmanager
def timing_messages(target: str = "--timing-target"):
    """Refusals raised inside, naming the command's flags where the latency library names a device's own: its
    ``--threads`` is the command's ``--timing-threads``, its ``--device`` the command's ``target`` (``measure-latency``
    names the device ``--device`` as the library does; ``export`` names it ``--timing-target``)."""
    from search_spaces import UserError

    try:
        yield
    except UserError as e:
        from .checks import timing_names

        raise UserError(timing_names(str(e), target)) from None


def protocol_settings(args: argparse.Namespace):
    from latency.timing_core import Settings
    from search_spaces import UserError

    try:
        return Settings(
            warmup=args.timing_warmup,
            repeats=args.repeats,
            rounds=args.rounds,
            min_sample_ms=args.min_sample_ms,
            tolerance=args.tolerance,
            max_retries=args.max_retries,
            combine=args.combine,
            correct_drift=not args.no_drift_correction,
            paired=args.paired,
        )
    except ValueError as e:
        raise UserError(f"protocol flags: {e}") from None



# --------------------------------------------------------------------------- held-out scoring


def add_scoring_arguments(group) -> None:
    """The held-out scoring flags, shared with ``nas export`` so its card scores a model as the search did."""
    group.add_argument(
        "--val-data", metavar="FILE", help="held-out bytes to score on (default: the checkpoint's validation split)"
    )
    group.add_argument(
        "--data-cache", metavar="DIR", help="corpus cache of the training run (default: the checkpoint's directory)"
    )
    group.add_argument("--val-windows", type=int, default=16, help="fixed held-out windows per subnet (default 16)")
    group.add_argument("--seq-len", type=int, default=128, help="tokens per window (default 128)")
    group.add_argument(
        "--val-seed", type=int, default=0, help="seed of the windows' positions (default 0; not the search's --seed)"
    )
    group.add_argument(
        "--precision", default="fp32", help="fp32 (default), int8-dynamic, int8-static, int8-smooth (SmoothQuant) or "
        "int8-outlier (LLM.int8's fp32 outlier channels): the bits/byte of the model quantized "
        "by ONNX Runtime (search: simulated in torch, calibrated on held-out windows; export: the quantized ONNX beside "
        "model.onnx); the --predictor must be fitted on timings at the same precision"
    )


def scoring_settings(args: argparse.Namespace, device: str = "cpu", precision: str = "fp32"):
    """The held-out scoring flags as :class:`supernet.scoring.FitnessSettings` (``nas search``, ``nas export``,
    ``nas fit-accuracy``)."""
    from supernet.scoring import FitnessSettings

    return FitnessSettings(args.supernet, seq_len=args.seq_len, windows=args.val_windows,
                           batch_size=getattr(args, "eval_batch_size", 16), val_seed=args.val_seed, device=device,
                           val_data=args.val_data, data_cache=args.data_cache, precision=precision)


def file_digest(path: Path) -> str:
    """Short content hash of a file, or of a predictor folder's predictor.json and arrays.npz."""
    from supernet.artifact import sha256_file

    files = [path / "predictor.json", path / "arrays.npz"] if path.is_dir() else [path]
    return hashlib.sha256("".join(sha256_file(f) for f in files).encode()).hexdigest()[:16]


# --------------------------------------------------------------------------- progress: bars on a terminal, lines in a log

from supernet.progress import (  # noqa: E402, F401  (the commands' names; the helpers live below the tasks)
    PROGRESS_INTERVAL_ENV,
    ProgressLines,
    format_time,
    progress_bar,
    progress_interval,
    progress_line,
)


def bytes_bar(text: str):
    """A progress callback that opens a byte-count bar on its first call (none with ``-q``)."""
    bar = None

    def update(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            bar = progress_bar(total=total, unit="B", scale=True, desc=text, leave=False)
        bar.update(done - bar.n)
        if done >= total:
            bar.close()

    return update


def step_bar_for(config, start_step: int, start_elapsed: float, desc: str = "training"):
    """A bar over steps (or over seconds for a time-bound run) with the loss and its unit, tokens/s and ETA (hidden
    with ``-q``)."""
    by_time = config.max_steps is None
    bar = progress_bar(
        total=config.max_time if by_time else config.max_steps,
        initial=start_elapsed if by_time else start_step,
        unit="s" if by_time else "step",
        desc=desc,
        bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f}{unit} [{elapsed}<{remaining}{postfix}]" if by_time else None,
    )

    def update(info) -> None:
        # shown by the update (tqdm: at most 10 redraws a second); the step is the count, unless the bar counts seconds
        bar.set_postfix_str(step_postfix(info, with_step=by_time), refresh=False)
        # never past the total: tqdm drops a total that n exceeds, and the bar format needs it
        bar.update(min(info.elapsed if by_time else info.step, bar.total) - bar.n)

    return bar, update


def step_postfix(info, with_step: bool = True) -> str:
    """What a training bar shows beside the count: ``step 120 loss(L/S) 2.345 2.567 nats/byte lr 1.00e-03 3.2k tok/s``
    (the training loss in its unit, beside the validation's bits/byte in the notes; the step left out where the bar
    counts steps)."""
    if "largest" in info.losses:  # the sandwich rule: the largest and smallest subnet's losses
        loss = "loss(L/S) " + " ".join(f"{info.losses[k]:.3f}" for k in ("largest", "smallest") if k in info.losses)
    else:
        loss = "loss " + " ".join(f"{v:.3f}" for v in info.losses.values())
    unit = getattr(info, "loss_unit", "") or "nats"
    return f"{f'step {info.step} ' if with_step else ''}{loss} {unit} lr {info.lr:.2e} {info.tokens_per_s / 1000:.1f}k tok/s"


def step_bar(desc: str):
    """(close, update): a tqdm bar over steps (or seconds) that opens on the first step (hidden with ``-q``)."""
    state: dict = {}

    def update(info) -> None:
        if "bar" not in state:  # StepInfo carries max_steps and max_time, as a TrainConfig does
            state["bar"], state["update"] = step_bar_for(info, info.step - 1, info.elapsed, desc)
        state["update"](info)
        if info.max_steps is not None and info.step >= info.max_steps:
            state["bar"].close()  # the last step: what follows (scoring, export) is not training

    def close() -> None:
        if "bar" in state:
            state["bar"].close()

    return close, update


def train_and_report(train, settings, bar, again: str) -> int:
    """``train(settings, progress=...)`` (one model's training run) under ``bar`` (``(close, update)`` of
    :func:`step_bar`); print its summary, or how to continue it when it was interrupted (``again``: the command line;
    exit status 130)."""
    from supernet.runs import TrainingInterrupted

    close, update = bar
    try:
        result = train(settings, progress=update)
    except TrainingInterrupted as e:
        print(f"interrupted at step {e.step}; saved {e.checkpoint}. Continue with: {again}")
        return 130
    finally:
        close()
    for line in result.summary():
        print(line)
    return 0


def measurement_bar(desc: str):
    """A bar over the protocol's visits: (bar, callback); hidden with ``-q``."""
    bar = progress_bar(total=1, unit="visit", desc=desc, leave=False)

    def update(done: int, total: int, info: str) -> None:
        bar.total, bar.n = total, done
        bar.refresh()

    return bar, update


def visit_bar(desc: str):
    """A bar over a campaign's visits, the subnet being timed beside it: (bar, callback); hidden with ``-q``."""
    b = progress_bar(total=1, unit="visit", desc=desc)

    def update(done: int, total: int, info: str) -> None:
        b.total = total
        b.n = done
        b.set_postfix_str(info[:30], refresh=False)
        b.refresh()

    return b, update


# --------------------------------------------------------------------------- --json


def emit(args: argparse.Namespace, doc: dict) -> None:
    """The command's result as one JSON document: printed on stdout by :func:`nas.cli.main` with ``--json`` (where
    the command's printed lines go to stderr instead); without ``--json`` nothing more is printed."""
    if getattr(args, "json", False):
        args.result = doc
