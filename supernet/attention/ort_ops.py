"""ONNX Runtime custom operators of the compiled kernels: used only on request (``--custom-ops`` on ``nas export`` and
``nas measure-latency``); the standard-operator graphs stay the default.

``kernels/ort_ops.cpp`` wraps the same kernels as the torch extension (``kernels/window_attention.cpp``) as three
operators of the domain ``nas.kernels``: ``WindowAttention`` (local and dilated, causal and bidirectional; longformer,
strided, fixed and bigbird causal: the window pattern as attributes, bigbird's random blocks drawn by the operator for
the run's length with the generator of :func:`sparse.bigbird_random_block`), ``LinearAttention`` (linear and
relu-linear's causal form: the feature map applied in the kernel) and ``Hydra``.  The types without one (the encoder
forms of longformer and bigbird, cosformer, performer, sima, the convolution types, the linear family's encoder forms)
keep their standard graph inside an exported model that has custom ops.

The library is built with the C++ compiler the first time it is needed (about 10 s; cached per instruction set and
source under ``$NAS_KERNEL_CACHE``), for the instruction set the kernels use here (:func:`native.choose_isa`).  It
compiles against ONNX Runtime's C API header, which the pip wheel does not ship: ``kernels/third_party/onnxruntime/`` holds
that of ONNX Runtime 1.21 (MIT; ``ORT_API_VERSION`` 21, served by every later ONNX Runtime).  A session of a graph
that uses the domain registers the library (:func:`register_if_used`): :func:`supernet.onnx_export.onnx_session` and
the latency sessions do.

Exporting: inside :func:`emitting`, :func:`custom_form` answers for the types above with a ``torch.library``
operator (``nas_kernels::*``; eagerly the torch kernels, traced a shape) that the dynamo exporter turns into the
``nas.kernels`` node through :func:`translation_table`.
"""

from __future__ import annotations

import contextlib
import hashlib
from contextvars import ContextVar
import os
import shutil
import subprocess
import sys
import time
from functools import lru_cache
from pathlib import Path

import torch
from torch import Tensor

from . import native

DOMAIN = "nas.kernels"
SOURCE = native.KERNELS / "ort_ops.cpp"
HEADER = native.KERNELS / "third_party" / "onnxruntime" / "onnxruntime_c_api.h"  # vendored (MIT): the wheel has none
UNBOUNDED = 1 << 30  # a global_after that reaches every query, whatever the traced length

_EMITTING: ContextVar[bool] = ContextVar("nas_kernels_emitting", default=False)  # inside emitting()


# --------------------------------------------------------------------------- the library


def sources() -> list[Path]:
    return [native.SOURCE, SOURCE]


def compile_library(out: Path, compiler: str, flags: list[str]) -> Path:
    """Compile the custom-op library to ``out`` with ``compiler`` and ``flags`` (an instruction set's); raises
    RuntimeError with the compiler's last lines."""
    from ..files import temp_dir

    out.parent.mkdir(parents=True, exist_ok=True)
    folder = temp_dir(f".{out.name}.", out.parent)  # a new folder of a unique name: never a planted file or link
    tmp = folder / out.name
    cmd = [
        compiler,
        "-O3",
        "-std=c++17",
        "-shared",
        "-fPIC",
        "-fvisibility=hidden",
        *flags,
        f"-I{native.KERNELS}",
        f"-I{native.KERNELS / 'third_party'}",
        *map(str, sources()),
        "-o",
        str(tmp),
    ]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            said = [ln for ln in (done.stderr + done.stdout).splitlines() if ln.strip()]
            raise RuntimeError(f"{compiler} failed: {said[-1] if said else 'no message'}")
        os.replace(tmp, out)
    finally:  # (Ctrl-C during a compile too: nothing left beside the library)
        shutil.rmtree(folder, ignore_errors=True)
    return out


def library_dir(isa: str, flags: list[str]) -> Path:
    root = os.environ.get(native.ENV_CACHE) or Path.home() / ".cache" / "nas-transformers" / "kernels"
    digest = hashlib.sha256(" ".join(flags).encode())
    for f in (*sources(), *native.HEADERS, HEADER):
        digest.update(f.name.encode() + b"\0" + f.read_bytes())
    return Path(root) / "onnxruntime" / f"{isa}-{digest.hexdigest()[:12]}"


@lru_cache(maxsize=None)
def _library(isa: str) -> tuple[Path | None, str]:
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        return None, f"no C++ compiler ({compiler!r} not on PATH)"
    flags = native.ISA_FLAGS[isa]
    out = library_dir(isa, flags) / f"libnas_ort_ops_{isa}.so"
    if out.exists():
        return out, ""
    print(f"nas: building the ONNX Runtime custom-op library ({isa}) in {out.parent} (once, about 10 s)", file=sys.stderr)
    started = time.perf_counter()
    try:
        compile_library(out, compiler, flags)
    except (OSError, RuntimeError) as e:
        return None, f"the build failed ({str(e)[:200]})"
    print(f"nas: built the ONNX Runtime custom-op library in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return out, ""


def library() -> tuple[Path | None, str]:
    """(the custom-op library for this machine, "") or (None, why not); built if needed."""
    if os.environ.get(native.ENV_OFF, "1") == "0":
        return None, f"{native.ENV_OFF}=0"
    isa, why = native.choose_isa()
    return (None, why) if isa is None else _library(isa)


BOARD_ISA = "neon"  # what an ARM board's library is built for (aarch64 always has Neon)
CROSS_CXX = "NAS_CROSS_CXX"  # the aarch64 C++ cross compiler (default aarch64-linux-gnu-g++)


@lru_cache(maxsize=None)
def board_library() -> tuple[Path | None, str]:
    """(the custom-op library for an aarch64 board, "") or (None, why not): on an aarch64 host this host's own, else
    cross-compiled with ``$NAS_CROSS_CXX`` (default ``aarch64-linux-gnu-g++``: Debian's g++-aarch64-linux-gnu) once,
    cached beside the host's libraries.  What the ARM bundle of ``--custom-ops`` carries."""
    if native.machine() in ("aarch64", "arm64"):
        return library()
    compiler = os.environ.get(CROSS_CXX, "aarch64-linux-gnu-g++")
    if shutil.which(compiler) is None:
        return None, f"no aarch64 cross compiler ({compiler!r} not on PATH: apt-get install g++-aarch64-linux-gnu)"
    flags = native.ISA_FLAGS[BOARD_ISA]
    out = library_dir(f"{BOARD_ISA}-aarch64", flags) / f"libnas_ort_ops_{BOARD_ISA}.so"
    if out.exists():
        return out, ""
    print(f"nas: building the ONNX Runtime custom-op library for aarch64 boards in {out.parent} (once)", file=sys.stderr)
    try:
        compile_library(out, compiler, flags)
    except (OSError, RuntimeError) as e:
        return None, f"the aarch64 build failed ({str(e)[:200]})"
    return out, ""


def status_line() -> str:
    """One line for ``nas doctor``: where the library is, or why it is not available (without building it)."""
    if os.environ.get(native.ENV_OFF, "1") == "0":
        return f"not available: {native.ENV_OFF}=0"
    isa, why = native.choose_isa()
    if isa is None:
        return f"not available: {why}"
    out = library_dir(isa, native.ISA_FLAGS[isa]) / f"libnas_ort_ops_{isa}.so"
    if out.exists():
        return f"available ({isa}, {out}); used by graphs exported with --custom-ops"
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        return f"not available: no C++ compiler ({compiler!r} not on PATH)"
    return f"not built yet ({isa}; the first --custom-ops command builds it, about 10 s); the default graphs need none"


def uses_custom_ops(model) -> bool:
    """Does this ONNX model (a path or a ModelProto) import the ``nas.kernels`` domain?"""
    if isinstance(model, (str, os.PathLike)):
        import onnx

        model = onnx.load(str(model), load_external_data=False)
    return any(o.domain == DOMAIN for o in model.opset_import)


def register_if_used(options, model) -> bool:
    """Register the custom-op library with these SessionOptions where ``model`` uses the domain; True if it did.
    Raises RuntimeError saying why where the graph needs the library and it cannot be had."""
    if not uses_custom_ops(model):
        return False
    path, why = library()
    if path is None:
        raise RuntimeError(
            f"this graph uses the {DOMAIN} custom operators (exported with --custom-ops) and their "
            f"library is not available: {why}"
        )
    options.register_custom_ops_library(str(path))
    return True


# --------------------------------------------------------------------------- exporting


@lru_cache(maxsize=1)
def _define() -> dict:
    """The torch.library operators, their ONNX schemas and the exporter's translation table (once per process)."""
    import onnx
    from onnx.defs import OpSchema
    from onnxscript.values import Opset

    def schema(name: str, inputs: list[str], optional: int, attributes: dict[str, OpSchema.AttrType]) -> None:
        params = [
            OpSchema.FormalParameter(
                n,
                "T",
                param_option=OpSchema.FormalParameterOption.Optional if i >= optional else OpSchema.FormalParameterOption.Single,
            )
            for i, n in enumerate(inputs)
        ]
        s = OpSchema(
            name,
            DOMAIN,
            1,
            inputs=params,
            outputs=[OpSchema.FormalParameter("y", "T")],
            type_constraints=[("T", ["tensor(float)"], "float32")],
            attributes=[OpSchema.Attribute(a, t, "") for a, t in attributes.items()],
        )
        with contextlib.suppress(onnx.defs.SchemaError):  # registered already (a second import of this module)
            onnx.defs.register_schema(s)

    ints = OpSchema.AttrType.INT
    schema(
        "WindowAttention",
        ["q", "k", "v"],
        3,
        dict.fromkeys(
            ("before", "after", "globals", "global_after", "blocks", "columns", "step", "width", "random", "seed"), ints
        ),
    )
    schema(
        "LinearAttention",
        ["q", "k", "v", "proj"],
        3,
        {"feature": ints, "normalize": ints, "eps": OpSchema.AttrType.FLOAT, "l1_eps": OpSchema.AttrType.FLOAT},
    )
    schema("Hydra", ["q", "k", "v"], 3, {"causal": ints, "eps": OpSchema.AttrType.FLOAT})
    ops = Opset(DOMAIN, 1)

    @torch.library.custom_op("nas_kernels::window", mutates_args=())
    def window(
        q: Tensor,
        k: Tensor,
        v: Tensor,
        before: int,
        after: int,
        globals_: int,
        global_after: int,
        blocks: int,
        columns: int,
        step: int,
        width: int = 1,
        random: int = 0,
        seed: int = 0,
    ) -> Tensor:
        picks = None
        if random:  # bigbird: the length's picks, as the operator draws them
            from .sparse import native_picks

            picks = native_picks(width, random, q.shape[2], seed)
        w = native.Window(before, after, globals_, global_after, picks, width, blocks=blocks, columns=columns, step=step)
        out = native.window_attention(q, k, v, w)
        if out is None:
            raise RuntimeError(f"nas_kernels::window: the compiled kernels do not apply here: {native.status()[1]}")
        return out

    @torch.library.custom_op("nas_kernels::linear", mutates_args=())
    def linear(q: Tensor, k: Tensor, v: Tensor, feature: int, eps: float) -> Tensor:
        name = next(n for n, i in native.FEATURES.items() if i == feature)
        out = native.causal_linear(q, k, v, name, True, eps)
        if out is None:
            raise RuntimeError(f"nas_kernels::linear: the compiled kernels do not apply here: {native.status()[1]}")
        return out

    @torch.library.custom_op("nas_kernels::hydra", mutates_args=())
    def hydra(q: Tensor, k: Tensor, v: Tensor, causal: bool, eps: float) -> Tensor:
        out = native.hydra(q, k, v, causal, eps)
        if out is None:
            raise RuntimeError(f"nas_kernels::hydra: the compiled kernels do not apply here: {native.status()[1]}")
        return out

    for op in (window, linear, hydra):
        op.register_fake(lambda q, k, v, *rest: v.new_empty(v.shape))

    def window_onnx(
        q,
        k,
        v,
        before: int,
        after: int,
        globals_: int,
        global_after: int,
        blocks: int,
        columns: int,
        step: int,
        width: int = 1,
        random: int = 0,
        seed: int = 0,
    ):
        return ops.WindowAttention(
            q,
            k,
            v,
            before=before,
            after=after,
            globals=globals_,
            global_after=global_after,
            blocks=blocks,
            columns=columns,
            step=step,
            width=width,
            random=random,
            seed=seed,
        )

    def linear_onnx(q, k, v, feature: int, eps: float):
        return ops.LinearAttention(q, k, v, feature=feature, normalize=1, eps=eps, l1_eps=0.0)

    def hydra_onnx(q, k, v, causal: bool, eps: float):
        return ops.Hydra(q, k, v, causal=int(causal), eps=eps)

    return {
        torch.ops.nas_kernels.window.default: window_onnx,
        torch.ops.nas_kernels.linear.default: linear_onnx,
        torch.ops.nas_kernels.hydra.default: hydra_onnx,
    }


@contextlib.contextmanager
def emitting():
    """Inside this block an export writes the ``nas.kernels`` operators where a type has one (``--custom-ops``)."""
    from .registry import export_form

    _define()
    token = _EMITTING.set(True)
    try:
        with export_form(custom_form):
            yield
    finally:
        _EMITTING.reset(token)


@contextlib.contextmanager
def requested(flag: str = "--custom-ops", board: bool = False):
    """What a command's ``--custom-ops`` does: the exports inside emit the custom operators; refused in one line naming
    ``flag`` where the library cannot be built or loaded here (``board``: the aarch64 board's, :func:`board_library`)."""
    from search_spaces import UserError

    found, why = board_library() if board else library()
    if found is None:
        where = "for an aarch64 board" if board else "here"
        raise UserError(f"{flag}: the ONNX Runtime custom-op library is not available {where}: {why}")
    with emitting():
        yield


def active() -> bool:
    return _EMITTING.get()


def translation_table() -> dict | None:
    """What ``torch.onnx.export(custom_translation_table=...)`` takes inside :func:`emitting`; None outside it."""
    return _define() if _EMITTING.get() else None


def custom_form(q: Tensor, k: Tensor, v: Tensor, spec, w: dict, causal: bool) -> Tensor | None:
    """The type's custom operator (traced into one ``nas.kernels`` node), or None where it has none: its standard
    graph.  Float32, the head sizes the kernels lay out, k with q's heads."""
    from .registry import get

    if q.dtype != torch.float32 or k is None or k.shape[1] != q.shape[1] or v.shape[1] != q.shape[1]:
        return None
    d, dv, typ, kind = q.shape[-1], v.shape[-1], get(spec), spec.kind
    ops = torch.ops.nas_kernels
    if kind in ("local", "longformer", "strided", "fixed", "dilated", "bigbird"):
        if d not in native.HEAD_SIZES or dv not in native.HEAD_SIZES or (kind == "longformer" and not causal):
            return None  # (longformer's encoder form: its G global rows see every key, one SDPA after the window)
        random = seed = 0
        if kind == "dilated":
            span = spec.param("W") - 1
            window = native.Window(span, 0 if causal else span, step=spec.param("D"))
        elif kind == "bigbird":  # the pattern of a one-token run (its picks table of one row): the operator draws each length's
            from .sparse import BIGBIRD_SEED

            window, random, seed = typ.native_window(spec, 1, causal), spec.param("R"), BIGBIRD_SEED
        else:
            window = typ.native_window(spec, UNBOUNDED, causal)
        if window is None:
            return None
        return ops.window(
            q,
            k,
            v,
            window.before,
            window.after,
            window.globals_,
            min(window.global_after, UNBOUNDED),
            window.blocks,
            window.columns,
            window.step,
            window.width,
            random,
            seed,
        )
    feature = getattr(typ, "native_feature", None)
    if kind in ("linear", "relu-linear") and causal and feature and d % 16 == 0 and d <= 512 and dv in native.HEAD_SIZES:
        from .linear import LINEAR_EPS

        return ops.linear(q, k, v, native.FEATURES[feature], LINEAR_EPS)
    if kind == "hydra" and v.shape == q.shape and d % 16 == 0 and d <= 512:
        from .normalized import NORM_EPS

        return ops.hydra(q, k, v, causal, NORM_EPS)
    return None
