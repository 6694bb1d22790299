"""Tournament-selection evolution (the Evolved Transformer, HAT), with an aging variant.

Generation 0 is ``population`` random feasible subnets.  Every later generation:
choose ``parents`` from the population (``top``: the best by validation loss, as in HAT;
``tournament``: each parent is the best of ``tournament_size`` members drawn at random),
make ``mutations`` children by mutating a random parent (each gene redrawn with
``mutate_prob``) and ``crossovers`` children by crossing two random parents; children that
break a constraint or repeat a subnet already seen are redrawn, a bounded number of times.
When converged parents cannot cross into enough new subnets, mutations make up the rest.
The next population is parents + children (HAT), or with ``aging`` (regularized evolution,
Real et al. 2019) the population is a queue: children join, the oldest members leave.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .operators import crossover, mutate
from .strategy import Evaluated, GenerationalStrategy, register_strategy


@dataclass
@register_strategy
class Evolution(GenerationalStrategy):
    name: str = "evolution"
    population: list[Evaluated] | None = None
    _parents: list[Evaluated] | None = None

    def select_parents(self) -> list[Evaluated]:
        pop, k = self.population, min(self.config.parents, len(self.population))
        losses = np.array([e.loss for e in pop])
        if self.config.selection == "top":
            return [pop[i] for i in np.argsort(losses, kind="stable")[:k]]
        winners: list[int] = []
        size = min(self.config.tournament_size, len(pop))
        for _ in range(10 * k):  # each round one tournament; bounded even when winners repeat
            if len(winners) == k:
                break
            entrants = self.rng.choice(len(pop), size=size, replace=False)
            best = int(entrants[np.argmin(losses[entrants])])  # first of equals
            if best not in winners:
                winners.append(best)
        return [pop[i] for i in winners]

    def _children(self) -> list:
        self._parents = self.select_parents()
        parents = [e.subnet for e in self._parents]
        cfg, rng, space = self.config, self.rng, self.space

        def one_parent():
            return parents[int(rng.integers(len(parents)))]

        def two_parents():  # distinct when there are two: crossing a parent with itself only copies it
            i, j = rng.choice(len(parents), size=2, replace=len(parents) < 2)
            return parents[int(i)], parents[int(j)]

        mutants = self._draw(lambda: mutate(space, one_parent(), rng, cfg.mutate_prob), cfg.mutations, "mutations")
        crosses = self._draw(
            lambda: crossover(space, *two_parents(), rng), cfg.crossovers, "crossovers", note=len(mutants) < cfg.mutations
        )
        short = cfg.children - len(mutants) - len(crosses)
        if short > 0 and len(mutants) == cfg.mutations:  # converged parents cross into subnets already seen: mutate instead
            mutants += self._draw(
                lambda: mutate(space, one_parent(), rng, cfg.mutate_prob), short, "mutations in place of crossovers"
            )
        return mutants + crosses

    def _update(self, batch: list[Evaluated]) -> None:
        if self.population is None:
            self.population = list(batch)
        elif self.config.aging:
            self.population = (self.population + batch)[-self.config.population :]
        else:
            self.population = self._parents + batch
