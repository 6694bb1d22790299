"""``cuda``: the static model on an NVIDIA GPU, ``runtime`` ``eager``, ``cudagraph`` or ``compile``.

A small model at batch 1 is launch-bound in eager mode: ``cudagraph`` captures the whole
forward once and replays it (one launch), ``compile`` runs ``torch.compile`` (inductor,
without CUDA graphs).  Timing: CUDA events recorded around ``n`` back-to-back calls, read
after ``torch.cuda.synchronize()``.

A workload kind a task adds (the translation task's ``translate``) runs the cpu device's call
(:func:`latency.devices.cpu.torch_call`, the task's loop) on the GPU.
"""

from __future__ import annotations

import subprocess

import torch

from search_spaces import UserError, Workload
from search_spaces.flags import Flag
from supernet.attention.registry import fast_paths

from ..device import host_fingerprint, register_device
from ..timing_core import Runner
from .cpu import torch_call

RUNTIMES = ("eager", "cudagraph", "compile")


def gpu_fingerprint(index: int = 0) -> dict:
    props = torch.cuda.get_device_properties(index)
    try:
        driver = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader", f"--id={index}"],
            capture_output=True, text=True, timeout=10,
        ).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        driver = "unknown"
    return {
        "gpu": props.name,
        "gpu_memory_gb": round(props.total_memory / 2**30, 1),
        "gpu_capability": f"{props.major}.{props.minor}",
        "driver": driver,
        "cuda": torch.version.cuda,
    }


RUNTIME = Flag("--runtime", "runtime", str, "RUNTIME", "how a cuda timing target runs the model: eager, cudagraph or "
               "compile", ("measure-latency", "export"), option="runtime")


@register_device
class CUDA:
    name = "cuda"
    flags = (RUNTIME,)
    precisions = ("fp32",)

    def __init__(self, runtime: str = "eager", gpu: int = 0):
        if runtime not in RUNTIMES:
            raise UserError(f"--runtime: {runtime!r} is not one of {', '.join(RUNTIMES)}")
        if not torch.cuda.is_available():
            raise UserError(
                f"--device cuda: no CUDA GPU is visible to torch {torch.__version__} (torch.cuda.is_available() is False)"
            )
        if not 0 <= gpu < torch.cuda.device_count():
            raise UserError(f"--gpu: {gpu} is not a GPU index (this machine has {torch.cuda.device_count()})")
        self.runtime, self.gpu = runtime, gpu
        self.device = torch.device("cuda", gpu)

    def fingerprint(self) -> dict:
        fp = {**host_fingerprint(), "device": "cuda", "runtime": f"torch-{self.runtime}", "torch": torch.__version__}
        return {**fp, **gpu_fingerprint(self.gpu)}

    def prepare(self, model, workload: Workload) -> Runner:
        model = model.eval().to(self.device)
        # a decode step: the cache built once, its length reset per step; a task's own kind: its loop, eager
        call = torch_call(model, workload, str(self.device), self.runtime)
        layers = getattr(model.config, "layers", ())
        what = "the model [" + ", ".join(str(layer.attention) for layer in layers) + "]" if layers else "the model"
        step = self._step(call, what)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

        def run(n: int) -> float:
            torch.cuda.synchronize(self.device)
            start.record()
            for _ in range(n):
                step()
            end.record()
            torch.cuda.synchronize(self.device)
            return start.elapsed_time(end) / 1000.0

        return run

    @torch.inference_mode()
    def _step(self, call, what: str = "the model"):
        """A function of no arguments that runs ``call`` once on the runtime; ``compile`` and ``cudagraph`` are
        checked against an eager call (a replay that reads memory the capture did not own gives other numbers,
        or a device-side assert, instead of a timing)."""
        if self.runtime == "eager":
            return torch.inference_mode()(call)
        if self.runtime == "compile":
            # inductor's default mode: kernels fused, no autotuning (max-autotune took minutes per subnet on an
            # H200, most of it in matmul templates that did not fit the GPU's shared memory)
            traced = torch.compile(call, dynamic=False)

            def compiled():
                with fast_paths():  # the types' fast paths, not their export forms (torch 2.11 calls a compile an export)
                    return traced()

            try:
                for _ in range(3):  # compile now, not inside the timed calls
                    out = compiled()
            except Exception as e:  # Inductor's own errors (e.g. torch 2.11's Triton codegen on hydra's running mean)
                first = next((line for line in str(e).splitlines() if line.strip()), type(e).__name__)
                raise UserError(f"--runtime compile: torch {torch.__version__} could not compile {what} ({first}); "
                                "time it with --runtime eager or cudagraph, or leave that type out of the space") from e
            self._check(out, call, what)
            return torch.inference_mode()(compiled)
        # cudagraph: warm up on a side stream (as torch.cuda.graphs requires), capture once, replay
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(3):
                call()
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = call()  # output (and a decode step's new state) stays in the graph's static memory
        try:
            graph.replay()
            torch.cuda.synchronize(self.device)
        except RuntimeError as e:  # a device-side assert: the process's CUDA context is lost, say where
            raise UserError(f"--runtime cudagraph: replaying the captured graph of {what} failed on the GPU "
                            f"({str(e).splitlines()[0]}); time it with --runtime eager") from e  # fmt: skip
        self._check(out, call, what)
        return _Replay(graph, call, out)

    def _check(self, out, call, what: str) -> None:
        got, want = _first_tensor(out).float(), _first_tensor(call()).float()
        err = (got - want).abs().max().item() / max(1.0, want.abs().max().item())
        if not err <= 1e-2:  # the same kernels (compile: fused ones) on the same inputs; NaN fails too
            raise UserError(f"--runtime {self.runtime}: {what} computes other numbers than eager mode (largest "
                            f"difference {err:.2e} of the output's scale); time it with --runtime eager")  # fmt: skip


class _Replay:
    """A captured graph with what it reads and writes: ``call`` (the model's weights, its input tokens, a decode
    step's cache) and the static output stay alive as long as the graph.  A bare ``graph.replay`` let them go
    when ``prepare`` returned: the next model's weights took their memory, and the replay read them as token
    ids (an H200: "vectorized gather kernel index out of bounds" in the embedding, every campaign)."""

    def __init__(self, graph, call, out):
        self.graph, self.call, self.out = graph, call, out

    def __call__(self) -> None:
        self.graph.replay()


def _first_tensor(out):
    """The logits of a call's output (a prefill's tensor; a decode step's (logits, state))."""
    while isinstance(out, (tuple, list)):
        out = out[0]
    return out

