"""How well do FLOPs, parameter count and a latency predictor rank subnets by measured latency?

    python scripts/bench_latency_proxies.py runs/lat-cpu.csv --predictor runs/pred-cpu

On the held-out subnets (the table's re-measured ones, or a seeded 20%), prints the Kendall tau
and Spearman rho with measured latency of: FLOPs, parameters, the predictor's model kind
refitted without the held-out subnets, and a second measurement (test-retest, the ceiling).
The saved predictor (fitted on every row) is shown too, marked in-sample.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from scipy.stats import kendalltau, spearmanr

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from latency import features as F  # noqa: E402
from latency.predictors import load_predictor  # noqa: E402
from latency.predictors.predictor import MODELS, subnet_matrix  # noqa: E402
from latency.predictors.select import holdout  # noqa: E402
from latency.table import read_timings  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("timings")
    p.add_argument("--predictor", required=True)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    t = read_timings(args.timings)
    predictor = load_predictor(args.predictor)
    if predictor.name not in MODELS:
        p.error(f"--predictor: {args.predictor} is a {predictor.name} predictor (few-shot, from other devices' predictors); "
                f"this compares a model refitted on the table: give one fitted from scratch ({', '.join(MODELS)})")
    predictor.check_space(t.space)
    measured, second = t.passes("measure"), t.passes("retest")
    keys = list(measured)
    subnets = [measured[k].subnet for k in keys]
    y = np.array([measured[k].median_ms for k in keys])
    forced = np.array([k in second for k in keys])
    test = holdout(len(keys), 0.2, args.seed, forced if forced.sum() >= 5 else None)
    x, _ = subnet_matrix(predictor.name, t.space, t.workload, subnets)
    refit = MODELS[predictor.name]().fit(x[~test], y[~test], args.seed)
    w = t.workload
    proxies = {
        "FLOPs": np.array([F.flops(t.space, s, w) for s in subnets]),
        "parameters": np.array([F.params(t.space, s) for s in subnets]),
        f"predictor ({predictor.name}, refit w/o held-out)": refit.predict(x),
        f"predictor ({predictor.name}, saved; in-sample)": predictor.predict(subnets),
    }
    fp = t.fingerprint
    print(f"{args.timings}: {len(keys)} subnets, {fp.get('device')} / {fp.get('runtime')} / threads {fp.get('threads')}, "
          f"workload {w.name} {w.batch_size}x{w.seq_len}; held out {int(test.sum())}")
    print(f"{'proxy':<48}{'tau (held-out)':>15}{'rho (held-out)':>15}{'tau (all)':>11}")
    for name, v in proxies.items():
        print(f"{name:<48}{kendalltau(v[test], y[test]).statistic:>15.3f}{spearmanr(v[test], y[test]).statistic:>15.3f}"
              f"{kendalltau(v, y).statistic:>11.3f}")
    if forced.sum() >= 5:
        again = np.array([second[k].median_ms for k, m in zip(keys, test) if m])
        print(f"{'second measurement (test-retest ceiling)':<48}{kendalltau(again, y[test]).statistic:>15.3f}"
              f"{spearmanr(again, y[test]).statistic:>15.3f}{'':>11}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
