"""scripts/bench_precision.py --quick: a supernet trained in a few steps, every INT8 precision timed and scored, and the
contract of precision.json (outlier_ratio; per precision its bits/byte drop and speedup over fp32)."""

from __future__ import annotations

import json

import pytest

from search_spaces import load_space

from tests.conftest import ROOT
from tests.supernet.test_data import write_docs
from tests.script_loader import load_script

SPACE = ROOT / "tests" / "fixtures" / "claim_quick.yaml"


def bench():
    return load_script("bench_precision")


def test_bench_precision_quick_writes_the_contract(tmp_path, graph_cache, capsys):
    docs = write_docs(tmp_path / "docs", n=30)
    out = tmp_path / "b"
    argv = ["--quick", "--space", str(SPACE), "--data", str(docs), "--out", str(out), "--threads", "1"]
    assert bench().main(argv) == 0
    record = json.loads((out / "precision.json").read_text())
    assert record["outlier_ratio"] == max(record["outlier_ratios"]) >= 1.0
    assert len(record["outlier_ratios"]) == 2 * 6 + 1  # the largest subnet's linear layers: 2 blocks, the tied head
    assert set(record["precisions"]) == {"int8-dynamic", "int8-static", "int8-smooth", "int8-outlier"}
    for name, p in record["precisions"].items():
        assert p["speedup"] > 0 and p["bpb"] == pytest.approx(p["fp32_bpb"] + p["bpb_drop"])
        assert p["estimate_bpb"] == pytest.approx(p["bpb"], abs=1e-3), name  # the search's estimate of the real model
    assert set(record["targets"]) == {"int8-smooth", "int8-outlier"}
    assert record["model"] == str(load_space(str(SPACE)).largest())
    assert record["command"].startswith("python scripts/bench_precision.py --quick")
    assert (out / "precision.csv").read_text().startswith("space,attention,width,workload,fp32_ms")
    assert (out / "supernet" / "final.pt").exists()
    printed = capsys.readouterr().out
    assert "outlier ratio" in printed and "int8-outlier" in printed
