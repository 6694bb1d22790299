"""The one exception type for mistakes in what a user gave us.

Every layer raises :class:`UserError` (or a subclass) where user input enters:
a file, a field, a flag.  The CLI prints its message as is and exits with
status 2; anything else is a bug and keeps its traceback.  A value quoted in a message goes through
:func:`shown`, which cuts it: a message is a line, never the megabytes a user's file may hold.  Any text that may
hold a URL (a storage URL, a device URL, a library's error about one) goes through :func:`hide_password` before it
is said or written: ``postgresql://alice:S3cret@host/db`` is shown as ``postgresql://alice:***@host/db``.  A text
a user chose (a class name, a file name) printed as one field of a tab-separated line goes through
:func:`tsv_field`.
"""

import re
import reprlib

_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxlist, _SHOWN.maxtuple, _SHOWN.maxdict, _SHOWN.maxset = 2, 6, 6, 4, 4
_SHOWN.maxstring, _SHOWN.maxother, _SHOWN.maxlong = 60, 60, 40


class UserError(Exception):
    """A problem with the user's input, stated in one or more self-contained lines."""


class SpaceError(UserError):
    """A search-space file failed validation. ``errors`` lists every problem found."""

    MAX_LINES = 10  # every problem is found; a file of 20,000 bad entries is not 20,000 lines

    def __init__(self, errors: list[str]):
        self.errors = list(errors)
        shown_lines = self.errors[:self.MAX_LINES]
        if len(self.errors) > self.MAX_LINES:
            shown_lines.append(f"(and {len(self.errors) - self.MAX_LINES:,} more problems of the same file)")
        super().__init__("\n".join(shown_lines))


class SubnetError(UserError):
    """A subnet is malformed or not a member of the space it is used with."""


def shown(value: object) -> str:
    """``repr(value)`` cut to a few dozen characters (``[1, 2, ...]``, ``'aaaa...aaaa'``), in bounded time: the repr
    of a huge value is never built."""
    return _SHOWN.repr(value)


def first_line(e: BaseException, limit: int = 200) -> str:
    """The first non-empty line of an exception's message (a library's error may have none: an empty file)."""
    lines = [line for line in str(e).splitlines() if line.strip()]
    return lines[0][:limit] if lines else "no message"


# scheme://user:password@ (everything between the user's colon and the last @ of the word: an unescaped @ or : in the
# password is hidden too)
_CREDENTIALS = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/?#@:'\"]*):(?P<secret>[^\s'\"]*)@")


def hide_password(text: str, *urls: str) -> str:
    """``text`` with the password of every ``scheme://user:password@host`` in it replaced by ``***`` (the form
    SQLAlchemy's ``render_as_string(hide_password=True)`` writes); the passwords of ``urls`` (the URLs the text may
    be about) are hidden wherever else they appear in it too (a driver's error may quote one on its own)."""
    out = _CREDENTIALS.sub(lambda m: f"{m['head']}:***@", str(text))
    for url in urls:
        m = _CREDENTIALS.search(str(url))
        if m and m["secret"]:
            out = out.replace(m["secret"], "***")
    return out


_TSV_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def tsv_field(text: str) -> str:
    """``text`` as one field of a tab-separated line: a backslash, tab, newline or carriage return written as
    ``\\\\``, ``\\t``, ``\\n``, ``\\r`` (so a class named ``a<TAB>b`` stays one field, and a line stays one line)."""
    return str(text).translate(_TSV_ESCAPES)
