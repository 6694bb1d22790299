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
import re
import shlex
import subprocess
import sys
import time
from collections import Counter

import optuna
import pytest
import torch
import yaml

from nas.search import open_storage
from search_spaces import Subnet, load_space

from tests.conftest import ROOT
from tests.supernet.test_data import write_docs
from tests.nas.search.test_search_storage import _free_port, postgres_url  # noqa: F401  (the PostgreSQL server fixture)
from tests.supernet.test_train import MICRO, max_diff
from tests.latency.test_workloads import fit_predictor

TRAIN = ["--batch-size", "8", "--seq-len", "16", "--max-steps", "4", "--lr-warmup", "2", "--eval-interval", "4",
         "--eval-batches", "2", "--ckpt-interval", "4", "--threads", "1", "--device", "cpu"]
SEARCH = ["--budget", "5ms", "--population", "12", "--parents", "3", "--mutations", "4", "--crossovers", "4",
          "--generations", "3", "--val-windows", "12", "--seq-len", "16", "--worker-batch", "2", "--no-progress", "-q"]


@pytest.fixture(scope="module")
def micro_files(tmp_path_factory):
    base = tmp_path_factory.mktemp("cluster")
    (base / "micro.yaml").write_text(MICRO)
    docs = write_docs(base / "docs", n=10)
    return base / "micro.yaml", docs


def env() -> dict[str, str]:
    """The processes' environment: this checkout, one thread, the plain torch attention (the compiled kernels are
    another test's business, and their first build would hold every process up)."""
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "NAS_NATIVE_KERNELS": "0"}


def nas(*args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "nas", *args], cwd=ROOT, env=env(), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


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

    nas("train-supernet", str(space), "--out", str(tmp_path / "single"), "--data", str(docs), *TRAIN)
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


def table_row(stdout: str) -> str:
    """The 5ms row of the table a search prints (budget, loss, latency, params, evaluations, subnet)."""
    (row,) = [line for line in stdout.splitlines() if line.startswith("5ms ")]
    return row


def test_three_search_workers_share_one_postgresql_study(postgres_url, micro_files, tmp_path):  # noqa: F811
    space_file, docs = micro_files
    nas("train-supernet", str(space_file), "--out", str(tmp_path / "sn"), "--data", str(docs), *TRAIN)
    pred = fit_predictor(load_space(str(space_file)), load_space(str(space_file)).workload("prefill"), tmp_path / "pred")
    val = tmp_path / "val.txt"
    val.write_bytes((docs / "doc00.txt").read_bytes() * 4)
    ckpt = tmp_path / "sn" / "final.pt"

    # docs/cluster.md's recipe: the same command N times, one study, one --out that all of them see
    started = time.monotonic()
    workers = [search_worker(ckpt, pred, val, tmp_path / "shared", postgres_url) for _ in range(3)]
    outputs = []
    for w in workers:
        out, err = w.communicate(timeout=300)
        assert w.returncode == 0, err[-3000:]
        outputs.append(out)
    took = time.monotonic() - started

    trials = optuna.load_study(study_name="shared", storage=open_storage(postgres_url)).get_trials(deepcopy=False)
    complete = [t for t in trials if t.state.name == "COMPLETE"]
    slots = [tuple(t.system_attrs["nas:slot"]) for t in complete]
    assert len(set(slots)) == len(slots), "no slot evaluated twice"
    assert not any(t.state.name in ("RUNNING", "FAIL") for t in trials)
    owners = Counter(t.system_attrs["nas:owner"] for t in complete)
    assert len(owners) >= 2, f"the 3 workers shared the work ({took:.0f} s): evaluations per worker {owners}"

    # one worker alone, on its own SQLite storage: the same slots, the same best subnet and loss
    alone = nas("search", str(ckpt), "--predictor", str(pred), "--val-data", str(val), *SEARCH, "--out", str(tmp_path / "alone"))
    name = json.loads((tmp_path / "alone" / "search.json").read_text())["study"]
    by_one = optuna.load_study(study_name=name, storage=open_storage(f"sqlite:///{tmp_path / 'alone' / 'search.db'}"))
    assert sorted(slots) == sorted(tuple(t.system_attrs["nas:slot"]) for t in by_one.get_trials(deepcopy=False)
                                   if t.state.name == "COMPLETE")
    assert best_of(tmp_path / "shared") == best_of(tmp_path / "alone")
    assert [table_row(o) for o in outputs] == [table_row(alone.stdout)] * 3  # each worker reports the whole search


# --------------------------------------------------------------------------- the recipes' command lines


def recipe_commands() -> list[list[str]]:
    """Every ``nas`` command of docs/cluster.md: shell lines (continuations joined, shell expansions replaced by a
    word) and the Kubernetes Job's container command."""
    text = (ROOT / "docs" / "cluster.md").read_text()
    commands = []
    for lang, block in re.findall(r"^ *```(bash|yaml)\n(.*?)^ *```", text, re.S | re.M):
        if lang == "yaml":
            job = yaml.safe_load(block)
            for container in job["spec"]["template"]["spec"]["containers"]:
                commands.append([a.replace("$(NAS_STORAGE)", "postgresql://nas@db/nas_search") for a in container["command"]])
            continue
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.split(" #")[0].replace("$resume", "--resume")  # the SLURM script's "--resume once there is one"
            line = re.sub(r"\$\([^()]*(\([^()]*\)[^()]*)*\)|\$\{[^}]*\}|\$[A-Za-z_]+", "X", line).replace('"', "")
            for part in line.split("&&"):
                found = re.search(r"(?:^|-m\s+)(nas [a-z-]+\b.*)$", part.strip())
                if found:
                    commands.append(shlex.split(found.group(1)))
    return commands


def test_every_nas_command_in_the_recipes_parses(capsys):
    from nas.cli import build_parser

    commands = recipe_commands()
    seen = {c[1] for c in commands}
    assert {"search", "train-supernet", "train-subnet", "measure-latency", "fit-predictor"} <= seen, seen
    parser = build_parser()
    for command in commands:
        assert command[0] == "nas"
        try:
            parser.parse_args(command[1:])
        except SystemExit:
            pytest.fail(f"docs/cluster.md: {shlex.join(command)} does not parse")
        assert capsys.readouterr().err == "", f"docs/cluster.md: {shlex.join(command)} uses an old spelling"


def test_the_retraining_job_reads_the_subnets_verified_on_the_device():
    """The recipe retrains what ``nas search --timing-target`` measured under each budget (``verified_<budget>.yaml``),
    not the predictor's picks (``best_<budget>.yaml``), and a search command of the recipe writes them there."""
    text = (ROOT / "docs" / "cluster.md").read_text()
    (retrain,) = [b for b in re.findall(r"^ *```bash\n(.*?)^ *```", text, re.S | re.M) if "nas train-subnet" in b]
    globs = re.findall(r"^\s*files=\((\S+)\)", retrain, re.M)
    assert globs == ["/shared/runs/search/verified_*.yaml"] and "best_" not in retrain
    verifying = [c for c in recipe_commands() if c[1] == "search" and "--timing-target" in c]
    assert verifying and all(c[c.index("--out") + 1] == "/shared/runs/search" for c in verifying)
    assert "hurdles_*.yaml" in text  # what to retrain after --hurdles


def test_the_recipes_image_is_built_by_the_dockerfile():
    """docs/cluster.md's image is the repository's Dockerfile: CPU, python:3.11-slim, the toolkit installed by
    scripts/install.py from files the build context holds, tagged with this version."""
    import nas

    docker = (ROOT / "Dockerfile").read_text()
    steps = [line.split(None, 1) for line in re.sub(r"\\\n\s*", " ", docker).splitlines()
             if line.strip() and not line.startswith("#")]
    assert steps[0] == ["FROM", "python:3.11-slim"]
    runs = [rest for op, rest in steps if op == "RUN"]
    assert any(r.startswith("python3 scripts/install.py postgres --torch cpu -c constraints.txt") for r in runs), runs
    copied = [word for op, rest in steps if op == "COPY" for word in rest.split()[:-1]]
    assert all((ROOT / word).exists() for word in copied), copied
    packages = ("nas", "supernet", "latency", "search_spaces", "tasks", "scripts/install.py", "pyproject.toml",
                "constraints.txt")
    assert set(packages) <= set(copied)
    ignored = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines() if not line.startswith("#")]
    assert not set(copied) & set(ignored)
    text = (ROOT / "docs" / "cluster.md").read_text()
    image = f"registry.example.com/nas-transformers:{nas.__version__}"
    assert f"docker build -t {image} ." in text and f"image: {image}" in text
    assert "[Dockerfile](../Dockerfile)" in text
