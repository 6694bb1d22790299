"""measure-latency / fit-predictor / predict of a seq2seq space on the cpu: HAT's translate workload timed."""

import csv
import json

import numpy as np
import pytest

from latency.predictors import load_predictor
from latency.table import read_timings
from latency.translate_features import translate_terms
from nas.cli import main
from tests.seq2seq_fakes import MINI_SEQ2SEQ, mini_space

FAST = ["--threads", "1", "--warmup", "1", "--repeats", "2", "--rounds", "2", "--min-sample-ms", "1"]


@pytest.fixture(scope="module")
def timed(tmp_path_factory):
    root = tmp_path_factory.mktemp("tl")
    space = root / "mini.yaml"
    space.write_text(MINI_SEQ2SEQ.format(positions="rope"))
    table = root / "t.csv"
    assert main(["measure-latency", str(space), "--device", "cpu", "--samples", "6", "--out", str(table), "-q", *FAST]) == 0
    first = table.read_text()
    # resumed with more samples: the first rows stay as they were, only the new subnets are timed
    assert main(["measure-latency", str(space), "--device", "cpu", "--samples", "24", "--retest", "0.25", "--out",
                 str(table), "-q", *FAST]) == 0  # fmt: skip
    return root, space, table, first


def test_table_holds_translate_rows_with_seq2seq_features_and_resumes(timed, capsys):
    root, space_path, table, first = timed
    space = mini_space()
    t = read_timings(table)
    assert t.workload.kind == "translate" and t.workload.label == "translate:16->16x3"
    measured, retest = t.passes("measure"), t.passes("retest")
    assert len(measured) == 24 and len(retest) >= 1 and set(retest) <= set(measured)
    assert measured[space.largest().key].subnet == space.largest()  # read back as seq2seq subnets
    rows = list(csv.DictReader(table.open()))
    assert {r["workload"] for r in rows} == {"translate:16->16x3"}
    for r in rows[:3]:
        s = space.subnet_type.from_json(r["subnet"])
        terms = translate_terms(space, s, t.workload)
        assert float(r["cross_kv_flops"]) == pytest.approx(terms["cross_kv_flops"])
        assert float(r["flops"]) == pytest.approx(terms["flops"])
        assert [float(r[n]) for n in space.feature_names()] == space.encode(s).tolist()
    # the 6 rows of the first run are the first rows of the grown table, unchanged
    first_rows = [line for line in first.splitlines()[1:] if ",measure," in line]
    assert len(first_rows) == 6 and all(line in table.read_text().splitlines() for line in first_rows)
    # nothing left: a third run measures nothing
    assert main(["measure-latency", str(space_path), "--device", "cpu", "--samples", "24", "--retest", "0.25", "--out",
                 str(table), *FAST]) == 0  # fmt: skip
    assert capsys.readouterr().out.strip() == f"{table}: nothing left to measure"
    meta = json.loads((root / "t.csv.json").read_text())
    assert meta["workload"] == {"name": "translate", "kind": "translate", "source": 16, "steps": 16, "beam": 3}
    assert meta["fingerprint"]["device"] == "cpu" and meta["baseline_ms"] > 0


def test_fit_and_predict_a_translate_predictor(timed, capsys):
    root, _, table, _ = timed
    pred = root / "pred"
    assert main(["fit-predictor", str(table), "--out", str(pred), "--models", "additive,gbt", "--folds", "3", "-q"]) == 0
    out = capsys.readouterr().out
    assert "cv additive" in out and "cv gbt" in out and "test-retest (ceiling)" in out and "chosen:" in out
    p = load_predictor(pred)
    space = mini_space()
    assert p.workload_spec.kind == "translate"
    big, small = space.largest(), space.smallest()
    ms = p.predict([big, small])
    assert np.all(np.isfinite(ms))
    (root / "big.yaml").write_text(big.to_yaml())
    assert main(["predict", "--predictor", str(pred), str(root / "big.yaml"), "-q"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"{ms[0]:.3f} ms  {root / 'big.yaml'}  {big}")


def test_other_devices_refuse_a_seq2seq_space_in_one_line(timed, capsys):
    root, space_path, _, _ = timed
    for device in ("onnxruntime", "cuda", "ssh://me@board"):
        assert main(["measure-latency", str(space_path), "--device", device, "--out", str(root / "x.csv")]) == 2
        assert capsys.readouterr().err == (
            f"nas measure-latency: error: --device {device}: a seq2seq space (mini-s2s) is timed on cpu only for now "
            '(README "Translation (encoder-decoder, in progress)")\n'
        )
    assert not (root / "x.csv").exists()
