"""One module per ``nas`` subcommand, each registered at its definition (``register_command(__name__)`` at the end of
the module; see :mod:`nas.cli` for the contract: ``NAME``, ``HELP``, ``EXAMPLE``, ``add_arguments``, ``run``).

:data:`COMMANDS` is the one registry of commands (:class:`search_spaces.registry.Registry`): the generic ones,
imported here in the order ``nas --help`` lists them; a task's own (:attr:`tasks.base.Task.commands`), registered by
:func:`nas.cli.command_modules` when it loads the tasks; a package's, through the ``nas_transformers.commands`` entry
point.
"""

from __future__ import annotations

import sys
from types import ModuleType

from search_spaces.registry import Registry

COMMANDS: Registry[ModuleType] = Registry("command", "nas_transformers.commands", "nas.commands", flag="COMMAND",
                                          key="NAME")


def register_command(module: str | ModuleType) -> ModuleType:
    """Register a command module (by its ``NAME``); ``register_command(__name__)`` at the end of the module."""
    return COMMANDS.register(sys.modules[module] if isinstance(module, str) else module)


from . import (  # noqa: E402, F401, I001  (importing registers them, in the order --help lists them)
    demo,
    space,
    train_supernet,
    measure_latency,
    fit_predictor,
    predict,
    search,
    fit_accuracy,
    export,
    train_subnet,
    finetune,
    classify,
    generate,
    report,
    doctor,
    completion,
)
