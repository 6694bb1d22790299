"""The predictor models a fit compares, by kind, and the features they read of subnets (the space's task says them).

Its own module so that the predictor file (:mod:`.predictor`), the selection (:mod:`.select`) and the few-shot
transfer (:mod:`.transfer`) share it without importing each other in a circle.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from search_spaces import Space, Subnet, Workload, tasks

from . import mlp, gbt, additive, layered  # noqa: F401, I001  (importing registers the built-in models, in this order)
from .base import PREDICTORS

MODELS: dict[str, type] = PREDICTORS.all()  # kind -> model class: the registry's own mapping (plugins included)


def new_model(kind: str, names: Sequence[str] | None = None):
    """An unfitted model of ``kind``; one that reads its view's column names (``reads_names``: the layered model's
    type groups) is given ``names``."""
    cls = MODELS[kind]
    return cls(list(names) if names is not None else None) if getattr(cls, "reads_names", False) else cls()


def subnet_matrix(kind: str, space: Space, workload: Workload, subnets: Sequence[Subnet]) -> tuple[np.ndarray, list[str]]:
    """The features model ``kind`` reads of ``subnets``: the space's task says them (a one-stack model's:
    :func:`latency.features.stack_matrix`)."""
    return tasks.of(space).predictor_features(kind, space, workload, subnets)
