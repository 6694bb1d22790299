"""The one exception type for mistakes in what a user gave us.

Every layer raises :class:`UserError` (or a subclass) where user input enters:
a file, a field, a flag.  The CLI prints its message as is and exits with
status 2; anything else is a bug and keeps its traceback.  A value quoted in a message goes through
:func:`shown`, which cuts it: a message is a line, never the megabytes a user's file may hold.
"""

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
