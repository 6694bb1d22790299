"""``nas export``: the chosen subnet as a plain PyTorch model (safetensors + torch.export program)
and an ONNX graph, parity-checked; the model card reports its validation bits per byte, its
predicted latency (``--predictor``) and, with ``--timing-target TARGET``, its measured latency."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from .common import (
    add_device_flags,
    add_protocol_arguments,
    add_scoring_arguments,
    measurement_bar,
    protocol_settings,
    scoring_settings,
    timing_messages,
)
from .checks import device_options
from .registry import register_command

log = logging.getLogger(__name__)

NAME = "export"
HELP = ("extract a subnet from a trained supernet; write safetensors + torch.export program + model card and an ONNX model "
        "(parity-checked)")
EXAMPLE = ("nas export runs/tiny/latest.pt --subnet runs/search/best_50ms.yaml --out runs/export --predictor runs/lat "
           "--timing-target onnxruntime --budget 50ms")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("supernet", nargs="?", metavar="SUPERNET", help="supernet checkpoint written by `nas train-supernet` "
                   "(required; the old spelling --supernet CKPT works for one release)")
    p.add_argument("--subnet", required=True, help="subnet YAML or JSON (e.g. the best subnet `nas search` wrote)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument(
        "--format", default="torch,onnx", help="comma-separated: torch (safetensors + card always, and model.pt2), onnx"
    )
    p.add_argument(
        "--target-ort",
        default=None,
        metavar="VERSION",
        help="ONNX Runtime version that will run the model (default: the installed one); older than 1.23 exports opset 18",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the parity-check inputs and of the measurement's order")
    p.add_argument("--custom-ops", action="store_true", help="write the attention types that have one as ONNX Runtime "
                   "custom operators (nas.kernels; the library is built here and must be registered by whoever runs the "
                   "model: see nas doctor); default: standard operators only")
    v = p.add_argument_group("validation bits per byte (the search's scoring and defaults)")
    add_scoring_arguments(v)
    v.add_argument("--no-eval", action="store_true", help="do not score the model (the card's validation entry stays empty)")
    m = p.add_argument_group("latency")
    m.add_argument(
        "--predictor", metavar="P", help="latency predictor (nas fit-predictor): its estimate and workload go into the card"
    )
    m.add_argument(
        "--timing-target",
        metavar="TARGET",
        help="time the exported model on TARGET (cpu, cuda, onnxruntime: the exported model.onnx itself)",
    )
    m.add_argument("--budget", metavar="T", help="latency budget (50ms, 0.05s): warn when the measured latency is over it")
    m.add_argument("--workload", help="the space's workload to time (default: the predictor's, else the task's: prefill for "
                   "a one-stack model, the space's first for a task's own model)")
    add_device_flags(m, NAME)
    m.add_argument("--strict", action="store_true", help="exit with status 1 when the measured latency is over --budget")
    add_protocol_arguments(p)


def run(args: argparse.Namespace) -> int:
    with timing_messages():  # the latency library's "--device" / "--threads" are this command's timing target's
        if getattr(args, "custom_ops", False):
            from supernet.attention import ort_ops

            with ort_ops.requested():
                return _run(args)
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from latency.quantize import check_device, check_precision
    from nas.export import export_chosen
    from supernet.export import ExportSettings, parse_formats
    from nas.search.budget import parse_budget
    from search_spaces import tasks
    from supernet.checkpoint import load_supernet

    if not args.supernet:
        from search_spaces import UserError

        raise UserError("SUPERNET: give the supernet checkpoint (`nas export CKPT --subnet FILE --out DIR`)")
    formats = parse_formats(args.format)
    budget = parse_budget(args.budget) if args.budget else None
    precision = check_precision(args.precision)
    if args.timing_target:
        check_device(precision, args.timing_target, getattr(args, "provider", None))
    protocol = protocol_settings(args) if args.timing_target else None
    supernet, payload = load_supernet(args.supernet)  # the checkpoint's task's supernet, loaded once
    space = supernet.space
    tasks.of(space).refuse(NAME, {"precision": precision})
    subnet = space.check(space.subnet_type.load(args.subnet))
    settings = ExportSettings(
        out=Path(args.out), formats=formats, target_ort=args.target_ort, seed=args.seed,
        scoring=scoring_settings(args, precision=precision), evaluate=not args.no_eval, precision=precision,
        predictor=args.predictor, measure=args.timing_target, workload=args.workload, budget_ms=budget, protocol=protocol,
        device_options=device_options(args, NAME),
    )
    bar, update = measurement_bar(f"measuring on {args.timing_target}") if args.timing_target else (None, None)
    try:
        outcome = export_chosen(supernet, payload, subnet, settings, progress=update)
    finally:
        if bar is not None:
            bar.close()
    for line in outcome.exported.lines:
        print(line)
    for note in outcome.exported.notes:
        log.warning("%s", note)
    status = 0 if outcome.measured is None else report_measured(args, outcome.measured, outcome.workload,
                                                                outcome.predicted, budget)
    if getattr(args, "json", False):
        from supernet.artifact import read_card

        from .common import emit

        out = outcome.exported.out
        card = read_card(out) if (Path(out) / "model_card.json").exists() else None
        emit(args, {"out": str(out), "exit_status": status, "predicted": outcome.predicted, "measured": outcome.measured,
                    "workload": None if outcome.workload is None else str(outcome.workload), "notes": outcome.exported.notes,
                    "card": card})
    return status


def report_measured(args: argparse.Namespace, measured: dict, workload, predicted: dict | None, budget: float | None) -> int:
    """Print a measurement against its prediction and ``--budget``: the exit status (1 over budget with ``--strict``)."""
    from latency.measure import workload_text
    from nas.search.budget import format_ms

    print(
        f"  measured          {measured['median_ms']:.3f} ms (IQR {measured['iqr_ms']:.3f}) on {args.timing_target}, "
        f"{measured['timed']}, "
        f"{workload_text(workload)}" + (f"  flags: {', '.join(measured['flags'])}" if measured["flags"] else "")
    )
    if predicted:
        print(f"  predicted         {predicted['predicted_ms']:.3f} ms  -> prediction error {measured['error_pct']:+.1f}%")
    if budget is not None:
        print(f"  budget            {format_ms(budget)}: " + ("OVER" if measured["over_budget"] else "holds"))
        if measured["over_budget"]:
            also = f" (predicted {predicted['predicted_ms']:.3f} ms)" if predicted else ""
            log.warning(
                "measured latency %.3f ms on %s is over the budget %s%s",
                measured["median_ms"],
                args.timing_target,
                format_ms(budget),
                also,
            )
            return 1 if args.strict else 0
    return 0


register_command(__name__)
