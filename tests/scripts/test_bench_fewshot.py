"""scripts/bench_fewshot.py --quick: real campaigns on this machine (torch and ONNX Runtime, one thread), the transfer,
the from-scratch comparison and the learning curve end to end; a second run reuses every table and predictor."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from latency.predictors import load_predictor
from latency.table import read_timings

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(600)
def test_bench_fewshot_quick_runs_end_to_end_and_resumes(tmp_path):
    env = {**os.environ, "NAS_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    space = ROOT / "tests" / "fixtures" / "claim_quick.yaml"  # 3 attention types: few ONNX parts to export in a fresh cache
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_fewshot.py"), "--quick", "--space", str(space),
           "--out", str(tmp_path / "run")]
    first = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-4000:]
    run = tmp_path / "run"
    doc = json.loads((run / "fewshot.json").read_text())
    assert [(r["workload"], r["target"]) for r in doc["results"]] == [("prefill", "cpu1"), ("prefill", "ort1")]
    for r, other in zip(doc["results"], ("ort1", "cpu1")):
        assert r["sources"] == [f"pred-{other}"] and r["few_rows"] == 8 and r["held_out"] == 16
        few, full = (read_timings(run / "prefill" / f"{r['target']}-{part}.csv") for part in ("few", "full"))
        assert len(few.passes("measure")) == 8 and len(full.passes("measure")) == 16
        assert not set(few.passes("measure")) & set(full.passes("measure"))  # the held-out rows are not the few rows
        assert few.meta["baseline_ms"] == full.meta["baseline_ms"]  # one campaign, one drift anchor
        device = "cpu" if r["target"] == "cpu1" else "onnxruntime"
        assert few.fingerprint["device"] == device and few.fingerprint["threads"] == 1
        predictor = load_predictor(run / "prefill" / f"transfer-{r['target']}")
        assert predictor.name == "transfer" and predictor.metrics["chosen"] == r["chosen"]
        for figures in (r["transfer"], r["scratch_same_rows"], *(c["scratch"] for c in r["curve"])):
            assert -1 <= figures["kendall_tau"] <= 1 and 0 <= figures["within_10"] <= 1
        assert [c["rows"] for c in r["curve"]] == [6, 10] and r["rows_to_match_text"]
    rows = list(csv.DictReader((run / "fewshot.csv").open()))
    assert [r["target"] for r in rows] == ["cpu1", "ort1"] and {r["met"] for r in rows} <= {"True", "False"}
    assert (run / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "rows to match" in first.stdout and "learning curve" in first.stdout

    tables = {p: p.read_bytes() for p in run.glob("prefill/*.csv")}
    second = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-4000:]
    assert {p: p.read_bytes() for p in run.glob("prefill/*.csv")} == tables  # nothing re-measured
    assert json.loads((run / "fewshot.json").read_text())["results"] == doc["results"]  # the same figures
