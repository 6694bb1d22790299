"""A run folder as ``nas report`` reads it: never trusted, never followed out of, never read whole when large.

A run folder can come from anywhere (a colleague's tarball, a CI artefact), so every file the page shows is read
through :class:`RunFolder`:

* **only the folder's own regular files**: a symbolic link (``env.log -> /proc/self/environ``), a FIFO, a device
  or a socket is never opened; each path component is checked with ``lstat`` before the file is opened
  (``O_NOFOLLOW | O_NONBLOCK``: a FIFO swapped in at the last moment cannot block the reader) and the opened file
  is checked again with ``fstat`` (still a regular file, the same one);
* **bounded**: a JSON file over :data:`MAX_JSON` bytes or a figure over :data:`MAX_IMAGE` is not read, a text file
  is read at its head (and a log at its tail), a CSV file up to :data:`MAX_CSV` bytes; JSON nested deeper than
  :data:`MAX_DEPTH` levels is refused (Python's own reader fails at about 1,000 with a ``RecursionError``);
* **typed**: :func:`conform` keeps the fields of a document that have the types the page expects and says which
  it left out, so a number that is a string (``"predicted_ms": "<form ...>"``) is shown as data, never formatted
  or inserted as markup.

A file the page cannot show raises :class:`Unreadable` (a :class:`~search_spaces.UserError`): one line naming the
file and why.  The page's sections catch it and say what they skipped; a folder the page cannot be made of at all
is refused with it (``nas report``: one line, exit status 2).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from search_spaces import UserError

MAX_JSON = 16 * 2**20  # bytes of one JSON document read
MAX_CSV = 16 * 2**20  # bytes of one CSV file read (its head)
MAX_IMAGE = 8 * 2**20  # bytes of one embedded figure
MAX_TEXT = 100_000  # bytes of a text file shown whole; a longer one: its head and its tail, half of this each
MAX_LOG = 32 * 2**20  # bytes of a training log (log.jsonl) read: its last ones
MAX_LINE = 2**20  # bytes of one line of a training log
MAX_DEPTH = 64  # levels of JSON nesting (as the YAML reader allows)
MAX_ENTRIES = 2_000  # entries of one folder looked at
MAX_CELL = 2_000  # characters of one table cell shown
MAX_COLUMNS = 60  # columns of one table shown
MAX_PIXELS = 50_000_000  # pixels a PNG may declare (20000 x 20000 would make a browser allocate 1.6 GB)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


class Unreadable(UserError):
    """A file of the run folder that the page does not show: the message says which and why, in one line."""


class Missing(Unreadable):
    """No such entry in the run folder."""


def shown(name: str) -> str:
    """A name or text as the page shows it: bytes that are not UTF-8 (a file name's, kept by Python as surrogate
    escapes) and lone surrogates (from JSON's ``\\ud800``) become U+FFFD, so the page is always valid UTF-8."""
    try:  # a file name's undecodable bytes come back as they were, each shown as one U+FFFD
        return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    except UnicodeEncodeError:  # other lone surrogates
        return name.encode("utf-8", "surrogatepass").decode("utf-8", "replace")


_CONTROLS = re.compile(r"[\x00-\x1f\x7f]")


def printable(name: str) -> str:
    """A name (a file's, a JSON key's) as messages and headings give it: :func:`shown`, its control characters written
    as ``\\xNN`` (a name with a newline cannot break a one-line message in two)."""
    return _CONTROLS.sub(lambda m: f"\\x{ord(m.group()):02x}", shown(name))


def _kind(mode: int) -> str:
    """What a file-system entry is, in words."""
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a regular file" if stat.S_ISREG(mode) else "not a regular file"


@dataclass(frozen=True)
class Entry:
    """One entry of a folder: its name (as the file system has it), its path relative to the run folder, what it is
    (:func:`_kind`'s words) and, for a regular file, its size."""

    name: str
    rel: str
    kind: str
    size: int = 0

    @property
    def is_file(self) -> bool:
        return self.kind == "a regular file"

    @property
    def suffix(self) -> str:
        return Path(self.name).suffix.lower()


class RunFolder:
    """The run folder ``folder`` (itself given by the user, so it may be reached through a link); every path below
    it is relative (``"search/search.json"``) and may not pass through a link."""

    def __init__(self, folder: str | Path):
        self.given = Path(folder)
        try:
            st = os.stat(self.given)
        except OSError:
            st = None
        if st is None or not stat.S_ISDIR(st.st_mode):
            raise UserError(f"{folder}: no such folder (expected a run folder: a demo, a search or a benchmark's)")
        self.root = self.given.resolve()

    def display(self, rel: str) -> str:
        """``rel`` as messages and the page name it: below the folder as the user gave it."""
        return printable(str(self.given / rel)) if rel else printable(str(self.given))

    # ------------------------------------------------------------------ what is there

    def _lstat(self, rel: str) -> os.stat_result:
        """``lstat`` of ``rel``, every folder on the way checked to be a folder, not a link (:class:`Unreadable`)."""
        parts = [p for p in rel.split("/") if p]
        if not parts or any(p in (".", "..") for p in parts):
            raise Unreadable(f"{self.display(rel)}: not a path inside the run folder")
        path = self.root
        for i, part in enumerate(parts):
            path = path / part
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                raise Missing(f"{self.display(rel)}: no such file") from None
            except OSError as e:
                raise Unreadable(f"{self.display(rel)}: {e.strerror or e}") from None
            if i < len(parts) - 1 and not stat.S_ISDIR(st.st_mode):
                on_way = "/".join(parts[: i + 1])
                raise Unreadable(f"{self.display(rel)}: {printable(on_way)} is {_kind(st.st_mode)}, not followed "
                                 "(the page shows only the run folder's own files)")
        return st

    def what(self, rel: str) -> str:
        """:func:`_kind`'s words for ``rel``; ``"missing"`` when there is no such entry; ``"not reachable"`` when a
        folder on the way is a link or not a folder (reading it says which)."""
        try:
            return _kind(self._lstat(rel).st_mode)
        except Missing:
            return "missing"
        except Unreadable:
            return "not reachable"

    def is_file(self, rel: str) -> bool:
        """``rel`` is a regular file of the folder (not a link, a FIFO, a device)."""
        return self.what(rel) == "a regular file"

    def is_dir(self, rel: str) -> bool:
        """``rel`` is a folder of the run folder (not a link to one)."""
        return self.what(rel) == "a folder"

    def entries(self, rel: str = "") -> tuple[list[Entry], int]:
        """The entries of the folder ``rel`` (``""``: the run folder), sorted by name, at most :data:`MAX_ENTRIES`;
        with the number there are."""
        if rel:
            st = self._lstat(rel)
            if not stat.S_ISDIR(st.st_mode):
                raise Unreadable(f"{self.display(rel)}: {_kind(st.st_mode)}, not a folder")
        out, total = [], 0
        try:
            with os.scandir(self.root / rel if rel else self.root) as it:
                for entry in it:
                    total += 1
                    if len(out) < MAX_ENTRIES:
                        try:
                            st = entry.stat(follow_symlinks=False)
                        except OSError:
                            continue  # gone since it was listed
                        size = st.st_size if stat.S_ISREG(st.st_mode) else 0
                        out.append(Entry(entry.name, f"{rel}/{entry.name}" if rel else entry.name, _kind(st.st_mode), size))
        except OSError as e:
            raise Unreadable(f"{self.display(rel)}: {e.strerror or e}") from None
        return sorted(out, key=lambda e: e.name), total

    # ------------------------------------------------------------------ reading

    def _open(self, rel: str) -> tuple[int, int]:
        """A descriptor of the regular file ``rel`` (checked before and after opening) and its size."""
        st = self._lstat(rel)
        if not stat.S_ISREG(st.st_mode):
            raise Unreadable(f"{self.display(rel)}: {_kind(st.st_mode)}, not a regular file: not read"
                             + (" (the page shows only the run folder's own files)" if stat.S_ISLNK(st.st_mode) else ""))
        flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(self.root / rel, flags)
        except OSError as e:
            raise Unreadable(f"{self.display(rel)}: {e.strerror or e}") from None
        now = os.fstat(fd)
        if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            os.close(fd)
            raise Unreadable(f"{self.display(rel)}: replaced while it was read: not read")
        return fd, now.st_size

    def size(self, rel: str) -> int:
        st = self._lstat(rel)
        return st.st_size if stat.S_ISREG(st.st_mode) else 0

    def read(self, rel: str, limit: int, what: str = "file") -> bytes:
        """The whole of ``rel``; a file over ``limit`` bytes is not read (:class:`Unreadable`, naming ``what``)."""
        fd, size = self._open(rel)
        try:
            if size > limit:
                raise Unreadable(f"{self.display(rel)}: {size:,} bytes, over the {limit:,}-byte limit of a {what}: not read")
            return _read_at(fd, 0, limit + 1)[: limit + 1]
        finally:
            os.close(fd)

    def head_tail(self, rel: str, limit: int) -> tuple[bytes, bytes, int]:
        """``(head, tail, size)``: the whole file as ``head`` when it has at most ``limit`` bytes; else its first and
        last ``limit // 2`` bytes (a 6 GB log costs what a small one does)."""
        fd, size = self._open(rel)
        try:
            if size <= limit:
                return _read_at(fd, 0, limit), b"", size
            half = limit // 2
            return _read_at(fd, 0, half), _read_at(fd, size - half, half), size
        finally:
            os.close(fd)

    def tail(self, rel: str, limit: int) -> tuple[bytes, int]:
        """The last ``limit`` bytes of ``rel`` (all of it when smaller) and its size."""
        fd, size = self._open(rel)
        try:
            start = max(0, size - limit)
            return _read_at(fd, start, limit), size
        finally:
            os.close(fd)

    def head(self, rel: str, limit: int) -> tuple[bytes, int]:
        """The first ``limit`` bytes of ``rel`` and its size."""
        fd, size = self._open(rel)
        try:
            return _read_at(fd, 0, limit), size
        finally:
            os.close(fd)

    def json(self, rel: str) -> Any:
        """The JSON document ``rel`` (:class:`Unreadable`: missing, not a regular file, too large, not JSON, nested
        deeper than :data:`MAX_DEPTH`)."""
        return parse_json(self.read(rel, MAX_JSON, "JSON document"), self.display(rel))

    def json_or_none(self, rel: str) -> Any:
        """:meth:`json`, or None when there is no such entry at all (a link or a FIFO is not 'no such')."""
        if self.what(rel) == "missing":
            return None
        return self.json(rel)

    def csv(self, rel: str) -> Table:
        """The CSV file ``rel``, its first :data:`MAX_CSV` bytes; what could not be read is said in ``notes``."""
        data, size = self.head(rel, MAX_CSV)
        notes = [f"{self.display(rel)}: the first {MAX_CSV:,} of {size:,} bytes read"] if size > MAX_CSV else []
        return parse_csv(data.decode("utf-8", errors="replace"), self.display(rel), notes)


def _read_at(fd: int, offset: int, n: int) -> bytes:
    """Up to ``n`` bytes of ``fd`` from ``offset`` (fewer at its end)."""
    chunks, got = [], 0
    while got < n:
        chunk = os.pread(fd, min(n - got, 2**20), offset + got)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


# --------------------------------------------------------------------------- JSON and CSV


def parse_json(data: bytes, where: str) -> Any:
    """The JSON value of ``data`` (UTF-8; invalid bytes replaced), nested at most :data:`MAX_DEPTH` levels."""
    try:
        value = json.loads(data.decode("utf-8", errors="replace"))
    except RecursionError:
        raise Unreadable(f"{where}: JSON nested deeper than {MAX_DEPTH} levels: not read") from None
    except ValueError as e:  # JSONDecodeError, and an integer of more digits than Python converts
        raise Unreadable(f"{where}: not valid JSON ({shown(str(e))[:200]})") from None
    if too_deep(value, MAX_DEPTH):
        raise Unreadable(f"{where}: JSON nested deeper than {MAX_DEPTH} levels: not read")
    return value


def too_deep(value: Any, limit: int) -> bool:
    """Whether ``value`` nests lists and objects more than ``limit`` levels (walked without recursion)."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, (dict, list)):
            if depth > limit:
                return True
            stack.extend((child, depth + 1) for child in (v.values() if isinstance(v, dict) else v))
    return False


@dataclass
class Table:
    """A CSV file as read: its header, its rows (each padded or cut to the header's width) and what was not read."""

    header: list[str]
    rows: list[list[str]]
    notes: list[str]

    def dicts(self) -> list[dict[str, str]]:
        return [dict(zip(self.header, r)) for r in self.rows]


def parse_csv(text: str, where: str, notes: list[str] | None = None) -> Table:
    """The rows of CSV ``text``; a line the ``csv`` module refuses (a cell over its 131,072-character limit) ends
    the table there, and ``notes`` says so."""
    notes = list(notes or [])
    rows: list[list[str]] = []
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        for row in reader:
            rows.append(row)
    except csv.Error as e:
        notes.append(f"{where}: line {reader.line_num}: {e}; the rows after it are not shown")
    if not rows:
        return Table([], [], notes)
    header = rows[0]
    width = len(header)
    return Table(header, [(r + [""] * width)[:width] for r in rows[1:]], notes)


# --------------------------------------------------------------------------- the types a section expects

NUM, TEXT, BOOL, ANY = "a number", "text", "true or false", "anything"


@dataclass(frozen=True)
class Map:
    """An object whose keys are names (budget labels, subnet names) and whose values all have one schema."""

    of: Any


def conform(value: Any, schema: Any, where: str, problems: list[str]) -> Any:
    """``value`` with every field that does not have the type ``schema`` gives left out (each one said in
    ``problems`` as ``where.field: text, expected a number``); None when ``value`` itself does not fit.

    ``schema``: :data:`NUM` (a finite or infinite int or float, not a bool; an int too large for a float is left
    out), :data:`TEXT`, :data:`BOOL`, :data:`ANY`, a dict of field schemas (other fields are dropped), a one-item
    list (each item), or :class:`Map` (an object of any keys).  A JSON ``null`` counts as absent, silently."""
    if value is None:
        return None
    expected = _expected(schema)
    if schema is ANY:
        return value
    if schema is NUM:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return _wrong(value, expected, where, problems)
        try:
            float(value)
        except OverflowError:
            problems.append(f"{where}: a number too large to show")
            return None
        return value
    if schema is TEXT:
        return value if isinstance(value, str) else _wrong(value, expected, where, problems)
    if schema is BOOL:
        return value if isinstance(value, bool) else _wrong(value, expected, where, problems)
    if isinstance(schema, list):
        if not isinstance(value, list):
            return _wrong(value, expected, where, problems)
        out = [conform(v, schema[0], f"{where}[{i}]", problems) for i, v in enumerate(value)]
        return [v for v in out if v is not None]
    if isinstance(schema, Map):
        if not isinstance(value, dict):
            return _wrong(value, expected, where, problems)
        out = {k: conform(v, schema.of, f"{where}.{k}", problems) for k, v in value.items()}
        return {k: v for k, v in out.items() if v is not None}
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            return _wrong(value, expected, where, problems)
        out = {k: conform(value.get(k), s, f"{where}.{k}", problems) for k, s in schema.items()}
        return {k: v for k, v in out.items() if v is not None}
    raise AssertionError(f"not a schema: {schema!r}")


def _expected(schema: Any) -> str:
    if isinstance(schema, (dict, Map)):
        return "an object"
    if isinstance(schema, list):
        return "a list"
    return schema


def _wrong(value: Any, expected: str, where: str, problems: list[str]) -> None:
    problems.append(f"{printable(where)[:200]}: {json_type(value)}, expected {expected}")
    return None


def json_type(value: Any) -> str:
    """What a JSON value is, in words (for messages: never the value itself, which may be long or hostile)."""
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, (int, float)):
        return "a number" if math.isfinite(value) else "a non-finite number"
    if isinstance(value, str):
        return f"text ({len(value):,} characters)" if len(value) > 40 else "text"
    if isinstance(value, list):
        return f"a list of {len(value):,}"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
