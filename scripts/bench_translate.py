"""HAT's table on translation: do searched encoder-decoders beat hand-scaled Transformers after retraining?

    python scripts/bench_translate.py --out runs/bt                   # translate-tiny, ONNX Runtime (about 45 minutes)
    python scripts/bench_translate.py --out runs/bt --device cpu      # timed by torch on the CPU instead
    python scripts/bench_translate.py --out runs/bt --supernet CKPT   # reuse a trained encoder-decoder supernet
    python scripts/bench_translate.py --out runs/btq --quick --space tests/fixtures/translate_quick.yaml --data toy.tsv

Stages (each the documented command run in-process, each resumable: run the same command again):

1. train the supernet (``nas train-supernet``, sandwich + distillation; skipped with ``--supernet``);
2. time sampled subnets on the translate workload (``nas measure-latency --timing-target D``, one thread, the thread's
   CPU time) and fit a predictor (``nas fit-predictor``);
3. budgets at the 25th, 50th and 75th percentile of the measured latencies;
4. search (``nas search``: held-out cross-entropy per target byte with inherited weights) under the three budgets;
5. baselines, hand-scaled Transformers (every layer of both sides the same width, heads, FFN and attention type;
   every decoder layer's cross-attention the same heads over the same last encoder layers): per budget and
   attention type the largest under the budget by the predictor, checked on the device; plus a ladder of uniform
   softmax Transformers (the vanilla one: cross-attention to the last encoder layer) across widths and depths;
6. retrain from scratch every found subnet and baseline with ``nas train-subnet`` (the same token budget in
   target bytes, seed, schedule and data for all), then decode the same first ``--test-pairs`` pairs of the test
   split with beam 5 and score chrF and BLEU (``nas translate --eval test``, sacrebleu);
7. time every retrained model side by side in one interleaved campaign on the device.

Writes ``translate.csv``, ``translate.json`` and ``translate.png`` (chrF against measured latency: found, uniform,
the front) and prints HAT's table: per model chrF, BLEU, measured ms and parameters; per budget whether the found
model has a higher chrF than every uniform baseline at equal or lower measured latency, or reaches the best
baseline's chrF at >= 1.3x lower latency (PASS / FAIL), with the speedup over the uniform model of equal or
lower chrF; the stage wall times.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import logging
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_claim: the LM's version, whose rules this follows

from bench_claim import parse_tokens  # noqa: E402
from nas.demo import Stages, budget_from_table, run_stage_command  # noqa: E402
from search_spaces import UserError, load_space  # noqa: E402
from tasks.translation.space import TASK as TRANSLATION, Seq2SeqSpace, Seq2SeqSubnet  # noqa: E402
from search_spaces.space import Subnet  # noqa: E402

log = logging.getLogger("bench_translate")
PERCENTILES = (25.0, 50.0, 75.0)
SPEEDUP = 1.3  # the issue's target: the best baseline's chrF at >= 1.3x lower latency
BEAM = 5


@dataclass(frozen=True)
class Plan:
    """How big each stage is; ``FULL`` fits about 45 minutes on 2 idle cores for translate-tiny."""

    train_steps: int = 5000  # supernet: about 8 sandwich steps/s at batch 32 on 2 idle cores, about 11 minutes
    train_batch: int = 32
    train_eval_interval: int = 500
    samples: int = 100  # subnets timed (+ 20% re-measured)
    retest: float = 0.2
    warmup: int = 2
    repeats: int = 5
    rounds: int = 3
    min_sample_ms: float = 20.0
    population: int = 24
    parents: int = 6
    mutations: int = 10
    crossovers: int = 10
    generations: int = 8
    val_windows: int = 8  # fitness batches of eval_batch validation pairs
    eval_batch: int = 16
    baseline_checks: int = 2  # largest uniform models per (budget, type) timed on the device
    ladder: int = 6  # uniform softmax Transformers across widths and depths
    # Every model's retraining budget in target bytes (EOS included): 4M is 3,206 steps of 32 pairs of the de catalogs
    # (39 target bytes a pair), 1-5 minutes a translate-tiny model with one thread (46 steps/s the smallest, 10 the
    # largest on an idle core).
    tokens: str = "4M"
    retrain_batch: int = 32
    retrain_lr: float = 3e-3
    retrain_warmup: int = 100
    jobs: int = 2  # retrainings at a time (one thread each; in-process when 1)
    test_pairs: int = 300
    compare_repeats: int = 7
    compare_rounds: int = 4


FULL = Plan()
QUICK = replace(
    FULL, train_steps=20, train_batch=8, train_eval_interval=10, samples=12, retest=0.0, warmup=1, repeats=2, rounds=2,
    min_sample_ms=1.0, population=6, parents=2, mutations=2, crossovers=2, generations=2, val_windows=2, eval_batch=4,
    baseline_checks=1, ladder=2, tokens="2K", retrain_batch=8, retrain_warmup=2, jobs=1, test_pairs=6, compare_repeats=2,
    compare_rounds=2,
)  # fmt: skip


# --------------------------------------------------------------------------- models


def uniform_seq2seq(space) -> list[Seq2SeqSubnet]:
    """Every hand-scaled encoder-decoder of the space: one width for both sides, every layer of both sides the same
    heads, FFN width and attention type, every decoder layer's cross-attention the same heads over the same last
    encoder layers (where the space allows each choice)."""
    enc, dec = space.encoder, space.decoder
    out = []
    grid = itertools.product(sorted(set(enc.embed_dim) & set(dec.embed_dim)), enc.depth, dec.depth, enc.heads,
                             enc.ffn_dim, enc.attention, space.cross_layers)  # fmt: skip
    for e, de, dd, h, f, a, k in grid:
        if h not in dec.heads or f not in dec.ffn_dim or a not in dec.attention or h not in space.cross_heads:
            continue
        s = Seq2SeqSubnet(Subnet(e, de, (h,) * de, (f,) * de, (a,) * de), Subnet(e, dd, (h,) * dd, (f,) * dd, (a,) * dd),
                          (h,) * dd, (k,) * dd)  # fmt: skip
        if not space.problems(s):
            out.append(s)
    return out


def params_of(space, subnet) -> int:
    from tasks.translation.timing import seq2seq_params

    return seq2seq_params(space, subnet)


def ladder(space, n: int) -> list[Seq2SeqSubnet]:
    """Up to ``n`` vanilla Transformers (uniform softmax, cross-attention to the last encoder layer, the most heads and
    the widest FFN) across widths and decoder depths, spread over their sizes."""
    soft = space.encoder.attention[0]
    first = min(space.cross_layers)
    top_h = max(h for h in space.encoder.heads if h in space.decoder.heads and h in space.cross_heads)
    top_f = max(f for f in space.encoder.ffn_dim if f in space.decoder.ffn_dim)
    pool = sorted((s for s in uniform_seq2seq(space) if s.encoder.attention[0] == soft and s.cross_layers[0] == first
                   and s.encoder.heads[0] == top_h and s.encoder.ffn_dim[0] == top_f),
                  key=lambda s: (params_of(space, s), s.key))  # fmt: skip
    if len(pool) <= n:
        return pool
    picks = sorted({round(i * (len(pool) - 1) / max(n - 1, 1)) for i in range(n)})
    return [pool[i] for i in picks]


def _timing_device(name: str):
    from latency.device import get_device

    return get_device(name, threads=1, clock="cpu")


def _measure(space, device, models: dict, workload, settings, seed: int, baseline_ms):
    from latency.protocol import measure
    from tasks.translation.timing import seq2seq_reference

    return measure(device, models, workload, settings, seed=seed, reference=seq2seq_reference(space), baseline_ms=baseline_ms)


def pick_baselines(space, predictor_dir: Path, timings: Path, budgets, labels, plan: Plan, device_name: str, seed: int):
    """Per (budget, type): the uniform models under the budget by the predictor, largest first; the first
    ``plan.baseline_checks`` of them timed on the device (one campaign); the largest whose measured time holds
    (bench_claim's rule, :func:`bench_claim.choose_baselines`)."""
    from bench_claim import choose_baselines
    from latency.predictors import load_predictor
    from latency.table import read_timings
    from latency.timing_core import Settings
    from tasks.translation.timing import seq2seq_timing_model

    uniform = uniform_seq2seq(space)
    table = read_timings(timings)
    device = _timing_device(device_name)
    materialize = getattr(device, "needs_weights", True)
    settings = Settings(warmup=plan.warmup, repeats=plan.repeats, rounds=plan.rounds, min_sample_ms=plan.min_sample_ms)

    def time_them(subnets: list) -> dict:
        models = {s.key: seq2seq_timing_model(space, s, materialize=materialize) for s in subnets}
        m = _measure(space, device, models, space.workload(), settings, seed, table.meta.get("baseline_ms"))
        return {s: m.results[s.key].median_ms for s in subnets}

    return choose_baselines(uniform, load_predictor(predictor_dir).predict(uniform), [params_of(space, s) for s in uniform],
                            budgets, labels, space.encoder.attention, lambda s: s.encoder.attention[0],
                            plan.baseline_checks, time_them)  # fmt: skip


# --------------------------------------------------------------------------- retraining and scoring


def check_token_budget(root: Path, models: dict, tokens: int) -> None:
    """Models already retrained under ``root`` must have had this token budget (a rerun with another --tokens is refused)."""
    budgets = {}
    for key in models:
        card = root / key / "model" / "model_card.json"
        if card.exists():
            budgets[key] = json.loads(card.read_text())["training"]["token_budget"]
    other = sorted({b for b in budgets.values() if b != tokens})
    if other:
        raise UserError(f"{root}: models there were retrained on {', '.join(f'{b:,}' for b in other)} target bytes each, "
                        f"not {tokens:,}: give --tokens {other[0]} to report that run, or another --out for a new one")


def _scored(model_dir: Path, pairs: int) -> bool:
    card = model_dir / "model_card.json"
    if not card.exists():
        return False
    quality = json.loads(card.read_text()).get("quality", {}).get("test", {})
    return quality.get("limit") == pairs and quality.get("beam") == BEAM


def retrain_all(models: dict, root: Path, tokens: int, plan: Plan, args, space_arg: str) -> None:
    """``nas train-subnet`` then ``nas translate --eval test`` for every model not yet done (resuming a started one),
    ``plan.jobs`` at a time (subprocesses of one thread each; in this process when 1)."""
    from nas.cli import main as nas_main

    root.mkdir(parents=True, exist_ok=True)
    data = ["--data", str(Path(args.data).resolve())] if args.data else (["--lang", args.lang] if args.lang else [])

    def one(key: str, subnet) -> None:
        d = root / key
        model = d / "model"
        d.mkdir(parents=True, exist_ok=True)
        spec = d / "subnet.yaml"
        spec.write_text(subnet.to_yaml())
        commands = []
        if not (model / "model_card.json").exists():
            train = ["train-subnet", str(spec), "--space", space_arg, "--out", str(model), "--init", "scratch",
                     "--tokens", str(tokens), "--batch-size", str(plan.retrain_batch), "--lr", str(plan.retrain_lr),
                     "--lr-warmup", str(plan.retrain_warmup), "--seed", str(args.seed), "--threads", "1",
                     "--eval-interval", "1000000", "--eval-batches", "4", "--ckpt-interval", "100", *data, "-q"]  # fmt: skip
            if (model / "train" / "latest.pt").exists():
                train = ["train-subnet", "--out", str(model), "--resume", "--threads", "1", "-q"]
            commands.append(train)
        if not _scored(model, plan.test_pairs):
            commands.append(["translate", "--model", str(model), "--eval", "test", "--beam", str(BEAM), "--limit",
                             str(plan.test_pairs), "-q"])  # fmt: skip
        for argv in commands:
            log.info("%s %s: nas %s", key, subnet, argv[0])
            if plan.jobs == 1:
                run_stage_command(nas_main, argv, rerun="the benchmark")
                continue
            with open(d / "log.txt", "a") as f:
                proc = subprocess.run([sys.executable, "-m", "nas.cli", *argv], stdout=f, stderr=subprocess.STDOUT,
                                      env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
            if proc.returncode != 0:
                raise UserError(f"`nas {argv[0]}` of {subnet} failed (exit {proc.returncode}); see {d / 'log.txt'}")

    if plan.jobs == 1:
        for kv in models.items():
            one(*kv)
        return
    with ThreadPoolExecutor(max_workers=plan.jobs) as pool:
        list(pool.map(lambda kv: one(*kv), models.items()))


def measure_retrained(space, models: dict, root: Path, timings: Path, plan: Plan, device_name: str, seed: int) -> dict:
    """Every retrained model timed side by side (one interleaved campaign), with its card's chrF / BLEU / training."""
    from latency.table import read_timings
    from latency.timing_core import Settings
    from tasks.translation.artifact import load_seq2seq_model

    statics, cards = {}, {}
    for key in models:
        statics[key], cards[key] = load_seq2seq_model(root / key / "model")
    table = read_timings(timings)
    settings = Settings(warmup=plan.warmup, repeats=plan.compare_repeats, rounds=plan.compare_rounds,
                        min_sample_ms=plan.min_sample_ms)  # fmt: skip
    m = _measure(space, _timing_device(device_name), statics, space.workload(), settings, seed, table.meta.get("baseline_ms"))
    out = {}
    for key in models:
        quality, training = cards[key]["quality"]["test"], cards[key]["training"]
        out[key] = {"measured_ms": m.results[key].median_ms, "iqr_ms": m.results[key].iqr_ms, "chrf": quality["chrf"],
                    "bleu": quality["bleu"], "test_pairs": quality["pairs"], "val_ce": training["ce_after"],
                    "steps": training["steps"], "tokens": training["tokens"], "token_budget": training["token_budget"],
                    "corpus_hash": training["corpus_hash"], "card": str(root / key / "model" / "model_card.json")}  # fmt: skip
    return out


# --------------------------------------------------------------------------- the benchmark


def run(args, plan: Plan) -> dict:
    from nas.cli import main as nas_main

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    space = load_space(args.space)
    if not isinstance(space, Seq2SeqSpace):
        raise UserError(f"--space {args.space}: task {space.task}, not {TRANSLATION} (an encoder-decoder translation space)")
    if args.data and args.lang:
        raise UserError("give --data (your own source<TAB>target file) or --lang (the system's gettext catalogs), not both")
    space_arg = str(Path(args.space).resolve()) if Path(args.space).exists() else args.space
    stage = Stages(out, log)

    def cli(argv: list[str], ok=(0,)) -> None:
        run_stage_command(nas_main, argv, ok, rerun="the benchmark")

    # 1. supernet
    run_dir = out / "supernet"
    ckpt = Path(args.supernet) if args.supernet else run_dir / "final.pt"
    if not args.supernet:
        data = ["--data", str(Path(args.data).resolve())] if args.data else (["--lang", args.lang] if args.lang else [])

        def train() -> None:
            if (run_dir / "latest.pt").exists():
                cli(["train-supernet", "--out", str(run_dir), "--resume", "--threads", str(args.threads)])
            else:
                cli(["train-supernet", space_arg, "--out", str(run_dir), "--max-steps", str(plan.train_steps),
                     "--batch-size", str(plan.train_batch), "--eval-interval", str(plan.train_eval_interval),
                     "--eval-batches", "8", "--seed", str(args.seed), "--threads", str(args.threads), *data])  # fmt: skip

        stage("train the supernet", train)

    # 2. latency of sampled subnets on the device, one thread, CPU clock; the predictor
    timings, predictor = out / "latency" / "timings.csv", out / "predictor"
    stage("measure latency", lambda: cli([
        "measure-latency", space_arg, "--timing-target", args.device, "--timing-threads", "1", "--clock", "cpu",
        "--samples", str(plan.samples), "--retest", str(plan.retest), "--timing-warmup", str(plan.warmup),
        "--repeats", str(plan.repeats), "--rounds", str(plan.rounds), "--min-sample-ms", str(plan.min_sample_ms),
        "--seed", str(args.seed), "--out", str(timings)]))  # fmt: skip
    stage("fit the predictor", lambda: cli(["fit-predictor", str(timings), "--out", str(predictor), "--seed", str(args.seed)]))

    # 3. budgets
    budgets = [budget_from_table(timings, p) for p in PERCENTILES]
    labels = [f"{b:.3f}ms" for b in budgets]
    log.info("budgets: %s (the 25th/50th/75th percentiles of the measured latencies)", ", ".join(labels))

    # 4. search under the three budgets
    search_dir = out / "search"
    stage("search", lambda: cli([
        "search", str(ckpt), "--predictor", str(predictor), "--budget", ",".join(labels), "--population",
        str(plan.population), "--parents", str(plan.parents), "--mutations", str(plan.mutations), "--crossovers",
        str(plan.crossovers), "--generations", str(plan.generations), "--val-windows", str(plan.val_windows),
        "--eval-batch-size", str(plan.eval_batch), "--seed", str(args.seed), "--out", str(search_dir), "--device", "cpu",
        "--no-progress"], ok=(0, 1)))  # fmt: skip
    summary = json.loads((search_dir / "search.json").read_text())
    labels = list(summary["budgets"])  # the search's labels of the budgets, in the order given
    assert len(labels) == len(budgets), (labels, budgets)
    found = {}
    for label in labels:
        best = summary["budgets"].get(label, {}).get("best")
        if best:
            found[label] = space.check(Seq2SeqSubnet.load(search_dir / best["file"]))

    # 5. baselines
    baselines_file = out / "baselines.json"
    stage("pick baselines", lambda: baselines_file.write_text(json.dumps(
        pick_baselines(space, predictor, timings, budgets, labels, plan, args.device, args.seed), indent=1)))  # fmt: skip
    picked = json.loads(baselines_file.read_text())

    models: dict[str, Seq2SeqSubnet] = {}
    roles: dict[str, list[str]] = {}

    def add(role: str, s) -> None:
        models.setdefault(s.key, s)
        roles.setdefault(s.key, []).append(role)

    for label in labels:
        if label in found:
            add(f"found@{label}", found[label])
    for e in picked:
        add(f"uniform {e['attention']}@{e['budget']}", Seq2SeqSubnet.from_dict(e["subnet"]))
    for s in ladder(space, plan.ladder):
        add(f"uniform {space.encoder.attention[0]} ladder", s)

    # 6. retrain from scratch with one token budget, seed, schedule and data; chrF / BLEU on the same test pairs
    retrain_dir = out / "retrain"
    tokens = parse_tokens(plan.tokens)
    log.info("retraining %d models from scratch, %s target bytes each (%d at a time, one thread each); beam %d on the "
             "first %d test pairs", len(models), f"{tokens:,}", plan.jobs, BEAM, plan.test_pairs)  # fmt: skip
    check_token_budget(retrain_dir, models, tokens)
    stage("retrain and score", lambda: retrain_all(models, retrain_dir, tokens, plan, args, space_arg))

    # 7. one interleaved timing campaign of every retrained model
    measured_file = out / "measured.json"
    stage("measure retrained", lambda: measured_file.write_text(json.dumps(
        measure_retrained(space, models, retrain_dir, timings, plan, args.device, args.seed), indent=1)))  # fmt: skip
    measured = json.loads(measured_file.read_text())

    result = report(space, labels, budgets, models, roles, measured, plan, tokens, args.device, out)
    result["stage_seconds"] = stage.all_seconds()
    result["wall_seconds_this_run"] = round(time.perf_counter() - t_start, 1)
    result["plan"] = asdict(plan)
    print("\nstage wall times: " + ", ".join(f"{k} {v:.0f} s" for k, v in result["stage_seconds"].items()))
    (out / "translate.json").write_text(json.dumps(result, indent=1))
    return result


def verdict(me: dict, uniform: list[dict], at_budget: list[dict]) -> dict:
    """The issue's target at one budget: ``me`` (the found model's row) has a higher chrF than every uniform baseline
    at equal or lower measured latency, or reaches the best baseline's chrF (of ``at_budget``, this budget's picks)
    at >= 1.3x lower latency.  Also the speedup over the uniform model of equal or lower chrF (the best such, the
    fastest of equals: the conservative reading)."""
    at_or_below = [r for r in uniform if r["measured_ms"] <= me["measured_ms"]]
    beats = bool(at_or_below) and all(me["chrf"] > r["chrf"] for r in at_or_below)
    best = max(at_budget, key=lambda r: (r["chrf"], -r["measured_ms"])) if at_budget else None
    best_speedup = best["measured_ms"] / me["measured_ms"] if best else None
    reaches = best is not None and me["chrf"] >= best["chrf"] and best_speedup >= SPEEDUP
    matched = [r for r in uniform if r["chrf"] <= me["chrf"]]
    ref = max(matched, key=lambda r: (r["chrf"], -r["measured_ms"])) if matched else None  # ties: the fastest
    return {"found": me["key"], "chrf": me["chrf"], "measured_ms": me["measured_ms"], "baselines_at_or_below": len(at_or_below),
            "beats_all_at_or_below": beats, "best_baseline": best["key"] if best else None,
            "best_baseline_chrf": best["chrf"] if best else None, "speedup_over_best": best_speedup,
            "reaches_best_1_3x_faster": reaches, "equal_or_lower_chrf_uniform": ref["key"] if ref else None,
            "speedup": ref["measured_ms"] / me["measured_ms"] if ref else None, "pass": beats or reaches}  # fmt: skip


def report(space, labels, budgets, models, roles, measured, plan: Plan, tokens: int, device: str, out: Path) -> dict:
    rows = []
    for key, s in models.items():
        r = measured[key]
        rows.append({"key": key, "roles": ";".join(roles[key]), "subnet": str(s), "params": params_of(space, s),
                     "attention": ",".join(dict.fromkeys(s.encoder.attention + s.decoder.attention)), **r})  # fmt: skip
    with open(out / "translate.csv", "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(rows[0]))
        wr.writeheader()
        wr.writerows(rows)
    uniform = [r for r in rows if any(x.startswith("uniform") for x in r["roles"].split(";"))]
    w = space.workload()
    budgets_tok = sorted({r["token_budget"] for r in rows})
    steps = sorted({r["steps"] for r in rows})
    lines = [f"HAT's table on space {space.name!r}, {w} on {device} (1 thread, CPU clock); every model retrained from "
             f"scratch on {', '.join(f'{b:,}' for b in budgets_tok)} target bytes ({', '.join(map(str, steps))} steps of "
             f"{plan.retrain_batch} pairs; same seed, schedule and data); chrF / BLEU: beam {BEAM} on the first "
             f"{plan.test_pairs} pairs of the test split (sacrebleu)",
             f"\n{'model':30} {'chrF':>6} {'BLEU':>6} {'measured':>10} {'params':>9}  subnet"]  # fmt: skip
    for r in sorted(rows, key=lambda r: r["measured_ms"]):
        role = r["roles"].split(";")
        role = role[0] + (f" (+{len(role) - 1})" if len(role) > 1 else "")
        lines.append(f"{role[:30]:30} {r['chrf']:>6.2f} {r['bleu']:>6.2f} {r['measured_ms']:>8.3f}ms "
                     f"{r['params']:>9,}  {r['subnet']}")  # fmt: skip
    verdicts = {}
    for label, budget in zip(labels, budgets):
        pct = PERCENTILES[labels.index(label)]
        mine = [r for r in rows if f"found@{label}" in r["roles"].split(";")]
        if not mine:
            lines.append(f"\nbudget {label} (the {pct:g}th percentile): FAIL (the search found nothing under it)")
            continue
        me = mine[0]
        others = [r for r in uniform if r is not me]
        at_budget = [r for r in others if any(x.startswith("uniform") and x.endswith(f"@{label}") for x in r["roles"].split(";"))]
        v = verdict(me, others, at_budget)
        verdicts[label] = v
        why = []
        why.append(f"chrF {me['chrf']:.2f} at {me['measured_ms']:.3f} ms; " + (
            f"higher than all {v['baselines_at_or_below']} uniform baselines at equal or lower latency"
            if v["beats_all_at_or_below"] else
            f"not higher than all {v['baselines_at_or_below']} uniform baselines at equal or lower latency"))  # fmt: skip
        if v["best_baseline"]:
            why.append(f"best baseline of the budget {v['best_baseline_chrf']:.2f} chrF, {v['speedup_over_best']:.2f}x the "
                       "found model's latency")  # fmt: skip
        why.append(f"speedup over the uniform model of equal or lower chrF: {v['speedup']:.2f}x" if v["speedup"] else
                   "no uniform model has equal or lower chrF")  # fmt: skip
        if me["measured_ms"] > budget:
            why.append("the found model is over the budget as measured")
        lines.append(f"\nbudget {label} (the {pct:g}th percentile): {'PASS' if v['pass'] else 'FAIL'} ({'; '.join(why)})")
    plot(rows, budgets, device, out / "translate.png")
    text = "\n".join(lines)
    print(text)
    return {"verdicts": verdicts, "tokens_per_model": tokens, "rows": rows, "text": text}


def front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The (latency, chrF) points no other point beats on both (lower latency, higher chrF), by latency."""
    out, best = [], float("-inf")
    for lat, q in sorted(points, key=lambda p: (p[0], -p[1])):
        if q > best:
            out.append((lat, q))
            best = q
    return out


def plot(rows, budgets, device: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5))
    cmap = plt.get_cmap("tab10")
    uniform = [r for r in rows if "uniform" in r["roles"] and "found" not in r["roles"]]
    for i, t in enumerate(sorted({r["attention"] for r in uniform})):
        pts = [(r["measured_ms"], r["chrf"]) for r in uniform if r["attention"] == t]
        ax.scatter(*zip(*pts), marker="o", s=30, color=cmap(i % 10), label=f"uniform {t}")
    found = [(r["measured_ms"], r["chrf"]) for r in rows if "found" in r["roles"]]
    if found:
        ax.scatter(*zip(*found), marker="*", s=160, color="black", label="found (searched)", zorder=3)
    f = front([(r["measured_ms"], r["chrf"]) for r in rows])
    ax.plot(*zip(*f), color="grey", linewidth=1, drawstyle="steps-post", label="front")
    for b in budgets:
        ax.axvline(b, color="grey", linestyle=":", linewidth=1)
    ax.set(xlabel=f"measured latency, ms ({device}, 1 thread, translate workload)", ylabel="test chrF (retrained, beam 5)",
           title="found vs hand-scaled encoder-decoders, retrained")  # fmt: skip
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="run directory (resumable: run again to continue)")
    p.add_argument("--space", default="translate-tiny", help="translation space name or YAML (default translate-tiny)")
    p.add_argument("--supernet", help="a trained encoder-decoder supernet checkpoint of the space (skips training)")
    p.add_argument("--device", default="onnxruntime", help="where latency is measured (default onnxruntime; cpu: torch)")
    p.add_argument("--data", help="a source<TAB>target file instead of the system's gettext catalogs")
    p.add_argument("--lang", help="target language of the gettext catalogs (default de)")
    p.add_argument("--quick", action="store_true", help="the whole path in a minute (tiny budgets; for the test)")
    p.add_argument("--tokens", help="retraining target bytes per model (default: the plan's, 4M; quick 2K)")
    p.add_argument("--test-pairs", type=int, help="test pairs decoded per model (default 300; quick 6)")
    p.add_argument("--train-steps", type=int, help="supernet training steps (default 5000)")
    p.add_argument("--threads", type=int, default=2, help="threads for supernet training (default 2)")
    p.add_argument("--jobs", type=int, help="retrainings at a time, one thread each (default 2; quick 1: in-process)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    plan = QUICK if args.quick else FULL
    given = (("tokens", args.tokens), ("test_pairs", args.test_pairs), ("train_steps", args.train_steps), ("jobs", args.jobs))
    for field, value in given:
        if value is not None:
            plan = replace(plan, **{field: value})
    t0 = time.perf_counter()
    try:
        if min(plan.test_pairs, plan.train_steps, plan.jobs) < 1:
            raise UserError("--test-pairs / --train-steps / --jobs: give a positive integer")
        run(args, plan)
    except UserError as e:
        print(f"bench_translate: error: {e}", file=sys.stderr)
        return 2
    print(f"\nwall time {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
