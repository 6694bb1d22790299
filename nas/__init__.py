"""The ``nas`` command line and the search algorithms."""

__version__ = "0.1.0"
