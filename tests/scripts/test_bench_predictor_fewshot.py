"""scripts/bench_predictor_fewshot.py --quick on a synthetic timing table (nothing is timed): it scores every model
and fit-predictor's choice against the table's ceiling and writes its JSON and CSV; a table too small is refused."""

from __future__ import annotations

import csv
import json

from latency.sampling import campaign_subnets
from search_spaces import load_space

from tests.latency.test_latency_transfer import write_table
from tests.latency.test_layered_predictor import device_ms
from tests.script_loader import load_script



def script():
    return load_script("bench_predictor_fewshot")


def test_quick_run_scores_the_models_against_the_ceiling_and_writes_its_files(tmp_path, capsys):
    space = load_space("lra-tiny")
    w = space.workload()
    subnets = campaign_subnets(space, 36, seed=0)
    ms = device_ms(space, subnets)
    again = device_ms(space, subnets[:10], seed=1)
    write_table(tmp_path / "lra.csv", space, w, subnets, ms, list(zip(subnets[:10], again)))
    bench = script()
    rc = bench.main([str(tmp_path / "lra.csv"), "--out", str(tmp_path / "out"), "--quick", "--models", "additive,layered",
                     "--train", "20", "--test", "16"])
    assert rc == 0
    out = capsys.readouterr().out
    doc = json.loads((tmp_path / "out" / "predictor_fewshot.json").read_text())
    (r,) = doc["results"]
    assert r["space"] == "lra-tiny" and r["measured"] == 36 and (r["train"], r["test"], r["draws"]) == (20, 16, 2)
    assert list(r["models"]) == ["additive", "layered", "fit-predictor"] and r["ceiling"]["n"] == 10
    assert len(r["chosen"]) == 2 and set(r["chosen"]) <= {"additive", "layered"} and r["target_met"] in (True, False)
    for m in r["models"].values():
        assert 0 <= m["mape"] < 1 and m["vs_ceiling"] == m["mape"] / r["ceiling"]["mape"]
    rows = list(csv.DictReader((tmp_path / "out" / "predictor_fewshot.csv").open()))
    assert [row["model"] for row in rows] == ["additive", "layered", "fit-predictor"]
    assert "test-retest" in out and "fit-predictor chose" in out


def test_a_table_too_small_and_no_input_are_refused_in_one_line(tmp_path, capsys):
    space = load_space("lra-tiny")
    subnets = campaign_subnets(space, 12, seed=0)
    write_table(tmp_path / "small.csv", space, space.workload(), subnets, device_ms(space, subnets))
    bench = script()
    assert bench.main([str(tmp_path / "small.csv"), "--out", str(tmp_path / "out"), "--quick"]) == 2
    assert capsys.readouterr().err == (f"bench_predictor_fewshot: {tmp_path / 'small.csv'}: 12 measured subnets; --train 20 "
                                       "needs at least 25 (the rest are scored)\n")
    assert bench.main(["--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == "bench_predictor_fewshot: give timing tables, or --measure to time them\n"
    assert not (tmp_path / "out" / "predictor_fewshot.json").exists()
