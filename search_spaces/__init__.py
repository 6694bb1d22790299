"""Search spaces: the YAML format, :class:`Space`, :class:`Subnet`, validation and feature encoding.

This package imports nothing else of ours; every other layer builds on it.
"""

from . import tasks
from .attention import AttentionSpec, allowed_forms, parse_attention, types
from .errors import SpaceError, SubnetError, UserError
from .space import SPACES_DIR, LayerChoice, Space, Subnet, Workload, describe, load_space, parse_space

__all__ = [
    "SPACES_DIR",
    "AttentionSpec",
    "LayerChoice",
    "Space",
    "SpaceError",
    "Subnet",
    "SubnetError",
    "UserError",
    "Workload",
    "allowed_forms",
    "describe",
    "load_space",
    "parse_attention",
    "parse_space",
    "tasks",
    "types",
]
