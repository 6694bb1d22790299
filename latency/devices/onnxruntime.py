"""``onnxruntime``: the static model exported to ONNX (opset 23), run by ONNX Runtime with all
graph optimizations; ``provider`` ``cpu`` (default) or ``cuda`` when onnxruntime-gpu is installed.

A ``decode`` workload runs the decode-step graph (:func:`latency.onnx_graphs.cached_decode_graph`,
stitched from generic parts, the inputs and outputs of :mod:`supernet.onnx_decode`: token, position
and the past states in; logits and the present states out, as a generation loop runs it) on inputs
of ``context`` tokens seen (:func:`latency.timing_core.decode_inputs`), the same inputs every call."""

from __future__ import annotations

from search_spaces import UserError, Workload

from ..device import host_fingerprint
from ..onnx_graphs import cached_decode_graph, cached_graph
from ..timing_core import Runner, check_clock, decode_inputs, ort_runner, ort_session, prefill_tokens

PROVIDERS = ("cpu", "cuda")


class OnnxRuntime:
    name = "onnxruntime"
    needs_weights = False  # prepare() takes a meta-device model: the graph's weights are drawn in the session

    def __init__(self, threads: int | None = None, provider: str = "cpu", clock: str = "wall"):
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
        try:
            check_clock(clock, threads)
        except ValueError as e:
            raise UserError(str(e)) from None
        if clock == "cpu" and provider != "cpu":
            raise UserError("--clock cpu: only with --provider cpu (a GPU's work is not this thread's CPU time)")
        self.threads, self.provider, self.clock, self.ort = threads, provider, clock, ort

    def fingerprint(self) -> dict:
        import torch

        from supernet.onnx_export import DEFAULT_OPSET

        fp = {
            **host_fingerprint(),
            "device": "onnxruntime",
            "runtime": f"onnxruntime-{self.provider}",
            "onnxruntime": self.ort.__version__,
        }
        fp.update(
            threads=self.threads or "default",
            clock=self.clock,
            opset=DEFAULT_OPSET,
            exporter_torch=torch.__version__,
            graph_optimization="all",
        )
        if self.provider == "cuda":
            from .cuda import gpu_fingerprint

            fp.update(gpu_fingerprint())
        return fp

    def prepare(self, model, workload: Workload) -> Runner:
        if workload.kind == "decode":
            graph, tensors, layout = cached_decode_graph(model)
            feed = decode_inputs(layout, workload.batch_size, workload.context)
        else:
            graph, tensors = cached_graph(model)
            feed = prefill_tokens(model.config.vocab_size, workload.batch_size, workload.seq_len)
        session = ort_session(str(graph), tensors, threads=self.threads, provider=self.provider)
        return ort_runner(session, feed, self.clock)


DEVICE = OnnxRuntime
