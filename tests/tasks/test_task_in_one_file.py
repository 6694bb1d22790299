"""The tasks redesign's proof: a task declared in this file alone runs through every command.

``LastToken`` is declared here and nowhere else: sequence classification of generated data.  A sequence of
``T`` random tokens has the class (one of ``CLASSES``) of its last token, that token modulo ``CLASSES``; the
model (one stack of blocks, causal) predicts the class at the last position, the only position scored (a task
that every subnet learns in a few dozen steps: the test is of the plumbing, not of the attention types).
The task says, as a task does: its data (examples generated from ``--data-seed`` and its own flag ``--examples``,
recorded in the checkpoint and kept on resume), its learner (:class:`supernet.task.ExampleLearner`: batches of
examples, loss at the label only), its fitness (bits per label on fixed held-out examples) and its card's
validation (bits per label and accuracy).  Registering it is the only step; then ``nas space``,
``train-supernet`` (and an exact resume), extraction, ``measure-latency`` on cpu and onnxruntime,
``fit-predictor``, ``search`` and ``export`` run it, and nothing outside this file names it.
"""

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from nas.cli import main
from search_spaces import UserError, parse_space
from supernet.heldout import IGNORE
from supernet.task import Examples, ExampleLearner
from tasks import register, unregister
from tasks.base import Flag
from tasks.stack import StackTask

V, T, CLASSES = 16, 24, 4  # tokens 0..3 are the classes (predicted, never read), 4..15 the sequences'


class GeneratedExamples:
    """The task's data: ``examples`` training and a quarter as many validation examples from ``seed``."""

    def __init__(self, examples: int, seed: int, path: Path):
        rng = np.random.default_rng([seed, 7])

        def make(count: int) -> Examples:
            x = rng.integers(CLASSES, V, size=(count, T))  # (count, T)
            y = np.full((count, T), IGNORE, dtype=np.int64)
            y[:, -1] = x[:, -1] % CLASSES  # scored at the last position only
            return Examples(x.astype(np.int64), y)

        self.train, self.val = make(examples), make(max(64, examples // 4))
        digest = hashlib.sha256(self.train.inputs.tobytes() + self.val.inputs.tobytes()).hexdigest()
        self.hash, self.path = digest, Path(path)
        self.meta = {"corpus": f"last-token examples (seed {seed})", "sizes": {"train": examples, "val": len(self.val)}}


class LastToken(StackTask):
    name = "test-last-token"
    doc = "(test) sequence classification of generated data: a sequence's class is its last token modulo 4"
    form = "causal"
    metric = "bits/label"
    unit = "bits"
    data_keys = ("data_seed",)
    data_defaults = {"data_seed": 0}
    token_unit = "positions"
    flags = (Flag("--examples", "examples", int, "N", "test-last-token spaces: generated training examples (default 512)",
                  ("train-supernet",)),)

    def data_settings(self, settings, flags, stored):
        if stored is not None:
            if flags.get("examples") not in (None, stored["examples"]):
                raise UserError(f"--examples {flags['examples']} differs from the run's {stored['examples']}")
            return {**settings, "examples": stored["examples"]}
        return {**settings, "examples": flags.get("examples") or 512}

    def data_record(self, meta, where, hint=""):
        return {"data_seed": meta["data_seed"], "examples": meta["examples"]}

    def prepare_data(self, settings, cache_dir, progress=None):
        return GeneratedExamples(settings["examples"], settings["data_seed"], cache_dir)

    def describe_data(self, data, settings):
        return f"{data.meta['corpus']}: {len(data.train)} training, {len(data.val)} validation examples"

    def describe_batch(self, config):
        return f"batch {config.batch_size} examples"

    def learner(self, space, seed=0, **options):
        return ExampleLearner()

    def _held_out(self, payload, scoring):
        data = self.prepare_data(self.data_record(payload["meta"], scoring.path), Path(scoring.path).parent)
        return ExampleLearner().heldout(data.val, scoring.windows * scoring.batch_size), data

    def fitness(self, model, payload, settings):
        from nas.search.fitness import HeldOutFitness

        held, data = self._held_out(payload, settings)
        fit = HeldOutFitness(model, held, batch_size=settings.batch_size, device=settings.device,
                             description={"task": self.name, "metric": self.metric})
        return fit, data.hash[:16]

    def validation(self, model, payload, scoring):
        held, _ = self._held_out(payload, scoring)
        with torch.no_grad():
            predicted = model.eval()(held.x)[:, -1, :CLASSES].argmax(-1)  # (W,) the class read at the last position
        return {"bits_per_byte": held.bits(model, None, scoring.batch_size), "metric": self.metric, "examples": len(held.x),
                "accuracy": float((predicted == held.y[:, -1]).float().mean()), "source": "validation examples"}


SPACE = f"""
task: test-last-token
vocab_size: {V}
max_seq_len: {T}
head_dim: 8
embed_dim: [16, 24]
depth: [1, 2]
layers: {{heads: [1, 2], ffn_dim: [16, 32], attention: [softmax, "local:4", linear]}}
latency: {{prefill: {{batch_size: 1, seq_len: {T}}}}}
"""
QUICK = ["--timing-threads", "1", "--timing-warmup", "1", "--repeats", "2", "--rounds", "1", "--min-sample-ms", "1"]
TRAIN = ["--batch-size", "16", "--lr", "1e-2", "--lr-warmup", "5", "--eval-interval", "20", "--eval-batches", "2",
         "--ckpt-interval", "10", "--log-interval", "1", "--examples", "256", "-q"]


@pytest.fixture(scope="module")
def task():
    t = register(LastToken())
    yield t
    unregister(t.name)


@pytest.fixture(scope="module")
def root(task, tmp_path_factory, graph_cache):
    root = tmp_path_factory.mktemp("last-token")
    (root / "space.yaml").write_text(SPACE)
    assert main(["train-supernet", str(root / "space.yaml"), "--out", str(root / "run"), "--max-steps", "60", *TRAIN]) == 0
    return root


def test_the_space_layer_and_nas_space(task, tmp_path, capsys):
    space = parse_space(SPACE, where="last.yaml")
    assert space.task == "test-last-token" and space.causal and space.vocab_size == V
    (tmp_path / "s.yaml").write_text(SPACE)
    assert main(["space", str(tmp_path / "s.yaml"), "--samples", "1"]) == 0
    out = capsys.readouterr().out
    assert "task          test-last-token" in out and "largest" in out and "# sample 0" in out
    with pytest.raises(UserError, match=r"task: 'test-last-tokens' is not one of .*test-last-token"):
        parse_space(SPACE.replace("task: test-last-token", "task: test-last-tokens"), where="last.yaml")


def test_train_supernet_learns_records_its_data_and_refuses_other_tasks_flags(root, capsys):
    ckpt = torch.load(root / "run" / "final.pt", weights_only=True)
    meta = ckpt["meta"]
    assert (meta["data_seed"], meta["examples"], meta["corpus"]) == (0, 256, "last-token examples (seed 0)")
    assert meta["objective"]["kind"] == "sandwich" and ckpt["state"]["step"] == 60
    evals = [e for e in map(json.loads, (root / "run" / "log.jsonl").read_text().splitlines()) if e["event"] == "eval"]
    first, last = evals[0]["bpb"]["largest"], evals[-1]["bpb"]["largest"]
    assert last < first and last < 1.0, (first, last)  # log2(4) = 2 bits for a guess among 4 classes
    capsys.readouterr()
    assert main(["train-supernet", "--out", str(root / "run"), "--resume", "--examples", "100", "-q"]) == 2
    assert capsys.readouterr().err == "nas train-supernet: error: --examples 100 differs from the run's 256\n"
    assert main(["train-supernet", str(root / "space.yaml"), "--out", str(root / "r2"), "--mask-rate", "0.2", "-q"]) == 2
    assert capsys.readouterr().err.startswith("nas train-supernet: error: --mask-rate: only for a masked-lm space; ")


def test_a_resumed_run_equals_the_uninterrupted_one(root):
    import os
    import signal

    from nas.train_supernet import SupernetRun, train_supernet
    from search_spaces import load_space

    args = [str(root / "space.yaml"), *TRAIN]
    assert main(["train-supernet", *args, "--out", str(root / "straight"), "--max-steps", "16"]) == 0

    def stop(info):
        if info.step == 10:
            os.kill(os.getpid(), signal.SIGINT)  # caught by the loop: it finishes the step, saves latest.pt, stops

    run = SupernetRun(root / "cut", load_space(root / "space.yaml"), config={"batch_size": 16, "lr": 1e-2, "warmup_steps": 5,
                      "eval_interval": 20, "eval_batches": 2, "ckpt_interval": 10, "log_interval": 1, "max_steps": 16},
                      task_flags={"examples": 256})
    assert train_supernet(run, progress=stop).result.stopped == "interrupted"
    assert main(["train-supernet", "--out", str(root / "cut"), "--resume", "-q"]) == 0
    a, b = (torch.load(root / run / "final.pt", weights_only=True) for run in ("straight", "cut"))
    assert a["state"]["step"] == b["state"]["step"] == 16
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


def test_extraction_computes_what_the_supernet_computes(root):
    from supernet.checkpoint import load_supernet

    supernet, _ = load_supernet(root / "run" / "final.pt")
    x = torch.from_numpy(GeneratedExamples(8, 3, root).val.inputs[:4])
    rng = np.random.default_rng(0)
    for subnet in [supernet.space.largest(), supernet.space.smallest(), *(supernet.space.sample(rng) for _ in range(3))]:
        static = supernet.extract(subnet).eval()
        with torch.no_grad():
            assert (static(x) - supernet(x, subnet)).abs().max().item() <= 1e-5, subnet
        assert static.num_params() == supernet.num_params(subnet)


def test_measure_latency_fit_a_predictor_search_and_export(root, capsys):
    from latency.table import read_timings
    from supernet import load_model

    for device in ("cpu", "onnxruntime"):
        table = root / f"{device}.csv"
        assert main(["measure-latency", str(root / "space.yaml"), "--device", device, "--out", str(table),
                     "--samples", "12", "--retest", "0.5", *QUICK, "-q"]) == 0
        timings = read_timings(table)
        assert timings.space.task == "test-last-token" and len(timings.rows) == 12 + 6
        assert all(r.median_ms > 0 for r in timings.rows)
    assert main(["fit-predictor", str(root / "cpu.csv"), "--models", "additive", "--out", str(root / "pred"), "-q"]) == 0
    capsys.readouterr()
    assert main(["search", str(root / "run" / "final.pt"), "--predictor", str(root / "pred"), "--out", str(root / "search"),
                 "--budget", "1s", "--population", "6", "--parents", "2", "--mutations", "2", "--crossovers", "2",
                 "--generations", "2", "--val-windows", "2", "--eval-batch-size", "8", "--no-progress", "-q"]) == 0
    printed = capsys.readouterr().out
    assert "loss (bits)" in printed
    summary = json.loads((root / "search" / "search.json").read_text())
    assert summary["config"]["fitness"]["task"] == "test-last-token" and summary["config"]["fitness"]["examples"] == 16
    best = root / "search" / "best_1s.yaml"
    assert "bits/label with inherited weights" in best.read_text()
    assert main(["export", str(root / "run" / "final.pt"), "--subnet", str(best), "--out", str(root / "model"),
                 "--val-windows", "1", "-q"]) == 0  # 1 x 16: the search's 16 examples (2 x 8)
    printed = capsys.readouterr().out
    assert "bits/label (16 examples of the validation examples)" in printed
    card = json.loads((root / "model" / "model_card.json").read_text())
    assert card["validation"]["metric"] == "bits/label" and 0.0 <= card["validation"]["accuracy"] <= 1.0
    assert card["onnx"]["parity_max_abs"] <= 1e-4
    model = load_model(root / "model")
    found = best.read_text()
    assert model.num_params() > 0 and str(model.subnet.embed_dim) in found
    # the search's score of the found subnet is the card's: the same held-out examples, inherited vs extracted weights
    loss = [b["best"]["loss_bpb"] for b in summary["budgets"].values()][0]
    assert loss == pytest.approx(card["validation"]["bits_per_byte"], abs=1e-5)


def test_nothing_outside_this_file_names_the_task():
    from tests.conftest import ROOT

    named = [p for pkg in ("search_spaces", "supernet", "latency", "nas", "tasks") for p in (ROOT / pkg).rglob("*.py")
             if "test-last-token" in p.read_text() or "LastToken" in p.read_text()]
    assert named == []
