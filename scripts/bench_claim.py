"""The measured claim: does the search find better models than hand-scaled Transformers, after retraining?

    python scripts/bench_claim.py --out runs/claim                 # long.yaml, ONNX Runtime on this CPU (about 2 hours)
    python scripts/bench_claim.py --out runs/claim --supernet CKPT # reuse a trained supernet
    python scripts/bench_claim.py --out runs/claim-quick --quick --space tests/fixtures/spaces/claim_quick.yaml

Stages (each the documented command run in-process, each resumable: run the same command again):

1. train the supernet (``nas train-supernet``; skipped with ``--supernet``);
2. time subnets with ONNX Runtime (one thread, the thread's CPU time) and fit a predictor;
3. budgets at the 25th, 50th and 75th percentile of the measured latencies;
4. search (``nas search``, inherited-weight fitness on validation windows as long as the prefill
   workload) under the three budgets, verified on the device; then the same search with
   progressive dynamic hurdles (``--hurdles``: the top candidates trained in rounds);
5. baselines: per budget and attention type, the largest uniform model (every layer the same width,
   heads, FFN and type) under the budget by the predictor, checked on the device;
6. retrain from scratch every found subnet and baseline with ``nas train-subnet``: the same token
   budget, seed, schedule and data for all (two at a time, one thread each);
7. time every retrained model's exported ``model.onnx`` side by side (one campaign, interleaved);
8. score every model on the test split (windows as long as the prefill; no search, hurdle or
   training ever saw them), with inherited and retrained weights.

Writes ``claim.csv``, ``claim.json`` and ``claim.png`` (test bits/byte against measured latency) and
prints, per budget, the found subnet against the best uniform baseline at equal or lower measured
latency; the speedup over uniform softmax at equal or better bits/byte; Kendall tau between
inherited and retrained bits/byte; whether hurdles changed the winner; the share of time the
largest subnet spends in attention; the wall time.  All figures are on the space's prefill workload
(ONNX Runtime runs the sparse types' prefill with a dense mask: there the linear and convolutional
types are where it sees a type's savings).
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
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

from nas.demo import Stages, budget_from_table, run_stage_command, uniform_subnets  # noqa: E402
from search_spaces import Subnet, UserError, load_space  # noqa: E402

log = logging.getLogger("bench_claim")
PERCENTILES = (25.0, 50.0, 75.0)


@dataclass(frozen=True)
class Plan:
    """How big each stage is; ``FULL`` fits about two hours on an idle 2-core CPU."""

    train_time: str = "30m"
    train_batch: int = 8
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
    val_windows: int = 32  # fitness windows (each as long as the prefill)
    hurdles: int = 2  # rounds
    hurdle_candidates: int = 4
    hurdle_tokens: str = "300K"  # per round
    # Also the best candidate of each attention type: the 6M-token run found the supernet misjudging whole types
    # (convmod inherited 3.18 bits/byte, retrained 1.88), so the top 4 by inherited loss never held one.
    hurdle_per_type: int = 1
    baseline_checks: int = 2  # largest uniform models per (budget, type) timed on the device
    # The retraining budget of every model: 6M tokens (1,464 steps of 4 x 1024) takes 1-5 minutes a model here, about
    # an hour for the ~27 models of long.yaml at two at a time; 1.5M left every model near 3.1 bits/byte, early in training.
    tokens: str = "6M"
    retrain_batch: int = 4
    retrain_lr: float = 3e-3
    retrain_warmup: int = 30
    jobs: int = 2  # retrainings at a time (one thread each)
    test_windows: int = 64
    compare_repeats: int = 7
    compare_rounds: int = 4


FULL = Plan()
QUICK = replace(
    FULL, train_time="40s", train_batch=4, samples=10, repeats=3, rounds=2, min_sample_ms=5.0, population=6, parents=2,
    mutations=2, crossovers=2, generations=2, val_windows=4, hurdles=1, hurdle_candidates=2, hurdle_tokens="2K",
    baseline_checks=1, tokens="4K", retrain_batch=4, retrain_warmup=2, test_windows=4, compare_repeats=3, compare_rounds=2,
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


def interpolate_latency(curve: list[tuple[float, float]], bpb: float) -> tuple[float | None, str]:
    """Along (latency, bpb) points of one family, the latency at which it reaches ``bpb`` (linear between points)."""
    pts = sorted(curve)
    for (l0, b0), (l1, b1) in zip(pts, pts[1:]):
        if min(b0, b1) <= bpb <= max(b0, b1) and b0 != b1:
            return l0 + (l1 - l0) * (b0 - bpb) / (b0 - b1), "interpolated"
    at_or_worse = [lat for lat, b in pts if b >= bpb]
    if len(at_or_worse) == len(pts):  # every softmax point is worse: the cheapest of them already is
        return min(at_or_worse), "every softmax baseline is worse; the fastest of them"
    if not at_or_worse:
        return None, "no softmax baseline is as bad; the found model is worse than all of them"
    return max(at_or_worse), "the slowest softmax baseline that is no better"


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

    def cli(argv: list[str], ok=(0,)) -> None:
        run_stage_command(nas_main, argv, ok, rerun="the benchmark")

    # 1. supernet
    ckpt = Path(args.supernet) if args.supernet else out / "supernet" / "latest.pt"
    if not args.supernet:

        def train() -> None:
            common = ["--max-time", plan.train_time, "--threads", str(args.threads)]
            if ckpt.exists():
                cli(["train-supernet", "--out", str(ckpt.parent), "--resume", *common])
            else:
                cli(["train-supernet", str(args.space), "--out", str(ckpt.parent), "--seq-len", str(seq),
                     "--batch-size", str(plan.train_batch), "--seed", str(args.seed), *common])  # fmt: skip

        stage("train the supernet", train)

    # 2. latency on ONNX Runtime, one thread, CPU clock
    timings, predictor = out / "latency" / "timings.csv", out / "predictor"
    stage("measure latency", lambda: cli([
        "measure-latency", str(args.space), "--device", "onnxruntime", "--threads", "1", "--clock", "cpu",
        "--samples", str(plan.samples), "--warmup", str(plan.warmup), "--repeats", str(plan.repeats),
        "--rounds", str(plan.rounds), "--min-sample-ms", str(plan.min_sample_ms), "--seed", str(args.seed),
        "--out", str(timings)]))  # fmt: skip
    stage("fit the predictor", lambda: cli(["fit-predictor", str(timings), "--out", str(predictor), "--seed", str(args.seed)]))

    # 3. budgets
    budgets = [budget_from_table(timings, p) for p in PERCENTILES]
    labels = [f"{b:.3f}ms" for b in budgets]  # as given to --budget; the search's own labels come from search.json below
    log.info(
        "budgets: %s (the %s percentiles of the measured latencies)", ", ".join(labels), "/".join(f"{p:g}th" for p in PERCENTILES)
    )

    # 4. search, then the same search with hurdles
    search_dir = out / "search"
    search = ["search", str(ckpt), "--predictor", str(predictor), "--budget", ",".join(labels),
              "--population", str(plan.population), "--parents", str(plan.parents), "--mutations", str(plan.mutations),
              "--crossovers", str(plan.crossovers), "--generations", str(plan.generations), "--seq-len", str(seq),
              "--val-windows", str(plan.val_windows), "--seed", str(args.seed), "--out", str(search_dir), "--device", "cpu",
              "--verify", "onnxruntime", "--verify-top", "3", "--verify-threads", "1", "--verify-clock", "cpu"]  # fmt: skip
    stage("search", lambda: cli(search, ok=(0, 1)))
    hurdle_flags = ["--hurdles", str(plan.hurdles), "--hurdle-candidates", str(plan.hurdle_candidates),
                    "--hurdle-tokens", plan.hurdle_tokens, "--hurdle-per-type", str(plan.hurdle_per_type)]  # fmt: skip
    no_verify = search[: search.index("--verify")]  # the search's candidates were verified above
    stage("search with hurdles", lambda: cli([*no_verify, *hurdle_flags], ok=(0, 1)))
    summary = json.loads((search_dir / "search.json").read_text())
    labels = list(summary["budgets"])  # the search's labels of the budgets, in the order given
    assert len(labels) == len(budgets), (labels, budgets)
    found, found_h = {}, {}
    for label in labels:
        verified = search_dir / f"verified_{label}.yaml"
        best = summary["budgets"].get(label, {}).get("best")
        path = verified if verified.exists() else (search_dir / best["file"] if best else None)
        if path is not None:
            found[label] = Subnet.load(path)
        hurdled = search_dir / f"hurdles_{label}.yaml"
        if hurdled.exists():
            found_h[label] = Subnet.load(hurdled)

    # 5. baselines: the largest uniform model per (budget, type) under the budget by the predictor, checked on the device
    baselines_file = out / "baselines.json"
    stage(
        "pick baselines",
        lambda: baselines_file.write_text(
            json.dumps(pick_baselines(space, predictor, timings, budgets, labels, plan, args.seed), indent=1)
        ),
    )
    picked = json.loads(baselines_file.read_text())
    baselines = {(e["budget"], e["attention"]): Subnet.from_dict(e["subnet"]) for e in picked}

    # 6. retrain from scratch: the same tokens, seed, schedule and data for every model
    models: dict[str, Subnet] = {}
    roles: dict[str, list[str]] = {}

    def add(role: str, s: Subnet) -> None:
        models.setdefault(s.key, s)
        roles.setdefault(s.key, []).append(role)

    for label in labels:
        if label in found:
            add(f"found@{label}", found[label])
        if label in found_h:
            add(f"found+hurdles@{label}", found_h[label])
    for (label, attention), s in baselines.items():
        add(f"uniform {attention}@{label}", s)
    softmax = [s for s in uniform_subnets(space) if s.attention[0] == space.attention[0]]
    add(f"uniform {space.attention[0]} (largest)", max(softmax, key=lambda s: (params_of(space, s), s.key)))
    retrain_dir = out / "retrain"
    tokens = parse_tokens(plan.tokens)
    log.info(
        "retraining %d models from scratch, %s tokens each (%d at a time, one thread each)", len(models), f"{tokens:,}", plan.jobs
    )
    check_token_budget(retrain_dir, models, tokens)
    stage("retrain", lambda: retrain_all(space, models, retrain_dir, tokens, plan, args))

    # 7. time every retrained export side by side; 8. score on the test split
    stage(
        "measure and score",
        lambda: (out / "measured.json").write_text(
            json.dumps(measure_and_score(space, ckpt, models, retrain_dir, timings, plan, args.seed), indent=1)
        ),
    )
    measured = json.loads((out / "measured.json").read_text())
    share_file = out / "attention_share.json"
    stage("attention share", lambda: share_file.write_text(json.dumps(attention_share(space), indent=1)))

    result = report(space, labels, budgets, models, roles, measured, json.loads(share_file.read_text()), plan, tokens, out)
    result["stage_seconds"] = stage.all_seconds()
    result["wall_seconds_this_run"] = round(time.perf_counter() - t_start, 1)
    result["plan"] = asdict(plan)
    (out / "claim.json").write_text(json.dumps(result, indent=1))
    return result


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

    uniform = uniform_subnets(space)
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


def retrain_all(space, models: dict[str, Subnet], root: Path, tokens: int, plan: Plan, args) -> None:
    """``nas train-subnet`` for every model not yet done (resuming a started one), ``plan.jobs`` at a time."""
    root.mkdir(parents=True, exist_ok=True)

    def one(key: str, subnet: Subnet) -> None:
        d = root / key
        if (d / "model" / "model_card.json").exists() and (d / "model" / "model.onnx").exists():
            return
        d.mkdir(parents=True, exist_ok=True)
        spec = d / "subnet.yaml"
        spec.write_text(subnet.to_yaml())
        cmd = [sys.executable, "-m", "nas.cli", "train-subnet", str(spec), "--space", str(args.space), "--out", str(d / "model"),
               "--init", "scratch", "--tokens", str(tokens), "--seq-len", str(space.workload().seq_len),
               "--batch-size", str(plan.retrain_batch), "--lr", str(plan.retrain_lr), "--warmup", str(plan.retrain_warmup),
               "--seed", str(args.seed), "--threads", "1", "--eval-interval", "1000000", "--eval-batches", "4",
               "--ckpt-interval", "50", "-q"]  # fmt: skip
        if (d / "model" / "train" / "latest.pt").exists():
            cmd.append("--resume")
        log.info("retrain %s %s", key, subnet)
        with open(d / "log.txt", "a") as f:
            proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if proc.returncode != 0:
            raise UserError(f"retraining {subnet} failed (exit {proc.returncode}); see {d / 'log.txt'}")

    with ThreadPoolExecutor(max_workers=plan.jobs) as pool:
        list(pool.map(lambda kv: one(*kv), models.items()))


def measure_and_score(space, ckpt: Path, models: dict[str, Subnet], root: Path, timings: Path, plan: Plan, seed: int) -> dict:
    """Every retrained export timed side by side (one campaign); test bits/byte with retrained and inherited weights."""
    import torch

    from latency.device import get_device
    from latency.protocol import measure
    from latency.table import read_timings
    from latency.timing_core import Settings
    from supernet.artifact import load_model
    from supernet.checkpoint import load_supernet
    from supernet.data import prepare_corpus
    from supernet.heldout import HeldOut

    statics = {key: load_model(root / key / "model").eval() for key in models}
    files = {id(m): root / key / "model" / "model.onnx" for key, m in statics.items()}
    table = read_timings(timings)
    fp = table.fingerprint
    device = _FilesDevice(get_device("onnxruntime", threads=fp.get("threads") or 1, clock=fp.get("clock", "cpu")), files)
    settings = Settings(
        warmup=plan.warmup, repeats=plan.compare_repeats, rounds=plan.compare_rounds, min_sample_ms=plan.min_sample_ms
    )
    m = measure(device, statics, space.workload(), settings, seed=seed, baseline_ms=table.meta.get("baseline_ms"))

    supernet, payload = load_supernet(ckpt, device="cpu")
    meta = payload["meta"]
    corpus = prepare_corpus(meta["data"], ckpt.resolve().parent, meta["data_seed"], meta["val_fraction"])
    if len(corpus.test) == 0:
        raise UserError(f"{ckpt}: its corpus has no test split (too few documents)")
    seq = space.workload().seq_len
    rng = np.random.default_rng(seed + 7)
    starts = np.sort(rng.choice(len(corpus.test) - seq, size=min(plan.test_windows, len(corpus.test) - seq), replace=False))
    test = HeldOut(corpus.test, starts, seq)
    out = {}
    with torch.no_grad():
        for key, s in models.items():
            out[key] = {
                "measured_ms": m.results[key].median_ms,
                "iqr_ms": m.results[key].iqr_ms,
                "test_bpb": test.bits(statics[key], mixed_precision=False),
                "inherited_test_bpb": test.bits(supernet, s, mixed_precision=False),
                "card": str(root / key / "model" / "model_card.json"),
            }
    return {"test": {"windows": len(starts), "seq_len": seq, "tokens": test.tokens, "bytes_in_split": int(len(corpus.test))},
            "models": out}  # fmt: skip


def report(space, labels, budgets, models, roles, measured, share, plan: Plan, tokens: int, out: Path) -> dict:
    from scipy.stats import kendalltau

    rows = []
    for key, s in models.items():
        r = measured["models"][key]
        rows.append({"key": key, "roles": ";".join(roles[key]), "subnet": str(s), "params": params_of(space, s),
                     "attention": ",".join(dict.fromkeys(s.attention)), **r})  # fmt: skip
    with open(out / "claim.csv", "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(rows[0]))
        wr.writeheader()
        wr.writerows(rows)
    by_key = {r["key"]: r for r in rows}
    w = space.workload()
    lines = [f"the claim on space {space.name!r}, {w} on ONNX Runtime (1 thread, CPU clock); every model retrained from scratch "
             f"on {tokens:,} tokens (same seed, schedule, data); test split: {measured['test']['windows']} windows x "
             f"{measured['test']['seq_len']} bytes"]  # fmt: skip
    verdicts = {}
    for label, budget in zip(labels, budgets):
        mine = [r for r in rows if f"found@{label}" in r["roles"].split(";")]
        if not mine:
            lines.append(f"\nbudget {label}: the search found nothing")
            continue
        me = mine[0]
        base = [
            r
            for r in rows
            if r is not me and any(x.startswith("uniform") and x.endswith(f"@{label}") for x in r["roles"].split(";"))
        ]
        at_or_below = [r for r in base if r["measured_ms"] <= me["measured_ms"]]
        best = min(at_or_below, key=lambda r: r["test_bpb"]) if at_or_below else None
        ok = all(me["test_bpb"] < r["test_bpb"] for r in at_or_below)
        verdicts[label] = {"found": me["key"], "found_bpb": me["test_bpb"], "found_ms": me["measured_ms"],
                           "baselines_at_or_below": len(at_or_below), "beats_all": ok,
                           "best_baseline": best["key"] if best else None}  # fmt: skip
        pct = PERCENTILES[labels.index(label)]
        lines.append(f"\nbudget {label} (the {pct:g}th percentile of the measured latencies):")
        lines.append(f"  {'model':34} {'test bpb':>9} {'measured':>10} {'inherited':>9}  subnet")

        def tag(r: dict) -> str:  # the model's role at this budget
            return "found" if r is me else next(x for x in r["roles"].split(";") if x.endswith(f"@{label}")).split("@")[0]

        for r in [me] + sorted(base, key=lambda r: r["measured_ms"]):
            lines.append(
                f"  {tag(r):34} {r['test_bpb']:>9.4f} {r['measured_ms']:>8.3f}ms {r['inherited_test_bpb']:>9.4f}  {r['subnet']}"
            )
        if best is None:
            lines.append("  no uniform baseline measured at or below the found model's latency")
        else:
            worse = f"NOT lower than all (best: {tag(best)}, {best['test_bpb']:.4f} at {best['measured_ms']:.3f} ms)"
            lines.append(
                f"  found vs the {len(at_or_below)} baselines at equal or lower measured latency: "
                + ("LOWER bits/byte than all" if ok else worse)
            )
        hurdled = [r for r in rows if f"found+hurdles@{label}" in r["roles"].split(";")]
        if hurdled:
            h = hurdled[0]
            same = h["key"] == me["key"]
            over = h["measured_ms"] > budget  # the hurdle stage ranks the search's candidates by the predictor alone
            verdicts[label]["hurdles"] = {"changed": not same, "bpb": h["test_bpb"], "delta": h["test_bpb"] - me["test_bpb"],
                                          "measured_ms": h["measured_ms"], "over_budget": over}  # fmt: skip
            lines.append(
                "  hurdles: "
                + (
                    "kept the same winner"
                    if same
                    else f"another winner, {h['test_bpb']:.4f} bits/byte ({h['test_bpb'] - me['test_bpb']:+.4f}), "
                    f"{h['measured_ms']:.3f} ms" + (" (over the budget as measured)" if over else "")
                )
            )
    # speedup over uniform softmax at equal or better bpb
    soft = space.attention[0]
    curve = [
        (r["measured_ms"], r["test_bpb"])
        for r in rows
        if r["attention"] == soft and any(x.startswith(f"uniform {soft}") for x in r["roles"].split(";"))
    ]
    speedups = {}
    lines.append(f"\nspeedup over uniform {soft} at equal or better bits/byte (its {len(curve)} retrained baselines):")
    for label in labels:
        if label not in verdicts:
            continue
        me = by_key[verdicts[label]["found"]]
        lat, how = interpolate_latency(curve, me["test_bpb"]) if curve else (None, "no softmax baselines")
        speedups[label] = None if lat is None else lat / me["measured_ms"]
        lines.append(
            f"  {label}: "
            + (
                f"{speedups[label]:.2f}x ({how}: {soft} at {lat:.3f} ms vs found {me['measured_ms']:.3f} ms)"
                if lat is not None
                else how
            )
        )
    inh, ret = [r["inherited_test_bpb"] for r in rows], [r["test_bpb"] for r in rows]
    tau = float(kendalltau(inh, ret).statistic) if len(rows) > 2 else float("nan")
    lines.append(f"\nKendall tau, inherited vs retrained test bits/byte over {len(rows)} models: {tau:.3f}")
    lines.append(f"largest subnet {share['subnet']}: {share['attention_share']:.1%} of ONNX Runtime's node time in Attention "
                 f"(top ops: {', '.join(f'{k} {v:.0%}' for k, v in share['top_ops'].items())})")  # fmt: skip
    plot(rows, labels, budgets, soft, out / "claim.png")
    text = "\n".join(lines)
    print(text)
    return {"verdicts": verdicts, "speedup_over_softmax": speedups, "kendall_tau": tau, "attention_share": share,
            "tokens_per_model": tokens, "rows": rows, "text": text}  # fmt: skip


def plot(rows, labels, budgets, soft: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5))
    types = sorted({r["attention"] for r in rows if "uniform" in r["roles"]})
    cmap = plt.get_cmap("tab20")
    for i, t in enumerate(types):
        pts = [
            (r["measured_ms"], r["test_bpb"])
            for r in rows
            if r["attention"] == t and "uniform" in r["roles"] and "found" not in r["roles"]
        ]
        if pts:
            ax.scatter(*zip(*pts), marker="o", s=30, color=cmap(i % 20), label=f"uniform {t}")
    for role, marker, name in (("found@", "*", "found"), ("found+hurdles@", "D", "found + hurdles")):
        pts = [(r["measured_ms"], r["test_bpb"]) for r in rows if any(x.startswith(role) for x in r["roles"].split(";"))]
        if pts:
            ax.scatter(*zip(*pts), marker=marker, s=160 if marker == "*" else 60, color="black", label=name, zorder=3)
    for b in budgets:
        ax.axvline(b, color="grey", linestyle=":", linewidth=1)
    ax.set(
        xlabel="measured latency, ms (ONNX Runtime, 1 thread)",
        ylabel="test bits/byte (retrained)",
        title="found vs hand-scaled, retrained",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="run directory (resumable: run again to continue)")
    p.add_argument("--space", default="long", help="space name or YAML (default long)")
    p.add_argument("--supernet", help="a trained supernet checkpoint of the space (skips training)")
    p.add_argument("--quick", action="store_true", help="the whole path in minutes (tiny budgets; for the test)")
    p.add_argument("--tokens", help="retraining tokens per model (default: the plan's, 6M; quick 4K)")
    p.add_argument("--train-time", help="supernet training time (default 30m)")
    p.add_argument("--threads", type=int, default=2, help="threads for supernet training (default 2)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    plan = QUICK if args.quick else FULL
    if args.tokens:
        plan = replace(plan, tokens=args.tokens)
    if args.train_time:
        plan = replace(plan, train_time=args.train_time)
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
