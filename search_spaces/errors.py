"""The one exception type for mistakes in what a user gave us.

Every layer raises :class:`UserError` (or a subclass) where user input enters:
a file, a field, a flag.  The CLI prints its message as is and exits with
status 2; anything else is a bug and keeps its traceback.
"""


class UserError(Exception):
    """A problem with the user's input, stated in one or more self-contained lines."""


class SpaceError(UserError):
    """A search-space file failed validation. ``errors`` lists every problem found."""

    def __init__(self, errors: list[str]):
        self.errors = list(errors)
        super().__init__("\n".join(self.errors))


class SubnetError(UserError):
    """A subnet is malformed or not a member of the space it is used with."""


def first_line(e: BaseException, limit: int = 200) -> str:
    """The first non-empty line of an exception's message (a library's error may have none: an empty file)."""
    lines = [line for line in str(e).splitlines() if line.strip()]
    return lines[0][:limit] if lines else "no message"
