"""The device interface: a small Protocol, and the registry in which a device is one file (or one folder).

A device turns a static model and a workload into a *runner* (``runner(n) -> seconds``, see
:mod:`latency.timing_core`) and describes itself with a *fingerprint*: everything that makes
its timings comparable (CPU model and cores, GPU and driver, library versions, threads,
runtime).  A device is a class registered at its definition (``@register_device``) whose
constructor takes the device's options as keyword arguments; what the commands need to know of
it are attributes of the class (:class:`Device`): ``precisions`` (what ``--precision`` it runs),
``prepare_file`` where it times exported ONNX files themselves (``nas export --timing-target``).
The built-in devices live in ``latency/devices/<name>.py``; a package adds its own through the
``nas_transformers.devices`` entry point (docs/adding-a-device.md).
"""

from __future__ import annotations

import inspect
from typing import Any, Protocol

from search_spaces import UserError, Workload
from search_spaces.flags import Flag
from search_spaces.registry import Registry

from .timing_core import Runner, host_facts

# Keys of a fingerprint that describe the run, not the device: shown, never compared.
INFORMATIONAL = ("hostname", "created", "command")


class Device(Protocol):
    name: str  # what --device / --timing-target call it
    precisions: tuple[str, ...]  # the --precision values it runs (default fp32 only)
    flags: tuple[Flag, ...]  # the option flags it takes (each sets the constructor keyword its ``option`` names)

    def fingerprint(self) -> dict[str, Any]:
        """What makes this device's timings comparable (compared on resume and by predictors)."""
        ...

    def prepare(self, model, workload: Workload) -> Runner:
        """A runner of ``model`` (a static :class:`supernet.Transformer`) on ``workload``'s input."""
        ...


def host_fingerprint() -> dict[str, Any]:
    """The facts of the host every device shares: OS, machine, CPU model and core count."""
    return host_facts()


# The commands that time on a device, and the option flags the built-in devices declare (each device class lists the
# ones it takes in its ``flags``; the CLI adds the union to these commands and passes each as the constructor keyword
# its ``option`` names).
TIMING = ("measure-latency", "search", "export")
THREADS = Flag("--timing-threads", "timing_threads", int, "N", "intra-op threads of the timing target (cpu, onnxruntime)",
               TIMING, option="threads")
CLOCK = Flag("--clock", "clock", str, "CLOCK", "the timing target's clock: wall or cpu (the thread's CPU time; needs "
             "--timing-threads 1)", TIMING, option="clock")


def device_flags(command: str | None = None) -> list[Flag]:
    """The flags the registered devices declare (for ``command``, or all), each once; two devices that declare one
    name must mean the same by it."""
    out: dict[str, Flag] = {}
    for cls in DEVICES.all().values():
        for f in getattr(cls, "flags", ()):
            if command is not None and command not in f.commands:
                continue
            seen = out.setdefault(f.name, f)
            assert (seen.dest, seen.option) == (f.dest, f.option), f"{f.name}: declared twice with other meanings"
    return list(out.values())


DEVICES: Registry[type] = Registry("device", "nas_transformers.devices", "latency.devices", flag="--device")
register_device = DEVICES.register  # @register_device on a device class: it is known by its ``name``


def available() -> list[str]:
    """The registered in-process timing devices (an ARM board is reached through a bundle or ssh, not one of these)."""
    return DEVICES.names()


def device_class(name: str) -> type | None:
    """The registered class of the device ``name``, None for a name that is no registered device (arm, ssh://)."""
    return DEVICES.all().get(name)


def precisions_of(name: str) -> tuple[str, ...]:
    """The precisions the device ``name`` runs (fp32 only where the class says nothing, and for a board)."""
    return tuple(getattr(device_class(name), "precisions", ("fp32",)))


def get_device(name: str, **options: Any) -> Device:
    """The device ``name`` (``cpu``, ``cuda``, ``onnxruntime``, ...) built with ``options``; a
    :class:`UserError` names an unknown device or an option it does not take."""
    names = available()
    if name not in names:
        raise UserError(f"--device: {name!r} is not a device (available: {', '.join(names)}, arm --bundle FILE, ssh://user@host)")
    cls = DEVICES.get(name)
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
