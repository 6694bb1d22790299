"""One module per ``nas`` subcommand, each registered at its definition (``register_command(__name__)`` at the end of
the module, :mod:`.registry`; see :mod:`nas.cli` for the contract: ``NAME``, ``HELP``, ``EXAMPLE``, ``add_arguments``, ``run``).

:data:`COMMANDS` is the one registry of commands (:class:`search_spaces.registry.Registry`): the generic ones,
imported here in the order ``nas --help`` lists them; a task's own (:attr:`tasks.base.Task.commands`), registered by
:func:`nas.cli.command_modules` when it loads the tasks; a package's, through the ``nas_transformers.commands`` entry
point.
"""

from __future__ import annotations

from .registry import COMMANDS, register_command  # noqa: F401  (the registry's public names)

from . import (  # noqa: F401, I001  (importing registers them, in the order --help lists them)
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
