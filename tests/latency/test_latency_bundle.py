"""ONNX Runtime device and the ARM bundle, end to end: build, run in a clean venv, ingest."""

import os
import subprocess
import sys
import tarfile

import numpy as np
import pytest
import torch

from latency.devices.arm import run_remote, runner_source, write_bundle
from collections import Counter

from latency.onnx_graphs import cached_graph, with_weights
from latency.sampling import campaign_subnets, retest_subset
from latency.table import read_timings
from latency.timing_core import Settings, ort_session
from search_spaces import LayerChoice
from supernet import SuperTransformer
from supernet.model import Transformer, TransformerConfig
from supernet.onnx_export import export_onnx, op_counts

from tests.latency.latency_fakes import MICRO, micro_space

SETTINGS = Settings(warmup=1, repeats=2, rounds=2, min_sample_ms=1.0, ref_samples=1, max_retries=0)


pytestmark = pytest.mark.usefixtures("graph_cache")  # the micro space's three parts are exported once (conftest)


def test_stitched_graph_computes_the_model_and_holds_the_whole_exports_ops(tmp_path):
    """Generic parts (weights as inputs of any size) stitched for one shape compute that model exactly."""
    import onnx
    import onnxruntime as ort

    space = micro_space()
    # two head counts and FFN widths through one generic softmax block graph; the tied embedding bound twice
    layers = (LayerChoice(8, 256, "softmax"), LayerChoice(4, 96, "softmax"))
    config = TransformerConfig(space.vocab_size, space.max_seq_len, space.head_dim, space.positions, 40, layers)
    model = Transformer(config, generator=torch.Generator().manual_seed(0)).eval()
    graph, tensors = cached_graph(model, tmp_path)
    assert len(list((tmp_path / "generic").glob("*.onnx"))) == 3  # embed, one block for both layers, head
    own = with_weights(graph, tensors, model, tmp_path / "own")  # the model's own weights into the layout
    session = ort.InferenceSession(str(own), providers=["CPUExecutionProvider"])
    for shape in [(1, 5), (2, 13), (3, space.max_seq_len)]:  # dynamic batch and sequence axes
        tokens = torch.randint(0, 64, shape, generator=torch.Generator().manual_seed(1))
        out = session.run(None, {"input_ids": tokens.numpy()})[0]
        assert np.abs(out - model(tokens).detach().numpy()).max() < 1e-4
    counts = Counter(n.op_type for n in onnx.load(str(graph), load_external_data=False).graph.node)
    whole = op_counts(export_onnx(model, tmp_path / "whole.onnx"))
    for op in ("Attention", "LayerNormalization", "MatMul", "Gelu", "Gather", "Add", "Mul"):
        assert counts[op] == whole[op], op  # every compute op of the one-piece export, no more
    assert sorted(t["name"] for t in tensors) == sorted(model.state_dict())  # every weight once (tied: one tensor)


def test_weight_stripped_graphs_are_small_and_open_with_random_weights():
    space = micro_space()
    model = SuperTransformer(space, generator=torch.Generator().manual_seed(0)).eval().extract(space.largest())
    graph, tensors = cached_graph(model)
    import onnx

    inline = sum(len(t.raw_data) for t in onnx.load(str(graph), load_external_data=False).graph.initializer)
    assert sum(t["nbytes"] for t in tensors) == 4 * model.num_params()  # every weight is left out of the graph
    assert inline <= len(model.blocks) * 2 * 4 * space.max_seq_len * space.head_dim  # what stays: rope tables, constants
    assert cached_graph(model) == (graph, tensors)  # a cache hit
    out = ort_session(str(graph), tensors, threads=1).run(None, {"input_ids": np.zeros((2, 7), dtype=np.int64)})[0]
    assert out.shape == (2, 7, 64) and np.isfinite(out).all() and out.std() > 0


def test_onnxruntime_device_measures_a_campaign(tmp_path, capsys):
    from nas.cli import main

    args = ["measure-latency", str(tmp_path / "micro.yaml"), "--device", "onnxruntime", "--timing-threads", "1",
            "--samples", "3",
            "--out", str(tmp_path / "t.csv"), "--timing-warmup", "1", "--repeats", "2", "--rounds", "2", "--min-sample-ms", "1"]
    (tmp_path / "micro.yaml").write_text(MICRO)
    assert main(args) == 0
    t = read_timings(tmp_path / "t.csv")
    assert len(t.passes("measure")) == 3 and t.fingerprint["device"] == "onnxruntime" and t.fingerprint["threads"] == 1
    assert t.fingerprint["onnxruntime"] and all(r.median_ms > 0 for r in t.rows)
    other = list(args)
    other[other.index("--timing-threads") + 1] = "2"
    assert main(other) == 2  # another thread count: refused
    assert "threads: file has 1, this run has 2" in capsys.readouterr().err


def make_bundle(tmp_path, workload="prefill"):
    space = micro_space(decode=True)
    subnets = campaign_subnets(space, 3, seed=0)
    passes = {"measure": subnets, "retest": retest_subset(subnets, 0.5, seed=0)}
    return space, write_bundle(tmp_path / "b.tar.gz", space, space.workload(workload), passes, SETTINGS, seed=0)


@pytest.mark.parametrize("workload", ["prefill", "decode"])
def test_bundle_round_trip_in_a_clean_venv(tmp_path, clean_python, workload):
    space, bundle = make_bundle(tmp_path, workload)
    with tarfile.open(bundle) as tar:
        names = tar.getnames()
        tar.extractall(tmp_path / "board", filter="data")
    assert "nas-latency-bundle/runner.py" in names and "nas-latency-bundle/manifest.json" in names
    assert sum(n.endswith(".onnx") for n in names) == 3  # depth 1, 2, 3 (the reference shares depth 2's graph)
    board = tmp_path / "board"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NAS_CACHE")}
    run = lambda: subprocess.run(  # noqa: E731
        [str(clean_python), "-I", "nas-latency-bundle/runner.py", "--out", "timings.csv", "--threads", "1"],
        cwd=board, env=env, capture_output=True, text=True, timeout=300,
    )
    first = run()
    assert first.returncode == 0, first.stderr
    t = read_timings(board / "timings.csv")  # the host ingests what the board wrote
    assert len(t.passes("measure")) == 3 and len(t.passes("retest")) == 2 and t.space.hash == space.hash
    assert t.workload == space.workload(workload) and all(r.median_ms > 0 for r in t.rows)
    import onnxruntime

    venv_ort = subprocess.run(
        [str(clean_python), "-c", "import onnxruntime; print(onnxruntime.__version__)"], capture_output=True, text=True
    )
    assert t.fingerprint["onnxruntime"] == venv_ort.stdout.strip() and t.fingerprint["threads"] == 1 and onnxruntime
    again = run()  # resuming a finished table measures nothing
    assert again.returncode == 0 and "5 of 5 already measured" in again.stdout
    assert len(read_timings(board / "timings.csv").rows) == 5


def test_runner_is_one_file_that_imports_only_numpy_and_onnxruntime():
    import ast

    tree = ast.parse(runner_source())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported - set(sys.stdlib_module_names) == {"numpy", "onnxruntime"}


def test_ssh_device_drives_the_bundle_remotely(tmp_path, clean_python):
    """ssh and scp replaced by local stand-ins: the driver copies, runs, resumes and fetches."""
    _, bundle = make_bundle(tmp_path)
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "ssh").write_text('#!/bin/sh\nshift\nexec sh -c "$*"\n')
    (fake / "scp").write_text(
        '#!/bin/sh\nfor a in "$@"; do last="$a"; done\nfor a in "$@"; do [ "$a" = "$last" ] || cp "${a#*@host:}" '
        '"${last#*@host:}"; done\n'
    )
    # a script, not a symlink: a venv's interpreter reached through a link outside its folder runs as the base one
    (fake / "python3").write_text(f'#!/bin/sh\nexec "{clean_python}" "$@"\n')
    for f in ("ssh", "scp", "python3"):
        (fake / f).chmod(0o755)
    env = {"NAS_SSH": str(fake / "ssh"), "NAS_SCP": str(fake / "scp"), "PATH": f"{fake}:{os.environ['PATH']}"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        out = tmp_path / "local" / "remote.csv"
        run_remote("ssh://user@host", bundle, out, threads=1, workdir=str(tmp_path / "remote"))
        assert len(read_timings(out).rows) == 5
        run_remote("ssh://user@host", bundle, out, threads=1, workdir=str(tmp_path / "remote2"))  # resumes from the local table
        assert len(read_timings(out).rows) == 5
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_arm_bundle_warns_below_what_a_fit_needs_and_says_so_in_its_readme(tmp_path, capsys):
    from nas.cli import main

    (tmp_path / "micro.yaml").write_text(MICRO)
    args = ["measure-latency", str(tmp_path / "micro.yaml"), "--device", "arm", "--bundle", str(tmp_path / "b.tar.gz"),
            "--samples", "3", "--retest", "0.5"]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "--samples 3: nas fit-predictor needs at least 10 measured subnets and will refuse this table" in err
    assert "2 re-timed subnets (--retest share of --samples): the test-retest agreement needs at least 5" in err
    with tarfile.open(tmp_path / "b.tar.gz") as tar:
        readme = tar.extractfile("nas-latency-bundle/README.txt").read().decode()
    assert "It times 3 subnets, then re-times 2 of them" in readme and "Python >= 3.10" in readme
    assert "A fit needs at least 10 measured subnets" in readme and "its table will not make a predictor" in readme
    from latency.sampling import campaign_shortfalls

    assert campaign_shortfalls(10, 5) == [] and len(campaign_shortfalls(9, 5)) == len(campaign_shortfalls(10, 4)) == 1


def test_runner_refuses_an_older_python_in_one_line(tmp_path, clean_python, monkeypatch):
    """The preamble runs before numpy is imported; with the floor raised past this Python it refuses to run."""
    import latency.devices.arm as arm

    monkeypatch.setattr(arm, "MIN_PYTHON", (3, 99))
    (tmp_path / "runner.py").write_text(arm.runner_source())
    done = subprocess.run([str(clean_python), "-I", str(tmp_path / "runner.py")], capture_output=True, text=True)
    version = subprocess.run([str(clean_python), "-c", "import platform; print(platform.python_version())"],
                             capture_output=True, text=True).stdout.strip()
    assert done.returncode == 2 and done.stderr == (
        "error: this runner needs Python >= 3.99 (onnxruntime >= 1.23 has no wheels for older Pythons); "
        f"this is Python {version}\n"
    )
