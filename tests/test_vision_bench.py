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


def test_a_verdict_inside_the_seed_noise_is_a_tie_and_a_failed_seed_is_named():
    b = bench()
    found = lambda acc: {"test_accuracy": acc, "measured_ms": 0.2, "budget_ms": 0.2, "subnet": {}}  # noqa: E731
    base = {"test_accuracy": [0.79, 0.80], "measured_ms": 0.15, "name": "uniform-x", "type": "x", "subnet": {}}
    ladder = {**base, "type": "softmax", "ladder": True, "measured_ms": 0.5, "test_accuracy": [0.81, 0.81]}
    rows, speed = b.verdicts([found([0.81, 0.80]), found([0.78, 0.78]), found([0.67, 0.31])], [base, ladder], "softmax")
    assert [r["verdict"] for r in rows] == ["PASS", "FAIL", "TIE"]  # ahead; behind beyond 2 SD; behind inside 2 SD
    assert [r["unstable_seeds"] for r in rows] == [False, False, True]  # the tie is a failed seed's noise
    assert rows[2]["noise_2sd"] > 0.4 and speed[0] == {"budget_ms": 0.2, "ratio": 2.5, "bound": "measured"}
