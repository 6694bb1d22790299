"""Fit every model, keep the best by cross-validation, report on a held-out split.

One driver: split (held-out = the re-measured subnets when the table has them, else a seeded
20%), k-fold cross-validation of each model on the rest (by MAPE), refit the best on the rest
and report it on the held-out split, then refit it on everything for the saved predictor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..report import agreement
from .models import new_model


@dataclass
class Selection:
    best: str
    cv: dict[str, dict[str, float]]  # model -> cross-validated agreement on the training split
    test: dict[str, float]  # the best model (fitted on the training split) on the held-out split
    test_pred: np.ndarray
    final: object  # the best model refitted on all rows


def holdout(n: int, fraction: float, seed: int, forced: np.ndarray | None = None) -> np.ndarray:
    """Boolean mask of held-out rows: ``forced`` when given, else a seeded ``fraction``."""
    if forced is not None and forced.any():
        return forced
    mask = np.zeros(n, dtype=bool)
    mask[np.random.default_rng([seed, 2]).choice(n, size=max(1, round(fraction * n)), replace=False)] = True
    return mask


def cross_validate(kind: str, x: np.ndarray, y: np.ndarray, folds: int, seed: int,
                   names: list[str] | None = None) -> dict[str, float]:
    """``folds``-fold agreement of model ``kind`` (given its view's column ``names``) on (x, y)."""
    order = np.random.default_rng([seed, 3]).permutation(len(y))
    pred = np.empty_like(y)
    for f in range(folds):
        test = order[f::folds]
        train = np.setdiff1d(order, test)
        pred[test] = new_model(kind, names).fit(x[train], y[train], seed).predict(x[test])
    return agreement(pred, y)


def select(
    views: dict[str, np.ndarray],
    y: np.ndarray,
    test_mask: np.ndarray,
    *,
    folds: int = 5,
    seed: int = 0,
    on_model: Callable[[str, dict], None] | None = None,
    names: dict[str, list[str]] | None = None,
) -> Selection:
    """``views[kind]`` is the feature matrix model ``kind`` reads (``names[kind]``: its columns, for a model that reads
    them); every row's measured ms is ``y``."""
    train = ~test_mask
    names = names or {}
    cv = {}
    for kind, x in views.items():
        cv[kind] = cross_validate(kind, x[train], y[train], folds, seed, names.get(kind))
        if on_model is not None:
            on_model(kind, cv[kind])
    best = min(cv, key=lambda k: cv[k]["mape"])
    x = views[best]
    model = new_model(best, names.get(best)).fit(x[train], y[train], seed)
    pred = model.predict(x[test_mask])
    final = new_model(best, names.get(best)).fit(x, y, seed)
    return Selection(best, cv, agreement(pred, y[test_mask]), pred, final)
