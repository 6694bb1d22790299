"""Stitched timing graphs against one-piece exports: the same models, the same weights, timed side by side.

    python scripts/bench_latency_graphs.py --samples 12 --threads 1            # tiny: prefill and decode
    python scripts/bench_latency_graphs.py --space base --workloads decode --samples 6

ONNX Runtime latency campaigns time graphs stitched from shape-generic parts
(:mod:`latency.onnx_graphs`: one export per attention type, not one per subnet), for prefill and for
the decode step.  A stitched graph computes the model exactly (tests), but is it as fast as the
model's own export?  For ``--samples`` subnets of the space (sampled like a campaign, largest and
smallest included) and each workload, both graphs get the model's weights; ``--rounds`` rounds then
visit the subnets in a fresh random order, each visit timing the two graphs as A, B, A (the order
drawn per visit; each sample back-to-back calls for at least ``--min-sample-ms``, one intra-op
thread, the thread's CPU clock with ``--threads 1``), so that both see the same machine: a visit's
ratio stitched / whole is the mean of A's two samples over B's (or the inverse).  Per subnet: the
median of its visits' ratios, and each graph's fastest sample (ms per call).  Prints these, the
median, min and max ratio per workload and the parity (max |logits| difference) of the two graphs;
writes ``<out>.csv`` and ``<out>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from latency.onnx_graphs import cached_decode_graph, cached_graph, with_weights  # noqa: E402
from latency.protocol import timing_model  # noqa: E402
from latency.sampling import campaign_subnets  # noqa: E402
from latency.timing_core import Settings, calibrate, decode_inputs, ort_runner, prefill_tokens  # noqa: E402
from search_spaces import load_space  # noqa: E402
from supernet.files import atomic_write_csv  # noqa: E402
from supernet.onnx_decode import export_decode_onnx  # noqa: E402
from supernet.onnx_export import export_onnx, onnx_session  # noqa: E402


def graph_pair(model, workload, directory: Path, threads: int):
    """(stitched session, whole session, feed) for ``model`` at ``workload``, both with the model's weights (in ``directory``)."""
    directory.mkdir(parents=True)
    if workload.kind == "decode":
        graph, tensors, layout = cached_decode_graph(model)
        whole = export_decode_onnx(model, directory / "whole.onnx", cached=False)  # the stitched graph's form
        feed = decode_inputs(layout, workload.batch_size, workload.context)
    else:
        graph, tensors = cached_graph(model)
        whole = export_onnx(model, directory / "whole.onnx")
        feed = prefill_tokens(model.config.vocab_size, workload.batch_size, workload.seq_len)
    stitched = with_weights(graph, tensors, model, directory / "stitched")
    return onnx_session(stitched, threads), onnx_session(whole, threads), feed


def timer(session, feed, clock: str, min_ms: float):
    """``sample() -> ms per call`` of back-to-back ``session.run`` calls lasting at least ``min_ms`` (the protocol's runner
    and calibration)."""
    runner = ort_runner(session, feed, clock)
    calls = calibrate(runner, Settings(warmup=1, min_sample_ms=min_ms))
    return lambda: runner(calls) / calls * 1e3


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--space", default="tiny")
    ap.add_argument("--workloads", default=None, help="comma-separated workload names (default: all of the space's)")
    ap.add_argument("--samples", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--min-sample-ms", type=float, default=60.0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="runs/bench_latency_graphs")
    args = ap.parse_args(argv)
    clock = "cpu" if args.threads == 1 else "wall"
    torch.manual_seed(args.seed)
    torch.set_num_threads(max(1, args.threads))
    space = load_space(args.space)
    names = args.workloads.split(",") if args.workloads else [w.name for w in space.workloads]
    subnets = campaign_subnets(space, args.samples, seed=args.seed)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            workload = space.workload(name)
            timers, parity = {}, {}
            for i, subnet in enumerate(tqdm(subnets, desc=f"{workload.name}: export", unit="subnet")):
                model = timing_model(space, subnet)
                stitched, whole, feed = graph_pair(model, workload, Path(tmp) / f"{workload.name}-{i}", args.threads)
                parity[i] = float(np.abs(stitched.run(None, feed)[0] - whole.run(None, feed)[0]).max())
                for graph, session in (("stitched", stitched), ("whole", whole)):
                    timers[i, graph] = timer(session, feed, clock, args.min_sample_ms)  # (calibrating warms it up)
            ms = {k: [] for k in timers}
            ratios = {i: [] for i in range(len(subnets))}
            rng = random.Random(args.seed)
            for _ in tqdm(range(args.rounds), desc=f"{workload.name}: rounds", unit="round"):
                for i in rng.sample(range(len(subnets)), len(subnets)):
                    first, second = rng.sample(["stitched", "whole"], 2)
                    got = {first: [timers[i, first]()], second: [timers[i, second]()]}
                    got[first].append(timers[i, first]())  # first, second, first: the pair shares the machine's state
                    for graph, xs in got.items():
                        ms[i, graph] += xs
                    ratios[i].append(statistics.fmean(got["stitched"]) / statistics.fmean(got["whole"]))
            for i, subnet in enumerate(subnets):
                s, w = min(ms[i, "stitched"]), min(ms[i, "whole"])
                rows.append({"workload": workload.name, "subnet": str(subnet), "stitched_ms": round(s, 5),
                             "whole_ms": round(w, 5), "ratio": round(statistics.median(ratios[i]), 4),
                             "parity": parity[i]})  # fmt: skip
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_csv(out.with_suffix(".csv"), list(rows[0]), rows)
    summary = {}
    print(f"{'workload':<10} {'stitched ms':>11} {'whole ms':>9} {'ratio':>6}  subnet")
    for r in rows:
        print(f"{r['workload']:<10} {r['stitched_ms']:>11.4f} {r['whole_ms']:>9.4f} {r['ratio']:>6.3f}  {r['subnet']}")
    for name in names:
        ratios = [r["ratio"] for r in rows if r["workload"] == name]
        worst = max(r["parity"] for r in rows if r["workload"] == name)
        summary[name] = {
            "median_ratio": statistics.median(ratios),
            "min_ratio": min(ratios),
            "max_ratio": max(ratios),
            "max_parity": worst,
        }
        print(f"{name}: stitched / whole median {summary[name]['median_ratio']:.3f} "
              f"(min {min(ratios):.3f}, max {max(ratios):.3f}) over {len(ratios)} subnets; parity {worst:.2e}")  # fmt: skip
    meta = {"args": vars(args), "clock": clock, "torch": torch.__version__, "python": platform.python_version(),
            "load": os.getloadavg()[0], "summary": summary}  # fmt: skip
    out.with_suffix(".json").write_text(json.dumps(meta, indent=2))
    print(f"wrote {out.with_suffix('.csv')} and {out.with_suffix('.json')}")


if __name__ == "__main__":
    main()
