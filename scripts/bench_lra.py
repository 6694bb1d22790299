"""Long Range Arena on this machine (issue 41): accuracy per attention type, LRA's speed table, and the search.

    python scripts/bench_lra.py --out runs/bench-lra              # the small protocol, 2 CPU cores (estimated ~3 h)
    python scripts/bench_lra.py --out runs/bench-lra --full       # LRA's model sizes and steps (a GPU)
    python scripts/bench_lra.py --out runs/lra-quick --quick      # every stage on tiny settings (the test runs it)

Tasks (``tasks/sequence_classification``, docs/lra.md): ListOps (LRA's generator), Pathfinder-32 (generated with
numpy) and Image, which here is **Fashion-MNIST pixels in place of LRA's grayscale CIFAR-10** (CIFAR-10 does not
ship offline); every table says so.  The data comes from ``nas data`` folders under ``OUT/data`` (cached).

Stages, each resumable (its outputs on disk are kept and skipped when present; run the same command again):

1. **accuracy**: every attention type with a bidirectional form, uniform (every layer that type), trained under one
   protocol (the same model size, steps, batch and learning rate for every type: ``protocol`` in lra.json), by
   default **self-pretrained** first ("Never Train from Scratch", Amos et al. 2024: ``pretrain_steps`` steps of
   masked-token denoising on the task's own training inputs, the same for every type, then ``steps`` of
   classification, each phase its own warm-up and cosine; ``--pretrain-steps 0`` trains from scratch as LRA did),
   test accuracy beside LRA's figure for the same type (``LRA`` below, their Table 1);
2. **speed**: LRA's speed table on this CPU: training steps/s and peak memory (RSS growth of a fresh process)
   relative to softmax at 1K, 2K, 3K, 4K tokens for every type, with torch and ONNX Runtime inference beside;
3. **search** on ListOps and Pathfinder: ``nas train-supernet`` on a space of every type, a latency campaign
   (``nas measure-latency``: ``samples`` subnets to fit on and ``held_out`` more, re-timed, to score and to give the
   test-retest ceiling; ``nas fit-predictor``, whose held-out split is the re-timed subnets, so the predictor is
   fitted on ``samples``), ``nas search`` at three budgets (the 25th, 50th and 75th
   percentiles of the measured latencies); each budget's found subnet and the best uniform subnet under it (by
   inherited fitness among those the predictor puts under the budget) retrained on equal steps (the accuracy stage's
   protocol, in worker processes ``--jobs`` at a time; a subnet under two budgets is one model), then timed side by
   side once every worker has ended, their test accuracy compared at their measured latency, paired on the same test
   examples (a bootstrap interval of the difference: a win only outside it; a tie inside).

Every accuracy has its 95% interval over the test examples (Wilson), each task's ordering of the types its Kendall
tau against LRA's, each linear-time type's speed at 4K tokens its 5x target; the wall time is summed over the runs
that resumed one another (``OUT/runs.json``).

Writes ``OUT/lra.json`` (the contract of docs/benchmarks/lra/lra.json: ``accuracy: {TASK: {TYPE: {ours, lra}}}``,
``speed: {TYPE: {LENGTH: steps_per_s_vs_softmax}}``, ``search: {TASK: [{budget_ms, verdict, found, best_uniform}]}``,
with the command, machine and load), ``accuracy.csv``, ``speed.csv``, ``search.csv``, ``accuracy.png``, ``speed.png``,
``curves.csv`` and ``curves.png`` (every trained model's training loss per logged step, pretraining and classification).
A type whose parameters this script does not know (a type added later) is skipped with a note unless ``--types``
names it with its parameters (``--types softmax,reformer:4:32``).
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import platform
import re
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from curves import curve_from_progress, plot_curves, write_curves  # noqa: E402

log = logging.getLogger("bench_lra")

TASKS = {"listops": "listops", "image": "fmnist-pixels", "pathfinder": "pathfinder"}  # LRA's task -> our generator
IMAGE_NOTE = "image = Fashion-MNIST pixels (784 tokens) in place of LRA's grayscale CIFAR-10, which does not ship offline"
# LRA's Table 1 (Tay et al. 2021; the google-research/long-range-arena README leaderboard): accuracy % on ListOps,
# Image (CIFAR-10) and Pathfinder-32, by the type that stands for each of their models here.
LRA = {
    "softmax": ("Transformer", 36.37, 42.44, 71.40),
    "local": ("Local Attention", 15.82, 41.46, 66.63),
    "longformer": ("Longformer", 35.63, 42.22, 69.71),
    "bigbird": ("BigBird", 36.05, 40.83, 74.87),
    "linformer": ("Linformer", 35.70, 38.56, 76.34),
    "performer": ("Performer", 18.01, 42.77, 77.05),
    "linear": ("Linear Transformer", 16.13, 42.34, 75.30),
    "reformer": ("Reformer", 37.27, 38.07, 68.50),
    "sinkhorn": ("Sinkhorn Transformer", 33.67, 41.23, 67.45),
    "synthesizer": ("Synthesizer", 36.99, 41.61, 69.45),
}
LRA_COLUMN = {"listops": 1, "image": 2, "pathfinder": 3}
# Our types that stand for an LRA row under another name: LRA's one Synthesizer row is its code's default mode,
# random (lra_benchmarks/models/synthesizer/synthesizer.py: ``synthesizer_mode='random'``), so synthesizer-random
# stands for it; synthesizer-dense (a learnt map from each token to T logits: 95 minutes on ListOps alone under the
# small protocol, 2026-11-29) runs with ``--lineup all``.
LRA_NAME = {"synthesizer-random": "synthesizer"}
RESAMPLES = 2000  # paired bootstrap over the test examples
# The parameters of the known types for a sequence of T tokens (W: window, Reformer's bucket and Sinkhorn's block
# size; K: projected length; M: features, Nyströmformer's landmarks).
SPECS = {"gqa": "gqa:1", "local": "local:{w}", "dilated": "dilated:{w}:2", "longformer": "longformer:{w}:1",
         "bigbird": "bigbird:{w}:1:1", "cosformer": "cosformer:{t}", "performer": "performer:{m}", "msla": "msla:5",
         "linformer": "linformer:{k}", "nystrom": "nystrom:{m}", "reformer": "reformer:{w}", "sinkhorn": "sinkhorn:{w}"}


@dataclass(frozen=True)
class Protocol:
    """One protocol for every type: the model (uniform over its layers), the training, the data sizes."""

    name: str
    embed: int
    depth: int
    heads: int
    head_dim: int
    ffn: int
    steps: int
    batch: int
    lr: float
    warmup: int
    n: int  # training examples generated per task
    eval_n: int  # validation and test examples each
    window: int = 64
    features: int = 64
    projected: int = 128
    supernet_steps: int = 300
    samples: int = 60  # subnets the latency predictor is fitted on (timed once)
    held_out: int = 30  # more subnets timed twice: fit-predictor holds them out, and their two timings are the ceiling
    models: str | None = None  # nas fit-predictor --models (None: its default, every model)
    speed_lengths: tuple[int, ...] = (1024, 2048, 3072, 4096)
    speed_steps: int = 3
    timing: tuple[int, int, int, float] = (2, 10, 2, 20.0)  # warmup, repeats, rounds, min sample ms
    search: tuple[int, int, int, int, int] = (24, 8, 8, 8, 6)  # population, parents, mutations, crossovers, generations
    per_task: dict | None = None  # LRA's own sizes per task (--full)
    pretrain_steps: int = 0  # self-pretraining steps before ``steps`` (masked-token denoising of the training inputs)
    listops_lengths: tuple[int, int] | None = None  # LRA's 500-2,000 unless given (--quick: short sequences)
    lineup: str = "all"  # the types run by default: "all" (every bidirectional type) or "lra" (those of LRA's Table 1)


# The small protocol's sizes, from probes on this machine (2026-11-29; one thread, 500 self-pretraining steps first):
# at 500 classification steps of 8 every type but two answered ListOps' most common class (the committed run of
# 2026-11-28, from scratch; softmax again with pretraining); at 2,000 local:64 reached 39.4% [35.2, 43.7] on ListOps
# and softmax 57.0% [52.6, 61.3] on Pathfinder (its majority 51.8%). 2,500 steps of every type of the 21 on the three
# tasks is about 8 hours on 2 cores, so the default lineup is LRA's own (the 10 types that stand for its Table 1's
# rows; ``--lineup all`` for every type), and Image (Fashion-MNIST pixels, not LRA's data; every type learnt it in 500
# steps) keeps 500 classification steps. 1,000 test examples: intervals of about +-3 points, not +-4.
SMALL = Protocol("small (2 CPU cores)", embed=64, depth=2, heads=2, head_dim=32, ffn=128, steps=2000, batch=8, lr=1e-3,
                 warmup=100, n=4000, eval_n=1000, supernet_steps=500, pretrain_steps=500, lineup="lra",
                 per_task={"image": {"steps": 500, "warmup": 50}})
QUICK = Protocol("quick (a test)", embed=16, depth=1, heads=1, head_dim=16, ffn=32, steps=4, batch=4, lr=1e-3, warmup=1,
                 n=24, eval_n=8, window=8, features=8, projected=16, supernet_steps=4, samples=8, held_out=5,
                 models="additive,layered",  # the test: the per-layer models (the MLP's and trees' fits cost seconds)
                 speed_lengths=(64, 128),
                 speed_steps=1, timing=(1, 2, 1, 1.0), search=(4, 2, 2, 2, 1), listops_lengths=(20, 60), pretrain_steps=2)
# LRA's base configs (lra_benchmarks/{listops,image/configs/cifar10,image/configs/pathfinder32}/.../base_*_config.py):
# ListOps 6 layers x 512 (8 heads, MLP 2,048), batch 32, 5,000 steps; CIFAR-10 1 layer x 32 (1 head, MLP 64), batch 256,
# 35,000 steps (200 epochs); Pathfinder-32 1 layer x 32 (2 heads of 8, MLP 32), batch 512, 62,400 steps (200 epochs).
# Their optimiser (Adam with their schedules, lr 0.05 rsqrt for ListOps) is not ours: AdamW with warmup and cosine.
FULL = Protocol("full (LRA's sizes and steps; a GPU)", embed=512, depth=6, heads=8, head_dim=64, ffn=2048, steps=5000,
                batch=32, lr=5e-4, warmup=1000, n=96_000, eval_n=2000, window=256, features=256, projected=256,
                supernet_steps=5000, samples=200, held_out=50, pretrain_steps=5000, per_task={
                    "listops": {"n": 96_000, "eval_n": 2000},
                    "image": {"embed": 32, "depth": 1, "heads": 1, "head_dim": 32, "ffn": 64, "batch": 256, "steps": 35_000,
                              "warmup": 175, "lr": 5e-4, "n": 54_000, "eval_n": 6000},
                    "pathfinder": {"embed": 32, "depth": 1, "heads": 2, "head_dim": 8, "ffn": 32, "batch": 512,
                                   "steps": 62_400, "warmup": 312, "lr": 1e-3, "n": 160_000, "eval_n": 20_000}})


def for_task(p: Protocol, task: str) -> Protocol:
    return replace(p, **(p.per_task or {}).get(task, {}))


def bidirectional_types() -> list[str]:
    from supernet.attention.registry import REGISTRY

    return [name for name, t in REGISTRY.items() if "bidirectional" in t.forms]


def type_specs(p: Protocol, length: int, given: list[str] | None, lengths: tuple[int, ...] = ()) -> tuple[list[str], list[str]]:
    """(the attention specs to run, notes on the types skipped): ``given`` as is, else every bidirectional type of the
    protocol's lineup (``lra``: those that stand for a row of LRA's Table 1) with its parameters for ``length`` tokens
    that can mix ``length`` (and each of ``lengths``) tokens: the 2D types need a square number."""
    from search_spaces.attention import parse_attention
    from supernet.attention.registry import get

    if given:
        return given, []
    specs, notes = [], []
    for name in bidirectional_types():
        if p.lineup == "lra" and lra_row(name) not in LRA:
            continue
        spec = SPECS.get(name, name).format(w=min(p.window, length), t=length, m=p.features, k=min(p.projected, length))
        try:
            parsed = parse_attention(spec)
        except ValueError:
            notes.append(f"{name}: skipped (its parameters are not known here; give it with --types {name}:...)")
            continue
        try:
            for n in (length, *lengths):
                get(parsed).bidirectional_flops(parsed, 1, n, p.heads, p.head_dim)
        except ValueError as e:
            notes.append(f"{name}: skipped ({e})")
            continue
        specs.append(spec)
    return specs, notes


def lra_row(spec: str) -> str:
    """The name of the row of LRA's Table 1 (a key of :data:`LRA`) that the type of ``spec`` stands for, if it has one."""
    return LRA_NAME.get(kind(spec), kind(spec))


def train_device() -> str:
    """Where the models train: the GPU when there is one (latency is timed on the CPU either way)."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def kind(spec: str) -> str:
    return spec.split(":")[0]


def safe(spec: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", spec)


def space_text(name: str, p: Protocol, length: int, attention: list[str], choices: bool = False) -> str:
    """A space of the sequence-classification task: one choice per dimension (uniform), or a small grid (``choices``)."""
    embed = [p.embed // 2, p.embed] if choices else [p.embed]
    depth = sorted({1, 2, p.depth}) if choices else [p.depth]
    heads = sorted({1, 2, p.heads}) if choices else [p.heads]
    ffn = [p.ffn // 2, p.ffn] if choices else [p.ffn]
    return (f"name: {name}\ntask: sequence-classification\nvocab_size: 272\nmax_seq_len: {length}\nhead_dim: {p.head_dim}\n"
            f"positions: rope\nembed_dim: {embed}\ndepth: {depth}\nlayers:\n  heads: {heads}\n  ffn_dim: {ffn}\n"
            f"  attention: [{', '.join(json.dumps(a) for a in attention)}]\n"
            f"latency:\n  prefill: {{batch_size: 1, seq_len: {length}}}\n")


def write_json(path: Path, data) -> None:
    from supernet.files import atomic_write  # (a new temporary file of a unique name: never a planted one)

    atomic_write(path, json.dumps(data, indent=1) + "\n")


# ---------------------------------------------------------------------------------------------- data


def task_data(out: Path, task: str, p: Protocol, seed: int):
    """The task's data folder (``nas data``'s, cached) and its loaded splits, with the settings a run records."""
    from tasks.sequence_classification.data import load, vocabulary, write_folder

    folder = out / "data" / TASKS[task]
    write_folder(TASKS[task], folder, n=p.n, eval_n=p.eval_n, seed=seed,
                 lengths=p.listops_lengths if task == "listops" else None)
    classes, symbols, _ = vocabulary(folder, None)
    settings = {"data": str(folder), "data_seed": seed, "val_fraction": 0.1, "classes": classes, "symbols": symbols}
    return folder, load(settings, folder)


# ---------------------------------------------------------------------------------------------- statistics


def interval(right: list[bool]) -> dict:
    """The accuracy's 95% Wilson interval in points (the test split's sampling noise, not the training seed's)."""
    from scipy.stats import binomtest

    ci = binomtest(int(sum(right)), len(right)).proportion_ci(confidence_level=0.95, method="wilson")
    return {"ci_low": 100.0 * float(ci.low), "ci_high": 100.0 * float(ci.high)}


def paired(a: str | list[bool], b: str | list[bool], seed: int) -> dict:
    """Accuracy of ``a`` minus ``b`` in points on the same test examples, with the 95% interval of a paired bootstrap
    over those examples (scipy's BCa); ``a``/``b``: per-example correctness, as lists or strings of 0/1."""
    from scipy.stats import bootstrap

    x = np.array([float(c) for c in a]) - np.array([float(c) for c in b])
    diff = 100.0 * float(x.mean())
    if np.all(x == x[0]):  # every example the same way: no spread to resample
        return {"difference": diff, "ci_low": diff, "ci_high": diff}
    res = bootstrap((x,), np.mean, n_resamples=RESAMPLES, confidence_level=0.95, random_state=seed)
    return {"difference": diff, "ci_low": 100.0 * float(res.confidence_interval.low),
            "ci_high": 100.0 * float(res.confidence_interval.high)}


def call(d: dict) -> str:
    """A paired difference's word: a win or a loss only when its interval excludes 0."""
    return "better" if d["ci_low"] > 0 else "worse" if d["ci_high"] < 0 else "tie"


def accuracy_summary(accuracy: dict, seed: int, floors: dict[str, dict[str, float]] | None = None) -> dict:
    """Per task: Kendall tau between our ordering of the types and LRA's over the types both have, uniform softmax
    against uniform local attention (LRA's main finding on ListOps: 36.4% against 15.8%), paired, and, given
    ``floors`` (each task's :func:`baselines`), the types whose interval is above each (a model that answers the most
    common class scores ``majority_class`` and has learnt nothing of the task; one at ``first_token`` may have learnt
    no more than the first token)."""
    from scipy.stats import kendalltau

    summary = {}
    for task, rows in accuracy.items():
        shared = [s for s, r in rows.items() if r.get("lra") is not None]
        tau, pvalue = kendalltau([rows[s]["ours"] for s in shared], [rows[s]["lra"] for s in shared]) if len(shared) >= 3 \
            else (float("nan"), float("nan"))
        entry = {"kendall_tau_vs_lra": None if np.isnan(tau) else float(tau),
                 "kendall_p": None if np.isnan(pvalue) else float(pvalue), "shared_types": shared}
        soft = rows.get("softmax")
        local = next((r for s, r in rows.items() if kind(s) == "local"), None)
        if soft and local and "correct" in soft and "correct" in local:
            d = paired(soft["correct"], local["correct"], seed)
            column = LRA_COLUMN[task]
            entry["softmax_vs_local"] = {**d, "softmax": soft["ours"], "local": local["ours"], "call": call(d),
                                         "lra": {"softmax": LRA["softmax"][column], "local": LRA["local"][column]}}
        for name, share in (floors or {}).get(task, {}).items():
            entry[name] = share
            entry["above_majority" if name == "majority_class" else f"above_{name}"] = [
                s for s, r in rows.items() if r.get("ci_low", 0.0) > share]
        summary[task] = entry
    return summary


def linear_time(spec: str, p: Protocol) -> bool:
    """Whether the type's token mixing grows linearly with the length (its FLOPs at 4,096 tokens under 6x those at 1,024)."""
    from search_spaces.attention import parse_attention
    from supernet.attention.registry import get

    flops = []
    for n in (1024, 4096):  # squares: the 2D types' cost is defined there too
        parsed = parse_attention(spec.replace("{t}", str(n)))
        flops.append(get(parsed).bidirectional_flops(parsed, 1, n, p.heads, p.head_dim))
    return flops[1] / flops[0] < 6.0  # 4x the tokens: 4x the work when linear, 16x when quadratic


def speed_targets(table: dict, p: Protocol) -> dict:
    """LRA's speed target per linear-time type: at least 5x softmax's training steps/s at the longest length."""
    longest = str(max(p.speed_lengths))
    out = {}
    for spec, rows in table.items():
        if spec == "softmax" or not linear_time(spec, p):
            continue
        ratio = (rows.get(longest) or {}).get("steps_per_s_vs_softmax")
        out[spec] = {"tokens": int(longest), "steps_per_s_vs_softmax": ratio, "met": ratio is not None and ratio >= 5.0}
    return out


def answers(right: list[bool]) -> tuple[float, dict]:
    """A model's test accuracy (%) from its per-example answers, and what a record keeps beside it: the interval and
    the answers (as a string of 0/1, for paired comparisons)."""
    return 100.0 * sum(right) / len(right), {**interval(right), "correct": "".join("1" if r else "0" for r in right)}


# ---------------------------------------------------------------------------------------------- 1. accuracy


def schedule_of(p: Protocol, seed: int):
    """The training schedule of every model the protocol trains (the accuracy stage's and the search's)."""
    from tasks.sequence_classification.train import Schedule

    return Schedule(steps=p.steps, batch_size=p.batch, lr=p.lr, warmup=p.warmup, seed=seed, device=train_device(),
                    pretrain_steps=p.pretrain_steps)


def worker_progress(label: str, p: Protocol, curve: list[dict]):
    """A worker's training progress: the curve's points into ``curve`` (100 a run), a line a tenth into the worker's
    log (its stdout): long work shows progress."""
    total = p.pretrain_steps + p.steps
    record_curve = curve_from_progress(curve, max(1, total // 100))

    def progress(info) -> None:
        record_curve(info)
        if info.step % max(1, total // 10) == 0 or info.step == total:
            loss = ", ".join(f"{k} {v:.3f}" for k, v in info.losses.items())
            print(f"{label}: step {info.step}/{total}, loss {loss}, {info.elapsed:.0f} s", flush=True)

    return progress


def accuracy_worker(task: str, spec: str, p: Protocol, out: Path, seed: int) -> None:
    """In a fresh process: ``spec`` uniform on ``task``, trained from scratch under the protocol, scored on the test
    split; writes ``OUT/accuracy/TASK/SPEC.json`` (atomically: a killed worker leaves nothing, and is run again)."""
    from search_spaces import parse_space
    from tasks.sequence_classification.train import score_correct, train_subnet

    p = for_task(p, task)
    _, data = task_data(out, task, p, seed)
    length = data.train.inputs.shape[1]
    space = parse_space(space_text(f"{task}-{safe(spec)}", p, length, [spec]), where=f"{task}-{spec}")
    start = time.perf_counter()
    curve: list[dict] = []
    model, _ = train_subnet(space, space.largest(), data.train, data.val, schedule_of(p, seed),
                            progress=worker_progress(f"{task} {spec}", p, curve))
    lra = LRA.get(lra_row(spec))
    ours, kept = answers(score_correct(model, data.test, space, p.batch))
    path = out / "accuracy" / task / f"{safe(spec)}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, {"ours": ours, "lra": lra[LRA_COLUMN[task]] if lra else None, "lra_model": lra[0] if lra else None,
                      "spec": spec, "params": model.num_params(), "train_s": round(time.perf_counter() - start, 1),
                      "test_examples": len(data.test), "pretrain_steps": p.pretrain_steps, "steps": p.steps, "curve": curve,
                      **kept})


def baselines(data) -> dict[str, float]:
    """What a model scores on the test split without reading past the first token (%): ``majority_class``, the share of
    the most common label (answering one class); ``first_token``, the most common training label of the examples that
    start with the same token (on ListOps, the root operator: MAX's values run high, MIN's low)."""
    train_first, test_first = np.asarray(data.train.inputs)[:, 1], np.asarray(data.test.inputs)[:, 1]  # after [CLS]
    train_labels, test_labels = np.asarray(data.train.targets)[:, 0], np.asarray(data.test.targets)[:, 0]
    common = int(np.bincount(train_labels).argmax())
    lookup = {int(t): int(np.bincount(train_labels[train_first == t]).argmax()) for t in np.unique(train_first)}
    guess = np.array([lookup.get(int(t), common) for t in test_first])
    return {"majority_class": 100.0 * float(np.bincount(test_labels).max()) / len(test_labels),
            "first_token": 100.0 * float(np.mean(guess == test_labels))}


def stage_accuracy(out: Path, base: Protocol, types: list[str] | None, seed: int, jobs: int,
                   argv_protocol: list[str]) -> tuple[dict, dict[str, dict[str, float]]]:
    """Every (task, type) not yet on disk, trained in worker processes ``jobs`` at a time (one thread each: on a
    small model two single-threaded trainings do more than one on two threads); (the records by task and type, each
    task's :func:`baselines`)."""
    pending, wanted, floors = [], {}, {}
    for task in TASKS:
        p = for_task(base, task)
        _, data = task_data(out, task, p, seed)  # generated once, here, before the workers read it
        floors[task] = baselines(data)
        specs, notes = type_specs(p, data.train.inputs.shape[1], types)
        for note in notes:
            log.info("accuracy %s: %s", task, note)
        wanted[task] = specs
        for spec in specs:
            record = out / "accuracy" / task / f"{safe(spec)}.json"
            if not done_under(record, p):
                pending.append(Job(f"accuracy {task} {spec}", f"{p.steps} steps of {p.batch} examples",
                                   ["--accuracy-worker", task, spec], record.with_suffix(".log"), record))
    run_workers(out, seed, jobs, argv_protocol, pending)
    return {task: {spec: json.loads(path.read_text()) for spec in specs
                   if (path := out / "accuracy" / task / f"{safe(spec)}.json").exists()}
            for task, specs in wanted.items()}, floors


def done_under(path: Path, p: Protocol) -> bool:
    """Whether ``path`` holds a model trained under this protocol's steps and pretraining (a record without the steps,
    of before they were recorded, is trained again)."""
    if not path.exists():
        return False
    record = json.loads(path.read_text())
    return record.get("steps") == p.steps and record.get("pretrain_steps", 0) == p.pretrain_steps


@dataclass(frozen=True)
class Job:
    """A model a worker process trains: what the log calls it (and what it trains), the worker's flags, its log file,
    the record it writes."""

    name: str
    what: str
    flags: list[str]
    log: Path
    record: Path


def run_workers(out: Path, seed: int, jobs: int, argv_protocol: list[str], pending: list[Job]) -> None:
    """Runs every job of ``pending`` in a worker process of this script (one thread each), ``jobs`` at a time, until
    all ended; a stopped run (SIGTERM, Ctrl-C) stops its workers, whose models the next run trains again."""
    running: list[tuple[subprocess.Popen, Job, float]] = []
    try:
        drive_workers(out, seed, jobs, argv_protocol, list(pending), running)
    finally:
        for proc, *_ in running:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:  # one that does not end on SIGTERM in time is killed
                    proc.kill()
                    proc.wait()


def drive_workers(out: Path, seed: int, jobs: int, argv_protocol: list[str], pending: list[Job], running: list) -> None:
    """Starts the workers of ``pending``, ``jobs`` at a time, keeping the live ones in ``running``, until all ended."""
    done, total = 0, len(pending)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    while pending or running:
        while pending and len(running) < jobs:
            job = pending.pop(0)
            log.info("%s: %s (%d of %d)", job.name, job.what, done + len(running) + 1, total)
            cmd = [sys.executable, __file__, *job.flags, "--out", str(out), "--seed", str(seed), "--threads", "1",
                   *argv_protocol]
            job.log.parent.mkdir(parents=True, exist_ok=True)
            with open(job.log, "w") as f:  # the worker's output (a pipe could fill and block it)
                proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
            running.append((proc, job, time.time()))
        time.sleep(0.2)
        for item in list(running):
            proc, job, t0 = item
            if proc.poll() is None:
                continue
            running.remove(item)
            done += 1
            if proc.returncode != 0 or not job.record.exists():
                err = job.log.read_text(errors="replace").strip().splitlines()
                log.warning("%s: the worker failed (exit %s): %s", job.name, proc.returncode, (err or ["no output"])[-1])
            else:
                log.info("%s: done in %.0f s (%d of %d)", job.name, time.time() - t0, done, total)


# ---------------------------------------------------------------------------------------------- 2. speed


def speed_worker(spec: str, part: str, p: Protocol, out: Path, threads: int | None) -> None:
    """In a fresh process, at each length (ascending: the peak so far is the peak at this length); ``part`` "train":
    training steps/s, peak RSS growth (the process's own: nothing else ran in it) and torch inference ms; "ort": the
    model exported to ONNX and ONNX Runtime inference ms. Each length's model is built and exported for it."""
    import resource

    import numpy as np
    import torch

    from search_spaces import parse_space
    from supernet import Transformer, TransformerConfig
    from supernet.onnx_export import export_onnx, onnx_session

    if threads:
        torch.set_num_threads(threads)
    rows: dict[str, dict] = {}
    base_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for length in p.speed_lengths:
        concrete = spec.replace("{t}", str(length))  # cosFormer's M: the length
        # built for the length it is timed at, as LRA's models are: a type whose weights grow with the length (the
        # Synthesizers' T x T) would otherwise carry the longest length's at every length
        space = parse_space(space_text("speed", p, length, [concrete]), where=f"speed {spec}")
        model = Transformer(TransformerConfig.from_subnet(space, space.largest()), generator=torch.Generator().manual_seed(0))
        x = torch.randint(12, 272, (1, length), generator=torch.Generator().manual_seed(1))
        if part == "ort":
            path = out / "onnx" / f"{safe(concrete)}.{length}.onnx"
            try:
                session = onnx_session(export_onnx(model, path), threads)
            except Exception as e:  # noqa: BLE001 - a type without an ONNX form: its rows say so
                rows[str(length)] = {"ort_ms": None, "ort_error": str(e).splitlines()[0][:200]}
                continue
            feed = {"input_ids": x.numpy().astype(np.int64)}
            session.run(None, feed)
            t0 = time.perf_counter()
            for _ in range(p.speed_steps):
                session.run(None, feed)
            rows[str(length)] = {"ort_ms": 1000 * (time.perf_counter() - t0) / p.speed_steps}
            del session
            for f in path.parent.glob(path.name + "*"):  # timed, not kept (large at LRA's sizes)
                f.unlink()
            continue
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        y = torch.randint(0, 10, (1,), generator=torch.Generator().manual_seed(2))

        def step():
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(model(x)[:, 0], y)
            loss.backward()
            opt.step()

        step()  # warm-up
        t0 = time.perf_counter()
        for _ in range(p.speed_steps):
            step()
        train_s = (time.perf_counter() - t0) / p.speed_steps
        peak_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base_kb) / 1024
        model.eval()
        with torch.no_grad():
            model(x)
            t0 = time.perf_counter()
            for _ in range(p.speed_steps):
                model(x)
            torch_ms = 1000 * (time.perf_counter() - t0) / p.speed_steps
        rows[str(length)] = {"train_steps_per_s": 1.0 / train_s, "peak_rss_mb": peak_mb, "torch_ms": torch_ms,
                             "params": model.num_params()}
    write_json(out / f"{safe(spec)}.{part}.json", {"spec": spec, "lengths": rows})


def stage_speed(out: Path, p: Protocol, types: list[str] | None, threads: int | None, argv_protocol: list[str]) -> dict:
    folder = out / "speed"
    folder.mkdir(parents=True, exist_ok=True)
    specs, notes = type_specs(p, max(p.speed_lengths), types, p.speed_lengths)
    for note in notes:
        log.info("speed: %s", note)
    specs = [s.replace(f"cosformer:{max(p.speed_lengths)}", "cosformer:{t}") for s in specs]  # cosFormer's M: the length
    if "softmax" not in specs:
        specs.insert(0, "softmax")
    raw: dict[str, dict] = {}
    for spec in specs:
        parts = {}
        for part in ("train", "ort"):
            path = folder / f"{safe(spec)}.{part}.json"
            if not path.exists():
                log.info("speed %s (%s) at %s tokens", spec, part, ", ".join(map(str, p.speed_lengths)))
                cmd = [sys.executable, __file__, "--speed-worker", spec, "--speed-part", part, "--out", str(folder),
                       *argv_protocol, *(["--threads", str(threads)] if threads else [])]
                done = subprocess.run(cmd, capture_output=True, text=True)
                if done.returncode != 0 or not path.exists():
                    log.warning("speed %s (%s): the worker failed: %s", spec, part,
                                (done.stderr.strip().splitlines() or ["no output"])[-1])
                    continue
            parts[part] = json.loads(path.read_text())["lengths"]
        if "train" in parts:
            raw[spec] = {n: {**r, **parts.get("ort", {}).get(n, {"ort_ms": None})} for n, r in parts["train"].items()}
    soft = raw.get("softmax", {})
    table = {}
    for spec, rows in raw.items():
        table[spec] = {}
        for length, r in rows.items():
            ref = soft.get(length)
            table[spec][length] = {
                "steps_per_s_vs_softmax": r["train_steps_per_s"] / ref["train_steps_per_s"] if ref else None,
                "memory_vs_softmax": (r["peak_rss_mb"] / ref["peak_rss_mb"] if ref and ref["peak_rss_mb"] > 0 else None),
                **r}
    return table


# ---------------------------------------------------------------------------------------------- 3. search


def verdict(entry: dict, budget: float) -> str:
    """Found against the best uniform model: a win only when the paired interval of the accuracy difference is above
    0 and the found model is no slower than the uniform one (or within the budget); a loss when it is below 0."""
    f, u, d = entry["found"], entry["best_uniform"], entry["difference"]
    word = call(d)
    if word == "better" and f["measured_ms"] > max(budget, u["measured_ms"]):
        word = "tie"  # more accurate, but slower than the uniform model and over the budget: not a win at its latency
    text = {"better": "found wins", "worse": "uniform wins", "tie": "tie"}[word]
    return text + ("" if f["measured_ms"] <= budget * 1.05 else " (found over budget)")


def search_summary(search: dict) -> dict:
    """Per task: the budgets the found model wins, and the issue's target (wins at 2 of 3)."""
    return {task: {"wins": sum(e["verdict"].startswith("found wins") for e in rows), "budgets": len(rows),
                   "ties": sum(e["verdict"].startswith("tie") for e in rows),
                   "target_met": sum(e["verdict"].startswith("found wins") for e in rows) >= 2}
            for task, rows in search.items()}


def run_cli(args: list[str]) -> None:
    from nas.cli import main

    code = main([*args, "-q"])
    if code != 0:
        raise RuntimeError(f"nas {' '.join(args)}: exit {code}")


def campaign_flags(p: Protocol) -> list[str]:
    """``nas measure-latency``'s --samples and --retest for ``p.samples`` subnets to fit on and ``p.held_out`` re-timed:
    ``nas fit-predictor`` holds the re-timed ones out, so it fits on the rest.  (Until issue 56 the campaign timed 60
    with --retest 0.5: 30 held out left 30 to fit on, about two layers of each of 21 types, and the predictors missed
    their ceiling by 6-16x; see docs/benchmarks/lra/README.md.)"""
    total = p.samples + p.held_out
    return ["--samples", str(total), "--retest", f"{p.held_out / total:.6f}"]


def search_worker(task: str, subnet_file: Path, p: Protocol, out: Path, seed: int) -> None:
    """In a fresh process: the subnet of ``subnet_file`` (``OUT/search/TASK/models/KEY.subnet.json``: a found subnet or
    a best uniform one) trained under the protocol, as the accuracy stage's models are, and scored on the test split;
    writes the model (``KEY/``, the project's model folder: :func:`supernet.artifact.save_model`) and then its record
    (``KEY.json``, atomically: a killed worker is run again)."""
    from search_spaces import Subnet, load_space
    from supernet.artifact import save_model
    from tasks.sequence_classification.train import score_correct, train_subnet

    p = for_task(p, task)
    _, data = task_data(out, task, p, seed)
    space = load_space(out / "search" / task / "space.yaml")
    subnet = Subnet.from_dict(json.loads(subnet_file.read_text()), where=str(subnet_file))
    start = time.perf_counter()
    curve: list[dict] = []
    model, _ = train_subnet(space, subnet, data.train, data.val, schedule_of(p, seed),
                            progress=worker_progress(f"search {task} {subnet.key}", p, curve))
    acc, kept = answers(score_correct(model, data.test, space, p.batch))
    save_model(model, subnet_file.with_name(subnet.key), space)
    write_json(subnet_file.with_name(f"{subnet.key}.json"), {
        "subnet": subnet.to_dict(), "key": subnet.key, "test_accuracy": acc, "params": model.num_params(),
        "train_s": round(time.perf_counter() - start, 1), "pretrain_steps": p.pretrain_steps, "steps": p.steps,
        "curve": curve, **kept})


def stage_search(out: Path, base: Protocol, types: list[str] | None, seed: int, threads: int | None, jobs: int,
                 argv_protocol: list[str]) -> dict:
    """Per task: the supernet, the latency campaign and predictor, the search at three budgets, each budget's found
    subnet and best uniform one; then every distinct subnet of both tasks trained in worker processes ``jobs`` at a
    time (as the accuracy stage's models: the same subnet under two budgets is one model); then, with every worker
    ended (a quiet machine), each budget's two models timed side by side and compared."""
    import numpy as np

    from latency.device import get_device
    from latency.predictors import load_predictor
    from latency.protocol import measure
    from latency.table import read_timings
    from latency.timing_core import Settings
    from supernet.scoring import HeldOutFitness
    from search_spaces import Subnet, load_space
    from supernet.artifact import load_model
    from supernet.checkpoint import load_supernet
    from tasks.sequence_classification.learner import SequenceLearner

    # per task and budget: (budget, found, best uniform), None where the budget's comparison is on disk
    plans: dict[str, list[tuple[float, Subnet, Subnet] | None]] = {}
    for task in ("listops", "pathfinder"):
        p = for_task(base, task)
        folder, data = task_data(out, task, p, seed)
        length = data.train.inputs.shape[1]
        specs, _ = type_specs(p, length, types)
        root = out / "search" / task
        root.mkdir(parents=True, exist_ok=True)
        text, run = space_text(f"lra-{task}", p, length, specs, choices=True), root / "supernet"
        if not (root / "space.yaml").exists():
            (root / "space.yaml").write_text(text)
        elif (root / "space.yaml").read_text() != text:
            raise SystemExit(f"bench_lra: {root / 'space.yaml'} is another space (other --types or protocol); use another --out")
        if not (run / "final.pt").exists():
            again = ["--resume"] if (run / "latest.pt").exists() else [str(root / "space.yaml"), "--data", str(folder)]
            run_cli(["train-supernet", *again, "--out", str(run), "--max-steps", str(p.supernet_steps), "--batch-size",
                     str(p.batch), "--lr", str(p.lr), "--lr-warmup", str(p.warmup), "--eval-batches", "2",
                     "--eval-interval", str(max(1, p.supernet_steps // 4)), "--ckpt-interval", str(max(1, p.supernet_steps // 4)),
                     *(["--threads", str(threads)] if threads else [])])
        table_path = root / "cpu.csv"
        if not (root / "pred" / "predictor.json").exists():
            run_cli(["measure-latency", str(root / "space.yaml"), "--device", "cpu", "--out", str(table_path),
                     *campaign_flags(p), *timing_flags(p, threads)])
            models = ["--models", p.models] if p.models else []
            run_cli(["fit-predictor", str(table_path), "--out", str(root / "pred"), *models])
        measured = sorted(r.median_ms for r in read_timings(table_path).rows)
        budgets = [float(np.percentile(measured, q)) for q in (25, 50, 75)]
        population, parents, mutations, crossovers, generations = p.search
        if not (root / "found" / "search.json").exists():
            run_cli(["search", str(run / "final.pt"), "--predictor", str(root / "pred"), "--out", str(root / "found"),
                     "--budget", ",".join(f"{b:.4f}ms" for b in budgets), "--population", str(population), "--parents",
                     str(parents), "--mutations", str(mutations), "--crossovers", str(crossovers), "--generations",
                     str(generations), "--val-windows", str(max(1, p.eval_n // p.batch)), "--eval-batch-size", str(p.batch),
                     "--no-progress"])
        summary = json.loads((root / "found" / "search.json").read_text())
        assert len(summary["budgets"]) == len(budgets), (list(summary["budgets"]), budgets)
        plans[task] = [None] * len(budgets)
        open_budgets = [i for i in range(len(budgets)) if not done_under(root / f"budget-{i}.json", p)]
        if not open_budgets:
            continue
        supernet, _ = load_supernet(run / "final.pt")
        space = load_space(root / "space.yaml")
        predictor = load_predictor(root / "pred")
        held = SequenceLearner(space.max_seq_len, space.vocab_size).heldout(data.val, len(data.val))
        fit = HeldOutFitness(supernet, held, batch_size=p.batch)
        uniform = space.uniform()
        predicted = dict(zip(uniform, predictor.predict(uniform)))
        # the held-out loss of each uniform subnet that some open budget admits (the fastest one stands in where none fits)
        scored = [s for s in uniform if predicted[s] <= max(budgets[i] for i in open_budgets)]
        scored = scored or [min(uniform, key=lambda s: predicted[s])]
        loss = dict(zip(scored, fit(scored)))
        found = [Subnet.from_dict(b["best"]["subnet"]) for b in summary["budgets"].values()]  # in the order given
        for i in open_budgets:
            feasible = [s for s in scored if predicted[s] <= budgets[i]] or [min(scored, key=lambda s: predicted[s])]
            plans[task][i] = (budgets[i], found[i], min(feasible, key=lambda s: loss[s]))

    pending = []
    for task, plan in plans.items():
        p, models = for_task(base, task), out / "search" / task / "models"
        models.mkdir(parents=True, exist_ok=True)
        for subnet in dict.fromkeys(s for entry in plan if entry for s in entry[1:]):  # each distinct subnet once
            record = models / f"{subnet.key}.json"
            if done_under(record, p):
                continue
            subnet_file = models / f"{subnet.key}.subnet.json"
            subnet_file.write_text(subnet.to_json())
            pending.append(Job(f"search {task} {subnet.key}", f"{p.steps} steps of {p.batch} examples ({subnet})",
                               ["--search-worker", task, str(subnet_file)], record.with_suffix(".log"), record))
    run_workers(out, seed, jobs, argv_protocol, pending)

    results = {}
    device = get_device("cpu", threads=threads or 1)
    for task in ("listops", "pathfinder"):
        p, root = for_task(base, task), out / "search" / task
        space, predictor = load_space(root / "space.yaml"), load_predictor(root / "pred")
        warm, repeats, rounds, min_ms = p.timing
        settings = Settings(warmup=warm, repeats=repeats, rounds=rounds, min_sample_ms=min_ms)
        rows: list[dict] = []
        for i, plan in enumerate(plans[task]):
            path = root / f"budget-{i}.json"
            if plan is None:
                rows.append(json.loads(path.read_text()))
                continue
            budget, found, best_uniform = plan
            entry = {"budget_ms": budget, "pretrain_steps": p.pretrain_steps, "steps": p.steps}
            models = {}
            for name, subnet in (("found", found), ("best_uniform", best_uniform)):
                record = root / "models" / f"{subnet.key}.json"
                if not record.exists():
                    raise RuntimeError(f"bench_lra: {record} is missing: its worker failed (see {record.with_suffix('.log')})")
                r = json.loads(record.read_text())
                models[name] = load_model(record.with_suffix(""))
                entry[name] = {"subnet": subnet.to_dict(), "key": subnet.key, "test_accuracy": r["test_accuracy"],
                               "predicted_ms": float(predictor.predict([subnet])[0]), "params": r["params"],
                               "curve": r["curve"], **{k: r[k] for k in ("ci_low", "ci_high", "correct")}}
            m = measure(device, models, space.workload(), settings, seed=seed)
            for name in models:
                entry[name]["measured_ms"] = float(m.results[name].median_ms)
            f, u = entry["found"], entry["best_uniform"]
            entry["difference"] = paired(f["correct"], u["correct"], seed)  # found minus uniform, points
            entry["verdict"] = verdict(entry, budget)
            write_json(path, entry)
            rows.append(entry)
        results[task] = rows
    return results


def timing_flags(p: Protocol, threads: int | None) -> list[str]:
    """``nas measure-latency``'s timing flags for the protocol's (warmup, repeats, rounds, min sample ms)."""
    warm, repeats, rounds, min_ms = p.timing
    return ["--timing-threads", str(threads or 1), "--timing-warmup", str(warm), "--repeats", str(repeats),
            "--rounds", str(rounds), "--min-sample-ms", str(min_ms)]


# ---------------------------------------------------------------------------------------------- report


def machine() -> dict:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version(),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def take_curves(record: dict) -> dict[str, list[dict]]:
    """Every trained model's curve (``TASK/SPEC``, ``search-TASK/budgetI-ROLE``), taken out of ``record``'s entries
    (lra.json keeps the figures; curves.csv the points)."""
    curves = {f"{t}/{s}": r.pop("curve", None) or [] for t, types in record["accuracy"].items() for s, r in types.items()}
    curves.update({f"search-{t}/budget{i}-{w}": e[w].pop("curve", None) or [] for t, rows in record["search"].items()
                   for i, e in enumerate(rows) for w in ("found", "best_uniform")})
    return curves


def write_tables(out: Path, record: dict, curves: dict[str, list[dict]] | None = None) -> None:
    acc = [{"task": t, "type": s, **{k: r.get(k) for k in ("ours", "lra", "lra_model", "params", "train_s")}}
           for t, types in record["accuracy"].items() for s, r in types.items()]
    speed = [{"type": s, "length": n, **r} for s, rows in record.get("speed_detail", {}).items() for n, r in rows.items()]
    search = [{"task": t, "budget_ms": e["budget_ms"], "verdict": e["verdict"],
               **{f"{w}_{k}": e[w][k] for w in ("found", "best_uniform") for k in ("key", "test_accuracy", "measured_ms")}}
              for t, rows in record["search"].items() for e in rows]
    for name, rows in (("accuracy", acc), ("speed", speed), ("search", search)):
        if rows:
            with open(out / f"{name}.csv", "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(rows[0]))
                w.writeheader()
                w.writerows(rows)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if acc:
        tasks = list(record["accuracy"])
        fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 4), squeeze=False)
        for ax, t in zip(axes[0], tasks):
            rows = record["accuracy"][t]
            names = list(rows)
            ax.bar([i - 0.2 for i in range(len(names))], [rows[n]["ours"] for n in names], 0.4, label="ours")
            ax.bar([i + 0.2 for i in range(len(names))], [rows[n]["lra"] or 0 for n in names], 0.4, label="LRA")
            floors = record.get("accuracy_summary", {}).get(t, {})
            for key, style, label in (("majority_class", ":", "most common class"), ("first_token", "--", "first token alone")):
                if key in floors:
                    ax.axhline(floors[key], color="black", linestyle=style, linewidth=1, label=label)
            ax.set_xticks(range(len(names)), names, rotation=60, fontsize=7)
            ax.set_title(t + (" (Fashion-MNIST, not CIFAR-10)" if t == "image" else ""), fontsize=9)
            ax.set_ylabel("test accuracy %")
        axes[0][0].legend(fontsize=6, framealpha=0.9)
        fig.tight_layout()
        fig.savefig(out / "accuracy.png", dpi=120)
        plt.close(fig)
    if curves and any(curves.values()):
        write_curves(curves, out / "curves.csv")
        pre = record.get("protocol", {}).get("pretrain_steps", 0)
        plot_curves(curves, out / "curves.png", "every model's training loss per logged step" + (
            f" (the first {pre} steps denoise the inputs)" if pre else ""), panel=lambda name: name.split("/")[0])
    if record.get("speed"):
        fig, ax = plt.subplots(figsize=(6, 4))
        for spec, rows in record["speed"].items():
            xs = [int(n) for n in rows if rows[n] is not None]
            ax.plot(xs, [rows[str(n)] for n in xs], marker="o", label=spec)
        ax.set_xlabel("tokens")
        ax.set_ylabel("training steps/s relative to softmax")
        ax.legend(fontsize=6)
        fig.tight_layout()
        fig.savefig(out / "speed.png", dpi=120)
        plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="every stage on tiny settings (the test)")
    mode.add_argument("--full", action="store_true", help="LRA's model sizes and steps (a GPU)")
    ap.add_argument("--stages", default="accuracy,speed,search", help="which stages (default all three)")
    ap.add_argument("--types", help="attention specs to run, comma-separated (default: the protocol's lineup)")
    ap.add_argument("--lineup", choices=("lra", "all"), help="the types run when --types does not name them: lra (those "
                    "of LRA's Table 1; the small protocol's default) or all (every bidirectional type; the full and quick "
                    "protocols' default)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, help="torch threads (default torch's choice; the latency campaign: 1)")
    ap.add_argument("--jobs", type=int, default=2, help="models trained at a time in the accuracy and search stages "
                    "(one thread each)")
    ap.add_argument("--pretrain-steps", type=int, help="self-pretraining steps before the classification's, the same for "
                    "every type (default: the protocol's, 500 on the small one; 0: from scratch, as LRA)")
    ap.add_argument("--speed-worker", metavar="SPEC", help=argparse.SUPPRESS)
    ap.add_argument("--accuracy-worker", nargs=2, metavar=("TASK", "SPEC"), help=argparse.SUPPRESS)
    ap.add_argument("--search-worker", nargs=2, metavar=("TASK", "SUBNET"), help=argparse.SUPPRESS)
    ap.add_argument("--speed-part", choices=("train", "ort"), default="train", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="bench_lra: %(message)s")
    protocol = QUICK if args.quick else FULL if args.full else SMALL
    flag = ["--quick"] if args.quick else ["--full"] if args.full else []
    if args.pretrain_steps is not None:
        if args.pretrain_steps < 0:
            ap.error(f"--pretrain-steps: {args.pretrain_steps} is not a whole number of steps (0 or more)")
        protocol = replace(protocol, pretrain_steps=args.pretrain_steps)
        flag += ["--pretrain-steps", str(args.pretrain_steps)]
    if args.lineup:
        protocol = replace(protocol, lineup=args.lineup)
        flag += ["--lineup", args.lineup]
    if args.speed_worker:
        speed_worker(args.speed_worker, args.speed_part, protocol, args.out, args.threads)
        return 0
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if args.accuracy_worker:
        accuracy_worker(*args.accuracy_worker, protocol, args.out, args.seed)
        return 0
    if args.search_worker:
        search_worker(args.search_worker[0], Path(args.search_worker[1]), protocol, args.out, args.seed)
        return 0
    out = args.out
    types = [t.strip() for t in args.types.split(",")] if args.types else None
    if args.jobs < 1:
        ap.error(f"--jobs: {args.jobs} is not a positive number of models at a time")
    for spec in types or []:  # refused here in one line, not in a worker's traceback
        from search_spaces.attention import parse_attention

        try:
            parse_attention(spec.replace("{t}", "1024"))
        except ValueError as e:
            ap.error(f"--types: {e}")
    stages = [s.strip() for s in args.stages.split(",")]
    unknown = sorted(set(stages) - {"accuracy", "speed", "search"})
    if unknown:
        ap.error(f"--stages: {', '.join(unknown)} not one of accuracy, speed, search")
    out.mkdir(parents=True, exist_ok=True)  # after every flag is checked: a refused command writes nothing
    load_before = os.getloadavg()
    started = time.time()
    stage_log: list[dict] = []
    # Every invocation (a stopped run resumes) in OUT/runs.json, kept up to date as it goes (a run stopped by SIGTERM
    # or Ctrl-C records the time it ran): the benchmark's wall time is their sum.
    runs = out / "runs.json"
    history = json.loads(runs.read_text()) if runs.exists() else []
    history.append({"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started)), "wall_s": 0.0,
                    "stages": stage_log, "finished": False})

    def note_run(finished: bool = False) -> None:
        history[-1].update(wall_s=round(time.time() - started, 1), finished=finished)
        write_json(runs, history)

    def stopped(signum, frame):  # SIGTERM unwinds like Ctrl-C: the stage's finally notes the time, stops the workers
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stopped)
    note_run()

    def timed_stage(name: str, fn):
        """Runs a stage, noting its wall time and the 1-minute load before and after it (the speed and search stages
        time models: their loads say how quiet the machine was)."""
        before, t0 = os.getloadavg()[0], time.time()
        try:
            return fn()
        finally:
            stage_log.append({"stage": name, "wall_s": round(time.time() - t0, 1), "load_before": round(before, 2),
                              "load_after": round(os.getloadavg()[0], 2)})
            note_run()

    record = {"command": " ".join(["python", "scripts/bench_lra.py", *(argv if argv is not None else sys.argv[1:])]),
              "machine": machine(), "protocol": asdict(protocol), "note": IMAGE_NOTE,
              "accuracy": {}, "speed": {}, "search": {}}
    if "accuracy" in stages:
        results, floors = timed_stage("accuracy", lambda: stage_accuracy(out, protocol, types, args.seed, args.jobs, flag))
        record["accuracy"] = {t: {s: {"ours": r["ours"], "lra": r["lra"], **r} for s, r in rows.items()}
                              for t, rows in results.items()}
        record["accuracy_summary"] = accuracy_summary(record["accuracy"], args.seed, floors)
    if "speed" in stages:
        detail = timed_stage("speed", lambda: stage_speed(out, protocol, types, args.threads, flag))
        record["speed"] = {s: {n: r["steps_per_s_vs_softmax"] for n, r in rows.items()} for s, rows in detail.items()}
        record["speed_detail"] = detail
        record["speed_targets"] = speed_targets(detail, protocol)
    if "search" in stages:
        record["search"] = timed_stage("search", lambda: stage_search(out, protocol, types, args.seed, args.threads,
                                                                        args.jobs, flag))
        record["search_summary"] = search_summary(record["search"])
    previous = out / "lra.json"
    if previous.exists():  # a stage not run this time keeps what an earlier run wrote
        before = json.loads(previous.read_text())
        for key in ("accuracy", "accuracy_summary", "speed", "speed_detail", "speed_targets", "search", "search_summary"):
            if not record.get(key) and before.get(key):
                record[key] = before[key]
    note_run(finished=True)
    record["load"] = {"before": load_before, "after": os.getloadavg(), "wall_s": history[-1]["wall_s"], "stages": stage_log}
    record["wall"] = {"total_s": round(sum(r["wall_s"] for r in history), 1), "runs": len(history)}
    curves = take_curves(record)
    write_json(out / "lra.json", record)
    write_tables(out, record, curves)
    report(record)
    print(f"wrote {out / 'lra.json'} (the benchmark's wall time over {len(history)} run(s): {record['wall']['total_s']:.0f} s)")
    return 0


def report(record: dict) -> None:
    """The figures, each verdict beside its interval."""
    for task, rows in record["accuracy"].items():
        print(f"{task}{' (' + IMAGE_NOTE + ')' if task == 'image' else ''}: test accuracy % [95% interval] (ours / LRA)")
        for spec, r in sorted(rows.items(), key=lambda kv: -kv[1]["ours"]):
            lra = f"{r['lra']:.2f}" if r["lra"] is not None else "-"
            low, high = r.get("ci_low", float("nan")), r.get("ci_high", float("nan"))
            print(f"  {spec:20s} {r['ours']:6.2f} [{low:5.1f}, {high:5.1f}] / {lra}")
        summary = record.get("accuracy_summary", {}).get(task, {})
        if summary.get("kendall_tau_vs_lra") is not None:
            print(f"  ordering vs LRA's over {len(summary['shared_types'])} types: "
                  f"Kendall tau {summary['kendall_tau_vs_lra']:+.2f} (p {summary['kendall_p']:.2f})")
        if "majority_class" in summary:
            print(f"  the most common class is {summary['majority_class']:.1f}% of the test split; above it (95% interval): "
                  f"{len(summary['above_majority'])} of {len(rows)} types")
        if "first_token" in summary:
            print(f"  the first token alone (the most common label after it in training) scores {summary['first_token']:.1f}%;"
                  f" above it (95% interval): {', '.join(summary['above_first_token']) or 'none'}")
        if "softmax_vs_local" in summary:
            d = summary["softmax_vs_local"]
            print(f"  softmax - local: {d['difference']:+.1f} points [{d['ci_low']:+.1f}, {d['ci_high']:+.1f}] ({d['call']};"
                  f" LRA: {d['lra']['softmax'] - d['lra']['local']:+.1f})")
    for spec, rows in record["speed"].items():
        print(f"speed {spec:20s} " + "  ".join(f"{n}: {v:.2f}x" if v else f"{n}: -" for n, v in rows.items()))
    for spec, t in record.get("speed_targets", {}).items():
        ratio = f"{t['steps_per_s_vs_softmax']:.2f}x" if t["steps_per_s_vs_softmax"] is not None else "-"
        print(f"speed target (>= 5x softmax at {t['tokens']} tokens) {spec:20s} {ratio}: {'met' if t['met'] else 'missed'}")
    for task, rows in record["search"].items():
        for e in rows:
            f, u, d = e["found"], e["best_uniform"], e.get("difference", {})
            print(f"search {task} {e['budget_ms']:.3f} ms: found {f['test_accuracy']:.1f}% at {f['measured_ms']:.3f} ms vs "
                  f"uniform {u['test_accuracy']:.1f}% at {u['measured_ms']:.3f} ms: {e['verdict']}"
                  + (f" (difference {d['difference']:+.1f} points [{d['ci_low']:+.1f}, {d['ci_high']:+.1f}])" if d else ""))
    for task, t in record.get("search_summary", {}).items():
        print(f"search {task}: found wins at {t['wins']} of {t['budgets']} budgets ({t['ties']} ties): "
              f"target (2 of 3) {'met' if t['target_met'] else 'missed'}")


if __name__ == "__main__":
    sys.exit(main())
