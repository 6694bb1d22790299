"""``nas doctor`` says which fast paths are active and why not; ``train-supernet`` builds the compiled kernels before
its training clock starts and says how long that took."""

from __future__ import annotations

import os
import subprocess
import sys

import onnxruntime
import torch

from nas.cli import main
from supernet.attention import native, ort_ops

from tests.conftest import ROOT
from tests.supernet.test_data import write_docs
from tests.supernet.test_train import MICRO


def test_doctor_names_the_active_paths(capsys):
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    lines = {line.split(":")[0]: line for line in out.splitlines()}
    used, why = native.status()
    kernels = lines["compiled attention kernels"]
    if used:
        isa = native.choose_isa()[0]
        runs = ", ".join(native.runnable_isas())
        assert kernels.startswith(f"compiled attention kernels: active, {isa} (this CPU runs {runs})")
        assert f"cache {native.cached(isa)}" in kernels and "compiler " in kernels
    else:
        assert kernels.startswith(f"compiled attention kernels: not active: {why}")
    assert lines[f"ONNX Runtime {onnxruntime.__version__}"].endswith(", ".join(onnxruntime.get_available_providers()))
    assert lines["ONNX Runtime custom operators (--custom-ops)"].endswith(ort_ops.status_line())
    assert f"torch {torch.get_num_threads()} intra-op" in lines["threads"]


def test_doctor_says_why_not_when_the_kernels_are_off():
    env = {**os.environ, native.ENV_OFF: "0", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "nas", "doctor"], env=env, capture_output=True, text=True, check=True).stdout
    assert "compiled attention kernels: not active: NAS_NATIVE_KERNELS=0 (this CPU runs" in out
    assert "ONNX Runtime custom operators (--custom-ops): not available: NAS_NATIVE_KERNELS=0" in out


def test_train_supernet_builds_the_kernels_before_its_clock(tmp_path, monkeypatch, capsys):
    import supernet.train

    order = []
    real_prebuild, real_train = native.prebuild, supernet.train.train

    def prebuild():
        order.append("prebuild")
        return real_prebuild()

    def train(*args, **kwargs):
        order.append("train")
        return real_train(*args, **kwargs)

    monkeypatch.setattr(native, "prebuild", prebuild)
    monkeypatch.setattr(supernet.train, "train", train)
    space = tmp_path / "micro.yaml"
    space.write_text(MICRO)
    docs = write_docs(tmp_path / "docs", n=4)
    argv = ["train-supernet", str(space), "--out", str(tmp_path / "run"), "--data", str(docs), "--batch-size", "2",
            "--seq-len", "16", "--max-steps", "1", "--threads", "1", "--device", "cpu"]
    assert main(argv) == 0
    assert order == ["prebuild", "train"]
    err = capsys.readouterr().err
    used, why = native.status()
    note = f"compiled attention kernels ({native.choose_isa()[0]}): " if used else f"compiled attention kernels not used: {why}"
    assert f"nas train-supernet: {note}" in err
