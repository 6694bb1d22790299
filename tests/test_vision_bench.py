"""scripts/bench_vision.py --quick: every stage on small generated images, the contract of vision.json, and a rerun
that resumes every stage (nothing retrained, nothing re-measured)."""

import importlib.util
import json
import logging
import sys

from .conftest import ROOT
from .test_vision import SPACE, idx_folder


def bench():
    spec = importlib.util.spec_from_file_location("bench_vision", ROOT / "scripts" / "bench_vision.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_vision"] = module  # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


def test_bench_vision_quick_writes_the_contract_and_resumes(tmp_path, graph_cache, caplog):
    caplog.set_level(logging.INFO, logger="bench_vision")
    (tmp_path / "space.yaml").write_text(SPACE.replace("\nimage: {", "\naugment: {pad: 0, flip: false}\nimage: {"))
    data = idx_folder(tmp_path / "data")
    args = ["--out", str(tmp_path / "b"), "--quick", "--space", str(tmp_path / "space.yaml"), "--data", str(data)]
    assert bench().main(args) == 0
    assert "retrain " in caplog.text and "$ nas train-supernet" in caplog.text
    record = json.loads((tmp_path / "b" / "vision.json").read_text())
    assert {"best_test_accuracy", "budgets", "speedup_vs_softmax", "predictor", "command", "machine"} <= set(record)
    assert len(record["budgets"]) == 3 and 0 <= record["best_test_accuracy"] <= 1
    assert 0 < record["wall_s_this_run"] <= record["wall_s"]  # the whole benchmark's time, from the supernet's first step
    for b in record["budgets"]:
        assert {"budget_ms", "verdict", "found", "best_uniform"} <= set(b)
        assert {"subnet", "test_accuracy", "measured_ms"} <= set(b["found"]) and b["found"]["measured_ms"] > 0
    assert {"within_10pct", "ceiling_within_10pct"} <= set(record["predictor"])
    assert all({"budget_ms", "ratio", "bound"} <= set(s) for s in record["speedup_vs_softmax"])
    assert "found" in {m["role"] for m in record["models"]} and any(m.get("ladder") for m in record["models"])
    assert (tmp_path / "b" / "vision.png").stat().st_size > 0 and (tmp_path / "b" / "models.csv").exists()
    cards = sorted((tmp_path / "b" / "models").glob("*/model_card.json"))
    stamps = [c.stat().st_mtime_ns for c in cards]
    caplog.clear()
    assert bench().main(args) == 0
    assert "retrain " not in caplog.text and "$ nas" not in caplog.text  # every stage read back
    assert [c.stat().st_mtime_ns for c in sorted((tmp_path / "b" / "models").glob("*/model_card.json"))] == stamps
    assert json.loads((tmp_path / "b" / "vision.json").read_text())["models"] == record["models"]
