"""Two things every command shares, run by :func:`nas.cli.main` around the command:

* :func:`check_flags`, one validation pass over the parsed flags *before any work starts*: a
  number flag that is NaN or infinite, a text flag that is not UTF-8, an ``--out`` that is a file
  where a folder goes (or the reverse) or sits on a read-only or missing place, a device flag
  (``--verify``, ``--measure``) that names no device or options it does not take.  A search that
  runs for an hour and then fails on a flag is the failure this prevents.
* :func:`io_failure`, the top-level handler's reading of an exception: a file-system failure (a full
  disk, a read-only folder, a file where a folder goes), raised as an ``OSError`` or wrapped by a
  library (Optuna's storage, torch's checkpoint writer, Matplotlib), becomes one line naming the path
  and what happened; anything else keeps its traceback (it is a bug).
"""

from __future__ import annotations

import argparse
import errno
import math
import os
from pathlib import Path

from search_spaces import UserError

# Commands whose --out is a file (a timing table); every other command's --out is a folder.
OUT_IS_FILE = {"measure-latency"}

# Flags that name a device to time on, with the flags of its options: checked by building the device.
DEVICE_FLAGS = {
    "search": ("verify", {"threads": "verify_threads", "clock": "verify_clock"}),
    "export": ("measure", {"threads": "threads", "clock": "clock"}),
}

_HINTS = {
    errno.ENOSPC: "the disk is full: free some space or write elsewhere (--out); what was written before is kept",
    errno.EDQUOT: "the disk quota is used up: free some space or write elsewhere (--out)",
    errno.EROFS: "a read-only file system: write elsewhere (--out)",
    errno.EACCES: "no permission: write elsewhere (--out)",
    errno.EPERM: "no permission: write elsewhere (--out)",
    errno.ENOTDIR: "a file stands where a folder is needed",
    errno.EISDIR: "a folder stands where a file is needed",
}


def check_flags(args: argparse.Namespace) -> None:
    """Refuse, with one line naming the flag, what would fail later; nothing is written."""
    for name, value in sorted(vars(args).items()):
        flag = "--" + name.replace("_", "-")
        if isinstance(value, float) and not math.isfinite(value):
            raise UserError(f"{flag}: {value} is not a finite number")
        if isinstance(value, str) and _not_utf8(value):
            raise UserError(f"{flag}: not UTF-8 text ({value.encode('utf-8', 'surrogateescape')[:40]!r})")
    out = getattr(args, "out", None)
    if isinstance(out, str) and out:
        check_out(Path(out), file=args.command in OUT_IS_FILE)
    if args.command in DEVICE_FLAGS:
        flag, options = DEVICE_FLAGS[args.command]
        name = getattr(args, flag, None)
        if name:
            check_device(f"--{flag}", name, **{k: getattr(args, v, None) for k, v in options.items()})


def _not_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # an argument that was not UTF-8 arrives with surrogate escapes
        return True
    return False


def check_out(out: Path, *, file: bool) -> None:
    """``--out`` can be written: not a folder where a file goes (or the reverse), under a folder that is writable."""
    what = "a file (the table)" if file else "a folder"
    if out.exists() and out.is_dir() == file:
        raise UserError(f"--out: {out} is {'a folder' if out.is_dir() else 'a file'}; expected {what}")
    parent = out if out.is_dir() else out.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise UserError(f"--out: {out}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK) or _read_only(parent):
        raise UserError(f"--out: {out}: {parent} is not writable (read-only or no permission); write elsewhere")


def _read_only(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):
        return False


def check_device(flag: str, name: str, **options) -> None:
    """The device ``name`` exists and takes ``options``; errors name ``flag`` (not the device's own ``--device``)."""
    if name == "arm" or name.startswith("ssh://"):
        return
    from latency.device import get_device

    try:
        get_device(name, **options)
    except UserError as e:
        raise UserError(str(e).replace("--device", flag)) from None


# --------------------------------------------------------------------------- the top-level handler


def io_failure(exc: BaseException, args: argparse.Namespace) -> str | None:
    """One line for a file-system failure anywhere in ``exc``'s chain, or None when it is not one."""
    seen = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and (e.errno is not None or e.filename):
            return os_error_line(e, getattr(args, "out", None))
        text = str(e)
        for marker, code in (("database or disk is full", errno.ENOSPC), ("readonly database", errno.EROFS),
                             ("failed writing file", errno.ENOSPC), ("unable to open database file", errno.EACCES)):
            if marker in text:  # sqlite through Optuna / SQLAlchemy; torch's checkpoint writer on a full disk
                where = _storage_path(args) or getattr(args, "out", None) or "the output"
                return f"{where}: {os.strerror(code)}: {_HINTS[code]}"
        e = e.__cause__ or e.__context__
    return None


def os_error_line(e: OSError, out: str | None = None) -> str:
    path = e.filename or out or "the output"
    hint = _HINTS.get(e.errno or 0)
    return f"{path}: {e.strerror or e}" + (f": {hint}" if hint else "")


def _storage_path(args: argparse.Namespace) -> str | None:
    storage = getattr(args, "storage", None)
    if storage and storage.startswith("sqlite:///"):
        return storage[len("sqlite:///"):]
    out = getattr(args, "out", None)
    return str(Path(out) / "search.db") if out and args.command == "search" else None
