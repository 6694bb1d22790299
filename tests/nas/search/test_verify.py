"""nas search --verify: candidates are timed on the device; one over its budget is dropped, the next one kept."""

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from nas.search.verify import Candidate, budget_of, device_measure, report, top_candidates, verify, write_files
from search_spaces import Subnet
from supernet import SuperTransformer


def cand(width, loss, predicted, trial):
    return Candidate(Subnet(width, 1, (1,), (128,), ("softmax",)), loss, predicted, 1000 * width, trial)


def test_a_candidate_over_budget_is_dropped_and_the_next_one_returned():
    a, b, c = cand(128, 1.0, 9.0, 1), cand(96, 1.1, 8.0, 2), cand(64, 1.2, 5.0, 3)
    measured = {a.subnet: 12.0, b.subnet: 9.5, c.subnet: 6.0}  # a breaks 10 ms on the device although predicted 9
    calls = []

    def measure(subnets):
        calls.append(list(subnets))
        return {s: (measured[s], []) for s in subnets}

    verdicts = verify({"10ms": [a, b, c], "20ms": [a, b]}, {"10ms": 10.0, "20ms": 20.0}, measure)
    assert len(calls) == 1 and calls[0] == [a.subnet, b.subnet, c.subnet]  # each subnet timed once, all together
    v = verdicts["10ms"]
    assert [ch.holds for ch in v.checks] == [False, True, True] and v.chosen.candidate == b and v.chosen.rank == 2
    assert verdicts["20ms"].chosen.candidate == a
    assert v.checks[0].error_pct == pytest.approx(100 * (12.0 - 9.0) / 9.0)  # (measured - predicted) / predicted: slower is +
    text = report(verdicts, "fake")
    assert "DROPPED" in text and "KEPT" in text and " +33.3%  DROPPED" in text
    none = verify({"5ms": [a, b]}, {"5ms": 5.0}, measure)["5ms"]
    assert none.chosen is None and "none of the top 2 holds" in report({"5ms": none}, "fake")


def test_a_verify_margin_keeps_headroom_under_the_budget():
    a, b = cand(128, 1.0, 9.0, 1), cand(96, 1.1, 8.0, 2)
    measured = {a.subnet: 9.9, b.subnet: 9.6}  # a holds 10 ms by 1%, b by 4%

    def measure(subnets):
        return {s: (measured[s], []) for s in subnets}

    assert verify({"10ms": [a, b]}, {"10ms": 10.0}, measure)["10ms"].chosen.candidate == a
    kept = verify({"10ms": [a, b]}, {"10ms": 10.0}, measure, margin_pct=3.0)["10ms"]
    assert [c.holds for c in kept.checks] == [False, True] and kept.chosen.candidate == b
    assert verify({"10ms": [a, b]}, {"10ms": 10.0}, measure, margin_pct=5.0)["10ms"].chosen is None


def test_latency_error_has_one_sign_everywhere():
    """error = (measured - predicted) / predicted: a device slower than predicted is a positive error."""
    from latency.report import latency_error_pct
    from nas.search.verify import Check

    assert latency_error_pct(12.0, 10.0) == pytest.approx(20.0) and latency_error_pct(8.0, 10.0) == pytest.approx(-20.0)
    assert Check(1, cand(64, 1.0, 10.0, 0), 12.0, [], False).error_pct == pytest.approx(20.0)


def test_top_candidates_are_feasible_and_in_order_of_fitness():
    from nas.search.storage import Record

    def rec(trial, width, loss, ms, ffn=128):
        return Record(trial, ("x", 0, trial), Subnet(width, 1, (1,), (ffn,), ("softmax",)), loss, ms, width, False, "me")

    # the best is infeasible; trial 3 repeats trial 1's subnet (counted once)
    records = [
        rec(0, 128, 1.0, 30.0),
        rec(1, 96, 1.2, 9.0),
        rec(2, 64, 1.5, 5.0),
        rec(3, 96, 1.2, 9.0),
        rec(4, 64, 1.1, 5.5, ffn=256),
    ]
    feasible = lambda subnets: np.array([s.embed_dim < 128 for s in subnets])  # noqa: E731
    search = SimpleNamespace(
        label="10ms", constraints=SimpleNamespace(feasible=feasible, items=(SimpleNamespace(latency=None, limit=10.0),))
    )
    top = top_candidates([search], records, 2)["10ms"]
    assert [(c.trial, c.loss) for c in top] == [(4, 1.1), (1, 1.2)]
    assert all(c.subnet.embed_dim < 128 for c in top) and budget_of(search) == 10.0


def test_verify_with_a_fake_device_end_to_end(tiny, tmp_path):
    """The protocol on a fake clock: the widest candidate is 50x slower than predicted, dropped; files written."""
    from latency.timing_core import Settings
    from tests.nas.test_export import SlowFakeDevice

    supernet = SuperTransformer(tiny, generator=torch.Generator().manual_seed(0)).eval()
    subs = [
        Subnet(128, 1, (2,), (256,), ("softmax",)),
        Subnet(96, 1, (2,), (256,), ("softmax",)),
        Subnet(64, 1, (2,), (256,), ("softmax",)),
    ]
    fake_ms = [0.2 + 1e-6 * supernet.num_params(s) * 256 / 16 for s in subs]  # the fake device's cost
    cands = [Candidate(s, 1.0 + i / 10, ms, supernet.num_params(s), i) for i, (s, ms) in enumerate(zip(subs, fake_ms))]
    budget = max(fake_ms) * 1.01  # all hold by the predictor
    measure = device_measure(
        SlowFakeDevice((128,), factor=50.0), supernet, tiny.workload(), Settings(warmup=1, repeats=2, rounds=2)
    )
    verdicts = verify({"b": cands}, {"b": budget}, measure)
    v = verdicts["b"]
    assert not v.checks[0].holds and v.checks[0].measured_ms == pytest.approx(50 * fake_ms[0], rel=1e-6)
    assert v.chosen.candidate.subnet == subs[1] and v.chosen.measured_ms == pytest.approx(fake_ms[1], rel=1e-6)
    write_files(tmp_path, verdicts, {"device": "fake"}, tiny.workload(), {}, tiny)
    doc = json.loads((tmp_path / "verify.json").read_text())
    assert doc["budgets"]["b"]["verified"] == "verified_b.yaml"
    assert Subnet.load(tmp_path / "verified_b.yaml") == subs[1]
    rows = (tmp_path / "verify.csv").read_text().splitlines()
    assert len(rows) == 4 and rows[1].split(",")[9] == "False"  # rank 1: holds False


def test_search_cli_verify_drops_the_best_when_the_device_says_it_is_too_slow(tiny, tmp_path, capsys, monkeypatch):
    """`nas search --verify fake`: the device is 5x slower than predicted on the search's best subnet only."""
    import latency.device
    from nas.cli import main
    from supernet.checkpoint import save_checkpoint
    from tests.latency.latency_fakes import FakeDevice
    from tests.nas.test_export import fake_predictor

    supernet = SuperTransformer(tiny, generator=torch.Generator().manual_seed(0)).eval()
    ckpt = save_checkpoint(tmp_path / "supernet.pt", supernet)
    (tmp_path / "val.txt").write_bytes(b"def f(x):\n    return x * 2\n" * 40)
    pred = fake_predictor(tiny, tmp_path / "pred")
    args = ["search", str(ckpt), "--predictor", str(pred), "--val-data", str(tmp_path / "val.txt"), "--val-windows", "2",
            "--seq-len", "32", "--population", "6", "--parents", "2", "--mutations", "3", "--crossovers", "3",
            "--generations", "2", "--out", str(tmp_path / "out"), "--no-progress", "--budget", "6ms"]
    assert main(args) == 0
    best = Subnet.load(tmp_path / "out" / "best_6ms.yaml")
    capsys.readouterr()

    class Device(FakeDevice):  # 5x slower than predicted on the best; 3% faster on the others (the first generation's
        # uniform models are the largest under the budget, predicted within 1% of it, where the fake's clock reads +1%)
        def prepare(self, model, workload):
            run = super().prepare(model, workload)
            return (lambda n: 5 * run(n)) if model.config.subnet == best else (lambda n: 0.97 * run(n))

    monkeypatch.setattr(latency.device, "get_device", lambda name, **kw: Device())
    assert main(args + ["--timing-target", "fake", "--verify-top", "3"]) == 0  # the finished study is resumed, then verified
    out = capsys.readouterr().out
    doc = json.loads((tmp_path / "out" / "verify.json").read_text())
    checks = doc["budgets"]["6ms"]["checks"]
    assert len(checks) == 3 and Subnet.from_dict(checks[0]["subnet"]) == best
    assert checks[0]["holds"] is False and checks[0]["measured_ms"] > 6.0 and checks[1]["kept"] is True
    assert all(c["predicted_ms"] <= 6.0 for c in checks)
    verified = Subnet.load(tmp_path / "out" / "verified_6ms.yaml")
    assert verified == Subnet.from_dict(checks[1]["subnet"]) != best
    assert "DROPPED" in out and "KEPT" in out and "verify.csv" in out


def test_search_margin_keeps_the_prediction_below_the_budget_and_verify_holds_the_device_to_the_budget(
    tiny, tmp_path, monkeypatch
):
    """--margin 20: the search's best is predicted <= 80% of the budget; verification compares with the budget itself."""
    import latency.device
    from nas.cli import main
    from supernet.checkpoint import save_checkpoint
    from tests.latency.latency_fakes import FakeDevice
    from tests.nas.test_export import fake_predictor

    supernet = SuperTransformer(tiny, generator=torch.Generator().manual_seed(0)).eval()
    ckpt = save_checkpoint(tmp_path / "supernet.pt", supernet)
    (tmp_path / "val.txt").write_bytes(b"def f(x):\n    return x * 2\n" * 40)
    pred = fake_predictor(tiny, tmp_path / "pred")
    monkeypatch.setattr(latency.device, "get_device", lambda name, **kw: FakeDevice())
    args = ["search", str(ckpt), "--predictor", str(pred), "--val-data", str(tmp_path / "val.txt"), "--val-windows", "2",
            "--seq-len", "32", "--population", "6", "--parents", "2", "--mutations", "3", "--crossovers", "3",
            "--generations", "2", "--out", str(tmp_path / "out"), "--no-progress", "--budget", "6ms", "--margin", "20",
            "--timing-target", "fake", "--verify-top", "2"]
    main(args)
    best = json.loads((tmp_path / "out" / "search.json").read_text())["budgets"]["6ms"]["best"]
    assert best["latency_ms"] <= 6.0 * 0.8
    assert json.loads((tmp_path / "out" / "verify.json").read_text())["budgets"]["6ms"]["budget_ms"] == 6.0
    assert main(args[:-6] + ["--margin", "60"]) == 2  # not a percentage in [0, 50)
