"""The one search loop: strategies propose, workers claim and evaluate, storage holds everything.

Each budget has its own strategy (its own RNG).  A strategy's generation ``g`` is a pure
function of the seed and the results of generations ``< g``, and results are read back
from storage, so every worker (and a restarted one) rebuilds the same strategies by
replaying ``ask``/``tell`` over the finished generations, then helps with the open
slots of the current ones::

    loop:
        snapshot the trials
        for each budget: while its current generation is complete in storage: tell it, ask the next
        if every strategy is done: stop
        claim up to `batch` open slots (lowest generation first), evaluate them, complete them
        (no open slot: recover trials of dead workers, wait for the others)

Killed and resumed therefore equals uninterrupted, and several workers on one storage
compute exactly what one would.  Losses are cached per subnet across budgets and workers.
"""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from search_spaces import Subnet, UserError

from .constraints import Constraints
from .fitness import FitnessFn
from .storage import Record, Slot, Snapshot, TrialStore
from .strategy import Strategy


def strategy_rng(seed: int, label: str) -> np.random.Generator:
    """The RNG of the strategy for budget ``label``: the same whatever other budgets are searched."""
    return np.random.default_rng([seed, zlib.crc32(label.encode())])


@dataclass
class BudgetSearch:
    """One search: a label (``50ms``), the constraints it must meet and its strategy."""

    label: str
    constraints: Constraints
    strategy: Strategy
    proposal: list[Subnet] | None = None  # the current generation, once asked


@dataclass(frozen=True)
class Progress:
    generation: int  # the lowest generation still open
    done: int  # its finished slots
    total: int  # its slots (all budgets)
    best: dict[str, float]  # best loss so far per budget (feasible points only)
    evaluations: int  # subnets evaluated by this search, all workers
    waiting: bool  # no open slot: waiting for other workers


@dataclass
class SearchResult:
    records: list[Record]  # one per finished slot, in trial order
    best: dict[str, Record | None]  # per budget label
    notes: dict[str, list[str]]
    evaluations: int  # records that were evaluated (not reused from another slot)
    claimed_here: int = 0
    seconds: float = 0.0
    by_budget: dict[str, list[Record]] = field(default_factory=dict)


def best_per_budget(searches: Sequence[BudgetSearch], records: Sequence[Record]) -> dict[str, Record | None]:
    """The lowest-loss record that meets each search's constraints (any budget's evaluations count)."""
    unique = list({r.subnet: r for r in reversed(records)}.values())[::-1]
    subnets = [r.subnet for r in unique]
    out: dict[str, Record | None] = {}
    for s in searches:
        ok = s.constraints.feasible(subnets) if subnets else np.zeros(0, dtype=bool)
        feasible = [r for r, good in zip(unique, ok) if good and np.isfinite(r.loss)]
        out[s.label] = min(feasible, key=lambda r: (r.loss, r.latency, r.trial)) if feasible else None
    return out


def _advance(search: BudgetSearch, snap: Snapshot) -> None:
    """Tell the strategy every generation that storage holds complete, ask the next one."""
    strategy = search.strategy
    while True:
        if search.proposal is None:
            if strategy.done:
                return
            search.proposal = strategy.ask()
            if not search.proposal:
                return
        g = strategy.generation
        recs = [snap.complete.get((search.label, g, i)) for i in range(len(search.proposal))]
        if any(r is None for r in recs):
            return
        for r, want in zip(recs, search.proposal):
            if r.subnet != want:
                raise UserError(
                    f"storage: trial {r.trial} (budget {search.label}, generation {g}, index {r.slot[2]}) holds {r.subnet}, "
                    f"but this search proposes {want} there: the study was made by other settings or code; use another --study "
                    "or --out"
                )
        strategy.tell(search.proposal, [r.loss for r in recs], [r.latency for r in recs])
        search.proposal = None


def _finished(search: BudgetSearch) -> bool:
    return search.proposal is None and search.strategy.done or search.proposal == []


def run_search(
    searches: Sequence[BudgetSearch],
    fitness: FitnessFn,
    latency: Callable[[Sequence[Subnet]], np.ndarray],
    params: Callable[[Subnet], int],
    store: TrialStore,
    *,
    batch: int = 8,
    poll_s: float = 0.5,
    progress: Callable[[Progress], None] | None = None,
    rng: np.random.Generator | None = None,
) -> SearchResult:
    """Run (or resume, or join) the search in ``store`` until every strategy is done.

    ``fitness(subnets) -> losses`` is called with up to ``batch`` subnets at a time; ``latency``
    (ms) and ``params`` describe a subnet in its trial.  ``rng`` only spreads the slots several
    workers pick at once; it never changes a result.
    """
    t0 = time.perf_counter()
    rng = rng or np.random.default_rng(abs(hash(store.owner)) % 2**32)
    cache: dict[Subnet, float] = {}
    claimed = 0
    store.recover()
    while True:
        snap = store.snapshot()
        for s in searches:
            _advance(s, snap)
        active = [s for s in searches if not _finished(s)]
        if not active:
            break
        open_slots = sorted(
            (s.strategy.generation, k, i)
            for k, s in enumerate(searches)
            if s in active
            for i in range(len(s.proposal))
            if snap.owner_of((s.label, s.strategy.generation, i)) is None
        )
        if progress:
            progress(_progress(searches, snap, waiting=not open_slots))
        if not open_slots:
            if not store.recover():
                time.sleep(poll_s)
            continue
        others = any(o != store.owner for claims in snap.running.values() for _, o in claims)
        start = int(rng.integers(len(open_slots))) if others and len(open_slots) > batch else 0
        pick = (open_slots[start:] + open_slots[:start])[:batch]
        claimed += _work(searches, pick, snap, store, fitness, latency, params, cache)

    snap = store.snapshot()
    if progress:
        progress(_progress(searches, snap, waiting=False))
    records = sorted(snap.complete.values(), key=lambda r: r.trial)
    best = best_per_budget(searches, records)
    store.mark_best(best)
    return SearchResult(
        records=records,
        best=best,
        notes={s.label: list(s.strategy.notes) for s in searches},
        evaluations=sum(not r.cached for r in records),
        claimed_here=claimed,
        seconds=time.perf_counter() - t0,
        by_budget={s.label: [r for r in records if r.slot[0] == s.label] for s in searches},
    )


def _work(searches, pick, snap, store, fitness, latency, params, cache) -> int:
    """Claim the picked slots, drop the ones another worker claimed first, evaluate and complete the rest."""
    wanted = []
    for g, k, i in pick:
        search = searches[k]
        subnet = search.proposal[i]
        slot: Slot = (search.label, g, i)
        known = snap.losses.get(subnet, cache.get(subnet))
        slack = search.constraints.slack([subnet])[0].tolist()  # Optuna's constraint values: <= 0 holds
        wanted.append((slot, subnet, float(latency([subnet])[0]), params(subnet), known, slack))
    numbers = store.claim_all([(slot, subnet, ms, n, known is not None, slack)
                               for slot, subnet, ms, n, known, slack in wanted])
    claims = [(slot, subnet, number, known) for (slot, subnet, _, _, known, _), number in zip(wanted, numbers)]
    after = store.snapshot()
    mine = []
    for slot, subnet, number, known in claims:
        owner = after.owner_of(slot)
        if owner != number:
            store.drop(number, f"slot {slot} was claimed first by trial {owner}")
        else:
            mine.append((subnet, number, known if known is not None else after.losses.get(subnet)))
    todo = list(dict.fromkeys(s for s, _, known in mine if known is None and s not in cache))
    if todo:
        try:
            cache.update(zip(todo, np.asarray(fitness(todo), dtype=np.float64).tolist()))
        except BaseException as e:  # interrupted or broken: give the slots back at once
            for _, number, _ in mine:
                store.fail(number, f"evaluation stopped: {type(e).__name__}")
            raise
    for subnet, number, known in mine:
        loss = known if known is not None else cache[subnet]
        store.finish(number, loss if np.isfinite(loss) else float("inf"))
    return len(mine)


def _progress(searches, snap: Snapshot, waiting: bool) -> Progress:
    """Counts of the lowest open generation over all budgets (a budget already past it counts as done there)."""
    active = [s for s in searches if not _finished(s)]
    g = min((s.strategy.generation for s in active), default=max((r.slot[1] for r in snap.complete.values()), default=0))
    done = sum(gen == g for _, gen, _ in snap.complete)
    total = done + sum(len(s.proposal) - sum((s.label, g, i) in snap.complete for i in range(len(s.proposal)))
                       for s in active if s.strategy.generation == g)
    records = list(snap.complete.values())
    best = {label: r.loss for label, r in best_per_budget(searches, records).items() if r is not None}
    return Progress(g, done, total, best, sum(not r.cached for r in records), waiting)
