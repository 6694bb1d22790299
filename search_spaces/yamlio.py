"""Reading the YAML files users give (spaces, subnets): ``yaml.safe_load`` that refuses duplicate keys.

PyYAML keeps the last of two equal keys in a mapping without a word (``embed_dim: [64]`` then
``embed_dim: [128]`` is a space of width 128), so :func:`load_yaml` refuses them, naming the key
and both lines.  :func:`read_text` reads a user's file as UTF-8 and names the file and the byte
offset where it is not.

What a hostile or broken file could make of the parser is bounded before it starts: a file over
:data:`MAX_YAML_BYTES` (or not a regular file: a FIFO, ``/dev/zero``) is refused before it is read
whole; an alias (``*name``, the "billion laughs" that expands a few lines into gigabytes) is refused
where it stands, as is nesting deeper than :data:`MAX_DEPTH` (PyYAML composes recursively).  Values
quoted in messages are cut (:func:`search_spaces.errors.shown`).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import yaml

from .errors import UserError, first_line

MAX_YAML_BYTES = 256 * 1024  # the shipped spaces are under 4 KB; a subnet of depth 256 about 10 KB
MAX_DEPTH = 64  # a space nests 4 levels deep


class _UniqueKeyLoader(yaml.SafeLoader):
    """The safe loader (no tags that run code), plus: a key given twice in one mapping, an alias, or nesting deeper
    than :data:`MAX_DEPTH` is an error."""

    depth = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise Refused(event.start_mark, f"an alias (*{event.anchor}): aliases are not accepted (they can expand a "
                                            "few lines into gigabytes); write the value out")
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise Refused(self.peek_event().start_mark, f"nested deeper than {MAX_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

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


class Refused(yaml.YAMLError):
    def __init__(self, mark, what: str):
        super().__init__(f"line {mark.line + 1}, column {mark.column + 1}: {what}")


class DuplicateKey(yaml.YAMLError):
    def __init__(self, key: Any, first: int, second: int):
        super().__init__(f"duplicate key {key!r} at line {second} (first at line {first}): a key may appear once in a mapping")
        self.key, self.first, self.second = key, first, second


def load_yaml(text: str, where: str, error: type[UserError] = UserError) -> Any:
    """``yaml.safe_load`` of ``text`` (from ``where``, a file name), refusing duplicate keys; errors are one
    ``error`` naming the file and the line.  Text over :data:`MAX_YAML_BYTES` is refused before parsing."""
    if len(text) > MAX_YAML_BYTES:
        raise _error(error, f"{where}: {len(text):,} characters; a YAML file here is at most {MAX_YAML_BYTES:,}")
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except (DuplicateKey, Refused) as e:
        raise _error(error, f"{where}: {e}") from None
    except ValueError as e:  # PyYAML's int() of a number over Python's 4,300 digits
        raise _error(error, f"{where}: not valid YAML ({first_line(e).split(';')[0]})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise _error(error, f"{where}: {at}not valid YAML ({getattr(e, 'problem', None) or e})") from None


def _error(cls: type[UserError], message: str) -> UserError:
    from .errors import SpaceError

    return SpaceError([message]) if issubclass(cls, SpaceError) else cls(message)


def read_text(path: Path, what: str, error: type[UserError] = UserError, limit: int = MAX_YAML_BYTES) -> str:
    """The text of a user's file, UTF-8; one ``error`` line when it cannot be read, is not a regular file (a folder, a
    FIFO that would block, ``/dev/zero`` that never ends), is over ``limit`` bytes (checked before reading) or is not
    UTF-8."""
    try:
        st = os.stat(path)
        if stat.S_ISDIR(st.st_mode) or not stat.S_ISREG(st.st_mode):
            kind = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise _error(error, f"{path}: {kind}; expected a {what} (a UTF-8 YAML file)")
        if st.st_size > limit:
            raise _error(error, f"{path}: {st.st_size:,} bytes; a {what} is at most {limit:,} bytes")
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise _error(error, f"{path}: cannot read {what}: {e.strerror}") from None
    if len(data) > limit:  # it grew since
        raise _error(error, f"{path}: over {limit:,} bytes; a {what} is at most {limit:,} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        bad = data[e.start:e.start + 1]
        raise _error(error, f"{path}: not UTF-8 text (byte {e.start}: {bad!r}); a {what} is UTF-8 YAML") from None
