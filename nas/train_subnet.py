"""Train one subnet on its own: from scratch, from the supernet's inherited weights, or from an exported model.

:func:`train_subnet` is the library entry point behind ``nas train-subnet`` and ``nas finetune``.
It runs the trainer of ``nas train-supernet`` (:func:`supernet.train.train`: AdamW, warm-up +
cosine, atomic checkpoints, exact resume, SIGINT saves) on one static model, on the same corpus
(:func:`supernet.data.prepare_corpus`), and writes the result as a model folder in ``nas export``'s
format (:func:`nas.export.write_model`: safetensors + card, ``model.pt2``, ``model.onnx`` with parity).

A token budget makes comparisons fair: ``tokens`` trains exactly ``tokens // (batch_size * seq_len)``
steps, and step ``k`` draws its windows from ``default_rng([seed, 0, k])``, so two models trained
with the same budget, seed and corpus see exactly the same bytes in the same order.

Layout of ``out``: the model folder (``model.safetensors``, ``subnet.yaml``, ``model_card.json``,
``model.pt2``, ``model.onnx``) and ``out/train/`` with ``latest.pt`` (every ``ckpt_interval`` steps,
on SIGINT / SIGTERM and at the end), ``final.pt``, ``log.jsonl`` and the corpus cache.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import torch

from search_spaces import Space, Subnet, UserError, tasks
from supernet.train import StepInfo, TrainConfig

from .export import FORMATS, ONNX_FILE, Scoring

log = logging.getLogger(__name__)

RUN_DIR = "train"  # out / RUN_DIR holds the run's state
LATEST = "latest.pt"
INIT_FORMS = "scratch, supernet:CKPT or model:DIR"
# The settings a resumed run may change besides TrainConfig.RESUMABLE: bounds, outputs and where things run.
RESUMABLE = ("tokens", "formats", "device", "scoring", "corpus_dir", "target_ort")
# Settings fields -> the flag that sets them, for messages.
FLAGS = {"init": "--init", "data": "--data", "lang": "--lang", "data_seed": "--data-seed", "val_fraction": "--val-fraction",
         "distill_from": "--distill-from", "distill": "--distill", "warmup_steps": "--lr-warmup"}


@dataclass(frozen=True)
class SubnetTraining:
    """What one training run of one subnet does.

    ``init``: ``"scratch"`` (weights drawn from ``config.seed``), ``"supernet:PATH"`` (the subnet's
    weights extracted from a supernet checkpoint of the same space) or ``"model:DIR"`` (an exported
    model of this subnet).  ``tokens``, when given, replaces ``config.max_steps`` with exactly
    ``tokens // (batch_size * seq_len)`` steps (``config.max_time`` still bounds the run if set).
    ``distill_from="supernet:PATH"`` adds ``distill * KL(largest subnet || model)`` to the loss.
    ``resume`` continues ``out/train/latest.pt`` exactly; the stored settings must agree with these
    except the bounds and outputs (``TrainConfig.RESUMABLE`` and :data:`RESUMABLE`).
    """

    space: Space
    subnet: Subnet
    out: Path
    init: str = "scratch"
    tokens: int | None = None
    config: TrainConfig = TrainConfig()
    data: str | None = None
    distill_from: str | None = None
    distill: float = 0.0
    formats: tuple[str, ...] = FORMATS
    resume: bool = False
    device: str = "cpu"
    # optional extras
    data_seed: int = 0  # seed of the train/validation split by document (as train-supernet's --data-seed)
    val_fraction: float = 0.05  # share of the bytes held out (as train-supernet's --val-fraction)
    scoring: Scoring = Scoring()  # the held-out windows of the final bits/byte (the search's defaults)
    corpus_dir: Path | None = None  # where the encoded corpus is cached (default out/train): runs may share one
    target_ort: str | None = None  # the ONNX Runtime that will run model.onnx (default: the installed one)
    options: dict[str, Any] | None = None  # the space's task's own settings (its flags: a masked LM's mask_rate, ...)
    stored: dict[str, Any] | None = field(default=None, compare=False, repr=False)  # a resumed run's loaded checkpoint


@dataclass(frozen=True)
class SubnetTrainingResult:
    out: Path
    steps: int
    tokens: int  # tokens trained on: steps * batch_size * seq_len
    val_bpb: float  # validation bits/byte of the final model (the card's figure)
    seconds: float  # training time over all resumptions (evaluations and checkpoints included)
    val_bpb_before: float = math.nan  # the same figure for the initial model
    stopped: str = "max_steps"  # "max_steps" or "max_time"
    parameters: int = 0

    def summary(self) -> list[str]:
        """The lines a command prints about the finished run."""
        from supernet.artifact import read_card

        card = read_card(self.out)
        files = ", ".join(name for name in card["files"] if name != "model.safetensors")
        metric = card.get("validation", {}).get("metric", "bits/byte")
        return [f"trained {self.steps:,} steps ({self.tokens:,} tokens) in {self.seconds:.0f} s; validation {metric} "
                f"{self.val_bpb_before:.4f} -> {self.val_bpb:.4f}",
                f"wrote {self.out} (load: supernet.load_model({str(self.out)!r})" + (f"; also {files}" if files else "")
                + f"); checkpoints and log in {self.out / RUN_DIR}"]


class TrainingInterrupted(KeyboardInterrupt):
    """SIGINT / SIGTERM stopped the run after a whole step; its state is in ``checkpoint`` (continue with resume=True)."""

    def __init__(self, step: int, checkpoint: Path):
        super().__init__(f"interrupted at step {step}; saved {checkpoint}")
        self.step, self.checkpoint = step, checkpoint


# --------------------------------------------------------------------------- checks


def check_subnet(space: Space, subnet: Subnet, where: str = "subnet") -> Subnet:
    """``subnet`` if it is in ``space``; else one line naming every field that is not."""
    problems = space.problems(subnet)
    if problems:
        raise UserError(f"{where}: not in space {space.name!r} ({space.source}): " + "; ".join(problems))
    return subnet


def parse_source(text: str | None, flag: str, kinds: tuple[str, ...]) -> tuple[str, Path | None]:
    """``scratch`` -> ("scratch", None); ``supernet:PATH`` / ``model:DIR`` -> (kind, absolute path)."""
    if text == "scratch" and "scratch" in kinds:
        return "scratch", None
    kind, _, path = str(text).partition(":")
    if kind in kinds and kind != "scratch" and path:
        return kind, Path(path).expanduser().resolve()
    forms = ", ".join("scratch" if k == "scratch" else f"{k}:{'DIR' if k == 'model' else 'CKPT'}" for k in kinds)
    raise UserError(f"{flag}: {text!r} is not one of {forms}")


def source_text(kind: str, path: Path | None) -> str:
    return kind if path is None else f"{kind}:{path}"


def step_tokens(config: TrainConfig) -> int:
    """Tokens one step trains on."""
    return config.batch_size * config.seq_len


def effective_config(settings: SubnetTraining) -> TrainConfig:
    """``settings.config`` with the token budget turned into ``max_steps``; a budget below one step is refused."""
    config = settings.config
    if config.seq_len > settings.space.max_seq_len:
        raise UserError(f"--seq-len: {config.seq_len} exceeds the space's max_seq_len {settings.space.max_seq_len}")
    if settings.tokens is None:
        return config
    per_step = step_tokens(config)
    steps = settings.tokens // per_step
    if steps < 1:
        raise UserError(f"--tokens: {settings.tokens:,} is below one step of {config.batch_size} x {config.seq_len} = "
                        f"{per_step:,} tokens (--batch-size x --seq-len); give at least {per_step:,}")
    return replace(config, max_steps=steps)


def _check_settings(s: SubnetTraining) -> None:
    if not 0.0 <= s.distill <= 1.0:
        raise UserError(f"--distill: {s.distill} is not between 0 and 1")
    if s.distill > 0 and not s.distill_from:
        raise UserError(f"--distill: {s.distill} needs a teacher (--distill-from supernet:CKPT)")
    if s.distill_from and s.distill == 0:
        raise UserError(f"--distill-from {s.distill_from}: the teacher would have no weight; give --distill W > 0")
    bad = [f for f in s.formats if f not in FORMATS]
    if bad:
        raise UserError(f"--format: {', '.join(bad)}; expected a comma-separated list of {', '.join(FORMATS)}")
    if str(s.device).startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"--device {s.device}: CUDA is not available on this machine")


def _record(s: SubnetTraining, init: str, teacher: str | None) -> dict[str, Any]:
    """The run's settings besides its TrainConfig, as stored in every checkpoint and in the card."""
    from supernet.data import absolute_data

    task = {k: v for k, v in (s.options or {}).items() if v is not None}  # none for a decoder: older runs resume
    return {
        **task, "init": init, "tokens": s.tokens, "data": absolute_data(s.data), "data_seed": s.data_seed,
        "val_fraction": s.val_fraction, "distill_from": teacher, "distill": s.distill if teacher else 0.0,
        "formats": list(s.formats), "device": str(s.device), "target_ort": s.target_ort,
        "scoring": {"windows": s.scoring.windows, "seq_len": s.scoring.seq_len, "seed": s.scoring.seed,
                    "batch_size": s.scoring.batch_size},
        "corpus_dir": None if s.corpus_dir is None else str(Path(s.corpus_dir).resolve()),
    }


def run_state(out: Path, resume: bool, stored: dict[str, Any] | None, load: Callable[[Path], dict]) -> tuple[Path, dict | None]:
    """(``out/train/latest.pt``, a resumed run's checkpoint: ``stored`` if the caller loaded it, else ``load(latest)``);
    for a new run, the checks that ``out`` holds neither a run nor a model."""
    from supernet.artifact import CARD

    latest = run_dir(out) / LATEST
    if resume:
        if not latest.is_file():
            raise UserError(f"--resume: {out} holds no checkpoint ({RUN_DIR}/{LATEST}); start a new run without --resume")
        return latest, stored if stored is not None else load(latest)
    if latest.exists():
        raise UserError(f"--out {out}: already holds a training run ({RUN_DIR}/{LATEST}); add --resume to continue it, "
                        "or choose another --out")
    if (out / CARD).exists():
        raise UserError(f"--out {out}: already holds a model ({CARD}) and no training run; choose another --out")
    return latest, None


def check_resumable(record: dict, config: TrainConfig, stored_meta: dict, formats: bool = True) -> None:
    """Refuse, in one line, a resumed run whose settings differ from the run's where they may not (``formats``: whether
    ``--format`` is among what may change)."""
    problems = _resume_problems(record, config, stored_meta)
    if problems:
        raise UserError("--resume: " + "; ".join(problems) + " (a resumed run may change only its bounds and outputs: "
                        "--tokens, --max-steps, --max-time, --eval-interval, --eval-batches, --ckpt-interval, "
                        f"--log-interval, {'--format, ' if formats else ''}--device, --threads)")


def _resume_problems(record: dict, config: TrainConfig, stored_meta: dict) -> list[str]:
    before = stored_meta["settings"]
    problems = [f"{FLAGS.get(k, '--' + k.replace('_', '-'))} {record[k]} differs from the run's {before.get(k)}"
                for k in record if k not in RESUMABLE and record[k] != before.get(k)]
    stored_config = stored_meta["train_config"]
    for name, value in config.to_dict().items():
        if name not in TrainConfig.RESUMABLE and value != stored_config.get(name):
            flag = FLAGS.get(name, "--" + name.replace("_", "-"))
            problems.append(f"{flag} {value} differs from the run's {stored_config.get(name)}")
    return problems


# --------------------------------------------------------------------------- where the weights come from


def _digest(kind: str, path: Path) -> str:
    """What identifies a source: the sha256 of a supernet checkpoint, or of an exported model's weights."""
    from supernet.artifact import WEIGHTS, read_card, sha256_file

    return read_card(path)["files"].get(WEIGHTS, "") if kind == "model" else sha256_file(path)


def _load_supernet(path: Path, space: Space, flag: str):
    from supernet.checkpoint import load_checkpoint, load_supernet

    try:
        supernet, payload = load_supernet(path)
    except UserError:
        try:  # a supernet of another task (an encoder-decoder's): the space given is what does not fit, say so
            theirs = load_checkpoint(path)["space"]
        except UserError:
            theirs = None
        if theirs is not None and theirs.arch_hash != space.arch_hash:
            raise _other_space(flag, path, theirs, space) from None
        raise
    if supernet.space.arch_hash != space.arch_hash:
        raise _other_space(flag, path, supernet.space, space)
    return supernet, payload


def _other_space(flag: str, path: Path, theirs: Space, space: Space) -> UserError:
    text = (f"{flag} supernet:{path}: trained on space {theirs.name!r} (arch hash {theirs.arch_hash}), not on space "
            f"{space.name!r} (arch hash {space.arch_hash}, {space.source})")
    if getattr(theirs, "task", None) != getattr(space, "task", None):
        text += (f": it is a {theirs.task} supernet and --space a {space.task} space; give the supernet's own space "
                 f"({theirs.name!r}) as --space, and a subnet of it")
    return UserError(text)


def _initial(kind: str, path: Path | None, space: Space, subnet: Subnet, seed: int):
    """(the initial static model, the card fields it passes on, the source's digest)."""
    from supernet import Transformer, TransformerConfig, extract

    if kind == "scratch":
        return Transformer(TransformerConfig.from_subnet(space, subnet), generator=torch.Generator().manual_seed(seed)), {}, None
    if kind == "supernet":
        supernet, payload = _load_supernet(path, space, "--init")
        source = {"source": {"supernet": str(path), "step": payload["meta"].get("step"), "space_hash": supernet.space.hash}}
        return extract(supernet, subnet), source, _digest(kind, path)
    from supernet.artifact import card_space, read_card
    from supernet.artifact import load_model as load_exported

    card = read_card(path)
    theirs = card_space(path, card)
    if theirs.arch_hash != space.arch_hash:
        raise UserError(f"--init model:{path}: a model of space {theirs.name!r} (arch hash {theirs.arch_hash}), not of "
                        f"space {space.name!r} (arch hash {space.arch_hash}, {space.source})")
    model = load_exported(path)
    if model.subnet != subnet:
        raise UserError(f"--init model:{path}: holds {model.subnet}, not the subnet to train ({subnet})")
    return model, {k: card[k] for k in ("source", "latency") if k in card}, _digest(kind, path)


def initial_model(settings: SubnetTraining):
    """The static model a run of ``settings`` starts from, before any step (on the CPU, train mode)."""
    subnet = check_subnet(settings.space, settings.subnet)
    kind, path = parse_source(settings.init, "--init", ("scratch", "supernet", "model"))
    return _initial(kind, path, settings.space, subnet, settings.config.seed)[0].train()


def _teacher(path: Path, space: Space):
    from supernet import extract

    supernet, _ = _load_supernet(path, space, "--distill-from")
    return extract(supernet, space.largest()).eval()


# --------------------------------------------------------------------------- runs on disk


def run_dir(out: str | Path) -> Path:
    return Path(out) / RUN_DIR


def resumable(out: str | Path) -> bool:
    """Whether ``out`` holds a run to continue (``train_subnet`` with ``resume=True``)."""
    return (run_dir(out) / LATEST).is_file()


def read_run(latest: Path) -> dict[str, Any]:
    """A subnet run's checkpoint, loaded once: a one-stack model's training checkpoint or a task's own model's (a supernet
    checkpoint format holding a static model); ``space_obj`` and ``subnet_obj`` parsed and checked either way."""
    from supernet.checkpoint import load_checkpoint, read_torch
    from supernet.train import STATIC_FORMAT, read_static_checkpoint

    raw = read_torch(latest, "training checkpoint")
    if isinstance(raw, dict) and raw.get("format") != STATIC_FORMAT and "space" in raw:
        payload = load_checkpoint(latest, payload=raw)  # a task's own model, in the supernet checkpoint format
    else:
        return read_static_checkpoint(latest, raw)
    meta, space = payload["meta"], payload["space"]
    if meta.get("kind") != "subnet" or "settings" not in meta:
        raise UserError(f"{latest}: not a train-subnet run (a supernet's checkpoint?); start a new run in another --out")
    subnet = space.subnet_type.from_dict(meta["subnet"], where=f"{latest}[subnet]")
    return {**payload, "space_obj": space, "subnet_obj": space.check(subnet)}


def stored_settings(out: str | Path) -> SubnetTraining:
    """The settings of the run in ``out`` (from ``out/train/latest.pt``, loaded once and kept in ``stored``), with
    ``resume=True``."""
    latest = run_dir(out) / LATEST
    if not latest.is_file():
        raise UserError(f"--resume: {out} holds no checkpoint ({RUN_DIR}/{LATEST}); start a new run without --resume")
    payload = read_run(latest)
    meta = payload["meta"]
    if "settings" not in meta or "train_config" not in meta:
        raise UserError(f"{latest}: holds no run settings (written by another tool or an older `nas finetune`); start a new "
                        "run in another --out")
    r, defaults = meta["settings"], SubnetTraining.__dataclass_fields__
    kept = {k: r[k] for k in ("distill_from", "distill", "val_fraction", "target_ort") if k in r}  # (a task's run may lack some)
    flags = {f.dest for f in tasks.of(payload["space_obj"]).flags}
    return SubnetTraining(
        space=payload["space_obj"], subnet=payload["subnet_obj"], out=Path(out), init=r["init"], tokens=r["tokens"],
        config=TrainConfig.from_dict(meta["train_config"]), data=r["data"], resume=True, device=r["device"],
        data_seed=r["data_seed"], formats=tuple(r.get("formats", defaults["formats"].default)),
        scoring=Scoring(**r["scoring"]) if "scoring" in r else Scoring(),
        corpus_dir=None if r["corpus_dir"] is None else Path(r["corpus_dir"]),
        options={k: r[k] for k in flags if r.get(k) is not None} or None, stored=payload, **kept,
    )


def finished_card(out: Path, stored: dict, config: TrainConfig) -> dict | None:
    """The model card in ``out`` of a run (``stored``: its loaded ``latest.pt``) that already reached its bound and
    wrote its model at that step (a rerun of a finished run), else None."""
    from supernet.artifact import WEIGHTS, read_card, verify_file

    state, meta = stored["state"], stored["meta"]
    if meta.get("stopped") in (None, "interrupted"):
        return None
    step, elapsed = state.get("step", -1), state.get("elapsed", 0.0)
    if not ((config.max_steps is not None and step >= config.max_steps) or
            (config.max_time is not None and elapsed >= config.max_time)):
        return None
    try:
        card = read_card(out)
        verify_file(out, WEIGHTS, card)
    except UserError:
        return None
    done = card.get("training", {})
    return card if done.get("steps") == step and done.get("run_started") == meta.get("run_started") else None


def _finished(out: Path, stored: dict, config: TrainConfig, formats: tuple[str, ...]) -> SubnetTrainingResult | None:
    """The result of a run that already reached its bound and wrote its model in ``formats``, else None."""
    from supernet.artifact import PROGRAM, WEIGHTS

    card = finished_card(out, stored, config)
    wanted = {WEIGHTS} | ({PROGRAM} if "torch" in formats else set()) | ({ONNX_FILE} if "onnx" in formats else set())
    if card is None or not wanted <= set(card["files"]):
        return None
    done = card["training"]
    return SubnetTrainingResult(out, done["steps"], done["tokens"], done["bits_per_byte_after"], done["seconds"],
                                done["bits_per_byte_before"], done["stopped"], card["parameters"])


# --------------------------------------------------------------------------- the run


def train_subnet(settings: SubnetTraining, progress: Callable[[StepInfo], None] | None = None) -> SubnetTrainingResult:
    """Train ``settings.subnet`` as its own model and write it to ``settings.out`` (see the module docstring).

    Every check of the settings runs before anything is written.  ``progress`` is called after
    every step with a :class:`supernet.train.StepInfo`.  SIGINT / SIGTERM end the step, save
    ``out/train/latest.pt`` and raise :class:`TrainingInterrupted`.  Rerunning a finished run
    with ``resume=True`` and the same bounds returns its result without training again.
    """
    import time

    from nas import __version__
    from supernet import Transformer, TransformerConfig
    from supernet.data import check_corpus, prepare_corpus
    from supernet.task import task_for
    from supernet.train import (Distilled, DistillObjective, PlainObjective, StaticCheckpointer, read_static_checkpoint, train,
                                use_threads)

    from .export import validation_bpb, write_model

    s = settings
    out, space = Path(s.out), s.space
    subnet = check_subnet(space, s.subnet)
    config = effective_config(s)
    kind, path = parse_source(s.init, "--init", ("scratch", "supernet", "model"))
    teacher_path = parse_source(s.distill_from, "--distill-from", ("supernet",))[1] if s.distill_from else None
    _check_settings(s)
    task = task_for(space, seed=config.seed, **(s.options or {}))  # refuses a bad task setting before anything is written
    init, teacher_text = source_text(kind, path), source_text("supernet", teacher_path) if teacher_path else None
    record = _record(s, init, teacher_text)
    if kind == "model" and path.resolve() == out.resolve():
        raise UserError(f"--out {out}: is the source model directory; choose a new directory")
    state_dir = run_dir(out)
    latest, stored = run_state(out, s.resume, s.stored, read_static_checkpoint)  # (loaded once by stored_settings)
    if stored is not None:
        theirs, their_subnet = stored["space_obj"], stored["subnet_obj"]
        if theirs.arch_hash != space.arch_hash or their_subnet != subnet:
            raise UserError(f"--resume: {latest} trains {their_subnet} of space {theirs.name!r} (arch hash {theirs.arch_hash}), "
                            f"not {subnet} of space {space.name!r} (arch hash {space.arch_hash})")
        if "settings" not in stored["meta"]:
            raise UserError(f"{latest}: holds no run settings (written by another tool or an older `nas finetune`); start a new "
                            "run in another --out")
        check_resumable(record, config, stored["meta"])
        if path is not None and path.exists() and _digest(kind, path) != stored["meta"]["init_sha256"]:
            raise UserError(f"--init {init}: not the {'model' if kind == 'model' else 'checkpoint'} this run started from "
                            f"(its weights changed since; the run's sha256 {stored['meta']['init_sha256'][:12]}...)")
        finished = _finished(out, stored, config, s.formats)
        if finished is not None:
            log.info("%s: the run already reached step %d and wrote its model", out, finished.steps)
            return finished

    use_threads(config)  # before any sum (train() says so where a resumed run's threads differ)
    if stored is None:
        student, passed_on, digest = _initial(kind, path, space, subnet, config.seed)
    else:  # the checkpoint holds the weights; the source need not exist any more
        student = Transformer(TransformerConfig.from_subnet(space, subnet), generator=torch.Generator().manual_seed(config.seed))
        passed_on, digest = stored["meta"]["passed_on"], stored["meta"]["init_sha256"]
    teacher = _teacher(teacher_path, space) if teacher_path is not None else None

    corpus_dir = state_dir if s.corpus_dir is None else Path(s.corpus_dir)
    corpus = prepare_corpus(record["data"], corpus_dir, s.data_seed, s.val_fraction)
    if stored is not None:
        check_corpus(corpus, stored["meta"]["corpus_hash"], str(latest))
    where = f"validation split of {record['data'] or 'the default corpus'} (seed {s.data_seed}, fraction {s.val_fraction})"
    before = (stored["meta"]["bpb_before"] if stored is not None
              else validation_bpb(student, space, corpus.val, s.scoring, where, s.options))

    device = torch.device(s.device)
    model = Distilled(student.to(device).train(), teacher.to(device) if teacher is not None else None)
    objective = DistillObjective(model, s.distill, task) if teacher is not None else PlainObjective(task)
    meta = {
        "settings": record, "init_sha256": digest, "passed_on": passed_on, "corpus_hash": corpus.hash, "bpb_before": before,
        "space_hash": space.hash, "arch_hash": space.arch_hash, "nas": __version__,
        "run_started": stored["meta"]["run_started"] if stored is not None else round(time.time(), 3),
    }
    if stored is None:
        bounds = [f"{config.max_steps:,} steps of {config.batch_size} x {config.seq_len} tokens"] if config.max_steps else []
        if s.tokens is not None and s.tokens % step_tokens(config):
            bounds[0] += f" (--tokens {s.tokens:,}: the last {s.tokens % step_tokens(config):,} make no whole step)"
        bounds += [f"at most {config.max_time:g} s"] if config.max_time else []
        teaching = f"; distilled from the largest subnet of {teacher_path} (weight {s.distill})" if teacher is not None else ""
        log.info("training %s (%s parameters) from %s: %.4f %s before; %s%s", subnet, f"{student.num_params():,}",
                 init, before["bits_per_byte"], task.metric, ", ".join(bounds), teaching)
    result = train(model, objective, corpus.train, corpus.val, config, out=state_dir,
                   checkpointer=StaticCheckpointer(space, subnet), meta=meta, resume=stored if stored is not None else False,
                   progress=progress, report=log.info)
    if result.stopped == "interrupted":
        raise TrainingInterrupted(result.step, result.checkpoint)

    log.info("scoring the model at step %d and writing %s (%s)", result.step, out,
             ", ".join(("safetensors", *s.formats)))
    student = student.cpu().eval()
    after = validation_bpb(student, space, corpus.val, s.scoring, where, s.options)
    card = {
        **passed_on,
        "validation": after,
        "training": {
            **record, "init_sha256": digest, "token_budget": s.tokens, "steps": result.step, "tokens": result.tokens,
            "seconds": round(result.elapsed, 1), "stopped": result.stopped, "seed": config.seed,
            "train_config": config.to_dict(), "corpus_hash": corpus.hash, "corpus": corpus.meta.get("corpus"),
            "space_hash": space.hash, "arch_hash": space.arch_hash, "teacher": teacher_text,
            "bits_per_byte_before": before["bits_per_byte"], "bits_per_byte_after": after["bits_per_byte"],
            "run_started": meta["run_started"], "versions": {"nas": __version__, "torch": str(torch.__version__)},
        },
    }
    write_model(student, space, out, formats=s.formats, target_ort=s.target_ort, card=card, seed=config.seed)
    return SubnetTrainingResult(out, result.step, result.tokens, after["bits_per_byte"], result.elapsed,
                                before["bits_per_byte"], result.stopped, student.num_params())
