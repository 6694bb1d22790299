"""``nas doctor``: which fast paths are active on this machine, and why not.

One line each: the versions; torch's and ONNX Runtime's threads; the compiled attention kernels (the instruction set
they use, the ones this CPU runs, the compiler, where they are cached and how long the build or load took; or why they
are not used); ONNX Runtime (version, execution providers) and its custom operators (``--custom-ops``).  Builds the
kernels if they are not cached yet (once, about 25 s), as the first command that needs them would.
"""

from __future__ import annotations

import argparse
from .registry import register_command

NAME = "doctor"
HELP = "show which fast paths are active here (compiled kernels, ONNX Runtime, custom ops, threads) and why not"
EXAMPLE = "nas doctor"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-build", action="store_true", help="do not build the compiled kernels; say whether they are cached")


def _compiler() -> str:
    import os
    import shutil
    import subprocess

    cxx = os.environ.get("CXX", "c++")
    path = shutil.which(cxx)
    if path is None:
        return f"none ({cxx!r} not on PATH; set CXX or install g++ / clang)"
    try:
        first = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20).stdout.splitlines()
    except (OSError, subprocess.SubprocessError) as e:
        return f"{path} (its --version failed: {e})"
    return f"{path} ({first[0].strip() if first else 'version unknown'})"


def kernels_line(build: bool) -> str:
    from supernet.attention import native

    isa, why = native.choose_isa()
    runs = ", ".join(native.runnable_isas()) or "none of avx512, avx2, neon"
    if isa is None:
        return f"compiled attention kernels: not active: {why} (this CPU runs {runs})"
    if not build:
        cached = native.cached(isa)
        return (f"compiled attention kernels: {isa} (this CPU runs {runs}); "
                + (f"cached in {cached}" if cached else "not built yet (the first command that needs them builds them)"))
    used, why = native.status()
    if not used:
        return f"compiled attention kernels: not active: {why} (this CPU runs {runs}; compiler {_compiler()})"
    return (f"compiled attention kernels: active, {native.isa()} (this CPU runs {runs}); {native.prebuild().split(': ', 1)[1]}; "
            f"compiler {_compiler()}; cache {native.cached(isa)}")


def onnx_lines() -> list[str]:
    try:
        import onnxruntime as ort
    except ImportError as e:
        return [f"ONNX Runtime: not importable ({e}): measure-latency --device onnxruntime and export's check need it"]
    from supernet.attention import ort_ops

    lines = [f"ONNX Runtime {ort.__version__}: providers {', '.join(ort.get_available_providers())}"]
    lines.append(f"ONNX Runtime custom operators (--custom-ops): {ort_ops.status_line()}")
    return lines


def run(args: argparse.Namespace) -> int:
    import os
    import platform
    import sys

    import torch

    from nas import __version__

    from nas.commands.common import emit

    print(f"nas-transformers {__version__}; Python {platform.python_version()}; torch {torch.__version__} "
          f"(CPU capability {torch.backends.cpu.get_cpu_capability()}); {platform.machine()}, {os.cpu_count()} logical cores")
    print(f"threads: torch {torch.get_num_threads()} intra-op (OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}); "
          "ONNX Runtime sessions: the --timing-threads of measure-latency, export and search (default 1)")
    kernels = kernels_line(build=not args.no_build)
    print(kernels)
    onnx = onnx_lines()
    for line in onnx:
        print(line)
    cuda = torch.cuda.is_available()
    gpu = torch.cuda.get_device_name(0) if cuda else None
    print(f"CUDA: {gpu or 'not available'}")
    sys.stdout.flush()
    emit(args, {"nas_version": __version__, "python": platform.python_version(), "torch": torch.__version__,
                "cpu_capability": torch.backends.cpu.get_cpu_capability(), "machine": platform.machine(),
                "logical_cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "kernels": kernels, "onnxruntime": onnx,
                "cuda": gpu})
    return 0


register_command(__name__)
