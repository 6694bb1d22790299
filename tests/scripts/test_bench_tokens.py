"""scripts/bench_tokens.py --quick: both arms (with and without token keeping) through every stage on small generated
images at the same budgets, the contract of tokens.json, and a rerun that reads every stage back."""

import importlib.util
import json
import logging
import sys

from tests.conftest import ROOT
from tests.tasks.image_classification.test_vision import SPACE, idx_folder


def bench():
    for name in ("bench_vision", "bench_tokens"):
        spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # (bench_tokens imports bench_vision; their dataclasses look their module up)
        spec.loader.exec_module(module)
    return module


def test_bench_tokens_quick_writes_the_contract_at_shared_budgets_and_resumes(tmp_path, graph_cache, caplog, capsys):
    caplog.set_level(logging.INFO, logger="bench_vision")
    (tmp_path / "space.yaml").write_text(SPACE.replace("\nimage: {", "\naugment: {pad: 0, flip: false}\nimage: {"))
    data = idx_folder(tmp_path / "data")
    args = ["--out", str(tmp_path / "b"), "--quick", "--space", str(tmp_path / "space.yaml"), "--data", str(data)]
    assert bench().main(args) == 0
    record = json.loads((tmp_path / "b" / "tokens.json").read_text())
    assert record["keep"] == [1.0, 0.7, 0.5] and len(record["budgets"]) == 3
    budgets = json.loads((tmp_path / "b" / "budgets.json").read_text())
    assert [b["budget_ms"] for b in record["budgets"]] == budgets == sorted(budgets)  # one set of budgets for both arms
    for b in record["budgets"]:
        for arm in ("with", "without"):
            assert 0 <= b[arm]["test_accuracy"] <= 1 and b[arm]["measured_ms"] > 0
        assert "keep" not in b["without"]["subnet"]  # the arm without token keeping never keeps fewer tokens
    with_space = (tmp_path / "b" / "with" / "space.yaml").read_text()
    assert "keep:" in with_space and "keep:" not in (tmp_path / "b" / "without" / "space.yaml").read_text()
    assert len(record["speedup_at_equal_accuracy"]) == 3 and set(record["predictor"]) == {"with", "without"}
    assert "budget" in capsys.readouterr().out
    assert (tmp_path / "b" / "tokens.png").exists() and (tmp_path / "b" / "curves.png").exists()
    assert (tmp_path / "b" / "curves.csv").read_text().startswith("model,step,elapsed_s,loss")
    caplog.clear()
    assert bench().main(args) == 0
    assert "$ nas" not in caplog.text and "retrain " not in caplog.text  # every stage read back
    assert json.loads((tmp_path / "b" / "tokens.json").read_text())["budgets"] == record["budgets"]


def test_floored_budgets_never_repeat():
    """The CI failure of stop 60: two percentiles under the lightest subnets' floor became one budget, which
    ``nas search`` refuses; each budget is now at least 10% over the one before, and unfloored ones are the
    percentiles themselves."""
    import numpy as np

    shared = bench().shared_budgets
    floored = shared(np.array([0.010, 0.012, 0.015, 0.030, 0.040]), 0.0222)
    assert floored[0] == 0.0222 and all(b > 1.09 * a for a, b in zip(floored, floored[1:]))
    assert len({f"{b:.4f}ms" for b in floored}) == 3  # the labels nas search is given differ
    ms = np.linspace(0.1, 0.5, 11)
    assert shared(ms, 0.01) == [round(float(np.percentile(ms, q)), 4) for q in (25, 50, 75)]
