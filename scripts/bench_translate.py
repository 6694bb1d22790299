"""HAT's claim on HAT's task: do searched encoder-decoders beat hand-scaled Transformers after retraining, judged on
enough pairs to tell?

    python scripts/bench_translate.py --out runs/bt                   # translate-tiny, ONNX Runtime (about 2.5 hours)
    python scripts/bench_translate.py --out runs/bt --retrain-bytes 8M   # a larger retraining budget (ladder gate)
    python scripts/bench_translate.py --out runs/btq --quick --space tests/fixtures/translate_quick.yaml --data toy.tsv

The LM's protocol (``scripts/bench_claim.py``) on translation; every stage is the documented command or a library call,
each resumable (run the same command again):

1. the supernet (``nas train-supernet --balance types``: the sandwich's largest and smallest rotate over the attention
   types both sides offer; skipped with ``--supernet``);
2. time sampled subnets on the translate workload (one thread, the thread's CPU time) and fit a latency predictor;
3. three budgets (bench_claim's rule: the lowest under every type's largest uniform model, the 50th and 75th percentile);
4. baselines, hand-scaled Transformers (both sides one width, every layer the same heads, FFN and attention type, every
   cross-attention the same heads over the same last encoder layers): per budget and type the largest under it,
   checked on the device; a ladder of vanilla softmax Transformers across widths and decoder depths;
5. retrain the baselines by the final-training recipe (``nas train-subnet``: one budget in target bytes, seed, schedule
   and data);
6. search under the three budgets with ``--verify`` on the device (the candidates' measured latency must hold);
7. retrain the found models; 8. score every model on the *whole* test split, which no search or training saw:
   held-out cross-entropy per target byte (nats, EOS counted; the primary metric:
   :func:`tasks.translation.train.split_ce`), chrF and BLEU at beam 5 (sacrebleu), the hypotheses kept;
9. time every retrained model side by side (one campaign, on a quiet machine: the load is recorded);
10. retrain the found model and the best baseline of each budget at more seeds (``--seeds``, default 3) and score them.

Step 5 also calibrates the ranker (``nas fit-accuracy``, the LM protocol's): the retrained baselines and ladder (every
type, several sizes) scored on the search's validation pairs with their own weights and with the supernet's; the
search then ranks by the ranker's predicted retrained cross-entropy (``--fitness calibrated``; its leave-one-out fit
is ``translate.json``'s ``ranker``), its top candidates verified on the device, and successive halving from scratch
among those that hold (``--hurdles --hurdle-from scratch``, each round ``hurdle_tokens`` target bytes) picks the
found model, as in the LM's protocol.

Report (``translate.json``, ``translate.csv``, ``translate.png`` with seed error bars): the ladder gate first (Spearman
between size and quality over the retrained softmax ladder, by cross-entropy and by chrF, >= 0.8 each: below it no
verdict is given, and the report names the retraining budget it took: raise ``--retrain-bytes``); the seed standard
deviations; per budget the found model against every uniform baseline at or below its measured latency
(cross-entropy: better / tie / worse against 2 seed SD; chrF: sacrebleu's paired bootstrap, p < 0.05, **and** the
difference of the seed means against 2 seed SD of chrF, pooled as cross-entropy's is: better or worse only when both
say so, else a tie, so a sentence-level difference of seed 0 alone that the seeds do not bear out is noise) and the verdict
(worse if worse against any; better if better beyond noise, by either, against the best of them; else tie); the
speedup over the softmax ladder at equal chrF and at equal cross-entropy (interpolated, or a bound); parameters;
whether every found model holds its budget (+2%).

Every retrained model's training loss per logged step is in ``curves.csv`` and ``curves.png``.  ``--recipe`` (default
:data:`supernet.runs.DEFAULT_RECIPE`, inherit) is the final-training recipe of every retraining (``inherit`` /
``distill`` start from the supernet's slice; a run keeps its recipe: use another ``--out`` for another).

Cost of ``FULL`` on 2 idle cores (estimated, not timed: the machine it was written on was loaded 3x over): the
supernet about 13 minutes, latency about 10, the predictor, baselines and the verified search about 5 (the run of
2026-11-24 with the same plan sizes); each retraining of 4M target bytes about 4 minutes on one thread (that run:
17 models retrained and decoded on 300 pairs in 2,006 s, two at a time).  The test split is the big new cost: beam-5
decoding of 5,474 pairs, one source at a time (the beams are the batch; the decoder does not batch sources), took
0.014 s (smallest) to 0.034 s (largest) of CPU a pair at 45 bytes, so 1.5-3.5 minutes a model; cross-entropy over the
split is seconds.  Models: up to 3 types x 3 budgets uniform baselines (fewer after duplicates), a ladder of 5, 3
found, then the found model and the best baseline of each budget at 2 more seeds (up to 12): about 25-30
retrainings and decodings, two at a time: 25 models about 1.8 hours, 30 about 2.1.  ``--retrain-bytes 8M`` (if the
ladder gate fails at 4M) doubles the retraining: 25 models about 2.6 hours, 30 about 3.1, at the 3-hour target.
``--test-pairs N`` decodes only the first N pairs (``--quick`` does: 6);
cross-entropy is always over the whole split.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import math
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from multiprocessing import get_context
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_claim: the LM's version, whose rules this follows

from bench_claim import QuietStages, budgets_of, check_token_budget, judge, parse_tokens, speedup  # noqa: E402
from curves import plot_curves, read_log, write_curves  # noqa: E402
from nas.demo import Stages, run_stage_command  # noqa: E402
from nas_jobs import run_nas, train_subnet_argv  # noqa: E402
from search_spaces import UserError, load_space  # noqa: E402
from supernet.runs import recipe_flags  # noqa: E402
from tasks.translation.space import TASK as TRANSLATION, TranslationSpace, TranslationSubnet  # noqa: E402

log = logging.getLogger("bench_translate")
BEAM = 5
ALPHA = 0.05  # paired bootstrap: a chrF difference counts when p < ALPHA
LADDER_RHO = 0.8  # the ladder gate: Spearman between size and quality over the retrained softmax ladder
LADDER_ROLE = "uniform softmax ladder"
RANKER_MIN = 4  # retrained models a calibrated ranker needs (nas.search.calibrated.fit_ranker)


@dataclass(frozen=True)
class Plan:
    """How big each stage is; ``FULL`` is estimated at 2-2.5 hours on 2 idle cores for translate-tiny (module doc)."""

    train_steps: int = 5000  # supernet: about 8 sandwich steps/s at batch 32 on 2 idle cores
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
    verify_top: int = 3
    hurdles: int = 2  # rounds of successive halving from scratch among the device-verified candidates
    hurdle_candidates: int = 4
    hurdle_tokens: str = "1M"  # target bytes per round (a quarter of a retraining)
    baseline_checks: int = 2  # largest uniform models per (budget, type) timed on the device
    baseline_types: int = 3  # per budget: softmax's pick and the largest of the other types' picks (3: every type)
    ladder: int = 5  # uniform softmax Transformers across widths and depths
    # Every model's retraining budget in target bytes (EOS included): 4M is 3,206 steps of 32 pairs of the de catalogs
    tokens: str = "4M"
    retrain_batch: int = 32
    retrain_lr: float = 3e-3
    retrain_warmup: int = 100
    seeds: int = 3  # the found model and the best baseline of each budget
    jobs: int = 2  # retrainings / scorings at a time (one thread each; in this process when 1)
    test_pairs: int = 0  # pairs decoded per model: 0 = the whole test split
    ce_batch: int = 64
    bootstrap: int = 1000  # paired bootstrap resamples (sacrebleu's default)
    compare_repeats: int = 7
    compare_rounds: int = 4
    quiet_poll: float = 10.0  # seconds between the load checks before a timed stage (3 under --max-load in a row)


FULL = Plan()
QUICK = replace(
    FULL, train_steps=20, train_batch=8, train_eval_interval=10, samples=12, retest=0.0, warmup=1, repeats=2, rounds=2,
    min_sample_ms=1.0, population=6, parents=2, mutations=2, crossovers=2, generations=2, val_windows=2, eval_batch=4,
    verify_top=2, hurdles=1, hurdle_candidates=2, hurdle_tokens="2K", baseline_checks=1, baseline_types=2, ladder=3,
    tokens="2K", retrain_batch=8, retrain_warmup=2, seeds=2, jobs=1, test_pairs=6, ce_batch=16, bootstrap=100,
    compare_repeats=2, compare_rounds=2, quiet_poll=1.0,
)  # fmt: skip


# --------------------------------------------------------------------------- models


def uniform_translation(space) -> list[TranslationSubnet]:
    """Every hand-scaled encoder-decoder of the space (:meth:`TranslationSpace.uniform`)."""
    return space.uniform()


def params_of(space, subnet) -> int:
    from tasks.translation.timing import translation_params

    return translation_params(space, subnet)


def ladder(space, n: int) -> list[TranslationSubnet]:
    """Up to ``n`` vanilla Transformers (uniform softmax, cross-attention to the last encoder layer, the most heads and
    the widest FFN) across widths and decoder depths, spread over their sizes."""
    soft = space.attention[0]
    first = min(space.cross_layers)
    top_h = max(h for h in space.encoder.heads if h in space.decoder.heads and h in space.cross_heads)
    top_f = max(f for f in space.encoder.ffn_dim if f in space.decoder.ffn_dim)
    pool = sorted((s for s in uniform_translation(space) if s.encoder.attention[0] == soft and s.cross_layers[0] == first
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
    from tasks.translation.timing import translation_reference

    return measure(device, models, workload, settings, seed=seed, reference=translation_reference(space), baseline_ms=baseline_ms)


def pick_baselines(space, predictor_dir: Path, timings: Path, budgets, labels, plan: Plan, device_name: str, seed: int):
    """Per (budget, type): the uniform models under the budget by the predictor, largest first; the first
    ``plan.baseline_checks`` of them timed on the device (one campaign); the largest whose measured time holds
    (:func:`bench_claim.choose_baselines`).  Then per budget softmax's pick and the largest of the other types' picks
    (``plan.baseline_types`` in all), to keep the retrainings few."""
    from bench_claim import choose_baselines
    from latency.predictors import load_predictor
    from latency.table import read_timings
    from latency.timing_core import Settings
    from tasks.translation.timing import translation_timing_model

    uniform = uniform_translation(space)
    table = read_timings(timings)
    device = _timing_device(device_name)
    materialize = getattr(device, "needs_weights", True)
    settings = Settings(warmup=plan.warmup, repeats=plan.repeats, rounds=plan.rounds, min_sample_ms=plan.min_sample_ms)

    def time_them(subnets: list) -> dict:
        models = {s.key: translation_timing_model(space, s, materialize=materialize) for s in subnets}
        m = _measure(space, device, models, space.workload(), settings, seed, table.meta.get("baseline_ms"))
        return {s: m.results[s.key].median_ms for s in subnets}

    picks = choose_baselines(uniform, load_predictor(predictor_dir).predict(uniform), [params_of(space, s) for s in uniform],
                             budgets, labels, space.attention, lambda s: s.encoder.attention[0], plan.baseline_checks,
                             time_them)  # fmt: skip
    soft = space.attention[0]
    out = []
    for label in labels:
        mine = [e for e in picks if e["budget"] == label]
        others = sorted((e for e in mine if e["attention"] != soft), key=lambda e: (-e["params"], e["attention"]))
        out += [e for e in mine if e["attention"] == soft] + others[: max(plan.baseline_types - 1, 0)]
    return out


# --------------------------------------------------------------------------- retraining and scoring


def retrain_all(models: dict, root: Path, tokens: int, plan: Plan, args, space_arg: str, seeds: dict | None = None,
                init: list[str] | None = None) -> None:
    """``nas train-subnet`` for every model not yet trained (resuming a started one), ``plan.jobs`` at a time
    (subprocesses of one thread each, each with its ``log.txt``; in this process when 1: :func:`nas_jobs.run_nas`).
    ``models``: folder name -> subnet; ``seeds``: folder name -> seed (default the run's); ``init``: the recipe's flags
    (default ``--init scratch``)."""
    root.mkdir(parents=True, exist_ok=True)
    data = ["--data", str(Path(args.data).resolve())] if args.data else (["--lang", args.lang] if args.lang else [])
    todo = [name for name in models if not (root / name / "model" / "model_card.json").exists()]
    argvs = []
    for name in todo:
        seed = (seeds or {}).get(name, args.seed)
        log.info("retrain %s (seed %d) %s", name, seed, models[name])
        argvs.append(train_subnet_argv(models[name], root / name / "model", [
            "--space", space_arg, *(init or ["--init", "scratch"]), "--tokens", str(tokens), "--batch-size",
            str(plan.retrain_batch), "--lr", str(plan.retrain_lr), "--lr-warmup", str(plan.retrain_warmup), "--seed",
            str(seed), "--threads", "1", "--eval-interval", "1000000", "--eval-batches", "4", "--ckpt-interval", "100",
            *data, "-q"]))  # fmt: skip
    run_nas(argvs, plan.jobs, logs=[root / name / "log.txt" for name in todo] if plan.jobs > 1 else None)


def score_model(model_dir: str, corpus_dir: str, limit: int, ce_batch: int, threads: int) -> dict:
    """One retrained model on the whole test split: cross-entropy per target byte over every pair that fits, then beam-5
    translations of the first ``limit`` pairs (0: all) scored with chrF and BLEU; writes ``score.json`` and
    ``hypotheses.txt`` (one line each, in the split's order) beside the model and returns the scores."""
    import torch

    from tasks.translation.artifact import load_translation_model
    from tasks.translation.data import check_pairs, prepare_pairs
    from tasks.translation.decode import evaluate_translation
    from tasks.translation.train import split_ce

    torch.set_num_threads(threads)
    folder = Path(model_dir)
    model, card = load_translation_model(folder)
    record = card["corpus"]
    corpus = prepare_pairs(record["data"], Path(corpus_dir), seed=record["data_seed"] or 0, lang=record["lang"] or "de")
    check_pairs(corpus, record["corpus_hash"], str(folder))
    words = None
    if model.space.tokenizer.bpe:  # a joint subword vocabulary (--space with tokenizer: {bpe: N}): the folder's own
        from supernet.artifact import load_vocabulary
        from tasks.translation.data import tokenize_pairs
        from tasks.translation.onnx import ENCODER

        words = load_vocabulary(folder, onnx=ENCODER)
        corpus = tokenize_pairs(corpus, model.space.tokenizer, Path(corpus_dir))
    test = corpus.split("test")
    t0 = time.perf_counter()
    ce, ce_pairs, ce_bytes = split_ce(model.eval(), test, model.space.max_seq_len, ce_batch)  # per target byte, any vocabulary
    t1 = time.perf_counter()
    result = evaluate_translation(model.weights(), test, model.space.max_seq_len, beam=BEAM, limit=limit or None,
                                  vocabulary=words)
    score = {"test_ce": ce, "ce_pairs": ce_pairs, "ce_target_bytes": ce_bytes, "chrf": result["chrf"], "bleu": result["bleu"],
             "test_pairs": result["pairs"], "skipped": result["skipped"], "split_pairs": len(test), "beam": BEAM,
             "ce_seconds": round(t1 - t0, 1), "decode_seconds": round(time.perf_counter() - t1, 1)}  # fmt: skip
    (folder / "hypotheses.txt").write_text("".join(h.replace("\n", " ") + "\n" for h in result["hypotheses"]))
    from supernet.files import atomic_write  # (a new temporary file of a unique name: never a planted one)

    atomic_write(folder / "score.json", json.dumps(score, indent=1))  # last: its presence means the scoring finished
    return score


def score_all(names: list[str], root: Path, corpus_dir: Path, plan: Plan) -> None:
    """:func:`score_model` for every model folder not yet scored, ``plan.jobs`` at a time (processes of one thread)."""
    todo = [n for n in names if not (root / n / "model" / "score.json").exists()]
    args = [(str(root / n / "model"), str(corpus_dir), plan.test_pairs, plan.ce_batch, 1) for n in todo]
    done = 0

    def said(name: str, s: dict) -> None:
        nonlocal done
        done += 1
        log.info("scored %d/%d %s: %.4f nats/target byte, chrF %.2f, BLEU %.2f (%d pairs decoded in %.0f s)", done,
                 len(todo), name, s["test_ce"], s["chrf"], s["bleu"], s["test_pairs"], s["decode_seconds"])

    if plan.jobs == 1:
        for n, a in zip(todo, args):
            said(n, score_model(*a))
        return
    with ProcessPoolExecutor(max_workers=plan.jobs, mp_context=get_context("spawn")) as pool:
        futures = {pool.submit(score_model, *a): n for n, a in zip(todo, args)}
        for f, n in futures.items():
            said(n, f.result())


def measure_retrained(space, models: dict, root: Path, timings: Path, plan: Plan, device_name: str, seed: int) -> dict:
    """Every retrained model timed side by side (one interleaved campaign), with its card's training record."""
    from latency.table import read_timings
    from latency.timing_core import Settings
    from tasks.translation.artifact import load_translation_model

    statics, cards = {}, {}
    for key in models:
        statics[key], cards[key] = load_translation_model(root / key / "model")
    table = read_timings(timings)
    settings = Settings(warmup=plan.warmup, repeats=plan.compare_repeats, rounds=plan.compare_rounds,
                        min_sample_ms=plan.min_sample_ms)  # fmt: skip
    m = _measure(space, _timing_device(device_name), statics, space.workload(), settings, seed, table.meta.get("baseline_ms"))
    out = {}
    for key in models:
        training = cards[key]["training"]
        out[key] = {"measured_ms": m.results[key].median_ms, "iqr_ms": m.results[key].iqr_ms, "val_ce": training["ce_after"],
                    "steps": training["steps"], "tokens": training["tokens"], "token_budget": training["token_budget"],
                    "corpus_hash": training["corpus_hash"]}  # fmt: skip
    return out


def found_subnets(space, search_dir: Path, labels: list[str], summary: dict) -> dict:
    """Per budget: the hurdles' winner (trained from scratch among the device-verified candidates), else the subnet
    verified on the device, else the search's best by the predictor (the report says which)."""
    out = {}
    for label in labels:
        best = summary["budgets"].get(label, {}).get("best")
        for how in ("hurdles", "verified"):
            if (search_dir / f"{how}_{label}.yaml").exists():
                out[label] = (space.check(TranslationSubnet.load(search_dir / f"{how}_{label}.yaml")), how)
                break
        else:
            if best:
                out[label] = (space.check(TranslationSubnet.load(search_dir / best["file"])), "predicted")
    return out


# --------------------------------------------------------------------------- the benchmark


def run(args, plan: Plan) -> dict:
    from nas.cli import main as nas_main

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    space = load_space(args.space)
    if not isinstance(space, TranslationSpace):
        raise UserError(f"--space {args.space}: task {space.task}, not {TRANSLATION} (an encoder-decoder translation space)")
    if args.data and args.lang:
        raise UserError("give --data (your own source<TAB>target file) or --lang (the system's gettext catalogs), not both")
    space_arg = str(Path(args.space).resolve()) if Path(args.space).exists() else args.space
    stage = Stages(out, log)
    tokens = parse_tokens(plan.tokens)
    timed = QuietStages(stage, out, args.max_load, plan.quiet_poll)  # a stage whose figures are times: on a quiet machine
    loads = timed.loads

    def cli(argv: list[str], ok=(0,)) -> None:
        run_stage_command(nas_main, argv, ok, rerun="the benchmark")

    # 1. the supernet, type-balanced
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
                     "--eval-batches", "8", "--seed", str(args.seed), "--threads", str(args.threads),
                     "--balance", "types", *data])  # fmt: skip

        stage("train the supernet", train)

    # 2. latency on the device, one thread, CPU clock; the predictor
    timings, predictor = out / "latency" / "timings.csv", out / "predictor"
    timed("measure latency", lambda: cli([
        "measure-latency", space_arg, "--device", args.device, "--timing-threads", "1", "--clock", "cpu",
        "--samples", str(plan.samples), "--retest", str(plan.retest), "--timing-warmup", str(plan.warmup),
        "--repeats", str(plan.repeats), "--rounds", str(plan.rounds), "--min-sample-ms", str(plan.min_sample_ms),
        "--seed", str(args.seed), "--out", str(timings)]))  # fmt: skip
    stage("fit the predictor", lambda: cli(["fit-predictor", str(timings), "--out", str(predictor), "--seed", str(args.seed)]))

    # 3. budgets; 4. baselines
    budgets = budgets_of(space, predictor, timings)
    labels = [f"{b:.3f}ms" for b in budgets]
    log.info("budgets: %s", ", ".join(labels))
    baselines_file = out / "baselines.json"
    timed("pick baselines", lambda: baselines_file.write_text(json.dumps(
        pick_baselines(space, predictor, timings, budgets, labels, plan, args.device, args.seed), indent=1)))  # fmt: skip
    models: dict[str, TranslationSubnet] = {}
    roles: dict[str, list[str]] = {}

    def add(role: str, s) -> None:
        models.setdefault(s.key, s)
        if role not in roles.setdefault(s.key, []):
            roles[s.key].append(role)

    for e in json.loads(baselines_file.read_text()):
        add(f"uniform {e['attention']}@{e['budget']}", TranslationSubnet.from_dict(e["subnet"]))
    for s in ladder(space, plan.ladder):
        add(LADDER_ROLE, s)
    retrain_dir = out / "retrain"
    check_token_budget(retrain_dir, models, tokens)
    init = recipe_flags(args.recipe, ckpt)

    # 5. retrain the baselines
    log.info("retraining (recipe %s) on %s target bytes each, %d at a time (one thread each)", args.recipe, f"{tokens:,}",
             plan.jobs)
    stage("retrain baselines", lambda: retrain_all(dict(models), retrain_dir, tokens, plan, args, space_arg, init=init))

    # 5b. the ranker, calibrated on the retrained baselines (their cross-entropy on the search's validation pairs)
    ranker_dir = out / "ranker"
    fitness = ["--fitness", f"calibrated:{ranker_dir}"]
    scoring = ["--val-windows", str(plan.val_windows), "--eval-batch-size", str(plan.eval_batch)]
    if len(models) >= RANKER_MIN:
        stage("fit the ranker", lambda: cli(["fit-accuracy", str(ckpt), *(str(retrain_dir / k / "model") for k in models),
                                             *scoring, "--device", "cpu", "--out", str(ranker_dir)]))  # fmt: skip
    else:
        log.info("%d baselines: fewer than the %d a calibrated ranker needs; the search ranks by inherited loss",
                 len(models), RANKER_MIN)
        fitness = []

    # 6. the search, verified on the device
    search_dir = out / "search"
    timed("search", lambda: cli([
        "search", str(ckpt), "--predictor", str(predictor), "--budget", ",".join(labels), "--population",
        str(plan.population), "--parents", str(plan.parents), "--mutations", str(plan.mutations), "--crossovers",
        str(plan.crossovers), "--generations", str(plan.generations), *scoring, *fitness,
        "--seed", str(args.seed), "--out", str(search_dir), "--device", "cpu",
        "--timing-target", args.device, "--verify-top", str(plan.verify_top), "--timing-threads", "1", "--clock", "cpu",
        "--hurdles", str(plan.hurdles), "--hurdle-candidates", str(plan.hurdle_candidates), "--hurdle-from", "scratch",
        "--hurdle-batch-size", str(plan.retrain_batch), "--hurdle-tokens", plan.hurdle_tokens, "--no-progress"],
        ok=(0, 1)))  # fmt: skip
    summary = json.loads((search_dir / "search.json").read_text())
    labels = list(summary["budgets"])  # the search's labels of the budgets, in the order given
    found = found_subnets(space, search_dir, labels, summary)
    for label, (s, how) in found.items():
        add(f"found@{label}", s)

    # 7. retrain the found models; 8. score everything on the whole test split
    stage("retrain found", lambda: retrain_all(dict(models), retrain_dir, tokens, plan, args, space_arg, init=init))
    corpus_dir = ckpt.parent
    stage("score", lambda: score_all(list(models), retrain_dir, corpus_dir, plan))

    # 9. time every retrained model side by side
    measured_file = out / "measured.json"
    timed("measure retrained", lambda: measured_file.write_text(json.dumps(
        measure_retrained(space, models, retrain_dir, timings, plan, args.device, args.seed), indent=1)))  # fmt: skip
    measured = json.loads(measured_file.read_text())
    scores = {k: json.loads((retrain_dir / k / "model" / "score.json").read_text()) for k in models}

    # 10. seeds: the found model and the best baseline at or below its measured latency, per budget
    pairs = seed_pairs(labels, roles, measured, scores)
    seeded = sorted({k for pair in pairs.values() for k in pair if k})
    jobs = {f"{k}-s{s}": (models[k], s) for k in seeded for s in range(1, plan.seeds)}
    stage("retrain seeds", lambda: retrain_all({n: m for n, (m, _) in jobs.items()}, retrain_dir, tokens, plan, args,
                                                space_arg, seeds={n: args.seed + s for n, (_, s) in jobs.items()},
                                                init=init))
    stage("score seeds", lambda: score_all(list(jobs), retrain_dir, corpus_dir, plan))
    for name, (subnet, _) in jobs.items():
        scores[name] = {**json.loads((retrain_dir / name / "model" / "score.json").read_text()), "of": subnet.key}

    result = report(space, labels, budgets, models, roles, measured, scores, found, retrain_dir, corpus_dir, plan, tokens,
                    args, out, ranker_summary(ranker_dir if fitness else None, len(models)))
    result["stage_seconds"] = stage.all_seconds()
    result["loads"] = loads  # the 1-minute load average before and after each timing stage
    result["wall_seconds_this_run"] = round(time.perf_counter() - t_start, 1)
    result["plan"] = asdict(plan)
    result["command"] = "python scripts/bench_translate.py " + " ".join(args.argv)
    result["machine"] = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                         "cpus": os.cpu_count(), "python": platform.python_version(), "torch": _version("torch"),
                         "onnxruntime": _version("onnxruntime"), "sacrebleu": _version("sacrebleu")}  # fmt: skip
    print("\nstage wall times: " + ", ".join(f"{k} {v:.0f} s" for k, v in result["stage_seconds"].items()))
    (out / "translate.json").write_text(json.dumps(result, indent=1))
    return result


def _version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def seed_pairs(labels: list[str], roles: dict, measured: dict, scores: dict) -> dict:
    """Per budget: (the found model's key, the best uniform baseline at or below its measured latency by test
    cross-entropy, or None)."""
    out = {}
    for label in labels:
        mine = [k for k, r in roles.items() if f"found@{label}" in r]
        if not mine:
            continue
        me = mine[0]
        base = [k for k, r in roles.items() if k != me and any(x.startswith("uniform") for x in r)
                and measured[k]["measured_ms"] <= measured[me]["measured_ms"]]  # fmt: skip
        out[label] = (me, min(base, key=lambda k: (scores[k]["test_ce"], k)) if base else None)
    return out


# --------------------------------------------------------------------------- judging


def chrf_word(p_value: float, found: float, base: float, alpha: float = ALPHA) -> str:
    """The paired bootstrap's reading of a chrF difference: better / worse when p < alpha, else tie.  Equal scores are a
    tie whatever p (sacrebleu gives a zero difference its smallest p, multeval's convention)."""
    if p_value < alpha and found != base:
        return "better" if found > base else "worse"
    return "tie"


def chrf_seed_word(found: list[float], base: list[float], sd: float) -> str:
    """The seed means' reading of a chrF difference (higher is better): better / worse beyond 2 seed SD, else tie (as
    cross-entropy's, :func:`judge`, with the sign turned)."""
    return judge([-x for x in found], [-x for x in base], sd)


def both_say(bootstrap: str, seeds: str) -> str:
    """A chrF comparison's word: better or worse when the paired bootstrap (seed 0's sentences) and the seed means agree,
    else tie."""
    return bootstrap if bootstrap == seeds else "tie"


def budget_verdict(comparisons: list[dict], best: str | None) -> str:
    """``comparisons``: per uniform baseline at or below the found model's latency, ``{"key", "ce", "chrf"}`` (each
    better / tie / worse); ``best``: the best baseline's key.  Worse if worse against any by either metric; better if
    better beyond noise against the best by either; else tie."""
    if not comparisons or best is None:
        return "no baseline at or below"
    if any("worse" in (c["ce"], c["chrf"]) for c in comparisons):
        return "worse"
    top = next(c for c in comparisons if c["key"] == best)
    return "better" if "better" in (top["ce"], top["chrf"]) else "tie"


def ladder_gate(rows: list[dict]) -> dict:
    """Spearman between size (parameters) and quality over the retrained softmax ladder: by cross-entropy (lower is
    better, so against its negative) and by chrF; passed when both are >= 0.8 over at least 3 models."""
    from scipy.stats import spearmanr

    lad = [r for r in rows if LADDER_ROLE in r["roles"].split(";")]
    out = {"models": len(lad), "threshold": LADDER_RHO}
    if len(lad) < 3:
        return {**out, "spearman_ce": None, "spearman_chrf": None, "passed": False}
    size = [r["params"] for r in lad]
    rho_ce = float(spearmanr(size, [-r["test_ce_mean"] for r in lad]).statistic)
    rho_chrf = float(spearmanr(size, [r["chrf_mean"] for r in lad]).statistic)
    ok = all(np.isfinite(x) and x >= LADDER_RHO for x in (rho_ce, rho_chrf))
    return {**out, "spearman_ce": rho_ce, "spearman_chrf": rho_chrf, "passed": bool(ok)}


def pooled_sd(groups: list[list[float]]) -> float:
    groups = [g for g in groups if len(g) > 1]
    return float(np.sqrt(np.mean([np.var(g, ddof=1) for g in groups]))) if groups else math.nan


def read_hypotheses(root: Path, key: str) -> list[str]:
    return (root / key / "model" / "hypotheses.txt").read_text().splitlines()


def references(root: Path, key: str, corpus_dir: Path, n: int) -> list[str]:
    """The first ``n`` references of the test split whose source fits (what :func:`score_model` decoded), in order."""
    from tasks.translation.artifact import read_card
    from tasks.translation.data import prepare_pairs

    card = read_card(root / key / "model")
    record, max_len = card["corpus"], card["space"]["max_seq_len"]
    corpus = prepare_pairs(record["data"], corpus_dir, seed=record["data_seed"] or 0, lang=record["lang"] or "de")
    if card["space"].get("tokenizer"):  # a joint subword vocabulary: the sources that fit are counted in its tokens
        from supernet.artifact import card_space
        from supernet.tokenizer import Vocabulary
        from tasks.translation.data import tokenize_pairs
        from tasks.translation.decode import spell

        corpus = tokenize_pairs(corpus, card_space(root / key / "model", card).tokenizer, corpus_dir)
        words = Vocabulary((root / key / "model" / "tokenizer.json").read_text(encoding="utf-8"))
        return [spell(t, words).decode("utf-8", errors="replace") for s, t in corpus.split("test") if len(s) <= max_len][:n]
    return [t.decode("utf-8", errors="replace") for s, t in corpus.split("test") if len(s) <= max_len][:n]


# --------------------------------------------------------------------------- the report


def ranker_summary(ranker_dir: Path | None, baselines: int) -> dict:
    """What ranked the search: the calibrated ranker's fit (leave-one-out over the retrained baselines), or why none."""
    if ranker_dir is None:
        return {"kind": "inherited", "why": f"{baselines} retrained baselines, fewer than the {RANKER_MIN} a ranker needs"}
    doc = json.loads((ranker_dir / "ranker.json").read_text())
    r = doc["report"]
    chosen = r["candidates"][r["chosen"]]
    return {"kind": "calibrated", "features": r["chosen"], "models": r["n"], "inherited_tau": r["inherited_tau"],
            "loo_tau": chosen["loo_tau"], "loo_mae": chosen["loo_mae"], "path": str(ranker_dir / "ranker.json"),
            "fitted_on": "the retrained baselines' cross-entropy on the search's validation pairs (never the test split)"}


def report(space, labels, budgets, models, roles, measured, scores, found, root: Path, corpus_dir: Path, plan: Plan,
           tokens: int, args, out: Path, ranker: dict) -> dict:
    from tasks.translation.decode import paired_bootstrap

    per_ce: dict[str, list[float]] = {k: [scores[k]["test_ce"]] for k in models}
    per_chrf: dict[str, list[float]] = {k: [scores[k]["chrf"]] for k in models}
    for name, s in scores.items():
        if "of" in s:
            per_ce[s["of"]].append(s["test_ce"])
            per_chrf[s["of"]].append(s["chrf"])
    sd_ce, sd_chrf = pooled_sd(list(per_ce.values())), pooled_sd(list(per_chrf.values()))
    rows = []
    for key, s in models.items():
        r, sc = measured[key], scores[key]
        rows.append({"key": key, "roles": ";".join(roles[key]), "subnet": str(s), "params": params_of(space, s),
                     "attention": ",".join(dict.fromkeys(s.attention)), "measured_ms": r["measured_ms"], "iqr_ms": r["iqr_ms"],
                     "test_ce": sc["test_ce"], "test_ce_mean": float(np.mean(per_ce[key])), "chrf": sc["chrf"],
                     "chrf_mean": float(np.mean(per_chrf[key])), "bleu": sc["bleu"], "seeds": len(per_ce[key]),
                     "ce_pairs": sc["ce_pairs"], "test_pairs": sc["test_pairs"], "val_ce": r["val_ce"],
                     "steps": r["steps"], "token_budget": r["token_budget"]})  # fmt: skip
    with open(out / "translate.csv", "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(rows[0]))
        wr.writeheader()
        wr.writerows(rows)
    by_key = {r["key"]: r for r in rows}
    first = rows[0]
    gate = {**ladder_gate(rows), "retrain_bytes": tokens}
    w = space.workload()
    lines = [f"HAT's claim on space {space.name!r}, {w} on {args.device} (1 thread, CPU clock); every model retrained by "
             f"recipe {args.recipe} on {tokens:,} target bytes ({first['steps']} steps of {plan.retrain_batch} pairs; "
             f"same schedule and data); test split: cross-entropy over {first['ce_pairs']} pairs, chrF / BLEU at beam "
             f"{BEAM} over {first['test_pairs']} pairs (sacrebleu); found model and best baseline of each budget at "
             f"{plan.seeds} seeds",
             (f"ranker: calibrated ({ranker['features']} features) on {ranker['models']} retrained baselines' validation "
              f"cross-entropy: leave-one-out Kendall tau {ranker['loo_tau']:.3f} (inherited loss alone "
              f"{ranker['inherited_tau']:.3f}); candidates verified on {args.device}, hurdles from scratch among them"
              if ranker["kind"] == "calibrated" else f"ranker: inherited cross-entropy ({ranker['why']}); candidates "
              f"verified on {args.device}"),
             f"\n{'model':34} {'nats/B':>7} {'chrF':>6} {'BLEU':>6} {'measured':>10} {'params':>9}  subnet"]  # fmt: skip
    for r in sorted(rows, key=lambda r: r["measured_ms"]):
        role = r["roles"].split(";")
        role = role[0] + (f" (+{len(role) - 1})" if len(role) > 1 else "")
        lines.append(f"{role[:34]:34} {r['test_ce_mean']:>7.4f} {r['chrf_mean']:>6.2f} {r['bleu']:>6.2f} "
                     f"{r['measured_ms']:>8.3f}ms {r['params']:>9,}  {r['subnet']}")  # fmt: skip
    rho = ", ".join(f"{m} {gate[f'spearman_{m}']:+.3f}" if gate[f"spearman_{m}"] is not None else f"{m} -"
                    for m in ("ce", "chrf"))
    lines.append(f"\nladder gate: Spearman between size and quality over {gate['models']} retrained softmax models: {rho} "
                 f"(need >= {LADDER_RHO} each): " + ("PASSED" if gate["passed"] else
                 f"FAILED at {tokens:,} target bytes per model: quality does not grow with size at this retraining budget, "
                 "so no verdict is given; raise --retrain-bytes"))  # fmt: skip
    lines.append(f"seed standard deviation (pooled over {sum(len(v) > 1 for v in per_ce.values())} models x {plan.seeds} "
                 f"seeds): cross-entropy {sd_ce:.4f} nats/byte, chrF {sd_chrf:.2f}")
    uniform = [r for r in rows if any(x.startswith("uniform") for x in r["roles"].split(";"))]
    ladder_ce = [(r["measured_ms"], r["test_ce_mean"]) for r in uniform if LADDER_ROLE in r["roles"]]
    ladder_chrf = [(r["measured_ms"], -r["chrf_mean"]) for r in uniform if LADDER_ROLE in r["roles"]]
    entries, speed = [], []
    for label, budget in zip(labels, budgets):
        if label not in found:
            lines.append(f"\nbudget {label}: the search found nothing")
            entries.append({"budget_ms": budget, "label": label, "verdict": "nothing found", "found": None,
                            "best_uniform": None, "p_value": None})  # fmt: skip
            continue
        me = by_key[found[label][0].key]
        within = me["measured_ms"] <= budget * 1.02
        mine = read_hypotheses(root, me["key"])
        refs = references(root, me["key"], corpus_dir, len(mine))
        comps = []
        for b in sorted((r for r in uniform if r is not me and r["measured_ms"] <= me["measured_ms"]),
                        key=lambda r: r["measured_ms"]):  # fmt: skip
            boot = paired_bootstrap(read_hypotheses(root, b["key"]), mine, refs, plan.bootstrap)
            boot_word = chrf_word(boot["chrf"]["p_value"], boot["chrf"]["system"], boot["chrf"]["baseline"])
            seed_word = chrf_seed_word(per_chrf[me["key"]], per_chrf[b["key"]], sd_chrf)
            comps.append({"key": b["key"], "subnet": b["subnet"], "measured_ms": b["measured_ms"], "test_ce": per_ce[b["key"]],
                          "ce": judge(per_ce[me["key"]], per_ce[b["key"]], sd_ce),
                          "chrf": both_say(boot_word, seed_word), "chrf_bootstrap": boot_word, "chrf_seeds": seed_word,
                          "chrf_seeds_found": per_chrf[me["key"]], "chrf_seeds_baseline": per_chrf[b["key"]],
                          "chrf_found": boot["chrf"]["system"], "chrf_baseline": boot["chrf"]["baseline"],
                          "chrf_p": boot["chrf"]["p_value"], "bleu_found": boot["bleu"]["system"],
                          "bleu_baseline": boot["bleu"]["baseline"], "bleu_p": boot["bleu"]["p_value"]})  # fmt: skip
        best = min(comps, key=lambda c: (float(np.mean(c["test_ce"])), c["key"]))["key"] if comps else None
        verdict = budget_verdict(comps, best) if gate["passed"] else "withheld (ladder gate failed)"
        found_entry = {"subnet": me["subnet"], "key": me["key"], "how": found[label][1], "test_ce": me["test_ce_mean"],
                       "test_ce_seeds": per_ce[me["key"]], "chrf": me["chrf_mean"], "chrf_seeds": per_chrf[me["key"]],
                       "bleu": me["bleu"], "measured_ms": me["measured_ms"], "params": me["params"]}  # fmt: skip
        top = next((c for c in comps if c["key"] == best), None)
        b = by_key[best] if best else None
        entry = {"budget_ms": budget, "label": label, "verdict": verdict, "found": found_entry,
                 "best_uniform": None if b is None else {
                     "subnet": b["subnet"], "key": best, "test_ce": b["test_ce_mean"], "test_ce_seeds": per_ce[best],
                     "chrf": b["chrf_mean"], "chrf_seeds": per_chrf[best], "measured_ms": b["measured_ms"],
                     "params": b["params"]},
                 "p_value": None if top is None else top["chrf_p"], "within_budget": within, "comparisons": comps}  # fmt: skip
        lines.append(f"\nbudget {label}: found ({found[label][1]}) {me['subnet']}")
        lines.append(f"  {me['test_ce_mean']:.4f} nats/byte, chrF {me['chrf_mean']:.2f}, {me['measured_ms']:.3f} ms, "
                     f"{me['params']:,} parameters; against {len(comps)} uniform baselines at or below its latency "
                     "(cross-entropy: mean of seeds; chrF: seed 0's paired bootstrap and the seed means, both):")
        for c in comps:
            lines.append(f"    {np.mean(c['test_ce']):.4f} ({c['ce']:6}) chrF {c['chrf_baseline']:6.2f} vs found "
                         f"{c['chrf_found']:6.2f} (bootstrap {c['chrf_bootstrap']}, p {c['chrf_p']:.3f}; seed means "
                         f"{np.mean(c['chrf_seeds_baseline']):.2f} vs {np.mean(c['chrf_seeds_found']):.2f}: "
                         f"{c['chrf_seeds']}; so {c['chrf']}) {c['measured_ms']:8.3f} ms  {c['subnet']}")
        lines.append(f"  verdict: {verdict.upper()} (cross-entropy against 2 seed SD = {2 * sd_ce:.4f}; chrF by paired "
                     f"bootstrap, p < {ALPHA}, and against 2 seed SD = {2 * sd_chrf:.2f})")
        lines.append(f"  measured {me['measured_ms']:.3f} ms against the budget {budget:.3f} ms: "
                     + ("within (+2% at most)" if within else "OVER the budget by more than 2%"))
        sp = {"budget_ms": budget}
        for name, lad, q in (("chrf", ladder_chrf, -me["chrf_mean"]), ("ce", ladder_ce, me["test_ce_mean"])):
            s = speedup(lad, q, me["measured_ms"])
            sp[name] = {"ratio": s["ratio"], "bound": s["bound"], "ladder_ms": s.get("ladder_ms")}
            if s["ratio"] is not None:
                word = {"lower": "at least ", "upper": "at most "}.get(s["bound"], "")
                lines.append(f"  speedup over the softmax ladder at equal {'chrF' if name == 'chrf' else 'cross-entropy'}: "
                             f"{word}{s['ratio']:.2f}x (ladder at {s['ladder_ms']:.3f} ms)")
        speed.append(sp)
        entries.append(entry)
    judged = [e for e in entries if e["found"]]
    lines.append("\ntargets: ladder gate " + ("passed" if gate["passed"] else "FAILED")
                 + f"; no worse at {sum(e['verdict'] in ('better', 'tie') for e in judged)}/{len(labels)} budgets, better at "
                 f"{sum(e['verdict'] == 'better' for e in judged)}/{len(labels)}; >= 1.5x faster at equal chrF at "
                 f"{sum((s['chrf']['ratio'] or 0) >= 1.5 and s['chrf']['bound'] != 'upper' for s in speed)}/{len(labels)}; "
                 f"within budget {sum(e['within_budget'] for e in judged)}/{len(labels)}")  # fmt: skip
    best = best_chrf(rows, max(budgets))
    if best is not None:
        lines.append(f"best chrF at the largest budget ({max(budgets):.3f} ms): {best['chrf']:.2f} ({best['key']}, "
                     f"{best['subnet']}, {best['test_pairs']} test pairs)")
    plot(rows, per_ce, per_chrf, budgets, args.device, out / "translate.png")
    curves = {name: read_log(root / name / "model" / "train" / "log.jsonl") for name in scores}
    write_curves(curves, out / "curves.csv")
    plot_curves(curves, out / "curves.png", "every retrained model's training loss per logged step")
    text = "\n".join(lines)
    print(text)
    return {"budgets": entries, "speedup_vs_softmax": speed, "ladder_gate": gate, "seed_sd": {"ce": sd_ce, "chrf": sd_chrf},
            "best_chrf": None if best is None else best["chrf"], "best_chrf_model": best,
            "ranker": ranker, "retrain_bytes": tokens, "rows": rows,
            "seed_scores": {k: v for k, v in scores.items() if "of" in v},
            "text": text}  # fmt: skip


def best_chrf(rows: list[dict], budget: float) -> dict | None:
    """The model of the highest chrF (mean of its seeds) among the retrained ones measured at or under ``budget`` (the
    largest: ``translate.json``'s ``best_chrf``, on the test pairs each was decoded on: the whole split unless
    ``--test-pairs``)."""
    held = [r for r in rows if r["measured_ms"] <= budget]
    if not held:
        return None
    top = max(held, key=lambda r: (r["chrf_mean"], -r["measured_ms"]))
    return {"key": top["key"], "subnet": top["subnet"], "chrf": top["chrf_mean"], "measured_ms": top["measured_ms"],
            "test_pairs": top["test_pairs"]}


def plot(rows, per_ce, per_chrf, budgets, device: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 5.5))
    cmap = plt.get_cmap("tab10")
    groups = [("uniform " + t, [r for r in rows if "found" not in r["roles"] and "uniform" in r["roles"]
                                and r["attention"] == t and LADDER_ROLE not in r["roles"]])
              for t in sorted({r["attention"] for r in rows})]  # fmt: skip
    groups += [("softmax ladder", [r for r in rows if LADDER_ROLE in r["roles"]]),
               ("found (mean of seeds, +-1 SD)", [r for r in rows if "found@" in r["roles"]])]
    for ax, per, what in ((axes[0], per_ce, "test cross-entropy, nats per target byte"), (axes[1], per_chrf, "test chrF")):
        for i, (name, pts) in enumerate(g for g in groups if g[1]):
            star = name.startswith("found")
            ax.errorbar([r["measured_ms"] for r in pts], [np.mean(per[r["key"]]) for r in pts],
                        yerr=[np.std(per[r["key"]], ddof=1) if len(per[r["key"]]) > 1 else 0 for r in pts],
                        fmt="*" if star else "o", ms=14 if star else 5, capsize=3, label=name, zorder=3 if star else 2,
                        color="black" if star else cmap(i % 10))  # fmt: skip
        for b in budgets:
            ax.axvline(b, color="grey", linestyle=":", linewidth=1)
        ax.set(xlabel=f"measured latency, ms ({device}, 1 thread, translate workload)", ylabel=what + " (retrained)")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7, loc="lower right")
    fig.suptitle("found vs hand-scaled encoder-decoders, every model retrained; dotted: budgets")
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
    p.add_argument("--retrain-bytes", "--tokens", dest="tokens",
                   help="retraining target bytes per model (default: the plan's, 4M; quick 2K)")
    p.add_argument("--test-pairs", type=int, help="test pairs decoded per model (default 0: the whole split; quick 6)")
    p.add_argument("--seeds", type=int, help="seeds of the found model and the best baseline (default 3; quick 2)")
    p.add_argument("--train-steps", type=int, help="supernet training steps (default 5000)")
    p.add_argument("--threads", type=int, default=2, help="threads for supernet training (default 2)")
    p.add_argument("--jobs", type=int, help="retrainings at a time, one thread each (default 2; quick 1: in-process)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--recipe", help="the final-training recipe of every retraining: scratch, inherit or distill (default: "
                   "supernet.runs.DEFAULT_RECIPE)")
    p.add_argument("--max-load", type=float, default=1.6,
                   help="timing stages wait until the 1-minute load average stays under this (0: do not wait; default 1.6)")
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    from supernet.runs import DEFAULT_RECIPE, RECIPES

    args.recipe = args.recipe or DEFAULT_RECIPE
    if args.recipe not in RECIPES:
        print(f"bench_translate: error: --recipe: {args.recipe!r} is not one of {', '.join(RECIPES)}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("sacrebleu").setLevel(logging.WARNING)  # (it logs each bootstrap's steps at INFO)
    plan = QUICK if args.quick else FULL
    given = (("tokens", args.tokens), ("test_pairs", args.test_pairs), ("train_steps", args.train_steps), ("jobs", args.jobs),
             ("seeds", args.seeds))  # fmt: skip
    for field, value in given:
        if value is not None:
            plan = replace(plan, **{field: value})
    t0 = time.perf_counter()
    try:
        if min(plan.train_steps, plan.jobs, plan.seeds) < 1 or plan.test_pairs < 0:
            raise UserError("--test-pairs / --train-steps / --jobs / --seeds: give a positive integer (--test-pairs 0: all)")
        run(args, plan)
    except UserError as e:
        print(f"bench_translate: error: {e}", file=sys.stderr)
        return 2
    print(f"\nwall time {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
