"""Training one subnet of a one-stack space as its own model (:meth:`tasks.stack.StackTask.train_subnet`): from
scratch, from the supernet's inherited weights, or from an exported model, optionally distilled from the supernet's
largest subnet.  It runs the one training loop (:func:`supernet.train.train`: AdamW, warm-up + cosine, atomic
checkpoints, exact resume, SIGINT saves) on one static model, on the supernet's corpus, and writes the result as a
model folder in ``nas export``'s format (:func:`tasks.stack.export.write_model`).  The run folder follows
:mod:`supernet.runs`.

Layout of ``out``: the model folder (``model.safetensors``, ``subnet.yaml``, ``model_card.json``, ``model.pt2``,
``model.onnx``) and ``out/train/`` with ``latest.pt`` (every ``ckpt_interval`` steps, on SIGINT / SIGTERM and at the
end), ``final.pt``, ``log.jsonl`` and the corpus cache.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Callable

import torch

from search_spaces import Space, Subnet, UserError
from search_spaces.version import __version__
from supernet.artifact import PROGRAM, WEIGHTS, card_space, read_card, sha256_file
from supernet.artifact import load_model as load_exported
from supernet.checkpoint import load_checkpoint, load_supernet
from supernet.data import check_corpus, prepare_corpus
from supernet.elastic import extract
from supernet.export import ONNX_FILE
from supernet.model import Transformer, TransformerConfig
from supernet.runs import (
    SubnetTraining,
    SubnetTrainingResult,
    TrainingInterrupted,
    check_resumable,
    check_settings,
    check_subnet,
    effective_config,
    finished_card,
    parse_source,
    run_dir,
    run_state,
    source_text,
    step_tokens,
)
from supernet.runs import record as record_of
from supernet.scoring import validation_bpb
from supernet.task import task_for
from supernet.train import (
    Distilled,
    DistillObjective,
    PlainObjective,
    StaticCheckpointer,
    StepInfo,
    TrainConfig,
    read_static_checkpoint,
    train,
    use_threads,
)

from supernet.tokenizer import tokenize_corpus

from .export import write_model

log = logging.getLogger(__name__)


def _digest(kind: str, path: Path) -> str:
    """What identifies a source: the sha256 of a supernet checkpoint, or of an exported model's weights."""
    return read_card(path)["files"].get(WEIGHTS, "") if kind == "model" else sha256_file(path)


def _load_supernet(path: Path, space: Space, flag: str):
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
    if kind == "scratch":
        return Transformer(TransformerConfig.from_subnet(space, subnet), generator=torch.Generator().manual_seed(seed)), {}, None
    if kind == "supernet":
        supernet, payload = _load_supernet(path, space, "--init")
        source = {"source": {"supernet": str(path), "step": payload["meta"].get("step"), "space_hash": supernet.space.hash}}
        return extract(supernet, subnet), source, _digest(kind, path)
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
    supernet, _ = _load_supernet(path, space, "--distill-from")
    return extract(supernet, space.largest()).eval()


def _finished(out: Path, stored: dict, config: TrainConfig, formats: tuple[str, ...]) -> SubnetTrainingResult | None:
    """The result of a run that already reached its bound and wrote its model in ``formats``, else None."""
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
    s = settings
    out, space = Path(s.out), s.space
    subnet = check_subnet(space, s.subnet)
    config = effective_config(s)
    kind, path = parse_source(s.init, "--init", ("scratch", "supernet", "model"))
    teacher_path = parse_source(s.distill_from, "--distill-from", ("supernet",))[1] if s.distill_from else None
    check_settings(s)
    task = task_for(space, seed=config.seed, **(s.options or {}))  # refuses a bad task setting before anything is written
    init, teacher_text = source_text(kind, path), source_text("supernet", teacher_path) if teacher_path else None
    record = record_of(s, init, teacher_text)
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
    if space.tokenizer.bpe:  # the space's vocabulary (trained on the training split, cached), read at the subnet's size
        corpus = tokenize_corpus(corpus, space.tokenizer, corpus_dir).at(space.vocab_of(subnet))
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
    write_model(student, space, out, formats=s.formats, target_ort=s.target_ort, card=card, seed=config.seed,
                tokenizer=corpus.vocabulary.text if space.tokenizer.bpe else None)
    return SubnetTrainingResult(out, result.step, result.tokens, after["bits_per_byte"], result.elapsed,
                                before["bits_per_byte"], result.stopped, student.num_params())
