"""HAT's translate workload timed on ONNX Runtime: a campaign's table, static trained models side by side, and the
timed loop itself (one encoder run, then ``steps`` decoder-step runs at the beam, the caches growing)."""

import csv
import json
import os

import numpy as np
import pytest
import torch

from latency.device import get_device
from latency.onnx_graphs import graph_dir
from latency.protocol import measure
from latency.timing_core import Settings, ort_session, translate_ort_runner
from nas.cli import main
from tasks.translation.model import TranslationSuperTransformer
from tasks.translation.timing import cached_translation_graphs
from tests.tasks.translation.translation_fakes import MINI_SEQ2SEQ, mini_space

FAST = ["--timing-threads", "1", "--timing-warmup", "1", "--repeats", "2", "--rounds", "2", "--min-sample-ms", "1"]
SETTINGS = Settings(warmup=1, repeats=2, rounds=2, min_sample_ms=1.0, ref_samples=1, max_retries=0)


pytestmark = pytest.mark.usefixtures("graph_cache")  # the largest and smallest subnets are exported once (conftest)


def test_a_campaign_on_onnxruntime_writes_translate_rows(tmp_path):
    space = tmp_path / "mini.yaml"
    space.write_text(MINI_SEQ2SEQ.format(positions="rope"))
    table = tmp_path / "t.csv"
    assert main(["measure-latency", str(space), "--device", "onnxruntime", "--samples", "2", "--retest", "0",
                 "--out", str(table), "-q", *FAST]) == 0  # fmt: skip
    rows = list(csv.DictReader(table.open()))
    s = mini_space()
    assert {r["workload"] for r in rows} == {"translate:16->16x3"} and len(rows) == 2
    assert {r["key"] for r in rows} == {s.largest().key, s.smallest().key}
    assert all(float(r["median_ms"]) > 0 for r in rows)
    meta = json.loads((tmp_path / "t.csv.json").read_text())
    assert meta["fingerprint"]["device"] == "onnxruntime" and meta["workload"]["kind"] == "translate"
    # the graphs are cached per architecture without their weights (the session draws them)
    folders = sorted(graph_dir().glob("s2s-*"))
    assert len(folders) == 2
    for folder in folders:
        key = folder.name[len("s2s-"):]
        assert sorted(p.name for p in folder.iterdir()) == [f"{key}-decoder_step.onnx", f"{key}-encoder.onnx", "layout.json"]
        layout = json.loads((folder / "layout.json").read_text())
        assert layout["encoder_tensors"] and layout["decoder_step_tensors"]


def test_measure_times_static_trained_encoder_decoders_side_by_side():
    """The interface a benchmark uses: ``measure`` of static TranslationTransformers with weights (the default reference:
    the space's smallest subnet)."""
    space = mini_space()
    supernet = TranslationSuperTransformer(space, generator=torch.Generator().manual_seed(0))
    models = {"big": supernet.extract(space.largest()), "small": supernet.extract(space.smallest())}
    m = measure(get_device("onnxruntime", threads=1), models, space.workload(), SETTINGS, seed=0)
    assert set(m.results) == {"big", "small"} and all(r.median_ms > 0 for r in m.results.values())


class Counting:
    """An ONNX Runtime session that counts its runs and the growing cache length it was fed."""

    def __init__(self, session):
        self.session, self.calls, self.past = session, 0, []

    def get_outputs(self):
        return self.session.get_outputs()

    def run(self, names, feed):
        self.calls += 1
        if "past_key_values.0.decoder.key" in feed:
            self.past.append((feed["past_key_values.0.decoder.key"].shape[0], feed["past_key_values.0.decoder.key"].shape[2],
                              int(feed["position"][0])))
        return self.session.run(names, feed)


def test_the_timed_loop_runs_the_encoder_once_and_the_step_steps_times():
    space = mini_space()
    with torch.device("meta"):
        from tasks.translation.model import TranslationTransformer

        model = TranslationTransformer(space, space.largest())  # softmax decoder layers: growing k / v caches
    g = cached_translation_graphs(model)
    encoder = Counting(ort_session(str(g["encoder"]), g["encoder_tensors"], threads=1))
    step = Counting(ort_session(str(g["decoder_step"]), g["decoder_step_tensors"], threads=1))
    w = space.workload()
    run = translate_ort_runner(encoder, step, g["inputs"], w.source, w.steps, w.beam, "wall")
    assert run(2) > 0
    assert encoder.calls == 2 and step.calls == 2 * w.steps
    # each run starts from empty caches; step t sees t entries at batch beam and position t
    expected = [(w.beam, t, t) for t in range(w.steps)]
    assert step.past == expected * 2
    assert np.isfinite(run(1))


def test_cuda_and_precisions_at_a_translate_workload(tmp_path, capsys):
    """cuda is no longer refused for a seq2seq space (here it stops at the missing GPU); int8 is, in one line."""
    space = tmp_path / "mini.yaml"
    space.write_text(MINI_SEQ2SEQ.format(positions="rope"))
    out = tmp_path / "x.csv"
    if not torch.cuda.is_available():
        assert main(["measure-latency", str(space), "--device", "cuda", "--out", str(out)]) == 2
        assert "--device cuda: no CUDA GPU is visible to torch" in capsys.readouterr().err
    assert main(["measure-latency", str(space), "--device", "onnxruntime", "--precision", "int8-dynamic", "--out",
                 str(out)]) == 2  # fmt: skip
    assert capsys.readouterr().err == ("nas measure-latency: error: --precision int8-dynamic: a seq2seq space (mini-s2s) "
                                       "is timed in fp32 only so far\n")  # fmt: skip
    assert not out.exists()


def test_an_arm_bundle_carries_both_graphs_and_times_the_translate_loop(tmp_path):
    """The bundle runner (numpy and onnxruntime only) runs HAT's loop on each subnet's two graphs; its table is read
    back as a translate table."""
    import subprocess
    import sys
    import tarfile

    from latency.table import read_timings

    space = tmp_path / "mini.yaml"
    space.write_text(MINI_SEQ2SEQ.format(positions="rope"))
    bundle = tmp_path / "b.tar.gz"
    assert main(["measure-latency", str(space), "--device", "arm", "--bundle", str(bundle), "--samples", "2", "--retest",
                 "0", "-q", *FAST]) == 0  # fmt: skip
    with tarfile.open(bundle) as tar:
        tar.extractall(tmp_path, filter="data")
    root = tmp_path / "nas-latency-bundle"
    manifest = json.loads((root / "manifest.json").read_text())
    assert all(m["graph"].endswith("-encoder.onnx") and m["step_graph"].endswith("-decoder_step.onnx")
               for m in manifest["models"] + [manifest["reference"]])  # fmt: skip
    done = subprocess.run([sys.executable, str(root / "runner.py"), "--threads", "1", "--out", str(tmp_path / "board.csv")],
                          capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": ""})  # fmt: skip
    assert done.returncode == 0, done.stderr
    t = read_timings(tmp_path / "board.csv")
    s = mini_space()
    assert t.workload.kind == "translate" and set(t.passes("measure")) == {s.largest().key, s.smallest().key}
    assert all(r.median_ms > 0 for r in t.passes("measure").values())
