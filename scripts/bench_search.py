#!/usr/bin/env python3
"""Benchmark ``nas search``: evolution vs random search at equal evaluations, and the default search's time.

    python scripts/bench_search.py --supernet runs/tiny/latest.pt --predictor runs/lat/predictor.json --budget 8ms

1. For each of ``--seeds`` seeds, evolution and random search run with the same sizes (so the
   same number of evaluations) on the same fitness, latency and budget; printed per seed: the
   best validation loss of each at an equal number of evaluations, and each front's
   hypervolume (points within the budget; reference: the worst loss of the pair, the budget).
2. The default search (125 x 30, SQLite storage, as ``nas search`` runs it) is timed once.

Fitness is the inherited-weight validation loss of the checkpoint's subnets on its own held-out
split (or ``--val-data``).  Without ``--supernet`` the supernet is *untrained* (random weights)
and the held-out bytes are this Python's ``json`` package sources: the numbers then measure the
machinery, not the search; it says so.  Without ``--predictor`` latency is the analytic FLOPs
proxy (``nas.search.AnalyticLatency``), also said in the output.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from nas import search as S  # noqa: E402


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--supernet", help="trained supernet checkpoint (default: an untrained tiny supernet)")
    p.add_argument("--predictor", help="latency predictor file (default: the analytic FLOPs proxy)")
    p.add_argument("--val-data", help="held-out bytes (default: the checkpoint's validation split)")
    p.add_argument("--budget", default="8ms", help="latency budget of the comparison (default 8ms)")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument(
        "--population", type=int, default=50, help="comparison sizes (default 50 / 10 / 20 / 20 / 10: 410 evaluations)"
    )
    p.add_argument("--parents", type=int, default=10)
    p.add_argument("--mutations", type=int, default=20)
    p.add_argument("--crossovers", type=int, default=20)
    p.add_argument("--generations", type=int, default=10)
    p.add_argument("--val-windows", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2: the target machine)")
    p.add_argument("--skip-default", action="store_true", help="do not time the default 125 x 30 search")
    p.add_argument("--skip-compare", action="store_true", help="only time the default search")
    p.add_argument("--json", help="also write the figures to this JSON file")
    return p.parse_args()


def setup(args):
    from search_spaces import load_space
    from supernet import SuperTransformer

    notes = []
    if args.supernet:
        from supernet.checkpoint import load_supernet

        model, payload = load_supernet(args.supernet)
        notes.append(f"supernet {args.supernet} (step {payload.get('state', {}).get('step', '?')})")
    else:
        model, payload = SuperTransformer(load_space("tiny"), torch.Generator().manual_seed(0)).eval(), {"meta": {}}
        notes.append(
            "supernet: UNTRAINED tiny supernet (random weights): losses are near 8 bits and the comparison measures nothing "
            "but the machinery; pass --supernet for meaningful figures"
        )
    space = model.space
    if args.val_data:
        tokens = np.fromfile(args.val_data, dtype=np.uint8)
        notes.append(f"held-out bytes: {args.val_data}")
    elif args.supernet and "data" in payload.get("meta", {}):
        from supernet.data import prepare_corpus

        meta = payload["meta"]
        tokens = prepare_corpus(meta["data"], Path(args.supernet).resolve().parent, meta["data_seed"], meta["val_fraction"]).val
        notes.append(f"held-out bytes: the checkpoint's validation split ({len(tokens):,} bytes)")
    else:
        import json as json_pkg

        tokens = np.frombuffer(
            b"".join(p.read_bytes() for p in sorted(Path(json_pkg.__file__).parent.glob("*.py"))), dtype=np.uint8
        )
        notes.append(f"held-out bytes: this Python's json package sources ({len(tokens):,} bytes)")
    if args.predictor:
        from latency.predictors import load_predictor

        predictor = load_predictor(args.predictor)
        predictor.check_space(space)
        name = getattr(predictor, "name", args.predictor)
        notes.append(f"latency: predictor {args.predictor} ({name})")
    else:
        predictor = S.AnalyticLatency(space)
        name = predictor.name
        notes.append(f"latency: {name}; pass --predictor for a fitted one")
    latency = S.CachedLatency(predictor.predict, name)
    return space, model, tokens, latency, notes


def make_fitness(model, tokens, args) -> S.CachedFitness:
    return S.CachedFitness(S.InheritedLoss(model, tokens, seq_len=args.seq_len, windows=args.val_windows, seed=0))


def search(space, model, fitness, latency, strategy: str, config: S.SearchConfig, budget: float, seed: int, url: str = "memory"):
    label = S.format_ms(budget)
    cons = S.Constraints((S.LatencyBudget(budget, latency, latency.name),))
    seeds = S.feasible_seeds(space, cons, np.random.default_rng([seed, 1]))
    plan = S.BudgetSearch(label, cons, S.STRATEGIES[strategy](space, config, cons.feasible, S.strategy_rng(seed, label), seeds))
    store = S.TrialStore(S.open_study(S.open_storage(url), f"{strategy}-{seed}", {"seed": seed}), space)
    return S.run_search([plan], fitness, latency, model.num_params, store)


def compare(args, space, model, fitness, latency) -> dict:
    budget = S.parse_budget(args.budget)
    config = S.SearchConfig(population=args.population, parents=args.parents, mutations=args.mutations,
                            crossovers=args.crossovers, generations=args.generations)
    print(f"\n== evolution vs random search: budget {S.format_ms(budget)}, {config.evaluations} evaluations each "
          f"({config.population} + {config.generations - 1} x {config.children}), {args.seeds} seeds")
    print(f"{'seed':>4} {'evals':>6} {'evolution':>10} {'random':>10} {'HV evo':>9} {'HV random':>9}  winner")
    rows, wins = [], 0
    for seed in range(args.seeds):
        t0 = time.perf_counter()
        evo = search(space, model, fitness, latency, "evolution", config, budget, seed).records
        rnd = search(space, model, fitness, latency, "random", config, budget, seed).records
        n = min(len(evo), len(rnd))  # equal number of evaluations
        evo, rnd = evo[:n], rnd[:n]
        best_e, best_r = min(r.loss for r in evo), min(r.loss for r in rnd)
        worst = max(r.loss for r in evo + rnd)
        ref = (worst + 1e-9, budget)
        hv_e = S.hypervolume(np.array([[r.loss, r.latency] for r in evo]), ref)
        hv_r = S.hypervolume(np.array([[r.loss, r.latency] for r in rnd]), ref)
        wins += best_e < best_r
        print(f"{seed:>4} {n:>6} {best_e:>10.4f} {best_r:>10.4f} {hv_e:>9.4f} {hv_r:>9.4f}  "
              f"{'evolution' if best_e < best_r else 'random' if best_r < best_e else 'tie'}  ({time.perf_counter() - t0:.0f}s)")
        rows.append(
            {"seed": seed, "evaluations": n, "evolution": best_e, "random": best_r, "hv_evolution": hv_e, "hv_random": hv_r}
        )
    print(f"evolution reaches a lower validation loss than random search in {wins} of {args.seeds} seeds")
    return {"budget_ms": budget, "config": config.to_dict(), "seeds": rows, "evolution_wins": wins}


def time_default(args, space, model, fitness, latency) -> dict:
    config = S.SearchConfig()
    budget = S.parse_budget(args.budget)
    with tempfile.TemporaryDirectory() as tmp:
        url = S.default_storage(tmp)
        print(
            f"\n== default search: evolution {config.population} x {config.generations} generations "
            f"({config.evaluations} evaluations at most), budget {S.format_ms(budget)}, SQLite storage, "
            f"{torch.get_num_threads()} threads"
        )
        t0, c0 = time.perf_counter(), time.process_time()
        result = search(space, model, fitness, latency, "evolution", config, budget, 0, url=url)
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    best = result.best[S.format_ms(budget)]
    print(
        f"default search: {result.evaluations} evaluations in {seconds:.1f} s wall ({seconds / 60:.1f} min, "
        f"{1000 * seconds / max(result.evaluations, 1):.0f} ms each); best loss {best.loss:.4f} at {best.latency:.3f} ms: "
        f"{best.subnet}"
    )
    n = torch.get_num_threads()
    idle = (
        f"about {cpu / 60:.1f} min on one idle core"
        if n == 1
        else f"between {cpu / n / 60:.1f} and {cpu / 60:.1f} min on {n} idle cores"
    )
    print(
        f"default search: {cpu:.1f} s of CPU time with {n} torch thread(s): {idle} (on a busy machine the wall time overstates; "
        f"several threads there also spin while waiting, so --threads 1 measures best)"
    )
    return {
        "seconds": seconds,
        "cpu_seconds": cpu,
        "evaluations": result.evaluations,
        "best_loss": best.loss,
        "best_latency_ms": best.latency,
    }


def main() -> int:
    args = parse_args()
    torch.set_num_threads(args.threads)
    space, model, tokens, latency, notes = setup(args)
    for note in notes:
        print(f"# {note}")
    out = {"notes": notes}
    if not args.skip_compare:  # one fitness cache for both strategies and every seed: a subnet is scored once
        out["compare"] = compare(args, space, model, make_fitness(model, tokens, args), latency)
    if not args.skip_default:  # a fresh cache: the time includes every evaluation
        out["default"] = time_default(args, space, model, make_fitness(model, tokens, args), latency)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
