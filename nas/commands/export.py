"""``nas export``: the chosen subnet as a plain PyTorch model (safetensors + torch.export program)
and an ONNX graph, parity-checked; the model card reports its validation bits per byte, its
predicted latency (``--predictor``) and, with ``--measure DEVICE``, its measured latency."""

from __future__ import annotations

import argparse
import logging

from nas.commands.search import add_scoring_arguments

log = logging.getLogger(__name__)

NAME = "export"
HELP = ("extract a subnet from a trained supernet; write safetensors + torch.export program + model card and an ONNX model "
        "(parity-checked)")
EXAMPLE = ("nas export --supernet runs/tiny/latest.pt --subnet runs/search/best_50ms.yaml --out runs/export --predictor runs/lat "
           "--measure onnxruntime --budget 50ms")

# One model, measured once: more samples and rounds than a campaign's defaults (measure-latency: 10 / 30 / 5).
PROTOCOL_DEFAULTS = {"warmup": 20, "repeats": 60, "rounds": 10, "min_sample_ms": 30.0, "tolerance": 0.15, "max_retries": 2}


def add_protocol_arguments(p: argparse.ArgumentParser, prefix: str = "") -> None:
    """The measurement protocol's flags (``--warmup`` ...), with one model's defaults."""
    d = PROTOCOL_DEFAULTS
    g = p.add_argument_group("measurement protocol")
    g.add_argument(
        f"--{prefix}warmup",
        dest="warmup",
        type=int,
        default=d["warmup"],
        help=f"untimed calls before timing (default {d['warmup']})",
    )
    g.add_argument(
        f"--{prefix}repeats",
        dest="repeats",
        type=int,
        default=d["repeats"],
        help=f"timed samples, spread over the rounds (default {d['repeats']})",
    )
    g.add_argument(
        f"--{prefix}rounds",
        dest="rounds",
        type=int,
        default=d["rounds"],
        help=f"interleaved rounds with the reference model (default {d['rounds']})",
    )
    g.add_argument(f"--{prefix}min-sample-ms", dest="min_sample_ms", type=float, default=d["min_sample_ms"],
                   help=f"a sample times back-to-back calls for at least this long (default {d['min_sample_ms']:g})")
    g.add_argument(f"--{prefix}tolerance", dest="tolerance", type=float, default=d["tolerance"],
                   help=f"reference change across a visit that marks it disturbed (default {d['tolerance']})")
    g.add_argument(f"--{prefix}max-retries", dest="max_retries", type=int, default=d["max_retries"],
                   help=f"re-measure passes for disturbed visits (default {d['max_retries']})")
    g.add_argument(
        f"--{prefix}combine",
        dest="combine",
        choices=["median", "min"],
        default="median",
        help="round medians -> one figure (default median)",
    )
    g.add_argument(
        f"--{prefix}no-drift-correction",
        dest="no_drift_correction",
        action="store_true",
        help="do not rescale by the reference model",
    )
    g.add_argument(
        f"--{prefix}paired",
        dest="paired",
        action="store_true",
        help="a reference sample after every sample (fast machine swings)",
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--supernet", required=True, help="supernet checkpoint written by `nas train-supernet`")
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
    v = p.add_argument_group("validation bits per byte (the search's scoring and defaults)")
    add_scoring_arguments(v)
    v.add_argument("--no-eval", action="store_true", help="do not score the model (the card's validation entry stays empty)")
    m = p.add_argument_group("latency")
    m.add_argument(
        "--predictor", metavar="P", help="latency predictor (nas fit-predictor): its estimate and workload go into the card"
    )
    m.add_argument(
        "--measure",
        metavar="DEVICE",
        help="time the exported model on DEVICE (cpu, cuda, onnxruntime: the exported model.onnx itself)",
    )
    m.add_argument("--budget", metavar="T", help="latency budget (50ms, 0.05s): warn when the measured latency is over it")
    m.add_argument("--workload", help="the space's workload to time (default: the predictor's, else prefill; seq2seq: the first)")
    m.add_argument("--threads", type=int, help="cpu / onnxruntime: intra-op threads")
    m.add_argument("--clock", help="cpu / onnxruntime: wall (default) or cpu (needs --threads 1)")
    m.add_argument("--provider", help="onnxruntime: cpu (default) or cuda")
    m.add_argument("--runtime", help="cuda: eager (default), cudagraph or compile")
    m.add_argument("--strict", action="store_true", help="exit with status 1 when the measured latency is over --budget")
    add_protocol_arguments(p)


def choose_workload(space, name: str | None, predicted: dict | None, default: str | None = "prefill"):
    """``--workload``, else the predictor's, else ``default`` (None: the space's first); a predictor fitted at another
    workload is refused."""
    from search_spaces import UserError

    wanted = name or (predicted["workload"]["name"] if predicted else default)
    workload = space.workload(wanted)
    if predicted and predicted["workload"]["name"] != workload.name:
        raise UserError(f"--workload {workload.name}: the predictor was fitted at workload {predicted['workload']['name']!r}; "
                        "its estimate would not be comparable (drop --workload or use a predictor of that workload)")
    return workload


def measurement_bar(desc: str):
    """A tqdm bar over the protocol's visits: (bar, callback); hidden with ``-q``."""
    from tqdm import tqdm

    from nas.cli import show_progress

    bar = tqdm(total=1, unit="visit", desc=desc, dynamic_ncols=True, leave=False, disable=not show_progress())

    def update(done: int, total: int, info: str) -> None:
        bar.total, bar.n = total, done
        bar.refresh()

    return bar, update


def run(args: argparse.Namespace) -> int:
    from tasks.translation.export import export_seq2seq, is_seq2seq_checkpoint  # the encoder-decoder (translation) branch

    if is_seq2seq_checkpoint(args.supernet):
        return export_seq2seq(args)
    from nas.commands.measure_latency import settings_from
    from nas.commands.search import validation_tokens
    from nas.export import (
        Scoring,
        choose_opset,
        export_subnet,
        measure_model,
        parse_formats,
        predicted_latency,
        validation_bpb,
        workload_text,
    )
    from nas.search.budget import parse_budget
    from search_spaces import Subnet, UserError, Workload
    from supernet.artifact import update_card
    from supernet.checkpoint import load_supernet

    formats = parse_formats(args.format)
    budget = parse_budget(args.budget) if args.budget else None
    if budget is not None and not args.measure:
        raise UserError("--budget: needs --measure DEVICE (the budget is checked against the measured latency)")
    settings = settings_from(args) if args.measure else None
    from latency.quantize import check_device, check_precision

    precision = check_precision(args.precision)
    if precision != "fp32" and "onnx" not in formats:
        raise UserError(f"--precision {precision}: quantizes the ONNX model; --format must include onnx")
    if args.measure:
        check_device(precision, args.measure, args.provider)
    if args.measure and args.measure == "onnxruntime" and "onnx" in formats:
        choose_opset(args.target_ort)  # fail early on a bad --target-ort
    supernet, payload = load_supernet(args.supernet)
    space = supernet.space
    subnet = space.check(Subnet.load(args.subnet))
    predicted, reference_ms = None, None
    if args.predictor:
        from latency.predictors import load_predictor

        predictor = load_predictor(args.predictor)
        from nas.commands.search import check_predictor_precision

        check_predictor_precision(predictor, args.predictor, precision)
        predicted, reference_ms = predicted_latency(predictor, space, subnet, str(args.predictor)), predictor.reference_ms
    workload = choose_workload(space, args.workload, predicted) if args.measure else None
    device = None
    if args.measure:
        from latency.device import get_device

        device = get_device(args.measure, threads=args.threads, runtime=args.runtime, provider=args.provider, clock=args.clock,
                            precision=None if precision == "fp32" else precision)
    card = {"source": {"supernet": str(args.supernet), "step": payload["meta"].get("step"), "space_hash": space.hash}}
    validation = None
    if not args.no_eval or precision != "fp32":  # INT8: calibration windows from the same held-out tokens
        tokens, where = validation_tokens(args, payload)
        scoring = Scoring(windows=args.val_windows, seq_len=args.seq_len, seed=args.val_seed)
    if not args.no_eval:
        from supernet.task import trained_options

        trained = trained_options(space, payload.get("meta", {}))  # scored as trained (a masked LM: its mask rate)
        validation = validation_bpb(_extract(supernet, subnet), space, tokens, scoring, where, trained)
    card.update(validation=validation, latency=predicted)
    result = export_subnet(supernet, subnet, args.out, formats=formats, target_ort=args.target_ort, card=card, seed=args.seed)

    quantized = None
    if precision != "fp32":
        from nas.precision import export_quantized

        quantized = export_quantized(_extract(supernet, subnet), space, result.onnx_path, precision, tokens, scoring, where)
        update_card(result.out, files=[quantized["file"]], quantized=quantized)

    print(f"exported {subnet}")
    print(f"  parameters        {result.parameters:,}")
    print(f"  torch             {result.out / 'model.safetensors'}  (load: supernet.load_model({str(result.out)!r}))")
    if result.program_path:
        print(
            f"  torch.export      {result.program_path}  (torch.export.load(...).module(); max |program - eager| = "
            f"{result.program_parity:.1e})"
        )
    if result.onnx_path:
        print(f"  onnx              {result.onnx_path}  (opset {result.opset}, {result.attention_nodes} fused Attention nodes)")
        print(f"  parity            max |onnxruntime - torch| = {result.parity:.2e}")
    if quantized:
        b, kept = quantized["bits_per_byte"], quantized["kept_fp32"]
        print(f"  {precision:<17} {result.out / quantized['file']}  ({quantized['quantized_matmuls']} MatMuls INT8, "
              f"{len(kept)} kept fp32 by the {quantized['max_error']:g} error rule)")
        print(f"  onnxruntime bpb   fp32 {b['fp32_onnxruntime']:.4f}, {precision} {b['int8_onnxruntime']:.4f} "
              f"({b['int8_onnxruntime'] - b['fp32_onnxruntime']:+.4f}; torch estimate {b['int8_torch_estimate']:.4f})")
    if validation:
        print(
            f"  validation        {validation['bits_per_byte']:.4f} {validation.get('metric', 'bits/byte')} "
            f"({validation['windows']} x "
            f"{validation['seq_len']} tokens of the {validation['source']})"
        )
    if predicted:
        w = Workload.from_record(predicted["workload"], "the predictor's workload")
        print(f"  predicted         {predicted['predicted_ms']:.3f} ms  ({predicted['model']} predictor, {workload_text(w)}, "
              f"{predicted['device'].get('device', 'unknown device')})")
    for note in result.notes:
        log.warning("%s", note)
    if not args.measure:
        return 0

    from supernet import load_model

    model = load_model(result.out)
    bar, update = measurement_bar(f"measuring on {args.measure}")
    try:
        timed, step_transform = result.onnx_path, None
        if quantized:  # INT8: the quantized files themselves (a decode step graph quantized as the model was)
            from nas.precision import quantize_step

            def step_transform(step):
                path, entry = quantize_step(step, precision, tokens, min(args.seq_len, space.max_seq_len), where)
                update_card(result.out, files=[path.name], quantized_step=entry)
                return path

            timed = result.out / quantized["file"]
        measured = measure_model(device, model, workload, settings, onnx_path=timed, budget_ms=budget, seed=args.seed,
                                 step_transform=step_transform,
                                 baseline_ms=reference_ms,
                                 predicted_ms=predicted["predicted_ms"] if predicted else None, progress=update)
    finally:
        bar.close()
    update_card(result.out, measured=measured)
    return report_measured(args, measured, workload, predicted, budget)


def report_measured(args: argparse.Namespace, measured: dict, workload, predicted: dict | None, budget: float | None) -> int:
    """Print a measurement against its prediction and ``--budget``: the exit status (1 over budget with ``--strict``)."""
    from nas.export import workload_text
    from nas.search.budget import format_ms

    print(
        f"  measured          {measured['median_ms']:.3f} ms (IQR {measured['iqr_ms']:.3f}) on {args.measure}, "
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
                args.measure,
                format_ms(budget),
                also,
            )
            return 1 if args.strict else 0
    return 0


def _extract(supernet, subnet):
    from supernet import extract

    return extract(supernet, subnet).eval()
