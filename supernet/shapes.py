"""A space's supernet on the meta device: shapes only, no memory and no initialisation cost; it counts any subnet's
parameters exactly as the extracted model has them (``num_params``: the one count, every task's supernet gives it)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import torch

from search_spaces import tasks


@lru_cache(maxsize=16)
def shape_supernet(space: Any):
    """The space's task's supernet, built on the meta device (cached per space)."""
    with torch.device("meta"):
        return tasks.of(space).supernet(space)


def params(space: Any, subnet: Any) -> int:
    """Parameters of the static model of ``subnet``."""
    return shape_supernet(space).num_params(subnet)
