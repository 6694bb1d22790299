"""``nas fit-predictor``: fit latency predictors on a timing table, keep the best, report and save it."""

from __future__ import annotations

import argparse

NAME = "fit-predictor"
HELP = "fit latency predictors (MLP, boosted trees, per-layer additive) on a timing table; keep the best by cross-validation"
EXAMPLE = "nas fit-predictor runs/lat-cpu.csv --out runs/pred-cpu"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "timings", help="a timing table from `nas measure-latency` (CSV + .json sidecar), or a plain CSV with --target"
    )
    p.add_argument("--out", required=True, help="folder for predictor.json + arrays.npz, the PNG and report.txt")
    p.add_argument("--target", help="fit a plain CSV: this column is the latency, every other column a numeric feature")
    p.add_argument("--models", default="mlp,gbt,additive", help="models to compare (default mlp,gbt,additive)")
    p.add_argument("--folds", type=int, default=5, help="cross-validation folds on the training split (default 5)")
    p.add_argument(
        "--test-fraction", type=float, default=0.2, help="held-out share when the table has no re-measured subnets (default 0.2)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed for splits and model fitting (default 0)")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    import numpy as np

    from latency.predictors.predictor import MODELS, Predictor, subnet_matrix
    from latency.predictors.select import holdout, select
    from latency.report import HEADER, agreement, format_row, plot
    from latency.sampling import MIN_FIT_SUBNETS, MIN_RETEST_SUBNETS
    from latency.table import read_plain, read_timings
    from search_spaces import UserError

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

    retest = None
    if args.target:
        names, x, y = read_plain(args.timings, args.target)
        x, y = np.array(x), np.array(y)
        views = {k: x for k in kinds}
        test = holdout(len(y), args.test_fraction, args.seed)
        say(f"{args.timings}: {len(y)} rows, {len(names)} feature columns, target {args.target!r}")
        space = workload = reference_ms = None
        fingerprint: dict = {}
    else:
        t = read_timings(args.timings)
        measured = t.passes("measure")
        if len(measured) < MIN_FIT_SUBNETS:
            raise UserError(f"{args.timings}: {len(measured)} measured subnets; fitting needs at least {MIN_FIT_SUBNETS}")
        keys = list(measured)
        subnets = [measured[k].subnet for k in keys]
        y = np.array([measured[k].median_ms for k in keys])
        second = t.passes("retest")
        forced = np.array([k in second for k in keys]) if sum(k in second for k in keys) >= MIN_RETEST_SUBNETS else None
        test = holdout(len(y), args.test_fraction, args.seed, forced)
        views = {k: subnet_matrix(k, t.space, t.workload, subnets)[0] for k in kinds}
        names = subnet_matrix("additive", t.space, t.workload, subnets[:1])[1]
        space, workload, fingerprint, reference_ms = t.space, t.workload, t.fingerprint, t.meta.get("baseline_ms")
        fp = t.fingerprint
        say(
            f"{args.timings}: {len(y)} subnets of space {space.name} ({space.hash}), workload {workload}; {fp.get('device')} / "
            f"{fp.get('runtime')} / {fp.get('cpu_model')} / threads {fp.get('threads')}"
        )
        if forced is not None:
            retest = (np.array([second[k].median_ms for k, m in zip(keys, test) if m]), y[test])
        flagged = sum(1 for k in keys if measured[k].flags)
        say(
            f"flags: {flagged} of {len(keys)} subnets flagged "
            f"({', '.join(sorted({f for k in keys for f in measured[k].flags})) or 'none'})"
        )

    split = "the re-measured subnets" if retest is not None else f"a seeded {args.test_fraction:.0%}"
    say(f"held out: {int(test.sum())} ({split}); cross-validation: {args.folds}-fold on the other {int((~test).sum())}")
    say(HEADER)
    sel = select(views, y, test, folds=args.folds, seed=args.seed, on_model=lambda k, m: say(format_row(f"cv {k}", m)))
    say(f"chosen: {sel.best} (lowest cross-validated MAPE)")
    say(format_row(f"held-out {sel.best}", sel.test))
    metrics = {"cv": sel.cv, "held_out": sel.test, "chosen": sel.best}
    if retest is not None:
        metrics["test_retest"] = agreement(retest[0], retest[1])
        metrics["held_out_vs_retest"] = agreement(sel.test_pred, retest[0])
        say(format_row("held-out vs re-measured", metrics["held_out_vs_retest"]))
        say(format_row("test-retest (ceiling)", metrics["test_retest"]))
    else:
        say("test-retest: not available (the table has no re-measured rows)")

    out = Path(args.out)
    if sel.best == "additive":
        sel.final.names = names  # so its costs read by name
    predictor = Predictor(
        sel.best, sel.final, space, workload, fingerprint, names if space is None else None, metrics, reference_ms
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
    (out / "report.txt").write_text("\n".join(lines) + "\n")
    return 0
