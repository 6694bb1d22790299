"""Search spaces: the YAML format, :class:`Space`, :class:`Subnet`, validation and feature encoding.

This package imports nothing else of ours; every other layer builds on it.
"""

from .attention import SIGNATURES, AttentionSpec, allowed_forms, parse_attention
from .errors import SpaceError, SubnetError, UserError
from .space import SPACES_DIR, LayerChoice, Space, Subnet, Workload, describe, load_space, parse_space

__all__ = [
    "SIGNATURES",
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
]
