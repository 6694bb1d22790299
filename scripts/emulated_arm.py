"""Run a latency bundle on emulated aarch64 (qemu user mode) as a board user would, and check it against x86.

    python3 scripts/emulated_arm.py BUNDLE.tar.gz --work DIR [--root DIR] [--threads 1]

1. The aarch64 root (built once, cached in ``--root``, default ``$NAS_ARM_ROOT`` or
   ``~/.cache/nas-transformers/arm64-root``; rebuilt only when its recipe changes): Debian 12's arm64
   ``python3.11`` and its libraries (``apt-get download``, ``dpkg-deb -x``; the arm64 architecture is
   added to dpkg when missing), the aarch64 wheels of numpy and onnxruntime (the versions this Python
   has, installed by ``pip --platform ... --target``, no emulation needed), and ``proc/cpuinfo`` in
   aarch64 format: qemu passes the host's x86 one through, and ONNX Runtime's CPU detection then
   finds no ARM core and crashes (``-L ROOT`` maps ``/proc/cpuinfo`` to this file).
2. The bundle is unpacked into ``--work`` and run as its README.txt tells a board user,
   ``python3 nas-latency-bundle/runner.py --out timings.csv``, only the interpreter changed to
   ``qemu-aarch64-static -L ROOT ROOT/usr/bin/python3.11 -I`` (the root's site-packages stand in for
   the README's venv). Running again resumes the table.
3. Parity: the runner's ``--parity`` writes every graph's outputs (the timing inputs, its seeded
   weights) on aarch64 and, with this Python's ONNX Runtime, on x86; the largest absolute
   difference per graph is printed and written to ``WORK/parity.json``.  A bundle of ``--custom-ops`` runs its
   aarch64 build of the custom operators there and this host's build of the same source here.

It proves the bundle loads, runs and ingests on aarch64 (its numbers match x86's); emulated timings mean
nothing (seconds per call). Needs ``qemu-aarch64-static`` (``apt-get install qemu-user-static``), root
for ``dpkg --add-architecture`` / ``apt-get`` the first time, and Debian's and PyPI's registries then.
Errors: one line, exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

# python3.11 and what it loads (apt-cache depends --recurse of python3.11:arm64, without dpkg, tar and
# install-info and the arch-independent media-types), plus libstdc++6 for onnxruntime: 30 packages.
PACKAGES = (
    "gcc-12-base libc6 libgcc-s1 libstdc++6 libbz2-1.0 libcom-err2 libcrypt1 libdb5.3 libexpat1 libffi8 "
    "libgssapi-krb5-2 libk5crypto3 libkeyutils1 libkrb5-3 libkrb5support0 liblzma5 libncursesw6 libnsl2 "
    "libpython3.11-minimal libpython3.11-stdlib libreadline8 libsqlite3-0 libssl3 libtinfo6 libtirpc3 libuuid1 "
    "python3.11-minimal python3.11 zlib1g"
).split()
PLATFORMS = ("manylinux_2_28_aarch64", "manylinux_2_17_aarch64", "manylinux2014_aarch64")
SITE = "usr/local/lib/python3.11/dist-packages"
MARKER = ".nas-arm-root.json"
# A Raspberry Pi 4's Cortex-A72, as the kernel shows it; the Hardware line names what it is.
CPUINFO = "".join(
    f"processor\t: {i}\nBogoMIPS\t: 108.00\nFeatures\t: fp asimd evtstrm crc32 cpuid\nCPU implementer\t: 0x41\n"
    f"CPU architecture: 8\nCPU variant\t: 0x0\nCPU part\t: 0xd08\nCPU revision\t: 3\n\n"
    for i in range(2)
) + "Hardware\t: qemu-aarch64 user-mode emulation\n"


class Refused(Exception):
    """One line for the user; exit status 2."""


def default_root() -> Path:
    return Path(os.environ.get("NAS_ARM_ROOT") or Path.home() / ".cache" / "nas-transformers" / "arm64-root")


def qemu() -> str:
    path = shutil.which("qemu-aarch64-static")
    if not path:
        raise Refused("qemu-aarch64-static is not on PATH: apt-get install qemu-user-static")
    return path


def host_versions() -> dict[str, str]:
    """The wheels the root gets: this Python's numpy and onnxruntime, so both sides run the same versions."""
    try:
        return {name: version(name) for name in ("numpy", "onnxruntime")}
    except PackageNotFoundError as e:
        raise Refused(f"{e.name} is not installed for {sys.executable}: the x86 side of the parity check needs it") from None


def _run(cmd: list[str], what: str, **kw) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if done.returncode != 0:
        said = [ln for ln in (done.stderr + done.stdout).splitlines() if ln.strip()]
        raise Refused(f"{what} failed (exit {done.returncode}): {said[-1] if said else ' '.join(cmd)}")
    return done


def _download_debs(into: Path) -> None:
    names = [f"{p}:arm64" for p in PACKAGES]
    if "arm64" not in subprocess.run(["dpkg", "--print-foreign-architectures"], capture_output=True, text=True).stdout.split():
        _run(["dpkg", "--add-architecture", "arm64"], "dpkg --add-architecture arm64")
        _run(["apt-get", "update", "-qq"], "apt-get update")
    try:
        _run(["apt-get", "download", *names], "apt-get download of the arm64 packages", cwd=into)
    except Refused:  # lists without arm64 yet, or stale: update once and retry
        _run(["apt-get", "update", "-qq"], "apt-get update")
        _run(["apt-get", "download", *names], "apt-get download of the arm64 packages", cwd=into)


def ensure_root(root: Path, log=print) -> Path:
    """The cached aarch64 root at ``root``, built (or rebuilt, if its recipe changed) when needed."""
    qemu()
    recipe = {"packages": list(PACKAGES), "wheels": host_versions(), "platforms": list(PLATFORMS), "cpuinfo": CPUINFO}
    marker = root / MARKER
    if marker.exists() and json.loads(marker.read_text()).get("recipe") == recipe:
        return root
    if root.exists() and any(root.iterdir()) and not marker.exists():
        raise Refused(f"--root {root}: exists, is not empty and is no arm64 root of ours; give another folder")
    start = time.time()
    root.parent.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix=f"{root.name}.partial-", dir=root.parent))  # a new folder: never a planted link
    mask = os.umask(0o022)
    os.umask(mask)
    os.chmod(build, 0o777 & ~mask)  # what mkdir gives, not mkdtemp's 0700 (the root is published by a rename)
    (build / ".debs").mkdir()
    try:
        log(f"building the aarch64 root in {root} (Debian arm64 packages, then wheels) ...")
        _download_debs(build / ".debs")
        for deb in sorted((build / ".debs").glob("*.deb")):
            _run(["dpkg-deb", "-x", str(deb), str(build)], f"dpkg-deb -x {deb.name}")
        shutil.rmtree(build / ".debs")
        wheels = [f"{k}=={v}" for k, v in recipe["wheels"].items()]
        platforms = [a for p in PLATFORMS for a in ("--platform", p)]
        _run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-compile", "--only-binary=:all:", *platforms,
             "--python-version", "3.11", "--implementation", "cp", "--target", str(build / SITE), *wheels],
            "pip install of the aarch64 wheels",
        )
        # Folders the emulated Python looks in, made here so that -L never falls through to the host's x86 ones.
        for d in ("usr/lib/python3/dist-packages", "usr/lib/python3.11/dist-packages", "proc"):
            (build / d).mkdir(parents=True, exist_ok=True)
        (build / "proc" / "cpuinfo").write_text(CPUINFO)
        (build / MARKER).write_text(json.dumps({"recipe": recipe, "built_s": round(time.time() - start, 1)}, indent=1))
        if root.exists():
            shutil.rmtree(root)
        root.parent.mkdir(parents=True, exist_ok=True)
        os.replace(build, root)
    finally:
        shutil.rmtree(build, ignore_errors=True)
    log(f"built {root} in {time.time() - start:.0f} s")
    return root


def python_cmd(root: Path) -> list[str]:
    """The emulated interpreter call that replaces the README's ``python3``."""
    return [qemu(), "-L", str(root), str(root / "usr" / "bin" / "python3.11"), "-I"]


def unpack(bundle: Path, work: Path) -> Path:
    work.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(bundle) as tar:
            tar.extractall(work, filter="data")
    except (OSError, tarfile.TarError) as e:
        raise Refused(f"{bundle}: not a readable bundle (.tar.gz): {e}") from None
    if not (work / "nas-latency-bundle" / "runner.py").exists():
        raise Refused(f"{bundle}: no nas-latency-bundle/runner.py inside; not a latency bundle")
    return work


def compare(arm: Path, x86: Path) -> dict:
    """Per graph: outputs compared, the largest |x86| and the largest |aarch64 - x86|."""
    import numpy as np

    a, b = np.load(arm), np.load(x86)
    if sorted(a.files) != sorted(b.files):
        raise Refused(f"{arm} and {x86} hold other outputs: {sorted(set(a.files) ^ set(b.files))}")
    graphs: dict[str, dict] = {}
    for key in sorted(a.files):
        graph = key.rsplit(":", 1)[0]
        if a[key].shape != b[key].shape:
            raise Refused(f"{key}: aarch64 gave shape {a[key].shape}, x86 {b[key].shape}")
        g = graphs.setdefault(graph, {"outputs": 0, "max_abs": 0.0, "max_abs_diff": 0.0})
        g["outputs"] += 1
        g["max_abs"] = max(g["max_abs"], float(np.abs(b[key]).max(initial=0.0)))
        g["max_abs_diff"] = max(g["max_abs_diff"], float(np.abs(a[key].astype(np.float64) - b[key]).max(initial=0.0)))
    return {"graphs": graphs, "max_abs_diff": max(g["max_abs_diff"] for g in graphs.values())}


def host_library(work: Path) -> list[str]:
    """The x86 side's ``--custom-ops-library`` where the bundle carries the custom operators (built for aarch64): this
    host's build of the same source; none otherwise."""
    manifest = json.loads((work / "nas-latency-bundle" / "manifest.json").read_text())
    if not manifest.get("custom_ops"):
        return []
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from supernet.attention import ort_ops

    path, why = ort_ops.library()
    if path is None:
        raise Refused(f"the bundle uses the custom operators and this host cannot build them for the x86 side: {why}")
    return ["--custom-ops-library", str(path)]


def run(bundle: Path, work: Path, root: Path, threads: int = 1, log=print) -> dict:
    """Steps 1-3 of the module's docstring; returns the parity report (also in WORK/parity.json)."""
    ensure_root(root, log)
    unpack(bundle, work)
    runner = ["nas-latency-bundle/runner.py"]
    emulated = python_cmd(root)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "NAS_"))}
    start = time.time()
    timed = subprocess.run(emulated + runner + ["--out", "timings.csv", "--threads", str(threads)], cwd=work, env=env)
    if timed.returncode != 0:
        raise Refused(f"the bundle's runner failed on emulated aarch64 (exit {timed.returncode}); its error is above")
    timing_s = time.time() - start
    start = time.time()
    _run(emulated + runner + ["--parity", "arm.npz", "--threads", str(threads)], "the aarch64 parity run", cwd=work, env=env)
    parity_s = time.time() - start
    x86 = [sys.executable, "-I", *runner, "--parity", "x86.npz", "--threads", str(threads), *host_library(work)]
    _run(x86, "the x86 parity run", cwd=work, env=env)
    report = compare(work / "arm.npz", work / "x86.npz")
    report.update(
        bundle=str(bundle),
        onnxruntime=host_versions()["onnxruntime"],
        emulated_timing_s=round(timing_s, 1),
        emulated_parity_s=round(parity_s, 1),
    )
    (work / "parity.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("bundle", type=Path, help="a bundle written by nas measure-latency --device arm --bundle B.tar.gz")
    p.add_argument("--work", type=Path, required=True, help="folder to unpack and run the bundle in (timings.csv lands there)")
    p.add_argument("--root", type=Path, default=default_root(), help="the cached aarch64 root (default $NAS_ARM_ROOT or "
                   "~/.cache/nas-transformers/arm64-root)")
    p.add_argument("--threads", type=int, default=1, help="ONNX Runtime threads, both sides (default 1)")
    args = p.parse_args(argv)
    try:
        if not args.bundle.is_file():
            raise Refused(f"{args.bundle}: no such bundle")
        report = run(args.bundle, args.work, args.root, args.threads)
    except Refused as e:
        print(f"emulated_arm: {e}", file=sys.stderr)
        return 2
    print(f"{'graph':<44} {'outputs':>7} {'max |x86|':>10} {'max |aarch64 - x86|':>20}")
    for name, g in report["graphs"].items():
        print(f"{name:<44} {g['outputs']:>7} {g['max_abs']:>10.4g} {g['max_abs_diff']:>20.3g}")
    print(f"aarch64 vs x86 (onnxruntime {report['onnxruntime']}): max |difference| {report['max_abs_diff']:.3g}; "
          f"emulated run {report['emulated_timing_s']} s (timing), {report['emulated_parity_s']} s (parity)")
    print(f"wrote {args.work / 'timings.csv'} (+ .json) and {args.work / 'parity.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
