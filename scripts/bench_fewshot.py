"""Few-shot latency predictors: a new device from 20 timed subnets and the predictors of the other devices.

    python scripts/bench_fewshot.py --out runs/bench_fewshot              # 11 minutes on an idle 2-core CPU
    python scripts/bench_fewshot.py --out runs/fewshot-quick --quick      # smoke run: torch and onnxruntime at 1 thread, prefill

Devices on this machine that differ for real: torch ``cpu`` and ``onnxruntime``, each at 1 thread (the
thread's CPU clock) and 2 threads (wall clock); workloads ``prefill`` (1x256) and ``decode`` (one token
at context 255, ``--paired``) of ``tiny.yaml``; and ``onnxruntime`` at 1 thread with INT8 models
(``--precision int8-dynamic``: integer GEMMs change the balance of projections and attention).  Every table
and predictor is kept in ``--out``: run it again to resume.

Per workload and device, one timing campaign (the protocol of ``nas measure-latency``, one drift baseline):
the 20 subnets ``nas measure-latency --samples 20 --for-transfer`` picks and 100 uniform ones (the full
campaign, the held-out set), interleaved in the same rounds, +20% of each re-measured; then split into
``TAG-few.csv`` (the new device's rows) and ``TAG-full.csv``, and ``nas fit-predictor TAG-full.csv``
fits the device as a source for the others.

Per target device (sources = the other devices of its workload): ``nas fit-predictor TAG-few.csv --from ...``,
scored on the target's full campaign: Kendall tau, share within ±10%, MAPE;
beside it a predictor fit from scratch on the same 20 rows (the models and cross-validation of
``nas fit-predictor`` without ``--from``), and the learning curve: from-scratch fits on n rows drawn from
the full campaign (``--reps`` draws each), scored with the transfer on the same remaining rows.  "Rows to
match": the fewest n whose mean tau and mean share within ±10% both reach the transfer's.  Writes
``fewshot.json``, ``fewshot.csv`` and ``learning_curve.png``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
from joblib import Parallel, delayed, parallel_backend

ROOT = str(Path(__file__).resolve().parents[1])
sys.path.insert(0, ROOT)
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)  # the curve's workers too

from latency.campaign import run_campaign  # noqa: E402
from latency.device import get_device  # noqa: E402
from latency.features import table_features  # noqa: E402
from latency.predictors import load_predictor  # noqa: E402
from latency.predictors.predictor import MODELS, subnet_matrix  # noqa: E402
from latency.predictors.select import cross_validate  # noqa: E402
from latency.report import agreement  # noqa: E402
from latency.sampling import campaign_subnets, retest_subset, transfer_subnets  # noqa: E402
from latency.table import TimingTable, make_meta, read_timings  # noqa: E402
from latency.timing_core import Settings, sidecar_path  # noqa: E402
from search_spaces import Space, load_space  # noqa: E402

from _bench_common import run_nas  # noqa: E402

TARGET_TAU, TARGET_WITHIN_10 = 0.9, 0.85


# tag -> (device, threads, clock, options): `nas measure-latency --device D --timing-threads N --clock C [--precision P]`
DEVICES = {
    "cpu1": ("cpu", 1, "cpu", {}),
    "cpu2": ("cpu", 2, "wall", {}),
    "ort1": ("onnxruntime", 1, "cpu", {}),
    "ort2": ("onnxruntime", 2, "wall", {}),
    "ort1-int8": ("onnxruntime", 1, "cpu", {"precision": "int8-dynamic"}),
}


@dataclass(frozen=True)
class Plan:
    full: int = 100  # subnets of the full campaign (the held-out set), + retest re-measured
    few: int = 20  # the new device's rows
    retest: float = 0.2
    warmup: int = 5
    repeats: int = 9
    rounds: int = 3
    min_sample_ms: float = 10.0
    curve: tuple[int, ...] = (10, 20, 30, 40, 60, 80)  # rows of the from-scratch learning curve
    reps: int = 3  # draws per point of the curve
    models: str = "mlp,gbt,additive"  # the models of the sources and of the fits from scratch (nas fit-predictor's)


QUICK = Plan(full=16, few=8, warmup=1, repeats=2, rounds=1, min_sample_ms=2.0, curve=(6, 10), reps=2, models="gbt,additive")


def measure(out: Path, space: Space, workload: str, tag: str, plan: Plan) -> tuple[Path, Path]:
    """One campaign per device: the ``--for-transfer`` subnets and the full campaign's, interleaved in the same rounds
    (one drift baseline), then split into ``TAG-few.csv`` and ``TAG-full.csv`` (each with the campaign's sidecar)."""
    w = space.workload(workload)
    few = transfer_subnets(space, w, plan.few, seed=1)  # what `nas measure-latency --samples 20 --for-transfer` times
    full = [s for s in campaign_subnets(space, plan.full + plan.few, seed=0) if s not in few][: plan.full]
    name, threads, clock, options = DEVICES[tag]
    device = get_device(name, threads=threads, clock=clock, **options)
    settings = Settings(warmup=plan.warmup, repeats=plan.repeats, rounds=plan.rounds, min_sample_ms=plan.min_sample_ms,
                        paired=workload == "decode")  # decode: the reading README's protocol section advises
    both = out / workload / f"{tag}-campaign.csv"
    meta = make_meta(device.fingerprint(), space, w, settings.to_dict(), 0, list(table_features(space, space.smallest(), w)))
    meta["sampling"] = "bench-fewshot"
    table = TimingTable(both, meta)  # resumes a campaign already begun
    passes = {"measure": few + full, "retest": retest_subset(few, plan.retest, 1) + retest_subset(full, plan.retest, 0)}
    run_campaign(device, space, w, passes, table, settings, seed=0)
    paths = []
    for part, subnets in (("few", few), ("full", full)):
        keys = {s.key for s in subnets}
        with open(both, newline="") as f:
            rows = list(csv.DictReader(f))
        paths.append(out / workload / f"{tag}-{part}.csv")
        with open(paths[-1], "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=table.meta["columns"], lineterminator="\n")
            writer.writeheader()
            writer.writerows(r for r in rows if r["key"] in keys)
        shutil.copyfile(sidecar_path(str(both)), sidecar_path(str(paths[-1])))
    return paths[0], paths[1]


def fit(table: Path, folder: Path, log: Path, sources: list[Path] = (), models: str | None = None) -> Path:
    """``nas fit-predictor`` (``--from`` each source; else ``--models``), unless ``folder`` already holds its predictor."""
    if not (folder / "predictor.json").exists():
        flags = [a for s in sources for a in ("--from", str(s))] or ["--models", models or Plan.models]
        run_nas(["fit-predictor", str(table), "--out", str(folder), *flags], log, "bench_fewshot")
    return folder


def scratch(views: dict[str, np.ndarray], y: np.ndarray, rows: np.ndarray, seed: int = 0):
    """What `nas fit-predictor` does without --from, on ``rows`` only: the lowest cross-validated MAPE, refit on them."""
    folds = min(5, len(rows))
    best = min(views, key=lambda k: cross_validate(k, views[k][rows], y[rows], folds, seed)["mape"])
    model = MODELS[best]().fit(views[best][rows], y[rows], seed)
    return best, lambda where: model.predict(views[best][where])


def curve_point(views: dict[str, np.ndarray], y: np.ndarray, held: np.ndarray, n: int, rep: int):
    """A from-scratch fit on ``n`` rows drawn from ``held`` (seeded by n and rep), scored on the rest of ``held``."""
    drawn = np.random.default_rng([n, rep]).choice(held, size=n, replace=False)
    rest = np.setdiff1d(held, drawn)
    _, predict = scratch(views, y, drawn, seed=rep)
    return agreement(predict(rest), y[rest]), rest


def score_target(out: Path, workload: str, tag: str, tags: list[str], plan: Plan, log: Path, jobs: int) -> dict:
    base = out / workload
    sources = [base / f"pred-{t}" for t in tags if t != tag]
    transfer = load_predictor(fit(base / f"{tag}-few.csv", base / f"transfer-{tag}", log, sources))
    full, few = read_timings(base / f"{tag}-full.csv"), read_timings(base / f"{tag}-few.csv")
    measured, again, few_rows = full.passes("measure"), full.passes("retest"), few.passes("measure")
    keys = list(measured)
    subnets = [measured[k].subnet for k in keys]
    y = np.array([measured[k].median_ms for k in keys])
    outside = np.array([k not in few_rows for k in keys])  # the held-out rows: the full campaign (no few row is in it)
    t_pred = transfer.predict(subnets)

    kinds = plan.models.split(",")
    few_subnets = [r.subnet for r in few_rows.values()]
    both = subnets + few_subnets
    views = {k: subnet_matrix(k, full.space, full.workload, both)[0] for k in kinds}
    y_both = np.concatenate([y, [r.median_ms for r in few_rows.values()]])
    own = np.arange(len(keys), len(both))  # the few rows, as rows of `views`
    chosen_20, predict_20 = scratch(views, y_both, own)
    held = np.flatnonzero(outside)
    result = {
        "workload": workload, "target": tag, "sources": [s.name for s in sources],
        "chosen": transfer.metrics.get("chosen"), "few_rows": len(few_rows), "held_out": int(outside.sum()),
        "transfer": agreement(t_pred[outside], y[outside]),
        "scratch_same_rows": {**agreement(predict_20(held), y[outside]), "model": chosen_20},
    }
    if len(again) >= 2:
        pairs = [k for k in keys if k in again]
        first, second = (np.array([table[k].median_ms for k in pairs]) for table in (measured, again))
        result["test_retest"] = agreement(second, first)

    points = [(n, rep) for n in plan.curve if n < len(held) - 2 for rep in range(plan.reps)]
    with parallel_backend("loky", inner_max_num_threads=1):  # the fits are small: one thread each, a process per core
        runs = Parallel(n_jobs=jobs)(delayed(curve_point)(views, y_both, held, n, rep) for n, rep in points)
    curve = []
    for n in sorted({n for n, _ in points}):
        mine = [(r, rest) for (m, _), (r, rest) in zip(points, runs) if m == n]
        t_runs = [agreement(t_pred[rest], y[rest]) for _, rest in mine]
        mean = {m: float(np.mean([r[m] for r, _ in mine])) for m in ("kendall_tau", "within_10", "mape")}
        t_mean = {m: float(np.mean([r[m] for r in t_runs])) for m in ("kendall_tau", "within_10", "mape")}
        curve.append({"rows": n, "scratch": mean, "transfer": t_mean})
    match = next((c["rows"] for c in curve if c["scratch"]["kendall_tau"] >= c["transfer"]["kendall_tau"]
                  and c["scratch"]["within_10"] >= c["transfer"]["within_10"]), None)
    result["curve"], result["rows_to_match"] = curve, match
    result["rows_to_match_text"] = str(match) if match is not None else f"> {curve[-1]['rows'] if curve else 0}"
    tr = result["transfer"]
    result["met"] = bool(tr["kendall_tau"] >= TARGET_TAU and tr["within_10"] >= TARGET_WITHIN_10)
    return result


def plot(results: list[dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = sorted({r["workload"] for r in results}, key=["prefill", "decode"].index)
    fig, axes = plt.subplots(len(workloads), 2, figsize=(11, 4 * len(workloads)), dpi=110, squeeze=False)
    for row, workload in zip(axes, workloads):
        for i, r in enumerate(x for x in results if x["workload"] == workload):
            colour = f"C{i}"
            for ax, metric in zip(row, ("kendall_tau", "within_10")):
                rows = [c["rows"] for c in r["curve"]]
                ax.plot(rows, [c["scratch"][metric] for c in r["curve"]], "o-", color=colour, label=f"{r['target']} from scratch")
                ax.axhline(r["transfer"][metric], color=colour, ls="--", lw=1)
                ax.plot([r["few_rows"]], [r["transfer"][metric]], "*", ms=14, color=colour,
                        label=f"{r['target']} transfer ({r['few_rows']} rows)")
        for ax, metric, goal in zip(row, ("Kendall tau", "share within ±10%"), (TARGET_TAU, TARGET_WITHIN_10)):
            ax.axhline(goal, color="black", lw=0.8, ls=":")
            ax.set_xlabel("rows of the target device timed")
            ax.set_ylabel(f"{metric} on held-out rows")
            ax.set_title(f"{workload}: {metric}", fontsize=10)
        row[0].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/bench_fewshot", help="tables, predictors and results (rerun to resume)")
    ap.add_argument("--space", default="tiny", help="the search space (default tiny; the tests give a smaller one)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: tiny campaigns and protocol, 1 thread, prefill only")
    ap.add_argument("--devices", help=f"comma-separated, of {', '.join(DEVICES)} (default: all; --quick: cpu1,ort1)")
    ap.add_argument("--workloads", help="comma-separated, of prefill, decode (default: both; --quick: prefill)")
    ap.add_argument("--jobs", type=int, help="processes for the learning curve's fits (default 2, the cores; --quick 1)")
    ap.add_argument("--full", type=int, help="subnets of each full campaign (default 100; --quick 16)")
    ap.add_argument("--few", type=int, help="rows of the target device (default 20; --quick 8)")
    args = ap.parse_args(argv)
    plan = QUICK if args.quick else Plan()
    plan = replace(plan, full=args.full or plan.full, few=args.few or plan.few)
    jobs = args.jobs or (1 if args.quick else 2)
    tags = (args.devices or ("cpu1,ort1" if args.quick else ",".join(DEVICES))).split(",")
    workloads = (args.workloads or ("prefill" if args.quick else "prefill,decode")).split(",")
    bad = [t for t in tags if t not in DEVICES] + [w for w in workloads if w not in ("prefill", "decode")]
    if bad or len(tags) < 2:
        ap.error(f"--devices / --workloads: {', '.join(bad) or 'give at least 2 devices'} (devices: {', '.join(DEVICES)})")
    space = load_space(args.space)
    missing = [w for w in workloads if w not in [x.name for x in space.workloads]]
    if missing:
        ap.error(f"--workloads: space {space.name!r} has no workload {', '.join(missing)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "commands.log"
    start = time.time()
    for workload in workloads:
        (out / workload).mkdir(exist_ok=True)
        for tag in tags:
            t0 = time.time()
            _, full = measure(out, space, workload, tag, plan)
            fit(full, out / workload / f"pred-{tag}", log, models=plan.models)
            print(f"{workload} {tag}: campaigns and source predictor ready ({time.time() - t0:.0f} s)", file=sys.stderr)
    results = [score_target(out, w, t, tags, plan, log, jobs) for w in workloads for t in tags]

    print(f"few-shot transfer on space {space.name}: {plan.few} rows of the target (--for-transfer), sources = the other "
          f"devices of the workload; scored on the target's full campaign of {plan.full} (uniform draws, in the same rounds); "
          f"goal tau >= {TARGET_TAU}, >= {TARGET_WITHIN_10:.0%} within ±10%")
    head = (f"{'workload':<9}{'target':<11}{'chosen (sources by tag)':<34}{'tau':>6}{'±10%':>7}{'MAPE':>7}  |"
            f"{'scratch':>9}{'tau':>6}{'±10%':>7}  |{'rows to match':>14}  |{'retest tau':>11}{'±10%':>7}  goal")
    print(head)
    for r in results:
        t, s, c = r["transfer"], r["scratch_same_rows"], r.get("test_retest")
        ceiling = f"{c['kendall_tau']:>11.3f}{c['within_10']:>7.0%}" if c else f"{'n/a':>11}{'':>7}"
        chosen = str(r["chosen"]).replace(f"{out / r['workload']}{os.sep}pred-", "")  # a source by its device's tag
        print(f"{r['workload']:<9}{r['target']:<11}{chosen:<34.34}{t['kendall_tau']:>6.3f}{t['within_10']:>7.0%}"
              f"{t['mape']:>7.1%}  |{s['model']:>9}{s['kendall_tau']:>6.3f}{s['within_10']:>7.0%}  |"
              f"{r['rows_to_match_text']:>14}  |{ceiling}  {'met' if r['met'] else 'MISSED'}")
    print("learning curve (from scratch, mean of the draws; transfer on the same rows):")
    for r in results:
        points = ", ".join(f"{c['rows']}: tau {c['scratch']['kendall_tau']:.3f} / {c['scratch']['within_10']:.0%}"
                           for c in r["curve"])
        print(f"  {r['workload']} {r['target']}: {points}")
    png = plot(results, out / "learning_curve.png")
    with open(out / "fewshot.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["workload", "target", "chosen", "tau", "within_10", "mape", "scratch_model", "scratch_tau",
                    "scratch_within_10", "rows_to_match", "retest_tau", "retest_within_10", "met"])
        for r in results:
            t, s, c = r["transfer"], r["scratch_same_rows"], r.get("test_retest") or {}
            w.writerow([r["workload"], r["target"], r["chosen"], t["kendall_tau"], t["within_10"], t["mape"], s["model"],
                        s["kendall_tau"], s["within_10"], r["rows_to_match_text"], c.get("kendall_tau"), c.get("within_10"),
                        r["met"]])
    doc = {"plan": asdict(plan), "devices": tags, "workloads": workloads, "load": os.getloadavg()[0],
           "seconds": time.time() - start, "results": results}
    (out / "fewshot.json").write_text(json.dumps(doc, indent=2, default=list) + "\n")
    print(f"wrote {out / 'fewshot.json'}, {out / 'fewshot.csv'}, {png} ({time.time() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
