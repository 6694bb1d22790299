"""Timing tables: a CSV of measured subnets plus a JSON sidecar (``TIMINGS.csv.json``).

The sidecar says what produced the rows: the device fingerprint, the space (in full, so a
table is read without the YAML) and its hash, the workload, the protocol settings, the seed
and the drift baseline.  Opening an existing table for more measurements checks all of it
and refuses a mix.  Rows carry ``pass``: ``measure`` for the campaign, ``retest`` for the
share of subnets measured a second time (test-retest agreement).

Reading validates every row and names the line of the first problem.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import os
import socket
from dataclasses import dataclass
from pathlib import Path

import yaml

from search_spaces import Space, Subnet, UserError, Workload, parse_space

from .device import fingerprint_mismatch
from .quantize import precision_of
from .timing_core import FORMAT, HEAD_COLUMNS, TIMING_COLUMNS, VERSION, append_rows, read_lines, sidecar_path, write_json

log = logging.getLogger(__name__)

PASSES = ("measure", "retest")


@dataclass(frozen=True)
class Row:
    line: int
    key: str
    pass_: str
    subnet: Subnet
    median_ms: float
    iqr_ms: float
    flags: tuple[str, ...]


@dataclass
class Timings:
    """A validated timing table."""

    path: Path
    meta: dict
    space: Space
    workload: Workload
    rows: list[Row]

    @property
    def fingerprint(self) -> dict:
        return self.meta["fingerprint"]

    def passes(self, name: str) -> dict[str, Row]:
        return {r.key: r for r in self.rows if r.pass_ == name}


def columns_for(feature_names: list[str]) -> list[str]:
    return HEAD_COLUMNS + list(feature_names) + TIMING_COLUMNS


def make_meta(fingerprint: dict, space: Space, workload: Workload, settings: dict, seed: int, feature_names: list[str]) -> dict:
    return {
        "format": FORMAT,
        "version": VERSION,
        "fingerprint": {**fingerprint, "space_hash": space.hash, "workload": f"{workload.name} {workload.shape}"},
        "space": space.to_dict(),
        "space_hash": space.hash,
        "workload": workload.record(),
        "protocol": settings,
        "seed": seed,
        "baseline_ms": None,
        "columns": columns_for(feature_names),
    }


# --------------------------------------------------------------------------- reading


def read_meta(path: Path) -> dict:
    side = Path(sidecar_path(str(path)))
    if not side.exists():
        raise UserError(
            f"{path}: no sidecar {side.name} beside it (device fingerprint, space); a timing table needs it. "
            "To fit a plain table of numeric columns, pass --target COLUMN"
        )
    try:
        meta = json.loads(side.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"{side}: not a readable JSON sidecar: {e}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise UserError(
            f"{side}: not a timing-table sidecar of this tool (format "
            f"{meta.get('format') if isinstance(meta, dict) else None!r}, expected {FORMAT!r})"
        )
    if meta.get("version") != VERSION:
        raise UserError(f"{side}: version {meta.get('version')!r}, this tool reads version {VERSION}")
    for k in ("fingerprint", "space", "space_hash", "workload", "protocol", "columns"):
        if k not in meta:
            raise UserError(f"{side}: missing field {k!r}")
    return meta


def space_of(meta: dict, where: str) -> Space:
    try:
        space = parse_space(yaml.safe_dump(meta["space"]), where=f"{where}[space]", source=where)
    except UserError as e:
        raise UserError(f"{where}: the space stored in the sidecar is invalid: {e}") from None
    if space.hash != meta["space_hash"]:
        raise UserError(f"{where}: stored space hash {meta['space_hash']} does not match its space ({space.hash})")
    return space


def _number(path: Path, line: int, column: str, text: str | None, positive: bool = False) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise UserError(f"{path}: line {line}: column {column!r}: {text!r} is not a number") from None
    if not math.isfinite(value) or (positive and value <= 0):
        raise UserError(
            f"{path}: line {line}: column {column!r}: {text!r} is not a {'positive ' if positive else ''}finite number"
        )
    return value


def _records(path: Path, required: list[str]):
    """(line, dict) per data row; errors name the line (ragged rows, missing columns).  A torn last line (an
    append cut short by a crash: no newline at its end) is left out with a note."""
    try:
        lines, torn = read_lines(str(path))
    except OSError as e:
        raise UserError(f"{path}: cannot read: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text (byte {e.start}); a timing table is a UTF-8 CSV") from None
    if torn is not None:
        log.warning("%s: line %d is torn (%d bytes without a newline: a write cut short); left out", path, len(lines) + 1,
                    len(torn))
    with io.StringIO("".join(line + "\n" for line in lines), newline="") as f:
        reader = csv.reader(f)
        try:
            header = next(reader)
        except StopIteration:
            raise UserError(f"{path}: empty file (expected a header line)") from None
        except csv.Error as e:
            raise UserError(f"{path}: line 1: not valid CSV: {e}") from None
        missing = [c for c in required if c not in header]
        if missing:
            raise UserError(f"{path}: line 1: header lacks column(s) {', '.join(map(repr, missing))}")
        try:
            for fields in reader:
                line = reader.line_num
                if not fields:
                    continue
                if len(fields) != len(header):
                    raise UserError(f"{path}: line {line}: has {len(fields)} fields, the header has {len(header)}")
                yield line, dict(zip(header, fields))
        except csv.Error as e:
            raise UserError(f"{path}: line {reader.line_num}: not valid CSV: {e}") from None


def read_timings(path: str | Path) -> Timings:
    """Read and validate a timing table (CSV + sidecar)."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: no such timing table")
    meta = read_meta(path)
    space = space_of(meta, str(path))
    workload = Workload.from_record(meta["workload"], f"{sidecar_path(str(path))}: workload")
    rows, seen = [], set()
    for line, rec in _records(path, ["key", "pass", "subnet", "median_ms", "iqr_ms", "flags"]):
        if rec.get("workload", workload.label) != workload.label:  # tables written before the column have none
            raise UserError(
                f"{path}: line {line}: column 'workload': a row of {rec['workload']!r}, but the table's sidecar says "
                f"{workload.label!r}: "
                "a table holds one workload (rows of several were mixed into this file); fit one predictor per workload"
            )
        if rec["pass"] not in PASSES:
            raise UserError(f"{path}: line {line}: column 'pass': {rec['pass']!r} is not one of {', '.join(PASSES)}")
        try:
            subnet = space.subnet_type.from_json(rec["subnet"])  # the subnet type of the space's task
        except (json.JSONDecodeError, UserError) as e:
            raise UserError(f"{path}: line {line}: column 'subnet': not a subnet: {str(e).splitlines()[0]}") from None
        problems = space.problems(subnet)
        if problems:
            raise UserError(f"{path}: line {line}: subnet is not in space {space.name!r}: {problems[0]}")
        if subnet.key != rec["key"]:
            raise UserError(f"{path}: line {line}: column 'key': {rec['key']!r} is not the subnet's key {subnet.key!r}")
        if (rec["key"], rec["pass"]) in seen:
            raise UserError(f"{path}: line {line}: subnet {rec['key']} appears twice in pass {rec['pass']!r}")
        seen.add((rec["key"], rec["pass"]))
        median = _number(path, line, "median_ms", rec["median_ms"], positive=True)
        spread = _number(path, line, "iqr_ms", rec["iqr_ms"])
        flags = tuple(f for f in rec["flags"].split(";") if f)
        rows.append(Row(line, rec["key"], rec["pass"], subnet, median, spread, flags))
    if not rows:
        raise UserError(f"{path}: no measured rows")
    return Timings(path, meta, space, workload, rows)


def read_plain(
    path: str | Path, target: str, min_rows: int = 10, needs: str = "fitting needs at least 10"
) -> tuple[list[str], list[list[float]], list[float]]:
    """A plain CSV of numeric columns: (feature names, rows, target values); errors name the line; fewer than
    ``min_rows`` rows is refused with ``needs`` (what the caller fits)."""
    from supernet.files import file_problem

    path = Path(path)
    problem = file_problem(path)
    if problem:
        raise UserError(f"{path}: {problem}; expected a CSV file")
    try:
        with open(path, newline="", encoding="utf-8") as f:
            header = next(csv.reader(f), None)
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text (byte {e.start}); expected a UTF-8 CSV") from None
    if not header:
        raise UserError(f"{path}: empty file (expected a header line)")
    if target not in header:
        raise UserError(f"--target: {target!r} is not a column of {path} (columns: {', '.join(header)})")
    names = [c for c in header if c != target]
    if not names:
        raise UserError(f"{path}: no feature columns besides the target {target!r}")
    x, y = [], []
    for line, rec in _records(path, [target]):
        y.append(_number(path, line, target, rec[target], positive=True))
        x.append([_number(path, line, c, rec[c]) for c in names])
    if len(y) < min_rows:
        raise UserError(f"{path}: {len(y)} rows; {needs}")
    return names, x, y


# --------------------------------------------------------------------------- writing (resume)


def lock_file(path: Path, busy: str):
    """Hold an exclusive lock on ``path`` (created if missing; it records the holder's pid and host) and return it (a
    ``filelock.FileLock``: ``flock`` on POSIX, ``msvcrt`` locking on Windows); :class:`UserError` ``busy`` (with the
    holder) when another process holds it.  The system releases the lock when the holder's process ends, however it
    ends; :func:`unlock_file` removes the file."""
    from filelock import FileLock, Timeout

    lock = FileLock(path, timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise UserError(f"{busy} ({_holder(path)}); wait for it to end or use another --out") from None
    try:  # the holder, for the message a second writer gets (a contender does not truncate the file: filelock >= 4)
        with open(path, "r+b", buffering=0) as f:
            f.write(f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
    except OSError:  # a full disk, or a platform that keeps a locked file closed to others: the lock holds all the same
        pass
    return lock


def _holder(path: Path) -> str:
    """What the lock file at ``path`` says of its holder ("unknown" when it says nothing or cannot be read)."""
    try:
        return path.read_bytes().decode("utf-8", "replace").strip() or "unknown"
    except OSError:
        return "unknown"


def unlock_file(lock) -> None:
    """Remove the lock file, then release it (in this order: a waiter that locks the removed file sees it is gone and
    tries again; on Windows, where an open file cannot be removed, the release removes it)."""
    try:
        Path(lock.lock_file).unlink(missing_ok=True)
    except PermissionError:
        pass
    lock.release()


class TimingTable:
    """A table being written: opened fresh, or resumed after checking its sidecar against ``meta``.

    One writer at a time: the table is locked (``TABLE.csv.lock``, a ``filelock`` lock the system releases when
    the holder dies, so a killed run never keeps it) from here until :meth:`close`, which removes the file;
    a second writer is refused with one line.  Resuming cuts a torn last line (a write a crash cut short) off the file,
    with a note, so the rerun appends after the last whole row."""

    def __init__(self, path: str | Path, meta: dict):
        self.path = Path(path)
        self.meta = meta
        self.done: dict[str, set[str]] = {p: set() for p in PASSES}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = lock_file(Path(str(self.path) + ".lock"), f"{self.path}: another measure-latency is writing this table")
        try:
            if self.path.exists() and self.path.stat().st_size > 0:
                self._drop_torn_line()
            if self.path.exists() and self.path.stat().st_size > 0:
                self._resume()
            else:
                write_json(sidecar_path(str(self.path)), self.meta)
        except BaseException:
            self.close()
            raise

    @property
    def journal_path(self) -> Path:
        """The visits of the chunk being measured (see :mod:`latency.campaign`)."""
        return Path(str(self.path) + ".visits")

    def close(self) -> None:
        """Release the lock (the object stays readable: ``done``, ``baseline_ms``)."""
        if self._lock is not None:
            unlock_file(self._lock)
            self._lock = None

    def _drop_torn_line(self) -> None:
        data = self.path.read_bytes()
        keep = data.rfind(b"\n") + 1
        if keep < len(data):
            lines = data[:keep].count(b"\n")
            os.truncate(self.path, keep)
            log.warning("%s: dropped line %d, torn by an interrupted write (%d bytes without a newline); it is measured again",
                        self.path, lines + 1, len(data) - keep)

    def _resume(self) -> None:
        stored = read_meta(self.path)
        where = f"{self.path}: cannot append:"
        theirs_space, mine_space = space_of(stored, str(self.path)), space_of(self.meta, "this run")
        if theirs_space.arch_hash != mine_space.arch_hash:  # the workloads listed may differ; the one timed is compared next
            raise UserError(f"{where} it holds space {stored['space_hash']}, this run measures space {self.meta['space_hash']}")
        mine = Workload.from_record(self.meta["workload"])
        theirs = Workload.from_record(stored["workload"], f"{sidecar_path(str(self.path))}: workload")
        if theirs != mine:
            raise UserError(f"{where} it holds timings of workload {theirs}, this run measures {mine}; "
                            f"use --workload {theirs.name} to add to it, or another --out")
        theirs_p, mine_p = precision_of(stored["fingerprint"]), precision_of(self.meta["fingerprint"])
        if theirs_p != mine_p:
            raise UserError(f"{where} it holds timings at precision {theirs_p}, this run measures {mine_p}; a table holds one "
                            f"precision: use --precision {theirs_p} to add to it, or another --out")
        diff = fingerprint_mismatch(stored["fingerprint"], self.meta["fingerprint"])
        if diff:
            raise UserError(
                f"{where} it was measured on another device or runtime (mixing fingerprints in one file is refused; "
                "use another --out):\n  " + "\n  ".join(diff)
            )
        for key in ("protocol", "seed", "sampling"):  # sampling: absent for uniform draws, "transfer" for --for-transfer
            if stored.get(key) != self.meta.get(key):
                raise UserError(
                    f"{where} its {key} is {stored.get(key)}, this run's is {self.meta.get(key)}; use the same flags or another "
                    "--out"
                )
        # subnets: how many (--samples, --retest), absent in tables written before it was kept; more extend the table
        # (the draw is prefix-stable), fewer would leave its counts a lie
        theirs_n, mine_n = stored.get("subnets"), self.meta.get("subnets")
        if theirs_n is not None and theirs_n != mine_n and not (
                isinstance(mine_n, dict) and set(theirs_n) == set(mine_n) and all(mine_n[k] >= theirs_n[k] for k in theirs_n)):
            raise UserError(f"{where} its subnets is {theirs_n}, this run's is {mine_n}; a rerun may add subnets (more "
                            "--samples or --retest), not drop them: give at least its counts, or another --out")
        for row in read_timings(self.path).rows:
            self.done[row.pass_].add(row.key)
        self.meta["baseline_ms"] = stored.get("baseline_ms")
        self.meta["columns"] = stored["columns"]  # rows keep the file's header (one written before a column existed lacks it)

    @property
    def baseline_ms(self) -> float | None:
        return self.meta.get("baseline_ms")

    def set_baseline(self, value: float) -> None:
        self.meta["baseline_ms"] = value
        write_json(sidecar_path(str(self.path)), self.meta)

    def append(self, rows: list[dict[str, str]], pass_: str) -> None:
        append_rows(str(self.path), self.meta["columns"], rows)
        self.done[pass_].update(r["key"] for r in rows)
