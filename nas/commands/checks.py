"""Two things every command shares, run by :func:`nas.cli.main` around the command:

* :func:`check_flags`, one validation pass over the parsed flags *before any work starts*: a
  number flag that is NaN or infinite, a text (a flag's, each of a repeated flag's, each positional
  text) that is not UTF-8, an ``--out`` that is a file where a folder goes (or the reverse), sits on a
  read-only or missing place or is one of the command's inputs (:data:`INPUTS`), a ``--lang`` that is
  no language name, an ``ssh://`` URL whose parts would not reach ``ssh`` as a user and a host, a
  timing target (``--timing-target``) that names no device or options it does not take.  A
  search that runs for an hour and then fails on a flag is the failure this prevents.
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
import re
from pathlib import Path
from typing import Any

from search_spaces import UserError

# Commands whose --out is a file, and what the file is; every other command's --out is a folder.
OUT_IS_FILE = {"measure-latency": "the table", "report": "the page"}

# The inputs of each command that writes an --out: {field: (flag, what it is)}.  An --out that is one of them would
# overwrite (or remove the parts of) what the command reads: refused before anything is read or written.
INPUTS = {
    "fit-predictor": {"timings": ("TIMINGS", "timing table"), "sources": ("--from", "predictor")},
    "measure-latency": {"space": ("SPACE", "search space")},
    "export": {"supernet": ("SUPERNET", "supernet checkpoint"), "subnet": ("--subnet", "subnet file"),
               "predictor": ("--predictor", "predictor")},
    "train-subnet": {"subnet": ("SUBNET", "subnet file"), "space": ("--space", "search space"),
                     "init": ("--init", "model directory"), "distill_from": ("--distill-from", "supernet checkpoint"),
                     "data": ("--data", "corpus")},
    "finetune": {"model": ("--model", "model directory"), "supernet": ("--supernet", "supernet checkpoint"),
                 "data": ("--data", "corpus")},
    "search": {"supernet": ("SUPERNET", "supernet checkpoint"), "predictor": ("--predictor", "predictor"),
               "val_data": ("--val-data", "held-out data")},
    "train-supernet": {"space": ("SPACE", "search space"), "data": ("--data", "corpus")},
    "fit-accuracy": {"supernet": ("SUPERNET", "supernet checkpoint"), "models": ("MODEL", "model directory")},
}

# The field of the flag that names a device to time on, per command: checked by building the device with the options
# given (the devices' own flags, latency.device.device_flags).
DEVICE_FLAGS = {"measure-latency": "device", "search": "timing_target", "export": "timing_target"}

_HINTS = {
    errno.ENOSPC: "the disk is full: free some space or write elsewhere (--out); what was written before is kept",
    errno.EDQUOT: "the disk quota is used up: free some space or write elsewhere (--out)",
    errno.EROFS: "a read-only file system: write elsewhere (--out)",
    errno.EACCES: "no permission: write elsewhere (--out)",
    errno.EPERM: "no permission: write elsewhere (--out)",
    errno.ENOTDIR: "a file stands where a folder is needed",
    errno.EISDIR: "a folder stands where a file is needed",
}


def check_flags(args: argparse.Namespace, parser: argparse.ArgumentParser | None = None) -> None:
    """Refuse, with one line naming the flag, what would fail later; nothing is written.  ``parser`` (the command's)
    names positional arguments as its usage does (``TEXT 2``); without it they are named by their field."""
    names = _names(parser)
    for name, value in sorted(vars(args).items()):
        flag = names.get(name, "--" + name.replace("_", "-"))
        values = list(enumerate(value, 1)) if isinstance(value, (list, tuple)) else [(None, value)]
        for i, item in values:  # a flag given several times, or positional texts: each one
            where = flag if i is None else f"{flag} {i}" if not flag.startswith("-") else f"{flag} (the {_nth(i)})"
            if isinstance(item, float) and not math.isfinite(item):
                raise UserError(f"{where}: {item} is not a finite number")
            if isinstance(item, str) and _not_utf8(item):
                raise UserError(f"{where}: not UTF-8 text ({item.encode('utf-8', 'surrogateescape')[:40]!r})")
    if getattr(args, "log", None) == "tensorboard":  # the training commands' --log: its package, before any work
        from supernet.train import check_log

        check_log(args.log)
    out = getattr(args, "out", None)
    if isinstance(out, str) and out:
        check_out(Path(out), file=OUT_IS_FILE.get(args.command, False))
        check_out_is_no_input(args, Path(out))
    from search_spaces.tasks import tasks

    for task in tasks().values():  # a task's own flags with a check of their own (translation's --lang: a locale name)
        for flag in task.flags:
            value = getattr(args, flag.dest, None)
            if flag.check is not None and value is not None:
                flag.check(value, flag.name)
    for field in ("device", "timing_target"):  # an ssh:// device anywhere: its URL, before any bundle is built
        value = getattr(args, field, None)
        if isinstance(value, str) and value.startswith("ssh://"):
            from latency.devices.arm import parse_target

            parse_target(value, "--" + field.replace("_", "-"))
    if args.command in DEVICE_FLAGS:
        field = DEVICE_FLAGS[args.command]
        name = getattr(args, field, None)
        if name:
            check_device(f"--{field.replace('_', '-')}", name, **device_options(args, args.command))


def device_options(args: argparse.Namespace, command: str) -> dict[str, Any]:
    """The device options given to ``command`` (constructor keyword -> value; None where not given)."""
    from latency.device import device_flags

    return {f.option: getattr(args, f.dest, None) for f in device_flags(command)}


def _names(parser: argparse.ArgumentParser | None) -> dict[str, str]:
    """``{dest: how the usage names it}``: ``--flag`` for an option, the metavar (``TEXT``) for a positional."""
    if parser is None:
        return {}
    return {a.dest: a.option_strings[-1] if a.option_strings else (a.metavar or a.dest.upper())
            for a in parser._actions if isinstance(a.dest, str)}  # noqa: SLF001 - argparse has no public list


def _nth(i: int) -> str:
    return {1: "first", 2: "second", 3: "third"}.get(i, f"{i}th")


def _not_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # an argument that was not UTF-8 arrives with surrogate escapes
        return True
    return False


def check_out(out: Path, *, file: str | bool) -> None:
    """``--out`` can be written: not a folder where a file goes (or the reverse), under a folder that is writable.
    ``file``: what the file is (``"the table"``), or False where ``--out`` is a folder."""
    what = f"a file ({file})" if isinstance(file, str) else "a file" if file else "a folder"
    file = bool(file)
    if out.exists() and out.is_dir() == file:
        raise UserError(f"--out: {out} is {'a folder' if out.is_dir() else 'a file'}; expected {what}")
    parent = out if out.is_dir() else out.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise UserError(f"--out: {out}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK) or _read_only(parent):
        raise UserError(f"--out: {out}: {parent} is not writable (read-only or no permission); write elsewhere")


def check_out_is_no_input(args: argparse.Namespace, out: Path) -> None:
    """``--out`` is none of the command's inputs (``fit-predictor T.csv --from P --out P`` replaced the source
    predictor with the transfer fit): the same path, through links or not."""
    if not out.exists():
        return
    for field, (flag, what) in INPUTS.get(args.command, {}).items():
        given = getattr(args, field, None)
        for value in given if isinstance(given, (list, tuple)) else [given]:
            if not isinstance(value, str) or not value:
                continue
            kind, sep, rest = value.partition(":")  # --init model:DIR, --distill-from supernet:CKPT
            path = Path(rest if sep and kind in ("model", "supernet") else value)
            try:
                same = path.exists() and os.path.samefile(path, out)
            except OSError:
                same = False
            if same:
                raise UserError(f"--out {out}: is the source {what} ({flag} {value}); writing there would overwrite what "
                                "the command reads: choose another --out")


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
        raise UserError(timing_names(str(e), flag)) from None


def timing_names(text: str, target: str = "--timing-target") -> str:
    """A latency-library message with the timing target's flag names (``--device`` -> ``target``, ``--threads`` ->
    ``--timing-threads``)."""
    return re.sub(r"--threads\b", "--timing-threads", re.sub(r"--device\b", target, text))


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
