"""Reading the YAML files users give (spaces, subnets): ``yaml.safe_load`` that refuses duplicate keys.

PyYAML keeps the last of two equal keys in a mapping without a word (``embed_dim: [64]`` then
``embed_dim: [128]`` is a space of width 128), so :func:`load_yaml` refuses them, naming the key
and both lines.  :func:`read_text` reads a user's file as UTF-8 and names the file and the byte
offset where it is not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from .errors import UserError


class _UniqueKeyLoader(yaml.SafeLoader):
    """The safe loader (no tags that run code), plus: a key given twice in one mapping is an error."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: the base class reports it
                    continue
                line = key_node.start_mark.line + 1
                if first is not None:
                    raise DuplicateKey(key, first, line)
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


class DuplicateKey(yaml.YAMLError):
    def __init__(self, key: Any, first: int, second: int):
        super().__init__(f"duplicate key {key!r} at line {second} (first at line {first}): a key may appear once in a mapping")
        self.key, self.first, self.second = key, first, second


def load_yaml(text: str, where: str, error: type[UserError] = UserError) -> Any:
    """``yaml.safe_load`` of ``text`` (from ``where``, a file name), refusing duplicate keys; errors are one
    ``error`` naming the file and the line."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except DuplicateKey as e:
        raise _error(error, f"{where}: {e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise _error(error, f"{where}: {at}not valid YAML ({getattr(e, 'problem', None) or e})") from None


def _error(cls: type[UserError], message: str) -> UserError:
    from .errors import SpaceError

    return SpaceError([message]) if issubclass(cls, SpaceError) else cls(message)


def read_text(path: Path, what: str, error: type[UserError] = UserError) -> str:
    """The text of a user's file, UTF-8; one ``error`` line when it cannot be read or is not UTF-8."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise _error(error, f"{path}: cannot read {what}: {e.strerror}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        bad = data[e.start:e.start + 1]
        raise _error(error, f"{path}: not UTF-8 text (byte {e.start}: {bad!r}); a {what} is UTF-8 YAML") from None
