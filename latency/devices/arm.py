"""``arm`` (and any board with Python): a self-contained bundle timed by ONNX Runtime on the board.

``write_bundle`` packs, into one ``.tar.gz``:

* ``runner.py``: :mod:`latency.timing_core` + ``bundle_main.py`` in one file; needs only
  Python 3.9+, numpy and onnxruntime (>= :data:`MIN_ONNXRUNTIME`, for opset-23 ``Attention``);
* ``manifest.json``: the space, workload, protocol, seed, and per subnet its key, pass, features
  and weight layout (and, for a decode workload, the step graph's input layout, from which the
  runner draws the inputs of ``context`` tokens seen); the table sidecar the runner completes
  with the board's fingerprint;
* ``models/*.onnx``: weight-stripped graphs (the runner draws random weights: timing does not
  depend on their values), a few hundred KB each;
* ``README.txt``: how to run it.

``run_remote`` drives the same bundle over ssh (``--device ssh://user@host``): copy, run,
fetch the table back (resuming a partial one).  ``$NAS_SSH`` / ``$NAS_SCP`` replace the
``ssh`` / ``scp`` commands (tests use local stand-ins).
"""

from __future__ import annotations

import io
import json
import os
import shlex
import subprocess
import tarfile
import time
from pathlib import Path
from typing import Callable

import torch

from search_spaces import Space, Subnet, UserError, Workload

from ..features import table_features
from ..onnx_graphs import cached_decode_graph, cached_graph
from ..protocol import reference_model
from ..table import make_meta
from ..timing_core import Settings, sidecar_path

MIN_ONNXRUNTIME = "1.23.0"
ROOT = "nas-latency-bundle"
HERE = Path(__file__).resolve().parent


def runner_source() -> str:
    """``timing_core.py`` then ``bundle_main.py`` (minus its imports of the former): one runnable file."""
    core = (HERE.parent / "timing_core.py").read_text()
    main = (HERE / "bundle_main.py").read_text().splitlines()
    main = [ln for ln in main if not ln.startswith(("from __future__", "from latency.timing_core import"))]
    return core + "\n\n# " + "-" * 75 + " runner (latency/devices/bundle_main.py)\n" + "\n".join(main) + "\n"


README = """\
Latency bundle: {n} ONNX graphs of subnets of space {space} (hash {hash}), workload {workload}.

On the board (Python 3.9+):
    python3 -m venv venv && . venv/bin/activate
    pip install numpy 'onnxruntime>={ort}'
    python3 runner.py                 # or: --threads N, --out NAME.csv
It writes timings.csv and timings.csv.json (the board's fingerprint); running it again
resumes. Copy both files back and fit a predictor on the host:
    nas fit-predictor timings.csv --out predictor-board
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
) -> Path:
    """Write the bundle for ``passes`` (``{"measure": [...], "retest": [...]}``) to ``path`` (.tar.gz)."""
    from supernet import SuperTransformer
    from supernet.onnx_export import DEFAULT_OPSET

    path = Path(path)
    if not path.name.endswith((".tar.gz", ".tgz")):
        raise UserError(f"--bundle: {path} should end in .tar.gz")
    supernet = SuperTransformer(space, generator=torch.Generator().manual_seed(seed)).eval()
    names = list(table_features(space, space.smallest(), workload))
    meta = make_meta({}, space, workload, settings.to_dict(), seed, names)
    graphs: dict[str, Path] = {}

    def add_graph(model) -> dict:
        """The model's graph entry: file, weight layout and, for a decode step, its input layout."""
        if workload.kind == "decode":
            graph, tensors, inputs = cached_decode_graph(model)
        else:
            (graph, tensors), inputs = cached_graph(model), None
        graphs[graph.name] = graph
        return {"graph": f"models/{graph.name}", "tensors": tensors, **({"inputs": inputs} if inputs else {})}

    reference = add_graph(reference_model(supernet.extract(space.smallest()).config))
    models, total = [], sum(len(v) for v in passes.values())
    for pass_, subnets in passes.items():
        for s in subnets:
            feats = table_features(space, s, workload)
            models.append(
                {"key": s.key, "pass": pass_, "subnet": s.to_json(), "features": feats, **add_graph(supernet.extract(s))}
            )
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
    }
    readme = README.format(
        n=len(graphs), space=space.name, hash=space.hash, workload=str(workload),
        ort=MIN_ONNXRUNTIME, protocol=json.dumps(settings.to_dict()),
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        for name, text in (
            ("runner.py", runner_source()),
            ("manifest.json", json.dumps(manifest, indent=1)),
            ("README.txt", readme),
        ):
            _add_text(tar, f"{ROOT}/{name}", text)
        for name, graph in sorted(graphs.items()):
            tar.add(graph, arcname=f"{ROOT}/models/{name}")
    os.replace(tmp, path)
    return path


def _add_text(tar: tarfile.TarFile, name: str, text: str) -> None:
    data = text.encode()
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), int(time.time()), 0o755 if name.endswith(".py") else 0o644
    tar.addfile(info, io.BytesIO(data))


# --------------------------------------------------------------------------- ssh://user@host


def parse_target(target: str) -> str:
    host = target[len("ssh://"):]
    if not host or "/" in host or " " in host:
        raise UserError(f"--device: {target!r} should be ssh://user@host (or ssh://host)")
    return host


def run_remote(
    target: str,
    bundle: Path,
    out: Path,
    *,
    threads: int | None = None,
    clock: str | None = None,
    workdir: str = "/tmp/nas-latency",
) -> None:
    """Copy ``bundle`` to the host, run its runner there (resuming ``out`` if it exists), fetch ``out`` back."""
    host = parse_target(target)
    ssh = shlex.split(os.environ.get("NAS_SSH", "ssh"))
    scp = shlex.split(os.environ.get("NAS_SCP", "scp"))
    remote = f"{workdir}/{bundle.name.split('.')[0]}"

    def call(cmd: list[str], what: str) -> None:
        done = subprocess.run(cmd)
        if done.returncode != 0:
            raise UserError(f"--device {target}: {what} failed (exit {done.returncode}): {' '.join(map(shlex.quote, cmd))}")

    call(ssh + [host, f"mkdir -p {shlex.quote(remote)}"], "creating the remote folder")
    call(scp + [str(bundle), f"{host}:{remote}/bundle.tar.gz"], "copying the bundle")
    if out.exists():
        call(scp + [str(out), sidecar_path(str(out)), f"{host}:{remote}/"], "copying the partial table")
    run = f"cd {shlex.quote(remote)} && tar xzf bundle.tar.gz && python3 {ROOT}/runner.py --out {shlex.quote(out.name)}"
    if threads:
        run += f" --threads {int(threads)}"
    if clock:
        run += f" --clock {shlex.quote(clock)}"
    call(ssh + [host, run], "running the bundle")
    out.parent.mkdir(parents=True, exist_ok=True)
    call(scp + [f"{host}:{remote}/{out.name}", f"{host}:{remote}/{out.name}.json", str(out.parent) + "/"], "fetching the table")
