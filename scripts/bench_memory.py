"""Memory for causal models (issue 57): bits/byte on documents longer than the window, with and without
Transformer-XL's memory, at equal decode latency per token.

    python scripts/bench_memory.py --threads 1                      # the committed run (docs/benchmarks/memory/)
    python scripts/bench_memory.py --quick --out /tmp/bm             # the test: tiny models, a few steps

For each budget (a model size: width, depth, heads, FFN; softmax attention, rotary positions) two spaces differ only
in ``memory:``: **with** (``memory: M``: windows of ``W`` bytes whose first ``M`` are the previous segment's, not
scored) and **without** (``memory`` absent: every position of the window scored).  Both are trained from scratch by
``nas train-subnet`` on the same corpus (the standard library's sources), the same windows of ``W`` bytes, batch,
steps, learning rate and seeds (``--seeds``), and scored on the same **long documents**: ``--docs`` stretches of
``--doc-len`` bytes of the corpus's test split, read token by token through the decoding cache
(:func:`supernet.decode.stream_bits`): with the memory carried across segments, or, without one, the context
restarting every ``W`` bytes (a fresh cache: what a model without memory reads at the same cost per token, since its
step never reads more than ``W - 1`` cached entries either).

Each memory model is also read with its context restarting every window (``with_restart_bpb``): what its memory
adds to the model trained with one, apart from how that training differs from the other's (it scores only the
``W - M`` positions after the memory in each window, and never a position with less than ``M`` bytes before it).

Decode latency per token is measured for both at the step each reads at most (``W - 1`` cached entries; the memory
model's space declares a decode context of ``--doc-len - 1``, which its bounded cache turns into ``W - 1``): one
thread, by the latency campaigns' own protocol (``latency.timing_core.run_protocol``: ``--rounds`` interleaved
rounds, drift-corrected by a reference model, the median); the two must agree (``decode_ratio``, with over without).

The verdict per budget: the mean bits/byte over seeds of each, their difference, the seed SD pooled over every
(budget, variant) cell (``seed_sd``) and whether the difference passes 2 seed SD (the issue's target), beside a paired
t-test over seeds.  Stages resume: a trained model is kept, a started one resumes, scores are cached in
``<out>/runs/``.

Writes ``<out>/memory.json`` (``seed_sd``, ``budgets: [{budget, decode_ms, with_bpb, without_bpb, ...}]``, the
command, machine, load average and date), ``memory.csv`` (one row per model), ``memory.png`` (bits/byte per budget,
seed SD bars) and ``curves.csv`` / ``curves.png`` (each model's training loss).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from curves import plot_curves, read_log, write_curves  # noqa: E402
from latency.devices.cpu import decode_setup, torch_runner  # noqa: E402
from nas_jobs import run_nas, train_subnet_argv  # noqa: E402
from search_spaces import UserError, load_space  # noqa: E402
from search_spaces.space import Workload  # noqa: E402
from supernet.artifact import load_model  # noqa: E402
from supernet.data import prepare_corpus  # noqa: E402
from supernet.decode import stream_bits  # noqa: E402
from supernet.files import atomic_write  # noqa: E402

PROG = "bench_memory"
# budget name -> (embed_dim, depth, heads, ffn_dim)
BUDGETS = {"small": (64, 2, 2, 256), "medium": (128, 3, 4, 512)}
QUICK_BUDGETS = {"small": (32, 1, 1, 64)}

SPACE = """\
name: memory-{budget}-{variant}
task: causal-lm
vocab_size: 256
max_seq_len: {window}
head_dim: 32
positions: rope
{memory}embed_dim: [{embed}]
depth: [{depth}]
layers:
  heads: [{heads}]
  ffn_dim: [{ffn}]
  attention: [softmax]
latency:
  prefill: {{batch_size: 1, seq_len: {window}}}
  decode: {{batch_size: 1, context: {context}}}
"""


def write_space(folder: Path, budget: str, variant: str, dims: tuple[int, int, int, int], window: int, memory: int,
                doc_len: int) -> Path:
    """The space of one (budget, variant): one choice per dimension, so its largest subnet is the model."""
    embed, depth, heads, ffn = dims
    text = SPACE.format(budget=budget, variant=variant, window=window, embed=embed, depth=depth, heads=heads, ffn=ffn,
                        memory=f"memory: {memory}\n" if variant == "with" else "",
                        context=doc_len - 1 if variant == "with" else window - 1)
    path = folder / f"{budget}-{variant}.yaml"
    folder.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:
        atomic_write(path, text)
    return path


def train_argv(space_path: Path, model: Path, seed: int, args) -> list[str]:
    """``nas train-subnet`` of the space's one model into the folder ``model`` (resumed when started:
    :func:`nas_jobs.train_subnet_argv`)."""
    return train_subnet_argv(load_space(str(space_path)).largest(), model, [
        "--space", str(space_path), "--init", "scratch", "--max-steps", str(args.steps), "--seq-len", str(args.window),
        "--batch-size", str(args.batch_size), "--lr", str(args.lr), "--seed", str(seed), "--threads", "1",
        "--eval-interval", "1000000", "--eval-batches", "2", "--ckpt-interval", "100", "--log-interval", "10",
        "--format", "torch", "-q"])  # fmt: skip


def long_documents(root: Path, n: int, length: int, seed: int) -> list[np.ndarray]:
    """``n`` non-overlapping stretches of ``length`` bytes of the default corpus's test split (the split every
    ``nas train-subnet`` run of the default data holds out), at seeded places."""
    corpus = prepare_corpus(None, root)
    test = np.asarray(corpus.test)
    slots = len(test) // length
    if slots < n:
        raise SystemExit(f"{PROG}: the test split holds {slots} stretches of {length} bytes, fewer than --docs {n}")
    picks = np.sort(np.random.default_rng(seed).choice(slots, size=n, replace=False))
    return [test[i * length : (i + 1) * length].astype(np.int64) for i in picks]


def score(model_dir: Path, docs: list[np.ndarray], cache: Path, memory: bool = True) -> float:
    """Bits/byte of the model on the long documents (cached in ``cache``, keyed by the documents): with its memory
    carried across segments, or (``memory=False``) its context restarting every window."""
    key = f"{len(docs)}x{len(docs[0])}:{int(sum(int(d.sum()) for d in docs))}"
    if cache.exists():
        saved = json.loads(cache.read_text())
        if saved.get("docs") == key:
            return float(saved["bpb"])
    with torch.inference_mode():
        bpb = stream_bits(load_model(model_dir).eval(), docs, memory=memory)
    atomic_write(cache, json.dumps({"docs": key, "bpb": bpb}) + "\n")
    return bpb


def decode_ms(models: dict[str, Path], window: int, rounds: int, min_ms: float) -> dict[str, float]:
    """Median ms of one decode step per model, at the step reading ``window - 1`` cached entries: timed by the latency
    protocol of every campaign (:func:`latency.timing_core.run_protocol`: warm-up, interleaved rounds in shuffled
    orders, samples of at least ``min_ms``, a reference model's samples around each visit for the drift correction;
    the reference is the first model's step)."""
    from latency.timing_core import Settings, run_protocol

    w = Workload("decode", 1, 0, "decode", window - 1)
    runners = {name: torch_runner(decode_setup(load_model(d).eval(), w)[0]) for name, d in models.items()}
    settings = Settings(warmup=3, repeats=3 * rounds, rounds=rounds, min_sample_ms=min_ms)
    results, _ = run_protocol(runners, runners[next(iter(runners))], settings, np.random.default_rng(0))
    return {k: r.median_ms for k, r in results.items()}


def paired_p(a: list[float], b: list[float]) -> float | None:
    """Two-sided paired t-test p-value of a against b over seeds (None with fewer than 2 pairs or no spread)."""
    from scipy import stats

    if len(a) < 2 or len(set(x - y for x, y in zip(a, b))) < 2:
        return None
    return float(stats.ttest_rel(a, b).pvalue)


def plot(budgets: list[dict], seed_sd: float, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    x = np.arange(len(budgets))
    for off, key, label in ((-0.18, "without_bpb", "without memory (context restarts every window)"),
                            (0.18, "with_bpb", "with memory (previous segment cached)")):
        ax.bar(x + off, [b[key] for b in budgets], 0.34, yerr=[b[key.replace("bpb", "sd")] for b in budgets],
               capsize=4, label=label)
    ax.set_xticks(x, [f"{b['budget']}\n{b['decode_ms']:.3f} ms/token" for b in budgets])
    ax.set_ylabel("bits/byte on long test documents (lower is better)")
    lo = min(min(b["with_bpb"], b["without_bpb"]) for b in budgets)
    ax.set_ylim(max(0.0, lo - 0.3), None)
    ax.set_title(title + f"\nbars: seed SD (pooled {seed_sd:.4f})", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="docs/benchmarks/memory", help="folder of memory.json (runs under <out>/runs)")
    ap.add_argument("--runs", help="where the models train (default <out>/runs)")
    ap.add_argument("--window", type=int, default=128, help="max_seq_len W of every model (default 128)")
    ap.add_argument("--memory", type=int, default=64, help="the memory M of the 'with' models (default 64)")
    ap.add_argument("--doc-len", type=int, default=1024, help="bytes per long test document (default 1024)")
    ap.add_argument("--docs", type=int, default=48, help="long test documents (default 48)")
    ap.add_argument("--steps", type=int, default=4000, help="training steps of every model (default 4000)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=2, help="models trained at once, one thread each (default 2)")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds (default 7)")
    ap.add_argument("--min-sample-ms", type=float, default=50.0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the scoring and timing (default 1)")
    ap.add_argument("--quick", action="store_true", help="the test: one tiny budget, 2 seeds, a few steps")
    args = ap.parse_args(argv)
    started = time.time()
    budgets = BUDGETS
    if args.quick:
        budgets = QUICK_BUDGETS
        args.window, args.memory, args.doc_len, args.docs, args.steps, args.batch_size = 32, 16, 96, 4, 6, 4
        args.seeds, args.rounds, args.min_sample_ms = 2, 2, 2.0
    if not 0 < args.memory < args.window or args.doc_len <= args.window:
        raise SystemExit(f"{PROG}: needs 0 < --memory < --window < --doc-len")
    torch.set_num_threads(max(1, args.threads))
    out = Path(args.out)
    runs = Path(args.runs) if args.runs else out / "runs"
    spaces = {(b, v): write_space(runs / "spaces", b, v, dims, args.window, args.memory, args.doc_len)
              for b, dims in budgets.items() for v in ("with", "without")}
    models = {(b, v, s): runs / f"{b}-{v}-s{s}" / "model" for b in budgets for v in ("with", "without")
              for s in range(args.seeds)}
    todo = [job for job, model in models.items() if not (model / "model_card.json").exists()]  # the card comes last
    try:
        run_nas([train_argv(spaces[job[:2]], models[job], job[2], args) for job in todo], max(1, args.jobs),
                logs=[models[job].parent / "log.txt" for job in todo])
    except UserError as e:
        raise SystemExit(f"{PROG}: {e}") from None
    docs = long_documents(runs, args.docs, args.doc_len, seed=7)
    rows = []
    for (b, v, s), model in models.items():
        bpb = score(model, docs, runs / f"{b}-{v}-s{s}" / "score.json")
        # the memory model read without its memory (the context restarting every window): what the memory adds to
        # the model trained with one, apart from how that training differs
        restart = score(model, docs, runs / f"{b}-{v}-s{s}" / "score-restart.json", memory=False) if v == "with" else bpb
        rows.append({"budget": b, "variant": v, "seed": s, "bpb": bpb, "bpb_restart": restart, "model": str(model)})
        print(f"{b:<7} {v:<8} seed {s}: {bpb:.4f} bits/byte (its context restarting every window: {restart:.4f})",
              flush=True)
    print(f"timing the decode steps ({args.rounds} interleaved rounds)", flush=True)
    load_before = os.getloadavg()[0]
    timed = decode_ms({f"{b}-{v}": models[(b, v, 0)] for b in budgets for v in ("with", "without")}, args.window,
                      args.rounds, args.min_sample_ms)
    cells = {(r["budget"], r["variant"]): [] for r in rows}
    for r in rows:
        cells[(r["budget"], r["variant"])].append(r["bpb"])
    # the seed SD pooled over every (budget, variant) cell: sqrt of the mean of the cells' variances
    seed_sd = float(np.sqrt(np.mean([statistics.variance(v) for v in cells.values()]))) if args.seeds > 1 else float("nan")
    out_budgets = []
    for b, dims in budgets.items():
        w, wo = cells[(b, "with")], cells[(b, "without")]
        diff = statistics.mean(wo) - statistics.mean(w)
        out_budgets.append({
            "budget": b, "embed_dim": dims[0], "depth": dims[1], "heads": dims[2], "ffn_dim": dims[3],
            "decode_ms": timed[f"{b}-with"], "with_decode_ms": timed[f"{b}-with"], "without_decode_ms": timed[f"{b}-without"],
            "decode_ratio": timed[f"{b}-with"] / timed[f"{b}-without"],
            "with_bpb": statistics.mean(w), "without_bpb": statistics.mean(wo),
            "with_sd": statistics.stdev(w) if len(w) > 1 else float("nan"),
            "without_sd": statistics.stdev(wo) if len(wo) > 1 else float("nan"),
            "with_restart_bpb": statistics.mean(r["bpb_restart"] for r in rows if (r["budget"], r["variant"]) == (b, "with")),
            "with_seeds": w, "without_seeds": wo, "gain_bpb": diff, "gain_in_seed_sd": diff / seed_sd if seed_sd else None,
            "beyond_2_seed_sd": bool(diff > 2 * seed_sd), "paired_p": paired_p(wo, w),
        })
    verdict = ("target met" if all(b["beyond_2_seed_sd"] for b in out_budgets)
               else "target met at " + ", ".join(b["budget"] for b in out_budgets if b["beyond_2_seed_sd"])
               if any(b["beyond_2_seed_sd"] for b in out_budgets) else "target missed")
    print(f"{'budget':<8} {'ms/token':>9} {'with':>8} {'without':>8} {'gain':>8} {'/seed SD':>8}")
    for b in out_budgets:
        print(f"{b['budget']:<8} {b['decode_ms']:>9.4f} {b['with_bpb']:>8.4f} {b['without_bpb']:>8.4f} "
              f"{b['gain_bpb']:>+8.4f} {b['gain_bpb'] / seed_sd if seed_sd else float('nan'):>8.1f}")
    print(f"seed SD (pooled) {seed_sd:.4f}; {verdict} (a gain beyond 2 seed SD at equal decode latency, every budget)")
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "memory.csv", "w") as f:
        f.write("budget,variant,seed,bpb,bpb_restart\n")
        f.writelines(f"{r['budget']},{r['variant']},{r['seed']},{r['bpb']!r},{r['bpb_restart']!r}\n" for r in rows)
    curves = {f"{b}-{v}-s{s}": read_log(m / "train" / "log.jsonl") for (b, v, s), m in models.items()}
    write_curves(curves, out / "curves.csv")
    plot_curves(curves, out / "curves.png", "training loss of every model (with memory: the segment's positions only)")
    title = (f"memory {args.memory} vs none, windows of {args.window} bytes, {args.docs} test documents of "
             f"{args.doc_len} bytes, {args.seeds} seeds")
    plot(out_budgets, seed_sd, out / "memory.png", title)
    meta = {
        "seed_sd": seed_sd, "budgets": out_budgets, "verdict": verdict,
        "target": "with memory lower bits/byte than without at equal decode latency, beyond 2 seed SD",
        "window": args.window, "memory": args.memory, "doc_len": args.doc_len, "docs": args.docs, "steps": args.steps,
        "batch_size": args.batch_size, "lr": args.lr, "seeds": args.seeds,
        "tokens_per_model": args.steps * args.batch_size * args.window,
        "command": "python scripts/bench_memory.py " + shlex.join(argv if argv is not None else sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d", time.gmtime()), "wall_s": round(time.time() - started, 1),
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "load_avg_at_timing": load_before, "load_avg_end": os.getloadavg()[0]},
        "versions": {"torch": torch.__version__, "python": platform.python_version()},
    }
    atomic_write(out / "memory.json", json.dumps(meta, indent=2) + "\n")
    print(f"wrote {out / 'memory.json'} (load average {os.getloadavg()[0]:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
