"""Do inherited supernet weights rank subnets the way training them would?

For N random subnets of a trained supernet's space: validation bits per byte with the
inherited weights, then the same after a short fine-tune of each extracted static model
(``PlainObjective``, the trainer the supernet used).  Prints both and the Kendall tau
between them (target >= 0.6), and saves a scatter plot beside the checkpoint.

    python scripts/bench_ranking.py --supernet runs/bench-train/final.pt --n 10 --steps 100
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from scipy.stats import kendalltau  # noqa: E402

from supernet.checkpoint import load_supernet  # noqa: E402
from supernet.data import check_corpus, prepare_corpus  # noqa: E402
from supernet.task import task_for  # noqa: E402
from supernet.train import PlainObjective, TrainConfig, evaluate_bpb, train  # noqa: E402


def plot(inherited, tuned, tau, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 4.5))
    ax.scatter(inherited, tuned)
    for i, (a, b) in enumerate(zip(inherited, tuned)):
        ax.annotate(str(i), (a, b), fontsize=8, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("validation bits/byte, inherited weights")
    ax.set_ylabel("validation bits/byte, after fine-tuning")
    ax.set_title(f"subnet ranking: Kendall tau {tau:.2f}")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--supernet", default="runs/bench-train/final.pt", help="a train-supernet checkpoint")
    p.add_argument("--n", type=int, default=10, help="random subnets (default 10)")
    p.add_argument("--seed", type=int, default=123, help="seed of the sampled subnets")
    p.add_argument("--steps", type=int, default=100, help="fine-tuning steps per subnet")
    p.add_argument("--lr", type=float, default=1e-3, help="fine-tuning peak learning rate")
    p.add_argument("--eval-batches", type=int, default=16)
    p.add_argument("--threads", type=int, help="CPU threads (default: torch's choice)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    path = Path(args.supernet)
    supernet, payload = load_supernet(path)
    meta, space = payload["meta"], payload["space"]
    cfg = meta["train_config"]
    corpus = prepare_corpus(meta["data"], cache_dir=path.parent, seed=meta["data_seed"], val_fraction=meta["val_fraction"])
    check_corpus(corpus, meta["corpus_hash"], str(path))
    batch, seq = cfg["batch_size"], cfg["seq_len"]

    rng = np.random.default_rng(args.seed)
    subnets: dict[str, object] = {}
    while len(subnets) < args.n:
        s = space.sample(rng)
        subnets.setdefault(s.key, s)
    tune = TrainConfig(batch_size=batch, seq_len=seq, lr=args.lr, min_lr=args.lr / 10, warmup_steps=min(10, args.steps // 5),
                       max_steps=args.steps, eval_interval=args.steps, eval_batches=1, ckpt_interval=10**9, seed=cfg["seed"] + 1)
    print(f"supernet {path} (step {meta['step']}), {args.n} subnets (seed {args.seed}), fine-tune {args.steps} steps "
          f"at lr {args.lr}, batch {batch} x {seq}, validation {args.eval_batches} x {batch} windows")
    print(f"{'#':>2} {'params':>9} {'inherited':>10} {'tuned':>8}  subnet")
    inherited, tuned = [], []
    t0 = time.perf_counter()
    for i, s in enumerate(subnets.values()):
        a = evaluate_bpb(supernet, s, corpus.val, batch, seq, args.eval_batches, meta["seed"])
        static = supernet.extract(s)
        train(static, PlainObjective(task_for(supernet.space)), corpus.train, corpus.val, tune)
        b = evaluate_bpb(static, None, corpus.val, batch, seq, args.eval_batches, meta["seed"])  # the same windows as `a`
        inherited.append(a)
        tuned.append(b)
        print(f"{i:>2} {supernet.num_params(s):>9,} {a:>10.3f} {b:>8.3f}  {s}", flush=True)
    tau = kendalltau(inherited, tuned).statistic
    out = path.parent / "ranking.png"
    plot(inherited, tuned, tau, out)
    print(f"Kendall tau (inherited vs fine-tuned bits/byte, {args.n} subnets): {tau:.3f}  "
          f"(target >= 0.6: {'met' if tau >= 0.6 else 'NOT met'}); {time.perf_counter() - t0:.0f} s; plot {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
