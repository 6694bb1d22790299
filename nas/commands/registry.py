"""The one registry of commands (:class:`search_spaces.registry.Registry`): each command module registers itself at
the end of its definition (``register_command(__name__)``)."""

from __future__ import annotations

import sys
from types import ModuleType

from search_spaces.registry import Registry

COMMANDS: Registry[ModuleType] = Registry("command", "nas_transformers.commands", "nas.commands", flag="COMMAND",
                                          key="NAME")


def register_command(module: str | ModuleType) -> ModuleType:
    """Register a command module (by its ``NAME``); ``register_command(__name__)`` at the end of the module."""
    return COMMANDS.register(sys.modules[module] if isinstance(module, str) else module)
