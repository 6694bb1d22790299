"""Latency predictors from few timings: every model fitted on 20 timed subnets, scored on 40 others, against the
test-retest ceiling of the same table.

    python scripts/bench_predictor_fewshot.py runs/lat-lra.csv runs/lat-vision.csv --out runs/bench-pred-fewshot
    python scripts/bench_predictor_fewshot.py --measure --out runs/bench-pred-fewshot     # times them: a QUIET machine
    python scripts/bench_predictor_fewshot.py TABLE.csv --out runs/pred-quick --quick     # a smoke run: 2 draws

Input: timing tables of ``nas measure-latency`` (CSV + sidecar), each with at least ``--train`` + 5 measured subnets
and some re-measured ones (``--retest``: the ceiling).  With ``--measure`` the script times them itself, once per
space of ``--spaces`` (default ``lra-tiny,vision-tiny``): ``nas measure-latency SPACE --device cpu --timing-threads 1
--samples 60 --retest 0.5`` (``--quick``: 30 subnets), recording the load average before and after; timings need a
quiet machine (nothing else running: another process on a core moves one-thread timings by more than the ceiling).

Per table, ``--draws`` seeded draws (default 10; ``--quick`` 2) of ``--train`` subnets (default 20) to fit and
``--test`` others (default 40) to score, among its measured rows.  Each registered predictor model (``nas
fit-predictor --models``: mlp, gbt, additive, layered, ...) is fitted on the draw's rows from scratch, and so is
``nas fit-predictor``'s own choice (the model of lowest 5-fold cross-validated MAPE on those rows: what a user who
times 20 subnets gets).  Scored: MAPE, share within ±10%, Kendall tau on the held-out rows; the ceiling is the
test-retest agreement of the table's re-measured subnets (the same subnets timed twice).  The target (issue 56): the
fit-predictor choice within 1.5x the ceiling's MAPE.  Writes ``predictor_fewshot.json`` and ``predictor_fewshot.csv``
in ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = str(Path(__file__).resolve().parents[1])
sys.path.insert(0, ROOT)
sys.path.insert(0, str(Path(__file__).resolve().parent))

from latency.predictors.models import MODELS, new_model, subnet_matrix  # noqa: E402
from latency.predictors.select import select  # noqa: E402
from latency.report import agreement  # noqa: E402
from latency.table import read_timings  # noqa: E402
from search_spaces import UserError  # noqa: E402

from _bench_common import run_nas  # noqa: E402

TARGET_RATIO = 1.5  # the chosen predictor's held-out MAPE at most this times the test-retest MAPE
CHOICE = "fit-predictor"  # the row of nas fit-predictor's own choice among the models


def measure_tables(out: Path, spaces: list[str], samples: int) -> tuple[list[Path], list[dict]]:
    """Time each space's campaign on the cpu at one thread (unless its table is there: a rerun resumes); the load
    average before and after each."""
    tables, loads = [], []
    for space in spaces:
        path = out / f"{Path(space).stem}.csv"
        before = os.getloadavg()
        if not path.exists():
            run_nas(["measure-latency", space, "--device", "cpu", "--timing-threads", "1", "--samples", str(samples),
                     "--retest", "0.5", "--out", str(path), "-q"], out / "measure.log", "bench_predictor_fewshot")
        loads.append({"space": space, "table": str(path), "load_before": before[0], "load_after": os.getloadavg()[0]})
        tables.append(path)
    return tables, loads


def ceiling_of(timings) -> dict | None:
    """Test-retest agreement of the table's re-measured subnets (None with fewer than 2)."""
    first, again = timings.passes("measure"), timings.passes("retest")
    keys = [k for k in again if k in first]
    if len(keys) < 2:
        return None
    return agreement(np.array([again[k].median_ms for k in keys]), np.array([first[k].median_ms for k in keys]))


def draws_of(n: int, train: int, test: int, draws: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``draws`` seeded (train rows, test rows) pairs among ``n`` rows (the test: the next ``test`` after the train
    rows, or all the rest)."""
    out = []
    for d in range(draws):
        order = np.random.default_rng([d, 56]).permutation(n)
        out.append((order[:train], order[train:train + test]))
    return out


def score_table(path: Path, kinds: list[str], train: int, test: int, draws: int) -> dict:
    """Every model's and fit-predictor's choice's held-out agreement over the draws, beside the table's ceiling."""
    t = read_timings(path)
    measured = t.passes("measure")
    if len(measured) < train + 5:
        raise UserError(f"{path}: {len(measured)} measured subnets; --train {train} needs at least {train + 5} "
                        "(the rest are scored)")
    subnets = [r.subnet for r in measured.values()]
    y = np.array([r.median_ms for r in measured.values()])
    views = {k: subnet_matrix(k, t.space, t.workload, subnets) for k in kinds}
    scores: dict[str, list[dict]] = {k: [] for k in (*kinds, CHOICE)}
    chosen = []
    for tr, te in draws_of(len(y), train, test, draws):
        for k in kinds:
            x, names = views[k]
            with np.errstate(over="ignore"):
                pred = new_model(k, names).fit(x[tr], y[tr], 0).predict(x[te])
            scores[k].append(agreement(pred, y[te]))
        # nas fit-predictor on the draw's rows: 5-fold cross-validation chooses, the choice refitted on all of them
        mask = np.zeros(len(tr) + len(te), dtype=bool)
        mask[len(tr):] = True
        rows = np.concatenate([tr, te])
        sel = select({k: views[k][0][rows] for k in kinds}, y[rows], mask, names={k: views[k][1] for k in kinds})
        chosen.append(sel.best)
        scores[CHOICE].append(sel.test)
    ceiling = ceiling_of(t)
    summary = {}
    for k, runs in scores.items():
        mape = np.array([r["mape"] for r in runs])
        summary[k] = {"mape": float(mape.mean()), "mape_sd": float(mape.std()),
                      "within_10": float(np.mean([r["within_10"] for r in runs])),
                      "kendall_tau": float(np.mean([r["kendall_tau"] for r in runs]))}
        if ceiling is not None:
            summary[k]["vs_ceiling"] = float(mape.mean() / ceiling["mape"]) if ceiling["mape"] > 0 else None
    met = None if ceiling is None or summary[CHOICE].get("vs_ceiling") is None else summary[CHOICE]["vs_ceiling"] <= TARGET_RATIO
    fp = t.fingerprint
    return {"table": str(path), "space": t.space.name, "workload": str(t.workload), "measured": len(y),
            "device": f"{fp.get('device')} / {fp.get('runtime')} / threads {fp.get('threads')} / {fp.get('cpu_model')}",
            "train": train, "test": min(test, len(y) - train),
            "draws": draws, "ceiling": ceiling, "models": summary, "chosen": chosen, "target_met": met}


def report(results: list[dict]) -> list[str]:
    lines = []
    for r in results:
        c = r["ceiling"]
        lines.append(f"{r['table']}: space {r['space']}, {r['workload']}, {r['device']}; {r['measured']} measured; "
                     f"fit on {r['train']}, scored on {r['test']}, {r['draws']} draws")
        lines.append(f"  {'model':<14} {'MAPE':>8} {'sd':>7} {'±10%':>7} {'tau':>6} {'x ceiling':>10}")
        for k, m in r["models"].items():
            ratio = f"{m['vs_ceiling']:.2f}x" if m.get("vs_ceiling") is not None else "-"
            lines.append(f"  {k:<14} {m['mape']:8.2%} {m['mape_sd']:7.2%} {m['within_10']:7.1%} {m['kendall_tau']:6.3f} "
                         f"{ratio:>10}")
        if c is None:
            lines.append("  test-retest: not available (the table has fewer than 2 re-measured subnets)")
        else:
            lines.append(f"  {'test-retest':<14} {c['mape']:8.2%} {'':>7} {c['within_10']:7.1%} {c['kendall_tau']:6.3f} "
                         f"(n {c['n']}: the ceiling)")
        chosen = {k: r["chosen"].count(k) for k in dict.fromkeys(r["chosen"])}
        verdict = {None: "not judged (no ceiling)", True: "met", False: "missed"}[r["target_met"]]
        lines.append(f"  fit-predictor chose {', '.join(f'{k} x{n}' for k, n in chosen.items())}; target (within "
                     f"{TARGET_RATIO}x the ceiling): {verdict}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tables", nargs="*", help="timing tables (nas measure-latency's CSV + sidecar)")
    ap.add_argument("--out", required=True, help="folder for predictor_fewshot.json / .csv (and the --measure tables)")
    ap.add_argument("--measure", action="store_true", help="time the tables first, one per --spaces (a quiet machine)")
    ap.add_argument("--spaces", default="lra-tiny,vision-tiny", help="--measure: spaces (default lra-tiny,vision-tiny)")
    ap.add_argument("--models", default=",".join(MODELS), help=f"models to score (default all: {','.join(MODELS)})")
    ap.add_argument("--train", type=int, default=20, help="timed subnets each fit sees (default 20)")
    ap.add_argument("--test", type=int, default=40, help="held-out subnets each fit is scored on (default 40)")
    ap.add_argument("--draws", type=int, help="seeded draws per table (default 10; --quick 2)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 2 draws (--measure: 30 subnets a space)")
    args = ap.parse_args(argv)
    kinds = [k.strip() for k in args.models.split(",") if k.strip()]
    problems = [f"--models: {k!r} is not one of {', '.join(MODELS)}" for k in kinds if k not in MODELS]
    problems += [f"--{name}: {v}; expected a whole number >= {low}" for name, v, low in
                 (("train", args.train, 5), ("test", args.test, 1), ("draws", args.draws or 1, 1)) if v < low]
    if not args.tables and not args.measure:
        problems.append("give timing tables, or --measure to time them")
    if problems:
        print(f"bench_predictor_fewshot: {problems[0]}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    tables, loads = [Path(p) for p in args.tables], []
    if args.measure:
        measured, loads = measure_tables(out, [s.strip() for s in args.spaces.split(",") if s.strip()],
                                         30 if args.quick else 60)
        tables += measured
    draws = args.draws or (2 if args.quick else 10)
    try:
        results = [score_table(p, kinds, args.train, args.test, draws) for p in tables]
    except UserError as e:
        print(f"bench_predictor_fewshot: {e}", file=sys.stderr)
        return 2
    for line in report(results):
        print(line)
    doc = {"command": " ".join(["python", "scripts/bench_predictor_fewshot.py", *(argv if argv is not None else sys.argv[1:])]),
           "target_ratio": TARGET_RATIO, "loads": loads, "load_end": os.getloadavg()[0], "cores": os.cpu_count(),
           "wall_s": time.time() - started, "results": results}
    (out / "predictor_fewshot.json").write_text(json.dumps(doc, indent=1) + "\n")
    with open(out / "predictor_fewshot.csv", "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["table", "space", "model", "mape", "mape_sd", "within_10", "kendall_tau", "vs_ceiling",
                         "ceiling_mape"])
        for r in results:
            for k, m in r["models"].items():
                writer.writerow([r["table"], r["space"], k, m["mape"], m["mape_sd"], m["within_10"], m["kendall_tau"],
                                 m.get("vs_ceiling"), None if r["ceiling"] is None else r["ceiling"]["mape"]])
    print(f"wrote {out / 'predictor_fewshot.json'} and {out / 'predictor_fewshot.csv'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
