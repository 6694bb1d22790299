"""The regressor interface every predictor model implements, on plain feature matrices.

A regressor maps a feature matrix ``X`` (n, d) to milliseconds (n,).  It saves itself as a
small JSON-able dict plus named numpy arrays, and loads from them without running code.  One whose class says
``reads_names = True`` is built with its view's column names (``models.new_model``); the others take no arguments.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from search_spaces.registry import Registry


class Regressor(Protocol):
    kind: str  # "mlp", "gbt", "additive", "layered": the name saved in the predictor file

    def fit(self, x: np.ndarray, y: np.ndarray, seed: int) -> "Regressor":
        """Fit on features ``x`` (n, d) and measured milliseconds ``y`` (n,); return self."""
        ...

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Milliseconds (n,) for features ``x`` (n, d)."""
        ...

    def state(self) -> tuple[dict, dict[str, np.ndarray]]:
        """(JSON-able settings, named arrays) that :meth:`from_state` rebuilds the fitted model from."""
        ...


# The predictor models a fit compares, by kind: each registered at its definition (@register_predictor); a package adds
# its own through the nas_transformers.predictors entry point.
PREDICTORS: Registry[type] = Registry("predictor", "nas_transformers.predictors", flag="--models", key="kind")
register_predictor = PREDICTORS.register


def standardise(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Column means and scales (1 where a column is constant)."""
    mean = x.mean(axis=0)
    std = x.std(axis=0)
    return mean, np.where(std > 0, std, 1.0)
