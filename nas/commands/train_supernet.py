"""``nas train-supernet``: train a weight-shared SuperTransformer on a byte-level corpus.

Each step follows the sandwich rule (largest, smallest and N random subnets, gradients
accumulated) with in-place distillation.  The space's task decides what is learned
(:mod:`supernet.task`): next-byte prediction (causal-lm) or BERT-style masked bytes (masked-lm,
``--mask-rate``; loss, distillation and validation on the chosen positions only).  ``--out DIR`` holds ``latest.pt`` (every
``--ckpt-interval`` steps, on Ctrl-C and at the end), ``final.pt`` (when the run reaches
``--max-steps`` / ``--max-time``), ``log.jsonl`` and the cached corpus.  ``--resume``
continues a run exactly.  Under ``torchrun`` it trains data-parallel (DDP).
"""

from __future__ import annotations

import argparse
import logging
import re
from pathlib import Path

log = logging.getLogger(__name__)

NAME = "train-supernet"
HELP = "train a weight-shared supernet (sandwich rule + in-place distillation) on a byte-level corpus"
EXAMPLE = "nas train-supernet search_spaces/tiny.yaml --out runs/tiny --max-time 10m"

# flag -> (field, type, metavar, help); every default is None = "not given" (a resumed run keeps its
# stored value); "{default}" in a help text is filled from TrainConfig / the objective / the data defaults.
CONFIG_FLAGS = {
    "--batch-size": ("batch_size", int, "N", "global batch: windows per step, split across ranks (default {default})"),
    "--seq-len": ("seq_len", int, "N", "window length in bytes (default {default}, at most the space's max_seq_len)"),
    "--lr": ("lr", float, "LR", "peak learning rate (default {default})"),
    "--min-lr": ("min_lr", float, "LR", "learning rate at the end of the cosine (default {default})"),
    "--warmup": ("warmup_steps", int, "N", "linear warm-up steps (default {default})"),
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
    "--mask-rate": (
        "mask_rate",
        float,
        "F",
        "masked-lm spaces: share of each window's positions chosen (BERT-style 80/10/10) and scored, "
        "strictly between 0 and 1 (default {default})",
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
    "log_interval": 10, "seed": 0, "n_random": 2, "distill": 0.5, "balance": "types", "split": "none", "split_at": 0.5,
    "mask_rate": 0.15, **DATA_DEFAULTS,
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "space", nargs="?", help="search-space YAML or shipped name (tiny, base); with --resume it comes from the checkpoint"
    )
    p.add_argument("--out", required=True, metavar="DIR", help="run directory: checkpoints, log.jsonl, corpus cache")
    p.add_argument(
        "--data",
        metavar="PATH",
        help="a text file, a directory of text files, or a glob ('corpus/**/*.txt'); "
        "default: the running Python's standard library sources and help topics",
    )
    p.add_argument(
        "--max-time",
        type=parse_duration,
        metavar="T",
        help="stop after T of training in total (600, 90s, 10m, 1.5h); without --max-steps the schedule follows the clock",
    )
    for flags in (CONFIG_FLAGS, OBJECTIVE_FLAGS, DATA_FLAGS):
        for flag, (dest, kind, metavar, text) in flags.items():
            p.add_argument(flag, dest=dest, type=kind, metavar=metavar, help=text.format(default=HELP_DEFAULTS[dest]))
    p.add_argument(
        "--compile",
        action="store_true",
        default=None,
        help="torch.compile the passes of the largest and smallest subnet (the random ones run eagerly)",
    )
    p.add_argument(
        "--device",
        default="auto",
        choices=("auto", "cpu", "cuda"),
        help="default: cuda when available (bf16 autocast), else cpu (fp32)",
    )
    p.add_argument("--threads", type=int, metavar="N", help="CPU threads for torch (default: torch's choice)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its latest.pt, exactly")
    p.add_argument("--lang", metavar="LANG", help="seq2seq spaces: the target language of the system's gettext catalogs "
                   "(default de; English is the source); --data takes a source<TAB>target file instead")


def parse_duration(text: str) -> float:
    """Seconds from ``600``, ``90s``, ``10m``, ``1.5h`` or ``1h30m``."""
    match = re.fullmatch(r"\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s?)?\s*", text)
    if not match or not any(match.groups()):
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (examples: 600, 90s, 10m, 1.5h, 1h30m)")
    h, m, s = (float(g) if g else 0.0 for g in match.groups())
    return h * 3600 + m * 60 + s


OBJECTIVE_KEYS = ("n_random", "distill", "balance", "split", "split_at", "mask_rate")  # what a resumed run keeps


def _given(args: argparse.Namespace, flags: dict) -> dict:
    return {dest: getattr(args, dest) for dest, *_ in flags.values() if getattr(args, dest) is not None}


def _flag(dest: str) -> str:
    for flags in (CONFIG_FLAGS, OBJECTIVE_FLAGS, DATA_FLAGS):
        for flag, (d, *_) in flags.items():
            if d == dest:
                return flag
    return "--" + dest.replace("_", "-")


def _settings(args: argparse.Namespace, space, stored: dict | None) -> tuple[dict, dict, dict]:
    """(train config, objective settings, data settings): defaults < stored run < flags (where allowed)."""
    from search_spaces import UserError
    from supernet.data import absolute_data
    from supernet.train import TrainConfig

    given = _given(args, CONFIG_FLAGS)
    if args.max_time is not None:
        given["max_time"] = args.max_time
    if args.compile is not None:
        given["compile"] = True
    given_obj, given_data = _given(args, OBJECTIVE_FLAGS), _given(args, DATA_FLAGS)
    if args.data is not None:
        given_data["data"] = absolute_data(args.data)
    if stored is None:
        config = {"seq_len": min(TrainConfig.seq_len, space.max_seq_len), **given}
        if "max_time" in given and "max_steps" not in given:
            config["max_steps"] = None  # time-bound run: the schedule follows the clock
        objective = given_obj  # SandwichObjective's defaults for the rest
        data = {**DATA_DEFAULTS, **given_data}
        return config, objective, data
    # Resuming: the stored settings hold; only bounds and observation may change.
    problems = []
    for dest, value in {**given, **given_obj, **given_data}.items():
        if dest in TrainConfig.RESUMABLE:
            continue
        before = {**stored["train_config"], "balance": "first", "split": "none", "split_at": 0.5, **stored["objective"],
                  "data": stored["data"], "data_seed": stored["data_seed"],
                  "val_fraction": stored["val_fraction"]}.get(dest)
        if value != before:
            flag = "--data" if dest == "data" else _flag(dest)
            problems.append(f"{flag} {value} differs from the run's {before}")
    if problems:
        raise UserError(
            "a resumed run keeps its settings (it may change --max-steps, --max-time, --eval-interval, --eval-batches, "
            "--ckpt-interval, --log-interval, --compile):\n  " + "\n  ".join(problems)
        )
    config = {**stored["train_config"], **{k: v for k, v in given.items() if k in TrainConfig.RESUMABLE}}
    if "max_time" in given and "max_steps" not in given and stored["train_config"]["max_steps"] is None:
        config["max_steps"] = None
    objective = {k: stored["objective"][k] for k in OBJECTIVE_KEYS if k in stored["objective"]}
    objective.setdefault("balance", "first")  # a run from before --balance: its sandwich used the first type
    data = {k: stored[k] for k in ("data", "data_seed", "val_fraction")}
    return config, objective, data


def _bytes_bar(text: str):
    """A progress callback that opens a byte-count tqdm bar on its first call (none with ``-q``)."""
    from tqdm import tqdm

    from nas.cli import show_progress

    bar = None

    def update(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            bar = tqdm(total=total, unit="B", unit_scale=True, desc=text, leave=False, disable=not show_progress())
        bar.update(done - bar.n)
        if done >= total:
            bar.close()

    return update


def _step_bar(config, start_step: int, start_elapsed: float, desc: str = "train-supernet"):
    """A tqdm bar over steps (or over seconds for a time-bound run) with loss, tokens/s and ETA (hidden with ``-q``)."""
    from tqdm import tqdm

    from nas.cli import show_progress

    by_time = config.max_steps is None
    bar = tqdm(
        total=config.max_time if by_time else config.max_steps,
        initial=start_elapsed if by_time else start_step,
        unit="s" if by_time else "step",
        desc=desc,
        dynamic_ncols=True,
        disable=not show_progress(),
        bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f}{unit} [{elapsed}<{remaining}{postfix}]" if by_time else None,
    )

    def update(info) -> None:
        # never past the total: tqdm drops a total that n exceeds, and the bar format needs it
        bar.update(min(info.elapsed if by_time else info.step, bar.total) - bar.n)
        if "largest" in info.losses:  # the sandwich rule: the largest and smallest subnet's losses
            loss = "loss(L/S) " + " ".join(f"{info.losses[k]:.3f}" for k in ("largest", "smallest") if k in info.losses)
        else:
            loss = "loss " + " ".join(f"{v:.3f}" for v in info.losses.values())
        bar.set_postfix_str(f"step {info.step} {loss} lr {info.lr:.2e} {info.tokens_per_s / 1000:.1f}k tok/s", refresh=False)

    return bar, update


def _format_time(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


def run(args: argparse.Namespace) -> int:
    import torch

    from search_spaces import UserError, load_space
    from supernet import SuperTransformer
    from supernet.checkpoint import load_checkpoint
    from supernet.data import check_corpus, prepare_corpus
    from supernet.distributed import init_from_env, shutdown
    from supernet.task import task_for
    from supernet.train import SandwichObjective, SupernetCheckpointer, TrainConfig, train

    out = Path(args.out)
    latest = out / "latest.pt"
    space = load_space(args.space) if args.space else None
    from tasks.translation.workflows import run_seq2seq, stored_task  # the encoder-decoder (translation) branch

    if space.task == "seq2seq" if space is not None else args.resume and stored_task(latest) == "seq2seq":
        return run_seq2seq(args, space)
    if args.lang is not None:
        raise UserError("--lang: for a seq2seq (translation) space only; a language model reads --data")
    if args.threads is not None:
        if args.threads < 1:
            raise UserError(f"--threads: {args.threads} is not a positive integer")
        torch.set_num_threads(args.threads)
    stored_ckpt = None
    if args.resume:
        if not latest.exists():
            raise UserError(f"--resume: {out} holds no checkpoint (latest.pt); start a new run without --resume")
        stored_ckpt = load_checkpoint(latest, space)
        space = stored_ckpt["space"]
        for key in ("train_config", "objective", "data", "data_seed", "val_fraction", "corpus_hash"):
            if key not in stored_ckpt["meta"]:
                raise UserError(f"{latest}: not a train-supernet checkpoint (its meta has no {key!r})")
    elif space is None:
        raise UserError("give a search space (a YAML file or tiny / base), or --resume to continue a run")
    elif latest.exists():
        raise UserError(f"--out {out}: already holds a run (latest.pt); add --resume to continue it, or choose another --out")

    config_dict, objective_dict, data = _settings(args, space, stored_ckpt["meta"] if stored_ckpt else None)
    config = TrainConfig.from_dict(config_dict)
    if config.seq_len > space.max_seq_len:
        raise UserError(f"--seq-len: {config.seq_len} exceeds the space's max_seq_len {space.max_seq_len}")
    task = task_for(space, seed=config.seed, mask_rate=objective_dict.pop("mask_rate", None))

    dist, device = init_from_env(args.device)
    try:
        corpus = None
        for turn in (0, 1):  # rank 0 builds the cache first, the others then map it
            if dist.is_main == (turn == 0):
                corpus = prepare_corpus(data["data"], out, data["data_seed"], data["val_fraction"],
                                        progress=_bytes_bar("encoding corpus") if dist.is_main else None)
            dist.barrier()
        if stored_ckpt is not None:
            check_corpus(corpus, stored_ckpt["meta"]["corpus_hash"], str(latest))
        objective = SandwichObjective(space, seed=config.seed, task=task, **objective_dict)
        model = SuperTransformer(space, generator=torch.Generator().manual_seed(config.seed),
                                 split_families=objective.split == "families").to(device)
        meta = {
            **data,
            "corpus": corpus.meta["corpus"],
            "corpus_hash": corpus.hash,
            "corpus_sizes": corpus.meta["sizes"],
            "corpus_dir": str(corpus.path.relative_to(out)),
        }
        if dist.is_main:
            sizes = corpus.meta["sizes"]
            what = "the Python standard library (PSF licence)" if data["data"] is None else data["data"]
            log.info(
                "corpus: %s: %s training bytes (%d docs), %s validation bytes (%d docs), hash %s",
                what,
                f"{sizes['train']:,}",
                sizes["train_docs"],
                f"{sizes['val']:,}",
                sizes["val_docs"],
                corpus.hash[:16],
            )
            log.info("space %s: %s parameters in the largest subnet; batch %d x %d bytes on %s%s", space.name,
                     f"{model.num_params(space.largest()):,}", config.batch_size, config.seq_len, device,
                     f" x {dist.world} ranks" if dist.enabled else "")
        bar, update = (None, None)
        if dist.is_main:
            state = stored_ckpt["state"] if stored_ckpt else {}
            bar, update = _step_bar(config, state.get("step", 0), state.get("elapsed", 0.0))
        try:
            result = train(
                model, objective, corpus.train, corpus.val, config,
                out=out, checkpointer=SupernetCheckpointer(space), meta=meta,
                resume=stored_ckpt if stored_ckpt is not None else False,
                dist=dist, progress=update, report=log.info if dist.is_main else None,
            )
        finally:
            if bar is not None:
                bar.close()
    finally:
        shutdown()
    if not dist.is_main:
        return 0
    if result.stopped == "interrupted":
        print(
            f"interrupted at step {result.step}; saved {result.checkpoint}. Continue with: nas train-supernet --out {out} "
            "--resume"
        )
        return 130
    print(
        f"trained {result.step} steps ({result.tokens:,} tokens) in {_format_time(result.elapsed)}; stopped by "
        f"--{result.stopped.replace('_', '-')}"
    )
    if result.evals:
        last = result.evals[-1]
        print(f"validation {task.metric} at step {last['step']}: " + ", ".join(f"{k} {v:.3f}" for k, v in last["bpb"].items()))
    print(f"checkpoint: {result.checkpoint} (and {latest}); metrics: {out / 'log.jsonl'}")
    return 0
