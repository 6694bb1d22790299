"""Train a supernet of any task: the library workflow behind ``nas train-supernet``.

:func:`train_supernet` takes the command's typed settings (:class:`SupernetRun`: the flags given, nothing
parsed here), loads a resumed run's checkpoint once, asks the space's task for what differs (the flags it
refuses, its data and how a run records it, its learner, its supernet, the objective's defaults) and runs
the one training loop (:func:`supernet.train.train`, the sandwich rule with in-place distillation).

Settings: the defaults < a resumed run's stored settings < the flags given; a resumed run keeps its
settings (only the bounds and what observes the run may change: ``TrainConfig.RESUMABLE``).  Files in
``out``: ``latest.pt`` (every ``ckpt_interval`` steps, on Ctrl-C and at the end), ``final.pt`` (when the run
reaches its bound), ``log.jsonl`` and the data cache.  Under ``torchrun`` it trains data-parallel (DDP).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from search_spaces import Space, UserError, tasks

log = logging.getLogger(__name__)

# A setting's flag where it is not "--" + the field's name with dashes (for messages).
FLAG_NAMES = {"warmup_steps": "--lr-warmup", "n_random": "--random-subnets"}
OBJECTIVE_KEYS = ("n_random", "distill", "balance", "split", "split_at")  # what a resumed run keeps of its objective


def flag_name(dest: str) -> str:
    return FLAG_NAMES.get(dest, "--" + dest.replace("_", "-"))


@dataclass(frozen=True)
class SupernetRun:
    """What one ``nas train-supernet`` run is asked to do: the values of the flags given (None = not given)."""

    out: Path
    space: Space | None = None  # None with resume: the run's own
    resume: bool = False
    config: dict[str, Any] = field(default_factory=dict)  # TrainConfig fields given (max_time and compile among them)
    objective: dict[str, Any] = field(default_factory=dict)  # SandwichObjective fields given
    data: dict[str, Any] = field(default_factory=dict)  # data, data_seed, val_fraction given (data already absolute)
    task_flags: dict[str, Any] = field(default_factory=dict)  # the tasks' own flags given (a masked LM's mask_rate, ...)
    device: str | None = None  # None: a resumed run's own (cpu / cuda), else auto
    threads: int | None = None  # kept in the run's settings (a resumed run sums as the first did)


@dataclass(frozen=True)
class SupernetRunResult:
    main: bool  # this process is rank 0 (the others report nothing)
    result: Any = None  # supernet.train.TrainResult
    metric: str = ""  # what the held-out scores are
    eval_key: str = ""  # their key in result.evals
    token_unit: str = "tokens"  # what result.tokens counts
    latest: Path | None = None


def _merge(run: SupernetRun, space: Space, task, stored: dict | None) -> tuple[dict, dict, dict, dict]:
    """(train config, objective settings, task options, data settings): defaults < stored run < flags (where allowed)."""
    from supernet.train import TrainConfig

    given, given_obj = dict(run.config), dict(run.objective)
    if run.threads is not None:
        given["threads"] = run.threads
    given_opt = {k: v for k, v in run.task_flags.items() if k in task.learner_options}
    given_data = {k: v for k, v in run.data.items() if k in task.data_keys}
    if stored is None:
        config = {"seq_len": min(TrainConfig.seq_len, space.max_seq_len), **given}
        if "max_time" in given and "max_steps" not in given:
            config["max_steps"] = None  # time-bound run: the schedule follows the clock
        return config, given_obj, given_opt, {**task.data_defaults, **given_data}
    # Resuming: the stored settings hold; only bounds and observation may change.
    record = stored["objective"]
    before = {**stored["train_config"], "balance": "first", "split": "none", "split_at": 0.5, **record,
              **{k: stored[k] for k in task.data_keys}}
    problems = [f"{flag_name(dest)} {value} differs from the run's {before.get(dest)}"
                for dest, value in {**given, **given_obj, **given_opt, **given_data}.items()
                if dest not in TrainConfig.RESUMABLE and value != before.get(dest)]
    if problems:
        raise UserError(
            "a resumed run keeps its settings (it may change --max-steps, --max-time, --eval-interval, --eval-batches, "
            "--ckpt-interval, --log-interval, --compile, --threads, --device):\n  " + "\n  ".join(problems)
        )
    config = {**stored["train_config"], **{k: v for k, v in given.items() if k in TrainConfig.RESUMABLE}}
    if "max_time" in given and "max_steps" not in given and stored["train_config"]["max_steps"] is None:
        config["max_steps"] = None
    objective = {k: record[k] for k in OBJECTIVE_KEYS if k in record}
    objective.setdefault("balance", "first")  # a run from before --balance: its sandwich used the first type
    options = {k: record[k] for k in task.learner_options if k in record}
    return config, objective, options, {k: stored[k] for k in task.data_keys}


def train_supernet(run: SupernetRun, progress: Callable | None = None,
                   data_progress: Callable[[int, int], None] | None = None) -> SupernetRunResult:
    """Train (or resume) the supernet of ``run`` (see the module doc); ``progress`` gets every step's
    :class:`supernet.train.StepInfo` and ``data_progress`` the encoding of the data (rank 0 only)."""
    import torch

    from supernet.checkpoint import load_checkpoint
    from supernet.distributed import init_from_env, shutdown
    from supernet.task import task_for
    from supernet.train import SandwichObjective, SupernetCheckpointer, TrainConfig, check_log, train, use_threads

    out, space = Path(run.out), run.space
    latest = out / "latest.pt"
    stored = None
    if run.resume:
        if not latest.exists():
            raise UserError(f"--resume: {out} holds no checkpoint (latest.pt); start a new run without --resume")
        stored = load_checkpoint(latest, space)  # the one load of the run's checkpoint
        space = stored["space"]
    elif space is None:
        raise UserError("give a search space (a YAML file or tiny / base), or --resume to continue a run")
    elif latest.exists():
        raise UserError(f"--out {out}: already holds a run (latest.pt); add --resume to continue it, or choose another --out")
    task = tasks.of(space)
    task.refuse("train-supernet", {**run.config, **run.objective, **run.data})  # generic flags the task does not take
    tasks.refuse_foreign(space, run.task_flags)  # flags of another task
    if stored is not None:
        for key in ("train_config", "objective", *task.data_keys, "corpus_hash"):
            if key not in stored["meta"]:
                raise UserError(f"{latest}: not a train-supernet checkpoint (its meta has no {key!r})")
    if run.threads is not None and run.threads < 1:
        raise UserError(f"--threads: {run.threads} is not a positive integer")

    meta_before = stored["meta"] if stored else None
    config_dict, objective_dict, options, data = _merge(run, space, task, meta_before)
    data = task.data_settings(data, run.task_flags, meta_before)
    if getattr(space, "tokenizer", None) is not None and space.tokenizer.bpe:  # the space's subword vocabularies
        data = {**data, "tokenizer": space.tokenizer.to_dict()}
    config = TrainConfig.from_dict(config_dict)
    check_log(config.log)  # (a resumed run's stored --log too) before the corpus is read
    if config.seq_len > space.max_seq_len:
        raise UserError(f"--seq-len: {config.seq_len} exceeds the space's max_seq_len {space.max_seq_len}")
    learner = task_for(space, seed=config.seed, **options)
    use_threads(config)  # before any sum (train() says so where a resumed run's threads differ)

    dist, device = init_from_env(run.device or (meta_before or {}).get("device") or "auto")
    try:
        corpus = None
        for turn in (0, 1):  # rank 0 builds the cache first, the others then map it
            if dist.is_main == (turn == 0):
                corpus = task.prepare_data(data, out, progress=data_progress if dist.is_main else None)
            dist.barrier()
        if stored is not None:
            task.check_data(corpus, stored["meta"]["corpus_hash"], str(latest))
        objective = SandwichObjective(space, seed=config.seed, task=learner, **{**task.objective_defaults, **objective_dict})
        split = {"split_families": True} if objective.split == "families" else {}
        model = task.supernet(space, generator=torch.Generator().manual_seed(config.seed), **split).to(device)
        meta = {**data, "device": torch.device(device).type,  # what --resume runs on unless --device is given
                "corpus": corpus.meta["corpus"], "corpus_hash": corpus.hash, "corpus_sizes": corpus.meta["sizes"],
                "corpus_dir": str(corpus.path.relative_to(out))}
        if hasattr(corpus, "vocabulary"):  # the trained vocabulary travels with the checkpoint: export writes it out
            meta["vocabulary"] = {**corpus.meta["tokenizer"], "json": corpus.vocabulary.text}
        if dist.is_main:
            log.info("%s", task.describe_data(corpus, data))
            log.info("space %s: %s parameters in the largest subnet; %s on %s%s", space.name,
                     f"{model.num_params(space.largest()):,}", task.describe_batch(config), device,
                     f" x {dist.world} ranks" if dist.enabled else "")
        if torch.device(device).type == "cpu":  # the compiled attention kernels: built (once) before the clock starts
            from supernet.attention import native

            note = native.prebuild()
            if dist.is_main:
                log.info("%s", note)
        result = train(model, objective, corpus.train, corpus.val, config, out=out, checkpointer=SupernetCheckpointer(space),
                       meta=meta, resume=stored if stored is not None else False, dist=dist,
                       progress=progress if dist.is_main else None, report=log.info if dist.is_main else None)
    finally:
        shutdown()
    return SupernetRunResult(dist.is_main, result, learner.metric, learner.eval_key, task.token_unit, latest)
