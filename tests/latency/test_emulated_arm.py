"""The ARM bundle on aarch64: tiny's bundles run under qemu user-mode emulation (scripts/emulated_arm.py), as a
board user runs them, are ingested on the host, and compute what x86 ONNX Runtime computes.

Needs ``qemu-aarch64-static`` (Debian's qemu-user-static; .ci/run installs it) and, the first time, Debian's and
PyPI's registries to build the cached root (``$NAS_ARM_ROOT``, default ~/.cache/nas-transformers/arm64-root);
skipped with the reason where either is missing. Emulated ONNX Runtime runs about 17 MFLOP/s, so the prefill
bundle times tiny's subnets at 8 tokens (a copy of tiny.yaml), the decode bundle at tiny's own decode workload.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from latency.devices.arm import write_bundle
from latency.sampling import campaign_subnets
from latency.table import read_timings
from latency.timing_core import Settings
from search_spaces import load_space

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "emulated_arm.py"
# the fewest calls the protocol makes: one round, one sample, one reference sample per visit
SMALLEST = Settings(warmup=0, repeats=1, rounds=1, min_sample_ms=0.0, ref_samples=1, max_retries=0)

pytestmark = pytest.mark.skipif(
    shutil.which("qemu-aarch64-static") is None, reason="qemu-aarch64-static is not installed (apt-get install qemu-user-static)"
)


def emulated_arm():
    spec = importlib.util.spec_from_file_location("emulated_arm", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def arm_root():
    """The cached aarch64 root, built here if missing (a few seconds to a minute with the registries)."""
    script = emulated_arm()
    try:
        return script.ensure_root(script.default_root(), log=lambda _line: None)
    except script.Refused as e:
        pytest.skip(f"the emulated aarch64 root could not be built: {e}")


def tiny_space(tmp_path: Path, workload: str):
    """tiny itself for decode; for prefill a copy of tiny.yaml whose prefill workload is 8 tokens, not 256."""
    if workload == "decode":
        return load_space("tiny")
    text = (ROOT / "search_spaces" / "tiny.yaml").read_text()
    assert "prefill: {batch_size: 1, seq_len: 256}" in text
    path = tmp_path / "tiny8.yaml"
    path.write_text(text.replace("name: tiny", "name: tiny8").replace("seq_len: 256}", "seq_len: 8}"))
    return load_space(str(path))


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("workload", ["prefill", "decode"])
def test_tiny_bundle_runs_on_emulated_aarch64_and_matches_x86(tmp_path, arm_root, workload):
    import onnxruntime

    space = tiny_space(tmp_path, workload)
    subnets = campaign_subnets(space, 3, seed=0)  # the largest, the smallest, one drawn
    bundle = write_bundle(tmp_path / "b.tar.gz", space, space.workload(workload), {"measure": subnets}, SMALLEST, seed=0)
    with tarfile.open(bundle) as tar:
        graphs = {Path(n).name for n in tar.getnames() if n.endswith(".onnx")}
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NAS_ARM_ROOT": str(arm_root)}
    work = tmp_path / "board"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(bundle), "--work", str(work)], env=env, capture_output=True, text=True, timeout=1100
    )
    assert done.returncode == 0, done.stderr[-3000:]
    parity = json.loads((work / "parity.json").read_text())
    print(workload, json.dumps(parity, indent=1))  # the figures, for the record (pytest -s)
    assert set(parity["graphs"]) == graphs  # every graph of the bundle ran on both sides
    for name, g in parity["graphs"].items():
        assert g["max_abs"] > 0, name  # real outputs, not zeros (logits of N(0, 0.02) weights: about 0.1)
        assert g["max_abs_diff"] < 1e-6, (name, g)
    assert parity["onnxruntime"] == onnxruntime.__version__

    t = read_timings(work / "timings.csv")  # the host ingests what the emulated board wrote
    assert sorted(t.passes("measure")) == sorted(s.key for s in subnets) and not t.passes("retest")
    assert t.space.hash == space.hash and t.workload == space.workload(workload)
    assert all(r.median_ms > 0 for r in t.rows)
    fp = t.fingerprint
    assert fp["machine"] == "aarch64" and fp["cpu_model"] == "qemu-aarch64 user-mode emulation", fp
    assert fp["onnxruntime"] == onnxruntime.__version__ and fp["python"].startswith("3.11")

    fit = subprocess.run(
        [sys.executable, "-m", "nas", "fit-predictor", str(work / "timings.csv"), "--out", str(tmp_path / "pred")],
        env=env, capture_output=True, text=True,
    )  # what the bundle's README says: 3 subnets prove the path, a fit needs 10
    assert fit.returncode == 2 and "3 measured subnets; fitting needs at least 10" in fit.stderr, fit.stderr
