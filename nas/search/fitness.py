"""The search's fitness: a subnet's held-out loss with weights inherited from the supernet, as the space's task scores
it (:func:`task_fitness`; the scoring objects themselves, :class:`~supernet.scoring.InheritedLoss` and
:class:`~supernet.scoring.HeldOutFitness`, sit below the tasks in :mod:`supernet.scoring`), and whether the top of a
ranking is more than noise (:func:`separability`).  :class:`~nas.search.cache.BatchCache` (``CachedFitness``)
evaluates each distinct subnet once.  A fitness function is anything ``subnets -> np.ndarray of losses``; the
strategies and the driver take it as an argument.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from search_spaces import Subnet, tasks
from supernet.scoring import (  # noqa: F401  (the search's public names)
    FitnessFn,
    FitnessSettings,
    HeldOutFitness,
    InheritedLoss,
    inherited_fitness,
    pick_device,
    validation_tokens,
)


def separability(fitness: InheritedLoss, subnets: Sequence[Subnet]) -> dict[str, Any]:
    """Can the fitness tell these candidates (best first) apart?  Scores each on every window again and
    returns the standard error of one candidate's estimate (windows as the unit), the spread of their
    means, and for each the paired difference from the first with its standard error (the same windows
    score every candidate, so differences are estimated window by window)."""
    bs, held, model = fitness.batch_size, getattr(fitness, "held", None), getattr(fitness, "model", None)

    def windows(s: Subnet):
        """The held-out windows ``s`` reads: its vocabulary's where the space searches it (issue 54)."""
        return held(model, s) if held is not None else fitness.heldout

    per = np.stack([windows(s).window_bits(fitness.scorer(s), s, bs, mixed_precision=False) for s in subnets])
    w = per.shape[1]
    means = per.mean(1)
    se = per.std(1, ddof=1) / np.sqrt(w) if w > 1 else np.full(len(subnets), np.nan)
    diffs = per[1:] - per[:1]
    paired = diffs.std(1, ddof=1) / np.sqrt(w) if w > 1 else np.full(len(diffs), np.nan)
    return {
        "windows": int(w),
        "tokens": int(fitness.heldout.tokens),
        "means": means.tolist(),
        "se": float(np.median(se)),
        "spread": float(means.max() - means.min()) if len(means) else 0.0,
        "vs_first": [{"diff": float(d.mean()), "se": float(p)} for d, p in zip(diffs, paired)],
    }


def separability_text(label: str, sep: dict[str, Any]) -> str:
    """One paragraph for the terminal: is the top of this budget's ranking more than noise?"""
    if not sep["vs_first"]:
        return f"{label}: one candidate; nothing to separate"
    second = sep["vs_first"][0]
    z = second["diff"] / second["se"] if second["se"] > 0 else float("inf")
    verdict = (
        "the best is ahead of the second by more than 2 paired standard errors"
        if z > 2
        else "the best and the second are within 2 paired standard errors: more --val-windows would tell them apart"
    )
    return (
        f"{label}: fitness on {sep['windows']} windows ({sep['tokens']:,} tokens): "
        f"a candidate's estimate +-{sep['se']:.4f} bits (SE); top {len(sep['means'])} spread {sep['spread']:.4f}; "
        f"#2 - #1 = {second['diff']:+.4f} +- {second['se']:.4f} (paired SE): {verdict}"
    )


def task_fitness(model, payload: dict[str, Any], settings: FitnessSettings) -> tuple[Any, str]:
    """(fitness, digest of its held-out data) of a supernet (``model``, loaded as ``payload``): the space's task scores
    (a one-stack LM's :func:`inherited_fitness`)."""
    return tasks.of(model.space).fitness(model, payload, settings)
