"""The predictor models a fit compares, by kind, and the features they read of subnets (the space's task says them).

Its own module so that the predictor file (:mod:`.predictor`), the selection (:mod:`.select`) and the few-shot
transfer (:mod:`.transfer`) share it without importing each other in a circle.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from search_spaces import Space, Subnet, Workload, tasks

from .additive import Additive
from .gbt import GBT
from .mlp import MLP

MODELS: dict[str, type] = {"mlp": MLP, "gbt": GBT, "additive": Additive}


def subnet_matrix(kind: str, space: Space, workload: Workload, subnets: Sequence[Subnet]) -> tuple[np.ndarray, list[str]]:
    """The features model ``kind`` reads of ``subnets``: the space's task says them (a one-stack model's:
    :func:`latency.features.stack_matrix`)."""
    return tasks.of(space).predictor_features(kind, space, workload, subnets)
