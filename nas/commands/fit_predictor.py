"""``nas fit-predictor``: fit latency predictors on a timing table, keep the best, report and save it."""

from __future__ import annotations

import argparse
from .registry import register_command

NAME = "fit-predictor"
HELP = "fit latency predictors (MLP, boosted trees, per-layer additive) on a timing table; keep the best by cross-validation"
EXAMPLE = (
    "nas fit-predictor runs/lat-cpu.csv --out runs/pred-cpu\n"
    "  nas fit-predictor runs/lat-board.csv --from runs/pred-cpu --from runs/pred-ort --out runs/pred-board   # few-shot"
)
DEFAULT_MODELS = "mlp,gbt,additive"
DEFAULT_FOLDS = 5


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "timings", help="a timing table from `nas measure-latency` (CSV + .json sidecar), or a plain CSV with --target"
    )
    p.add_argument("--out", required=True, help="folder for predictor.json + arrays.npz, the PNG and report.txt")
    p.add_argument("--target", help="fit a plain CSV: this column is the latency, every other column a numeric feature")
    p.add_argument("--models", default=DEFAULT_MODELS, help=f"models to compare (default {DEFAULT_MODELS})")
    p.add_argument(
        "--from",
        dest="sources",
        action="append",
        metavar="PRED_DIR",
        help="few-shot transfer (repeatable): fit a device with few rows (>= 5; 20 advised, `nas measure-latency "
        "--for-transfer`) from predictors of other devices of the same space and workload (or plain tables with "
        "these columns); leave-one-out chooses how (scale, sources, terms, scratch)",
    )
    p.add_argument(
        "--folds", type=int, default=DEFAULT_FOLDS, help=f"cross-validation folds on the training split (default {DEFAULT_FOLDS})"
    )
    p.add_argument(
        "--test-fraction", type=float, default=0.2, help="held-out share when the table has no re-measured subnets (default 0.2)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed for splits and model fitting (default 0)")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    import numpy as np

    from latency.predictors.predictor import MODELS, Predictor, load_predictor, subnet_matrix
    from latency.predictors.select import holdout, select
    from latency.predictors.transfer import MIN_ROWS, load_sources, scratch_columns, select_transfer
    from latency.report import HEADER, agreement, format_row, plot
    from latency.sampling import MIN_FIT_SUBNETS, MIN_RETEST_SUBNETS
    from latency.table import read_plain, read_timings
    from search_spaces import UserError
    from supernet.files import atomic_write

    if args.sources and args.models != DEFAULT_MODELS:
        raise UserError("--models: not used with --from (a transfer chooses among its own candidates by leave-one-out)")
    if args.sources and args.folds != DEFAULT_FOLDS:
        raise UserError("--folds: not used with --from (a transfer cross-validates leave-one-out: its rows are few)")
    min_rows = MIN_ROWS if args.sources else MIN_FIT_SUBNETS
    fitting = f"a transfer (--from) needs at least {MIN_ROWS}" if args.sources else f"fitting needs at least {MIN_FIT_SUBNETS}"
    kinds = [k.strip() for k in args.models.split(",") if k.strip()]
    bad = [k for k in kinds if k not in MODELS]
    if bad or not kinds:
        raise UserError(f"--models: {', '.join(bad) or repr(args.models)} not among {', '.join(MODELS)}")
    if args.folds < 2:
        raise UserError(f"--folds: {args.folds}; cross-validation needs at least 2")
    if not 0 < args.test_fraction < 1:
        raise UserError(f"--test-fraction: {args.test_fraction} is not between 0 and 1")
    lines: list[str] = []

    def say(text: str = "") -> None:
        print(text)
        lines.append(text)

    retest = ceiling = None
    intro: list[str] = []  # said once the sources (if any) are checked: a refusal prints nothing else
    if args.target:
        names, x, y = read_plain(args.timings, args.target, min_rows, fitting)
        x, y = np.array(x), np.array(y)
        views = {k: x for k in kinds}
        test = holdout(len(y), args.test_fraction, args.seed)
        intro.append(f"{args.timings}: {len(y)} rows, {len(names)} feature columns, target {args.target!r}")
        view_names, space, workload, reference_ms = names, None, None, None
        fingerprint: dict = {}
    else:
        t = read_timings(args.timings)
        measured = t.passes("measure")
        if len(measured) < min_rows:
            raise UserError(f"{args.timings}: {len(measured)} measured subnets; {fitting}")
        keys = list(measured)
        subnets = [measured[k].subnet for k in keys]
        y = np.array([measured[k].median_ms for k in keys])
        second = t.passes("retest")
        forced = np.array([k in second for k in keys]) if sum(k in second for k in keys) >= MIN_RETEST_SUBNETS else None
        test = holdout(len(y), args.test_fraction, args.seed, forced)
        views = {} if args.sources else {k: subnet_matrix(k, t.space, t.workload, subnets)[0] for k in kinds}
        if args.sources:
            x, view_names = subnet_matrix("transfer", t.space, t.workload, subnets)  # the encoding and the summaries
        names = subnet_matrix("additive", t.space, t.workload, subnets[:1])[1]
        space, workload, fingerprint, reference_ms = t.space, t.workload, t.fingerprint, t.meta.get("baseline_ms")
        fp = t.fingerprint
        intro.append(
            f"{args.timings}: {len(y)} subnets of space {space.name} ({space.hash}), workload {workload}; {fp.get('device')} / "
            f"{fp.get('runtime')} / {fp.get('cpu_model')} / threads {fp.get('threads')} / {fp.get('precision', 'fp32')}"
        )
        if forced is not None:
            retest = (np.array([second[k].median_ms for k, m in zip(keys, test) if m]), y[test])
        again = [k for k in keys if k in second]
        if len(again) >= 2:  # the ceiling needs only pairs, also where too few to hold out
            ceiling = agreement(np.array([second[k].median_ms for k in again]), np.array([measured[k].median_ms for k in again]))
        flagged = sum(1 for k in keys if measured[k].flags)
        intro.append(
            f"flags: {flagged} of {len(keys)} subnets flagged "
            f"({', '.join(sorted({f for k in keys for f in measured[k].flags})) or 'none'})"
        )
    sources = load_sources(args.sources, space, workload, view_names, args.timings, load_predictor) if args.sources else []
    for text in intro:
        say(text)

    split = "the re-measured subnets" if retest is not None else f"a seeded {args.test_fraction:.0%}"
    if sources:  # few rows: every row in the choice, the held-out ones scored by the choice refitted without them
        say(f"held out: {int(test.sum())} ({split}), scored by the chosen method refitted on the other {int((~test).sum())}; "
            f"cross-validation: leave-one-out on all {len(y)}")
    else:
        say(f"held out: {int(test.sum())} ({split}); cross-validation: {args.folds}-fold on the other {int((~test).sum())}")
    if sources:
        for s in sources:
            say(f"source {s.label}: {s.kind}")
        say(HEADER)
        sel = select_transfer(
            sources, x, y, test, scratch_index=scratch_columns(space, view_names),
            on_candidate=lambda k, m: say(format_row(f"cv {k}", m)),
        )
        say(f"chosen: {sel.best} (lowest leave-one-out MAPE)")
    else:
        say(HEADER)
        sel = select(views, y, test, folds=args.folds, seed=args.seed, on_model=lambda k, m: say(format_row(f"cv {k}", m)))
        say(f"chosen: {sel.best} (lowest cross-validated MAPE)")
    say(format_row(f"held-out {sel.best}", sel.test))
    metrics = {"cv": sel.cv, "held_out": sel.test, "chosen": sel.best}
    if sources:
        metrics["sources"] = [{"path": s.label, "model": s.kind} for s in sources]
    if retest is not None:
        metrics["held_out_vs_retest"] = agreement(sel.test_pred, retest[0])
        say(format_row("held-out vs re-measured", metrics["held_out_vs_retest"]))
    if ceiling is not None:
        metrics["test_retest"] = ceiling
        say(format_row("test-retest (ceiling)", metrics["test_retest"]))
    else:
        say("test-retest: not available (the table has no re-measured rows)")

    out = Path(args.out)
    if sel.best == "additive":
        sel.final.names = names  # so its costs read by name
    predictor = Predictor(
        sel.final.kind, sel.final, space, workload, fingerprint, names if space is None else None, metrics, reference_ms
    )
    path = predictor.save(out)
    title = (f"{sel.best} on {Path(args.timings).name}: held-out within ±10% {sel.test['within_10']:.0%}, "
             f"tau {sel.test['kendall_tau']:.3f}")
    png = plot(
        out / "predicted_vs_measured.png",
        y[test],
        sel.test_pred,
        title,
        retest=None if retest is None else (retest[1], retest[0]),
    )
    if sel.best == "additive" and space is not None:
        say("additive costs (ms per unit): " + ", ".join(f"{k}={v:.3g}" for k, v in sel.final.costs().items() if v))
    say(f"saved {path} (+ arrays.npz; refit on all {len(y)} rows), {png}")
    atomic_write(out / "report.txt", "\n".join(lines) + "\n")
    from nas.commands.common import emit

    emit(args, {"predictor": str(path), "out": str(out), "chosen": sel.best, "metrics": metrics, "rows": len(y),
                "plot": str(png), "report": str(out / "report.txt")})
    return 0


register_command(__name__)
