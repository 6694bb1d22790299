"""One file per device; each defines ``DEVICE`` (see :mod:`latency.device`)."""

from ..device import Device, available, get_device

__all__ = ["Device", "available", "get_device"]
