"""scripts/bench_claim.py --quick: the whole measured-claim path end to end on a tiny space, and its resume."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SPACE = ROOT / "tests" / "fixtures" / "claim_quick.yaml"


@pytest.mark.timeout(1500)
def test_bench_claim_quick_runs_end_to_end_and_resumes(tmp_path):
    env = {**os.environ, "NAS_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    script = str(ROOT / "scripts" / "bench_claim.py")
    cmd = [sys.executable, script, "--quick", "--space", str(SPACE), "--out", str(tmp_path / "run"), "--max-load", "1000"]
    first = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-4000:]
    run = tmp_path / "run"
    claim = json.loads((run / "claim.json").read_text())
    rows = list(csv.DictReader((run / "claim.csv").open()))
    assert (run / "claim.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # every ranker scored on the held-out models (none of them in the calibrated ranker's fit), with an interval
    held = [r for r in rows if r["in_ranker_fit"] == "False"]
    held_mixed = [r for r in held if r["mixed"] == "True"]
    assert set(claim["rankers"]) == set(claim["rankers_mixed"]) == {"calibrated", "inherited", "few-shot split",
                                                                     "parameters", "FLOPs"}
    for group, n in ((claim["rankers"], len(held)), (claim["rankers_mixed"], len(held_mixed))):
        for r in group.values():
            assert r["n"] == n >= 2 and (math.isnan(r["tau"]) or -1 <= r["ci_low"] <= r["tau"] <= r["ci_high"] <= 1)
    # the ranker's fit holds random mixed subnets beside the uniform ladders; its error is reported for each
    fitted = [r for r in rows if r["in_ranker_fit"] == "True"]
    assert sum(r["mixed"] == "True" for r in fitted) >= 3 and sum(r["mixed"] == "False" for r in fitted) >= 3
    ranker = json.loads((run / "ranker" / "ranker.json").read_text())
    assert set(ranker["report"]["groups"]) == {"uniform", "mixed"}
    assert claim["ranker_errors"]["heldout_mixed_mae"] >= 0 and claim["ranker_errors"]["fit_uniform_loo_mae"] >= 0
    # the rank-stability check ran: the same models at the budget and at twice it, their tau reported
    stability = claim["stability"]
    assert stability["tokens_x2"] == 2 * stability["tokens"] and len(stability["models"]) == 4
    assert stability["chosen_tokens"] == 8000 and "Kendall tau" in stability["why"]
    assert (run / "stability.png").read_bytes()[:4] == b"\x89PNG"
    # every retrained model: the same token budget, a measured export, test bits/byte
    cards = [json.loads(p.read_text()) for p in (run / "retrain").glob("*/model/model_card.json")]
    assert {c["training"]["token_budget"] for c in cards} == {8000}
    twice = [json.loads(p.read_text()) for p in (run / "retrain-x2").glob("*/model/model_card.json")]
    assert {c["training"]["token_budget"] for c in twice} == {16000} and len(twice) == 4
    assert len(rows) >= 4 and all(float(r["measured_ms"]) > 0 and 0 < float(r["test_bpb"]) < 12 for r in rows)
    roles = ";".join(r["roles"] for r in rows)
    assert "found@" in roles and "uniform softmax" in roles
    # each budget: a verdict judged within two seed SDs, the found model and the baseline at their seeds
    assert claim["seed_sd"] > 0 and len(claim["budgets"]) >= 1 and claim["seeded_models"] >= 3
    for b in claim["budgets"]:
        assert b["verdict"] in ("better", "worse", "tie", "no baseline at or below"), b
        assert b["found"]["uniform"] in (True, False) and "best_mixed" in b
        if b["best_mixed"] is not None:
            assert b["best_mixed"]["measured_ms"] <= b["budget_ms"] and "," in b["best_mixed"]["subnet"]
        if b["verdict"] != "no baseline at or below":
            assert len(b["found"]["test_bpb_seeds"]) == len(b["best_uniform"]["test_bpb_seeds"]) >= 2
            if b["verdict"] != "tie":  # better or worse: beyond 2 seed SD and the paired test after Holm
                assert abs(b["difference"]) > 2 * claim["seed_sd"] and b["p_holm"] < 0.05
    assert claim["mixing"]["verdict"] in ("paid", "did not pay", "mixed result", "tie")
    assert len(claim["speedup_vs_softmax"]) == len(claim["budgets"])
    assert "rankers, Kendall tau against retrained test bits/byte" in first.stdout
    assert 0 <= claim["attention_share"]["attention_share"] <= 1

    # run again: every stage is skipped, the same claim is printed
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-4000:]
    assert again.stderr.count("finished in an earlier run, skipped") >= 8
    assert json.loads((run / "claim.json").read_text())["rows"] == claim["rows"]

    # reporting that run with another token budget is refused (the cards say what each model was trained on)
    other = subprocess.run([*cmd, "--tokens", "16K"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert other.returncode == 2, other.stderr[-2000:]
    assert "models there were retrained on 8,000 tokens each, not 16,000: give --tokens 8000" in other.stderr
    assert json.loads((run / "claim.json").read_text())["rows"] == claim["rows"]


def test_wait_quiet_waits_for_three_quiet_polls_and_says_so_only_when_busy(monkeypatch, caplog):
    sys.path.insert(0, str(ROOT / "scripts"))
    import bench_claim

    def run(loads_seen: list[float]) -> tuple[dict, list[str]]:
        seen = iter(loads_seen)
        monkeypatch.setattr(bench_claim.os, "getloadavg", lambda: (next(seen), 0.0, 0.0))
        monkeypatch.setattr(bench_claim.time, "sleep", lambda s: None)
        caplog.clear()
        loads: dict = {}
        with caplog.at_level("INFO", logger="bench_claim"):
            bench_claim.wait_quiet("timing", 1.6, loads, poll=2.0)
        return loads["timing"], [r.getMessage() for r in caplog.records]

    quiet, said = run([0.5, 0.4, 0.3, 0.3])  # three polls under 1.6, the last read for the record
    assert quiet == {"load_before": 0.3, "waited_s": 4.0} and said == []
    busy, said = run([3.0, 2.0, 1.0, 1.7, 0.9, 0.8, 0.7, 0.7])  # a poll over the limit starts the count again
    assert busy == {"load_before": 0.7, "waited_s": 12.0}
    assert said == ["timing: waiting for a quiet machine (load 3.00, need < 1.60)"]
