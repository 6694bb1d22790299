#!/usr/bin/env python3
"""Install nas-transformers from this checkout, with the torch that suits the machine (the README's set-up).

    python3 scripts/install.py                  # the toolkit
    python3 scripts/install.py dev              # and what the test suite needs (every extra below, pytest, ruff)
    python3 scripts/install.py translate postgres -c constraints-min.txt

Everything goes into the Python that runs this script: run it with a virtual environment's ``python`` to
install there.  torch first, chosen in this order (``--torch`` overrides it):

1. a torch this Python already imports is kept, whatever its build (your CUDA or ROCm build stays); one older
   than pyproject.toml's floor stops the script, which asks for ``--torch cpu`` or ``--torch cuda`` (else pip would
   replace it with PyPI's newest, a CUDA build on Linux);
2. else, where ``nvidia-smi`` is found (an NVIDIA driver): PyPI's torch, the CUDA build (several GB);
3. else, on Linux: the CPU build from PyTorch's own index (``--torch-index``, by default
   https://download.pytorch.org/whl/cpu; about 200 MB instead of several GB of CUDA libraries): the newest
   ``+cpu`` release that pip sees there (or in the indexes pip is configured with) at or above the
   floor in pyproject.toml; on macOS and Windows, PyPI's torch, which is a CPU build there anyway.

Then ``pip install -e ".[EXTRAS]"``, which keeps that torch.  Extras: ``translate`` (sacrebleu, for
``nas translate --eval``), ``postgres`` (psycopg2, for a PostgreSQL ``--storage``), ``dashboard``
(optuna-dashboard), ``tensorboard`` (``--log tensorboard``), ``completion`` (argcomplete, for ``nas completion``),
``docs`` (MkDocs, to build the documentation site), ``dev`` (what the test suite needs: the extras whose tests run
in CI, pytest, ruff).
``--dry-run`` prints the pip commands without running them.  Only the standard library is used here.
"""

from __future__ import annotations

import argparse
import importlib.util
import platform
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
EXTRAS = ("translate", "postgres", "dashboard", "tensorboard", "completion", "docs", "dev")


def torch_floor(pyproject: Path = ROOT / "pyproject.toml") -> str:
    """The ``torch>=X`` of pyproject.toml's dependencies (tomllib is 3.11+, so a plain search)."""
    found = re.search(r'"torch>=([0-9][0-9.]*)"', pyproject.read_text(encoding="utf-8"))
    if not found:
        raise SystemExit(f"install.py: no \"torch>=X\" in {pyproject}'s dependencies")
    return found.group(1)


def release(version: str) -> tuple[int, ...]:
    """The numeric release of a version: '2.13.0+cpu' -> (2, 13, 0); a pre-release sorts below its release."""
    public = version.split("+", 1)[0]
    nums = re.match(r"[0-9]+(\.[0-9]+)*", public)
    parts = tuple(int(x) for x in nums.group(0).split(".")) if nums else ()
    return parts + (0,) * (3 - len(parts)) + ((-1,) if nums and nums.end() < len(public) else (0,))


def newest_cpu_build(available: list[str], floor: str) -> str | None:
    """The newest ``+cpu`` version at or above ``floor`` among ``available`` (pip's list), or None."""
    cpu = [v for v in available if v.endswith("+cpu") and release(v) >= release(floor) and release(v)[-1] == 0]
    return max(cpu, key=release) if cpu else None


def available_versions(python: str, index: str) -> list[str]:
    """What ``pip index versions torch`` lists with ``index`` in place of PyPI (and pip's configured extras)."""
    done = subprocess.run([python, "-m", "pip", "index", "versions", "torch", "--index-url", index],
                          capture_output=True, text=True)
    said = [ln for ln in done.stderr.splitlines() if ln.strip()]
    if done.returncode != 0 and not any("unknown command" in ln for ln in said):  # (an old pip has no `pip index`)
        raise SystemExit(f"install.py: --torch-index {index}: pip found no torch there ({said[-1] if said else 'no message'}); "
                         "give an index that has it, or --torch cuda / --torch none")
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("Available versions:")), "")
    return [v.strip() for v in line.removeprefix("Available versions:").split(",") if v.strip()]


def installed_torch() -> tuple[str, str] | None:
    """(version, build) of the torch this Python imports, or None."""
    if importlib.util.find_spec("torch") is None:
        return None
    import torch  # only to say which build is kept

    hip = getattr(torch.version, "hip", None)
    return str(torch.__version__), f"CUDA {torch.version.cuda}" if torch.version.cuda else (f"ROCm {hip}" if hip else "CPU")


def torch_plan(choice: str, python: str, index: str, floor: str, ask: bool = True) -> tuple[str, list[list[str]]]:
    """(what will happen, in words; the pip commands for torch); ``ask`` False (--dry-run): the index is not asked."""
    pip = [python, "-m", "pip", "install", "-q"]
    if choice == "auto":
        have = installed_torch()
        if have is not None:
            version, build = have
            if release(version) < release(floor):  # pip would swap it for PyPI's newest, a CUDA build on Linux
                raise SystemExit(f"install.py: the installed torch {version} ({build}) is older than {floor}, the oldest "
                                 "this version runs on: upgrade it yourself, or say which build replaces it: --torch cpu "
                                 "or --torch cuda")
            return f"keeping the installed torch {version} ({build} build)", []
        choice = "cuda" if shutil.which("nvidia-smi") else "cpu"
        if choice == "cpu" and platform.system() != "Linux":
            return f"no NVIDIA driver; PyPI's torch>={floor}, a CPU build on {platform.system()}", [pip + [f"torch>={floor}"]]
    if choice == "none":
        return "torch left to pip as an ordinary dependency", []
    if choice == "cuda":
        return f"PyPI's torch>={floor}, the CUDA build (an NVIDIA driver, or --torch cuda)", [pip + [f"torch>={floor}"]]
    if not ask:
        return (f"no NVIDIA driver: torch>={floor}, the CPU build, from {index} (its newest +cpu release, picked when run: "
                "--dry-run asks no index)"), [pip + [f"torch>={floor}", "--index-url", index]]
    version = newest_cpu_build(available_versions(python, index), floor)
    if version is None:  # pip too old for `pip index`, or nothing listed: PyTorch's own instruction
        return f"no NVIDIA driver: torch>={floor}, CPU build, from {index}", [pip + [f"torch>={floor}", "--index-url", index]]
    return f"no NVIDIA driver: torch {version}, the CPU build, from {index}", [pip + [f"torch=={version}", "--index-url", index]]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 scripts/install.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("extras", nargs="*", metavar="EXTRA", help=f"optional parts to add: {', '.join(EXTRAS)}")
    p.add_argument("--torch", choices=("auto", "cpu", "cuda", "none"), default="auto",
                   help="auto (default): keep an installed torch, else CUDA where nvidia-smi is found, else the CPU build; "
                        "none: let pip pick torch as any other dependency")
    p.add_argument("--torch-index", default=CPU_INDEX, metavar="URL", help=f"where the CPU build comes from ({CPU_INDEX})")
    p.add_argument("-c", "--constraint", metavar="FILE", help="a pip constraints file for every package (constraints-min.txt)")
    p.add_argument("--dry-run", action="store_true", help="print the pip commands, run nothing")
    args = p.parse_args(argv)
    unknown = [e for e in args.extras if e not in EXTRAS]
    if unknown:
        p.error(f"unknown extra {unknown[0]!r}: expected some of {', '.join(EXTRAS)}")

    python = sys.executable
    floor = torch_floor()
    said, commands = torch_plan(args.torch, python, args.torch_index, floor, ask=not args.dry_run)
    extras = f"[{','.join(args.extras)}]" if args.extras else ""
    commands.append([python, "-m", "pip", "install", "-q", "-e", f"{ROOT}{extras}"])
    if args.constraint:
        commands = [c + ["-c", str(Path(args.constraint).resolve())] for c in commands]
    print(f"install.py: torch: {said}", file=sys.stderr)
    for command in commands:
        print("+ " + shlex.join(command), file=sys.stderr)
        if not args.dry_run and subprocess.run(command).returncode != 0:
            print(f"install.py: failed: {shlex.join(command)}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
