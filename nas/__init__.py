"""The ``nas`` command line and the search algorithms."""

__version__ = "0.2.0"  # the one place the version is written: pyproject.toml reads it (setuptools dynamic version)
