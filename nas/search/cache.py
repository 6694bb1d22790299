"""Per-subnet caching of a batched function (fitness, latency): each distinct subnet is computed once."""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from search_spaces import Subnet


class BatchCache:
    """``fn(subnets) -> np.ndarray`` with a per-subnet cache; the misses of a call go to ``fn`` in one batch."""

    def __init__(self, fn: Callable[[Sequence[Subnet]], np.ndarray], name: str = ""):
        self.fn, self.name = fn, name
        self.cache: dict[Subnet, float] = {}
        self.evaluations = 0  # distinct subnets computed

    def __call__(self, subnets: Sequence[Subnet]) -> np.ndarray:
        missing = list(dict.fromkeys(s for s in subnets if s not in self.cache))
        if missing:
            values = np.asarray(self.fn(missing), dtype=np.float64).reshape(-1)
            assert values.shape == (len(missing),), (values.shape, len(missing))
            self.cache.update(zip(missing, values.tolist()))
            self.evaluations += len(missing)
        return np.array([self.cache[s] for s in subnets], dtype=np.float64)


CachedFitness = BatchCache  # subnets -> validation losses
CachedLatency = BatchCache  # subnets -> predicted ms
