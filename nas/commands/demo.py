"""``nas demo``: the whole workflow on tiny.yaml in one command (train, measure, fit, search, export, compare)."""

from __future__ import annotations

import argparse
from pathlib import Path
from .common import THREADS_HELP, threads_value
from .registry import register_command

NAME = "demo"
HELP = ("the whole workflow on tiny.yaml: train a supernet, time 100 subnets with ONNX Runtime, fit a predictor, "
        "search under the 40th-percentile latency, export, measure the export beside uniform baselines")
EXAMPLE = "nas demo --out runs/demo        # ~15 min on 2 idle cores; run it again to resume"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--out", default="runs/demo", metavar="DIR", help="run directory; an existing one is resumed (default runs/demo)"
    )
    p.add_argument(
        "--quick", action="store_true", help="a shortened demo (~5 min: 1 min of training, 30 subnets timed, a small search)"
    )
    p.add_argument("--threads", type=threads_value, metavar="N|auto", help=THREADS_HELP + "; for training and scoring")
    p.add_argument("--seed", type=int, default=0, help="seed of every stage (default 0)")
    p.add_argument("--recipe", metavar="RECIPE", help="train the found subnet into the deployed model by this final-"
                   "training recipe: scratch, inherit (the supernet's slice, fine-tuned) or distill (fine-tuned with the "
                   "supernet's largest subnet as a teacher), for 3 minutes (--quick 20 s), or none: export its inherited "
                   "weights as they are (default: the recipe docs/benchmarks/final-training chose, "
                   "supernet.runs.DEFAULT_RECIPE)")


def run(args: argparse.Namespace) -> int:
    import torch

    from nas.cli import main
    from nas.demo import FULL, QUICK, Paths, render_summary, run_demo
    from search_spaces import UserError
    from supernet.runs import DEFAULT_RECIPE, RECIPES
    from supernet.train import resolve_threads

    if args.recipe not in (None, "none", *RECIPES):  # before anything is written
        raise UserError(f"--recipe: {args.recipe!r} is not one of {', '.join(RECIPES)}, none")
    recipe = {None: DEFAULT_RECIPE, "none": None}.get(args.recipe, args.recipe)
    threads = resolve_threads(args.threads)  # auto (the default): the CPUs free now, the same number for every stage
    torch.set_num_threads(threads)
    summary = run_demo(args.out, main, QUICK if args.quick else FULL, threads=threads, seed=args.seed, recipe=recipe)
    print(render_summary(summary, Paths(Path(args.out))))
    return 0 if summary["within_budget"] else 1


register_command(__name__)
