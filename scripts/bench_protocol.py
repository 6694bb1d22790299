"""Test-retest agreement of the timing protocol's drift corrections, side by side in one run.

    python scripts/bench_protocol.py                       # tiny, decode, torch CPU, 24 subnets
    python scripts/bench_protocol.py --workload prefill --device onnxruntime --samples 16

A timing is only as good as its agreement with itself: the same subnets timed twice.  This
measures that agreement for three ways of reading one protocol run (:func:`latency.timing_core.run_protocol`):

* ``none``: no drift correction (``--no-drift-correction``);
* ``visit``: each visit rescaled by the reference timed before and after it (the default);
* ``paired``: each sample rescaled by the reference samples right before and after it (``--paired``).

Passes alternate ``visit, paired, visit, paired`` (``none`` is read from the ``visit`` passes: their raw
figures), all with the same rounds, samples, seed and reference baseline (measured once, as a campaign
does), so the three see the same machine over the same minutes.  Per setting: the share of subnets whose
two figures agree within ±5% / ±10%, and Kendall tau between the two passes.  Writes ``<out>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np
from scipy.stats import kendalltau
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from latency.device import get_device  # noqa: E402
from latency.protocol import reference_model, timing_model  # noqa: E402
from latency.sampling import campaign_subnets  # noqa: E402
from latency.timing_core import Settings, run_protocol  # noqa: E402
from search_spaces import load_space  # noqa: E402


def agreement(first: list[float], second: list[float]) -> dict:
    ratio = np.asarray(second) / np.asarray(first)
    return {
        "within_5": float(np.mean(np.abs(ratio - 1) <= 0.05)),
        "within_10": float(np.mean(np.abs(ratio - 1) <= 0.10)),
        "tau": float(kendalltau(first, second)[0]),
        "ratio_p5_p95": [float(np.percentile(ratio, 5)), float(np.percentile(ratio, 95))],
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--space", default="tiny")
    ap.add_argument("--workload", default="decode")
    ap.add_argument("--device", default="cpu", help="cpu or onnxruntime (one thread, the thread's CPU clock)")
    ap.add_argument("--samples", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=40)
    ap.add_argument("--min-sample-ms", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="runs/bench_protocol")
    args = ap.parse_args(argv)
    space = load_space(args.space)
    workload = space.workload(args.workload)
    device = get_device(args.device, threads=1, clock="cpu")
    subnets = campaign_subnets(space, args.samples, seed=args.seed)
    models = {s.key: timing_model(space, s) for s in subnets}
    runners = {key: device.prepare(model, workload) for key, model in models.items()}
    reference = device.prepare(reference_model(next(iter(models.values())).config), workload)
    base = dict(rounds=args.rounds, repeats=args.repeats, min_sample_ms=args.min_sample_ms, max_retries=0)
    figures: dict[str, list[list[float]]] = {"none": [], "visit": [], "paired": []}
    bar = tqdm(total=4, desc="passes", unit="pass")
    baseline = None  # the reference time every correction scales to, measured once (as one campaign does)
    for _ in range(2):
        for name in ("visit", "paired"):
            settings = Settings(**base, paired=name == "paired")
            results, baseline = run_protocol(runners, reference, settings, np.random.default_rng(args.seed), baseline_ms=baseline)
            figures[name].append([results[s.key].median_ms for s in subnets])
            if name == "visit":
                figures["none"].append([results[s.key].raw_median_ms for s in subnets])
            bar.update()
    bar.close()
    summary = {name: agreement(*passes) for name, passes in figures.items()}
    print(f"{args.space} {workload}, {args.device}, {len(subnets)} subnets timed twice per setting "
          f"({args.rounds} rounds, {args.repeats} samples of >= {args.min_sample_ms:g} ms)")  # fmt: skip
    print(f"{'correction':<10} {'±5%':>6} {'±10%':>6} {'tau':>6}  retest/test ratio 5th-95th percentile")
    for name, s in summary.items():
        lo, hi = s["ratio_p5_p95"]
        print(f"{name:<10} {s['within_5']:>6.0%} {s['within_10']:>6.0%} {s['tau']:>6.3f}  {lo:.3f} - {hi:.3f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "args": vars(args),
        "load": os.getloadavg()[0],
        "fingerprint": device.fingerprint(),
        "summary": summary,
        "figures": figures,
    }
    out.with_suffix(".json").write_text(json.dumps(meta, indent=2))
    print(f"wrote {out.with_suffix('.json')}")


if __name__ == "__main__":
    main()
