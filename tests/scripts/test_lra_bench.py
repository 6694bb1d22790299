"""scripts/bench_lra.py --quick: every stage on tiny settings, lra.json's contract, and a rerun that trains nothing."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def fake_fashion_mnist(folder: Path) -> None:
    """Four small IDX files in the format of Fashion-MNIST's (the bench must not depend on the installed data)."""
    folder.mkdir()
    rng = np.random.default_rng(0)
    for split, n in (("train", 64), ("t10k", 16)):
        for kind, array in (("images-idx3", rng.integers(0, 256, size=(n, 28, 28))), ("labels-idx1", np.arange(n) % 10)):
            header = bytes([0, 0, 8, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
            with gzip.open(folder / f"{split}-{kind}-ubyte.gz", "wb") as f:
                f.write(header + array.astype(np.uint8).tobytes())


def test_bench_lra_quick_writes_the_contract_and_resumes(tmp_path):
    fake_fashion_mnist(tmp_path / "fm")
    env = {**os.environ, "NAS_FASHION_MNIST": str(tmp_path / "fm"), "NAS_CACHE": str(tmp_path / "cache"),
           "PYTHONPATH": str(ROOT)}
    out = tmp_path / "run"
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_lra.py"), "--quick", "--out", str(out), "--types",
           "softmax,local:8,linear", "--threads", "1"]
    first = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-4000:]
    record = json.loads((out / "lra.json").read_text())
    assert {"command", "machine", "load", "protocol", "accuracy", "speed", "search"} <= set(record)
    assert "in place of LRA's grayscale CIFAR-10" in record["note"] and "Fashion-MNIST" in first.stdout
    assert set(record["accuracy"]) == {"listops", "image", "pathfinder"}
    for task, types in record["accuracy"].items():
        assert set(types) == {"softmax", "local:8", "linear"}
        for r in types.values():
            assert 0.0 <= r["ci_low"] <= r["ours"] <= r["ci_high"] <= 100.0
            assert len(r["correct"]) == r["test_examples"] and r["ours"] == 100.0 * r["correct"].count("1") / len(r["correct"])
        summary = record["accuracy_summary"][task]
        assert summary["shared_types"] == ["softmax", "local:8", "linear"]
        tau = summary["kendall_tau_vs_lra"]  # undefined (None) only when our accuracies are all equal
        assert -1 <= tau <= 1 if tau is not None else len({r["ours"] for r in types.values()}) == 1
        assert 0 < summary["majority_class"] <= 100  # the share of the test split's most common label
        assert summary["above_majority"] == [s for s, r in types.items() if r["ci_low"] > summary["majority_class"]]
        assert 0 < summary["first_token"] <= 100  # the most common training label after the first token, on test
        assert summary["above_first_token"] == [s for s, r in types.items() if r["ci_low"] > summary["first_token"]]
        d = summary["softmax_vs_local"]
        assert abs(d["difference"] - (types["softmax"]["ours"] - types["local:8"]["ours"])) < 1e-9
        assert d["ci_low"] <= d["difference"] <= d["ci_high"]
        assert d["call"] == ("better" if d["ci_low"] > 0 else "worse" if d["ci_high"] < 0 else "tie")
    assert record["accuracy_summary"]["listops"]["softmax_vs_local"]["lra"] == {"softmax": 36.37, "local": 15.82}
    assert record["accuracy"]["listops"]["softmax"]["lra"] == 36.37 and record["accuracy"]["pathfinder"]["linear"]["lra"] == 75.30
    assert record["speed"]["softmax"] == {"64": 1.0, "128": 1.0} and set(record["speed"]["linear"]) == {"64", "128"}
    assert all(v > 0 for v in record["speed"]["linear"].values())
    assert set(record["speed_targets"]) == {"local:8", "linear"}  # the linear-time types, judged at the longest length
    for spec, t in record["speed_targets"].items():
        assert t["tokens"] == 128 and t["steps_per_s_vs_softmax"] == record["speed"][spec]["128"]
        assert t["met"] == (t["steps_per_s_vs_softmax"] >= 5.0)
    assert set(record["search"]) == {"listops", "pathfinder"}
    for rows in record["search"].values():
        assert len(rows) == 3 and [r["budget_ms"] for r in rows] == sorted(r["budget_ms"] for r in rows)
        for r in rows:
            assert r["verdict"].split(" (")[0] in ("found wins", "uniform wins", "tie")
            d = r["difference"]
            assert abs(d["difference"] - (r["found"]["test_accuracy"] - r["best_uniform"]["test_accuracy"])) < 1e-9
            for side in ("found", "best_uniform"):
                assert 0.0 <= r[side]["test_accuracy"] <= 100.0 and r[side]["measured_ms"] > 0 and r[side]["subnet"]["depth"] >= 1
    # the search's models, trained in workers: one a distinct subnet (the same subnet under two budgets is one model),
    # its model folder beside its record; the model timed is the model trained (reloaded, it gives the record's answers)
    sys.path.insert(0, str(ROOT / "scripts"))
    import bench_lra
    from search_spaces import load_space
    from supernet.artifact import load_model
    from tasks.sequence_classification.train import score_correct

    for task, rows in record["search"].items():
        models = out / "search" / task / "models"
        keys = {r[w]["key"] for r in rows for w in ("found", "best_uniform")}
        assert {p.name for p in models.iterdir() if p.is_dir()} == keys == {p.stem for p in models.glob("*.log")}
        space, p = load_space(out / "search" / task / "space.yaml"), bench_lra.for_task(bench_lra.QUICK, task)
        _, data = bench_lra.task_data(out, task, p, 0)
        for r in rows:
            model = load_model(models / r["found"]["key"])
            assert model.subnet.to_dict() == r["found"]["subnet"]
            assert "".join("1" if c else "0" for c in score_correct(model, data.test, space, p.batch)) == r["found"]["correct"]
    for task, t in record["search_summary"].items():
        assert t["wins"] == sum(r["verdict"].startswith("found wins") for r in record["search"][task]) and t["budgets"] == 3
        assert t["target_met"] == (t["wins"] >= 2)
    assert record["wall"] == {"total_s": record["load"]["wall_s"], "runs": 1}
    for name in ("accuracy.png", "speed.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "accuracy.csv").read_text().startswith("task,type,ours,lra")
    # self-pretrained by default (the quick protocol's 2 steps before its 4), every model's curve in curves.csv
    assert record["protocol"]["pretrain_steps"] == 2
    assert all(r["pretrain_steps"] == 2 and "curve" not in r for types in record["accuracy"].values() for r in types.values())
    curves = (out / "curves.csv").read_text().splitlines()
    names = {line.split(",")[0] for line in curves[1:]}
    assert curves[0] == "model,step,elapsed_s,loss" and {f"{t}/softmax" for t in record["accuracy"]} <= names
    assert max(int(line.split(",")[1]) for line in curves[1:] if line.startswith("listops/softmax,")) == 6
    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file() and p.name != "lra.json" and p.suffix != ".png"
              and p.suffix != ".csv" and p.name != "runs.json"}
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-4000:]
    assert "steps of" not in again.stderr and "speed softmax (train)" not in again.stderr  # nothing trained or timed again
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
    rerun = json.loads((out / "lra.json").read_text())
    assert rerun["accuracy"] == record["accuracy"] and rerun["search"] == record["search"]
    assert rerun["accuracy_summary"] == record["accuracy_summary"] and rerun["wall"]["runs"] == 2  # the wall time sums both
    assert rerun["wall"]["total_s"] == round(record["wall"]["total_s"] + rerun["load"]["wall_s"], 1)


def test_paired_verdicts_call_a_win_only_outside_the_noise():
    sys.path.insert(0, str(ROOT / "scripts"))
    import bench_lra

    same = bench_lra.paired("0110" * 50, "0110" * 50, seed=0)
    assert same == {"difference": 0.0, "ci_low": 0.0, "ci_high": 0.0} and bench_lra.call(same) == "tie"
    rng = np.random.default_rng(0)
    a, b = rng.random(500) < 0.40, rng.random(500) < 0.15  # 40% against 15% of 500 examples
    d = bench_lra.paired(a.tolist(), b.tolist(), seed=0)
    assert abs(d["difference"] - 100.0 * (a.mean() - b.mean())) < 1e-9 and 15 < d["ci_low"] < d["difference"] < d["ci_high"] < 35
    assert bench_lra.call(d) == "better" and bench_lra.call(bench_lra.paired(b.tolist(), a.tolist(), seed=0)) == "worse"
    close = bench_lra.paired(a.tolist(), (rng.random(500) < 0.38).tolist(), seed=0)  # 2 points on 500 examples: noise
    assert close["ci_low"] < 0 < close["ci_high"] and bench_lra.call(close) == "tie"

    def entry(found_ms: float, uniform_ms: float) -> dict:
        return {"found": {"measured_ms": found_ms}, "best_uniform": {"measured_ms": uniform_ms}, "difference": d}

    assert bench_lra.verdict(entry(1.0, 1.2), budget=1.0) == "found wins"
    assert bench_lra.verdict(entry(1.1, 1.2), budget=1.0) == "found wins (found over budget)"  # no slower than uniform
    assert bench_lra.verdict(entry(1.3, 0.9), budget=1.0) == "tie (found over budget)"  # more accurate, but slower


def test_baselines_score_the_majority_class_and_the_first_token_alone():
    from types import SimpleNamespace

    sys.path.insert(0, str(ROOT / "scripts"))
    import bench_lra

    def split(first: list[int], labels: list[int]) -> SimpleNamespace:  # [CLS] (id 10), the first token, padding
        inputs = np.array([[10, t, 11] for t in first])
        targets = np.full((len(first), 3), -100)
        targets[:, 0] = labels
        return SimpleNamespace(inputs=inputs, targets=targets)

    # training: token 20 is followed by label 3 twice in three, token 21 by label 5; label 3 is the most common
    train = split([20, 20, 20, 21, 21, 22], [3, 3, 1, 5, 5, 3])
    test = split([20, 21, 21, 23, 22], [3, 5, 0, 3, 1])  # 23 never seen: the most common training label (3)
    got = bench_lra.baselines(SimpleNamespace(train=train, test=test))
    assert got == {"majority_class": 40.0, "first_token": 60.0}  # test labels 3 are 2 of 5; right: 20->3, 21->5, 23->3


def test_the_default_lineup_has_lra_types_and_skips_what_cannot_mix_the_length():
    sys.path.insert(0, str(ROOT / "scripts"))
    from dataclasses import replace

    import bench_lra

    every = replace(bench_lra.SMALL, lineup="all")
    listops, notes = bench_lra.type_specs(every, 2000, None)
    assert {"softmax", "local:64", "linformer:128", "performer:64", "nystrom:64", "reformer:64", "sinkhorn:64",
            "synthesizer-dense", "synthesizer-random"} <= set(listops)
    assert "axial" not in listops and any(n.startswith("axial: skipped (") and "square" in n for n in notes)
    assert "axial" in bench_lra.type_specs(every, 1024, None)[0]  # Pathfinder's 32 x 32
    # the small protocol's default: LRA's own lineup, one type per row of its Table 1 (its Synthesizer: random)
    lra = bench_lra.type_specs(bench_lra.SMALL, 2000, None)[0]
    assert lra == [s for s in listops if bench_lra.lra_row(s) in bench_lra.LRA]
    assert {bench_lra.lra_row(s) for s in lra} == set(bench_lra.LRA)
    assert len(lra) == 10 and bench_lra.FULL.lineup == bench_lra.QUICK.lineup == "all"
    assert "synthesizer-random" in lra and "synthesizer-dense" not in lra  # LRA's Synthesizer: its code's random mode
    speed, _ = bench_lra.type_specs(every, 4096, None, bench_lra.SMALL.speed_lengths)
    assert "axial" not in speed  # 4,096 is a square, 2,048 is not
    linear = {s for s in speed if bench_lra.linear_time(s.replace("cosformer:4096", "cosformer:{t}"), bench_lra.SMALL)}
    assert {"local:64", "linear", "performer:64", "nystrom:64", "reformer:64", "sinkhorn:64"} <= linear
    assert not {"softmax", "gqa:1", "synthesizer-dense"} & linear


def test_a_stopped_run_stops_its_workers_notes_its_time_and_resumes(tmp_path):
    import signal
    import time

    fake_fashion_mnist(tmp_path / "fm")
    env = {**os.environ, "NAS_FASHION_MNIST": str(tmp_path / "fm"), "NAS_CACHE": str(tmp_path / "cache"),
           "PYTHONPATH": str(ROOT)}
    out = tmp_path / "run"
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_lra.py"), "--quick", "--out", str(out), "--types", "softmax",
           "--stages", "accuracy", "--jobs", "1"]  # one type: the rerun trains the other two tasks' models, not five
    first = out / "accuracy" / "listops" / "softmax.json"
    with open(tmp_path / "first.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
        deadline = time.time() + 300
        while not first.exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.1)
        assert first.exists(), (tmp_path / "first.log").read_text()[-3000:]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 128 + signal.SIGTERM
    workers = [p for p in Path("/proc").glob("[0-9]*")
               if b"--accuracy-worker" in _cmdline(p) and str(out).encode() in _cmdline(p)]
    assert workers == []  # the stopped run stopped its worker
    runs = json.loads((out / "runs.json").read_text())
    assert len(runs) == 1 and runs[0]["finished"] is False and runs[0]["wall_s"] > 0
    assert [s["stage"] for s in runs[0]["stages"]] == ["accuracy"]
    kept = first.stat().st_mtime_ns
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "accuracy listops softmax:" not in again.stderr and first.stat().st_mtime_ns == kept  # not trained again
    runs = json.loads((out / "runs.json").read_text())
    assert [r["finished"] for r in runs] == [False, True]
    record = json.loads((out / "lra.json").read_text())
    assert record["wall"] == {"total_s": round(runs[0]["wall_s"] + runs[1]["wall_s"], 1), "runs": 2}
    assert all(set(record["accuracy"][t]) == {"softmax"} for t in ("listops", "image", "pathfinder"))


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""


def test_bad_flags_are_refused_in_one_line_before_anything_is_written(tmp_path):
    script = str(ROOT / "scripts" / "bench_lra.py")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    refusals = ((["--types", "softmax,reformer"], "bench_lra.py: error: --types: 'reformer' must be written reformer:B"),
                (["--jobs", "0"], "bench_lra.py: error: --jobs: 0 is not a positive number of models at a time"))
    for flags, message in refusals:
        done = subprocess.run([sys.executable, script, "--quick", "--out", str(tmp_path / "run"), *flags],
                              capture_output=True, text=True, env=env)
        assert done.returncode == 2 and done.stderr.strip().splitlines()[-1] == message, done.stderr
    assert not (tmp_path / "run").exists()


def test_the_speed_worker_builds_each_model_for_the_length_it_times(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    import bench_lra

    # cosFormer's M is the length: a model built for the longest (4,096) could not hold cosformer:1024 (refused)
    for part in ("train", "ort"):
        bench_lra.speed_worker("cosformer:{t}", part, bench_lra.QUICK, tmp_path, threads=1)
    rows = json.loads((tmp_path / f"{bench_lra.safe('cosformer:{t}')}.train.json").read_text())["lengths"]
    assert set(rows) == {"64", "128"} and all(r["train_steps_per_s"] > 0 for r in rows.values())
    ort = json.loads((tmp_path / f"{bench_lra.safe('cosformer:{t}')}.ort.json").read_text())["lengths"]
    assert set(ort) == {"64", "128"} and all(r["ort_ms"] > 0 for r in ort.values())
    assert not list((tmp_path / "onnx").iterdir())  # each length's graph, timed and removed

    # every type is built for the length it is timed at: the Synthesizers' weights grow with it
    bench_lra.speed_worker("synthesizer-random", "train", bench_lra.QUICK, tmp_path, threads=1)
    synth = json.loads((tmp_path / "synthesizer-random.train.json").read_text())["lengths"]
    assert synth["128"]["params"] > synth["64"]["params"] and rows["128"]["params"] == rows["64"]["params"]


def test_the_latency_campaign_fits_on_its_samples_and_holds_out_the_retimed_ones():
    """The search stage's campaign: ``samples`` subnets to fit on, ``held_out`` more timed twice (fit-predictor holds
    the re-timed ones out and they give the ceiling); it once timed 60 with --retest 0.5 and fitted on 30."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import bench_lra

    from latency.sampling import MIN_RETEST_SUBNETS, retest_subset

    for p in (bench_lra.SMALL, bench_lra.QUICK, bench_lra.FULL):
        flags = bench_lra.campaign_flags(p)
        assert flags[0::2] == ["--samples", "--retest"]
        total = int(flags[1])
        again = retest_subset(list(range(total)), float(flags[3]), seed=0)
        assert len(again) == p.held_out >= MIN_RETEST_SUBNETS and total - len(again) == p.samples
    assert (bench_lra.SMALL.samples, bench_lra.SMALL.held_out) == (60, 30)
