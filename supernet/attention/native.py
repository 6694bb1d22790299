"""Compiled CPU kernels: a fused sliding-window attention for inference (``kernels/window_attention.cpp``).

The block engine (:mod:`.blocks`) runs a window as batched GEMMs and a softmax over a scores buffer;
at 4k tokens, one thread, that is about 10x faster than causal SDPA where local:64 does 32x fewer
FLOPs.  The compiled kernel does scores, softmax and the weighted sum per block of 16 queries in
registers (no scores buffer in memory) and is about 1/3 faster still.  It serves local:W (causal and
bidirectional) and dilated:W:D (one residue stream at a time, read in place) when:

* no gradient is recorded (it has no backward: training runs the engine),
* float32 on the CPU, the CPU runs AVX-512 (torch's CPU capability) and a C++ compiler is found,
* the head size is a multiple of 16 and the value head size one of 16, 32, 48, 64, 128.

Otherwise the engine runs, with the same result to float rounding (tests/test_native_kernels.py).

It is built by ``torch.utils.cpp_extension`` the first time it is needed in a process (about 25 s on
a 2-core machine, once: the build is cached per source and torch version under
``$NAS_KERNEL_CACHE`` or ``~/.cache/nas-transformers/kernels``; concurrent processes wait on
one build).  ``NAS_NATIVE_KERNELS=0`` turns it off; :func:`status` says whether it is in use and why not.
Nothing is downloaded: the source ships with the package.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import warnings
from functools import lru_cache
from pathlib import Path

import torch
from torch import Tensor

ENV_OFF = "NAS_NATIVE_KERNELS"  # "0": never build or use the compiled kernels
ENV_CACHE = "NAS_KERNEL_CACHE"
SOURCE = Path(__file__).with_name("kernels") / "window_attention.cpp"
VALUE_SIZES = (16, 32, 48, 64, 128)

_off = False  # :func:`disabled` (benchmarks compare the engine and the kernel in one process)


def _cache_dir() -> Path:
    root = os.environ.get(ENV_CACHE) or Path.home() / ".cache" / "nas-transformers" / "kernels"
    version = torch.__version__.replace("+", "_")
    return Path(root) / f"torch-{version}"


@lru_cache(maxsize=1)
def _build():
    """(module, "") or (None, why not); built at most once per process."""
    if os.environ.get(ENV_OFF, "1") == "0":
        return None, f"{ENV_OFF}=0"
    capability = torch.backends.cpu.get_cpu_capability()
    if capability != "AVX512":
        return None, f"the CPU capability is {capability}, the kernel needs AVX512"
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        return None, f"no C++ compiler ({compiler!r} not on PATH)"
    from torch.utils import cpp_extension

    where = _cache_dir()
    try:
        where.mkdir(parents=True, exist_ok=True)
        module = cpp_extension.load(
            name="nas_window_attention",
            sources=[str(SOURCE)],
            extra_cflags=["-O3", "-mavx512f", "-mavx512dq", "-mfma"],
            build_directory=str(where),
            verbose=False,
        )
    except Exception as exc:  # a failed build leaves the engine in charge, said once
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        why = f"the build failed ({first[:200]})"
        warnings.warn(f"nas: the compiled window-attention kernel is not used: {why}", RuntimeWarning, stacklevel=3)
        return None, why
    return module, ""


def status() -> tuple[bool, str]:
    """(in use, why not): builds the kernel if it has not been built in this process."""
    if _off:
        return False, "turned off in this process (native.disabled())"
    module, why = _build()
    return module is not None, why


@contextlib.contextmanager
def disabled():
    """Run the block engine instead of the kernel inside this block (benchmarks, tests)."""
    global _off
    was, _off = _off, True
    try:
        yield
    finally:
        _off = was


def fits(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Can the kernel take these (B, H, T, D) tensors (no gradient, float32 CPU, sizes, last stride 1)?"""
    if _off or (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)):
        return False
    if any(x.device.type != "cpu" or x.dtype != torch.float32 or x.dim() != 4 or x.stride(-1) != 1 for x in (q, k, v)):
        return False
    if k.shape != q.shape or v.shape[:3] != q.shape[:3]:
        return False
    if q.shape[-1] % 16 or v.shape[-1] not in VALUE_SIZES:
        return False
    return _build()[0] is not None


def window_into(out: Tensor, q: Tensor, k: Tensor, v: Tensor, before: int, after: int) -> Tensor:
    """``out`` (B, H, T, Dv), any strides with the last one 1: query i attends keys i-before .. i+after.
    The caller checked :func:`fits`."""
    _build()[0].window_forward(q, k, v, out, before, after)
    return out


def window_attention(q: Tensor, k: Tensor, v: Tensor, before: int, after: int) -> Tensor | None:
    """The window attention of (B, H, T, D) tensors, or None where the kernel does not apply (:func:`fits`)."""
    if not fits(q, k, v):
        return None
    return window_into(q.new_empty(q.shape[:-1] + v.shape[-1:]), q, k, v, before, after)
