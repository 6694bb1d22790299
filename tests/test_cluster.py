"""docs/cluster.md's recipes, on this machine: a 2-node ``torchrun`` rendezvous and 3 search workers on PostgreSQL.

* Two ``torchrun --nnodes 2 --rdzv-backend c10d --rdzv-endpoint localhost:PORT`` launches (one process each, as on
  two hosts) train the supernet data-parallel over gloo; the weights equal one process's training on the same
  global batch.
* Three ``nas search`` processes share one study in a throwaway PostgreSQL server (the storage tests' fixture):
  every slot is evaluated exactly once, the work is shared, nothing is left RUNNING, and each worker reports the
  result a single worker gets alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import optuna
import pytest
import torch

from nas.cli import main
from nas.search import open_storage
from search_spaces import Subnet, load_space

from .conftest import ROOT
from .test_data import write_docs
from .test_search_storage import _free_port, postgres_url  # noqa: F401  (the PostgreSQL server fixture)
from .test_train import MICRO, max_diff
from .test_workloads import fit_predictor

TRAIN = ["--batch-size", "8", "--seq-len", "16", "--max-steps", "4", "--warmup", "2", "--eval-interval", "4",
         "--eval-batches", "2", "--ckpt-interval", "4", "--threads", "1", "--device", "cpu"]
SEARCH = ["--budget", "5ms", "--population", "12", "--parents", "3", "--mutations", "4", "--crossovers", "4",
          "--generations", "3", "--val-windows", "6", "--seq-len", "16", "--no-progress", "-q"]


@pytest.fixture(scope="module")
def micro_files(tmp_path_factory):
    base = tmp_path_factory.mktemp("cluster")
    (base / "micro.yaml").write_text(MICRO)
    docs = write_docs(base / "docs", n=10)
    return base / "micro.yaml", docs


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def test_two_node_torchrun_rendezvous_trains_what_one_process_trains(micro_files, tmp_path):
    space, docs = micro_files
    port = _free_port()
    nodes = [
        subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(i), "--nproc-per-node", "1",
             "--rdzv-backend", "c10d", "--rdzv-endpoint", f"localhost:{port}", "--rdzv-id", "nas-test",
             "-m", "nas", "train-supernet", str(space), "--out", str(tmp_path / f"node{i}"), "--data", str(docs), *TRAIN],
            cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for i in range(2)
    ]
    logs = [n.communicate(timeout=240)[0] for n in nodes]
    for n, log in zip(nodes, logs):
        assert n.returncode == 0, log[-3000:]
    written = [p for p in (tmp_path / "node0" / "final.pt", tmp_path / "node1" / "final.pt") if p.exists()]
    assert len(written) == 1, "rank 0 alone writes the checkpoint, on whichever node the rendezvous made rank 0"
    ddp = torch.load(written[0], weights_only=True)
    assert ddp["meta"]["world_size"] == 2 and ddp["meta"]["step"] == 4

    assert main(["train-supernet", str(space), "--out", str(tmp_path / "single"), "--data", str(docs), *TRAIN]) == 0
    single = torch.load(tmp_path / "single" / "final.pt", weights_only=True)
    assert single["meta"]["world_size"] == 1
    # --batch-size is global: two ranks of 4 windows each compute what one process computes with 8
    assert max_diff(ddp["model"], single["model"]) <= 1e-5


def search_worker(ckpt, pred, val, out, url):
    return subprocess.Popen(
        [sys.executable, "-m", "nas", "search", str(ckpt), "--predictor", str(pred), "--val-data", str(val), *SEARCH,
         "--out", str(out), "--storage", url, "--study", "shared"],
        cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def best_of(out):
    summary = json.loads((out / "search.json").read_text())["budgets"]["5ms"]["best"]
    return Subnet.load(out / "best_5ms.yaml").key, summary["loss_bpb"]


def test_three_search_workers_share_one_postgresql_study(postgres_url, micro_files, tmp_path):  # noqa: F811
    space_file, docs = micro_files
    assert main(["train-supernet", str(space_file), "--out", str(tmp_path / "sn"), "--data", str(docs), *TRAIN]) == 0
    pred = fit_predictor(load_space(str(space_file)), load_space(str(space_file)).workload("prefill"), tmp_path / "pred")
    val = tmp_path / "val.txt"
    val.write_bytes((docs / "doc00.txt").read_bytes() * 4)
    ckpt = tmp_path / "sn" / "final.pt"

    started = time.monotonic()
    workers = [search_worker(ckpt, pred, val, tmp_path / f"w{i}", postgres_url) for i in range(3)]
    for w in workers:
        out, err = w.communicate(timeout=300)
        assert w.returncode == 0, err[-3000:]
    took = time.monotonic() - started

    trials = optuna.load_study(study_name="shared", storage=open_storage(postgres_url)).get_trials(deepcopy=False)
    complete = [t for t in trials if t.state.name == "COMPLETE"]
    slots = [tuple(t.system_attrs["nas:slot"]) for t in complete]
    assert len(set(slots)) == len(slots), "no slot evaluated twice"
    owners = {t.system_attrs["nas:owner"] for t in complete}
    assert not any(t.state.name in ("RUNNING", "FAIL") for t in trials)
    assert len(owners) >= 2, f"the 3 workers shared the work ({took:.0f} s): owners {owners}"

    # one worker alone, on its own SQLite storage: the same slots, the same best subnet and loss
    assert main(["search", str(ckpt), "--predictor", str(pred), "--val-data", str(val), *SEARCH,
                 "--out", str(tmp_path / "alone")]) == 0
    name = json.loads((tmp_path / "alone" / "search.json").read_text())["study"]
    alone = optuna.load_study(study_name=name, storage=open_storage(f"sqlite:///{tmp_path / 'alone' / 'search.db'}"))
    assert len(complete) == sum(t.state.name == "COMPLETE" for t in alone.get_trials(deepcopy=False))
    for i in range(3):
        assert best_of(tmp_path / f"w{i}") == best_of(tmp_path / "alone")
