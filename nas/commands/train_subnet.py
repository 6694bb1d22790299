"""``nas train-subnet``: train one subnet on its own, from scratch or from inherited weights, on a token budget.

The same trainer, corpus, schedule, atomic checkpoints and exact ``--resume`` as ``nas
train-supernet``, on one static model (:func:`nas.train_subnet.train_subnet`).  ``--tokens 20M``
trains exactly ``20M // (batch x seq_len)`` steps, and step ``k`` always draws the same windows
(seeded by ``--seed`` and ``k``), so models trained with one budget and seed see the same bytes.
``--out DIR`` becomes a model folder in ``nas export``'s format; ``DIR/train/`` holds the run's
checkpoints, ``log.jsonl`` and the data cache.  The space's task trains and writes the model
(:meth:`tasks.base.Task.train_subnet`: a task of its own model, the encoder-decoder's, counts ``--tokens`` in its own
unit and writes the folder its own commands read) and says which flags it takes.

This module also holds the training flags that ``nas finetune`` shares (:func:`add_training_arguments`,
:func:`training_config`, :func:`resumed`).
"""

from __future__ import annotations

import argparse
import logging
import shlex
from pathlib import Path

from .common import (
    CONFIG_FLAGS,
    DATA_FLAGS,
    HELP_DEFAULTS,
    add_task_flags,
    given_config,
    parse_duration,
    set_threads,
    step_bar,
    train_and_report,
    task_flags,
    token_budget,
    train_device,
)

from .registry import register_command

log = logging.getLogger(__name__)

NAME = "train-subnet"
HELP = ("train one subnet on its own (from scratch, inherited supernet weights or an exported model) on a token budget; "
        "resumable; writes a model folder as nas export does")
EXAMPLE = "nas train-subnet runs/search/best_30ms.yaml --space tiny --out runs/found --init scratch --tokens 20M"



def _config_flags() -> dict:
    """train-supernet's flag table (flag -> (field, type, metavar, help)), worded for one model in one process."""
    return {**CONFIG_FLAGS, "--batch-size": ("batch_size", int, "N", "windows per step (default {default})"),
            "--seed": ("seed", int, "S", "seed of the batches and of initial weights drawn from scratch (default {default})")}


def add_training_arguments(p: argparse.ArgumentParser, defaults: dict, formats: str) -> None:
    """The flags of one static model's training run, shared by ``nas train-subnet`` and ``nas finetune``.

    ``defaults`` overrides TrainConfig's defaults (by field name) in the help and in :func:`training_config`;
    ``formats`` is the default of ``--format``.  Every flag defaults to None ("not given"), so a
    resumed run keeps its stored value unless the flag is given.
    """
    shown = {**HELP_DEFAULTS, **defaults}
    g = p.add_argument_group("training (the trainer, corpus and schedule of nas train-supernet)")
    g.add_argument("--data", metavar="PATH", help="a text file, a directory of text files, or a glob; default: the running "
                   "Python's standard library sources and help topics (as train-supernet)")
    for flag, (dest, kind, metavar, text) in DATA_FLAGS.items():
        g.add_argument(flag, dest=dest, type=kind, metavar=metavar, help=text.format(default=shown[dest]))
    g.add_argument("--tokens", metavar="N", help="token budget: exactly N // (batch-size x seq-len) steps, the same windows "
                   "for every model of one seed (20M, 500k; instead of --max-steps)")
    g.add_argument("--max-time", type=parse_duration, metavar="T",
                   help="stop after T of training in total (600, 90s, 10m, 1.5h); alone, the schedule follows the clock")
    for flag, (dest, kind, metavar, text) in _config_flags().items():
        g.add_argument(flag, dest=dest, type=kind, metavar=metavar, help=text.format(default=shown[dest]))
    g.add_argument("--format", metavar="LIST", help=f"comma-separated: torch (safetensors + card always, and model.pt2), "
                   f"onnx (model.onnx, parity-checked) (default {formats})")
    g.add_argument("--target-ort", metavar="VERSION", help="ONNX Runtime version that will run model.onnx (default: the "
                   "installed one)")
    g.add_argument("--device", metavar="DEVICE", help="auto, cpu, cuda or cuda:N (default auto: cuda when available, bf16 "
                   "autocast; else cpu)")
    g.add_argument("--threads", type=int, metavar="N", help="CPU threads for torch (default: torch's choice); a resumed run "
                   "keeps its own")
    g.add_argument("--resume", action="store_true", help="continue the run in --out exactly (from its train/latest.pt, with "
                   "the first run's settings, --threads included); only the bounds and outputs may change")


def training_config(args: argparse.Namespace, defaults: dict, space):
    """The TrainConfig of a new run: TrainConfig's defaults < ``defaults`` < the flags given.

    ``--seq-len`` defaults to the space's ``max_seq_len`` where that is shorter.  ``--max-time``
    without ``--max-steps`` or ``--tokens`` makes the run time-bound (the schedule follows the clock).
    """
    from supernet.train import TrainConfig

    given = given_config(args)
    values = {**defaults, **given}
    if "seq_len" not in given:
        values["seq_len"] = min(values.get("seq_len", TrainConfig.seq_len), space.max_seq_len)
    if "max_time" in given and "max_steps" not in given and args.tokens is None:
        values["max_steps"] = None
    return TrainConfig.from_dict(values)


def new_settings(args: argparse.Namespace, space, subnet, out: Path, init: str, distill_from: str | None, defaults: dict,
                 formats: str):
    """The :class:`supernet.runs.SubnetTraining` of a new run from the training flags."""
    from supernet.export import parse_formats
    from supernet.runs import SubnetTraining

    tokens = token_budget(args)
    distill = (0.5 if args.distill is None else args.distill) if distill_from else (args.distill or 0.0)
    return SubnetTraining(
        space=space, subnet=subnet, out=out, init=init, tokens=tokens, config=training_config(args, defaults, space),
        data=args.data, distill_from=distill_from, distill=distill, formats=parse_formats(args.format or formats),
        device=train_device(args.device), data_seed=0 if args.data_seed is None else args.data_seed,
        val_fraction=0.05 if args.val_fraction is None else args.val_fraction, target_ort=args.target_ort,
        options=task_flags(args, NAME) or None,
    )


def resumed(args: argparse.Namespace, stored, **changes):
    """The stored settings of a run (:func:`supernet.runs.stored_settings`) with the flags given on top.

    The library refuses what a resumed run may not change, naming each flag; here ``--tokens`` and
    ``--max-steps`` replace each other (both set the run's length).
    """
    from dataclasses import replace

    from supernet.export import parse_formats
    from supernet.train import TrainConfig

    given = given_config(args)
    tokens = token_budget(args)
    if tokens is None and "max_steps" not in given:
        tokens = stored.tokens
    config = {**stored.config.to_dict(), **given}
    if "max_time" in given and "max_steps" not in given and tokens is None and stored.config.max_steps is None:
        config["max_steps"] = None
    data = {k: getattr(args, k) for k in ("data", "data_seed", "val_fraction") if getattr(args, k) is not None}
    if args.distill is not None:
        data["distill"] = args.distill
    if args.format is not None:
        data["formats"] = parse_formats(args.format)
    if args.device is not None:
        data["device"] = train_device(args.device)
    if args.target_ort is not None:
        data["target_ort"] = args.target_ort
    given_options = task_flags(args, NAME)
    if given_options:
        data["options"] = {**(stored.options or {}), **given_options}
    return replace(stored, tokens=tokens, config=TrainConfig.from_dict(config), resume=True, **data, **changes)


# --------------------------------------------------------------------------- the command


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("subnet", nargs="?", metavar="SUBNET", help="subnet YAML or JSON (e.g. best_30ms.yaml of nas search); "
                   "with --resume it comes from the run")
    p.add_argument("--space", help="search-space YAML or shipped name (tiny, base, long); with --resume it comes from the run")
    p.add_argument("--out", required=True, metavar="DIR", help="the model folder to write; DIR/train holds the run's state")
    p.add_argument("--init", metavar="FROM", help="scratch (default: weights drawn from --seed), supernet:CKPT (the subnet's "
                   "inherited weights, extracted) or model:DIR (an exported model of this subnet)")
    p.add_argument("--distill-from", metavar="supernet:CKPT",
                   help="distil from this supernet's largest subnet (its soft targets weigh --distill)")
    p.add_argument("--distill", type=float, metavar="W", help="weight of the teacher's soft targets, 0..1 (default 0.5 with "
                   "--distill-from)")
    add_task_flags(p, NAME)
    add_training_arguments(p, {}, "torch,onnx")


def run(args: argparse.Namespace) -> int:
    from supernet.runs import check_subnet, stored_settings
    from search_spaces import UserError, load_space, tasks

    set_threads(args)
    out = Path(args.out)
    space = load_space(args.space) if args.space else None
    stored = stored_settings(out) if args.resume else None  # the run's checkpoint, loaded once
    task = tasks.of(space or stored.space)
    flags = task_flags(args, NAME)
    task.refuse(NAME, {"distill_from": args.distill_from, "distill": args.distill, "seq_len": args.seq_len,
                       "val_fraction": args.val_fraction, "formats": args.format, "target_ort": args.target_ort,
                       "data": args.data, **flags})  # the generic flags the task does not take
    tasks.refuse_foreign(space or stored.space, flags)
    subnet = (space or stored.space).subnet_type.load(args.subnet) if args.subnet else None
    if space is not None and subnet is not None:
        check_subnet(space, subnet, where=str(args.subnet))
    changes = {k: v for k, v in (("space", space), ("subnet", subnet), ("init", args.init), ("distill_from", args.distill_from))
               if v is not None}
    if stored is not None:
        settings = resumed(args, stored, **changes)
    elif space is None or subnet is None:
        raise UserError("give the subnet (SUBNET.yaml) and --space SPACE, or --resume to continue the run in --out")
    else:
        settings = new_settings(args, space, subnet, out, args.init or "scratch", args.distill_from, {}, "torch,onnx")
    again = f"nas train-subnet --out {shlex.quote(str(out))} --resume"  # (exact: the run's settings, --threads included)
    return train_and_report(task.train_subnet, settings, step_bar("training"), again)


register_command(__name__)
