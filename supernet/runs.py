"""The run-folder protocol of training one subnet as its own model, shared by every task (``nas train-subnet``, ``nas
finetune``, a task's own trainer): the settings (:class:`SubnetTraining`), the result (:class:`SubnetTrainingResult`),
where a run keeps its state (``out/train/latest.pt``), the record stored in every checkpoint and card, what a resumed
run may change (:func:`check_resumable`) and how a finished run is recognised (:func:`finished_card`).

A task trains its model with these (:meth:`tasks.base.Task.train_subnet`: a one-stack model's is
:func:`tasks.stack.train.train_subnet`); the workflow (:mod:`nas.train_subnet`) calls the task and no task calls it.

A token budget makes comparisons fair: ``tokens`` trains exactly ``tokens // (batch_size * seq_len)`` steps, and step
``k`` draws its windows from ``default_rng([seed, 0, k])``, so two models trained with the same budget, seed and corpus
see exactly the same bytes in the same order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import torch

from search_spaces import Space, Subnet, UserError, tasks

from .artifact import CARD, WEIGHTS, read_card, verify_file
from .checkpoint import load_checkpoint, load_supernet, read_torch
from .data import absolute_data
from .export import FORMATS
from .scoring import Scoring
from .train import STATIC_FORMAT, TrainConfig, read_static_checkpoint

RUN_DIR = "train"  # out / RUN_DIR holds the run's state
LATEST = "latest.pt"
INIT_FORMS = "scratch, supernet:CKPT or model:DIR"
# The settings a resumed run may change besides TrainConfig.RESUMABLE: bounds, outputs and where things run.
RESUMABLE = ("tokens", "formats", "device", "scoring", "corpus_dir", "target_ort")
# Settings fields -> the flag that sets them, for messages.
# The final-training recipes: how a found subnet becomes the deployed model (scripts/bench_final_training.py measures
# them at equal CPU time: docs/benchmarks/final-training/).  The one place that says which one the benchmarks and
# `nas demo` use unless told: the one that table chose (inherit, on the LM, images and translation, 2026-11-29).
RECIPES = {
    "scratch": "weights drawn from the seed, trained on the task's data",
    "inherit": "the subnet's slice of the supernet (--init supernet:CKPT), fine-tuned on the task's data",
    "distill": "the subnet's slice, fine-tuned with the supernet's largest subnet as a teacher (--init supernet:CKPT "
               "--distill-from supernet:CKPT --distill 0.5)",
}
DEFAULT_RECIPE = "inherit"
RECIPE_DISTILL = 0.5  # the teacher's weight of the distill recipe (train-subnet's --distill default)
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


# --------------------------------------------------------------------------- recipes


def recipe_sources(recipe: str, supernet: str | Path | None, flag: str = "--recipe") -> dict[str, Any]:
    """:class:`SubnetTraining`'s ``init``, ``distill_from`` and ``distill`` of a final-training ``recipe`` (one of
    :data:`RECIPES`) from the supernet checkpoint ``supernet`` (not read for ``scratch``); one line naming ``flag``
    for an unknown recipe or one that needs a supernet and has none."""
    if recipe not in RECIPES:
        raise UserError(f"{flag}: {recipe!r} is not one of {', '.join(RECIPES)}")
    if recipe == "scratch":
        return {"init": "scratch", "distill_from": None, "distill": 0.0}
    if supernet is None:
        raise UserError(f"{flag} {recipe}: needs the supernet checkpoint the subnet was found in")
    source = f"supernet:{Path(supernet).resolve()}"
    return {"init": source, "distill_from": source if recipe == "distill" else None,
            "distill": RECIPE_DISTILL if recipe == "distill" else 0.0}


def recipe_flags(recipe: str, supernet: str | Path | None, flag: str = "--recipe") -> list[str]:
    """The ``nas train-subnet`` flags of a recipe (:func:`recipe_sources`): what a script that runs the command adds."""
    r = recipe_sources(recipe, supernet, flag)
    return (["--init", r["init"]] + (["--distill-from", r["distill_from"], "--distill", str(r["distill"])]
                                     if r["distill_from"] else []))


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


def source_supernet(path: Path, space: Space, flag: str) -> tuple[torch.nn.Module, dict[str, Any]]:
    """(the supernet of ``flag supernet:PATH``, its checkpoint) on the CPU in eval mode; one line naming both spaces when
    it was trained on another architecture than ``space``'s (any task's supernet: its task builds it)."""
    supernet, payload = load_supernet(path)
    theirs = supernet.space
    if theirs.arch_hash != space.arch_hash:
        raise UserError(f"{flag} supernet:{path}: trained on space {theirs.name!r} (arch hash {theirs.arch_hash}), not on "
                        f"space {space.name!r} (arch hash {space.arch_hash}, {space.source})")
    return supernet, payload


def teacher_model(path: Path, space: Space) -> torch.nn.Module:
    """The teacher of ``--distill-from supernet:PATH``: the supernet's largest subnet (its best model, the in-place
    distillation's teacher while it trained), extracted as a static model in eval mode."""
    supernet, _ = source_supernet(path, space, "--distill-from")
    return supernet.extract(space.largest()).eval()


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


def check_settings(s: SubnetTraining) -> None:
    """The settings' own consistency (distillation, formats, device), before anything is written."""
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


def record(s: SubnetTraining, init: str, teacher: str | None) -> dict[str, Any]:
    """The run's settings besides its TrainConfig, as stored in every checkpoint and in the card."""
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


# --------------------------------------------------------------------------- runs on disk


def run_dir(out: str | Path) -> Path:
    return Path(out) / RUN_DIR


def resumable(out: str | Path) -> bool:
    """Whether ``out`` holds a run to continue (``train_subnet`` with ``resume=True``)."""
    return (run_dir(out) / LATEST).is_file()


def read_run(latest: Path) -> dict[str, Any]:
    """A subnet run's checkpoint, loaded once: a one-stack model's training checkpoint or a task's own model's (a supernet
    checkpoint format holding a static model); ``space_obj`` and ``subnet_obj`` parsed and checked either way."""
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
