"""scripts/bench_claim.py --quick: the whole measured-claim path end to end on a tiny space, and its resume."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPACE = ROOT / "tests" / "fixtures" / "claim_quick.yaml"


@pytest.mark.timeout(1500)
def test_bench_claim_quick_runs_end_to_end_and_resumes(tmp_path):
    env = {**os.environ, "NAS_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    script = str(ROOT / "scripts" / "bench_claim.py")
    cmd = [sys.executable, script, "--quick", "--space", str(SPACE), "--out", str(tmp_path / "run"), "--threads", "1"]
    first = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-4000:]
    run = tmp_path / "run"
    claim = json.loads((run / "claim.json").read_text())
    rows = list(csv.DictReader((run / "claim.csv").open()))
    assert (run / "claim.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(claim["verdicts"]) >= 1 and all("beats_all" in v for v in claim["verdicts"].values())
    # every retrained model: the same token budget, a measured export, test bits/byte with retrained and inherited weights
    cards = [json.loads(p.read_text()) for p in (run / "retrain").glob("*/model/model_card.json")]
    assert len(cards) == len(rows) >= 3
    assert {c["training"]["tokens"] for c in cards} == {4000 // (4 * 64) * 4 * 64}  # whole steps of 4 windows of 64 bytes
    for r in rows:
        assert float(r["measured_ms"]) > 0 and 0 < float(r["test_bpb"]) < 12 and 0 < float(r["inherited_test_bpb"]) < 12
    roles = ";".join(r["roles"] for r in rows)
    assert "found@" in roles and "uniform softmax" in roles
    assert "Kendall tau, inherited vs retrained" in first.stdout and "speedup over uniform softmax" in first.stdout
    assert 0 <= claim["attention_share"]["attention_share"] <= 1

    # run again: every stage is skipped, the same claim is printed
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-4000:]
    assert again.stderr.count("finished in an earlier run, skipped") >= 8
    assert json.loads((run / "claim.json").read_text())["rows"] == claim["rows"]

    # reporting that run with another token budget is refused (the cards say what each model was trained on)
    other = subprocess.run([*cmd, "--tokens", "8K"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert other.returncode == 2, other.stderr[-2000:]
    assert "models there were retrained on 4,000 tokens each, not 8,000: give --tokens 4000" in other.stderr
    assert json.loads((run / "claim.json").read_text())["rows"] == claim["rows"]
