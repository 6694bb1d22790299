"""scripts/bench_memory.py --quick: the same model with and without a memory, trained alike, read on long test
documents, timed at the same decode step; the contract of memory.json (seed_sd, budgets with decode_ms, with_bpb and
without_bpb) and a rerun that trains nothing again."""

from __future__ import annotations

import csv
import json
import re
import statistics

import pytest

from tests.script_loader import load_script


def test_bench_memory_quick_writes_the_contract_and_resumes(tmp_path, capsys):
    bench = load_script("bench_memory")
    out = tmp_path / "b"
    assert bench.main(["--quick", "--out", str(out)]) == 0
    record = json.loads((out / "memory.json").read_text())
    rows = list(csv.DictReader(open(out / "memory.csv")))
    assert len(rows) == 4 and {(r["variant"], r["seed"]) for r in rows} == {(v, s) for v in ("with", "without") for s in "01"}
    cells = {v: [float(r["bpb"]) for r in rows if r["variant"] == v] for v in ("with", "without")}
    pooled = (statistics.mean([statistics.variance(c) for c in cells.values()])) ** 0.5
    assert record["seed_sd"] == pytest.approx(pooled)
    (b,) = record["budgets"]
    assert b["with_bpb"] == pytest.approx(statistics.mean(cells["with"]))
    assert b["without_bpb"] == pytest.approx(statistics.mean(cells["without"]))
    assert b["gain_bpb"] == pytest.approx(b["without_bpb"] - b["with_bpb"])
    # the memory models read again without their memory (restarting every window), the others' column their score
    restarts = [float(r["bpb_restart"]) for r in rows if r["variant"] == "with"]
    assert b["with_restart_bpb"] == pytest.approx(statistics.mean(restarts))
    assert all(r["bpb_restart"] == r["bpb"] for r in rows if r["variant"] == "without")
    assert b["beyond_2_seed_sd"] == (b["gain_bpb"] > 2 * record["seed_sd"])
    assert b["decode_ms"] == b["with_decode_ms"] > 0 and b["without_decode_ms"] > 0
    assert record["command"].startswith("python scripts/bench_memory.py --quick")
    # the two spaces differ in their memory alone; the models carry it (or not) into their cards
    spaces = out / "runs" / "spaces"
    w, wo = (spaces / "small-with.yaml").read_text(), (spaces / "small-without.yaml").read_text()
    assert "\nmemory: 16\n" in w and "\nmemory:" not in wo
    card = json.loads((out / "runs" / "small-with-s0" / "model" / "model_card.json").read_text())
    assert card["space"]["memory"] == 16
    assert (out / "memory.png").exists() and (out / "curves.png").exists()
    printed = capsys.readouterr().out
    assert "seed SD (pooled)" in printed and re.search(r"nas train-subnet done in \d+ s: \S*small-with-s0\n", printed)
    # a rerun: every model and score kept (one training command in each log), the same figures
    assert bench.main(["--quick", "--out", str(out)]) == 0
    again = json.loads((out / "memory.json").read_text())
    assert again["budgets"][0]["with_seeds"] == b["with_seeds"] and again["seed_sd"] == record["seed_sd"]
    for s in ("with-s0", "without-s1"):
        assert (out / "runs" / f"small-{s}" / "log.txt").read_text().count("$ ") == 1
