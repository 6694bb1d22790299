"""ONNX Runtime prefill of one attention layer per type: the graph the exporter writes, timed side by side.

    python scripts/bench_onnx_attention.py                      # every exported sparse and linear type at 4k, one thread
    python scripts/bench_onnx_attention.py --custom-ops         # ... and each type's nas.kernels custom-op graph beside it
    python scripts/bench_onnx_attention.py --types softmax,local:64,dilated:64:4,longformer:64:16,linear --length 8192
    python scripts/bench_onnx_attention.py --form bidirectional --types softmax,local:64,longformer:64:16,xca

Each type's token mixing alone (q, k, v in, (B, H, T, D) out; no projections) is exported as the
product exports it (``torch.onnx.export``, dynamo, opset 23, a dynamic sequence axis), checked
against the torch reference at the benchmark length and at a length off every block size, then
timed in ONNX Runtime (CPU, ``--threads`` intra-op threads): a warm-up, then ``--rounds`` rounds
that run every type once each in turn (so a change of the host's load hits every type alike),
median per type.  Prints the times, each type's speed-up against ``softmax``, the host's load
average at start and end, and (causal form) issue 39's targets: local:64 and linear at least 20x
faster than the softmax layer, every sparse type at least 8x.  ``--custom-ops``: each type that has an ONNX
Runtime custom operator (supernet/attention/ort_ops.py) is also exported with it (``TYPE [custom]``: one
``nas.kernels`` node), parity-checked and timed beside its standard graph; the targets are shown for both.
``--form bidirectional`` times the encoder forms instead.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from search_spaces import parse_attention  # noqa: E402
from search_spaces.attention import AttentionSpec  # noqa: E402
from supernet.attention import attend, attend_reference, get, kv_heads  # noqa: E402
from supernet.onnx_export import DEFAULT_OPSET, _quiet, onnx_session  # noqa: E402

# every exported sparse and linear type (issue 39), softmax first: the baseline
DEFAULT_TYPES = (
    "softmax,local:64,dilated:64:4,strided:64,fixed:64,longformer:64:16,bigbird:64:16:2,"
    "linear,relu-linear,cosformer:16384,performer:64,hydra,sima,msla:5,lsra:7,convmod:7"
)
TARGETS = {"local:64": 20.0, "linear": 20.0}  # ONNX Runtime prefill at 4k: at least this much faster than softmax
SPARSE_TARGET = 8.0  # every other sparse (block-pattern) type's exported form
SPARSE = ("local", "dilated", "strided", "fixed", "longformer", "bigbird")
PARITY = 1e-4


class Mixing(torch.nn.Module):
    """One layer's token mixing: attend(q, k, v) for a fixed spelling (no weights of its own)."""

    def __init__(self, spec: AttentionSpec, causal: bool, weights: dict[str, torch.Tensor]):
        super().__init__()
        self.spec, self.causal, self.names = spec, causal, list(weights)
        for name, w in weights.items():  # the type's own weights (xca's temperature, linformer's projections)
            self.register_buffer(name, w)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return attend(q, k, v, self.spec, {n: getattr(self, n) for n in self.names}, causal=self.causal)


def weights(spec: AttentionSpec, h: int, d: int, max_len: int, seed: int) -> dict[str, torch.Tensor]:
    """The type's weights (none for most), seeded, small as at initialisation."""
    g = torch.Generator().manual_seed(seed)
    return {n: 0.02 * torch.randn(*s, generator=g) for n, s in get(spec).weights(spec, h, d, max_seq_len=max_len).items()}


def inputs(spec: AttentionSpec, b: int, h: int, t: int, d: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    hk, hv = kv_heads(spec, h)
    return torch.randn(b, h, t, d, generator=g), torch.randn(b, hk, t, d, generator=g), torch.randn(b, hv, t, d, generator=g)


def export(module: Mixing, example: tuple[torch.Tensor, ...], max_len: int, path: Path) -> Path:
    """As the product exports (inside ``ort_ops.emitting()``: with the custom operators)."""
    from supernet.attention import ort_ops

    seq = torch.export.Dim("seq", max=max_len)
    with _quiet(), torch.no_grad():
        program = torch.onnx.export(
            module.eval(),
            example,
            dynamo=True,
            opset_version=DEFAULT_OPSET,
            dynamic_shapes=({2: seq}, {2: seq}, {2: seq}),
            input_names=["q", "k", "v"],
            output_names=["y"],
            verbose=False,
            custom_translation_table=ort_ops.translation_table(),
        )
        program.save(str(path))
    return path


def parity(session, module: Mixing, x: tuple[torch.Tensor, ...]) -> float:
    out = session.run(None, {n: t.numpy() for n, t in zip("qkv", x)})[0]
    with torch.no_grad():
        w = {n: getattr(module, n) for n in module.names}
        ref = attend_reference(*x, module.spec, w, causal=module.causal).numpy()
    return float(np.abs(out - ref).max())


def target(name: str) -> float | None:
    """Issue 39's target for a timed graph (its custom-op form held to the same): local:64 and linear 20x, every other
    sparse type 8x; None for the rest."""
    spelling = name.removesuffix(" [custom]")
    if spelling in TARGETS:
        return TARGETS[spelling]
    return SPARSE_TARGET if parse_attention(spelling).kind in SPARSE else None


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--types", default=DEFAULT_TYPES, help="attention types, softmax first (the baseline)")
    p.add_argument("--custom-ops", action="store_true", help="also each type's ONNX Runtime custom-op graph, where it has one")
    p.add_argument("--length", type=int, default=4096)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--form", choices=("causal", "bidirectional"), default="causal", help="decoder or encoder form")
    args = p.parse_args(argv)
    try:
        specs = [parse_attention(s) for s in args.types.split(",")]
    except ValueError as e:
        p.error(f"--types: {e}")
    causal = args.form == "causal"
    lacking = [str(s) for s in specs if args.form not in get(s).forms]
    if lacking:
        p.error(f"--types: {', '.join(lacking)} has no {args.form} form")
    if str(specs[0]) != "softmax":
        p.error(f"--types: the first type is the baseline and must be softmax, got {specs[0]}")
    if args.length < 2 or args.rounds < 1:
        p.error(f"--length must be at least 2 and --rounds at least 1, got {args.length} and {args.rounds}")
    torch.manual_seed(args.seed)
    print(f"load average (1, 5, 15 min) at start: {load()}", flush=True)
    b, h, t, d = 1, args.heads, args.length, args.head_dim
    short = max(2, min(t - 1, 333))  # off every block and chunk size
    sessions, feeds = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        from supernet.attention import ort_ops

        forms = [False, True] if args.custom_ops else [False]
        for spec in specs:
            for custom in forms:
                x = inputs(spec, b, h, t, d, args.seed)
                started = time.perf_counter()
                # weights sized for one token more than T: the graph slices them to the length, as a model's below its
                # max_seq_len (at exactly the weights' length the exporter would fix the sequence axis)
                module = Mixing(spec, causal, weights(spec, h, d, t + 1, args.seed))
                with ort_ops.emitting() if custom else contextlib.nullcontext():
                    path = export(module, x, t, Path(tmp) / f"{spec.kind}{'-custom' if custom else ''}.onnx")
                if custom and not ort_ops.uses_custom_ops(path):
                    continue  # no custom operator for this type: its standard graph, timed already
                name = f"{spec} [custom]" if custom else str(spec)
                sessions[name] = session = onnx_session(path, threads=args.threads)
                feeds[name] = {n: a.numpy() for n, a in zip("qkv", x)}
                errs = (parity(session, module, inputs(spec, b, h, short, d, args.seed + 1)), parity(session, module, x))
                print(
                    f"{name:27s} exported in {time.perf_counter() - started:5.1f} s; |ORT - torch reference| T={short}: "
                    f"{errs[0]:.1e}, T={t}: {errs[1]:.1e}  [{'PASS' if max(errs) <= PARITY else 'FAIL'} <= {PARITY:g}]",
                    flush=True,
                )
        for name, session in sessions.items():  # warm-up
            session.run(None, feeds[name])
        times: dict[str, list[float]] = {name: [] for name in sessions}
        for _ in range(args.rounds):
            for name, session in sessions.items():
                start = time.perf_counter()
                session.run(None, feeds[name])
                times[name].append((time.perf_counter() - start) * 1e3)
    base = statistics.median(times["softmax"])
    print(f"ONNX Runtime, {args.form} form, {args.threads} thread(s), B=1, {h} heads of {d}, T={t}, "
          f"median of {args.rounds} interleaved rounds:")
    for name, ts in times.items():
        ms = statistics.median(ts)
        line = f"  {name:27s} {ms:9.2f} ms  {base / ms:6.2f}x softmax"
        need = target(name) if causal else None
        if need is not None:
            line += f"  [{'PASS' if base / ms >= need else 'FAIL'} >= {need:g}x]"
        print(line)
    print(f"load average (1, 5, 15 min) at end: {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
