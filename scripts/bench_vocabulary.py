"""Bytes against a searched subword vocabulary, at the same latency per 1,024 bytes of text (issue 54).

    python scripts/bench_vocabulary.py --out runs/vocab --json docs/benchmarks/vocabulary/vocabulary.json --jobs 2
    python scripts/bench_vocabulary.py --out runs/vq --quick      # the whole path in minutes (tiny plan)
    python scripts/bench_vocabulary.py --out runs/vq --quick --bytes-space tests/fixtures/vocab_quick.yaml \\
        --vocab-space tests/fixtures/vocab_quick_bpe.yaml --data tests/fixtures/...   # the CI test's spaces

Stages (each resumable: run the same command again; a stage whose result file exists is skipped):

1. two supernets of the same steps on the same corpus: ``bytes`` (``long.yaml``, bytes only) and ``searched``
   (``long-bpe.yaml``: the same choices, and the vocabulary searched among bytes and byte-level BPEs trained on the
   training split, nested; ``nas train-supernet``);
2. candidates: the sandwich's extremes and ``samples`` subnets drawn from each space, each scored with inherited
   weights (validation bits per byte of text) and timed with ONNX Runtime (one thread) at the searched space's
   prefill, stated in **bytes of text** (``bytes: 1024``): a subnet of vocabulary ``v`` runs
   ``ceil(bytes / bytes_per_token(v))`` tokens (the tokenizer's bytes per token measured on the validation split,
   from the checkpoint: ``Workload.at_vocab``), all in one campaign with one reference;
3. budgets: ``--budgets`` (ms per 1,024 bytes; the claim benchmark's for ``long.yaml``), else the 25th, 50th and
   75th percentile of the bytes-only candidates' latencies;
4. per budget and space the candidate of the best validation bits per byte at or under the budget;
5. each picked model retrained from scratch at ``seeds`` seeds on the same bytes of text (``nas train-subnet``:
   the same steps, each window the same text: a subword model's windows and token budget are its vocabulary's share
   of the bytes' ones), scored on the *test* split (bits per byte of text: summed loss over the bytes its tokens
   spell); its ``measured_ms`` is the architecture's timing of stage 2 (weights do not change a dense model's time).

Reports ``vocabulary.json`` (``--json``): ``seed_sd`` (the seed standard deviation pooled over the retrained models)
and ``budgets: [{budget_ms, bytes_only: {subnet, test_bpb, measured_ms}, searched: {subnet, vocab, test_bpb,
measured_ms}, verdict}]`` (the searched model better / tie within 2 seed SD / worse), ``simple_baselines`` (unigram
bits per byte of the bytes and of each retrained vocabulary on the whole test split), each stage's wall time and
load (``wall``), with the command, machine and date; beside it ``candidates.csv``, ``models.csv``,
``vocabulary.png`` and ``curves.csv/png``.  ``--jobs 2`` trains two models at a time (one thread each).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from curves import plot_curves, read_log, write_curves  # noqa: E402
from nas_jobs import run_nas, train_subnet_argv  # noqa: E402
from search_spaces import Subnet, UserError, load_space  # noqa: E402

log = logging.getLogger("bench_vocabulary")
ROOT = Path(__file__).resolve().parents[1]
PERCENTILES = (25.0, 50.0, 75.0)


@dataclass(frozen=True)
class Plan:
    """How big each stage is (``FULL``: 75 minutes on the 2-core CPU of docs/benchmarks/vocabulary with ``--jobs 2``:
    the supernets 20, the candidates and their timing 2, the retraining 53 with the check's models; a plan of 800
    supernet steps, 40 candidates a space and 4M bytes a model took 27 minutes without the check)."""

    train_steps: int = 2000  # each supernet's steps
    train_batch: int = 8
    train_seq: int = 256  # supernet windows, in tokens
    samples: int = 100  # candidates drawn from each space (besides the extremes)
    val_windows: int = 32
    val_seq: int = 256
    warmup: int = 2
    repeats: int = 5
    rounds: int = 3
    min_sample_ms: float = 20.0
    tokens: int = 8_000_000  # bytes of text each retrained model reads
    retrain_batch: int = 4
    retrain_seq: int = 1024  # bytes per window (a subword model's windows: its share of these bytes)
    retrain_lr: float = 3e-3
    retrain_warmup: int = 30
    seeds: int = 3
    test_windows: int = 64


FULL = Plan()
QUICK = replace(FULL, train_steps=6, train_batch=2, train_seq=32, samples=4, val_windows=2, val_seq=32, warmup=1, repeats=2,
                rounds=1, min_sample_ms=1.0, tokens=2048, retrain_batch=2, retrain_seq=64, retrain_warmup=1, seeds=2,
                test_windows=2)


# --------------------------------------------------------------------------- pure helpers


def budgets_from(latencies: list[float], given: list[float] | None) -> list[float]:
    """The budgets: the given ones, else the 25th / 50th / 75th percentile of ``latencies`` (the bytes-only candidates')."""
    if given:
        return sorted(given)
    return [round(float(np.percentile(latencies, p)), 4) for p in PERCENTILES]


def best_under(candidates: list[dict], budget: float) -> dict | None:
    """The candidate of the lowest validation bits per byte whose measured ms per 1,024 bytes is within ``budget``."""
    held = [c for c in candidates if c["ms"] <= budget]
    return min(held, key=lambda c: (c["val_bpb"], c["ms"])) if held else None


def largest_under(candidates: list[dict], budget: float) -> dict | None:
    """The candidate of the most parameters whose measured ms is within ``budget`` (a check on the selection: the
    inherited score of a short supernet may prefer a small model that retraining would not)."""
    held = [c for c in candidates if c["ms"] <= budget]
    return max(held, key=lambda c: (c["params"], -c["ms"])) if held else None


# what each budget retrains: (space, report key, rule); the verdict is bytes_only against searched (the contract), the
# largest bytes-only model under the budget a check beside it
ROLES = (("bytes", "bytes_only", best_under), ("bytes", "bytes_largest", largest_under), ("searched", "searched", best_under))


def pooled_sd(groups: list[list[float]]) -> float:
    """The seed standard deviation pooled over models (each a list of its seeds' scores; those of one seed add nothing)."""
    var = [float(np.var(g, ddof=1)) for g in groups if len(g) > 1]
    return float(math.sqrt(np.mean(var))) if var else float("nan")


def verdict(bytes_bpb: float, searched_bpb: float, sd: float) -> str:
    """``better`` when the searched model's test bits/byte are lower beyond 2 seed SD, ``worse`` when higher, else ``tie``."""
    if not math.isfinite(sd):
        return "tie"
    diff = bytes_bpb - searched_bpb
    return "better" if diff > 2 * sd else "worse" if diff < -2 * sd else "tie"


# --------------------------------------------------------------------------- stages


def supernet_argv(space_path: str, out: Path, plan: Plan, args) -> list[str] | None:
    """``nas train-supernet`` of ``space_path`` into ``out`` (None when it finished; ``--resume`` when interrupted)."""
    if (out / "final.pt").exists():
        return None
    argv = ["train-supernet", space_path, "--out", str(out), "--max-steps", str(plan.train_steps), "--batch-size",
            str(plan.train_batch), "--seq-len", str(plan.train_seq), "--eval-interval", str(plan.train_steps),
            "--eval-batches", "1", "--threads", "1", "-q"] + data_flags(args)
    if (out / "latest.pt").exists():
        argv.append("--resume")
    return argv


def data_flags(args) -> list[str]:
    """The corpus flags every command of the run gets (the same data and split for all)."""
    fraction = ["--val-fraction", str(args.val_fraction)] if args.val_fraction else []
    return (["--data", args.data] if args.data else []) + fraction


def bytes_per_token(payload: dict) -> dict[int, float]:
    """A supernet checkpoint's measured bytes per token of each vocabulary (a bytes-only run's: 1)."""
    from supernet.checkpoint import measured_bytes_per_token

    return measured_bytes_per_token(payload) or {payload["space"].vocab_size: 1.0}


def text_prefill(ckpts: dict[str, Path]):
    """The campaign's workload: the searched space's prefill, stated in bytes of text, with each vocabulary's tokens
    (its checkpoint's space: ``Workload.with_bytes_per_token``); the bytes-only space's prefill must be as many bytes."""
    from supernet.checkpoint import load_checkpoint

    spaces = {label: load_checkpoint(path)["space"] for label, path in ckpts.items()}
    workload = spaces["searched"].workload("prefill")
    if not workload.text_bytes:
        raise UserError(f"the vocabulary-searched space {spaces['searched'].name!r} states its prefill in tokens "
                        f"({workload}); state it in bytes of text (latency: {{prefill: {{batch_size: 1, bytes: N}}}}) so "
                        "that every vocabulary reads the same text")
    theirs = spaces["bytes"].workload("prefill")
    if (theirs.text_bytes or theirs.seq_len) != workload.text_bytes or theirs.batch_size != workload.batch_size:
        raise UserError(f"the bytes-only space's prefill ({theirs}) is not the searched space's ({workload})")
    return workload


def candidates(label: str, ckpt: Path, plan: Plan, seed: int, workload) -> list[dict]:
    """The extremes and ``plan.samples`` subnets of the checkpoint's space, each with validation bits per byte (inherited
    weights) and its vocabulary's tokens for the prefill's bytes (``workload``: :func:`text_prefill`); timed later,
    together."""
    from supernet.checkpoint import load_supernet
    from supernet.scoring import inherited_fitness

    supernet, payload = load_supernet(ckpt)
    space = supernet.space
    rng = np.random.default_rng([seed, 7])
    subnets = list(dict.fromkeys([space.largest(), space.smallest(), *(space.sample(rng) for _ in range(plan.samples))]))
    fitness, _ = inherited_fitness(ckpt, supernet, payload, seq_len=min(plan.val_seq, space.max_seq_len),
                                   windows=plan.val_windows, batch_size=8, val_seed=0, device="cpu")
    scores = fitness(subnets)
    return [{"space": label, "subnet": s.to_dict(), "text": str(s), "vocab": space.vocab_of(s), "val_bpb": float(b),
             "prefill_tokens": workload.at_vocab(space.vocab_of(s)).seq_len, "params": int(supernet.num_params(s))}
            for s, b in zip(subnets, scores)]


def time_models(entries: list[dict], ckpts: dict[str, Path], workload, plan: Plan, seed: int, device_name: str) -> list[float]:
    """Median ms of each entry's static model at the prefill's bytes of text (``workload``: each model at its
    vocabulary's tokens, :func:`latency.protocol.measure`); one campaign, one reference (ONNX Runtime, one thread)."""
    from latency.device import get_device
    from latency.protocol import measure, reference_model
    from latency.timing_core import Settings
    from supernet.checkpoint import load_supernet

    supernets = {label: load_supernet(path)[0] for label, path in ckpts.items()}
    device = get_device(device_name, threads=1) if device_name == "onnxruntime" else get_device(device_name)
    models = {str(i): supernets[e["space"]].extract(Subnet.from_dict(e["subnet"])).eval() for i, e in enumerate(entries)}
    settings = Settings(warmup=plan.warmup, repeats=plan.repeats, rounds=plan.rounds, min_sample_ms=plan.min_sample_ms)
    reference = reference_model(supernets["bytes"].extract(supernets["bytes"].space.smallest()).config)  # of bytes
    m = measure(device, models, workload, settings, seed=seed, reference=reference)
    return [float(m.results[str(i)].median_ms) for i in range(len(entries))]


def retrain_argv(entry: dict, space_path: str, out: Path, seed: int, plan: Plan, bpt: float, args) -> list[str] | None:
    """``nas train-subnet`` of the entry from scratch at ``seed`` on ``plan.tokens`` bytes of text (None when done)."""
    if (out / "model_card.json").exists():  # written last: the retraining finished
        return None
    seq = max(8, round(plan.retrain_seq / bpt))  # the same text per window
    steps = max(1, plan.tokens // (plan.retrain_batch * plan.retrain_seq))  # the same steps, so the same bytes in all
    return train_subnet_argv(Subnet.from_dict(entry["subnet"]), out, [  # (--resume: an interrupted one continues)
            "--space", space_path, "--init", "scratch", "--tokens", str(steps * plan.retrain_batch * seq),
            "--batch-size", str(plan.retrain_batch), "--seq-len", str(seq),
            "--lr", str(plan.retrain_lr), "--lr-warmup", str(plan.retrain_warmup), "--seed", str(seed), "--format", "onnx",
            "--eval-interval", str(steps), "--eval-batches", "1", "--threads", "1", "-q", *data_flags(args)])


def split_bytes(args) -> tuple[bytes, bytes]:
    """The corpus's training and test text (the test split, or validation where the corpus had too few documents to
    hold one out), from the bytes supernet's run cache: what every score and baseline of the run reads."""
    from supernet.data import prepare_corpus

    corpus = prepare_corpus(args.data, Path(args.out) / "supernet-bytes", 0, args.val_fraction or 0.05)
    test = corpus.test if len(corpus.test) else corpus.val
    return np.asarray(corpus.train, dtype=np.uint8).tobytes(), np.asarray(test, dtype=np.uint8).tobytes()


def test_bpb(folder: Path, plan: Plan, raw: bytes, bpt: float) -> float:
    """Bits per byte of text of a model folder on fixed windows of the test text ``raw`` (its own tokenizer.json)."""
    from supernet.artifact import load_model, load_vocabulary
    from supernet.heldout import HeldOut

    model, vocab = load_model(folder), load_vocabulary(folder)
    ids = vocab.encode(raw) if vocab.kind == "bpe" else np.frombuffer(raw, dtype=np.uint8).astype(np.int64)
    seq = min(model.config.max_seq_len, max(8, round(plan.retrain_seq / bpt)))
    starts = np.sort(np.random.default_rng([0, 11]).choice(len(ids) - seq, size=min(plan.test_windows, len(ids) - seq),
                                                           replace=False))
    held = HeldOut(ids, starts, seq, token_lengths=vocab.token_lengths())
    return held.bits(model, None, 8, mixed_precision=False)


def unigram_bpb(train_ids: np.ndarray, test_ids: np.ndarray, size: int, test_bytes: int) -> float:
    """Bits per byte of text of a unigram model of ``size`` ids (the training split's counts, add-one) on ``test_ids``,
    which spell ``test_bytes`` bytes: the floor any model that learned something must pass."""
    counts = np.bincount(train_ids, minlength=size).astype(np.float64) + 1.0
    return float(-np.log2(counts / counts.sum())[test_ids].sum() / test_bytes)


def simple_baselines(train: bytes, test: bytes, folders: dict[int, Path]) -> dict[str, float]:
    """Unigram bits per byte on the whole test text: of the bytes, and of each retrained vocabulary's tokens
    (``folders``: vocabulary -> a model folder holding its tokenizer.json)."""
    from supernet.artifact import load_vocabulary

    out = {"byte_unigram_bpb": unigram_bpb(np.frombuffer(train, np.uint8), np.frombuffer(test, np.uint8), 256, len(test))}
    for vocab, folder in sorted(folders.items()):
        v = load_vocabulary(folder)
        if v.kind == "bpe":
            out[f"bpe{vocab}_unigram_bpb"] = unigram_bpb(v.encode(train), v.encode(test), vocab, len(test))
    return out


class Wall:
    """Each stage's wall seconds and 1-minute load before / after, summed over the runs of one folder (``wall.json``):
    a resumed run adds what it did, so the total is the benchmark's, not the last run's (a stage with nothing left to
    do is not called)."""

    def __init__(self, path: Path):
        self.path = path
        self.stages = json.loads(path.read_text()) if path.exists() else {}

    def stage(self, name: str, work):
        load, t0 = os.getloadavg()[0], time.time()
        result = work()
        seconds = time.time() - t0
        entry = self.stages.setdefault(name, {"seconds": 0.0, "runs": []})
        entry["seconds"] = round(entry["seconds"] + seconds, 1)
        entry["runs"].append({"date": time.strftime("%Y-%m-%d %H:%M", time.gmtime(t0)), "seconds": round(seconds, 1),
                              "load_before": round(load, 2), "load_after": round(os.getloadavg()[0], 2)})
        self.path.write_text(json.dumps(self.stages, indent=1) + "\n")
        return result

    def total(self) -> float:
        return round(sum(e["seconds"] for e in self.stages.values()), 1)


def write_tables(report: dict, entries: list[dict], curves: dict[str, list[dict]], folder: Path) -> None:
    """Beside the JSON: ``candidates.csv`` (every timed subnet: inherited validation bits per byte, ms),
    ``models.csv`` (every retrained model and seed: test bits per byte), ``vocabulary.png`` and ``curves.csv/png``."""
    import csv

    with open(folder / "candidates.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["space", "vocab", "subnet", "params", "prefill_tokens", "val_bpb_inherited", "measured_ms"])
        for e in entries:
            w.writerow([e["space"], e["vocab"], e["text"], e["params"], e["prefill_tokens"], f"{e['val_bpb']:.4f}",
                        f"{e['ms']:.4f}"])
    with open(folder / "models.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["budget_ms", "role", "space", "vocab", "subnet", "seed", "test_bpb", "measured_ms", "verdict"])
        for row in report["budgets"]:
            for label, key, _ in ROLES:
                m = row.get(key)
                for seed, bpb in enumerate(m["seeds"] if m else []):
                    w.writerow([f"{row['budget_ms']:.4f}", key, label, m.get("vocab", 256), m["subnet"], seed,
                                f"{bpb:.4f}", f"{m['measured_ms']:.4f}", row["verdict"]])
    write_curves(curves, folder / "curves.csv")
    plot_curves(curves, folder / "curves.png", "every retrained model's training loss per logged step, nats per byte "
                "of text (a subword model's per-token loss / its bytes per token)")
    plot(report, entries, folder / "vocabulary.png")


def plot(report: dict, entries: list[dict], path: Path) -> None:
    """Left: every candidate's inherited validation bits per byte against its ms per 1,024 bytes, by vocabulary;
    right: the retrained picks' test bits per byte (mean of seeds, +-1 SD) per budget."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.5))
    cmap = plt.get_cmap("tab10")
    groups = sorted({(e["space"], e["vocab"]) for e in entries})
    for i, (label, vocab) in enumerate(groups):
        pts = [e for e in entries if (e["space"], e["vocab"]) == (label, vocab)]
        left.scatter([e["ms"] for e in pts], [e["val_bpb"] for e in pts], s=14, color=cmap(i % 10),
                     marker="o" if label == "bytes" else "^",
                     label=f"{label} space, " + ("bytes" if vocab == 256 else f"BPE {vocab}"))
    left.set(xlabel="measured ms per 1,024 bytes of text (prefill, ONNX Runtime, 1 thread)",
             ylabel="validation bits per byte, inherited weights (untrained slices)",
             title="candidates (the supernets' slices, not retrained)")
    for ax in (left, right):
        for row in report["budgets"]:
            ax.axvline(row["budget_ms"], color="grey", linestyle=":", linewidth=1)
        ax.grid(alpha=0.3)
    names = {"bytes_only": "bytes-only, best by inherited score", "bytes_largest": "bytes-only, most parameters (check)",
             "searched": "vocabulary-searched, best by inherited score"}
    for j, (key, name) in enumerate(names.items()):
        pts = [r[key] for r in report["budgets"] if r.get(key)]
        right.errorbar([m["measured_ms"] for m in pts], [m["test_bpb"] for m in pts],
                       yerr=[float(np.std(m["seeds"], ddof=1)) if len(m["seeds"]) > 1 else 0.0 for m in pts],
                       fmt="os^"[j], ms=8, capsize=3, color=cmap(j), label=name)
    for k, (name, bpb) in enumerate(sorted(report.get("simple_baselines", {}).items())):
        right.axhline(bpb, color="grey", linestyle=("--", "-.", ":")[k % 3], linewidth=1,
                      label=name.replace("_bpb", "").replace("_", " ") + f" (whole test split) {bpb:.2f}")
    right.set(xlabel="measured ms per 1,024 bytes of text", ylabel="test bits per byte, retrained (mean of seeds, +-1 SD)",
              title=f"retrained at {len(report['budgets'])} budgets (dotted); seed SD {report['seed_sd']:.4f}")
    left.legend(fontsize=7)
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def machine() -> dict:
    return {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "python": platform.python_version(),
            "load_1min": round(os.getloadavg()[0], 2)}


# --------------------------------------------------------------------------- the run


def run(args, plan: Plan) -> dict:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    spaces = {"bytes": args.bytes_space, "searched": args.vocab_space}
    wall = Wall(out / "wall.json")
    ckpts = {label: out / f"supernet-{label}" / "final.pt" for label in spaces}
    if todo := [a for label, path in spaces.items() if (a := supernet_argv(path, ckpts[label].parent, plan, args))]:
        wall.stage("supernets", lambda: run_nas(todo, args.jobs))

    found = out / "candidates.json"
    if found.exists():
        entries = json.loads(found.read_text())
    else:
        workload = text_prefill(ckpts)
        entries = wall.stage("candidates", lambda: [e for label, path in ckpts.items()
                                                    for e in candidates(label, path, plan, args.seed, workload)])
        timed = wall.stage("timing", lambda: time_models(entries, ckpts, workload, plan, args.seed, args.device))
        for e, ms in zip(entries, timed):
            e["ms"] = ms
        found.write_text(json.dumps(entries, indent=1))

    from supernet.checkpoint import load_checkpoint

    bpts = {label: bytes_per_token(load_checkpoint(path)) for label, path in ckpts.items()}
    by_space = {label: [e for e in entries if e["space"] == label] for label in spaces}
    budgets = budgets_from([e["ms"] for e in by_space["bytes"]], args.budgets)
    picks = {(budget, key): (label, rule(by_space[label], budget)) for budget in budgets for label, key, rule in ROLES}

    def folder(label: str, pick: dict, seed: int) -> Path:  # a model picked at several budgets is retrained once
        return out / "retrained" / f"{label}-{Subnet.from_dict(pick['subnet']).key}-seed{seed}"

    retrains = {}
    for label, pick in picks.values():
        for seed in range(plan.seeds if pick else 0):
            path = folder(label, pick, seed)
            if path not in retrains and (a := retrain_argv(pick, spaces[label], path, seed, plan,
                                                           bpts[label][pick["vocab"]], args)):
                retrains[path] = a
    if retrains:
        wall.stage("retrain", lambda: run_nas(list(retrains.values()), args.jobs))
    train_text, test_text = split_bytes(args)
    scored: dict[Path, float] = {}  # a model picked at several budgets (or roles) is scored once

    def score(path: Path, bpt: float) -> float:
        if path not in scored:
            scored[path] = test_bpb(path, plan, test_text, bpt)
        return scored[path]

    rows, groups, seen, curves = [], [], set(), {}
    for budget in budgets:
        row = {"budget_ms": budget}
        for _, key, _ in ROLES:
            label, pick = picks[budget, key]
            if pick is None:
                row[key] = None
                continue
            bpt = bpts[label][pick["vocab"]]
            scores = [score(folder(label, pick, seed), bpt) for seed in range(plan.seeds)]
            name = Subnet.from_dict(pick["subnet"]).key
            for seed in range(plan.seeds):  # in nats per byte of text, so vocabularies share the plot's axis
                curves[f"{label} {pick['vocab']} {name} seed{seed}"] = [
                    {**pt, "loss": pt["loss"] / bpt} for pt in read_log(folder(label, pick, seed) / "train" / "log.jsonl")]
            if (label, name) not in seen:  # each model's seeds count once in the pooled SD
                seen.add((label, name))
                groups.append(scores)
            row[key] = {"subnet": pick["text"], "test_bpb": float(np.mean(scores)), "measured_ms": pick["ms"],
                        "seeds": scores, "val_bpb_inherited": pick["val_bpb"], "params": pick["params"],
                        "prefill_tokens": pick["prefill_tokens"]}
            if label == "searched":
                row[key]["vocab"] = pick["vocab"]
        rows.append(row)
    sd = pooled_sd(groups)
    simple = simple_baselines(train_text, test_text,
                              {pick["vocab"]: folder(label, pick, 0) for label, pick in picks.values() if pick})
    for row in rows:
        for key, against in (("verdict", "bytes_only"), ("verdict_vs_bytes_largest", "bytes_largest")):
            both = row.get(against) and row.get("searched")
            row[key] = verdict(row[against]["test_bpb"], row["searched"]["test_bpb"], sd) if both else "no model"
    report = {
        "command": "python scripts/bench_vocabulary.py " + " ".join(args.argv),
        "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "machine": machine(),
        "seconds": wall.total(),
        "wall": wall.stages,
        "plan": asdict(plan),
        "spaces": spaces,
        "bytes_per_token": {label: {str(k): v for k, v in b.items()} for label, b in bpts.items()},
        "latency": f"ms per {load_space(spaces['bytes']).workload('prefill').seq_len:,} bytes of text (prefill), ONNX Runtime, "
                   "one thread; each model at its vocabulary's tokens for those bytes",
        "seed_sd": sd,
        "simple_baselines": simple,
        "budgets": rows,
        "wins": sum(r["verdict"] == "better" for r in rows),
        "wins_vs_bytes_largest": sum(r["verdict_vs_bytes_largest"] == "better" for r in rows),
    }
    path = Path(args.json) if args.json else out / "vocabulary.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1, default=float) + "\n")
    write_tables(report, entries, curves, path.parent)
    log.info("wrote %s: searched better at %d of %d budgets (seed SD %.4f)", path, report["wins"], len(rows), sd)
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="the run folder (resumable)")
    p.add_argument("--json", help="where to write vocabulary.json (default OUT/vocabulary.json)")
    p.add_argument("--quick", action="store_true", help="the whole path in minutes")
    p.add_argument("--bytes-space", default="long", help="the bytes-only space (default long)")
    p.add_argument("--vocab-space", default="long-bpe", help="the space that searches the vocabulary (default long-bpe)")
    p.add_argument("--data", help="the corpus (default: the Python standard library's sources)")
    p.add_argument("--val-fraction", type=float, default=None, help="validation share of the corpus (default 0.05)")
    p.add_argument("--budgets", type=lambda t: [float(x) for x in t.split(",")], help="ms per prefill of bytes, comma-separated")
    p.add_argument("--device", default="onnxruntime", help="the timing device (default onnxruntime)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=1, help="trainings at a time, one thread each (the supernets, then the "
                   "retrained models; the timing stage runs alone)")
    args = p.parse_args(argv)
    if args.jobs < 1:
        p.error(f"--jobs: {args.jobs} is not a positive number of trainings at a time")
    args.argv = list(argv if argv is not None else sys.argv[1:])
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    try:
        run(args, QUICK if args.quick else FULL)
    except UserError as e:
        print(f"bench_vocabulary: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
