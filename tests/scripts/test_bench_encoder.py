"""scripts/bench_encoder.py --quick: the encoder targets' path end to end on a tiny masked-lm space, and its resume."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from search_spaces import Subnet

from tests.supernet.test_data import write_docs
from tests.nas.test_report import CHROMIUM, assert_renders

ROOT = Path(__file__).resolve().parents[2]
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
    # the demo's outputs read right (issue 42): the card carries both latencies and the search's score, the comparison
    # names subnets and rounds, and the run is one page that a browser renders offline without an error
    assert card["latency"]["predicted_ms"] == pytest.approx(found["predicted_ms"], rel=1e-6)
    assert card["measured"]["median_ms"] == pytest.approx(found["measured_ms"])
    assert card["validation"]["bits_per_byte"] == pytest.approx(found["search_bpb"], abs=1e-4)
    assert found["bpb_windows"] == record["plan"]["compare_windows"] and found["search_windows"] == record["plan"]["val_windows"]
    with open(run / "comparison.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows[0]["subnet"] == str(Subnet.from_dict(found["subnet"])) and rows[0]["key"] == Subnet.from_dict(found["subnet"]).key
    assert all(len(r["bpb"].split(".")[1]) == 4 and len(r["measured_ms"].split(".")[1]) == 3 for r in rows)
    page = run / "report.html"
    for heading in ("Result", "Search: the Pareto front", "Verification on the device", "Latency predictor", "Model card"):
        assert f"<h2>{heading}</h2>" in page.read_text()
    if CHROMIUM:
        assert_renders(page, tmp_path / "chromium", ["Result", "Model card"])
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
