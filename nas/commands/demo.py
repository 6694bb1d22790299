"""``nas demo``: the whole workflow on tiny.yaml in one command (train, measure, fit, search, export, compare)."""

from __future__ import annotations

import argparse
from pathlib import Path
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
    p.add_argument("--threads", type=int, metavar="N", help="torch threads for training and scoring (default: torch's)")
    p.add_argument("--seed", type=int, default=0, help="seed of every stage (default 0)")


def run(args: argparse.Namespace) -> int:
    import torch

    from nas.cli import main
    from nas.demo import FULL, QUICK, Paths, render_summary, run_demo
    from search_spaces import UserError

    if args.threads is not None:
        if args.threads < 1:
            raise UserError(f"--threads: {args.threads} is not a positive integer")
        torch.set_num_threads(args.threads)
    summary = run_demo(args.out, main, QUICK if args.quick else FULL, threads=args.threads, seed=args.seed)
    print(render_summary(summary, Paths(Path(args.out))))
    return 0 if summary["within_budget"] else 1


register_command(__name__)
