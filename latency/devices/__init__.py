"""The built-in devices, one file each, registered at their definitions (:func:`latency.device.register_device`):
importing this package registers them.  ``arm`` (a bundle run on a board) and ``bundle_main`` (the bundle's runner)
are not in-process devices."""

from . import cpu, cuda, onnxruntime  # noqa: F401  (importing registers them)
