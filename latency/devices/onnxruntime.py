"""``onnxruntime``: the static model exported to ONNX (opset 23), run by ONNX Runtime with all
graph optimizations; ``provider`` ``cpu`` (default) or ``cuda`` when onnxruntime-gpu is installed.

A ``decode`` workload runs the decode-step graph (:func:`latency.onnx_graphs.cached_decode_graph`,
stitched from generic parts, the inputs and outputs of :mod:`supernet.onnx_decode`: token, position
and the past states in; logits and the present states out, as a generation loop runs it) on inputs
of ``context`` tokens seen (:func:`latency.timing_core.decode_inputs`), the same inputs every call.

A workload kind a task adds runs the task's own runner (``Task.ort_runner``: the translation task's ``translate``
runs HAT's loop on an encoder-decoder's two graphs).

``precision`` ``int8-dynamic`` / ``int8-static`` / ``int8-smooth`` / ``int8-outlier`` (:mod:`latency.quantize`)
quantizes the graph, with its weights, the way an export is quantized (ONNX Runtime's basic optimizations, then its
quantizer; the static ranges and the outlier-aware precisions' channel statistics are calibrated on the timed input
itself: timing does not depend on the values, and int8-outlier's fp32 channels are a fixed count) before the session
opens it."""

from __future__ import annotations

from search_spaces import UserError, Workload, tasks
from search_spaces.flags import Flag
from search_spaces.space import WORKLOAD_KINDS

from ..device import CLOCK, THREADS, host_fingerprint, register_device
from ..onnx_graphs import cached_decode_graph, cached_graph
from ..timing_core import Runner, check_clock, decode_inputs, ort_runner, ort_session, prefill_tokens

PROVIDERS = ("cpu", "cuda")
PROVIDER = Flag("--provider", "provider", str, "NAME", "the execution provider of an onnxruntime timing target: cpu or "
                "cuda", ("measure-latency", "export"), option="provider")


@register_device
class OnnxRuntime:
    name = "onnxruntime"
    flags = (THREADS, CLOCK, PROVIDER)
    # INT8 with the CPU provider (ONNX Runtime's quantizer; the outlier-aware two: latency.quantize)
    precisions = ("fp32", "int8-dynamic", "int8-static", "int8-smooth", "int8-outlier")
    needs_weights = False  # prepare() takes a meta-device model: the graph's weights are drawn in the session

    def __init__(self, threads: int | None = None, provider: str = "cpu", clock: str = "wall", precision: str = "fp32"):
        import onnxruntime as ort

        from ..quantize import check_device, check_precision

        precision = check_precision(precision)
        check_device(precision, "onnxruntime", provider)
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
        self.threads, self.provider, self.clock, self.ort, self.precision = threads, provider, clock, ort, precision

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
        if self.precision != "fp32":  # absent at fp32: tables measured before precisions existed stay comparable
            fp["precision"] = self.precision
        if self.provider == "cuda":
            from .cuda import gpu_fingerprint

            fp.update(gpu_fingerprint())
        return fp

    def prepare(self, model, workload: Workload) -> Runner:
        if workload.kind not in WORKLOAD_KINDS:  # a workload kind of a task's own: the task's runner
            return tasks.owning(workload.kind).ort_runner(model, workload, self.threads, self.provider, self.clock,
                                                          self.precision)
        graph, tensors, feed = timing_graph(model, workload)
        quantize = None
        if self.precision != "fp32":
            from ..quantize import quantized_copy

            def quantize(path: str, folder: str) -> str:
                return quantized_copy(path, folder, self.precision, [feed])

        from supernet.attention.ort_ops import register_if_used  # a graph exported with --custom-ops: their library

        session = ort_session(str(graph), tensors, threads=self.threads, provider=self.provider, transform=quantize,
                              register=register_if_used)
        return ort_runner(session, feed, self.clock)

    def prepare_file(self, path, feed: dict) -> Runner:
        """A runner of an exported ONNX file itself (``nas export --timing-target``: what ships is what is timed) on
        ``feed``; the CPU provider (:func:`latency.measure.measure_model` asks only then)."""
        from supernet.onnx_export import onnx_session

        return ort_runner(onnx_session(path, threads=self.threads), feed, self.clock)


def timing_graph(model, workload: Workload) -> tuple:
    """(weight-stripped graph, its weight layout, the input fed at every call) of ``model`` at ``workload``."""
    if workload.kind == "decode":
        graph, tensors, layout = cached_decode_graph(model)
        return graph, tensors, decode_inputs(layout, workload.batch_size, workload.context)
    graph, tensors = cached_graph(model)
    return graph, tensors, prefill_tokens(model.config.vocab_size, workload.batch_size, workload.seq_len)

