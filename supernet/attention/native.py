"""Compiled CPU kernels (``kernels/window_attention.cpp``): a fused sliding-window attention, forward and backward;
the linear family's causal forward (:func:`causal_linear`); a depthwise convolution along the tokens
(:func:`depthwise_conv`); hydra in one pass (:func:`hydra`).

The block engine (:mod:`.blocks`) runs a window as batched GEMMs and a softmax over a scores buffer;
at 4k tokens, one thread, that is about 10x faster than causal SDPA where local:64 does 32x fewer
FLOPs.  The compiled kernel does scores, softmax and the weighted sum per block of 16 queries in
registers (no scores buffer in memory), skipping the products the window masks out; its backward
recomputes each block's probabilities from the row log-sum-exp the forward kept (as flash attention
does) and accumulates dK and dV block by block.  It serves local:W and longformer:W:G (a window plus
the first G keys; the encoder form's G global rows then one SDPA), causal and bidirectional,
dilated:W:D (its residue streams read and written in place, forward and backward, ``Window.step``), bigbird:W:G:R's causal
form (each block's R picked blocks are further key segments; W a multiple of 16, R <= 8), fixed:S (the summaries a
segment of keys S apart; S a multiple of 16) and strided:S (any S: the columns as causal attention within each
residue stream, merged into the window's softmax; its backward the window's and the streams' in two calls) when:

* float32 on the CPU, a C++ compiler is found, and the CPU runs one of the instruction sets the kernels are written for
  (``kernels/simd.h``): AVX-512 or AVX2 (+FMA) as torch's CPU capability says (``ATEN_CPU_CAPABILITY=avx2`` lowers
  torch and the kernels alike), Neon on aarch64; ``NAS_KERNEL_ISA`` picks one the CPU runs,
* the query/key and value head sizes are each one of 16, 32, 48, 64, 128, and k has q's heads.

Otherwise the engine runs, with the same result to float rounding (tests/supernet/attention/test_native_kernels.py).

The linear family (linear, relu-linear, cosformer, performer, sima, msla) runs its causal inference on the CPU
through :func:`causal_linear`: blocks of 16 tokens in order with a running (F, Dv) state, the feature maps (relu,
elu + 1, sima's normalised queries, cosformer's cos/sin weighting, performer's FAVOR+ features) applied to each
block's rows in cache, so that no feature tensor is written;
msla's, lsra's and convmod's convolutions through :func:`depthwise_conv`, in the (B, H, T, D) layout.  With a gradient
recorded the torch feature maps run (autograd records them) and the kernel takes their features: its forward keeps
each row's denominator, its backward (``linear_backward``) gives dq, dk, dv by the same blocks, in order for dq and in
reverse for dk and dv.  The torch code (chunked GEMMs, grouped conv1d) runs off float32 or where F is not a multiple
of 16, and for the convolutions' gradients (tests/supernet/attention/test_native_linear.py).

It is built by ``torch.utils.cpp_extension`` the first time it is needed in a process (about 25 s on
a 2-core machine, once: the build is cached per torch version, instruction set and source under
``$NAS_KERNEL_CACHE`` or ``~/.cache/nas-transformers/kernels``; concurrent processes wait on
one build); :func:`prebuild` does it up front (``train-supernet`` before its clock starts).
``NAS_NATIVE_KERNELS=0`` turns it off; :func:`status` says whether it is in use and why not, ``nas doctor`` prints it.
The same source builds without torch: ``kernels/c_api.cpp`` (a C library for ctypes: the Neon build's parity check
under emulated aarch64, tests/supernet/attention/test_neon_kernels.py).  Nothing is downloaded: the source ships with the package.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import shutil
import sys
import time
import warnings
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

import torch
from torch import Tensor

ENV_OFF = "NAS_NATIVE_KERNELS"  # "0": never build or use the compiled kernels
ENV_CACHE = "NAS_KERNEL_CACHE"
ENV_ISA = "NAS_KERNEL_ISA"  # avx512, avx2 or neon: build and use that one (a benchmark's or a test's choice)
KERNELS = Path(__file__).with_name("kernels")
SOURCE = KERNELS / "window_attention.cpp"  # the kernels; simd.h holds each instruction set's vectors
BINDING = KERNELS / "torch_module.cpp"  # the torch extension around them
HEADERS = (KERNELS / "window_attention.h", KERNELS / "simd.h")
NAME = "nas_window_attention"
# The compiler flags of each instruction set the kernels are written for (simd.h), best first.
ISA_FLAGS = {"avx512": ["-mavx512f", "-mavx512dq", "-mfma"], "avx2": ["-mavx2", "-mfma"], "neon": []}
HEAD_SIZES = (16, 32, 48, 64, 128)  # query/key and value head sizes with a register layout
_NO_LSE = torch.empty(0)
_NO_PICKS = torch.empty(0, 0, dtype=torch.long)
_NO_PROJ = torch.empty(0, 0)

_off = False  # :func:`disabled` (benchmarks compare the engine and the kernel in one process)
_forced: str | None = None  # :func:`using_isa`


def _cache_dir(isa: str, flags: list[str]) -> Path:
    """The build folder of one instruction set: per torch version, ISA and the kernels' sources and flags."""
    root = os.environ.get(ENV_CACHE) or Path.home() / ".cache" / "nas-transformers" / "kernels"
    version = torch.__version__.replace("+", "_")
    digest = hashlib.sha256(" ".join(flags).encode())
    for f in (SOURCE, BINDING, *HEADERS):
        digest.update(f.name.encode() + b"\0" + (f.read_bytes() if f.exists() else b""))
    return Path(root) / f"torch-{version}" / f"{isa}-{digest.hexdigest()[:12]}"


def machine() -> str:
    return platform.machine().lower()


@lru_cache(maxsize=1)
def runnable_isas() -> tuple[str, ...]:
    """The instruction sets of :data:`ISA_FLAGS` this CPU executes, best first (whatever torch's capability is set to):
    aarch64 always has Neon; on x86 the CPU's flags (Linux's /proc/cpuinfo), else torch's capability."""
    if machine() in ("aarch64", "arm64"):
        return ("neon",)
    if machine() not in ("x86_64", "amd64", "x64"):
        return ()
    flags: set[str] = set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    if not flags:  # no cpuinfo (macOS, Windows): what torch reports, unless forced lower by ATEN_CPU_CAPABILITY
        capability = torch.backends.cpu.get_cpu_capability()
        return ("avx512", "avx2") if capability == "AVX512" else ("avx2",) if capability == "AVX2" else ()
    have = []
    if {"avx512f", "avx512dq", "fma"} <= flags:
        have.append("avx512")
    if {"avx2", "fma"} <= flags:
        have.append("avx2")
    return tuple(have)


def choose_isa() -> tuple[str | None, str]:
    """(the instruction set the kernels use here, "") or (None, why none): ``$NAS_KERNEL_ISA`` if set (one this CPU
    runs), else torch's CPU capability (``ATEN_CPU_CAPABILITY=avx2`` lowers both: a fair comparison) on x86, Neon on
    aarch64."""
    runnable = runnable_isas()
    wanted = _forced or os.environ.get(ENV_ISA, "").strip().lower()
    if wanted:
        if wanted not in ISA_FLAGS:
            return None, f"{ENV_ISA}={wanted}: not one of {', '.join(ISA_FLAGS)}"
        if wanted not in runnable:
            return None, f"{ENV_ISA}={wanted}: this CPU ({machine()}) runs {', '.join(runnable) or 'none of them'}"
        return wanted, ""
    if "neon" in runnable:
        return "neon", ""
    capability = torch.backends.cpu.get_cpu_capability()
    isa = {"AVX512": "avx512", "AVX2": "avx2"}.get(capability)
    if isa is None or isa not in runnable:
        return None, f"the CPU capability is {capability}: the kernels need AVX2 (+FMA), AVX-512 or aarch64 Neon"
    return isa, ""


@contextlib.contextmanager
def build_lock(where: Path):
    """Hold an OS lock on ``where`` (``filelock``: released by the kernel however the holder ends) for a build; under it, torch's
    own baton file (``where/lock``, which cpp_extension waits on forever and a killed build leaves behind) can only
    be stale, and is removed: a build killed half-way no longer hangs every later process."""
    from filelock import FileLock

    with FileLock(where / "nas-build.lock"):  # another process's build in progress: wait for it
        (where / "lock").unlink(missing_ok=True)
        yield


@lru_cache(maxsize=None)
def _build(isa: str):
    """(module, "") or (None, why not): the kernels for ``isa``, built at most once per process (and once per cache)."""
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        return None, f"no C++ compiler ({compiler!r} not on PATH)"
    from torch.utils import cpp_extension

    flags = ["-O3", "-std=c++17", *ISA_FLAGS[isa]]
    where = _cache_dir(isa, flags)
    name = f"{NAME}_{isa}"
    started = time.perf_counter()
    try:
        where.mkdir(parents=True, exist_ok=True)
        with build_lock(where):
            fresh = not (where / f"{name}.so").exists()
            if fresh:  # long work says so
                print(f"nas: building the compiled attention kernels ({isa}) in {where} (once, about 25 s)", file=sys.stderr)
            module = cpp_extension.load(
                name=name,
                sources=[str(SOURCE), str(BINDING)],
                extra_cflags=flags,
                extra_include_paths=[str(KERNELS)],
                build_directory=str(where),
                verbose=False,
            )
    except Exception as exc:  # a failed build leaves the engine in charge, said once
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        why = f"the build failed ({first[:200]})"
        warnings.warn(f"nas: the compiled window-attention kernel is not used: {why}", RuntimeWarning, stacklevel=3)
        return None, why
    seconds = time.perf_counter() - started
    _builds[isa] = (seconds, fresh)
    if fresh:
        print(f"nas: built the compiled attention kernels ({isa}) in {seconds:.1f} s", file=sys.stderr)
    return module, ""


_builds: dict[str, tuple[float, bool]] = {}  # isa: (seconds the build or load took, built in this process)


def _loaded():
    """(module, "") or (None, why not) for the instruction set in use."""
    if os.environ.get(ENV_OFF, "1") == "0":
        return None, f"{ENV_OFF}=0"
    isa, why = choose_isa()
    return (None, why) if isa is None else _build(isa)


def _kernel():
    """The built module (callers checked :func:`fits`)."""
    return _loaded()[0]


def status() -> tuple[bool, str]:
    """(in use, why not): builds the kernel if it has not been built in this process."""
    if _off:
        return False, "turned off in this process (native.disabled())"
    module, why = _loaded()
    return module is not None, why


def isa() -> str | None:
    """The instruction set of the kernels in use (building them if needed), or None."""
    module = _kernel() if not _off else None
    return None if module is None else module.isa()


def cached(isa: str) -> Path | None:
    """The build folder of ``isa``'s kernels where they are built already (this torch, these sources), else None."""
    where = _cache_dir(isa, ["-O3", "-std=c++17", *ISA_FLAGS[isa]])
    return where if (where / f"{NAME}_{isa}.so").exists() else None


def prebuild() -> str:
    """Build (or load) the kernels now, before any timed work (``train-supernet`` calls it before its clock starts);
    returns a note saying which, how long it took, or why they are not used."""
    used, why = status()
    if not used:
        return f"compiled attention kernels not used: {why}"
    chosen = choose_isa()[0]
    seconds, fresh = _builds.get(chosen, (0.0, False))
    return f"compiled attention kernels ({chosen}): {'built' if fresh else 'loaded from the cache'} in {seconds:.2f} s"


@contextlib.contextmanager
def using_isa(name: str):
    """Use the kernels of instruction set ``name`` inside this block (tests and benchmarks compare them in one
    process); one this CPU does not run leaves :func:`status` saying so."""
    global _forced
    was, _forced = _forced, name
    try:
        yield
    finally:
        _forced = was


@contextlib.contextmanager
def disabled():
    """Run the block engine instead of the kernel inside this block (benchmarks, tests)."""
    global _off
    was, _off = _off, True
    try:
        yield
    finally:
        _off = was


def _eager() -> bool:
    """Not turned off, and running eagerly: a trace (torch.compile, torch.export, the ONNX exporter) records the torch
    code, never an opaque kernel call."""
    tracing = torch.compiler.is_compiling() or torch.compiler.is_exporting() or torch.onnx.is_in_onnx_export()
    return not (_off or tracing)


def _takes(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """(B, H, T, .) float32 CPU tensors, last stride 1, k shaped as q, v's value head size one the kernels lay out."""
    if not _eager():
        return False
    if any(x.device.type != "cpu" or x.dtype != torch.float32 or x.dim() != 4 or x.stride(-1) != 1 for x in (q, k, v)):
        return False
    return k.shape == q.shape and v.shape[:3] == q.shape[:3] and v.shape[-1] in HEAD_SIZES


def fits(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Can the window kernel take these (B, H, T, D) tensors (float32 CPU, head sizes, last stride 1)?"""
    return _takes(q, k, v) and q.shape[-1] in HEAD_SIZES and _kernel() is not None


def recording(*xs: Tensor) -> bool:
    """Is autograd recording an operation on any of these?"""
    return torch.is_grad_enabled() and any(x.requires_grad for x in xs)


def _backward_buffers(grad: Tensor, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The incoming gradient with its last stride 1 (as the kernels read it), and dq, dk, dv for a kernel's backward to
    write (every row)."""
    grad = grad if grad.stride(-1) == 1 else grad.contiguous()
    return grad, torch.empty(q.shape), torch.empty(k.shape), torch.empty(v.shape)


class _Window(torch.autograd.Function):
    """The kernel's forward (keeping each row's log-sum-exp) and its backward (P recomputed per block).  With strided's
    columns the lse is the joint one (window and columns under one softmax): the backward takes the window's share and
    adds the columns' (each residue stream, keys strictly before the query), given rowsum(dO * O) over both."""

    @staticmethod
    def forward(ctx, q, k, v, window):
        out = q.new_empty(q.shape[:-1] + v.shape[-1:])
        lse = q.new_empty(q.shape[:-1])
        _kernel().window_forward(q, k, v, out, lse, *window.args())
        ctx.save_for_backward(q, k, v, lse, out if window.columns else _NO_LSE)
        ctx.window = window
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        q, k, v, lse, out = ctx.saved_tensors
        grad, dq, dk, dv = _backward_buffers(grad, q, k, v)
        window = ctx.window
        if not window.columns:
            _kernel().window_backward(q, k, v, lse, grad, dq, dk, dv, *window.args(), _NO_LSE, False)
            return dq, dk, dv, None
        delta = torch.linalg.vecdot(grad, out).contiguous()  # (B, H, T): rowsum(dO * O) over window and columns
        _kernel().window_backward(q, k, v, lse, grad, dq, dk, dv, *replace(window, columns=0).args(), delta, False)
        columns = Window(q.shape[2], -1, step=window.columns)  # each residue stream: every key strictly before the query
        _kernel().window_backward(q, k, v, lse, grad, dq, dk, dv, *columns.args(), delta, True)
        return dq, dk, dv, None


@dataclass(frozen=True)
class Window:
    """What query i attends: keys i-before .. i+after, the first ``globals_`` keys j where j <= i + global_after
    (longformer, bigbird), and (bigbird) the blocks of ``width`` keys its block of ``width`` queries picked:
    ``picks`` (ceil(T / width), R) int64 block indices, -1 for none, each before the block's window (``width`` a
    multiple of 16, R <= 8).  ``blocks`` (fixed:S, a multiple of 16, with no global keys or picks): the window stops at
    the start of the query's block of ``blocks`` keys, and the last key of every earlier block is seen too.
    ``columns`` (strided:S, alone, with before < S and after 0): also the keys i - S,
    i - 2S, ... (causal attention within each residue stream, joined into the window's softmax).  ``step``
    (dilated:W:D): the pattern on each residue stream i = r, r + step, ... alone (before and after
    count the stream's rows)."""

    before: int
    after: int
    globals_: int = 0
    global_after: int = 0
    picks: Tensor | None = None
    width: int = 1
    blocks: int = 0
    columns: int = 0
    step: int = 1

    def args(self) -> tuple:
        picks = _NO_PICKS if self.picks is None else self.picks
        return (
            self.before, self.after, self.globals_, self.global_after, picks, self.width, self.blocks, self.columns,
            self.step,
        )  # fmt: skip


def window_into(out: Tensor, q: Tensor, k: Tensor, v: Tensor, window: Window) -> Tensor:
    """``out`` (B, H, T, Dv), any strides with the last one 1, gets the attention of ``window``.  The caller checked
    :func:`fits`; with a gradient recorded the result is copied in (autograd sees the copy)."""
    if recording(q, k, v):
        out.copy_(_Window.apply(q, k, v, window))
    else:
        _kernel().window_forward(q, k, v, out, _NO_LSE, *window.args())
    return out


def window_attention(q: Tensor, k: Tensor, v: Tensor, window: Window) -> Tensor | None:
    """The attention of ``window`` over (B, H, T, D) tensors (differentiable), or None where the kernel does not
    apply (:func:`fits`)."""
    if not fits(q, k, v):
        return None
    if recording(q, k, v):
        return _Window.apply(q, k, v, window)
    return window_into(q.new_empty(q.shape[:-1] + v.shape[-1:]), q, k, v, window)


# the feature maps linear_forward applies itself
FEATURES = {"none": 0, "relu": 1, "elu1": 2, "sima": 3, "performer": 4, "cosformer": 5}


def causal_linear(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    feature: str = "none",
    normalize: bool = True,
    eps: float = 1e-6,
    l1_eps: float = 0.0,
    into: Tensor | None = None,
    proj: Tensor | None = None,
) -> Tensor | None:
    """Causal kernelized attention: out_i = sum_{j<=i} (fq_i . fk_j) v_j / (sum_{j<=i} fq_i . fk_j + eps) (``normalize``;
    else the numerator), by blocks of 16 tokens and a running (F, Dv) state.  fq, fk = phi(q), phi(k)
    with phi ``feature``: "none" (q, k are features already), "relu", "elu1" (elu(x) + 1), "sima" (fq = the
    l1-normalised q (``l1_eps``) over the prefix sums of |k| plus ``eps`` per feature, fk = k; unnormalised), or
    "performer" (FAVOR+ as :func:`.linear.performer_features`, ``proj`` (F, D) its random features times D^(-1/4)), or
    "cosformer" ([relu(x) cos a_i, relu(x) sin a_i], ``proj`` (T, 2) each position's cos and sin; F = 2D).
    ``into``: added to that (B, H, T, Dv) tensor, returned.  With a gradient recorded (``feature`` "none", no ``into``):
    differentiable, the kernel's backward.  None where the kernel does not apply: a gradient recorded through a feature
    map of its own or ``into`` (the callers' torch code runs), F not a multiple of 16 up to 512, or :func:`fits`'s other
    conditions."""
    f = 2 * q.shape[-1] if feature == "cosformer" else q.shape[-1] if proj is None else proj.shape[0]
    grad = recording(q, k, v)
    if grad:  # the kernel's backward takes features (the torch feature maps record theirs) and writes a fresh output
        if feature != "none" or into is not None:
            return None
        # features in a layout of their own (msla's convolutions' outputs): a copy costs less than the torch GEMMs
        q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    if not _takes(q, k, v) or f % 16 or f > 512 or q.shape[-1] % 16 or q.shape[-1] > 512:
        return None
    if grad:
        return None if _kernel() is None else _Linear.apply(q, k, v, normalize, eps)
    if into is not None and (into.shape != v.shape or into.dtype != v.dtype or into.stride(-1) != 1 or recording(into)):
        return None
    if _kernel() is None:
        return None
    if feature in ("performer", "cosformer"):
        if proj is None or proj.dtype != torch.float32 or proj.device.type != "cpu":
            return None
        proj = proj.contiguous()
    out = v.new_empty(v.shape) if into is None else into
    proj = _NO_PROJ if proj is None else proj
    _kernel().linear_forward(q, k, v, out, FEATURES[feature], normalize, eps, l1_eps, into is not None, proj, _NO_LSE)
    return out


class _Linear(torch.autograd.Function):
    """The kernel's causal linear attention of features fq, fk (keeping each row's denominator) and its backward: the
    pairs inside each block of 16 from their scores, the rest through running (F, Dv) sums, forward for dq and in
    reverse for dk and dv (``linear_backward``)."""

    @staticmethod
    def forward(ctx, fq, fk, v, normalize, eps):
        out = v.new_empty(v.shape)
        den = v.new_empty(v.shape[:-1]) if normalize else _NO_LSE  # (B, H, T): each row's denominator plus eps
        _kernel().linear_forward(fq, fk, v, out, FEATURES["none"], normalize, eps, 0.0, False, _NO_PROJ, den)
        ctx.save_for_backward(fq, fk, v, out, den)
        ctx.normalize = normalize
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        fq, fk, v, out, den = ctx.saved_tensors
        grad, dq, dk, dv = _backward_buffers(grad, fq, fk, v)
        _kernel().linear_backward(fq, fk, v, grad, out, den, dq, dk, dv, ctx.normalize)
        return dq, dk, dv, None, None


def hydra(q: Tensor, k: Tensor, v: Tensor, causal: bool, eps: float) -> Tensor | None:
    """Hydra attention in one pass: n(q_t) * (the mean of n(k_j) * v_j over j <= t, or over every token), n the L2
    normalisation (x / max(|x|, ``eps``)); inference only.  None where it does not apply (a gradient recorded, v not
    shaped as q, D not a multiple of 16 up to 512, :func:`_takes`'s other conditions, the kernel not built)."""
    if not _takes(q, k, v) or v.shape != q.shape or q.shape[-1] % 16 or q.shape[-1] > 512 or recording(q, k, v):
        return None
    if _kernel() is None:
        return None
    out = v.new_empty(v.shape)
    _kernel().hydra_forward(q, k, v, out, causal, eps)
    return out


def depthwise_conv(x: Tensor, taps: Tensor, offsets: list[int]) -> Tensor | None:
    """Depthwise convolution along the tokens of x (B, H, T, D) with taps (H * D, K): out[t] = sum_s taps[:, s]
    x[t + offsets[s]] per channel, zeros outside the sequence; inference only.  None where it does not apply (a gradient
    recorded, D not a multiple of 16, not float32 on the CPU, the kernel not built)."""
    if not _eager() or recording(x, taps) or x.device.type != "cpu" or x.dtype != torch.float32 or taps.dtype != torch.float32:
        return None
    if x.dim() != 4 or x.shape[-1] % 16 or x.stride(-1) != 1 or _kernel() is None:
        return None
    out = x.new_empty(x.shape)
    _kernel().dwconv_forward(x, taps.t().contiguous(), out, list(offsets))
    return out
