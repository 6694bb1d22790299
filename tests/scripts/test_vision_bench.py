"""scripts/bench_vision.py --quick: every stage on small generated images, the contract of vision.json, and a rerun
that resumes every stage (nothing retrained, nothing re-measured)."""

import json
import logging

import numpy as np

from tests.tasks.image_classification.test_vision import SPACE, idx_folder
from tests.script_loader import load_script


def bench():
    return load_script("bench_vision")


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


def test_verdicts_judge_by_the_seed_sd_pooled_over_the_models_and_a_failed_seed_is_named():
    """The noise is 2 seed SD pooled over every model whose seeds agree (a failed training, 67.0% and 31.5%, is left out
    of the pool and fails on its mean); the speedup is from the fastest softmax ViT that reaches the found model's
    accuracy within the noise, whatever the ladder's order, and none when no softmax ViT reaches it."""
    b = bench()
    found = lambda acc: {"test_accuracy": acc, "measured_ms": 0.2, "budget_ms": 0.2, "subnet": {}}  # noqa: E731
    base = {"test_accuracy": [0.79, 0.80], "measured_ms": 0.15, "name": "uniform-x", "type": "x", "subnet": {}}
    soft = {"type": "softmax", "name": "uniform-softmax", "subnet": {}, "ladder": True}
    fast = {**soft, "measured_ms": 0.1, "test_accuracy": [0.80, 0.80]}
    slow_worse = {**soft, "measured_ms": 0.3, "test_accuracy": [0.70, 0.70]}  # the ladder is not monotone
    slow = {**soft, "measured_ms": 0.5, "test_accuracy": [0.81, 0.81]}
    rows, speed = b.verdicts([found([0.81, 0.80]), found([0.78, 0.78]), found([0.67, 0.31]), found([0.95, 0.95])],
                             [base, fast, slow_worse, slow], "softmax")
    assert [r["verdict"] for r in rows] == ["PASS", "FAIL", "FAIL", "PASS"]  # 0.78 is 1.5 points behind: beyond 2 SD
    assert [r["unstable_seeds"] for r in rows] == [False, False, True, False]
    assert rows[0]["noise_models"] == 7 and rows[0]["noise_2sd"] < 0.01 and "pooled over 7 models" in rows[0]["noise_basis"]
    assert speed[0] == {"budget_ms": 0.2, "ratio": 0.5, "bound": "measured", "softmax_ms": 0.1, "softmax_accuracy": 0.8}
    assert speed[3] == {"budget_ms": 0.2, "ratio": None, "bound": "unreached", "softmax_accuracy": 0.81}
    few, _ = b.verdicts([found([0.81, 0.80])], [base], "softmax")
    assert few[0]["noise_models"] == 2 and "fewer than 5" in few[0]["noise_basis"]


def test_fewer_baselines_softmax_and_the_best_other_types_per_budget():
    b = bench()
    e = lambda t, budgets: {"type": t, "budgets": budgets}  # noqa: E731
    baselines = {"s": e("softmax", [1.0, 2.0]), "a": e("axial", [1.0, 2.0]), "l": e("linear", [2.0]), "x": e("xca", [1.0])}
    kept = b.fewest_types(baselines, [{"budget_ms": 1.0}, {"budget_ms": 2.0}], "softmax", 1,
                          {"s": 0.5, "a": 0.3, "l": 0.2, "x": 0.4})
    assert set(kept) == {"s", "a", "l"} and kept["l"]["inherited_val_error"] == 0.2  # budget 1: axial; budget 2: linear


def test_simple_baselines_fit_a_linear_classifier_on_the_pixels(tmp_path):
    from tasks.image_classification.data import load_images

    data = load_images(idx_folder(tmp_path / "data"), 1 / 12, 0)
    simple = bench().simple_baselines(data)
    assert simple["linear_classifier"] > 0.9  # a bright bar per class: linear in the pixels
    counts = np.bincount(data.test.labels)
    assert simple["majority"] == counts[np.bincount(data.train.labels).argmax()] / len(data.test.labels)


def test_retraining_two_at_a_time_gives_the_same_models_and_an_interrupted_one_resumes(tmp_path):
    """``--jobs 2`` (each retraining its own ``python -m nas`` on one thread) trains the same models as one at a time, a
    model picked twice is trained once, and a model folder holding a checkpoint but no card (an interrupted retraining)
    is continued with ``--resume`` (whose exactness train-subnet's own tests check)."""
    from dataclasses import replace

    from safetensors.numpy import load_file

    from search_spaces import parse_space

    b = bench()
    space_file = tmp_path / "space.yaml"
    space_file.write_text(SPACE.replace("\nimage: {", "\naugment: {pad: 0, flip: false}\nimage: {"))
    space = parse_space(space_file.read_text(), source=str(space_file))
    data = str(idx_folder(tmp_path / "data"))
    a, z = space.smallest().to_dict(), space.largest().to_dict()
    plan = replace(b.QUICK, epochs=2.0)

    def models():
        return [{"name": "small", "subnet": a}, {"name": "large", "subnet": z}, {"name": "small-again", "subnet": a}]

    weights = {}
    for jobs in (1, 2):
        done = models()
        b.stage_retrain(tmp_path / f"j{jobs}", space, done, data, plan, 1, 1, "scratch", jobs)
        assert done[0]["test_accuracy"] == done[2]["test_accuracy"]
        assert done[0]["steps"] == 28  # round(2 epochs x 220 images / 16)
        weights[jobs] = {m["name"]: load_file(next((tmp_path / f"j{jobs}" / "models").glob(
            f"{space.subnet_type.from_dict(m['subnet']).key}-s0/*.safetensors"))) for m in done}
        assert len(list((tmp_path / f"j{jobs}" / "models").glob("*/model_card.json"))) == 2
    for name in weights[1]:
        assert weights[1][name].keys() == weights[2][name].keys()
        assert all(np.array_equal(weights[1][name][k], weights[2][name][k]) for k in weights[1][name])

    run = tmp_path / "j1" / "models" / f"{space.subnet_type.from_dict(z).key}-s0"
    (run / "model_card.json").unlink()
    argv = b.retrain_argv(space, space.subnet_type.from_dict(z), run, 0, 28, 13, {"data": data, "data_seed": 0,
                          "val_fraction": 1 / 12}, plan, ["--init", "scratch"], 1)  # fmt: skip
    assert "--resume" in argv and argv[argv.index("--max-steps") + 1] == "28"
    assert argv[argv.index("--ckpt-interval") + 1] == "7"  # a quarter of the run (sooner than an epoch's 13 steps)


def test_jobs_must_be_positive(tmp_path, capsys):
    import pytest

    with pytest.raises(SystemExit) as e:
        bench().main(["--out", str(tmp_path / "run"), "--jobs", "0"])
    assert e.value.code == 2 and not (tmp_path / "run").exists()
    assert "--jobs: 0 is not a positive number of retrainings at a time" in capsys.readouterr().err
