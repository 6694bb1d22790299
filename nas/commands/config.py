"""``--config FILE`` and ``--print-config``: a command's flags in a YAML file, and back.

A config file is a YAML mapping read through the project's bounded YAML reader (:mod:`search_spaces.yamlio`: the
safe loader, no aliases, no duplicate keys, at most 64 KB and 64 levels, a FIFO or a folder refused unopened); one
``--config`` per command line.  Its keys are the command's flag names without the dashes, with ``-`` or ``_``
(``population``, ``eval_batch_size``, ``lr-warmup``) or the field a flag stores into (``warmup_steps``); positional
arguments by their name (``supernet``, ``space``).  The file's values become the parser's defaults, so a flag given
on the command line overrides the file (a repeatable flag such as ``--predictor`` replaces the file's list).  A key
the command does not take, or a value of the wrong type, is refused in one line naming the file, the key and what
was expected (exit status 2); values are quoted cut to a few dozen characters.

``--print-config`` prints the effective flags (the file and the command line merged) as YAML, keyed by flag name,
and exits 0 without running; that output given back with ``--config`` parses to the same flags.
"""

from __future__ import annotations

import argparse
import difflib
import math
from pathlib import Path
from typing import Any

from search_spaces.errors import UserError, shown

# Fields that are no part of a run's configuration: how the run talks, not what it does.
NOT_CONFIG = {"help", "config", "print_config", "verbose", "quiet", "json"}


def find_config(argv: list[str]) -> str | None:
    """The ``--config`` value in ``argv`` (``--config F`` or ``--config=F``), before parsing; None if absent.  A second
    ``--config`` is refused (one file per run: which one wins would be a guess)."""
    found: list[str] = []
    for i, arg in enumerate(argv):
        if arg == "--":
            break
        if arg == "--config":
            if i + 1 >= len(argv):
                break  # argparse says what is missing
            found.append(argv[i + 1])
        elif arg.startswith("--config="):
            found.append(arg.split("=", 1)[1])
    if len(found) > 1:
        raise UserError(f"--config given {len(found)} times ({', '.join(shown(f) for f in found[:3])}); give one file "
                        "(merge them into one, or give a flag on the command line to override the file)")
    return found[0] if found else None


MAX_CONFIG_BYTES = 64 * 1024  # a command's flags: under 2 KB (nas search --print-config is about 1.5 KB)


def load(path: str) -> dict:
    """The file's mapping, read through the bounded YAML reader (:mod:`search_spaces.yamlio`: no tags that run code, no
    aliases, no duplicate keys, nesting and size bounded, a FIFO or a folder refused before it is opened)."""
    import os

    from search_spaces.yamlio import load_yaml, read_text

    if not os.path.lexists(path):
        raise UserError(f"--config: {path}: no such file")
    try:
        text = read_text(Path(path), "config file", limit=MAX_CONFIG_BYTES)
    except UserError as e:
        raise UserError(f"--config: {e}") from None
    data = load_yaml(text, path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping of flag names to values, got a {type(data).__name__}")
    return data


def key_of(action: argparse.Action) -> str:
    """The key ``--print-config`` writes for an action: its long flag without dashes (``-`` -> ``_``), or a
    positional's name."""
    longs = [o for o in action.option_strings if o.startswith("--")]
    return longs[0][2:].replace("-", "_") if longs else action.dest


def config_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The parser's actions a config file may set (no help, no old spellings, no output flags)."""
    from .vocabulary import _Alias

    return [a for a in parser._actions  # noqa: SLF001 - argparse has no public list
            if a.dest not in NOT_CONFIG and not isinstance(a, (_Alias, argparse._SubParsersAction))]  # noqa: SLF001


def find_action(parser: argparse.ArgumentParser, key: str) -> argparse.Action | None:
    """The action a config key names: by flag name (an old spelling too), else by field."""
    if not isinstance(key, str) or not key or key[0] in "-_":  # a name, not a flag as typed
        return None
    flag = "--" + key.replace("_", "-")
    action = parser._option_string_actions.get(flag)  # noqa: SLF001
    from .vocabulary import _Alias

    if isinstance(action, _Alias) and action.target.dest == key.replace("-", "_"):
        return action.target  # the field's own name (export's positional supernet), not the old flag of that name
    if action is not None:
        return action
    field = key.replace("-", "_")
    for a in config_actions(parser):
        if a.dest == field:
            return a
    return None


def _kind(action: argparse.Action) -> str:
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):  # noqa: SLF001
        return "bool"
    if isinstance(action, argparse._CountAction):  # noqa: SLF001
        return "count"
    if isinstance(action, argparse._AppendAction) or action.nargs in ("+", "*"):  # noqa: SLF001
        return "list"
    return "scalar"


def _expected(action: argparse.Action) -> str:
    if action.choices:
        return "one of " + ", ".join(map(str, action.choices))
    return {int: "an integer", float: "a number"}.get(action.type, "a text")


def _scalar(action: argparse.Action, value: Any, where: str) -> Any:
    if isinstance(value, bool) or isinstance(value, (dict, list)):
        raise UserError(f"{where}: expected {_expected(action)}, got {shown(value)}")
    kind = action.type
    try:
        if kind is int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            out = int(value) if not isinstance(value, str) else int(value.strip())
        elif kind is float:
            out = float(value)
            if not math.isfinite(out):
                raise ValueError(value)
        elif kind is None or kind is str:
            out = value if isinstance(value, str) else str(value)
        else:  # a parsing function (durations, a task's type): it reads the text a user would type
            out = kind(value if isinstance(value, str) else str(value))
    except (ValueError, TypeError) as e:
        raise UserError(f"{where}: expected {_expected(action)}, got {shown(value)}") from e
    except argparse.ArgumentTypeError as e:
        raise UserError(f"{where}: {e}") from None
    if action.choices is not None and out not in action.choices:
        raise UserError(f"{where}: expected {_expected(action)}, got {shown(value)}")
    return out


def convert(action: argparse.Action, value: Any, where: str) -> Any:
    """A config value as the action would have stored it from the command line; refuses the wrong type."""
    if value is None:
        return None
    kind = _kind(action)
    if kind == "bool":
        if not isinstance(value, bool):
            raise UserError(f"{where}: expected true or false, got {shown(value)}")
        return value
    if kind == "count":
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise UserError(f"{where}: expected a count (0, 1, 2...), got {shown(value)}")
        return value
    if kind == "list":
        items = value if isinstance(value, list) else [value]
        return [_scalar(action, v, f"{where}[{i}]" if isinstance(value, list) else where) for i, v in enumerate(items)]
    return _scalar(action, value, where)


def apply(parser: argparse.ArgumentParser, path: str, data: dict, command: str) -> dict[str, list]:
    """Make the file's values the defaults of ``parser`` (a command's); the repeatable flags' lists from the file
    are returned (``{dest: list}``) so :func:`override` can let the command line replace them."""
    from .vocabulary import _Alias, say_deprecated

    lists: dict[str, list] = {}
    seen: dict[str, str] = {}
    for key, value in data.items():
        action = find_action(parser, key)
        if action is None or action.dest in NOT_CONFIG:
            names = [key_of(a) for a in config_actions(parser)]
            close = difflib.get_close_matches(str(key).replace("-", "_"), names, n=1)
            hint = f" (did you mean {close[0]}?)" if close else f" (its keys: {', '.join(names)})"
            raise UserError(f"{path}: key {shown(key)}: nas {command} takes no such flag{hint}")
        if isinstance(action, _Alias):
            if action.warn:
                say_deprecated(command, f"{key} (in {path})", action.new)
            action = action.target
        if action.dest in seen:
            raise UserError(f"{path}: keys {shown(seen[action.dest])} and {shown(key)} set the same flag; keep one")
        seen[action.dest] = key
        converted = convert(action, value, f"{path}: key {shown(key)}")
        action.default = converted
        action.required = False
        if not action.option_strings:  # a positional given in the file: optional on the command line
            action.nargs = "*" if action.nargs in ("+", "*") else "?"
        if isinstance(action, argparse._AppendAction) and isinstance(converted, list):  # noqa: SLF001
            lists[action.dest] = converted
    return lists


def override(args: argparse.Namespace, lists: dict[str, list]) -> None:
    """A repeatable flag given on the command line replaces the file's list (argparse appends to its default)."""
    for dest, from_file in lists.items():
        value = getattr(args, dest, None)
        if value is not from_file and isinstance(value, list):
            setattr(args, dest, value[len(from_file):])


def effective(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    """``{key: value}`` of every configurable flag of the command (what ``--print-config`` writes)."""
    def value(action: argparse.Action):
        v = getattr(args, action.dest, None)  # a float flag's int default (2048) as the float a file gives back
        return float(v) if action.type is float and isinstance(v, int) and not isinstance(v, bool) else v

    return {key_of(a): value(a) for a in config_actions(parser) if hasattr(args, a.dest)}


def dump(command: str, values: dict[str, Any]) -> str:
    import yaml

    head = f"# nas {command} --config THIS_FILE  (flags given on the command line override these)\n"
    return head + yaml.safe_dump(values, sort_keys=False, allow_unicode=True)
