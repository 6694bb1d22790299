"""A device declared in this file alone (docs/adding-a-device.md): registered at its definition, it times subnets
with `nas measure-latency --device`, feeds `nas fit-predictor`, verifies `nas search --timing-target` and times
`nas export --timing-target`, and no file outside this one names it."""

from __future__ import annotations

import json

import pytest

from latency.device import DEVICES, precisions_of, register_device
from nas.cli import main

from tests.supernet.test_train import MICRO

NAME = "abacus-test"
COST_S = 2e-4  # per call, plus 1 ns per parameter and token: a device whose times are known exactly


class Abacus:
    """Counts instead of timing: a model's call costs ``COST_S`` + 1 ns per parameter and token, on a clock that moves
    only when it runs (so the protocol's figures are exact)."""

    name = NAME
    precisions = ("fp32",)

    def __init__(self, threads: int | None = None, clock: str = "wall"):
        if threads is not None and threads < 1:
            raise ValueError("threads")
        self.threads, self.clock = threads or 1, clock

    def fingerprint(self) -> dict:
        return {"device": NAME, "runtime": "counting", "threads": self.threads, "clock": self.clock,
                "cpu_model": "an abacus"}

    def prepare(self, model, workload):
        cost = COST_S + 1e-9 * model.num_params() * workload.seq_len

        def run(n: int) -> float:
            return n * cost

        return run


QUICK = ["--timing-warmup", "1", "--repeats", "2", "--rounds", "1", "--min-sample-ms", "0.1"]


@pytest.fixture(scope="module")
def device():
    register_device(Abacus)
    yield Abacus
    DEVICES.unregister(NAME)


@pytest.fixture(scope="module")
def run(device, tmp_path_factory):
    from tests.supernet.test_data import write_docs

    root = tmp_path_factory.mktemp("abacus")
    (root / "space.yaml").write_text(MICRO)
    docs = write_docs(root / "docs", n=10)
    assert main(["train-supernet", str(root / "space.yaml"), "--out", str(root / "run"), "--data", str(docs),
                 "--max-steps", "6", "--batch-size", "4", "--seq-len", "16", "--eval-interval", "6", "--eval-batches", "1",
                 "--ckpt-interval", "6", "--val-fraction", "0.2", "-q"]) == 0
    return root


def test_a_registered_device_is_known_by_name_with_its_capabilities(device):
    from latency.device import available, get_device

    assert NAME in available() and precisions_of(NAME) == ("fp32",)
    assert get_device(NAME, threads=1).fingerprint()["device"] == NAME
    with pytest.raises(ValueError, match="registered twice"):
        register_device(type("Abacus", (), {"name": NAME, "__module__": "elsewhere"}))


def test_measure_fit_search_verify_and_export_on_the_device(run, capsys):
    from latency.table import read_timings

    space, table = run / "space.yaml", run / "abacus.csv"
    assert main(["measure-latency", str(space), "--device", NAME, "--samples", "12", "--retest", "0.25", "--out",
                 str(table), "--timing-threads", "1", *QUICK, "-q"]) == 0
    timings = read_timings(table)
    assert timings.fingerprint["device"] == NAME and len(timings.rows) == 12 + 3
    # the protocol's figure is the device's exact cost (the drift correction divides by a reference that never moves)
    row = timings.rows[0]
    assert row.median_ms > COST_S * 1000
    assert main(["fit-predictor", str(table), "--models", "additive", "--out", str(run / "pred"), "-q"]) == 0
    capsys.readouterr()
    budget = f"{sorted(r.median_ms for r in timings.rows)[len(timings.rows) // 2]:.4f}ms"
    assert main(["search", str(run / "run" / "final.pt"), "--predictor", str(run / "pred"), "--out", str(run / "search"),
                 "--budget", budget, "--population", "6", "--parents", "2", "--mutations", "2", "--crossovers", "2",
                 "--generations", "2", "--val-windows", "2", "--seq-len", "16", "--no-progress", "--timing-target", NAME,
                 "--verify-top", "2", "--timing-threads", "1", "-q"]) in (0, 1)
    verify = json.loads((run / "search" / "verify.json").read_text())
    assert verify["device"]["device"] == NAME
    chosen = next(iter((run / "search").glob("verified_*.yaml")), None) or next((run / "search").glob("best_*.yaml"))
    assert main(["export", str(run / "run" / "final.pt"), "--subnet", str(chosen), "--out", str(run / "model"),
                 "--format", "torch", "--val-windows", "1", "--seq-len", "16", "--timing-target", NAME,
                 "--timing-threads", "1", "--predictor", str(run / "pred"), *QUICK, "-q"]) == 0
    card = json.loads((run / "model" / "model_card.json").read_text())
    assert card["measured"]["device"]["device"] == NAME and card["measured"]["median_ms"] > COST_S * 1000
    # INT8 is refused on it, naming the devices that run INT8 (its class says fp32 only)
    assert main(["measure-latency", str(space), "--device", NAME, "--precision", "int8-dynamic", "--out",
                 str(run / "int8.csv")]) == 2
    assert f"--device {NAME} runs fp32 only; int8-dynamic runs on --device onnxruntime" in capsys.readouterr().err


def test_nothing_outside_this_file_names_the_device():
    from tests.conftest import ROOT

    named = [p for pkg in ("search_spaces", "supernet", "latency", "tasks", "nas", "docs") for p in (ROOT / pkg).rglob("*")
             if p.suffix in (".py", ".md") and NAME in p.read_text()]
    assert named == []
