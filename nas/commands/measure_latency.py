"""``nas measure-latency``: time sampled subnets of a space on a device; write a timing table."""

from __future__ import annotations

import argparse
import logging

from .common import (
    CAMPAIGN_DEFAULTS,
    add_device_flags,
    add_protocol_arguments,
    emit,
    protocol_settings,
    timing_messages,
    visit_bar,
)
from .checks import device_options
from .registry import register_command

log = logging.getLogger(__name__)

NAME = "measure-latency"
HELP = "time sampled subnets of a space on a device (cpu, cuda, onnxruntime, arm bundle, ssh://host) into a CSV timing table"
EXAMPLE = "nas measure-latency base --device cpu --timing-threads 2 --samples 300 --out runs/lat-cpu.csv"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("space", help="a search-space YAML file, a shipped space name (tiny, base), or a supernet checkpoint "
                   "(.pt: its space, whose prefills stated in bytes of text become each vocabulary's tokens by its "
                   "tokenizer's measured bytes per token)")
    p.add_argument("--device", required=True, metavar="DEVICE",
                   help="the device to time on: cpu, cuda, onnxruntime, arm (with --bundle), or ssh://user@host "
                   "(--timing-target, the name search and export give it, is taken too)")
    p.add_argument("--out", help="timing table CSV (a .json sidecar is written beside it); an existing one is resumed")
    p.add_argument("--bundle", help="with --device arm: write a self-contained bundle (.tar.gz) to run on the board")
    p.add_argument(
        "--samples",
        type=int,
        help="subnets to time, always including the largest and smallest (default 300; 20 with --for-transfer)",
    )
    p.add_argument(
        "--for-transfer",
        action="store_true",
        help="pick the subnets that inform a few-shot transfer most (spread over the latency features by k-means, not "
        "uniform draws); for `nas fit-predictor T.csv --from PRED_DIR` on a new device (default --samples 20)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed for the subnets sampled and the visiting order (default 0)")
    p.add_argument("--workload", help="the space's latency workload to time, by name: prefill (one forward pass) or decode "
                   "(one new token at a context), as the space's latency section names them (default: its first)")
    p.add_argument("--custom-ops", action="store_true", help="onnxruntime and arm: time the graphs with the attention "
                   "types' ONNX Runtime custom operators (nas.kernels, as `nas export --custom-ops` writes them; an arm "
                   "bundle carries their library built for aarch64); default: standard operators only")
    add_device_flags(p, NAME)
    p.add_argument("--precision", help="fp32 (default), int8-dynamic, int8-static, int8-smooth or int8-outlier: onnxruntime "
                   "(cpu) times the graphs "
                   "quantized as an export is (onnxruntime.quantization); recorded in the table, which holds one precision")
    g = add_protocol_arguments(p, defaults=CAMPAIGN_DEFAULTS, title="protocol")
    g.add_argument(
        "--retest",
        type=float,
        default=0.2,
        help="share of subnets timed a second time, at the end, for test-retest agreement (default 0.2)",
    )
    g.add_argument(
        "--memory-mb",
        type=float,
        default=2048,
        help="weights held at once; subnets are timed in interleaved groups this size (default 2048)",
    )


def run(args: argparse.Namespace) -> int:
    with timing_messages("--device"):  # the latency library's "--threads" is this command's --timing-threads
        return _run_with_ops(args)


def _run_with_ops(args: argparse.Namespace) -> int:
    if getattr(args, "custom_ops", False):
        from search_spaces import UserError
        from supernet.attention import ort_ops

        if args.device not in ("onnxruntime", "arm"):
            raise UserError(f"--custom-ops: for --device onnxruntime (this machine's ONNX Runtime) or arm (the bundle "
                            f"carries the library built for aarch64), not {args.device}: a remote host's architecture "
                            "is not known before it is reached")
        with ort_ops.requested(board=args.device == "arm"):
            return _run(args)
    return _run(args)


def _run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from latency.quantize import check_device, check_precision
    from latency.sampling import campaign_subnets, retest_subset, transfer_subnets
    from search_spaces import UserError, load_space, tasks

    if args.space.endswith(".pt"):
        from supernet.checkpoint import load_checkpoint

        space = load_checkpoint(args.space)["space"]
    else:
        space = load_space(args.space)
    task = tasks.of(space)
    task.check_timing(space, args.device, args.precision, args.for_transfer)  # what the task's models are timed on
    workload = space.workload(args.workload)
    for vocab in space.vocabs if getattr(workload, "text_bytes", 0) else ():
        workload.at_vocab(vocab)  # a prefill in bytes of text: every vocabulary's tokens known before anything runs
    settings = protocol_settings(args)
    precision = check_precision(args.precision)
    check_device(precision, args.device, getattr(args, "provider", None))
    if not 0 <= args.retest <= 1:
        raise UserError(f"--retest: {args.retest} is not a share between 0 and 1")
    samples = args.samples if args.samples is not None else 20 if args.for_transfer else 300
    if args.for_transfer:
        subnets = transfer_subnets(space, workload, samples, args.seed)
    else:
        subnets = campaign_subnets(space, samples, args.seed)
    passes = {"measure": subnets, "retest": retest_subset(subnets, args.retest, args.seed)}
    log.info(
        "%s (%s): %d subnets (+%d re-measured), workload %s",
        space.name,
        space.hash,
        len(subnets),
        len(passes["retest"]),
        workload,
    )

    if args.device == "arm" or args.device.startswith("ssh://"):
        import tempfile

        from latency.devices.arm import parse_target, run_remote, write_bundle
        from latency.sampling import campaign_shortfalls

        if args.device == "arm" and not args.bundle:
            raise UserError("--device arm: give --bundle FILE.tar.gz; the bundle is run on the board (see its README.txt)")
        if args.device != "arm":
            # the URL before anything is built (nas.commands.checks did too; a library caller may not)
            parse_target(args.device, "--device")
            if not args.out:
                raise UserError(f"--device {args.device}: give --out TABLE.csv for the fetched timings")
        for line in campaign_shortfalls(len(subnets), len(passes["retest"])):
            log.warning("%s", line)  # a board is a trip away: say it before the bundle goes
        with tempfile.TemporaryDirectory(prefix="nas-bundle-") as scratch:  # an ssh run's bundle: removed however it ends
            target = Path(args.bundle) if args.bundle else Path(scratch) / "bundle.tar.gz"
            b, update = visit_bar("exporting")
            library = None
            if getattr(args, "custom_ops", False):
                from supernet.attention.ort_ops import board_library

                library = board_library()[0]  # (requested(board=True) has built it, or refused)
            write_bundle(target, space, workload, passes, settings, seed=args.seed, progress=update, custom_ops=library)
            b.close()
            if args.bundle:
                print(f"wrote {target}")
                emit(args, {"bundle": str(target), "device": args.device, "space": space.name,
                            "workload": str(workload), "subnets": len(subnets), "retest": len(passes["retest"])})
            if args.device == "arm":
                print(f"next: copy it to the board, `tar xzf {target.name}`, run `python3 nas-latency-bundle/runner.py` "
                      "there (README.txt inside), bring back timings.csv + timings.csv.json, then `nas fit-predictor "
                      "timings.csv`")
                return 0
            run_remote(args.device, target, Path(args.out), threads=args.timing_threads, clock=args.clock,
                       memory_mb=args.memory_mb)
        print(f"fetched {args.out}")
        emit(args, {"out": args.out, "device": args.device, "space": space.name, "workload": str(workload),
                    "subnets": len(subnets), "retest": len(passes["retest"])})
        return 0

    from latency.campaign import run_campaign
    from latency.device import get_device
    from latency.table import TimingTable, make_meta

    if not args.out:
        raise UserError(f"--device {args.device}: give --out TABLE.csv")
    device = get_device(args.device, **device_options(args, NAME), precision=None if precision == "fp32" else precision)
    names = list(task.table_features(space, space.smallest(), workload))
    meta = make_meta(device.fingerprint(), space, workload, settings.to_dict(), args.seed, names)
    if args.for_transfer:
        meta["sampling"] = "transfer"  # checked on resume: a table holds the subnets of one way of choosing them
    meta["subnets"] = {"measure": len(subnets), "retest": len(passes["retest"])}  # (--samples, --retest) checked too
    table = TimingTable(args.out, meta)
    already = sum(len(v) for v in table.done.values())
    if already:
        log.info("resuming %s: %d rows already measured", args.out, already)
    b, update = visit_bar(f"{args.device}")
    try:
        n = run_campaign(device, space, workload, passes, table, settings, seed=args.seed, memory_mb=args.memory_mb,
                         progress=update)
    except KeyboardInterrupt:
        b.close()
        print(f"interrupted; the visits done are kept ({args.out}.visits). Continue with the same command: its flags are "
              f"in {args.out}.json, and a run with others is refused")
        return 130
    b.close()
    print(
        f"measured {n} subnets into {args.out} (baseline reference {table.baseline_ms:.3f} ms)"
        if n
        else f"{args.out}: nothing left to measure"
    )
    emit(args, {"out": args.out, "device": args.device, "space": space.name, "workload": str(workload),
                "measured": n, "rows": sum(len(v) for v in table.done.values()), "baseline_ms": table.baseline_ms,
                "fingerprint": device.fingerprint()})
    return 0


register_command(__name__)
