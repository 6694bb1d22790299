"""``cpu``: the static model in torch eager mode on the CPU, ``threads`` intra-op threads,
timed by the wall clock or (``clock="cpu"``, one thread) by the thread's CPU time.

A ``decode`` workload times one decode step (:func:`supernet.decode.step`, what ``decode_step``
runs): one new token per sequence at position ``context`` with a cache of ``context`` tokens
(random, :func:`supernet.decode.synthetic_cache`), built once.  Every repeat starts from that same
cache: growing key/value buffers get the same slot rewritten, window and linear states are
returned anew and dropped, so each repeat sees the same context."""

from __future__ import annotations

import torch

from search_spaces import UserError, Workload, tasks

from ..device import CLOCK, THREADS, host_fingerprint, register_device
from ..timing_core import Runner, call_runner, check_clock


def workload_tokens(model, workload: Workload, device: str = "cpu") -> torch.Tensor:
    """Fixed token ids (batch, seq) for timing; the values do not matter, the shape does."""
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, model.config.vocab_size, (workload.batch_size, workload.seq_len), generator=g)  # (B, T)
    return tokens.to(device)


def torch_runner(call, clock: str = "wall") -> Runner:
    """The protocol's runner of a torch call: ``n`` calls (:func:`latency.timing_core.call_runner`) under inference
    mode, timed by ``clock`` (seconds)."""
    return torch.inference_mode()(call_runner(call, clock))


def decode_setup(model, workload: Workload, device: str = "cpu"):
    """``(call, cache)`` for timing one decode step at ``workload.context``: ``call()`` runs it, logits (B, 1, V)."""
    from supernet.decode import step, synthetic_cache

    g = torch.Generator().manual_seed(0)
    cache = synthetic_cache(model, workload.batch_size, workload.context, generator=g)
    cache.layers = [{k: t.to(device) for k, t in layer.items()} for layer in cache.layers]
    token = torch.randint(0, model.config.vocab_size, (workload.batch_size, 1), generator=g).to(device)  # (B, 1)
    pos = torch.tensor([workload.context], device=device)  # (1,): made once (no host copy inside a CUDA graph)

    def call():
        return step(model, token, pos, cache.layers, length=cache.valid)[0]  # the new states are dropped (a memory: bounded)

    return call, cache


def torch_call(model, workload: Workload, device: str = "cpu", runtime: str = "eager"):
    """``call()`` running ``model`` once on ``workload``: a prefill (one forward pass over fixed tokens), a decode
    step (:func:`decode_setup`), or a workload kind a task adds (the task's ``torch_call``)."""
    if workload.kind == "decode":
        return decode_setup(model, workload, device)[0]
    if workload.kind == "prefill":
        tokens = workload_tokens(model, workload, device)
        return lambda: model(tokens)
    return tasks.owning(workload.kind).torch_call(model, workload, device, runtime)


@register_device
class CPU:
    name = "cpu"
    flags = (THREADS, CLOCK)
    precisions = ("fp32",)

    def __init__(self, threads: int | None = None, clock: str = "wall"):
        if threads is not None and threads < 1:
            raise UserError(f"--threads: {threads} is not a positive integer")
        self.threads = threads or torch.get_num_threads()
        try:
            check_clock(clock, self.threads)
        except ValueError as e:
            raise UserError(str(e)) from None
        self.clock = clock
        torch.set_num_threads(self.threads)  # process-wide: this process times one device

    def fingerprint(self) -> dict:
        return {
            **host_fingerprint(),
            "device": "cpu",
            "runtime": "torch-eager",
            "torch": torch.__version__,
            "threads": self.threads,
            "clock": self.clock,
        }

    def prepare(self, model, workload: Workload) -> Runner:
        return torch_runner(torch_call(model.eval(), workload), self.clock)

