"""The device interface: a small Protocol, and a registry in which a device is one file.

A device turns a static model and a workload into a *runner* (``runner(n) -> seconds``, see
:mod:`latency.timing_core`) and describes itself with a *fingerprint*: everything that makes
its timings comparable (CPU model and cores, GPU and driver, library versions, threads,
runtime).  Devices live in ``latency/devices/<name>.py``; each module defines ``DEVICE``, a
class whose constructor takes the device's options as keyword arguments.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from typing import Any, Protocol

from search_spaces import UserError, Workload

from .timing_core import Runner, host_facts

# Keys of a fingerprint that describe the run, not the device: shown, never compared.
INFORMATIONAL = ("hostname", "created", "command")


class Device(Protocol):
    name: str

    def fingerprint(self) -> dict[str, Any]:
        """What makes this device's timings comparable (compared on resume and by predictors)."""
        ...

    def prepare(self, model, workload: Workload) -> Runner:
        """A runner of ``model`` (a static :class:`supernet.Transformer`) on ``workload``'s input."""
        ...


def host_fingerprint() -> dict[str, Any]:
    """The facts of the host every device shares: OS, machine, CPU model and core count."""
    return host_facts()


def available() -> list[str]:
    from pathlib import Path

    # arm (a bundle run on the board) and its runner are not in-process timing devices
    return sorted(
        m.name
        for m in pkgutil.iter_modules([str(Path(__file__).parent / "devices")])
        if not m.name.startswith("_") and m.name not in ("arm", "bundle_main")
    )


def get_device(name: str, **options: Any) -> Device:
    """The device ``name`` (``cpu``, ``cuda``, ``onnxruntime``, ...) built with ``options``; a
    :class:`UserError` names an unknown device or an option it does not take."""
    names = available()
    if name not in names:
        raise UserError(f"--device: {name!r} is not a device (available: {', '.join(names)}, arm --bundle FILE, ssh://user@host)")
    cls = importlib.import_module(f"latency.devices.{name}").DEVICE
    accepted = [p for p in inspect.signature(cls).parameters]
    given = {k: v for k, v in options.items() if v is not None}
    unknown = sorted(set(given) - set(accepted))
    if unknown:
        flags = ", ".join("--" + k.replace("_", "-") for k in unknown)
        takes = ", ".join("--" + k.replace("_", "-") for k in accepted) or "no options"
        raise UserError(f"--device {name}: does not take {flags} (it takes {takes})")
    return cls(**given)


def fingerprint_mismatch(stored: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Human lines for every comparable key whose value differs (empty when they agree)."""
    keys = sorted((set(stored) | set(current)) - set(INFORMATIONAL))
    return [f"{k}: file has {stored.get(k)!r}, this run has {current.get(k)!r}" for k in keys if stored.get(k) != current.get(k)]
