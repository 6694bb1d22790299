"""scripts/bench_encoder.py --quick: the encoder targets' path end to end on a tiny masked-lm space, and its resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from .test_data import write_docs

ROOT = Path(__file__).resolve().parents[1]
SPACE = ROOT / "tests" / "fixtures" / "encoder_quick.yaml"


def test_bench_encoder_quick_runs_end_to_end_and_resumes(tmp_path):
    docs = write_docs(tmp_path / "docs", n=30)
    env = {**os.environ, "NAS_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_encoder.py"), "--quick", "--space", str(SPACE), "--data", str(docs),
           "--out", str(tmp_path / "run"), "--threads", "1"]
    first = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-4000:]
    run = tmp_path / "run"
    record = json.loads((run / "bench_encoder.json").read_text())
    assert record["space"] == "encoder-quick"
    pred = record["predictor"]
    assert 0 <= pred["held_out_within_10"] <= 1 and pred["held_out_n"] >= 2 and pred["test_retest_n"] >= 2
    search = record["search"]
    found, baselines = search["found"], search["baselines"]
    assert baselines and {b["name"] for b in baselines} <= {"uniform softmax", "uniform linear"}
    for r in [found, *baselines]:
        assert r["measured_ms"] > 0 and 0 < r["bpb"] < 12
    assert search["within_budget"] == (found["measured_ms"] <= search["budget_ms"])
    card = json.loads((run / "model" / "model_card.json").read_text())
    assert card["validation"]["metric"] == "bits/masked byte" and card["validation"]["task"] == "masked-lm"
    assert (run / "search" / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = first.stdout
    assert "encoder latency predictor" in out and "test-retest ceiling" in out and "bits/masked byte" in out
    assert "target (lower bits per masked byte than every uniform baseline" in out

    # run again: every stage is skipped; the comparison is measured again
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-4000:]
    assert again.stderr.count("finished in an earlier run, skipped") == 5
    assert json.loads((run / "bench_encoder.json").read_text())["search"]["found"]["subnet"] == found["subnet"]

    # a causal space is refused in one line
    bad = subprocess.run([*cmd[:3], "--space", "tiny", "--out", str(tmp_path / "x")], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and "this benchmark needs a masked-lm space" in bad.stderr and not (tmp_path / "x").exists()
