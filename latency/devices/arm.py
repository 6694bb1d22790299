"""``arm`` (and any board with Python): a self-contained bundle timed by ONNX Runtime on the board.

``write_bundle`` packs, into one ``.tar.gz``:

* ``runner.py``: :mod:`latency.timing_core` + ``bundle_main.py`` in one file; needs only
  Python >= :data:`MIN_PYTHON` (onnxruntime >= 1.23 has no wheels for 3.9 on aarch64), numpy and
  onnxruntime (>= :data:`MIN_ONNXRUNTIME`, for opset-23 ``Attention``), and checks all three first;
* ``manifest.json``: the space, workload, protocol, seed, and per subnet its key, pass, features
  and weight layout (and, for a decode workload, the step graph's input layout, from which the
  runner draws the inputs of ``context`` tokens seen; at a workload kind of a task's own, the task's entry:
  for the translation task's ``translate``, the encoder and decoder-step graphs and the step's input layout, run
  by HAT's loop, :func:`latency.timing_core.translate_ort_runner`); the table sidecar the runner completes
  with the board's fingerprint;
* ``models/*.onnx``: weight-stripped graphs (the runner draws random weights: timing does not
  depend on their values), a few hundred KB each;
* with ``--custom-ops``, ``lib/libnas_ort_ops_neon.so``: the attention types' ONNX Runtime custom operators built for
  aarch64 (:func:`supernet.attention.ort_ops.board_library`), which the graphs use and the runner registers;
* ``README.txt``: how to run it.

``run_remote`` drives the same bundle over ssh (``--device ssh://user@host``): copy, run,
fetch the table back (resuming a partial one, also after a dropped connection).  ``$NAS_SSH`` /
``$NAS_SCP`` replace the ``ssh`` / ``scp`` commands (``ssh -F CONFIG``, local stand-ins in tests);
``$NAS_REMOTE_DIR`` the folder on the host (default ``/tmp/nas-latency``), ``$NAS_REMOTE_PYTHON`` the
interpreter there (default ``python3`` as the login shell finds it; e.g. ``~/venv/bin/python``).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import shlex
import subprocess
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from search_spaces import Space, Subnet, UserError, Workload, tasks
from search_spaces.errors import hide_password
from search_spaces.space import WORKLOAD_KINDS

from ..onnx_graphs import cached_decode_graph, cached_graph
from ..protocol import model_workload
from ..sampling import MIN_FIT_SUBNETS, MIN_RETEST_SUBNETS
from ..table import make_meta
from ..timing_core import Settings, sidecar_path

log = logging.getLogger(__name__)

MIN_ONNXRUNTIME = "1.23.0"
MIN_PYTHON = (3, 10)
ROOT = "nas-latency-bundle"
HERE = Path(__file__).resolve().parent


# Runs before anything else in runner.py (numpy is imported at the top of timing_core): the board's
# Python and packages are checked first, each shortfall one line and exit status 2.
PREAMBLE = """
import sys as _sys

def _refuse(text):
    print("error: " + text, file=_sys.stderr)
    _sys.exit(2)

if _sys.version_info < {py}:
    _refuse("this runner needs Python >= {py_text} (onnxruntime >= 1.23 has no wheels for older Pythons); this is Python "
            + _sys.version.split()[0])
_missing = []
for _name in ("numpy", "onnxruntime"):
    try:
        __import__(_name)
    except ImportError:
        _missing.append(_name)
if _missing:
    _refuse(" and ".join(_missing) + (" is" if len(_missing) == 1 else " are") + " not installed for " + _sys.executable
            + ": pip install numpy 'onnxruntime>={ort}'")
"""


def runner_source() -> str:
    """``timing_core.py`` (after the preamble) then ``bundle_main.py`` (minus its imports of the former): one runnable file."""
    core = (HERE.parent / "timing_core.py").read_text()
    future = "from __future__ import annotations\n"
    assert future in core, "timing_core.py must start with its future import"
    preamble = PREAMBLE.format(py=MIN_PYTHON, py_text=".".join(map(str, MIN_PYTHON)), ort=MIN_ONNXRUNTIME)
    core = core.replace(future, future + preamble, 1)
    main = (HERE / "bundle_main.py").read_text().splitlines()
    main = [ln for ln in main if not ln.startswith(("from __future__", "from latency.timing_core import"))]
    return core + "\n\n# " + "-" * 75 + " runner (latency/devices/bundle_main.py)\n" + "\n".join(main) + "\n"


README = """\
Latency bundle: {n} ONNX graphs of subnets of space {space} (hash {hash}), workload {workload}.
It times {measured} subnets, then re-times {retested} of them (test-retest).

On the board (Python >= {py}; onnxruntime >= 1.23 has no wheels for older Pythons):
    python3 -m venv venv && . venv/bin/activate
    pip install numpy 'onnxruntime>={ort}'
    python3 runner.py                 # or: --threads N, --out NAME.csv
It writes timings.csv and timings.csv.json (the board's fingerprint); running it again
resumes. Copy both files back and fit a predictor on the host:
    nas fit-predictor timings.csv --out predictor-board
A fit needs at least {min_fit} measured subnets (fewer are refused) and 100 or more to be
worth trusting; the test-retest agreement needs at least {min_retest} re-timed ones.{shortfall}
Protocol: {protocol}
"""


def write_bundle(
    path: str | Path,
    space: Space,
    workload: Workload,
    passes: dict[str, list[Subnet]],
    settings: Settings,
    *,
    seed: int,
    progress: Callable[[int, int, str], None] | None = None,
    custom_ops: Path | None = None,
) -> Path:
    """Write the bundle for ``passes`` (``{"measure": [...], "retest": [...]}``) to ``path`` (.tar.gz).
    ``custom_ops``: the board's custom-op library, carried as ``lib/<name>`` and registered by the runner (the graphs
    then come from exports inside :func:`supernet.attention.ort_ops.emitting`: the caller's ``requested(board=True)``)."""
    from supernet.onnx_export import DEFAULT_OPSET

    path = Path(path)
    if not path.name.endswith((".tar.gz", ".tgz")):
        raise UserError(f"--bundle: {path} should end in .tar.gz")
    task = tasks.of(space)  # the models exported, the reference and a row's features are the task's
    extract, reference_model = task.bundle_models(space, seed)
    names = list(task.table_features(space, space.smallest(), workload))
    meta = make_meta({}, space, workload, settings.to_dict(), seed, names)
    graphs: dict[str, Path] = {}

    def add_graph(model) -> dict:
        """The model's graph entry: file, weight layout and, for a decode step, its input layout; at a workload kind of
        a task's own, the task's entry (the translation task's: its encoder and decoder-step graphs)."""
        if workload.kind not in WORKLOAD_KINDS:
            entry, files = task.bundle_graphs(model)
            graphs.update(files)
            return entry
        if workload.kind == "decode":
            graph, tensors, inputs = cached_decode_graph(model)
        else:
            (graph, tensors), inputs = cached_graph(model), None
        graphs[graph.name] = graph
        text = {"seq_len": model_workload(workload, model).seq_len} if getattr(workload, "text_bytes", 0) else {}
        return {"graph": f"models/{graph.name}", "tensors": tensors, **({"inputs": inputs} if inputs else {}), **text}

    reference = add_graph(reference_model)
    models, total = [], sum(len(v) for v in passes.values())
    for pass_, subnets in passes.items():
        for s in subnets:
            feats = task.table_features(space, s, workload)
            models.append({"key": s.key, "pass": pass_, "subnet": s.to_json(), "features": feats, **add_graph(extract(s))})
            if progress is not None:
                progress(len(models), total, s.key)
    manifest = {
        "format": "nas-latency-bundle",
        "version": 1,
        "meta": meta,
        "workload_label": workload.label,
        "seed": seed,
        "opset": DEFAULT_OPSET,
        "exporter_torch": torch.__version__,
        "min_onnxruntime": MIN_ONNXRUNTIME,
        "reference": reference,
        "models": models,
        **({"custom_ops": f"lib/{Path(custom_ops).name}"} if custom_ops else {}),
    }
    measured, retested = len(passes.get("measure", [])), len(passes.get("retest", []))
    short = measured < MIN_FIT_SUBNETS or retested < MIN_RETEST_SUBNETS
    readme = README.format(
        n=len(graphs), space=space.name, hash=space.hash, workload=str(workload), measured=measured, retested=retested,
        py=".".join(map(str, MIN_PYTHON)), ort=MIN_ONNXRUNTIME, protocol=json.dumps(settings.to_dict()),
        min_fit=MIN_FIT_SUBNETS, min_retest=MIN_RETEST_SUBNETS,
        shortfall="\nThis bundle has fewer: it proves the path, its table will not make a predictor." if short else "",
    )
    from supernet.files import atomic_stream

    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_stream(path) as f, tarfile.open(fileobj=f, mode="w:gz") as tar:  # Ctrl-C, a full disk: nothing left
        for name, text in (
            ("runner.py", runner_source()),
            ("manifest.json", json.dumps(manifest, indent=1)),
            ("README.txt", readme),
        ):
            _add_text(tar, f"{ROOT}/{name}", text)
        for name, graph in sorted(graphs.items()):
            tar.add(graph, arcname=f"{ROOT}/models/{name}")
        if custom_ops:
            tar.add(custom_ops, arcname=f"{ROOT}/{manifest['custom_ops']}")
    return path


def _add_text(tar: tarfile.TarFile, name: str, text: str) -> None:
    data = text.encode()
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), int(time.time()), 0o755 if name.endswith(".py") else 0o644
    tar.addfile(info, io.BytesIO(data))


# --------------------------------------------------------------------------- ssh://user@host


SSH_FORMS = "ssh://user@host, ssh://host or ssh://user@host:port"
_SSH_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")  # a user or host name (or ssh config alias): never an option
_SSH_IPV6 = re.compile(r"\[[0-9A-Fa-f:.]+\]")


@dataclass(frozen=True)
class SshTarget:
    """Where ``--device ssh://[user@]host[:port]`` points: each part checked, so that none reaches ``ssh`` or ``scp`` as
    an option (``ssh://-F<file>``, ``ssh://-oProxyCommand=...`` would run a command) or as a host it is not."""

    user: str | None
    host: str
    port: int | None

    @property
    def destination(self) -> str:
        """``user@host`` as ``scp`` takes it (an IPv6 address in its brackets) and messages show it."""
        return f"{self.user}@{self.host}" if self.user else self.host

    @property
    def login(self) -> str:
        """``user@host`` as ``ssh`` takes it (an IPv6 address without brackets)."""
        return self.destination.replace("[", "").replace("]", "")

    @property
    def ssh_options(self) -> list[str]:
        return ["-p", str(self.port)] if self.port else []

    @property
    def scp_options(self) -> list[str]:
        return ["-P", str(self.port)] if self.port else []


def parse_target(target: str, flag: str = "--device") -> SshTarget:
    """The parts of an ``ssh://`` device, or one line naming ``flag`` and what is wrong (before anything is built)."""
    rest = target[len("ssh://"):] if target.startswith("ssh://") else None

    def refuse(why: str) -> UserError:  # (ssh://user:password@host: the password is never said)
        return UserError(hide_password(f"{flag}: {hide_password(target)[:80]!r} {why}; write {SSH_FORMS}", target))

    if not rest:
        raise refuse("names no host")
    user, at, hostport = rest.rpartition("@")
    if at and not _SSH_NAME.fullmatch(user):
        raise refuse("has an empty user name" if not user else f"has a user name {user[:40]!r} that is not a plain name "
                     "(letters, digits, . _ -; not starting with -)")
    if hostport.startswith("["):
        host, bracket, tail = hostport.partition("]")
        if not bracket:
            raise refuse(f"has an address {hostport[:40]!r} without its closing bracket")
        host += "]"
        port_text = tail[1:] if tail.startswith(":") else None
        if tail and port_text is None:
            raise refuse(f"has {tail[:20]!r} after the address")
        if not _SSH_IPV6.fullmatch(host):
            raise refuse(f"has a host {host[:40]!r} that is not an IPv6 address in brackets")
    else:
        host, colon, port_text = hostport.partition(":")
        port_text = port_text if colon else None
        if not host:
            raise refuse("has an empty host name")
        if not _SSH_NAME.fullmatch(host):
            raise refuse(f"has a host name {host[:40]!r} that is not a plain name (letters, digits, . _ -; not starting "
                         "with -)")
    port = None
    if port_text is not None:
        if not port_text.isascii() or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise refuse(f"has a port {port_text[:20]!r} that is not a number from 1 to 65535")
        port = int(port_text)
    return SshTarget(user or None, host, port)


def campaign_id(bundle: Path) -> str:
    """A short digest of the bundle's manifest: the same campaign (space, workload, protocol, seed, subnets) gets the
    same remote folder, so a rerun resumes there; another campaign never mixes into its table."""
    try:
        with tarfile.open(bundle) as tar:
            return hashlib.sha256(tar.extractfile(f"{ROOT}/manifest.json").read()).hexdigest()[:12]
    except (OSError, KeyError, AttributeError, tarfile.TarError):
        raise UserError(f"{bundle}: no readable {ROOT}/manifest.json inside; not a latency bundle") from None


def run_remote(
    target: str,
    bundle: Path,
    out: Path,
    *,
    threads: int | None = None,
    clock: str | None = None,
    memory_mb: float | None = None,
    workdir: str | None = None,
) -> None:
    """Copy ``bundle`` to the host, run its runner there (resuming ``out`` if it exists), fetch ``out`` back.

    ``ssh`` runs in batch mode (key or agent login; a password prompt or an unknown host key fails at
    once). A run that fails midway (a dropped connection, a killed process) still fetches the rows
    measured so far, when the host can be reached, so the same command resumes.
    """
    where = parse_target(target)
    host = where.destination
    ssh = shlex.split(os.environ.get("NAS_SSH", "ssh -o BatchMode=yes -o ConnectTimeout=30")) + where.ssh_options
    scp = shlex.split(os.environ.get("NAS_SCP", "scp -q -o BatchMode=yes -o ConnectTimeout=30")) + where.scp_options
    workdir = workdir or os.environ.get("NAS_REMOTE_DIR", "/tmp/nas-latency")
    remote = f"{workdir}/{out.stem}-{campaign_id(bundle)}"

    def call(cmd: list[str], what: str) -> None:
        done = subprocess.run(cmd, stderr=subprocess.PIPE, text=True)
        said = [ln.strip() for ln in done.stderr.splitlines() if ln.strip()]
        if done.returncode == 0:
            if said:
                log.info("%s: %s", what, " / ".join(said))
            return
        why = f"killed by signal {-done.returncode}" if done.returncode < 0 else f"exit {done.returncode}"
        if done.returncode == 255 and cmd[: len(ssh)] == ssh:  # ssh's own failure: the host, the key, the network
            raise UserError(f"--device {target}: ssh could not reach {host} ({what}): {said[-1] if said else why}")
        raise UserError(f"--device {target}: {what} failed ({why}): {said[-1] if said else ' '.join(map(shlex.quote, cmd))}")

    def fetch() -> None:
        out.parent.mkdir(parents=True, exist_ok=True)
        call(scp + [f"{host}:{remote}/{out.name}", f"{host}:{remote}/{out.name}.json", str(out.parent) + "/"],
             "fetching the table")

    call(ssh + [where.login, f"mkdir -p {shlex.quote(remote)}"], "creating the remote folder")
    call(scp + [str(bundle), f"{host}:{remote}/bundle.tar.gz"], "copying the bundle")
    if out.exists():  # the local table is the truth: it holds every row fetched so far
        call(scp + [str(out), sidecar_path(str(out)), f"{host}:{remote}/"], "copying the partial table")
    python = os.environ.get("NAS_REMOTE_PYTHON", "python3")
    run = f"cd {shlex.quote(remote)} && tar xzf bundle.tar.gz && {python} {ROOT}/runner.py --out {shlex.quote(out.name)}"
    if threads:
        run += f" --threads {int(threads)}"
    if clock:
        run += f" --clock {shlex.quote(clock)}"
    if memory_mb:
        run += f" --memory-mb {float(memory_mb):g}"
    try:
        call(ssh + [where.login, run], "running the bundle")
    except UserError as failed:
        try:
            fetch()
        except UserError:
            raise failed from None
        if not out.exists():
            raise failed from None
        raise UserError(f"{failed}; the rows measured so far are in {out}: run the same command again to resume") from None
    fetch()
