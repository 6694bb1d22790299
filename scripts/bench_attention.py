"""Benchmark every attention type: sequence length x device x (forward, forward+backward).

    python scripts/bench_attention.py                       # every type, 512 ... 16k, CPU (and CUDA if present)
    python scripts/bench_attention.py --types softmax,local:64 --lengths 4096 --modes fwd,fwdbwd
    python scripts/bench_attention.py --form bidirectional   # the encoder forms (every type that has one)
    python scripts/bench_attention.py --capability avx2 --threads 1 --types softmax,local:64 --lengths 4096
                                                             # torch and the kernels both at AVX2 (a laptop's CPU)

For each cell it records the median time over ``--reps`` runs (after a warm-up; ``--order rounds``, the default: the
types of one length, mode and scope interleaved, one timed run of each per round after ``SETTLE`` untimed ones of its
own, so that the host's drift touches them alike; ``--order cells``: each type's runs back to back), the useful
TFLOP/s (softmax family: 4*D FLOPs per allowed (query, key) pair per head; linear family:
4*F*D per token per head, F the feature size; backward counted as 2.5x forward), the GB/s of
the unavoidable traffic (read q, k, v, write out; backward: also their gradients), and the
peak memory of the tensors a run creates (CUDA: ``max_memory_allocated``; CPU: the same
quantity tracked by a dispatch mode over the warm-up run).  The same is measured for a
whole pre-norm Transformer block (LayerNorm, Q/K/V/O projections, rotary positions,
attention, MLP of 4x width).

Writes ``<out>.csv``, ``<out>.json`` (what produced it: versions, device, threads, load,
arguments) and ``<out>.png``; prints a summary (GFLOP/s, and its share of SDPA's rate: ``xSDPA``),
the host's load average at start and end, and the CPU targets of issue 22 at 4k tokens as PASS /
FAIL lines: ``local:64`` at least 15x faster than ``softmax`` forward and 20x forward+backward;
every efficient type forward at least 40% of SDPA's GFLOP/s and faster than softmax by at least
half its FLOP ratio.  (ONNX Runtime: ``scripts/bench_onnx_attention.py``.)  A cell whose
warm-up run alone takes longer than ``--max-seconds`` is recorded as skipped, and so are the
longer lengths of that type (times only grow with the length).

``--capability avx2`` (or avx512, default) runs the whole benchmark in a subprocess with ``ATEN_CPU_CAPABILITY`` set:
torch's own kernels (SDPA, the GEMMs) and the compiled attention kernels (which follow torch's capability) at that
instruction set, for a fair ratio on a CPU that has more; the targets printed are then issue 39's (local:64 at least
15x softmax forward and forward+backward; every GEMM type at least 40% of SDPA's GFLOP/s).

``--form bidirectional`` times the encoder forms (every query sees every key) of the types that have
one, and prints the encoder check of issue 17 instead: ``linformer:256``, ``xca`` and ``additive`` each
at least 10x faster than bidirectional ``softmax`` at 4k tokens, forward.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from search_spaces import LayerChoice, parse_attention  # noqa: E402
from latency.features import projection_flops  # noqa: E402
from search_spaces.attention import AttentionSpec  # noqa: E402
from supernet.attention import attend, get, kv_heads, native  # noqa: E402
from supernet.model import Block, rope_tables  # noqa: E402

DEFAULT_TYPES = (
    "softmax,gqa:4,local:64,dilated:64:4,strided:64,fixed:64,longformer:64:16,bigbird:64:16:2,"
    "linear,relu-linear,cosformer:16384,performer:64,hydra,sima,lsra:7,msla:5,convmod:7"
)
BIDIRECTIONAL_TYPES = (
    "softmax,gqa:4,local:64,dilated:64:4,longformer:64:16,bigbird:64:16:2,linear,relu-linear,cosformer:16384,"
    "performer:64,hydra,sima,msla:5,linformer:256,additive,xca"
)
ENCODER_TARGET = ("linformer:256", "xca", "additive")  # each >= 10x bidirectional softmax, CPU fp32 fwd at 4k
DEFAULT_LENGTHS = "512,1024,2048,4096,8192,16384"
BACKWARD_FACTOR = 2.5  # backward FLOPs / forward FLOPs (five matmuls against two)


@dataclass
class Row:
    scope: str  # attention | block
    device: str
    dtype: str
    type: str
    seq_len: int
    batch: int
    heads: int
    head_dim: int
    mode: str  # fwd | fwdbwd
    status: str  # ok | skipped | oom
    ms: float = float("nan")
    ms_min: float = float("nan")
    tflops: float = float("nan")
    gbps: float = float("nan")
    peak_mb: float = float("nan")
    reps: int = 0


# --------------------------------------------------------------------------- work models


def attention_flops(spec: AttentionSpec, b: int, h: int, t: int, d: int, backward: bool, causal: bool = True) -> float:
    """The type's own count of its token mixing in the form timed (the latency features use the same)."""
    fwd = get(spec).mixing_flops(spec, b, t, h, d, causal)
    return fwd * (1 + BACKWARD_FACTOR if backward else 1)


def attention_bytes(b: int, h: int, hkv: int, t: int, d: int, itemsize: int, backward: bool) -> float:
    once = (2 * h + hkv) * b * t * d * itemsize  # q, out, k and v (hkv: their heads together)
    return once * (2 if backward else 1)


def block_flops(spec: AttentionSpec, b: int, h: int, t: int, d: int, backward: bool, causal: bool = True) -> float:
    e = h * d
    linear = projection_flops(spec, b * t, e, h, d) + 2.0 * b * t * e * 4 * e * 2  # q, k, v, o; MLP up and down
    fwd = linear + attention_flops(spec, b, h, t, d, False, causal)
    return fwd * (1 + BACKWARD_FACTOR) if backward else fwd


# --------------------------------------------------------------------------- measuring


class LiveTensorBytes(TorchDispatchMode):
    """CPU stand-in for CUDA's ``max_memory_allocated``: the peak bytes of tensor storage created
    (and still alive) while the mode is on, forward and backward alike."""

    def __init__(self):
        super().__init__()
        self.live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.current = self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for key in [key for key, (ref, _) in self.live.items() if ref.expired()]:
            self.current -= self.live.pop(key)[1]
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                storage = t.untyped_storage()
                if storage._cdata not in self.live:
                    self.live[storage._cdata] = (StorageWeakRef(storage), storage.nbytes())
                    self.current += storage.nbytes()
        self.peak = max(self.peak, self.current)
        return out


class PeakMemory:
    """Peak memory of a region in MB: the CUDA allocator's peak, or :class:`LiveTensorBytes` on CPU."""

    def __init__(self, device: torch.device):
        self.device = device
        self.mb = float("nan")

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
        else:
            self.mode = LiveTensorBytes().__enter__()
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.mb = (torch.cuda.max_memory_allocated(self.device) - self.base) / 2**20
        else:
            self.mode.__exit__(*exc)
            self.mb = self.mode.peak / 2**20
        return False


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# Untimed runs of a type before each of its timed runs in a round: another type's run leaves its aftermath (the
# allocator's and the caches' state) for a few runs.  Measured (4k, one thread, load ~0.7): local:64 right after a
# softmax run 12.1 ms, after one run of its own 12.0, after three 10.0, back to back 9.3.
SETTLE = 3


def warm_up(run, device: torch.device, max_seconds: float) -> float | None:
    """One untimed run that measures the peak memory (MB); None if it alone took longer than ``max_seconds``."""
    start = time.perf_counter()
    with PeakMemory(device) as peak:
        run()
    return None if time.perf_counter() - start > max_seconds else peak.mb


def timed(run, device: torch.device) -> float:
    """One run (ms)."""
    _sync(device)
    start = time.perf_counter()
    run()
    _sync(device)
    return (time.perf_counter() - start) * 1e3


def attention_case(spec: AttentionSpec, b: int, h: int, t: int, d: int, device, dtype, backward: bool, gen, causal=True):
    hk, hv = kv_heads(spec, h)
    q = torch.randn(b, h, t, d, generator=gen).to(device, dtype)
    k = torch.randn(b, hk, t, d, generator=gen).to(device, dtype) if hk else None
    v = torch.randn(b, hv, t, d, generator=gen).to(device, dtype)
    shapes = get(spec).weights(spec, h, d, max_seq_len=t)
    w = {n: (0.02 * torch.randn(*s, generator=gen)).to(device, dtype) for n, s in shapes.items()}
    inputs = [x for x in (q, k, v, *w.values()) if x is not None]
    if not backward:

        def run():
            with torch.no_grad():
                attend(q, k, v, spec, w, causal)

        return run
    for x in inputs:
        x.requires_grad_(True)
    grad = torch.randn(b, h, t, d, generator=gen).to(device, dtype)

    def run():
        for x in inputs:
            x.grad = None
        attend(q, k, v, spec, w, causal).backward(grad)

    return run


def block_case(spec: AttentionSpec, b: int, h: int, t: int, d: int, device, dtype, backward: bool, gen, causal=True):
    e = h * d
    block = Block(e, d, LayerChoice(h, 4 * e, str(spec)), max_seq_len=t).to(device, dtype)
    cos, sin = (x.to(device) for x in rope_tables(t, d))
    x = torch.randn(b, t, e, generator=gen).to(device, dtype)
    if not backward:
        block.eval()

        def run():
            with torch.no_grad():
                block(x, (cos, sin), causal=causal)[0]

        return run
    x.requires_grad_(True)
    grad = torch.randn(b, t, e, generator=gen).to(device, dtype)

    def run():
        block.zero_grad(set_to_none=True)
        x.grad = None
        block(x, (cos, sin), causal=causal)[0].backward(grad)

    return run


# --------------------------------------------------------------------------- driver


def run_bench(args, progress=None) -> list[Row]:
    """Every (scope, device, mode, length) group: each type's case is built and warmed up, then the ``--reps`` timed
    runs go in rounds, one run of every type per round, so that a drift of the host (its load, its clock) touches
    every type alike and the ratios between them hold (a type measured minutes after softmax would not); or, with
    ``--order cells``, each type's runs back to back (:func:`measure_group`)."""
    specs = [parse_attention(s) for s in args.types.split(",")]
    lengths = [int(x) for x in args.lengths.split(",")]
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    b, h, d = args.batch, args.heads, args.head_dim
    rows: list[Row] = []
    for scope in args.scopes.split(","):
        for device_name in args.devices.split(","):
            device = torch.device(device_name)
            for mode in args.modes.split(","):
                too_slow: set[str] = set()  # a type whose warm-up ran past --max-seconds: its longer lengths skipped
                for t in lengths:
                    group = [Row(scope, device_name, args.dtype, str(spec), t, b, h, d, mode, "skipped") for spec in specs]
                    rows.extend(group)
                    live = [(row, spec) for row, spec in zip(group, specs) if str(spec) not in too_slow]
                    where = f"{scope} {device_name} {mode} T={t}"
                    note = None if progress is None else lambda text, where=where: progress(f"{where}: {text}", 0)
                    measure_group(live, device, dtype, args, note)
                    too_slow.update(row.type for row, _ in live if row.status != "ok")
                    if progress:
                        for row in group:
                            progress(f"{scope} {device_name} {mode} {row.type} T={t}: {row.status}")
    return rows


def measure_group(cells: list[tuple[Row, AttentionSpec]], device: torch.device, dtype: torch.dtype, args, note=None) -> None:
    """Fill each row with its timings, throughput and peak memory (or mark it skipped / oom): build and warm up every
    cell's case, then ``args.reps`` rounds of one timed run per cell (``args.order`` "cells": each cell's runs back to
    back instead).  ``note(text)``: what it is doing now."""
    make = {"attention": attention_case, "block": block_case}
    causal = args.form == "causal"
    cases = []
    for row, spec in cells:
        backward = row.mode == "fwdbwd"
        if note:
            note(f"warm-up {row.type}")
        try:
            gen = torch.Generator().manual_seed(row.seq_len)
            case = make[row.scope](spec, row.batch, row.heads, row.seq_len, row.head_dim, device, dtype, backward, gen, causal)
            peak = warm_up(case, device, args.max_seconds)
        except torch.OutOfMemoryError:
            row.status = "oom"
            if device.type == "cuda":
                torch.cuda.empty_cache()
            continue
        if peak is not None:  # else it stays "skipped": the warm-up alone took longer than --max-seconds
            row.peak_mb = peak
            cases.append((row, spec, case, []))
    if args.order == "cells":  # each type's runs back to back, one type after the other
        for row, _, case, times in cases:
            if note:
                note(f"{args.reps} runs of {row.type}")
            times.extend(timed(case, device) for _ in range(args.reps))
    else:
        for r in range(args.reps):
            if note:
                note(f"round {r + 1}/{args.reps} of {len(cases)} types")
            for _, _, case, times in cases:
                for _ in range(SETTLE):
                    case()
                times.append(timed(case, device))
    for row, spec, _, times in cases:
        b, h, t, d, backward = row.batch, row.heads, row.seq_len, row.head_dim, row.mode == "fwdbwd"
        row.status, row.reps = "ok", len(times)
        row.ms, row.ms_min = statistics.median(times), min(times)
        flops = (attention_flops if row.scope == "attention" else block_flops)(spec, b, h, t, d, backward, causal)
        row.tflops = flops / (row.ms * 1e-3) / 1e12
        if row.scope == "attention":
            itemsize = torch.finfo(dtype).bits // 8
            row.gbps = attention_bytes(b, h, sum(kv_heads(spec, h)), t, d, itemsize, backward) / (row.ms * 1e-3) / 1e9


def fmt_load(load) -> str:
    return "n/a" if load is None else " ".join(f"{x:.2f}" for x in load)


def write_csv(rows: list[Row], path: Path) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(asdict(rows[0])))
        writer.writeheader()
        for r in rows:
            writer.writerow({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in asdict(r).items()})


def plot(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(r.scope, r.device, r.mode) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.8), squeeze=False)
    kinds = list(dict.fromkeys(r.type for r in rows))
    colors = plt.get_cmap("tab20")
    for ax, (scope, device, mode) in zip(axes[0], panels):
        for n, kind in enumerate(kinds):
            pts = [
                (r.seq_len, r.ms)
                for r in rows
                if (r.scope, r.device, r.mode, r.type) == (scope, device, mode, kind) and r.status == "ok"
            ]
            if pts:
                style = "-" if get(kind).fused_onnx else "--"  # softmax family solid
                ax.plot(*zip(*pts), marker="o", ms=3, label=kind, linestyle=style, color=colors(n % 20))
        ax.set(xscale="log", yscale="log", xlabel="sequence length", ylabel="ms (median)", title=f"{scope}, {device}, {mode}")
        ax.set_xscale("log", base=2)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# the CPU targets at 4k tokens, one thread (issue 22)
TARGET_T = 4096
WINDOW_TARGETS = {"fwd": 15.0, "fwdbwd": 20.0}  # local:64 vs softmax
CAPABILITY_TARGETS = {"avx2": {"fwd": 15.0, "fwdbwd": 15.0}}  # issue 39: torch and the kernels both at that capability
RATE_SHARE = 0.4  # every efficient type: at least this share of SDPA's GFLOP/s, forward
FLOP_RATIO_SHARE = 0.5  # ... and faster than softmax by at least this share of its FLOP ratio
DENSE = ("softmax", "gqa")  # SDPA itself
ELEMENTWISE = ("hydra", "convmod")  # O(T*D) element-wise work, no GEMM: a GFLOP/s target does not apply


def cpu_cells(rows: list[Row], mode: str, t: int) -> dict[str, Row]:
    return {
        r.type: r for r in rows if (r.scope, r.device, r.mode, r.seq_len) == ("attention", "cpu", mode, t) and r.status == "ok"
    }


def speedup_check(rows: list[Row], window: str = "local:64", t: int = TARGET_T, targets: dict | None = None) -> list[str]:
    """The window type against softmax, forward and forward+backward: a PASS / FAIL line each."""
    lines = []
    for mode, need in (targets or WINDOW_TARGETS).items():
        cell = cpu_cells(rows, mode, t)
        if "softmax" in cell and window in cell:
            x = cell["softmax"].ms / cell[window].ms
            verdict = "PASS" if x >= need else "FAIL"
            lines.append(
                f"CPU {mode:7s} T={t}: softmax {cell['softmax'].ms:9.1f} ms, {window} {cell[window].ms:8.1f} ms -> {x:5.2f}x  "
                f"[{verdict} >= {need}x]"
            )
    return lines


def encoder_check(rows: list[Row], t: int = 4096, need: float = 10.0) -> list[str]:
    """Issue 17's CPU target: each of :data:`ENCODER_TARGET` at least ``need`` x faster than bidirectional
    softmax at ``t`` tokens, forward (run with ``--threads 1`` for the target's one thread)."""
    where = ("attention", "cpu", "fwd", t)
    cell = {r.type: r for r in rows if (r.scope, r.device, r.mode, r.seq_len) == where and r.status == "ok"}
    if "softmax" not in cell:
        return []
    base, lines = cell["softmax"].ms, []
    for kind in (k for k in ENCODER_TARGET if k in cell):
        x = base / cell[kind].ms
        lines.append(
            f"CPU fwd     T={t} bidirectional: softmax {base:9.1f} ms, {kind} {cell[kind].ms:8.1f} ms -> {x:6.2f}x  "
            f"[{'PASS' if x >= need else 'FAIL'} >= {need}x]"
        )
    return lines


def rate_check(rows: list[Row], t: int = TARGET_T) -> list[str]:
    """Every efficient type, forward at ``t``: its GFLOP/s against SDPA's (softmax) and its speed-up against
    its FLOP ratio; PASS when both reach the issue's shares."""
    cell = cpu_cells(rows, "fwd", t)
    if "softmax" not in cell:
        return []
    sdpa = cell["softmax"]
    lines = []
    for kind, r in cell.items():
        if parse_attention(kind).kind in DENSE:
            continue
        share = r.tflops / sdpa.tflops
        speedup = sdpa.ms / r.ms
        flop_ratio = attention_flops(parse_attention("softmax"), r.batch, r.heads, t, r.head_dim, False) / attention_flops(
            parse_attention(kind), r.batch, r.heads, t, r.head_dim, False
        )
        ok = share >= RATE_SHARE and speedup >= FLOP_RATIO_SHARE * flop_ratio
        verdict = f"{'PASS' if ok else 'FAIL'}: >= {RATE_SHARE:.0%} and >= {FLOP_RATIO_SHARE * flop_ratio:.1f}x"
        if parse_attention(kind).kind in ELEMENTWISE:
            verdict = "INFO: element-wise, no GEMM"
        lines.append(
            f"CPU fwd T={t} {kind:18s} {1e3 * r.tflops:7.1f} GFLOP/s = {share:5.0%} of SDPA's; {speedup:6.2f}x faster, "
            f"FLOP ratio {flop_ratio:6.1f}x  [{verdict}]"
        )
    return lines


def sdpa_share(rows: list[Row], r: Row) -> float:
    """r's GFLOP/s as a share of SDPA's (softmax) in the same scope, device, mode and length; NaN without it."""
    for s in rows:
        if (s.scope, s.device, s.mode, s.seq_len, s.type, s.status) == (r.scope, r.device, r.mode, r.seq_len, "softmax", "ok"):
            return r.tflops / s.tflops
    return float("nan")


def summary(rows: list[Row]) -> str:
    out = [
        f"{'scope':9s} {'dev':4s} {'mode':6s} {'type':18s} {'T':>6s} {'ms':>10s} {'GFLOP/s':>8s} {'xSDPA':>6s} {'GB/s':>7s} "
        f"{'peak MB':>8s}"
    ]
    for r in rows:
        if r.status == "ok":
            out.append(
                f"{r.scope:9s} {r.device:4s} {r.mode:6s} {r.type:18s} {r.seq_len:6d} {r.ms:10.2f} {1e3 * r.tflops:8.1f} "
                f"{sdpa_share(rows, r):6.2f} {r.gbps:7.1f} {r.peak_mb:8.1f}"
            )
        else:
            out.append(f"{r.scope:9s} {r.device:4s} {r.mode:6s} {r.type:18s} {r.seq_len:6d} {r.status:>10s}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--types", default=None, help="comma-separated attention types (default: one of each with the --form)")
    p.add_argument(
        "--form", choices=("causal", "bidirectional"), default="causal",
        help="the causal (decoder) or bidirectional (encoder) form of each type",
    )
    p.add_argument("--lengths", default=DEFAULT_LENGTHS, help="comma-separated sequence lengths")
    p.add_argument("--devices", default="cpu,cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--modes", default="fwd,fwdbwd")
    p.add_argument(
        "--scopes", default="attention,block", help="attention (the mixing alone) and/or block (a whole Transformer block)"
    )
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument(
        "--order",
        choices=("rounds", "cells"),
        default="rounds",
        help="rounds: one timed run of every type per round, each after SETTLE untimed runs of its own (a drift of the "
        "host touches every type alike); cells: each type's runs back to back (its own steady state, one type after "
        "the other)",
    )
    p.add_argument(
        "--max-seconds", type=float, default=30.0, help="skip a cell (and its longer lengths) whose warm-up run takes longer"
    )
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument(
        "--capability", choices=("default", "avx2", "avx512"), default=None,
        help="run at this CPU capability (ATEN_CPU_CAPABILITY, in a subprocess where this one differs): torch's kernels "
        "and the compiled attention kernels alike",
    )
    p.add_argument(
        "--native",
        choices=("on", "off"),
        default="on",
        help="the compiled kernels (supernet/attention/native.py: the sparse types' window kernel, the linear family's); "
        "off: the block engine and the torch code",
    )
    p.add_argument("--out", default="runs/bench_attention", help="output prefix: <out>.csv, <out>.json, <out>.png")
    args = p.parse_args(argv)
    if args.capability and torch.backends.cpu.get_cpu_capability().lower() != args.capability:
        if os.environ.get("ATEN_CPU_CAPABILITY", "").lower() == args.capability:
            p.error(f"--capability {args.capability}: torch runs at {torch.backends.cpu.get_cpu_capability()} although "
                    f"ATEN_CPU_CAPABILITY={args.capability} (this CPU lacks it?)")
        env = {k: v for k, v in os.environ.items() if k != native.ENV_ISA}  # the kernels follow torch's capability
        env["ATEN_CPU_CAPABILITY"] = args.capability
        return subprocess.call([sys.executable, str(Path(__file__).resolve()), *(sys.argv[1:] if argv is None else argv)],
                               env=env)
    if args.types is None:
        args.types = DEFAULT_TYPES if args.form == "causal" else BIDIRECTIONAL_TYPES
    try:
        for s in args.types.split(","):
            parse_attention(s)
    except ValueError as e:
        p.error(f"--types: {e}")
    no_form = [s for s in args.types.split(",") if args.form not in get(s).forms]
    if no_form:
        p.error(f"--types: {', '.join(no_form)} ha{'s' if len(no_form) == 1 else 've'} no {args.form} form (--form {args.form})")
    if args.threads:
        torch.set_num_threads(args.threads)

    from tqdm import tqdm

    n_cells = (
        len(args.scopes.split(","))
        * len(args.devices.split(","))
        * len(args.modes.split(","))
        * len(args.types.split(","))
        * len(args.lengths.split(","))
    )
    bar = tqdm(total=n_cells, unit="cell", dynamic_ncols=True)

    def progress(label: str, cells: int = 1) -> None:  # cells done (0: a note on the work under way)
        bar.set_postfix_str(label)
        bar.update(cells)

    used, why = native.status()  # builds it now (once, cached), not inside a timed cell
    kernel = f"in use, {native.isa()}" if used and args.native == "on" else f"not used ({'--native off' if used else why})"
    capability = torch.backends.cpu.get_cpu_capability()
    print(f"torch CPU capability {capability}; compiled kernels (window attention, the linear family): {kernel}", flush=True)
    started = time.time()
    load_before = os.getloadavg() if hasattr(os, "getloadavg") else None
    print(f"load average (1, 5, 15 min) at start: {fmt_load(load_before)}", flush=True)
    with native.disabled() if args.native == "off" else contextlib.nullcontext():
        rows = run_bench(args, progress)
    bar.close()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_csv(rows, out.with_suffix(".csv"))
    meta = {
        "argv": sys.argv,
        "args": vars(args),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "seconds": round(time.time() - started, 1),
        "window_kernel": kernel,
        "cpu_capability": capability,
        "kernel_isa": native.isa() if used and args.native == "on" else None,
        "flops_model": "softmax family: 4*D per allowed pair per head; linear family: 4*F*D per token per head; bwd = 2.5x fwd",
    }
    out.with_suffix(".json").write_text(json.dumps(meta, indent=2))
    plot(rows, out.with_suffix(".png"))
    print(summary(rows))
    targets = CAPABILITY_TARGETS.get(capability.lower())
    if targets:
        print(f"targets of issue 39 (torch and the kernels at {capability}):")
    checks = speedup_check(rows, targets=targets) + rate_check(rows) if args.form == "causal" else encoder_check(rows)
    print("\n".join(checks))
    print(f"load average (1, 5, 15 min): {fmt_load(load_before)} at start, {fmt_load(meta['loadavg_after'])} at end")
    print(f"wrote {out.with_suffix('.csv')}, {out.with_suffix('.json')}, {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
