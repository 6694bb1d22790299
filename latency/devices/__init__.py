"""One file per device; each defines ``DEVICE`` (see :mod:`latency.device`: the registry, ``get_device``)."""
