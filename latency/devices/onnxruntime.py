"""``onnxruntime``: the static model exported to ONNX (opset 23), run by ONNX Runtime with all
graph optimizations; ``provider`` ``cpu`` (default) or ``cuda`` when onnxruntime-gpu is installed."""

from __future__ import annotations

import time

import numpy as np

from search_spaces import UserError, Workload

from ..device import host_fingerprint
from ..onnx_graphs import cached_graph, open_session
from ..timing_core import Runner

PROVIDERS = ("cpu", "cuda")


class OnnxRuntime:
    name = "onnxruntime"

    def __init__(self, threads: int | None = None, provider: str = "cpu"):
        import onnxruntime as ort

        if provider not in PROVIDERS:
            raise UserError(f"--provider: {provider!r} is not one of {', '.join(PROVIDERS)}")
        if provider == "cuda" and "CUDAExecutionProvider" not in ort.get_available_providers():
            raise UserError(
                f"--provider cuda: this onnxruntime ({ort.__version__}) has no CUDA provider "
                f"(has: {', '.join(ort.get_available_providers())}); install onnxruntime-gpu"
            )
        if threads is not None and threads < 1:
            raise UserError(f"--threads: {threads} is not a positive integer")
        self.threads, self.provider, self.ort = threads, provider, ort

    def fingerprint(self) -> dict:
        import torch

        from supernet.onnx_export import DEFAULT_OPSET

        fp = {**host_fingerprint(), "device": "onnxruntime", "runtime": f"onnxruntime-{self.provider}", "onnxruntime": self.ort.__version__}
        fp.update(threads=self.threads or "default", opset=DEFAULT_OPSET, exporter_torch=torch.__version__, graph_optimization="all")
        if self.provider == "cuda":
            from .cuda import gpu_fingerprint

            fp.update(gpu_fingerprint())
        return fp

    def prepare(self, model, workload: Workload) -> Runner:
        graph, tensors = cached_graph(model)
        session = open_session(graph, tensors, threads=self.threads, provider=self.provider)
        g = np.random.default_rng(0)
        feed = {"tokens": g.integers(0, model.config.vocab_size, (workload.batch_size, workload.seq_len), dtype=np.int64)}

        def run(n: int) -> float:
            start = time.perf_counter()
            for _ in range(n):
                session.run(None, feed)  # returns host arrays: synchronised
            return time.perf_counter() - start

        return run


DEVICE = OnnxRuntime
