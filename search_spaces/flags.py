"""A flag declared by its owner: a task (:attr:`tasks.base.Task.flags`) or a device (the ``flags`` of its class) says
which extra flags it adds to which commands, and the CLI builds them (and lists them in its vocabulary, docs/cli.md)
from these declarations: adding a task or a device edits no table of the CLI."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Flag:
    """An extra flag: ``--name`` -> ``dest`` (None: not given)."""

    name: str
    dest: str
    type: type = str
    metavar: str = "X"
    help: str = ""  # the one thing it means (the vocabulary's line, and the flag's --help)
    commands: tuple[str, ...] = field(default=())  # the commands that take it
    elsewhere: str = ""  # a task's flag given for another task's space: what to say (default: the task it is for)
    check: Any = None  # check(value, flag): refuses a bad value in one line, before any work (nas.commands.checks)
    option: str | None = None  # a device's flag: the keyword of the device's constructor it sets
