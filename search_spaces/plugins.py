"""Plugins: the packages that declare attention types and tasks under an entry-point group."""

from __future__ import annotations


def load_entry_points(group: str) -> bool:
    """Import every module the installed packages declare under the entry-point ``group``; whether any is declared."""
    from importlib.metadata import entry_points

    found = entry_points(group=group)
    for ep in found:
        ep.load()
    return bool(found)
