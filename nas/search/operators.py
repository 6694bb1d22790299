"""Genetic operators on subnets and the bounded redraw loop every strategy uses.

All randomness comes from the ``rng`` passed in.  ``mutate`` redraws each gene with
probability ``prob`` (layers a deeper child gains are drawn fresh); ``crossover`` takes
each gene from one of the two parents (a layer only one parent has comes from that one).
The genes are the space's (its task's space type says what they are): these two ask it.
``draw`` asks a proposer for candidates until it has ``n`` feasible, unseen subnets or has
spent ``max_tries`` rounds, and says how many it found and why the others were dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from search_spaces import Space, Subnet

Feasible = Callable[[Sequence[Subnet]], np.ndarray]  # subnets -> bool mask


def mutate(space: Space, parent: Subnet, rng: np.random.Generator, prob: float) -> Subnet:
    """Redraw every gene with probability ``prob`` (the space's own genes: :meth:`search_spaces.Space.mutate`)."""
    return space.mutate(parent, rng, prob)


def crossover(space: Space, a: Subnet, b: Subnet, rng: np.random.Generator) -> Subnet:
    """Each gene from ``a`` or ``b`` with equal chance (:meth:`search_spaces.Space.crossover`)."""
    return space.crossover(a, b, rng)


@dataclass
class DrawStats:
    wanted: int = 0
    found: int = 0
    proposed: int = 0
    infeasible: int = 0
    repeated: int = 0

    def explain(self, what: str, max_tries: int) -> str:
        return (
            f"{what}: found {self.found} of {self.wanted} in {max_tries} redraw rounds "
            f"({self.proposed} proposed: {self.infeasible} broke a constraint, {self.repeated} repeated a subnet already "
            "evaluated or tried)"
        )


def draw(
    propose: Callable[[], Subnet], n: int, feasible: Feasible, seen: set[Subnet], max_tries: int
) -> tuple[list[Subnet], DrawStats]:
    """Up to ``n`` feasible subnets not in ``seen`` (nor repeated), proposing at most ``max_tries`` rounds.

    Each round proposes one candidate per missing subnet and checks them in one batch, so the
    constraint functions (a latency predictor) are called with batches, and the loop always ends.
    """
    chosen: list[Subnet] = []
    taken = set(seen)
    stats = DrawStats(wanted=n)
    for _ in range(max_tries):
        need = n - len(chosen)
        if need <= 0:
            break
        fresh = []
        for cand in (propose() for _ in range(need)):
            stats.proposed += 1
            if cand in taken:
                stats.repeated += 1
            else:
                taken.add(cand)
                fresh.append(cand)
        if not fresh:
            continue
        for cand, ok in zip(fresh, feasible(fresh)):
            if ok:
                chosen.append(cand)
            else:
                stats.infeasible += 1
    stats.found = len(chosen)
    return chosen, stats
