"""The 2D attention types of issue 40 against softmax, the attention alone, forward, on an image's patch grid.

    python scripts/bench_attention_2d.py                     # 56 x 56 image, patch 2: a 28 x 28 grid of 784 tokens
    python scripts/bench_attention_2d.py --image 224 --patch 4 --types softmax,swin:7,swin-shift:7,axial
    python scripts/bench_attention_2d.py --quick --out /tmp/b2d   # a few seconds: what the test runs

An image of ``--image`` x ``--image`` pixels cut into ``--patch`` x ``--patch`` patches gives a grid of
S = image / patch tokens a side, T = S * S in row-major order (what an image model hands its attention).  For
each type: q, k, v (B, H, T, D) drawn from a seeded generator, the type's own weights as it initialises them,
and its bidirectional fast path (what a model's forward runs, ``attend(..., causal=False)``) under
``torch.inference_mode`` on ``--threads`` threads (1 by default).  After a warm-up, ``--reps`` rounds run every
type once each in turn (a change of the host's load hits every type alike); the median per type is reported
with its FLOPs (the type's ``bidirectional_flops``, what the latency features read), and each type's speed-up
over ``softmax`` (one SDPA over every token).

Prints the host's load average at start and end and the target of issue 40 as PASS / FAIL lines: ``swin:W``
(every window type timed) and ``axial`` at least 4x faster than softmax at 56 x 56, patch 2.  Writes
``<out>.json``: the arguments, versions, threads, load, and per type the times of every round.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from search_spaces import parse_attention  # noqa: E402
from supernet.attention import attend, get, kv_heads  # noqa: E402

DEFAULT_TYPES = "softmax,swin:7,swin-shift:7,swin:4,swin-shift:4,axial,convmod2d:7,msla2d:5"
QUICK = ["--image", "8", "--patch", "2", "--heads", "2", "--head-dim", "8", "--reps", "2", "--warmup", "1",
         "--types", "softmax,swin:2,swin-shift:2,axial,convmod2d:3,msla2d:3"]  # fmt: skip
TARGET = 4.0  # swin:W and axial at least 4x faster than softmax, forward, one thread (issue 40, at 56 x 56, patch 2)


def load() -> list[float] | None:
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


def inputs(spec, b: int, h: int, t: int, d: int, seed: int):
    """q, k (None for a type without keys), v and the type's own weights as it initialises them, seeded."""
    g = torch.Generator().manual_seed(seed)
    hk, hv = kv_heads(spec, h)
    q = torch.randn(b, h, t, d, generator=g)
    k = torch.randn(b, hk, t, d, generator=g) if hk else None
    v = torch.randn(b, hv, t, d, generator=g)
    typ = get(spec)
    w = {}
    for name, shape in typ.weights(spec, h, d, max_seq_len=t).items():
        w[name] = torch.empty(shape)
        typ.init_weight(name, w[name], g)
    return q, k, v, w


def targets(ms: dict[str, float], image: int, patch: int) -> list[str]:
    """Issue 40's lines: each window type and axial against softmax (the target holds at 56 x 56, patch 2)."""
    where = f" (the target is set at 56 x 56, patch 2; this is {image} x {image}, patch {patch})"
    where = "" if (image, patch) == (56, 2) else where
    lines = []
    for name in ms:
        if parse_attention(name).kind in ("swin", "swin-shift", "axial"):
            ratio = ms["softmax"] / ms[name]
            verdict = "PASS" if ratio >= TARGET else "FAIL"
            lines.append(f"target: {name} forward {ratio:.2f}x faster than softmax [{verdict} >= {TARGET:g}x]{where}")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--types", default=DEFAULT_TYPES, help="attention types, softmax first (the baseline)")
    p.add_argument("--image", type=int, default=56, help="image side in pixels")
    p.add_argument("--patch", type=int, default=2, help="patch side in pixels (the grid is image / patch a side)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--reps", type=int, default=30, help="timed rounds (every type once per round)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs/bench-attention-2d", help="writes <out>.json")
    p.add_argument("--quick", action="store_true", help="a tiny grid and two rounds: checks the script runs")
    args = p.parse_args(argv)
    if args.quick:
        args = p.parse_args([*QUICK, *(sys.argv[1:] if argv is None else argv)])
    try:
        specs = [parse_attention(s) for s in args.types.split(",")]
    except ValueError as e:
        p.error(f"--types: {e}")
    if str(specs[0]) != "softmax":
        p.error(f"--types: the first type is the baseline and must be softmax, got {specs[0]}")
    lacking = [str(s) for s in specs if "bidirectional" not in get(s).forms]
    if lacking:
        p.error(f"--types: {', '.join(lacking)} has no bidirectional form")
    if args.image < 1 or args.patch < 1 or args.image % args.patch:
        p.error(f"--patch {args.patch} must divide --image {args.image}")
    if min(args.batch, args.heads, args.head_dim, args.reps, args.threads) < 1 or args.warmup < 0:
        p.error("--batch, --heads, --head-dim, --reps and --threads must be at least 1, --warmup at least 0")
    side = args.image // args.patch
    b, h, t, d = args.batch, args.heads, side * side, args.head_dim
    for s in specs:  # a window that does not fit the grid: refused here, not mid-benchmark
        problems = get(s).problems(s, t, (h,))
        if problems:
            p.error(f"--types: {'; '.join(problems)} (grid {side} x {side} = --image {args.image} / --patch {args.patch})")

    torch.set_num_threads(args.threads)
    before = load()
    print(f"grid {side} x {side} = {t} tokens, B={b}, {h} heads of {d}, fp32, {args.threads} thread(s)", flush=True)
    print(f"load average (1, 5, 15 min) at start: {before}", flush=True)
    cells = {str(s): (s, inputs(s, b, h, t, d, args.seed)) for s in specs}

    def run(name: str) -> float:
        s, (q, k, v, w) = cells[name]
        start = time.perf_counter()
        attend(q, k, v, s, w, causal=False)
        return (time.perf_counter() - start) * 1e3

    times: dict[str, list[float]] = {name: [] for name in cells}
    with torch.inference_mode():
        for _ in range(args.warmup):
            for name in cells:
                run(name)
        for _ in range(args.reps):
            for name in cells:
                times[name].append(run(name))
    after = load()

    ms = {name: statistics.median(x) for name, x in times.items()}
    rows = []
    print(f"{'type':16s} {'ms':>9s} {'GFLOP':>8s} {'GFLOP/s':>8s} {'x softmax':>9s}")
    for name, (s, _) in cells.items():
        flops = get(s).bidirectional_flops(s, b, t, h, d)
        row = {"type": name, "ms": ms[name], "times_ms": times[name], "flops": flops,
               "gflops_per_s": flops / ms[name] / 1e6, "speedup_vs_softmax": ms["softmax"] / ms[name]}  # fmt: skip
        rows.append(row)
        print(f"{name:16s} {ms[name]:9.3f} {flops / 1e9:8.3f} {row['gflops_per_s']:8.1f} {row['speedup_vs_softmax']:8.2f}x")
    lines = targets(ms, args.image, args.patch)
    for line in lines:
        print(line)
    print(f"load average (1, 5, 15 min) at end: {after}")
    out = Path(f"{args.out}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "args": vars(args), "grid": side, "tokens": t, "torch": torch.__version__, "python": platform.python_version(),
        "machine": platform.machine(), "processor": platform.processor(), "threads": torch.get_num_threads(),
        "loadavg_before": before, "loadavg_after": after, "rows": rows, "targets": lines,
    }  # fmt: skip
    out.write_text(json.dumps(meta, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
