"""Per-token decode latency against context length, for softmax, local:W and linear layers.

    python scripts/bench_decode.py --threads 1                      # torch + ONNX Runtime on CPU (+ CUDA if present)
    python scripts/bench_decode.py --types softmax,local:256 --contexts 1024,16384 --backends torch

Each candidate is a small model all of one type (default 4 layers, 256 wide, 4 heads of 64,
rotary positions) at one context length: one decode step with a cache "as if" ``context``
tokens had been seen (:func:`supernet.decode.synthetic_cache`; ONNX Runtime:
:func:`supernet.onnx_decode.decode_feed`; no prefill, so 16k contexts are cheap to set up).
Contexts past the model's max_seq_len are fine: rotary angles are computed for any position.

Timing: a warm-up round, then ``--rounds`` rounds; in every round the candidates run in a fresh
random order (interleaved, so that load from other processes spreads over all of them), each
``--steps`` consecutive steps, and the round keeps the median step.  The figure is the median
over rounds (ms per token).  ONNX Runtime runs the exported step graph (``present`` outputs
included, as a generation loop needs them).  The cache's memory is what it holds at that
context (:func:`supernet.decode.cache_bytes`).

Writes ``<out>.csv``, ``<out>.json`` (versions, threads, load, arguments) and ``<out>.png``
(ms/token and cache MB against context, log x); prints the table and, per type and backend,
the ratio of ms/token at the largest context to that at 1k: the issue's target is <= 1.3 for
local and linear while softmax grows.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from search_spaces import LayerChoice, parse_attention  # noqa: E402
from supernet.attention import get  # noqa: E402
from supernet.decode import cache_bytes, decode_step, synthetic_cache  # noqa: E402
from supernet.model import Transformer, TransformerConfig  # noqa: E402

FLAT_TARGET = 1.3


@dataclass
class Row:
    backend: str  # torch-cpu | onnxruntime-cpu | torch-cuda
    type: str
    context: int
    batch: int
    ms_per_token: float
    ms_min: float
    cache_mb: float
    rounds: int
    steps: int


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--types", default="softmax,local:256,linear", help="attention types, comma-separated")
    p.add_argument("--contexts", default="512,1024,2048,4096,8192,16384", help="context lengths, comma-separated")
    p.add_argument("--backends", default="torch,onnx,cuda", help="torch, onnx, cuda (cuda skipped when absent)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--width", type=int, default=256, help="embedding width")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--max-seq-len", type=int, default=1024, help="the model's max_seq_len (contexts may exceed it)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=10, help="consecutive steps timed per candidate per round")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch and ONNX Runtime (default: torch's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="results/bench_decode")
    return p.parse_args(argv)


def build_model(attention: str, args, generator: torch.Generator) -> Transformer:
    parse_attention(attention)
    layers = tuple(LayerChoice(args.heads, 4 * args.width, attention) for _ in range(args.layers))
    cfg = TransformerConfig(256, args.max_seq_len, args.head_dim, "rope", args.width, layers)
    return Transformer(cfg, generator=generator).eval()


class TorchCandidate:
    """One decode step of a torch model on a synthetic cache; the cache goes back to ``context`` every round."""

    def __init__(self, model: Transformer, context: int, args, device: torch.device, gen: torch.Generator):
        self.model, self.context, self.device = model, context, device
        self.cache = synthetic_cache(model, args.batch, context, gen, spare=args.steps * (args.rounds + 2) + 8)
        self.cache_mb = cache_bytes(synthetic_cache(model, args.batch, context, gen, spare=0)) / 2**20
        self.token = torch.randint(0, 256, (args.batch, 1), generator=gen).to(device)

    def reset(self) -> None:
        self.cache.length = self.context  # growing caches: the next steps overwrite the same slots

    def step(self) -> None:
        decode_step(self.model, self.token, self.cache)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


class OnnxCandidate:
    def __init__(self, session, path: Path, context: int, args, rng: np.random.Generator):
        from supernet.onnx_decode import decode_feed

        self.session, self.context = session, context
        self.feed = decode_feed(path, args.batch, context, rng)
        self.cache_mb = sum(a.nbytes for n, a in self.feed.items() if n.startswith("past")) / 2**20

    def reset(self) -> None:
        pass

    def step(self) -> None:
        self.session.run(None, self.feed)

    def sync(self) -> None:
        pass


def measure(candidates: dict[tuple[str, str, int], object], args, rng: np.random.Generator, progress) -> dict:
    """Interleaved rounds; per candidate the list of per-round median step times (ms)."""
    keys = list(candidates)
    for key in keys:  # warm-up
        c = candidates[key]
        c.reset()
        for _ in range(2):
            c.step()
        c.sync()
    rounds: dict = {key: [] for key in keys}
    for _ in range(args.rounds):
        for i in rng.permutation(len(keys)):
            c = candidates[keys[i]]
            c.reset()
            times = []
            for _ in range(args.steps):
                c.sync()
                start = time.perf_counter()
                c.step()
                c.sync()
                times.append((time.perf_counter() - start) * 1e3)
            rounds[keys[i]].append(statistics.median(times))
            progress()
    return rounds


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    types = [t.strip() for t in args.types.split(",") if t.strip()]
    contexts = [int(c) for c in args.contexts.split(",")]
    backends = [b.strip() for b in args.backends.split(",")]
    gen = torch.Generator().manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    models = {t: build_model(t, args, gen) for t in types}

    candidates: dict = {}
    if "torch" in backends:
        for t in types:
            for ctx in contexts:
                candidates[("torch-cpu", t, ctx)] = TorchCandidate(models[t], ctx, args, torch.device("cpu"), gen)
    tmp = tempfile.TemporaryDirectory()
    if "onnx" in backends:
        from supernet.onnx_decode import export_decode_onnx, onnx_session

        for t in types:
            print(f"exporting the {t} decode step to ONNX ...", flush=True)
            path = export_decode_onnx(models[t], Path(tmp.name) / f"{t.replace(':', '_')}.onnx")
            session = onnx_session(path, threads=args.threads)
            for ctx in contexts:
                candidates[("onnxruntime-cpu", t, ctx)] = OnnxCandidate(session, path, ctx, args, rng)
    if "cuda" in backends:
        if torch.cuda.is_available():
            dev = torch.device("cuda")
            for t in types:
                m = build_model(t, args, torch.Generator().manual_seed(args.seed)).to(dev)
                for ctx in contexts:
                    candidates[("torch-cuda", t, ctx)] = TorchCandidate(m, ctx, args, dev, gen)
        else:
            print("no CUDA device: skipping the cuda backend")

    total = len(candidates) * args.rounds
    try:
        from tqdm import tqdm

        bar = tqdm(total=total, desc="decode rounds", unit="cand")
        progress = lambda: bar.update(1)  # noqa: E731
    except ImportError:  # pragma: no cover
        bar, progress = None, lambda: None
    rounds = measure(candidates, args, rng, progress)
    if bar is not None:
        bar.close()
    tmp.cleanup()

    rows = []
    for (backend, typ, ctx), r in rounds.items():
        cache_mb = round(candidates[backend, typ, ctx].cache_mb, 3)
        rows.append(Row(backend, typ, ctx, args.batch, statistics.median(r), min(r), cache_mb, args.rounds, args.steps))
    write_outputs(rows, args)
    report(rows, contexts)
    return 0


def write_outputs(rows: list[Row], args) -> None:
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_suffix(".csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(asdict(rows[0])))
        w.writeheader()
        for r in rows:
            w.writerow(asdict(r))
    import onnxruntime

    meta = {
        "command": " ".join(sys.argv),
        "args": vars(args),
        "torch": torch.__version__,
        "onnxruntime": onnxruntime.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average": os.getloadavg(),
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }
    out.with_suffix(".json").write_text(json.dumps(meta, indent=2) + "\n")
    plot(rows, out.with_suffix(".png"))
    print(f"wrote {out.with_suffix('.csv')}, {out.with_suffix('.json')}, {out.with_suffix('.png')}")


def plot(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax_mem) = plt.subplots(1, 2, figsize=(12, 4.5))
    series = sorted({(r.backend, r.type) for r in rows})
    styles = {"torch-cpu": "-", "onnxruntime-cpu": "--", "torch-cuda": ":"}
    colors = {t: f"C{i}" for i, t in enumerate(sorted({r.type for r in rows}))}
    for backend, typ in series:
        pts = sorted((r.context, r.ms_per_token, r.cache_mb) for r in rows if (r.backend, r.type) == (backend, typ))
        xs = [p[0] for p in pts]
        ax.plot(xs, [p[1] for p in pts], styles.get(backend, "-"), marker="o", color=colors[typ], label=f"{typ} ({backend})")
        if backend != "onnxruntime-cpu":  # same cache as torch's
            label = typ if backend == "torch-cpu" else f"{typ} ({backend})"
            ax_mem.plot(xs, [p[2] for p in pts], marker="o", color=colors[typ], label=label)
    ax.set(xscale="log", yscale="log", xlabel="context (tokens)", ylabel="ms per token", title="decode step latency")
    ax_mem.set(xscale="log", yscale="log", xlabel="context (tokens)", ylabel="cache MB", title="cache memory")
    for a in (ax, ax_mem):
        a.grid(True, which="both", alpha=0.3)
        a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def report(rows: list[Row], contexts: list[int]) -> None:
    print(f"\n{'backend':16} {'type':12} " + " ".join(f"{c:>9}" for c in contexts) + "   cache MB at each context")
    for backend, typ in sorted({(r.backend, r.type) for r in rows}):
        by = {r.context: r for r in rows if (r.backend, r.type) == (backend, typ)}
        ms = " ".join(f"{by[c].ms_per_token:9.3f}" for c in contexts)
        mb = " ".join(f"{by[c].cache_mb:.2f}" for c in contexts)
        print(f"{backend:16} {typ:12} {ms}   {mb}")
    lo, hi = (1024 if 1024 in contexts else min(contexts)), max(contexts)
    print(f"\nratio ms/token at {hi} / at {lo} (target: <= {FLAT_TARGET} for window and linear types, softmax grows):")
    ok = True
    for backend, typ in sorted({(r.backend, r.type) for r in rows}):
        by = {r.context: r.ms_per_token for r in rows if (r.backend, r.type) == (backend, typ)}
        ratio = by[hi] / by[lo]
        spec = parse_attention(typ)
        kind = "kv" if any(st.grows for st in get(spec).state(spec, 4, 64).values()) else "constant"
        if kind == "kv":
            verdict = "grows" if ratio > FLAT_TARGET else "does not grow"
        else:
            verdict = "flat: ok" if ratio <= FLAT_TARGET else "NOT flat"
        ok &= kind == "kv" or ratio <= FLAT_TARGET
        print(f"  {backend:16} {typ:12} {ratio:6.2f}  ({kind} cache: {verdict})")
    print("target met" if ok else "target NOT met")


if __name__ == "__main__":
    raise SystemExit(main())
