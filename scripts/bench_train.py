"""Ten minutes of supernet training on the default corpus: print the validation curve's end points.

Runs ``nas train-supernet`` (the real command) with a time budget, then reads its
``log.jsonl`` and prints the first and last validation bits per byte of the largest,
the smallest and the fixed random subnets, steps, tokens and throughput.  The curve is
saved as ``curve.png`` in the run directory.  Targets (tiny.yaml, 2 CPU cores, 10 min):
largest < 2.5 and smallest < 3.0 bits per byte.

    python scripts/bench_train.py --out runs/bench-train --max-time 10m --threads 2
    python scripts/bench_train.py --out runs/bench-train --report-only   # re-read a finished run
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGETS = {"largest": 2.5, "smallest": 3.0}


def read_log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot(evals: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name in evals[-1]["bpb"]:
        ax.plot([e["step"] for e in evals], [e["bpb"][name] for e in evals], marker="o", ms=3, label=name)
    for name, target in TARGETS.items():
        ax.axhline(target, ls=":", lw=1, color="grey")
        ax.text(0, target, f" {name} target {target}", va="bottom", fontsize=8, color="grey")
    ax.set_xlabel("step")
    ax.set_ylabel("validation bits per byte")
    ax.set_title("supernet training: validation bits/byte per subnet")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/bench-train", help="run directory (default runs/bench-train)")
    p.add_argument("--space", default="tiny")
    p.add_argument("--max-time", default="10m")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--report-only", action="store_true", help="do not train; summarise the run in --out")
    p.add_argument("extra", nargs=argparse.REMAINDER, help="more train-supernet flags after --")
    args = p.parse_args()
    out = Path(args.out)
    if not args.report_only:
        extra = [a for a in args.extra if a != "--"]
        cmd = [sys.executable, "-m", "nas", "train-supernet", args.space, "--out", str(out), "--max-time", args.max_time,
               "--threads", str(args.threads), *extra]
        print("$", " ".join(cmd[1:]), flush=True)
        rc = subprocess.call(cmd, cwd=ROOT)
        if rc != 0:
            return rc
    events = read_log(out / "log.jsonl")
    evals = [e for e in events if e["event"] == "eval"]
    trains = [e for e in events if e["event"] == "train"]
    end = next((e for e in reversed(events) if e["event"] == "end"), None)
    if not evals or end is None:
        print(f"{out / 'log.jsonl'}: no finished run to report")
        return 1
    cfg = next(e for e in events if e["event"] in ("start", "resume"))["meta"]["train_config"]
    rate = end["tokens"] / end["elapsed"]
    print(f"run {out}: {end['step']} steps, {end['tokens']:,} tokens in {end['elapsed']:.0f} s "
          f"({rate:,.0f} tokens/s overall; batch {cfg['batch_size']} x {cfg['seq_len']}, lr {cfg['lr']})")
    if trains:
        print(f"training tokens/s over the last logging window: {trains[-1]['tokens_per_s']:,.0f}")
    first, last = evals[0], evals[-1]
    print(f"{'subnet':<10}{'bpb @ step ' + str(first['step']):>18}{'bpb @ step ' + str(last['step']):>18}{'target':>9}")
    ok = True
    for name in last["bpb"]:
        target = TARGETS.get(name)
        mark = ""
        if target is not None:
            met = last["bpb"][name] < target
            ok &= met
            mark = f"< {target} {'met' if met else 'NOT met'}"
        print(f"{name:<10}{first['bpb'][name]:>18.3f}{last['bpb'][name]:>18.3f}   {mark}")
    plot(evals, out / "curve.png")
    print(f"curve: {out / 'curve.png'}; targets {'met' if ok else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
