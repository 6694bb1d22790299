"""``nas predict``: a saved latency predictor's estimate for subnets given as YAML/JSON files."""

from __future__ import annotations

import argparse
from .registry import register_command

NAME = "predict"
HELP = "print a latency predictor's estimate (ms) for subnet files"
EXAMPLE = "nas predict --predictor runs/pred-cpu subnet.yaml"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("subnets", nargs="+", help="subnet YAML or JSON files (as `nas space --samples` prints)")
    p.add_argument("--predictor", required=True, help="a folder written by `nas fit-predictor --out`")
    p.add_argument("--space", help="refuse unless the predictor was fitted on this space (YAML file or shipped name)")
    p.add_argument(
        "--workload", help="refuse unless the predictor was fitted at this workload of its space (prefill, decode, ...)"
    )


def run(args: argparse.Namespace) -> int:
    from latency.predictors import load_predictor
    from nas.commands.common import emit
    from search_spaces import UserError, load_space

    predictor = load_predictor(args.predictor)
    if predictor.space is None:
        raise UserError(
            f"{args.predictor}: fitted on a plain feature table (columns {', '.join(predictor.columns or [])}), not on subnets"
        )
    if args.space:
        predictor.check_space(load_space(args.space))
    if args.workload:
        predictor.check_workload(predictor.space.workload(args.workload))
    subnets = [predictor.space.subnet_type.load(p) for p in args.subnets]  # the subnet type of the space's task
    for path, s in zip(args.subnets, subnets):
        problems = predictor.space.problems(s)
        if problems:
            raise UserError(f"{path}: not in the predictor's space {predictor.space.name!r}: {'; '.join(problems)}")
    w = predictor.workload_spec
    device = predictor.fingerprint.get("device")
    rows = []
    for path, s, ms in zip(args.subnets, subnets, predictor.predict(subnets)):
        print(f"{ms:10.3f} ms  {path}  {s}   ({predictor.name}, {w}, {device})")
        rows.append({"file": path, "predicted_ms": float(ms), "key": s.key, "subnet": s.to_dict()})
    emit(args, {"predictor": args.predictor, "model": predictor.name, "workload": str(w), "device": device,
                "fingerprint": predictor.fingerprint, "predictions": rows})
    return 0


register_command(__name__)
