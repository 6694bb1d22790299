"""Token keeping measured (issue 57): the image search with and without per-layer token shares at the same budgets.

    python scripts/bench_tokens.py --out runs/bench-tokens --threads 2    # vision-tiny, Fashion-MNIST (hours: two arms)
    python scripts/bench_tokens.py --out runs/t-quick --quick --space S.yaml --data FOLDER   # the test's

Two arms of the same space, each run by :mod:`bench_vision`'s stages (resumable: run the same command again):
``without`` (the space with no ``keep``: every layer runs every token) and ``with`` (``keep: --keep``, default
1.0, 0.7, 0.5: each layer's share of tokens a searched width, :mod:`tasks.image_classification.tokens`).  Per arm:
the supernet (``nas train-supernet``), an ONNX Runtime campaign and its predictor (``nas measure-latency``,
``nas fit-predictor``), and ``nas search`` under the **same budgets**: the 25th, 50th and 75th percentiles of the
``without`` arm's measured latencies, each raised where needed to the largest of the two predictors' latency of
their lightest subnets (both searches must be able to meet it).  Each found model is retrained from scratch
(``--epochs``, ``--seeds``) and scored on the test images; all of them are then timed side by side on ONNX Runtime
(one image, one thread, the thread's CPU time, interleaved rounds).

``<out>/tokens.json``: ``budgets: [{budget_ms, with: {test_accuracy, measured_ms, subnet}, without: {...}}]`` (the
contract), ``speedup_at_equal_accuracy`` (per ``with`` model, the measured latency of the fastest ``without`` model at
least as accurate over its own: the issue's target is >= 1.3x at one budget), each arm's predictor report, the command,
machine and wall time.  ``--out docs/benchmarks/tokens`` records it where the benchmark pages are.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_vision as bv  # noqa: E402

log = logging.getLogger("bench_tokens")
ARMS = ("without", "with")


def arm_space(space, keeps: tuple[float, ...] | None, path: Path) -> Path:
    """``space`` written to ``path`` with the token shares ``keeps`` (None: without token keeping), the same otherwise."""
    import yaml

    data = space.to_dict()
    data.pop("keep", None)
    if keeps is not None:
        data["keep"] = list(keeps)
    data["name"] = f"{space.name}-{'keep' if keeps is not None else 'plain'}"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(data, sort_keys=False)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path


def shared_budgets(measured_ms: np.ndarray, floor_ms: float) -> list[float]:
    """The percentiles of ``measured_ms``, each at least ``floor_ms`` and 10% over the one before (floored budgets
    could otherwise meet, and ``nas search`` refuses a repeated budget), to the 0.1 microsecond its labels print."""
    out: list[float] = []
    for q in bv.PERCENTILES:
        out.append(round(max(float(np.percentile(measured_ms, q)), floor_ms, 1.1 * out[-1] if out else 0.0), 4))
    return out


def stage_budgets(root: Path, table: Path, spaces: dict, preds: dict) -> list[float]:
    """The shared budgets: the percentiles of the ``without`` arm's measured latencies, each at least the largest of
    the arms' predicted latency of their lightest subnets (so that both searches can meet every budget) and at least
    10% over the budget before it (flooring could make two budgets one; ``nas search`` refuses a repeated budget);
    read back once written."""
    from latency.predictors.predictor import load_predictor
    from latency.table import read_timings

    done = bv.load_json(root / "budgets.json")
    if done is None:
        ms = np.array([r.median_ms for r in read_timings(table).rows])
        floor = max(float(load_predictor(preds[arm]).predict(spaces[arm].lightest()).min()) for arm in ARMS)
        done = shared_budgets(ms, floor)
        bv.save_json(root / "budgets.json", done)
    return done


def stage_search(root: Path, ckpt: Path, pred: Path, budgets: list[float], plan: bv.Plan) -> list[dict]:
    """``nas search`` of one arm under every budget; the best subnet per budget."""
    done = bv.load_json(root / "found.json")
    if done is not None:
        return done
    labels = [f"{b:.4f}ms" for b in budgets]
    out = root / "search"
    bv.nas(["search", str(ckpt), "--predictor", str(pred), "--out", str(out), "--budget", ",".join(labels), *plan.search,
            "--no-progress", "-q"])
    summary = json.loads((out / "search.json").read_text())
    entries = sorted(summary["budgets"].values(), key=lambda e: e["budgets_ms"]["image"])
    found = [{"budget_ms": b, "subnet": e["best"]["subnet"], "predicted_ms": e["best"]["latency_ms"],
              "val_error_inherited": e["best"]["loss_bpb"]} for b, e in zip(budgets, entries)]
    bv.save_json(root / "found.json", found)
    return found


def speedups(pairs: list[dict]) -> list[dict]:
    """Per ``with`` model: the fastest ``without`` model at least as accurate, its measured latency over this one's."""
    out = []
    for p in pairs:
        w = p["with"]
        reach = [q["without"] for q in pairs if q["without"]["test_accuracy"] >= w["test_accuracy"]]
        if reach:
            fastest = min(reach, key=lambda m: m["measured_ms"])
            out.append({"budget_ms": p["budget_ms"], "ratio": fastest["measured_ms"] / w["measured_ms"], "bound": "measured"})
        else:  # no model without token keeping reaches it: the slowest one's latency bounds the ratio from below
            slowest = max((q["without"] for q in pairs), key=lambda m: m["measured_ms"])
            out.append({"budget_ms": p["budget_ms"], "ratio": slowest["measured_ms"] / w["measured_ms"], "bound": "lower"})
    return out


def write_figures(root: Path, record: dict) -> None:
    """``tokens.png`` (each arm's found models: test accuracy against measured latency, the budgets dashed) and
    ``curves.csv`` / ``curves.png`` (the training loss of both supernets and every retrained model)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from curves import plot_curves, read_log, write_curves

    curves = {}
    for arm in ARMS:
        curves[f"{arm} supernet"] = read_log(root / arm / "supernet" / "log.jsonl")
        for log_path in sorted((root / arm / "models").glob("**/log.jsonl")):
            curves[f"{arm} {'/'.join(log_path.relative_to(root / arm / 'models').parts[:2])}"] = read_log(log_path)
    write_curves(curves, root / "curves.csv")
    plot_curves(curves, root / "curves.png", "tokens benchmark: training loss of both supernets and every retrained model")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for arm, color in (("without", "tab:blue"), ("with", "tab:orange")):
        models = [b[arm] for b in record["budgets"]]
        ax.errorbar([m["measured_ms"] for m in models], [100 * m["test_accuracy"] for m in models],
                    yerr=[100 * m["test_accuracy_sd"] for m in models], fmt="o", color=color, capsize=3,
                    label=f"{arm} token keeping (found, {record['seeds']} seed(s))")
    for b in record["budgets"]:
        ax.axvline(b["budget_ms"], color="gray", ls="--", lw=0.8)
    ax.set_xlabel("measured ms per image (ONNX Runtime, 1 thread, CPU clock); dashed: the budgets")
    ax.set_ylabel("test accuracy (%)")
    kept = sum(any(k < 1.0 for k in b["with"]["subnet"].get("keep", [])) for b in record["budgets"])
    ax.set_title(f"{record['space']}: search with and without token keeping at the same budgets\n"
                 f"(the 'with' winners that drop tokens: {kept} of {len(record['budgets'])})", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(root / "tokens.png", dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="run directory (resumable: run again to continue); tokens.json lands here")
    p.add_argument("--space", default="vision-tiny", help="an image-classification space, name or YAML (default vision-tiny)")
    p.add_argument("--keep", default="1.0,0.7,0.5", help="the token shares of the `with` arm (default 1.0,0.7,0.5)")
    p.add_argument("--data", help="train-supernet --data (default: Fashion-MNIST as Debian installs it)")
    p.add_argument("--quick", action="store_true", help="the whole path in minutes (tiny budgets; for the test)")
    p.add_argument("--train-time", help="supernet training time per arm (default 40m; quick 8s)")
    p.add_argument("--epochs", type=float, help="retraining epochs per model (default 2; quick 1)")
    p.add_argument("--seeds", type=int, default=1, help="retraining seeds per model (default 1)")
    p.add_argument("--threads", type=int, help="torch threads for training (default: torch's choice)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from search_spaces import UserError, load_space

    plan = bv.QUICK if args.quick else bv.FULL
    if args.train_time:
        plan = replace(plan, train_time=args.train_time)
    if args.epochs:
        plan = replace(plan, epochs=args.epochs)
    root = Path(args.out)
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    try:
        keeps = tuple(float(v) for v in args.keep.split(","))
    except ValueError:
        print(f"bench_tokens: error: --keep: {args.keep!r} is not a comma-separated list of shares", file=sys.stderr)
        return 2
    try:
        base = load_space(args.space)
        if base.task != "image-classification":
            raise UserError(f"--space: {base.source} is task {base.task}; this benchmark needs an image-classification space")
        spaces, found, preds, ckpts, tables = {}, {}, {}, {}, {}
        for arm in ARMS:  # both supernets and predictors first: the budgets must suit both searches
            path = arm_space(base, keeps if arm == "with" else None, root / arm / "space.yaml")
            spaces[arm] = load_space(str(path))
            ckpts[arm] = bv.stage_supernet(root / arm, str(path.resolve()), args.data, plan, args.threads, args.seed)
            tables[arm], preds[arm] = bv.stage_latency(root / arm, str(path.resolve()), plan)
        budgets = stage_budgets(root, tables["without"], spaces, preds)
        for arm in ARMS:
            found[arm] = stage_search(root / arm, ckpts[arm], preds[arm], budgets, plan)
            models = [{**f, "name": f"{arm}-{i}", "role": "found"} for i, f in enumerate(found[arm])]
            bv.stage_retrain(root / arm, spaces[arm], models, args.data, plan, args.seeds, args.threads)
            found[arm] = models
        everything = found["without"] + found["with"]  # timed side by side (a plain subnet is one of the with space's)
        log.info("timing %d models side by side", len(everything))
        bv.stage_measure(root, spaces["with"], everything, plan)
    except UserError as e:
        print(f"bench_tokens: error: {e}", file=sys.stderr)
        return 2
    pairs = []
    for b, w, o in zip(budgets, found["with"], found["without"]):
        pairs.append({"budget_ms": b, **{arm: {"test_accuracy": bv.mean(m["test_accuracy"]), "test_accuracy_sd": bv.sd(
            m["test_accuracy"]), "measured_ms": m["measured_ms"], "predicted_ms": m["predicted_ms"], "subnet": m["subnet"]}
            for arm, m in (("with", w), ("without", o))}})
    record = {"command": "python scripts/bench_tokens.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "machine": bv.machine(), "space": base.name, "keep": list(keeps), "seeds": args.seeds,
              "plan": dict(plan.__dict__), "budgets": pairs, "speedup_at_equal_accuracy": speedups(pairs),
              "predictor": {arm: bv.predictor_report(preds[arm]) for arm in ARMS},
              "wall_s_this_run": round(time.perf_counter() - t0, 1)}
    bv.save_json(root / "tokens.json", record)
    write_figures(root, record)
    for r in pairs:
        w, o = r["with"], r["without"]
        print(f"budget {r['budget_ms']:.3f} ms: with token keeping {100 * w['test_accuracy']:.2f}% at {w['measured_ms']:.3f} ms, "
              f"without {100 * o['test_accuracy']:.2f}% at {o['measured_ms']:.3f} ms")
    for s in record["speedup_at_equal_accuracy"]:
        print(f"budget {s['budget_ms']:.3f} ms: {s['ratio']:.2f}x faster than the model without token keeping of equal "
              f"accuracy ({s['bound']}; target 1.3x at one budget)")
    print(f"wrote {root / 'tokens.json'} ({record['wall_s_this_run']:.0f} s in this run)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
