"""The package's version, written once: ``nas.__version__`` and pyproject.toml read it (the lowest layer holds it, so
that every layer can stamp what it writes)."""

__version__ = "0.2.0"
