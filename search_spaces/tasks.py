"""The registry of tasks: what a space's ``task:`` field names, and the one place the layers ask about it.

A task (causal LM, masked LM, translation, ...) is one object in its own folder (``tasks/<name>/``,
:class:`tasks.base.Task`): its space format and genes, data, model parts, loss and metric, latency
workloads and cost features, export artifacts and the extra flags of the commands.  The layers below it
do not import it: they look it up here, by name (:func:`get`) or as the task of a space (:func:`of`), and
call its methods.  Registering a task (:func:`declare`, re-exported as ``tasks.register``) is the only step
that makes it known.

The registry fills itself on first use from the ``nas_transformers.tasks`` entry points (this project
declares its package ``tasks``; another package can add its own tasks the same way).  An install made
before that entry point existed (an editable install of an older checkout) declares none: then the
project's own package is imported by name.

What the space layer reads of a task (:class:`TaskSignature`): ``name``, ``doc``, ``parse_space`` (the
YAML mapping of a space file -> its space object, every problem reported at once), ``describe`` (the lines
``nas space`` prints), the latency workload kinds it adds (``workload_kinds``) and how their records read
back (``workload_from_record``).
"""

from __future__ import annotations

from typing import Any, Protocol

from .errors import UserError
from .registry import Registry

ENTRY_POINTS = "nas_transformers.tasks"
BUILTIN = "tasks"  # the package this project declares under ENTRY_POINTS


class TaskSignature(Protocol):
    """What the space layer knows of a task (the task object itself satisfies it)."""

    name: str
    doc: str
    workload_kinds: tuple[str, ...]  # latency workload kinds of its own (beside the generic prefill and decode)

    def parse_space(self, data: dict, where: str, source: str) -> Any:
        """The space of a YAML mapping whose ``task:`` names this task; :class:`SpaceError` lists every problem."""
        ...

    def describe(self, space: Any) -> str: ...

    def workload_from_record(self, data: dict, where: str) -> Any: ...


def _check(name: str, task: Any) -> None:
    """A task needs a line of doc, and the latency workload kinds it adds are its own."""
    if not getattr(task, "doc", ""):
        raise ValueError(f"task {name!r}: a task needs one line of doc")
    for kind in getattr(task, "workload_kinds", ()):
        owner = next((t for t in TASKS._items.values() if kind in t.workload_kinds and t.name != name), None)  # noqa: SLF001
        if owner is not None:
            raise ValueError(f"task {name!r}: workload kind {kind!r} is task {owner.name!r}'s")


TASKS: Registry[Any] = Registry("task", ENTRY_POINTS, BUILTIN, check=_check, flag="task")


def declare(task: Any) -> Any:
    """Add a task object (a second task of the same name but another class is refused); returns it."""
    return TASKS.register(task)


def withdraw(name: str) -> None:
    """Remove a task (tests that declare one of their own)."""
    TASKS.unregister(name)


def tasks() -> dict[str, Any]:
    """Every registered task by name, loading the installed task packages on first use."""
    return TASKS.all()


def names() -> str:
    """The registered task names (``a, b, ...``), for messages."""
    return ", ".join(tasks())


def with_form(form: str) -> str:
    """The registered tasks whose one-stack model has attention of ``form`` (``causal`` or ``bidirectional``), named
    for messages (``a`` or ``a or b``)."""
    return " or ".join(t.name for t in tasks().values() if getattr(t, "form", None) == form)


def get(name: Any, where: str = "task") -> Any:
    """The task object called ``name``; one line naming ``where`` and the known tasks otherwise."""
    known = tasks()
    if not isinstance(name, str) or name not in known:
        raise UserError(f"{where}: {name!r} is not one of {names()}")
    return known[name]


def of(space: Any) -> Any:
    """The task of a space (its ``task`` field)."""
    return get(space.task, f"{getattr(space, 'source', 'space')}: task")


def refuse_foreign(space: Any, given: dict[str, Any]) -> None:
    """Refuse, in one line, a task flag given (``dest`` -> value) that the space's task does not take: another task's
    (``Task.flags``), named with the task it is for."""
    mine = {f.dest for f in getattr(of(space), "flags", ())}
    for dest, value in given.items():
        if value is None or dest in mine:
            continue
        owners = [(t, f) for t in tasks().values() for f in getattr(t, "flags", ()) if f.dest == dest]
        assert owners, f"{dest}: no task declares this flag"
        flag = owners[0][1]
        why = flag.elsewhere or (f"only for a {' or '.join(t.name for t, _ in owners)} space; {space.source} is task "
                                 f"{space.task}")
        raise UserError(f"{flag.name}: {why}")


def owning(kind: str) -> Any | None:
    """The task that adds the latency workload kind ``kind`` (None for the generic kinds, prefill and decode)."""
    return next((t for t in tasks().values() if kind in getattr(t, "workload_kinds", ())), None)
