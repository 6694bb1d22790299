"""scripts/bench_lra.py --quick: every stage on tiny settings, lra.json's contract, and a rerun that trains nothing."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def fake_fashion_mnist(folder: Path) -> None:
    """Four small IDX files in the format of Fashion-MNIST's (the bench must not depend on the installed data)."""
    folder.mkdir()
    rng = np.random.default_rng(0)
    for split, n in (("train", 64), ("t10k", 16)):
        for kind, array in (("images-idx3", rng.integers(0, 256, size=(n, 28, 28))), ("labels-idx1", np.arange(n) % 10)):
            header = bytes([0, 0, 8, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
            with gzip.open(folder / f"{split}-{kind}-ubyte.gz", "wb") as f:
                f.write(header + array.astype(np.uint8).tobytes())


def test_bench_lra_quick_writes_the_contract_and_resumes(tmp_path):
    fake_fashion_mnist(tmp_path / "fm")
    env = {**os.environ, "NAS_FASHION_MNIST": str(tmp_path / "fm"), "NAS_CACHE": str(tmp_path / "cache"),
           "PYTHONPATH": str(ROOT)}
    out = tmp_path / "run"
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_lra.py"), "--quick", "--out", str(out), "--types",
           "softmax,linear", "--threads", "1"]
    first = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-4000:]
    record = json.loads((out / "lra.json").read_text())
    assert {"command", "machine", "load", "protocol", "accuracy", "speed", "search"} <= set(record)
    assert "in place of LRA's grayscale CIFAR-10" in record["note"] and "Fashion-MNIST" in first.stdout
    assert set(record["accuracy"]) == {"listops", "image", "pathfinder"}
    for task, types in record["accuracy"].items():
        assert set(types) == {"softmax", "linear"}
        for r in types.values():
            assert 0.0 <= r["ours"] <= 100.0
    assert record["accuracy"]["listops"]["softmax"]["lra"] == 36.37 and record["accuracy"]["pathfinder"]["linear"]["lra"] == 75.30
    assert record["speed"]["softmax"] == {"64": 1.0, "128": 1.0} and set(record["speed"]["linear"]) == {"64", "128"}
    assert all(v > 0 for v in record["speed"]["linear"].values())
    assert set(record["search"]) == {"listops", "pathfinder"}
    for rows in record["search"].values():
        assert len(rows) == 3 and [r["budget_ms"] for r in rows] == sorted(r["budget_ms"] for r in rows)
        for r in rows:
            assert r["verdict"].split(" (")[0] in ("found wins", "uniform wins")
            for side in ("found", "best_uniform"):
                assert 0.0 <= r[side]["test_accuracy"] <= 100.0 and r[side]["measured_ms"] > 0 and r[side]["subnet"]["depth"] >= 1
    for name in ("accuracy.png", "speed.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "accuracy.csv").read_text().startswith("task,type,ours,lra")
    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file() and p.name != "lra.json" and p.suffix != ".png"
              and p.suffix != ".csv"}
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-4000:]
    assert "steps of" not in again.stderr and "speed softmax (train)" not in again.stderr  # nothing trained or timed again
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
    rerun = json.loads((out / "lra.json").read_text())
    assert rerun["accuracy"] == record["accuracy"] and rerun["search"] == record["search"]
