"""NSGA-II (Deb et al. 2002) on two objectives: validation loss and predicted latency.

Generation 0 is ``population`` random feasible subnets.  Every later generation makes
``mutations + crossovers`` children: two parents by binary tournament on (front rank,
crowding distance), crossed over, then mutated; infeasible or repeated children are redrawn.
The next population is the best ``population`` of parents + children by non-dominated
sorting, the last front cut by crowding distance.  Constraints stay hard constraints.

Why not Optuna's ``NSGAIISampler`` (its constraints handle a budget too): on the same seeded problem
(``tests/nas/search/test_search_strategies.py``: the synthetic landscape, 200 evaluations, 5 seeds x 2 budgets) it spends
8-30% of the evaluations on subnets over the budget (constrained domination is soft) and 21-63% on subnets it
evaluated already (the genes of layers past ``depth`` are parameters it crosses and mutates), and its feasible
front has the smaller hypervolume in 9 of 10 runs; here an infeasible or repeated child costs a predictor call,
not an evaluation.  And a sampler draws from the study's trials as they arrive, so two workers or a resumed one
would not propose the same generation, which the driver's replay of ``ask``/``tell`` needs.  The study still
holds latency as a second objective (:mod:`.storage`), so Optuna's tools see the front.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .operators import crossover, mutate
from .pareto import crowding_distance, non_dominated_sort
from .strategy import Evaluated, GenerationalStrategy, register_strategy


def rank_and_crowding(points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Front index (0 = non-dominated) and crowding distance within its front, per point (N, 2)."""
    rank = np.zeros(len(points), dtype=np.int64)
    crowd = np.zeros(len(points), dtype=np.float64)
    for r, front in enumerate(non_dominated_sort(points)):
        rank[front] = r
        crowd[front] = crowding_distance(points[front])
    return rank, crowd


def environmental_selection(points: np.ndarray, n: int) -> list[int]:
    """Indices of the ``n`` survivors: whole fronts in order, the last one by crowding distance."""
    survivors: list[int] = []
    for front in non_dominated_sort(points):
        if len(survivors) + len(front) <= n:
            survivors += list(front)
            continue
        crowd = crowding_distance(points[front])
        order = np.argsort(-crowd, kind="stable")
        survivors += [int(front[i]) for i in order[: n - len(survivors)]]
        break
    return survivors


@dataclass
@register_strategy
class NSGA2(GenerationalStrategy):
    name: str = "nsga2"
    population: list[Evaluated] | None = None

    def _points(self) -> np.ndarray:
        return np.array([[e.loss, e.latency] for e in self.population], dtype=np.float64)  # (N, 2)

    def _children(self) -> list:
        rank, crowd = rank_and_crowding(self._points())
        pop, cfg, rng, space = self.population, self.config, self.rng, self.space

        def tournament():
            i, j = (int(x) for x in rng.integers(len(pop), size=2))
            better = i if (rank[i], -crowd[i]) <= (rank[j], -crowd[j]) else j
            return pop[better].subnet

        def child():
            return mutate(space, crossover(space, tournament(), tournament(), rng), rng, cfg.mutate_prob)

        return self._draw(child, cfg.children, "offspring")

    def _update(self, batch: list[Evaluated]) -> None:
        merged = (self.population or []) + batch
        self.population = merged
        keep = environmental_selection(self._points(), self.config.population)
        self.population = [merged[i] for i in sorted(keep)]
