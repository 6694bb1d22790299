"""The whole workflow on ``tiny.yaml`` in one call: train, measure, fit, search, export, check, compare.

Every stage is the documented command (``nas train-supernet``, ``nas measure-latency``, ...) run
in-process on one run directory, so the demo is the README's workflow, not a second
implementation of it.  Each stage leaves its files behind and resumes from them: run the same
command again after an interruption and finished stages are skipped, the interrupted one goes on
where it stopped (training from its checkpoint, the timing table from its last chunk, the search
from its Optuna storage).

After the search, the chosen subnet is exported and timed with ONNX Runtime side by side with
*hand-scaled baselines*: uniform Transformers (every layer the same heads, FFN width and attention
type) extracted from the same supernet, the best one per attention type that the predictor puts
under the budget.  All of them are scored on held-out windows the search never saw.

``recipe`` (``nas demo --recipe``, one of :data:`supernet.runs.RECIPES`; the CLI's default
:data:`supernet.runs.DEFAULT_RECIPE`, the one ``scripts/bench_final_training.py`` chose) turns the found subnet into the
deployed model by a final training of ``Plan.final_time`` instead (``nas train-subnet``: from scratch, or the
supernet's slice fine-tuned, or fine-tuned with the supernet's largest subnet as a teacher); without one the deployed
model is the subnet's inherited weights as they are.  The comparison with the baselines is between inherited models
alone (the found subnet's slice against theirs, all from the one supernet: the search's verdict, on equal terms); the
deployed model's own bits/byte on the same fresh windows is reported beside it, and it is what is timed and ships.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np

from search_spaces import Subnet, UserError


@dataclass(frozen=True)
class Plan:
    """How big each stage is.  ``FULL`` fits 15 minutes on an idle 2-core CPU, ``QUICK`` 5 (CI)."""

    train_time: str = "5m"
    samples: int = 100  # subnets timed with ONNX Runtime (+ 20% re-measured for test-retest)
    warmup: int = 3
    repeats: int = 9
    rounds: int = 3
    min_sample_ms: float = 10.0
    percentile: float = 40.0  # the budget: this percentile of the measured latencies
    margin_pct: float = 5.0  # the search stays this far below the budget by the predictor
    population: int = 100
    parents: int = 20
    mutations: int = 40
    crossovers: int = 40
    generations: int = 15
    val_windows: int = 32  # search fitness windows
    compare_windows: int = 64  # fresh held-out windows for the final comparison
    compare_repeats: int = 15  # timing of the export and the baselines, side by side
    compare_rounds: int = 5
    sample_tokens: int = 200
    final_time: str = "3m"  # the final training of the found subnet (with a recipe)


FULL = Plan()
QUICK = replace(
    FULL, train_time="60s", samples=30, repeats=4, rounds=2, population=16, parents=4, mutations=6, crossovers=6,
    generations=4, val_windows=16, compare_windows=16, compare_repeats=6, compare_rounds=2, sample_tokens=80,
    final_time="20s",
)

log = logging.getLogger(__name__)

SPACE = "tiny"
PROMPT = b"def "


class Paths:
    """Where each stage of a demo run directory keeps its files."""

    def __init__(self, root: Path):
        self.root = root
        self.supernet, self.checkpoint = root / "supernet", root / "supernet" / "latest.pt"
        self.timings, self.predictor = root / "latency" / "timings.csv", root / "predictor"
        self.search, self.model = root / "search", root / "model"
        self.summary, self.comparison = root / "summary.json", root / "comparison.csv"
        self.report = root / "report.html"


RunCommand = Callable[[list[str]], int]  # runs one `nas` command in-process (argv without "nas"): its exit status


def run_stage_command(run_command: RunCommand, argv: list[str], ok: tuple[int, ...] = (0,), *, rerun: str = "the demo") -> None:
    """Run one ``nas`` command; a failure stops the run with that command's message."""
    log.info("$ nas %s", " ".join(argv))
    code = run_command(argv)
    if code == 130:
        raise KeyboardInterrupt
    if code not in ok:
        raise UserError(f"`nas {argv[0]}` failed (exit {code}); fix the cause above and run {rerun} again to resume")


class Stages:
    """Resumable stages of a run folder: a stage whose marker (``root/.done/NAME``, holding its seconds) exists is skipped."""

    def __init__(self, root: Path, logger: logging.Logger = log):
        self.done, self.log = root / ".done", logger
        self.seconds: dict[str, float] = {}  # stages run by this process

    def __call__(self, name: str, fn: Callable[[], object]) -> None:
        """Run ``fn`` unless a marker says it finished; an interrupted stage's own command resumes it."""
        marker = self.done / name.replace(" ", "-")
        if marker.exists():
            self.log.info("== %s: finished in an earlier run, skipped", name)
            return
        self.log.info("== %s", name)
        t0 = time.perf_counter()
        fn()
        self.seconds[name] = time.perf_counter() - t0
        marker.parent.mkdir(exist_ok=True)
        marker.write_text(f"{self.seconds[name]:.1f}\n")

    def all_seconds(self) -> dict[str, float]:
        """Seconds of every finished stage, earlier runs' (from the markers) and this one's, rounded."""
        earlier = {m.name.replace("-", " "): float(m.read_text()) for m in self.done.glob("*")}
        return {k: round(v, 1) for k, v in {**earlier, **self.seconds}.items()}


def run_demo(out: str | Path, run_command: RunCommand, plan: Plan = FULL, *, threads: int | None = None, seed: int = 0,
             space: str = SPACE, data: str | None = None, recipe: str | None = None) -> dict:
    """All stages into ``out``; returns the summary (also written to ``out/summary.json``; :func:`render_summary` shows it).

    ``run_command(argv) -> exit status`` runs one documented ``nas`` command (the CLI passes its own
    ``main``), so every stage is the command a user would type.  Progress notes go to this module's logger.
    ``space`` (a shipped name or a YAML; default tiny) and ``data`` (``--data`` of train-supernet; default its
    corpus) serve the benchmarks that run the same stages on another space (``scripts/bench_encoder.py``).
    ``recipe``: the found subnet's final training (the module doc); None: its inherited weights, exported.
    """
    from supernet.runs import recipe_flags

    final = recipe_flags(recipe, Path(out) / "supernet" / "latest.pt") if recipe is not None else None  # (refused first)
    p = Paths(Path(out))
    p.root.mkdir(parents=True, exist_ok=True)
    thread_args = ["--threads", str(threads)] if threads else []
    stage = Stages(p.root)

    def cli(argv: list[str], ok: tuple[int, ...] = (0,)) -> None:
        run_stage_command(run_command, argv, ok)

    # 1. the supernet
    def train() -> None:
        if p.checkpoint.exists():
            cli(["train-supernet", "--out", str(p.supernet), "--resume", "--max-time", plan.train_time, *thread_args])
        else:
            cli(["train-supernet", space, "--out", str(p.supernet), "--max-time", plan.train_time, "--seed", str(seed),
                 *(["--data", data] if data else []), *thread_args])

    stage("train the supernet", train)

    # 2. latency: time subnets with ONNX Runtime on this CPU (one thread, the thread's CPU time: steady on a busy machine)
    measure = ["measure-latency", space, "--device", "onnxruntime", "--timing-threads", "1", "--clock", "cpu",
               "--samples", str(plan.samples), "--timing-warmup", str(plan.warmup), "--repeats", str(plan.repeats),
               "--rounds", str(plan.rounds), "--min-sample-ms", str(plan.min_sample_ms), "--seed", str(seed),
               "--out", str(p.timings)]  # fmt: skip
    stage("measure latency", lambda: cli(measure))
    stage(
        "fit the latency predictor",
        lambda: cli(["fit-predictor", str(p.timings), "--out", str(p.predictor), "--seed", str(seed)]),
    )

    # 3. search under the 40th percentile of what was measured
    budget_ms = budget_from_table(p.timings, plan.percentile)
    log.info("budget: %.3f ms, the %gth percentile of the %d measured subnets", budget_ms, plan.percentile, plan.samples)
    # 5% below the budget by the predictor (a guard band for its error), then held to the budget on the device
    search = ["search", str(p.checkpoint), "--predictor", str(p.predictor), "--budget", f"{budget_ms:.3f}ms",
              "--margin", str(plan.margin_pct), "--population", str(plan.population), "--parents", str(plan.parents),
              "--mutations", str(plan.mutations), "--crossovers", str(plan.crossovers), "--generations", str(plan.generations),
              "--val-windows", str(plan.val_windows), "--seed", str(seed), "--out", str(p.search), "--device", "cpu",
              # then time the top candidates with ONNX Runtime and keep the best whose measured latency holds
              "--timing-target", "onnxruntime", "--verify-top", "5", "--timing-threads", "1", "--clock", "cpu"]  # fmt: skip
    stage("search", lambda: cli(search, ok=(0, 1)))  # 1: no candidate held on the device; the demo goes on and says so
    best_file = _search_best(p.search)
    if best_file is None:
        raise UserError(f"{p.search}/search.json: the search found no subnet under {budget_ms:.3f} ms")

    # 4. export the winner (ONNX with fused attention, parity checked); its card scored on the search's windows and
    # carrying the predictor's latency (the measured one is added after the side-by-side timing below)
    if final is None:
        stage("export", lambda: cli(["export", str(p.checkpoint), "--subnet", str(best_file), "--out", str(p.model),
                                     "--predictor", str(p.predictor), "--val-windows", str(plan.val_windows)]))
    else:  # 4'. the final training of the found subnet by the recipe: its model folder (ONNX parity-checked) is the export
        def train_found() -> None:
            if (p.model / "train" / "latest.pt").exists():
                cli(["train-subnet", "--out", str(p.model), "--resume", *thread_args])
            else:
                cli(["train-subnet", str(best_file), "--space", space, "--out", str(p.model), *final, "--max-time",
                     plan.final_time, "--seed", str(seed), *(["--data", data] if data else []), *thread_args])

        stage(f"final training ({recipe})", train_found)

    # 5. the export and the hand-scaled baselines, measured side by side, scored on fresh windows
    log.info("== measure the export beside uniform baselines")
    t0 = time.perf_counter()
    summary = compare(p, plan, budget_ms, seed=seed, trained=final is not None)
    summary["recipe"] = recipe or "inherited weights, no final training"
    stage.seconds["compare"] = time.perf_counter() - t0
    summary["stage_seconds"] = stage.all_seconds()
    summary["plan"] = asdict(plan)
    if space == SPACE and data is None and plan in (FULL, QUICK):  # the command that makes this run again (the page's)
        summary["command"] = demo_command(p.root, plan, seed, threads, recipe)
    p.summary.write_text(json.dumps(summary, indent=2) + "\n")
    # 6. one page that shows the run (nas report)
    from nas.report import write_report

    write_report(p.root)
    return summary


def demo_command(out: Path, plan: Plan, seed: int, threads: int | None, recipe: str | None = None) -> str:
    """``nas demo`` as typed for ``plan`` (FULL or QUICK), ``seed``, ``threads`` and ``recipe`` (None: the inherited
    weights, ``--recipe none``; always written, for the default recipe may change) into ``out`` (quoted for a shell)."""
    import shlex

    return (f"nas demo --out {shlex.quote(str(out))}" + (" --quick" if plan == QUICK else "")
            + (f" --seed {seed}" if seed else "") + (f" --threads {threads}" if threads else "")
            + f" --recipe {recipe or 'none'}")


def budget_from_table(path: Path, percentile: float) -> float:
    from latency.table import read_timings

    rows = read_timings(path).passes("measure")
    if not rows:
        raise UserError(f"{path}: no measured subnets to set a budget from")
    return float(np.percentile([r.median_ms for r in rows.values()], percentile))


def _search_best(search_dir: Path) -> Path | None:
    """The verified subnet (measured within the budget) if there is one, else the search's best by the predictor."""
    for path in sorted(search_dir.glob("verified_*.yaml")):
        return path
    f = search_dir / "search.json"
    if not f.exists():
        return None
    for entry in json.loads(f.read_text()).get("budgets", {}).values():
        if entry.get("best"):
            return search_dir / entry["best"]["file"]
    return None


def uniform_subnets(space) -> list[Subnet]:
    """Every hand-scaled Transformer of the space: all layers the same heads, FFN width and attention type."""
    return space.uniform()


def compare(p: Paths, plan: Plan, budget_ms: float, *, seed: int, trained: bool = False) -> dict:
    """Time the exported subnet and the best uniform subnet per attention type side by side; score all on fresh windows.
    ``trained``: the export is the found subnet's own trained model (a recipe's), scored and timed as it is."""
    import torch

    from latency.device import get_device
    from latency.predictors import load_predictor
    from latency.table import read_timings
    from latency.timing_core import Settings
    from latency.protocol import measure
    from latency.report import latency_error_pct
    from nas.search import InheritedLoss
    from nas.search.fitness import separability, validation_tokens
    from supernet.artifact import load_model, read_card
    from supernet.checkpoint import load_supernet
    from supernet.generate import generate

    supernet, payload = load_supernet(p.checkpoint, device="cpu")
    space = supernet.space
    predictor = load_predictor(p.predictor)
    found = Subnet.from_dict(read_card(p.model)["subnet"])
    tokens, _ = validation_tokens(p.checkpoint, payload)
    from supernet.task import trained_options

    options = trained_options(space, payload["meta"])  # scored as trained (a masked LM: at its training mask rate)
    search_fit = InheritedLoss(supernet, tokens, windows=plan.val_windows, seed=0, options=options)  # the search's windows
    # never seen by the search
    fresh_fit = InheritedLoss(supernet, tokens, windows=plan.compare_windows, seed=seed + 1000, options=options)

    # the best uniform subnet of each attention type that the predictor puts under the budget
    uniform = uniform_subnets(space)
    predicted = dict(zip(uniform, predictor.predict(uniform)))
    baselines: dict[str, Subnet] = {}
    for attention in space.attention:
        feasible = [s for s in uniform if s.attention[0] == attention and predicted[s] <= budget_ms]
        if feasible:
            losses = search_fit(feasible)
            baselines[attention] = feasible[int(np.argmin(losses))]
    log.info("baselines: the best uniform subnet per attention type under %.3f ms (predicted), %d of %d types have one",
             budget_ms, len(baselines), len(space.attention))

    candidates = {"found": found, **{f"uniform {a}": s for a, s in baselines.items()}}
    table = read_timings(p.timings)
    fp = table.fingerprint
    device = get_device("onnxruntime", threads=fp.get("threads") or 1, clock=fp.get("clock", "wall"))
    settings = Settings(
        warmup=plan.warmup, repeats=plan.compare_repeats, rounds=plan.compare_rounds, min_sample_ms=plan.min_sample_ms
    )
    models = {name: supernet.extract(s).eval() for name, s in candidates.items()}
    if trained:
        models["found"] = load_model(p.model)  # the deployed model: what ships is what is timed (the same architecture)
    m = measure(device, models, space.workload(), settings, seed=seed, baseline_ms=table.meta.get("baseline_ms"))
    # the verdict on equal terms: every model's inherited weights (the found subnet's slice too), the same windows
    losses = fresh_fit(list(candidates.values()))
    searched = search_fit(list(candidates.values()))  # as the search scored them (the model card's number)
    paired = separability(fresh_fit, list(candidates.values()))["vs_first"]  # each baseline - found, window by window
    deployed = None
    if trained:  # the final training's model on the same windows, beside its inherited slice
        deployed = {"bpb": float(fresh_fit.static(models["found"])), "bpb_windows": plan.compare_windows,
                    "search_bpb": float(search_fit.static(models["found"])), "inherited_bpb": float(losses[0])}
    pred = predictor.predict(list(candidates.values()))
    rows = []
    for (name, s), loss, seen, pr in zip(candidates.items(), losses, searched, pred):
        r = m.results[name]
        rows.append({"name": name, "subnet": str(s), "key": s.key, "params": supernet.num_params(s), "bpb": float(loss),
                     "bpb_windows": plan.compare_windows, "search_bpb": float(seen), "search_windows": plan.val_windows,
                     "predicted_ms": float(pr), "measured_ms": float(r.median_ms), "measured_iqr_ms": float(r.iqr_ms),
                     "flags": ";".join(r.flags)})
    for row, d in zip(rows[1:], paired):  # the noise of the verdict: the paired difference and its standard error
        row.update(vs_found_bpb=d["diff"], vs_found_se=d["se"])
    _write_csv(p.comparison, rows)

    me = rows[0]
    from supernet.artifact import update_card

    measured = m.results["found"]  # the card's measured latency: this side-by-side campaign (as `nas export --measure` adds)
    update_card(p.model, measured={
        "device": device.fingerprint(), "timed": "the static model, beside the uniform baselines (nas demo)",
        "workload": space.workload().record(), "settings": settings.to_dict(), "median_ms": measured.median_ms,
        "iqr_ms": measured.iqr_ms, "flags": list(measured.flags), "anchored_to_reference_ms": table.meta.get("baseline_ms"),
        "predicted_ms": me["predicted_ms"], "error_pct": latency_error_pct(me["measured_ms"], me["predicted_ms"]),
        "budget_ms": budget_ms, "over_budget": bool(me["measured_ms"] > budget_ms)})
    beaten = [r for r in rows[1:] if r["measured_ms"] <= me["measured_ms"]]
    verdict = all(me["bpb"] < r["bpb"] for r in beaten)
    sample = b""  # an encoder does not generate
    if space.causal:
        sample = PROMPT + generate(load_model(p.model), PROMPT, plan.sample_tokens, generator=torch.Generator().manual_seed(seed))
    return {
        "budget_ms": budget_ms,
        "found": {**me, "subnet": found.to_dict()},
        **({"deployed": deployed} if deployed else {}),
        "error_pct": latency_error_pct(me["measured_ms"], me["predicted_ms"]),
        "within_budget": me["measured_ms"] <= budget_ms,
        "baselines": rows[1:],
        "beats_baselines": verdict,
        "baselines_at_or_below_found_latency": len(beaten),
        "sample": sample.decode("utf-8", errors="replace"),
        "files": {
            "pareto_png": str(p.search / "pareto.png"),
            "predicted_vs_measured_png": str(p.predictor / "predicted_vs_measured.png"),
            "model": str(p.model),
            "comparison_csv": str(p.comparison),
            "report_html": str(p.report),
        },
    }


def _write_csv(path: Path, rows: list[dict]) -> None:
    """The comparison table; bits/byte to 4 decimals, milliseconds to 3 (the figures' own precision, not float noise)."""
    import csv

    digits = {"bpb": 4, "search_bpb": 4, "predicted_ms": 3, "measured_ms": 3, "measured_iqr_ms": 3, "vs_found_bpb": 4,
              "vs_found_se": 4}
    fields = list(dict.fromkeys(k for r in rows for k in r))  # the found model's row has no vs_found columns
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, restval="")
        w.writeheader()
        w.writerows({k: f"{v:.{digits[k]}f}" if k in digits else v for k, v in r.items()} for r in rows)


def render_summary(s: dict, p: Paths) -> str:
    f = s["found"]
    lines = [
        "",
        "=" * 78,
        f"budget {s['budget_ms']:.3f} ms (ONNX Runtime, 1 thread, this CPU; prefill 1x256 bytes)",
        f"found  {Subnet.from_dict(f['subnet'])}",
        f"       {f['params']:,} parameters, {f['bpb']:.4f} bits/byte with its inherited weights on {f['bpb_windows']} fresh "
        f"held-out windows ({f['search_bpb']:.4f} on the search's {f['search_windows']}, as its search scored it)",
        f"       deployed model: {s.get('recipe', 'inherited weights, no final training')}"
        + (f": {d['bpb']:.4f} bits/byte on the same fresh windows" if (d := s.get("deployed")) else ""),
        f"       predicted {f['predicted_ms']:.3f} ms, measured {f['measured_ms']:.3f} ms ({s['error_pct']:+.1f}%), "
        + ("within the budget" if s["within_budget"] else "OVER THE BUDGET"),
        "",
        f"{'':2}{'model':22} {'params':>9} {'bits/byte':>9} {'predicted':>10} {'measured':>9}   "
        f"(bits/byte: {f['bpb_windows']} fresh windows, every model's inherited weights)",
    ]
    for r in [f] + s["baselines"]:
        lines.append(
            f"{'*' if r is f else ' ':2}{r['name']:22} {r['params']:>9,} {r['bpb']:>9.4f} {r['predicted_ms']:>8.3f}ms "
            f"{r['measured_ms']:>7.3f}ms"
        )
    n = s["baselines_at_or_below_found_latency"]
    lines.append("")
    if n == 0:
        lines.append("no uniform baseline measured at or below the found subnet's latency")
    else:
        lines.append(f"found subnet vs the {n} uniform baselines at equal or lower measured latency: "
                     + ("lower bits/byte than all of them" if s["beats_baselines"] else "NOT lower bits/byte than all of them"))
    lines += ["", "sample (temperature 0.8):", "  " + s["sample"].replace("\n", "\n  "), ""]
    lines.append(f"files: {p.report} (the whole run on one page), {p.search / 'pareto.png'}, "
                 f"{p.predictor / 'predicted_vs_measured.png'}, {p.comparison}, {p.model}/")
    lines.append("stage seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in s["stage_seconds"].items()))
    lines.append("=" * 78)
    return "\n".join(lines)
