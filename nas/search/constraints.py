"""Constraints a returned subnet must meet (latency budget, parameter count) and the infeasibility check.

A constraint is a small value with a ``limit`` and ``values(subnets) -> np.ndarray``;
:class:`Constraints` holds the ones that apply at once and answers ``feasible(subnets)``.
The latency comes from a predictor (anything with ``predict(subnets) -> ms``), wrapped in
:class:`~nas.search.cache.BatchCache` so a subnet is predicted once.  :class:`AnalyticLatency` is a FLOPs
proxy for tests and benchmarks without a fitted predictor: it is not a measurement.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Protocol, Sequence

import numpy as np

from latency.features import flops
from search_spaces import Space, Subnet, UserError, tasks

from .budget import format_ms

LatencyFn = Callable[[Sequence[Subnet]], np.ndarray]  # subnets -> predicted ms, shape (N,)


class Constraint(Protocol):
    flag: str  # the CLI flag it comes from, for messages
    limit: float

    def values(self, subnets: Sequence[Subnet]) -> np.ndarray: ...

    def format(self, value: float) -> str: ...


@dataclass(frozen=True)
class LatencyBudget:
    limit: float  # ms
    latency: LatencyFn
    source: str = "predictor"
    flag: str = "--budget"
    workload: str = ""  # the workload its latency is of ("" when the search has one, unnamed)
    stated: float | None = None  # the user's budget when ``limit`` keeps a safety margin below it (--margin)

    def values(self, subnets: Sequence[Subnet]) -> np.ndarray:
        return self.latency(subnets)

    def format(self, value: float) -> str:
        return f"{value:.4g} ms"

    @property
    def entry(self) -> str:
        """How the user wrote it: ``50ms`` or ``decode:5ms``."""
        return f"{self.workload}:{format_ms(self.limit)}" if self.workload else format_ms(self.limit)

    def __str__(self) -> str:
        margin = f", a margin below the budget {format_ms(self.stated)}" if self.stated else ""
        return f"{self.workload + ' ' if self.workload else ''}latency <= {format_ms(self.limit)} ({self.source}{margin})"


@dataclass(frozen=True)
class ParamLimit:
    limit: int
    count: Callable[[Subnet], int]
    flag: str = "--max-params"

    def values(self, subnets: Sequence[Subnet]) -> np.ndarray:
        return np.array([self.count(s) for s in subnets], dtype=np.float64)

    def format(self, value: float) -> str:
        return f"{int(value):,} parameters"

    def __str__(self) -> str:
        return f"params <= {self.limit:,}"


@dataclass(frozen=True)
class Constraints:
    """The constraints that apply at once (possibly none)."""

    items: tuple = ()

    def feasible(self, subnets: Sequence[Subnet]) -> np.ndarray:
        ok = np.ones(len(subnets), dtype=bool)
        for c in self.items:
            if len(subnets):
                ok &= c.values(subnets) <= c.limit
        return ok

    def slack(self, subnets: Sequence[Subnet]) -> np.ndarray:
        """Each constraint's value less its limit, per subnet, shape (N, C): <= 0 where it holds (what Optuna stores as a
        trial's constraint values)."""
        out = np.zeros((len(subnets), len(self.items)), dtype=np.float64)
        for j, c in enumerate(self.items):
            if len(subnets):
                out[:, j] = np.asarray(c.values(subnets), dtype=np.float64) - c.limit
        return out

    def violations(self, subnet: Subnet) -> list[str]:
        out = []
        for c in self.items:
            v = float(c.values([subnet])[0])
            if v > c.limit:
                out.append(f"{c.format(v)} > {c.flag} {c.entry if isinstance(c, LatencyBudget) else c.format(c.limit)}")
        return out

    def __str__(self) -> str:
        return " and ".join(map(str, self.items)) or "unconstrained"


def param_counter(space: Space) -> Callable[[Subnet], int]:
    """Exact parameter count of a subnet (as an extracted model), from a shape-only supernet (the task's)."""
    task = tasks.of(space)
    return lru_cache(maxsize=None)(lambda subnet: task.params(space, subnet))


# --------------------------------------------------------------------------- feasibility


def lightest_subnets(space: Space) -> list[Subnet]:
    """The lightest subnets of the space (:meth:`search_spaces.Space.lightest`: the smallest choice of every dimension,
    once with each attention type on every layer)."""
    return space.lightest()


def feasible_seeds(space: Space, constraints: Constraints, rng: np.random.Generator, n_sample: int = 512) -> list[Subnet]:
    """Feasible subnets among the lightest ones and ``n_sample`` random draws (lightest first).

    Raises :class:`UserError` when none is feasible, stating for each constraint the smallest value
    reached (the lightest subnets plus a bounded random sample), so the user sees what to ask for.
    """
    candidates = list(dict.fromkeys(lightest_subnets(space) + [space.sample(rng) for _ in range(n_sample)]))
    ok = constraints.feasible(candidates)
    if ok.any():
        return [s for s, good in zip(candidates, ok) if good]
    lines = []
    for c in constraints.items:
        values = c.values(candidates)
        best = int(np.argmin(values))
        if values[best] > c.limit:
            what = f"{c.flag} {c.entry if isinstance(c, LatencyBudget) else c.format(c.limit)} is infeasible"
            if isinstance(c, LatencyBudget):
                lines.append(
                    f"{what} on {c.source}: the smallest {c.workload + ' ' if c.workload else ''}latency space {space.name!r} "
                    f"reaches is {format_ms(float(values[best]))} "
                    f"({candidates[best]}); give a budget of at least that"
                )
            else:
                lines.append(
                    f"{what}: the smallest subnet of space {space.name!r} has {c.format(values[best])} ({candidates[best]})"
                )
    if not lines:
        lines.append(
            f"no subnet of space {space.name!r} meets {constraints} together "
            f"(checked the lightest subnets and {n_sample} random ones)"
        )
    raise UserError("\n".join(lines))


# --------------------------------------------------------------------------- analytic proxy


class AnalyticLatency:
    """A FLOPs-based latency proxy (ms) at one of the space's workloads (default its first); for tests and benchmarks only.

    ``ms = flops / (gflops * 1e6) + overhead_ms * (ops)``, FLOPs as the latency features count them
    (:func:`latency.features.flops`: projections, MLP, tied head and each attention type's own mixing).
    """

    def __init__(self, space: Space, gflops: float = 20.0, overhead_ms: float = 0.02, workload: str | None = None):
        self.space, self.gflops, self.overhead_ms = space, gflops, overhead_ms
        self.workload_spec = space.workload(workload)
        self.workload = self.workload_spec.name
        self.space_hash = space.hash
        self.name = f"analytic FLOPs proxy at {gflops:g} GFLOP/s (not a measurement)"

    def flops(self, subnet: Subnet) -> float:
        return flops(self.space, subnet, self.workload_spec)

    def predict(self, subnets: Sequence[Subnet]) -> np.ndarray:
        return np.array(
            [self.flops(s) / (self.gflops * 1e6) + self.overhead_ms * (3 * s.depth + 2) for s in subnets], dtype=np.float64
        )
