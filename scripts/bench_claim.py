"""The measured claim: does the search find better models than hand-scaled Transformers, after retraining?

    python scripts/bench_claim.py --out runs/claim          # long.yaml, ONNX Runtime on this CPU (about 2.5 hours)
    python scripts/bench_claim.py --out runs/claim --quick  # the whole path in minutes (long.yaml, tiny budgets)
    python scripts/bench_claim.py --out runs/q --quick --space tests/fixtures/claim_quick.yaml   # the CI test's space

Stages (each the documented command, each resumable: run the same command again):

1. two supernets of the same steps, one thread each, side by side: ``shared`` (``--balance types``: the sandwich's
   largest and smallest rotate over the attention types; one Q/K/V/O for all) and ``split`` (the same plus
   ``--split families``: Q/K/V/O per attention family from half-way, few-shot NAS);
2. time subnets with ONNX Runtime (one thread, the thread's CPU time) and fit a latency predictor;
3. three budgets: the lowest under every type's largest uniform model (so that each type's ladder reaches past it:
   0.9 x the fastest type's largest uniform model, or the 25th percentile of the measured latencies if lower), the
   50th and the 75th percentile;
4. baselines: per budget and attention type the largest uniform model under the budget (checked on the device), the
   largest softmax model; a held-out set of mixed subnets spread over the latencies;
5. retrain every baseline from scratch (``nas train-subnet``: the same tokens, seed, schedule and data for all);
6. fit the calibrated ranker on the retrained baselines' *validation* loss (``nas fit-accuracy``);
7. search with it (``nas search --fitness calibrated:DIR``): each type's largest uniform model opens the first
   generation; the top candidates and the hurdle cohort are timed on the device; successive halving from scratch
   (``--hurdles --hurdle-from scratch``) among those that hold picks the found model;
8. retrain the found models and the held-out mixed set; 9. time every retrained export side by side (one campaign)
   and score every model on the *test* split, which no search, ranker or training saw;
10. retrain the found model and the best baseline of each budget at two more seeds and score them.

Reports (``claim.json``, ``claim.csv``, ``claim.png``): each ranker's Kendall tau against retrained test bits/byte
on the held-out models (the mixed set and the found models: no ranker was fitted on them), with a bootstrap 95%
interval; the seed standard deviation; per budget the found model against the best uniform model at or below its
measured latency, judged with that noise (better / tie within 2 SD / worse); the speedup over uniform softmax at
equal test bits/byte along the retrained softmax ladder (or the bound, where the ladder never reaches the found
model); whether every found model holds its budget on the device.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import math
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from nas.demo import Stages, budget_from_table, run_stage_command  # noqa: E402
from nas_jobs import run_nas, train_subnet_argv  # noqa: E402
from search_spaces import Subnet, UserError, load_space  # noqa: E402

log = logging.getLogger("bench_claim")
PERCENTILES = (25.0, 50.0, 75.0)
RANKERS = ("calibrated", "inherited", "few-shot split", "parameters", "FLOPs")


@dataclass(frozen=True)
class Plan:
    """How big each stage is; ``FULL`` takes about 5-6 hours on an idle 2-core CPU (twice the retraining when the
    rank-stability check doubles the token budget)."""

    train_steps: int = 800  # steps of each supernet (one thread each, the two side by side)
    train_batch: int = 8
    split_at: float = 0.5
    samples: int = 60  # subnets timed (+ 20% re-measured)
    warmup: int = 2
    repeats: int = 5
    rounds: int = 3
    min_sample_ms: float = 20.0
    population: int = 24
    parents: int = 6
    mutations: int = 9
    crossovers: int = 9
    generations: int = 6
    val_windows: int = 32  # fitness windows (each as long as the prefill): the search's and the ranker's
    hurdles: int = 2  # rounds of successive halving from scratch among the device-verified candidates
    hurdle_candidates: int = 4
    hurdle_tokens: str = "500K"  # per round (batch retrain_batch x the prefill)
    verify_top: int = 3
    verify_margin: float = 3.0  # percent under the budget a verified candidate must measure (the final campaign's noise)
    baseline_checks: int = 2  # largest uniform models per (budget, type) timed on the device
    fit_mixed: int = 20  # random mixed subnets (2-4 types) retrained for the ranker's fit, beside the uniform ladders
    heldout_mixed: int = 20  # random mixed subnets retrained as held-out models for the rankers (no ranker sees them)
    stability: int = 3  # uniform and mixed models each, retrained at the token budget and at twice it
    stability_tau: float = 0.8  # Kendall tau between the two below which the budget is doubled
    min_seeded: int = 5  # models retrained at every seed (the seed SD is pooled over them)
    # every model's retraining: 4M tokens = 976 steps of 4 x 1024 bytes
    tokens: str = "4M"
    retrain_batch: int = 4
    retrain_lr: float = 3e-3
    retrain_warmup: int = 30
    seeds: int = 3  # the found model and the best baseline of each budget
    jobs: int = 2  # retrainings at a time (one thread each)
    test_windows: int = 64
    compare_repeats: int = 7
    compare_rounds: int = 4
    bootstrap: int = 20000
    quiet_poll: float = 10.0  # seconds between the load checks before a timed stage (3 under --max-load in a row)


FULL = Plan()
QUICK = replace(
    FULL, train_steps=12, train_batch=2, samples=10, repeats=3, rounds=2, min_sample_ms=5.0, population=6, parents=2,
    mutations=2, crossovers=2, generations=2, val_windows=4, hurdles=1, hurdle_candidates=2, hurdle_tokens="8K",
    verify_top=2, baseline_checks=1, fit_mixed=4, heldout_mixed=4, stability=2, min_seeded=3, tokens="8K",
    retrain_warmup=2, test_windows=4, compare_repeats=3, compare_rounds=2, bootstrap=200, seeds=2, quiet_poll=1.0,
    stability_tau=-2.0,  # (the check runs and is reported; the quick run keeps its budget whatever it says)
)  # fmt: skip


# --------------------------------------------------------------------------- helpers


def parse_tokens(text: str) -> int:
    mult = {"K": 10**3, "M": 10**6, "G": 10**9}.get(text[-1:].upper(), 1)
    return int(float(text[:-1] if mult > 1 else text) * mult)


class _FilesDevice:
    """Times each model from its own exported ``model.onnx`` (ONNX Runtime, CPU), the reference as the wrapped device does."""

    def __init__(self, device, files: dict[int, Path]):
        self.device, self.files, self.name = device, files, device.name

    def fingerprint(self) -> dict:
        return self.device.fingerprint()

    def prepare(self, model, workload):
        if id(model) not in self.files:
            return self.device.prepare(model, workload)
        from latency.timing_core import ort_runner, prefill_tokens
        from supernet.onnx_export import onnx_session

        session = onnx_session(self.files[id(model)], threads=self.device.threads)
        return ort_runner(
            session, prefill_tokens(model.config.vocab_size, workload.batch_size, workload.seq_len), self.device.clock
        )


def attention_share(space, threads: int = 1, runs: int = 5) -> dict:
    """ONNX Runtime's profile of the largest subnet at the prefill workload: the share of node time in attention ops."""
    import onnxruntime as ort

    from latency.onnx_graphs import cached_graph
    from latency.protocol import timing_model
    from latency.timing_core import materialize_weights, prefill_tokens

    model = timing_model(space, space.largest(), materialize=False)
    graph, tensors = cached_graph(model)
    w = space.workload()
    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / graph.name
        local.write_bytes(graph.read_bytes())
        materialize_weights(str(local.with_suffix(".weights")), tensors)
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        options.enable_profiling, options.profile_file_prefix = True, str(Path(tmp) / "profile")
        session = ort.InferenceSession(str(local), options, providers=["CPUExecutionProvider"])
        feed = prefill_tokens(space.vocab_size, w.batch_size, w.seq_len)
        for _ in range(runs):
            session.run(None, feed)
        events = json.loads(Path(session.end_profiling()).read_text())
    by_op: dict[str, float] = {}
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            op = e.get("args", {}).get("op_name", "?")
            by_op[op] = by_op.get(op, 0.0) + float(e["dur"])
    total = sum(by_op.values()) or 1.0
    top = sorted(by_op.items(), key=lambda kv: -kv[1])[:6]
    return {"subnet": str(space.largest()), "attention_share": by_op.get("Attention", 0.0) / total,
            "top_ops": {k: round(v / total, 4) for k, v in top}}  # fmt: skip




def lower_envelope(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """(latency, bpb) points of a ladder, by latency, each kept only if better than every faster one."""
    out: list[tuple[float, float]] = []
    for lat, bpb in sorted(points):
        if not out or bpb < out[-1][1]:
            out.append((lat, bpb))
    return out


def speedup(ladder: list[tuple[float, float]], bpb: float, ms: float) -> dict:
    """How much faster a model of ``bpb`` at ``ms`` is than the ``ladder`` (softmax's retrained (latency, bpb)) at equal
    bpb: the ladder's latency where its lower envelope reaches ``bpb`` (linear between its points) over ``ms``.  Where
    no ladder model is as good, the slowest one gives a lower bound ("at least"); where every one is better, the
    fastest gives an upper bound ("at most")."""
    env = lower_envelope(ladder)
    if not env:
        return {"ratio": None, "bound": None, "how": "no retrained softmax models"}
    if bpb < env[-1][1]:
        return {"ratio": env[-1][0] / ms, "bound": "lower", "ladder_ms": env[-1][0],
                "how": f"no softmax model reaches it; the best, {env[-1][1]:.4f} at {env[-1][0]:.3f} ms, gives a lower bound"}
    if bpb >= env[0][1]:
        return {"ratio": env[0][0] / ms, "bound": "upper", "ladder_ms": env[0][0],
                "how": f"every softmax model is as good; the fastest, {env[0][1]:.4f} at {env[0][0]:.3f} ms, "
                       "gives an upper bound"}
    for (l0, b0), (l1, b1) in zip(env, env[1:]):
        if b1 <= bpb < b0:
            lat = l0 + (l1 - l0) * (b0 - bpb) / (b0 - b1)
            return {"ratio": lat / ms, "bound": None, "ladder_ms": lat, "how": f"interpolated: softmax at {lat:.3f} ms"}
    raise AssertionError((env, bpb))


def kendall(a, b) -> float:
    from scipy.stats import kendalltau

    return float(kendalltau(a, b).statistic) if len(a) > 2 else float("nan")


def tau_interval(score: np.ndarray, truth: np.ndarray, reps: int, seed: int) -> tuple[float, float, float]:
    """Kendall tau of ``score`` against ``truth`` and its bootstrap 95% interval (models resampled with replacement)."""
    tau = kendall(score, truth)
    rng = np.random.default_rng(seed)
    taus = []
    for _ in range(reps):
        idx = rng.integers(len(score), size=len(score))
        if len(set(idx)) > 2:
            t = kendall(score[idx], truth[idx])
            if np.isfinite(t):
                taus.append(t)
    lo, hi = (np.percentile(taus, [2.5, 97.5]) if taus else (math.nan, math.nan))
    return tau, float(lo), float(hi)


def judge(found: list[float], base: list[float], sd: float) -> str:
    """better / tie / worse: the difference of the seed means against 2 seed standard deviations."""
    d = float(np.mean(found) - np.mean(base))
    if not np.isfinite(sd) or sd == 0:
        return "better" if d < 0 else ("worse" if d > 0 else "tie")
    return "better" if d < -2 * sd else ("worse" if d > 2 * sd else "tie")


def budgets_of(space, predictor_dir: Path, timings: Path) -> list[float]:
    """The three budgets: the lowest below every type's largest uniform model, then the 50th and 75th percentiles."""
    from latency.predictors import load_predictor

    types = space.attention
    largest = [space.largest(a) for a in types]  # each type's largest uniform model
    fastest = float(np.min(load_predictor(predictor_dir).predict(largest)))
    low = min(budget_from_table(timings, PERCENTILES[0]), 0.9 * fastest)
    mid = max(budget_from_table(timings, PERCENTILES[1]), 1.2 * low)
    return [low, mid, max(budget_from_table(timings, PERCENTILES[2]), 1.2 * mid)]


def draw_mixed(space, predictor_dir: Path, budgets: list[float], n: int, seed: int, exclude=frozenset()) -> list[Subnet]:
    """``n`` random subnets of 2-4 attention types, drawn as the search draws them (every choice uniform,
    ``space.sample``), spread evenly over the cells (latency band x number of types): the bands are up to the lowest
    budget (from half of it), up to the middle one and up to the highest, by the predictor; the cells taken in turn,
    each subnet the next draw that falls in it.  ``exclude``: keys already used (another set's)."""
    from latency.predictors import load_predictor

    rng = np.random.default_rng([seed, 43])
    pool = list(dict.fromkeys(s for s in (space.sample(rng) for _ in range(4000))
                              if len(set(s.attention)) > 1 and s.key not in exclude))
    ms = load_predictor(predictor_dir).predict(pool)
    edges = [0.5 * budgets[0], *budgets]
    cells: dict[tuple[int, int], list[Subnet]] = {}
    for s, m in zip(pool, ms):
        band = next((i for i in range(len(budgets)) if edges[i] < m <= edges[i + 1]), None)
        if band is not None:
            cells.setdefault((band, min(len(set(s.attention)), 4)), []).append(s)
    order = sorted(cells)
    picks: list[Subnet] = []
    while len(picks) < n and any(cells.values()):
        for cell in order:
            if cells[cell] and len(picks) < n:
                picks.append(cells[cell].pop(0))
    return picks


def wait_quiet(what: str, max_load: float, loads: dict, poll: float = 10.0, calm: int = 3) -> None:
    """Before a timing stage: wait until the 1-minute load average has stayed under ``max_load`` for ``calm`` polls (the
    machine is shared: other jobs would distort the times); the loads are kept for the report."""
    if max_load <= 0:
        return
    waited, quiet, said = 0.0, 0, -1.0
    while quiet < calm:
        load = os.getloadavg()[0]
        quiet = quiet + 1 if load < max_load else 0
        if quiet < calm:
            if load >= max_load and (said < 0 or waited - said >= 300):
                log.info("%s: waiting for a quiet machine (load %.2f, need < %.2f)", what, load, max_load)
                said = waited
            time.sleep(poll)
            waited += poll
    loads[what] = {"load_before": round(os.getloadavg()[0], 2), "waited_s": waited}


class QuietStages:
    """Stages whose figures are times: each waits for a quiet machine (:func:`wait_quiet`) and records the 1-minute
    load before and after it in ``OUT/loads.json`` (``loads``: what the report shows)."""

    def __init__(self, stage: Stages, out: Path, max_load: float, poll: float = 10.0):
        self.stage, self.file, self.max_load, self.poll = stage, out / "loads.json", max_load, poll
        self.loads = json.loads(self.file.read_text()) if self.file.exists() else {}

    def __call__(self, name: str, fn) -> None:
        def go() -> None:
            wait_quiet(name, self.max_load, self.loads, poll=self.poll)
            fn()
            self.loads.setdefault(name, {})["load_after"] = round(os.getloadavg()[0], 2)
            self.file.write_text(json.dumps(self.loads, indent=1))

        self.stage(name, go)


# --------------------------------------------------------------------------- the benchmark


def run(args, plan: Plan) -> dict:
    from nas.cli import main as nas_main

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    space = load_space(args.space)
    w = space.workload()
    seq = w.seq_len
    stage = Stages(out, log)
    tokens = parse_tokens(plan.tokens)
    timed = QuietStages(stage, out, args.max_load, plan.quiet_poll)  # a stage whose figures are times: on a quiet machine
    loads = timed.loads

    def cli(argv: list[str], ok=(0,)) -> None:
        run_stage_command(nas_main, argv, ok, rerun="the benchmark")

    # 1. the two supernets, side by side
    supernets = {"shared": out / "supernet" / "latest.pt", "split": out / "supernet-split" / "latest.pt"}
    stage("train the supernets", lambda: train_supernets(supernets, plan, args, seq))
    ckpt = supernets["shared"]

    # 2. latency on ONNX Runtime, one thread, CPU clock
    timings, predictor = out / "latency" / "timings.csv", out / "predictor"
    timed("measure latency", lambda: cli([
        "measure-latency", str(args.space), "--device", "onnxruntime", "--timing-threads", "1", "--clock", "cpu",
        "--samples", str(plan.samples), "--timing-warmup", str(plan.warmup), "--repeats", str(plan.repeats),
        "--rounds", str(plan.rounds), "--min-sample-ms", str(plan.min_sample_ms), "--seed", str(args.seed),
        "--out", str(timings)]))  # fmt: skip
    stage("fit the predictor", lambda: cli(["fit-predictor", str(timings), "--out", str(predictor), "--seed", str(args.seed)]))

    # 3. budgets; 4. baselines (timed), the random mixed subnets of the ranker's fit and of the held-out set
    budgets = budgets_of(space, predictor, timings)
    labels = [f"{b:.3f}ms" for b in budgets]
    log.info("budgets: %s", ", ".join(labels))
    picks_file, mixed_file = out / "baselines.json", out / "mixed.json"
    timed("pick baselines", lambda: picks_file.write_text(json.dumps({
        "baselines": pick_baselines(space, predictor, timings, budgets, labels, plan, args.seed)}, indent=1)))
    picked = json.loads(picks_file.read_text())
    baselines = {(e["budget"], e["attention"]): Subnet.from_dict(e["subnet"]) for e in picked["baselines"]}

    def draw() -> None:
        fit = draw_mixed(space, predictor, budgets, plan.fit_mixed, args.seed)
        held = draw_mixed(space, predictor, budgets, plan.heldout_mixed, args.seed + 1000, {s.key for s in fit})
        mixed_file.write_text(json.dumps({"fit": [s.to_dict() for s in fit], "heldout": [s.to_dict() for s in held]},
                                         indent=1))

    stage("draw mixed subnets", draw)
    mixed = json.loads(mixed_file.read_text())
    fit_mixed = [Subnet.from_dict(d) for d in mixed["fit"]]
    heldout = [Subnet.from_dict(d) for d in mixed["heldout"]]

    models: dict[str, Subnet] = {}
    roles: dict[str, list[str]] = {}

    def add(role: str, s: Subnet) -> None:
        models.setdefault(s.key, s)
        if role not in roles.setdefault(s.key, []):
            roles[s.key].append(role)

    for (label, attention), s in baselines.items():
        add(f"uniform {attention}@{label}", s)
    soft = space.attention[0]
    add(f"uniform {soft} (largest)", space.largest(soft))
    for s in fit_mixed:
        if s.key not in models:
            add("fit mixed", s)
    calibration = dict(models)  # the ranker's fit: the uniform ladders and random mixed subnets, known before the search

    # 5. train enough to rank: a few models at the token budget and at twice it; doubled when their ranks move
    stability_file = out / "stability.json"
    check_token_budget(out / "retrain", calibration, tokens)  # a rerun with another --tokens: refused before anything
    stage("rank stability", lambda: stability_file.write_text(json.dumps(
        rank_stability(space, calibration, roles, ckpt, out, tokens, plan, args), indent=1)))
    stability = json.loads(stability_file.read_text())
    retrain_dir = out / ("retrain" if int(stability["chosen_tokens"]) == tokens else "retrain-x2")
    tokens = int(stability["chosen_tokens"])
    check_token_budget(retrain_dir, models, tokens)

    # 6. retrain the ranker's fit set; 7. fit the ranker on their validation loss
    stage("retrain the fit set", lambda: retrain_all(space, calibration, retrain_dir, tokens, plan, args))
    ranker = out / "ranker"
    fitness_flags = ["--val-windows", str(plan.val_windows), "--seq-len", str(seq), "--val-seed", "0"]
    stage("fit the ranker", lambda: cli(["fit-accuracy", str(ckpt), *(str(retrain_dir / k / "model") for k in calibration),
                                         "--out", str(ranker), "--device", "cpu", *fitness_flags]))

    # 8. the search with the calibrated ranker, verified on the device with headroom, hurdles from scratch among what holds
    search_dir = out / "search"
    search = ["search", str(ckpt), "--predictor", str(predictor), "--budget", ",".join(labels),
              "--fitness", f"calibrated:{ranker}", "--population", str(plan.population), "--parents", str(plan.parents),
              "--mutations", str(plan.mutations), "--crossovers", str(plan.crossovers), "--generations", str(plan.generations),
              *fitness_flags, "--seed", str(args.seed), "--out", str(search_dir), "--device", "cpu",
              "--timing-target", "onnxruntime", "--verify-top", str(plan.verify_top), "--timing-threads", "1", "--clock", "cpu",
              "--verify-margin", str(plan.verify_margin),
              "--hurdles", str(plan.hurdles), "--hurdle-candidates", str(plan.hurdle_candidates), "--hurdle-from", "scratch",
              "--hurdle-batch-size", str(plan.retrain_batch), "--hurdle-tokens", plan.hurdle_tokens, "--no-progress"]  # fmt: skip
    timed("search", lambda: cli(search, ok=(0, 1)))  # (its --timing-target times the candidates)
    summary = json.loads((search_dir / "search.json").read_text())
    labels = list(summary["budgets"])  # the search's labels of the budgets, in the order given
    found = found_subnets(search_dir, labels, summary)
    for label, s in found.items():
        add(f"found@{label}", s)
    for s in heldout:
        add("held-out mixed", s)

    # 9. retrain the found models and the held-out set; 10. time everything side by side, score on the test split
    stage("retrain found and held-out", lambda: retrain_all(space, models, retrain_dir, tokens, plan, args))
    measured_file = out / "measured.json"
    timed("measure and score", lambda: measured_file.write_text(json.dumps(
        measure_and_score(space, supernets, ranker, models, retrain_dir, timings, plan, args.seed), indent=1)))
    measured = json.loads(measured_file.read_text())

    # 11. seeds: the found model and the best uniform model at or below its latency per budget (and the best mixed
    # ones, until at least plan.min_seeded models pool the seed SD)
    pairs = seed_pairs(labels, models, roles, measured)
    seeded = seeded_models(pairs, labels, budgets, models, roles, measured, plan.min_seeded)
    jobs = {f"{k}-s{s}": (models[k], s) for k in seeded for s in range(1, plan.seeds)}
    stage("retrain seeds", lambda: retrain_all(space, {n: m for n, (m, _) in jobs.items()}, retrain_dir, tokens, plan, args,
                                                seeds={n: args.seed + s for n, (_, s) in jobs.items()}))
    seeds_file = out / "seeds.json"
    stage("score seeds", lambda: seeds_file.write_text(json.dumps(score_seeds(space, ckpt, jobs, retrain_dir, plan, args.seed),
                                                                   indent=1)))
    share_file = out / "attention_share.json"
    stage("attention share", lambda: share_file.write_text(json.dumps(attention_share(space), indent=1)))

    result = report(space, labels, budgets, models, roles, calibration, measured, json.loads(seeds_file.read_text()),
                    pairs, json.loads(share_file.read_text()), summary, plan, tokens, out, args.seed, stability,
                    json.loads((ranker / "ranker.json").read_text()))
    result["stage_seconds"] = stage.all_seconds()
    result["loads"] = loads  # the 1-minute load average before and after each timing stage
    result["wall_seconds_this_run"] = round(time.perf_counter() - t_start, 1)
    result["plan"] = asdict(plan)
    (out / "claim.json").write_text(json.dumps(result, indent=1))
    return result


def rank_stability(space, calibration: dict[str, Subnet], roles, ckpt: Path, out: Path, tokens: int, plan: Plan,
                   args) -> dict:
    """``plan.stability`` uniform and as many mixed models of the fit set (drawn with the run's seed) retrained at
    ``tokens`` and at twice it, scored on the search's fitness windows (validation split); Kendall tau between the two
    orders.  Below ``plan.stability_tau`` the run trains every model on twice the tokens (the ranks at the budget are
    not yet the ranks of trained models)."""
    rng = np.random.default_rng([args.seed, 7])
    uniform = sorted(k for k in calibration if "fit mixed" not in roles[k])
    mixed = sorted(k for k in calibration if "fit mixed" in roles[k])
    chosen = [*rng.permutation(uniform)[: plan.stability], *rng.permutation(mixed)[: plan.stability]]
    chosen = [str(k) for k in chosen]
    subset = {k: calibration[k] for k in chosen}
    once, twice = out / "retrain", out / "retrain-x2"
    check_token_budget(once, subset, tokens)
    check_token_budget(twice, subset, 2 * tokens)
    retrain_all(space, subset, once, tokens, plan, args)
    retrain_all(space, subset, twice, 2 * tokens, plan, args)
    scores = validation_scores(ckpt, {k: once / k / "model" for k in chosen}, plan)
    scores2 = validation_scores(ckpt, {k: twice / k / "model" for k in chosen}, plan)
    tau = kendall([scores[k] for k in chosen], [scores2[k] for k in chosen])
    keep = bool(np.isfinite(tau) and tau >= plan.stability_tau)
    why = (f"Kendall tau {tau:+.3f} between the validation losses of {len(chosen)} models at {tokens:,} and at "
           f"{2 * tokens:,} tokens is {'at least' if keep else 'below'} {plan.stability_tau}: "
           + (f"{tokens:,} tokens rank as twice as many do" if keep else f"every model is trained on {2 * tokens:,} tokens"))
    log.info("rank stability: %s", why)
    return {"tokens": tokens, "tokens_x2": 2 * tokens, "tau": tau, "threshold": plan.stability_tau,
            "chosen_tokens": tokens if keep else 2 * tokens, "why": why,
            "models": {k: {"subnet": str(calibration[k]), "mixed": "fit mixed" in roles[k], "val_bpb": scores[k],
                           "val_bpb_x2": scores2[k]} for k in chosen}}  # fmt: skip


def validation_scores(ckpt: Path, folders: dict[str, Path], plan: Plan) -> dict[str, float]:
    """Each retrained model's loss on the search's fitness windows (the supernet's validation split), as the ranker's
    target is scored."""
    import torch

    from nas.search import inherited_fitness
    from supernet.artifact import load_model
    from supernet.checkpoint import load_supernet

    net, payload = load_supernet(ckpt, device="cpu")
    fit, _ = inherited_fitness(ckpt, net, payload, seq_len=net.space.workload().seq_len, windows=plan.val_windows,
                               batch_size=16, val_seed=0, device="cpu")
    with torch.no_grad():
        return {k: float(fit.static(load_model(d).eval())) for k, d in folders.items()}


def train_supernets(paths: dict[str, Path], plan: Plan, args, seq: int) -> None:
    """Both supernets at once, one thread each (``nas train-supernet`` in a subprocess; a started one resumes)."""

    def one(name: str, ckpt: Path) -> None:
        d = ckpt.parent
        if (d / "final.pt").exists():
            return
        common = ["--max-steps", str(plan.train_steps), "--threads", "1", "-q"]
        if ckpt.exists():
            cmd = ["train-supernet", "--out", str(d), "--resume", *common]
        else:
            split = ["--split", "families", "--split-at", str(plan.split_at)] if name == "split" else []
            cmd = ["train-supernet", str(args.space), "--out", str(d), "--seq-len", str(seq), "--batch-size",
                   str(plan.train_batch), "--seed", str(args.seed), "--balance", "types", *split, *common]  # fmt: skip
        d.mkdir(parents=True, exist_ok=True)
        log.info("supernet %s: nas %s", name, " ".join(cmd))
        with open(d.parent / f"{d.name}.log", "a") as f:
            proc = subprocess.run([sys.executable, "-m", "nas.cli", *cmd], stdout=f, stderr=subprocess.STDOUT,
                                  env={**os.environ, "OMP_NUM_THREADS": "1"})
        if proc.returncode != 0:
            raise UserError(f"training the {name} supernet failed (exit {proc.returncode}); see {d.parent / (d.name + '.log')}")

    with ThreadPoolExecutor(max_workers=len(paths)) as pool:
        list(pool.map(lambda kv: one(*kv), paths.items()))


def found_subnets(search_dir: Path, labels: list[str], summary: dict) -> dict[str, Subnet]:
    """Per budget: the hurdles' winner (trained from scratch among the device-verified candidates), else the verified
    subnet, else the search's best by the predictor."""
    out = {}
    for label in labels:
        for name in (f"hurdles_{label}.yaml", f"verified_{label}.yaml"):
            if (search_dir / name).exists():
                out[label] = Subnet.load(search_dir / name)
                break
        else:
            best = summary["budgets"].get(label, {}).get("best")
            if best:
                out[label] = Subnet.load(search_dir / best["file"])
    return out


def params_of(space, subnet: Subnet) -> int:
    from latency.features import params

    return params(space, subnet)


def pick_baselines(space, predictor_dir: Path, timings: Path, budgets, labels, plan: Plan, seed: int) -> list[dict]:
    """Per (budget, type): the uniform models under the budget by the predictor, largest first; the first
    ``plan.baseline_checks`` of them timed on the device (one campaign); the largest whose measured time holds."""
    from latency.device import get_device
    from latency.predictors import load_predictor
    from latency.protocol import measure, timing_model
    from latency.table import read_timings
    from latency.timing_core import Settings

    uniform = space.uniform()
    table = read_timings(timings)
    fp = table.fingerprint
    device = get_device("onnxruntime", threads=fp.get("threads") or 1, clock=fp.get("clock", "cpu"))
    settings = Settings(warmup=plan.warmup, repeats=plan.repeats, rounds=plan.rounds, min_sample_ms=plan.min_sample_ms)

    def time_them(subnets: list[Subnet]) -> dict[Subnet, float]:
        m = measure(device, {s.key: timing_model(space, s, materialize=False) for s in subnets}, space.workload(), settings,
                    seed=seed, baseline_ms=table.meta.get("baseline_ms"))  # fmt: skip
        return {s: m.results[s.key].median_ms for s in subnets}

    return choose_baselines(uniform, load_predictor(predictor_dir).predict(uniform), [params_of(space, s) for s in uniform],
                            budgets, labels, space.attention, lambda s: s.attention[0], plan.baseline_checks,
                            time_them)  # fmt: skip


def choose_baselines(uniform: list, predicted, sizes, budgets, labels, types, type_of, checks: int, time_them) -> list[dict]:
    """Per (budget, type): of the ``uniform`` models (``predicted`` ms and ``sizes`` alike ordered) of that type under
    the budget by the predictor, the ``checks`` largest timed on the device in one campaign (``time_them(subnets)`` ->
    {subnet: ms}); the largest whose measured time holds, else the next smaller one the predictor puts under."""
    predicted = dict(zip(uniform, (float(x) for x in predicted)))
    size = dict(zip(uniform, sizes))
    shortlist: dict[tuple[str, str], list] = {}
    for b, label in zip(budgets, labels):
        for attention in types:
            fits = sorted((s for s in uniform if type_of(s) == attention and predicted[s] <= b), key=lambda s: (-size[s], s.key))
            if fits:
                shortlist[(label, attention)] = fits[:checks]
    distinct = list(dict.fromkeys(s for ss in shortlist.values() for s in ss))
    measured = time_them(distinct) if distinct else {}
    out = []
    for (label, attention), ss in shortlist.items():
        b = budgets[labels.index(label)]
        holding = [s for s in ss if measured[s] <= b]
        choice = holding[0] if holding else None
        if choice is None:  # none of the checked ones holds: the next smaller one the predictor puts under, unchecked
            rest = [s for s in uniform if type_of(s) == attention and predicted[s] <= b and s not in ss]
            choice = max(rest, key=lambda s: (size[s], s.key)) if rest else None
        if choice is not None:
            out.append({"budget": label, "attention": attention, "subnet": choice.to_dict(), "params": size[choice],
                        "predicted_ms": predicted[choice], "measured_ms": measured.get(choice)})  # fmt: skip
    return out


def check_token_budget(root: Path, models: dict[str, Subnet], tokens: int) -> None:
    """Models already retrained under ``root`` must have had this token budget (a rerun with another --tokens is refused)."""
    budgets = {}
    for key in models:
        card = root / key / "model" / "model_card.json"
        if card.exists():
            budgets[key] = json.loads(card.read_text())["training"]["token_budget"]
    other = sorted({b for b in budgets.values() if b != tokens})
    if other:
        raise UserError(f"{root}: models there were retrained on {', '.join(f'{b:,}' for b in other)} tokens each, not "
                        f"{tokens:,}: give --tokens {other[0]} to report that run, or another --out for a new one")


def retrain_all(space, models: dict[str, Subnet], root: Path, tokens: int, plan: Plan, args,
                seeds: dict[str, int] | None = None) -> None:
    """``nas train-subnet`` for every model not yet done (resuming a started one), ``plan.jobs`` at a time; ``models``:
    folder name -> subnet, ``seeds``: folder name -> seed (default the run's)."""
    root.mkdir(parents=True, exist_ok=True)
    todo = [name for name in models if not all((root / name / "model" / f).exists() for f in ("model_card.json", "model.onnx"))]
    argvs = []
    for name in todo:
        seed = (seeds or {}).get(name, args.seed)
        log.info("retrain %s (seed %d) %s", name, seed, models[name])
        argvs.append(train_subnet_argv(models[name], root / name / "model", [
            "--space", str(args.space), "--init", "scratch", "--tokens", str(tokens), "--seq-len",
            str(space.workload().seq_len), "--batch-size", str(plan.retrain_batch), "--lr", str(plan.retrain_lr),
            "--lr-warmup", str(plan.retrain_warmup), "--seed", str(seed), "--threads", "1", "--eval-interval", "1000000",
            "--eval-batches", "4", "--ckpt-interval", "50", "-q"]))  # fmt: skip
    run_nas(argvs, plan.jobs, logs=[root / name / "log.txt" for name in todo])


def test_windows(ckpt: Path, plan: Plan, seed: int):
    """The test split's fixed windows (as long as the prefill) of the supernet's corpus: what every model is scored on."""
    from supernet.checkpoint import load_checkpoint
    from supernet.data import prepare_corpus
    from supernet.heldout import HeldOut

    payload = load_checkpoint(ckpt)
    meta, space = payload["meta"], payload["space"]
    corpus = prepare_corpus(meta["data"], ckpt.resolve().parent, meta["data_seed"], meta["val_fraction"])
    seq = space.workload().seq_len
    if len(corpus.test) <= seq:
        raise UserError(f"{ckpt}: its corpus has no test split long enough for a window of {seq} bytes")
    rng = np.random.default_rng(seed + 7)
    starts = np.sort(rng.choice(len(corpus.test) - seq, size=min(plan.test_windows, len(corpus.test) - seq), replace=False))
    return HeldOut(corpus.test, starts, seq), int(len(corpus.test))


def measure_and_score(space, supernets: dict[str, Path], ranker: Path, models: dict[str, Subnet], root: Path, timings: Path,
                      plan: Plan, seed: int) -> dict:
    """Every retrained export timed side by side (one campaign); test bits/byte of the retrained models; every ranker's
    score (on the search's validation windows, as the search sees them)."""
    import torch

    from latency.device import get_device
    from latency.features import flops
    from latency.protocol import measure
    from latency.table import read_timings
    from latency.timing_core import Settings
    from nas.search import inherited_fitness
    from nas.search.calibrated import load_ranker
    from supernet.artifact import load_model
    from supernet.checkpoint import load_supernet

    statics = {key: load_model(root / key / "model").eval() for key in models}
    files = {id(m): root / key / "model" / "model.onnx" for key, m in statics.items()}
    table = read_timings(timings)
    fp = table.fingerprint
    device = _FilesDevice(get_device("onnxruntime", threads=fp.get("threads") or 1, clock=fp.get("clock", "cpu")), files)
    settings = Settings(
        warmup=plan.warmup, repeats=plan.compare_repeats, rounds=plan.compare_rounds, min_sample_ms=plan.min_sample_ms
    )
    m = measure(device, statics, space.workload(), settings, seed=seed, baseline_ms=table.meta.get("baseline_ms"))
    test, test_bytes = test_windows(supernets["shared"], plan, seed)
    seq = space.workload().seq_len
    inherited, fitness = {}, {}
    for name, path in supernets.items():  # the search's fitness windows, with each supernet's weights
        net, payload = load_supernet(path, device="cpu")
        fit, _ = inherited_fitness(path, net, payload, seq_len=seq, windows=plan.val_windows, batch_size=16, val_seed=0,
                                   device="cpu")
        fitness[name] = fit
        inherited[name] = dict(zip(models, (float(x) for x in fit(list(models.values())))))
    calibrated = load_ranker(ranker)
    n_params = {k: params_of(space, s) for k, s in models.items()}
    predicted = dict(zip(models, (float(x) for x in calibrated.predict(
        space, list(models.values()), [inherited["shared"][k] for k in models], [n_params[k] for k in models]))))
    out = {}
    with torch.no_grad():
        for key, s in models.items():
            windows = test.window_bits(statics[key], None, 16, False)
            out[key] = {
                "measured_ms": m.results[key].median_ms,
                "iqr_ms": m.results[key].iqr_ms,
                "test_bpb": float(windows.mean()),
                "test_windows": [float(x) for x in windows],
                "val_bpb": float(fitness["shared"].static(statics[key])),  # the ranker's target: the fitness windows
                "scores": {"calibrated": predicted[key], "inherited": inherited["shared"][key],
                           "few-shot split": inherited["split"][key], "parameters": -float(n_params[key]),
                           "FLOPs": -flops(space, s, space.workload())},
                "params": n_params[key],
                "card": str(root / key / "model" / "model_card.json"),
            }
    return {"test": {"windows": len(test.starts) if hasattr(test, "starts") else plan.test_windows, "seq_len": seq,
                     "tokens": test.tokens, "bytes_in_split": test_bytes},
            "ranker": {"kind": calibrated.kind, "report": calibrated.report}, "models": out}  # fmt: skip


def seed_pairs(labels: list[str], models: dict[str, Subnet], roles: dict[str, list[str]], measured: dict) -> dict:
    """Per budget: (the found model's key, the best uniform baseline's key at or below its measured latency, by seed 0)."""
    rows = measured["models"]
    out = {}
    for label in labels:
        mine = [k for k in models if f"found@{label}" in roles[k]]
        if not mine:
            continue
        me = mine[0]
        base = [k for k in models if k != me and any(r.startswith("uniform") and r.endswith(f"@{label}") for r in roles[k])]
        base += [k for k in models if k != me and k not in base and any(r.startswith("uniform") and "(largest)" in r
                                                                         for r in roles[k])]
        at_or_below = [k for k in base if rows[k]["measured_ms"] <= rows[me]["measured_ms"]]
        best = min(at_or_below, key=lambda k: rows[k]["test_bpb"]) if at_or_below else None
        out[label] = (me, best)
    return out


def score_seeds(space, ckpt: Path, jobs: dict, root: Path, plan: Plan, seed: int) -> dict:
    """Test bits/byte of the models retrained at the other seeds: {folder name: {key, seed, test_bpb}}."""
    import torch

    from supernet.artifact import load_model

    test, _ = test_windows(ckpt, plan, seed)
    out = {}
    with torch.no_grad():
        for name, (subnet, s) in jobs.items():
            model = load_model(root / name / "model").eval()
            windows = test.window_bits(model, None, 16, False)
            out[name] = {"key": subnet.key, "seed": seed + s, "test_bpb": float(windows.mean()),
                         "test_windows": [float(x) for x in windows]}
    return out


def seeded_models(pairs: dict, labels: list[str], budgets: list[float], models: dict[str, Subnet],
                  roles: dict[str, list[str]], measured: dict, at_least: int) -> list[str]:
    """The models retrained at every seed: each budget's found model and best uniform model at or below it, then the
    best mixed model within each budget, then the next best uniform ones, until ``at_least`` distinct models pool
    the seed standard deviation."""
    rows = measured["models"]
    out = list(dict.fromkeys(k for pair in pairs.values() for k in pair if k))
    mixed = [k for k in models if len(set(models[k].attention)) > 1]
    uniform = [k for k in models if len(set(models[k].attention)) == 1]
    for pool in (mixed, uniform):
        for label, budget in zip(labels, budgets):
            if len(out) >= at_least:
                return out
            within = sorted((k for k in pool if k not in out and rows[k]["measured_ms"] <= budget),
                            key=lambda k: rows[k]["test_bpb"])
            if within:
                out.append(within[0])
    return out


def holm(pvalues: dict[str, float]) -> dict[str, float]:
    """Holm's step-down adjustment of ``pvalues`` (one per budget judged): each adjusted p-value, capped at 1."""
    order = sorted(pvalues, key=lambda k: pvalues[k])
    adjusted, running = {}, 0.0
    for i, k in enumerate(order):
        running = max(running, min(1.0, (len(order) - i) * pvalues[k]))
        adjusted[k] = running
    return adjusted


def paired_p(found: np.ndarray, base: np.ndarray) -> float:
    """Two-sided paired t-test across the test windows of the seed-averaged difference (``found`` and ``base``:
    (seeds, windows) bits of each window; the seeds paired by index, their mean taken per window)."""
    from scipy.stats import ttest_1samp

    d = found.mean(0) - base.mean(0)
    if len(d) < 2 or np.allclose(d, d[0]):
        return 0.0 if abs(float(d.mean())) > 0 else 1.0
    return float(ttest_1samp(d, 0.0).pvalue)


def mixed_or_uniform(subnet: Subnet) -> str:
    kinds = list(dict.fromkeys(subnet.attention))
    return f"uniform {kinds[0]}" if len(kinds) == 1 else "mixed " + ",".join(kinds)


def report(space, labels, budgets, models, roles, calibration, measured, seeds, pairs, share, summary, plan: Plan,
           tokens: int, out: Path, seed: int, stability: dict, ranker_doc: dict) -> dict:
    rows_by_key = measured["models"]
    per_seed: dict[str, list[float]] = {k: [r["test_bpb"]] for k, r in rows_by_key.items()}
    windows: dict[str, list[list[float]]] = {k: [r["test_windows"]] for k, r in rows_by_key.items()}
    for entry in seeds.values():
        per_seed[entry["key"]].append(entry["test_bpb"])
        windows[entry["key"]].append(entry["test_windows"])
    seeded = {k: v for k, v in per_seed.items() if len(v) > 1}
    seed_sd = float(np.sqrt(np.mean([np.var(v, ddof=1) for v in seeded.values()]))) if seeded else math.nan

    def mean_bpb(k: str) -> float:
        return float(np.mean(per_seed[k]))

    rows = []
    for key, s in models.items():
        r = rows_by_key[key]
        rows.append({"key": key, "roles": ";".join(roles[key]), "subnet": str(s), "params": r["params"],
                     "attention": ",".join(dict.fromkeys(s.attention)), "mixed": len(set(s.attention)) > 1,
                     "measured_ms": r["measured_ms"], "iqr_ms": r["iqr_ms"], "test_bpb": r["test_bpb"],
                     "test_bpb_mean": mean_bpb(key), "seeds": len(per_seed[key]), "val_bpb": r["val_bpb"],
                     "in_ranker_fit": key in calibration, **{f"score:{n}": r["scores"][n] for n in RANKERS}})  # fmt: skip
    with open(out / "claim.csv", "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(rows[0]))
        wr.writeheader()
        wr.writerows(rows)

    # rankers: tau against retrained test bits/byte, on the models no ranker was fitted on (all; the mixed ones alone)
    held = [r for r in rows if not r["in_ranker_fit"]]
    held_mixed = [r for r in held if r["mixed"]]
    rankers, rankers_mixed, rankers_all = {}, {}, {}
    for name in RANKERS:
        for group, into in ((held, rankers), (held_mixed, rankers_mixed)):
            tau, lo, hi = tau_interval(np.array([r[f"score:{name}"] for r in group]),
                                       np.array([r["test_bpb"] for r in group]), plan.bootstrap, seed)
            into[name] = {"tau": tau, "ci_low": lo, "ci_high": hi, "n": len(group)}
        rankers_all[name] = {"tau": kendall([r[f"score:{name}"] for r in rows], [r["test_bpb"] for r in rows]), "n": len(rows)}
    # the calibrated ranker's error (its target: validation bits/byte on the fitness windows), uniform and mixed apart
    fit = measured["ranker"]
    chosen = fit["report"]["candidates"][fit["kind"]]
    errors = {"heldout_mixed_mae": float(np.mean([abs(r["score:calibrated"] - r["val_bpb"]) for r in held_mixed]))
              if held_mixed else math.nan,
              "heldout_mixed_bias": float(np.mean([r["score:calibrated"] - r["val_bpb"] for r in held_mixed]))
              if held_mixed else math.nan,
              "fit_uniform_loo_mae": chosen.get("groups", {}).get("uniform", {}).get("loo_mae", chosen["loo_mae"]),
              "fit_mixed_loo_mae": chosen.get("groups", {}).get("mixed", {}).get("loo_mae", math.nan),
              "kind": fit["kind"], "criterion": fit["report"].get("criterion")}
    errors["mixed_over_uniform"] = errors["heldout_mixed_mae"] / errors["fit_uniform_loo_mae"]
    w = space.workload()
    n_fit_mixed = sum(1 for k in calibration if len(set(models[k].attention)) > 1)
    lines = [f"the claim on space {space.name!r}, {w} on ONNX Runtime (1 thread, CPU clock); every model retrained from "
             f"scratch on {tokens:,} tokens (same schedule and data); test split: {measured['test']['windows']} windows x "
             f"{measured['test']['seq_len']} bytes",
             f"token budget: {stability['why']}",
             f"\nrankers, Kendall tau against retrained test bits/byte on {len(held)} held-out models (no ranker was fitted "
             f"on them; {len(held_mixed)} random mixed), bootstrap 95% interval ({plan.bootstrap:,} resamples):",
             f"  {'ranker':16} {'all held-out':>28}   {'mixed held-out':>28}   all {len(rows)} models"]  # fmt: skip
    for name in RANKERS:
        r, m = rankers[name], rankers_mixed[name]
        default = "  (the search's ranker)" if name == "calibrated" else ""
        lines.append(f"  {name:16} {r['tau']:+.3f} [{r['ci_low']:+.3f}, {r['ci_high']:+.3f}] n={r['n']:<3}  "
                     f"{m['tau']:+.3f} [{m['ci_low']:+.3f}, {m['ci_high']:+.3f}] n={m['n']:<3}  "
                     f"{rankers_all[name]['tau']:+.3f}{default}")
    lines.append(f"  calibrated ranker: {fit['kind']} features, fitted on {len(calibration)} retrained models "
                 f"({len(calibration) - n_fit_mixed} uniform, {n_fit_mixed} random mixed; chosen by the "
                 f"{errors['criterion']}); its error on validation bits/byte: {errors['heldout_mixed_mae']:.4f} on the "
                 f"held-out mixed models (mean signed {errors['heldout_mixed_bias']:+.4f}), leave-one-out "
                 f"{errors['fit_uniform_loo_mae']:.4f} on the uniform and {errors['fit_mixed_loo_mae']:.4f} on the mixed "
                 f"ones it was fitted on: mixed / uniform = {errors['mixed_over_uniform']:.2f}x")
    lines.append(f"\nseed standard deviation of test bits/byte (pooled over {len(seeded)} models x {plan.seeds} seeds): "
                 f"{seed_sd:.4f}")
    by_key = {r["key"]: r for r in rows}
    # paired tests per budget, Holm over the budgets judged
    pvalues = {}
    for label in labels:
        if label in pairs and pairs[label][1] is not None:
            me_key, best_key = pairs[label]
            n = min(len(windows[me_key]), len(windows[best_key]))
            pvalues[label] = paired_p(np.array(windows[me_key][:n]), np.array(windows[best_key][:n]))
    adjusted = holm(pvalues)
    entries, speed = [], []
    ladder = [(r["measured_ms"], r["test_bpb"]) for r in rows if r["attention"] == space.attention[0]
              and any(x.startswith(f"uniform {space.attention[0]}") for x in r["roles"].split(";"))]
    for label, budget in zip(labels, budgets):
        within_rows = [r for r in rows if r["measured_ms"] <= budget]
        best_mixed = min((r for r in within_rows if r["mixed"]), key=lambda r: mean_bpb(r["key"]), default=None)
        best_uni = min((r for r in within_rows if not r["mixed"]), key=lambda r: mean_bpb(r["key"]), default=None)
        if label not in pairs:
            lines.append(f"\nbudget {label}: the search found nothing")
            continue
        me_key, best_key = pairs[label]
        me = by_key[me_key]
        within = me["measured_ms"] <= budget * 1.02
        is_uniform = not me["mixed"]
        chose = f"the search chose {mixed_or_uniform(models[me_key])}" if is_uniform else "the search chose a mixed model"
        lines.append(f"\nbudget {label}: found {me['subnet']} ({chose})")
        lines.append(f"  {'model':36} {'test bpb':>9} {'+-seeds':>8} {'measured':>10}  subnet")

        def line(tag: str, r: dict) -> str:
            v = per_seed[r["key"]]
            spread = f"{np.std(v, ddof=1):.4f}" if len(v) > 1 else "-"
            return f"  {tag:36} {np.mean(v):>9.4f} {spread:>8} {r['measured_ms']:>8.3f}ms  {r['subnet']}"

        lines.append(line("found", me))
        base = sorted((r for r in rows if r is not me and any(x.startswith("uniform") and (x.endswith(f"@{label}") or
                       "(largest)" in x) for x in r["roles"].split(";"))), key=lambda r: r["measured_ms"])  # fmt: skip
        for r in base:
            lines.append(line(next(x for x in r["roles"].split(";") if x.startswith("uniform")).split("@")[0], r))
        entry = {"budget_ms": budget, "label": label, "within_budget": within,
                 "found": {"subnet": me["subnet"], "key": me_key, "uniform": is_uniform,
                           "kind": mixed_or_uniform(models[me_key]), "test_bpb": mean_bpb(me_key),
                           "test_bpb_seeds": per_seed[me_key], "measured_ms": me["measured_ms"]},
                 "best_mixed": None if best_mixed is None else {
                     "subnet": best_mixed["subnet"], "key": best_mixed["key"], "test_bpb": mean_bpb(best_mixed["key"]),
                     "seeds": len(per_seed[best_mixed["key"]]), "measured_ms": best_mixed["measured_ms"],
                     "roles": best_mixed["roles"]},
                 "best_uniform_within": None if best_uni is None else {
                     "subnet": best_uni["subnet"], "key": best_uni["key"], "test_bpb": mean_bpb(best_uni["key"]),
                     "seeds": len(per_seed[best_uni["key"]]), "measured_ms": best_uni["measured_ms"]}}  # fmt: skip
        if best_mixed is not None and best_uni is not None:
            lines.append(f"  within the budget, best retrained mixed {mean_bpb(best_mixed['key']):.4f} "
                         f"({best_mixed['subnet']}, {best_mixed['measured_ms']:.3f} ms) against best uniform "
                         f"{mean_bpb(best_uni['key']):.4f} ({best_uni['subnet']}, {best_uni['measured_ms']:.3f} ms): "
                         f"{mean_bpb(best_mixed['key']) - mean_bpb(best_uni['key']):+.4f}")
        if best_key is None:
            entry.update(verdict="no baseline at or below", best_uniform=None)
            lines.append("  no uniform baseline measured at or below the found model's latency")
        elif best_key == me_key:
            entry.update(verdict="tie", difference=0.0, p=1.0, p_holm=1.0, best_uniform={
                "subnet": me["subnet"], "key": me_key, "test_bpb": mean_bpb(me_key), "test_bpb_seeds": per_seed[me_key],
                "measured_ms": me["measured_ms"]})
            lines.append("  verdict: TIE: the found model is the best uniform baseline itself")
        else:
            b = by_key[best_key]
            d = mean_bpb(me_key) - mean_bpb(best_key)
            p_adj = adjusted.get(label, 1.0)
            beyond = np.isfinite(seed_sd) and abs(d) > 2 * seed_sd
            verdict = ("better" if d < 0 else "worse") if beyond and p_adj < 0.05 else "tie"
            entry.update(verdict=verdict, difference=d, p=pvalues.get(label), p_holm=p_adj, best_uniform={
                "subnet": b["subnet"], "key": best_key, "test_bpb": mean_bpb(best_key), "test_bpb_seeds": per_seed[best_key],
                "measured_ms": b["measured_ms"]})  # fmt: skip
            lines.append(f"  verdict: {verdict.upper()} {'with' if verdict == 'tie' else 'than'} the best uniform model at or "
                         f"below its latency ({b['subnet']}, {b['measured_ms']:.3f} ms): {d:+.4f} bits/byte; 2 seed SD = "
                         f"{2 * seed_sd:.4f}; paired t-test over {len(rows_by_key[me_key]['test_windows'])} windows of the "
                         f"seed means p = {pvalues.get(label, math.nan):.2g}, Holm over {len(pvalues)} budgets "
                         f"{p_adj:.2g} (better or worse: beyond 2 SD and Holm < 0.05)")
        lines.append(f"  measured {me['measured_ms']:.3f} ms against the budget {budget:.3f} ms: "
                     + ("within (+2% at most)" if within else "OVER the budget by more than 2%"))
        sp = speedup(ladder, mean_bpb(me_key), me["measured_ms"])
        speed.append({"budget_ms": budget, "ratio": sp["ratio"], "bound": sp["bound"], "how": sp["how"]})
        if sp["ratio"] is not None:
            word = {"lower": "at least ", "upper": "at most "}.get(sp["bound"], "")
            lines.append(f"  speedup over uniform softmax at equal test bits/byte: {word}{sp['ratio']:.2f}x ({sp['how']})")
        entries.append(entry)
    mixing = mixing_verdict(entries, seed_sd)
    lines.append(f"\n{mixing['text']}")
    hurdles = (summary.get("hurdles") or {}).get("budgets", {})
    for label, h in hurdles.items():
        best = h.get("best") or {}
        lines.append(f"hurdles {label}: winner {Subnet.from_dict(best['subnet']) if best else None}, trained "
                     f"{best.get('trained_bpb', math.nan):.4f} bits/byte (validation windows), round {best.get('round')}")
    lines.append(f"largest subnet {share['subnet']}: {share['attention_share']:.1%} of ONNX Runtime's node time in Attention "
                 f"(top ops: {', '.join(f'{k} {v:.0%}' for k, v in share['top_ops'].items())})")  # fmt: skip
    plot(rows, per_seed, labels, budgets, space.attention[0], rankers, rankers_mixed, out / "claim.png")
    plot_stability(stability, out / "stability.png")
    text = "\n".join(lines)
    print(text)
    return {"rankers": rankers, "rankers_mixed": rankers_mixed, "rankers_all_models": rankers_all,
            "ranker_errors": errors, "seed_sd": seed_sd, "seeded_models": len(seeded), "budgets": entries,
            "speedup_vs_softmax": speed, "mixing": mixing, "stability": stability, "attention_share": share,
            "tokens_per_model": tokens, "rows": rows, "test": measured["test"], "text": text}  # fmt: skip


def mixing_verdict(entries: list[dict], seed_sd: float) -> dict:
    """Whether mixing attention types per layer paid off: per budget, the best retrained mixed model within the budget
    against the best retrained uniform one (seed 0's or the seeds' mean), a difference within 2 seed SD a tie."""
    per = []
    for e in entries:
        m, u = e.get("best_mixed"), e.get("best_uniform_within")
        if m is None or u is None:
            continue
        d = m["test_bpb"] - u["test_bpb"]
        call = "tie" if not np.isfinite(seed_sd) or abs(d) <= 2 * seed_sd else ("mixed" if d < 0 else "uniform")
        per.append({"label": e["label"], "difference": d, "winner": call})
    wins = sum(p["winner"] == "mixed" for p in per)
    losses = sum(p["winner"] == "uniform" for p in per)
    diffs = ", ".join(f"{p['difference']:+.3f}" for p in per)
    if wins and not losses:
        verdict = "paid"
    elif losses and not wins:
        verdict = "did not pay"
    else:
        verdict = "mixed result" if wins else "tie"
    text = (f"mixing attention types per layer: the best retrained mixed model within each budget against the best "
            f"uniform one: {diffs} bits/byte (negative: mixed better; 2 seed SD = {2 * seed_sd:.3f}): mixed better at "
            f"{wins}, uniform better at {losses}, tied at {len(per) - wins - losses} of {len(per)} budgets")
    return {"verdict": verdict, "budgets": per, "text": text}


def plot_stability(stability: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4.5))
    for key, m in stability["models"].items():
        ax.scatter(m["val_bpb"], m["val_bpb_x2"], marker="x" if m["mixed"] else "o", color="C1" if m["mixed"] else "C0")
        ax.annotate(m["subnet"][:40], (m["val_bpb"], m["val_bpb_x2"]), fontsize=5)
    ax.set(xlabel=f"validation bits/byte at {stability['tokens']:,} tokens",
           ylabel=f"validation bits/byte at {stability['tokens_x2']:,} tokens",
           title=f"rank stability: Kendall tau {stability['tau']:+.3f} (o uniform, x mixed)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot(rows, per_seed, labels, budgets, soft: str, rankers: dict, rankers_mixed: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 5.5), gridspec_kw={"width_ratios": [2.2, 1]})
    types = sorted({r["attention"] for r in rows if "uniform" in r["roles"] and "," not in r["attention"]})
    cmap = plt.get_cmap("tab20")
    for i, t in enumerate(types):
        pts = [r for r in rows if r["attention"] == t and "uniform" in r["roles"] and "found" not in r["roles"]]
        if pts:
            ax.errorbar([r["measured_ms"] for r in pts], [np.mean(per_seed[r["key"]]) for r in pts],
                        yerr=[np.std(per_seed[r["key"]], ddof=1) if len(per_seed[r["key"]]) > 1 else 0 for r in pts],
                        fmt="o", ms=5, color=cmap(i % 20), label=f"uniform {t}", capsize=2)  # fmt: skip
    for role, marker, color in (("held-out mixed", "x", "grey"), ("fit mixed", "+", "tab:brown")):
        pts = [r for r in rows if r["roles"] == role]
        if pts:
            ax.scatter([r["measured_ms"] for r in pts], [np.mean(per_seed[r["key"]]) for r in pts], marker=marker,
                       color=color, label=f"{role} ({'ranker test' if role.startswith('held') else 'ranker fit'})")
    found = [r for r in rows if "found@" in r["roles"]]
    if found:
        ax.errorbar([r["measured_ms"] for r in found], [np.mean(per_seed[r["key"]]) for r in found],
                    yerr=[np.std(per_seed[r["key"]], ddof=1) if len(per_seed[r["key"]]) > 1 else 0 for r in found],
                    fmt="*", ms=14, color="black", label="found (mean of seeds, +-1 SD)", capsize=3, zorder=3)
    for b in budgets:
        ax.axvline(b, color="grey", linestyle=":", linewidth=1)
    ax.set(xlabel="measured latency, ms (ONNX Runtime, 1 thread, CPU clock)", ylabel="test bits/byte (retrained from scratch)",
           title="found vs hand-scaled, every model retrained; dotted: budgets")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper right")
    names = list(rankers)
    pos = np.arange(len(names))
    for group, shift, color in ((rankers, -0.18, "black"), (rankers_mixed, 0.18, "tab:orange")):
        taus = np.array([group[n]["tau"] for n in names], dtype=float)
        err = [[t - group[n]["ci_low"] for n, t in zip(names, taus)], [group[n]["ci_high"] - t for n, t in zip(names, taus)]]
        bx.barh(pos + shift, taus, height=0.34, xerr=np.nan_to_num(np.array(err, dtype=float)), color=color, capsize=3,
                label=f"{'all' if group is rankers else 'mixed'} held-out (n={group[names[0]]['n']})")
    bx.set_yticks(pos, names)
    bx.axvline(0.7, color="red", linestyle="--", linewidth=1, label="target 0.7 (all)")
    bx.axvline(0.6, color="orange", linestyle=":", linewidth=1, label="target 0.6 (mixed)")
    bx.set(xlim=(-1, 1), xlabel="Kendall tau vs retrained test bits/byte", title="rankers on held-out models (95% bootstrap)")
    bx.legend(fontsize=7)
    bx.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="run directory (resumable: run again to continue)")
    p.add_argument("--space", default="long", help="space name or YAML (default long)")
    p.add_argument("--quick", action="store_true", help="the whole path in minutes (tiny budgets; for the test)")
    p.add_argument("--tokens", help="retraining tokens per model (default: the plan's, 4M; quick 8K)")
    p.add_argument("--train-steps", type=int, help="steps of each supernet (default 900; quick 12)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-load", type=float, default=1.6,
                   help="timing stages wait until the 1-minute load average stays under this (0: do not wait; default 1.6)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    plan = QUICK if args.quick else FULL
    if args.tokens:
        plan = replace(plan, tokens=args.tokens)
    if args.train_steps:
        plan = replace(plan, train_steps=args.train_steps)
    t0 = time.perf_counter()
    try:
        run(args, plan)
    except UserError as e:
        print(f"bench_claim: error: {e}", file=sys.stderr)
        return 2
    print(f"\nwall time {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
