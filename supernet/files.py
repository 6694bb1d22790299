"""Writing files so that a crash, a kill or a full disk never leaves a half file, and checking that
an artifact folder is one whole.

* :func:`atomic_write` (and :func:`atomic_stream`, for a file written piece by piece) writes beside the
  target, fsyncs and renames over it: the target is the old file or the new one, never a mix; a failed
  write (a full disk, Ctrl-C) removes its temporary file.  The temporary file has a new, unpredictable
  name made with ``O_EXCL`` (:func:`temp_file`): a file or link planted beside the target under any
  name is never opened, so a link never leads a write to its target.  The new
  file has the mode an ``open()`` would give it (0666 less the umask), or the mode of the file it
  replaces (:func:`file_mode`); folders made to be published get 0777 less the umask (:func:`temp_dir`).
* An artifact folder (an exported model, a predictor) lists the sha256 of each of its parts in its
  manifest (the model card, ``predictor.json``), written last.  :func:`checksums` makes that list,
  :func:`check_parts` checks it at load, and refuses a part the manifest does not list (an output of
  an earlier run, or of a run killed before it wrote its manifest); :func:`remove_stale` removes
  the outputs a run is about to write before it writes any, so a rerun into a folder never leaves
  the previous run's files beside the new ones.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import hashlib
import json
import os
import shutil
import stat
import tempfile
import zlib
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable, Iterator

from search_spaces import UserError
from search_spaces.errors import first_line


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_problem(path: str | Path) -> str | None:
    """Why ``path`` is no regular file to read, in words for a one-line refusal (None: it is one): "no such file", "a
    link to a missing file", "a folder", "not a regular file (a FIFO, a socket or a device)" (a FIFO would block, a
    device never end), or the system's reason (permission denied).  Read the file after this, and a file another run
    removed or renamed meanwhile is :func:`read_bounded`'s "no such file (... moved or renamed meanwhile?)"."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "a link to a missing file" if os.path.islink(path) else "no such file"
    except OSError as e:
        return (e.strerror or str(e)).lower()
    if stat.S_ISDIR(st.st_mode):
        return "a folder"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file (a FIFO, a socket or a device)"
    return None


def read_bounded(path: str | Path, limit: int, what: str, gunzip: bool = False) -> bytes:
    """The bytes of a user's file, at most ``limit`` of them; with ``gunzip``, gunzipped when it starts with gzip's
    magic (else as they are).  A file that is not a regular file (a FIFO would block, ``/dev/zero`` never ends) or
    that holds, or decompresses to, more than ``limit`` bytes (a gzip bomb: a few kilobytes that expand into
    gigabytes) is refused before more is read, and a damaged or truncated gzip stream (``zlib.error``, ``EOFError``)
    is a ``ValueError`` naming the file, like every other refusal here."""
    path = Path(path)
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            kind = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file (a FIFO or a device)"
            raise ValueError(f"{path}: {kind}; expected {what}")
        with open(path, "rb") as f:
            if gunzip and f.read(2) == b"\x1f\x8b":
                f.seek(0)
                with gzip.GzipFile(fileobj=f) as g:
                    data = g.read(limit + 1)
                how = "decompresses to"
            else:
                f.seek(0)
                data = f.read(limit + 1)
                how = "holds"
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file (expected {what}; was it moved or renamed meanwhile?)") from None
    except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
        why = getattr(e, "strerror", None) or first_line(e)
        raise ValueError(f"{path}: not a readable {what.removeprefix('a ').removeprefix('an ')}"
                         f"{' (gzip or plain)' if gunzip else ''}: {why}") from None
    if len(data) > limit:
        raise ValueError(f"{path}: {how} more than {limit:,} bytes; {what} here is at most {limit:,}")
    return data


def umask() -> int:
    """The process's umask: read from ``/proc`` where there is one (reading changes nothing), else set and restored."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode(path: str | Path) -> int:
    """The permission bits a file written at ``path`` gets: those of the regular file it replaces (a 0644 file stays
    0644), else what ``open()`` gives a new file, 0666 less the umask (``mkstemp``'s 0600 is for secrets)."""
    try:
        st = os.lstat(path)
    except OSError:
        return 0o666 & ~umask()
    return stat.S_IMODE(st.st_mode) if stat.S_ISREG(st.st_mode) else 0o666 & ~umask()


def temp_file(path: str | Path, suffix: str = ".tmp") -> tuple[int, str]:
    """(fd, name) of a new temporary file beside ``path`` with the mode ``path`` will have (:func:`file_mode`)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    try:
        os.fchmod(fd, file_mode(path))
    except BaseException:
        os.close(fd)
        Path(tmp).unlink(missing_ok=True)
        raise
    return fd, tmp


def temp_dir(prefix: str, parent: str | Path) -> Path:
    """A new folder in ``parent`` to be filled and then published by a rename: 0777 less the umask (``mkdtemp``'s 0700
    would leave the published folder readable by its owner only)."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    os.chmod(tmp, 0o777 & ~umask())
    return tmp


@contextlib.contextmanager
def atomic_stream(path: str | Path) -> Iterator[BinaryIO]:
    """A binary file to write ``path`` through, piece by piece, whole or not at all: a new temporary file beside it
    (:func:`temp_file`: a unique name, ``O_EXCL``), fsynced and renamed over ``path`` when the block ends; removed when
    the block or the rename raises (an error, Ctrl-C, a full disk), so nothing is left beside the target."""
    path = Path(path)
    fd, tmp = temp_file(path)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError) and not e.filename:
            e.filename = str(path)  # name the file in the one-line error
        raise


def atomic_write(path: str | Path, data: bytes | str | Callable[[BinaryIO], None]) -> Path:
    """Write ``data`` (bytes, text, or a function that writes into a binary file) to ``path`` whole or not
    at all (:func:`atomic_stream`: a temporary file beside it, fsync, rename over the target; removed again if
    anything fails).  The file gets the mode of the one it replaces, else 0666 less the umask (:func:`file_mode`)."""
    with atomic_stream(path) as f:
        if callable(data):
            data(f)
        else:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
    return Path(path)


def publish_dir(tmp: Path, target: Path, valid: Callable[[Path], bool]) -> None:
    """Move the finished folder ``tmp`` to ``target`` in one rename.  Processes that build the same cache at
    once (the ranks of a distributed run) race here: a ``target`` that is ``valid`` was published by one of
    them and is kept, never removed while another may be reading it; an invalid one (damaged, an older
    format) is renamed aside first, atomically, and only then removed."""
    if target.exists() and not valid(target):
        aside = Path(tempfile.mkdtemp(prefix=f".{target.name}.old.", dir=target.parent))
        try:
            os.replace(target, aside / target.name)
        except FileNotFoundError:  # another process moved it first
            pass
        shutil.rmtree(aside, ignore_errors=True)
    try:
        os.replace(tmp, target)
    except OSError:  # a non-empty target: another process published first, which is fine if it is whole
        if not valid(target):
            raise


def atomic_write_json(path: str | Path, data: Any, **dump: Any) -> Path:
    return atomic_write(path, json.dumps(data, indent=2, **dump) + "\n")


def atomic_write_csv(path: str | Path, fields: list[str], rows: Iterable[dict]) -> Path:
    """A CSV (header + ``rows``), written whole or not at all."""
    import csv
    import io

    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(fields))
    w.writeheader()
    w.writerows(rows)
    return atomic_write(path, buf.getvalue())


def atomic_save_tensors(path: str | Path, tensors: dict, metadata: dict[str, str] | None = None) -> Path:
    """A safetensors file, written whole or not at all (``safetensors.torch.save_file`` itself makes a 0600 file in place)."""
    from safetensors.torch import save

    return atomic_write(path, save(tensors, metadata=metadata))


def atomic_savefig(fig, path: str | Path) -> Path:
    """A Matplotlib figure saved (format from the suffix) whole or not at all."""
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format=Path(path).suffix.lstrip(".") or "png")
    return atomic_write(path, buf.getvalue())


def check_room(folder: Path, need: int, what: str) -> None:
    """Raise ``OSError(ENOSPC)`` naming ``folder`` before writing ``need`` bytes there when the disk has less free:
    some writers (ONNX's protobuf) abort the whole process on a full disk instead of raising."""
    free = shutil.disk_usage(folder).free
    if need > free:
        raise OSError(errno.ENOSPC, f"No space left on device: {what} needs about {need / 2**20:,.1f} MB, "
                                    f"{free / 2**20:,.1f} MB are free", str(folder))


def checksums(folder: Path, names: Iterable[str]) -> dict[str, str]:
    """``{name: sha256}`` of the parts ``names`` of ``folder`` (the manifest's ``files``)."""
    return {name: sha256_file(folder / name) for name in names}


def check_part(folder: Path, name: str, expected: str, manifest: str) -> Path:
    """``folder/name`` is there and its sha256 is ``expected`` (what ``manifest``, a phrase naming it, lists)."""
    path = folder / name
    if not path.is_file():
        raise UserError(f"{path}: missing ({manifest} lists it)")
    actual = sha256_file(path)
    if actual != expected:
        raise UserError(
            f"{path}: checksum {actual[:12]}... does not match {manifest} ({expected[:12]}...): the file was modified or "
            "replaced, or comes from another run; write the folder again"
        )
    return path


def check_parts(folder: Path, files: dict[str, str], manifest: Path, known: Iterable[str] = ()) -> None:
    """Every part the manifest lists is there with its checksum; no part of the ``known`` set lies there unlisted."""
    for name, expected in files.items():
        check_part(folder, name, expected, manifest.name)
    stale = sorted(n for n in known if n not in files and (folder / n).exists())
    if stale:
        raise UserError(
            f"{folder / stale[0]}: not listed in {manifest.name} (left by another run, or by a run that was interrupted): "
            "write the folder again, or remove the file"
        )


def remove_stale(folder: Path, names: Iterable[str]) -> None:
    """Remove the outputs ``names`` of an earlier run from ``folder`` before a run writes its own."""
    for name in names:
        (folder / name).unlink(missing_ok=True)
