#!/usr/bin/env python3
"""Install nas-transformers from this checkout, with the torch that suits the machine (the README's set-up).

    python3 scripts/install.py                  # the toolkit
    python3 scripts/install.py dev              # and what the test suite needs (every extra below, pytest, ruff)
    python3 scripts/install.py translate postgres -c constraints-min.txt
    python3 scripts/install.py docs             # MkDocs alone, to build the documentation site: no torch

Everything goes into the Python that runs this script: run it with a virtual environment's ``python`` to install
there.  A Python that refuses pip (PEP 668: Debian 12, Ubuntu 24.04's system Python, whose standard-library folder
holds ``EXTERNALLY-MANAGED``) gets a virtual environment instead: ``.venv`` in the checkout (``--venv DIR``), made
once and reused, into which this script installs; the last line says the one command that activates it (``nas`` is
``.venv/bin/nas``).

torch first, within the releases CI tests: at or above pyproject.toml's floor and below the release after the one
``constraints.txt`` pins (with ``-c FILE`` pinning torch: that release).  Chosen in this order (``--torch`` overrides
it):

1. a torch this Python already imports is kept, whatever its build (your CUDA or ROCm build stays); one older than
   the floor, or other than the ``-c`` file's pin, stops the script, which asks for ``--torch cpu`` or ``--torch
   cuda`` (else pip would replace it with PyPI's, a CUDA build on Linux);
2. else, where ``nvidia-smi`` answers with a driver new enough for torch's CUDA build (CUDA 13.0: driver 580.65.06 or
   later): that build, from PyTorch's CUDA index (``--torch-cuda-index``); a driver too old, or an ``nvidia-smi`` that
   fails, gets the CPU build and one line saying why;
3. else, on Linux: the CPU build from PyTorch's CPU index (``--torch-index``, by default
   https://download.pytorch.org/whl/cpu; about 200 MB instead of several GB of CUDA libraries): the newest ``+cpu``
   release in the tested range that pip sees there (or in the indexes pip is configured with); on macOS and Windows,
   PyPI's torch, which is a CPU build there anyway.

PyTorch's index that cannot be reached (a proxy, a mirror, no network to it: checked with pip's certificate and
proxy settings, 15 s at most) gives way to PyPI's torch, in one line that says so (on Linux PyPI's torch is a CUDA
build: name a reachable mirror with ``--torch-index``).

Then ``pip install -e ".[EXTRAS]"``, which keeps that torch.  Extras: ``translate`` (sacrebleu, for
``nas translate --eval``), ``postgres`` (psycopg2, for a PostgreSQL ``--storage``), ``dashboard``
(optuna-dashboard), ``tensorboard`` (``--log tensorboard``), ``completion`` (argcomplete, for ``nas completion``),
``docs`` (MkDocs, to build the documentation site: asked for alone, it installs MkDocs and mkdocstrings only, since
the site is built from the sources without importing them), ``dev`` (what the test suite needs: the extras whose
tests run in CI, pytest, ruff).
``--dry-run`` prints the pip commands without running them.  Only the standard library is used here.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import re
import shlex
import shutil
import ssl
import subprocess
import sys
import sysconfig
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
CUDA = "13.0"  # the CUDA release of the torch build taken for an NVIDIA GPU (the GPU check ran torch 2.11.0+cu130)
CUDA_INDEX = "https://download.pytorch.org/whl/cu130"
MIN_DRIVER = "580.65.06"  # the oldest Linux driver that runs CUDA 13.0 (NVIDIA's CUDA 13.0 release notes)
EXTRAS = ("translate", "postgres", "dashboard", "tensorboard", "completion", "docs", "dev")
PROBE_S = 15.0  # how long an index may take to answer before it counts as unreachable


# --------------------------------------------------------------------------- versions


def torch_floor(pyproject: Path = ROOT / "pyproject.toml") -> str:
    """The ``torch>=X`` of pyproject.toml's dependencies (tomllib is 3.11+, so a plain search)."""
    found = re.search(r'"torch>=([0-9][0-9.]*)"', pyproject.read_text(encoding="utf-8"))
    if not found:
        raise SystemExit(f"install.py: no \"torch>=X\" in {pyproject}'s dependencies")
    return found.group(1)


def torch_pin(constraints: Path) -> str | None:
    """The release a constraints file pins torch to (``torch==2.13.0`` -> ``2.13.0``), None when it pins none."""
    found = re.search(r"^\s*torch\s*==\s*([0-9][0-9.]*)\s*(?:#.*)?$", constraints.read_text(encoding="utf-8"), re.M)
    return found.group(1) if found else None


def tested_ceiling(constraints: Path = ROOT / "constraints.txt") -> str:
    """The first torch release CI has not tested: the minor release after constraints.txt's pin (2.13.0 -> 2.14)."""
    pin = torch_pin(constraints)
    if pin is None:
        raise SystemExit(f"install.py: no torch==X in {constraints}: the torch CI tests")
    major, minor = release(pin)[:2]
    return f"{major}.{minor + 1}"


def release(version: str) -> tuple[int, ...]:
    """The numeric release of a version: '2.13.0+cpu' -> (2, 13, 0); a pre-release sorts below its release."""
    public = version.split("+", 1)[0]
    nums = re.match(r"[0-9]+(\.[0-9]+)*", public)
    parts = tuple(int(x) for x in nums.group(0).split(".")) if nums else ()
    return parts + (0,) * (3 - len(parts)) + ((-1,) if nums and nums.end() < len(public) else (0,))


def in_range(version: str, floor: str, ceiling: str, pin: str | None) -> bool:
    """Whether a (final) release is what may be installed: ``pin``'s release, else at or above the floor and below the
    ceiling."""
    r = release(version)
    if r[-1] != 0:  # a pre-release
        return False
    return r == release(pin) if pin else release(floor) <= r < release(ceiling)


def newest_build(available: list[str], local: str, floor: str, ceiling: str, pin: str | None = None) -> str | None:
    """The newest ``+<local>`` version (``cpu``, ``cu130``) among ``available`` (pip's list) that may be installed."""
    found = [v for v in available if v.endswith(f"+{local}") and in_range(v, floor, ceiling, pin)]
    return max(found, key=release) if found else None


def requirement(floor: str, ceiling: str, pin: str | None) -> str:
    """torch's requirement for pip: ``torch==PIN`` or ``torch>=FLOOR,<CEILING``."""
    return f"torch=={pin}" if pin else f"torch>={floor},<{ceiling}"


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


# --------------------------------------------------------------------------- the machine


def installed_torch() -> tuple[str, str] | None:
    """(version, build) of the torch this Python imports, or None."""
    if importlib.util.find_spec("torch") is None:
        return None
    import torch  # only to say which build is kept

    hip = getattr(torch.version, "hip", None)
    return str(torch.__version__), f"CUDA {torch.version.cuda}" if torch.version.cuda else (f"ROCm {hip}" if hip else "CPU")


def nvidia_driver() -> tuple[str | None, str]:
    """(the NVIDIA driver's version, "") from ``nvidia-smi``, or (None, why there is none: no nvidia-smi, or how it
    failed)."""
    if shutil.which("nvidia-smi") is None:
        return None, "no nvidia-smi"
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"nvidia-smi failed ({type(e).__name__}: {e})"
    words = (done.stdout.strip().splitlines() or [""])[0].strip()
    if done.returncode != 0 or not re.fullmatch(r"[0-9]+(\.[0-9]+)+", words):
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()
        return None, f"nvidia-smi failed (exit {done.returncode}{': ' + said[0][:200] if said else ''})"
    return words, ""


def pip_settings(python: str) -> dict[str, str]:
    """pip's ``cert`` and ``proxy`` settings (``$PIP_CERT`` / ``$PIP_PROXY``, else ``pip config list``): the probe of an
    index goes out as pip would."""
    out = {k: os.environ[f"PIP_{k.upper()}"] for k in ("cert", "proxy") if os.environ.get(f"PIP_{k.upper()}")}
    if len(out) < 2:
        done = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True)
        for line in done.stdout.splitlines():
            key, _, value = line.partition("=")
            name = key.rsplit(".", 1)[-1]
            if name in ("cert", "proxy") and name not in out:
                out[name] = value.strip().strip("'\"")
    return out


def unreachable(index: str, settings: dict[str, str], timeout: float = PROBE_S) -> str | None:
    """Why the package index ``index`` cannot be read (None: it answers): its ``torch/`` page fetched with pip's
    certificate and proxy (``settings``), else the environment's proxy; a ``file:`` index is a folder."""
    url = index.rstrip("/") + "/torch/"
    if url.startswith("file:"):
        folder = Path(urllib.request.url2pathname(urllib.parse.urlparse(url).path))
        return None if folder.is_dir() else f"no folder {folder}"
    handlers: list[urllib.request.BaseHandler] = []
    if settings.get("proxy"):
        handlers.append(urllib.request.ProxyHandler({"http": settings["proxy"], "https": settings["proxy"]}))
    if url.startswith("https:"):
        cert = settings.get("cert")
        context = ssl.create_default_context(cafile=cert if cert and Path(cert).is_file() else None)
        handlers.append(urllib.request.HTTPSHandler(context=context))
    try:
        with urllib.request.build_opener(*handlers).open(url, timeout=timeout) as answer:
            answer.read(1)
        return None
    except urllib.error.HTTPError as e:
        return f"HTTP {e.code} for {url}"
    except (urllib.error.URLError, OSError, ValueError) as e:
        return str(getattr(e, "reason", None) or e)


def externally_managed() -> bool:
    """PEP 668: this Python is not a virtual environment and its standard-library folder holds EXTERNALLY-MANAGED (pip
    refuses to install into it)."""
    if sys.prefix != sys.base_prefix:
        return False
    return (Path(sysconfig.get_path("stdlib")) / "EXTERNALLY-MANAGED").is_file()


def venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def activate_command(venv: Path) -> str:
    """The one command that activates ``venv`` in the user's shell (relative to the working folder where it is inside)."""
    try:
        shown = venv.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        shown = venv.resolve()
    if os.name == "nt":
        return f"{shown}\\Scripts\\activate"
    return f"source {shlex.quote(str(shown))}/bin/activate"


# --------------------------------------------------------------------------- the plan


def torch_plan(choice: str, python: str, index: str, floor: str, ceiling: str | None = None, pin: str | None = None,
               cuda_index: str = CUDA_INDEX, settings: dict[str, str] | None = None) -> tuple[str, list[list[str]]]:
    """(what will happen, in words: one line; the pip commands for torch).

    ``floor`` / ``ceiling``: the tested range (``ceiling`` None: :func:`tested_ceiling`); ``pin``: the release a ``-c``
    file pins torch to; ``settings``: pip's cert and proxy for the index probes (None: read them when needed). A dry run asks the
    same read-only questions (the probe, ``pip index versions``) so that it says what a run would install."""
    ceiling = ceiling or tested_ceiling()
    wanted = requirement(floor, ceiling, pin)
    pip = [python, "-m", "pip", "install", "-q"]
    said = ""
    if choice == "auto":
        have = installed_torch()
        if have is not None:
            return keep_torch(have, floor, ceiling, pin), []
        driver, why = nvidia_driver()
        if driver is not None and release(driver) >= release(MIN_DRIVER):
            choice = "cuda"
        else:
            choice = "cpu"
            if driver is not None:
                said = (f"the NVIDIA driver {driver} is older than {MIN_DRIVER}, which torch's CUDA {CUDA} build needs: "
                        "the CPU build (update the driver to use the GPU, or --torch cuda to take that build anyway); ")
            elif why != "no nvidia-smi":
                said = f"{why}: the CPU build (--torch cuda to take the CUDA build anyway); "
            if platform.system() != "Linux":
                return f"{said or 'no NVIDIA driver; '}PyPI's {wanted}, a CPU build on {platform.system()}", [pip + [wanted]]
    if choice == "none":
        return "torch left to pip as an ordinary dependency", []
    local, where, what = ("cu" + CUDA.replace(".", ""), cuda_index, f"the CUDA {CUDA} build") if choice == "cuda" else (
        "cpu", index, "the CPU build")
    if settings is None:  # pip's certificate and proxy matter for an https index (PyTorch's); a local one needs neither
        settings = pip_settings(python) if where.startswith("https:") else {}
    blocked = unreachable(where, settings)
    if blocked is not None:  # a proxy, a mirror, no route: PyPI's own torch, said in the one line
        pypi = "a CUDA build on Linux, several GB" if platform.system() == "Linux" else "a CPU build on " + platform.system()
        return (f"{said}PyTorch's index {where} cannot be reached ({blocked}): PyPI's {wanted} instead ({pypi}; "
                f"{'--torch-cuda-index' if choice == 'cuda' else '--torch-index'} URL names a mirror)"), [pip + [wanted]]
    version = newest_build(available_versions(python, where), local, floor, ceiling, pin)
    if version is None:  # pip too old for `pip index`, or nothing listed: PyTorch's own instruction
        return f"{said}{wanted}, {what}, from {where}", [pip + [wanted, "--index-url", where]]
    return f"{said}torch {version}, {what}, from {where}", [pip + [f"torch=={version}", "--index-url", where]]


def keep_torch(have: tuple[str, str], floor: str, ceiling: str, pin: str | None) -> str:
    """What keeping the installed torch means, in words; SystemExit where pip would replace it (older than the floor, or
    not the ``-c`` file's pin: PyPI's newest, a CUDA build on Linux)."""
    version, build = have
    replace = "say which build replaces it: --torch cpu or --torch cuda"
    if release(version) < release(floor):
        raise SystemExit(f"install.py: the installed torch {version} ({build}) is older than {floor}, the oldest "
                         f"this version runs on: upgrade it yourself, or {replace}")
    if pin and release(version)[:3] != release(pin)[:3]:
        raise SystemExit(f"install.py: the installed torch {version} ({build}) is not {pin}, which the constraints file "
                         f"pins: pip would replace it with PyPI's {pin}; leave out -c, or {replace}")
    newer = f"; CI tests the releases below {ceiling}" if release(version) >= release(ceiling) else ""
    return f"keeping the installed torch {version} ({build} build{newer})"


def docs_requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """The ``docs`` extra's requirements, as pyproject.toml declares them."""
    found = re.search(r"^docs\s*=\s*\[(.*)\]\s*(?:#.*)?$", pyproject.read_text(encoding="utf-8"), re.M)  # one line
    if not found:
        raise SystemExit(f"install.py: no docs extra in {pyproject}")
    return re.findall(r'"([^"]+)"', found.group(1))


# --------------------------------------------------------------------------- main


def in_venv(argv: list[str], venv: Path, dry_run: bool) -> int:
    """Under an externally-managed Python: make (or reuse) the virtual environment ``venv``, run this script there
    with the same arguments, and say how ``nas`` is reached."""
    python = venv_python(venv)
    print(f"install.py: {sys.executable} is externally managed (PEP 668: pip may not install into it): "
          f"{'reusing' if python.exists() else 'making'} the virtual environment {venv}", file=sys.stderr)
    if not python.exists():
        made = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True)
        if made.returncode != 0:
            said = (made.stderr.strip() or made.stdout.strip()).splitlines()
            print(f"install.py: cannot make {venv}: {said[-1] if said else f'exit {made.returncode}'} (on Debian or "
                  "Ubuntu: sudo apt install python3-venv)", file=sys.stderr)
            return 1
    done = subprocess.run([str(python), str(Path(__file__).resolve()), *argv]).returncode
    if done == 0:
        nas = venv / ("Scripts/nas.exe" if os.name == "nt" else "bin/nas")
        how = "would be" if dry_run else "is"
        print(f"install.py: nas {how} {nas}; activate the environment first: {activate_command(venv)}", file=sys.stderr)
    return done


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python3 scripts/install.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("extras", nargs="*", metavar="EXTRA", help=f"optional parts to add: {', '.join(EXTRAS)}")
    p.add_argument("--torch", choices=("auto", "cpu", "cuda", "none"), default="auto",
                   help="auto (default): keep an installed torch, else the CUDA build where nvidia-smi reports a driver "
                        "new enough for it, else the CPU build; none: let pip pick torch as any other dependency")
    p.add_argument("--torch-index", default=CPU_INDEX, metavar="URL", help=f"where the CPU build comes from ({CPU_INDEX})")
    p.add_argument("--torch-cuda-index", default=CUDA_INDEX, metavar="URL",
                   help=f"where the CUDA {CUDA} build comes from ({CUDA_INDEX})")
    p.add_argument("-c", "--constraint", metavar="FILE", help="a pip constraints file for every package (constraints.txt: "
                   "what CI tests, torch included; constraints-min.txt: the declared floors)")
    p.add_argument("--venv", metavar="DIR", default=str(ROOT / ".venv"),
                   help="the virtual environment made (or reused) under an externally-managed Python (default .venv in "
                        "the checkout)")
    p.add_argument("--dry-run", action="store_true", help="print the pip commands, run nothing")
    args = p.parse_args(argv)
    unknown = [e for e in args.extras if e not in EXTRAS]
    if unknown:
        p.error(f"unknown extra {unknown[0]!r}: expected some of {', '.join(EXTRAS)}")
    constraint = Path(args.constraint).resolve() if args.constraint else None
    if constraint is not None and not constraint.is_file():
        p.error(f"-c {args.constraint}: no such file")
    if externally_managed():
        return in_venv(argv, Path(args.venv).resolve(), args.dry_run)

    python = sys.executable
    if args.extras == ["docs"]:  # the site is built from the sources: MkDocs alone, no torch, no toolkit
        said = ("the docs extra alone: MkDocs and mkdocstrings, neither torch nor the toolkit (the site is built from the "
                "sources without importing them)")
        commands = [[python, "-m", "pip", "install", "-q", *docs_requirements()]]
    else:
        pin = torch_pin(constraint) if constraint is not None else None
        said, commands = torch_plan(args.torch, python, args.torch_index, torch_floor(), tested_ceiling(), pin,
                                    args.torch_cuda_index)
        extras = f"[{','.join(args.extras)}]" if args.extras else ""
        commands.append([python, "-m", "pip", "install", "-q", "-e", f"{ROOT}{extras}"])
    if constraint is not None:
        commands = [c + ["-c", str(constraint)] for c in commands]
    print(f"install.py: {'' if args.extras == ['docs'] else 'torch: '}{said}", file=sys.stderr)
    for command in commands:
        print("+ " + shlex.join(command), file=sys.stderr)
        if not args.dry_run and subprocess.run(command).returncode != 0:
            print(f"install.py: failed: {shlex.join(command)}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
