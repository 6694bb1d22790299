"""The image-classification targets of issue 40, measured: found ViTs against uniform baselines on Fashion-MNIST.

    python scripts/bench_vision.py --out runs/bench-vision --threads 2   # vision-tiny, Fashion-MNIST, ~3 h on 2 cores
    python scripts/bench_vision.py --out runs/v-quick --quick --space S.yaml --data FOLDER   # the test's (a minute)

Stages, each resumable (run the same command again: a finished stage is read back, a retrained model whose card
exists is kept):

1. ``supernet``: ``nas train-supernet`` (sandwich rule, distillation from the largest, ``--balance`` the
   type-balanced rule) for ``--train-time``;
2. ``latency``: an ONNX Runtime campaign (one thread; 20% re-measured) and ``nas fit-predictor``; the predictor's
   held-out share within +-10% beside the test-retest ceiling;
3. ``budgets``: the 25th, 50th and 75th percentiles of the measured latencies; ``search``: ``nas search`` under each
   (fitness: top-1 error on validation images with inherited weights);
4. ``baselines``: per attention type, the uniform ViT (every layer the same heads, FFN and type) with the most
   parameters that the predictor puts under each budget, plus for softmax (the plain ViT) a ladder of the uniform
   softmax ViTs at every quarter of their predicted latencies up to the slowest (each rung the one predicted closest
   under its target);
5. ``retrain``: every model (found and baselines) trained from scratch for the same ``--epochs`` of the training
   images, ``--seeds`` seeds each, then scored on the 10,000 test images;
6. ``measure``: every model timed side by side on ONNX Runtime (one image, batch 1, one thread, the thread's CPU time
   as the campaign; interleaved rounds, the median);
7. ``report``: ``vision.json`` (the contract: ``best_test_accuracy``, ``budgets``, ``speedup_vs_softmax``,
   ``predictor``, with the command, the machine and its load), ``models.csv``, ``vision.png`` (accuracy vs latency).

The full plan's time, estimated roughly from a timed step on a loaded 2-core machine (load 6; divided by 3): 40 min of
supernet training, ~10 min of campaign (200 subnets on ONNX Runtime), ~10 min of search, then ~15-20 models retrained
for 2 epochs each at 1-8 min per epoch (a 7 x 7-patch ViT of width 96 about 2 min, a 4 x 4-patch one 5 min, the
largest with the conv stem 15 min): about 3 hours in all.  ``--epochs`` and ``--seeds`` trade time for the accuracy
and its spread.

A budget's verdict: PASS when the found model (retrained) is at least as accurate as every uniform baseline measured
at or below its latency; TIE when it is behind one of them only within 2 seed standard deviations of the pair (with
one seed: never); FAIL when behind one beyond that.  ``unstable_seeds`` marks a found model whose seeds differ by
more than 5 points (SD): its tie is the noise of a failed training, not a result. Speedup: the measured latency of
the fastest softmax ViT of the ladder at least as accurate as the found model over the found model's (``bound``
``measured``), or, when no softmax rung reaches its accuracy, the slowest rung's over the found model's (``bound``
``lower``: the softmax ViT would need more).
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

log = logging.getLogger("bench_vision")

PERCENTILES = (25, 50, 75)
PREDICTOR_TARGET = 0.95
UNSTABLE_SD = 0.05  # a model whose seeds' test accuracies differ by more (SD, a fraction): a failed training, not noise


@dataclass(frozen=True)
class Plan:
    train_time: str = "40m"  # supernet
    samples: int = 200  # latency campaign
    timing: tuple[str, ...] = ("--timing-warmup", "10", "--repeats", "30", "--rounds", "5")
    search: tuple[str, ...] = ("--population", "40", "--parents", "10", "--mutations", "15", "--crossovers", "15",
                               "--generations", "12", "--val-windows", "20", "--eval-batch-size", "100")  # fmt: skip
    epochs: float = 2.0  # retraining, per model
    batch_size: int = 128
    lr: float = 2e-3
    ladder: int = 4  # softmax rungs
    measure_rounds: int = 5
    measure_calls: int = 50


FULL = Plan()
QUICK = Plan(train_time="8s", samples=12,
             timing=("--timing-warmup", "1", "--repeats", "2", "--rounds", "1", "--min-sample-ms", "1"),
             search=("--population", "4", "--parents", "2", "--mutations", "2", "--crossovers", "1", "--generations", "1",
                     "--val-windows", "2", "--eval-batch-size", "16"),
             epochs=1.0, batch_size=16, lr=3e-3, ladder=2, measure_rounds=1, measure_calls=3)  # fmt: skip


def nas(argv: list[str]) -> None:
    from nas.cli import main

    log.info("$ nas %s", " ".join(argv))
    rc = main(argv)
    if rc != 0:
        raise SystemExit(f"bench_vision: `nas {' '.join(argv)}` failed (exit {rc})")


def load_json(path: Path):
    return json.loads(path.read_text()) if path.exists() else None


def save_json(path: Path, data) -> None:
    from supernet.files import atomic_write  # (a new temporary file of a unique name: never a planted one)

    atomic_write(path, json.dumps(data, indent=1) + "\n")


# --------------------------------------------------------------------------- stages


def stage_supernet(root: Path, space_arg: str, data: str | None, plan: Plan, threads: int | None, seed: int) -> Path:
    run = root / "supernet"
    if (run / "final.pt").exists():
        return run / "final.pt"
    common = ["--max-time", plan.train_time, "--seed", str(seed), "-q"] + (["--threads", str(threads)] if threads else [])
    if (run / "latest.pt").exists():
        nas(["train-supernet", "--out", str(run), "--resume", *common])
    else:
        nas(["train-supernet", space_arg, "--out", str(run), "--balance", "types", *(["--data", data] if data else []),
             "--batch-size", str(plan.batch_size), *common])
    return run / "final.pt"


def stage_latency(root: Path, space_arg: str, plan: Plan) -> tuple[Path, Path]:
    table, pred = root / "ort.csv", root / "predictor"
    if not table.exists():
        nas(["measure-latency", space_arg, "--device", "onnxruntime", "--timing-threads", "1", "--clock", "cpu",
             "--out", str(table),
             "--samples", str(plan.samples), "--retest", "0.2", *plan.timing, "-q"])
    if not (pred / "predictor.json").exists():
        nas(["fit-predictor", str(table), "--out", str(pred), "-q"])
    return table, pred


def predictor_report(pred: Path) -> dict:
    from latency.predictors.predictor import load_predictor

    m = load_predictor(pred).metrics
    held, ceiling = m.get("held_out") or {}, m.get("test_retest") or {}
    return {"model": m.get("chosen"), "within_10pct": held.get("within_10"), "n": held.get("n"),
            "ceiling_within_10pct": ceiling.get("within_10"), "ceiling_n": ceiling.get("n"),
            "target": PREDICTOR_TARGET, "pass": (held.get("within_10") or 0) >= PREDICTOR_TARGET}  # fmt: skip


def stage_search(root: Path, ckpt: Path, table: Path, pred: Path, plan: Plan) -> list[dict]:
    from latency.table import read_timings

    done = load_json(root / "budgets.json")
    if done is not None:
        return done
    ms = np.array([r.median_ms for r in read_timings(table).rows])
    budgets = [float(np.percentile(ms, q)) for q in PERCENTILES]
    labels = [f"{b:.4f}ms" for b in budgets]
    out = root / "search"
    nas(["search", str(ckpt), "--predictor", str(pred), "--out", str(out), "--budget", ",".join(labels), *plan.search,
         "--no-progress", "-q"])
    summary = json.loads((out / "search.json").read_text())
    found = []
    entries = sorted(summary["budgets"].values(), key=lambda e: e["budgets_ms"]["image"])
    for q, label, entry in zip(PERCENTILES, labels, entries):
        found.append({"percentile": q, "label": label, "budget_ms": entry["budgets_ms"]["image"],
                      "subnet": entry["best"]["subnet"], "predicted_ms": entry["best"]["latency_ms"],
                      "val_error_inherited": entry["best"]["loss_bpb"]})  # fmt: skip
    save_json(root / "budgets.json", found)
    return found


def stage_baselines(root: Path, space, pred: Path, budgets: list[dict], plan: Plan) -> list[dict]:
    """Per type and budget the uniform subnet with the most parameters under the budget (predicted); the softmax ladder."""
    from latency.predictors.predictor import load_predictor
    from search_spaces import tasks

    done = load_json(root / "baselines.json")
    if done is not None:
        return done
    predictor, task = load_predictor(pred), tasks.of(space)
    uniform = space.uniform()
    ms = predictor.predict(uniform)
    params = np.array([task.params(space, s) for s in uniform])
    out: dict[str, dict] = {}
    for t in space.attention:
        mine = [i for i, s in enumerate(uniform) if s.attention[0] == t]
        for b in budgets:
            under = [i for i in mine if ms[i] <= b["budget_ms"]]
            if under:
                i = max(under, key=lambda j: (params[j], -ms[j]))
                out.setdefault(uniform[i].key, {"name": f"uniform-{t}", "type": t, "subnet": uniform[i].to_dict(),
                                                "predicted_ms": float(ms[i]), "role": "baseline"})
    soft = [i for i, s in enumerate(uniform) if s.attention[0] == space.attention[0]]
    targets = np.quantile(ms[soft], np.linspace(1 / plan.ladder, 1.0, plan.ladder))
    for target in targets:  # the rung closest under each target (by parameters, a 7 x 7-patch ViT would top the ladder
        under = [i for i in soft if ms[i] <= target * 1.0001]  # at a third of the slowest one's latency)
        i = max(under, key=lambda j: (ms[j], params[j]))
        entry = out.setdefault(uniform[i].key, {"name": f"uniform-{space.attention[0]}", "type": space.attention[0],
                                                "subnet": uniform[i].to_dict(), "predicted_ms": float(ms[i]), "role": "ladder"})
        entry["ladder"] = True
    result = list(out.values())
    save_json(root / "baselines.json", result)
    return result


def stage_retrain(root: Path, space, models: list[dict], data: str | None, plan: Plan, seeds: int, threads: int | None) -> None:
    """Each model from scratch for ``plan.epochs`` of the training images, each seed; test accuracy from its card."""
    import torch

    from search_spaces import tasks
    from supernet.train import TrainConfig
    from tasks.image_classification.workflows import train_vision_subnet

    if threads:
        torch.set_num_threads(threads)
    task = tasks.of(space)
    settings = {"data": data, "data_seed": 0, "val_fraction": task.data_defaults["val_fraction"]}
    n_train = len(task.prepare_data(settings, root).train)
    steps = max(1, int(round(plan.epochs * n_train / plan.batch_size)))
    for m in models:
        subnet = space.subnet_type.from_dict(m["subnet"])
        m["test_accuracy"], m["val_accuracy"] = [], []
        for seed in range(seeds):
            out = root / "models" / f"{subnet.key}-s{seed}"
            card = out / "model_card.json"
            if not card.exists():
                import shutil

                shutil.rmtree(out, ignore_errors=True)  # an interrupted retraining starts again
                log.info("retrain %s %s (seed %d, %d steps)", m["name"], subnet, seed, steps)
                config = TrainConfig.from_dict({"batch_size": plan.batch_size, "lr": plan.lr, "max_steps": steps, "seed": seed,
                                                "warmup_steps": max(1, steps // 20), "eval_interval": max(steps, 1),
                                                "eval_batches": 4, "ckpt_interval": max(1, steps // 4), "log_interval": 50})
                train_vision_subnet(space, subnet, out, config, settings, formats=())
            c = json.loads(card.read_text())
            m["test_accuracy"].append((c.get("test") or {}).get("accuracy"))
            m["val_accuracy"].append(c["validation"]["accuracy"])
        m["steps"], m["epochs"] = steps, plan.epochs


def stage_measure(root: Path, space, models: list[dict], plan: Plan) -> None:
    """Every model on ONNX Runtime, one image, one thread: interleaved rounds of ``measure_calls`` calls, the median."""
    from search_spaces import tasks

    done = load_json(root / "measured.json") or {}
    task = tasks.of(space)
    workload = space.workload()
    todo = [m for m in models if space.subnet_type.from_dict(m["subnet"]).key not in done]
    if todo:
        runners = {}
        for m in todo:
            s = space.subnet_type.from_dict(m["subnet"])
            runners[s.key] = task.ort_runner(task.timing_model(space, s), workload, 1, "cpu", "cpu", "fp32")  # CPU clock
            runners[s.key](plan.measure_calls)  # warm-up
        times: dict[str, list[float]] = {k: [] for k in runners}
        for _ in range(plan.measure_rounds):
            for k, run in runners.items():
                times[k].append(run(plan.measure_calls) / plan.measure_calls * 1000)
        done.update({k: float(np.median(v)) for k, v in times.items()})
        save_json(root / "measured.json", done)
    for m in models:
        m["measured_ms"] = done[space.subnet_type.from_dict(m["subnet"]).key]


# --------------------------------------------------------------------------- report


def mean(xs) -> float:
    xs = [x for x in xs if x is not None]
    return float(np.mean(xs)) if xs else float("nan")


def sd(xs) -> float:
    xs = [x for x in xs if x is not None]
    return float(np.std(xs, ddof=1)) if len(xs) > 1 else 0.0


def verdicts(found: list[dict], baselines: list[dict], soft_type: str) -> tuple[list[dict], list[dict]]:
    out, speed = [], []
    for f in found:
        fa, fs = mean(f["test_accuracy"]), sd(f["test_accuracy"])
        below = [b for b in baselines if b["measured_ms"] <= f["measured_ms"]]
        best = max(below, key=lambda b: mean(b["test_accuracy"]), default=None)
        noise = {id(b): 2 * max(fs, sd(b["test_accuracy"])) for b in below}  # 2 seed SD of the pair (0: exact)
        worse = [b for b in below if fa < mean(b["test_accuracy"]) - noise[id(b)]]
        ties = [b for b in below if abs(fa - mean(b["test_accuracy"])) <= noise[id(b)] and fa < mean(b["test_accuracy"])]
        # PASS: as accurate as every baseline at or below its latency; TIE: behind one only inside 2 seed SD (noise,
        # not a win); FAIL: behind one beyond it
        verdict = "FAIL" if worse else "TIE" if ties else "PASS"
        out.append({"budget_ms": f["budget_ms"], "verdict": verdict if below else "NO BASELINE BELOW",
                    "noise_2sd": max(noise.values(), default=0.0), "unstable_seeds": fs > UNSTABLE_SD,
                    "found": {"subnet": f["subnet"], "test_accuracy": fa, "test_accuracy_sd": fs,
                              "measured_ms": f["measured_ms"]},
                    "best_uniform": None if best is None else {"subnet": best["subnet"], "name": best["name"],
                                                                "test_accuracy": mean(best["test_accuracy"]),
                                                                "measured_ms": best["measured_ms"]}})  # fmt: skip
        ladder = sorted((b for b in baselines if b.get("ladder") and b["type"] == soft_type), key=lambda b: b["measured_ms"])
        reach = [b for b in ladder if mean(b["test_accuracy"]) >= fa]
        if reach:
            speed.append({"budget_ms": f["budget_ms"], "ratio": reach[0]["measured_ms"] / f["measured_ms"], "bound": "measured"})
        elif ladder:
            speed.append({"budget_ms": f["budget_ms"], "ratio": ladder[-1]["measured_ms"] / f["measured_ms"], "bound": "lower"})
    return out, speed


def elapsed(root: Path, this_run: float) -> dict:
    """The whole benchmark's wall time over its resumed runs: from its first run's start (the supernet's first logged
    event, or this run's start ``this_run``, a ``time.time()``, if earlier) to now."""
    log_file = root / "supernet" / "log.jsonl"
    try:
        started = min(json.loads(log_file.read_text().splitlines()[0])["time"], this_run)
    except (OSError, IndexError, KeyError, ValueError):
        return {"wall_s": None}
    return {"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started)), "wall_s": round(time.time() - started, 1)}


def machine() -> dict:
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {"host": platform.node(), "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "python": platform.python_version(), "load_avg": load}


def plot(models: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    seeds = max(len(m["test_accuracy"]) for m in models)
    for kind, marker in (("found", "*"), ("baseline", "o"), ("ladder", "s")):
        pts = [m for m in models if m["role"] == kind]
        if pts:
            ax.errorbar([m["measured_ms"] for m in pts], [100 * mean(m["test_accuracy"]) for m in pts],
                        yerr=[100 * sd(m["test_accuracy"]) for m in pts], fmt=marker, markersize=12 if kind == "found" else 5,
                        capsize=2, label={"found": "found (searched)", "baseline": "uniform baseline per type",
                                          "ladder": "uniform softmax ladder"}[kind])  # fmt: skip
            for m in pts:
                ax.annotate(m["name"].replace("uniform-", ""), (m["measured_ms"], 100 * mean(m["test_accuracy"])), fontsize=7)
    ax.set_xlabel("measured latency (ms, ONNX Runtime, batch 1, 1 thread)")
    ax.set_ylabel(f"test accuracy (%), 10,000 test images; mean of {seeds} seed{'s' * (seeds > 1)} +- SD")
    ax.set_title("Fashion-MNIST: every model retrained from scratch on the same epochs", fontsize=10)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="run directory (resumable: run again to continue)")
    p.add_argument("--space", default="vision-tiny", help="an image-classification space, name or YAML (default vision-tiny)")
    p.add_argument("--data", help="train-supernet --data (default: Fashion-MNIST as Debian installs it)")
    p.add_argument("--quick", action="store_true", help="the whole path in about a minute (tiny budgets; for the test)")
    p.add_argument("--train-time", help="supernet training time (default 40m; quick 8s)")
    p.add_argument("--epochs", type=float, help="retraining epochs per model (default 2; quick 1)")
    p.add_argument("--seeds", type=int, default=1, help="retraining seeds per model (default 1; 2+ gives the SD)")
    p.add_argument("--threads", type=int, help="torch threads for training (default: torch's choice)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from dataclasses import replace

    from search_spaces import UserError, load_space

    plan = QUICK if args.quick else FULL
    if args.train_time:
        plan = replace(plan, train_time=args.train_time)
    if args.epochs:
        plan = replace(plan, epochs=args.epochs)
    root = Path(args.out)
    root.mkdir(parents=True, exist_ok=True)
    t0, started = time.perf_counter(), time.time()
    try:
        space = load_space(args.space)
        if space.task != "image-classification":
            raise UserError(f"--space: {space.source} is task {space.task}; this benchmark needs an image-classification space")
        space_arg = str(Path(space.source).resolve())
        ckpt = stage_supernet(root, space_arg, args.data, plan, args.threads, args.seed)
        table, pred = stage_latency(root, space_arg, plan)
        budgets = stage_search(root, ckpt, table, pred, plan)
        baselines = stage_baselines(root, space, pred, budgets, plan)
        found = [{**b, "name": f"found-p{b['percentile']}", "role": "found", "type": "mixed"} for b in budgets]
        models = found + baselines
        stage_retrain(root, space, models, args.data, plan, args.seeds, args.threads)
        stage_measure(root, space, models, plan)
    except UserError as e:
        print(f"bench_vision: error: {e}", file=sys.stderr)
        return 2
    budget_rows, speed = verdicts(found, baselines, space.attention[0])
    record = {
        "command": "python scripts/bench_vision.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": machine(), "space": space.name, "space_hash": space.hash, "plan": {k: v for k, v in plan.__dict__.items()},
        "seeds": args.seeds,
        "best_test_accuracy": max(mean(m["test_accuracy"]) for m in models),
        "budgets": budget_rows, "speedup_vs_softmax": speed, "predictor": predictor_report(pred),
        "models": [{k: v for k, v in m.items()} for m in models], "wall_s_this_run": round(time.perf_counter() - t0, 1),
        **elapsed(root, started),
    }  # fmt: skip
    save_json(root / "vision.json", record)
    with open(root / "models.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["name", "role", "test_accuracy", "test_accuracy_sd", "measured_ms", "predicted_ms", "subnet"])
        for m in models:
            subnet = space.subnet_type.from_dict(m["subnet"])
            w.writerow([m["name"], m["role"], f"{mean(m['test_accuracy']):.4f}", f"{sd(m['test_accuracy']):.4f}",
                        f"{m['measured_ms']:.4f}", f"{m['predicted_ms']:.4f}", str(subnet)])
    plot(models, root / "vision.png")
    for r in budget_rows:
        f, b = r["found"], r["best_uniform"]
        print(f"budget {r['budget_ms']:.3f} ms: found {100 * f['test_accuracy']:.2f}% at {f['measured_ms']:.3f} ms"
              + (f"; best uniform below it {b['name']} {100 * b['test_accuracy']:.2f}% at {b['measured_ms']:.3f} ms" if b else "")
              + f": {r['verdict']}")
    for s in speed:
        print(f"budget {s['budget_ms']:.3f} ms: {s['ratio']:.2f}x faster than the softmax ViT of equal accuracy ({s['bound']})")
    pr = record["predictor"]
    print(f"predictor ({pr['model']}): {pr['within_10pct']} of held-out subnets within +-10% (ceiling "
          f"{pr['ceiling_within_10pct']}); best test accuracy {100 * record['best_test_accuracy']:.2f}%")
    took = f"{record['wall_s']:.0f} s from the supernet's first step, " if record["wall_s"] is not None else ""
    print(f"wrote {root / 'vision.json'}, {root / 'models.csv'}, {root / 'vision.png'}; the benchmark took {took}"
          f"{record['wall_s_this_run']:.0f} s in this run")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
