"""Random search: every generation is uniformly drawn feasible subnets never evaluated before.

Generation sizes match evolution's (``population``, then ``mutations + crossovers``), so the
two are compared at an equal number of evaluations.
"""

from __future__ import annotations

from dataclasses import dataclass

from .strategy import Evaluated, GenerationalStrategy, register_strategy


@dataclass
@register_strategy
class RandomSearch(GenerationalStrategy):
    name: str = "random"

    def _children(self) -> list:
        return self._draw(lambda: self.space.sample(self.rng), self.config.children, "random subnets")

    def _update(self, batch: list[Evaluated]) -> None:
        pass  # nothing to learn
