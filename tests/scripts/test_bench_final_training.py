"""scripts/bench_final_training.py: the recipe rule (the cheapest within the seed noise of the best), and --quick on
the fixtures of the LM, image and translation tests: the contract of final.json, the tables, the curves, and a rerun
that trains nothing."""

import json
import logging
import math

import pytest

from tests.conftest import ROOT
from tests.tasks.translation.translation_fakes import write_toy_tsv
from tests.supernet.test_data import write_docs
from tests.tasks.image_classification.test_vision import SPACE, idx_folder
from tests.script_loader import load_script


def bench():
    return load_script("bench_final_training")


def r(mean):
    return {"mean": mean, "sd": 0.0, "n": 4}


@pytest.mark.parametrize("recipes,better,noise,chosen", [
    ({"scratch": r(2.0), "inherit": r(1.9), "distill": r(1.7)}, "lower", 0.05, "distill"),  # a win beyond the noise
    ({"scratch": r(2.0), "inherit": r(1.9), "distill": r(1.7)}, "lower", 0.2, "inherit"),  # within it: the cheaper
    ({"scratch": r(2.0), "inherit": r(1.9), "distill": r(1.7)}, "lower", 0.5, "scratch"),
    ({"scratch": r(0.80), "inherit": r(0.90), "distill": r(0.85)}, "higher", 0.02, "inherit"),
    ({"scratch": r(0.80), "inherit": r(0.90), "distill": r(0.85)}, "higher", 0.2, "scratch"),
    ({"scratch": r(0.80), "inherit": r(0.90)}, "higher", math.nan, "inherit"),  # no noise: the best by mean
])
def test_the_chosen_recipe_is_the_cheapest_within_the_noise_of_the_best(recipes, better, noise, chosen):
    assert bench().choose(recipes, better, noise)[0] == chosen


def test_pooled_sd_is_within_the_seed_groups():
    b = bench()
    assert b.pooled_sd([[1.0, 3.0], [10.0, 12.0], [5.0]]) == pytest.approx(math.sqrt(2.0))  # not the spread of the means
    assert math.isnan(b.pooled_sd([[1.0], [2.0]]))
    assert b.summarize([1.0, 3.0]) == {"mean": 2.0, "sd": pytest.approx(math.sqrt(2.0)), "n": 2}


@pytest.mark.timeout(2400)  # about a minute of CPU (36 models of 0.5 CPU s, 3 supernets of 6 s); more on a loaded machine
def test_quick_writes_the_contract_for_every_task_and_a_rerun_trains_nothing(tmp_path, graph_cache, caplog):
    caplog.set_level(logging.INFO, logger="bench_final_training")
    write_docs(tmp_path / "docs", n=40)
    (tmp_path / "vision.yaml").write_text(SPACE)
    idx_folder(tmp_path / "images")
    write_toy_tsv(tmp_path / "toy.tsv")
    out = tmp_path / "run"
    args = ["--out", str(out), "--quick", "--train-seconds", "0.5",
            "--space", f"lm={ROOT / 'tests' / 'fixtures' / 'claim_quick.yaml'}", "--data", f"lm={tmp_path / 'docs'}",
            "--space", f"image={tmp_path / 'vision.yaml'}", "--data", f"image={tmp_path / 'images'}",
            "--space", f"translation={ROOT / 'tests' / 'fixtures' / 'translate_quick.yaml'}",
            "--data", f"translation={tmp_path / 'toy.tsv'}"]  # fmt: skip
    assert bench().main(args) == 0
    record = json.loads((out / "final.json").read_text())
    assert set(record["tasks"]) == {"lm", "image", "translation"} and "CPU seconds" in record["equal_time"]
    for task, entry in record["tasks"].items():
        assert set(entry["recipes"]) == {"scratch", "inherit", "distill"} and entry["chosen"] in entry["recipes"]
        assert all(set(v) == {"mean", "sd", "n"} and v["n"] == 4 for v in entry["recipes"].values())  # 2 subnets x 2 seeds
        assert entry["metric"] and set(entry["subnets"]) == {"uniform", "mixed"}
    cards = sorted(out.glob("*/models/*/model_card.json"))
    assert len(cards) == 36
    distilled = json.loads(next(c for c in cards if "-distill-" in c.parent.name).read_text())["training"]
    inherited = json.loads(next(c for c in cards if "-inherit-" in c.parent.name).read_text())["training"]
    assert distilled["distill"] == 0.5 and str(distilled["init"]).startswith("supernet:")
    assert str(inherited["init"]).startswith("supernet:") and not inherited.get("distill")
    configs = [(lambda t: t.get("train_config") or t["config"])(json.loads(c.read_text())["training"]) for c in cards]
    assert all(c["clock"] == "cpu" and c["threads"] == 1 and c["max_time"] == 0.5 and "max_steps" in c for c in configs)
    rows = (out / "final.csv").read_text().splitlines()
    assert len(rows) == 37 and rows[0].startswith("task,subnet,recipe,seed,score")
    curves = (out / "curves.csv").read_text().splitlines()
    assert curves[0] == "model,step,elapsed_s,loss" and len({line.split(",")[0] for line in curves[1:]}) == 36
    assert (out / "final.png").stat().st_size > 0 and (out / "curves.png").stat().st_size > 0
    caplog.clear()
    stamps = [c.stat().st_mtime_ns for c in cards]
    assert bench().main(args) == 0
    assert " CPU s" not in caplog.text and "$ nas train-supernet" not in caplog.text
    assert [c.stat().st_mtime_ns for c in cards] == stamps
    assert json.loads((out / "final.json").read_text())["tasks"] == record["tasks"]


def test_bad_flags_are_one_line_exit_2(tmp_path, capsys):
    assert bench().main(["--out", str(tmp_path / "o"), "--tasks", "lm,speech"]) == 2
    assert capsys.readouterr().err.strip() == "bench_final_training: error: --tasks: speech not among lm, image, translation"
    assert not (tmp_path / "o").exists()
    assert bench().main(["--out", str(tmp_path / "o"), "--supernet", "audio=x.pt"]) == 2
    assert capsys.readouterr().err.strip() == ("bench_final_training: error: --supernet 'audio=x.pt': expected TASK=VALUE, "
                                               "TASK one of lm, image, translation")
    assert not (tmp_path / "o").exists()


def test_the_recipe_is_one_setting_that_the_demo_and_the_benchmarks_select(tmp_path, capsys):
    """supernet.runs holds the recipes and the default (the committed benchmark's choice); a recipe is train-subnet's sources
    and flags; nas demo --recipe refuses an unknown one in one line before writing anything."""
    from nas.cli import main
    from search_spaces import UserError
    from supernet.runs import DEFAULT_RECIPE, RECIPES, recipe_flags, recipe_sources

    assert set(RECIPES) == {"scratch", "inherit", "distill"}
    measured = json.loads((ROOT / "docs" / "benchmarks" / "final-training" / "final.json").read_text())["tasks"]
    assert DEFAULT_RECIPE == measured["lm"]["chosen"]  # the default is what the committed run chose (the demo's task)
    ckpt = tmp_path / "s.pt"
    assert recipe_sources("scratch", None) == {"init": "scratch", "distill_from": None, "distill": 0.0}
    assert recipe_flags("inherit", ckpt) == ["--init", f"supernet:{ckpt}"]
    assert recipe_flags("distill", ckpt) == ["--init", f"supernet:{ckpt}", "--distill-from", f"supernet:{ckpt}",
                                             "--distill", "0.5"]
    with pytest.raises(UserError, match=r"^--recipe inherit: needs the supernet checkpoint"):
        recipe_sources("inherit", None)
    assert main(["demo", "--out", str(tmp_path / "demo"), "--recipe", "finetune"]) == 2
    said = capsys.readouterr().err.strip()
    assert said == "nas demo: error: --recipe: 'finetune' is not one of scratch, inherit, distill, none"
    assert not (tmp_path / "demo").exists()
    for script in ("bench_vision.py", "bench_translate.py", "bench_final_training.py"):
        assert "DEFAULT_RECIPE" in (ROOT / "scripts" / script).read_text()  # they read the one place
