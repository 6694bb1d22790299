"""The search-strategy interface and what the strategies share.

A strategy proposes subnets one *generation* at a time and learns from their results::

    strategy = Evolution(space, config, feasible, rng)
    while not strategy.done:
        subnets = strategy.ask()                          # the next generation (feasible, never seen before)
        strategy.tell(subnets, losses, latencies_ms)      # results for exactly those subnets, in order

Call order: ``ask`` then ``tell`` with the same list, repeatedly.  A strategy owns its
``np.random.Generator`` and uses nothing else that is random, so the same seed and the same
results give the same proposals: that is what lets the driver rebuild a strategy from the
trials in storage (resume, several workers) by replaying ``ask``/``tell``.

``ask`` returns an empty list when no new feasible subnet can be found within the bounded
redraws (``config.max_tries``); ``done`` is then true and ``notes`` says why.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Protocol, Sequence

import numpy as np

from search_spaces import Space, Subnet, UserError
from search_spaces.registry import Registry

from .operators import Feasible, draw, mutate


@dataclass(frozen=True)
class SearchConfig:
    """Sizes of the search (HAT's defaults): generation 0 is ``population`` random subnets, every later
    generation ``mutations + crossovers`` children of ``parents`` parents; ``generations`` in all."""

    population: int = 125
    parents: int = 25
    mutations: int = 50
    crossovers: int = 50
    generations: int = 30
    mutate_prob: float = 0.3
    selection: str = "top"  # top: the best `parents` of the population; tournament: each parent wins a tournament
    tournament_size: int = 10
    aging: bool = False  # regularized evolution: the population is a queue, the oldest leave
    max_tries: int = 100  # redraw rounds for a generation's subnets that break a constraint or repeat

    def __post_init__(self) -> None:
        problems = []
        for name in ("population", "parents", "generations", "tournament_size", "max_tries"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                problems.append(f"--{name.replace('_', '-')}: {getattr(self, name)!r} is not a positive integer")
        for name in ("mutations", "crossovers"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                problems.append(f"--{name}: {getattr(self, name)!r} is not a count >= 0")
        if not problems and self.mutations + self.crossovers < 1:
            problems.append("--mutations/--crossovers: both are 0; a generation needs at least one child")
        if not problems and self.parents > self.population:
            problems.append(f"--parents: {self.parents} is more than --population {self.population}")
        if not 0.0 <= self.mutate_prob <= 1.0:
            problems.append(f"--mutate-prob: {self.mutate_prob!r} is not a probability in [0, 1]")
        if self.selection not in ("top", "tournament"):
            problems.append(f"--selection: {self.selection!r} is not one of top, tournament")
        if problems:
            raise UserError("\n".join(problems))

    @property
    def children(self) -> int:
        return self.mutations + self.crossovers

    def generation_size(self, generation: int) -> int:
        return self.population if generation == 0 else self.children

    @property
    def evaluations(self) -> int:
        """Subnets a full search evaluates (fewer when a generation cannot be filled)."""
        return self.population + (self.generations - 1) * self.children

    def to_dict(self) -> dict:
        return asdict(self)


# The search strategies by name (--strategy): each registered at its definition (@register_strategy); a package adds its
# own through the nas_transformers.strategies entry point.
STRATEGIES: Registry[type] = Registry("search strategy", "nas_transformers.strategies", "nas.search", flag="--strategy")
register_strategy = STRATEGIES.register


class Strategy(Protocol):
    name: str
    generation: int  # the generation the next ``ask`` returns
    notes: list[str]  # why a generation came out short or the search stopped early

    @property
    def done(self) -> bool: ...

    def ask(self) -> list[Subnet]: ...

    def tell(self, subnets: Sequence[Subnet], losses: Sequence[float], latencies: Sequence[float]) -> None: ...


@dataclass
class Evaluated:
    subnet: Subnet
    loss: float
    latency: float


@dataclass
class GenerationalStrategy:
    """What every strategy here shares: the generation counter, the subnets seen, the history,
    the initial population (random feasible subnets, topped up by mutating ``seeds``), notes."""

    space: Space
    config: SearchConfig
    feasible: Feasible
    rng: np.random.Generator
    seeds: Sequence[Subnet] = ()  # known-feasible subnets (the lightest ones) for tight budgets
    first: Sequence[Subnet] = ()  # subnets that open generation 0 (each type's largest feasible uniform model)
    name: str = "strategy"
    generation: int = 0
    notes: list[str] = field(default_factory=list)
    history: list[Evaluated] = field(default_factory=list)
    seen: set = field(default_factory=set)
    _asked: list[Subnet] | None = None
    _stopped: bool = False

    @property
    def done(self) -> bool:
        return self._stopped or self.generation >= self.config.generations

    def ask(self) -> list[Subnet]:
        assert self._asked is None, "ask() twice without tell()"
        if self.done:
            return []
        subnets = self._initial() if self.generation == 0 else self._children()
        if not subnets:
            self._stopped = True
            self.notes.append(f"generation {self.generation}: no new feasible subnet found; the search stops here")
        self._asked = subnets
        return subnets

    def tell(self, subnets: Sequence[Subnet], losses: Sequence[float], latencies: Sequence[float]) -> None:
        assert self._asked is not None and list(subnets) == self._asked, "tell() must answer the last ask()"
        assert len(losses) == len(subnets) == len(latencies)
        batch = [Evaluated(s, _finite(loss), float(t)) for s, loss, t in zip(subnets, losses, latencies)]
        self.history += batch
        self._update(batch)
        self._asked = None
        self.generation += 1

    # -- shared pieces ----------------------------------------------------------------

    def _draw(self, propose, n: int, what: str, note: bool = True) -> list[Subnet]:
        found, stats = draw(propose, n, self.feasible, self.seen, self.config.max_tries)
        if len(found) < n and note:
            self.notes.append(stats.explain(f"generation {self.generation}: {what}", self.config.max_tries))
        self.seen.update(found)
        return found

    def _initial(self) -> list[Subnet]:
        n = self.config.population
        opening = [s for s in dict.fromkeys(self.first) if s not in self.seen][:n]
        opening = [s for s, good in zip(opening, self.feasible(opening)) if good] if opening else []
        self.seen.update(opening)
        found = opening + self._draw(lambda: self.space.sample(self.rng), n - len(opening), "random subnets")
        if len(found) < n:  # tight constraints: take the known-feasible seeds, then grow around them
            seeds = [s for s in dict.fromkeys(self.seeds) if s not in self.seen][: n - len(found)]
            self.seen.update(seeds)
            found += seeds
        pool = list(found)
        if len(found) < n and pool:
            extra = self._draw(
                lambda: mutate(self.space, pool[int(self.rng.integers(len(pool)))], self.rng, self.config.mutate_prob),
                n - len(found),
                "mutants of the feasible subnets found",
            )
            found += extra
        return found

    def _children(self) -> list[Subnet]:
        raise NotImplementedError

    def _update(self, batch: list[Evaluated]) -> None:
        raise NotImplementedError


def _finite(loss: float) -> float:
    loss = float(loss)
    return loss if np.isfinite(loss) else float("inf")
