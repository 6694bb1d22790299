"""``nas finetune``: train an exported model further, optionally distilled from the supernet's largest subnet.

Inherited weights are a starting point; a few thousand steps on the model alone usually lower
its loss.  This is ``nas train-subnet`` with ``--init model:DIR`` (the same library function,
:func:`nas.train_subnet.train_subnet`, and the same training flags) and fine-tuning defaults: a
tenth of the learning rates, a short warm-up.  ``--out DIR2`` becomes a new model directory (same
layout as ``nas export``, card with bits per byte before and after); its ``train/`` folder holds
``latest.pt`` (every ``--ckpt-interval`` steps, on Ctrl-C and at the end), ``log.jsonl`` and the
corpus cache.  ``--resume`` continues a killed or interrupted run exactly.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

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
    add_training_arguments(p, DEFAULTS, FORMATS)


def _progress_bar():
    from nas.commands.train_subnet import step_bar

    return step_bar(NAME)


def run(args: argparse.Namespace) -> int:
    from nas.commands.train_subnet import new_settings, report, resumed, set_threads
    from nas.train_subnet import TrainingInterrupted, parse_source, source_text, stored_settings, train_subnet
    from search_spaces import Subnet, UserError
    from supernet.artifact import card_space, read_card

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
    close, update = _progress_bar()
    try:
        result = train_subnet(settings, progress=update)
    except TrainingInterrupted as e:
        print(f"interrupted at step {e.step}; saved {e.checkpoint}. Continue with: nas finetune --model {src} --out {out} "
              "--resume")
        return 130
    finally:
        close()
    report(result)
    return 0
