"""scripts/bench_supernet.py: the sandwich measurement (a full rotation of the trainer's type-balanced plans against
every pass's subnet as a static model) on a small batch, and the JSON it writes."""

import json
import subprocess
import sys

from tests.conftest import ROOT


def test_bench_supernet_sandwich_writes_its_figures(tmp_path):
    text = (ROOT / "search_spaces" / "tiny.yaml").read_text()
    types = "attention: [softmax, gqa:2, local:32, strided:16, linear, cosformer:256, hydra, sima, lsra:7, msla:5, convmod:7]"
    assert types in text
    space = tmp_path / "two.yaml"  # two types: a rotation of two steps, 8 static models
    space.write_text(text.replace("name: tiny", "name: tiny-two").replace(types, "attention: [softmax, local:32]"))
    out = tmp_path / "step.json"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_supernet.py"), "--space", str(space), "--threads", "1",
                           "--rounds", "1", "--batch-size", "1", "--seq-len", "8", "--only", "sandwich", "--json", str(out)],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads(out.read_text())
    assert [r["measurement"] for r in record["results"]] == ["sandwich"]
    for r in record["results"]:
        assert r["supernet_tokens_s"] > 0 and r["static_tokens_s"] > 0
        assert abs(r["ratio_median"] - r["supernet_tokens_s"] / r["static_tokens_s"]) < 1e-9
    assert record["space"] == "tiny-two" and record["threads"] == 1 and len(record["load_before"]) == 3
    assert "sandwich    cpu fp32" in done.stdout and "target supernet >= 90% of static" in done.stdout

