"""``nas search --timing-target TARGET``: the budget must hold on the device, not only in the predictor.

After a search, the top ``K`` candidates of each budget (feasible by the predictor, in order of
fitness) are extracted and timed on the device with the measurement protocol; a candidate whose
measured latency breaks the budget is dropped, and the best one that holds is the budget's
verified subnet.  HAT's users set 200 ms and measured 270 ms: this is the check that catches it.

:func:`verify` is the decision, pure: candidates, a ``measure`` callable and the budgets in,
verdicts out.  :func:`run_verify` is the glue ``nas search`` calls (device, models, files), with
:class:`VerifySettings` built from its flags; the command prints :func:`report` of its outcome.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from latency.report import latency_error_pct
from latency.timing_core import Settings
from search_spaces import Subnet, UserError, tasks
from supernet.files import atomic_write, atomic_write_csv

log = logging.getLogger(__name__)

# subnets -> {subnet: (measured ms, protocol flags)}; one call times them all, interleaved.
MeasureFn = Callable[[Sequence[Subnet]], Mapping[Subnet, tuple[float, list[str]]]]


@dataclass(frozen=True)
class Candidate:
    subnet: Subnet
    loss: float  # validation bits per byte (fitness)
    predicted_ms: float
    params: int
    trial: int


@dataclass
class Check:
    rank: int  # 1 = the search's best
    candidate: Candidate
    measured_ms: float
    flags: list[str]
    holds: bool

    @property
    def error_pct(self) -> float:
        """(measured - predicted) / predicted, in percent (:func:`latency.report.latency_error_pct`)."""
        return latency_error_pct(self.measured_ms, self.candidate.predicted_ms)


@dataclass
class Verdict:
    label: str
    budget_ms: float | None
    checks: list[Check] = field(default_factory=list)

    @property
    def chosen(self) -> Check | None:
        """The best-ranked candidate whose measured latency holds."""
        return next((c for c in self.checks if c.holds), None)


def top_candidates(searches, records, k: int) -> dict[str, list[Candidate]]:
    """Per budget: the ``k`` lowest-loss distinct subnets that meet its constraints (by the predictor)."""
    if k < 1:
        raise UserError(f"--verify-top: {k} is not a positive integer")
    unique = list({r.subnet: r for r in reversed(records)}.values())[::-1]
    out: dict[str, list[Candidate]] = {}
    for s in searches:
        ok = s.constraints.feasible([r.subnet for r in unique]) if unique else np.zeros(0, dtype=bool)
        feasible = sorted(
            (r for r, good in zip(unique, ok) if good and np.isfinite(r.loss)), key=lambda r: (r.loss, r.latency, r.trial)
        )
        out[s.label] = [Candidate(r.subnet, r.loss, r.latency, r.params, r.trial) for r in feasible[:k]]
    return out


def with_cohorts(cohorts: Mapping[str, Sequence]) -> dict[str, list[Subnet]]:
    """The subnets of each budget's hurdle cohort (``nas.search.hurdles.Candidate``), to verify after the top ones."""
    return {label: [c.subnet for c in cands] for label, cands in cohorts.items()}


def add_extra(candidates: dict[str, list[Candidate]], extra: Mapping[str, Sequence[Subnet]],
              records) -> dict[str, list[Candidate]]:
    """``candidates`` with each budget's ``extra`` subnets appended (those not already there), as the search scored them."""
    seen = {}
    for r in records:
        seen.setdefault(r.subnet, r)
    out = {}
    for label, cands in candidates.items():
        have = {c.subnet for c in cands}
        more = [seen[s] for s in dict.fromkeys(extra.get(label, ())) if s not in have and s in seen]
        out[label] = list(cands) + [Candidate(r.subnet, r.loss, r.latency, r.params, r.trial) for r in more]
    return out


def budget_of(search, workload: str | None = None) -> float | None:
    """The budget (ms) among a budget search's constraints (on ``workload`` when given), None when it has none.

    With ``--margin`` the search kept below the budget by the predictor; the device is held to the budget itself.
    """
    return next((getattr(c, "stated", None) or c.limit for c in search.constraints.items
                 if hasattr(c, "latency") and (workload is None or getattr(c, "workload", "") in ("", workload))), None)


def verify(
    candidates: Mapping[str, Sequence[Candidate]], budgets: Mapping[str, float | None], measure: MeasureFn,
    margin_pct: float = 0.0,
) -> dict[str, Verdict]:
    """Time every candidate once (all budgets together), keep per budget the ones whose measured latency holds:
    at most the budget less ``margin_pct`` percent (headroom for the next measurement's noise, so that the model
    still holds when it is timed again, exported, on another day)."""
    subnets = list(dict.fromkeys(c.subnet for cands in candidates.values() for c in cands))
    timed = measure(subnets) if subnets else {}
    verdicts = {}
    for label, cands in candidates.items():
        budget = budgets.get(label)
        v = Verdict(label, budget)
        for rank, c in enumerate(cands, 1):
            ms, flags = timed[c.subnet]
            v.checks.append(Check(rank, c, float(ms), list(flags),
                                  budget is None or ms <= budget * (1 - margin_pct / 100)))
        verdicts[label] = v
    return verdicts


def report(verdicts: Mapping[str, Verdict], device: str, unit: str = "bpb") -> str:
    """The terminal table: predicted vs measured per candidate, which are dropped and which is kept."""
    lines = [f"verified on {device}:",
             f"{'budget':<10} {'rank':>4} {f'loss ({unit})':>10} {'predicted':>11} {'measured':>11} {'error':>7}  "
             "verdict   subnet"]
    for v in verdicts.values():
        chosen = v.chosen
        for c in v.checks:
            verdict = "KEPT" if c is chosen else ("holds" if c.holds else "DROPPED")
            lines.append(f"{v.label:<10} {c.rank:>4} {c.candidate.loss:>10.4f} {c.candidate.predicted_ms:>9.3f}ms "
                         f"{c.measured_ms:>9.3f}ms {c.error_pct:>+6.1f}%  {verdict:<8}  {c.candidate.subnet}"
                         + (f"  [{', '.join(c.flags)}]" if c.flags else ""))
        if not v.checks:
            lines.append(f"{v.label:<10} {'-':>4}  no feasible candidate to verify")
        elif chosen is None:
            lines.append(
                f"{v.label:<10}       none of the top {len(v.checks)} holds on the device: widen --verify-top, refit the "
                "predictor on this device, or relax the budget"
            )
    return "\n".join(lines)


def write_files(out: Path, verdicts: Mapping[str, Verdict], device_fp: dict, workload, settings: dict, space) -> list[Path]:
    """``verify.json``, ``verify.csv`` and ``verified_<budget>.yaml`` per budget that has a subnet that holds."""
    rows, doc = [], {"device": device_fp, "workload": vars(workload), "settings": settings, "budgets": {}}
    written = []
    for v in verdicts.values():
        chosen = v.chosen
        entries = []
        for c in v.checks:
            row = {
                "budget": v.label,
                "budget_ms": v.budget_ms,
                "rank": c.rank,
                "trial": c.candidate.trial,
                "loss_bpb": c.candidate.loss,
                "predicted_ms": c.candidate.predicted_ms,
                "measured_ms": c.measured_ms,
                "error_pct": round(c.error_pct, 3),
                "holds": c.holds,
                "kept": c is chosen,
                "flags": ";".join(c.flags),
                "params": c.candidate.params,
                "key": c.candidate.subnet.key,
                "subnet": str(c.candidate.subnet),
            }
            rows.append(row)
            entries.append({**row, "subnet": c.candidate.subnet.to_dict()})
        doc["budgets"][v.label] = {"budget_ms": v.budget_ms, "checks": entries,
                                   "verified": None if chosen is None else f"verified_{v.label}.yaml"}
        if chosen is not None:
            path = out / f"verified_{v.label}.yaml"
            atomic_write(
                path,
                f"# nas search --timing-target: the best of the top {len(v.checks)} candidates whose measured latency holds "
                f"under "
                f"{v.label}\n"
                f"# measured {chosen.measured_ms:.4f} ms on {device_fp.get('device')} (predicted "
                f"{chosen.candidate.predicted_ms:.4f} ms), "
                f"validation loss {chosen.candidate.loss:.6f} {_unit(space)}, rank {chosen.rank}, "
                f"trial {chosen.candidate.trial}\n"
                f"# space {space.name} (hash {space.hash})\n" + chosen.candidate.subnet.to_yaml()
            )
            written.append(path)
    atomic_write(out / "verify.json", json.dumps(doc, indent=2, default=str) + "\n")
    atomic_write_csv(out / "verify.csv", list(rows[0]) if rows else ["budget"], rows)
    return [out / "verify.json", out / "verify.csv", *written]


def _unit(space) -> str:
    return tasks.of(space).metric


# --------------------------------------------------------------------------- the command's side


def device_measure(
    device, supernet, workload, settings, *, seed: int = 0, baseline_ms: float | None = None, progress=None
) -> MeasureFn:
    """A :data:`MeasureFn` that extracts each subnet from ``supernet`` and times it with the protocol
    (drift correction anchored to ``baseline_ms``, the predictor's campaign, when given)."""
    from latency.protocol import measure

    def run(subnets: Sequence[Subnet]) -> dict[Subnet, tuple[float, list[str]]]:
        models = {s.key: supernet.extract(s).cpu().eval() for s in subnets}  # every task's supernet extracts its own
        results = measure(device, models, workload, settings, seed=seed, baseline_ms=baseline_ms, progress=progress).results
        return {s: (results[s.key].median_ms, list(results[s.key].flags)) for s in subnets}

    return run


@dataclass(frozen=True)
class VerifySettings:
    """What ``nas search --timing-target`` does after the search (built from its flags by the command)."""

    device: str  # --timing-target: cpu, cuda, onnxruntime, ...
    protocol: Settings  # the measurement protocol (one model measured once: nas export's defaults)
    top: int = 3  # --verify-top: candidates per budget, in order of fitness
    threads: int | None = None  # --timing-threads
    clock: str | None = None  # --clock
    seed: int = 0  # the search's --seed: the order of the timed visits
    margin_pct: float = 0.0  # --verify-margin: a candidate holds when measured <= budget x (1 - margin / 100)


@dataclass
class Verification:
    """The outcome of :func:`run_verify`: the verdicts, what was timed where, the files written."""

    verdicts: dict[str, Verdict]
    device: str  # "onnxruntime (prefill 1x256)"
    files: list[Path]

    @property
    def holds(self) -> bool:
        """Every budget has a candidate whose measured latency holds."""
        return all(v.chosen is not None for v in self.verdicts.values())


def run_verify(settings: VerifySettings, supernet, searches, result, out: Path, predictor_path: str,
               progress: Callable[[int, int, str], None] | None = None,
               extra: Mapping[str, Sequence[Subnet]] | None = None) -> Verification:
    """Verify a finished search on the device: time the top candidates, decide, write the files.

    The device times the workload of ``predictor_path``, the search's primary predictor (budgets on other
    workloads are not checked); the drift correction is anchored to that predictor's campaign.
    """
    from latency.device import get_device
    from latency.predictors import load_predictor
    from latency.measure import workload_text

    predictor = load_predictor(predictor_path)
    workload = predictor.workload_spec or supernet.space.workload("prefill")
    from latency.quantize import check_device, precision_of

    precision = precision_of(predictor.fingerprint or {})  # the device times the models at the predictor's precision
    check_device(precision, settings.device)
    tasks.of(supernet.space).check_timing(supernet.space, settings.device, precision)  # the devices that time the task
    device = get_device(settings.device, threads=settings.threads, clock=settings.clock,
                        precision=None if precision == "fp32" else precision)
    fp_device = (predictor.fingerprint or {}).get("device")
    if fp_device and fp_device != device.name:
        log.warning("the predictor was fitted on %r, verifying on %r: expect large errors", fp_device, device.name)
    candidates = top_candidates(searches, result.records, settings.top)
    if extra:  # e.g. the hurdle cohorts: timed in the same campaign, after the top ones (the verdict's ranks)
        candidates = add_extra(candidates, extra, result.records)
    verdicts = verify(candidates, {s.label: budget_of(s, workload.name) for s in searches},
                      device_measure(device, supernet, workload, settings.protocol, seed=settings.seed,
                                     baseline_ms=predictor.reference_ms, progress=progress), settings.margin_pct)
    files = write_files(out, verdicts, device.fingerprint(), workload, asdict(settings.protocol), supernet.space)
    if (out / "search.json").exists() and (out / "pareto.csv").exists():  # the front again, with what the device measured
        from .pareto import plot_search

        plot_search(out, measured=True)
    return Verification(verdicts, f"{device.name} ({workload_text(workload)})", files)
