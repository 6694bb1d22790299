"""``nas train-supernet``: train a weight-shared supernet of the space's task on its data.

Each step follows the sandwich rule (largest, smallest and N random subnets, gradients
accumulated) with in-place distillation.  The space's task decides what is learned, from
what data, and which extra flags it takes (:mod:`search_spaces.tasks`).  ``--out DIR`` holds ``latest.pt`` (every
``--ckpt-interval`` steps, on Ctrl-C and at the end), ``final.pt`` (when the run reaches
``--max-steps`` / ``--max-time``), ``log.jsonl`` and the cached data.  ``--resume``
continues a run exactly.  Under ``torchrun`` it trains data-parallel (DDP).  The flags become a
:class:`nas.train_supernet.SupernetRun`; :func:`nas.train_supernet.train_supernet` does the work.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from .common import (
    CONFIG_FLAGS,
    DATA_FLAGS,
    HELP_DEFAULTS,
    OBJECTIVE_FLAGS,
    add_task_flags,
    bytes_bar,
    format_time,
    given,
    parse_duration,
    step_bar,
    task_flags,
)
from .registry import register_command

NAME = "train-supernet"
HELP = "train a weight-shared supernet (sandwich rule + in-place distillation) on a byte-level corpus"
EXAMPLE = "nas train-supernet search_spaces/tiny.yaml --out runs/tiny --max-time 10m"



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
        metavar="DEVICE",
        help="auto, cpu, cuda or cuda:N (default auto: cuda when available, bf16 autocast; else cpu, fp32); a resumed "
        "run keeps its own",
    )
    p.add_argument("--threads", type=int, metavar="N", help="CPU threads for torch (default: torch's choice); a resumed run "
                   "keeps its own")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its latest.pt, exactly (with the "
                   "first run's settings, --threads and --device included)")
    add_task_flags(p, NAME)


def run(args: argparse.Namespace) -> int:
    from nas.train_supernet import SupernetRun, train_supernet
    from search_spaces import load_space
    from supernet.data import absolute_data

    config = given(args, CONFIG_FLAGS)
    if args.max_time is not None:
        config["max_time"] = args.max_time
    if args.compile is not None:
        config["compile"] = True
    data = given(args, DATA_FLAGS)
    if args.data is not None:
        data["data"] = absolute_data(args.data)
    out = Path(args.out)
    settings = SupernetRun(out=out, space=load_space(args.space) if args.space else None, resume=args.resume, config=config,
                           objective=given(args, OBJECTIVE_FLAGS), data=data, task_flags=task_flags(args, NAME),
                           device=args.device, threads=args.threads)
    close, update = step_bar("training")
    try:
        done = train_supernet(settings, progress=update, data_progress=bytes_bar("encoding corpus"))
    finally:
        close()
    if not done.main:
        return 0
    result = done.result
    if result.stopped == "interrupted":
        print(f"interrupted at step {result.step}; saved {result.checkpoint}. Continue with: nas train-supernet --out "
              f"{shlex.quote(str(out))} --resume")  # (exact: the run's settings, --threads and --device included, are kept)
        return 130
    print(
        f"trained {result.step} steps ({result.tokens:,} {done.token_unit}) in {format_time(result.elapsed)}; stopped by "
        f"--{result.stopped.replace('_', '-')}"
    )
    if result.evals:
        last = result.evals[-1]
        scores = ", ".join(f"{k} {v:.3f}" for k, v in last[done.eval_key].items())
        print(f"validation {done.metric} at step {last['step']}: {scores}")
    print(f"checkpoint: {result.checkpoint} (and {done.latest}); metrics: {out / 'log.jsonl'}")
    return 0


register_command(__name__)
