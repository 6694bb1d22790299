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


def run_emulated(bundle: Path, work: Path, arm_root: Path) -> dict:
    """scripts/emulated_arm.py on ``bundle`` in ``work`` (as a user runs it); its parity report."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NAS_ARM_ROOT": str(arm_root)}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(bundle), "--work", str(work)], env=env, capture_output=True, text=True, timeout=1100
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((work / "parity.json").read_text())


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("workload", ["prefill", "decode"])
def test_tiny_bundle_runs_on_emulated_aarch64_and_matches_x86(tmp_path, arm_root, workload):
    import onnxruntime

    space = tiny_space(tmp_path, workload)
    subnets = campaign_subnets(space, 3, seed=0)  # the largest, the smallest, one drawn
    bundle = write_bundle(tmp_path / "b.tar.gz", space, space.workload(workload), {"measure": subnets}, SMALLEST, seed=0)
    with tarfile.open(bundle) as tar:
        graphs = {Path(n).name for n in tar.getnames() if n.endswith(".onnx")}
    work = tmp_path / "board"
    parity = run_emulated(bundle, work, arm_root)
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
        env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
    )  # what the bundle's README says: 3 subnets prove the path, a fit needs 10
    assert fit.returncode == 2 and "3 measured subnets; fitting needs at least 10" in fit.stderr, fit.stderr


@pytest.mark.timeout(1200)
def test_a_custom_ops_bundle_carries_its_aarch64_library_and_matches_x86(tmp_path, arm_root):
    """``--custom-ops`` on the ARM bundle: the graphs hold the nas.kernels operators, the bundle carries their library
    cross-compiled for aarch64 (lib/), the emulated board registers it and computes what this host's build computes."""
    from supernet.attention import ort_ops

    if ort_ops.board_library()[0] is None or ort_ops.library()[0] is None:
        pytest.skip(f"no custom-op library for both sides: {ort_ops.board_library()[1] or ort_ops.library()[1]}")
    tiny_space(tmp_path, "prefill")  # (writes tiny8.yaml: tiny at 8 tokens)
    text = (tmp_path / "tiny8.yaml").read_text()
    types = "attention: [softmax, gqa:2, local:32, strided:16, linear, cosformer:256, hydra, sima, lsra:7, msla:5, convmod:7]"
    assert types in text
    (tmp_path / "ops.yaml").write_text(text.replace("name: tiny8", "name: tiny8-ops").replace(types, "attention: [local:32, "
                                                                                              "strided:16, linear, hydra]"))
    space = load_space(str(tmp_path / "ops.yaml"))
    subnets = campaign_subnets(space, 3, seed=0)
    with ort_ops.requested(board=True):
        bundle = write_bundle(tmp_path / "b.tar.gz", space, space.workload("prefill"), {"measure": subnets}, SMALLEST,
                              seed=0, custom_ops=ort_ops.board_library()[0])  # fmt: skip
    with tarfile.open(bundle) as tar:
        names = tar.getnames()
        manifest = json.loads(tar.extractfile("nas-latency-bundle/manifest.json").read())
        tar.extractall(tmp_path / "x", filter="data")
    assert manifest["custom_ops"] == "lib/libnas_ort_ops_neon.so" and "nas-latency-bundle/lib/libnas_ort_ops_neon.so" in names
    lib = (tmp_path / "x" / "nas-latency-bundle" / "lib" / "libnas_ort_ops_neon.so").read_bytes()
    assert lib[:4] == b"\x7fELF" and int.from_bytes(lib[18:20], "little") == 183  # an ELF for EM_AARCH64
    graphs = sorted((tmp_path / "x" / "nas-latency-bundle" / "models").glob("*.onnx"))
    models = {tmp_path / "x" / "nas-latency-bundle" / m["graph"] for m in manifest["models"]}
    assert models and all(ort_ops.uses_custom_ops(g) for g in models)  # each subnet's types have an operator (the
    # protocol's reference model is the task's own, softmax)
    work = tmp_path / "board"
    parity = run_emulated(bundle, work, arm_root)
    print(json.dumps(parity, indent=1))
    assert set(parity["graphs"]) == {g.name for g in graphs}
    for name, g in parity["graphs"].items():
        assert g["max_abs"] > 0 and g["max_abs_diff"] < 1e-5, (name, g)  # Neon against AVX: other summation orders
    fp = read_timings(work / "timings.csv").fingerprint
    assert fp["machine"] == "aarch64" and fp["custom_ops"] == "libnas_ort_ops_neon.so", fp


def test_a_bundle_refuses_a_missing_custom_op_library(tmp_path):
    """The runner's --custom-ops-library names a file that is not there: one line, exit 2, before anything runs."""
    space = tiny_space(tmp_path, "prefill")
    bundle = write_bundle(tmp_path / "b.tar.gz", space, space.workload("prefill"), {"measure": campaign_subnets(space, 3, 0)},
                          SMALLEST, seed=0)  # fmt: skip
    with tarfile.open(bundle) as tar:
        tar.extractall(tmp_path, filter="data")
    runner = tmp_path / "nas-latency-bundle" / "runner.py"
    done = subprocess.run([sys.executable, str(runner), "--parity", "p.npz", "--custom-ops-library", "nope.so"],
                          cwd=tmp_path, capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 2 and done.stderr.strip() == "error: --custom-ops-library: nope.so is not a file"
    assert not (tmp_path / "p.npz").exists()
