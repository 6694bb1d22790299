"""``nas finetune``: train an exported model further, optionally distilled from the supernet's largest subnet.

Inherited weights are a starting point; a few thousand steps on the model alone usually lower
its loss.  This is ``nas train-subnet`` with ``--init model:DIR`` (the same library function,
:func:`nas.train_subnet.train_subnet`, and the same training flags) and fine-tuning defaults: a
tenth of the learning rates, a short warm-up.  ``--out DIR2`` becomes a new model directory (same
layout as ``nas export``, card with bits per byte before and after); its ``train/`` folder holds
``latest.pt`` (every ``--ckpt-interval`` steps, on Ctrl-C and at the end), ``log.jsonl`` and the
corpus cache.  ``--resume`` continues a killed or interrupted run exactly.

``--task classify`` fine-tunes an exported *encoder* (a model whose attention is bidirectional) for text
classification instead: ``--data`` is then a UTF-8 CSV with a text and a label column, a mean-pooled
linear head goes on the encoder, and ``--out`` gets the classifier (:mod:`nas.classify`; ``nas classify``
runs it).  Without ``--task`` the command fine-tunes the language model as above.
"""

from __future__ import annotations

import argparse
import logging
import shlex
from pathlib import Path

from .registry import register_command

log = logging.getLogger(__name__)

NAME = "finetune"
HELP = "train an exported model further (optionally distilled from the supernet); resumable; writes a new model directory"
EXAMPLE = "nas finetune --model runs/export --out runs/finetuned --supernet runs/tiny/latest.pt --distill 0.5 --max-time 10m"

# Fine-tuning defaults (TrainConfig fields): a tenth of train-supernet's learning rates, a short warm-up.
DEFAULTS = {"lr": 3e-4, "min_lr": 3e-5, "warmup_steps": 20, "max_steps": 500, "eval_interval": 100, "ckpt_interval": 100}
FORMATS = "torch"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from nas.commands.train_subnet import add_training_arguments

    p.add_argument(
        "--model", required=True, metavar="DIR", help="model directory written by `nas export` (or a previous finetune)"
    )
    p.add_argument(
        "--out", required=True, metavar="DIR2", help="new model directory (its train/ folder holds checkpoints and logs)"
    )
    p.add_argument(
        "--supernet", metavar="CKPT", help="distil from this supernet's largest subnet (the checkpoint the model came from)"
    )
    p.add_argument(
        "--distill", type=float, metavar="W", help="weight of the teacher's soft targets, 0..1 (default 0.5 with --supernet)"
    )
    c = p.add_argument_group("classification (--task classify)")
    c.add_argument("--task", metavar="TASK", help="classify: fine-tune an exported encoder (bidirectional attention) with a "
                   "pooled head on a labelled CSV (--data); its defaults: lr 1e-3, min-lr 1e-4, warm-up 20, 300 steps, batch 16, "
                   "weight decay 0.01, seq-len the model's max_seq_len, val-fraction 0.2.  Default: language-model "
                   "fine-tuning")
    c.add_argument("--text-column", metavar="NAME", help="the CSV column of the texts (default text)")
    c.add_argument("--label-column", metavar="NAME", help="the CSV column of the labels (default label)")
    add_training_arguments(p, DEFAULTS, FORMATS)


def _progress_bar():
    from nas.commands.common import step_bar

    return step_bar("training")


def run(args: argparse.Namespace) -> int:
    from nas.commands.common import set_threads
    from nas.commands.train_subnet import new_settings, resumed
    from nas.commands.common import train_and_report
    from nas.train_subnet import train_subnet
    from supernet.runs import parse_source, source_text, stored_settings
    from search_spaces import Subnet, UserError
    from supernet.artifact import card_space, read_card

    if args.task is not None:
        return _run_classify(args)
    for flag in ("text_column", "label_column"):
        if getattr(args, flag) is not None:
            raise UserError(f"--{flag.replace('_', '-')}: only with --task classify")
    if args.distill is not None and not args.supernet:
        raise UserError("--distill: needs --supernet CKPT (the teacher is the supernet's largest subnet)")
    set_threads(args)
    src, out = Path(args.model), Path(args.out)
    if src.resolve() == out.resolve():
        raise UserError(f"--out {out}: is the source model directory; choose a new directory")
    teacher = f"supernet:{args.supernet}" if args.supernet else None
    if args.resume:
        stored = stored_settings(out)
        given = source_text(*parse_source(teacher, "--supernet", ("supernet",))) if teacher else None
        if given != stored.distill_from:
            raise UserError(f"--supernet: a resumed run keeps its teacher ({stored.distill_from or 'none'}); got "
                            f"{args.supernet or 'none'}")
        settings = resumed(args, stored, init=f"model:{src}")
    else:
        card = read_card(src)
        space = card_space(src, card)
        subnet = Subnet.from_dict(card.get("subnet"), where=f"{src / 'model_card.json'}[subnet]")
        settings = new_settings(args, space, subnet, out, f"model:{src}", teacher, DEFAULTS, FORMATS)
    return train_and_report(train_subnet, settings, _progress_bar(), f"nas finetune --model {shlex.quote(str(src))} "
                            f"--out {shlex.quote(str(out))} --resume")  # (exact: --threads etc. are kept)


# --------------------------------------------------------------------------- --task classify

TASKS = ("classify",)
# Flags of language-model fine-tuning that --task classify does not use.
NOT_FOR_CLASSIFY = {"supernet": "--supernet", "distill": "--distill", "tokens": "--tokens", "format": "--format",
                    "target_ort": "--target-ort", "eval_batches": "--eval-batches"}


def _classify_flags() -> dict[str, str]:
    """Settings field -> flag, for the library's messages."""
    from nas.commands.common import CONFIG_FLAGS

    flags = {dest: flag for flag, (dest, *_) in CONFIG_FLAGS.items()}
    return {**flags, "model": "--model", "data": "--data", "text_column": "--text-column", "label_column": "--label-column",
            "data_seed": "--data-seed", "val_fraction": "--val-fraction"}


def _classify_settings(args: argparse.Namespace):
    """The :class:`nas.classify.ClassifyTraining` of the flags (over the stored run's settings with --resume)."""
    from dataclasses import replace

    from nas.classify import DEFAULTS as CLASSIFY_DEFAULTS
    from nas.classify import VAL_FRACTION, ClassifyTraining, stored_settings
    from nas.commands.common import given_config, train_device
    from search_spaces import UserError
    from supernet.artifact import card_space
    from supernet.train import TrainConfig

    out = Path(args.out)
    given = given_config(args)
    fields = {k: getattr(args, k) for k in ("text_column", "label_column", "data_seed", "val_fraction")
              if getattr(args, k) is not None}
    if args.resume:
        stored = stored_settings(out)
        return replace(stored, model=Path(args.model), data=Path(args.data) if args.data else stored.data,
                       config=TrainConfig.from_dict({**stored.config.to_dict(), **given}),
                       device=train_device(args.device) if args.device else stored.device, **fields)
    if not args.data:
        raise UserError("--data: --task classify needs a labelled CSV (--data FILE.csv with a text and a label column)")
    values = {**CLASSIFY_DEFAULTS, **given}
    if "seq_len" not in given:
        values["seq_len"] = card_space(Path(args.model)).max_seq_len
    if "max_time" in given and "max_steps" not in given:
        values["max_steps"] = None
    fields.setdefault("val_fraction", VAL_FRACTION)
    return ClassifyTraining(model=Path(args.model), data=Path(args.data), out=out, config=TrainConfig.from_dict(values),
                            device=train_device(args.device), **fields)


def _run_classify(args: argparse.Namespace) -> int:
    from nas.classify import ClassifyInterrupted, finetune_classifier
    from nas.commands.common import set_threads
    from search_spaces import UserError

    if args.task not in TASKS:
        raise UserError(f"--task: {args.task!r} is not one of {', '.join(TASKS)} (leave --task out to fine-tune the "
                        "language model)")
    for dest, flag in NOT_FOR_CLASSIFY.items():
        if getattr(args, dest) is not None:
            raise UserError(f"{flag}: not used by --task classify (it fine-tunes on --data's labelled rows, no teacher, "
                            "writes safetensors)")
    set_threads(args)
    settings = _classify_settings(args)
    close, update = _progress_bar()
    try:
        r = finetune_classifier(settings, progress=update, flags=_classify_flags())
    except ClassifyInterrupted as e:
        print(f"interrupted at step {e.step}; saved {e.checkpoint}. Continue with: nas finetune --task classify --model "
              f"{shlex.quote(args.model)} --out {shlex.quote(args.out)} --resume")
        return 130
    finally:
        close()
    b, a = r.before, r.after
    print(f"validation ({r.val_rows} rows, {len(r.classes)} classes; {r.train_rows} rows trained on): accuracy "
          f"{b['accuracy']:.4f} -> {a['accuracy']:.4f}, macro-F1 {b['macro_f1']:.4f} -> {a['macro_f1']:.4f}")
    print(f"trained {r.steps:,} steps in {r.seconds:.0f} s; wrote {r.out} (classifier.safetensors, labels.json, "
          f"classifier_card.json; run it: nas classify --model {r.out} \"TEXT\"); checkpoints and log in {r.out / 'train'}")
    return 0


register_command(__name__)
