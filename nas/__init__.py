"""The ``nas`` command line and the search algorithms."""

from search_spaces.version import __version__  # written once, in the lowest layer (pyproject.toml reads it)

__all__ = ["__version__"]
