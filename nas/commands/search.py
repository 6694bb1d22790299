"""``nas search``: find the most accurate subnet under latency budgets (evolution, random search, NSGA-II).

Fitness is the validation loss of a subnet with the supernet's weights, on fixed held-out
windows; latency comes from a fitted predictor.  Every evaluation is an Optuna trial in
``--storage`` (default: ``OUT/search.db``): run the same command again to resume after a
kill, or start it several times (even on several machines, with a database server) to search
with several workers.  Writes ``best_<budget>.yaml`` per budget, ``pareto.csv``,
``pareto.png`` and ``search.json`` to ``--out``.  ``--hurdles ROUNDS`` then trains the top
candidates of each budget in rounds with progressive dynamic hurdles (nas/search/hurdles.py),
in the same storage: ``hurdles_<budget>.yaml``, ``hurdles.csv``, ``search.json``'s ``hurdles``.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import re
from pathlib import Path

from .common import (
    PROTOCOL_DEFAULTS,
    add_device_flags,
    add_scoring_arguments,
    file_digest,
    measurement_bar,
    progress_bar,
    scoring_settings,
)
from .registry import register_command

log = logging.getLogger(__name__)

NAME = "search"
HELP = "search the subnet with the lowest validation loss under latency / size budgets"
EXAMPLE = ("nas search runs/tiny/latest.pt --predictor runs/pred-prefill --predictor runs/pred-decode "
           "--budget prefill:50ms,decode:2ms,decode:4ms --max-params 1M --out runs/search")


def add_arguments(p: argparse.ArgumentParser) -> None:
    # Let "--budget -5ms" reach parse_budget (which explains the accepted forms) instead of
    # argparse's "expected one argument": negative numbers with a unit count as values.
    p._negative_number_matcher = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?[a-zA-Zµ]*(,.*)?$")  # noqa: SLF001
    p.add_argument("supernet", help="trained supernet checkpoint (nas train-supernet)")
    p.add_argument("--predictor", required=True, action="append", metavar="DIR",
                   help="latency predictor (nas fit-predictor), fit on this supernet's space; repeat it for several workloads "
                        "(each predictor knows the workload it was fitted at: prefill, decode, ...)")
    p.add_argument("--budget", metavar="[W:]T[,...]",
                   help="latency budget(s) with a unit: 50ms, 0.05s, 800us; several: 20ms,50ms,100ms (one search each); "
                        "on a workload: decode:5ms. Budgets on different workloads constrain one search together: "
                        "prefill:50ms,decode:5ms; the searches are every combination of one budget per workload")
    p.add_argument("--workload", metavar="NAME", help="the workload of budgets written without one, and of the Pareto plot "
                   "(default: the first --predictor's)")
    p.add_argument("--margin", type=float, default=0.0, metavar="PCT",
                   help="search PCT percent below each latency budget by the predictor (a guard band for its error; "
                        "--timing-target still holds the measured latency to the budget itself); default 0")
    p.add_argument("--max-params", metavar="N", help="also at most N parameters (1500000, 1.5M, 800k)")
    g = p.add_argument_group("strategy (defaults: HAT's)")
    from nas.search.strategy import STRATEGIES

    g.add_argument("--strategy", default="evolution", choices=STRATEGIES.names(),
                   help="a registered search strategy (default evolution)")
    g.add_argument("--population", type=int, default=125, help="size of the population and of generation 0 (default 125)")
    g.add_argument("--parents", type=int, default=25, help="parents chosen per generation (default 25)")
    g.add_argument("--mutations", type=int, default=50, help="children by mutation per generation (default 50)")
    g.add_argument("--crossovers", type=int, default=50, help="children by crossover per generation (default 50)")
    g.add_argument("--generations", type=int, default=30, help="generations in all, the random one included (default 30)")
    g.add_argument("--mutate-prob", type=float, default=0.3, help="probability that mutation redraws a gene (default 0.3)")
    g.add_argument(
        "--selection", default="top", choices=("top", "tournament"), help="parents: the best ones, or tournament winners"
    )
    g.add_argument(
        "--tournament-size", type=int, default=10, help="entrants per tournament with --selection tournament (default 10)"
    )
    g.add_argument("--aging", action="store_true", help="regularized evolution: the oldest members leave the population")
    g.add_argument("--max-redraws", type=int, default=100,
                   help="redraw rounds for children that break a constraint (default 100)")
    g.add_argument("--seed", type=int, default=0, help="the search's seed (default 0): same seed, same search")
    f = p.add_argument_group("fitness")
    f.add_argument("--fitness", default="inherited", metavar="RANKER",
                   help="inherited: the subnet's validation loss with the supernet's weights (default); calibrated:DIR: the "
                        "retrained validation loss a ranker of `nas fit-accuracy --out DIR` predicts from the subnet's "
                        "types, size and inherited loss (fitted on the same windows and supernet)")
    f.add_argument("--no-uniform-seeds", action="store_true",
                   help="do not open the first generation with each attention type's largest feasible uniform subnet")
    add_scoring_arguments(f)
    f.add_argument("--eval-batch-size", dest="eval_batch_size", type=int, default=16, metavar="N",
                   help="windows per forward pass (default 16)")
    f.add_argument("--device", default="auto", help="compute device of the scoring: auto (GPU when there is one), cpu, "
                   "cuda, cuda:N")
    s = p.add_argument_group("storage and workers")
    s.add_argument("--out", default="runs/search", metavar="DIR", help="run directory (default runs/search)")
    s.add_argument("--storage", metavar="URL", help="Optuna storage URL (default sqlite:///OUT/search.db); e.g. postgresql://user@host/db")
    s.add_argument("--study", metavar="NAME", help="study name (default: derived from the settings, so the same command resumes)")
    s.add_argument("--worker-batch", dest="worker_batch", type=int, default=8, metavar="N",
                   help="subnets a worker claims and evaluates at once (default 8)")
    v = p.add_argument_group("verification on a timing target (nas/search/verify.py)")
    v.add_argument(
        "--timing-target",
        metavar="TARGET",
        help="after the search, time the top candidates of each budget on TARGET (cpu, cuda, "
        "onnxruntime) and keep the best whose measured latency holds: verified_<budget>.yaml, verify.csv, verify.json",
    )
    v.add_argument(
        "--verify-top", type=int, default=3, metavar="K", help="candidates per budget, in order of fitness (default 3)"
    )
    v.add_argument("--verify-margin", type=float, default=0.0, metavar="PCT",
                   help="a candidate holds when its measured latency is at least PCT percent under the budget: headroom "
                   "for the next measurement's noise (the export, another day); default 0")
    add_device_flags(v, NAME)
    h = p.add_argument_group("progressive dynamic hurdles: train the top candidates (nas/search/hurdles.py)")
    h.add_argument("--hurdles", type=int, default=0, metavar="ROUNDS",
                   help="after the search, train the top --hurdle-candidates of each budget in ROUNDS short rounds (the first "
                        "from --hurdle-from; with --timing-target only candidates whose measured latency holds); after each "
                        "round "
                        "those worse than the round's mean stop; the best by trained bits/byte: hurdles_<budget>.yaml, "
                        "hurdles.csv (default 0: off)")
    h.add_argument("--hurdle-candidates", type=int, default=8, metavar="K",
                   help="candidates per budget, the best by the search's fitness (default 8)")
    h.add_argument("--hurdle-per-type", type=int, default=0, metavar="N",
                   help="also train the best N candidates of each attention type (the type most of a subnet's layers use) "
                        "that are not among the top K: inherited weights can misjudge a whole type (default 0: off)")
    h.add_argument("--hurdle-from", default="scratch", choices=("scratch", "inherited"),
                   help="round 0 starts from scratch at `nas train-subnet`'s rates (lr 3e-3; default: inherited weights misjudge "
                        "whole types, so training from them keeps the misjudgement), or from the supernet's weights at "
                        "fine-tuning rates (lr 3e-4)")
    h.add_argument("--hurdle-batch-size", type=int, default=16, metavar="N", help="windows per training step (default 16)")
    h.add_argument("--hurdle-tokens", default="1M", metavar="N",
                   help="training tokens per round (500k, 2M; rounded down to whole steps of 16 windows of --seq-len tokens, at "
                        "least one; default 1M)")


def validation_tokens(args: argparse.Namespace, payload):
    """The held-out tokens of the scoring flags (``--val-data``, ``--data-cache``; shared with ``nas export``)."""
    from nas.search.fitness import validation_tokens as load

    return load(args.supernet, payload, val_data=args.val_data, data_cache=args.data_cache)


def run(args: argparse.Namespace) -> int:
    status = _run(args)
    out = Path(args.out)
    if getattr(args, "json", False) and (out / "search.json").exists():  # --json: search.json, with verify.json in it
        from .common import emit

        doc = {"out": str(out), "exit_status": status, **json.loads((out / "search.json").read_text())}
        if args.timing_target and (out / "verify.json").exists():
            doc["verify"] = json.loads((out / "verify.json").read_text())
        emit(args, doc)
    return status


def _run(args: argparse.Namespace) -> int:
    import numpy as np

    from nas import search as S
    from supernet.progress import show_progress
    from search_spaces import UserError

    if args.budget:  # the syntax, before loading anything (the default workload comes from the predictors)
        S.parse_workload_budgets(args.budget, args.workload or "")
    max_params = S.parse_count(args.max_params) if args.max_params else None
    config = S.SearchConfig(
        population=args.population, parents=args.parents, mutations=args.mutations, crossovers=args.crossovers,
        generations=args.generations, mutate_prob=args.mutate_prob, selection=args.selection,
        tournament_size=args.tournament_size, aging=args.aging, max_tries=args.max_redraws,
    )
    if args.worker_batch < 1:
        raise UserError(f"--worker-batch: {args.worker_batch} is not a positive integer")
    S.STRATEGIES.get(args.strategy)  # a name no strategy registered: refused before any work
    if args.storage:
        S.check_storage(args.storage)  # its syntax and driver, before anything is loaded or made
    if not 0 <= args.verify_margin < 100:
        raise UserError(f"--verify-margin: {args.verify_margin} is not a percentage between 0 and 100")
    device = S.pick_device(args.device)
    from latency.quantize import check_precision

    precision = check_precision(args.precision)

    from latency.predictors import load_predictor
    from search_spaces import tasks
    from supernet.checkpoint import load_supernet

    model, payload = load_supernet(args.supernet, device=device)  # the supernet of the checkpoint's task, loaded once
    space = model.space
    task = tasks.of(space)
    task.refuse(NAME, {"hurdles": args.hurdles, "val_data": args.val_data, "precision": precision, "fitness": args.fitness})
    example = task.example_tokens(args.seq_len)  # a training step's tokens are the task's (None: they vary)
    hurdles = S.hurdle_config(args.hurdles, args.hurdle_candidates, args.hurdle_tokens,
                              step_tokens=None if example is None else S.TRAIN_BATCH * example,
                              evaluations=config.evaluations, per_type=args.hurdle_per_type, init=args.hurdle_from,
                              batch=args.hurdle_batch_size)
    make_trainer = trainer_factory() if hurdles else None
    if hurdles and precision != "fp32":
        raise UserError(f"--hurdles: not at --precision {precision} yet (hurdle trainings are scored fp32)")
    latencies, primary = workload_latencies(args, space, load_predictor)
    fitness, data_digest = S.task_fitness(model, payload, scoring_settings(args, device, precision))
    if args.fitness != "inherited":
        fitness = calibrated(args, fitness, space, model.num_params, data_digest)

    params = functools.lru_cache(maxsize=None)(model.num_params)  # exact, as the extracted model
    limits = (S.ParamLimit(max_params, params),) if max_params else ()
    named = len(latencies) > 1  # several workloads: budgets and labels say which
    if not 0 <= args.margin < 50:
        raise UserError(f"--margin: {args.margin:g} is not a percentage in [0, 50)")
    budgets = S.parse_workload_budgets(args.budget, primary) if args.budget else {}
    for name in budgets:
        if name not in latencies:
            raise UserError(
                f"--budget: a budget on workload {name!r}, but no --predictor is fitted at it "
                f"(the predictors are at {', '.join(latencies)}); fit one on `nas measure-latency --workload {name}` timings"
            )
    plans = [
        (S.plan_label(plan, named), S.Constraints(tuple(
            S.LatencyBudget(ms * (1 - args.margin / 100), latencies[name], latencies[name].name, workload=name if named else "",
                            stated=ms if args.margin else None) for name, ms in plan.items()
        ) + limits))
        for plan in (S.budget_plans(budgets) if budgets else [])  # no --budget: one search, below
    ]
    plans = plans or [("no-budget", S.Constraints(limits))]
    latency = latencies[primary]
    problems, seeds = [], {}
    for label, cons in plans:
        try:
            seeds[label] = S.feasible_seeds(space, cons, np.random.default_rng([args.seed, 1]))
        except UserError as e:
            problems.append(str(e))
    if problems:
        raise UserError("\n".join(dict.fromkeys(problems)))

    from nas.search.calibrated import best_uniform_per_type

    first = {} if args.no_uniform_seeds or not hasattr(space, "uniform") else {  # (a space without hand-scaled models: none)
        label: best_uniform_per_type(space, cons.feasible, params) for label, cons in plans}
    identity = {
        "space": space.hash,
        "supernet": file_digest(Path(args.supernet)),
        "predictor": (file_digest(Path(args.predictor[0])) if len(args.predictor) == 1
                      else {name: file_digest(Path(lat.path)) for name, lat in latencies.items()}),
        "fitness": {**fitness.description, "data": data_digest},
        "strategy": args.strategy,
        "search": config.to_dict(),
        "seed": args.seed,
        "budgets": [label for label, _ in plans],
        "max_params": max_params,
        **({"margin_pct": args.margin} if args.margin else {}),  # absent at 0: studies of earlier versions still resume
        **({"first": {label: [s.key for s in ss] for label, ss in first.items()}} if first else {}),
    }
    out = Path(args.out)
    url = args.storage or S.default_storage(out)
    study_name = args.study or f"{args.strategy}-seed{args.seed}-{S.config_hash(identity)}"
    storage = S.open_storage(url)  # (the default, OUT/search.db, makes OUT)
    out.mkdir(parents=True, exist_ok=True)  # after the storage opened: a refused one leaves no folder
    # the objective's name in the study (dashboards label the value with it): what fitness returns, in the task's metric
    metric = f"{'loss' if args.fitness == 'inherited' else 'predicted retrained loss'} ({task.metric or task.unit})"
    study = S.open_study(storage, study_name, identity, metric=metric)
    store = S.TrialStore(study, space)  # on a database server (open_storage): Optuna's heartbeat, for workers on other hosts

    searches = [
        S.BudgetSearch(
            label, cons, S.STRATEGIES[args.strategy](space, config, cons.feasible, S.strategy_rng(args.seed, label), seeds[label],
                                                     first=first.get(label, ()))
        )
        for label, cons in plans
    ]
    shown = _safe_url(url)
    log.info(
        "%s on space %s (%s subnets), %s evaluations per budget at most; fitness: %s on %s; latency: %s",
        args.strategy,
        space.name,
        f"{space.size():,}",
        f"{config.evaluations:,}",
        fitness.summary,
        device,
        "; ".join(f"{n}: {lat.name}" for n, lat in latencies.items()) if named else latency.name,
    )
    log.info("study %r in %s  (run the same command again to resume, or in parallel to add a worker)", study_name, shown)
    with store, _ProgressBar(config.generations, disable=args.no_progress or not show_progress()) as bar:
        result = S.run_search(searches, fitness, latency, params, store, batch=args.worker_batch, progress=bar)

    report = write_outputs(
        out, space, searches, result, identity, study_name, shown, latency.name, latencies if named else None, primary
    )
    print(report)
    separation = report_separability(fitness, searches, result, out)
    for line in separation:
        print(line)
    for label, notes in result.notes.items():
        for note in notes[-3:]:
            log.info("note (%s): %s", label, note)
    trained = True
    if hurdles:
        corpus = task.training_data(payload.get("meta", {}))  # the supernet's corpus and split
        if corpus:
            corpus["corpus_dir"] = Path(args.data_cache or Path(args.supernet).resolve().parent).resolve()
        trainer = make_trainer(space=space, supernet=Path(args.supernet).resolve(), tokens=hurdles.tokens, seq_len=args.seq_len,
                               scoring=fitness, seed=args.seed, device=device,
                               **({"init": hurdles.init, "batch": hurdles.batch}
                                  if (hurdles.init, hurdles.batch) != ("inherited", S.TRAIN_BATCH) else {}), **corpus)
        from nas.search import hurdles as H

        cohorts = H.hurdle_candidates(searches, result.records, hurdles.candidates, hurdles.per_type)
        verified = True
        if args.timing_target:  # the cohort is timed first: only candidates whose measured latency holds are trained
            verified, cohorts = verify_on_device(args, model, searches, result, out, latencies[primary].path, cohorts)
        with S.TrialStore(study, space) as store:  # this worker again, its heartbeat on where the storage has one
            trained = hurdle_stage(args, hurdles, trainer, cohorts, store, out, space)
        if trained is None:
            return 130
    else:
        verified = (verify_on_device(args, model, searches, result, out, latencies[primary].path)[0]
                    if args.timing_target else True)
    return 0 if verified and trained and all(r is not None for r in result.best.values()) else 1


def calibrated(args: argparse.Namespace, inherited, space, params, data_digest: str):
    """``--fitness calibrated:DIR``: the ranker's prediction over ``inherited`` (checked against its windows and supernet)."""
    from nas.search.calibrated import CalibratedFitness, load_ranker
    from search_spaces import UserError

    kind, _, where = args.fitness.partition(":")
    if kind != "calibrated" or not where:
        raise UserError(f"--fitness: {args.fitness!r} is not 'inherited' or 'calibrated:DIR' (a folder of `nas fit-accuracy`)")
    ranker = load_ranker(where)
    fitness = CalibratedFitness(inherited, ranker, space, params, {**inherited.description, "data": data_digest},
                                file_digest(Path(args.supernet)), where)
    fitness.summary = f"retrained loss predicted by the {ranker.kind} ranker of {where} from {inherited.summary}"
    return fitness


def trainer_factory():
    """The maker of the hurdle stage's trainer (:class:`nas.search.hurdles.SubnetTrainer`: the space's task trains each
    candidate).  Tests replace this function with one that returns a fake trainer's maker."""
    from nas.search.hurdles import SubnetTrainer

    return SubnetTrainer


def hurdle_stage(args: argparse.Namespace, hurdles, trainer, cohorts, store, out: Path, space) -> bool | None:
    """``--hurdles``: train each budget's cohort (``nas.search.hurdles.hurdle_candidates``, device-verified with
    ``--timing-target``) in rounds, write and print the outcome; True when every budget has a best after hurdles, None when a
    training was interrupted."""
    from search_spaces import tasks
    from supernet.progress import show_progress
    from nas.search import hurdles as H

    task = tasks.of(space)
    models = out / "hurdles" / H.settings_tag(trainer, store.study.study_name)
    per_type = f" and the best {hurdles.per_type} of each attention type" if hurdles.per_type else ""
    verified = f", those whose latency held on {args.timing_target}" if args.timing_target else ""
    log.info("hurdles: %d rounds of %s %s (from %s) for the top %d of each budget%s%s; trained models in %s", hurdles.rounds,
             f"{hurdles.tokens:,}", task.token_unit, hurdles.init, hurdles.candidates, per_type, verified, models)
    try:
        with _HurdleBar(hurdles.rounds, disable=args.no_progress or not show_progress()) as bar:
            outcome = H.run_hurdles(cohorts, hurdles, trainer, store, out / "hurdles", progress=bar)
    except (H.TrainingStopped, KeyboardInterrupt) as e:  # nas.train_subnet's TrainingInterrupted is a KeyboardInterrupt
        print(f"hurdles interrupted: {e or 'Ctrl-C'}; its checkpoint is kept: run the same command again to continue")
        return None
    from supernet.files import atomic_write

    doc = H.write_files(out, outcome, space, args.seed, task.metric or task.unit, task.token_unit)
    summary = json.loads((out / "search.json").read_text())
    summary["hurdles"] = doc
    atomic_write(out / "search.json", json.dumps(summary, indent=2) + "\n")
    print(H.report(outcome, task.metric or task.unit, task.token_unit))
    print(f"wrote {out}/hurdles_*.yaml, hurdles.csv, search.json (hurdles); trained models in {out / 'hurdles' / outcome.tag}")
    for label, notes in outcome.notes.items():
        for note in notes:
            log.info("note (%s, hurdles): %s", label, note)
    return all(b.best is not None for b in outcome.budgets.values())


def report_separability(fitness, searches, result, out: Path, top: int = 5) -> list[str]:
    """Per budget: the standard error of the fitness beside the spread of its top candidates (also in search.json)."""
    if not hasattr(fitness, "heldout"):
        return []  # a fitness without held-out windows (an encoder-decoder's batches of pairs): not yet
    import numpy as np

    from nas.search.fitness import separability, separability_text

    lines, found = [], {}
    for s in searches:
        records = sorted((r for r in result.records if np.isfinite(r.loss)), key=lambda r: r.loss)
        candidates = list(dict.fromkeys(r.subnet for r in records))
        feasible = s.constraints.feasible(candidates) if candidates else []
        subnets = [c for c, ok in zip(candidates, feasible) if ok][:top]  # the budget's best, as best_per_budget ranks them
        if subnets:
            found[s.label] = separability(fitness, subnets)
            lines.append(separability_text(s.label, found[s.label]))
    path = out / "search.json"
    if found and path.exists():
        from supernet.files import atomic_write

        data = json.loads(path.read_text())
        data["separability"] = found
        atomic_write(path, json.dumps(data, indent=1))
    return lines


def verify_on_device(args: argparse.Namespace, model, searches, result, out: Path, predictor_path: str,
                     cohorts: dict | None = None) -> tuple[bool, dict | None]:
    """``--timing-target``: time the top candidates on the timing target (nas.search.verify), print the table;
    whether every budget holds, and the hurdle ``cohorts`` (timed too, after the top ones) kept to the candidates whose
    latency holds."""
    from latency.timing_core import Settings
    from nas.search.verify import VerifySettings, report, run_verify, with_cohorts

    settings = VerifySettings(device=args.timing_target, protocol=Settings(**PROTOCOL_DEFAULTS), top=args.verify_top,
                              threads=args.timing_threads, clock=args.clock, seed=args.seed, margin_pct=args.verify_margin)
    bar, update = measurement_bar(f"verifying on {args.timing_target}")
    try:
        verification = run_verify(settings, model, searches, result, out, predictor_path, progress=update,
                                  extra=None if cohorts is None else with_cohorts(cohorts))
    finally:
        bar.close()
    from search_spaces import tasks

    unit = tasks.of(model.space).unit
    print(report(verification.verdicts, verification.device, unit))
    print(f"wrote {', '.join(p.name for p in verification.files)} to {out}")
    if cohorts is not None:
        holds = {label: {c.candidate.subnet for c in v.checks if c.holds} for label, v in verification.verdicts.items()}
        kept = {label: [c for c in cands if c.subnet in holds.get(label, ())] for label, cands in cohorts.items()}
        for label in cohorts:
            if len(kept[label]) < len(cohorts[label]):
                log.info("hurdles (%s): %d of %d candidates measured over the budget on %s, not trained", label,
                         len(cohorts[label]) - len(kept[label]), len(cohorts[label]), args.timing_target)
        cohorts = kept
    return verification.holds, cohorts


def workload_latencies(args, space, load_predictor) -> tuple[dict, str]:
    """``{workload name: cached latency}`` from the ``--predictor`` files (one per workload) and the primary workload.

    Each predictor must be of the supernet's space (its subnets) and, where the supernet's space also
    names its workload, of that workload's shape; ``--workload`` must be one the predictors are at.
    """
    from nas import search as S
    from search_spaces import UserError

    latencies, paths = {}, {}
    for path in args.predictor:
        predictor = load_predictor(path)
        predictor.check_space(space)
        from latency.quantize import check_predictor_precision

        check_predictor_precision(predictor, path, getattr(args, "precision", None) or "fp32")
        name = predictor.workload or "prefill"
        if name in paths:
            raise UserError(
                f"--predictor: {paths[name]} and {path} are both fitted at workload {name!r}; give one predictor per workload"
            )
        spec = getattr(predictor, "workload_spec", None)
        ours = {w.name: w for w in space.workloads}.get(name)
        if spec is not None and ours is not None and spec != ours:
            raise UserError(f"--predictor {path}: fitted at workload {spec}, but the supernet's space defines {ours}; "
                            f"measure and fit a predictor at the space's workload (nas measure-latency --workload {name})")
        latencies[name] = S.CachedLatency(predictor.predict, describe_predictor(path, predictor))
        latencies[name].path, paths[name] = path, path
    primary = args.workload or next(iter(latencies))
    if primary not in latencies:
        have = ", ".join(f"{n} ({p})" for n, p in paths.items())
        raise UserError(f"--workload {primary}: no --predictor is fitted at it (they are at {have}); "
                        f"fit one on `nas measure-latency --workload {primary}` timings and pass it with --predictor")
    return latencies, primary


def describe_predictor(path: str, predictor) -> str:
    """``cpu (torch-eager, threads 1) on <cpu model>, mlp predictor from pred-cpu/``: where its milliseconds hold."""
    fp = getattr(predictor, "fingerprint", None) or {}
    device = fp.get("device", "an unknown device")
    details = ", ".join(f"{k} {fp[k]}" if k == "threads" else str(fp[k]) for k in ("runtime", "threads") if fp.get(k) is not None)
    where = f" on {fp['cpu_model']}" if fp.get("cpu_model") and device != "cuda" else ""
    spec = getattr(predictor, "workload_spec", None)
    at = f" at {spec}" if spec is not None else ""
    name = getattr(predictor, "name", "latency")
    source = Path(path).name + ("/" if Path(path).is_dir() else "")  # the folder, as such ("predictor/", not "predictor")
    return f"{device}{f' ({details})' if details else ''}{where}, {name} predictor from {source}{at}"


def _safe_url(url: str) -> str:
    from search_spaces.errors import hide_password

    return hide_password(url, url)


class _ProgressBar:
    """One bar per generation (a line per interval in a log), with the best loss per budget so far."""

    def __init__(self, generations: int, disable: bool):
        self.generations, self.disable, self.bar, self.gen = generations, disable, None, None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.close()

    def __call__(self, p) -> None:
        if self.disable:
            return
        if p.generation != self.gen:
            if self.bar is not None:  # the driver moved on: that generation is complete
                self.bar.update(self.bar.total - self.bar.n)
                self.bar.close()
            self.gen = p.generation
            self.bar = progress_bar(total=p.total, initial=p.done, desc=f"gen {p.generation + 1}/{self.generations}",
                                    unit="subnet")
        self.bar.total = p.total
        best = "  ".join(f"{label}={loss:.4f}" for label, loss in p.best.items())
        self.bar.set_postfix_str(f"best {best or '-'}" + ("  (waiting for other workers)" if p.waiting else ""), refresh=False)
        self.bar.update(p.done - self.bar.n)
        self.bar.refresh()


class _HurdleBar:
    """One bar over the hurdle trainings (its total grows as rounds open; a line per interval in a log)."""

    def __init__(self, rounds: int, disable: bool):
        self.rounds, self.disable, self.bar = rounds, disable, None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.close()

    def __call__(self, p) -> None:
        if self.disable:
            return
        if self.bar is None:
            self.bar = progress_bar(total=p.total, initial=p.done, desc="hurdles", unit="training")
        self.bar.total = p.total
        rounds = "  ".join(f"{label}: round {r + 1}/{self.rounds}" for label, r in p.rounds.items())
        self.bar.set_postfix_str(rounds + ("  (waiting for other workers)" if p.waiting else ""), refresh=False)
        self.bar.update(p.done - self.bar.n)
        self.bar.refresh()


def write_outputs(out: Path, space, searches, result, identity: dict, study: str, storage: str, latency_source: str,
                  latencies: dict | None = None, primary: str | None = None) -> str:
    """best_<budget>.yaml, pareto.csv / .png, search.json; returns the terminal table.

    ``latencies`` (several workloads): ``{workload: latency fn}``; the records' latency is ``primary``'s,
    the CSV gets a ``latency_<workload>_ms`` column each, and every other workload a ``pareto_<workload>.png``.
    """
    import numpy as np

    from nas.search import hypervolume, pareto_front
    from nas.search.pareto import CSV_FIELDS, loss_label, plot_png, plot_search, write_csv
    from search_spaces import tasks
    from supernet.files import atomic_write

    latencies = latencies or {}
    unique = list({r.subnet: r for r in reversed(result.records)}.values())[::-1]
    by_workload = {name: fn([r.subnet for r in unique]) if unique else np.zeros(0) for name, fn in latencies.items()}
    points = np.array([[r.loss, r.latency] for r in unique], dtype=np.float64).reshape(-1, 2)
    finite = np.all(np.isfinite(points), axis=1)
    front = set(np.flatnonzero(finite)[pareto_front(points[finite])].tolist()) if finite.any() else set()
    rows = [
        {
            "trial": r.trial,
            "budget": r.slot[0],
            "generation": r.slot[1],
            "loss_bpb": f"{r.loss:.6f}",
            "latency_ms": f"{r.latency:.6f}",
            "params": r.params,
            "on_front": int(i in front),
            "key": r.subnet.key,
            "subnet": str(r.subnet),
            **{f"latency_{name}_ms": f"{ms[i]:.6f}" for name, ms in by_workload.items()},
        }
        for i, r in enumerate(unique)
    ]
    extra = [f"latency_{name}_ms" for name in latencies]
    write_csv(out / "pareto.csv", rows, CSV_FIELDS[:5] + extra + CSV_FIELDS[5:])

    def budget_lines(workload: str | None) -> list[float]:
        # the budgets as stated (with --margin the search itself kept below them)
        return [getattr(c, "stated", None) or c.limit for s in searches for c in s.constraints.items
                if hasattr(c, "latency") and (workload is None or c.workload == workload)]

    budgets_ms = budget_lines(primary if latencies else None)
    at = f" ({primary} latency)" if latencies else ""
    scored = loss_label(tasks.of(space).metric or tasks.of(space).unit, identity.get("fitness", {}))  # what the loss is, on what
    figure = {"title": f"{identity['strategy']} on {space.name}: {len(unique)} subnets, latency{at} from {latency_source}",
              "ylabel": scored, "budgets_ms": budgets_ms,
              "limits_ms": [c.limit for s in searches for c in s.constraints.items if getattr(c, "stated", None)
                            and (not latencies or c.workload == primary)]}
    index = {r.subnet: i for i, r in enumerate(unique)}
    for name, ms in by_workload.items():
        if name != primary:
            other = np.array([[r.loss, m] for r, m in zip(unique, ms)], dtype=np.float64).reshape(-1, 2)
            best_other = {label: (r.loss, float(ms[index[r.subnet]])) for label, r in result.best.items() if r is not None}
            plot_png(out / f"pareto_{name}.png", other, budget_lines(name), best_other,
                     f"{identity['strategy']} on {space.name}: {len(unique)} subnets, {name} latency from {latencies[name].name}")

    from nas import __version__

    summary = {"nas_version": __version__, "study": study, "storage": storage, "config": identity,
               "evaluations": result.evaluations, "budgets": {}, "figure": figure}

    task = tasks.of(space)
    metric = task.metric  # what the loss is: bits/byte, bits/masked byte, nats/target byte
    wl = max([10] + [len(s.label) for s in searches])
    loss_head = f"loss ({task.unit})"
    lines = [f"{'budget':<{wl}} {loss_head:>10} {'latency':>10} {'params':>11} {'evals':>6}  subnet"]
    summary["workload"] = primary  # the workload of "latency_ms" (records, the Pareto front)
    ref = (
        float(points[finite, 0].max()) if finite.any() else 0.0,
        max(budgets_ms) if budgets_ms else float(points[finite, 1].max(initial=0)),
    )
    for s in searches:
        r = result.best[s.label]
        n = len(result.by_budget.get(s.label, []))
        entry = {"constraints": str(s.constraints), "evaluated": n, "notes": result.notes[s.label], "best": None,
                 "budgets_ms": {c.workload or primary: c.limit for c in s.constraints.items if hasattr(c, "latency")}}
        if r is None:
            lines.append(f"{s.label:<{wl}} {'-':>10} {'-':>10} {'-':>11} {n:>6}  no feasible subnet evaluated")
        else:
            each = {name: float(by_workload[name][index[r.subnet]]) for name in latencies}
            predicted = ", ".join(f"{name} {ms:.4f} ms" for name, ms in each.items()) if each else f"{r.latency:.4f} ms"
            atomic_write(out / f"best_{s.label}.yaml",
                f"# nas search: best subnet under {s.constraints}\n"
                f"# validation loss {r.loss:.6f} {metric} with inherited weights, predicted latency {predicted}, "
                f"{r.params:,} parameters\n"
                f"# space {space.name} (hash {space.hash}), strategy {identity['strategy']}, seed {identity['seed']}, "
                f"trial {r.trial} of study {study} in {storage}\n" + r.subnet.to_yaml()
            )
            entry["best"] = {"subnet": r.subnet.to_dict(), "key": r.subnet.key, "loss_bpb": r.loss, "latency_ms": r.latency,
                             "params": r.params, "trial": r.trial, "file": f"best_{s.label}.yaml"}
            if each:
                entry["best"]["latency_ms_by_workload"] = each
            also = "".join(f"  ({name} {ms:.3f}ms)" for name, ms in each.items() if name != primary)
            lines.append(f"{s.label:<{wl}} {r.loss:>10.4f} {r.latency:>8.3f}ms {r.params:>11,} {n:>6}  {r.subnet}{also}")
        summary["budgets"][s.label] = entry
    summary["hypervolume"] = {"value": hypervolume(points[finite], ref), "reference": ref}
    atomic_write(out / "search.json", json.dumps(summary, indent=2) + "\n")
    plot_search(out)
    lines.append(f"loss: {scored}")
    lines.append(f"wrote {out}/best_*.yaml, pareto.csv, pareto.png, search.json ({result.evaluations} evaluations in storage)")
    return "\n".join(lines)


register_command(__name__)
