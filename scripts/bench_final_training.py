"""Which final-training recipe turns a found subnet into the best model at equal CPU time (issue 51)?

    python scripts/bench_final_training.py --out runs/final             # tiny, vision-tiny, translate-tiny (~4.5 h)
    python scripts/bench_final_training.py --out runs/final --supernet lm=runs/claim/supernet/final.pt   # reuse one
    python scripts/bench_final_training.py --out runs/ftq --quick --space lm=S.yaml --data lm=DOCS ...   # the test's

For each task (``lm``: a causal LM, ``image``: image classification, ``translation``: an encoder-decoder), two subnets
(one uniform: the softmax subnet of median size; one mixed: the drawn subnet of two or more attention types closest
to it in parameters; or ``--subnets TASK=A.yaml,B.yaml``) are each turned into a model by every recipe of
:data:`supernet.runs.RECIPES`, at ``--seeds`` seeds:

* ``scratch``: weights drawn from the seed;
* ``inherit``: the subnet's slice of the task's supernet, fine-tuned;
* ``distill``: the slice, fine-tuned with the supernet's largest subnet as a teacher (weight 0.5).

Equal CPU time: every model trains for the same ``--train-seconds`` of **the training thread's CPU time**
(``TrainConfig.clock="cpu"``, one torch thread: on a busy machine a model gets the same compute, not the same wall
clock; the schedule, warm-up then cosine, follows that clock), with the same batch, learning rate and data (the
supernet's own split).  Distillation runs the teacher too, so it trains fewer steps in that time: that is its cost.
The supernet's own training is not charged to the recipes that use it (it exists for the search anyway).

Each model is scored on data no training saw: ``lm``, bits per byte on fixed windows of the corpus's test split;
``image``, top-1 accuracy on the test images; ``translation``, cross-entropy per target byte (nats) over the whole test
split.  Per task and recipe: the mean, the standard deviation and the number of models (subnets x seeds); the seed
noise is the standard deviation over the seeds of each (subnet, recipe), pooled.  **Chosen**: the cheapest recipe
(scratch < inherit < distill) whose mean is within 2 pooled seed SD of the best mean; so a costlier recipe is chosen
only when it wins beyond the noise.

Every stage resumes (run the same command again): a supernet from its checkpoint, a model whose card exists is kept
(one interrupted in training is trained again from its start: a time-bound run), a score from its ``score.json``.

Writes ``OUT/final.json`` (the contract: ``tasks: {TASK: {recipes: {NAME: {mean, sd, n}}, chosen, metric}}`` with
the plan, the subnets, the noise and the command, machine and load), ``final.csv`` (one row per model), ``final.png``
(each task's recipes, mean +- SD), ``curves.csv`` and ``curves.png`` (each model's training loss per logged step).

Cost of the default plan on 2 idle cores, estimated: three supernets of 15 minutes, then 3 tasks x 2 subnets x 2 seeds
x 3 recipes = 36 models of 300 CPU seconds each at one thread (two at a time would halve it on 2 cores; this script
trains one at a time so that the CPU clock is not shared): about 3 hours of training, minutes of scoring.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import math
import os
import platform
import shutil
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from curves import plot_curves, read_log, write_curves  # noqa: E402

log = logging.getLogger("bench_final_training")

TASKS = ("lm", "image", "translation")
RECIPE_ORDER = ("scratch", "inherit", "distill")  # by cost: the choice's tie-break takes the cheapest
NOISE_SD = 2.0  # a recipe wins when its mean beats a cheaper one's by more than this many pooled seed SD


@dataclass(frozen=True)
class TaskPlan:
    """One task's part of the plan: its space, the supernet's training, every model's training and its scoring."""

    space: str
    supernet_time: str = "15m"  # nas train-supernet --max-time (when no --supernet is given)
    supernet_batch: int = 16
    train_seconds: float = 300.0  # every model: CPU seconds of its training thread
    batch_size: int = 16
    lr: float = 3e-3
    warmup: int = 50
    seq_len: int = 128  # lm: window length of training and scoring
    log_interval: int = 10
    score_windows: int = 256  # lm: fixed windows of the test split
    score_seed: int = 1234


FULL = {"lm": TaskPlan("tiny"),
        "image": TaskPlan("vision-tiny", supernet_batch=128, batch_size=128, lr=2e-3),
        "translation": TaskPlan("translate-tiny", supernet_batch=32, batch_size=32)}  # fmt: skip
QUICK = {task: replace(plan, supernet_time="6s", supernet_batch=8, train_seconds=1.0, batch_size=8, warmup=2, seq_len=32,
                       log_interval=1, score_windows=8)
         for task, plan in FULL.items()}  # fmt: skip
METRICS = {"lm": ("bits/byte on fixed windows of the test split", "lower"),
           "image": ("top-1 accuracy on the test images", "higher"),
           "translation": ("cross-entropy per target byte (nats) over the test split", "lower")}  # fmt: skip


# --------------------------------------------------------------------------- the rule (pure)


def pooled_sd(groups: list[list[float]]) -> float:
    """The standard deviation within groups (each a (subnet, recipe)'s seeds), pooled: sqrt of the mean variance of
    the groups of two or more; NaN when there is none."""
    groups = [g for g in groups if len(g) > 1]
    return float(np.sqrt(np.mean([np.var(g, ddof=1) for g in groups]))) if groups else math.nan


def summarize(values: list[float]) -> dict:
    """``{mean, sd, n}`` of one recipe's scores (sd over every model: subnets and seeds; 0 for one)."""
    v = [float(x) for x in values]
    return {"mean": float(np.mean(v)), "sd": float(np.std(v, ddof=1)) if len(v) > 1 else 0.0, "n": len(v)}


def choose(recipes: dict[str, dict], better: str, noise: float) -> tuple[str, str]:
    """(the chosen recipe, why): the cheapest of :data:`RECIPE_ORDER` whose mean is within ``noise`` of the best mean
    (``better``: ``lower`` or ``higher`` is better); with no noise estimate (NaN), the best by mean."""
    names = [r for r in RECIPE_ORDER if r in recipes] + [r for r in recipes if r not in RECIPE_ORDER]
    sign = 1.0 if better == "lower" else -1.0
    best = min(names, key=lambda r: sign * recipes[r]["mean"])
    if not math.isfinite(noise):
        return best, "best by mean (no seed noise to judge by)"
    for r in names:
        gap = sign * (recipes[r]["mean"] - recipes[best]["mean"])
        if gap <= noise:
            if r == best:
                return r, (f"best by mean, beyond the noise of every cheaper recipe ({noise:.4g})"
                           if names.index(r) else "best by mean and the cheapest")
            return r, f"within the noise ({noise:.4g}) of the best, {best}, and cheaper"
    return best, "best by mean"  # (not reached: the best is within any noise of itself)


def pick_subnets(space, params, seed: int, draws: int = 3000) -> dict:
    """``{"uniform": subnet, "mixed": subnet}``: the uniform subnet of the space's first type of median parameters, and
    of ``draws`` subnets drawn as the search draws them (seeded), the one of two or more types closest to it in
    parameters."""
    first = space.attention[0]
    uniform = sorted((s for s in space.uniform() if set(s.attention) == {first}), key=lambda s: (params(s), s.key))
    u = uniform[len(uniform) // 2]
    rng = np.random.default_rng([seed, 51])
    mixed = [s for s in (space.sample(rng) for _ in range(draws)) if len(set(s.attention)) > 1]
    if not mixed:
        raise SystemExit(f"bench_final_training: space {space.name} drew no subnet of two attention types")
    target = params(u)
    m = min(mixed, key=lambda s: (abs(params(s) - target), s.key))
    return {"uniform": u, "mixed": m}


# --------------------------------------------------------------------------- stages


def nas(argv: list[str]) -> None:
    from nas.cli import main

    log.info("$ nas %s", " ".join(argv))
    rc = main(argv)
    if rc != 0:
        raise SystemExit(f"bench_final_training: `nas {' '.join(argv)}` failed (exit {rc})")


def stage_supernet(root: Path, task: str, space_arg: str, data: str | None, plan: TaskPlan, given: str | None,
                   seed: int) -> Path:
    """The task's supernet: ``given``, or trained into ``root/supernet`` (resumed when interrupted)."""
    if given:
        return Path(given).resolve()
    run = root / "supernet"
    if (run / "final.pt").exists():
        return run / "final.pt"
    common = ["--max-time", plan.supernet_time, "--threads", "1", "-q"]
    if (run / "latest.pt").exists():
        nas(["train-supernet", "--out", str(run), "--resume", *common])
    else:
        extra = ["--val-fraction", "0.25"] if task == "image" and data else []
        nas(["train-supernet", space_arg, "--out", str(run), "--balance", "types", "--seed", str(seed),
             "--batch-size", str(plan.supernet_batch), *(["--data", data] if data else []), *extra, *common])
    return run / "final.pt"


def training_settings(task: str, space, subnet, out: Path, recipe: str, supernet: Path, plan: TaskPlan, seed: int,
                      meta: dict, corpus_dir: Path):
    """The :class:`supernet.runs.SubnetTraining` of one model: the recipe's sources, the supernet's data and split, the
    plan's schedule bounded by the training thread's CPU seconds."""
    from search_spaces import tasks
    from supernet.runs import SubnetTraining, recipe_sources
    from supernet.train import TrainConfig

    config = TrainConfig(batch_size=plan.batch_size, seq_len=min(plan.seq_len, space.max_seq_len), lr=plan.lr,
                         min_lr=plan.lr / 10, warmup_steps=plan.warmup, max_steps=None, max_time=plan.train_seconds,
                         clock="cpu", threads=1, eval_interval=10**9, eval_batches=4, ckpt_interval=10**9,
                         log_interval=plan.log_interval, seed=seed)
    data = tasks.of(space).training_data(meta)
    options = data.pop("options", None)
    return SubnetTraining(space=space, subnet=subnet, out=out, config=config, formats=(), corpus_dir=corpus_dir,
                          options=options, **data, **recipe_sources(recipe, supernet))


def score_model(task: str, out: Path, plan: TaskPlan, corpus_dir: Path) -> float:
    """The model in ``out`` scored on its task's test split (cached in ``out/score.json``)."""
    cached = out / "score.json"
    if cached.exists():
        return json.loads(cached.read_text())["score"]
    card = json.loads((out / "model_card.json").read_text())
    if task == "image":
        score = float(card["test"]["accuracy"])
    elif task == "lm":
        from supernet.artifact import card_space, load_model
        from supernet.data import prepare_corpus
        from supernet.scoring import Scoring, validation_bpb

        t = card["training"]
        corpus = prepare_corpus(t["data"], corpus_dir, t["data_seed"], t["val_fraction"])
        model, space = load_model(out), card_space(out, card)
        seq = min(plan.seq_len, space.max_seq_len, len(corpus.test) - 1)
        score = validation_bpb(model, space, corpus.test, Scoring(plan.score_windows, seq, plan.score_seed, 16),
                               "test split")["bits_per_byte"]
    else:
        from tasks.translation.artifact import load_translation_model
        from tasks.translation.data import prepare_pairs
        from tasks.translation.train import split_ce

        model, card = load_translation_model(out)
        c = card["corpus"]
        pairs = prepare_pairs(c["data"], corpus_dir, seed=c["data_seed"] or 0, lang=c["lang"] or "de").split("test")
        score = split_ce(model.eval(), pairs, model.space.max_seq_len, 64)[0]
    from supernet.files import atomic_write_json

    atomic_write_json(cached, {"score": score})  # (a unique temporary name beside it: no planted link is followed)
    return score


def run_task(task: str, out: Path, plan: TaskPlan, args, recipes: tuple[str, ...]) -> dict:
    """Every model of ``task`` trained and scored; the task's entry of final.json and its rows."""
    import torch

    from search_spaces import load_space, tasks
    from supernet.checkpoint import load_checkpoint

    root = out / task
    root.mkdir(parents=True, exist_ok=True)
    space = load_space(plan.space)
    data = args.data.get(task)
    ckpt = stage_supernet(root, task, str(Path(space.source).resolve()), data, plan, args.supernet.get(task), args.seed)
    meta = load_checkpoint(ckpt, space)["meta"]
    kind = tasks.of(space)
    if task in args.subnets:
        files = args.subnets[task]
        subnets = {Path(f).stem: space.check(space.subnet_type.load(f)) for f in files}
    else:
        subnets = pick_subnets(space, lambda s: kind.params(space, s), args.seed)
    corpus_dir = root / "corpus"
    rows, curves = [], {}
    torch.set_num_threads(1)
    for label, subnet in subnets.items():
        for seed in range(args.seeds):
            for recipe in recipes:
                name = f"{label}-{recipe}-s{seed}"
                model_dir = root / "models" / name
                if not (model_dir / "model_card.json").exists():
                    shutil.rmtree(model_dir, ignore_errors=True)  # a time-bound run interrupted: trained again
                    log.info("%s: %s (%s, seed %d) for %g CPU s", task, name, subnet, seed, plan.train_seconds)
                    kind.train_subnet(training_settings(task, space, subnet, model_dir, recipe, ckpt, plan, seed, meta,
                                                        corpus_dir))
                card = json.loads((model_dir / "model_card.json").read_text())
                t = card["training"]
                score = score_model(task, model_dir, plan, corpus_dir)
                rows.append({"task": task, "subnet": label, "recipe": recipe, "seed": seed, "score": score,
                             "steps": t["steps"], "train_seconds": t["seconds"], "parameters": card["parameters"],
                             "architecture": str(subnet)})
                curves[f"{task}/{name}"] = read_log(model_dir / "train" / "log.jsonl")
    metric, better = METRICS[task]
    by_recipe = {r: summarize([x["score"] for x in rows if x["recipe"] == r]) for r in recipes}
    groups = [[x["score"] for x in rows if x["recipe"] == r and x["subnet"] == s] for r in recipes for s in subnets]
    sd = pooled_sd(groups)
    chosen, why = choose(by_recipe, better, NOISE_SD * sd)
    entry = {"recipes": by_recipe, "chosen": chosen, "why": why, "metric": metric, "better": better,
             "seed_sd": sd, "noise": NOISE_SD * sd, "supernet": str(ckpt), "space": space.name,
             "subnets": {k: s.to_dict() for k, s in subnets.items()},
             "steps": {r: float(np.mean([x["steps"] for x in rows if x["recipe"] == r])) for r in recipes}}  # fmt: skip
    return {"entry": entry, "rows": rows, "curves": curves}


# --------------------------------------------------------------------------- report


def machine() -> dict:
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {"host": platform.node(), "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "python": platform.python_version(), "load_avg": load}


def plot(entries: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(entries), figsize=(4 * len(entries), 4), squeeze=False)
    for ax, (task, e) in zip(axes[0], entries.items()):
        names = list(e["recipes"])
        ax.bar(names, [e["recipes"][r]["mean"] for r in names], yerr=[e["recipes"][r]["sd"] for r in names], capsize=4,
               color=["tab:green" if r == e["chosen"] else "tab:gray" for r in names])
        ax.set_title(f"{task} ({e['better']} is better)", fontsize=9)
        ax.set_ylabel(e["metric"], fontsize=7)
        lo = min(e["recipes"][r]["mean"] - e["recipes"][r]["sd"] for r in names)
        hi = max(e["recipes"][r]["mean"] + e["recipes"][r]["sd"] for r in names)
        pad = 0.1 * (hi - lo) or 0.01
        ax.set_ylim(lo - pad, hi + pad)
    fig.suptitle("final-training recipes at equal CPU time (mean +- SD over subnets x seeds; green: chosen)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def pairs_flag(values: list[str] | None, flag: str) -> dict[str, str]:
    """``TASK=VALUE`` flags as a mapping; one line naming the flag for a bad one."""
    out = {}
    for v in values or []:
        task, sep, value = v.partition("=")
        if not sep or task not in TASKS or not value:
            raise ValueError(f"{flag} {v!r}: expected TASK=VALUE, TASK one of {', '.join(TASKS)}")
        out[task] = value
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="run directory (resumable: run again to continue)")
    p.add_argument("--tasks", default=",".join(TASKS), help=f"comma-separated, of {', '.join(TASKS)} (default all)")
    p.add_argument("--quick", action="store_true", help="tiny budgets on the fixtures given (the test: a few minutes)")
    p.add_argument("--space", action="append", metavar="TASK=SPACE", help="a task's space (default tiny, vision-tiny, "
                   "translate-tiny)")
    p.add_argument("--data", action="append", metavar="TASK=DATA", help="a task's train-supernet --data")
    p.add_argument("--supernet", action="append", metavar="TASK=CKPT", help="a task's supernet (else trained here)")
    p.add_argument("--subnets", action="append", metavar="TASK=A.yaml,B.yaml", help="a task's subnets (else one uniform "
                   "and one mixed, picked)")
    p.add_argument("--train-seconds", type=float, help="CPU seconds of training per model (default 300; quick 1)")
    p.add_argument("--seeds", type=int, default=2, help="seeds per (subnet, recipe) (default 2)")
    p.add_argument("--threads", type=int, default=1, choices=(1,), help="torch threads: 1 (the CPU clock counts one "
                   "thread)")
    p.add_argument("--seed", type=int, default=0, help="seed of the supernets and of the subnets' draw")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="bench_final_training: %(message)s")
    tasks_run = tuple(t.strip() for t in args.tasks.split(","))
    try:
        bad = [t for t in tasks_run if t not in TASKS]
        if bad:
            raise ValueError(f"--tasks: {', '.join(bad)} not among {', '.join(TASKS)}")
        if args.seeds < 1:
            raise ValueError(f"--seeds: {args.seeds} is not a positive number of seeds")
        if args.train_seconds is not None and not args.train_seconds > 0:
            raise ValueError(f"--train-seconds: {args.train_seconds} is not a positive number of seconds")
        args.data, args.supernet = pairs_flag(args.data, "--data"), pairs_flag(args.supernet, "--supernet")
        args.subnets = {k: v.split(",") for k, v in pairs_flag(args.subnets, "--subnets").items()}
        spaces = pairs_flag(args.space, "--space")
    except ValueError as e:  # before anything is written
        print(f"bench_final_training: error: {e}", file=sys.stderr)
        return 2
    plans = {t: replace((QUICK if args.quick else FULL)[t], **({"space": spaces[t]} if t in spaces else {}),
                        **({"train_seconds": args.train_seconds} if args.train_seconds else {})) for t in tasks_run}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from search_spaces import UserError
    from supernet.runs import DEFAULT_RECIPE, RECIPES

    started, load_before = time.time(), machine()["load_avg"]
    results = {}
    try:
        for task in tasks_run:
            results[task] = run_task(task, out, plans[task], args, tuple(RECIPES))
    except UserError as e:
        print(f"bench_final_training: error: {e}", file=sys.stderr)
        return 2
    entries = {t: r["entry"] for t, r in results.items()}
    rows = [row for r in results.values() for row in r["rows"]]
    curves = {k: v for r in results.values() for k, v in r["curves"].items()}
    record = {"command": "python scripts/bench_final_training.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "machine": machine(), "load_before": load_before, "wall_s_this_run": round(time.time() - started, 1),
              "equal_time": "the training thread's CPU seconds (TrainConfig.clock='cpu', 1 torch thread)",
              "plan": {t: asdict(p) for t, p in plans.items()}, "seeds": args.seeds, "default_recipe": DEFAULT_RECIPE,
              "rule": f"the cheapest recipe ({' < '.join(RECIPE_ORDER)}) within {NOISE_SD:g} pooled seed SD of the best "
                      "mean", "tasks": entries}  # fmt: skip
    (out / "final.json").write_text(json.dumps(record, indent=1) + "\n")
    with open(out / "final.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    plot(entries, out / "final.png")
    write_curves(curves, out / "curves.csv")
    plot_curves(curves, out / "curves.png", "each model's training loss per logged step (equal CPU seconds each)")
    for task, e in entries.items():
        text = ", ".join(f"{r} {v['mean']:.4f} +- {v['sd']:.4f} (n {v['n']})" for r, v in e["recipes"].items())
        print(f"{task} ({e['metric']}, {e['better']} is better): {text}; seed SD {e['seed_sd']:.4f}; chosen {e['chosen']} "
              f"({e['why']})")
    print(f"wrote {out / 'final.json'}, final.csv, final.png, curves.csv, curves.png ({record['wall_s_this_run']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
