"""One registry idiom for everything the toolkit looks up by name: attention types, tasks, devices, latency
predictors, search strategies and commands (the timm / Optuna shape).

* **register at the definition**: ``@DEVICES.register`` on a class, ``TYPES.register(SomeType())`` beside an object,
  ``COMMANDS.register(module)`` for a command module; the name is the object's ``name`` (a predictor's ``kind``, a
  command module's ``NAME``) unless one is given;
* **list**: :meth:`Registry.names`, :meth:`Registry.all` (in registration order);
* **create by name**: :meth:`Registry.get` (one line naming the flag or field and the known names otherwise);
* **duplicates refused**: a second, different definition under a name already taken is a ``ValueError`` (the same
  definition again, as a module reloaded, replaces it);
* **plugins**: on first use the registry imports every module that installed packages declare under its entry-point
  ``group`` (``[project.entry-points."nas_transformers.devices"]`` and so on); where none is declared (an install made
  before the entry point existed) it imports its ``builtin`` package by name.

Tests that add an entry of their own remove it with :meth:`Registry.unregister`.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any, Callable, Generic, Iterator, TypeVar

from .errors import UserError
from .plugins import load_entry_points

T = TypeVar("T")
# one lock for every registry's first load: another thread waits for the plugins (rather than reading a registry half
# filled); the loading thread itself may look entries up while they load (reentrant)
_LOADING = threading.RLock()


def _definition(obj: Any) -> tuple[str, str]:
    """What identifies a definition across a reload: the class's module and qualified name (an instance: its class's)."""
    cls = obj if isinstance(obj, type) else type(obj)
    return cls.__module__, cls.__qualname__


class Registry(Generic[T]):
    """Named entries of one ``kind`` (``"device"``, ``"task"``, ...), filled at their definitions and from plugins."""

    def __init__(self, kind: str, group: str | None = None, builtin: str | None = None,
                 check: Callable[[str, T], None] | None = None, flag: str | None = None, key: str = "name"):
        self.kind, self.group, self.builtin, self.check, self.key = kind, group, builtin, check, key
        self.flag = flag or f"--{kind.replace(' ', '-')}"  # what a refusal names by default
        self._items: dict[str, T] = {}
        self._loaded = group is None and builtin is None
        self._loading = False

    # ------------------------------------------------------------------ registering

    def register(self, obj: T | None = None, *, name: str | None = None) -> Any:
        """Add ``obj`` under ``name`` (default its attribute named by the registry's ``key``: ``name``, ``kind`` or
        ``NAME``); returns it, so that it works as a decorator, bare (``@R.register``) or with a name
        (``@R.register(name="x")``)."""

        def add(o: T) -> T:
            key = name or getattr(o, self.key, None)
            if not isinstance(key, str) or not key or key != key.strip() or " " in key:
                raise ValueError(f"{self.kind} name {key!r}: expected a non-empty word without spaces")
            old = self._items.get(key)
            if old is not None and old is not o and _definition(old) != _definition(o):
                raise ValueError(f"{self.kind} {key!r} is registered twice ({'.'.join(_definition(old))}, "
                                 f"{'.'.join(_definition(o))})")
            if self.check is not None:
                self.check(key, o)
            self._items[key] = o
            return o

        return add if obj is None else add(obj)

    def unregister(self, name: str) -> None:
        """Remove an entry (tests that add one of their own)."""
        self._items.pop(name, None)

    # ------------------------------------------------------------------ looking up

    def load(self) -> None:
        """Import the plugins once: the entry points of ``group``, else the ``builtin`` package.  Thread-safe: a
        thread that asks while another loads waits for it."""
        if self._loaded:
            return
        with _LOADING:
            if self._loaded or self._loading:  # loaded meanwhile, or a plugin of this thread's load looking itself up
                return
            self._loading = True
            try:
                declared = load_entry_points(self.group) if self.group else False
                if not declared and self.builtin:
                    importlib.import_module(self.builtin)
            finally:  # a failed import is tried again on the next use, not taken for an empty registry
                self._loading = False
            self._loaded = True

    def all(self) -> dict[str, T]:
        """Every entry by name, in registration order (the plugins loaded first)."""
        self.load()
        return self._items

    def names(self) -> list[str]:
        return list(self.all())

    def get(self, name: Any, where: str | None = None) -> T:
        """The entry called ``name``; one line naming ``where`` (default the registry's flag) and the names known."""
        items = self.all()
        if not isinstance(name, str) or name not in items:
            raise UserError(f"{where or self.flag}: {name!r} is not a {self.kind} (known: {', '.join(items) or 'none'})")
        return items[name]

    def __getitem__(self, name: str) -> T:
        return self.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self.all()

    def __iter__(self) -> Iterator[str]:
        return iter(list(self.all()))

    def __len__(self) -> int:
        return len(self.all())
